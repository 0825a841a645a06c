/* The engine through its public API, on a virtual clock and a temp LMDB: the inbox timelines,
 * routing, the queue cap, idempotency, leases, parking, replies and restart recovery
 * (DESIGN §3.6, §4). */
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
#include "store/records.h"
#include "store/keys.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :leases {:ttl-seconds 5 :max-attempts 2}\n"
                            " :sessions {:max-queue 3 :max-batch 64 :janitor? false}\n"
                            " :store {:sync :none}}\n";

typedef cph_fixture fixture;

static int setup(void **state) {
  *state = cph_fixture_new("engine", POLICY);
  return 0;
}

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

static void create_session(fixture *f, const char *id, cph_lane lane, const char *subscribe,
                           uint32_t autonomy_s) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = lane;
  char *subs[1] = {(char *)subscribe};
  if (subscribe) {
    op.u.session.in.subscribe.items = subs;
    op.u.session.in.subscribe.count = 1;
  }
  op.u.session.in.autonomy_interval_s = autonomy_s;
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

typedef struct post_spec {
  const char *channel, *sender, *body, *session, *mention, *key;
} post_spec;

/* Posts events in one request; returns the first result's status, fills ids. */
static void post_many(fixture *f, const post_spec *specs, size_t n, uint64_t *ids,
                      cph_ingest_status *statuses) {
  cph_event_in *evs = calloc(n, sizeof *evs);
  char **mentions = calloc(n, sizeof *mentions);
  for (size_t i = 0; i < n; i++) {
    evs[i].channel = (char *)specs[i].channel;
    evs[i].sender = (char *)(specs[i].sender ? specs[i].sender : "user");
    evs[i].body = (char *)specs[i].body;
    evs[i].session = (char *)specs[i].session;
    evs[i].key = (char *)specs[i].key;
    if (specs[i].mention) {
      mentions[i] = (char *)specs[i].mention;
      evs[i].mentions.items = &mentions[i];
      evs[i].mentions.count = 1;
    }
  }
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = evs;
  op.u.ingest.n_events = n;
  if (cph_fixture_run(f, &op))
    fail_msg("ingest: %s", op.err.msg);
  for (size_t i = 0; i < n; i++) {
    if (ids)
      ids[i] = op.u.ingest.results[i].id;
    if (statuses)
      statuses[i] = op.u.ingest.results[i].status;
  }
  cph_op_clear_results(&op);
  free(evs);
  free(mentions);
}

static uint64_t post(fixture *f, const char *channel, const char *body) {
  post_spec s = {channel, NULL, body, NULL, NULL, NULL};
  uint64_t id;
  post_many(f, &s, 1, &id, NULL);
  return id;
}

/* A lease request that waits up to wait_s of virtual time; the caller frees with
 * cph_op_clear_results. Returns the op's rc after one pass. */
static int lease(fixture *f, cph_op *op, int64_t wait_s) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w1";
  op->u.lease.deadline_ns = cph_clock_now(&f->clock) + wait_s * CPH_NS_PER_S;
  return cph_fixture_run(f, op);
}

static int turn_op(fixture *f, cph_op_kind kind, const cph_turn_info *t, const char *lease_hex,
                   const char *reply, uint64_t tool_calls, cph_op *out) {
  memset(out, 0, sizeof *out);
  out->kind = kind;
  out->u.turn.turn_id = t->id;
  snprintf(out->u.turn.lease, sizeof out->u.turn.lease, "%s", lease_hex ? lease_hex : t->lease);
  out->u.turn.reply_body = (char *)reply;
  out->u.turn.tool_calls = tool_calls;
  return cph_fixture_run(f, out);
}

static void get_session(fixture *f, const char *id, cph_session_info *out) {
  cph_err err;
  if (cph_engine_get_session(f->e, id, out, &err))
    fail_msg("get %s: %s", id, err.msg);
}

/* ---------------------------------------------------------------- tests */

