/* The transport's top: the routing table, authentication and dispatch. libevent hands every
 * request to cph_http_dispatch(), which makes its cph_req (request.h), authenticates it,
 * matches a route, decodes the body and calls the route's handler (routes.h). Calls go down
 * only: to the routes, the request and reply layers, auth and long-polls (for shutdown). */
#include "http.h"

#include <event2/keyvalq_struct.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "cluster.h"
#include "clusterflow.h"
#include "common/log.h"
#include "deadlines.h"
#include "longpoll.h"
#include "reply.h"
#include "request.h"
#include "routes.h"
#include "server.h"

/* ================================================================ routing table */

#define SCOPE_INGEST CPH_POLICY_SCOPE_INGEST
#define SCOPE_WORKER CPH_POLICY_SCOPE_WORKER
#define SCOPE_ADMIN CPH_POLICY_SCOPE_ADMIN
#define SCOPE_READ CPH_POLICY_SCOPE_READ

/* Scopes (DESIGN §9 + the auth contract): ingest posts events; worker leases, heartbeats,
 * completes and fails turns and reads replies; admin changes sessions, requeues and uses
 * everything under /v1/admin; read may call every GET. A route lists every scope that admits it.
 * docs/openapi.json states the same scopes per operation (test_openapi compares them). */
static const cph_route routes[] = {
    {EVHTTP_REQ_GET, "/healthz", 0, 0, cph_route_healthz},
    {EVHTTP_REQ_GET, "/readyz", 0, 0, cph_route_readyz},
    /* the console's static files: public, like a login page; its API calls carry a token */
    {EVHTTP_REQ_GET, "/", 0, 0, cph_route_ui},
    {EVHTTP_REQ_GET, "/ui", 0, 0, cph_route_ui},
    {EVHTTP_REQ_GET, "/ui/{file}", 0, 0, cph_route_ui},
    {EVHTTP_REQ_POST, "/v1/sessions", SCOPE_ADMIN, CPH_ROUTE_BODY, cph_route_session_create},
    {EVHTTP_REQ_GET, "/v1/sessions", SCOPE_READ, 0, cph_route_session_list},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}", SCOPE_READ, 0, cph_route_session_get},
    {EVHTTP_REQ_PUT, "/v1/sessions/{id}", SCOPE_ADMIN, CPH_ROUTE_BODY, cph_route_session_update},
    {EVHTTP_REQ_DELETE, "/v1/sessions/{id}", SCOPE_ADMIN, 0, cph_route_session_delete},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/why", SCOPE_READ, 0, cph_route_session_why},
    {EVHTTP_REQ_POST, "/v1/sessions/{id}/context", SCOPE_ADMIN | SCOPE_WORKER, CPH_ROUTE_BODY,
     cph_route_context_insert},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/context", SCOPE_READ, 0, cph_route_context_get},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/context/step", SCOPE_READ, 0, cph_route_context_step},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/context/diff", SCOPE_READ, 0, cph_route_context_diff},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/turns", SCOPE_READ, 0, cph_route_kept_turns},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/turns/{turn}/context", SCOPE_READ, 0,
     cph_route_turn_context},
    {EVHTTP_REQ_DELETE, "/v1/sessions/{id}/context/{node}", SCOPE_ADMIN | SCOPE_WORKER, 0,
     cph_route_context_delete},
    {EVHTTP_REQ_POST, "/v1/sessions/{id}/seal", SCOPE_ADMIN | SCOPE_WORKER, CPH_ROUTE_BODY,
     cph_route_seal},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/seals", SCOPE_READ, 0, cph_route_seals},
    {EVHTTP_REQ_POST, "/v1/events", SCOPE_INGEST, CPH_ROUTE_BODY | CPH_ROUTE_LAZY_BODY,
     cph_route_events_post},
    {EVHTTP_REQ_POST, "/v1/turns/lease", SCOPE_WORKER, CPH_ROUTE_BODY, cph_route_turn_lease},
    {EVHTTP_REQ_POST, "/v1/turns/{id}/heartbeat", SCOPE_WORKER, CPH_ROUTE_BODY,
     cph_route_turn_heartbeat},
    {EVHTTP_REQ_POST, "/v1/turns/{id}/complete", SCOPE_WORKER, CPH_ROUTE_BODY,
     cph_route_turn_complete},
    {EVHTTP_REQ_POST, "/v1/turns/{id}/fail", SCOPE_WORKER, CPH_ROUTE_BODY, cph_route_turn_fail},
    {EVHTTP_REQ_POST, "/v1/turns/{id}/take", SCOPE_WORKER, CPH_ROUTE_BODY, cph_route_turn_take},
    {EVHTTP_REQ_POST, "/v1/turns/{id}/requeue", SCOPE_ADMIN, CPH_ROUTE_BODY,
     cph_route_turn_requeue},
    {EVHTTP_REQ_GET, "/v1/turns", SCOPE_READ, 0, cph_route_turns_list},
    {EVHTTP_REQ_GET, "/v1/turns/{id}", SCOPE_READ, 0, cph_route_turn_get},
    {EVHTTP_REQ_GET, "/v1/replies", SCOPE_WORKER | SCOPE_READ, 0, cph_route_replies},
    {EVHTTP_REQ_GET, "/v1/lanes", SCOPE_READ, 0, cph_route_lanes},
    {EVHTTP_REQ_GET, "/v1/cluster", SCOPE_READ, 0, cph_route_cluster},
    {EVHTTP_REQ_GET, "/metrics", SCOPE_READ, 0, cph_route_metrics},
    {EVHTTP_REQ_GET, "/v1/top", SCOPE_READ, 0, cph_route_top},
    {EVHTTP_REQ_GET, "/v1/channels/{id}", SCOPE_READ, 0, cph_route_channel_get},
    {EVHTTP_REQ_GET, "/v1/aggregates", SCOPE_READ, 0, cph_route_aggregates},
    {EVHTTP_REQ_GET, "/v1/admin/policy", SCOPE_ADMIN | SCOPE_READ, 0, cph_route_policy_get},
    {EVHTTP_REQ_POST, "/v1/admin/policy/reload", SCOPE_ADMIN, 0, cph_route_policy_reload},
    {EVHTTP_REQ_POST, "/v1/admin/backup", SCOPE_ADMIN, CPH_ROUTE_BODY, cph_route_backup_start},
    {EVHTTP_REQ_GET, "/v1/admin/backup", SCOPE_ADMIN | SCOPE_READ, 0, cph_route_backup_status},
    {EVHTTP_REQ_POST, "/v1/maintenance/jobs", SCOPE_ADMIN, CPH_ROUTE_BODY, cph_route_job_post},
    {EVHTTP_REQ_GET, "/v1/maintenance/jobs", SCOPE_READ, 0, cph_route_jobs_list},
    {EVHTTP_REQ_GET, "/v1/gc/groups", SCOPE_READ, 0, cph_route_gc_groups},
    {EVHTTP_REQ_GET, "/v1/gc/groups/{id}", SCOPE_READ, 0, cph_route_gc_group},
    {EVHTTP_REQ_GET, "/v1/outbox", SCOPE_READ, 0, cph_route_outbox},
    {EVHTTP_REQ_GET, "/v1/events/{id}", SCOPE_READ, 0, cph_route_event_get},
    /* a search counts as an access to what it returns, but a reader may search */
    {EVHTTP_REQ_GET, "/v1/memories/search", SCOPE_READ, 0, cph_route_memories_search},
    /* the API's description: for any client with a valid token, to generate a client from */
    {EVHTTP_REQ_GET, "/v1/openapi.json", SCOPE_INGEST | SCOPE_WORKER | SCOPE_ADMIN | SCOPE_READ, 0,
     cph_route_openapi},
};

