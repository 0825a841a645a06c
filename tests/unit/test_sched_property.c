/* lanes/: the scheduler against the reference model (tests/support/sched_ref.c).
 *
 * 1,000 seeded random operation sequences run against cph_sched and the reference; at every
 * step the pick (session, lane, trickle flag, wait, or "nothing"), every session's credits,
 * running flags, why() answers and lane statistics must be identical, and the invariants
 * hold: running <= concurrency after a pick, no session picked while running, credits in
 * [min, max].
 *
 * A failure prints the sequence's seed and its last operations. To replay one sequence:
 *   CPH_PROP_SEED=<seed> [CPH_PROP_TRACE=1] ./test_sched_property
 * For a longer soak: CPH_PROP_SEQUENCES=<count> [CPH_PROP_BASE=<first seed>]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <dlfcn.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include "cephalon/error.h"
#include "lanes/pass.h"
#include "lanes/sched.h"
#include "tests/support/sched_ref.h"

#define SEQUENCES 1000
#define BASE_SEED UINT64_C(0x5eed0000)

/* Ids chosen so the id tie-break matters: "s1" < "s10" < "s100" < "s2" by strcmp. */
static const char *const ids[] = {"s1", "s10", "s100", "s2", "s20", "s3",
                                  "a",  "a1",  "B",    "b",  "s1.", "s:1"};
#define N_IDS (sizeof ids / sizeof ids[0])

#define TRACE_KEEP 24

static volatile uint64_t current_seed; /* for the crash message */
static volatile int in_sequence;

typedef struct prop {
  uint64_t seed;
  uint64_t rng;
  int step;
  bool verbose;
  bool ties; /* this sequence favours zero time steps and equal credits */
  bool tenants; /* this sequence names tenants (§3.9) */
  cph_clock clock;
  cph_sched_config cfg;
  cph_sched *s;
  cph_ref *r;
  bool present[N_IDS];
  cph_sid sid[N_IDS];
  int64_t max_units, min_units;
  char trace[TRACE_KEEP][160];
  int n_trace;
} prop;

/* ---------------------------------------------------------------- randomness */

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static uint64_t rnd(prop *p, uint64_t n) { return n ? splitmix(&p->rng) % n : 0; }
static bool chance(prop *p, int percent) { return rnd(p, 100) < (uint64_t)percent; }

#define PICK_FROM(p, arr) ((arr)[rnd((p), sizeof(arr) / sizeof((arr)[0]))])

/* ---------------------------------------------------------------- diagnostics */

static void note(prop *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(prop *p, const char *fmt, ...) {
  char *line = p->trace[p->n_trace++ % TRACE_KEEP];
  int n = snprintf(line, 160, "#%d t=%" PRId64 " ", p->step, cph_clock_now(&p->clock));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, (size_t)(160 - n), fmt, ap);
  va_end(ap);
  if (p->verbose)
    fprintf(stderr, "%s\n", line);
}

static void fail_seq(prop *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_seq(prop *p, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "property failure, seed %" PRIu64 " (CPH_PROP_SEED=%" PRIu64
                  ") at step %d: %s\nlast operations:\n",
          p->seed, p->seed, p->step, msg);
  int first = p->n_trace > TRACE_KEEP ? p->n_trace - TRACE_KEEP : 0;
  for (int i = first; i < p->n_trace; i++)
    fprintf(stderr, "  %s\n", p->trace[i % TRACE_KEEP]);
  uint64_t seed = p->seed;
  int step = p->step;
  in_sequence = 0;
  cph_sched_free(p->s);
  cph_ref_free(p->r);
  free(p);
  fail_msg("seed %" PRIu64 " step %d: %s", seed, step, msg);
}

#define CHECK(p, cond, ...)                                                                    \
  do {                                                                                         \
    if (!(cond))                                                                               \
      fail_seq((p), __VA_ARGS__);                                                              \
  } while (0)

/* ---------------------------------------------------------------- configs */

