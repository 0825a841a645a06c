/* Content dedupe and duplicate families (DESIGN §5) through the public API, on a virtual
 * clock and a temp LMDB; plus the simhash itself. */
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
#include "core/dedupe.h"
#include "core/simidx.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/schema4.h"
#include "tests/support/testutil.h"

/* One-word shingles and a wider near distance than the defaults: with :shingle-words 3 and
 * :near-distance 3 a one-word change in a 12-word body is ~13 bits away on average (see
 * test_simhash_distances), so the defaults only catch near duplicates in long bodies. */
static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :sessions {:max-queue 1000 :janitor? false}\n"
                            " :store {:sync :none}\n"
                            " :dedupe {:window-seconds 60 :min-length 12 :shingle-words 1\n"
                            "          :near-distance 10 :bulk [\"alerts\" \"feedbot\"]}}\n";

static const char *BACKUP =
    "nightly backup job failed on storage node seven please check the logs";
static const char *BACKUP_8 =
    "nightly backup job failed on storage node eight please check the logs";
static const char *LUNCH = "lunch is ready in the kitchen come and get it before it gets cold";

typedef cph_fixture fixture;

static int setup(void **state) {
  *state = cph_fixture_new("dedupe", POLICY);
  return 0;
}

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

static void create_session(fixture *f, const char *id, const char *subscribe) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  char *subs[1] = {(char *)subscribe};
  if (subscribe) {
    op.u.session.in.subscribe.items = subs;
    op.u.session.in.subscribe.count = 1;
  }
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

/* Ingests ev alone; returns its status, *id its id, *routed how many sessions got it. */
static cph_ingest_status post_event(fixture *f, cph_event_in *ev, uint64_t *id, size_t *routed) {
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = ev;
  op.u.ingest.n_events = 1;
  if (cph_fixture_run(f, &op))
    fail_msg("ingest: %s", op.err.msg);
  cph_ingest_status st = op.u.ingest.results[0].status;
  if (id)
    *id = op.u.ingest.results[0].id;
  if (routed)
    *routed = op.u.ingest.results[0].sessions.count;
  cph_op_clear_results(&op);
  return st;
}

/* Posts one event; returns its status, *id its id, *routed how many sessions got it. */
static cph_ingest_status post(fixture *f, const char *channel, const char *sender,
                              const char *body, const char *key, uint64_t *id, size_t *routed) {
  cph_event_in ev = {0};
  ev.channel = (char *)channel;
  ev.sender = (char *)sender;
  ev.body = (char *)body;
  ev.key = (char *)key;
  return post_event(f, &ev, id, routed);
}

static uint32_t inbox_size(fixture *f, const char *id) {
  cph_session_info s;
  cph_err err;
  if (cph_engine_get_session(f->e, id, &s, &err))
    fail_msg("get %s: %s", id, err.msg);
  uint32_t n = s.pending + s.staged;
  cph_session_info_free(&s);
  return n;
}

static void get_aggregates(fixture *f, size_t top, cph_aggregate_info **list, size_t *n) {
  cph_err err;
  if (cph_engine_aggregates(f->e, top, list, n, &err))
    fail_msg("aggregates: %s", err.msg);
}

static void free_aggregates(cph_aggregate_info *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    cph_aggregate_info_free(&list[i]);
  free(list);
}

static uint64_t embed_queue(fixture *f) {
  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  return st.embed_queue;
}

/* ---------------------------------------------------------------- tests */

static void test_exact_duplicate_within_window_is_aggregated_and_folded_not_lost(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  uint64_t first, second, third;
  size_t routed;
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, &first, &routed), CPH_EV_QUEUED);
  assert_int_equal(routed, 1);
  cph_clock_advance(&f->clock, 30 * CPH_NS_PER_S);
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, &second, &routed),
                   CPH_EV_AGGREGATED);
  assert_int_equal(routed, 1); /* it still reaches s1: counted in the queued entry */
  /* normalisation: case and whitespace runs do not make a new message */
  assert_int_equal(post(f, "general", "alice",
                        "  Nightly BACKUP job failed\ton storage node seven  please check the "
                        "logs\n",
                        NULL, &third, &routed),
                   CPH_EV_AGGREGATED);
  assert_true(second > first && third > second);
  assert_int_equal(inbox_size(f, "s1"), 1);

  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 1);
  assert_int_equal(list[0].dup_count, 3); /* the original and two duplicates */
  assert_string_equal(list[0].sample, BACKUP);
  assert_int_equal(list[0].channels.count, 1);
  assert_string_equal(list[0].channels.items[0], "general");
  assert_true(list[0].last_ms - list[0].first_ms >= 30000);
  assert_int_equal(cph_test_event_family(f->e, second), list[0].family);
  assert_int_equal(cph_test_event_family(f->e, third), list[0].family);
  free_aggregates(list, n);

  dedupe_stats st; /* what the metrics export */
  dedupe_stats_get(cph__engine_dedupe(f->e), &st);
  assert_int_equal(st.exact_hits_total, 2);
  assert_int_equal(st.near_hits_total, 0);
  assert_int_equal(st.aggregate_count, 1);
}

