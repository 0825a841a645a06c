/* evcache — what a turn's history shows of recent events (sender, body, time), kept in memory
 * so that building a turn does not read and decode the same events from LMDB turn after turn.
 *
 * Direct-mapped on the event id (ids are sequential, so recent events rarely collide); a bounded
 * number of slots, each holding copies of the strings. Pass thread only.
 *
 * Contract (the cache must never show what the store does not hold):
 * - every change to a stored event (retention's redaction or deletion) drops its entry;
 * - the whole cache is cleared when a pass commit fails (ids handed out in the failed pass are
 *   issued again) and whenever the engine rebuilds its memory from the store. */
#ifndef CEPHALON_CORE_EVCACHE_H
#define CEPHALON_CORE_EVCACHE_H

#include <stdint.h>

typedef struct cph_evcache_entry {
  uint64_t id; /* 0: empty */
  int64_t ts_ms;
  char *sender;
  char *body; /* NULL: the payload was dropped or redacted */
} cph_evcache_entry;

typedef struct cph_evcache {
  cph_evcache_entry *slots; /* allocated on first put: an idle engine pays nothing */
  uint64_t n_slots;         /* a power of two */
  uint64_t generation; /* +1 on every drop and clear: what holds events elsewhere (chantail.h)
                        * learns from it that one may have changed */
} cph_evcache;

void cph_evcache_init(cph_evcache *c, uint64_t n_slots);
/* The entry for id, or NULL. Valid until the next put, drop or clear. */
const cph_evcache_entry *cph_evcache_get(cph_evcache *c, uint64_t id);
/* Copies the fields in (evicting whatever shared the slot); does nothing on allocation failure. */
void cph_evcache_put(cph_evcache *c, uint64_t id, int64_t ts_ms, const char *sender,
                     const char *body);
void cph_evcache_drop(cph_evcache *c, uint64_t id);
void cph_evcache_clear(cph_evcache *c); /* empties it, keeps its size */
void cph_evcache_free(cph_evcache *c);

#endif
