/* Decoded memory records kept between turns: memcache.h is the contract. */
#include "memcache.h"

#include <stdlib.h>
#include <string.h>

void memcache_init(cph_memcache *c, size_t max_bytes) {
  memset(c, 0, sizeof *c);
  c->max_bytes = max_bytes;
}

static void entry_free(memcache_entry *e) {
  if (!e->written)
    cph_record_free(&cph_memory_desc, &e->rec);
  free(e);
}

static void chain_free(memcache_entry *e) {
  while (e) {
    memcache_entry *next = e->next;
    entry_free(e);
    e = next;
  }
}

static memcache_entry *entry_of(cph_lru_link *l) { return CPH_LRU_ENTRY(l, memcache_entry, lru); }

/* Frees every kept record (leaving them in slots: the caller empties those). */
static void kept_free(cph_memcache *c) {
  memcache_entry *e;
  while ((e = entry_of(c->kept.first))) {
    cph_lru_unlink(&c->kept, &e->lru);
    entry_free(e);
  }
  c->bytes = 0;
}

void memcache_clear(cph_memcache *c) {
  kept_free(c);
  chain_free(c->marks);
  chain_free(c->loose);
  free(c->slots);
  size_t max = c->max_bytes;
  uint64_t hits = c->hits, misses = c->misses;
  memcache_init(c, max);
  c->hits = hits;
  c->misses = misses;
}

/* Fibonacci hashing: ids are consecutive, the multiply spreads them over the table. */
static size_t slot_of(const cph_memcache *c, uint64_t id) {
  return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) & c->mask;
}

static memcache_entry **find(cph_memcache *c, uint64_t id) {
  if (!c->slots)
    return NULL;
  for (size_t i = slot_of(c, id);; i = (i + 1) & c->mask) {
    if (!c->slots[i])
      return NULL;
    if (c->slots[i]->id == id)
      return &c->slots[i];
  }
}

/* Removes the entry at slot s, moving the entries after it back so every probe still finds
 * its entry without tombstones (linear probing's backward shift). */
static void slot_remove(cph_memcache *c, memcache_entry **s) {
  size_t i = (size_t)(s - c->slots);
  c->slots[i] = NULL;
  c->len--;
  for (size_t j = (i + 1) & c->mask; c->slots[j]; j = (j + 1) & c->mask) {
    size_t home = slot_of(c, c->slots[j]->id);
    /* j's entry may move to i when i lies cyclically in [home, j) */
    if (((j - home) & c->mask) >= ((j - i) & c->mask)) {
      c->slots[i] = c->slots[j];
      c->slots[j] = NULL;
      i = j;
    }
  }
}

/* Room for one more entry at a load of at most a half. */
static bool slots_reserve(cph_memcache *c) {
  size_t cap = c->slots ? c->mask + 1 : 0;
  if ((c->len + 1) * 2 <= cap)
    return true;
  size_t ncap = cap ? cap * 2 : 1024;
  memcache_entry **ns = calloc(ncap, sizeof *ns);
  if (!ns)
    return false;
  memcache_entry **old = c->slots;
  c->slots = ns;
  c->mask = ncap - 1;
  for (size_t i = 0; i < cap; i++)
    if (old[i]) {
      size_t j = slot_of(c, old[i]->id);
      while (ns[j])
        j = (j + 1) & c->mask;
      ns[j] = old[i];
    }
  free(old);
  return true;
}

static void slot_add(cph_memcache *c, memcache_entry *e) {
  size_t j = slot_of(c, e->id);
  while (c->slots[j])
    j = (j + 1) & c->mask;
  c->slots[j] = e;
  c->len++;
}

const cph_memory_rec *memcache_get(cph_memcache *c, uint64_t id) {
  memcache_entry **s = find(c, id);
  if (!s || (*s)->written) {
    c->misses++;
    return NULL;
  }
  c->hits++;
  cph_lru_touch(&c->kept, &(*s)->lru);
  return &(*s)->rec;
}

const cph_memory_rec *memcache_keep(cph_memcache *c, cph_memory_rec *rec, size_t bytes) {
  memcache_entry *e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  e->id = rec->id;
  e->rec = *rec;
  memset(rec, 0, sizeof *rec);
  e->bytes = sizeof *e + bytes;
  bool keep = c->max_bytes && !c->shut && !(c->minted_from && e->id >= c->minted_from) &&
              !find(c, e->id) && slots_reserve(c);
  if (keep) {
    slot_add(c, e);
    cph_lru_push_first(&c->kept, &e->lru);
    c->bytes += e->bytes;
  } else { /* held for the pass only */
    e->next = c->loose;
    c->loose = e;
  }
  return &e->rec;
}

/* Drops everything kept and keeps nothing more in this pass (the marks could not be kept). */
static void shut(cph_memcache *c) {
  for (cph_lru_link *l = c->kept.first; l; l = l->next)
    slot_remove(c, find(c, entry_of(l)->id));
  kept_free(c);
  c->shut = true;
}

void memcache_mark_written(cph_memcache *c, uint64_t id) {
  if (c->shut)
    return;
  memcache_entry **s = find(c, id);
  memcache_entry *e = s ? *s : NULL;
  if (e && e->written)
    return;
  if (e) { /* kept: becomes the mark */
    cph_lru_unlink(&c->kept, &e->lru);
    c->bytes -= e->bytes;
    cph_record_free(&cph_memory_desc, &e->rec);
  } else if (!slots_reserve(c) || !(e = calloc(1, sizeof *e))) {
    shut(c);
    return;
  } else {
    e->id = id;
    slot_add(c, e);
  }
  e->written = true;
  e->next = c->marks;
  c->marks = e;
}

void memcache_minted(cph_memcache *c, uint64_t id) {
  if (!c->minted_from || id < c->minted_from)
    c->minted_from = id;
}

void memcache_pass_end(cph_memcache *c) {
  for (memcache_entry *e = c->marks; e; e = e->next)
    slot_remove(c, find(c, e->id));
  chain_free(c->marks);
  chain_free(c->loose);
  c->marks = c->loose = NULL;
  c->minted_from = 0;
  c->shut = false;
  memcache_entry *e;
  while (c->bytes > c->max_bytes && (e = entry_of(c->kept.last))) {
    slot_remove(c, find(c, e->id));
    cph_lru_unlink(&c->kept, &e->lru);
    c->bytes -= e->bytes;
    entry_free(e);
  }
}
