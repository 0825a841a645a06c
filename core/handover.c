/* Handover: a session's state, for another node (cluster mode, server/clusterflow.h 11.).
 *
 * The blob: "CPHS", be32 version (1), be32 CPH_STORE_SCHEMA_VERSION, be64 episode, be64 the
 * bits of the credits (a double), then the session's tree records (trees_export), then its
 * recent replies as its channels' history holds them: be32 count, and per reply be32 length +
 * channel, be64 ts_ms, be32 length + body, oldest first; then its newest memories (its own
 * scope; STATE_MEMORIES of each class, STATE_MEMORY_BYTES at most): be32 count, and per memory
 * a kind byte and be32 length + text, oldest first. Version 2 puts, between the tree and the
 * channel replies, the session's newest replies of the replies stream (GET /v1/replies) that
 * have an origin (core/replystream.h; STATE_STREAM_REPLIES, STATE_STREAM_REPLY_BYTES at most):
 * be32 count, and per reply a flag byte (1: it is also one of the channel replies), be32
 * length + origin, be32 length + channel, be64 ts_ms, be32 length + body, oldest first; a
 * flagged reply is left out of the channel replies part (written once: a completion writes
 * each reply to both the stream and its channel's history, and most channel replies are
 * among the stream's newest). A version-1 blob (a node not upgraded yet) lacks that part and
 * still imports. Version 3 adds, after the memories, the session's newest ended turn records
 * (core/turnrecs.h: completed or failed; STATE_TURNS, STATE_TURN_BYTES of encoded records at
 * most) that have an origin: be32 count, and per record be32 length + the record as the store
 * encodes it (store/records.h, its current version) with its origin set, its lease token zero
 * and no inbox entries, oldest first; the node taking the session over stores each one whose
 * origin it lacks as history (a new id there, never leased). A version-2 blob lacks that part
 * and still imports. Version 4 adds, after the turn records, the session's newest seals
 * (core/seals.h; STATE_SEALS, STATE_SEAL_BYTES of encoded records at most, and only those that
 * fit in what the state has left of CPH_HANDOVER_MAX_BYTES: a seal that does not fit is left
 * out whole, never cut) that have an origin: be32 count, and per seal be32 length + the record
 * as the store encodes it with its origin set, oldest first; the node taking the session over
 * stores each one whose origin it lacks under a new seal id there. A version-3 blob lacks that
 * part and still imports. That is what a completion changes of
 * a session and what its next turns read back: its conversation (the input and reply cores of
 * every turn within the history bound, which non-inbox turns render), its replies (which an
 * inbox turn's channel view renders, from the node's own channel history), the nodes workers
 * inserted, the episode; and what the scheduler charged. Read through the pass transaction,
 * after the completion's child committed, so it is exactly what this pass stores.
 * The replies are found among the newest STATE_REPLY_SCAN entries of each channel the session
 * views (its direct channel, then its subscriptions and memberships, STATE_CHANNELS at most),
 * at most STATE_REPLY_BYTES of them: the cost of a completion's export is bounded by that (a
 * few hundred record reads at most), and a reply older than that does not move — neither do
 * the inputs it answered (the channel's traffic: what a turn consumed is not delivered again,
 * what it did not is replayed by the log).
 * The stream replies are what makes a dead node's answers reach people: the node that takes
 * the session over adds each one whose origin its own stream lacks to that stream, so a
 * connector reading every node's stream gets it there (again, if it read it from the dead
 * node already: it drops a repeated origin). They come first after the tree, so they are the
 * last part left out when a state would be too big. */
#include "handover.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "ingest.h"
#include "replystream.h"
#include "seals.h"
#include "turnrecs.h"

#define STATE_MAGIC "CPHS"
#define STATE_VERSION 4u
#define STATE_VERSION_NO_SEALS 3u  /* before the seals; still imported */
#define STATE_VERSION_NO_TURNS 2u  /* before the turn records; still imported */
#define STATE_VERSION_NO_STREAM 1u /* before the stream replies too; still imported */
#define STATE_HEAD 28u
#define STATE_STREAM_REPLIES 64
#define STATE_STREAM_REPLY_BYTES (256u * 1024u)
#define STATE_REPLY_SCAN 64
#define STATE_CHANNELS 16
#define STATE_REPLY_BYTES (256u * 1024u)
#define STATE_MEMORIES 64 /* of each class (raw, other) */
#define STATE_MEMORY_BYTES (256u * 1024u)
#define STATE_TURNS 64
#define STATE_TURN_BYTES (256u * 1024u) /* of the records as encoded, with their lengths */
#define STATE_SEALS 16
/* Of the seals as encoded. A seal renders the session's whole tree: a tree at its history bound
 * (128 message cores) of 500-byte messages seals to ~66 KB, so this carries the newest 3 such
 * seals, or all 16 of short conversations. Measured with 500-byte messages: a state without
 * seals is ~140 KB at the bound, with its newest seals ~380 KB — well under the 1 MiB message
 * limit; and the seals come last, so what does not fit in CPH_HANDOVER_MAX_BYTES is left out. */
