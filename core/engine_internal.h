/* Private to core/: the engine's in-memory state.
 *
 * What is in memory and why: everything the scheduler pass touches on every pass — sessions
 * (small structs, by id and by scheduler handle), each session's live inbox (pending and
 * staged message ids only, bounded by :max-queue), channel subscriber lists, active leases and
 * due autonomy ticks. Everything else (bodies, records, history, replies) stays in LMDB and is
 * read when a turn is built or a read endpoint asks. The in-memory state is always what LMDB
 * holds after the last commit; operations change memory only after their writes succeeded, and
 * a failed commit rebuilds memory from LMDB (rare: I/O errors). */
#ifndef CEPHALON_CORE_ENGINE_INTERNAL_H
#define CEPHALON_CORE_ENGINE_INTERNAL_H

#include "cephalon/cephalon.h"
#include "core/evcache.h"
#include "core/pact.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/hmap.h"
#include "common/idmap.h"
#include "common/slab.h"
#include "core/memory.h"
#include "core/session.h"
#include "lanes/sched.h"
#include "store/store.h"

/* An active lease. */
typedef struct lease {
  char *key; /* turn id in decimal: its key in engine.leases */
  uint64_t turn_id;
  csession *session;
  uint8_t token[16];
  int64_t deadline_ns;
  cph_turn_kind_t kind;
  uint64_t *inbox_ids; /* the staged messages it carries */
  size_t n_inbox_ids;
  uint64_t job_id; /* job turns: the job it runs */
  /* Channel views (core/context.h): per channel of the staged messages, the newest channel
   * index the turn saw; completion moves the session's cursor there. Owned. */
  char **view_channels;
  uint64_t *view_seen;
  size_t n_views;
} lease;

typedef struct op_queue {
  cph_op **items;
  size_t head, len, cap;
} op_queue;

struct cph_engine {
  cph_policy *policy;
  uint64_t policy_generation;
  bool sched_config_dirty; /* a reload is waiting for the next pass */
  cph_store *store;
  char *data_dir;
  cph_clock own_clock;
  const cph_clock *clock_ref; /* own_clock, or the caller's virtual clock */
  const struct cph_providers *providers; /* given at open (cephalon/providers.h); NULL = none */
  cph_sched *sched;
  cph_engine_hooks hooks;

  /* Sessions: the structs in session_slab; by_sid maps a scheduler handle to its session
   * (NULL for a free handle) and is the way to visit every session; sessions indexes them by
   * id (id -> sid, the key read back through by_sid). */
  cph_slab session_slab;
  cph_idmap sessions;
  csession **by_sid;
  size_t cap_by_sid;
  cph_hmap channels; /* name -> channel */
  cph_hmap leases;   /* turn id as decimal string -> lease (key owned by the lease) */

  csession **pending_sessions; /* sessions with pending messages, for poll_inbox */
  size_t n_pending_sessions, cap_pending_sessions;
  csession **tick_heap; /* min-heap on next_tick_ns */
  size_t n_ticks, cap_ticks;

  op_queue ops;     /* submitted, not yet applied */
  op_queue waiters; /* lease requests waiting for a turn (FIFO) */
  op_queue done;    /* applied in this pass: called back after commit */
  bool staged_last_pass;
  uint64_t last_reply_id;
  uint64_t folded_total; /* over all sessions: cephalon_inbox_overflow_folded_total */
  bool ingest_full; /* ingest found the store full; it resumes past a margin (ingest.c) */

  cph_txn txn; /* the pass's write transaction, open only inside run_pass */

  struct cph_dedupe *dedupe;     /* dedupe.c: exact/near dedupe and families */
  int64_t wall_base_ms, wall_base_ns; /* engine_wall_ms(): wall time at open, engine clock */
  struct cph_backpressure *bp;   /* backpressure.c: per-channel degrade steps */
  struct cph_reports *reports;   /* reports.c: report turns of reporter sessions */
  cph_memory memory;             /* memory.h: what memories keep in memory (the embed queue) */
  struct cph_maint *maint;       /* maint.c: schedules, counters */
  struct cph_metrics *metrics;   /* metrics.c: live counters; kept across memory rebuilds */
  cph_buf scratch;               /* encoding space reused on the pass thread (pact_save) */
  cph_evcache evcache;           /* evcache.h: recent events as turn histories show them */
  struct pact_cached *trees;     /* pact_store.c: decoded trees of recent turns (PACT_CACHE_SLOTS) */
};

/* ---- engine.c ---- */
csession *engine_session(cph_engine *e, const char *id);
channel *engine_channel(cph_engine *e, const char *name, bool create);
void engine_mark_pending(cph_engine *e, csession *s);
void engine_update_work(cph_engine *e, csession *s);
void engine_update_work_all(cph_engine *e); /* every session, in sid order */
int64_t engine_now(cph_engine *e);
/* Wall-clock milliseconds that advance with the engine clock: the real time at open plus
 * engine-clock time since (stored times, dedupe windows). */
