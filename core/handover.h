/* Handover: a session's state for another node (cluster mode, DESIGN §14 "State",
 * server/clusterflow.h 11.) — what a completion changes of a session (its tree, recent
 * replies of the replies stream with their origins, its channels' newest history — users'
 * and agents' messages with its replies, and which its turns saw —, newest memories, newest
 * ended turn records and newest seals with their origins, its newest kept turn contexts (the
 * context explorer's, under their turn records' origins), episode and credits) as one blob
 * the cluster log keeps per session, and its import on the node that takes the session's
 * shard over. The blob's layout is in handover.c. Private to core/: turns.c exports at each
 * completion and imports CPH_OP_SESSION_STATE; context_edit.c exports at each seal.
 *
 * It owns no state: it is handed the modules it reads and writes. */
#ifndef CEPHALON_CORE_HANDOVER_H
#define CEPHALON_CORE_HANDOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "env.h"
#include "memory.h"
#include "ops.h"
#include "sessions.h"
#include "trees.h"
#include "turnlog.h"

/* The most a state may weigh (include/cephalon/cephalon.h says why that much). */
#define CPH_HANDOVER_MAX_BYTES CPH_SESSION_STATE_MAX_BYTES

typedef struct cph_handover {
  cph_core_env *env; /* the pass's transaction and the scheduler (credits) */
  cph_sessions *sessions;
  cph_trees *trees;
  cph_memory *memory;
  cph_turnlog *turnlog; /* the kept turn contexts an import stores (NULL: export only) */
} cph_handover;

/* Appends session s's state to out, read through the pass's transaction (after the
 * completion's child committed, so it is what this pass stores). CPH_OK; CPH_ELIMIT when its
 * tree alone is over CPH_HANDOVER_MAX_BYTES (replies and memories that would not fit are
 * left out instead); the store's error. */
int handover_export(const cph_handover *st, const csession *s, cph_buf *out);

/* Items (server/clusterflow.h 13.): a record a state carries, on its own, for the cluster log
 * to keep under a key of its own — "CPHI", be32 version (1), be32 CPH_STORE_SCHEMA_VERSION, a
 * kind byte ('t' a turn record, 's' a seal, 'm' a memory, 'k' a kept turn context, 'r' a
 * reply of the replies stream), then the record as a state's part encodes it (its origin set). Appends to items session's newest ended turn record (newest_only: a failure's
 * item) or that and those before it back to the previous completed one (the turns that failed
 * since: a completion's items, which gives a failure's again should its put have been lost),
 * each that has an origin. CPH_OK (none: nothing appended), CPH_ENOMEM or the store's error. */
int handover_turn_items(const cph_handover *st, const char *session, bool newest_only,
                        cph_state_items *items);
/* The same for turn turn_id's record alone, when it is among session's ended turns (indexed
 * there, core/turnrecs.h: not one parked before this build) and has an origin — a requeue's,
 * whose record says "requeued" now. */
int handover_turn_item(const cph_handover *st, const char *session, uint64_t turn_id,
                       cph_state_items *items);
/* The same for seal seal_id of session. */
int handover_seal_item(const cph_handover *st, const char *session, uint64_t seal_id,
                       cph_state_items *items);

/* The same for the memories ids (those a completion minted, core/turns.c) that are of
 * session's own scope (a tombstoned one too: its item then says it is gone): the worker's memories, which a state carries only while they are
 * among the newest of its scopes (handover.c). Kind 'm'; a memory record has no origin, so
 * the item's name alone carries it (memory_origin). */
int handover_memory_items(const cph_handover *st, const char *session, const uint64_t *ids,
                          size_t n, cph_state_items *items);
