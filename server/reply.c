/* Answering a request: at once (cph_reply_*), or after an engine operation committed
 * (cph_req_submit). See reply.h. */
#include "reply.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "mpjson.h"
#include "server.h"

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
  case 421: return "Misdirected Request";
  case 429: return "Too Many Requests";
  case 500: return "Internal Server Error";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  case 507: return "Insufficient Storage";
  default: return "Unknown";
  }
}

/* evhttp has written the whole reply (never called when the write fails: the shutdown then
 * waits a bounded grace instead, see server.c). */
static void on_reply_written(struct evhttp_request *ev, void *arg) {
  (void)ev;
  cph_srv_reply_flushed(arg);
}

/* Writes an answer evhttp has queued on bev's output at once, rather than on the loop's next
 * round. evhttp only arms the write event, so an answer waited for the next epoll_wait and the
 * connection's interest went read -> read+write -> read, an epoll_ctl each way. Written here,
 * the write event is armed and disarmed within one round, which the changelist (main.c) folds
 * to nothing (bench/PROFILE.md: a :sync :none turn cycle's loop made 7.6 epoll_ctl and 1.35
 * epoll_wait calls before, 4.4 and 0.9 after). Once the output is empty, bufferevent_trigger runs
 * evhttp's write callback now rather than when the armed write event fires a round later: the
 * request is finished and freed and the connection reads the next one, or is freed when it
 * was to close. So nothing may touch the request or the connection after this call. A write
 * that fails or does not take it all leaves the rest to evhttp's own write event, as before.
 * bufferevent_sock keeps the output's start frozen between its own writes: hence the thaw. */
static void write_now(struct bufferevent *bev) {
  evutil_socket_t fd = bufferevent_getfd(bev);
  struct evbuffer *out = bufferevent_get_output(bev);
  if (fd < 0 || evbuffer_get_length(out) == 0)
    return;
  evbuffer_unfreeze(out, 1);
  int n = evbuffer_write(out, fd);
  evbuffer_freeze(out, 1);
  if (n > 0 && evbuffer_get_length(out) == 0)
    bufferevent_trigger(bev, EV_WRITE, 0);
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
  struct evhttp_connection *evcon = evhttp_request_get_connection(ev);
  if (evcon) {
    r->srv->unflushed++;
    evhttp_request_set_on_complete_cb(ev, on_reply_written, r->srv);
  }
  struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
  evhttp_send_reply(ev, status, status_phrase(status), buf);
  if (buf)
    evbuffer_free(buf);
  if (bev)
    write_now(bev); /* ev and evcon may be gone from here */
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
  cph_req_vfail(r, status, code, field, fmt, ap);
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
  case CPH_ESUPERSEDED: status = 409; code = "superseded"; break; /* while_running :restart */
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
  r->in_done = true;
  r->on_done(r);
  r->in_done = false;
  if (r->end_wanted) { /* taken over, and answered and ended by its new owner at once */
    cph_op_clear_results(&r->op);
    cph_req_end(r);
    return;
  }
  if (r->answering) /* a request thread writes the answer; its job answers and ends r */
    return;
  if (r->held) { /* taken over: answered and ended by its new owner */
    cph_op_clear_results(&r->op);
    return;
  }
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

/* ================================================================ JSON output helpers */

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
