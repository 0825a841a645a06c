/* The banded simhash index; contract in simidx.h. */
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "simidx.h"

int simidx_init(simidx *x, uint32_t cap, int distance) {
  memset(x, 0, sizeof *x);
  int bands = distance + 1;
  if (distance < 0 || bands > SIMIDX_MAX_BANDS || cap == 0 || cap >= SIMIDX_MAX_SLOTS)
    return CPH_EINVAL;
  /* Widths differ by at most one bit: the first 64 % bands bands take the extra one. */
  uint32_t n_heads = 0;
  int shift = 0;
  for (int b = 0; b < bands; b++) {
    int width = 64 / bands + (b < 64 % bands ? 1 : 0);
    int bucket_bits = width < SIMIDX_BUCKET_BITS ? width : SIMIDX_BUCKET_BITS;
    x->shift[b] = (uint8_t)shift;
    x->mask[b] = (uint16_t)((1u << bucket_bits) - 1);
    x->first[b] = n_heads;
    n_heads += 1u << bucket_bits;
    shift += width;
  }
  x->heads = malloc(n_heads * sizeof *x->heads);
  x->next = malloc((size_t)bands * cap * sizeof *x->next);
  x->prev = malloc((size_t)bands * cap * sizeof *x->prev);
  if (!x->heads || !x->next || !x->prev) {
    simidx_free(x);
    return CPH_ENOMEM;
  }
  memset(x->heads, 0xFF, n_heads * sizeof *x->heads); /* SIMIDX_NIL everywhere */
  x->bands = bands;
  x->cap = cap;
  return CPH_OK;
}

void simidx_free(simidx *x) {
  free(x->heads);
  free(x->next);
  free(x->prev);
  memset(x, 0, sizeof *x);
}

void simidx_insert(simidx *x, uint32_t slot, uint64_t hash) {
  for (int b = 0; b < x->bands; b++) {
    uint32_t h = simidx_bucket(x, b, hash), at = (uint32_t)b * x->cap;
    uint16_t old = x->heads[h];
    x->next[at + slot] = old;
    x->prev[at + slot] = SIMIDX_NIL;
    if (old != SIMIDX_NIL)
      x->prev[at + old] = (uint16_t)slot;
    x->heads[h] = (uint16_t)slot;
  }
}

void simidx_remove(simidx *x, uint32_t slot, uint64_t hash) {
  for (int b = 0; b < x->bands; b++) {
    uint32_t at = (uint32_t)b * x->cap;
    uint16_t p = x->prev[at + slot], n = x->next[at + slot];
    if (p != SIMIDX_NIL)
      x->next[at + p] = n;
    else
      x->heads[simidx_bucket(x, b, hash)] = n;
    if (n != SIMIDX_NIL)
      x->prev[at + n] = p;
  }
}
