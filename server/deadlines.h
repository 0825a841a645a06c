/* Deadlines for clients that send slowly (DESIGN §13): a request head must arrive whole within
 * :server :header-timeout-seconds, its body within :server :body-timeout-seconds of the head.
 * libevent's own timeout (:server :timeout-seconds) is an idle timeout — every byte restarts
 * it — so a client that trickles one byte at a time would otherwise hold its connection
 * forever.
 *
 * The clock of a request head starts when the connection is accepted, or, on a kept-alive
 * connection, with the first byte after the previous answer was written (or when that answer
 * was written, if the next request's bytes were already waiting). A kept-alive connection on
 * which nothing arrives keeps libevent's idle timeout, as before. The body's clock starts when
 * the head's last byte arrives. Once the request is read whole and handed to its route no
 * deadline runs: a long-poll (a lease waiting for a turn, a replies wait) is never cut, and
 * neither is the writing of an answer (libevent's idle timeout covers a client that stops
 * reading). Values are read when a clock starts: a policy reload applies to clocks started
 * after it.
 *
 * Dropping: a head that ran out is closed without an answer (there is nothing to answer to
 * yet); a body that ran out is answered 408 in the JSON error format, then closed. Each drop
 * is logged with the peer (info for the first DROP_LOG_PER_S of a second, debug beyond, their
 * number at info with the next drop) and counted in
 * cephalon_http_timeouts_total{phase="header"|"body"}.
 *
 * How, on libevent 2.1's evhttp (which says nothing between accepting a connection and
 * handing over a whole request): cph_deadlines_bevcb creates each connection's bufferevent, so
 * every accepted connection is seen; right after evhttp has set it up (same loop iteration,
 * before any byte is read) the connection gets a close callback, and callbacks on its input
 * buffer (to see bytes arrive and find the empty line that ends the head) and output buffer
 * (to see the answer written). cph_http_dispatch tells when the request was read whole.
 *
 * Everything runs on the event loop's thread. */
#ifndef CEPHALON_SERVER_DEADLINES_H
#define CEPHALON_SERVER_DEADLINES_H

#include <event2/bufferevent.h>
#include <event2/http.h>
#include <stdint.h>

#include "common/buf.h"

typedef struct cph_srv cph_srv;
typedef struct cph_deadlines cph_deadlines;

/* NULL on out of memory. s->base and s->engine must be set (the policy is read from it). */
cph_deadlines *cph_deadlines_new(cph_srv *s);
/* After evhttp_free (which closes every connection, telling this module); NULL is a no-op. */
void cph_deadlines_free(cph_deadlines *d);

/* evhttp_set_bevcb(http, cph_deadlines_bevcb, d): makes each accepted connection's
 * bufferevent. NULL on out of memory (evhttp then makes its own: that connection goes
 * untimed). */
struct bufferevent *cph_deadlines_bevcb(struct event_base *base, void *arg);

/* The request on ev was read whole and goes to its route: its connection has no deadline
 * until the answer is written. */
void cph_deadlines_dispatched(cph_deadlines *d, struct evhttp_request *ev);

/* Appends the cephalon_http_timeouts_total family (Prometheus text 0.0.4). CPH_OK or
 * CPH_ENOMEM. */
int cph_deadlines_metrics(const cph_deadlines *d, cph_buf *out);

#endif
