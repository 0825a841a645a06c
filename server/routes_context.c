/* Context routes (DESIGN §6, §9):
 *   POST   /v1/sessions/{id}/context         {at, content, ttl?, cadence?, lifecycle?, key?, tags?}
 *                                            -> the node
 *   GET    /v1/sessions/{id}/context?select= -> {"episode", "nodes": [node]} (all live nodes
 *                                               when select is absent, in render order)
 *   DELETE /v1/sessions/{id}/context/{node}  -> {"deleted": id}
 *   GET    /v1/sessions/{id}/context/step?episodes=N -> {"steps": [{"episode", "nodes"}]}:
 *                                               what the next N episodes would do; changes nothing
 *   POST   /v1/sessions/{id}/seal {trigger}  -> {"seal_id"}: snapshot of the rendered context
 *   GET    /v1/sessions/{id}/seals           -> {"seals": [{id, trigger, episode, created_ms,
 *                                               messages}]} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clusterflow.h"
#include "routes.h"
#include "server.h"

static json_t *node_json(const cph_context_node_info *n) {
  json_t *o = json_object();
  json_object_set_new(o, "id", cph_json_u64(n->id));
  json_object_set_new(o, "at", json_string(n->at));
  json_object_set_new(o, "content", cph_json_str(n->content));
  json_object_set_new(o, "role", cph_json_str(n->role));
  json_object_set_new(o, "ttl", n->ttl >= 0 ? json_integer(n->ttl) : json_null());
  json_object_set_new(o, "cadence", n->cadence ? json_integer(n->cadence) : json_null());
  json_t *lc = json_null();
  if (n->n_lifecycle) {
    lc = json_array();
    for (size_t i = 0; i < n->n_lifecycle; i++) {
      json_t *st = json_object();
      json_object_set_new(st, "at", json_string(n->lifecycle[i].at));
      json_object_set_new(st, "ttl", n->lifecycle[i].ttl >= 0 ? json_integer(n->lifecycle[i].ttl)
                                                              : json_null());
      json_array_append_new(lc, st);
    }
  }
  json_object_set_new(o, "lifecycle", lc);
  json_object_set_new(o, "key", cph_json_str(n->key));
  json_object_set_new(o, "tags", cph_json_strv(&n->tags));
  json_object_set_new(o, "created_at_episode", cph_json_u64(n->created_at_episode));
  return o;
}

static json_t *nodes_json(const cph_context_node_info *nodes, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, node_json(&nodes[i]));
  return a;
}

/* Answers r's change of its session's context with o (taken): at once on a single node; in
 * cluster mode once the log holds the session's state after it (u.context.state), so a change
 * answered 200 moves with its session to the next node that serves it (clusterflow.h 11.). */
static void answer_after_state(cph_req *r, const char *made, const char *lacks, json_t *o) {
  if (r->srv->cflow)
    cph_cflow_context_changed(r->srv->cflow, r, r->op.u.context.session, made, lacks,
                              r->op.u.context.state, r->op.u.context.state_len, o);
  else
    cph_reply_json(r, 200, o);
}

static void insert_done(cph_req *r) {
  if (r->op.rc) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  char sel[48];
  snprintf(sel, sizeof sel, "{id=%llu}", (unsigned long long)r->op.u.context.node_id);
  cph_context_node_info *nodes;
  size_t n;
  uint64_t episode;
  cph_err err;
  int rc = cph_engine_context(r->srv->engine, r->params[0], sel, &nodes, &n, &episode, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *o = n ? node_json(&nodes[0]) : json_object();
  if (!n) /* waiting for its cadence already? say its id at least */
    json_object_set_new(o, "id", cph_json_u64(r->op.u.context.node_id));
  cph_context_nodes_free(nodes, n);
  char made[64];
  snprintf(made, sizeof made, "node %llu was %s", (unsigned long long)r->op.u.context.node_id,
           r->op.u.context.updated ? "updated" : "inserted");
  answer_after_state(r, made, r->op.u.context.updated ? "the update" : "the node", o);
}

void cph_route_context_insert(cph_req *r) {
  cph_context_node_in *in = &r->op.u.context.node;
  const char *at = NULL, *content = NULL, *key = NULL;
  uint64_t ttl = 0, cadence = 0;
  json_t *lifecycle = NULL;
  cph_in_str(r, r->body, "", "at", 0, &at);
  cph_in_str(r, r->body, "", "content", CPH_IN_REQUIRED, &content);
  cph_in_u64(r, r->body, "", "ttl", 0, INT32_MAX, &ttl);
  cph_in_u64(r, r->body, "", "cadence", 0, INT32_MAX, &cadence);
  cph_in_str(r, r->body, "", "key", 0, &key);
  cph_in_strv(r, r->body, "", "tags", 0, &in->tags);
  cph_in_arr(r, r->body, "", "lifecycle", 0, &lifecycle);
  size_t stages = lifecycle ? json_array_size(lifecycle) : 0;
  if (!r->error.set && stages > 32)
    cph_req_fail(r, 413, "too_large", "lifecycle", "lifecycle: at most 32 stages");
  if (!r->error.set && stages) {
    in->lifecycle = cph_req_alloc(r, stages * sizeof *in->lifecycle);
    for (size_t i = 0; in->lifecycle && i < stages && !r->error.set; i++) {
      char path[40];
      snprintf(path, sizeof path, "lifecycle[%zu]", i);
      json_t *st = json_array_get(lifecycle, i);
      if (!json_is_object(st)) {
        cph_req_fail(r, 400, "bad_request", path, "%s must be an object {at, ttl?}", path);
        break;
      }
      const char *sat = NULL;
      uint64_t sttl = 0;
      cph_in_str(r, st, path, "at", CPH_IN_REQUIRED, &sat);
      cph_in_u64(r, st, path, "ttl", 0, INT32_MAX, &sttl);
      in->lifecycle[i].at = (char *)sat;
      in->lifecycle[i].ttl = (int64_t)sttl;
    }
    in->n_lifecycle = stages;
  }
  if (!r->error.set && !at && !stages)
    cph_req_fail(r, 400, "bad_request", "at", "at: required, e.g. \"d0, 1, 0\"");
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  in->at = (char *)(at ? at : in->lifecycle[0].at);
  in->content = (char *)content;
  in->ttl = (int64_t)ttl;
  in->cadence = (int64_t)cadence;
  in->key = (char *)key;
  r->op.u.context.session = r->params[0];
  cph_req_submit(r, CPH_OP_CONTEXT_INSERT, insert_done);
}

void cph_route_context_get(cph_req *r) {
  const char *select = cph_req_query(r, "select");
  cph_context_node_info *nodes;
  size_t n;
  uint64_t episode = 0;
  cph_err err = {0};
  int rc = cph_engine_context(r->srv->engine, r->params[0], select, &nodes, &n, &episode, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : rc == CPH_EINVAL || rc == CPH_ELIMIT ? "select" : NULL);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "episode", cph_json_u64(episode));
  json_object_set_new(o, "nodes", nodes_json(nodes, n));
  cph_context_nodes_free(nodes, n);
  cph_reply_json(r, 200, o);
}

