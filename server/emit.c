/* cph_emit: JSON text or msgpack written straight into a cph_buf (contract in emit.h). */
#include "emit.h"

#include <assert.h>
#include <inttypes.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

static const char REPLACEMENT[] = "\xef\xbf\xbd"; /* U+FFFD */

/* ---------------------------------------------------------------- UTF-8 */

size_t cph_utf8_seq(const uint8_t *p, size_t avail) {
  uint8_t c = p[0];
  size_t n;
  uint8_t lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0)
      lo = 0xa0;
    else if (c == 0xed)
      hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0)
      lo = 0x90;
    else if (c == 0xf4)
      hi = 0x8f;
  } else
    return 0;
  if (avail < n || p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++)
    if ((p[i] & 0xc0) != 0x80)
      return 0;
  return n;
}

static bool utf8_valid(const uint8_t *p, size_t len) {
  for (size_t i = 0; i < len;) {
    if (p[i] < 0x80) {
      i++;
      continue;
    }
    size_t n = cph_utf8_seq(p + i, len - i);
    if (!n)
      return false;
    i += n;
  }
  return true;
}

/* ---------------------------------------------------------------- structure */

void cph_emit_init(cph_emit *w, cph_buf *out, bool msgpack) {
  memset(w, 0, sizeof *w);
  w->out = out;
  w->msgpack = msgpack;
  w->depth = 0;
  w->first[0] = true;
  w->left[0] = 1; /* the one top-level value */
}

/* Before any value or key: the comma that separates it from the previous member (JSON) and
 * the member count (debug builds). Keys count as the member; their value does not again. */
static void before_value(cph_emit *w, bool is_key) {
  int d = w->depth;
  if (w->in_object[d] && !is_key)
    return; /* the value of a key just written */
  assert(w->left[d] > 0 && "more members than declared");
  w->left[d]--;
  if (!w->msgpack) {
    if (!w->first[d])
      cph_buf_putc(w->out, ',');
  }
  w->first[d] = false;
}

static int buf_write(void *data, const char *buf, size_t len) {
  cph_buf_append(data, buf, len);
  return 0;
}

static void packer(cph_emit *w, msgpack_packer *pk) { msgpack_packer_init(pk, w->out, buf_write); }

static void open_container(cph_emit *w, size_t n, bool object) {
  before_value(w, false);
  if (w->msgpack) {
    msgpack_packer pk;
    packer(w, &pk);
    if (object)
      msgpack_pack_map(&pk, n);
    else
      msgpack_pack_array(&pk, n);
  } else {
    cph_buf_putc(w->out, object ? '{' : '[');
  }
  assert(w->depth + 1 < CPH_EMIT_DEPTH_MAX);
  int d = ++w->depth;
  w->first[d] = true;
  w->left[d] = n;
  w->in_object[d] = object;
}

void cph_emit_object(cph_emit *w, size_t n_members) { open_container(w, n_members, true); }
void cph_emit_array(cph_emit *w, size_t n_items) { open_container(w, n_items, false); }

void cph_emit_end(cph_emit *w) {
  int d = w->depth;
  assert(d > 0 && w->left[d] == 0 && "fewer members than declared");
  if (!w->msgpack)
    cph_buf_putc(w->out, w->in_object[d] ? '}' : ']');
  w->depth--;
}

/* ---------------------------------------------------------------- strings */

/* Whether any of the 8 bytes in x needs a look: >= 0x80, < 0x20, '"' or '\\' (bit tricks
 * on a word: a zero byte in v shows as the high bit of (v - 0x01..) & ~v). */
static bool word_needs_look(uint64_t x) {
  const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  uint64_t ctrl = (x - 0x20 * ones) & ~x;
  uint64_t quote = x ^ (0x22 * ones), backslash = x ^ (0x5c * ones);
  uint64_t eq = ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash);
  return ((x | ctrl | eq) & highs) != 0;
}

#ifdef __SSE2__
/* The offset of the first of the 16 bytes at p that needs a look, 16 when none does. A signed
 * compare with 0x20 flags the control characters and every byte >= 0x80 at once. */
static inline unsigned block_look(const uint8_t *p) {
  __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
  __m128i look = _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
                              _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                           _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))));
  unsigned mask = (unsigned)_mm_movemask_epi8(look);
  return mask ? (unsigned)__builtin_ctz(mask) : 16;
}
#endif

static void json_string(cph_buf *b, const uint8_t *p, size_t len) {
  static const char HEX[] = "0123456789abcdef";
  cph_buf_putc(b, '"');
  size_t run = 0; /* start of the pending run of bytes copied as they are */
  for (size_t i = 0; i < len;) {
    /* plain ASCII, the common case: 16 bytes at a time where SSE2 is (every x86-64), else a
     * word at a time; the byte that stops the skip is looked at below */
#ifdef __SSE2__
    if (len - i >= 16) {
      unsigned k = block_look(p + i);
      i += k;
      if (k == 16)
        continue;
    } else
#endif
    {
      uint64_t word;
      if (len - i >= 8 && (memcpy(&word, p + i, 8), !word_needs_look(word))) {
        i += 8;
        continue;
      }
    }
    uint8_t c = p[i];
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
      i++;
      continue;
    }
    if (c >= 0x80) {
      size_t n = cph_utf8_seq(p + i, len - i);
      if (n) {
        i += n;
        continue;
      }
    }
    cph_buf_append(b, p + run, i - run);
    switch (c) {
    case '"': cph_buf_append(b, "\\\"", 2); break;
    case '\\': cph_buf_append(b, "\\\\", 2); break;
    case '\n': cph_buf_append(b, "\\n", 2); break;
    case '\r': cph_buf_append(b, "\\r", 2); break;
    case '\t': cph_buf_append(b, "\\t", 2); break;
    case '\b': cph_buf_append(b, "\\b", 2); break;
    case '\f': cph_buf_append(b, "\\f", 2); break;
    default:
      if (c < 0x20) {
        char esc[6] = {'\\', 'u', '0', '0', HEX[c >> 4], HEX[c & 15]};
        cph_buf_append(b, esc, sizeof esc);
      } else {
        cph_buf_append(b, REPLACEMENT, 3); /* not UTF-8 */
      }
    }
    run = ++i;
  }
  cph_buf_append(b, p + run, len - run);
  cph_buf_putc(b, '"');
}