static void test_message_pending_at_pass_start_waits_for_the_next_pass(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  post(f, "general", "first"); /* pass 1 stages it */

  /* Pass 2 gets a lease request and a second message together: agent_turn runs first and
   * hands out a turn with only the first message; poll_inbox stages the second after. */
  cph_op lease_op = {0}, ing = {0};
  lease_op.kind = CPH_OP_LEASE;
  lease_op.u.lease.worker = "w1";
  lease_op.u.lease.deadline_ns = cph_clock_now(&f->clock) + 10 * CPH_NS_PER_S;
  int called = 0;
  lease_op.done = cph_fixture_count_done;
  lease_op.ctx = &called;
  cph_event_in ev = {.channel = "general", .sender = "user", .body = "second"};
  ing.kind = CPH_OP_INGEST;
  ing.u.ingest.events = &ev;
  ing.u.ingest.n_events = 1;
  ing.done = cph_fixture_count_done;
  ing.ctx = &called;
  assert_int_equal(cph_engine_submit(f->e, &ing), CPH_OK);
  assert_int_equal(cph_engine_submit(f->e, &lease_op), CPH_OK);
  cph_engine_run_pass(f->e);
  assert_int_equal(called, 2);
  assert_int_equal(lease_op.rc, CPH_OK);
  cph_turn_info *t = &lease_op.u.lease.turn;
  assert_int_equal(t->kind, CPH_KIND_INBOX);
  assert_string_equal(t->input, "inbox:first");
  assert_int_equal(t->n_staged, 1);
  assert_true(cph_engine_pass_wanted(f->e)); /* it staged: the next pass runs at once */

  cph_op done;
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, t, NULL, NULL, 0, &done), CPH_OK);
  cph_op next;
  assert_int_equal(lease(f, &next, 10), CPH_OK);
  assert_string_equal(next.u.lease.turn.input, "inbox:second");
  cph_op_clear_results(&lease_op);
  cph_op_clear_results(&ing);
  cph_op_clear_results(&next);
}

static void test_autonomy_tick_has_its_input_and_no_obligations(void **state) {
  fixture *f = *state;
  create_session(f, "auto", CPH_LANE_OPERATIONAL, NULL, 60);
  cph_op op;
  assert_int_equal(lease(f, &op, 0), CPH_ETIMEDOUT); /* nothing due yet */
  cph_clock_advance(&f->clock, 60 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e); /* reconcile finds the tick due */
  assert_int_equal(lease(f, &op, 10), CPH_OK);
  cph_turn_info *t = &op.u.lease.turn;
  assert_int_equal(t->kind, CPH_KIND_AUTONOMY_TICK);
  assert_string_equal(t->input, "autonomy_tick");
  assert_int_equal(t->n_staged, 0);  /* pending_obligations: none */
  assert_int_equal(t->n_history, 0); /* conversation_history: none */
  cph_op_clear_results(&op);
}

static void test_mentions_are_staged_first(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  create_session(f, "bystander", CPH_LANE_INTERACTIVE, NULL, 0);
  post_spec specs[] = {{"general", NULL, "a", NULL, NULL, NULL},
                       {"general", NULL, "b", NULL, NULL, NULL},
                       {"general", NULL, "c", NULL, "s1", NULL},
                       {"general", NULL, "d", NULL, "bystander", NULL}};
  cph_ingest_status st[4];
  post_many(f, specs, 4, NULL, st);
  assert_int_equal(st[0], CPH_EV_QUEUED);
  cph_op op;
  assert_int_equal(lease(f, &op, 10), CPH_OK);
  cph_turn_info *t = &op.u.lease.turn;
  if (strcmp(t->session, "s1") == 0) {
    assert_string_equal(t->input, "inbox:c\na\nb\nd");
    assert_true(t->staged[0].mentioned);
    assert_false(t->staged[1].mentioned);
  } else {
    /* the mentioned member got exactly the message that named it */
    assert_string_equal(t->input, "inbox:d");
  }
  cph_op_clear_results(&op);
}

