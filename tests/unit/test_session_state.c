/* A session's state for the cluster log (include/cephalon/cephalon.h: u.turn.state and
 * CPH_OP_SESSION_STATE; server/clusterflow.h 11.): with report_consumed on, a completion exports
 * the session's tree, episode, credits, recent replies and memories; another engine's session
 * that imports it shows the same tree and episode, the replies in its channel's history once
 * (an import repeated adds nothing), the memories once; a malformed blob is refused and changes
 * nothing. With reply origins on (cluster mode) the state carries the session's replies stream
 * and the importing engine adds each origin it lacks to its own stream, once, and (state
 * version 3) the session's ended turn records, each origin once, as history no lease reaches,
 * and (version 4) its newest seals, each origin once under a new seal id, a seal's own answer
 * carrying the state too, and (version 5) its channels' newest history, the users' messages
 * with its replies, each once and as seen history there, and (version 6) its newest kept turn
 * contexts, under the ids their turn records got there, each once; versions 2 to 5 still load,
 * and a malformed turn record, seal, history entry or kept context is refused saying which.
 * Off, nothing is exported, and replies, turns and seals have no origin. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/buf.h"
#include "store/records.h"
#include "store/keys.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"

#define TURNS 3

/* Ingests ev on f and leases the next turn into *lease (clear its results). */
static void post_and_lease(cph_fixture *f, cph_event_in *ev, cph_op *lease) {
  cph_op in;
  cph_fixture_ingest(f, ev, 1, &in);
  cph_op_clear_results(&in);
  cph_fixture_lease(f, "w", lease);
}

/* One question to session s, leased and completed with a reply and a memory; the completion op
 * is left to the caller (to read and clear). */
static void turn(cph_fixture *f, const char *s, int i, cph_op *done) {
  char body[64], reply[64], memory[64];
  snprintf(body, sizeof body, "question %d", i);
  snprintf(reply, sizeof reply, "reply %d of %s", i, s);
  snprintf(memory, sizeof memory, "memory %d of %s", i, s);
  cph_event_in ev = {0};
  ev.session = (char *)s;
  ev.sender = "ann";
  ev.body = body;
  cph_op lease;
  post_and_lease(f, &ev, &lease);
  memset(done, 0, sizeof *done);
  done->kind = CPH_OP_COMPLETE;
  done->u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(done->u.turn.lease, lease.u.lease.turn.lease, sizeof done->u.turn.lease);
  done->u.turn.reply_body = strdup(reply);
  cph_memory_in m = {0};
  m.text = memory;
  done->u.turn.memories = &m;
  done->u.turn.n_memories = 1;
  done->u.turn.tokens = 100 + (uint64_t)i;
  done->u.turn.tool_calls = (uint64_t)i;
  assert_int_equal(cph_fixture_run(f, done), CPH_OK);
  done->u.turn.memories = NULL;
  done->u.turn.n_memories = 0;
  free(done->u.turn.reply_body);
  done->u.turn.reply_body = NULL;
  cph_op_clear_results(&lease);
}

/* How many nodes of session s's tree have this role and content; *episode its episode. */
static int tree_count(cph_fixture *f, const char *s, const char *role, const char *content,
                      uint64_t *episode) {
  cph_context_node_info *nodes = NULL;
  size_t n = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_context(f->e, s, NULL, &nodes, &n, episode, &err), CPH_OK);
  int count = 0;
  for (size_t i = 0; i < n; i++)
    count += nodes[i].role && strcmp(nodes[i].role, role) == 0 && nodes[i].content &&
             strcmp(nodes[i].content, content) == 0;
  cph_context_nodes_free(nodes, n);
  return count;
}

/* How many memories of s (a lexical search) have this text. */
static int memory_count(cph_fixture *f, const char *s, const char *text) {
  cph_op op;
  cph_fixture_search(f, (char *)s, "memory", 100, &op);
  int count = 0;
  for (size_t i = 0; i < op.u.search.n_hits; i++)
    count += strcmp(op.u.search.hits[i].text, text) == 0;
  cph_op_clear_results(&op);
  return count;
}

/* The op's answer to importing data into s (its message into msg). */
static int import_msg(cph_fixture *f, const char *s, const uint8_t *data, size_t len, char *msg,
                      size_t cap) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_STATE;
  op.u.state.session = (char *)s;
  op.u.state.data = data;
  op.u.state.len = len;
  int rc = cph_fixture_run(f, &op);
  snprintf(msg, cap, "%s", op.err.msg);
  cph_op_clear_results(&op);
  return rc;
}

static int import(cph_fixture *f, const char *s, const uint8_t *data, size_t len) {
  char msg[512];
  return import_msg(f, s, data, len, msg, sizeof msg);
}

/* Completes the turn *lease leased on f, answering reply (borrowed), asserting CPH_OK; the op
 * is left in *done for the caller to read and clear. */
static void complete_leased(cph_fixture *f, const cph_op *lease, const char *reply,
                            cph_op *done) {
  *done = (cph_op){0};
  done->kind = CPH_OP_COMPLETE;
  done->u.turn.turn_id = lease->u.lease.turn.id;
  memcpy(done->u.turn.lease, lease->u.lease.turn.lease, sizeof done->u.turn.lease);
  done->u.turn.reply_body = (char *)reply;
  assert_int_equal(cph_fixture_run(f, done), CPH_OK);
  done->u.turn.reply_body = NULL;
}

/* Asks session "a" body and leases its turn into *lease (clear its results). */
static void next_lease(cph_fixture *f, const char *body, cph_op *lease) {
  cph_event_in ev = {0};
  ev.session = "a";
  ev.sender = "ann";
  ev.body = (char *)body;
  post_and_lease(f, &ev, lease);
}

/* The replies of the next lease's messages that are "reply <i> of a", each counted. */
static void lease_shows_replies(cph_fixture *f, int times[TURNS]) {
  cph_op lease;
  next_lease(f, "one more question", &lease);
  const cph_turn_info *t = &lease.u.lease.turn;
  for (int i = 0; i < TURNS; i++) {
    char reply[64];
    snprintf(reply, sizeof reply, "reply %d of a", i);
    times[i] = 0;
    for (size_t k = 0; k < t->n_messages; k++)
      times[i] += t->messages[k].content && strstr(t->messages[k].content, reply) != NULL;
  }
  cph_op_clear_results(&lease);
}

/* The next lease's messages show each question i < TURNS once, as seen history (a `user`
 * message, not in the away block), the questions in order, each before its reply. */
static void lease_shows_questions(cph_fixture *f) {
  cph_op lease;
  next_lease(f, "a last question", &lease);
  const cph_turn_info *t = &lease.u.lease.turn;
  size_t last = 0;
  for (int i = 0; i < TURNS; i++) {
    char q[64], a[64];
    snprintf(q, sizeof q, "question %d", i);
    snprintf(a, sizeof a, "reply %d of a", i);
    int times = 0;
    size_t at = 0, reply_at = 0;
    for (size_t k = 0; k < t->n_messages; k++) {
      const char *c = t->messages[k].content;
      if (c && strstr(c, q)) {
        times++;
        at = k;
        assert_string_equal(t->messages[k].role, "user");
      }
      if (c && strstr(c, a))
        reply_at = k;
    }
    assert_int_equal(times, 1);
    assert_true(at < reply_at && (i == 0 || at > last));
    last = at;
  }
  cph_op_clear_results(&lease);
}

/* Where the channel history part (state version 5) of session "a" is in blob[0..len), when all
 * its entries are on the direct channel: *at, *n its bytes, *count its entries. Found by its
 * first entry (a flag byte, then the channel "direct:a"); the stream part before it is empty
 * (no reply origins in these fixtures). */
static void history_part(const uint8_t *blob, size_t len, size_t *at, size_t *n,
                         uint32_t *count) {
  static const uint8_t first[] = {0, 0, 0, 8, 'd', 'i', 'r', 'e', 'c', 't', ':', 'a'};
  size_t p = 0;
  while (p + sizeof first <= len && memcmp(blob + p, first, sizeof first) != 0)
    p++;
  assert_true(p >= 5 && p + sizeof first <= len);
  *at = p - 5;
  *count = cph_be32_get(blob + *at);
  p = *at + 4;
  for (uint32_t i = 0; i < *count; i++) {
    p++; /* the flag */
    for (int k = 0; k < 4; k++) { /* channel, sender, kind, (time) body */
      if (k == 3)
        p += 8;
      assert_true(p + 4 <= len);
      p += 4 + cph_be32_get(blob + p);
    }
  }
  assert_true(p <= len);
  *n = p - *at;
}

/* blob[0..*len) (a version-5 state of session "a") as a version-4 node wrote it: its channel
 * history part replaced by an empty channel replies part. Malloc'd; *len updated. */
static uint8_t *as_version_4(const uint8_t *blob, size_t *len) {
  size_t at, n;
  uint32_t count;
  history_part(blob, *len, &at, &n, &count);
  uint8_t *out = malloc(*len - n + 4);
  assert_non_null(out);
  memcpy(out, blob, at);
  memset(out + at, 0, 4);
  memcpy(out + at + 4, blob + at + n, *len - at - n);
  *len = *len - n + 4;
  cph_be32_put(out + 4, 4);
  return out;
}

/* A string of a state at blob[*p] (be32 length + bytes): *p moved past it. */
static void skip_str32(const uint8_t *blob, size_t len, size_t *p) {
  assert_true(*p + 4 <= len);
  *p += 4 + cph_be32_get(blob + *p);
  assert_true(*p <= len);
}

/* blob[0..*len) (a version-7 state of session "a", all its entries on the direct channel) as a
 * version-6 node wrote it: its memories part as versions 1 to 6 wrote it (the session's own
 * scope only: a kind byte and its text each). Malloc'd; *len updated. */
static uint8_t *as_version_6(const uint8_t *blob, size_t *len) {
  size_t at, n;
  uint32_t count;
  history_part(blob, *len, &at, &n, &count);
  size_t p = at + n, from = p;
  assert_true(p + 4 <= *len);
  uint32_t memories = cph_be32_get(blob + p);
  p += 4;
  cph_buf part = {0};
  uint32_t kept = 0;
  for (uint32_t i = 0; i < memories; i++) {
    assert_true(p + 2 <= *len);
    uint8_t kind = blob[p], flags = blob[p + 1];
    p += 2;
    size_t scope = p;
    skip_str32(blob, *len, &p);
    size_t text = p;
    skip_str32(blob, *len, &p);
    assert_true(p + 4 <= *len);
    uint32_t tags = cph_be32_get(blob + p);
    p += 4;
    for (uint32_t k = 0; k < tags; k++)
      skip_str32(blob, *len, &p);
    if (flags & 1) {
      skip_str32(blob, *len, &p);
      p += 8;
    }
    if (cph_be32_get(blob + scope) == 1 && blob[scope + 4] == 'a') {
      cph_buf_append(&part, &kind, 1);
      cph_buf_append(&part, blob + text, 4 + cph_be32_get(blob + text));
      kept++;
    }
  }
  uint8_t *out = malloc(*len + 4 + part.len);
  assert_non_null(out);
  memcpy(out, blob, from);
  cph_be32_put(out + from, kept);
  memcpy(out + from + 4, part.data, part.len);
  memcpy(out + from + 4 + part.len, blob + p, *len - p);
  *len = from + 4 + part.len + (*len - p);
  cph_be32_put(out + 4, 6);
  cph_buf_free(&part);
  return out;
}

/* An engine tagged tag with policy, session "a" and reply origins as node `node`. */
static cph_fixture *node_with_a(const char *tag, const char *policy, const char *node) {
  cph_fixture *f = cph_fixture_new(tag, policy);
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  assert_int_equal(cph_engine_reply_origins(f->e, node), CPH_OK);
  return f;
}

/* Two engines as nodes "x" and "y" of a cluster (report_consumed, and reply origins when
 * `origins`), each with session "a"; their tags are <tag>_x and <tag>_y. */
static void two_nodes(const char *tag, bool origins, cph_fixture **x, cph_fixture **y) {
  for (int k = 0; k < 2; k++) {
    char name[32];
    snprintf(name, sizeof name, "%s_%s", tag, k ? "y" : "x");
    cph_fixture *f = cph_fixture_new(name, "{}");
    cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
    cph_engine_report_consumed(f->e, true);
    if (origins)
      assert_int_equal(cph_engine_reply_origins(f->e, k ? "y" : "x"), CPH_OK);
    *(k ? y : x) = f;
  }
}