static void random_config(prop *p, cph_sched_config *c) {
  static const int64_t turns[] = {0, 1, 2, 3, 7, 60, 1000, 100000000};
  static const int64_t tools[] = {0, 1, 5, 60, 120, 100000000};
  static const double refill[] = {0, 0.5, 0.001, 1, 2.5, 0.0004, 0.0015, 1000};
  static const double maxes[] = {1, 2, 30, 0.5, 1000000};
  static const double costs[] = {0, 1, 2, 0.5, 30, 1000000};
  static const uint32_t trickles[] = {0, 0, 1, 6, 7, 60};
  memset(c, 0, sizeof *c);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    c->turns_per_minute[i] = chance(p, 70) ? PICK_FROM(p, turns) : (int64_t)rnd(p, 20);
    c->tool_calls_per_minute[i] = chance(p, 70) ? PICK_FROM(p, tools) : (int64_t)rnd(p, 200);
    c->cost[i] = PICK_FROM(p, costs);
  }
  c->refill_per_second = PICK_FROM(p, refill);
  c->credit_max = PICK_FROM(p, maxes);
  switch (rnd(p, 4)) {
  case 0: c->credit_min = 0; break;
  case 1: c->credit_min = c->credit_max; break;
  case 2: c->credit_min = -1000000; break;
  default: c->credit_min = -c->credit_max; break;
  }
  c->concurrency = 1 + (uint32_t)rnd(p, 6);
  c->trickle_per_minute = PICK_FROM(p, trickles);
  /* §3.8–3.10, each in about half the configs. */
  static const int64_t tokens[] = {0, 0, 1, 500, 6000, 100000, 100000000};
  static const int64_t per_unit[] = {1, 7, 1000, 50000};
  if (chance(p, 50))
    for (int i = 0; i < CPH_LANE_COUNT; i++)
      c->tokens_per_minute[i] = PICK_FROM(p, tokens);
  if (chance(p, 50)) {
    c->charge = CPH_CHARGE_TOKENS;
    c->tokens_per_unit = PICK_FROM(p, per_unit);
  }
  if (chance(p, 50)) {
    uint32_t left = c->concurrency;
    for (int i = 0; i < CPH_LANE_COUNT; i++) {
      c->seats[i] = (uint32_t)rnd(p, left + 1);
      left -= c->seats[i];
    }
  }
  static const cph_sched_tenant_weight weight_sets[][3] = {
      {{"t1", 1}, {"t2", 2}, {"acme", 5}},
      {{"acme", 3}, {"b", 0.5}, {"t2", 1000}},
      {{"t1", 0.001}, {"b", 7}, {"acme", 1}},
  };
  if (chance(p, 60)) {
    c->tenants = weight_sets[rnd(p, 3)];
    c->n_tenants = 1 + (size_t)rnd(p, 3);
  }
  if (cph_sched_config_check(c, NULL) != 0)
    fail_seq(p, "generated an invalid config");
}

static void remember_bounds(prop *p) {
  p->max_units = llround(p->cfg.credit_max * 1e12);
  p->min_units = llround(p->cfg.credit_min * 1e12);
}

/* ---------------------------------------------------------------- comparisons */

static void compare_why(prop *p, int i) {
  cph_why a, b;
  cph_sched_why(p->s, p->sid[i], &a);
  cph_ref_why(p->r, ids[i], &b);
  CHECK(p, a.reason == b.reason, "why(%s): reason %s, reference %s", ids[i],
        cph_why_reason_name(a.reason), cph_why_reason_name(b.reason));
  CHECK(p, a.lane == b.lane && a.credits == b.credits, "why(%s): lane/credits differ", ids[i]);
  CHECK(p, a.lane_runnable == b.lane_runnable,
        "why(%s): lane_runnable %" PRIu64 ", reference %" PRIu64, ids[i], a.lane_runnable,
        b.lane_runnable);
  CHECK(p, a.waiting_ns == b.waiting_ns,
        "why(%s): waiting %" PRId64 ", reference %" PRId64, ids[i], a.waiting_ns, b.waiting_ns);
  CHECK(p, a.until_ns == b.until_ns, "why(%s): until %" PRId64 ", reference %" PRId64, ids[i],
        a.until_ns, b.until_ns);
  CHECK(p, a.rank == b.rank, "why(%s): rank %" PRIu64 ", reference %" PRIu64, ids[i], a.rank,
        b.rank);
  CHECK(p, a.ahead_in_higher_lanes == b.ahead_in_higher_lanes,
        "why(%s): ahead %" PRIu64 ", reference %" PRIu64, ids[i], a.ahead_in_higher_lanes,
        b.ahead_in_higher_lanes);
  cph_tenant_stats ts;
  cph_sched_tenant_stats(p->s, a.tenant, &ts);
  CHECK(p, strcmp(ts.name, cph_ref_tenant_name(p->r, b.tenant)) == 0,
        "why(%s): tenant '%s', reference '%s'", ids[i], ts.name,
        cph_ref_tenant_name(p->r, b.tenant));
  CHECK(p, a.position == b.position && a.tenant_position == b.tenant_position &&
               a.tenant_runnable == b.tenant_runnable && a.turns_ahead == b.turns_ahead,
        "why(%s): position %" PRIu64 "/%" PRIu64 " in tenant %" PRIu64 "/%" PRIu64
        " of %" PRIu64 "/%" PRIu64 " ahead %" PRIu64 "/%" PRIu64,
        ids[i], a.position, b.position, a.tenant_position, b.tenant_position,
        a.tenant_runnable, b.tenant_runnable, a.turns_ahead, b.turns_ahead);
  CHECK(p, a.est_start_ns == b.est_start_ns,
        "why(%s): estimated start %" PRId64 ", reference %" PRId64, ids[i], a.est_start_ns,
        b.est_start_ns);
}

