/* History copies (cph_event_in.history_only; server/clusterflow.h 14., 15.; core/ingest.c
 * history_copy): another node's reply or event is stored in a channel's history once — not
 * again under its key, nor under another key when the channel's newest 256 entries hold the
 * same event (sender, time, body), found in the channel's warm tail or, with :warm-channels 0,
 * by walking the store; an entry further back does not count. Each case runs warm and cold,
 * and the history's length in the store says how many entries landed. Last, a request that
 * fails whole after its copies were looked at leaves nothing of them in the warm tails or the
 * event cache (the ids it gives back are taken again). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

#define CH "team"
#define ENTRIES 300 /* more than the 256 a copy is looked for among */
#define T0 1700000000000LL

static const char *WARM = "{:sessions {:janitor? false}\n"
                          " :dedupe {:min-length 1000000}\n"
                          " :store {:sync :none}}\n";
static const char *COLD = "{:sessions {:janitor? false :warm-channels 0}\n"
                          " :dedupe {:min-length 1000000}\n"
                          " :store {:sync :none}}\n";

static int setup_warm(void **state) {
  *state = cph_fixture_new("histcopy", WARM);
  return 0;
}

static int setup_cold(void **state) {
  *state = cph_fixture_new("histcopy", COLD);
  return 0;
}

/* A store that cannot grow past 2 MiB: an ingest request too big for it fails whole. */
static const char *SMALL = "{:server {:map-size-mb 2 :max-map-size-mb 2}\n"
                           " :sessions {:janitor? false}\n"
                           " :dedupe {:min-length 1000000}\n"
                           " :store {:sync :none}}\n";

static int setup_small(void **state) {
  *state = cph_fixture_new("histcopy", SMALL);
  return 0;
}

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

static void entry_body(char *out, size_t cap, int i) { snprintf(out, cap, "entry %d of the team", i); }

/* ENTRIES events in CH from alice, entry i at time T0 + i; returns their ids. */
static void fill(cph_fixture *f, uint64_t ids[ENTRIES]) {
  static char bodies[ENTRIES][48];
  cph_event_in evs[ENTRIES];
  memset(evs, 0, sizeof evs);
  for (int i = 0; i < ENTRIES; i++) {
    entry_body(bodies[i], sizeof bodies[i], i);
    evs[i] = (cph_event_in){.channel = CH, .sender = "alice", .body = bodies[i], .ts_ms = T0 + i};
  }
  cph_op op;
  cph_fixture_ingest(f, evs, ENTRIES, &op);
  for (int i = 0; i < ENTRIES; i++) {
    assert_int_equal(op.u.ingest.results[i].status, CPH_EV_STORED);
    ids[i] = op.u.ingest.results[i].id;
  }
  cph_op_clear_results(&op);
}

typedef struct copy {
  const char *key, *sender, *body;
  int64_t ts_ms;
} copy;

/* Applies copies c[0..n) in one request; their results into status[] and id[]. */
static void apply(cph_fixture *f, const copy *c, size_t n, cph_ingest_status *status,
                  uint64_t *id) {
  cph_event_in evs[8];
  assert_true(n <= 8);
  memset(evs, 0, sizeof evs);
  for (size_t i = 0; i < n; i++)
    evs[i] = (cph_event_in){.channel = CH, .sender = (char *)c[i].sender, .body = (char *)c[i].body,
                            .key = (char *)c[i].key, .kind = "reply", .ts_ms = c[i].ts_ms,
                            .history_only = true};
  cph_fixture_ingest_results(f, evs, n, status, id);
}

/* The channel's history length in the store (the engine closed meanwhile, then reopened). */
static size_t history_len(cph_fixture *f) {
  cph_engine_close(f->e);
  f->e = NULL;
  cph_store *s = cph_fixture_store_open(f->dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_CHANNEL_LOG, &c), CPH_OK);
  cph_key from;
  cph_key_reset(&from);
  cph_key_str(&from, CH);
  size_t plen = from.len, n = 0;
  cph_val k, v;
  for (int rc = cph_cursor_seek(&c, &from, &k, &v);
       rc == CPH_OK && k.len > plen && memcmp(k.data, from.data, plen) == 0;
       rc = cph_cursor_next(&c, &k, &v))
    n++;
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  cph_store_close(s);
  cph_fixture_open(f);
  return n;
}

/* The copy of the k-th newest entry (0: the newest) under a new key. */
static copy copy_of(int k, char *body, size_t cap, const char *key) {
  int i = ENTRIES - 1 - k;
  entry_body(body, cap, i);
  return (copy){key, "alice", body, T0 + i};
}

