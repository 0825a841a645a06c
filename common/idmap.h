/* cph_idmap — an open-addressing hash index from string keys to uint32 handles, 8 bytes a
 * slot, for a million entries where cph_hmap would spend 24.
 *
 * The map stores no keys: a slot holds 32 bits of the key's hash and the handle, and the key
 * of a handle is asked of the owner through key_of (the engine keys sessions by scheduler
 * handle and reads the id from the session). So key_of(ctx, h) must return the key of every
 * handle in the map, unchanged, for as long as h is in it.
 *
 * Costs: get/put/del O(1) expected, key_of called only on a full 32-bit hash match (about
 * once per successful get). The table doubles at 3/4 load; cph_idmap_reserve sizes it once
 * for a known count, so loading n entries never rehashes. Deletion shifts entries back (no
 * tombstones). */
#ifndef CEPHALON_COMMON_IDMAP_H
#define CEPHALON_COMMON_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CPH_IDMAP_NONE UINT32_MAX /* not a valid handle */

typedef const char *(*cph_idmap_key_fn)(const void *ctx, uint32_t handle);

typedef struct cph_idmap {
  uint64_t *slots; /* 0 = empty; else hash low 32 bits << 32 | (handle + 1) */
  size_t cap;      /* power of two, or 0 */
  size_t len;
  cph_idmap_key_fn key_of;
  const void *ctx;
} cph_idmap;

void cph_idmap_init(cph_idmap *m, cph_idmap_key_fn key_of, const void *ctx);
/* Room for n entries in all without a rehash. CPH_OK or CPH_ENOMEM (unchanged then). */
int cph_idmap_reserve(cph_idmap *m, size_t n);
/* The handle of key, or CPH_IDMAP_NONE. */
uint32_t cph_idmap_get(const cph_idmap *m, const char *key);
/* Inserts key -> handle, or points an existing key at handle (key_of(handle) must then be
 * that key too; this never allocates, so never fails). handle < CPH_IDMAP_NONE. CPH_OK or
 * CPH_ENOMEM (unchanged then). */
int cph_idmap_put(cph_idmap *m, const char *key, uint32_t handle);
/* Removes key; true if it was there. */
bool cph_idmap_del(cph_idmap *m, const char *key);
void cph_idmap_free(cph_idmap *m);

#endif
