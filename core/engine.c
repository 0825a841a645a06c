/* The engine: lifecycle, recovery, the operation queue and the pass (contract in cephalon.h).
 *
 *   run_pass: begin one write txn
 *             -> apply queued operations (each in its own child txn, so one failure — say a
 *                full disk — fails only its own request)
 *             -> the scheduler pass of §3.6 (agent_turn, poll_inbox, check_credits,
 *                top_up_credits, reconcile)
 *             -> commit (fsync per :store :sync)
 *             -> call back every operation of the pass: nothing is acknowledged before it is
 *                committed — and under :sync :always, before it is durable (below).
 *
 *   Durability under :sync :always (the contract is cph_engine_run_pass's, cephalon.h). A pass
 *   that applied an operation acknowledging a durable write (ingest, completion, fail,
 *   requeue, session, context and job operations: op_needs_flush) must be on disk before any
 *   of its operations is answered. A pass that only served leases, heartbeats and searches
 *   needs no flush of its own: a lease in flight at a crash is expired by the restart anyway
 *   (turns_recover, DESIGN §4), and so is one whose record a crash undid (its input is still
 *   staged); the scheduler's own writes (expiries, staging, ticks, backpressure) are not
 *   acknowledged to anyone and are redone or repaired after a restart. Every commit uses
 *   cph_txn_commit_deferred (data pages flushed, meta page not: store.h says why not less)
 *   except a durable pass without the flusher, which commits fully synced as before. The
 *   store numbers its commits and says up to which one they are durable; a pass's answers
 *   wait (held_pass) until that number reaches `need`: its own commit if it is durable, else
 *   the last durable pass before it — so answers go out in pass order and no answer shows
 *   what a crash could still undo, apart from the leases themselves. With the flusher (the
 *   daemon), the flush of a durable pass runs on the store's thread while the loop reads
 *   requests and builds the next passes; cph_engine_flushed answers what became durable. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backpressure.h"
#include "cephalon/providers.h"
#include "common/log.h"
#include "dedupe.h"
#include "context.h"
#include "chantail.h"
#include "context_edit.h"
#include "env.h"
#include "evcache.h"
#include "events_read.h"
#include "gc.h"
#include "inbox.h"
#include "handover.h"
#include "ingest.h"
#include "lanes/pass.h"
#include "maint.h"
#include "metrics.h"
#include "replystream.h"
#include "reports.h"
#include "seals.h"
#include "search.h"
#include "sessions.h"
#include "top.h"
#include "trees.h"
#include "turnlog.h"
#include "turnrecs.h"
#include "turns.h"

/* Recent events kept for turn histories: at most this many (a 64-byte body and a short sender
 * cost about 120 bytes each, so some 8 MB when full). A history reads at most 512 entries. */
#define EVCACHE_SLOTS 65536

/* Most operations one pass applies; the rest wait for the next pass (cap work per callback). */
#define OPS_PER_PASS 512
/* Most operations queued at once before submit answers CPH_EBUSY (503). */
#define OPS_QUEUE_MAX 65536

/* The engine's state: the modules, each owning its part (core/README.md gives their order),
 * and what only the engine keeps — the environment it hands them, the operation queues and
 * the hooks.
 *
 * What is in memory and why: everything the scheduler pass touches on every pass — sessions
 * (small structs, by id and by scheduler handle), each session's live inbox (pending and
 * staged message ids only, bounded by :max-queue), channel subscriber lists, active leases and
 * due autonomy ticks. Everything else (bodies, records, history, replies) stays in LMDB and is
 * read when a turn is built or a read endpoint asks. The in-memory state is always what LMDB
 * holds after the last commit; operations change memory only after their writes succeeded, and
 * a failed commit rebuilds memory from LMDB (rare: I/O errors). */
struct cph_engine {
  cph_core_env env; /* handed to every module: store, policy, clock, scheduler, the pass txn */
  bool sched_config_dirty; /* a reload is waiting for the next pass */
  /* Cluster mode (DESIGN §14 "Budgets"): this node's share of each lane's budgets, once the
   * server set one (cph_engine_set_budget_share); the scheduler runs on policy × share. */
  bool shared;
  double share[CPH_LANE_COUNT];
  /* :cluster :concurrency: the server set this node's limit (cph_engine_set_concurrency_share);
   * the scheduler runs on it instead of :scheduler :concurrency. */
  bool concurrency_shared;
  uint32_t concurrency_limit;
  cph_clock own_clock;
  cph_engine_hooks hooks;
  op_queue ops;  /* submitted, not yet applied */
  op_queue done; /* applied in this pass: called back after commit (and flush) */
  op_queue grow_retry; /* failed for a full map this pass: applied again once it has grown */
  bool staged_last_pass;

  /* Durability of the passes (the file comment). */
  bool flusher_on;           /* the store's flusher runs (hooks.flushed set) */
  bool pass_durable;         /* this pass applied an operation that needs a flush */
  uint64_t last_durable_seq; /* the commit number the last durable pass needed */
  struct held_pass *held;    /* committed passes whose answers wait; oldest first */
  size_t n_held, cap_held;
  uint64_t acked_reply_id;   /* the newest reply acknowledged (cph_engine_last_reply_id) */
  /* When the store's span (store.h: one write txn across passes, :always) began, as this
   * engine's clock saw it after the pass that began it; 0 while none is open. */
  int64_t span_t0_ns;

  /* Kept across memory rebuilds (opened with the engine). */
  cph_metrics *metrics;   /* metrics.h: live counters */
  cph_evcache evcache;    /* evcache.h: recent events as turn histories show them */
  cph_chantails tails;    /* chantail.h: channels' recent history, warm */
  cph_trees trees;        /* trees.h: the PACT tree store and its cache of decoded trees */
  cph_context context;    /* context.h, context_edit.h: assembly over the modules below */
  cph_turnlog turnlog;    /* turnlog.h: kept turn contexts (the store's; warm states in memory) */
  cph_memory memory;      /* memory.h: the embed queue's length */
  cph_turns turns;        /* turns.h: leases, lease waiters (these survive a rebuild) */
  cph_ingest ingest;      /* ingest.h: store_full, folded_total */
  /* Rebuilt from the store by memory_load (open, a failed commit). */
  cph_sessions sessions;        /* sessions.h: the registry, channels, pending list, ticks */
  struct cph_dedupe *dedupe;    /* dedupe.h: exact/near dedupe and families */
  struct cph_backpressure *bp;  /* backpressure.h: per-channel degrade steps */
  struct cph_reports *reports;  /* reports.h: report turns of reporter sessions */
  cph_maint *maint;             /* maint.h: the job queue, schedules, counters; gc below it */
};

/* A pass's answers, waiting until the store's durable commit number reaches `need`. */
typedef struct held_pass {
  op_queue ops;
  uint64_t need;
  uint64_t last_reply_id; /* the newest reply once the pass committed */
} held_pass;

const cph_dedupe *cph__engine_dedupe(const cph_engine *e) { return e->dedupe; }

/* Cluster mode (server/clusterflow.h 16.): the raw memories the ingest op's log events minted
 * in their channels, as the parts of the log's channel memories items, into their results.
 * Read through the pass's transaction, which holds them. A part that cannot be made is logged:
 * the memory stays here, and a takeover of its channel's sessions then lacks it (the newest
 * move in the sessions' states). */
