/* What the seeded property tests share: one deterministic random stream (splitmix64) and
 * the run's seed and case count (CPH_PROPERTY_SEED, CPH_PROPERTY_CASES, else the test's
 * defaults). A failing case prints its seed; rerun it with CPH_PROPERTY_SEED=<seed>
 * CPH_PROPERTY_CASES=1. */
#ifndef CEPHALON_TESTS_PROP_H
#define CEPHALON_TESTS_PROP_H

#include <stdint.h>
#include <stdlib.h>

typedef struct rng {
  uint64_t s;
} rng;

static inline uint64_t next(rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform enough in [0, n) for the small n the tests draw from. */
static inline uint32_t below(rng *r, uint32_t n) { return (uint32_t)(next(r) % n); }

/* The first seed and the number of cases of this run. */
static inline void cph_property_run(uint64_t default_seed, long default_cases, uint64_t *seed,
                                    long *cases) {
  const char *s = getenv("CPH_PROPERTY_SEED"), *c = getenv("CPH_PROPERTY_CASES");
  *seed = s ? strtoull(s, NULL, 10) : default_seed;
  *cases = c ? strtol(c, NULL, 10) : default_cases;
}

/* Fails the test unless cond, naming the case's seed and how to rerun it, then the message
 * (printf-style). For a cmocka test (fail_msg); seed is the running case's. */
#define CPH_PROP_CHECK(seed, cond, ...)                                                        \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      char what_[1400];                                                                        \
      snprintf(what_, sizeof what_, __VA_ARGS__);                                              \
      fail_msg("seed %llu (rerun: CPH_PROPERTY_SEED=%llu CPH_PROPERTY_CASES=1): %s",           \
               (unsigned long long)(seed), (unsigned long long)(seed), what_);                 \
    }                                                                                          \
  } while (0)

#endif