static void compare_state(prop *p) {
  CHECK(p, cph_sched_audit(p->s) == CPH_OK, "the scheduler's internal counts disagree");
  CHECK(p, cph_sched_running(p->s) == cph_ref_running(p->r), "running %u, reference %u",
        cph_sched_running(p->s), cph_ref_running(p->r));
  for (size_t i = 0; i < N_IDS; i++) {
    if (!p->present[i])
      continue;
    double a = cph_sched_credits(p->s, p->sid[i]);
    int64_t units = cph_ref_credit_units(p->r, ids[i]);
    CHECK(p, a == (double)units / 1e12, "credits(%s) %.12f, reference %.12f", ids[i], a,
          (double)units / 1e12);
    CHECK(p, units >= p->min_units && units <= p->max_units,
          "credits(%s) %.12f outside [%g, %g]", ids[i], (double)units / 1e12,
          p->cfg.credit_min, p->cfg.credit_max);
    CHECK(p, cph_sched_is_running(p->s, p->sid[i]) == cph_ref_is_running(p->r, ids[i]),
          "running(%s) differs", ids[i]);
    CHECK(p, strcmp(cph_sched_id(p->s, p->sid[i]), ids[i]) == 0, "id of sid %u", p->sid[i]);
  }
  /* why() and lane stats refill and promote inside the scheduler; ask them only on some
   * steps so the operations alone are also compared. */
  if (chance(p, 40))
    for (size_t i = 0; i < N_IDS; i++)
      if (p->present[i])
        compare_why(p, (int)i);
  if (chance(p, 40))
    for (int l = 0; l < CPH_LANE_COUNT; l++) {
      cph_lane_stats a, b;
      cph_sched_lane_stats(p->s, (cph_lane)l, &a);
      cph_ref_lane_stats(p->r, (cph_lane)l, &b);
      CHECK(p,
            a.turns_left == b.turns_left && a.tool_calls_left == b.tool_calls_left &&
                a.has_budget == b.has_budget,
            "lane %d buckets: turns %.6f/%.6f tools %.6f/%.6f budget %d/%d", l, a.turns_left,
            b.turns_left, a.tool_calls_left, b.tool_calls_left, a.has_budget, b.has_budget);
      CHECK(p, a.runnable == b.runnable && a.running == b.running,
            "lane %d: runnable %" PRIu64 "/%" PRIu64 " running %" PRIu64 "/%" PRIu64, l,
            a.runnable, b.runnable, a.running, b.running);
      CHECK(p, a.started_total == b.started_total, "lane %d started %" PRIu64 "/%" PRIu64, l,
            a.started_total, b.started_total);
      CHECK(p, a.tokens_left == b.tokens_left, "lane %d tokens %.6f/%.6f", l, a.tokens_left,
            b.tokens_left);
      CHECK(p,
            a.seats == b.seats && a.seats_lent == b.seats_lent &&
                a.seats_borrowed == b.seats_borrowed,
            "lane %d seats %u/%u lent %u/%u borrowed %u/%u", l, a.seats, b.seats, a.seats_lent,
            b.seats_lent, a.seats_borrowed, b.seats_borrowed);
      CHECK(p, a.tenant_run == b.tenant_run, "lane %d tenant run %u/%u", l, a.tenant_run,
            b.tenant_run);
      CHECK(p, a.tenants_runnable == b.tenants_runnable,
            "lane %d tenants runnable %" PRIu64 "/%" PRIu64, l, a.tenants_runnable,
            b.tenants_runnable);
      CHECK(p,
            a.window == b.window && a.mean_spacing_ns == b.mean_spacing_ns &&
                a.mean_turn_ns == b.mean_turn_ns,
            "lane %d window %u/%u spacing %" PRId64 "/%" PRId64 " turn %" PRId64 "/%" PRId64, l,
            a.window, b.window, a.mean_spacing_ns, b.mean_spacing_ns, a.mean_turn_ns,
            b.mean_turn_ns);
    }
}

static int index_of(const char *id) {
  for (size_t i = 0; i < N_IDS; i++)
    if (strcmp(ids[i], id) == 0)
      return (int)i;
  return -1;
}

/* Compares the scheduler's pick (rc, got) with the reference's next pick, made now. */
static void compare_pick(prop *p, int rc, const cph_pick *got) {
  cph_ref_pick want;
  bool was_running[N_IDS];
  for (size_t i = 0; i < N_IDS; i++)
    was_running[i] = p->present[i] && cph_ref_is_running(p->r, ids[i]);
  cph_ref_pick_next(p->r, &want);
  if (rc != 0) {
    CHECK(p, rc == CPH_ENOTFOUND, "pick returned %d", rc);
    CHECK(p, want.id == NULL, "pick: nothing, reference %s (lane %d%s)", want.id,
          want.lane, want.trickle ? ", trickle" : "");
    note(p, "pick -> nothing");
    return;
  }
  const char *id = cph_sched_id(p->s, got->sid);
  CHECK(p, want.id != NULL, "pick: %s, reference nothing", id);
  CHECK(p, strcmp(id, want.id) == 0, "pick: %s, reference %s", id, want.id);
  CHECK(p, got->lane == want.lane && got->trickle == want.trickle,
        "pick %s: lane %d trickle %d, reference lane %d trickle %d", id, got->lane,
        got->trickle, want.lane, want.trickle);
  CHECK(p, got->waited_ns == want.waited_ns, "pick %s: waited %" PRId64 ", reference %" PRId64,
        id, got->waited_ns, want.waited_ns);
  int i = index_of(id);
  CHECK(p, i >= 0 && p->sid[i] == got->sid, "pick: unknown sid %u", got->sid);
  CHECK(p, !was_running[i], "pick: %s was already running", id);
  CHECK(p, cph_sched_running(p->s) <= cph_sched_concurrency(p->s),
        "running %u > concurrency %u after a pick", cph_sched_running(p->s),
        cph_sched_concurrency(p->s));
  note(p, "pick -> %s lane %d%s waited %" PRId64, id, got->lane, got->trickle ? " trickle" : "",
       got->waited_ns);
}

