/* Turns: lease (long-poll), heartbeat, complete, fail, parked list, requeue (DESIGN §4, §9).
 *
 *   POST /v1/turns/lease            {worker, lanes?, wait_ms?, include?}
 *                                                              -> 200 {"turn": turn} | 204
 *     include: the parts of the turn the worker uses (LEASE_PARTS); absent: all of them
 *   POST /v1/turns/{id}/heartbeat   {lease}                    -> 200 {"id", "deadline_ms",
 *                                                                  "arrived"?, "interrupt"?}
 *     arrived: entries staged for the session since the lease, not taken (while_running
 *     merge or interrupt); interrupt: true once interrupt asked the worker to stop
 *   POST /v1/turns/{id}/take        {lease}          -> 200 {"id", "taken": [staged entry]}
 *     while_running merge: the arrived entries move into the running turn (DESIGN §4)
 *   POST /v1/turns/{id}/complete    {lease, cost, reply?, memories?, tool_stats?, enqueue?,
 *                                    interrupted?}
 *     interrupted: true — stopped because the heartbeat said interrupt; the turn's input is
 *     staged again for the next turn (core/turns.c)
 *   A superseded lease (while_running restart) answers 409 with code "superseded".
 *     tool_stats: {valid, invalid, repairs, guard_denies, tools?: {NAME: {calls, invalid,
 *     errors}}} — the per-tool map feeds cephalon_tool_calls_total{tool,result}
 *                                                              -> 200 {"id", "status", "already"}
 *   POST /v1/turns/{id}/fail        {lease, error?}            -> 200 {"id", "status"}
 *   POST /v1/turns/{id}/requeue     {}                         -> 200 {"id", "status"}
 *   GET  /v1/turns?state=parked                                -> 200 {"turns": [parked]}
 *   GET  /v1/turns?session=S&limit=N    -> 200 {"session", "turns": [record]}: S's ended turns
 *                                          (however they ended), newest first; on its owner
 *   GET  /v1/turns/{id}                                        -> 200 record
 *     record: {id, session, lane, kind, state, worker, episode, attempts, input, created_ms,
 *     deadline_ms, completed_ms, cost: {tokens, tool_calls}, error, origin?} — origin in
 *     cluster mode only (core/turnrecs.h); turn ids are per node, so any node answers for its
 *     own
 */
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "clusterflow.h"
#include "emit.h"
#include "longpoll.h"
#include "offload.h"
#include "routes.h"
#include "server.h"

/* A lease long-poll normally ends by the engine's timeout at its deadline; this much later,
 * the server withdraws it itself, so a client never waits past its wait_ms by more. */
#define LEASE_FALLBACK_GRACE_MS 250

/* ---------------------------------------------------------------- turn JSON */

/* The leased turn is the largest and most frequent body the daemon writes (it carries the
 * assembled context), so it is written with cph_emit rather than built as a jansson tree.
 * Member counts are declared before each container (emit.h). */

/* Whether the answer carries part (cph_turn_part). */
static bool has(const cph_turn_info *t, unsigned part) { return !(t->omit & part); }

/* "tokens": what each section of the context used, inside the session's window. They count
 * what the answer carries: a part left out counts 0 (its cut too), "sections" sums those
 * carried. */
static void tokens_emit(cph_emit *w, const cph_turn_info *t) {
  const cph_context_tokens *k = &t->tokens;
  uint32_t state = has(t, CPH_PART_CURRENT_STATE) ? k->current_state : 0;
  uint32_t obligations = has(t, CPH_PART_OBLIGATIONS) ? k->pending_obligations : 0;
  uint32_t history = has(t, CPH_PART_HISTORY) ? k->conversation_history : 0;
  uint32_t memory = has(t, CPH_PART_MEMORY) ? k->recent_memory : 0;
  uint32_t tools = has(t, CPH_PART_TOOLS) ? k->available_tools : 0;
  bool messages = has(t, CPH_PART_MESSAGES);
  cph_emit_object(w, 10);
  cph_emit_key(w, "window");
  cph_emit_i64(w, k->window);
  cph_emit_key(w, "current_state");
  cph_emit_i64(w, state);
  cph_emit_key(w, "pending_obligations");
  cph_emit_i64(w, obligations);
  cph_emit_key(w, "conversation_history");
  cph_emit_i64(w, history);
  cph_emit_key(w, "recent_memory");
  cph_emit_i64(w, memory);
  cph_emit_key(w, "available_tools");
  cph_emit_i64(w, tools);
  cph_emit_key(w, "sections");
  cph_emit_i64(w, t->omit & CPH_PART_SECTIONS
                      ? (int64_t)state + obligations + history + memory + tools
                      : k->sections);
  cph_emit_key(w, "messages");
  cph_emit_i64(w, messages ? k->messages : 0);
  cph_emit_key(w, "history_cut");
  cph_emit_i64(w, has(t, CPH_PART_HISTORY) ? k->history_cut : 0);
  cph_emit_key(w, "messages_cut");
  cph_emit_i64(w, messages ? k->messages_cut : 0);
  cph_emit_end(w);
}

