/* Metrics (DESIGN §10): the registry and exposition writer, the engine's live counters, and
 * the scrape. Contract in metrics.h. */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backpressure.h"
#include "dedupe.h"
#include "engine_internal.h"

/* ================================================================ registry */

struct metric_series {
  char *label_values[METRIC_LABELS_MAX]; /* one per label of the family */
  uint64_t counter;
  double gauge;
  metric_hist *hist; /* histograms only */
};

struct metric_family {
  const char *name, *help;
  const char *labels[METRIC_LABELS_MAX];
  size_t n_labels;
  metric_type type;
  const double *bounds;
  size_t n_bounds;
  metric_series *series;
  size_t n_series, cap_series;
  bool failed; /* a series could not be added */
};

struct metric_registry {
  metric_family **families;
  size_t n, cap;
  bool failed; /* a family could not be added */
};

void metric_hist_init(metric_hist *h, const double *bounds, size_t n_bounds) {
  memset(h, 0, sizeof *h);
  h->bounds = bounds;
  h->n_bounds = n_bounds < METRIC_HIST_MAX_BOUNDS ? n_bounds : METRIC_HIST_MAX_BOUNDS;
}

void metric_hist_observe(metric_hist *h, double v) {
  if (isnan(v))
    return;
  size_t lo = 0, hi = h->n_bounds; /* the first bound >= v; n_bounds = the +Inf bucket */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->bounds[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  h->counts[lo]++;
  h->count++;
  h->sum += v;
}

metric_registry *metric_registry_new(void) { return calloc(1, sizeof(metric_registry)); }

void metric_registry_free(metric_registry *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++) {
    metric_family *f = r->families[i];
    for (size_t j = 0; j < f->n_series; j++) {
      for (size_t k = 0; k < f->n_labels; k++)
        free(f->series[j].label_values[k]);
      free(f->series[j].hist);
    }
    free(f->series);
    free(f);
  }
  free(r->families);
  free(r);
}

metric_family *metric_family_add(metric_registry *r, const char *name, metric_type type,
                                 const char *help, const char *label, const double *bounds,
                                 size_t n_bounds) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 32;
    metric_family **p = realloc(r->families, cap * sizeof *p);
    if (!p) {
      r->failed = true;
      return NULL;
    }
    r->families = p;
    r->cap = cap;
  }
  metric_family *f = calloc(1, sizeof *f);
  if (!f) {
    r->failed = true;
    return NULL;
  }
  f->name = name;
  f->help = help;
  if (label)
    f->labels[f->n_labels++] = label;
  f->type = type;
  if (type == METRIC_HISTOGRAM) {
    f->bounds = bounds;
    f->n_bounds = n_bounds;
  }
  r->families[r->n++] = f;
  return f;
}

bool metric_family_add_label(metric_family *f, const char *label) {
  if (!f || f->n_series || f->n_labels == METRIC_LABELS_MAX)
    return false;
  f->labels[f->n_labels++] = label;
  return true;
}

metric_series *metric_series_add(metric_family *f, const char *label_value) {
  return metric_series_addv(f, &label_value);
}

metric_series *metric_series_addv(metric_family *f, const char *const *label_values) {
  if (!f)
    return NULL;
  if (f->n_series == f->cap_series) {
    size_t cap = f->cap_series ? f->cap_series * 2 : 4;
    metric_series *p = realloc(f->series, cap * sizeof *p);
    if (!p) {
      f->failed = true;
      return NULL;
    }
    f->series = p;
    f->cap_series = cap;
  }
  metric_series s = {0};
  for (size_t k = 0; k < f->n_labels; k++)
    if (!(s.label_values[k] = strdup(label_values[k] ? label_values[k] : ""))) {
      while (k-- > 0)
        free(s.label_values[k]);
      f->failed = true;
      return NULL;
    }
  if (f->type == METRIC_HISTOGRAM) {
    if (!(s.hist = malloc(sizeof *s.hist))) {
      for (size_t k = 0; k < f->n_labels; k++)
        free(s.label_values[k]);
      f->failed = true;
      return NULL;
    }
    metric_hist_init(s.hist, f->bounds, f->n_bounds);
  }
  f->series[f->n_series] = s;
  return &f->series[f->n_series++];
}

