/* cph_engine_report_consumed, cph_engine_inbox_keys and CPH_OP_INBOX_RETAIN
 * (include/cephalon/cephalon.h): what cluster mode's done marks and rebuild use
 * (server/clusterflow.h, 6.-8.). With it on, a
 * completion names the idempotency key of every event the turn consumed — the events folded
 * into an entry by the queue cap included (DESIGN §5) — and names them again when repeated; a
 * session delete names those of the inbox it drops; events without a key are left out. Off,
 * nothing is named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "tests/support/engine_fixture.h"

#define N_KEYED 7

/* Posts N_KEYED events with keys "<session>-<i>" and one without a key to session. */
static void post(cph_fixture *f, const char *session) {
  cph_event_in evs[N_KEYED + 1];
  char keys[N_KEYED][32], bodies[N_KEYED + 1][32];
  memset(evs, 0, sizeof evs);
  for (int i = 0; i <= N_KEYED; i++) {
    snprintf(bodies[i], sizeof bodies[i], "message %d to %s", i, session);
    evs[i].session = (char *)session;
    evs[i].sender = "ann";
    evs[i].body = bodies[i];
    if (i < N_KEYED) {
      snprintf(keys[i], sizeof keys[i], "%s-%d", session, i);
      evs[i].key = keys[i];
    }
  }
  cph_op op;
  cph_fixture_ingest(f, evs, N_KEYED + 1, &op);
  for (int i = 0; i <= N_KEYED; i++)
    assert_int_equal(op.u.ingest.results[i].status, CPH_EV_QUEUED);
  cph_op_clear_results(&op);
}

/* keys holds exactly "<session>-0" .. "<session>-<N_KEYED - 1>", each once. */
static void assert_all_keys(const cph_strv *keys, const char *session) {
  assert_int_equal(keys->count, N_KEYED);
  int seen[N_KEYED] = {0};
  for (size_t i = 0; i < keys->count; i++) {
    char prefix[40];
    int k = -1;
    snprintf(prefix, sizeof prefix, "%s-%%d", session);
    assert_int_equal(sscanf(keys->items[i], prefix, &k), 1);
    assert_true(k >= 0 && k < N_KEYED);
    seen[k]++;
  }
  for (int k = 0; k < N_KEYED; k++)
    assert_int_equal(seen[k], 1);
}

/* Leases the one turn there is and completes it (op left for the caller to read and clear). */
static void lease_complete(cph_fixture *f, cph_op *done, size_t *n_staged, uint32_t *counted) {
  cph_op lease = {0};
  lease.kind = CPH_OP_LEASE;
  lease.u.lease.worker = "w";
  lease.u.lease.deadline_ns = cph_clock_now(&f->clock) + 5 * CPH_NS_PER_S;
  assert_int_equal(cph_fixture_run(f, &lease), CPH_OK);
  cph_turn_info *t = &lease.u.lease.turn;
  *n_staged = t->n_staged;
  *counted = 0;
  for (size_t i = 0; i < t->n_staged; i++)
    *counted += t->staged[i].count;
  memset(done, 0, sizeof *done);
  done->kind = CPH_OP_COMPLETE;
  done->u.turn.turn_id = t->id;
  memcpy(done->u.turn.lease, t->lease, sizeof done->u.turn.lease);
  assert_int_equal(cph_fixture_run(f, done), CPH_OK);
  cph_op_clear_results(&lease);
}

static void
test_consumed_keys_name_every_event_a_completion_consumed_folded_ones_included(void **state) {
  (void)state;
  /* A queue of 3: eight events fold into an overflow entry and two more (DESIGN §4). */
  cph_fixture *f = cph_fixture_new("consumed", "{:sessions {:max-queue 3}}");
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  post(f, "a");
  cph_strv live = {0};
  cph_err err = {0};
  assert_int_equal(cph_engine_inbox_keys(f->e, "a", &live, &err), CPH_OK);
  assert_all_keys(&live, "a");
  cph_strv_free(&live);
  assert_int_equal(cph_engine_inbox_keys(f->e, "nobody", &live, &err), CPH_ENOTFOUND);

  cph_op done;
  size_t n_staged = 0;
  uint32_t counted = 0;
  lease_complete(f, &done, &n_staged, &counted);
  assert_true(n_staged < N_KEYED + 1); /* folded: fewer entries than events */
  assert_int_equal(counted, N_KEYED + 1);
  assert_false(done.u.turn.already);
  assert_string_equal(done.u.turn.consumed_session, "a");
  assert_all_keys(&done.u.turn.consumed, "a");
  cph_op again = done;
  cph_op_clear_results(&done);

  /* Completing again (`already`) names them again, from the stored records. */
  memset(&again.u.turn.consumed, 0, sizeof again.u.turn.consumed);
  again.u.turn.consumed_session = NULL;
  again.done = NULL;
  assert_int_equal(cph_fixture_run(f, &again), CPH_OK);
  assert_true(again.u.turn.already);
  assert_string_equal(again.u.turn.consumed_session, "a");
  assert_all_keys(&again.u.turn.consumed, "a");
  cph_op_clear_results(&again);
  assert_int_equal(cph_engine_inbox_keys(f->e, "a", &live, &err), CPH_OK);
  assert_int_equal(live.count, 0); /* nothing live is left */
  cph_strv_free(&live);
  cph_fixture_free(f);
}

