/* lanes/ — where the scheduler keeps each session: the sid → slot indirection (sched.c).
 *
 * A sid is the handle the scheduler gives a caller, and never changes while the session
 * lives; a slot is the session's place in the scheduler's array. Until tenants come on the two
 * are the same number and no map is kept (the scheduler does not create one). From then on
 * the runnable sessions of one (tenant, lane) group are served one after another in runs
 * (sched.h, "Runs"), and the slots of a group's sessions are handed out from chunks of
 * CPH_SLOT_CHUNK consecutive slots of its own (a pool), so that a run's sessions lie side by
 * side in memory instead of one per cache line and page all over the array
 * (bench/PROFILE.md). A session that changes tenant moves to a slot of its new group's pool.
 *
 * This module keeps the two maps, the free sids and each pool's free slots; the sessions
 * themselves are the scheduler's. It allocates only in cph_slotmap_reserve and
 * cph_slotmap_sid_new/free's growth: taking and giving back slots never does. */
#ifndef CEPHALON_LANES_SLOTMAP_H
#define CEPHALON_LANES_SLOTMAP_H

#include <stdbool.h>
#include <stdint.h>

#define CPH_SLOT_NONE UINT32_MAX

/* Slots a pool takes at a time: 16 sessions of 48 bytes are 12 cache lines, about a run's
 * picks (CPH_SCHED_TENANT_RUN_DEFAULT); a pool wastes at most CPH_SLOT_CHUNK - 1 slots. */
enum { CPH_SLOT_CHUNK = 16 };

/* The slots of one group: a free list (threaded through sid_of) and the rest of its newest
 * chunk. Zero-initialised it is not valid: cph_slot_pool_init. */
typedef struct cph_slot_pool {
  uint32_t free;      /* the first free slot, CPH_SLOT_NONE when none */
  uint32_t next, end; /* slots [next, end) of its chunk not handed out yet */
} cph_slot_pool;

typedef struct cph_slotmap {
  uint32_t *slot_of; /* by sid: its session's slot; CPH_SLOT_NONE for a free sid */
  /* by slot: the sid of the session there; CPH_SLOT_NONE for a slot kept for the stale entries
   * that name it, or not handed out yet; for a free slot, the next free slot of its pool */
  uint32_t *sid_of;
  uint32_t n_sids, cap_sids;   /* sids ever handed out (below n_sids), and room */
  uint32_t n_slots, cap_slots; /* slots in chunks (below n_slots), and room */
  uint32_t *free_sids;         /* sids to hand out again */
  uint32_t n_free_sids;        /* the list has room for cap_sids */
} cph_slotmap;

void cph_slot_pool_init(cph_slot_pool *p);

/* Starts the maps as the identity over n slots (sids 0..n-1 at slots 0..n-1), with room for
 * cap slots and sids (cap >= n). CPH_OK or CPH_ENOMEM (the map stays empty). */
int cph_slotmap_init(cph_slotmap *m, uint32_t n, uint32_t cap);
void cph_slotmap_free(cph_slotmap *m);

/* Room for cap slots and cap sids without growing. CPH_OK or CPH_ENOMEM (nothing changed). */
int cph_slotmap_reserve(cph_slotmap *m, uint32_t cap);

/* A sid to hand out: a free one, or the next new one; CPH_SLOT_NONE when n_sids would pass
 * cap_sids (reserve first). Its slot is CPH_SLOT_NONE until cph_slotmap_bind. */
uint32_t cph_slotmap_sid_new(cph_slotmap *m);
/* The sid's session is gone: it may be handed out again (its slot is the caller's business). */
void cph_slotmap_sid_free(cph_slotmap *m, uint32_t sid);

/* A slot of pool p: a free one of the pool, else the next of its chunk, else the first of a new
 * chunk; CPH_SLOT_NONE when a new chunk would pass cap_slots (reserve first). A new chunk's
 * slots are [n_slots, n_slots + CPH_SLOT_CHUNK) before the call. */
uint32_t cph_slotmap_take(cph_slotmap *m, cph_slot_pool *p);
/* Whether cph_slotmap_take(m, p) has a slot without growing the map. */
bool cph_slotmap_can_take(const cph_slotmap *m, const cph_slot_pool *p);
/* The slot goes back to pool p's free list. */
void cph_slotmap_give(cph_slotmap *m, cph_slot_pool *p, uint32_t slot);

/* The session of sid is at slot from now on (either may have been elsewhere). */
static inline void cph_slotmap_bind(cph_slotmap *m, uint32_t sid, uint32_t slot) {
  m->slot_of[sid] = slot;
  m->sid_of[slot] = sid;
}

/* No session is at slot any more, but the slot is not free either: stale entries name it, and
 * it is given back (cph_slotmap_give) when the last of them is dropped. */
static inline void cph_slotmap_keep(cph_slotmap *m, uint32_t slot) {
  m->sid_of[slot] = CPH_SLOT_NONE;
}

#endif
