/* The scrape (DESIGN §10): the live counters (metrics.c) and gauges read from the modules
 * that own them, written as Prometheus text. Contract in metrics.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backpressure.h"
#include "dedupe.h"
#include "metrics_internal.h"
#include "sessions.h"

/* One family with a series per lane. */
static void add_lane_counter(metric_registry *r, const char *name, const char *help,
                             const uint64_t v[CPH_LANE_COUNT]) {
  metric_family *f = metric_family_add(r, name, METRIC_COUNTER, help, "lane", NULL, 0);
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    metric_counter_set(metric_series_add(f, cph_lane_name((cph_lane)i)), v[i]);
}

static void add_lane_gauge(metric_registry *r, const char *name, const char *help,
                           const double v[CPH_LANE_COUNT]) {
  metric_family *f = metric_family_add(r, name, METRIC_GAUGE, help, "lane", NULL, 0);
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    metric_gauge_set(metric_series_add(f, cph_lane_name((cph_lane)i)), v[i]);
}

static void add_scheduler(const metrics_sources *src, metric_registry *r) {
  const metrics_live *l = &src->metrics->live;
  add_lane_counter(r, "cephalon_turns_started_total", "Turns started (leased), per lane.",
                   l->started);
  add_lane_counter(r, "cephalon_turns_completed_total", "Turns completed, per lane.", l->completed);
  add_lane_counter(r, "cephalon_turns_failed_total", "Leases ended by the worker's fail, per lane.",
                   l->failed);
  add_lane_counter(r, "cephalon_turns_expired_total",
                   "Leases that passed their deadline (or were in flight at a restart), "
                   "per lane.",
                   l->expired);

  const cph_lane_info *lanes = src->lanes;
  double v[6][CPH_LANE_COUNT];
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    v[0][i] = lanes[i].turns_left;
    v[1][i] = lanes[i].tool_calls_left;
    v[2][i] = (double)lanes[i].budget_turns;
    v[3][i] = (double)lanes[i].budget_tool_calls;
    v[4][i] = (double)lanes[i].runnable;
    v[5][i] = (double)lanes[i].running;
  }
  add_lane_gauge(r, "cephalon_lane_turn_tokens",
                 "Tokens in the lane's turns bucket now; a turn takes 1.", v[0]);
  add_lane_gauge(r, "cephalon_lane_tool_call_tokens",
                 "Tokens in the lane's tool-calls bucket now; negative after overspending.", v[1]);
  add_lane_gauge(r, "cephalon_lane_budget_turns_per_minute",
                 "The lane's turns budget per minute in the policy in force.", v[2]);
  add_lane_gauge(r, "cephalon_lane_budget_tool_calls_per_minute",
                 "The lane's tool-calls budget per minute in the policy in force.", v[3]);
  add_lane_gauge(r, "cephalon_lane_runnable_sessions",
                 "Sessions waiting to run in the lane (runnable, not running).", v[4]);
  add_lane_gauge(r, "cephalon_lane_running_turns", "Turns running in the lane.", v[5]);

  metric_family *f =
      metric_family_add(r, "cephalon_pick_wait_seconds", METRIC_HISTOGRAM,
                        "Time a session waited runnable before its turn started, per lane.", "lane",
                        metrics_pick_wait_bounds, N_OF(metrics_pick_wait_bounds));
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    metric_hist *h = metric_series_hist(metric_series_add(f, cph_lane_name((cph_lane)i)));
    if (h)
      *h = l->pick_wait[i];
  }

  double w[5][CPH_LANE_COUNT];
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    w[0][i] = lanes[i].tokens_left;
    w[1][i] = (double)lanes[i].budget_tokens;
    w[2][i] = lanes[i].seats;
    w[3][i] = lanes[i].seats_lent;
    w[4][i] = lanes[i].seats_borrowed;
  }
  add_lane_gauge(r, "cephalon_lane_model_tokens",
                 "Model tokens left in the lane's tokens bucket (:tokens budget; 0 without "
                 "one); negative after overspending.",
                 w[0]);
  add_lane_gauge(r, "cephalon_lane_budget_model_tokens_per_minute",
                 "The lane's :tokens budget per minute; 0 = none.", w[1]);
  add_lane_gauge(r, "cephalon_lane_seats_reserved", "Concurrency seats reserved for the lane.",
                 w[2]);
  add_lane_gauge(r, "cephalon_lane_seats_lent",
                 "Of the lane's reserved seats, how many other lanes hold now.", w[3]);
  add_lane_gauge(r, "cephalon_lane_seats_borrowed",
                 "The lane's running turns beyond its seats and the shared pool.", w[4]);

  metric_add_gauge(r, "cephalon_concurrency_in_use", "Turns running now, over all lanes.",
                   src->concurrency_in_use);
  metric_add_gauge(r, "cephalon_concurrency_limit", "At most this many turns run at once.",
                   src->concurrency_limit);
  metric_add_counter(r, "cephalon_scheduler_passes_total", "Scheduler passes run.", l->passes);
  metric_add_gauge(r, "cephalon_sessions", "Sessions that exist.",
                   (double)sessions_count(src->sessions));
}

