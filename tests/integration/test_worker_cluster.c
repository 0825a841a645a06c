/* cephalon-worker against a cluster (DESIGN §14 "Workers", "Budgets"): given one node, it reads
 * the node list from GET /v1/cluster and long-polls every node, so the turns of sessions on
 * all three nodes are leased, run and completed on their owners; and the nodes share one lane
 * budget and one concurrency limit. A real etcd and three cephalond on
 * loopback (tests/support/cluster_fixture.h, no NATS: each event is posted to the node that
 * owns both its channel and its session), the real worker binary, and a model endpoint served
 * by the test in the OpenAI wire format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/model_double.h"
#include "tests/support/testutil.h"

#define NODES 3
#define SHARDS 16
#define TTL_S 2
#define SESSIONS 9

static int shard_of(const char *id) { return cph_tc_shard_of(id, SHARDS); }

/* owner[shard] = the node index owning it, from GET /v1/cluster on node 0. */
static void shard_owners(cph_test_cluster *c, int owner[SHARDS]) {
  json_t *v = cph_tc_view(c, 0);
  assert_non_null(v);
  for (int s = 0; s < SHARDS; s++)
    owner[s] = -1;
  size_t i;
  json_t *o;
  json_array_foreach(json_object_get(v, "owners"), i, o) {
    const char *node = json_string_value(json_object_get(o, "node"));
    int idx = node && node[0] == 'n' ? atoi(node + 1) : -1;
    char ranges[512];
    snprintf(ranges, sizeof ranges, "%s", json_string_value(json_object_get(o, "ranges")));
    char *save = NULL;
    for (char *r = strtok_r(ranges, ",", &save); r; r = strtok_r(NULL, ",", &save)) {
      int lo = atoi(r), hi = strchr(r, '-') ? atoi(strchr(r, '-') + 1) : lo;
      for (int s = lo; s <= hi && s < SHARDS; s++)
        owner[s] = idx;
    }
  }
  json_decref(v);
  for (int s = 0; s < SHARDS; s++)
    assert_true(owner[s] >= 0 && owner[s] < NODES);
}

/* etcd and three nodes with `extra` in their policies, settled (every shard owned); owner[]
 * is each shard's node. */
static cph_test_cluster *start_three(const char *cluster_extra, const char *extra,
                                     int owner[SHARDS]) {
  cph_test_cluster *c = cph_tc_new();
  c->cluster_extra = cluster_extra;
  cph_tc_start_etcd(c);
  cph_tc_ports(c, NODES);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S, extra);
  bool live[NODES] = {true, true, true};
  assert_true(cph_tc_wait_settled(c, live, SHARDS, 15000));
  shard_owners(c, owner);
  return c;
}

static void model(void *arg, const cph_md_request *rq, cph_md_answer *out) {
  (void)arg;
  if (strcmp(rq->path, "/v1/chat/completions") != 0) {
    out->status = 404;
    out->body = cph_md_error_body("no such route");
    return;
  }
  /* The answer names the session's own last message, so each reply shows its turn. */
  json_t *msgs = json_object_get(rq->json, "messages");
  const char *last = json_string_value(
      json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content"));
  char reply[256];
  snprintf(reply, sizeof reply, "done: %s", last ? last : "?");
  out->status = 200;
  out->body = cph_md_chat_text(reply, 9);
}

/* cephalon-worker told only of node 0, with --concurrency conc; its output goes to log. */
static pid_t start_worker(cph_test_cluster *c, cph_md *md, const char *log, const char *conc) {
  char llm[96], exe[512];
  snprintf(llm, sizeof llm, "%s/v1", cph_md_url(md));
  const char *bin = getenv("CPH_BIN_DIR");
  assert_non_null(bin);
  snprintf(exe, sizeof exe, "%s/cephalon-worker", bin);
  const char *argv[] = {
      exe,   "--daemon", c->url[0],        "--llm",         llm,  "--model", "m", "--lease-wait-ms",
      "500", "--name",   "cluster-worker", "--concurrency", conc, NULL};
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_APPEND);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

/* Creates session id on its owner with extra JSON members; returns the owner. */
static int create_session(cph_test_cluster *c, const int owner[SHARDS], const char *id,
                          const char *extra) {
  int node = owner[shard_of(id)];
  char body[512];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"%s}", id, extra);
  cph_test_response r = cph_test_api(c->port[node], "POST", "/v1/sessions", NULL, body);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  return node;
}

