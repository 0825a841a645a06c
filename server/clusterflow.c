/* Cluster mode: events through the replicated log — accept, apply, forward (clusterflow.h). */
#include "clusterflow.h"

#include <event2/event.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster.h"
#include "clusterlog.h"
#include "clustertable.h"
#include "common/hmap.h"
#include "common/log.h"
#include "reply.h"
#include "server.h"

#define INGEST_DEADLINE_MS 10000
#define FWD_DEADLINE_MS 10000
#define SESSION_DEADLINE_MS 30000
#define RETRY_MS 100
#define APPLY_BATCH 512
#define SWEEP_MS 1000
#define SWEEP_PAGE 500
#define SWEEP_DELAY_MS 3000 /* after the log is ready: the watch has delivered the table */
#define CHANNEL_MAX 256     /* as the engine's (core/ingest.c) */
#define KEY_MAX 256

typedef enum pub_kind { PUB_INGEST, PUB_FWD, PUB_SESSION } pub_kind;
typedef enum ev_status { EV_ACCEPTED, EV_DUPLICATE, EV_REJECTED } ev_status;

typedef struct ingest_req ingest_req;
typedef struct applying applying;

/* One message on its way into the log, retried with the same id until its deadline. */
typedef struct pub {
  char key[24]; /* ref in decimal: its key in cph_cflow.pubs */
  uint64_t ref;
  pub_kind kind;
  char *subject, *msgid, *data;
  size_t len;
  bool kv_delete;
  int sends;
  bool in_map;
  int64_t deadline_ns, retry_at_ns;
  struct pub *next_retry;
  ingest_req *ir; /* PUB_INGEST: the request and the event's index */
  size_t index;
  applying *ap; /* PUB_FWD: the applied message it forwards */
} pub;

typedef struct ev_result {
  ev_status status;
  uint64_t pos;
  const char *reason, *field;
} ev_result;

/* A POST /v1/events waiting for the log. */
struct ingest_req {
  cph_req *r;
  size_t n;
  ev_result *res;
  size_t outstanding, failed;
  char why[256];
  ingest_req *prev, *next;
};

/* A delivered message being applied; lives until acknowledged or released. */
struct applying {
  cph_clog_msg *m;
  json_t *doc;
  cph_event_in ev;    /* strings point into doc */
  size_t outstanding; /* forwards not yet acknowledged */
  bool failed;
};

typedef struct apply_batch {
  cph_op op;
  struct cph_cflow *f;
  applying **items;
  cph_event_in *events;
  size_t n;
  struct apply_batch *next; /* the blocked list (the engine was busy) */
} apply_batch;

struct cph_cflow {
  cph_srv *s;
  cph_clog *log; /* NULL after quiesce */
  char node[101];
  uint64_t boot, minted, next_ref;
  cph_hmap pubs;
  pub *retry_head;
  struct event *ev_retry;  /* RETRY_MS: retries and blocked batches */
  struct event *ev_submit; /* zero delay: submit the forming batch */
  struct event *ev_sweep;  /* SWEEP_MS: the record sweep (sweep_records) */
  char sweep_after[160];   /* the sweep's cursor: the last session id it looked at */
  int64_t ready_since_ns;  /* when the log was first seen ready (0: not yet) */
  apply_batch *forming;
  apply_batch *blocked_head, *blocked_tail;
  ingest_req *reqs;
  cph_ctable *table; /* the session table (clustertable.h) */
  uint64_t applied, forwarded, apply_failures;
  bool quiesced;
  bool started;      /* the log was started (libnats is open) */
  uint64_t *adopted; /* per shard: the binding whose sessions were adopted (adopt_shard) */
};

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void on_session_entry(void *ctx, const char *session, const char *value, size_t vlen) {
  cph_cflow *f = ctx;
  if (!cph_ctable_record(f->table, session, value, vlen))
    cph_warn("cluster log: session record of \"%s\" not taken (malformed or out of memory)",
             session);
}

/* ================================================================ publishing */

static void pub_free(pub *p) {
  free(p->subject);
  free(p->msgid);
  free(p->data);
  free(p);
}

static void arm_retry(cph_cflow *f) {
  if (!evtimer_pending(f->ev_retry, NULL)) {
    struct timeval tv = {0, RETRY_MS * 1000};
    evtimer_add(f->ev_retry, &tv);
  }
}

static void pub_outcome(cph_cflow *f, pub *p, bool ok, uint64_t seq, bool dup, const char *why);

/* Sends p again after RETRY_MS (a JetStream leader election takes a moment: resending at once
 * would only spin). */
static void pub_retry_later(cph_cflow *f, pub *p) {
  p->retry_at_ns = mono_ns() + RETRY_MS * 1000000LL;
  p->next_retry = f->retry_head;
  f->retry_head = p;
  arm_retry(f);
}

/* Sends p (again); a refusal now (not connected, too much in flight) is retried later. */
static void pub_send(cph_cflow *f, pub *p) {
  int rc = CPH_EBUSY;
  if (f->log && !p->in_map && cph_hmap_put(&f->pubs, p->key, p) == CPH_OK) {
    p->in_map = true;
    /* no answer later than the deadline: the request is answered on time */
    int64_t left_ms = (p->deadline_ns - mono_ns()) / 1000000;
    rc = cph_clog_publish(f->log, p->subject, p->msgid, p->data, p->len, p->kv_delete, left_ms,
                          p->ref);
    if (rc == CPH_OK) {
      p->sends++;
      return;
    }
    cph_hmap_del(&f->pubs, p->key);
    p->in_map = false;
  }
  if (mono_ns() >= p->deadline_ns) {
    pub_outcome(f, p, false, 0, false,
                rc == CPH_EBUSY ? "not connected to NATS, or too many publishes in flight"
                                : "out of memory");
    return;
  }
  pub_retry_later(f, p);
}

