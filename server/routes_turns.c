/* Turns: lease (long-poll), heartbeat, complete, fail, parked list, requeue (DESIGN §4, §9).
 *
 *   POST /v1/turns/lease            {worker, lanes?, wait_ms?} -> 200 {"turn": turn} | 204
 *   POST /v1/turns/{id}/heartbeat   {lease}                    -> 200 {"id", "deadline_ms"}
 *   POST /v1/turns/{id}/complete    {lease, cost, reply?, memories?, tool_stats?, enqueue?}
 *                                                              -> 200 {"id", "status", "already"}
 *   POST /v1/turns/{id}/fail        {lease, error?}            -> 200 {"id", "status"}
 *   POST /v1/turns/{id}/requeue     {}                         -> 200 {"id", "status"}
 *   GET  /v1/turns?state=parked                                -> 200 {"turns": [parked]}
 */
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longpoll.h"
#include "routes.h"
#include "server.h"

/* A lease long-poll normally ends by the engine's timeout at its deadline; this much later,
 * the server withdraws it itself, so a client never waits past its wait_ms by more. */
#define LEASE_FALLBACK_GRACE_MS 250

/* ---------------------------------------------------------------- turn JSON */

/* "tokens": what each section of the context used, inside the session's window. */
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

static json_t *turn_json(const cph_turn_info *t) {
  json_t *o = json_object();
  json_object_set_new(o, "id", cph_json_u64(t->id));
  json_object_set_new(o, "lease", json_string(t->lease));
  json_object_set_new(o, "session", cph_json_str(t->session));
  json_object_set_new(o, "lane", json_string(cph_lane_name(t->lane)));
  json_object_set_new(o, "kind", json_string(cph_turn_kind_name(t->kind)));
  json_object_set_new(o, "input", cph_json_str(t->input));
  json_object_set_new(o, "episode", cph_json_u64(t->episode));
  json_object_set_new(o, "deadline_ms", json_integer(t->deadline_ms));
  json_object_set_new(o, "attempts", json_integer(t->attempts));

  json_t *staged = json_array();
  for (size_t i = 0; i < t->n_staged; i++) {
    const cph_staged_msg *m = &t->staged[i];
    json_t *sm = json_object();
    json_object_set_new(sm, "id", cph_json_u64(m->id));
    json_object_set_new(sm, "event_id", cph_json_u64(m->event_id));
    json_object_set_new(sm, "channel", cph_json_str(m->channel));
    json_object_set_new(sm, "sender", cph_json_str(m->sender));
    json_object_set_new(sm, "body", cph_json_str(m->body));
    json_object_set_new(sm, "mentioned", json_boolean(m->mentioned));
    json_object_set_new(sm, "ts_ms", json_integer(m->ts_ms));
    json_array_append_new(staged, sm);
  }
  json_object_set_new(o, "staged", staged);

  json_t *sections = json_object();
  json_t *cs = json_object();
  json_object_set_new(cs, "lane", json_string(cph_lane_name(t->lane)));
  json_object_set_new(cs, "credits", json_real(t->current_state.credits));
  json_object_set_new(cs, "turns_left", json_real(t->current_state.turns_left));
  json_object_set_new(cs, "tool_calls_left", json_real(t->current_state.tool_calls_left));
  json_object_set_new(cs, "state", json_string(cph_session_state_name(t->current_state.state)));
  json_object_set_new(cs, "episode", cph_json_u64(t->episode));
  json_object_set_new(cs, "turn_kind", json_string(cph_turn_kind_name(t->kind)));
  json_object_set_new(cs, "time_ms", json_integer(t->current_state.time_ms));
  json_object_set_new(sections, "current_state", cs);

  /* DESIGN §6: "per staged message, id, sender, preview (or none)". The window may hold
   * fewer than staged_count ("omitted" says how many are not listed). */
  json_t *po = json_object();
  json_object_set_new(po, "staged_count", json_integer((json_int_t)t->n_staged));
  if (t->n_obligations) {
    json_t *obligations = json_array();
    for (size_t i = 0; i < t->n_obligations; i++) {
      json_t *ob = json_object();
      json_object_set_new(ob, "id", cph_json_u64(t->obligations[i].id));
      json_object_set_new(ob, "sender", cph_json_str(t->obligations[i].sender));
      json_object_set_new(ob, "preview", cph_json_str(t->obligations[i].preview));
      json_array_append_new(obligations, ob);
    }
    json_object_set_new(po, "messages", obligations);
  } else {
    json_object_set_new(po, "messages", json_string("none"));
  }
  if (t->n_obligations < t->n_staged)
    json_object_set_new(po, "omitted", json_integer((json_int_t)(t->n_staged - t->n_obligations)));
  json_object_set_new(sections, "pending_obligations", po);

  /* DESIGN §6: conversation_history is `none` on an autonomy tick (n_history == 0). */
  if (t->n_history) {
    json_t *h = json_array();
    for (size_t i = 0; i < t->n_history; i++) {
      const cph_history_entry *e = &t->history[i];
      json_t *he = json_object();
      json_object_set_new(he, "event_id", cph_json_u64(e->event_id));
      json_object_set_new(he, "channel", cph_json_str(e->channel));
      json_object_set_new(he, "sender", cph_json_str(e->sender));
      json_object_set_new(he, "body", cph_json_str(e->body));
      json_object_set_new(he, "ts_ms", json_integer(e->ts_ms));
      json_array_append_new(h, he);
    }
    json_object_set_new(sections, "conversation_history", h);
  } else {
    json_object_set_new(sections, "conversation_history", json_string("none"));
  }
  json_t *mem = json_array();
  for (size_t i = 0; i < t->n_memories; i++) {
    const cph_memory_item *m = &t->memories[i];
    json_t *mo = json_object();
    json_object_set_new(mo, "id", cph_json_u64(m->id));
    json_object_set_new(mo, "kind", cph_json_str(m->kind));
    json_object_set_new(mo, "text", cph_json_str(m->text));
    json_object_set_new(mo, "session", cph_json_str(m->scope));
    json_object_set_new(mo, "created_ms", json_integer(m->created_ms));
    json_object_set_new(mo, "access_count", cph_json_u64(m->access_count));
    json_array_append_new(mem, mo);
  }
  json_object_set_new(sections, "recent_memory", mem);
  json_t *tools = json_array();
  for (size_t i = 0; i < t->n_tools; i++) {
    json_t *tu = json_object();
    json_object_set_new(tu, "name", cph_json_str(t->tools[i].name));
    json_object_set_new(tu, "calls_this_turn", cph_json_u64(t->tools[i].calls_this_turn));
    json_object_set_new(tu, "calls_this_minute", cph_json_u64(t->tools[i].calls_this_minute));
    json_array_append_new(tools, tu);
  }
  json_object_set_new(sections, "available_tools", tools);
  json_object_set_new(o, "sections", sections);

  json_t *msgs = json_array();
  for (size_t i = 0; i < t->n_messages; i++) {
    json_t *m = json_object();
    json_object_set_new(m, "role", cph_json_str(t->messages[i].role));
    json_object_set_new(m, "content", cph_json_str(t->messages[i].content));
    json_object_set_new(m, "coord", cph_json_str(t->messages[i].coord));
    json_array_append_new(msgs, m);
  }
  json_object_set_new(o, "messages", msgs);

  json_t *views = json_array();
  for (size_t i = 0; i < t->n_views; i++) {
    const cph_channel_view *v = &t->views[i];
    json_t *vo = json_object();
    json_object_set_new(vo, "channel", cph_json_str(v->channel));
    json_object_set_new(vo, "cursor", cph_json_u64(v->cursor));
    json_object_set_new(vo, "had_cursor", json_boolean(v->had_cursor));
    json_object_set_new(vo, "seen_index", cph_json_u64(v->seen_index));
    json_object_set_new(vo, "away", json_integer(v->away));
    json_array_append_new(views, vo);
  }
  json_object_set_new(o, "channel_views", views);
  json_object_set_new(o, "tokens", tokens_json(&t->tokens));
  return o;
}

