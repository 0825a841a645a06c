/* A session's records move whole, as a property (server/clusterflow.h 13.; core/handover.c,
 * "Items"): a node ("x", cluster mode) runs a session through a seeded mix of completed turns
 * (each with zero to two memories of its worker, some texts repeated), failed turns, turns
 * whose lease expired (both parked when their input ran out of :leases :max-attempts, 1, 2 or
 * 5 per case), requeues of parked turns, turns superseded by input arriving while they ran
 * (while_running :restart) and seals,
 * keeping every item its completions, failures, requeues, seals and the turns that ended with no
 * operation (cph_engine_take_ended_items) give, and the last state they left (a
 * failure puts no state: one after the last completion moves as its item alone). Another node
 * ("y") takes the session over from the state and the items, handed in a random order with
 * some of them twice — as a takeover reads them from the log. Then y lists exactly x's turn
 * records, seals and the worker's memories: each origin once, in the order x made them, each
 * memory once (twice when x has it twice) with the time it was made — and the kept turn
 * contexts (the explorer's) of x's newest :context :keep-turns ended turns (1 to 8, drawn per
 * case), however they ended, each under its turn's origin with its messages: they move
 * as items in a ring of keep-turns slots (handover_kept_item), of which the log keeps each
 * slot's last put (as the hand-over below does). A turn x parked is history on y: listed with
 * its state, in no parked list there, and a requeue of it is refused. Handed the items again
 * (another order), or the state again, y lists the same.
 *
 * CPH_PROPERTY_SEED=<n> runs from that seed; CPH_PROPERTY_CASES=<n> sets how many cases. A
 * failure prints the case's seed. */
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
#include "tests/support/prop.h"

#define DEFAULT_CASES 120

static const char POLICY[] =
    "{:scheduler {:lanes {:interactive {:turns 100000 :tool-calls 100000 :tokens 100000000}}}}";

typedef struct run {
  uint64_t seed;
  cph_fixture_items items;
  uint8_t *state;
  size_t state_len;
} run;

#define CHECK(cond, ...) CPH_PROP_CHECK(R->seed, cond, __VA_ARGS__)

static cph_fixture *node(const char *tag, const char *name, const char *policy) {
  cph_fixture *f = cph_fixture_new(tag, policy);
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  assert_int_equal(cph_engine_reply_origins(f->e, name), CPH_OK);
  return f;
}

/* Ann asks "a" on x: text. */
static void ask(cph_fixture *x, char *text) {
  cph_event_in ev = {0};
  ev.session = "a";
  ev.sender = "ann";
  ev.body = text;
  cph_op in;
  cph_fixture_ingest(x, &ev, 1, &in);
  cph_op_clear_results(&in);
}

/* Ann asks "a" on x "question <i>", and a worker leases the turn (into lease). */
static void ask_and_lease(cph_fixture *x, int i, cph_op *lease) {
  char body[48];
  snprintf(body, sizeof body, "question %d", i);
  ask(x, body);
  cph_fixture_lease(x, "w", lease);
}

/* The items of the turns that ended on x with no operation (an expiry, a supersede), in the
 * order they were made among the others. */
static void take_ended(run *R, cph_fixture *x) {
  cph_session_items *v = NULL;
  size_t n = 0;
  CHECK(cph_engine_take_ended_items(x->e, &v, &n) == CPH_OK, "taking the ended turns' items");
  for (size_t i = 0; i < n; i++) {
    CHECK(strcmp(v[i].session, "a") == 0, "items of session %s", v[i].session);
    cph_fixture_items_take(&R->items, &v[i].items);
    cph_session_items_free(&v[i]);
  }
  free(v);
}

/* A question to "a" on x, leased, then left: with `supersede` another question arrives while
 * it runs (while_running :restart revokes it), else its lease runs out (an attempt counted:
 * parked when its input ran out of them). Either way it ends with no operation of its own,
 * and its record and kept context come as ended turns' items. */
