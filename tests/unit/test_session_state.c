/* A session's state for the cluster log (include/cephalon/cephalon.h: u.turn.state and
 * CPH_OP_SESSION_STATE; server/clusterflow.h 11.): with report_consumed on, a completion exports
 * the session's tree, episode, credits, recent replies and memories; another engine's session
 * that imports it shows the same tree and episode, the replies in its channel's history once
 * (an import repeated adds nothing), the memories once; a malformed blob is refused and changes
 * nothing. With reply origins on (cluster mode) the state carries the session's replies stream
 * and the importing engine adds each origin it lacks to its own stream, once. Off, nothing is
 * exported, and replies have no origin. */
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
#include "tests/support/engine_fixture.h"

#define TURNS 3

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
  cph_op in;
  cph_fixture_ingest(f, &ev, 1, &in);
  cph_op_clear_results(&in);
  cph_op lease;
  cph_fixture_lease(f, "w", &lease);
  memset(done, 0, sizeof *done);
  done->kind = CPH_OP_COMPLETE;
  done->u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(done->u.turn.lease, lease.u.lease.turn.lease, sizeof done->u.turn.lease);
  done->u.turn.reply_body = strdup(reply);
  cph_memory_in m = {0};
  m.text = memory;
  done->u.turn.memories = &m;
  done->u.turn.n_memories = 1;
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
  cph_op op = {0};
  op.kind = CPH_OP_MEMORY_SEARCH;
  op.u.search.session = (char *)s;
  op.u.search.query = "memory";
  op.u.search.k = 100;
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  int count = 0;
  for (size_t i = 0; i < op.u.search.n_hits; i++)
    count += strcmp(op.u.search.hits[i].text, text) == 0;
  cph_op_clear_results(&op);
  return count;
}

static int import(cph_fixture *f, const char *s, const uint8_t *data, size_t len) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_STATE;
  op.u.state.session = (char *)s;
  op.u.state.data = data;
  op.u.state.len = len;
  int rc = cph_fixture_run(f, &op);
  cph_op_clear_results(&op);
  return rc;
}

/* The replies of the next lease's messages that are "reply <i> of a", each counted. */
static void lease_shows_replies(cph_fixture *f, int times[TURNS]) {
  cph_event_in ev = {0};
  ev.session = "a";
  ev.sender = "ann";
  ev.body = "one more question";
  cph_op in;
  cph_fixture_ingest(f, &ev, 1, &in);
  cph_op_clear_results(&in);
  cph_op lease;
  cph_fixture_lease(f, "w", &lease);
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

static void test_session_state_moves_tree_episode_replies_and_memories(void **state) {
  (void)state;
  cph_fixture *from = cph_fixture_new("state_from", "{}");
  cph_fixture *to = cph_fixture_new("state_to", "{}");
  cph_fixture_create_session(from, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_fixture_create_session(to, "a", CPH_LANE_INTERACTIVE, NULL, 0);
  cph_engine_report_consumed(from->e, true);
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

static void test_session_state_offers_the_replies_stream_once_by_origin(void **state) {
  (void)state;
  cph_fixture *x = cph_fixture_new("stream_x", "{}");
  cph_fixture *y = cph_fixture_new("stream_y", "{}");
  cph_fixture *fx[2] = {x, y};
  for (int k = 0; k < 2; k++) {
    cph_fixture_create_session(fx[k], "a", CPH_LANE_INTERACTIVE, NULL, 0);
    cph_engine_report_consumed(fx[k]->e, true);
    assert_int_equal(cph_engine_reply_origins(fx[k]->e, k ? "y" : "x"), CPH_OK);
  }
  cph_op done;
  for (int i = 0; i < TURNS; i++) {
    turn(x, "a", i, &done);
    if (i < TURNS - 1)
      cph_op_clear_results(&done);
  }
  size_t len;
  uint8_t *blob = state_of(&done, &len);
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
  cph_fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_session_state_moves_tree_episode_replies_and_memories),
      cmocka_unit_test(test_session_state_offers_the_replies_stream_once_by_origin),
      cmocka_unit_test(test_session_state_is_not_exported_without_report_consumed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
