/* Turn records as history (DESIGN §4, §14): a session's ended turns — every turn leased,
 * once it ended: completed, failed, expired, superseded or parked (a parked one's record
 * says "requeued" once it was) —
 * listed by session (GET /v1/turns?session=), and in cluster mode (server/clusterflow.h 11.)
 * their identity cluster-wide and the import of the records another node made, which a
 * session's state carries (core/handover.c).
 *
 * A turn record's origin is "<node>/<turn id there>/<16 hex digits>" (replystream_origin: the
 * node that made it, its id there and the first 8 bytes of its lease token, so a node started
 * again under its name on an empty data dir makes new ones). A record made here stores none:
 * its origin is worked out from this node's name, its id and its lease (turnrecs_origin). A
 * record imported stores the origin it came with and is history: a new id here, no lease (its
 * token is zero and check_lease in core/turns.c refuses every lease of it), no active-turns row,
 * never leased, heartbeated, taken or completed here. On a single node no record has an origin.
 *
 * Indexes (core/origins.h), written in the transaction that writes the record:
 *   turn_sessions  session, turn id -> be64 ordinal: every turn that ended here, however
 *                  (job turns not; one another node's park mark parked here not: it was
 *                  never leased here, and that node's record comes as history), and every
 *                  record imported, each with its place
 *                  in the session's list (1 for the first: rows written before ordinals
 *                  hold none, and the next row counts them). Two nodes that hold the same
 *                  records of a session give its next turn the same ordinal, whatever order
 *                  they came in: the ring of its kept contexts' items in the cluster log is
 *                  by ordinal (core/handover.h, handover_kept_item). A session delete drops
 *                  its rows (the records stay, as replies do);
 *   turn_origins   origin -> turn id here: the records imported.
 *
 * Owns no state of its own: its functions work in the transaction they are handed. */
#ifndef CEPHALON_CORE_TURNRECS_H
#define CEPHALON_CORE_TURNRECS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "replystream.h"
#include "store/store.h"

#define TURNRECS_ORIGIN_MAX REPLYSTREAM_ORIGIN_MAX

/* Turn tr ended here, however (its record as written): indexed under its session,
 * unless it is a job turn. CPH_OK or t's sticky error. */
int turnrecs_ended(cph_txn *t, const cph_turn_rec *tr);

/* *ordinal: turn's place in session's list of ended turns (turn_sessions above); 0 when it
 * is not there (a job turn, one not ended) or was indexed before ordinals were. CPH_OK or the
 * store's error. */
int turnrecs_ordinal(cph_txn *t, const char *session, uint64_t turn, uint64_t *ordinal);

/* tr's origin into buf (TURNRECS_ORIGIN_MAX bytes): the one it was imported with, else for a
 * record made here the one node (this node's name) gives it; "" when it has none (node NULL:
 * a single node). */
void turnrecs_origin(char *buf, const char *node, const cph_turn_rec *tr);

/* *held: this node holds the record of `origin` — it imported it, or made it (node: this
 * node's name, NULL on a single node). CPH_OK or the store's error. */
int turnrecs_holds(cph_txn *t, const char *node, const char *origin, bool *held);

/* Stores tr, a record another node made (tr->origin set, its session this node's), as history
 * here: tr->id becomes a new id of this node, its lease token zero, and it carries no inbox
 * entries and no job; indexed by session and origin. The caller checked it holds no record of
 * that origin (turnrecs_holds) and that tr ended (is not leased: a parked one is history
 * here, in no parked list, and turn_requeue refuses a record with an origin). CPH_OK or t's
 * error. */
int turnrecs_import(cph_txn *t, cph_turn_rec *tr);

/* Calls fn(ctx, record) for session's ended turns, newest first, at most max, until fn returns
 * false. CPH_OK or the store's error. */
int turnrecs_session_newest(cph_txn *t, const char *session, size_t max,
                            bool (*fn)(void *ctx, const cph_turn_rec *tr), void *ctx);

/* A session was deleted: its rows of turn_sessions go, so a session created again under its
 * name lists (and carries in its state) only its own turns. The records and their origins
 * stay. CPH_OK or the store's error. */
int turnrecs_forget_session(cph_txn *t, const char *session);

#endif
