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
#include "core/context.h"
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
#include "core/env.h"
#include "core/ops.h"
#include "core/ingest.h"
#include "core/sessions.h"
#include "core/trees.h"

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
  context_views views;
} lease;

struct cph_engine {
  cph_core_env env; /* env.h: store, policy, clock, scheduler, providers, the pass txn */
  bool sched_config_dirty; /* a reload is waiting for the next pass */
  cph_clock own_clock;
  cph_engine_hooks hooks;
  cph_sessions sessions; /* sessions.h: the registry, channels, pending list, tick heap */
  cph_hmap leases;   /* turn id as decimal string -> lease (key owned by the lease) */

  op_queue ops;     /* submitted, not yet applied */
  op_queue waiters; /* lease requests waiting for a turn (FIFO) */
  op_queue done;    /* applied in this pass: called back after commit */
  bool staged_last_pass;
  uint64_t last_reply_id;
  cph_ingest ingest; /* ingest.h: events into sessions' inboxes */

  struct cph_dedupe *dedupe;     /* dedupe.c: exact/near dedupe and families */
  struct cph_backpressure *bp;   /* backpressure.c: per-channel degrade steps */
  struct cph_reports *reports;   /* reports.c: report turns of reporter sessions */
  cph_memory memory;             /* memory.h: what memories keep in memory (the embed queue) */
  struct cph_maint *maint;       /* maint.h: the job queue, schedules, counters; gc below it */
  struct cph_metrics *metrics;   /* metrics.c: live counters; kept across memory rebuilds */
  cph_evcache evcache;           /* evcache.h: recent events as turn histories show them */
  cph_trees trees;               /* trees.h: the PACT tree store and its cache of decoded trees */
  cph_context context;           /* context.h, context_edit.h: wired to the above at open */
};

/* ---- engine.c ---- */
static inline csession *engine_session(cph_engine *e, const char *id) {
  return sessions_get(&e->sessions, id);
}
static inline channel *engine_channel(cph_engine *e, const char *name, bool create) {
  return sessions_channel(&e->sessions, name, create);
}
static inline void engine_mark_pending(cph_engine *e, csession *s) {
  sessions_mark_pending(&e->sessions, s);
}
static inline void engine_update_work(cph_engine *e, csession *s) {
  sessions_update_work(&e->sessions, s);
}
static inline void engine_update_work_all(cph_engine *e) { sessions_update_work_all(&e->sessions); }
static inline void engine_tick_schedule(cph_engine *e, csession *s) {
  sessions_tick_schedule(&e->sessions, s);
}
static inline int64_t engine_now(cph_engine *e) { return env_now(&e->env); }
static inline int64_t engine_wall_ms(const cph_engine *e) { return env_wall_ms(&e->env); }

void engine_waiter_done(cph_engine *e, cph_op *op);
cph_op *engine_waiter_at(cph_engine *e, size_t i);
void engine_waiter_remove(cph_engine *e, cph_op *op);

/* ---- turns.c ---- */
void turns_apply(cph_engine *e, cph_op *op); /* heartbeat, complete, fail, requeue */
uint32_t turns_serve_waiters(cph_engine *e); /* agent_turn */
void turns_reconcile(cph_engine *e);         /* expire leases, due ticks, timed-out waiters */
int turns_recover(cph_engine *e, cph_err *err);
void lease_free(lease *l);

#endif
