/* Dedupe's pure text functions (DESIGN §5): normalising a body, its simhash, the Hamming
 * distance and the identifier signature. No state, no store. Contract in dedupe.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dedupe_internal.h"

/* ---------------------------------------------------------------- pure helpers */

static bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

char *dedupe_normalise(const char *body, size_t *len) {
  size_t n = strlen(body);
  char *out = malloc(n + 1);
  if (!out)
    return NULL;
  size_t o = 0;
  bool space = false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)body[i];
    if (is_space(c)) {
      space = o > 0; /* leading whitespace is dropped, trailing never flushed */
      continue;
    }
    if (space)
      out[o++] = ' ';
    space = false;
    out[o++] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
  }
  out[o] = '\0';
  *len = o;
  return out;
}

/* splitmix64's finaliser: FNV's low bits are weak, and simhash needs every bit independent. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* SPREAD[x]: byte j is bit j of x. Adding SPREAD[one byte of a hash] to a word of 8 byte-wide
 * counters counts that byte's 8 bits at once. */
#define SPREAD_(x)                                                                              \
  ((uint64_t)((x) & 1) | (uint64_t)(((x) >> 1) & 1) << 8 | (uint64_t)(((x) >> 2) & 1) << 16 |  \
   (uint64_t)(((x) >> 3) & 1) << 24 | (uint64_t)(((x) >> 4) & 1) << 32 |                       \
   (uint64_t)(((x) >> 5) & 1) << 40 | (uint64_t)(((x) >> 6) & 1) << 48 |                       \
   (uint64_t)(((x) >> 7) & 1) << 56)
#define SPREAD4_(n) SPREAD_(n), SPREAD_(n + 1), SPREAD_(n + 2), SPREAD_(n + 3)
#define SPREAD16_(n) SPREAD4_(n), SPREAD4_(n + 4), SPREAD4_(n + 8), SPREAD4_(n + 12)
#define SPREAD64_(n) SPREAD16_(n), SPREAD16_(n + 16), SPREAD16_(n + 32), SPREAD16_(n + 48)
static const uint64_t SPREAD[256] = {SPREAD64_(0), SPREAD64_(64), SPREAD64_(128),
                                     SPREAD64_(192)};

/* The votes of Charikar's simhash, kept as counts of 1 bits per hash bit: +1/-1 per shingle
 * on bit b is positive exactly when ones[b] * 2 > shingles. Byte-wide counters in `lanes`
 * (bit 8i+j of the hashes in byte j of lanes[i]) take up to 255 shingles before they are
 * flushed into `ones` (zeroed at the first flush: a body of fewer shingles never touches
 * it): 8 additions per shingle, not 64. */
typedef struct sim_votes {
  uint64_t lanes[8];
  uint32_t ones[64];
  uint32_t in_lanes, shingles;
  bool flushed;
} sim_votes;

static void votes_flush(sim_votes *sv) {
  if (!sv->flushed)
    memset(sv->ones, 0, sizeof sv->ones);
  sv->flushed = true;
  for (int i = 0; i < 8; i++) {
    for (int j = 0; j < 8; j++)
      sv->ones[8 * i + j] += (uint32_t)(sv->lanes[i] >> (8 * j)) & 0xFF;
    sv->lanes[i] = 0;
  }
  sv->in_lanes = 0;
}

static void simhash_add(sim_votes *sv, const char *p, size_t n) {
  uint64_t h = mix64(dd_fnv1a64(p, n));
  for (int i = 0; i < 8; i++)
    sv->lanes[i] += SPREAD[(h >> (8 * i)) & 0xFF];
  sv->shingles++;
  if (++sv->in_lanes == 255)
    votes_flush(sv);
}

/* The hash the votes give: bit b set when more than half the shingles voted for it. */
static uint64_t votes_hash(sim_votes *sv) {
  uint64_t h = 0;
  if (!sv->flushed) {
    /* Every count is in a byte of lanes and shingles < 255: a byte c votes for its bit when
     * c >= t = shingles / 2 + 1, that is when c + (128 - t) has its top bit set (no carry:
     * c <= shingles keeps the sum under 256). The eight top bits of a lane, gathered in
     * order by one multiplication, are its eight bits of the hash. */
    uint64_t add = (uint64_t)(128 - (sv->shingles / 2 + 1)) * 0x0101010101010101ull;
    for (int i = 0; i < 8; i++) {
      uint64_t top = ((sv->lanes[i] + add) >> 7) & 0x0101010101010101ull;
      h |= ((top * 0x0102040810204080ull) >> 56) << (8 * i);
    }
    return h;
  }
  votes_flush(sv);
  for (int b = 0; b < 64; b++)
    if ((uint64_t)sv->ones[b] * 2 > sv->shingles)
      h |= 1ull << b;
  return h;
}

/* Charikar's simhash: each shingle votes +1/-1 on every bit by its hash; a bit is set when
 * the votes are positive. Words in a normalised text are separated by exactly one space. */
uint64_t dedupe_simhash(const char *s, size_t len, int k) {
  if (!len)
    return 0;
  if (k < 1)
    k = 1;
  if (k > 64)
    k = 64;
  sim_votes v;
  memset(v.lanes, 0, sizeof v.lanes);
  v.in_lanes = v.shingles = 0;
  v.flushed = false;
  size_t starts[64]; /* the last k word starts, circular: starts[at] is the oldest once full */
  size_t nw = 0, at = 0;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    while (i < len && s[i] != ' ')
      i++;
    if (k == 1) {
      simhash_add(&v, s + start, i - start);
    } else {
      starts[at] = start;
      at = at + 1 == (size_t)k ? 0 : at + 1;
      if (nw + 1 >= (size_t)k)
        simhash_add(&v, s + starts[at], i - starts[at]);
    }
    nw++;
    i++; /* the space */
  }
  if (nw < (size_t)k)
    simhash_add(&v, s, len); /* fewer words than a shingle: the whole text is one */
  return votes_hash(&v);
}

/* SWAR popcount: without -mpopcnt the builtin is a libgcc call, and the ring scan does up to
 * DEDUPE_RING_MAX of these per event. */
int dedupe_hamming(uint64_t a, uint64_t b) {
  uint64_t x = a ^ b;
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (int)((x * 0x0101010101010101ull) >> 56);
}

static bool is_alnum(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

/* A word is identifier-like when, trimmed of leading and trailing punctuation, it holds a
 * digit or one of _ . / : @ # - between its characters ("build-41", "db_main", "10.0.0.5",
 * "host:beta", "#4411"). Its signature hashes those words in order, so two texts that differ
 * in a number or an identifier never share one. */
uint64_t dedupe_idsig(const char *norm, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  bool any = false;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    while (i < len && norm[i] != ' ')
      i++;
    size_t a = start, b = i;
    i++;
    while (a < b && !is_alnum((unsigned char)norm[a]) && norm[a] != '#')
      a++;
    while (b > a && !is_alnum((unsigned char)norm[b - 1]))
      b--;
    bool ident = false;
    for (size_t j = a; j < b && !ident; j++) {
      unsigned char c = (unsigned char)norm[j];
      ident = (c >= '0' && c <= '9') ||
              ((c == '_' || c == '.' || c == '/' || c == ':' || c == '@' || c == '#' ||
                c == '-') &&
               j + 1 < b);
    }
    if (!ident)
      continue;
    any = true;
    for (size_t j = a; j < b; j++) {
      h ^= (uint8_t)norm[j];
      h *= 0x100000001b3ull;
    }
    h ^= 0xff; /* word separator */
    h *= 0x100000001b3ull;
  }
  return any ? h : 0;
}