static void test_session_state_moves_tree_episode_replies_and_memories(void **state) {
  (void)state;
  cph_fixture *from, *to;
  two_nodes("state", false, &from, &to);
  cph_op done;
  for (int i = 0; i < TURNS; i++) {
    turn(from, "a", i, &done);
    assert_non_null(done.u.turn.state);
    assert_string_equal(done.u.turn.consumed_session, "a");
    if (i < TURNS - 1)
      cph_op_clear_results(&done);
  }
  uint8_t *blob = done.u.turn.state;
  size_t len = done.u.turn.state_len;
  done.u.turn.state = NULL;
  cph_op_clear_results(&done);

  /* A malformed or cut blob is refused and changes nothing. */
  uint64_t episode = 99;
  assert_int_equal(import(to, "a", blob, 10), CPH_EINVAL);
  assert_int_equal(import(to, "a", blob, len - 3), CPH_EINVAL);
  assert_int_equal(tree_count(to, "a", "assistant", "reply 0 of a", &episode), 0);
  assert_int_equal(episode, 0);
  assert_int_equal(import(to, "nobody", blob, len), CPH_ENOTFOUND);

  /* Imported twice (a shard taken again): the same state, nothing doubled. */
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import(to, "a", blob, len), CPH_OK);
    for (int i = 0; i < TURNS; i++) {
      char text[64];
      snprintf(text, sizeof text, "reply %d of a", i);
      assert_int_equal(tree_count(to, "a", "assistant", text, &episode), 1);
      assert_int_equal(episode, TURNS);
      snprintf(text, sizeof text, "memory %d of a", i);
      assert_int_equal(memory_count(to, "a", text), 1);
    }
  }
  cph_session_info si = {0};
  cph_err err = {0};
  assert_int_equal(cph_engine_get_session(to->e, "a", &si, &err), CPH_OK);
  assert_int_equal(si.episode, TURNS);
  cph_session_info_free(&si);
  int times[TURNS];
  lease_shows_replies(to, times);
  for (int i = 0; i < TURNS; i++)
    assert_int_equal(times[i], 1);
  free(blob);
  cph_fixture_free(from);
  cph_fixture_free(to);
}

/* The replies stream of f from its start: *n replies (free with replies_free). */
static cph_reply_info *stream(cph_fixture *f, size_t *n) {
  cph_reply_info *list = NULL;
  uint64_t next = 0;
  cph_err err = {0};
  assert_int_equal(cph_engine_replies(f->e, 0, 1000, &list, n, &next, &err), CPH_OK);
  return list;
}

static void replies_free(cph_reply_info *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    cph_reply_info_free(&list[i]);
  free(list);
}

/* A completion's state, taken from its op. */
static uint8_t *state_of(cph_op *done, size_t *len) {
  uint8_t *blob = done->u.turn.state;
  assert_non_null(blob);
  *len = done->u.turn.state_len;
  done->u.turn.state = NULL;
  cph_op_clear_results(done);
  return blob;
}

/* TURNS turns answered on f's session "a": the last completion's state (*len bytes). */
static uint8_t *answered_state(cph_fixture *f, size_t *len) {
  cph_op done;
  for (int i = 0; i < TURNS; i++) {
    turn(f, "a", i, &done);
    if (i < TURNS - 1)
      cph_op_clear_results(&done);
  }
  return state_of(&done, len);
}

static void test_session_state_offers_the_replies_stream_once_by_origin(void **state) {
  (void)state;
  cph_fixture *x, *y;
  two_nodes("stream", true, &x, &y);
  cph_op done;
  size_t len;
  uint8_t *blob = answered_state(x, &len);
  size_t nx;
  cph_reply_info *rx = stream(x, &nx);
  assert_int_equal(nx, TURNS);
  for (size_t i = 0; i < nx; i++) { /* "x/<id>/<16 hex>" */
    char want[32];
    snprintf(want, sizeof want, "x/%llu/", (unsigned long long)rx[i].id);
    assert_non_null(rx[i].origin);
    assert_int_equal(strncmp(rx[i].origin, want, strlen(want)), 0);
    assert_int_equal(strlen(rx[i].origin), strlen(want) + 16);
  }

  /* y takes a over (twice: a shard taken again): x's replies join y's stream once each, under
   * x's origins, with their bodies and times */
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import(y, "a", blob, len), CPH_OK);
    size_t ny;
    cph_reply_info *ry = stream(y, &ny);
    assert_int_equal(ny, TURNS);
    for (size_t i = 0; i < ny; i++) {
      assert_string_equal(ry[i].origin, rx[i].origin);
      assert_string_equal(ry[i].body, rx[i].body);
      assert_string_equal(ry[i].session, "a");
      assert_int_equal(ry[i].ts_ms, rx[i].ts_ms);
      assert_int_equal(ry[i].n_source_inbox_ids, 0);
    }
    replies_free(ry, ny);
    assert_int_equal(cph_engine_last_reply_id(y->e), TURNS);
  }
  /* the replies written once in the state (flagged as channel replies too) still reach the
   * channel's history: the next lease shows each once */
  cph_fixture *w = cph_fixture_new("stream_w", "{}");
  cph_fixture_create_session(w, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  assert_int_equal(import(w, "a", blob, len), CPH_OK);
  int times[TURNS];
  lease_shows_replies(w, times);
  for (int i = 0; i < TURNS; i++)
    assert_int_equal(times[i], 1);
  cph_fixture_free(w);
  /* x takes it back: it holds its own replies, nothing is added */
  assert_int_equal(import(x, "a", blob, len), CPH_OK);
  size_t n;
  cph_reply_info *r = stream(x, &n);
  assert_int_equal(n, TURNS);
  replies_free(r, n);
  free(blob);

  /* y answers once more: its state carries x's replies and its own; x adds only y's */
  turn(y, "a", TURNS, &done);
  blob = state_of(&done, &len);
  assert_int_equal(import(x, "a", blob, len), CPH_OK);
  r = stream(x, &n);
  assert_int_equal(n, TURNS + 1);
  assert_int_equal(strncmp(r[TURNS].origin, "y/", 2), 0);
  assert_string_equal(r[TURNS].body, "reply 3 of a");
  replies_free(r, n);
  free(blob);

  /* a deleted session's replies stay in x's stream, but a session created again under its
   * name carries only its own in its state: a third engine taking it over adds just that one */
  cph_op del = {0};
  del.kind = CPH_OP_SESSION_DELETE;
  del.u.session.in.id = "a";
  assert_int_equal(cph_fixture_run(x, &del), CPH_OK);
  cph_op_clear_results(&del);
  cph_fixture_create_session(x, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  turn(x, "a", 0, &done);
  blob = state_of(&done, &len);
  cph_fixture *z = cph_fixture_new("stream_z", "{}");
  cph_fixture_create_session(z, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  assert_int_equal(import(z, "a", blob, len), CPH_OK);
  r = stream(z, &n);
  assert_int_equal(n, 1);
  assert_string_equal(r[0].body, "reply 0 of a");
  assert_int_equal(strncmp(r[0].origin, "x/", 2), 0);
  replies_free(r, n);
  r = stream(x, &n);
  assert_int_equal(n, TURNS + 2);
  replies_free(r, n);
  free(blob);
  replies_free(rx, nx);
  cph_fixture_free(x);
  cph_fixture_free(y);
  cph_fixture_free(z);
}

/* A question to session s, leased and failed with this error; the fail's items into items
 * (NULL: dropped). */
static void failed_turn_items(cph_fixture *f, const char *s, const char *error,
                              cph_fixture_items *items) {
  cph_event_in ev = {0};
  ev.session = (char *)s;
  ev.sender = "ann";
  ev.body = "a question that fails";
  cph_op lease;
  post_and_lease(f, &ev, &lease);
  cph_op fail = {0};
  fail.kind = CPH_OP_FAIL;
  fail.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(fail.u.turn.lease, lease.u.lease.turn.lease, sizeof fail.u.turn.lease);
  fail.u.turn.error = (char *)error;
  assert_int_equal(cph_fixture_run(f, &fail), CPH_OK);
  if (items)
    cph_fixture_items_take(items, &fail.u.turn.items);
  cph_op_clear_results(&fail);
  cph_op_clear_results(&lease);
}

static void failed_turn(cph_fixture *f, const char *s, const char *error) {
  failed_turn_items(f, s, error, NULL);
}

/* Session s's ended turns on f, newest first (free with records_free). */
static cph_turn_record *records(cph_fixture *f, const char *s, size_t *n) {
  cph_turn_record *list = NULL;
  cph_err err = {0};
  assert_int_equal(cph_engine_session_turn_records(f->e, s, 1000, &list, n, &err), CPH_OK);
  return list;
}

static void records_free(cph_turn_record *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    cph_turn_record_free(&list[i]);
  free(list);
}

/* How many of s's turn records on f have this origin. */
static int origin_count(cph_fixture *f, const char *s, const char *origin) {
  size_t n;
  cph_turn_record *list = records(f, s, &n);
  int count = 0;
  for (size_t i = 0; i < n; i++)
    count += list[i].origin && strcmp(list[i].origin, origin) == 0;
  records_free(list, n);
  return count;
}

static void test_session_state_carries_turn_records_once_by_origin(void **state) {
  (void)state;
  cph_fixture *x, *y;
  two_nodes("turns", true, &x, &y);
  failed_turn(x, "a", "model error");
  cph_op done;
  size_t len;
  uint8_t *blob = answered_state(x, &len);
  size_t nx;
  cph_turn_record *rx = records(x, "a", &nx); /* newest first: the completions, the failure */
  assert_int_equal(nx, TURNS + 1);
  for (size_t i = 0; i < nx; i++) { /* "x/<id>/<16 hex>" */
    char want[32];
    snprintf(want, sizeof want, "x/%llu/", (unsigned long long)rx[i].id);
    assert_non_null(rx[i].origin);
    assert_int_equal(strncmp(rx[i].origin, want, strlen(want)), 0);
    assert_int_equal(strlen(rx[i].origin), strlen(want) + 16);
  }
  assert_string_equal(rx[TURNS].state, "failed");
  assert_string_equal(rx[TURNS].error, "model error");
  assert_string_equal(rx[0].state, "completed");
  assert_int_equal(rx[0].cost_tokens, 100 + TURNS - 1);
  assert_int_equal(rx[0].tool_calls, TURNS - 1);

  /* y takes a over, twice (a shard taken again): each record once, as x had it, under a new id */
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import(y, "a", blob, len), CPH_OK);
    size_t ny;
    cph_turn_record *ry = records(y, "a", &ny);
    assert_int_equal(ny, TURNS + 1);
    for (size_t i = 0; i < ny; i++) {
      assert_string_equal(ry[i].origin, rx[i].origin);
      assert_string_equal(ry[i].state, rx[i].state);
      assert_string_equal(ry[i].session, "a");
      assert_int_equal(ry[i].kind, rx[i].kind);
      assert_int_equal(ry[i].lane, rx[i].lane);
      assert_int_equal(ry[i].cost_tokens, rx[i].cost_tokens);
      assert_int_equal(ry[i].tool_calls, rx[i].tool_calls);
      assert_int_equal(ry[i].attempts, rx[i].attempts);
      assert_int_equal(ry[i].episode, rx[i].episode);
      assert_int_equal(ry[i].created_ms, rx[i].created_ms);
      assert_int_equal(ry[i].completed_ms, rx[i].completed_ms);
      assert_string_equal(ry[i].worker, rx[i].worker);
      if (rx[i].error)
        assert_string_equal(ry[i].error, rx[i].error);
      else
        assert_null(ry[i].error);
      cph_turn_record one;
      cph_err err = {0};
      assert_int_equal(cph_engine_turn_record(y->e, ry[i].id, &one, &err), CPH_OK);
      assert_string_equal(one.origin, rx[i].origin);
      cph_turn_record_free(&one);
      /* history: no lease reaches it, not even the all-zero token it is stored with */
      cph_op op = {0};
      op.kind = round ? CPH_OP_HEARTBEAT : CPH_OP_COMPLETE;
      op.u.turn.turn_id = ry[i].id;
      memset(op.u.turn.lease, '0', 32);
      assert_int_equal(cph_fixture_run(y, &op), CPH_ECONFLICT);
      assert_non_null(strstr(op.err.msg, "never leased"));
      cph_op_clear_results(&op);
    }
    records_free(ry, ny);
  }
  /* nothing to lease on y: the imports made no active turn (the next turn is y's own) */
  turn(y, "a", TURNS, &done);
  free(blob);
  blob = state_of(&done, &len);
  size_t ny;
  cph_turn_record *ry = records(y, "a", &ny);
  assert_int_equal(ny, TURNS + 2);
  assert_int_equal(strncmp(ry[0].origin, "y/", 2), 0);
  assert_int_equal(ry[0].cost_tokens, 100 + TURNS);

  /* x takes it back: it holds its own records (made there), and adds only y's */
  assert_int_equal(import(x, "a", blob, len), CPH_OK);
  size_t n;
  cph_turn_record *r = records(x, "a", &n);
  assert_int_equal(n, TURNS + 2);
  for (size_t i = 0; i < ny; i++)
    assert_int_equal(origin_count(x, "a", ry[i].origin), 1);
  assert_string_equal(r[0].origin, ry[0].origin);
  records_free(r, n);
  /* and a y that lost its data (a fresh engine) gets them all once */
  cph_fixture *z = node_with_a("turns_z", "{}", "y");
  assert_int_equal(import(z, "a", blob, len), CPH_OK);
  r = records(z, "a", &n);
  assert_int_equal(n, TURNS + 2);
  records_free(r, n);
  cph_fixture_free(z);
  free(blob);
  records_free(ry, ny);
  records_free(rx, nx);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* Seals session s on f with this trigger: the seal's state (*len bytes; NULL on a single
 * node, and *len 0). */
