/* Sessions (DESIGN §2, §9).
 *
 *   POST   /v1/sessions        session fields (id, class required) -> 200 session
 *   GET    /v1/sessions?class=&state=&after=&limit=&prefix=        -> 200 {"sessions", "next"}
 *          (prefix: only ids that begin with it, found by a seek: the console's search)
 *   GET    /v1/sessions/{id}                                       -> 200 session
 *   PUT    /v1/sessions/{id}   fields to change                    -> 200 session
 *   DELETE /v1/sessions/{id}                                       -> 200 {"id", "deleted"}
 *   GET    /v1/sessions/{id}/why                                   -> 200 why
 *
 * session: {"id", "class", "state", "credits", "episode", "subscribe", "member",
 *           "autonomy_interval_s", "report_interval_s", "context_window_tokens", "system",
 *           "tools", "paused", "pending", "staged", "folded", "while_running",
 *           "while_running_from_class", "tenant"}
 * Settable: class, subscribe, member, autonomy_interval_s, report_interval_s (null or 0 =
 * none), context_window_tokens (null or 0 = the policy default), system (null = none), tools,
 * "paused": true|false, and while_running: "enqueue" | "merge" | "interrupt" | "restart" |
 * "reject", or null = its class's default (:sessions :while-running; DESIGN §4), and tenant
 * (null or "" = none: the default tenant, DESIGN §3.9). id, state, credits, episode, the
 * counters and while_running_from_class are read-only and ignored in a body, so a client may
 * PUT back what it got (which then pins the mode it showed). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clusterflow.h"
#include "routes.h"
#include "server.h"

static json_t *interval_json(uint32_t v) { return v ? json_integer(v) : json_null(); }

static json_t *session_json(const cph_session_info *s) {
  json_t *o = json_object();
  json_object_set_new(o, "id", cph_json_str(s->id));
  json_object_set_new(o, "class", json_string(cph_lane_name(s->lane)));
  json_object_set_new(o, "state", json_string(cph_session_state_name(s->state)));
  json_object_set_new(o, "credits", json_real(s->credits));
  json_object_set_new(o, "episode", cph_json_u64(s->episode));
  json_object_set_new(o, "subscribe", cph_json_strv(&s->subscribe));
  json_object_set_new(o, "member", cph_json_strv(&s->member));
  json_object_set_new(o, "autonomy_interval_s", interval_json(s->autonomy_interval_s));
  json_object_set_new(o, "report_interval_s", interval_json(s->report_interval_s));
  json_object_set_new(o, "context_window_tokens", json_integer(s->context_window_tokens));
  json_object_set_new(o, "system", cph_json_str(s->system));
  json_object_set_new(o, "tools", cph_json_strv(&s->tools));
  json_object_set_new(o, "paused", json_boolean(s->state == CPH_STATE_PAUSED));
  json_object_set_new(o, "pending", json_integer(s->pending));
  json_object_set_new(o, "staged", json_integer(s->staged));
  json_object_set_new(o, "folded", cph_json_u64(s->folded));
  json_object_set_new(o, "while_running",
                      json_string(cph_policy_while_running_name(s->while_running)));
  json_object_set_new(o, "while_running_from_class", json_boolean(s->while_running_class));
  json_object_set_new(o, "tenant", cph_json_str(s->tenant));
  return o;
}

static bool present(json_t *body, const char *key) { return json_object_get(body, key) != NULL; }

/* Reads the settable fields present in the body into in, setting CPH_SET_* bits. */
static void session_fields(cph_req *r, cph_session_info *in, unsigned *set) {
  json_t *b = r->body;
  const char *cls = NULL;
  if (cph_in_str(r, b, "", "class", 0, &cls) && cls) {
    if (cph_lane_parse(cls, &in->lane) != CPH_OK)
      cph_req_fail(r, 400, "bad_request", "class",
                   "class must be \"interactive\", \"operational\" or \"maintenance\"");
    *set |= CPH_SET_CLASS;
  }
  if (present(b, "subscribe") && cph_in_strv(r, b, "", "subscribe", 0, &in->subscribe))
    *set |= CPH_SET_SUBSCRIBE;
  if (present(b, "member") && cph_in_strv(r, b, "", "member", 0, &in->member))
    *set |= CPH_SET_MEMBER;
  if (present(b, "tools") && cph_in_strv(r, b, "", "tools", 0, &in->tools))
    *set |= CPH_SET_TOOLS;
  uint64_t v = 0;
  if (present(b, "autonomy_interval_s") &&
      cph_in_u64(r, b, "", "autonomy_interval_s", 0, UINT32_MAX, &v)) {
    in->autonomy_interval_s = (uint32_t)v;
    *set |= CPH_SET_AUTONOMY;
  }
  v = 0;
  if (present(b, "report_interval_s") &&
      cph_in_u64(r, b, "", "report_interval_s", 0, UINT32_MAX, &v)) {
    in->report_interval_s = (uint32_t)v;
    *set |= CPH_SET_REPORT;
  }
  v = 0;
  if (present(b, "context_window_tokens") &&
      cph_in_u64(r, b, "", "context_window_tokens", 0, UINT32_MAX, &v)) {
    in->context_window_tokens = (uint32_t)v;
    *set |= CPH_SET_WINDOW;
  }
  const char *system = NULL;
  if (present(b, "system") && cph_in_str(r, b, "", "system", 0, &system)) {
    in->system = (char *)system; /* an input: the engine reads it only */
    *set |= CPH_SET_SYSTEM;
  }
  json_t *wr = json_object_get(b, "while_running");
  if (wr && json_is_null(wr)) {
    in->while_running_class = true; /* back to its class's default */
    *set |= CPH_SET_WHILE_RUNNING;
  } else if (wr) {
    const char *mode = NULL;
    if (cph_in_str(r, b, "", "while_running", 0, &mode) && mode) {
      if (cph_policy_while_running_parse(mode, &in->while_running) != CPH_OK)
        cph_req_fail(r, 400, "bad_request", "while_running",
                     "while_running must be \"enqueue\", \"merge\", \"interrupt\", "
                     "\"restart\", \"reject\" or null (the class's default), got \"%.64s\"",
                     mode);
      *set |= CPH_SET_WHILE_RUNNING;
    }
  }
  const char *tenant = NULL;
  if (present(b, "tenant") && cph_in_str(r, b, "", "tenant", 0, &tenant)) {
    if (tenant && tenant[0] && !cph_tenant_valid(tenant))
      cph_req_fail(r, 400, "bad_request", "tenant",
                   "tenant must be 1 to 128 characters of A-Z a-z 0-9 . _ : @ -");
    in->tenant = (char *)tenant; /* an input: the engine reads it only */
    *set |= CPH_SET_TENANT;
  }
  bool paused = false;
  if (present(b, "paused") && cph_in_bool(r, b, "", "paused", 0, &paused)) {
    in->state = paused ? CPH_STATE_PAUSED : CPH_STATE_IDLE;
    *set |= CPH_SET_PAUSED;
  }
}

