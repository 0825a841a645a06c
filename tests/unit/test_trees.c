/* The tree store (core/trees.h) on a real LMDB in a temp dir: an episode writes only the nodes
 * it changed, whatever the tree's size; a tree reads back node by node as it was saved; a
 * damaged record is named with its session and seq; deleting a session's tree leaves its
 * neighbours alone; a schema-2 tree value migrates to the same tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trees.h"
#include "store/store.h"
#include "tests/support/testutil.h"
#include "tests/support/trees_check.h"

typedef struct fixture {
  char *dir;
  cph_store *st;
  cph_trees tr;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = cph_test_tmpdir("trees");
  cph_store_options o = {f->dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_err err = {0};
  if (cph_store_open(&o, &f->st, &err))
    fail_msg("store: %s", err.msg);
  trees_init(&f->tr);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  trees_free(&f->tr);
  cph_store_close(f->st);
  cph_test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static cph_pact_node proto(int32_t depth, int32_t position, int32_t offset, const char *content) {
  cph_pact_node n = {0};
  n.at = (cph_coord){depth, position, offset};
  n.content = (char *)content;
  n.ttl = CPH_PACT_NO_TTL;
  return n;
}

/* Inserts n into the session's tree in its own committed transaction. */
static void insert(fixture *f, const char *session, cph_pact_node n) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  cph_pact_tree tree;
  assert_int_equal(trees_load(&f->tr, &t, session, &tree), CPH_OK);
  cph_err err = {0};
  if (cph_pact_insert(&tree, &n, NULL, &err))
    fail_msg("insert: %s", err.msg);
  assert_int_equal(trees_save(&f->tr, &t, session, &tree), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_pact_tree_free(&tree);
}

/* One completed turn as core/turns.c runs it: load, complete, prune, save, commit, keep. */
static void episode(fixture *f, const char *session, const char *input, const char *reply) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  cph_pact_tree tree;
  assert_int_equal(trees_load(&f->tr, &t, session, &tree), CPH_OK);
  assert_int_equal(cph_pact_complete_turn(&tree, input, reply), CPH_OK);
  trees_prune_history(&tree);
  assert_int_equal(trees_save(&f->tr, &t, session, &tree), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  trees_keep(&f->tr, session, &tree);
  cph_pact_tree_free(&tree);
}

/* The session's tree as the store holds it (a fresh tree store: nothing cached). */
static void load_fresh(fixture *f, const char *session, cph_pact_tree *out) {
  cph_trees fresh;
  trees_init(&fresh);
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, false, &t), CPH_OK);
  int rc = trees_load(&fresh, &t, session, out);
  if (rc)
    fail_msg("load %s: %s", session, t.err.msg);
  cph_txn_abort(&t);
  trees_free(&fresh);
}

static size_t context_entries(fixture *f) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, false, &t), CPH_OK);
  size_t n = 0;
  assert_int_equal(cph_txn_count(&t, CPH_DB_CONTEXT, &n), CPH_OK);
  cph_txn_abort(&t);
  return n;
}

/* A tree with a system node, permanent components that shift with history, a TTL node that
 * stays put, a cadence node, a lifecycle node and a sticky one. */
static void rich_tree(fixture *f, const char *session) {
  insert(f, session, proto(-1, 0, 0, "you are a careful assistant"));
  insert(f, session, proto(0, 1, 0, "a component of the current message"));
  cph_pact_node ttl = proto(2, 1, -1, "stays at d2 for five episodes");
  ttl.ttl = 5;
  insert(f, session, ttl);
  cph_pact_node cad = proto(0, 2, 0, "every third episode");
  cad.ttl = 1;
  cad.cadence = 3;
  insert(f, session, cad);
  cph_pact_stage stages[2] = {{{0, 0, 1}, 2}, {{0, 0, -1}, CPH_PACT_NO_TTL}};
  cph_pact_node lc = proto(0, 0, 0, "moves, then shifts");
  lc.lifecycle = stages;
  lc.n_lifecycle = 2;
  insert(f, session, lc);
  cph_pact_node sticky = proto(1, 3, 0, "sticky");
  sticky.ttl = 1;
  sticky.cadence = 1;
  insert(f, session, sticky);
}

/* ---------------------------------------------------------------- tests */