static void turn_left(run *R, cph_fixture *x, int i, bool supersede) {
  cph_op lease;
  ask_and_lease(x, i, &lease);
  take_ended(R, x);
  if (supersede) {
    char body[48];
    snprintf(body, sizeof body, "question %d again", i);
    ask(x, body);
  } else {
    cph_clock_advance(&x->clock, 31 * CPH_NS_PER_S); /* past :leases :ttl-seconds 30 */
    cph_engine_run_pass(x->e);
    cph_clock_advance(&x->clock, 120 * CPH_NS_PER_S); /* past the retry's backoff */
  }
  size_t before = R->items.n;
  take_ended(R, x);
  size_t records = 0;
  for (size_t k = before; k < R->items.n; k++)
    records += R->items.v[k].name[0] == 't';
  CHECK(records == 1, "turn %d %s gave %zu turn record items", i,
        supersede ? "superseded" : "expired", records);
  cph_op_clear_results(&lease);
}

/* Requeues x's oldest parked turn, if it has one: its record, "requeued" now, is its item. */
static void requeue_one(run *R, cph_fixture *x) {
  cph_parked_turn *p = NULL;
  size_t n = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_parked_turns(x->e, &p, &n, &err), CPH_OK);
  if (n) {
    cph_op op = {0};
    op.kind = CPH_OP_REQUEUE;
    op.u.turn.turn_id = p[0].id;
    CHECK(cph_fixture_run(x, &op) == CPH_OK, "requeueing turn %llu: %s",
          (unsigned long long)p[0].id, op.err.msg);
    CHECK(op.u.turn.items.n == 1 && op.u.turn.items.v[0].name[0] == 't',
          "the requeue of turn %llu gave %zu items", (unsigned long long)p[0].id,
          op.u.turn.items.n);
    cph_fixture_items_take(&R->items, &op.u.turn.items);
    cph_op_clear_results(&op);
  }
  for (size_t i = 0; i < n; i++)
    cph_parked_turn_free(&p[i]);
  free(p);
}

static void take_state(run *R, uint8_t **state, size_t *len) {
  if (!*state)
    return;
  free(R->state);
  R->state = *state;
  R->state_len = *len;
  *state = NULL;
}

/* A question to "a" on x, leased, then completed with a reply and n_memories memories of its
 * worker ("note <i>.<k>", or "note again" when repeat) or failed. */
static void turn(run *R, cph_fixture *x, int i, bool fail, int n_memories, bool repeat) {
  char reply[48];
  snprintf(reply, sizeof reply, "answer %d", i);
  cph_op lease;
  ask_and_lease(x, i, &lease);
  cph_op done = {0};
  done.kind = fail ? CPH_OP_FAIL : CPH_OP_COMPLETE;
  done.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
  char notes[2][32];
  cph_memory_in mems[2] = {{0}};
  for (int k = 0; k < n_memories; k++) {
    snprintf(notes[k], sizeof notes[k], repeat && k == 0 ? "note again" : "note %d.%d", i, k);
    mems[k].text = notes[k];
  }
  if (fail) {
    done.u.turn.error = "timed out";
  } else {
    done.u.turn.reply_body = reply;
    done.u.turn.memories = mems;
    done.u.turn.n_memories = (size_t)n_memories;
  }
  CHECK(cph_fixture_run(x, &done) == CPH_OK, "turn %d: %s", i, done.err.msg);
  done.u.turn.reply_body = NULL;
  done.u.turn.error = NULL;
  done.u.turn.memories = NULL;
  done.u.turn.n_memories = 0;
  size_t records = 0;
  for (size_t k = 0; k < done.u.turn.items.n; k++)
    records += done.u.turn.items.v[k].name[0] == 't';
  CHECK(fail ? records == 1 : records >= 1, "%s %d gave %zu turn record items",
        fail ? "failure" : "completion", i, records);
  cph_fixture_items_take(&R->items, &done.u.turn.items);
  if (!fail)
    take_state(R, &done.u.turn.state, &done.u.turn.state_len);
  cph_op_clear_results(&done);
  cph_op_clear_results(&lease);
  if (fail)
    cph_clock_advance(&x->clock, 120 * CPH_NS_PER_S); /* past the retry's backoff */
}

