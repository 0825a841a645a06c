/* dedupe_simhash (core/dedupe_text.c) gives the hashes it always gave: events store their
 * simhash and the rings are rebuilt from them, so a faster simhash must agree bit for bit.
 * The reference below is the simhash as it was (one vote counter per bit, every shingle
 * through a circular list of word starts); random normalised texts of 1 to 700 words, with
 * shingles of 1 to 16 words, are hashed by both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dedupe.h"
#include "tests/support/prop.h"

static uint64_t ref_fnv1a64(const char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t ref_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

static uint64_t ref_simhash(const char *s, size_t len, int k) {
  if (!len)
    return 0;
  if (k < 1)
    k = 1;
  if (k > 64)
    k = 64;
  int64_t votes[64] = {0};
  size_t starts[64];
  size_t nw = 0;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    while (i < len && s[i] != ' ')
      i++;
    starts[nw % (size_t)k] = start;
    nw++;
    if (nw >= (size_t)k) {
      size_t from = starts[(nw - (size_t)k) % (size_t)k];
      uint64_t h = ref_mix64(ref_fnv1a64(s + from, i - from));
      for (int b = 0; b < 64; b++)
        votes[b] += (h >> b) & 1 ? 1 : -1;
    }
    i++;
  }
  if (nw < (size_t)k) {
    uint64_t h = ref_mix64(ref_fnv1a64(s, len));
    for (int b = 0; b < 64; b++)
      votes[b] += (h >> b) & 1 ? 1 : -1;
  }
  uint64_t h = 0;
  for (int b = 0; b < 64; b++)
    if (votes[b] > 0)
      h |= 1ull << b;
  return h;
}

static void test_simhash_agrees_with_the_reference_on_random_texts(void **state) {
  (void)state;
  static const char *const words[] = {"restart", "host", "alpha", "beta", "disk", "full",
                                      "on",      "db-7", "42",    "the",  "a",    "ok"};
  uint64_t seed0;
  long cases;
  cph_property_run(5150, 3000, &seed0, &cases);
  static char text[16384];
  for (long c = 0; c < cases; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rng r = {seed};
    /* mostly short bodies; some long enough to flush the byte-wide counters (255 shingles) */
    uint32_t n = below(&r, 4) ? 1 + below(&r, 30) : 1 + below(&r, 700);
    size_t len = 0;
    for (uint32_t i = 0; i < n; i++) {
      const char *w = words[below(&r, sizeof words / sizeof words[0])];
      len += (size_t)snprintf(text + len, sizeof text - len, "%s%s%u", i ? " " : "", w,
                              below(&r, 3) ? below(&r, 1000) : 0);
    }
    int k = 1 + (int)below(&r, 16);
    uint64_t want = ref_simhash(text, len, k), got = dedupe_simhash(text, len, k);
    if (got != want)
      fail_msg("seed %llu: %u words, shingles of %d: simhash %016llx, the reference %016llx",
               (unsigned long long)seed, n, k, (unsigned long long)got, (unsigned long long)want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_simhash_agrees_with_the_reference_on_random_texts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