static void test_duplicate_after_the_window_is_queued_again(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_QUEUED);
  cph_clock_advance(&f->clock, 61 * CPH_NS_PER_S); /* :window-seconds 60 */
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(inbox_size(f, "s1"), 2);
  /* the window slides from the last occurrence: a repeat within it is caught again */
  cph_clock_advance(&f->clock, 59 * CPH_NS_PER_S);
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_AGGREGATED);
  assert_int_equal(inbox_size(f, "s1"), 2);
}

static void test_short_bodies_are_never_deduplicated(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  assert_int_equal(post(f, "general", "alice", "ok", NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "alice", "ok", NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "alice", "sounds good", NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "alice", "sounds good", NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(inbox_size(f, "s1"), 4);
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 0);
  free(list);
}

static void test_near_duplicate_across_senders_joins_the_same_family_on_a_bulk_channel(
    void **state) {
  fixture *f = *state;
  create_session(f, "s1", "alerts");
  uint64_t orig, near, exact, other;
  assert_int_equal(post(f, "alerts", "alice", BACKUP, NULL, &orig, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "alerts", "bob", BACKUP_8, NULL, &near, NULL), CPH_EV_AGGREGATED);
  assert_int_equal(post(f, "alerts", "alice", BACKUP, NULL, &exact, NULL), CPH_EV_AGGREGATED);
  assert_int_equal(post(f, "alerts", "carol", LUNCH, NULL, &other, NULL), CPH_EV_QUEUED);
  /* the same words from another sender are a near duplicate at distance 0 */
  uint64_t same_other_sender;
  assert_int_equal(post(f, "alerts", "dave", BACKUP, NULL, &same_other_sender, NULL),
                   CPH_EV_AGGREGATED);
  assert_int_equal(inbox_size(f, "s1"), 2); /* the family's entry (4 events) and LUNCH */

  uint64_t fam = cph_test_event_family(f->e, near);
  assert_true(fam > 0);
  assert_int_equal(cph_test_event_family(f->e, exact), fam);
  assert_int_equal(cph_test_event_family(f->e, same_other_sender), fam);
  assert_int_equal(cph_test_event_family(f->e, other), 0);
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 1);
  assert_int_equal(list[0].family, fam);
  assert_int_equal(list[0].dup_count, 4);
  assert_string_equal(list[0].sample, BACKUP); /* the original, not the variant */
  free_aggregates(list, n);
  dedupe_stats st;
  dedupe_stats_get(cph__engine_dedupe(f->e), &st);
  assert_int_equal(st.near_hits_total, 2);
  assert_int_equal(st.exact_hits_total, 1);

  /* near dedupe is per channel: the variant elsewhere is new */
  assert_int_equal(post(f, "ops", "bob", BACKUP_8, NULL, NULL, NULL), CPH_EV_STORED);
}

/* DESIGN §5: on an ordinary channel people are heard one by one — a near variant is its own
 * message; and even on a bulk channel two texts that differ in a number or an identifier are
 * never folded. */
static void test_near_dedupe_folds_only_bulk_traffic_and_never_across_numbers(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  create_session(f, "mon", "alerts");
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "bob", BACKUP_8, NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(inbox_size(f, "s1"), 2);
  const char *depth[] = {"queue depth on worker pool is now 3 items waiting",
                         "queue depth on worker pool is now 12 items waiting",
                         "queue depth on worker pool is now 40 items waiting"};
  for (int i = 0; i < 3; i++)
    assert_int_equal(post(f, "alerts", "nagios", depth[i], NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "alerts", "nagios", "deploy build-41 to staging cluster now", NULL,
                        NULL, NULL),
                   CPH_EV_QUEUED);
  assert_int_equal(post(f, "alerts", "nagios", "deploy build-42 to staging cluster now", NULL,
                        NULL, NULL),
                   CPH_EV_QUEUED);
  assert_int_equal(inbox_size(f, "mon"), 5);
  /* a bulk sender on an ordinary channel folds only its own near repeats */
  assert_int_equal(post(f, "general", "feedbot", BACKUP, NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "feedbot", BACKUP_8, NULL, NULL, NULL), CPH_EV_AGGREGATED);
  assert_int_equal(post(f, "general", "feedbot", LUNCH, NULL, NULL, NULL), CPH_EV_QUEUED);
  assert_int_equal(inbox_size(f, "s1"), 4); /* alice, bob, feedbot's folded pair, lunch */
}

static void test_top_families_are_ordered_by_dup_count(void **state) {
  fixture *f = *state;
  const char *bodies[3] = {"disk usage on db-1 is above ninety percent",
                           "certificate for api.example.com expires in three days",
                           "deploy of release 42 to production finished"};
  const int repeats[3] = {2, 4, 3};
  for (int b = 0; b < 3; b++)
    for (int i = 0; i < repeats[b]; i++)
      post(f, "alerts", "monitor", bodies[b], NULL, NULL, NULL);
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 3);
  assert_int_equal(list[0].dup_count, 4);
  assert_string_equal(list[0].sample, bodies[1]);
  assert_int_equal(list[1].dup_count, 3);
  assert_string_equal(list[1].sample, bodies[2]);
  assert_int_equal(list[2].dup_count, 2);
  free_aggregates(list, n);
  get_aggregates(f, 2, &list, &n);
  assert_int_equal(n, 2);
  assert_int_equal(list[1].dup_count, 3);
  free_aggregates(list, n);
}