#define STATE_SEAL_BYTES (256u * 1024u)
/* A tree alone beyond CPH_HANDOVER_MAX_BYTES is not exported (the caller logs it: the
 * session's previous state stays in the log); the replies and memories are left out when they
 * would not fit. */

/* A reply of a channel's history: collected for a state, or read from one. */
typedef struct state_reply {
  char *channel, *body;
  int64_t ts_ms;
  bool in_stream; /* exporting: the stream part carries it (flagged there), so this part not */
} state_reply;

/* Calls fn(ctx, event) for the newest `scan` entries of channel's history, newest first, until
 * fn returns false. CPH_OK or the store's error. */
static int history_tail(cph_txn *t, const char *chan, size_t scan,
                        bool (*fn)(void *ctx, const cph_event_rec *ev), void *ctx) {
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
      bool more = fn(ctx, &ev);
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

/* v (n items of `size` bytes in room for *cap) with room for one more: v itself, or grown
 * by doubling (from `first`) and *cap updated. NULL out of memory: v and *cap are unchanged. */
static void *room_for_one(void *v, size_t *cap, size_t n, size_t size, size_t first) {
  if (n < *cap)
    return v;
  size_t c = *cap ? 2 * *cap : first;
  void *g = realloc(v, c * size);
  if (g)
    *cap = c;
  return g;
}

typedef struct reply_scan {
  const char *session;
  state_reply *v;
  size_t n, cap, bytes;
  bool nomem;
} reply_scan;

static bool collect_reply(void *ctx, const cph_event_rec *ev) {
  reply_scan *rs = ctx;
  if (!ev->body || !ev->kind || strcmp(ev->kind, "reply") != 0 || strcmp(ev->sender, rs->session))
    return true;
  size_t len = strlen(ev->body) + strlen(ev->channel);
  if (rs->bytes + len > STATE_REPLY_BYTES)
    return false;
  state_reply *g = room_for_one(rs->v, &rs->cap, rs->n, sizeof *g, 8);
  if (!g) {
    rs->nomem = true;
    return false;
  }
  rs->v = g;
  state_reply *r = &rs->v[rs->n];
  r->channel = strdup(ev->channel);
  r->body = strdup(ev->body);
  r->ts_ms = ev->ts_ms;
  r->in_stream = false;
  if (!r->channel || !r->body) {
    free(r->channel);
    free(r->body);
    rs->nomem = true;
    return false;
  }
  rs->n++;
  rs->bytes += len;
  return true;
}

static int reply_cmp(const void *a, const void *b) {
  const state_reply *x = a, *y = b;
  return x->ts_ms < y->ts_ms ? -1 : x->ts_ms > y->ts_ms;
}

static void put_str32(cph_buf *out, const char *str) {
  uint8_t be[4];
  size_t n = strlen(str);
  cph_be32_put(be, (uint32_t)n);
  cph_buf_append(out, be, 4);
  cph_buf_append(out, str, n);
}

static void reply_scan_free(reply_scan *rs) {
  for (size_t i = 0; i < rs->n; i++) {
    free(rs->v[i].channel);
    free(rs->v[i].body);
  }
  free(rs->v);
  rs->v = NULL;
  rs->n = rs->cap = 0;
}

/* The session's replies among the newest entries of its channels (above), oldest first. */
static int collect_channel_replies(const cph_handover *st, const csession *s, reply_scan *rs) {
  cph_txn *t = &st->env->txn;
  char direct[160];
  snprintf(direct, sizeof direct, "direct:%s", s->id);
  const char *chans[STATE_CHANNELS];
  size_t n_chans = 0;
  chans[n_chans++] = direct;
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, s->id);
  cph_session_rec rec;
  bool have_rec = cph_txn_get_record(t, CPH_DB_SESSIONS, &sk, &cph_session_desc, &rec) == CPH_OK;
  for (uint32_t i = 0; have_rec && i < rec.n_subscribe && n_chans < STATE_CHANNELS; i++)
    chans[n_chans++] = rec.subscribe[i];
  for (uint32_t i = 0; have_rec && i < rec.n_member && n_chans < STATE_CHANNELS; i++)
    chans[n_chans++] = rec.member[i];
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && !rs->nomem && i < n_chans; i++)
    rc = history_tail(t, chans[i], STATE_REPLY_SCAN, collect_reply, rs);
  if (rc == CPH_OK && rs->nomem)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK && rs->n > 1)
    qsort(rs->v, rs->n, sizeof *rs->v, reply_cmp);
  if (have_rec)
    cph_record_free(&cph_session_desc, &rec);
  return rc;
}

/* The channel replies part of the blob (above): without those the stream part carries when
 * it was written (skip_in_stream). */
static void write_channel_part(const reply_scan *rs, bool skip_in_stream, cph_buf *out) {
  uint8_t be[8];
  uint32_t count = 0;
  for (size_t i = 0; i < rs->n; i++)
    count += !(skip_in_stream && rs->v[i].in_stream);
  cph_be32_put(be, count);
  cph_buf_append(out, be, 4);
  for (size_t i = 0; i < rs->n; i++) {
    if (skip_in_stream && rs->v[i].in_stream)
      continue;
    put_str32(out, rs->v[i].channel);
    cph_be64_put(be, (uint64_t)rs->v[i].ts_ms);
    cph_buf_append(out, be, 8);
    put_str32(out, rs->v[i].body);
  }
}

