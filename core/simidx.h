/* A banded index of 64-bit simhashes for near-duplicate lookup (DESIGN §5). Private to core/.
 *
 * Pigeonhole: split the 64 bits into d+1 bands; two hashes within Hamming distance d differ
 * in at most d bits, so at least one band is identical in both. Each slot is linked into one
 * bucket per band (keyed by up to SIMIDX_BUCKET_BITS low bits of the band), and a lookup walks
 * the d+1 buckets of the query: a superset of every slot within distance d, which the caller
 * checks with dedupe_hamming(). With random hashes a lookup visits about
 * n * sum(2^-min(width, SIMIDX_BUCKET_BITS)) slots instead of n (d = 10: ~n/5).
 *
 * Slots are the caller's (a ring's positions, < 65535); the caller keeps the hashes and says
 * which hash a slot held when it unlinks it. Insert and remove are O(d); no allocation after
 * init. Bands narrower than SIMIDX_BAND_MIN_BITS filter too little to pay: simidx_init
 * refuses such a distance (CPH_EINVAL) and the caller scans linearly. */
#ifndef CEPHALON_CORE_SIMIDX_H
#define CEPHALON_CORE_SIMIDX_H

#include <stdint.h>

#define SIMIDX_NIL 0xFFFFu
#define SIMIDX_MAX_SLOTS 0xFFFFu
#define SIMIDX_BAND_MIN_BITS 4
#define SIMIDX_MAX_BANDS (64 / SIMIDX_BAND_MIN_BITS)
#define SIMIDX_BUCKET_BITS 8

typedef struct simidx {
  int bands;    /* d + 1; 0 = not initialised */
  uint32_t cap; /* slots */
  uint8_t shift[SIMIDX_MAX_BANDS];
  uint16_t mask[SIMIDX_MAX_BANDS];  /* of the bucket bits of each band */
  uint32_t first[SIMIDX_MAX_BANDS]; /* band b's buckets start at heads[first[b]] */
  uint16_t *heads;
  uint16_t *next, *prev; /* [band * cap + slot] */
} simidx;

/* CPH_OK, CPH_EINVAL (distance too large for bands of SIMIDX_BAND_MIN_BITS, or cap too large),
 * or CPH_ENOMEM. An index starts empty. */
int simidx_init(simidx *x, uint32_t cap, int distance);
void simidx_free(simidx *x);
void simidx_insert(simidx *x, uint32_t slot, uint64_t hash);
/* hash: what the slot held when inserted. */
void simidx_remove(simidx *x, uint32_t slot, uint64_t hash);

static inline uint32_t simidx_bucket(const simidx *x, int band, uint64_t hash) {
  return x->first[band] + (uint32_t)((hash >> x->shift[band]) & x->mask[band]);
}

/* Walk: for (int b = 0; b < x->bands; b++)
 *         for (uint32_t s = simidx_first(x, b, h); s != SIMIDX_NIL; s = simidx_next(x, b, s))
 * A slot may come up in several bands. */
static inline uint32_t simidx_first(const simidx *x, int band, uint64_t hash) {
  return x->heads[simidx_bucket(x, band, hash)];
}

static inline uint32_t simidx_next(const simidx *x, int band, uint32_t slot) {
  return x->next[(uint32_t)band * x->cap + slot];
}

#endif
