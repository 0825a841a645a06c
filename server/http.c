#include "http.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/keyvalq_struct.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include "auth.h"
#include "common/log.h"
#include "longpoll.h"
#include "mpjson.h"
#include "routes.h"
#include "server.h"

/* ================================================================ routing table */

#define SCOPE_INGEST CPH_POLICY_SCOPE_INGEST
#define SCOPE_WORKER CPH_POLICY_SCOPE_WORKER
#define SCOPE_ADMIN CPH_POLICY_SCOPE_ADMIN
#define SCOPE_READ CPH_POLICY_SCOPE_READ

/* Scopes (DESIGN §9 + the auth contract): ingest posts events; worker leases, heartbeats,
 * completes and fails turns and reads replies; admin changes sessions, requeues and uses
 * everything under /v1/admin; read may call every GET. A route lists every scope that admits it. */
static const cph_route routes[] = {
    {EVHTTP_REQ_GET, "/healthz", 0, 0, cph_route_healthz},
    {EVHTTP_REQ_GET, "/readyz", 0, 0, cph_route_readyz},
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
    {EVHTTP_REQ_POST, "/v1/turns/{id}/requeue", SCOPE_ADMIN, CPH_ROUTE_BODY,
     cph_route_turn_requeue},
    {EVHTTP_REQ_GET, "/v1/turns", SCOPE_READ, 0, cph_route_turns_list},
    {EVHTTP_REQ_GET, "/v1/replies", SCOPE_WORKER | SCOPE_READ, 0, cph_route_replies},
    {EVHTTP_REQ_GET, "/v1/lanes", SCOPE_READ, 0, cph_route_lanes},
    {EVHTTP_REQ_GET, "/metrics", SCOPE_READ, 0, cph_route_metrics},
    {EVHTTP_REQ_GET, "/v1/top", SCOPE_READ, 0, cph_route_top},
    {EVHTTP_REQ_GET, "/v1/channels/{id}", SCOPE_READ, 0, cph_route_channel_get},
    {EVHTTP_REQ_GET, "/v1/aggregates", SCOPE_READ, 0, cph_route_aggregates},
    {EVHTTP_REQ_GET, "/v1/admin/policy", SCOPE_ADMIN | SCOPE_READ, 0, cph_route_policy_get},
    {EVHTTP_REQ_POST, "/v1/admin/policy/reload", SCOPE_ADMIN, 0, cph_route_policy_reload},
    {EVHTTP_REQ_POST, "/v1/maintenance/jobs", SCOPE_ADMIN, CPH_ROUTE_BODY, cph_route_job_post},
    {EVHTTP_REQ_GET, "/v1/maintenance/jobs", SCOPE_READ, 0, cph_route_jobs_list},
    {EVHTTP_REQ_GET, "/v1/gc/groups", SCOPE_READ, 0, cph_route_gc_groups},
    {EVHTTP_REQ_GET, "/v1/gc/groups/{id}", SCOPE_READ, 0, cph_route_gc_group},
    {EVHTTP_REQ_GET, "/v1/outbox", SCOPE_READ, 0, cph_route_outbox},
    {EVHTTP_REQ_GET, "/v1/events/{id}", SCOPE_READ, 0, cph_route_event_get},
    /* a search counts as an access to what it returns, but a reader may search */
    {EVHTTP_REQ_GET, "/v1/memories/search", SCOPE_READ, 0, cph_route_memories_search},
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

/* ================================================================ request memory */

struct cph_arena_block {
  cph_arena_block *next;
  size_t used, cap;
  max_align_t data[];
};

#define ARENA_BLOCK 4096

void *cph_req_alloc(cph_req *r, size_t n) {
  size_t need = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (need < n) {
    cph_req_fail(r, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  cph_arena_block *b = r->arena;
  if (!b || b->cap - b->used < need) {
    size_t cap = need > ARENA_BLOCK ? need : ARENA_BLOCK;
    b = malloc(sizeof *b + cap);
    if (!b) {
      cph_req_fail(r, 500, "internal", NULL, "out of memory");
      return NULL;
    }
    b->cap = cap;
    b->used = 0;
    b->next = r->arena;
    r->arena = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += need;
  memset(p, 0, n);
  return p;
}

static void arena_free(cph_req *r) {
  cph_arena_block *b = r->arena;
  while (b) {
    cph_arena_block *next = b->next;
    free(b);
    b = next;
  }
  r->arena = NULL;
}

static cph_req *req_new(cph_srv *s, struct evhttp_request *ev) {
  cph_req *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->srv = s;
  r->ev = ev;
  TAILQ_INIT(&r->query);
  r->next = s->reqs;
  if (s->reqs)
    s->reqs->prev = r;
  s->reqs = r;
  return r;
}

static void req_free(cph_req *r) {
  cph_srv *s = r->srv;
  if (r->prev)
    r->prev->next = r->next;
  else
    s->reqs = r->next;
  if (r->next)
    r->next->prev = r->prev;
  if (r->lp_timer)
    event_free(r->lp_timer);
  if (r->lp_watch)
    event_free(r->lp_watch);
  if (r->query_parsed)
    evhttp_clear_headers(&r->query);
  json_decref(r->body);
  arena_free(r);
  free(r);
}

/* ================================================================ replies */

static const char *status_phrase(int status) {
  switch (status) {
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 409: return "Conflict";
  case 413: return "Payload Too Large";
  case 429: return "Too Many Requests";
  case 500: return "Internal Server Error";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 507: return "Insufficient Storage";
  default: return "Unknown";
  }
}

/* evhttp has written the whole reply (never called when the write fails: the shutdown then
 * waits a bounded grace instead, see main.c). */
static void on_reply_written(struct evhttp_request *ev, void *arg) {
  (void)ev;
  cph_srv_reply_flushed(arg);
}

/* The common end of every answer: headers every answer gets, the send, and the shutdown
 * bookkeeping. Frees buf. */
static void send_buffer(cph_req *r, struct evhttp_request *ev, int status, struct evbuffer *buf) {
  struct evkeyvalq *h = evhttp_request_get_output_headers(ev);
  if (status == 401)
    evhttp_add_header(h, "WWW-Authenticate", "Bearer");
  if (r->srv->stopping)
    evhttp_add_header(h, "Connection", "close");
  /* A detached request (no connection) is freed by evhttp_send_reply without a callback. */
  if (evhttp_request_get_connection(ev)) {
    r->srv->unflushed++;
    evhttp_request_set_on_complete_cb(ev, on_reply_written, r->srv);
  }
  evhttp_send_reply(ev, status, status_phrase(status), buf);
  if (buf)
    evbuffer_free(buf);
  cph_srv_request_closed(r->srv);
}

/* The body of a 500 when the real one could not be built (allocation failed). */
static void add_oom_body(struct evbuffer *buf) {
  evbuffer_add_printf(buf, "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\","
                           "\"field\":null}}\n");
}

static void send_reply(cph_req *r, int status, json_t *body) {
  struct evhttp_request *ev = r->ev;
  if (!ev) { /* answered already: one reply per request */
    json_decref(body);
    return;
  }
  r->ev = NULL;
  struct evbuffer *buf = evbuffer_new();
  struct evkeyvalq *h = evhttp_request_get_output_headers(ev);
  if (buf && body) {
    char *data = NULL;
    size_t len = 0;
    if (r->msgpack_out) {
      data = cph_mpjson_write(body, &len);
      evhttp_add_header(h, "Content-Type", "application/msgpack");
    } else {
      /* 15 significant digits: 28.023587389, not 28.023587388999999 */
      data = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
      len = data ? strlen(data) : 0;
      evhttp_add_header(h, "Content-Type", "application/json");
    }
    if (data) {
      evbuffer_add(buf, data, len);
      if (!r->msgpack_out)
        evbuffer_add(buf, "\n", 1);
      free(data);
    } else {
      status = 500;
      add_oom_body(buf);
    }
  }
  json_decref(body);
  send_buffer(r, ev, status, buf);
}

void cph_reply_json(cph_req *r, int status, json_t *body) { send_reply(r, status, body); }

static void free_body(const void *data, size_t len, void *arg) {
  (void)len;
  (void)arg;
  free((void *)data);
}

void cph_reply_emitted(cph_req *r, int status, cph_buf *body) {
  struct evhttp_request *ev = r->ev;
  if (!ev) { /* answered already: one reply per request */
    cph_buf_free(body);
    return;
  }
  r->ev = NULL;
  if (!r->msgpack_out)
    cph_buf_putc(body, '\n');
  struct evbuffer *buf = evbuffer_new();
  size_t len = body->len;
  char *data = cph_buf_error(body) ? NULL : cph_buf_steal(body);
  cph_buf_free(body);
  if (buf && data && evbuffer_add_reference(buf, data, len, free_body, NULL) == 0) {
    evhttp_add_header(evhttp_request_get_output_headers(ev), "Content-Type",
                      r->msgpack_out ? "application/msgpack" : "application/json");
  } else {
    free(data);
    status = 500;
    if (buf)
      add_oom_body(buf);
    evhttp_add_header(evhttp_request_get_output_headers(ev), "Content-Type", "application/json");
  }
  send_buffer(r, ev, status, buf);
}

void cph_reply_text(cph_req *r, int status, const char *content_type, const char *data,
                    size_t len) {
  struct evhttp_request *ev = r->ev;
  if (!ev)
    return; /* answered already: one reply per request */
  r->ev = NULL;
  struct evbuffer *buf = evbuffer_new();
  if (!buf || evbuffer_add(buf, data, len) != 0) {
    status = 500;
    content_type = "application/json";
    if (buf)
      add_oom_body(buf);
  }
  evhttp_add_header(evhttp_request_get_output_headers(ev), "Content-Type", content_type);
  send_buffer(r, ev, status, buf);
}

void cph_reply_empty(cph_req *r, int status) { send_reply(r, status, NULL); }

static void req_vfail(cph_req *r, int status, const char *code, const char *field,
                      const char *fmt, va_list ap) {
  if (r->error.set)
    return;
  r->error.set = true;
  r->error.status = status;
  r->error.code = code;
  snprintf(r->error.field, sizeof r->error.field, "%s", field ? field : "");
  vsnprintf(r->error.message, sizeof r->error.message, fmt, ap);
}

void cph_req_fail(cph_req *r, int status, const char *code, const char *field, const char *fmt,
                  ...) {
  va_list ap;
  va_start(ap, fmt);
  req_vfail(r, status, code, field, fmt, ap);
  va_end(ap);
}

/* Error text may quote client input (a percent-decoded path segment need not be UTF-8):
 * bytes that would make it invalid JSON become '?', so the message is never lost. */
static json_t *json_text(const char *s) {
  json_t *v = json_string(s);
  if (v)
    return v;
  char buf[sizeof ((cph_req_error *)0)->message];
  size_t i = 0;
  for (; s[i] && i + 1 < sizeof buf; i++)
    buf[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
  buf[i] = '\0';
  return json_string(buf);
}

void cph_reply_failure(cph_req *r) {
  if (!r->error.set)
    cph_req_fail(r, 500, "internal", NULL, "internal error");
  const cph_req_error *e = &r->error;
  json_t *err = json_object();
  json_object_set_new(err, "code", json_string(e->code));
  json_object_set_new(err, "message", json_text(e->message));
  json_object_set_new(err, "field", e->field[0] ? json_text(e->field) : json_null());
  json_t *body = json_object();
  json_object_set_new(body, "error", err);
  if (e->status >= 500 || e->status == 429)
    cph_debug("%s %s -> %d %s", r->peer, r->route ? r->route->pattern : "-", e->status,
              e->message);
  send_reply(r, e->status, body);
}

void cph_reply_error(cph_req *r, int status, const char *code, const char *field,
                     const char *fmt, ...) {
  r->error.set = false; /* an explicit answer replaces whatever was recorded */
  va_list ap;
  va_start(ap, fmt);
  req_vfail(r, status, code, field, fmt, ap);
  va_end(ap);
  cph_reply_failure(r);
}

void cph_reply_rc(cph_req *r, int rc, const char *msg, const char *field) {
  int status;
  const char *code;
  switch (rc) {
  case CPH_EINVAL: status = 400; code = "bad_request"; break;
  case CPH_EAUTH: status = 401; code = "unauthorized"; break;
  case CPH_EFORBIDDEN: status = 403; code = "forbidden"; break;
  case CPH_ENOTFOUND: status = 404; code = "not_found"; break;
  case CPH_ECONFLICT:
  case CPH_EEXISTS:
  case CPH_ESTATE: status = 409; code = "conflict"; break;
  case CPH_ELIMIT: status = 413; code = "too_large"; break;
  case CPH_EBUSY: status = 503; code = "unavailable"; break;
  case CPH_EFULL: status = 507; code = "storage_full"; break;
  default: status = 500; code = "internal"; break;
  }
  if (status == 500)
    cph_error("%s %s: %s (%s)", r->peer, r->route ? r->route->pattern : "-", cph_errname(rc),
              msg && *msg ? msg : cph_strerror(rc));
  cph_reply_error(r, status, code, field && *field ? field : NULL, "%s",
                  msg && *msg ? msg : cph_strerror(rc));
}

/* ================================================================ async requests */

static void on_op_done(cph_op *op, void *ctx) {
  cph_req *r = ctx;
  (void)op;
  r->op_pending = false;
  r->on_done(r);
  if (r->ev) /* on_done must answer; never leave a client hanging */
    cph_reply_error(r, 500, "internal", NULL, "no answer was produced");
  cph_op_clear_results(&r->op);
  cph_req_end(r);
}

bool cph_req_submit(cph_req *r, cph_op_kind kind, void (*on_done)(cph_req *r)) {
  r->op.kind = kind;
  r->op.done = on_op_done;
  r->op.ctx = r;
  r->on_done = on_done;
  int rc = cph_engine_submit(r->srv->engine, &r->op);
  if (rc != CPH_OK) {
    /* Contract: a refused op is never called back. */
    cph_reply_rc(r, rc, r->op.err.msg, r->op.field);
    return false;
  }
  r->op_pending = true;
  r->async = true;
  cph_srv_schedule_pass(r->srv);
  return true;
}

void cph_req_end(cph_req *r) { req_free(r); }

void cph_http_release_all(cph_srv *s) {
  while (s->reqs) {
    cph_req *r = s->reqs;
    cph_lp_unwatch(r); /* its socket event must not outlive r */
    /* A detached request is ours to free; an attached one goes with evhttp_free. */
    if (r->ev && !evhttp_request_get_connection(r->ev))
      evhttp_request_free(r->ev);
    r->ev = NULL;
    req_free(r);
  }
}

/* ================================================================ request data */

const char *cph_req_query(cph_req *r, const char *key) {
  return r->query_parsed ? evhttp_find_header(&r->query, key) : NULL;
}

bool cph_query_u64(cph_req *r, const char *key, uint64_t def, uint64_t max, uint64_t *out) {
  const char *v = cph_req_query(r, key);
  if (!v || !*v) {
    *out = def;
    return true;
  }
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (*end != '\0' || v[0] == '-' || v[0] == '+' || errno == ERANGE || n > max) {
    cph_req_fail(r, 400, "bad_request", key, "%s must be an integer from 0 to %" PRIu64, key, max);
    return false;
  }
  *out = n;
  return true;
}

const char *cph_field_path(char *buf, size_t size, const char *path, const char *key) {
  snprintf(buf, size, "%s%s%s", path, path[0] ? "." : "", key);
  return buf;
}

/* The field, or NULL when absent or JSON null. */
static json_t *field_get(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return v && !json_is_null(v) ? v : NULL;
}

static bool missing(cph_req *r, const char *path, const char *key, unsigned flags) {
  if (!(flags & CPH_IN_REQUIRED))
    return true;
  char f[192];
  cph_field_path(f, sizeof f, path, key);
  cph_req_fail(r, 400, "bad_request", f, "%s is required", f);
  return false;
}

static bool wrong_type(cph_req *r, const char *path, const char *key, const char *expected) {
  char f[192];
  cph_field_path(f, sizeof f, path, key);
  cph_req_fail(r, 400, "bad_request", f, "%s must be %s", f, expected);
  return false;
}

bool cph_in_str(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                const char **out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_string(v))
    return wrong_type(r, path, key, "a string");
  *out = json_string_value(v);
  return true;
}

bool cph_in_u64(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                uint64_t max, uint64_t *out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_integer(v) || json_integer_value(v) < 0 ||
      (uint64_t)json_integer_value(v) > max) {
    char expected[64];
    snprintf(expected, sizeof expected, "an integer from 0 to %" PRIu64, max);
    return wrong_type(r, path, key, expected);
  }
  *out = (uint64_t)json_integer_value(v);
  return true;
}

bool cph_in_i64(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                int64_t min, int64_t max, int64_t *out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
    char expected[96];
    snprintf(expected, sizeof expected, "an integer from %" PRId64 " to %" PRId64, min, max);
    return wrong_type(r, path, key, expected);
  }
  *out = (int64_t)json_integer_value(v);
  return true;
}

bool cph_in_bool(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                 bool *out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_boolean(v))
    return wrong_type(r, path, key, "true or false");
  *out = json_is_true(v);
  return true;
}

bool cph_in_strv(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                 cph_strv *out) {
  out->items = NULL;
  out->count = 0;
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_array(v))
    return wrong_type(r, path, key, "an array of strings");
  size_t n = json_array_size(v);
  if (n == 0)
    return true;
  char **items = cph_req_alloc(r, n * sizeof *items);
  if (!items)
    return false;
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_array_get(v, i);
    if (!json_is_string(s)) {
      char f[192], fi[224];
      cph_field_path(f, sizeof f, path, key);
      snprintf(fi, sizeof fi, "%s[%zu]", f, i);
      cph_req_fail(r, 400, "bad_request", fi, "%s must be a string", fi);
      return false;
    }
    /* The engine takes char ** but does not write through it (inputs stay the caller's). */
    items[i] = (char *)json_string_value(s);
  }
  out->items = items;
  out->count = n;
  return true;
}