/* A reply of the session's replies stream, for a state. */
typedef struct stream_reply {
  char *origin, *channel, *body;
  int64_t ts_ms;
  bool in_history; /* it is also one of the channel replies (flagged in the blob) */
} stream_reply;

/* The session's newest replies of the stream, newest first as collected. */
typedef struct stream_scan {
  stream_reply *v;
  size_t n, cap, bytes;
  bool nomem;
} stream_scan;

static bool collect_stream_reply(void *ctx, const cph_reply_rec *r) {
  stream_scan *ss = ctx;
  size_t len = strlen(r->origin) + strlen(r->channel) + strlen(r->body);
  if (ss->bytes + len > STATE_STREAM_REPLY_BYTES)
    return false;
  stream_reply *g = room_for_one(ss->v, &ss->cap, ss->n, sizeof *g, 8);
  if (!g) {
    ss->nomem = true;
    return false;
  }
  ss->v = g;
  stream_reply *o = &ss->v[ss->n];
  *o = (stream_reply){0};
  o->origin = strdup(r->origin);
  o->channel = strdup(r->channel);
  o->body = strdup(r->body);
  o->ts_ms = r->ts_ms;
  if (!o->origin || !o->channel || !o->body) {
    free(o->origin);
    free(o->channel);
    free(o->body);
    ss->nomem = true;
    return false;
  }
  ss->n++;
  ss->bytes += len;
  return true;
}

static void stream_scan_free(stream_scan *ss) {
  for (size_t i = 0; i < ss->n; i++) {
    free(ss->v[i].origin);
    free(ss->v[i].channel);
    free(ss->v[i].body);
  }
  free(ss->v);
}

/* A reply is written once: a channel reply that is also a stream reply (same channel, time and
 * body — a completion writes both from one reply, and an import keeps both) is flagged in the
 * stream part and left out of the channel part. At most 64 x 64 x 16 time comparisons. */
static void match_parts(stream_scan *ss, reply_scan *rs) {
  for (size_t c = 0; c < rs->n; c++)
    for (size_t k = 0; k < ss->n; k++) {
      stream_reply *r = &ss->v[k];
      if (!r->in_history && r->ts_ms == rs->v[c].ts_ms &&
          strcmp(r->body, rs->v[c].body) == 0 && strcmp(r->channel, rs->v[c].channel) == 0) {
        r->in_history = rs->v[c].in_stream = true;
        break;
      }
    }
}

/* The stream replies part of the blob (above), oldest first. */
static void write_stream_part(const stream_scan *ss, cph_buf *out) {
  uint8_t be[8];
  cph_be32_put(be, (uint32_t)ss->n);
  cph_buf_append(out, be, 4);
  for (size_t i = ss->n; i-- > 0;) {
    uint8_t flag = ss->v[i].in_history;
    cph_buf_append(out, &flag, 1);
    put_str32(out, ss->v[i].origin);
    put_str32(out, ss->v[i].channel);
    cph_be64_put(be, (uint64_t)ss->v[i].ts_ms);
    cph_buf_append(out, be, 8);
    put_str32(out, ss->v[i].body);
  }
}

typedef struct state_memory {
  uint64_t id;
  uint8_t kind;
  char *text;
} state_memory;

