/* Cluster mode, first slice (DESIGN §14): a real etcd (Debian etcd-server) and three cephalond
 * on loopback ports. Every shard has one owner and the spread is even; a session's routes
 * answer on its owner and 421 with the owner's URL elsewhere; a SIGSTOPped node past its TTL
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
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 3
#define SHARDS 256
#define TTL_S 2

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static bool have_etcd(void) {
  const char *argv[] = {"/bin/sh", "-c", "command -v etcd", NULL};
  char *out = NULL, *err = NULL;
  int rc = cph_test_run(argv, &out, &err);
  free(out);
  free(err);
  return rc == 0;
}

typedef struct cluster {
  char *dir;
  pid_t etcd;
  int etcd_port;
  cph_test_daemon d[NODES];
  int port[NODES];
  bool up[NODES];
  char url[NODES][64];
} cluster;

/* An etcd left by a failed setup or an aborted test is stopped at exit. */
static pid_t g_etcd;
static void kill_etcd_at_exit(void) {
  if (g_etcd > 0)
    kill(g_etcd, SIGKILL);
}

static void start_etcd(cluster *c) {
  c->etcd_port = free_port();
  int peer = free_port();
  char data[512], client[64], peer_url[64], initial[96], log[512];
  snprintf(data, sizeof data, "%s/etcd", c->dir);
  snprintf(log, sizeof log, "%s/etcd.log", c->dir);
  snprintf(client, sizeof client, "http://127.0.0.1:%d", c->etcd_port);
  snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", peer);
  snprintf(initial, sizeof initial, "t=%s", peer_url);
  c->etcd = fork();
  assert_true(c->etcd >= 0);
  if (c->etcd > 0) {
    g_etcd = c->etcd;
    atexit(kill_etcd_at_exit);
  }
  if (c->etcd == 0) {
    /* stdout and stderr to the log: the test's pipes must not outlive the test */
    if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
      _exit(127);
    execlp("etcd", "etcd", "--name", "t", "--data-dir", data, "--listen-client-urls", client,
           "--advertise-client-urls", client, "--listen-peer-urls", peer_url,
           "--initial-advertise-peer-urls", peer_url, "--initial-cluster", initial,
           "--listen-metrics-urls", "", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 100; i++) {
    cph_test_response r = cph_test_http(c->etcd_port, "GET", "/health", NULL, NULL);
    bool ok = r.status == 200;
    cph_test_response_free(&r);
    if (ok)
      return;
    sleep_ms(100);
  }
  fail_msg("etcd did not become healthy on 127.0.0.1:%d (log: %s)", c->etcd_port, log);
}

static void start_node(cluster *c, int i) {
  char policy[1024], listen[64];
  snprintf(c->url[i], sizeof c->url[i], "http://127.0.0.1:%d", c->port[i]);
  snprintf(policy, sizeof policy,
           "{:store {:sync :none}\n"
           " :cluster {:node \"n%d\" :advertise \"%s\" :etcd [\"http://127.0.0.1:%d\"]\n"
           "           :shards %d :lease-ttl-seconds %d}}\n",
           i, c->url[i], c->etcd_port, SHARDS, TTL_S);
  char *path = cph_test_write_tmpfile(".edn", policy);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", c->port[i]);
  const char *extra[] = {"--listen", listen, NULL};
  assert_int_equal(cph_test_daemon_start(&c->d[i], path, NULL, extra), 0);
  assert_int_equal(c->d[i].port, c->port[i]);
  c->up[i] = true;
  free(path);
}

static json_t *cluster_view(int port) {
  cph_test_response r = cph_test_api(port, "GET", "/v1/cluster", NULL, NULL);
  json_t *j = r.status == 200 ? cph_test_json(&r) : NULL;
  cph_test_response_free(&r);
  return j;
}

/* True when every node in `live` sees exactly those nodes, all shards held, the spread even
 * (±1) and the owned counts summing to SHARDS. */
static bool settled(cluster *c, const bool *live, int n_live) {
  int sum = 0;
  for (int i = 0; i < NODES; i++) {
    if (!live[i])
      continue;
    json_t *v = cluster_view(c->port[i]);
    if (!v)
      return false;
    bool ok = strcmp(json_string_value(json_object_get(v, "state")), "serving") == 0 &&
              json_array_size(json_object_get(v, "nodes")) == (size_t)n_live &&
              json_integer_value(json_object_get(v, "shards_unowned")) == 0;
    json_int_t mine = json_integer_value(json_object_get(v, "shards_owned"));
    if (mine < SHARDS / n_live || mine > SHARDS / n_live + 1)
      ok = false;
    sum += (int)mine;
    json_decref(v);
    if (!ok)
      return false;
  }
  return sum == SHARDS;
}

static bool wait_settled(cluster *c, const bool *live, int n_live, int timeout_ms) {
  for (int t = 0; t < timeout_ms; t += 100) {
    if (settled(c, live, n_live))
      return true;
    sleep_ms(100);
  }
  return false;
}

static int setup(void **state) {
  if (!have_etcd())
    fail_msg("etcd is not installed: cluster mode's tests need Debian's etcd-server "
             "(apt-get install etcd-server, or scripts/install-deps.sh)");
  cluster *c = calloc(1, sizeof *c);
  c->dir = cph_test_tmpdir("cluster");
  start_etcd(c);
  for (int i = 0; i < NODES; i++)
    c->port[i] = free_port();
  for (int i = 0; i < NODES; i++)
    start_node(c, i);
  *state = c;
  return 0;
}

static int teardown(void **state) {
  cluster *c = *state;
  if (!c)
    return 0;
  for (int i = 0; i < NODES; i++)
    if (c->up[i]) {
      kill(c->d[i].pid, SIGCONT);
      cph_test_daemon_stop(&c->d[i]);
    }
  if (c->etcd > 0) {
    kill(c->etcd, SIGTERM);
    waitpid(c->etcd, NULL, 0);
    g_etcd = 0;
  }
  cph_test_rmtree(c->dir);
  free(c->dir);
  free(c);
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
                                     "{\"worker\":\"w\",\"wait_ms\":2000}");
  assert_int_equal(r.status, 200);
  json_t *lease = cph_test_json(&r);
  json_t *turn = json_object_get(lease, "turn");
  cph_test_response_free(&r);
  assert_string_equal(json_string_value(json_object_get(turn, "session")), "alice");
  char body[256];
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0}}",
           json_string_value(json_object_get(turn, "lease")));
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  r = cph_test_api(c->port[owner], "POST", path, NULL, body);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  json_decref(lease);
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
  /* Awake, before it re-learns anything: its lease deadline has passed, so it serves no
   * shard and hands out no lease. */
  r = cph_test_api(c->port[owner], "POST", "/v1/turns/lease", NULL,
                   "{\"worker\":\"w\",\"wait_ms\":0}");
  assert_int_not_equal(r.status, 200);
  cph_test_expect_error(&r, 503, "not_serving", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(c->port[owner], "GET", "/v1/sessions/bob", NULL, NULL);
  assert_true(r.status == 503 || r.status == 421);
  cph_test_response_free(&r);
  /* It rejoins and the map settles over three nodes again. */
  assert_true(wait_settled(c, live, NODES, 10000));
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
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_shards_one_owner_each_spread_even_routes_421_to_the_owner),
      cmocka_unit_test(test_cluster_sigstop_past_ttl_serves_nothing_and_leases_nothing_on_wake),
      cmocka_unit_test(test_cluster_kill9_moves_its_shards_to_the_others_within_the_ttl),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