/* ---------------------------------------------------------------- the pass as an operation */

typedef struct pass_ctx {
  prop *p;
  uint32_t waiting;
  uint32_t started;
  int last_job;
  int stage_idx; /* session poll_inbox gives work to, or -1 */
} pass_ctx;

static uint32_t hook_waiting(void *ctx) { return ((pass_ctx *)ctx)->waiting; }

static void hook_start(void *ctx, const cph_pick *pick) {
  pass_ctx *c = ctx;
  compare_pick(c->p, 0, pick);
  c->started++;
}

static uint64_t hook_poll(void *ctx) {
  pass_ctx *c = ctx;
  if (c->started < c->waiting) { /* agent_turn stopped early: the reference has nothing either */
    cph_ref_pick want;
    cph_ref_pick_next(c->p->r, &want);
    CHECK(c->p, want.id == NULL, "pass stopped, reference would start %s", want.id);
  }
  if (c->stage_idx < 0)
    return 0;
  cph_sched_set_work(c->p->s, c->p->sid[c->stage_idx], true);
  cph_ref_set_work(c->p->r, ids[c->stage_idx], true);
  return 1;
}

static void hook_trace(void *ctx, cph_pass_job job) {
  pass_ctx *c = ctx;
  CHECK(c->p, (int)job == c->last_job + 1, "pass ran %s after job %d", cph_pass_job_name(job),
        c->last_job);
  c->last_job = (int)job;
}

static void op_pass(prop *p) {
  pass_ctx c = {p, (uint32_t)rnd(p, 4), 0, -1, -1};
  int candidates[N_IDS], n = 0;
  for (size_t i = 0; i < N_IDS; i++)
    if (p->present[i])
      candidates[n++] = (int)i;
  if (n && chance(p, 50))
    c.stage_idx = candidates[rnd(p, (uint64_t)n)];
  note(p, "pass workers=%u stage=%s", c.waiting, c.stage_idx >= 0 ? ids[c.stage_idx] : "-");
  cph_pass_hooks h = {.ctx = &c, .workers_waiting = hook_waiting, .start_turn = hook_start,
                      .poll_inbox = hook_poll, .trace = hook_trace};
  cph_pass_result res;
  cph_sched_pass(p->s, &h, &res);
  CHECK(p, c.last_job == CPH_PASS_RECONCILE, "pass ended after job %d", c.last_job);
  CHECK(p, res.started == c.started, "pass reported %u started, saw %u", res.started,
        c.started);
}

/* ---------------------------------------------------------------- operations */

static int random_present(prop *p) {
  int c[N_IDS], n = 0;
  for (size_t i = 0; i < N_IDS; i++)
    if (p->present[i])
      c[n++] = (int)i;
  return n ? c[rnd(p, (uint64_t)n)] : -1;
}

static int random_absent(prop *p) {
  int c[N_IDS], n = 0;
  for (size_t i = 0; i < N_IDS; i++)
    if (!p->present[i])
      c[n++] = (int)i;
  return n ? c[rnd(p, (uint64_t)n)] : -1;
}

static int random_running(prop *p) {
  int c[N_IDS], n = 0;
  for (size_t i = 0; i < N_IDS; i++)
    if (p->present[i] && cph_ref_is_running(p->r, ids[i]))
      c[n++] = (int)i;
  return n ? c[rnd(p, (uint64_t)n)] : -1;
}

static void op_add(prop *p, bool restore) {
  int i = random_absent(p);
  if (i < 0)
    return;
  cph_lane lane = (cph_lane)rnd(p, CPH_LANE_COUNT);
  int rc_s, rc_r;
  if (restore) {
    static const double fractions[] = {-2, -1, -0.5, 0, 0.25, 0.5, 1, 2};
    double credits = PICK_FROM(p, fractions) * p->cfg.credit_max;
    note(p, "restore %s lane %d credits %g", ids[i], lane, credits);
    rc_s = cph_sched_restore(p->s, ids[i], lane, credits, &p->sid[i]);
    rc_r = cph_ref_restore(p->r, ids[i], lane, credits);
  } else {
    note(p, "add %s lane %d", ids[i], lane);
    rc_s = cph_sched_add(p->s, ids[i], lane, &p->sid[i]);
    rc_r = cph_ref_add(p->r, ids[i], lane);
  }
  CHECK(p, rc_s == 0 && rc_r == 0, "add %s: %d / %d", ids[i], rc_s, rc_r);
  p->present[i] = true;
  /* Most new sessions get work at once, so ties on queued_since are common. */
  if (chance(p, 60)) {
    cph_sched_set_work(p->s, p->sid[i], true);
    cph_ref_set_work(p->r, ids[i], true);
  }
}

static void op_remove(prop *p) {
  int i = random_present(p);
  if (i < 0)
    return;
  int rc_s = cph_sched_remove(p->s, p->sid[i]);
  int rc_r = cph_ref_remove(p->r, ids[i]);
  note(p, "remove %s -> %d", ids[i], rc_s);
  CHECK(p, rc_s == rc_r, "remove %s: %d, reference %d", ids[i], rc_s, rc_r);
  if (rc_s == 0)
    p->present[i] = false;
}

