/* Cluster mode: a deposed owner's writes are refused by the log (DESIGN §14 "State";
 * server/clusterflow.h 10.). A real etcd, a three-server NATS JetStream cluster and two
 * cephalond on 127.0.0.1.
 *
 * Node A owns session S. In each round an event is posted to S, A leases S's turn, the
 * completion is sent to A and A is SIGSTOPped a few milliseconds later (a different delay each
 * round: sometimes before A committed, sometimes between its commit and its done mark's
 * publish, sometimes after); B takes S's shard over (its fences: an epoch on
 * ceph.s.done.<shard>); A is woken (SIGCONT), answers the completion, and a completion sent to
 * A now is refused (421/503: it no longer serves the shard); A rejoins and takes the shard back
 * (and the completion, sent again, answers 200, after which A counts no turn running).
 * Then the log itself is read: between B's epoch and A's next one, no done mark of A's may
 * have been stored on the shard's subject — whatever A decided before it was stopped. A
 * completion answered 200 by A had its mark stored before B's epoch. The rounds in which A's
 * mark came late (the log refused it) are counted and printed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <nats/nats.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"

#define NODES 2
#define SHARDS 8
#define TTL_S 2
#define ROUNDS 6
#define A 0
#define B 1

typedef struct world {
  cph_test_cluster *c;
  char session[32];
  unsigned shard;
} world;

static int setup(void **state) {
  world *x = calloc(1, sizeof *x);
  cph_test_cluster *c = x->c = cph_tc_new();
  /* check_log reads the whole history of the shard's done subject: nothing may be trimmed from
   * it (server/clusterflow.h 12.; with nats-server before 2.9.18 and three servers the nodes
   * refuse to trim anyway). */
  c->cluster_extra = ":log-trim-seconds 0";
  *state = x;
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 3);
  cph_tc_ports(c, NODES);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S,
                      ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}");
  bool live[NODES] = {true, true};
  if (!cph_tc_wait_settled(c, live, SHARDS, 60000))
    fail_msg("the cluster did not settle (ownership and log) within 60 s (logs in %s)", c->dir);
  for (int k = 0; !x->session[0]; k++) {
    assert_true(k < 1000);
    char id[32], body[128];
    snprintf(id, sizeof id, "fs%d", k);
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", id);
    cph_test_response r = cph_test_api(c->port[A], "POST", "/v1/sessions", NULL, body);
    if (r.status == 200)
      snprintf(x->session, sizeof x->session, "%s", id);
    cph_test_response_free(&r);
  }
  /* The session's shard: the one A's 421 for it on B names. */
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/%s", x->session);
  cph_test_response r = cph_test_api(c->port[B], "GET", path, NULL, NULL);
  assert_int_equal(r.status, 421);
  json_t *j = cph_test_json(&r);
  x->shard = (unsigned)json_integer_value(
      json_object_get(json_object_get(json_object_get(j, "error"), "owner"), "shard"));
  json_decref(j);
  cph_test_response_free(&r);
  printf("session %s on A, shard %u\n", x->session, x->shard);
  return 0;
}

static int teardown(void **state) {
  world *x = *state;
  if (x)
    cph_tc_free(x->c);
  free(x);
  return 0;
}

/* The status of the HTTP answer on fd (sent with cph_test_http_send_only), or -1 after
 * timeout_ms without one. Closes fd. */
static int read_status(int fd, int timeout_ms) {
  char buf[4096];
  size_t n = 0;
  int64_t until = cph_test_now_ms() + timeout_ms;
  while (n < sizeof buf - 1 && cph_test_now_ms() < until) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0)
      continue;
    ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
    if (k <= 0)
      break;
    n += (size_t)k;
    buf[n] = '\0';
    if (strstr(buf, "\r\n"))
      break;
  }
  close(fd);
  buf[n] = '\0';
  int status = -1;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
    return -1;
  return status;
}

/* Posts one event to the session through node n and waits until A shows it (min_pos). */
static void post_to_session(world *x, int round) {
  char req[160], path[128];
  snprintf(req, sizeof req,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"round %d\"}]}",
           x->session, round);
  cph_test_response r = cph_test_api(x->c->port[A], "POST", "/v1/events", NULL, req);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  json_int_t pos =
      json_integer_value(json_object_get(json_array_get(json_object_get(j, "results"), 0), "pos"));
  json_decref(j);
  cph_test_response_free(&r);
  snprintf(path, sizeof path, "/v1/sessions/%s?min_pos=%lld", x->session, (long long)pos);
  r = cph_test_api(x->c->port[A], "GET", path, NULL, NULL);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
}

/* Reads the shard's done subject from the log: fails if a done mark of node A (message id
 * "d.n0.") was stored after an epoch of B and before A's next epoch. Returns the epochs seen;
 * show: prints what it found. */
