/* Compaction (DESIGN §7): gc_plan -> gc_summarize -> gc_commit, with plan locks and the
 * group-hash gate. Private to core/.
 *
 * gc keeps nothing in memory: its state is the gc groups and the memories' plan locks in
 * LMDB. It is below the maintenance jobs (maint.c), which run its steps as job turns and hand
 * it what it uses: the env (policy, store), the memories (minting, the embed queue) and a way
 * to queue the next step's job (gc_jobs). Each step runs in a pass, in the transaction maint
 * gives it (the summariser itself runs on a worker thread between gc_summarize's prepare and
 * apply), and each step queues the next. gc never calls up into maint: what a commit changed
 * is returned (gc_commit_result) and maint counts it. */
#ifndef CEPHALON_CORE_GC_H
#define CEPHALON_CORE_GC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "env.h"
#include "memory.h"
#include "store/store.h"

/* How gc queues a job (the next step of a group, or a new gc_plan after an abort): writes a
 * queued job record in t; the job joins its session's queue in memory only once t commits
 * (maint.h: maint_job_write). */
typedef struct gc_jobs {
  void *ctx;
  int (*write)(void *ctx, cph_txn *t, cph_job_kind_t kind, const char *args, uint64_t group_id);
} gc_jobs;

/* What the gc steps are handed; set once by their owner (maint) and read only. */
typedef struct cph_gc {
  const cph_core_env *env; /* the policy (:gc, the embedder's model, the index's shards) */
  cph_memory *memory;      /* summaries are minted here; tombstoned sources leave its embed queue */
  gc_jobs jobs;
} cph_gc;

/* A gc_commit's outcome, for the caller to count. committed is false when the group was
 * aborted or had nothing to commit; then the counts are 0. */
typedef struct gc_commit_result {
  bool committed;
  uint64_t deleted;      /* sources tombstoned */
  uint64_t outbox_items; /* vector deletes queued on the outbox (their embedded sources) */
  int64_t now_ms;        /* the wall time written as the items' created_ms */
} gc_commit_result;

/* Tombstones memory m (read from t) in t: deleted, replaced_by its summary (0: none known), its
 * vector's delete queued on the outbox (*outbox_items counts it) when it was embedded, or its
 * embedding unqueued when it was waiting. What gc_commit does to each source; a takeover does
 * it to a memory the old owner compacted after the new one imported it (core/handover.c). */
int gc_tombstone(cph_memory *mem, const cph_policy *policy, cph_txn *t, cph_memory_rec *m,
                 uint64_t replaced_by, int64_t now_ms, uint64_t *outbox_items);

/* ---- the steps' apply phase: each writes in t (the pass's or a completion's child txn) */

/* gc_plan: args "sources=3,4,5" plans that explicit group (CPH_EINVAL, reason in t->err,
 * for a source that is missing or deleted, or fewer than two); otherwise the automatic plan
 * from :gc. Each planned group takes its sources' plan locks and queues its gc_summarize. */
int gc_plan_apply(const cph_gc *gc, cph_txn *t, const char *args);
/* gc_summarize, before the worker runs: the group's source texts into w (none when the group
 * is gone or no longer planned). */
int gc_summarize_prepare(const cph_gc *gc, cph_txn *t, uint64_t group_id, cph_job_work *w);
/* gc_summarize, after: stores w's summary on the planned group and queues its gc_commit. */
int gc_summarize_apply(const cph_gc *gc, cph_txn *t, uint64_t group_id, const cph_job_work *w);
/* gc_commit, in one transaction: the gate (the group is summarised, no source deleted, the
 * recomputed hash equal), then the summary memory, the tombstones and one outbox vector delete
 * per embedded source. Any mismatch aborts the group instead (locks released, a new gc_plan
 * queued). *out says what committed. Memory (the embed queue's length) is changed here, before
 * t commits, as memory_mint does. */
int gc_commit_apply(const cph_gc *gc, cph_txn *t, uint64_t group_id, gc_commit_result *out);

/* group_hash = hex(sha256(join(sorted(source_ids), ",") + "|" + newest_ts_ms + "|" +
 * total_tokens_est)), ids ascending as numbers, every number in decimal, lower-case hex. */
void gc_group_hash(const uint64_t *sorted_ids, size_t n, int64_t newest_ts_ms,
                   uint64_t total_tokens, char out[65]);

/* ---- reads (cph_engine_gc_group, cph_engine_gc_groups), each in its own read txn */
int gc_group(cph_store *store, uint64_t id, cph_gc_group_info *out, cph_err *err);
/* Newest first; limit 0 means 100, at most 1000. */
int gc_groups(cph_store *store, const char *state, size_t limit, cph_gc_group_info **out,
              size_t *n, cph_err *err);

#endif
