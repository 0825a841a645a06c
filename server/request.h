/* The request context of cephalond's HTTP API: a cph_req's memory, lifetime, recorded error,
 * query, body (JSON or msgpack) and typed field access. Answering is reply.h's.
 *
 * Request lifetime. libevent hands every request to cph_http_dispatch() (http.c), which
 * makes its cph_req, authenticates it, matches a route, decodes the body and calls the
 * route's handler. A handler answers in one of two ways:
 * - at once: it calls one cph_reply_*() and returns; dispatch then frees the cph_req;
 * - later: it calls cph_req_submit() (an engine operation; the reply is sent from the op's
 *   `done`, i.e. after commit) or parks the request as a long-poll (routes_replies.c); the
 *   request then ends in cph_req_end().
 * Exactly one reply is sent per request; after it r->ev is NULL. A reply to a client that
 * went away is harmless: libevent notices the close when it writes and frees the connection
 * (libevent 2.1 does not read a connection while its request waits, so it cannot notice
 * earlier; long-polls watch the socket themselves, see longpoll.h). */
#ifndef CEPHALON_SERVER_REQUEST_H
#define CEPHALON_SERVER_REQUEST_H

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;
typedef struct cph_arena_block cph_arena_block;

typedef void (*cph_route_fn)(cph_req *r);

enum {
  CPH_ROUTE_BODY = 1u << 0, /* decode the body as a JSON object (an empty body reads as {}) */
  /* With CPH_ROUTE_BODY: the body is not decoded before the route runs; the route may read
   * it raw (cph_req_raw_json) and calls cph_req_decode_body when it wants the object. */
  CPH_ROUTE_LAZY_BODY = 1u << 1,
};

typedef struct cph_route {
  enum evhttp_cmd_type method;
  const char *pattern; /* "/v1/sessions/{id}/why": {name} matches one non-empty segment */
  unsigned scopes;     /* CPH_POLICY_SCOPE_* bits, any one of which admits; 0 = public */
  unsigned flags;      /* CPH_ROUTE_* */
  cph_route_fn fn;
} cph_route;

/* The first problem found in a request; later ones are not recorded. */
typedef struct cph_req_error {
  bool set;
  int status;       /* HTTP status */
  const char *code; /* "bad_request", "too_large", ... */
  char field[192];  /* "" = null */
  char message[512];
} cph_req_error;

#define CPH_REQ_MAX_PARAMS 2

struct cph_req {
  cph_srv *srv;
  struct evhttp_request *ev; /* NULL once answered, or when libevent took it back */
  const cph_route *route;
  char *params[CPH_REQ_MAX_PARAMS]; /* decoded {name} segments, in pattern order */
  struct evkeyvalq query;
  bool query_parsed;
  json_t *body;     /* CPH_ROUTE_BODY: the decoded object */
  bool msgpack_out; /* Accept: application/msgpack */
  char peer[64];    /* client address, for per-client limits and logs */
  cph_req_error error;
  cph_arena_block *arena;
  cph_req *prev, *next; /* every live request, for shutdown */

  /* Asynchronous requests. */
  bool async;                  /* the handler returned without answering */
  cph_op op;                   /* the engine operation, when submitted */
  bool op_pending;             /* submitted, done not yet called */
  /* Set by on_done when a request thread writes the answer (offload.h): the job answers,
   * clears the op's results and ends r. */
  bool answering;
  void (*on_done)(cph_req *r); /* answers from r->op after commit */
  /* Set by on_done when it hands r on instead of answering (cluster mode: a completion waits
   * for its done mark, clusterflow.h): whoever took it answers and ends it. */
  bool held;
  /* While on_done runs: whoever took r may answer and end it before on_done returns (a mark
   * the log refuses at once, e.g. on a fenced shard); cph_req_end then only notes end_wanted,
   * and on_op_done ends r once on_done is back. */
  bool in_done, end_wanted;

  /* Long-polls (lease, replies): longpoll.c and the two routes keep these; the two events
   * are freed with the request. */
  bool lp_counted;         /* counted against the client's long-poll limit */
  bool lp_listed;          /* on a cph_longpolls list (leases or repliers) */
  struct event *lp_timer;  /* replies: the wait; lease: a fallback past the deadline */
  struct event *lp_watch;  /* read event on the client's socket (see longpoll.h) */
  void (*lp_gone)(cph_req *r); /* the client closed its connection while r waited */
  void (*lp_stop)(cph_req *r); /* ends r at shutdown (cph_longpolls_stop) */
  cph_req *lp_prev, *lp_next;
  uint64_t lp_after;       /* replies: answer once a reply id exceeds this */
  size_t lp_limit;         /* replies: page size */
};

/* ---------------------------------------------------------------- lifetime */

/* A new request on s's list of live requests (NULL on out of memory); dispatch's. */
cph_req *cph_req_new(cph_srv *s, struct evhttp_request *ev);
/* Frees r: dispatch frees a request answered at once; an asynchronous one ends here once it
 * was answered. */
void cph_req_end(cph_req *r);

/* ---------------------------------------------------------------- errors and body */

/* Records the error (first one wins) without answering; fmt describes it for the client. */
void cph_req_fail(cph_req *r, int status, const char *code, const char *field, const char *fmt,
                  ...) __attribute__((format(printf, 5, 6)));
void cph_req_vfail(cph_req *r, int status, const char *code, const char *field, const char *fmt,
                   va_list ap) __attribute__((format(printf, 5, 0)));
/* The request body as received, contiguous, when it is JSON (not msgpack), non-empty and
 * within :max-body-bytes; else NULL. Valid until the request is freed. */
const char *cph_req_raw_json(cph_req *r, size_t *len);
/* Decodes the body into r->body as CPH_ROUTE_BODY does (a CPH_ROUTE_LAZY_BODY route calls
 * it); false with the error recorded. */
bool cph_req_decode_body(cph_req *r);

/* ---------------------------------------------------------------- request data */

/* Zeroed memory that lives as long as the request; NULL (and a 500 recorded) on OOM. */
void *cph_req_alloc(cph_req *r, size_t n);
/* Query parameter (decoded) or NULL. */
const char *cph_req_query(cph_req *r, const char *key);
/* Query parameter as an unsigned integer in [0, max]; def when absent. On a bad value
 * records a 400 naming the parameter and returns false. */
bool cph_query_u64(cph_req *r, const char *key, uint64_t def, uint64_t max, uint64_t *out);

/* Typed access to a field `key` of the JSON object obj, whose own path is `path` ("" for the
 * body, "events[3]" ...). Absent and JSON null are the same. Each returns true when the field
 * is fine (present or absent-and-optional) and false after recording a 400 naming the field
 * ("events[3].channel"). Strings point into the decoded body (they live as long as r). */
enum {
  CPH_IN_REQUIRED = 1u << 0
};
bool cph_in_str(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                const char **out);
bool cph_in_u64(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                uint64_t max, uint64_t *out);
bool cph_in_i64(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                int64_t min, int64_t max, int64_t *out);
bool cph_in_bool(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                 bool *out);
/* An array of strings, into a request-owned cph_strv (count 0 when absent). */
bool cph_in_strv(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                 cph_strv *out);
/* An object or an array field; *out NULL when absent. */
bool cph_in_obj(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                json_t **out);
bool cph_in_arr(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                json_t **out);
/* Joins path and key into buf ("events[3]" + "channel" = "events[3].channel"). */
const char *cph_field_path(char *buf, size_t size, const char *path, const char *key);

#endif
