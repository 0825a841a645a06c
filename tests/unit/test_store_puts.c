/* A write transaction's puts go through cursors it keeps per database (store/txn.c): opened
 * by a database's second put, closed before the txn ends or begins a child. Whatever the mix —
 * runs of keys in two ranges, appends, overwrites, deletes between puts, child transactions
 * committed and aborted, top-level commits and aborts — the store holds exactly what a plain
 * map says it should. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "tests/support/prop.h"
#include "tests/support/testutil.h"

#define KEYS 600 /* two ranges of 300 in each of two databases */

/* What each database holds: the value's first byte per key, 0 for none. */
typedef struct model {
  uint8_t v[2][KEYS];
} model;

static const cph_db DBS[2] = {CPH_DB_INBOX, CPH_DB_CHANNEL_LOG};

static cph_key key_of(uint32_t k) {
  cph_key key;
  cph_key_reset(&key);
  cph_key_str(&key, k < KEYS / 2 ? "a" : "b"); /* two ranges, as two sessions' inboxes */
  cph_key_u64(&key, k % (KEYS / 2));
  return key;
}

/* Random puts (mostly in runs: the next key, or the next in the other range), appends past
 * the end, overwrites and deletes, into t; m follows. */
static void writes(cph_txn *t, model *m, rng *r, int n) {
  uint32_t at[2] = {below(r, KEYS / 2), KEYS / 2 + below(r, KEYS / 2)};
  for (int i = 0; i < n; i++) {
    int d = (int)below(r, 2), run = (int)below(r, 2);
    uint32_t op = below(r, 10);
    uint32_t k = op < 7 ? at[run] : below(r, KEYS);
    at[run] = run ? KEYS / 2 + (at[run] + 1) % (KEYS / 2) : (at[run] + 1) % (KEYS / 2);
    cph_key key = key_of(k);
    if (op == 9) {
      int rc = cph_txn_del(t, DBS[d], &key);
      assert_int_equal(rc, m->v[d][k] ? CPH_OK : CPH_ENOTFOUND);
      m->v[d][k] = 0;
      continue;
    }
    uint8_t val[40];
    memset(val, 1 + (int)below(r, 250), sizeof val);
    size_t len = 1 + below(r, sizeof val);
    int rc = op == 8 ? cph_txn_append(t, DBS[d], &key, val, len)
                     : cph_txn_put(t, DBS[d], &key, val, len);
    assert_int_equal(rc, CPH_OK);
    m->v[d][k] = val[0];
  }
}

static void expect(cph_store *s, const model *m, uint64_t seed) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  for (int d = 0; d < 2; d++)
    for (uint32_t k = 0; k < KEYS; k++) {
      cph_key key = key_of(k);
      cph_val v;
      int rc = cph_txn_get(&t, DBS[d], &key, &v);
      uint8_t got = rc == CPH_OK ? ((const uint8_t *)v.data)[0] : 0;
      if (got != m->v[d][k])
        fail_msg("seed %llu: database %d key %u holds %u, want %u", (unsigned long long)seed, d, k,
                 got, m->v[d][k]);
    }
  cph_txn_abort(&t);
}

static void test_puts_through_kept_cursors_store_what_a_map_says(void **state) {
  (void)state;
  uint64_t seed0;
  long cases;
  cph_property_run(6200, 200, &seed0, &cases);
  for (long c = 0; c < cases; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rng r = {seed};
    char *dir = cph_test_tmpdir("store_puts");
    cph_store_options o = {dir, 64u << 20, CPH_SYNC_NONE};
    cph_store *s = NULL;
    cph_err err = {0};
    if (cph_store_open(&o, &s, &err))
      fail_msg("open %s: %s", dir, err.msg);
    static model m, pass;
    memset(&m, 0, sizeof m);
    for (int round = 0; round < 12; round++) {
      cph_txn t;
      assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
      pass = m;
      writes(&t, &pass, &r, (int)below(&r, 200));
      for (int k = (int)below(&r, 4); k > 0; k--) { /* children, between the parent's puts */
        cph_txn child;
        assert_int_equal(cph_txn_begin_child(&t, &child), CPH_OK);
        model in_child = pass;
        writes(&child, &in_child, &r, (int)below(&r, 300));
        if (below(&r, 3)) {
          assert_int_equal(cph_txn_commit(&child), CPH_OK);
          pass = in_child;
        } else {
          cph_txn_abort(&child);
        }
        writes(&t, &pass, &r, (int)below(&r, 50));
      }
      if (below(&r, 4)) {
        assert_int_equal(cph_txn_commit(&t), CPH_OK);
        m = pass;
      } else {
        cph_txn_abort(&t);
      }
      expect(s, &m, seed);
    }
    cph_store_close(s);
    cph_test_rmtree(dir);
    free(dir);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_puts_through_kept_cursors_store_what_a_map_says),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