static int memory_id_cmp(const void *a, const void *b) {
  const state_memory *x = a, *y = b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Calls fn(ctx, memory) for the newest `scan` live memories of scope in class raw (or the
 * others), newest first, until fn returns false. */
static int memories_tail(cph_txn *t, const char *scope, bool raw, size_t scan,
                         bool (*fn)(void *ctx, const cph_memory_rec *m), void *ctx) {
  memory_scope_cursor c;
  int rc = memory_scope_open(t, scope, raw, &c);
  if (rc)
    return rc;
  rc = memory_scope_newest(&c);
  for (size_t n = 0; rc == CPH_OK && c.id && n < scan; n++) {
    cph_key mk = cph_key_of_u64(c.id);
    cph_memory_rec m;
    int grc = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (grc == CPH_OK) {
      bool more = m.deleted || !m.text || fn(ctx, &m);
      cph_record_free(&cph_memory_desc, &m);
      if (!more)
        break;
    } else if (grc != CPH_ENOTFOUND) {
      rc = grc;
      break;
    }
    rc = memory_scope_older(&c);
  }
  memory_scope_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

typedef struct memory_scan {
  state_memory *v;
  size_t n, cap, bytes;
  bool nomem;
} memory_scan;

static bool collect_memory(void *ctx, const cph_memory_rec *m) {
  memory_scan *ms = ctx;
  size_t len = strlen(m->text);
  if (ms->bytes + len > STATE_MEMORY_BYTES)
    return false;
  state_memory *g = room_for_one(ms->v, &ms->cap, ms->n, sizeof *g, 16);
  if (!g) {
    ms->nomem = true;
    return false;
  }
  ms->v = g;
  if (!(ms->v[ms->n].text = strdup(m->text))) {
    ms->nomem = true;
    return false;
  }
  ms->v[ms->n].id = m->id;
  ms->v[ms->n].kind = m->kind;
  ms->n++;
  ms->bytes += len;
  return true;
}

/* The memories part of the blob (above). */
static int state_export_memories(const cph_handover *st, const csession *s, cph_buf *out) {
  memory_scan ms = {0};
  int rc = memories_tail(&st->env->txn, s->id, true, STATE_MEMORIES, collect_memory, &ms);
  if (rc == CPH_OK && !ms.nomem)
    rc = memories_tail(&st->env->txn, s->id, false, STATE_MEMORIES, collect_memory, &ms);
  if (rc == CPH_OK && ms.nomem)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK) {
    if (ms.n > 1)
      qsort(ms.v, ms.n, sizeof *ms.v, memory_id_cmp);
    uint8_t be[4];
    cph_be32_put(be, (uint32_t)ms.n);
    cph_buf_append(out, be, 4);
    for (size_t i = 0; i < ms.n; i++) {
      cph_buf_append(out, &ms.v[i].kind, 1);
      put_str32(out, ms.v[i].text);
    }
  }
  for (size_t i = 0; i < ms.n; i++)
    free(ms.v[i].text);
  free(ms.v);
  return rc;
}

/* A part of encoded records (the turn records, the seals): be32 count, and per record be32
 * length + the record, v[0..n) collected newest first and written oldest first. */
static void write_records_part(const cph_buf *v, size_t n, cph_buf *out) {
  uint8_t be[4];
  cph_be32_put(be, (uint32_t)n);
  cph_buf_append(out, be, 4);
  for (size_t i = n; i-- > 0;) {
    cph_be32_put(be, (uint32_t)v[i].len);
    cph_buf_append(out, be, 4);
    cph_buf_append(out, v[i].data, v[i].len);
  }
}

/* A part of encoded records being collected: the session's newest turn records or seals that
 * have an origin, each encoded for the state, newest first as collected, at most `room` bytes
 * of them with their lengths. */
typedef struct record_scan {
  const char *node; /* this node's name (the origin of the records made here) */
  cph_buf *v;
  size_t n, cap, bytes, room;
  bool nomem;
} record_scan;

/* Encodes rec (with desc) into rs: 1 kept, 0 it does not fit in what rs has room for, -1 out
 * of memory (rs->nomem set). */
static int scan_keep(record_scan *rs, const cph_record_desc *desc, const void *rec) {
  cph_buf b = {0};
  if (cph_record_encode(desc, rec, &b) != CPH_OK || cph_buf_error(&b)) {
    cph_buf_free(&b);
    rs->nomem = true;
    return -1;
  }
  if (rs->bytes + 4 + b.len > rs->room) {
    cph_buf_free(&b);
    return 0;
  }
  cph_buf *g = room_for_one(rs->v, &rs->cap, rs->n, sizeof *g, 8);
  if (!g) {
    cph_buf_free(&b);
    rs->nomem = true;
    return -1;
  }
  rs->v = g;
  rs->v[rs->n++] = b;
  rs->bytes += 4 + b.len;
  return 1;
}

/* Ends rs's walk, which returned rc: its part (write_records_part) into out when all went
 * well; frees what rs holds. rc, or CPH_ENOMEM. */
static int scan_finish(record_scan *rs, int rc, cph_buf *out) {
  if (rc == CPH_OK && rs->nomem)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK)
    write_records_part(rs->v, rs->n, out);
  for (size_t i = 0; i < rs->n; i++)
    cph_buf_free(&rs->v[i]);
  free(rs->v);
  return rc;
}

/* A turn record for the part: with its origin, no lease, no inbox entries, no job. The
 * newest that fill STATE_TURN_BYTES: the walk stops at the first that does not fit. */
static bool collect_turn(void *ctx, const cph_turn_rec *tr) {
  record_scan *rs = ctx;
  char origin[TURNRECS_ORIGIN_MAX];
  turnrecs_origin(origin, rs->node, tr);
  if (!origin[0])
    return true; /* none (a single node's record): nothing would tell it from another */
  cph_turn_rec out = *tr; /* borrows tr's strings */
  memset(out.lease, 0, sizeof out.lease);
  out.inbox_seqs = NULL;
  out.n_inbox_seqs = 0;
  out.job_id = 0;
  out.origin = origin;
  return scan_keep(rs, &cph_turn_desc, &out) > 0;
}

/* The turn records part of the blob (above), oldest first. */
static int state_export_turns(const cph_handover *st, const csession *s, cph_buf *out) {
  record_scan rs = {st->env->reply_origin_node, NULL, 0, 0, 0, STATE_TURN_BYTES, false};
  int rc = turnrecs_session_newest(&st->env->txn, s->id, STATE_TURNS, collect_turn, &rs);
  return scan_finish(&rs, rc, out);
}

/* A seal for the part, with its origin. One that does not fit is left out whole, and the walk
 * goes on: an older, smaller one may fit. */
