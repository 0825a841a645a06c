/* Cluster mode's test bench: etcd, NATS JetStream and cephalond on loopback (see the header). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "testutil.h"

#include <sys/prctl.h>

/* In a forked child: it is killed when the test process ends, however it ends — an abort()
 * in a check (the openapi validator's) skips atexit handlers and teardowns, and daemons,
 * etcd and NATS servers left running would load the machine for every later test and bench. */
static void die_with_parent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) /* it died before the line above */
    _exit(127);
}

/* Every helper process started here, killed at exit if a test aborted before teardown. */
static pid_t g_pids[16];
static bool g_atexit;

static void kill_all_at_exit(void) {
  for (size_t i = 0; i < sizeof g_pids / sizeof g_pids[0]; i++)
    if (g_pids[i] > 0)
      kill(g_pids[i], SIGKILL);
}

static void track(pid_t pid) {
  if (!g_atexit) {
    atexit(kill_all_at_exit);
    g_atexit = true;
  }
  for (size_t i = 0; i < sizeof g_pids / sizeof g_pids[0]; i++)
    if (g_pids[i] <= 0) {
      g_pids[i] = pid;
      return;
    }
}

static void untrack(pid_t pid) {
  for (size_t i = 0; i < sizeof g_pids / sizeof g_pids[0]; i++)
    if (g_pids[i] == pid)
      g_pids[i] = 0;
}

int cph_tc_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

void cph_tc_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

void cph_tc_require(const char *command, const char *install) {
  char script[256];
  snprintf(script, sizeof script, "command -v %s", command);
  const char *argv[] = {"/bin/sh", "-c", script, NULL};
  char *out = NULL, *err = NULL;
  int rc = cph_test_run(argv, &out, &err);
  free(out);
  free(err);
  if (rc != 0)
    fail_msg("%s is not installed: %s", command, install);
}

cph_test_cluster *cph_tc_new(void) {
  cph_test_cluster *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->dir = cph_test_tmpdir("cluster");
  return c;
}

/* Forks argv with stdout to /dev/null and stderr to log; the pid. */
static pid_t spawn(const char *const *argv, const char *log) {
  pid_t parent = getpid();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    die_with_parent(parent);
    /* the test's pipes must not outlive the test */
    if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
      _exit(127);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  track(pid);
  return pid;
}

static bool port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

/* Started again on new ports when it cannot listen (see cph_tc_start_nats), twice at most. */
void cph_tc_start_etcd(cph_test_cluster *c) {
  cph_tc_require("etcd", "cluster mode's tests need Debian's etcd-server (apt-get install "
                         "etcd-server, or scripts/install-deps.sh)");
  char log[512];
  snprintf(log, sizeof log, "%s/etcd.log", c->dir);
  for (int attempt = 0; attempt < 3; attempt++) {
    c->etcd_port = cph_tc_free_port();
    int peer = cph_tc_free_port();
    char data[512], client[64], peer_url[64], initial[96];
    snprintf(data, sizeof data, "%s/etcd-%d", c->dir, attempt);
    snprintf(client, sizeof client, "http://127.0.0.1:%d", c->etcd_port);
    snprintf(peer_url, sizeof peer_url, "http://127.0.0.1:%d", peer);
    snprintf(initial, sizeof initial, "t=%s", peer_url);
    const char *argv[] = {"etcd",   "--name",
                          "t",      "--data-dir",
                          data,     "--listen-client-urls",
                          client,   "--advertise-client-urls",
                          client,   "--listen-peer-urls",
                          peer_url, "--initial-advertise-peer-urls",
                          peer_url, "--initial-cluster",
                          initial,  "--listen-metrics-urls",
                          "",       NULL};
    c->etcd = spawn(argv, log);
    for (int i = 0; i < 100; i++) {
      cph_test_response r = cph_test_http(c->etcd_port, "GET", "/health", NULL, NULL);
      bool ok = r.status == 200;
      cph_test_response_free(&r);
      if (ok)
        return;
      if (waitpid(c->etcd, NULL, WNOHANG) == c->etcd) { /* it exited: a port was taken */
        untrack(c->etcd);
        c->etcd = 0;
        break;
      }
      cph_tc_sleep_ms(100);
    }
    if (c->etcd > 0) {
      kill(c->etcd, SIGKILL);
      waitpid(c->etcd, NULL, 0);
      untrack(c->etcd);
      c->etcd = 0;
    }
    fprintf(stderr, "etcd did not become healthy on 127.0.0.1:%d: starting it again\n",
            c->etcd_port);
  }
  fail_msg("etcd did not become healthy on 127.0.0.1:%d (log: %s)", c->etcd_port, log);
}

