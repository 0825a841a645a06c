/* A schema-5 data directory under this build (schema 6, store/store.h): its kept turn
 * contexts, their refs entries and their rows lie in three databases ("turn_contexts",
 * "turn_row_refs", "turn_rows", keyed session\0 u64), which schema 6 holds as one
 * ("turn_kept", core/turnlog.c, Keys). A live directory written back in schema 5's form must
 * be refused by a plain store open, migrate through the engine with the three left empty, and
 * then show every kept turn as the original does — the same turns, messages and nodes — and
 * both must go on alike: more turns kept and trimmed the same way from the migrated rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "cephalon/policy.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"

static const char *POLICY = "{:sessions {:janitor? false :max-queue 1000}\n"
                            " :store {:sync :none}\n"
                            " :context {:keep-turns 4}}\n";

#define SESSIONS 3

/* Session s's id, "s<s>" (a static buffer: used before the next call). */
static const char *sid(int s) {
  static char id[8];
  snprintf(id, sizeof id, "s%d", s);
  return id;
}

/* Creates sessions s0..s<SESSIONS - 1> on f. */
static void create_sessions(cph_fixture *f) {
  for (int s = 0; s < SESSIONS; s++)
    cph_fixture_create_session(f, sid(s), CPH_LANE_INTERACTIVE, NULL, 0);
}

/* Session s's turn i: a question, its lease, a reply and a memory. */
static void turn(cph_fixture *f, const char *s, int i) {
  char body[64], reply[96], memory[64];
  snprintf(body, sizeof body, "question %d for %s", i, s);
  snprintf(reply, sizeof reply, "reply %d of %s, which the next turns show as history", i, s);
  snprintf(memory, sizeof memory, "memory %d of %s", i, s);
  cph_event_in ev = {.session = (char *)s, .sender = "ann", .body = body};
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S); /* the session's credits refill */
  cph_op in;
  cph_fixture_ingest(f, &ev, 1, &in);
  cph_op_clear_results(&in);
  cph_op lease;
  cph_fixture_lease(f, "w", &lease);
  assert_string_equal(lease.u.lease.turn.session, s);
  cph_op done = {.kind = CPH_OP_COMPLETE};
  done.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
  done.u.turn.reply_body = reply;
  cph_memory_in m = {.text = memory};
  done.u.turn.memories = &m;
  done.u.turn.n_memories = 1;
  assert_int_equal(cph_fixture_run(f, &done), CPH_OK);
  done.u.turn.reply_body = NULL;
  done.u.turn.memories = NULL;
  done.u.turn.n_memories = 0;
  cph_op_clear_results(&done);
  cph_op_clear_results(&lease);
}

static void rounds(cph_fixture *f, int from, int to) {
  for (int i = from; i < to; i++)
    for (int s = 0; s < SESSIONS; s++)
      turn(f, sid(s), i);
}

static void same_str(const char *a, const char *b, const char *what, uint64_t turn) {
  if ((a == NULL) != (b == NULL) || (a && strcmp(a, b) != 0))
    fail_msg("turn %llu: %s differs: \"%s\" against \"%s\"", (unsigned long long)turn, what,
             a ? a : "(null)", b ? b : "(null)");
}

/* Session s's kept turns read through a and b are the same: ids, and each turn's messages,
 * their nodes and the tree. Returns how many turns it compared. */
