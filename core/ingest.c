/* Ingest (DESIGN §4, §5, §7): validation, idempotency keys, content dedupe and families,
 * per-channel backpressure effects, routing, the per-session queue cap, the channel history,
 * memories minted from events, and poll_inbox (pending -> staged, in memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/log.h"
#include "backpressure.h"
#include "dedupe.h"
#include "inbox.h"
#include "chantail.h"
#include "ingest.h"
#include "ops.h"

const char *cph_ingest_status_name(cph_ingest_status s) {
  switch (s) {
  case CPH_EV_QUEUED:
    return "queued";
  case CPH_EV_STORED:
    return "stored";
  case CPH_EV_DUPLICATE:
    return "duplicate";
  case CPH_EV_AGGREGATED:
    return "aggregated";
  case CPH_EV_REJECTED:
    return "rejected";
  }
  return "unknown";
}

/* Appends event_id to the channel's history under the next per-channel index. */
int history_append(cph_txn *t, const char *channel_name, uint64_t event_id, uint64_t *out) {
  char counter[CPH_CHANNEL_MAX + 8]; /* "chan:" + the name, cut to fit as snprintf did */
  size_t n = strnlen(channel_name, sizeof counter - 6);
  memcpy(counter, "chan:", 5);
  memcpy(counter + 5, channel_name, n);
  counter[5 + n] = '\0';
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
  if (out)
    *out = index;
  return cph_txn_put(t, CPH_DB_CHANNEL_LOG, &k, v, sizeof v);
}

/* ingest.h */
int history_tail(cph_txn *t, const char *chan, size_t scan,
                 bool (*fn)(void *ctx, uint64_t index, const cph_event_rec *ev), void *ctx) {
  cph_key from;
  cph_key_reset(&from);
  cph_key_str(&from, chan);
  size_t plen = from.len;
  cph_key_u64(&from, UINT64_MAX);
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CHANNEL_LOG, &c);
  if (rc)
    return rc;
  cph_val k, v;
  rc = cph_cursor_seek(&c, &from, &k, &v);
  rc = rc == CPH_OK         ? cph_cursor_prev(&c, &k, &v)
       : rc == CPH_ENOTFOUND ? cph_cursor_last(&c, &k, &v)
                             : rc;
  for (size_t n = 0; rc == CPH_OK && n < scan; n++) {
    if (k.len != plen + 8 || memcmp(k.data, from.data, plen) != 0 || v.len != 8)
      break;
    cph_key ek = cph_key_of_u64(cph_be64_get(v.data));
    cph_event_rec ev;
    int grc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
    if (grc == CPH_OK) {
      bool more = fn(ctx, cph_be64_get((const uint8_t *)k.data + plen), &ev);
      cph_record_free(&cph_event_desc, &ev);
      if (!more)
        break;
    } else if (grc != CPH_ENOTFOUND) {
      rc = grc;
      break;
    }
    rc = cph_cursor_prev(&c, &k, &v);
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

static cph_key inbox_key(const char *session, uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, id);
  return k;
}

static int put_inbox(cph_txn *t, const char *session, const inbox_item *it, uint8_t status) {
  cph_inbox_rec r = {(char *)session, it->id,      it->event_id, status,
                     it->mentioned,   it->turn_id, it->attempts, it->created_ms};
  cph_key k = inbox_key(session, it->id);
  return cph_txn_put_record(t, CPH_DB_INBOX, &k, &cph_inbox_desc, &r);
}

/* Where this event goes. */
typedef struct target {
  csession *session;
  bool mentioned;
  bool direct; /* named by the event (explicit session or mention), not only subscribed */
} target;

/* A copy of s in the request's results arena (cph_op u.ingest.strings). */
static char *result_str(struct cph_arena_chunk **strings, const char *s) {
  return cph_arena_strndup(strings, s, strlen(s));
}

/* Out of memory leaves field and reason NULL: the event is still rejected, for no stated why. */
static void reject(cph_event_result *res, struct cph_arena_chunk **strings, const char *field,
                   const char *why) {
  res->status = CPH_EV_REJECTED;
  res->field = result_str(strings, field);
  res->reason = result_str(strings, why);
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
  ts[(*n)++] = (target){s, mentioned, direct};
  return true;
}

/* ---------------------------------------------------------------- delivery and its undo */

/* What delivery changed in a session's live inbox, so that a failed request can put it back:
 * an entry pushed (undone by removing it), changed (by restoring `before`) or removed (by
 * pushing `before` back). `folded` is what the change added to the overflow counters. */
typedef enum { UNDO_PUSHED, UNDO_CHANGED, UNDO_REMOVED } undo_kind;

typedef struct inbox_undo {
  csession *session;
  undo_kind kind;
  inbox_item before;
  uint32_t folded;
} inbox_undo;

/* queued_entries() of the sessions a request delivers to, counted once and then kept as the
 * request delivers (while it runs, only the request changes inboxes): the queue cap's check
 * is O(1) per event instead of a walk of the inbox. Discarded with the request. */
#define QUEUED_MEMO_MAX 8

typedef struct queued_memo {
  csession *session;
  uint32_t queued;
} queued_memo;

typedef struct queued_memos {
  queued_memo m[QUEUED_MEMO_MAX];
  size_t n;
} queued_memos;

/* s's memo; once the memos are full, scratch (counted afresh each time). */
static uint32_t queued_entries(const csession *s);
static queued_memo *queued_of(queued_memos *qm, csession *s, queued_memo *scratch) {
  for (size_t i = 0; i < qm->n; i++)
    if (qm->m[i].session == s)
      return &qm->m[i];
  queued_memo *q = qm->n < QUEUED_MEMO_MAX ? &qm->m[qm->n++] : scratch;
  q->session = s;
  q->queued = queued_entries(s);
  return q;
}

/* A fold record (inbox_fold_put) as the request left it: written once, when the request's
 * events are all in, not once per event folded into it. */
typedef struct fold_write {
  csession *session; /* NULL: dropped (inbox_fold_move deleted the record) */
  inbox_item it;
} fold_write;

/* A session whose entries the queue cap folded away in this request: its folded map
 * (inbox_folded_put) is written once, when the request's events are all in. */
typedef struct folded_write {
  csession *session;
  uint64_t through; /* the highest entry id folded away */
} folded_write;

/* The events a request's queue cap folded into one overflow entry: written as one member row
 * (inbox_fold_add_many) when the request's events are all in. Nothing reads an overflow
 * entry's members while the request runs (only a lease does). */
typedef struct member_write {
  csession *session;
  uint64_t entry;
  uint64_t *ids;
  size_t n, cap;
} member_write;

/* What a request's deliveries did, for the rest of the request: the undo log (a failed
 * request puts the live inboxes back), the queue cap's counts, the fold records, member rows
 * and folded maps to write. */
typedef struct delivery_log {
  inbox_undo *items;
  size_t n, cap;
  queued_memos queued;
  fold_write *folds;
  size_t n_folds, cap_folds;
  folded_write *folded;
  size_t n_folded, cap_folded;
  member_write *members;
  size_t n_members, cap_members;
} delivery_log;

