/* Ingest (DESIGN §4, §9).
 *
 *   POST /v1/events {"events": [{channel, sender, body, session?, mentions?, kind?, ts_ms?,
 *                                key?}, ...]}
 *     -> 200 {"results": [{"id", "status", "sessions", "reason"?, "field"?, "busy"?}]},
 *        answered only after the transaction holding the events committed.
 *     busy: [{"session", "reason": "session_busy"}] — sessions it was routed to that refused
 *     it (their turn was running, while_running :reject); status is "rejected" (reason
 *     session_busy) only when it reached no session, and its id is there: it was stored.
 *
 * Split of the checks: the server answers 400 for the structure (no "events" array, an
 * element that is not an object, a field of the wrong type — the field is named, e.g.
 * "events[3].channel") and 413 for the size (:max-events-per-request, :max-string-bytes);
 * whether an event makes sense (a channel or a session, a sender, ...) is the engine's call,
 * answered per event as status "rejected" with "reason" and "field", so one bad event never
 * sinks a batch.
 *
 * Decoding: a plain JSON body goes through fast_events (no jansson tree); anything it does
 * not take — msgpack, escapes it leaves alone, every error — through the generic decoder.
 * Both give the same events and the same answers (test_api_errors checks them side by side). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clusterflow.h"
#include "emit.h"
#include "evjson.h"
#include "http.h"
#include "offload.h"
#include "routes.h"
#include "server.h"

/* Writes {"results": [...]} with cph_emit: one result object per event, in request order,
 * members id, status, sessions, then reason and field when set. The same shape the jansson
 * path used to build; writing it straight into the buffer saves a node per value. */
static void results_write(const cph_req *r, const cph_event_result *results, size_t n,
                          cph_buf *body) {
  cph_emit w;
  cph_emit_init(&w, body, r->msgpack_out);
  cph_emit_object(&w, 1);
  cph_emit_key(&w, "results");
  cph_emit_array(&w, results ? n : 0);
  for (size_t i = 0; results && i < n; i++) {
    const cph_event_result *res = &results[i];
    cph_emit_object(&w, 3 + (res->reason != NULL) + (res->field != NULL) +
                            (res->busy.count > 0));
    cph_emit_key(&w, "id");
    if (res->id)
      cph_emit_u64(&w, res->id);
    else
      cph_emit_str(&w, NULL);
    cph_emit_key(&w, "status");
    cph_emit_str(&w, cph_ingest_status_name(res->status));
    cph_emit_key(&w, "sessions");
    cph_emit_array(&w, res->sessions.count);
    for (size_t j = 0; j < res->sessions.count; j++)
      cph_emit_str(&w, res->sessions.items[j]);
    cph_emit_end(&w);
    if (res->reason) {
      cph_emit_key(&w, "reason");
      cph_emit_str(&w, res->reason);
    }
    if (res->field) {
      cph_emit_key(&w, "field");
      cph_emit_str(&w, res->field);
    }
    if (res->busy.count) {
      cph_emit_key(&w, "busy");
      cph_emit_array(&w, res->busy.count);
      for (size_t j = 0; j < res->busy.count; j++) {
        cph_emit_object(&w, 2);
        cph_emit_key(&w, "session");
        cph_emit_str(&w, res->busy.items[j]);
        cph_emit_key(&w, "reason");
        cph_emit_str(&w, "session_busy");
        cph_emit_end(&w);
      }
      cph_emit_end(&w);
    }
    cph_emit_end(&w);
  }
  cph_emit_end(&w);
  cph_emit_end(&w);
}

static void results_reply(cph_req *r, const cph_event_result *results, size_t n) {
  cph_buf body = CPH_BUF_INIT;
  results_write(r, results, n, &body);
  cph_reply_emitted(r, 200, &body);
}

/* The results of a request of OFFLOOP_MIN_EVENTS or more are written on a request thread. */
static void results_work(cph_req *r, void *arg, cph_event_hasher *h) {
  (void)h;
  results_write(r, r->op.u.ingest.results, r->op.u.ingest.n_events, arg);
}

static void results_send(cph_req *r, void *arg) {
  cph_reply_emitted(r, 200, arg);
  cph_op_clear_results(&r->op);
  cph_req_end(r);
}

#define OFFLOOP_MIN_EVENTS 16

static void ingest_done(cph_req *r) {
  cph_op *op = &r->op;
  if (op->rc != CPH_OK) {
    cph_reply_rc(r, op->rc, op->err.msg, op->field);
    return;
  }
  cph_buf *body = op->u.ingest.n_events >= OFFLOOP_MIN_EVENTS && r->srv->offload
                      ? cph_req_alloc(r, sizeof *body)
                      : NULL;
  if (body) {
    static const cph_offload_fns fns = {results_work, results_send, NULL};
    *body = (cph_buf)CPH_BUF_INIT;
    r->answering = true;
    if (cph_offload_take(r->srv->offload, r, &fns, body))
      return;
    r->answering = false;
  }
  results_reply(r, op->u.ingest.results, op->u.ingest.n_events);
}

