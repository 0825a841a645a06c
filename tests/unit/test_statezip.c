/* The cluster log's packed session states (server/statezip.h): random states survive a round
 * trip, a raw state (an earlier build's "CPHS" value) reads as it is, and a packed value that is
 * cut, damaged, lies about its length or says it is over the bound is refused with a reason and
 * yields nothing; the packer thread hands its jobs back on the loop in order.
 * The random cases are seeded: a failure prints the seed. To replay one:
 *   CPH_STATEZIP_SEED=<seed> ./test_statezip */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <event2/event.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "server/statezip.h"

#define CASES 200
#define MAX (CPH_SESSION_STATE_MAX_BYTES)

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* A state-like blob of len bytes: "CPHS", then runs of repeated words (the redundancy of a real
 * state) mixed with random bytes, in proportions the seed picks. */
static uint8_t *random_blob(uint64_t *s, size_t len) {
  static const char *words[] = {"hello ann", "the deploy of", "channel general",
                                "tool_calls", "what did the build say", "\x01\x00\x00\x2a"};
  uint8_t *b = malloc(len ? len : 1);
  assert_non_null(b);
  unsigned noise = (unsigned)(rng_next(s) % 101); /* percent of random bytes */
  size_t i = 0;
  if (len >= 4) {
    memcpy(b, "CPHS", 4);
    i = 4;
  }
  while (i < len) {
    if (rng_next(s) % 100 < noise) {
      b[i++] = (uint8_t)rng_next(s);
      continue;
    }
    const char *w = words[rng_next(s) % (sizeof words / sizeof words[0])];
    size_t wl = strlen(w) ? strlen(w) : 1;
    for (size_t k = 0; k < wl && i < len; k++)
      b[i++] = (uint8_t)w[k];
  }
  return b;
}

static uint64_t base_seed(void) {
  const char *e = getenv("CPH_STATEZIP_SEED");
  return e ? strtoull(e, NULL, 10) : 20;
}

/* Packs raw at level 1 with 8 bytes of headroom, checking the frame; the value (no headroom)
 * is returned, *vlen its length. */
static uint8_t *pack(const uint8_t *raw, size_t len, size_t *vlen) {
  uint8_t *out = NULL;
  size_t out_len = 0;
  assert_int_equal(cph_statezip_pack(raw, len, 1, MAX, 8, &out, &out_len), CPH_OK);
  assert_true(out_len >= 8 + CPH_STATEZIP_HEADER);
  uint8_t *v = malloc(out_len - 8);
  assert_non_null(v);
  memcpy(v, out + 8, out_len - 8);
  free(out);
  *vlen = out_len - 8;
  assert_true(cph_statezip_packed(v, *vlen));
  return v;
}

/* Unpacks v expecting a refusal with rc and a reason. */
static void refused(const uint8_t *v, size_t len, size_t max, int want, const char *what) {
  uint8_t *out = (uint8_t *)1;
  size_t out_len = 99;
  char why[200] = "";
  int rc = cph_statezip_unpack(v, len, max, &out, &out_len, why, sizeof why);
  if (rc != want)
    fail_msg("%s: rc %d, wanted %d (why: \"%s\")", what, rc, want, why);
  assert_null(out);
  assert_int_equal(out_len, 0);
  if (!why[0])
    fail_msg("%s: refused without a reason", what);
}

