/* lanes/: the scheduling contract of DESIGN §3 and the fairness numbers of §12, each test
 * named by what it proves. Long runs use the simulator (lanes/sim.h) on a virtual clock, so
 * nothing here depends on the speed of the machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "lanes/pass.h"
#include "lanes/sched.h"
#include "lanes/sim.h"
#include "tests/support/prop.h"

#define S_NS CPH_NS_PER_S

/* The seed policy of DESIGN §8. */
static cph_sched_config seed_policy(void) {
  cph_sched_config c = {{60, 30, 10}, {120, 60, 20},   1.0, 30,  -30,  {2, 1, 1}, 4, 1,
                        {0},          CPH_CHARGE_TURN, 0,   {0}, NULL, 0, 0};
  return c;
}

typedef struct fixture {
  cph_clock clock;
  cph_sched *s;
} fixture;

static void fx_open(fixture *f, const cph_sched_config *cfg) {
  cph_clock_init_virtual(&f->clock, 1000 * S_NS);
  f->s = cph_sched_new(cfg, &f->clock);
  assert_non_null(f->s);
}

static cph_sid fx_add(fixture *f, const char *id, cph_lane lane, bool work) {
  cph_sid sid;
  assert_int_equal(cph_sched_add(f->s, id, lane, &sid), 0);
  if (work)
    cph_sched_set_work(f->s, sid, true);
  return sid;
}

static cph_sid fx_restore(fixture *f, const char *id, cph_lane lane, double credits) {
  cph_sid sid;
  assert_int_equal(cph_sched_restore(f->s, id, lane, credits, &sid), 0);
  cph_sched_set_work(f->s, sid, true);
  return sid;
}

/* Picks and returns the sid, or CPH_SID_NONE. */
static cph_sid fx_pick(fixture *f, cph_pick *out) {
  cph_pick p;
  if (!out)
    out = &p;
  return cph_sched_pick(f->s, out) == 0 ? out->sid : CPH_SID_NONE;
}

static void run_sim(cph_sim_config *c, cph_sim_result *r) {
  int rc = cph_sim_run(c, r);
  if (rc)
    fail_msg("cph_sim_run: %d", rc);
  assert_int_equal(r->double_starts, 0);
  assert_int_equal(r->over_concurrency, 0);
}

/* ================================================================ §3.1 lane budgets */

/* The most non-trickle picks of a lane in any closed window [t, t + w] with t >= from. */
static uint64_t most_in_window(const cph_sim_result *r, cph_lane lane, int64_t w, int64_t from) {
  int64_t *t = malloc((r->n_picks + 1) * sizeof *t);
  size_t n = 0;
  for (size_t i = 0; i < r->n_picks; i++)
    if (r->picks[i].lane == lane && !r->picks[i].trickle && r->picks[i].at_ns >= from)
      t[n++] = r->picks[i].at_ns;
  uint64_t most = 0;
  for (size_t i = 0, j = 0; i < n; i++) {
    if (j < i)
      j = i;
    while (j < n && t[j] - t[i] <= w)
      j++;
    if (j - i > most)
      most = j - i;
  }
  free(t);
  return most;
}

static void test_lane_never_starts_more_than_budget_over_any_window(void **state) {
  (void)state;
  /* Every lane saturated, short turns and ample concurrency, so the turn budgets are the only
   * limit. 7 a minute does not divide a second evenly. */
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 0.2, true, 0, 0, 6, false},
      {CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 0.2, true, 0, 1, 6, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_SATURATED, 0, 0.2, true, 0, 2, 6, false},
  };
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.turns_per_minute[CPH_LANE_MAINTENANCE] = 7;
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    c.sched.tool_calls_per_minute[l] = 1000000;
  c.sched.concurrency = 32;
  c.sched.trickle_per_minute = 0;
  c.sessions = ss;
  c.n_sessions = 3;
  c.duration_s = 3600;
  c.seed = 21;
  c.record_picks = true;
  cph_sim_result r;
  run_sim(&c, &r);

  static const double windows_s[] = {0, 1, 7.5, 30, 60, 300, 3600};
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    double turns = (double)c.sched.turns_per_minute[l];
    for (size_t k = 0; k < sizeof windows_s / sizeof *windows_s; k++) {
      double w = windows_s[k];
      uint64_t bound = (uint64_t)floor(turns * w / 60 + turns);
      uint64_t most = most_in_window(&r, (cph_lane)l, (int64_t)(w * 1e9), 0);
      if (most > bound)
        fail_msg("lane %d: %" PRIu64 " starts in a %.1f s window, bound %" PRIu64, l, most, w,
                 bound);
    }
    /* Not vacuous: saturated, the lane used its whole budget (burst plus refill). */
    assert_true(r.lanes[l].turns >= (uint64_t)(turns * 60));
    assert_true(r.lanes[l].turns <= (uint64_t)(turns * 61));
  }
  cph_sim_result_free(&r);
}

typedef struct tool_watch {
  double least_tool_calls_left[CPH_LANE_COUNT];
} tool_watch;

static void watch_tools(void *ctx, cph_sched *s, int64_t now, const cph_sid *sids, size_t n) {
  (void)now, (void)sids, (void)n;
  tool_watch *w = ctx;
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    cph_lane_stats st;
    cph_sched_lane_stats(s, (cph_lane)l, &st);
    if (st.tool_calls_left < w->least_tool_calls_left[l])
      w->least_tool_calls_left[l] = st.tool_calls_left;
  }
}

/* Tool calls are charged at completion, so the bucket may go negative — but only by what the
 * turns already running when it reached 0 report. The bound asserted, for a run of T minutes
 * with concurrency C and k tool calls per turn:
 *     used <= budget × (1 + T) + C × k
 * (a full bucket at the start, the refill, and one completion's overshoot per running turn),
 * and at every pass the bucket holds at least -C × k. */
static void test_lane_uses_no_more_tool_calls_than_budget_over_long_run(void **state) {
  (void)state;
  enum { K = 5, C = 8, BUDGET = 60 };
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 2.0, true, K, 0, 12, false},
      {CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 2.0, true, K, 1, 12, false},
  };
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.turns_per_minute[0] = c.sched.turns_per_minute[1] = 100000;
  c.sched.tool_calls_per_minute[0] = c.sched.tool_calls_per_minute[1] = BUDGET;
  c.sched.concurrency = C;
  c.sessions = ss;
  c.n_sessions = 2;
  c.duration_s = 3600;
  c.seed = 22;
  tool_watch w = {{0, 0, 0}};
  c.observe = watch_tools;
  c.observe_ctx = &w;
  cph_sim_result r;
  run_sim(&c, &r);
  double minutes = c.duration_s / 60;
  for (int l = 0; l < 2; l++) {
    uint64_t bound = (uint64_t)(BUDGET * (1 + minutes)) + C * K;
    if (r.lanes[l].tool_calls > bound)
      fail_msg("lane %d used %" PRIu64 " tool calls, bound %" PRIu64, l, r.lanes[l].tool_calls,
               bound);
    /* Not vacuous: the tool-calls budget is what limited the lane. */
    assert_true(r.lanes[l].tool_calls >= (uint64_t)(BUDGET * minutes));
    assert_true(w.least_tool_calls_left[l] >= -(double)(C * K));
    assert_true(w.least_tool_calls_left[l] < 0); /* the overshoot did happen */
  }
  cph_sim_result_free(&r);
}