static void test_queue_cap_folds_oldest_unmentioned_into_one_counted_entry(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  /* max-queue 3: the 4th message turns u1 into the overflow entry and folds u2 into it, the
   * 5th folds u3 — never the mention; every event stays counted (DESIGN §4, §5) */
  post_spec specs[] = {{"general", NULL, "m1", NULL, "s1", NULL},
                       {"general", NULL, "u1", NULL, NULL, NULL},
                       {"general", NULL, "u2", NULL, NULL, NULL},
                       {"general", NULL, "u3", NULL, NULL, NULL},
                       {"general", NULL, "u4", NULL, NULL, NULL}};
  uint64_t ids[5];
  post_many(f, specs, 5, ids, NULL);
  cph_session_info s;
  get_session(f, "s1", &s);
  assert_int_equal(s.folded, 3);
  assert_int_equal(s.pending + s.staged, 3);
  cph_session_info_free(&s);
  cph_op op;
  assert_int_equal(lease(f, &op, 10), CPH_OK);
  cph_turn_info *t = &op.u.lease.turn;
  assert_int_equal(t->n_staged, 3);
  assert_string_equal(t->staged[0].body, "m1");
  assert_int_equal(t->staged[1].count, 3);
  assert_string_equal(t->staged[1].fold, "overflow");
  assert_int_equal(t->staged[1].n_event_ids, 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(t->staged[1].event_ids[i], ids[1 + i]);
  assert_non_null(strstr(t->staged[1].body, "3 older messages folded by the queue cap"));
  assert_non_null(strstr(t->staged[1].body, ": u1"));
  assert_non_null(strstr(t->staged[1].body, ": u3"));
  assert_string_equal(t->staged[2].body, "u4");
  assert_true(strncmp(t->input, "inbox:m1\n3 older messages", 25) == 0);
  cph_op_clear_results(&op);
}

static void test_idempotency_key_stores_once(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  post_spec one = {"general", NULL, "hello", NULL, NULL, "key-1"};
  uint64_t id1, id2;
  cph_ingest_status st1, st2;
  post_many(f, &one, 1, &id1, &st1);
  post_many(f, &one, 1, &id2, &st2);
  assert_int_equal(st1, CPH_EV_QUEUED);
  assert_int_equal(st2, CPH_EV_DUPLICATE);
  assert_int_equal(id1, id2);
  cph_session_info s;
  get_session(f, "s1", &s);
  assert_int_equal(s.pending + s.staged, 1);
  cph_session_info_free(&s);
}

static void test_event_without_route_is_stored_and_bad_ones_rejected(void **state) {
  fixture *f = *state;
  post_spec specs[] = {{"nobody-here", NULL, "x", NULL, NULL, NULL},
                       {NULL, NULL, "x", NULL, NULL, NULL},
                       {"c", NULL, "x", "ghost", NULL, NULL}};
  cph_event_in ev[3] = {{0}};
  for (int i = 0; i < 3; i++) {
    ev[i].channel = (char *)specs[i].channel;
    ev[i].sender = "u";
    ev[i].body = (char *)specs[i].body;
    ev[i].session = (char *)specs[i].session;
  }
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = ev;
  op.u.ingest.n_events = 3;
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  assert_int_equal(op.u.ingest.results[0].status, CPH_EV_STORED);
  assert_true(op.u.ingest.results[0].id > 0);
  assert_int_equal(op.u.ingest.results[1].status, CPH_EV_REJECTED);
  assert_string_equal(op.u.ingest.results[1].field, "channel");
  assert_int_equal(op.u.ingest.results[2].status, CPH_EV_REJECTED);
  assert_string_equal(op.u.ingest.results[2].field, "session");
  cph_op_clear_results(&op);
}

static void test_expired_lease_stages_input_again_for_the_next_worker(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  post(f, "general", "work");
  cph_op first;
  assert_int_equal(lease(f, &first, 10), CPH_OK);
  assert_int_equal(first.u.lease.turn.attempts, 1);
  cph_clock_advance(&f->clock, 6 * CPH_NS_PER_S); /* past the 5 s ttl */
  cph_engine_run_pass(f->e);
  cph_op second;
  assert_int_equal(lease(f, &second, 10), CPH_OK);
  assert_string_equal(second.u.lease.turn.input, "inbox:work");
  assert_int_equal(second.u.lease.turn.attempts, 2);
  /* the first worker is too late */
  cph_op late;
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &first.u.lease.turn, NULL, NULL, 0, &late),
                   CPH_ECONFLICT);
  cph_op_clear_results(&first);
  cph_op_clear_results(&second);
}

static void test_complete_is_idempotent_and_a_wrong_lease_conflicts(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  post(f, "general", "ask");
  cph_op l;
  assert_int_equal(lease(f, &l, 10), CPH_OK);
  cph_op c;
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, "00000000000000000000000000000000",
                           "no", 0, &c),
                   CPH_ECONFLICT);
  assert_string_equal(c.field, "lease");
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, "answer", 2, &c), CPH_OK);
  assert_false(c.u.turn.already);
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, "answer", 2, &c), CPH_OK);
  assert_true(c.u.turn.already);
  /* one reply, not two */
  cph_reply_info *r;
  size_t n;
  uint64_t next;
  cph_err err;
  assert_int_equal(cph_engine_replies(f->e, 0, 10, &r, &n, &next, &err), CPH_OK);
  assert_int_equal(n, 1);
  assert_string_equal(r[0].body, "answer");
  assert_string_equal(r[0].channel, "general");
  assert_int_equal(r[0].n_source_inbox_ids, 1);
  assert_int_equal(r[0].source_inbox_ids[0], l.u.lease.turn.staged[0].id);
  assert_int_equal(next, r[0].id);
  cph_reply_info_free(&r[0]);
  free(r);
  /* credits charged once: max 30 - cost 2 */
  cph_session_info s;
  get_session(f, "s1", &s);
  assert_true(s.credits > 27.999 && s.credits < 28.001);
  assert_int_equal(s.episode, 1);
  assert_int_equal(s.staged + s.pending, 0);
  cph_session_info_free(&s);
  cph_op_clear_results(&l);
}