static pub *pub_new(cph_cflow *f, pub_kind kind, const char *subject, const char *msgid, char *data,
                    size_t len, int64_t deadline_ms) {
  pub *p = calloc(1, sizeof *p);
  if (!p) {
    free(data);
    return NULL;
  }
  p->ref = ++f->next_ref;
  snprintf(p->key, sizeof p->key, "%" PRIu64, p->ref);
  p->kind = kind;
  p->subject = strdup(subject);
  p->msgid = msgid ? strdup(msgid) : NULL;
  p->data = data;
  p->len = len;
  p->deadline_ns = mono_ns() + deadline_ms * 1000000LL;
  if (!p->subject || (msgid && !p->msgid) || !data) {
    pub_free(p);
    return NULL;
  }
  return p;
}

static void on_published(void *ctx, uint64_t ref, int rc, uint64_t seq, bool dup, const char *why) {
  cph_cflow *f = ctx;
  char key[24];
  snprintf(key, sizeof key, "%" PRIu64, ref);
  pub *p = cph_hmap_del(&f->pubs, key);
  if (!p)
    return;
  p->in_map = false;
  if (rc == CPH_OK) {
    pub_outcome(f, p, true, seq, dup, NULL);
    return;
  }
  cph_debug("cluster log: publish to %s failed (%s); retrying", p->subject, why ? why : "?");
  if (mono_ns() >= p->deadline_ns) {
    pub_outcome(f, p, false, 0, false, why);
    return;
  }
  pub_retry_later(f, p); /* the same message id: stored once however often it is sent */
}

/* ================================================================ accepting (1.) */

static void ingest_answer(cph_cflow *f, ingest_req *ir) {
  cph_req *r = ir->r;
  if (ir->failed) {
    cph_reply_error(r, 503, "unavailable", NULL,
                    "the cluster log (NATS JetStream) did not acknowledge %zu of the %zu events "
                    "within %d s (%s); some may have been stored: retry them with the same keys "
                    "(a stored one answers duplicate)",
                    ir->failed, ir->n, INGEST_DEADLINE_MS / 1000, ir->why);
  } else {
    json_t *results = json_array();
    for (size_t i = 0; i < ir->n; i++) {
      ev_result *e = &ir->res[i];
      json_t *o = json_pack("{snsss[]}", "id", "status",
                            e->status == EV_ACCEPTED    ? "accepted"
                            : e->status == EV_DUPLICATE ? "duplicate"
                                                        : "rejected",
                            "sessions");
      if (e->status == EV_REJECTED) {
        json_object_set_new(o, "reason", json_string(e->reason));
        json_object_set_new(o, "field", json_string(e->field));
      } else {
        json_object_set_new(o, "pos", json_integer((json_int_t)e->pos));
      }
      json_array_append_new(results, o);
    }
    cph_reply_json(r, 200, json_pack("{so}", "results", results));
  }
  if (r->async) {
    if (ir->prev)
      ir->prev->next = ir->next;
    else
      f->reqs = ir->next;
    if (ir->next)
      ir->next->prev = ir->prev;
    cph_req_end(r);
  }
  free(ir->res);
  free(ir);
}

static void reject(ev_result *e, const char *field, const char *reason) {
  e->status = EV_REJECTED;
  e->field = field;
  e->reason = reason;
}

/* The checks of the engine's ingest (core/ingest.c), in its order; true when e was rejected.
 * A named session must be in the session table. */
static bool check_event(cph_cflow *f, const cph_event_in *in, ev_result *e) {
  if (!in->body)
    reject(e, "body", "body is required");
  else if (!in->sender || !*in->sender)
    reject(e, "sender", "sender is required");
  else if (in->session && !cph_ctable_get(f->table, in->session))
    reject(e, "session", "no such session");
  else if (!in->channel && !in->session)
    reject(e, "channel", "an event needs a channel or a session");
  else if (in->channel && (!*in->channel || strlen(in->channel) > CHANNEL_MAX))
    reject(e, "channel", "a channel name is 1 to 256 bytes");
  else if (!in->channel && strlen(in->session) + 7 > CHANNEL_MAX)
    reject(e, "channel", "a channel name is 1 to 256 bytes");
  else if (in->key && (!*in->key || strlen(in->key) > KEY_MAX))
    reject(e, "key", "an idempotency key is 1 to 256 bytes");
  else
    return false;
  return true;
}

static json_t *strv_json(const cph_strv *v) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < v->count; i++)
    if (v->items[i])
      json_array_append_new(a, json_string(v->items[i]));
  return a;
}

