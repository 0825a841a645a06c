#include "idmap.h"

#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "hmap.h"

#define SLOT(tag, handle) ((uint64_t)(tag) << 32 | ((uint64_t)(handle) + 1))
#define SLOT_TAG(s) ((uint32_t)((s) >> 32))
#define SLOT_HANDLE(s) ((uint32_t)(s) - 1)

void cph_idmap_init(cph_idmap *m, cph_idmap_key_fn key_of, const void *ctx) {
  memset(m, 0, sizeof *m);
  m->key_of = key_of;
  m->ctx = ctx;
}

/* The slot holding key, or the empty slot that ends its probe run. */
static size_t find_slot(const cph_idmap *m, const char *key, uint32_t tag) {
  size_t mask = m->cap - 1;
  for (size_t i = tag & mask;; i = (i + 1) & mask) {
    uint64_t s = m->slots[i];
    if (!s || (SLOT_TAG(s) == tag && strcmp(m->key_of(m->ctx, SLOT_HANDLE(s)), key) == 0))
      return i;
  }
}

static int resize(cph_idmap *m, size_t cap) {
  uint64_t *slots = calloc(cap, sizeof *slots);
  if (!slots)
    return CPH_ENOMEM;
  size_t mask = cap - 1;
  for (size_t i = 0; i < m->cap; i++) {
    uint64_t s = m->slots[i];
    if (!s)
      continue;
    size_t j = SLOT_TAG(s) & mask; /* keys are distinct: the first empty slot is its place */
    while (slots[j])
      j = (j + 1) & mask;
    slots[j] = s;
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return CPH_OK;
}

/* The smallest power-of-two table that holds n entries under 3/4 load. */
static size_t cap_for(size_t n) {
  size_t cap = 16;
  while (cap / 4 * 3 < n)
    cap *= 2;
  return cap;
}

int cph_idmap_reserve(cph_idmap *m, size_t n) {
  size_t cap = cap_for(n);
  return cap > m->cap ? resize(m, cap) : CPH_OK;
}

uint32_t cph_idmap_get(const cph_idmap *m, const char *key) {
  if (!m->cap)
    return CPH_IDMAP_NONE;
  uint64_t s = m->slots[find_slot(m, key, (uint32_t)cph_hash_str(key))];
  return s ? SLOT_HANDLE(s) : CPH_IDMAP_NONE;
}

int cph_idmap_put(cph_idmap *m, const char *key, uint32_t handle) {
  uint32_t tag = (uint32_t)cph_hash_str(key);
  size_t i = m->cap ? find_slot(m, key, tag) : 0;
  if (m->cap && m->slots[i]) { /* a new handle for a present key: never allocates */
    m->slots[i] = SLOT(tag, handle);
    return CPH_OK;
  }
  if (m->len + 1 > m->cap / 4 * 3) {
    if (resize(m, cap_for(m->len + 1)) != CPH_OK)
      return CPH_ENOMEM;
    i = find_slot(m, key, tag);
  }
  m->slots[i] = SLOT(tag, handle);
  m->len++;
  return CPH_OK;
}

bool cph_idmap_del(cph_idmap *m, const char *key) {
  if (!m->cap)
    return false;
  size_t mask = m->cap - 1;
  size_t i = find_slot(m, key, (uint32_t)cph_hash_str(key));
  if (!m->slots[i])
    return false;
  /* Backward shift: pull later members of the probe run into the hole. */
  size_t hole = i;
  for (size_t j = (i + 1) & mask; m->slots[j]; j = (j + 1) & mask) {
    size_t home = SLOT_TAG(m->slots[j]) & mask;
    /* j may move to hole if its home is not in (hole, j] cyclically */
    bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      m->slots[hole] = m->slots[j];
      hole = j;
    }
  }
  m->slots[hole] = 0;
  m->len--;
  return true;
}

void cph_idmap_free(cph_idmap *m) {
  free(m->slots);
  m->slots = NULL;
  m->cap = m->len = 0;
}