static void test_turn_is_parked_after_max_attempts_and_requeue_brings_it_back(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  post(f, "general", "poison");
  for (int attempt = 0; attempt < 2; attempt++) {
    cph_op l, fl;
    assert_int_equal(lease(f, &l, 10), CPH_OK);
    assert_int_equal(turn_op(f, CPH_OP_FAIL, &l.u.lease.turn, NULL, NULL, 0, &fl), CPH_OK);
    cph_op_clear_results(&l);
  }
  cph_parked_turn *p;
  size_t n;
  cph_err err;
  assert_int_equal(cph_engine_parked_turns(f->e, &p, &n, &err), CPH_OK);
  assert_int_equal(n, 1);
  assert_string_equal(p[0].session, "s1");
  assert_int_equal(p[0].n_inbox_ids, 1);
  uint64_t parked_id = p[0].id;
  cph_parked_turn_free(&p[0]);
  free(p);
  cph_op none;
  assert_int_equal(lease(f, &none, 0), CPH_ETIMEDOUT); /* nothing left to run */

  cph_op rq = {0};
  rq.kind = CPH_OP_REQUEUE;
  rq.u.turn.turn_id = parked_id;
  assert_int_equal(cph_fixture_run(f, &rq), CPH_OK);
  assert_int_equal(cph_fixture_run(f, &rq), CPH_ECONFLICT); /* not parked any more */
  assert_int_equal(cph_engine_parked_turns(f->e, &p, &n, &err), CPH_OK);
  assert_int_equal(n, 0);
  free(p);
  cph_op again;
  assert_int_equal(lease(f, &again, 10), CPH_OK);
  assert_string_equal(again.u.lease.turn.input, "inbox:poison");
  cph_op_clear_results(&again);
}

/* s1's ended turns (cph_engine_session_turn_records), newest first: "state:error" each,
 * comma-separated, into out. */
static void turn_history(fixture *f, char *out, size_t cap) {
  cph_turn_record *recs = NULL;
  size_t n = 0, at = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_session_turn_records(f->e, "s1", 100, &recs, &n, &err), CPH_OK);
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    at += (size_t)snprintf(out + at, cap - at, "%s%s:%s", i ? "," : "", recs[i].state,
                           recs[i].error ? recs[i].error : "");
    cph_turn_record_free(&recs[i]);
  }
  free(recs);
}

/* GET /v1/turns?session= lists every turn the session leased once it ended, however it ended:
 * completed, failed, parked (then requeued), expired, superseded by input that arrived while
 * it ran (while_running :restart), and expired by a restart — before, only completed and
 * failed turns were listed, and the others had no place among the session's turns. */
static void test_a_sessions_turn_list_holds_every_turn_however_it_ended(void **state) {
  fixture *f = *state;
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = "s1";
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  op.u.session.in.while_running = CPH_POLICY_WR_RESTART;
  op.u.session.set = CPH_SET_WHILE_RUNNING;
  char *subs[1] = {"general"};
  op.u.session.in.subscribe.items = subs;
  op.u.session.in.subscribe.count = 1;
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  cph_op_clear_results(&op);
  cph_op l, done;
  post(f, "general", "one"); /* completed */
  assert_int_equal(lease(f, &l, 10), CPH_OK);
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, "ok", 0, &done), CPH_OK);
  cph_op_clear_results(&done);
  cph_op_clear_results(&l);
  post(f, "general", "two"); /* failed, then parked (:max-attempts 2) */
  for (int attempt = 0; attempt < 2; attempt++) {
    assert_int_equal(lease(f, &l, 10), CPH_OK);
    cph_op fl = {0};
    fl.kind = CPH_OP_FAIL;
    fl.u.turn.turn_id = l.u.lease.turn.id;
    memcpy(fl.u.turn.lease, l.u.lease.turn.lease, sizeof fl.u.turn.lease);
    fl.u.turn.error = attempt ? "down again" : "down";
    assert_int_equal(cph_fixture_run(f, &fl), CPH_OK);
    cph_op_clear_results(&fl);
    cph_op_clear_results(&l);
    cph_clock_advance(&f->clock, 120 * CPH_NS_PER_S); /* past the retry's backoff */
  }
  char got[512];
  turn_history(f, got, sizeof got);
  assert_string_equal(got, "parked:down again,failed:down,completed:");
  cph_parked_turn *p;
  size_t n;
  cph_err err;
  assert_int_equal(cph_engine_parked_turns(f->e, &p, &n, &err), CPH_OK);
  assert_int_equal(n, 1);
  cph_op rq = {0};
  rq.kind = CPH_OP_REQUEUE;
  rq.u.turn.turn_id = p[0].id;
  cph_parked_turn_free(&p[0]);
  free(p);
  assert_int_equal(cph_fixture_run(f, &rq), CPH_OK);
  cph_op_clear_results(&rq);
  assert_int_equal(lease(f, &l, 10), CPH_OK); /* expired */
  cph_clock_advance(&f->clock, 6 * CPH_NS_PER_S); /* past the 5 s ttl */
  cph_engine_run_pass(f->e);
  cph_op_clear_results(&l);
  cph_clock_advance(&f->clock, 120 * CPH_NS_PER_S);
  assert_int_equal(lease(f, &l, 10), CPH_OK); /* superseded by what arrives now */
  post(f, "general", "three");
  cph_op_clear_results(&l);
  assert_int_equal(lease(f, &l, 10), CPH_OK); /* in flight at a restart */
  cph_op_clear_results(&l);
  cph_engine_close(f->e);
  cph_fixture_open(f);
  turn_history(f, got, sizeof got);
  assert_string_equal(got, "expired:lease ended by a restart,"
                           "superseded:superseded: input arrived (while_running restart),"
                           "expired:lease expired,requeued:down again,failed:down,completed:");
}

