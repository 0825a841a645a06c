/* Cluster mode: a moved shard's sessions keep their seals (core/seals.h, the state's version 4)
 * — a real etcd, NATS JetStream and two cephalond on 127.0.0.1.
 *
 * Sessions on both nodes each answer a turn, are sealed, answer another and are sealed again;
 * each node's GET /v1/sessions/{id}/seals then lists them with their origins. A seal's 200 in
 * cluster mode waits until the log holds its session's state (as a completion's does), so the
 * node owning some sessions is killed -9 right after its last seal answered 200 — no completion
 * follows it. On the survivor, which took its shards over, each moved session lists every seal
 * it had exactly once — the same origin, trigger, episode and messages. Each session is then
 * sealed once more on its owner. The dead node comes back on its data (shards move back to it)
 * and is killed again (they move away again): each time every session lists each of its seals
 * exactly once. Without the import the survivor lacks the dead node's seals: the test fails.
 * Without etcd or nats-server the test fails and says what to install. */
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
#define MAX_SEALS 6

static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

/* A seal as GET /v1/sessions/{id}/seals lists it. */
typedef struct seal {
  char origin[200], trigger[32];
  long long episode;
  char *messages; /* the messages array, compact JSON with sorted keys */
} seal;

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  seal want[SESSIONS][MAX_SEALS]; /* each session's seals, as their node listed them */
  int n_want[SESSIONS];
  int round; /* the turns being answered */
} bench;

static void seals_free(seal *v, int n) {
  for (int i = 0; i < n; i++)
    free(v[i].messages);
}

/* Completes turn (of session s, on node n) with "reply <round> of tNN": done. */
static bool complete(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  char reply[64];
  snprintf(reply, sizeof reply, "reply %d of t%02d", b->round, s);
  cph_tc_complete_cost(b->c, n, turn, reply, 1, 0);
  return true;
}

/* Seals every session on its owner with trigger "<name> tNN" (each 200); the victim's last. */
static void seal_all(bench *b, const char *name, int victim) {
  for (int pass = 0; pass < 2; pass++)
    for (int s = 0; s < SESSIONS; s++) {
      if ((b->owner[s] == victim) != (pass == 1))
        continue;
      char path[64], body[64];
      snprintf(path, sizeof path, "/v1/sessions/t%02d/seal", s);
      snprintf(body, sizeof body, "{\"trigger\":\"%s t%02d\"}", name, s);
      b->owner[s] = cph_tc_post_on_owner(b->c, b->owner[s], path, body);
    }
}

/* Session s's seals, from its owner (asking node `via` first; b->owner[s] is updated): *n of
 * them into out (at most MAX_SEALS: more fails the test). */
