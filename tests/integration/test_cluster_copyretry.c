/* Cluster mode: a reply's copy, and an item, that the log did not take are sent again until it
 * does (server/clusterflow.h 14. and 13.) — a real etcd, NATS JetStream and two cephalond on
 * 127.0.0.1.
 *
 * Both nodes start with the test hooks CPH_TEST_FAIL_HIST_COPIES=2,1 and CPH_TEST_FAIL_ITEMS=3
 * (server/clusterflow.c): each copy's first two attempts fail unsent, as if the log had not
 * answered within the deadline, and its third is stored but answered as lost; each item's first
 * three attempts fail unsent. They are sent again 1 s, 2 s and 4 s after those failures; a
 * copy's fourth attempt comes after the stream's deduplication window (:log-dedupe-seconds 2),
 * so the log stores it a second time and the receiving node must hold it by its engine key. Six
 * sessions of one channel, on both nodes, answer a message there; the next message's lease of
 * each must show all six replies once — the other node's only through copies that were sent
 * again. Before, a copy not taken was counted and never sent again: the other node's replies
 * showed 0 times. Then, with a third round's copies and items waiting, one node is stopped
 * (SIGTERM): its stop sends them at once and waits for the log, so the survivor loads every
 * item that node made and its sessions see that node's replies once (before, a stop dropped
 * what waited). A second cluster runs with what may wait
 * shrunk to nothing (CPH_TEST_RESEND_CAP_BYTES=1): every copy and item that fails is dropped,
 * and counted as dropped (fails when the cap's drop is not counted, checked). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 2
#define SHARDS 16
#define TTL_S 2
#define SESSIONS 6
/* Each copy: 2 attempts unsent, 1 stored and answered as lost, then taken (a duplicate, or
 * stored again after the 2 s window): 3 resends, the last ~7 s after the completion. */
#define HIST_HOOK "2,1"
#define HIST_RESENDS 3
/* Each item: 3 attempts unsent (at its making, 1 s and 3 s after), taken ~7 s after it. */
#define ITEM_HOOK "3"

static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}"
    " :sessions {:max-batch 1}";

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int round;
} bench;

/* Starts b's cluster: etcd, one NATS server, two nodes with the copy hook hist_hook (and the
 * item hook, and cap as CPH_TEST_RESEND_CAP_BYTES when given), six sessions of channel
 * "shared" on both nodes. */
static void bench_up(bench *b, const char *hist_hook, const char *cap) {
  cph_test_cluster *c = cph_tc_new();
  b->c = c;
  c->cluster_extra = ":log-dedupe-seconds 2";
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  setenv("CPH_TEST_FAIL_HIST_COPIES", hist_hook, 1); /* the nodes' environment only */
  setenv("CPH_TEST_FAIL_ITEMS", ITEM_HOOK, 1);
  if (cap)
    setenv("CPH_TEST_RESEND_CAP_BYTES", cap, 1);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S, EXTRA);
  unsetenv("CPH_TEST_FAIL_HIST_COPIES");
  unsetenv("CPH_TEST_FAIL_ITEMS");
  unsetenv("CPH_TEST_RESEND_CAP_BYTES");
  cph_tc_settle(c, SHARDS, "start");
  int on[NODES] = {0};
  for (int s = 0; s < SESSIONS; s++) {
    char body[128];
    snprintf(body, sizeof body,
             "{\"id\":\"t%02d\",\"class\":\"interactive\",\"subscribe\":[\"shared\"]}", s);
    b->owner[s] = cph_tc_post_on_owner(c, s % NODES, "/v1/sessions", body);
    on[b->owner[s]]++;
  }
  assert_true(on[0] > 0 && on[1] > 0); /* replies written on both nodes */
  cph_tc_wait_known(c, SESSIONS);
}

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  bench_up(b, HIST_HOOK, NULL);
  *state = b;
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (b)
    cph_tc_free(b->c);
  free(b);
  return 0;
}

/* Waits until no copy or item waits to be sent again on any node and the copies the logs took
 * were applied where they went (40 s at most: a copy's last resend comes ~7 s after its
 * completion). */