static void channel_memory_parts(cph_engine *e, cph_op *op) {
  for (size_t i = 0; op->u.ingest.results && i < op->u.ingest.n_events; i++) {
    cph_event_result *res = &op->u.ingest.results[i];
    const cph_event_in *in = &op->u.ingest.events[i];
    if (!res->memory_id)
      continue;
    int rc = handover_channel_memory_part(&e->env.txn, res->memory_id, in->sender, in->ts_ms,
                                          &res->memory_part, &res->memory_part_len);
    if (rc)
      cph_log(CPH_LOG_ERROR, "the memory of event %s is not given to the cluster log: %s",
              in->key ? in->key : "(no key)", cph_strerror(rc));
  }
}

/* True when the channel has at least one history entry. */
static bool has_history(cph_engine *e, const char *name) {
  cph_txn t;
  if (cph_txn_begin(e->env.store, false, &t) != CPH_OK)
    return false;
  bool found = false;
  cph_cursor c;
  if (cph_cursor_open(&t, CPH_DB_CHANNEL_LOG, &c) == CPH_OK) {
    cph_key k;
    cph_key_reset(&k);
    cph_key_str(&k, name);
    cph_val kv;
    size_t prefix = strlen(name) + 1;
    found = !k.overflow && cph_cursor_seek(&c, &k, &kv, NULL) == CPH_OK && kv.len >= prefix &&
            memcmp(kv.data, k.data, prefix) == 0;
    cph_cursor_close(&c);
  }
  cph_txn_abort(&t);
  return found;
}

/* GET /v1/channels/{id}: backpressure's view, the registry's subscribers; 404 for a channel
 * nobody knows (no traffic, no override, no subscriber, no history). */
int cph_engine_channel(cph_engine *e, const char *id, cph_channel_info *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  if (!id || !*id || strlen(id) > 256)
    return cph_err_set(err, CPH_EINVAL, "a channel name is 1 to 256 bytes");
  if (!(out->id = strdup(id)))
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  bool known = backpressure_channel_info(e->bp, e->env.policy, id, env_now(&e->env), out);
  channel *ch = sessions_channel(&e->sessions, id, false);
  if (ch) {
    out->subscribers = (uint32_t)ch->n_subscribers;
    out->members = (uint32_t)ch->n_members;
  }
  if (!known && !ch && !has_history(e, id)) {
    cph_channel_info_free(out);
    return cph_err_set(err, CPH_ENOTFOUND, "no such channel: %s", id);
  }
  return CPH_OK;
}

int cph_engine_aggregates(cph_engine *e, size_t top, cph_aggregate_info **out, size_t *n,
                          cph_err *err) {
  cph_txn t;
  int rc = cph_txn_begin(e->env.store, false, &t);
  if (rc) {
    *out = NULL;
    *n = 0;
    return cph_err_set(err, rc, "%s", t.err.msg);
  }
  rc = dedupe_aggregates(e->dedupe, &t, top, out, n, err);
  cph_txn_abort(&t);
  return rc;
}

/* A reporter's report fell due (reports_tick): it has work now. */
static void report_due(void *ctx, csession *s) {
  cph_engine *e = ctx;
  sessions_update_work(&e->sessions, s);
}

/* A session is being deleted (sessions.h): its tree, its channel cursors, its kept turn
 * contexts, its seals and its rows of the reply and turn-record indexes go with it. */
static int session_state_delete(void *ctx, cph_txn *t, const char *session) {
  cph_engine *e = ctx;
  trees_delete(&e->trees, t, session);
  int rc = context_cursors_delete(t, session);
  if (rc == CPH_OK)
    rc = replystream_forget_session(t, session);
  if (rc == CPH_OK)
    rc = turnrecs_forget_session(t, session);
  if (rc == CPH_OK)
    rc = seals_delete_session(t, session);
  return rc ? rc : turnlog_delete_session(&e->turnlog, t, session);
}

/* backpressure owns the step; dedupe asks through this (dedupe_widening). */
static bool dedupe_window_widened(void *ctx, const char *chan) {
  const cph_engine *e = ctx;
  return backpressure_step(e->bp, e->env.policy, chan) >= BP_STEP_WIDEN_DEDUPE;
}

static void job_enqueue_apply(cph_engine *e, cph_op *op);

/* ---------------------------------------------------------------- scheduler config */

/* The caller frees c->tenants (an array borrowing the policy's names) once the scheduler has
 * read it. Out of memory for it, tenants keep weight 1 until the next reload. */
static void sched_config_from_policy(const cph_policy *p, cph_sched_config *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    c->turns_per_minute[i] = p->scheduler.lanes[i].turns;
    c->tool_calls_per_minute[i] = p->scheduler.lanes[i].tool_calls;
    c->cost[i] = p->scheduler.credits.cost[i];
    c->tokens_per_minute[i] = p->scheduler.lanes[i].tokens; /* §3.8 */
    c->seats[i] = (uint32_t)p->scheduler.lanes[i].seats;    /* §3.10 */
  }
  c->refill_per_second = p->scheduler.credits.refill_per_second;
  c->credit_max = p->scheduler.credits.max;
  c->credit_min = p->scheduler.credits.min;
  c->concurrency = (uint32_t)p->scheduler.concurrency;
  c->trickle_per_minute = (uint32_t)p->maintenance.outbox.min_batches_per_minute;
  c->charge = p->scheduler.credits.charge == CPH_POLICY_CHARGE_TOKENS ? CPH_CHARGE_TOKENS
                                                                      : CPH_CHARGE_TURN;
  c->tokens_per_unit = p->scheduler.credits.tokens_per_unit;
  size_t n = p->scheduler.tenant_count; /* §3.9 */
  cph_sched_tenant_weight *w = n ? malloc(n * sizeof *w) : NULL;
  for (size_t i = 0; w && i < n; i++)
    w[i] = (cph_sched_tenant_weight){p->scheduler.tenants[i].name, p->scheduler.tenants[i].weight};
  c->tenants = w;
  c->n_tenants = w ? n : 0;
  c->tenant_run_max = (uint32_t)p->scheduler.tenant_run_max;
}

/* The lanes' budgets as the scheduler runs them: the policy's, or this node's share of them
 * (rounded down, so the nodes' budgets never sum above the policy's). */
static void budgets_of(const cph_engine *e, cph_sched_config *c) {
  for (int i = 0; e->shared && i < CPH_LANE_COUNT; i++) {
    c->turns_per_minute[i] = (int64_t)((double)c->turns_per_minute[i] * e->share[i]);
    c->tool_calls_per_minute[i] = (int64_t)((double)c->tool_calls_per_minute[i] * e->share[i]);
    c->tokens_per_minute[i] = (int64_t)((double)c->tokens_per_minute[i] * e->share[i]);
  }
}

/* The scheduler's concurrency and seats as this node's share sets them (after a
 * configuration from the policy, which sets the policy's). */
static void concurrency_apply(cph_engine *e) {
  if (!e->concurrency_shared || !e->env.sched)
    return;
  const cph_policy_scheduler *p = &e->env.policy->scheduler;
  uint32_t seats[CPH_LANE_COUNT];
  for (int i = 0; i < CPH_LANE_COUNT; i++) /* the policy's seats sum to at most its concurrency */
    seats[i] =
        (uint32_t)((uint64_t)p->lanes[i].seats * e->concurrency_limit / (uint64_t)p->concurrency);
  cph_sched_set_concurrency(e->env.sched, e->concurrency_limit, seats);
}

void cph_engine_set_concurrency_share(cph_engine *e, uint32_t limit) {
  e->concurrency_shared = true;
  e->concurrency_limit = limit;
  concurrency_apply(e);
}

