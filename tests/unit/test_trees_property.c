/* The tree store (core/trees.h) as a property: whatever mix of episodes (with and without a
 * reply), inserts (system nodes, components, TTL, cadence, sticky and lifecycle nodes, keys,
 * tags, depths up to INT32_MAX), updates, deletes, steps with any delta (negative too),
 * prunes, reads, failed child transactions, failed pass commits and restarts, the tree the
 * store holds — read back by a fresh tree store — equals a reference model: the same pact
 * operations applied to a plain in-memory tree. Reads in between (what rendering, context
 * reads and seals see) give the model's render order. Each case ends by writing the model as
 * a schema-2 value, migrating it, and checking the migrated tree goes on like the model.
 *
 * The store side runs as the engine does: a pass transaction, one child per batch of
 * operations (load, change, save, commit or abort), the tree kept in the cache after a
 * committed child, the cache cleared when a pass fails or the store restarts.
 *
 * CPH_PROPERTY_SEED=<n> runs from that seed; CPH_PROPERTY_CASES=<n> sets how many cases. A
 * failure prints the case's seed: rerun with CPH_PROPERTY_SEED=<seed> CPH_PROPERTY_CASES=1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "core/trees.h"
#include "store/store.h"
#include "tests/support/testutil.h"
#include "tests/support/prop.h"
#include "tests/support/trees_check.h"

#define DEFAULT_CASES 2000
#define TREE_NODES_CAP 300 /* inserts stop here, so long cases stay quick */

/* below() for the int ranges this test draws. */
static int below_int(rng *r, int n) { return (int)(next(r) % (uint64_t)n); }
static bool chance(rng *r, int percent) { return below_int(r, 100) < percent; }

typedef struct run {
  char *dir;
  cph_store *st;
  cph_trees tr;
  uint64_t seed;
  const char *session;
  cph_pact_tree model;
} run;

static void open_store(run *R) {
  cph_store_options o = {R->dir, (size_t)1 << 30, CPH_SYNC_NONE};
  cph_err err = {0};
  if (cph_store_open(&o, &R->st, &err))
    fail_msg("store: %s", err.msg);
}

#define CHECK(cond, ...) CPH_PROP_CHECK(R->seed, cond, __VA_ARGS__)

/* ---------------------------------------------------------------- operations */

static const char *const contents[] = {"alpha", "a longer piece of context text", "gamma",
                                       "", "δ unicode", "the same text"};
static char *tag_pool[] = {"red", "green", "blue"};

static int32_t pick_depth(rng *r) {
  int k = below_int(r, 20);
  if (k < 2)
    return -1;
  if (k < 7)
    return 0;
  if (k < 19)
    return 1 + below_int(r, 6);
  return INT32_MAX - below_int(r, 3); /* the ODI clamp */
}

/* A random valid node (its lifecycle in *stages). */
static cph_pact_node random_node(rng *r, cph_pact_stage stages[3]) {
  cph_pact_node n = {0};
  n.at = (cph_coord){pick_depth(r), below_int(r, 4), below_int(r, 5) - 2};
  n.content = (char *)contents[below_int(r, 6)];
  n.ttl = chance(r, 40) ? CPH_PACT_NO_TTL : 1 + below_int(r, 6);
  if (n.ttl != CPH_PACT_NO_TTL && chance(r, 40))
    n.cadence = 1 + below_int(r, 4);
  if (chance(r, 10)) {
    n.ttl = 1;
    n.cadence = 1; /* sticky */
  }
  if (chance(r, 10)) {
    n.role = chance(r, 50) ? "user" : "assistant";
    n.ttl = CPH_PACT_NO_TTL;
    n.cadence = 0;
  }
  if (chance(r, 20))
    n.key = chance(r, 50) ? "k1" : "k2";
  if (chance(r, 20)) {
    n.tags = tag_pool + below_int(r, 2);
    n.n_tags = 1 + (uint32_t)below_int(r, 2);
  }
  if (chance(r, 12)) {
    uint32_t k = 2 + (uint32_t)below_int(r, 2);
    for (uint32_t i = 0; i < k; i++)
      stages[i] = (cph_pact_stage){{pick_depth(r), below_int(r, 3), below_int(r, 5) - 2}, 1 + below_int(r, 3)};
    if (chance(r, 60))
      stages[k - 1].ttl = CPH_PACT_NO_TTL;
    n.lifecycle = stages;
    n.n_lifecycle = k;
    n.cadence = 0;
  }
  return n;
}

