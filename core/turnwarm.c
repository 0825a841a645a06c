/* A session's kept turns, warm (contract in turnwarm.h). */
#include "turnwarm.h"

#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

/* ---------------------------------------------------------------- the set of turnwarms */

static void turnwarm_free(turnwarm *w) {
  for (size_t i = 0; i < w->n_turns; i++)
    free(w->turns[i].dies);
  free(w->turns);
  free(w->cur);
  free(w->slots);
  for (int l = 0; l < 2; l++) {
    free(w->items[l].v);
    free(w->next[l].v);
  }
  cph_buf_free(&w->bytes);
  free(w->session);
  free(w);
}

static turnwarm *warm_of(cph_lru_link *l) { return CPH_LRU_ENTRY(l, turnwarm, lru); }

void turnwarms_init(cph_turnwarms *tw, size_t max_bytes) {
  *tw = (cph_turnwarms){CPH_HMAP_INIT, {NULL, NULL}, 0, max_bytes};
}

/* Takes w out of the set: freed, or marked dead while a job pins it (turnwarm.h). */
static void evict(cph_turnwarms *tw, turnwarm *w) {
  cph_hmap_del(&tw->by_session, w->session);
  cph_lru_unlink(&tw->lru, &w->lru);
  tw->bytes -= w->held;
  w->held = 0;
  if (w->pins)
    atomic_store(&w->dead, true);
  else
    turnwarm_free(w);
}

void turnwarms_clear(cph_turnwarms *tw) {
  while (tw->lru.first)
    evict(tw, warm_of(tw->lru.first));
}

void turnwarms_free(cph_turnwarms *tw) {
  turnwarms_clear(tw);
  cph_hmap_free(&tw->by_session);
}

turnwarm *turnwarms_get(cph_turnwarms *tw, const char *session) {
  turnwarm *w = cph_hmap_get(&tw->by_session, session);
  if (w)
    cph_lru_touch(&tw->lru, &w->lru);
  return w;
}

void turnwarms_drop(cph_turnwarms *tw, const char *session) {
  turnwarm *w = cph_hmap_get(&tw->by_session, session);
  if (w)
    evict(tw, w);
}

int turnwarms_fresh(cph_turnwarms *tw, const char *session, turnwarm **out) {
  turnwarms_drop(tw, session);
  turnwarm *w = calloc(1, sizeof *w);
  if (w)
    atomic_init(&w->dead, false);
  if (!w || !(w->session = strdup(session))) {
    free(w);
    return CPH_ENOMEM;
  }
  w->bytes = (cph_buf)CPH_BUF_INIT;
  if (cph_hmap_put(&tw->by_session, w->session, w) != CPH_OK) {
    turnwarm_free(w);
    return CPH_ENOMEM;
  }
  cph_lru_push_first(&tw->lru, &w->lru);
  *out = w;
  return CPH_OK;
}

static size_t turnwarm_bytes(const turnwarm *w) {
  size_t b = sizeof *w + w->cap_turns * sizeof *w->turns + w->cap_cur * sizeof *w->cur +
             (w->slots ? (w->mask + 1) * sizeof *w->slots : 0);
  for (size_t i = 0; i < w->n_turns; i++)
    b += w->turns[i].cap_dies * sizeof *w->turns[i].dies;
  for (int l = 0; l < 2; l++)
    b += (w->items[l].cap + w->next[l].cap) * sizeof(tw_item);
  return b + w->bytes.cap;
}

/* Measures w again (not while pinned: a job may be changing it; its unpin measures it). */
static void measure(cph_turnwarms *tw, turnwarm *w) {
  tw->bytes -= w->held;
  w->held = turnwarm_bytes(w);
  tw->bytes += w->held;
}

void turnwarms_release(cph_turnwarms *tw) {
  turnwarm *w = warm_of(tw->lru.first);
  if (w && !w->pins) /* only the most recently used one changed since the last release */
    measure(tw, w);
  for (cph_lru_link *l = tw->lru.last; l && tw->bytes > tw->max_bytes;) {
    cph_lru_link *newer = l->prev;
    if (!warm_of(l)->pins)
      evict(tw, warm_of(l));
    l = newer;
  }
}

void turnwarms_pin(turnwarm *w) { w->pins++; }

void turnwarms_unpin(cph_turnwarms *tw, turnwarm *w) {
  if (--w->pins)
    return;
  if (atomic_load(&w->dead))
    turnwarm_free(w);
  else
    measure(tw, w);
}

bool turnwarm_dead(const turnwarm *w) { return atomic_load(&w->dead); }

/* ---------------------------------------------------------------- rows and turns */

uint64_t turnwarm_newest(const turnwarm *w) {
  return w->n_turns ? w->turns[w->n_turns - 1].id : 0;
}