void metric_counter_set(metric_series *s, uint64_t v) {
  if (s && !s->hist)
    s->counter = v;
}

void metric_gauge_set(metric_series *s, double v) {
  if (s && !s->hist)
    s->gauge = v;
}

metric_hist *metric_series_hist(metric_series *s) { return s ? s->hist : NULL; }

void metric_add_counter(metric_registry *r, const char *name, const char *help, uint64_t v) {
  metric_counter_set(
      metric_series_add(metric_family_add(r, name, METRIC_COUNTER, help, NULL, NULL, 0), NULL),
      v);
}

void metric_add_gauge(metric_registry *r, const char *name, const char *help, double v) {
  metric_gauge_set(
      metric_series_add(metric_family_add(r, name, METRIC_GAUGE, help, NULL, NULL, 0), NULL), v);
}

/* ================================================================ writer */

const char *metric_format_double(double v, char buf[32]) {
  if (isnan(v))
    return strcpy(buf, "NaN");
  if (isinf(v))
    return strcpy(buf, v > 0 ? "+Inf" : "-Inf");
  if (v == 0)
    return strcpy(buf, "0"); /* also -0 */
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(buf, 32, "%.0f", v);
    return buf;
  }
  for (int prec = 15; prec <= 17; prec++) { /* the shortest that reads back the same */
    snprintf(buf, 32, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      break;
  }
  return buf;
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates,
 * at most U+10FFFF), or 0 if it is not one. */
static size_t utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  if (c < 0x80)
    return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) /* also stops at the NUL */
      return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return n;
}

/* HELP text: `\` and newline escaped. Label values also escape `"`. Both replace invalid
 * UTF-8 with U+FFFD. */
static void put_escaped(cph_buf *out, const char *text, bool label_value) {
  const unsigned char *s = (const unsigned char *)text;
  while (*s) {
    if (*s == '\\') {
      cph_buf_puts(out, "\\\\");
      s++;
    } else if (*s == '\n') {
      cph_buf_puts(out, "\\n");
      s++;
    } else if (*s == '"' && label_value) {
      cph_buf_puts(out, "\\\"");
      s++;
    } else {
      size_t n = utf8_len(s);
      if (n) {
        cph_buf_append(out, s, n);
        s += n;
      } else {
        cph_buf_puts(out, "\xEF\xBF\xBD");
        s++;
      }
    }
  }
}

static const char *type_name(metric_type t) {
  switch (t) {
  case METRIC_COUNTER: return "counter";
  case METRIC_GAUGE: return "gauge";
  case METRIC_HISTOGRAM: return "histogram";
  }
  return "untyped";
}

/* name[suffix]{label="value",...,le="bound"} — the braces only when there is a label. */
static void put_sample_name(cph_buf *out, const metric_family *f, const char *suffix,
                            const metric_series *s, const char *le) {
  cph_buf_puts(out, f->name);
  if (suffix)
    cph_buf_puts(out, suffix);
  /* A label whose value is empty is left out: Prometheus reads an empty label as absent, so
   * one family may hold series with and without it (cephalon_tool_calls_total's totals). */
  size_t written = 0;
  for (size_t k = 0; k < f->n_labels; k++) {
    if (!s->label_values[k] || !*s->label_values[k])
      continue;
    cph_buf_putc(out, written++ ? ',' : '{');
    cph_buf_puts(out, f->labels[k]);
    cph_buf_puts(out, "=\"");
    put_escaped(out, s->label_values[k], true);
    cph_buf_putc(out, '"');
  }
  if (le) {
    cph_buf_puts(out, written++ ? ",le=\"" : "{le=\"");
    cph_buf_puts(out, le);
    cph_buf_putc(out, '"');
  }
  if (written)
    cph_buf_putc(out, '}');
}

