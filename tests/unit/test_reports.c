/* Report turns (DESIGN §4) through the public API on a virtual clock: a reporter's channel
 * traffic is held and counted, a report turn comes at most once per interval and only when
 * something arrived, it lists what arrived per channel and family, a mention still runs at
 * once, held input survives a restart, /why tells when the next report comes, and backpressure
 * step 4 stretches the interval by :report-delay-factor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

static const char *POLICY =
    "{:scheduler {:concurrency 4}\n"
    " :sessions {:janitor? false}\n"
    " :store {:sync :none}\n"
    " :dedupe {:window-seconds 300 :min-length 12}\n"
    " :backpressure {:interval-s 1 :recover-intervals 100 :report-delay-factor 4\n"
    "                :channels {\"storm\" {:max-events-per-minute 5}}}}\n";

typedef cph_fixture fixture;

static int setup(void **state) {
  *state = cph_fixture_new("reports", POLICY);
  return 0;
}

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

static void create_reporter(fixture *f, const char *id, const char *channel, uint32_t every_s) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = CPH_LANE_OPERATIONAL;
  char *subs[1] = {(char *)channel};
  op.u.session.in.subscribe.items = subs;
  op.u.session.in.subscribe.count = 1;
  op.u.session.in.report_interval_s = every_s;
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

static void post(fixture *f, const char *channel, const char *sender, const char *body,
                 const char *mention) {
  cph_event_in ev = {0};
  ev.channel = (char *)channel;
  ev.sender = (char *)sender;
  ev.body = (char *)body;
  char *m[1] = {(char *)mention};
  if (mention) {
    ev.mentions.items = m;
    ev.mentions.count = 1;
  }
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = &ev;
  op.u.ingest.n_events = 1;
  if (cph_fixture_run(f, &op))
    fail_msg("ingest: %s", op.err.msg);
  assert_int_equal(op.u.ingest.results[0].sessions.count, 1); /* it reached the reporter */
  cph_op_clear_results(&op);
}

/* Leases a turn now: CPH_OK (op holds it) or CPH_ETIMEDOUT. */
static int lease(fixture *f, cph_op *op) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w";
  op->u.lease.deadline_ns = cph_clock_now(&f->clock);
  return cph_fixture_run(f, op);
}

static void complete(fixture *f, cph_op *l) {
  cph_op c = {0};
  c.kind = CPH_OP_COMPLETE;
  c.u.turn.turn_id = l->u.lease.turn.id;
  snprintf(c.u.turn.lease, sizeof c.u.turn.lease, "%s", l->u.lease.turn.lease);
  assert_int_equal(cph_fixture_run(f, &c), CPH_OK);
  cph_op_clear_results(l);
}

static void advance(fixture *f, int seconds) {
  for (int i = 0; i < seconds; i++) { /* a pass a second: the report check runs in each */
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    cph_engine_run_pass(f->e);
  }
}

static cph_why_info why(fixture *f, const char *id) {
  cph_why_info w;
  cph_err err;
  if (cph_engine_why(f->e, id, &w, &err))
    fail_msg("why %s: %s", id, err.msg);
  return w;
}

static void test_report_comes_once_per_interval_and_lists_what_arrived(void **state) {
  fixture *f = *state;
  create_reporter(f, "ops-report", "alerts", 60);
  for (int i = 0; i < 5; i++)
    post(f, "alerts", "nagios", "disk usage on db-1 is above ninety percent", NULL);
  post(f, "alerts", "nagios", "certificate for api.example.com expires soon", NULL);
  cph_op op;
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT); /* held: nothing runs before the report */
  cph_why_info w = why(f, "ops-report");
  assert_string_equal(w.reason, "waiting_for_report");
  assert_true(w.next_report_in_s > 55 && w.next_report_in_s <= 60);

  advance(f, 59);
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT);
  advance(f, 2);
  assert_int_equal(lease(f, &op), CPH_OK);
  const cph_turn_info *t = &op.u.lease.turn;
  assert_int_equal(t->kind, CPH_KIND_REPORT);
  assert_string_equal(t->session, "ops-report");
  assert_int_equal(t->n_staged, 2);
  assert_int_equal(t->staged[0].count + t->staged[1].count, 6); /* every alert counted */
  const char *head = "report:\n#alerts: 6 messages, ";
  assert_true(strncmp(t->input, head, strlen(head)) == 0);
  assert_non_null(strstr(t->input, "\n- ×5 nagios: disk usage on db-1 is above ninety percent"));
  assert_non_null(strstr(t->input, "\n- ×1 nagios: certificate for api.example.com"));
  complete(f, &op);

  /* nothing arrived: no report, however long */
  advance(f, 150);
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT);
  /* something arrives: the next report comes an interval after the last one, not at once */
  post(f, "alerts", "nagios", "replication lag on db-2 above threshold", NULL);
  advance(f, 1); /* the check runs once a second: 150 s since the last report, due now */
  assert_int_equal(lease(f, &op), CPH_OK);
  assert_int_equal(op.u.lease.turn.kind, CPH_KIND_REPORT);
  complete(f, &op);
  post(f, "alerts", "nagios", "replication lag on db-2 back to normal", NULL);
  advance(f, 30);
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT);
  advance(f, 31);
  assert_int_equal(lease(f, &op), CPH_OK);
  assert_int_equal(op.u.lease.turn.kind, CPH_KIND_REPORT);
  complete(f, &op);
}

