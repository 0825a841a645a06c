/* Ingest (DESIGN §4, §9).
 *
 *   POST /v1/events {"events": [{channel, sender, body, session?, mentions?, kind?, ts_ms?,
 *                                key?}, ...]}
 *     -> 200 {"results": [{"id", "status", "sessions", "reason"?, "field"?}]}, answered only
 *        after the transaction holding the events committed.
 *
 * Split of the checks: the server answers 400 for the structure (no "events" array, an
 * element that is not an object, a field of the wrong type — the field is named, e.g.
 * "events[3].channel") and 413 for the size (:max-events-per-request, :max-string-bytes);
 * whether an event makes sense (a channel or a session, a sender, ...) is the engine's call,
 * answered per event as status "rejected" with "reason" and "field", so one bad event never
 * sinks a batch. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"
#include "routes.h"
#include "server.h"

/* Writes {"results": [...]} with cph_emit: one result object per event, in request order,
 * members id, status, sessions, then reason and field when set. The same shape the jansson
 * path used to build; writing it straight into the buffer saves a node per value. */
static void results_reply(cph_req *r, const cph_event_result *results, size_t n) {
  cph_buf body = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &body, r->msgpack_out);
  cph_emit_object(&w, 1);
  cph_emit_key(&w, "results");
  cph_emit_array(&w, results ? n : 0);
  for (size_t i = 0; results && i < n; i++) {
    const cph_event_result *res = &results[i];
    cph_emit_object(&w, 3 + (res->reason != NULL) + (res->field != NULL));
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
    cph_emit_end(&w);
  }
  cph_emit_end(&w);
  cph_emit_end(&w);
  cph_reply_emitted(r, 200, &body);
}

static void ingest_done(cph_req *r) {
  cph_op *op = &r->op;
  if (op->rc != CPH_OK) {
    cph_reply_rc(r, op->rc, op->err.msg, op->field);
    return;
  }
  results_reply(r, op->u.ingest.results, op->u.ingest.n_events);
}

void cph_route_events_post(cph_req *r) {
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
  r->op.u.ingest.events = in;
  r->op.u.ingest.n_events = n;
  cph_req_submit(r, CPH_OP_INGEST, ingest_done);
}
