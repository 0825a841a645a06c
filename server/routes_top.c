/* The live operations view, one answer for `cephalonctl top` and dashboards' drill-downs.
 *
 *   GET /v1/top?limit=N -> 200 {
 *     "ts_ms": wall-clock ms of the answer,
 *     "policy_generation": n,
 *     "lanes": [...], "concurrency": {"limit", "in_use"}       exactly as GET /v1/lanes,
 *     "sessions": [{"id", "class", "state", "credits", "staged", "pending", "folded",
 *                   "episode"}]                                the N busiest (staged + pending,
 *                                                              most first; N defaults to 10,
 *                                                              at most 100; idle ones omitted),
 *     "maintenance": {"outbox_pending", "outbox_oldest_age_seconds", "embed_queue",
 *                     "groups_committed_total", "memories_deleted_total",
 *                     "summaries_created_total"},
 *     "degraded_channels": [{"channel", "step", "step_name"}]  backpressure step > 0, deepest
 *                                                              first, at most 100 of them,
 *     "degraded_channels_total": how many channels are degraded in all
 *   }
 * A read of committed in-memory state, answered at once. Cost: O(sessions + tracked channels)
 * per request (core/top.c); it is an admin view, not something to poll many times a second. */
#include <stdlib.h>

#include "common/clock.h"
#include "routes.h"
#include "server.h"

/* Degraded channels listed at most: the view stays small when a flood degrades thousands. */
#define TOP_CHANNELS_MAX 100

static json_t *maintenance_json(cph_engine *e) {
  cph_maint_stats m;
  cph_engine_maint_stats(e, &m);
  json_t *o = json_object();
  json_object_set_new(o, "outbox_pending", cph_json_u64(m.outbox_pending));
  json_object_set_new(o, "outbox_oldest_age_seconds", json_real(m.outbox_oldest_age_seconds));
  json_object_set_new(o, "embed_queue", cph_json_u64(m.embed_queue));
  json_object_set_new(o, "groups_committed_total", cph_json_u64(m.groups_committed_total));
  json_object_set_new(o, "memories_deleted_total", cph_json_u64(m.memories_deleted_total));
  json_object_set_new(o, "summaries_created_total", cph_json_u64(m.summaries_created_total));
  return o;
}

void cph_route_top(cph_req *r) {
  uint64_t limit;
  if (!cph_query_u64(r, "limit", CPH_TOP_SESSIONS_DEFAULT, CPH_TOP_SESSIONS_MAX, &limit)) {
    cph_reply_failure(r);
    return;
  }
  cph_engine *e = r->srv->engine;
  cph_err err = {0};
  cph_session_info *sessions = NULL;
  size_t n_sessions = 0;
  int rc = cph_engine_top_sessions(e, limit ? (size_t)limit : CPH_TOP_SESSIONS_DEFAULT,
                                   &sessions, &n_sessions, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  cph_channel_step *steps = NULL;
  size_t n_steps = 0;
  if ((rc = cph_engine_channel_steps(e, 1, &steps, &n_steps, &err)) != CPH_OK) {
    for (size_t i = 0; i < n_sessions; i++)
      cph_session_info_free(&sessions[i]);
    free(sessions);
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }

  json_t *sess = json_array();
  for (size_t i = 0; i < n_sessions; i++) {
    const cph_session_info *s = &sessions[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_str(s->id));
    json_object_set_new(o, "class", json_string(cph_lane_name(s->lane)));
    json_object_set_new(o, "state", json_string(cph_session_state_name(s->state)));
    json_object_set_new(o, "credits", json_real(s->credits));
    json_object_set_new(o, "staged", json_integer(s->staged));
    json_object_set_new(o, "pending", json_integer(s->pending));
    json_object_set_new(o, "folded", cph_json_u64(s->folded));
    json_object_set_new(o, "episode", cph_json_u64(s->episode));
    json_array_append_new(sess, o);
    cph_session_info_free(&sessions[i]);
  }
  free(sessions);

  json_t *degraded = json_array();
  for (size_t i = 0; i < n_steps && i < TOP_CHANNELS_MAX; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "channel", cph_json_str(steps[i].channel));
    json_object_set_new(o, "step", json_integer(steps[i].step));
    json_object_set_new(o, "step_name", cph_json_str(steps[i].step_name));
    json_array_append_new(degraded, o);
  }
  cph_channel_steps_free(steps, n_steps);

  json_t *concurrency = NULL;
  json_t *lanes = cph_lanes_json(e, &concurrency);
  json_t *body = json_object();
  json_object_set_new(body, "ts_ms", json_integer(cph_wall_ms()));
  json_object_set_new(body, "policy_generation", cph_json_u64(cph_engine_policy_generation(e)));
  json_object_set_new(body, "lanes", lanes);
  json_object_set_new(body, "concurrency", concurrency);
  json_object_set_new(body, "sessions", sess);
  json_object_set_new(body, "maintenance", maintenance_json(e));
  json_object_set_new(body, "degraded_channels", degraded);
  json_object_set_new(body, "degraded_channels_total", cph_json_u64(n_steps));
  cph_reply_json(r, 200, body);
}
