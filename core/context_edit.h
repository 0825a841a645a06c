/* What workers and operators do to a session's context tree directly (DESIGN §6), as opposed
 * to what turns do to it (context.h, turns.c): the context operations (insert, delete, seal)
 * and the context reads (the nodes, a dry-run of the next episodes, the seals). Private to
 * core/. It keeps no state: the trees are the tree store's (trees.h), the seals are in the
 * store (database seals: session\0 + be64 seal id -> seal record). */
#ifndef CEPHALON_CORE_CONTEXT_EDIT_H
#define CEPHALON_CORE_CONTEXT_EDIT_H

#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "context.h"

/* CPH_OP_CONTEXT_INSERT, _DELETE and _SEAL, each in its own child of the pass's txn
 * (cx->env->txn); the answer (node id, seal id, or the error) is in op. */
void context_ops_apply(cph_context *cx, cph_op *op);

/* The reads behind cph_engine_context, cph_engine_context_step and cph_engine_seals (their
 * contracts are in cephalon.h), each in its own read txn: between passes only. */
int context_nodes(cph_context *cx, const char *session, const char *selector,
                  cph_context_node_info **out, size_t *n, uint64_t *episode, cph_err *err);
int context_step_preview(cph_context *cx, const char *session, size_t episodes,
                         cph_context_step **out, cph_err *err);
int context_seals(cph_context *cx, const char *session, cph_seal_info **out, size_t *n,
                  cph_err *err);

#endif
