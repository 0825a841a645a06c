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

struct cph_clock;     /* common/clock.h */
struct cph_providers; /* cephalon/providers.h */

typedef struct cph_engine_options {
  const char *data_dir; /* overrides :server :data-dir when non-NULL */
  /* The clock for scheduling and lease deadlines; NULL = the real monotonic clock. Tests and
   * simulations pass a virtual one (it must outlive the engine). */
  const struct cph_clock *clock;
  /* The network providers (embedder, summariser, HTTP vector index); NULL = built-in only, and
   * a policy that asks for a network provider gets CPH_ESTATE where it is used. The daemon
   * passes cph_providers_network() (providers/providers.h). Must outlive the engine. */
  const struct cph_providers *providers;
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
/* Cluster mode (DESIGN §14 "Budgets"): from now on each lane runs on share[lane] (0..1) of the
 * policy's per-minute budgets (turns, tool calls, tokens; rounded down), and a reload keeps
 * the share. A change never adds tokens (lanes/sched.h, cph_sched_set_budgets), so while the
 * nodes' shares sum to at most 1 the cluster keeps the §3 rule 1 bound. Loop thread. */
void cph_engine_set_budget_share(cph_engine *e, const double share[CPH_LANE_COUNT]);
/* Cluster mode with :cluster :concurrency (DESIGN §14): from now on at most `limit` turns run
 * at once on this node (0: it starts none), instead of :scheduler :concurrency, with each
 * lane's seats scaled by limit / :scheduler :concurrency (rounded down); a reload keeps it.
 * Running turns above a smaller limit go on to their end. Loop thread. */
void cph_engine_set_concurrency_share(cph_engine *e, uint32_t limit);

const cph_policy *cph_engine_policy(const cph_engine *e);
/* The table given at open (cph_engine_options.providers); NULL when none was. */
const struct cph_providers *cph_engine_providers(const cph_engine *e);
uint64_t cph_engine_policy_generation(const cph_engine *e); /* 1 after open, +1 per reload */

/* ---------------------------------------------------------------- driving the engine */

/* True when operations are queued or the last pass staged input (so the next pass should
 * run at once, §3.6). */
bool cph_engine_pass_wanted(const cph_engine *e);
/* Monotonic time (ns, cph_clock scale) of the next lease deadline, autonomy tick or lane
 * refill that would let a waiting turn start; INT64_MAX if none. */
int64_t cph_engine_next_wakeup_ns(cph_engine *e);
/* Runs one pass: applies queued operations, the five jobs of §3.6, commits, then calls the
 * operations' done callbacks — at once, or (with the `flushed` hook set, :sync :always, and
 * an operation that acknowledges a durable write) from cph_engine_flushed() once the commit
 * is on disk. Operations are answered in pass order, and never before every earlier pass is
 * durable. A pass that serves only leases, heartbeats and searches needs no flush of its own:
 * a lease is not durable anyway (at a restart leases in flight are expired, DESIGN §4).
 * When a flush fails, the operations waiting on it fail with its error (nothing is
 * acknowledged as stored), and so does every later one that needs a flush, until a restart.
 * Returns CPH_OK or the commit error (already reported to every operation of the pass). */
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
  uint64_t folded; /* events the queue cap folded into an overflow entry (never dropped) */
  /* What it does with what arrives while its turn runs (DESIGN §4). In an update or create
   * (CPH_SET_WHILE_RUNNING): while_running_class true = follow its class's default in the
   * policy (:sessions :while-running), else while_running. Out: the mode in force and
   * whether it comes from the class. */
  cph_policy_while_running while_running;
  bool while_running_class;
  char *tenant; /* NULL = none: the default tenant (DESIGN §3.9) */
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
  CPH_SET_CLASS = 1u << 8,
  CPH_SET_WHILE_RUNNING = 1u << 9,
  CPH_SET_TENANT = 1u << 10 /* tenant NULL or "" clears it */
};

/* A tenant name: 1 to 128 bytes of A-Z a-z 0-9 . _ : @ - (as session ids). */
bool cph_tenant_valid(const char *tenant);

/* What ingest derives from an event's text alone — the content-dedupe hashes of DESIGN §5 —
 * computed ahead of the engine by cph_event_prepare(), so that a driver can spend another
 * core on it while its loop runs the engine. Optional: the engine takes what was computed
 * under the dedupe settings in force and computes everything else itself, so a policy reload
 * between the two steps changes no verdict. */
typedef struct cph_event_prep {
  bool ready;             /* set by cph_event_prepare */
  bool hashed;            /* simhash, idsig and sender_hash were computed (text long enough) */
  int32_t shingle_words;  /* the :shingle-words the simhash was computed under */
  size_t norm_len;        /* bytes of the normalised body */
  uint8_t sha256[32];     /* of (channel, sender, normalised body) */
  uint64_t simhash, idsig, sender_hash;
} cph_event_prep;

typedef struct cph_event_in {
  char *channel; /* NULL: the session's direct channel "direct:<session>" */
  char *sender;
  char *body;
  char *session; /* explicit target, optional */
  cph_strv mentions;
  char *kind;  /* optional */
  char *key;   /* idempotency key, optional */
  int64_t ts_ms; /* 0 = now */
  /* Route to `session` alone (mentioned if it is among the mentions), never to the channel's
   * subscribers or other mentioned sessions; without a session it is stored and reaches no
   * session. Cluster mode applies logged events so: the log delivers them to the others
   * (server/clusterflow.h). */
  bool only_session;
  /* A copy of another node's entry for this node's copy of the channel's history (cluster
   * mode: a reply a session on another node wrote there, server/clusterflow.h 14.): stored
   * with its kind, sender and time and appended to the channel's history — unless the
   * channel's newest entries hold the same event (channel, sender, time and body) already —
   * and nothing else: no session, no dedupe, family or memory, not counted as an event.
   * Status stored, or duplicate (its key, or the same event found; id: that entry's event). */
  bool history_only;
  /* Cluster mode: an event of a log `in` message, applied by its shard's owner
   * (server/clusterflow.h 16.): the raw memory it mints in its channel's scope comes back in
   * its result (memory_part), for the log to keep under the channel's key. */
  bool memory_item;
  /* Cluster mode: an event of the log (an `in` event, a forward, a rebuild's delivery) with a
   * channel: its raw memory there is minted under the event's identity cluster-wide (its
   * channel, sender, ts_ms and body; core/memory.h memory_event_origin) — or, when this node
   * has the memory of that origin already (taken from the log's items, or minted by another
   * delivery of the event), that one is linked to the event and none is minted. */
  bool memory_origin;
  const cph_event_prep *prep; /* optional: cph_event_prepare()'s result for this event */
} cph_event_in;

/* A SHA-256 context for cph_event_prepare: one per thread that prepares. */
typedef struct cph_event_hasher cph_event_hasher;
cph_event_hasher *cph_event_hasher_new(void);
void cph_event_hasher_free(cph_event_hasher *h);
/* Fills *out from in's channel (or direct channel), sender and body alone, under the dedupe
 * settings given (shingle_words and min_length of :dedupe, copied by the caller: the policy
 * may be reloaded meanwhile). Touches no engine state: any thread, any time before the
 * event's operation is submitted. An event without a sender or body is left not ready (the
 * engine rejects it). CPH_OK, or CPH_ENOMEM (*out not ready). */
int cph_event_prepare(cph_event_hasher *h, const cph_event_in *in, int32_t shingle_words,
                      int64_t min_length, cph_event_prep *out);

typedef enum cph_ingest_status {
  CPH_EV_QUEUED,     /* staged for at least one session */
  CPH_EV_STORED,     /* kept in its channel's history; reached no session */
  CPH_EV_DUPLICATE,  /* idempotency key seen: the original id, stored once */
  CPH_EV_AGGREGATED, /* content duplicate (step 4) */
  CPH_EV_REJECTED    /* invalid, or refused by every session it was routed to (reason
                      * session_busy: while_running :reject); reason and field say why */
} cph_ingest_status;
const char *cph_ingest_status_name(cph_ingest_status s);

