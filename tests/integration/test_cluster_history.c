/* Cluster mode: a moved session's channel history moves with its state (server/clusterflow.h
 * 11., core/handover.c) — a real etcd, NATS JetStream and two cephalond on 127.0.0.1.
 *
 * Every session listens on three channels: its direct channel, "solo-<id>" (only it subscribes)
 * and "shared" (every session subscribes, so the survivor gets its events for its own
 * sessions). Over ROUNDS rounds each session answers a user's message on each channel, one
 * turn per message. The node owning some sessions is killed -9 right after its last
 * completion answered 200. On the survivor a new message on each channel is leased for each
 * moved session, and the lease's messages must show, for that channel, each earlier user
 * message once, as seen history (a `user` message, not in the "MESSAGES WHILE YOU WERE AWAY"
 * block), before the reply that answered it, which shows once too. Without the history in the
 * state the survivor's direct and solo channels hold the replies alone: the test fails.
 * Last, on the survivor, two messages on the shared channel in one request, one turn each
 * (:max-batch 1): while the first turn runs, the second waits in each session's inbox, and the
 * first turn's context must not show it — a later turn's trigger, as it is on one node, though
 * the node's channel history holds another session's copy of it (core/context.c, log_copy);
 * the second turn shows it once, as its current message, and the first once, as history.
 * Between those, with both nodes up: each session's replies (clusterflow.h 14.) and the events
 * naming one session (15.) reach the other node's copy of the shared channel. */
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
#define SESSIONS 6
#define ROUNDS 3

enum { CH_DIRECT, CH_SOLO, CH_SHARED, N_CH };
/* 60 turns a minute by default: 9 rounds of 6 sessions would wait on the lane. One message a
 * turn: the last round's follow-up waits in the inbox while its question's turn runs. */
static const char EXTRA[] =
    ":scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}"
    " :sessions {:max-batch 1}";

static const char *const CH_NAME[N_CH] = {"direct", "solo", "shared"};

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int ch, round; /* what the leases being answered are about */
  bool check;    /* check each lease's messages (after the takeover) */
  bool asked[SESSIONS]; /* the pair round: the session's question turn is done */
} bench;

static const char PAIR_Q[] = "pair question: which cluster?";
static const char PAIR_F[] = "pair follow-up: no, the staging cluster";

/* The user message of round `round` on channel ch for session s (the shared channel's is the
 * same for every session). */
static void question(char *out, size_t len, int ch, int round, int s) {
  if (ch == CH_SHARED)
    snprintf(out, len, "shared question %d", round);
  else
    snprintf(out, len, "%s question %d for t%02d", CH_NAME[ch], round, s);
}

static void reply_of(char *out, size_t len, int ch, int round, int s) {
  snprintf(out, len, "%s reply %d of t%02d", CH_NAME[ch], round, s);
}