/* Spawns server i of n on the ports in c (its JetStream store and log named by attempt). */
static void spawn_nats(cph_test_cluster *c, int i, int n, int attempt) {
  char port[16], name[16], store[512], log[512], cluster[64], routes[256] = "";
  snprintf(port, sizeof port, "%d", c->nats_port[i]);
  snprintf(name, sizeof name, "nats%d", i);
  snprintf(store, sizeof store, "%s/nats%d-%d", c->dir, i, attempt);
  snprintf(log, sizeof log, "%s/nats%d.log", c->dir, i);
  snprintf(cluster, sizeof cluster, "nats://127.0.0.1:%d", c->nats_cport[i]);
  for (int j = 0; j < n; j++) {
    if (j == i)
      continue;
    size_t len = strlen(routes);
    snprintf(routes + len, sizeof routes - len, "%snats://127.0.0.1:%d", len ? "," : "",
             c->nats_cport[j]);
  }
  const char *argv[20];
  int k = 0;
  argv[k++] = "nats-server";
  argv[k++] = "-a";
  argv[k++] = "127.0.0.1";
  argv[k++] = "-p";
  argv[k++] = port;
  argv[k++] = "-n";
  argv[k++] = name;
  argv[k++] = "-js";
  argv[k++] = "-sd";
  argv[k++] = store;
  if (n > 1) {
    argv[k++] = "--cluster_name";
    argv[k++] = "cephtest";
    argv[k++] = "--cluster";
    argv[k++] = cluster;
    argv[k++] = "--routes";
    argv[k++] = routes;
  }
  argv[k] = NULL;
  c->nats[i] = spawn(argv, log);
}

/* Waits up to 10 s for server i to listen; false as soon as it exited (its port was taken). */
static bool nats_listens(cph_test_cluster *c, int i) {
  for (int t = 0; t < 10000; t += 50) {
    if (port_open(c->nats_port[i]))
      return true;
    if (waitpid(c->nats[i], NULL, WNOHANG) == c->nats[i]) {
      untrack(c->nats[i]);
      c->nats[i] = 0;
      return false;
    }
    cph_tc_sleep_ms(50);
  }
  return false;
}

/* A free port is only free when it is asked for: between cph_tc_free_port and the server's
 * bind, any process on the machine may take it (another test's daemon, or a client's
 * connection, whose source port comes from the same range). A server that then cannot listen
 * is started again, with the others, on new ports — twice at most. */
void cph_tc_start_nats(cph_test_cluster *c, int n) {
  cph_tc_require("nats-server", "cluster mode's log needs Debian's nats-server (apt-get install "
                                "nats-server libnats-dev, or scripts/install-deps.sh)");
  assert_true(n >= 1 && n <= CPH_TC_MAX_NATS);
  c->n_nats = n;
  for (int attempt = 0;; attempt++) {
    for (int i = 0; i < n; i++) {
      c->nats_port[i] = cph_tc_free_port();
      c->nats_cport[i] = cph_tc_free_port();
    }
    for (int i = 0; i < n; i++)
      spawn_nats(c, i, n, attempt);
    int down = -1;
    for (int i = 0; i < n && down < 0; i++)
      if (!nats_listens(c, i))
        down = i;
    if (down < 0)
      return;
    if (attempt == 2)
      fail_msg("nats-server %d did not listen on 127.0.0.1:%d (log: %s/nats%d.log)", down,
               c->nats_port[down], c->dir, down);
    fprintf(stderr, "nats-server %d did not listen on 127.0.0.1:%d: starting all %d again on "
                    "other ports\n", down, c->nats_port[down], n);
    for (int i = 0; i < n; i++)
      cph_tc_kill_nats(c, i);
  }
}