/* ---------------------------------------------------------------- lease */

static void lease_done(cph_req *r) {
  cph_lp_finish(&r->srv->leases, r);
  cph_op *op = &r->op;
  if (op->rc == CPH_OK) {
    json_t *body = json_object();
    json_object_set_new(body, "turn", turn_json(&op->u.lease.turn));
    cph_reply_json(r, 200, body);
  } else if (op->rc == CPH_ETIMEDOUT) {
    cph_reply_empty(r, 204);
  } else {
    cph_reply_rc(r, op->rc, op->err.msg, op->field);
  }
}

void cph_lease_abandon(cph_req *r) {
  if (!r->op_pending)
    return;
  if (!cph_engine_cancel_lease(r->srv->engine, &r->op))
    return; /* served already: its `done` answers */
  r->op_pending = false;
  cph_lp_finish(&r->srv->leases, r);
  cph_reply_empty(r, 204);
  cph_req_end(r);
}

static void lease_fallback(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_lease_abandon(arg);
}

void cph_route_turn_lease(cph_req *r) {
  cph_srv *s = r->srv;
  const cph_policy *p = cph_engine_policy(s->engine);
  const char *worker = NULL;
  json_t *lanes = NULL;
  uint64_t wait_ms = 0;
  cph_in_str(r, r->body, "", "worker", CPH_IN_REQUIRED, &worker);
  cph_in_arr(r, r->body, "", "lanes", 0, &lanes);
  cph_in_u64(r, r->body, "", "wait_ms", 0, UINT32_MAX, &wait_ms);
  unsigned mask = 0;
  for (size_t i = 0; lanes && i < json_array_size(lanes) && !r->error.set; i++) {
    json_t *l = json_array_get(lanes, i);
    cph_lane lane;
    if (!json_is_string(l) || cph_lane_parse(json_string_value(l), &lane) != CPH_OK) {
      char f[32];
      snprintf(f, sizeof f, "lanes[%zu]", i);
      cph_req_fail(r, 400, "bad_request", f,
                   "%s must be \"interactive\", \"operational\" or \"maintenance\"", f);
      break;
    }
    mask |= 1u << lane;
  }
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  if ((int64_t)wait_ms > p->server.max_wait_ms)
    wait_ms = (uint64_t)p->server.max_wait_ms;
  if (!cph_lp_acquire(s, r)) {
    cph_reply_error(r, 429, "too_many_requests", NULL,
                    "this client already holds %" PRId64 " long-polls "
                    "(:server :max-long-polls-per-client)",
                    p->server.max_long_polls_per_client);
    return;
  }
  cph_op *op = &r->op;
  op->u.lease.worker = (char *)worker; /* an input: the engine reads it only */
  op->u.lease.lanes = mask;
  op->u.lease.deadline_ns = cph_clock_now(&s->clock) + (int64_t)wait_ms * CPH_NS_PER_MS;
  if (!cph_req_submit(r, CPH_OP_LEASE, lease_done)) {
    cph_lp_release(s, r);
    return;
  }
  cph_lp_list_add(&s->leases, r);
  cph_lp_watch(r, cph_lease_abandon);
  r->lp_timer = evtimer_new(s->base, lease_fallback, r);
  if (r->lp_timer) {
    uint64_t ms = wait_ms + LEASE_FALLBACK_GRACE_MS;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(r->lp_timer, &tv);
  }
}

