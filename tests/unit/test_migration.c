/* Schema 2 -> 3 at open (store.h, core/trees.h): a data directory written in the previous
 * layout opens and serves the same sessions, inboxes, trees and memories.
 *
 * One engine (A) runs a script — sessions, inbox entries (some left pending), turns with
 * replies and minted memories, PACT nodes of every kind at several depths (system nodes,
 * components that shift with history, TTL, cadence, lifecycle, sticky, keyed and tagged), a
 * seal — and closes. Its data dir is copied (B) and B's trees are written back as schema 2
 * held them: one value per session (trees_v2_encode, the kept encoder), schema version 2.
 * A plain store open refuses B; the engine opens it and migrates. Then A and B must serve the
 * same: every session, every tree node by node, the seals, and — over the same further
 * leases and completions — the same turns (staged inbox entries, obligations, history,
 * memories with their access counts, messages) and the same trees after them. Every database
 * but "context" and "meta" is byte-identical after the migration, and a second open changes
 * neither of those. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "common/log.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"
#include "tests/support/trees_check.h"

static const char *POLICY = "{:sessions {:janitor? false :max-batch 64}\n"
                            " :dedupe {:min-length 1000000}\n"
                            " :store {:sync :none}}\n";

typedef cph_fixture fixture;

/* ---------------------------------------------------------------- driving an engine */

static void create(fixture *f, const char *id, const char *channel, uint32_t autonomy_s) {
  char *sub[1] = {(char *)channel};
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  op.u.session.in.subscribe = (cph_strv){sub, 1};
  op.u.session.in.autonomy_interval_s = autonomy_s;
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

static void post(fixture *f, const char *channel, const char *sender, const char *body) {
  cph_event_in ev = {.channel = (char *)channel, .sender = (char *)sender, .body = (char *)body};
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = &ev;
  op.u.ingest.n_events = 1;
  if (cph_fixture_run(f, &op) || op.u.ingest.results[0].status == CPH_EV_REJECTED)
    fail_msg("ingest: %s", op.err.msg);
  cph_op_clear_results(&op);
  cph_engine_run_pass(f->e); /* staged from the next pass */
}

typedef struct node_spec {
  const char *at;
  const char *content;
  int64_t ttl, cadence;
  const char *key;
  bool tagged;
  bool lifecycle;
} node_spec;

static void insert(fixture *f, const char *session, node_spec s) {
  static char *tags[] = {"pinned", "ops"};
  cph_context_stage_in stages[3] = {{"d0, 0, 1", 2}, {"d0, 0, -1", 3}, {"d0, 0, -2", 0}};
  cph_op op = {0};
  op.kind = CPH_OP_CONTEXT_INSERT;
  op.u.context.session = (char *)session;
  op.u.context.node.at = (char *)s.at;
  op.u.context.node.content = (char *)s.content;
  op.u.context.node.ttl = s.ttl;
  op.u.context.node.cadence = s.cadence;
  op.u.context.node.key = (char *)s.key;
  if (s.tagged)
    op.u.context.node.tags = (cph_strv){tags, 2};
  if (s.lifecycle) {
    op.u.context.node.lifecycle = stages;
    op.u.context.node.n_lifecycle = 3;
  }
  if (cph_fixture_run(f, &op))
    fail_msg("insert %s into %s: %s", s.at, session, op.err.msg);
  cph_op_clear_results(&op);
}

static void seal(fixture *f, const char *session, const char *trigger) {
  cph_op op = {0};
  op.kind = CPH_OP_CONTEXT_SEAL;
  op.u.context.session = (char *)session;
  op.u.context.trigger = (char *)trigger;
  if (cph_fixture_run(f, &op))
    fail_msg("seal %s: %s", session, op.err.msg);
  cph_op_clear_results(&op);
}

/* Leases the next turn (one must be ready); the caller completes it and clears op. */
static cph_turn_info *lease(fixture *f, cph_op *op) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w1";
  op->u.lease.deadline_ns = cph_clock_now(&f->clock) + 10 * CPH_NS_PER_S;
  if (cph_fixture_run(f, op))
    fail_msg("lease: %s", op->err.msg);
  return &op->u.lease.turn;
}

static void complete(fixture *f, const cph_turn_info *t, const char *reply, const char *memory) {
  cph_memory_in mem = {.text = (char *)memory};
  cph_op op = {0};
  op.kind = CPH_OP_COMPLETE;
  op.u.turn.turn_id = t->id;
  memcpy(op.u.turn.lease, t->lease, sizeof op.u.turn.lease);
  op.u.turn.reply_body = (char *)reply;
  op.u.turn.memories = memory ? &mem : NULL;
  op.u.turn.n_memories = memory ? 1 : 0;
  if (cph_fixture_run(f, &op))
    fail_msg("complete: %s", op.err.msg);
  cph_op_clear_results(&op);
}

