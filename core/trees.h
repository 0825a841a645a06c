/* The tree store: every session's PACT tree (core/pact.h) in LMDB, database "context", one
 * record per node, so an episode writes only the nodes it changed. Private to core/.
 *
 * Layout (schema 3):
 *   key session\0          -> the header, cph_ctxhead_rec: episode, next node id, next seq,
 *                             shift (the tree's sum of ODI deltas, pact.h) and node count;
 *   key session\0 be64 seq -> one node, cph_ctxnode_rec (version 2), for each live or waiting
 *                             node; seq is the node's creation order, which nothing changes.
 * A node the ODI shift moves (cph_pact_shifts: a permanent or sticky node at depth >= 0) is
 * stored `anchored`: its depth field holds shift - depth, the shift at which it stood at depth
 * 0 (for message cores, the message's number), so the shift moves it without a write; it is
 * read back as header shift - anchor. Every other node stores its depth as it is. So the
 * header and a session's nodes are contiguous, in seq order, and a load is one cursor walk
 * that yields the nodes exactly as pact keeps them (seq order, the same coordinates).
 *
 * A save writes the header, every node pact marked dirty, and deletes the seqs pact noted as
 * removed (or, when it noted too many, every stored seq the tree no longer holds); then clears
 * the tree's change record. A completed turn thus writes the header, its input and reply cores,
 * the nodes whose TTL, cadence or lifecycle acted, and deletes the cores pruning dropped —
 * never the rest of the tree, however large.
 *
 * Schema 2 kept the whole tree as one value at key session\0 (be64 episode, be64 next id,
 * be64 next seq, be32 count, then per node be32 length + a version-1 node record).
 * trees_migrate rewrites such a data dir at open (cph_store_open_migrating), shift 0.
 *
 * It owns the trees kept decoded in memory (a bounded cache), because every turn reads its
 * session's tree at lease and again at completion, and the buffer a save encodes into:
 * - trees_load takes the session's tree out of the cache when it is there (else decodes it);
 * - trees_keep puts a tree back; callers do so only with a tree that matches what their
 *   transaction's parent holds: unchanged after a read, or saved and its child committed;
 * - trees_save and trees_delete drop the cached tree, and trees_cache_clear (a failed pass
 *   commit, engine close) empties the cache, so it never holds what the store does not.
 * A tree's change record is relative to the store it was loaded from: save a tree only
 * through the transaction chain it was loaded in (or its successor, once that committed).
 * Every function reads or writes through the transaction it is given. Pass thread only. */
#ifndef CEPHALON_CORE_TREES_H
#define CEPHALON_CORE_TREES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "pact.h"
#include "store/store.h"

struct trees_slot;

/* What saves wrote, from trees_init on (tests and figures read it). */
typedef struct cph_trees_written {
  uint64_t saves;
  uint64_t puts; /* records put: nodes and headers */
  uint64_t dels; /* node records deleted */
  uint64_t put_bytes; /* value bytes put */
} cph_trees_written;

struct trees_hold;

typedef struct cph_trees {
  struct trees_slot *slots; /* the decoded-tree cache; allocated on first keep */
  cph_buf scratch;          /* encoding space reused by every save */
  cph_trees_written written;
  struct trees_hold *holds; /* trees held out past their pass (below) */
  size_t n_holds, cap_holds;
  uint64_t next_hold;
} cph_trees;

void trees_init(cph_trees *tr);
void trees_free(cph_trees *tr); /* the cache and the buffer */

/* The session's tree (empty, ids from 1, for a session without one), its change record
 * clear. *out is to be freed (cph_pact_tree_free) whatever the outcome; on an error t's
 * sticky error says why. */
int trees_load(cph_trees *tr, cph_txn *t, const char *session, cph_pact_tree *out);
/* Writes what changed in tree since it was loaded (see above) and clears its change record. */
int trees_save(cph_trees *tr, cph_txn *t, const char *session, cph_pact_tree *tree);
/* Deletes the session's tree (for session deletion); CPH_OK when it had none. */
int trees_delete(cph_trees *tr, cph_txn *t, const char *session);
/* Moves *tree into the cache (it is left empty, to free or not); see above for when. */
void trees_keep(cph_trees *tr, const char *session, cph_pact_tree *tree);
void trees_cache_clear(cph_trees *tr);

/* ---- a tree held out past its pass ----
 * A lease's tree may be held until its kept context is written, after the lease's pass
 * committed (turnlog.h, "Deferred keeping"); it may go back to the cache only if nothing
 * changed the session's tree meanwhile. trees_hold notes such a tree and returns its token
 * (0 when out of memory); every save, delete and import of the session, and
 * trees_cache_clear, mark its holds stale; trees_keep_held forgets the hold and moves the tree
 * into the cache when the hold is not stale (token 0 or stale: the tree stays with the
 * caller, to free). */
uint64_t trees_hold(cph_trees *tr, const char *session);
void trees_keep_held(cph_trees *tr, uint64_t token, const char *session, cph_pact_tree *tree);

/* ---- moving a session's tree to another node (cluster mode: server/clusterflow.h 11.) ----
 * The session's stored records, copied as they are (the layout above): be32 count, then per
 * record be32 key length (the key after session\0), the key bytes, be32 value length, the
 * value. Only a node of the same CPH_STORE_SCHEMA_VERSION may import it (the caller checks).
 * export appends to out (CPH_ENOMEM when it could not grow; t's sticky error otherwise);
 * import replaces whatever tree the session had (dropping the cached one) and sets *used to
 * the bytes read: CPH_EINVAL when data is not such a list. */
int trees_export(cph_trees *tr, cph_txn *t, const char *session, cph_buf *out);
int trees_import(cph_trees *tr, cph_txn *t, const char *session, const uint8_t *data, size_t len,
                 size_t *used);
/* Whether data (an exported tree: another node's, or this node's own from earlier) is older
 * than the tree this node holds for session in the same line of turns — the tree here has a
 * later episode and holds the export's newest node record (its highest seq) byte for byte. A
 * node's record is written when the node is made or changed, and a message core never changes
 * once made (anchored, above), so a tree that went on from the export still holds it, while
 * one another node went on with holds that node's own core under that seq. Then the caller
 * keeps the tree here: importing would drop the turns this node added since (a completion
 * whose state the log never took). Reads only; *used gets the bytes of the list. CPH_EINVAL
 * when data is not such a list. */
int trees_import_is_behind(cph_trees *tr, cph_txn *t, const char *session, const uint8_t *data,
                           size_t len, size_t *used, bool *behind);

/* Drops message cores deeper than the history bound; returns how many. */
size_t trees_prune_history(cph_pact_tree *tree);

/* ---- the schema-2 layout, for the migration ---- */

#define TREES_MIGRATES_FROM 2u /* the schema version trees_migrate reads */

/* A cph_store_migration's run (ctx: the cph_trees, for its buffer and counts): every
 * schema-2 tree value of database "context" becomes the layout above; logs what it moved.
 * Nothing else in the data dir changes. */
int trees_migrate(void *ctx, cph_txn *t, cph_err *err);
/* Appends tree's schema-2 value to out: what trees_migrate reads. Kept so that tests can
 * write a schema-2 data dir. */
int trees_v2_encode(const cph_pact_tree *tree, cph_buf *out);

#endif
