/* Cluster mode: a dead node's replies reach connectors through the node that takes its
 * sessions over (server/clusterflow.h 11., core/replystream.h) — a real etcd, NATS JetStream
 * and three cephalond on 127.0.0.1.
 *
 * Sessions on every shard complete turns, each answering with a reply, on the three nodes; no
 * connector reads any replies stream. The node X owning a share of them is killed -9 right
 * after its last completion answered 200. Then reading every surviving node's
 * GET /v1/replies (what a connector does in cluster mode) yields every answered reply at least
 * once, each body under one origin only, X's under an origin naming X — so after dropping
 * repeated origins, exactly once — and no node's stream holds an origin twice. X then comes
 * back on its data and takes its shards back (it already holds its own replies: none is added
 * again there), a round of turns is answered everywhere, and X is killed again: the survivors,
 * taking X's shards a second time, already hold X's first replies and add none of them again,
 * and every answered reply is still offered. Without the replies in the state (or without
 * their import into the stream) the first check fails: X's replies are on no survivor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 3
#define SHARDS 12
#define TTL_S 2
#define PER_SHARD 2 /* sessions on each shard */
#define SESSIONS (SHARDS * PER_SHARD)
#define MAX_ROUNDS 3
#define VICTIM 2
#define LONG_TURNS 70 /* more replies than a session's state carries (its newest 64) */

static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

typedef struct bench {
  cph_test_cluster *c;
  char id[SESSIONS][16];
  int owner[SESSIONS];
  /* answered[s][round]: the completion of that round's reply answered 200, on node by[s][round] */
  bool answered[SESSIONS][MAX_ROUNDS];
  int by[SESSIONS][MAX_ROUNDS];
} bench;

static int shard_of(const char *id) { return cph_tc_shard_of(id, SHARDS); }

static void reply_body(char *buf, size_t size, int round, const char *session) {
  snprintf(buf, size, "reply %d of %s", round, session);
}

/* Posts question `round` to every session (through node via; keyed, so a retry is stored once). */
static void ask(bench *b, int via, int round) {
  char body[8192];
  size_t len = (size_t)snprintf(body, sizeof body, "{\"events\":[");
  for (int s = 0; s < SESSIONS; s++)
    len += (size_t)snprintf(body + len, sizeof body - len,
                            "%s{\"session\":\"%s\",\"sender\":\"ann\",\"key\":\"q%d-%s\","
                            "\"body\":\"question %d for %s\"}",
                            s ? "," : "", b->id[s], round, b->id[s], round, b->id[s]);
  snprintf(body + len, sizeof body - len, "]}");
  cph_test_response r = cph_test_api(b->c->port[via], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting round %d: %d %s", round, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

static int session_index(const bench *b, const char *id) {
  for (int s = 0; id && s < SESSIONS; s++)
    if (strcmp(b->id[s], id) == 0)
      return s;
  return -1;
}

/* Leases on every node up until each session completed its turn of `round` with its reply
 * (each completion answered 200, recorded in answered/by); 60 s at most. */
static void answer_round(bench *b, int round) {
  cph_test_cluster *c = b->c;
  int want = SESSIONS, got = 0;
  int64_t t0 = cph_test_now_ms();
  while (got < want) {
    if (cph_test_now_ms() - t0 > 60000)
      fail_msg("round %d: %d of %d sessions answered after 60 s", round, got, want);
    for (int n = 0; n < c->n_nodes; n++) {
      if (!c->up[n])
        continue;
      cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL,
                                         "{\"worker\":\"w\",\"wait_ms\":200}");
      if (r.status == 204 || r.status == 503) {
        cph_test_response_free(&r);
        continue;
      }
      if (r.status != 200)
        fail_msg("lease on n%d: %d %s", n, r.status, r.body ? r.body : "");
      json_t *j = cph_test_json(&r);
      cph_test_response_free(&r);
      json_t *turn = json_object_get(j, "turn");
      int s = session_index(b, json_string_value(json_object_get(turn, "session")));
      assert_true(s >= 0);
      char reply[64];
      reply_body(reply, sizeof reply, round, b->id[s]);
      cph_tc_complete(c, n, turn, reply);
      json_decref(j);
      if (!b->answered[s][round]) {
        b->answered[s][round] = true;
        b->by[s][round] = n;
        got++;
      }
    }
  }
}

/* Session s (owned by node n) answers LONG_TURNS more questions on n, one at a time, its
 * replies "long reply <k> of <id>"; each completion answered 200. */
static void answer_long(bench *b, int s, int n) {
  cph_test_cluster *c = b->c;
  for (int k = 0; k < LONG_TURNS; k++) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"key\":\"long%d\","
             "\"body\":\"long question %d\"}]}",
             b->id[s], k, k);
    cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/events", NULL, body);
    if (r.status != 200)
      fail_msg("posting long question %d: %d %s", k, r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
    char what[48];
    snprintf(what, sizeof what, "the lease of long question %d", k);
    json_t *j = cph_tc_lease_of(c, n, b->id[s], what);
    json_t *turn = json_object_get(j, "turn");
    char reply[64];
    snprintf(reply, sizeof reply, "long reply %d of %s", k, b->id[s]);
    cph_tc_complete(c, n, turn, reply);
    json_decref(j);
  }
}