static int undo_note(delivery_log *u, csession *s, undo_kind kind, const inbox_item *it,
                     uint32_t folded) {
  if (!u)
    return CPH_OK;
  if (u->n == u->cap) {
    size_t cap = u->cap ? u->cap * 2 : 64;
    inbox_undo *p = realloc(u->items, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    u->items = p;
    u->cap = cap;
  }
  u->items[u->n++] = (inbox_undo){s, kind, *it, folded};
  return CPH_OK;
}

/* it's fold record is to be written as it is now (at fold_writes_flush). Out of memory: written
 * at once instead. */
static void fold_note(cph_txn *t, delivery_log *u, csession *s, const inbox_item *it) {
  /* an entry folding repeat after repeat is among the last noted */
  for (size_t i = u->n_folds, back = 0; i-- > 0 && back < 8; back++)
    if (u->folds[i].session == s && u->folds[i].it.id == it->id) {
      u->folds[i].it = *it;
      return;
    }
  if (u->n_folds == u->cap_folds) {
    size_t cap = u->cap_folds ? u->cap_folds * 2 : 16;
    fold_write *p = realloc(u->folds, cap * sizeof *p);
    if (!p) {
      inbox_fold_put(t, s->id, it);
      return;
    }
    u->folds = p;
    u->cap_folds = cap;
  }
  u->folds[u->n_folds++] = (fold_write){s, *it};
}

/* inbox_fold_move is deleting entry id's fold record: what was noted for it must not bring it
 * back. */
static void fold_drop(delivery_log *u, const csession *s, uint64_t id) {
  for (size_t i = 0; i < u->n_folds; i++)
    if (u->folds[i].session == s && u->folds[i].it.id == id)
      u->folds[i].session = NULL;
}

/* The queue cap folded entry id of s away: s's folded map is to cover it (at
 * fold_writes_flush). Out of memory: the entry's record is rewritten `folded` at once, which
 * load skips as well (inbox.h). */
static void folded_note(cph_txn *t, delivery_log *u, csession *s, const inbox_item *victim) {
  for (size_t i = 0; i < u->n_folded; i++)
    if (u->folded[i].session == s) {
      if (victim->id > u->folded[i].through)
        u->folded[i].through = victim->id;
      return;
    }
  if (u->n_folded == u->cap_folded) {
    size_t cap = u->cap_folded ? u->cap_folded * 2 : 4;
    folded_write *p = realloc(u->folded, cap * sizeof *p);
    if (!p) {
      put_inbox(t, s->id, victim, CPH_INBOX_FOLDED);
      return;
    }
    u->folded = p;
    u->cap_folded = cap;
  }
  u->folded[u->n_folded++] = (folded_write){s, victim->id};
}

/* event_id is a member of s's overflow entry `entry` (at fold_writes_flush). Out of memory:
 * its member row is written at once. */
static void member_note(cph_txn *t, delivery_log *u, csession *s, uint64_t entry,
                        uint64_t event_id) {
  member_write *m = NULL;
  for (size_t i = u->n_members; i-- > 0 && !m;)
    if (u->members[i].session == s && u->members[i].entry == entry)
      m = &u->members[i];
  if (!m && u->n_members == u->cap_members) {
    size_t cap = u->cap_members ? u->cap_members * 2 : 4;
    member_write *p = realloc(u->members, cap * sizeof *p);
    if (!p) {
      inbox_fold_add(t, s->id, entry, event_id);
      return;
    }
    u->members = p;
    u->cap_members = cap;
  }
  if (!m) {
    m = &u->members[u->n_members++];
    *m = (member_write){s, entry, NULL, 0, 0};
  }
  if (m->n == m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    uint64_t *p = realloc(m->ids, cap * sizeof *p);
    if (!p) {
      inbox_fold_add(t, s->id, entry, event_id);
      return;
    }
    m->ids = p;
    m->cap = cap;
  }
  m->ids[m->n++] = event_id;
}

static void members_free(delivery_log *u) {
  for (size_t i = 0; i < u->n_members; i++)
    free(u->members[i].ids);
  free(u->members);
  u->members = NULL;
  u->n_members = u->cap_members = 0;
}

/* Writes the noted member rows and fold records (in the order noted: a record noted twice,
 * the later wins), then the noted folded maps from the live inboxes as the request left them. */
static int fold_writes_flush(cph_txn *t, delivery_log *u) {
  for (size_t i = 0; i < u->n_members && !t->ret; i++) {
    member_write *m = &u->members[i];
    int rc = inbox_fold_add_many(t, m->session->id, m->entry, m->ids, m->n);
    if (rc && !t->ret)
      return rc;
  }
  members_free(u);
  for (size_t i = 0; i < u->n_folds; i++)
    if (u->folds[i].session)
      inbox_fold_put(t, u->folds[i].session->id, &u->folds[i].it);
  u->n_folds = 0;
  for (size_t i = 0; i < u->n_folded && !t->ret; i++) {
    int rc = inbox_folded_put(t, u->folded[i].session, u->folded[i].through);
    if (rc && !t->ret)
      return rc;
  }
  u->n_folded = 0;
  return t->ret;
}

static int32_t inbox_find(const csession *s, uint64_t id) {
  for (uint32_t j = s->n_inbox; j-- > 0;)
    if (s->inbox[j].id == id)
      return (int32_t)j;
  return -1;
}

/* Puts the live inboxes back as they were before the logged changes, newest first. A session
 * left in the pending list finds nothing to stage: harmless. */
static void targets_undo(cph_ingest *ig, delivery_log *dl) {
  while (dl->n) {
    inbox_undo *u = &dl->items[--dl->n];
    csession *s = u->session;
    int32_t at = inbox_find(s, u->before.id);
    switch (u->kind) {
    case UNDO_PUSHED:
      if (at >= 0)
        csession_inbox_remove(s, (uint32_t)at);
      break;
    case UNDO_CHANGED:
      if (at >= 0)
        s->inbox[at] = u->before;
      break;
    case UNDO_REMOVED:
      if (at < 0)
        csession_inbox_push(s, &u->before); /* keeps id order: back where it was */
      break;
    }
    s->folded -= u->folded;
    ig->folded_total -= u->folded;
  }
}

/* The entry a repeat folds into: the session's entry, not yet carried by a turn, that holds
 * the original or already gathers the family's repeats. -1: none (the repeat is staged anew,
 * DESIGN §5). Newest first: a family's entry is usually among the last. */
static int32_t fold_target(const csession *s, const dedupe_verdict *v) {
  for (uint32_t j = s->n_inbox; j-- > 0;) {
    const inbox_item *it = &s->inbox[j];
    if (it->turn_id)
      continue;
    if (it->event_id == v->original_event ||
        (v->family && it->fold == INBOX_FOLD_REPEAT && it->fold_key == v->family))
      return (int32_t)j;
  }
  return -1;
}

/* Whether event record ev holds the message (chan, sender, ts_ms, body): it is a copy of it
 * (cluster mode: every copy carries the time the message was accepted). */
static bool event_is_message(const cph_event_rec *ev, const char *chan, const char *sender,
                             int64_t ts_ms, const char *body) {
  return ev->ts_ms == ts_ms && ev->channel && ev->sender && ev->body &&
         strcmp(ev->channel, chan) == 0 && strcmp(ev->sender, sender) == 0 &&
         strcmp(ev->body, body) == 0;
}

/* How many of a session's newest un-leased entries a repeat's forward looks at for another
 * copy of its original (copy_fold_target): the original's entry is usually among the last. */
#define COPY_FOLD_LOOK 8

/* The message a cluster repeat repeats, as this node holds it (the verdict's original_event):
 * read once, when a session first has no entry of the repeat's family (copy_fold_target). */
typedef struct repeat_original {
  uint64_t event_id; /* 0: not a repeat of the cluster log */
  bool read;         /* rec was looked for */
  bool held;         /* and found, with its channel, sender and body */
  cph_event_rec rec;
} repeat_original;

/* Cluster mode: the session's un-leased entry, not folding anything yet, whose event is another
 * copy of the original the repeat repeats — a forward is an event of its own (server/
 * clusterflow.h 3.), so the entry holds that copy's id, not the original's — among its newest
 * COPY_FOLD_LOOK such entries: the repeat folds into it as into the original's entry on one
 * node. -1: none; *rc a store error. */
static int32_t copy_fold_target(cph_txn *t, const csession *s, repeat_original *orig, int *rc) {
  *rc = CPH_OK;
  if (!orig->read) {
    cph_key ok = cph_key_of_u64(orig->event_id);
    int grc = cph_txn_get_record(t, CPH_DB_EVENTS, &ok, &cph_event_desc, &orig->rec);
    orig->read = true;
    orig->held = grc == CPH_OK && orig->rec.channel && orig->rec.sender && orig->rec.body;
    if (grc && grc != CPH_ENOTFOUND) {
      *rc = grc;
      return -1;
    }
  }
  if (!orig->held)
    return -1;
  const cph_event_rec *o = &orig->rec;
  size_t looked = 0;
  for (uint32_t j = s->n_inbox; j-- > 0 && looked < COPY_FOLD_LOOK;) {
    const inbox_item *it = &s->inbox[j];
    if (it->turn_id || it->fold != INBOX_FOLD_NONE)
      continue;
    looked++;
    cph_key ek = cph_key_of_u64(it->event_id);
    cph_event_rec ev;
    int grc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
    if (grc == CPH_ENOTFOUND)
      continue;
    if (grc) {
      *rc = grc;
      return -1;
    }
    bool copy = event_is_message(&ev, o->channel, o->sender, o->ts_ms, o->body);
    cph_record_free(&cph_event_desc, &ev);
    if (copy)
      return (int32_t)j;
  }
  return -1;
}

/* Whether step 5 may drop the payload of an event routed to ts[0..n): when it reached nobody,
 * or when it is an exact repeat that every one of those sessions counts in an un-leased entry
 * already there (fold_target), whose first event shows the text. A repeat that starts an entry
 * of its own — its family's entry leased, or a session that never had one (a late subscriber; a
 * cluster forward, which is the same text once per session) — is that entry's text: kept. */
static bool payload_shown_elsewhere(const target *ts, size_t n, const dedupe_verdict *v) {
  if (!n)
    return true;
  if (v->kind != DEDUPE_EXACT)
    return false;
  for (size_t i = 0; i < n; i++)
    if (fold_target(ts[i].session, v) < 0)
      return false;
  return true;
}

/* Folds event into the un-leased entry at index at. */
static int fold_into(cph_txn *t, csession *s, int32_t at, uint64_t event_id, bool mentioned,
                     bool direct, const dedupe_verdict *v, int64_t now_ms, delivery_log *dl) {
  inbox_item *it = &s->inbox[at];
  if (undo_note(dl, s, UNDO_CHANGED, it, 0))
    return CPH_ENOMEM;
  bool was_mentioned = it->mentioned;
  if (it->fold == INBOX_FOLD_NONE && v && v->family) {
    it->fold = INBOX_FOLD_REPEAT;
    it->fold_key = v->family;
  }
  it->count++;
  it->mentioned |= mentioned;
  it->direct |= direct;
  if (now_ms > it->last_ms)
    it->last_ms = now_ms;
  inbox_fold_add(t, s->id, it->id, event_id);
  fold_note(t, dl, s, it);
  if (it->mentioned != was_mentioned)
    put_inbox(t, s->id, it, CPH_INBOX_STAGED);
  return t->ret;
}

/* Entries of s not carried by a running turn: what the queue cap counts. */
static uint32_t queued_entries(const csession *s) {
  uint32_t n = 0;
  for (uint32_t j = 0; j < s->n_inbox; j++)
    n += s->inbox[j].turn_id == 0;
  return n;
}

/* The oldest entry the queue cap may fold away: un-leased, not the overflow entry, preferring
 * one not mentioned (DESIGN §4). -1: none. */
static int32_t overflow_victim(const csession *s) {
  int32_t oldest = -1;
  for (uint32_t j = 0; j < s->n_inbox; j++) {
    const inbox_item *it = &s->inbox[j];
    if (it->turn_id || it->fold == INBOX_FOLD_OVERFLOW)
      continue;
    if (!it->mentioned)
      return (int32_t)j;
    if (oldest < 0)
      oldest = (int32_t)j;
  }
  return oldest;
}

static int32_t overflow_entry(const csession *s) {
  for (uint32_t j = 0; j < s->n_inbox; j++)
    if (!s->inbox[j].turn_id && s->inbox[j].fold == INBOX_FOLD_OVERFLOW)
      return (int32_t)j;
  return -1;
}

/* §4 queue cap: makes room for one more entry by folding the oldest queued entry into the
 * session's overflow entry (the first time, the oldest entry becomes the overflow entry and
 * the next oldest folds into it). Its events stay counted there: nothing is dropped. */
static int overflow_fold(cph_ingest *ig, cph_txn *t, csession *s, delivery_log *dl, bool *removed) {
  *removed = false;
  int32_t ov = overflow_entry(s);
  if (ov < 0) {
    int32_t v = overflow_victim(s);
    if (v < 0)
      return CPH_OK; /* everything queued is in the running turn */
    inbox_item *it = &s->inbox[v];
    if (undo_note(dl, s, UNDO_CHANGED, it, it->count))
      return CPH_ENOMEM;
    it->fold = INBOX_FOLD_OVERFLOW;
    it->fold_key = 0;
    s->folded += it->count;
    ig->folded_total += it->count;
    fold_note(t, dl, s, it);
    ov = v;
  }
  int32_t v = overflow_victim(s);
  if (v < 0)
    return t->ret;
  inbox_item victim = s->inbox[v];
  if (undo_note(dl, s, UNDO_CHANGED, &s->inbox[ov], 0) ||
      undo_note(dl, s, UNDO_REMOVED, &victim, victim.count))
    return CPH_ENOMEM;
  inbox_item *o = &s->inbox[ov];
  bool was_mentioned = o->mentioned;
  o->count += victim.count;
  o->mentioned |= victim.mentioned;
  o->direct |= victim.direct;
  if (victim.last_ms > o->last_ms)
    o->last_ms = victim.last_ms;
  if (victim.count > 1) {
    fold_drop(dl, s, victim.id);
    inbox_fold_move(t, s->id, victim.id, o->id);
  }
  member_note(t, dl, s, o->id, victim.event_id);
  fold_note(t, dl, s, o);
  if (o->mentioned != was_mentioned) /* the rest of its record is as stored */
    put_inbox(t, s->id, o, CPH_INBOX_STAGED);
  folded_note(t, dl, s, &victim); /* its record stays as written: the folded map tells */
  csession_inbox_remove(s, (uint32_t)v);
  *removed = true;
  s->folded += victim.count;
  ig->folded_total += victim.count;
  return t->ret;
}

/* Delivers event_id to target session s (the accounting rule, DESIGN §5): a repeat (v given)
 * folds into its family's queued entry when the session has one; anything else is a new entry
 * — pending in memory until poll_inbox stages it, but written `staged` at once: poll_inbox
 * runs later in the same pass, inside the same pass transaction, so no committed state ever
 * held it pending. A message that arrives after this pass's poll is staged in memory by the
 * next pass; a crash before then brings it back staged, as if that poll had run. Memory
 * follows each write at once (the request's next event must see it) and dl can put it back;
 * fold records (count, last time) are noted in dl and written once at the request's end. */
static int deliver(cph_ingest *ig, cph_txn *t, csession *s, uint64_t event_id, bool mentioned,
                   bool direct, const dedupe_verdict *v, repeat_original *orig,
                   int64_t now_ms, delivery_log *dl) {
  queued_memos *qm = &dl->queued;
  if (v) {
    int32_t at = fold_target(s, v);
    if (at < 0 && orig && orig->event_id) {
      int rc;
      at = copy_fold_target(t, s, orig, &rc);
      if (rc)
        return rc;
    }
    if (at >= 0)
      return fold_into(t, s, at, event_id, mentioned, direct, v, now_ms, dl);
  }
  int64_t max_queue = ig->env->policy->sessions.max_queue;
  queued_memo scratch, *q = NULL;
  if ((int64_t)s->n_inbox >= max_queue) {
    q = queued_of(qm, s, &scratch);
    if ((int64_t)q->queued >= max_queue) {
      bool removed;
      int rc = overflow_fold(ig, t, s, dl, &removed);
      if (rc)
        return rc;
      q->queued -= removed;
    }
  } else {
    for (size_t i = 0; i < qm->n && !q; i++) /* a memo of s, if any, must follow the push */
      if (qm->m[i].session == s)
        q = &qm->m[i];
  }
  inbox_item it = {0};
  cph_txn_next_id(t, "inbox", &it.id);
  it.event_id = event_id;
  it.status = CPH_INBOX_PENDING;
  it.mentioned = mentioned;
  it.direct = direct;
  it.created_ms = it.last_ms = now_ms;
  it.count = 1;
  if (v && v->family) {
    it.fold = INBOX_FOLD_REPEAT; /* staged anew: the family's next repeats join it */
    it.fold_key = v->family;
    fold_note(t, dl, s, &it);
  }
  put_inbox(t, s->id, &it, CPH_INBOX_STAGED);
  if (t->ret)
    return t->ret;
  if (csession_inbox_push(s, &it))
    return CPH_ENOMEM;
  if (q)
    q->queued++;
  if (undo_note(dl, s, UNDO_PUSHED, &it, 0)) {
    csession_inbox_remove(s, (uint32_t)inbox_find(s, it.id));
    return CPH_ENOMEM;
  }
  sessions_mark_pending(ig->sessions, s);
  return CPH_OK;
}

/* ---------------------------------------------------------------- arrivals during a turn */

/* What an event routed to s does when s has a turn running (DESIGN §4): only :reject keeps
 * it out of the inbox; :restart is delivered and then supersedes the turn (note_restart);
 * :merge and :interrupt are delivered and told at the next heartbeat (core/turns.c).
 * A job turn is not an agent's turn: what reaches a maintenance session while it runs a job
 * is always staged. */
static cph_policy_while_running arrival_mode(const cph_ingest *ig, const csession *s) {
  if (!s->running_turn || s->running_job)
    return CPH_POLICY_WR_ENQUEUE;
  return sessions_while_running(ig->sessions, s);
}

/* Notes s for turns_supersede once the request committed (each session once). */
static int note_restart(cph_ingest *ig, csession *s) {
  for (size_t i = 0; i < ig->n_restart; i++)
    if (ig->restart[i] == s)
      return CPH_OK;
  if (ig->n_restart == ig->cap_restart) {
    size_t cap = ig->cap_restart ? ig->cap_restart * 2 : 8;
    csession **p = realloc(ig->restart, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    ig->restart = p;
    ig->cap_restart = cap;
  }
  ig->restart[ig->n_restart++] = s;
  return CPH_OK;
}

void ingest_free(cph_ingest *ig) {
  free(ig->restart);
  ig->restart = NULL;
  ig->n_restart = ig->cap_restart = 0;
  ig->idem_resuming = false;
}

/* Whether an idempotency key's value (event id, time received) is past the window at now_ms;
 * a value of another size is nobody's (idem_seen does not take it). */
static bool idem_expired(const cph_ingest *ig, const cph_val *v, int64_t now_ms) {
  if (v->len != 16)
    return true;
  int64_t at = (int64_t)cph_be64_get((const uint8_t *)v->data + 8);
  return now_ms - at > ig->env->policy->dedupe.key_window_seconds * 1000;
}

/* Looks up an idempotency key: its event id if seen within the window. */
static bool idem_seen(cph_ingest *ig, cph_txn *t, const char *key, uint64_t *id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, key);
  cph_val v;
  if (k.overflow || cph_txn_get(t, CPH_DB_IDEM_KEYS, &k, &v) != CPH_OK ||
      idem_expired(ig, &v, env_wall_ms(ig->env)))
    return false;
  *id = cph_be64_get(v.data);
  return true;
}

/* Remembers key as event_id's, received now (idem_seen; by the engine's wall clock, which the
 * window is measured on). */
static void idem_put(cph_ingest *ig, cph_txn *t, const char *key, uint64_t event_id) {
  cph_key kk;
  cph_key_reset(&kk);
  cph_key_str(&kk, key);
  uint8_t kv[16];
  cph_be64_put(kv, event_id);
  cph_be64_put(kv + 8, (uint64_t)env_wall_ms(ig->env));
  cph_txn_put(t, CPH_DB_IDEM_KEYS, &kk, kv, sizeof kv);
  ig->idem_added++;
}

#define IDEM_SWEEP_PERIOD_MS 1000
#define IDEM_SWEEP_BASE 1024
/* The most keys a step looks at: ~25 ms of the pass at ~100 ns a key, however large the burst
 * of keyed events since the last step (the sweep still outruns 128k keys written a second). */
#define IDEM_SWEEP_MAX (1u << 18)

void ingest_tick(cph_ingest *ig, cph_txn *parent) {
  int64_t now_ms = env_wall_ms(ig->env);
  if (now_ms < ig->idem_next_ms)
    return;
  ig->idem_next_ms = now_ms + IDEM_SWEEP_PERIOD_MS;
  uint64_t budget = IDEM_SWEEP_BASE + 2 * ig->idem_added;
  if (budget > IDEM_SWEEP_MAX)
    budget = IDEM_SWEEP_MAX;
  cph_txn t;
  if (cph_txn_begin_child(parent, &t) != CPH_OK)
    return;
  cph_cursor c;
  if (cph_cursor_open(&t, CPH_DB_IDEM_KEYS, &c) != CPH_OK) {
    cph_txn_abort(&t);
    return;
  }
  cph_val k, v;
  int rc = cph_cursor_seek(&c, ig->idem_resuming ? &ig->idem_resume : NULL, &k, &v);
  for (uint64_t seen = 0; rc == CPH_OK && seen < budget; seen++) {
    if (idem_expired(ig, &v, now_ms)) {
      if (cph_cursor_del(&c) != CPH_OK) {
        rc = CPH_EIO;
        break;
      }
    } /* after a delete LMDB's cursor stands on the next key already; MDB_NEXT returns it */
    rc = cph_cursor_next(&c, &k, &v);
  }
  /* where the next step starts: the key the cursor stands on, or the first when it ran out */
  cph_key resume;
  cph_key_reset(&resume);
  bool resuming = rc == CPH_OK && k.len <= CPH_KEY_MAX;
  if (resuming) {
    memcpy(resume.data, k.data, k.len);
    resume.len = k.len;
  }
  cph_cursor_close(&c);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND) {
    cph_txn_abort(&t);
    return;
  }
  if (cph_txn_commit(&t) != CPH_OK) {
    cph_warn("forgetting idempotency keys: %s", t.err.msg);
    return; /* the same step again at the next tick */
  }
  ig->idem_added = 0;
  ig->idem_resume = resume;
  ig->idem_resuming = resuming;
}

