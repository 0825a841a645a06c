/* lanes/sim: the simulator is deterministic, models its traffic as configured, and reports
 * what the scheduler did. The scheduling claims themselves are tested in test_sched.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "lanes/sim.h"

/* Budgets that never bind. */
static cph_sched_config roomy(uint32_t concurrency) {
  cph_sched_config c = {{1000000, 1000000, 1000000}, {1000000, 1000000, 1000000}, 1.0, 30, -30,
                        {2, 1, 1}, concurrency, 0, {0}, CPH_CHARGE_TURN, 0, {0}, NULL, 0, 0};
  return c;
}

static int run(cph_sim_config *c, cph_sim_result *r) {
  int rc = cph_sim_run(c, r);
  if (rc)
    fail_msg("cph_sim_run: %d", rc);
  return rc;
}

static bool same_picks(const cph_sim_result *a, const cph_sim_result *b) {
  if (a->n_picks != b->n_picks)
    return false;
  for (size_t i = 0; i < a->n_picks; i++) {
    const cph_sim_pick *x = &a->picks[i], *y = &b->picks[i];
    if (x->at_ns != y->at_ns || x->session != y->session || x->lane != y->lane ||
        x->trickle != y->trickle || x->outbox != y->outbox || x->waited_ns != y->waited_ns)
      return false;
  }
  return true;
}

static void test_same_seed_gives_identical_runs(void **state) {
  (void)state;
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, 0.5, 1.0, true, 2, 0, 6, false},
      {CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 2.0, true, 1, 1, 3, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 2, 1, true},
  };
  cph_sim_config c = {0};
  c.sched = roomy(3);
  c.sched.trickle_per_minute = 6;
  c.sessions = ss;
  c.n_sessions = 3;
  c.duration_s = 600;
  c.seed = 42;
  c.record_picks = true;
  cph_sim_result a, b, d;
  run(&c, &a);
  run(&c, &b);
  assert_true(a.n_picks > 100);
  assert_true(same_picks(&a, &b));
  assert_memory_equal(a.session_turns, b.session_turns, a.n_sessions * sizeof(uint64_t));
  assert_memory_equal(a.lanes, b.lanes, sizeof a.lanes);
  assert_int_equal(a.passes, b.passes);
  c.seed = 43;
  run(&c, &d);
  assert_false(same_picks(&a, &d));
  cph_sim_result_free(&a);
  cph_sim_result_free(&b);
  cph_sim_result_free(&d);
}

/* One session's arrivals do not depend on another's traffic: each session draws from its own
 * stream, which is what lets a spam run be compared with its baseline. */
static void test_session_arrivals_do_not_depend_on_other_sessions(void **state) {
  (void)state;
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, 0.2, 0.001, false, 0, 0, 1, false},
      {CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, 0.2, 0.001, false, 0, 1, 1, false},
  };
  cph_sim_config c = {0};
  c.sched = roomy(8);
  c.sessions = ss;
  c.n_sessions = 2;
  c.duration_s = 600;
  c.max_batch = 1;
  c.seed = 5;
  c.record_picks = true;
  cph_sim_result quiet, noisy;
  run(&c, &quiet);
  ss[1].arrivals_per_s = 20;
  run(&c, &noisy);
  /* Session 0's picks happen at the same instants in both runs. */
  size_t i = 0, j = 0;
  for (; i < quiet.n_picks; i++) {
    if (quiet.picks[i].session != 0)
      continue;
    while (j < noisy.n_picks && noisy.picks[j].session != 0)
      j++;
    assert_true(j < noisy.n_picks);
    assert_int_equal(quiet.picks[i].at_ns, noisy.picks[j].at_ns);
    j++;
  }
  cph_sim_result_free(&quiet);
  cph_sim_result_free(&noisy);
}

