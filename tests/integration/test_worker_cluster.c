/* cephalon-worker against a cluster (DESIGN §14 "Workers"): given one node, it reads the node
 * list from GET /v1/cluster and long-polls every node, so the turns of sessions on all three
 * nodes are leased, run and completed on their owners. A real etcd and three cephalond on
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
#include <openssl/sha.h>
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

/* DESIGN §14: the first 8 bytes of SHA-256(id), big-endian, mod the shard count. */
static int shard_of(const char *id) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256((const unsigned char *)id, strlen(id), d);
  uint64_t h = 0;
  for (int i = 0; i < 8; i++)
    h = h << 8 | d[i];
  return (int)(h % SHARDS);
}

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

static void test_the_worker_finds_every_node_and_completes_turns_on_each(void **state) {
  (void)state;
  cph_test_cluster *c = cph_tc_new();
  cph_tc_start_etcd(c);
  cph_tc_ports(c, NODES);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S, "");
  bool live[NODES] = {true, true, true};
  assert_true(cph_tc_wait_settled(c, live, SHARDS, 15000));
  int owner[SHARDS];
  shard_owners(c, owner);

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
  char llm[96], exe[512];
  snprintf(llm, sizeof llm, "%s/v1", cph_md_url(md));
  const char *bin = getenv("CPH_BIN_DIR");
  assert_non_null(bin);
  snprintf(exe, sizeof exe, "%s/cephalon-worker", bin);
  char *log = cph_test_write_tmpfile(".worker.log", "");
  const char *argv[] = {
      exe,   "--daemon", c->url[0],        "--llm", llm, "--model", "m", "--lease-wait-ms",
      "500", "--name",   "cluster-worker", NULL};
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_APPEND);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(exe, (char *const *)argv);
    _exit(127);
  }

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_worker_finds_every_node_and_completes_turns_on_each),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
