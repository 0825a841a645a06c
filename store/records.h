/* Stored record kinds (DESIGN §2, §11) and their msgpack codecs.
 *
 * Wire format of every value: a msgpack array [record_version, field1, field2, ...] with the
 * fields in the order of the record's field table (records.c). Decoding is strict: the
 * version must be the one this build writes, the array must have exactly the table's field
 * count, every field must have exactly its type (and enum fields their range), and no bytes
 * may follow. Anything else is CPH_ECORRUPT with a message saying which field and why — never
 * a crash, never an allocation larger than the input justifies.
 *
 * Ownership: decoded records own their strings and arrays (malloc); release them with
 * cph_record_free(). A zero-initialised record is valid to free. Optional strings are NULL
 * when absent (encoded as msgpack nil). */
#ifndef CEPHALON_STORE_RECORDS_H
#define CEPHALON_STORE_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/buf.h"
#include "cephalon/error.h"

/* ---- enumerations stored as u8 ---- */

typedef enum { CPH_SESSION_IDLE, CPH_SESSION_QUEUED, CPH_SESSION_RUNNING, CPH_SESSION_PAUSED,
               CPH_SESSION_STATE_COUNT } cph_session_state;

/* FOLDED: merged into the session's overflow entry, which counts its events (DESIGN §5). */
typedef enum { CPH_INBOX_PENDING, CPH_INBOX_STAGED, CPH_INBOX_CONSUMED, CPH_INBOX_FOLDED,
               CPH_INBOX_PARKED,
               CPH_INBOX_STATUS_COUNT } cph_inbox_status;

typedef enum { CPH_EVENT_QUEUED, CPH_EVENT_STORED, CPH_EVENT_AGGREGATED, CPH_EVENT_STATUS_COUNT
} cph_event_status;

typedef enum { CPH_TURN_INBOX, CPH_TURN_AUTONOMY_TICK, CPH_TURN_JOB, CPH_TURN_REPORT,
               CPH_TURN_KIND_COUNT } cph_turn_kind;

/* SUPERSEDED: revoked because input arrived for a session whose while_running is :restart
 * (DESIGN §4); its input went back to staged and its completion answers superseded. */
typedef enum { CPH_TURN_LEASED, CPH_TURN_COMPLETED, CPH_TURN_FAILED, CPH_TURN_EXPIRED,
               CPH_TURN_PARKED, CPH_TURN_REQUEUED, CPH_TURN_SUPERSEDED,
               CPH_TURN_STATE_COUNT } cph_turn_state;

typedef enum { CPH_MEMORY_RAW, CPH_MEMORY_SUMMARY, CPH_MEMORY_AGGREGATE, CPH_MEMORY_KIND_COUNT
} cph_memory_kind;

typedef enum { CPH_EMBED_NONE, CPH_EMBED_PENDING, CPH_EMBED_READY, CPH_EMBED_DELETED,
               CPH_EMBED_STATUS_COUNT } cph_embed_status;

typedef enum { CPH_JOB_EMBED_MEMORY, CPH_JOB_AGGREGATE_UPSERT, CPH_JOB_GC_PLAN,
               CPH_JOB_GC_SUMMARIZE, CPH_JOB_GC_COMMIT, CPH_JOB_OUTBOX_DRAIN,
               CPH_JOB_RETENTION_REDACT_EVENTS, CPH_JOB_KIND_COUNT } cph_job_kind;

typedef enum { CPH_JOB_QUEUED, CPH_JOB_RUNNING, CPH_JOB_DONE, CPH_JOB_FAILED,
               CPH_JOB_STATE_COUNT } cph_job_state;

typedef enum { CPH_OUTBOX_VECTOR_DELETE, CPH_OUTBOX_OP_COUNT } cph_outbox_op;

typedef enum { CPH_OUTBOX_PENDING, CPH_OUTBOX_DONE, CPH_OUTBOX_STATUS_COUNT } cph_outbox_status;

typedef enum { CPH_GC_PLANNED, CPH_GC_SUMMARIZED, CPH_GC_COMMITTED, CPH_GC_ABORTED,
               CPH_GC_STATE_COUNT } cph_gc_state;

/* ---- records ---- */

