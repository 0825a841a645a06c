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
 * (core/turnrecs.h: however they ended; STATE_TURNS, STATE_TURN_BYTES of encoded records at
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
 * part and still imports. Version 5 puts, where versions 1-4 have the channel replies, the
 * session's channel history: of each channel the session views (its direct channel, then its
 * subscriptions and memberships, each once, STATE_CHANNELS at most) the newest entries a turn of it
 * could show (STATE_HISTORY_SCAN, as many as a turn reads of one channel, and no more than a
 * window's worth of text; earlier builds wrote the newest 64 in the same format) — the users' and
 * other agents' messages as well as its own replies — but the events its live inbox holds
 * (STATE_LIVE_SCAN newest entries: the log's replay delivers those to the new owner) and redacted
 * ones, picked newest first within STATE_REPLY_BYTES (an entry that does not fit is left out
 * whole): be32 count, and per entry a flag byte (1: seen — at or before the session's cursor on
 * its channel, context.h), be32 length + channel, be32 length + sender, be32 length + kind (0: none),
 * be64 ts_ms, be32 length + body, channel by channel in their log order; its stream replies' flags
 * are 0 (this part has them). The node taking the session over appends each entry its channel
 * lacks, in that order, and moves the session's cursor there to the newest seen one
 * (import_channel). A version-4 blob lacks that
 * part (its replies only) and still imports. That is what a completion changes of a session
 * and what its next turns read back: its conversation (the input and reply cores of every
 * turn within the history bound, which non-inbox turns render), its channels' history (which
 * an inbox turn's channel view renders, from the node's own channel history: the questions
 * its replies answered with them), the nodes workers inserted, the episode; and what the
 * scheduler charged. Read through the pass transaction, after the completion's child
 * committed, so it is exactly what this pass stores. The cost of a completion's export is
 * bounded by the scans (up to STATE_HISTORY_SCAN record reads a channel, only in cluster mode;
 * it writes nothing), and an entry no turn of the session could show any more does not move.
 * The stream replies are what makes a dead node's answers reach people: the node that takes
 * the session over adds each one whose origin its own stream lacks to that stream, so a
 * connector reading every node's stream gets it there (again, if it read it from the dead
 * node already: it drops a repeated origin). They come first after the tree, so they are the
 * last part left out when a state would be too big.
 * Version 6 adds, after the seals, the session's newest kept turn contexts (the context
 * explorer, core/turnlog.h; STATE_KEPT turns, STATE_KEPT_BYTES as written at most, and only
 * those that fit in what the state has left: one that does not is left out whole) of turns
 * whose records have an origin: be32 count, and per kept turn be32 length + the entry, which is
 * be32 length + the turn record's origin, then the kept record as the store encodes it, self-
 * contained (turnlog_newest: texts inline, no rows), oldest first. The node taking the session
 * over stores each one whose turn record this state's turn records part stored there (a new
 * turn id there, looked up by origin; a turn it held already, or whose record did not move,
 * is left out: nothing is doubled), through turnlog_import. A version-5 blob lacks that part
 * and still imports. Since kept contexts move as items (handover_kept_item, server/
 * clusterflow.h 13.) the part is written empty (STATE_KEPT 0); one that holds entries (an
 * older build's) is still imported.
 * Version 7 widens the memories part from the session's own scope to every scope its turns'
 * memory section reads: its own and its channels' ("#channel": the raw memories of the events
 * it was sent, and the summaries and aggregates made of them) — the newest STATE_RAW_MEMORIES
 * raw and STATE_MEMORIES other memories over them all, but those of the events its inbox
 * still holds (state_export_memories says how each is written). Before, a session that took
 * its input from channels came to its new owner without its channels' memories, and its next
 * turn's memory section showed only what its own turns had minted. The node taking it over
 * mints each one the scope lacks there, linking a raw one to its event's copy there (which
 * the channel history part brought), so a turn there shows what a turn showed on the old
 * owner. A version-6 blob (memories of the session's scope, without scopes) still imports.
 * Items (handover.h; server/clusterflow.h 13.) carry one turn record, seal, memory, kept turn
 * context or stream reply each, encoded as the state's parts encode it, so that records beyond
 * the state's bounds move too; an import stores the op's items first, oldest first, then the
 * state (whose stream replies part then finds the replies the items added held already). */
#include "handover.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "context.h"
#include "gc.h"
#include "origins.h"
#include "ingest.h"
#include "replystream.h"
#include "seals.h"
#include "turnlog.h"
#include "turnrecs.h"

#define STATE_MAGIC "CPHS"
#define STATE_VERSION 7u
/* The oldest store schema (store/store.h) whose states this build imports: schema 6 moved kept
 * contexts between databases and changed no record a state carries, so a schema-5 node's
 * states (a cluster upgraded node by node, or states the log held from before) still import. */
#define STATE_SCHEMA_OLDEST 5u
#define STATE_VERSION_NO_SCOPES 6u /* memories of the session's own scope only; still imported */
#define STATE_VERSION_NO_KEPT 5u /* before the kept turn contexts; still imported */
#define STATE_VERSION_NO_HISTORY 4u /* before the channel history (its replies only); still imported */
#define STATE_VERSION_NO_SEALS 3u  /* before the seals; still imported */
#define STATE_VERSION_NO_TURNS 2u  /* before the turn records; still imported */
#define STATE_VERSION_NO_STREAM 1u /* before the stream replies too; still imported */
#define STATE_HEAD 28u
#define STATE_STREAM_REPLIES 64
#define STATE_STREAM_REPLY_BYTES (256u * 1024u)
/* Of each channel's history, the newest entries a turn could read: as many as a turn reads
 * of one channel (context.h), and back to where the session's own entries hold a window's
 * worth of text (STATE_WINDOW_BYTES a token: a turn reads no further, hist_scan). */
#define STATE_HISTORY_SCAN CONTEXT_HISTORY_READS_MAX
#define STATE_WINDOW_BYTES 4u
#define STATE_CHANNELS 16
#define STATE_REPLY_BYTES (256u * 1024u) /* of the channel history part (entries as written) */
/* The session's live inbox entries whose events the channel history part leaves out, newest
 * first: a few at most after a completion (what arrived during the turn); a backlog beyond this
 * is older than most of the channels' newest entries. */
#define STATE_LIVE_SCAN 256
/* The entries of a channel here that an imported entry is looked for among: a shared channel
 * gets the same events here through the log, for the sessions it serves (twice what a state
 * carries of a channel, for what arrived here since). */
#define STATE_HISTORY_MATCH (2 * STATE_HISTORY_SCAN)
/* Of versions 1 to 4 (replies only, 64 a channel): the entries a reply is looked for among. */
#define STATE_REPLIES_MATCH 128
/* Of the memories (version 7): the newest raw ones over the session's scopes — more than a
 * turn shows (CONTEXT_RAW_ITEMS_MAX), as a turn skips those of the events its history shows:
 * STATE_RAW_MEMORIES, or that many more than the history entries the state carries when those
 * are more — and the newest others; versions 1 to 6 carried STATE_MEMORIES of each class of
 * its own scope alone. */
#define STATE_RAW_MEMORIES 160
/* The most raw memories a state carries: its channel history entries' worth and a turn's more
 * (what an import looks for its memories among, twice that: a repeated import adds nothing). */
#define STATE_RAW_MEMORIES_MAX                                                                     \
  (STATE_HISTORY_SCAN + CONTEXT_RAW_ITEMS_MAX > STATE_RAW_MEMORIES                                \
       ? STATE_HISTORY_SCAN + CONTEXT_RAW_ITEMS_MAX                                                \
       : STATE_RAW_MEMORIES)
#define STATE_MEMORIES 64
#define STATE_RAW_MEMORY_BYTES (192u * 1024u) /* of the part as written */
#define STATE_MEMORY_BYTES (256u * 1024u)
#define STATE_TURNS 64
#define STATE_TURN_BYTES (256u * 1024u) /* of the records as encoded, with their lengths */
/* Of the kept turn contexts: a kept context at the default window measured 46-49 KB self-
 * contained (its messages cut by the window, ~120 nodes with their 160-byte previews), so two
 * fit with room; one of a larger window or tree may not, and is left out whole. */
#define STATE_KEPT 0 /* since kept contexts move as items (handover_kept_item) */
#define STATE_KEPT_BYTES (192u * 1024u) /* of the entries as written, with their lengths */
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

/* A reply of a channel's history read from a state of version 1 to 4 (their channel replies
 * part, and the stream replies flagged as channel replies). */
typedef struct state_reply {
  char *channel, *body;
  int64_t ts_ms;
} state_reply;

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
  state_reply *v;
  size_t n, cap;
} reply_scan;