/* The memory scope of channel chan: '#' and its name (cut at CPH_CHANNEL_MAX bytes). */
static void channel_scope(const char *chan, char scope[CPH_CHANNEL_MAX + 2]) {
  size_t n = strnlen(chan, CPH_CHANNEL_MAX);
  scope[0] = CPH_CHANNEL_SCOPE_PREFIX;
  memcpy(scope + 1, chan, n);
  scope[1 + n] = '\0';
}

/* Cluster mode (an event of the log, cph_event_in.memory_origin): the raw memory of event
 * event_id in scope is the event's memory cluster-wide, under its origin (message_origin). One
 * this node has already — taken from the log's items at a takeover, or minted by another
 * delivery of the same event (a forward, a rebuild's) — is linked to the event instead of
 * minted again; a new one is indexed under it. */
static void mint_raw(cph_ingest *ig, cph_txn *t, const char *scope, const char *body,
                     uint64_t event_id, const char *origin, bool embed, uint64_t *raw_id) {
  uint64_t here = 0;
  const char *node = ig->env->reply_origin_node ? ig->env->reply_origin_node : "";
  if (memory_find_origin(t, node, origin, &here) == CPH_OK && here) {
    if (memory_link_source(ig->memory, t, here, event_id) == CPH_OK)
      *raw_id = here;
    return;
  }
  if (memory_mint(ig->memory, t, scope, CPH_MEMORY_RAW, body, event_id, embed, raw_id) == CPH_OK)
    memory_note_origin(t, *raw_id, origin);
}