typedef struct cph_session_rec {
  char *id; /* 1–128 bytes of [A-Za-z0-9._:@-] */
  uint8_t lane; /* cph_lane: the session's class */
  uint8_t state; /* cph_session_state */
  double credits; /* as of credits_at_ms */
  int64_t credits_at_ms;
  uint64_t episode;
  char **subscribe; /* channels: every event there is staged for the session */
  uint32_t n_subscribe;
  char **member; /* channels seen in context, triggered only by mentions */
  uint32_t n_member;
  uint32_t autonomy_interval_s; /* 0 = no autonomy ticks */
  uint32_t report_interval_s;   /* 0 = no reports */
  uint32_t context_window_tokens;
  char *system; /* optional system prompt */
  char **tools;
  uint32_t n_tools;
  int64_t created_ms;
  int64_t updated_ms;
  /* Since record version 2. 0: its class's default (:sessions :while-running); else
   * 1 + cph_policy_while_running. */
  uint8_t while_running;
  char *tenant; /* since record version 3 (DESIGN §3.9); NULL = none, as older records read */
} cph_session_rec;

typedef struct cph_event_rec {
  uint64_t id; /* monotonic */
  char *channel;
  char *sender;
  char *body; /* NULL once redacted by retention or dropped by backpressure */
  char *session; /* explicit target, optional */
  char **mentions;
  uint32_t n_mentions;
  char *kind; /* optional */
  char *key;  /* idempotency key, optional */
  int64_t ts_ms;       /* as given by the connector (or receive time) */
  int64_t received_ms;
  uint8_t status; /* cph_event_status */
  uint8_t body_sha256[32]; /* of (channel, sender, normalised body); kept after redaction */
  uint64_t simhash;
  uint64_t family; /* aggregate family, 0 = none */
} cph_event_rec;

typedef struct cph_inbox_rec {
  char *session;
  uint64_t seq; /* per-session order of arrival */
  uint64_t event_id;
  uint8_t status; /* cph_inbox_status */
  bool mentioned;
  uint64_t turn_id; /* the turn that consumed it, 0 while not consumed */
  uint32_t attempts; /* turns that carried it without completing */
  int64_t created_ms;
} cph_inbox_rec;

typedef struct cph_turn_rec {
  uint64_t id;
  char *session;
  uint8_t lane;  /* cph_lane */
  uint8_t kind;  /* cph_turn_kind */
  uint8_t state; /* cph_turn_state */
  uint8_t lease[16]; /* random 128-bit lease token */
  char *worker;
  uint64_t *inbox_seqs; /* staged messages it carries */
  uint32_t n_inbox_seqs;
  uint64_t job_id; /* for kind job, else 0 */
  uint64_t episode;
  uint32_t attempts;
  char *input;
  int64_t created_ms;
  int64_t deadline_ms;
  int64_t completed_ms;
  uint64_t cost_tokens;
  uint64_t tool_calls;
  char *error; /* last failure reason, optional */
  /* Since record version 2: the identity cluster-wide of a record another node made and this
   * one imported with its session's state (core/turnrecs.h) — history, never leased here.
   * NULL, as older records read, for every turn this node made. */
  char *origin;
} cph_turn_rec;

typedef struct cph_reply_rec {
  uint64_t id;
  char *session;
  char *channel;
  char *body;
  uint64_t *source_inbox_ids;
  uint32_t n_source_inbox_ids;
  uint64_t turn_id;
  int64_t ts_ms;
  /* since record version 2: its identity cluster-wide (core/replystream.h); NULL, as older
   * records read, on a single node */
  char *origin;
} cph_reply_rec;

typedef struct cph_memory_rec {
  uint64_t id;
  char *session; /* scope */
  uint8_t kind;  /* cph_memory_kind */
  char *text;
  char **tags;
  uint32_t n_tags;
  uint32_t tokens_est;
  int64_t created_ms;
  int64_t last_access_ms;
  uint64_t access_count;
  bool deleted;
  uint8_t embed_status; /* cph_embed_status */
  uint64_t replaced_by; /* summary memory id, 0 = none */
  uint64_t source_event_id; /* 0 = not minted from an event */
  uint64_t gc_group; /* planned group holding it (plan lock), 0 = none */
} cph_memory_rec;

typedef struct cph_job_rec {
  uint64_t id;
  char *session; /* the maintenance session it queues on */
  uint8_t kind;  /* cph_job_kind */
  uint8_t state; /* cph_job_state */
  char *args;    /* opaque, kind-specific argument text, optional */
  uint64_t group_id; /* gc jobs: their group, else 0 */
  uint32_t attempts;
  int64_t created_ms;
  int64_t run_after_ms;
  int64_t finished_ms;
  char *error;
} cph_job_rec;

typedef struct cph_outbox_rec {
  uint64_t id;
  uint8_t op;     /* cph_outbox_op */
  uint8_t status; /* cph_outbox_status */
  uint64_t memory_id;
  char *model; /* embedding model: batches never mix models */
  uint32_t shard;
  uint32_t attempts;
  int64_t created_ms;
  int64_t next_attempt_ms;
  int64_t done_ms;
  char *last_error;
} cph_outbox_rec;

