/* Seals (DESIGN §6): snapshots of a session's rendered context taken on demand (POST
 * /v1/sessions/{id}/seal), and in cluster mode (server/clusterflow.h 11.) their identity
 * cluster-wide and the import of the seals another node made, which a session's state carries
 * (core/handover.c).
 *
 * Database seals: session\0 be64 seal id -> seal record (store/records.h). Seal ids are
 * minted per session and per node (counter "seal:<session>"). A seal's origin is
 * "<node>/<seal id there>/<16 hex digits>" (replystream_origin's form): the node that made it,
 * its id there, and a hash of its session and creation time (so two sessions' seal 1, or a
 * node started again under its name on an empty data dir, make different origins). A seal made
 * here stores none: its origin is worked out from this node's name and the record
 * (seals_origin). A seal imported stores the origin it came with, under a new id here. On a
 * single node no seal has an origin.
 *
 * Index (core/origins.h), written in the transaction that writes the imported seal:
 *   seal_origins  origin -> seal id here: the seals imported.
 * A session's seals are deleted with it, each imported one's index row too, so the index never
 * names a missing seal (and a session created again under the name starts with none).
 *
 * Owns the seals database: every write of a seal record goes through it. No state in
 * memory: its functions work in the transaction they are handed. */
#ifndef CEPHALON_CORE_SEALS_H
#define CEPHALON_CORE_SEALS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "replystream.h"
#include "store/store.h"

#define SEALS_ORIGIN_MAX REPLYSTREAM_ORIGIN_MAX

/* A seal's key in database seals. */
cph_key seals_key(const char *session, uint64_t id);

/* Stores r under a new id of its session here (r->id set): a seal made here (r->origin
 * NULL), or seals_import's. CPH_OK or t's sticky error. */
int seals_put(cph_txn *t, cph_seal_rec *r);

/* r's origin into buf (SEALS_ORIGIN_MAX bytes): the one it was imported with, else for a seal
 * made here the one node (this node's name) gives it; "" when it has none (node NULL: a single
 * node). */
void seals_origin(char *buf, const char *node, const cph_seal_rec *r);

/* *held: this node holds the seal of `origin` for session — it imported it, or made it (node:
 * this node's name, NULL on a single node). CPH_OK or the store's error. */
int seals_holds(cph_txn *t, const char *node, const char *session, const char *origin,
                bool *held);

/* Stores r, a seal another node made (r->origin set, its session this node's), under a new id
 * of its session here, indexed by origin. The caller checked it holds no seal of that origin
 * (seals_holds). CPH_OK or t's error. */
int seals_import(cph_txn *t, cph_seal_rec *r);

/* Deletes session's seals and the origin rows of those imported (a session deleted). CPH_OK,
 * or the store's error (a seal that does not decode: CPH_ECORRUPT with t's error saying which;
 * nothing is deleted then, as the transaction fails). */
int seals_delete_session(cph_txn *t, const char *session);

/* Calls fn(ctx, seal) for session's seals, newest first, at most max, until fn returns false.
 * One cursor step and one decode per seal. CPH_OK or the store's error (a seal that does not
 * decode: CPH_ECORRUPT with t's error saying which). */
int seals_session_newest(cph_txn *t, const char *session, size_t max,
                         bool (*fn)(void *ctx, const cph_seal_rec *r), void *ctx);

#endif