/* A list of staged entries: a lease's `staged`, a take's answer. */
static void staged_list_emit(cph_emit *w, const cph_staged_msg *list, size_t n) {
  cph_emit_array(w, n);
  for (size_t i = 0; i < n; i++) {
    const cph_staged_msg *m = &list[i];
    cph_emit_object(w, 11);
    cph_emit_key(w, "id");
    cph_emit_u64(w, m->id);
    cph_emit_key(w, "event_id");
    cph_emit_u64(w, m->event_id);
    cph_emit_key(w, "channel");
    cph_emit_str(w, m->channel);
    cph_emit_key(w, "sender");
    cph_emit_str(w, m->sender);
    cph_emit_key(w, "body");
    cph_emit_str(w, m->body);
    cph_emit_key(w, "mentioned");
    cph_emit_bool(w, m->mentioned);
    cph_emit_key(w, "ts_ms");
    cph_emit_i64(w, m->ts_ms);
    cph_emit_key(w, "count");
    cph_emit_u64(w, m->count);
    cph_emit_key(w, "event_ids");
    cph_emit_array(w, m->n_event_ids);
    for (size_t j = 0; j < m->n_event_ids; j++)
      cph_emit_u64(w, m->event_ids[j]);
    cph_emit_end(w);
    cph_emit_key(w, "last_ms");
    cph_emit_i64(w, m->last_ms);
    cph_emit_key(w, "fold");
    cph_emit_str(w, m->fold);
    cph_emit_end(w);
  }
  cph_emit_end(w);
}

static void staged_emit(cph_emit *w, const cph_turn_info *t) {
  staged_list_emit(w, t->staged, t->n_staged);
}

static void current_state_emit(cph_emit *w, const cph_turn_info *t) {
  cph_emit_object(w, 8);
  cph_emit_key(w, "lane");
  cph_emit_str(w, cph_lane_name(t->lane));
  cph_emit_key(w, "credits");
  cph_emit_real(w, t->current_state.credits);
  cph_emit_key(w, "turns_left");
  cph_emit_real(w, t->current_state.turns_left);
  cph_emit_key(w, "tool_calls_left");
  cph_emit_real(w, t->current_state.tool_calls_left);
  cph_emit_key(w, "state");
  cph_emit_str(w, cph_session_state_name(t->current_state.state));
  cph_emit_key(w, "episode");
  cph_emit_u64(w, t->episode);
  cph_emit_key(w, "turn_kind");
  cph_emit_str(w, cph_turn_kind_name(t->kind));
  cph_emit_key(w, "time_ms");
  cph_emit_i64(w, t->current_state.time_ms);
  cph_emit_end(w);
}

/* DESIGN §6: "per staged message, id, sender, preview (or none)". The window may hold fewer
 * than staged_count ("omitted" says how many are not listed). */
static void obligations_emit(cph_emit *w, const cph_turn_info *t) {
  bool omitted = t->n_obligations < t->n_staged;
  cph_emit_object(w, 2 + omitted);
  cph_emit_key(w, "staged_count");
  cph_emit_u64(w, t->n_staged);
  cph_emit_key(w, "messages");
  if (t->n_obligations) {
    cph_emit_array(w, t->n_obligations);
    for (size_t i = 0; i < t->n_obligations; i++) {
      cph_emit_object(w, 3);
      cph_emit_key(w, "id");
      cph_emit_u64(w, t->obligations[i].id);
      cph_emit_key(w, "sender");
      cph_emit_str(w, t->obligations[i].sender);
      cph_emit_key(w, "preview");
      cph_emit_str(w, t->obligations[i].preview);
      cph_emit_end(w);
    }
    cph_emit_end(w);
  } else {
    cph_emit_str(w, "none");
  }
  if (omitted) {
    cph_emit_key(w, "omitted");
    cph_emit_u64(w, t->n_staged - t->n_obligations);
  }
  cph_emit_end(w);
}

/* DESIGN §6: conversation_history is `none` on an autonomy tick (n_history == 0). */
static void history_emit(cph_emit *w, const cph_turn_info *t) {
  if (!t->n_history) {
    cph_emit_str(w, "none");
    return;
  }
  cph_emit_array(w, t->n_history);
  for (size_t i = 0; i < t->n_history; i++) {
    const cph_history_entry *e = &t->history[i];
    cph_emit_object(w, 5);
    cph_emit_key(w, "event_id");
    cph_emit_u64(w, e->event_id);
    cph_emit_key(w, "channel");
    cph_emit_str(w, e->channel);
    cph_emit_key(w, "sender");
    cph_emit_str(w, e->sender);
    cph_emit_key(w, "body");
    cph_emit_str(w, e->body);
    cph_emit_key(w, "ts_ms");
    cph_emit_i64(w, e->ts_ms);
    cph_emit_end(w);
  }
  cph_emit_end(w);
}