static void test_idempotency_key_answers_duplicate_before_content_dedupe(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  uint64_t a, b;
  assert_int_equal(post(f, "general", "alice", BACKUP, "k-1", &a, NULL), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "alice", BACKUP, "k-1", &b, NULL), CPH_EV_DUPLICATE);
  assert_int_equal(a, b);
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 0); /* a key duplicate is not a content duplicate */
  free(list);
}

static void test_memories_are_minted_from_non_duplicates_and_once_per_family(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  uint64_t before = embed_queue(f);
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  post(f, "general", "carol", LUNCH, NULL, NULL, NULL);
  assert_int_equal(embed_queue(f), before + 2); /* one raw memory each, embeddings queued */
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL); /* creates the family */
  assert_int_equal(embed_queue(f), before + 3);          /* its one aggregate memory */
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  assert_int_equal(embed_queue(f), before + 3); /* duplicates mint nothing more */
  post(f, "general", "bob", BACKUP_8, NULL, NULL, NULL); /* not bulk: a message of its own */
  assert_int_equal(embed_queue(f), before + 4);
}

static void test_families_and_exact_dedupe_survive_a_restart(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  cph_engine_close(f->e);
  cph_fixture_open(f);
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_AGGREGATED);
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 1);
  assert_int_equal(list[0].dup_count, 3);
  free_aggregates(list, n);
}

/* Exact-dedupe entries, not family-index ones (whose keys start with a NUL). */
static bool is_exact_entry(void *ctx, const void *k, size_t klen, const void *v, size_t vlen) {
  (void)ctx, (void)klen, (void)v, (void)vlen;
  return ((const uint8_t *)k)[0] != 0;
}

/* Counts exact-dedupe entries in the closed engine's store. */
static size_t count_exact_entries(const char *dir) {
  return cph_fixture_store_each(dir, CPH_DB_DEDUPE, is_exact_entry, NULL);
}

static void test_expired_exact_entries_are_pruned(void **state) {
  fixture *f = *state;
  const char *bodies[4] = {"first message long enough to index", BACKUP, LUNCH,
                           "another distinct message for the index"};
  for (int i = 0; i < 4; i++)
    post(f, "general", "alice", bodies[i], NULL, NULL, NULL);
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL); /* a family: its index entry stays */
  cph_clock_advance(&f->clock, 30 * CPH_NS_PER_S);
  post(f, "general", "bob", "a late message that is still inside the window", NULL, NULL, NULL);
  /* past 4 x the 60 s window of the first five, not of the last one */
  cph_clock_advance(&f->clock, 241 * CPH_NS_PER_S - 30 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e); /* the once-a-second check prunes */
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(count_exact_entries(f->dir), 1);
  cph_fixture_open(f);
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 1); /* families are not pruned */
  free_aggregates(list, n);
}

static bool any_row(void *ctx, const void *k, size_t klen, const void *v, size_t vlen) {
  (void)ctx, (void)k, (void)klen, (void)v, (void)vlen;
  return true;
}

/* The idempotency keys the closed engine's store holds. The engine is opened again with its
 * wall clock where it was: an open takes the real time, so the fake clock goes ahead again by
 * what the test had moved it (ahead_ns). */
static size_t stored_keys(fixture *f, int64_t ahead_ns) {
  cph_engine_close(f->e);
  f->e = NULL;
  size_t n = cph_fixture_store_each(f->dir, CPH_DB_IDEM_KEYS, any_row, NULL);
  cph_fixture_open(f);
  cph_clock_advance(&f->clock, ahead_ns);
  return n;
}

/* An idempotency key counts for :dedupe :key-window-seconds (a day); after that it is
 * forgotten on disk too, in steps of a sweep through the stored keys (1,024 a second when
 * nothing is written), while the keys inside the window stay and still answer `duplicate`.
 * Before, every keyed event left its key in the store for good. */
