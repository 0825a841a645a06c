/* The vector half of memory searches, off the loop: see search_prep.c. */
#ifndef CEPHALON_SERVER_SEARCH_PREP_H
#define CEPHALON_SERVER_SEARCH_PREP_H

#include <stdbool.h>

#include "cephalon/cephalon.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;

/* Starts n threads after the loop exists. CPH_OK or an error (nothing to undo but _stop). */
int cph_search_prep_start(cph_srv *s, int n);
/* Joins the threads (a call in flight ends within its provider's :timeout-ms) and drops
 * searches not yet submitted: their requests are freed with the others at shutdown. */
void cph_search_prep_stop(cph_srv *s);
/* Takes r's search (r->op.u.search.session, query and k set; scopes moved from *scopes):
 * a thread runs cph_search_prepare, then the loop submits r's op with the results and
 * on_done. False when it cannot take it (queue full, stopping, out of memory): the caller
 * then submits at once, degraded, and *scopes is left to it. */
bool cph_search_prep_submit(cph_srv *s, cph_req *r, cph_strv *scopes,
                            void (*on_done)(cph_req *r));

#endif