typedef struct cph_event_result {
  uint64_t id; /* 0 when rejected as invalid; the stored event's id when refused as busy */
  cph_ingest_status status;
  cph_strv sessions; /* sessions it reached (staged for, or folded into an entry of) */
  char *reason;      /* rejected: what is wrong */
  char *field;       /* rejected: which field */
  /* Sessions it was routed to that refused it: their turn was running and their
   * while_running is :reject (reason "session_busy", DESIGN §4). It did not reach them, so
   * the accounting rule does not count it for them. The event is stored either way; status
   * is `rejected` only when it reached no session at all. */
  cph_strv busy;
  /* With in->memory_item: the raw memory the event minted in its channel's scope, encoded as
   * one memory of a channel memories item (cph_channel_memories_item); NULL when it minted
   * none. Malloc'd; freed by cph_op_clear_results. */
  uint8_t *memory_part;
  size_t memory_part_len;
  uint64_t memory_id; /* with in->memory_item: that memory's id here (0: none) */
} cph_event_result;

/* One staged inbox entry of a turn. An entry may stand for several events (DESIGN §5: repeats
 * of a family, or the queue cap's overflow): event_ids lists every one, count says how many,
 * and body is what the model reads — for a folded entry the text with its count and last time
 * ("×3, last 12:04") or, when the texts differ, each distinct text on its own line. */
typedef struct cph_staged_msg {
  uint64_t id; /* inbox message id */
  uint64_t event_id; /* its first event */
  char *channel;
  char *sender;
  char *body;
  bool mentioned;
  int64_t ts_ms;
  uint32_t count;      /* events it stands for, >= 1 */
  uint64_t *event_ids; /* n_event_ids == count: every event, first first */
  size_t n_event_ids;
  int64_t last_ms;  /* arrival of its newest event */
  const char *fold; /* static: "none", "repeat" (a family's repeats), "overflow" (queue cap) */
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

/* pending_obligations: one per staged message listed (core/context.h says when some are not). */
typedef struct cph_obligation {
  uint64_t id; /* inbox message id */
  char *sender;
  char *preview; /* the body's first bytes, cut on a UTF-8 boundary, "..." when cut */
} cph_obligation;

/* recent_memory: a memory included in the turn (each inclusion counts as an access). */
typedef struct cph_memory_item {
  uint64_t id;
  char *kind;  /* "raw", "summary", "aggregate" */
  char *text;
  char *scope; /* a session id or "#channel" */
  int64_t created_ms;
  uint64_t access_count; /* including this inclusion */
} cph_memory_item;

/* A channel view (multi-agent, DESIGN §6): where the session's cursor stood and what the turn
 * saw; completing the turn moves the cursor to seen_index. */
typedef struct cph_channel_view {
  char *channel;
  uint64_t cursor;     /* last processed channel index before this turn (0 = from the start) */
  bool had_cursor;     /* false: the session had none; `cursor` is where it was started */
  uint64_t seen_index; /* the newest channel index the turn saw */
  uint32_t away;       /* messages in the away block from this channel */
} cph_channel_view;

/* Token use of a turn's context: estimate ceil(bytes/4) per text + 4 per item (DESIGN §6). */
typedef struct cph_context_tokens {
  uint32_t window; /* the session's context_window_tokens */
  uint32_t current_state, pending_obligations, conversation_history, recent_memory,
      available_tools;
  uint32_t sections;      /* the five together: never above window */
  uint32_t messages;      /* the messages array */
  uint32_t history_cut;   /* history entries read and left out, oldest first (a lower bound:
                           * reading stops once the budget is covered) */
  uint32_t messages_cut;  /* history messages (or away-block lines) left out, oldest first;
                           * a lower bound likewise */
} cph_context_tokens;

typedef struct cph_message {
  char *role; /* "system", "user", "assistant" */
  char *content;
  char *coord; /* "d0, 0, 0" */
  char *name;  /* a user message's sender as OpenAI's `name` (^[a-zA-Z0-9_-]{1,64}$); NULL for
                * other messages */
  /* What context assembly knew when it wrote the strings (`measured`; zero elsewhere): the
   * content's and the coordinate's strlen and the coordinate's numbers, so what reads the turn
   * again (its kept context) neither measures nor parses them. */
  size_t content_len, coord_len;
  int32_t depth, position, offset;
  bool measured;
} cph_message;

typedef enum cph_turn_kind_t {
  CPH_KIND_INBOX,
  CPH_KIND_AUTONOMY_TICK,
  CPH_KIND_JOB,
  CPH_KIND_REPORT
} cph_turn_kind_t;
const char *cph_turn_kind_name(cph_turn_kind_t k);

/* The parts of a lease answer a worker may leave out (`include` on POST /v1/turns/lease):
 * id, lease, session, lane, kind, episode, deadline_ms, attempts and tools_named are always
 * there; each of these is there unless left out. A part left out is never written, and not
 * built either where its only use is the answer (core/context.h says what is still
 * computed); what the rest of the turn depends on is computed whatever is left out. */
typedef enum cph_turn_part {
  CPH_PART_INPUT = 1u << 0,
  CPH_PART_STAGED = 1u << 1,
  CPH_PART_CURRENT_STATE = 1u << 2,
  CPH_PART_OBLIGATIONS = 1u << 3, /* sections.pending_obligations */
  CPH_PART_HISTORY = 1u << 4,     /* sections.conversation_history */
  CPH_PART_MEMORY = 1u << 5,      /* sections.recent_memory */
  CPH_PART_TOOLS = 1u << 6,       /* sections.available_tools */
  CPH_PART_MESSAGES = 1u << 7,
  CPH_PART_VIEWS = 1u << 8, /* channel_views */
  CPH_PART_TOKENS = 1u << 9
} cph_turn_part;
#define CPH_PART_SECTIONS                                                                      \
  (CPH_PART_CURRENT_STATE | CPH_PART_OBLIGATIONS | CPH_PART_HISTORY | CPH_PART_MEMORY |        \
   CPH_PART_TOOLS)

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
  /* The strings of the messages (coord, content, name), of the history entries and of the
   * memory items live in `strings`, an arena the engine owns (common/arena.h): they are freed
   * together by cph_turn_info_free, never one by one. Some are shared rather than copied: a
   * message's role is a literal (or in the arena), a history entry's channel is its view's
   * (views[].channel), and one copy of a sender's text, name or a body may stand for several
   * entries and messages. Nothing writes through them. */
  struct cph_arena_chunk *strings;
  cph_history_entry *history; /* conversation_history; n_history == 0 means "none" */
  size_t n_history;
  cph_tool_usage *tools; /* available_tools: the session's tools that fit the window */
  size_t n_tools;
  size_t n_tools_named;  /* the session's whole tools list: a worker narrows its tools to
                            available_tools whenever this is > 0 (even if none fit) */
  cph_message *messages;
  size_t n_messages;
  cph_obligation *obligations; /* pending_obligations; n_staged is its staged_count */
  size_t n_obligations;        /* < n_staged only when the budget could not list them all */
  cph_memory_item *memories;   /* recent_memory: raw first, then summaries/aggregates */
  size_t n_memories;
  cph_channel_view *views;     /* inbox turns: one per channel of the staged messages */
  size_t n_views;
  cph_context_tokens tokens;
  struct cph_job_work *job; /* job turns: the work to execute (owned by the engine) */
  unsigned omit; /* cph_turn_part bits the lease left out (0: none): those sections and the
                  * messages are left empty; input, staged, views and current_state are
                  * always filled (the engine keeps them) */
  cph_policy_while_running while_running; /* the session's mode as the turn was leased */
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
  char *origin; /* cluster mode: its identity cluster-wide (cph_engine_reply_origins); NULL */
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

/* Cluster mode (server/clusterflow.h 6.): a turn this node parked after :leases :max-attempts,
 * or one it brought back (requeue), as the cluster log's park and unpark marks name it. keys:
 * the idempotency keys of the events its entries stand for (every event folded into one
 * included; events without a key left out) — not consumed: parked input waits for a requeue.
 * session NULL: none. */
typedef struct cph_park_note {
  char *session;
  uint64_t turn_id;  /* its id on this node */
  uint32_t attempts; /* as its record says */
  char *error;       /* its last failure (NULL: none) */
  cph_strv keys;
} cph_park_note;
void cph_park_note_free(cph_park_note *p);

/* ---------------------------------------------------------------- maintenance jobs
 *
 * Jobs (DESIGN §2, §7) queue on maintenance sessions (the built-in "janitor"), run in the
 * maintenance lane, and are executed by cephalond's own maintenance workers: a worker leases
 * with `internal` set, gets a turn whose `job` holds the prepared work, runs cph_job_execute()
 * on its own thread (the only step that may call an embedder, summariser or the network; no
 * LMDB transaction is open then), and completes the turn with the same `job` carrying the
 * results, which the next pass applies. External workers never get job turns. */

typedef enum cph_job_kind_t {
  CPH_JOBK_EMBED_MEMORY,
  CPH_JOBK_AGGREGATE_UPSERT,
  CPH_JOBK_GC_PLAN,
  CPH_JOBK_GC_SUMMARIZE,
  CPH_JOBK_GC_COMMIT,
  CPH_JOBK_OUTBOX_DRAIN,
  CPH_JOBK_RETENTION_REDACT_EVENTS,
  CPH_JOBK_COUNT
} cph_job_kind_t;
const char *cph_job_kind_name(cph_job_kind_t k); /* "embed_memory", "gc_plan", ... */
int cph_job_kind_parse(const char *name, cph_job_kind_t *out); /* CPH_OK or CPH_EINVAL */

/* Prepared work and its results. Inputs are filled by the engine when the job turn starts;
 * outputs by cph_job_execute. Owned by the turn; freed by the engine at completion. */
typedef struct cph_job_work {
  uint64_t job_id;
  cph_job_kind_t kind;
  uint64_t group_id; /* gc jobs */
  /* embed_memory: texts to embed -> vectors (n_items * dims) */
  size_t n_items;
  uint64_t *memory_ids;
  char **texts;
  char **scopes;
  uint32_t dims;
  float *vectors;
  /* gc_summarize: sources -> summary */
  char *summary;
  /* outbox_drain: one batch of one model and shard -> which deletes the index confirmed */
  uint64_t *outbox_ids;
  char *model;
  uint32_t shard;
  bool remote_index; /* the HTTP index: execute calls it; else the pass deletes locally */
  bool *confirmed;
  /* the engine's network providers (cph_engine_options.providers), which execute calls */
  const struct cph_providers *providers;
  /* result of execute */
  int rc;
  char error[256];
} cph_job_work;

/* Runs the slow part of a job (embedder, summariser, HTTP index) with the policy in force,
 * through work->providers for the network ones. Thread-safe; touches no engine state; may
 * block on the network. Sets work->rc. */
void cph_job_execute(const cph_policy *policy, cph_job_work *work);
void cph_job_work_free(cph_job_work *w);

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
  CPH_OP_REQUEUE,
  CPH_OP_JOB_ENQUEUE,   /* POST /v1/maintenance/jobs */
  CPH_OP_CONTEXT_INSERT, /* POST /v1/sessions/{id}/context */
  CPH_OP_CONTEXT_DELETE, /* DELETE /v1/sessions/{id}/context/{node} */
  CPH_OP_CONTEXT_SEAL,   /* POST /v1/sessions/{id}/seal */
  CPH_OP_MEMORY_SEARCH, /* GET /v1/memories/search: a write, since inclusion counts access */
  CPH_OP_TAKE,          /* POST /v1/turns/{id}/take: arrivals into a running turn (:merge) */
  CPH_OP_INBOX_RETAIN,  /* cluster mode's rebuild: drop entries consumed on another node */
  CPH_OP_SESSION_STATE, /* cluster mode's rebuild: a session's state from its previous node */
  CPH_OP_CHANNEL_MEMORIES /* cluster mode's rebuild: a channel's memories from the log */
} cph_op_kind;

