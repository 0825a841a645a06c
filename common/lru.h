/* cph_lru — recency order for a cache: an intrusive doubly linked list, most recently used
 * first. The owner embeds a cph_lru_link in each entry it keeps, moves an entry to the front
 * when it is used (cph_lru_touch) and evicts from the back (cph_lru_last). Every operation is
 * O(1) and allocates nothing. */
#ifndef CEPHALON_COMMON_LRU_H
#define CEPHALON_COMMON_LRU_H

#include <stddef.h>

typedef struct cph_lru_link {
  struct cph_lru_link *prev, *next; /* toward the most / least recently used */
} cph_lru_link;

typedef struct cph_lru {
  cph_lru_link *first, *last; /* most and least recently used; NULL when empty */
} cph_lru;

/* The entry of type `type` whose member `member` is link; NULL for a NULL link. */
#define CPH_LRU_ENTRY(link, type, member)                                                      \
  ((link) ? (type *)(void *)((char *)(link) - offsetof(type, member)) : (type *)NULL)

static inline void cph_lru_unlink(cph_lru *l, cph_lru_link *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    l->first = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    l->last = e->prev;
  e->prev = e->next = NULL;
}

static inline void cph_lru_push_first(cph_lru *l, cph_lru_link *e) {
  e->prev = NULL;
  e->next = l->first;
  if (l->first)
    l->first->prev = e;
  l->first = e;
  if (!l->last)
    l->last = e;
}

/* e (in the list) is used now. */
static inline void cph_lru_touch(cph_lru *l, cph_lru_link *e) {
  if (l->first != e) {
    cph_lru_unlink(l, e);
    cph_lru_push_first(l, e);
  }
}

#endif