static void test_restart_keeps_sessions_inbox_credits_and_expires_leases(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  create_session(f, "s2", CPH_LANE_OPERATIONAL, "ops", 0);
  post(f, "general", "one");
  cph_op l, c;
  assert_int_equal(lease(f, &l, 10), CPH_OK);
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, "done", 0, &c), CPH_OK);
  cph_op_clear_results(&l);
  post(f, "general", "two");
  post(f, "ops", "three");
  cph_op inflight;
  assert_int_equal(lease(f, &inflight, 10), CPH_OK); /* leased when the daemon stops */
  char leased_session[16];
  snprintf(leased_session, sizeof leased_session, "%s", inflight.u.lease.turn.session);
  cph_op_clear_results(&inflight);

  cph_engine_close(f->e);
  cph_fixture_open(f);

  cph_session_info s;
  get_session(f, "s1", &s);
  assert_int_equal(s.episode, 1);
  assert_true(s.credits > 27.9 && s.credits <= 30.0);
  assert_int_equal(s.subscribe.count, 1);
  cph_session_info_free(&s);
  /* both messages are staged: the one in flight was given back */
  cph_op a, b;
  assert_int_equal(lease(f, &a, 10), CPH_OK);
  assert_int_equal(lease(f, &b, 10), CPH_OK);
  const char *inputs[2] = {a.u.lease.turn.input, b.u.lease.turn.input};
  bool saw_two = false, saw_three = false;
  for (int i = 0; i < 2; i++) {
    saw_two |= strcmp(inputs[i], "inbox:two") == 0;
    saw_three |= strcmp(inputs[i], "inbox:three") == 0;
  }
  assert_true(saw_two && saw_three);
  cph_reply_info *r;
  size_t n;
  uint64_t next;
  cph_err err;
  assert_int_equal(cph_engine_replies(f->e, 0, 10, &r, &n, &next, &err), CPH_OK);
  assert_int_equal(n, 1);
  cph_reply_info_free(&r[0]);
  free(r);
  cph_op_clear_results(&a);
  cph_op_clear_results(&b);
}

/* Counts the inbox records in f's data dir by status (the engine must be closed). */
static void inbox_on_disk(fixture *f, uint32_t counts[CPH_INBOX_STATUS_COUNT]) {
  memset(counts, 0, CPH_INBOX_STATUS_COUNT * sizeof *counts);
  cph_store_options so = {f->dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st;
  cph_err err;
  if (cph_store_open(&so, &st, &err))
    fail_msg("store: %s", err.msg);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, false, &t), CPH_OK);
  cph_cursor c;
  cph_val k, v;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_INBOX, &c), CPH_OK);
  for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    cph_inbox_rec r;
    assert_int_equal(cph_record_decode(&cph_inbox_desc, v.data, v.len, &r, &err), CPH_OK);
    assert_true(r.status < CPH_INBOX_STATUS_COUNT);
    counts[r.status]++;
    cph_record_free(&cph_inbox_desc, &r);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  cph_store_close(st);
}

/* Writes an inbox record `pending`, as earlier versions did between ingest and poll_inbox
 * (a data dir they left after a failed staging). */
