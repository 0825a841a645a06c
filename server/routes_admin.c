/* Health, lanes and policy administration (DESIGN §8, §9).
 *
 *   GET  /healthz                  -> 200 {"status": "ok"}                       (no auth)
 *   GET  /readyz                   -> 200 {"status": "ready", "policy_generation"} (no auth);
 *                                     503 {"status": "stopping", ...} while shutting down
 *   GET  /v1/lanes                 -> 200 {"lanes": [...], "concurrency": {"limit", "in_use"}};
 *                                     a lane: name, turns_left, tool_calls_left, tokens_left,
 *                                     runnable, running, budget {turns, tool_calls, tokens},
 *                                     seats {reserved, in_use, lent, borrowed},
 *                                     tenants_runnable, tenant_run, recent {completions, mean_turn_s,
 *                                     completion_spacing_s}
 *   GET  /v1/admin/policy          -> 200 {"edn", "generation", "source"}
 *   POST /v1/admin/policy/reload   -> 200 {"generation", "note"} | 400 with file:line:col
 *   POST /v1/admin/backup {"dir"}  -> 202 the backup's status (it runs on its own thread) |
 *                                     400 a dir that is not absolute | 409 a dir not empty, or
 *                                     a backup running
 *   GET  /v1/admin/backup          -> 200 {"state": "none"|"running"|"done"|"failed", "dir",
 *                                     "bytes", "started_ms", "finished_ms", "error"}
 */
#include <stdlib.h>

#include "backup.h"
#include "common/buf.h"
#include "common/log.h"
#include "routes.h"
#include "server.h"

void cph_route_healthz(cph_req *r) {
  json_t *body = json_object();
  json_object_set_new(body, "status", json_string("ok"));
  cph_reply_json(r, 200, body);
}

void cph_route_readyz(cph_req *r) {
  json_t *body = json_object();
  json_object_set_new(body, "status", json_string(r->srv->stopping ? "stopping" : "ready"));
  json_object_set_new(body, "policy_generation",
                      cph_json_u64(cph_engine_policy_generation(r->srv->engine)));
  cph_reply_json(r, r->srv->stopping ? 503 : 200, body);
}

json_t *cph_lanes_json(cph_engine *e, json_t **concurrency) {
  cph_lane_info lanes[CPH_LANE_COUNT];
  uint32_t limit = 0, in_use = 0;
  cph_engine_lanes(e, lanes, &limit, &in_use);
  json_t *arr = json_array();
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    const cph_lane_info *l = &lanes[i];
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(cph_lane_name(l->lane)));
    json_object_set_new(o, "turns_left", json_real(l->turns_left));
    json_object_set_new(o, "tool_calls_left", json_real(l->tool_calls_left));
    json_object_set_new(o, "runnable", cph_json_u64(l->runnable));
    json_object_set_new(o, "running", cph_json_u64(l->running));
    json_t *budget = json_object();
    json_object_set_new(budget, "turns", json_integer(l->budget_turns));
    json_object_set_new(budget, "tool_calls", json_integer(l->budget_tool_calls));
    json_object_set_new(budget, "tokens",
                        l->budget_tokens ? json_integer(l->budget_tokens) : json_null());
    json_object_set_new(o, "budget", budget);
    /* DESIGN §3.8, §3.10, §3.11 */
    json_object_set_new(o, "tokens_left", l->budget_tokens ? json_real(l->tokens_left)
                                                           : json_null());
    json_t *seats = json_object();
    json_object_set_new(seats, "reserved", json_integer(l->seats));
    json_object_set_new(seats, "in_use", cph_json_u64(l->running));
    json_object_set_new(seats, "lent", json_integer(l->seats_lent));
    json_object_set_new(seats, "borrowed", json_integer(l->seats_borrowed));
    json_object_set_new(o, "seats", seats);
    json_object_set_new(o, "tenants_runnable", cph_json_u64(l->tenants_runnable));
    json_object_set_new(o, "tenant_run", json_integer(l->tenant_run));
    json_t *recent = json_object();
    json_object_set_new(recent, "completions", json_integer(l->recent_completions));
    json_object_set_new(recent, "mean_turn_s", json_real(l->mean_turn_s));
    json_object_set_new(recent, "completion_spacing_s", json_real(l->completion_spacing_s));
    json_object_set_new(o, "recent", recent);
    json_array_append_new(arr, o);
  }
  *concurrency = json_object();
  json_object_set_new(*concurrency, "limit", json_integer(limit));
  json_object_set_new(*concurrency, "in_use", json_integer(in_use));
  return arr;
}

