/* chantail: recent channel history kept warm (contract in chantail.h). */
#include "chantail.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Entries read per step when a tail reaches further back. */
#define EXTEND_STEP 64

static cph_key log_key(const char *channel, uint64_t index) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, channel);
  cph_key_u64(&k, index);
  return k;
}

/* The channel-log entry under the cursor, if it is one of channel's. */
static bool log_entry(const char *channel, size_t prefix, const cph_val *k, const cph_val *v,
                      uint64_t *index, uint64_t *event_id) {
  if (k->len != prefix + 8 || memcmp(k->data, channel, prefix) != 0 || v->len != 8)
    return false;
  *index = cph_be64_get((const uint8_t *)k->data + prefix);
  *event_id = cph_be64_get(v->data);
  return true;
}

/* A sender held once (chantails_sender): its text, keyed by that text in ct->senders, and how
 * many hold it. */
typedef struct held_sender {
  size_t holders;
  char s[];
} held_sender;

static held_sender *held_of(const char *s) {
  return (held_sender *)(uintptr_t)(s - offsetof(held_sender, s));
}

const char *chantails_sender(cph_chantails *ct, const char *sender) {
  held_sender *h = cph_hmap_get(&ct->senders, sender);
  if (h) {
    h->holders++;
    return h->s;
  }
  size_t n = strlen(sender) + 1;
  if (!(h = malloc(sizeof *h + n)))
    return NULL;
  h->holders = 1;
  memcpy(h->s, sender, n);
  if (cph_hmap_put(&ct->senders, h->s, h) != CPH_OK) {
    free(h);
    return NULL;
  }
  return h->s;
}

void chantails_sender_drop(cph_chantails *ct, const char *sender) {
  if (!sender)
    return;
  held_sender *h = held_of(sender);
  if (--h->holders == 0) {
    cph_hmap_del(&ct->senders, h->s);
    free(h);
  }
}

static void entry_free(cph_chantails *ct, chantail_entry *e) {
  chantails_sender_drop(ct, e->sender);
  free(e->body);
}

static void tail_free(cph_chantails *ct, chantail *tl) {
  for (size_t i = 0; i < tl->n; i++)
    entry_free(ct, &tl->v[tl->off + i]);
  free(tl->v);
  free(tl->channel);
  free(tl);
}

static chantail *tail_of(cph_lru_link *l) { return CPH_LRU_ENTRY(l, chantail, lru); }

static void tail_evict(cph_chantails *ct, chantail *tl) {
  cph_lru_unlink(&ct->lru, &tl->lru);
  cph_hmap_del(&ct->by_channel, tl->channel);
  ct->n--;
  tail_free(ct, tl);
}

void chantails_init(cph_chantails *ct, cph_evcache *evcache) {
  memset(ct, 0, sizeof *ct);
  ct->evcache = evcache;
  ct->evcache_generation = evcache->generation;
  static const char *const NAMES[] = {"sender", "body", "ts_ms"};
  ct->event_fields = cph_record_field_mask(&cph_event_desc, NAMES, 3);
}

void chantails_clear(cph_chantails *ct) {
  while (ct->lru.first)
    tail_evict(ct, tail_of(ct->lru.first));
  cph_hmap_free(&ct->by_channel);
}

void chantails_free(cph_chantails *ct) {
  chantails_clear(ct);
  cph_hmap_free(&ct->senders); /* empty: every holder but the entries has dropped its own */
}

void chantails_release(cph_chantails *ct, size_t keep) {
  while (ct->n > keep)
    tail_evict(ct, tail_of(ct->lru.last));
}

/* Room for `more` entries after the last one: compacts to the front or grows. */
static int room_after(chantail *tl, size_t more) {
  if (tl->off + tl->n + more <= tl->cap)
    return CPH_OK;
  if (tl->n + more <= tl->cap && tl->off > 0) {
    memmove(tl->v, tl->v + tl->off, tl->n * sizeof *tl->v);
    tl->off = 0;
    return CPH_OK;
  }
  size_t cap = tl->cap ? tl->cap : 16;
  while (cap < tl->n + more)
    cap *= 2;
  chantail_entry *v = malloc(cap * sizeof *v);
  if (!v)
    return CPH_ENOMEM;
  if (tl->n)
    memcpy(v, tl->v + tl->off, tl->n * sizeof *v);
  free(tl->v);
  tl->v = v;
  tl->cap = cap;
  tl->off = 0;
  return CPH_OK;
}

