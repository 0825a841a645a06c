/* The embed queue's rows (core/memory.h, schema 5): an ingest request queues its memories'
 * embeddings as one row per run of consecutive ids; taking an id out (an embedding done, a
 * memory gc deleted) must leave exactly the other ids queued, whether it was the first, a
 * middle, the last or the only id of its row; a schema-4 row (empty value) is a range of one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "core/memory.h"
#include "store/store.h"
#include "tests/support/testutil.h"

typedef struct fixture {
  char *dir;
  cph_store *st;
  cph_memory mem;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->dir = cph_test_tmpdir("embed-queue");
  cph_store_options o = {f->dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_err err = {0};
  if (cph_store_open(&o, &f->st, &err))
    fail_msg("store %s: %s", f->dir, err.msg);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  memory_free(&f->mem);
  cph_store_close(f->st);
  cph_test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

/* Mints n memories in one write txn, as one ingest request (batched) or one by one; embed[i]
 * says whether memory i queues its embedding. Their ids are 1, 2, ... in a fresh store. */
static void mint(fixture *f, size_t n, const bool *embed, bool batched) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  if (batched)
    memory_batch_begin(&f->mem, cph_wall_ms());
  for (size_t i = 0; i < n; i++)
    assert_int_equal(
        memory_mint(&f->mem, &t, "#general", CPH_MEMORY_RAW, "text", 0, embed[i], NULL), CPH_OK);
  if (batched)
    assert_int_equal(memory_batch_flush(&f->mem, &t), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
}

/* Checks that exactly ids[0..n) are queued, in order: through pending, oldest and count; and
 * that the queue's rows number `rows`. */
static void assert_queued(fixture *f, const uint64_t *ids, size_t n, size_t rows) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, false, &t), CPH_OK);
  uint64_t got[64];
  size_t n_got = 0;
  assert_int_equal(memory_embed_pending(&t, got, 64, &n_got), CPH_OK);
  assert_int_equal(n_got, n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(got[i], ids[i]);
  uint64_t count = 0;
  assert_int_equal(memory_embed_count(&t, &count), CPH_OK);
  assert_int_equal(count, n);
  assert_int_equal(memory_embed_oldest(&t), n ? ids[0] : UINT64_MAX);
  size_t stored = 0;
  assert_int_equal(cph_txn_count(&t, CPH_DB_EMBED_QUEUE, &stored), CPH_OK);
  assert_int_equal(stored, rows);
  if (n > 2) { /* a pending list cut short stops at the cut */
    assert_int_equal(memory_embed_pending(&t, got, 2, &n_got), CPH_OK);
    assert_int_equal(n_got, 2);
    assert_int_equal(got[1], ids[1]);
  }
  cph_txn_abort(&t);
}

static int unqueue(fixture *f, uint64_t id) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  int rc = memory_embed_unqueue(&t, id);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  return rc;
}

static void test_a_request_queues_each_run_of_consecutive_ids_as_one_row(void **state) {
  fixture *f = *state;
  bool embed[12] = {true, true, true, true, true, false, true, true, true, true, true, true};
  mint(f, 12, embed, true); /* 1..5, then 7..12: memory 6 is not queued */
  uint64_t want[] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12};
  assert_queued(f, want, 11, 2);
  mint(f, 2, embed, false); /* 13, 14 one at a time: a row each */
  uint64_t more[] = {1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14};
  assert_queued(f, more, 13, 4);
}

static void test_unqueue_splits_a_range_at_its_first_middle_last_and_only_id(void **state) {
  fixture *f = *state;
  bool embed[10] = {true, true, true, true, true, true, true, true, true, true};
  mint(f, 10, embed, true); /* one row: 1..10 */
  assert_queued(f, (uint64_t[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10, 1);
  assert_int_equal(unqueue(f, 1), CPH_OK); /* first: 2..10 */
  assert_queued(f, (uint64_t[]){2, 3, 4, 5, 6, 7, 8, 9, 10}, 9, 1);
  assert_int_equal(unqueue(f, 10), CPH_OK); /* last: 2..9 */
  assert_queued(f, (uint64_t[]){2, 3, 4, 5, 6, 7, 8, 9}, 8, 1);
  assert_int_equal(unqueue(f, 5), CPH_OK); /* middle: 2..4, 6..9 */
  assert_queued(f, (uint64_t[]){2, 3, 4, 6, 7, 8, 9}, 7, 2);
  assert_int_equal(unqueue(f, 5), CPH_ENOTFOUND); /* in the gap */
  assert_int_equal(unqueue(f, 1), CPH_ENOTFOUND); /* before every row */
  assert_int_equal(unqueue(f, 11), CPH_ENOTFOUND); /* after every row */
  assert_int_equal(unqueue(f, 3), CPH_OK);         /* middle of three: 2, 4, 6..9 */
  assert_queued(f, (uint64_t[]){2, 4, 6, 7, 8, 9}, 6, 3);
  assert_int_equal(unqueue(f, 2), CPH_OK); /* a whole range of one */
  assert_int_equal(unqueue(f, 4), CPH_OK);
  assert_queued(f, (uint64_t[]){6, 7, 8, 9}, 4, 1);
  assert_int_equal(unqueue(f, 8), CPH_OK); /* 6..7, 9 */
  assert_int_equal(unqueue(f, 7), CPH_OK); /* the last of 6..7: 6, 9 */
  assert_queued(f, (uint64_t[]){6, 9}, 2, 2);
  assert_int_equal(unqueue(f, 6), CPH_OK);
  assert_int_equal(unqueue(f, 9), CPH_OK);
  assert_queued(f, NULL, 0, 0);
}

/* Schema 4 wrote one row per id with an empty value: read and taken out as ranges of one,
 * beside schema-5 ranges. */
static void test_schema4_rows_are_ranges_of_one(void **state) {
  fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->st, true, &t), CPH_OK);
  for (uint64_t id = 3; id <= 5; id++) {
    cph_key k = cph_key_of_u64(id);
    assert_int_equal(cph_txn_put(&t, CPH_DB_EMBED_QUEUE, &k, "", 0), CPH_OK);
  }
  cph_key k = cph_key_of_u64(7); /* a schema-5 range 7..9 after them */
  uint8_t last[8];
  cph_be64_put(last, 9);
  assert_int_equal(cph_txn_put(&t, CPH_DB_EMBED_QUEUE, &k, last, sizeof last), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_queued(f, (uint64_t[]){3, 4, 5, 7, 8, 9}, 6, 4);
  assert_int_equal(unqueue(f, 4), CPH_OK);
  assert_int_equal(unqueue(f, 6), CPH_ENOTFOUND);
  assert_int_equal(unqueue(f, 8), CPH_OK);
  assert_queued(f, (uint64_t[]){3, 5, 7, 9}, 4, 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_a_request_queues_each_run_of_consecutive_ids_as_one_row,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_unqueue_splits_a_range_at_its_first_middle_last_and_only_id, setup, teardown),
      cmocka_unit_test_setup_teardown(test_schema4_rows_are_ranges_of_one, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