void cph_cflow_ingest(cph_req *r, cph_event_in *events, size_t n) {
  cph_cflow *f = r->srv->cflow;
  if (f->quiesced) {
    cph_reply_error(r, 503, "unavailable", NULL, "cephalond is shutting down");
    return;
  }
  ingest_req *ir = calloc(1, sizeof *ir);
  if (!ir || !(ir->res = calloc(n ? n : 1, sizeof *ir->res))) {
    free(ir);
    cph_reply_error(r, 500, "internal", NULL, "out of memory");
    return;
  }
  ir->r = r;
  ir->n = n;
  uint32_t shards = cph_cluster_shards(r->srv->cluster);
  pub **pubs = calloc(n ? n : 1, sizeof *pubs);
  if (!pubs)
    goto nomem;
  for (size_t i = 0; i < n; i++) {
    cph_event_in *in = &events[i];
    if (check_event(f, in, &ir->res[i]))
      continue;
    char msgid[320];
    if (in->key)
      snprintf(msgid, sizeof msgid, "%s", in->key);
    else
      snprintf(msgid, sizeof msgid, "%s.%" PRIx64 ".%" PRIu64, f->node, f->boot, ++f->minted);
    json_t *doc = json_pack("{sssssssI}", "sender", in->sender, "body", in->body, "key", msgid,
                            "ts_ms", (json_int_t)(in->ts_ms ? in->ts_ms : cph_wall_ms()));
    if (doc && in->channel)
      json_object_set_new(doc, "channel", json_string(in->channel));
    if (doc && in->session)
      json_object_set_new(doc, "session", json_string(in->session));
    if (doc && in->kind)
      json_object_set_new(doc, "kind", json_string(in->kind));
    if (doc && in->mentions.count)
      json_object_set_new(doc, "mentions", strv_json(&in->mentions));
    char *data = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    char subject[64];
    cph_clog_subject(subject, sizeof subject,
                     cph_cluster_shard_of(in->session ? in->session : in->channel, shards), false);
    pubs[i] = data ? pub_new(f, PUB_INGEST, subject, msgid, data, strlen(data), INGEST_DEADLINE_MS)
                   : NULL;
    if (!pubs[i])
      goto nomem;
    pubs[i]->ir = ir;
    pubs[i]->index = i;
    ir->outstanding++;
  }
  if (!ir->outstanding) {
    free(pubs);
    ingest_answer(f, ir);
    return;
  }
  r->async = true;
  ir->next = f->reqs;
  if (f->reqs)
    f->reqs->prev = ir;
  f->reqs = ir;
  for (size_t i = 0; i < n; i++)
    if (pubs[i])
      pub_send(f, pubs[i]); /* may answer (a deadline of 0 never passes here) */
  free(pubs);
  return;
nomem:
  for (size_t i = 0; pubs && i < n; i++)
    if (pubs[i])
      pub_free(pubs[i]);
  free(pubs);
  free(ir->res);
  free(ir);
  cph_reply_error(r, 500, "internal", NULL, "out of memory");
}

/* ================================================================ applying (2.) and
 * forwarding (3.) */

static void applying_free(applying *ap) {
  json_decref(ap->doc);
  free(ap->ev.mentions.items);
  free(ap);
}

static void applying_finish(cph_cflow *f, applying *ap) {
  if (f->log && !f->quiesced && !ap->failed)
    cph_clog_ack(f->log, ap->m);
  else
    cph_clog_release(f->log, ap->m);
  applying_free(ap);
}

static const char *jstr(json_t *doc, const char *key) {
  return json_string_value(json_object_get(doc, key));
}

/* Decodes a message into ap->ev; false when it is not one of ours. */
static bool decode_event(applying *ap) {
  json_t *d = ap->doc;
  cph_event_in *ev = &ap->ev;
  ev->channel = (char *)jstr(d, "channel");
  ev->sender = (char *)jstr(d, "sender");
  ev->body = (char *)jstr(d, "body");
  ev->session = (char *)jstr(d, "session");
  ev->kind = (char *)jstr(d, "kind");
  ev->key = (char *)jstr(d, "key");
  ev->only_session = true; /* the others hear it through the log (forward) */
  json_t *ts = json_object_get(d, "ts_ms");
  ev->ts_ms = json_is_integer(ts) ? json_integer_value(ts) : 0;
  json_t *m = json_object_get(d, "mentions");
  size_t n = json_array_size(m);
  if (n) {
    ev->mentions.items = calloc(n, sizeof(char *));
    if (!ev->mentions.items)
      return false;
    for (size_t i = 0; i < n; i++)
      if (json_is_string(json_array_get(m, i)))
        ev->mentions.items[ev->mentions.count++] = (char *)json_string_value(json_array_get(m, i));
  }
  return ev->key && ev->sender && ev->body && (ev->channel || ev->session);
}

typedef struct target {
  const char *id;
  uint32_t shard;
  bool mentioned;
} target;

/* A mention: a new target, or the subscriber it already is, now mentioned. */
static void add_mention(target *ts, size_t *n, const cph_ctable_session *r) {
  for (size_t i = 0; i < *n; i++)
    if (ts[i].id == r->id) {
      ts[i].mentioned = true;
      return;
    }
  ts[(*n)++] = (target){r->id, r->shard, true};
}

/* The engine key of a forward: "f:" + hex SHA-256 of its message id (within 256 bytes). */
static void forward_key(const char *msgid, char out[67]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(msgid, strlen(msgid), md, &len, EVP_sha256(), NULL);
  out[0] = 'f';
  out[1] = ':';
  for (unsigned i = 0; i < 32; i++)
    snprintf(out + 2 + 2 * i, 3, "%02x", md[i]);
}