static void delete_done(cph_req *r) {
  if (r->op.rc) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "deleted", cph_json_u64(r->op.u.context.node_id));
  char made[64];
  snprintf(made, sizeof made, "node %llu was deleted", (unsigned long long)r->op.u.context.node_id);
  answer_after_state(r, made, "the deletion (the node would be back there)", o);
}

void cph_route_context_delete(cph_req *r) {
  char *end;
  unsigned long long id = strtoull(r->params[1], &end, 10);
  if (*end || !id) {
    cph_reply_error(r, 400, "bad_request", "node", "node: expected a node id");
    return;
  }
  r->op.u.context.session = r->params[0];
  r->op.u.context.node_id = id;
  cph_req_submit(r, CPH_OP_CONTEXT_DELETE, delete_done);
}

void cph_route_context_step(cph_req *r) {
  uint64_t episodes;
  if (!cph_query_u64(r, "episodes", 1, 1000, &episodes)) {
    cph_reply_failure(r);
    return;
  }
  cph_context_step *steps;
  cph_err err = {0};
  int rc = cph_engine_context_step(r->srv->engine, r->params[0], episodes ? episodes : 1, &steps,
                                   &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : "episodes");
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < (episodes ? episodes : 1); i++) {
    json_t *st = json_object();
    json_object_set_new(st, "episode", cph_json_u64(steps[i].episode));
    json_object_set_new(st, "nodes", nodes_json(steps[i].nodes, steps[i].n));
    json_array_append_new(arr, st);
  }
  cph_context_steps_free(steps, episodes ? episodes : 1);
  json_t *o = json_object();
  json_object_set_new(o, "steps", arr);
  cph_reply_json(r, 200, o);
}

static void seal_done(cph_req *r) {
  if (r->op.rc) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "seal_id", cph_json_u64(r->op.u.context.seal_id));
  /* Cluster mode: the answer waits until the log holds the session's state with the seal
   * (clusterflow.h, 11.), so a seal answered 200 moves with its session after a kill -9. */
  if (r->srv->cflow && r->op.u.context.items.n)
    cph_cflow_items(r->srv->cflow, r->op.u.context.session, &r->op.u.context.items);
  char made[64];
  snprintf(made, sizeof made, "seal %llu was made", (unsigned long long)r->op.u.context.seal_id);
  answer_after_state(r, made, "the seal (a retry makes another seal)", o);
}

void cph_route_seal(cph_req *r) {
  const char *trigger = NULL;
  if (!cph_in_str(r, r->body, "", "trigger", CPH_IN_REQUIRED, &trigger)) {
    cph_reply_failure(r);
    return;
  }
  r->op.u.context.session = r->params[0];
  r->op.u.context.trigger = (char *)trigger;
  cph_req_submit(r, CPH_OP_CONTEXT_SEAL, seal_done);
}

void cph_route_seals(cph_req *r) {
  cph_seal_info *seals;
  size_t n;
  cph_err err = {0};
  int rc = cph_engine_seals(r->srv->engine, r->params[0], &seals, &n, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_object();
    json_object_set_new(s, "id", cph_json_u64(seals[i].id));
    json_object_set_new(s, "trigger", cph_json_str(seals[i].trigger));
    json_object_set_new(s, "episode", cph_json_u64(seals[i].episode));
    json_object_set_new(s, "created_ms", json_integer(seals[i].created_ms));
    if (seals[i].origin)
      json_object_set_new(s, "origin", cph_json_str(seals[i].origin));
    json_t *msgs = json_array();
    for (size_t j = 0; j < seals[i].n_messages; j++) {
      json_t *m = json_object();
      json_object_set_new(m, "role", cph_json_str(seals[i].messages[j].role));
      json_object_set_new(m, "content", cph_json_str(seals[i].messages[j].content));
      json_object_set_new(m, "coord", cph_json_str(seals[i].messages[j].coord));
      json_array_append_new(msgs, m);
    }
    json_object_set_new(s, "messages", msgs);
    json_array_append_new(arr, s);
  }
  cph_seals_free(seals, n);
  json_t *o = json_object();
  json_object_set_new(o, "seals", arr);
  cph_reply_json(r, 200, o);
}
