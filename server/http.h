/* The transport's top (http.c): the routing table, authentication, and dispatch to the
 * route handlers (routes.h). The request context is request.h's, answering is reply.h's. */
#ifndef CEPHALON_SERVER_HTTP_H
#define CEPHALON_SERVER_HTTP_H

#include <event2/http.h>

typedef struct cph_srv cph_srv;

/* libevent's generic callback (evhttp_set_gencb); arg is the cph_srv. */
void cph_http_dispatch(struct evhttp_request *ev, void *arg);
/* Frees every live request at shutdown (after the engine holds none of their ops). Requests
 * libevent still owns are left to evhttp_free. */
void cph_http_release_all(cph_srv *s);
/* Continues a request that went asynchronous and is the loop's again (its job off the loop
 * came back, offload.h): fn(r, arg) may answer, submit or go asynchronous again; then r
 * ends as dispatch ends a route's run. */
typedef struct cph_req cph_req;
void cph_http_resume(cph_req *r, void (*fn)(cph_req *r, void *arg), void *arg);

#endif
