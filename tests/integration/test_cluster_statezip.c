/* Cluster mode: the sessions' states in the log are packed (server/statezip.h; clusterflow.h
 * 11.) — a real etcd, one NATS JetStream server and two cephalond on 127.0.0.1.
 *
 * Sessions on both nodes complete ROUNDS turns. The log itself is read: every state the node
 * about to die put is packed ("CPHZ" after the epoch). Then, while that node still runs, two of
 * its sessions' values are rewritten in the bucket: one as the raw state an earlier build would
 * have put (the same epoch, the state unpacked: a rolling upgrade's value), one packed but lying
 * about its length. The node is killed -9 and the survivor takes its shards over: the raw state
 * is loaded as before (its tree holds every reply), the lying one is refused — the survivor's
 * log names the session and its key — and changes nothing there (no reply of that session in
 * its tree), while every other moved session is loaded as usual. */
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

#include "cephalon/cephalon.h"
#include "server/statezip.h"
#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"

#define NODES 2
#define SHARDS 8
#define TTL_S 2
#define SESSIONS 8
#define ROUNDS 3

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int round;
} bench;

static bool answer(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  char reply[128];
  snprintf(reply, sizeof reply, "reply %d of t%02d, which repeats what t%02d said before", b->round,
           s, s);
  cph_tc_complete_cost(b->c, n, turn, reply, 40, 1);
  return true;
}

/* How many of session s's tree nodes on node n are replies of its (role assistant). */
static int replies_in_tree(cph_test_cluster *c, int n, int s) {
  char path[64], want[32];
  snprintf(path, sizeof path, "/v1/sessions/t%02d/context", s);
  snprintf(want, sizeof want, "of t%02d,", s);
  cph_test_response r = cph_test_api(c->port[n], "GET", path, NULL, NULL);
  if (r.status != 200)
    fail_msg("GET %s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  int count = 0;
  size_t i;
  json_t *node;
  json_array_foreach(json_object_get(j, "nodes"), i, node) {
    const char *role = json_string_value(json_object_get(node, "role"));
    const char *t = json_string_value(json_object_get(node, "content"));
    count += role && strcmp(role, "assistant") == 0 && t && strstr(t, want);
  }
  json_decref(j);
  return count;
}

/* The newest value of session s's key in CEPH_STATE (its shard found by trying each), with its
 * subject; the test fails when there is none. */
static natsMsg *state_msg(jsCtx *js, int s, char *subject, size_t size) {
  for (int sh = 0; sh < SHARDS; sh++) {
    snprintf(subject, size, "$KV.CEPH_STATE.%d.74%02x%02x", sh, '0' + s / 10, '0' + s % 10);
    natsMsg *m = NULL;
    if (js_GetLastMsg(&m, js, "KV_CEPH_STATE", subject, NULL, NULL) == NATS_OK)
      return m;
  }
  fail_msg("no state of t%02d in CEPH_STATE", s);
  return NULL;
}

static long long states_count(cph_test_cluster *c, int n, const char *name) {
  return cph_tc_log_counter(c, n, "states", name);
}

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  b->c = cph_tc_up_t(NODES, SHARDS, TTL_S, "", SESSIONS, b->owner);
  *state = b;
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (b)
    cph_tc_free(b->c);
  free(b);
  return 0;
}

