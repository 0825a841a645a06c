/* Long-poll bookkeeping shared by POST /v1/turns/lease and GET /v1/replies: the pending
 * lists, the per-client cap (:server :max-long-polls-per-client, by peer address), and
 * noticing a client that closes its connection while it waits.
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

#include <stdbool.h>

#include "http.h"
#include "server.h"

/* Starts noticing the client's connection closing; at most one watched request per
 * connection (HTTP/1.1 answers a connection's requests in order). */
void cph_lp_watch(cph_req *r, void (*gone)(cph_req *r));
/* Stops it (before answering). */
void cph_lp_unwatch(cph_req *r);

/* The pending lists (s->leases, s->repliers). */
void cph_lp_list_add(cph_req **head, cph_req *r);
void cph_lp_list_remove(cph_req **head, cph_req *r);

/* Undoes everything a long-poll holds (list, watch, client count, timer) before it ends. */
void cph_lp_finish(cph_req **head, cph_req *r);

#endif