static void test_idempotency_keys_past_their_window_are_forgotten(void **state) {
  fixture *f = *state;
  enum { OLD = 3000, YOUNG = 10 };
  const int64_t HALF_DAY = 12 * 3600 * CPH_NS_PER_S;
  char key[32], body[32];
  for (int i = 0; i < OLD; i++) {
    snprintf(key, sizeof key, "old-%d", i);
    snprintf(body, sizeof body, "m%d", i);
    assert_int_equal(post(f, "general", "alice", body, key, NULL, NULL), CPH_EV_STORED);
  }
  cph_clock_advance(&f->clock, HALF_DAY);
  for (int i = 0; i < YOUNG; i++) {
    snprintf(key, sizeof key, "young-%d", i);
    snprintf(body, sizeof body, "y%d", i);
    assert_int_equal(post(f, "general", "alice", body, key, NULL, NULL), CPH_EV_STORED);
  }
  /* the old keys a second past their day, the young ones half way through it */
  cph_clock_advance(&f->clock, HALF_DAY + CPH_NS_PER_S);
  /* one step: 1,024 keys looked at and twice those written since the last step (the young
   * ones after the first: that step ran with the first young post), old names first */
  cph_engine_run_pass(f->e);
  int64_t ahead = 2 * HALF_DAY + CPH_NS_PER_S;
  size_t n = stored_keys(f, ahead);
  if (n != OLD + YOUNG - (1024 + 2 * (YOUNG - 1)))
    fail_msg("one step of the sweep left %zu keys; want %d", n,
             OLD + YOUNG - (1024 + 2 * (YOUNG - 1)));
  for (int step = 0; step < 3; step++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    ahead += CPH_NS_PER_S;
    cph_engine_run_pass(f->e);
  }
  n = stored_keys(f, ahead);
  if (n != YOUNG)
    fail_msg("after the sweep %zu keys are stored; want the %d inside their window", n, YOUNG);
  /* what a retry is answered is as before: inside the window the original, past it new */
  assert_int_equal(post(f, "general", "alice", "y3", "young-3", NULL, NULL), CPH_EV_DUPLICATE);
  assert_int_equal(post(f, "general", "alice", "m5", "old-5", NULL, NULL), CPH_EV_STORED);
}

/* Cluster mode's copy marks (dedupe_copy_seen): keys starting 0xFD. */
static bool is_copy_mark(void *ctx, const void *k, size_t klen, const void *v, size_t vlen) {
  (void)ctx, (void)klen, (void)v, (void)vlen;
  return ((const uint8_t *)k)[0] == 0xFD;
}

/* One copy of a message as the cluster log gives it (a forward to session: the time it was
 * accepted, its identity shared with every copy); its status. */
static cph_ingest_status post_copy(fixture *f, const char *session, const char *body,
                                   int64_t ts_ms) {
  cph_event_in ev = {.channel = "general", .sender = "alice", .body = (char *)body,
                     .session = (char *)session, .ts_ms = ts_ms, .only_session = true,
                     .memory_origin = true};
  return post_event(f, &ev, NULL, NULL);
}

/* A repeat's copies on one node count once in its family; the mark that says so lasts as long
 * as the exact entries (4 x the window: the widest a channel may use) and is then pruned. */
static void test_a_repeats_copies_count_once_and_their_mark_is_pruned(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  create_session(f, "s2", "general");
  int64_t t0 = cph_wall_ms();
  assert_int_equal(post_copy(f, "s1", BACKUP, t0), CPH_EV_QUEUED);
  assert_int_equal(post_copy(f, "s1", BACKUP, t0 + 1000), CPH_EV_AGGREGATED);
  assert_int_equal(post_copy(f, "s2", BACKUP, t0 + 1000), CPH_EV_AGGREGATED); /* its copy */
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 10, &list, &n);
  assert_int_equal(n, 1);
  assert_int_equal(list[0].dup_count, 2);
  free_aggregates(list, n);
  assert_int_equal(inbox_size(f, "s2"), 1); /* the copy reached s2 all the same */
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_DEDUPE, is_copy_mark, NULL), 1);
  cph_fixture_open(f);
  cph_clock_advance(&f->clock, 242 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e); /* the once-a-second check prunes */
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_DEDUPE, is_copy_mark, NULL), 0);
  cph_fixture_open(f);
}

/* A repeat writes a newer copy of its entry and leaves the older one for pruning: after a
 * restart the newest copy is the entry, so the window slides from the last repeat. */
static void test_the_newest_copy_of_an_exact_entry_wins_after_a_restart(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  cph_clock_advance(&f->clock, 50 * CPH_NS_PER_S);
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_AGGREGATED);
  cph_engine_close(f->e);
  cph_fixture_open(f); /* the engine's wall clock starts again near the first copy's time */
  cph_clock_advance(&f->clock, 100 * CPH_NS_PER_S); /* 100 s after the first, 50 after the last */
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_AGGREGATED);
}

/* One request of n events on "general" from alice; their statuses into st, ids into ids. */
static void post_request(fixture *f, const char *const *bodies, size_t n,
                         cph_ingest_status *st, uint64_t *ids) {
  cph_event_in ev[16];
  assert_true(n <= 16);
  for (size_t i = 0; i < n; i++)
    ev[i] = (cph_event_in){.channel = "general", .sender = "alice", .body = (char *)bodies[i]};
  cph_op op = {0};
  cph_fixture_ingest(f, ev, n, &op);
  for (size_t i = 0; i < n; i++) {
    st[i] = op.u.ingest.results[i].status;
    ids[i] = op.u.ingest.results[i].id;
  }
  cph_op_clear_results(&op);
}

static bool is_row(void *ctx, const void *k, size_t klen, const void *v, size_t vlen) {
  (void)ctx, (void)v, (void)vlen;
  return klen == 9 && ((const uint8_t *)k)[0] == 0xFE;
}

