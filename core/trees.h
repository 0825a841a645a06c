/* The tree store: every session's PACT tree (core/pact.h) in LMDB, database "context", one
 * value per session. Private to core/.
 *
 * It owns the trees kept decoded in memory (a bounded cache), because every turn reads its
 * session's tree at lease and again at completion, and the buffer a save encodes into:
 * - trees_load takes the session's tree out of the cache when it is there (else decodes it);
 * - trees_keep puts a tree back; callers do so only with a tree that matches what their
 *   transaction's parent holds: unchanged after a read, or saved and its child committed;
 * - trees_save and trees_delete drop the cached tree, and trees_cache_clear (a failed pass
 *   commit, engine close) empties the cache, so it never holds what the store does not.
 * Every function reads or writes through the transaction it is given. Pass thread only. */
#ifndef CEPHALON_CORE_TREES_H
#define CEPHALON_CORE_TREES_H

#include <stddef.h>

#include "common/buf.h"
#include "pact.h"
#include "store/store.h"

struct trees_slot;

typedef struct cph_trees {
  struct trees_slot *slots; /* the decoded-tree cache; allocated on first keep */
  cph_buf scratch;          /* encoding space reused by every save */
} cph_trees;

void trees_init(cph_trees *tr);
void trees_free(cph_trees *tr); /* the cache and the buffer */

/* The session's tree (empty, ids from 1, for a session without one). *out is to be freed
 * (cph_pact_tree_free) whatever the outcome; on an error t's sticky error says why. */
int trees_load(cph_trees *tr, cph_txn *t, const char *session, cph_pact_tree *out);
int trees_save(cph_trees *tr, cph_txn *t, const char *session, const cph_pact_tree *tree);
/* Deletes the session's tree (for session deletion); CPH_OK when it had none. */
int trees_delete(cph_trees *tr, cph_txn *t, const char *session);
/* Moves *tree into the cache (it is left empty, to free or not); see above for when. */
void trees_keep(cph_trees *tr, const char *session, cph_pact_tree *tree);
void trees_cache_clear(cph_trees *tr);

/* Drops message cores deeper than the history bound; returns how many. */
size_t trees_prune_history(cph_pact_tree *tree);

#endif