static void test_interactive_out_of_budget_lets_operational_run(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.turns_per_minute[CPH_LANE_INTERACTIVE] = 2;
  cfg.concurrency = 10;
  fx_open(&f, &cfg);
  cph_sid i1 = fx_add(&f, "i1", CPH_LANE_INTERACTIVE, true);
  cph_sid i2 = fx_add(&f, "i2", CPH_LANE_INTERACTIVE, true);
  cph_sid i3 = fx_add(&f, "i3", CPH_LANE_INTERACTIVE, true);
  cph_sid o1 = fx_add(&f, "o1", CPH_LANE_OPERATIONAL, true);
  assert_int_equal(fx_pick(&f, NULL), i1);
  assert_int_equal(fx_pick(&f, NULL), i2);
  /* Interactive has a runnable session but no turn token: operational goes. */
  assert_int_equal(fx_pick(&f, NULL), o1);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  /* 2 a minute: one token 30 s later, to the nanosecond. */
  cph_clock_advance(&f.clock, 30 * S_NS - 1);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_clock_advance(&f.clock, 1);
  assert_int_equal(fx_pick(&f, NULL), i3);
  cph_sched_free(f.s);
}

static void test_lane_without_tool_call_budget_is_blocked_despite_turn_tokens(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.tool_calls_per_minute[CPH_LANE_INTERACTIVE] = 10;
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_INTERACTIVE, true);
  cph_sid b = fx_add(&f, "b", CPH_LANE_INTERACTIVE, true);
  assert_int_equal(fx_pick(&f, NULL), a);
  cph_sched_finish(f.s, a, 10, true); /* the bucket is exactly 0: not "above 0" */
  cph_lane_stats st;
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_true(st.turns_left >= 1);
  assert_true(st.tool_calls_left == 0);
  assert_false(st.has_budget);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_why why;
  cph_sched_why(f.s, b, &why);
  assert_int_equal(why.reason, CPH_WHY_LANE_NO_BUDGET);
  /* 10 a minute refill 10 units a nanosecond: above 0 one nanosecond later. */
  assert_int_equal(why.until_ns, cph_clock_now(&f.clock) + 1);
  cph_clock_advance(&f.clock, 1);
  assert_int_equal(fx_pick(&f, NULL), b);
  /* Negative after a completion (the overshoot): blocked until it climbs back above 0. */
  cph_sched_finish(f.s, b, 3, true);
  cph_sid c = fx_add(&f, "c", CPH_LANE_INTERACTIVE, true);
  cph_sched_why(f.s, c, &why);
  assert_int_equal(why.reason, CPH_WHY_LANE_NO_BUDGET);
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_true(st.tool_calls_left < -2.99 && st.tool_calls_left > -3);
  int64_t now = cph_clock_now(&f.clock);
  cph_clock_advance(&f.clock, why.until_ns - now - 1);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_clock_advance(&f.clock, 1);
  assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_sched_free(f.s);
}

/* ================================================================ §3.2 credits */

static void test_new_session_starts_at_max(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_OPERATIONAL, false);
  assert_true(cph_sched_credits(f.s, a) == 30.0);
  /* Restored sessions keep their credits, clamped into [min, max]. */
  cph_sid b = fx_restore(&f, "b", CPH_LANE_OPERATIONAL, 12.5);
  cph_sid c = fx_restore(&f, "c", CPH_LANE_OPERATIONAL, 99);
  cph_sid d = fx_restore(&f, "d", CPH_LANE_OPERATIONAL, -99);
  assert_true(cph_sched_credits(f.s, b) == 12.5);
  assert_true(cph_sched_credits(f.s, c) == 30.0);
  assert_true(cph_sched_credits(f.s, d) == -30.0);
  cph_sched_free(f.s);
}

static void test_cost_is_charged_at_completion_not_at_start(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_INTERACTIVE, true);
  assert_int_equal(fx_pick(&f, NULL), a);
  assert_true(cph_sched_credits(f.s, a) == 30.0); /* running: nothing charged yet */
  cph_sched_finish(f.s, a, 0, true);
  assert_true(cph_sched_credits(f.s, a) == 28.0); /* cost[interactive] = 2 */
  assert_int_equal(fx_pick(&f, NULL), a);
  cph_sched_finish(f.s, a, 0, false); /* a completion that does not charge */
  assert_true(cph_sched_credits(f.s, a) == 28.0);
  cph_sched_free(f.s);
}

static void test_credits_refill_at_rate_and_cap_at_max(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.refill_per_second = 0.5;
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_INTERACTIVE, true);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(fx_pick(&f, NULL), a);
    cph_sched_finish(f.s, a, 0, true);
  }
  assert_true(cph_sched_credits(f.s, a) == 24.0);
  cph_clock_advance(&f.clock, 3 * S_NS);
  assert_true(cph_sched_credits(f.s, a) == 25.5);
  cph_clock_advance(&f.clock, 9 * S_NS - 1); /* one nanosecond short of max */
  assert_true(cph_sched_credits(f.s, a) < 30.0);
  cph_clock_advance(&f.clock, 1);
  assert_true(cph_sched_credits(f.s, a) == 30.0);
  cph_clock_advance(&f.clock, 3600 * S_NS);
  assert_true(cph_sched_credits(f.s, a) == 30.0);
  cph_sched_free(f.s);
}

static void test_credits_floor_at_min(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.cost[CPH_LANE_INTERACTIVE] = 25;
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_INTERACTIVE, true);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(fx_pick(&f, NULL), a);
    cph_sched_finish(f.s, a, 0, true);
  }
  assert_true(cph_sched_credits(f.s, a) == -30.0);
  cph_sched_free(f.s);
}

typedef struct invariants {
  double credit_min, credit_max;
  double lowest, highest;
  uint32_t most_running;
  uint32_t concurrency;
  uint64_t passes;
} invariants;

