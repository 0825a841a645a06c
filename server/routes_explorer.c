/* The context explorer's routes (issue #18; kept contexts: core/turnlog.h). Scope read.
 *   GET /v1/sessions/{id}/turns                 -> {"session", "keep_turns", "turns": [summary]}
 *                                                  the kept turns, oldest first
 *   GET /v1/sessions/{id}/turns/{turn}/context  -> {"turn": summary, "messages": [{role,
 *                                                  content, coord, node}], "sections":
 *                                                  {conversation_history, recent_memory,
 *                                                  pending_obligations, available_tools},
 *                                                  "channels", "nodes": [kept node]}
 *   GET /v1/sessions/{id}/context/diff?from=A&to=B
 *                                               -> {"session", "from": summary, "to": summary,
 *                                                  "nodes", "messages", "conversation_history",
 *                                                  "recent_memory", "pending_obligations":
 *                                                  each {"entered", "left", "changed": [change]}}
 * summary: {id, kind, episode, created_ms, input, messages (count), tokens, omitted: [part]};
 * a part the lease left out (`include`) is listed in `omitted` and not compared.
 * change: {id, reason, detail, role?, content, at, from_at?}; history items say sender and
 * channel, memories kind and scope, instead of role and at. Reasons: cephalon.h
 * (cph_context_change). Unknown session or turn not kept: 404 naming the field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"
#include "server.h"

/* Part bits and the names the lease's `include` uses for them. */
static const struct {
  unsigned bit;
  const char *name;
} PARTS[] = {
    {CPH_PART_INPUT, "input"},
    {CPH_PART_STAGED, "staged"},
    {CPH_PART_CURRENT_STATE, "sections.current_state"},
    {CPH_PART_OBLIGATIONS, "sections.pending_obligations"},
    {CPH_PART_HISTORY, "sections.conversation_history"},
    {CPH_PART_MEMORY, "sections.recent_memory"},
    {CPH_PART_TOOLS, "sections.available_tools"},
    {CPH_PART_MESSAGES, "messages"},
    {CPH_PART_VIEWS, "channel_views"},
    {CPH_PART_TOKENS, "tokens"},
};

static json_t *tokens_json(const cph_context_tokens *k) {
  json_t *o = json_object();
  json_object_set_new(o, "window", json_integer(k->window));
  json_object_set_new(o, "current_state", json_integer(k->current_state));
  json_object_set_new(o, "pending_obligations", json_integer(k->pending_obligations));
  json_object_set_new(o, "conversation_history", json_integer(k->conversation_history));
  json_object_set_new(o, "recent_memory", json_integer(k->recent_memory));
  json_object_set_new(o, "available_tools", json_integer(k->available_tools));
  json_object_set_new(o, "sections", json_integer(k->sections));
  json_object_set_new(o, "messages", json_integer(k->messages));
  json_object_set_new(o, "history_cut", json_integer(k->history_cut));
  json_object_set_new(o, "messages_cut", json_integer(k->messages_cut));
  return o;
}

static json_t *summary_json(const cph_kept_turn *t) {
  json_t *o = json_object();
  json_object_set_new(o, "id", cph_json_u64(t->id));
  json_object_set_new(o, "kind", json_string(cph_turn_kind_name(t->kind)));
  json_object_set_new(o, "episode", cph_json_u64(t->episode));
  json_object_set_new(o, "created_ms", json_integer(t->created_ms));
  json_object_set_new(o, "input", cph_json_str(t->input));
  json_object_set_new(o, "messages", json_integer((json_int_t)t->n_messages));
  json_object_set_new(o, "tokens", tokens_json(&t->tokens));
  json_t *omitted = json_array();
  for (size_t i = 0; i < sizeof PARTS / sizeof PARTS[0]; i++)
    if (t->omit & PARTS[i].bit)
      json_array_append_new(omitted, json_string(PARTS[i].name));
  json_object_set_new(o, "omitted", omitted);
  return o;
}