typedef struct cph_gc_group_rec {
  uint64_t id;
  char *session;
  uint8_t state; /* cph_gc_state */
  uint64_t *source_ids;
  uint32_t n_source_ids;
  int64_t newest_ts_ms;
  uint64_t total_tokens_est;
  char *group_hash; /* 64 lower-case hex chars (DESIGN §7) */
  char *summary_text; /* written by gc_summarize */
  uint64_t summary_id; /* written by gc_commit */
  int64_t created_ms;
  int64_t updated_ms;
} cph_gc_group_rec;

typedef struct cph_aggregate_rec {
  uint64_t family;
  uint64_t dup_count;
  char *sample;
  char **channels;
  uint32_t n_channels;
  int64_t first_ms;
  int64_t last_ms;
  uint64_t simhash;
  uint8_t body_sha256[32];
} cph_aggregate_rec;

/* A PACT context node (DESIGN §6; core/pact.h). Lifecycle stages are parallel arrays.
 * Version 2 (one record per node, core/trees.h) adds `anchored`: depth then holds the tree's
 * shift at which the node stood at depth 0 (its depth is the header's shift minus it).
 * Version 1 (the nodes inside a schema-2 tree value) has no `anchored` and is read only by
 * the migration, through cph_ctxnode_v1_desc. */
typedef struct cph_ctxnode_rec {
  uint64_t id;
  int64_t depth, position, offset;
  char *content;
  char *role; /* optional: "user"/"assistant" message cores */
  int64_t ttl;     /* -1 = none */
  int64_t cadence; /* 0 = none */
  int64_t *lc_depth, *lc_position, *lc_offset, *lc_ttl;
  uint32_t n_lc_depth, n_lc_position, n_lc_offset, n_lc_ttl;
  uint32_t stage;
  char *key; /* optional */
  char **tags;
  uint32_t n_tags;
  uint64_t created_at_episode;
  uint64_t seq;
  bool waiting;
  bool anchored;
} cph_ctxnode_rec;

/* A session's PACT tree header (core/trees.h): the tree's counters and its node count. */
typedef struct cph_ctxhead_rec {
  uint64_t episode;
  uint64_t next_id;
  uint64_t next_seq;
  int64_t shift;
  uint32_t count;
} cph_ctxhead_rec;

/* A sealed snapshot of a session's rendered context (`seal`). */
typedef struct cph_seal_rec {
  uint64_t id;
  char *session;
  char *trigger;
  uint64_t episode;
  int64_t created_ms;
  char **roles;
  uint32_t n_roles;
  char **contents;
  uint32_t n_contents;
  char **coords;
  uint32_t n_coords;
  char *origin; /* cluster mode: imported from the node it names (core/seals.h); NULL: made
                   here */
} cph_seal_rec;

/* A turn's context as it was assembled at lease, kept for the context explorer (core/turnlog.h,
 * database "turn_contexts"). Parallel arrays: msg_* describe the rendered messages in order,
 * node_* the session's PACT tree as the turn saw it (waiting nodes included). */
