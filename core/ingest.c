/* Ingest (DESIGN §4, §5, §7): validation, idempotency keys, content dedupe and families,
 * per-channel backpressure effects, routing, the per-session queue cap, the channel history,
 * memories minted from events, and poll_inbox (pending -> staged, in memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backpressure.h"
#include "dedupe.h"
#include "engine_internal.h"
#include "metrics.h"

#define CHANNEL_MAX 256
#define NOTICE_SENDER "cephalon"
#define NOTICE_KIND "aggregate"

const char *cph_ingest_status_name(cph_ingest_status s) {
  switch (s) {
  case CPH_EV_QUEUED: return "queued";
  case CPH_EV_STORED: return "stored";
  case CPH_EV_DUPLICATE: return "duplicate";
  case CPH_EV_AGGREGATED: return "aggregated";
  case CPH_EV_REJECTED: return "rejected";
  }
  return "unknown";
}

/* Appends event_id to the channel's history under the next per-channel index. */
int history_append(cph_engine *e, cph_txn *t, const char *channel_name, uint64_t event_id) {
  (void)e;
  char counter[CHANNEL_MAX + 8];
  snprintf(counter, sizeof counter, "chan:%s", channel_name);
  uint64_t index;
  int rc = cph_txn_next_id(t, counter, &index);
  if (rc)
    return rc;
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, channel_name);
  cph_key_u64(&k, index);
  uint8_t v[8];
  cph_be64_put(v, event_id);
  return cph_txn_put(t, CPH_DB_CHANNEL_LOG, &k, v, sizeof v);
}

static cph_key inbox_key(const char *session, uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, id);
  return k;
}

static int put_inbox(cph_txn *t, const char *session, const inbox_item *it, uint8_t status) {
  cph_inbox_rec r = {(char *)session, it->id, it->event_id, status, it->mentioned, it->turn_id,
                     it->attempts, it->created_ms};
  cph_key k = inbox_key(session, it->id);
  return cph_txn_put_record(t, CPH_DB_INBOX, &k, &cph_inbox_desc, &r);
}

/* The engine-side record of where this event goes. */
typedef struct target {
  csession *session;
  bool mentioned;
  bool direct; /* named by the event (explicit session or mention), not only subscribed */
  uint64_t inbox_id;
  int32_t drop_index; /* inbox index to drop for the queue cap, -1 none */
} target;

static void reject(cph_event_result *res, const char *field, const char *why) {
  res->status = CPH_EV_REJECTED;
  res->field = strdup(field);
  res->reason = strdup(why);
}

static bool add_target(target *ts, size_t *n, size_t cap, csession *s, bool mentioned,
                       bool direct) {
  for (size_t i = 0; i < *n; i++)
    if (ts[i].session == s) {
      ts[i].mentioned |= mentioned;
      ts[i].direct |= direct;
      return true;
    }
  if (*n == cap)
    return false;
  ts[(*n)++] = (target){s, mentioned, direct, 0, -1};
  return true;
}

/* §4 queue cap: the oldest un-mentioned pending message goes (or, when every pending message
 * is a mention, the oldest pending one). */
static int32_t pick_drop(const csession *s) {
  int32_t oldest_pending = -1;
  for (uint32_t i = 0; i < s->n_inbox; i++) {
    if (s->inbox[i].status != CPH_INBOX_PENDING)
      continue;
    if (!s->inbox[i].mentioned)
      return (int32_t)i;
    if (oldest_pending < 0)
      oldest_pending = (int32_t)i;
  }
  return oldest_pending;
}

/* Writes one inbox message per target (and the queue cap's drops) in t.
 *
 * A new message is pending in memory until poll_inbox stages it, but it is written `staged`
 * at once: poll_inbox runs later in the same pass, inside the same pass transaction, so no
 * committed state ever held it pending, and writing it a second time only to flip its status
 * cost one put per message. A message that ingest_notice adds after this pass's poll
 * (reconcile runs last) is staged in memory by the next pass; a crash before then brings it
 * back staged, as if that poll had run before the crash. Records written `pending` by older
 * versions still load pending and are staged by the first pass. */
