#include "mpjson.h"

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- reading */

typedef struct mp_reader {
  const uint8_t *start;
  const uint8_t *p;
  const uint8_t *end;
  char *err;
  size_t errlen;
  bool failed;
} mp_reader;

static json_t *fail_at(mp_reader *r, const uint8_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the first problem only: later ones are consequences of it. */
static json_t *fail_at(mp_reader *r, const uint8_t *at, const char *fmt, ...) {
  if (r->failed)
    return NULL;
  r->failed = true;
  int n = snprintf(r->err, r->errlen, "invalid msgpack at byte %zu: ", (size_t)(at - r->start));
  if (n >= 0 && (size_t)n < r->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return NULL;
}

static size_t remaining(const mp_reader *r) { return (size_t)(r->end - r->p); }

/* Big-endian unsigned of n bytes (1, 2, 4 or 8); the caller checked the bytes exist. */
static uint64_t be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = (v << 8) | p[i];
  return v;
}

/* Takes n bytes of header payload (a length or a number) after the type byte. */
static bool take(mp_reader *r, const uint8_t *at, int n, uint64_t *out) {
  if (remaining(r) < (size_t)n) {
    fail_at(r, at, "truncated: %d more bytes expected", n);
    return false;
  }
  *out = be(r->p, n);
  r->p += n;
  return true;
}

static json_t *read_string(mp_reader *r, const uint8_t *at, uint64_t len) {
  if (len > remaining(r))
    return fail_at(r, at, "string of %llu bytes but only %zu bytes left",
                   (unsigned long long)len, remaining(r));
  const char *s = (const char *)r->p;
  if (memchr(s, '\0', (size_t)len))
    return fail_at(r, at, "string contains a NUL byte");
  json_t *v = json_stringn(s, (size_t)len); /* validates UTF-8 */
  if (!v)
    return fail_at(r, at, "string is not valid UTF-8");
  r->p += len;
  return v;
}

static json_t *read_value(mp_reader *r, int depth);

static json_t *read_array(mp_reader *r, const uint8_t *at, uint64_t n, int depth) {
  /* Every element takes at least one byte: a count beyond the bytes left is a lie. */
  if (n > remaining(r))
    return fail_at(r, at, "array of %llu elements but only %zu bytes left",
                   (unsigned long long)n, remaining(r));
  if (depth >= CPH_MPJSON_MAX_DEPTH)
    return fail_at(r, at, "nested deeper than %d", CPH_MPJSON_MAX_DEPTH);
  json_t *a = json_array();
  if (!a)
    return fail_at(r, at, "out of memory");
  for (uint64_t i = 0; i < n; i++) {
    json_t *v = read_value(r, depth + 1);
    if (!v || json_array_append_new(a, v) != 0) {
      json_decref(a);
      return fail_at(r, at, "out of memory");
    }
  }
  return a;
}

static json_t *read_map(mp_reader *r, const uint8_t *at, uint64_t n, int depth) {
  /* A key and a value take at least one byte each. */
  if (n > remaining(r) / 2)
    return fail_at(r, at, "map of %llu entries but only %zu bytes left", (unsigned long long)n,
                   remaining(r));
  if (depth >= CPH_MPJSON_MAX_DEPTH)
    return fail_at(r, at, "nested deeper than %d", CPH_MPJSON_MAX_DEPTH);
  json_t *o = json_object();
  if (!o)
    return fail_at(r, at, "out of memory");
  for (uint64_t i = 0; i < n; i++) {
    const uint8_t *key_at = r->p;
    json_t *k = read_value(r, depth + 1);
    if (k && !json_is_string(k)) {
      json_decref(k);
      k = fail_at(r, key_at, "map key is not a string");
    }
    if (!k) {
      json_decref(o);
      return NULL;
    }
    const char *key = json_string_value(k);
    size_t key_len = json_string_length(k);
    if (json_object_getn(o, key, key_len)) {
      fail_at(r, key_at, "duplicate map key \"%.*s\"", (int)(key_len > 64 ? 64 : key_len), key);
      json_decref(k);
      json_decref(o);
      return NULL;
    }
    json_t *v = read_value(r, depth + 1);
    if (!v || json_object_setn_new(o, key, key_len, v) != 0) {
      json_decref(k);
      json_decref(o);
      return fail_at(r, key_at, "out of memory");
    }
    json_decref(k);
  }
  return o;
}

static json_t *read_value(mp_reader *r, int depth) {
  if (r->failed)
    return NULL;
  const uint8_t *at = r->p;
  if (r->p >= r->end)
    return fail_at(r, at, "truncated: a value was expected");
  uint8_t b = *r->p++;
  uint64_t n;
  if (b <= 0x7f)
    return json_integer(b);
  if (b >= 0xe0)
    return json_integer((int8_t)b);
  if ((b & 0xf0) == 0x80)
    return read_map(r, at, b & 0x0f, depth);
  if ((b & 0xf0) == 0x90)
    return read_array(r, at, b & 0x0f, depth);
  if ((b & 0xe0) == 0xa0)
    return read_string(r, at, b & 0x1f);
  switch (b) {
  case 0xc0:
    return json_null();
  case 0xc2:
    return json_false();
  case 0xc3:
    return json_true();
  case 0xc4: /* bin 8/16/32: read as a string */
  case 0xd9: /* str 8/16/32 */
    return take(r, at, 1, &n) ? read_string(r, at, n) : NULL;
  case 0xc5:
  case 0xda:
    return take(r, at, 2, &n) ? read_string(r, at, n) : NULL;
  case 0xc6:
  case 0xdb:
    return take(r, at, 4, &n) ? read_string(r, at, n) : NULL;
  case 0xca: {
    if (!take(r, at, 4, &n))
      return NULL;
    uint32_t bits = (uint32_t)n;
    float f;
    memcpy(&f, &bits, sizeof f);
    if (!isfinite(f))
      return fail_at(r, at, "number is not finite");
    return json_real((double)f);
  }
  case 0xcb: {
    if (!take(r, at, 8, &n))
      return NULL;
    double d;
    memcpy(&d, &n, sizeof d);
    if (!isfinite(d))
      return fail_at(r, at, "number is not finite");
    return json_real(d);
  }
  case 0xcc:
    return take(r, at, 1, &n) ? json_integer((json_int_t)n) : NULL;
  case 0xcd:
    return take(r, at, 2, &n) ? json_integer((json_int_t)n) : NULL;
  case 0xce:
    return take(r, at, 4, &n) ? json_integer((json_int_t)n) : NULL;
  case 0xcf:
    if (!take(r, at, 8, &n))
      return NULL;
    if (n > (uint64_t)INT64_MAX)
      return fail_at(r, at, "integer %llu is out of range", (unsigned long long)n);
    return json_integer((json_int_t)n);
  case 0xd0:
    return take(r, at, 1, &n) ? json_integer((int8_t)n) : NULL;
  case 0xd1:
    return take(r, at, 2, &n) ? json_integer((int16_t)n) : NULL;
  case 0xd2:
    return take(r, at, 4, &n) ? json_integer((int32_t)n) : NULL;
  case 0xd3:
    return take(r, at, 8, &n) ? json_integer((json_int_t)(int64_t)n) : NULL;
  case 0xdc:
    return take(r, at, 2, &n) ? read_array(r, at, n, depth) : NULL;
  case 0xdd:
    return take(r, at, 4, &n) ? read_array(r, at, n, depth) : NULL;
  case 0xde:
    return take(r, at, 2, &n) ? read_map(r, at, n, depth) : NULL;
  case 0xdf:
    return take(r, at, 4, &n) ? read_map(r, at, n, depth) : NULL;
  case 0xc7:
  case 0xc8:
  case 0xc9:
  case 0xd4:
  case 0xd5:
  case 0xd6:
  case 0xd7:
  case 0xd8:
    return fail_at(r, at, "ext types are not supported");
  default: /* 0xc1 */
    return fail_at(r, at, "byte 0x%02x is not a msgpack type", b);
  }
}

json_t *cph_mpjson_read(const void *data, size_t len, char *err, size_t errlen) {
  mp_reader r = {data, data, (const uint8_t *)data + len, err, errlen, false};
  if (errlen)
    err[0] = '\0';
  json_t *v = read_value(&r, 0);
  if (v && r.failed) { /* a nested failure after which a parent still built a value */
    json_decref(v);
    return NULL;
  }
  if (v && r.p != r.end) {
    fail_at(&r, r.p, "%zu trailing bytes after the value", remaining(&r));
    json_decref(v);
    return NULL;
  }
  if (!v && !r.failed)
    fail_at(&r, r.p, "out of memory");
  return v;
}

/* ---------------------------------------------------------------- writing */

static int write_value(msgpack_packer *pk, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    if (msgpack_pack_map(pk, json_object_size(v)))
      return -1;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach((json_t *)v, key, key_len, val) {
      if (msgpack_pack_str(pk, key_len) || msgpack_pack_str_body(pk, key, key_len) ||
          write_value(pk, val))
        return -1;
    }
    return 0;
  }
  case JSON_ARRAY: {
    size_t n = json_array_size(v);
    if (msgpack_pack_array(pk, n))
      return -1;
    for (size_t i = 0; i < n; i++)
      if (write_value(pk, json_array_get(v, i)))
        return -1;
    return 0;
  }
  case JSON_STRING: {
    size_t len = json_string_length(v);
    return msgpack_pack_str(pk, len) || msgpack_pack_str_body(pk, json_string_value(v), len);
  }
  case JSON_INTEGER:
    return msgpack_pack_int64(pk, (int64_t)json_integer_value(v));
  case JSON_REAL:
    return msgpack_pack_double(pk, json_real_value(v));
  case JSON_TRUE:
    return msgpack_pack_true(pk);
  case JSON_FALSE:
    return msgpack_pack_false(pk);
  case JSON_NULL:
  default:
    return msgpack_pack_nil(pk);
  }
}

char *cph_mpjson_write(const json_t *v, size_t *len) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  if (write_value(&pk, v) != 0) {
    msgpack_sbuffer_destroy(&sb);
    return NULL;
  }
  *len = sb.size;
  char *out = msgpack_sbuffer_release(&sb);
  if (!out) /* an empty buffer is never produced, but be safe */
    out = calloc(1, 1);
  return out;
}
