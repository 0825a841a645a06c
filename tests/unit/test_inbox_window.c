/* A session's live inbox (core/session.h): one array in id order that removals near its front
 * shift by moving the window, not the tail. Checked against a plain array over random pushes
 * and removals (the window moving down, the allocation growing, requeued ids going back in
 * the middle), and end to end: a session at its queue cap folding thousands of events through
 * the window, with a turn and a restart between, still counts every event once (DESIGN §5). */
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
#include "core/session.h"
#include "store/records.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/prop.h"
#include "tests/support/testutil.h"

/* ---------------------------------------------------------------- the array itself */

#define MODEL_MAX 4096

typedef struct model {
  inbox_item items[MODEL_MAX];
  uint32_t n;
} model;

static void model_push(model *m, const inbox_item *it) {
  uint32_t at = m->n;
  while (at > 0 && m->items[at - 1].id > it->id)
    at--;
  memmove(&m->items[at + 1], &m->items[at], (m->n - at) * sizeof *m->items);
  m->items[at] = *it;
  m->n++;
}

static void model_remove(model *m, uint32_t index) {
  memmove(&m->items[index], &m->items[index + 1], (m->n - index - 1) * sizeof *m->items);
  m->n--;
}

/* s holds what m holds, counted pending and staged, in an allocation under three times the
 * most it held (or the first 4 entries). */
static void expect_same(const csession *s, const model *m, uint32_t most, uint64_t seed, int step) {
  if (s->n_inbox != m->n)
    fail_msg("seed %llu step %d: %u entries, want %u", (unsigned long long)seed, step, s->n_inbox,
             m->n);
  uint32_t pending = 0;
  for (uint32_t i = 0; i < m->n; i++) {
    if (s->inbox[i].id != m->items[i].id || s->inbox[i].event_id != m->items[i].event_id)
      fail_msg("seed %llu step %d: entry %u is id %llu, want %llu", (unsigned long long)seed, step,
               i, (unsigned long long)s->inbox[i].id, (unsigned long long)m->items[i].id);
    pending += m->items[i].status == CPH_INBOX_PENDING;
  }
  assert_int_equal(s->n_pending, pending);
  assert_int_equal(s->n_staged, m->n - pending);
  if (s->inbox) {
    uint32_t cap = (uint32_t)1 << s->inbox_cap_log2;
    if (cap > 4 && cap >= 3 * most)
      fail_msg("seed %llu step %d: %u entries allocated, at most %u held", (unsigned long long)seed,
               step, cap, most);
    assert_true(s->inbox_head + s->n_inbox <= cap);
  }
}

static void test_inbox_matches_a_plain_array_across_window_moves_and_growth(void **state) {
  (void)state;
  static model m;
  uint64_t seed0;
  long cases;
  cph_property_run(9400, 60, &seed0, &cases);
  for (long c = 0; c < cases; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rng r = {seed};
    uint32_t most = 0;
    csession s;
    memset(&s, 0, sizeof s);
    m.n = 0;
    uint64_t next_id = 1;
    /* A queue filling to a level, then held there (the queue cap's fold: the oldest but one
     * goes, a new one comes), then drained from the front (a turn's completion). */
    uint32_t level = 1 + below(&r, 1500);
    int steps = 4000 + (int)below(&r, 4000);
    for (int step = 0; step < steps; step++) {
      uint32_t op = below(&r, 16);
      if (m.n < level && m.n < MODEL_MAX && op < 12) {
        inbox_item it = {0};
        /* now and then a requeued entry: an id older than the newest */
        it.id = op == 0 && next_id > 10 ? 1 + below(&r, (uint32_t)next_id - 1) : next_id++;
        it.event_id = it.id * 7;
        it.status = below(&r, 2) ? CPH_INBOX_PENDING : CPH_INBOX_STAGED;
        assert_int_equal(csession_inbox_push(&s, &it), CPH_OK);
        model_push(&m, &it);
      } else if (m.n > 0) {
        uint32_t at;
        if (op < 10)
          at = m.n > 1 ? 1 : 0; /* after the overflow entry */
        else if (op < 13)
          at = 0;
        else
          at = below(&r, m.n);
        csession_inbox_remove(&s, at);
        model_remove(&m, at);
        if (m.n > 0 && op < 10 && m.n < MODEL_MAX) { /* the fold's new entry */
          inbox_item it = {0};
          it.id = next_id++;
          it.event_id = it.id * 7;
          it.status = CPH_INBOX_PENDING;
          assert_int_equal(csession_inbox_push(&s, &it), CPH_OK);
          model_push(&m, &it);
        }
      }
      if (m.n > most)
        most = m.n;
      if (step % 50 == 0 || step == steps - 1)
        expect_same(&s, &m, most, seed, step);
    }
    while (m.n) { /* drained, the allocation is the array again: free() takes it */
      csession_inbox_remove(&s, 0);
      model_remove(&m, 0);
    }
    expect_same(&s, &m, most, seed, steps);
    assert_int_equal(s.inbox_head, 0);
    free(s.inbox);
  }
}