static void test_poisson_arrivals_come_at_the_configured_rate(void **state) {
  (void)state;
  /* Short turns and one message per turn: turns count arrivals. Expected 2,000 (sd 45). */
  cph_sim_session ss[] = {{CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, 2.0, 0.001, false, 0, 0, 1,
                           false}};
  cph_sim_config c = {0};
  c.sched = roomy(4);
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 1000;
  c.max_batch = 1;
  c.seed = 9;
  cph_sim_result r;
  run(&c, &r);
  assert_in_range(r.lanes[0].turns, 1800, 2200);
  assert_int_equal(r.lanes[0].wait_p99_ns, 0); /* a free slot every time: picked at once */
  cph_sim_result_free(&r);
}

static void test_saturated_session_runs_back_to_back(void **state) {
  (void)state;
  /* Fixed 1 s turns, one session: a new turn starts at each completion, waiting 0. */
  cph_sim_session ss[] = {{CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 1.0, false, 3, 0, 1,
                           false}};
  cph_sim_config c = {0};
  c.sched = roomy(2);
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 100.5;
  c.seed = 1;
  cph_sim_result r;
  run(&c, &r);
  assert_int_equal(r.lanes[CPH_LANE_OPERATIONAL].turns, 101); /* at 0, 1, ..., 100 s */
  assert_int_equal(r.lanes[CPH_LANE_OPERATIONAL].tool_calls, 3 * 100);
  assert_int_equal(r.lanes[CPH_LANE_OPERATIONAL].wait_max_ns, 0);
  assert_int_equal(r.max_running, 1);
  assert_true(r.lanes[CPH_LANE_OPERATIONAL].share == 1.0);
  cph_sim_result_free(&r);
}

static void test_exponential_turns_have_the_configured_mean(void **state) {
  (void)state;
  cph_sim_session ss[] = {{CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 0.5, true, 0, 0, 1,
                           false}};
  cph_sim_config c = {0};
  c.sched = roomy(1);
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 1000;
  c.seed = 11;
  cph_sim_result r;
  run(&c, &r);
  assert_in_range(r.lanes[0].turns, 1900, 2100); /* 2,000 expected, sd 45 */
  cph_sim_result_free(&r);
}

static void test_warmup_is_left_out_of_the_statistics(void **state) {
  (void)state;
  cph_sim_session ss[] = {{CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, false, 1, 0, 1,
                           false}};
  cph_sim_config c = {0};
  c.sched = roomy(1);
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 100.5;
  c.warmup_s = 50.5;
  c.record_picks = true;
  cph_sim_result r;
  run(&c, &r);
  assert_int_equal(r.n_picks, 101);            /* every pick is recorded */
  assert_int_equal(r.lanes[0].turns, 50);      /* 51 .. 100 s are measured */
  assert_int_equal(r.session_turns[0], 50);
  assert_true(r.measured_s == 50.0);
  cph_sim_result_free(&r);
}

static void test_reload_applies_at_its_time(void **state) {
  (void)state;
  cph_sim_session ss[] = {{CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, false, 0, 0, 8,
                           false}};
  cph_sim_config c = {0};
  c.sched = roomy(2);
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 20.5;
  c.reload = true;
  c.reload_at_s = 10;
  c.reload_cfg = roomy(6);
  c.record_picks = true;
  cph_sim_result r;
  run(&c, &r);
  /* 2 turns at each second before the reload, 6 from 10 s on. */
  uint64_t before = 0, after = 0;
  for (size_t i = 0; i < r.n_picks; i++)
    if (r.picks[i].at_ns < 10 * CPH_NS_PER_S)
      before++;
    else
      after++;
  assert_int_equal(before, 2 * 10);
  assert_int_equal(after, 2 + 4 + 6 * 10); /* at 10 s: 2 completed + 4 new slots */
  assert_int_equal(r.max_running, 6);
  cph_sim_result_free(&r);
}

