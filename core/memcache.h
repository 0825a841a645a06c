/* Decoded memory records kept between turns (DESIGN §6 recent_memory). Private to core/: the
 * memory module owns the cache (memory.h) and is its only caller; pass thread only.
 *
 * Why: a lease reads the newest memories of its scopes — about 48 records, mostly the same
 * ones lease after lease — and decoding them was a tenth of the event loop's instructions per
 * lease (bench/PROFILE.md). Kept decoded, a record costs a hash probe.
 *
 * What keeps a kept record equal to the store's (memory.h says how the memory module does it):
 *   - every write of a memory record forgets the id here and marks it written until the pass
 *     ends (memcache_mark_written); a marked id is not kept again in that pass, because its
 *     record may still be rolled back with the pass (or a child transaction of it);
 *   - so is every id the pass minted (memcache_minted: ids ascend, so one bound marks them
 *     all): a rolled-back mint gives its id to the next memory;
 *   - memcache_pass_end clears the marks. Records are kept only when read in a pass, so what
 *     is kept is what a committed pass, or the running pass without writing it, read.
 *
 * Lifetime of what memcache_get and memcache_keep return: until the id is forgotten (a write)
 * or the pass ends. Nothing is evicted inside a pass: the bound (bytes, least recently used
 * first) is enforced at memcache_pass_end, so a turn's borrowed records cannot go under it. */
#ifndef CEPHALON_CORE_MEMCACHE_H
#define CEPHALON_CORE_MEMCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/lru.h"
#include "store/records.h"

typedef struct memcache_entry {
  uint64_t id;
  cph_memory_rec rec;
  size_t bytes;  /* what it counts against the bound */
  bool written;  /* a mark (memcache_mark_written): rec is empty, nothing kept */
  cph_lru_link lru;            /* kept records: in the cache's recency order */
  struct memcache_entry *next; /* marks and loose records: this pass's chains */
} memcache_entry;

typedef struct cph_memcache {
  memcache_entry **slots; /* open addressing, linear probing; NULL = empty */
  size_t mask;            /* slots - 1 (a power of two), or 0 before the first */
  size_t len;             /* entries in slots: kept records and marks */
  cph_lru kept;           /* kept records, most recently used first */
  memcache_entry *marks;  /* this pass's marks, through next */
  memcache_entry *loose;  /* records read this pass that could not be kept, through next */
  uint64_t minted_from;   /* ids >= this were minted in the pass (0: none) */
  bool shut;              /* a mark could not be made: nothing is kept until the pass ends */
  size_t bytes, max_bytes;
  uint64_t hits, misses;  /* since open, for tests and the profile */
} cph_memcache;

/* max_bytes 0 keeps nothing across passes (every turn decodes again). */
void memcache_init(cph_memcache *c, size_t max_bytes);
/* Frees everything, the returned records included; the cache can be used again. */
void memcache_clear(cph_memcache *c);

/* The kept record of id (now the most recently used), or NULL. */
const cph_memory_rec *memcache_get(cph_memcache *c, uint64_t id);
/* Takes *rec (decoded from the store as the running pass sees it; *rec is left empty) and
 * returns where it now lives: kept under its id unless the pass wrote or minted it, else held
 * only until the pass ends. NULL when out of memory (then *rec is untouched, still the
 * caller's). `bytes` is its size in the store, the basis of its share of the bound. */
const cph_memory_rec *memcache_keep(cph_memcache *c, cph_memory_rec *rec, size_t bytes);
/* id's record is being written (put) in the running pass: forgotten, and not kept again
 * before the pass ends. Cannot fail: without memory for the mark, everything kept is dropped
 * and nothing is kept again before the pass ends. */
void memcache_mark_written(cph_memcache *c, uint64_t id);
/* id was minted in the running pass (ids ascend: every later id is marked too). */
void memcache_minted(cph_memcache *c, uint64_t id);
/* The pass ended (committed or not): marks cleared, records held only for it freed, and the
 * least recently used kept records dropped down to the bound. */
void memcache_pass_end(cph_memcache *c);

#endif