/* Mints the memories an event gives (DESIGN §7): a raw memory scoped to its channel for a
 * non-duplicate on a channel that is not aggregate-only (under origin when there is one:
 * mint_raw); one aggregate memory per family, when the family is created. Embeddings per
 * backpressure_embed_allowed(). */
static void mint_memories(cph_ingest *ig, cph_txn *t, const char *channel_name, int step, bool raw,
                          const dedupe_verdict *v, const char *body, uint64_t event_id,
                          const char *origin, uint64_t *raw_id) {
  char scope[CPH_CHANNEL_MAX + 2];
  channel_scope(channel_name, scope);
  bool embed = backpressure_embed_allowed(ig->env->policy, step, false);
  if (raw && *body && origin)
    mint_raw(ig, t, scope, body, event_id, origin, embed, raw_id);
  else if (raw && *body)
    memory_mint(ig->memory, t, scope, CPH_MEMORY_RAW, body, event_id, embed, raw_id);
  if (v->family_created && v->sample) {
    size_t len = strlen(v->sample) + strlen(channel_name) + 48;
    char *text = malloc(len);
    if (!text)
      return;
    snprintf(text, len, "[aggregate] repeated in #%s: %s", channel_name, v->sample);
    uint64_t id = 0;
    char tag[32];
    memory_family_tag(v->family, tag);
    if (memory_mint(ig->memory, t, scope, CPH_MEMORY_AGGREGATE, text, event_id,
                    backpressure_embed_allowed(ig->env->policy, step, true), &id) == CPH_OK)
      memory_add_tag(ig->memory, t, id, tag); /* aggregate_upsert finds and updates this one */
    free(text);
  }
}