typedef struct cph_turnctx_rec {
  uint64_t turn_id;
  char *session;
  uint8_t kind; /* cph_turn_kind */
  uint64_t episode;
  int64_t created_ms;
  uint32_t omit; /* cph_turn_part bits the lease left out: those parts were not assembled */
  char *input;
  uint64_t *tokens; /* window, current_state, pending_obligations, conversation_history,
                     * recent_memory, available_tools, sections, messages, history_cut,
                     * messages_cut (cph_context_tokens, in that order) */
  uint32_t n_tokens;
  char **channels; /* the channels of the staged messages (the turn's channel views) */
  uint32_t n_channels;
  uint64_t *staged_events; /* the staged messages' first events */
  uint32_t n_staged_events;
  uint64_t *obligations; /* pending_obligations: inbox message ids */
  uint32_t n_obligations;
  char **obligation_texts; /* "sender: preview" */
  uint32_t n_obligation_texts;
  uint64_t *history; /* conversation_history: event ids, oldest first */
  uint32_t n_history;
  uint64_t *memories; /* recent_memory: memory ids in the section's order */
  uint32_t n_memories;
  char **tools; /* available_tools */
  uint32_t n_tools;
  char **msg_roles;
  uint32_t n_msg_roles;
  char **msg_contents;
  uint32_t n_msg_contents;
  char **msg_coords;
  uint32_t n_msg_coords;
  uint64_t *msg_nodes; /* the tree node a message renders, 0 = none (system prompt, channel
                        * view, the current input) */
  uint32_t n_msg_nodes;
  uint64_t *node_ids;
  uint32_t n_node_ids;
  char **node_at; /* "d0, 1, 0" */
  uint32_t n_node_at;
  char **node_roles; /* "" for nodes without a role */
  uint32_t n_node_roles;
  char **node_previews; /* the content's first bytes (at most 160, cut on a UTF-8 boundary) */
  uint32_t n_node_previews;
  uint64_t *node_hashes; /* FNV-1a of the whole content: a changed content shows */
  uint32_t n_node_hashes;
  int64_t *node_ttl; /* -1 = none */
  uint32_t n_node_ttl;
  int64_t *node_cadence; /* 0 = none */
  uint32_t n_node_cadence;
  uint64_t *node_created; /* created_at_episode */
  uint32_t n_node_created;
  uint64_t *node_flags; /* bit 0 waiting for its cadence; bits 8-15 the lifecycle stage;
                         * bits 16-23 the lifecycle's stage count (0 = none) */
  uint32_t n_node_flags;
  /* Since version 2: the texts by hash (core/turnlog.c keeps them in "turn_texts"), and then
   * msg_contents and node_previews are stored empty. A version-1 record holds the texts. */
  uint64_t *msg_hashes;
  uint32_t n_msg_hashes;
  uint64_t *node_preview_hashes;
  uint32_t n_node_preview_hashes;
  /* Since version 3: the messages and nodes are rows kept once per session, named in order by
   * the turn's entry in "turn_row_refs" (core/turnlog.c says how), and every array above from
   * msg_roles on is stored empty. row_messages: how many messages. */
  bool rows;
  uint32_t row_messages;
} cph_turnctx_rec;

/* ---- generic codec over field tables ---- */

typedef struct cph_record_desc cph_record_desc; /* opaque: a named field table */

extern const cph_record_desc cph_session_desc;
extern const cph_record_desc cph_event_desc;
extern const cph_record_desc cph_inbox_desc;
extern const cph_record_desc cph_turn_desc;
extern const cph_record_desc cph_reply_desc;
extern const cph_record_desc cph_memory_desc;
extern const cph_record_desc cph_job_desc;
extern const cph_record_desc cph_outbox_desc;
extern const cph_record_desc cph_gc_group_desc;
extern const cph_record_desc cph_aggregate_desc;
extern const cph_record_desc cph_ctxnode_desc;
extern const cph_record_desc cph_ctxnode_v1_desc; /* schema 2's node, for the migration */
extern const cph_record_desc cph_ctxhead_desc;
extern const cph_record_desc cph_seal_desc;
extern const cph_record_desc cph_turnctx_desc;
extern const cph_record_desc cph_turnctx_v2_desc; /* version 2, so tests can write one */

const char *cph_record_name(const cph_record_desc *d); /* "session", "event", ... */
uint32_t cph_record_version(const cph_record_desc *d);

/* Appends the encoding of rec to out (out is not reset). CPH_ENOMEM on allocation failure. */
int cph_record_encode(const cph_record_desc *d, const void *rec, cph_buf *out);
/* Writes the encoding of rec into out when it fits in cap bytes; returns its size either way
 * (so a size > cap says: nothing usable was written, encode again into that much). O(size),
 * no allocation. A record up to CPH_RECORD_SMALL bytes is encoded on the stack. */
#define CPH_RECORD_SMALL 1024
size_t cph_record_encode_to(const cph_record_desc *d, const void *rec, void *out, size_t cap);

/* Decodes data[0..len) into *rec (which the caller zeroes or frees beforehand). On error
 * returns CPH_ECORRUPT (or CPH_ENOMEM), leaves *rec freed and zeroed, and sets err->msg to what
 * is wrong, e.g. "session field 'episode': expected an unsigned integer, got a string". */
int cph_record_decode(const cph_record_desc *d, const void *data, size_t len, void *rec,
                      cph_err *err);

/* As cph_record_decode, but the strings and arrays of fields not in `fields` (bit i = the
 * record's i-th field, see cph_record_field_mask) are checked and left NULL/empty rather than
 * copied: for hot reads that need a few fields of a large record. Scalars are always set. */
int cph_record_decode_some(const cph_record_desc *d, const void *data, size_t len, void *rec,
                           uint64_t fields, cph_err *err);
/* The field bits of the named fields (names not in the record add nothing). */
uint64_t cph_record_field_mask(const cph_record_desc *d, const char *const *names, size_t n);

/* Frees everything rec owns and zeroes it. */
void cph_record_free(const cph_record_desc *d, void *rec);

#endif