static void watch_invariants(void *ctx, cph_sched *s, int64_t now, const cph_sid *sids, size_t n) {
  (void)now;
  invariants *v = ctx;
  v->passes++;
  for (size_t i = 0; i < n; i++) {
    double c = cph_sched_credits(s, sids[i]);
    v->lowest = c < v->lowest ? c : v->lowest;
    v->highest = c > v->highest ? c : v->highest;
  }
  uint32_t running = cph_sched_running(s);
  v->most_running = running > v->most_running ? running : v->most_running;
}

/* A busy mixed run: bursty and saturated sessions in every lane, tool calls, expensive
 * turns, the janitor's trickle; the invariants are checked after every pass. */
static void mixed_run(invariants *v, cph_sim_result *r) {
  static const cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, 0.3, 1.0, true, 2, 0, 10, false},
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 0.5, true, 1, 1, 3, false},
      {CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 2.0, true, 3, 2, 5, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_SATURATED, 0, 1.0, true, 0, 3, 3, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 4, 1, true},
  };
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.cost[CPH_LANE_INTERACTIVE] = 7;
  c.sched.credit_min = -20;
  c.sched.concurrency = 5;
  c.sched.trickle_per_minute = 6;
  c.sessions = ss;
  c.n_sessions = sizeof ss / sizeof *ss;
  c.duration_s = 1200;
  c.seed = 23;
  *v = (invariants){-20, 30, 1e9, -1e9, 0, 5, 0};
  c.observe = watch_invariants;
  c.observe_ctx = v;
  run_sim(&c, r);
}

static void test_credits_stay_within_bounds(void **state) {
  (void)state;
  invariants v;
  cph_sim_result r;
  mixed_run(&v, &r);
  assert_true(v.passes > 1000);
  assert_true(v.lowest >= v.credit_min);
  assert_true(v.highest <= v.credit_max);
  assert_true(v.lowest == v.credit_min); /* the floor was reached and held */
  cph_sim_result_free(&r);
}

/* ================================================================ §3.3, §3.4 */

static void test_concurrency_is_never_exceeded(void **state) {
  (void)state;
  invariants v;
  cph_sim_result r;
  mixed_run(&v, &r);
  assert_true(v.most_running <= v.concurrency);
  assert_int_equal(r.max_running, v.concurrency); /* reached: the limit is what held it */
  assert_int_equal(r.over_concurrency, 0);
  cph_sim_result_free(&r);
}

static void test_session_never_has_two_turns_running(void **state) {
  (void)state;
  invariants v;
  cph_sim_result r;
  mixed_run(&v, &r);
  assert_int_equal(r.double_starts, 0);
  cph_sim_result_free(&r);

  /* And directly: a running session with more work is not picked again until it finishes. */
  fixture f;
  cph_sched_config cfg = seed_policy();
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_INTERACTIVE, true);
  assert_int_equal(fx_pick(&f, NULL), a);
  cph_sched_set_work(f.s, a, true);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_why why;
  cph_sched_why(f.s, a, &why);
  assert_int_equal(why.reason, CPH_WHY_RUNNING);
  cph_sched_finish(f.s, a, 0, true);
  assert_int_equal(fx_pick(&f, NULL), a);
  cph_sched_free(f.s);
}

/* cph_sched_reassign moves a session in place: a running one stays running (one slot held,
 * counted in its new lane, freed by its finish), a queued one keeps its place in the wait
 * order and takes its new credits. (Re-registering a running session instead left the old
 * registration running for good: a slot lost per state import taken during a turn.) */
static void test_reassign_keeps_a_running_turn_and_a_queued_place(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.concurrency = 2;
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_INTERACTIVE, true);
  assert_int_equal(fx_pick(&f, NULL), a);
  cph_sched_set_work(f.s, a, true);
  assert_int_equal(cph_sched_reassign(f.s, a, CPH_LANE_OPERATIONAL, -10), CPH_OK);
  assert_true(cph_sched_is_running(f.s, a));
  assert_int_equal(cph_sched_running(f.s), 1);
  cph_lane_stats in, op;
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &in);
  cph_sched_lane_stats(f.s, CPH_LANE_OPERATIONAL, &op);
  assert_int_equal(in.running, 0);
  assert_int_equal(op.running, 1);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE); /* not picked twice */
  assert_int_equal(cph_sched_lane(f.s, a), CPH_LANE_OPERATIONAL);
  assert_true(fabs(cph_sched_credits(f.s, a) - -10) < 1e-9);
  cph_sched_finish(f.s, a, 0, false);
  assert_int_equal(cph_sched_running(f.s), 0);
  cph_sched_lane_stats(f.s, CPH_LANE_OPERATIONAL, &op);
  assert_int_equal(op.running, 0);
  assert_int_equal(op.runnable, 1); /* its work queues it again, in the new lane */

  /* Queued: b, c and d wait at the same credits, b longest. Reassigned to the same lane and
   * credits, b keeps its place (first); c given fewer credits goes after d. */
  cph_sched_config cfg2 = seed_policy();
  cfg2.concurrency = 10;
  fixture g;
  fx_open(&g, &cfg2);
  cph_sid b = fx_restore(&g, "b", CPH_LANE_OPERATIONAL, 5);
  cph_clock_advance(&g.clock, 1);
  cph_sid c = fx_restore(&g, "c", CPH_LANE_OPERATIONAL, 5);
  cph_sid d = fx_restore(&g, "d", CPH_LANE_OPERATIONAL, 5);
  assert_int_equal(cph_sched_reassign(g.s, b, CPH_LANE_OPERATIONAL, 5), CPH_OK);
  assert_int_equal(cph_sched_reassign(g.s, c, CPH_LANE_OPERATIONAL, -10), CPH_OK);
  assert_int_equal(cph_sched_reassign(g.s, c, CPH_LANE_OPERATIONAL, NAN), CPH_EINVAL);
  assert_int_equal(fx_pick(&g, NULL), b);
  assert_int_equal(fx_pick(&g, NULL), d);
  assert_int_equal(fx_pick(&g, NULL), c);
  assert_int_equal(cph_sched_reassign(g.s, c, CPH_LANE_OPERATIONAL, 1e9), CPH_OK);
  assert_true(fabs(cph_sched_credits(g.s, c) - cfg2.credit_max) < 1e-9); /* clamped */
  cph_sched_free(f.s);
  cph_sched_free(g.s);
}