/* What the backpressure bookkeeping learns of an accepted event, once its request
 * committed. */
typedef struct ingest_after {
  const char *chan; /* the event's channel (borrowed) or chan_owned */
  char *chan_owned; /* "direct:<session>" */
  uint64_t family;  /* the family it joined, 0 none */
} ingest_after;

/* One request's ingest: its events' writes share one child txn of the pass; memory follows
 * each event as soon as its writes are in (the next event of the request must see it: near
 * duplicates, the queue cap) and is put back if the request fails. */
typedef struct ingest_req {
  cph_txn t;
  delivery_log dl;
  ingest_after *after; /* per event */
  uint64_t embed_queue_before;
  int64_t now_ms; /* the request's time on the wall clock, read once: its events' received_ms */
  struct cph_arena_chunk **strings; /* the op's results' (u.ingest.strings) */
  /* The backpressure step of the channel asked last (step_chan: an event's own channel string,
   * alive for the request). Steps change only at the engine's checks, between passes. */
  const char *step_chan;
  int step;
  bool tails_used; /* a history copy read the channels' warm tails through t */
} ingest_req;

/* The channel an event goes to: its own, or its session's direct channel "direct:<session>"
 * written into direct; NULL when it names neither. */
#define DIRECT_NAME_MAX 160
static const char *event_channel(const cph_event_in *in, char direct[DIRECT_NAME_MAX]) {
  if (in->channel)
    return in->channel;
  if (!in->session)
    return NULL;
  snprintf(direct, DIRECT_NAME_MAX, "direct:%s", in->session);
  return direct;
}

cph_event_hasher *cph_event_hasher_new(void) { return dedupe_hasher_new(); }
void cph_event_hasher_free(cph_event_hasher *h) { dedupe_hasher_free(h); }

int cph_event_prepare(cph_event_hasher *h, const cph_event_in *in, int32_t shingle_words,
                      int64_t min_length, cph_event_prep *out) {
  memset(out, 0, sizeof *out);
  char direct[DIRECT_NAME_MAX];
  const char *chan = event_channel(in, direct);
  if (!in->body || !in->sender || !*in->sender || !chan)
    return CPH_OK; /* rejected by ingest_one before anything is hashed */
  return dedupe_prepare(h, chan, in->sender, in->body, shingle_words, min_length, out);
}

/* Near-duplicate folding applies to bulk traffic only (DESIGN §5): a bulk channel or one at
 * backpressure step >= 1 (any sender), a bulk sender (its own messages); never an event that
 * names a session. */
static dedupe_near near_scope(const cph_ingest *ig, const cph_event_in *in, const char *chan,
                              int step) {
  if (in->session || in->mentions.count)
    return DEDUPE_NEAR_OFF;
  if (step >= BP_STEP_AGGREGATE_ONLY || cph_policy_dedupe_is_bulk(ig->env->policy, chan, NULL))
    return DEDUPE_NEAR_CHANNEL;
  return cph_policy_dedupe_is_bulk(ig->env->policy, NULL, in->sender) ? DEDUPE_NEAR_SENDER
                                                                      : DEDUPE_NEAR_OFF;
}

/* How many of a channel's newest entries a history copy is looked for among: it may have come
 * here before by another way (a moved session's state carries its channels' newest entries,
 * core/handover.c), after which the channel took what arrived meanwhile. */
#define HISTORY_COPY_MATCH 256

typedef struct copy_find {
  const cph_event_in *in;
  uint64_t event_id; /* the entry found holding it, 0 none */
} copy_find;

static bool find_copy(void *ctx, uint64_t index, const cph_event_rec *ev) {
  copy_find *cf = ctx;
  (void)index;
  if (ev->ts_ms != cf->in->ts_ms || !ev->body || !ev->sender ||
      strcmp(ev->body, cf->in->body) != 0 || strcmp(ev->sender, cf->in->sender) != 0)
    return true;
  cf->event_id = ev->id;
  return false;
}

/* Whether the channel's newest HISTORY_COPY_MATCH entries hold in (find_copy's test) — from
 * its warm tail (chantail.h: in memory once a turn or an earlier copy read it; ingest's own
 * child txn reads the entries it lacks), or walking the store when tails are off (:sessions
 * :warm-channels 0). *event_id: the entry's event, 0 none. */
static int copy_held(cph_ingest *ig, ingest_req *rq, const cph_event_in *in, const char *chan,
                     uint64_t *event_id) {
  copy_find cf = {in, 0};
  if (!ig->tails || !ig->env->policy->sessions.warm_channels) {
    int rc = history_tail(&rq->t, chan, HISTORY_COPY_MATCH, find_copy, &cf);
    *event_id = cf.event_id;
    return rc;
  }
  rq->tails_used = true;
  chantail *tl;
  int rc = chantails_get(ig->tails, &rq->t, chan, &tl);
  chantail_entry *e;
  /* The events of one request share their time, so most entries pass the time's test: the
   * length and the first byte turn nearly all the others away before a compare. */
  size_t body_len = strlen(in->body);
  for (size_t i = 0; rc == CPH_OK && i < HISTORY_COPY_MATCH &&
                     (e = chantail_newest(tl, &rq->t, i, &rc)) != NULL;
       i++) {
    if ((rc = chantail_load(ig->tails, &rq->t, e)) != CPH_OK)
      break;
    if (e->ts_ms == in->ts_ms && e->body && e->body_len == body_len &&
        e->body[0] == in->body[0] && e->sender && memcmp(e->body, in->body, body_len) == 0 &&
        strcmp(e->sender, in->sender) == 0) {
      cf.event_id = e->event_id;
      break;
    }
  }
  *event_id = cf.event_id;
  return rc;
}

/* Cluster mode: the identity of in's message in channel chan, accepted at ts_ms (memory_
 * event_origin of its scope, sender, time and body), which all its copies share. Computed once
 * an event (ingest_one): it is a SHA-256. */
