/* Memory accesses counted in memory and written in batches (core/memaccess.h), against a real
 * LMDB in a temp dir: over thousands of seeded random runs of passes — accesses noted, flushes
 * due or not, memories deleted, passes that commit or fail — every memory's stored
 * access_count plus what is pending equals the accesses of the passes that committed, its
 * last_access the newest of them, inside a pass too; a deleted memory stays deleted; and a
 * final flush leaves nothing pending and every count in its record.
 * A failing case prints its seed (tests/support/prop.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/memaccess.h"
#include "core/memory.h"
#include "store/records.h"
#include "store/store.h"
#include "tests/support/prop.h"
#include "tests/support/testutil.h"

#define DEFAULT_CASES 2000
#define MEMORIES 12

typedef struct run {
  cph_store *st;
  cph_memory mem;
  uint64_t seed;
  int64_t now_ns; /* the engine clock the runs advance */
  int64_t wall_ms;
  uint64_t ids[MEMORIES];
  uint64_t count[MEMORIES]; /* accesses of committed passes */
  int64_t last[MEMORIES];   /* the newest of them */
  bool deleted[MEMORIES];
} run;

#define CHECK(cond, ...) CPH_PROP_CHECK(R->seed, cond, __VA_ARGS__)

/* The record of memory i as t sees it: false when it is gone. */
static bool stored(run *R, cph_txn *t, int i, cph_memory_rec *m) {
  cph_key k = cph_key_of_u64(R->ids[i]);
  int rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, m);
  CHECK(rc == CPH_OK || rc == CPH_ENOTFOUND, "reading memory %llu: %s",
        (unsigned long long)R->ids[i], t->err.msg);
  return rc == CPH_OK;
}

/* Every memory as t sees it, against the model plus extra[] (this pass's notes so far). */
static void check_all(run *R, cph_txn *t, const uint64_t *extra, const int64_t *extra_last,
                      const char *when) {
  for (int i = 0; i < MEMORIES; i++) {
    cph_memory_rec m;
    bool there = stored(R, t, i, &m);
    CHECK(there != R->deleted[i], "%s: memory %d is %s", when, i,
          there ? "back after its delete" : "missing");
    if (!there)
      continue;
    uint64_t pending;
    int64_t last;
    memaccess_pending(&R->mem.access, R->ids[i], &pending, &last);
    uint64_t want = R->count[i] + (extra ? extra[i] : 0);
    int64_t want_last = R->last[i];
    if (extra_last && extra_last[i] > want_last)
      want_last = extra_last[i];
    int64_t got_last = m.last_access_ms > last ? m.last_access_ms : last;
    CHECK(m.access_count + pending == want,
          "%s: memory %d counts %llu stored + %llu pending, want %llu", when, i,
          (unsigned long long)m.access_count, (unsigned long long)pending,
          (unsigned long long)want);
    CHECK(got_last == want_last, "%s: memory %d last access %lld, want %lld", when, i,
          (long long)got_last, (long long)want_last);
    cph_record_free(&cph_memory_desc, &m);
  }
}

static void read_check(run *R, const char *when) {
  cph_txn t;
  CHECK(cph_txn_begin(R->st, false, &t) == CPH_OK, "read txn: %s", t.err.msg);
  check_all(R, &t, NULL, NULL, when);
  cph_txn_abort(&t);
}