/* The row's slot, or the empty one where it would go (the table is never full). */
static size_t slot_of(const turnwarm *w, uint64_t row) {
  size_t i = (size_t)row & w->mask;
  while (w->slots[i].last && w->slots[i].row != row)
    i = (i + 1) & w->mask;
  return i;
}

/* The newest kept turn naming row (0: none is held). */
static uint64_t last_of(const turnwarm *w, uint64_t row) {
  return w->slots ? w->slots[slot_of(w, row)].last : 0;
}

/* Doubles the table (or makes the first) so that it stays at most half full. */
static int slots_grow(turnwarm *w) {
  size_t cap = w->slots ? 2 * (w->mask + 1) : 1024;
  tw_slot *old = w->slots;
  size_t old_cap = old ? w->mask + 1 : 0;
  if (!(w->slots = calloc(cap, sizeof *w->slots))) {
    w->slots = old;
    return CPH_ENOMEM;
  }
  w->mask = cap - 1;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].last)
      w->slots[slot_of(w, old[i].row)] = old[i];
  free(old);
  return CPH_OK;
}

bool turnwarm_held_like(const turnwarm *w, uint64_t row, unsigned bits, uint64_t *found) {
  if (!w->slots)
    return false;
  const uint64_t low = bits >= 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
  const tw_slot *like = NULL;
  /* every name sharing row's low bits is homed where row is (the mask is far below 2^bits), and
   * linear probing keeps the slots from a home to the next empty one together */
  for (size_t i = (size_t)row & w->mask; w->slots[i].last; i = (i + 1) & w->mask) {
    if (w->slots[i].row == row) {
      *found = row;
      return true;
    }
    if (!like && (w->slots[i].row & low) == (row & low))
      like = &w->slots[i];
  }
  if (like)
    *found = like->row;
  return like != NULL;
}

uint32_t *turnwarm_claim(turnwarm *w, uint64_t row, uint64_t turn, uint64_t *was) {
  if ((!w->slots || 2 * (w->used + 1) > w->mask + 1) && slots_grow(w) != CPH_OK)
    return NULL;
  tw_slot *s = &w->slots[slot_of(w, row)];
  if (!s->last) {
    w->used++;
    *s = (tw_slot){row, 0, 0};
  }
  *was = s->last;
  s->last = turn;
  return &s->code;
}

/* Removes row (linear probing: the entries after it that would no longer be found move back,
 * so there are no tombstones). */
static void forget_row(turnwarm *w, uint64_t row) {
  size_t i = slot_of(w, row);
  if (!w->slots[i].last)
    return;
  w->used--;
  for (size_t j = (i + 1) & w->mask;; j = (j + 1) & w->mask) {
    w->slots[i].last = 0;
    if (!w->slots[j].last)
      return;
    size_t home = (size_t)w->slots[j].row & w->mask;
    /* j's entry may fill the hole at i unless its home lies cyclically in (i, j] */
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays)
      continue;
    w->slots[i] = w->slots[j];
    i = j;
  }
}

static int u64_push(uint64_t **v, size_t *n, size_t *cap, uint64_t x) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 16;
    uint64_t *p = realloc(*v, c * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    *v = p;
    *cap = c;
  }
  (*v)[(*n)++] = x;
  return CPH_OK;
}

