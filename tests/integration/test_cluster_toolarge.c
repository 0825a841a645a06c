/* Cluster mode: what is larger than the log takes (NATS's max_payload, 1 MiB by default) gets
 * a clear answer at once instead of a retry that can never succeed (server/clusterlog.h
 * cph_clog_max_payload) — a real etcd, NATS JetStream and two cephalond on 127.0.0.1, whose
 * policy lets strings be 2 MiB (:server :max-string-bytes).
 *
 * One request posts to channel "big", which a session on each node subscribes to, an event
 * of 1.2 MB and one of 600 KB: the first is rejected (field "body", saying why; nothing is
 * logged), the second accepted and delivered to both sessions, the one on the other node
 * through its forward. Each session's turn answers; one answers with a 1.2 MB reply: the
 * completion answers 200 (its done mark and its state, packed, are small), and the copy of that
 * reply for the other node's history, which the log would refuse, is given up at once —
 * logged and counted as dropped — where before it was sent again every 30 s for as long as
 * the 64 MiB of waiting copies allowed, and counted dropped only then. */
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
#define SHARDS 4
#define TTL_S 2
#define TOO_LARGE 1200000 /* bytes of a body: more than NATS's 1 MiB */
#define LARGE 600000      /* more than a batch (256 KiB), less than the log takes */

static const char EXTRA[] = ":server {:max-string-bytes 2097152}";

typedef struct bench {
  cph_test_cluster *c;
  char session[NODES][16]; /* a session of channel "big" on each node */
} bench;

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  cph_test_cluster *c = b->c = cph_tc_new();
  *state = b;
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "start");
  int made = 0;
  for (int k = 0; made < NODES; k++) {
    assert_true(k < 100);
    char id[16], body[128];
    snprintf(id, sizeof id, "big%d", k);
    snprintf(body, sizeof body,
             "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"big\"]}", id);
    int owner = cph_tc_post_on_owner(c, 0, "/v1/sessions", body);
    if (!b->session[owner][0]) {
      snprintf(b->session[owner], sizeof b->session[owner], "%s", id);
      made++;
    } else {
      char path[64];
      snprintf(path, sizeof path, "/v1/sessions/%s", id);
      cph_test_response r = cph_test_api(c->port[owner], "DELETE", path, NULL, NULL);
      assert_int_equal(r.status, 200);
      cph_test_response_free(&r);
    }
  }
  cph_tc_wait_known(c, NODES);
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (b)
    cph_tc_free(b->c);
  free(b);
  return 0;
}

/* A string of n copies of ch. */
static char *filled(size_t n, char ch) {
  char *s = malloc(n + 1);
  assert_non_null(s);
  memset(s, ch, n);
  s[n] = '\0';
  return s;
}

/* GET /v1/cluster on node n: log.history_copies.<name>. */
static long long copies(cph_test_cluster *c, int n, const char *name) {
  return cph_tc_log_counter(c, n, "history_copies", name);
}

static void test_cluster_toolarge_is_refused_or_given_up_at_once(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  char *too_large = filled(TOO_LARGE, 'x'), *large = filled(LARGE, 'z');
  json_t *req = json_pack("{s[{ssssss}{ssssss}]}", "events", "channel", "big", "sender", "ann",
                          "body", too_large, "channel", "big", "sender", "ann", "body", large);
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  cph_test_response r = cph_test_api(c->port[0], "POST", "/v1/events", NULL, body);
  free(body);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  json_t *results = json_object_get(j, "results");
  json_t *first = json_array_get(results, 0), *second = json_array_get(results, 1);
  char *shown = json_dumps(first, JSON_COMPACT);
  printf("the 1.2 MB event: %s\n", shown);
  free(shown);
  assert_string_equal(json_string_value(json_object_get(first, "status")), "rejected");
  assert_string_equal(json_string_value(json_object_get(first, "field")), "body");
  assert_non_null(strstr(json_string_value(json_object_get(first, "reason")),
                         "larger than the cluster log takes"));
  assert_string_equal(json_string_value(json_object_get(second, "status")), "accepted");
  json_decref(j);

  /* The 600 KB event reaches both sessions (one through its forward); the 1.2 MB one neither. */
  json_t *turn[NODES];
  for (int n = 0; n < NODES; n++) {
    r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL,
                     "{\"worker\":\"w\",\"wait_ms\":10000}");
    if (r.status != 200)
      fail_msg("lease on n%d: %d %s", n, r.status, r.body ? r.body : "");
    j = cph_test_json(&r);
    cph_test_response_free(&r);
    turn[n] = json_incref(json_object_get(j, "turn"));
    json_decref(j);
    assert_string_equal(json_string_value(json_object_get(turn[n], "session")), b->session[n]);
    const char *input = json_string_value(json_object_get(turn[n], "input"));
    assert_non_null(input);
    assert_non_null(strstr(input, large));
    assert_null(strstr(input, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"));
  }

  /* Node 0's session answers with a 1.2 MB reply: its copy for node 1 is given up at once. */
  long long dropped_before = copies(c, 0, "dropped");
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn[0], "id")));
  char *reply = filled(TOO_LARGE, 'y');
  req = json_pack("{sss{sisi}s{ss}}", "lease", json_string_value(json_object_get(turn[0], "lease")),
                  "cost", "tokens", 10, "tool_calls", 0, "reply", "body", reply);
  body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  int64_t t0 = cph_test_now_ms();
  r = cph_test_api(c->port[0], "POST", path, NULL, body);
  free(body);
  if (r.status != 200)
    fail_msg("completing with a 1.2 MB reply on n0: %d %s", r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  cph_tc_complete(c, 1, turn[1], "a short answer");
  long long dropped = dropped_before;
  while (dropped == dropped_before && cph_test_now_ms() - t0 < 5000) {
    cph_tc_sleep_ms(100);
    dropped = copies(c, 0, "dropped");
  }
  printf("the 1.2 MB reply's copy: given up after %lld ms; failures %lld, retries %lld, pending "
         "%lld\n",
         (long long)(cph_test_now_ms() - t0), copies(c, 0, "failures"), copies(c, 0, "retries"),
         copies(c, 0, "pending"));
  assert_int_equal(dropped, dropped_before + 1);
  assert_int_equal(copies(c, 0, "retries"), 0);
  assert_int_equal(copies(c, 0, "pending"), 0);
  char *log = cph_test_daemon_log(&c->d[0]);
  assert_non_null(log);
  assert_non_null(strstr(log, "the log never takes a message this large"));
  free(log);
  json_decref(turn[0]);
  json_decref(turn[1]);
  free(too_large);
  free(large);
  free(reply);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_toolarge_is_refused_or_given_up_at_once),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