/* One pass: maybe a flush (when due, or forced), notes and deletes, then commit or fail. */
static void pass(run *R, rng *r, bool force_flush) {
  cph_txn t;
  CHECK(cph_txn_begin(R->st, true, &t) == CPH_OK, "write txn: %s", t.err.msg);
  if (force_flush || memaccess_flush_due(&R->mem.access, R->now_ns))
    CHECK(memory_flush_accesses(&R->mem, &t) == CPH_OK, "flush: %s", t.err.msg);
  uint64_t noted[MEMORIES] = {0};
  int64_t noted_last[MEMORIES] = {0};
  bool deleted_now[MEMORIES] = {0};
  int ops = force_flush ? 0 : (int)below(r, 12);
  for (int n = 0; n < ops; n++) {
    int i = (int)below(r, MEMORIES);
    if (R->deleted[i] || deleted_now[i])
      continue;
    if (below(r, 40) == 0) { /* gc deletes it (its count goes with it) */
      cph_key k = cph_key_of_u64(R->ids[i]);
      CHECK(cph_txn_del(&t, CPH_DB_MEMORIES, &k) == CPH_OK, "delete: %s", t.err.msg);
      deleted_now[i] = true;
      continue;
    }
    R->wall_ms += below(r, 3);
    CHECK(memaccess_note(&R->mem.access, R->ids[i], R->wall_ms) == CPH_OK, "note");
    noted[i]++;
    noted_last[i] = R->wall_ms;
  }
  /* inside the pass: what a lease or gc_plan would read */
  bool was[MEMORIES];
  memcpy(was, R->deleted, sizeof was);
  for (int i = 0; i < MEMORIES; i++)
    R->deleted[i] = R->deleted[i] || deleted_now[i];
  check_all(R, &t, noted, noted_last, "inside a pass");
  bool commit = force_flush || below(r, 6) != 0;
  if (commit) {
    CHECK(cph_txn_commit(&t) == CPH_OK, "commit: %s", t.err.msg);
  } else {
    cph_txn_abort(&t); /* a failed commit: nothing of the pass landed */
    memcpy(R->deleted, was, sizeof was);
  }
  R->now_ns += (int64_t)below(r, 700) * 1000000; /* up to 0.7 s a pass */
  memaccess_pass_end(&R->mem.access, commit, R->now_ns);
  memory_pass_end(&R->mem); /* as the engine ends every pass: the flush's puts marked ids */
  for (int i = 0; commit && i < MEMORIES; i++) {
    R->count[i] += noted[i];
    if (noted[i] && noted_last[i] > R->last[i])
      R->last[i] = noted_last[i];
  }
  read_check(R, commit ? "after a pass" : "after a failed pass");
}

static void one_case(run *R, uint64_t seed) {
  rng r = {seed};
  R->seed = seed;
  memaccess_free(&R->mem.access);
  memaccess_init(&R->mem.access, R->now_ns);
  cph_txn t;
  CHECK(cph_txn_begin(R->st, true, &t) == CPH_OK, "write txn: %s", t.err.msg);
  for (int i = 0; i < MEMORIES; i++) {
    CHECK(memory_mint(&R->mem, &t, "s1", CPH_MEMORY_RAW, "a memory", 0, false, &R->ids[i]) ==
              CPH_OK,
          "mint: %s", t.err.msg);
    R->count[i] = 0;
    R->last[i] = 0;
    R->deleted[i] = false;
  }
  CHECK(cph_txn_commit(&t) == CPH_OK, "commit: %s", t.err.msg);
  int passes = 1 + (int)below(&r, 25);
  for (int p = 0; p < passes; p++)
    pass(R, &r, false);
  pass(R, &r, true); /* a flush that commits: nothing is left pending */
  CHECK(memaccess_len(&R->mem.access) == 0, "%zu memories still pending after a flush",
        memaccess_len(&R->mem.access));
}

static void test_counts_add_up_over_random_passes(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(4242, DEFAULT_CASES, &seed, &cases);
  run R = {0};
  char *dir = cph_test_tmpdir("memaccess");
  cph_store_options o = {dir, (size_t)1 << 30, CPH_SYNC_NONE};
  cph_err err = {0};
  if (cph_store_open(&o, &R.st, &err))
    fail_msg("store: %s", err.msg);
  R.now_ns = 1000 * (int64_t)1000000000;
  R.wall_ms = 1700000000000;
  memaccess_init(&R.mem.access, R.now_ns);
  for (long c = 0; c < cases; c++)
    one_case(&R, seed + (uint64_t)c);
  memaccess_free(&R.mem.access);
  memory_free(&R.mem);
  cph_store_close(R.st);
  cph_test_rmtree(dir);
  free(dir);
}

/* A flush is due only once a second has passed since the last one committed (or when many
 * memories wait), and never while the pass has noted something. */
static void test_flush_waits_a_second(void **state) {
  (void)state;
  cph_memaccess ma;
  memaccess_init(&ma, 0);
  assert_false(memaccess_flush_due(&ma, 5 * MEMACCESS_FLUSH_NS)); /* nothing pending */
  assert_int_equal(memaccess_note(&ma, 7, 100), CPH_OK);
  assert_false(memaccess_flush_due(&ma, 5 * MEMACCESS_FLUSH_NS)); /* the pass noted it */
  memaccess_pass_end(&ma, true, MEMACCESS_FLUSH_NS / 2);
  assert_false(memaccess_flush_due(&ma, MEMACCESS_FLUSH_NS / 2));
  assert_true(memaccess_flush_due(&ma, MEMACCESS_FLUSH_NS));
  uint64_t n;
  int64_t last;
  memaccess_pending(&ma, 7, &n, &last);
  assert_int_equal(n, 1);
  assert_int_equal(last, 100);
  memaccess_pending(&ma, 8, &n, &last);
  assert_int_equal(n, 0);
  memaccess_free(&ma);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flush_waits_a_second),
      cmocka_unit_test(test_counts_add_up_over_random_passes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
