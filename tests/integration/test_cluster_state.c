/* Cluster mode: a moved shard's sessions keep their state (server/clusterflow.h 11.) — a real
 * etcd, NATS JetStream and two cephalond on 127.0.0.1.
 *
 * Sessions on both nodes complete ROUNDS turns each, each answering its question with a reply
 * (and a context node a worker inserted). Then the node owning some of them is killed -9 right
 * after its last completion answered 200. On the survivor, which took its shards over:
 *   - each moved session's context tree (GET /v1/sessions/{id}/context) holds every answered
 *     reply exactly once, and the inserted node, at the episode it had;
 *   - its next lease's context (the lease answer's messages) shows every earlier reply;
 *   - its memories (minted by its turns) are there, each once, and its credits are those it
 *     had, not a fresh session's;
 * and a completion there carries the state on: the node killed next (the survivor, restarted
 * on an empty data dir) serves the same again. Without the state in the log the survivor's
 * copies start empty (a fresh tree, episode 0): the test fails. Without etcd or nats-server
 * the test fails and says what to install. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 2
#define SHARDS 16
#define TTL_S 2
#define SESSIONS 12
#define ROUNDS 3

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int64_t episode[SESSIONS]; /* on its owner, before the kill */
  int round; /* the turns being answered (answer_round) */
  char extra[256];
} bench;

/* Credits barely refill, so a moved session's (charged 5 a turn) are told from a new one's. */
static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}"
    " :credits {:refill-per-second 0.001 :max 30 :cost {:interactive 5 :operational 1"
    " :maintenance 1}}}";

/* The memories a completion of round `round` of session t<s> gives beside its own (complete_turn
 * with keepsakes): "keepsake r<round>k<k> of t<s>", k < KEEPSAKES. With MANY_TURNS turns the
 * session holds more raw memories than a state carries (160), and fewer than a search reads
 * by their texts while their embeddings wait (256, core/search.c: this cluster's maintenance
 * budget embeds them slowly). */
#define KEEPSAKES 2

/* Completes the leased turn on node n with round's reply and memory for session t<s>
 * (asserted 200); with keepsakes, KEEPSAKES more memories. */
static void complete_turn_with(cph_test_cluster *c, int n, json_t *turn, int round, int s,
                               bool keepsakes) {
  char path[96], body[1024], more[512] = "";
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  for (int k = 0, at = 0; keepsakes && k < KEEPSAKES; k++)
    at += snprintf(more + at, sizeof more - (size_t)at,
                   ",{\"text\":\"keepsake r%dk%d of t%02d\"}", round, k, s);
  snprintf(body, sizeof body,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":40,\"tool_calls\":1},"
           "\"reply\":{\"body\":\"reply %d of t%02d\"},"
           "\"memories\":[{\"text\":\"memory %d of t%02d\"}%s]}",
           json_string_value(json_object_get(turn, "lease")), round, s, round, s, more);
  cph_test_response r = cph_test_api(c->port[n], "POST", path, NULL, body);
  if (r.status != 200)
    fail_msg("completing %s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

static void complete_turn(cph_test_cluster *c, int n, json_t *turn, int round, int s) {
  complete_turn_with(c, n, turn, round, s, false);
}

/* Checks turn (of session s, on node n) stages question b->round and completes it: done. */
static bool answer(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  char want_q[64];
  snprintf(want_q, sizeof want_q, "question %d for t%02d", b->round, s);
  json_t *staged = json_object_get(turn, "staged");
  assert_int_equal(json_array_size(staged), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(staged, 0), "body")),
                      want_q);
  complete_turn(b->c, n, turn, b->round, s);
  return true;
}

/* Leases on node n until each session it owns (b->owner) completed one turn of `round`,
 * answering "reply <round> of <session>"; 30 s at most. Each completion must answer 200. */