static void memories_emit(cph_emit *w, const cph_turn_info *t) {
  cph_emit_array(w, t->n_memories);
  for (size_t i = 0; i < t->n_memories; i++) {
    const cph_memory_item *m = &t->memories[i];
    cph_emit_object(w, 6);
    cph_emit_key(w, "id");
    cph_emit_u64(w, m->id);
    cph_emit_key(w, "kind");
    cph_emit_str(w, m->kind);
    cph_emit_key(w, "text");
    cph_emit_str(w, m->text);
    cph_emit_key(w, "session");
    cph_emit_str(w, m->scope);
    cph_emit_key(w, "created_ms");
    cph_emit_i64(w, m->created_ms);
    cph_emit_key(w, "access_count");
    cph_emit_u64(w, m->access_count);
    cph_emit_end(w);
  }
  cph_emit_end(w);
}

static void tools_emit(cph_emit *w, const cph_turn_info *t) {
  cph_emit_array(w, t->n_tools);
  for (size_t i = 0; i < t->n_tools; i++) {
    cph_emit_object(w, 3);
    cph_emit_key(w, "name");
    cph_emit_str(w, t->tools[i].name);
    cph_emit_key(w, "calls_this_turn");
    cph_emit_u64(w, t->tools[i].calls_this_turn);
    cph_emit_key(w, "calls_this_minute");
    cph_emit_u64(w, t->tools[i].calls_this_minute);
    cph_emit_end(w);
  }
  cph_emit_end(w);
}

static void messages_emit(cph_emit *w, const cph_turn_info *t) {
  cph_emit_array(w, t->n_messages);
  for (size_t i = 0; i < t->n_messages; i++) {
    const cph_message *m = &t->messages[i];
    cph_emit_object(w, m->name ? 4 : 3);
    cph_emit_key(w, "role");
    cph_emit_str(w, m->role);
    cph_emit_key(w, "content");
    cph_emit_str(w, m->content);
    cph_emit_key(w, "coord");
    cph_emit_str(w, m->coord);
    if (m->name) { /* OpenAI's participant name: user messages only */
      cph_emit_key(w, "name");
      cph_emit_str(w, m->name);
    }
    cph_emit_end(w);
  }
  cph_emit_end(w);
}

static void views_emit(cph_emit *w, const cph_turn_info *t) {
  cph_emit_array(w, t->n_views);
  for (size_t i = 0; i < t->n_views; i++) {
    const cph_channel_view *v = &t->views[i];
    cph_emit_object(w, 5);
    cph_emit_key(w, "channel");
    cph_emit_str(w, v->channel);
    cph_emit_key(w, "cursor");
    cph_emit_u64(w, v->cursor);
    cph_emit_key(w, "had_cursor");
    cph_emit_bool(w, v->had_cursor);
    cph_emit_key(w, "seen_index");
    cph_emit_u64(w, v->seen_index);
    cph_emit_key(w, "away");
    cph_emit_i64(w, v->away);
    cph_emit_end(w);
  }
  cph_emit_end(w);
}

/* The sections the answer carries, in their order (an object of 1 to 5 members). */
static void sections_emit(cph_emit *w, const cph_turn_info *t) {
  static const unsigned PARTS[] = {CPH_PART_CURRENT_STATE, CPH_PART_OBLIGATIONS,
                                   CPH_PART_HISTORY, CPH_PART_MEMORY, CPH_PART_TOOLS};
  size_t n = 0;
  for (size_t i = 0; i < sizeof PARTS / sizeof PARTS[0]; i++)
    n += has(t, PARTS[i]);
  cph_emit_object(w, n);
  if (has(t, CPH_PART_CURRENT_STATE)) {
    cph_emit_key(w, "current_state");
    current_state_emit(w, t);
  }
  if (has(t, CPH_PART_OBLIGATIONS)) {
    cph_emit_key(w, "pending_obligations");
    obligations_emit(w, t);
  }
  if (has(t, CPH_PART_HISTORY)) {
    cph_emit_key(w, "conversation_history");
    history_emit(w, t);
  }
  if (has(t, CPH_PART_MEMORY)) {
    cph_emit_key(w, "recent_memory");
    memories_emit(w, t);
  }
  if (has(t, CPH_PART_TOOLS)) {
    cph_emit_key(w, "available_tools");
    tools_emit(w, t);
  }
  cph_emit_end(w);
}

/* id, lease, session, lane, kind, episode, deadline_ms, attempts, tools_named: in every
 * answer, whatever `include` says. */
#define TURN_IDENTITY_MEMBERS 9

/* The turn: the identity fields always, each part unless the lease left it out; members in
 * the same order either way, so the default answer is the whole turn as it always was. */