/* The sum over the nodes of one series of GET /metrics. */
static double metric_sum(cph_test_cluster *c, const char *series) {
  double sum = 0;
  for (int i = 0; i < NODES; i++) {
    cph_test_response r = cph_test_api(c->port[i], "GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    const char *at = strstr(r.body, series);
    if (at)
      sum += strtod(at + strlen(series), NULL);
    cph_test_response_free(&r);
  }
  return sum;
}

static void test_the_worker_finds_every_node_and_completes_turns_on_each(void **state) {
  (void)state;
  int owner[SHARDS];
  cph_test_cluster *c = start_three(NULL, "", owner);

  /* Sessions on every node, each listening to a channel its own node owns. */
  char ids[SESSIONS][16], chans[SESSIONS][32];
  int node_of[SESSIONS], per_node[NODES] = {0};
  for (int k = 0; k < SESSIONS; k++) {
    int n = 0;
    for (;; n++) { /* ids until each node has SESSIONS / NODES */
      snprintf(ids[k], sizeof ids[k], "w%d-%d", k, n);
      if (per_node[owner[shard_of(ids[k])]] < SESSIONS / NODES)
        break;
    }
    node_of[k] = owner[shard_of(ids[k])];
    per_node[node_of[k]]++;
    for (n = 0;; n++) {
      snprintf(chans[k], sizeof chans[k], "c-%s-%d", ids[k], n);
      if (owner[shard_of(chans[k])] == node_of[k])
        break;
    }
    char body[256];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"%s\"]}",
             ids[k], chans[k]);
    cph_test_response r = cph_test_api(c->port[node_of[k]], "POST", "/v1/sessions", NULL, body);
    assert_int_equal(r.status, 200);
    cph_test_response_free(&r);
    snprintf(body, sizeof body,
             "{\"events\":[{\"channel\":\"%s\",\"sender\":\"ann\",\"body\":\"task %d\"}]}",
             chans[k], k);
    r = cph_test_api(c->port[node_of[k]], "POST", "/v1/events", NULL, body);
    assert_int_equal(r.status, 200);
    cph_test_response_free(&r);
  }
  for (int i = 0; i < NODES; i++)
    assert_int_equal(per_node[i], SESSIONS / NODES);

  /* One worker, told only of node 0. */
  cph_md *md = cph_md_start(model, NULL, NULL, NULL);
  char *log = cph_test_write_tmpfile(".worker.log", "");
  pid_t pid = start_worker(c, md, log, "1");

  /* Every session's reply appears on its own node. */
  int done = 0;
  for (int waited = 0; waited < 30000 && done < SESSIONS; waited += 200) {
    cph_tc_sleep_ms(200);
    done = 0;
    for (int k = 0; k < SESSIONS; k++) {
      cph_test_response r =
          cph_test_api(c->port[node_of[k]], "GET", "/v1/replies?after=0", NULL, NULL);
      json_t *j = cph_test_json(&r);
      char want[64];
      snprintf(want, sizeof want, "done: task %d", k);
      size_t i;
      json_t *rep;
      bool found = false;
      json_array_foreach(json_object_get(j, "replies"), i, rep) {
        const char *b = json_string_value(json_object_get(rep, "body"));
        const char *s = json_string_value(json_object_get(rep, "session"));
        found |= b && s && strstr(b, want) && strcmp(s, ids[k]) == 0;
      }
      done += found;
      json_decref(j);
      cph_test_response_free(&r);
    }
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  char *text = cph_test_read_file(log, NULL);
  if (done < SESSIONS)
    fail_msg("%d of %d sessions got their reply; worker log:\n%s", done, SESSIONS,
             text ? text : "");
  assert_non_null(strstr(text, "cluster: long-polling every node"));
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  free(text);
  unlink(log);
  free(log);
  cph_md_stop(md);
  cph_tc_free(c);
}

/* DESIGN §14 "Budgets": the lane budget is the cluster's, not each node's. Nine sessions on
 * three nodes want a turn every second (autonomy ticks) against an interactive budget of 12 a
 * minute; over the run the cluster starts at most 12 × T/60 + 12 turns (§3 rule 1) — where
 * three nodes each spending the whole budget would start 36 at once — and the nodes' shares,
 * rebalanced every second, sum to about one. */
static void test_the_nodes_share_one_lane_budget(void **state) {
  (void)state;
  enum { BUDGET = 12, RUN_S = 15 };
  char extra[256];
  snprintf(extra, sizeof extra, ":scheduler {:lanes {:interactive {:turns %d :tool-calls 1000}}}",
           BUDGET);
  int owner[SHARDS];
  cph_test_cluster *c = start_three(NULL, extra, owner);
  int per_node[NODES] = {0};
  for (int k = 0, n = 0; k < SESSIONS; n++) {
    char id[16];
    snprintf(id, sizeof id, "t%d", n);
    if (per_node[owner[shard_of(id)]] == SESSIONS / NODES)
      continue;
    per_node[create_session(c, owner, id, ",\"autonomy_interval_s\":1")]++;
    k++;
  }
  cph_md *md = cph_md_start(model, NULL, NULL, NULL);
  char *log = cph_test_write_tmpfile(".worker.log", "");
  int64_t t0 = cph_test_now_ms();
  pid_t pid = start_worker(c, md, log, "3");
  double shares = 0;
  for (int waited = 0; waited < RUN_S * 1000; waited += 500) {
    cph_tc_sleep_ms(500);
    if (waited == RUN_S * 500) { /* midway: the shares of the interactive lane */
      shares = 0;
      for (int i = 0; i < NODES; i++) {
        json_t *v = cph_tc_view(c, i);
        shares +=
            json_real_value(json_object_get(json_object_get(v, "budget_share"), "interactive"));
        json_decref(v);
      }
    }
  }
  double started = metric_sum(c, "cephalon_turns_started_total{lane=\"interactive\"}");
  double secs = (double)(cph_test_now_ms() - t0) / 1000.0;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  double bound = BUDGET * secs / 60.0 + BUDGET;
  print_message("%.0f interactive turns started in %.1f s over three nodes (bound %.1f); the "
                "shares sum to %.3f\n",
                started, secs, bound, shares);
  if (started > bound || started < 1) {
    char *text = cph_test_read_file(log, NULL);
    fail_msg("%.0f turns started in %.1f s, bound %.1f; worker log:\n%s", started, secs, bound,
             text ? text : "");
  }
  /* Each node works its share out from the demand keys as it read them: the sum is one when
   * their reads agree, near it when a demand changed between two reads. */
  assert_true(shares > 0.8 && shares < 1.2);
  unlink(log);
  free(log);
  cph_md_stop(md);
  cph_tc_free(c);
}

/* The turns leased on each node (its concurrency in use, GET /v1/lanes), summed. */
static long running_sum(cph_test_cluster *c) {
  long sum = 0;
  for (int i = 0; i < NODES; i++) {
    cph_test_response r = cph_test_api(c->port[i], "GET", "/v1/lanes", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *v = json_loads(r.body, 0, NULL);
    sum += (long)json_integer_value(json_object_get(json_object_get(v, "concurrency"), "in_use"));
    json_decref(v);
    cph_test_response_free(&r);
  }
  return sum;
}

/* DESIGN §14 "Budgets": with :cluster :concurrency 2 the cluster runs at most two turns at
 * once, where each node's :scheduler :concurrency 4 would let the three run nine. Nine
 * sessions on three nodes have input; every half second a client completes the turns it
 * holds and leases everything it can on every node, holding it, so what it holds is what the
 * cluster lets run at once. As sessions are served their nodes' demand falls and the slots
 * move (etcd keys, cluster.c) to the nodes still waiting: every session gets its turn, and
 * never more than two run. */
static void test_the_nodes_share_one_concurrency_limit(void **state) {
  (void)state;
  enum { LIMIT = 2, PER_NODE = 4, MAX_HELD = 16 };
  char extra[256];
  snprintf(extra, sizeof extra, /* budgets that never bind: only concurrency holds turns back */
           ":scheduler {:concurrency %d :lanes {:interactive {:turns 100000 :tool-calls 100000}}}",
           PER_NODE);
  int owner[SHARDS];
  cph_test_cluster *c = start_three(":concurrency 2", extra, owner);
  int per_node[NODES] = {0};
  char ids[SESSIONS][16];
  for (int k = 0, n = 0; k < SESSIONS; n++) {
    char body[160];
    snprintf(ids[k], sizeof ids[k], "c%d", n);
    int node = owner[shard_of(ids[k])];
    if (per_node[node] == SESSIONS / NODES)
      continue;
    create_session(c, owner, ids[k], "");
    per_node[node]++;
    snprintf(body, sizeof body,
             "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"hi\"}]}", ids[k]);
    cph_test_response r = cph_test_api(c->port[node], "POST", "/v1/events", NULL, body);
    assert_int_equal(r.status, 200);
    cph_test_response_free(&r);
    k++;
  }
  struct {
    int node;
    long long id;
    char lease[40];
  } held[MAX_HELD];
  int n_held = 0, most = 0, served = 0;
  bool had_turn[SESSIONS] = {false};
  for (int round = 0; round < 60 && served < SESSIONS; round++) { /* up to 30 s */
    for (int h = 0; h < n_held; h++) {
      char path[64], body[96];
      snprintf(path, sizeof path, "/v1/turns/%lld/complete", held[h].id);
      snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0}}",
               held[h].lease);
      cph_test_response r = cph_test_api(c->port[held[h].node], "POST", path, NULL, body);
      assert_int_equal(r.status, 200);
      cph_test_response_free(&r);
    }
    n_held = 0;
    for (int i = 0; i < NODES; i++)
      while (n_held < MAX_HELD) {
        cph_test_response r = cph_test_api(c->port[i], "POST", "/v1/turns/lease", NULL,
                                           "{\"worker\":\"w\",\"wait_ms\":0}");
        json_t *v = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
        cph_test_response_free(&r);
        if (!v)
          break;
        json_t *t = json_object_get(v, "turn");
        held[n_held].node = i;
        held[n_held].id = (long long)json_integer_value(json_object_get(t, "id"));
        snprintf(held[n_held].lease, sizeof held[n_held].lease, "%s",
                 json_string_value(json_object_get(t, "lease")));
        const char *session = json_string_value(json_object_get(t, "session"));
        for (int k = 0; k < SESSIONS; k++)
          if (session && strcmp(session, ids[k]) == 0 && !had_turn[k]) {
            had_turn[k] = true;
            served++;
          }
        n_held++;
        json_decref(v);
      }
    long running = running_sum(c);
    if (n_held > most)
      most = n_held;
    if (running > LIMIT || n_held > LIMIT)
      fail_msg("round %d: %d turns held, %ld running over three nodes; the limit is %d", round,
               n_held, running, LIMIT);
    cph_tc_sleep_ms(500);
  }
  long slots = 0;
  for (int i = 0; i < NODES; i++) {
    json_t *v = cph_tc_view(c, i);
    json_t *conc = json_object_get(v, "concurrency");
    assert_int_equal(json_integer_value(json_object_get(conc, "cluster")), LIMIT);
    slots += (long)json_integer_value(json_object_get(conc, "node"));
    json_decref(v);
  }
  print_message("%d of %d sessions had a turn, at most %d running at once over three nodes; "
                "slots offered at the end %ld\n",
                served, SESSIONS, most, slots);
  /* The slots moved to every node with work, and (above) the limit was never exceeded. How
   * many ran at once at the moments looked at depends on how far the slots had moved: under
   * load, sometimes one at most. */
  assert_int_equal(served, SESSIONS);
  assert_true(most >= 1);
  assert_true(slots <= LIMIT);
  cph_tc_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_worker_finds_every_node_and_completes_turns_on_each),
      cmocka_unit_test(test_the_nodes_share_one_lane_budget),
      cmocka_unit_test(test_the_nodes_share_one_concurrency_limit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