void cph_engine_set_budget_share(cph_engine *e, const double share[CPH_LANE_COUNT]) {
  e->shared = true;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    e->share[i] = share[i] < 0 ? 0 : share[i] > 1 ? 1 : share[i];
  cph_sched_config sc;
  sched_config_from_policy(e->env.policy, &sc);
  budgets_of(e, &sc);
  free((void *)sc.tenants);
  cph_sched_set_budgets(e->env.sched, sc.turns_per_minute, sc.tool_calls_per_minute,
                        sc.tokens_per_minute);
}

/* ---------------------------------------------------------------- lifecycle */

static cph_sync_mode sync_mode_of(const cph_policy *p) {
  switch (p->store.sync) {
  case CPH_POLICY_SYNC_BATCH:
    return CPH_SYNC_BATCH;
  case CPH_POLICY_SYNC_NONE:
    return CPH_SYNC_NONE;
  default:
    return CPH_SYNC_ALWAYS;
  }
}

/* Frees every in-memory structure built from the store (not the store, policy or queues). */
static void memory_clear(cph_engine *e) {
  sessions_clear(&e->sessions);
  turns_clear_leases(&e->turns);
  cph_sched_free(e->env.sched);
  e->env.sched = NULL;
  maint_close(e->maint);
  e->maint = NULL;
  backpressure_close(e->bp);
  e->bp = NULL;
  reports_close(e->reports);
  e->reports = NULL;
  dedupe_close(e->dedupe);
  e->dedupe = NULL;
  memory_free(&e->memory); /* a request's held index rows (none between requests) */
  cph_evcache_clear(&e->evcache); /* these mirror the store: rebuilt lazily like the rest */
  chantails_clear(&e->tails);
  trees_cache_clear(&e->trees);
  turnlog_clear(&e->turnlog);
}