static void test_pick_order_credits_then_wait_then_id(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.concurrency = 10;
  fx_open(&f, &cfg);
  cph_sid low = fx_restore(&f, "a-low", CPH_LANE_OPERATIONAL, 5);
  cph_sid s2 = fx_add(&f, "s2", CPH_LANE_OPERATIONAL, true);
  cph_sid s10 = fx_add(&f, "s10", CPH_LANE_OPERATIONAL, true);
  cph_clock_advance(&f.clock, 1);
  cph_sid late = fx_add(&f, "s0", CPH_LANE_OPERATIONAL, true);
  cph_sid inter = fx_restore(&f, "z", CPH_LANE_INTERACTIVE, -30);
  assert_int_equal(fx_pick(&f, NULL), inter); /* the lane first, whatever its credits */
  assert_int_equal(fx_pick(&f, NULL), s10);   /* max credits, oldest, "s10" < "s2" */
  assert_int_equal(fx_pick(&f, NULL), s2);
  assert_int_equal(fx_pick(&f, NULL), late); /* max credits but queued later */
  assert_int_equal(fx_pick(&f, NULL), low);  /* oldest of all, fewest credits */
  cph_sched_free(f.s);
}

/* ================================================================ §12 fairness */

static void test_equal_saturated_sessions_share_turns_fairly(void **state) {
  (void)state;
  /* 16 equal saturated interactive sessions under the seed policy: the lane budget (60 a
   * minute) binds, so credits decide who gets each token. */
  cph_sim_session ss[] = {{CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, true, 1, 0, 16, false}};
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 3600;
  c.warmup_s = 60;
  c.seed = 24;
  cph_sim_result r;
  run_sim(&c, &r);
  if (r.jain[0] < 0.99) {
    cph_sim_print(&r, stderr);
    fail_msg("Jain's index %.4f < 0.99", r.jain[0]);
  }
  assert_true(r.lanes[0].turns > 3000);
  cph_sim_result_free(&r);
}

/* DESIGN §12: one session receiving 100× the traffic of the quiet ones does not push their
 * p99 pick wait past twice what it is without the spam. Regime: 3 workers, quiet load high
 * enough that waiting happens without spam too (so the ratio means something); the lane
 * budget does not bind (see the report: with a binding lane budget the spammer drains it). */
static void spam_run(double spam_factor, cph_sim_result *r) {
  const double rate = 0.25;
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, rate, 1.0, true, 1, 0, 8, false},
      {CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, rate * spam_factor, 1.0, true, 1, 1, 1, false},
  };
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.turns_per_minute[CPH_LANE_INTERACTIVE] = 600;
  c.sched.tool_calls_per_minute[CPH_LANE_INTERACTIVE] = 100000;
  c.sched.concurrency = 3;
  c.sessions = ss;
  c.n_sessions = 2;
  c.duration_s = 7200;
  c.warmup_s = 120;
  c.seed = 7;
  run_sim(&c, r);
}

static void test_spamming_session_does_not_delay_quiet_sessions(void **state) {
  (void)state;
  cph_sim_result base, spam;
  spam_run(1, &base);
  spam_run(100, &spam);
  int64_t p99_base = base.groups[0].wait_p99_ns, p99_spam = spam.groups[0].wait_p99_ns;
  if (!(p99_base > 0) || p99_spam > 2 * p99_base) {
    cph_sim_print(&base, stderr);
    cph_sim_print(&spam, stderr);
    fail_msg("quiet p99 wait %.3f s with spam, %.3f s without", p99_spam / 1e9, p99_base / 1e9);
  }
  /* The spammer really was busy: it got over three times the turns it got without spam
   * (it holds one slot whenever no quiet session is waiting). */
  assert_true(spam.groups[1].turns > 3 * base.groups[1].turns);
  cph_sim_result_free(&base);
  cph_sim_result_free(&spam);
}

/* ================================================================ §3.5 trickle */

static void trickle_run(uint32_t per_minute, cph_sim_result *r) {
  /* Every lane saturated (interactive and operational with budgets that do not bind, so all
   * slots stay busy), the maintenance budget spent (none at all), the janitor holding outbox
   * batches throughout. */
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 2.0, true, 1, 0, 8, false},
      {CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 2.0, true, 1, 1, 8, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_SATURATED, 0, 2.0, true, 1, 2, 4, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 3, 1, true},
  };
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.turns_per_minute[0] = c.sched.turns_per_minute[1] = 100000;
  c.sched.tool_calls_per_minute[0] = c.sched.tool_calls_per_minute[1] = 1000000;
  c.sched.turns_per_minute[CPH_LANE_MAINTENANCE] = 0;
  c.sched.trickle_per_minute = per_minute;
  c.sessions = ss;
  c.n_sessions = 4;
  c.duration_s = 1800;
  c.warmup_s = 60;
  c.seed = 25;
  run_sim(&c, r);
}

static void test_trickle_holds_under_full_saturation_with_maintenance_budget_spent(void **state) {
  (void)state;
  static const uint32_t rates[] = {1, 6};
  for (size_t k = 0; k < 2; k++) {
    cph_sim_result r;
    trickle_run(rates[k], &r);
    if (r.outbox_min_per_minute < rates[k]) {
      cph_sim_print(&r, stderr);
      fail_msg("%" PRIu64 " outbox batches in some minute, guaranteed %u", r.outbox_min_per_minute,
               rates[k]);
    }
    /* Saturated: every slot was busy, interactive took what it could... */
    assert_int_equal(r.max_running, 4);
    assert_true(r.lanes[CPH_LANE_INTERACTIVE].share > 0.8);
    /* ...and the maintenance lane had no budget: every batch came from the trickle. */
    assert_int_equal(r.trickle_picks, r.outbox_batches);
    cph_sim_result_free(&r);
  }
}

/* ================================================================ reload */

/* The seed policy with tool calls and concurrency out of the way, and 200 interactive
 * sessions always ready: what starts is the turns bucket's to say. */
static cph_sched_config saturated_interactive(fixture *f) {
  cph_sched_config cfg = seed_policy();
  cfg.tool_calls_per_minute[CPH_LANE_INTERACTIVE] = 1000000;
  cfg.concurrency = 1000;
  fx_open(f, &cfg);
  char id[16];
  for (int i = 0; i < 200; i++) {
    snprintf(id, sizeof id, "s%03d", i);
    fx_add(f, id, CPH_LANE_INTERACTIVE, true);
  }
  return cfg;
}

