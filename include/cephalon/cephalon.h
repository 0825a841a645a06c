/* The public API of the Cephalon engine. The daemon, the CLI, tests and benches use only
 * this header (and the others in include/cephalon/). The engine knows nothing of HTTP or
 * JSON: the server turns requests into the structs below.
 *
 * Threading: an engine is used from one thread (the daemon's event loop).
 *
 * Writes go through operations (cph_op). cph_engine_submit() queues an operation; the next
 * scheduler pass applies every queued operation in one LMDB write transaction (group commit,
 * DESIGN §4), runs the pass of §3.6, commits, and only then calls each operation's `done`
 * callback — so a caller that answers its client from `done` never acknowledges anything that
 * is not committed. The driver (the daemon) calls cph_engine_run_pass() when
 * cph_engine_pass_wanted() says so, on a timer, and at cph_engine_next_wakeup_ns().
 * Reads (cph_engine_get_*, list, why, lanes, replies) are synchronous and see committed state.
 */
#ifndef CEPHALON_CEPHALON_H
#define CEPHALON_CEPHALON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"
#include "cephalon/lane.h"
#include "cephalon/policy.h"

typedef struct cph_engine cph_engine;

/* ---------------------------------------------------------------- lifecycle */

struct cph_clock; /* common/clock.h */

typedef struct cph_engine_options {
  const char *data_dir; /* overrides :server :data-dir when non-NULL */
  /* The clock for scheduling and lease deadlines; NULL = the real monotonic clock. Tests and
   * simulations pass a virtual one (it must outlive the engine). */
  const struct cph_clock *clock;
} cph_engine_options;

/* Opens the engine on a policy (taking ownership of it, also on failure) and recovers the
 * stored state: sessions, inboxes, credits, parked turns and replies as committed; leases
 * that were in flight are expired and their input staged again. */
int cph_engine_open(cph_policy *policy, const cph_engine_options *opts, cph_engine **out,
                    cph_err *err);
/* Finishes nothing by itself: the caller runs a last pass first to flush queued operations. */
void cph_engine_close(cph_engine *e);

/* Swaps in a new policy (takes ownership). Budgets and credit settings apply on the next pass
 * (buckets keep their fill ratio). Settings that need a restart (listen, data dir, map size)
 * keep their old values until then, and err->msg says so with CPH_OK. */
int cph_engine_reload(cph_engine *e, cph_policy *policy, cph_err *err);

const cph_policy *cph_engine_policy(const cph_engine *e);
uint64_t cph_engine_policy_generation(const cph_engine *e); /* 1 after open, +1 per reload */

/* ---------------------------------------------------------------- driving the engine */

/* True when operations are queued or the last pass staged input (so the next pass should
 * run at once, §3.6). */
bool cph_engine_pass_wanted(const cph_engine *e);
/* Monotonic time (ns, cph_clock scale) of the next lease deadline, autonomy tick or lane
 * refill that would let a waiting turn start; INT64_MAX if none. */
int64_t cph_engine_next_wakeup_ns(cph_engine *e);
/* Runs one pass: applies queued operations, the five jobs of §3.6, commits, then calls the
 * operations' done callbacks. Returns CPH_OK or the commit error (already reported to every
 * operation of the pass). */
int cph_engine_run_pass(cph_engine *e);
/* Flushes data to disk for :sync :batch (the driver calls it every :sync-interval-ms). */
int cph_engine_sync(cph_engine *e);

/* ---------------------------------------------------------------- values */

typedef struct cph_strv {
  char **items;
  size_t count;
} cph_strv;

typedef enum cph_session_state {
  CPH_STATE_IDLE,
  CPH_STATE_QUEUED,
  CPH_STATE_RUNNING,
  CPH_STATE_PAUSED
} cph_session_state_t;
const char *cph_session_state_name(cph_session_state_t s); /* "idle", "queued", ... */

typedef struct cph_session_info {
  char *id;
  cph_lane lane; /* its class */
  cph_session_state_t state;
  double credits;
  uint64_t episode;
  cph_strv subscribe;
  cph_strv member;
  uint32_t autonomy_interval_s; /* 0 = none */
  uint32_t report_interval_s;   /* 0 = none */
  uint32_t context_window_tokens;
  char *system; /* NULL = none */
  cph_strv tools;
  uint32_t pending; /* inbox messages not yet staged */
  uint32_t staged;
  uint64_t dropped; /* pending messages dropped by the queue cap */
} cph_session_info;
void cph_session_info_free(cph_session_info *s);