static void test_statezip_random_states_round_trip(void **state) {
  (void)state;
  uint64_t base = base_seed();
  for (int c = 0; c < CASES; c++) {
    uint64_t seed = base + (uint64_t)c, s = seed;
    size_t len = (size_t)(rng_next(&s) % 3 == 0 ? rng_next(&s) % 64 : rng_next(&s) % 200000);
    uint8_t *raw = random_blob(&s, len);
    uint8_t *out = NULL;
    size_t out_len = 0;
    int rc = cph_statezip_pack(raw, len, 1 + (int)(seed % 9), MAX, 8, &out, &out_len);
    if (rc != CPH_OK)
      fail_msg("seed %" PRIu64 " (CPH_STATEZIP_SEED=%" PRIu64 "): pack failed: %d", seed, seed, rc);
    uint8_t *back = NULL;
    size_t back_len = 0;
    char why[200] = "";
    rc = cph_statezip_unpack(out + 8, out_len - 8, MAX, &back, &back_len, why, sizeof why);
    if (rc != CPH_OK || !back || back_len != len || (len && memcmp(back, raw, len) != 0))
      fail_msg("seed %" PRIu64 " (CPH_STATEZIP_SEED=%" PRIu64 "): %zu bytes did not come back "
               "(rc %d, %zu bytes, %s)",
               seed, seed, len, rc, back_len, why);
    free(back);
    free(out);
    free(raw);
  }
}

static void test_statezip_a_raw_state_passes_through_unchanged(void **state) {
  (void)state;
  uint64_t s = base_seed();
  uint8_t *raw = random_blob(&s, 5000);
  uint8_t *out = (uint8_t *)1;
  size_t out_len = 7;
  char why[200] = "";
  assert_false(cph_statezip_packed(raw, 5000));
  assert_int_equal(cph_statezip_unpack(raw, 5000, MAX, &out, &out_len, why, sizeof why), CPH_OK);
  assert_null(out); /* the value is the state itself */
  assert_int_equal(out_len, 0);
  /* shorter than the magic, or empty: raw too */
  assert_int_equal(cph_statezip_unpack((const uint8_t *)"CPH", 3, MAX, &out, &out_len, why,
                                       sizeof why),
                   CPH_OK);
  assert_null(out);
  assert_int_equal(cph_statezip_unpack(raw, 0, MAX, &out, &out_len, why, sizeof why), CPH_OK);
  assert_null(out);
  free(raw);
}

static void test_statezip_a_cut_value_is_refused(void **state) {
  (void)state;
  uint64_t s = base_seed() + 1000;
  uint8_t *raw = random_blob(&s, 60000);
  size_t vlen = 0;
  uint8_t *v = pack(raw, 60000, &vlen);
  char what[64];
  for (size_t cut = 4; cut < vlen; cut += cut < 64 ? 1 : 97) {
    snprintf(what, sizeof what, "cut at %zu of %zu", cut, vlen);
    refused(v, cut, MAX, CPH_ECORRUPT, what);
  }
  refused(v, vlen - 1, MAX, CPH_ECORRUPT, "the last byte cut");
  free(v);
  free(raw);
}

static void test_statezip_a_damaged_value_is_refused(void **state) {
  (void)state;
  uint64_t s = base_seed() + 2000;
  uint8_t *raw = random_blob(&s, 40000);
  size_t vlen = 0;
  uint8_t *v = pack(raw, 40000, &vlen);
  char what[64];
  /* Every byte of the zlib header and check, and bytes through the stream. A flipped bit is
   * refused — or, where deflate leaves bits unused (padding to a byte), changes nothing: what
   * comes back is never other than what was packed. */
  size_t refusals = 0, flips = 0;
  for (size_t at = CPH_STATEZIP_HEADER; at < vlen;
       at += at < CPH_STATEZIP_HEADER + 2 || at >= vlen - 4 ? 1 : 13) {
    uint8_t keep = v[at];
    v[at] ^= (uint8_t)(1u << (at % 8));
    uint8_t *out = NULL;
    size_t out_len = 0;
    char why[200] = "";
    int rc = cph_statezip_unpack(v, vlen, MAX, &out, &out_len, why, sizeof why);
    flips++;
    if (rc == CPH_OK) {
      if (!out || out_len != 40000 || memcmp(out, raw, 40000) != 0)
        fail_msg("bit %zu of byte %zu flipped: other data accepted", at % 8, at);
    } else {
      snprintf(what, sizeof what, "bit %zu of byte %zu flipped", at % 8, at);
      refused(v, vlen, MAX, CPH_ECORRUPT, what);
      refusals++;
    }
    free(out);
    v[at] = keep;
  }
  assert_true(refusals * 10 >= flips * 9); /* nearly all */
  /* bytes after the stream's end */
  uint8_t *longer = malloc(vlen + 3);
  assert_non_null(longer);
  memcpy(longer, v, vlen);
  memcpy(longer + vlen, "abc", 3);
  refused(longer, vlen + 3, MAX, CPH_ECORRUPT, "bytes after the stream");
  free(longer);
  free(v);
  free(raw);
}

