/* What cluster mode's park marks and rebuild ask of the engine (include/cephalon/cephalon.h;
 * server/clusterflow.h 6.-8.), with cph_engine_report_consumed on:
 *   - a fail that parks its turn names it and the key of every event it carries (folded ones
 *     included) in its op; a turn a lease expiry parks is handed over by
 *     cph_engine_take_parks once its pass committed; a requeue names what it brings back;
 *   - CPH_OP_INGEST with park_session parks, in the same operation, the entries of the given
 *     keys as one turn with the given attempts and error — listed parked, never leased until a
 *     requeue — and, applied again after a restart, parks nothing new and reports the keys
 *     held;
 *   - CPH_OP_INBOX_RETAIN leaves a parked turn whose keys are parked, requeues one whose keys
 *     were requeued elsewhere, keeps one with no mark (its keys held), and takes one whose
 *     input was consumed elsewhere off the parked list;
 *   - a session delete names the keys its parked turns hold. */
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

#define N 5 /* keyed events per post */

/* N events with keys "<tag>-0".."<tag>-<N-1>" to session, in one request; with `park` set
 * (cluster mode's rebuild) they are parked as one turn with 3 attempts and "model down".
 * Returns the op (answered, results for the caller to read and clear). */
static void post(cph_fixture *f, const char *session, const char *tag, bool park, cph_op *op) {
  static char keys[N][32], bodies[N][48];
  static const char *park_keys[N];
  cph_event_in evs[N];
  memset(evs, 0, sizeof evs);
  for (int i = 0; i < N; i++) {
    snprintf(keys[i], sizeof keys[i], "%s-%d", tag, i);
    snprintf(bodies[i], sizeof bodies[i], "message %d of %s", i, tag);
    evs[i].session = (char *)session;
    evs[i].only_session = true;
    evs[i].sender = "ann";
    evs[i].body = bodies[i];
    evs[i].key = keys[i];
    park_keys[i] = keys[i];
  }
  *op = (cph_op){0};
  op->kind = CPH_OP_INGEST;
  op->u.ingest.events = evs;
  op->u.ingest.n_events = N;
  if (park) {
    op->u.ingest.park_session = session;
    op->u.ingest.park_keys = park_keys;
    op->u.ingest.n_park_keys = N;
    op->u.ingest.park_attempts = 3;
    op->u.ingest.park_error = "model down";
  }
  assert_int_equal(cph_fixture_run(f, op), CPH_OK);
}

/* keys holds exactly "<tag>-0".."<tag>-<N-1>", each once. */
static void assert_keys(const cph_strv *keys, const char *tag) {
  assert_int_equal(keys->count, N);
  for (int i = 0; i < N; i++) {
    char want[32];
    snprintf(want, sizeof want, "%s-%d", tag, i);
    int seen = 0;
    for (size_t k = 0; k < keys->count; k++)
      seen += strcmp(keys->items[k], want) == 0;
    assert_int_equal(seen, 1);
  }
}

/* The parked turns of session: how many; the id and attempts of the last into *id, *attempts. */
static int parked_of(cph_fixture *f, const char *session, uint64_t *id, uint32_t *attempts) {
  cph_parked_turn *v = NULL;
  size_t n = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_parked_turns(f->e, &v, &n, &err), CPH_OK);
  int found = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(v[i].session, session) == 0) {
      found++;
      *id = v[i].id;
      *attempts = v[i].attempts;
    }
    cph_parked_turn_free(&v[i]);
  }
  free(v);
  return found;
}

/* A lease now: CPH_OK with the turn in *op (the caller clears it), or CPH_ETIMEDOUT. */
static int lease_now(cph_fixture *f, cph_op *op) {
  *op = (cph_op){0};
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w";
  op->u.lease.deadline_ns = cph_clock_now(&f->clock);
  return cph_fixture_run(f, op);
}

static int requeue(cph_fixture *f, uint64_t id, cph_op *op) {
  *op = (cph_op){0};
  op->kind = CPH_OP_REQUEUE;
  op->u.turn.turn_id = id;
  return cph_fixture_run(f, op);
}