static size_t test_sample_max; /* metrics_test_credits_sample_max; 0: the constant */

void metrics_test_credits_sample_max(size_t n) { test_sample_max = n; }

/* Credits over sessions, sampled so a scrape stays cheap with a million sessions: at most
 * METRICS_CREDITS_SAMPLE_MAX scheduler slots, every stride-th, from an offset that rotates
 * with each scrape so successive scrapes cover every session. Buckets split the policy's
 * [min, max] into ten (they move with a reload; each scrape is a snapshot). */
static void add_credits(const metrics_sources *src, metric_registry *r, double bounds[10]) {
  const cph_policy *p = src->env->policy;
  double lo = p->scheduler.credits.min, hi = p->scheduler.credits.max;
  size_t n_bounds = 1;
  bounds[0] = hi;
  if (hi > lo) {
    for (int k = 1; k <= 10; k++)
      bounds[k - 1] = lo + (hi - lo) * k / 10;
    bounds[9] = hi; /* exactly, whatever the rounding */
    n_bounds = 10;
  }
  metric_family *f = metric_family_add(
      r, "cephalon_session_credits", METRIC_HISTOGRAM,
      "Session credits now: a snapshot of at most 10000 sessions per scrape, every "
      "stride-th scheduler slot from an offset that rotates per scrape; _count is the "
      "sample size (cephalon_sessions is the total).",
      NULL, bounds, n_bounds);
  metric_hist *h = metric_series_hist(metric_series_add(f, NULL));
  if (!h)
    return;
  size_t cap = sessions_sid_cap(src->sessions);
  size_t max = test_sample_max ? test_sample_max : METRICS_CREDITS_SAMPLE_MAX;
  size_t stride = cap / max + (cap % max != 0);
  if (!stride)
    stride = 1;
  for (size_t i = src->metrics->scrapes % stride; i < cap; i += stride)
    if (sessions_at(src->sessions, i))
      metric_hist_observe(h,
                          cph_sched_credits(src->env->sched, sessions_at(src->sessions, i)->sid));
}

static void add_turn_outcomes(const metrics_sources *src, metric_registry *r) {
  const metrics_live *l = &src->metrics->live;
  const cph_metrics *m = src->metrics;
  metric_family *f = metric_family_add(
      r, "cephalon_tool_calls_total", METRIC_COUNTER,
      "Tool calls reported in completions' tool_stats: without a tool label the totals of "
      "tool_stats.valid/invalid; with one, tool_stats.tools per tool (valid = ran fine, "
      "invalid = refused for its arguments, error = ran and failed).",
      "tool", NULL, 0);
  metric_family_add_label(f, "result");
  const char *totals[2][2] = {{NULL, "valid"}, {NULL, "invalid"}}; /* no tool label */
  metric_counter_set(metric_series_addv(f, totals[0]), l->tool_valid);
  metric_counter_set(metric_series_addv(f, totals[1]), l->tool_invalid);
  for (size_t i = 0; i < m->n_tools; i++)
    for (int k = 0; k < TOOL_RESULTS; k++) {
      const char *values[2] = {m->tools[i].name, metrics_tool_result_names[k]};
      metric_counter_set(metric_series_addv(f, values), m->tools[i].n[k]);
    }
  add_lane_counter(r, "cephalon_turn_tokens_total",
                   "Tokens charged by completed turns (complete's cost.tokens), by lane.",
                   l->tokens);
  metric_add_counter(r, "cephalon_tool_call_repairs_total",
                     "Tool-call repairs reported in completions' tool_stats.", l->tool_repairs);
  metric_add_counter(r, "cephalon_guard_denies_total",
                     "Guard denials reported in completions' tool_stats.", l->guard_denies);
  metric_hist *h = metric_series_hist(metric_series_add(
      metric_family_add(r, "cephalon_context_inclusion_count", METRIC_HISTOGRAM,
                        "Items (memories + conversation history entries) a started turn's "
                        "context included; job turns (no context) and turns leased without "
                        "conversation_history or recent_memory (not built) are not counted.",
                        NULL, metrics_inclusion_bounds, N_OF(metrics_inclusion_bounds)),
      NULL));
  if (h)
    *h = l->inclusion;
}