/* ---------------------------------------------------------------- heartbeat, complete, fail */

/* The {id} segment as a turn id, and the body's "lease" (32 hex characters). */
static bool turn_target(cph_req *r, bool need_lease) {
  const char *id = r->params[0];
  char *end = NULL; /* stays NULL when strtoull is not called ("-1", "+1") */
  errno = 0;
  unsigned long long n = id && *id != '-' && *id != '+' ? strtoull(id, &end, 10) : 0;
  if (!id || !*id || !end || *end != '\0' || errno == ERANGE || n == 0) {
    cph_req_fail(r, 404, "not_found", "id", "no turn \"%s\": turn ids are positive integers",
                 id ? id : "");
    return false;
  }
  r->op.u.turn.turn_id = n;
  if (!need_lease)
    return true;
  const char *lease = NULL;
  if (!cph_in_str(r, r->body, "", "lease", CPH_IN_REQUIRED, &lease))
    return false;
  size_t len = strlen(lease);
  if (len != 32 || strspn(lease, "0123456789abcdefABCDEF") != 32) {
    cph_req_fail(r, 400, "bad_request", "lease", "lease must be the 32 hex characters of the "
                 "turn's lease token");
    return false;
  }
  memcpy(r->op.u.turn.lease, lease, 33);
  return true;
}

