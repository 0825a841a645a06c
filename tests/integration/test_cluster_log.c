/* Cluster mode with the replicated log (DESIGN §14 "Accepting"; server/clusterflow.h): a real
 * etcd, a three-server NATS JetStream cluster and three cephalond, all on 127.0.0.1.
 *
 * The accounting rule of §5, cluster-wide: events are posted through random nodes to sessions
 * on every shard — to channels whose subscribers live on other nodes, to named sessions, with
 * mentions — some posted twice with the same key; workers lease and complete on every node
 * meanwhile. Every event the log acknowledged reaches each session it is routed to exactly
 * once (its own staged entry, no folding here: every body is distinct), with its text, and no
 * session gets one it was not routed to — also from channel c0, held at backpressure step 5
 * (payloads dropped where an entry shows the text) for most of the run. In order, on one bench:
 *   1. three nodes: exactly once, retried keys answered duplicate with the original pos;
 *   2. a request's unkeyed events of one shard share one log message (one pos), keyed ones
 *      are logged alone; a deleted session leaves every node's session table;
 *   3. after kill -9 of a node the others adopt its sessions: exactly once, for all;
 *   4. kill -9 of another node mid-ingest: exactly once for every session, the dead node's
 *      included (the survivor rebuilds what it had applied and no turn consumed);
 *   5. kill -9 of one NATS server of three mid-ingest: ingest goes on (a request may answer
 *      503 while JetStream elects a new leader; the client retries it with the same keys) and
 *      nothing acknowledged is lost or doubled;
 *   6. with every NATS server gone, ingest answers 503 after its 10 s of retries, never 200.
 *
 * Sizes: CPH_CLUSTER_LOG_EVENTS (default 2000) events in the first test, a third of that in
 * each of 3-5 (CPH_CLUSTER_LOG_SEED replays a run). Without etcd or nats-server the test fails
 * and says what to install. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/cluster_world.h"
#include "tests/support/daemon.h"

#define NODES 3
#define SHARDS 16
#define TTL_S 2

typedef struct world {
  cph_tcw *w;
  int n_first; /* events of the first test */
} world;

static int setup(void **state) {
  int64_t t0 = cph_test_now_ms();
  world *x = calloc(1, sizeof *x);
  cph_test_cluster *c = cph_tc_new();
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 3);
  cph_tc_ports(c, NODES);
  x->n_first = cph_tc_env_int("CPH_CLUSTER_LOG_EVENTS", 2000);
  /* + a third after a node's death, around another's, around a NATS server's */
  x->w = cph_tcw_up(c, NODES, SHARDS, TTL_S,
                    ":sessions {:max-queue 100000}\n"
                    " :scheduler {:concurrency 64 :lanes {:interactive {:turns 1000000 "
                    ":tool-calls 1000000}}}\n"
                    /* c0 at backpressure step 5 within seconds: its forwarded copies (the same
                     * text once per session, exact repeats of each other where sessions share
                     * a node) must keep their text (core/ingest.c, payload_shown_elsewhere) */
                    " :backpressure {:interval-s 1 :channels {\"c0\" {:max-events-per-minute 1}}}",
                    x->n_first + 3 * (x->n_first / 3), "CPH_CLUSTER_LOG_SEED", t0);
  *state = x;
  return 0;
}

static int teardown(void **state) {
  world *x = *state;
  if (!x)
    return 0;
  cph_tcw_down(x->w);
  free(x);
  return 0;
}