static void add_ingest(const metrics_sources *src, metric_registry *r) {
  const metrics_live *l = &src->metrics->live;
  metric_family *f = metric_family_add(r, "cephalon_events_total", METRIC_COUNTER,
                                       "Events posted, by their result status.", "status", NULL, 0);
  for (int s = 0; s < N_STATUS; s++)
    metric_counter_set(metric_series_add(f, cph_ingest_status_name((cph_ingest_status)s)),
                       l->events[s]);
  metric_add_counter(r, "cephalon_inbox_overflow_folded_total",
                     "Events the per-session queue cap (:sessions :max-queue) folded into an "
                     "overflow entry; they stay counted there, nothing is dropped.",
                     src->folded_total);
  metric_add_counter(r, "cephalon_ingest_prepared_events_total",
                     "Events of committed requests whose text hashes the daemon's request threads "
                     "(:server :request-threads) computed beside the event loop.",
                     src->prepared_total);
}

static void add_dedupe(const metrics_sources *src, metric_registry *r) {
  dedupe_stats st = {0};
  dedupe_stats_get(src->dedupe, &st);
  metric_add_counter(r, "cephalon_dedupe_exact_hits_total", "Events found exact duplicates.",
                     st.exact_hits_total);
  metric_add_counter(r, "cephalon_dedupe_near_hits_total",
                     "Events found near duplicates (simhash).", st.near_hits_total);
  /* DESIGN §10 says aggregate_count and aggregate_dup_count; promtool refuses a `_count`
   * suffix on anything but a histogram or summary, so these two carry other names. */
  metric_add_gauge(r, "cephalon_aggregates",
                   "Duplicate families (aggregates) stored; DESIGN's aggregate_count.",
                   (double)st.aggregate_count);
  size_t top = (size_t)src->env->policy->metrics.top_families;
  if (top > DEDUPE_TOP_MAX)
    top = DEDUPE_TOP_MAX;
  uint64_t families[DEDUPE_TOP_MAX], counts[DEDUPE_TOP_MAX];
  size_t n = top ? dedupe_top(src->dedupe, families, counts, top) : 0;
  metric_family *f = metric_family_add(
      r, "cephalon_aggregate_dups", METRIC_GAUGE,
      "Events in each of the top families by count (:metrics :top-families, at most 256), "
      "the original included; DESIGN's aggregate_dup_count.",
      "family", NULL, 0);
  for (size_t i = 0; i < n; i++) {
    char id[24];
    snprintf(id, sizeof id, "%" PRIu64, families[i]);
    metric_gauge_set(metric_series_add(f, id), (double)counts[i]);
  }
}

/* DESIGN §3.9, §10: per-tenant series only for the METRICS_TOP_TENANTS tenants with the most
 * turns started (label cardinality); the rest are summed as tenant="(other)" — a name no
 * tenant can have. The default tenant (sessions without one) has the empty label, which
 * the text format writes as no label. O(tenants log tenants) per scrape. */
#define METRICS_TOP_TENANTS 32

typedef struct tenant_row {
  const char *name;
  uint64_t started, runnable;
} tenant_row;