static void turn_emit(cph_emit *w, const cph_turn_info *t) {
  bool sections = (t->omit & CPH_PART_SECTIONS) != CPH_PART_SECTIONS;
  /* while_running is there when it is not the default enqueue (so an enqueue turn's answer
   * is what it always was): merge -> the worker takes arrivals, interrupt -> it may stop. */
  bool wr = t->while_running != CPH_POLICY_WR_ENQUEUE;
  cph_emit_object(w, TURN_IDENTITY_MEMBERS + wr + has(t, CPH_PART_INPUT) + has(t, CPH_PART_STAGED) +
                         sections + has(t, CPH_PART_MESSAGES) + has(t, CPH_PART_VIEWS) +
                         has(t, CPH_PART_TOKENS));
  cph_emit_key(w, "id");
  cph_emit_u64(w, t->id);
  cph_emit_key(w, "lease");
  cph_emit_str(w, t->lease);
  cph_emit_key(w, "session");
  cph_emit_str(w, t->session);
  cph_emit_key(w, "lane");
  cph_emit_str(w, cph_lane_name(t->lane));
  cph_emit_key(w, "kind");
  cph_emit_str(w, cph_turn_kind_name(t->kind));
  if (has(t, CPH_PART_INPUT)) {
    cph_emit_key(w, "input");
    cph_emit_str(w, t->input);
  }
  cph_emit_key(w, "episode");
  cph_emit_u64(w, t->episode);
  cph_emit_key(w, "deadline_ms");
  cph_emit_i64(w, t->deadline_ms);
  cph_emit_key(w, "attempts");
  cph_emit_i64(w, t->attempts);
  cph_emit_key(w, "tools_named"); /* > 0: narrow the tools offered to available_tools */
  cph_emit_u64(w, t->n_tools_named);
  if (wr) {
    cph_emit_key(w, "while_running");
    cph_emit_str(w, cph_policy_while_running_name(t->while_running));
  }
  if (has(t, CPH_PART_STAGED)) {
    cph_emit_key(w, "staged");
    staged_emit(w, t);
  }
  if (sections) {
    cph_emit_key(w, "sections");
    sections_emit(w, t);
  }
  if (has(t, CPH_PART_MESSAGES)) {
    cph_emit_key(w, "messages");
    messages_emit(w, t);
  }
  if (has(t, CPH_PART_VIEWS)) {
    cph_emit_key(w, "channel_views");
    views_emit(w, t);
  }
  if (has(t, CPH_PART_TOKENS)) {
    cph_emit_key(w, "tokens");
    tokens_emit(w, t);
  }
  cph_emit_end(w);
}

/* ---------------------------------------------------------------- lease */

/* Cluster mode: a turn leased for a session whose shard this node no longer serves is handed
 * back at once (a fail that counts no attempt) and never reaches the worker; the session is
 * not picked here again until this node serves it again (its shard's rebuild, which retains
 * its inbox). */
typedef struct giveback {
  cph_op op;
  char why[64];
} giveback;

static void giveback_done(cph_op *op, void *ctx) {
  (void)ctx;
  cph_op_clear_results(op);
  free(op); /* op is the first member of its giveback */
}

static bool lease_misplaced(cph_req *r) {
  cph_srv *s = r->srv;
  const cph_turn_info *t = &r->op.u.lease.turn;
  if (!s->cluster || !t->session)
    return false;
  uint32_t shard = cph_cluster_shard_of(t->session, cph_cluster_shards(s->cluster));
  char node[8], url[8];
  if (cph_cluster_route(s->cluster, shard, node, sizeof node, url, sizeof url) ==
      CPH_CLUSTER_SERVED) {
    cph_cluster_note_turn(s->cluster, t->id, shard);
    return false;
  }
  giveback *g = calloc(1, sizeof *g);
  if (g) {
    snprintf(g->why, sizeof g->why, "cluster: shard %" PRIu32 " is not served by this node", shard);
    g->op.kind = CPH_OP_FAIL;
    g->op.done = giveback_done;
    g->op.u.turn.turn_id = t->id;
    memcpy(g->op.u.turn.lease, t->lease, sizeof g->op.u.turn.lease);
    g->op.u.turn.error = g->why;
    g->op.u.turn.away = true; /* not picked here again until this node serves it again */
    if (cph_engine_submit(s->engine, &g->op) == CPH_OK)
      cph_srv_schedule_pass(s);
    else
      free(g); /* the lease expires by its deadline instead */
  }
  return true;
}

/* The most a lease answer's buffer is sized up front (larger answers grow as they are
 * written). */
#define LEASE_HINT_MAX (4u << 20)

/* A lease answer of at least this many bytes (the last answer's size says) is written on a
 * request thread (offload.h); a smaller one costs the loop less than the hand-over. */
#define LEASE_OFFLOAD_MIN_BYTES (16u << 10)

/* Writes r's leased turn as its answer into *body, sized from hint. Reads only r's op. */
static void lease_write(const cph_req *r, size_t hint, cph_buf *body) {
  cph_buf_grow(body, hint < LEASE_HINT_MAX ? hint : LEASE_HINT_MAX); /* a failure sticks */
  cph_emit w;
  cph_emit_init(&w, body, r->msgpack_out);
  cph_emit_object(&w, 1);
  cph_emit_key(&w, "turn");
  turn_emit(&w, &r->op.u.lease.turn);
  cph_emit_end(&w);
}