static void put_be32(uint8_t *p, uint32_t n) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(n >> (24 - 8 * i));
}

static void test_statezip_a_value_that_lies_about_its_length_is_refused(void **state) {
  (void)state;
  uint64_t s = base_seed() + 3000;
  uint8_t *raw = random_blob(&s, 30000);
  size_t vlen = 0;
  uint8_t *v = pack(raw, 30000, &vlen);
  put_be32(v + 4, 30001);
  refused(v, vlen, MAX, CPH_ECORRUPT, "says one byte more");
  put_be32(v + 4, 29999);
  refused(v, vlen, MAX, CPH_ECORRUPT, "says one byte less");
  put_be32(v + 4, 0);
  refused(v, vlen, MAX, CPH_ECORRUPT, "says none");
  free(v);
  free(raw);
}

static void test_statezip_an_oversized_value_is_refused_without_inflating_it(void **state) {
  (void)state;
  /* 4 MiB of zeros packs to a few KiB: its stated length is over the bound */
  size_t big = 4u << 20;
  uint8_t *zeros = calloc(1, big);
  assert_non_null(zeros);
  uint8_t *out = NULL;
  size_t out_len = 0;
  assert_int_equal(cph_statezip_pack(zeros, big, 1, MAX, 0, &out, &out_len), CPH_ELIMIT);
  assert_null(out);
  assert_int_equal(cph_statezip_pack(zeros, big, 1, big, 0, &out, &out_len), CPH_OK);
  assert_true(out_len < 64 * 1024);
  refused(out, out_len, MAX, CPH_ELIMIT, "stated 4 MiB");
  /* the same stream under a stated length within the bound: inflating stops at the bound */
  put_be32(out + 4, 1000);
  refused(out, out_len, MAX, CPH_ECORRUPT, "stated 1000, inflates to 4 MiB");
  put_be32(out + 4, MAX);
  refused(out, out_len, MAX, CPH_ECORRUPT, "stated the bound, inflates to 4 MiB");
  /* just over the bound by its own words */
  put_be32(out + 4, MAX + 1);
  refused(out, out_len, MAX, CPH_ELIMIT, "stated the bound + 1");
  /* a header alone */
  refused(out, CPH_STATEZIP_HEADER, MAX, CPH_ELIMIT, "a header over the bound, no stream");
  put_be32(out + 4, 10);
  refused(out, CPH_STATEZIP_HEADER, MAX, CPH_ECORRUPT, "a header, no stream");
  refused(out, 6, MAX, CPH_ECORRUPT, "a cut header");
  free(out);
  free(zeros);
}

static void test_statezip_a_job_keeps_the_raw_state_when_packing_makes_it_no_smaller(void **state) {
  (void)state;
  uint64_t s = base_seed() + 4000;
  uint8_t noise[300];
  for (size_t i = 0; i < sizeof noise; i++)
    noise[i] = (uint8_t)rng_next(&s);
  memcpy(noise, "CPHS", 4);
  cph_statezip_job job = {.raw = noise, .raw_len = sizeof noise, .headroom = 8};
  cph_statezip_job_run(&job, 1);
  assert_false(job.packed);
  assert_non_null(job.out);
  assert_int_equal(job.out_len, 8 + sizeof noise);
  assert_memory_equal(job.out + 8, noise, sizeof noise);
  free(job.out);
  uint8_t *text = random_blob(&s, 70000);
  cph_statezip_job big = {.raw = text, .raw_len = 70000, .headroom = 8};
  cph_statezip_job_run(&big, 1);
  assert_true(big.packed);
  assert_true(big.out_len < 8 + 70000);
  uint8_t *back = NULL;
  size_t back_len = 0;
  char why[200];
  assert_int_equal(cph_statezip_unpack(big.out + 8, big.out_len - 8, MAX, &back, &back_len, why,
                                       sizeof why),
                   CPH_OK);
  assert_int_equal(back_len, 70000);
  assert_memory_equal(back, text, 70000);
  free(back);
  free(big.out);
  free(text);
}