/* Posts round's user message on channel ch for every session, through node via. */
static void post_round(cph_test_cluster *c, int via, int ch, int round) {
  char body[8192], q[96];
  size_t len = (size_t)snprintf(body, sizeof body, "{\"events\":[");
  for (int s = 0; s < SESSIONS; s++) {
    question(q, sizeof q, ch, round, s);
    if (ch == CH_DIRECT)
      len += (size_t)snprintf(body + len, sizeof body - len,
                              "%s{\"session\":\"t%02d\",\"sender\":\"ann\",\"body\":\"%s\"}",
                              s ? "," : "", s, q);
    else if (ch == CH_SOLO)
      len += (size_t)snprintf(body + len, sizeof body - len,
                              "%s{\"channel\":\"solo-t%02d\",\"sender\":\"ann\",\"body\":\"%s\"}",
                              s ? "," : "", s, q);
    else if (s == 0)
      len += (size_t)snprintf(body + len, sizeof body - len,
                              "{\"channel\":\"shared\",\"sender\":\"bob\",\"body\":\"%s\"}", q);
  }
  snprintf(body + len, sizeof body - len, "]}");
  cph_test_response r = cph_test_api(c->port[via], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting %s round %d: %d %s", CH_NAME[ch], round, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

/* Where in messages the first message holding text is (its role into *role), or -1; *count:
 * how many messages hold it. */
static int find_message(json_t *messages, const char *text, const char **role, int *count) {
  int at = -1;
  *count = 0;
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    const char *content = json_string_value(json_object_get(m, "content"));
    if (content && strstr(content, text)) {
      if (at < 0) {
        at = (int)i;
        *role = json_string_value(json_object_get(m, "role"));
      }
      (*count)++;
    }
  }
  return at;
}

/* The lease's messages show every earlier round of the channel once: the user's messages as
 * seen history (role user) in order, the session's replies (assistant) in order, each reply
 * after the message it answered. (Where the new owner held the users' messages already — the
 * channel's shard was its own, or its sessions share the channel — the moved replies follow
 * them all: a channel's history only grows at its end.) */
static void check_messages(bench *b, int n, json_t *turn, int s) {
  json_t *messages = json_object_get(turn, "messages");
  int last_q = -1, last_a = -1;
  for (int round = 0; round < b->round; round++) {
    char q[96], a[96];
    question(q, sizeof q, b->ch, round, s);
    reply_of(a, sizeof a, b->ch, round, s);
    const char *qrole = NULL, *arole = NULL;
    int qn, an;
    int qat = find_message(messages, q, &qrole, &qn);
    int aat = find_message(messages, a, &arole, &an);
    const char *bad = qn != 1                     ? "the user's message is not there once"
                      : an != 1                   ? "the reply is not there once"
                      : strcmp(qrole, "user") != 0 ? "the user's message is not seen history"
                      : strcmp(arole, "assistant") != 0 ? "the reply is not the assistant's"
                      : !(last_q < qat && last_a < aat && qat < aat) ? "out of order"
                                                                     : NULL;
    if (bad) {
      char *dump = json_dumps(messages, JSON_COMPACT);
      fail_msg("t%02d's %s lease on n%d, round %d (\"%s\" x%d, \"%s\" x%d): %s: %s", s,
               CH_NAME[b->ch], n, round, q, qn, a, an, bad, dump ? dump : "?");
    }
    last_q = qat;
    last_a = aat;
    /* on the shared channel every session's reply (the moved ones' came in several states)
     * shows once at most */
    for (int o = 0; b->ch == CH_SHARED && o < SESSIONS; o++) {
      reply_of(a, sizeof a, b->ch, round, o);
      if (find_message(messages, a, &arole, &an) >= 0 && an != 1) {
        char *dump = json_dumps(messages, JSON_COMPACT);
        fail_msg("t%02d's shared lease on n%d shows \"%s\" %d times: %s", s, n, a, an,
                 dump ? dump : "?");
      }
    }
  }
}

/* Completes turn (of session s, on node n), which stages this round's message on b->ch, with
 * the session's reply: done. */
static bool answer(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  char q[96], a[96];
  question(q, sizeof q, b->ch, b->round, s);
  reply_of(a, sizeof a, b->ch, b->round, s);
  json_t *staged = json_object_get(turn, "staged");
  assert_int_equal(json_array_size(staged), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(staged, 0), "body")), q);
  /* The message this turn answers is its current message, once: another copy of the same
   * event in the node's channel history (the channel owner's, or another session's forwarded
   * copy, which the log delivers beside this session's) is not also shown as history. */
  const char *role = NULL;
  int count;
  find_message(json_object_get(turn, "messages"), q, &role, &count);
  if (count != 1) {
    char *dump = json_dumps(json_object_get(turn, "messages"), JSON_COMPACT);
    fail_msg("t%02d's %s lease on n%d shows its current message \"%s\" %d times: %s", s,
             CH_NAME[b->ch], n, q, count, dump ? dump : "?");
  }
  if (b->check)
    check_messages(b, n, turn, s);
  cph_tc_complete(b->c, n, turn, a);
  return true;
}

/* The pair round's turns of session s: the question first (the follow-up waiting unseen), then
 * the follow-up (the question as history, once). Done after the second. */
static bool answer_pair(void *ctx, int n, json_t *turn, int s) {
  bench *b = ctx;
  bool second = b->asked[s];
  const char *current = second ? PAIR_F : PAIR_Q, *other = second ? PAIR_Q : PAIR_F;
  json_t *staged = json_object_get(turn, "staged"), *messages = json_object_get(turn, "messages");
  assert_int_equal(json_array_size(staged), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(staged, 0), "body")),
                      current);
  const char *role = NULL;
  int count, other_count;
  find_message(messages, current, &role, &count);
  find_message(messages, other, &role, &other_count);
  if (count != 1 || other_count != (second ? 1 : 0)) {
    char *dump = json_dumps(messages, JSON_COMPACT);
    fail_msg("t%02d's %s turn on n%d shows \"%s\" %d times (1 wanted) and \"%s\" %d times "
             "(%d wanted): %s",
             s, second ? "follow-up" : "question", n, current, count, other, other_count,
             second ? 1 : 0, dump ? dump : "?");
  }
  char reply[64];
  snprintf(reply, sizeof reply, "pair reply %d of t%02d", second, s);
  cph_tc_complete(b->c, n, turn, reply);
  b->asked[s] = true;
  return second;
}