static void put_u64_line(cph_buf *out, uint64_t v) {
  cph_buf_printf(out, " %" PRIu64 "\n", v);
}

static void put_histogram(cph_buf *out, const metric_family *f, const metric_series *s) {
  const metric_hist *h = s->hist;
  char num[32];
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h->n_bounds; i++) {
    cumulative += h->counts[i];
    put_sample_name(out, f, "_bucket", s, metric_format_double(h->bounds[i], num));
    put_u64_line(out, cumulative);
  }
  cumulative += h->counts[h->n_bounds];
  put_sample_name(out, f, "_bucket", s, "+Inf");
  put_u64_line(out, cumulative);
  put_sample_name(out, f, "_sum", s, NULL);
  cph_buf_printf(out, " %s\n", metric_format_double(h->sum, num));
  put_sample_name(out, f, "_count", s, NULL);
  put_u64_line(out, cumulative); /* == h->count: every observation is in one bucket */
}

int metric_registry_write(const metric_registry *r, cph_buf *out) {
  bool failed = r->failed;
  for (size_t i = 0; i < r->n; i++) {
    const metric_family *f = r->families[i];
    failed |= f->failed;
    cph_buf_printf(out, "# HELP %s ", f->name);
    put_escaped(out, f->help, false);
    cph_buf_printf(out, "\n# TYPE %s %s\n", f->name, type_name(f->type));
    for (size_t j = 0; j < f->n_series; j++) {
      const metric_series *s = &f->series[j];
      char num[32];
      switch (f->type) {
      case METRIC_COUNTER:
        put_sample_name(out, f, NULL, s, NULL);
        put_u64_line(out, s->counter);
        break;
      case METRIC_GAUGE:
        put_sample_name(out, f, NULL, s, NULL);
        cph_buf_printf(out, " %s\n", metric_format_double(s->gauge, num));
        break;
      case METRIC_HISTOGRAM:
        put_histogram(out, f, s);
        break;
      }
    }
  }
  return failed || cph_buf_error(out) ? CPH_ENOMEM : CPH_OK;
}

/* ================================================================ the engine's live values */

static const double pick_wait_bounds[] = METRICS_PICK_WAIT_BOUNDS;
static const double inclusion_bounds[] = METRICS_INCLUSION_BOUNDS;
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define N_STATUS (CPH_EV_REJECTED + 1)

/* Everything counted as it happens: plain values, so saving and restoring around a pass is
 * one struct copy (about 1.5 KB). */
typedef struct metrics_live {
  uint64_t started[CPH_LANE_COUNT], completed[CPH_LANE_COUNT], failed[CPH_LANE_COUNT],
      expired[CPH_LANE_COUNT];
  metric_hist pick_wait[CPH_LANE_COUNT];
  metric_hist inclusion;
  uint64_t events[N_STATUS];
  uint64_t tool_valid, tool_invalid, tool_repairs, guard_denies;
  uint64_t tokens[CPH_LANE_COUNT]; /* completions' cost.tokens */
  uint64_t passes, storage_full, reload_failures;
} metrics_live;

/* Per-tool counts from completions' tool_stats.tools, by result. Kept beside `live` (too big
 * to copy every pass): a pass that touches them saves a copy first (tools_saved), and a
 * rollback puts it back. Names beyond METRICS_TOOLS_MAX distinct ones count as "_other". */
#define METRICS_TOOLS_MAX 128
enum { TOOL_VALID, TOOL_INVALID, TOOL_ERROR, TOOL_RESULTS };
static const char *const tool_result_names[TOOL_RESULTS] = {"valid", "invalid", "error"};

typedef struct tool_count {
  char name[129];
  uint64_t n[TOOL_RESULTS];
} tool_count;

typedef struct cph_metrics {
  metrics_live live;
  metrics_live saved; /* at the start of the current pass */
  uint64_t scrapes;   /* rotates the credits sample (see add_credits) */
  tool_count tools[METRICS_TOOLS_MAX];
  size_t n_tools;
  tool_count tools_saved[METRICS_TOOLS_MAX]; /* valid while tools_dirty */
  size_t n_tools_saved;
  bool tools_dirty; /* this pass changed tools[] */
} cph_metrics;