static void list_seals(bench *b, int via, int s, seal *out, int *n) {
  char path[64];
  snprintf(path, sizeof path, "/v1/sessions/t%02d/seals", s);
  json_t *j = NULL, *seals = NULL;
  b->owner[s] = cph_tc_list_on_owner(b->c, via, path, "seals", MAX_SEALS, &j, &seals);
  *n = 0;
  size_t i;
  json_t *t;
  json_array_foreach(seals, i, t) {
    seal *o = &out[(*n)++];
    const char *origin = json_string_value(json_object_get(t, "origin"));
    if (!origin)
      fail_msg("t%02d's seal %lld on n%d has no origin", s,
               (long long)json_integer_value(json_object_get(t, "id")), b->owner[s]);
    snprintf(o->origin, sizeof o->origin, "%s", origin);
    snprintf(o->trigger, sizeof o->trigger, "%s",
             json_string_value(json_object_get(t, "trigger")));
    o->episode = json_integer_value(json_object_get(t, "episode"));
    o->messages = json_dumps(json_object_get(t, "messages"), JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(o->messages);
  }
  json_decref(j);
}

/* Every session's list on its owner holds each seal of b->want exactly once, as it was, and
 * nothing else. */
static void check_seals(void *ctx, const char *when) {
  bench *b = ctx;
  for (int s = 0; s < SESSIONS; s++) {
    seal got[MAX_SEALS];
    int n;
    list_seals(b, 0, s, got, &n);
    for (int w = 0; w < b->n_want[s]; w++) {
      const seal *want = &b->want[s][w];
      int times = 0;
      for (int k = 0; k < n; k++) {
        if (strcmp(got[k].origin, want->origin) != 0)
          continue;
        times++;
        if (strcmp(got[k].trigger, want->trigger) || got[k].episode != want->episode ||
            strcmp(got[k].messages, want->messages))
          fail_msg("%s: t%02d's seal %s on n%d is \"%s\" (episode %lld, messages %s), was "
                   "\"%s\" (episode %lld, messages %s)",
                   when, s, want->origin, b->owner[s], got[k].trigger, got[k].episode,
                   got[k].messages, want->trigger, want->episode, want->messages);
      }
      if (times != 1)
        fail_msg("%s: t%02d's seals on n%d hold seal %s (\"%s\") %d times, not once", when, s,
                 b->owner[s], want->origin, want->trigger, times);
    }
    if (n != b->n_want[s])
      fail_msg("%s: t%02d lists %d seals on n%d, not its %d", when, s, n, b->owner[s],
               b->n_want[s]);
    seals_free(got, n);
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
  if (b) {
    for (int s = 0; s < SESSIONS; s++)
      seals_free(b->want[s], b->n_want[s]);
    cph_tc_free(b->c);
  }
  free(b);
  return 0;
}

static void test_cluster_seals_a_moved_session_lists_every_seal_once(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int victim = 1, survivor = 0, moved = cph_tc_moved(b->owner, SESSIONS, victim);
  static const char *const names[] = {"first", "second"};
  for (int round = 0; round < 2; round++) {
    cph_tc_ask(c, round % NODES, SESSIONS, round);
    b->round = round;
    for (int n = 0; n < NODES; n++)
      cph_tc_lease_each(c, n, b->owner, SESSIONS, complete, b, names[round]);
    seal_all(b, names[round], victim);
  }
  size_t biggest = 0;
  for (int s = 0; s < SESSIONS; s++) { /* as each session's node lists them */
    int owner = b->owner[s];
    list_seals(b, owner, s, b->want[s], &b->n_want[s]);
    assert_int_equal(b->owner[s], owner);
    assert_int_equal(b->n_want[s], 2);
    char prefix[8], trigger[32];
    snprintf(prefix, sizeof prefix, "n%d/", owner);
    for (int k = 0; k < 2; k++) {
      seal *w = &b->want[s][k];
      assert_int_equal(strncmp(w->origin, prefix, strlen(prefix)), 0);
      snprintf(trigger, sizeof trigger, "%s t%02d", names[k], s);
      assert_string_equal(w->trigger, trigger);
      char reply[32];
      snprintf(reply, sizeof reply, "reply %d of t%02d", k, s);
      assert_non_null(strstr(w->messages, reply));
      biggest = strlen(w->messages) > biggest ? strlen(w->messages) : biggest;
    }
    assert_true(b->want[s][1].episode > b->want[s][0].episode);
  }
  /* kill -9 right after the victim's last seals answered 200; its data stays for later */
  char *victim_dir = cph_tc_kill_node(c, victim, true);
  cph_tc_settle(c, SHARDS, "after the kill");
  for (int s = 0; s < SESSIONS; s++)
    b->owner[s] = survivor;
  check_seals(b, "after the takeover");
  printf("n%d killed -9 right after its last seal: %d sessions moved to n%d, each listing its 2 "
         "seals once (messages %zu bytes of JSON at most)\n",
         victim, moved, survivor, biggest);

  /* one more seal each, on the survivor: the state now carries seals of both nodes */
  seal_all(b, "third", victim);
  for (int s = 0; s < SESSIONS; s++) {
    seal got[MAX_SEALS];
    int n;
    list_seals(b, survivor, s, got, &n);
    assert_int_equal(n, b->n_want[s] + 1);
    b->want[s][b->n_want[s]++] = got[n - 1]; /* oldest first: the newest is last */
    seals_free(got, n - 1);
    char prefix[8];
    snprintf(prefix, sizeof prefix, "n%d/", survivor);
    assert_int_equal(strncmp(b->want[s][b->n_want[s] - 1].origin, prefix, strlen(prefix)), 0);
  }
  check_seals(b, "after a seal on the survivor");

  /* the dead node comes back on its data (shards move back to it), and is killed again */
  int back = cph_tc_back_and_away(c, victim, SHARDS, TTL_S, EXTRA, victim_dir, b->owner,
                                  SESSIONS, check_seals, b);
  printf("%d sessions moved back to n%d and away again: each seal still listed once\n", back,
         victim);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_seals_a_moved_session_lists_every_seal_once),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