static void seal(run *R, cph_fixture *x, int i) {
  char trigger[32];
  snprintf(trigger, sizeof trigger, "seal %d", i);
  cph_op op;
  cph_fixture_seal(x, "a", trigger, &op);
  CHECK(op.u.context.items.n == 1, "seal %d gave %zu items", i, op.u.context.items.n);
  cph_fixture_items_take(&R->items, &op.u.context.items);
  take_state(R, &op.u.context.state, &op.u.context.state_len);
  cph_op_clear_results(&op);
}

/* f's turn records of "a", newest first, then its seals, oldest first: origin per line; then
 * its kept turn contexts, oldest first: the turn's origin, kind and messages (count and the
 * newest one's content) per line; then the memories of its own scope, newest first: text and
 * creation time per line. */
static void listing(cph_fixture *f, char *out, size_t cap) {
  cph_turn_record *recs = NULL;
  cph_seal_info *seals = NULL;
  size_t nr = 0, ns = 0, at = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_session_turn_records(f->e, "a", 1000, &recs, &nr, &err), CPH_OK);
  assert_int_equal(cph_engine_seals(f->e, "a", &seals, &ns, &err), CPH_OK);
  out[0] = '\0';
  for (size_t i = 0; i < nr; i++) {
    at += (size_t)snprintf(out + at, cap - at, "t %s %s\n", recs[i].origin, recs[i].state);
    cph_turn_record_free(&recs[i]);
  }
  for (size_t i = 0; i < ns; i++)
    at += (size_t)snprintf(out + at, cap - at, "s %s %s\n", seals[i].origin, seals[i].trigger);
  cph_kept_turn *kept = NULL;
  size_t nk = 0;
  assert_int_equal(cph_engine_kept_turns(f->e, "a", &kept, &nk, &err), CPH_OK);
  for (size_t i = 0; i < nk && at < cap; i++) {
    cph_turn_record tr;
    cph_turn_context c;
    assert_int_equal(cph_engine_turn_record(f->e, kept[i].id, &tr, &err), CPH_OK);
    assert_int_equal(cph_engine_turn_context(f->e, "a", kept[i].id, &c, &err), CPH_OK);
    assert_true(c.n_messages > 0);
    at += (size_t)snprintf(out + at, cap - at, "k %s %s %zu %s\n", tr.origin, tr.state,
                           c.n_messages, c.messages[c.n_messages - 1].content);
    cph_turn_record_free(&tr);
    cph_turn_context_free(&c);
  }
  cph_kept_turns_free(kept, nk);
  cph_op op;
  cph_fixture_search(f, "a", "note", 1000, &op);
  for (size_t i = 0; i < op.u.search.n_hits && at < cap; i++)
    if (strcmp(op.u.search.hits[i].session, "a") == 0)
      at += (size_t)snprintf(out + at, cap - at, "m %s %lld\n", op.u.search.hits[i].text,
                             (long long)op.u.search.hits[i].created_ms);
  cph_op_clear_results(&op);
  assert_true(at < cap);
  free(recs);
  cph_seals_free(seals, ns);
}

/* On y, the parked turns it took over are history: none is in its parked list (no input is
 * parked under them here) and a requeue of one is refused, changing nothing. */
static void parked_history_stays_history(run *R, cph_fixture *y) {
  cph_parked_turn *p = NULL;
  size_t np = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_parked_turns(y->e, &p, &np, &err), CPH_OK);
  CHECK(np == 0, "the new owner lists %zu parked turns of its own", np);
  free(p);
  cph_turn_record *recs = NULL;
  size_t nr = 0;
  assert_int_equal(cph_engine_session_turn_records(y->e, "a", 1000, &recs, &nr, &err), CPH_OK);
  for (size_t i = 0; i < nr; i++) {
    if (strcmp(recs[i].state, "parked") == 0) {
      cph_op op = {0};
      op.kind = CPH_OP_REQUEUE;
      op.u.turn.turn_id = recs[i].id;
      CHECK(cph_fixture_run(y, &op) == CPH_ECONFLICT, "requeueing turn %llu (%s), history on "
            "the new owner: %s", (unsigned long long)recs[i].id, recs[i].origin, op.err.msg);
      cph_op_clear_results(&op);
      cph_turn_record tr;
      assert_int_equal(cph_engine_turn_record(y->e, recs[i].id, &tr, &err), CPH_OK);
      CHECK(strcmp(tr.state, "parked") == 0, "turn %llu is %s after a refused requeue",
            (unsigned long long)recs[i].id, tr.state);
      cph_turn_record_free(&tr);
    }
    cph_turn_record_free(&recs[i]);
  }
  free(recs);
}