/* ---------------------------------------------------------------- the common case, fast
 *
 * Most ingest bodies are plain: {"events": [{"channel": "...", ...}, ...]} with known fields,
 * string values without \u escapes, a non-negative integer ts_ms. fast_events decodes such a
 * body straight into cph_event_in (strings copied into the request's arena), without a
 * jansson tree. It accepts only bodies the generic path (json_loadb + the cph_in_* checks)
 * would accept with the same values, and gives up — false, nothing answered — on anything
 * else: unknown or repeated keys, other value types, \u escapes, ill-formed UTF-8, a string
 * over :max-string-bytes, more events than :max-events-per-request, no events. The generic
 * path then decodes the body and answers exactly as before (errors name their field). */

/* Decodes body[0..len) the fast way into *events / *n (strings and arrays in r's arena),
 * under the limits given; false (nothing answered) to leave it to the generic path. Reads
 * nothing but its arguments: it runs on a request thread too (offload.h). */
static void *req_alloc(void *r, size_t n) { return cph_req_alloc(r, n); }

static bool fast_events(cph_req *r, const char *data, size_t len, size_t max_str,
                        int64_t max_events, cph_event_in **events, size_t *n_events) {
  cph_evjson f = {req_alloc, r, data, data + len, max_str};
  static const char EVENTS_KEY[] = "\"events\"";
  if (!cph_evjson_lit(&f, '{'))
    return false;
  cph_evjson_ws(&f);
  if ((size_t)(f.end - f.p) < sizeof EVENTS_KEY - 1 ||
      memcmp(f.p, EVENTS_KEY, sizeof EVENTS_KEY - 1) != 0)
    return false;
  f.p += sizeof EVENTS_KEY - 1;
  if (!cph_evjson_lit(&f, ':') || !cph_evjson_lit(&f, '[') || cph_evjson_lit(&f, ']'))
    return false;
  cph_event_in *in = NULL;
  size_t n = 0, cap = 0;
  do {
    if ((int64_t)n >= max_events)
      return false; /* 413, from the generic path */
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      cph_event_in *grown = cph_req_alloc(r, cap * sizeof *grown);
      if (!grown)
        return false;
      if (n)
        memcpy(grown, in, n * sizeof *in);
      in = grown;
    }
    if (!cph_evjson_event(&f, &in[n++]))
      return false;
  } while (cph_evjson_lit(&f, ','));
  if (!cph_evjson_lit(&f, ']') || !cph_evjson_lit(&f, '}'))
    return false;
  cph_evjson_ws(&f);
  if (f.p != f.end)
    return false;
  *events = in;
  *n_events = n;
  return true;
}

/* Decoded events, on to the engine (or, in cluster mode, the log). */
static void accept_events(cph_req *r, cph_event_in *in, size_t n) {
  if (r->srv->cflow) { /* cluster mode: through the log, on any node */
    cph_cflow_ingest(r, in, n);
    return;
  }
  if (!cph_cluster_gate_events(r, in, n))
    return;
  r->op.u.ingest.events = in;
  r->op.u.ingest.n_events = n;
  cph_req_submit(r, CPH_OP_INGEST, ingest_done);
}

/* ---------------------------------------------------------------- off the loop
 *
 * A body of OFFLOOP_MIN_BYTES or more (about 16 events) is decoded and its events prepared
 * (cph_event_prepare: the text hashes of content dedupe) on a request thread; so are the
 * events of a large request the generic path decoded, and the answer of one of
 * OFFLOOP_MIN_EVENTS or more is written there. Smaller requests — a turn cycle's one event —
 * would wait for the round trip longer than the work takes. */
#define OFFLOOP_MIN_BYTES 2048

typedef struct events_job {
  const char *data; /* the body (pulled up on the loop), or NULL: events already decoded */
  size_t len;
  size_t max_str; /* the limits and dedupe settings when the job was queued */
  int64_t max_events;
  int32_t shingle_words;
  int64_t min_length;
  bool prepare; /* false in cluster mode: the log carries the events, not their hashes */
  bool decoded; /* the fast decoder took data */
  cph_event_in *events;
  size_t n;
} events_job;

