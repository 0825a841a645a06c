/* Memory records kept decoded for turns (core/memcache.h, memory_borrow in core/memory.h),
 * against a real LMDB in a temp dir: over thousands of seeded random runs of passes, a
 * borrowed record is always exactly the record the pass's transaction reads from the store,
 * and every record the cache keeps between passes is exactly the committed one.
 *
 * Each pass (a write transaction, as the engine's) mixes mints, puts of changed records
 * (text, deleted, access count, embed status), tags, new texts, child transactions that
 * commit or roll back, and borrows of random memories — minted in this pass, written in it,
 * or old; then it commits or fails (rolled back: its minted ids go to the next pass's mints,
 * with other texts). Every borrow is compared byte for byte (both records encoded) with a
 * fresh read in the same transaction, and again before the pass ends when nothing wrote it
 * since. The cache's bound is drawn per case: nothing kept, a record or two (evictions every
 * pass), or plenty.
 *
 * CPH_PROPERTY_SEED=<n> runs from that seed; CPH_PROPERTY_CASES=<n> sets how many cases. A
 * failure prints the case's seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "core/memcache.h"
#include "core/memory.h"
#include "store/records.h"
#include "store/store.h"
#include "tests/support/prop.h"
#include "tests/support/testutil.h"

#define DEFAULT_CASES 1500
#define MAX_IDS 64
#define BORROWS_HELD 32

typedef struct run {
  cph_store *st;
  cph_memory mem;
  uint64_t seed;
  uint64_t ids[MAX_IDS]; /* memories committed or minted, as the running pass sees them */
  size_t n_ids;
} run;

#define CHECK(cond, ...) CPH_PROP_CHECK(R->seed, cond, __VA_ARGS__)

static const char *const TEXTS[] = {"alpha", "the deploy failed twice", "", "bravo charlie",
                                    "a longer text that says more than the others do"};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* rec encoded into out (reset first). */
static void encode(run *R, const cph_memory_rec *rec, cph_buf *out) {
  out->len = 0;
  CHECK(cph_record_encode(&cph_memory_desc, rec, out) == CPH_OK, "encoding memory %llu",
        (unsigned long long)rec->id);
}

/* That *got is memory id as t reads it from the store. */
static void same_as_store(run *R, cph_txn *t, uint64_t id, const cph_memory_rec *got,
                          const char *when) {
  cph_memory_rec want;
  CHECK(memory_read(t, id, &want, "test") == CPH_OK, "%s: memory %llu unreadable", when,
        (unsigned long long)id);
  cph_buf a = {0}, b = {0};
  encode(R, got, &a);
  encode(R, &want, &b);
  CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0,
        "%s: memory %llu borrowed (text \"%s\", deleted %d, count %llu, tags %u) differs from "
        "the store's (text \"%s\", deleted %d, count %llu, tags %u)",
        when, (unsigned long long)id, got->text, got->deleted,
        (unsigned long long)got->access_count, got->n_tags, want.text, want.deleted,
        (unsigned long long)want.access_count, want.n_tags);
  cph_buf_free(&a);
  cph_buf_free(&b);
  cph_record_free(&cph_memory_desc, &want);
}

/* A changed copy of id's record, put through memory_put. */
static void rewrite(run *R, rng *r, cph_txn *t, uint64_t id) {
  cph_memory_rec m;
  CHECK(memory_read(t, id, &m, "test") == CPH_OK, "rewrite: memory %llu unreadable",
        (unsigned long long)id);
  switch (below(r, 4)) {
  case 0:
    free(m.text);
    m.text = strdup(TEXTS[below(r, N_TEXTS)]);
    break;
  case 1:
    m.deleted = !m.deleted;
    m.replaced_by = m.deleted ? R->ids[below(r, (uint32_t)R->n_ids)] : 0;
    break;
  case 2:
    m.access_count += 1 + below(r, 5);
    break;
  default:
    m.embed_status = (uint8_t)below(r, 4);
    break;
  }
  CHECK(m.text != NULL, "out of memory");
  CHECK(memory_put(&R->mem, t, &m) == CPH_OK, "put: %s", t->err.msg);
  cph_record_free(&cph_memory_desc, &m);
}