static void op_flag(prop *p, int which) {
  int i = random_present(p);
  if (i < 0)
    return;
  bool on = chance(p, which == 0 ? 75 : 50);
  switch (which) {
  case 0:
    note(p, "work %s %d", ids[i], on);
    cph_sched_set_work(p->s, p->sid[i], on);
    cph_ref_set_work(p->r, ids[i], on);
    break;
  case 1:
    note(p, "paused %s %d", ids[i], on);
    cph_sched_set_paused(p->s, p->sid[i], on);
    cph_ref_set_paused(p->r, ids[i], on);
    break;
  default:
    note(p, "trickle %s %d", ids[i], on);
    cph_sched_set_trickle(p->s, p->sid[i], on);
    cph_ref_set_trickle(p->r, ids[i], on);
    break;
  }
}

static void op_pick(prop *p) {
  cph_pick got;
  int rc = cph_sched_pick(p->s, &got);
  compare_pick(p, rc, &got);
}

static void op_finish(prop *p) {
  int i = random_running(p);
  if (i < 0) {
    /* Finishing a session that is not running is ignored by both. */
    i = random_present(p);
    if (i < 0)
      return;
  }
  static const uint64_t calls[] = {0, 0, 1, 1, 2, 3, 5, 20, 1000};
  static const uint64_t tokens[] = {0, 0, 1, 499, 500, 7000, 50000, 2000000};
  uint64_t n = PICK_FROM(p, calls), t = PICK_FROM(p, tokens);
  bool charge = chance(p, 80);
  note(p, "finish %s tools %" PRIu64 " tokens %" PRIu64 " charge %d", ids[i], n, t, charge);
  cph_sched_cost cost = {n, t};
  cph_sched_finish_cost(p->s, p->sid[i], &cost, charge);
  cph_ref_finish_cost(p->r, ids[i], n, t, charge);
}

static void op_tenant(prop *p) {
  static const char *const names[] = {"", "t1", "t2", "acme", "b", "t1"};
  int i = random_present(p);
  if (i < 0)
    return;
  const char *t = PICK_FROM(p, names);
  note(p, "tenant %s '%s'", ids[i], t);
  CHECK(p, cph_sched_set_tenant(p->s, p->sid[i], t) == 0, "set_tenant failed");
  cph_ref_set_tenant(p->r, ids[i], t);
  CHECK(p, strcmp(cph_sched_tenant(p->s, p->sid[i]), t) == 0, "tenant of %s", ids[i]);
}

static void op_time(prop *p) {
  cph_clock *c = &p->clock;
  int64_t step;
  switch (rnd(p, p->ties ? 4 : 7)) {
  case 0: step = 0; break;
  case 1: step = 1 + (int64_t)rnd(p, 1000); break;
  case 2: {
    int64_t next = cph_ref_next_boundary(p->r);
    step = next ? next - cph_clock_now(c) - (chance(p, 25) ? 1 : 0) : 0;
    break;
  }
  case 3: step = (int64_t)rnd(p, 3) * CPH_NS_PER_S / 2; break;
  case 4: step = (int64_t)rnd(p, 2000) * CPH_NS_PER_MS; break;
  case 5: step = (1 + (int64_t)rnd(p, 90)) * CPH_NS_PER_S; break;
  default: step = (1 + (int64_t)rnd(p, 180)) * 60 * CPH_NS_PER_S; break;
  }
  note(p, "advance %" PRId64, step);
  cph_clock_advance(c, step);
}

static void op_reload(prop *p) {
  cph_sched_config c;
  random_config(p, &c);
  note(p, "reload turns %" PRId64 "/%" PRId64 "/%" PRId64 " tools %" PRId64 "/%" PRId64
          "/%" PRId64 " refill %g max %g min %g conc %u trickle %u",
       c.turns_per_minute[0], c.turns_per_minute[1], c.turns_per_minute[2],
       c.tool_calls_per_minute[0], c.tool_calls_per_minute[1], c.tool_calls_per_minute[2],
       c.refill_per_second, c.credit_max, c.credit_min, c.concurrency, c.trickle_per_minute);
  CHECK(p, cph_sched_configure(p->s, &c) == 0, "configure rejected a valid config");
  cph_ref_configure(p->r, &c);
  p->cfg = c;
  remember_bounds(p);
}

enum op {
  OP_ADD, OP_RESTORE, OP_REMOVE, OP_WORK, OP_PAUSE, OP_TRICKLE, OP_TRICKLE_RAN, OP_PICK,
  OP_FINISH, OP_TIME, OP_RELOAD, OP_PASS, OP_CHECK, OP_TENANT, OP_COUNT
};

/* Weights per operation (percent). Tie-heavy sequences churn sessions at one instant, so
 * removed sessions' slots are reused while equal entries are queued. Sequences with tenants
 * (two in three) move sessions between tenants. */
