/* Ingest's request work, off the loop: a service main.c starts, keeps in s->ingest and
 * stops, and routes_events.c hands large POST /v1/events requests to. See ingest_prep.c. */
#ifndef CEPHALON_SERVER_INGEST_PREP_H
#define CEPHALON_SERVER_INGEST_PREP_H

#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;
typedef struct cph_ingest_pool cph_ingest_pool;

/* What a request's job does: work(r, arg, h) on a pool thread — it may read and write only
 * r's arena, r->op.u.ingest and arg, never the engine or libevent, and h is the thread's
 * hasher (NULL when it could not have one) —, then done(r, arg) on the loop, which submits,
 * answers or hands r on. */
typedef struct cph_ingest_job_fns {
  void (*work)(cph_req *r, void *arg, cph_event_hasher *h);
  void (*done)(cph_req *r, void *arg);
} cph_ingest_job_fns;

/* Starts n threads (0: none, cph_ingest_prep_take takes nothing) after the loop exists.
 * CPH_OK or an error; *out is set either way (nothing to undo but _stop). */
int cph_ingest_prep_start(cph_srv *s, int n, cph_ingest_pool **out);
/* Joins the threads, then ends every job it still holds on the loop — done(r, arg) for a job
 * worked, work(r, arg, NULL) and done(r, arg) for one not yet worked — so a request the server
 * read is applied and answered as it would have been; frees pool. NULL is fine. */
void cph_ingest_prep_stop(cph_ingest_pool *pool);
/* Queues r's job (r->async set: done answers it). False when it does not take it — no
 * threads, queue full, stopping, out of memory: the caller then does the work itself. */
bool cph_ingest_prep_take(cph_ingest_pool *pool, cph_req *r, const cph_ingest_job_fns *fns,
                          void *arg);

#endif