static void targets_write(cph_engine *e, cph_txn *t, target *ts, size_t n, uint64_t event_id,
                          int64_t now_ms) {
  int64_t max_queue = e->policy->sessions.max_queue;
  for (size_t i = 0; i < n; i++) {
    csession *s = ts[i].session;
    cph_txn_next_id(t, "inbox", &ts[i].inbox_id);
    inbox_item it = {ts[i].inbox_id, event_id, CPH_INBOX_PENDING, ts[i].mentioned, 0, 0, now_ms};
    put_inbox(t, s->id, &it, CPH_INBOX_STAGED);
    if ((int64_t)s->n_pending + 1 > max_queue) {
      ts[i].drop_index = pick_drop(s);
      if (ts[i].drop_index >= 0)
        put_inbox(t, s->id, &s->inbox[ts[i].drop_index], CPH_INBOX_DROPPED);
    }
  }
}

/* What targets_apply changed in one session, so that a failed request can put it back. */
typedef struct target_undo {
  csession *session;
  uint64_t inbox_id; /* the message pushed */
  bool dropped;      /* and the one the queue cap dropped for it */
  inbox_item drop;
} target_undo;

typedef struct undo_log {
  target_undo *items;
  size_t n, cap;
} undo_log;

/* After the writes of targets_write: the sessions' live inboxes follow. With undo, every
 * change is logged first (CPH_ENOMEM, changing nothing, when the log cannot grow). */
static int targets_apply(cph_engine *e, const target *ts, size_t n, uint64_t event_id,
                         int64_t now_ms, cph_event_result *res, undo_log *undo) {
  if (undo && undo->n + n > undo->cap) {
    size_t cap = undo->cap ? undo->cap : 64;
    while (cap < undo->n + n)
      cap *= 2;
    target_undo *items = realloc(undo->items, cap * sizeof *items);
    if (!items)
      return CPH_ENOMEM;
    undo->items = items;
    undo->cap = cap;
  }
  if (res)
    res->sessions.items = calloc(n ? n : 1, sizeof(char *));
  for (size_t i = 0; i < n; i++) {
    csession *s = ts[i].session;
    target_undo *u = undo ? &undo->items[undo->n++] : NULL;
    if (u)
      *u = (target_undo){s, ts[i].inbox_id, false, {0}};
    if (ts[i].drop_index >= 0) {
      if (u) {
        u->dropped = true;
        u->drop = s->inbox[ts[i].drop_index];
      }
      csession_inbox_remove(s, (uint32_t)ts[i].drop_index);
      s->dropped++;
      e->dropped_total++;
    }
    inbox_item it = {ts[i].inbox_id, event_id, CPH_INBOX_PENDING, ts[i].mentioned, 0, 0, now_ms};
    csession_inbox_push(s, &it);
    engine_mark_pending(e, s);
    if (res && res->sessions.items)
      res->sessions.items[res->sessions.count++] = strdup(s->id);
  }
  return CPH_OK;
}

/* Puts the live inboxes back as they were before the logged changes, newest first. A session
 * left in the pending list finds nothing to stage: harmless. */
static void targets_undo(cph_engine *e, undo_log *undo) {
  while (undo->n) {
    target_undo *u = &undo->items[--undo->n];
    csession *s = u->session;
    for (uint32_t j = s->n_inbox; j-- > 0;)
      if (s->inbox[j].id == u->inbox_id) {
        csession_inbox_remove(s, j);
        break;
      }
    if (u->dropped) {
      csession_inbox_push(s, &u->drop); /* keeps id order: back where it was */
      s->dropped--;
      e->dropped_total--;
    }
  }
}

/* Looks up an idempotency key: its event id if seen within the window. */
static bool idem_seen(cph_engine *e, cph_txn *t, const char *key, uint64_t *id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, key);
  cph_val v;
  if (k.overflow || cph_txn_get(t, CPH_DB_IDEM_KEYS, &k, &v) != CPH_OK || v.len != 16)
    return false;
  int64_t at = (int64_t)cph_be64_get((const uint8_t *)v.data + 8);
  if (cph_wall_ms() - at > e->policy->dedupe.key_window_seconds * 1000)
    return false;
  *id = cph_be64_get(v.data);
  return true;
}

/* Mints the memories an event gives (DESIGN §7): a raw memory scoped to its channel for a
 * non-duplicate on a channel that is not aggregate-only; one aggregate memory per family,
 * when the family is created. Embeddings per backpressure_embed_allowed(). */
