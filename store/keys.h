/* Key encodings. Integers are big-endian so LMDB's byte order is numeric order; strings in
 * composite keys end with a NUL byte so "a" sorts before, and never prefixes, "ab". */
#ifndef CEPHALON_STORE_KEYS_H
#define CEPHALON_STORE_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../common/buf.h"

/* LMDB's default maximum key size. */
#define CPH_KEY_MAX 511

/* Big-endian loads and stores, written as one unaligned access and a byte swap (GCC at -O2
 * does not always see through the byte loop: a kept context's trim read its 8-byte refs at
 * about 60 instructions each). */
#if !defined(__BYTE_ORDER__) || (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__ &&                   \
                                 __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__)
#error "store/keys.h: unknown byte order"
#endif

static inline void cph_be64_put(uint8_t *p, uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  memcpy(p, &v, 8);
}

static inline uint64_t cph_be64_get(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static inline void cph_be32_put(uint8_t *p, uint32_t v) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  memcpy(p, &v, 4);
}

static inline uint32_t cph_be32_get(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

/* Appends to b, big-endian: v; or a string as be32 length + its bytes (the length-prefixed
 * fields of blobs such as a session's state, core/handover.c, and a kept context's rows). */
static inline void cph_buf_put_be32(cph_buf *b, uint32_t v) {
  uint8_t p[4];
  cph_be32_put(p, v);
  cph_buf_append(b, p, 4);
}

static inline void cph_buf_put_be64(cph_buf *b, uint64_t v) {
  uint8_t p[8];
  cph_be64_put(p, v);
  cph_buf_append(b, p, 8);
}

static inline void cph_buf_put_str32(cph_buf *b, const char *s) {
  size_t n = strlen(s);
  cph_buf_put_be32(b, (uint32_t)n);
  cph_buf_append(b, s, n);
}

/* A key under construction. Appending past CPH_KEY_MAX sets `overflow`; the txn refuses such
 * a key with CPH_ELIMIT rather than truncating it. */
typedef struct cph_key {
  uint8_t data[CPH_KEY_MAX];
  size_t len;
  bool overflow;
} cph_key;

static inline void cph_key_reset(cph_key *k) {
  k->len = 0;
  k->overflow = false;
}

static inline void cph_key_u64(cph_key *k, uint64_t v) {
  if (k->len + 8 > CPH_KEY_MAX) {
    k->overflow = true;
    return;
  }
  cph_be64_put(k->data + k->len, v);
  k->len += 8;
}

/* Appends one byte (a tag that keeps kinds of keys of one database apart). */
static inline void cph_key_byte(cph_key *k, uint8_t b) {
  if (k->len + 1 > CPH_KEY_MAX) {
    k->overflow = true;
    return;
  }
  k->data[k->len++] = b;
}

/* A key of one big-endian u64 (an id: events, turns, memories...). */
static inline cph_key cph_key_of_u64(uint64_t v) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, v);
  return k;
}

/* Appends s and a terminating NUL. */
static inline void cph_key_str(cph_key *k, const char *s) {
  size_t n = strlen(s);
  if (k->len + n + 1 > CPH_KEY_MAX) {
    k->overflow = true;
    return;
  }
  memcpy(k->data + k->len, s, n + 1);
  k->len += n + 1;
}

#endif