static bool collect_seal(void *ctx, const cph_seal_rec *r) {
  record_scan *rs = ctx;
  char origin[SEALS_ORIGIN_MAX];
  seals_origin(origin, rs->node, r);
  if (!origin[0])
    return true; /* none (a single node's seal): nothing would tell it from another */
  cph_seal_rec out = *r; /* borrows r's strings */
  out.origin = origin;
  return scan_keep(rs, &cph_seal_desc, &out) >= 0;
}

/* The seals part of the blob (above), oldest first, at most `room` bytes with its count. */
static int state_export_seals(const cph_handover *st, const csession *s, size_t room,
                              cph_buf *out) {
  room = room < 4 ? 0 : room - 4;
  record_scan rs = {st->env->reply_origin_node, NULL, 0, 0, 0,
                    room < STATE_SEAL_BYTES ? room : STATE_SEAL_BYTES, false};
  int rc = seals_session_newest(&st->env->txn, s->id, STATE_SEALS, collect_seal, &rs);
  return scan_finish(&rs, rc, out);
}

typedef struct memory_find {
  const char *text;
  bool found;
} memory_find;

static bool find_memory(void *ctx, const cph_memory_rec *m) {
  memory_find *mf = ctx;
  mf->found = strcmp(m->text, mf->text) == 0;
  return !mf->found;
}

typedef struct reply_find {
  const char *session, *body;
  int64_t ts_ms;
  bool found;
} reply_find;

static bool find_reply(void *ctx, const cph_event_rec *ev) {
  reply_find *rf = ctx;
  rf->found = ev->ts_ms == rf->ts_ms && ev->body && strcmp(ev->sender, rf->session) == 0 &&
              strcmp(ev->body, rf->body) == 0;
  return !rf->found;
}

/* Reads a be32-length string at *at of data[0..n) into a malloc'd copy; NULL when cut short or
 * out of memory (*bad says which). */
static char *get_str32(const uint8_t *data, size_t n, size_t *at, bool *bad) {
  if (n - *at < 4) {
    *bad = true;
    return NULL;
  }
  uint32_t l = cph_be32_get(data + *at);
  *at += 4;
  if (n - *at < l) {
    *bad = true;
    return NULL;
  }
  char *str = malloc((size_t)l + 1);
  if (str) {
    memcpy(str, data + *at, l);
    str[l] = '\0';
  }
  *at += l;
  return str;
}

/* Adds a reply for a channel's history to list, taking chan and body (freed when it cannot).
 * false: out of memory. */
static bool history_list_add(reply_scan *list, char *chan, char *body, int64_t ts_ms) {
  state_reply *g = room_for_one(list->v, &list->cap, list->n, sizeof *g, 16);
  if (!g) {
    free(chan);
    free(body);
    return false;
  }
  list->v = g;
  list->v[list->n++] = (state_reply){chan, body, ts_ms, false};
  return true;
}

/* The stream replies part: each reply whose origin this node's stream lacks is added to it
 * (a new id here, its time, channel and body as written, no source inbox ids: those were the
 * other node's); *newest is the id of the last one added (unchanged when none). A reply this
 * node holds — it wrote it, or took it over before — is not added again. One flagged as a
 * channel reply joins `history` too. CPH_EINVAL when the part is malformed. */
static int state_import_stream(cph_txn *t, const char *session, const uint8_t *data, size_t n,
                               size_t *used, uint64_t *newest, reply_scan *history) {
  if (n < 4)
    return CPH_EINVAL;
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  int rc = CPH_OK;
  for (uint32_t i = 0; rc == CPH_OK && i < count; i++) {
    if (n - at < 1 || data[at] > 1)
      return CPH_EINVAL;
    bool in_history = data[at++];
    bool bad = false;
    char *origin = get_str32(data, n, &at, &bad);
    char *chan = bad ? NULL : get_str32(data, n, &at, &bad), *body = NULL;
    int64_t ts_ms = 0;
    if (!bad && n - at >= 8) {
      ts_ms = (int64_t)cph_be64_get(data + at);
      at += 8;
      body = get_str32(data, n, &at, &bad);
    } else {
      bad = true;
    }
    bool held = false;
    if (bad || !origin || !chan || !body)
      rc = bad ? CPH_EINVAL : CPH_ENOMEM;
    else if (!*origin || strlen(origin) >= REPLYSTREAM_ORIGIN_MAX) /* none this build makes */
      rc = CPH_EINVAL;
    else
      rc = replystream_holds(t, origin, &held);
    if (rc == CPH_OK && !held) {
      cph_reply_rec rr = {0};
      rr.session = (char *)session;
      rr.channel = chan;
      rr.body = body;
      rr.ts_ms = ts_ms;
      rr.origin = origin;
      rc = replystream_put(t, &rr, NULL, NULL);
      if (rc == CPH_OK)
        *newest = rr.id;
    }
    if (rc == CPH_OK && in_history) {
      if (!history_list_add(history, chan, body, ts_ms))
        rc = CPH_ENOMEM;
      chan = body = NULL; /* the list's now */
    }
    free(origin);
    free(chan);
    free(body);
  }
  *used = at;
  return rc;
}

