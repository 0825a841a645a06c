#include "hmap.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

/* FNV-1a with a final avalanche: cheap, and good enough for ids and channel names. */
uint64_t cph_hash_str(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) {
    h ^= (uint8_t)*s;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

static size_t find_slot(const cph_hmap *m, const char *key, uint64_t h) {
  size_t mask = m->cap - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const cph_hmap_slot *s = &m->slots[i];
    if (!s->key || (s->hash == h && strcmp(s->key, key) == 0))
      return i;
  }
}

void *cph_hmap_get(const cph_hmap *m, const char *key) {
  if (!m->cap)
    return NULL;
  size_t i = find_slot(m, key, cph_hash_str(key));
  return m->slots[i].key ? m->slots[i].value : NULL;
}

static int grow(cph_hmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 16;
  cph_hmap_slot *slots = calloc(cap, sizeof *slots);
  if (!slots)
    return CPH_ENOMEM;
  cph_hmap old = *m;
  m->slots = slots;
  m->cap = cap;
  for (size_t i = 0; i < old.cap; i++)
    if (old.slots[i].key)
      m->slots[find_slot(m, old.slots[i].key, old.slots[i].hash)] = old.slots[i];
  free(old.slots);
  return CPH_OK;
}

int cph_hmap_put(cph_hmap *m, const char *key, void *value) {
  if ((m->len + 1) * 10 > m->cap * 7 && grow(m) != CPH_OK)
    return CPH_ENOMEM;
  uint64_t h = cph_hash_str(key);
  size_t i = find_slot(m, key, h);
  if (!m->slots[i].key)
    m->len++;
  m->slots[i] = (cph_hmap_slot){key, h, value};
  return CPH_OK;
}

void *cph_hmap_del(cph_hmap *m, const char *key) {
  if (!m->cap)
    return NULL;
  size_t mask = m->cap - 1;
  size_t i = find_slot(m, key, cph_hash_str(key));
  if (!m->slots[i].key)
    return NULL;
  void *value = m->slots[i].value;
  /* Backward shift: pull later members of the probe run into the hole. */
  size_t hole = i;
  for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
    size_t home = m->slots[j].hash & mask;
    /* j may move to hole if its home is not in (hole, j] cyclically */
    bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
    if (movable) {
      m->slots[hole] = m->slots[j];
      hole = j;
    }
  }
  m->slots[hole].key = NULL;
  m->len--;
  return value;
}

void cph_hmap_free(cph_hmap *m) {
  free(m->slots);
  m->slots = NULL;
  m->cap = m->len = 0;
}