static void test_reload_keeps_fill_ratio_and_next_picks_obey_new_budget(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = saturated_interactive(&f);
  for (int i = 0; i < 30; i++)
    assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_lane_stats st;
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_true(st.turns_left == 30.0); /* half of 60 */

  cph_sched_config next = cfg;
  next.turns_per_minute[CPH_LANE_INTERACTIVE] = 120;
  assert_int_equal(cph_sched_configure(f.s, &next), 0);
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_true(st.turns_left == 60.0); /* still half */
  for (int i = 0; i < 60; i++)
    assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  /* 120 a minute: the next token in exactly 0.5 s. */
  cph_clock_advance(&f.clock, S_NS / 2 - 1);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_clock_advance(&f.clock, 1);
  assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);

  /* Down to 6 a minute: the (now empty) bucket stays empty, one token per 10 s. */
  next.turns_per_minute[CPH_LANE_INTERACTIVE] = 6;
  assert_int_equal(cph_sched_configure(f.s, &next), 0);
  cph_clock_advance(&f.clock, 10 * S_NS - 1);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_clock_advance(&f.clock, 1);
  assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_sched_free(f.s);
}

/* Cluster shares (cph_sched_set_budgets): a shrinking budget cuts the bucket to its new
 * capacity; a growing one keeps the level and fills at the new rate — no tokens appear. */
static void test_budget_share_never_adds_tokens(void **state) {
  (void)state;
  fixture f;
  saturated_interactive(&f);
  int64_t turns[CPH_LANE_COUNT] = {30, 30, 10}, tools[CPH_LANE_COUNT] = {1000000, 60, 20},
          tokens[CPH_LANE_COUNT] = {0, 0, 0};
  assert_int_equal(cph_sched_set_budgets(f.s, turns, tools, tokens), 0); /* 60 -> 30: cut */
  for (int i = 0; i < 30; i++)
    assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  turns[CPH_LANE_INTERACTIVE] = 120; /* grows: the empty bucket stays empty */
  assert_int_equal(cph_sched_set_budgets(f.s, turns, tools, tokens), 0);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_lane_stats st;
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_true(st.budget_turns == 120);
  cph_clock_advance(&f.clock, S_NS / 2); /* 120 a minute: one token in 0.5 s */
  assert_int_not_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  turns[CPH_LANE_INTERACTIVE] = CPH_SCHED_MAX_PER_MINUTE + 1; /* out of range: nothing moves */
  assert_int_equal(cph_sched_set_budgets(f.s, turns, tools, tokens), CPH_EINVAL);
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_true(st.budget_turns == 120);
  cph_sched_free(f.s);
}

/* DESIGN §14 "Budgets", as a property: NODES schedulers share one lane budget, rebalanced
 * every second to random shares that sum to at most 1 (rounded down, as the engine does),
 * each starting turns as fast as its bucket allows. Over any window of W seconds the
 * cluster starts at most budget × W/60 + budget turns (§3 rule 1), from the first second
 * (each node starts from share 0, as a node in a cluster does). */
static void test_cluster_shares_keep_the_lane_bound_property(void **state) {
  (void)state;
  enum { NODES = 3, SECONDS = 150, BUDGET = 60 };
  uint64_t seed;
  long cases;
  cph_property_run(4401, 200, &seed, &cases);
  for (long k = 0; k < cases; k++) {
    rng r = {seed + (uint64_t)k};
    cph_clock clock;
    cph_clock_init_virtual(&clock, 1000 * S_NS);
    cph_sched_config cfg = seed_policy();
    cfg.turns_per_minute[CPH_LANE_INTERACTIVE] = BUDGET;
    cfg.tool_calls_per_minute[CPH_LANE_INTERACTIVE] = 1000000;
    cfg.concurrency = 100000;
    cph_sched *node[NODES];
    int64_t *starts = malloc(SECONDS * BUDGET * 4 * sizeof *starts);
    size_t n_starts = 0;
    int64_t zero[CPH_LANE_COUNT] = {0}, tools[CPH_LANE_COUNT] = {1000000, 0, 0};
    for (int i = 0; i < NODES; i++) {
      node[i] = cph_sched_new(&cfg, &clock);
      cph_sched_set_budgets(node[i], zero, tools, zero);
      char id[32];
      for (int j = 0; j < 50; j++) {
        cph_sid sid;
        snprintf(id, sizeof id, "n%d-s%02d", i, j);
        assert_int_equal(cph_sched_add(node[i], id, CPH_LANE_INTERACTIVE, &sid), 0);
        cph_sched_set_work(node[i], sid, true);
      }
    }
    for (int sec = 0; sec < SECONDS; sec++) {
      /* random shares summing to at most 1 (sometimes less: a node missed a round) */
      uint32_t w[NODES], sum = 0;
      for (int i = 0; i < NODES; i++)
        sum += w[i] = below(&r, 10);
      for (int i = 0; i < NODES; i++) {
        double share = sum ? (double)w[i] / sum : 1.0 / NODES;
        int64_t turns[CPH_LANE_COUNT] = {(int64_t)(BUDGET * share), 0, 0};
        assert_int_equal(cph_sched_set_budgets(node[i], turns, tools, zero), 0);
      }
      for (int step = 0; step < 10; step++) { /* the second, in tenths */
        for (int i = 0; i < NODES; i++) {
          cph_pick p;
          while (cph_sched_pick(node[i], &p) == 0) {
            starts[n_starts++] = cph_clock_now(&clock);
            cph_sched_finish(node[i], p.sid, 0, false); /* ready again at once */
          }
        }
        cph_clock_advance(&clock, S_NS / 10);
      }
    }
    for (int64_t w = 1; w <= 60; w = w < 10 ? w + 1 : w + 10) {
      uint64_t most = 0;
      for (size_t i = 0, j = 0; i < n_starts; i++) {
        while (j < n_starts && starts[j] - starts[i] < w * S_NS)
          j++;
        if (j - i > most)
          most = j - i;
      }
      double bound = BUDGET * (double)w / 60.0 + BUDGET;
      if ((double)most > bound)
        fail_msg("seed %llu: %llu turns started in a %lld s window, bound %.1f",
                 (unsigned long long)(seed + (uint64_t)k), (unsigned long long)most, (long long)w,
                 bound);
    }
    assert_true(n_starts > BUDGET * (SECONDS / 60) / 2); /* and the budget is used */
    for (int i = 0; i < NODES; i++)
      cph_sched_free(node[i]);
    free(starts);
  }
}

