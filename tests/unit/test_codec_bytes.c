/* The record encoder (store/codec.c) writes what msgpack-c's packer writes, byte for byte:
 * the stored format did not change when the packer left the encoding path. Every record kind
 * is filled at random — integers around every width boundary, strings and arrays around
 * every header boundary, nil and present optional strings — encoded by both, compared, and
 * decoded back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "store/codec_internal.h"
#include "store/records.h"
#include "tests/support/prop.h"

/* ---------------------------------------------------------------- msgpack-c, as before */

static int ref_write(void *data, const char *bytes, size_t len) {
  cph_buf_append(data, bytes, len);
  return 0;
}

static void ref_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void ref_field(msgpack_packer *pk, const cph_field *f, const char *rec) {
  const void *at = rec + f->offset;
  switch (f->type) {
  case CPH_F_U8:
    msgpack_pack_uint8(pk, *(const uint8_t *)at);
    break;
  case CPH_F_BOOL:
    if (*(const bool *)at)
      msgpack_pack_true(pk);
    else
      msgpack_pack_false(pk);
    break;
  case CPH_F_U32:
    msgpack_pack_uint32(pk, *(const uint32_t *)at);
    break;
  case CPH_F_U64:
    msgpack_pack_uint64(pk, *(const uint64_t *)at);
    break;
  case CPH_F_I64:
    msgpack_pack_int64(pk, *(const int64_t *)at);
    break;
  case CPH_F_F64:
    msgpack_pack_double(pk, *(const double *)at);
    break;
  case CPH_F_STR: {
    const char *s = *(char *const *)at;
    ref_str(pk, s ? s : "");
    break;
  }
  case CPH_F_OPT_STR: {
    const char *s = *(char *const *)at;
    if (s)
      ref_str(pk, s);
    else
      msgpack_pack_nil(pk);
    break;
  }
  case CPH_F_STR_ARRAY: {
    char *const *items = *(char **const *)at;
    uint32_t n = *(const uint32_t *)(rec + f->count_offset);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
      ref_str(pk, items[i] ? items[i] : "");
    break;
  }
  case CPH_F_U64_ARRAY: {
    const uint64_t *items = *(uint64_t *const *)at;
    uint32_t n = *(const uint32_t *)(rec + f->count_offset);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
      msgpack_pack_uint64(pk, items[i]);
    break;
  }
  case CPH_F_I64_ARRAY: {
    const int64_t *items = *(int64_t *const *)at;
    uint32_t n = *(const uint32_t *)(rec + f->count_offset);
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
      msgpack_pack_int64(pk, items[i]);
    break;
  }
  case CPH_F_BYTES:
    msgpack_pack_bin(pk, f->limit);
    msgpack_pack_bin_body(pk, at, f->limit);
    break;
  }
}

static void ref_encode(const cph_record_desc *d, const void *rec, cph_buf *out) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, out, ref_write);
  msgpack_pack_array(&pk, d->n_fields + 1);
  msgpack_pack_uint32(&pk, d->version);
  for (size_t i = 0; i < d->n_fields; i++)
    ref_field(&pk, &d->fields[i], rec);
}

/* ---------------------------------------------------------------- random records */

/* Near a boundary of the msgpack forms, or anywhere. */
static uint64_t draw_u64(rng *r) {
  static const uint64_t edges[] = {0,
                                   1,
                                   31,
                                   32,
                                   127,
                                   128,
                                   255,
                                   256,
                                   65535,
                                   65536,
                                   1u << 31,
                                   0xFFFFFFFFu,
                                   UINT64_C(1) << 32,
                                   UINT64_MAX};
  switch (below(r, 3)) {
  case 0:
    return edges[below(r, sizeof edges / sizeof edges[0])];
  case 1:
    return edges[below(r, sizeof edges / sizeof edges[0])] - 1 + below(r, 3);
  default:
    return next(r) >> below(r, 64);
  }
}

static int64_t draw_i64(rng *r) {
  uint64_t u = draw_u64(r);
  return below(r, 2) ? (int64_t)u : -(int64_t)(u >> 1) - (int64_t)below(r, 2);
}

static size_t draw_len(rng *r) {
  static const size_t edges[] = {0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536};
  size_t e = edges[below(r, sizeof edges / sizeof edges[0])];
  if (e > 1000 && below(r, 4)) /* the long ones now and then */
    e = below(r, 300);
  return e ? e - 1 + below(r, 3) : 0;
}

static char *draw_str(rng *r) {
  size_t n = draw_len(r);
  char *s = malloc(n + 1);
  for (size_t i = 0; i < n; i++)
    s[i] = (char)('a' + below(r, 26));
  s[n] = '\0';
  return s;
}