void cph_tc_kill_nats(cph_test_cluster *c, int i) {
  if (c->nats[i] <= 0)
    return;
  kill(c->nats[i], SIGKILL);
  waitpid(c->nats[i], NULL, 0);
  untrack(c->nats[i]);
  c->nats[i] = 0;
}

void cph_tc_ports(cph_test_cluster *c, int n) {
  assert_true(n >= 1 && n <= CPH_TC_MAX_NODES);
  c->n_nodes = n;
  for (int i = 0; i < n; i++) {
    c->port[i] = cph_tc_free_port();
    snprintf(c->url[i], sizeof c->url[i], "http://127.0.0.1:%d", c->port[i]);
  }
}

/* Starts node i on data_dir (NULL: a fresh one). */
static void start_node(cph_test_cluster *c, int i, int shards, int ttl_s, const char *extra,
                       const char *data_dir) {
  char nats[512] = "";
  for (int j = 0; j < c->n_nats; j++) {
    size_t len = strlen(nats);
    snprintf(nats + len, sizeof nats - len, "%s\"nats://127.0.0.1:%d\"", j ? " " : "",
             c->nats_port[j]);
  }
  char policy[2048], log_part[600] = "", listen[64];
  if (c->n_nats)
    snprintf(log_part, sizeof log_part, " :nats [%s] :replicas %d", nats, c->n_nats);
  snprintf(policy, sizeof policy,
           "{:store {:sync :none}\n"
           " :cluster {:node \"n%d\" :advertise \"%s\" :etcd [\"http://127.0.0.1:%d\"]\n"
           "           :shards %d :lease-ttl-seconds %d%s %s}\n"
           " %s}\n",
           i, c->url[i], c->etcd_port, shards, ttl_s, log_part,
           c->cluster_extra ? c->cluster_extra : "", extra ? extra : "");
  char *path = cph_test_write_tmpfile(".edn", policy);
  snprintf(listen, sizeof listen, "127.0.0.1:%d", c->port[i]);
  const char *args[] = {"--listen", listen, NULL};
  assert_int_equal(cph_test_daemon_start(&c->d[i], path, data_dir, args), 0);
  assert_int_equal(c->d[i].port, c->port[i]);
  c->up[i] = true;
  free(path);
}

void cph_tc_start_node(cph_test_cluster *c, int i, int shards, int ttl_s, const char *extra) {
  start_node(c, i, shards, ttl_s, extra, NULL);
}

char *cph_tc_kill_node(cph_test_cluster *c, int i, bool keep) {
  assert_true(c->up[i]);
  char *dir = NULL;
  if (keep) {
    c->d[i].keep_data = true;
    dir = strdup(c->d[i].data_dir);
    assert_non_null(dir);
  }
  cph_test_daemon_signal_wait(&c->d[i], SIGKILL);
  cph_test_daemon_stop(&c->d[i]);
  c->up[i] = false;
  return dir;
}

int cph_tc_stop_node(cph_test_cluster *c, int i) {
  assert_true(c->up[i]);
  int rc = cph_test_daemon_stop(&c->d[i]);
  c->up[i] = false;
  return rc;
}

void cph_tc_start_node_on(cph_test_cluster *c, int i, int shards, int ttl_s, const char *extra,
                          char *data_dir) {
  start_node(c, i, shards, ttl_s, extra, data_dir);
  c->d[i].keep_data = false; /* a temp dir as before: removed when the node stops */
  free(data_dir);
}