static uint8_t *seal(cph_fixture *f, const char *s, const char *trigger, size_t *len) {
  cph_op op;
  cph_fixture_seal(f, s, trigger, &op);
  uint8_t *blob = op.u.context.state;
  *len = op.u.context.state_len;
  op.u.context.state = NULL;
  cph_op_clear_results(&op);
  return blob;
}

/* Session s's seals on f, oldest first (free with cph_seals_free). */
static cph_seal_info *seals(cph_fixture *f, const char *s, size_t *n) {
  cph_seal_info *list = NULL;
  cph_err err = {0};
  assert_int_equal(cph_engine_seals(f->e, s, &list, n, &err), CPH_OK);
  return list;
}

/* How many of s's seals on f have this origin. */
static int seal_origin_count(cph_fixture *f, const char *s, const char *origin) {
  size_t n;
  cph_seal_info *list = seals(f, s, &n);
  int count = 0;
  for (size_t i = 0; i < n; i++)
    count += list[i].origin && strcmp(list[i].origin, origin) == 0;
  cph_seals_free(list, n);
  return count;
}

/* b shows seal a as it was made: trigger, episode, time, origin and messages. */
static void assert_same_seal(const cph_seal_info *a, const cph_seal_info *b) {
  assert_string_equal(b->trigger, a->trigger);
  assert_string_equal(b->origin, a->origin);
  assert_int_equal(b->episode, a->episode);
  assert_int_equal(b->created_ms, a->created_ms);
  assert_int_equal(b->n_messages, a->n_messages);
  for (size_t m = 0; m < a->n_messages; m++) {
    assert_string_equal(b->messages[m].role, a->messages[m].role);
    assert_string_equal(b->messages[m].content, a->messages[m].content);
    assert_string_equal(b->messages[m].coord, a->messages[m].coord);
  }
}

static void test_session_state_carries_seals_once_by_origin(void **state) {
  (void)state;
  cph_fixture *x, *y;
  two_nodes("seals", true, &x, &y);
  size_t len;
  uint8_t *blob = answered_state(x, &len);
  free(blob);
  blob = seal(x, "a", "first", &len);
  free(blob);
  blob = seal(x, "a", "second", &len); /* a seal's answer carries the state with it */
  size_t nx;
  cph_seal_info *sx = seals(x, "a", &nx);
  assert_int_equal(nx, 2);
  for (size_t i = 0; i < nx; i++) { /* "x/<id>/<16 hex>" */
    char want[32];
    snprintf(want, sizeof want, "x/%llu/", (unsigned long long)sx[i].id);
    assert_non_null(sx[i].origin);
    assert_int_equal(strncmp(sx[i].origin, want, strlen(want)), 0);
    assert_int_equal(strlen(sx[i].origin), strlen(want) + 16);
    assert_true(sx[i].n_messages >= 2 * TURNS);
  }
  assert_string_equal(sx[0].trigger, "first");
  assert_string_equal(sx[1].trigger, "second");
  assert_string_not_equal(sx[0].origin, sx[1].origin);

  /* y takes a over, twice (a shard taken again): each seal once, as x made it, new ids */
  cph_fixture_create_session(y, "b", CPH_LANE_INTERACTIVE, NULL, 0);
  size_t lb;
  free(seal(y, "b", "b's own", &lb)); /* y's seal ids of a start at 1 all the same */
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import(y, "a", blob, len), CPH_OK);
    size_t ny;
    cph_seal_info *sy = seals(y, "a", &ny);
    assert_int_equal(ny, 2);
    for (size_t i = 0; i < ny; i++) {
      assert_int_equal(sy[i].id, i + 1);
      assert_same_seal(&sx[i], &sy[i]);
    }
    cph_seals_free(sy, ny);
  }
  /* y seals a itself: x takes it back, holding its own two and adding only y's */
  free(blob);
  blob = seal(y, "a", "third", &len);
  size_t ny;
  cph_seal_info *sy = seals(y, "a", &ny);
  assert_int_equal(ny, 3);
  assert_int_equal(strncmp(sy[2].origin, "y/3/", 4), 0);
  assert_int_equal(import(x, "a", blob, len), CPH_OK);
  size_t n;
  cph_seal_info *list = seals(x, "a", &n);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < ny; i++)
    assert_int_equal(seal_origin_count(x, "a", sy[i].origin), 1);
  assert_same_seal(&sy[2], &list[2]);
  assert_int_equal(list[2].id, 3);
  cph_seals_free(list, n);
  /* a completion's state carries them too; and a y that lost its data (a fresh engine named
   * y) gets them all once */
  cph_op done;
  turn(x, "a", TURNS, &done);
  free(blob);
  blob = state_of(&done, &len);
  cph_fixture *z = node_with_a("seals_z", "{}", "y");
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import(z, "a", blob, len), CPH_OK);
    list = seals(z, "a", &n);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
      assert_same_seal(&sy[i], &list[i]);
    cph_seals_free(list, n);
  }
  cph_fixture_free(z);
  /* a session's seals go with it: created again under its name on x it has none; and x then
   * takes the same state as a node that never held them (the origin rows of the seals it had
   * imported went too): each seal once again */
  cph_op del = {.kind = CPH_OP_SESSION_DELETE};
  del.u.session.in.id = "a";
  assert_int_equal(cph_fixture_run(x, &del), CPH_OK);
  cph_op_clear_results(&del);
  cph_fixture_create_session(x, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  list = seals(x, "a", &n);
  assert_int_equal(n, 0);
  cph_seals_free(list, n);
  assert_int_equal(import(x, "a", blob, len), CPH_OK);
  list = seals(x, "a", &n);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < n; i++) {
    assert_same_seal(&sy[i], &list[i]);
    assert_int_equal(seal_origin_count(x, "a", sy[i].origin), 1);
  }
  cph_seals_free(list, n);
  free(blob);
  cph_seals_free(sy, ny);
  cph_seals_free(sx, nx);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* blob[0..len) with one more part of one encoded record appended. */
static void with_record_part(cph_buf *out, const uint8_t *blob, size_t len, const cph_buf *rec) {
  cph_buf_reset(out);
  cph_buf_append(out, blob, len);
  uint8_t be[4];
  cph_be32_put(be, 1);
  cph_buf_append(out, be, 4);
  cph_be32_put(be, (uint32_t)rec->len);
  cph_buf_append(out, be, 4);
  cph_buf_append(out, rec->data, rec->len);
}

/* s's kept turns on f (free with cph_kept_turns_free), newest last. */
static cph_kept_turn *kept(cph_fixture *f, const char *s, size_t *n) {
  cph_kept_turn *list = NULL;
  cph_err err = {0};
  assert_int_equal(cph_engine_kept_turns(f->e, s, &list, n, &err), CPH_OK);
  return list;
}

/* blob[0..len) is a version-6 state of "a" with an empty kept turn contexts part: with a
 * malformed kept context in its place, it is refused, naming it, and nothing is stored. */