static void mint_memories(cph_engine *e, cph_txn *t, const char *channel_name, int step, bool raw,
                          const dedupe_verdict *v, const char *body, uint64_t event_id) {
  char scope[CHANNEL_MAX + 2];
  snprintf(scope, sizeof scope, "%c%s", CPH_CHANNEL_SCOPE_PREFIX, channel_name);
  if (raw && *body)
    memory_mint(e, t, scope, CPH_MEMORY_RAW, body, event_id,
                backpressure_embed_allowed(e, step, false), NULL);
  if (v->family_created && v->sample) {
    size_t len = strlen(v->sample) + strlen(channel_name) + 48;
    char *text = malloc(len);
    if (!text)
      return;
    snprintf(text, len, "[aggregate] repeated in #%s: %s", channel_name, v->sample);
    memory_mint(e, t, scope, CPH_MEMORY_AGGREGATE, text, event_id,
                backpressure_embed_allowed(e, step, true), NULL);
    free(text);
  }
}

/* What the backpressure bookkeeping learns of an accepted event, once its request
 * committed. */
typedef struct ingest_after {
  const char *chan; /* the event's channel (borrowed) or chan_owned */
  char *chan_owned; /* "direct:<session>" */
  uint64_t family;  /* the family it joined, 0 none */
  bool coalesce;
  const char *body;
  int64_t dd_now;
} ingest_after;

/* One request's ingest: its events' writes share one child txn of the pass; memory follows
 * each event as soon as its writes are in (the next event of the request must see it: near
 * duplicates, the queue cap) and is put back if the request fails. */
typedef struct ingest_req {
  cph_txn t;
  undo_log undo;
  ingest_after *after; /* per event */
  uint64_t embed_queue_before;
} ingest_req;

/* One event, written in the request's txn. Returns CPH_OK (the result says accepted or
 * rejected), or the error that fails the whole request (then err says why).
 *
 * Order: validation -> idempotency key (`duplicate`, stored once) -> content dedupe
 * (`aggregated`: stored with its hash, joins a family, staged to nobody, kept out of the
 * channel history so contexts do not fill with repeats) -> the channel's backpressure step:
 * aggregate-only stages only to explicit targets and mentions and counts the event into the
 * subscribers' next aggregate notice; step 5 stores an event staged to nobody without its
 * body. Memory (sessions, dedupe rings) follows only once every write of the event is in. */