#define MAX_SEGMENTS 8

typedef struct path_segments {
  const char *seg[MAX_SEGMENTS];
  size_t len[MAX_SEGMENTS];
  size_t n;
} path_segments;

/* Splits "/a/b/c" into segments; false for too many or empty segments ("//", trailing '/'). */
static bool split_path(const char *path, path_segments *out) {
  out->n = 0;
  if (path[0] != '/')
    return false;
  const char *p = path + 1;
  if (*p == '\0')
    return true; /* "/" has no segments */
  for (;;) {
    const char *slash = strchr(p, '/');
    size_t len = slash ? (size_t)(slash - p) : strlen(p);
    if (len == 0 || out->n == MAX_SEGMENTS)
      return false;
    out->seg[out->n] = p;
    out->len[out->n] = len;
    out->n++;
    if (!slash)
      return true;
    p = slash + 1;
  }
}

/* Whether the path matches pattern; fills params (decoded) when it does and params is
 * non-NULL. Literal segments compare undecoded. */
static bool match_route(const char *pattern, const path_segments *ps, cph_req *r,
                        bool fill_params, bool *bad_param) {
  path_segments pat;
  if (!split_path(pattern, &pat) || pat.n != ps->n)
    return false;
  size_t np = 0;
  for (size_t i = 0; i < pat.n; i++) {
    if (pat.seg[i][0] == '{')
      continue;
    if (pat.len[i] != ps->len[i] || memcmp(pat.seg[i], ps->seg[i], ps->len[i]) != 0)
      return false;
  }
  if (!fill_params)
    return true;
  for (size_t i = 0; i < pat.n; i++) {
    if (pat.seg[i][0] != '{' || np == CPH_REQ_MAX_PARAMS)
      continue;
    char raw[1024];
    if (ps->len[i] >= sizeof raw) {
      *bad_param = true;
      return true;
    }
    memcpy(raw, ps->seg[i], ps->len[i]);
    raw[ps->len[i]] = '\0';
    size_t dlen = 0;
    char *dec = evhttp_uridecode(raw, 0, &dlen);
    if (!dec || strlen(dec) != dlen) { /* an encoded NUL */
      free(dec);
      *bad_param = true;
      return true;
    }
    char *copy = cph_req_alloc(r, dlen + 1);
    if (copy)
      memcpy(copy, dec, dlen + 1);
    free(dec);
    r->params[np++] = copy;
  }
  return true;
}