/* Sends a written lease answer; the next answer's buffer is sized from it. */
static void lease_send(cph_req *r, cph_buf *body) {
  r->srv->lease_bytes_hint = body->len + body->len / 8 + 64; /* the newline, a larger turn */
  cph_reply_emitted(r, 200, body);
}

/* The lease's kept context, when the engine left it to us (u.lease.defer_keep): worked out and
 * written here, on the loop, before the lease is answered. */
static void lease_keep_here(cph_req *r) {
  if (r->op.u.lease.keep) {
    cph_keep_job_compute(r->op.u.lease.keep);
    cph_engine_keep_write(r->srv->engine, &r->op);
  }
}

typedef struct lease_job {
  size_t hint;
  cph_buf body;
} lease_job;

/* On a request thread: the answer, and the kept context's writes worked out beside it. */
static void lease_job_work(cph_req *r, void *arg, cph_event_hasher *h) {
  (void)h;
  lease_job *j = arg;
  lease_write(r, j->hint, &j->body);
  if (r->op.u.lease.keep)
    cph_keep_job_compute(r->op.u.lease.keep);
}

/* On the loop: the kept context written (a read after the answer sees it), then the answer. */
static void lease_job_done(cph_req *r, void *arg) {
  cph_engine_keep_write(r->srv->engine, &r->op);
  lease_send(r, &((lease_job *)arg)->body);
  cph_op_clear_results(&r->op);
  cph_req_end(r);
}

/* Hands the answer's writing to a request thread; false when it did not. */
static bool lease_offload(cph_req *r) {
  if (!r->srv->offload || r->srv->lease_bytes_hint < LEASE_OFFLOAD_MIN_BYTES)
    return false;
  lease_job *j = cph_req_alloc(r, sizeof *j);
  if (!j)
    return false; /* the loop writes the answer */
  *j = (lease_job){r->srv->lease_bytes_hint, CPH_BUF_INIT};
  static const cph_offload_fns fns = {lease_job_work, lease_job_done, NULL};
  r->answering = true;
  if (cph_offload_take(r->srv->offload, r, &fns, j))
    return true;
  r->answering = false;
  return false;
}

