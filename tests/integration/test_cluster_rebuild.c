/* Cluster mode: a shard that moves is rebuilt from the log (server/clusterflow.h, 5.-8.) — a
 * real etcd, a three-server NATS JetStream cluster and three cephalond on 127.0.0.1.
 *
 * No worker runs while events are posted: they wait in their sessions' inboxes, on every
 * node. Then part of them is consumed (turns completed, answered 200), a turn is leased and
 * left running, and the node owning some of the sessions is killed -9. The survivors take its
 * shards over and rebuild, from the log, the input its sessions had not consumed. The accounting
 * rule of DESIGN §5 is checked over everything (tests/support/cluster_world.h): every
 * acknowledged event reaches each session it was routed to exactly once — counted over the
 * turns completed before the kill and after it, the dead node's sessions included — and none
 * reaches one twice: what a turn answered 200 consumed before the kill is never delivered again
 * (the done marks), what the leased-and-lost turn carried is (it was not consumed). In order:
 *   1. kill -9 of one node of three, a third of the input consumed before;
 *   2. that node comes back on its data and takes its shards back: what its stale sessions
 *      held and the others consumed meanwhile is dropped there, not delivered again;
 *   3. kill -9 of a node right after its last completions answered 200;
 *   4. kill -9 of the last node and a restart on its data: it rebuilds from its own watermarks.
 *
 * CPH_CLUSTER_REBUILD_EVENTS (default 600) events in 1, half of that in 2, 3 and 4;
 * CPH_CLUSTER_REBUILD_SEED replays a run. Without etcd or nats-server the test fails and says
 * what to install. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/cluster_world.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 3
#define SHARDS 16
#define TTL_S 2
#define MAX_BATCH 16 /* entries per turn: turns consume part of an inbox */

typedef struct bench {
  cph_tcw *w;
  int n_first;
  char extra[256]; /* the nodes' policy beyond the fixture's */
  char *kept;      /* the data dir of the node the first test killed */
} bench;

/* Leases one turn on node n and leaves it running (its worker "dies" with the node): what it
 * carries is not consumed. Returns how many entries it carries (0: nothing to lease). */
static int lease_and_leave(cph_tcw *w, int n) {
  cph_test_response r = cph_test_api(w->c->port[n], "POST", "/v1/turns/lease", NULL,
                                     "{\"worker\":\"lost\",\"wait_ms\":0}");
  if (r.status == 204) {
    cph_test_response_free(&r);
    return 0;
  }
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  int staged = (int)json_array_size(json_object_get(json_object_get(j, "turn"), "staged"));
  json_decref(j);
  return staged;
}

/* Waits until the nodes up serve and have bound (so rebuilt) every shard. */
static void settle(cph_tcw *w, const char *what) {
  bool live[CPH_TC_MAX_NODES] = {false};
  for (int n = 0; n < w->c->n_nodes; n++)
    live[n] = w->c->up[n];
  if (!cph_tc_wait_settled(w->c, live, SHARDS, 30000))
    fail_msg("%s: the shards were not all served and bound within 30 s (logs in %s)", what,
             w->c->dir);
}

/* Works turns on node (all nodes: -1) until some completed, for up to 10 s: an applied event
 * is staged by the next scheduler pass, and until then a lease that does not wait answers
 * 204 (under a loaded machine or ASan that pass can come late). Returns the turns done. */
static int work_some(cph_tcw *w, int node, int max_turns) {
  int done = 0;
  for (int64_t until = cph_test_now_ms() + 10000; done == 0 && cph_test_now_ms() < until;) {
    for (int k = 0; k < w->c->n_nodes; k++)
      if (node < 0 || k == node)
        done += cph_tcw_work(w, k, max_turns);
    if (done == 0)
      cph_tc_sleep_ms(50);
  }
  return done;
}

/* Kills node victim (-9; keep: its data dir is returned) and waits until the others serve and
 * have bound (so rebuilt) every shard. */
static char *kill_and_settle(cph_tcw *w, int victim, bool keep) {
  char *dir = cph_tc_kill_node(w->c, victim, keep);
  bool live[CPH_TC_MAX_NODES] = {false};
  for (int n = 0; n < w->c->n_nodes; n++)
    live[n] = w->c->up[n];
  int64_t t0 = cph_test_now_ms();
  if (!cph_tc_wait_settled(w->c, live, SHARDS, 30000))
    fail_msg("the survivors did not take n%d's shards over within 30 s (logs in %s)", victim,
             w->c->dir);
  printf("n%d killed -9: its shards served, rebuilt and bound elsewhere %lld ms later\n", victim,
         (long long)(cph_test_now_ms() - t0));
  return dir;
}

