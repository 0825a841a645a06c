/* Memory search (DESIGN §7): the lexical match merged with vector hits, over the scopes a
 * session may read. Private to core/. The public half — preparing a query's vector off the
 * pass (cph_search_prepare) — is declared in cephalon.h. */
#ifndef CEPHALON_CORE_SEARCH_H
#define CEPHALON_CORE_SEARCH_H

#include "env.h"
#include "memory.h"

struct cph_sessions;

/* CPH_OP_MEMORY_SEARCH, inside the pass: reads in a child of env->txn, and counts an access
 * to each hit in memory's access counts (memaccess.h). A session the registry does not know is a 404 on field "session". */
void search_apply(cph_core_env *env, const struct cph_sessions *ss, cph_memory *memory,
                  cph_op *op);
/* The scopes a session's searches read (its own id, its channels'), from its record. */
int search_memory_scopes(cph_store *store, const char *session, cph_strv *out, cph_err *err);

#endif
