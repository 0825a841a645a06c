/* Long-polls, a service the routes use (POST /v1/turns/lease, GET /v1/replies): the pending
 * lists, the per-client cap (:server :max-long-polls-per-client, by peer address), noticing a
 * client that closes its connection while it waits, and ending every wait at shutdown. It
 * owns its state (cph_longpolls, created by main.c and handed down as s->lp) and calls
 * neither the routes nor main.c: each waiting request carries the function that ends it.
 *
 * Noticing a client that leaves: libevent 2.1 stops reading a connection once a request's
 * body is in (reading resumes only after the answer), so neither its close callback nor its
 * timeouts fire while a long-poll waits. cph_lp_watch adds a read event of our own on the
 * connection's socket and peeks when it fires: end of stream or a reset means the client is
 * gone, and r->lp_gone(r) runs — it answers at once (the answer goes nowhere; writing it lets
 * libevent see the close and free the connection). Bytes to read (a pipelined request) are
 * left to libevent and end the watch. The watch is removed before the request is answered,
 * so it never outlives the socket. */
#ifndef CEPHALON_SERVER_LONGPOLL_H
#define CEPHALON_SERVER_LONGPOLL_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/hmap.h"

typedef struct cph_req cph_req;

typedef struct cph_longpolls {
  struct event_base *base; /* the loop the client watches run on */
  cph_req *leases;         /* waiting lease long-polls (routes_turns.c), linked by lp_next */
  cph_req *repliers;       /* waiting replies long-polls (routes_replies.c) */
  cph_hmap clients;        /* peer address -> lp_client: open long-polls per client */
} cph_longpolls;

/* NULL on out of memory. */
cph_longpolls *cph_longpolls_new(struct event_base *base);
/* After cph_longpolls_stop and the last request; NULL is fine. */
void cph_longpolls_free(cph_longpolls *lp);
/* Whether a replies long-poll waits (lp may be NULL: none). */
bool cph_longpolls_replies_waiting(const cph_longpolls *lp);
/* Shutdown: ends every waiting long-poll, leases first, with the function each was listed
 * with (a lease is withdrawn, 204; a replies wait is answered with what is there). */
void cph_longpolls_stop(cph_longpolls *lp); /* NULL: nothing waits */

/* Counts a long-poll against its client's cap; false when the client already holds cap. */
bool cph_lp_acquire(cph_longpolls *lp, cph_req *r, int64_t cap);
void cph_lp_release(cph_longpolls *lp, cph_req *r);

/* Starts noticing the client's connection closing; at most one watched request per
 * connection (HTTP/1.1 answers a connection's requests in order). */
void cph_lp_watch(cph_longpolls *lp, cph_req *r, void (*gone)(cph_req *r));
/* Stops it (before answering). */
void cph_lp_unwatch(cph_req *r);

/* The pending lists (lp->leases, lp->repliers). stop ends r at shutdown: it removes r from
 * the list, or leaves it there marked until the engine's `done` does. */
void cph_lp_list_add(cph_req **head, cph_req *r, void (*stop)(cph_req *r));
void cph_lp_list_remove(cph_req **head, cph_req *r);

/* Undoes everything a long-poll holds (list, watch, client count, timer) before it ends. */
void cph_lp_finish(cph_longpolls *lp, cph_req **head, cph_req *r);

#endif