bool cph_in_obj(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                json_t **out) {
  *out = NULL;
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_object(v))
    return wrong_type(r, path, key, "an object");
  *out = v;
  return true;
}

bool cph_in_arr(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                json_t **out) {
  *out = NULL;
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_array(v))
    return wrong_type(r, path, key, "an array");
  *out = v;
  return true;
}

json_t *cph_json_str(const char *s) { return s ? json_string(s) : json_null(); }

json_t *cph_json_strv(const cph_strv *v) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < v->count; i++)
    json_array_append_new(a, cph_json_str(v->items[i]));
  return a;
}

json_t *cph_json_u64(uint64_t v) {
  /* JSON integers here are int64; ids and counters never come near the top bit. */
  return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

/* ================================================================ body decoding */

/* Every string (and key) in the body must fit :server :max-string-bytes; the first one that
 * does not is named by its path ("events[3].body"). Iterative depth is bounded by the
 * decoders (jansson: 2048, msgpack: CPH_MPJSON_MAX_DEPTH). */
static bool check_strings(cph_req *r, json_t *v, char *path, size_t plen, size_t cap,
                          size_t max) {
  if (json_is_string(v)) {
    if (json_string_length(v) > max) {
      cph_req_fail(r, 413, "too_large", path[0] ? path : NULL,
                   "%s is %zu bytes, longer than :max-string-bytes %zu", path[0] ? path : "string",
                   json_string_length(v), max);
      return false;
    }
    return true;
  }
  if (json_is_array(v)) {
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
      int w = snprintf(path + plen, cap - plen, "[%zu]", i);
      size_t nl = w > 0 && (size_t)w < cap - plen ? plen + (size_t)w : plen;
      if (!check_strings(r, json_array_get(v, i), path, nl, cap, max))
        return false;
      path[plen] = '\0';
    }
    return true;
  }
  if (json_is_object(v)) {
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(v, key, key_len, val) {
      int w = snprintf(path + plen, cap - plen, "%s%.*s", plen ? "." : "",
                       (int)(key_len > 64 ? 64 : key_len), key);
      size_t nl = w > 0 && (size_t)w < cap - plen ? plen + (size_t)w : plen;
      if (key_len > max) {
        cph_req_fail(r, 413, "too_large", path, "a key is %zu bytes, longer than "
                     ":max-string-bytes %zu", key_len, max);
        return false;
      }
      if (!check_strings(r, val, path, nl, cap, max))
        return false;
      path[plen] = '\0';
    }
  }
  return true;
}

