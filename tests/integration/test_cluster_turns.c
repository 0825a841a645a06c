/* Cluster mode: a moved shard's sessions keep their turn records (core/turnrecs.h, the state's
 * version 3) — a real etcd, NATS JetStream and two cephalond on 127.0.0.1.
 *
 * Sessions on both nodes each fail one turn and complete ROUNDS, every completion reporting its
 * own cost; each node's GET /v1/turns?session= then lists them with their origins. The node
 * owning some sessions is killed -9 right after its last completion answered 200. On the
 * survivor, which took its shards over, each moved session's list holds every turn it had
 * exactly once — the same origin, state, cost and error — and a completion for a dead node's
 * turn id does not answer 200 there. Each session then completes one more turn on its owner.
 * The dead node comes back on its data (shards move back to it) and is killed again (they move
 * away again): each time every session's list holds each of its turns exactly once. Without
 * the import the survivor's lists lack the dead node's turns: the test fails. Without etcd or
 * nats-server the test fails and says what to install. */
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
#define SESSIONS 12
#define ROUNDS 3
#define MAX_RECORDS 8

static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

/* A turn record as GET /v1/turns?session= lists it. */
typedef struct record {
  char origin[200], state[16], error[64];
  long long tokens, tool_calls;
} record;

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  record want[SESSIONS][MAX_RECORDS]; /* each session's ended turns, as their node listed them */
  int n_want[SESSIONS];
  long long dead_turn;   /* a turn the victim completed, its id there */
  char dead_lease[40];   /* and its lease */
  int round;             /* the turns being answered (answer_round) */
  bool fail_first, failed[SESSIONS];
} bench;

/* The cost turn `round` of session s reports: unique to the pair. */
static long long cost_of(int round, int s) { return 1000 * (round + 1) + s; }

/* Answers turn (of session s, on node n) of round b->round: in b->fail_first rounds a
 * session's first lease is failed ("model error tNN", not done: its input is leased again),
 * else completed with the round's cost. Each must answer 200. */
static bool answer(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  long long id = json_integer_value(json_object_get(turn, "id"));
  const char *lease = json_string_value(json_object_get(turn, "lease"));
  char path[96], body[256];
  bool fail = b->fail_first && !b->failed[s];
  snprintf(path, sizeof path, "/v1/turns/%lld/%s", id, fail ? "fail" : "complete");
  if (fail)
    snprintf(body, sizeof body, "{\"lease\":\"%s\",\"error\":\"model error t%02d\"}", lease, s);
  else
    snprintf(body, sizeof body,
             "{\"lease\":\"%s\",\"cost\":{\"tokens\":%lld,\"tool_calls\":%d},"
             "\"reply\":{\"body\":\"reply %d of t%02d\"}}",
             lease, cost_of(b->round, s), b->round + 1, b->round, s);
  cph_test_response r = cph_test_api(b->c->port[n], "POST", path, NULL, body);
  if (r.status != 200)
    fail_msg("%s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  if (!fail && n == 1) {
    b->dead_turn = id;
    snprintf(b->dead_lease, sizeof b->dead_lease, "%s", lease);
  }
  b->failed[s] |= fail;
  return !fail;
}

/* Leases on node n until each session it owns (b->owner) completed one turn of `round` (in
 * `fail_first` rounds after failing one: answer above); 30 s at most. */
static void answer_round(bench *b, int n, int round, bool fail_first) {
  b->round = round;
  b->fail_first = fail_first;
  memset(b->failed, 0, sizeof b->failed);
  char what[32];
  snprintf(what, sizeof what, "round %d", round);
  cph_tc_lease_each(b->c, n, b->owner, SESSIONS, answer, b, what);
}

/* Session s's turn records, from its owner (asking node `via` first; b->owner[s] is updated):
 * *n of them into out (at most MAX_RECORDS: more fails the test). */
static void list_records(bench *b, int via, int s, record *out, int *n) {
  char path[64];
  snprintf(path, sizeof path, "/v1/turns?session=t%02d", s);
  json_t *j = NULL, *turns = NULL;
  b->owner[s] = cph_tc_list_on_owner(b->c, via, path, "turns", MAX_RECORDS, &j, &turns);
  *n = 0;
  size_t i;
  json_t *t;
  json_array_foreach(turns, i, t) {
    record *o = &out[(*n)++];
    const char *origin = json_string_value(json_object_get(t, "origin"));
    const char *error = json_string_value(json_object_get(t, "error"));
    if (!origin)
      fail_msg("t%02d's turn %lld on n%d has no origin", s,
               (long long)json_integer_value(json_object_get(t, "id")), b->owner[s]);
    snprintf(o->origin, sizeof o->origin, "%s", origin);
    snprintf(o->state, sizeof o->state, "%s",
             json_string_value(json_object_get(t, "state")));
    snprintf(o->error, sizeof o->error, "%s", error ? error : "");
    json_t *cost = json_object_get(t, "cost");
    o->tokens = json_integer_value(json_object_get(cost, "tokens"));
    o->tool_calls = json_integer_value(json_object_get(cost, "tool_calls"));
  }
  json_decref(j);
}