/* One reply of a stream as read. */
typedef struct seen_reply {
  char *origin, *body;
  int node;
} seen_reply;

typedef struct seen {
  seen_reply *v;
  size_t n, cap;
} seen;

static void seen_free(seen *sn) {
  for (size_t i = 0; i < sn->n; i++) {
    free(sn->v[i].origin);
    free(sn->v[i].body);
  }
  free(sn->v);
  *sn = (seen){0};
}

/* Reads node n's whole replies stream (after=0 on, pages of 1,000) into sn, as a connector
 * would; every reply must carry an origin, and no origin may appear twice in one stream. */
static void read_stream(cph_test_cluster *c, int n, seen *sn) {
  size_t first = sn->n;
  long long after = 0;
  for (;;) {
    char path[96];
    snprintf(path, sizeof path, "/v1/replies?after=%lld&limit=1000", after);
    cph_test_response r = cph_test_api(c->port[n], "GET", path, NULL, NULL);
    if (r.status != 200)
      fail_msg("GET %s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
    json_t *j = cph_test_json(&r);
    cph_test_response_free(&r);
    json_t *list = json_object_get(j, "replies");
    if (json_array_size(list) == 0) {
      json_decref(j);
      break;
    }
    size_t i;
    json_t *o;
    json_array_foreach(list, i, o) {
      const char *origin = json_string_value(json_object_get(o, "origin"));
      const char *body = json_string_value(json_object_get(o, "body"));
      if (!origin || !body)
        fail_msg("n%d: a reply without an origin or a body in cluster mode", n);
      for (size_t k = first; k < sn->n; k++)
        if (strcmp(sn->v[k].origin, origin) == 0)
          fail_msg("n%d's stream holds origin %s twice (\"%s\")", n, origin, body);
      if (sn->n == sn->cap) {
        sn->cap = sn->cap ? 2 * sn->cap : 64;
        sn->v = realloc(sn->v, sn->cap * sizeof *sn->v);
        assert_non_null(sn->v);
      }
      sn->v[sn->n++] = (seen_reply){strdup(origin), strdup(body), n};
    }
    after = json_integer_value(json_object_get(j, "next"));
    json_decref(j);
  }
}

/* A connector's view: every node up's stream. Checks that each answered reply (rounds up to
 * `rounds`) is offered at least once, each body under one origin only (so dropping repeated
 * origins leaves it exactly once), and that a reply node X wrote carries an origin naming X.
 * Returns how many replies were offered in all (duplicates across nodes included). */
static size_t check_offered(bench *b, int rounds, const char *when) {
  seen sn = {0};
  for (int n = 0; n < b->c->n_nodes; n++)
    if (b->c->up[n])
      read_stream(b->c, n, &sn);
  for (int s = 0; s < SESSIONS; s++)
    for (int round = 0; round < rounds; round++) {
      if (!b->answered[s][round])
        continue;
      char body[64], prefix[16];
      reply_body(body, sizeof body, round, b->id[s]);
      snprintf(prefix, sizeof prefix, "n%d/", b->by[s][round]);
      const char *origin = NULL;
      int copies = 0;
      for (size_t i = 0; i < sn.n; i++) {
        if (strcmp(sn.v[i].body, body) != 0)
          continue;
        copies++;
        if (!origin)
          origin = sn.v[i].origin;
        else if (strcmp(origin, sn.v[i].origin) != 0)
          fail_msg("%s: \"%s\" is offered under two origins, %s and %s", when, body, origin,
                   sn.v[i].origin);
      }
      if (!copies)
        fail_msg("%s: \"%s\", answered 200 on n%d, is in no live node's /v1/replies", when,
                 body, b->by[s][round]);
      if (strncmp(origin, prefix, strlen(prefix)) != 0)
        fail_msg("%s: \"%s\" was written on n%d but its origin is %s", when, body,
                 b->by[s][round], origin);
    }
  size_t total = sn.n;
  seen_free(&sn);
  return total;
}

/* How many replies node n's stream holds. */
static size_t stream_length(cph_test_cluster *c, int n) {
  seen sn = {0};
  read_stream(c, n, &sn);
  size_t len = sn.n;
  seen_free(&sn);
  return len;
}

static const char *session_id(int s, void *ctx) { return ((bench *)ctx)->id[s]; }

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  assert_non_null(b);
  cph_test_cluster *c = cph_tc_new();
  b->c = c;
  /* PER_SHARD session ids on each shard: the first ones of r0, r1, ... that hash there */
  int on_shard[SHARDS] = {0}, made = 0;
  for (int k = 0; made < SESSIONS; k++) {
    char id[16];
    snprintf(id, sizeof id, "r%d", k);
    int sh = shard_of(id);
    if (on_shard[sh] < PER_SHARD) {
      on_shard[sh]++;
      memcpy(b->id[made++], id, sizeof id);
    }
  }
  cph_tc_up_with_sessions(c, NODES, SHARDS, TTL_S, EXTRA, SESSIONS, session_id, b, b->owner);
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

static void test_cluster_replies_a_dead_nodes_answered_replies_reach_connectors_once_by_origin(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int on_victim = 0;
  for (int s = 0; s < SESSIONS; s++)
    on_victim += b->owner[s] == VICTIM;
  assert_true(on_victim > 0);
  for (int round = 0; round < 2; round++) {
    ask(b, round % NODES, round);
    answer_round(b, round);
  }
  /* one of the victim's sessions answers more than its state carries: the older replies move
   * as items (server/clusterflow.h 13.) */
  int longest = 0;
  while (b->owner[longest] != VICTIM)
    longest++;
  answer_long(b, longest, VICTIM);
  /* kill -9 right after the last 200s; nobody read any replies stream */
  char *victim_data = cph_tc_kill_node(c, VICTIM, true);
  int64_t t0 = cph_test_now_ms();
  cph_tc_settle(c, SHARDS, "after the kill");
  size_t offered = check_offered(b, 2, "after the kill");
  seen sn = {0};
  for (int n = 0; n < NODES; n++)
    if (c->up[n])
      read_stream(c, n, &sn);
  for (int k = 0; k < LONG_TURNS; k++) {
    char body[64];
    snprintf(body, sizeof body, "long reply %d of %s", k, b->id[longest]);
    bool found = false;
    for (size_t i = 0; i < sn.n && !found; i++)
      found = strcmp(sn.v[i].body, body) == 0;
    if (!found)
      fail_msg("after the kill: \"%s\", answered 200 on n%d, is in no live node's /v1/replies",
               body, VICTIM);
  }
  seen_free(&sn);
  printf("n%d (%d sessions) killed -9: every answered reply offered by the survivors %lld ms "
         "later (%zu offered, %d answered)\n",
         VICTIM, on_victim, (long long)(cph_test_now_ms() - t0), offered, 2 * SESSIONS);

  /* X comes back on its data and takes its shards back: it holds its own replies already */
  size_t victim_before = 0;
  cph_tc_start_node_on(c, VICTIM, SHARDS, TTL_S, EXTRA, victim_data);
  cph_tc_settle(c, SHARDS, "the victim back");
  victim_before = stream_length(c, VICTIM);
  check_offered(b, 2, "the victim back");
  assert_int_equal(stream_length(c, VICTIM), victim_before);

  /* a round everywhere (each survivor's states now carry the replies it took over), then the
   * shards move to the survivors a second time: what they hold is not added again */
  size_t held[NODES];
  for (int n = 0; n < NODES; n++)
    held[n] = stream_length(c, n);
  ask(b, 0, 2);
  answer_round(b, 2);
  int fresh[NODES] = {0};
  for (int s = 0; s < SESSIONS; s++)
    fresh[b->by[s][2]]++;
  cph_tc_kill_node(c, VICTIM, false);
  cph_tc_settle(c, SHARDS, "the second kill");
  check_offered(b, 3, "after the second kill"); /* also: no stream holds an origin twice */
  for (int n = 0; n < NODES; n++) {
    if (n == VICTIM)
      continue;
    /* at most: what it held, its own round-2 replies, and the victim's round-2 replies and
     * those the victim took over from others — never X's first replies a second time */
    size_t now = stream_length(c, n);
    printf("n%d: %zu replies before round 2, %zu after the second kill\n", n, held[n], now);
    assert_true(now >= held[n] + (size_t)fresh[n]);
  }
}

/* ---------------------------------------------------------------- cephalonctl replies --follow
 *
 * The reference connector loop (cli/cmd_replies.c) against the same cluster: started with one
 * node's URL only, it finds the others in GET /v1/cluster, and must print every answered reply
 * exactly once — the victim's too, which it read from the victim before the kill and which the
 * survivors offer again under the same origins (without the dedupe those come out twice), or
 * which only the survivors offer (answered right before the kill, maybe unread). */

/* "body":"<reply>" as cephalonctl --json prints it (compact). */
static void body_needle(char *buf, size_t size, int round, const char *session) {
  char body[64];
  reply_body(body, sizeof body, round, session);
  snprintf(buf, size, "\"body\":\"%s\"", body);
}

/* Waits up to timeout_ms until the follower's output holds every reply of rounds [from, to]. */
static void wait_followed(bench *b, const char *out_path, int from, int to, int timeout_ms,
                          const char *when) {
  int64_t t0 = cph_test_now_ms();
  for (;;) {
    char *out = cph_test_read_file(out_path, NULL);
    const char *missing = NULL;
    char needle[96];
    for (int round = from; round <= to && !missing; round++)
      for (int s = 0; s < SESSIONS && !missing; s++) {
        body_needle(needle, sizeof needle, round, b->id[s]);
        if (!out || !strstr(out, needle))
          missing = needle;
      }
    free(out);
    if (!missing)
      return;
    if (cph_test_now_ms() - t0 > timeout_ms)
      fail_msg("%s: the follower printed no %s within %d ms (its output in %s)", when, missing,
               timeout_ms, out_path);
    cph_tc_sleep_ms(100);
  }
}

static void test_cluster_replies_follow_prints_every_answered_reply_once_across_a_kill(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  char out_path[512], err_path[512], bin[512];
  snprintf(out_path, sizeof out_path, "%s/follow.out", c->dir);
  snprintf(err_path, sizeof err_path, "%s/follow.err", c->dir);
  snprintf(bin, sizeof bin, "%s/cephalonctl", getenv("CPH_BIN_DIR"));
  const char *argv[] = {bin, "--url", c->url[0], "--json", "replies", "--follow", "--wait-ms",
                        "1000", NULL};
  pid_t pid = cph_test_spawn(argv, out_path, err_path);
  assert_true(pid > 0);

  /* round 0 read by the follower from every node, the victim included */
  ask(b, 0, 0);
  answer_round(b, 0);
  wait_followed(b, out_path, 0, 0, 20000, "round 0");
  /* one of the victim's sessions answers more replies than the follower remembers of a
   * session (64) and than a state carries; all read from the victim before the kill, and all
   * offered again by the survivor that takes the session over (its reply items): the follower
   * knows it read them from the victim's own stream, and prints none again */
  int longest = 0;
  while (b->owner[longest] != VICTIM)
    longest++;
  answer_long(b, longest, VICTIM);
  for (int64_t t0 = cph_test_now_ms();; cph_tc_sleep_ms(100)) {
    char *out = cph_test_read_file(out_path, NULL), needle[96];
    snprintf(needle, sizeof needle, "\"body\":\"long reply %d of %s\"", LONG_TURNS - 1,
             b->id[longest]);
    bool done = out && strstr(out, needle);
    free(out);
    if (done)
      break;
    if (cph_test_now_ms() - t0 > 20000)
      fail_msg("the follower printed no %s within 20 s (its output in %s)", needle, out_path);
  }
  /* round 1, and the victim killed -9 right after its last 200: some of its round-1 replies
   * may be unread, the survivors offer them (and its round-0 ones) again */
  ask(b, 1, 1);
  answer_round(b, 1);
  cph_tc_kill_node(c, VICTIM, false);
  cph_tc_settle(c, SHARDS, "after the kill");
  /* round 2 on the survivors: a node's stream is read in order, so once the follower printed
   * a survivor's round-2 reply it has read what that survivor took over before it */
  ask(b, 0, 2);
  answer_round(b, 2);
  wait_followed(b, out_path, 0, 2, 60000, "after the kill");
  int status = cph_test_signal_wait(pid, SIGINT, 10000);
  char *out = cph_test_read_file(out_path, NULL), *err = cph_test_read_file(err_path, NULL);
  if (status != 0)
    fail_msg("replies --follow after SIGINT: exit %d\nstderr: %s", status, err ? err : "");

  /* every line is one reply with an origin; no origin twice; every answered reply exactly
   * once, under an origin naming the node that wrote it; nothing else */
  seen sn = {0};
  size_t lines = 0;
  for (const char *line = out; line && *line; lines++) {
    size_t len = strcspn(line, "\n");
    json_t *o = json_loadb(line, len, 0, NULL);
    const char *origin = json_string_value(json_object_get(o, "origin"));
    const char *body = json_string_value(json_object_get(o, "body"));
    if (!origin || !body)
      fail_msg("follower line %zu is no reply with an origin: %.*s", lines + 1, (int)len, line);
    for (size_t k = 0; k < sn.n; k++)
      if (strcmp(sn.v[k].origin, origin) == 0)
        fail_msg("the follower printed origin %s twice (\"%s\")", origin, body);
    if (sn.n == sn.cap) {
      sn.cap = sn.cap ? 2 * sn.cap : 64;
      sn.v = realloc(sn.v, sn.cap * sizeof *sn.v);
      assert_non_null(sn.v);
    }
    sn.v[sn.n++] = (seen_reply){strdup(origin), strdup(body), -1};
    json_decref(o);
    line += len + (line[len] == '\n');
  }
  int answered = 0;
  for (int s = 0; s < SESSIONS; s++)
    for (int round = 0; round < 3; round++) {
      assert_true(b->answered[s][round]);
      answered++;
      char body[64], prefix[16];
      reply_body(body, sizeof body, round, b->id[s]);
      snprintf(prefix, sizeof prefix, "n%d/", b->by[s][round]);
      int copies = 0;
      for (size_t i = 0; i < sn.n; i++)
        if (strcmp(sn.v[i].body, body) == 0) {
          copies++;
          if (strncmp(sn.v[i].origin, prefix, strlen(prefix)) != 0)
            fail_msg("\"%s\" was written on n%d but printed under %s", body, b->by[s][round],
                     sn.v[i].origin);
        }
      if (copies != 1)
        fail_msg("the follower printed \"%s\" %d times", body, copies);
    }
  for (int k = 0; k < LONG_TURNS; k++) {
    char body[64];
    snprintf(body, sizeof body, "long reply %d of %s", k, b->id[longest]);
    int copies = 0;
    for (size_t i = 0; i < sn.n; i++)
      copies += strcmp(sn.v[i].body, body) == 0;
    if (copies != 1)
      fail_msg("the follower printed \"%s\" %d times", body, copies);
  }
  assert_int_equal(sn.n, (size_t)answered + LONG_TURNS);
  int by_victim = 0;
  for (int s = 0; s < SESSIONS; s++)
    by_victim += b->by[s][0] == VICTIM;
  printf("the follower printed %zu replies once each (%d of round 0 by the victim, read from "
         "it before the kill and offered again by the survivors)\n",
         sn.n, by_victim);
  assert_true(by_victim > 0);
  seen_free(&sn);
  free(out);
  free(err);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_cluster_replies_a_dead_nodes_answered_replies_reach_connectors_once_by_origin,
          setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_cluster_replies_follow_prints_every_answered_reply_once_across_a_kill, setup,
          teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