void cph_route_lanes(cph_req *r) {
  json_t *conc;
  json_t *arr = cph_lanes_json(r->srv->engine, &conc);
  json_t *body = json_object();
  json_object_set_new(body, "lanes", arr);
  json_object_set_new(body, "concurrency", conc);
  cph_reply_json(r, 200, body);
}

void cph_route_policy_get(cph_req *r) {
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  cph_buf buf = CPH_BUF_INIT;
  cph_policy_write_edn(p, &buf);
  if (cph_buf_error(&buf) != CPH_OK) {
    cph_buf_free(&buf);
    cph_reply_error(r, 500, "internal", NULL, "out of memory writing the policy");
    return;
  }
  json_t *body = json_object();
  json_object_set_new(body, "edn", json_string(buf.data ? buf.data : ""));
  json_object_set_new(body, "generation",
                      cph_json_u64(cph_engine_policy_generation(r->srv->engine)));
  json_object_set_new(body, "source", cph_json_str(p->source));
  cph_buf_free(&buf);
  cph_reply_json(r, 200, body);
}

void cph_route_policy_reload(cph_req *r) {
  cph_err err = {0};
  int rc = cph_srv_reload(r->srv, &err);
  if (rc == CPH_EPOLICY || rc == CPH_EPARSE || rc == CPH_EINVAL) {
    /* The file is wrong: the client's problem to fix; the old policy stays in force. */
    cph_reply_error(r, 400, "bad_request", NULL, "%s", err.msg);
    return;
  }
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *body = json_object();
  json_object_set_new(body, "generation",
                      cph_json_u64(cph_engine_policy_generation(r->srv->engine)));
  json_object_set_new(body, "note", err.msg[0] ? json_string(err.msg) : json_null());
  cph_reply_json(r, 200, body);
}

static json_t *backup_json(cph_backup *b) {
  cph_backup_status st;
  cph_backup_status_get(b, &st);
  json_t *o = json_object();
  json_object_set_new(o, "state", json_string(st.state));
  json_object_set_new(o, "dir", st.dir[0] ? json_string(st.dir) : json_null());
  json_object_set_new(o, "bytes", cph_json_u64(st.bytes));
  json_object_set_new(o, "started_ms", st.started_ms ? json_integer(st.started_ms) : json_null());
  json_object_set_new(o, "finished_ms",
                      st.finished_ms ? json_integer(st.finished_ms) : json_null());
  json_object_set_new(o, "error", st.error[0] ? json_string(st.error) : json_null());
  return o;
}

void cph_route_backup_start(cph_req *r) {
  const char *dir = NULL;
  if (!cph_in_str(r, r->body, "", "dir", CPH_IN_REQUIRED, &dir)) {
    cph_reply_failure(r);
    return;
  }
  cph_err err = {0};
  int rc = cph_backup_start(r->srv->backup, r->srv->engine, dir, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_EINVAL || rc == CPH_EEXISTS ? "dir" : NULL);
    return;
  }
  cph_info("backup to %s started", dir);
  cph_reply_json(r, 202, backup_json(r->srv->backup));
}

void cph_route_backup_status(cph_req *r) { cph_reply_json(r, 200, backup_json(r->srv->backup)); }