/* Leases and completes every ready turn, replying with the turn's id in the text. */
static void drain(fixture *f, int round) {
  for (;;) {
    cph_why_info why;
    cph_err err;
    bool ready = false;
    const char *ids[] = {"ann-bot", "bob-bot"};
    for (int i = 0; i < 2; i++)
      if (cph_engine_why(f->e, ids[i], &why, &err) == CPH_OK && !strcmp(why.reason, "runnable"))
        ready = true;
    if (!ready)
      return;
    cph_op l;
    cph_turn_info *t = lease(f, &l);
    char reply[96], memory[96];
    snprintf(reply, sizeof reply, "%s answers in round %d", t->session, round);
    snprintf(memory, sizeof memory, "%s learned fact %d", t->session, round);
    complete(f, t, reply, memory);
    cph_op_clear_results(&l);
  }
}

/* The history both engines share until the copy. */
static void script(fixture *f) {
  create(f, "ann-bot", "general", 1);
  create(f, "bob-bot", "general", 0);
  create(f, "quiet", "other", 0); /* never runs: no tree, a pending inbox */
  insert(f, "ann-bot", (node_spec){.at = "d-1, 0, 0", .content = "you are ann-bot"});
  insert(f, "ann-bot", (node_spec){.at = "d1, 1, 0", .content = "a note on the last reply"}); /* shifts */
  insert(f, "ann-bot", (node_spec){.at = "d2, 1, -1", .content = "stays at d2 a while", .ttl = 9});
  insert(f, "ann-bot", (node_spec){.at = "d0, 2, 0", .content = "every third episode", .ttl = 1, .cadence = 3});
  insert(f, "ann-bot", (node_spec){.at = "d0, 0, 1", .content = "moves along", .lifecycle = true});
  insert(f, "ann-bot", (node_spec){.at = "d1, 3, 0", .content = "sticky", .ttl = 1, .cadence = 1});
  insert(f, "ann-bot", (node_spec){.at = "d-1, 1, 0", .content = "reminder", .key = "remind", .tagged = true});
  insert(f, "bob-bot", (node_spec){.at = "d-1, 0, 0", .content = "you are bob-bot"});
  for (int round = 0; round < 6; round++) {
    char body[64];
    snprintf(body, sizeof body, "carol says %d", round);
    post(f, "general", "carol", body);
    drain(f, round);
    if (round == 2) {
      insert(f, "bob-bot", (node_spec){.at = "d3, 1, 0", .content = "deep component"});
      insert(f, "ann-bot", (node_spec){.at = "d-1, 1, 0", .content = "reminder, updated", .key = "remind"});
    }
  }
  seal(f, "ann-bot", "before-upgrade");
  post(f, "general", "dave", "left pending for both");
  post(f, "other", "erin", "for quiet");
}

/* ---------------------------------------------------------------- comparing A and B */

static void same_str(const char *a, const char *b, const char *what) {
  if (!(a == b || (a && b && !strcmp(a, b))))
    fail_msg("%s: \"%s\" / \"%s\"", what, a ? a : "(null)", b ? b : "(null)");
}

static void same_sessions(fixture *a, fixture *b) {
  cph_session_filter all = {.limit = 100};
  cph_session_info *la, *lb;
  size_t na, nb;
  cph_err err;
  assert_int_equal(cph_engine_list_sessions(a->e, &all, &la, &na, &err), CPH_OK);
  assert_int_equal(cph_engine_list_sessions(b->e, &all, &lb, &nb, &err), CPH_OK);
  assert_int_equal(na, nb);
  for (size_t i = 0; i < na; i++) {
    same_str(la[i].id, lb[i].id, "session id");
    assert_int_equal(la[i].state, lb[i].state);
    assert_int_equal(la[i].episode, lb[i].episode);
    assert_int_equal(la[i].pending, lb[i].pending);
    assert_int_equal(la[i].staged, lb[i].staged);
    assert_int_equal(la[i].folded, lb[i].folded);
    /* credits refill with each engine's wall clock: the stored record is compared instead
     * (database "sessions" is byte-identical) */
    assert_int_equal(la[i].subscribe.count, lb[i].subscribe.count);
    cph_session_info_free(&la[i]);
    cph_session_info_free(&lb[i]);
  }
  free(la);
  free(lb);
}