static int tenant_row_cmp(const void *a, const void *b) {
  const tenant_row *x = a, *y = b;
  if (x->started != y->started)
    return x->started > y->started ? -1 : 1;
  return strcmp(x->name, y->name);
}

static void add_tenants(const metrics_sources *src, metric_registry *r) {
  const cph_sched *s = src->env->sched;
  uint32_t n = cph_sched_tenant_count(s);
  tenant_row *rows = calloc(n ? n : 1, sizeof *rows);
  if (!rows)
    return;
  for (uint32_t i = 0; i < n; i++) {
    cph_tenant_stats st;
    cph_sched_tenant_stats(s, i, &st);
    rows[i].name = st.name;
    for (int l = 0; l < CPH_LANE_COUNT; l++) {
      rows[i].started += st.started[l];
      rows[i].runnable += st.runnable[l];
    }
  }
  qsort(rows, n, sizeof *rows, tenant_row_cmp);
  metric_family *started = metric_family_add(
      r, "cephalon_tenant_turns_started_total", METRIC_COUNTER,
      "Turns started per tenant, over all lanes: the 32 tenants with the most, the rest as "
      "tenant=\"(other)\"; the series without a tenant label is sessions without one.",
      "tenant", NULL, 0);
  metric_family *runnable = metric_family_add(
      r, "cephalon_tenant_runnable_sessions", METRIC_GAUGE,
      "Runnable sessions per tenant, for the tenants of cephalon_tenant_turns_started_total.",
      "tenant", NULL, 0);
  tenant_row other = {"(other)", 0, 0};
  for (uint32_t i = 0; i < n; i++) {
    if (i < METRICS_TOP_TENANTS) {
      metric_counter_set(metric_series_add(started, rows[i].name), rows[i].started);
      metric_gauge_set(metric_series_add(runnable, rows[i].name), (double)rows[i].runnable);
    } else {
      other.started += rows[i].started;
      other.runnable += rows[i].runnable;
    }
  }
  if (n > METRICS_TOP_TENANTS) {
    metric_counter_set(metric_series_add(started, other.name), other.started);
    metric_gauge_set(metric_series_add(runnable, other.name), (double)other.runnable);
  }
  free(rows);
}

typedef struct bp_scan {
  const metrics_sources *src;
  const cph_policy *policy;
  metric_family *family;
  size_t exported;
  uint64_t degraded;
} bp_scan;

/* One channel's step, labelled with what holds it there (backpressure_trigger). */
static void bp_series(const metrics_sources *src, metric_family *f, const char *chan, int step) {
  const char *labels[2] = {chan, backpressure_trigger(src->bp, src->env->policy, chan)};
  metric_gauge_set(metric_series_addv(f, labels), step);
}

static void bp_visit(void *ctx, const char *chan, int step) {
  bp_scan *b = ctx;
  if (cph_policy_backpressure_for(b->policy, chan) != &b->policy->backpressure.defaults)
    return; /* an override: exported and counted from the policy's list */
  if (step > 0)
    b->degraded++;
  if (step > 0 && b->exported < METRICS_BP_CHANNELS_MAX) {
    bp_series(b->src, b->family, chan, step);
    b->exported++;
  }
}

/* Bounded series: the policy's override channels, plus at most METRICS_BP_CHANNELS_MAX
 * degraded ones. The scan is O(channels backpressure tracks) — those with traffic in the last
 * minutes or a persisted step — which its own once-a-second check walks anyway. */
static void add_backpressure(const metrics_sources *src, metric_registry *r) {
  const cph_policy *p = src->env->policy;
  bp_scan b = {src, p, NULL, 0, 0};
  b.family = metric_family_add(
      r, "cephalon_backpressure_step", METRIC_GAUGE,
      "Backpressure degrade step (0 normal .. 5 drop payloads) of channels with a policy "
      "override, and of at most 200 other degraded channels; trigger: what holds the channel "
      "at its step (a trigger's name, policy, or none at step 0).",
      "channel", NULL, 0);
  metric_family_add_label(b.family, "trigger");
  for (size_t i = 0; i < p->backpressure.channel_count; i++) {
    const char *chan = p->backpressure.channels[i].channel;
    int step = backpressure_step(src->bp, src->env->policy, chan);
    bp_series(src, b.family, chan, step);
    b.degraded += step > 0;
  }
  backpressure_foreach(src->bp, src->env->policy, bp_visit, &b);
  metric_add_gauge(r, "cephalon_backpressure_degraded_channels",
                   "Channels whose degrade step is above 0: those with a policy override and "
                   "those backpressure tracks (traffic in the last minutes or a stored step); "
                   "counts every one, also past the 200 exported.",
                   (double)b.degraded);
}

