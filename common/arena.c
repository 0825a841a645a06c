/* cph_arena: chunks of at least ARENA_CHUNK bytes, newest first; allocation bumps the newest
 * chunk's `used` and starts a new chunk when it does not fit (the rest of the old one is
 * left unused). */
#include "arena.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_CHUNK (16u << 10)

struct cph_arena_chunk {
  struct cph_arena_chunk *next;
  size_t used, cap;
  char data[];
};

char *cph_arena_alloc(struct cph_arena_chunk **arena, size_t n) {
  struct cph_arena_chunk *c = *arena;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
    if (cap > (size_t)-1 - sizeof *c)
      return NULL;
    struct cph_arena_chunk *fresh = malloc(sizeof *fresh + cap);
    if (!fresh)
      return NULL;
    fresh->next = c;
    fresh->used = 0;
    fresh->cap = cap;
    *arena = c = fresh;
  }
  char *p = c->data + c->used;
  c->used += n;
  return p;
}

char *cph_arena_strndup(struct cph_arena_chunk **arena, const char *s, size_t n) {
  if (n == (size_t)-1)
    return NULL;
  char *p = cph_arena_alloc(arena, n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = '\0';
  }
  return p;
}

_Static_assert(offsetof(struct cph_arena_chunk, data) % sizeof(void *) == 0,
               "a chunk's data is aligned for pointers");

void *cph_arena_ptrs(struct cph_arena_chunk **arena, size_t n) {
  const size_t align = sizeof(void *);
  if (n > ((size_t)-1 - align) / sizeof(void *))
    return NULL;
  /* data[] follows three words, so a chunk's data is aligned for pointers; pad the bump */
  struct cph_arena_chunk *c = *arena;
  size_t pad = c ? (align - c->used % align) % align : 0;
  char *p = cph_arena_alloc(arena, pad + n * sizeof(void *));
  if (!p)
    return NULL;
  if (*arena != c) /* a fresh chunk: its data starts aligned, the pad is left at the end */
    pad = 0;
  memset(p + pad, 0, n * sizeof(void *));
  return p + pad;
}

void cph_arena_free(struct cph_arena_chunk **arena) {
  for (struct cph_arena_chunk *c = *arena, *next; c; c = next) {
    next = c->next;
    free(c);
  }
  *arena = NULL;
}