typedef struct held {
  uint64_t id;
  const cph_memory_rec *rec;
} held;

/* Random writes and borrows in t; held[] collects the borrows still valid. */
static void steps(run *R, rng *r, cph_txn *t, held *h, size_t *n_held, int n) {
  for (int s = 0; s < n; s++) {
    uint32_t op = below(r, 10);
    if (op == 0 || R->n_ids == 0) {
      if (R->n_ids == MAX_IDS)
        continue;
      uint64_t id;
      CHECK(memory_mint(&R->mem, t, below(r, 2) ? "s1" : "#general", (uint8_t)below(r, 3),
                        TEXTS[below(r, N_TEXTS)], below(r, 3) ? 0 : 1 + below(r, 9), false,
                        &id) == CPH_OK,
            "mint: %s", t->err.msg);
      R->ids[R->n_ids++] = id;
      continue;
    }
    uint64_t id = R->ids[below(r, (uint32_t)R->n_ids)];
    if (op <= 3) {
      if (op == 3 && below(r, 2))
        CHECK(memory_add_tag(&R->mem, t, id, "family:7") == CPH_OK, "tag: %s", t->err.msg);
      else if (op == 3)
        CHECK(memory_set_text(&R->mem, t, id, TEXTS[below(r, N_TEXTS)]) == CPH_OK,
              "set_text: %s", t->err.msg);
      else
        rewrite(R, r, t, id);
      for (size_t i = 0; i < *n_held; i++) /* a write ends a borrow of that memory */
        if (h[i].id == id)
          h[i] = h[--*n_held], i--;
      continue;
    }
    const cph_memory_rec *got;
    CHECK(memory_borrow(&R->mem, t, id, &got, "test") == CPH_OK, "borrow %llu: %s",
          (unsigned long long)id, t->err.msg);
    CHECK(got->id == id, "borrowed %llu for %llu", (unsigned long long)got->id,
          (unsigned long long)id);
    same_as_store(R, t, id, got, "a borrow");
    if (*n_held < BORROWS_HELD)
      h[(*n_held)++] = (held){id, got};
  }
}

/* Every record the cache keeps is the committed one. */
static void kept_match_store(run *R) {
  cph_txn t;
  CHECK(cph_txn_begin(R->st, false, &t) == CPH_OK, "read txn: %s", t.err.msg);
  size_t n = 0;
  for (cph_lru_link *l = R->mem.cache.kept.first; l; l = l->next, n++) {
    const memcache_entry *e = CPH_LRU_ENTRY(l, memcache_entry, lru);
    same_as_store(R, &t, e->id, &e->rec, "kept between passes");
  }
  CHECK(R->mem.cache.bytes <= R->mem.cache.max_bytes, "kept %zu bytes over the bound %zu",
        R->mem.cache.bytes, R->mem.cache.max_bytes);
  CHECK(!R->mem.cache.marks && !R->mem.cache.loose && !R->mem.cache.minted_from,
        "pass state left after the pass");
  CHECK(R->mem.cache.len == n, "%zu in the table, %zu kept", R->mem.cache.len, n);
  cph_txn_abort(&t);
}

static void pass(run *R, rng *r) {
  cph_txn t;
  CHECK(cph_txn_begin(R->st, true, &t) == CPH_OK, "write txn: %s", t.err.msg);
  size_t committed_ids = R->n_ids;
  held h[BORROWS_HELD];
  size_t n_held = 0;
  steps(R, r, &t, h, &n_held, 1 + (int)below(r, 12));
  if (below(r, 3) == 0) { /* a child transaction, as a request or a flush inside the pass */
    cph_txn c;
    CHECK(cph_txn_begin_child(&t, &c) == CPH_OK, "child: %s", t.err.msg);
    size_t ids_before = R->n_ids;
    held ch[BORROWS_HELD];
    size_t n_ch = 0;
    steps(R, r, &c, ch, &n_ch, 1 + (int)below(r, 8));
    for (size_t i = 0; i < n_ch; i++)
      same_as_store(R, &c, ch[i].id, ch[i].rec, "a borrow, later in the child");
    if (below(r, 2)) {
      CHECK(cph_txn_commit(&c) == CPH_OK, "child commit: %s", c.err.msg);
    } else {
      cph_txn_abort(&c);
      R->n_ids = ids_before;
    }
    n_held = 0; /* what the child wrote is unknown here: start over */
    steps(R, r, &t, h, &n_held, (int)below(r, 6));
  }
  for (size_t i = 0; i < n_held; i++)
    same_as_store(R, &t, h[i].id, h[i].rec, "a borrow, later in the pass");
  if (below(r, 4)) {
    CHECK(cph_txn_commit(&t) == CPH_OK, "commit: %s", t.err.msg);
  } else {
    cph_txn_abort(&t); /* a failed pass: its mints' ids are minted again */
    R->n_ids = committed_ids;
  }
  memory_pass_end(&R->mem);
  kept_match_store(R);
}