/* Whether some family's sample is body: the family was made with body's event as the
 * original (its sample is the original's text). */
static bool family_of_original(fixture *f, const char *body) {
  cph_aggregate_info *list;
  size_t n;
  get_aggregates(f, 50, &list, &n);
  bool found = false;
  for (size_t i = 0; i < n; i++)
    found = found || strcmp(list[i].sample, body) == 0;
  free_aggregates(list, n);
  return found;
}

static void restart(fixture *f) {
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_open(f);
}

/* Schema 5: a request's exact entries are one row. Its first, a middle and its last entry are
 * each found by a repeat after a restart, with the event they repeat as the original; a row
 * is pruned once its newest entry has left the widest window, and not before. */
static void test_a_requests_exact_entries_are_one_row_found_after_a_restart(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  static const char *const BODIES[] = {
      "row entry zero says the deploy of alpha finished",
      "row entry one says the deploy of bravo finished",
      "row entry two says the deploy of charlie finished",
      "row entry three says the deploy of delta finished",
      "row entry four says the deploy of echo finished",
      "row entry five says the deploy of foxtrot finished",
      "row entry six says the deploy of golf finished",
      "row entry seven says the deploy of hotel finished",
  };
  cph_ingest_status st[8];
  uint64_t ids[8];
  post_request(f, BODIES, 8, st, ids);
  for (int i = 0; i < 8; i++)
    assert_int_equal(st[i], CPH_EV_QUEUED);
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_DEDUPE, is_row, NULL), 1);
  cph_fixture_open(f);

  cph_clock_advance(&f->clock, 10 * CPH_NS_PER_S); /* a repeat across a restart */
  const char *again[4] = {BODIES[0], BODIES[4], BODIES[7],
                          "a new message in the second request, not a repeat"};
  post_request(f, again, 4, st, ids);
  assert_int_equal(st[0], CPH_EV_AGGREGATED); /* the row's first entry */
  assert_int_equal(st[1], CPH_EV_AGGREGATED); /* a middle one */
  assert_int_equal(st[2], CPH_EV_AGGREGATED); /* its last */
  assert_int_equal(st[3], CPH_EV_QUEUED);
  for (int i = 0; i < 3; i++)
    assert_true(family_of_original(f, again[i]));
  uint64_t fam4 = cph_test_event_family(f->e, ids[1]);
  assert_true(fam4 != 0);

  /* The newer copies, in the second row, are the entries now: found after a restart too.
   * (The engine's wall clock starts again from real time at each open, near the first row's
   * time: each step below advances from there.) */
  restart(f);
  cph_clock_advance(&f->clock, 65 * CPH_NS_PER_S); /* the second row 55 s ago, the first 65 */
  uint64_t id;
  assert_int_equal(post(f, "general", "alice", BODIES[4], NULL, &id, NULL), CPH_EV_AGGREGATED);
  assert_int_equal(cph_test_event_family(f->e, id), fam4);

  /* 4 x the 60 s window after the first row, not after the others: only it goes */
  restart(f);
  cph_clock_advance(&f->clock, 245 * CPH_NS_PER_S); /* rows 245, 235 and 180 s old */
  cph_engine_run_pass(f->e);
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_DEDUPE, is_row, NULL), 2);
  cph_fixture_open(f);
  cph_clock_advance(&f->clock, 255 * CPH_NS_PER_S); /* the second row's newest 245 s old */
  cph_engine_run_pass(f->e);
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_DEDUPE, is_row, NULL), 1);
  cph_fixture_open(f);
}

/* Posts bodies "filter body <first + i> ..." for i < n, in requests of up to 1,000, to a
 * channel nobody subscribes to; each must be answered st (new ones are stored, repeats
 * aggregated). */
static void post_numbered(fixture *f, int first, int n, cph_ingest_status st) {
  enum { PER = 1000 };
  static cph_event_in ev[PER];
  static char bodies[PER][64];
  for (int done = 0; done < n; done += PER) {
    int k = n - done < PER ? n - done : PER;
    for (int i = 0; i < k; i++) {
      snprintf(bodies[i], sizeof bodies[i], "filter body %d is a message of its own",
               first + done + i);
      ev[i] = (cph_event_in){.channel = "filtered", .sender = "bob", .body = bodies[i]};
    }
    cph_op op = {0};
    cph_fixture_ingest(f, ev, (size_t)k, &op);
    for (int i = 0; i < k; i++)
      if (op.u.ingest.results[i].status != st)
        fail_msg("\"%s\": status %d, want %d", bodies[i], (int)op.u.ingest.results[i].status,
                 (int)st);
    cph_op_clear_results(&op);
  }
}

/* The exact-entry filter is sized from the stored rows at open, and a large one (from 2 MiB:
 * 50,000 entries and more) is mapped on its own: stored entries are found after a restart, and
 * the filter grows past its loaded size while ingest goes on (at 98,304 entries: the old table
 * unmapped, every entry rehashed) and loads the larger store again. */