int turnwarm_advance(turnwarm *w, uint64_t turn, bool has_rows, const uint64_t *rows, size_t n) {
  if (w->n_turns) {
    tw_turn *prev = &w->turns[w->n_turns - 1];
    for (size_t i = 0; i < w->n_cur; i++)
      if (last_of(w, w->cur[i]) == prev->id &&
          u64_push(&prev->dies, &prev->n_dies, &prev->cap_dies, w->cur[i]) != CPH_OK)
        return CPH_ENOMEM;
  }
  if (w->n_turns == w->cap_turns) {
    size_t c = w->cap_turns ? 2 * w->cap_turns : 8;
    tw_turn *p = realloc(w->turns, c * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    w->turns = p;
    w->cap_turns = c;
  }
  if (n > w->cap_cur) {
    uint64_t *p = realloc(w->cur, n * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    w->cur = p;
    w->cap_cur = n;
  }
  if (n)
    memcpy(w->cur, rows, n * sizeof *rows);
  w->n_cur = n;
  if (!has_rows) /* the items are the newest turn's only: a turn without rows has none, and
                    rows its successor took from older items might no longer be held */
    w->items[0].n = w->items[1].n = 0;
  w->turns[w->n_turns++] = (tw_turn){turn, NULL, 0, 0, has_rows};
  return CPH_OK;
}

int turnwarm_trim_oldest(turnwarm *w, int (*gone)(void *ctx, uint64_t row), void *ctx) {
  if (w->n_turns < 2)
    return CPH_OK;
  tw_turn *o = &w->turns[0];
  for (size_t i = 0; i < o->n_dies; i++) {
    if (last_of(w, o->dies[i]) != o->id)
      continue; /* a later turn names it again */
    int rc = gone(ctx, o->dies[i]);
    if (rc)
      return rc;
    forget_row(w, o->dies[i]);
  }
  free(o->dies);
  memmove(w->turns, w->turns + 1, (w->n_turns - 1) * sizeof *w->turns);
  w->n_turns--;
  return CPH_OK;
}

/* ---------------------------------------------------------------- items */

/* Whether a[0..n) equals b[0..n), for the keys' short strings: whole words (the last two
 * overlapping when n is not a multiple of their size), no call. */
static bool short_eq(const char *a, const char *b, size_t n) {
  uint64_t x, y;
  if (n >= 8) {
    for (size_t i = 0; i + 8 < n; i += 8) {
      memcpy(&x, a + i, 8);
      memcpy(&y, b + i, 8);
      if (x != y)
        return false;
    }
    memcpy(&x, a + n - 8, 8);
    memcpy(&y, b + n - 8, 8);
    return x == y;
  }
  if (n >= 4) {
    uint32_t u, v, u2, v2;
    memcpy(&u, a, 4);
    memcpy(&v, b, 4);
    memcpy(&u2, a + n - 4, 4);
    memcpy(&v2, b + n - 4, 4);
    return u == v && u2 == v2;
  }
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i])
      return false;
  return true;
}

static bool item_is(const turnwarm *w, const tw_item *c, const tw_key *k) {
  const char *b = w->bytes.data + c->off;
  return c->id == k->id && c->kind == k->kind && c->n_text == k->n_text && c->n1 == k->n1 &&
         c->n2 == k->n2 && short_eq(b, k->s1, k->n1) && short_eq(b + k->n1, k->s2, k->n2) &&
         memcmp(b + k->n1 + k->n2, k->text, k->n_text) == 0;
}

const tw_item *turnwarm_find(const turnwarm *w, int l, size_t *pos, const tw_key *k) {
  const tw_items *it = &w->items[l];
  for (size_t j = *pos; j < it->n && j < *pos + TW_SCAN; j++)
    if (item_is(w, &it->v[j], k)) {
      *pos = j + 1;
      return &it->v[j];
    }
  return NULL;
}

int turnwarm_add_item(turnwarm *w, int l, const tw_key *k, const tw_item *same, uint64_t row,
                      uint64_t chash) {
  tw_items *it = &w->next[l];
  if (it->n == it->cap) {
    size_t c = it->cap ? 2 * it->cap : 256;
    tw_item *p = realloc(it->v, c * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    it->v = p;
    it->cap = c;
  }
  size_t off = same ? same->off : w->bytes.len;
  if (!same) {
    cph_buf_append(&w->bytes, k->s1, k->n1);
    cph_buf_append(&w->bytes, k->s2, k->n2);
    cph_buf_append(&w->bytes, k->text, k->n_text);
    if (cph_buf_error(&w->bytes))
      return CPH_ENOMEM;
  }
  it->v[it->n++] =
      (tw_item){k->id, row, chash, k->kind, (uint32_t)k->n1, (uint32_t)k->n2, k->n_text, off};
  return CPH_OK;
}

static size_t item_len(const tw_item *c) { return c->n1 + c->n2 + c->n_text; }

void turnwarm_items_done(turnwarm *w) {
  size_t live = 0;
  for (int l = 0; l < 2; l++) {
    tw_items t = w->items[l];
    w->items[l] = w->next[l];
    w->next[l] = t;
    w->next[l].n = 0;
    for (size_t i = 0; i < w->items[l].n; i++)
      live += item_len(&w->items[l].v[i]);
  }
  /* the keys no item names any more are dropped once they outweigh the live ones */
  if (w->bytes.len <= 2 * live + TW_SLACK)
    return;
  cph_buf b = CPH_BUF_INIT;
  if (!cph_buf_grow(&b, live)) { /* out of memory: no items, every row is hashed again */
    w->items[0].n = w->items[1].n = 0;
    cph_buf_reset(&w->bytes);
    return;
  }
  for (int l = 0; l < 2; l++)
    for (size_t i = 0; i < w->items[l].n; i++) {
      tw_item *c = &w->items[l].v[i];
      size_t off = b.len;
      cph_buf_append(&b, w->bytes.data + c->off, item_len(c));
      c->off = off;
    }
  cph_buf_free(&w->bytes);
  w->bytes = b;
}
