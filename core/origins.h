/* Records another node made, kept here under their origins (cluster mode, server/clusterflow.h
 * 11.): the two index shapes the replies stream (core/replystream.h) and the turn records
 * (core/turnrecs.h) each keep in a pair of databases of their own:
 *   by origin   origin\0 -> be64 id here: whether this node holds a record of that origin;
 *   by session  session\0 be64 id -> "" (replies), or be64 ordinal (turn records: the
 *               record's place in its session's list, 1 for the first): a session's
 *               records, oldest first by id.
 * An origin is "<node>/<id there>/<16 hex digits>" (replystream_origin makes them).
 *
 * Owns no state: its functions work in the transaction and databases they are handed. */
#ifndef CEPHALON_CORE_ORIGINS_H
#define CEPHALON_CORE_ORIGINS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* The longest node name an origin takes (REPLYSTREAM_NODE_MAX). */
#define ORIGINS_NODE_MAX 128

/* Indexes record `id` by origin in db. CPH_OK or t's sticky error. */
int origins_put(cph_txn *t, cph_db db, const char *origin, uint64_t id);

/* Drops the by-origin row of origin in db (its record deleted); none is CPH_OK. CPH_OK or t's
 * sticky error. */
int origins_forget(cph_txn *t, cph_db db, const char *origin);

/* *held: db has a record of this origin; *id (when given) its id here. CPH_OK or the store's
 * error. */
int origins_find(cph_txn *t, cph_db db, const char *origin, bool *held, uint64_t *id);

/* Indexes record `id` under session in db. CPH_OK or t's sticky error. */
int origins_session_put(cph_txn *t, cph_db db, const char *session, uint64_t id);

/* The same with the row's value an ordinal (be64). */
int origins_session_put_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t id,
                                uint64_t ordinal);

/* The ordinal of row (session, id) in db into *ordinal: 0 when there is no such row or it
 * holds none. CPH_OK or the store's error. */
int origins_session_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t id,
                            uint64_t *ordinal);

/* The ordinal the next row of session in db takes: its newest row's + 1; when that row holds
 * none (written before ordinals were), the number of its rows + 1; 1 for none. One cursor
 * seek, or a walk of the session's rows once. CPH_OK or the store's error. */
int origins_session_next_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t *next);

/* Calls fn(ctx, id) for the ids db indexes under session, newest (highest) first, at most max,
 * while fn returns CPH_OK: ORIGINS_STOP ends the walk (CPH_OK), an error ends it and is
 * returned. One cursor step per id. CPH_OK, fn's error or the store's. */
#define ORIGINS_STOP 1
int origins_session_newest(cph_txn *t, cph_db db, const char *session, size_t max,
                           int (*fn)(void *ctx, uint64_t id), void *ctx);

/* The id an origin of this node names: "<node>/<id>/<16 hex>" with node this node's name (as
 * replystream_origin writes it, cut at ORIGINS_NODE_MAX bytes); 0 when it names another
 * node (or node is NULL: a single node) or is not of that form. */
uint64_t origins_own_id(const char *node, const char *origin);

/* Drops every row of session in db (a session deleted). CPH_OK or the store's error. */
int origins_session_forget(cph_txn *t, cph_db db, const char *session);

#endif