static size_t same_kept(cph_fixture *a, cph_fixture *b, const char *s) {
  cph_kept_turn *ta, *tb;
  size_t na, nb;
  cph_err err;
  assert_int_equal(cph_engine_kept_turns(a->e, s, &ta, &na, &err), CPH_OK);
  assert_int_equal(cph_engine_kept_turns(b->e, s, &tb, &nb, &err), CPH_OK);
  assert_int_equal(na, nb);
  for (size_t i = 0; i < na; i++) {
    assert_int_equal(ta[i].id, tb[i].id);
    assert_int_equal(ta[i].n_messages, tb[i].n_messages);
    cph_turn_context ca = {0}, cb = {0};
    if (cph_engine_turn_context(a->e, s, ta[i].id, &ca, &err) != CPH_OK)
      fail_msg("original, turn %llu of %s: %s", (unsigned long long)ta[i].id, s, err.msg);
    if (cph_engine_turn_context(b->e, s, tb[i].id, &cb, &err) != CPH_OK)
      fail_msg("migrated, turn %llu of %s: %s", (unsigned long long)tb[i].id, s, err.msg);
    assert_int_equal(ca.n_messages, cb.n_messages);
    assert_true(ca.n_messages >= 2); /* the system prompt's core and the question at least */
    for (size_t m = 0; m < ca.n_messages; m++) {
      same_str(ca.messages[m].role, cb.messages[m].role, "a message's role", ta[i].id);
      same_str(ca.messages[m].content, cb.messages[m].content, "a message's content", ta[i].id);
      same_str(ca.messages[m].coord, cb.messages[m].coord, "a message's coordinate", ta[i].id);
      assert_int_equal(ca.message_nodes[m], cb.message_nodes[m]);
    }
    assert_int_equal(ca.n_nodes, cb.n_nodes);
    for (size_t n = 0; n < ca.n_nodes; n++) {
      assert_int_equal(ca.nodes[n].id, cb.nodes[n].id);
      same_str(ca.nodes[n].at, cb.nodes[n].at, "a node's coordinate", ta[i].id);
      same_str(ca.nodes[n].content, cb.nodes[n].content, "a node's content", ta[i].id);
    }
    cph_turn_context_free(&ca);
    cph_turn_context_free(&cb);
  }
  cph_kept_turns_free(ta, na);
  cph_kept_turns_free(tb, nb);
  return na;
}

/* Writes dir back as schema 5 held it: every entry of turn_kept into the database of its kind,
 * keyed session\0 u64, and schema version 5; with bad_key, also a row whose key is a session
 * id and three bytes, not eight. Returns how many entries it moved. */
static size_t write_schema5(const char *dir, bool bad_key) {
  cph_store *st = cph_fixture_store_open(dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_TURN_KEPT, &c), CPH_OK);
  size_t moved = 0;
  cph_val k, v;
  for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    size_t n = strnlen(k.data, k.len);
    const uint8_t *p = k.data;
    assert_true(n + 10 <= k.len);
    cph_db db = p[n + 1] == 'r'            ? CPH_DB_TURN_ROWS
                : k.len == n + 10          ? CPH_DB_TURN_CONTEXTS
                                           : CPH_DB_TURN_ROW_REFS;
    cph_key old;
    cph_key_reset(&old);
    memcpy(old.data, p, n + 1);
    memcpy(old.data + n + 1, p + n + 2, 8);
    old.len = n + 9;
    uint8_t *copy = malloc(v.len ? v.len : 1);
    assert_non_null(copy);
    memcpy(copy, v.data, v.len);
    assert_int_equal(cph_txn_put(&t, db, &old, copy, v.len), CPH_OK);
    free(copy);
    moved++;
  }
  cph_cursor_close(&c);
  assert_int_equal(cph_txn_empty(&t, CPH_DB_TURN_KEPT), CPH_OK);
  if (bad_key) {
    cph_key bad;
    cph_key_reset(&bad);
    memcpy(bad.data, "s0\0xyz", 6);
    bad.len = 6;
    assert_int_equal(cph_txn_put(&t, CPH_DB_TURN_ROWS, &bad, "x", 1), CPH_OK);
  }
  cph_key sk;
  cph_key_reset(&sk);
  memcpy(sk.data, "schema_version", 14);
  sk.len = 14;
  uint8_t v5[4] = {0, 0, 0, 5};
  assert_int_equal(cph_txn_put(&t, CPH_DB_META, &sk, v5, sizeof v5), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  return moved;
}

static bool count_entry(void *ctx, const void *key, size_t key_len, const void *val,
                        size_t val_len) {
  (void)key, (void)key_len, (void)val, (void)val_len;
  ++*(size_t *)ctx;
  return true;
}

static size_t entries(const char *dir, cph_db db) {
  size_t n = 0;
  cph_fixture_store_each(dir, db, count_entry, &n);
  return n;
}

/* How many entries db of a schema-5 data dir holds, read without migrating it: the store
 * runs a "migration" that counts and declines, so nothing is written. */
typedef struct counting {
  cph_db db;
  size_t n;
} counting;

static int count_and_decline(void *ctx, uint32_t found, cph_txn *t, cph_err *err) {
  counting *c = ctx;
  assert_int_equal(found, 5);
  assert_int_equal(cph_txn_count(t, c->db, &c->n), CPH_OK);
  return cph_err_set(err, CPH_EINVAL, "only counting");
}

