/* Ingest (DESIGN §4, §5, §7): validation, idempotency keys, content dedupe and families,
 * per-channel backpressure effects, routing, the per-session queue cap, the channel history,
 * memories minted from events, and poll_inbox (pending -> staged). */
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

/* Writes one pending inbox message per target (and the queue cap's drops) in t. */
static void targets_write(cph_engine *e, cph_txn *t, target *ts, size_t n, uint64_t event_id,
                          int64_t now_ms) {
  int64_t max_queue = e->policy->sessions.max_queue;
  for (size_t i = 0; i < n; i++) {
    csession *s = ts[i].session;
    cph_txn_next_id(t, "inbox", &ts[i].inbox_id);
    inbox_item it = {ts[i].inbox_id, event_id, CPH_INBOX_PENDING, ts[i].mentioned, 0, 0, now_ms};
    put_inbox(t, s->id, &it, CPH_INBOX_PENDING);
    if ((int64_t)s->n_pending + 1 > max_queue) {
      ts[i].drop_index = pick_drop(s);
      if (ts[i].drop_index >= 0)
        put_inbox(t, s->id, &s->inbox[ts[i].drop_index], CPH_INBOX_DROPPED);
    }
  }
}

/* After commit: the sessions' live inboxes follow what targets_write stored. */
static void targets_apply(cph_engine *e, const target *ts, size_t n, uint64_t event_id,
                          int64_t now_ms, cph_event_result *res) {
  if (res)
    res->sessions.items = calloc(n ? n : 1, sizeof(char *));
  for (size_t i = 0; i < n; i++) {
    csession *s = ts[i].session;
    if (ts[i].drop_index >= 0) {
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

/* One event in its own child txn. Returns CPH_OK (the result says accepted or rejected), or
 * the store's error when the write itself failed (then err says why).
 *
 * Order: validation -> idempotency key (`duplicate`, stored once) -> content dedupe
 * (`aggregated`: stored with its hash, joins a family, staged to nobody, kept out of the
 * channel history so contexts do not fill with repeats) -> the channel's backpressure step:
 * aggregate-only stages only to explicit targets and mentions and counts the event into the
 * subscribers' next aggregate notice; step 5 stores an event staged to nobody without its
 * body. Everything is written in the child txn; memory (sessions, dedupe rings, rates)
 * follows only after it committed. */
static int ingest_one(cph_engine *e, cph_event_in *in, cph_event_result *res, cph_err *err) {
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

  cph_txn t;
  cph_txn_begin_child(&e->txn, &t);
  uint64_t original;
  if (in->key && idem_seen(e, &t, in->key, &original)) {
    cph_txn_abort(&t);
    res->status = CPH_EV_DUPLICATE;
    res->id = original;
    return CPH_OK;
  }

  int step = backpressure_step(e, channel_name);
  int64_t dd_now = dedupe_now_ms(e);
  dedupe_verdict v;
  if (dedupe_classify(e, &t, channel_name, in->sender, in->body, dd_now,
                      step >= BP_STEP_WIDEN_DEDUPE ? BP_DEDUPE_WIDEN : 1, &v) != CPH_OK) {
    dedupe_verdict_free(&v);
    cph_txn_abort(&t);
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
  target *ts = malloc(cap * sizeof *ts);
  size_t n = 0;
  if (!ts) {
    dedupe_verdict_free(&v);
    cph_txn_abort(&t);
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
  uint64_t embed_queue_before = e->embed_queue_len;
  cph_txn_next_id(&t, "event", &event_id);
  int rc = dedupe_write(e, &t, channel_name, in->body, event_id, dd_now, &v);
  if (rc && !t.ret) { /* out of memory building the family: nothing of this event lands */
    cph_txn_abort(&t);
    dedupe_verdict_free(&v);
    free(ts);
    return cph_err_set(err, rc, "out of memory");
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
  cph_txn_put_record(&t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  if (!aggregated)
    history_append(e, &t, channel_name, event_id);
  if (in->key) {
    cph_key kk;
    cph_key_reset(&kk);
    cph_key_str(&kk, in->key);
    uint8_t kv[16];
    cph_be64_put(kv, event_id);
    cph_be64_put(kv + 8, (uint64_t)now_ms);
    cph_txn_put(&t, CPH_DB_IDEM_KEYS, &kk, kv, sizeof kv);
  }
  mint_memories(e, &t, channel_name, step, !dup && !aggregate_only, &v, in->body, event_id);
  targets_write(e, &t, ts, n, event_id, now_ms);
  if (cph_txn_commit(&t)) {
    /* Storage full and friends: this event is not stored and the request fails with the
     * store's error (507 for a full map); events before it in the request are committed. */
    e->embed_queue_len = embed_queue_before; /* memory_mint counted what did not land */
    dedupe_verdict_free(&v);
    free(ts);
    return cph_err_set(err, t.ret, "%s", t.err.msg);
  }

  /* Committed into the pass txn: now memory follows. */
  dedupe_commit(e, channel_name, event_id, dd_now, &v);
  backpressure_note_event(e, channel_name, dup ? v.family : 0);
  if (coalesce)
    backpressure_coalesce(e, channel_name, dup ? v.family : 0, in->body, dd_now);
  res->id = event_id;
  res->status = n ? CPH_EV_QUEUED : aggregated ? CPH_EV_AGGREGATED : CPH_EV_STORED;
  targets_apply(e, ts, n, event_id, now_ms, res);
  dedupe_verdict_free(&v);
  free(ts);
  return CPH_OK;
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

/* CPH_OK with *room = how many bytes ingest may still write before the reserve, or
 * CPH_EFULL. O(databases). */
static int ingest_room(cph_engine *e, size_t *room, cph_err *err) {
  size_t live = 0, map = 0;
  int rc = cph_txn_space(&e->txn, &live, &map);
  if (rc)
    return cph_err_set(err, rc, "cannot tell how full data dir '%s' is: %s", e->data_dir,
                       cph_strerror(rc));
  size_t reserve = map / INGEST_RESERVE_DIV;
  if (reserve < INGEST_RESERVE_MIN)
    reserve = INGEST_RESERVE_MIN < map / 2 ? INGEST_RESERVE_MIN : map / 2;
  if (live + reserve <= map) {
    *room = map - reserve - live;
    return CPH_OK;
  }
  return cph_err_set(err, CPH_EFULL,
                     "storage full: %zu KiB of the %zu MiB map of data dir '%s' hold data and "
                     "ingest keeps the last %zu KiB for workers (raise :server :map-size-mb and "
                     "restart)",
                     live >> 10, map >> 20, e->data_dir, reserve >> 10);
}

void ingest_apply(cph_engine *e, cph_op *op) {
  size_t n = op->u.ingest.n_events;
  op->u.ingest.results = calloc(n ? n : 1, sizeof *op->u.ingest.results);
  if (!op->u.ingest.results) {
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  size_t room = 0; /* bytes left before the reserve at the last look, less the estimates */
  for (size_t i = 0; i < n; i++) {
    cph_err err;
    const char *body = op->u.ingest.events[i].body;
    size_t need = 2 * (body ? strlen(body) : 0) + INGEST_EVENT_OVERHEAD;
    int rc = room < need ? ingest_room(e, &room, &err) : CPH_OK;
    room = room > need ? room - need : 0;
    if (rc == CPH_OK)
      rc = ingest_one(e, &op->u.ingest.events[i], &op->u.ingest.results[i], &err);
    if (rc) {
      if (rc == CPH_EFULL)
        metrics_storage_full(e);
      op_fail(op, rc, "events", "%s", err.msg);
      return;
    }
    metrics_event(e, op->u.ingest.results[i].status);
  }
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
    targets_apply(e, ts, n, event_id, now_ms, NULL);
  free(ts);
  return rc;
}

/* ---------------------------------------------------------------- poll_inbox */

/* Stages every pending message of the sessions that received some (§3.6 job 1). */
uint64_t inbox_poll(cph_engine *e) {
  uint64_t staged = 0;
  size_t kept = 0;
  for (size_t i = 0; i < e->n_pending_sessions; i++) {
    csession *s = e->pending_sessions[i];
    cph_txn t;
    cph_txn_begin_child(&e->txn, &t);
    for (uint32_t j = 0; j < s->n_inbox; j++)
      if (s->inbox[j].status == CPH_INBOX_PENDING)
        put_inbox(&t, s->id, &s->inbox[j], CPH_INBOX_STAGED);
    if (cph_txn_commit(&t)) {
      e->pending_sessions[kept++] = s; /* try again next pass */
      continue;
    }
    for (uint32_t j = 0; j < s->n_inbox; j++)
      if (s->inbox[j].status == CPH_INBOX_PENDING) {
        s->inbox[j].status = CPH_INBOX_STAGED;
        s->n_pending--;
        s->n_staged++;
        staged++;
      }
    s->in_pending_list = false;
    engine_update_work(e, s);
  }
  e->n_pending_sessions = kept;
  return staged;
}