int64_t engine_wall_ms(const cph_engine *e);
void engine_tick_schedule(cph_engine *e, csession *s);
int op_fail(cph_op *op, int rc, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void engine_waiter_done(cph_engine *e, cph_op *op);
cph_op *engine_waiter_at(cph_engine *e, size_t i);
void engine_waiter_remove(cph_engine *e, cph_op *op);

/* ---- sessions.c ---- */
void sessions_init(cph_engine *e); /* the empty slab and index, before sessions_load */
void sessions_apply(cph_engine *e, cph_op *op);
int sessions_load(cph_engine *e, cph_err *err);
csession *csession_new(cph_engine *e, const char *id, cph_lane lane, double credits,
                       bool restore);
void csession_free(cph_engine *e, csession *s);
/* Registers s with the scheduler again, in lane with credits (class change, a failed commit's
 * rollback): a new sid, its id moved to the new registration, the old one removed. CPH_OK or
 * CPH_ENOMEM (s unchanged then). */
int csession_resched(cph_engine *e, csession *s, cph_lane lane, double credits);
/* Presizes the session index, by_sid and the scheduler for n sessions in all. */
int sessions_reserve(cph_engine *e, size_t n);
int sessions_channels_attach(cph_engine *e, csession *s, const cph_session_rec *rec);
void sessions_channels_detach(cph_engine *e, csession *s);
int persist_session_credits(cph_engine *e, cph_txn *t, csession *s);
int janitor_create(cph_engine *e, cph_err *err);
bool session_id_valid(const char *id);

/* ---- ingest.c ---- */
void ingest_apply(cph_engine *e, cph_op *op);
uint64_t inbox_poll(cph_engine *e); /* poll_inbox: pending -> staged */
int history_append(cph_engine *e, cph_txn *t, const char *channel, uint64_t event_id);

/* ---- maint.c ---- */
int maint_open(cph_engine *e, cph_err *err);
void maint_close(cph_engine *e);
/* Writes a queued job record in t on the janitor; memory follows with maint_job_queued()
 * after t commits. CPH_ESTATE when there is no janitor. */
int maint_job_write(cph_engine *e, cph_txn *t, cph_job_kind_t kind, const char *args,
                    uint64_t group_id, uint64_t *id_out, csession **session_out);
void maint_job_queued(cph_engine *e, csession *s, uint64_t job_id, cph_job_kind_t kind);
/* After the transaction holding maint_job_write()s commits / aborts. */
void maint_pending_apply(cph_engine *e);
void maint_pending_drop(cph_engine *e);
/* Enqueues in its own child txn of the pass (for reconcile and job steps). */
int maint_enqueue(cph_engine *e, cph_job_kind_t kind, const char *args, uint64_t group_id,
                  uint64_t *id_out);
/* A job turn is starting: chooses the job (the outbox batch for a trickle pick), prepares its
 * work in t and marks it running. CPH_ENOTFOUND when the session has no runnable job. */
int maint_job_start(cph_engine *e, cph_txn *t, csession *s, bool trickle, uint64_t turn_id,
                    cph_job_work **work_out, uint64_t *job_id_out);
void maint_job_started(cph_engine *e, csession *s, uint64_t job_id);
/* The job turn completed with executed work: applies it in t (the completion's child txn). */
int maint_job_apply(cph_engine *e, cph_txn *t, csession *s, uint64_t job_id, cph_job_work *w);
void maint_job_finished(cph_engine *e, csession *s, uint64_t job_id);
/* The job turn's lease ended without completion: the job is queued again (or failed after
 * :leases :max-attempts). Writes in t. */
int maint_job_retry(cph_engine *e, cph_txn *t, csession *s, uint64_t job_id, const char *error,
                    bool *failed);
/* Schedules (gc_plan, outbox_drain, embed_memory, retention) and the trickle flag; from
 * reconcile. */
void maint_tick(cph_engine *e);
/* gc.c: the gc steps' apply phase */
int gc_plan_apply(cph_engine *e, cph_txn *t, const char *args);
int gc_summarize_prepare(cph_engine *e, cph_txn *t, uint64_t group_id, cph_job_work *w);
int gc_summarize_apply(cph_engine *e, cph_txn *t, uint64_t group_id, const cph_job_work *w);
int gc_commit_apply(cph_engine *e, cph_txn *t, uint64_t group_id);
void gc_group_hash(const uint64_t *sorted_ids, size_t n, int64_t newest_ts_ms,
                   uint64_t total_tokens, char out[65]);
void maint_note_commit(cph_engine *e, uint64_t deleted, uint64_t outbox_items, int64_t now_ms);
/* pact_store.c: a session's PACT tree in LMDB (database context).
 *
 * Recently used trees are also kept decoded in memory (a bounded cache), because every turn
 * reads its session's tree at lease and again at completion:
 * - pact_load takes the session's tree out of the cache when it is there (else decodes it);
 * - pact_keep puts a tree back; callers do so only with a tree that matches what their
 *   transaction's parent holds: unchanged after a read, or saved and its child committed;
 * - pact_save and pact_delete_all drop the cached tree, and pact_cache_clear (a failed pass
 *   commit, engine close) empties the cache, so it never holds what the store does not. */
int pact_load(cph_engine *e, cph_txn *t, const char *session, cph_pact_tree *out);
int pact_save(cph_engine *e, cph_txn *t, const char *session, const cph_pact_tree *tree);
int pact_delete_all(cph_engine *e, cph_txn *t, const char *session);
/* Moves *tree into the cache (it is left empty, to free or not); see above for when. */
void pact_keep(cph_engine *e, const char *session, cph_pact_tree *tree);
void pact_cache_clear(cph_engine *e);
/* Drops message cores deeper than the history bound; returns how many. */
size_t pact_prune_history(cph_pact_tree *tree);
void context_ops_apply(cph_engine *e, cph_op *op);
/* search.c */
void search_apply(cph_engine *e, cph_op *op);

/* ---- turns.c ---- */
void turns_apply(cph_engine *e, cph_op *op); /* heartbeat, complete, fail, requeue */
uint32_t turns_serve_waiters(cph_engine *e); /* agent_turn */
void turns_reconcile(cph_engine *e);         /* expire leases, due ticks, timed-out waiters */
int turns_recover(cph_engine *e, cph_err *err);
void lease_free(lease *l);

#endif
