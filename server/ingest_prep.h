/* Ingest's text work, off the loop: a service main.c starts, keeps in s->ingest and stops,
 * and routes_events.c hands large POST /v1/events requests to. See ingest_prep.c. */
#ifndef CEPHALON_SERVER_INGEST_PREP_H
#define CEPHALON_SERVER_INGEST_PREP_H

#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;
typedef struct cph_ingest_pool cph_ingest_pool;

/* A request of fewer events is prepared by the engine itself: the thread's round trip would
 * cost it more than it saves (a turn cycle posts one event). */
#define CPH_INGEST_PREP_MIN_EVENTS 16

/* Starts n threads (0: none, every request is prepared inline) after the loop exists.
 * CPH_OK or an error; *out is set either way (nothing to undo but _stop). */
int cph_ingest_prep_start(cph_srv *s, int n, cph_ingest_pool **out);
/* Joins the threads, then submits every request it still holds (prepared or not: the engine
 * computes what is missing), so a request the server read is applied and answered as it
 * would have been; frees pool. NULL is fine. */
void cph_ingest_prep_stop(cph_ingest_pool *pool);
/* Takes r's ingest (r->op.u.ingest.events and n_events set): a thread runs
 * cph_event_prepare over its events, then the loop submits r's op with on_done. False when
 * it does not take it: then the caller answers r's error if one is recorded (out of memory),
 * else submits at once (no threads, fewer than CPH_INGEST_PREP_MIN_EVENTS events, queue full,
 * stopping). */
bool cph_ingest_prep_submit(cph_ingest_pool *pool, cph_req *r, void (*on_done)(cph_req *r));

#endif