/* One random operation, applied to the store's tree (w) and the model alike. */
static void random_op(run *R, rng *r, cph_pact_tree *w) {
  cph_pact_tree *m = &R->model;
  int k = below_int(r, 100);
  if (k < 30 && m->n < TREE_NODES_CAP) {
    cph_pact_stage stages[3];
    cph_pact_node n = random_node(r, stages);
    uint64_t id_m = 0, id_w = 0;
    int rm = cph_pact_insert(m, &n, &id_m, NULL), rw = cph_pact_insert(w, &n, &id_w, NULL);
    CHECK(rm == rw && id_m == id_w, "insert: %d/%d, ids %llu/%llu", rm, rw,
          (unsigned long long)id_m, (unsigned long long)id_w);
  } else if (k < 40 && m->n) {
    uint64_t id = m->nodes[below_int(r, (int)m->n)].id;
    cph_pact_stage stages[3];
    cph_pact_node f = random_node(r, stages);
    unsigned mask = (unsigned)below_int(r, 64);
    int rm = cph_pact_update(m, id, &f, mask, NULL), rw = cph_pact_update(w, id, &f, mask, NULL);
    CHECK(rm == rw, "update %llu mask %u: %d/%d", (unsigned long long)id, mask, rm, rw);
  } else if (k < 48 && m->n) {
    uint64_t id = m->nodes[below_int(r, (int)m->n)].id;
    int rm = cph_pact_delete(m, id), rw = cph_pact_delete(w, id);
    CHECK(rm == rw, "delete %llu: %d/%d", (unsigned long long)id, rm, rw);
  } else if (k < 85) {
    const char *reply = chance(r, 75) ? "a reply" : NULL;
    int rm = cph_pact_complete_turn(m, "an input", reply);
    int rw = cph_pact_complete_turn(w, "an input", reply);
    CHECK(rm == rw, "complete_turn: %d/%d", rm, rw);
    size_t pm = trees_prune_history(m), pw = trees_prune_history(w);
    CHECK(pm == pw, "prune after complete_turn: %zu/%zu", pm, pw);
  } else if (k < 88 && m->n < TREE_NODES_CAP) {
    /* a burst of short-lived nodes: their expiry removes more than pact notes one by one */
    int burst = CPH_PACT_REMOVED_MAX / 2 + below_int(r, 2 * CPH_PACT_REMOVED_MAX);
    for (int i = 0; i < burst; i++) {
      cph_pact_node n = {.at = {below_int(r, 3), 1 + below_int(r, 3), i}, .content = "brief"};
      n.ttl = 1 + below_int(r, 2);
      int rm = cph_pact_insert(m, &n, NULL, NULL), rw = cph_pact_insert(w, &n, NULL, NULL);
      CHECK(rm == rw, "burst insert: %d/%d", rm, rw);
    }
  } else if (k < 95) {
    int32_t delta = below_int(r, 5) - 2;
    cph_pact_step(m, delta);
    cph_pact_step(w, delta);
  } else {
    size_t pm = trees_prune_history(m), pw = trees_prune_history(w);
    CHECK(pm == pw, "prune: %zu/%zu", pm, pw);
  }
}

/* ---------------------------------------------------------------- checks */

/* The store's tree through a fresh tree store (nothing cached) equals the model. */
static void check_store(run *R, const char *when) {
  cph_trees fresh;
  trees_init(&fresh);
  cph_txn t;
  CHECK(cph_txn_begin(R->st, false, &t) == CPH_OK, "begin");
  cph_pact_tree got;
  int rc = trees_load(&fresh, &t, R->session, &got);
  CHECK(rc == CPH_OK, "%s: load: %s", when, t.err.msg);
  cph_txn_abort(&t);
  char why[512];
  CHECK(cph_test_trees_equal(&R->model, &got, true, why, sizeof why), "%s: %s", when, why);
  cph_pact_tree_free(&got);
  trees_free(&fresh);
}

