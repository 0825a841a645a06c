/* The outbound replies stream (DESIGN §9).
 *
 *   GET /v1/replies?after=&wait_ms=&limit=
 *     -> 200 {"replies": [{"id", "session", "channel", "body", "source_inbox_ids", "ts_ms",
 *             "origin"?}], "next", "stream"}
 *
 * stream: the stream's identity (core/replystream.h): a reader's cursor holds for one; when it
 * changes (the daemon started on another data directory, or on a copy of this one) the ids
 * start over, and the reader reads again from 0.
 *
 * origin, in cluster mode only: the reply's identity cluster-wide (core/replystream.h). A reply
 * a dead node wrote is offered again, under the same origin, by the node that took its session
 * over, so a connector reads every node's stream and drops an origin it delivered already.
 *
 * Long-poll: answered at once when a reply with id > after exists (or wait_ms is 0);
 * otherwise the request waits — without blocking the loop — until the engine reports a newer
 * reply (cph_engine_hooks.replies_appended, after commit, and a check after every pass) or
 * min(wait_ms, :max-wait-ms) passes, and then answers 200 with an empty list and
 * "next" = after. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdlib.h>

#include "longpoll.h"
#include "routes.h"
#include "server.h"

#define DEFAULT_LIMIT 100
#define MAX_LIMIT 1000
/* Waiters answered per loop callback (STYLE: cap work per callback); the rest follow. */
#define WAKE_BATCH 64

static void answer_now(cph_req *r) {
  cph_reply_info *list = NULL;
  size_t n = 0;
  uint64_t next = r->lp_after;
  cph_err err = {0};
  int rc = cph_engine_replies(r->srv->engine, r->lp_after, r->lp_limit, &list, &n, &next, &err);
  if (rc != CPH_OK) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    const cph_reply_info *ri = &list[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_u64(ri->id));
    json_object_set_new(o, "session", cph_json_str(ri->session));
    json_object_set_new(o, "channel", cph_json_str(ri->channel));
    json_object_set_new(o, "body", cph_json_str(ri->body));
    json_t *ids = json_array();
    for (size_t j = 0; j < ri->n_source_inbox_ids; j++)
      json_array_append_new(ids, cph_json_u64(ri->source_inbox_ids[j]));
    json_object_set_new(o, "source_inbox_ids", ids);
    json_object_set_new(o, "ts_ms", json_integer(ri->ts_ms));
    if (ri->origin) /* cluster mode only (server/clusterflow.h 11.) */
      json_object_set_new(o, "origin", cph_json_str(ri->origin));
    json_array_append_new(arr, o);
    cph_reply_info_free(&list[i]);
  }
  free(list);
  json_t *body = json_object();
  json_object_set_new(body, "replies", arr);
  json_object_set_new(body, "next", cph_json_u64(n ? next : r->lp_after));
  json_object_set_new(body, "stream", cph_json_str(cph_engine_replies_stream(r->srv->engine)));
  cph_reply_json(r, 200, body);
}

void cph_replies_answer(cph_req *r) {
  cph_lp_finish(r->srv->lp, &r->srv->lp->repliers, r);
  answer_now(r);
  cph_req_end(r);
}

static void replies_timeout(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_replies_answer(arg);
}

void cph_replies_wake(cph_srv *s) {
  uint64_t last = cph_engine_last_reply_id(s->engine);
  int answered = 0;
  for (cph_req *r = s->lp->repliers, *next; r; r = next) {
    next = r->lp_next;
    if (r->lp_after >= last)
      continue;
    if (answered == WAKE_BATCH) {
      cph_srv_wake_replies_later(s);
      return;
    }
    cph_replies_answer(r);
    answered++;
  }
}

void cph_route_replies(cph_req *r) {
  cph_srv *s = r->srv;
  const cph_policy *p = cph_engine_policy(s->engine);
  uint64_t after, wait_ms, limit;
  if (!cph_query_u64(r, "after", 0, INT64_MAX, &after) ||
      !cph_query_u64(r, "wait_ms", 0, UINT32_MAX, &wait_ms) ||
      !cph_query_u64(r, "limit", DEFAULT_LIMIT, MAX_LIMIT, &limit)) {
    cph_reply_failure(r);
    return;
  }
  r->lp_after = after;
  r->lp_limit = limit ? (size_t)limit : DEFAULT_LIMIT;
  if ((int64_t)wait_ms > p->server.max_wait_ms)
    wait_ms = (uint64_t)p->server.max_wait_ms;
  if (wait_ms == 0 || cph_engine_last_reply_id(s->engine) > after) {
    answer_now(r);
    return;
  }
  if (!cph_lp_acquire(s->lp, r, p->server.max_long_polls_per_client)) {
    cph_reply_error(r, 429, "too_many_requests", NULL,
                    "this client already holds %" PRId64 " long-polls "
                    "(:server :max-long-polls-per-client)",
                    p->server.max_long_polls_per_client);
    return;
  }
  r->lp_timer = evtimer_new(s->base, replies_timeout, r);
  struct timeval tv = {(time_t)(wait_ms / 1000), (suseconds_t)(wait_ms % 1000) * 1000};
  if (!r->lp_timer || evtimer_add(r->lp_timer, &tv) != 0) {
    cph_lp_release(s->lp, r);
    cph_reply_error(r, 500, "internal", NULL, "cannot arm the long-poll timer");
    return;
  }
  r->async = true;
  cph_lp_list_add(&s->lp->repliers, r, cph_replies_answer);
  cph_lp_watch(s->lp, r, cph_replies_answer);
}
