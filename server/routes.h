/* Route handlers (DESIGN §9). The table that maps method + path to them is in http.c; each
 * handler follows the request lifetime described in request.h. Shapes of the JSON answers are
 * in the files that build them; the field names DESIGN §9 fixes are kept exactly. */
#ifndef CEPHALON_SERVER_ROUTES_H
#define CEPHALON_SERVER_ROUTES_H

#include "reply.h"
#include "request.h"

/* routes_sessions.c */
void cph_route_session_create(cph_req *r);
void cph_route_session_list(cph_req *r);
void cph_route_session_get(cph_req *r);
void cph_route_session_update(cph_req *r);
void cph_route_session_delete(cph_req *r);
void cph_route_session_why(cph_req *r);

/* routes_events.c */
void cph_route_events_post(cph_req *r);

/* routes_turns.c */
void cph_route_turn_lease(cph_req *r);
void cph_route_turn_heartbeat(cph_req *r);
void cph_route_turn_complete(cph_req *r);
void cph_route_turn_fail(cph_req *r);
void cph_route_turn_take(cph_req *r);
void cph_route_turn_requeue(cph_req *r);
void cph_route_turns_list(cph_req *r);
void cph_route_turn_get(cph_req *r);
/* Withdraws a waiting lease long-poll (client gone, fallback deadline, shutdown): when the
 * engine gives the op back the request is answered 204 and ends here; when the op was
 * already served its `done` answers instead. */
void cph_lease_abandon(cph_req *r);

/* routes_replies.c */
void cph_route_replies(cph_req *r);
/* Answers a waiting replies long-poll now with whatever is there, and ends it. */
void cph_replies_answer(cph_req *r);
/* Wakes every replies long-poll whose `after` is below the newest reply (capped per call;
 * reschedules itself for the rest). main.c calls it from s->ev_replies. */
void cph_replies_wake(cph_srv *s);

/* routes_admin.c */
void cph_route_healthz(cph_req *r);
void cph_route_readyz(cph_req *r);
void cph_route_lanes(cph_req *r);
/* The lanes array and the concurrency object of GET /v1/lanes (DESIGN §9), shared with
 * /v1/top so the two never drift apart. */
json_t *cph_lanes_json(cph_engine *e, json_t **concurrency);
void cph_route_policy_get(cph_req *r);
void cph_route_policy_reload(cph_req *r);
void cph_route_backup_start(cph_req *r);  /* POST /v1/admin/backup */
void cph_route_backup_status(cph_req *r); /* GET /v1/admin/backup */

/* routes_metrics.c: GET /metrics, the Prometheus exposition */
void cph_route_metrics(cph_req *r);

/* routes_context.c */
void cph_route_context_insert(cph_req *r);
void cph_route_context_get(cph_req *r);
void cph_route_context_delete(cph_req *r);
void cph_route_context_step(cph_req *r);
void cph_route_seal(cph_req *r);
void cph_route_seals(cph_req *r);

/* routes_explorer.c: kept turn contexts and the context diff (the context explorer) */
void cph_route_kept_turns(cph_req *r);
void cph_route_turn_context(cph_req *r);
void cph_route_context_diff(cph_req *r);

/* routes_ui.c: the web console's files, compiled in (GET /ui, /ui/{file}) */
void cph_route_ui(cph_req *r);

/* routes_maint.c */
void cph_route_job_post(cph_req *r);
void cph_route_jobs_list(cph_req *r);
void cph_route_gc_groups(cph_req *r);
void cph_route_gc_group(cph_req *r);
void cph_route_outbox(cph_req *r);
void cph_route_memories_search(cph_req *r);
void cph_route_event_get(cph_req *r);
/* A job's args object as the engine's "key=value" text (request-owned), NULL when absent or
 * after recording a 400. */
const char *cph_job_args_text(cph_req *r, json_t *args, const char *path);

/* routes_openapi.c: GET /v1/openapi.json, the API's OpenAPI document (docs/openapi.json) */
void cph_route_openapi(cph_req *r);

/* routes_top.c: GET /v1/top, the live operations view */
void cph_route_top(cph_req *r);

/* routes_cluster.c: GET /v1/cluster, and the gates of cluster mode (DESIGN §14). Each gate
 * answers true without cluster mode or when this node serves the shard; otherwise it has
 * answered the request (421 misdirected with the owner, or 503 not_serving) and is false. */
void cph_route_cluster(cph_req *r);
bool cph_cluster_gate_shard(cph_req *r, uint32_t shard, const char *what);
bool cph_cluster_gate_id(cph_req *r, const char *kind, const char *id); /* session, channel */
bool cph_cluster_gate_turn(cph_req *r, const char *turn_id); /* a turn leased here */
bool cph_cluster_gate_events(cph_req *r, const cph_event_in *events, size_t n);

/* routes_channels.c */
void cph_route_aggregates(cph_req *r);
void cph_route_channel_get(cph_req *r);

#endif