/* Every session's list on its owner holds each turn of b->want exactly once, as it was, and
 * nothing else. */
static void check_records(void *ctx, const char *when) {
  bench *b = ctx;
  for (int s = 0; s < SESSIONS; s++) {
    record got[MAX_RECORDS];
    int n;
    list_records(b, 0, s, got, &n);
    for (int w = 0; w < b->n_want[s]; w++) {
      const record *want = &b->want[s][w];
      int times = 0;
      for (int k = 0; k < n; k++) {
        if (strcmp(got[k].origin, want->origin) != 0)
          continue;
        times++;
        if (strcmp(got[k].state, want->state) || strcmp(got[k].error, want->error) ||
            got[k].tokens != want->tokens || got[k].tool_calls != want->tool_calls)
          fail_msg("%s: t%02d's turn %s on n%d is %s (cost %lld, %lld; \"%s\"), was %s (cost "
                   "%lld, %lld; \"%s\")",
                   when, s, want->origin, b->owner[s], got[k].state, got[k].tokens,
                   got[k].tool_calls, got[k].error, want->state, want->tokens, want->tool_calls,
                   want->error);
      }
      if (times != 1)
        fail_msg("%s: t%02d's turn list on n%d holds turn %s %d times, not once", when, s,
                 b->owner[s], want->origin, times);
    }
    if (n != b->n_want[s])
      fail_msg("%s: t%02d's turn list on n%d holds %d turns, not its %d", when, s, b->owner[s], n,
               b->n_want[s]);
  }
}

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  b->c = cph_tc_up_t(NODES, SHARDS, TTL_S, EXTRA, SESSIONS, b->owner);
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

static void test_cluster_turns_a_moved_session_lists_every_turn_once_with_its_cost(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int victim = 1, survivor = 0, moved = cph_tc_moved(b->owner, SESSIONS, victim);
  for (int round = 0; round < ROUNDS; round++) {
    cph_tc_ask(c, round % NODES, SESSIONS, round);
    for (int n = 0; n < NODES; n++)
      answer_round(b, n, round, round == 0);
  }
  for (int s = 0; s < SESSIONS; s++) { /* as each session's node lists them */
    int owner = b->owner[s];
    list_records(b, owner, s, b->want[s], &b->n_want[s]);
    assert_int_equal(b->owner[s], owner);
    assert_int_equal(b->n_want[s], ROUNDS + 1);
    char prefix[8];
    snprintf(prefix, sizeof prefix, "n%d/", owner);
    for (int k = 0; k < b->n_want[s]; k++)
      assert_int_equal(strncmp(b->want[s][k].origin, prefix, strlen(prefix)), 0);
    record *failed = &b->want[s][ROUNDS]; /* newest first: the failure is the oldest */
    assert_string_equal(failed->state, "failed");
    char error[32];
    snprintf(error, sizeof error, "model error t%02d", s);
    assert_string_equal(failed->error, error);
    assert_int_equal(b->want[s][0].tokens, cost_of(ROUNDS - 1, s));
  }
  /* kill -9 right after the last completions answered 200; its data stays for later */
  char *victim_dir = cph_tc_kill_node(c, victim, true);
  cph_tc_settle(c, SHARDS, "after the kill");
  for (int s = 0; s < SESSIONS; s++)
    b->owner[s] = survivor;
  check_records(b, "after the takeover");
  printf("n%d killed -9: %d sessions moved to n%d, each listing its %d turns once\n", victim,
         moved, survivor, ROUNDS + 1);

  /* a turn the dead node completed: its id means nothing on the survivor, and a completion of
   * it there does not answer 200 (404, or 409 when a turn of the survivor has that id) */
  char path[96], body[128];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", b->dead_turn);
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0}}",
           b->dead_lease);
  cph_test_response r = cph_test_api(c->port[survivor], "POST", path, NULL, body);
  if (r.status != 404 && r.status != 409)
    fail_msg("completing the dead node's turn %lld on n%d: %d %s", b->dead_turn, survivor,
             r.status, r.body ? r.body : "");
  cph_test_response_free(&r);

  /* one more turn each, on the survivor: the state now carries records of both nodes */
  cph_tc_ask(c, survivor, SESSIONS, ROUNDS);
  answer_round(b, survivor, ROUNDS, false);
  for (int s = 0; s < SESSIONS; s++) {
    record got[MAX_RECORDS];
    int n;
    list_records(b, survivor, s, got, &n);
    assert_int_equal(n, b->n_want[s] + 1);
    b->want[s][b->n_want[s]++] = got[0];
  }
  check_records(b, "after a turn on the survivor");

  /* the dead node comes back on its data (shards move back to it), and is killed again */
  int back = cph_tc_back_and_away(c, victim, SHARDS, TTL_S, EXTRA, victim_dir, b->owner,
                                  SESSIONS, check_records, b);
  printf("%d sessions moved back to n%d and away again: each turn still listed once\n", back,
         victim);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_turns_a_moved_session_lists_every_turn_once_with_its_cost),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