static void test_history_copy_is_stored_once(void **state) {
  cph_fixture *f = *state;
  uint64_t ids[ENTRIES];
  fill(f, ids);
  char b0[48], b1[48], b2[48], b3[48];
  cph_ingest_status st[4];
  uint64_t id[4];
  /* entries 0, 100 and 255 back are held (answered with their ids); 256 back is not looked at */
  copy held[4] = {copy_of(0, b0, sizeof b0, "h:0"), copy_of(100, b1, sizeof b1, "h:100"),
                  copy_of(255, b2, sizeof b2, "h:255"), copy_of(256, b3, sizeof b3, "h:256")};
  apply(f, held, 4, st, id);
  assert_int_equal(st[0], CPH_EV_DUPLICATE);
  assert_int_equal(id[0], ids[ENTRIES - 1]);
  assert_int_equal(st[1], CPH_EV_DUPLICATE);
  assert_int_equal(id[1], ids[ENTRIES - 1 - 100]);
  assert_int_equal(st[2], CPH_EV_DUPLICATE);
  assert_int_equal(id[2], ids[ENTRIES - 1 - 255]);
  assert_int_equal(st[3], CPH_EV_STORED); /* beyond the bound: appended */
  assert_int_equal(history_len(f), ENTRIES + 1);

  /* a new reply: stored; the same again under its key, and under another key (the engine
   * reopened: tails cold), held; the same text at another time or from another sender is
   * another event */
  copy fresh[4] = {{"h:new", "bob", "bob's answer", T0 + 1000},
                   {"h:new", "bob", "bob's answer", T0 + 1000},
                   {"h:new-again", "bob", "bob's answer", T0 + 1000},
                   {"h:other-time", "bob", "bob's answer", T0 + 1001}};
  apply(f, fresh, 1, st, id);
  assert_int_equal(st[0], CPH_EV_STORED);
  uint64_t stored = id[0];
  assert_int_equal(history_len(f), ENTRIES + 2);
  apply(f, fresh + 1, 3, st, id);
  assert_int_equal(st[0], CPH_EV_DUPLICATE);
  assert_int_equal(id[0], stored);
  assert_int_equal(st[1], CPH_EV_DUPLICATE);
  assert_int_equal(id[1], stored);
  assert_int_equal(st[2], CPH_EV_STORED);
  copy other_sender = {"h:other-sender", "carol", "bob's answer", T0 + 1000};
  apply(f, &other_sender, 1, st, id);
  assert_int_equal(st[0], CPH_EV_STORED);
  assert_int_equal(history_len(f), ENTRIES + 4);
}

/* Two copies of one event in one request (a reply's and a forward's, say): the second finds
 * the first, which its own request's transaction holds so far. */
static void test_history_copy_finds_one_from_its_own_request(void **state) {
  cph_fixture *f = *state;
  uint64_t ids[ENTRIES];
  fill(f, ids);
  copy twice[3] = {{"h:a", "bob", "said once", T0 + 5000},
                   {"h:b", "bob", "something else", T0 + 5001},
                   {"h:c", "bob", "said once", T0 + 5000}};
  cph_ingest_status st[3];
  uint64_t id[3];
  apply(f, twice, 3, st, id);
  assert_int_equal(st[0], CPH_EV_STORED);
  assert_int_equal(st[1], CPH_EV_STORED);
  assert_int_equal(st[2], CPH_EV_DUPLICATE);
  assert_int_equal(id[2], id[0]);
  assert_int_equal(history_len(f), ENTRIES + 2);
}

/* A request whose copies were stored and looked at, then failed whole (the store full): its
 * event ids are given back, and the next events take them — the event cache must not show
 * the failed request's text for them. */
static void test_history_copy_after_a_failed_request(void **state) {
  cph_fixture *f = *state;
  enum { BIG = 40, BIG_BYTES = 64 * 1024 };
  char *big = malloc(BIG_BYTES + 1);
  assert_non_null(big);
  memset(big, 'x', BIG_BYTES);
  big[BIG_BYTES] = '\0';
  cph_event_in evs[2 + BIG];
  memset(evs, 0, sizeof evs);
  evs[0] = (cph_event_in){.channel = CH, .sender = "bob", .body = "alpha", .key = "h:alpha",
                          .kind = "reply", .ts_ms = T0, .history_only = true};
  evs[1] = (cph_event_in){.channel = CH, .sender = "bob", .body = "alpha two", .key = "h:alpha2",
                          .kind = "reply", .ts_ms = T0 + 1, .history_only = true};
  for (int i = 0; i < BIG; i++)
    evs[2 + i] = (cph_event_in){.channel = "elsewhere", .sender = "carol", .body = big};
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = evs;
  op.u.ingest.n_events = 2 + BIG;
  assert_int_equal(cph_fixture_run(f, &op), CPH_EFULL);
  cph_op_clear_results(&op);
  free(big);
  /* the ids the failed request took go to these */
  copy bravo = {"h:bravo", "bob", "bravo", T0 + 2};
  cph_ingest_status st[1];
  uint64_t id[1];
  apply(f, &bravo, 1, st, id);
  assert_int_equal(st[0], CPH_EV_STORED);
  /* alpha was never stored: a copy of it is stored now, not taken for an entry it is not */
  copy alpha = {"h:alpha-again", "bob", "alpha", T0};
  apply(f, &alpha, 1, st, id);
  assert_int_equal(st[0], CPH_EV_STORED);
  assert_int_equal(history_len(f), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_history_copy_is_stored_once, setup_warm, teardown),
      cmocka_unit_test_setup_teardown(test_history_copy_is_stored_once, setup_cold, teardown),
      cmocka_unit_test_setup_teardown(test_history_copy_finds_one_from_its_own_request,
                                      setup_warm, teardown),
      cmocka_unit_test_setup_teardown(test_history_copy_finds_one_from_its_own_request,
                                      setup_cold, teardown),
      cmocka_unit_test_setup_teardown(test_history_copy_after_a_failed_request, setup_small,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