/* Every node of the session's tree, in render order, field by field; returns how many. */
static size_t same_tree(fixture *a, fixture *b, const char *session) {
  cph_context_node_info *na, *nb;
  size_t ca, cb;
  uint64_t ea, eb;
  cph_err err;
  assert_int_equal(cph_engine_context(a->e, session, NULL, &na, &ca, &ea, &err), CPH_OK);
  if (cph_engine_context(b->e, session, NULL, &nb, &cb, &eb, &err))
    fail_msg("context of %s after the migration: %s", session, err.msg);
  assert_int_equal(ea, eb);
  assert_int_equal(ca, cb);
  for (size_t i = 0; i < ca; i++) {
    assert_int_equal(na[i].id, nb[i].id);
    same_str(na[i].at, nb[i].at, "at");
    same_str(na[i].content, nb[i].content, "content");
    same_str(na[i].role, nb[i].role, "role");
    assert_int_equal(na[i].ttl, nb[i].ttl);
    assert_int_equal(na[i].cadence, nb[i].cadence);
    assert_int_equal(na[i].n_lifecycle, nb[i].n_lifecycle);
    for (size_t j = 0; j < na[i].n_lifecycle; j++) {
      same_str(na[i].lifecycle[j].at, nb[i].lifecycle[j].at, "lifecycle at");
      assert_int_equal(na[i].lifecycle[j].ttl, nb[i].lifecycle[j].ttl);
    }
    same_str(na[i].key, nb[i].key, "key");
    assert_int_equal(na[i].tags.count, nb[i].tags.count);
    for (size_t j = 0; j < na[i].tags.count; j++)
      same_str(na[i].tags.items[j], nb[i].tags.items[j], "tag");
    assert_int_equal(na[i].created_at_episode, nb[i].created_at_episode);
  }
  cph_context_nodes_free(na, ca);
  cph_context_nodes_free(nb, cb);
  return ca;
}

static void same_seals(fixture *a, fixture *b, const char *session) {
  cph_seal_info *sa, *sb;
  size_t na, nb;
  cph_err err;
  assert_int_equal(cph_engine_seals(a->e, session, &sa, &na, &err), CPH_OK);
  assert_int_equal(cph_engine_seals(b->e, session, &sb, &nb, &err), CPH_OK);
  assert_int_equal(na, nb);
  for (size_t i = 0; i < na; i++) {
    assert_int_equal(sa[i].n_messages, sb[i].n_messages);
    for (size_t j = 0; j < sa[i].n_messages; j++) {
      same_str(sa[i].messages[j].content, sb[i].messages[j].content, "seal message");
      same_str(sa[i].messages[j].coord, sb[i].messages[j].coord, "seal coord");
    }
  }
  cph_seals_free(sa, na);
  cph_seals_free(sb, nb);
}

/* A turn's content (not its times, which follow each engine's wall clock). */
static void same_turn(const cph_turn_info *x, const cph_turn_info *y) {
  assert_int_equal(x->id, y->id);
  same_str(x->session, y->session, "turn session");
  assert_int_equal(x->kind, y->kind);
  same_str(x->input, y->input, "input");
  assert_int_equal(x->episode, y->episode);
  assert_int_equal(x->n_staged, y->n_staged);
  for (size_t i = 0; i < x->n_staged; i++) {
    assert_int_equal(x->staged[i].id, y->staged[i].id);
    assert_int_equal(x->staged[i].count, y->staged[i].count);
    same_str(x->staged[i].body, y->staged[i].body, "staged body");
  }
  assert_int_equal(x->n_obligations, y->n_obligations);
  assert_int_equal(x->n_history, y->n_history);
  for (size_t i = 0; i < x->n_history; i++)
    same_str(x->history[i].body, y->history[i].body, "history");
  assert_int_equal(x->n_memories, y->n_memories);
  for (size_t i = 0; i < x->n_memories; i++) {
    assert_int_equal(x->memories[i].id, y->memories[i].id);
    same_str(x->memories[i].text, y->memories[i].text, "memory");
    same_str(x->memories[i].scope, y->memories[i].scope, "memory scope");
    assert_int_equal(x->memories[i].access_count, y->memories[i].access_count);
  }
  assert_int_equal(x->n_messages, y->n_messages);
  for (size_t i = 0; i < x->n_messages; i++) {
    same_str(x->messages[i].role, y->messages[i].role, "message role");
    same_str(x->messages[i].content, y->messages[i].content, "message content");
    same_str(x->messages[i].coord, y->messages[i].coord, "message coord");
    same_str(x->messages[i].name, y->messages[i].name, "message name");
  }
}

/* ---------------------------------------------------------------- the store underneath */

typedef struct digest {
  uint64_t hash;
  size_t n;
} digest;

static bool fold(void *ctx, const void *key, size_t key_len, const void *val, size_t val_len) {
  digest *d = ctx;
  const unsigned char *parts[2] = {key, val};
  size_t lens[2] = {key_len, val_len};
  for (int p = 0; p < 2; p++) {
    d->hash = (d->hash ^ lens[p]) * 0x100000001b3ull;
    for (size_t i = 0; i < lens[p]; i++)
      d->hash = (d->hash ^ parts[p][i]) * 0x100000001b3ull; /* FNV-1a */
  }
  d->n++;
  return true;
}