/* One round on channel ch: its messages posted through node `via`, then every session answers
 * it on its owner. */
static void run_round(bench *b, int via, int ch, int round) {
  char what[48];
  snprintf(what, sizeof what, "%s round %d", CH_NAME[ch], round);
  b->ch = ch;
  b->round = round;
  int64_t t0 = cph_test_now_ms();
  post_round(b->c, via, ch, round);
  for (int n = 0; n < NODES; n++)
    if (b->c->up[n])
      cph_tc_lease_each(b->c, n, b->owner, SESSIONS, answer, b, what);
  if (getenv("CPH_TEST_DEBUG"))
    printf("%s: %lld ms\n", what, (long long)(cph_test_now_ms() - t0));
}

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  cph_test_cluster *c = cph_tc_new();
  b->c = c;
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  for (int i = 0; i < NODES; i++)
    cph_tc_start_node(c, i, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "start");
  for (int s = 0; s < SESSIONS; s++) {
    char body[192];
    snprintf(body, sizeof body,
             "{\"id\":\"t%02d\",\"class\":\"interactive\",\"subscribe\":[\"solo-t%02d\","
             "\"shared\"]}",
             s, s);
    b->owner[s] = cph_tc_post_on_owner(c, s % NODES, "/v1/sessions", body);
  }
  cph_tc_wait_known(c, SESSIONS);
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

static void test_cluster_history_a_moved_sessions_channels_show_what_it_answered(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int victim = 1, survivor = 0, moved = cph_tc_moved(b->owner, SESSIONS, victim);
  for (int round = 0; round < ROUNDS; round++)
    for (int ch = 0; ch < N_CH; ch++)
      run_round(b, (round + ch) % NODES, ch, round);
  /* kill -9 right after the last completions answered 200 */
  int64_t t0 = cph_test_now_ms();
  cph_tc_kill_node(c, victim, false);
  cph_tc_settle(c, SHARDS, "after the kill");
  printf("n%d killed -9: %d sessions moved to n%d, served %lld ms later\n", victim, moved,
         survivor, (long long)(cph_test_now_ms() - t0));
  for (int s = 0; s < SESSIONS; s++)
    b->owner[s] = survivor;
  b->check = true;
  for (int ch = 0; ch < N_CH; ch++)
    run_round(b, survivor, ch, ROUNDS);
  char body[512];
  snprintf(body, sizeof body,
           "{\"events\":[{\"channel\":\"shared\",\"sender\":\"bob\",\"body\":\"%s\"},"
           "{\"channel\":\"shared\",\"sender\":\"bob\",\"body\":\"%s\"}]}",
           PAIR_Q, PAIR_F);
  cph_test_response r = cph_test_api(c->port[survivor], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting the pair: %d %s", r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  cph_tc_lease_each(c, survivor, b->owner, SESSIONS, answer_pair, b, "the pair round");
}

#define LONG_TURNS 120 /* its history: 240 entries, more than a state carried (64) */
/* Each message's words after its number: long enough that a turn's window (8,192 tokens) cuts
 * the history, so the turn also lists memories of the older messages. */
#define LONG_WORDS                                                                             \
  "and then the rest of a long message, long enough that the window cuts the conversation "    \
  "well before its start"

/* Leases on node n until it gets session "long"'s turn (its message staged); its answer. */
static json_t *lease_long(cph_test_cluster *c, int n) {
  for (int tries = 0; tries < 50; tries++) {
    cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL,
                                       "{\"worker\":\"w\",\"wait_ms\":2000}");
    json_t *j = r.status == 200 ? cph_test_json(&r) : NULL;
    cph_test_response_free(&r);
    const char *sid = json_string_value(json_object_get(json_object_get(j, "turn"), "session"));
    if (sid && strcmp(sid, "long") == 0)
      return j;
    json_decref(j);
  }
  fail_msg("no turn of session \"long\" leased on n%d", n);
  return NULL;
}