static void add_sat(uint64_t *c, uint64_t n) { *c = *c > UINT64_MAX - n ? UINT64_MAX : *c + n; }

int metrics_open(cph_engine *e) {
  cph_metrics *m = calloc(1, sizeof *m);
  if (!m)
    return CPH_ENOMEM;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    metric_hist_init(&m->live.pick_wait[i], pick_wait_bounds, N_OF(pick_wait_bounds));
  metric_hist_init(&m->live.inclusion, inclusion_bounds, N_OF(inclusion_bounds));
  m->saved = m->live;
  e->metrics = m;
  return CPH_OK;
}

void metrics_close(cph_engine *e) {
  free(e->metrics);
  e->metrics = NULL;
}

void metrics_pass_begin(cph_engine *e) {
  cph_metrics *m = e->metrics;
  if (!m)
    return;
  m->live.passes++;
  m->saved = m->live;
  m->tools_dirty = false;
}

void metrics_pass_rollback(cph_engine *e, int rc) {
  cph_metrics *m = e->metrics;
  if (!m)
    return;
  metrics_live now = m->live;
  m->live = m->saved;
  m->live.passes = now.passes;
  m->live.storage_full = now.storage_full + (rc == CPH_EFULL);
  m->live.reload_failures = now.reload_failures;
  if (m->tools_dirty) {
    memcpy(m->tools, m->tools_saved, m->n_tools_saved * sizeof m->tools[0]);
    m->n_tools = m->n_tools_saved;
    m->tools_dirty = false;
  }
}