static void session_done(cph_req *r) {
  if (r->op.rc != CPH_OK) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  if (r->srv->cflow) /* cluster mode: answered once the log holds its record */
    cph_cflow_session_written(r->srv->cflow, r, r->op.u.session.out.id, &r->op.u.session.out,
                              session_json(&r->op.u.session.out));
  else
    cph_reply_json(r, 200, session_json(&r->op.u.session.out));
}

void cph_route_session_create(cph_req *r) {
  cph_session_info *in = &r->op.u.session.in;
  const char *id = NULL, *cls = NULL;
  cph_in_str(r, r->body, "", "id", CPH_IN_REQUIRED, &id);
  cph_in_str(r, r->body, "", "class", CPH_IN_REQUIRED, &cls);
  in->id = (char *)id;
  session_fields(r, in, &r->op.u.session.set);
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  if (!cph_cluster_gate_id(r, "session", id))
    return;
  cph_req_submit(r, CPH_OP_SESSION_CREATE, session_done);
}

void cph_route_session_update(cph_req *r) {
  cph_session_info *in = &r->op.u.session.in;
  const char *id = NULL;
  if (cph_in_str(r, r->body, "", "id", 0, &id) && id && strcmp(id, r->params[0]) != 0)
    cph_req_fail(r, 400, "bad_request", "id", "id in the body (\"%s\") is not the session in "
                 "the path; sessions cannot be renamed", id);
  in->id = r->params[0];
  session_fields(r, in, &r->op.u.session.set);
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  cph_req_submit(r, CPH_OP_SESSION_UPDATE, session_done);
}

static void delete_done(cph_req *r) {
  if (r->op.rc != CPH_OK) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *body = json_object();
  json_object_set_new(body, "id", json_string(r->params[0]));
  json_object_set_new(body, "deleted", json_true());
  if (r->srv->cflow) { /* cluster mode: answered once the log took the record's deletion */
    cph_cflow_deleted(r->srv->cflow, r->params[0], &r->op.u.session.consumed);
    cph_cflow_session_written(r->srv->cflow, r, r->params[0], NULL, body);
  } else {
    cph_reply_json(r, 200, body);
  }
}

void cph_route_session_delete(cph_req *r) {
  r->op.u.session.in.id = r->params[0];
  cph_req_submit(r, CPH_OP_SESSION_DELETE, delete_done);
}

void cph_route_session_get(cph_req *r) {
  cph_session_info s = {0};
  cph_err err = {0};
  int rc = cph_engine_get_session(r->srv->engine, r->params[0], &s, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND || rc == CPH_EINVAL ? "id" : NULL);
    return;
  }
  cph_reply_json(r, 200, session_json(&s));
  cph_session_info_free(&s);
}