static const int weights_mixed[OP_COUNT] = {12, 2, 4, 16, 5, 4, 1, 20, 15, 14, 2, 3, 2, 0};
static const int weights_ties[OP_COUNT] = {16, 2, 10, 16, 4, 3, 1, 20, 12, 8, 2, 4, 2, 0};
static const int weights_tenants[OP_COUNT] = {10, 2, 4, 14, 4, 3, 1, 20, 14, 12, 2, 3, 1, 10};

static enum op random_op(prop *p) {
  const int *w = p->tenants ? weights_tenants : p->ties ? weights_ties : weights_mixed;
  int x = (int)rnd(p, 100);
  for (int i = 0; i < OP_COUNT; i++) {
    if (x < w[i])
      return (enum op)i;
    x -= w[i];
  }
  return OP_CHECK;
}

static void run_sequence(uint64_t seed, bool verbose) {
  prop *p = calloc(1, sizeof *p);
  current_seed = seed;
  in_sequence = 1;
  p->seed = seed;
  p->rng = seed;
  p->verbose = verbose;
  p->ties = seed % 3 == 0;
  p->tenants = seed % 3 == 2;
  cph_clock_init_virtual(&p->clock, (int64_t)rnd(p, 1000) * CPH_NS_PER_S);
  random_config(p, &p->cfg);
  remember_bounds(p);
  note(p, "config turns %" PRId64 "/%" PRId64 "/%" PRId64 " tools %" PRId64 "/%" PRId64
          "/%" PRId64 " refill %g max %g min %g conc %u trickle %u",
       p->cfg.turns_per_minute[0], p->cfg.turns_per_minute[1], p->cfg.turns_per_minute[2],
       p->cfg.tool_calls_per_minute[0], p->cfg.tool_calls_per_minute[1],
       p->cfg.tool_calls_per_minute[2], p->cfg.refill_per_second, p->cfg.credit_max,
       p->cfg.credit_min, p->cfg.concurrency, p->cfg.trickle_per_minute);
  p->s = cph_sched_new(&p->cfg, &p->clock);
  p->r = cph_ref_new(&p->cfg, &p->clock);
  assert_non_null(p->s);

  int steps = 120 + (int)rnd(p, 240);
  for (p->step = 0; p->step < steps; p->step++) {
    switch (random_op(p)) {
    case OP_ADD: op_add(p, false); break;
    case OP_RESTORE: op_add(p, true); break;
    case OP_REMOVE: op_remove(p); break;
    case OP_WORK: op_flag(p, 0); break;
    case OP_PAUSE: op_flag(p, 1); break;
    case OP_TRICKLE: op_flag(p, 2); break;
    case OP_TRICKLE_RAN:
      note(p, "trickle_ran");
      cph_sched_trickle_ran(p->s);
      cph_ref_trickle_ran(p->r);
      break;
    case OP_PICK: op_pick(p); break;
    case OP_FINISH: op_finish(p); break;
    case OP_TIME: op_time(p); break;
    case OP_RELOAD: op_reload(p); break;
    case OP_PASS: op_pass(p); break;
    case OP_TENANT: op_tenant(p); break;
    default:
      note(p, "check_credits + top_up");
      cph_sched_check_credits(p->s);
      cph_sched_top_up(p->s);
      break;
    }
    compare_state(p);
  }
  cph_sched_free(p->s);
  cph_ref_free(p->r);
  free(p);
  in_sequence = 0;
}

/* ---------------------------------------------------------------- crashes */

/* A crash (or a sanitizer report) inside a sequence must still name its seed. */

static void say_seed(void) {
  if (!in_sequence)
    return;
  char buf[96];
  int n = snprintf(buf, sizeof buf, "\nproperty sequence crashed: CPH_PROP_SEED=%" PRIu64 "\n",
                   (uint64_t)current_seed);
  if (n > 0 && write(2, buf, (size_t)n) < 0)
    return;
}