static void
test_cluster_log_every_acknowledged_event_reaches_each_routed_session_once(void **state) {
  world *x = *state;
  cph_tcw *w = x->w;
  int n = x->n_first;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, 0, n, "a", false, 5, -1, -1);
  cph_tcw_settle_and_check(w, 0, n, t0, 0);
  /* Every node applied some, and forwards crossed nodes. */
  json_int_t forwarded = 0;
  for (int i = 0; i < NODES; i++) {
    json_t *v = cph_tc_view(w->c, i);
    json_t *log = json_object_get(v, "log");
    assert_true(json_integer_value(json_object_get(log, "applied")) > 0);
    forwarded += json_integer_value(json_object_get(log, "forwarded"));
    json_decref(v);
  }
  assert_true(forwarded > 0);
  /* Everything is applied: no node lags the log (a message counted as held and never let go,
   * or a stale backlog, would keep a node's lag above 0). */
  for (int i = 0; i < NODES; i++) {
    json_int_t lag = -1;
    for (int64_t until = cph_test_now_ms() + 10000; cph_test_now_ms() < until;) {
      json_t *v = cph_tc_view(w->c, i);
      json_t *l = json_object_get(json_object_get(v, "log"), "lag");
      lag = json_is_integer(l) ? json_integer_value(l) : -1;
      json_decref(v);
      if (lag == 0)
        break;
      usleep(100 * 1000);
    }
    if (lag != 0) {
      json_t *v = cph_tc_view(w->c, i);
      char *log = json_dumps(json_object_get(v, "log"), JSON_COMPACT);
      fail_msg("node %d: log.lag %lld 10 s after every event was applied, want 0 (log: %s)", i,
               (long long)lag, log ? log : "?");
    }
  }
  /* Every event was applied from a message decoded and prepared off the loop (the log's
   * delivery threads, clusterflow.c predecode): its text hashes came prepared. */
  long long prepared = 0;
  for (int i = 0; i < NODES; i++) {
    cph_test_response m = cph_test_http(w->c->port[i], "GET", "/metrics", NULL, NULL);
    const char *at = m.body ? strstr(m.body, "\ncephalon_ingest_prepared_events_total ") : NULL;
    if (at)
      prepared += atoll(at + strlen("\ncephalon_ingest_prepared_events_total "));
    cph_test_response_free(&m);
  }
  if (prepared < n)
    fail_msg("%lld events applied prepared on the three nodes, want at least the %d posted",
             prepared, n);
  /* The log's metrics are there and pass promtool. */
  cph_test_response r = cph_test_http(w->c->port[0], "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "cephalon_cluster_log_ready 1\n"));
  assert_non_null(strstr(r.body, "cephalon_cluster_log_applied_total "));
  assert_non_null(strstr(r.body, "\ncephalon_cluster_log_lag_messages 0\n"));
  cph_test_promtool_check(r.body);
  cph_test_response_free(&r);
}

static void test_cluster_log_kill9_of_one_nats_server_mid_ingest_loses_nothing(void **state) {
  world *x = *state;
  cph_tcw *w = x->w;
  int from = x->n_first + 2 * (x->n_first / 3), to = w->n_evs;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "b", true, 5, from + (to - from) / 3, -1);
  cph_tcw_settle_and_check(w, from, to, t0, 0);
}

/* kill -9 of a node: the others take its shards over, adopt its sessions from the session table
 * (rebuilding their unconsumed input from the log: test_cluster_rebuild; here everything was
 * consumed before) and from then on every event reaches every session it is routed to exactly
 * once, the dead node's included. */
