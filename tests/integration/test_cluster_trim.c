/* Cluster mode: the log is trimmed below the shards' watermarks and nothing is lost
 * (server/clusterflow.h 12.) — a real etcd, one NATS JetStream server and three cephalond on
 * 127.0.0.1, trimming every second (:log-trim-seconds 1).
 *
 * One NATS server, so :replicas 1: nats-server 2.9.10 (Debian's) purges safely only without a
 * Raft group under the stream (server/clusterlog.h, "Trimming"); with three servers the nodes
 * refuse to trim there. In order, on one bench:
 *   1. events posted through every node while workers consume them: every acknowledged event
 *      reaches each session it is routed to exactly once (tests/support/cluster_world.h), and
 *      then the stream holds a small fraction of the messages it took — its first sequence has
 *      moved up with the watermarks;
 *   2. events posted and left in part unconsumed, the log trimmed below their shards'
 *      watermarks, then kill -9 of a node: the survivors rebuild its shards from what the log
 *      still holds and every event still reaches each session exactly once, the dead node's
 *      sessions included, and nothing consumed before comes again;
 *   3. kill -9 of another node mid-ingest, workers consuming and the log trimmed meanwhile:
 *      what the dead node had not acknowledged comes again and is forwarded again, exactly once.
 *
 * CPH_CLUSTER_TRIM_EVENTS (default 1200) events in 1, half of that in 2 and 3;
 * CPH_CLUSTER_TRIM_SEED replays a run. Without etcd or nats-server the test fails and says what
 * to install. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <nats/nats.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/cluster_world.h"
#include "tests/support/daemon.h"

#define NODES 3
#define SHARDS 16
#define TTL_S 2
#define MAX_BATCH 16 /* entries per turn: turns consume part of an inbox */

typedef struct bench {
  cph_tcw *w;
  int n_first;
  char extra[256];
} bench;

typedef struct stream_state {
  uint64_t msgs, first, last;
} stream_state;

/* Stream CEPH as the NATS server has it now. */
static stream_state stream_now(cph_test_cluster *c) {
  natsConnection *nc = NULL;
  jsCtx *js = NULL;
  char url[64];
  snprintf(url, sizeof url, "nats://127.0.0.1:%d", c->nats_port[0]);
  assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
  assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
  jsStreamInfo *si = NULL;
  assert_int_equal(js_GetStreamInfo(&si, js, "CEPH", NULL, NULL), NATS_OK);
  stream_state st = {si->State.Msgs, si->State.FirstSeq, si->State.LastSeq};
  jsStreamInfo_Destroy(si);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return st;
}

static int setup(void **state) {
  int64_t t0 = cph_test_now_ms();
  bench *b = calloc(1, sizeof *b);
  cph_test_cluster *c = cph_tc_new();
  c->cluster_extra = ":log-trim-seconds 1";
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  snprintf(b->extra, sizeof b->extra,
           ":sessions {:max-queue 100000 :max-batch %d}\n"
           " :scheduler {:concurrency 64 :lanes {:interactive {:turns 1000000 "
           ":tool-calls 1000000}}}",
           MAX_BATCH);
  b->n_first = cph_tc_env_int("CPH_CLUSTER_TRIM_EVENTS", 1200);
  b->w = cph_tcw_up(c, NODES, SHARDS, TTL_S, b->extra, b->n_first + 2 * (b->n_first / 2),
                    "CPH_CLUSTER_TRIM_SEED", t0);
  *state = b;
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (!b)
    return 0;
  cph_tcw_down(b->w);
  free(b);
  return 0;
}

static void test_cluster_trim_the_stream_keeps_a_fraction_of_what_it_took_and_loses_nothing(
    void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int n = b->n_first;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, 0, n, "t", false, 5, -1, -1);
  cph_tcw_settle_and_check(w, 0, n, t0, 0);
  /* Everything was consumed: each shard's watermark passes its last message, and within a
   * trim period or two the log purges below it. Untrimmed the stream would hold every message it
   * ever took (last - first + 1 with first 1: nothing else deletes from CEPH). */
  stream_state st = stream_now(w->c);
  for (int64_t until = cph_test_now_ms() + 15000;
       cph_test_now_ms() < until && st.msgs * 10 > st.last;) {
    cph_tc_sleep_ms(250);
    st = stream_now(w->c);
  }
  printf("stream CEPH: %llu messages held of %llu taken (first sequence %llu); %lld purged in "
         "%lld trims\n",
         (unsigned long long)st.msgs, (unsigned long long)st.last,
         (unsigned long long)st.first,
         cph_tc_metric_sum(w->c, "cephalon_cluster_log_purged_messages_total", -1),
         cph_tc_metric_sum(w->c, "cephalon_cluster_log_purges_total", -1));
  assert_true(st.last > (uint64_t)n / CPH_TCW_BATCH); /* the log took messages */
  if (st.msgs * 10 > st.last)
    fail_msg("stream CEPH holds %llu of the %llu messages it took 15 s after every event was "
             "consumed: not trimmed (want at most a tenth)",
             (unsigned long long)st.msgs, (unsigned long long)st.last);
  assert_true(cph_tc_metric_sum(w->c, "cephalon_cluster_log_trim_enabled", -1) == NODES);
  assert_true(cph_tc_metric_sum(w->c, "cephalon_cluster_log_purged_messages_total", -1) > 0);
  /* A trim that fails (NATS slow to answer) is only late: the next watermark tries again. */
  long long failures = cph_tc_metric_sum(w->c, "cephalon_cluster_log_purge_failures_total", -1);
  if (failures)
    printf("%lld trims failed (tried again at the next watermark)\n", failures);
  assert_true(failures < cph_tc_metric_sum(w->c, "cephalon_cluster_log_purges_total", -1));
  /* Nothing was delivered again after the purges (a purge that reset a consumer would). */
  cph_tcw_settle_and_check(w, 0, n, t0, 0);
  cph_test_response r = cph_test_http(w->c->port[0], "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  cph_test_promtool_check(r.body);
  cph_test_response_free(&r);
  json_t *v = cph_tc_view(w->c, 0);
  json_t *trim = json_object_get(json_object_get(v, "log"), "trim");
  assert_string_equal(json_string_value(json_object_get(trim, "state")), "trimming");
  json_decref(v);
}