static void test_park_keys_a_parking_fail_an_expiry_and_a_requeue_name_their_events(
    void **state) {
  (void)state;
  /* a queue of 3: five events fold into fewer entries; one attempt each */
  cph_fixture *f = cph_fixture_new("park_notes", "{:sessions {:max-queue 3} :leases "
                                                 "{:max-attempts 1 :ttl-seconds 30}}");
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_fixture_create_session(f, "b", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  cph_op op;
  post(f, "a", "a", false, &op);
  cph_op_clear_results(&op);
  cph_op lease;
  assert_int_equal(lease_now(f, &lease), CPH_OK);
  assert_string_equal(lease.u.lease.turn.session, "a");
  cph_op fail = {0};
  fail.kind = CPH_OP_FAIL;
  fail.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(fail.u.turn.lease, lease.u.lease.turn.lease, sizeof fail.u.turn.lease);
  fail.u.turn.error = "model down";
  cph_op_clear_results(&lease);
  assert_int_equal(cph_fixture_run(f, &fail), CPH_OK);
  assert_string_equal(fail.u.turn.park.session, "a");
  assert_int_equal(fail.u.turn.park.turn_id, fail.u.turn.turn_id);
  assert_int_equal(fail.u.turn.park.attempts, 1);
  assert_string_equal(fail.u.turn.park.error, "model down");
  assert_keys(&fail.u.turn.park.keys, "a");
  uint64_t parked_id = fail.u.turn.turn_id;
  cph_op_clear_results(&fail);
  cph_park_note *notes = NULL;
  size_t n = 0;
  assert_int_equal(cph_engine_take_parks(f->e, &notes, &n), CPH_OK);
  assert_int_equal(n, 0); /* a fail names its park itself */

  /* a lease of b expires: the park is handed over after its pass */
  post(f, "b", "b", false, &op);
  cph_op_clear_results(&op);
  assert_int_equal(lease_now(f, &lease), CPH_OK);
  assert_string_equal(lease.u.lease.turn.session, "b");
  cph_op_clear_results(&lease);
  cph_clock_advance(&f->clock, 31 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e);
  assert_int_equal(cph_engine_take_parks(f->e, &notes, &n), CPH_OK);
  assert_int_equal(n, 1);
  assert_string_equal(notes[0].session, "b");
  assert_string_equal(notes[0].error, "lease expired");
  assert_keys(&notes[0].keys, "b");
  cph_park_note_free(&notes[0]);
  free(notes);
  assert_int_equal(cph_engine_take_parks(f->e, &notes, &n), CPH_OK);
  assert_int_equal(n, 0);

  /* the requeue names what it brings back */
  assert_int_equal(requeue(f, parked_id, &op), CPH_OK);
  assert_string_equal(op.u.turn.park.session, "a");
  assert_keys(&op.u.turn.park.keys, "a");
  cph_op_clear_results(&op);
  cph_fixture_free(f);
}

static void test_park_keys_an_ingest_parks_what_another_node_parked_until_a_requeue(
    void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("park_ingest", "{}");
  cph_fixture_create_session(f, "c", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  cph_op op;
  post(f, "c", "c", true, &op);
  assert_int_not_equal(op.u.ingest.park_turn, 0);
  assert_keys(&op.u.ingest.park_held, "c");
  uint64_t turn = op.u.ingest.park_turn;
  cph_op_clear_results(&op);
  uint64_t id = 0;
  uint32_t attempts = 0;
  assert_int_equal(parked_of(f, "c", &id, &attempts), 1);
  assert_int_equal(id, turn);
  assert_int_equal(attempts, 3);
  cph_turn_record rec;
  cph_err err = {0};
  assert_int_equal(cph_engine_turn_record(f->e, turn, &rec, &err), CPH_OK);
  assert_string_equal(rec.state, "parked");
  assert_string_equal(rec.error, "model down");
  for (int i = 0; i < N; i++) {
    char body[48];
    snprintf(body, sizeof body, "message %d of c", i);
    assert_non_null(strstr(rec.input, body));
  }
  cph_turn_record_free(&rec);
  cph_strv live = {0};
  assert_int_equal(cph_engine_inbox_keys(f->e, "c", &live, &err), CPH_OK);
  assert_int_equal(live.count, 0); /* nothing live: nothing to lease */
  cph_strv_free(&live);
  cph_op lease;
  assert_int_equal(lease_now(f, &lease), CPH_ETIMEDOUT);
  cph_op_clear_results(&lease);

  /* applied again after a restart: duplicates, nothing new parked, the keys held */
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_open(f);
  cph_engine_report_consumed(f->e, true);
  post(f, "c", "c", true, &op);
  for (int i = 0; i < N; i++)
    assert_int_equal(op.u.ingest.results[i].status, CPH_EV_DUPLICATE);
  assert_int_equal(op.u.ingest.park_turn, 0);
  assert_keys(&op.u.ingest.park_held, "c");
  cph_op_clear_results(&op);
  assert_int_equal(parked_of(f, "c", &id, &attempts), 1);

  /* a requeue brings every entry back, once */
  assert_int_equal(requeue(f, turn, &op), CPH_OK);
  assert_keys(&op.u.turn.park.keys, "c");
  cph_op_clear_results(&op);
  assert_int_equal(lease_now(f, &lease), CPH_OK);
  assert_int_equal(lease.u.lease.turn.n_staged, N);
  cph_op_clear_results(&lease);
  assert_int_equal(parked_of(f, "c", &id, &attempts), 0);
  cph_fixture_free(f);
}

/* A retain of session "r" with keep, parked and unparked lists (NULL-terminated). */
static void retain(cph_fixture *f, const char *const *keep, const char *const *parked,
                   const char *const *unparked, cph_op *op) {
  size_t nk = 0, np = 0, nu = 0;
  while (keep && keep[nk])
    nk++;
  while (parked && parked[np])
    np++;
  while (unparked && unparked[nu])
    nu++;
  *op = (cph_op){0};
  op->kind = CPH_OP_INBOX_RETAIN;
  op->u.retain.session = "r";
  op->u.retain.keep = keep;
  op->u.retain.n_keep = nk;
  op->u.retain.parked = parked;
  op->u.retain.n_parked = np;
  op->u.retain.unparked = unparked;
  op->u.retain.n_unparked = nu;
  assert_int_equal(cph_fixture_run(f, op), CPH_OK);
}

static void test_park_keys_a_retain_settles_the_turns_parked_here_by_the_logs_marks(
    void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("park_retain", "{}");
  cph_fixture_create_session(f, "r", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  cph_op op;
  post(f, "r", "p", true, &op); /* stays: parked by its marks */
  cph_op_clear_results(&op);
  post(f, "r", "u", true, &op); /* requeued elsewhere, not consumed */
  cph_op_clear_results(&op);
  post(f, "r", "n", true, &op); /* no mark: kept parked, its keys held */
  cph_op_clear_results(&op);
  post(f, "r", "d", true, &op); /* consumed elsewhere: gone from the replay */
  cph_op_clear_results(&op);
  uint64_t id = 0;
  uint32_t attempts = 0;
  assert_int_equal(parked_of(f, "r", &id, &attempts), 4);
  const char *keep[] = {"p-0", "p-1", "p-2", "p-3", "p-4", "u-0", "u-1", "u-2",
                        "u-3", "u-4", "n-2", NULL};
  const char *parked[] = {"p-0", "p-1", "p-2", "p-3", "p-4", NULL};
  const char *unparked[] = {"u-0", "u-1", "u-2", "u-3", "u-4", NULL};
  retain(f, keep, parked, unparked, &op);
  assert_int_equal(op.u.retain.parked_requeued, 1);
  assert_int_equal(op.u.retain.parked_dropped, 1);
  assert_int_equal(op.u.retain.held.count, 1);
  assert_string_equal(op.u.retain.held.items[0], "n-2");
  cph_op_clear_results(&op);
  assert_int_equal(parked_of(f, "r", &id, &attempts), 2);
  cph_strv live = {0};
  cph_err err = {0};
  assert_int_equal(cph_engine_inbox_keys(f->e, "r", &live, &err), CPH_OK);
  assert_keys(&live, "u"); /* the requeued turn's, staged again */
  cph_strv_free(&live);
  cph_op lease;
  assert_int_equal(lease_now(f, &lease), CPH_OK);
  assert_int_equal(lease.u.lease.turn.n_staged, N);
  cph_op_clear_results(&lease);

  /* a delete names what its parked turns still hold */
  cph_fixture_free(f);
  f = cph_fixture_new("park_delete", "{}");
  cph_fixture_create_session(f, "r", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  post(f, "r", "x", true, &op);
  cph_op_clear_results(&op);
  cph_op del = {0};
  del.kind = CPH_OP_SESSION_DELETE;
  del.u.session.in.id = "r";
  assert_int_equal(cph_fixture_run(f, &del), CPH_OK);
  assert_keys(&del.u.session.consumed, "x");
  cph_op_clear_results(&del);
  cph_fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_park_keys_a_parking_fail_an_expiry_and_a_requeue_name_their_events),
      cmocka_unit_test(
          test_park_keys_an_ingest_parks_what_another_node_parked_until_a_requeue),
      cmocka_unit_test(
          test_park_keys_a_retain_settles_the_turns_parked_here_by_the_logs_marks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