static void fill(const cph_record_desc *d, char *rec, rng *r) {
  memset(rec, 0, d->size);
  for (size_t i = 0; i < d->n_fields; i++) {
    const cph_field *f = &d->fields[i];
    void *at = rec + f->offset;
    switch (f->type) {
    case CPH_F_U8: {
      uint8_t v = (uint8_t)draw_u64(r);
      *(uint8_t *)at = f->limit ? (uint8_t)(v % f->limit) : v;
      break;
    }
    case CPH_F_BOOL:
      *(bool *)at = below(r, 2);
      break;
    case CPH_F_U32:
      *(uint32_t *)at = (uint32_t)draw_u64(r);
      break;
    case CPH_F_U64:
      *(uint64_t *)at = draw_u64(r);
      break;
    case CPH_F_I64:
      *(int64_t *)at = draw_i64(r);
      break;
    case CPH_F_F64:
      *(double *)at = (double)draw_i64(r) / 7.0;
      break;
    case CPH_F_STR:
    case CPH_F_OPT_STR:
      *(char **)at = f->type == CPH_F_OPT_STR && below(r, 3) == 0 ? NULL : draw_str(r);
      break;
    case CPH_F_STR_ARRAY:
    case CPH_F_U64_ARRAY:
    case CPH_F_I64_ARRAY: {
      uint32_t n = below(r, 4) ? below(r, 20) : (uint32_t)draw_len(r) % 70000;
      *(uint32_t *)(rec + f->count_offset) = n;
      if (f->type == CPH_F_STR_ARRAY) {
        char **items = calloc(n ? n : 1, sizeof *items);
        for (uint32_t j = 0; j < n; j++)
          items[j] = j < 40 ? draw_str(r) : strdup("x");
        *(char ***)at = items;
      } else {
        uint64_t *items = calloc(n ? n : 1, sizeof *items);
        for (uint32_t j = 0; j < n; j++)
          items[j] = f->type == CPH_F_U64_ARRAY ? draw_u64(r) : (uint64_t)draw_i64(r);
        *(uint64_t **)at = items;
      }
      break;
    }
    case CPH_F_BYTES:
      for (unsigned j = 0; j < f->limit; j++)
        ((uint8_t *)at)[j] = (uint8_t)next(r);
      break;
    }
  }
}

/* ---------------------------------------------------------------- the test */

static void test_encoder_writes_msgpack_c_bytes_for_every_record_kind(void **state) {
  (void)state;
  const cph_record_desc *descs[] = {&cph_session_desc,   &cph_event_desc,   &cph_inbox_desc,
                                    &cph_turn_desc,      &cph_reply_desc,   &cph_memory_desc,
                                    &cph_job_desc,       &cph_outbox_desc,  &cph_gc_group_desc,
                                    &cph_aggregate_desc, &cph_ctxnode_desc, &cph_ctxnode_v1_desc,
                                    &cph_ctxhead_desc,   &cph_seal_desc,    &cph_turnctx_desc};
  uint64_t seed0;
  long cases;
  cph_property_run(3300, 150, &seed0, &cases);
  for (long c = 0; c < cases; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rng r = {seed};
    for (size_t k = 0; k < sizeof descs / sizeof descs[0]; k++) {
      const cph_record_desc *d = descs[k];
      char *rec = calloc(1, d->size), *back = calloc(1, d->size);
      fill(d, rec, &r);
      cph_buf want = CPH_BUF_INIT, got = CPH_BUF_INIT;
      ref_encode(d, rec, &want);
      assert_int_equal(cph_record_encode(d, rec, &got), 0);
      if (got.len != want.len || memcmp(got.data, want.data, want.len) != 0)
        fail_msg("seed %llu: %s record: %zu bytes, msgpack-c writes %zu (or they differ)",
                 (unsigned long long)seed, d->name, got.len, want.len);
      /* the one-pass form: its size first, then the same bytes */
      size_t n = cph_record_encode_to(d, rec, NULL, 0);
      assert_int_equal(n, want.len);
      char *direct = malloc(n ? n : 1);
      assert_int_equal(cph_record_encode_to(d, rec, direct, n), n);
      assert_memory_equal(direct, want.data, n);
      cph_err err;
      if (cph_record_decode(d, got.data, got.len, back, &err))
        fail_msg("seed %llu: %s record does not decode: %s", (unsigned long long)seed, d->name,
                 err.msg);
      cph_buf again = CPH_BUF_INIT;
      cph_record_encode(d, back, &again);
      assert_int_equal(again.len, want.len);
      assert_memory_equal(again.data, want.data, want.len);
      free(direct);
      cph_buf_free(&want);
      cph_buf_free(&got);
      cph_buf_free(&again);
      cph_record_free(d, rec);
      cph_record_free(d, back);
      free(rec);
      free(back);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoder_writes_msgpack_c_bytes_for_every_record_kind),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