/* s as msgpack str; ill-formed UTF-8 is repaired into `fixed` first. */
static void mp_string(cph_emit *w, const uint8_t *p, size_t len) {
  msgpack_packer pk;
  packer(w, &pk);
  if (utf8_valid(p, len)) {
    msgpack_pack_str(&pk, len);
    msgpack_pack_str_body(&pk, p, len);
    return;
  }
  cph_buf fixed = CPH_BUF_INIT;
  for (size_t i = 0; i < len;) {
    size_t n = p[i] < 0x80 ? 1 : cph_utf8_seq(p + i, len - i);
    if (n) {
      cph_buf_append(&fixed, p + i, n);
      i += n;
    } else {
      cph_buf_append(&fixed, REPLACEMENT, 3);
      i++;
    }
  }
  if (cph_buf_error(&fixed)) {
    w->out->failed = true;
  } else {
    msgpack_pack_str(&pk, fixed.len);
    msgpack_pack_str_body(&pk, fixed.data ? fixed.data : "", fixed.len);
  }
  cph_buf_free(&fixed);
}

static void write_string(cph_emit *w, const char *s) {
  size_t len = strlen(s);
  if (w->msgpack)
    mp_string(w, (const uint8_t *)s, len);
  else
    json_string(w->out, (const uint8_t *)s, len);
}

void cph_emit_key_mp(cph_emit *w, const char *key, size_t len) {
  assert(w->in_object[w->depth] && "a key outside an object");
  before_value(w, true);
  mp_string(w, (const uint8_t *)key, len);
}

void cph_emit_str(cph_emit *w, const char *s) {
  before_value(w, false);
  if (!s) {
    if (w->msgpack) {
      msgpack_packer pk;
      packer(w, &pk);
      msgpack_pack_nil(&pk);
    } else {
      cph_buf_append(w->out, "null", 4);
    }
    return;
  }
  write_string(w, s);
}

/* ---------------------------------------------------------------- numbers, booleans */

void cph_emit_i64(cph_emit *w, int64_t v) {
  before_value(w, false);
  if (w->msgpack) {
    msgpack_packer pk;
    packer(w, &pk);
    msgpack_pack_int64(&pk, v);
    return;
  }
  /* Digits written from the end, two at a time from a table: no printf on this hot path (a
   * lease answer writes about 230 numbers, most of them 13-digit times and ids). */
  static const char pairs[201] = "000102030405060708091011121314151617181920212223242526272829"
                                 "303132333435363738394041424344454647484950515253545556575859"
                                 "606162636465666768697071727374757677787980818283848586878889"
                                 "90919293949596979899";
  char num[24];
  char *p = num + sizeof num;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  while (u >= 100) {
    unsigned d = (unsigned)(u % 100) * 2;
    u /= 100;
    *--p = pairs[d + 1];
    *--p = pairs[d];
  }
  if (u >= 10) {
    *--p = pairs[u * 2 + 1];
    *--p = pairs[u * 2];
  } else {
    *--p = (char)('0' + u);
  }
  if (v < 0)
    *--p = '-';
  cph_buf_append(w->out, p, (size_t)(num + sizeof num - p));
}

void cph_emit_u64(cph_emit *w, uint64_t v) {
  cph_emit_i64(w, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

void cph_emit_real(cph_emit *w, double v) {
  before_value(w, false);
  if (w->msgpack) {
    msgpack_packer pk;
    packer(w, &pk);
    msgpack_pack_double(&pk, v);
    return;
  }
  char num[40];
  int n = snprintf(num, sizeof num, "%.15g", v);
  if (n <= 0 || (size_t)n >= sizeof num || strpbrk(num, "ni")) { /* nan/inf: not JSON */
    cph_buf_append(w->out, "null", 4);
    return;
  }
  cph_buf_append(w->out, num, (size_t)n);
  if (!strpbrk(num, ".e"))
    cph_buf_append(w->out, ".0", 2); /* stays a real when read back */
}

void cph_emit_bool(cph_emit *w, bool v) {
  before_value(w, false);
  if (w->msgpack) {
    msgpack_packer pk;
    packer(w, &pk);
    if (v)
      msgpack_pack_true(&pk);
    else
      msgpack_pack_false(&pk);
    return;
  }
  if (v)
    cph_buf_append(w->out, "true", 4);
  else
    cph_buf_append(w->out, "false", 5);
}