static void put_pending_inbox_record(fixture *f, const char *session, uint64_t seq,
                                     uint64_t event_id) {
  cph_store_options so = {f->dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st;
  cph_err err;
  if (cph_store_open(&so, &st, &err))
    fail_msg("store: %s", err.msg);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  cph_inbox_rec r = {(char *)session, seq, event_id, CPH_INBOX_PENDING, false, 0, 0, 1};
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, seq);
  assert_int_equal(cph_txn_put_record(&t, CPH_DB_INBOX, &k, &cph_inbox_desc, &r), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
}

static void test_inbox_message_is_written_staged_once_and_reopens_staged(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  post_spec specs[2] = {{"general", NULL, "alpha", NULL, NULL, NULL},
                        {"general", NULL, "beta", NULL, NULL, NULL}};
  uint64_t ids[2];
  post_many(f, specs, 2, ids, NULL);
  cph_session_info s;
  get_session(f, "s1", &s);
  assert_int_equal(s.pending, 0);
  assert_int_equal(s.staged, 2);
  cph_session_info_free(&s);

  /* On disk: written staged in the pass that staged them (no pending record was committed). */
  cph_engine_close(f->e);
  uint32_t counts[CPH_INBOX_STATUS_COUNT];
  inbox_on_disk(f, counts);
  assert_int_equal(counts[CPH_INBOX_STAGED], 2);
  assert_int_equal(counts[CPH_INBOX_PENDING], 0);

  /* A record left pending by an older version still loads pending and the first pass stages
   * it. */
  put_pending_inbox_record(f, "s1", 1000, ids[0]);
  cph_fixture_open(f);
  get_session(f, "s1", &s);
  assert_int_equal(s.pending, 1);
  assert_int_equal(s.staged, 2);
  cph_session_info_free(&s);
  cph_engine_run_pass(f->e);
  get_session(f, "s1", &s);
  assert_int_equal(s.pending, 0);
  assert_int_equal(s.staged, 3);
  cph_session_info_free(&s);

  cph_op l;
  assert_int_equal(lease(f, &l, 10), CPH_OK);
  assert_int_equal(l.u.lease.turn.n_staged, 3);
  assert_string_equal(l.u.lease.turn.input, "inbox:alpha\nbeta\nalpha");
  cph_op_clear_results(&l);
}

static void test_session_update_pause_and_delete(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  cph_op up = {0};
  up.kind = CPH_OP_SESSION_UPDATE;
  up.u.session.in.id = "s1";
  up.u.session.in.state = CPH_STATE_PAUSED;
  up.u.session.set = CPH_SET_PAUSED;
  assert_int_equal(cph_fixture_run(f, &up), CPH_OK);
  assert_int_equal(up.u.session.out.state, CPH_STATE_PAUSED);
  cph_op_clear_results(&up);
  post(f, "general", "while paused");
  cph_op l;
  assert_int_equal(lease(f, &l, 0), CPH_ETIMEDOUT);
  cph_why_info w;
  cph_err err;
  assert_int_equal(cph_engine_why(f->e, "s1", &w, &err), CPH_OK);
  assert_string_equal(w.reason, "paused");
  up.u.session.in.state = CPH_STATE_IDLE;
  assert_int_equal(cph_fixture_run(f, &up), CPH_OK);
  cph_op_clear_results(&up);
  assert_int_equal(lease(f, &l, 10), CPH_OK);
  cph_op del = {0};
  del.kind = CPH_OP_SESSION_DELETE;
  del.u.session.in.id = "s1";
  assert_int_equal(cph_fixture_run(f, &del), CPH_ESTATE); /* a running turn */
  cph_op c;
  assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, NULL, 0, &c), CPH_OK);
  assert_int_equal(cph_fixture_run(f, &del), CPH_OK);
  cph_session_info s;
  assert_int_equal(cph_engine_get_session(f->e, "s1", &s, &err), CPH_ENOTFOUND);
  cph_op dup = {0};
  dup.kind = CPH_OP_SESSION_CREATE;
  dup.u.session.in.id = "bad id!";
  assert_int_equal(cph_fixture_run(f, &dup), CPH_EINVAL);
  assert_string_equal(dup.field, "id");
  cph_op_clear_results(&l);
}

/* Each completed turn adds message cores to the session's PACT tree; the tree stays bounded
 * (deep history lives in the channel log), so a long-lived session does not slow down. */
