/* cph_arena — a bump allocator for strings that live and die together: a leased turn's
 * messages, history entries and memory items are a few hundred strings, made in one
 * assembly and freed with the turn, so they take one allocation per 16 KB instead of one each
 * (malloc and free were a sixth of a lease's instructions). One owner, one thread.
 *
 * The arena is its chunk list: a `struct cph_arena_chunk *` that starts NULL. Allocation
 * failure returns NULL and leaves the arena as it was. */
#ifndef CEPHALON_COMMON_ARENA_H
#define CEPHALON_COMMON_ARENA_H

#include <stddef.h>

struct cph_arena_chunk;

/* n bytes (not aligned: for strings), valid until cph_arena_free. */
char *cph_arena_alloc(struct cph_arena_chunk **arena, size_t n);
/* A copy of s[0..n) with a NUL after it. */
char *cph_arena_strndup(struct cph_arena_chunk **arena, const char *s, size_t n);
/* n pointers, aligned for them and NULL, valid until cph_arena_free (n > 0). */
void *cph_arena_ptrs(struct cph_arena_chunk **arena, size_t n);
/* Frees every chunk; the arena is empty (NULL) again. */
void cph_arena_free(struct cph_arena_chunk **arena);

#endif
