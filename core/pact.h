/* The PACT context tree (DESIGN §6) as a pure in-memory module: coordinates, selectors, the
 * episode step and the render order. No storage, no engine: core/trees.c persists trees
 * and core/context.c renders them into turns.
 *
 * A node sits at (depth, position, offset): depth -1 = system (never moves), 0 = the current
 * message, 1.. = history (1 = newest); position 0 = the message core, 1.. = attached
 * components; offset 0 = core, < 0 before it, > 0 after it. Written "d0, 1, 0".
 *
 * The episode step (one per completed turn), exactly in this order:
 *   (1) episode += 1;
 *   (2) TTL: in creation order, a node with age = episode - created_at_episode >= ttl expires;
 *   (3) cadence: an expired node with a cadence waits and is re-created (new id, same
 *       coordinates and content, created_at_episode = episode) when episode % cadence == 0;
 *   (4) lifecycle: a node whose stage TTL expired moves to its next stage's coordinates with
 *       that stage's TTL, created_at_episode = episode; past the last stage it is removed; the
 *       last stage may have no TTL (permanent);
 *   (5) ODI: if the message count changed by delta, every permanent (no ttl) and sticky
 *       (ttl 1, cadence 1) node at depth >= 0 shifts its depth by delta; position and offset
 *       never change; depth -1 never moves.
 * A lifecycle node's expiry in (2) is handled by (4) (it moves instead of expiring).
 *
 * Completing a turn (cph_pact_complete_turn) appends its input as a "user" message core and its
 * reply, if any, as an "assistant" core, then steps with delta = the number appended. The
 * appended cores end at depths delta..1 (the reply at depth 1, the input just above it), so
 * depth 0 is free for the next turn's current message; older history has shifted by delta.
 *
 * Change tracking, for a store that writes only what changed (core/trees.c). The ODI shift
 * moves every permanent and sticky node at depth >= 0 together, so it is kept once, as the
 * tree's `shift` (the sum of every step's delta): such a node's depth is always `shift`
 * minus a number that the shift leaves alone. Every other change to a node sets its `dirty`
 * (insert, update, (2)-(4), and an ODI shift clamped at INT32_MAX); every node removed
 * (delete, expiry, ODI below depth 0) has its seq noted in `removed` — or, past
 * CPH_PACT_REMOVED_MAX of them, `removed_overflow` is set. No allocation: tracking cannot
 * fail. cph_pact_changes_clear forgets it all (the store has written the tree). */
#ifndef CEPHALON_CORE_PACT_H
#define CEPHALON_CORE_PACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"

#define CPH_PACT_NO_TTL (-1)
#define CPH_PACT_SELECTOR_MAX 512 /* bytes of selector text accepted */

typedef struct cph_coord {
  int32_t depth;
  int32_t position;
  int32_t offset;
} cph_coord;

typedef struct cph_pact_stage {
  cph_coord at;
  int32_t ttl; /* CPH_PACT_NO_TTL on the last stage = permanent */
} cph_pact_stage;

typedef struct cph_pact_node {
  uint64_t id;
  cph_coord at;
  char *content;
  char *role; /* "user" / "assistant" for message cores, NULL for other nodes */
  int32_t ttl;     /* CPH_PACT_NO_TTL = permanent */
  int32_t cadence; /* 0 = none */
  cph_pact_stage *lifecycle; /* NULL = none; stage 0 is the node's first placement */
  uint32_t n_lifecycle;
  uint32_t stage; /* current lifecycle stage */
  char *key;      /* optional */
  char **tags;
  uint32_t n_tags;
  uint64_t created_at_episode;
  uint64_t seq;  /* creation order (re-creation keeps it: "in creation order") */
  bool waiting;  /* expired, waiting for its cadence; not rendered */
  bool dirty;    /* changed other than by the ODI shift since cph_pact_changes_clear */
} cph_pact_node;

#define CPH_PACT_REMOVED_MAX 16

typedef struct cph_pact_tree {
  cph_pact_node *nodes; /* live and waiting nodes; order unspecified */
  size_t n, cap;
  uint64_t episode;
  uint64_t next_id; /* ids start at 1 */
  uint64_t next_seq;
  int64_t shift; /* the sum of every step's delta (see "Change tracking") */
  uint64_t removed[CPH_PACT_REMOVED_MAX]; /* seqs of the nodes removed since the last clear */
  uint32_t n_removed;
  bool removed_overflow; /* more were removed than `removed` holds */
} cph_pact_tree;

/* "d0, 1, 0" (spaces optional; depth >= -1). Errors say what and where: "expected 'd' at
 * column 1", "position must be >= 0". */
int cph_coord_parse(const char *s, cph_coord *out, cph_err *err);
size_t cph_coord_format(const cph_coord *c, char buf[48]); /* its strlen */

/* Selectors: "d1..3, 1, *" (each part an integer, a range a..b or *; depth may be "d*"),
 * "{key=NAME}", "{tag=NAME}", "{id=N}". Longer than CPH_PACT_SELECTOR_MAX -> CPH_ELIMIT. */
typedef struct cph_selector cph_selector;
int cph_selector_parse(const char *s, cph_selector **out, cph_err *err);
bool cph_selector_match(const cph_selector *sel, const cph_pact_node *n);
void cph_selector_free(cph_selector *sel);

void cph_pact_tree_init(cph_pact_tree *t);
void cph_pact_tree_free(cph_pact_tree *t);
/* Deep copy (for dry runs: "context step" shows what would happen), change tracking included. */
int cph_pact_tree_copy(cph_pact_tree *dst, const cph_pact_tree *src);
/* Clears every node's dirty and the removed record (see "Change tracking"). O(n). */
void cph_pact_changes_clear(cph_pact_tree *t);

/* Inserts a deep copy of proto (its id, seq and created_at_episode are assigned: next_id,
 * next_seq, episode). Validates: depth >= -1, position >= 0, ttl >= 1 or none, cadence >= 0,
 * lifecycle stages valid with only the last allowed no ttl. */
int cph_pact_insert(cph_pact_tree *t, const cph_pact_node *proto, uint64_t *id_out,
                    cph_err *err);
/* Replaces content / ttl / cadence / key / tags of node id (coordinates via move). */
int cph_pact_update(cph_pact_tree *t, uint64_t id, const cph_pact_node *fields, unsigned mask,
                    cph_err *err);
enum { CPH_PACT_SET_CONTENT = 1, CPH_PACT_SET_TTL = 2, CPH_PACT_SET_CADENCE = 4,
       CPH_PACT_SET_KEY = 8, CPH_PACT_SET_TAGS = 16, CPH_PACT_SET_AT = 32 };
int cph_pact_delete(cph_pact_tree *t, uint64_t id); /* CPH_ENOTFOUND */
cph_pact_node *cph_pact_find(cph_pact_tree *t, uint64_t id);

/* Whether the ODI shift (5) moves n: permanent or sticky, at depth >= 0. */
bool cph_pact_shifts(const cph_pact_node *n);

/* The episode step (1)-(5) with the given message-count delta. */
void cph_pact_step(cph_pact_tree *t, int32_t delta);
/* Appends the turn's cores and steps (see above). reply may be NULL. */
int cph_pact_complete_turn(cph_pact_tree *t, const char *input, const char *reply);

/* Render order of the live (not waiting) nodes: depth -1, then history oldest -> newest
 * (deepest first), then depth 0; inside a depth by position, then offset ascending; ties by
 * seq. Fills idx (t->n entries available) with node indexes and returns how many. */
size_t cph_pact_render_order(const cph_pact_tree *t, size_t *idx);

#endif