static void test_context_tree_stays_bounded_over_many_turns(void **state) {
  fixture *f = *state;
  create_session(f, "s1", CPH_LANE_INTERACTIVE, "general", 0);
  for (int i = 0; i < 150; i++) {
    char body[32];
    snprintf(body, sizeof body, "message %d", i);
    cph_clock_advance(&f->clock, CPH_NS_PER_S); /* the lane refills a turn a second */
    post(f, "general", body);
    cph_op l, c;
    assert_int_equal(lease(f, &l, 10), CPH_OK);
    assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, "ok", 0, &c), CPH_OK);
    cph_op_clear_results(&l);
  }
  cph_context_node_info *nodes;
  size_t n;
  uint64_t episode;
  cph_err err;
  assert_int_equal(cph_engine_context(f->e, "s1", NULL, &nodes, &n, &episode, &err), CPH_OK);
  assert_int_equal(episode, 150);
  if (n > 130 || n < 100)
    fail_msg("%zu nodes (first at %s, last at %s)", n, n ? nodes[0].at : "-", n ? nodes[n - 1].at : "-");
  assert_true(n <= 130); /* 300 cores were added; at most 128 depths of history are kept */
  assert_true(n >= 100);
  for (size_t i = 0; i < n; i++)
    assert_true(atoi(nodes[i].at + 1) <= 128);
  /* the newest exchange is there, the input as its words (the "inbox:" marker is the wire's) */
  bool newest = false;
  for (size_t i = 0; i < n; i++) {
    newest |= strcmp(nodes[i].content, "message 149") == 0;
    assert_true(strncmp(nodes[i].content, "inbox:", 6) != 0);
  }
  assert_true(newest);
  cph_context_nodes_free(nodes, n);
}

/* ---- many sessions: the slab, the id index and the scheduler's shared ids ---- */

#define MANY 3000

/* Ids of many lengths (every string size class up to 48 bytes) that sort unlike their
 * creation order. */
static void many_id(int i, char *out, size_t cap) {
  snprintf(out, cap, "%.*s%d", i % 41, "ppppppppppppppppppppppppppppppppppppppppp", MANY - i);
}

typedef struct many_ops {
  cph_op op;
  char id[64];
  int called;
} many_ops;

/* Submits n session ops at once and runs passes until every one is answered; all must pass. */
static void run_batch(fixture *f, many_ops *ops, size_t n) {
  for (size_t i = 0; i < n; i++) {
    ops[i].op.done = cph_fixture_count_done;
    ops[i].op.ctx = &ops[i].called;
    assert_int_equal(cph_engine_submit(f->e, &ops[i].op), CPH_OK);
  }
  for (int pass = 0; pass < 100 && cph_engine_pass_wanted(f->e); pass++)
    cph_engine_run_pass(f->e);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(ops[i].called, 1);
    if (ops[i].op.rc)
      fail_msg("%s: %s", ops[i].id, ops[i].op.err.msg);
    cph_op_clear_results(&ops[i].op);
    memset(&ops[i], 0, sizeof ops[i]);
  }
}

/* What each session i should be after the steps of the test: 0 = deleted, else its lane + 1. */
static int many_expected(int i) {
  if (i % 3 == 0)
    return i % 6 == 0 ? CPH_LANE_OPERATIONAL + 1 : 0; /* deleted; every other one re-created */
  if (i % 5 == 0)
    return CPH_LANE_MAINTENANCE + 1; /* class changed */
  return CPH_LANE_INTERACTIVE + 1;
}

static void many_check(fixture *f) {
  char id[64];
  size_t live = 0;
  for (int i = 0; i < MANY; i++) {
    many_id(i, id, sizeof id);
    cph_session_info s;
    cph_err err;
    int rc = cph_engine_get_session(f->e, id, &s, &err);
    if (!many_expected(i)) {
      assert_int_equal(rc, CPH_ENOTFOUND);
      continue;
    }
    live++;
    if (rc)
      fail_msg("get %s: %s", id, err.msg);
    assert_string_equal(s.id, id);
    assert_int_equal(s.lane, many_expected(i) - 1);
    cph_session_info_free(&s);
    cph_why_info w;
    assert_int_equal(cph_engine_why(f->e, id, &w, &err), CPH_OK);
    assert_string_equal(w.reason, "no_input");
    assert_int_equal(w.lane, many_expected(i) - 1);
  }
  cph_session_filter all = {.limit = 1000};
  size_t listed = 0;
  char after[64] = "";
  for (;;) {
    cph_session_info *list;
    size_t n;
    cph_err err;
    all.after = after[0] ? after : NULL;
    assert_int_equal(cph_engine_list_sessions(f->e, &all, &list, &n, &err), CPH_OK);
    if (n)
      snprintf(after, sizeof after, "%s", list[n - 1].id);
    for (size_t i = 0; i < n; i++)
      cph_session_info_free(&list[i]);
    free(list);
    listed += n;
    if (n < all.limit)
      break;
  }
  assert_int_equal(listed, live);
}

/* Three inputs at once to interactive sessions: picked by id among equals (§3.3 d). The ids
 * are the scheduler's copies the engine borrows; the order proves they are intact. */