static void test_reload_carries_credits_clamped_into_new_bounds(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  fx_open(&f, &cfg);
  cph_sid hi = fx_restore(&f, "hi", CPH_LANE_OPERATIONAL, 30);
  cph_sid mid = fx_restore(&f, "mid", CPH_LANE_OPERATIONAL, 4);
  cph_sid lo = fx_restore(&f, "lo", CPH_LANE_OPERATIONAL, -25);
  cph_clock_advance(&f.clock, 2 * S_NS); /* mid 6, lo -23 under the old rate */
  cph_sched_config next = cfg;
  next.credit_max = 10;
  next.credit_min = -5;
  next.refill_per_second = 0.25;
  assert_int_equal(cph_sched_configure(f.s, &next), 0);
  assert_true(cph_sched_credits(f.s, hi) == 10.0);
  assert_true(cph_sched_credits(f.s, mid) == 6.0);
  assert_true(cph_sched_credits(f.s, lo) == -5.0);
  cph_clock_advance(&f.clock, 4 * S_NS); /* the new rate from here */
  assert_true(cph_sched_credits(f.s, mid) == 7.0);
  assert_true(cph_sched_credits(f.s, lo) == -4.0);
  /* The pick order follows the carried credits. */
  assert_int_equal(fx_pick(&f, NULL), hi);
  assert_int_equal(fx_pick(&f, NULL), mid);
  assert_int_equal(fx_pick(&f, NULL), lo);
  cph_sched_free(f.s);
}

static void test_reload_mid_run_new_budget_governs_later_windows(void **state) {
  (void)state;
  cph_sim_session ss[] = {{CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 0.5, true, 0, 0, 8, false}};
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.tool_calls_per_minute[0] = 1000000;
  c.sched.concurrency = 16;
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 1800;
  c.seed = 26;
  c.record_picks = true;
  c.reload = true;
  c.reload_at_s = 900;
  c.reload_cfg = c.sched;
  c.reload_cfg.turns_per_minute[0] = 6;
  cph_sim_result r;
  run_sim(&c, &r);
  int64_t at = 900 * S_NS;
  uint64_t before = 0, after = 0;
  for (size_t i = 0; i < r.n_picks; i++)
    if (r.picks[i].at_ns < at)
      before++;
    else
      after++;
  assert_in_range(before, 60 * 15, 60 * 16);
  /* The bucket was near empty at the reload and stays so (ratio kept): no burst of 6. */
  assert_in_range(after, 6 * 15 - 1, 6 * 15 + 1);
  static const double windows_s[] = {1, 10, 60, 600};
  for (size_t k = 0; k < 4; k++) {
    double w = windows_s[k];
    assert_true(most_in_window(&r, CPH_LANE_INTERACTIVE, (int64_t)(w * 1e9), at) <=
                (uint64_t)floor(6 * w / 60 + 6));
  }
  cph_sim_result_free(&r);
}

/* ================================================================ §3.7 why */

static void test_why_names_each_reason(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.turns_per_minute[CPH_LANE_INTERACTIVE] = 2;
  cfg.concurrency = 3;
  fx_open(&f, &cfg);
  cph_why w;

  cph_sid idle = fx_add(&f, "idle", CPH_LANE_INTERACTIVE, false);
  cph_sched_why(f.s, idle, &w);
  assert_int_equal(w.reason, CPH_WHY_NO_INPUT);
  assert_string_equal(cph_why_reason_name(w.reason), "no_input");

  cph_sid held = fx_add(&f, "held", CPH_LANE_INTERACTIVE, true);
  cph_sched_set_paused(f.s, held, true);
  cph_sched_why(f.s, held, &w);
  assert_int_equal(w.reason, CPH_WHY_PAUSED);
  assert_string_equal(cph_why_reason_name(w.reason), "paused");

  cph_sid run1 = fx_add(&f, "run1", CPH_LANE_INTERACTIVE, true);
  assert_int_equal(fx_pick(&f, NULL), run1);
  cph_sched_why(f.s, run1, &w);
  assert_int_equal(w.reason, CPH_WHY_RUNNING);
  assert_string_equal(cph_why_reason_name(w.reason), "running");

  cph_sid run2 = fx_add(&f, "run2", CPH_LANE_INTERACTIVE, true);
  assert_int_equal(fx_pick(&f, NULL), run2); /* the interactive bucket is now empty */
  cph_sid waits = fx_add(&f, "waits", CPH_LANE_INTERACTIVE, true);
  cph_clock_advance(&f.clock, 5 * S_NS);
  cph_sched_why(f.s, waits, &w);
  assert_int_equal(w.reason, CPH_WHY_LANE_NO_BUDGET);
  assert_string_equal(cph_why_reason_name(w.reason), "lane_out_of_budget");
  assert_int_equal(w.waiting_ns, 5 * S_NS);
  /* 2 a minute, empty 5 s ago: one token 30 s after it emptied. */
  assert_int_equal(w.until_ns, cph_clock_now(&f.clock) + 25 * S_NS);

  /* Three operational sessions with different credits rank by them. */
  cph_sid o10 = fx_restore(&f, "o10", CPH_LANE_OPERATIONAL, 10);
  cph_sid o20 = fx_restore(&f, "o20", CPH_LANE_OPERATIONAL, 20);
  cph_sid o30 = fx_restore(&f, "o30", CPH_LANE_OPERATIONAL, 30);
  cph_sched_why(f.s, o30, &w);
  assert_int_equal(w.reason, CPH_WHY_RUNNABLE);
  assert_string_equal(cph_why_reason_name(w.reason), "runnable");
  assert_int_equal(w.rank, 1);
  assert_int_equal(w.lane_runnable, 3);
  assert_int_equal(w.ahead_in_higher_lanes, 0); /* "waits" is in a lane without budget */
  assert_true(w.credits == 30.0);
  cph_sched_why(f.s, o20, &w);
  assert_int_equal(w.rank, 2);
  assert_true(w.credits == 20.0);
  cph_sched_why(f.s, o10, &w);
  assert_int_equal(w.rank, 3);

  assert_int_equal(fx_pick(&f, NULL), o30); /* the third slot */
  cph_sched_why(f.s, o20, &w);
  assert_int_equal(w.reason, CPH_WHY_CONCURRENCY_FULL);
  assert_string_equal(cph_why_reason_name(w.reason), "concurrency_full");

  /* A slot frees and the interactive lane refills: "waits" goes first, ahead of o20. */
  cph_sched_finish(f.s, run1, 0, true);
  cph_clock_advance(&f.clock, 25 * S_NS);
  cph_sched_why(f.s, waits, &w);
  assert_int_equal(w.reason, CPH_WHY_RUNNABLE);
  assert_int_equal(w.rank, 1);
  cph_sched_why(f.s, o20, &w);
  assert_int_equal(w.reason, CPH_WHY_RUNNABLE);
  assert_int_equal(w.ahead_in_higher_lanes, 2); /* "waits" and "run1" (it has work again) */
  assert_int_equal(w.waiting_ns, 25 * S_NS);
  cph_sched_free(f.s);
}

/* ================================================================ §3.6 the pass */

typedef struct pass_probe {
  cph_sched *s;
  cph_sid inbox_sid;
  int pending; /* messages waiting to be staged for inbox_sid */
  cph_pass_job order[16];
  int n_jobs;
  cph_sid started[8];
  int n_started;
} pass_probe;