static void one_case(run *R, uint64_t seed, const char *dir) {
  rng r = {seed};
  R->seed = seed;
  cph_test_rmtree(dir);
  cph_store_options o = {dir, (size_t)1 << 28, CPH_SYNC_NONE};
  cph_err err = {0};
  CHECK(cph_store_open(&o, &R->st, &err) == CPH_OK, "store: %s", err.msg);
  static const long long bounds[] = {0, 300, 700, 1 << 20};
  memory_test_cache_bytes(bounds[below(&r, 4)]);
  memset(&R->mem, 0, sizeof R->mem);
  memory_cache_open(&R->mem);
  R->n_ids = 0;
  int passes = 2 + (int)below(&r, 30);
  for (int p = 0; p < passes; p++)
    pass(R, &r);
  memory_free(&R->mem);
  cph_store_close(R->st);
  memory_test_cache_bytes(-1);
}

static void test_borrowed_records_are_the_stored_ones(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(1717, DEFAULT_CASES, &seed, &cases);
  run R = {0};
  char *dir = cph_test_tmpdir("memcache");
  for (long c = 0; c < cases; c++)
    one_case(&R, seed + (uint64_t)c, dir);
  cph_test_rmtree(dir);
  free(dir);
}

/* The cache itself: kept records are found until forgotten, the least recently used go first
 * at the pass's end, and a mark keeps an id out until then. */
static void test_kept_found_and_evicted_by_use(void **state) {
  (void)state;
  cph_memcache c;
  memcache_init(&c, 3 * (sizeof(memcache_entry) + 10));
  for (uint64_t id = 1; id <= 4; id++) {
    cph_memory_rec m = {.id = id, .session = strdup("s"), .text = strdup("t")};
    assert_non_null(memcache_keep(&c, &m, 10));
    assert_null(m.session); /* taken */
  }
  assert_non_null(memcache_get(&c, 1)); /* 1 is now the most recently used */
  memcache_pass_end(&c);                /* 4 kept, bound 3: 2 (the oldest use) goes */
  assert_null(memcache_get(&c, 2));
  assert_non_null(memcache_get(&c, 1));
  assert_non_null(memcache_get(&c, 3));
  assert_non_null(memcache_get(&c, 4));
  memcache_mark_written(&c, 3);
  assert_null(memcache_get(&c, 3));
  cph_memory_rec m = {.id = 3, .session = strdup("s"), .text = strdup("new")};
  const cph_memory_rec *loose = memcache_keep(&c, &m, 10); /* written this pass: not kept */
  assert_string_equal(loose->text, "new");
  assert_null(memcache_get(&c, 3));
  memcache_minted(&c, 9);
  cph_memory_rec n = {.id = 12, .session = strdup("s"), .text = strdup("minted")};
  assert_non_null(memcache_keep(&c, &n, 10));
  assert_null(memcache_get(&c, 12)); /* minted this pass (12 >= 9): not kept */
  memcache_pass_end(&c);
  cph_memory_rec o = {.id = 3, .session = strdup("s"), .text = strdup("new")};
  assert_non_null(memcache_keep(&c, &o, 10));
  assert_string_equal(memcache_get(&c, 3)->text, "new"); /* kept again after the pass */
  memcache_clear(&c);
  assert_null(memcache_get(&c, 1));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kept_found_and_evicted_by_use),
      cmocka_unit_test(test_borrowed_records_are_the_stored_ones),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