/* The most a session's state (u.turn.state, u.context.state, u.state) weighs: under NATS's
 * default max_payload (1 MiB) with room for the headers and the cluster log's epoch prefix
 * (core/handover.h; server/statezip.h bounds an unpacked state by it). */
#define CPH_SESSION_STATE_MAX_BYTES (960u * 1024u)

/* Cluster mode (server/clusterflow.h 13.): a record a session's state carries that the cluster
 * log also keeps under a key of its own, so that it moves with the session after the state's
 * bounds left it out — an ended turn record, a seal or a memory of its own scope, with its
 * origin. name is the key's last token (a kind letter and the origin in hex), data opaque
 * (core/handover.c). */
typedef struct cph_state_item {
  char *name;
  uint8_t *data;
  size_t len;
} cph_state_item;

/* The channel name of the memories of events to a session alone (their direct channels,
 * "direct:<session>"), taken as one group at a takeover (CPH_OP_CHANNEL_MEMORIES). */
#define CPH_DIRECT_MEMORIES "direct:"
/* What a channel memories import read, between its steps (CPH_OP_CHANNEL_MEMORIES). */
typedef struct cph_channel_import cph_channel_import;
/* Memories a channel memories import stores per pass, at most: ~2-8 ms of the loop. */
#define CPH_CHANNEL_IMPORT_STEP 1024u

typedef struct cph_state_items {
  cph_state_item *v;
  size_t n;
} cph_state_items;

void cph_state_items_free(cph_state_items *items);

/* A channel memories item (server/clusterflow.h 16.): the memories parts[0..n) (each a
 * cph_event_result.memory_part of lens[i] bytes) as one item's data, into *data (malloc'd) and
 * *len. CPH_OK or CPH_ENOMEM. */
int cph_channel_memories_item(const uint8_t *const *parts, const size_t *lens, size_t n,
                              uint8_t **data, size_t *len);

/* Items of one session (a maintenance job's: compaction changed that session's memories). */
typedef struct cph_session_items {
  char *session;
  cph_state_items items;
} cph_session_items;
void cph_session_items_free(cph_session_items *si);

/* One tool's counts in a completion's tool_stats.tools: calls made, calls refused for invalid
 * arguments, calls that ran and failed (errors). invalid + errors <= calls is not enforced;
 * the metrics saturate. */
typedef struct cph_tool_stat_in {
  char *name; /* 1..128 bytes */
  uint64_t calls, invalid, errors;
} cph_tool_stat_in;

typedef struct cph_memory_in {
  char *text;
  cph_strv tags;
} cph_memory_in;

typedef struct cph_job_in {
  char *job;  /* a job kind name */
  char *args; /* optional, kind-specific: "group=12", "sources=3,4,5", "memories=1,2" */
} cph_job_in;

/* A PACT node to insert (DESIGN §6). */
typedef struct cph_context_stage_in {
  char *at;
  int64_t ttl; /* 0 = none (allowed on the last stage only: permanent) */
} cph_context_stage_in;

typedef struct cph_context_node_in {
  char *at;      /* "d0, 1, 0" */
  char *content;
  int64_t ttl;     /* 0 = none: permanent */
  int64_t cadence; /* 0 = none */
  cph_context_stage_in *lifecycle;
  size_t n_lifecycle;
  char *key;
  cph_strv tags;
} cph_context_node_in;

/* ---------------------------------------------------------------- memory search
 *
 * GET /v1/memories/search (DESIGN §7). The answer merges two kinds of hits over the session's
 * readable scopes (its own and its channels'), by the rule stated in core/search.c:
 * - vector hits: the query's embedding against the vector index;
 * - lexical hits: query terms against the texts of the newest memories of each scope, which
 *   always covers memories whose embedding is still queued — so a memory is found as soon as
 *   the request that wrote it answered, whatever the embedder.
 * The vector half may need the network (an OpenAI-compatible embedder, the HTTP index). That
 * is never done in a pass: the caller runs cph_search_prepare on a thread of its own before it
 * submits the op, and hands the results in (query_vector, index_hits, degraded). */

#define CPH_SEARCH_K_DEFAULT 10
#define CPH_SEARCH_K_MAX 100

/* One vector hit: cosine similarity, higher is closer. */
typedef struct cph_vhit {
  uint64_t memory_id;
  float score;
} cph_vhit;

/* The vector half of a search, computed by cph_search_prepare. */
typedef struct cph_search_prep {
  float *query_vector; /* dims floats; NULL when the embedder failed or is not needed */
  uint32_t dims;
  cph_vhit *index_hits; /* HTTP index: the hits of every scope, best first per scope */
  size_t n_index_hits;
  bool degraded;   /* the embedder or the index failed (or timed out): lexical answer only */
  char error[256]; /* why, when degraded */
} cph_search_prep;

/* True when the vector half of a search needs cph_search_prepare under policy p (an
 * OpenAI-compatible embedder or the HTTP index); false for the built-in embedder with the
 * embedded index, which the engine runs in the pass (no network, microseconds). */