/* What a lease shows the model: its messages, role and content, one per line. */
static char *conversation(json_t *lease, int *count) {
  size_t cap = 1 << 16, len = 0, i;
  char *out = malloc(cap);
  assert_non_null(out);
  out[0] = '\0';
  *count = 0;
  json_t *m;
  json_array_foreach(json_object_get(json_object_get(lease, "turn"), "messages"), i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const char *content = json_string_value(json_object_get(m, "content"));
    if (!role || !content)
      continue;
    size_t need = strlen(role) + strlen(content) + 4;
    if (len + need >= cap) {
      cap = 2 * (len + need);
      out = realloc(out, cap);
      assert_non_null(out);
    }
    len += (size_t)snprintf(out + len, cap - len, "%s: %s\n", role, content);
    (*count)++;
  }
  return out;
}

/* A moved session's next turn shows the model what its turn on the node that died would
 * have: the state carries as much of each channel's history as a turn's history section reads
 * (core/handover.c), not a fixed 64 entries. Session "long" answers LONG_TURNS messages on its
 * direct channel, more than its window shows (the history is cut, memories of the older
 * messages listed); then a probe message is leased on its owner and the owner killed -9; the
 * survivor leases the probe again (its input comes again from the log), and its messages must
 * be those of the first lease, every role and text, in the same order. With the newest 64
 * entries moved the survivor's turn showed 65 user and assistant messages of 241: the test
 * failed so. */
static void test_cluster_history_a_moved_sessions_next_turn_shows_the_same_conversation(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  for (int n = 0; n < NODES; n++)
    if (!c->up[n])
      cph_tc_start_node(c, n, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "every node up");
  int owner =
      cph_tc_post_on_owner(c, 0, "/v1/sessions", "{\"id\":\"long\",\"class\":\"interactive\"}");
  uint32_t x = 12345;
  for (int k = 0; k < LONG_TURNS; k++) {
    char body[512];
    x = x * 1103515245u + 12345u;
    uint32_t y = x * 2654435761u;
    snprintf(body, sizeof body,
             "{\"events\":[{\"session\":\"long\",\"sender\":\"ann\",\"body\":\"long question "
             "%d, %08x %08x " LONG_WORDS "\"}]}",
             k, x, y);
    assert_int_equal(cph_tc_post_on_owner(c, owner, "/v1/events", body), owner);
    json_t *j = lease_long(c, owner);
    json_t *turn = json_object_get(j, "turn");
    char reply[64];
    snprintf(reply, sizeof reply, "long reply %d, %08x", k, y ^ x);
    cph_tc_complete(c, owner, turn, reply);
    json_decref(j);
  }
  cph_tc_post_on_owner(c, owner, "/v1/events",
                       "{\"events\":[{\"session\":\"long\",\"sender\":\"ann\",\"body\":\"the "
                       "probe\"}]}");
  json_t *before = lease_long(c, owner);
  json_t *tokens = json_object_get(json_object_get(before, "turn"), "tokens");
  json_int_t cut = json_integer_value(json_object_get(tokens, "history_cut"));
  json_int_t memory = json_integer_value(json_object_get(tokens, "recent_memory"));
  int n_before, n_after;
  char *was = conversation(before, &n_before);
  json_decref(before);
  cph_tc_kill_node(c, owner, false);
  cph_tc_settle(c, SHARDS, "the owner of \"long\" killed");
  int survivor = 1 - owner;
  json_t *after = lease_long(c, survivor);
  char *is = conversation(after, &n_after);
  json_decref(after);
  printf("\"long\": its turn showed %d messages on n%d (%lld history entries cut, %lld tokens "
         "of memories), %d on n%d after the kill\n",
         n_before, owner, (long long)cut, (long long)memory, n_after, survivor);
  if (strcmp(was, is) != 0)
    fail_msg("\"long\"'s turn on n%d after the kill shows %d messages, not the %d it showed on "
             "n%d:\n--- before\n%s--- after\n%s",
             survivor, n_after, n_before, owner, was, is);
  assert_true(n_before > 2 * 64); /* more than the 64 entries a state carried */
  assert_true(cut > 0 && memory > 0); /* the window cut the history; memories stood in */
  free(was);
  free(is);
}