/* What rendering, context reads and seals see: the live nodes in render order. */
static void check_render(run *R, const cph_pact_tree *got) {
  const cph_pact_tree *m = &R->model;
  size_t *a = calloc(m->n + 1, sizeof *a), *b = calloc(got->n + 1, sizeof *b);
  size_t na = cph_pact_render_order(m, a), nb = cph_pact_render_order(got, b);
  CHECK(na == nb, "render: %zu live nodes in the model, %zu read", na, nb);
  for (size_t i = 0; i < na; i++) {
    const cph_pact_node *x = &m->nodes[a[i]], *y = &got->nodes[b[i]];
    CHECK(x->id == y->id && !memcmp(&x->at, &y->at, sizeof x->at) &&
              !strcmp(x->content, y->content),
          "render: message %zu differs (id %llu / %llu)", i, (unsigned long long)x->id,
          (unsigned long long)y->id);
  }
  free(a);
  free(b);
}

/* A read between passes, as context reads do: load, compare, keep. */
static void read_and_keep(run *R) {
  cph_txn t;
  CHECK(cph_txn_begin(R->st, false, &t) == CPH_OK, "begin read");
  cph_pact_tree got;
  CHECK(trees_load(&R->tr, &t, R->session, &got) == CPH_OK, "read: %s", t.err.msg);
  cph_txn_abort(&t);
  check_render(R, &got);
  trees_keep(&R->tr, R->session, &got);
  cph_pact_tree_free(&got);
}

/* ---------------------------------------------------------------- a case */

/* One pass: 1-3 children, each a batch of operations saved and committed or aborted; the pass
 * itself commits, or (rarely) fails and everything it did is undone. */
static void one_pass(run *R, rng *r, bool long_case) {
  cph_pact_tree before_pass;
  CHECK(cph_pact_tree_copy(&before_pass, &R->model) == CPH_OK, "copy");
  cph_txn pass;
  CHECK(cph_txn_begin(R->st, true, &pass) == CPH_OK, "begin pass");
  int children = 1 + below_int(r, 3);
  for (int c = 0; c < children; c++) {
    cph_pact_tree before;
    CHECK(cph_pact_tree_copy(&before, &R->model) == CPH_OK, "copy");
    cph_txn t;
    CHECK(cph_txn_begin_child(&pass, &t) == CPH_OK, "begin child");
    cph_pact_tree w;
    CHECK(trees_load(&R->tr, &t, R->session, &w) == CPH_OK, "load: %s", t.err.msg);
    int ops = long_case ? 1 : 1 + below_int(r, 4);
    for (int i = 0; i < ops; i++)
      random_op(R, r, &w);
    CHECK(trees_save(&R->tr, &t, R->session, &w) == CPH_OK, "save: %s", t.err.msg);
    if (chance(r, 8)) { /* the operation failed after saving: its child is discarded */
      cph_txn_abort(&t);
      cph_pact_tree_free(&R->model);
      R->model = before;
    } else {
      CHECK(cph_txn_commit(&t) == CPH_OK, "commit child: %s", t.err.msg);
      if (chance(r, 70))
        trees_keep(&R->tr, R->session, &w);
      cph_pact_tree_free(&before);
    }
    cph_pact_tree_free(&w);
  }
  if (chance(r, 4)) { /* the pass commit failed: the engine clears the cache */
    cph_txn_abort(&pass);
    trees_cache_clear(&R->tr);
    cph_pact_tree_free(&R->model);
    R->model = before_pass;
    return;
  }
  CHECK(cph_txn_commit(&pass) == CPH_OK, "commit pass: %s", pass.err.msg);
  cph_pact_tree_free(&before_pass);
}