/* Builds the in-memory state from the store (open, and after a failed commit). */
static int memory_load(cph_engine *e, cph_err *err) {
  cph_sched_config sc;
  sched_config_from_policy(e->env.policy, &sc);
  budgets_of(e, &sc);
  const char *why = NULL;
  if (cph_sched_config_check(&sc, &why)) {
    free((void *)sc.tenants);
    return cph_err_set(err, CPH_EPOLICY, "%s: scheduler settings: %s", e->env.policy->source, why);
  }
  e->env.sched = cph_sched_new(&sc, e->env.clock);
  free((void *)sc.tenants);
  if (!e->env.sched)
    return cph_err_set(err, CPH_ENOMEM, "out of memory creating the scheduler");
  concurrency_apply(e);
  cph_txn t;
  int rc = cph_txn_begin(e->env.store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  rc = dedupe_open(&t, &e->dedupe, err);
  if (rc == CPH_OK)
    rc = backpressure_open(&t, e->env.policy, env_now(&e->env), &e->bp, err);
  cph_txn_abort(&t);
  if (rc)
    return rc;
  if (reports_open(&e->reports) != CPH_OK) /* before the sessions: loading one registers */
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening the engine");
  sessions_hooks sh = {e, session_state_delete};
  sessions_init(&e->sessions, &e->env, e->reports, e->bp, &sh);
  rc = sessions_load(&e->sessions, err);
  if (rc)
    return rc;
  e->ingest.env = &e->env;
  e->ingest.sessions = &e->sessions;
  e->ingest.dedupe = e->dedupe;
  e->ingest.bp = e->bp;
  e->ingest.memory = &e->memory;
  e->ingest.metrics = e->metrics;
  e->ingest.tails = &e->tails;
  e->turns.env = &e->env;
  e->turns.sessions = &e->sessions;
  e->turns.context = &e->context;
  e->turns.trees = &e->trees;
  e->turns.turnlog = &e->turnlog;
  e->turns.maint = NULL;
  e->turns.memory = &e->memory;
  e->turns.reports = e->reports;
  e->turns.metrics = e->metrics;
  e->turns.done = &e->done;
  rc = turns_recover(&e->turns, err);
  if (rc)
    return rc;
  rc = maint_open(&e->env, &e->sessions, &e->memory, &e->evcache, &e->maint, err);
  if (rc)
    return rc;
  e->turns.maint = e->maint;
  return CPH_OK;
}

/* Brings a data dir of schema `found` (2 to 5) up to this build's (store.h): a schema-2 one's
 * context trees are rewritten one record per node (trees.h); from schema 3 to 5 nothing is
 * rewritten — a schema-3 inbox's folded entries are told by their records' status, which
 * load still reads (inbox.h), and so on (store.h) —; up to schema 5 the kept turn contexts
 * move into one database (turnlog.h, turnlog_migrate). */
static int engine_migrate(void *trees, uint32_t found, cph_txn *t, cph_err *err) {
  int rc = t->ret;
  if (rc == CPH_OK && found <= TREES_MIGRATES_FROM)
    rc = trees_migrate(trees, t, err);
  if (rc == CPH_OK && found <= TURNLOG_MIGRATES_FROM)
    rc = turnlog_migrate(t, err);
  return rc;
}

static void span_enable(cph_engine *e, bool on);

int cph_engine_open(cph_policy *policy, const cph_engine_options *opts, cph_engine **out,
                    cph_err *err) {
  *out = NULL;
  cph_engine *e = calloc(1, sizeof *e);
  if (!e) {
    cph_policy_free(policy);
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening the engine");
  }
  e->env.policy = policy;
  e->env.policy_generation = 1;
  e->env.providers = opts ? opts->providers : NULL;
  /* Settings the network providers share (:providers :ca-file: their https trust). */
  if (e->env.providers && e->env.providers->configure)
    e->env.providers->configure(e->env.providers->ctx, &policy->providers);
  cph_evcache_init(&e->evcache, EVCACHE_SLOTS);
  trees_init(&e->trees);
  turns_init(&e->turns);
  chantails_init(&e->tails, &e->evcache);
  context_init(&e->context, &e->env, &e->sessions, &e->trees, &e->tails, &e->memory);
  turnlog_init(&e->turnlog, &e->env);
  cph_clock_init_monotonic(&e->own_clock);
  e->env.clock = opts && opts->clock ? opts->clock : &e->own_clock;
  /* The engine's wall clock: real time at open, advancing with the engine clock (so windows
   * follow a virtual clock in tests and stored times stay meaningful across restarts). */
  e->env.wall_base_ms = cph_wall_ms();
  e->env.wall_base_ns = cph_clock_now(e->env.clock);
  memaccess_init(&e->memory.access, e->env.wall_base_ns);
  memory_cache_open(&e->memory);
  const char *dir = opts && opts->data_dir ? opts->data_dir : policy->server.data_dir;
  int rc;
  if (!(e->env.data_dir = strdup(dir))) {
    rc = cph_err_set(err, CPH_ENOMEM, "out of memory opening the engine");
    goto fail;
  }
  cph_store_options so = {e->env.data_dir, (size_t)policy->server.map_size_mb << 20,
                          sync_mode_of(policy)};
  cph_store_migration older = {TREES_MIGRATES_FROM, engine_migrate, &e->trees};
  rc = cph_store_open_migrating(&so, &older, &e->env.store, err);
  if (rc)
    goto fail;
  /* Before memory_load: recovery counts expiries. */
  if ((rc = metrics_open(&e->metrics)) != CPH_OK) {
    cph_err_set(err, rc, "out of memory opening the engine");
    goto fail;
  }
  rc = memory_load(e, err);
  if (rc)
    goto fail;
  e->acked_reply_id = e->turns.last_reply_id; /* recovered: all of it is on disk */
  /* Loading read every session record once; those pages need not stay in our RSS (they stay
   * in the page cache). */
  if (cph_store_release_pages(e->env.store) != CPH_OK)
    cph_warn("could not release the store pages read while loading (madvise)");
  span_enable(e, policy->store.span_ms > 0);
  *out = e;
  return CPH_OK;
fail:
  cph_engine_close(e);
  return rc;
}

static void fail_queue(op_queue *q, int rc, const char *msg) {
  cph_op *op;
  while ((op = op_queue_pop(q))) {
    op_fail(op, rc, NULL, "%s", msg);
    if (op->done)
      op->done(op, op->ctx);
  }
}

static void answers_settle(cph_engine *e);

/* The memory accesses still counted in memory go into their records (memaccess.h); a store
 * that cannot take them loses them, and says so. */
static void access_flush_at_close(cph_engine *e) {
  if (!e->env.store || !memaccess_len(&e->memory.access))
    return;
  int rc = cph_txn_begin(e->env.store, true, &e->env.txn);
  if (rc == CPH_OK) {
    rc = memory_flush_accesses(&e->memory, &e->env.txn);
    if (rc == CPH_OK)
      rc = cph_txn_commit(&e->env.txn);
    else
      cph_txn_abort(&e->env.txn);
  }
  if (rc)
    cph_warn("closing: the access counts of %zu memories were not written: %s",
             memaccess_len(&e->memory.access), cph_strerror(rc));
}

void cph_engine_close(cph_engine *e) {
  if (!e)
    return;
  /* Committed operations waiting for a flush get it, and their answers. */
  if (e->flusher_on && e->env.store)
    cph_store_flusher_stop(e->env.store);
  e->flusher_on = false;
  if (e->env.store)
    answers_settle(e);
  free(e->held);
  /* Operations still queued were never applied: say so rather than leave callers hanging. */
  fail_queue(&e->ops, CPH_ESTATE, "cephalond is shutting down");
  turns_fail_waiters(&e->turns, CPH_ETIMEDOUT, "cephalond is shutting down");
  free(e->ops.items);
  free(e->grow_retry.items);
  free(e->done.items);
  access_flush_at_close(e);
  memaccess_free(&e->memory.access);
  memory_clear(e);
  cph_store_close(e->env.store);
  cph_policy_free(e->env.policy);
  free((char *)e->env.data_dir);
  free(e->env.reply_origin_node);
  metrics_close(e->metrics);
  cph_evcache_free(&e->evcache);
  trees_free(&e->trees);
  chantails_free(&e->tails);
  context_free(&e->context);
  turnlog_free(&e->turnlog);
  turns_free(&e->turns);
  ingest_free(&e->ingest);
  free(e);
}

int cph_engine_reload(cph_engine *e, cph_policy *policy, cph_err *err) {
  cph_err_clear(err);
  cph_sched_config sc;
  sched_config_from_policy(policy, &sc);
  const char *why = NULL;
  int bad = cph_sched_config_check(&sc, &why);
  free((void *)sc.tenants);
  if (bad) {
    cph_err_set(err, CPH_EPOLICY, "%s: scheduler settings: %s", policy->source, why);
    cph_policy_free(policy);
    return CPH_EPOLICY;
  }
  int rc = cph_store_set_sync_mode(e->env.store, sync_mode_of(policy), err);
  if (rc) {
    cph_policy_free(policy);
    return rc;
  }
  bool restart_needed = policy->server.map_size_mb != e->env.policy->server.map_size_mb ||
                        strcmp(policy->server.data_dir, e->env.policy->server.data_dir) != 0 ||
                        strcmp(policy->server.listen, e->env.policy->server.listen) != 0;
  if (restart_needed)
    cph_err_set(err, CPH_OK,
                ":server :listen, :data-dir and :map-size-mb take effect at the next restart");
  cph_policy_free(e->env.policy);
  e->env.policy = policy;
  e->env.policy_generation++;
  e->span_t0_ns = 0; /* the sync-mode change ended the span */
  span_enable(e, policy->store.span_ms > 0);
  if (e->env.providers && e->env.providers->configure)
    e->env.providers->configure(e->env.providers->ctx, &policy->providers);
  e->sched_config_dirty = true; /* applied at the start of the next pass (issue: live reload) */
  return CPH_OK;
}

const cph_policy *cph_engine_policy(const cph_engine *e) { return e->env.policy; }
const cph_providers *cph_engine_providers(const cph_engine *e) { return e->env.providers; }
uint64_t cph_engine_policy_generation(const cph_engine *e) { return e->env.policy_generation; }

/* On the store's flusher thread: only the driver's hook, which it promised is thread-safe.
 * e->hooks is not written while the flusher runs (cph_engine_set_hooks stops it first). */
static void engine_flushed_hook(void *ctx) {
  cph_engine *e = ctx;
  e->hooks.flushed(e->hooks.ctx);
}

void cph_engine_set_hooks(cph_engine *e, const cph_engine_hooks *h) {
  if (e->flusher_on) {
    cph_store_flusher_stop(e->env.store);
    e->flusher_on = false;
    answers_settle(e);
  }
  e->hooks = *h;
  if (h->flushed) {
    if (cph_store_flusher_start(e->env.store, engine_flushed_hook, e) == CPH_OK)
      e->flusher_on = true;
    else
      cph_warn("cannot start the flush thread: passes flush before they answer");
  }
}

/* ---------------------------------------------------------------- operations */

int cph_engine_submit(cph_engine *e, cph_op *op) {
  if (e->ops.len >= OPS_QUEUE_MAX)
    return op_fail(op, CPH_EBUSY, NULL, "too many requests queued; retry shortly");
  op->rc = CPH_OK;
  cph_err_clear(&op->err);
  op->field[0] = '\0';
  return op_queue_push(&e->ops, op) ? op_fail(op, CPH_ENOMEM, NULL, "out of memory") : CPH_OK;
}

bool cph_engine_cancel_lease(cph_engine *e, cph_op *op) {
  return turns_cancel_wait(&e->turns, op) || op_queue_remove(&e->ops, op);
}

/* ---- the span (store.h): passes commit into one LMDB write txn, committed every
 * :store :span-ms or SPAN_MAX_BYTES of log, whichever comes first ---- */

/* A bound on the span's dirty pages (LMDB holds at most 131,072 of them in a txn chain): its
 * passes' log records are about the bytes they wrote. */
#define SPAN_MAX_BYTES (64u << 20)

static int64_t span_deadline_ns(const cph_engine *e) {
  return e->span_t0_ns ? e->span_t0_ns + e->env.policy->store.span_ms * CPH_NS_PER_MS
                       : INT64_MAX;
}

static bool span_due(const cph_engine *e) {
  return cph_store_span_open(e->env.store) &&
         (env_now(&e->env) >= span_deadline_ns(e) ||
          cph_store_span_bytes(e->env.store) >= SPAN_MAX_BYTES);
}

/* Commits the span. Should that fail, the store applies its passes again from the log; a
 * full map is grown for that here (as for a pass's writes), up to :server :max-map-size-mb. */
static void span_end(cph_engine *e) {
  cph_store *st = e->env.store;
  e->span_t0_ns = 0;
  cph_err err = {0};
  int rc = cph_store_span_end(st, &err);
  size_t max = (size_t)e->env.policy->server.max_map_size_mb << 20;
  for (int tries = 0; (rc == CPH_EFULL || rc == CPH_EBUSY) && tries < 8; tries++)
    rc = cph_store_grow(st, max, &err); /* it replays the span's passes once it grew */
  if (rc)
    cph_error("%s", err.msg); /* the next write's begin tries the replay again */
}

/* A span that cannot start (its log's files) leaves a txn per pass, as :span-ms 0 does. */
static void span_enable(cph_engine *e, bool on) {
  cph_err err = {0};
  e->span_t0_ns = 0;
  if (cph_store_span_enable(e->env.store, on, &err) != CPH_OK)
    cph_warn("store: %s one write transaction across passes: %s", on ? "not using" : "keeping",
             err.msg);
}

/* After a pass committed: the span's clock starts with the pass that began it. */
static void span_after_pass(cph_engine *e) {
  if (!cph_store_span_open(e->env.store))
    return;
  if (!e->span_t0_ns)
    e->span_t0_ns = env_now(&e->env);
  if (span_due(e))
    span_end(e);
}

bool cph_engine_pass_wanted(const cph_engine *e) {
  return e->ops.len > 0 || e->staged_last_pass || span_due(e);
}

int64_t cph_engine_next_wakeup_ns(cph_engine *e) {
  int64_t next = turns_next_deadline_ns(&e->turns);
  int64_t tick = sessions_next_tick_ns(&e->sessions);
  int64_t span = span_deadline_ns(e); /* an idle loop commits the span too */
  if (span < next)
    next = span;
  return tick < next ? tick : next;
}

/* Whether answering op says that something is stored: then its pass must be durable
 * before the answer goes out (:sync :always). A lease, a heartbeat (it only moves a lease's
 * deadline) and a search (a read) say nothing a restart must keep. A new kind needs a flush
 * unless proven otherwise. */
static bool op_needs_flush(cph_op_kind kind) {
  switch (kind) {
  case CPH_OP_LEASE:
  case CPH_OP_HEARTBEAT:
  case CPH_OP_MEMORY_SEARCH:
  /* A take moves staged entries into a running lease: a crash undoing it leaves them staged,
   * and the restart expires the lease anyway (its input staged again), as for a lease. */
  case CPH_OP_TAKE:
    return false;
  default:
    return true;
  }
}

/* Applies one non-lease operation inside the pass transaction. */
static void apply_op(cph_engine *e, cph_op *op) {
  switch (op->kind) {
  case CPH_OP_SESSION_CREATE:
  case CPH_OP_SESSION_UPDATE:
    sessions_apply(&e->sessions, op);
    break;
  case CPH_OP_SESSION_DELETE: /* then what its parked turns hold (cluster mode) */
    sessions_apply(&e->sessions, op);
    turns_session_deleted(&e->turns, op);
    break;
  case CPH_OP_INBOX_RETAIN: /* the live inbox, then the parked turns (cluster mode's rebuild) */
    sessions_apply(&e->sessions, op);
    turns_retain_parked(&e->turns, op);
    break;
  case CPH_OP_INGEST:
    ingest_apply(&e->ingest, op);
    if (op->rc == CPH_OK)
      channel_memory_parts(e, op);
    /* while_running :restart (DESIGN §4): what reached a session whose turn was running
     * revokes that lease now, in the same pass; the session is leased again with all input. */
    for (size_t i = 0; i < e->ingest.n_restart; i++)
      turns_supersede(&e->turns, e->ingest.restart[i]);
    e->ingest.n_restart = 0;
    if (op->u.ingest.park_session) /* cluster mode's rebuild: input another node parked */
      turns_park_keys(&e->turns, op);
    break;
  case CPH_OP_HEARTBEAT:
  case CPH_OP_COMPLETE:
  case CPH_OP_FAIL:
  case CPH_OP_REQUEUE:
  case CPH_OP_TAKE:
  case CPH_OP_SESSION_STATE:
    turns_apply(&e->turns, op);
    break;
  case CPH_OP_CHANNEL_MEMORIES: {
    cph_handover st = {&e->env, &e->sessions, &e->trees, &e->memory, NULL};
    handover_import_channel(&st, op);
    break;
  }
  case CPH_OP_JOB_ENQUEUE:
    job_enqueue_apply(e, op);
    break;
  case CPH_OP_MEMORY_SEARCH:
    search_apply(&e->env, &e->sessions, &e->memory, op);
    break;
  case CPH_OP_CONTEXT_INSERT:
  case CPH_OP_CONTEXT_DELETE:
  case CPH_OP_CONTEXT_SEAL:
    context_ops_apply(&e->context, op);
    break;
  case CPH_OP_LEASE:
    break; /* waiters are served by agent_turn */
  }
}

/* ---- the pass hooks (§3.6) ---- */

static uint32_t hook_agent_turn(void *ctx) {
  cph_engine *e = ctx;
  return turns_serve_waiters(&e->turns);
}

static uint64_t hook_poll_inbox(void *ctx) {
  cph_engine *e = ctx;
  return sessions_stage_pending(&e->sessions);
}

static void hook_reconcile(void *ctx) {
  cph_engine *e = ctx;
  sessions_ticks_fire(&e->sessions);
  turns_reconcile(&e->turns);
  maint_tick(e->maint);
  cph_lane_stats maint;
  cph_sched_lane_stats(e->env.sched, CPH_LANE_MAINTENANCE, &maint);
  backpressure_load load = {memory_embed_queue(&e->memory),
                            !maint.has_budget && maint.runnable > 0};
  backpressure_tick(e->bp, e->env.policy, &e->env.txn, env_now(&e->env), env_wall_ms(&e->env),
                    &load);
  dedupe_widening widen = {dedupe_window_widened, e, BP_DEDUPE_WIDEN};
  dedupe_tick(e->dedupe, &e->env.policy->dedupe, &e->env.txn, env_wall_ms(&e->env), &widen);
  ingest_tick(&e->ingest, &e->env.txn);
  reports_env renv = {e->env.policy, e->bp, &e->env.txn, env_now(&e->env)};
  reports_tick(e->reports, &renv, report_due, e);
}

static void answers_hold(cph_engine *e, uint64_t need);

/* After a pass that left operations failed for a full map (grow_retry), with no transaction
 * open: the map doubles (up to :server :max-map-size-mb and the disk) and those operations go
 * back to the head of the queue, to be applied afresh by the next pass — so the request that
 * hit the limit succeeds. When the map cannot grow they keep their 507; when a backup holds
 * the map they wait for the next pass. */
static void grow_map(cph_engine *e) {
  cph_err err = {0};
  size_t max = (size_t)e->env.policy->server.max_map_size_mb << 20;
  int rc = cph_store_grow(e->env.store, max, &err);
  cph_op *op;
  if (rc == CPH_OK || rc == CPH_EBUSY) {
    if (rc == CPH_OK) {
      cph_engine_storage st = {0};
      cph_engine_storage_stats(e, &st);
      cph_info("store: the map grew to %llu MiB", (unsigned long long)(st.map_size_bytes >> 20));
    }
    op_queue again = {0};
    while ((op = op_queue_pop(&e->grow_retry))) {
      cph_op_clear_results(op);
      op->rc = CPH_OK;
      cph_err_clear(&op->err);
      op->field[0] = '\0';
      if (op_queue_push(&again, op) != CPH_OK) {
        op_fail(op, CPH_ENOMEM, NULL, "out of memory");
        op_queue_push(&e->done, op);
      }
    }
    while ((op = op_queue_pop(&e->ops))) {
      if (op_queue_push(&again, op) != CPH_OK) {
        op_fail(op, CPH_ENOMEM, NULL, "out of memory");
        op_queue_push(&e->done, op);
      }
    }
    op_queue_free(&e->ops);
    e->ops = again; /* the retried first, in their order, then what was waiting */
    return;
  }
  cph_warn("%s", err.msg);
  while ((op = op_queue_pop(&e->grow_retry))) { /* at the ceiling, or the disk is full */
    metrics_storage_full(e->metrics);
    op_fail(op, CPH_EFULL, op->kind == CPH_OP_INGEST ? "events" : NULL, "%s", err.msg);
    op_queue_push(&e->done, op);
  }
}

int cph_engine_run_pass(cph_engine *e) {
  if (e->sched_config_dirty) {
    cph_sched_config sc;
    sched_config_from_policy(e->env.policy, &sc);
    budgets_of(e, &sc);
    cph_sched_configure(e->env.sched, &sc);
    free((void *)sc.tenants);
    concurrency_apply(e);
    e->sched_config_dirty = false;
  }
  int rc = cph_txn_begin(e->env.store, true, &e->env.txn);
  if (rc) {
    /* Nothing can be written (e.g. a span's passes wait to be applied again, store.h): the
     * operations waiting are answered with the reason rather than left to wait for a pass
     * that the loop would retry at once, over and over. */
    char msg[sizeof e->env.txn.err.msg];
    snprintf(msg, sizeof msg, "%s", e->env.txn.err.msg);
    cph_error("pass: %s", msg);
    fail_queue(&e->ops, rc, msg);
    return rc;
  }
  metrics_pass_begin(e->metrics);
  e->pass_durable = false;
  /* Memory accesses counted since the last flush go into their records (memaccess.h), before
   * this pass counts any. A failed flush leaves them counted for the next. */
  if (memaccess_flush_due(&e->memory.access, env_now(&e->env)))
    (void)memory_flush_accesses(&e->memory, &e->env.txn);
  op_queue next_steps = {0}; /* imports with steps left: behind what is queued now */
  for (int n = 0; n < OPS_PER_PASS && e->ops.len; n++) {
    cph_op *op = op_queue_pop(&e->ops);
    if (op->kind == CPH_OP_LEASE) {
      if (turns_wait(&e->turns, op) != CPH_OK) {
        op_fail(op, CPH_ENOMEM, NULL, "out of memory");
        op_queue_push(&e->done, op);
      }
      continue;
    }
    e->pass_durable |= op_needs_flush(op->kind);
    apply_op(e, op);
    if (op->kind == CPH_OP_CHANNEL_MEMORIES && op->u.channel.cont) {
      if (op_queue_push(&next_steps, op) == CPH_OK)
        continue;
      cph_op_clear_results(op); /* its steps so far stay stored */
      op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    }
    /* A full map is not the caller's problem while the map can grow (DESIGN §13): the op
     * (whose writes were all undone) waits for the growth after this pass's commit. */
    if (op->rc == CPH_EFULL && cph_store_map_full(e->env.store) &&
        op_queue_push(&e->grow_retry, op) == CPH_OK)
      continue;
    op_queue_push(&e->done, op);
  }

  for (cph_op *op; (op = op_queue_pop(&next_steps));)
    if (op_queue_push(&e->ops, op) != CPH_OK) {
      cph_op_clear_results(op);
      op_fail(op, CPH_ENOMEM, NULL, "out of memory");
      op_queue_push(&e->done, op);
    }
  op_queue_free(&next_steps);

  cph_pass_hooks hooks = {0};
  hooks.ctx = e;
  hooks.agent_turn = hook_agent_turn;
  hooks.poll_inbox = hook_poll_inbox;
  hooks.reconcile = hook_reconcile;
  cph_pass_result res;
  cph_sched_pass(e->env.sched, &hooks, &res);
  e->staged_last_pass = res.staged > 0;

  bool always = sync_mode_of(e->env.policy) == CPH_SYNC_ALWAYS;
  rc = always && e->pass_durable && !e->flusher_on ? cph_txn_commit(&e->env.txn)
                                                   : cph_txn_commit_deferred(&e->env.txn);
  if (rc) {
    /* Nothing of this pass landed: every operation of it fails, and memory (changed as the
     * operations applied) is rebuilt from what the store holds. */
    cph_error("pass commit failed: %s", e->env.txn.err.msg);
    metrics_pass_rollback(e->metrics, rc); /* nothing of this pass is counted either */
    turns_notes_pass_end(&e->turns, false); /* nothing of it ended or was parked */
    memaccess_pass_end(&e->memory.access, false, env_now(&e->env));
    memory_pass_end(&e->memory);
    char msg[sizeof e->env.txn.err.msg];
    snprintf(msg, sizeof msg, "%s", e->env.txn.err.msg);
    cph_op *retry;
    while ((retry = op_queue_pop(&e->grow_retry))) /* answered below with the rest */
      op_queue_push(&e->done, retry);
    for (size_t i = 0; i < e->done.len; i++) {
      cph_op *op = e->done.items[(e->done.head + i) % e->done.cap];
      cph_op_clear_results(op);
      op_fail(op, rc, NULL, "%s", msg);
    }
    /* An import between its steps read the copies held before this pass's step: it starts
     * again (the steps before stay stored, and are found by their origins). */
    for (size_t i = 0; i < e->ops.len; i++) {
      cph_op *op = e->ops.items[(e->ops.head + i) % e->ops.cap];
      if (op->kind == CPH_OP_CHANNEL_MEMORIES && op->u.channel.cont) {
        cph_op_clear_results(op);
        op->u.channel.added = op->u.channel.held = op->u.channel.refused = 0;
      }
    }
    memory_clear(e);
    cph_err err;
    if (memory_load(e, &err) != CPH_OK)
      cph_error("rebuilding state after a failed commit: %s", err.msg);
    /* Failures claim nothing stored: they need not wait behind earlier passes. */
    cph_op *op;
    while ((op = op_queue_pop(&e->done)))
      if (op->done)
        op->done(op, op->ctx);
    return rc;
  }
  memaccess_pass_end(&e->memory.access, true, env_now(&e->env));
  memory_pass_end(&e->memory);
  turns_notes_pass_end(&e->turns, true);
  span_after_pass(e);
  if (e->grow_retry.len)
    grow_map(e); /* the store ends the span first */
  /* What this pass's answers wait for (the file comment). :batch and :none: nothing. */
  uint64_t need = 0;
  if (always) {
    need = e->pass_durable && e->env.txn.dirty ? cph_store_commit_seq(e->env.store)
                                                : e->last_durable_seq;
    if (e->pass_durable)
      e->last_durable_seq = need;
  }
  answers_hold(e, need);
  return CPH_OK;
}

/* ---- answering after the flush ---- */

/* Answers ops: as they are when their pass is durable (ok), else with the flush error. */
static void answer_ops(op_queue *ops, bool ok, int failed, const cph_err *ferr) {
  cph_op *op;
  while ((op = op_queue_pop(ops))) {
    if (!ok && op->rc == CPH_OK) {
      cph_op_clear_results(op);
      op_fail(op, failed, NULL, "%s", ferr->msg);
    }
    if (op->done)
      op->done(op, op->ctx);
  }
}

/* Answers the held passes that are durable now, oldest first; once a flush failed, fails
 * the ones that are not. The entry is taken off the list before its callbacks run (they may
 * submit new operations). */
static void answers_release(cph_engine *e) {
  cph_err ferr = {0};
  int failed = cph_store_flush_error(e->env.store, &ferr);
  uint64_t acked_before = e->acked_reply_id;
  while (e->n_held) {
    bool ok = e->held[0].need <= cph_store_durable_seq(e->env.store);
    if (!ok && !failed)
      break;
    held_pass h = e->held[0];
    memmove(e->held, e->held + 1, --e->n_held * sizeof *e->held);
    if (ok && h.last_reply_id > e->acked_reply_id)
      e->acked_reply_id = h.last_reply_id;
    answer_ops(&h.ops, ok, failed, &ferr);
    op_queue_free(&h.ops);
  }
  if (e->acked_reply_id != acked_before && e->hooks.replies_appended)
    e->hooks.replies_appended(e->hooks.ctx, e->acked_reply_id);
}

/* After a commit: this pass's answers join the held list (cph_engine_run_pass's e->done
 * moves there whole); the flush they need is asked for — on the flusher, or here when none
 * runs — and whatever is durable is answered. */
static void answers_hold(cph_engine *e, uint64_t need) {
  cph_store *st = e->env.store;
  if (e->n_held == e->cap_held) {
    size_t cap = e->cap_held ? e->cap_held * 2 : 8;
    held_pass *p = realloc(e->held, cap * sizeof *p);
    if (!p) { /* cannot wait: flush here, and answer now */
      cph_store_sync(st, NULL);
      answers_release(e);
      cph_err ferr = {0};
      int failed = cph_store_flush_error(st, &ferr);
      answer_ops(&e->done, need <= cph_store_durable_seq(st) || !failed, failed, &ferr);
      return;
    }
    e->held = p;
    e->cap_held = cap;
  }
  e->held[e->n_held++] = (held_pass){e->done, need, e->turns.last_reply_id};
  e->done = (op_queue){0};
  if (need > cph_store_durable_seq(st)) {
    if (e->flusher_on && e->pass_durable)
      cph_store_flush_async(st); /* the pass this one waits for asked already otherwise */
    else if (!e->flusher_on)
      cph_store_sync(st, NULL); /* a failure is sticky: the release below reports it */
  }
  answers_release(e);
}

/* Flushes inline whatever held answers still wait for, and answers them all. */
static void answers_settle(cph_engine *e) {
  if (e->n_held && e->held[e->n_held - 1].need > cph_store_durable_seq(e->env.store))
    cph_store_sync(e->env.store, NULL);
  answers_release(e);
  cph_err ferr = {0};
  int failed = cph_store_flush_error(e->env.store, &ferr);
  while (e->n_held) { /* only after a failed flush: release failed them already; belt and braces */
    held_pass h = e->held[0];
    memmove(e->held, e->held + 1, --e->n_held * sizeof *e->held);
    answer_ops(&h.ops, false, failed ? failed : CPH_EIO, &ferr);
    op_queue_free(&h.ops);
  }
}

void cph_engine_flushed(cph_engine *e) { answers_release(e); }

void cph_keep_job_compute(struct cph_keep_job *job) { turnlog_keep_compute(job); }

void cph_engine_keep_write(cph_engine *e, cph_op *op) {
  (void)e; /* the job knows its turnlog */
  if (op->kind != CPH_OP_LEASE || !op->u.lease.keep)
    return;
  cph_keep_job *j = op->u.lease.keep;
  op->u.lease.keep = NULL;
  turnlog_keep_write(j);
}

bool cph_engine_answers_held(const cph_engine *e) { return e->n_held > 0; }

int cph_engine_sync(cph_engine *e) { return cph_store_sync(e->env.store, NULL); }

/* POST /v1/maintenance/jobs */
static void job_enqueue_apply(cph_engine *e, cph_op *op) {
  cph_job_kind_t kind;
  if (cph_job_kind_parse(op->u.job.in.job, &kind) != CPH_OK) {
    op_fail(op, CPH_EINVAL, "job",
            "job: expected one of embed_memory, aggregate_upsert, gc_plan, gc_summarize, "
            "gc_commit, outbox_drain, retention_redact_events");
    return;
  }
  const char *args = op->u.job.in.args;
  uint64_t group = 0;
  if ((kind == CPH_JOBK_GC_SUMMARIZE || kind == CPH_JOBK_GC_COMMIT)) {
    if (!args || strncmp(args, "group=", 6) != 0 || !(group = strtoull(args + 6, NULL, 10))) {
      op_fail(op, CPH_EINVAL, "args", "args: %s needs \"group=<id>\"", cph_job_kind_name(kind));
      return;
    }
  }
  int rc = maint_enqueue(e->maint, kind, args, group, &op->u.job.job_id);
  if (rc)
    op_fail(op, rc, rc == CPH_ESTATE ? "job" : NULL, "%s",
            rc == CPH_ESTATE ? "no maintenance session: enable :sessions :janitor?"
                             : cph_strerror(rc));
}

/* ---------------------------------------------------------------- reads */

void cph_engine_lanes(cph_engine *e, cph_lane_info out[CPH_LANE_COUNT], uint32_t *limit,
                      uint32_t *in_use) {
  /* The budgets as of the current policy (a reload reaches the scheduler at the next pass,
   * but a read after it shows it) and, in a cluster, this node's share. */
  cph_sched_config sc;
  sched_config_from_policy(e->env.policy, &sc);
  budgets_of(e, &sc);
  free((void *)sc.tenants);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    cph_lane_stats st;
    cph_sched_lane_stats(e->env.sched, (cph_lane)i, &st);
    out[i] = (cph_lane_info){.lane = (cph_lane)i,
                             .turns_left = st.turns_left,
                             .tool_calls_left = st.tool_calls_left,
                             .runnable = st.runnable,
                             .running = st.running,
                             .budget_turns = sc.turns_per_minute[i],
                             .budget_tool_calls = sc.tool_calls_per_minute[i],
                             .tokens_left = st.tokens_left,
                             .budget_tokens = sc.tokens_per_minute[i],
                             .seats = st.seats,
                             .seats_lent = st.seats_lent,
                             .seats_borrowed = st.seats_borrowed,
                             .tenants_runnable = st.tenants_runnable,
                             .tenant_run = st.tenant_run,
                             .recent_completions = st.window,
                             .mean_turn_s = (double)st.mean_turn_ns / 1e9,
                             .completion_spacing_s = (double)st.mean_spacing_ns / 1e9};
  }
  *limit = cph_sched_concurrency(e->env.sched);
  *in_use = cph_sched_running(e->env.sched);
}