/* Which fields of a cph_session_info an update sets. */
enum {
  CPH_SET_SUBSCRIBE = 1u << 0,
  CPH_SET_MEMBER = 1u << 1,
  CPH_SET_AUTONOMY = 1u << 2,
  CPH_SET_REPORT = 1u << 3,
  CPH_SET_WINDOW = 1u << 4,
  CPH_SET_SYSTEM = 1u << 5,
  CPH_SET_TOOLS = 1u << 6,
  CPH_SET_PAUSED = 1u << 7,
  CPH_SET_CLASS = 1u << 8
};

typedef struct cph_event_in {
  char *channel; /* NULL: the session's direct channel "direct:<session>" */
  char *sender;
  char *body;
  char *session; /* explicit target, optional */
  cph_strv mentions;
  char *kind;  /* optional */
  char *key;   /* idempotency key, optional */
  int64_t ts_ms; /* 0 = now */
} cph_event_in;

typedef enum cph_ingest_status {
  CPH_EV_QUEUED,     /* staged for at least one session */
  CPH_EV_STORED,     /* kept in its channel's history; reached no session */
  CPH_EV_DUPLICATE,  /* idempotency key seen: the original id, stored once */
  CPH_EV_AGGREGATED, /* content duplicate (step 4) */
  CPH_EV_REJECTED    /* invalid; reason and field say why */
} cph_ingest_status;
const char *cph_ingest_status_name(cph_ingest_status s);

typedef struct cph_event_result {
  uint64_t id; /* 0 when rejected */
  cph_ingest_status status;
  cph_strv sessions; /* sessions it was routed to */
  char *reason;      /* rejected: what is wrong */
  char *field;       /* rejected: which field */
} cph_event_result;

typedef struct cph_staged_msg {
  uint64_t id; /* inbox message id */
  uint64_t event_id;
  char *channel;
  char *sender;
  char *body;
  bool mentioned;
  int64_t ts_ms;
} cph_staged_msg;

typedef struct cph_history_entry {
  uint64_t event_id;
  char *channel;
  char *sender;
  char *body;
  int64_t ts_ms;
} cph_history_entry;

typedef struct cph_tool_usage {
  char *name;
  uint64_t calls_this_turn;
  uint64_t calls_this_minute;
} cph_tool_usage;

typedef struct cph_message {
  char *role; /* "system", "user", "assistant" */
  char *content;
  char *coord; /* "d0, 0, 0" */
} cph_message;

typedef enum cph_turn_kind_t {
  CPH_KIND_INBOX,
  CPH_KIND_AUTONOMY_TICK,
  CPH_KIND_JOB,
  CPH_KIND_REPORT
} cph_turn_kind_t;
const char *cph_turn_kind_name(cph_turn_kind_t k);

/* A leased turn as a worker sees it (DESIGN §4, §6, §9). */
typedef struct cph_turn_info {
  uint64_t id;
  char lease[33]; /* 32 hex chars: the 128-bit lease token */
  char *session;
  cph_lane lane;
  cph_turn_kind_t kind;
  char *input;
  uint64_t episode;
  int64_t deadline_ms; /* wall-clock ms */
  uint32_t attempts;
  cph_staged_msg *staged;
  size_t n_staged;
  /* sections */
  struct {
    double credits;
    double turns_left;
    double tool_calls_left;
    cph_session_state_t state;
    int64_t time_ms;
  } current_state;
  cph_history_entry *history; /* conversation_history; n_history == 0 means "none" */
  size_t n_history;
  cph_tool_usage *tools;
  size_t n_tools;
  cph_message *messages;
  size_t n_messages;
} cph_turn_info;
void cph_turn_info_free(cph_turn_info *t);

typedef struct cph_reply_info {
  uint64_t id;
  char *session;
  char *channel;
  char *body;
  uint64_t *source_inbox_ids;
  size_t n_source_inbox_ids;
  int64_t ts_ms;
} cph_reply_info;
void cph_reply_info_free(cph_reply_info *r);

typedef struct cph_parked_turn {
  uint64_t id;
  char *session;
  uint32_t attempts;
  uint64_t *inbox_ids;
  size_t n_inbox_ids;
  char *error;
} cph_parked_turn;
void cph_parked_turn_free(cph_parked_turn *p);

/* ---------------------------------------------------------------- operations */

typedef enum cph_op_kind {
  CPH_OP_SESSION_CREATE,
  CPH_OP_SESSION_UPDATE,
  CPH_OP_SESSION_DELETE,
  CPH_OP_INGEST,
  CPH_OP_LEASE,
  CPH_OP_HEARTBEAT,
  CPH_OP_COMPLETE,
  CPH_OP_FAIL,
  CPH_OP_REQUEUE
} cph_op_kind;

typedef struct cph_op cph_op;
typedef void (*cph_op_done)(cph_op *op, void *ctx);

