/* Ingest (DESIGN §4, §5): a request's events stored, routed to their sessions' inboxes —
 * deduplicated, folded and counted, never dropped — and minted as memories. Private to core/.
 *
 * It owns two facts: whether the store was last found full (ingest then resumes only past a
 * margin) and how many events the queue caps folded over all sessions. It is handed the
 * modules it uses; the engine wires them after every (re)load of memory, since the dedupe
 * and backpressure states are rebuilt then. */
#ifndef CEPHALON_CORE_INGEST_H
#define CEPHALON_CORE_INGEST_H

#include <stdbool.h>
#include <stdint.h>

#include "env.h"
#include "memory.h"
#include "metrics.h"
#include "sessions.h"

struct cph_dedupe;
struct cph_backpressure;

typedef struct cph_ingest {
  cph_core_env *env;
  cph_sessions *sessions;
  struct cph_dedupe *dedupe;
  struct cph_backpressure *bp;
  cph_memory *memory;
  cph_metrics *metrics;
  /* chantail.h: the channels' warm tails, where a history copy is looked for (NULL: the
   * store is walked); the engine's, shared with context assembly (pass thread only). */
  struct cph_chantails *tails;
  bool store_full;       /* the store was found full; ingest resumes past a margin */
  uint64_t folded_total; /* cephalon_inbox_overflow_folded_total */
  uint64_t prepared_total; /* cephalon_ingest_prepared_events_total */
  /* Sessions whose running turn the last ingest_apply superseded (while_running :restart,
   * DESIGN §4), each once: the engine hands them to turns (turns_supersede) right after,
   * then clears the list. Only a request that committed leaves any. */
  csession **restart;
  size_t n_restart, cap_restart;
  /* Forgetting idempotency keys (ingest_tick): the key the next sweep step starts at (none:
   * the first), the keys written since the last step, and when the next step is due. */
  cph_key idem_resume;
  bool idem_resuming;
  uint64_t idem_added;
  int64_t idem_next_ms;
} cph_ingest;

/* CPH_OP_INGEST, inside the pass: the request's events in one child txn of env->txn — a
 * failing request (a full store, say) stores none of its events and the others still
 * commit. Memory (inboxes, dedupe, the embed queue) follows only what landed. */
void ingest_apply(cph_ingest *ig, cph_op *op);

/* Frees what ingest_apply keeps between requests (the restart list); the sweep starts over. */
void ingest_free(cph_ingest *ig);

/* Forgets idempotency keys older than :dedupe :key-window-seconds (they no longer count:
 * a retry after the window is a new event), in a child txn of parent: at most once a second,
 * a step of the sweep through every stored key — 1,024 keys and twice as many as were written
 * since the last step (at most 262,144), so the sweep outruns the writes and no key outlives
 * its window by more than a sweep. Before, every keyed event (in cluster mode every event
 * and every copy of it) left its key on disk for good. A step whose commit fails is tried
 * again at the next. */
void ingest_tick(cph_ingest *ig, struct cph_txn *parent);

/* A channel name's most bytes (an event's channel, a direct channel's included). */
#define CPH_CHANNEL_MAX 256

/* Appends event_id to the channel's history (CPH_DB_CHANNEL_LOG) under its next index, which
 * goes to *index unless index is NULL. */
int history_append(cph_txn *t, const char *channel, uint64_t event_id, uint64_t *index);
/* Calls fn(ctx, index, event) for the newest `scan` entries of channel's history (index: the
 * entry's in the channel log), newest first, until fn returns false. CPH_OK or the store's
 * error. */
int history_tail(cph_txn *t, const char *channel, size_t scan,
                 bool (*fn)(void *ctx, uint64_t index, const cph_event_rec *ev), void *ctx);

#endif