static size_t entries5(const char *dir, cph_db db) {
  counting c = {db, 0};
  cph_store_migration m = {5, count_and_decline, &c};
  cph_store_options o = {dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st = NULL;
  cph_err err;
  assert_int_equal(cph_store_open_migrating(&o, &m, &st, &err), CPH_EINVAL);
  assert_null(st);
  return c.n;
}

static void test_a_schema5_data_dir_opens_and_shows_the_same_kept_turns(void **state) {
  (void)state;
  cph_fixture *a = cph_fixture_new("schema5-a", POLICY);
  create_sessions(a);
  rounds(a, 0, 7); /* past :keep-turns 4: some turns trimmed, their rows with them */
  cph_engine_close(a->e);
  a->e = NULL;
  size_t kept = entries(a->dir, CPH_DB_TURN_KEPT);

  cph_fixture *b = cph_fixture_new("schema5-b", POLICY);
  cph_engine_close(b->e);
  b->e = NULL;
  cph_fixture_copy_store(a, b);
  assert_int_equal(write_schema5(b->dir, false), kept);
  assert_int_equal(entries5(b->dir, CPH_DB_TURN_CONTEXTS), SESSIONS * 4);
  assert_int_equal(entries5(b->dir, CPH_DB_TURN_ROW_REFS), SESSIONS * 4);
  assert_true(entries5(b->dir, CPH_DB_TURN_ROWS) > SESSIONS * 4);
  cph_fixture_expect_schema(b->dir, 5); /* only the engine migrates */

  b->clock = a->clock;
  cph_fixture_open(a);
  cph_fixture_open(b); /* migrates */
  for (int s = 0; s < SESSIONS; s++)
    assert_int_equal(same_kept(a, b, sid(s)), 4);

  cph_engine_close(b->e);
  b->e = NULL;
  assert_int_equal(entries(b->dir, CPH_DB_TURN_CONTEXTS), 0);
  assert_int_equal(entries(b->dir, CPH_DB_TURN_ROW_REFS), 0);
  assert_int_equal(entries(b->dir, CPH_DB_TURN_ROWS), 0);
  assert_int_equal(entries(b->dir, CPH_DB_TURN_KEPT), kept);
  cph_fixture_open(b);

  /* more turns on both: kept from the migrated rows (the warm state rebuilt from them after
   * the restart) and trimmed alike, so both hold the same entries */
  rounds(a, 7, 12);
  rounds(b, 7, 12);
  for (int s = 0; s < SESSIONS; s++)
    assert_int_equal(same_kept(a, b, sid(s)), 4);
  cph_engine_close(a->e);
  a->e = NULL;
  cph_engine_close(b->e);
  b->e = NULL;
  assert_int_equal(entries(a->dir, CPH_DB_TURN_KEPT), entries(b->dir, CPH_DB_TURN_KEPT));
  cph_fixture_free(a);
  cph_fixture_free(b);
}

/* A schema-5 entry whose key is not a session id and a number stops the migration with an
 * error that names the database, and changes nothing: the data dir stays schema 5. */
static void test_a_corrupt_schema5_key_stops_the_migration(void **state) {
  (void)state;
  cph_fixture *a = cph_fixture_new("schema5-bad", POLICY);
  create_sessions(a);
  rounds(a, 0, 2);
  cph_engine_close(a->e);
  a->e = NULL;
  write_schema5(a->dir, true);
  size_t rows = entries5(a->dir, CPH_DB_TURN_ROWS);
  cph_policy *policy = NULL;
  cph_err err = {0};
  assert_true(rows >= 2);
  assert_int_equal(cph_policy_load_text("test", POLICY, strlen(POLICY), &policy, &err), CPH_OK);
  cph_engine_options o = {.data_dir = a->dir};
  cph_engine *e = NULL;
  assert_int_equal(cph_engine_open(policy, &o, &e, &err), CPH_ECORRUPT);
  assert_null(e);
  assert_non_null(strstr(err.msg, "migrating storage schema version 5 to 6 failed"));
  assert_non_null(strstr(err.msg, "database \"turn_rows\""));
  cph_fixture_expect_schema(a->dir, 5);
  assert_int_equal(entries5(a->dir, CPH_DB_TURN_ROWS), rows);
  assert_int_equal(entries5(a->dir, CPH_DB_TURN_KEPT), 0);
  cph_fixture_free(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_schema5_data_dir_opens_and_shows_the_same_kept_turns),
      cmocka_unit_test(test_a_corrupt_schema5_key_stops_the_migration),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