static void answer_round(bench *b, int n, int round) {
  char what[32];
  snprintf(what, sizeof what, "round %d", round);
  b->round = round;
  cph_tc_lease_each(b->c, n, b->owner, SESSIONS, answer, b, what);
}

/* GET path on node n: 200 and its JSON (asserted). */
static json_t *get_json(cph_test_cluster *c, int n, const char *path) {
  cph_test_response r = cph_test_api(c->port[n], "GET", path, NULL, NULL);
  if (r.status != 200)
    fail_msg("GET %s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  assert_non_null(j);
  return j;
}

/* How many nodes of session s's context tree on node n have this role and content. */
static int tree_count(cph_test_cluster *c, int n, int s, const char *role, const char *content,
                      int64_t *episode) {
  char path[64];
  snprintf(path, sizeof path, "/v1/sessions/t%02d/context", s);
  json_t *j = get_json(c, n, path);
  int count = 0;
  size_t i;
  json_t *node;
  json_array_foreach(json_object_get(j, "nodes"), i, node) {
    const char *r = json_string_value(json_object_get(node, "role"));
    const char *t = json_string_value(json_object_get(node, "content"));
    count += (role ? r && strcmp(r, role) == 0 : !r) && t && strcmp(t, content) == 0;
  }
  if (episode)
    *episode = json_integer_value(json_object_get(j, "episode"));
  json_decref(j);
  return count;
}

/* How many of session s's memories on node n that a search for query (URL-encoded) finds
 * have this text. */
static int search_count(cph_test_cluster *c, int n, int s, const char *query, const char *text) {
  char path[192];
  snprintf(path, sizeof path, "/v1/memories/search?session=t%02d&q=%s&k=100", s, query);
  json_t *j = get_json(c, n, path);
  int count = 0;
  size_t i;
  json_t *hit;
  json_array_foreach(json_object_get(j, "memories"), i, hit) {
    const char *t = json_string_value(json_object_get(hit, "text"));
    count += t && strcmp(t, text) == 0;
  }
  if (getenv("CPH_TEST_DEBUG") && count != 1) {
    char *d = json_dumps(j, JSON_COMPACT);
    printf("search t%02d on n%d: %s\n", s, n, d);
    free(d);
  }
  json_decref(j);
  return count;
}

/* How many of session s's memories on node n (a lexical search) have this text. */
static int memory_count(cph_test_cluster *c, int n, int s, const char *text) {
  return search_count(c, n, s, "memory", text);
}

static double credits_of(cph_test_cluster *c, int n, int s) {
  char path[64];
  snprintf(path, sizeof path, "/v1/sessions/t%02d", s);
  json_t *j = get_json(c, n, path);
  double credits = json_number_value(json_object_get(j, "credits"));
  json_decref(j);
  return credits;
}

/* Session s on node n (its owner now) holds what ROUNDS answered turns left: each reply once in
 * its tree, the note, the episode it had, its credits. */
static void check_state(bench *b, int n, int s, const char *when) {
  int64_t episode = -1;
  for (int round = 0; round < ROUNDS; round++) {
    char reply[64];
    snprintf(reply, sizeof reply, "reply %d of t%02d", round, s);
    int k = tree_count(b->c, n, s, "assistant", reply, round ? NULL : &episode);
    if (k != 1)
      fail_msg("%s: t%02d's tree on n%d holds \"%s\" %d times, not once", when, s, n, reply, k);
    char memory[64];
    snprintf(memory, sizeof memory, "memory %d of t%02d", round, s);
    if ((k = memory_count(b->c, n, s, memory)) != 1)
      fail_msg("%s: t%02d's memories on n%d hold \"%s\" %d times, not once", when, s, n,
               memory, k);
  }
  char note[64];
  snprintf(note, sizeof note, "note of t%02d", s);
  if (tree_count(b->c, n, s, NULL, note, NULL) != 1)
    fail_msg("%s: t%02d's tree on n%d lacks its note", when, s, n);
  if (episode != b->episode[s])
    fail_msg("%s: t%02d is at episode %lld on n%d, was %lld", when, s, (long long)episode, n,
             (long long)b->episode[s]);
  double credits = credits_of(b->c, n, s);
  if (credits > 20.0)
    fail_msg("%s: t%02d has %.2f credits on n%d: a new session's, not the %d turns' charge", when,
             s, credits, n, ROUNDS);
}

/* Checks turn (of session s, on node n) shows each earlier reply of its session once in its
 * messages, and completes it: done. */
static bool shows_replies(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  for (int k = 0; k < b->round; k++) {
    char reply[64];
    snprintf(reply, sizeof reply, "reply %d of t%02d", k, s);
    int seen = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(turn, "messages"), i, m) {
      const char *content = json_string_value(json_object_get(m, "content"));
      seen += content && strstr(content, reply) != NULL;
    }
    if (seen != 1) {
      char *dump = json_dumps(json_object_get(turn, "messages"), JSON_COMPACT);
      fail_msg("t%02d's lease on n%d shows \"%s\" %d times in its messages, not once: %s", s,
               n, reply, seen, dump ? dump : "?");
    }
  }
  complete_turn(b->c, n, turn, b->round, s);
  return true;
}