static void test_a_large_filter_loads_whole_and_grows(void **state) {
  fixture *f = *state;
  post_numbered(f, 0, 60000, CPH_EV_STORED);
  restart(f);
  cph_clock_advance(&f->clock, 5 * CPH_NS_PER_S);
  post_numbered(f, 0, 3000, CPH_EV_AGGREGATED); /* repeats: the first rows' */
  post_numbered(f, 57000, 3000, CPH_EV_AGGREGATED); /* and the last rows' */
  post_numbered(f, 60000, 40000, CPH_EV_STORED);  /* 100,000: grows the table while running */
  cph_clock_advance(&f->clock, 5 * CPH_NS_PER_S);
  post_numbered(f, 1000, 1000, CPH_EV_AGGREGATED);
  post_numbered(f, 98000, 2000, CPH_EV_AGGREGATED);
  restart(f);
  cph_clock_advance(&f->clock, 5 * CPH_NS_PER_S);
  post_numbered(f, 30000, 1000, CPH_EV_AGGREGATED);
  post_numbered(f, 59500, 1000, CPH_EV_AGGREGATED); /* across the two runs' rows */
  post_numbered(f, 99000, 1000, CPH_EV_AGGREGATED);
  post_numbered(f, 100000, 10, CPH_EV_STORED);
}

/* A request of more entries than a row holds (4,096) writes several rows; an entry on either
 * side of the cut is found, in the request and after a restart. */
static void test_a_long_requests_entries_span_rows_and_are_all_found(void **state) {
  fixture *f = *state;
  enum { LONG = 4100 };
  static char bodies[LONG][64];
  static cph_event_in ev[LONG];
  for (int i = 0; i < LONG; i++) {
    snprintf(bodies[i], sizeof bodies[i], "burst message number %d of the long request", i);
    ev[i] = (cph_event_in){.channel = "general", .sender = "alice", .body = bodies[i]};
  }
  cph_op op = {0};
  cph_fixture_ingest(f, ev, LONG, &op);
  for (int i = 0; i < LONG; i++)
    assert_int_not_equal(op.u.ingest.results[i].status, CPH_EV_AGGREGATED);
  cph_op_clear_results(&op);
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_DEDUPE, is_row, NULL), 2);
  cph_fixture_open(f);
  const int probe[] = {0, 4095, 4096, LONG - 1};
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 4; i++)
      assert_int_equal(post(f, "general", "alice", bodies[probe[i]], NULL, NULL, NULL),
                       CPH_EV_AGGREGATED);
    restart(f); /* then the newer copies, in rows of one, after a restart */
  }
}

static bool key_matches(void *ctx, const void *k, size_t klen, const void *v, size_t vlen) {
  (void)v, (void)vlen;
  bool (*match)(const uint8_t *, size_t) = *(bool (**)(const uint8_t *, size_t))ctx;
  return match(k, klen);
}

/* Counts the keys `match` accepts in the store's CPH_DB_DEDUPE in dir (closed engine). */
static size_t count_keys(const char *dir, bool (*match)(const uint8_t *k, size_t len)) {
  return cph_fixture_store_each(dir, CPH_DB_DEDUPE, key_matches, &match);
}

static bool is_old_layout(const uint8_t *k, size_t len) { return len && k[0] && k[0] < 0xFE; }
static bool is_time_ordered(const uint8_t *k, size_t len) { return len == 41 && k[0] == 0xFF; }

/* A store written before the time-ordered layout (exact entries keyed channel\0 hash) opens
 * with its entries moved, and its repeats are still caught. */
