/* A request's exact-dedupe entries are held in memory and written in key order when the
 * request ends (core/dedupe_exact.c). Repeats inside one request must still find them: an
 * exact repeat is aggregated into the first one's family, a near duplicate on a bulk channel
 * folds and its original's entry joins the family; the next request, and the engine after a
 * restart, find the entries in the store. */
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

static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :sessions {:max-queue 1000 :janitor? false}\n"
                            " :store {:sync :none}\n"
                            " :dedupe {:window-seconds 600 :min-length 12 :shingle-words 1\n"
                            "          :near-distance 10 :bulk [\"alerts\"]}}\n";

static const char *BACKUP = "nightly backup job failed on storage node seven please check the logs";
static const char *BACKUP_8 =
    "nightly backup job failed on storage node eight please check the logs";

/* One request of n events on channel from sender, bodies[i]; statuses and ids out. */
static void post(cph_fixture *f, const char *channel, const char *const *bodies, size_t n,
                 cph_ingest_status *st, uint64_t *ids) {
  cph_event_in evs[16];
  memset(evs, 0, sizeof evs);
  for (size_t i = 0; i < n; i++) {
    evs[i].channel = (char *)channel;
    evs[i].sender = "watchdog";
    evs[i].body = (char *)bodies[i];
  }
  cph_fixture_ingest_results(f, evs, n, st, ids);
}

static uint64_t event_family(cph_fixture *f, uint64_t id) {
  cph_event_info ev;
  cph_err err;
  if (cph_engine_get_event(f->e, id, &ev, &err))
    fail_msg("event %llu: %s", (unsigned long long)id, err.msg);
  uint64_t family = ev.family;
  cph_event_info_free(&ev);
  return family;
}

static void test_exact_repeats_in_one_request_and_after_it_are_aggregated(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("dedupe_batch", POLICY);
  const char *subscribe[1] = {"ops"};
  cph_fixture_create_session(f, "s1", CPH_LANE_INTERACTIVE, subscribe, 1);
  const char *five[5] = {BACKUP, BACKUP, BACKUP, BACKUP, BACKUP};
  cph_ingest_status st[5];
  uint64_t ids[5];
  post(f, "ops", five, 5, st, ids);
  assert_int_equal(st[0], CPH_EV_QUEUED);
  uint64_t family = event_family(f, ids[1]);
  assert_true(family != 0);
  for (int i = 1; i < 5; i++) {
    assert_int_equal(st[i], CPH_EV_AGGREGATED);
    assert_int_equal(event_family(f, ids[i]), family);
  }

  post(f, "ops", five, 3, st, ids); /* the next request reads the flushed entries */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(st[i], CPH_EV_AGGREGATED);
    assert_int_equal(event_family(f, ids[i]), family);
  }

  cph_engine_close(f->e); /* and so does the engine, rebuilt from the store */
  cph_fixture_open(f);
  post(f, "ops", five, 2, st, ids);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(st[i], CPH_EV_AGGREGATED);
    assert_int_equal(event_family(f, ids[i]), family);
  }
  cph_fixture_free(f);
}

static void test_near_duplicate_in_one_request_joins_its_originals_family(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("dedupe_batch", POLICY);
  const char *subscribe[1] = {"alerts"};
  cph_fixture_create_session(f, "s1", CPH_LANE_INTERACTIVE, subscribe, 1);
  const char *two[2] = {BACKUP, BACKUP_8};
  cph_ingest_status st[2];
  uint64_t ids[2];
  post(f, "alerts", two, 2, st, ids);
  assert_int_equal(st[0], CPH_EV_QUEUED);
  assert_int_equal(st[1], CPH_EV_AGGREGATED);
  uint64_t family = event_family(f, ids[1]);
  assert_true(family != 0);

  /* the original's entry, written with the family in the same request: its exact repeat,
   * after a restart, lands in that family */
  cph_engine_close(f->e);
  cph_fixture_open(f);
  const char *again[1] = {BACKUP};
  post(f, "alerts", again, 1, st, ids);
  assert_int_equal(st[0], CPH_EV_AGGREGATED);
  assert_int_equal(event_family(f, ids[0]), family);
  cph_fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_repeats_in_one_request_and_after_it_are_aggregated),
      cmocka_unit_test(test_near_duplicate_in_one_request_joins_its_originals_family),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