static void lease_done(cph_req *r) {
  cph_lp_finish(r->srv->lp, &r->srv->lp->leases, r);
  cph_op *op = &r->op;
  if (op->rc == CPH_OK && lease_misplaced(r)) {
    lease_keep_here(r);
    cph_reply_empty(r, 204);
  } else if (op->rc == CPH_OK) {
    if (lease_offload(r))
      return;
    cph_buf body = CPH_BUF_INIT;
    lease_write(r, r->srv->lease_bytes_hint, &body);
    lease_keep_here(r);
    lease_send(r, &body);
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
  cph_lp_finish(r->srv->lp, &r->srv->lp->leases, r);
  cph_reply_empty(r, 204);
  cph_req_end(r);
}

static void lease_fallback(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_lease_abandon(arg);
}

/* The names `include` takes: a top-level member of the turn, or one section ("sections" is
 * all five). */
static const struct {
  const char *name;
  unsigned parts;
} LEASE_PARTS[] = {
    {"input", CPH_PART_INPUT},
    {"staged", CPH_PART_STAGED},
    {"sections", CPH_PART_SECTIONS},
    {"sections.current_state", CPH_PART_CURRENT_STATE},
    {"sections.pending_obligations", CPH_PART_OBLIGATIONS},
    {"sections.conversation_history", CPH_PART_HISTORY},
    {"sections.recent_memory", CPH_PART_MEMORY},
    {"sections.available_tools", CPH_PART_TOOLS},
    {"messages", CPH_PART_MESSAGES},
    {"channel_views", CPH_PART_VIEWS},
    {"tokens", CPH_PART_TOKENS},
};
#define N_LEASE_PARTS (sizeof LEASE_PARTS / sizeof LEASE_PARTS[0])

/* `include` (an array of part names, absent = every part) as the parts left out; false with
 * a 400 naming the field "include" recorded. */
static bool lease_omit(cph_req *r, unsigned *omit) {
  json_t *include = NULL;
  *omit = 0;
  if (!cph_in_arr(r, r->body, "", "include", 0, &include))
    return false;
  if (!include)
    return true;
  unsigned all = 0, parts = 0;
  for (size_t k = 0; k < N_LEASE_PARTS; k++)
    all |= LEASE_PARTS[k].parts;
  for (size_t i = 0; i < json_array_size(include); i++) {
    const char *name = json_string_value(json_array_get(include, i));
    size_t k = 0;
    while (name && k < N_LEASE_PARTS && strcmp(name, LEASE_PARTS[k].name) != 0)
      k++;
    if (!name || k == N_LEASE_PARTS) {
      char names[320] = "";
      for (size_t j = 0; j < N_LEASE_PARTS; j++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s\"%s\"", j ? ", " : "",
                 LEASE_PARTS[j].name);
      cph_req_fail(r, 400, "bad_request", "include", "include[%zu] must be one of %s", i, names);
      return false;
    }
    parts |= LEASE_PARTS[k].parts;
  }
  *omit = all & ~parts;
  return true;
}

void cph_route_turn_lease(cph_req *r) {
  cph_srv *s = r->srv;
  const cph_policy *p = cph_engine_policy(s->engine);
  const char *worker = NULL;
  json_t *lanes = NULL;
  uint64_t wait_ms = 0;
  unsigned omit = 0;
  cph_in_str(r, r->body, "", "worker", CPH_IN_REQUIRED, &worker);
  lease_omit(r, &omit);
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
  if (s->cluster && !cph_cluster_serving(s->cluster)) {
    cph_reply_error(r, 503, "not_serving", NULL,
                    "this node serves no shard right now (joining, or its cluster lease "
                    "lapsed): retry shortly or lease from another node");
    return;
  }
  if (!cph_lp_acquire(s->lp, r, p->server.max_long_polls_per_client)) {
    cph_reply_error(r, 429, "too_many_requests", NULL,
                    "this client already holds %" PRId64 " long-polls "
                    "(:server :max-long-polls-per-client)",
                    p->server.max_long_polls_per_client);
    return;
  }
  cph_op *op = &r->op;
  op->u.lease.worker = (char *)worker; /* an input: the engine reads it only */
  op->u.lease.lanes = mask;
  op->u.lease.omit = omit;
  /* With request threads, the turn's kept context is worked out on one, beside the answer
   * (lease_job_work): the loop only writes it. */
  op->u.lease.defer_keep = s->offload != NULL;
  op->u.lease.deadline_ns = cph_clock_now(&s->clock) + (int64_t)wait_ms * CPH_NS_PER_MS;
  if (!cph_req_submit(r, CPH_OP_LEASE, lease_done)) {
    cph_lp_release(s->lp, r);
    return;
  }
  cph_lp_list_add(&s->lp->leases, r, cph_lease_abandon);
  cph_lp_watch(s->lp, r, cph_lease_abandon);
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
  cph_policy_while_running mode = r->op.u.turn.while_running;
  if (mode == CPH_POLICY_WR_MERGE || mode == CPH_POLICY_WR_INTERRUPT)
    json_object_set_new(body, "arrived", json_integer(r->op.u.turn.arrived));
  if (r->op.u.turn.interrupt)
    json_object_set_new(body, "interrupt", json_true());
  cph_reply_json(r, 200, body);
}

static void take_done(cph_req *r) {
  cph_op *op = &r->op;
  if (op->rc != CPH_OK) {
    cph_reply_rc(r, op->rc, op->err.msg, op->field);
    return;
  }
  cph_buf body = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &body, r->msgpack_out);
  cph_emit_object(&w, 2);
  cph_emit_key(&w, "id");
  cph_emit_u64(&w, op->u.turn.turn_id);
  cph_emit_key(&w, "taken");
  staged_list_emit(&w, op->u.turn.taken, op->u.turn.n_taken);
  cph_emit_end(&w);
  cph_reply_emitted(r, 200, &body);
}

void cph_route_turn_take(cph_req *r) {
  if (!turn_target(r, true)) {
    cph_reply_failure(r);
    return;
  }
  cph_req_submit(r, CPH_OP_TAKE, take_done);
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
  bool complete = r->op.kind == CPH_OP_COMPLETE;
  /* Cluster mode: the answer waits until the log holds the session's state after the turn
   * and the record of what the turn consumed (clusterflow.h, 11. and 6.). */
  if (complete && r->srv->cflow && (r->op.u.turn.consumed.count || r->op.u.turn.state)) {
    json_t *body = json_object();
    json_object_set_new(body, "id", cph_json_u64(r->op.u.turn.turn_id));
    json_object_set_new(body, "status", json_string(status));
    json_object_set_new(body, "already", json_boolean(r->op.u.turn.already));
    if (r->op.u.turn.items.n && r->op.u.turn.consumed_session)
      cph_cflow_items(r->srv->cflow, r->op.u.turn.consumed_session, &r->op.u.turn.items);
    if (r->op.u.turn.reply_written_channel && r->op.u.turn.consumed_session)
      cph_cflow_replied(r->srv->cflow, r->op.u.turn.consumed_session,
                        r->op.u.turn.reply_written_channel, r->op.u.turn.reply_body,
                        r->op.u.turn.reply_written_ms);
    cph_cflow_completed(r->srv->cflow, r, r->op.u.turn.consumed_session, &r->op.u.turn.consumed,
                        r->op.u.turn.state, r->op.u.turn.state_len, body);
    return;
  }
  /* Cluster mode: a failed or requeued turn's record goes into the log as an item
   * (clusterflow.h 13.); the answer does not wait for it. */
  if ((r->op.kind == CPH_OP_FAIL || r->op.kind == CPH_OP_REQUEUE) && r->srv->cflow &&
      r->op.u.turn.items.n && r->op.u.turn.consumed_session)
    cph_cflow_items(r->srv->cflow, r->op.u.turn.consumed_session, &r->op.u.turn.items);
  /* Cluster mode: a fail that parked its turn, and a requeue, answer once the log holds their
   * park or unpark mark (clusterflow.h 6.), so a node that takes the session over holds that
   * input parked, or staged, as this one does. */
  if ((r->op.kind == CPH_OP_FAIL || r->op.kind == CPH_OP_REQUEUE) && r->srv->cflow &&
      r->op.u.turn.park.session) {
    json_t *body = json_object();
    json_object_set_new(body, "id", cph_json_u64(r->op.u.turn.turn_id));
    json_object_set_new(body, "status", json_string(status));
    cph_cflow_parked(r->srv->cflow, r, r->op.kind == CPH_OP_FAIL, &r->op.u.turn.park, body);
    return;
  }
  /* Written straight out: one answer per cycle, where a jansson tree cost about 25K
   * instructions (bench/PROFILE.md). */
  cph_buf body = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &body, r->msgpack_out);
  cph_emit_object(&w, complete ? 3 : 2);
  cph_emit_key(&w, "id");
  cph_emit_u64(&w, r->op.u.turn.turn_id);
  cph_emit_key(&w, "status");
  cph_emit_str(&w, status);
  if (complete) {
    cph_emit_key(&w, "already");
    cph_emit_bool(&w, r->op.u.turn.already);
  }
  cph_emit_end(&w);
  cph_reply_emitted(r, 200, &body);
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