static void bad_kept_contexts_are_named(const uint8_t *blob, size_t len) {
  size_t n;
  cph_kept_turn *k;
  /* malformed kept contexts: refused, named, nothing stored */
  char msg[512];
  cph_fixture *w = cph_fixture_new("kept_w", "{}");
  cph_fixture_create_session(w, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  uint64_t tokens[10] = {0};
  char *roles[] = {"user"}, *contents[] = {"hello"}, *coords[] = {"d0, 1, 0"};
  uint64_t nodes[] = {0};
  for (int c = 0; c < 3; c++) {
    static const char *const want[] = {"kept turn context 1 of 1: another session's",
                                       "kept turn context 1 of 1: its arrays disagree",
                                       "kept turn context 1 of 1: its origin is cut short"};
    cph_turnctx_rec r = {0};
    r.turn_id = 7;
    r.session = c == 0 ? "b" : "a";
    r.tokens = tokens;
    r.n_tokens = 10;
    r.msg_roles = roles;
    r.n_msg_roles = 1;
    r.msg_contents = contents;
    r.n_msg_contents = c == 1 ? 0 : 1;
    r.msg_coords = coords;
    r.n_msg_coords = 1;
    r.msg_nodes = nodes;
    r.n_msg_nodes = 1;
    cph_buf rec = {0};
    uint8_t be[4];
    cph_be32_put(be, c == 2 ? 99 : 20);
    cph_buf_append(&rec, be, 4);
    cph_buf_append(&rec, "x/1/0123456789abcdef", c == 2 ? 10 : 20);
    if (c < 2)
      assert_int_equal(cph_record_encode(&cph_turnctx_desc, &r, &rec), CPH_OK);
    cph_buf bad = {0};
    with_record_part(&bad, blob, len - 4, &rec);
    assert_int_equal(import_msg(w, "a", (const uint8_t *)bad.data, bad.len, msg, sizeof msg),
                     CPH_EINVAL);
    if (!strstr(msg, want[c]))
      fail_msg("%s", msg);
    assert_non_null(strstr(msg, "the version-6 state of session 'a' is malformed"));
    cph_buf_free(&bad);
    cph_buf_free(&rec);
  }
  k = kept(w, "a", &n);
  assert_int_equal(n, 0);
  cph_kept_turns_free(k, n);
  cph_fixture_free(w);
}

static void test_session_state_versions_2_to_5_load_and_bad_records_are_named(void **state) {
  (void)state;
  cph_fixture *x = cph_fixture_new("v2_x", "{}");
  cph_fixture_create_session(x, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(x->e, true);
  cph_op done;
  turn(x, "a", 0, &done);
  size_t len;
  uint8_t *blob = state_of(&done, &len);
  /* without reply origins (no node name) no record or seal has an identity: empty parts */
  assert_true(len > 32);
  assert_memory_equal(blob + len - 12, "\0\0\0\0\0\0\0\0\0\0\0\0", 12);
  assert_int_equal(cph_be32_get(blob + 4), 7);
  uint8_t *v7 = blob; /* as a version-6 node wrote it: memories of its own scope, unscoped */
  blob = as_version_6(v7, &len);
  free(v7);
  bad_kept_contexts_are_named(blob, len);
  {
    char text[512];
    cph_fixture *y = cph_fixture_new("v6_y", "{}");
    cph_fixture_create_session(y, "a", CPH_LANE_INTERACTIVE, NULL, 0);
    for (int round = 0; round < 2; round++) {
      assert_int_equal(import_msg(y, "a", blob, len, text, sizeof text), CPH_OK);
      assert_int_equal(memory_count(y, "a", "memory 0 of a"), 1);
    }
    cph_fixture_free(y);
  }
  char msg[512];
  /* as a version-5 node wrote it (no kept turn contexts): it loads, and a byte more is refused */
  len -= 4;
  cph_be32_put(blob + 4, 5);
  {
    cph_fixture *y = cph_fixture_new("v5_y", "{}");
    cph_fixture_create_session(y, "a", CPH_LANE_INTERACTIVE, NULL, 0);
    assert_int_equal(import_msg(y, "a", blob, len, msg, sizeof msg), CPH_OK);
    uint64_t episode = 0;
    assert_int_equal(tree_count(y, "a", "assistant", "reply 0 of a", &episode), 1);
    assert_int_equal(import_msg(y, "a", blob, len + 1, msg, sizeof msg), CPH_EINVAL);
    assert_non_null(strstr(msg, "1 bytes follow its seals"));
    cph_fixture_free(y);
  }
  uint8_t *v5 = blob; /* as a version-4 node wrote it: a channel replies part instead */
  blob = as_version_4(v5, &len);
  free(v5);

  /* the same state as a version-2 node wrote it (no turn records, no seals), as a version-3
   * node did (no seals) and as a version-4 node did (its replies, not its channel history):
   * each loads */
  for (uint32_t version = 2; version <= 4; version++) {
    char tag[16];
    snprintf(tag, sizeof tag, "v%u_y", version);
    cph_fixture *y = cph_fixture_new(tag, "{}");
    cph_fixture_create_session(y, "a", CPH_LANE_INTERACTIVE, NULL, 0);
    cph_be32_put(blob + 4, version);
    assert_int_equal(import_msg(y, "a", blob, len - 4 * (4 - version), msg, sizeof msg), CPH_OK);
    uint64_t episode = 0;
    assert_int_equal(tree_count(y, "a", "assistant", "reply 0 of a", &episode), 1);
    assert_int_equal(episode, 1);
    assert_int_equal(memory_count(y, "a", "memory 0 of a"), 1);
    /* one byte more than the version's parts is refused */
    assert_int_equal(import_msg(y, "a", blob, len - 4 * (4 - version) + 1, msg, sizeof msg),
                     version == 2 ? CPH_OK : CPH_EINVAL);
    if (version == 3)
      assert_non_null(strstr(msg, "1 bytes follow its turn records"));
    if (version == 4)
      assert_non_null(strstr(msg, "1 bytes follow its seals"));
    cph_fixture_free(y);
  }
  cph_fixture *y = cph_fixture_new("v4_y", "{}");
  cph_fixture_create_session(y, "a", CPH_LANE_INTERACTIVE, NULL, 0);

  /* a version-3 state whose turn records part holds a bad record: refused, naming it */
  cph_be32_put(blob + 4, 3);
  cph_turn_rec tr = {0};
  tr.session = "a";
  tr.state = CPH_TURN_LEASED;
  tr.origin = "x/9/0123456789abcdef";
  cph_buf rec = {0};
  assert_int_equal(cph_record_encode(&cph_turn_desc, &tr, &rec), CPH_OK);
  cph_buf bad = {0};
  with_record_part(&bad, blob, len - 8, &rec);
  const uint8_t *bad_data = (const uint8_t *)bad.data;
  assert_int_equal(import_msg(y, "a", bad_data, bad.len, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "turn record 1 of 1: not ended"));
  ((uint8_t *)bad.data)[len - 8 + 8] ^= 0xff; /* the record's first byte: not msgpack */
  assert_int_equal(import_msg(y, "a", bad_data, bad.len, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "turn record 1 of 1: turn"));
  assert_int_equal(import_msg(y, "a", bad_data, bad.len - 1, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "turn record 1 of 1 is cut short"));
  size_t n; /* none of it was stored */
  cph_turn_record *r = records(y, "a", &n);
  assert_int_equal(n, 0);
  records_free(r, n);

  /* a version-4 state whose seals part holds a bad seal: refused, naming it */
  cph_be32_put(blob + 4, 4);
  char *roles[] = {"user"}, *contents[] = {"hello"}, *coords[] = {"d0, 1, 0"};
  cph_seal_rec sr = {0};
  sr.id = 1;
  sr.session = "a";
  sr.trigger = "t";
  sr.roles = roles;
  sr.n_roles = 1;
  sr.contents = contents;
  sr.n_contents = 1;
  sr.coords = coords;
  sr.n_coords = 1;
  sr.origin = "x/1/0123456789abcdef";
  for (int k = 0; k < 4; k++) {
    static const char *const want[] = {NULL, "seal 1 of 1: another session's",
                                       "seal 1 of 1: no origin",
                                       "seal 1 of 1: its messages' roles"};
    sr.session = k == 1 ? "b" : "a";
    sr.origin = k == 2 ? NULL : "x/1/0123456789abcdef";
    sr.n_coords = k == 3 ? 0 : 1;
    cph_buf_reset(&rec);
    assert_int_equal(cph_record_encode(&cph_seal_desc, &sr, &rec), CPH_OK);
    with_record_part(&bad, blob, len - 4, &rec);
    bad_data = (const uint8_t *)bad.data;
    if (!want[k]) { /* the good one, cut short and with a byte too many */
      assert_int_equal(import_msg(y, "a", bad_data, bad.len - 1, msg, sizeof msg), CPH_EINVAL);
      assert_non_null(strstr(msg, "seal 1 of 1 is cut short"));
      cph_buf_append(&bad, "", 1);
      assert_int_equal(import_msg(y, "a", bad_data = (const uint8_t *)bad.data, bad.len, msg,
                                  sizeof msg),
                       CPH_EINVAL);
      assert_non_null(strstr(msg, "1 bytes follow its seals"));
      continue;
    }
    assert_int_equal(import_msg(y, "a", bad_data, bad.len, msg, sizeof msg), CPH_EINVAL);
    assert_non_null(strstr(msg, want[k]));
    assert_non_null(strstr(msg, "the version-4 state of session 'a' is malformed"));
  }
  size_t ns;
  cph_seal_info *sl = seals(y, "a", &ns);
  assert_int_equal(ns, 0);
  cph_seals_free(sl, ns);
  cph_buf_free(&bad);
  cph_buf_free(&rec);
  free(blob);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* Version 5: the channel history moves, the users' messages with the replies — each once
 * however often the state is imported, as seen history (the session's cursor moved), in
 * order; a malformed entry is refused, naming it, and changes nothing. */
static void test_session_state_moves_channel_history(void **state) {
  (void)state;
  cph_fixture *from, *to;
  two_nodes("hist", false, &from, &to);
  size_t len;
  uint8_t *blob = answered_state(from, &len);
  assert_int_equal(cph_be32_get(blob + 4), 7);
  size_t at, n;
  uint32_t count;
  history_part(blob, len, &at, &n, &count);
  assert_int_equal(count, 2 * TURNS); /* each question and its reply */

  /* a bad entry: named, nothing stored */
  char msg[512];
  uint8_t *bad = malloc(len);
  assert_non_null(bad);
  memcpy(bad, blob, len);
  bad[at + 4] = 7; /* the first entry's flag */
  assert_int_equal(import_msg(to, "a", bad, len, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "the version-7 state of session 'a' is malformed: channel "
                              "history entry 1 of 6: its flag is not 0 or 1"));
  memcpy(bad, blob, len);
  cph_be32_put(bad + at + 4 + 1 + 4 + 8, 0); /* the first entry's sender: empty */
  memmove(bad + at + 4 + 1 + 4 + 8 + 4, bad + at + 4 + 1 + 4 + 8 + 4 + 3, len - at - 24);
  assert_int_equal(import_msg(to, "a", bad, len - 3, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "channel history entry 1 of 6: it has no sender"));
  memcpy(bad, blob, len);
  cph_be32_put(bad + at, 100); /* more entries than the part holds: the 7th runs on */
  assert_int_equal(import_msg(to, "a", bad, len, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "channel history entry "));
  assert_non_null(strstr(msg, " of 100: "));
  free(bad);
  uint64_t episode = 99;
  assert_int_equal(tree_count(to, "a", "assistant", "reply 0 of a", &episode), 0);
  assert_int_equal(episode, 0);

  /* the session answered here before (its shard was here once): it has a cursor on its
   * channel, which the import moves past what its turns saw elsewhere — else those would
   * come as messages while it was away */
  cph_op done;
  turn(to, "a", 7, &done);
  cph_op_clear_results(&done);
  /* imported twice (a shard taken again): each entry once */
  assert_int_equal(import(to, "a", blob, len), CPH_OK);
  assert_int_equal(import(to, "a", blob, len), CPH_OK);
  lease_shows_questions(to);
  free(blob);
  cph_fixture_free(from);
  cph_fixture_free(to);
}

/* Whether data[0..n) holds str. */
static bool holds(const uint8_t *data, size_t n, const char *str) {
  size_t l = strlen(str);
  for (size_t i = 0; i + l <= n; i++)
    if (memcmp(data + i, str, l) == 0)
      return true;
  return false;
}

/* Session "a" with this window (0: the policy's), BIG messages of BYTES letters at random (no
 * two alike enough to fold) answered by one turn: that completion's state (*len bytes). */
enum { BIG = 40, BYTES = 8000 };
static uint8_t *big_history_state(cph_fixture *f, uint64_t window, size_t *len) {
  cph_op create = {0};
  create.kind = CPH_OP_SESSION_CREATE;
  create.u.session.in.id = "a";
  create.u.session.in.lane = CPH_LANE_INTERACTIVE;
  create.u.session.in.context_window_tokens = window;
  if (cph_fixture_run(f, &create))
    fail_msg("create a: %s", create.err.msg);
  cph_op_clear_results(&create);
  cph_engine_report_consumed(f->e, true);
  cph_event_in evs[BIG];
  char *bodies[BIG];
  uint32_t seed = 7;
  for (int i = 0; i < BIG; i++) {
    bodies[i] = malloc(BYTES + 1);
    assert_non_null(bodies[i]);
    int k = snprintf(bodies[i], BYTES, "big %02d ", i);
    for (; k < BYTES; k++) {
      seed = seed * 1103515245u + 12345u;
      bodies[i][k] = (char)('a' + (seed >> 16) % 26);
    }
    bodies[i][BYTES] = '\0';
    memset(&evs[i], 0, sizeof evs[i]);
    evs[i].session = "a";
    evs[i].sender = "ann";
    evs[i].body = bodies[i];
  }
  cph_op in;
  cph_fixture_ingest(f, evs, BIG, &in);
  cph_op_clear_results(&in);
  for (int i = 0; i < BIG; i++)
    free(bodies[i]);
  cph_op lease;
  cph_fixture_lease(f, "w", &lease);
  assert_int_equal(lease.u.lease.turn.n_staged, BIG);
  cph_op done;
  complete_leased(f, &lease, "the reply", &done);
  cph_op_clear_results(&lease);
  return state_of(&done, len);
}

/* The channel history part keeps the newest entries within its 256 KiB: 40 messages of ~8 KB
 * answered by one turn of a session with a window of 200,000 tokens (whose turns could show
 * them all) carry their newest ~30 and the reply, whole; the oldest are left out. */
static void test_session_state_history_keeps_the_newest_within_its_bound(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("hist_bound", "{}");
  size_t len;
  uint8_t *blob = big_history_state(f, 200000, &len);
  size_t at, n;
  uint32_t count;
  history_part(blob, len, &at, &n, &count);
  assert_true(n <= 4 + 256 * 1024);
  assert_true(count > 20 && count < BIG);
  assert_true(holds(blob + at, n, "big 39 "));
  assert_true(holds(blob + at, n, "the reply"));
  assert_false(holds(blob + at, n, "big 00 "));
  char first[8]; /* the oldest entry kept: the part's first, whole */
  snprintf(first, sizeof first, "big %02u ", BIG - (count - 1));
  assert_memory_equal(blob + at + 4 + 1 + 4 + 8 + 4 + 3 + 4 + 0 + 8 + 4, first, 7);
  free(blob);
  cph_fixture_free(f);
}

/* A text of BYTES letters at random after its head (no two alike enough to fold). */
static char *big_text(const char *head, uint32_t *seed) {
  char *t = malloc(BYTES + 1);
  assert_non_null(t);
  int k = snprintf(t, BYTES, "%s", head);
  for (; k < BYTES; k++) {
    *seed = *seed * 1103515245u + 12345u;
    t[k] = (char)('a' + (*seed >> 16) % 26);
  }
  t[BYTES] = '\0';
  return t;
}

/* Of a channel the state carries what a turn of the session could read, back to where the
 * session's own entries hold a window's worth of text: with the default window (8,192 tokens,
 * 32 KB of text) 12 turns of a ~8 KB question and a ~8 KB answer carry the newest five answers
 * (the fifth crosses the 32 KB) and the questions between them — 9 entries — and every history
 * entry the session's next turn shows is among them. */
static void test_session_state_history_carries_what_a_turn_could_show(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("hist_window", "{}");
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(f->e, true);
  uint32_t seed = 11;
  uint8_t *blob = NULL;
  size_t len = 0;
  for (int i = 0; i < 12; i++) {
    char head[16];
    snprintf(head, sizeof head, "q %02d ", i);
    char *q = big_text(head, &seed);
    snprintf(head, sizeof head, "r %02d ", i);
    char *reply = big_text(head, &seed);
    cph_event_in ev = {0};
    ev.session = "a";
    ev.sender = "ann";
    ev.body = q;
    cph_op lease;
    post_and_lease(f, &ev, &lease);
    cph_op done;
    complete_leased(f, &lease, reply, &done);
    cph_op_clear_results(&lease);
    free(blob);
    blob = state_of(&done, &len);
    free(q);
    free(reply);
  }
  size_t at, n;
  uint32_t count;
  history_part(blob, len, &at, &n, &count);
  assert_int_equal(count, 9);
  assert_true(holds(blob + at, n, "r 07 "));
  assert_false(holds(blob + at, n, "q 07 "));
  assert_true(holds(blob + at, n, "q 08 "));
  assert_true(holds(blob + at, n, "r 11 "));
  cph_event_in next = {0};
  next.session = "a";
  next.sender = "ann";
  next.body = "one more";
  cph_op lease;
  post_and_lease(f, &next, &lease);
  const cph_turn_info *ti = &lease.u.lease.turn;
  assert_true(ti->n_history > 0);
  for (size_t i = 0; i < ti->n_history; i++) {
    char head[8];
    snprintf(head, sizeof head, "%.5s", ti->history[i].body);
    if (!holds(blob + at, n, head))
      fail_msg("the next turn shows history entry \"%s...\", which the state lacks", head);
  }
  cph_op_clear_results(&lease);
  free(blob);
  cph_fixture_free(f);
}

/* A state older than the session's tree here in the same line of turns — this node's own, put
 * before a completion whose state the log never took (it answered 503; a retry answers
 * `already`), found in the log when the node takes the shard back — leaves the tree and the
 * episode here as they are: the later turn's reply stays. A state another node went on with
 * from that same older state replaces them: its turn, not this node's, is the one the cluster
 * answered. Before, the older state was written over the tree and the reply was gone. */
static void test_session_state_an_older_state_of_this_nodes_line_keeps_the_tree(void **state) {
  (void)state;
  cph_fixture *x, *y;
  two_nodes("behind", true, &x, &y);
  cph_op done;
  for (int i = 0; i < TURNS; i++) {
    turn(x, "a", i, &done);
    if (i < TURNS - 1)
      cph_op_clear_results(&done);
  }
  size_t len;
  uint8_t *logged = state_of(&done, &len); /* what the log holds */
  turn(x, "a", TURNS, &done);              /* a completion whose state the log never took */
  cph_op_clear_results(&done);
  char last[64];
  snprintf(last, sizeof last, "reply %d of a", TURNS);
  uint64_t episode = 0, now = 0;
  assert_int_equal(tree_count(x, "a", "assistant", last, &episode), 1);
  assert_int_equal(import(x, "a", logged, len), CPH_OK); /* the shard taken back */
  assert_int_equal(tree_count(x, "a", "assistant", last, &now), 1);
  assert_int_equal(now, episode);
  /* another node went on from the logged state: its line wins */
  assert_int_equal(import(y, "a", logged, len), CPH_OK);
  turn(y, "a", 100, &done);
  size_t theirs_len;
  uint8_t *theirs = state_of(&done, &theirs_len);
  assert_int_equal(import(x, "a", theirs, theirs_len), CPH_OK);
  assert_int_equal(tree_count(x, "a", "assistant", "reply 100 of a", &now), 1);
  uint64_t ignored;
  assert_int_equal(tree_count(x, "a", "assistant", last, &ignored), 0);
  assert_int_equal(now, episode);
  free(logged);
  free(theirs);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* The number of turns x's scheduler counts running, all lanes. */
static uint32_t running_turns(cph_fixture *f) {
  cph_lane_info lanes[CPH_LANE_COUNT];
  uint32_t limit = 0, in_use = 0;
  cph_engine_lanes(f->e, lanes, &limit, &in_use);
  return in_use;
}

/* A node takes a shard back while a turn of its session still runs here (it leased it, was
 * stopped, another node served the session meanwhile and logged its state): the import sets
 * the session's credits and episode, and the turn goes on running — one turn slot held, its
 * completion frees it, and the next turn starts. (The import used to register the session
 * anew, leaving the old registration running for good: every such takeover kept a slot of
 * the node's :concurrency until it started nothing — test_cluster_fence's round 5.) */
static void test_session_state_import_keeps_a_running_turn_running(void **state) {
  (void)state;
  cph_fixture *x, *y;
  two_nodes("running", true, &x, &y);
  cph_op done;
  turn(y, "a", 0, &done);
  size_t len;
  uint8_t *theirs = state_of(&done, &len);
  cph_op lease;
  next_lease(x, "asked on x", &lease);
  assert_int_equal(running_turns(x), 1);
  assert_int_equal(import(x, "a", theirs, len), CPH_OK);
  assert_int_equal(running_turns(x), 1);
  cph_op complete;
  complete_leased(x, &lease, "done on x", &complete);
  cph_op_clear_results(&complete);
  cph_op_clear_results(&lease);
  assert_int_equal(running_turns(x), 0);
  turn(x, "a", 1, &done); /* the next turn starts and ends */
  cph_op_clear_results(&done);
  assert_int_equal(running_turns(x), 0);
  free(theirs);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

static void test_session_state_is_not_exported_without_report_consumed(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("state_off", "{}");
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_op done;
  turn(f, "a", 0, &done);
  assert_null(done.u.turn.state);
  cph_op_clear_results(&done);
  size_t n; /* and on a single node a reply has no origin */
  cph_reply_info *r = stream(f, &n);
  assert_int_equal(n, 1);
  assert_null(r[0].origin);
  replies_free(r, n);
  cph_turn_record *t = records(f, "a", &n); /* its turn is listed, without an origin */
  assert_int_equal(n, 1);
  assert_null(t[0].origin);
  assert_string_equal(t[0].state, "completed");
  assert_int_equal(t[0].cost_tokens, 100);
  records_free(t, n);
  size_t len; /* a seal's answer carries no state, and the seal no origin */
  assert_null(seal(f, "a", "here", &len));
  assert_int_equal(len, 0);
  cph_seal_info *sl = seals(f, "a", &n);
  assert_int_equal(n, 1);
  assert_null(sl[0].origin);
  cph_seals_free(sl, n);
  cph_fixture_free(f);
}

/* The origin of s's turn record `id` on f (a copy). */
static char *origin_of(cph_fixture *f, uint64_t id) {
  cph_turn_record one;
  cph_err err = {0};
  assert_int_equal(cph_engine_turn_record(f->e, id, &one, &err), CPH_OK);
  assert_non_null(one.origin);
  char *o = strdup(one.origin);
  cph_turn_record_free(&one);
  return o;
}

/* Kept turn ta of "a" on a and tb, carried from it, on b show the same messages, nodes and
 * tokens. */
static void assert_same_context(cph_fixture *a, uint64_t ta, cph_fixture *b, uint64_t tb) {
  cph_turn_context ca, cb;
  cph_err err = {0};
  assert_int_equal(cph_engine_turn_context(a->e, "a", ta, &ca, &err), CPH_OK);
  assert_int_equal(cph_engine_turn_context(b->e, "a", tb, &cb, &err), CPH_OK);
  assert_int_equal(ca.n_messages, cb.n_messages);
  assert_true(ca.n_messages > 0);
  for (size_t i = 0; i < ca.n_messages; i++) {
    assert_string_equal(ca.messages[i].role, cb.messages[i].role);
    assert_string_equal(ca.messages[i].content, cb.messages[i].content);
    assert_string_equal(ca.messages[i].coord, cb.messages[i].coord);
  }
  assert_int_equal(ca.n_nodes, cb.n_nodes);
  for (size_t i = 0; i < ca.n_nodes; i++) {
    assert_int_equal(ca.nodes[i].id, cb.nodes[i].id);
    assert_string_equal(ca.nodes[i].content, cb.nodes[i].content);
  }
  assert_memory_equal(&ca.turn.tokens, &cb.turn.tokens, sizeof ca.turn.tokens);
  assert_int_equal(ca.turn.id, ta);
  assert_int_equal(cb.turn.id, tb);
  /* b's carried copy leaves out a's ids of events, memories and inbox messages: omitted */
  assert_true(cb.turn.omit & CPH_PART_HISTORY && cb.turn.omit & CPH_PART_MEMORY &&
              cb.turn.omit & CPH_PART_OBLIGATIONS);
  assert_int_equal(cb.n_history + cb.n_memories + cb.n_obligations, 0);
  cph_turn_context_free(&ca);
  cph_turn_context_free(&cb);
}

/* The first n kept turns ka of "a" on a and kb, carried from them, on b: the same turn
 * records' origins and the same contexts, in order. */
static void assert_same_kept(cph_fixture *a, const cph_kept_turn *ka, cph_fixture *b,
                             const cph_kept_turn *kb, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char *oa = origin_of(a, ka[i].id), *ob = origin_of(b, kb[i].id);
    assert_string_equal(oa, ob);
    free(oa);
    free(ob);
    assert_same_context(a, ka[i].id, b, kb[i].id);
  }
}

/* Imports state (NULL: none) and items[0..n) into s on f: the op's answer, *refused its
 * refused items. */
static int import_items(cph_fixture *f, const char *s, const uint8_t *state, size_t len,
                        const cph_state_item *items, size_t n, uint32_t *refused) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_STATE;
  op.u.state.session = (char *)s;
  op.u.state.data = state;
  op.u.state.len = len;
  op.u.state.items = items;
  op.u.state.n_items = n;
  int rc = cph_fixture_run(f, &op);
  *refused = op.u.state.items_refused;
  cph_op_clear_results(&op);
  return rc;
}

/* n turns of "a" on f (questions first..), their items gathered into items; the last state
 * (*len bytes). */
static uint8_t *turns_items(cph_fixture *f, int first, int n, cph_fixture_items *items,
                            size_t *len) {
  cph_op done;
  uint8_t *blob = NULL;
  for (int i = first; i < first + n; i++) {
    turn(f, "a", i, &done);
    cph_fixture_items_take(items, &done.u.turn.items);
    free(blob);
    blob = state_of(&done, len);
  }
  return blob;
}

/* TURNS turns of "a" on f: turns_items. */
static uint8_t *answered_items(cph_fixture *f, int first, cph_fixture_items *items, size_t *len) {
  return turns_items(f, first, TURNS, items, len);
}

/* Kept turn contexts move as items (handover.h, handover_kept_item): every completed turn's,
 * under the id its turn record got on the new owner (matched by origin), each once however
 * often the items are imported; the state carries none (a state alone moves none). Taken back,
 * the old owner adds only the other node's. The new owner's keep-turns trims them; the log
 * keeps one item per slot, so an owner with keep-turns 2 leaves two kept contexts there, its
 * newest. */
static void test_session_state_kept_contexts_move_as_items(void **state) {
  (void)state;
  cph_fixture *x, *y;
  two_nodes("kept", true, &x, &y);
  cph_fixture_items items = {0};
  size_t len, nx;
  uint8_t *blob = answered_items(x, 0, &items, &len);
  cph_kept_turn *kx = kept(x, "a", &nx);
  assert_int_equal(nx, TURNS);
  uint32_t refused = 0;
  cph_fixture *w = node_with_a("kept_w", "{}", "w");
  assert_int_equal(import(w, "a", blob, len), CPH_OK);
  size_t n;
  cph_kept_turn *k = kept(w, "a", &n);
  assert_int_equal(n, 0); /* the state alone */
  cph_kept_turns_free(k, n);
  cph_fixture_free(w);
  cph_fixture_items_last_per_name(&items);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import_items(y, "a", blob, len, items.v, items.n, &refused), CPH_OK);
    assert_int_equal(refused, 0);
    size_t ny;
    cph_kept_turn *ky = kept(y, "a", &ny);
    assert_int_equal(ny, TURNS); /* all of x's, in their order */
    assert_same_kept(x, kx, y, ky, TURNS);
    cph_kept_turns_free(ky, ny);
  }
  /* y's own turn keeps its context beside them; x takes the session back and adds only that */
  cph_op done;
  turn(y, "a", TURNS, &done);
  cph_fixture_items back = {0};
  cph_fixture_items_take(&back, &done.u.turn.items);
  free(blob);
  blob = state_of(&done, &len);
  size_t ny;
  cph_kept_turn *ky = kept(y, "a", &ny);
  assert_int_equal(ny, TURNS + 1);
  for (int round = 0; round < 2; round++)
    assert_int_equal(import_items(x, "a", blob, len, back.v, back.n, &refused), CPH_OK);
  k = kept(x, "a", &n);
  assert_int_equal(n, TURNS + 1);
  for (size_t i = 0; i < TURNS; i++)
    assert_int_equal(k[i].id, kx[i].id);
  assert_same_kept(y, ky + TURNS, x, k + TURNS, 1);
  cph_kept_turns_free(k, n);

  /* :context :keep-turns 1 on the new owner: only the newest carried one stays */
  cph_fixture *z = node_with_a("kept_z", "{:context {:keep-turns 1}}", "z");
  cph_state_item *all = calloc(items.n + back.n, sizeof *all);
  assert_non_null(all);
  memcpy(all, items.v, items.n * sizeof *all);
  memcpy(all + items.n, back.v, back.n * sizeof *all);
  assert_int_equal(import_items(z, "a", blob, len, all, items.n + back.n, &refused), CPH_OK);
  free(all);
  k = kept(z, "a", &n);
  assert_int_equal(n, 1);
  assert_same_context(y, ky[TURNS].id, z, k[0].id);
  cph_kept_turns_free(k, n);
  cph_fixture_free(z);

  /* an owner keeping two leaves two kept contexts in the log, its newest two */
  cph_fixture *v = node_with_a("kept_v", "{:context {:keep-turns 2}}", "v");
  cph_engine_report_consumed(v->e, true);
  cph_fixture_items slots = {0};
  uint8_t *vb = answered_items(v, 0, &slots, &len);
  free(vb);
  vb = answered_items(v, TURNS, &slots, &len);
  cph_fixture_items_last_per_name(&slots);
  size_t kept_items = 0;
  for (size_t i = 0; i < slots.n; i++)
    kept_items += slots.v[i].name[0] == 'k';
  assert_int_equal(kept_items, 2);
  cph_kept_turn *kv = kept(v, "a", &n);
  assert_int_equal(n, 2);
  cph_fixture *u = node_with_a("kept_u", "{}", "u");
  assert_int_equal(import_items(u, "a", vb, len, slots.v, slots.n, &refused), CPH_OK);
  size_t nu;
  k = kept(u, "a", &nu);
  assert_int_equal(nu, 2);
  for (size_t i = 0; i < 2; i++)
    assert_same_context(v, kv[i].id, u, k[i].id);
  cph_kept_turns_free(k, nu);
  cph_kept_turns_free(kv, n);
  cph_fixture_free(u);
  free(vb);
  cph_fixture_items_free(&slots);
  cph_fixture_free(v);

  cph_kept_turns_free(ky, ny);
  cph_kept_turns_free(kx, nx);
  cph_fixture_items_free(&back);
  cph_fixture_items_free(&items);
  free(blob);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* How many of items are kept contexts ('k'), and whether one is named slot (hex of "r<n>"). */
static size_t kept_items_in(const cph_fixture_items *items, const char *slot, bool *named) {
  char name[32] = "k";
  for (size_t i = 0; slot[i] && i < 12; i++)
    snprintf(name + 1 + 2 * i, 3, "%02x", (unsigned char)slot[i]);
  size_t n = 0;
  *named = false;
  for (size_t i = 0; i < items->n; i++) {
    n += items->v[i].name[0] == 'k';
    *named |= strcmp(items->v[i].name, name) == 0;
  }
  return n;
}

/* The kept contexts' items are a ring over the session's ended turns, completed or failed
 * alike (handover_kept_item): with keep-turns 4, turns completed, failed, failed, completed,
 * failed leave the log four items — the contexts of the newest four turns, two failures of
 * one run among them — and a new owner shows exactly the old owner's four. (With a slot per
 * episode and one for the newest failure, the first failure's would have been put over.) A
 * data dir whose turn index was written before ordinals counts its rows once: its next turn
 * takes the slot its count gives. */
static void test_session_state_kept_items_ring_over_failed_turns_too(void **state) {
  (void)state;
  cph_fixture *v = node_with_a("ring_v", "{:context {:keep-turns 4}}", "v");
  cph_engine_report_consumed(v->e, true);
  cph_fixture_items items = {0};
  cph_op done;
  turn(v, "a", 0, &done);
  cph_fixture_items_take(&items, &done.u.turn.items);
  cph_op_clear_results(&done);
  failed_turn_items(v, "a", "the model timed out", &items);
  failed_turn_items(v, "a", "the model timed out again", &items);
  turn(v, "a", 1, &done);
  cph_fixture_items_take(&items, &done.u.turn.items);
  size_t len;
  uint8_t *blob = state_of(&done, &len);
  failed_turn_items(v, "a", "a tool failed", &items);
  cph_fixture_items_last_per_name(&items);
  bool named;
  assert_int_equal(kept_items_in(&items, "r1", &named), 4); /* 5 turns: slots 1 2 3 0 1 */
  assert_true(named);
  size_t nv;
  cph_kept_turn *kv = kept(v, "a", &nv);
  assert_int_equal(nv, 4);
  cph_fixture *u = node_with_a("ring_u", "{}", "u");
  uint32_t refused = 0;
  assert_int_equal(import_items(u, "a", blob, len, items.v, items.n, &refused), CPH_OK);
  assert_int_equal(refused, 0);
  size_t nu;
  cph_kept_turn *ku = kept(u, "a", &nu);
  assert_int_equal(nu, 4);
  assert_same_kept(v, kv, u, ku, 4);
  cph_kept_turns_free(ku, nu);
  cph_kept_turns_free(kv, nv);
  cph_fixture_free(u);
  free(blob);
  cph_fixture_items_free(&items);

  /* the five rows as a build before ordinals wrote them (empty values): the sixth turn
   * counts them and takes slot 6 % 4 = 2 */
  cph_engine_close(v->e);
  v->e = NULL;
  struct cph_store *st = cph_fixture_store_open(v->dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_TURN_SESSIONS, &c), CPH_OK);
  cph_key from;
  cph_key_reset(&from);
  cph_key_str(&from, "a");
  cph_val k, val;
  uint8_t keys[8][64];
  size_t lens[8], rows = 0;
  for (int rc = cph_cursor_seek(&c, &from, &k, &val); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &val)) {
    assert_true(rows < 8 && k.len <= 64);
    assert_int_equal(val.len, 8); /* written with its ordinal */
    memcpy(keys[rows], k.data, k.len);
    lens[rows++] = k.len;
  }
  cph_cursor_close(&c);
  assert_int_equal(rows, 5);
  for (size_t i = 0; i < rows; i++) {
    cph_key rk;
    cph_key_reset(&rk);
    memcpy(rk.data, keys[i], lens[i]);
    rk.len = lens[i];
    assert_int_equal(cph_txn_put(&t, CPH_DB_TURN_SESSIONS, &rk, "", 0), CPH_OK);
  }
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  cph_fixture_open(v);
  assert_int_equal(cph_engine_reply_origins(v->e, "v"), CPH_OK);
  cph_engine_report_consumed(v->e, true);
  cph_fixture_items more = {0};
  failed_turn_items(v, "a", "after the upgrade", &more);
  assert_int_equal(kept_items_in(&more, "r2", &named), 1);
  assert_true(named);
  cph_fixture_items_free(&more);
  cph_fixture_free(v);
}

/* Session "b" subscribed to channel "c" on f: `rounds` messages to "c" from five users, each
 * leased and answered (the turn's reply joins the history), every tenth turn with a memory
 * of its own ("b remembers round <i>"); the last completion's state (*len bytes). The
 * completions' items are gathered into items (NULL: dropped). */
static uint8_t *channel_rounds(cph_fixture *f, int rounds, cph_fixture_items *items,
                               size_t *len) {
  cph_op done = {0};
  for (int i = 0; i < rounds; i++) {
    char body[96], sender[16], memory[64];
    snprintf(body, sizeof body, "note %d on the build of channel c, item %d", i, i * 7 % 13);
    snprintf(sender, sizeof sender, "user%d", i % 5);
    cph_event_in ev = {0};
    ev.channel = "c";
    ev.sender = sender;
    ev.body = body;
    cph_op lease;
    post_and_lease(f, &ev, &lease);
    assert_string_equal(lease.u.lease.turn.session, "b");
    if (i)
      cph_op_clear_results(&done);
    memset(&done, 0, sizeof done);
    done.kind = CPH_OP_COMPLETE;
    done.u.turn.turn_id = lease.u.lease.turn.id;
    memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
    char reply[64];
    snprintf(reply, sizeof reply, "seen note %d", i);
    done.u.turn.reply_body = reply;
    cph_memory_in m = {0};
    snprintf(memory, sizeof memory, "b remembers round %d", i);
    m.text = memory;
    done.u.turn.memories = &m;
    done.u.turn.n_memories = i % 10 == 0;
    assert_int_equal(cph_fixture_run(f, &done), CPH_OK);
    done.u.turn.reply_body = NULL;
    done.u.turn.memories = NULL;
    done.u.turn.n_memories = 0;
    if (items)
      cph_fixture_items_take(items, &done.u.turn.items);
    cph_op_clear_results(&lease);
  }
  return state_of(&done, len);
}

/* The memory section of the next turn of "b" on f (after one more message to "c"), one line
 * per item: "kind scope text\n". */
static void next_memory_section(cph_fixture *f, char *out, size_t cap) {
  cph_event_in ev = {0};
  ev.channel = "c";
  ev.sender = "user9";
  ev.body = "what did we decide on the build?";
  cph_op lease;
  post_and_lease(f, &ev, &lease);
  const cph_turn_info *t = &lease.u.lease.turn;
  size_t at = 0;
  out[0] = '\0';
  for (size_t i = 0; i < t->n_memories && at < cap; i++)
    at += (size_t)snprintf(out + at, cap - at, "%s %s %s\n", t->memories[i].kind,
                           t->memories[i].scope, t->memories[i].text);
  assert_true(at < cap);
  cph_op_clear_results(&lease);
}

/* Version 7: the memories of the session's channels move with it — the raw memories of the
 * messages it was sent, beyond what its turns' history shows, as well as its own — so its
 * next turn on the new owner shows the memory section its next turn showed on the old one,
 * item for item and in order; an import repeated adds nothing; a memory scoped to another
 * session, or cut short, is refused, naming it, and nothing is stored. The window (1,024
 * tokens) keeps the old owner's history section within the channel entries a state moves (its
 * newest 64 a channel): with a larger one the old owner shows older messages as history, which
 * the new owner lacks as history and shows as memories instead (measured at 4,096 tokens:
 * seven such notes lead its memory section). */
static void test_session_state_moves_channel_memories(void **state) {
  (void)state;
  cph_fixture *f[2];
  static const char *const subscribe[] = {"c"};
  for (int k = 0; k < 2; k++) {
    f[k] = cph_fixture_new(k ? "chanmem_y" : "chanmem_x",
                           "{:scheduler {:lanes {:interactive {:turns 10000}}} "
                           ":sessions {:context-window-tokens 1024}}");
    cph_fixture_create_session(f[k], "b", CPH_LANE_INTERACTIVE, subscribe, 1);
    cph_engine_report_consumed(f[k]->e, true);
  }
  size_t len;
  uint8_t *blob = channel_rounds(f[0], 300, NULL, &len);
  assert_int_equal(cph_be32_get(blob + 4), 7);

  /* malformed memories: refused, named, nothing stored. The part is found by its first
   * memory: a channel scope "#c" after a kind and a flag byte. */
  static const uint8_t first[] = {0, 0, 0, 2, '#', 'c'};
  size_t p = 0;
  while (p + sizeof first <= len && memcmp(blob + p, first, sizeof first) != 0)
    p++;
  assert_true(p >= 6 && p + sizeof first <= len);
  size_t part = p - 6;
  assert_true(cph_be32_get(blob + part) > 64); /* more than versions 1 to 6 carried */
  char msg[512];
  uint8_t *bad = malloc(len);
  assert_non_null(bad);
  memcpy(bad, blob, len);
  bad[p + 5] = 'd'; /* still a channel: fine */
  bad[p + 4] = 'x'; /* "xd": neither the session nor a channel */
  assert_int_equal(import_msg(f[1], "b", bad, len, msg, sizeof msg), CPH_EINVAL);
  if (!strstr(msg, "the version-7 state of session 'b' is malformed: its memory 1 is scoped "
                   "to 'xd', neither the session nor a channel"))
    fail_msg("%s", msg);
  memcpy(bad, blob, len);
  bad[part + 5] = 2; /* the first memory's flags */
  assert_int_equal(import_msg(f[1], "b", bad, len, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "its memory 1 has kind 0 and flags 2"));
  memcpy(bad, blob, len);
  cph_be32_put(bad + part, 100000); /* more memories than the part holds */
  assert_int_equal(import_msg(f[1], "b", bad, len, msg, sizeof msg), CPH_EINVAL);
  assert_non_null(strstr(msg, "is cut short"));
  free(bad);
  char none[64];
  cph_fixture_search_lines(f[1], "b", "note", none, sizeof none);
  assert_string_equal(none, "");

  /* imported (twice: a shard taken again), the next turns show the same memories */
  for (int round = 0; round < 2; round++)
    assert_int_equal(import_msg(f[1], "b", blob, len, msg, sizeof msg), CPH_OK);
  static char was[64 * 1024], is[64 * 1024];
  next_memory_section(f[0], was, sizeof was);
  next_memory_section(f[1], is, sizeof is);
  assert_non_null(strstr(was, "raw #c note ")); /* the channel's, older than its history */
  assert_non_null(strstr(was, "raw b b remembers round "));
  /* What the old owner showed, the new one shows, in that order. It may show more after it:
   * the channel history there holds the newest entries the state moved (STATE_REPLY_SCAN),
   * fewer than the old owner's history section read, and what that section leaves of its
   * share goes to the memories. */
  if (strncmp(is, was, strlen(was)) != 0)
    fail_msg("the new owner shows:\n%.2000s\nthe old one:\n%.2000s", is, was);
  free(blob);
  cph_fixture_free(f[0]);
  cph_fixture_free(f[1]);
}


/* A state carries as many raw memories as the channel history entries it carries and 64 more
 * (up to 576 at the default window): imported again (a shard taken again, or back), it adds
 * nothing — each text it carries is looked for among as many of the scope's newest memories as
 * a state can carry, not the 320 of a smaller state. */
static void test_session_state_a_big_state_imported_twice_adds_nothing(void **state) {
  (void)state;
  cph_fixture *f[2];
  static const char *const subscribe[] = {"c"};
  for (int k = 0; k < 2; k++) {
    f[k] = cph_fixture_new(k ? "bigmem_y" : "bigmem_x",
                           "{:scheduler {:lanes {:interactive {:turns 10000}}}}");
    cph_fixture_create_session(f[k], "b", CPH_LANE_INTERACTIVE, subscribe, 1);
    cph_engine_report_consumed(f[k]->e, true);
  }
  size_t len;
  uint8_t *blob = channel_rounds(f[0], 700, NULL, &len);
  assert_int_equal(import(f[1], "b", blob, len), CPH_OK);
  int most = 0;
  size_t once = cph_fixture_scope_raw_memories(f[1], "#c", &most);
  assert_true(once > 320); /* more than the old look-up read */
  assert_int_equal(most, 1);
  assert_int_equal(import(f[1], "b", blob, len), CPH_OK);
  size_t twice = cph_fixture_scope_raw_memories(f[1], "#c", &most);
  if (twice != once || most != 1)
    fail_msg("imported twice, the state's %zu raw memories of the channel became %zu (a text "
             "%d times)", once, twice, most);
  free(blob);
  cph_fixture_free(f[0]);
  cph_fixture_free(f[1]);
}

#define ITEM_ROUNDS 70 /* more turns than a state carries (64) */
#define ITEM_SEALS 20  /* more seals than a state carries (16) */

/* Items (server/clusterflow.h 13.): every completion gives the turn record it ended and those
 * of the turns that failed since the previous completion, and every seal gives the seal, each
 * with its origin; a node that imports the last state and every item holds all of them — more
 * than a state carries — each once however often it imports them; an item that is malformed or
 * of an unknown kind is refused and counted, and the others are taken. */
static void test_session_state_items_move_what_the_state_leaves_out(void **state) {
  (void)state;
  const char *policy =
      "{:scheduler {:lanes {:interactive {:turns 10000 :tool-calls 100000 :tokens 100000000}}}}";
  cph_fixture *x = node_with_a("items_x", policy, "x"), *y = node_with_a("items_y", policy, "y");
  cph_engine_report_consumed(x->e, true);
  cph_engine_report_consumed(y->e, true);
  cph_fixture_items items = {0};
  uint8_t *blob = NULL;
  size_t len = 0;
  for (int i = 0; i < ITEM_ROUNDS; i++) {
    bool failed = i % 10 == 5;
    if (failed) {
      failed_turn(x, "a", "the model timed out");
      cph_clock_advance(&x->clock, 60 * CPH_NS_PER_S); /* past the retry's backoff */
    }
    cph_op done;
    turn(x, "a", i, &done);
    /* this completion's record, and the failed one's before it; the worker's memory; the
     * turn's kept context; its reply */
    size_t kinds[4] = {0};
    for (size_t k = 0; k < done.u.turn.items.n; k++)
      kinds[strchr("tmkr", done.u.turn.items.v[k].name[0]) - "tmkr"]++;
    assert_int_equal(done.u.turn.items.n, failed ? 5 : 4);
    assert_int_equal(kinds[0], failed ? 2 : 1);
    assert_int_equal(kinds[1], 1);
    assert_int_equal(kinds[2], 1);
    assert_int_equal(kinds[3], 1);
    cph_fixture_items_take(&items, &done.u.turn.items);
    free(blob);
    blob = state_of(&done, &len);
  }
  for (int i = 0; i < ITEM_SEALS; i++) {
    char trigger[32];
    snprintf(trigger, sizeof trigger, "seal %d", i);
    cph_op op;
    cph_fixture_seal(x, "a", trigger, &op);
    assert_int_equal(op.u.context.items.n, 1);
    assert_int_equal(op.u.context.items.v[0].name[0], 's');
    cph_fixture_items_take(&items, &op.u.context.items);
    free(blob);
    blob = op.u.context.state;
    len = op.u.context.state_len;
    op.u.context.state = NULL;
    cph_op_clear_results(&op);
  }
  size_t nx, ny, sx, sy, px, py;
  cph_turn_record *rx = records(x, "a", &nx);
  cph_seal_info *lx = seals(x, "a", &sx);
  cph_reply_info *px_ = stream(x, &px);
  assert_int_equal(nx, ITEM_ROUNDS + ITEM_ROUNDS / 10);
  assert_int_equal(sx, ITEM_SEALS);
  assert_int_equal(px, ITEM_ROUNDS);

  /* the state alone carries the newest */
  uint32_t refused = 0;
  cph_fixture *w = node_with_a("items_w", policy, "w");
  assert_int_equal(import_items(w, "a", blob, len, NULL, 0, &refused), CPH_OK);
  cph_turn_record *ry = records(w, "a", &ny);
  records_free(ry, ny);
  assert_int_equal(ny, 64);
  cph_seal_info *ly = seals(w, "a", &sy);
  cph_seals_free(ly, sy);
  assert_int_equal(sy, 16);
  cph_reply_info *pw = stream(w, &py);
  replies_free(pw, py);
  assert_int_equal(py, 64);
  cph_fixture_free(w);

  /* with the items, all of it, each once and in the order it was made in, however often */
  for (int round = 0; round < 2; round++) {
    assert_int_equal(import_items(y, "a", round ? NULL : blob, len, items.v, items.n, &refused),
                     CPH_OK);
    assert_int_equal(refused, 0);
    ry = records(y, "a", &ny);
    assert_int_equal(ny, nx);
    for (size_t i = 0; i < nx; i++) {
      assert_int_equal(origin_count(y, "a", rx[i].origin), 1);
      assert_string_equal(ry[i].origin, rx[i].origin);
      assert_string_equal(ry[i].state, rx[i].state);
    }
    records_free(ry, ny);
    ly = seals(y, "a", &sy);
    assert_int_equal(sy, sx);
    for (size_t i = 0; i < sx; i++)
      assert_int_equal(seal_origin_count(y, "a", lx[i].origin), 1);
    cph_seals_free(ly, sy);
    /* every reply, once, in the order x wrote them, offered by GET /v1/replies */
    cph_reply_info *py_ = stream(y, &py);
    assert_int_equal(py, px);
    for (size_t i = 0; i < px; i++) {
      assert_string_equal(py_[i].origin, px_[i].origin);
      assert_string_equal(py_[i].body, px_[i].body);
      assert_string_equal(py_[i].channel, px_[i].channel);
      assert_int_equal(py_[i].ts_ms, px_[i].ts_ms);
    }
    replies_free(py_, py);
    assert_int_equal(cph_engine_last_reply_id(y->e), px);
  }

  /* bad items: refused, counted; the good one among them taken */
  cph_fixture *z = node_with_a("items_z", policy, "z");
  uint8_t junk[20] = "CPHI-not-an-item";
  cph_state_item bad[4] = {{"tjunk", junk, sizeof junk}, items.v[0], items.v[1], items.v[2]};
  uint8_t *kind = malloc(items.v[1].len);
  assert_non_null(kind);
  memcpy(kind, items.v[1].data, items.v[1].len);
  kind[12] = 'z'; /* an unknown kind */
  bad[2].data = kind;
  bad[3].len -= 5; /* cut short */
  assert_int_equal(import_items(z, "a", NULL, 0, bad, 4, &refused), CPH_OK);
  assert_int_equal(refused, 3);
  assert_int_equal(origin_count(z, "a", rx[nx - 1].origin), 1); /* items.v[0]: the oldest */
  size_t nz;
  cph_turn_record *rz = records(z, "a", &nz);
  assert_int_equal(nz, 1);
  records_free(rz, nz);
  free(kind);
  cph_fixture_free(z);

  records_free(rx, nx);
  cph_seals_free(lx, sx);
  replies_free(px_, px);
  cph_fixture_items_free(&items);
  free(blob);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* How many memories of session b's own scope on f say "b remembers round <10 i>", per i in
 * [0, rounds), with the creation time of the last found (created[i], when given). */
static void remembered(cph_fixture *f, int rounds, int *count, int64_t *created) {
  cph_op op;
  cph_fixture_search(f, "b", "remembers round", 1000, &op);
  memset(count, 0, (size_t)rounds * sizeof *count);
  for (size_t i = 0; i < op.u.search.n_hits; i++) {
    const cph_memory_hit *h = &op.u.search.hits[i];
    int round = -1, end = 0;
    if (strcmp(h->session, "b") != 0 ||
        sscanf(h->text, "b remembers round %d%n", &round, &end) != 1 || h->text[end] ||
        round < 0 || round % 10 || round / 10 >= rounds)
      fail_msg("search found '%s' of scope '%s'", h->text, h->session);
    count[round / 10]++;
    if (created)
      created[round / 10] = h->created_ms;
  }
  cph_op_clear_results(&op);
}

/* A worker's memories the state carries too are stored in the state's place among its
 * memories; when the state is refused (cut short here) they are stored all the same, as every
 * item is whatever its state: 40 rounds, 4 memories of the worker, all in the state. */
static void test_session_state_memory_items_stay_when_the_state_is_refused(void **state) {
  (void)state;
  cph_fixture *f[2];
  static const char *const subscribe[] = {"c"};
  static const char *const names[] = {"refused_x", "refused_y"};
  for (int k = 0; k < 2; k++) {
    f[k] = cph_fixture_new(names[k], "{:scheduler {:lanes {:interactive {:turns 10000}}}}");
    cph_fixture_create_session(f[k], "b", CPH_LANE_INTERACTIVE, subscribe, 1);
    cph_engine_report_consumed(f[k]->e, true);
    assert_int_equal(cph_engine_reply_origins(f[k]->e, k ? "y" : "x"), CPH_OK);
  }
  cph_fixture_items items = {0};
  size_t len;
  uint8_t *blob = channel_rounds(f[0], 40, &items, &len);
  int count[4];
  uint32_t refused = 9;
  assert_int_equal(import_items(f[1], "b", blob, len - 3, items.v, items.n, &refused),
                   CPH_EINVAL);
  assert_int_equal(refused, 0);
  remembered(f[1], 4, count, NULL);
  for (int i = 0; i < 4; i++)
    if (count[i] != 1)
      fail_msg("'b remembers round %d' found %d times after the state was refused", i * 10,
               count[i]);
  free(blob);
  cph_fixture_items_free(&items);
  cph_fixture_free(f[0]);
  cph_fixture_free(f[1]);
}

#define MEMORY_ROUNDS 800 /* channel messages: their raw memories push the worker's out of what
                           * the state carries (512 history entries read, so 544 raw memories) */

/* Items: every completion gives the memories its worker minted, so a session whose channels
 * minted more than a state carries (the newest raw memories over its scopes: 32 more than the
 * history entries it carries) still moves
 * every one of its worker's memories — the state alone leaves the older ones behind —, each
 * once however often it is imported, with the time it was made; a memory item of another
 * scope, or without an origin in its name, is refused and counted. */
static void test_session_state_items_move_the_workers_memories(void **state) {
  (void)state;
  cph_fixture *f[3];
  static const char *const subscribe[] = {"c"};
  static const char *const names[] = {"wmem_x", "wmem_y", "wmem_w"};
  for (int k = 0; k < 3; k++) {
    f[k] = cph_fixture_new(names[k], "{:scheduler {:lanes {:interactive {:turns 10000}}}}");
    cph_fixture_create_session(f[k], "b", CPH_LANE_INTERACTIVE, subscribe, 1);
    cph_engine_report_consumed(f[k]->e, true);
    assert_int_equal(cph_engine_reply_origins(f[k]->e, names[k] + 5), CPH_OK); /* "x", ... */
  }
  cph_fixture_items items = {0};
  size_t len;
  uint8_t *blob = channel_rounds(f[0], MEMORY_ROUNDS, &items, &len);
  const int rounds = MEMORY_ROUNDS / 10; /* the worker's memories */
  int count[MEMORY_ROUNDS / 10], was_count[MEMORY_ROUNDS / 10];
  int64_t created[MEMORY_ROUNDS / 10], was[MEMORY_ROUNDS / 10];
  remembered(f[0], rounds, was_count, was);
  size_t n_memory_items = 0;
  for (size_t i = 0; i < items.n; i++)
    n_memory_items += items.v[i].name[0] == 'm';
  assert_int_equal(n_memory_items, rounds);
  for (int i = 0; i < rounds; i++)
    assert_int_equal(was_count[i], 1);

  /* the state alone: the oldest of them stay behind */
  assert_int_equal(import(f[2], "b", blob, len), CPH_OK);
  remembered(f[2], rounds, count, NULL);
  assert_int_equal(count[0], 0);
  assert_int_equal(count[rounds - 1], 1);

  /* with the items: every one, once, made when it was made, however often imported */
  for (int round = 0; round < 2; round++) {
    uint32_t refused = 9;
    assert_int_equal(import_items(f[1], "b", blob, len, items.v, items.n, &refused), CPH_OK);
    assert_int_equal(refused, 0);
    remembered(f[1], rounds, count, created);
    for (int i = 0; i < rounds; i++) {
      if (count[i] != 1)
        fail_msg("import %d: 'b remembers round %d' found %d times", round + 1, i * 10,
                 count[i]);
      assert_true(created[i] == was[i]);
    }
  }

  /* a memory item of another scope, or whose name carries no origin: refused, counted */
  size_t m = 0;
  while (items.v[m].name[0] != 'm')
    m++;
  cph_fixture_create_session(f[2], "d", CPH_LANE_INTERACTIVE, subscribe, 1);
  uint32_t refused = 0;
  assert_int_equal(import_items(f[2], "d", NULL, 0, &items.v[m], 1, &refused), CPH_OK);
  assert_int_equal(refused, 1);
  cph_state_item unnamed = items.v[m];
  unnamed.name = "m";
  assert_int_equal(import_items(f[2], "b", NULL, 0, &unnamed, 1, &refused), CPH_OK);
  assert_int_equal(refused, 1);
  remembered(f[2], rounds, count, NULL);
  assert_int_equal(count[0], 0);

  cph_fixture_items_free(&items);
  free(blob);
  for (int k = 0; k < 3; k++)
    cph_fixture_free(f[k]);
}

/* Gathers a maintenance completion's items (cph_fixture_run_maintenance): those of session
 * "a" only. */
static void take_job_items(cph_op *done, void *ctx) {
  if (!done->u.turn.job_items.session)
    return;
  assert_string_equal(done->u.turn.job_items.session, "a");
  cph_fixture_items_take(ctx, &done->u.turn.job_items.items);
}

/* Session "a"'s memories on f that a search for "memory" finds: how many of kind summary, and
 * the id of the one with this text (0: none). */
static uint64_t memory_find(cph_fixture *f, const char *text, int *summaries) {
  cph_op op;
  cph_fixture_search(f, "a", "memory", 100, &op);
  uint64_t id = 0;
  *summaries = 0;
  for (size_t i = 0; i < op.u.search.n_hits; i++) {
    *summaries += strcmp(op.u.search.hits[i].kind, "summary") == 0;
    if (strcmp(op.u.search.hits[i].text, text) == 0)
      id = op.u.search.hits[i].id;
  }
  cph_op_clear_results(&op);
  return id;
}

/* Nodes x and y of a cluster (report_consumed, reply origins), tagged <tag>_x and <tag>_y,
 * each with session "a" and the janitor, compacting raw memories min_age_hours old (and
 * however often read) on a gc_plan every minute. */
static void janitor_nodes(const char *tag, int min_age_hours, cph_fixture **x, cph_fixture **y) {
  char policy[192];
  snprintf(policy, sizeof policy,
           "{:sessions {:janitor? true}"
           " :gc {:min-age-hours %d :max-access 1000000 :plan-interval-s 60}"
           " :scheduler {:lanes {:interactive {:turns 10000}}}}",
           min_age_hours);
  for (int k = 0; k < 2; k++) {
    char name[32];
    snprintf(name, sizeof name, "%s_%s", tag, k ? "y" : "x");
    cph_fixture *f = node_with_a(name, policy, k ? "y" : "x");
    cph_engine_report_consumed(f->e, true);
    *(k ? y : x) = f;
  }
}

/* Maintenance jobs do not move, and need not: each is the node's own work on what it holds
 * (its embeddings, its compaction, its outbox, its retention). x minted "a"'s memories and
 * had embedded none, nor compacted them, when y took the session over (with x's jobs still
 * queued there); y's own maintenance embeds what it imported (adopted memories are queued)
 * and compacts it on its schedule (adopted memories carry no plan lock and their ages), so
 * y's memory search shows the summary in place of the six. */
static void test_session_state_the_new_owner_does_the_maintenance_again(void **state) {
  (void)state;
  cph_fixture *x, *y;
  janitor_nodes("maintmove", 0, &x, &y);
  cph_fixture_items items = {0};
  size_t len;
  uint8_t *blob = turns_items(x, 0, 6, &items, &len);
  cph_maint_stats st;
  cph_engine_maint_stats(x->e, &st);
  assert_true(st.embed_queue >= 6); /* x's embed jobs, never run: x "died" */
  uint32_t refused = 0;
  assert_int_equal(import_items(y, "a", blob, len, items.v, items.n, &refused), CPH_OK);
  assert_int_equal(refused, 0);
  int summaries;
  for (int i = 0; i < 6; i++) {
    char text[32];
    snprintf(text, sizeof text, "memory %d of a", i);
    assert_true(memory_find(y, text, &summaries) > 0);
  }
  cph_engine_maint_stats(y->e, &st);
  assert_true(st.embed_queue >= 6);
  cph_clock_advance(&y->clock, 61 * CPH_NS_PER_S); /* y's gc_plan is due */
  cph_fixture_run_maintenance(y, NULL, NULL);
  cph_engine_maint_stats(y->e, &st);
  assert_int_equal(st.embed_queue, 0);
  assert_true(st.groups_committed_total >= 1);
  for (int i = 0; i < 6; i++) {
    char text[32];
    snprintf(text, sizeof text, "memory %d of a", i);
    if (memory_find(y, text, &summaries) > 0)
      fail_msg("'%s' was not compacted on the new owner", text);
  }
  assert_true(summaries >= 1);
  cph_fixture_items_free(&items);
  free(blob);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* The automatic plan reads memories in id order and stops at the first one minted here that
 * is too young; memories adopted from another node get new ids here but keep their ages, so
 * it reads those past that point too (memory_adopted_from). y mints memories of its own (young
 * at :min-age-hours 1), then adopts x's six, two hours old: its plan compacts x's and leaves
 * its own. Without the second read none of x's would be planned until y's own were an hour
 * old. */
static void test_session_state_adopted_memories_are_planned_by_their_age(void **state) {
  (void)state;
  cph_fixture *x, *y;
  janitor_nodes("agedplan", 1, &x, &y);
  cph_fixture_items items = {0};
  size_t len;
  free(turns_items(x, 0, 6, &items, &len));
  enum { ITEM_HEAD = 13 }; /* "CPHI", be32 version, be32 store schema, the kind byte */
  size_t aged = 0;
  for (size_t i = 0; i < items.n; i++) {
    cph_state_item *it = &items.v[i];
    if (it->name[0] != 'm')
      continue;
    cph_memory_rec m;
    cph_err err = {0};
    assert_int_equal(cph_record_decode(&cph_memory_desc, it->data + ITEM_HEAD,
                                       it->len - ITEM_HEAD, &m, &err), CPH_OK);
    m.created_ms -= 2 * 3600 * 1000;
    cph_buf b = {0};
    cph_buf_append(&b, it->data, ITEM_HEAD);
    assert_int_equal(cph_record_encode(&cph_memory_desc, &m, &b), CPH_OK);
    cph_record_free(&cph_memory_desc, &m);
    free(it->data);
    it->len = b.len;
    it->data = (uint8_t *)cph_buf_steal(&b);
    aged++;
  }
  assert_int_equal(aged, 6);
  cph_op done;
  turn(y, "a", 100, &done); /* y's own memories, minted now: lower ids than x's will get */
  cph_op_clear_results(&done);
  uint32_t refused = 0;
  assert_int_equal(import_items(y, "a", NULL, 0, items.v, items.n, &refused), CPH_OK);
  assert_int_equal(refused, 0);
  cph_clock_advance(&y->clock, 61 * CPH_NS_PER_S); /* y's gc_plan is due */
  cph_fixture_run_maintenance(y, NULL, NULL);
  int summaries;
  for (int i = 0; i < 6; i++) {
    char text[32];
    snprintf(text, sizeof text, "memory %d of a", i);
    if (memory_find(y, text, &summaries) > 0)
      fail_msg("'%s', two hours old, was not compacted on the node that adopted it", text);
  }
  assert_int_equal(summaries, 1);
  assert_true(memory_find(y, "memory 100 of a", &summaries) > 0); /* young: stays */
  cph_fixture_items_free(&items);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

/* Compaction moves too: a gc_commit of a session's own memories gives the session's items — its
 * summary, and its sources tombstoned under the keys their items had. A node that takes the
 * session over from then on holds the summary and not the sources; one that had taken the
 * sources over before tombstones its copies (their embeddings' vector deletes queued on its
 * outbox, which drains); again and again, nothing changes. It fails without
 * the gc's items, or without the tombstoning of copies held (checked). */
static void test_session_state_items_carry_what_compaction_did(void **state) {
  (void)state;
  const char *policy = "{:sessions {:janitor? true} :gc {:min-age-hours 1000}"
                       " :scheduler {:lanes {:interactive {:turns 10000}}}}";
  cph_fixture *x = node_with_a("gcitems_x", policy, "x"), *y = node_with_a("gcitems_y", policy, "y");
  cph_fixture *w = node_with_a("gcitems_w", policy, "w");
  cph_fixture *nodes[] = {x, y, w};
  for (int k = 0; k < 3; k++)
    cph_engine_report_consumed(nodes[k]->e, true);
  cph_fixture_items items = {0};
  size_t len;
  uint8_t *blob = turns_items(x, 0, 6, &items, &len);
  cph_op done;
  uint32_t refused = 0;
  assert_int_equal(import_items(y, "a", blob, len, items.v, items.n, &refused), CPH_OK);
  int summaries;
  assert_true(memory_find(y, "memory 0 of a", &summaries) > 0);
  cph_fixture_run_maintenance(y, NULL, NULL); /* y embeds its copies */

  /* x compacts memories 0 to 2 of "a" */
  char args[96];
  uint64_t ids[3];
  for (int i = 0; i < 3; i++) {
    char text[32];
    snprintf(text, sizeof text, "memory %d of a", i);
    assert_true((ids[i] = memory_find(x, text, &summaries)) > 0);
  }
  snprintf(args, sizeof args, "sources=%llu,%llu,%llu", (unsigned long long)ids[0],
           (unsigned long long)ids[1], (unsigned long long)ids[2]);
  cph_op job = {0};
  job.kind = CPH_OP_JOB_ENQUEUE;
  job.u.job.in.job = "gc_plan";
  job.u.job.in.args = args;
  assert_int_equal(cph_fixture_run(x, &job), CPH_OK);
  cph_fixture_items gc = {0};
  cph_fixture_run_maintenance(x, take_job_items, &gc);
  assert_int_equal(gc.n, 4); /* three tombstones and the summary */
  assert_int_equal(memory_find(x, "memory 0 of a", &summaries), 0);
  assert_int_equal(summaries, 1);
  turn(x, "a", 6, &done); /* its state no longer carries the sources */
  cph_fixture_items_take(&items, &done.u.turn.items);
  free(blob);
  blob = state_of(&done, &len);
  cph_state_items moved = {gc.v, gc.n};
  cph_fixture_items_take(&items, &moved); /* the gc's after the completions' */
  gc = (cph_fixture_items){0};

  /* a new owner holds the summary, not its sources; the previous one tombstones its copies */
  for (int round = 0; round < 2; round++)
    for (int k = 1; k < 3; k++) {
      assert_int_equal(import_items(nodes[k], "a", blob, len, items.v, items.n, &refused),
                       CPH_OK);
      assert_int_equal(refused, 0);
      for (int i = 0; i < 7; i++) {
        char text[32];
        snprintf(text, sizeof text, "memory %d of a", i);
        if ((memory_find(nodes[k], text, &summaries) > 0) != (i >= 3))
          fail_msg("node %d, import %d: '%s' is%s found", k, round + 1, text,
                   i >= 3 ? " not" : "");
      }
      assert_int_equal(summaries, 1);
    }
  /* y's copies were embedded: their vectors' deletes wait on its outbox, and drain */
  cph_maint_stats st;
  cph_engine_maint_stats(y->e, &st);
  assert_int_equal(st.outbox_pending, 3);
  cph_fixture_run_maintenance(y, NULL, NULL);
  cph_engine_maint_stats(y->e, &st);
  assert_int_equal(st.outbox_pending, 0);
  cph_fixture_items_free(&items);
  free(blob);
  for (int k = 0; k < 3; k++)
    cph_fixture_free(nodes[k]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_session_state_moves_tree_episode_replies_and_memories),
      cmocka_unit_test(test_session_state_offers_the_replies_stream_once_by_origin),
      cmocka_unit_test(test_session_state_carries_turn_records_once_by_origin),
      cmocka_unit_test(test_session_state_carries_seals_once_by_origin),
      cmocka_unit_test(test_session_state_versions_2_to_5_load_and_bad_records_are_named),
      cmocka_unit_test(test_session_state_is_not_exported_without_report_consumed),
      cmocka_unit_test(test_session_state_moves_channel_history),
      cmocka_unit_test(test_session_state_history_keeps_the_newest_within_its_bound),
      cmocka_unit_test(test_session_state_history_carries_what_a_turn_could_show),
      cmocka_unit_test(test_session_state_an_older_state_of_this_nodes_line_keeps_the_tree),
      cmocka_unit_test(test_session_state_memory_items_stay_when_the_state_is_refused),
      cmocka_unit_test(test_session_state_kept_contexts_move_as_items),
      cmocka_unit_test(test_session_state_kept_items_ring_over_failed_turns_too),
      cmocka_unit_test(test_session_state_moves_channel_memories),
      cmocka_unit_test(test_session_state_a_big_state_imported_twice_adds_nothing),
      cmocka_unit_test(test_session_state_items_move_what_the_state_leaves_out),
      cmocka_unit_test(test_session_state_items_move_the_workers_memories),
      cmocka_unit_test(test_session_state_items_carry_what_compaction_did),
      cmocka_unit_test(test_session_state_the_new_owner_does_the_maintenance_again),
      cmocka_unit_test(test_session_state_adopted_memories_are_planned_by_their_age),
      cmocka_unit_test(test_session_state_import_keeps_a_running_turn_running),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
