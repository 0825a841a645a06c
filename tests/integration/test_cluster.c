/* Cluster mode, first slice (DESIGN §14): a real etcd (Debian etcd-server) and three cephalond
 * on loopback ports. Every shard has one owner and the spread is even; a session's routes
 * answer on its owner and 421 with the owner's URL elsewhere (which cephalonctl follows to the
 * owner), but every node answers for its own janitor; a SIGSTOPped node past its TTL
 * serves nothing when it wakes (and hands out no lease); after kill -9 of a node its shards
 * are owned by the others within the lease TTL plus slack. Without etcd the test fails and
 * says what to install. Everything listens on 127.0.0.1 only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 3
#define SHARDS 256
#define TTL_S 2

/* The bench of tests/support/cluster_fixture.h: etcd and NODES daemons, no NATS. */
typedef cph_test_cluster cluster;

static bool wait_settled(cluster *c, const bool *live, int n_live, int timeout_ms) {
  (void)n_live; /* counted from live[] */
  return cph_tc_wait_settled(c, live, SHARDS, timeout_ms);
}

static json_t *cluster_view(int port) {
  cph_test_response r = cph_test_api(port, "GET", "/v1/cluster", NULL, NULL);
  json_t *j = r.status == 200 ? cph_test_json(&r) : NULL;
  cph_test_response_free(&r);
  return j;
}

static int setup(void **state) {
  cluster *c = cph_tc_new();
  cph_tc_start_etcd(c);
  cph_tc_ports(c, NODES);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S, "");
  *state = c;
  return 0;
}

static int teardown(void **state) {
  cph_tc_free(*state);
  return 0;
}