static int reply_cmp(const void *a, const void *b) {
  const state_reply *x = a, *y = b;
  return x->ts_ms < y->ts_ms ? -1 : x->ts_ms > y->ts_ms;
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

/* A reply of the session's replies stream, for a state. */
typedef struct stream_reply {
  char *origin, *channel, *body;
  int64_t ts_ms;
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

/* The stream replies part of the blob (above), oldest first. Its flags are 0: since version 5
 * the channel history part carries every entry, the session's replies included. */
static void write_stream_part(const stream_scan *ss, cph_buf *out) {
  cph_buf_put_be32(out, (uint32_t)ss->n);
  for (size_t i = ss->n; i-- > 0;) {
    static const uint8_t flag = 0;
    cph_buf_append(out, &flag, 1);
    cph_buf_put_str32(out, ss->v[i].origin);
    cph_buf_put_str32(out, ss->v[i].channel);
    cph_buf_put_be64(out, (uint64_t)ss->v[i].ts_ms);
    cph_buf_put_str32(out, ss->v[i].body);
  }
}

/* ---- The channel history part (version 5) ---- */

/* An entry of a channel's history, collected for a state or read from one: what a channel view
 * renders of it (core/context.c: sender, body, time; an agent's or the session's own by its
 * sender) and its kind. */
typedef struct hist_entry {
  char *channel, *sender, *kind, *body; /* kind NULL: none */
  int64_t ts_ms;
  uint64_t index;   /* collected: its index in this node's channel log */
  uint32_t chan_no; /* exporting: which of the session's channels (session_chans) */
  bool seen;        /* at or before the session's cursor on its channel: its turns saw it */
  bool matched;     /* importing: an entry of the state was found to be this one */
} hist_entry;

typedef struct hist_list {
  hist_entry *v;
  size_t n, cap;
} hist_list;

static void hist_entry_free(hist_entry *e) {
  free(e->channel);
  free(e->sender);
  free(e->kind);
  free(e->body);
}

static void hist_list_free(hist_list *l) {
  for (size_t i = 0; i < l->n; i++)
    hist_entry_free(&l->v[i]);
  free(l->v);
  *l = (hist_list){0};
}

/* Whether e is the event (channel, sender, ts_ms, body). The same event on two nodes: an
 * event's time is fixed on the node that accepted it (server/clusterflow.h 1.) and every copy
 * of it — applied from the log, forwarded to each session, or moved in a state — carries it,
 * with its channel, sender and body; its key does not tell (a forward's engine key is a hash
 * of the event's message id and the session it went to, so two nodes hold one event under
 * different keys, and a reply has none). Two events alike in all four are taken for one. */
static bool same_event(const hist_entry *e, const char *chan, const char *sender,
                       int64_t ts_ms, const char *body) {
  return e->ts_ms == ts_ms && strcmp(e->body, body) == 0 && strcmp(e->sender, sender) == 0 &&
         strcmp(e->channel, chan) == 0;
}

/* Appends a copy of ev's channel, sender, kind, body and time to l: the new entry, or NULL out
 * of memory (l unchanged). ev has a body. */
static hist_entry *hist_push(hist_list *l, const cph_event_rec *ev) {
  hist_entry *g = room_for_one(l->v, &l->cap, l->n, sizeof *g, 16);
  if (!g)
    return NULL;
  l->v = g;
  hist_entry e = {0};
  e.channel = strdup(ev->channel);
  e.sender = strdup(ev->sender);
  e.kind = ev->kind ? strdup(ev->kind) : NULL;
  e.body = strdup(ev->body);
  e.ts_ms = ev->ts_ms;
  if (!e.channel || !e.sender || !e.body || (ev->kind && !e.kind)) {
    hist_entry_free(&e);
    return NULL;
  }
  l->v[l->n] = e;
  return &l->v[l->n++];
}

/* A walk of one channel's history (history_tail) collecting its entries into out, but those of
 * the events in `skip`. */
typedef struct hist_scan {
  hist_list *out;
  const hist_list *skip;
  uint32_t chan_no;
  uint64_t cursor; /* the session's cursor on the channel, when has_cursor */
  bool has_cursor;
  bool nomem;
  /* The scan stops once the session's own entries collected (`self`'s) hold max_bytes of text
   * (0: never). A turn reads a channel's history until the entries its section shows — the
   * session's own and its staged messages' senders' (core/context.c) — cover its budget, at
   * most a window: the session's own entries are the ones every turn of it counts. */
  const char *self;
  size_t bytes, max_bytes;
} hist_scan;

static bool collect_entry(void *ctx, uint64_t index, const cph_event_rec *ev) {
  hist_scan *hs = ctx;
  if (!ev->body)
    return true; /* redacted: a channel view shows nothing of it */
  for (size_t i = 0; i < hs->skip->n; i++)
    if (same_event(&hs->skip->v[i], ev->channel, ev->sender, ev->ts_ms, ev->body))
      return true;
  hist_entry *e = hist_push(hs->out, ev);
  if (!e) {
    hs->nomem = true;
    return false;
  }
  e->index = index;
  e->chan_no = hs->chan_no;
  e->seen = hs->has_cursor && index <= hs->cursor;
  if (hs->self && strcmp(e->sender, hs->self) == 0)
    hs->bytes += strlen(e->body);
  return !hs->max_bytes || hs->bytes < hs->max_bytes;
}

/* The events of the session's newest STATE_LIVE_SCAN live inbox entries (pending or staged)
 * into live. They are not consumed, so the log's replay delivers them to the new owner (which
 * appends them to its history then): the state leaves them out, or the new owner's history
 * would hold them twice. By event, not by history entry: the history may hold another
 * session's copy of the event (a node's channel history keeps one copy of an event forwarded
 * to several of its sessions). */
static int collect_live(cph_txn *t, const csession *s, hist_list *live) {
  for (uint32_t i = s->n_inbox, n = 0; i-- > 0 && n < STATE_LIVE_SCAN; n++) {
    cph_key ek = cph_key_of_u64(s->inbox[i].event_id);
    cph_event_rec ev;
    int rc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
    if (rc == CPH_ENOTFOUND)
      continue;
    if (rc)
      return rc;
    bool ok = !ev.body || hist_push(live, &ev);
    cph_record_free(&cph_event_desc, &ev);
    if (!ok)
      return CPH_ENOMEM;
  }
  return CPH_OK;
}

/* The channels whose history a session's views show: its direct channel, then its
 * subscriptions and memberships, each once, STATE_CHANNELS at most (v borrows from direct and
 * rec). */
typedef struct session_chans {
  char direct[160];
  const char *v[STATE_CHANNELS];
  size_t n;
  cph_session_rec rec;
  bool have_rec;
} session_chans;

static void session_chans_add(session_chans *sc, const char *chan) {
  for (size_t i = 0; i < sc->n; i++)
    if (strcmp(sc->v[i], chan) == 0)
      return;
  if (sc->n < STATE_CHANNELS)
    sc->v[sc->n++] = chan;
}

static void session_chans_get(cph_txn *t, const csession *s, session_chans *sc) {
  snprintf(sc->direct, sizeof sc->direct, "direct:%s", s->id);
  sc->n = 0;
  sc->v[sc->n++] = sc->direct;
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, s->id);
  sc->have_rec = cph_txn_get_record(t, CPH_DB_SESSIONS, &sk, &cph_session_desc, &sc->rec) == CPH_OK;
  for (uint32_t i = 0; sc->have_rec && i < sc->rec.n_subscribe; i++)
    session_chans_add(sc, sc->rec.subscribe[i]);
  for (uint32_t i = 0; sc->have_rec && i < sc->rec.n_member; i++)
    session_chans_add(sc, sc->rec.member[i]);
}

/* An entry's bytes in the part. */
static size_t entry_bytes(const hist_entry *e) {
  return 1 + 4 * 4 + 8 + strlen(e->channel) + strlen(e->sender) +
         (e->kind ? strlen(e->kind) : 0) + strlen(e->body);
}

static int entry_newest_first(const void *a, const void *b) {
  const hist_entry *x = a, *y = b;
  return x->ts_ms != y->ts_ms ? (x->ts_ms > y->ts_ms ? -1 : 1)
         : x->index != y->index ? (x->index > y->index ? -1 : 1)
                                : (x->chan_no > y->chan_no) - (x->chan_no < y->chan_no);
}

static int entry_log_order(const void *a, const void *b) {
  const hist_entry *x = a, *y = b;
  return x->chan_no != y->chan_no ? (x->chan_no < y->chan_no ? -1 : 1)
                                  : (x->index > y->index) - (x->index < y->index);
}

/* The channel history part of the blob (above): of each of the session's channels, the newest
 * entries a turn could show (STATE_HISTORY_SCAN, and no more than a window's worth of text),
 * but the events its inbox still holds, the newest first within STATE_REPLY_BYTES (an entry
 * that does not fit is left out whole), written channel by channel in their log order. Reads
 * only: a completion's export (cluster mode) pays it, the turn cycle's transaction writes
 * nothing more. */
static int state_export_history(const cph_handover *st, const csession *s, cph_buf *out,
                                size_t *carried) {
  cph_txn *t = &st->env->txn;
  session_chans sc;
  session_chans_get(t, s, &sc);
  uint64_t window = sc.have_rec && sc.rec.context_window_tokens
                        ? sc.rec.context_window_tokens
                        : (uint64_t)st->env->policy->sessions.context_window_tokens;
  hist_list live = {0}, all = {0};
  int rc = collect_live(t, s, &live);
  for (size_t i = 0; rc == CPH_OK && i < sc.n; i++) {
    hist_scan hs = {.out = &all,
                    .skip = &live,
                    .chan_no = (uint32_t)i,
                    .self = s->id,
                    .max_bytes = window * STATE_WINDOW_BYTES};
    rc = context_cursor_get(t, s->id, sc.v[i], &hs.cursor);
    hs.has_cursor = rc == CPH_OK;
    if (rc == CPH_OK || rc == CPH_ENOTFOUND)
      rc = history_tail(t, sc.v[i], STATE_HISTORY_SCAN, collect_entry, &hs);
    if (rc == CPH_OK && hs.nomem)
      rc = CPH_ENOMEM;
  }
  if (rc == CPH_OK) {
    if (all.n > 1)
      qsort(all.v, all.n, sizeof *all.v, entry_newest_first);
    size_t kept = 0, bytes = 0;
    for (size_t i = 0; i < all.n; i++) {
      size_t b = entry_bytes(&all.v[i]);
      if (bytes + b > STATE_REPLY_BYTES) {
        hist_entry_free(&all.v[i]);
        continue;
      }
      bytes += b;
      all.v[kept++] = all.v[i];
    }
    all.n = kept;
    *carried = kept;
    if (all.n > 1)
      qsort(all.v, all.n, sizeof *all.v, entry_log_order);
    cph_buf_put_be32(out, (uint32_t)all.n);
    for (size_t i = 0; i < all.n; i++) {
      const hist_entry *e = &all.v[i];
      uint8_t flag = e->seen;
      cph_buf_append(out, &flag, 1);
      cph_buf_put_str32(out, e->channel);
      cph_buf_put_str32(out, e->sender);
      cph_buf_put_str32(out, e->kind ? e->kind : "");
      cph_buf_put_be64(out, (uint64_t)e->ts_ms);
      cph_buf_put_str32(out, e->body);
    }
  }
  hist_list_free(&all);
  hist_list_free(&live);
  if (sc.have_rec)
    cph_record_free(&cph_session_desc, &sc.rec);
  return rc;
}

/* ---- The memories part (version 7: every scope the session's turns read) ---- */

/* A memory collected for a state, or read from one. */
typedef struct state_memory {
  uint64_t id; /* collected: its id here (the part is written in id order) */
  uint8_t kind;
  char *scope, *text;
  char **tags;
  uint32_t n_tags;
  /* A raw memory minted from an event: that event's sender and time (its channel is the
   * scope's, its body the memory's text), so that the node taking it over links the memory to
   * its own copy of the event — a turn that shows the event does not show its memory too
   * (core/context.c). NULL: not from an event, or the event is gone. */
  char *sender;
  int64_t ts_ms;
} state_memory;

static void state_memory_free(state_memory *m) {
  free(m->scope);
  free(m->text);
  for (uint32_t i = 0; i < m->n_tags; i++)
    free(m->tags[i]);
  free(m->tags);
  free(m->sender);
}

static int memory_id_cmp(const void *a, const void *b) {
  const state_memory *x = a, *y = b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Calls fn(ctx, memory) for the newest `scan` live memories of scope in class raw (or the
 * others), newest first, until fn returns false; with tombstones, the deleted ones too. */
static int memories_tail(cph_txn *t, const char *scope, bool raw, bool tombstones, size_t scan,
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
      bool more = (m.deleted && !tombstones) || !m.text || fn(ctx, &m);
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

/* A memory's bytes in the part (as state_export_memories writes it). */
static size_t memory_bytes(const cph_memory_rec *m, const char *sender) {
  size_t b = 2 + 4 + strlen(m->session) + 4 + strlen(m->text) + 4;
  for (uint32_t i = 0; i < m->n_tags; i++)
    b += 4 + strlen(m->tags[i]);
  return b + (sender ? 4 + strlen(sender) + 8 : 0);
}

/* The sender and time of the event raw memory m was minted from, into g (sender NULL when it
 * names none, or the event is gone or redacted). CPH_OK or the store's error. */
static int memory_source(cph_txn *t, const cph_memory_rec *m, state_memory *g) {
  if (m->kind != CPH_MEMORY_RAW || !m->source_event_id || m->session[0] != '#')
    return CPH_OK;
  cph_key ek = cph_key_of_u64(m->source_event_id);
  cph_event_rec ev;
  int rc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  if (rc == CPH_OK && ev.body && ev.sender && strcmp(ev.body, m->text) == 0 &&
      strcmp(ev.channel, m->session + 1) == 0) {
    g->sender = ev.sender;
    ev.sender = NULL;
    g->ts_ms = ev.ts_ms;
  }
  if (rc == CPH_OK)
    cph_record_free(&cph_event_desc, &ev);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

typedef struct memory_scan {
  state_memory *v;
  size_t n, cap, bytes;
} memory_scan;

/* Copies m into ms (taking g's source): CPH_OK or CPH_ENOMEM. */
static int memory_keep(memory_scan *ms, const cph_memory_rec *m, state_memory *g) {
  state_memory *v = room_for_one(ms->v, &ms->cap, ms->n, sizeof *v, 16);
  if (!v)
    return CPH_ENOMEM;
  ms->v = v;
  g->id = m->id;
  g->kind = m->kind;
  g->scope = strdup(m->session);
  g->text = strdup(m->text);
  g->tags = m->n_tags ? calloc(m->n_tags, sizeof *g->tags) : NULL;
  bool ok = g->scope && g->text && (g->tags || !m->n_tags);
  for (uint32_t i = 0; ok && i < m->n_tags; i++, g->n_tags++)
    ok = (g->tags[i] = strdup(m->tags[i])) != NULL;
  if (!ok) { /* g->sender stays the caller's */
    char *sender = g->sender;
    g->sender = NULL;
    state_memory_free(g);
    *g = (state_memory){.sender = sender};
    return CPH_ENOMEM;
  }
  ms->v[ms->n++] = *g;
  return CPH_OK;
}

/* Collects into ms the newest `max` live memories of class raw (or the others) over the
 * scopes, merged newest first as a turn's memory section reads them, while ms's bytes stay
 * within `budget`; raw memories of the events in live[0..n_live) are left out (the log's
 * replay mints them again on the new owner). Reads at most 4 * max records. */
static int collect_memories(cph_txn *t, char *const *scopes, size_t n_scopes, bool raw,
                            size_t max, size_t budget, const uint64_t *live, size_t n_live,
                            memory_scan *ms) {
  memory_scope_cursor walks[1 + STATE_CHANNELS];
  size_t n_walks = 0;
  int rc = CPH_OK;
  while (rc == CPH_OK && n_walks < n_scopes) {
    rc = memory_scope_open(t, scopes[n_walks], raw, &walks[n_walks]);
    if (rc == CPH_OK && (rc = memory_scope_newest(&walks[n_walks])) != CPH_OK)
      memory_scope_close(&walks[n_walks]);
    else if (rc == CPH_OK)
      n_walks++;
  }
  for (size_t kept = 0, read = 0; rc == CPH_OK && kept < max && read < 4 * max; read++) {
    size_t best = n_walks;
    for (size_t i = 0; i < n_walks; i++)
      if (walks[i].id && (best == n_walks || walks[i].id > walks[best].id))
        best = i;
    if (best == n_walks)
      break;
    uint64_t id = walks[best].id, source = walks[best].source;
    rc = memory_scope_older(&walks[best]);
    bool is_live = false;
    for (size_t i = 0; raw && source && i < n_live && !is_live; i++)
      is_live = live[i] == source;
    if (rc || is_live)
      continue;
    cph_key mk = cph_key_of_u64(id);
    cph_memory_rec m;
    int grc = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (grc == CPH_ENOTFOUND)
      continue;
    if ((rc = grc) != CPH_OK)
      break;
    state_memory g = {0};
    if (!m.deleted && m.text && (rc = memory_source(t, &m, &g)) == CPH_OK) {
      size_t b = memory_bytes(&m, g.sender);
      if (ms->bytes + b > budget)
        max = kept; /* the newest that fit are in: the rest would leave a hole */
      else if ((rc = memory_keep(ms, &m, &g)) == CPH_OK) {
        ms->bytes += b;
        kept++;
        g.sender = NULL; /* taken */
      }
    }
    free(g.sender);
    cph_record_free(&cph_memory_desc, &m);
  }
  for (size_t i = 0; i < n_walks; i++)
    memory_scope_close(&walks[i]);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* The memories part of the blob (version 7): the newest raw memories (STATE_RAW_MEMORIES, or
 * CONTEXT_RAW_ITEMS_MAX more than the `history` entries the history part carries) and
 * the newest STATE_MEMORIES others (summaries, aggregates) over the scopes the session's turns
 * read — its own and its channels' ("#channel": the raw memories of the events it was sent,
 * which its turns show once those events are older than the history its turns show) — but
 * those of the events its inbox still holds, within STATE_MEMORY_BYTES (raw ones within
 * STATE_RAW_MEMORY_BYTES of it), written oldest first over all scopes: be32 count, and per
 * memory a kind byte, a flag byte (1: from an event), be32 length + scope, be32 length + text,
 * be32 count of tags and each be32 length + tag, and for a flagged one be32 length + the
 * event's sender and be64 its time. */
static int state_export_memories(const cph_handover *st, const csession *s, size_t history,
                                 cph_buf *out) {
  cph_txn *t = &st->env->txn;
  session_chans sc;
  session_chans_get(t, s, &sc);
  char *scopes[1 + STATE_CHANNELS];
  size_t n_scopes = 0;
  int rc = (scopes[n_scopes++] = strdup(s->id)) ? CPH_OK : CPH_ENOMEM;
  for (size_t i = 0; rc == CPH_OK && i < sc.n; i++) {
    size_t l = strlen(sc.v[i]);
    if (!(scopes[n_scopes] = malloc(l + 2)))
      rc = CPH_ENOMEM;
    else {
      scopes[n_scopes][0] = CPH_CHANNEL_SCOPE_PREFIX;
      memcpy(scopes[n_scopes++] + 1, sc.v[i], l + 1);
    }
  }
  uint64_t live[STATE_LIVE_SCAN];
  size_t n_live = 0;
  for (uint32_t i = s->n_inbox; i-- > 0 && n_live < STATE_LIVE_SCAN;)
    live[n_live++] = s->inbox[i].event_id;
  memory_scan ms = {0};
  if (rc == CPH_OK)
    rc = collect_memories(t, scopes, n_scopes, true,
                          history + CONTEXT_RAW_ITEMS_MAX > STATE_RAW_MEMORIES
                              ? history + CONTEXT_RAW_ITEMS_MAX
                              : STATE_RAW_MEMORIES,
                          STATE_RAW_MEMORY_BYTES, live, n_live, &ms);
  if (rc == CPH_OK)
    rc = collect_memories(t, scopes, n_scopes, false, STATE_MEMORIES, STATE_MEMORY_BYTES, live,
                          n_live, &ms);
  if (rc == CPH_OK) {
    if (ms.n > 1)
      qsort(ms.v, ms.n, sizeof *ms.v, memory_id_cmp);
    cph_buf_put_be32(out, (uint32_t)ms.n);
    for (size_t i = 0; i < ms.n; i++) {
      const state_memory *m = &ms.v[i];
      uint8_t head[2] = {m->kind, m->sender != NULL};
      cph_buf_append(out, head, 2);
      cph_buf_put_str32(out, m->scope);
      cph_buf_put_str32(out, m->text);
      cph_buf_put_be32(out, m->n_tags);
      for (uint32_t k = 0; k < m->n_tags; k++)
        cph_buf_put_str32(out, m->tags[k]);
      if (m->sender) {
        cph_buf_put_str32(out, m->sender);
        cph_buf_put_be64(out, (uint64_t)m->ts_ms);
      }
    }
  }
  for (size_t i = 0; i < ms.n; i++)
    state_memory_free(&ms.v[i]);
  free(ms.v);
  for (size_t i = 0; i < n_scopes; i++)
    free(scopes[i]);
  if (sc.have_rec)
    cph_record_free(&cph_session_desc, &sc.rec);
  return rc;
}

/* A part of encoded records (the turn records, the seals): be32 count, and per record be32
 * length + the record, v[0..n) collected newest first and written oldest first. */
static void write_records_part(const cph_buf *v, size_t n, cph_buf *out) {
  cph_buf_put_be32(out, (uint32_t)n);
  for (size_t i = n; i-- > 0;) {
    cph_buf_put_be32(out, (uint32_t)v[i].len);
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

/* tr as a state carries it, into *out (borrowing tr's strings and origin): with its origin, no
 * lease, no inbox entries, no job. false when it has none (a single node's record: nothing
 * would tell it from another). */
static bool turn_for_state(const char *node, const cph_turn_rec *tr,
                           char origin[TURNRECS_ORIGIN_MAX], cph_turn_rec *out) {
  turnrecs_origin(origin, node, tr);
  if (!origin[0])
    return false;
  *out = *tr;
  memset(out->lease, 0, sizeof out->lease);
  out->inbox_seqs = NULL;
  out->n_inbox_seqs = 0;
  out->job_id = 0;
  out->origin = origin;
  return true;
}

/* A turn record for the part. The newest that fill STATE_TURN_BYTES: the walk stops at the
 * first that does not fit. */
static bool collect_turn(void *ctx, const cph_turn_rec *tr) {
  record_scan *rs = ctx;
  char origin[TURNRECS_ORIGIN_MAX];
  cph_turn_rec out;
  return !turn_for_state(rs->node, tr, origin, &out) || scan_keep(rs, &cph_turn_desc, &out) > 0;
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

/* The kept turn contexts part being collected (record_scan's buffers; its node is this
 * node's name): each kept turn of a turn record here with an origin, newest first. */
typedef struct kept_scan {
  record_scan rs;
  cph_txn *t;
  uint64_t only_turn; /* a kept context item's: that turn's only (0: any) */
} kept_scan;

/* A kept context for the part: its turn record's origin, then the record. One that does not
 * fit is left out whole; one whose turn record is gone or has no origin is left out. */
static int collect_kept(void *ctx, cph_turnctx_rec *r) {
  kept_scan *ks = ctx;
  if (ks->only_turn && r->turn_id != ks->only_turn)
    return CPH_OK;
  cph_key tk = cph_key_of_u64(r->turn_id);
  static const char *const names[] = {"origin", "lease"};
  uint64_t mask = cph_record_field_mask(&cph_turn_desc, names, 2);
  cph_turn_rec tr = {0};
  int rc = cph_txn_get_record_some(ks->t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr, mask);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  tr.id = r->turn_id;
  char origin[TURNRECS_ORIGIN_MAX];
  turnrecs_origin(origin, ks->rs.node, &tr);
  cph_record_free(&cph_turn_desc, &tr);
  if (!origin[0])
    return CPH_OK;
  cph_buf b = {0};
  cph_buf_put_str32(&b, origin);
  rc = cph_record_encode(&cph_turnctx_desc, r, &b);
  if (rc == CPH_OK && cph_buf_error(&b))
    rc = CPH_ENOMEM;
  if (rc == CPH_OK && ks->rs.bytes + 4 + b.len <= ks->rs.room) {
    cph_buf *g = room_for_one(ks->rs.v, &ks->rs.cap, ks->rs.n, sizeof *g, 8);
    if (!g)
      rc = CPH_ENOMEM;
    if (g) {
      ks->rs.v = g;
      ks->rs.v[ks->rs.n++] = b;
      ks->rs.bytes += 4 + b.len;
      return CPH_OK;
    }
  }
  cph_buf_free(&b);
  return rc;
}

/* The kept turn contexts part of the blob (above), oldest first, at most `room` bytes with its
 * count. Reads the session's newest STATE_KEPT kept contexts and their turn records. */
static int state_export_kept(const cph_handover *st, const csession *s, size_t room,
                             cph_buf *out) {
  room = room < 4 ? 0 : room - 4;
  kept_scan ks = {{st->env->reply_origin_node, NULL, 0, 0, 0,
                   room < STATE_KEPT_BYTES ? room : STATE_KEPT_BYTES, false},
                  &st->env->txn, 0};
  int rc = STATE_KEPT ? turnlog_newest(&st->env->txn, s->id, STATE_KEPT, collect_kept, &ks)
                      : CPH_OK;
  return scan_finish(&ks.rs, rc, out);
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

static bool find_reply(void *ctx, uint64_t index, const cph_event_rec *ev) {
  (void)index;
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
  list->v[list->n++] = (state_reply){chan, body, ts_ms};
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
    uint64_t added = 0;
    if (bad || !origin || !chan || !body) {
      rc = bad ? CPH_EINVAL : CPH_ENOMEM;
    } else if (!*origin || strlen(origin) >= REPLYSTREAM_ORIGIN_MAX) { /* none this build makes */
      rc = CPH_EINVAL;
    } else {
      cph_reply_rec rr = {.session = (char *)session, .channel = chan, .body = body,
                          .ts_ms = ts_ms, .origin = origin};
      rc = replystream_offer(t, &rr, &added);
    }
    if (rc == CPH_OK && added)
      *newest = added;
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

/* Stores e (its channel, sender, kind, body and time) as an event received now and appends it
 * to its channel's history; its index there into *index unless NULL. */
static int append_event(cph_txn *t, const hist_entry *e, int64_t now_ms, uint64_t *index) {
  uint64_t event_id = 0;
  cph_txn_next_id(t, "event", &event_id);
  cph_event_rec ev = {0};
  ev.id = event_id;
  ev.channel = e->channel;
  ev.sender = e->sender;
  ev.body = e->body;
  ev.kind = e->kind;
  ev.ts_ms = e->ts_ms;
  ev.received_ms = now_ms;
  ev.status = CPH_EVENT_STORED;
  cph_key ek = cph_key_of_u64(event_id);
  cph_txn_put_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  return history_append(t, e->channel, event_id, index);
}

/* The channel replies (those the stream part flagged and the channel part's), oldest first:
 * each reply its channel's history here lacks (the same session, time and body among the
 * channel's newest STATE_REPLIES_MATCH entries) is stored as a reply event and appended to
 * that history, for the session's context. */
static int state_import_history(cph_txn *t, const char *session, reply_scan *history) {
  if (history->n > 1)
    qsort(history->v, history->n, sizeof *history->v, reply_cmp);
  int64_t now_ms = cph_wall_ms();
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < history->n; i++) {
    const state_reply *r = &history->v[i];
    reply_find rf = {session, r->body, r->ts_ms, false};
    rc = history_tail(t, r->channel, STATE_REPLIES_MATCH, find_reply, &rf);
    if (rc == CPH_OK && !rf.found) {
      hist_entry e = {r->channel, (char *)session, (char *)"reply", r->body, r->ts_ms, 0, 0,
                      false, false};
      rc = append_event(t, &e, now_ms, NULL);
    }
  }
  return rc;
}

/* Reads the channel history part (version 5) into l, in its order; *used: its length.
 * CPH_EINVAL when it is malformed, why naming the entry. */
static int state_read_history(const uint8_t *data, size_t n, size_t *used, hist_list *l,
                              char *why, size_t len) {
  if (n < 4) {
    snprintf(why, len, "its channel history part is cut short (%zu bytes)", n);
    return CPH_EINVAL;
  }
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  for (uint32_t i = 0; i < count; i++) {
    hist_entry e = {0};
    bool cut = n - at < 1;
    uint8_t flag = cut ? 0 : data[at++];
    if (!cut)
      e.channel = get_str32(data, n, &at, &cut);
    if (!cut)
      e.sender = get_str32(data, n, &at, &cut);
    if (!cut)
      e.kind = get_str32(data, n, &at, &cut);
    if (!cut && n - at >= 8) {
      e.ts_ms = (int64_t)cph_be64_get(data + at);
      at += 8;
      e.body = get_str32(data, n, &at, &cut);
    } else {
      cut = true;
    }
    bool nomem = !cut && (!e.channel || !e.sender || !e.kind || !e.body);
    const char *bad = cut || nomem ? (cut ? "cut short" : NULL)
                      : flag > 1   ? "its flag is not 0 or 1"
                      : !*e.channel || strlen(e.channel) > CPH_CHANNEL_MAX
                          ? "its channel is empty or over 256 bytes"
                      : !*e.sender ? "it has no sender"
                                   : NULL;
    hist_entry *g =
        bad || nomem ? NULL : room_for_one(l->v, &l->cap, l->n, sizeof *g, 16);
    if (!g) {
      hist_entry_free(&e);
      if (!bad)
        return CPH_ENOMEM;
      snprintf(why, len, "channel history entry %u of %u: %s", i + 1, count, bad);
      return CPH_EINVAL;
    }
    if (!*e.kind) {
      free(e.kind);
      e.kind = NULL;
    }
    e.seen = flag;
    l->v = g;
    l->v[l->n++] = e;
  }
  *used = at;
  return CPH_OK;
}

/* The state's entries of one channel, v[0..n) in their order (oldest first): each one this
 * node's channel lacks (same_event among its newest STATE_HISTORY_MATCH entries) is stored as
 * an event and appended to it — before the log's replay appends the session's unconsumed input,
 * which is newer —; then the session's cursor there moves (never backwards) to the newest of
 * them its turns had seen, so that what they consumed renders as history and not as "messages
 * while you were away". */
static int import_channel(cph_txn *t, const char *session, const hist_entry *v, size_t n) {
  hist_list here = {0}, none = {0};
  hist_scan hs = {.out = &here, .skip = &none}; /* the whole tail, no stop */
  int rc = history_tail(t, v[0].channel, STATE_HISTORY_MATCH, collect_entry, &hs);
  if (rc == CPH_OK && hs.nomem)
    rc = CPH_ENOMEM;
  int64_t now_ms = cph_wall_ms();
  uint64_t seen = 0;
  bool any_seen = false;
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    const hist_entry *e = &v[i];
    uint64_t index = 0;
    bool found = false;
    for (size_t k = here.n; k-- > 0 && !found;) /* oldest first, as the state's */
      if (!here.v[k].matched &&
          same_event(&here.v[k], e->channel, e->sender, e->ts_ms, e->body)) {
        here.v[k].matched = found = true;
        index = here.v[k].index;
      }
    if (!found)
      rc = append_event(t, e, now_ms, &index);
    if (rc == CPH_OK && e->seen && (!any_seen || index > seen)) {
      seen = index;
      any_seen = true;
    }
  }
  if (rc == CPH_OK && any_seen) {
    char *chan = v[0].channel;
    context_views cv = {&chan, &seen, 1};
    rc = context_cursors_advance(t, session, &cv);
  }
  hist_list_free(&here);
  return rc;
}

/* The channel history part's entries, l, channel by channel (import_channel). */
static int state_import_channels(cph_txn *t, const char *session, const hist_list *l) {
  int rc = CPH_OK;
  for (size_t i = 0, j; rc == CPH_OK && i < l->n; i = j) {
    for (j = i + 1; j < l->n && strcmp(l->v[j].channel, l->v[i].channel) == 0; j++)
      ;
    rc = import_channel(t, session, l->v + i, j - i);
  }
  return rc;
}

/* The memories part of versions 1 to 6: each memory whose text the session's newest memories
 * of its class here lack is minted in its scope (its embedding queued, as for any new memory); *used: the part's
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
    rc = memories_tail(t, session, kind == CPH_MEMORY_RAW, false, 2 * STATE_MEMORIES,
                       find_memory, &mf);
    if (rc == CPH_OK && !mf.found)
      rc = memory_mint(st->memory, t, session, kind, text, 0, true, NULL);
    free(text);
  }
  *used = at;
  return rc;
}

/* ---- Items (handover.h) ---- */

#define ITEM_MAGIC "CPHI"
#define ITEM_VERSION 1u
#define ITEM_HEAD 13u /* the magic, be32 version, be32 store schema, the kind byte */
#define ITEM_TURN 't'
#define ITEM_SEAL 's'
#define ITEM_MEMORY 'm' /* its origin in the item's name only: a memory record has none */
#define ITEM_KEPT 'k' /* named by its slot, not its origin (handover_kept_item) */
#define ITEM_REPLY 'r' /* a reply of the replies stream (handover_reply_item) */

void cph_state_items_free(cph_state_items *items) {
  for (size_t i = 0; i < items->n; i++) {
    free(items->v[i].name);
    free(items->v[i].data);
  }
  free(items->v);
  *items = (cph_state_items){0};
}

void cph_session_items_free(cph_session_items *si) {
  free(si->session);
  si->session = NULL;
  cph_state_items_free(&si->items);
}

/* An item's head (ITEM_HEAD bytes) of kind into b. */
static void item_head(cph_buf *b, char kind) {
  uint8_t head[ITEM_HEAD];
  memcpy(head, ITEM_MAGIC, 4);
  cph_be32_put(head + 4, ITEM_VERSION);
  cph_be32_put(head + 8, CPH_STORE_SCHEMA_VERSION);
  head[12] = (uint8_t)kind;
  cph_buf_append(b, head, sizeof head);
}

/* Appends b (an item's bytes, from its head on; taken over, also on failure) to items, named
 * kind and key in hex. rc: what building b gave (not CPH_OK: nothing appended, returned). */
static int item_push_bytes(cph_state_items *items, char kind, const char *key, cph_buf *b,
                           int rc) {
  static const char hex[] = "0123456789abcdef";
  size_t ol = strlen(key);
  const char *origin = key;
  cph_state_item *g = rc == CPH_OK && !cph_buf_error(b)
                          ? realloc(items->v, (items->n + 1) * sizeof *g)
                          : NULL;
  char *name = g ? malloc(2 + 2 * ol) : NULL;
  if (g)
    items->v = g;
  if (!name) {
    cph_buf_free(b);
    return rc ? rc : CPH_ENOMEM;
  }
  name[0] = kind;
  for (size_t i = 0; i < ol; i++) {
    name[1 + 2 * i] = hex[(uint8_t)origin[i] >> 4];
    name[2 + 2 * i] = hex[(uint8_t)origin[i] & 15];
  }
  name[1 + 2 * ol] = '\0';
  items->v[items->n].name = name;
  items->v[items->n].len = b->len;
  items->v[items->n].data = (uint8_t *)cph_buf_steal(b);
  items->n++;
  return CPH_OK;
}

/* Appends the item of a record (encoded with desc) of kind and origin to items. */
static int item_push(cph_state_items *items, char kind, const char *origin,
                     const cph_record_desc *desc, const void *rec) {
  cph_buf b = {0};
  item_head(&b, kind);
  int rc = cph_record_encode(desc, rec, &b);
  return item_push_bytes(items, kind, origin, &b, rc);
}

typedef struct turn_items {
  const char *node;
  cph_state_items *items;
  bool first, newest_only;
  int rc;
} turn_items;

static bool collect_turn_item(void *ctx, const cph_turn_rec *tr) {
  turn_items *ti = ctx;
  if (!ti->first && (ti->newest_only || tr->state == CPH_TURN_COMPLETED))
    return false; /* the previous completion's: it gave its items */
  ti->first = false;
  char origin[TURNRECS_ORIGIN_MAX];
  cph_turn_rec out;
  if (turn_for_state(ti->node, tr, origin, &out))
    ti->rc = item_push(ti->items, ITEM_TURN, origin, &cph_turn_desc, &out);
  return ti->rc == CPH_OK;
}

int handover_turn_items(const cph_handover *st, const char *session, bool newest_only,
                        cph_state_items *items) {
  turn_items ti = {st->env->reply_origin_node, items, true, newest_only, CPH_OK};
  int rc = turnrecs_session_newest(&st->env->txn, session, STATE_TURNS, collect_turn_item, &ti);
  return rc ? rc : ti.rc;
}

int handover_turn_item(const cph_handover *st, const char *session, uint64_t turn_id,
                       cph_state_items *items) {
  uint64_t ordinal = 0;
  int rc = turnrecs_ordinal(&st->env->txn, session, turn_id, &ordinal);
  if (rc || !ordinal)
    return rc;
  cph_key k = cph_key_of_u64(turn_id);
  cph_turn_rec tr;
  rc = cph_txn_get_record(&st->env->txn, CPH_DB_TURNS, &k, &cph_turn_desc, &tr);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  char origin[TURNRECS_ORIGIN_MAX];
  cph_turn_rec out;
  if (turn_for_state(st->env->reply_origin_node, &tr, origin, &out))
    rc = item_push(items, ITEM_TURN, origin, &cph_turn_desc, &out);
  cph_record_free(&cph_turn_desc, &tr);
  return rc;
}

int handover_seal_item(const cph_handover *st, const char *session, uint64_t seal_id,
                       cph_state_items *items) {
  cph_key k = seals_key(session, seal_id);
  cph_seal_rec r;
  int rc = cph_txn_get_record(&st->env->txn, CPH_DB_SEALS, &k, &cph_seal_desc, &r);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  char origin[SEALS_ORIGIN_MAX];
  seals_origin(origin, st->env->reply_origin_node, &r);
  char *own = r.origin;
  r.origin = origin;
  rc = origin[0] ? item_push(items, ITEM_SEAL, origin, &cph_seal_desc, &r) : CPH_OK;
  r.origin = own;
  cph_record_free(&cph_seal_desc, &r);
  return rc;
}

int handover_memory_items(const cph_handover *st, const char *session, const uint64_t *ids,
                          size_t n, cph_state_items *items) {
  const char *node = st->env->reply_origin_node;
  int rc = CPH_OK;
  for (size_t i = 0; node && rc == CPH_OK && i < n; i++) {
    cph_memory_rec m;
    rc = memory_read(&st->env->txn, ids[i], &m, "the cluster log's memory items");
    if (rc == CPH_ENOTFOUND) {
      rc = CPH_OK;
      continue;
    }
    if (rc)
      break;
    char origin[MEMORY_ORIGIN_MAX];
    rc = memory_origin_of(&st->env->txn, node, &m, origin);
    if (rc == CPH_OK && strcmp(m.session, session) == 0)
      rc = item_push(items, ITEM_MEMORY, origin, &cph_memory_desc, &m);
    cph_record_free(&cph_memory_desc, &m);
  }
  return rc;
}

int handover_kept_item(const cph_handover *st, const char *session, uint64_t turn_id,
                       cph_state_items *items) {
  uint64_t keep = (uint64_t)st->env->policy->context.keep_turns, ordinal = 0;
  int rc = st->env->reply_origin_node && turn_id && keep
               ? turnrecs_ordinal(&st->env->txn, session, turn_id, &ordinal)
               : CPH_OK;
  kept_scan ks = {{st->env->reply_origin_node, NULL, 0, 0, 0, STATE_KEPT_BYTES, false},
                  &st->env->txn, turn_id};
  if (rc == CPH_OK && ordinal)
    rc = turnlog_newest(&st->env->txn, session, 1, collect_kept, &ks);
  if (rc == CPH_OK && ks.rs.n == 1) { /* the turn's kept context was the newest */
    char slot[24];
    snprintf(slot, sizeof slot, "r%llu", (unsigned long long)(ordinal % keep));
    cph_buf b = {0};
    item_head(&b, ITEM_KEPT);
    cph_buf_append(&b, ks.rs.v[0].data, ks.rs.v[0].len);
    rc = item_push_bytes(items, ITEM_KEPT, slot, &b, CPH_OK);
  }
  for (size_t i = 0; i < ks.rs.n; i++)
    cph_buf_free(&ks.rs.v[i]);
  free(ks.rs.v);
  return rc;
}

int handover_reply_item(const cph_handover *st, const char *session, uint64_t reply_id,
                        cph_state_items *items) {
  if (!st->env->reply_origin_node || !reply_id)
    return CPH_OK;
  cph_key k = cph_key_of_u64(reply_id);
  cph_reply_rec r;
  int rc = cph_txn_get_record(&st->env->txn, CPH_DB_REPLIES, &k, &cph_reply_desc, &r);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  if (r.origin && *r.origin && r.session && strcmp(r.session, session) == 0) {
    /* what is this node's alone (its ids, the inbox entries it answered) stays here, as in
     * the state's stream replies part */
    cph_reply_rec out = {
        .session = r.session, .channel = r.channel, .body = r.body, .ts_ms = r.ts_ms,
        .origin = r.origin};
    rc = item_push(items, ITEM_REPLY, r.origin, &cph_reply_desc, &out);
  }
  cph_record_free(&cph_reply_desc, &r);
  return rc;
}

int handover_gc_items(const cph_handover *st, uint64_t group_id, cph_session_items *out) {
  cph_key k = cph_key_of_u64(group_id);
  cph_gc_group_rec g;
  int rc = cph_txn_get_record(&st->env->txn, CPH_DB_GC_GROUPS, &k, &cph_gc_group_desc, &g);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  if (g.state == CPH_GC_COMMITTED && g.session && g.session[0] != CPH_CHANNEL_SCOPE_PREFIX &&
      sessions_get(st->sessions, g.session)) {
    uint64_t *ids = malloc(((size_t)g.n_source_ids + 1) * sizeof *ids);
    if (ids && (out->session || (out->session = strdup(g.session)))) {
      memcpy(ids, g.source_ids, (size_t)g.n_source_ids * sizeof *ids);
      ids[g.n_source_ids] = g.summary_id;
      rc = handover_memory_items(st, g.session, ids, (size_t)g.n_source_ids + 1, &out->items);
    } else {
      rc = CPH_ENOMEM;
    }
    free(ids);
  }
  cph_record_free(&cph_gc_group_desc, &g);
  return rc;
}

/* ---- Importing the memories part of version 7 ---- */

/* The texts of the memories one scope here held of one class before the import (its newest,
 * twice as many as a state can carry: STATE_RAW_MEMORIES_MAX raw), each matched by one
 * imported memory at most: two alike in a state stay two, and an import repeated adds
 * nothing. */
typedef struct held_class {
  char *scope;
  bool raw;
  char **texts;
  bool *matched;
  uint64_t *ids;     /* each text's memory */
  bool *unlinked;    /* a raw one with no source event (a channel's memories item brought it) */
  size_t n, cap;
  bool nomem;
} held_class;

/* An event of a channel's newest history here, which an imported raw memory may come from. */
typedef struct chan_event {
  char *sender, *body;
  int64_t ts_ms;
  uint64_t id;
} chan_event;

typedef struct chan_events {
  char *channel;
  chan_event *v;
  size_t n, cap;
  bool nomem;
} chan_events;

typedef struct memory_import {
  held_class *held;
  size_t n_held, cap_held;
  chan_events *chans;
  size_t n_chans, cap_chans;
} memory_import;

static void memory_import_free(memory_import *mi) {
  for (size_t i = 0; i < mi->n_held; i++) {
    held_class *h = &mi->held[i];
    for (size_t k = 0; k < h->n; k++)
      free(h->texts[k]);
    free(h->texts);
    free(h->matched);
    free(h->ids);
    free(h->unlinked);
    free(h->scope);
  }
  free(mi->held);
  for (size_t i = 0; i < mi->n_chans; i++) {
    chan_events *c = &mi->chans[i];
    for (size_t k = 0; k < c->n; k++) {
      free(c->v[k].sender);
      free(c->v[k].body);
    }
    free(c->v);
    free(c->channel);
  }
  free(mi->chans);
}

static bool collect_held(void *ctx, const cph_memory_rec *m) {
  held_class *h = ctx;
  char **t = room_for_one(h->texts, &h->cap, h->n, sizeof *t, 16);
  if (t)
    h->texts = t;
  bool *g = t ? realloc(h->matched, h->cap * sizeof *g) : NULL;
  if (g)
    h->matched = g;
  uint64_t *ids = g ? realloc(h->ids, h->cap * sizeof *ids) : NULL;
  if (ids)
    h->ids = ids;
  bool *u = ids ? realloc(h->unlinked, h->cap * sizeof *u) : NULL;
  if (u)
    h->unlinked = u;
  if (!u || !(h->texts[h->n] = strdup(m->text))) {
    h->nomem = true;
    return false;
  }
  h->ids[h->n] = m->id;
  h->unlinked[h->n] = m->kind == CPH_MEMORY_RAW && !m->source_event_id && !m->deleted;
  h->matched[h->n++] = false;
  return true;
}

/* Whether scope here held a memory of raw's class with this text not matched yet (then it is
 * matched now; *unlinked_id: its id when it is a raw memory with no source event, else 0).
 * The scope's list is read at its first memory of the import. */
static int import_held(memory_import *mi, cph_txn *t, const char *scope, bool raw,
                       const char *text, bool *held, uint64_t *unlinked_id) {
  held_class *h = NULL;
  for (size_t i = 0; i < mi->n_held && !h; i++)
    if (mi->held[i].raw == raw && strcmp(mi->held[i].scope, scope) == 0)
      h = &mi->held[i];
  if (!h) {
    held_class *g = room_for_one(mi->held, &mi->cap_held, mi->n_held, sizeof *g, 4);
    if (!g)
      return CPH_ENOMEM;
    mi->held = g;
    h = &mi->held[mi->n_held];
    *h = (held_class){.raw = raw};
    if (!(h->scope = strdup(scope)))
      return CPH_ENOMEM;
    mi->n_held++;
    /* its compacted copies too (tombstones): each is in the summary that replaced it */
    int rc = memories_tail(t, scope, raw, true,
                           2 * (raw ? STATE_RAW_MEMORIES_MAX : STATE_MEMORIES), collect_held, h);
    if (rc == CPH_OK && h->nomem)
      rc = CPH_ENOMEM;
    if (rc)
      return rc;
  }
  *held = false;
  *unlinked_id = 0;
  for (size_t i = 0; i < h->n && !*held; i++)
    if (!h->matched[i] && strcmp(h->texts[i], text) == 0) {
      *held = h->matched[i] = true;
      *unlinked_id = h->unlinked[i] ? h->ids[i] : 0;
    }
  return CPH_OK;
}

static bool collect_chan_event(void *ctx, uint64_t index, const cph_event_rec *ev) {
  (void)index;
  chan_events *c = ctx;
  if (!ev->body || !ev->sender)
    return true;
  chan_event *g = room_for_one(c->v, &c->cap, c->n, sizeof *g, 16);
  if (g)
    c->v = g;
  chan_event e = {g ? strdup(ev->sender) : NULL, g ? strdup(ev->body) : NULL, ev->ts_ms, ev->id};
  if (!e.sender || !e.body) {
    free(e.sender);
    free(e.body);
    c->nomem = true;
    return false;
  }
  c->v[c->n++] = e;
  return true;
}

/* The id here of the event of channel chan (sender, ts_ms, body) among the channel's newest
 * STATE_HISTORY_MATCH entries — the state's channel history part was imported before — or 0.
 * The channel's entries are read at its first lookup of the import. */
static int import_event(memory_import *mi, cph_txn *t, const char *chan, const char *sender,
                        int64_t ts_ms, const char *body, uint64_t *id) {
  chan_events *c = NULL;
  for (size_t i = 0; i < mi->n_chans && !c; i++)
    if (strcmp(mi->chans[i].channel, chan) == 0)
      c = &mi->chans[i];
  if (!c) {
    chan_events *g = room_for_one(mi->chans, &mi->cap_chans, mi->n_chans, sizeof *g, 4);
    if (!g)
      return CPH_ENOMEM;
    mi->chans = g;
    c = &mi->chans[mi->n_chans];
    *c = (chan_events){0};
    if (!(c->channel = strdup(chan)))
      return CPH_ENOMEM;
    mi->n_chans++;
    int rc = history_tail(t, chan, STATE_HISTORY_MATCH, collect_chan_event, c);
    if (rc == CPH_OK && c->nomem)
      rc = CPH_ENOMEM;
    if (rc)
      return rc;
  }
  *id = 0;
  for (size_t i = 0; i < c->n && !*id; i++) /* newest first */
    if (c->v[i].ts_ms == ts_ms && strcmp(c->v[i].body, body) == 0 &&
        strcmp(c->v[i].sender, sender) == 0)
      *id = c->v[i].id;
  return CPH_OK;
}

/* Reads one memory of the part at data[*at..n) into m. CPH_EINVAL (why says what) or
 * CPH_ENOMEM. */
static int read_state_memory(const uint8_t *data, size_t n, size_t *at, const char *session,
                             uint32_t no, state_memory *m, char *why, size_t len) {
  bool bad = n - *at < 2;
  uint8_t flags = 0;
  if (!bad) {
    m->kind = data[(*at)++];
    flags = data[(*at)++];
  }
  if (!bad)
    m->scope = get_str32(data, n, at, &bad);
  if (!bad && m->scope)
    m->text = get_str32(data, n, at, &bad);
  uint32_t n_tags = 0;
  if (!bad && m->text) {
    bad = n - *at < 4;
    n_tags = bad ? 0 : cph_be32_get(data + *at);
    *at += bad ? 0 : 4;
    bad = bad || n_tags > (n - *at) / 4;
  }
  if (!bad && m->text && n_tags && !(m->tags = calloc(n_tags, sizeof *m->tags)))
    return CPH_ENOMEM;
  for (; !bad && m->n_tags < n_tags; m->n_tags++)
    if (!(m->tags[m->n_tags] = get_str32(data, n, at, &bad)) && !bad)
      return CPH_ENOMEM;
  if (!bad && m->text && (flags & 1)) {
    m->sender = get_str32(data, n, at, &bad);
    bad = bad || n - *at < 8;
    m->ts_ms = bad ? 0 : (int64_t)cph_be64_get(data + *at);
    *at += bad ? 0 : 8;
  }
  if (bad) {
    snprintf(why, len, "its memory %" PRIu32 " is cut short", no);
    return CPH_EINVAL;
  }
  if (!m->scope || !m->text || ((flags & 1) && !m->sender))
    return CPH_ENOMEM;
  if (m->kind >= CPH_MEMORY_KIND_COUNT || flags > 1) {
    snprintf(why, len, "its memory %" PRIu32 " has kind %u and flags %u", no, m->kind, flags);
    return CPH_EINVAL;
  }
  if (strcmp(m->scope, session) != 0 && m->scope[0] != CPH_CHANNEL_SCOPE_PREFIX) {
    snprintf(why, len, "its memory %" PRIu32 " is scoped to '%.64s', neither the session nor a "
             "channel", no, m->scope);
    return CPH_EINVAL;
  }
  return CPH_OK;
}

typedef struct import_ctx {
  cph_txn *t;
  const char *node, *session;
  cph_turnlog *turnlog;
  cph_memory *memory; /* the memory items import into */
  const cph_policy *policy; /* a tombstone's outbox item names the embedder and index shard */
  uint64_t outbox_items;    /* the vector deletes the tombstones queued */
  /* The id of the newest reply the items added to the stream: item_reply of the item being
   * stored, newest_reply once its child committed. */
  uint64_t item_reply, newest_reply;
  char **origins;
  uint64_t *ids;
  size_t n, cap;
  /* The state's memories (version 7 on), read before the items: a memory item one of them
   * carries too waits for it (deferred[i]: its item), so the memories are minted here in the
   * order they were made in — the items' that the state lacks (older than all the state's),
   * then the state's, each in its place — and a turn lists what it listed there. */
  state_memory *smem;
  const cph_state_item **deferred;
  size_t n_smem;
} import_ctx;

static void import_ctx_free(import_ctx *ic) {
  for (size_t i = 0; i < ic->n; i++)
    free(ic->origins[i]);
  free(ic->origins);
  free(ic->ids);
  for (size_t i = 0; i < ic->n_smem; i++)
    state_memory_free(&ic->smem[i]);
  free(ic->smem);
  free(ic->deferred);
}

static int import_memory(import_ctx *ic, const cph_state_item *it, bool may_defer, char *why,
                         size_t len);

/* The memories part of version 7: each memory its scope here lacks (by text, among the scope's
 * newest of its class) is minted there with its tags, a raw memory from an event linked to that
 * event's copy here when the channel's newest history has it; in the part's order, so their
 * order over the scopes is the one they had. *used: the part's length. CPH_EINVAL (why says
 * what) when the part is malformed. */
static int state_import_scoped_memories(const cph_handover *st, cph_txn *t, const char *session,
                                        const uint8_t *data, size_t n, size_t *used,
                                        import_ctx *ic, char *why, size_t len) {
  if (n < 4) {
    snprintf(why, len, "its memories part is cut short (%zu bytes)", n);
    return CPH_EINVAL;
  }
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  int rc = CPH_OK;
  memory_import mi = {0};
  for (uint32_t i = 0; rc == CPH_OK && i < count; i++) {
    state_memory m = {0};
    rc = read_state_memory(data, n, &at, session, i + 1, &m, why, len);
    if (rc == CPH_OK && i < ic->n_smem && ic->deferred[i]) { /* its item, in its place */
      cph_txn *was = ic->t;
      ic->t = t;
      rc = import_memory(ic, ic->deferred[i], false, why, len);
      ic->t = was;
      state_memory_free(&m);
      continue;
    }
    bool held = false;
    uint64_t unlinked = 0;
    if (rc == CPH_OK)
      rc = import_held(&mi, t, m.scope, m.kind == CPH_MEMORY_RAW, m.text, &held, &unlinked);
    uint64_t source = 0, id = 0;
    if (rc == CPH_OK && (!held || unlinked) && m.sender)
      rc = import_event(&mi, t, m.scope + 1, m.sender, m.ts_ms, m.text, &source);
    /* held, as a channel's memories item brought it (16.): linked to its event's moved copy
     * now, as it would have been minted */
    if (rc == CPH_OK && held && unlinked && source)
      rc = memory_link_source(st->memory, t, unlinked, source);
    if (rc == CPH_OK && !held)
      rc = memory_mint(st->memory, t, m.scope, m.kind, m.text, source, true, &id);
    for (uint32_t k = 0; rc == CPH_OK && !held && k < m.n_tags; k++)
      rc = memory_add_tag(st->memory, t, id, m.tags[k]);
    state_memory_free(&m);
  }
  memory_import_free(&mi);
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

/* What importing one record of a part needs: this node's name and the session; the turn
 * records this state's part stored here (their origins and new ids), which its kept turn
 * contexts are stored under. */
/* Remembers that the turn record of origin was stored here as id. */
static int imported_turn(import_ctx *ic, const char *origin, uint64_t id) {
  if (ic->n == ic->cap) {
    size_t cap = ic->cap ? 2 * ic->cap : 16;
    char **o = realloc(ic->origins, cap * sizeof *o);
    if (o)
      ic->origins = o;
    uint64_t *d = o ? realloc(ic->ids, cap * sizeof *d) : NULL;
    if (!d)
      return CPH_ENOMEM;
    ic->ids = d;
    ic->cap = cap;
  }
  if (!(ic->origins[ic->n] = strdup(origin)))
    return CPH_ENOMEM;
  ic->ids[ic->n++] = id;
  return CPH_OK;
}

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
          : tr.state == CPH_TURN_LEASED ? "not ended (leased)"
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
  if (rc == CPH_OK && !held)
    rc = imported_turn(ic, tr.origin, tr.id);
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

/* One kept turn context of the state: stored under the id its turn record got here when this
 * state's turn records part stored that record, else left out (turnlog_import). CPH_EINVAL,
 * with why, for an entry that is cut short or not one of the session's self-contained kept
 * contexts. */
static int import_kept(void *ctx, const uint8_t *rec, size_t l, char *why, size_t len) {
  import_ctx *ic = ctx;
  size_t at = 0;
  bool cut = false;
  char *origin = get_str32(rec, l, &at, &cut);
  if (!origin && !cut)
    return CPH_ENOMEM;
  cph_turnctx_rec r = {0};
  cph_err err = {0};
  int rc = cut ? CPH_EINVAL : cph_record_decode(&cph_turnctx_desc, rec + at, l - at, &r, &err);
  const char *bad = cut ? "its origin is cut short"
                        : record_problem(rc, &err, origin, r.session ? r.session : "",
                                         ic->session);
  if (!bad && rc == CPH_OK)
    bad = turnlog_carried_problem(&r, ic->session);
  if (bad) {
    snprintf(why, len, "%.160s", bad);
    rc = CPH_EINVAL;
  }
  for (size_t i = 0; rc == CPH_OK && i < ic->n; i++)
    if (strcmp(ic->origins[i], origin) == 0) {
      rc = turnlog_import(ic->turnlog, ic->t, ic->ids[i], &r);
      break;
    }
  cph_record_free(&cph_turnctx_desc, &r);
  free(origin);
  return rc;
}

/* A reply of the replies stream: added to this node's stream unless it holds the origin
 * (GET /v1/replies offers it there, a connector drops an origin it delivered already).
 * CPH_EINVAL, with why, for one that is not the session's reply with an origin, a channel and
 * a body. */
static int import_reply(import_ctx *ic, const uint8_t *rec, size_t l, char *why, size_t len) {
  cph_reply_rec r = {0};
  cph_err err = {0};
  int rc = cph_record_decode(&cph_reply_desc, rec, l, &r, &err);
  const char *bad = record_problem(rc, &err, r.origin, r.session ? r.session : "", ic->session);
  if (!bad && rc == CPH_OK && (!r.channel || !*r.channel || !r.body))
    bad = "no channel or no body";
  if (bad) {
    snprintf(why, len, "%.160s", bad);
    rc = CPH_EINVAL;
  } else if (rc == CPH_OK) {
    rc = replystream_offer(ic->t, &r, &ic->item_reply);
  }
  cph_record_free(&cph_reply_desc, &r);
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
  /* The stream replies, the channel history, the memories and the turn records each only
   * while the whole fits (else none of that part: empty), with room kept for the empty parts
   * after it; the seals and then the kept turn contexts, those that fit in what is left. */
  stream_scan ss = {0};
  rc = replystream_session_newest(&st->env->txn, s->id, STATE_STREAM_REPLIES,
                                  collect_stream_reply, &ss);
  if (rc == CPH_OK && ss.nomem)
    rc = CPH_ENOMEM;
  static const uint8_t none[4] = {0};
  cph_buf part = {0};
  size_t history = 0; /* the entries the history part carries */
  for (int i = 0; rc == CPH_OK && i < 6; i++) {
    cph_buf_reset(&part);
    if (i == 0)
      write_stream_part(&ss, &part);
    else if (i == 1)
      rc = state_export_history(st, s, &part, &history);
    else if (i == 2)
      rc = state_export_memories(st, s, history, &part);
    else if (i == 3)
      rc = state_export_turns(st, s, &part);
    else if (i == 4)
      rc = state_export_seals(st, s, CPH_HANDOVER_MAX_BYTES - 4 - out->len, &part);
    else
      rc = state_export_kept(st, s, CPH_HANDOVER_MAX_BYTES - out->len, &part);
    if (rc == CPH_OK && cph_buf_error(&part))
      rc = CPH_ENOMEM;
    if (rc == CPH_OK && out->len + part.len + 4u * (unsigned)(5 - i) <= CPH_HANDOVER_MAX_BYTES)
      cph_buf_append(out, part.data, part.len);
    else if (rc == CPH_OK)
      cph_buf_append(out, none, 4);
  }
  cph_buf_free(&part);
  stream_scan_free(&ss);
  return rc;
}

/* The state of the op (see handover_import). */
static void import_state(const cph_handover *st, cph_op *op, csession *s, import_ctx *pre,
                         uint64_t *newest_reply) {
  const char *id = s->id;
  const uint8_t *p = op->u.state.data;
  size_t n = op->u.state.len;
  uint32_t version = n < STATE_HEAD ? 0 : cph_be32_get(p + 4);
  if (n < STATE_HEAD || memcmp(p, STATE_MAGIC, 4) != 0 ||
      version < STATE_VERSION_NO_STREAM || version > STATE_VERSION ||
      cph_be32_get(p + 8) < STATE_SCHEMA_OLDEST ||
      cph_be32_get(p + 8) > CPH_STORE_SCHEMA_VERSION) {
    op_fail(op, CPH_EINVAL, "state",
            "the state of session '%s' is not a version-%u to -%u state of store schema %u to %u",
            id, STATE_VERSION_NO_STREAM, STATE_VERSION, STATE_SCHEMA_OLDEST,
            CPH_STORE_SCHEMA_VERSION);
    return;
  }
  uint64_t episode = cph_be64_get(p + 12), bits = cph_be64_get(p + 20);
  double credits;
  memcpy(&credits, &bits, 8);
  cph_txn t;
  cph_txn_begin_child(&st->env->txn, &t);
  size_t used = 0;
  /* A state older than the tree here in the same line of turns (this node's own, put before a
   * completion whose state the log never took: it answered 503, and this node took the shard
   * back) leaves the tree, episode and credits here as they are; the rest merges as always. */
  bool keep = false;
  int rc = trees_import_is_behind(st->trees, &t, id, p + STATE_HEAD, n - STATE_HEAD, &used, &keep);
  if (rc == CPH_OK && !keep)
    rc = trees_import(st->trees, &t, id, p + STATE_HEAD, n - STATE_HEAD, &used);
  else if (rc == CPH_OK)
    cph_log(CPH_LOG_INFO, "session '%s': the state from the cluster log (episode %llu) is older "
            "than this node's (episode %llu), which went on from it: its tree, episode and "
            "credits are kept", id, (unsigned long long)episode,
            (unsigned long long)s->episode);
  size_t at = STATE_HEAD + used;
  uint64_t newest = 0;
  reply_scan history = {0};
  if (rc == CPH_OK && version >= STATE_VERSION_NO_TURNS) {
    rc = state_import_stream(&t, id, p + at, n - at, &used, &newest, &history);
    at += rc == CPH_OK ? used : 0;
  }
  char why[256] = "";
  hist_list entries = {0};
  if (rc == CPH_OK && version >= STATE_VERSION_NO_KEPT) /* the channel history */
    rc = state_read_history(p + at, n - at, &used, &entries, why, sizeof why);
  else if (rc == CPH_OK) /* the channel replies of versions 1 to 4 */
    rc = state_read_channel_part(p + at, n - at, &used, &history);
  at += rc == CPH_OK ? used : 0;
  if (rc == CPH_OK)
    rc = state_import_history(&t, id, &history);
  if (rc == CPH_OK)
    rc = state_import_channels(&t, id, &entries);
  reply_scan_free(&history);
  hist_list_free(&entries);
  if (rc == CPH_OK && version > STATE_VERSION_NO_SCOPES)
    rc = state_import_scoped_memories(st, &t, id, p + at, n - at, &used, pre, why, sizeof why);
  else if (rc == CPH_OK)
    rc = state_import_memories(st, &t, id, p + at, n - at, &used);
  at += rc == CPH_OK ? used : 0;
  /* the turn records (version 3 on) and the seals (version 4): each one whose origin this
   * node lacks is stored here; nothing may follow the last part */
  /* the records the items stored count as this state's: its kept contexts go with them */
  /* ic takes the turn records noted; the state's memories and their deferred items stay the
   * caller's (handover_import stores those the state did not) */
  import_ctx ic = *pre;
  pre->origins = NULL;
  pre->ids = NULL;
  pre->n = pre->cap = 0;
  ic.smem = NULL;
  ic.deferred = NULL;
  ic.n_smem = 0;
  ic.t = &t;
  const char *last = NULL;
  if (rc == CPH_OK && version >= STATE_VERSION_NO_SEALS) {
    rc = read_records_part(p + at, n - at, "turn record", &used, why, sizeof why, import_turn,
                           &ic);
    at += rc == CPH_OK ? used : 0;
    last = "turn records";
  }
  if (rc == CPH_OK && version >= STATE_VERSION_NO_HISTORY) {
    rc = read_records_part(p + at, n - at, "seal", &used, why, sizeof why, import_seal, &ic);
    at += rc == CPH_OK ? used : 0;
    last = "seals";
  }
  if (rc == CPH_OK && version > STATE_VERSION_NO_KEPT) {
    rc = read_records_part(p + at, n - at, "kept turn context", &used, why, sizeof why,
                           import_kept, &ic);
    at += rc == CPH_OK ? used : 0;
    last = "kept turn contexts";
  }
  import_ctx_free(&ic);
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
  if (!keep) {
    s->episode = episode;
    if (rc == CPH_OK && credits == credits) /* not NaN */
      rc = csession_reassign(st->sessions, s, s->lane, credits);
    if (rc == CPH_OK)
      rc = persist_session_credits(st->sessions, &t, s);
  }
  if (rc == CPH_OK)
    rc = cph_txn_commit(&t);
  else
    cph_txn_abort(&t);
  if (rc == CPH_OK && newest)
    *newest_reply = newest;
  if (rc) {
    s->episode = old_episode;
    csession_reassign(st->sessions, s, s->lane, old_credits);
    op_fail(op, rc, NULL, "importing the state of session '%s': %s", id,
            t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
}

/* The origin an item's name carries after its kind byte (item_push writes it in hex) into
 * buf (MEMORY_ORIGIN_MAX bytes). False when the name is not that. */
static bool item_name_origin(const char *name, char *buf) {
  size_t hl = name && *name ? strlen(name + 1) : 0;
  if (!hl || hl % 2 || hl / 2 >= MEMORY_ORIGIN_MAX)
    return false;
  for (size_t i = 0; i < hl / 2; i++) {
    int hi = cph_unhex(name[1 + 2 * i]), lo = cph_unhex(name[2 + 2 * i]);
    if (hi < 0 || lo < 0 || !(hi | lo))
      return false;
    buf[i] = (char)(hi << 4 | lo);
  }
  buf[hl / 2] = '\0';
  return true;
}

/* A memory item: the session's own memory (a worker's, minted by a completion, or a summary
 * compaction made of them), stored with its origin unless this node holds that
 * (memory_adopt). A tombstoned one (compaction deleted it there after its item was put): the
 * copy this node holds is tombstoned too (gc_tombstone), and one it lacks is not stored.
 * CPH_EINVAL, with why, for one that is not a memory of the session's own scope with an
 * origin. With may_defer, one that claimed a memory of the state's part (claim_memory_items)
 * waits for it: state_import_scoped_memories stores it there, in the state's order. */
static int import_memory(import_ctx *ic, const cph_state_item *it, bool may_defer, char *why,
                         size_t len) {
  const char *name = it->name;
  const uint8_t *rec = it->data + ITEM_HEAD;
  size_t l = it->len - ITEM_HEAD;
  char origin[MEMORY_ORIGIN_MAX];
  if (!item_name_origin(name, origin) || !strchr(origin, '/')) {
    snprintf(why, len, "its name carries no origin");
    return CPH_EINVAL;
  }
  cph_memory_rec m = {0};
  cph_err err = {0};
  int rc = cph_record_decode(&cph_memory_desc, rec, l, &m, &err);
  const char *bad = record_problem(rc, &err, origin, rc == CPH_OK ? m.session : "", ic->session);
  if (!bad && rc == CPH_OK)
    bad = m.kind >= CPH_MEMORY_KIND_COUNT ? "an unknown kind of memory"
          : !m.text || !*m.text           ? "no text"
                                          : NULL;
  uint64_t here = 0;
  if (bad) {
    snprintf(why, len, "%.160s", bad);
    rc = CPH_EINVAL;
  } else if (rc == CPH_OK) {
    rc = memory_find_origin(ic->t, ic->node, origin, &here);
  }
  bool deferred = false; /* it, or a copy of it (the log may hand an item twice) */
  for (size_t i = 0; may_defer && i < ic->n_smem && !deferred; i++)
    deferred = ic->deferred[i] && strcmp(ic->deferred[i]->name, it->name) == 0;
  if (deferred) {
    /* stored with the state's memories (claim_memory_items) */
  } else if (rc == CPH_OK && !here && !m.deleted) {
    rc = memory_adopt(ic->memory, ic->t, &m, origin, NULL);
  } else if (rc == CPH_OK && here && m.deleted) {
    cph_memory_rec h;
    rc = memory_read(ic->t, here, &h, "importing memories");
    if (rc == CPH_OK) {
      if (!h.deleted)
        rc = gc_tombstone(ic->memory, ic->policy, ic->t, &h, 0, cph_wall_ms(),
                          &ic->outbox_items);
      cph_record_free(&cph_memory_desc, &h);
    } else if (rc == CPH_ENOTFOUND) {
      rc = CPH_OK; /* gone (or unreadable) here: nothing to tombstone */
    }
  }
  cph_record_free(&cph_memory_desc, &m);
  return rc;
}

/* One item of the op (handover.h): CPH_EINVAL with why for one that is not a turn record,
 * seal or memory of the session of this store schema (import_turn, import_seal,
 * import_memory say more). */
static int import_item(import_ctx *ic, const cph_state_item *it, char *why, size_t len) {
  const uint8_t *p = it->data;
  if (!p || it->len < ITEM_HEAD || memcmp(p, ITEM_MAGIC, 4) != 0 ||
      cph_be32_get(p + 4) != ITEM_VERSION || cph_be32_get(p + 8) < STATE_SCHEMA_OLDEST ||
      cph_be32_get(p + 8) > CPH_STORE_SCHEMA_VERSION) {
    snprintf(why, len, "not a version-%u item of store schema %u to %u", ITEM_VERSION,
             STATE_SCHEMA_OLDEST, CPH_STORE_SCHEMA_VERSION);
    return CPH_EINVAL;
  }
  if (p[12] == ITEM_TURN)
    return import_turn(ic, p + ITEM_HEAD, it->len - ITEM_HEAD, why, len);
  if (p[12] == ITEM_SEAL)
    return import_seal(ic, p + ITEM_HEAD, it->len - ITEM_HEAD, why, len);
  if (p[12] == ITEM_MEMORY)
    return import_memory(ic, it, true, why, len);
  if (p[12] == ITEM_KEPT) /* its turn record's origin, then the record (the state's form) */
    return import_kept(ic, p + ITEM_HEAD, it->len - ITEM_HEAD, why, len);
  if (p[12] == ITEM_REPLY)
    return import_reply(ic, p + ITEM_HEAD, it->len - ITEM_HEAD, why, len);
  snprintf(why, len, "of an unknown kind (%u)", p[12]);
  return CPH_EINVAL;
}

/* An item's place in the order the items are stored in: by kind, then by the time its record
 * was made (the records' ids here then follow the order they were made in, as the state's
 * do), then by its origin's node and id there. */
typedef struct item_order {
  size_t index;
  uint8_t kind;
  int64_t created_ms;
  char node[ORIGINS_NODE_MAX + 1];
  uint64_t id;
} item_order;

/* Kinds in the order their items are stored: a kept context goes under the id its turn record
 * got in the same import, so after the turn records. */
static int kind_rank(uint8_t kind) {
  return kind == ITEM_MEMORY ? 0
         : kind == ITEM_SEAL ? 1
         : kind == ITEM_TURN ? 2
         : kind == ITEM_KEPT ? 3
         : kind == ITEM_REPLY ? 4
                              : 5;
}

static int item_order_cmp(const void *a, const void *b) {
  const item_order *x = a, *y = b;
  if (x->kind != y->kind)
    return kind_rank(x->kind) < kind_rank(y->kind) ? -1 : 1;
  if (x->created_ms != y->created_ms)
    return x->created_ms < y->created_ms ? -1 : 1;
  int c = strcmp(x->node, y->node);
  if (c)
    return c;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* it's sort key into o (a malformed item sorts first, with nothing: it is refused anyway). */
static void item_order_of(const cph_state_item *it, item_order *o) {
  const uint8_t *p = it->data;
  if (!p || it->len < ITEM_HEAD || memcmp(p, ITEM_MAGIC, 4) != 0)
    return;
  o->kind = p[12];
  const char *origin = NULL;
  cph_turn_rec tr = {0};
  cph_seal_rec sr = {0};
  cph_memory_rec mr = {0};
  cph_reply_rec rr = {0};
  char named[MEMORY_ORIGIN_MAX];
  cph_err err = {0};
  if (o->kind == ITEM_TURN &&
      cph_record_decode(&cph_turn_desc, p + ITEM_HEAD, it->len - ITEM_HEAD, &tr, &err) == CPH_OK) {
    o->created_ms = tr.created_ms;
    origin = tr.origin;
  } else if (o->kind == ITEM_SEAL && cph_record_decode(&cph_seal_desc, p + ITEM_HEAD,
                                                       it->len - ITEM_HEAD, &sr,
                                                       &err) == CPH_OK) {
    o->created_ms = sr.created_ms;
    origin = sr.origin;
  } else if (o->kind == ITEM_MEMORY && item_name_origin(it->name, named) &&
             cph_record_decode(&cph_memory_desc, p + ITEM_HEAD, it->len - ITEM_HEAD, &mr,
                               &err) == CPH_OK) {
    o->created_ms = mr.created_ms;
    origin = named;
    cph_record_free(&cph_memory_desc, &mr);
  } else if (o->kind == ITEM_REPLY && cph_record_decode(&cph_reply_desc, p + ITEM_HEAD,
                                                        it->len - ITEM_HEAD, &rr,
                                                        &err) == CPH_OK) {
    o->created_ms = rr.ts_ms;
    origin = rr.origin;
  }
  const char *slash = origin ? strchr(origin, '/') : NULL;
  if (slash) { /* "<node>/<id>/<16 hex>" */
    snprintf(o->node, sizeof o->node, "%.*s", (int)(slash - origin), origin);
    o->id = strtoull(slash + 1, NULL, 10);
  }
  if (o->kind == ITEM_TURN)
    cph_record_free(&cph_turn_desc, &tr);
  else if (o->kind == ITEM_SEAL)
    cph_record_free(&cph_seal_desc, &sr);
  else if (o->kind == ITEM_REPLY)
    cph_record_free(&cph_reply_desc, &rr);
}

/* Which memory items the state's memories part carries too (ic->smem, read by
 * state_memories_preread): item it claims entry i (ic->deferred[i] = it) when they have the
 * same scope, kind and text. The state holds the newest memories of its scopes, so of the
 * items with one text the newest claim its entries, oldest to oldest: the items come oldest
 * first (order), and one that finds every entry of its text claimed takes the newest place,
 * each claimant moving one entry older and the oldest giving its entry up. Items the log's
 * copy holds already (their origin is here) or tombstones are not claimed. Reads only. */
static void claim_memory_items(const cph_handover *st, import_ctx *ic, const cph_op *op,
                               const item_order *order, size_t n) {
  for (size_t o = 0; o < n && ic->n_smem; o++) {
    const cph_state_item *it = &op->u.state.items[order[o].index];
    char origin[MEMORY_ORIGIN_MAX];
    if (order[o].kind != ITEM_MEMORY || !it->data || it->len < ITEM_HEAD ||
        !item_name_origin(it->name, origin))
      continue;
    cph_memory_rec m = {0};
    cph_err err = {0};
    if (cph_record_decode(&cph_memory_desc, it->data + ITEM_HEAD, it->len - ITEM_HEAD, &m,
                          &err) != CPH_OK)
      continue;
    uint64_t here = 0;
    bool copy = false; /* of an item claimed already (the log may hand an item twice) */
    for (size_t i = 0; i < ic->n_smem && !copy; i++)
      copy = ic->deferred[i] && strcmp(ic->deferred[i]->name, it->name) == 0;
    if (!copy && !m.deleted && m.text && m.session &&
        memory_find_origin(&st->env->txn, ic->node, origin, &here) == CPH_OK && !here) {
      bool taken = false, any = false; /* the oldest entry of the text not claimed yet */
      for (size_t i = 0; i < ic->n_smem && !taken; i++) {
        const state_memory *e = &ic->smem[i];
        if (e->kind != m.kind || strcmp(e->scope, m.session) != 0 ||
            strcmp(e->text, m.text) != 0)
          continue;
        any = true;
        if (!ic->deferred[i]) {
          ic->deferred[i] = it;
          taken = true;
        }
      }
      if (!taken && any) {
        /* every entry of the text is claimed: shift the claims one entry older, the oldest
         * claimant dropping out (it is older than every memory the state carries) */
        const cph_state_item *carry = it;
        for (size_t i = ic->n_smem; i-- > 0;) {
          const state_memory *e = &ic->smem[i];
          if (e->kind != m.kind || strcmp(e->scope, m.session) != 0 ||
              strcmp(e->text, m.text) != 0)
            continue;
          const cph_state_item *was = ic->deferred[i];
          ic->deferred[i] = carry;
          carry = was;
        }
      }
    }
    cph_record_free(&cph_memory_desc, &m);
  }
}

/* The op's items, in item_order, each in a child of its own: a bad one is logged, counted and
 * left out. The turn records stored are noted in ic (its t is set per item). */
static void import_items(const cph_handover *st, cph_op *op, const char *id, import_ctx *ic) {
  size_t n = op->u.state.n_items;
  item_order *order = n ? calloc(n, sizeof *order) : NULL;
  if (n && !order) {
    op_fail(op, CPH_ENOMEM, NULL, "importing the items of session '%s': out of memory", id);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    order[i].index = i;
    item_order_of(&op->u.state.items[i], &order[i]);
  }
  if (n > 1)
    qsort(order, n, sizeof *order, item_order_cmp);
  claim_memory_items(st, ic, op, order, n);
  for (size_t i = 0; i < n; i++) {
    const cph_state_item *it = &op->u.state.items[order[i].index];
    cph_txn t;
    cph_txn_begin_child(&st->env->txn, &t);
    ic->t = &t;
    size_t noted = ic->n;
    char why[256] = "";
    ic->item_reply = 0;
    int rc = import_item(ic, it, why, sizeof why);
    if (rc == CPH_OK)
      rc = cph_txn_commit(&t);
    else
      cph_txn_abort(&t);
    if (rc == CPH_OK && ic->item_reply > ic->newest_reply)
      ic->newest_reply = ic->item_reply;
    while (rc && ic->n > noted) /* not stored after all */
      free(ic->origins[--ic->n]);
    if (rc == CPH_EINVAL) {
      op->u.state.items_refused++;
      cph_log(CPH_LOG_WARN, "the item %.80s of session '%s' is not taken: %s",
              it->name ? it->name : "(unnamed)", id, why);
    } else if (rc) {
      op_fail(op, rc, NULL, "importing an item of session '%s': %s", id,
              t.err.msg[0] ? t.err.msg : cph_strerror(rc));
      break;
    }
  }
  ic->t = NULL;
  free(order);
}

/* Skips a part of the blob at data[*at]: be32 count, then per entry the fields `layout`
 * names in order ('b' a byte, '8' eight bytes, 's' be32 length + bytes). False when cut
 * short. */
static bool skip_part(const uint8_t *data, size_t n, size_t *at, const char *layout) {
  if (n - *at < 4)
    return false;
  uint32_t count = cph_be32_get(data + *at);
  *at += 4;
  for (uint32_t i = 0; i < count; i++)
    for (const char *f = layout; *f; f++) {
      size_t need = *f == 'b' ? 1 : *f == '8' ? 8 : 4;
      if (n - *at < need)
        return false;
      if (*f == 's' && n - *at - 4 < cph_be32_get(data + *at))
        return false;
      *at += *f == 's' ? 4 + cph_be32_get(data + *at) : need;
    }
  return true;
}

/* The memories part of a state of version 7 on (blob p[0..n)), read into ic->smem (with room
 * for their deferred items) before the items are imported. Anything amiss leaves it empty:
 * the state's own import then says what. */
static void state_memories_preread(const uint8_t *p, size_t n, const char *session,
                                   import_ctx *ic) {
  if (n < STATE_HEAD || memcmp(p, STATE_MAGIC, 4) != 0 ||
      cph_be32_get(p + 4) <= STATE_VERSION_NO_SCOPES || cph_be32_get(p + 4) > STATE_VERSION)
    return;
  size_t at = STATE_HEAD;
  /* the tree's records (key, value), the stream replies, the channel history */
  if (!skip_part(p, n, &at, "ss") || !skip_part(p, n, &at, "bss8s") ||
      !skip_part(p, n, &at, "bsss8s") || n - at < 4)
    return;
  uint32_t count = cph_be32_get(p + at);
  at += 4;
  /* Each memory takes at least its kind, its flags and a string's length (read_state_memory):
   * a count the bytes left cannot hold is malformed, and must not size the arrays (a fuzzed
   * state asked calloc for 124 GB). */
  if (count > (n - at) / 6)
    return;
  if (!count || !(ic->smem = calloc(count, sizeof *ic->smem)) ||
      !(ic->deferred = calloc(count, sizeof *ic->deferred))) {
    free(ic->smem);
    ic->smem = NULL;
    return;
  }
  char why[128];
  for (uint32_t i = 0; i < count; i++) {
    if (read_state_memory(p, n, &at, session, i + 1, &ic->smem[i], why, sizeof why) != CPH_OK) {
      state_memory_free(&ic->smem[i]);
      break;
    }
    ic->n_smem = i + 1;
  }
}

/* CPH_OP_SESSION_STATE: see include/cephalon/cephalon.h. */
void handover_import(const cph_handover *st, cph_op *op, uint64_t *newest_reply,
                     uint64_t *outbox_items) {
  const char *id = op->u.state.session;
  csession *s = id ? sessions_get(st->sessions, id) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "session", "no session '%s'", id ? id : "");
    return;
  }
  /* the items first: those older than the state's records are stored before them, so every
   * record's id here follows the order it was made in */
  import_ctx ic = {.node = st->env->reply_origin_node,
                   .session = s->id,
                   .turnlog = st->turnlog,
                   .memory = st->memory,
                   .policy = st->env->policy};
  if (op->u.state.data)
    state_memories_preread(op->u.state.data, op->u.state.len, s->id, &ic);
  import_items(st, op, s->id, &ic);
  *outbox_items = ic.outbox_items;
  if (ic.newest_reply) /* the state's replies, if it adds any, come after */
    *newest_reply = ic.newest_reply;
  bool stored = false; /* the state, and with it the memory items it claimed */
  if (op->rc == CPH_OK && op->u.state.data) {
    import_state(st, op, s, &ic, newest_reply);
    stored = op->rc == CPH_OK;
  }
  /* The state was refused (malformed: EINVAL) or not reached: the memory items it claimed are
   * stored now, as every item is whatever its state. */
  for (size_t i = 0; !stored && i < ic.n_smem; i++) {
    if (!ic.deferred[i] || (op->rc != CPH_OK && op->rc != CPH_EINVAL))
      continue;
    cph_txn t;
    cph_txn_begin_child(&st->env->txn, &t);
    ic.t = &t;
    char why[256] = "";
    int rc = import_memory(&ic, ic.deferred[i], false, why, sizeof why);
    rc = rc == CPH_OK ? cph_txn_commit(&t) : (cph_txn_abort(&t), rc);
    if (rc && op->rc == CPH_OK)
      op_fail(op, rc, NULL, "importing a memory item of session '%s': %s", s->id,
              why[0] ? why : cph_strerror(rc));
    else if (rc)
      cph_log(CPH_LOG_WARN, "the memory item %.80s of session '%s' is not taken: %s",
              ic.deferred[i]->name, s->id, why[0] ? why : cph_strerror(rc));
  }
  import_ctx_free(&ic);
}

/* ---- A channel's memories (server/clusterflow.h 16.) ----
 *
 * Each node keeps its own copy of a channel, and a session's state carries only the newest
 * memories of its scopes. So the node that applies an event of the log's `in` messages gives
 * the raw memory it minted in the event's channel as a part (handover_channel_memory_part),
 * and the cluster log keeps the parts of one message and channel as one item, kind 'c', under
 * the channel's key: be32 count, then per memory be32 length + its origin, be32 length + the
 * record (its scope, text, kind, creation time and access count; no id, source event or
 * embedding: those are the node's). The origin is the event's identity cluster-wide
 * (memory_event_origin: its scope, sender, time and text), which every node that applies the
 * event mints its memory under (ingest.c), so an import matches this node's copies by it. */

#define ITEM_CHANNEL 'c'

int handover_channel_memory_part(cph_txn *t, uint64_t memory_id, const char *event_sender,
                                 int64_t event_ts_ms, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  cph_memory_rec m;
  int rc = memory_read(t, memory_id, &m, "the cluster log's channel memories");
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  if (m.session && m.session[0] == CPH_CHANNEL_SCOPE_PREFIX && !m.deleted && m.text &&
      event_sender) {
    /* the origin it was minted (or adopted) under; a memory minted without one (an applier
     * that did not set memory_origin) gets its event's */
    char origin[MEMORY_ORIGIN_MAX] = "";
    if (memory_has_origin(t, memory_id) && memory_origin_of(t, "", &m, origin) != CPH_OK)
      origin[0] = '\0';
    if (strlen(origin) != MEMORY_EVENT_ORIGIN_LEN) /* none, or not an event's */
      memory_event_origin(m.session, event_sender, event_ts_ms, m.text, origin);
    cph_memory_rec r = {.session = m.session,
                        .kind = m.kind,
                        .text = m.text,
                        .tokens_est = m.tokens_est,
                        .created_ms = m.created_ms,
                        .access_count = m.access_count};
    cph_buf b = {0};
    uint8_t l4[4];
    cph_be32_put(l4, MEMORY_EVENT_ORIGIN_LEN);
    cph_buf_append(&b, l4, 4);
    cph_buf_append(&b, origin, MEMORY_EVENT_ORIGIN_LEN);
    cph_buf rec = {0};
    rc = cph_record_encode(&cph_memory_desc, &r, &rec);
    cph_be32_put(l4, (uint32_t)rec.len);
    cph_buf_append(&b, l4, 4);
    cph_buf_append(&b, rec.data, rec.len);
    cph_buf_free(&rec);
    if (rc == CPH_OK && cph_buf_error(&b))
      rc = CPH_ENOMEM;
    if (rc == CPH_OK) {
      *len = b.len;
      *out = (uint8_t *)cph_buf_steal(&b);
    }
    cph_buf_free(&b);
  }
  cph_record_free(&cph_memory_desc, &m);
  return rc;
}

int cph_channel_memories_item(const uint8_t *const *parts, const size_t *lens, size_t n,
                              uint8_t **data, size_t *len) {
  cph_buf b = {0};
  item_head(&b, ITEM_CHANNEL);
  uint8_t c4[4];
  cph_be32_put(c4, (uint32_t)n);
  cph_buf_append(&b, c4, 4);
  for (size_t i = 0; i < n; i++)
    cph_buf_append(&b, parts[i], lens[i]);
  if (cph_buf_error(&b)) {
    cph_buf_free(&b);
    return CPH_ENOMEM;
  }
  *len = b.len;
  *data = (uint8_t *)cph_buf_steal(&b);
  return CPH_OK;
}

/* A memory read from a channel memories item. */
typedef struct channel_memory {
  char *origin;
  cph_memory_rec rec;
  size_t order; /* its place among those read: items in order, their memories in order */
} channel_memory;

/* The texts of the raw memories a scope holds that no channel item brought (this node's own
 * copies, minted from the events it applied, or brought by a session's state; live, or
 * compacted away by its gc), each with how many memories have it: each copy stands for one
 * memory of an item. */
typedef struct held_text {
  char *text;
  size_t copies;
} held_text;

typedef struct held_texts {
  cph_txn *t;
  cph_hmap map;
  bool nomem;
} held_texts;

/* One more copy of text in h. False when out of memory (h->nomem set). */
static bool held_text_add(held_texts *h, const char *text) {
  held_text *g = cph_hmap_get(&h->map, text);
  if (g) {
    g->copies++;
    return true;
  }
  g = malloc(sizeof *g);
  if (g && (g->text = strdup(text))) {
    g->copies = 1;
    if (cph_hmap_put(&h->map, g->text, g) == CPH_OK)
      return true;
    free(g->text);
  }
  free(g);
  h->nomem = true;
  return false;
}

static bool count_held_text(void *ctx, const cph_memory_rec *m) {
  held_texts *h = ctx;
  if (memory_has_origin(h->t, m->id))
    return true; /* brought by an item, or minted under its event's origin: matched by it */
  return held_text_add(h, m->text);
}

static void held_texts_free(held_texts *h) {
  for (size_t i = 0; i < h->map.cap; i++) {
    held_text *g = h->map.slots ? h->map.slots[i].value : NULL;
    if (g) {
      free(g->text);
      free(g);
    }
  }
  cph_hmap_free(&h->map);
}

/* Whether origin is an event's (memory_event_origin): "e:" and the time and hash, or the hash
 * alone as nodes before the time led wrote it. */
static bool event_origin_form(const char *origin) {
  size_t n = strlen(origin);
  return strncmp(origin, "e:", 2) == 0 &&
         (n == MEMORY_EVENT_ORIGIN_LEN || n == MEMORY_EVENT_ORIGIN_V1_LEN);
}

/* Reads channel memories item it of scope into *v (*n grown) — with `direct`, of any scope
 * that begins so (the direct channels' items: CPH_DIRECT_MEMORIES); CPH_EINVAL with why for
 * one that is not such an item, or holds a memory of another scope or kind. */
static int read_channel_item(const cph_state_item *it, const char *scope, bool direct,
                             channel_memory **v, size_t *n, size_t *cap, char *why, size_t len) {
  size_t scope_len = strlen(scope);
  const uint8_t *p = it->data;
  if (!p || it->len < ITEM_HEAD + 4 || memcmp(p, ITEM_MAGIC, 4) != 0 ||
      cph_be32_get(p + 4) != ITEM_VERSION || cph_be32_get(p + 8) < STATE_SCHEMA_OLDEST ||
      cph_be32_get(p + 8) > CPH_STORE_SCHEMA_VERSION || p[12] != ITEM_CHANNEL) {
    snprintf(why, len, "not a version-%u channel memories item of store schema %u to %u",
             ITEM_VERSION, STATE_SCHEMA_OLDEST, CPH_STORE_SCHEMA_VERSION);
    return CPH_EINVAL;
  }
  uint32_t count = cph_be32_get(p + ITEM_HEAD);
  size_t at = ITEM_HEAD + 4;
  for (uint32_t i = 0; i < count; i++) {
    bool bad = false;
    char *origin = get_str32(p, it->len, &at, &bad);
    uint32_t rl = !bad && it->len - at >= 4 ? cph_be32_get(p + at) : 0;
    if (!bad && (it->len - at < 4 || it->len - at - 4 < rl))
      bad = true;
    if (bad || !origin) {
      free(origin);
      if (!bad)
        return CPH_ENOMEM;
      snprintf(why, len, "its memory %" PRIu32 " is cut short", i + 1);
      return CPH_EINVAL;
    }
    cph_memory_rec m = {0};
    cph_err err = {0};
    int rc = cph_record_decode(&cph_memory_desc, p + at + 4, rl, &m, &err);
    at += 4 + (size_t)rl;
    const char *problem = rc == CPH_ECORRUPT                         ? err.msg
                          : rc                                       ? NULL
                          : !event_origin_form(origin)               ? "an origin of another form"
                          : !m.session || (direct ? strncmp(m.session, scope, scope_len) != 0 ||
                                                        !m.session[scope_len]
                                                  : strcmp(m.session, scope) != 0)
                              ? "of another scope"
                          : m.kind != CPH_MEMORY_RAW                 ? "not a raw memory"
                          : !m.text || !*m.text                      ? "no text"
                                                                     : NULL;
    if (rc == CPH_OK && !problem) {
      channel_memory *g = room_for_one(*v, cap, *n, sizeof *g, 64);
      if (g) {
        *v = g;
        (*v)[*n] = (channel_memory){origin, m, *n};
        (*n)++;
        continue;
      }
      rc = CPH_ENOMEM;
    }
    free(origin);
    cph_record_free(&cph_memory_desc, &m);
    if (rc && rc != CPH_ECORRUPT)
      return rc;
    snprintf(why, len, "its memory %" PRIu32 " is %.160s", i + 1, problem ? problem : "bad");
    return CPH_EINVAL;
  }
  if (at != it->len) {
    snprintf(why, len, "%zu bytes follow its %" PRIu32 " memories", it->len - at, count);
    return CPH_EINVAL;
  }
  return CPH_OK;
}

static int channel_memory_cmp(const void *a, const void *b) {
  const channel_memory *x = a, *y = b;
  if (x->rec.created_ms != y->rec.created_ms)
    return x->rec.created_ms < y->rec.created_ms ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order; /* one message's: in its order */
}

/* A channel's import between its steps (CPH_OP_CHANNEL_MEMORIES, u.channel.cont): what its
 * first step read — the items' memories, oldest first, and the copies the node held then —
 * and how far the steps came. */
struct cph_channel_import {
  char *scope;
  bool direct; /* the direct channels' memories (CPH_DIRECT_MEMORIES): scope is their prefix */
  channel_memory *v;
  size_t n, next;
  held_texts held;
};

void handover_channel_import_free(cph_channel_import *ci) {
  if (!ci)
    return;
  held_texts_free(&ci->held);
  for (size_t i = 0; i < ci->n; i++) {
    free(ci->v[i].origin);
    cph_record_free(&cph_memory_desc, &ci->v[i].rec);
  }
  free(ci->v);
  free(ci->scope);
  free(ci);
}

/* The first step's reading: the items' memories into ci (refused ones counted in op), sorted
 * oldest first. */
static int channel_import_read(cph_op *op, cph_channel_import *ci) {
  const char *chan = op->u.channel.channel;
  size_t cap = 0;
  for (size_t i = 0; i < op->u.channel.n_items; i++) {
    const cph_state_item *it = &op->u.channel.items[i];
    char why[256] = "";
    size_t before = ci->n;
    int rc = read_channel_item(it, ci->scope, ci->direct, &ci->v, &ci->n, &cap, why, sizeof why);
    if (rc != CPH_EINVAL && rc != CPH_OK)
      return rc;
    if (rc == CPH_EINVAL) { /* the item is left out whole */
      while (ci->n > before) {
        free(ci->v[--ci->n].origin);
        cph_record_free(&cph_memory_desc, &ci->v[ci->n].rec);
      }
      op->u.channel.refused++;
      cph_log(CPH_LOG_WARN, "the memories item %.80s of channel '%s' is not taken: %s",
              it->name ? it->name : "(unnamed)", chan, why);
    }
  }
  if (ci->n > 1)
    qsort(ci->v, ci->n, sizeof *ci->v, channel_memory_cmp); /* ids follow their making */
  return CPH_OK;
}

/* CPH_OP_CHANNEL_MEMORIES: see include/cephalon/cephalon.h. One step: the first reads the
 * items and the copies held, each stores up to `step` memories in a child transaction of the
 * pass; op->u.channel.cont keeps the rest for the next. */
void handover_import_channel(const cph_handover *st, cph_op *op) {
  const char *chan = op->u.channel.channel;
  cph_channel_import *ci = op->u.channel.cont;
  op->u.channel.cont = NULL;
  bool first = !ci;
  int rc = CPH_OK;
  if (first) {
    size_t cl = chan ? strlen(chan) : 0;
    if (!cl) {
      op_fail(op, CPH_EINVAL, "channel", "no channel");
      return;
    }
    if (!(ci = calloc(1, sizeof *ci)) || !(ci->scope = malloc(cl + 2))) {
      free(ci);
      op_fail(op, CPH_ENOMEM, NULL, "out of memory");
      return;
    }
    ci->held.map = (cph_hmap)CPH_HMAP_INIT;
    ci->scope[0] = CPH_CHANNEL_SCOPE_PREFIX;
    memcpy(ci->scope + 1, chan, cl + 1);
    ci->direct = strcmp(chan, CPH_DIRECT_MEMORIES) == 0;
    rc = channel_import_read(op, ci);
  }
  size_t step = op->u.channel.step ? op->u.channel.step : CPH_CHANNEL_IMPORT_STEP;
  size_t end = ci->n - ci->next < step ? ci->n : ci->next + step;
  cph_txn t;
  bool open = rc == CPH_OK && ci->next < ci->n;
  if (open && (rc = cph_txn_begin_child(&st->env->txn, &t)) != CPH_OK)
    open = false;
  if (open && first && !ci->direct) {
    /* the node's copies — its compacted ones too: each is in the summary that replaced it —
     * counted once, before anything is stored: what the steps store is matched by origin.
     * Direct channels' memories are matched by origin alone: they had none before the log
     * kept them, so a copy without one is of no item */
    ci->held.t = &t;
    rc = memories_tail(&t, ci->scope, true, true, SIZE_MAX, count_held_text, &ci->held);
    ci->held.t = NULL;
    if (rc == CPH_OK && ci->held.nomem)
      rc = CPH_ENOMEM;
  }
  for (; open && rc == CPH_OK && ci->next < end; ci->next++) {
    channel_memory *cm = &ci->v[ci->next];
    /* a direct channel's memory of a session this node does not have — deleted since: the
     * items outlive it — is not brought back */
    if (ci->direct && /* its scope: "#direct:<session>" */
        !sessions_get(st->sessions, cm->rec.session + 1 + strlen(CPH_DIRECT_MEMORIES)))
      continue;
    uint64_t here = 0;
    rc = memory_find_origin(&t, st->env->reply_origin_node, cm->origin, &here);
    held_text *copy = rc == CPH_OK && !here ? cph_hmap_get(&ci->held.map, cm->rec.text) : NULL;
    if (rc == CPH_OK && (here || (copy && copy->copies))) {
      if (copy)
        copy->copies--;
      op->u.channel.held++;
    } else if (rc == CPH_OK) {
      rc = memory_adopt(st->memory, &t, &cm->rec, cm->origin, NULL);
      op->u.channel.added += rc == CPH_OK;
    }
  }
  if (open)
    rc = rc == CPH_OK ? cph_txn_commit(&t) : (cph_txn_abort(&t), rc);
  if (rc) {
    op->u.channel.added = op->u.channel.held = 0;
    op_fail(op, rc, NULL, "importing the memories of channel '%s': %s", chan,
            open && t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
  if (rc == CPH_OK && ci->next < ci->n)
    op->u.channel.cont = ci; /* the next step in a later pass */
  else
    handover_channel_import_free(ci);
}