static void test_an_episode_writes_only_the_nodes_it_changed_whatever_the_tree_size(
    void **state) {
  fixture *f = *state;
  rich_tree(f, "s1");
  for (int i = 0; i < 6; i++) /* past the TTL, lifecycle and cadence transitions */
    episode(f, "s1", "a question of some length, like a user's", "an answer of similar length");
  /* From here, per episode: the header, the two new cores, the sticky node (re-created: a new
   * id), the cadence node when it wakes or sleeps; deletes only pruned cores. Measured while
   * the tree grows from ~20 to ~130 nodes and then stays there (pruning). */
  cph_trees_written small = {0}, large = {0};
  size_t tree_small = 0, tree_large = 0;
  for (int i = 0; i < 150; i++) {
    cph_trees_written before = f->tr.written;
    episode(f, "s1", "a question of some length, like a user's", "an answer of similar length");
    cph_trees_written d = {f->tr.written.saves - before.saves, f->tr.written.puts - before.puts,
                           f->tr.written.dels - before.dels,
                           f->tr.written.put_bytes - before.put_bytes};
    assert_int_equal(d.saves, 1);
    /* header + 2 cores + sticky + at most the cadence node */
    assert_true(d.puts >= 4 && d.puts <= 5);
    assert_true(d.dels <= 2);
    if (i < 3) {
      small.puts += d.puts;
      small.put_bytes += d.put_bytes;
      tree_small = context_entries(f) - 1;
    }
    if (i >= 147) {
      large.puts += d.puts;
      large.put_bytes += d.put_bytes;
      assert_int_equal(d.dels, 2); /* the two cores pruning dropped */
      tree_large = context_entries(f) - 1;
    }
  }
  print_message("per episode: %llu puts, %llu bytes at %zu nodes; %llu puts, %llu bytes at %zu "
                "nodes\n",
                (unsigned long long)small.puts / 3, (unsigned long long)small.put_bytes / 3,
                tree_small, (unsigned long long)large.puts / 3,
                (unsigned long long)large.put_bytes / 3, tree_large);

  assert_true(tree_large >= 5 * tree_small); /* the tree did grow */
  assert_int_equal(large.puts, small.puts);
  /* The same work in bytes, give or take the msgpack width of growing integers (ids, seqs,
   * episodes, anchors: 1 byte each below 128, 3 below 65536). */
  assert_true(large.put_bytes * 4 <= small.put_bytes * 5);
  /* and what was written is the tree the cache holds */
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, false, &t), CPH_OK);
  cph_pact_tree cached, stored;
  assert_int_equal(trees_load(&f->tr, &t, "s1", &cached), CPH_OK);
  cph_txn_abort(&t);
  load_fresh(f, "s1", &stored);
  char why[256];
  if (!cph_test_trees_equal(&cached, &stored, true, why, sizeof why))
    fail_msg("%s", why);
  assert_int_equal(stored.n + 1, context_entries(f));
  cph_buf whole = CPH_BUF_INIT; /* what schema 2 wrote per episode: the whole tree */
  assert_int_equal(trees_v2_encode(&stored, &whole), CPH_OK);
  print_message("schema 2 wrote the whole tree per episode: %zu bytes at %zu nodes\n",
                whole.len, stored.n);
  assert_true(large.put_bytes / 3 * 20 < whole.len);
  cph_buf_free(&whole);
  cph_pact_tree_free(&cached);
  cph_pact_tree_free(&stored);
}

static void test_a_tree_reads_back_as_it_was_kept_across_shifts_and_sticky_recreation(
    void **state) {
  fixture *f = *state;
  rich_tree(f, "s1");
  cph_pact_tree model;
  cph_pact_tree_init(&model);
  load_fresh(f, "s1", &model);
  for (int i = 0; i < 12; i++) {
    const char *reply = i % 3 == 2 ? NULL : "reply"; /* deltas of 1 and 2 */
    episode(f, "s1", "input", reply);
    assert_int_equal(cph_pact_complete_turn(&model, "input", reply), CPH_OK);
    trees_prune_history(&model);
    cph_pact_tree got;
    load_fresh(f, "s1", &got);
    char why[256];
    if (!cph_test_trees_equal(&model, &got, true, why, sizeof why))
      fail_msg("after episode %d: %s", i + 1, why);
    cph_pact_tree_free(&got);
  }
  cph_pact_tree_free(&model);
}

static void test_a_damaged_node_is_named_with_its_session_and_seq(void **state) {
  fixture *f = *state;
  insert(f, "s1", proto(-1, 0, 0, "system"));
  insert(f, "s1", proto(1, 1, 0, "component"));
  insert(f, "s2", proto(-1, 0, 0, "other"));
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "s1");
  cph_key_u64(&k, 2);
  assert_int_equal(cph_txn_put(&t, CPH_DB_CONTEXT, &k, "\x92\x01", 2), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  cph_trees fresh;
  trees_init(&fresh);
  assert_int_equal(cph_txn_begin(f->st, false, &t), CPH_OK);
  cph_pact_tree tree;
  assert_int_equal(trees_load(&fresh, &t, "s1", &tree), CPH_ECORRUPT);
  assert_non_null(strstr(t.err.msg, "database \"context\" at key \"s1\"/2"));
  assert_int_equal(tree.n, 0);
  cph_pact_tree_free(&tree);
  assert_int_equal(trees_load(&fresh, &t, "s2", &tree), CPH_OK); /* the neighbour reads */
  assert_int_equal(tree.n, 1);
  cph_pact_tree_free(&tree);
  cph_txn_abort(&t);

  /* a header that counts more nodes than there are */
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  assert_int_equal(cph_txn_del(&t, CPH_DB_CONTEXT, &k), CPH_OK);
  assert_int_equal(trees_load(&fresh, &t, "s1", &tree), CPH_ECORRUPT);
  assert_non_null(strstr(t.err.msg, "the header counts 2 nodes, the store holds 1"));
  cph_pact_tree_free(&tree);
  cph_txn_abort(&t);
  trees_free(&fresh);
}

