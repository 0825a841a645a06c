/* The fast decoder of events' JSON (see evjson.h). */
#include "evjson.h"

#include <stdint.h>
#include <string.h>

#include "emit.h"

enum { F_CHANNEL, F_SENDER, F_BODY, F_SESSION, F_KIND, F_KEY, F_MENTIONS, F_TS_MS, F_COUNT };
static const char *const FIELD_NAMES[F_COUNT] = {"channel", "sender", "body",     "session",
                                                 "kind",    "key",    "mentions", "ts_ms"};

void cph_evjson_ws(cph_evjson *f) {
  while (f->p < f->end && (*f->p == ' ' || *f->p == '\t' || *f->p == '\n' || *f->p == '\r'))
    f->p++;
}

/* Skips whitespace, then c if it is next. */
bool cph_evjson_lit(cph_evjson *f, char c) {
  cph_evjson_ws(f);
  if (f->p < f->end && *f->p == c) {
    f->p++;
    return true;
  }
  return false;
}

/* Whether any of the 8 bytes in x is a quote, a backslash, a control character (< 0x20) or
 * not ASCII: the bytes fast_str looks at one by one. The usual SWAR tests (a zero byte of
 * x ^ c; a byte under 0x20; the top bit), exact when the top bits are clear. */
static inline bool swar_special(uint64_t x) {
  const uint64_t ones = 0x0101010101010101ull, tops = 0x8080808080808080ull;
  uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
  uint64_t hit = ((q - ones) & ~q) | ((b - ones) & ~b) | (x - ones * 0x20) | x;
  return (hit & tops) != 0;
}

/* A string value into f's allocator (NUL-terminated); false on anything the fast path leaves
 * to jansson. */
bool cph_evjson_str(cph_evjson *f, char **out) {
  if (!cph_evjson_lit(f, '"'))
    return false;
  const char *start = f->p;
  bool escaped = false;
  while (f->p < f->end) {
    uint64_t x; /* plain ASCII 8 bytes at a time; anything else one by one */
    while (f->end - f->p >= 8 && (memcpy(&x, f->p, 8), !swar_special(x)))
      f->p += 8;
    if (f->p >= f->end)
      break;
    uint8_t c = (uint8_t)*f->p;
    if (c == '"')
      break;
    if (c < 0x20)
      return false;
    if (c == '\\') {
      if (f->end - f->p < 2 || f->p[1] == 'u')
        return false;
      escaped = true;
      f->p += 2;
    } else if (c >= 0x80) {
      size_t n = cph_utf8_seq((const uint8_t *)f->p, (size_t)(f->end - f->p));
      if (!n)
        return false;
      f->p += n;
    } else {
      f->p++;
    }
  }
  if (f->p >= f->end)
    return false;
  size_t raw = (size_t)(f->p - start);
  f->p++; /* the closing quote */
  char *s = f->alloc(f->ctx, raw + 1);
  if (!s)
    return false;
  size_t n = 0;
  if (!escaped) {
    memcpy(s, start, raw);
    n = raw;
  } else {
    for (size_t i = 0; i < raw; i++) {
      if (start[i] != '\\') {
        s[n++] = start[i];
        continue;
      }
      switch (start[++i]) {
      case '"': s[n++] = '"'; break;
      case '\\': s[n++] = '\\'; break;
      case '/': s[n++] = '/'; break;
      case 'b': s[n++] = '\b'; break;
      case 'f': s[n++] = '\f'; break;
      case 'n': s[n++] = '\n'; break;
      case 'r': s[n++] = '\r'; break;
      case 't': s[n++] = '\t'; break;
      default: return false;
      }
    }
  }
  s[n] = '\0';
  if (n > f->max_str)
    return false;
  *out = s;
  return true;
}

/* A key without escapes, matched against the event fields: its index, or -1. */
static int fast_key(cph_evjson *f) {
  if (!cph_evjson_lit(f, '"'))
    return -1;
  const char *start = f->p;
  while (f->p < f->end && *f->p != '"' && *f->p != '\\' && (uint8_t)*f->p >= 0x20)
    f->p++;
  if (f->p >= f->end || *f->p != '"')
    return -1;
  size_t len = (size_t)(f->p - start);
  f->p++;
  if (!cph_evjson_lit(f, ':'))
    return -1;
  for (int i = 0; i < F_COUNT; i++)
    if (strlen(FIELD_NAMES[i]) == len && memcmp(FIELD_NAMES[i], start, len) == 0)
      return i;
  return -1;
}

/* JSON null, which the generic path reads as an absent field. */
static bool fast_null(cph_evjson *f) {
  cph_evjson_ws(f);
  if (f->end - f->p >= 4 && memcmp(f->p, "null", 4) == 0) {
    f->p += 4;
    return true;
  }
  return false;
}

/* A JSON integer from 0 to INT64_MAX (no fraction, no exponent, no leading zero). */
static bool fast_i64(cph_evjson *f, int64_t *out) {
  cph_evjson_ws(f);
  const char *start = f->p;
  uint64_t v = 0;
  while (f->p < f->end && *f->p >= '0' && *f->p <= '9') {
    uint64_t d = (uint64_t)(*f->p - '0');
    if (v > ((uint64_t)INT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
    f->p++;
  }
  size_t n = (size_t)(f->p - start);
  if (n == 0 || (n > 1 && *start == '0'))
    return false;
  if (f->p < f->end && (*f->p == '.' || *f->p == 'e' || *f->p == 'E'))
    return false;
  *out = (int64_t)v;
  return true;
}

static bool fast_mentions(cph_evjson *f, cph_strv *out) {
  if (!cph_evjson_lit(f, '['))
    return false;
  size_t n = 0, cap = 0;
  char **items = NULL;
  if (cph_evjson_lit(f, ']')) {
    out->items = NULL;
    out->count = 0;
    return true;
  }
  do {
    if (n == cap) {
      cap = cap ? 2 * cap : 4;
      char **grown = f->alloc(f->ctx, cap * sizeof *grown);
      if (!grown)
        return false;
      if (n)
        memcpy(grown, items, n * sizeof *items);
      items = grown;
    }
    if (!cph_evjson_str(f, &items[n++]))
      return false;
  } while (cph_evjson_lit(f, ','));
  if (!cph_evjson_lit(f, ']'))
    return false;
  out->items = items;
  out->count = n;
  return true;
}

bool cph_evjson_event(cph_evjson *f, cph_event_in *in) {
  memset(in, 0, sizeof *in);
  if (!cph_evjson_lit(f, '{'))
    return false;
  if (cph_evjson_lit(f, '}'))
    return true;
  unsigned seen = 0;
  char **strs[F_MENTIONS] = {&in->channel, &in->sender, &in->body,
                             &in->session, &in->kind,   &in->key};
  do {
    int k = fast_key(f);
    if (k < 0 || (seen & (1u << k)))
      return false; /* unknown, or repeated: JSON_REJECT_DUPLICATES answers that */
    seen |= 1u << k;
    if (fast_null(f))
      continue;
    bool ok = k < F_MENTIONS  ? cph_evjson_str(f, strs[k])
              : k == F_TS_MS ? fast_i64(f, &in->ts_ms)
                             : fast_mentions(f, &in->mentions);
    if (!ok)
      return false;
  } while (cph_evjson_lit(f, ','));
  return cph_evjson_lit(f, '}');
}