static void test_cluster_statezip_packed_states_move_raw_ones_load_and_a_lying_one_is_refused(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int victim = 1, survivor = 0, moved = cph_tc_moved(b->owner, SESSIONS, victim);
  for (int round = 0; round < ROUNDS; round++) {
    b->round = round;
    cph_tc_ask_and_answer(c, NODES, round, b->owner, SESSIONS, answer, b);
  }
  int raw_s = -1, bad_s = -1;
  for (int s = 0; s < SESSIONS; s++)
    if (b->owner[s] == victim) {
      if (raw_s < 0)
        raw_s = s;
      else if (bad_s < 0)
        bad_s = s;
    }
  if (bad_s < 0)
    fail_msg("n%d owns %d session(s): the test needs two", victim, moved);

  natsConnection *nc = NULL;
  jsCtx *js = NULL;
  char url[64];
  snprintf(url, sizeof url, "nats://127.0.0.1:%d", c->nats_port[0]);
  assert_int_equal(natsConnection_ConnectTo(&nc, url), NATS_OK);
  assert_int_equal(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
  /* every state the victim put is packed */
  for (int s = 0; s < SESSIONS; s++) {
    if (b->owner[s] != victim)
      continue;
    char subject[96];
    natsMsg *m = state_msg(js, s, subject, sizeof subject);
    const uint8_t *v = (const uint8_t *)natsMsg_GetData(m);
    int len = natsMsg_GetDataLength(m);
    if (len < 8 + CPH_STATEZIP_HEADER || !cph_statezip_packed(v + 8, (size_t)len - 8))
      fail_msg("the state of t%02d in the log (%d bytes) is not packed", s, len);
    natsMsg_Destroy(m);
  }
  /* t<raw_s>: its state as an earlier build put it, raw after the same epoch */
  char raw_subject[96], bad_subject[96];
  natsMsg *m = state_msg(js, raw_s, raw_subject, sizeof raw_subject);
  const uint8_t *v = (const uint8_t *)natsMsg_GetData(m);
  size_t len = (size_t)natsMsg_GetDataLength(m);
  uint8_t *raw = NULL;
  size_t raw_len = 0;
  char why[200] = "";
  assert_int_equal(cph_statezip_unpack(v + 8, len - 8, CPH_SESSION_STATE_MAX_BYTES, &raw,
                                       &raw_len, why, sizeof why),
                   CPH_OK);
  assert_non_null(raw);
  assert_memory_equal(raw, "CPHS", 4);
  uint8_t *old = malloc(8 + raw_len);
  assert_non_null(old);
  memcpy(old, v, 8);
  memcpy(old + 8, raw, raw_len);
  natsMsg_Destroy(m);
  assert_int_equal(js_Publish(NULL, js, raw_subject, old, (int)(8 + raw_len), NULL, NULL),
                   NATS_OK);
  free(old);
  free(raw);
  /* t<bad_s>: packed, but saying it holds one byte more than it inflates to */
  m = state_msg(js, bad_s, bad_subject, sizeof bad_subject);
  len = (size_t)natsMsg_GetDataLength(m);
  uint8_t *lying = malloc(len);
  assert_non_null(lying);
  memcpy(lying, natsMsg_GetData(m), len);
  natsMsg_Destroy(m);
  uint32_t stated = (uint32_t)lying[12] << 24 | (uint32_t)lying[13] << 16 |
                    (uint32_t)lying[14] << 8 | lying[15];
  stated++;
  for (int i = 0; i < 4; i++)
    lying[12 + i] = (uint8_t)(stated >> (24 - 8 * i));
  assert_int_equal(js_Publish(NULL, js, bad_subject, lying, (int)len, NULL, NULL), NATS_OK);
  free(lying);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);

  cph_tc_kill_node(c, victim, false);
  cph_tc_settle(c, SHARDS, "after the kill");
  char needle[160];
  snprintf(needle, sizeof needle, "the state of session t%02d (key %s of CEPH_STATE", bad_s,
           bad_subject + strlen("$KV.CEPH_STATE."));
  if (!cph_test_daemon_log_wait(&c->d[survivor], needle, 10000)) {
    char *log = cph_test_daemon_log(&c->d[survivor]);
    fail_msg("n%d's log does not name the refused state (\"%s\"):\n%s", survivor, needle,
             log ? log : "");
  }
  char *log = cph_test_daemon_log(&c->d[survivor]);
  assert_non_null(strstr(log, "inflates to"));
  free(log);
  for (int s = 0; s < SESSIONS; s++) {
    int got = replies_in_tree(c, survivor, s);
    int want = s == bad_s ? 0 : ROUNDS;
    if (got != want)
      fail_msg("t%02d (%s) on n%d after the takeover: %d replies in its tree, %d wanted", s,
               s == bad_s ? "its state refused" : s == raw_s ? "raw state" : "packed state",
               survivor, got, want);
  }
  long long loaded = states_count(c, survivor, "loaded");
  long long lbytes = states_count(c, survivor, "loaded_bytes");
  long long lraw = states_count(c, survivor, "loaded_raw_bytes");
  printf("n%d killed -9: %d sessions moved; n%d loaded %lld states (%lld bytes as stored, %lld "
         "unpacked), t%02d's raw, t%02d's refused\n",
         victim, moved, survivor, loaded, lbytes, lraw, raw_s, bad_s);
  assert_int_equal(loaded, moved - 1);
  assert_true(lbytes < lraw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_statezip_packed_states_move_raw_ones_load_and_a_lying_one_is_refused),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