/* The channel replies part, read into `history`. CPH_EINVAL when it is malformed. */
static int state_read_channel_part(const uint8_t *data, size_t n, size_t *used,
                                   reply_scan *history) {
  if (n < 4)
    return CPH_EINVAL;
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  int rc = CPH_OK;
  for (uint32_t i = 0; rc == CPH_OK && i < count; i++) {
    bool bad = false;
    char *chan = get_str32(data, n, &at, &bad), *body = NULL;
    int64_t ts_ms = 0;
    if (!bad && n - at >= 8) {
      ts_ms = (int64_t)cph_be64_get(data + at);
      at += 8;
      body = get_str32(data, n, &at, &bad);
    } else {
      bad = true;
    }
    if (bad || !chan || !body) {
      rc = bad ? CPH_EINVAL : CPH_ENOMEM;
      free(chan);
      free(body);
    } else if (!history_list_add(history, chan, body, ts_ms)) {
      rc = CPH_ENOMEM;
    }
  }
  *used = at;
  return rc;
}

/* The channel replies (those the stream part flagged and the channel part's), oldest first:
 * each reply its channel's history here lacks (the same session, time and body among the
 * channel's newest STATE_REPLY_SCAN * 2 entries) is stored as a reply event and appended to
 * that history, for the session's context. */
static int state_import_history(cph_txn *t, const char *session, reply_scan *history) {
  if (history->n > 1)
    qsort(history->v, history->n, sizeof *history->v, reply_cmp);
  int64_t now_ms = cph_wall_ms();
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < history->n; i++) {
    const state_reply *r = &history->v[i];
    reply_find rf = {session, r->body, r->ts_ms, false};
    rc = history_tail(t, r->channel, 2 * STATE_REPLY_SCAN, find_reply, &rf);
    if (rc == CPH_OK && !rf.found) {
      uint64_t event_id = 0;
      cph_txn_next_id(t, "event", &event_id);
      cph_event_rec ev = {0};
      ev.id = event_id;
      ev.channel = r->channel;
      ev.sender = (char *)session;
      ev.body = r->body;
      ev.kind = "reply";
      ev.ts_ms = r->ts_ms;
      ev.received_ms = now_ms;
      ev.status = CPH_EVENT_STORED;
      cph_key ek = cph_key_of_u64(event_id);
      cph_txn_put_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
      rc = history_append(t, r->channel, event_id);
    }
  }
  return rc;
}

/* The memories part: each memory whose text the session's newest memories of its class here
 * lack is minted in its scope (its embedding queued, as for any new memory); *used: the part's
 * length. CPH_EINVAL when the part is malformed. */
static int state_import_memories(const cph_handover *st, cph_txn *t, const char *session,
                                 const uint8_t *data, size_t n, size_t *used) {
  if (n < 4)
    return CPH_EINVAL;
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  int rc = CPH_OK;
  for (uint32_t i = 0; rc == CPH_OK && i < count; i++) {
    if (n - at < 1)
      return CPH_EINVAL;
    uint8_t kind = data[at++];
    bool bad = false;
    char *text = get_str32(data, n, &at, &bad);
    if (bad || !text) {
      free(text);
      return bad ? CPH_EINVAL : CPH_ENOMEM;
    }
    memory_find mf = {text, false};
    rc = memories_tail(t, session, kind == CPH_MEMORY_RAW, 2 * STATE_MEMORIES, find_memory, &mf);
    if (rc == CPH_OK && !mf.found)
      rc = memory_mint(st->memory, t, session, kind, text, 0, true, NULL);
    free(text);
  }
  *used = at;
  return rc;
}

/* Reads a part of encoded records (write_records_part) at data[0..n), calling fn(ctx, record,
 * length, why, len) for each in order while it returns CPH_OK; *used: the part's length.
 * CPH_EINVAL when the part is cut short (why[0..len) says which `item`, numbered from 1 of
 * the part's count, as fn's why does for a record it refuses), else fn's error. */
static int read_records_part(const uint8_t *data, size_t n, const char *item, size_t *used,
                             char *why, size_t len,
                             int (*fn)(void *ctx, const uint8_t *rec, size_t l, char *why,
                                       size_t len),
                             void *ctx) {
  if (n < 4) {
    snprintf(why, len, "its %ss part is cut short (%zu bytes)", item, n);
    return CPH_EINVAL;
  }
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  int rc = CPH_OK;
  char one[224];
  for (uint32_t i = 0; rc == CPH_OK && i < count; i++) {
    uint32_t l = n - at >= 4 ? cph_be32_get(data + at) : 0;
    if (n - at < 4 || n - at - 4 < l) {
      snprintf(why, len, "%s %u of %u is cut short", item, i + 1, count);
      return CPH_EINVAL;
    }
    at += 4;
    one[0] = '\0';
    rc = fn(ctx, data + at, l, one, sizeof one);
    at += l;
    if (rc == CPH_EINVAL)
      snprintf(why, len, "%s %u of %u: %s", item, i + 1, count, one);
  }
  *used = at;
  return rc;
}

/* What importing one record of a part needs: this node's name and the session. */
typedef struct import_ctx {
  cph_txn *t;
  const char *node, *session;
} import_ctx;