/* tool_stats.tools: {"NAME": {"calls", "invalid", "errors"}} — at most 256 tools, names of
 * 1..128 bytes. */
static void tool_stats_tools(cph_req *r, json_t *stats) {
  json_t *tools = NULL;
  cph_in_obj(r, stats, "tool_stats", "tools", 0, &tools);
  if (!tools || r->error.set)
    return;
  if (!json_is_object(tools)) {
    cph_req_fail(r, 400, "bad_request", "tool_stats.tools",
                 "tool_stats.tools must be an object of tool name to counts");
    return;
  }
  size_t n = json_object_size(tools);
  if (n > 256) {
    cph_req_fail(r, 400, "bad_request", "tool_stats.tools", "at most 256 tools, got %zu", n);
    return;
  }
  if (n == 0)
    return;
  cph_tool_stat_in *out = cph_req_alloc(r, n * sizeof *out);
  if (!out)
    return;
  const char *name;
  json_t *v;
  size_t i = 0;
  json_object_foreach(tools, name, v) {
    char path[160];
    snprintf(path, sizeof path, "tool_stats.tools.%.128s", name);
    size_t len = strlen(name);
    if (len == 0 || len > 128) {
      cph_req_fail(r, 400, "bad_request", "tool_stats.tools",
                   "a tool name must be 1 to 128 bytes");
      return;
    }
    if (!json_is_object(v)) {
      cph_req_fail(r, 400, "bad_request", path, "%s must be an object", path);
      return;
    }
    out[i].name = (char *)name; /* lives as long as the request body */
    cph_in_u64(r, v, path, "calls", 0, INT64_MAX, &out[i].calls);
    cph_in_u64(r, v, path, "invalid", 0, INT64_MAX, &out[i].invalid);
    cph_in_u64(r, v, path, "errors", 0, INT64_MAX, &out[i].errors);
    i++;
  }
  r->op.u.turn.tool_stats.tools = out;
  r->op.u.turn.tool_stats.n_tools = i;
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
    tool_stats_tools(r, stats);
  }
  cph_in_bool(r, r->body, "", "interrupted", 0, &op->u.turn.interrupted);
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

/* Cluster mode: the verdict on the shard of session (served here, or the owner into node and
 * url). Without the cluster: served. */
static cph_cluster_verdict session_route(cph_srv *s, const char *session, char *node,
                                         size_t node_size, char *url, size_t url_size) {
  if (!s->cluster || !session)
    return CPH_CLUSTER_SERVED;
  uint32_t shard = cph_cluster_shard_of(session, cph_cluster_shards(s->cluster));
  return cph_cluster_route(s->cluster, shard, node, node_size, url, url_size);
}

/* Cluster mode with the log: a parked turn of a session another node serves now is not
 * requeued here — its input moved with the session and is parked there, under that node's
 * turn id (clusterflow.h 8.), and this copy is stale (that node's rebuild parked it again, or
 * its requeue or completion took it on) — 409, naming the node. */