static const char *method_name(enum evhttp_cmd_type m) {
  switch (m) {
  case EVHTTP_REQ_GET: return "GET";
  case EVHTTP_REQ_POST: return "POST";
  case EVHTTP_REQ_PUT: return "PUT";
  case EVHTTP_REQ_DELETE: return "DELETE";
  default: return "?";
  }
}

void cph_http_release_all(cph_srv *s) {
  while (s->reqs) {
    cph_req *r = s->reqs;
    cph_lp_unwatch(r); /* its socket event must not outlive r */
    /* A detached request is ours to free; an attached one goes with evhttp_free. */
    if (r->ev && !evhttp_request_get_connection(r->ev))
      evhttp_request_free(r->ev);
    r->ev = NULL;
    cph_req_end(r);
  }
}

/* ================================================================ dispatch */

static void peer_of(struct evhttp_request *ev, char *buf, size_t size) {
  struct evhttp_connection *c = evhttp_request_get_connection(ev);
  char *addr = NULL;
  ev_uint16_t port = 0;
  if (c)
    evhttp_connection_get_peer(c, &addr, &port);
  snprintf(buf, size, "%s", addr ? addr : "?");
}

static bool wants_msgpack(struct evhttp_request *ev) {
  const char *accept = evhttp_find_header(evhttp_request_get_input_headers(ev), "Accept");
  return accept && (strcasestr(accept, "application/msgpack") ||
                    strcasestr(accept, "application/x-msgpack"));
}

/* Ends a route's run as dispatch does: a handler that neither answered nor went asynchronous
 * answers its recorded error (or 500); a request answered at once is freed. */
static void route_finish(cph_req *r) {
  if (r->async)
    return; /* it ends in cph_req_end */
  if (r->ev) {
    if (r->error.set)
      cph_reply_failure(r);
    else
      cph_reply_error(r, 500, "internal", NULL, "no answer was produced");
  }
  cph_req_end(r);
}

void cph_http_resume(cph_req *r, void (*fn)(cph_req *r, void *arg), void *arg) {
  r->async = false;
  fn(r, arg);
  route_finish(r);
}

/* After a min_pos wait: the route runs now, on the node that still serves the session. */
static void route_resume(cph_req *r) {
  r->async = false;
  if (r->srv->stopping) {
    cph_reply_error(r, 503, "unavailable", NULL, "cephalond is shutting down");
  } else if (strncmp(r->route->pattern, "/v1/sessions/{id}", 17) != 0 ||
             cph_cluster_gate_id(r, "session", r->params[0])) {
    r->route->fn(r);
  }
  route_finish(r);
}

/* min_pos (DESIGN §14 "Reads see writes"; clusterflow.h 9.): a query parameter of a session's
 * GET routes, a member of the lease's body. Checked everywhere (a non-negative integer); only
 * with the cluster log does a request wait for it (a single node applied every event before it
 * answered its post). True when the route may run now; false when r was answered (a bad
 * value) or waits (r->async). */
static bool min_pos_gate(cph_req *r) {
  bool session_get = evhttp_request_get_command(r->ev) == EVHTTP_REQ_GET &&
                     strncmp(r->route->pattern, "/v1/sessions/{id}", 17) == 0;
  bool lease = r->route->fn == cph_route_turn_lease;
  if (!session_get && !lease)
    return true;
  uint64_t pos = 0;
  bool ok = lease ? cph_in_u64(r, r->body, "", "min_pos", 0, INT64_MAX, &pos)
                  : cph_query_u64(r, "min_pos", 0, INT64_MAX, &pos);
  if (!ok) {
    cph_reply_failure(r);
    return false;
  }
  if (pos == 0 || !r->srv->cflow)
    return true;
  int64_t shard =
      lease ? -1 : (int64_t)cph_cluster_shard_of(r->params[0], cph_cluster_shards(r->srv->cluster));
  cph_cflow_wait_pos(r->srv->cflow, r, pos, shard, route_resume);
  return false;
}