static int ingest_one(cph_engine *e, ingest_req *rq, cph_event_in *in, cph_event_result *res,
                      ingest_after *after, cph_err *err) {
  memset(res, 0, sizeof *res);
  if (!in->body) {
    reject(res, "body", "body is required");
    return CPH_OK;
  }
  if (!in->sender || !*in->sender) {
    reject(res, "sender", "sender is required");
    return CPH_OK;
  }
  csession *explicit_target = NULL;
  if (in->session) {
    explicit_target = engine_session(e, in->session);
    if (!explicit_target) {
      reject(res, "session", "no such session");
      return CPH_OK;
    }
  }
  char direct[160];
  const char *channel_name = in->channel;
  if (!channel_name) {
    if (!in->session) {
      reject(res, "channel", "an event needs a channel or a session");
      return CPH_OK;
    }
    snprintf(direct, sizeof direct, "direct:%s", in->session);
    channel_name = direct;
  }
  if (!*channel_name || strlen(channel_name) > CHANNEL_MAX) {
    reject(res, "channel", "a channel name is 1 to 256 bytes");
    return CPH_OK;
  }
  if (in->key && (!*in->key || strlen(in->key) > 256)) {
    reject(res, "key", "an idempotency key is 1 to 256 bytes");
    return CPH_OK;
  }

  cph_txn *t = &rq->t;
  uint64_t original;
  if (in->key && idem_seen(e, t, in->key, &original)) {
    res->status = CPH_EV_DUPLICATE;
    res->id = original;
    return CPH_OK;
  }

  int step = backpressure_step(e, channel_name);
  int64_t dd_now = dedupe_now_ms(e);
  dedupe_verdict v;
  if (dedupe_classify(e, t, channel_name, in->sender, in->body, dd_now,
                      step >= BP_STEP_WIDEN_DEDUPE ? BP_DEDUPE_WIDEN : 1, &v) != CPH_OK) {
    dedupe_verdict_free(&v);
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  }
  bool dup = v.kind != DEDUPE_NONE;
  bool aggregate_only = step >= BP_STEP_AGGREGATE_ONLY;

  /* Routing: the explicit session, else the channel's subscribers; plus every mention. A
   * duplicate goes to nobody; on an aggregate-only channel only the sessions the event names
   * get it now. */
  size_t cap = 64;
  channel *ch = engine_channel(e, channel_name, false);
  if (!explicit_target && ch)
    cap += ch->n_subscribers;
  cap += in->mentions.count;
  target local[8];
  target *ts = cap <= 8 ? local : malloc(cap * sizeof *ts);
  size_t n = 0;
  if (!ts) {
    dedupe_verdict_free(&v);
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  }
  if (!dup) {
    if (explicit_target)
      add_target(ts, &n, cap, explicit_target, false, true);
    else if (ch && !aggregate_only)
      for (size_t i = 0; i < ch->n_subscribers; i++) /* a subscriber list has no repeats */
        ts[n++] = (target){ch->subscribers[i], false, false, 0, -1};
    for (size_t i = 0; i < in->mentions.count; i++) {
      csession *m = in->mentions.items[i] ? engine_session(e, in->mentions.items[i]) : NULL;
      if (m)
        add_target(ts, &n, cap, m, true, true); /* mentions of unknown sessions reach nobody */
    }
  }
  /* The subscribers hear of it through the channel's next aggregate notice instead. */
  bool coalesce = aggregate_only && !explicit_target && ch && ch->n_subscribers;
  bool aggregated = !n && (dup || aggregate_only);

  uint64_t event_id = 0;
  int64_t now_ms = cph_wall_ms();
  cph_txn_next_id(t, "event", &event_id);
  int rc = dedupe_write(e, t, channel_name, in->body, event_id, dd_now, &v);
  if (rc && !t->ret) { /* out of memory building the family */
    rc = cph_err_set(err, rc, "out of memory");
    goto done;
  }
  cph_event_rec ev = {0};
  ev.id = event_id;
  ev.channel = (char *)channel_name;
  ev.sender = in->sender;
  ev.body = step >= BP_STEP_DROP_PAYLOADS && !n ? NULL : in->body; /* hash + metadata stay */
  ev.session = in->session;
  ev.mentions = in->mentions.items;
  ev.n_mentions = (uint32_t)in->mentions.count;
  ev.kind = in->kind;
  ev.key = in->key;
  ev.ts_ms = in->ts_ms ? in->ts_ms : now_ms;
  ev.received_ms = now_ms;
  ev.status = n ? CPH_EVENT_QUEUED : aggregated ? CPH_EVENT_AGGREGATED : CPH_EVENT_STORED;
  memcpy(ev.body_sha256, v.sha256, sizeof ev.body_sha256);
  ev.simhash = v.simhash;
  ev.family = v.family;
  cph_key ek;
  cph_key_reset(&ek);
  cph_key_u64(&ek, event_id);
  cph_txn_put_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  if (!aggregated)
    history_append(e, t, channel_name, event_id);
  if (in->key) {
    cph_key kk;
    cph_key_reset(&kk);
    cph_key_str(&kk, in->key);
    uint8_t kv[16];
    cph_be64_put(kv, event_id);
    cph_be64_put(kv + 8, (uint64_t)now_ms);
    cph_txn_put(t, CPH_DB_IDEM_KEYS, &kk, kv, sizeof kv);
  }
  mint_memories(e, t, channel_name, step, !dup && !aggregate_only, &v, in->body, event_id);
  targets_write(e, t, ts, n, event_id, now_ms);
  if (t->ret) {
    /* Storage full and friends: the request fails with the store's error (507 for a full
     * map) and none of its events is stored. */
    rc = cph_err_set(err, t->ret, "%s", t->err.msg);
    goto done;
  }
  if (channel_name == direct && !(after->chan_owned = strdup(direct))) {
    rc = cph_err_set(err, CPH_ENOMEM, "out of memory");
    goto done;
  }
  rc = targets_apply(e, ts, n, event_id, now_ms, res, &rq->undo);
  if (rc) {
    rc = cph_err_set(err, rc, "out of memory");
    goto done;
  }

  /* Every write of the event is in: memory follows (put back if the request fails). */
  dedupe_commit(e, channel_name, event_id, dd_now, &v);
  after->chan = after->chan_owned ? after->chan_owned : channel_name;
  after->family = dup ? v.family : 0;
  after->coalesce = coalesce;
  after->body = in->body;
  after->dd_now = dd_now;
  res->id = event_id;
  res->status = n ? CPH_EV_QUEUED : aggregated ? CPH_EV_AGGREGATED : CPH_EV_STORED;
done:
  dedupe_verdict_free(&v);
  if (ts != local)
    free(ts);
  return rc;
}

