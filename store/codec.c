/* Table-driven msgpack codec for stored records (contract in records.h).
 *
 * Encoding writes msgpack-c's bytes directly (a record is put per event, several times: the
 * packer's call per piece was most of the cost). Decoding uses a small strict reader over the
 * raw bytes rather than msgpack_unpack_next(): the unpacker allocates a container's element
 * array before reading its elements, so a corrupt length header could ask for gigabytes;
 * here every length is checked against the bytes that remain before anything is allocated. */
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "keys.h"

/* ---------------------------------------------------------------- encoding */

/* The writer puts the bytes msgpack-c's packer would (every integer in its shortest form,
 * strings as str8/16/32, binary as bin8/16/32; tests/unit/test_codec_bytes.c compares the two
 * over every record kind), straight into a caller's buffer: no call per piece. It counts
 * every byte but writes only those that fit, so one pass tells the size a record needs. */
typedef struct mp_writer {
  uint8_t *buf;
  size_t cap, len;
} mp_writer;

static inline void w_bytes(mp_writer *w, const void *src, size_t n) {
  if (n && w->len + n <= w->cap)
    memcpy(w->buf + w->len, src, n);
  w->len += n;
}

static inline void w_byte(mp_writer *w, uint8_t b) {
  if (w->len < w->cap)
    w->buf[w->len] = b;
  w->len++;
}

/* A header byte and the low `width` (1, 2, 4 or 8) bytes of v, big-endian. With room for
 * nine bytes it stores all eight shifted to the front in one go and counts the `width` it
 * meant (the bytes past them are overwritten by what follows, or never counted). */
static inline void w_be(mp_writer *w, uint8_t head, uint64_t v, int width) {
  if (w->len <= w->cap && w->cap - w->len >= 9) {
    uint8_t *p = w->buf + w->len;
    p[0] = head;
    cph_be64_put(p + 1, width == 8 ? v : v << (8 * (8 - width)));
    w->len += (size_t)width + 1;
    return;
  }
  uint8_t b[9];
  b[0] = head;
  for (int i = 0; i < width; i++)
    b[1 + i] = (uint8_t)(v >> (8 * (width - 1 - i)));
  w_bytes(w, b, (size_t)width + 1);
}

static inline void w_uint(mp_writer *w, uint64_t d) {
  if (d < 128)
    w_byte(w, (uint8_t)d); /* positive fixint */
  else if (d < 256)
    w_be(w, 0xcc, d, 1);
  else if (d < 65536)
    w_be(w, 0xcd, d, 2);
  else if (d < (UINT64_C(1) << 32))
    w_be(w, 0xce, d, 4);
  else
    w_be(w, 0xcf, d, 8);
}

static inline void w_int(mp_writer *w, int64_t d) {
  if (d >= 0)
    w_uint(w, (uint64_t)d); /* as msgpack-c: a non-negative int64 takes the unsigned forms */
  else if (d >= -32)
    w_byte(w, (uint8_t)d); /* negative fixint */
  else if (d >= -128)
    w_be(w, 0xd0, (uint64_t)d, 1);
  else if (d >= -32768)
    w_be(w, 0xd1, (uint64_t)d, 2);
  else if (d >= INT32_MIN)
    w_be(w, 0xd2, (uint64_t)d, 4);
  else
    w_be(w, 0xd3, (uint64_t)d, 8);
}

/* A container or string header: the fix form below `fix_below` (0: none), else the 8-bit
 * (when head8 is non-zero), 16-bit or 32-bit length. */
static void w_len(mp_writer *w, size_t n, uint8_t fix, size_t fix_below, uint8_t head8,
                  uint8_t head16, uint8_t head32) {
  if (n < fix_below)
    w_byte(w, (uint8_t)(fix | n));
  else if (head8 && n < 256)
    w_be(w, head8, n, 1);
  else if (n < 65536)
    w_be(w, head16, n, 2);
  else
    w_be(w, head32, n, 4);
}