static void test_a_mention_runs_at_once_and_carries_the_held_input(void **state) {
  fixture *f = *state;
  create_reporter(f, "ops-report", "alerts", 60);
  post(f, "alerts", "nagios", "disk usage on db-1 is above ninety percent", NULL);
  post(f, "alerts", "alice", "ops-report what is going on with db-1", "ops-report");
  cph_op op;
  assert_int_equal(lease(f, &op), CPH_OK);
  const cph_turn_info *t = &op.u.lease.turn;
  assert_int_equal(t->kind, CPH_KIND_INBOX);
  assert_int_equal(t->n_staged, 2); /* the mention first, the held alert with it */
  assert_true(t->staged[0].mentioned);
  complete(f, &op);
  advance(f, 70);
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT); /* nothing left for a report */
}

static void test_held_input_survives_a_restart(void **state) {
  fixture *f = *state;
  create_reporter(f, "ops-report", "alerts", 30);
  for (int i = 0; i < 3; i++)
    post(f, "alerts", "nagios", "disk usage on db-1 is above ninety percent", NULL);
  advance(f, 10);
  cph_engine_close(f->e);
  cph_fixture_open(f);
  cph_op op;
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT); /* the interval counts from the open */
  assert_string_equal(why(f, "ops-report").reason, "waiting_for_report");
  post(f, "alerts", "nagios", "disk usage on db-1 is above ninety percent", NULL);
  advance(f, 31);
  assert_int_equal(lease(f, &op), CPH_OK);
  assert_int_equal(op.u.lease.turn.kind, CPH_KIND_REPORT);
  assert_int_equal(op.u.lease.turn.n_staged, 1);
  assert_int_equal(op.u.lease.turn.staged[0].count, 4);
  complete(f, &op);
}

static void test_backpressure_step_four_stretches_the_interval(void **state) {
  fixture *f = *state;
  create_reporter(f, "storm-report", "storm", 10);
  /* 5 a minute is the limit: a burst takes the channel one step a second up to step 4 */
  char body[64];
  for (int s = 0; s < 10; s++) {
    for (int k = 0; k < 3; k++) {
      snprintf(body, sizeof body, "storm alert number %d on the edge", 3 * s + k);
      post(f, "storm", "nagios", body, NULL);
    }
    advance(f, 1);
  }
  cph_channel_info c;
  cph_err err;
  assert_int_equal(cph_engine_channel(f->e, "storm", &c, &err), CPH_OK);
  assert_true(c.step >= 4);
  cph_channel_info_free(&c);
  cph_why_info w = why(f, "storm-report");
  assert_true(w.next_report_in_s > 10); /* 4 x 10 s from the registration, 10 s ago */
  cph_op op;
  advance(f, 10);
  assert_int_equal(lease(f, &op), CPH_ETIMEDOUT);
  advance(f, 25);
  assert_int_equal(lease(f, &op), CPH_OK);
  assert_int_equal(op.u.lease.turn.kind, CPH_KIND_REPORT);
  uint32_t total = 0;
  for (size_t i = 0; i < op.u.lease.turn.n_staged; i++)
    total += op.u.lease.turn.staged[i].count;
  assert_int_equal(total, 30);
  complete(f, &op);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_report_comes_once_per_interval_and_lists_what_arrived,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_mention_runs_at_once_and_carries_the_held_input,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_held_input_survives_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_backpressure_step_four_stretches_the_interval, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