static void test_deleting_a_tree_removes_its_header_and_nodes_only(void **state) {
  fixture *f = *state;
  rich_tree(f, "s1");
  rich_tree(f, "s10"); /* "s1\0..." sorts before "s10\0": neighbours in the key space */
  rich_tree(f, "s");
  episode(f, "s1", "in", "out");
  size_t each = context_entries(f) / 3;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  assert_int_equal(trees_delete(&f->tr, &t, "s1"), CPH_OK);
  assert_int_equal(trees_delete(&f->tr, &t, "nobody"), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(context_entries(f), 2 * 7); /* 6 nodes + a header each */
  (void)each;
  cph_pact_tree tree;
  load_fresh(f, "s1", &tree);
  assert_int_equal(tree.n, 0);
  assert_int_equal(tree.next_id, 1);
  cph_pact_tree_free(&tree);
  load_fresh(f, "s10", &tree);
  assert_int_equal(tree.n, 6);
  cph_pact_tree_free(&tree);
}

/* Many removals in one save (more than pact notes one by one): every stored node the tree no
 * longer holds goes. */
static void test_a_save_after_many_removals_deletes_each_of_them(void **state) {
  fixture *f = *state;
  for (int i = 0; i < 3 * CPH_PACT_REMOVED_MAX; i++) {
    cph_pact_node n = proto(0, 1, i, "short-lived");
    n.ttl = 1;
    insert(f, "s1", n);
  }
  insert(f, "s1", proto(-1, 0, 0, "stays"));
  episode(f, "s1", "in", "out"); /* expires all of them */
  assert_int_equal(context_entries(f), 1 + 3); /* header, system node, two cores */
  cph_pact_tree tree;
  load_fresh(f, "s1", &tree);
  assert_int_equal(tree.n, 3);
  cph_pact_tree_free(&tree);
}

/* A schema-2 value (one per session) becomes the same tree in the new layout. */
static void test_a_schema2_tree_value_migrates_to_the_same_tree(void **state) {
  fixture *f = *state;
  rich_tree(f, "s1");
  for (int i = 0; i < 7; i++)
    episode(f, "s1", "in", i % 2 ? "out" : NULL);
  cph_pact_tree want;
  load_fresh(f, "s1", &want);
  cph_buf b = CPH_BUF_INIT;
  assert_int_equal(trees_v2_encode(&want, &b), CPH_OK);
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  assert_int_equal(trees_delete(&f->tr, &t, "s1"), CPH_OK);
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "s1");
  assert_int_equal(cph_txn_put(&t, CPH_DB_CONTEXT, &k, b.data, b.len), CPH_OK);
  cph_err err = {0};
  assert_int_equal(trees_migrate(&f->tr, &t, &err), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_buf_free(&b);
  cph_pact_tree got;
  load_fresh(f, "s1", &got);
  char why[256];
  if (!cph_test_trees_equal(&want, &got, false, why, sizeof why))
    fail_msg("%s", why);
  assert_int_equal(context_entries(f), got.n + 1);
  /* and it goes on from there as the original would */
  for (int i = 0; i < 5; i++) {
    episode(f, "s1", "more", "again");
    assert_int_equal(cph_pact_complete_turn(&want, "more", "again"), CPH_OK);
    trees_prune_history(&want);
  }
  cph_pact_tree_free(&got);
  load_fresh(f, "s1", &got);
  if (!cph_test_trees_equal(&want, &got, false, why, sizeof why))
    fail_msg("after more episodes: %s", why);
  cph_pact_tree_free(&got);
  cph_pact_tree_free(&want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_an_episode_writes_only_the_nodes_it_changed_whatever_the_tree_size, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_a_tree_reads_back_as_it_was_kept_across_shifts_and_sticky_recreation, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_a_damaged_node_is_named_with_its_session_and_seq,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_deleting_a_tree_removes_its_header_and_nodes_only,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_save_after_many_removals_deletes_each_of_them,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_schema2_tree_value_migrates_to_the_same_tree,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