bool cph_search_needs_prepare(const cph_policy *p);
/* Embeds query through the configured embedder and, with the HTTP index, asks it for the k
 * (clamped as the op's k) best of each scope in scopes[0..n_scopes). The network ones are
 * called through providers (cph_engine_providers; NULL = none). Never fails: a provider error,
 * timeout (each call bounded by its :timeout-ms; the first failure stops the rest) or missing
 * provider sets out->degraded and out->error. Thread-safe; touches no engine state; blocks on
 * the network. Free with cph_search_prep_free. */
void cph_search_prepare(const cph_policy *p, const struct cph_providers *providers,
                        const char *query, const char *const *scopes, size_t n_scopes, size_t k,
                        cph_search_prep *out);
void cph_search_prep_free(cph_search_prep *prep);

typedef struct cph_memory_hit {
  uint64_t id;
  char *kind; /* "raw", "summary", "aggregate" */
  char *text;
  double score;
  char *session; /* its scope: a session id or "#channel" */
  int64_t created_ms;
} cph_memory_hit;

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
      /* delete, out, only while cph_engine_report_consumed is on: the keys of the events its
       * live inbox stood for, dropped with it (as u.turn.consumed), and of those its parked
       * turns hold (they stay listed, as on a single node, but are never brought back). */
      cph_strv consumed;
    } session;
    struct {
      cph_event_in *events;
      size_t n_events;
      cph_event_result *results; /* n_events entries, filled by the engine */
      /* The results' strings and lists (sessions, busy, reason, field) live in this arena the
       * engine owns (common/arena.h): cph_op_clear_results frees them together. */
      struct cph_arena_chunk *strings;
      /* Cluster mode's rebuild (server/clusterflow.h 8.), optional (park_session NULL: none):
       * input another node parked. Once the events are in, in the same operation (no lease
       * can come between), the live entries of park_session that no turn carries and that
       * stand for an event whose key is in park_keys[0..n_park_keys) are parked as one turn,
       * as :leases :max-attempts parks one (core/turns.c): a turn record in state parked with
       * park_attempts and park_error (borrowed), listed by GET /v1/turns?state=parked, its
       * entries out of the live inbox until POST /v1/turns/{id}/requeue. Out: park_turn, the
       * turn made (0: no such entry); park_held, the keys of park_keys the session holds
       * parked after it — in that turn, or in a turn parked here before (this node parked
       * them itself before a restart). Freed by cph_op_clear_results. */
      const char *park_session;
      const char *const *park_keys;
      size_t n_park_keys;
      uint32_t park_attempts;
      const char *park_error;
      uint64_t park_turn;
      cph_strv park_held;
    } ingest;
    struct {
      char *worker;
      bool internal;  /* a cephalond maintenance worker: maintenance lane, job turns only */
      unsigned lanes; /* bit per cph_lane; 0 = all (external workers: never maintenance) */
      int64_t deadline_ns; /* give up (rc CPH_ETIMEDOUT) at this monotonic time */
      unsigned omit; /* cph_turn_part bits the worker does not use (0: the whole answer) */
      bool defer_keep; /* in: the caller finishes keeping the turn's context (cph_keep_job) */
      cph_turn_info turn; /* filled on success; turn.omit = omit */
      struct cph_keep_job *keep; /* out, with defer_keep: the context to keep, or NULL */
    } lease;
    struct {
      uint64_t turn_id;
      char lease[33];
      uint64_t tokens;
      uint64_t tool_calls;
      char *reply_body;    /* NULL: no reply */
      char *reply_channel; /* NULL: the channel of the turn's first staged message */
      char *error;         /* fail: reason */
      struct {
        uint64_t valid, invalid, repairs, guard_denies; /* the aggregate fields */
        cph_tool_stat_in *tools; /* per tool (complete only); the engine reads them only */
        size_t n_tools;
      } tool_stats;
      int64_t deadline_ms; /* heartbeat: the new deadline */
      bool already;        /* complete: it had been completed before (idempotent answer) */
      /* Arrivals during the turn (DESIGN §4). heartbeat out: while_running is the session's
       * mode; arrived counts the entries staged for the session since the lease and not
       * taken (reported under :merge and :interrupt); interrupt is true once :interrupt
       * asked the worker to stop. complete in: interrupted — the worker stopped because it
       * was asked (its input is staged again for the next turn, see core/turns.c). take
       * out: taken, the entries moved into the turn (as a lease's staged). */
      cph_policy_while_running while_running;
      uint32_t arrived;
      bool interrupt;
      bool interrupted;
      cph_staged_msg *taken;
      size_t n_taken;
      cph_memory_in *memories; /* complete: memories to mint, scoped to the session */
      size_t n_memories;
      cph_job_in *enqueue; /* complete: maintenance jobs to queue */
      size_t n_enqueue;
      cph_job_work *job;   /* complete of a job turn: the executed work (engine frees it) */
      /* complete, out, only while cph_engine_report_consumed is on (cluster mode): the
       * idempotency keys of every event the turn consumed — each entry's first event and every
       * event folded into it (DESIGN §5); events without a key are left out — and the turn's
       * session. A repeated completion (`already`) lists them again. Empty when nothing was
       * consumed (interrupted, an autonomy tick, a job). Freed by cph_op_clear_results. */
      cph_strv consumed;
      char *consumed_session;
      /* complete, out, only while cph_engine_report_consumed is on, for a completion that wrote
       * a reply (a repeated one did not): the channel whose history took it (malloc'd) and the
       * time it was written with, so the cluster log can copy it into the other nodes' copies of
       * that channel (server/clusterflow.h 14.); its text is reply_body. Freed by
       * cph_op_clear_results. */
      char *reply_written_channel;
      int64_t reply_written_ms;
      /* complete, out, only while cph_engine_report_consumed is on, when the completion (or a
       * repeated one) stands: the session's state as it is after it, an opaque blob (core/turns.c
       * says what it holds; malloc'd, state_len bytes), for the cluster log to keep
       * (clusterflow.h 11.); consumed_session names the session then, also when nothing was
       * consumed. NULL when the engine could not read it (logged; the completion stands). */
      uint8_t *state;
      size_t state_len;
      /* complete, out, with state: the turn record the completion ended and those of the
       * session's turns that failed since its previous completion, as items (cph_state_item),
       * for the cluster log to keep each under its own key. A repeated completion gives them
       * again. fail, out, while cph_engine_report_consumed is on: the failed turn's record and
       * kept context as items, and consumed_session names its session; requeue likewise the
       * record, "requeued" now. Freed by cph_op_clear_results. */
      cph_state_items items;
      /* complete of a job turn, out, while cph_engine_report_consumed is on: a gc_commit that
       * compacted memories of a session's own scope gives that session's items — the summary
       * and the sources it tombstoned (a tombstoned memory's item says it is gone) — for the
       * cluster log to keep under their keys. Freed by cph_op_clear_results. */
      cph_session_items job_items;
      /* fail, in (cluster mode): the turn is handed back because another node serves its
       * session now — no attempt is counted, and the session is not picked again until a
       * CPH_OP_INBOX_RETAIN says this node serves it again. */
      bool away;
      /* While cph_engine_report_consumed is on (cluster mode), out: a fail that parked its turn
       * names it here, the keys of the events it carries with it; a requeue names the turn it
       * brought back and the keys of the events now staged again. park.session NULL: nothing
       * parked or brought back. A turn a lease expiry parks has no op: cph_engine_take_parks
       * hands it over. Freed by cph_op_clear_results. */
      cph_park_note park;
    } turn;
    struct {
      cph_job_in in;
      uint64_t job_id; /* out */
    } job;
    struct {
      char *session;
      cph_context_node_in node; /* insert */
      uint64_t node_id;         /* delete; insert: out */
      bool updated;             /* insert: out — the key matched a live node, updated in place */
      char *trigger;            /* seal */
      uint64_t seal_id;         /* seal: out */
      /* insert, delete and seal, cluster mode (cph_engine_report_consumed on): out, the
       * session's state after the change (as u.turn.state), for the cluster log — the answer
       * waits until the log holds it, so an edit or seal answered 200 moves with its session;
       * NULL when it could not be read (logged) */
      uint8_t *state;
      size_t state_len;
      cph_state_items items; /* seal, with state: the seal as an item (cph_state_item) */
    } context;
    struct {
      char *session;
      char *query;
      size_t k; /* 0 = CPH_SEARCH_K_DEFAULT; above CPH_SEARCH_K_MAX it is clamped */
      /* Inputs prepared off the pass by cph_search_prepare (borrowed, all optional; see
       * there). Without them the engine searches vectors itself only when the built-in
       * embedder and the embedded index are configured, and answers lexically otherwise. */
      const float *query_vector; /* :providers :embeddings :dimensions floats, or NULL */
      uint32_t dims;
      const cph_vhit *index_hits; /* the HTTP index's hits over the session's scopes */
      size_t n_index_hits;
      bool degraded; /* in: preparing failed; out: the vector half of the answer is missing */
      cph_memory_hit *hits; /* out */
      size_t n_hits;
    } search;
    /* CPH_OP_INBOX_RETAIN (server/clusterflow.h, 8.): of session's live entries that no
     * running turn carries, each that stands for keyed events none of whose keys is in
     * keep[0..n_keep) is consumed without a turn (a turn of another node consumed it while
     * this node did not serve the session); entries with a kept key, or without any key, stay.
     * A reporter session's entries (report_interval_s) are left as they are. The session may
     * be picked again (it is no longer away, see u.turn.away).
     * Then the session's parked turns here, each by the keys of its events: one with a key in
     * parked[0..n_parked) (parked as the log's park marks say) stays parked; one with a key in
     * keep that the log's unpark marks name (unparked[0..n_unparked): requeued on another node
     * and not consumed yet) is requeued here, its entries with a kept key staged again and the
     * others consumed; one with a key in keep and no such mark (parked before park marks were
     * logged, or its mark was lost) stays parked, its kept keys listed in held (out); one none
     * of whose keys is kept (consumed on another node, or below the watermark) leaves the
     * parked list (its record says requeued) and its entries are consumed. A turn with no key
     * stays parked. Counts in parked_requeued and parked_dropped (out). */
    struct {
      char *session;
      const char *const *keep;
      size_t n_keep;
      uint32_t dropped; /* out: entries consumed */
      const char *const *parked;
      size_t n_parked;
      const char *const *unparked;
      size_t n_unparked;
      uint32_t parked_requeued, parked_dropped; /* out */
      cph_strv held;                            /* out; freed by cph_op_clear_results */
    } retain;
    /* CPH_OP_SESSION_STATE (server/clusterflow.h 11.): session (which must exist) takes the
     * state another node exported (a completion's u.turn.state): its context tree replaces the
     * one it has, its episode and credits are set, the replies it carries that this node lacks
     * join its channels' history and (by origin, cph_engine_reply_origins) its replies stream.
     * CPH_EINVAL (field "state") for a blob that is not one, or of another store schema. The
     * data is borrowed until done; CPH_SESSION_STATE_MAX_BYTES at most, as exported. Before
     * it, items[0..n_items) (cph_state_item's data, borrowed; data may be NULL: items only):
     * each turn record or seal whose origin this node lacks is stored as the state's are,
     * oldest first, so that the records' ids here follow the order they were made in; an
     * item that is malformed, of another session or of another store schema is logged, naming
     * it, counted in items_refused (out) and left out — the others are taken. */
    struct {
      char *session;
      const uint8_t *data;
      size_t len;
      const cph_state_item *items;
      size_t n_items;
      uint32_t items_refused;
    } state;
    /* CPH_OP_CHANNEL_MEMORIES (server/clusterflow.h 16.): the memories of channel memories
     * items (cph_channel_memories_item; borrowed until done) of `channel` that this node
     * lacks are stored in the channel's scope, oldest first, each under its origin (its
     * event's identity cluster-wide): one this node has a memory of that origin of (taken
     * before, or minted from the event: cph_event_in.memory_origin), or — for memories minted
     * without one — holds a copy of (a memory of the scope with the same text and class, live
     * or compacted away by its gc, each copy standing for one memory), is not stored again;
     * and a delivery of the event after the import (a rebuild's) finds its memory by origin
     * and mints none. An item or a memory that is malformed, of another channel or of
     * another store schema is logged, counted in refused and left out — the others are
     * taken. In steps: each pass stores at most `step` memories (0: CPH_CHANNEL_IMPORT_STEP)
     * and the operation waits behind what was queued meanwhile for the next (cont: the
     * engine's, between steps), so a channel of a million memories does not hold the loop
     * for seconds; done comes after the last step (or the one that failed: the steps before
     * it stay stored). Operations queued after this one may thus be applied before it ends:
     * a caller that needs the import first waits for its done. Out: added, held (over all
     * steps). With `channel` CPH_DIRECT_MEMORIES: the items of a shard's events to a session
     * alone, whose memories are of many direct channels ("#direct:<session>"): each is
     * stored in its own scope (one of another form is refused), oldest first, held only by
     * its origin (direct memories had none before these items: no copy to match). */
    struct {
      char *channel;
      const cph_state_item *items;
      size_t n_items;
      uint32_t step;
      cph_channel_import *cont;
      uint32_t added, held, refused;
    } channel;
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
 * caller's inputs. A lease's keep job not written yet is abandoned (loop only, then). */