struct cph_op {
  cph_op_kind kind;
  cph_op_done done; /* called once, after the pass that applied it committed (or failed) */
  void *ctx;
  /* Result: rc and err (err.msg names the field when the input was wrong; field too). */
  int rc;
  cph_err err;
  char field[64];
  union {
    struct {
      cph_session_info in; /* create: id and lane required; update: fields per `set` */
      unsigned set;        /* CPH_SET_* for update */
      cph_session_info out; /* the session as stored */
    } session;
    struct {
      cph_event_in *events;
      size_t n_events;
      cph_event_result *results; /* n_events entries, filled by the engine */
    } ingest;
    struct {
      char *worker;
      unsigned lanes; /* bit per cph_lane; 0 = all */
      int64_t deadline_ns; /* give up (rc CPH_ETIMEDOUT) at this monotonic time */
      cph_turn_info turn; /* filled on success */
    } lease;
    struct {
      uint64_t turn_id;
      char lease[33];
      uint64_t tokens;
      uint64_t tool_calls;
      char *reply_body;    /* NULL: no reply */
      char *reply_channel; /* NULL: the channel of the turn's first staged message */
      char *error;         /* fail: reason */
      struct { uint64_t valid, invalid, repairs, guard_denies; } tool_stats;
      int64_t deadline_ms; /* heartbeat: the new deadline */
      bool already;        /* complete: it had been completed before (idempotent answer) */
    } turn;
  } u;
};

/* Queues op; the engine owns it until op->done. CPH_OK, or CPH_EBUSY when too many
 * operations are queued (the caller answers 503 and nothing is lost). When submit returns an
 * error, done is never called. Input pointers in op (strings, event arrays) are borrowed:
 * the engine reads them until done and never writes through them. */
int cph_engine_submit(cph_engine *e, cph_op *op);
/* Withdraws a queued lease that has not been served (client went away or timed out).
 * Returns true if it was withdrawn (done will not be called), false if already served. */
bool cph_engine_cancel_lease(cph_engine *e, cph_op *op);
/* Frees what the engine filled into op (results, turn, session out), not op itself nor the
 * caller's inputs. */
void cph_op_clear_results(cph_op *op);

/* ---------------------------------------------------------------- reads */

int cph_engine_get_session(cph_engine *e, const char *id, cph_session_info *out, cph_err *err);

typedef struct cph_session_filter {
  bool by_lane;
  cph_lane lane;
  bool by_state;
  cph_session_state_t state;
  const char *after; /* ids greater than this (pagination) */
  size_t limit;      /* 0 = 100 */
} cph_session_filter;
/* Sessions in id order. */
int cph_engine_list_sessions(cph_engine *e, const cph_session_filter *f, cph_session_info **out,
                             size_t *n, cph_err *err);

typedef struct cph_why_info {
  const char *reason; /* "no_input", "paused", "running", "lane_out_of_budget",
                         "concurrency_full", "runnable" */
  cph_lane lane;
  double credits;
  double waiting_s;
  int64_t until_ms;  /* lane_out_of_budget: wall-clock ms when the lane has budget again */
  uint64_t rank;     /* runnable: 1 = next in its lane */
  uint64_t lane_runnable;
  uint64_t ahead_in_higher_lanes;
  uint32_t staged, pending;
} cph_why_info;
int cph_engine_why(cph_engine *e, const char *id, cph_why_info *out, cph_err *err);

typedef struct cph_lane_info {
  cph_lane lane;
  double turns_left;
  double tool_calls_left;
  uint64_t runnable;
  uint64_t running;
  int64_t budget_turns;
  int64_t budget_tool_calls;
} cph_lane_info;
void cph_engine_lanes(cph_engine *e, cph_lane_info out[CPH_LANE_COUNT], uint32_t *limit,
                      uint32_t *in_use);

/* Replies with id > after, oldest first, at most limit. *next is the id to pass as `after`
 * next time. */
int cph_engine_replies(cph_engine *e, uint64_t after, size_t limit, cph_reply_info **out,
                       size_t *n, uint64_t *next, cph_err *err);
/* The newest reply id (0 if none): a long-poll waits while this is <= its `after`. */
uint64_t cph_engine_last_reply_id(const cph_engine *e);

int cph_engine_parked_turns(cph_engine *e, cph_parked_turn **out, size_t *n, cph_err *err);

typedef struct cph_engine_storage {
  uint64_t map_size_bytes;
  uint64_t used_bytes;
} cph_engine_storage;
int cph_engine_storage_stats(cph_engine *e, cph_engine_storage *out);

/* Hooks the daemon sets to wake long-polls. */
typedef struct cph_engine_hooks {
  void *ctx;
  void (*replies_appended)(void *ctx, uint64_t last_reply_id);
} cph_engine_hooks;
void cph_engine_set_hooks(cph_engine *e, const cph_engine_hooks *h);

#endif