static void w_str(mp_writer *w, const char *s) {
  size_t n = strlen(s);
  w_len(w, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
  w_bytes(w, s, n);
}

static void w_array(mp_writer *w, size_t n) { w_len(w, n, 0x90, 16, 0, 0xdc, 0xdd); }

static void w_field(mp_writer *w, const cph_field *f, const char *rec) {
  const void *at = rec + f->offset;
  switch (f->type) {
  case CPH_F_U8:
    w_uint(w, *(const uint8_t *)at);
    break;
  case CPH_F_BOOL:
    w_byte(w, *(const bool *)at ? 0xc3 : 0xc2);
    break;
  case CPH_F_U32:
    w_uint(w, *(const uint32_t *)at);
    break;
  case CPH_F_U64:
    w_uint(w, *(const uint64_t *)at);
    break;
  case CPH_F_I64:
    w_int(w, *(const int64_t *)at);
    break;
  case CPH_F_F64: {
    uint64_t bits;
    memcpy(&bits, at, sizeof bits);
    w_be(w, 0xcb, bits, 8);
    break;
  }
  case CPH_F_STR: {
    const char *s = *(char *const *)at;
    w_str(w, s ? s : ""); /* a required string is never nil on disk */
    break;
  }
  case CPH_F_OPT_STR: {
    const char *s = *(char *const *)at;
    if (s)
      w_str(w, s);
    else
      w_byte(w, 0xc0);
    break;
  }
  case CPH_F_STR_ARRAY: {
    char *const *items = *(char **const *)at;
    uint32_t n = *(const uint32_t *)(rec + f->count_offset);
    w_array(w, n);
    for (uint32_t i = 0; i < n; i++)
      w_str(w, items[i] ? items[i] : "");
    break;
  }
  case CPH_F_U64_ARRAY: {
    const uint64_t *items = *(uint64_t *const *)at;
    uint32_t n = *(const uint32_t *)(rec + f->count_offset);
    w_array(w, n);
    for (uint32_t i = 0; i < n; i++)
      w_uint(w, items[i]);
    break;
  }
  case CPH_F_I64_ARRAY: {
    const int64_t *items = *(int64_t *const *)at;
    uint32_t n = *(const uint32_t *)(rec + f->count_offset);
    w_array(w, n);
    for (uint32_t i = 0; i < n; i++)
      w_int(w, items[i]);
    break;
  }
  case CPH_F_BYTES:
    w_len(w, f->limit, 0, 0, 0xc4, 0xc5, 0xc6);
    w_bytes(w, at, f->limit);
    break;
  }
}

size_t cph_record_encode_to(const cph_record_desc *d, const void *rec, void *out, size_t cap) {
  mp_writer w = {out, cap, 0};
  w_array(&w, d->n_fields + 1);
  w_uint(&w, d->version);
  for (size_t i = 0; i < d->n_fields; i++)
    w_field(&w, &d->fields[i], rec);
  return w.len;
}

int cph_record_encode(const cph_record_desc *d, const void *rec, cph_buf *out) {
  uint8_t small[CPH_RECORD_SMALL];
  size_t n = cph_record_encode_to(d, rec, small, sizeof small);
  if (n <= sizeof small) {
    cph_buf_append(out, small, n);
    return cph_buf_error(out);
  }
  uint8_t *big = malloc(n);
  if (!big) {
    out->failed = true;
    return CPH_ENOMEM;
  }
  cph_record_encode_to(d, rec, big, n);
  cph_buf_append(out, big, n);
  free(big);
  return cph_buf_error(out);
}

/* ---------------------------------------------------------------- strict reader */

typedef struct mp_reader {
  const uint8_t *p;
  const uint8_t *end;
} mp_reader;

static size_t mp_left(const mp_reader *r) { return (size_t)(r->end - r->p); }

/* Big-endian fixed-width reads; the caller has checked the length. */
static uint64_t mp_be(const uint8_t *p, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; i++)
    v = (v << 8) | p[i];
  return v;
}