/* The item of turn turn_id's kept context (the context explorer's, core/turnlog.h), when it is
 * session's newest: kind 'k', named by its slot "r<n>", n the turn's ordinal (its place in the
 * session's ended turns, core/turnrecs.h) modulo :context :keep-turns — a ring, one item per
 * slot, each put over the one keep-turns turns before it, so the log holds the kept contexts
 * of the session's newest keep-turns ended turns — every leased turn ends, however it did —
 * as the node does. Its value is the state's form: the turn record's origin, then the record,
 * self-contained. None when the turn has no kept context, is not the newest, has no ordinal,
 * or contexts are not kept. CPH_OK, CPH_ENOMEM or the store's error. */
int handover_kept_item(const cph_handover *st, const char *session, uint64_t turn_id,
                       cph_state_items *items);

/* The item of reply reply_id of the replies stream (GET /v1/replies) when it is session's and
 * has an origin: kind 'r', named by its origin; the record without what is this node's alone
 * (its id, turn id and source inbox ids). A state carries the session's newest 64 replies
 * only: with the items, every reply a dead node wrote is offered on the node that takes its
 * session over, however far behind its connectors were. None when reply_id is 0 or not on a
 * cluster node. CPH_OK, CPH_ENOMEM or the store's error. */
int handover_reply_item(const cph_handover *st, const char *session, uint64_t reply_id,
                        cph_state_items *items);

/* The items of what gc group group_id committed in a session's own scope (a channel's
 * memories have no session to go with): its summary and its sources, tombstoned now, each
 * under the key its item was put under (memory_origin_of), into out (its session set). A group
 * of another scope, or not committed, gives none. CPH_OK, CPH_ENOMEM or the store's error. */
int handover_gc_items(const cph_handover *st, uint64_t group_id, cph_session_items *out);

/* Cluster mode (server/clusterflow.h 16.): memory memory_id, minted in a channel's scope by
 * applying the log's event of sender event_sender and time event_ts_ms, as one memory of a
 * channel memories item (cph_channel_memories_item): its origin (the event's identity
 * cluster-wide, memory_event_origin: the one it was minted under), then its record. *out NULL
 * (CPH_OK) when the memory is gone, deleted or not of a channel's scope. CPH_ENOMEM or the
 * store's error. */
int handover_channel_memory_part(cph_txn *t, uint64_t memory_id, const char *event_sender,
                                 int64_t event_ts_ms, uint8_t **out, size_t *len);

/* One step of CPH_OP_CHANNEL_MEMORIES (include/cephalon/cephalon.h), in a child of the
 * pass's transaction: the step's memories are stored, or none of them (a store error fails
 * op; the steps before it stay). op->u.channel.cont set: more steps follow. */
void handover_import_channel(const cph_handover *st, cph_op *op);
/* Frees what a channel import's first step read (u.channel.cont), for an import that stops
 * between its steps. NULL is fine. */
void handover_channel_import_free(cph_channel_import *ci);

/* CPH_OP_SESSION_STATE (include/cephalon/cephalon.h): imports op->u.state into its session in
 * a child of the pass's transaction; a missing session, a malformed or cut blob (CPH_EINVAL)
 * or a store error fails op and changes nothing; a malformed turn record, seal, channel
 * history entry or kept turn context says which and why. The channel history entries this
 * node's channels lack are appended to them (before the log's replay appends the unconsumed
 * input) and the session's cursors there moved past those its turns saw (core/context.h). The
 * seals it adds (core/seals.h) get new seal ids here.
 * The turn records it adds (core/turnrecs.h) are history: none is ever an active turn; the
 * kept turn contexts it carries are stored under the ids those records got (core/turnlog.h,
 * turnlog_import), those of turns it held already are not. The
 * replies it and the reply items added to the replies stream (those with an origin the stream
 * lacked, core/replystream.h): *newest_reply is set to the last one's id; untouched when none. Then
 * the op's items, in a child of their own: those of origins this node lacks are stored as the
 * state's records are; a bad one is logged and counted, and the rest taken. *outbox_items:
 * the vector deletes that tombstoned memory items queued on the outbox (for maint's count). */
void handover_import(const cph_handover *st, cph_op *op, uint64_t *newest_reply,
                     uint64_t *outbox_items);

#endif