/* Ingest stops while less than 1/INGEST_RESERVE_DIV of the map (at least INGEST_RESERVE_MIN,
 * at most half the map) is free, so that on a full store leases, completions and maintenance
 * still find room to write (DESIGN §11: a full disk fails ingest, not workers). A completion
 * of a full 64-message turn writes some 100 KiB, copies on write included. */
#define INGEST_RESERVE_DIV 16
#define INGEST_RESERVE_MIN ((size_t)8 << 20)
/* What one event may write besides twice its body (event and memory): its vector, keys and
 * the other records. Only an estimate, to space out the looks at the store. */
#define INGEST_EVENT_OVERHEAD 4096

/* Once ingest found the store full, it resumes only when this much more than the reserve is
 * free: a failed request gives back what it wrote, and without a margin the next, smaller
 * request would slip in and ingest would flap at the edge. */
#define INGEST_RESUME_DIV 64
#define INGEST_RESUME_MIN ((size_t)64 << 10)

/* CPH_OK with *room = how many bytes ingest may still write before the reserve, or
 * CPH_EFULL. O(databases). */
static int ingest_room(cph_engine *e, cph_txn *t, size_t *room, cph_err *err) {
  size_t live = 0, map = 0;
  int rc = cph_txn_space(t, &live, &map);
  if (rc)
    return cph_err_set(err, rc, "cannot tell how full data dir '%s' is: %s", e->data_dir,
                       cph_strerror(rc));
  size_t reserve = map / INGEST_RESERVE_DIV;
  if (reserve < INGEST_RESERVE_MIN)
    reserve = INGEST_RESERVE_MIN < map / 2 ? INGEST_RESERVE_MIN : map / 2;
  size_t margin = 0;
  if (e->ingest_full)
    margin = map / INGEST_RESUME_DIV > INGEST_RESUME_MIN ? map / INGEST_RESUME_DIV
                                                          : INGEST_RESUME_MIN;
  if (live + reserve + margin <= map) {
    *room = map - reserve - live;
    e->ingest_full = false;
    return CPH_OK;
  }
  e->ingest_full = true;
  return cph_err_set(err, CPH_EFULL,
                     "storage full: %zu KiB of the %zu MiB map of data dir '%s' hold data and "
                     "ingest keeps the last %zu KiB for workers (raise :server :map-size-mb and "
                     "restart)",
                     live >> 10, map >> 20, e->data_dir, reserve >> 10);
}

/* The request failed: none of its writes land and memory goes back to before it. */
static void request_rollback(cph_engine *e, ingest_req *rq) {
  cph_txn_abort(&rq->t);
  targets_undo(e, &rq->undo);
  dedupe_rollback(e);
  e->embed_queue_len = rq->embed_queue_before; /* memory_mint counted what did not land */
}

/* A request's events in one child txn of the pass (group commit): one failing request — a
 * full store, say — fails alone and stores none of its events; the other requests of the
 * pass still commit. */