void cph_route_turn_requeue(cph_req *r) {
  if (!turn_target(r, false)) {
    cph_reply_failure(r);
    return;
  }
  cph_turn_record t = {0};
  cph_err err = {0};
  if (r->srv->cflow &&
      cph_engine_turn_record(r->srv->engine, r->op.u.turn.turn_id, &t, &err) == CPH_OK &&
      t.state && strcmp(t.state, "parked") == 0) {
    char node[256] = "", url[1024] = "";
    cph_cluster_verdict v =
        session_route(r->srv, t.session, node, sizeof node, url, sizeof url);
    if (v == CPH_CLUSTER_UNKNOWN)
      cph_reply_error(r, 503, "not_serving", NULL,
                      "turn %" PRIu64 " of session '%s' is parked here, but no live node serves "
                      "the session's shard right now: retry shortly",
                      r->op.u.turn.turn_id, t.session);
    else if (v == CPH_CLUSTER_ELSEWHERE)
      cph_reply_error(r, 409, "conflict", "id",
                      "turn %" PRIu64 " of session '%s' was parked here, but node %s (%s) serves "
                      "the session now and holds its parked input: requeue it there (GET "
                      "/v1/turns?state=parked there lists it)",
                      r->op.u.turn.turn_id, t.session, node, url);
    if (v != CPH_CLUSTER_SERVED) {
      cph_turn_record_free(&t);
      return;
    }
  }
  cph_turn_record_free(&t);
  cph_req_submit(r, CPH_OP_REQUEUE, requeue_done);
}

/* ---------------------------------------------------------------- records */

static json_t *record_json(const cph_turn_record *t) {
  json_t *o = json_object();
  json_object_set_new(o, "id", cph_json_u64(t->id));
  json_object_set_new(o, "session", cph_json_str(t->session));
  json_object_set_new(o, "lane", json_string(cph_lane_name(t->lane)));
  json_object_set_new(o, "kind", json_string(cph_turn_kind_name(t->kind)));
  json_object_set_new(o, "state", json_string(t->state));
  json_object_set_new(o, "worker", cph_json_str(t->worker));
  json_object_set_new(o, "episode", cph_json_u64(t->episode));
  json_object_set_new(o, "attempts", json_integer(t->attempts));
  json_object_set_new(o, "input", cph_json_str(t->input));
  json_object_set_new(o, "created_ms", json_integer(t->created_ms));
  json_object_set_new(o, "deadline_ms", json_integer(t->deadline_ms));
  json_object_set_new(o, "completed_ms", json_integer(t->completed_ms));
  json_t *cost = json_object();
  json_object_set_new(cost, "tokens", cph_json_u64(t->cost_tokens));
  json_object_set_new(cost, "tool_calls", cph_json_u64(t->tool_calls));
  json_object_set_new(o, "cost", cost);
  json_object_set_new(o, "error", cph_json_str(t->error));
  if (t->origin)
    json_object_set_new(o, "origin", json_string(t->origin));
  return o;
}

void cph_route_turn_get(cph_req *r) {
  if (!turn_target(r, false)) {
    cph_reply_failure(r);
    return;
  }
  cph_turn_record t;
  cph_err err = {0};
  int rc = cph_engine_turn_record(r->srv->engine, r->op.u.turn.turn_id, &t, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : NULL);
    return;
  }
  cph_reply_json(r, 200, record_json(&t));
  cph_turn_record_free(&t);
}

#define RECORDS_DEFAULT_LIMIT 100
#define RECORDS_MAX_LIMIT 1000

/* GET /v1/turns?session=S: the session's ended turns, on the node serving it. */
static void session_records(cph_req *r, const char *session) {
  uint64_t limit;
  if (!cph_query_u64(r, "limit", RECORDS_DEFAULT_LIMIT, RECORDS_MAX_LIMIT, &limit)) {
    cph_reply_failure(r);
    return;
  }
  if (r->srv->cluster && !cph_cluster_gate_id(r, "session", session))
    return;
  cph_turn_record *list = NULL;
  size_t n = 0;
  cph_err err = {0};
  int rc = cph_engine_session_turn_records(r->srv->engine, session,
                                           limit ? (size_t)limit : RECORDS_DEFAULT_LIMIT, &list,
                                           &n, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "session" : NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_array_append_new(arr, record_json(&list[i]));
    cph_turn_record_free(&list[i]);
  }
  free(list);
  json_t *body = json_object();
  json_object_set_new(body, "session", json_string(session));
  json_object_set_new(body, "turns", arr);
  cph_reply_json(r, 200, body);
}

/* ---------------------------------------------------------------- parked */

void cph_route_turns_list(cph_req *r) {
  const char *state = cph_req_query(r, "state");
  const char *session = cph_req_query(r, "session");
  if (session && state) {
    cph_reply_error(r, 400, "bad_request", "state",
                    "state and session do not go together: state=parked lists the parked turns "
                    "of every session, session= a session's ended turns");
    return;
  }
  if (session) {
    session_records(r, session);
    return;
  }
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
    char node[8], url[8];
    /* Cluster mode with the log: the parked turns of the sessions served here (the node
     * serving one holds its parked input: clusterflow.h 8.) */
    if (r->srv->cflow &&
        session_route(r->srv, t->session, node, sizeof node, url, sizeof url) !=
            CPH_CLUSTER_SERVED) {
      cph_parked_turn_free(&turns[i]);
      continue;
    }
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
