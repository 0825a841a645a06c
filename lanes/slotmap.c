/* The sid -> slot indirection of the scheduler (contract in slotmap.h). */
#include "slotmap.h"

#include <stdlib.h>

#include "cephalon/error.h"

void cph_slot_pool_init(cph_slot_pool *p) {
  p->free = CPH_SLOT_NONE;
  p->next = p->end = 0;
}

int cph_slotmap_init(cph_slotmap *m, uint32_t n, uint32_t cap) {
  *m = (cph_slotmap){0};
  if (cph_slotmap_reserve(m, cap < n ? n : cap) != CPH_OK) {
    cph_slotmap_free(m);
    return CPH_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++)
    m->slot_of[i] = m->sid_of[i] = i;
  m->n_sids = m->n_slots = n;
  return CPH_OK;
}

void cph_slotmap_free(cph_slotmap *m) {
  free(m->slot_of);
  free(m->sid_of);
  free(m->free_sids);
  *m = (cph_slotmap){0};
}

/* Grows one array of uint32_t to cap; false on OOM (the array is unchanged). */
static bool grow(uint32_t **a, uint32_t cap) {
  uint32_t *p = realloc(*a, (size_t)cap * sizeof *p);
  if (!p)
    return false;
  *a = p;
  return true;
}

int cph_slotmap_reserve(cph_slotmap *m, uint32_t cap) {
  if (cap > m->cap_sids) {
    if (!grow(&m->slot_of, cap) || !grow(&m->free_sids, cap))
      return CPH_ENOMEM; /* a grown array alone only has room to spare */
    m->cap_sids = cap;
  }
  if (cap > m->cap_slots) {
    if (!grow(&m->sid_of, cap))
      return CPH_ENOMEM;
    m->cap_slots = cap;
  }
  return CPH_OK;
}

uint32_t cph_slotmap_sid_new(cph_slotmap *m) {
  uint32_t sid;
  if (m->n_free_sids)
    sid = m->free_sids[--m->n_free_sids];
  else if (m->n_sids < m->cap_sids)
    sid = m->n_sids++;
  else
    return CPH_SLOT_NONE;
  m->slot_of[sid] = CPH_SLOT_NONE;
  return sid;
}

void cph_slotmap_sid_free(cph_slotmap *m, uint32_t sid) {
  m->slot_of[sid] = CPH_SLOT_NONE;
  m->free_sids[m->n_free_sids++] = sid; /* room for every sid: cap_sids */
}

bool cph_slotmap_can_take(const cph_slotmap *m, const cph_slot_pool *p) {
  return p->free != CPH_SLOT_NONE || p->next < p->end ||
         (uint64_t)m->n_slots + CPH_SLOT_CHUNK <= m->cap_slots;
}

uint32_t cph_slotmap_take(cph_slotmap *m, cph_slot_pool *p) {
  uint32_t slot;
  if (p->free != CPH_SLOT_NONE) {
    slot = p->free;
    p->free = m->sid_of[slot];
  } else if (p->next < p->end) {
    slot = p->next++;
  } else if ((uint64_t)m->n_slots + CPH_SLOT_CHUNK <= m->cap_slots) {
    slot = p->next = m->n_slots;
    p->end = m->n_slots += CPH_SLOT_CHUNK;
    for (uint32_t i = slot; i < p->end; i++)
      m->sid_of[i] = CPH_SLOT_NONE;
    p->next++;
  } else {
    return CPH_SLOT_NONE;
  }
  m->sid_of[slot] = CPH_SLOT_NONE;
  return slot;
}

void cph_slotmap_give(cph_slotmap *m, cph_slot_pool *p, uint32_t slot) {
  m->sid_of[slot] = p->free;
  p->free = slot;
}