/* The slot of a tool name, added when new; the "_other" slot once the table is full. */
static tool_count *tool_slot(cph_metrics *m, const char *name) {
  char shown[129];
  snprintf(shown, sizeof shown, "%s", name);
  for (size_t i = 0; i < m->n_tools; i++)
    if (strcmp(m->tools[i].name, shown) == 0)
      return &m->tools[i];
  if (m->n_tools == METRICS_TOOLS_MAX - 1) /* the last slot is "_other" */
    snprintf(shown, sizeof shown, "_other");
  for (size_t i = 0; i < m->n_tools; i++)
    if (strcmp(m->tools[i].name, shown) == 0)
      return &m->tools[i];
  tool_count *t = &m->tools[m->n_tools++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", shown);
  return t;
}

void metrics_event(cph_engine *e, cph_ingest_status status) {
  if (e->metrics && (unsigned)status < N_STATUS)
    e->metrics->live.events[status]++;
}

void metrics_storage_full(cph_engine *e) {
  if (e->metrics)
    e->metrics->live.storage_full++;
}

void metrics_turn_started(cph_engine *e, cph_lane lane, int64_t waited_ns,
                          const cph_turn_info *ti) {
  cph_metrics *m = e->metrics;
  if (!m || (unsigned)lane >= CPH_LANE_COUNT)
    return;
  m->live.started[lane]++;
  metric_hist_observe(&m->live.pick_wait[lane],
                      (double)(waited_ns > 0 ? waited_ns : 0) / (double)CPH_NS_PER_S);
  if (ti && ti->kind != CPH_KIND_JOB)
    metric_hist_observe(&m->live.inclusion, (double)(ti->n_memories + ti->n_history));
}

void metrics_turn_completed(cph_engine *e, cph_lane lane, const cph_op *op) {
  cph_metrics *m = e->metrics;
  if (!m || (unsigned)lane >= CPH_LANE_COUNT)
    return;
  m->live.completed[lane]++;
  add_sat(&m->live.tool_valid, op->u.turn.tool_stats.valid);
  add_sat(&m->live.tool_invalid, op->u.turn.tool_stats.invalid);
  add_sat(&m->live.tool_repairs, op->u.turn.tool_stats.repairs);
  add_sat(&m->live.guard_denies, op->u.turn.tool_stats.guard_denies);
  add_sat(&m->live.tokens[lane], op->u.turn.tokens);
  if (op->u.turn.tool_stats.n_tools && !m->tools_dirty) {
    memcpy(m->tools_saved, m->tools, m->n_tools * sizeof m->tools[0]);
    m->n_tools_saved = m->n_tools;
    m->tools_dirty = true;
  }
  for (size_t i = 0; i < op->u.turn.tool_stats.n_tools; i++) {
    const cph_tool_stat_in *in = &op->u.turn.tool_stats.tools[i];
    tool_count *t = tool_slot(m, in->name);
    /* A partition of the calls: refused for their arguments, ran and failed, ran fine. */
    uint64_t bad = in->invalid > in->calls ? in->calls : in->invalid;
    uint64_t err = in->errors > in->calls - bad ? in->calls - bad : in->errors;
    add_sat(&t->n[TOOL_INVALID], bad);
    add_sat(&t->n[TOOL_ERROR], err);
    add_sat(&t->n[TOOL_VALID], in->calls - bad - err);
  }
}

void metrics_turn_ended(cph_engine *e, cph_lane lane, bool expired) {
  cph_metrics *m = e->metrics;
  if (!m || (unsigned)lane >= CPH_LANE_COUNT)
    return;
  if (expired)
    m->live.expired[lane]++;
  else
    m->live.failed[lane]++;
}

void cph_engine_note_reload_failure(cph_engine *e) {
  if (e && e->metrics)
    e->metrics->live.reload_failures++;
}

/* ================================================================ the scrape */

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

static void add_scheduler(cph_engine *e, metric_registry *r) {
  const metrics_live *l = &e->metrics->live;
  add_lane_counter(r, "cephalon_turns_started_total", "Turns started (leased), per lane.",
                   l->started);
  add_lane_counter(r, "cephalon_turns_completed_total", "Turns completed, per lane.",
                   l->completed);
  add_lane_counter(r, "cephalon_turns_failed_total",
                   "Leases ended by the worker's fail, per lane.", l->failed);
  add_lane_counter(r, "cephalon_turns_expired_total",
                   "Leases that passed their deadline (or were in flight at a restart), "
                   "per lane.",
                   l->expired);

  cph_lane_info lanes[CPH_LANE_COUNT];
  uint32_t limit = 0, in_use = 0;
  cph_engine_lanes(e, lanes, &limit, &in_use);
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
                 "Tokens in the lane's tool-calls bucket now; negative after overspending.",
                 v[1]);
  add_lane_gauge(r, "cephalon_lane_budget_turns_per_minute",
                 "The lane's turns budget per minute in the policy in force.", v[2]);
  add_lane_gauge(r, "cephalon_lane_budget_tool_calls_per_minute",
                 "The lane's tool-calls budget per minute in the policy in force.", v[3]);
  add_lane_gauge(r, "cephalon_lane_runnable_sessions",
                 "Sessions waiting to run in the lane (runnable, not running).", v[4]);
  add_lane_gauge(r, "cephalon_lane_running_turns", "Turns running in the lane.", v[5]);

  metric_family *f = metric_family_add(
      r, "cephalon_pick_wait_seconds", METRIC_HISTOGRAM,
      "Time a session waited runnable before its turn started, per lane.", "lane",
      pick_wait_bounds, N_OF(pick_wait_bounds));
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    metric_hist *h = metric_series_hist(metric_series_add(f, cph_lane_name((cph_lane)i)));
    if (h)
      *h = l->pick_wait[i];
  }

  metric_add_gauge(r, "cephalon_concurrency_in_use", "Turns running now, over all lanes.",
                   in_use);
  metric_add_gauge(r, "cephalon_concurrency_limit", "At most this many turns run at once.",
                   limit);
  metric_add_counter(r, "cephalon_scheduler_passes_total", "Scheduler passes run.", l->passes);
  metric_add_gauge(r, "cephalon_sessions", "Sessions that exist.", (double)e->sessions.by_id.len);
}