static uint32_t probe_workers(void *ctx) {
  (void)ctx;
  return 4;
}

static void probe_start(void *ctx, const cph_pick *p) {
  pass_probe *pp = ctx;
  pp->started[pp->n_started++] = p->sid;
}

static uint64_t probe_poll(void *ctx) {
  pass_probe *pp = ctx;
  if (!pp->pending)
    return 0;
  uint64_t n = (uint64_t)pp->pending;
  pp->pending = 0;
  cph_sched_set_work(pp->s, pp->inbox_sid, true);
  return n;
}

static void probe_trace(void *ctx, cph_pass_job job) {
  pass_probe *pp = ctx;
  pp->order[pp->n_jobs++] = job;
}

static void test_pass_runs_its_five_jobs_in_fixed_order(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  fx_open(&f, &cfg);
  pass_probe pp = {.s = f.s};
  pp.inbox_sid = fx_add(&f, "a", CPH_LANE_INTERACTIVE, false);
  cph_pass_hooks h = {.ctx = &pp,
                      .workers_waiting = probe_workers,
                      .start_turn = probe_start,
                      .poll_inbox = probe_poll,
                      .trace = probe_trace};
  cph_pass_result res;
  cph_sched_pass(f.s, &h, &res);
  assert_int_equal(pp.n_jobs, CPH_PASS_JOB_COUNT);
  static const char *const names[] = {"agent_turn", "poll_inbox", "check_credits", "top_up_credits",
                                      "reconcile"};
  for (int i = 0; i < CPH_PASS_JOB_COUNT; i++) {
    assert_int_equal(pp.order[i], (cph_pass_job)i);
    assert_string_equal(cph_pass_job_name(pp.order[i]), names[i]);
  }
  cph_sched_free(f.s);
}

static void test_message_staged_by_poll_inbox_is_picked_only_in_next_pass(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  fx_open(&f, &cfg);
  pass_probe pp = {.s = f.s};
  pp.inbox_sid = fx_add(&f, "a", CPH_LANE_INTERACTIVE, false);
  cph_pass_hooks h = {.ctx = &pp,
                      .workers_waiting = probe_workers,
                      .start_turn = probe_start,
                      .poll_inbox = probe_poll,
                      .trace = probe_trace};
  cph_pass_result res;

  pp.pending = 1; /* pending when the pass starts */
  cph_sched_pass(f.s, &h, &res);
  assert_int_equal(res.staged, 1);  /* staged by this pass... */
  assert_int_equal(res.started, 0); /* ...after agent_turn ran: not seen by it */
  assert_int_equal(pp.n_started, 0);

  cph_sched_pass(f.s, &h, &res); /* the engine runs the next pass at once */
  assert_int_equal(res.started, 1);
  assert_int_equal(pp.started[0], pp.inbox_sid);
  assert_int_equal(res.staged, 0);
  cph_sched_free(f.s);
}

/* ---------------------------------------------------------------- rules 8-11 */

/* §3.8: under :charge :tokens a session whose turns burn 50k tokens yields to one whose turns
 * burn 500 — here, with equal turn lengths, the cheap one gets most of the turns; under
 * :charge :turn they share alike. */
static void test_charge_by_tokens_lets_cheap_sessions_ahead(void **state) {
  (void)state;
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 0.5, false, 0, 0, 1, false},
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 0.5, false, 0, 1, 1, false},
  };
  const uint64_t tokens[] = {50000, 500};
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.turns_per_minute[0] = c.sched.tool_calls_per_minute[0] = 100000;
  c.sched.concurrency = 1;
  c.sched.trickle_per_minute = 0;
  c.sched.refill_per_second = 0.5;
  c.sched.credit_min = -1000000; /* no floor to flatten the prices */
  c.sched.charge = CPH_CHARGE_TOKENS;
  c.sched.tokens_per_unit = 1000; /* 2 credits per 1000 tokens: 100 vs 1 a turn */
  c.sessions = ss;
  c.n_sessions = 2;
  c.tokens = tokens;
  c.duration_s = 600;
  c.warmup_s = 60;
  cph_sim_result r;
  assert_int_equal(cph_sim_run(&c, &r), 0);
  assert_true(r.groups[1].turns > 20 * r.groups[0].turns);
  assert_true(r.groups[0].turns > 0); /* the expensive one still runs as credits refill */
  cph_sim_result_free(&r);
  c.sched.charge = CPH_CHARGE_TURN;
  assert_int_equal(cph_sim_run(&c, &r), 0);
  assert_true(r.jain[0] == 1 && r.groups[0].turns + 1 >= r.groups[1].turns &&
              r.groups[1].turns + 1 >= r.groups[0].turns);
  cph_sim_result_free(&r);
}

/* §3.8: a lane that budgets tokens stops while its tokens bucket is spent, and says until
 * when; charged at completion, it may go negative. */
static void test_token_budget_stops_the_lane_until_refilled(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.tokens_per_minute[CPH_LANE_OPERATIONAL] = 6000; /* 100 a second */
  fx_open(&f, &cfg);
  cph_sid a = fx_add(&f, "a", CPH_LANE_OPERATIONAL, true);
  cph_sid b = fx_add(&f, "b", CPH_LANE_OPERATIONAL, true);
  assert_int_equal(fx_pick(&f, NULL), a);
  cph_clock_advance(&f.clock, S_NS); /* a queues again after b */
  cph_sched_cost cost = {0, 9000};
  cph_sched_finish_cost(f.s, a, &cost, true);
  cph_lane_stats st;
  cph_sched_lane_stats(f.s, CPH_LANE_OPERATIONAL, &st);
  assert_true(st.tokens_left == -3000);
  assert_false(st.has_budget);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_why w;
  cph_sched_why(f.s, b, &w);
  assert_int_equal(w.reason, CPH_WHY_LANE_NO_BUDGET);
  assert_int_equal(w.until_ns - cph_clock_now(&f.clock), 30 * S_NS + 1); /* 3001 tokens */
  cph_clock_advance(&f.clock, 30 * S_NS);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE); /* exactly 0: not above it */
  cph_clock_advance(&f.clock, 1);
  assert_int_equal(fx_pick(&f, NULL), b);
  cph_sched_free(f.s);
}

/* §3.10: seats reserved for maintenance are lent while it has no work, and come back as the
 * interactive turns holding them end — no preemption — while the outbox trickle still takes
 * the next free slot first. */
