/* Request work beside the loop: a service main.c starts (:server :request-threads), keeps in
 * s->offload and stops; routes hand it what needs neither the engine nor libevent — decoding
 * and preparing large POST /v1/events requests (routes_events.c), writing lease answers
 * (routes_turns.c). See offload.c. */
#ifndef CEPHALON_SERVER_OFFLOAD_H
#define CEPHALON_SERVER_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;
typedef struct cph_offload_pool cph_offload_pool;

/* What a request's job does: work(r, arg, h) on a pool thread — it may read and write only
 * r's arena, r->op.u.ingest, a lease's r->op.u.lease (its turn, read; its keep job, through
 * cph_keep_job_compute) and arg, never the engine or libevent, and h is the thread's
 * hasher (NULL when it could not have one) —, then done(r, arg) on the loop, which submits,
 * answers or hands r on. */
typedef struct cph_offload_fns {
  void (*work)(cph_req *r, void *arg, cph_event_hasher *h);
  void (*done)(cph_req *r, void *arg);
  /* Optional: at stop, for a job no thread took, instead of running work on the loop (work
   * that may block, such as a provider call, must not hold up the stop). */
  void (*cancel)(cph_req *r, void *arg);
} cph_offload_fns;

/* Starts a pool of n threads (0: none, cph_offload_take takes nothing) after the loop exists;
 * `who` names them in errors. Each pool has its own queue (QUEUE_MAX jobs) and threads.
 * CPH_OK or an error; *out is set either way (nothing to undo but _stop). */
int cph_offload_start(cph_srv *s, int n, const char *who, cph_offload_pool **out);
/* Joins the threads, then ends every job it still holds on the loop — done(r, arg) for a job
 * worked; for one not yet worked cancel(r, arg), or work(r, arg, NULL) without one, then
 * done(r, arg) — so a request the server read is applied and answered as it would have been;
 * frees pool. NULL is fine. */
void cph_offload_stop(cph_offload_pool *pool);
/* Queues r's job. False when it does not take it — no threads, queue full, stopping, out of
 * memory: the caller then does the work itself. Before an op was submitted for r, it marks
 * r asynchronous (done answers or submits); from an op's done, the caller marks r
 * r->answering (reply.h): done answers and ends it. */
bool cph_offload_take(cph_offload_pool *pool, cph_req *r, const cph_offload_fns *fns,
                          void *arg);

#endif