void ingest_apply(cph_engine *e, cph_op *op) {
  size_t n = op->u.ingest.n_events;
  op->u.ingest.results = calloc(n ? n : 1, sizeof *op->u.ingest.results);
  ingest_req rq = {0};
  rq.after = calloc(n ? n : 1, sizeof *rq.after);
  if (!op->u.ingest.results || !rq.after) {
    free(rq.after);
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  cph_err err;
  int rc = cph_txn_begin_child(&e->txn, &rq.t);
  if (rc)
    cph_err_set(&err, rc, "%s", rq.t.err.msg);
  if (rc == CPH_OK) {
    rq.embed_queue_before = e->embed_queue_len;
    dedupe_savepoint(e);
    size_t room = 0; /* bytes left before the reserve at the last look, less the estimates */
    for (size_t i = 0; i < n && rc == CPH_OK; i++) {
      const char *body = op->u.ingest.events[i].body;
      size_t need = 2 * (body ? strlen(body) : 0) + INGEST_EVENT_OVERHEAD;
      if (room < need)
        rc = ingest_room(e, &rq.t, &room, &err);
      room = room > need ? room - need : 0;
      if (rc == CPH_OK)
        rc = ingest_one(e, &rq, &op->u.ingest.events[i], &op->u.ingest.results[i], &rq.after[i],
                        &err);
    }
    if (rc == CPH_OK && cph_txn_commit(&rq.t) != CPH_OK)
      rc = cph_err_set(&err, rq.t.ret, "%s", rq.t.err.msg);
    if (rc)
      request_rollback(e, &rq);
  }
  if (rc) {
    if (rc == CPH_EFULL) {
      e->ingest_full = true;
      metrics_storage_full(e);
    }
    op_fail(op, rc, "events", "%s", err.msg);
  } else {
    for (size_t i = 0; i < n; i++) {
      const ingest_after *a = &rq.after[i];
      if (a->chan) {
        backpressure_note_event(e, a->chan, a->family);
        if (a->coalesce)
          backpressure_coalesce(e, a->chan, a->family, a->body, a->dd_now);
      }
      metrics_event(e, op->u.ingest.results[i].status);
    }
  }
  for (size_t i = 0; i < n; i++)
    free(rq.after[i].chan_owned);
  free(rq.after);
  free(rq.undo.items);
}

/* A backpressure notice (backpressure.h): an event from "cephalon" in the channel's history,
 * staged for every subscriber (members are triggered only by mentions). Not deduplicated,
 * not counted in the channel's rate, no memory. */
int ingest_notice(cph_engine *e, const char *channel_name, const char *body) {
  channel *ch = engine_channel(e, channel_name, false);
  if (!ch || !ch->n_subscribers)
    return CPH_OK;
  target *ts = malloc(ch->n_subscribers * sizeof *ts);
  if (!ts)
    return CPH_ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < ch->n_subscribers; i++) /* subscriber lists hold no repeats */
    ts[n++] = (target){ch->subscribers[i], false, false, 0, -1};
  cph_txn t;
  cph_txn_begin_child(&e->txn, &t);
  uint64_t event_id = 0;
  int64_t now_ms = cph_wall_ms();
  cph_txn_next_id(&t, "event", &event_id);
  cph_event_rec ev = {0};
  ev.id = event_id;
  ev.channel = (char *)channel_name;
  ev.sender = NOTICE_SENDER;
  ev.body = (char *)body;
  ev.kind = NOTICE_KIND;
  ev.ts_ms = ev.received_ms = now_ms;
  ev.status = CPH_EVENT_QUEUED;
  cph_key ek;
  cph_key_reset(&ek);
  cph_key_u64(&ek, event_id);
  cph_txn_put_record(&t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  history_append(e, &t, channel_name, event_id);
  targets_write(e, &t, ts, n, event_id, now_ms);
  int rc = cph_txn_commit(&t);
  if (rc == CPH_OK)
    targets_apply(e, ts, n, event_id, now_ms, NULL, NULL);
  free(ts);
  return rc;
}

/* ---------------------------------------------------------------- poll_inbox */

/* Stages every pending message of the sessions that received some (§3.6 job 1). Memory
 * only: targets_write already wrote them `staged`, in this pass's transaction. New messages
 * arrive at the end and every pass stages them, so each scan walks back from the end and
 * stops once it found them all: O(new messages), not O(inbox). */
uint64_t inbox_poll(cph_engine *e) {
  uint64_t staged = 0;
  for (size_t i = 0; i < e->n_pending_sessions; i++) {
    csession *s = e->pending_sessions[i];
    uint32_t left = s->n_pending;
    for (uint32_t j = s->n_inbox; j-- > 0 && left;)
      if (s->inbox[j].status == CPH_INBOX_PENDING) {
        s->inbox[j].status = CPH_INBOX_STAGED;
        left--;
      }
    staged += s->n_pending;
    s->n_staged += s->n_pending;
    s->n_pending = 0;
    s->in_pending_list = false;
    engine_update_work(e, s);
  }
  e->n_pending_sessions = 0;
  return staged;
}
