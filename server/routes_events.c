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

#include "routes.h"
#include "server.h"

static void ingest_done(cph_req *r) {
  cph_op *op = &r->op;
  if (op->rc != CPH_OK) {
    cph_reply_rc(r, op->rc, op->err.msg, op->field);
    return;
  }
  json_t *results = json_array();
  for (size_t i = 0; op->u.ingest.results && i < op->u.ingest.n_events; i++) {
    const cph_event_result *res = &op->u.ingest.results[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", res->id ? cph_json_u64(res->id) : json_null());
    json_object_set_new(o, "status", json_string(cph_ingest_status_name(res->status)));
    json_object_set_new(o, "sessions", cph_json_strv(&res->sessions));
    if (res->reason)
      json_object_set_new(o, "reason", json_string(res->reason));
    if (res->field)
      json_object_set_new(o, "field", json_string(res->field));
    json_array_append_new(results, o);
  }
  json_t *body = json_object();
  json_object_set_new(body, "results", results);
  cph_reply_json(r, 200, body);
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
    json_t *body = json_object();
    json_object_set_new(body, "results", json_array());
    cph_reply_json(r, 200, body);
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