/* The node answering 200 for a session create; the others must answer 421 naming it. */
static int owner_of_session(cluster *c, const char *id) {
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", id);
  int owner = -1;
  json_t *misdirected[NODES] = {0};
  for (int i = 0; i < NODES; i++) {
    if (!c->up[i])
      continue;
    cph_test_response r = cph_test_api(c->port[i], "POST", "/v1/sessions", NULL, body);
    if (r.status == 200) {
      assert_int_equal(owner, -1);
      owner = i;
    } else {
      assert_int_equal(r.status, 421);
      misdirected[i] = cph_test_json(&r);
    }
    cph_test_response_free(&r);
  }
  assert_true(owner >= 0);
  for (int i = 0; i < NODES; i++) {
    if (!misdirected[i])
      continue;
    json_t *e = json_object_get(misdirected[i], "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "misdirected");
    assert_string_equal(json_string_value(json_object_get(json_object_get(e, "owner"), "url")),
                        c->url[owner]);
    json_decref(misdirected[i]);
  }
  return owner;
}

static void test_cluster_shards_one_owner_each_spread_even_routes_421_to_the_owner(void **state) {
  cluster *c = *state;
  bool live[NODES] = {true, true, true};
  assert_true(wait_settled(c, live, NODES, 10000));

  /* Every node agrees on the map: the owners' ranges are identical on all three. */
  json_t *first = cluster_view(c->port[0]);
  for (int i = 1; i < NODES; i++) {
    json_t *v = cluster_view(c->port[i]);
    assert_true(json_equal(json_object_get(first, "owners"), json_object_get(v, "owners")));
    json_decref(v);
  }
  json_decref(first);

  int owner = owner_of_session(c, "alice");
  char path[128];
  for (int i = 0; i < NODES; i++) {
    cph_test_response r = cph_test_api(c->port[i], "GET", "/v1/sessions/alice", NULL, NULL);
    assert_int_equal(r.status, i == owner ? 200 : 421);
    cph_test_response_free(&r);
  }
  /* The janitor is every node's own: each answers for its janitor, whatever its shard. */
  for (int i = 0; i < NODES; i++) {
    cph_test_response r = cph_test_api(c->port[i], "GET", "/v1/sessions/janitor/why", NULL, NULL);
    if (r.status != 200 || !r.body || !strstr(r.body, "\"session\":\"janitor\""))
      fail_msg("GET /v1/sessions/janitor/why on node %d: %d %s", i, r.status,
               r.body ? r.body : "");
    cph_test_response_free(&r);
  }
  /* An event for the session (no channel: its direct channel) is accepted by its owner only;
   * the owner leases the turn, heartbeats and completes it. */
  for (int i = 0; i < NODES; i++) {
    cph_test_response r = cph_test_api(c->port[i], "POST", "/v1/events", NULL,
                                       "{\"events\":[{\"session\":\"alice\",\"sender\":\"u\","
                                       "\"body\":\"hi\"}]}");
    assert_int_equal(r.status, i == owner ? 200 : 421);
    cph_test_response_free(&r);
  }
  cph_test_response r = cph_test_api(c->port[owner], "POST", "/v1/turns/lease", NULL,
                                     "{\"worker\":\"w\",\"wait_ms\":10000}");
  assert_int_equal(r.status, 200);
  json_t *lease = cph_test_json(&r);
  json_t *turn = json_object_get(lease, "turn");
  cph_test_response_free(&r);
  assert_string_equal(json_string_value(json_object_get(turn, "session")), "alice");
  char body[256];
  cph_test_completion(turn, path, sizeof path, body, sizeof body);
  r = cph_test_api(c->port[owner], "POST", path, NULL, body);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  json_decref(lease);

  /* cephalonctl against a node that does not own alice follows its 421 to the owner once:
   * `sessions show` prints her and `why` answers. */
  int other = (owner + 1) % NODES;
  char bin[512];
  snprintf(bin, sizeof bin, "%s/cephalonctl", getenv("CPH_BIN_DIR"));
  const char *show[] = {bin, "--url", c->url[other], "--json", "sessions", "show", "alice", NULL};
  char *out = NULL, *err = NULL;
  int status = cph_test_run(show, &out, &err);
  json_t *shown = status == 0 ? json_loads(out, 0, NULL) : NULL;
  const char *id = json_string_value(json_object_get(shown, "id"));
  if (!id || strcmp(id, "alice") != 0)
    fail_msg("cephalonctl sessions show alice at node %d (owner %d): exit %d\nstdout: %s\n"
             "stderr: %s", other, owner, status, out, err);
  json_decref(shown);
  free(out);
  free(err);
  const char *why[] = {bin, "--url", c->url[other], "why", "alice", NULL};
  status = cph_test_run(why, &out, &err);
  if (status != 0 || !strstr(out, "alice"))
    fail_msg("cephalonctl why alice at node %d: exit %d\nstdout: %s\nstderr: %s", other, status,
             out, err);
  free(out);
  free(err);
}

static void test_cluster_sigstop_past_ttl_serves_nothing_and_leases_nothing_on_wake(void **state) {
  cluster *c = *state;
  bool live[NODES] = {true, true, true};
  assert_true(wait_settled(c, live, NODES, 10000));
  /* A session with input waiting on its owner, which then stops past its TTL. */
  int owner = owner_of_session(c, "bob");
  cph_test_response r = cph_test_api(c->port[owner], "POST", "/v1/events", NULL,
                                     "{\"events\":[{\"session\":\"bob\",\"sender\":\"u\","
                                     "\"body\":\"hi\"}]}");
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  kill(c->d[owner].pid, SIGSTOP);
  bool others[NODES] = {true, true, true};
  others[owner] = false;
  assert_true(wait_settled(c, others, NODES - 1, (TTL_S + 3) * 1000));
  kill(c->d[owner].pid, SIGCONT);
  /* Awake: its lease deadline has passed, so it serves no shard and hands out no lease —
   * 503 not_serving while it has not joined again; once it has (two etcd calls, which on a
   * loaded machine can come before this request), it holds no shard yet (its old view is
   * forgotten at the join) and answers that there is no turn. Bob's turn is never leased
   * here. */
  r = cph_test_api(c->port[owner], "POST", "/v1/turns/lease", NULL,
                   "{\"worker\":\"w\",\"wait_ms\":0}");
  assert_int_not_equal(r.status, 200);
  if (r.status != 204)
    cph_test_expect_error(&r, 503, "not_serving", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(c->port[owner], "GET", "/v1/sessions/bob", NULL, NULL);
  assert_true(r.status == 503 || r.status == 421);
  cph_test_response_free(&r);
  /* It rejoins and the map settles over three nodes again. */
  assert_true(wait_settled(c, live, NODES, 10000));
}

/* The value of an unlabelled sample in a Prometheus text, or -1. */
static double metric(const char *text, const char *name) {
  char needle[160];
  snprintf(needle, sizeof needle, "\n%s ", name);
  const char *at = strstr(text, needle);
  return at ? strtod(at + strlen(needle), NULL) : -1;
}

static void test_cluster_kill9_moves_its_shards_to_the_others_within_the_ttl(void **state) {
  cluster *c = *state;
  bool live[NODES] = {true, true, true};
  assert_true(wait_settled(c, live, NODES, 10000));
  int victim = NODES - 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cph_test_daemon_signal_wait(&c->d[victim], SIGKILL);
  cph_test_daemon_stop(&c->d[victim]); /* cleans its files; it is gone already */
  c->up[victim] = false;
  live[victim] = false;
  /* TTL plus slack: a poll (250 ms) and the claims. */
  assert_true(wait_settled(c, live, NODES - 1, TTL_S * 1000 + 2000));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("takeover after kill -9: %.2f s (lease TTL %d s)\n", s, TTL_S);
  int owner = owner_of_session(c, "carol");
  assert_true(owner != victim);
  /* The survivors' ownership metrics say so: every shard owned, and how long the shards they
   * took had been without an owner (at most the TTL and the slack). */
  double owned = 0, takeover = 0;
  for (int i = 0; i < NODES; i++) {
    if (!c->up[i])
      continue;
    cph_test_response r = cph_test_api(c->port[i], "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    cph_test_promtool_check(r.body);
    assert_non_null(strstr(r.body, "\ncephalon_cluster_serving 1\n"));
    owned += metric(r.body, "cephalon_cluster_shards_owned");
    double t = metric(r.body, "cephalon_cluster_last_takeover_seconds");
    takeover = t > takeover ? t : takeover;
    cph_test_response_free(&r);
  }
  assert_true(owned == SHARDS);
  printf("the longest a taken shard was without an owner: %.2f s\n", takeover);
  assert_true(takeover > 0 && takeover <= TTL_S + 2.0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_shards_one_owner_each_spread_even_routes_421_to_the_owner),
      cmocka_unit_test(test_cluster_sigstop_past_ttl_serves_nothing_and_leases_nothing_on_wake),
      cmocka_unit_test(test_cluster_kill9_moves_its_shards_to_the_others_within_the_ttl),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
