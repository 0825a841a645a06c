#include "slab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define CPH_SLAB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPH_SLAB_ASAN 1
#endif
#endif

#ifdef CPH_SLAB_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define SLAB_CHUNK_BYTES 65536

void cph_slab_init(cph_slab *s, size_t size) {
  memset(s, 0, sizeof *s);
  if (size < sizeof(void *))
    size = sizeof(void *); /* a free object holds the free-list link */
  s->size = (size + 7) & ~(size_t)7;
  s->chunk = s->size * 16 > SLAB_CHUNK_BYTES ? s->size * 16 : SLAB_CHUNK_BYTES;
}

static int add_chunk(cph_slab *s) {
  if (s->n_chunks == s->cap_chunks) {
    size_t cap = s->cap_chunks ? s->cap_chunks * 2 : 16;
    void **p = realloc(s->chunks, cap * sizeof *p);
    if (!p)
      return -1;
    s->chunks = p;
    s->cap_chunks = cap;
  }
  char *c = malloc(s->chunk);
  if (!c)
    return -1;
  s->chunks[s->n_chunks++] = c;
  s->next = c;
  s->end = c + s->chunk - s->chunk % s->size;
  POISON(c, s->chunk);
  return 0;
}

void *cph_slab_alloc(cph_slab *s) {
  void *p;
  if (s->free_list) {
    p = s->free_list;
    UNPOISON(p, s->size);
    memcpy(&s->free_list, p, sizeof(void *));
  } else {
    if (s->next == s->end && add_chunk(s) != 0)
      return NULL;
    p = s->next;
    s->next += s->size;
    UNPOISON(p, s->size);
  }
  memset(p, 0, s->size);
  s->live++;
  return p;
}

void cph_slab_free(cph_slab *s, void *p) {
  if (!p)
    return;
  memcpy(p, &s->free_list, sizeof(void *));
  s->free_list = p;
  s->live--;
  POISON(p, s->size);
}

void cph_slab_destroy(cph_slab *s) {
  for (size_t i = 0; i < s->n_chunks; i++) {
    UNPOISON(s->chunks[i], s->chunk);
    free(s->chunks[i]);
  }
  free(s->chunks);
  size_t size = s->size;
  cph_slab_init(s, size);
}

/* ---------------------------------------------------------------- strings */

void cph_strslab_init(cph_strslab *p) {
  for (size_t k = 0; k < CPH_STRSLAB_CLASSES; k++)
    cph_slab_init(&p->classes[k], 8 * (k + 1));
}

char *cph_strslab_dup(cph_strslab *p, const char *s) {
  size_t n = strlen(s) + 1;
  char *copy = n - 1 > CPH_STRSLAB_MAX ? malloc(n) : cph_slab_alloc(&p->classes[(n - 1) / 8]);
  if (copy)
    memcpy(copy, s, n);
  return copy;
}

void cph_strslab_free(cph_strslab *p, char *s) {
  if (!s)
    return;
  size_t n = strlen(s) + 1;
  if (n - 1 > CPH_STRSLAB_MAX)
    free(s);
  else
    cph_slab_free(&p->classes[(n - 1) / 8], s);
}

void cph_strslab_destroy(cph_strslab *p) {
  for (size_t k = 0; k < CPH_STRSLAB_CLASSES; k++)
    cph_slab_destroy(&p->classes[k]);
}
