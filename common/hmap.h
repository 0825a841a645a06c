/* cph_hmap — an open-addressing hash map from NUL-terminated string keys to pointers.
 *
 * Contract: keys are not copied — a key must stay valid while its entry exists (callers key
 * an object by a string the object owns). Lookup, insert and delete are O(1) expected; the
 * table doubles at 70% load. Deletion uses backward shifting, so there are no tombstones. */
#ifndef CEPHALON_COMMON_HMAP_H
#define CEPHALON_COMMON_HMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct cph_hmap_slot {
  const char *key; /* NULL = empty */
  uint64_t hash;
  void *value;
} cph_hmap_slot;

typedef struct cph_hmap {
  cph_hmap_slot *slots;
  size_t cap; /* power of two, or 0 */
  size_t len;
} cph_hmap;

#define CPH_HMAP_INIT {NULL, 0, 0}

uint64_t cph_hash_str(const char *s);
void *cph_hmap_get(const cph_hmap *m, const char *key);
/* Inserts or replaces. CPH_OK or CPH_ENOMEM (the map is unchanged then). */
int cph_hmap_put(cph_hmap *m, const char *key, void *value);
/* Removes key; returns its value or NULL. */
void *cph_hmap_del(cph_hmap *m, const char *key);
void cph_hmap_free(cph_hmap *m);

/* Iteration: for (size_t i = 0; i < m->cap; i++) if (m->slots[i].key) ... */

#endif