static void message_origin(const char *chan, const cph_event_in *in, int64_t ts_ms,
                           char origin[MEMORY_EVENT_ORIGIN_LEN + 1]) {
  char scope[CPH_CHANNEL_MAX + 2];
  channel_scope(chan, scope);
  memory_event_origin(scope, in->sender, ts_ms, in->body, origin);
}

/* Whether an earlier copy of a repeat (cluster mode) was applied here: dedupe_copy_seen, under
 * the message's time and the first 16 bytes of its identity, origin. */
static int repeat_copy_seen(cph_ingest *ig, cph_txn *t, const cph_event_in *in, const char *origin,
                            bool *seen) {
  uint8_t id[16]; /* from the hash's hex digits (lowercase) memory_event_origin wrote */
  for (size_t i = 0; i < sizeof id; i++) {
    const char *h = origin + MEMORY_EVENT_ORIGIN_HASH_AT + 2 * i;
    int hi = h[0] <= '9' ? h[0] - '0' : h[0] - 'a' + 10;
    int lo = h[1] <= '9' ? h[1] - '0' : h[1] - 'a' + 10;
    id[i] = (uint8_t)(hi << 4 | lo);
  }
  return dedupe_copy_seen(ig->dedupe, t, in->ts_ms, id, sizeof id, seen);
}

/* Whether an earlier copy of in (cluster mode: in->memory_origin) was applied here, found by
 * the message's identity where the channel's newest HISTORY_COPY_MATCH entries no longer hold
 * it — a batch of a thousand messages applied before their forwards, a busy channel. The
 * first copy minted the message's raw memory under its origin (mint_raw), and that memory's
 * source is an event of this node whose message its history holds: the first copy, a later
 * copy linked to it, or a moved state's event found in the history (core/handover.c). A
 * memory taken from the log with no source yet (a takeover's import) is no copy here.
 * *event_id: that event, 0 none. */
static int copy_by_origin(cph_ingest *ig, cph_txn *t, const cph_event_in *in, const char *chan,
                          const char *origin, uint64_t *event_id) {
  *event_id = 0;
  const char *node = ig->env->reply_origin_node ? ig->env->reply_origin_node : "";
  uint64_t mem = 0;
  int rc = memory_find_origin(t, node, origin, &mem);
  if (rc || !mem)
    return rc;
  cph_memory_rec m;
  if ((rc = memory_read(t, mem, &m, "matching a copy")) != CPH_OK)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  uint64_t source = m.source_event_id;
  cph_record_free(&cph_memory_desc, &m);
  if (!source)
    return CPH_OK;
  cph_key ek = cph_key_of_u64(source);
  cph_event_rec ev;
  rc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc; /* gone with retention: taken for new */
  if (event_is_message(&ev, chan, in->sender, in->ts_ms, in->body))
    *event_id = source;
  cph_record_free(&cph_event_desc, &ev);
  return CPH_OK;
}

/* An event with history_only (cph_event_in): into the channel's history once, nothing else. */
static int history_copy(cph_ingest *ig, ingest_req *rq, const cph_event_in *in,
                        const char *channel_name, cph_event_result *res, cph_err *err) {
  cph_txn *t = &rq->t;
  uint64_t held = 0;
  int rc = copy_held(ig, rq, in, channel_name, &held);
  if (rc)
    return cph_err_set(err, rc, "%s", t->err.msg[0] ? t->err.msg : cph_strerror(rc));
  if (held) {
    res->status = CPH_EV_DUPLICATE;
    res->id = held;
    return CPH_OK;
  }
  uint64_t event_id = 0;
  cph_txn_next_id(t, "event", &event_id);
  cph_event_rec ev = {0};
  ev.id = event_id;
  ev.channel = (char *)channel_name;
  ev.sender = in->sender;
  ev.body = in->body;
  ev.kind = in->kind;
  ev.key = in->key;
  ev.ts_ms = in->ts_ms ? in->ts_ms : rq->now_ms;
  ev.received_ms = rq->now_ms;
  ev.status = CPH_EVENT_STORED;
  cph_key ek = cph_key_of_u64(event_id);
  cph_txn_append_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  history_append(t, channel_name, event_id, NULL);
  if (in->key)
    idem_put(ig, t, in->key, event_id);
  if (t->ret)
    return cph_err_set(err, t->ret, "%s", t->err.msg);
  res->status = CPH_EV_STORED;
  res->id = event_id;
  return CPH_OK;
}

/* One event, written in the request's txn. Returns CPH_OK (the result says accepted or
 * rejected), or the error that fails the whole request (then err says why).
 *
 * Order: validation -> idempotency key (`duplicate`, stored once) -> content dedupe (a repeat
 * is `aggregated`: stored with its hash, joins its family, mints no memory, stays out of the
 * channel history, and folds into each target's queued entry of its family — or is staged
 * anew, counted, once that entry was consumed) -> routing -> delivery to every target (the
 * accounting rule: nothing routed vanishes). Aggregate-only (backpressure step >= 1) mints no
 * raw memory and lets near duplicates fold; step 5 stores an event that reached nobody
 * without its body. Memory (sessions, dedupe rings) follows each write at once and is put
 * back if the request fails. */
