/* EDN values: allocation, free, equality and hashing (edn_internal.h says who does what).
 *
 * cph_edn_free, cph_edn_equal and cph_edn__hash recurse, but only as deep as the value, which
 * the reader bounds by max_depth. */
#include "policy/edn_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Allocation
 * ------------------------------------------------------------------------------------------- */

/* Test seam, deliberately in no header: when > 0, the allocation that brings it to 0 fails.
 * tests/unit/test_edn.c walks it over every allocation of a parse to prove that each
 * CPH_ENOMEM path frees what it holds. Thread-local so concurrent parsers are unaffected. */
_Thread_local long cph_edn__fail_alloc_countdown;

static bool alloc_should_fail(void) {
  return cph_edn__fail_alloc_countdown > 0 && --cph_edn__fail_alloc_countdown == 0;
}

void *cph_edn__malloc(size_t n) { return alloc_should_fail() ? NULL : malloc(n); }

static void *edn_realloc(void *p, size_t n) { return alloc_should_fail() ? NULL : realloc(p, n); }

char *cph_edn__strndup(const void *s, size_t n) {
  char *d = cph_edn__malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

void *cph_edn__grow(void *ptr, size_t *cap, size_t need, size_t elem) {
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

void cph_edn__free_contents(cph_edn *v) {
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
      cph_edn__free_contents(&v->u.coll.items[i]);
    free(v->u.coll.items);
    break;
  }
  case CPH_EDN_TAGGED:
    free(v->u.tagged.tag);
    if (v->u.tagged.value) {
      cph_edn__free_contents(v->u.tagged.value);
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
  cph_edn__free_contents(v);
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

uint64_t cph_edn__hash(const cph_edn *v) {
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
      h = mix64(h * 31 + cph_edn__hash(&v->u.coll.items[i]));
    return h;
  }
  case CPH_EDN_MAP:
  case CPH_EDN_SET: {
    /* A sum, so order does not matter. */
    bool map = v->type == CPH_EDN_MAP;
    uint64_t sum = map ? 11 : 12;
    for (size_t i = 0; i < v->u.coll.count; i++) {
      if (map)
        sum += mix64(cph_edn__hash(&v->u.coll.items[2 * i]) * 31 +
                     cph_edn__hash(&v->u.coll.items[2 * i + 1]));
      else
        sum += mix64(cph_edn__hash(&v->u.coll.items[i]));
    }
    return mix64(sum);
  }
  case CPH_EDN_TAGGED: {
    uint64_t h = hash_bytes(13, v->u.tagged.tag, strlen(v->u.tagged.tag));
    return mix64(h ^ (v->u.tagged.value ? cph_edn__hash(v->u.tagged.value) : 0));
  }
  }
  return 0;
}
