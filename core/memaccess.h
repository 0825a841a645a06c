/* Memory accesses (DESIGN §7: every inclusion of a memory in a turn context or a search result
 * increments its access_count and sets its last_access), counted in memory and written into
 * the memory records in batches. Private to core/; the memory module's state (memory.h).
 *
 * Why: a lease lists up to 48 memories, mostly the same ones lease after lease. Writing each
 * record back at every lease was 32 record puts and about 14 dirty pages per lease; counted
 * here, a second's accesses become one put per memory.
 *
 * Contract:
 *   - Reads that show or use the counts (a lease's recent_memory, search hits, gc_plan's
 *     :max-access test, the cluster handover's export) add what is pending
 *     (memaccess_pending), so every read sees every access made before it.
 *   - Accesses are noted by the operation that made them once its writes are in (the lease's
 *     or the search's child transaction committed): an operation that failed noted nothing.
 *     Notes count in the pass that made them; memaccess_pass_end says whether that pass
 *     committed, and a failed pass's notes are dropped with it.
 *   - The engine writes what is pending inside a pass (memory_flush_accesses, memory.h: this
 *     table only counts, the memory module writes records) once a second, when
 *     MEMACCESS_FLUSH_LEN memories wait, and at close. The flush adds each count to its record
 *     (a record rewritten meanwhile, by gc or an embedding, keeps its own fields) and sets
 *     last_access to the later of the two; a memory deleted since drops its count. The flushed
 *     counts leave the table only when the flush's pass committed.
 *   - A crash, or a failed commit of a flush, loses at most the counts of the last second
 *     before it: they decide only which old raw memories gc summarises, and no memory, event
 *     or reply depends on them. The README says so. */
#ifndef CEPHALON_CORE_MEMACCESS_H
#define CEPHALON_CORE_MEMACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>


/* A flush is due once a second, or as soon as this many memories wait. */
#define MEMACCESS_FLUSH_NS 1000000000LL
#define MEMACCESS_FLUSH_LEN 65536

typedef struct memaccess_slot {
  uint64_t id;      /* the memory; 0 = empty (memory ids start at 1) */
  uint32_t done;    /* accesses of committed passes not yet in the record */
  uint32_t pass;    /* accesses noted in the pass now running */
  int64_t last_ms;  /* the newest access of committed passes (wall ms) */
  int64_t pass_ms;  /* the newest access of the pass now running */
} memaccess_slot;

typedef struct cph_memaccess {
  memaccess_slot *slots;
  size_t cap; /* a power of two, or 0 */
  size_t len; /* slots in use */
  uint64_t *touched; /* ids noted in the running pass (each once) */
  size_t n_touched, cap_touched;
  bool flushing;      /* the running pass's transaction holds a flush of every done count */
  int64_t flushed_ns; /* engine clock of the last flush that committed (or of open) */
} cph_memaccess;

void memaccess_init(cph_memaccess *ma, int64_t now_ns);
void memaccess_free(cph_memaccess *ma);

/* One access to memory id at wall time now_ms, by an operation of the running pass whose
 * writes are in. CPH_OK or CPH_ENOMEM (then the access is not counted; the caller warns). */
int memaccess_note(cph_memaccess *ma, uint64_t id, int64_t now_ms);

/* What is pending for memory id over its stored record: *count accesses, the newest at
 * *last_ms (0 when none). Adds nothing once this pass flushed, but what the pass noted
 * since. */
void memaccess_pending(const cph_memaccess *ma, uint64_t id, uint64_t *count, int64_t *last_ms);

/* Whether a flush is due (above) at engine time now_ns. */
bool memaccess_flush_due(const cph_memaccess *ma, int64_t now_ns);

/* The flush's side of the table (memory_flush_accesses). A flush may run only before the
 * pass noted anything and once a pass: then every note of the pass comes after it. */
bool memaccess_flush_allowed(const cph_memaccess *ma);
/* The next memory with accesses of committed passes pending, from *cursor (start at 0): its
 * id, count and newest access. false when there is none left. */
bool memaccess_next_done(const cph_memaccess *ma, size_t *cursor, uint64_t *id, uint64_t *count,
                         int64_t *last_ms);
/* Every done count is in the records of the running pass's transaction. */
void memaccess_flushed(cph_memaccess *ma);

/* The running pass ended: committed (its notes count from now on; a flush's counts leave the
 * table) or not (its notes and its flush are dropped). now_ns is the engine clock. */
void memaccess_pass_end(cph_memaccess *ma, bool committed, int64_t now_ns);

/* Memories with a count pending (tests, metrics). */
static inline size_t memaccess_len(const cph_memaccess *ma) { return ma->len; }

#endif