void cph_tc_kill_restart_node(cph_test_cluster *c, int i, int shards, int ttl_s,
                              const char *extra) {
  cph_tc_start_node_on(c, i, shards, ttl_s, extra, cph_tc_kill_node(c, i, true));
}

int cph_tc_shard_of(const char *id, int shards) {
  char *hex = cph_test_sha256_hex(id);
  assert_non_null(hex);
  char first[17];
  memcpy(first, hex, 16);
  first[16] = '\0';
  free(hex);
  return (int)(strtoull(first, NULL, 16) % (unsigned long long)shards);
}

json_t *cph_tc_view(cph_test_cluster *c, int i) {
  cph_test_response r = cph_test_api(c->port[i], "GET", "/v1/cluster", NULL, NULL);
  json_t *j = r.status == 200 ? cph_test_json(&r) : NULL;
  cph_test_response_free(&r);
  return j;
}

long long cph_tc_log_counter(cph_test_cluster *c, int i, const char *group, const char *name) {
  json_t *v = cph_tc_view(c, i);
  json_t *x = json_object_get(json_object_get(json_object_get(v, "log"), group), name);
  if (!json_is_integer(x))
    fail_msg("n%d's GET /v1/cluster has no log.%s.%s", i, group, name);
  long long out = json_integer_value(x);
  json_decref(v);
  return out;
}

int cph_tc_node_of_url(const cph_test_cluster *c, const char *url) {
  for (int n = 0; url && n < c->n_nodes; n++)
    if (strcmp(c->url[n], url) == 0)
      return n;
  return -1;
}

/* method path body on node n, following a 421 to the owner it names (and waiting out a 503),
 * 50 tries at most: the node that answered 200, and its JSON into *out when out is given. */
static int on_owner(cph_test_cluster *c, int n, const char *method, const char *path,
                    const char *body, json_t **out) {
  for (int tries = 0; tries < 50; tries++) {
    cph_test_response r = cph_test_api(c->port[n], method, path, NULL, body);
    json_t *j = cph_test_json(&r);
    if (r.status == 200) {
      cph_test_response_free(&r);
      if (out)
        *out = j;
      else
        json_decref(j);
      return n;
    }
    const char *url = json_string_value(
        json_object_get(json_object_get(json_object_get(j, "error"), "owner"), "url"));
    int owner = r.status == 421 ? cph_tc_node_of_url(c, url) : -1;
    json_decref(j);
    if (owner < 0 && r.status != 503)
      fail_msg("%s %s on n%d: %d %s", method, path, n, r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
    if (owner >= 0)
      n = owner;
    else
      cph_tc_sleep_ms(100);
  }
  fail_msg("%s %s: no owner answered 200", method, path);
  return -1;
}

int cph_tc_post_on_owner(cph_test_cluster *c, int n, const char *path, const char *body) {
  return on_owner(c, n, "POST", path, body, NULL);
}

int cph_tc_get_on_owner(cph_test_cluster *c, int n, const char *path, json_t **out) {
  return on_owner(c, n, "GET", path, NULL, out);
}

long long cph_tc_rebuild_sum(cph_test_cluster *c, const char *name) {
  long long sum = 0;
  for (int n = 0; n < c->n_nodes; n++) {
    if (!c->up[n])
      continue;
    json_t *v = cph_tc_view(c, n);
    json_t *rb = json_object_get(json_object_get(v, "log"), "rebuild");
    assert_non_null(rb);
    sum += json_integer_value(json_object_get(rb, name));
    json_decref(v);
  }
  return sum;
}

long long cph_tc_metric_sum(cph_test_cluster *c, const char *name, int except) {
  char needle[160];
  snprintf(needle, sizeof needle, "\n%s ", name);
  long long sum = 0;
  for (int n = 0; n < c->n_nodes; n++) {
    if (!c->up[n] || n == except)
      continue;
    cph_test_response r = cph_test_http(c->port[n], "GET", "/metrics", NULL, NULL);
    const char *at = r.body ? strstr(r.body, needle) : NULL;
    if (at)
      sum += atoll(at + strlen(needle));
    cph_test_response_free(&r);
  }
  return sum;
}

int cph_tc_env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : def;
}

