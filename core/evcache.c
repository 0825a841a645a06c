/* evcache: recent events' history fields in memory (contract in evcache.h). */
#include "evcache.h"

#include <stdlib.h>
#include <string.h>

void cph_evcache_init(cph_evcache *c, uint64_t n_slots) {
  memset(c, 0, sizeof *c); /* generation 0 */
  uint64_t n = 1;
  while (n < n_slots)
    n <<= 1;
  c->n_slots = n;
}

static void entry_clear(cph_evcache_entry *s) {
  free(s->sender);
  free(s->body);
  memset(s, 0, sizeof *s);
}

const cph_evcache_entry *cph_evcache_get(cph_evcache *c, uint64_t id) {
  if (c->slots && id) {
    const cph_evcache_entry *s = &c->slots[id & (c->n_slots - 1)];
    if (s->id == id)
      return s;
  }
  return NULL;
}

void cph_evcache_put(cph_evcache *c, uint64_t id, int64_t ts_ms, const char *sender,
                     const char *body) {
  if (!id || !c->n_slots || !sender)
    return;
  if (!c->slots && !(c->slots = calloc(c->n_slots, sizeof *c->slots)))
    return;
  cph_evcache_entry *s = &c->slots[id & (c->n_slots - 1)];
  entry_clear(s);
  char *sender_copy = strdup(sender);
  char *body_copy = body ? strdup(body) : NULL;
  if (!sender_copy || (body && !body_copy)) {
    free(sender_copy);
    free(body_copy);
    return;
  }
  *s = (cph_evcache_entry){id, ts_ms, sender_copy, body_copy};
}

void cph_evcache_drop(cph_evcache *c, uint64_t id) {
  c->generation++;
  if (!c->slots || !id)
    return;
  cph_evcache_entry *s = &c->slots[id & (c->n_slots - 1)];
  if (s->id == id)
    entry_clear(s);
}

void cph_evcache_clear(cph_evcache *c) {
  c->generation++;
  if (!c->slots)
    return;
  for (uint64_t i = 0; i < c->n_slots; i++)
    if (c->slots[i].id)
      entry_clear(&c->slots[i]);
}

void cph_evcache_free(cph_evcache *c) {
  cph_evcache_clear(c);
  free(c->slots);
  c->slots = NULL;
}