/* The packer: jobs come back on the loop, in submission order, each packed right. */
#define JOBS 40
typedef struct packer_run {
  struct event_base *base;
  cph_statezip_job jobs[JOBS];
  uint8_t *raws[JOBS];
  int next; /* the index the next handed back job must have */
  bool out_of_order;
} packer_run;

static void on_done(void *arg, cph_statezip_job *job) {
  packer_run *pr = arg;
  if (job != &pr->jobs[pr->next])
    pr->out_of_order = true;
  pr->next++;
  if (pr->next == JOBS)
    event_base_loopbreak(pr->base);
}

static void test_statezip_the_packer_hands_jobs_back_on_the_loop_in_order(void **state) {
  (void)state;
  packer_run pr = {0};
  pr.base = event_base_new();
  assert_non_null(pr.base);
  cph_statezip_packer *p = NULL;
  assert_int_equal(cph_statezip_packer_start(pr.base, 1, on_done, &pr, &p), CPH_OK);
  uint64_t s = base_seed() + 5000;
  for (int i = 0; i < JOBS; i++) {
    size_t len = (size_t)(rng_next(&s) % 90000);
    pr.raws[i] = random_blob(&s, len);
    pr.jobs[i] = (cph_statezip_job){.raw = pr.raws[i], .raw_len = len, .headroom = 8, .tag = &pr};
    assert_true(cph_statezip_packer_submit(p, &pr.jobs[i]));
  }
  struct timeval limit = {30, 0};
  event_base_loopexit(pr.base, &limit);
  event_base_dispatch(pr.base);
  assert_int_equal(pr.next, JOBS);
  assert_false(pr.out_of_order);
  for (int i = 0; i < JOBS; i++) {
    cph_statezip_job *j = &pr.jobs[i];
    assert_non_null(j->out);
    uint8_t *back = NULL;
    size_t back_len = 0;
    char why[200] = "";
    assert_int_equal(cph_statezip_unpack(j->out + 8, j->out_len - 8, MAX, &back, &back_len, why,
                                         sizeof why),
                     CPH_OK);
    if (back) { /* packed */
      assert_int_equal(back_len, j->raw_len);
      assert_memory_equal(back, pr.raws[i], j->raw_len);
    } else { /* kept raw */
      assert_false(j->packed);
      assert_int_equal(j->out_len - 8, j->raw_len);
      assert_memory_equal(j->out + 8, pr.raws[i], j->raw_len);
    }
    free(back);
    free(j->out);
    free(pr.raws[i]);
  }
  cph_statezip_packer_stop(p);
  /* a stopped packer, or none, takes nothing: the caller packs itself */
  assert_false(cph_statezip_packer_submit(NULL, &pr.jobs[0]));
  event_base_free(pr.base);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_statezip_random_states_round_trip),
      cmocka_unit_test(test_statezip_a_raw_state_passes_through_unchanged),
      cmocka_unit_test(test_statezip_a_cut_value_is_refused),
      cmocka_unit_test(test_statezip_a_damaged_value_is_refused),
      cmocka_unit_test(test_statezip_a_value_that_lies_about_its_length_is_refused),
      cmocka_unit_test(test_statezip_an_oversized_value_is_refused_without_inflating_it),
      cmocka_unit_test(test_statezip_a_job_keeps_the_raw_state_when_packing_makes_it_no_smaller),
      cmocka_unit_test(test_statezip_the_packer_hands_jobs_back_on_the_loop_in_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