static void test_outbox_session_runs_batches_by_trickle(void **state) {
  (void)state;
  /* Only the janitor, with no maintenance budget at all: every batch is a trickle pick. */
  cph_sim_session ss[] = {{CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 0, 1, true}};
  cph_sim_config c = {0};
  c.sched = roomy(1);
  c.sched.turns_per_minute[CPH_LANE_MAINTENANCE] = 0;
  c.sched.trickle_per_minute = 4;
  c.sessions = ss;
  c.n_sessions = 1;
  c.duration_s = 600;
  cph_sim_result r;
  run(&c, &r);
  assert_int_equal(r.outbox_batches, 40);
  assert_int_equal(r.trickle_picks, 40);
  assert_int_equal(r.outbox_min_per_minute, 4);
  assert_true(r.outbox_per_minute == 4.0);
  cph_sim_result_free(&r);
}

static void test_invalid_configs_are_rejected(void **state) {
  (void)state;
  cph_sim_session ok = {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, false, 0, 0, 1, false};
  cph_sim_config c = {0};
  c.sched = roomy(1);
  c.sessions = &ok;
  c.n_sessions = 1;
  c.duration_s = 10;
  cph_sim_result r;

  cph_sim_config bad = c;
  bad.sched.concurrency = 0;
  assert_int_equal(cph_sim_run(&bad, &r), CPH_EINVAL);
  cph_sim_result_free(&r);
  bad = c;
  bad.n_sessions = 0;
  assert_int_equal(cph_sim_run(&bad, &r), CPH_EINVAL);
  bad = c;
  bad.warmup_s = 10;
  assert_int_equal(cph_sim_run(&bad, &r), CPH_EINVAL);
  bad = c;
  bad.reload = true;
  bad.reload_cfg = c.sched;
  bad.reload_cfg.credit_min = 100;
  assert_int_equal(cph_sim_run(&bad, &r), CPH_EINVAL);
  cph_sim_session wrong = ok;
  wrong.group = CPH_SIM_GROUPS;
  bad = c;
  bad.sessions = &wrong;
  assert_int_equal(cph_sim_run(&bad, &r), CPH_EINVAL);
  wrong = ok;
  wrong.arrivals_per_s = -1;
  assert_int_equal(cph_sim_run(&bad, &r), CPH_EINVAL);
  cph_sim_result_free(&r);
}

static void test_print_reports_lanes_groups_and_trickle(void **state) {
  (void)state;
  cph_sim_session ss[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, true, 1, 3, 4, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 5, 1, true},
  };
  cph_sim_config c = {0};
  c.sched = roomy(2);
  c.sched.trickle_per_minute = 1;
  c.sessions = ss;
  c.n_sessions = 2;
  c.duration_s = 120;
  cph_sim_result r;
  run(&c, &r);
  char buf[4096] = {0};
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  assert_non_null(f);
  cph_sim_print(&r, f);
  fclose(f);
  assert_non_null(strstr(buf, "lane interactive"));
  assert_non_null(strstr(buf, "lane maintenance"));
  assert_non_null(strstr(buf, "group 3 (4 sessions)"));
  assert_non_null(strstr(buf, "group 5 (1 sessions)"));
  assert_non_null(strstr(buf, "outbox batches"));
  assert_null(strstr(buf, "VIOLATIONS"));
  cph_sim_result_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_seed_gives_identical_runs),
      cmocka_unit_test(test_session_arrivals_do_not_depend_on_other_sessions),
      cmocka_unit_test(test_poisson_arrivals_come_at_the_configured_rate),
      cmocka_unit_test(test_saturated_session_runs_back_to_back),
      cmocka_unit_test(test_exponential_turns_have_the_configured_mean),
      cmocka_unit_test(test_warmup_is_left_out_of_the_statistics),
      cmocka_unit_test(test_reload_applies_at_its_time),
      cmocka_unit_test(test_outbox_session_runs_batches_by_trickle),
      cmocka_unit_test(test_invalid_configs_are_rejected),
      cmocka_unit_test(test_print_reports_lanes_groups_and_trickle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