/* What is wrong with a record of a part that every kind shares (decoded with rc and err): it
 * does not decode, has no origin this build could make, or is another session's. NULL: none
 * of that (or rc is another error, which the caller returns). */
static const char *record_problem(int rc, const cph_err *err, const char *origin,
                                  const char *rec_session, const char *session) {
  if (rc == CPH_ECORRUPT)
    return err->msg;
  if (rc)
    return NULL;
  if (!origin || !*origin || strlen(origin) >= REPLYSTREAM_ORIGIN_MAX)
    return "no origin, or one too long";
  return strcmp(rec_session, session) != 0 ? "another session's" : NULL;
}

/* One turn record of the state: stored as history unless this node holds its origin
 * (turnrecs_import). CPH_EINVAL, with why, for a record that is not one of the session's
 * ended turns with an origin. */
static int import_turn(void *ctx, const uint8_t *rec, size_t l, char *why, size_t len) {
  import_ctx *ic = ctx;
  cph_turn_rec tr = {0};
  cph_err err = {0};
  int rc = cph_record_decode(&cph_turn_desc, rec, l, &tr, &err);
  const char *bad = record_problem(rc, &err, tr.origin, tr.session, ic->session);
  if (!bad && rc == CPH_OK)
    bad = tr.kind == CPH_TURN_JOB ? "a job turn"
          : tr.state != CPH_TURN_COMPLETED && tr.state != CPH_TURN_FAILED
              ? "not ended (completed or failed)"
              : NULL;
  bool held = false;
  if (bad) {
    snprintf(why, len, "%.160s", bad);
    rc = CPH_EINVAL;
  } else if (rc == CPH_OK) {
    rc = turnrecs_holds(ic->t, ic->node, tr.origin, &held);
  }
  if (rc == CPH_OK && !held)
    rc = turnrecs_import(ic->t, &tr);
  cph_record_free(&cph_turn_desc, &tr);
  return rc;
}

/* One seal of the state: stored under a new seal id here unless this node holds its origin
 * for the session (seals_import). CPH_EINVAL, with why, for a record that is not one of the
 * session's seals with an origin, a trigger and whole messages. */
static int import_seal(void *ctx, const uint8_t *rec, size_t l, char *why, size_t len) {
  import_ctx *ic = ctx;
  cph_seal_rec r = {0};
  cph_err err = {0};
  int rc = cph_record_decode(&cph_seal_desc, rec, l, &r, &err);
  const char *bad = record_problem(rc, &err, r.origin, r.session, ic->session);
  if (!bad && rc == CPH_OK)
    bad = !r.trigger || !*r.trigger ? "no trigger"
          : r.n_roles != r.n_contents || r.n_roles != r.n_coords
              ? "its messages' roles, contents and coordinates differ in number"
              : NULL;
  bool held = false;
  if (bad) {
    snprintf(why, len, "%.160s", bad);
    rc = CPH_EINVAL;
  } else if (rc == CPH_OK) {
    rc = seals_holds(ic->t, ic->node, ic->session, r.origin, &held);
  }
  if (rc == CPH_OK && !held)
    rc = seals_import(ic->t, &r);
  cph_record_free(&cph_seal_desc, &r);
  return rc;
}

int handover_export(const cph_handover *st, const csession *s, cph_buf *out) {
  uint8_t head[STATE_HEAD];
  memcpy(head, STATE_MAGIC, 4);
  cph_be32_put(head + 4, STATE_VERSION);
  cph_be32_put(head + 8, CPH_STORE_SCHEMA_VERSION);
  cph_be64_put(head + 12, s->episode);
  double credits = cph_sched_credits(st->env->sched, s->sid);
  uint64_t bits;
  memcpy(&bits, &credits, 8);
  cph_be64_put(head + 20, bits);
  cph_buf_append(out, head, sizeof head);
  int rc = trees_export(st->trees, &st->env->txn, s->id, out);
  if (rc)
    return rc;
  if (out->len + 12 > CPH_HANDOVER_MAX_BYTES)
    return CPH_ELIMIT;
  /* The stream replies, the channel replies, the memories and the turn records each only
   * while the whole fits (else none of that part: empty), with room kept for the empty parts
   * after it; the seals, last, those that fit in what is left. */
  reply_scan rs = {s->id, NULL, 0, 0, 0, false};
  stream_scan ss = {0};
  rc = replystream_session_newest(&st->env->txn, s->id, STATE_STREAM_REPLIES,
                                  collect_stream_reply, &ss);
  if (rc == CPH_OK && ss.nomem)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK)
    rc = collect_channel_replies(st, s, &rs);
  if (rc == CPH_OK)
    match_parts(&ss, &rs);
  static const uint8_t none[4] = {0};
  cph_buf part = {0};
  bool stream_written = false;
  for (int i = 0; rc == CPH_OK && i < 5; i++) {
    cph_buf_reset(&part);
    if (i == 0)
      write_stream_part(&ss, &part);
    else if (i == 1)
      write_channel_part(&rs, stream_written, &part);
    else if (i == 2)
      rc = state_export_memories(st, s, &part);
    else if (i == 3)
      rc = state_export_turns(st, s, &part);
    else
      rc = state_export_seals(st, s, CPH_HANDOVER_MAX_BYTES - out->len, &part);
    if (rc == CPH_OK && cph_buf_error(&part))
      rc = CPH_ENOMEM;
    if (rc == CPH_OK && out->len + part.len + 4u * (unsigned)(4 - i) <= CPH_HANDOVER_MAX_BYTES) {
      cph_buf_append(out, part.data, part.len);
      stream_written |= i == 0;
    } else if (rc == CPH_OK) {
      cph_buf_append(out, none, 4);
    }
  }
  cph_buf_free(&part);
  stream_scan_free(&ss);
  reply_scan_free(&rs);
  return rc;
}

