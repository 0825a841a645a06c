/* Cluster mode: a moved shard's sessions keep their kept turn contexts (the context explorer,
 * core/turnlog.h; each completed turn's moves as an item of the cluster log, server/clusterflow.h
 * 13.) — a real etcd, NATS JetStream and two cephalond on 127.0.0.1.
 *
 * Sessions on both nodes complete ROUNDS turns, and in the middle round each session's turn
 * fails FAILS times before one completes (the kept contexts' items are a ring over ended turns,
 * failed ones too: core/handover.h); each lease's messages are noted with the turn's origin
 * (GET /v1/turns/{id} on its node). The node owning some sessions is killed -9 right
 * after its last completion answered 200. On the survivor, which took its shards over, each
 * session's GET /v1/sessions/{id}/turns lists every one of its turns exactly once — under
 * the ids their records have there, matched by origin with GET /v1/turns?session= — and each
 * one's GET /v1/sessions/{id}/turns/{turn}/context shows the messages its lease had. The dead
 * node comes back on its data (shards move back) and is killed again (they move away again):
 * each time the same holds, nothing doubled. Without the import the survivor lists none of a
 * moved session's turns: the test fails. The states went into the log packed (server/statezip.h):
 * the victim's GET /v1/cluster counts fewer bytes put than the states held, and the survivor
 * loaded packed states. Without etcd or nats-server the test
 * fails and says what to install. */
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
#define SHARDS 16
#define TTL_S 2
#define SESSIONS 8
#define ROUNDS 3
#define FAILS 2 /* failed turns of each session in round FAIL_ROUND, one after the other */
#define FAIL_ROUND 1
#define KEPT (ROUNDS + FAILS) /* the kept turns that move: all (fewer than :keep-turns, 8) */
#define MAX_KEPT 16

static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

/* A leased turn: its record's origin and the messages its lease had (a JSON array). */
typedef struct leased {
  char origin[200];
  json_t *messages;
} leased;

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  leased want[SESSIONS][KEPT]; /* each session's ended turns in the order they ended */
  int n_want[SESSIONS];
  int fails[SESSIONS];
  int round;
} bench;