/* Credits over sessions, sampled so a scrape stays cheap with a million sessions: at most
 * METRICS_CREDITS_SAMPLE_MAX scheduler slots, every stride-th, from an offset that rotates
 * with each scrape so successive scrapes cover every session. Buckets split the policy's
 * [min, max] into ten (they move with a reload; each scrape is a snapshot). */
static void add_credits(cph_engine *e, metric_registry *r, double bounds[10]) {
  const cph_policy *p = e->env.policy;
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
  size_t cap = e->sessions.cap_by_sid;
  size_t stride = cap / METRICS_CREDITS_SAMPLE_MAX + (cap % METRICS_CREDITS_SAMPLE_MAX != 0);
  if (!stride)
    stride = 1;
  for (size_t i = e->metrics->scrapes % stride; i < cap; i += stride)
    if (e->sessions.by_sid[i])
      metric_hist_observe(h, cph_sched_credits(e->env.sched, e->sessions.by_sid[i]->sid));
}

static void add_turn_outcomes(cph_engine *e, metric_registry *r) {
  const metrics_live *l = &e->metrics->live;
  const cph_metrics *m = e->metrics;
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
      const char *values[2] = {m->tools[i].name, tool_result_names[k]};
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
                        "context included; job turns carry no context and are not counted.",
                        NULL, inclusion_bounds, N_OF(inclusion_bounds)),
      NULL));
  if (h)
    *h = l->inclusion;
}

static void add_ingest(cph_engine *e, metric_registry *r) {
  const metrics_live *l = &e->metrics->live;
  metric_family *f = metric_family_add(r, "cephalon_events_total", METRIC_COUNTER,
                                       "Events posted, by their result status.", "status",
                                       NULL, 0);
  for (int s = 0; s < N_STATUS; s++)
    metric_counter_set(metric_series_add(f, cph_ingest_status_name((cph_ingest_status)s)),
                       l->events[s]);
  metric_add_counter(r, "cephalon_inbox_overflow_folded_total",
                     "Events the per-session queue cap (:sessions :max-queue) folded into an "
                     "overflow entry; they stay counted there, nothing is dropped.",
                     e->folded_total);
}