/* CPH_OP_SESSION_STATE: see include/cephalon/cephalon.h. */
void handover_import(const cph_handover *st, cph_op *op, uint64_t *newest_reply) {
  const char *id = op->u.state.session;
  csession *s = id ? sessions_get(st->sessions, id) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "session", "no session '%s'", id ? id : "");
    return;
  }
  const uint8_t *p = op->u.state.data;
  size_t n = op->u.state.len;
  uint32_t version = n < STATE_HEAD ? 0 : cph_be32_get(p + 4);
  if (n < STATE_HEAD || memcmp(p, STATE_MAGIC, 4) != 0 ||
      version < STATE_VERSION_NO_STREAM || version > STATE_VERSION ||
      cph_be32_get(p + 8) != CPH_STORE_SCHEMA_VERSION) {
    op_fail(op, CPH_EINVAL, "state",
            "the state of session '%s' is not a version-%u to -%u state of store schema %u", id,
            STATE_VERSION_NO_STREAM, STATE_VERSION, CPH_STORE_SCHEMA_VERSION);
    return;
  }
  uint64_t episode = cph_be64_get(p + 12), bits = cph_be64_get(p + 20);
  double credits;
  memcpy(&credits, &bits, 8);
  cph_txn t;
  cph_txn_begin_child(&st->env->txn, &t);
  size_t used = 0;
  int rc = trees_import(st->trees, &t, id, p + STATE_HEAD, n - STATE_HEAD, &used);
  size_t at = STATE_HEAD + used;
  uint64_t newest = 0;
  reply_scan history = {id, NULL, 0, 0, 0, false};
  if (rc == CPH_OK && version >= STATE_VERSION_NO_TURNS) {
    rc = state_import_stream(&t, id, p + at, n - at, &used, &newest, &history);
    at += rc == CPH_OK ? used : 0;
  }
  if (rc == CPH_OK)
    rc = state_read_channel_part(p + at, n - at, &used, &history);
  at += rc == CPH_OK ? used : 0;
  if (rc == CPH_OK)
    rc = state_import_history(&t, id, &history);
  reply_scan_free(&history);
  if (rc == CPH_OK)
    rc = state_import_memories(st, &t, id, p + at, n - at, &used);
  at += rc == CPH_OK ? used : 0;
  char why[256] = "";
  /* the turn records (version 3 on) and the seals (version 4): each one whose origin this
   * node lacks is stored here; nothing may follow the last part */
  import_ctx ic = {&t, st->env->reply_origin_node, id};
  const char *last = NULL;
  if (rc == CPH_OK && version >= STATE_VERSION_NO_SEALS) {
    rc = read_records_part(p + at, n - at, "turn record", &used, why, sizeof why, import_turn,
                           &ic);
    at += rc == CPH_OK ? used : 0;
    last = "turn records";
  }
  if (rc == CPH_OK && version >= STATE_VERSION) {
    rc = read_records_part(p + at, n - at, "seal", &used, why, sizeof why, import_seal, &ic);
    at += rc == CPH_OK ? used : 0;
    last = "seals";
  }
  if (rc == CPH_OK && last && at != n) {
    snprintf(why, sizeof why, "%zu bytes follow its %s", n - at, last);
    rc = CPH_EINVAL;
  }
  if (rc == CPH_EINVAL) {
    cph_txn_abort(&t);
    if (why[0])
      op_fail(op, CPH_EINVAL, "state", "the version-%u state of session '%s' is malformed: %s",
              version, id, why);
    else
      op_fail(op, CPH_EINVAL, "state", "the state of session '%s' is cut short or malformed",
              id);
    return;
  }
  uint64_t old_episode = s->episode;
  double old_credits = cph_sched_credits(st->env->sched, s->sid);
  s->episode = episode;
  if (rc == CPH_OK && credits == credits) /* not NaN */
    rc = csession_resched(st->sessions, s, s->lane, credits);
  if (rc == CPH_OK)
    rc = persist_session_credits(st->sessions, &t, s);
  if (rc == CPH_OK)
    rc = cph_txn_commit(&t);
  else
    cph_txn_abort(&t);
  if (rc == CPH_OK && newest)
    *newest_reply = newest;
  if (rc) {
    s->episode = old_episode;
    csession_resched(st->sessions, s, s->lane, old_credits);
    op_fail(op, rc, NULL, "importing the state of session '%s': %s", id,
            t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
}

