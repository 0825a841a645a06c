/* Duplicate families and channel backpressure state (DESIGN §5, §9).
 *
 *   GET /v1/aggregates?top=N  -> 200 {"aggregates": [{"family", "dup_count", "sample",
 *                                 "channels", "first_ms", "last_ms"}]}, largest dup_count
 *                                 first; top defaults to 10, at most 256
 *   GET /v1/channels/{id}     -> 200 {"id", "step", "step_name", "trigger",
 *                                 "events_per_minute", "family_growth_per_minute",
 *                                 "triggers": [name], "since_ms",
 *                                 "calm_intervals", "subscribers", "members",
 *                                 "settings": {"max_events_per_minute",
 *                                 "max_family_growth_per_minute", "degrade_to_aggregate_only",
 *                                 "max_step", "interval_s", "recover_intervals",
 *                                 "dedupe_window_seconds"}}
 *                                | 404 when the engine knows nothing of the channel
 * "trigger" says what put the channel at its step (null at step 0): {"name", "figure",
 * "limit"} — a trigger's name with the figure that went over its limit when it fired, or
 * "policy" (:degrade-to-aggregate-only? / :max-step; figure and limit null). "triggers" lists
 * the triggers holding at the last check (at most a second ago). 
 * Both are reads of committed state: answered at once, no engine operation. */
#include <stdlib.h>

#include "routes.h"
#include "server.h"

#define TOP_DEFAULT 10
#define TOP_MAX 256

void cph_route_aggregates(cph_req *r) {
  uint64_t top;
  if (!cph_query_u64(r, "top", TOP_DEFAULT, TOP_MAX, &top)) {
    cph_reply_failure(r);
    return;
  }
  cph_aggregate_info *list = NULL;
  size_t n = 0;
  cph_err err = {0};
  int rc = cph_engine_aggregates(r->srv->engine, top ? (size_t)top : TOP_DEFAULT, &list, &n, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    const cph_aggregate_info *a = &list[i];
    json_t *o = json_object();
    json_object_set_new(o, "family", cph_json_u64(a->family));
    json_object_set_new(o, "dup_count", cph_json_u64(a->dup_count));
    json_object_set_new(o, "sample", cph_json_str(a->sample));
    json_object_set_new(o, "channels", cph_json_strv(&a->channels));
    json_object_set_new(o, "first_ms", json_integer(a->first_ms));
    json_object_set_new(o, "last_ms", json_integer(a->last_ms));
    json_array_append_new(arr, o);
    cph_aggregate_info_free(&list[i]);
  }
  free(list);
  json_t *body = json_object();
  json_object_set_new(body, "aggregates", arr);
  cph_reply_json(r, 200, body);
}

void cph_route_channel_get(cph_req *r) {
  cph_channel_info c;
  cph_err err = {0};
  int rc = cph_engine_channel(r->srv->engine, r->params[0], &c, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_EINVAL ? "id" : NULL);
    return;
  }
  json_t *triggers = json_array();
  for (unsigned bit = 1; bit <= CPH_BP_TRIGGER_MAINTENANCE; bit <<= 1)
    if (c.triggers & bit)
      json_array_append_new(triggers, json_string(cph_bp_trigger_name(bit)));
  json_t *settings = json_object();
  json_object_set_new(settings, "max_events_per_minute",
                      json_integer(c.settings.max_events_per_minute));
  json_object_set_new(settings, "max_family_growth_per_minute",
                      json_integer(c.settings.max_family_growth_per_minute));
  json_object_set_new(settings, "degrade_to_aggregate_only",
                      json_boolean(c.settings.degrade_to_aggregate_only));
  json_object_set_new(settings, "max_step", json_integer(c.settings.max_step));
  json_object_set_new(settings, "interval_s", json_integer(c.settings.interval_s));
  json_object_set_new(settings, "recover_intervals", json_integer(c.settings.recover_intervals));
  json_object_set_new(settings, "dedupe_window_seconds",
                      json_integer(c.settings.dedupe_window_seconds));
  json_t *trigger = json_null();
  if (c.trigger.name) {
    trigger = json_object();
    json_object_set_new(trigger, "name", json_string(c.trigger.name));
    json_object_set_new(trigger, "figure",
                        c.trigger.has_figure ? cph_json_u64(c.trigger.figure) : json_null());
    json_object_set_new(trigger, "limit",
                        c.trigger.has_figure ? cph_json_u64(c.trigger.limit) : json_null());
  }
  json_t *body = json_object();
  json_object_set_new(body, "id", cph_json_str(c.id));
  json_object_set_new(body, "step", json_integer(c.step));
  json_object_set_new(body, "step_name", cph_json_str(c.step_name));
  json_object_set_new(body, "trigger", trigger);
  json_object_set_new(body, "events_per_minute", cph_json_u64(c.events_per_minute));
  json_object_set_new(body, "family_growth_per_minute", cph_json_u64(c.family_growth_per_minute));
  json_object_set_new(body, "triggers", triggers);
  json_object_set_new(body, "since_ms", c.since_ms ? json_integer(c.since_ms) : json_null());
  json_object_set_new(body, "calm_intervals", json_integer(c.calm_intervals));
  json_object_set_new(body, "subscribers", json_integer(c.subscribers));
  json_object_set_new(body, "members", json_integer(c.members));
  json_object_set_new(body, "settings", settings);
  cph_channel_info_free(&c);
  cph_reply_json(r, 200, body);
}