static void test_cluster_log_after_a_node_dies_its_sessions_are_served_by_the_others(void **state) {
  world *x = *state;
  cph_tcw *w = x->w;
  int victim = NODES - 1;
  cph_test_daemon_signal_wait(&w->c->d[victim], SIGKILL);
  cph_test_daemon_stop(&w->c->d[victim]);
  w->c->up[victim] = false;
  bool live[NODES] = {true, true, true};
  live[victim] = false;
  int64_t t0 = cph_test_now_ms();
  if (!cph_tc_wait_settled(w->c, live, SHARDS, 20000))
    fail_msg("the survivors did not take the shards over within 20 s");
  printf("shards taken over and bound %lld ms after kill -9\n",
         (long long)(cph_test_now_ms() - t0));
  int moved = 0;
  for (int i = 0; i < CPH_TCW_SESSIONS; i++)
    moved += w->owner[i] == victim;
  assert_true(moved > 0);
  int from = x->n_first, to = x->n_first + x->n_first / 3;
  t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "k", false, 5, -1, -1);
  cph_tcw_settle_and_check(w, from, to, t0, 0);
  for (int i = 0; i < CPH_TCW_SESSIONS; i++) /* its sessions now live on the survivors */
    if (w->owner[i] == victim) {
      char path[64];
      snprintf(path, sizeof path, "/v1/sessions/s%02d", i);
      int found = 0;
      for (int n = 0; n < NODES; n++) {
        if (!w->c->up[n])
          continue;
        cph_test_response r = cph_test_api(w->c->port[n], "GET", path, NULL, NULL);
        found += r.status == 200;
        cph_test_response_free(&r);
      }
      assert_int_equal(found, 1);
    }
}

/* kill -9 of a node in the middle of ingest (between two requests; its pipeline still busy
 * applying and forwarding): the survivor takes its shards over, rebuilds from the log what the
 * dead node had applied and no turn consumed, re-applies what it had not acknowledged and
 * forwards it again under the same ids. Every session, the dead node's included, gets every
 * event exactly once. */
static void test_cluster_log_kill9_of_a_node_mid_ingest_never_delivers_twice(void **state) {
  world *x = *state;
  cph_tcw *w = x->w;
  int victim = 1, survivor = 0;
  assert_true(w->c->up[victim] && w->c->up[survivor]);
  int from = x->n_first + x->n_first / 3, to = from + x->n_first / 3;
  int64_t t0 = cph_test_now_ms();
  cph_tcw_post_events(w, from, to, "m", false, 5, from + (to - from) / 3, victim);
  bool live[NODES] = {false};
  live[survivor] = true;
  if (!cph_tc_wait_settled(w->c, live, SHARDS, 20000))
    fail_msg("the survivor did not take every shard over within 20 s");
  cph_tcw_settle_and_check(w, from, to, t0, 0);
}

/* Batching (clusterflow.h 1.): the events of one request without a key bound for one shard are
 * one log message — they answer one pos —, while an event with a key is logged alone (its own
 * pos, so the log can answer duplicate for it alone). The world's events are mostly batched this
 * way, so the exactly-once checks around this one cover delivery from batch messages (the
 * channel here has no subscriber: these events reach nobody and stay out of the world's count). */
static void
test_cluster_log_a_request_s_unkeyed_events_of_one_shard_share_one_message(void **state) {
  cph_tcw *w = ((world *)*state)->w;
  char body[4096];
  size_t len = (size_t)snprintf(body, sizeof body, "{\"events\":[");
  for (int i = 0; i < 20; i++) {
    char key[48] = "";
    if (i % 2)
      snprintf(key, sizeof key, ",\"key\":\"batch-probe-%d\"", i);
    len += (size_t)snprintf(body + len, sizeof body - len,
                            "%s{\"channel\":\"batch-probe\",\"sender\":\"u\","
                            "\"body\":\"probe %d\"%s}",
                            i ? "," : "", i, key);
  }
  snprintf(body + len, sizeof body - len, "]}");
  cph_test_response r = cph_test_api(w->c->port[cph_tcw_live_node(w)], "POST", "/v1/events", NULL,
                                     body);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  json_t *res = json_object_get(j, "results");
  assert_int_equal(json_array_size(res), 20);
  json_int_t batch_pos = -1;
  json_int_t keyed[10];
  for (int i = 0; i < 20; i++) {
    json_t *e = json_array_get(res, (size_t)i);
    assert_string_equal(json_string_value(json_object_get(e, "status")), "accepted");
    json_int_t pos = json_integer_value(json_object_get(e, "pos"));
    assert_true(pos > 0);
    if (i % 2 == 0) {
      if (batch_pos < 0)
        batch_pos = pos;
      assert_int_equal(pos, batch_pos); /* one message */
    } else {
      keyed[i / 2] = pos;
      for (int k = 0; k < i / 2; k++)
        assert_true(keyed[k] != pos); /* each alone */
    }
  }
  for (int k = 0; k < 10; k++)
    assert_true(keyed[k] != batch_pos);
  json_decref(j);
  cph_test_response_free(&r);
}