static bool settled(cph_test_cluster *c, const bool *live, int shards) {
  int n_live = 0, sum = 0;
  for (int i = 0; i < c->n_nodes; i++)
    n_live += live[i];
  for (int i = 0; i < c->n_nodes; i++) {
    if (!live[i])
      continue;
    json_t *v = cph_tc_view(c, i);
    if (!v)
      return false;
    json_int_t mine = json_integer_value(json_object_get(v, "shards_owned"));
    bool ok = strcmp(json_string_value(json_object_get(v, "state")), "serving") == 0 &&
              json_array_size(json_object_get(v, "nodes")) == (size_t)n_live &&
              json_integer_value(json_object_get(v, "shards_unowned")) == 0 &&
              mine >= shards / n_live && mine <= shards / n_live + 1;
    json_t *log = json_object_get(v, "log");
    if (c->n_nats)
      ok = ok && log && strcmp(json_string_value(json_object_get(log, "state")), "ready") == 0 &&
           json_integer_value(json_object_get(log, "shards_bound")) == mine;
    sum += (int)mine;
    json_decref(v);
    if (!ok)
      return false;
  }
  return sum == shards;
}

bool cph_tc_wait_settled(cph_test_cluster *c, const bool *live, int shards, int timeout_ms) {
  for (int t = 0; t < timeout_ms; t += 100) {
    if (settled(c, live, shards))
      return true;
    cph_tc_sleep_ms(100);
  }
  return false;
}

void cph_tc_free(cph_test_cluster *c) {
  if (!c)
    return;
  /* CPH_TC_KEEP=1 keeps the dir, with every log in it, for a post-mortem. */
  const char *keep = getenv("CPH_TC_KEEP");
  bool keeping = keep && *keep && strcmp(keep, "0") != 0;
  for (int i = 0; i < c->n_nodes; i++)
    if (c->up[i]) {
      kill(c->d[i].pid, SIGCONT);
      char *log = keeping ? cph_test_daemon_log(&c->d[i]) : NULL;
      cph_test_daemon_stop(&c->d[i]);
      if (log) {
        char path[600];
        snprintf(path, sizeof path, "%s/n%d.log", c->dir, i);
        FILE *fp = fopen(path, "w");
        if (fp) {
          fputs(log, fp);
          fclose(fp);
        }
        free(log);
      }
    }
  for (int i = 0; i < c->n_nats; i++)
    if (c->nats[i] > 0) {
      kill(c->nats[i], SIGTERM);
      waitpid(c->nats[i], NULL, 0);
      untrack(c->nats[i]);
    }
  if (c->etcd > 0) {
    kill(c->etcd, SIGTERM);
    waitpid(c->etcd, NULL, 0);
    untrack(c->etcd);
  }
  if (keeping)
    printf("cluster bench kept in %s\n", c->dir);
  else
    cph_test_rmtree(c->dir);
  free(c->dir);
  free(c);
}

void cph_tc_settle(cph_test_cluster *c, int shards, const char *what) {
  bool live[CPH_TC_MAX_NODES] = {false};
  for (int n = 0; n < c->n_nodes; n++)
    live[n] = c->up[n];
  if (cph_tc_wait_settled(c, live, shards, 30000))
    return;
  for (int n = 0; n < c->n_nodes; n++) { /* the end of each node's log, for the post-mortem */
    char *log = c->up[n] ? cph_test_daemon_log(&c->d[n]) : NULL;
    size_t len = log ? strlen(log) : 0;
    if (log)
      fprintf(stderr, "--- the end of n%d's log:\n%s\n", n, len > 4000 ? log + len - 4000 : log);
    free(log);
  }
  fail_msg("%s: the shards were not all served and bound within 30 s (logs in %s)", what,
           c->dir);
}