static const cph_session_state_t all_states[] = {CPH_STATE_IDLE, CPH_STATE_QUEUED,
                                                 CPH_STATE_RUNNING, CPH_STATE_PAUSED};

void cph_route_session_list(cph_req *r) {
  cph_session_filter f = {0};
  const char *cls = cph_req_query(r, "class");
  const char *state = cph_req_query(r, "state");
  if (cls && *cls) {
    if (cph_lane_parse(cls, &f.lane) != CPH_OK) {
      cph_reply_error(r, 400, "bad_request", "class",
                      "class must be \"interactive\", \"operational\" or \"maintenance\"");
      return;
    }
    f.by_lane = true;
  }
  if (state && *state) {
    for (size_t i = 0; i < sizeof all_states / sizeof all_states[0]; i++)
      if (strcmp(state, cph_session_state_name(all_states[i])) == 0) {
        f.state = all_states[i];
        f.by_state = true;
      }
    if (!f.by_state) {
      cph_reply_error(r, 400, "bad_request", "state",
                      "state must be \"idle\", \"queued\", \"running\" or \"paused\"");
      return;
    }
  }
  const char *after = cph_req_query(r, "after");
  f.after = after && *after ? after : NULL;
  f.prefix = cph_req_query(r, "prefix");
  if (f.prefix && strlen(f.prefix) > 128) {
    cph_reply_error(r, 400, "bad_request", "prefix", "prefix: a session id is at most 128 bytes");
    return;
  }
  uint64_t limit;
  if (!cph_query_u64(r, "limit", 100, 1000, &limit)) {
    cph_reply_failure(r);
    return;
  }
  f.limit = limit ? (size_t)limit : 100;

  cph_session_info *list = NULL;
  size_t n = 0;
  cph_err err = {0};
  int rc = cph_engine_list_sessions(r->srv->engine, &f, &list, &n, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, session_json(&list[i]));
  json_t *body = json_object();
  json_object_set_new(body, "sessions", arr);
  /* A full page may have more after it: "next" is the `after` for the next page. */
  json_object_set_new(body, "next", n == f.limit && n ? json_string(list[n - 1].id) : json_null());
  for (size_t i = 0; i < n; i++)
    cph_session_info_free(&list[i]);
  free(list);
  cph_reply_json(r, 200, body);
}

void cph_route_session_why(cph_req *r) {
  cph_why_info w = {0};
  cph_err err = {0};
  int rc = cph_engine_why(r->srv->engine, r->params[0], &w, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND || rc == CPH_EINVAL ? "id" : NULL);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "session", json_string(r->params[0]));
  json_object_set_new(o, "reason", cph_json_str(w.reason));
  json_object_set_new(o, "lane", json_string(cph_lane_name(w.lane)));
  json_object_set_new(o, "credits", json_real(w.credits));
  json_object_set_new(o, "waiting_s", json_real(w.waiting_s));
  json_object_set_new(o, "until_ms", w.reason && strcmp(w.reason, "lane_out_of_budget") == 0
                                         ? json_integer(w.until_ms)
                                         : json_null());
  json_object_set_new(o, "rank", w.reason && strcmp(w.reason, "runnable") == 0
                                     ? cph_json_u64(w.rank)
                                     : json_null());
  json_object_set_new(o, "lane_runnable", cph_json_u64(w.lane_runnable));
  json_object_set_new(o, "ahead_in_higher_lanes", cph_json_u64(w.ahead_in_higher_lanes));
  json_object_set_new(o, "staged", json_integer(w.staged));
  json_object_set_new(o, "pending", json_integer(w.pending));
  json_object_set_new(o, "next_report_in_s",
                      w.next_report_in_s >= 0 ? json_integer(w.next_report_in_s) : json_null());
  /* DESIGN §3.9, §3.11: the tenant and the forecast (null unless the session is queued). */
  json_object_set_new(o, "tenant", w.tenant[0] ? json_string(w.tenant) : json_null());
  bool queued = w.position > 0;
  json_object_set_new(o, "position", queued ? cph_json_u64(w.position) : json_null());
  json_object_set_new(o, "tenant_position",
                      queued ? cph_json_u64(w.tenant_position) : json_null());
  json_object_set_new(o, "tenant_runnable",
                      queued ? cph_json_u64(w.tenant_runnable) : json_null());
  json_object_set_new(o, "turns_ahead", queued ? cph_json_u64(w.turns_ahead) : json_null());
  json_object_set_new(o, "est_start_ms",
                      queued && w.est_start_ms >= 0 ? json_integer(w.est_start_ms) : json_null());
  json_object_set_new(o, "est_start_in_s",
                      queued && w.est_start_in_s >= 0 ? json_real(w.est_start_in_s) : json_null());
  cph_reply_json(r, 200, o);
}