static void on_signal(int sig) {
  say_seed();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void watch_crashes(void) {
  signal(SIGSEGV, on_signal);
  signal(SIGABRT, on_signal);
  signal(SIGFPE, on_signal);
#ifdef __SANITIZE_ADDRESS__
  __sanitizer_set_death_callback(say_seed);
  /* GCC links UBSan as its own library with its own copy of the callback. */
  void *ubsan = dlopen("libubsan.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (ubsan) {
    void (*set)(void (*)(void));
    *(void **)&set = dlsym(ubsan, "__sanitizer_set_death_callback");
    if (set)
      set(say_seed);
  }
#endif
}

/* ---------------------------------------------------------------- tests */

static void test_sched_matches_reference_on_random_sequences(void **state) {
  (void)state;
  const char *one = getenv("CPH_PROP_SEED");
  bool verbose = getenv("CPH_PROP_TRACE") != NULL;
  watch_crashes();
  if (one) {
    run_sequence(strtoull(one, NULL, 0), verbose);
    return;
  }
  const char *count = getenv("CPH_PROP_SEQUENCES"), *base = getenv("CPH_PROP_BASE");
  uint64_t n = count ? strtoull(count, NULL, 0) : SEQUENCES;
  uint64_t first = base ? strtoull(base, NULL, 0) : BASE_SEED;
  for (uint64_t i = 0; i < n; i++)
    run_sequence(first + i, verbose);
}

/* The reference itself, on a case worked by hand, so a bug shared by both models cannot hide
 * behind their agreement. */
static void test_reference_applies_pick_rules_literally(void **state) {
  (void)state;
  cph_clock clock;
  cph_clock_init_virtual(&clock, 0);
  cph_sched_config cfg = {{60, 60, 60}, {600, 600, 600}, 1.0, 10, -10, {2, 2, 2}, 8, 0, {0}, CPH_CHARGE_TURN, 0, {0}, NULL, 0, 0};
  cph_ref *r = cph_ref_new(&cfg, &clock);
  const char *names[] = {"s2", "s10", "s1"};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(cph_ref_add(r, names[i], CPH_LANE_OPERATIONAL), 0);
    cph_ref_set_work(r, names[i], true);
  }
  assert_int_equal(cph_ref_add(r, "i", CPH_LANE_INTERACTIVE), 0);
  cph_ref_pick pk;
  /* All at max and queued at 0: by id, "s1" < "s10" < "s2". */
  cph_ref_pick_next(r, &pk);
  assert_string_equal(pk.id, "s1");
  cph_ref_finish(r, "s1", 0, true); /* 8 credits, queued again at 0 */
  cph_ref_pick_next(r, &pk);
  assert_string_equal(pk.id, "s10");
  cph_clock_advance(&clock, CPH_NS_PER_S);
  cph_ref_finish(r, "s10", 0, true); /* 8 credits at t=1 s; s1 has 9 */
  cph_ref_set_work(r, "i", true);
  cph_ref_pick_next(r, &pk); /* the interactive lane goes first */
  assert_string_equal(pk.id, "i");
  cph_ref_pick_next(r, &pk); /* s2 is at max */
  assert_string_equal(pk.id, "s2");
  cph_ref_pick_next(r, &pk); /* s1 (9) before s10 (8) */
  assert_string_equal(pk.id, "s1");
  assert_int_equal(cph_ref_credit_units(r, "s10"), INT64_C(8000000000000));
  cph_ref_free(r);
}

/* §3.9 with more weight classes than the sequences above reach (they name at most three
 * tenants, so a lane holds at most four classes): 30 tenants of 20 weights, so a lane's
 * tournament of classes grows to 32 leaves. Groups join and leave as sessions gain and lose
 * work, sessions move between tenants, reloads move tenants between classes; every pick must
 * be the reference's.
 *
 * pace: a clock advance is 0, 1 or 2 times this; budget: turns (and ten times the tool
 * calls, at most the limit) per minute per lane; run_max: cfg.tenant_run_max. Returns the
 * picks made while the interactive lane's runs were longer than one. The same with TENANTS
 * tenants over SESSIONS sessions, and cph_sched_audit after every step when audit is set. */
enum { MAX_TENANTS = 30, MAX_SESSIONS = 900 };