/* One digest per database (opens the store: the engine closed, schema 3). */
static void digest_all(const char *dir, digest out[CPH_DB_COUNT]) {
  for (int db = 0; db < CPH_DB_COUNT; db++) {
    out[db] = (digest){0xcbf29ce484222325ull, 0};
    cph_fixture_store_each(dir, db, fold, &out[db]);
  }
}

/* ---------------------------------------------------------------- the test */

static void test_a_schema2_data_dir_opens_and_serves_the_same(void **state) {
  (void)state;
  fixture *a = cph_fixture_new("migrate-a", POLICY);
  script(a);
  cph_engine_close(a->e);
  a->e = NULL;
  digest before[CPH_DB_COUNT];
  digest_all(a->dir, before);
  assert_true(before[CPH_DB_CONTEXT].n > 20); /* trees, inboxes, memories: there is data */
  assert_true(before[CPH_DB_INBOX].n > 0 && before[CPH_DB_MEMORIES].n > 0);

  /* B: a copy of A written back in the previous schema */
  fixture *b = cph_fixture_new("migrate-b", POLICY);
  cph_engine_close(b->e);
  b->e = NULL;
  cph_fixture_copy_store(a, b);
  assert_int_equal(cph_test_write_schema2(b->dir), 2); /* ann-bot's and bob-bot's trees */
  cph_fixture_expect_schema(b->dir, 2); /* only the engine migrates */

  b->clock = a->clock;
  cph_fixture_open(b); /* migrates */
  cph_engine_close(b->e);
  b->e = NULL;
  digest after[CPH_DB_COUNT];
  digest_all(b->dir, after);
  for (int db = 0; db < CPH_DB_COUNT; db++) {
    if (db == CPH_DB_CONTEXT || db == CPH_DB_META)
      continue;
    if (after[db].n != before[db].n || after[db].hash != before[db].hash)
      fail_msg("database \"%s\" changed in the migration", cph_db_name((cph_db)db));
  }
  /* the same layout as A's, record for record (values differ only in anchors: B's shift
   * starts at 0) */
  assert_int_equal(after[CPH_DB_CONTEXT].n, before[CPH_DB_CONTEXT].n);
  cph_fixture_open(b); /* a second open: nothing more to do */
  cph_engine_close(b->e);
  b->e = NULL;
  digest again[CPH_DB_COUNT];
  digest_all(b->dir, again);
  assert_true(again[CPH_DB_CONTEXT].hash == after[CPH_DB_CONTEXT].hash);
  assert_true(again[CPH_DB_META].n == after[CPH_DB_META].n);

  /* both serve the same */
  cph_fixture_open(a);
  cph_fixture_open(b);
  same_sessions(a, b);
  size_t ann = same_tree(a, b, "ann-bot"), bob = same_tree(a, b, "bob-bot");
  print_message("migrated: ann-bot %zu live nodes, bob-bot %zu\n", ann, bob);
  assert_true(ann >= 15 && bob >= 10);
  assert_int_equal(same_tree(a, b, "quiet"), 0);
  same_seals(a, b, "ann-bot");
  /* and go on the same: the pending inbox entries, a tick, further rounds */
  int turns = 0;
  for (int round = 0; round < 6; round++) {
    if (round == 3) {
      cph_clock_advance(&a->clock, 2 * CPH_NS_PER_S); /* ann-bot's autonomy tick */
      cph_clock_advance(&b->clock, 2 * CPH_NS_PER_S);
      cph_engine_run_pass(a->e);
      cph_engine_run_pass(b->e);
    }
    if (round > 0 && round != 3) {
      post(a, "general", "carol", "after the upgrade");
      post(b, "general", "carol", "after the upgrade");
    }
    cph_why_info why;
    cph_err err;
    while (cph_engine_why(a->e, "ann-bot", &why, &err) == CPH_OK &&
           (!strcmp(why.reason, "runnable") ||
            (cph_engine_why(a->e, "bob-bot", &why, &err) == CPH_OK &&
             !strcmp(why.reason, "runnable")))) {
      cph_op la, lb;
      cph_turn_info *ta = lease(a, &la), *tb = lease(b, &lb);
      same_turn(ta, tb);
      complete(a, ta, "same reply", "same memory");
      complete(b, tb, "same reply", "same memory");
      same_tree(a, b, ta->session);
      turns++;
      cph_op_clear_results(&la);
      cph_op_clear_results(&lb);
    }
  }
  assert_true(turns >= 10);
  same_sessions(a, b);
  same_tree(a, b, "ann-bot");
  same_tree(a, b, "bob-bot");
  cph_fixture_free(a);
  cph_fixture_free(b);
}

int main(void) {
  cph_log_set_level(CPH_LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_schema2_data_dir_opens_and_serves_the_same),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