void cph_engine_report_consumed(cph_engine *e, bool on) { e->env.report_consumed = on; }

int cph_engine_reply_origins(cph_engine *e, const char *node) {
  if (node && strlen(node) > REPLYSTREAM_NODE_MAX)
    return CPH_EINVAL;
  char *copy = node ? strdup(node) : NULL;
  if (node && !copy)
    return CPH_ENOMEM;
  free(e->env.reply_origin_node);
  e->env.reply_origin_node = copy;
  return CPH_OK;
}

int cph_engine_take_parks(cph_engine *e, cph_park_note **out, size_t *n) {
  return turns_take_parks(&e->turns, out, n);
}

int cph_engine_take_ended_items(cph_engine *e, cph_session_items **out, size_t *n) {
  return turns_take_ended_items(&e->turns, out, n);
}

int cph_engine_inbox_keys(cph_engine *e, const char *session, cph_strv *out, cph_err *err) {
  *out = (cph_strv){0};
  const csession *s = session ? sessions_get(&e->sessions, session) : NULL;
  if (!s)
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", session ? session : "");
  cph_txn t;
  int rc = cph_txn_begin(e->env.store, false, &t);
  for (uint32_t i = 0; rc == CPH_OK && i < s->n_inbox; i++)
    rc = inbox_event_keys(&t, s->id, &s->inbox[i], out);
  if (rc) {
    cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    cph_strv_free(out);
  }
  if (t.mdb)
    cph_txn_abort(&t);
  return rc;
}