/* What the next value is, in words, for error messages. */
static const char *mp_kind_name(const mp_reader *r) {
  if (r->p >= r->end)
    return "the end of the data";
  uint8_t b = *r->p;
  if (b <= 0x7f || (b >= 0xcc && b <= 0xcf))
    return "an unsigned integer";
  if (b >= 0xe0 || (b >= 0xd0 && b <= 0xd3))
    return "a signed integer";
  if ((b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf)
    return "a map";
  if ((b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd)
    return "an array";
  if ((b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb))
    return "a string";
  switch (b) {
  case 0xc0:
    return "nil";
  case 0xc2:
  case 0xc3:
    return "a boolean";
  case 0xc4:
  case 0xc5:
  case 0xc6:
    return "binary data";
  case 0xca:
  case 0xcb:
    return "a float";
  case 0xc1:
    return "the reserved byte 0xc1";
  default:
    return "an extension type";
  }
}

/* Reads `width` bytes of payload after a one-byte header, if present. */
static bool mp_take(mp_reader *r, size_t width, const uint8_t **at) {
  if (mp_left(r) < width)
    return false;
  *at = r->p;
  r->p += width;
  return true;
}

/* Integer of any msgpack integer format. *is_signed_neg is set when the value is < 0. */
static bool mp_read_integer(mp_reader *r, uint64_t *u, int64_t *s, bool *negative) {
  if (mp_left(r) < 1)
    return false;
  uint8_t b = *r->p;
  const uint8_t *at;
  mp_reader save = *r;
  r->p++;
  *negative = false;
  if (b <= 0x7f) {
    *u = b;
  } else if (b >= 0xe0) {
    *s = (int8_t)b;
    *negative = true;
  } else if (b >= 0xcc && b <= 0xcf) {
    int width = 1 << (b - 0xcc);
    if (!mp_take(r, (size_t)width, &at))
      goto fail;
    *u = mp_be(at, width);
  } else if (b >= 0xd0 && b <= 0xd3) {
    int width = 1 << (b - 0xd0);
    if (!mp_take(r, (size_t)width, &at))
      goto fail;
    uint64_t raw = mp_be(at, width);
    int64_t v;
    switch (width) {
    case 1: v = (int8_t)raw; break;
    case 2: v = (int16_t)raw; break;
    case 4: v = (int32_t)raw; break;
    default: v = (int64_t)raw; break;
    }
    if (v < 0) {
      *s = v;
      *negative = true;
    } else {
      *u = (uint64_t)v;
    }
  } else {
    goto fail;
  }
  if (!*negative)
    *s = (int64_t)*u; /* callers check range before trusting *s */
  return true;
fail:
  *r = save;
  return false;
}

static bool mp_read_u64(mp_reader *r, uint64_t *out) {
  mp_reader save = *r;
  int64_t s;
  bool neg;
  if (!mp_read_integer(r, out, &s, &neg) || neg) {
    *r = save;
    return false;
  }
  return true;
}

static bool mp_read_i64(mp_reader *r, int64_t *out) {
  mp_reader save = *r;
  uint64_t u;
  bool neg;
  if (!mp_read_integer(r, &u, out, &neg) || (!neg && u > (uint64_t)INT64_MAX)) {
    *r = save;
    return false;
  }
  return true;
}

static bool mp_read_double(mp_reader *r, double *out) {
  if (mp_left(r) < 1)
    return false;
  uint8_t b = *r->p;
  if (b == 0xcb && mp_left(r) >= 9) {
    uint64_t bits = mp_be(r->p + 1, 8);
    memcpy(out, &bits, sizeof *out);
    r->p += 9;
    return true;
  }
  if (b == 0xca && mp_left(r) >= 5) {
    uint32_t bits = (uint32_t)mp_be(r->p + 1, 4);
    float f;
    memcpy(&f, &bits, sizeof f);
    *out = f;
    r->p += 5;
    return true;
  }
  return false;
}

static bool mp_read_bool(mp_reader *r, bool *out) {
  if (mp_left(r) < 1 || (*r->p != 0xc2 && *r->p != 0xc3))
    return false;
  *out = *r->p == 0xc3;
  r->p++;
  return true;
}

static bool mp_read_nil(mp_reader *r) {
  if (mp_left(r) < 1 || *r->p != 0xc0)
    return false;
  r->p++;
  return true;
}

/* A header of the given families: fixed (mask/base), then 1/2/4-byte lengths at base8. */
static bool mp_read_len(mp_reader *r, uint8_t fix_base, uint8_t fix_count, int first_sized,
                        int widths[3], size_t *len) {
  if (mp_left(r) < 1)
    return false;
  uint8_t b = *r->p;
  if (b >= fix_base && b < fix_base + fix_count) {
    *len = b - fix_base;
    r->p++;
    return true;
  }
  for (int i = 0; i < 3; i++) {
    if (widths[i] && b == first_sized + i) {
      if (mp_left(r) < 1 + (size_t)widths[i])
        return false;
      *len = (size_t)mp_be(r->p + 1, widths[i]);
      r->p += 1 + widths[i];
      return true;
    }
  }
  return false;
}

/* str payload (pointer into the input) — length already checked against the input. */
static bool mp_read_str(mp_reader *r, const char **s, size_t *len) {
  mp_reader save = *r;
  int widths[3] = {1, 2, 4};
  if (!mp_read_len(r, 0xa0, 32, 0xd9, widths, len))
    return false;
  if (*len > mp_left(r)) {
    *r = save;
    return false;
  }
  *s = (const char *)r->p;
  r->p += *len;
  return true;
}

static bool mp_read_bin(mp_reader *r, const uint8_t **p, size_t *len) {
  mp_reader save = *r;
  int widths[3] = {1, 2, 4};
  if (!mp_read_len(r, 0, 0, 0xc4, widths, len))
    return false;
  if (*len > mp_left(r)) {
    *r = save;
    return false;
  }
  *p = r->p;
  r->p += *len;
  return true;
}

/* Array header. Every element takes at least one byte, so a count larger than what is left
 * is corrupt and is refused before the caller allocates for it. */
static bool mp_read_array(mp_reader *r, size_t *n) {
  mp_reader save = *r;
  int widths[3] = {0, 2, 4};
  if (!mp_read_len(r, 0x90, 16, 0xdb, widths, n))
    return false;
  if (*n > mp_left(r)) {
    *r = save;
    return false;
  }
  return true;
}

/* ---------------------------------------------------------------- decoding */

typedef struct decode_ctx {
  const cph_record_desc *d;
  cph_err *err;
} decode_ctx;

/* Whether r's next value is a string or binary data that runs past the end of the input —
 * its length, or the bytes it states (the value was cut short, not of another kind). */
static bool mp_cut_short(const mp_reader *r) {
  mp_reader t = *r;
  int widths[3] = {1, 2, 4};
  size_t len;
  if (mp_read_len(&t, 0xa0, 32, 0xd9, widths, &len) ||
      mp_read_len(&t, 0, 0, 0xc4, widths, &len))
    return len > mp_left(&t);
  uint8_t b = mp_left(r) ? *r->p : 0;
  return (b >= 0xd9 && b <= 0xdb) || (b >= 0xc4 && b <= 0xc6); /* its length cut */
}

static int field_error(decode_ctx *c, const cph_field *f, const char *expected,
                       const mp_reader *r) {
  if (mp_cut_short(r))
    return cph_err_set(c->err, CPH_ECORRUPT,
                       "%s field '%s': %s cut short (it runs past the end of the data)",
                       c->d->name, f->name, mp_kind_name(r));
  return cph_err_set(c->err, CPH_ECORRUPT, "%s field '%s': expected %s, got %s", c->d->name,
                     f->name, expected, mp_kind_name(r));
}

static int dup_string(decode_ctx *c, const cph_field *f, const char *s, size_t len,
                      char **out) {
  if (memchr(s, '\0', len))
    return cph_err_set(c->err, CPH_ECORRUPT, "%s field '%s': string contains a NUL byte",
                       c->d->name, f->name);
  char *copy = malloc(len + 1);
  if (!copy)
    return cph_err_set(c->err, CPH_ENOMEM, "%s field '%s': out of memory", c->d->name, f->name);
  memcpy(copy, s, len);
  copy[len] = '\0';
  *out = copy;
  return CPH_OK;
}

static int decode_str_array(decode_ctx *c, const cph_field *f, mp_reader *r, char *rec) {
  size_t n;
  if (!mp_read_array(r, &n))
    return field_error(c, f, "an array of strings", r);
  if (n > UINT32_MAX)
    return field_error(c, f, "at most 2^32-1 items", r);
  char **items = n ? calloc(n, sizeof *items) : NULL;
  if (n && !items)
    return cph_err_set(c->err, CPH_ENOMEM, "%s field '%s': out of memory", c->d->name, f->name);
  /* Owned by the record from here on, so cph_record_free releases a partial array. */
  *(char ***)(rec + f->offset) = items;
  *(uint32_t *)(rec + f->count_offset) = (uint32_t)n;
  for (size_t i = 0; i < n; i++) {
    const char *s;
    size_t len;
    if (!mp_read_str(r, &s, &len))
      return field_error(c, f, "a string item", r);
    int rc = dup_string(c, f, s, len, &items[i]);
    if (rc)
      return rc;
  }
  return CPH_OK;
}

static int decode_u64_array(decode_ctx *c, const cph_field *f, mp_reader *r, char *rec) {
  size_t n;
  if (!mp_read_array(r, &n))
    return field_error(c, f, "an array of unsigned integers", r);
  if (n > UINT32_MAX)
    return field_error(c, f, "at most 2^32-1 items", r);
  uint64_t *items = n ? calloc(n, sizeof *items) : NULL;
  if (n && !items)
    return cph_err_set(c->err, CPH_ENOMEM, "%s field '%s': out of memory", c->d->name, f->name);
  *(uint64_t **)(rec + f->offset) = items;
  *(uint32_t *)(rec + f->count_offset) = (uint32_t)n;
  for (size_t i = 0; i < n; i++)
    if (!mp_read_u64(r, &items[i]))
      return field_error(c, f, "an unsigned integer item", r);
  return CPH_OK;
}

static int decode_i64_array(decode_ctx *c, const cph_field *f, mp_reader *r, char *rec) {
  size_t n;
  if (!mp_read_array(r, &n))
    return field_error(c, f, "an array of integers", r);
  if (n > UINT32_MAX)
    return field_error(c, f, "at most 2^32-1 items", r);
  int64_t *items = n ? calloc(n, sizeof *items) : NULL;
  if (n && !items)
    return cph_err_set(c->err, CPH_ENOMEM, "%s field '%s': out of memory", c->d->name, f->name);
  *(int64_t **)(rec + f->offset) = items;
  *(uint32_t *)(rec + f->count_offset) = (uint32_t)n;
  for (size_t i = 0; i < n; i++)
    if (!mp_read_i64(r, &items[i]))
      return field_error(c, f, "an integer item", r);
  return CPH_OK;
}

static int decode_field(decode_ctx *c, const cph_field *f, mp_reader *r, char *rec) {
  void *at = rec + f->offset;
  uint64_t u;
  switch (f->type) {
  case CPH_F_U8:
    if (!mp_read_u64(r, &u) || u > UINT8_MAX)
      return field_error(c, f, "a small unsigned integer", r);
    if (f->limit && u >= f->limit)
      return cph_err_set(c->err, CPH_ECORRUPT, "%s field '%s': value %llu is out of range",
                         c->d->name, f->name, (unsigned long long)u);
    *(uint8_t *)at = (uint8_t)u;
    return CPH_OK;
  case CPH_F_BOOL:
    if (!mp_read_bool(r, (bool *)at))
      return field_error(c, f, "a boolean", r);
    return CPH_OK;
  case CPH_F_U32:
    if (!mp_read_u64(r, &u) || u > UINT32_MAX)
      return field_error(c, f, "a 32-bit unsigned integer", r);
    *(uint32_t *)at = (uint32_t)u;
    return CPH_OK;
  case CPH_F_U64:
    if (!mp_read_u64(r, (uint64_t *)at))
      return field_error(c, f, "an unsigned integer", r);
    return CPH_OK;
  case CPH_F_I64:
    if (!mp_read_i64(r, (int64_t *)at))
      return field_error(c, f, "a 64-bit integer", r);
    return CPH_OK;
  case CPH_F_F64:
    if (!mp_read_double(r, (double *)at))
      return field_error(c, f, "a float", r);
    return CPH_OK;
  case CPH_F_STR:
  case CPH_F_OPT_STR: {
    if (f->type == CPH_F_OPT_STR && mp_read_nil(r))
      return CPH_OK;
    const char *s;
    size_t len;
    if (!mp_read_str(r, &s, &len))
      return field_error(c, f, f->type == CPH_F_STR ? "a string" : "a string or nil", r);
    return dup_string(c, f, s, len, (char **)at);
  }
  case CPH_F_STR_ARRAY:
    return decode_str_array(c, f, r, rec);
  case CPH_F_U64_ARRAY:
    return decode_u64_array(c, f, r, rec);
  case CPH_F_I64_ARRAY:
    return decode_i64_array(c, f, r, rec);
  case CPH_F_BYTES: {
    const uint8_t *p;
    size_t len;
    if (!mp_read_bin(r, &p, &len))
      return field_error(c, f, "binary data", r);
    if (len != f->limit)
      return cph_err_set(c->err, CPH_ECORRUPT, "%s field '%s': %zu bytes, expected %u",
                         c->d->name, f->name, len, f->limit);
    memcpy(at, p, len);
    return CPH_OK;
  }
  }
  return cph_err_set(c->err, CPH_ECORRUPT, "%s: bad field table", c->d->name);
}

/* Reads past a field this caller did not ask for: checked like a decoded one, but its strings
 * and arrays are not copied. Scalars are decoded as usual (no allocation). */
static int skip_field(decode_ctx *c, const cph_field *f, mp_reader *r, char *rec) {
  const char *s;
  size_t len, n;
  uint64_t u;
  int64_t i64;
  switch (f->type) {
  case CPH_F_STR:
  case CPH_F_OPT_STR:
    if (f->type == CPH_F_OPT_STR && mp_read_nil(r))
      return CPH_OK;
    if (!mp_read_str(r, &s, &len))
      return field_error(c, f, f->type == CPH_F_STR ? "a string" : "a string or nil", r);
    return CPH_OK;
  case CPH_F_STR_ARRAY:
    if (!mp_read_array(r, &n))
      return field_error(c, f, "an array of strings", r);
    for (size_t i = 0; i < n; i++)
      if (!mp_read_str(r, &s, &len))
        return field_error(c, f, "a string item", r);
    return CPH_OK;
  case CPH_F_U64_ARRAY:
    if (!mp_read_array(r, &n))
      return field_error(c, f, "an array of unsigned integers", r);
    for (size_t i = 0; i < n; i++)
      if (!mp_read_u64(r, &u))
        return field_error(c, f, "an unsigned integer item", r);
    return CPH_OK;
  case CPH_F_I64_ARRAY:
    if (!mp_read_array(r, &n))
      return field_error(c, f, "an array of integers", r);
    for (size_t i = 0; i < n; i++)
      if (!mp_read_i64(r, &i64))
        return field_error(c, f, "an integer item", r);
    return CPH_OK;
  default:
    return decode_field(c, f, r, rec);
  }
}

uint64_t cph_record_field_mask(const cph_record_desc *d, const char *const *names, size_t n) {
  uint64_t mask = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < d->n_fields && j < 64; j++)
      if (strcmp(d->fields[j].name, names[i]) == 0)
        mask |= 1ull << j;
  return mask;
}

int cph_record_decode(const cph_record_desc *d, const void *data, size_t len, void *rec,
                      cph_err *err) {
  return cph_record_decode_some(d, data, len, rec, UINT64_MAX, err);
}

int cph_record_decode_some(const cph_record_desc *d, const void *data, size_t len, void *rec,
                           uint64_t fields, cph_err *err) {
  mp_reader r = {data, (const uint8_t *)data + len};
  decode_ctx c = {d, err};
  memset(rec, 0, d->size);
  size_t n;
  int rc = CPH_OK;
  uint64_t version;
  if (len == 0) {
    rc = cph_err_set(err, CPH_ECORRUPT, "%s: empty value", d->name);
    goto fail;
  }
  if (!mp_read_array(&r, &n)) {
    rc = cph_err_set(err, CPH_ECORRUPT, "%s: expected a record array, got %s", d->name,
                     mp_kind_name(&r));
    goto fail;
  }
  if (n == 0 || !mp_read_u64(&r, &version)) {
    rc = cph_err_set(err, CPH_ECORRUPT, "%s: expected a record version first, got %s", d->name,
                     n ? mp_kind_name(&r) : "an empty array");
    goto fail;
  }
  uint32_t oldest = d->oldest ? d->oldest : d->version;
  if (version < oldest || version > d->version) {
    if (oldest == d->version)
      rc = cph_err_set(err, CPH_ECORRUPT, "%s: record version %llu, this build reads version %u",
                       d->name, (unsigned long long)version, d->version);
    else
      rc = cph_err_set(err, CPH_ECORRUPT,
                       "%s: record version %llu, this build reads versions %u to %u", d->name,
                       (unsigned long long)version, oldest, d->version);
    goto fail;
  }
  /* A record of an older version has the fields it had then: those added since read as 0. */
  size_t n_fields = 0;
  while (n_fields < d->n_fields && d->fields[n_fields].since <= version)
    n_fields++;
  if (n != n_fields + 1) {
    rc = cph_err_set(err, CPH_ECORRUPT, "%s: %zu fields, expected %zu", d->name, n - 1,
                     n_fields);
    goto fail;
  }
  for (size_t i = 0; i < n_fields; i++) {
    bool wanted = i >= 64 || (fields >> i & 1);
    rc = wanted ? decode_field(&c, &d->fields[i], &r, rec)
                : skip_field(&c, &d->fields[i], &r, rec);
    if (rc)
      goto fail;
  }
  if (r.p != r.end) {
    rc = cph_err_set(err, CPH_ECORRUPT, "%s: %zu unexpected bytes after the record", d->name,
                     mp_left(&r));
    goto fail;
  }
  return CPH_OK;
fail:
  cph_record_free(d, rec);
  return rc;
}

void cph_record_free(const cph_record_desc *d, void *rec) {
  char *base = rec;
  for (size_t i = 0; i < d->n_fields; i++) {
    const cph_field *f = &d->fields[i];
    void *at = base + f->offset;
    switch (f->type) {
    case CPH_F_STR:
    case CPH_F_OPT_STR:
      free(*(char **)at);
      break;
    case CPH_F_STR_ARRAY: {
      char **items = *(char ***)at;
      uint32_t n = *(uint32_t *)(base + f->count_offset);
      for (uint32_t j = 0; items && j < n; j++)
        free(items[j]);
      free(items);
      break;
    }
    case CPH_F_U64_ARRAY:
      free(*(uint64_t **)at);
      break;
    case CPH_F_I64_ARRAY:
      free(*(int64_t **)at);
      break;
    default:
      break;
    }
  }
  memset(rec, 0, d->size);
}

const char *cph_record_name(const cph_record_desc *d) { return d->name; }
uint32_t cph_record_version(const cph_record_desc *d) { return d->version; }