/* The sum over the nodes up of GET /v1/cluster log.history_copies.<name> (asserted present). */
static long long copies_sum(cph_test_cluster *c, const char *name) {
  long long sum = 0;
  for (int n = 0; n < NODES; n++) {
    if (!c->up[n])
      continue;
    sum += cph_tc_log_counter(c, n, "history_copies", name);
  }
  return sum;
}

/* Every node up, shards settled; owner[s] = the node serving t<s>, sessions on both nodes. */
static void all_up(cph_test_cluster *c, int owner[SESSIONS]) {
  for (int n = 0; n < NODES; n++)
    if (!c->up[n])
      cph_tc_start_node(c, n, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "every node up");
  int on[NODES] = {0};
  for (int s = 0; s < SESSIONS; s++) {
    char path[64];
    json_t *j = NULL;
    snprintf(path, sizeof path, "/v1/sessions/t%02d", s);
    owner[s] = cph_tc_get_on_owner(c, 0, path, &j);
    json_decref(j);
    on[owner[s]]++;
  }
  assert_true(on[0] > 0 && on[1] > 0); /* sessions on both nodes */
}

/* Waits (up to 10 s) until the copies the nodes' logs took since sent0 / applied0 were applied
 * where they went; returns how many were sent since sent0. */
static long long copies_settle(cph_test_cluster *c, long long sent0, long long applied0,
                               const char *what) {
  long long sent = 0, applied = 0;
  for (int tries = 0; tries < 100; tries++) {
    sent = copies_sum(c, "sent");
    applied = copies_sum(c, "stored") + copies_sum(c, "held");
    if (applied - applied0 >= sent - sent0)
      break;
    cph_tc_sleep_ms(100);
  }
  printf("%s: %lld copies sent so far, %lld applied\n", what, sent - sent0, applied - applied0);
  assert_true(applied - applied0 >= sent - sent0);
  return sent - sent0;
}

/* Fails the test unless the lease messages of t<s> on node n show text exactly once (what: where
 * it came from, for the message); returns the role it shows with. */
static const char *expect_once(json_t *messages, const char *text, int s, int n,
                               const char *what) {
  const char *role = NULL;
  int count;
  find_message(messages, text, &role, &count);
  if (count != 1) {
    char *dump = json_dumps(messages, JSON_COMPACT);
    fail_msg("t%02d's lease on n%d shows \"%s\" (%s) %d times, not once: %s", s, n, text, what,
             count, dump ? dump : "?");
  }
  return role;
}

typedef struct team {
  cph_test_cluster *c;
  const int *owner; /* the node serving each session */
  int round;
} team;

/* Completes a turn of the team round with the session's reply; checks, from the second round
 * on, that the lease shows every session's reply of the round before once. */
static bool answer_team(void *ctx, int n, json_t *turn, int s) {
  team *t = ctx;
  json_t *messages = json_object_get(turn, "messages");
  for (int o = 0; t->round > 0 && o < SESSIONS; o++) {
    char a[96];
    snprintf(a, sizeof a, "team reply %d of t%02d", t->round - 1, o);
    char what[48];
    snprintf(what, sizeof what, "a reply written on n%d", t->owner[o]);
    const char *role = expect_once(messages, a, s, n, what);
    if (o == s && strcmp(role, "assistant") != 0)
      fail_msg("t%02d's own reply \"%s\" is not the assistant's on n%d", s, a, n);
  }
  char reply[64];
  snprintf(reply, sizeof reply, "team reply %d of t%02d", t->round, s);
  cph_tc_complete(t->c, n, turn, reply);
  return true;
}

/* Agents on different nodes in one channel see each other's replies (server/clusterflow.h 14.):
 * every session of "shared" answers a message there on its owner; the next message's lease of
 * each shows all six replies once — the three written on the other node included, which reach
 * this node's copy of the channel only as copies through the log. Without the copies a lease
 * showed the replies of its own node's sessions alone: the test failed so. */