void cph_tc_wait_known(cph_test_cluster *c, int count) {
  int64_t t0 = cph_test_now_ms();
  for (int n = 0; n < c->n_nodes; n++) {
    while (c->up[n]) {
      json_t *v = cph_tc_view(c, n);
      json_int_t known =
          json_integer_value(json_object_get(json_object_get(v, "log"), "sessions_known"));
      json_decref(v);
      if (known >= count)
        break;
      if (cph_test_now_ms() - t0 > 10000)
        fail_msg("n%d knows %lld of %d sessions after 10 s", n, (long long)known, count);
      cph_tc_sleep_ms(50);
    }
  }
}

cph_test_cluster *cph_tc_up_t(int nodes, int shards, int ttl_s, const char *extra, int n,
                              int *owner) {
  cph_test_cluster *c = cph_tc_new();
  cph_tc_up_with_sessions(c, nodes, shards, ttl_s, extra, n, cph_tc_session_t, NULL, owner);
  return c;
}

int cph_tc_moved(const int *owner, int n, int victim) {
  int moved = 0;
  for (int s = 0; s < n; s++)
    moved += owner[s] == victim;
  assert_true(moved > 0 && moved < n);
  return moved;
}

void cph_tc_up_with_sessions(cph_test_cluster *c, int nodes, int shards, int ttl_s,
                             const char *extra, int n, const char *(*id)(int i, void *ctx),
                             void *ctx, int *owner) {
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, nodes);
  for (int i = 0; i < nodes; i++)
    cph_tc_start_node(c, i, shards, ttl_s, extra);
  cph_tc_settle(c, shards, "start");
  for (int s = 0; s < n; s++) {
    char body[160];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", id(s, ctx));
    owner[s] = cph_tc_post_on_owner(c, s % nodes, "/v1/sessions", body);
  }
  cph_tc_wait_known(c, n);
}

const char *cph_tc_session_t(int s, void *ctx) {
  static char id[16];
  (void)ctx;
  snprintf(id, sizeof id, "t%02d", s);
  return id;
}