void cph_op_clear_results(cph_op *op);

/* A lease's kept context (the context explorer's), finished beside the loop. A lease
 * submitted with u.lease.defer_keep leaves in u.lease.keep, when its turn's context is to be
 * kept, what keeping it still needs (core/turnlog.h, "Deferred keeping"): the caller works it
 * out with cph_keep_job_compute on any thread (jobs of different leases may run at once), then,
 * on the loop and before it answers the lease — so a read that follows the answer sees the
 * context —, writes it with cph_engine_keep_write. A job not written is abandoned by
 * cph_op_clear_results. Never fails the lease: a context that cannot be kept is logged. */
void cph_keep_job_compute(struct cph_keep_job *job);
/* Writes op's keep job (computed) in a write transaction of its own and clears
 * op->u.lease.keep; nothing when there is none. Loop only, between passes. */
void cph_engine_keep_write(cph_engine *e, cph_op *op);

/* Cluster mode (server/clusterflow.h, the done marks): while on, a completion and a session
 * delete name the events they consumed (cph_op u.turn.consumed, u.session.consumed), which
 * costs a read of each event's record; off (the default) they do nothing of the kind. */
void cph_engine_report_consumed(cph_engine *e, bool on);
/* Cluster mode (server/clusterflow.h 11.): from now on each reply a completion writes gets an
 * origin naming `node` (core/replystream.h: its identity cluster-wide, cph_reply_info.origin),
 * and the replies a session's state carries are added to this node's stream when their
 * origin is new here. Off (the default, and NULL): replies have no origin. CPH_OK, CPH_EINVAL
 * for a name over 128 bytes, CPH_ENOMEM. Call before the first pass. */
int cph_engine_reply_origins(cph_engine *e, const char *node);

/* Cluster mode (server/clusterflow.h 6.), while cph_engine_report_consumed is on: the turns
 * an expired lease parked since the last call (a fail that parks names its turn in its op,
 * u.turn.park), oldest first, into *out (malloc'd; free each with cph_park_note_free, then the
 * array). Committed when handed over. CPH_OK (*n 0: none) or CPH_ENOMEM (they stay). */
int cph_engine_take_parks(cph_engine *e, cph_park_note **out, size_t *n);

/* The same protocol for the items (u.turn.items) of the turns that ended with no operation
 * to carry them — a lease expiry (parked or not), a while_running :restart supersede — each
 * session's turn record and kept turn context, for the cluster log to keep under their keys
 * (server/clusterflow.h 13.). Free each with cph_session_items_free, then the array. */
int cph_engine_take_ended_items(cph_engine *e, cph_session_items **out, size_t *n);

/* ---------------------------------------------------------------- reads */

/* The idempotency keys of the events session's live inbox stands for — entries pending, staged
 * or carried by its running turn, with every event folded into them; events without a key left
 * out — into out (malloc'd; free with cph_strv_free). CPH_ENOTFOUND for an unknown session.
 * Cluster mode's rebuild reads it (server/clusterflow.h). */
int cph_engine_inbox_keys(cph_engine *e, const char *session, cph_strv *out, cph_err *err);

int cph_engine_get_session(cph_engine *e, const char *id, cph_session_info *out, cph_err *err);