/* The session table follows deletions: once a session is deleted on its owner, an event naming
 * it is rejected on every node (nothing is logged for it). */
static void test_cluster_log_a_deleted_session_is_known_nowhere(void **state) {
  cph_tcw *w = ((world *)*state)->w;
  int owner = -1;
  for (int n = 0; n < NODES && owner < 0; n++) {
    cph_test_response r = cph_test_api(w->c->port[n], "POST", "/v1/sessions", NULL,
                                       "{\"id\":\"gone\",\"class\":\"interactive\"}");
    if (r.status == 200)
      owner = n;
    cph_test_response_free(&r);
  }
  assert_true(owner >= 0);
  cph_tcw_wait_sessions_known(w, CPH_TCW_SESSIONS + 1);
  cph_test_response r = cph_test_api(w->c->port[owner], "DELETE", "/v1/sessions/gone", NULL, NULL);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  cph_tcw_wait_sessions_known(w, CPH_TCW_SESSIONS);
  for (int n = 0; n < NODES; n++) {
    r = cph_test_api(w->c->port[n], "POST", "/v1/events", NULL,
                     "{\"events\":[{\"session\":\"gone\",\"sender\":\"u\",\"body\":\"hi\"}]}");
    assert_int_equal(r.status, 200);
    json_t *j = cph_test_json(&r);
    json_t *res = json_array_get(json_object_get(j, "results"), 0);
    assert_string_equal(json_string_value(json_object_get(res, "status")), "rejected");
    assert_string_equal(json_string_value(json_object_get(res, "field")), "session");
    assert_null(json_object_get(res, "pos"));
    json_decref(j);
    cph_test_response_free(&r);
  }
}

/* With no NATS server left, an event is never answered 200: the node retries for 10 s and
 * then answers 503 naming the log. */
static void test_cluster_log_without_the_log_ingest_answers_503_never_200(void **state) {
  cph_tcw *w = ((world *)*state)->w;
  for (int i = 0; i < w->c->n_nats; i++)
    cph_tc_kill_nats(w->c, i);
  int64_t t0 = cph_test_now_ms();
  cph_test_response r =
      cph_test_api(w->c->port[cph_tcw_live_node(w)], "POST", "/v1/events", NULL,
                   "{\"events\":[{\"channel\":\"c1\",\"sender\":\"u\",\"body\":\"lost?\","
                   "\"key\":\"no-log-1\"}]}");
  int64_t took = cph_test_now_ms() - t0;
  cph_test_expect_error(&r, 503, "unavailable", NULL);
  assert_non_null(strstr(r.body, "cluster log"));
  printf("503 after %lld ms: %s\n", (long long)took, r.body);
  assert_true(took >= 9000 && took < 20000);
  cph_test_response_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_log_every_acknowledged_event_reaches_each_routed_session_once),
      cmocka_unit_test(test_cluster_log_a_request_s_unkeyed_events_of_one_shard_share_one_message),
      cmocka_unit_test(test_cluster_log_a_deleted_session_is_known_nowhere),
      cmocka_unit_test(test_cluster_log_after_a_node_dies_its_sessions_are_served_by_the_others),
      cmocka_unit_test(test_cluster_log_kill9_of_a_node_mid_ingest_never_delivers_twice),
      cmocka_unit_test(test_cluster_log_kill9_of_one_nats_server_mid_ingest_loses_nothing),
      cmocka_unit_test(test_cluster_log_without_the_log_ingest_answers_503_never_200),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