static void test_old_layout_exact_entries_are_moved_at_open_and_still_match(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  post(f, "general", "alice", BACKUP, NULL, NULL, NULL);
  post(f, "general", "alice", LUNCH, NULL, NULL, NULL);
  cph_engine_close(f->e);
  f->e = NULL;

  /* Rewrite every entry into the old layout, as a build from before would have left it. */
  cph_store_options o = {f->dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st;
  cph_err err;
  if (cph_store_open(&o, &st, &err))
    fail_msg("store: %s", err.msg);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  assert_int_equal(cph_test_dedupe_rows_to_entries(&t), 2); /* the time-ordered layout first */
  for (int moved = 0;; moved++) {
    cph_cursor c;
    assert_int_equal(cph_cursor_open(&t, CPH_DB_DEDUPE, &c), CPH_OK);
    cph_key from = {.data = {0xFF}, .len = 1};
    cph_val k, v;
    int rc = cph_cursor_seek(&c, &from, &k, &v);
    cph_key nk, ok;
    uint8_t val[64];
    size_t vlen = v.len;
    if (rc == CPH_OK) {
      assert_int_equal(k.len, 41);
      assert_true(vlen <= sizeof val);
      memcpy(val, v.data, vlen);
      cph_key_reset(&nk);
      memcpy(nk.data, k.data, k.len);
      nk.len = k.len;
      cph_key_reset(&ok);
      cph_key_str(&ok, "general");
      memcpy(ok.data + ok.len, (const uint8_t *)k.data + 9, 32);
      ok.len += 32;
    }
    cph_cursor_close(&c);
    if (rc == CPH_ENOTFOUND) {
      assert_int_equal(moved, 2);
      break;
    }
    assert_int_equal(rc, CPH_OK);
    assert_int_equal(cph_txn_del(&t, CPH_DB_DEDUPE, &nk), CPH_OK);
    assert_int_equal(cph_txn_put(&t, CPH_DB_DEDUPE, &ok, val, vlen), CPH_OK);
  }
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  assert_int_equal(count_keys(f->dir, is_old_layout), 2);

  cph_fixture_open(f);
  uint64_t id;
  assert_int_equal(post(f, "general", "alice", BACKUP, NULL, &id, NULL), CPH_EV_AGGREGATED);
  assert_true(cph_test_event_family(f->e, id) != 0); /* a family with the original */
  assert_int_equal(post(f, "general", "alice", LUNCH, NULL, NULL, NULL), CPH_EV_AGGREGATED);
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(count_keys(f->dir, is_old_layout), 0);
  assert_true(count_keys(f->dir, is_time_ordered) >= 2);
}

/* ---------------------------------------------------------------- simhash */

static void make_words(char *out, size_t size, unsigned *seed, int n, const char *prefix) {
  out[0] = '\0';
  for (int i = 0; i < n; i++) {
    char w[32];
    snprintf(w, sizeof w, "%s%s%u", i ? " " : "", prefix, (unsigned)(rand_r(seed) % 100000));
    strncat(out, w, size - strlen(out) - 1);
  }
}

static uint64_t sim(const char *text, int k) {
  size_t len;
  char *norm = dedupe_normalise(text, &len);
  uint64_t h = dedupe_simhash(norm, len, k);
  free(norm);
  return h;
}

static void test_simhash_distances(void **state) {
  (void)state;
  /* identical text, identical hash; normalisation first */
  assert_int_equal(sim(BACKUP, 3), sim(BACKUP, 3));
  assert_int_equal(sim("Hello   World,\tthis is  me", 3), sim("hello world, this is me", 3));
  assert_int_equal(dedupe_hamming(sim(BACKUP, 1), sim(BACKUP_8, 1)), 7);
  assert_true(dedupe_hamming(sim(BACKUP, 1), sim(LUNCH, 1)) >= 24);

  /* over many 12-word bodies: one changed word is close, unrelated text is ~32 bits away */
  unsigned seed = 12345;
  const int trials = 500;
  for (int k = 1; k <= 3; k++) {
    long one_word = 0, unrelated = 0;
    int unrelated_min = 64;
    for (int t = 0; t < trials; t++) {
      char a[512], b[512], c[512];
      make_words(a, sizeof a, &seed, 12, "w");
      /* b = a with one word replaced */
      snprintf(b, sizeof b, "%s", a);
      char *words[12];
      int nw = 0;
      for (char *tok = strtok(b, " "); tok && nw < 12; tok = strtok(NULL, " "))
        words[nw++] = tok;
      int at = (int)(rand_r(&seed) % 12);
      char changed[512] = "";
      for (int i = 0; i < nw; i++) {
        if (i)
          strcat(changed, " ");
        strcat(changed, i == at ? "replacedword" : words[i]);
      }
      make_words(c, sizeof c, &seed, 12, "z");
      int d1 = dedupe_hamming(sim(a, k), sim(changed, k));
      int d2 = dedupe_hamming(sim(a, k), sim(c, k));
      one_word += d1;
      unrelated += d2;
      if (d2 < unrelated_min)
        unrelated_min = d2;
    }
    double mean1 = (double)one_word / trials, mean2 = (double)unrelated / trials;
    print_message("simhash k=%d: one-word change mean %.1f bits, unrelated mean %.1f (min %d)\n",
                  k, mean1, mean2, unrelated_min);
    assert_true(mean2 > 26.0);
    assert_true(mean1 < mean2 / 2);
    if (k == 1)
      assert_true(mean1 < 9.0);
  }
}

static uint64_t rand64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* hash with `flips` distinct random bits flipped */
static uint64_t flip_bits(uint64_t hash, int flips, uint64_t *rng) {
  uint64_t mask = 0;
  while (__builtin_popcountll(mask) < flips)
    mask |= 1ull << (rand64(rng) % 64);
  return hash ^ mask;
}

/* The banded index finds every slot within the distance (compared with a linear scan), also
 * after slots were overwritten, on clustered random hashes; and on uniform ones it visits far
 * fewer slots than the scan would. */
static void test_banded_simhash_index_finds_every_pair_within_distance(void **state) {
  (void)state;
  enum { CAP = 1024, CENTERS = 48, QUERIES = 400 };
  static const int distances[] = {0, 3, 7, 10, 15};
  uint64_t rng = 42;
  for (size_t di = 0; di < sizeof distances / sizeof *distances; di++) {
    int d = distances[di];
    simidx x;
    assert_int_equal(simidx_init(&x, CAP, d), CPH_OK);
    uint64_t centers[CENTERS], hashes[CAP];
    for (int c = 0; c < CENTERS; c++)
      centers[c] = rand64(&rng);
    for (int i = 0; i < CAP; i++) {
      hashes[i] = flip_bits(centers[rand64(&rng) % CENTERS], (int)(rand64(&rng) % (d + 5)), &rng);
      simidx_insert(&x, (uint32_t)i, hashes[i]);
    }
    for (int k = 0; k < 600; k++) { /* a ring overwriting its oldest slots */
      uint32_t i = (uint32_t)(rand64(&rng) % CAP);
      simidx_remove(&x, i, hashes[i]);
      hashes[i] = flip_bits(centers[rand64(&rng) % CENTERS], (int)(rand64(&rng) % (d + 5)), &rng);
      simidx_insert(&x, i, hashes[i]);
    }
    long within = 0;
    for (int q = 0; q < QUERIES; q++) {
      uint64_t h = flip_bits(centers[rand64(&rng) % CENTERS], (int)(rand64(&rng) % (d + 3)), &rng);
      static uint8_t seen[CAP];
      memset(seen, 0, sizeof seen);
      for (int b = 0; b < x.bands; b++)
        for (uint32_t i = simidx_first(&x, b, h); i != SIMIDX_NIL; i = simidx_next(&x, b, i))
          seen[i] = 1;
      for (int i = 0; i < CAP; i++)
        if (dedupe_hamming(hashes[i], h) <= d) {
          within++;
          if (!seen[i])
            fail_msg("d=%d: slot %d at distance %d not found", d, i,
                     dedupe_hamming(hashes[i], h));
        }
    }
    assert_true(within > QUERIES); /* the clusters put many pairs within reach */
    simidx_free(&x);
  }

  /* uniform hashes, the default :near-distance 10: about a fifth of the slots are visited */
  simidx x;
  assert_int_equal(simidx_init(&x, CAP, 10), CPH_OK);
  for (int i = 0; i < CAP; i++)
    simidx_insert(&x, (uint32_t)i, rand64(&rng));
  long visited = 0;
  for (int q = 0; q < QUERIES; q++) {
    uint64_t h = rand64(&rng);
    for (int b = 0; b < x.bands; b++)
      for (uint32_t i = simidx_first(&x, b, h); i != SIMIDX_NIL; i = simidx_next(&x, b, i))
        visited++;
  }
  print_message("banded index, d=10: %.0f of %d slots visited per lookup\n",
                (double)visited / QUERIES, CAP);
  assert_true(visited / QUERIES < CAP / 3);
  simidx_free(&x);

  /* bands under 4 bits filter too little: the caller scans instead */
  assert_int_equal(simidx_init(&x, CAP, 16), CPH_EINVAL);
  assert_int_equal(simidx_init(&x, CAP, 64), CPH_EINVAL);
}

/* Through the engine: with more recent messages than the index threshold, a near duplicate of
 * an older one is still found (the indexed path), and unrelated messages stay queued. */
static void test_near_duplicate_found_among_many_recent_messages(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "alerts");
  unsigned seed = 777;
  char body[512];
  for (int i = 0; i < 300; i++) {
    make_words(body, sizeof body, &seed, 12, "u");
    assert_int_equal(post(f, "alerts", "filler", body, NULL, NULL, NULL), CPH_EV_QUEUED);
    if (i == 100)
      assert_int_equal(post(f, "alerts", "alice", BACKUP, NULL, NULL, NULL), CPH_EV_QUEUED);
  }
  assert_int_equal(post(f, "alerts", "bob", BACKUP_8, NULL, NULL, NULL), CPH_EV_AGGREGATED);
  dedupe_stats st;
  dedupe_stats_get(cph__engine_dedupe(f->e), &st);
  assert_int_equal(st.near_hits_total, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_exact_duplicate_within_window_is_aggregated_and_folded_not_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_after_the_window_is_queued_again, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_short_bodies_are_never_deduplicated, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_repeats_copies_count_once_and_their_mark_is_pruned,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_near_dedupe_folds_only_bulk_traffic_and_never_across_numbers, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_near_duplicate_across_senders_joins_the_same_family_on_a_bulk_channel,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_top_families_are_ordered_by_dup_count, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_idempotency_key_answers_duplicate_before_content_dedupe, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_memories_are_minted_from_non_duplicates_and_once_per_family, setup, teardown),
      cmocka_unit_test_setup_teardown(test_families_and_exact_dedupe_survive_a_restart, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_expired_exact_entries_are_pruned, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_keys_past_their_window_are_forgotten, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_the_newest_copy_of_an_exact_entry_wins_after_a_restart,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_a_requests_exact_entries_are_one_row_found_after_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_large_filter_loads_whole_and_grows, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_a_long_requests_entries_span_rows_and_are_all_found,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_old_layout_exact_entries_are_moved_at_open_and_still_match, setup, teardown),
      cmocka_unit_test(test_simhash_distances),
      cmocka_unit_test(test_banded_simhash_index_finds_every_pair_within_distance),
      cmocka_unit_test_setup_teardown(test_near_duplicate_found_among_many_recent_messages, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