static int setup(void **state) {
  int64_t t0 = cph_test_now_ms();
  bench *b = calloc(1, sizeof *b);
  cph_test_cluster *c = cph_tc_new();
  /* Trimming every second (server/clusterflow.h 12.), so every rebuild here reads a trimmed log
   * — where the NATS servers purge safely: with three servers the nodes refuse to trim before
   * nats-server 2.9.18 (test_cluster_trim trims on one server). */
  c->cluster_extra = ":log-trim-seconds 1";
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 3);
  cph_tc_ports(c, NODES);
  char *extra = b->extra;
  snprintf(extra, sizeof b->extra,
           ":sessions {:max-queue 100000 :max-batch %d}\n"
           " :scheduler {:concurrency 64 :lanes {:interactive {:turns 1000000 "
           ":tool-calls 1000000}}}",
           MAX_BATCH);
  b->n_first = cph_tc_env_int("CPH_CLUSTER_REBUILD_EVENTS", 600);
  b->w = cph_tcw_up(c, NODES, SHARDS, TTL_S, extra, b->n_first + 3 * (b->n_first / 2),
                    "CPH_CLUSTER_REBUILD_SEED", t0);
  *state = b;
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (!b)
    return 0;
  cph_tcw_down(b->w);
  if (b->kept)
    cph_test_rmtree(b->kept);
  free(b->kept);
  free(b);
  return 0;
}

static void test_cluster_rebuild_a_dead_nodes_unconsumed_input_reaches_its_sessions_once_elsewhere(
    void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int victim = NODES - 1, n = b->n_first;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, 0, n, "r", false, 0, -1, -1);
  cph_tcw_wait_applied(w, 0, n);
  /* A part consumed on every node (turns of MAX_BATCH entries: some inboxes in part, some
   * whole, some not at all), then a turn leased on the victim and never completed. */
  int before = work_some(w, -1, 6);
  int staged_before = w->staged;
  int lost_turn = lease_and_leave(w, victim);
  assert_true(before > 0 && lost_turn > 0);
  int victims_sessions = 0;
  for (int s = 0; s < CPH_TCW_SESSIONS; s++)
    victims_sessions += w->owner[s] == victim;
  assert_true(victims_sessions > 0);
  printf("%d turns completed before the kill, consuming %d deliveries; a turn of %d left "
         "running on n%d, which holds %d sessions\n",
         before, staged_before, lost_turn, victim, victims_sessions);
  json_int_t events_before = cph_tc_rebuild_sum(w->c, "events_total");
  long long prepared_before =
      cph_tc_metric_sum(w->c, "cephalon_ingest_prepared_events_total", victim);
  b->kept = kill_and_settle(w, victim, true);
  /* The dead node's unconsumed input was delivered again on the survivors. */
  json_int_t rebuilt = cph_tc_rebuild_sum(w->c, "events_total") - events_before;
  printf("the survivors' rebuilds delivered %lld events again\n", (long long)rebuilt);
  assert_true(rebuilt >= lost_turn);
  /* ... each decoded and prepared by the replay thread that read it, not on the loop */
  long long prepared =
      cph_tc_metric_sum(w->c, "cephalon_ingest_prepared_events_total", victim) -
      prepared_before;
  if (prepared < rebuilt)
    fail_msg("the survivors applied %lld events prepared across the takeover, want at least "
             "the %lld their rebuilds delivered",
             prepared, (long long)rebuilt);
  cph_tcw_settle_and_check(w, 0, n, t0, 0);
  /* Each node has decided whether it trims: `trimming`, or `refused` with why (an R3 stream on
   * a NATS server before 2.9.18) — never purging unchecked. */
  for (int k = 0; k < w->c->n_nodes; k++) {
    if (!w->c->up[k])
      continue;
    json_t *v = cph_tc_view(w->c, k);
    json_t *trim = json_object_get(json_object_get(v, "log"), "trim");
    const char *ts = json_string_value(json_object_get(trim, "state"));
    const char *why = json_string_value(json_object_get(trim, "refused_why"));
    printf("n%d: log.trim.state %s%s%s; %lld messages purged\n", k, ts ? ts : "?",
           why && *why ? ": " : "", why ? why : "",
           (long long)json_integer_value(json_object_get(trim, "purged_messages")));
    assert_true(ts && (strcmp(ts, "trimming") == 0 ||
                       (strcmp(ts, "refused") == 0 && why && strstr(why, "2.9.18"))));
    json_decref(v);
  }
  /* The rebuild's metrics are there and pass promtool. */
  int survivor = w->c->up[0] ? 0 : 1;
  cph_test_response r = cph_test_http(w->c->port[survivor], "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "cephalon_cluster_rebuild_seconds "));
  assert_non_null(strstr(r.body, "cephalon_cluster_rebuild_events_total "));
  cph_test_promtool_check(r.body);
  cph_test_response_free(&r);
}