/* Room for `more` entries before the first one. */
static int room_before(chantail *tl, size_t more) {
  if (tl->off >= more)
    return CPH_OK;
  size_t cap = tl->cap ? tl->cap : 16;
  while (cap < tl->n + more)
    cap *= 2;
  chantail_entry *v = malloc(cap * sizeof *v);
  if (!v)
    return CPH_ENOMEM;
  size_t off = cap - tl->n; /* the run at the end: the front is free for older entries */
  if (tl->n)
    memcpy(v + off, tl->v + tl->off, tl->n * sizeof *v);
  free(tl->v);
  tl->v = v;
  tl->cap = cap;
  tl->off = off;
  return CPH_OK;
}

/* Keeps the newest CHANTAIL_MAX entries. */
static void trim(cph_chantails *ct, chantail *tl) {
  while (tl->n > CHANTAIL_MAX) {
    entry_free(ct, &tl->v[tl->off]);
    tl->off++;
    tl->n--;
    tl->whole = false;
  }
}

/* Appends the entries written after the tail's newest (all of them for an empty tail that is
 * not known whole: then only its newest, the rest come on demand). */
static int refresh(cph_chantails *ct, chantail *tl, cph_txn *t) {
  const char *chan = tl->channel;
  size_t prefix = strlen(chan) + 1;
  cph_cursor cur;
  int rc = cph_cursor_open(t, CPH_DB_CHANNEL_LOG, &cur);
  if (rc)
    return rc;
  cph_val k, v;
  uint64_t index, event_id;
  cph_key end = log_key(chan, UINT64_MAX);
  rc = cph_cursor_seek(&cur, &end, &k, &v);
  rc = rc == CPH_OK || rc == CPH_ENOTFOUND ? cph_cursor_prev(&cur, &k, &v) : rc;
  if (rc != CPH_OK || !log_entry(chan, prefix, &k, &v, &index, &event_id)) {
    cph_cursor_close(&cur);
    if (rc != CPH_OK && rc != CPH_ENOTFOUND)
      return rc;
    tl->whole = tl->n == 0; /* no entry at all (a tail with entries never loses them) */
    return CPH_OK;
  }
  uint64_t newest = tl->n ? tl->v[tl->off + tl->n - 1].index : 0;
  if (tl->n && index <= newest) { /* nothing new: the common case of a warm tail */
    cph_cursor_close(&cur);
    return CPH_OK;
  }
  if (!tl->n) { /* start from the newest; older entries are read when a turn needs them */
    cph_cursor_close(&cur);
    tl->whole = false;
    if ((rc = room_after(tl, 1)))
      return rc;
    tl->v[tl->off + tl->n++] = (chantail_entry){.index = index, .event_id = event_id};
    return CPH_OK;
  }
  cph_key from = log_key(chan, newest + 1);
  for (rc = cph_cursor_seek(&cur, &from, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&cur, &k, &v)) {
    if (!log_entry(chan, prefix, &k, &v, &index, &event_id))
      break;
    if ((rc = room_after(tl, 1)))
      break;
    tl->v[tl->off + tl->n++] = (chantail_entry){.index = index, .event_id = event_id};
  }
  cph_cursor_close(&cur);
  trim(ct, tl);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int chantails_get(cph_chantails *ct, cph_txn *t, const char *channel, chantail **out) {
  *out = NULL;
  if (ct->evcache->generation != ct->evcache_generation) {
    chantails_clear(ct); /* retention changed an event some tail may hold */
    ct->evcache_generation = ct->evcache->generation;
  }
  chantail *tl = cph_hmap_get(&ct->by_channel, channel);
  if (tl) {
    cph_lru_unlink(&ct->lru, &tl->lru);
  } else {
    if (!(tl = calloc(1, sizeof *tl)) || !(tl->channel = strdup(channel)) ||
        cph_hmap_put(&ct->by_channel, tl->channel, tl) != CPH_OK) {
      if (tl)
        free(tl->channel);
      free(tl);
      return CPH_ENOMEM;
    }
    ct->n++;
  }
  cph_lru_push_first(&ct->lru, &tl->lru);
  int rc = refresh(ct, tl, t);
  if (rc)
    return rc;
  *out = tl;
  return CPH_OK;
}

/* Reads up to EXTEND_STEP entries older than the tail's oldest. */
static int extend(chantail *tl, cph_txn *t) {
  if (!tl->n) { /* refresh found the channel empty */
    tl->whole = true;
    return CPH_OK;
  }
  const char *chan = tl->channel;
  size_t prefix = strlen(chan) + 1;
  uint64_t oldest = tl->v[tl->off].index;
  cph_cursor cur;
  int rc = cph_cursor_open(t, CPH_DB_CHANNEL_LOG, &cur);
  if (rc)
    return rc;
  chantail_entry got[EXTEND_STEP];
  size_t n = 0;
  cph_val k, v;
  uint64_t index, event_id;
  cph_key at = log_key(chan, oldest);
  rc = cph_cursor_seek(&cur, &at, &k, &v);
  rc = rc == CPH_OK || rc == CPH_ENOTFOUND ? cph_cursor_prev(&cur, &k, &v) : rc;
  for (; rc == CPH_OK && n < EXTEND_STEP; rc = cph_cursor_prev(&cur, &k, &v)) {
    if (!log_entry(chan, prefix, &k, &v, &index, &event_id))
      break;
    got[n++] = (chantail_entry){.index = index, .event_id = event_id};
  }
  cph_cursor_close(&cur);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  if (n < EXTEND_STEP)
    tl->whole = true; /* the walk ran off the channel's start */
  if ((rc = room_before(tl, n)))
    return rc;
  for (size_t i = 0; i < n; i++) /* got is newest first */
    tl->v[--tl->off] = got[i];
  tl->n += n;
  return CPH_OK;
}

chantail_entry *chantail_newest(chantail *tl, cph_txn *t, size_t i, int *rc) {
  *rc = CPH_OK;
  if (i >= CHANTAIL_MAX)
    return NULL;
  while (i >= tl->n && !tl->whole && tl->n < CHANTAIL_MAX)
    if ((*rc = extend(tl, t)) != CPH_OK)
      return NULL;
  return i < tl->n ? &tl->v[tl->off + tl->n - 1 - i] : NULL;
}

int chantail_load(cph_chantails *ct, cph_txn *t, chantail_entry *e) {
  if (e->loaded)
    return CPH_OK;
  const cph_evcache_entry *ce = cph_evcache_get(ct->evcache, e->event_id);
  if (ce) {
    const char *sender = chantails_sender(ct, ce->sender);
    char *body = ce->body ? strdup(ce->body) : NULL;
    if (!sender || (ce->body && !body)) {
      chantails_sender_drop(ct, sender);
      free(body);
      return CPH_ENOMEM;
    }
    e->sender = sender;
    e->body = body;
    e->ts_ms = ce->ts_ms;
  } else {
    cph_key ek;
    cph_key_reset(&ek);
    cph_key_u64(&ek, e->event_id);
    cph_event_rec ev = {0};
    int rc = cph_txn_get_record_some(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev, ct->event_fields);
    if (rc && rc != CPH_ENOTFOUND)
      return rc;
    if (rc == CPH_OK) { /* ENOTFOUND: retention removed it; the entry stays, showing nothing */
      cph_evcache_put(ct->evcache, e->event_id, ev.ts_ms, ev.sender, ev.body);
      const char *sender = ev.sender ? chantails_sender(ct, ev.sender) : NULL;
      if (ev.sender && !sender) {
        cph_record_free(&cph_event_desc, &ev);
        return CPH_ENOMEM;
      }
      e->sender = sender;
      e->body = ev.body;
      e->ts_ms = ev.ts_ms;
      ev.body = NULL;
      cph_record_free(&cph_event_desc, &ev);
    }
  }
  e->sender_len = e->sender ? strlen(e->sender) : 0;
  e->body_len = e->body ? strlen(e->body) : 0;
  e->loaded = true;
  return CPH_OK;
}