int cph_engine_get_session(cph_engine *e, const char *id, cph_session_info *out, cph_err *err) {
  return sessions_info(&e->sessions, id, out, err);
}

int cph_engine_list_sessions(cph_engine *e, const cph_session_filter *f, cph_session_info **out,
                             size_t *n, cph_err *err) {
  return sessions_list(&e->sessions, f, out, n, err);
}

int cph_engine_why(cph_engine *e, const char *id, cph_why_info *out, cph_err *err) {
  return sessions_why(&e->sessions, id, out, err);
}

int cph_engine_replies(cph_engine *e, uint64_t after, size_t limit, cph_reply_info **out,
                       size_t *n, uint64_t *next, cph_err *err) {
  int rc = turns_replies(&e->turns, after, limit, out, n, next, err);
  /* Not a reply whose completion is not acknowledged yet (not on disk, under :always). */
  if (rc == CPH_OK && *n && (*out)[*n - 1].id > e->acked_reply_id) {
    while (*n && (*out)[*n - 1].id > e->acked_reply_id)
      cph_reply_info_free(&(*out)[--*n]);
    *next = *n ? (*out)[*n - 1].id : after;
  }
  return rc;
}

int cph_engine_parked_turns(cph_engine *e, cph_parked_turn **out, size_t *n, cph_err *err) {
  return turns_parked(e->env.store, out, n, err);
}