/* The memory scopes session may read, as stored now: its own id first, then "#channel" for
 * each channel it subscribes to, then each it is a member of (at most 64 in all). out->items
 * are malloc'd (free with cph_strv_free). CPH_ENOTFOUND for an unknown session. */
int cph_engine_memory_scopes(cph_engine *e, const char *session, cph_strv *out, cph_err *err);
void cph_strv_free(cph_strv *v);

typedef struct cph_session_filter {
  bool by_lane;
  cph_lane lane;
  bool by_state;
  cph_session_state_t state;
  const char *after;  /* ids greater than this (pagination) */
  size_t limit;       /* 0 = 100 */
  const char *prefix; /* only ids that begin with it (NULL or "": all); O(page), a seek */
} cph_session_filter;
/* Sessions in id order. */
int cph_engine_list_sessions(cph_engine *e, const cph_session_filter *f, cph_session_info **out,
                             size_t *n, cph_err *err);

typedef struct cph_why_info {
  const char *reason; /* "no_input", "paused", "running", "lane_out_of_budget",
                         "concurrency_full", "runnable", "waiting_for_report" (a reporter whose
                         staged input is held until its next report, DESIGN §4) */
  cph_lane lane;
  double credits;
  double waiting_s;
  int64_t until_ms;  /* lane_out_of_budget: wall-clock ms when the lane has budget again */
  uint64_t rank;     /* runnable: 1 = next in its lane */
  uint64_t lane_runnable;
  uint64_t ahead_in_higher_lanes;
  uint32_t staged, pending;
  int64_t next_report_in_s; /* reporters: seconds until the next report may run; -1 otherwise */
  /* DESIGN §3.9, §3.11. The forecast fields are 0 (est_start_ms -1) unless the session is
   * queued: reasons lane_out_of_budget, concurrency_full, seats_reserved, runnable. */
  char tenant[129];          /* "" = no tenant (the default tenant) */
  uint64_t position;         /* in its lane's pick order if nothing else changes; 1 = next */
  uint64_t tenant_position;  /* among its tenant's runnable sessions in the lane */
  uint64_t tenant_runnable;
  uint64_t turns_ahead;      /* position - 1 + runnable sessions in higher lanes with budget */
  int64_t est_start_ms;      /* wall-clock estimate; -1 when the lane has no recent completions */
  double est_start_in_s;     /* the same, from now; -1 when unknown */
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
  /* DESIGN §3.8, §3.10, §3.11 */
  double tokens_left;        /* 0 without a token budget */
  int64_t budget_tokens;     /* 0 = no token budget */
  uint32_t seats;            /* reserved for the lane */
  uint32_t seats_lent;       /* of its reserved seats, held by other lanes now */
  uint32_t seats_borrowed;   /* its turns beyond its seats and the shared pool */
  uint64_t tenants_runnable; /* tenants with runnable sessions in the lane */
  uint32_t tenant_run;       /* §3.9: picks in a row a tenant takes now (1 = exact order) */
  uint32_t recent_completions; /* the forecast's window (at most 32) */
  double mean_turn_s;        /* over that window; 0 when empty */
  double completion_spacing_s;
} cph_lane_info;
void cph_engine_lanes(cph_engine *e, cph_lane_info out[CPH_LANE_COUNT], uint32_t *limit,
                      uint32_t *in_use);

/* Replies with id > after, oldest first, at most limit. *next is the id to pass as `after`
 * next time. */
int cph_engine_replies(cph_engine *e, uint64_t after, size_t limit, cph_reply_info **out,
                       size_t *n, uint64_t *next, cph_err *err);
/* The newest acknowledged reply id (0 if none): a long-poll waits while this is <= its
 * `after`. cph_engine_replies never returns a newer one: under :sync :always a reply whose
 * commit is not yet on disk is not shown. */
uint64_t cph_engine_last_reply_id(const cph_engine *e);
/* The replies stream's identity (16 hex digits): the same across restarts on one data
 * directory, a new one on another directory or a copy (a backup started on), whose reply ids
 * start over or go back — a reader's cursor is good for one identity (GET /v1/replies
 * "stream"). */
const char *cph_engine_replies_stream(const cph_engine *e);

int cph_engine_parked_turns(cph_engine *e, cph_parked_turn **out, size_t *n, cph_err *err);

/* A turn's record (GET /v1/turns/{id}, GET /v1/turns?session=): what the node stored of it. In
 * cluster mode `origin` is its identity in the whole cluster ("<node>/<id there>/<16 hex>",
 * core/turnrecs.h); a record another node made came with its session's state and is history
 * here (never leased again). NULL on a single node. */
typedef struct cph_turn_record {
  uint64_t id;
  char *session;
  cph_lane lane;
  cph_turn_kind_t kind;
  const char *state; /* "leased", "completed", "failed", "expired", "parked", "requeued",
                      * "superseded" (static) */
  char *worker;      /* NULL: none */
  uint64_t episode;
  uint32_t attempts;
  char *input;       /* NULL: none */
  int64_t created_ms, deadline_ms, completed_ms; /* completed_ms: when it ended, 0 while not */
  uint64_t cost_tokens, tool_calls;
  char *error;       /* NULL: none */
  char *origin;
} cph_turn_record;
void cph_turn_record_free(cph_turn_record *t);
/* CPH_OK, CPH_ENOTFOUND (no turn `id` on this node) or the store's error. */
int cph_engine_turn_record(cph_engine *e, uint64_t id, cph_turn_record *out, cph_err *err);
/* The session's ended turns (every one leased, once it ended: completed, failed, expired,
 * superseded or parked — "requeued" once it was — those it carried from other nodes included,
 * a parked one there history that cannot be requeued),
 * newest first, at most limit: *out (free each with cph_turn_record_free, then the array).
 * Turns that ended before this build are not listed. CPH_ENOTFOUND: no such session. */
int cph_engine_session_turn_records(cph_engine *e, const char *session, size_t limit,
                                    cph_turn_record **out, size_t *n, cph_err *err);

typedef struct cph_engine_storage {
  uint64_t map_size_bytes;
  uint64_t used_bytes;
  uint64_t fsyncs; /* disk flushes since open (fdatasync calls and O_DSYNC meta writes) */
} cph_engine_storage;
int cph_engine_storage_stats(cph_engine *e, cph_engine_storage *out);

/* Online backup (POST /v1/admin/backup, cephalonctl backup): a consistent, compacted copy of
 * the store into dir, a directory that must not exist or be empty. Unlike every other call
 * here it may run on any thread while the engine serves — it reads the store through a
 * transaction of its own and writers keep going — but not past cph_engine_close. The copy
 * holds everything committed when it began; a daemon started on dir serves that state. */
int cph_engine_backup(cph_engine *e, const char *dir, cph_err *err);
/* On the engine's thread, right before a copy starts elsewhere: what was acknowledged so far
 * is committed where the copy's transaction sees it (the store's span ends, store.h). */
void cph_engine_backup_begin(cph_engine *e);
/* The directory check cph_engine_backup starts with (dir new, or an empty directory), for a
 * caller that wants to refuse a bad dir before starting the copy elsewhere. */
int cph_engine_backup_dir_check(const char *dir, cph_err *err);

/* ---- maintenance reads ---- */

typedef struct cph_gc_group_info {
  uint64_t group_id;
  const char *state; /* "planned", "summarized", "committed", "aborted" */
  uint64_t *source_ids;
  size_t n_source_ids;
  int64_t newest_ts_ms;
  uint64_t total_tokens_est;
  char group_hash[65];
  uint64_t summary_id;
  char *session;
} cph_gc_group_info;
void cph_gc_group_info_free(cph_gc_group_info *g);
/* state NULL = all; newest first, at most limit (0 = 100). */
int cph_engine_gc_groups(cph_engine *e, const char *state, size_t limit, cph_gc_group_info **out,
                         size_t *n, cph_err *err);
int cph_engine_gc_group(cph_engine *e, uint64_t id, cph_gc_group_info *out, cph_err *err);