/* Leases the next question of every session node n owns: each lease's messages show every
 * earlier reply of its session. Completes it, answering "reply <round> of <session>". */
static void next_lease_shows_replies(bench *b, int n, int round) {
  cph_tc_ask(b->c, n, SESSIONS, round);
  b->round = round;
  cph_tc_lease_each(b->c, n, b->owner, SESSIONS, shows_replies, b, "the leases after the takeover");
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

static void test_cluster_state_a_dead_nodes_sessions_keep_their_history_tree_and_credits(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int victim = 1, survivor = 0, moved = cph_tc_moved(b->owner, SESSIONS, victim);
  for (int round = 0; round < ROUNDS; round++) {
    cph_tc_ask(c, round % NODES, SESSIONS, round);
    for (int n = 0; n < NODES; n++)
      answer_round(b, n, round);
    if (round == 0)
      for (int s = 0; s < SESSIONS; s++) {
        char path[64], body[128];
        snprintf(path, sizeof path, "/v1/sessions/t%02d/context", s);
        snprintf(body, sizeof body, "{\"at\":\"d0, 1, 0\",\"content\":\"note of t%02d\"}", s);
        cph_tc_post_on_owner(c, b->owner[s], path, body);
      }
  }
  for (int s = 0; s < SESSIONS; s++) {
    tree_count(c, b->owner[s], s, "assistant", "", &b->episode[s]);
    assert_true(b->episode[s] >= ROUNDS);
    check_state(b, b->owner[s], s, "before the kill");
  }
  /* kill -9 right after the last completions answered 200 */
  int64_t t0 = cph_test_now_ms();
  cph_tc_kill_node(c, victim, false);
  cph_tc_settle(c, SHARDS, "after the kill");
  printf("n%d killed -9: %d sessions moved to n%d, served and rebuilt %lld ms later\n", victim,
         moved, survivor, (long long)(cph_test_now_ms() - t0));
  for (int s = 0; s < SESSIONS; s++) {
    b->owner[s] = survivor;
    check_state(b, survivor, s, "after the takeover");
  }
  json_t *v = cph_tc_view(c, survivor);
  json_t *st = json_object_get(json_object_get(v, "log"), "states");
  printf("n%d: %lld states put (%lld bytes), %lld loaded (%lld bytes)\n", survivor,
         (long long)json_integer_value(json_object_get(st, "put")),
         (long long)json_integer_value(json_object_get(st, "put_bytes")),
         (long long)json_integer_value(json_object_get(st, "loaded")),
         (long long)json_integer_value(json_object_get(st, "loaded_bytes")));
  assert_true(json_integer_value(json_object_get(st, "loaded")) >= moved);
  json_decref(v);
  next_lease_shows_replies(b, survivor, ROUNDS);
  for (int s = 0; s < SESSIONS; s++)
    b->episode[s]++;
}

/* The survivor's completions carried the state on: a node started on an empty data dir that
 * takes every shard (the survivor killed) serves the sessions with all ROUNDS + 1 replies. */
static void test_cluster_state_moves_again_from_the_new_owner(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int fresh = 1, old = 0;
  assert_false(c->up[fresh]); /* the first test killed it */
  cph_tc_start_node(c, fresh, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "a fresh node joined");
  cph_tc_kill_node(c, old, false);
  cph_tc_settle(c, SHARDS, "the second kill");
  for (int s = 0; s < SESSIONS; s++) {
    b->owner[s] = fresh;
    check_state(b, fresh, s, "on a fresh node");
    char reply[64];
    snprintf(reply, sizeof reply, "reply %d of t%02d", ROUNDS, s);
    if (tree_count(c, fresh, s, "assistant", reply, NULL) != 1)
      fail_msg("t%02d's tree on the fresh node lacks \"%s\", answered on the first new owner", s,
               reply);
  }
  next_lease_shows_replies(b, fresh, ROUNDS + 1);
}

#define MANY_TURNS 70 /* more turns than a state carries (its newest 64 turn records) */
#define MANY_SEALS 20 /* more seals than it carries (its newest 16) */

/* The list under `key` of GET path on node n, one line per element: its string members
 * fields[0..n_fields) separated by spaces ("-" for one it lacks), in the list's order, into
 * out[0..cap); *count its elements. */
static void list_lines(cph_test_cluster *c, int n, const char *path, const char *key,
                       const char *const *fields, size_t n_fields, char *out, size_t cap,
                       int *count) {
  json_t *j = get_json(c, n, path);
  size_t at = 0, i;
  json_t *e;
  *count = 0;
  out[0] = '\0';
  json_array_foreach(json_object_get(j, key), i, e) {
    for (size_t f = 0; f < n_fields; f++) {
      const char *v = json_string_value(json_object_get(e, fields[f]));
      at += (size_t)snprintf(out + at, cap - at, "%s%s", f ? " " : "", v ? v : "-");
      assert_true(at < cap);
    }
    at += (size_t)snprintf(out + at, cap - at, "\n");
    assert_true(at < cap);
    (*count)++;
  }
  json_decref(j);
}

/* Session s's ended turns on node n, newest first: their origins. */
static void turn_origins(cph_test_cluster *c, int n, int s, char *out, size_t cap, int *count) {
  static const char *const fields[] = {"origin"};
  char path[96];
  snprintf(path, sizeof path, "/v1/turns?session=t%02d&limit=1000", s);
  list_lines(c, n, path, "turns", fields, 1, out, cap, count);
}

/* Session s's seals on node n, oldest first: their origins and triggers. */
static void seal_origins(cph_test_cluster *c, int n, int s, char *out, size_t cap, int *count) {
  static const char *const fields[] = {"origin", "trigger"};
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/t%02d/seals", s);
  list_lines(c, n, path, "seals", fields, 2, out, cap, count);
}

/* How many of session s's memories on node n say "keepsake r<round>k<k> of t<s>" (a search
 * for its words). */
static int keepsake_count(cph_test_cluster *c, int n, int s, int round, int k) {
  char query[64], text[64];
  snprintf(query, sizeof query, "keepsake+r%dk%d", round, k);
  snprintf(text, sizeof text, "keepsake r%dk%d of t%02d", round, k, s);
  return search_count(c, n, s, query, text);
}

/* A session's turn records and seals beyond what its state carries move too, each under a key
 * of its own (server/clusterflow.h 13.): after MANY_TURNS turns and MANY_SEALS seals on its
 * owner and a kill -9 of it, the new owner lists every record and seal, in the same order, with
 * the same origins, and finds every memory the worker gave in those turns (KEEPSAKES more than
 * the turns' own, so beyond the state's newest 160); deleting the session deletes those keys
 * (the memories' too), so a session created again under its id and moved lists none of its
 * records. Without the items the new owner lists the newest 64 records and 16 seals, and lacks
 * the oldest memories. (A node that held the session before keeps its memories as a single
 * node does: a session delete leaves its memories.) */
static void test_cluster_state_records_beyond_the_state_move_as_items(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int back = 0, s = 5;
  assert_false(c->up[back]); /* the second test killed it */
  cph_tc_start_node(c, back, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "the killed node came back");
  int n = cph_tc_post_on_owner(c, back, "/v1/sessions/t05/seal", "{\"trigger\":\"s0\"}");
  for (int k = 1; k < MANY_SEALS; k++) {
    char body[64];
    snprintf(body, sizeof body, "{\"trigger\":\"s%d\"}", k);
    assert_int_equal(cph_tc_post_on_owner(c, n, "/v1/sessions/t05/seal", body), n);
  }
  for (int k = 0; k < MANY_TURNS; k++) {
    char body[160];
    snprintf(body, sizeof body,
             "{\"events\":[{\"session\":\"t05\",\"sender\":\"ann\",\"body\":\"item question "
             "%d\"}]}",
             k);
    cph_tc_post_on_owner(c, n, "/v1/events", body);
    char what[32];
    snprintf(what, sizeof what, "lease %d", k);
    json_t *j = cph_tc_lease_of(c, n, "t05", what);
    json_t *turn = json_object_get(j, "turn");
    complete_turn_with(c, n, turn, 100 + k, s, true);
    json_decref(j);
  }
  static char turns_before[64 * 1024], turns_after[64 * 1024], seals_before[8192],
      seals_after[8192];
  int nt, ns, mt, ms;
  turn_origins(c, n, s, turns_before, sizeof turns_before, &nt);
  seal_origins(c, n, s, seals_before, sizeof seals_before, &ns);
  assert_true(nt >= MANY_TURNS + ROUNDS);
  assert_int_equal(ns, MANY_SEALS);
  json_t *v = cph_tc_view(c, n);
  json_t *items = json_object_get(json_object_get(v, "log"), "items");
  long long put = json_integer_value(json_object_get(items, "put"));
  printf("n%d put %lld items, %lld bytes (%d turns, %d seals)\n", n, put,
         (long long)json_integer_value(json_object_get(items, "put_bytes")), MANY_TURNS,
         MANY_SEALS);
  assert_true(put >= MANY_TURNS * (2 + KEEPSAKES) + MANY_SEALS);
  json_decref(v);
  for (int k = 0; k < MANY_TURNS; k += 23)
    assert_int_equal(keepsake_count(c, n, s, 100 + k, 0), 1);

  cph_tc_kill_node(c, n, false);
  cph_tc_settle(c, SHARDS, "the owner of t05 killed");
  int m = 1 - n;
  turn_origins(c, m, s, turns_after, sizeof turns_after, &mt);
  seal_origins(c, m, s, seals_after, sizeof seals_after, &ms);
  printf("t05: %d turn records and %d seals on n%d, %d and %d on n%d after the kill\n", nt, ns,
         n, mt, ms, m);
  assert_int_equal(mt, nt);
  assert_string_equal(turns_after, turns_before);
  assert_int_equal(ms, ns);
  assert_string_equal(seals_after, seals_before);
  /* and every memory its worker gave, though the state carries only the newest 160 */
  int found = 0;
  for (int k = 0; k < MANY_TURNS; k++)
    for (int j = 0; j < KEEPSAKES; j++) {
      int was = keepsake_count(c, m, s, 100 + k, j);
      if (was != 1)
        fail_msg("'keepsake r%dk%d of t05' found %d times on n%d after the kill", 100 + k, j,
                 was, m);
      found += was;
    }
  printf("t05: all %d keepsakes found on n%d after the kill\n", found, m);
  v = cph_tc_view(c, m);
  items = json_object_get(json_object_get(v, "log"), "items");
  assert_true(json_integer_value(json_object_get(items, "loaded")) >= nt - 64 + ns - 16);
  assert_int_equal(json_integer_value(json_object_get(items, "refused")), 0);
  json_decref(v);

  /* deleted: its keys go (after the puts in flight could have ended) */
  cph_test_response r = cph_test_api(c->port[m], "DELETE", "/v1/sessions/t05", NULL, NULL);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  long long forgotten = 0, keys = nt + ns + MANY_TURNS * (1 + KEEPSAKES);
  for (int waited = 0; waited < 40000 && forgotten < keys; waited += 500) {
    cph_tc_sleep_ms(500);
    v = cph_tc_view(c, m);
    items = json_object_get(json_object_get(v, "log"), "items");
    forgotten = json_integer_value(json_object_get(items, "forgotten"));
    json_decref(v);
  }
  if (forgotten < keys)
    fail_msg("n%d deleted %lld item keys of t05 in 40 s, not its %d turn records, %d seals and "
             "%d memories", m, forgotten, nt, ns, MANY_TURNS * (1 + KEEPSAKES));

  /* created again and moved (n back, m killed): nothing of the old one comes with it */
  cph_tc_post_on_owner(c, m, "/v1/sessions", "{\"id\":\"t05\",\"class\":\"interactive\"}");
  cph_tc_post_on_owner(c, m, "/v1/sessions/t05/seal", "{\"trigger\":\"new\"}");
  cph_tc_start_node(c, n, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "the killed node came back again");
  cph_tc_kill_node(c, m, false);
  cph_tc_settle(c, SHARDS, "the other node killed");
  turn_origins(c, n, s, turns_after, sizeof turns_after, &mt);
  seal_origins(c, n, s, seals_after, sizeof seals_after, &ms);
  assert_int_equal(mt, 0);
  if (ms != 1 || !strstr(seals_after, " new\n"))
    fail_msg("t05 created again lists %d seals on n%d after the move, not its one: %s", ms, n,
             seals_after);
}

/* The node the test before killed comes back (the bench's two nodes both up): the other. */
static int bring_back(bench *b) {
  cph_test_cluster *c = b->c;
  int up = c->up[0] ? 0 : 1, down = 1 - up;
  assert_false(c->up[down]);
  cph_tc_start_node(c, down, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "the killed node came back");
  return up;
}

/* The id of the node of session s's tree on node n with this content, or 0. */
static long long node_id_of(cph_test_cluster *c, int n, int s, const char *content) {
  char path[64];
  snprintf(path, sizeof path, "/v1/sessions/t%02d/context", s);
  json_t *j = get_json(c, n, path);
  long long id = 0;
  size_t i;
  json_t *node;
  json_array_foreach(json_object_get(j, "nodes"), i, node) {
    const char *t = json_string_value(json_object_get(node, "content"));
    if (t && strcmp(t, content) == 0)
      id = json_integer_value(json_object_get(node, "id"));
  }
  json_decref(j);
  return id;
}

/* Edits of a session's context tree that no completion follows move with it: each answers 200
 * only once the log holds the session's state after it (clusterflow.h 11.), as a seal's does.
 * On every session (the one the test before created again included) a node is inserted by key
 * and then updated through its key, and the note inserted in the first test is deleted; then
 * the owner of some of them is killed -9 right after the last 200. On the survivor each moved
 * session's tree holds the updated node once, not its first text, and not the deleted note.
 * Without the state put the survivor loads the state of the sessions' last completion: the
 * deleted note is back and the new node missing, and the test fails. */
static void test_cluster_state_an_edit_answered_200_moves_with_its_session(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int up = bring_back(b); /* the third test killed the other */
  bool had_note[SESSIONS];
  for (int s = 0; s < SESSIONS; s++) {
    char path[64], body[160], note[32];
    snprintf(path, sizeof path, "/v1/sessions/t%02d/context", s);
    for (int v = 1; v <= 2; v++) {
      snprintf(body, sizeof body,
               "{\"at\":\"d0, 1, 0\",\"key\":\"late\",\"content\":\"late note v%d of t%02d\"}", v,
               s);
      b->owner[s] = cph_tc_post_on_owner(c, up, path, body);
    }
    snprintf(note, sizeof note, "note of t%02d", s);
    long long id = node_id_of(c, b->owner[s], s, note);
    had_note[s] = id != 0; /* t05 was created again without it */
    if (id) {
      char del[96];
      snprintf(del, sizeof del, "/v1/sessions/t%02d/context/%lld", s, id);
      cph_test_response r = cph_test_api(c->port[b->owner[s]], "DELETE", del, NULL, NULL);
      if (r.status != 200)
        fail_msg("DELETE %s on n%d: %d %s", del, b->owner[s], r.status, r.body ? r.body : "");
      cph_test_response_free(&r);
    }
  }
  int victim = b->owner[0], survivor = 1 - victim;
  int moved = cph_tc_moved(b->owner, SESSIONS, victim);
  cph_tc_kill_node(c, victim, false); /* right after the last 200 */
  cph_tc_settle(c, SHARDS, "the owner of the edited sessions killed");
  for (int s = 0; s < SESSIONS; s++) {
    char v1[48], v2[48], note[32];
    snprintf(v1, sizeof v1, "late note v1 of t%02d", s);
    snprintf(v2, sizeof v2, "late note v2 of t%02d", s);
    snprintf(note, sizeof note, "note of t%02d", s);
    int n2 = tree_count(c, survivor, s, NULL, v2, NULL);
    int n1 = tree_count(c, survivor, s, NULL, v1, NULL);
    int nn = tree_count(c, survivor, s, NULL, note, NULL);
    if (n2 != 1 || n1 != 0 || nn != 0)
      fail_msg("t%02d (%s n%d) on n%d after the kill: \"%s\" %d times (want 1), \"%s\" %d "
               "(want 0), the deleted \"%s\" %d (want 0)%s",
               s, b->owner[s] == victim ? "moved from" : "kept on", b->owner[s], survivor, v2, n2,
               v1, n1, note, nn, had_note[s] ? "" : " (it had none)");
  }
  printf("%d sessions moved from n%d with their edits\n", moved, victim);
}

/* The status of the answer that comes on fd within ms milliseconds: 0 when none came, -1 when
 * what came is not an HTTP answer. */
static int status_within(int fd, int ms, char *buf, size_t size) {
  struct pollfd p = {fd, POLLIN, 0};
  buf[0] = '\0';
  if (poll(&p, 1, ms) <= 0)
    return 0;
  int status = -1;
  ssize_t got = recv(fd, buf, size - 1, 0);
  buf[got > 0 ? got : 0] = '\0';
  if (got > 12 && sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
    status = -1;
  return status;
}

/* The state letter of process pid (/proc/pid/stat: 'T' when stopped), '?' when unreadable. */
static char proc_state(pid_t pid) {
  char path[64], st = '?';
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *fp = fopen(path, "r");
  if (fp) {
    if (fscanf(fp, "%*d (%*[^)]) %c", &st) != 1)
      st = '?';
    fclose(fp);
  }
  return st;
}

/* A session answered 200 is known to the node that serves it next: a create (and a change or a
 * delete) answers only once the log holds the session's record (clusterflow.h 4.). A session
 * created right before the log stops answering is served by the other node after its owner's
 * kill -9; one created while the log does not answer (its NATS server stopped) gets no 200 —
 * its owner holds the answer — so its loss with the owner is no loss of anything answered.
 * Before, the create answered 200 at once and the record followed when it could: a kill -9 in
 * between lost an answered session. */
static void test_cluster_state_a_session_answered_200_is_known_after_its_owner_dies(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int up = bring_back(b); /* the test before killed the other */
  const char *body = "{\"id\":\"fresh\",\"class\":\"interactive\"}";
  int owner = cph_tc_post_on_owner(c, up, "/v1/sessions", body);
  /* The create must meet a log that does not answer. Should the NATS server be found running
   * when an answer comes (continued by something outside the test: it happened once in ~30
   * runs, state 'R' with the 200 in hand), the premise failed and not the daemon: the step is
   * run again with a new id. A 200 while the server is still stopped fails the test. */
  int held = -1, fd = -1;
  for (int attempt = 0; attempt < 3 && held < 0; attempt++) {
    assert_int_equal(kill(c->nats[0], SIGSTOP), 0);
    for (int waited = 0; proc_state(c->nats[0]) != 'T' && waited < 2000; waited += 10)
      cph_tc_sleep_ms(10);
    assert_int_equal(proc_state(c->nats[0]), 'T');
    char create[96];
    snprintf(create, sizeof create, "{\"id\":\"unlogged-%d\",\"class\":\"interactive\"}",
             attempt);
    bool again = false;
    for (int n = 0; n < NODES && held < 0 && !again; n++) {
      fd = cph_test_http_send_only(c->port[n], "POST", "/v1/sessions", create);
      assert_true(fd >= 0);
      char answer[1024];
      int status = status_within(fd, 2000, answer, sizeof answer);
      char nats_state = proc_state(c->nats[0]); /* still stopped when the answer came? */
      if (status == 0 && nats_state == 'T') {
        held = n; /* its owner, waiting for the log */
        continue;
      }
      close(fd);
      if (nats_state != 'T') {
        printf("attempt %d: nats-server found in state '%c' (not stopped) when n%d answered "
               "%d; again with another id\n",
               attempt + 1, nats_state, n, status);
        again = true;
      } else if (status != 421) {
        kill(c->nats[0], SIGCONT);
        fail_msg("creating a session on n%d while the log does not answer (nats-server "
                 "stopped): %d, not a held answer (or 421 on the other node); the answer:\n%s",
                 n, status, answer);
      }
    }
    if (again)
      kill(c->nats[0], SIGCONT); /* let it settle before stopping it again */
  }
  if (held < 0) {
    kill(c->nats[0], SIGCONT);
    fail_msg("neither node held the create while the log did not answer");
  }
  cph_tc_kill_node(c, owner, false);
  if (held != owner)
    cph_tc_kill_node(c, held, false);
  close(fd);
  assert_int_equal(kill(c->nats[0], SIGCONT), 0);
  if (held != owner) { /* both killed: one comes back to serve everything */
    cph_tc_start_node(c, owner, SHARDS, TTL_S, EXTRA);
  }
  cph_tc_settle(c, SHARDS, "the owner of the new sessions killed");
  json_t *j = NULL;
  int n = cph_tc_get_on_owner(c, c->up[0] ? 0 : 1, "/v1/sessions/fresh", &j);
  assert_string_equal(json_string_value(json_object_get(j, "id")), "fresh");
  json_decref(j);
  printf("\"fresh\" (answered 200 on n%d) served by n%d after the kill; the create held by n%d "
         "while the log was stopped got no answer\n",
         owner, n, held);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_state_a_dead_nodes_sessions_keep_their_history_tree_and_credits),
      cmocka_unit_test(test_cluster_state_moves_again_from_the_new_owner),
      cmocka_unit_test(test_cluster_state_records_beyond_the_state_move_as_items),
      cmocka_unit_test(test_cluster_state_an_edit_answered_200_moves_with_its_session),
      cmocka_unit_test(test_cluster_state_a_session_answered_200_is_known_after_its_owner_dies),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