int cph_engine_turn_record(cph_engine *e, uint64_t id, cph_turn_record *out, cph_err *err) {
  return turns_record(e->env.store, e->env.reply_origin_node, id, out, err);
}

int cph_engine_session_turn_records(cph_engine *e, const char *session, size_t limit,
                                    cph_turn_record **out, size_t *n, cph_err *err) {
  *out = NULL;
  *n = 0;
  if (!sessions_get(&e->sessions, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no such session: %s", session);
  return turns_session_records(e->env.store, e->env.reply_origin_node, session, limit, out, n,
                               err);
}

uint64_t cph_engine_last_reply_id(const cph_engine *e) { return e->acked_reply_id; }

const char *cph_engine_replies_stream(const cph_engine *e) { return e->turns.replies_stream; }

int cph_engine_top_sessions(cph_engine *e, size_t n, cph_session_info **out, size_t *n_out,
                            cph_err *err) {
  return top_sessions(&e->sessions, n, out, n_out, err);
}

int cph_engine_channel_steps(cph_engine *e, uint32_t min_step, cph_channel_step **out, size_t *n,
                             cph_err *err) {
  return top_channel_steps(e->bp, e->env.policy, min_step, out, n, err);
}

int cph_engine_get_event(cph_engine *e, uint64_t id, cph_event_info *out, cph_err *err) {
  return events_get(e->env.store, id, out, err);
}

int cph_engine_memory_scopes(cph_engine *e, const char *session, cph_strv *out, cph_err *err) {
  return search_memory_scopes(e->env.store, session, out, err);
}

void cph_engine_note_reload_failure(cph_engine *e) {
  if (e)
    metrics_reload_failure(e->metrics);
}

char *cph_engine_metrics_text(cph_engine *e, size_t *len) {
  if (!e->metrics)
    return NULL;
  metrics_sources src = {.env = &e->env,
                         .metrics = e->metrics,
                         .sessions = &e->sessions,
                         .bp = e->bp,
                         .dedupe = e->dedupe,
                         .folded_total = e->ingest.folded_total,
                         .prepared_total = e->ingest.prepared_total};
  cph_engine_lanes(e, src.lanes, &src.concurrency_limit, &src.concurrency_in_use);
  cph_engine_maint_stats(e, &src.maint);
  src.have_storage = cph_engine_storage_stats(e, &src.storage) == CPH_OK;
  return metrics_text(&src, len);
}

int cph_engine_context(cph_engine *e, const char *session, const char *selector,
                       cph_context_node_info **out, size_t *n, uint64_t *episode, cph_err *err) {
  return context_nodes(&e->context, session, selector, out, n, episode, err);
}

int cph_engine_context_step(cph_engine *e, const char *session, size_t episodes,
                            cph_context_step **out, cph_err *err) {
  return context_step_preview(&e->context, session, episodes, out, err);
}

int cph_engine_seals(cph_engine *e, const char *session, cph_seal_info **out, size_t *n,
                     cph_err *err) {
  return context_seals(&e->context, session, out, n, err);
}

int cph_engine_kept_turns(cph_engine *e, const char *session, cph_kept_turn **out, size_t *n,
                          cph_err *err) {
  *out = NULL;
  *n = 0;
  if (!sessions_get(&e->sessions, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no such session: %s", session);
  return turnlog_list(e->env.store, session, out, n, err);
}

int cph_engine_turn_context(cph_engine *e, const char *session, uint64_t turn,
                            cph_turn_context *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  if (!sessions_get(&e->sessions, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no such session: %s", session);
  return turnlog_get(e->env.store, session, turn, out, err);
}

int cph_engine_context_diff(cph_engine *e, const char *session, uint64_t from, uint64_t to,
                            cph_context_diff *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  if (!sessions_get(&e->sessions, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no such session: %s", session);
  return turnlog_diff(e->env.store, session, from, to, out, err);
}

void cph_engine_backup_begin(cph_engine *e) { span_end(e); }

int cph_engine_backup(cph_engine *e, const char *dir, cph_err *err) {
  return cph_store_copy(e->env.store, dir, err); /* reads only: no engine state touched */
}

int cph_engine_backup_dir_check(const char *dir, cph_err *err) {
  return cph_store_copy_dir_check(dir, err);
}

int cph_engine_storage_stats(cph_engine *e, cph_engine_storage *out) {
  cph_store_stats st;
  int rc = cph_store_stats_get(e->env.store, &st);
  if (rc)
    return rc;
  out->map_size_bytes = st.map_size;
  out->used_bytes = st.used_bytes;
  out->fsyncs = st.fsyncs;
  return CPH_OK;
}

int cph_engine_jobs(cph_engine *e, const char *state, size_t limit, cph_job_info **out, size_t *n,
                    cph_err *err) {
  return maint_jobs(e->env.store, state, limit, out, n, err);
}

int cph_engine_outbox(cph_engine *e, const char *status, size_t limit, cph_outbox_info **out,
                      size_t *n, cph_err *err) {
  return maint_outbox(e->env.store, status, limit, out, n, err);
}

void cph_engine_maint_stats(cph_engine *e, cph_maint_stats *out) { maint_stats(e->maint, out); }

int cph_engine_gc_group(cph_engine *e, uint64_t id, cph_gc_group_info *out, cph_err *err) {
  return gc_group(e->env.store, id, out, err);
}

int cph_engine_gc_groups(cph_engine *e, const char *state, size_t limit, cph_gc_group_info **out,
                         size_t *n, cph_err *err) {
  return gc_groups(e->env.store, state, limit, out, n, err);
}