static void settle(cph_test_cluster *c, const char *what) {
  int64_t t0 = cph_test_now_ms();
  long long pending = 0, sent = 0, applied = 0;
  while (cph_test_now_ms() - t0 < 40000) {
    pending = sent = applied = 0;
    for (int n = 0; n < NODES; n++) {
      pending += cph_tc_log_counter(c, n, "history_copies", "pending") + cph_tc_log_counter(c, n, "items", "pending");
      sent += cph_tc_log_counter(c, n, "history_copies", "sent");
      applied +=
          cph_tc_log_counter(c, n, "history_copies", "stored") + cph_tc_log_counter(c, n, "history_copies", "held");
    }
    if (pending == 0 && applied >= sent)
      break;
    cph_tc_sleep_ms(200);
  }
  printf("%s: %lld copies and items waiting, %lld copies taken, %lld applied, after %lld ms\n",
         what, pending, sent, applied, (long long)(cph_test_now_ms() - t0));
}

static void post_question(cph_test_cluster *c, int via, int round) {
  char body[160];
  snprintf(body, sizeof body,
           "{\"events\":[{\"channel\":\"shared\",\"sender\":\"bob\",\"body\":\"question %d to "
           "the team\"}]}",
           round);
  cph_test_response r = cph_test_api(c->port[via], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting question %d: %d %s", round, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

/* How many of messages hold text. */
static int count_messages(json_t *messages, const char *text) {
  int count = 0;
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    const char *content = json_string_value(json_object_get(m, "content"));
    count += content && strstr(content, text);
  }
  return count;
}

/* Answers a turn of round b->round; from round 1 on, its lease must show every session's reply
 * of the round before exactly once: those written on the other node reached this one only as
 * copies. */
static bool answer(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  json_t *messages = json_object_get(turn, "messages");
  for (int o = 0; b->round > 0 && o < SESSIONS; o++) {
    char a[64];
    snprintf(a, sizeof a, "reply %d of t%02d", b->round - 1, o);
    int count = count_messages(messages, a);
    if (count != 1) {
      char *dump = json_dumps(messages, JSON_COMPACT);
      fail_msg("t%02d's lease on n%d shows \"%s\" (written on n%d%s) %d times, not once: %s", s,
               n, a, b->owner[o], b->owner[o] == n ? "" : ", a copy sent again", count,
               dump ? dump : "?");
    }
  }
  char reply[64];
  snprintf(reply, sizeof reply, "reply %d of t%02d", b->round, s);
  cph_tc_complete(b->c, n, turn, reply);
  return true;
}

static void test_cluster_copyretry_copies_and_items_the_log_did_not_take_are_sent_again(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int copies[NODES] = {0}; /* each reply goes to the one other node: one copy per session */
  for (int s = 0; s < SESSIONS; s++)
    copies[b->owner[s]]++;
  b->round = 0;
  post_question(c, 0, 0);
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, b->owner, SESSIONS, answer, b, "round 0");
  /* Right after the completions: no copy taken yet (the third attempt, ~3 s after its
   * completion, is answered as lost; the fourth comes ~7 s after it). */
  long long early_sent[NODES], early_pending[NODES];
  for (int n = 0; n < NODES; n++) {
    early_sent[n] = cph_tc_log_counter(c, n, "history_copies", "sent");
    early_pending[n] = cph_tc_log_counter(c, n, "history_copies", "pending");
  }
  settle(c, "round 0");
  /* What a user sees: every agent's next lease shows all six replies once. */
  b->round = 1;
  post_question(c, 1, 1);
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, b->owner, SESSIONS, answer, b, "round 1");
  settle(c, "round 1"); /* its copies and items went through the same faults */
  /* The counters say how: each copy (two rounds) failed once, was sent again three times and
   * taken; none waits, none was dropped; each was stored once where it went — its last
   * resend, a duplicate in the log or stored again after the window, was held there. */
  long long sent = 0, stored = 0, held = 0;
  for (int n = 0; n < NODES; n++) {
    long long failures = cph_tc_log_counter(c, n, "history_copies", "failures");
    long long retries = cph_tc_log_counter(c, n, "history_copies", "retries");
    long long taken = cph_tc_log_counter(c, n, "history_copies", "sent");
    sent += taken;
    stored += cph_tc_log_counter(c, n, "history_copies", "stored");
    held += cph_tc_log_counter(c, n, "history_copies", "held");
    printf("n%d: %d copies: %lld failed, %lld resends, %lld taken (%lld taken and %lld pending "
           "right after round 0)\n",
           n, 2 * copies[n], failures, retries, taken, early_sent[n], early_pending[n]);
    assert_int_equal(early_sent[n], 0);
    assert_int_equal(early_pending[n], copies[n]);
    assert_int_equal(taken, 2 * copies[n]);
    assert_int_equal(failures, 2 * copies[n]);
    assert_true(retries >= (long long)HIST_RESENDS * 2 * copies[n]);
    assert_int_equal(cph_tc_log_counter(c, n, "history_copies", "pending"), 0);
    assert_int_equal(cph_tc_log_counter(c, n, "history_copies", "dropped"), 0);
  }
  printf("copies: %lld taken, %lld stored where they went, %lld held there\n", sent, stored,
         held);
  assert_int_equal(stored, sent);
  assert_true(cph_tc_metric_sum(c, "cephalon_cluster_history_copy_retries_total", -1) >=
              (long long)HIST_RESENDS * 2 * SESSIONS);
  assert_int_equal(cph_tc_metric_sum(c, "cephalon_cluster_history_copies_pending", -1), 0);

  /* A stop sends what waits at once (cph_cflow_stop_begin): round 2's copies and items, made
   * on both nodes, fail their first attempts; the victim is stopped (SIGTERM) at once, long
   * before their back-off would send them again, and its stop sends them and waits until the
   * log took them. Before, a stop dropped them: the survivor's sessions did not see the
   * victim's round-2 replies, nor did the survivor load its round-2 items. */
  int victim = 1, survivor = 0;
  b->round = 2;
  post_question(c, survivor, 2);
  cph_tc_lease_each(c, survivor, b->owner, SESSIONS, answer, b, "round 2");
  cph_tc_lease_each(c, victim, b->owner, SESSIONS, answer, b, "round 2");
  long long put = 0, pending = -1, copies_pending = 0;
  for (int tries = 0; tries < 20; tries++) { /* until the items made by round 2 are all made */
    long long now = cph_tc_log_counter(c, victim, "items", "pending");
    if (now == pending && now > 0)
      break;
    pending = now;
    cph_tc_sleep_ms(250);
  }
  put = cph_tc_log_counter(c, victim, "items", "put");
  copies_pending = cph_tc_log_counter(c, victim, "history_copies", "pending");
  long long loaded0 = cph_tc_log_counter(c, survivor, "items", "loaded");
  printf("n%d before its stop: %lld copies and %lld items waiting to be sent again, %lld items "
         "taken\n",
         victim, copies_pending, pending, put);
  assert_int_equal(copies_pending, copies[victim]);
  assert_true(pending > 0);
  int64_t t0 = cph_test_now_ms();
  int rc = cph_tc_stop_node(c, victim);
  int64_t stop_ms = cph_test_now_ms() - t0;
  printf("n%d stopped in %lld ms (exit %d)\n", victim, (long long)stop_ms, rc);
  assert_int_equal(rc, 0);
  /* its resends went at once (~0.5 s), not after their back-off (~6 s more) nor at the stop's
   * 10 s deadline */
  assert_true(stop_ms < 4000);
  cph_tc_settle(c, SHARDS, "after the stop");
  /* The survivor, serving the victim's sessions now, loads every item the victim made: those
   * taken before, and those its stop sent. */
  long long loaded = 0;
  for (int tries = 0; tries < 100 && loaded < put + pending; tries++) {
    loaded = cph_tc_log_counter(c, survivor, "items", "loaded") - loaded0;
    if (loaded < put + pending)
      cph_tc_sleep_ms(100);
  }
  printf("n%d put %lld items and had %lld waiting at its stop; n%d loaded %lld after it\n",
         victim, put, pending, survivor, loaded);
  assert_int_equal(loaded, put + pending);
  /* And every session, each on the survivor now, sees each round-2 reply once. (The victim's
   * copies went by the same resends as its items; here the sessions the survivor took over
   * bring those replies in their states too, so these leases cannot tell whether they came.) */
  for (int s = 0; s < SESSIONS; s++)
    b->owner[s] = survivor;
  b->round = 3;
  post_question(c, survivor, 3);
  cph_tc_lease_each(c, survivor, b->owner, SESSIONS, answer, b, "round 3");
}