void cph_route_kept_turns(cph_req *r) {
  cph_kept_turn *turns;
  size_t n;
  cph_err err = {0};
  int rc = cph_engine_kept_turns(r->srv->engine, r->params[0], &turns, &n, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, summary_json(&turns[i]));
  cph_kept_turns_free(turns, n);
  json_t *o = json_object();
  json_object_set_new(o, "session", json_string(r->params[0]));
  json_object_set_new(o, "keep_turns",
                      json_integer(cph_engine_policy(r->srv->engine)->context.keep_turns));
  json_object_set_new(o, "turns", arr);
  cph_reply_json(r, 200, o);
}

/* A turn id path or query value; false with a 400 naming field recorded. */
static bool turn_id(cph_req *r, const char *text, const char *field, uint64_t *out) {
  char *end = NULL;
  unsigned long long v = text ? strtoull(text, &end, 10) : 0;
  if (!text || !*text || *end || text[0] == '-' || !v) {
    cph_req_fail(r, 400, "bad_request", field, "%s: expected a turn id", field);
    return false;
  }
  *out = v;
  return true;
}

static json_t *items_json(const cph_kept_item *items, size_t n, const char *id_name,
                          const char *label_name, const char *text_name) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_object();
    json_object_set_new(o, id_name, cph_json_u64(items[i].id));
    if (label_name)
      json_object_set_new(o, label_name, cph_json_str(items[i].label));
    json_object_set_new(o, text_name, cph_json_str(items[i].text));
    json_array_append_new(a, o);
  }
  return a;
}

void cph_route_turn_context(cph_req *r) {
  uint64_t turn;
  if (!turn_id(r, r->params[1], "turn", &turn)) {
    cph_reply_failure(r);
    return;
  }
  cph_turn_context c;
  cph_err err = {0};
  int rc = cph_engine_turn_context(r->srv->engine, r->params[0], turn, &c, &err);
  if (rc) {
    const char *field = NULL;
    if (rc == CPH_ENOTFOUND)
      field = strncmp(err.msg, "no such session", 15) == 0 ? "id" : "turn";
    cph_reply_rc(r, rc, err.msg, field);
    return;
  }
  json_t *msgs = json_array();
  for (size_t i = 0; i < c.n_messages; i++) {
    json_t *m = json_object();
    json_object_set_new(m, "role", cph_json_str(c.messages[i].role));
    json_object_set_new(m, "content", cph_json_str(c.messages[i].content));
    json_object_set_new(m, "coord", cph_json_str(c.messages[i].coord));
    json_object_set_new(m, "node", c.message_nodes[i] ? cph_json_u64(c.message_nodes[i])
                                                      : json_null());
    json_array_append_new(msgs, m);
  }
  json_t *sections = json_object();
  json_object_set_new(sections, "conversation_history",
                      items_json(c.history, c.n_history, "event_id", "sender", "body"));
  json_object_set_new(sections, "recent_memory",
                      items_json(c.memories, c.n_memories, "id", "kind", "text"));
  json_object_set_new(sections, "pending_obligations",
                      items_json(c.obligations, c.n_obligations, "id", NULL, "text"));
  json_object_set_new(sections, "available_tools", cph_json_strv(&c.tools));
  json_t *nodes = json_array();
  for (size_t i = 0; i < c.n_nodes; i++) {
    const cph_kept_node *nd = &c.nodes[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_u64(nd->id));
    json_object_set_new(o, "at", json_string(nd->at));
    json_object_set_new(o, "role", cph_json_str(nd->role));
    json_object_set_new(o, "content", cph_json_str(nd->content));
    json_object_set_new(o, "ttl", nd->ttl >= 0 ? json_integer(nd->ttl) : json_null());
    json_object_set_new(o, "cadence", nd->cadence ? json_integer(nd->cadence) : json_null());
    json_object_set_new(o, "created_at_episode", cph_json_u64(nd->created_at_episode));
    json_object_set_new(o, "waiting", json_boolean(nd->waiting));
    if (nd->n_lifecycle) {
      json_object_set_new(o, "stage", json_integer(nd->stage));
      json_object_set_new(o, "stages", json_integer(nd->n_lifecycle));
    }
    json_array_append_new(nodes, o);
  }
  json_t *o = json_object();
  json_object_set_new(o, "session", json_string(r->params[0]));
  json_object_set_new(o, "turn", summary_json(&c.turn));
  json_object_set_new(o, "messages", msgs);
  json_object_set_new(o, "sections", sections);
  json_object_set_new(o, "channels", cph_json_strv(&c.channels));
  json_object_set_new(o, "nodes", nodes);
  cph_turn_context_free(&c);
  cph_reply_json(r, 200, o);
}