static void events_work(cph_req *r, void *arg, cph_event_hasher *h) {
  events_job *j = arg;
  if (j->data)
    j->decoded = fast_events(r, j->data, j->len, j->max_str, j->max_events, &j->events, &j->n);
  if (!j->decoded || !j->prepare || !h || r->error.set)
    return;
  cph_event_prep *preps = cph_req_alloc(r, j->n * sizeof *preps);
  for (size_t i = 0; preps && i < j->n; i++)
    if (cph_event_prepare(h, &j->events[i], j->shingle_words, j->min_length, &preps[i]) ==
        CPH_OK)
      j->events[i].prep = &preps[i]; /* else the engine computes it */
}

static void generic_events(cph_req *r);

static void events_continue(cph_req *r, void *arg) {
  events_job *j = arg;
  if (r->error.set)
    cph_reply_failure(r);
  else if (j->decoded)
    accept_events(r, j->events, j->n);
  else
    generic_events(r);
}

static void events_done(cph_req *r, void *arg) { cph_http_resume(r, events_continue, arg); }

/* Hands r's body (data set) or decoded events to a request thread; false when it did not
 * (no thread, queue full; out of memory recorded in r->error). */
static bool offload(cph_req *r, const char *data, size_t len, cph_event_in *in, size_t n) {
  if (!r->srv->offload)
    return false;
  events_job *j = cph_req_alloc(r, sizeof *j);
  if (!j)
    return false;
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  *j = (events_job){data,
                    len,
                    (size_t)p->server.max_string_bytes,
                    p->server.max_events_per_request,
                    (int32_t)p->dedupe.shingle_words,
                    p->dedupe.min_length,
                    !r->srv->cflow,
                    data == NULL,
                    in,
                    n};
  static const cph_offload_fns fns = {events_work, events_done, NULL};
  return cph_offload_take(r->srv->offload, r, &fns, j);
}

void cph_route_events_post(cph_req *r) {
  size_t len;
  const char *data = cph_req_raw_json(r, &len);
  if (data && len >= OFFLOOP_MIN_BYTES && offload(r, data, len, NULL, 0))
    return;
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  cph_event_in *fast = NULL;
  size_t n_fast = 0;
  if (!r->error.set && data &&
      fast_events(r, data, len, (size_t)p->server.max_string_bytes,
                  p->server.max_events_per_request, &fast, &n_fast) &&
      !r->error.set) {
    accept_events(r, fast, n_fast);
    return;
  }
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  generic_events(r);
}

/* The generic path: jansson decodes the body and every field is checked by name. */
static void generic_events(cph_req *r) {
  if (!cph_req_decode_body(r)) {
    cph_reply_failure(r);
    return;
  }
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  json_t *events = NULL;
  if (!cph_in_arr(r, r->body, "", "events", CPH_IN_REQUIRED, &events)) {
    cph_reply_failure(r);
    return;
  }
  size_t n = json_array_size(events);
  if ((int64_t)n > p->server.max_events_per_request) {
    cph_reply_error(r, 413, "too_large", "events",
                    "%zu events in one request; :max-events-per-request is %" PRId64, n,
                    p->server.max_events_per_request);
    return;
  }
  if (n == 0) {
    results_reply(r, NULL, 0);
    return;
  }
  cph_event_in *in = cph_req_alloc(r, n * sizeof *in);
  if (!in) {
    cph_reply_failure(r);
    return;
  }
  for (size_t i = 0; i < n && !r->error.set; i++) {
    char path[32];
    snprintf(path, sizeof path, "events[%zu]", i);
    json_t *ev = json_array_get(events, i);
    if (!json_is_object(ev)) {
      cph_req_fail(r, 400, "bad_request", path, "%s must be an object", path);
      break;
    }
    const char *channel = NULL, *sender = NULL, *body = NULL, *session = NULL, *kind = NULL,
               *key = NULL;
    cph_in_str(r, ev, path, "channel", 0, &channel);
    cph_in_str(r, ev, path, "sender", 0, &sender);
    cph_in_str(r, ev, path, "body", 0, &body);
    cph_in_str(r, ev, path, "session", 0, &session);
    cph_in_str(r, ev, path, "kind", 0, &kind);
    cph_in_str(r, ev, path, "key", 0, &key);
    cph_in_strv(r, ev, path, "mentions", 0, &in[i].mentions);
    cph_in_i64(r, ev, path, "ts_ms", 0, 0, INT64_MAX, &in[i].ts_ms);
    /* Inputs borrowed from the decoded body, which outlives the op; the engine only reads. */
    in[i].channel = (char *)channel;
    in[i].sender = (char *)sender;
    in[i].body = (char *)body;
    in[i].session = (char *)session;
    in[i].kind = (char *)kind;
    in[i].key = (char *)key;
  }
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  if (n >= OFFLOOP_MIN_EVENTS && !r->srv->cflow && offload(r, NULL, 0, in, n))
    return;
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  accept_events(r, in, n);
}
