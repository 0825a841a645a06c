/* Schema 4's forms, written from a schema-5 data dir (tests/support/schema4.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "tests/support/schema4.h"

/* The keys and values of db, copied (writes in the txn may move the store's). */
typedef struct rows {
  cph_key *keys;
  uint8_t **vals;
  size_t *lens;
  size_t n;
} rows;

static rows rows_of(cph_txn *t, cph_db db, uint8_t tag) {
  rows r = {0};
  size_t cap = 0;
  cph_cursor c;
  cph_val k, v;
  assert_int_equal(cph_cursor_open(t, db, &c), CPH_OK);
  cph_key from = {.data = {tag}, .len = 1};
  for (int rc = cph_cursor_seek(&c, tag ? &from : NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    if (tag && ((const uint8_t *)k.data)[0] != tag)
      break;
    if (r.n == cap) {
      cap = cap ? cap * 2 : 64;
      r.keys = realloc(r.keys, cap * sizeof *r.keys);
      r.vals = realloc(r.vals, cap * sizeof *r.vals);
      r.lens = realloc(r.lens, cap * sizeof *r.lens);
      assert_true(r.keys && r.vals && r.lens);
    }
    cph_key_reset(&r.keys[r.n]);
    memcpy(r.keys[r.n].data, k.data, k.len);
    r.keys[r.n].len = k.len;
    r.vals[r.n] = malloc(v.len + 1);
    assert_non_null(r.vals[r.n]);
    memcpy(r.vals[r.n], v.data, v.len);
    r.lens[r.n++] = v.len;
  }
  cph_cursor_close(&c);
  return r;
}

static void rows_free(rows *r) {
  for (size_t i = 0; i < r->n; i++)
    free(r->vals[i]);
  free(r->keys);
  free(r->vals);
  free(r->lens);
}

size_t cph_test_embed_rows_of_one(cph_txn *t) {
  rows r = rows_of(t, CPH_DB_EMBED_QUEUE, 0);
  size_t split = 0;
  for (size_t i = 0; i < r.n; i++) {
    if (r.lens[i] != 8)
      continue;
    split++;
    uint64_t last = cph_be64_get(r.vals[i]);
    for (uint64_t id = cph_be64_get(r.keys[i].data); id <= last; id++) {
      cph_key k = cph_key_of_u64(id);
      assert_int_equal(cph_txn_put(t, CPH_DB_EMBED_QUEUE, &k, "", 0), CPH_OK);
    }
  }
  rows_free(&r);
  return split;
}

size_t cph_test_dedupe_rows_to_entries(cph_txn *t) {
  rows r = rows_of(t, CPH_DB_DEDUPE, 0xFE);
  size_t wrote = 0;
  for (size_t i = 0; i < r.n; i++) {
    assert_int_equal(r.keys[i].len, 9);
    assert_int_equal(r.vals[i][0], 2);
    assert_int_equal((r.lens[i] - 9) % 72, 0);
    for (size_t at = 9; at < r.lens[i]; at += 72) {
      const uint8_t *e = r.vals[i] + at; /* sha, family, event, first_ms, last_ms, simhash */
      cph_key k;
      cph_key_reset(&k);
      k.data[0] = 0xFF;
      memcpy(k.data + 1, e + 56, 8);
      memcpy(k.data + 9, e, 32);
      k.len = 41;
      uint8_t v[41];
      v[0] = 1;
      memcpy(v + 1, e + 32, 16);  /* family, event id */
      memcpy(v + 17, e + 48, 16); /* first_ms, last_ms */
      memcpy(v + 33, e + 64, 8);  /* simhash */
      assert_int_equal(cph_txn_put(t, CPH_DB_DEDUPE, &k, v, sizeof v), CPH_OK);
      wrote++;
    }
    assert_int_equal(cph_txn_del(t, CPH_DB_DEDUPE, &r.keys[i]), CPH_OK);
  }
  rows_free(&r);
  return wrote;
}

void cph_test_set_schema4(cph_txn *t) {
  cph_key k;
  cph_key_reset(&k);
  memcpy(k.data, "schema_version", 14);
  k.len = 14;
  uint8_t v4[4] = {0, 0, 0, 4};
  assert_int_equal(cph_txn_put(t, CPH_DB_META, &k, v4, sizeof v4), CPH_OK);
}