static void test_consumed_keys_a_delete_names_the_inbox_it_drops(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("consumed_delete", "{}");
  cph_fixture_create_session(f, "b", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  post(f, "b");
  cph_op del = {0};
  del.kind = CPH_OP_SESSION_DELETE;
  del.u.session.in.id = "b";
  assert_int_equal(cph_fixture_run(f, &del), CPH_OK);
  assert_all_keys(&del.u.session.consumed, "b");
  cph_op_clear_results(&del);
  cph_fixture_free(f);
}

/* CPH_OP_INBOX_RETAIN: entries whose events' keys are all outside keep go (consumed, no
 * turn); kept keys and entries without a key stay. */
static void test_inbox_retain_drops_what_keep_does_not_name(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("retain", "{}");
  cph_fixture_create_session(f, "d", CPH_LANE_INTERACTIVE, NULL, 0);
  post(f, "d"); /* d-0 .. d-6 and one without a key */
  const char *keep[] = {"d-1", "d-4", "nobody's"};
  cph_op op = {0};
  op.kind = CPH_OP_INBOX_RETAIN;
  op.u.retain.session = "d";
  op.u.retain.keep = keep;
  op.u.retain.n_keep = 3;
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  assert_int_equal(op.u.retain.dropped, N_KEYED - 2);
  cph_op_clear_results(&op);
  cph_strv live = {0};
  cph_err err = {0};
  assert_int_equal(cph_engine_inbox_keys(f->e, "d", &live, &err), CPH_OK);
  assert_int_equal(live.count, 2);
  assert_true(strcmp(live.items[0], "d-1") == 0 || strcmp(live.items[1], "d-1") == 0);
  assert_true(strcmp(live.items[0], "d-4") == 0 || strcmp(live.items[1], "d-4") == 0);
  cph_strv_free(&live);
  cph_session_info info = {0};
  assert_int_equal(cph_engine_get_session(f->e, "d", &info, &err), CPH_OK);
  assert_int_equal(info.pending + info.staged, 3); /* the two kept and the one without a key */
  cph_session_info_free(&info);
  memset(&op, 0, sizeof op);
  op.kind = CPH_OP_INBOX_RETAIN;
  op.u.retain.session = "nobody";
  assert_int_equal(cph_fixture_run(f, &op), CPH_ENOTFOUND);
  cph_op_clear_results(&op);
  cph_fixture_free(f);
}

/* A turn handed back as away (cph_op u.turn.away) counts no attempt and its session is not
 * picked again until a retain says this node serves it again. */
static void test_an_away_session_waits_for_a_retain(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("away", "{:leases {:max-attempts 1}}");
  cph_fixture_create_session(f, "e", CPH_LANE_INTERACTIVE, NULL, 0);
  post(f, "e");
  cph_op lease = {0};
  lease.kind = CPH_OP_LEASE;
  lease.u.lease.worker = "w";
  lease.u.lease.deadline_ns = cph_clock_now(&f->clock);
  assert_int_equal(cph_fixture_run(f, &lease), CPH_OK);
  cph_op fail = {0};
  fail.kind = CPH_OP_FAIL;
  fail.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(fail.u.turn.lease, lease.u.lease.turn.lease, sizeof fail.u.turn.lease);
  fail.u.turn.away = true;
  cph_op_clear_results(&lease);
  assert_int_equal(cph_fixture_run(f, &fail), CPH_OK); /* one attempt allowed: not parked */
  cph_op_clear_results(&fail);
  memset(&lease, 0, sizeof lease);
  lease.kind = CPH_OP_LEASE;
  lease.u.lease.worker = "w";
  lease.u.lease.deadline_ns = cph_clock_now(&f->clock);
  assert_int_equal(cph_fixture_run(f, &lease), CPH_ETIMEDOUT); /* away: never picked */
  cph_op_clear_results(&lease);
  cph_op retain = {0};
  retain.kind = CPH_OP_INBOX_RETAIN;
  retain.u.retain.session = "e";
  const char *all[N_KEYED];
  char keys[N_KEYED][32];
  for (int i = 0; i < N_KEYED; i++) {
    snprintf(keys[i], sizeof keys[i], "e-%d", i);
    all[i] = keys[i];
  }
  retain.u.retain.keep = all;
  retain.u.retain.n_keep = N_KEYED;
  assert_int_equal(cph_fixture_run(f, &retain), CPH_OK);
  assert_int_equal(retain.u.retain.dropped, 0);
  cph_op_clear_results(&retain);
  cph_op done;
  size_t n_staged = 0;
  uint32_t counted = 0;
  lease_complete(f, &done, &n_staged, &counted);
  assert_int_equal(counted, N_KEYED + 1); /* everything, once */
  cph_op_clear_results(&done);
  cph_fixture_free(f);
}

static void test_consumed_keys_off_names_nothing(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("consumed_off", "{}");
  cph_fixture_create_session(f, "c", CPH_LANE_INTERACTIVE, NULL, 0);
  post(f, "c");
  cph_op done;
  size_t n_staged = 0;
  uint32_t counted = 0;
  lease_complete(f, &done, &n_staged, &counted);
  assert_int_equal(counted, N_KEYED + 1);
  assert_int_equal(done.u.turn.consumed.count, 0);
  assert_null(done.u.turn.consumed.items);
  assert_null(done.u.turn.consumed_session);
  cph_op_clear_results(&done);
  cph_fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_consumed_keys_name_every_event_a_completion_consumed_folded_ones_included),
      cmocka_unit_test(test_consumed_keys_a_delete_names_the_inbox_it_drops),
      cmocka_unit_test(test_inbox_retain_drops_what_keep_does_not_name),
      cmocka_unit_test(test_an_away_session_waits_for_a_retain),
      cmocka_unit_test(test_consumed_keys_off_names_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