/* The node killed by the first test comes back on its data, and its shards move back to it. Its
 * stale copies of its sessions still hold the entries they had when it died, which the others
 * consumed since: its rebuild drops those (CPH_OP_INBOX_RETAIN) and delivers what the others
 * applied and did not consume meanwhile. Nothing twice, nothing lost. */
static void test_cluster_rebuild_a_node_that_comes_back_drops_what_others_consumed(void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int back = NODES - 1;
  assert_non_null(b->kept);
  assert_false(w->c->up[back]);
  int from = b->n_first, to = from + b->n_first / 2;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "b", false, 0, -1, -1);
  cph_tcw_wait_applied(w, from, to);
  for (int n = 0; n < NODES; n++)
    cph_tcw_work(w, n, 4);
  cph_tc_start_node_on(w->c, back, SHARDS, TTL_S, b->extra, b->kept);
  b->kept = NULL;
  settle(w, "the node that came back");
  json_t *v = cph_tc_view(w->c, back);
  json_t *rb = json_object_get(json_object_get(v, "log"), "rebuild");
  printf("n%d back: %lld rebuilds there, %lld events delivered again, %lld pending\n", back,
         (long long)json_integer_value(json_object_get(rb, "rebuilds")),
         (long long)json_integer_value(json_object_get(rb, "events_total")),
         (long long)json_integer_value(json_object_get(rb, "pending")));
  assert_true(json_integer_value(json_object_get(rb, "rebuilds")) > 0);
  json_decref(v);
  cph_tcw_settle_and_check(w, from, to, t0, 0);
  cph_tcw_settle_and_check(w, 0, to, t0, 0); /* and nothing of the first test came again */
}

/* The turns completed right before the kill (each answered 200 once the log held the record of
 * what it consumed) are never run again after the takeover; what the node applied and did not
 * hand to a completed turn is delivered once, on the survivor. */
static void test_cluster_rebuild_a_completion_answered_200_is_never_run_again(void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int victim = 1, survivor = 0;
  assert_true(w->c->up[victim] && w->c->up[survivor]);
  int from = b->n_first + b->n_first / 2, to = from + b->n_first / 2;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "c", false, 0, -1, -1);
  cph_tcw_wait_applied(w, from, to);
  int turns = work_some(w, victim, 12);
  assert_true(turns > 0);
  kill_and_settle(w, victim, false); /* at once after the last 200 */
  cph_tcw_settle_and_check(w, from, to, t0, 0);
  cph_tcw_settle_and_check(w, 0, to, t0, 0); /* and nothing of the first test came again */
}

/* A node killed -9 and started again at once on its data (no other node took its shards) reads
 * its shards' past from its own watermarks: the events its inboxes still hold are duplicates
 * for the engine, and pending again only while still in a live inbox; what its turns consumed
 * before the kill does not come again, the input of the turn leased and lost does. */
static void
test_cluster_rebuild_a_node_restarted_on_its_data_neither_loses_nor_repeats(void **state) {
  bench *b = *state;
  cph_tcw *w = b->w;
  int victim = -1;
  for (int n = 0; n < w->c->n_nodes && victim < 0; n++)
    if (w->c->up[n])
      victim = n;
  assert_true(victim >= 0);
  int from = b->n_first + 2 * (b->n_first / 2), to = w->n_evs;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "s", false, 0, -1, -1);
  cph_tcw_wait_applied(w, from, to);
  assert_true(work_some(w, victim, 6) > 0);
  assert_true(lease_and_leave(w, victim) > 0);
  cph_tc_kill_restart_node(w->c, victim, SHARDS, TTL_S, b->extra);
  settle(w, "the restarted node");
  json_int_t pending = cph_tc_rebuild_sum(w->c, "pending");
  json_int_t rebuilds = cph_tc_rebuild_sum(w->c, "rebuilds");
  printf("n%d restarted: %lld rebuilds, %lld events pending again\n", victim, (long long)rebuilds,
         (long long)pending);
  assert_true(rebuilds > 0 && pending > 0);
  cph_tcw_settle_and_check(w, from, to, t0, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_rebuild_a_dead_nodes_unconsumed_input_reaches_its_sessions_once_elsewhere),
      cmocka_unit_test(test_cluster_rebuild_a_node_that_comes_back_drops_what_others_consumed),
      cmocka_unit_test(test_cluster_rebuild_a_completion_answered_200_is_never_run_again),
      cmocka_unit_test(test_cluster_rebuild_a_node_restarted_on_its_data_neither_loses_nor_repeats),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