static int tenants_against_reference(int64_t pace, int64_t budget, uint32_t run_max,
                                     int TENANTS, int SESSIONS, int STEPS, bool audit) {
  int64_t tools = budget > CPH_SCHED_MAX_PER_MINUTE / 10 ? CPH_SCHED_MAX_PER_MINUTE : 10 * budget;
  cph_clock clock;
  cph_clock_init_virtual(&clock, 0);
  static char tnames[MAX_TENANTS][12], snames[MAX_SESSIONS][12];
  cph_sched_tenant_weight w[MAX_TENANTS];
  static cph_sid sid[MAX_SESSIONS];
  assert_true(TENANTS <= MAX_TENANTS && SESSIONS <= MAX_SESSIONS);
  for (int t = 0; t < TENANTS; t++) {
    snprintf(tnames[t], sizeof tnames[t], "t%d", t);
    w[t] = (cph_sched_tenant_weight){tnames[t], 0.5 + (t % 20) * 0.75};
  }
  cph_sched_config cfg = {{budget, budget, budget},
                          {tools, tools, tools},
                          2.0,
                          20,
                          -20,
                          {3, 1, 1},
                          6,
                          0,
                          {0},
                          CPH_CHARGE_TURN,
                          0,
                          {0},
                          w,
                          TENANTS,
                          run_max};
  cph_sched *s = cph_sched_new(&cfg, &clock);
  cph_ref *r = cph_ref_new(&cfg, &clock);
  assert_non_null(s);
  assert_non_null(r);
  for (int i = 0; i < SESSIONS; i++) {
    snprintf(snames[i], sizeof snames[i], "s%d", i);
    cph_lane lane = i % 6 ? CPH_LANE_INTERACTIVE : CPH_LANE_OPERATIONAL;
    assert_int_equal(cph_sched_add(s, snames[i], lane, &sid[i]), 0);
    assert_int_equal(cph_ref_add(r, snames[i], lane), 0);
    assert_int_equal(cph_sched_set_tenant(s, sid[i], tnames[i % TENANTS]), 0);
    cph_ref_set_tenant(r, snames[i], tnames[i % TENANTS]);
  }
  uint64_t rng = 0x7e4a47;
  int picks = 0, in_runs = 0;
  for (int step = 0; step < STEPS; step++) {
    int i = (int)(splitmix(&rng) % SESSIONS);
    uint64_t op = splitmix(&rng) % 100;
    if (op < 35) {
      cph_pick got;
      cph_ref_pick want;
      int rc = cph_sched_pick(s, &got);
      cph_ref_pick_next(r, &want);
      if (rc != 0) {
        assert_null(want.id);
        continue;
      }
      assert_non_null(want.id);
      if (strcmp(cph_sched_id(s, got.sid), want.id) != 0)
        fail_msg("step %d: picked %s, reference %s", step, cph_sched_id(s, got.sid), want.id);
      picks++;
      cph_lane_stats st;
      cph_sched_lane_stats(s, CPH_LANE_INTERACTIVE, &st);
      in_runs += st.tenant_run > 1;
      /* every started turn is some tenant's, also in the middle of a run */
      uint64_t by_tenant = 0;
      for (uint32_t t = 0; t < cph_sched_tenant_count(s); t++) {
        cph_tenant_stats ts;
        cph_sched_tenant_stats(s, t, &ts);
        by_tenant += ts.started[CPH_LANE_INTERACTIVE];
      }
      if (by_tenant != st.started_total)
        fail_msg("step %d: tenants started %" PRIu64 ", lane %" PRIu64, step, by_tenant,
                 st.started_total);
    } else if (op < 65) { /* the first running session from i on finishes */
      for (int k = 0; k < SESSIONS; k++, i = (i + 1) % SESSIONS)
        if (cph_sched_is_running(s, sid[i])) {
          cph_sched_finish(s, sid[i], 1, true);
          cph_ref_finish(r, snames[i], 1, true);
          break;
        }
    } else if (op < 90) {
      bool on = splitmix(&rng) % 4 != 0; /* mostly runnable: groups rejoin often */
      cph_sched_set_work(s, sid[i], on);
      cph_ref_set_work(r, snames[i], on);
    } else if (op < 95) {
      cph_clock_advance(&clock, (int64_t)(splitmix(&rng) % 3) * pace);
    } else if (op < 99) {
      const char *t = tnames[splitmix(&rng) % TENANTS];
      assert_int_equal(cph_sched_set_tenant(s, sid[i], t), 0);
      cph_ref_set_tenant(r, snames[i], t);
    } else {
      for (int t = 0; t < TENANTS; t++) /* new weights: tenants change classes */
        w[t].weight = 0.5 + (double)(splitmix(&rng) % 20) * 0.75;
      assert_int_equal(cph_sched_configure(s, &cfg), 0);
      cph_ref_configure(r, &cfg);
    }
    if (audit) {
      cph_why why; /* reads (and brings up to now) every group's sets of the lane */
      cph_sched_why(s, sid[i], &why);
      if (cph_sched_audit(s) != CPH_OK)
        fail_msg("step %d: cph_sched_audit failed", step);
    }
  }
  assert_true(picks > STEPS / 5); /* the sequence exercised the order, not only the misses */
  cph_sched_free(s);
  cph_ref_free(r);
  return in_runs;
}

static int weight_classes_against_reference(int64_t pace, int64_t budget, uint32_t run_max) {
  return tenants_against_reference(pace, budget, run_max, 30, 90, 30000, false);
}

static void test_many_weight_classes_match_reference(void **state) {
  (void)state;
  /* a quarter second a step, 6,000 turns a minute: the exact order (runs of one) */
  assert_int_equal(weight_classes_against_reference(250000000, 6000, 0), 0);
  assert_int_equal(weight_classes_against_reference(250000000, 6000, 16), 0);
}

/* At machine rates (about 3,000 picks a second, over 3 s) the order hands out runs (lanes/sched.h):
 * every pick is still the reference's, which keeps a tenant for the run's length and sizes
 * runs by the same formula. */
static void test_tenant_runs_match_reference_at_machine_rates(void **state) {
  (void)state;
  int in_runs = weight_classes_against_reference(2000000, CPH_SCHED_MAX_PER_MINUTE, 16);
  print_message("picks while runs were longer than one: %d\n", in_runs);
  assert_true(in_runs > 1000);
  in_runs = weight_classes_against_reference(2000000, CPH_SCHED_MAX_PER_MINUTE, 3);
  assert_true(in_runs > 1000);
}

/* Groups of hundreds of sessions: three tenants over 900 sessions, so each tenant's group in
 * the interactive lane queues up to about 250 entries, and a tenant group's sets grow their
 * rings a few entries at a time (tight rings, lanes/sched.c) through dozens of sizes, with
 * the front anywhere in the ring when they grow. Every pick must be the reference's, and the
 * audit (which checks each ring's order and capacity) must pass after every step, each step
 * also asking why of one session (which promotes in every group of its lane). */
static void test_big_tenant_groups_match_reference(void **state) {
  (void)state;
  tenants_against_reference(2000000, CPH_SCHED_MAX_PER_MINUTE, 16, 3, 900, 20000, true);
  tenants_against_reference(250000000, 6000, 0, 3, 900, 20000, true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_applies_pick_rules_literally),
      cmocka_unit_test(test_many_weight_classes_match_reference),
      cmocka_unit_test(test_tenant_runs_match_reference_at_machine_rates),
      cmocka_unit_test(test_big_tenant_groups_match_reference),
      cmocka_unit_test(test_sched_matches_reference_on_random_sequences),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
