/* Cluster mode: a node that joins while another is still taking shards over (DESIGN §14
 * "Shards", "State"; server/clusterlog.c take_fences, server/cluster.h's serving rule) — a real
 * etcd, NATS JetStream and two cephalond on 127.0.0.1.
 *
 * n0 starts alone and claims every shard; its takeovers are slowed (CPH_TEST_TAKEOVER_DELAY_MS,
 * fault injection for tests) so that some are still under way when n1 joins a second later and
 * the shard map gives n1 half of them. n1 takes those over (fencing them: its epoch on each
 * shard's done subject), while n0's slowed takeovers of the same shards wake up. They must not
 * write their fences after n1's: n0 stopped serving those shards before releasing them, and a
 * takeover writes fences only while its node serves the shard. Then every session on either
 * node answers a turn, each completion 200. Before the fix n0's late epoch deposed n1 on the
 * shards it had just taken, and n1 answered its completions there 503 `unavailable` ("another
 * node took the shard over") for good — what a loaded CI machine once hit at start. */
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

#define NODES 2
#define SHARDS 16
#define TTL_S 2
#define SESSIONS 40
/* A takeover of n0 waits this long before its fences: n1 joins within the first ones. */
#define DELAY_MS "1500"

/* One round of 40 turns is more than the interactive lane's 60 a minute split between nodes. */
static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

typedef struct world {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int completed[NODES];
} world;

static bool answer(void *ctx, int n, json_t *turn, int s) {
  world *w = ctx;
  char path[96], body[256];
  cph_test_completion(turn, path, sizeof path, body, sizeof body);
  cph_test_response r = cph_test_api(w->c->port[n], "POST", path, NULL, body);
  if (r.status != 200)
    fail_msg("completing t%02d's turn on n%d: %d %s", s, n, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  w->completed[n]++;
  return true;
}

static void test_cluster_join_a_node_joining_mid_takeover_is_not_deposed(void **state) {
  (void)state;
  world w = {0};
  cph_test_cluster *c = w.c = cph_tc_new();
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  setenv("CPH_TEST_TAKEOVER_DELAY_MS", DELAY_MS, 1); /* n0's environment only */
  cph_tc_start_node(c, 0, SHARDS, TTL_S, EXTRA);
  unsetenv("CPH_TEST_TAKEOVER_DELAY_MS");
  cph_tc_sleep_ms(1000); /* n0 owns every shard and is taking the first ones over */
  cph_tc_start_node(c, 1, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "after n1 joined");
  for (int s = 0; s < SESSIONS; s++) {
    char body[128];
    snprintf(body, sizeof body, "{\"id\":\"t%02d\",\"class\":\"interactive\"}", s);
    w.owner[s] = cph_tc_post_on_owner(c, s % NODES, "/v1/sessions", body);
  }
  cph_tc_wait_known(c, SESSIONS);
  cph_tc_ask(c, 0, SESSIONS, 0);
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, w.owner, SESSIONS, answer, &w, "the round after the join");
  /* both nodes served sessions: n1 got shards from n0 */
  assert_true(w.completed[0] > 0);
  assert_true(w.completed[1] > 0);
  assert_int_equal(w.completed[0] + w.completed[1], SESSIONS);
  cph_tc_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_join_a_node_joining_mid_takeover_is_not_deposed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