typedef struct cph_outbox_info {
  uint64_t id;
  const char *op;     /* "vector_delete" */
  const char *status; /* "pending", "done" */
  uint64_t memory_id;
  char *model;
  uint32_t shard;
  uint32_t attempts;
  int64_t created_ms;
  int64_t next_attempt_ms;
  int64_t done_ms;
  char *last_error;
} cph_outbox_info;
void cph_outbox_info_free(cph_outbox_info *o);
int cph_engine_outbox(cph_engine *e, const char *status, size_t limit, cph_outbox_info **out,
                      size_t *n, cph_err *err);

typedef struct cph_job_info {
  uint64_t id;
  const char *kind;
  const char *state; /* "queued", "running", "done", "failed" */
  char *session;
  char *args;
  uint64_t group_id;
  uint32_t attempts;
  int64_t created_ms;
  int64_t finished_ms;
  char *error;
} cph_job_info;
void cph_job_info_free(cph_job_info *j);
/* Newest first. */
int cph_engine_jobs(cph_engine *e, const char *state, size_t limit, cph_job_info **out, size_t *n,
                    cph_err *err);

typedef struct cph_maint_stats {
  uint64_t outbox_pending;
  double outbox_oldest_age_seconds;
  uint64_t embed_queue;
  uint64_t groups_committed_total;
  uint64_t memories_deleted_total;
  uint64_t summaries_created_total;
} cph_maint_stats;
void cph_engine_maint_stats(cph_engine *e, cph_maint_stats *out);

typedef struct cph_event_info {
  uint64_t id;
  char *channel;
  char *sender;
  char *body; /* NULL once retention (or backpressure step 5) dropped the payload */
  char *kind;
  char *session;
  int64_t ts_ms;
  int64_t received_ms;
  const char *status; /* "queued", "stored", "aggregated" */
  char body_sha256[65]; /* hex; kept after the payload is gone */
  uint64_t family;
} cph_event_info;
void cph_event_info_free(cph_event_info *ev);
/* GET /v1/events/{id}: a stored event as it is now (CPH_ENOTFOUND once retention removed it). */
int cph_engine_get_event(cph_engine *e, uint64_t id, cph_event_info *out, cph_err *err);

/* ---- duplicate families and channel backpressure (DESIGN §5) ---- */

/* A family (aggregate): events whose content repeated, exactly or nearly, within the dedupe
 * window. It appears with the first duplicate; dup_count counts every occurrence including
 * the original (so 2 at creation). */
typedef struct cph_aggregate_info {
  uint64_t family;
  uint64_t dup_count;
  char *sample; /* the original's body (first bytes) */
  cph_strv channels;
  int64_t first_ms; /* the original's arrival, wall-clock ms */
  int64_t last_ms;  /* the newest duplicate */
  uint64_t simhash;
} cph_aggregate_info;
void cph_aggregate_info_free(cph_aggregate_info *a);
/* The top families by dup_count, largest first (ties: older family first): at most top
 * (0 = 10; capped at 256). *out is malloc'd (free each entry, then the array). */
int cph_engine_aggregates(cph_engine *e, size_t top, cph_aggregate_info **out, size_t *n,
                          cph_err *err);

/* Backpressure triggers, as bits of cph_channel_info.triggers. */
enum {
  CPH_BP_TRIGGER_EVENTS = 1u << 0,        /* :max-events-per-minute exceeded */
  CPH_BP_TRIGGER_FAMILY_GROWTH = 1u << 1, /* a family grew faster than allowed */
  CPH_BP_TRIGGER_EMBED_QUEUE = 1u << 2,   /* embedding queue over :max-queue */
  CPH_BP_TRIGGER_MAINTENANCE = 1u << 3    /* maintenance budget exhausted repeatedly */
};
/* "events_per_minute", "family_growth", "embedding_queue", "maintenance_budget". */
const char *cph_bp_trigger_name(unsigned bit);
/* Step names: 0 "normal", 1 "aggregate_only", 2 "skip_aggregate_embeddings",
 * 3 "widen_dedupe_window", 4 "delay_reports", 5 "drop_payloads". */
const char *cph_bp_step_name(uint32_t step);

/* What put a channel at its step (cph_channel_info.trigger). name: the trigger's name
 * (cph_bp_trigger_name) when a trigger raised it, with the figure that went over its limit
 * at that check; "policy" when :degrade-to-aggregate-only? holds it at step 1 (or :max-step
 * capped it), without a figure; "unknown" for a step stored by an older cephalond; NULL at
 * step 0. While a channel recovers step by step it keeps the trigger that raised it. */
typedef struct cph_bp_cause {
  const char *name;
  bool has_figure; /* figure and limit are set (not for "policy" / "unknown") */
  uint64_t figure; /* events/min, a family's growth/min, embeddings queued, or checks in a row
                    * without maintenance budget */
  uint64_t limit;  /* the figure was over this: the policy's limit for it */
} cph_bp_cause;

typedef struct cph_channel_info {
  char *id;
  uint32_t step; /* effective degrade step, 0..5 */
  const char *step_name;
  cph_bp_cause trigger; /* why it is at `step` */
  uint64_t events_per_minute;        /* events in the last 60 s */
  uint64_t family_growth_per_minute; /* the fastest family's duplicates in the last 60 s */
  unsigned triggers;                 /* CPH_BP_TRIGGER_* holding at the last check */
  int64_t since_ms;                  /* wall-clock ms the current step began; 0 = never moved */
  uint32_t calm_intervals;           /* calm intervals counted towards the next step back */
  uint32_t subscribers, members;
  struct {
    int64_t max_events_per_minute;
    int64_t max_family_growth_per_minute;
    bool degrade_to_aggregate_only;
    int64_t max_step;
    int64_t interval_s;
    int64_t recover_intervals;
    int64_t dedupe_window_seconds; /* as applied now (x4 from step 3) */
  } settings; /* the effective policy for this channel */
} cph_channel_info;
void cph_channel_info_free(cph_channel_info *c);
/* A channel's backpressure state. CPH_ENOTFOUND when the engine knows nothing of the channel
 * (no subscriber or member, no history, no policy override); CPH_EINVAL for a bad name. */
int cph_engine_channel(cph_engine *e, const char *id, cph_channel_info *out, cph_err *err);

/* ---- the live operations view (GET /v1/top; core/top.c) ----
 * On-demand admin reads of in-memory state; never called from the scheduler pass. */

#define CPH_TOP_SESSIONS_DEFAULT 10
#define CPH_TOP_SESSIONS_MAX 100

/* The n busiest sessions (0 = CPH_TOP_SESSIONS_DEFAULT, capped at CPH_TOP_SESSIONS_MAX):
 * those with staged + pending > 0, most first, ties by id. Each entry is what
 * cph_engine_get_session() answers. Cost: O(sessions · log n) over the in-memory sessions,
 * plus one LMDB read per chosen session. *out is malloc'd (free each entry with
 * cph_session_info_free, then the array); NULL when *n_out is 0. */
int cph_engine_top_sessions(cph_engine *e, size_t n, cph_session_info **out, size_t *n_out,
                            cph_err *err);

typedef struct cph_channel_step {
  char *channel;
  uint32_t step;         /* effective degrade step, 0..5 (floor and :max-step applied) */
  const char *step_name; /* cph_bp_step_name(step) */
} cph_channel_step;
/* Every channel the backpressure tracker knows whose effective step is >= min_step (1 = the
 * degraded ones), deepest step first, then by name. O(tracked channels). */
int cph_engine_channel_steps(cph_engine *e, uint32_t min_step, cph_channel_step **out, size_t *n,
                             cph_err *err);
void cph_channel_steps_free(cph_channel_step *steps, size_t n);

/* ---- context (DESIGN §6) ---- */

typedef struct cph_context_stage_info {
  char at[48];
  int64_t ttl; /* -1 = none */
} cph_context_stage_info;

typedef struct cph_context_node_info {
  uint64_t id;
  char at[48]; /* "d0, 1, 0" */
  char *content;
  char *role; /* message cores: "user" / "assistant"; NULL otherwise */
  int64_t ttl;     /* -1 = none */
  int64_t cadence; /* 0 = none */
  cph_context_stage_info *lifecycle;
  size_t n_lifecycle;
  char *key;
  cph_strv tags;
  uint64_t created_at_episode;
} cph_context_node_info;
void cph_context_nodes_free(cph_context_node_info *nodes, size_t n);

/* The session's live nodes in render order, those matching selector (NULL: all). CPH_EINVAL
 * with err naming the problem for a bad selector. */