/* Imports state (NULL: none) and the items in a random order, some twice, into "a" on y. */
static void hand_over(run *R, rng *r, cph_fixture *y, const uint8_t *state, size_t len) {
  size_t n = R->items.n + below(r, 1 + (uint32_t)R->items.n / 4);
  cph_state_item *v = calloc(n ? n : 1, sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = R->items.v[i < R->items.n ? i : below(r, (uint32_t)R->items.n)];
  for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
    size_t j = below(r, (uint32_t)i);
    cph_state_item t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_STATE;
  op.u.state.session = "a";
  op.u.state.data = state;
  op.u.state.len = len;
  op.u.state.items = v;
  op.u.state.n_items = n;
  CHECK(cph_fixture_run(y, &op) == CPH_OK, "the import: %s", op.err.msg);
  CHECK(op.u.state.items_refused == 0, "%u items refused", op.u.state.items_refused);
  cph_op_clear_results(&op);
  free(v);
}

static void one_case(run *R, uint64_t seed) {
  rng r = {seed};
  R->seed = seed;
  char policy[384];
  unsigned keep = 1 + below(&r, 8);
  static const unsigned attempts[] = {1, 2, 5}; /* 1: every failure parks; 5: the default */
  snprintf(policy, sizeof policy,
           "{:scheduler {:lanes {:interactive {:turns 100000 :tool-calls 100000"
           " :tokens 100000000}}} :context {:keep-turns %u} :leases {:max-attempts %u}"
           " :sessions {:while-running {:interactive :restart}}}",
           keep, attempts[below(&r, 3)]);
  cph_fixture *x = node("items_prop_x", "x", policy), *y = node("items_prop_y", "y", POLICY);
  int ops = 5 + (int)below(&r, 110), made = 0;
  for (int i = 0; i < ops; i++) {
    uint32_t what = below(&r, 23);
    if (what < 2) {
      turn(R, x, i, true, 0, false);
    } else if (what < 4) {
      seal(R, x, i);
    } else if (what < 6) {
      turn_left(R, x, i, what == 4);
    } else if (what == 6) {
      requeue_one(R, x);
    } else {
      turn(R, x, i, false, (int)below(&r, 3), below(&r, 8) == 0);
      made++;
    }
    if (below(&r, 4) == 0) /* memories made at different times */
      cph_clock_advance(&x->clock, (int64_t)(1 + below(&r, 5000)) * 1000000);
  }
  if (!made)
    turn(R, x, ops, false, 1, false);
  static char want[256 * 1024], got[256 * 1024];
  listing(x, want, sizeof want);
  cph_fixture_items_last_per_name(&R->items);
  hand_over(R, &r, y, R->state, R->state_len);
  listing(y, got, sizeof got);
  CHECK(strcmp(got, want) == 0, "the new owner lists\n%.600s\nwhere the old one lists\n%.600s",
        got, want);
  parked_history_stays_history(R, y);
  hand_over(R, &r, y, below(&r, 2) ? R->state : NULL, R->state_len);
  listing(y, got, sizeof got);
  CHECK(strcmp(got, want) == 0, "imported again, the new owner lists\n%.600s\nnot\n%.600s", got,
        want);
  cph_fixture_items_free(&R->items);
  free(R->state);
  R->state = NULL;
  cph_fixture_free(x);
  cph_fixture_free(y);
}

static void test_every_record_moves_once_in_the_order_it_was_made(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(4242, DEFAULT_CASES, &seed, &cases);
  run R = {0};
  for (long c = 0; c < cases; c++)
    one_case(&R, seed + (uint64_t)c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_record_moves_once_in_the_order_it_was_made),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