static void add_dedupe(cph_engine *e, metric_registry *r) {
  dedupe_stats st = {0};
  dedupe_stats_get(e->dedupe, &st);
  metric_add_counter(r, "cephalon_dedupe_exact_hits_total", "Events found exact duplicates.",
                     st.exact_hits_total);
  metric_add_counter(r, "cephalon_dedupe_near_hits_total",
                     "Events found near duplicates (simhash).", st.near_hits_total);
  /* DESIGN §10 says aggregate_count and aggregate_dup_count; promtool refuses a `_count`
   * suffix on anything but a histogram or summary, so these two carry other names. */
  metric_add_gauge(r, "cephalon_aggregates",
                   "Duplicate families (aggregates) stored; DESIGN's aggregate_count.",
                   (double)st.aggregate_count);
  size_t top = (size_t)e->env.policy->metrics.top_families;
  if (top > DEDUPE_TOP_MAX)
    top = DEDUPE_TOP_MAX;
  uint64_t families[DEDUPE_TOP_MAX], counts[DEDUPE_TOP_MAX];
  size_t n = top ? dedupe_top(e->dedupe, families, counts, top) : 0;
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

typedef struct bp_scan {
  cph_engine *e;
  const cph_policy *policy;
  metric_family *family;
  size_t exported;
  uint64_t degraded;
} bp_scan;

/* One channel's step, labelled with what holds it there (backpressure_trigger). */
static void bp_series(cph_engine *e, metric_family *f, const char *chan, int step) {
  const char *labels[2] = {chan, backpressure_trigger(e->bp, e->env.policy, chan)};
  metric_gauge_set(metric_series_addv(f, labels), step);
}

static void bp_visit(void *ctx, const char *chan, int step) {
  bp_scan *b = ctx;
  if (cph_policy_backpressure_for(b->policy, chan) != &b->policy->backpressure.defaults)
    return; /* an override: exported and counted from the policy's list */
  if (step > 0)
    b->degraded++;
  if (step > 0 && b->exported < METRICS_BP_CHANNELS_MAX) {
    bp_series(b->e, b->family, chan, step);
    b->exported++;
  }
}

/* Bounded series: the policy's override channels, plus at most METRICS_BP_CHANNELS_MAX
 * degraded ones. The scan is O(channels backpressure tracks) — those with traffic in the last
 * minutes or a persisted step — which its own once-a-second check walks anyway. */
static void add_backpressure(cph_engine *e, metric_registry *r) {
  const cph_policy *p = e->env.policy;
  bp_scan b = {e, p, NULL, 0, 0};
  b.family = metric_family_add(
      r, "cephalon_backpressure_step", METRIC_GAUGE,
      "Backpressure degrade step (0 normal .. 5 drop payloads) of channels with a policy "
      "override, and of at most 200 other degraded channels; trigger: what holds the channel "
      "at its step (a trigger's name, policy, or none at step 0).",
      "channel", NULL, 0);
  metric_family_add_label(b.family, "trigger");
  for (size_t i = 0; i < p->backpressure.channel_count; i++) {
    const char *chan = p->backpressure.channels[i].channel;
    int step = backpressure_step(e->bp, e->env.policy, chan);
    bp_series(e, b.family, chan, step);
    b.degraded += step > 0;
  }
  backpressure_foreach(e->bp, e->env.policy, bp_visit, &b);
  metric_add_gauge(r, "cephalon_backpressure_degraded_channels",
                   "Channels whose degrade step is above 0: those with a policy override and "
                   "those backpressure tracks (traffic in the last minutes or a stored step); "
                   "counts every one, also past the 200 exported.",
                   (double)b.degraded);
}

static void add_maintenance(cph_engine *e, metric_registry *r) {
  cph_maint_stats st;
  cph_engine_maint_stats(e, &st);
  metric_add_counter(r, "cephalon_compaction_groups_committed_total",
                     "Compaction (gc) groups committed.", st.groups_committed_total);
  metric_add_counter(r, "cephalon_memories_deleted_total",
                     "Memories deleted by compaction.", st.memories_deleted_total);
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

static void add_storage_and_policy(cph_engine *e, metric_registry *r) {
  cph_engine_storage st;
  if (cph_engine_storage_stats(e, &st) == CPH_OK) {
    metric_add_gauge(r, "cephalon_lmdb_map_size_bytes", "Size of the LMDB map.",
                     (double)st.map_size_bytes);
    metric_add_gauge(r, "cephalon_lmdb_used_bytes", "Bytes of the LMDB map in use.",
                     (double)st.used_bytes);
  }
  metric_add_counter(r, "cephalon_storage_full_errors_total",
                     "Writes refused because the LMDB map is full (507 on ingest), and "
                     "passes whose commit failed so.",
                     e->metrics->live.storage_full);
  metric_add_gauge(r, "cephalon_policy_generation",
                   "Generation of the policy in force: 1 at start, +1 per reload.",
                   (double)e->env.policy_generation);
  metric_add_counter(r, "cephalon_policy_reload_failures_total",
                     "Policy reloads rejected (SIGHUP or POST /v1/admin/policy/reload); the "
                     "old policy stayed in force.",
                     e->metrics->live.reload_failures);
}

/* Cost: O(lanes + METRICS_CREDITS_SAMPLE_MAX + top families + policy overrides +
 * channels backpressure tracks), never O(sessions); the text is a few KB plus one line per
 * exported family and channel. */
char *cph_engine_metrics_text(cph_engine *e, size_t *len) {
  if (!e->metrics)
    return NULL;
  metric_registry *r = metric_registry_new();
  if (!r)
    return NULL;
  double credit_bounds[10]; /* outlives r */
  add_scheduler(e, r);
  add_credits(e, r, credit_bounds);
  add_turn_outcomes(e, r);
  add_ingest(e, r);
  add_dedupe(e, r);
  add_backpressure(e, r);
  add_maintenance(e, r);
  add_storage_and_policy(e, r);
  e->metrics->scrapes++;
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