static void heartbeat_done(cph_req *r) {
  if (r->op.rc != CPH_OK) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *body = json_object();
  json_object_set_new(body, "id", cph_json_u64(r->op.u.turn.turn_id));
  json_object_set_new(body, "deadline_ms", json_integer(r->op.u.turn.deadline_ms));
  cph_reply_json(r, 200, body);
}

void cph_route_turn_heartbeat(cph_req *r) {
  if (!turn_target(r, true)) {
    cph_reply_failure(r);
    return;
  }
  cph_req_submit(r, CPH_OP_HEARTBEAT, heartbeat_done);
}

static void status_done(cph_req *r, const char *status) {
  if (r->op.rc != CPH_OK) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *body = json_object();
  json_object_set_new(body, "id", cph_json_u64(r->op.u.turn.turn_id));
  json_object_set_new(body, "status", json_string(status));
  if (r->op.kind == CPH_OP_COMPLETE)
    json_object_set_new(body, "already", json_boolean(r->op.u.turn.already));
  cph_reply_json(r, 200, body);
}

static void complete_done(cph_req *r) { status_done(r, "completed"); }
static void fail_done(cph_req *r) { status_done(r, "failed"); }
static void requeue_done(cph_req *r) { status_done(r, "requeued"); }

/* Checks the shape of memories?: [{text, tags?}] and enqueue?: [{job, args?}]. */
static void check_list_of(cph_req *r, const char *key, const char *required,
                          const char *optional_strv) {
  json_t *arr = NULL;
  if (!cph_in_arr(r, r->body, "", key, 0, &arr) || !arr)
    return;
  for (size_t i = 0; i < json_array_size(arr) && !r->error.set; i++) {
    char path[48];
    snprintf(path, sizeof path, "%s[%zu]", key, i);
    json_t *item = json_array_get(arr, i);
    if (!json_is_object(item)) {
      cph_req_fail(r, 400, "bad_request", path, "%s must be an object", path);
      return;
    }
    const char *s;
    cph_in_str(r, item, path, required, CPH_IN_REQUIRED, &s);
    if (optional_strv) {
      cph_strv v;
      cph_in_strv(r, item, path, optional_strv, 0, &v);
    } else {
      json_t *args;
      cph_in_obj(r, item, path, "args", 0, &args);
    }
  }
}

