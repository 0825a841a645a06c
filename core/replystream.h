/* The outbound replies stream (GET /v1/replies, DESIGN §9): writing its records, and in
 * cluster mode (server/clusterflow.h 11.) each reply's origin and two indexes over them.
 *
 * A reply's origin is its identity cluster-wide: "<node>/<reply id there>/<16 hex digits>",
 * the node that wrote it, the id its stream gave it and the first 8 bytes of the completing
 * lease's random token (so a node that starts again under the same name on an empty data dir,
 * whose ids start over, makes new origins). It never changes: a reply a dead node wrote is
 * offered again on the node that takes its session over (core/handover.c) under the same
 * origin, so a connector reading every node's stream drops what it delivered already by it.
 * On a single node nothing of this runs: a reply has no origin, and no index row is written.
 *
 * Indexes, written only for a reply with an origin, in the transaction that writes it:
 *   reply_origins   origin -> reply id here: whether this node holds a reply already;
 *   reply_sessions  session, reply id -> "": a session's newest replies, for its state.
 * They live as long as the replies (nothing deletes a reply record).
 *
 * Owns no state of its own (the stream's last id is core/turns.c's): its functions work in the
 * transaction they are handed. */
#ifndef CEPHALON_CORE_REPLYSTREAM_H
#define CEPHALON_CORE_REPLYSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "origins.h"
#include "store/store.h"

/* The stream's identity: 16 hex digits, minted at random when a data directory first holds a
 * stream and again when the directory is a copy of another (a backup started on, a directory
 * copied by hand: its ids may go back from what a reader of the original read). A reader keeps
 * one cursor per stream identity: when it changes, the ids start over for it (GET /v1/replies
 * "stream"). */
#define REPLYSTREAM_ID_LEN 16

/* Reads the stream's identity through t (a write transaction) into id (REPLYSTREAM_ID_LEN + 1
 * bytes), minting and storing a new one when there is none or it was stored for another data
 * file (dev, ino: cph_store_file_identity). CPH_OK, CPH_EIO (no random bytes) or t's error. */
int replystream_identity(cph_txn *t, uint64_t dev, uint64_t ino, char *id);

/* The longest node name an origin takes (cph_engine_reply_origins refuses longer). */
#define REPLYSTREAM_NODE_MAX ORIGINS_NODE_MAX
#define REPLYSTREAM_ORIGIN_MAX (REPLYSTREAM_NODE_MAX + 48)

/* The origin of reply `id` written on `node` by the completion of the lease whose token is
 * token[0..8), into buf (REPLYSTREAM_ORIGIN_MAX bytes). */
void replystream_origin(char *buf, const char *node, uint64_t id, const uint8_t token[8]);

/* Gives rr the next reply id and stores it in t. A reply a completion here wrote: rr->origin
 * NULL, and in cluster mode `node` (this node's name) and token (the completing lease's
 * token), from which its origin is made (rr->origin stays NULL); on a single node node is
 * NULL and it has none. A reply carried from another node: rr->origin is its origin, kept.
 * A reply with an origin is indexed (above). CPH_OK or t's sticky error. */
int replystream_put(cph_txn *t, cph_reply_rec *rr, const char *node, const uint8_t token[8]);

/* A reply carried from another node (a session's state, or its item: core/handover.c), with
 * its origin: added to this node's stream unless it holds that origin already (a reply is
 * added once per node). *added: its id here, 0 when it was held. Its source inbox ids and turn
 * id are the other node's: not taken. CPH_OK or the store's error. */
int replystream_offer(cph_txn *t, const cph_reply_rec *carried, uint64_t *added);

/* Calls fn(ctx, reply) for session's newest replies that have an origin, newest first, at most
 * max, until fn returns false. CPH_OK or the store's error. */
int replystream_session_newest(cph_txn *t, const char *session, size_t max,
                               bool (*fn)(void *ctx, const cph_reply_rec *r), void *ctx);

/* A session was deleted: its rows of reply_sessions go, so a session created again under its
 * name does not carry the old one's replies in its state (to be offered again elsewhere). Its
 * replies stay in the stream, and their origins in reply_origins (still held here). One row
 * per reply the session had with an origin. CPH_OK or the store's error. */
int replystream_forget_session(cph_txn *t, const char *session);

#endif
