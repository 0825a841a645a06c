/* Memory accesses counted in memory, written in batches (memaccess.h). */
#include "memaccess.h"

#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"

#define MIN_CAP 64

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser: ids are sequential */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void memaccess_init(cph_memaccess *ma, int64_t now_ns) {
  memset(ma, 0, sizeof *ma);
  ma->flushed_ns = now_ns;
}

void memaccess_free(cph_memaccess *ma) {
  free(ma->slots);
  free(ma->touched);
  memset(ma, 0, sizeof *ma);
}

static memaccess_slot *find(const cph_memaccess *ma, uint64_t id) {
  if (!ma->cap)
    return NULL;
  for (size_t i = mix(id) & (ma->cap - 1);; i = (i + 1) & (ma->cap - 1)) {
    if (ma->slots[i].id == id)
      return &ma->slots[i];
    if (!ma->slots[i].id)
      return NULL;
  }
}

/* The slot for id in slots of cap (a power of two with a free slot): its own or a free one. */
static memaccess_slot *place(memaccess_slot *slots, size_t cap, uint64_t id) {
  size_t i = mix(id) & (cap - 1);
  while (slots[i].id && slots[i].id != id)
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

/* Moves the slots that still count something into a table of at least min_cap slots (at
 * most half full). */
static int rebuild(cph_memaccess *ma, size_t min_cap) {
  size_t live = 0;
  for (size_t i = 0; i < ma->cap; i++)
    live += ma->slots[i].id && (ma->slots[i].done || ma->slots[i].pass);
  size_t cap = MIN_CAP;
  while (cap < min_cap || cap < 2 * live)
    cap *= 2;
  memaccess_slot *slots = calloc(cap, sizeof *slots);
  if (!slots)
    return CPH_ENOMEM;
  for (size_t i = 0; i < ma->cap; i++) {
    const memaccess_slot *s = &ma->slots[i];
    if (s->id && (s->done || s->pass))
      *place(slots, cap, s->id) = *s;
  }
  free(ma->slots);
  ma->slots = slots;
  ma->cap = cap;
  ma->len = live;
  return CPH_OK;
}

/* Room for one more id in the pass's touched list. */
static int touched_room(cph_memaccess *ma) {
  if (ma->n_touched < ma->cap_touched)
    return CPH_OK;
  size_t cap = ma->cap_touched ? 2 * ma->cap_touched : 64;
  uint64_t *t = realloc(ma->touched, cap * sizeof *t);
  if (!t)
    return CPH_ENOMEM;
  ma->touched = t;
  ma->cap_touched = cap;
  return CPH_OK;
}

int memaccess_note(cph_memaccess *ma, uint64_t id, int64_t now_ms) {
  if (!id)
    return CPH_OK;
  memaccess_slot *s = find(ma, id);
  if ((!s || !s->pass) && touched_room(ma) != CPH_OK)
    return CPH_ENOMEM;
  if (!s) {
    if (2 * (ma->len + 1) > ma->cap && rebuild(ma, 2 * (ma->len + 1)) != CPH_OK)
      return CPH_ENOMEM;
    s = place(ma->slots, ma->cap, id);
    *s = (memaccess_slot){.id = id};
    ma->len++;
  }
  if (!s->pass)
    ma->touched[ma->n_touched++] = id;
  if (s->pass < UINT32_MAX)
    s->pass++;
  if (now_ms > s->pass_ms)
    s->pass_ms = now_ms;
  return CPH_OK;
}

void memaccess_pending(const cph_memaccess *ma, uint64_t id, uint64_t *count, int64_t *last_ms) {
  const memaccess_slot *s = find(ma, id);
  *count = 0;
  *last_ms = 0;
  if (!s)
    return;
  *count = (ma->flushing ? 0 : (uint64_t)s->done) + s->pass;
  *last_ms = s->pass_ms;
  if (!ma->flushing && s->last_ms > *last_ms)
    *last_ms = s->last_ms;
}

bool memaccess_flush_due(const cph_memaccess *ma, int64_t now_ns) {
  return ma->len && !ma->flushing && !ma->n_touched &&
         (ma->len >= MEMACCESS_FLUSH_LEN || now_ns - ma->flushed_ns >= MEMACCESS_FLUSH_NS);
}

bool memaccess_flush_allowed(const cph_memaccess *ma) { return !ma->flushing && !ma->n_touched; }

bool memaccess_next_done(const cph_memaccess *ma, size_t *cursor, uint64_t *id, uint64_t *count,
                         int64_t *last_ms) {
  for (; *cursor < ma->cap; (*cursor)++) {
    const memaccess_slot *s = &ma->slots[*cursor];
    if (s->id && s->done) {
      *id = s->id;
      *count = s->done;
      *last_ms = s->last_ms;
      (*cursor)++;
      return true;
    }
  }
  return false;
}

void memaccess_flushed(cph_memaccess *ma) { ma->flushing = true; }

void memaccess_pass_end(cph_memaccess *ma, bool committed, int64_t now_ns) {
  /* A committed flush put every done count in the records; the notes of the pass all came
   * after it (a flush runs only before any: memaccess_flush_allowed), so they alone stay
   * pending. */
  bool flushed = ma->flushing && committed;
  if (flushed)
    for (size_t i = 0; i < ma->cap; i++)
      ma->slots[i].done = 0, ma->slots[i].last_ms = 0;
  for (size_t i = 0; i < ma->n_touched; i++) {
    memaccess_slot *s = find(ma, ma->touched[i]);
    if (!s)
      continue;
    if (committed) {
      uint64_t done = (uint64_t)s->done + s->pass;
      s->done = done > UINT32_MAX ? UINT32_MAX : (uint32_t)done;
      if (s->pass_ms > s->last_ms)
        s->last_ms = s->pass_ms;
    }
    s->pass = 0;
    s->pass_ms = 0;
  }
  ma->n_touched = 0;
  ma->flushing = false; /* a flush that did not commit left its counts pending */
  if (flushed) {
    ma->flushed_ns = now_ns;
    (void)rebuild(ma, MIN_CAP); /* on ENOMEM the zeroed slots stay: harmless, dropped later */
  }
}