static int ingest_one(cph_ingest *ig, ingest_req *rq, cph_event_in *in, cph_event_result *res,
                      ingest_after *after, cph_err *err) {
  memset(res, 0, sizeof *res);
  if (!in->body) {
    reject(res, rq->strings, "body", "body is required");
    return CPH_OK;
  }
  if (!in->sender || !*in->sender) {
    reject(res, rq->strings, "sender", "sender is required");
    return CPH_OK;
  }
  csession *explicit_target = NULL;
  if (in->session) {
    explicit_target = sessions_get(ig->sessions, in->session);
    if (!explicit_target) {
      reject(res, rq->strings, "session", "no such session");
      return CPH_OK;
    }
  }
  char direct[DIRECT_NAME_MAX];
  const char *channel_name = event_channel(in, direct);
  if (!channel_name) {
    reject(res, rq->strings, "channel", "an event needs a channel or a session");
    return CPH_OK;
  }
  if (!*channel_name || strlen(channel_name) > CPH_CHANNEL_MAX) {
    reject(res, rq->strings, "channel", "a channel name is 1 to 256 bytes");
    return CPH_OK;
  }
  if (in->key && (!*in->key || strlen(in->key) > 256)) {
    reject(res, rq->strings, "key", "an idempotency key is 1 to 256 bytes");
    return CPH_OK;
  }

  cph_txn *t = &rq->t;
  uint64_t original;
  if (in->key && idem_seen(ig, t, in->key, &original)) {
    res->status = CPH_EV_DUPLICATE;
    res->id = original;
    return CPH_OK;
  }
  if (in->history_only)
    return history_copy(ig, rq, in, channel_name, res, err);

  int step;
  if (rq->step_chan && strcmp(rq->step_chan, channel_name) == 0) {
    step = rq->step;
  } else {
    step = backpressure_step(ig->bp, ig->env->policy, channel_name);
    if (channel_name == in->channel) { /* not a direct channel's name, made on the stack */
      rq->step_chan = channel_name;
      rq->step = step;
    }
  }
  /* Cluster mode: another copy of a message this node's channel history holds already — the
   * channel's `in` event applied here, or another session's forward of it (each session gets
   * its own copy, server/clusterflow.h 3.; every copy carries the time the message was
   * accepted, so the same channel, sender, time and body is the same message). As on one node
   * it is one message: not a repeat of itself (no family, no "[aggregate] repeated" memory, no
   * fold into an entry), not a second history entry, one memory (mint_raw links the one the
   * first copy minted). The session's view shows the history's entry as its message
   * (context.c log_copy). Looked for among the channel's newest HISTORY_COPY_MATCH entries,
   * then by the raw memory the first copy minted (copy_by_origin). */
  uint64_t same = 0;
  char origin_buf[MEMORY_EVENT_ORIGIN_LEN + 1];
  const char *origin = NULL; /* the message's identity (cluster mode) */
  /* the copies of a channel's message on its nodes (an event to a session alone, on its
   * direct channel, has none: its origin names its raw memory, server/clusterflow.h 16.) */
  bool copies = false;
  if (in->memory_origin && channel_name) {
    message_origin(channel_name, in, in->ts_ms ? in->ts_ms : rq->now_ms, origin_buf);
    origin = origin_buf;
    copies = in->channel;
  }
  if (copies) {
    int crc = copy_held(ig, rq, in, channel_name, &same);
    if (crc == CPH_OK && !same)
      crc = copy_by_origin(ig, t, in, channel_name, origin, &same);
    if (crc)
      return cph_err_set(err, crc, "%s", t->err.msg[0] ? t->err.msg : cph_strerror(crc));
  }
  int64_t dd_now = env_wall_ms(ig->env);
  dedupe_verdict v;
  if (dedupe_classify(ig->dedupe, &ig->env->policy->dedupe, t, channel_name, in->sender, in->body,
                      dd_now, step >= BP_STEP_WIDEN_DEDUPE ? BP_DEDUPE_WIDEN : 1,
                      near_scope(ig, in, channel_name, step), in->prep, &v) != CPH_OK) {
    dedupe_verdict_free(&v);
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  }
  if (same)
    v.kind = DEDUPE_NONE; /* and dedupe saw it with the first copy: not written again */
  bool dup = v.kind != DEDUPE_NONE;
  /* Cluster mode: a repeat (no history entry, no raw memory for copy_held or copy_by_origin to
   * find) has copies too; its family counts it once. A later copy still folds into its
   * session's entry of the family (deliver), and is not written to dedupe again. */
  bool repeat_copy = false;
  /* and the message it repeats, as this node holds it: a session's entry of another copy of it
   * takes the repeat (deliver, copy_fold_target) */
  repeat_original orig = {0};
  if (dup && copies && in->ts_ms) {
    int crc = repeat_copy_seen(ig, t, in, origin, &repeat_copy);
    if (crc) {
      dedupe_verdict_free(&v);
      return cph_err_set(err, crc, "%s", t->err.msg[0] ? t->err.msg : cph_strerror(crc));
    }
  }
  bool aggregate_only = step >= BP_STEP_AGGREGATE_ONLY;

  /* Routing: the explicit session, else the channel's subscribers; plus every mention. cap is
   * their count, the most there can be (an event to a few sessions needs no allocation). */
  size_t cap = 1;
  channel *ch = sessions_channel(ig->sessions, channel_name, false);
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
  if (explicit_target)
    add_target(ts, &n, cap, explicit_target, false, true);
  else if (ch && !in->only_session)
    for (size_t i = 0; i < ch->n_subscribers; i++) /* a subscriber list has no repeats */
      ts[n++] = (target){ch->subscribers[i], false, false};
  for (size_t i = 0; i < in->mentions.count; i++) {
    csession *m = in->mentions.items[i] ? sessions_get(ig->sessions, in->mentions.items[i]) : NULL;
    if (m && (!in->only_session || m == explicit_target))
      add_target(ts, &n, cap, m, true, true); /* mentions of unknown sessions reach nobody */
  }

  /* while_running :reject (DESIGN §4): a session whose turn is running refuses the event;
   * it does not reach that session (so is not counted for it) and still reaches the others.
   * The refusing sessions leave ts for res->busy. */
  size_t n_busy = 0;
  for (size_t i = 0; i < n; i++)
    if (arrival_mode(ig, ts[i].session) == CPH_POLICY_WR_REJECT)
      n_busy++;
  if (n_busy) {
    res->busy.items = cph_arena_ptrs(rq->strings, n_busy);
    if (!res->busy.items) {
      dedupe_verdict_free(&v);
      if (ts != local)
        free(ts);
      return cph_err_set(err, CPH_ENOMEM, "out of memory");
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
      if (arrival_mode(ig, ts[i].session) != CPH_POLICY_WR_REJECT) {
        ts[kept++] = ts[i];
        continue;
      }
      char *id = result_str(rq->strings, ts[i].session->id);
      if (!id) {
        dedupe_verdict_free(&v);
        if (ts != local)
          free(ts);
        return cph_err_set(err, CPH_ENOMEM, "out of memory");
      }
      res->busy.items[res->busy.count++] = id;
    }
    n = kept;
  }

  uint64_t event_id = 0;
  int64_t now_ms = rq->now_ms;
  cph_txn_next_id(t, "event", &event_id);
  int rc = CPH_OK;
  if (!same && !repeat_copy)
    rc = dedupe_write(ig->dedupe, t, channel_name, in->body, event_id, dd_now, &v);
  if (rc && !t->ret) { /* out of memory building the family */
    rc = cph_err_set(err, rc, "out of memory");
    goto done;
  }
  cph_event_rec ev = {0};
  ev.id = event_id;
  ev.channel = (char *)channel_name;
  ev.sender = in->sender;
  /* Step 5: hash + metadata stay; the payload goes where nobody loses its text — an event
   * that reached nobody, or an exact repeat counted in an entry that shows it. */
  ev.body = step >= BP_STEP_DROP_PAYLOADS && payload_shown_elsewhere(ts, n, &v) ? NULL : in->body;
  ev.session = in->session;
  ev.mentions = in->mentions.items;
  ev.n_mentions = (uint32_t)in->mentions.count;
  ev.kind = in->kind;
  ev.key = in->key;
  ev.ts_ms = in->ts_ms ? in->ts_ms : now_ms;
  ev.received_ms = now_ms;
  ev.status = dup ? CPH_EVENT_AGGREGATED : n ? CPH_EVENT_QUEUED : CPH_EVENT_STORED;
  memcpy(ev.body_sha256, v.sha256, sizeof ev.body_sha256);
  ev.simhash = v.simhash;
  ev.family = v.family;
  cph_key ek;
  cph_key_reset(&ek);
  cph_key_u64(&ek, event_id);
  cph_txn_append_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev); /* ids ascend */
  if (!dup && !same)
    history_append(t, channel_name, event_id, NULL);
  if (in->key)
    idem_put(ig, t, in->key, event_id);
  uint64_t raw_memory = 0;
  /* cluster mode: under its identity cluster-wide, of the accepted body (server/clusterflow.h
   * 16.) */
  mint_memories(ig, t, channel_name, step, !dup && !aggregate_only, &v, in->body, event_id,
                origin, &raw_memory);
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
  res->sessions.items = cph_arena_ptrs(rq->strings, n ? n : 1);
  if (!res->sessions.items) {
    rc = cph_err_set(err, CPH_ENOMEM, "out of memory");
    goto done;
  }
  if (dup && copies)
    orig.event_id = v.original_event;
  for (size_t i = 0; i < n; i++) {
    rc = deliver(ig, t, ts[i].session, event_id, ts[i].mentioned, ts[i].direct, dup ? &v : NULL,
                 &orig, now_ms, &rq->dl);
    if (rc == CPH_OK &&
        !(res->sessions.items[res->sessions.count] = result_str(rq->strings, ts[i].session->id)))
      rc = CPH_ENOMEM;
    if (rc == CPH_OK && arrival_mode(ig, ts[i].session) == CPH_POLICY_WR_RESTART)
      rc = note_restart(ig, ts[i].session);
    if (rc) {
      rc = t->ret ? cph_err_set(err, t->ret, "%s", t->err.msg)
                  : cph_err_set(err, rc, "out of memory");
      goto done;
    }
    res->sessions.count++;
  }

  /* Every write of the event is in: memory follows (put back if the request fails). */
  if (!same && !repeat_copy)
    dedupe_commit(ig->dedupe, channel_name, event_id, dd_now, &v);
  after->chan = after->chan_owned ? after->chan_owned : channel_name;
  after->family = dup ? v.family : 0;
  res->id = event_id;
  res->status = dup ? CPH_EV_AGGREGATED : n ? CPH_EV_QUEUED : CPH_EV_STORED;
  res->memory_id = in->memory_item ? raw_memory : 0; /* its item: engine.c */
  if (n_busy && !n) {
    /* Every session it was routed to refused it: stored (its id says where), reached none. */
    res->status = CPH_EV_REJECTED;
    res->field = result_str(rq->strings, explicit_target ? "session"
                                         : in->mentions.count ? "mentions"
                                                              : "channel");
    res->reason = result_str(rq->strings, "session_busy");
    if (!res->field || !res->reason)
      rc = cph_err_set(err, CPH_ENOMEM, "out of memory");
  }