void cph_route_turn_complete(cph_req *r) {
  cph_op *op = &r->op;
  if (!turn_target(r, true)) {
    cph_reply_failure(r);
    return;
  }
  json_t *cost = NULL, *reply = NULL, *stats = NULL;
  cph_in_obj(r, r->body, "", "cost", CPH_IN_REQUIRED, &cost);
  if (cost) {
    cph_in_u64(r, cost, "cost", "tokens", CPH_IN_REQUIRED, INT64_MAX, &op->u.turn.tokens);
    cph_in_u64(r, cost, "cost", "tool_calls", CPH_IN_REQUIRED, INT64_MAX,
               &op->u.turn.tool_calls);
  }
  cph_in_obj(r, r->body, "", "reply", 0, &reply);
  if (reply) {
    const char *body = NULL, *channel = NULL;
    cph_in_str(r, reply, "reply", "body", CPH_IN_REQUIRED, &body);
    cph_in_str(r, reply, "reply", "channel", 0, &channel);
    op->u.turn.reply_body = (char *)body; /* inputs: the engine reads them only */
    op->u.turn.reply_channel = (char *)channel;
  }
  cph_in_obj(r, r->body, "", "tool_stats", 0, &stats);
  if (stats) {
    cph_in_u64(r, stats, "tool_stats", "valid", 0, INT64_MAX, &op->u.turn.tool_stats.valid);
    cph_in_u64(r, stats, "tool_stats", "invalid", 0, INT64_MAX, &op->u.turn.tool_stats.invalid);
    cph_in_u64(r, stats, "tool_stats", "repairs", 0, INT64_MAX, &op->u.turn.tool_stats.repairs);
    cph_in_u64(r, stats, "tool_stats", "guard_denies", 0, INT64_MAX,
               &op->u.turn.tool_stats.guard_denies);
  }
  check_list_of(r, "memories", "text", "tags");
  check_list_of(r, "enqueue", "job", NULL);
  json_t *mems = NULL, *jobs = NULL;
  cph_in_arr(r, r->body, "", "memories", 0, &mems);
  cph_in_arr(r, r->body, "", "enqueue", 0, &jobs);
  if (mems && !r->error.set && json_array_size(mems)) {
    op->u.turn.memories = cph_req_alloc(r, json_array_size(mems) * sizeof *op->u.turn.memories);
    for (size_t i = 0; op->u.turn.memories && i < json_array_size(mems); i++) {
      char path[48];
      snprintf(path, sizeof path, "memories[%zu]", i);
      json_t *m = json_array_get(mems, i);
      const char *text = NULL;
      cph_in_str(r, m, path, "text", CPH_IN_REQUIRED, &text);
      cph_in_strv(r, m, path, "tags", 0, &op->u.turn.memories[i].tags);
      op->u.turn.memories[i].text = (char *)text;
      op->u.turn.n_memories++;
    }
  }
  if (jobs && !r->error.set && json_array_size(jobs)) {
    op->u.turn.enqueue = cph_req_alloc(r, json_array_size(jobs) * sizeof *op->u.turn.enqueue);
    for (size_t i = 0; op->u.turn.enqueue && i < json_array_size(jobs); i++) {
      char path[48];
      snprintf(path, sizeof path, "enqueue[%zu]", i);
      json_t *j = json_array_get(jobs, i), *args = NULL;
      const char *kind = NULL;
      cph_in_str(r, j, path, "job", CPH_IN_REQUIRED, &kind);
      cph_in_obj(r, j, path, "args", 0, &args);
      char apath[64];
      snprintf(apath, sizeof apath, "%s.args", path);
      op->u.turn.enqueue[i].job = (char *)kind;
      op->u.turn.enqueue[i].args = (char *)cph_job_args_text(r, args, apath);
      op->u.turn.n_enqueue++;
    }
  }
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  cph_req_submit(r, CPH_OP_COMPLETE, complete_done);
}

void cph_route_turn_fail(cph_req *r) {
  const char *error = NULL;
  if (turn_target(r, true))
    cph_in_str(r, r->body, "", "error", 0, &error);
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  r->op.u.turn.error = (char *)error;
  cph_req_submit(r, CPH_OP_FAIL, fail_done);
}

void cph_route_turn_requeue(cph_req *r) {
  if (!turn_target(r, false)) {
    cph_reply_failure(r);
    return;
  }
  cph_req_submit(r, CPH_OP_REQUEUE, requeue_done);
}

/* ---------------------------------------------------------------- parked */

void cph_route_turns_list(cph_req *r) {
  const char *state = cph_req_query(r, "state");
  if (state && strcmp(state, "parked") != 0) {
    cph_reply_error(r, 400, "bad_request", "state", "state must be \"parked\"");
    return;
  }
  cph_parked_turn *turns = NULL;
  size_t n = 0;
  cph_err err = {0};
  int rc = cph_engine_parked_turns(r->srv->engine, &turns, &n, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    const cph_parked_turn *t = &turns[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_u64(t->id));
    json_object_set_new(o, "session", cph_json_str(t->session));
    json_object_set_new(o, "state", json_string("parked"));
    json_object_set_new(o, "attempts", json_integer(t->attempts));
    json_t *ids = json_array();
    for (size_t j = 0; j < t->n_inbox_ids; j++)
      json_array_append_new(ids, cph_json_u64(t->inbox_ids[j]));
    json_object_set_new(o, "inbox_ids", ids);
    json_object_set_new(o, "error", cph_json_str(t->error));
    json_array_append_new(arr, o);
    cph_parked_turn_free(&turns[i]);
  }
  free(turns);
  json_t *body = json_object();
  json_object_set_new(body, "turns", arr);
  cph_reply_json(r, 200, body);
}