/* Events left in part unconsumed, the log trimmed below their shards' watermarks, then kill -9
 * of a node: its shards are rebuilt elsewhere from what the log still holds (the watermarks and
 * above), and every event reaches each session exactly once. A purge past a watermark would
 * lose the unconsumed events above it here. */
static void test_cluster_trim_a_takeover_after_trimming_rebuilds_without_loss(void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int from = b->n_first, to = from + b->n_first / 2, victim = NODES - 1;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "u", false, 0, -1, -1);
  cph_tcw_wait_applied(w, from, to);
  for (int k = 0; k < NODES; k++) /* part consumed: some inboxes whole, some in part */
    cph_tcw_work(w, k, 3);
  long long purges = cph_tc_metric_sum(w->c, "cephalon_cluster_log_purges_total", -1);
  stream_state before = stream_now(w->c);
  /* A trim round at least, on every node, after the last completions moved the watermarks. */
  for (int64_t until = cph_test_now_ms() + 10000;
       cph_test_now_ms() < until &&
       cph_tc_metric_sum(w->c, "cephalon_cluster_log_purges_total", -1) < purges + NODES;)
    cph_tc_sleep_ms(250);
  cph_tc_sleep_ms(1500);
  stream_state trimmed = stream_now(w->c);
  printf("before the kill: stream CEPH holds %llu messages of %llu (first %llu; %llu before the "
         "last trims)\n",
         (unsigned long long)trimmed.msgs, (unsigned long long)trimmed.last,
         (unsigned long long)trimmed.first, (unsigned long long)before.msgs);
  /* Trimmed (the first sequence may stay put: a shard's epoch is kept as the last message of its
   * done subject when it has no mark since). */
  assert_true(trimmed.msgs < trimmed.last);
  json_int_t events_before = cph_tc_rebuild_sum(w->c, "events_total");
  cph_tc_kill_node(w->c, victim, false);
  bool live[NODES] = {true, true, true};
  live[victim] = false;
  if (!cph_tc_wait_settled(w->c, live, SHARDS, 30000))
    fail_msg("the survivors did not take n%d's shards over within 30 s (logs in %s)", victim,
             w->c->dir);
  json_int_t rebuilt = cph_tc_rebuild_sum(w->c, "events_total") - events_before;
  printf("n%d killed -9: the survivors' rebuilds delivered %lld unconsumed events again\n",
         victim, (long long)rebuilt);
  cph_tcw_settle_and_check(w, from, to, t0, 0);
  cph_tcw_settle_and_check(w, 0, to, t0, 0); /* and nothing consumed before came again */
  assert_true(rebuilt > 0); /* the takeover did rebuild from the trimmed log */
}

/* kill -9 of another node in the middle of ingest, workers consuming meanwhile and the log
 * trimmed every second: the survivor takes every shard, rebuilds, re-applies and forwards again
 * what the dead node had not acknowledged — which its own watermark may already have passed
 * (a channel's message reaches no session where it is applied), so only the consumer's ack floor
 * keeps it from being purged before it comes again. Exactly once for every session. */
static void test_cluster_trim_kill9_mid_ingest_while_trimming_never_loses_a_forward(void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int victim = 1, survivor = 0;
  assert_true(w->c->up[victim] && w->c->up[survivor]);
  int from = b->n_first + b->n_first / 2, to = w->n_evs;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "m", false, 3, from + (to - from) / 3, victim);
  bool live[NODES] = {false};
  live[survivor] = true;
  if (!cph_tc_wait_settled(w->c, live, SHARDS, 30000))
    fail_msg("the survivor did not take every shard over within 30 s (logs in %s)", w->c->dir);
  cph_tcw_settle_and_check(w, from, to, t0, 0);
  cph_tcw_settle_and_check(w, 0, to, t0, 0);
  stream_state st = stream_now(w->c);
  printf("stream CEPH at the end: %llu messages held of %llu taken\n",
         (unsigned long long)st.msgs, (unsigned long long)st.last);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_trim_the_stream_keeps_a_fraction_of_what_it_took_and_loses_nothing),
      cmocka_unit_test(test_cluster_trim_a_takeover_after_trimming_rebuilds_without_loss),
      cmocka_unit_test(test_cluster_trim_kill9_mid_ingest_while_trimming_never_loses_a_forward),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
