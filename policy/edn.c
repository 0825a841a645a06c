/* EDN reader and writer; the contract is in edn.h, the format in
 * https://github.com/edn-format/edn.
 *
 * The reader is one pass over the bytes with an explicit stack of open forms (list, vector,
 * map, set, tag, discard). Nesting therefore costs heap, never C stack: the depth limit is
 * checked before a frame is pushed, so 100,000 '[' end in a clean error. An atom, or a
 * collection whose closing bracket was just read, is "delivered" to the innermost open form.
 *
 * cph_edn_free, cph_edn_equal and cph_edn_write recurse, but only as deep as the value, which
 * the reader bounds by max_depth. */
#include "edn.h"

#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

/* ---------------------------------------------------------------------------------------------
 * Allocation
 * ------------------------------------------------------------------------------------------- */

/* Test seam, deliberately not in edn.h: when > 0, the allocation that brings it to 0 fails.
 * tests/unit/test_edn.c walks it over every allocation of a parse to prove that each
 * CPH_ENOMEM path frees what it holds. Thread-local so concurrent parsers are unaffected. */
_Thread_local long cph_edn__fail_alloc_countdown;

static bool alloc_should_fail(void) {
  return cph_edn__fail_alloc_countdown > 0 && --cph_edn__fail_alloc_countdown == 0;
}

static void *edn_malloc(size_t n) { return alloc_should_fail() ? NULL : malloc(n); }

static void *edn_realloc(void *p, size_t n) { return alloc_should_fail() ? NULL : realloc(p, n); }

static char *edn_strndup(const void *s, size_t n) {
  char *d = edn_malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* Returns ptr grown to at least `need` elements (doubling; *cap updated), or NULL with ptr
 * untouched. */
static void *grow_array(void *ptr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return ptr;
  size_t ncap = *cap ? *cap : 8;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2 / elem)
      return NULL;
    ncap *= 2;
  }
  void *np = edn_realloc(ptr, ncap * elem);
  if (np)
    *cap = ncap;
  return np;
}

/* ---------------------------------------------------------------------------------------------
 * Values
 * ------------------------------------------------------------------------------------------- */

static size_t coll_len(const cph_edn *v) {
  return v->type == CPH_EDN_MAP ? 2 * v->u.coll.count : v->u.coll.count;
}

/* Frees what v owns, not v itself (collection items live inline in their parent's array). */
static void free_contents(cph_edn *v) {
  switch (v->type) {
  case CPH_EDN_STRING:
  case CPH_EDN_KEYWORD:
  case CPH_EDN_SYMBOL:
    free(v->u.str.ptr);
    break;
  case CPH_EDN_LIST:
  case CPH_EDN_VECTOR:
  case CPH_EDN_MAP:
  case CPH_EDN_SET: {
    size_t n = coll_len(v);
    for (size_t i = 0; i < n; i++)
      free_contents(&v->u.coll.items[i]);
    free(v->u.coll.items);
    break;
  }
  case CPH_EDN_TAGGED:
    free(v->u.tagged.tag);
    if (v->u.tagged.value) {
      free_contents(v->u.tagged.value);
      free(v->u.tagged.value);
    }
    break;
  default:
    break;
  }
  free(v->text);
}

void cph_edn_free(cph_edn *v) {
  if (!v)
    return;
  free_contents(v);
  free(v);
}

const char *cph_edn_type_name(cph_edn_type t) {
  switch (t) {
  case CPH_EDN_NIL:
    return "nil";
  case CPH_EDN_BOOL:
    return "a boolean";
  case CPH_EDN_STRING:
    return "a string";
  case CPH_EDN_CHAR:
    return "a character";
  case CPH_EDN_INT:
    return "an integer";
  case CPH_EDN_BIGINT:
    return "a big integer";
  case CPH_EDN_FLOAT:
    return "a float";
  case CPH_EDN_KEYWORD:
    return "a keyword";
  case CPH_EDN_SYMBOL:
    return "a symbol";
  case CPH_EDN_LIST:
    return "a list";
  case CPH_EDN_VECTOR:
    return "a vector";
  case CPH_EDN_MAP:
    return "a map";
  case CPH_EDN_SET:
    return "a set";
  case CPH_EDN_TAGGED:
    return "a tagged literal";
  }
  return "an unknown value";
}