/* ---------------------------------------------------------------- end to end */

static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :sessions {:max-queue 8 :max-batch 64 :janitor? false}\n"
                            " :store {:sync :none}}\n";

#define EVENTS_MAX 4000

typedef struct seen {
  uint64_t posted[EVENTS_MAX];
  size_t n_posted;
  uint32_t carried[EVENTS_MAX * 2]; /* by event id */
} seen;

/* n distinct messages in one request; each must be queued for s1. */
static void post(cph_fixture *f, seen *w, size_t n) {
  cph_event_in *evs = calloc(n, sizeof *evs);
  char(*bodies)[64] = calloc(n, sizeof *bodies);
  for (size_t i = 0; i < n; i++) {
    snprintf(bodies[i], sizeof bodies[i], "status line %zu of the handover", w->n_posted + i);
    evs[i].channel = "general";
    evs[i].sender = "erin";
    evs[i].body = bodies[i];
  }
  cph_op op;
  cph_fixture_ingest(f, evs, n, &op);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(op.u.ingest.results[i].status, CPH_EV_QUEUED);
    assert_true(w->n_posted < EVENTS_MAX);
    w->posted[w->n_posted++] = op.u.ingest.results[i].id;
  }
  cph_op_clear_results(&op);
  free(evs);
  free(bodies);
}

/* s1's queue is within its cap; *queued = its entries, *folded = the events the cap folded
 * (since the engine opened). */
static void check_queue(cph_fixture *f, uint32_t *queued, uint64_t *folded) {
  cph_session_info si;
  cph_err err;
  if (cph_engine_get_session(f->e, "s1", &si, &err))
    fail_msg("get s1: %s", err.msg);
  *queued = si.pending + si.staged;
  assert_true(*queued <= 8);
  *folded = si.folded;
  cph_session_info_free(&si);
}

/* Leases and completes s1's turns until none is left; notes every event they carried. */
static size_t drain(cph_fixture *f, seen *w) {
  size_t turns = 0;
  for (;;) {
    cph_op op = {0};
    op.kind = CPH_OP_LEASE;
    op.u.lease.worker = "w1";
    op.u.lease.deadline_ns = cph_clock_now(&f->clock);
    if (cph_fixture_run(f, &op) != CPH_OK) {
      cph_op_clear_results(&op);
      return turns;
    }
    const cph_turn_info *t = &op.u.lease.turn;
    for (size_t i = 0; i < t->n_staged; i++) {
      const cph_staged_msg *m = &t->staged[i];
      assert_int_equal(m->count, m->n_event_ids);
      for (size_t j = 0; j < m->n_event_ids; j++) {
        assert_true(m->event_ids[j] < EVENTS_MAX * 2);
        w->carried[m->event_ids[j]]++;
      }
    }
    cph_op done = {0};
    done.kind = CPH_OP_COMPLETE;
    done.u.turn.turn_id = t->id;
    snprintf(done.u.turn.lease, sizeof done.u.turn.lease, "%s", t->lease);
    if (cph_fixture_run(f, &done))
      fail_msg("complete: %s", done.err.msg);
    cph_op_clear_results(&done);
    cph_op_clear_results(&op);
    turns++;
  }
}

static void test_queue_cap_folds_thousands_through_a_restart_and_counts_each_once(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("inbox_window", POLICY);
  static seen w;
  memset(&w, 0, sizeof w);
  const char *subscribe[1] = {"general"};
  cph_fixture_create_session(f, "s1", CPH_LANE_INTERACTIVE, subscribe, 1);
  uint32_t queued, after;
  uint64_t folded;
  for (int i = 0; i < 12; i++) /* 1,200 on a cap of 8: the window moves many times */
    post(f, &w, 100);
  check_queue(f, &queued, &folded);
  assert_int_equal(queued, 8);
  assert_int_equal(folded, 1200 - 8 + 1); /* the overflow entry holds all but 7 */
  assert_int_equal(drain(f, &w), 1);      /* every entry in one turn (max-batch 64) */

  for (int i = 0; i < 9; i++)
    post(f, &w, 97);
  check_queue(f, &queued, &folded);
  assert_int_equal(queued, 8);
  cph_engine_close(f->e); /* the overflow entry and the 7 newest come back as they were */
  cph_fixture_open(f);
  check_queue(f, &after, &folded);
  assert_int_equal(after, 8);
  for (int i = 0; i < 11; i++)
    post(f, &w, 131);
  drain(f, &w);

  for (size_t i = 0; i < w.n_posted; i++)
    if (w.carried[w.posted[i]] != 1)
      fail_msg("event %llu was carried %u times, want once", (unsigned long long)w.posted[i],
               w.carried[w.posted[i]]);
  size_t total = 0;
  for (size_t i = 0; i < EVENTS_MAX * 2; i++)
    total += w.carried[i];
  assert_int_equal(total, w.n_posted);
  cph_fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_inbox_matches_a_plain_array_across_window_moves_and_growth),
      cmocka_unit_test(test_queue_cap_folds_thousands_through_a_restart_and_counts_each_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