/* Writes the model as schema 2 held it, migrates it, and runs a few more episodes on both. */
static void check_migration(run *R, rng *r) {
  cph_buf b = CPH_BUF_INIT;
  CHECK(trees_v2_encode(&R->model, &b) == CPH_OK, "v2 encode");
  cph_txn t;
  CHECK(cph_txn_begin(R->st, true, &t) == CPH_OK, "begin");
  CHECK(trees_delete(&R->tr, &t, R->session) == CPH_OK, "delete");
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, R->session);
  CHECK(cph_txn_put(&t, CPH_DB_CONTEXT, &k, b.data, b.len) == CPH_OK, "put v2");
  cph_buf_free(&b);
  cph_err err = {0};
  CHECK(trees_migrate(&R->tr, &t, &err) == CPH_OK, "migrate: %s", err.msg);
  CHECK(cph_txn_commit(&t) == CPH_OK, "commit migration");
  char why[512];
  for (int i = 0; i < 4; i++) {
    cph_trees fresh;
    trees_init(&fresh);
    CHECK(cph_txn_begin(R->st, true, &t) == CPH_OK, "begin");
    cph_pact_tree got;
    CHECK(trees_load(&fresh, &t, R->session, &got) == CPH_OK, "load migrated: %s", t.err.msg);
    CHECK(cph_test_trees_equal(&R->model, &got, false, why, sizeof why),
          "migrated, then %d episodes: %s", i, why);
    const char *reply = chance(r, 50) ? "r" : NULL;
    cph_pact_complete_turn(&R->model, "i", reply);
    trees_prune_history(&R->model);
    cph_pact_complete_turn(&got, "i", reply);
    trees_prune_history(&got);
    CHECK(trees_save(&fresh, &t, R->session, &got) == CPH_OK, "save migrated");
    CHECK(cph_txn_commit(&t) == CPH_OK, "commit");
    cph_pact_tree_free(&got);
    trees_free(&fresh);
  }
}

static void run_case(run *R, uint64_t seed) {
  rng r = {seed};
  char session[40];
  snprintf(session, sizeof session, "case-%llu", (unsigned long long)seed);
  R->seed = seed;
  R->session = session;
  cph_pact_tree_init(&R->model);
  bool long_case = chance(&r, 10); /* deep enough for pruning at depth 128 */
  int passes = long_case ? 150 + below_int(&r, 150) : 5 + below_int(&r, 40);
  for (int p = 0; p < passes; p++) {
    one_pass(R, &r, long_case);
    if (chance(&r, long_case ? 5 : 30))
      check_store(R, "after a pass");
    if (chance(&r, 15))
      read_and_keep(R);
    if (chance(&r, 4)) /* a restart: nothing decoded survives */
      trees_cache_clear(&R->tr);
    if (chance(&r, 1)) {
      trees_free(&R->tr);
      cph_store_close(R->st);
      open_store(R);
      trees_init(&R->tr);
    }
  }
  check_store(R, "at the end");
  check_migration(R, &r);
  cph_txn t;
  CHECK(cph_txn_begin(R->st, true, &t) == CPH_OK, "begin");
  CHECK(trees_delete(&R->tr, &t, R->session) == CPH_OK, "delete");
  size_t left = 1;
  CHECK(cph_txn_count(&t, CPH_DB_CONTEXT, &left) == CPH_OK && left == 0,
        "%zu records left after the delete", left);
  CHECK(cph_txn_commit(&t) == CPH_OK, "commit delete");
  cph_pact_tree_free(&R->model);
}

static void test_stored_tree_equals_the_model_over_random_histories(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(20261125, DEFAULT_CASES, &seed, &cases);
  print_message("tree store property: %ld cases from seed %llu\n", cases,
                (unsigned long long)seed);
  run R = {0};
  R.dir = cph_test_tmpdir("trees-property");
  open_store(&R);
  trees_init(&R.tr);
  for (long i = 0; i < cases; i++)
    run_case(&R, seed + (uint64_t)i);
  trees_free(&R.tr);
  cph_store_close(R.st);
  cph_test_rmtree(R.dir);
  free(R.dir);
}

int main(void) {
  cph_log_set_level(CPH_LOG_WARN); /* each case's migration logs at info */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stored_tree_equals_the_model_over_random_histories),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