done:
  cph_record_free(&cph_event_desc, &orig.rec);
  dedupe_verdict_free(&v);
  if (ts != local)
    free(ts);
  return rc;
}

/* How many events ahead of its probe a prepared event's exact-filter slot is fetched. */
#define INGEST_PREFETCH_AHEAD 4

/* Ingest stops while less than env_write_reserve() of the map is free. */
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
static int ingest_room(cph_ingest *ig, cph_txn *t, size_t *room, cph_err *err) {
  size_t live = 0, map = 0;
  int rc = cph_txn_space(t, &live, &map);
  if (rc)
    return cph_err_set(err, rc, "cannot tell how full data dir '%s' is: %s", ig->env->data_dir,
                       cph_strerror(rc));
  size_t reserve = env_write_reserve(map);
  size_t margin = 0;
  if (ig->store_full)
    margin =
        map / INGEST_RESUME_DIV > INGEST_RESUME_MIN ? map / INGEST_RESUME_DIV : INGEST_RESUME_MIN;
  if (live + reserve + margin <= map) {
    *room = map - reserve - live;
    ig->store_full = false;
    return CPH_OK;
  }
  ig->store_full = true;
  cph_store_note_map_full(ig->env->store); /* the engine grows the map and retries (store.h) */
  return cph_err_set(err, CPH_EFULL,
                     "storage full: %zu KiB of the %zu MiB map of data dir '%s' hold data and "
                     "ingest keeps the last %zu KiB for workers (the map grows up to :server "
                     ":max-map-size-mb and what the disk holds)",
                     live >> 10, map >> 20, ig->env->data_dir, reserve >> 10);
}

/* The request failed: none of its writes land and memory goes back to before it. */
static void request_rollback(cph_ingest *ig, ingest_req *rq) {
  cph_txn_abort(&rq->t);
  targets_undo(ig, &rq->dl);
  dedupe_rollback(ig->dedupe);
  memory_batch_forget(ig->memory);
  /* memory_mint counted what did not land */
  memory_embed_queue_set(ig->memory, rq->embed_queue_before);
}

/* A request's events in one child txn of the pass (group commit): one failing request — a
 * full store, say — fails alone and stores none of its events; the other requests of the
 * pass still commit. */
void ingest_apply(cph_ingest *ig, cph_op *op) {
  size_t n = op->u.ingest.n_events;
  op->u.ingest.results = calloc(n ? n : 1, sizeof *op->u.ingest.results);
  ingest_req rq = {0};
  rq.strings = &op->u.ingest.strings;
  rq.after = calloc(n ? n : 1, sizeof *rq.after);
  /* room for a delivery of each event up front, not grown by doubling through the request
   * (without it, undo_note grows the log as it goes) */
  if (n > 64 && (rq.dl.items = malloc(n * sizeof *rq.dl.items)) != NULL)
    rq.dl.cap = n;
  if (!op->u.ingest.results || !rq.after) {
    free(rq.after);
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  cph_err err;
  int rc = cph_txn_begin_child(&ig->env->txn, &rq.t);
  if (rc)
    cph_err_set(&err, rc, "%s", rq.t.err.msg);
  if (rc == CPH_OK) {
    rq.embed_queue_before = memory_embed_queue(ig->memory);
    rq.now_ms = cph_wall_ms();
    dedupe_savepoint(ig->dedupe, n);
    memory_batch_begin(ig->memory, rq.now_ms);
    size_t room = 0; /* bytes left before the reserve at the last look, less the estimates */
    for (size_t i = 0; i < n && rc == CPH_OK; i++) {
      const char *body = op->u.ingest.events[i].body;
      size_t need = 2 * (body ? strlen(body) : 0) + INGEST_EVENT_OVERHEAD;
      if (room < need)
        rc = ingest_room(ig, &rq.t, &room, &err);
      room = room > need ? room - need : 0;
      /* A prepared event's exact hash is known ahead: its filter slot is fetched a few events
       * before its probe (the window's filter is far larger than the caches). */
      const cph_event_prep *ahead =
          i + INGEST_PREFETCH_AHEAD < n ? op->u.ingest.events[i + INGEST_PREFETCH_AHEAD].prep : NULL;
      if (ahead && ahead->ready)
        dedupe_prefetch(ig->dedupe, ahead->sha256);
      if (rc == CPH_OK)
        rc = ingest_one(ig, &rq, &op->u.ingest.events[i], &op->u.ingest.results[i], &rq.after[i],
                        &err);
    }
    if (rc == CPH_OK && dedupe_flush(ig->dedupe, &rq.t) != CPH_OK)
      rc = cph_err_set(&err, rq.t.ret, "%s", rq.t.err.msg);
    if (rc == CPH_OK && (rc = memory_batch_flush(ig->memory, &rq.t)) != CPH_OK)
      rc = rq.t.ret ? cph_err_set(&err, rq.t.ret, "%s", rq.t.err.msg)
                    : cph_err_set(&err, rc, "writing the memory index: %s", cph_strerror(rc));
    if (rc == CPH_OK && (rc = fold_writes_flush(&rq.t, &rq.dl)) != CPH_OK)
      rc = rq.t.ret ? cph_err_set(&err, rq.t.ret, "%s", rq.t.err.msg)
                    : cph_err_set(&err, rc, "writing the folded inbox entries: %s",
                                  cph_strerror(rc));
    if (rc == CPH_OK && cph_txn_commit(&rq.t) != CPH_OK)
      rc = cph_err_set(&err, rq.t.ret, "%s", rq.t.err.msg);
    if (rc) {
      request_rollback(ig, &rq);
      ig->n_restart = 0; /* nothing landed: no turn is superseded */
      /* The tails, and the event cache their entries were read into, may hold what the
       * aborted txn wrote, under event ids the abort gives back for reuse. */
      if (rq.tails_used) {
        cph_evcache_clear(ig->tails->evcache);
        chantails_clear(ig->tails);
      }
    } else {
      for (size_t i = 0; i < n; i++)
        ig->prepared_total += op->u.ingest.events[i].prep && op->u.ingest.events[i].prep->ready;
    }
  }
  if (rc) {
    if (rc == CPH_EFULL) {
      ig->store_full = true;
      /* A full map is retried once it has grown (engine.c): counted only if it cannot. */
      if (!cph_store_map_full(ig->env->store))
        metrics_storage_full(ig->metrics);
    }
    op_fail(op, rc, "events", "%s", err.msg);
  } else {
    for (size_t i = 0; i < n; i++) {
      const ingest_after *a = &rq.after[i];
      if (a->chan)
        backpressure_note_event(ig->bp, a->chan, a->family, env_now(ig->env));
      if (!op->u.ingest.events[i].history_only) /* another node's entry: not an event here */
        metrics_event(ig->metrics, op->u.ingest.results[i].status);
    }
  }
  if (rq.tails_used) /* what a turn keeps warm: the copies' channels join that count */
    chantails_release(ig->tails, (size_t)ig->env->policy->sessions.warm_channels);
  for (size_t i = 0; i < n; i++)
    free(rq.after[i].chan_owned);
  free(rq.after);
  free(rq.dl.items);
  free(rq.dl.folds);
  free(rq.dl.folded);
  members_free(&rq.dl);
}
