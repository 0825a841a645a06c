/* cph_emit — writes a response body straight into a buffer, as JSON text or as msgpack, from
 * one sequence of calls. For large, hot bodies (a leased turn carries its whole context) this
 * replaces building a jansson tree and serialising it: no node per value, no second pass.
 *
 * Contract:
 * - Containers declare how many members they will hold (msgpack writes the count first); the
 *   caller must then write exactly that many (an object member = cph_emit_key + one value).
 *   A mismatch is a programming error: debug builds assert on it.
 * - Strings are written as valid UTF-8: JSON escapes '"', '\\' and control characters; bytes
 *   that are not UTF-8 become U+FFFD in both forms. A NULL string is written as null.
 * - Doubles use 15 significant digits in JSON (as the jansson path does) and always carry a
 *   decimal point or exponent, so they read back as reals.
 * - Allocation failure is sticky in the buffer (cph_buf_error). */
#ifndef CEPHALON_SERVER_EMIT_H
#define CEPHALON_SERVER_EMIT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/buf.h"

#define CPH_EMIT_DEPTH_MAX 16

typedef struct cph_emit {
  cph_buf *out;
  bool msgpack;
  int depth;
  bool first[CPH_EMIT_DEPTH_MAX];     /* JSON: no comma before this container's next member */
  size_t left[CPH_EMIT_DEPTH_MAX];    /* members still to write (checked in debug builds) */
  bool in_object[CPH_EMIT_DEPTH_MAX]; /* keys expected at this depth */
} cph_emit;

void cph_emit_init(cph_emit *w, cph_buf *out, bool msgpack);

void cph_emit_object(cph_emit *w, size_t n_members);
void cph_emit_array(cph_emit *w, size_t n_items);
void cph_emit_end(cph_emit *w); /* closes the innermost object or array */

/* An object member's key. `lit` must be a string literal of printable ASCII other than '"'
 * and '\\' (every key of our API is): the compiler joins it into its JSON form, "lit":, so
 * writing a key copies bytes it already has — a lease answer writes about 1,700 keys. */
#define cph_emit_key(w, lit) cph_emit_key_lit((w), lit, "\"" lit "\":", sizeof(lit) - 1)
void cph_emit_key_mp(cph_emit *w, const char *key, size_t len); /* msgpack's form */

static inline void cph_emit_key_lit(cph_emit *w, const char *key, const char *json, size_t len) {
  if (w->msgpack) {
    cph_emit_key_mp(w, key, len);
    return;
  }
#ifndef NDEBUG
  for (size_t i = 0; i < len; i++)
    assert(key[i] >= 0x20 && key[i] < 0x7f && key[i] != '"' && key[i] != '\\' &&
           "a key that would need escaping");
#endif
  int d = w->depth;
  assert(w->in_object[d] && "a key outside an object");
  assert(w->left[d] > 0 && "more members than declared");
  w->left[d]--;
  bool comma = !w->first[d];
  w->first[d] = false;
  cph_buf *b = w->out;
  size_t n = comma + len + 3; /* ,"key": */
  if ((b->failed || b->cap - b->len <= n) && !cph_buf_grow(b, n))
    return;
  char *p = b->data + b->len;
  *p = ',';
  memcpy(p + comma, json, len + 3);
  b->len += n;
  b->data[b->len] = '\0';
}
void cph_emit_str(cph_emit *w, const char *s); /* NULL: null */
void cph_emit_u64(cph_emit *w, uint64_t v);    /* above INT64_MAX: INT64_MAX, as cph_json_u64 */
void cph_emit_i64(cph_emit *w, int64_t v);
void cph_emit_real(cph_emit *w, double v);
void cph_emit_bool(cph_emit *w, bool v);

/* Length of the well-formed UTF-8 sequence that starts with the non-ASCII byte p[0] (at most
 * `avail` bytes), 0 if ill-formed: no overlongs, no surrogates, nothing above U+10FFFF —
 * what jansson accepts in a JSON string. */
size_t cph_utf8_seq(const uint8_t *p, size_t avail);

#endif