/* Publishes the forwards of an applied `in` event; the message is acknowledged when they all
 * were (applying_finish). Every session the event is routed to other than its named session —
 * the channel's subscribers when it names none, and the mentioned sessions — gets it as a
 * forward through the log, wherever it lives, this node included: the engine applied the `in`
 * event with only_session, so it reached no one else. So the log's deduplication of
 * `<id>/<S>` is what makes each delivery happen once, also when the event is applied again
 * (a redelivery, or the shard's next owner after a death). */
static void forward(cph_cflow *f, applying *ap) {
  cph_event_in *ev = &ap->ev;
  const char *const *subscribers = NULL;
  size_t n_subscribers =
      !ev->session && ev->channel ? cph_ctable_subscribers(f->table, ev->channel, &subscribers) : 0;
  size_t cap = n_subscribers + ev->mentions.count;
  target *ts = calloc(cap ? cap : 1, sizeof *ts);
  size_t n = 0;
  if (!ts) {
    ap->failed = true;
    applying_finish(f, ap);
    return;
  }
  for (size_t i = 0; i < n_subscribers; i++) { /* a channel lists each session once */
    const cph_ctable_session *r = cph_ctable_get(f->table, subscribers[i]);
    if (r)
      ts[n++] = (target){r->id, r->shard, false};
  }
  for (size_t i = 0; i < ev->mentions.count; i++) {
    const cph_ctable_session *r = cph_ctable_get(f->table, ev->mentions.items[i]);
    if (r && !(ev->session && strcmp(ev->session, r->id) == 0)) /* the named one has it */
      add_mention(ts, &n, r);
  }
  char direct[300];
  const char *channel = ev->channel;
  if (!channel) {
    snprintf(direct, sizeof direct, "direct:%s", ev->session);
    channel = direct;
  }
  ap->outstanding = n + 1; /* + 1 until every forward is sent */
  for (size_t i = 0; i < n; i++) {
    size_t idlen = strlen(ev->key) + 1 + strlen(ts[i].id) + 1;
    char *msgid = malloc(idlen);
    char key[67];
    char *data = NULL;
    if (msgid) {
      snprintf(msgid, idlen, "%s/%s", ev->key, ts[i].id);
      forward_key(msgid, key);
      json_t *doc =
          json_pack("{sssssssssssI}", "channel", channel, "sender", ev->sender, "body", ev->body,
                    "session", ts[i].id, "key", key, "ts_ms", (json_int_t)ev->ts_ms);
      if (doc && ev->kind)
        json_object_set_new(doc, "kind", json_string(ev->kind));
      if (doc && ts[i].mentioned)
        json_object_set_new(doc, "mentions", json_pack("[s]", ts[i].id));
      data = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
      json_decref(doc);
    }
    char subject[64];
    cph_clog_subject(subject, sizeof subject, ts[i].shard, true);
    pub *p = msgid && data
                 ? pub_new(f, PUB_FWD, subject, msgid, data, strlen(data), FWD_DEADLINE_MS)
                 : (free(data), NULL);
    free(msgid);
    if (!p) {
      ap->failed = true;
      continue;
    }
    p->ap = ap;
    pub_send(f, p);
  }
  free(ts);
  if (--ap->outstanding == 0)
    applying_finish(f, ap);
}

static void pub_outcome(cph_cflow *f, pub *p, bool ok, uint64_t seq, bool dup, const char *why) {
  switch (p->kind) {
  case PUB_INGEST: {
    ingest_req *ir = p->ir;
    ev_result *e = &ir->res[p->index];
    if (ok) {
      /* A duplicate on a resend is our own earlier send: accepted. */
      e->status = dup && p->sends == 1 ? EV_DUPLICATE : EV_ACCEPTED;
      e->pos = seq;
    } else {
      ir->failed++;
      snprintf(ir->why, sizeof ir->why, "%s", why ? why : "no answer");
    }
    if (--ir->outstanding == 0)
      ingest_answer(f, ir);
    break;
  }
  case PUB_FWD:
    if (ok)
      f->forwarded++;
    else {
      cph_warn("cluster log: forward %s not acknowledged (%s); the event comes again", p->msgid,
               why ? why : "no answer");
      p->ap->failed = true;
    }
    if (--p->ap->outstanding == 0)
      applying_finish(f, p->ap);
    break;
  case PUB_SESSION:
    if (!ok)
      cph_error("cluster log: the record of a session (%s) was not taken by the log: %s; "
                "other nodes do not see its change",
                p->subject, why ? why : "no answer");
    break;
  }
  pub_free(p);
}

static void batch_free(apply_batch *b) {
  free(b->items);
  free(b->events);
  free(b);
}

