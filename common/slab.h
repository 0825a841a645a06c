/* cph_slab — fixed-size objects carved from large chunks; cph_strslab — short strings the same
 * way, one slab per 8-byte size class.
 *
 * Why: a million small objects from malloc cost 8-16 bytes of header and rounding each, and
 * scatter over the heap. A slab object costs its size rounded up to 8 (a string, its length + 1
 * rounded up to 8) and nothing else.
 *
 * Contract:
 *   - cph_slab_alloc returns zeroed memory, 8-byte aligned (so no object may need more), that
 *     stays at its address until
 *     cph_slab_free or cph_slab_destroy; O(1).
 *   - cph_slab_free(p) takes back an object of this slab; it is reused by a later alloc (LIFO).
 *     Chunks are never returned to the system before cph_slab_destroy: memory is bounded by the
 *     peak number of live objects, not the current one.
 *   - Under AddressSanitizer freed objects and the unused tail of a chunk are poisoned, so a
 *     use after free is still reported (until the object is handed out again). */
#ifndef CEPHALON_COMMON_SLAB_H
#define CEPHALON_COMMON_SLAB_H

#include <stddef.h>

typedef struct cph_slab {
  size_t size;     /* object size: the requested size rounded up to 8 */
  size_t chunk;    /* bytes per chunk */
  void **chunks;   /* every chunk, to free them at destroy */
  size_t n_chunks, cap_chunks;
  void *free_list; /* freed objects, linked through their first word */
  char *next, *end; /* the not yet used part of the newest chunk */
  size_t live;     /* objects handed out and not freed */
} cph_slab;

/* A slab of objects of `size` bytes (> 0), taken from chunks of 64 KiB (or 16 objects, if
 * more). */
void cph_slab_init(cph_slab *s, size_t size);
/* NULL when out of memory. */
void *cph_slab_alloc(cph_slab *s);
void cph_slab_free(cph_slab *s, void *p);
/* Frees every chunk: every object of the slab is gone. The slab can be initialised again. */
void cph_slab_destroy(cph_slab *s);

/* Strings of up to CPH_STRSLAB_MAX bytes (not counting the NUL); longer ones go to malloc. */
#define CPH_STRSLAB_MAX 255
#define CPH_STRSLAB_CLASSES ((CPH_STRSLAB_MAX + 1 + 7) / 8)

typedef struct cph_strslab {
  cph_slab classes[CPH_STRSLAB_CLASSES]; /* class k: 8k+1 .. 8k+8 bytes with the NUL */
} cph_strslab;

void cph_strslab_init(cph_strslab *p);
/* A copy of s; NULL when out of memory. */
char *cph_strslab_dup(cph_strslab *p, const char *s);
/* Takes back a string returned by cph_strslab_dup on this pool (NULL is ignored). */
void cph_strslab_free(cph_strslab *p, char *s);
/* Frees the slabs and so every string up to CPH_STRSLAB_MAX bytes; longer ones were malloc'd
 * and must have been taken back with cph_strslab_free. */
void cph_strslab_destroy(cph_strslab *p);

#endif