void cph_http_dispatch(struct evhttp_request *ev, void *arg) {
  cph_srv *s = arg;
  /* read whole: its head and body deadlines stop here (a long-poll may wait much longer) */
  if (s->deadlines)
    cph_deadlines_dispatched(s->deadlines, ev);
  s->open_reqs++;
  cph_req *r = cph_req_new(s, ev);
  if (!r) {
    s->open_reqs--;
    evhttp_send_error(ev, 500, "out of memory");
    return;
  }
  peer_of(ev, r->peer, sizeof r->peer);
  r->msgpack_out = wants_msgpack(ev);

  const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(ev);
  const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
  const char *query = uri ? evhttp_uri_get_query(uri) : NULL;
  if (!path || !*path)
    path = "/";
  if (query && evhttp_parse_query_str(query, &r->query) == 0)
    r->query_parsed = true;
  else if (query) {
    evhttp_clear_headers(&r->query);
    cph_reply_error(r, 400, "bad_request", NULL, "malformed query string");
    goto finish;
  }

  if (s->stopping) {
    cph_reply_error(r, 503, "unavailable", NULL, "cephalond is shutting down");
    goto finish;
  }

  enum evhttp_cmd_type method = evhttp_request_get_command(ev);
  path_segments ps;
  const cph_route *found = NULL, *other_method = NULL;
  /* The path is the most specific pattern it matches — the fewest {params}: a literal segment
   * beats a parameter, so GET /v1/turns/lease is the lease route's 405, not turn "lease" of
   * GET /v1/turns/{id} — and then the method picks among that pattern's routes. */
  size_t best = SIZE_MAX;
  if (split_path(path, &ps)) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
      if (!match_route(routes[i].pattern, &ps, r, false, NULL))
        continue;
      size_t params = 0;
      for (const char *c = routes[i].pattern; *c; c++)
        params += *c == '{';
      if (params > best)
        continue;
      if (params < best) {
        best = params;
        found = other_method = NULL;
      }
      if (routes[i].method == method && !found)
        found = &routes[i];
      else if (routes[i].method != method)
        other_method = &routes[i];
    }
  }

  /* Authentication comes before routing, so an unauthenticated client learns nothing about
   * which paths exist; only the public health routes are exempt. */
  const cph_policy *p = cph_engine_policy(s->engine);
  unsigned granted = ~0u;
  const char *who = NULL; /* the token's name from the policy: loggable, unlike the token */
  if (p->auth_enabled && !(found && found->scopes == 0)) {
    granted = cph_auth_scopes(
        p, evhttp_find_header(evhttp_request_get_input_headers(ev), "Authorization"), &who);
    if (!granted) {
      cph_debug("%s %s %s: unauthorized", r->peer, method_name(method), path);
      cph_reply_error(r, 401, "unauthorized", NULL,
                      "a valid `Authorization: Bearer <token>` header is required");
      goto finish;
    }
  }
  if (!found) {
    if (other_method)
      cph_reply_error(r, 405, "method_not_allowed", NULL, "%s is not allowed on %s",
                      method_name(method), path);
    else
      cph_reply_error(r, 404, "not_found", NULL, "no such route: %s %s", method_name(method),
                      path);
    goto finish;
  }
  r->route = found;
  if (found->scopes && !(granted & found->scopes)) {
    char names[64];
    cph_debug("%s %s %s: token \"%s\" lacks the scope", r->peer, method_name(method), path,
              who ? who : "?");
    cph_reply_error(r, 403, "forbidden", NULL, "this token lacks the %s scope needed for %s %s",
                    cph_auth_scope_names(found->scopes, names, sizeof names),
                    method_name(method), found->pattern);
    goto finish;
  }
  bool bad_param = false;
  match_route(found->pattern, &ps, r, true, &bad_param);
  if (bad_param) {
    cph_reply_error(r, 400, "bad_request", "id", "malformed path parameter");
    goto finish;
  }
  if (r->error.set) { /* out of memory copying parameters */
    cph_reply_failure(r);
    goto finish;
  }
  /* Cluster mode: a session's routes and a turn's answer only on the node serving its shard
   * (POST /v1/sessions, the lease and POST /v1/events gate in their handlers). */
  if (s->cluster && strncmp(found->pattern, "/v1/sessions/{id}", 17) == 0 &&
      !cph_cluster_gate_id(r, "session", r->params[0]))
    goto finish;
  if (s->cluster && strncmp(found->pattern, "/v1/turns/{id}/", 15) == 0 &&
      !cph_cluster_gate_turn(r, r->params[0]))
    goto finish;
  if ((found->flags & CPH_ROUTE_BODY) && !(found->flags & CPH_ROUTE_LAZY_BODY) &&
      !cph_req_decode_body(r)) {
    cph_reply_failure(r);
    goto finish;
  }
  if (!min_pos_gate(r)) {
    if (r->async)
      return; /* it waits for its position, then runs (route_resume) */
    goto finish;
  }
  found->fn(r);
  route_finish(r);
  return;
finish:
  cph_req_end(r);
}