static void apply_done(cph_op *op, void *ctx) {
  apply_batch *b = ctx;
  cph_cflow *f = b->f;
  bool ok = op->rc == CPH_OK && !f->quiesced;
  if (op->rc != CPH_OK && !f->quiesced) {
    f->apply_failures++;
    cph_warn("cluster log: applying %zu messages failed (%s); they come again", b->n,
             op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
  }
  for (size_t i = 0; i < b->n; i++) {
    applying *ap = b->items[i];
    if (!ok) {
      ap->failed = true;
      applying_finish(f, ap);
      continue;
    }
    f->applied++;
    cph_event_result *res = op->u.ingest.results ? &op->u.ingest.results[i] : NULL;
    if (res && res->status == CPH_EV_REJECTED && res->reason &&
        strcmp(res->reason, "session_busy") != 0)
      cph_warn("cluster log: message %" PRIu64 " of shard %" PRIu32 " rejected by the engine: %s",
               ap->m->seq, ap->m->shard, res->reason);
    if (ap->m->fwd)
      applying_finish(f, ap);
    else
      forward(f, ap);
  }
  cph_op_clear_results(op);
  batch_free(b);
}

/* The batch's engine operation: one ingest of its events, answered to apply_done. */
static void batch_op_init(apply_batch *b) {
  memset(&b->op, 0, sizeof b->op);
  b->op.kind = CPH_OP_INGEST;
  b->op.done = apply_done;
  b->op.ctx = b;
  b->op.u.ingest.events = b->events;
  b->op.u.ingest.n_events = b->n;
}

static void batch_submit(cph_cflow *f, apply_batch *b) {
  batch_op_init(b);
  int rc = cph_engine_submit(f->s->engine, &b->op);
  if (rc == CPH_OK) {
    cph_srv_schedule_pass(f->s);
    return;
  }
  /* The engine's queue is full: again on the next retry tick, in order. */
  b->next = NULL;
  if (f->blocked_tail)
    f->blocked_tail->next = b;
  else
    f->blocked_head = b;
  f->blocked_tail = b;
  arm_retry(f);
}

static void submit_forming(cph_cflow *f) {
  apply_batch *b = f->forming;
  f->forming = NULL;
  if (!b)
    return;
  if (f->blocked_head) { /* keep the order behind the blocked ones */
    b->next = NULL;
    f->blocked_tail->next = b;
    f->blocked_tail = b;
    return;
  }
  batch_submit(f, b);
}

static void on_submit(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (!f->quiesced) /* stopping: the forming batch is released by cph_cflow_free */
    submit_forming(f);
}

/* ---------------------------------------------------------------- adopting a shard's sessions
 *
 * A node that starts applying a shard (it took the shard over, or bound to it again) first
 * creates, from the session table, the sessions of that shard its engine does not have: the
 * state they had on their previous owner (inbox, history, credits, context) does not move, but
 * from then on events reach them here. The creation is queued before the batch holding the
 * shard's first message, so the engine applies it first. */

typedef struct adopt_op {
  cph_op op;
  json_t *def; /* the strings of op.u.session.in point into it */
  char *id;
} adopt_op;

static void strv_from(json_t *a, cph_strv *out) {
  size_t n = json_array_size(a);
  out->items = n ? calloc(n, sizeof(char *)) : NULL;
  out->count = 0;
  for (size_t i = 0; out->items && i < n; i++)
    if (json_is_string(json_array_get(a, i)))
      out->items[out->count++] = (char *)json_string_value(json_array_get(a, i));
}

static void adopt_free(adopt_op *a) {
  free(a->op.u.session.in.subscribe.items);
  free(a->op.u.session.in.member.items);
  free(a->op.u.session.in.tools.items);
  json_decref(a->def);
  free(a->id);
  free(a);
}

static void adopt_done(cph_op *op, void *ctx) {
  adopt_op *a = ctx;
  if (op->rc == CPH_OK)
    cph_info("cluster log: adopted session %s from the session table (its state on its previous "
             "node did not move)",
             a->id);
  else if (op->rc != CPH_EEXISTS)
    cph_warn("cluster log: adopting session %s failed: %s", a->id,
             op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
  cph_op_clear_results(op);
  adopt_free(a);
}

/* Queues the creation of one session from its definition; false when the engine refused. */
static bool adopt_one(cph_cflow *f, const cph_ctable_session *r) {
  adopt_op *a = calloc(1, sizeof *a);
  if (!a || !(a->id = strdup(r->id))) {
    free(a);
    return false;
  }
  a->def = json_incref(r->def);
  cph_session_info *in = &a->op.u.session.in;
  in->id = a->id;
  if (cph_lane_parse(json_string_value(json_object_get(r->def, "class")), &in->lane) != CPH_OK)
    in->lane = CPH_LANE_INTERACTIVE;
  strv_from(json_object_get(r->def, "subscribe"), &in->subscribe);
  strv_from(json_object_get(r->def, "member"), &in->member);
  strv_from(json_object_get(r->def, "tools"), &in->tools);
  in->autonomy_interval_s =
      (uint32_t)json_integer_value(json_object_get(r->def, "autonomy_interval_s"));
  in->report_interval_s =
      (uint32_t)json_integer_value(json_object_get(r->def, "report_interval_s"));
  in->context_window_tokens =
      (uint32_t)json_integer_value(json_object_get(r->def, "context_window_tokens"));
  in->system = (char *)json_string_value(json_object_get(r->def, "system"));
  in->tenant = (char *)json_string_value(json_object_get(r->def, "tenant"));
  const char *wr = json_string_value(json_object_get(r->def, "while_running"));
  in->while_running_class = !wr || cph_policy_while_running_parse(wr, &in->while_running) != CPH_OK;
  a->op.u.session.set = CPH_SET_WHILE_RUNNING;
  if (json_is_true(json_object_get(r->def, "paused"))) {
    in->state = CPH_STATE_PAUSED;
    a->op.u.session.set |= CPH_SET_PAUSED;
  }
  a->op.kind = CPH_OP_SESSION_CREATE;
  a->op.done = adopt_done;
  a->op.ctx = a;
  if (cph_engine_submit(f->s->engine, &a->op) != CPH_OK) {
    adopt_free(a);
    return false;
  }
  return true;
}

/* Adopts the sessions of shard that this engine lacks; false when one could not be queued
 * (try again with the next message). */
static bool adopt_shard(cph_cflow *f, uint32_t shard) {
  bool ok = true, queued = false;
  for (const cph_ctable_session *r = cph_ctable_shard_first(f->table, shard); r;
       r = r->shard_next) {
    if (!r->def)
      continue;
    cph_session_info have = {0};
    cph_err err = {0};
    int rc = cph_engine_get_session(f->s->engine, r->id, &have, &err);
    if (rc == CPH_OK)
      cph_session_info_free(&have);
    else if (rc == CPH_ENOTFOUND && adopt_one(f, r))
      queued = true;
    else if (rc == CPH_ENOTFOUND)
      ok = false;
  }
  if (queued)
    cph_srv_schedule_pass(f->s);
  return ok;
}

static void on_message(void *ctx, cph_clog_msg *m) {
  cph_cflow *f = ctx;
  char node[8], url[8];
  if (cph_cluster_route(f->s->cluster, m->shard, node, sizeof node, url, sizeof url) !=
      CPH_CLUSTER_SERVED) {
    cph_clog_release(f->log, m); /* no longer ours: the next owner gets it */
    return;
  }
  if (f->adopted[m->shard] != m->bind_gen) { /* the first message of this binding */
    if (!adopt_shard(f, m->shard)) {
      cph_clog_release(f->log, m); /* the engine is busy: this message comes again */
      return;
    }
    f->adopted[m->shard] = m->bind_gen;
  }
  applying *ap = calloc(1, sizeof *ap);
  if (!ap) {
    cph_clog_release(f->log, m);
    return;
  }
  ap->m = m;
  ap->doc = json_loadb(m->data, m->len, 0, NULL);
  if (!ap->doc || !decode_event(ap)) {
    cph_error("cluster log: message %" PRIu64 " of shard %" PRIu32
              " is not an event; acknowledged and skipped",
              m->seq, m->shard);
    applying_finish(f, ap);
    return;
  }
  if (!f->forming) {
    apply_batch *b = calloc(1, sizeof *b);
    if (b) {
      b->f = f;
      b->items = calloc(APPLY_BATCH, sizeof *b->items);
      b->events = calloc(APPLY_BATCH, sizeof *b->events);
    }
    if (!b || !b->items || !b->events) {
      if (b)
        batch_free(b);
      ap->failed = true;
      applying_finish(f, ap);
      return;
    }
    f->forming = b;
  }
  apply_batch *b = f->forming;
  b->items[b->n] = ap;
  b->events[b->n] = ap->ev;
  b->n++;
  if (b->n == APPLY_BATCH)
    submit_forming(f);
  else if (!evtimer_pending(f->ev_submit, NULL)) {
    struct timeval zero = {0, 0};
    evtimer_add(f->ev_submit, &zero);
  }
}

static void on_retry(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (f->quiesced)
    return;
  while (f->blocked_head) {
    apply_batch *b = f->blocked_head;
    f->blocked_head = b->next;
    if (!f->blocked_head)
      f->blocked_tail = NULL;
    batch_op_init(b);
    if (cph_engine_submit(f->s->engine, &b->op) != CPH_OK) {
      b->next = f->blocked_head;
      f->blocked_head = b;
      if (!f->blocked_tail)
        f->blocked_tail = b;
      break;
    }
    cph_srv_schedule_pass(f->s);
  }
  int64_t now = mono_ns();
  pub *due = NULL, **pp = &f->retry_head;
  while (*pp) {
    pub *p = *pp;
    if (p->retry_at_ns <= now) {
      *pp = p->next_retry;
      p->next_retry = due;
      due = p;
    } else {
      pp = &p->next_retry;
    }
  }
  while (due) {
    pub *p = due;
    due = p->next_retry;
    pub_send(f, p);
  }
  if (f->retry_head || f->blocked_head)
    arm_retry(f);
}

/* ================================================================ sessions (4.) */

/* The definition a new owner creates the session from (adopt below): what POST /v1/sessions
 * takes, nothing of its state. */
static json_t *session_def(const cph_session_info *in) {
  return json_pack(
      "{sssosososIsIsIsosososo}", "class", cph_lane_name(in->lane), "subscribe",
      strv_json(&in->subscribe), "member", strv_json(&in->member), "tools", strv_json(&in->tools),
      "autonomy_interval_s", (json_int_t)in->autonomy_interval_s, "report_interval_s",
      (json_int_t)in->report_interval_s, "context_window_tokens",
      (json_int_t)in->context_window_tokens, "system",
      in->system ? json_string(in->system) : json_null(), "tenant",
      in->tenant ? json_string(in->tenant) : json_null(), "while_running",
      in->while_running_class ? json_null()
                              : json_string(cph_policy_while_running_name(in->while_running)),
      "paused", json_boolean(in->state == CPH_STATE_PAUSED));
}

void cph_cflow_session_changed(cph_cflow *f, const char *session, const cph_session_info *now) {
  if (f->quiesced)
    return;
  char subject[700];
  if (cph_clog_session_subject(subject, sizeof subject, session) != CPH_OK)
    return;
  char *data;
  if (now) {
    json_t *def = session_def(now);
    json_t *doc =
        def ? json_pack("{sOso}", "subscribe", json_object_get(def, "subscribe"), "def", def)
            : NULL;
    data = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    if (data)
      cph_ctable_put(f->table, session, (const char *const *)now->subscribe.items,
                     now->subscribe.count, def);
    json_decref(doc);
  } else {
    data = strdup("");
    cph_ctable_remove(f->table, session);
  }
  pub *p =
      data ? pub_new(f, PUB_SESSION, subject, NULL, data, strlen(data), SESSION_DEADLINE_MS) : NULL;
  if (!p) {
    cph_error("cluster log: out of memory publishing the record of session \"%s\"", session);
    return;
  }
  p->kv_delete = now == NULL;
  pub_send(f, p);
}

/* ---------------------------------------------------------------- the record sweep
 *
 * Every second the node looks at the next SWEEP_PAGE of its engine's sessions (in id order,
 * wrapping around) and publishes the record of each one on a shard it serves that the table
 * does not know, or knows without a definition: sessions created before the log was
 * configured (a cluster that ran without :nats), and records the log never took (their
 * publish gave up after 30 s). Once the table is whole it publishes nothing; reading a page
 * is one engine list call on the loop. The built-in janitor is skipped: each node has its own. */
static void on_sweep(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (f->quiesced || !f->log)
    return;
  struct timeval tv = {SWEEP_MS / 1000, (SWEEP_MS % 1000) * 1000};
  evtimer_add(f->ev_sweep, &tv);
  if (!cph_clog_ready(f->log)) {
    f->ready_since_ns = 0;
    return;
  }
  if (!f->ready_since_ns)
    f->ready_since_ns = mono_ns();
  if (mono_ns() - f->ready_since_ns < SWEEP_DELAY_MS * 1000000LL)
    return;
  cph_session_filter flt = {0};
  flt.after = f->sweep_after[0] ? f->sweep_after : NULL;
  flt.limit = SWEEP_PAGE;
  cph_session_info *page = NULL;
  size_t n = 0;
  cph_err err = {0};
  if (cph_engine_list_sessions(f->s->engine, &flt, &page, &n, &err) != CPH_OK)
    return;
  cph_cluster *c = f->s->cluster;
  char node[8], url[8];
  bool janitor = cph_engine_policy(f->s->engine)->sessions.janitor;
  for (size_t i = 0; i < n; i++) {
    if (janitor && strcmp(page[i].id, "janitor") == 0)
      continue; /* every node has its own (:sessions :janitor?): not a session of the cluster */
    const cph_ctable_session *known = cph_ctable_get(f->table, page[i].id);
    uint32_t shard = cph_cluster_shard_of(page[i].id, cph_cluster_shards(c));
    if ((!known || !known->def) &&
        cph_cluster_route(c, shard, node, sizeof node, url, sizeof url) == CPH_CLUSTER_SERVED) {
      cph_info("cluster log: publishing the record of session %s (the session table lacked it)",
               page[i].id);
      cph_cflow_session_changed(f, page[i].id, &page[i]);
    }
  }
  if (n == SWEEP_PAGE)
    snprintf(f->sweep_after, sizeof f->sweep_after, "%s", page[n - 1].id);
  else
    f->sweep_after[0] = '\0'; /* the end: from the start again */
  for (size_t i = 0; i < n; i++)
    cph_session_info_free(&page[i]);
  free(page);
}

/* ================================================================ lifetime */

int cph_cflow_start(cph_srv *s, cph_cflow **out, cph_err *err) {
  *out = NULL;
  const cph_policy *pol = cph_engine_policy(s->engine);
  cph_cflow *f = calloc(1, sizeof *f);
  if (!f) {
    cph_err_set(err, CPH_ENOMEM, "out of memory");
    return CPH_ENOMEM;
  }
  f->s = s;
  snprintf(f->node, sizeof f->node, "%s", pol->cluster.node);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  f->boot = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
  f->adopted = calloc((size_t)pol->cluster.shards, sizeof *f->adopted);
  f->table = cph_ctable_new((uint32_t)pol->cluster.shards);
  f->ev_retry = evtimer_new(s->base, on_retry, f);
  f->ev_submit = evtimer_new(s->base, on_submit, f);
  f->ev_sweep = evtimer_new(s->base, on_sweep, f);
  if (!f->adopted || !f->table || !f->ev_retry || !f->ev_submit || !f->ev_sweep) {
    cph_cflow_free(f);
    cph_err_set(err, CPH_ENOMEM, "out of memory");
    return CPH_ENOMEM;
  }
  cph_clog_hooks hooks = {f, on_published, on_message, on_session_entry};
  int64_t window = pol->cluster.log_dedupe_seconds ? pol->cluster.log_dedupe_seconds
                                                   : pol->dedupe.key_window_seconds;
  int rc = cph_clog_start(&pol->cluster, window, s->cluster, s->base,
                          &hooks, &f->log, err);
  if (rc != CPH_OK) {
    cph_cflow_free(f);
    return rc;
  }
  f->started = true;
  struct timeval first = {SWEEP_MS / 1000, (SWEEP_MS % 1000) * 1000};
  evtimer_add(f->ev_sweep, &first);
  *out = f;
  return CPH_OK;
}

void cph_cflow_quiesce(cph_cflow *f) {
  if (!f || f->quiesced)
    return;
  f->quiesced = true;
  while (f->reqs) {
    ingest_req *ir = f->reqs;
    f->reqs = ir->next;
    cph_reply_error(ir->r, 503, "unavailable", NULL,
                    "cephalond is stopping before the cluster log acknowledged these events: "
                    "retry them (with the same keys, a stored one answers duplicate)");
    cph_req_end(ir->r);
    ir->r = NULL;
    /* ir stays reachable from its pubs, freed with them */
  }
  cph_clog_stop(f->log);
  f->log = NULL;
}

void cph_cflow_free(cph_cflow *f) {
  if (!f)
    return;
  cph_cflow_quiesce(f);
  /* Pubs still waiting (in the map or the retry list), and the requests they belong to. */
  ingest_req **irs = NULL;
  size_t n_irs = 0;
  pub *all = f->retry_head;
  for (size_t i = 0; i < f->pubs.cap; i++)
    if (f->pubs.slots[i].key) {
      pub *p = f->pubs.slots[i].value;
      p->next_retry = all;
      all = p;
    }
  while (all) {
    pub *p = all;
    all = p->next_retry;
    if (p->kind == PUB_INGEST && p->ir && --p->ir->outstanding == 0) {
      ingest_req **g = realloc(irs, (n_irs + 1) * sizeof *g);
      if (g) {
        irs = g;
        irs[n_irs++] = p->ir;
      }
    }
    if (p->kind == PUB_FWD && --p->ap->outstanding == 0)
      applying_finish(f, p->ap);
    pub_free(p);
  }
  for (size_t i = 0; i < n_irs; i++) {
    free(irs[i]->res);
    free(irs[i]);
  }
  free(irs);
  cph_hmap_free(&f->pubs);
  apply_batch *b = f->blocked_head;
  if (f->forming) {
    f->forming->next = b;
    b = f->forming;
  }
  while (b) {
    apply_batch *next = b->next;
    for (size_t i = 0; i < b->n; i++) {
      b->items[i]->failed = true;
      applying_finish(f, b->items[i]);
    }
    batch_free(b);
    b = next;
  }
  cph_ctable_free(f->table);
  if (f->ev_retry)
    event_free(f->ev_retry);
  if (f->ev_submit)
    event_free(f->ev_submit);
  if (f->ev_sweep)
    event_free(f->ev_sweep);
  bool started = f->started;
  free(f->adopted);
  free(f);
  if (started) /* every message is released by now */
    cph_clog_close_library();
}

int cph_cflow_metrics(cph_cflow *f, cph_buf *out) {
  cph_clog_stats st = {0};
  if (f->log)
    cph_clog_get_stats(f->log, &st);
  size_t waiting = 0;
  for (ingest_req *ir = f->reqs; ir; ir = ir->next)
    waiting++;
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"cephalon_cluster_log_ready", "gauge",
       "1 while connected to NATS with the log's stream and bucket in place."},
      {"cephalon_cluster_log_shards_bound", "gauge",
       "Shards whose log consumer this node is bound to (it applies their messages)."},
      {"cephalon_cluster_log_published_total", "counter",
       "Messages this node sent to the log: events, forwards, session records, resends."},
      {"cephalon_cluster_log_delivered_total", "counter",
       "Messages the log delivered to this node."},
      {"cephalon_cluster_log_applied_total", "counter",
       "Log messages this node applied to its engine."},
      {"cephalon_cluster_log_forwarded_total", "counter",
       "Forwards to sessions on other shards that the log acknowledged."},
      {"cephalon_cluster_log_apply_failures_total", "counter",
       "Batches of log messages the engine failed to apply (they come again)."},
      {"cephalon_cluster_log_in_flight", "gauge", "Publishes not yet acknowledged by the log."},
      {"cephalon_cluster_log_waiting_requests", "gauge",
       "POST /v1/events requests waiting for the log's acknowledgement."},
      {"cephalon_cluster_sessions_known", "gauge",
       "Sessions in this node's copy of the cluster's session table."},
  };
  const uint64_t v[] = {st.ready,          st.bound,
                        st.published,      st.delivered,
                        f->applied,        f->forwarded,
                        f->apply_failures, (uint64_t)(st.in_flight > 0 ? st.in_flight : 0),
                        waiting,           cph_ctable_count(f->table)};
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
    cph_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", fam[i].name, fam[i].help,
                   fam[i].name, fam[i].type, fam[i].name, (unsigned long long)v[i]);
  return cph_buf_error(out);
}

json_t *cph_cflow_json(cph_cflow *f) {
  json_t *o = f->log ? cph_clog_json(f->log) : json_pack("{ss}", "state", "stopped");
  if (!o)
    return NULL;
  json_object_set_new(o, "sessions_known", json_integer((json_int_t)cph_ctable_count(f->table)));
  json_object_set_new(o, "applied", json_integer((json_int_t)f->applied));
  json_object_set_new(o, "forwarded", json_integer((json_int_t)f->forwarded));
  size_t waiting = 0;
  for (ingest_req *ir = f->reqs; ir; ir = ir->next)
    waiting++;
  json_object_set_new(o, "waiting_requests", json_integer((json_int_t)waiting));
  return o;
}
