/* Maintenance jobs (DESIGN §2, §7): the job queue on the maintenance session (the janitor),
 * job turns (prepare in the pass -> execute on a worker thread -> apply in a later pass), the
 * schedules from policy, embed_memory, outbox_drain with backoff and the trickle,
 * retention_redact_events and aggregate_upsert. Private to core/.
 *
 * It owns the schedules, the counters of the maintenance stats and the jobs written in a
 * transaction that has not committed yet; a job's place in its session's queue (csession
 * jobs, running_job) is kept on the session, and changed only here. It is handed, at open,
 * the env, the sessions registry (the janitor; its work flag), the memories (the embed queue)
 * and the event cache (retention drops what it redacts). The gc steps (gc.h) are below it: it
 * runs them as jobs, hands them a way to queue the next step, and counts what they commit.
 * The engine opens it after the sessions are loaded (and again after a failed commit, when
 * memory is rebuilt from the store), ticks it in reconcile and closes it. */
#ifndef CEPHALON_CORE_MAINT_H
#define CEPHALON_CORE_MAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "env.h"
#include "evcache.h"
#include "gc.h"
#include "memory.h"
#include "sessions.h"
#include "store/store.h"

/* A job written in a transaction that has not committed yet. */
typedef struct maint_pending_job {
  csession *session;
  uint64_t id;
  cph_job_kind_t kind;
} maint_pending_job;

typedef struct cph_maint {
  cph_core_env *env;
  cph_sessions *sessions; /* the janitor, whose queue the jobs join */
  cph_memory *memory;     /* the embed queue: scheduled from, shortened by embed_memory */
  cph_evcache *evcache;   /* retention drops the events it redacts or deletes */
  cph_gc gc;              /* the gc steps, handed env, memory and maint_job_write */
  int64_t next_gc_plan_ns;
  int64_t next_drain_ns;
  int64_t next_retention_ns;
  int64_t next_embed_ns; /* after a failed embed job: wait before the next (backoff) */
  uint64_t outbox_pending;
  int64_t outbox_oldest_ms; /* created_ms of the oldest pending item; 0 = none */
  uint64_t queued[CPH_JOBK_COUNT]; /* jobs queued or running, per kind */
  uint64_t groups_committed_total;
  uint64_t memories_deleted_total;
  uint64_t summaries_created_total;
  uint64_t retention_cursor; /* next event id the retention scan looks at */
  /* Jobs written in a transaction that has not committed yet: they join their session's
   * queue in memory only when it does (maint_pending_apply), or are forgotten. */
  maint_pending_job *pending;
  size_t n_pending, cap_pending;
} cph_maint;

/* Loads the jobs queued or running at shutdown into their sessions' queues (a running one,
 * whose lease was lost, is queued again), the outbox counters and the embed queue's length,
 * in a write txn of its own; then every session's work flag is updated. *out is set first,
 * even on failure: maint_close frees what was built. */
int maint_open(cph_core_env *env, cph_sessions *sessions, cph_memory *memory,
               cph_evcache *evcache, cph_maint **out, cph_err *err);
void maint_close(cph_maint *m); /* NULL is fine */

/* ---- the job queue */
/* Writes a queued job record in t on the janitor; memory follows with maint_pending_apply()
 * after t commits, or maint_pending_drop() if it aborts. CPH_ESTATE when there is no janitor. */
int maint_job_write(cph_maint *m, cph_txn *t, cph_job_kind_t kind, const char *args,
                    uint64_t group_id, uint64_t *id_out);
/* After the transaction holding maint_job_write()s commits / aborts. m may be NULL. */
void maint_pending_apply(cph_maint *m);
void maint_pending_drop(cph_maint *m);
/* Enqueues in its own child txn of the pass (for reconcile and job steps); id_out may be
 * NULL. */
int maint_enqueue(cph_maint *m, cph_job_kind_t kind, const char *args, uint64_t group_id,
                  uint64_t *id_out);

/* n outbox items were queued at now_ms outside a job (a takeover's tombstones,
 * core/handover.h): the drain is scheduled for them as for a gc_commit's. */
void maint_outbox_queued(cph_maint *m, uint64_t n, int64_t now_ms);

/* ---- job turns */
/* A job turn is starting: chooses the job (the outbox batch for a trickle pick), prepares its
 * work in t and marks it running. CPH_ENOTFOUND when the session has no runnable job. */
int maint_job_start(cph_maint *m, cph_txn *t, csession *s, bool trickle, uint64_t turn_id,
                    cph_job_work **work_out, uint64_t *job_id_out);
/* After the lease's txn committed: the session runs job_id. */
void maint_job_started(cph_maint *m, csession *s, uint64_t job_id);
/* The job turn completed with executed work: applies it in t (the completion's child txn).
 * The job ends done, or failed with its reason (its own error does not spoil t); the counters
 * (outbox, embed queue, gc commits) and the embed backoff change here, before t commits.
 * *compacted: the group a gc_commit committed (its summary and tombstones, which cluster mode
 * puts as items: core/handover.h), else 0. */
int maint_job_apply(cph_maint *m, cph_txn *t, csession *s, uint64_t job_id, cph_job_work *w,
                    uint64_t *compacted);
/* After the completion committed (or the job failed for good): job_id leaves s's queue. */
void maint_job_finished(cph_maint *m, csession *s, uint64_t job_id);
/* The job turn's lease ended without completion: the job is queued again (or failed after
 * :leases :max-attempts). Writes in t. */
int maint_job_retry(cph_maint *m, cph_txn *t, csession *s, uint64_t job_id, const char *error,
                    bool *failed);

/* Schedules (gc_plan, outbox_drain, embed_memory, retention) and the trickle flag; from
 * reconcile, in the pass txn (env->txn). Does nothing when m is NULL or there is no janitor. */
void maint_tick(cph_maint *m);

/* ---- reads (cph_engine_jobs, cph_engine_outbox, cph_engine_maint_stats) */
/* Jobs newest first, outbox items oldest first, each in its own read txn; limit 0 means 100,
 * at most 1000. */
int maint_jobs(cph_store *store, const char *state, size_t limit, cph_job_info **out, size_t *n,
               cph_err *err);
int maint_outbox(cph_store *store, const char *status, size_t limit, cph_outbox_info **out,
                 size_t *n, cph_err *err);
/* All zero when m is NULL. */
void maint_stats(const cph_maint *m, cph_maint_stats *out);

#endif
