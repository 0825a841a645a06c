/* Cluster mode, first slice (DESIGN §14; server/cluster.h): GET /v1/cluster, and the gates
 * that answer 421 for a session, channel or turn whose shard another node owns.
 *
 * The 421 answer: {"error": {"code": "misdirected", "message", "field": null, "owner": {"node", "url",
 * "shard"}}} — the client repeats the request at owner.url. When no live owner is known
 * (the shard is being claimed, or this node passed its lease deadline and its view is
 * stale) the answer is 503 {"error": {"code": "not_serving", ...}}: retry shortly. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "clusterflow.h"
#include "routes.h"
#include "server.h"

void cph_route_cluster(cph_req *r) {
  if (!r->srv->cluster) {
    cph_reply_error(r, 404, "not_found", NULL,
                    "cluster mode is off: the policy has no :cluster section");
    return;
  }
  json_t *body = cph_cluster_json(r->srv->cluster);
  if (body && r->srv->cflow)
    json_object_set_new(body, "log", cph_cflow_json(r->srv->cflow));
  if (!body) {
    cph_reply_error(r, 500, "internal", NULL, "out of memory");
    return;
  }
  cph_reply_json(r, 200, body);
}

bool cph_cluster_gate_shard(cph_req *r, uint32_t shard, const char *what) {
  cph_cluster *c = r->srv->cluster;
  if (!c)
    return true;
  char node[256], url[1024];
  cph_cluster_verdict v = cph_cluster_route(c, shard, node, sizeof node, url, sizeof url);
  if (v == CPH_CLUSTER_SERVED)
    return true;
  if (v == CPH_CLUSTER_UNKNOWN) {
    cph_reply_error(r, 503, "not_serving", NULL,
                    "%s is in shard %" PRIu32 ", which no live node serves right now "
                    "(being claimed, or this node's lease lapsed): retry shortly",
                    what, shard);
    return false;
  }
  char msg[1600];
  snprintf(msg, sizeof msg, "%s is in shard %" PRIu32 ", owned by node %s at %s", what, shard,
           node, url);
  json_t *body = json_pack("{s{sssssns{sssssI}}}", "error", "code", "misdirected", "message",
                           msg, "field", "owner", "node", node, "url", url, "shard",
                           (json_int_t)shard);
  if (!body) {
    cph_reply_error(r, 500, "internal", NULL, "out of memory");
    return false;
  }
  cph_reply_json(r, 421, body);
  return false;
}

bool cph_cluster_gate_id(cph_req *r, const char *kind, const char *id) {
  cph_cluster *c = r->srv->cluster;
  if (!c || !id)
    return true;
  /* The built-in janitor is every node's own (:sessions :janitor?; clusterflow.c publishes no
   * record of it): its routes answer here, whatever shard its name falls in. */
  if (strcmp(kind, "session") == 0 && strcmp(id, "janitor") == 0 &&
      cph_engine_policy(r->srv->engine)->sessions.janitor)
    return true;
  char what[300];
  snprintf(what, sizeof what, "%s \"%.200s\"", kind, id);
  return cph_cluster_gate_shard(r, cph_cluster_shard_of(id, cph_cluster_shards(c)), what);
}

bool cph_cluster_gate_turn(cph_req *r, const char *turn_id) {
  cph_cluster *c = r->srv->cluster;
  if (!c || !turn_id)
    return true;
  char *end = NULL;
  unsigned long long id = strtoull(turn_id, &end, 10);
  uint32_t shard;
  if (!end || *end || !cph_cluster_turn_shard(c, id, &shard))
    return true; /* not leased here (or long ago): the engine answers as before */
  char what[64];
  snprintf(what, sizeof what, "turn %llu", id);
  return cph_cluster_gate_shard(r, shard, what);
}

/* An event goes to the owner of its channel's shard; an event without a channel (it goes to
 * its session's direct channel) to the owner of its session's shard, where the session is. */
bool cph_cluster_gate_events(cph_req *r, const cph_event_in *events, size_t n) {
  if (!r->srv->cluster)
    return true;
  for (size_t i = 0; i < n; i++) {
    if (events[i].channel && !cph_cluster_gate_id(r, "channel", events[i].channel))
      return false;
    if (!events[i].channel && !cph_cluster_gate_id(r, "session", events[i].session))
      return false;
  }
  return true;
}