static void add_maintenance(const metrics_sources *src, metric_registry *r) {
  const cph_maint_stats st = src->maint;
  metric_add_counter(r, "cephalon_compaction_groups_committed_total",
                     "Compaction (gc) groups committed.", st.groups_committed_total);
  metric_add_counter(r, "cephalon_memories_deleted_total", "Memories deleted by compaction.",
                     st.memories_deleted_total);
  metric_add_counter(r, "cephalon_summaries_created_total",
                     "Summary memories created by compaction.", st.summaries_created_total);
  metric_add_gauge(r, "cephalon_outbox_pending", "Outbox items waiting to be applied.",
                   (double)st.outbox_pending);
  metric_add_gauge(r, "cephalon_outbox_oldest_age_seconds",
                   "Age of the oldest pending outbox item; 0 when none is pending.",
                   st.outbox_oldest_age_seconds);
  metric_add_gauge(r, "cephalon_embed_queue_length", "Memories waiting for an embedding.",
                   (double)st.embed_queue);
}

static void add_storage_and_policy(const metrics_sources *src, metric_registry *r) {
  const cph_engine_storage st = src->storage;
  if (src->have_storage) {
    metric_add_gauge(r, "cephalon_lmdb_map_size_bytes", "Size of the LMDB map.",
                     (double)st.map_size_bytes);
    metric_add_gauge(r, "cephalon_lmdb_used_bytes", "Bytes of the LMDB map in use.",
                     (double)st.used_bytes);
    metric_add_counter(r, "cephalon_lmdb_fsyncs_total",
                       "Disk flushes the store waited for: fdatasync calls (in a commit under "
                       ":sync :always, on the flush thread, on the :batch timer) and LMDB's "
                       "O_DSYNC meta-page writes.",
                       st.fsyncs);
  }
  metric_add_counter(r, "cephalon_storage_full_errors_total",
                     "Writes refused because the LMDB map is full (507 on ingest), and "
                     "passes whose commit failed so.",
                     src->metrics->live.storage_full);
  metric_add_gauge(r, "cephalon_policy_generation",
                   "Generation of the policy in force: 1 at start, +1 per reload.",
                   (double)src->env->policy_generation);
  metric_add_counter(r, "cephalon_policy_reload_failures_total",
                     "Policy reloads rejected (SIGHUP or POST /v1/admin/policy/reload); the "
                     "old policy stayed in force.",
                     src->metrics->live.reload_failures);
}

/* Cost: O(lanes + METRICS_CREDITS_SAMPLE_MAX + top families + policy overrides +
 * channels backpressure tracks), never O(sessions); the text is a few KB plus one line per
 * exported family and channel. */
char *metrics_text(const metrics_sources *src, size_t *len) {
  if (!src->metrics)
    return NULL;
  metric_registry *r = metric_registry_new();
  if (!r)
    return NULL;
  double credit_bounds[10]; /* outlives r */
  add_scheduler(src, r);
  add_tenants(src, r);
  add_credits(src, r, credit_bounds);
  add_turn_outcomes(src, r);
  add_ingest(src, r);
  add_dedupe(src, r);
  add_backpressure(src, r);
  add_maintenance(src, r);
  add_storage_and_policy(src, r);
  src->metrics->scrapes++; /* the one write: the next scrape samples other sessions */
  cph_buf out = CPH_BUF_INIT;
  int rc = metric_registry_write(r, &out);
  metric_registry_free(r);
  if (rc != CPH_OK) {
    cph_buf_free(&out);
    return NULL;
  }
  if (len)
    *len = out.len;
  return cph_buf_steal(&out);
}