/* The cap test's answer: from round 1 on, a lease shows the round-0 replies of its own node's
 * sessions once and the other node's not at all — their copies were dropped at the cap. */
static bool answer_capped(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  json_t *messages = json_object_get(turn, "messages");
  for (int o = 0; b->round > 0 && o < SESSIONS; o++) {
    char a[64];
    snprintf(a, sizeof a, "reply 0 of t%02d", o);
    int want = b->owner[o] == n ? 1 : 0, count = count_messages(messages, a);
    if (count != want)
      fail_msg("t%02d's lease on n%d shows \"%s\" (written on n%d) %d times, not %d", s, n, a,
               b->owner[o], count, want);
  }
  char reply[64];
  snprintf(reply, sizeof reply, "reply %d of t%02d", b->round, s);
  cph_tc_complete(b->c, n, turn, reply);
  return true;
}

/* At the cap (CPH_TEST_RESEND_CAP_BYTES=1: nothing fits), a copy or an item the log did not
 * take is dropped, not kept to be sent again — and counted where it was dropped: each copy's
 * failure is a drop (log.history_copies.dropped, cephalon_cluster_history_copies_dropped_total),
 * none waits or is sent again, and the other node's sessions do not see those replies. */
static void test_cluster_copyretry_what_the_cap_drops_is_counted(void **state) {
  (void)state;
  bench b = {0};
  bench_up(&b, "1", "1");
  cph_test_cluster *c = b.c;
  int copies[NODES] = {0};
  for (int s = 0; s < SESSIONS; s++)
    copies[b.owner[s]]++;
  post_question(c, 0, 0);
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, b.owner, SESSIONS, answer_capped, &b, "capped round 0");
  settle(c, "capped round 0");
  b.round = 1;
  post_question(c, 1, 1);
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, b.owner, SESSIONS, answer_capped, &b, "capped round 1");
  settle(c, "capped round 1");
  for (int n = 0; n < NODES; n++) {
    long long failures = cph_tc_log_counter(c, n, "history_copies", "failures");
    long long dropped = cph_tc_log_counter(c, n, "history_copies", "dropped");
    printf("n%d, capped: %d copies, %lld failed, %lld dropped; items %lld failed, %lld "
           "dropped\n",
           n, 2 * copies[n], failures, dropped, cph_tc_log_counter(c, n, "items", "failures"),
           cph_tc_log_counter(c, n, "items", "dropped"));
    assert_int_equal(failures, 2 * copies[n]);
    assert_int_equal(dropped, 2 * copies[n]);
    assert_int_equal(cph_tc_log_counter(c, n, "history_copies", "sent"), 0);
    assert_int_equal(cph_tc_log_counter(c, n, "history_copies", "retries"), 0);
    assert_int_equal(cph_tc_log_counter(c, n, "history_copies", "pending"), 0);
    assert_int_equal(cph_tc_log_counter(c, n, "items", "dropped"), cph_tc_log_counter(c, n, "items", "failures"));
    assert_int_equal(cph_tc_log_counter(c, n, "items", "pending"), 0);
  }
  assert_int_equal(cph_tc_metric_sum(c, "cephalon_cluster_history_copies_dropped_total", -1),
                   2 * SESSIONS);
  cph_tc_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_copyretry_copies_and_items_the_log_did_not_take_are_sent_again),
      cmocka_unit_test(test_cluster_copyretry_what_the_cap_drops_is_counted),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