/* The origin of turn id's record on node n (GET /v1/turns/{id}) into out. */
static void origin_of(bench *b, int n, long long id, char *out, size_t cap) {
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld", id);
  cph_test_response r = cph_test_api(b->c->port[n], "GET", path, NULL, NULL);
  if (r.status != 200)
    fail_msg("%s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  const char *o = json_string_value(json_object_get(j, "origin"));
  if (!o)
    fail_msg("%s on n%d has no origin", path, n);
  snprintf(out, cap, "%s", o);
  json_decref(j);
}

/* Completes turn (of session s, on node n) of round b->round — or, in round FAIL_ROUND, fails
 * it FAILS times first (its input comes back in the next lease) —, its lease's messages and
 * its record's origin noted. Each must answer 200. True once the round's turn completed. */
static bool answer(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  long long id = json_integer_value(json_object_get(turn, "id"));
  const char *lease = json_string_value(json_object_get(turn, "lease"));
  bool fail = b->round == FAIL_ROUND && b->fails[s] < FAILS;
  assert_true(b->n_want[s] < KEPT);
  leased *w = &b->want[s][b->n_want[s]++];
  w->messages = json_incref(json_object_get(turn, "messages"));
  assert_true(json_array_size(w->messages) > 0);
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/%s", id, fail ? "fail" : "complete");
  if (fail)
    snprintf(body, sizeof body, "{\"lease\":\"%s\",\"error\":\"model timed out %d\"}", lease,
             b->fails[s]++);
  else
    snprintf(body, sizeof body,
             "{\"lease\":\"%s\",\"cost\":{\"tokens\":10,\"tool_calls\":0},"
             "\"reply\":{\"body\":\"reply %d of t%02d\"}}",
             lease, b->round, s);
  cph_test_response r = cph_test_api(b->c->port[n], "POST", path, NULL, body);
  if (r.status != 200)
    fail_msg("%s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  origin_of(b, n, id, w->origin, sizeof w->origin);
  return !fail;
}

/* Kept turn `turn` of session s on node n shows the messages of w's lease. */
static void check_context(bench *b, int n, int s, long long turn, const leased *w,
                          const char *when) {
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/t%02d/turns/%lld/context", s, turn);
  cph_test_response r = cph_test_api(b->c->port[n], "GET", path, NULL, NULL);
  if (r.status != 200)
    fail_msg("%s: %s on n%d: %d %s", when, path, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  json_t *got = json_object_get(j, "messages");
  if (json_array_size(got) != json_array_size(w->messages))
    fail_msg("%s: %s on n%d shows %zu messages, its lease had %zu", when, path, n,
             json_array_size(got), json_array_size(w->messages));
  for (size_t i = 0; i < json_array_size(got); i++) {
    json_t *g = json_array_get(got, i), *l = json_array_get(w->messages, i);
    static const char *const keys[] = {"role", "content"};
    for (int k = 0; k < 2; k++)
      if (!json_equal(json_object_get(g, keys[k]), json_object_get(l, keys[k])))
        fail_msg("%s: %s on n%d: message %zu's %s differs from its lease's", when, path, n, i,
                 keys[k]);
  }
  json_decref(j);
}

/* Every session's kept turns on its owner (b->owner updated) hold all its ended turns, the
 * failed ones too, exactly once each (by their records' origins there), with the messages
 * their leases had, and no origin twice. */
static void check_kept(void *ctx, const char *when) {
  bench *b = ctx;
  for (int s = 0; s < SESSIONS; s++) {
    char path[64];
    snprintf(path, sizeof path, "/v1/sessions/t%02d/turns", s);
    json_t *j = NULL, *turns = NULL;
    int n = cph_tc_list_on_owner(b->c, 0, path, "turns", MAX_KEPT, &j, &turns); /* n0 lives */
    b->owner[s] = n;
    size_t count = json_array_size(turns);
    char origins[MAX_KEPT][200];
    for (size_t i = 0; i < count; i++) {
      long long id = json_integer_value(json_object_get(json_array_get(turns, i), "id"));
      origin_of(b, n, id, origins[i], sizeof origins[i]);
      for (size_t k = 0; k < i; k++)
        if (strcmp(origins[k], origins[i]) == 0)
          fail_msg("%s: t%02d on n%d keeps turn %s twice", when, s, n, origins[i]);
    }
    assert_int_equal(b->n_want[s], KEPT);
    for (int k = 0; k < KEPT; k++) {
      const leased *w = &b->want[s][k];
      size_t i = 0;
      while (i < count && strcmp(origins[i], w->origin) != 0)
        i++;
      if (i == count)
        fail_msg("%s: t%02d's kept turns on n%d (%zu) lack its turn %s (ended %d of %d)", when,
                 s, n, count, w->origin, k + 1, KEPT);
      long long id = json_integer_value(json_object_get(json_array_get(turns, i), "id"));
      check_context(b, n, s, id, w, when);
    }
    json_decref(j);
  }
}

/* A counter of log.states in a node's GET /v1/cluster. */
static long long states_count(json_t *v, const char *name) {
  return (long long)json_integer_value(
      json_object_get(json_object_get(json_object_get(v, "log"), "states"), name));
}

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  b->c = cph_tc_up_t(NODES, SHARDS, TTL_S, EXTRA, SESSIONS, b->owner);
  *state = b;
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (b) {
    cph_tc_free(b->c);
    for (int s = 0; s < SESSIONS; s++)
      for (int k = 0; k < b->n_want[s]; k++)
        json_decref(b->want[s][k].messages);
  }
  free(b);
  return 0;
}

static void test_cluster_kept_a_moved_session_keeps_its_newest_kept_contexts(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int victim = 1, survivor = 0, moved = cph_tc_moved(b->owner, SESSIONS, victim);
  for (int round = 0; round < ROUNDS; round++) {
    b->round = round;
    cph_tc_ask_and_answer(c, NODES, round, b->owner, SESSIONS, answer, b);
  }
  check_kept(b, "on their own nodes");
  /* what the victim put into the log: packed, its states' bytes far fewer than they held */
  json_t *v = cph_tc_view(c, victim);
  long long put = states_count(v, "put"), bytes = states_count(v, "put_bytes"),
            raw = states_count(v, "put_raw_bytes");
  json_decref(v);
  printf("n%d put %lld states: %lld bytes packed, %lld raw\n", victim, put, bytes, raw);
  assert_true(put >= moved);
  assert_true(bytes > 0 && bytes * 2 < raw);
  /* kill -9 right after the last completions answered 200; its data stays for later */
  char *victim_dir = cph_tc_kill_node(c, victim, true);
  cph_tc_settle(c, SHARDS, "after the kill");
  for (int s = 0; s < SESSIONS; s++)
    b->owner[s] = survivor;
  check_kept(b, "after the takeover");
  /* the states it imported (check_kept saw their contexts) came packed */
  v = cph_tc_view(c, survivor);
  long long loaded = states_count(v, "loaded"), lbytes = states_count(v, "loaded_bytes"),
            lraw = states_count(v, "loaded_raw_bytes");
  json_decref(v);
  printf("n%d loaded %lld states: %lld bytes packed, %lld raw\n", survivor, loaded, lbytes, lraw);
  assert_true(loaded >= moved);
  assert_true(lbytes > 0 && lbytes * 2 < lraw);
  printf("n%d killed -9: %d sessions moved to n%d, each keeping its %d contexts (%d failed)\n",
         victim, moved, survivor, KEPT, FAILS);
  int back = cph_tc_back_and_away(c, victim, SHARDS, TTL_S, EXTRA, victim_dir, b->owner,
                                  SESSIONS, check_kept, b);
  printf("%d sessions moved back to n%d and away again: each kept turn listed once\n", back,
         victim);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_kept_a_moved_session_keeps_its_newest_kept_contexts),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