static void test_seats_lent_then_reclaimed_trickle_first(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.concurrency = 3;
  cfg.seats[CPH_LANE_MAINTENANCE] = 1;
  cfg.trickle_per_minute = 1;
  fx_open(&f, &cfg);
  cph_sid in[4];
  char id[8];
  for (int i = 0; i < 4; i++) {
    snprintf(id, sizeof id, "i%d", i);
    in[i] = fx_add(&f, id, CPH_LANE_INTERACTIVE, true);
  }
  /* No maintenance work: the reserved seat is lent, all three go to interactive. */
  assert_int_equal(fx_pick(&f, NULL), in[0]);
  assert_int_equal(fx_pick(&f, NULL), in[1]);
  assert_int_equal(fx_pick(&f, NULL), in[2]);
  cph_lane_stats st;
  cph_sched_lane_stats(f.s, CPH_LANE_MAINTENANCE, &st);
  assert_int_equal(st.seats, 1);
  assert_int_equal(st.seats_lent, 1);
  cph_sched_lane_stats(f.s, CPH_LANE_INTERACTIVE, &st);
  assert_int_equal(st.seats_borrowed, 1);
  /* Maintenance work arrives, and an outbox batch falls due: nothing is preempted. */
  cph_sid m = fx_add(&f, "m", CPH_LANE_MAINTENANCE, true);
  cph_sid j = fx_add(&f, "janitor", CPH_LANE_MAINTENANCE, false);
  cph_sched_set_trickle(f.s, j, true);
  assert_int_equal(fx_pick(&f, NULL), CPH_SID_NONE);
  cph_why w;
  cph_sched_why(f.s, m, &w);
  assert_int_equal(w.reason, CPH_WHY_CONCURRENCY_FULL);
  /* The first turn to end: the trickle first. Its batch runs in the maintenance lane, on
   * the maintenance seat. */
  cph_sched_finish(f.s, in[0], 0, true);
  cph_pick p;
  assert_int_equal(fx_pick(&f, &p), j);
  assert_true(p.trickle);
  cph_sched_set_trickle(f.s, j, false);
  cph_sched_finish(f.s, j, 0, false);
  /* The batch ends: the seat goes back to maintenance, ahead of the waiting interactive
   * i3 and i0 — which, asked, say the free seat is held for another lane. */
  cph_sched_why(f.s, in[3], &w);
  assert_int_equal(w.reason, CPH_WHY_SEATS_RESERVED);
  assert_int_equal(fx_pick(&f, NULL), m);
  cph_sched_lane_stats(f.s, CPH_LANE_MAINTENANCE, &st);
  assert_int_equal(st.seats_lent, 0);
  cph_sched_finish(f.s, in[1], 0, true);
  assert_int_equal(fx_pick(&f, NULL), in[3]); /* the shared pool's seat */
  cph_sched_free(f.s);
}

/* §3.9: one tenant with 10,000 sessions cannot crowd out another with 10 — by weight, 1:1. */
static void test_tenant_with_many_sessions_does_not_crowd_out_a_small_one(void **state) {
  (void)state;
  fixture f;
  cph_sched_config cfg = seed_policy();
  cfg.turns_per_minute[CPH_LANE_INTERACTIVE] = 100000000;
  cfg.tool_calls_per_minute[CPH_LANE_INTERACTIVE] = 100000000;
  cfg.concurrency = 1;
  fx_open(&f, &cfg);
  char id[16];
  for (int i = 0; i < 10000; i++) {
    snprintf(id, sizeof id, "big%05d", i);
    cph_sid sid = fx_add(&f, id, CPH_LANE_INTERACTIVE, true);
    assert_int_equal(cph_sched_set_tenant(f.s, sid, "big"), 0);
  }
  for (int i = 0; i < 10; i++) {
    snprintf(id, sizeof id, "small%d", i);
    cph_sid sid = fx_add(&f, id, CPH_LANE_INTERACTIVE, true);
    assert_int_equal(cph_sched_set_tenant(f.s, sid, "small"), 0);
  }
  int small = 0;
  for (int k = 0; k < 1000; k++) {
    cph_pick p;
    assert_int_equal(cph_sched_pick(f.s, &p), 0);
    small += strcmp(cph_sched_tenant(f.s, p.sid), "small") == 0;
    cph_clock_advance(&f.clock, S_NS / 1000);
    cph_sched_finish(f.s, p.sid, 0, true);
  }
  assert_int_equal(small, 500);
  cph_sched_free(f.s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lane_never_starts_more_than_budget_over_any_window),
      cmocka_unit_test(test_lane_uses_no_more_tool_calls_than_budget_over_long_run),
      cmocka_unit_test(test_interactive_out_of_budget_lets_operational_run),
      cmocka_unit_test(test_lane_without_tool_call_budget_is_blocked_despite_turn_tokens),
      cmocka_unit_test(test_new_session_starts_at_max),
      cmocka_unit_test(test_cost_is_charged_at_completion_not_at_start),
      cmocka_unit_test(test_credits_refill_at_rate_and_cap_at_max),
      cmocka_unit_test(test_credits_floor_at_min),
      cmocka_unit_test(test_credits_stay_within_bounds),
      cmocka_unit_test(test_concurrency_is_never_exceeded),
      cmocka_unit_test(test_session_never_has_two_turns_running),
      cmocka_unit_test(test_reassign_keeps_a_running_turn_and_a_queued_place),
      cmocka_unit_test(test_pick_order_credits_then_wait_then_id),
      cmocka_unit_test(test_equal_saturated_sessions_share_turns_fairly),
      cmocka_unit_test(test_spamming_session_does_not_delay_quiet_sessions),
      cmocka_unit_test(test_trickle_holds_under_full_saturation_with_maintenance_budget_spent),
      cmocka_unit_test(test_reload_keeps_fill_ratio_and_next_picks_obey_new_budget),
      cmocka_unit_test(test_reload_carries_credits_clamped_into_new_bounds),
      cmocka_unit_test(test_reload_mid_run_new_budget_governs_later_windows),
      cmocka_unit_test(test_why_names_each_reason),
      cmocka_unit_test(test_pass_runs_its_five_jobs_in_fixed_order),
      cmocka_unit_test(test_message_staged_by_poll_inbox_is_picked_only_in_next_pass),
      cmocka_unit_test(test_charge_by_tokens_lets_cheap_sessions_ahead),
      cmocka_unit_test(test_token_budget_stops_the_lane_until_refilled),
      cmocka_unit_test(test_seats_lent_then_reclaimed_trickle_first),
      cmocka_unit_test(test_tenant_with_many_sessions_does_not_crowd_out_a_small_one),
      cmocka_unit_test(test_budget_share_never_adds_tokens),
      cmocka_unit_test(test_cluster_shares_keep_the_lane_bound_property),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
