/* Ingest (DESIGN §4): validation, idempotency keys, routing, the per-session queue cap, the
 * channel history, and poll_inbox (pending -> staged). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

#define CHANNEL_MAX 256

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
  uint64_t inbox_id;
  int32_t drop_index; /* inbox index to drop for the queue cap, -1 none */
} target;

static void reject(cph_event_result *res, const char *field, const char *why) {
  res->status = CPH_EV_REJECTED;
  res->field = strdup(field);
  res->reason = strdup(why);
}

static bool add_target(target *ts, size_t *n, size_t cap, csession *s, bool mentioned) {
  for (size_t i = 0; i < *n; i++)
    if (ts[i].session == s) {
      ts[i].mentioned |= mentioned;
      return true;
    }
  if (*n == cap)
    return false;
  ts[(*n)++] = (target){s, mentioned, 0, -1};
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

/* One event in its own child txn. Returns CPH_OK (the result says accepted or rejected), or
 * the store's error when the write itself failed (then err says why). */
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

  /* Routing: the explicit session, else the channel's subscribers; plus every mention. */
  size_t cap = 64;
  channel *ch = engine_channel(e, channel_name, false);
  if (!explicit_target && ch)
    cap += ch->n_subscribers;
  cap += in->mentions.count;
  target *ts = malloc(cap * sizeof *ts);
  size_t n = 0;
  if (!ts) {
    cph_txn_abort(&t);
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  }
  if (explicit_target)
    add_target(ts, &n, cap, explicit_target, false);
  else if (ch)
    for (size_t i = 0; i < ch->n_subscribers; i++)
      add_target(ts, &n, cap, ch->subscribers[i], false);
  for (size_t i = 0; i < in->mentions.count; i++) {
    csession *m = in->mentions.items[i] ? engine_session(e, in->mentions.items[i]) : NULL;
    if (m)
      add_target(ts, &n, cap, m, true); /* mentions of unknown sessions reach nobody */
  }

  uint64_t event_id = 0;
  int64_t now_ms = cph_wall_ms();
  cph_txn_next_id(&t, "event", &event_id);
  cph_event_rec ev = {0};
  ev.id = event_id;
  ev.channel = (char *)channel_name;
  ev.sender = in->sender;
  ev.body = in->body;
  ev.session = in->session;
  ev.mentions = in->mentions.items;
  ev.n_mentions = (uint32_t)in->mentions.count;
  ev.kind = in->kind;
  ev.key = in->key;
  ev.ts_ms = in->ts_ms ? in->ts_ms : now_ms;
  ev.received_ms = now_ms;
  ev.status = n ? CPH_EVENT_QUEUED : CPH_EVENT_STORED;
  cph_key ek;
  cph_key_reset(&ek);
  cph_key_u64(&ek, event_id);
  cph_txn_put_record(&t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  history_append(e, &t, channel_name, event_id);
  if (in->key) {
    cph_key kk;
    cph_key_reset(&kk);
    cph_key_str(&kk, in->key);
    uint8_t v[16];
    cph_be64_put(v, event_id);
    cph_be64_put(v + 8, (uint64_t)now_ms);
    cph_txn_put(&t, CPH_DB_IDEM_KEYS, &kk, v, sizeof v);
  }
  int64_t max_queue = e->policy->sessions.max_queue;
  for (size_t i = 0; i < n; i++) {
    csession *s = ts[i].session;
    cph_txn_next_id(&t, "inbox", &ts[i].inbox_id);
    inbox_item it = {ts[i].inbox_id, event_id, CPH_INBOX_PENDING, ts[i].mentioned, 0, 0, now_ms};
    put_inbox(&t, s->id, &it, CPH_INBOX_PENDING);
    if ((int64_t)s->n_pending + 1 > max_queue) {
      ts[i].drop_index = pick_drop(s);
      if (ts[i].drop_index >= 0)
        put_inbox(&t, s->id, &s->inbox[ts[i].drop_index], CPH_INBOX_DROPPED);
    }
  }
  if (cph_txn_commit(&t)) {
    /* Storage full and friends: this event is not stored and the request fails with the
     * store's error (507 for a full map); events before it in the request are committed. */
    free(ts);
    return cph_err_set(err, t.ret, "%s", t.err.msg);
  }

  /* Committed into the pass txn: now memory follows. */
  res->id = event_id;
  res->status = n ? CPH_EV_QUEUED : CPH_EV_STORED;
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
    if (res->sessions.items)
      res->sessions.items[res->sessions.count++] = strdup(s->id);
  }
  free(ts);
  return CPH_OK;
}

void ingest_apply(cph_engine *e, cph_op *op) {
  size_t n = op->u.ingest.n_events;
  op->u.ingest.results = calloc(n ? n : 1, sizeof *op->u.ingest.results);
  if (!op->u.ingest.results) {
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    cph_err err;
    int rc = ingest_one(e, &op->u.ingest.events[i], &op->u.ingest.results[i], &err);
    if (rc) {
      op_fail(op, rc, "events", "%s", err.msg);
      return;
    }
  }
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
