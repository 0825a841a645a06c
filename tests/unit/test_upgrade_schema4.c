/* A schema-4 data directory under this build (schema 5, store/store.h): its embed queue holds
 * one row per memory, which this build reads as ranges of one, and one exact-dedupe entry per
 * event keyed by its time, which it reads as they are beside its rows. A copy of a live directory
 * written back in schema 4's form must be refused by a plain store open, migrate through the
 * engine, and then give what the original gives: the same embed backlog, the same search
 * answers, the same dedupe verdicts on repeats of what came before — and both must go on
 * alike. */
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
#include "tests/support/schema4.h"
#include "tests/support/testutil.h"

static const char *POLICY = "{:sessions {:janitor? false :max-queue 1000}\n"
                            " :store {:sync :none}\n"
                            " :dedupe {:window-seconds 600 :min-length 12}}\n";

#define N 12

/* Request `round` of N events on "general": event i says something of its own, except that
 * from round 1 on the even ones repeat round 0's. */
static void post(cph_fixture *f, int round, cph_event_result *out) {
  char body[N][96];
  cph_event_in ev[N];
  for (int i = 0; i < N; i++) {
    int from = round > 0 && i % 2 == 0 ? 0 : round;
    snprintf(body[i], sizeof body[i], "deploy %d of service %s finished in round %d", i,
             i == 5 ? "kumquat" : "ledger", from);
    ev[i] = (cph_event_in){.channel = "general", .sender = "carol", .body = body[i]};
  }
  cph_op op = {0};
  cph_fixture_ingest(f, ev, N, &op);
  for (int i = 0; i < N; i++) {
    out[i].id = op.u.ingest.results[i].id;
    out[i].status = op.u.ingest.results[i].status;
  }
  cph_op_clear_results(&op);
}

static uint64_t backlog(cph_fixture *f) {
  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  return st.embed_queue;
}

/* Writes dir back as schema 4 held it: one embed-queue row per id, one exact-dedupe entry per
 * copy under its time, schema version 4. Returns how many embed-queue ranges it split. */
static size_t write_schema4(const char *dir) {
  cph_store *st = cph_fixture_store_open(dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  size_t split = cph_test_embed_rows_of_one(&t);
  assert_true(cph_test_dedupe_rows_to_entries(&t) >= 2 * N); /* every eligible event's copy */
  cph_test_set_schema4(&t);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  return split;
}

static void test_a_schema4_data_dir_opens_and_answers_the_same(void **state) {
  (void)state;
  cph_fixture *a = cph_fixture_new("schema4-a", POLICY);
  const char *subs[] = {"general"};
  cph_fixture_create_session(a, "s1", CPH_LANE_INTERACTIVE, subs, 1);
  cph_event_result first[N], second[N];
  post(a, 0, first);
  cph_clock_advance(&a->clock, 5 * CPH_NS_PER_S);
  post(a, 1, second); /* the even ones repeat round 0's */
  for (int i = 0; i < N; i++)
    assert_int_equal(second[i].status, i % 2 == 0 ? CPH_EV_AGGREGATED : CPH_EV_QUEUED);
  uint64_t queued = backlog(a);
  assert_true(queued >= N + N / 2); /* every new text, and the families' aggregates */
  cph_engine_close(a->e);
  a->e = NULL;

  cph_fixture *b = cph_fixture_new("schema4-b", POLICY);
  cph_engine_close(b->e);
  b->e = NULL;
  cph_fixture_copy_store(a, b);
  assert_true(write_schema4(b->dir) >= 2); /* each request queued a range */
  cph_fixture_expect_schema(b->dir, 4); /* only the engine migrates */

  b->clock = a->clock;
  cph_fixture_open(a);
  cph_fixture_open(b); /* migrates */
  assert_int_equal(backlog(a), queued);
  assert_int_equal(backlog(b), queued);
  static char found_a[1 << 14], found_b[1 << 14];
  cph_fixture_search_lines(a, "s1", "kumquat", found_a, sizeof found_a);
  cph_fixture_search_lines(b, "s1", "kumquat", found_b, sizeof found_b);
  assert_string_equal(found_a, found_b);
  assert_non_null(strstr(found_b, "kumquat finished in round 1"));
  cph_fixture_search_lines(a, "s1", "deploy service", found_a, sizeof found_a);
  cph_fixture_search_lines(b, "s1", "deploy service", found_b, sizeof found_b);
  assert_string_equal(found_a, found_b);

  /* a third round: the repeats of round 0 are found in both, with the same families */
  cph_clock_advance(&a->clock, 5 * CPH_NS_PER_S);
  b->clock = a->clock;
  cph_event_result third_a[N], third_b[N];
  post(a, 2, third_a);
  post(b, 2, third_b);
  for (int i = 0; i < N; i++) {
    assert_int_equal(third_a[i].id, third_b[i].id);
    assert_int_equal(third_a[i].status, third_b[i].status);
    assert_int_equal(third_b[i].status, i % 2 == 0 ? CPH_EV_AGGREGATED : CPH_EV_QUEUED);
    assert_int_equal(cph_test_event_family(a->e, third_a[i].id),
                     cph_test_event_family(b->e, third_b[i].id));
  }
  assert_int_equal(backlog(a), backlog(b));
  assert_true(backlog(b) > queued);
  cph_fixture_free(a);
  cph_fixture_free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_schema4_data_dir_opens_and_answers_the_same),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