/* Per part: its name in the engine, its member in the answer, and the JSON names of the
 * change's role and at fields there. */
static const struct {
  const char *part, *member, *role, *at;
} DIFF_PARTS[] = {
    {"node", "nodes", "role", "at"},
    {"message", "messages", "role", "at"},
    {"conversation_history", "conversation_history", "sender", "channel"},
    {"recent_memory", "recent_memory", "kind", "scope"},
    {"pending_obligations", "pending_obligations", "role", "at"},
};

void cph_route_context_diff(cph_req *r) {
  uint64_t from, to;
  if (!turn_id(r, cph_req_query(r, "from"), "from", &from) ||
      !turn_id(r, cph_req_query(r, "to"), "to", &to)) {
    cph_reply_failure(r);
    return;
  }
  cph_context_diff d;
  cph_err err = {0};
  int rc = cph_engine_context_diff(r->srv->engine, r->params[0], from, to, &d, &err);
  if (rc) {
    const char *field = NULL;
    if (rc == CPH_ENOTFOUND)
      field = strncmp(err.msg, "from:", 5) == 0 ? "from" : strncmp(err.msg, "to:", 3) == 0 ? "to" : "id";
    cph_reply_rc(r, rc, err.msg, field);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "session", json_string(r->params[0]));
  json_object_set_new(o, "from", summary_json(&d.from));
  json_object_set_new(o, "to", summary_json(&d.to));
  for (size_t p = 0; p < sizeof DIFF_PARTS / sizeof DIFF_PARTS[0]; p++) {
    json_t *part = json_object();
    json_object_set_new(part, "entered", json_array());
    json_object_set_new(part, "left", json_array());
    json_object_set_new(part, "changed", json_array());
    json_object_set_new(o, DIFF_PARTS[p].member, part);
  }
  for (size_t i = 0; i < d.n; i++) {
    const cph_context_change *c = &d.changes[i];
    size_t p = 0;
    while (p < sizeof DIFF_PARTS / sizeof DIFF_PARTS[0] && strcmp(c->part, DIFF_PARTS[p].part))
      p++;
    if (p == sizeof DIFF_PARTS / sizeof DIFF_PARTS[0])
      continue;
    json_t *list = json_object_get(json_object_get(o, DIFF_PARTS[p].member), c->change);
    if (!list)
      continue;
    json_t *x = json_object();
    json_object_set_new(x, "id", c->id ? cph_json_u64(c->id) : json_null());
    json_object_set_new(x, "reason", json_string(c->reason));
    json_object_set_new(x, "detail", cph_json_str(c->detail));
    if (c->role)
      json_object_set_new(x, DIFF_PARTS[p].role, json_string(c->role));
    json_object_set_new(x, "content", cph_json_str(c->content));
    if (c->at || strcmp(DIFF_PARTS[p].at, "at") == 0)
      json_object_set_new(x, DIFF_PARTS[p].at, cph_json_str(c->at));
    if (c->from_at)
      json_object_set_new(x, "from_at", json_string(c->from_at));
    json_array_append_new(list, x);
  }
  cph_context_diff_free(&d);
  cph_reply_json(r, 200, o);
}