void cph_tc_ask(cph_test_cluster *c, int via, int sessions, int round) {
  char body[16384];
  size_t len = (size_t)snprintf(body, sizeof body, "{\"events\":[");
  for (int s = 0; s < sessions && len < sizeof body; s++)
    len += (size_t)snprintf(body + len, sizeof body - len,
                            "%s{\"session\":\"t%02d\",\"sender\":\"ann\",\"key\":\"q%d-%02d\","
                            "\"body\":\"question %d for t%02d\"}",
                            s ? "," : "", s, round, s, round, s);
  if (len + 3 > sizeof body)
    fail_msg("cph_tc_ask: %d sessions do not fit one request", sessions);
  snprintf(body + len, sizeof body - len, "]}");
  cph_test_response r = cph_test_api(c->port[via], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting round %d: %d %s", round, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

void cph_tc_lease_each(cph_test_cluster *c, int n, const int *owner, int sessions,
                       bool (*answer)(void *ctx, int n, json_t *turn, int s), void *ctx,
                       const char *what) {
  bool *done = calloc((size_t)sessions, sizeof *done);
  assert_non_null(done);
  int want = 0, got = 0;
  for (int s = 0; s < sessions; s++)
    want += owner[s] == n;
  int64_t t0 = cph_test_now_ms();
  while (got < want) {
    if (cph_test_now_ms() - t0 > 30000)
      fail_msg("n%d: %d of its %d sessions done in %s after 30 s", n, got, want, what);
    cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL,
                                       "{\"worker\":\"w\",\"wait_ms\":1000}");
    if (r.status == 204) {
      cph_test_response_free(&r);
      continue;
    }
    if (r.status != 200)
      fail_msg("lease on n%d: %d %s", n, r.status, r.body ? r.body : "");
    json_t *j = cph_test_json(&r);
    cph_test_response_free(&r);
    json_t *turn = json_object_get(j, "turn");
    const char *sess = json_string_value(json_object_get(turn, "session"));
    int s = sess ? atoi(sess + 1) : -1;
    assert_true(s >= 0 && s < sessions && owner[s] == n && !done[s]);
    if (answer(ctx, n, turn, s)) {
      done[s] = true;
      got++;
    }
    json_decref(j);
  }
  free(done);
}

void cph_tc_ask_and_answer(cph_test_cluster *c, int nodes, int round, const int *owner,
                           int sessions, bool (*answer)(void *ctx, int n, json_t *turn, int s),
                           void *ctx) {
  cph_tc_ask(c, round % nodes, sessions, round);
  char what[32];
  snprintf(what, sizeof what, "round %d", round);
  for (int n = 0; n < nodes; n++)
    cph_tc_lease_each(c, n, owner, sessions, answer, ctx, what);
}

int cph_tc_back_and_away(cph_test_cluster *c, int victim, int shards, int ttl_s,
                         const char *extra, char *dir, const int *owner, int sessions,
                         void (*check)(void *ctx, const char *when), void *ctx) {
  cph_tc_start_node_on(c, victim, shards, ttl_s, extra, dir);
  cph_tc_settle(c, shards, "the node came back");
  check(ctx, "after the shards moved back");
  int back = 0;
  for (int s = 0; s < sessions; s++)
    back += owner[s] == victim;
  assert_true(back > 0);
  cph_tc_kill_node(c, victim, false);
  cph_tc_settle(c, shards, "the second kill");
  check(ctx, "after the shards moved away again");
  return back;
}

int cph_tc_list_on_owner(cph_test_cluster *c, int n, const char *path, const char *key,
                         size_t max, json_t **out, json_t **items) {
  int owner = cph_tc_get_on_owner(c, n, path, out);
  *items = json_object_get(*out, key);
  if (json_array_size(*items) > max)
    fail_msg("%s lists %zu %s on n%d, more than it ever had", path, json_array_size(*items), key,
             owner);
  return owner;
}

json_t *cph_tc_lease_of(cph_test_cluster *c, int n, const char *session, const char *what) {
  cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL,
                                     "{\"worker\":\"w\",\"wait_ms\":5000}");
  if (r.status != 200)
    fail_msg("%s on n%d: %d %s", what, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  const char *got = json_string_value(json_object_get(json_object_get(j, "turn"), "session"));
  if (!got || strcmp(got, session) != 0)
    fail_msg("%s on n%d: a turn of '%s', not of '%s'", what, n, got ? got : "(none)", session);
  return j;
}

void cph_tc_complete(cph_test_cluster *c, int n, json_t *turn, const char *reply) {
  cph_tc_complete_cost(c, n, turn, reply, 10, 0);
}

cph_test_response cph_tc_complete_try(cph_test_cluster *c, int n, json_t *turn, const char *reply,
                                      int tokens, int tool_calls) {
  char path[96], body[512];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, sizeof body,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":%d,\"tool_calls\":%d},"
           "\"reply\":{\"body\":\"%s\"}}",
           json_string_value(json_object_get(turn, "lease")), tokens, tool_calls, reply);
  return cph_test_api(c->port[n], "POST", path, NULL, body);
}

void cph_tc_complete_cost(cph_test_cluster *c, int n, json_t *turn, const char *reply,
                          int tokens, int tool_calls) {
  cph_test_response r = cph_tc_complete_try(c, n, turn, reply, tokens, tool_calls);
  if (r.status != 200)
    fail_msg("completing turn %lld on n%d: %d %s",
             (long long)json_integer_value(json_object_get(turn, "id")), n, r.status,
             r.body ? r.body : "");
  cph_test_response_free(&r);
}
