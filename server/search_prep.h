/* The vector half of memory searches, off the loop: a service main.c starts, keeps in
 * s->search and stops, and routes_maint.c hands searches to. See search_prep.c. */
#ifndef CEPHALON_SERVER_SEARCH_PREP_H
#define CEPHALON_SERVER_SEARCH_PREP_H

#include <stdbool.h>

#include "cephalon/cephalon.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;
typedef struct cph_search_pool cph_search_pool;

/* Starts n threads after the loop exists; they use s's engine, clock and loop. CPH_OK or an
 * error; *out is set either way (nothing to undo but _stop). */
int cph_search_prep_start(cph_srv *s, int n, cph_search_pool **out);
/* Joins the threads (a call in flight ends within its provider's :timeout-ms), submits the
 * searches they prepared and, degraded (lexical), those they did not take, so the last passes
 * answer them; frees pool. NULL is fine. */
void cph_search_prep_stop(cph_search_pool *pool);
/* Takes r's search (r->op.u.search.session, query and k set; scopes moved from *scopes):
 * a thread runs cph_search_prepare, then the loop submits r's op with the results and
 * on_done. False when it cannot take it (queue full, stopping, out of memory): the caller
 * then submits at once, degraded, and *scopes is left to it. */
bool cph_search_prep_submit(cph_search_pool *pool, cph_req *r, cph_strv *scopes,
                            void (*on_done)(cph_req *r));

#endif