const cph_edn *cph_edn_map_get_keyword(const cph_edn *map, const char *name) {
  if (!map || map->type != CPH_EDN_MAP || !name)
    return NULL;
  size_t n = strlen(name);
  for (size_t i = 0; i < map->u.coll.count; i++) {
    const cph_edn *k = &map->u.coll.items[2 * i];
    if (k->type == CPH_EDN_KEYWORD && k->u.str.len == n && memcmp(k->u.str.ptr, name, n) == 0)
      return &map->u.coll.items[2 * i + 1];
  }
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Equality and hashing
 *
 * The two must agree: equal values hash equally. Integers (INT and BIGINT alike) are compared
 * through a canonical sign + digits form; lists and vectors are both "sequences" and equal to
 * each other (EDN spec, "equality"); maps and sets ignore order.
 * ------------------------------------------------------------------------------------------- */

static bool is_integer(const cph_edn *v) {
  return v->type == CPH_EDN_INT || v->type == CPH_EDN_BIGINT;
}

static bool is_sequence(const cph_edn *v) {
  return v->type == CPH_EDN_LIST || v->type == CPH_EDN_VECTOR;
}

/* An integer as sign and magnitude digits without leading zeros; zero has no digits and is
 * never negative. digits may point into buf, so an int_key must not be copied. */
typedef struct int_key {
  bool neg;
  const char *digits;
  size_t n;
  char buf[24];
} int_key;

static void int_key_of(const cph_edn *v, int_key *k) {
  if (v->type == CPH_EDN_INT) {
    int64_t x = v->u.integer;
    uint64_t mag = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    char *end = k->buf + sizeof k->buf;
    char *d = end;
    while (mag) {
      *--d = (char)('0' + mag % 10);
      mag /= 10;
    }
    k->neg = x < 0;
    k->digits = d;
    k->n = (size_t)(end - d);
    return;
  }
  /* BIGINT: only text is meaningful ("-12345678901234567890N"). */
  const char *t = v->text ? v->text : "";
  size_t n = strlen(t);
  k->neg = false;
  if (n && (t[0] == '+' || t[0] == '-')) {
    k->neg = t[0] == '-';
    t++;
    n--;
  }
  if (n && t[n - 1] == 'N')
    n--;
  while (n && *t == '0') {
    t++;
    n--;
  }
  if (n == 0)
    k->neg = false;
  k->digits = t;
  k->n = n;
}

static bool int_equal(const cph_edn *a, const cph_edn *b) {
  if (a->type == CPH_EDN_INT && b->type == CPH_EDN_INT)
    return a->u.integer == b->u.integer;
  int_key ka, kb;
  int_key_of(a, &ka);
  int_key_of(b, &kb);
  return ka.neg == kb.neg && ka.n == kb.n && memcmp(ka.digits, kb.digits, ka.n) == 0;
}

/* How many of the n width-sized entries at items equal the entry at x. */
static size_t count_equal(const cph_edn *items, size_t n, size_t width, const cph_edn *x) {
  size_t hits = 0;
  for (size_t i = 0; i < n; i++) {
    bool same = true;
    for (size_t w = 0; w < width && same; w++)
      same = cph_edn_equal(&items[i * width + w], &x[w]);
    hits += same;
  }
  return hits;
}

/* Order-insensitive comparison of n entries (width 1: set elements, 2: map key/value pairs)
 * as multisets, so it stays right even for collections read with allow_duplicate_keys: with
 * equal counts, every entry must occur as often in b as in a. O(n^2) equality tests and no
 * allocation; fine for policy-sized data. */
static bool unordered_equal(const cph_edn *a, const cph_edn *b, size_t n, size_t width) {
  for (size_t i = 0; i < n; i++) {
    const cph_edn *x = &a[i * width];
    if (count_equal(a, n, width, x) != count_equal(b, n, width, x))
      return false;
  }
  return true;
}

bool cph_edn_equal(const cph_edn *a, const cph_edn *b) {
  if (a == b)
    return true;
  if (!a || !b)
    return false;
  if (is_integer(a) && is_integer(b))
    return int_equal(a, b);
  if (is_sequence(a) && is_sequence(b)) {
    if (a->u.coll.count != b->u.coll.count)
      return false;
    for (size_t i = 0; i < a->u.coll.count; i++)
      if (!cph_edn_equal(&a->u.coll.items[i], &b->u.coll.items[i]))
        return false;
    return true;
  }
  if (a->type != b->type)
    return false;
  switch (a->type) {
  case CPH_EDN_NIL:
    return true;
  case CPH_EDN_BOOL:
    return a->u.boolean == b->u.boolean;
  case CPH_EDN_CHAR:
    return a->u.codepoint == b->u.codepoint;
  case CPH_EDN_FLOAT:
    return a->u.floating == b->u.floating || (isnan(a->u.floating) && isnan(b->u.floating));
  case CPH_EDN_STRING:
  case CPH_EDN_KEYWORD:
  case CPH_EDN_SYMBOL:
    return a->u.str.len == b->u.str.len && memcmp(a->u.str.ptr, b->u.str.ptr, a->u.str.len) == 0;
  case CPH_EDN_MAP:
  case CPH_EDN_SET:
    return a->u.coll.count == b->u.coll.count &&
           unordered_equal(a->u.coll.items, b->u.coll.items, a->u.coll.count,
                           a->type == CPH_EDN_MAP ? 2 : 1);
  case CPH_EDN_TAGGED:
    return strcmp(a->u.tagged.tag, b->u.tagged.tag) == 0 &&
           cph_edn_equal(a->u.tagged.value, b->u.tagged.value);
  default:
    return false;
  }
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t hash_bytes(uint64_t seed, const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 0xcbf29ce484222325ULL ^ mix64(seed);
  for (size_t i = 0; i < n; i++)
    h = (h ^ s[i]) * 0x100000001b3ULL;
  return mix64(h);
}

/* Consistent with cph_edn_equal; linear in the size of v. */
static uint64_t edn_hash(const cph_edn *v) {
  switch (v->type) {
  case CPH_EDN_NIL:
    return mix64(1);
  case CPH_EDN_BOOL:
    return mix64(2 + v->u.boolean);
  case CPH_EDN_STRING:
    return hash_bytes(3, v->u.str.ptr, v->u.str.len);
  case CPH_EDN_CHAR:
    return mix64(((uint64_t)4 << 32) ^ v->u.codepoint);
  case CPH_EDN_INT:
  case CPH_EDN_BIGINT: {
    int_key k;
    int_key_of(v, &k);
    return hash_bytes(5 + k.neg, k.digits, k.n);
  }
  case CPH_EDN_FLOAT: {
    double d = v->u.floating;
    if (isnan(d))
      return mix64(7);
    if (d == 0)
      d = 0; /* -0.0 equals 0.0 */
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return mix64(bits ^ 0x7777);
  }
  case CPH_EDN_KEYWORD:
    return hash_bytes(8, v->u.str.ptr, v->u.str.len);
  case CPH_EDN_SYMBOL:
    return hash_bytes(9, v->u.str.ptr, v->u.str.len);
  case CPH_EDN_LIST:
  case CPH_EDN_VECTOR: {
    uint64_t h = mix64(10);
    for (size_t i = 0; i < v->u.coll.count; i++)
      h = mix64(h * 31 + edn_hash(&v->u.coll.items[i]));
    return h;
  }
  case CPH_EDN_MAP:
  case CPH_EDN_SET: {
    /* A sum, so order does not matter. */
    bool map = v->type == CPH_EDN_MAP;
    uint64_t sum = map ? 11 : 12;
    for (size_t i = 0; i < v->u.coll.count; i++) {
      if (map)
        sum += mix64(edn_hash(&v->u.coll.items[2 * i]) * 31 +
                     edn_hash(&v->u.coll.items[2 * i + 1]));
      else
        sum += mix64(edn_hash(&v->u.coll.items[i]));
    }
    return mix64(sum);
  }
  case CPH_EDN_TAGGED: {
    uint64_t h = hash_bytes(13, v->u.tagged.tag, strlen(v->u.tagged.tag));
    return mix64(h ^ (v->u.tagged.value ? edn_hash(v->u.tagged.value) : 0));
  }
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Numbers and the C locale
 *
 * strtod and printf follow LC_NUMERIC, so a process that called setlocale() could read "1.5"
 * as 1 or write "1,5". Both go through a "C" numeric locale made once per process.
 * ------------------------------------------------------------------------------------------- */

static _Atomic(locale_t) c_numeric;

static locale_t c_locale(void) {
  locale_t loc = atomic_load(&c_numeric);
  if (loc)
    return loc;
  locale_t fresh = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  if (!fresh)
    return (locale_t)0; /* fall back to the current locale, "C" unless someone changed it */
  locale_t expected = (locale_t)0;
  if (atomic_compare_exchange_strong(&c_numeric, &expected, fresh))
    return fresh;
  freelocale(fresh);
  return expected;
}

static double c_strtod(const char *s) {
  locale_t loc = c_locale();
  locale_t old = loc ? uselocale(loc) : (locale_t)0;
  double d = strtod(s, NULL);
  if (loc)
    uselocale(old);
  return d;
}

/* Shortest of %.15g, %.16g, %.17g that reads back as d (%.17g always does). */
static void format_double(double d, char *dst, size_t cap) {
  locale_t loc = c_locale();
  locale_t old = loc ? uselocale(loc) : (locale_t)0;
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(dst, cap, "%.*g", prec, d);
    if (strtod(dst, NULL) == d)
      break;
  }
  if (loc)
    uselocale(old);
}

/* ---------------------------------------------------------------------------------------------
 * UTF-8
 * ------------------------------------------------------------------------------------------- */

/* Decodes one well-formed UTF-8 sequence (no overlongs, surrogates or values past U+10FFFF)
 * from s[0..n); returns its length, or 0 if the bytes are not one. */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  if (n == 0)
    return 0;
  unsigned char b = s[0];
  size_t need;
  uint32_t v, min;
  if (b < 0x80) {
    *cp = b;
    return 1;
  } else if (b >= 0xC2 && b <= 0xDF) {
    need = 2, v = b & 0x1F, min = 0x80;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3, v = b & 0x0F, min = 0x800;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4, v = b & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < need)
    return 0;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    v = v << 6 | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
    return 0;
  *cp = v;
  return need;
}

static size_t utf8_encode(uint32_t cp, unsigned char out[4]) {
  if (cp < 0x80) {
    out[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (unsigned char)(0xC0 | cp >> 6);
    out[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (unsigned char)(0xE0 | cp >> 12);
    out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (unsigned char)(0xF0 | cp >> 18);
  out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  out[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

static void write_value(const cph_edn *v, cph_buf *out);

static void write_string(const cph_edn *v, cph_buf *out) {
  const unsigned char *s = (const unsigned char *)v->u.str.ptr;
  size_t n = v->u.str.len, run = 0;
  cph_buf_putc(out, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    const char *esc = NULL;
    switch (c) {
    case '"':
      esc = "\\\"";
      break;
    case '\\':
      esc = "\\\\";
      break;
    case '\n':
      esc = "\\n";
      break;
    case '\r':
      esc = "\\r";
      break;
    case '\t':
      esc = "\\t";
      break;
    case '\b':
      esc = "\\b";
      break;
    case '\f':
      esc = "\\f";
      break;
    default:
      if (c >= 0x20 && c != 0x7F)
        continue; /* part of the current run of literal bytes */
    }
    cph_buf_append(out, s + run, i - run);
    run = i + 1;
    if (esc)
      cph_buf_puts(out, esc);
    else
      cph_buf_printf(out, "\\u%04X", c);
  }
  cph_buf_append(out, s + run, n - run);
  cph_buf_putc(out, '"');
}

static void write_char(uint32_t cp, cph_buf *out) {
  static const struct {
    uint32_t cp;
    const char *name;
  } names[] = {{'\n', "newline"},  {'\r', "return"},   {' ', "space"},
               {'\t', "tab"},      {'\f', "formfeed"}, {'\b', "backspace"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (names[i].cp == cp) {
      cph_buf_putc(out, '\\');
      cph_buf_puts(out, names[i].name);
      return;
    }
  }
  /* ',' is whitespace to the reader, so "\," would not read back. */
  if (cp > 0x20 && cp < 0x7F && cp != ',') {
    cph_buf_putc(out, '\\');
    cph_buf_putc(out, (char)cp);
  } else if (cp >= 0x10000 && cp <= 0x10FFFF) {
    unsigned char u[4]; /* \uXXXX cannot express it; the raw character can */
    size_t n = utf8_encode(cp, u);
    cph_buf_putc(out, '\\');
    cph_buf_append(out, u, n);
  } else {
    cph_buf_printf(out, "\\u%04X", (unsigned)(cp <= 0xFFFF ? cp : 0xFFFD));
  }
}

static void write_float(const cph_edn *v, cph_buf *out) {
  double d = v->u.floating;
  size_t tn = v->text ? strlen(v->text) : 0;
  if (tn && v->text[tn - 1] == 'M') {
    cph_buf_puts(out, v->text); /* exact precision: keep the literal */
  } else if (isnan(d)) {
    cph_buf_puts(out, "##NaN");
  } else if (isinf(d)) {
    cph_buf_puts(out, d > 0 ? "##Inf" : "##-Inf");
  } else {
    char tmp[48];
    format_double(d, tmp, sizeof tmp);
    cph_buf_puts(out, tmp);
    if (!strpbrk(tmp, ".eE"))
      cph_buf_puts(out, ".0"); /* "1" would read back as an integer */
  }
}

static void write_items(const cph_edn *v, const char *open, const char *close, cph_buf *out) {
  cph_buf_puts(out, open);
  for (size_t i = 0; i < v->u.coll.count; i++) {
    if (i)
      cph_buf_puts(out, v->type == CPH_EDN_MAP ? ", " : " ");
    if (v->type == CPH_EDN_MAP) {
      write_value(&v->u.coll.items[2 * i], out);
      cph_buf_putc(out, ' ');
      write_value(&v->u.coll.items[2 * i + 1], out);
    } else {
      write_value(&v->u.coll.items[i], out);
    }
  }
  cph_buf_puts(out, close);
}

static void write_value(const cph_edn *v, cph_buf *out) {
  switch (v->type) {
  case CPH_EDN_NIL:
    cph_buf_puts(out, "nil");
    break;
  case CPH_EDN_BOOL:
    cph_buf_puts(out, v->u.boolean ? "true" : "false");
    break;
  case CPH_EDN_STRING:
    write_string(v, out);
    break;
  case CPH_EDN_CHAR:
    write_char(v->u.codepoint, out);
    break;
  case CPH_EDN_INT:
    if (v->text)
      cph_buf_puts(out, v->text);
    else
      cph_buf_printf(out, "%" PRId64, v->u.integer);
    break;
  case CPH_EDN_BIGINT:
    cph_buf_puts(out, v->text ? v->text : "0N");
    break;
  case CPH_EDN_FLOAT:
    write_float(v, out);
    break;
  case CPH_EDN_KEYWORD:
    cph_buf_putc(out, ':');
    cph_buf_append(out, v->u.str.ptr, v->u.str.len);
    break;
  case CPH_EDN_SYMBOL:
    cph_buf_append(out, v->u.str.ptr, v->u.str.len);
    break;
  case CPH_EDN_LIST:
    write_items(v, "(", ")", out);
    break;
  case CPH_EDN_VECTOR:
    write_items(v, "[", "]", out);
    break;
  case CPH_EDN_MAP:
    write_items(v, "{", "}", out);
    break;
  case CPH_EDN_SET:
    write_items(v, "#{", "}", out);
    break;
  case CPH_EDN_TAGGED:
    cph_buf_putc(out, '#');
    cph_buf_puts(out, v->u.tagged.tag);
    cph_buf_putc(out, ' ');
    if (v->u.tagged.value)
      write_value(v->u.tagged.value, out);
    else
      cph_buf_puts(out, "nil");
    break;
  }
}

void cph_edn_write(const cph_edn *v, cph_buf *out) {
  if (v)
    write_value(v, out);
  else
    cph_buf_puts(out, "nil");
}

/* ---------------------------------------------------------------------------------------------
 * Reader: state, cursor, errors
 * ------------------------------------------------------------------------------------------- */

typedef enum frame_kind {
  FRAME_LIST,
  FRAME_VECTOR,
  FRAME_MAP,
  FRAME_SET,
  FRAME_TAGGED,
  FRAME_DISCARD
} frame_kind;

/* Map keys / set elements already in a frame, for duplicate detection: open addressing over
 * (hash, item index + 1; 0 = empty), at most half full. A new element costs O(1) expected
 * probes plus one cph_edn_equal per equal hash, and hashing is linear in its size, so a
 * collection costs O(total size) instead of O(n^2) deep comparisons. */
typedef struct seen_slot {
  uint64_t hash;
  size_t index1;
} seen_slot;

typedef struct seen_table {
  seen_slot *slots;
  size_t cap, used; /* cap is 0 or a power of two */
} seen_table;

typedef struct frame {
  frame_kind kind;
  cph_edn_pos pos; /* the opening token: '(' '[' '{', '#' of "#{", "#_" or "#tag" */
  cph_edn *items;  /* forms read so far; for a map keys and values alternate */
  size_t count, cap;
  char *tag; /* FRAME_TAGGED */
  seen_table seen;
} frame;

typedef struct parser {
  const unsigned char *s;
  size_t len, off;
  uint32_t line, col; /* of s[off] */
  frame *stack;
  size_t depth, stack_cap;
  unsigned max_depth;
  bool allow_duplicates;
  cph_edn result; /* the top-level value, once have_result */
  bool have_result;
  cph_edn_error *err;
} parser;

static int peek_at(const parser *p, size_t k) {
  return k < p->len - p->off ? p->s[p->off + k] : -1;
}

static int peek(const parser *p) { return peek_at(p, 0); }

/* Consumes one byte, keeping line and column: a column counts code points, so UTF-8
 * continuation bytes do not advance it. */
static void bump(parser *p) {
  unsigned char b = p->s[p->off++];
  if (b == '\n') {
    p->line++;
    p->col = 1;
  } else if ((b & 0xC0) != 0x80) {
    p->col++;
  }
}

static void bump_n(parser *p, size_t n) {
  while (n--)
    bump(p);
}

static cph_edn_pos here(const parser *p) { return (cph_edn_pos){p->line, p->col}; }

static bool is_space(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == ',';
}

/* Ends a symbol, keyword, number or tag. '#' and ':' do not (they are symbol constituents); '"',
 * ';' and '\' do, as in Clojure's reader, since none can appear inside a token. */
static bool is_delimiter(int c) {
  return c < 0 || is_space(c) || (c != 0 && strchr("()[]{}\";\\", c) != NULL);
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static int hex_value(int c) {
  if (is_digit(c))
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static void skip_token(parser *p) {
  while (!is_delimiter(peek(p)))
    bump(p);
}

static int fail_at(parser *p, cph_edn_pos at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail_at(parser *p, cph_edn_pos at, const char *fmt, ...) {
  if (p->err) {
    p->err->line = at.line;
    p->err->column = at.column;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err->message, sizeof p->err->message, fmt, ap);
    va_end(ap);
  }
  return CPH_EPARSE;
}

static int out_of_memory(parser *p) {
  fail_at(p, here(p), "out of memory");
  return CPH_ENOMEM;
}

/* Renders s[0..n) for an error message: at most ~40 bytes, control characters and invalid
 * UTF-8 as '?', "..." when cut. The result is always valid UTF-8 (messages end up in JSON). */
static const char *show(char *dst, size_t cap, const void *src, size_t n) {
  const unsigned char *s = src;
  size_t o = 0, limit = cap < 48 ? cap : 48;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = utf8_decode(s + i, n - i, &cp);
    if (o + (k ? k : 1) + 4 > limit) {
      memcpy(dst + o, "...", 3);
      o += 3;
      break;
    }
    if (k == 0 || cp < 0x20 || cp == 0x7F) {
      dst[o++] = '?';
      i += k ? k : 1;
    } else {
      memcpy(dst + o, s + i, k);
      o += k;
      i += k;
    }
  }
  dst[o] = '\0';
  return dst;
}

/* ---------------------------------------------------------------------------------------------
 * Reader: atoms
 * ------------------------------------------------------------------------------------------- */

typedef struct bytes {
  unsigned char *p;
  size_t len, cap;
} bytes;

static bool bytes_put(bytes *b, const void *src, size_t n) {
  unsigned char *np = grow_array(b->p, &b->cap, b->len + n + 1, 1);
  if (!np)
    return false;
  b->p = np;
  memcpy(b->p + b->len, src, n);
  b->len += n;
  b->p[b->len] = '\0';
  return true;
}

/* The value of four hex digits at s[0..n); -1 if there are not four. */
static long hex4(const unsigned char *s, size_t n) {
  long v = 0;
  for (size_t i = 0; i < 4; i++) {
    int h = i < n ? hex_value(s[i]) : -1;
    if (h < 0)
      return -1;
    v = v << 4 | h;
  }
  return v;
}

/* XXXX of a \uXXXX escape k bytes ahead of the cursor; -1 if not four hex digits. */
static long hex4_at(const parser *p, size_t k) {
  size_t left = p->len - p->off;
  return k <= left ? hex4(p->s + p->off + k, left - k) : -1;
}

/* The \u escape at the cursor (on the backslash) inside a string: a BMP character or a
 * surrogate pair written as two escapes, which together make one 4-byte UTF-8 sequence. */
static int read_u_escape(parser *p, bytes *b) {
  cph_edn_pos at = here(p);
  long hi = hex4_at(p, 2);
  if (hi < 0)
    return fail_at(p, at, "bad escape \\u in string: expected 4 hex digits");
  uint32_t cp = (uint32_t)hi;
  size_t used = 6;
  if (hi >= 0xDC00 && hi <= 0xDFFF)
    return fail_at(p, at, "unpaired surrogate \\u%04lX in string", hi);
  if (hi >= 0xD800 && hi <= 0xDBFF) {
    long lo = peek_at(p, 6) == '\\' && peek_at(p, 7) == 'u' ? hex4_at(p, 8) : -1;
    if (lo < 0xDC00 || lo > 0xDFFF)
      return fail_at(p, at, "unpaired surrogate \\u%04lX in string", hi);
    cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
    used = 12;
  }
  unsigned char u[4];
  if (!bytes_put(b, u, utf8_encode(cp, u)))
    return out_of_memory(p);
  bump_n(p, used);
  return CPH_OK;
}

/* The escape at the cursor (on the backslash) inside the string that opened at start. */
static int read_escape(parser *p, cph_edn_pos start, bytes *b) {
  cph_edn_pos at = here(p);
  int e = peek_at(p, 1);
  char c;
  switch (e) {
  case -1:
    return fail_at(p, start, "unterminated string");
  case 'u':
    return read_u_escape(p, b);
  case 't':
    c = '\t';
    break;
  case 'r':
    c = '\r';
    break;
  case 'n':
    c = '\n';
    break;
  case 'b':
    c = '\b';
    break;
  case 'f':
    c = '\f';
    break;
  case '\\':
  case '"':
  case '/':
    c = (char)e;
    break;
  default:
    if (e > 0x20 && e < 0x7F)
      return fail_at(p, at, "bad escape \\%c in string", e);
    return fail_at(p, at, "bad escape in string");
  }
  if (!bytes_put(b, &c, 1))
    return out_of_memory(p);
  bump_n(p, 2);
  return CPH_OK;
}

/* Raw newlines are allowed (strings may span lines); a raw NUL is not, so that a NUL in a
 * decoded string always comes from \u0000. */
static int read_string(parser *p, cph_edn *v) {
  cph_edn_pos start = here(p);
  bytes b = {NULL, 0, 0};
  int rc = CPH_OK;
  bump(p);
  for (;;) {
    int c = peek(p);
    if (c < 0) {
      rc = fail_at(p, start, "unterminated string");
      goto fail;
    }
    if (c == '"')
      break;
    if (c == '\\') {
      if ((rc = read_escape(p, start, &b)))
        goto fail;
      continue;
    }
    if (c == 0) {
      rc = fail_at(p, here(p), "NUL byte in string (write \\u0000)");
      goto fail;
    }
    uint32_t cp;
    size_t k = utf8_decode(p->s + p->off, p->len - p->off, &cp);
    if (k == 0) {
      rc = fail_at(p, here(p), "invalid UTF-8 in string");
      goto fail;
    }
    if (!bytes_put(&b, p->s + p->off, k)) {
      rc = out_of_memory(p);
      goto fail;
    }
    bump_n(p, k);
  }
  if (!b.p && !bytes_put(&b, "", 0)) { /* "" still gets a NUL-terminated buffer */
    rc = out_of_memory(p);
    goto fail;
  }
  bump(p);
  v->type = CPH_EDN_STRING;
  v->u.str.ptr = (char *)b.p;
  v->u.str.len = b.len;
  return CPH_OK;
fail:
  free(b.p);
  return rc;
}

static const struct {
  const char *name;
  uint32_t cp;
} char_names[] = {{"newline", '\n'}, {"return", '\r'},   {"space", ' '},
                  {"tab", '\t'},     {"formfeed", '\f'}, {"backspace", '\b'}};

/* \c, \newline ... or \uXXXX. The character right after the backslash is taken whatever it is
 * (so \( and \" work); a longer token must be a name or uXXXX. */
static int read_char(parser *p, cph_edn *v) {
  cph_edn_pos at = here(p);
  char shown[64];
  bump(p);
  int c = peek(p);
  if (c < 0 || is_space(c))
    return fail_at(p, at, "backslash must be followed by a character");
  const unsigned char *tok = p->s + p->off;
  uint32_t cp;
  size_t k = utf8_decode(tok, p->len - p->off, &cp);
  if (k == 0)
    return fail_at(p, here(p), "invalid UTF-8");
  bump_n(p, k);
  skip_token(p);
  size_t n = (size_t)(p->s + p->off - tok);
  if (n > k) {
    size_t i = 0, names = sizeof char_names / sizeof char_names[0];
    while (i < names && (strlen(char_names[i].name) != n || memcmp(char_names[i].name, tok, n)))
      i++;
    long u = n == 5 && tok[0] == 'u' ? hex4(tok + 1, 4) : -1;
    if (i < names)
      cp = char_names[i].cp;
    else if (u >= 0xD800 && u <= 0xDFFF)
      return fail_at(p, at, "invalid character \\u%04lX: a lone surrogate", u);
    else if (u >= 0)
      cp = (uint32_t)u;
    else
      return fail_at(p, at, "invalid character \\%s", show(shown, sizeof shown, tok, n));
  }
  v->type = CPH_EDN_CHAR;
  v->u.codepoint = cp;
  return CPH_OK;
}

/* A symbol's first character (EDN spec, "symbols"); '/' alone is handled by the caller. */
static bool is_symbol_start(int c) {
  return is_alpha(c) || (c != 0 && strchr(".*+!-_?$%&=<>", c) != NULL);
}

static bool is_symbol_char(int c) {
  return is_symbol_start(c) || is_digit(c) || c == ':' || c == '#' || c == '\'';
}

/* One part of a symbol: the prefix or the name around '/', or the whole symbol. If it starts
 * with '-', '+' or '.', the next character must not be a digit (that would be a number). */
static bool valid_symbol_part(const unsigned char *s, size_t n) {
  if (n == 0 || !is_symbol_start(s[0]))
    return false;
  if (n > 1 && strchr("+-.", s[0]) && is_digit(s[1]))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!is_symbol_char(s[i]))
      return false;
  return true;
}

/* A symbol, or with keyword the part after ':'. "/" alone is a symbol but ":/" no keyword;
 * otherwise '/' appears at most once, between a non-empty prefix and name. */
static bool valid_symbol(const unsigned char *s, size_t n, bool keyword) {
  if (n == 1 && s[0] == '/')
    return !keyword;
  const unsigned char *slash = memchr(s, '/', n);
  if (!slash)
    return valid_symbol_part(s, n);
  size_t prefix = (size_t)(slash - s);
  return valid_symbol_part(s, prefix) && valid_symbol_part(slash + 1, n - prefix - 1);
}

static int set_name(parser *p, cph_edn *v, cph_edn_type type, const unsigned char *s, size_t n) {
  v->u.str.ptr = edn_strndup(s, n);
  if (!v->u.str.ptr)
    return out_of_memory(p);
  v->type = type;
  v->u.str.len = n;
  return CPH_OK;
}

static int read_keyword(parser *p, cph_edn *v) {
  cph_edn_pos at = here(p);
  char shown[64];
  size_t start = p->off;
  bump(p);
  skip_token(p);
  const unsigned char *s = p->s + start;
  size_t n = p->off - start;
  if (!valid_symbol(s + 1, n - 1, true))
    return fail_at(p, at, "invalid keyword %s", show(shown, sizeof shown, s, n));
  return set_name(p, v, CPH_EDN_KEYWORD, s + 1, n - 1);
}

/* Matches the integer and floating-point grammars of the spec: [+-] (0 | [1-9][0-9]*), then
 * either an optional N (integer) or any of .digits, [eE][+-]digits and M (float). Sets
 * *is_float; false if the token is neither. */
static bool scan_number(const unsigned char *s, size_t n, bool *is_float) {
  size_t i = 0;
  if (s[i] == '+' || s[i] == '-')
    i++;
  if (i < n && s[i] == '0') {
    i++;
  } else if (i < n && is_digit(s[i])) {
    while (i < n && is_digit(s[i]))
      i++;
  } else {
    return false;
  }
  *is_float = false;
  if (i + 1 == n && s[i] == 'N')
    return true;
  if (i < n && s[i] == '.') {
    size_t d = ++i;
    while (i < n && is_digit(s[i]))
      i++;
    if (i == d)
      return false;
    *is_float = true;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      i++;
    size_t d = i;
    while (i < n && is_digit(s[i]))
      i++;
    if (i == d)
      return false;
    *is_float = true;
  }
  if (i + 1 == n && s[i] == 'M') {
    i++;
    *is_float = true;
  }
  return i == n;
}

/* An integer token already checked by scan_number: INT if it fits int64_t, else BIGINT
 * (not an error; the text keeps the value). */
static void convert_integer(const unsigned char *s, size_t n, cph_edn *v) {
  bool neg = s[0] == '-';
  size_t i = s[0] == '+' || s[0] == '-';
  uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, mag = 0;
  v->type = CPH_EDN_INT;
  for (; i < n && is_digit(s[i]); i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (mag > (limit - d) / 10) {
      v->type = CPH_EDN_BIGINT;
      return;
    }
    mag = mag * 10 + d;
  }
  v->u.integer = neg ? (int64_t)(0 - mag) : (int64_t)mag;
}

static int read_number(parser *p, cph_edn_pos at, const unsigned char *s, size_t n, cph_edn *v) {
  char shown[64];
  bool is_float;
  if (!scan_number(s, n, &is_float))
    return fail_at(p, at, "invalid number %s", show(shown, sizeof shown, s, n));
  v->text = edn_strndup(s, n);
  if (!v->text)
    return out_of_memory(p);
  if (!is_float) {
    convert_integer(s, n, v);
    return CPH_OK;
  }
  v->type = CPH_EDN_FLOAT;
  if (s[n - 1] == 'M')
    v->text[n - 1] = '\0'; /* strtod must not see the suffix; restored below */
  v->u.floating = c_strtod(v->text);
  if (s[n - 1] == 'M')
    v->text[n - 1] = 'M';
  if (isinf(v->u.floating))
    return fail_at(p, at, "float out of range %s", show(shown, sizeof shown, s, n));
  return CPH_OK;
}

/* nil, true, false, a number or a symbol. */
static int read_word(parser *p, cph_edn *v) {
  cph_edn_pos at = here(p);
  char shown[64];
  size_t start = p->off;
  skip_token(p);
  const unsigned char *s = p->s + start;
  size_t n = p->off - start;
  if (is_digit(s[0]) || (n > 1 && (s[0] == '+' || s[0] == '-') && is_digit(s[1])))
    return read_number(p, at, s, n, v);
  if (n == 3 && memcmp(s, "nil", 3) == 0) {
    v->type = CPH_EDN_NIL;
    return CPH_OK;
  }
  if ((n == 4 && memcmp(s, "true", 4) == 0) || (n == 5 && memcmp(s, "false", 5) == 0)) {
    v->type = CPH_EDN_BOOL;
    v->u.boolean = n == 4;
    return CPH_OK;
  }
  if (valid_symbol(s, n, false))
    return set_name(p, v, CPH_EDN_SYMBOL, s, n);
  if (s[0] == '/' || is_symbol_start(s[0]))
    return fail_at(p, at, "invalid symbol %s", show(shown, sizeof shown, s, n));
  uint32_t cp;
  size_t k = utf8_decode(s, n, &cp);
  if (k == 0)
    return fail_at(p, at, "invalid UTF-8");
  if (cp < 0x20 || cp == 0x7F)
    return fail_at(p, at, "unexpected control character 0x%02X", (unsigned)cp);
  return fail_at(p, at, "unexpected character '%s'", show(shown, sizeof shown, s, k));
}

/* "##Inf", "##-Inf", "##NaN"; the cursor is on the first '#'. */
static int read_symbolic(parser *p, cph_edn *v) {
  static const struct {
    const char *name;
    double value;
  } known[] = {{"Inf", INFINITY}, {"-Inf", -INFINITY}, {"NaN", NAN}};
  cph_edn_pos at = here(p);
  char shown[64];
  size_t start = p->off;
  bump_n(p, 2);
  skip_token(p);
  const unsigned char *s = p->s + start;
  size_t n = p->off - start;
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    if (strlen(known[i].name) == n - 2 && memcmp(known[i].name, s + 2, n - 2) == 0) {
      v->text = edn_strndup(s, n);
      if (!v->text)
        return out_of_memory(p);
      v->type = CPH_EDN_FLOAT;
      v->u.floating = known[i].value;
      return CPH_OK;
    }
  }
  return fail_at(p, at, "invalid symbolic value %s", show(shown, sizeof shown, s, n));
}

/* ---------------------------------------------------------------------------------------------
 * Reader: the stack of open forms
 * ------------------------------------------------------------------------------------------- */

static const char *kind_name(frame_kind k) {
  switch (k) {
  case FRAME_LIST:
    return "list";
  case FRAME_VECTOR:
    return "vector";
  case FRAME_MAP:
    return "map";
  case FRAME_SET:
    return "set";
  case FRAME_TAGGED:
    return "tagged literal";
  case FRAME_DISCARD:
    return "discard";
  }
  return "form";
}

static int closer_of(frame_kind k) {
  return k == FRAME_LIST ? ')' : k == FRAME_VECTOR ? ']' : '}';
}

/* Frees what the frame still owns (after an error, or its leftovers once closed). */
static void frame_release(frame *f) {
  for (size_t i = 0; i < f->count; i++)
    free_contents(&f->items[i]);
  free(f->items);
  free(f->tag);
  free(f->seen.slots);
}

static frame *top(parser *p) { return &p->stack[p->depth - 1]; }

static void pop(parser *p) { frame_release(&p->stack[--p->depth]); }

/* Opens a frame for the form starting at `at`, after its opening token (`skip` bytes). tag,
 * if any, becomes the frame's on success and is freed on failure. */
static int push(parser *p, frame_kind kind, cph_edn_pos at, size_t skip, char *tag) {
  if (p->depth >= p->max_depth) {
    free(tag);
    return fail_at(p, at, "nesting deeper than %u", p->max_depth);
  }
  frame *st = grow_array(p->stack, &p->stack_cap, p->depth + 1, sizeof *p->stack);
  if (!st) {
    free(tag);
    return out_of_memory(p);
  }
  p->stack = st;
  p->stack[p->depth++] = (frame){.kind = kind, .pos = at, .tag = tag};
  bump_n(p, skip);
  return CPH_OK;
}

static bool seen_grow(seen_table *t) {
  size_t ncap = t->cap ? t->cap * 2 : 16;
  if (ncap > SIZE_MAX / sizeof *t->slots)
    return false;
  seen_slot *slots = edn_malloc(ncap * sizeof *slots);
  if (!slots)
    return false;
  memset(slots, 0, ncap * sizeof *slots);
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->slots[i].index1)
      continue;
    size_t j = t->slots[i].hash & (ncap - 1);
    while (slots[j].index1)
      j = (j + 1) & (ncap - 1);
    slots[j] = t->slots[i];
  }
  free(t->slots);
  t->slots = slots;
  t->cap = ncap;
  return true;
}

/* Records f->items[index] as a key/element; fails if an equal one was recorded already. */
static int check_duplicate(parser *p, frame *f, size_t index) {
  seen_table *t = &f->seen;
  if ((t->used + 1) * 2 > t->cap && !seen_grow(t))
    return out_of_memory(p);
  const cph_edn *v = &f->items[index];
  uint64_t h = edn_hash(v);
  size_t j = h & (t->cap - 1);
  for (; t->slots[j].index1; j = (j + 1) & (t->cap - 1)) {
    if (t->slots[j].hash != h || !cph_edn_equal(&f->items[t->slots[j].index1 - 1], v))
      continue;
    char shown[96];
    cph_buf text = CPH_BUF_INIT;
    cph_edn_write(v, &text);
    show(shown, sizeof shown, text.data ? text.data : "", text.data ? text.len : 0);
    cph_buf_free(&text);
    return fail_at(p, v->pos, "duplicate %s %s", f->kind == FRAME_MAP ? "map key" : "set element",
                   shown);
  }
  t->slots[j] = (seen_slot){h, index + 1};
  t->used++;
  return CPH_OK;
}

/* Appends v (taking ownership) to the collection frame f. */
static int append(parser *p, frame *f, cph_edn *v) {
  cph_edn *items = grow_array(f->items, &f->cap, f->count + 1, sizeof *f->items);
  if (!items) {
    free_contents(v);
    return out_of_memory(p);
  }
  f->items = items;
  f->items[f->count++] = *v;
  bool keyed = f->kind == FRAME_SET || (f->kind == FRAME_MAP && f->count % 2 == 1);
  if (keyed && !p->allow_duplicates)
    return check_duplicate(p, f, f->count - 1);
  return CPH_OK;
}

/* Hands a finished value (ownership included) to the innermost open form: a discard drops it,
 * a tag wraps it and passes the tagged value on outward, a collection keeps it. With nothing
 * open it is the document's value. */
static int deliver(parser *p, cph_edn *v) {
  while (p->depth > 0) {
    frame *f = top(p);
    if (f->kind == FRAME_DISCARD) {
      free_contents(v);
      pop(p);
      return CPH_OK;
    }
    if (f->kind != FRAME_TAGGED)
      return append(p, f, v);
    cph_edn *inner = edn_malloc(sizeof *inner);
    if (!inner) {
      free_contents(v);
      return out_of_memory(p);
    }
    *inner = *v;
    *v = (cph_edn){.type = CPH_EDN_TAGGED, .pos = f->pos};
    v->u.tagged.tag = f->tag;
    v->u.tagged.value = inner;
    f->tag = NULL;
    pop(p);
  }
  p->result = *v;
  p->have_result = true;
  return CPH_OK;
}

/* A closing bracket `c` at `at`. */
static int close_form(parser *p, int c, cph_edn_pos at) {
  if (p->depth == 0)
    return fail_at(p, at, "unexpected '%c'", c);
  frame *f = top(p);
  if (f->kind == FRAME_DISCARD)
    return fail_at(p, f->pos, "discard with nothing to discard");
  if (f->kind == FRAME_TAGGED)
    return fail_at(p, f->pos, "tagged literal #%.60s has no value", f->tag);
  if (c != closer_of(f->kind))
    return fail_at(p, at, "unexpected '%c', expected '%c' to close the %s at %" PRIu32 ":%" PRIu32,
                   c, closer_of(f->kind), kind_name(f->kind), f->pos.line, f->pos.column);
  if (f->kind == FRAME_MAP && f->count % 2 != 0)
    return fail_at(p, f->pos, "map literal must contain an even number of forms");
  static const cph_edn_type types[] = {
      [FRAME_LIST] = CPH_EDN_LIST, [FRAME_VECTOR] = CPH_EDN_VECTOR,
      [FRAME_MAP] = CPH_EDN_MAP, [FRAME_SET] = CPH_EDN_SET};
  cph_edn v = {.type = types[f->kind], .pos = f->pos};
  v.u.coll.items = f->items;
  v.u.coll.count = f->kind == FRAME_MAP ? f->count / 2 : f->count;
  f->items = NULL;
  f->count = 0;
  pop(p);
  bump(p);
  return deliver(p, &v);
}

/* "#{", "#_", "##Inf" or "#tag"; the cursor is on '#'. */
static int read_dispatch(parser *p, cph_edn_pos at) {
  char shown[64];
  int d = peek_at(p, 1);
  if (d == '{')
    return push(p, FRAME_SET, at, 2, NULL);
  if (d == '_')
    return push(p, FRAME_DISCARD, at, 2, NULL);
  if (d == '#') {
    cph_edn v = {.pos = at};
    int rc = read_symbolic(p, &v);
    if (rc) {
      free_contents(&v);
      return rc;
    }
    return deliver(p, &v);
  }
  if (!is_alpha(d))
    return fail_at(p, at, "'#' must be followed by a tag, '{', '_' or '#'");
  size_t start = p->off + 1;
  size_t n = 0;
  while (!is_delimiter(peek_at(p, 1 + n)))
    n++;
  if (!valid_symbol(p->s + start, n, false))
    return fail_at(p, at, "invalid tag #%s", show(shown, sizeof shown, p->s + start, n));
  char *tag = edn_strndup(p->s + start, n);
  if (!tag)
    return out_of_memory(p);
  return push(p, FRAME_TAGGED, at, 1 + n, tag);
}

static int read_atom(parser *p, int c, cph_edn_pos at) {
  cph_edn v = {.pos = at};
  int rc;
  if (c == '"')
    rc = read_string(p, &v);
  else if (c == '\\')
    rc = read_char(p, &v);
  else if (c == ':')
    rc = read_keyword(p, &v);
  else
    rc = read_word(p, &v);
  if (rc) {
    free_contents(&v);
    return rc;
  }
  return deliver(p, &v);
}

/* Whitespace, commas and ; comments (to the end of the line; their bytes are not checked). */
static void skip_space(parser *p) {
  for (;;) {
    int c = peek(p);
    if (is_space(c)) {
      bump(p);
    } else if (c == ';') {
      while (peek(p) >= 0 && peek(p) != '\n')
        bump(p);
    } else {
      return;
    }
  }
}

/* End of input: fine only with a value read and nothing left open. */
static int at_end(parser *p) {
  if (p->depth > 0) {
    frame *f = top(p);
    if (f->kind == FRAME_DISCARD)
      return fail_at(p, f->pos, "discard with nothing to discard");
    if (f->kind == FRAME_TAGGED)
      return fail_at(p, f->pos, "tagged literal #%.60s has no value", f->tag);
    return fail_at(p, f->pos, "unterminated %s", kind_name(f->kind));
  }
  if (!p->have_result)
    return fail_at(p, here(p), "no value");
  return CPH_OK;
}

static int parse_document(parser *p) {
  for (;;) {
    skip_space(p);
    int c = peek(p);
    cph_edn_pos at = here(p);
    int rc;
    if (c < 0)
      return at_end(p);
    if (c == ')' || c == ']' || c == '}')
      rc = close_form(p, c, at);
    else if (p->depth == 0 && p->have_result && !(c == '#' && peek_at(p, 1) == '_'))
      rc = fail_at(p, at, "unexpected data after the value");
    else if (c == '(')
      rc = push(p, FRAME_LIST, at, 1, NULL);
    else if (c == '[')
      rc = push(p, FRAME_VECTOR, at, 1, NULL);
    else if (c == '{')
      rc = push(p, FRAME_MAP, at, 1, NULL);
    else if (c == '#')
      rc = read_dispatch(p, at);
    else
      rc = read_atom(p, c, at);
    if (rc)
      return rc;
  }
}

int cph_edn_parse(const char *text, size_t len, const cph_edn_options *opts, cph_edn **out,
                  cph_edn_error *err) {
  if (err)
    *err = (cph_edn_error){0};
  if (!out)
    return CPH_EINVAL;
  *out = NULL;
  if (!text && len)
    return CPH_EINVAL;
  parser p = {
      .s = (const unsigned char *)(text ? text : ""),
      .len = len,
      .line = 1,
      .col = 1,
      .max_depth = !opts || !opts->max_depth            ? CPH_EDN_DEFAULT_MAX_DEPTH
                   : opts->max_depth > CPH_EDN_MAX_DEPTH_LIMIT ? CPH_EDN_MAX_DEPTH_LIMIT
                                                             : opts->max_depth,
      .allow_duplicates = opts && opts->allow_duplicate_keys,
      .err = err,
  };
  int rc = parse_document(&p);
  if (rc == CPH_OK) {
    cph_edn *node = edn_malloc(sizeof *node);
    if (node) {
      *node = p.result;
      p.have_result = false;
      *out = node;
    } else {
      rc = out_of_memory(&p);
    }
  }
  while (p.depth > 0)
    pop(&p);
  free(p.stack);
  if (p.have_result)
    free_contents(&p.result);
  return rc;
}