static void many_check_pick_order(fixture *f, int a, int b, int c) {
  char ids[3][64];
  many_id(a, ids[0], sizeof ids[0]);
  many_id(b, ids[1], sizeof ids[1]);
  many_id(c, ids[2], sizeof ids[2]);
  post_spec specs[3];
  for (int i = 0; i < 3; i++)
    specs[i] = (post_spec){NULL, NULL, "hello there", ids[i], NULL, NULL};
  post_many(f, specs, 3, NULL, NULL);
  cph_engine_run_pass(f->e); /* staged */
  const char *sorted[3] = {ids[0], ids[1], ids[2]};
  for (int i = 0; i < 3; i++)
    for (int j = i + 1; j < 3; j++)
      if (strcmp(sorted[j], sorted[i]) < 0) {
        const char *t = sorted[i];
        sorted[i] = sorted[j];
        sorted[j] = t;
      }
  for (int i = 0; i < 3; i++) {
    cph_op l, c2;
    assert_int_equal(lease(f, &l, 10), CPH_OK);
    assert_string_equal(l.u.lease.turn.session, sorted[i]);
    assert_int_equal(turn_op(f, CPH_OP_COMPLETE, &l.u.lease.turn, NULL, NULL, 0, &c2), CPH_OK);
    cph_op_clear_results(&c2);
    cph_op_clear_results(&l);
  }
}

static void test_many_sessions_keep_ids_and_state_across_delete_class_change_and_reload(
    void **state) {
  fixture *f = *state;
  many_ops *ops = calloc(MANY, sizeof *ops);
  size_t n = 0;
  for (int i = 0; i < MANY; i++, n++) {
    many_id(i, ops[n].id, sizeof ops[n].id);
    ops[n].op.kind = CPH_OP_SESSION_CREATE;
    ops[n].op.u.session.in.id = ops[n].id;
    ops[n].op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  }
  run_batch(f, ops, n);
  n = 0;
  for (int i = 0; i < MANY; i++) {
    if (i % 3 && i % 5)
      continue;
    many_id(i, ops[n].id, sizeof ops[n].id);
    ops[n].op.u.session.in.id = ops[n].id;
    if (i % 3 == 0) {
      ops[n].op.kind = CPH_OP_SESSION_DELETE;
    } else {
      ops[n].op.kind = CPH_OP_SESSION_UPDATE;
      ops[n].op.u.session.in.lane = CPH_LANE_MAINTENANCE;
      ops[n].op.u.session.set = CPH_SET_CLASS;
    }
    n++;
  }
  run_batch(f, ops, n);
  n = 0;
  for (int i = 0; i < MANY; i += 6, n++) { /* ids back, into freed slots and slab objects */
    many_id(i, ops[n].id, sizeof ops[n].id);
    ops[n].op.kind = CPH_OP_SESSION_CREATE;
    ops[n].op.u.session.in.id = ops[n].id;
    ops[n].op.u.session.in.lane = CPH_LANE_OPERATIONAL;
  }
  run_batch(f, ops, n);
  free(ops);

  many_check(f);
  many_check_pick_order(f, 1, 2, 4); /* ids "p" + 2999, "pp" + 2998, "pppp" + 2996 */
  cph_engine_close(f->e);
  cph_fixture_open(f);
  many_check(f);
  many_check_pick_order(f, 7, 41, 43); /* "p"*7 + 2993, "" + 2959, "pp" + 2957 */
  cph_session_info s;
  get_session(f, "p2999", &s); /* episode and credits came back */
  assert_int_equal(s.episode, 1);
  assert_true(s.credits >= 27.9 && s.credits <= 30.0);
  cph_session_info_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_message_pending_at_pass_start_waits_for_the_next_pass,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_autonomy_tick_has_its_input_and_no_obligations, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_mentions_are_staged_first, setup, teardown),
      cmocka_unit_test_setup_teardown(test_queue_cap_folds_oldest_unmentioned_into_one_counted_entry,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_key_stores_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_without_route_is_stored_and_bad_ones_rejected,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_expired_lease_stages_input_again_for_the_next_worker,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_complete_is_idempotent_and_a_wrong_lease_conflicts,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_turn_is_parked_after_max_attempts_and_requeue_brings_it_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_sessions_turn_list_holds_every_turn_however_it_ended,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_restart_keeps_sessions_inbox_credits_and_expires_leases, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_inbox_message_is_written_staged_once_and_reopens_staged, setup, teardown),
      cmocka_unit_test_setup_teardown(test_session_update_pause_and_delete, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_many_sessions_keep_ids_and_state_across_delete_class_change_and_reload, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_context_tree_stays_bounded_over_many_turns, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