static bool is_msgpack_type(const char *ct) {
  if (!ct)
    return false;
  while (*ct == ' ')
    ct++;
  return strncasecmp(ct, "application/msgpack", 19) == 0 ||
         strncasecmp(ct, "application/x-msgpack", 21) == 0;
}

const char *cph_req_raw_json(cph_req *r, size_t *len) {
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  struct evbuffer *in = evhttp_request_get_input_buffer(r->ev);
  *len = evbuffer_get_length(in);
  if (*len == 0 || (int64_t)*len > p->server.max_body_bytes ||
      is_msgpack_type(evhttp_find_header(evhttp_request_get_input_headers(r->ev),
                                         "Content-Type")))
    return NULL;
  return (const char *)evbuffer_pullup(in, -1);
}

bool cph_req_decode_body(cph_req *r) {
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  struct evbuffer *in = evhttp_request_get_input_buffer(r->ev);
  size_t len = evbuffer_get_length(in);
  if ((int64_t)len > p->server.max_body_bytes) {
    cph_req_fail(r, 413, "too_large", NULL, "request body is %zu bytes, more than "
                 ":max-body-bytes %" PRId64, len, p->server.max_body_bytes);
    return false;
  }
  if (len == 0) {
    r->body = json_object();
    return r->body != NULL;
  }
  const char *data = (const char *)evbuffer_pullup(in, -1);
  if (!data) {
    cph_req_fail(r, 500, "internal", NULL, "out of memory");
    return false;
  }
  const char *ct = evhttp_find_header(evhttp_request_get_input_headers(r->ev), "Content-Type");
  if (is_msgpack_type(ct)) {
    char err[256];
    r->body = cph_mpjson_read(data, len, err, sizeof err);
    if (!r->body) {
      cph_req_fail(r, 400, "bad_request", NULL, "%s", err);
      return false;
    }
  } else {
    json_error_t je;
    r->body = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->body) {
      cph_req_fail(r, 400, "bad_request", NULL, "invalid JSON at line %d, column %d (byte %d): %s",
                   je.line, je.column, je.position, je.text);
      return false;
    }
  }
  if (!json_is_object(r->body)) {
    cph_req_fail(r, 400, "bad_request", NULL, "the request body must be an object");
    return false;
  }
  char path[256] = "";
  return check_strings(r, r->body, path, 0, sizeof path, (size_t)p->server.max_string_bytes);
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

void cph_http_dispatch(struct evhttp_request *ev, void *arg) {
  cph_srv *s = arg;
  s->open_reqs++;
  cph_req *r = req_new(s, ev);
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
  if (split_path(path, &ps)) {
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
      if (!match_route(routes[i].pattern, &ps, r, false, NULL))
        continue;
      if (routes[i].method == method) {
        found = &routes[i];
        break;
      }
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
  if ((found->flags & CPH_ROUTE_BODY) && !(found->flags & CPH_ROUTE_LAZY_BODY) &&
      !cph_req_decode_body(r)) {
    cph_reply_failure(r);
    goto finish;
  }
  found->fn(r);
  if (r->async)
    return; /* it ends in cph_req_end */
  if (r->ev) {
    if (r->error.set)
      cph_reply_failure(r);
    else
      cph_reply_error(r, 500, "internal", NULL, "no answer was produced");
  }
finish:
  req_free(r);
}