int cph_engine_context(cph_engine *e, const char *session, const char *selector,
                       cph_context_node_info **out, size_t *n, uint64_t *episode, cph_err *err);

/* What the next `episodes` episodes would do to the tree, without changing anything: the
 * live nodes after each step (turns that add no messages: delta 0). out[i] holds n[i] nodes. */
typedef struct cph_context_step {
  uint64_t episode;
  cph_context_node_info *nodes;
  size_t n;
} cph_context_step;
int cph_engine_context_step(cph_engine *e, const char *session, size_t episodes,
                            cph_context_step **out, cph_err *err);
void cph_context_steps_free(cph_context_step *steps, size_t n);

typedef struct cph_seal_info {
  uint64_t id;
  char *trigger;
  uint64_t episode;
  int64_t created_ms;
  cph_message *messages;
  size_t n_messages;
  char *origin; /* cluster mode (cph_engine_reply_origins): "<node>/<seal id there>/<16 hex>",
                   its identity cluster-wide (core/seals.h); NULL on a single node */
} cph_seal_info;
int cph_engine_seals(cph_engine *e, const char *session, cph_seal_info **out, size_t *n,
                     cph_err *err);
void cph_seals_free(cph_seal_info *seals, size_t n);

/* ---- kept turn contexts and the context diff (the context explorer; core/turnlog.h) ----
 * At lease every turn but a job turn keeps what its context was — the messages (and the tree
 * node each renders), the sections' items, the token accounts and cuts, and the PACT tree as
 * the turn saw it — for the newest :context :keep-turns turns of each session. A lease that
 * left parts out (`include`) keeps what was assembled: the parts left out are empty and
 * named in `omit`. Reads take their own read transaction. */

typedef struct cph_kept_turn {
  uint64_t id;
  cph_turn_kind_t kind;
  uint64_t episode;
  int64_t created_ms;
  unsigned omit;             /* cph_turn_part bits left out by the lease */
  cph_context_tokens tokens; /* as assembled */
  size_t n_messages;
  char *input;
} cph_kept_turn;

/* A section item of a kept turn: what it was, looked up now where the turn kept only its id
 * (history: the event; memories: the memory). text is NULL when that is gone. */
typedef struct cph_kept_item {
  uint64_t id;  /* event id (history), memory id, inbox message id (obligations) */
  char *label;  /* history: the sender; memories: the kind; obligations: NULL */
  char *text;   /* history: the body; memories: the text; obligations: "sender: preview" */
} cph_kept_item;

typedef struct cph_kept_node {
  uint64_t id;
  char at[48];
  char *role;    /* NULL for nodes without one */
  char *content; /* its first bytes (at most 160) */
  int64_t ttl;     /* -1 = none */
  int64_t cadence; /* 0 = none */
  uint64_t created_at_episode;
  bool waiting;    /* expired, waiting for its cadence: not rendered */
  uint32_t stage, n_lifecycle; /* n_lifecycle 0: no lifecycle */
} cph_kept_node;

typedef struct cph_turn_context {
  cph_kept_turn turn;
  cph_message *messages;
  uint64_t *message_nodes; /* per message: the tree node it renders, 0 = none */
  size_t n_messages;
  cph_kept_item *history, *memories, *obligations;
  size_t n_history, n_memories, n_obligations;
  cph_kept_node *nodes;
  size_t n_nodes;
  cph_strv channels; /* the channels of its staged messages */
  cph_strv tools;
} cph_turn_context;

/* One difference between two kept turns `from` and `to`. reason says why, as far as the kept
 * contexts and the store can tell: for what left `to` — "ttl_expired", "cadence" (expired and
 * waiting for its cadence), "lifecycle" (moved past its last stage), "window_budget" (still
 * there, cut by the window), "compaction" (a memory replaced by a summary), "history_bound"
 * (an old message core pruned from the tree), "deleted", "consumed" (an obligation its turn
 * answered), "turn_kind" (the part does not exist on that kind of turn), "not_in_scope" (the
 * history of another channel), "not_yet_created" (comparing backwards), "unknown"; for what
 * entered — "inserted", "cadence" (re-created), "new" (a new message or item), "staged"; for
 * what changed — "moved" (ODI shift or lifecycle: from_at -> at), "content". */
typedef struct cph_context_change {
  const char *part;   /* "node", "message", "conversation_history", "recent_memory",
                         "pending_obligations" */
  const char *change; /* "entered", "left", "changed" */
  const char *reason; /* static, above */
  char *detail;       /* one sentence for people, may be NULL */
  uint64_t id;        /* node, event, memory or inbox message id; 0 for channel-view messages */
  char *role;         /* messages and role nodes; history: the sender; memories: the kind */
  char *content;      /* messages: the content; nodes: the preview; items: their text */
  char *at;           /* messages: the coord; nodes: where (for "changed", where it is now);
                       * history: the channel; memories: the scope */
  char *from_at;      /* "changed": where it was */
} cph_context_change;

typedef struct cph_context_diff {
  cph_kept_turn from, to;
  cph_context_change *changes; /* nodes, messages, then the sections; left, entered, changed */
  size_t n;
} cph_context_diff;

/* The session's kept turns, oldest first. CPH_ENOTFOUND for an unknown session. */
int cph_engine_kept_turns(cph_engine *e, const char *session, cph_kept_turn **out, size_t *n,
                          cph_err *err);
void cph_kept_turns_free(cph_kept_turn *t, size_t n);
/* One kept turn's context; CPH_ENOTFOUND when the session or the turn is not kept. */
int cph_engine_turn_context(cph_engine *e, const char *session, uint64_t turn,
                            cph_turn_context *out, cph_err *err);
void cph_turn_context_free(cph_turn_context *c);
/* What changed from turn `from` to turn `to` (any two kept turns of the session, in either
 * order). CPH_ENOTFOUND (err says which) when either is not kept. */
int cph_engine_context_diff(cph_engine *e, const char *session, uint64_t from, uint64_t to,
                            cph_context_diff *out, cph_err *err);
void cph_context_diff_free(cph_context_diff *d);

/* ---- metrics (DESIGN §10) ---- */

/* Every cephalon_* metric in the Prometheus text exposition format 0.0.4 (serve it as
 * "text/plain; version=0.0.4; charset=utf-8"): malloc'd and NUL-terminated, *len its length
 * (len may be NULL); NULL on out of memory. Never O(sessions): credits are sampled (at most
 * 10,000 sessions a scrape) and per-channel and per-family series are capped. Whether to serve
 * it (:metrics :enabled?) is the caller's decision. */
char *cph_engine_metrics_text(cph_engine *e, size_t *len);
/* Counts a rejected policy reload (cephalon_policy_reload_failures_total): the daemon calls
 * it when a SIGHUP or API reload fails, whatever the step that refused it. */
void cph_engine_note_reload_failure(cph_engine *e);

/* Hooks the daemon sets: to wake long-polls, and to overlap the disk flush with the next
 * pass. */
typedef struct cph_engine_hooks {
  void *ctx;
  /* Inside a pass or cph_engine_flushed(), once the replies up to last_reply_id are
   * acknowledged (durable under :sync :always). */
  void (*replies_appended)(void *ctx, uint64_t last_reply_id);
  /* NULL (the default): every pass flushes what it must before cph_engine_run_pass returns,
   * and answers all its operations there. Set (the daemon): under :sync :always a pass that
   * acknowledges a durable write commits, then the disk flush runs on a background thread
   * while the driver goes on (reads requests, runs the next passes), and that pass's
   * operations are answered from cph_engine_flushed(), which the driver must call on its own
   * thread soon after this hook. The hook runs ON THE FLUSH THREAD: it may only do what is
   * safe from another thread (write a byte to a pipe). */
  void (*flushed)(void *ctx);
} cph_engine_hooks;
/* Setting hooks without `flushed` after hooks with it stops the flush thread, flushes, and
 * answers every operation still waiting: a driver does that before it stops. */
void cph_engine_set_hooks(cph_engine *e, const cph_engine_hooks *h);
/* Answers the operations whose passes are durable now (or fails them, when a flush failed:
 * see cph_engine_run_pass). The driver calls it after the `flushed` hook; calling it more
 * often is harmless. */
void cph_engine_flushed(cph_engine *e);
/* True while committed operations wait for a flush before they are answered. */
bool cph_engine_answers_held(const cph_engine *e);

#endif