static void test_cluster_history_agents_on_other_nodes_see_each_others_replies(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int owner[SESSIONS];
  all_up(c, owner);
  team t = {c, owner, 0};
  /* counted from here: the nodes' counters start at their own start */
  long long sent0 = copies_sum(c, "sent"), sent = 0,
            applied0 = copies_sum(c, "stored") + copies_sum(c, "held");
  for (t.round = 0; t.round < 2; t.round++) {
    char body[256], what[32];
    snprintf(body, sizeof body,
             "{\"events\":[{\"channel\":\"shared\",\"sender\":\"bob\",\"body\":\"team "
             "question %d\"}]}",
             t.round);
    cph_test_response r = cph_test_api(c->port[t.round % NODES], "POST", "/v1/events", NULL, body);
    if (r.status != 200)
      fail_msg("posting team question %d: %d %s", t.round, r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
    snprintf(what, sizeof what, "team round %d", t.round);
    for (int n = 0; n < NODES; n++)
      cph_tc_lease_each(c, n, owner, SESSIONS, answer_team, &t, what);
    /* the copies the log took (each completion's before its 200) applied where they went */
    sent = copies_settle(c, sent0, applied0, what);
  }
  assert_true(sent > 0);
  assert_int_equal(copies_sum(c, "failures"), 0);
}

typedef struct asides {
  cph_test_cluster *c;
  int turns[SESSIONS]; /* answered so far, per session */
} asides;

/* Completes a turn of the asides with a reply: each session has two, its own aside and the one
 * that mentions it. */
static bool answer_aside(void *ctx, int n, json_t *turn, int s) {
  asides *a = ctx;
  char reply[64];
  snprintf(reply, sizeof reply, "aside reply %d of t%02d", a->turns[s], s);
  cph_tc_complete(a->c, n, turn, reply);
  return ++a->turns[s] == 2;
}

/* Checks that the lease of the team question shows every session's aside once. */
static bool answer_after_asides(void *ctx, int n, json_t *turn, int s) {
  team *t = ctx;
  json_t *messages = json_object_get(turn, "messages");
  for (int o = 0; o < SESSIONS; o++) {
    char a[96];
    snprintf(a, sizeof a, "aside for t%02d: the build on the staging cluster is red", o);
    char what[48];
    snprintf(what, sizeof what, "an event naming t%02d, applied on n%d", o, t->owner[o]);
    expect_once(messages, a, s, n, what);
  }
  cph_tc_complete(t->c, n, turn, "noted");
  return true;
}

/* An event in a shared channel that names one session is applied on that session's node only
 * (server/clusterflow.h 1.), yet on one node it is in the channel's history that every
 * subscriber's context shows; its copies (15.) bring it to the other nodes' copies of the
 * channel. Six such asides, one per session and mentioning the next one (whose node gets it as
 * a forward too: the copy must not make it a second entry there), posted in one request; each
 * session answers its two; then a question to the whole channel: each lease shows all six
 * asides once. */
static void test_cluster_history_an_event_naming_one_session_is_in_everyones_history(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int owner[SESSIONS];
  all_up(c, owner);
  long long sent0 = copies_sum(c, "sent"),
            applied0 = copies_sum(c, "stored") + copies_sum(c, "held");
  char body[4096];
  size_t off = (size_t)snprintf(body, sizeof body, "{\"events\":[");
  for (int s = 0; s < SESSIONS; s++)
    off += (size_t)snprintf(body + off, sizeof body - off,
                            "%s{\"channel\":\"shared\",\"session\":\"t%02d\",\"mentions\":"
                            "[\"t%02d\"],\"sender\":\"bob\",\"body\":\"aside for t%02d: the "
                            "build on the staging cluster is red\"}",
                            s ? "," : "", s, (s + 1) % SESSIONS, s);
  snprintf(body + off, sizeof body - off, "]}");
  cph_test_response r = cph_test_api(c->port[1], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting the asides: %d %s", r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  asides as = {c, {0}};
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, owner, SESSIONS, answer_aside, &as, "the asides");
  assert_true(copies_settle(c, sent0, applied0, "the asides") > 0);
  r = cph_test_api(c->port[0], "POST", "/v1/events", NULL,
                   "{\"events\":[{\"channel\":\"shared\",\"sender\":\"bob\",\"body\":"
                   "\"who saw the asides?\"}]}");
  if (r.status != 200)
    fail_msg("posting the question: %d %s", r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  team t = {c, owner, 0};
  for (int n = 0; n < NODES; n++)
    cph_tc_lease_each(c, n, owner, SESSIONS, answer_after_asides, &t, "after the asides");
  assert_int_equal(copies_sum(c, "failures"), 0);
}

/* The members' case: sessions t06.. on top of the six. */
#define OPS_SESSIONS 12

typedef struct ops {
  cph_test_cluster *c;
  int turns; /* t06's, answered so far */
  int member; /* the member on the other node */
} ops;

static bool answer_ops_note(void *ctx, int n, json_t *turn, int s) {
  ops *o = ctx;
  (void)s;
  cph_tc_complete(o->c, n, turn, "noted the ops note");
  return ++o->turns == 3;
}

/* The member's turn (it was mentioned): its lease shows the channel's earlier notes once each. */
static bool answer_member(void *ctx, int n, json_t *turn, int s) {
  ops *o = ctx;
  json_t *messages = json_object_get(turn, "messages");
  for (int k = 1; k <= 3; k++) {
    char note[64];
    snprintf(note, sizeof note, "ops note %d: the deploy window moved", k);
    expect_once(messages, note, s, n, "an event of a channel it is a member of, on the other node");
  }
  cph_tc_complete(o->c, n, turn, "seen");
  return true;
}

/* A member of a channel reads its history too (DESIGN §2: it sees the channel, and is
 * triggered only when mentioned), but a channel's events are forwarded only to its subscribers
 * and to whom they mention: a member on a node with no subscriber of the channel saw none of
 * them. The channel's owner now copies them there (clusterflow.h 15.). t06 subscribes to "ops",
 * a member of it lives on the other node; three notes to "ops", then one mentioning the member:
 * its lease shows the three notes once each (failed before: 0 times). */
static void test_cluster_history_a_member_on_another_node_sees_the_channel(void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int six[SESSIONS];
  all_up(c, six);
  int owner[OPS_SESSIONS];
  for (int s = 0; s < OPS_SESSIONS; s++)
    owner[s] = -1;
  owner[6] = cph_tc_post_on_owner(c, 0, "/v1/sessions",
                                  "{\"id\":\"t06\",\"class\":\"interactive\",\"subscribe\":"
                                  "[\"ops\"]}");
  ops o = {c, 0, -1};
  for (int s = 7; s < OPS_SESSIONS; s++) {
    char body[128];
    snprintf(body, sizeof body,
             "{\"id\":\"t%02d\",\"class\":\"interactive\",\"member\":[\"ops\"]}", s);
    int at = cph_tc_post_on_owner(c, s % NODES, "/v1/sessions", body);
    if (at != owner[6] && o.member < 0) {
      o.member = s;
      owner[s] = at;
    }
  }
  if (o.member < 0)
    fail_msg("none of t07..t11 lives on the node t06 does not (n%d)", 1 - owner[6]);
  cph_tc_wait_known(c, SESSIONS + 1 + (OPS_SESSIONS - 7));
  long long sent0 = copies_sum(c, "sent"),
            applied0 = copies_sum(c, "stored") + copies_sum(c, "held");
  for (int k = 1; k <= 3; k++) {
    char body[160];
    snprintf(body, sizeof body,
             "{\"events\":[{\"channel\":\"ops\",\"sender\":\"dana\",\"body\":\"ops note "
             "%d: the deploy window moved\"}]}",
             k);
    cph_test_response r = cph_test_api(c->port[k % NODES], "POST", "/v1/events", NULL, body);
    if (r.status != 200)
      fail_msg("posting ops note %d: %d %s", k, r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
  }
  cph_tc_lease_each(c, owner[6], owner, OPS_SESSIONS, answer_ops_note, &o, "t06's ops notes");
  copies_settle(c, sent0, applied0, "the ops notes"); /* the notes' copies applied */
  char body[192];
  snprintf(body, sizeof body,
           "{\"events\":[{\"channel\":\"ops\",\"sender\":\"dana\",\"mentions\":"
           "[\"t%02d\"],\"body\":\"t%02d, did you see the notes?\"}]}",
           o.member, o.member);
  cph_test_response r = cph_test_api(c->port[0], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting the mention: %d %s", r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  int only[OPS_SESSIONS];
  for (int s = 0; s < OPS_SESSIONS; s++)
    only[s] = s == o.member ? owner[s] : -1;
  cph_tc_lease_each(c, owner[o.member], only, OPS_SESSIONS, answer_member, &o, "the member's turn");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_history_a_moved_sessions_channels_show_what_it_answered),
      cmocka_unit_test(test_cluster_history_agents_on_other_nodes_see_each_others_replies),
      cmocka_unit_test(test_cluster_history_an_event_naming_one_session_is_in_everyones_history),
      cmocka_unit_test(test_cluster_history_a_member_on_another_node_sees_the_channel),
      cmocka_unit_test(
          test_cluster_history_a_moved_sessions_next_turn_shows_the_same_conversation),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