static int check_log(world *x, bool show) {
  natsConnection *nc = NULL;
  jsCtx *js = NULL;
  char url[64], subject[64];
  snprintf(url, sizeof url, "nats://127.0.0.1:%d", x->c->nats_port[0]);
  snprintf(subject, sizeof subject, "ceph.s.done.%u", x->shard);
  assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
  assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
  jsStreamInfo *si = NULL;
  assert_int_equal(js_GetStreamInfo(&si, js, "CEPH", NULL, NULL), NATS_OK);
  uint64_t last = si->State.LastSeq;
  jsStreamInfo_Destroy(si);
  bool b_owns = false;
  int epochs = 0, marks_a = 0;
  for (uint64_t seq = 1; seq <= last; seq++) {
    natsMsg *m = NULL;
    if (js_GetMsg(&m, js, "CEPH", seq, NULL, NULL) != NATS_OK)
      continue;
    if (strcmp(natsMsg_GetSubject(m), subject) == 0) {
      json_t *doc = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, NULL);
      const char *epoch = json_string_value(json_object_get(doc, "epoch"));
      const char *id = NULL;
      natsMsgHeader_Get(m, "Nats-Msg-Id", &id);
      if (epoch) {
        epochs++;
        b_owns = strcmp(epoch, "n1") == 0;
      } else if (id && strncmp(id, "d.n0.", 5) == 0) {
        marks_a++;
        if (b_owns)
          fail_msg("done mark %s of node A stored at %llu, after node B's epoch on %s", id,
                   (unsigned long long)seq, subject);
      }
      json_decref(doc);
    }
    natsMsg_Destroy(m);
  }
  if (show)
    printf("log: %d epochs and %d done marks of A on %s, none of A's while B owned it\n", epochs,
           marks_a, subject);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return epochs;
}

/* GET /v1/cluster log.rebuild.rebuilds of node n. */
static long long rebuilds(cph_test_cluster *c, int n) {
  return cph_tc_log_counter(c, n, "rebuild", "rebuilds");
}

/* How often needle is in node d's log. */
static int count_in_log(const cph_test_daemon *d, const char *needle) {
  char *log = cph_test_daemon_log(d);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p += strlen(needle))
    n++;
  free(log);
  return n;
}

static void test_cluster_fence_a_deposed_owners_done_marks_never_land(void **state) {
  world *x = *state;
  cph_test_cluster *c = x->c;
  int refused = 0, late_rounds = 0, answered_200 = 0;
  for (int round = 0; round < ROUNDS; round++) {
    post_to_session(x, round);
    cph_test_response r = cph_test_api(c->port[A], "POST", "/v1/turns/lease", NULL,
                                       "{\"worker\":\"w\",\"wait_ms\":5000}");
    if (r.status != 200) {
      char wpath[96];
      snprintf(wpath, sizeof wpath, "/v1/sessions/%s/why", x->session);
      cph_test_response w = cph_test_api(c->port[A], "GET", wpath, NULL, NULL);
      fail_msg("round %d: lease on A: %d; why: %s", round, r.status, w.body);
    }
    json_t *j = cph_test_json(&r);
    cph_test_response_free(&r);
    json_t *turn = json_object_get(j, "turn");
    char path[96], body[160];
    cph_test_completion(turn, path, sizeof path, body, sizeof body);
    json_decref(j);
    long long rebuilds_b = rebuilds(c, B);
    int fd = cph_test_http_send_only(c->port[A], "POST", path, body);
    assert_true(fd >= 0);
    usleep((useconds_t)(round * 700)); /* 0 to 3.5 ms: before, during, after the commit */
    kill(c->d[A].pid, SIGSTOP);
    /* B took A's shards once it rebuilt them (fences first); it cannot bind their consumers
     * yet: the stopped A's connection still holds them. */
    for (int64_t t0 = cph_test_now_ms(); rebuilds(c, B) < rebuilds_b + SHARDS / 2;) {
      if (cph_test_now_ms() - t0 > (TTL_S + 8) * 1000)
        fail_msg("round %d: B did not take A's shards over (logs in %s)", round, c->dir);
      cph_tc_sleep_ms(50);
    }
    kill(c->d[A].pid, SIGCONT);
    int status = read_status(fd, 15000);
    assert_true(status == 200 || status == 503 || status == 421);
    answered_200 += status == 200;
    /* Completed again now: A serves the shard no more (its lease lapsed while stopped). */
    r = cph_test_api(c->port[A], "POST", path, NULL, body);
    if (r.status != 421 && r.status != 503)
      fail_msg("round %d: completing on A after it woke: %d %s", round, r.status, r.body);
    cph_test_response_free(&r);
    bool both[NODES] = {true, true};
    if (!cph_tc_wait_settled(c, both, SHARDS, 30000))
      fail_msg("round %d: A did not rejoin (logs in %s)", round, c->dir);
    check_log(x, false);
    /* A serves the shard again and still holds the turn: a completion that was refused is
     * sent again (a turn stopped before its completion committed is still running there). */
    r = cph_test_api(c->port[A], "POST", path, NULL, body);
    if (r.status != 200)
      fail_msg("round %d: completing again on A after it took the shard back: %d %s", round,
               r.status, r.body);
    cph_test_response_free(&r);
    /* ... and holds no turn slot for it: taking the shard back (its session's state imported
     * while the turn ran here) once left the turn counted running for good, until A started
     * nothing (concurrency_full). */
    r = cph_test_api(c->port[A], "GET", "/v1/lanes", NULL, NULL);
    assert_int_equal(r.status, 200);
    j = cph_test_json(&r);
    json_int_t in_use =
        json_integer_value(json_object_get(json_object_get(j, "concurrency"), "in_use"));
    json_decref(j);
    cph_test_response_free(&r);
    if (in_use != 0)
      fail_msg("round %d: A counts %lld turns running after the session's turn ended", round,
               (long long)in_use);
    int now_refused = count_in_log(&c->d[A], "the log refused a write");
    bool late = now_refused > refused;
    refused = now_refused;
    late_rounds += late;
    printf("round %d: stopped %d us after the completion was sent; it answered %d%s\n", round,
           round * 700, status, late ? "; the log refused A's late write" : "");
  }
  int epochs = check_log(x, true);
  assert_true(epochs >= 1 + 2 * ROUNDS); /* A's first, then each round B's and A's again */
  printf("%d of %d completions answered 200; in %d rounds the log refused A's late writes\n",
         answered_200, ROUNDS, late_rounds);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_fence_a_deposed_owners_done_marks_never_land),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
