/* Turns (DESIGN §4): serving lease requests (agent_turn), building a turn's input and sections,
 * heartbeat, complete (idempotent per lease), fail, lease expiry with attempt counting and
 * parking, requeue, restart recovery, and the replies / parked-turn reads. */
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/arena.h"
#include "common/clock.h"
#include "common/log.h"
#include "inbox.h"
#include "ingest.h"
#include "reports.h"
#include "handover.h"
#include "replystream.h"
#include "turnrecs.h"
#include "turns.h"

/* An active lease. */
typedef struct lease {
  char *key; /* turn id in decimal: its key in cph_turns.leases */
  uint64_t turn_id;
  csession *session;
  uint8_t token[16];
  int64_t deadline_ns;
  cph_turn_kind_t kind;
  uint64_t *inbox_ids; /* the staged messages it carries */
  size_t n_inbox_ids;
  uint64_t job_id; /* job turns: the job it runs */
  /* Arrivals during the turn (DESIGN §4): entries of the session with an id above watermark
   * (the newest inbox id when it was leased) and no turn are what arrived since; under
   * :interrupt, interrupt_asked is set by the first heartbeat that saw one, and only then
   * may the worker complete with interrupted. */
  uint64_t watermark;
  bool interrupt_asked;
  /* Channel views (core/context.h): per channel of the staged messages, the newest channel
   * index the turn saw; completion moves the session's cursor there. Owned. */
  context_views views;
} lease;

const char *cph_turn_kind_name(cph_turn_kind_t k) {
  switch (k) {
  case CPH_KIND_INBOX:
    return "inbox";
  case CPH_KIND_AUTONOMY_TICK:
    return "autonomy_tick";
  case CPH_KIND_JOB:
    return "job";
  case CPH_KIND_REPORT:
    return "report";
  }
  return "unknown";
}

/* ---------------------------------------------------------------- freeing values */

void cph_turn_info_free(cph_turn_info *t) {
  free(t->session);
  free(t->input);
  for (size_t i = 0; i < t->n_staged; i++) {
    free(t->staged[i].channel);
    free(t->staged[i].sender);
    free(t->staged[i].body);
    free(t->staged[i].event_ids);
  }
  free(t->staged);
  free(t->history); /* its strings, the messages' and the memories' are in t->strings */
  for (size_t i = 0; i < t->n_tools; i++)
    free(t->tools[i].name);
  free(t->tools);
  free(t->messages);
  context_turn_free(t);
  cph_arena_free(&t->strings);
  memset(t, 0, sizeof *t);
}

void cph_reply_info_free(cph_reply_info *r) {
  free(r->session);
  free(r->channel);
  free(r->body);
  free(r->source_inbox_ids);
  free(r->origin);
  memset(r, 0, sizeof *r);
}

void cph_parked_turn_free(cph_parked_turn *p) {
  free(p->session);
  free(p->inbox_ids);
  free(p->error);
  memset(p, 0, sizeof *p);
}

void cph_park_note_free(cph_park_note *p) {
  free(p->session);
  free(p->error);
  cph_strv_free(&p->keys);
  memset(p, 0, sizeof *p);
}

void cph_op_clear_results(cph_op *op) {
  switch (op->kind) {
  case CPH_OP_SESSION_CREATE:
  case CPH_OP_SESSION_UPDATE:
  case CPH_OP_SESSION_DELETE:
    cph_session_info_free(&op->u.session.out);
    cph_strv_free(&op->u.session.consumed);
    break;
  case CPH_OP_INGEST:
    for (size_t i = 0; op->u.ingest.results && i < op->u.ingest.n_events; i++)
      free(op->u.ingest.results[i].memory_part);
    cph_arena_free(&op->u.ingest.strings); /* every string and list of the results */
    free(op->u.ingest.results);
    op->u.ingest.results = NULL;
    cph_strv_free(&op->u.ingest.park_held);
    op->u.ingest.park_turn = 0;
    break;
  case CPH_OP_LEASE:
    if (op->u.lease.keep) { /* before the turn info it reads */
      turnlog_keep_abandon(op->u.lease.keep);
      op->u.lease.keep = NULL;
    }
    cph_turn_info_free(&op->u.lease.turn);
    break;
  case CPH_OP_COMPLETE:
    cph_strv_free(&op->u.turn.consumed);
    free(op->u.turn.consumed_session);
    op->u.turn.consumed_session = NULL;
    free(op->u.turn.reply_written_channel);
    op->u.turn.reply_written_channel = NULL;
    free(op->u.turn.state);
    op->u.turn.state = NULL;
    op->u.turn.state_len = 0;
    cph_state_items_free(&op->u.turn.items);
    cph_session_items_free(&op->u.turn.job_items);
    break;
  case CPH_OP_FAIL:
  case CPH_OP_REQUEUE:
    free(op->u.turn.consumed_session);
    op->u.turn.consumed_session = NULL;
    cph_state_items_free(&op->u.turn.items);
    cph_park_note_free(&op->u.turn.park);
    break;
  case CPH_OP_INBOX_RETAIN:
    cph_strv_free(&op->u.retain.held);
    op->u.retain.parked_requeued = op->u.retain.parked_dropped = 0;
    op->u.retain.dropped = 0;
    break;
  case CPH_OP_CONTEXT_INSERT:
  case CPH_OP_CONTEXT_DELETE:
  case CPH_OP_CONTEXT_SEAL:
    free(op->u.context.state);
    op->u.context.state = NULL;
    op->u.context.state_len = 0;
    cph_state_items_free(&op->u.context.items);
    break;
  case CPH_OP_TAKE:
    for (size_t i = 0; i < op->u.turn.n_taken; i++) {
      free(op->u.turn.taken[i].channel);
      free(op->u.turn.taken[i].sender);
      free(op->u.turn.taken[i].body);
      free(op->u.turn.taken[i].event_ids);
    }
    free(op->u.turn.taken);
    op->u.turn.taken = NULL;
    op->u.turn.n_taken = 0;
    break;
  case CPH_OP_CHANNEL_MEMORIES: /* an import stopped between its steps */
    handover_channel_import_free(op->u.channel.cont);
    op->u.channel.cont = NULL;
    break;
  case CPH_OP_MEMORY_SEARCH:
    for (size_t i = 0; i < op->u.search.n_hits; i++) {
      free(op->u.search.hits[i].kind);
      free(op->u.search.hits[i].text);
      free(op->u.search.hits[i].session);
    }
    free(op->u.search.hits);
    op->u.search.hits = NULL;
    op->u.search.n_hits = 0;
    break;
  default:
    break;
  }
}

static void lease_free(lease *l) {
  if (!l)
    return;
  free(l->inbox_ids);
  context_views_free(&l->views);
  free(l->key);
  free(l);
}

/* ---------------------------------------------------------------- lifecycle and waiters */

void turns_init(cph_turns *tu) {
  memset(&tu->leases, 0, sizeof tu->leases);
  tu->waiters = (op_queue){0};
  tu->last_reply_id = 0;
  tu->parks = tu->ended = (turns_notes){0};
  tu->ended_bytes = tu->ended_kept_skipped = 0;
  memset(&tu->parked_by_session, 0, sizeof tu->parked_by_session);
  tu->parked_unknown = false;
}

/* ---------------------------------------------------------------- parked turns per session */

typedef struct parked_count {
  uint32_t n;
  char session[];
} parked_count;

static void parked_counts_clear(cph_turns *tu) {
  for (size_t i = 0; i < tu->parked_by_session.cap; i++)
    if (tu->parked_by_session.slots[i].key)
      free(tu->parked_by_session.slots[i].value);
  cph_hmap_free(&tu->parked_by_session);
  tu->parked_unknown = false;
}

/* A turn of session was parked here (delta 1) or is no longer (-1). */
static void parked_count_add(cph_turns *tu, const char *session, int delta) {
  parked_count *pc = cph_hmap_get(&tu->parked_by_session, session);
  if (delta < 0) {
    if (pc && pc->n > 1) {
      pc->n--;
    } else if (pc) {
      cph_hmap_del(&tu->parked_by_session, session);
      free(pc);
    }
    return;
  }
  if (pc) {
    pc->n++;
    return;
  }
  size_t len = strlen(session);
  if (!(pc = malloc(sizeof *pc + len + 1))) {
    tu->parked_unknown = true;
    return;
  }
  pc->n = 1;
  memcpy(pc->session, session, len + 1);
  if (cph_hmap_put(&tu->parked_by_session, pc->session, pc) != CPH_OK) {
    free(pc);
    tu->parked_unknown = true;
  }
}

/* Whether session may have turns parked here. */
static bool parked_any(const cph_turns *tu, const char *session) {
  return tu->parked_unknown || cph_hmap_get(&tu->parked_by_session, session) != NULL;
}

/* Calls visit with the turn record of each parked turn, in id order, and frees the record
 * after (visit may take its strings, leaving NULL); a parked key whose record is gone is passed
 * over. Stops at the first visit that fails and returns what it returned. The one walk of
 * CPH_DB_PARKED_TURNS: the counts at recovery, a session's parked ids, the listing. */
static int parked_each(cph_txn *t, int (*visit)(cph_turn_rec *tr, void *ctx), void *ctx) {
  cph_cursor c;
  cph_val k;
  int rc = cph_cursor_open(t, CPH_DB_PARKED_TURNS, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, NULL); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, NULL)) {
    if (k.len != 8)
      continue;
    cph_key tk = cph_key_of_u64(cph_be64_get(k.data));
    cph_turn_rec tr;
    int grc = cph_txn_get_record(t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    if (grc == CPH_ENOTFOUND)
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    grc = visit(&tr, ctx);
    cph_record_free(&cph_turn_desc, &tr);
    if (grc) {
      rc = grc;
      break;
    }
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

static int count_parked(cph_turn_rec *tr, void *ctx) {
  parked_count_add(ctx, tr->session, 1);
  return CPH_OK;
}

/* The map, read again from the store (turns_recover). */
static int parked_counts_load(cph_turns *tu) {
  parked_counts_clear(tu);
  cph_txn t;
  int rc = cph_txn_begin(tu->env->store, false, &t);
  if (rc)
    return rc;
  rc = parked_each(&t, count_parked, tu);
  cph_txn_abort(&t);
  return rc;
}

void turns_clear_leases(cph_turns *tu) {
  for (size_t i = 0; i < tu->leases.cap; i++)
    if (tu->leases.slots[i].key)
      lease_free(tu->leases.slots[i].value);
  cph_hmap_free(&tu->leases);
}

static void notes_drop(cph_turns *tu, size_t keep_parks, size_t keep_ended);

void turns_free(cph_turns *tu) {
  turns_clear_leases(tu);
  op_queue_free(&tu->waiters);
  notes_drop(tu, 0, 0);
  free(tu->parks.v);
  free(tu->ended.v);
  tu->parks = tu->ended = (turns_notes){0};
  tu->ended_bytes = tu->ended_kept_skipped = 0;
  parked_counts_clear(tu);
}

int turns_wait(cph_turns *tu, cph_op *op) { return op_queue_push(&tu->waiters, op); }

bool turns_cancel_wait(cph_turns *tu, cph_op *op) { return op_queue_remove(&tu->waiters, op); }

void turns_fail_waiters(cph_turns *tu, int rc, const char *msg) {
  cph_op *op;
  while ((op = op_queue_pop(&tu->waiters))) {
    op_fail(op, rc, NULL, "%s", msg);
    if (op->done)
      op->done(op, op->ctx);
  }
}

int64_t turns_next_deadline_ns(const cph_turns *tu) {
  int64_t next = INT64_MAX;
  for (size_t i = 0; i < tu->leases.cap; i++) {
    const lease *l = tu->leases.slots[i].value;
    if (tu->leases.slots[i].key && l->deadline_ns < next)
      next = l->deadline_ns;
  }
  for (size_t i = 0; i < tu->waiters.len; i++) {
    const cph_op *w = op_queue_at(&tu->waiters, i);
    if (w->u.lease.deadline_ns < next)
      next = w->u.lease.deadline_ns;
  }
  return next;
}

/* A served or failed waiter is answered after the pass commits (the done queue). */
static void waiter_done(cph_turns *tu, cph_op *op) {
  if (op_queue_push(tu->done, op) != CPH_OK && op->done)
    op->done(op, op->ctx); /* cannot defer: answer now (rc already set) */
}

/* ---------------------------------------------------------------- helpers */

static void hex_encode(const uint8_t *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * n] = '\0';
}

/* Parses 32 hex chars into 16 bytes. */
static bool hex_decode16(const char *hex, uint8_t out[16]) {
  if (!hex || strlen(hex) != 32)
    return false;
  for (int i = 0; i < 16; i++) {
    unsigned v = 0;
    for (int j = 0; j < 2; j++) {
      char c = hex[2 * i + j];
      unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                          : 16;
      if (d > 15)
        return false;
      v = v * 16 + d;
    }
    out[i] = (uint8_t)v;
  }
  return true;
}

static bool token_matches(const uint8_t a[16], const char *hex) {
  uint8_t b[16];
  return hex_decode16(hex, b) && CRYPTO_memcmp(a, b, 16) == 0; /* constant time */
}

static cph_key inbox_key(const char *session, uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, id);
  return k;
}

static lease *lease_find(cph_turns *tu, uint64_t turn_id) {
  char key[24];
  snprintf(key, sizeof key, "%llu", (unsigned long long)turn_id);
  return cph_hmap_get(&tu->leases, key);
}

static int inbox_index(const csession *s, uint64_t id) {
  for (uint32_t i = 0; i < s->n_inbox; i++)
    if (s->inbox[i].id == id)
      return (int)i;
  return -1;
}

static int put_inbox_status(cph_txn *t, const csession *s, const inbox_item *it, uint8_t status,
                            uint64_t turn_id) {
  cph_inbox_rec r = {s->id,         it->id,  it->event_id, status,
                     it->mentioned, turn_id, it->attempts, it->created_ms};
  cph_key k = inbox_key(s->id, it->id);
  return cph_txn_put_record(t, CPH_DB_INBOX, &k, &cph_inbox_desc, &r);
}

static char *dup_or_empty(const char *s) { return strdup(s ? s : ""); }

/* ---------------------------------------------------------------- building a turn */

static int staged_order(const void *a, const void *b) {
  const inbox_item *x = *(inbox_item *const *)a, *y = *(inbox_item *const *)b;
  if (x->mentioned != y->mentioned)
    return x->mentioned ? -1 : 1; /* mentions first (§4) */
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Cluster mode: a node's inbox gets a copy of a message said elsewhere when the log delivers
 * it, after messages said later may have arrived (server/clusterflow.h 3.), so a turn's staged
 * messages go by the time each was accepted (every copy carries it), then by event id — as
 * the channel's history does (core/context.c, entries_sort). Mentions still come first (§4). */
static int staged_said_order(const void *a, const void *b) {
  const cph_staged_msg *x = a, *y = b;
  if (x->mentioned != y->mentioned)
    return x->mentioned ? -1 : 1;
  if (x->ts_ms != y->ts_ms)
    return x->ts_ms < y->ts_ms ? -1 : 1;
  return x->event_id < y->event_id ? -1 : x->event_id > y->event_id;
}

#define FOLD_READ_MAX 64  /* events of a folded entry read for its distinct texts */
#define FOLD_TEXTS_MAX 16 /* distinct texts shown for one folded entry */

typedef struct fold_text {
  char *sender;
  char *body;
  uint32_t count;
} fold_text;

/* The distinct (sender, text) pairs of a folded entry's events, read from at most
 * FOLD_READ_MAX of them (its first and newest halves), into the entry's body:
 *   one text:  "<text> (×N, last HH:MM)"
 *   several:   "N messages, HH:MM–HH:MM:" (overflow: "N older messages folded by the queue
 *              cap, HH:MM–HH:MM:") then one line per text "- sender: text (×k)", and a last
 *              line saying how many events are not shown when the entry holds more. */
static int fold_describe(cph_txn *t, const uint64_t *ids, size_t n_ids, const inbox_item *it,
                         cph_staged_msg *m) {
  fold_text texts[FOLD_TEXTS_MAX];
  size_t n_texts = 0, read = 0, shown = 0, removed = 0;
  int rc = CPH_OK;
  for (size_t k = 0; k < n_ids && read < FOLD_READ_MAX && rc == CPH_OK; k++) {
    size_t j = k < FOLD_READ_MAX / 2 || n_ids <= FOLD_READ_MAX ? k
               : k < FOLD_READ_MAX                             ? n_ids - (FOLD_READ_MAX - k)
                                                               : n_ids;
    if (j >= n_ids)
      break;
    cph_key ek = cph_key_of_u64(ids[j]);
    cph_event_rec ev;
    int grc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
    if (grc == CPH_ENOTFOUND)
      continue; /* retention deleted it: still counted in `count` */
    if (grc) {
      rc = grc;
      break;
    }
    read++;
    if (!ev.body && it->fold == INBOX_FOLD_REPEAT) {
      cph_record_free(&cph_event_desc, &ev);
      removed++; /* an exact repeat whose payload step 5 dropped: the family's text */
      continue;
    }
    const char *body = ev.body ? ev.body : "(payload removed)";
    size_t at = 0;
    while (at < n_texts && (strcmp(texts[at].body, body) || strcmp(texts[at].sender, ev.sender)))
      at++;
    if (at < n_texts) {
      texts[at].count++;
      shown++;
    } else if (n_texts < FOLD_TEXTS_MAX) {
      texts[n_texts].sender = strdup(ev.sender);
      texts[n_texts].body = strdup(body);
      texts[n_texts].count = 1;
      if (!texts[n_texts].sender || !texts[n_texts].body) {
        free(texts[n_texts].sender);
        free(texts[n_texts].body);
        rc = CPH_ENOMEM;
      } else {
        n_texts++;
        shown++;
      }
    }
    cph_record_free(&cph_event_desc, &ev);
  }
  char first[8], last[8];
  cph_hhmm_utc(m->ts_ms, first);
  cph_hhmm_utc(it->last_ms, last);
  cph_buf b = CPH_BUF_INIT;
  if (rc == CPH_OK) {
    bool one = n_texts == 1 && read == n_ids;
    bool same = n_texts == 1 && !one; /* sampled (or payloads removed), all read said the same */
    shown += removed;
    if (n_texts == 0) {
      cph_buf_printf(&b, "(%u messages whose payloads were removed, %s–%s)", it->count, first,
                     last);
    } else if (one || (same && it->fold == INBOX_FOLD_REPEAT)) {
      cph_buf_printf(&b, "%s (×%u, last %s)", texts[0].body, it->count, last);
    } else {
      if (it->fold == INBOX_FOLD_OVERFLOW)
        cph_buf_printf(&b, "%u older messages folded by the queue cap, %s–%s:", it->count, first,
                       last);
      else
        cph_buf_printf(&b, "%u messages, %s–%s:", it->count, first, last);
      for (size_t k = 0; k < n_texts; k++) {
        cph_buf_printf(&b, "\n- %s: %s", texts[k].sender, texts[k].body);
        if (texts[k].count > 1)
          cph_buf_printf(&b, " (×%u)", texts[k].count);
      }
      if (shown < it->count)
        cph_buf_printf(&b, "\n- … and %u more not shown", (unsigned)(it->count - shown));
    }
  }
  for (size_t k = 0; k < n_texts; k++) {
    free(texts[k].sender);
    free(texts[k].body);
  }
  if (rc == CPH_OK) {
    free(m->body);
    m->body = cph_buf_steal(&b);
    if (!m->body)
      rc = CPH_ENOMEM;
  }
  cph_buf_free(&b);
  return rc;
}

/* One staged entry of a turn: its first event, and for a folded entry every event id and the
 * body that shows them counted (fold_describe). */
static int staged_fill(cph_txn *t, const csession *s, const inbox_item *it, cph_staged_msg *m) {
  cph_key ek = cph_key_of_u64(it->event_id);
  cph_event_rec ev;
  int rc = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
  if (rc)
    return rc;
  m->id = it->id;
  m->event_id = ev.id;
  m->channel = strdup(ev.channel);
  m->sender = strdup(ev.sender);
  m->body = dup_or_empty(ev.body);
  m->mentioned = it->mentioned;
  m->ts_ms = ev.ts_ms;
  m->count = it->count;
  m->last_ms = it->last_ms;
  m->fold = inbox_fold_name(it->fold);
  cph_record_free(&cph_event_desc, &ev);
  if (!m->channel || !m->sender || !m->body)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK)
    rc = inbox_fold_events(t, s->id, it, &m->event_ids, &m->n_event_ids);
  if (rc == CPH_OK && it->count > 1)
    rc = fold_describe(t, m->event_ids, m->n_event_ids, it, m);
  if (rc) {
    free(m->channel);
    free(m->sender);
    free(m->body);
    free(m->event_ids);
    memset(m, 0, sizeof *m);
  }
  return rc;
}

/* An inbox turn's `input` on the wire: this marker, then the staged bodies (DESIGN §4). */
#define INBOX_INPUT_MARK "inbox:"

/* What a completed turn's input leaves in the session's tree as its user core (DESIGN §6):
 * the words, without the wire's "inbox:" marker; any other input as it is ("autonomy_tick"). */
static const char *input_core_text(const cph_turn_rec *tr) {
  const char *in = tr->input ? tr->input : "";
  size_t mark = sizeof INBOX_INPUT_MARK - 1;
  if (tr->kind == CPH_TURN_INBOX && strncmp(in, INBOX_INPUT_MARK, mark) == 0)
    return in + mark;
  return in;
}

/* Fills ti from the session record, the staged items and the scheduler; reads (and counts
 * memory accesses) through t. The sections and messages are core/context.c's. */
static int build_turn(cph_turns *tu, cph_txn *t, csession *s, inbox_item **items, size_t n,
                      bool report, cph_turn_info *ti, context_tree *tree) {
  cph_session_rec rec;
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, s->id);
  int rc = cph_txn_get_record(t, CPH_DB_SESSIONS, &sk, &cph_session_desc, &rec);
  if (rc)
    return rc;
  ti->session = strdup(s->id);
  ti->lane = s->lane;
  /* A maintenance session with queued jobs runs a job (start_turn's job_turn); knowing it
   * here spares a job turn the conversation and memory (and their access counts). */
  ti->kind = report                                             ? CPH_KIND_REPORT
             : n                                                ? CPH_KIND_INBOX
             : s->n_jobs > 0 && s->lane == CPH_LANE_MAINTENANCE ? CPH_KIND_JOB
                                                                : CPH_KIND_AUTONOMY_TICK;
  ti->episode = s->episode;
  ti->staged = calloc(n ? n : 1, sizeof *ti->staged);
  for (size_t i = 0; i < n && ti->staged && rc == CPH_OK; i++)
    if ((rc = staged_fill(t, s, items[i], &ti->staged[ti->n_staged])) == CPH_OK)
      ti->n_staged++;
  const cph_policy *p = tu->env->policy;
  if (p->cluster_enabled && p->cluster.nats_count) /* the log's copies arrive late: by time */
    qsort(ti->staged, ti->n_staged, sizeof *ti->staged, staged_said_order);
  cph_buf input = CPH_BUF_INIT;
  cph_buf_puts(&input, n ? INBOX_INPUT_MARK : "autonomy_tick");
  for (size_t i = 0; i < ti->n_staged; i++) {
    if (i)
      cph_buf_putc(&input, '\n');
    cph_buf_puts(&input, ti->staged[i].body);
  }
  if (report && rc == CPH_OK) { /* what arrived, per channel and family (reports.h) */
    cph_buf_free(&input);
    ti->input = reports_input(ti->staged, ti->n_staged);
  } else {
    ti->input = cph_buf_steal(&input);
  }
  if (!ti->input && rc == CPH_OK)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK)
    rc = context_assemble(tu->context, t, s, &rec, ti, tree);
  cph_record_free(&cph_session_desc, &rec);
  return rc;
}

/* Starts a turn for the picked session and hands it to waiter w. false: could not (the pick
 * is undone and the waiter keeps waiting). */
static bool start_turn(cph_turns *tu, cph_op *w, const cph_pick *pick) {
  csession *s =
      pick->sid < sessions_sid_cap(tu->sessions) ? sessions_at(tu->sessions, pick->sid) : NULL;
  if (!s) {
    cph_sched_finish(tu->env->sched, pick->sid, 0, false);
    return false;
  }
  size_t max_batch = (size_t)tu->env->policy->sessions.max_batch;
  inbox_item **items = calloc(s->n_inbox ? s->n_inbox : 1, sizeof *items);
  if (!items) {
    cph_sched_finish(tu->env->sched, pick->sid, 0, false);
    return false;
  }
  size_t n = 0;
  bool job_turn = s->n_jobs > 0 && (s->lane == CPH_LANE_MAINTENANCE || pick->trickle);
  for (uint32_t i = 0; i < s->n_inbox && !job_turn; i++)
    if (s->inbox[i].status == CPH_INBOX_STAGED)
      items[n++] = &s->inbox[i];
  /* A reporter's held input waits for its report unless something names it (reports.h). */
  bool unheld = s->reports && reports_has_unheld(s);
  if (s->reports && !unheld && !s->report_due)
    n = 0;
  bool report_turn = s->reports && n > 0 && !unheld;
  qsort(items, n, sizeof *items, staged_order);
  if (n > max_batch)
    n = max_batch;
  if (n == 0 && !s->tick_due && !job_turn) {
    free(items);
    cph_sched_finish(tu->env->sched, pick->sid, 0, false);
    sessions_update_work(tu->sessions, s);
    return false;
  }

  cph_turn_info *ti = &w->u.lease.turn;
  memset(ti, 0, sizeof *ti);
  ti->omit = w->u.lease.omit; /* context assembly skips what is left out */
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  uint64_t turn_id = 0;
  cph_txn_next_id(&t, "turn", &turn_id);
  /* The tree the context is rendered from, kept with it too: loaded and ordered once. */
  context_tree tree = {0};
  int rc = build_turn(tu, &t, s, items, n, report_turn, ti, &tree);
  uint64_t job_id = 0;
  cph_job_work *work = NULL;
  if (rc == CPH_OK && job_turn) {
    rc = maint_job_start(tu->maint, &t, s, pick->trickle, turn_id, &work, &job_id);
    ti->kind = CPH_KIND_JOB;
    free(ti->input);
    ti->input = strdup(work ? cph_job_kind_name(work->kind) : "job");
  }
  uint8_t token[16];
  if (RAND_bytes(token, sizeof token) != 1)
    rc = rc ? rc : CPH_EIO;
  int64_t now_ns = env_now(tu->env);
  int64_t ttl_ns = tu->env->policy->leases.ttl_seconds * CPH_NS_PER_S;
  uint32_t attempts = 0;
  uint64_t *ids = calloc(n ? n : 1, sizeof *ids);
  for (size_t i = 0; i < n && ids; i++) {
    ids[i] = items[i]->id;
    if (items[i]->attempts > attempts)
      attempts = items[i]->attempts;
  }
  if (rc == CPH_OK && ids) {
    cph_turn_rec tr = {0};
    tr.id = turn_id;
    tr.session = s->id;
    tr.lane = (uint8_t)s->lane;
    tr.kind = job_turn      ? CPH_TURN_JOB
              : report_turn ? CPH_TURN_REPORT
              : n           ? CPH_TURN_INBOX
                            : CPH_TURN_AUTONOMY_TICK;
    tr.job_id = job_id;
    tr.state = CPH_TURN_LEASED;
    memcpy(tr.lease, token, sizeof token);
    tr.worker = w->u.lease.worker;
    tr.inbox_seqs = ids;
    tr.n_inbox_seqs = (uint32_t)n;
    tr.episode = s->episode;
    tr.attempts = attempts + 1;
    tr.input = ti->input;
    tr.created_ms = cph_wall_ms();
    tr.deadline_ms = tr.created_ms + ttl_ns / CPH_NS_PER_MS;
    cph_key tk = cph_key_of_u64(turn_id);
    cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    cph_txn_put(&t, CPH_DB_ACTIVE_TURNS, &tk, "", 0);
    ti->deadline_ms = tr.deadline_ms;
    /* The context explorer's record comes last: the lease's own writes take the room first,
     * so a nearly full map loses the optional record (turnlog_keep's nested txn), not the
     * lease. Deferred, it is worked out beside the loop and written before the answer. */
    if (w->u.lease.defer_keep)
      w->u.lease.keep = turnlog_keep_begin(tu->turnlog, tu->context, &t, turn_id, ti, &tree);
    else
      turnlog_keep(tu->turnlog, &t, turn_id, ti, &tree);
  }
  context_tree_release(tu->context, s->id, &tree);
  lease *l = calloc(1, sizeof *l);
  char key[24];
  snprintf(key, sizeof key, "%llu", (unsigned long long)turn_id);
  char *key_copy = strdup(key);
  if (rc || !ids || !l || !key_copy || cph_txn_commit(&t) != CPH_OK ||
      cph_hmap_put(&tu->leases, key_copy, l) != CPH_OK) {
    if (t.mdb)
      cph_txn_abort(&t);
    cph_log(CPH_LOG_WARN, "could not start a turn for '%s': %s", s->id,
            t.err.msg[0] ? t.err.msg : cph_strerror(rc ? rc : CPH_ENOMEM));
    free(ids);
    free(l);
    free(key_copy);
    free(items);
    if (w->u.lease.keep) { /* before the turn info it reads */
      turnlog_keep_abandon(w->u.lease.keep);
      w->u.lease.keep = NULL;
    }
    cph_turn_info_free(ti);
    cph_job_work_free(work);
    maint_pending_drop(tu->maint);
    cph_sched_finish(tu->env->sched, pick->sid, 0, false);
    return false;
  }
  /* Its memories count as accessed (DESIGN §7) now that the lease is in (memaccess.h). */
  int64_t now_ms = cph_wall_ms();
  for (size_t i = 0; i < ti->n_memories; i++)
    if (memaccess_note(&tu->memory->access, ti->memories[i].id, now_ms) != CPH_OK)
      cph_log(CPH_LOG_WARN, "turn %llu: out of memory counting an access to memory %llu",
              (unsigned long long)turn_id, (unsigned long long)ti->memories[i].id);
  l->turn_id = turn_id;
  l->session = s;
  for (uint32_t i = 0; i < s->n_inbox; i++) /* ids ascend, bar requeued entries: take the max */
    if (s->inbox[i].id > l->watermark)
      l->watermark = s->inbox[i].id;
  ti->while_running = sessions_while_running(tu->sessions, s);
  memcpy(l->token, token, sizeof token);
  l->deadline_ns = now_ns + ttl_ns;
  l->kind = ti->kind;
  l->inbox_ids = ids;
  l->n_inbox_ids = n;
  l->key = key_copy;
  l->job_id = job_id;
  if (context_views_copy(&l->views, ti) != CPH_OK) /* the cursors then stay where they are */
    cph_log(CPH_LOG_WARN, "turn %llu of '%s': out of memory for its channel views",
            (unsigned long long)turn_id, s->id);
  if (job_turn) {
    maint_job_started(tu->maint, s, job_id);
    ti->job = work;
  }
  for (size_t i = 0; i < n; i++)
    items[i]->turn_id = turn_id;
  free(items);
  s->running_turn = turn_id;
  if (!n && !job_turn)
    s->tick_due = false; /* this tick is being served; the next is armed at completion */
  ti->id = turn_id;
  hex_encode(token, sizeof token, ti->lease);
  ti->attempts = attempts + 1;
  return true;
}

/* agent_turn (§3.6 job 0): each waiting worker, oldest first, gets the scheduler's pick among
 * the lanes it accepts. */
uint32_t turns_serve_waiters(cph_turns *tu) {
  uint32_t started = 0;
  for (size_t i = 0; tu->waiters.len && i < tu->waiters.len;) {
    if (cph_sched_running(tu->env->sched) >= cph_sched_concurrency(tu->env->sched))
      break;
    cph_op *w = op_queue_at(&tu->waiters, i);
    /* Jobs are cephalond's own work: its maintenance workers take the maintenance lane and
     * nothing else; external workers never get it. */
    unsigned mask = w->u.lease.internal ? 1u << CPH_LANE_MAINTENANCE
                    : w->u.lease.lanes  ? w->u.lease.lanes & ~(1u << CPH_LANE_MAINTENANCE)
                                        : CPH_LANES_ALL & ~(1u << CPH_LANE_MAINTENANCE);
    cph_pick pick;
    if (cph_sched_pick_lanes(tu->env->sched, mask, &pick) != CPH_OK) {
      i++;
      continue;
    }
    if (!start_turn(tu, w, &pick)) {
      i++; /* the session went back to the scheduler; a retry now would pick it again */
      continue;
    }
    metrics_turn_started(tu->metrics, pick.lane, pick.waited_ns, &w->u.lease.turn);
    op_queue_remove(&tu->waiters, w);
    w->rc = CPH_OK;
    waiter_done(tu, w);
    started++;
  }
  return started;
}

/* ---------------------------------------------------------------- ending a lease */

/* Appends the element at e, of `size` bytes (taken: the caller clears it), to q. CPH_ENOMEM
 * leaves q as it was. */
static int note_push(turns_notes *q, size_t size, const void *e) {
  if (q->n == q->cap) {
    size_t cap = q->cap ? 2 * q->cap : 8;
    void *v = realloc(q->v, cap * size);
    if (!v)
      return CPH_ENOMEM;
    q->v = v;
    q->cap = cap;
  }
  memcpy((char *)q->v + q->n * size, e, size);
  q->n++;
  return CPH_OK;
}

/* Hands q's committed elements (of `size` bytes) over: a malloc'd copy of them, *k of them
 * (NULL and 0 when none; NULL and CPH_ENOMEM in *rc when out of memory: they stay); the rest
 * move up. */
static void *note_take(turns_notes *q, size_t size, size_t *k, int *rc) {
  *rc = CPH_OK;
  *k = 0;
  if (!q->committed)
    return NULL;
  void *out = malloc(q->committed * size);
  if (!out) {
    *rc = CPH_ENOMEM;
    return NULL;
  }
  *k = q->committed;
  memcpy(out, q->v, *k * size);
  memmove(q->v, (char *)q->v + *k * size, (q->n - *k) * size);
  q->n -= *k;
  q->committed = 0;
  return out;
}

/* The bytes of si's items' data. */
static size_t items_bytes(const cph_session_items *si) {
  size_t bytes = 0;
  for (size_t i = 0; i < si->items.n; i++)
    bytes += si->items.v[i].len;
  return bytes;
}

/* Frees the park notes beyond the first keep_parks and the ended items beyond the first
 * keep_ended. */
static void notes_drop(cph_turns *tu, size_t keep_parks, size_t keep_ended) {
  cph_park_note *parks = tu->parks.v;
  cph_session_items *ended = tu->ended.v;
  while (tu->parks.n > keep_parks)
    cph_park_note_free(&parks[--tu->parks.n]);
  while (tu->ended.n > keep_ended) {
    tu->ended_bytes -= items_bytes(&ended[--tu->ended.n]);
    cph_session_items_free(&ended[tu->ended.n]);
  }
}

/* Appends note (taken) to the expiries' park notes (cph_engine_take_parks). */
static int park_noted(cph_turns *tu, cph_park_note *note) {
  int rc = note_push(&tu->parks, sizeof *note, note);
  if (rc == CPH_OK)
    *note = (cph_park_note){0};
  return rc;
}

/* Cluster mode: the items of turn turn_id of s, which has just ended (a fail, an expiry, a
 * supersede) — its record, the session's newest ended, and with `kept` its kept context —
 * appended to items, read in the pass that ended it. CPH_OK or the store's error. */
static int ended_items(cph_turns *tu, const csession *s, uint64_t turn_id, bool kept,
                       cph_state_items *items) {
  cph_handover st = {tu->env, tu->sessions, tu->trees, tu->memory, tu->turnlog};
  int rc = handover_turn_items(&st, s->id, true, items);
  if (rc == CPH_OK && kept)
    rc = handover_kept_item(&st, s->id, turn_id, items);
  return rc;
}

/* Cluster mode: turn turn_id of s ended with no operation to carry its items (an expiry, a
 * supersede) — they join the ended turns' items (cph_engine_take_ended_items). Failing that,
 * logged: the session's next state carries the record (not the kept context). */
static void ended_noted(cph_turns *tu, const csession *s, uint64_t turn_id) {
  cph_session_items si = {0};
  bool kept = tu->ended_bytes < TURNS_ENDED_BYTES_MAX;
  tu->ended_kept_skipped += !kept;
  int rc = (si.session = strdup(s->id)) ? ended_items(tu, s, turn_id, kept, &si.items)
                                         : CPH_ENOMEM;
  size_t bytes = items_bytes(&si);
  if (rc == CPH_OK && si.items.n && (rc = note_push(&tu->ended, sizeof si, &si)) == CPH_OK) {
    tu->ended_bytes += bytes; /* taken */
    return;
  }
  if (rc)
    cph_log(CPH_LOG_WARN, "reading the record and kept context of turn %llu of '%s' for the "
            "cluster log: %s (the session's next state carries the record)",
            (unsigned long long)turn_id, s->id, cph_strerror(rc));
  cph_session_items_free(&si);
}

void turns_notes_pass_end(cph_turns *tu, bool committed) {
  if (committed) {
    tu->parks.committed = tu->parks.n;
    tu->ended.committed = tu->ended.n;
  } else {
    notes_drop(tu, tu->parks.committed, tu->ended.committed);
  }
  if (tu->ended_kept_skipped && committed)
    cph_log(CPH_LOG_WARN, "%zu turns ended with no request while over %zu MiB of ended turns' "
            "items waited for the cluster log: their records go, their kept contexts do not "
            "(a node that takes their sessions over lacks them in its explorer)",
            tu->ended_kept_skipped, TURNS_ENDED_BYTES_MAX >> 20);
  tu->ended_kept_skipped = 0;
}

int turns_take_parks(cph_turns *tu, cph_park_note **out, size_t *n) {
  int rc;
  *out = note_take(&tu->parks, sizeof **out, n, &rc);
  return rc;
}

int turns_take_ended_items(cph_turns *tu, cph_session_items **out, size_t *n) {
  int rc;
  *out = note_take(&tu->ended, sizeof **out, n, &rc);
  for (size_t i = 0; i < *n; i++)
    tu->ended_bytes -= items_bytes(&(*out)[i]);
  return rc;
}

/* Ends lease l without completing it (worker failure or expiry): the carried messages stay
 * staged with one more attempt; when an item reaches :max-attempts the turn is parked with
 * its messages. A superseded lease (state CPH_TURN_SUPERSEDED, while_running :restart), or one
 * handed back because another node serves the session (!count), was not the worker's
 * failure: its messages stay staged with their attempts as they were, and it is never parked.
 * Cluster mode (report_consumed): a turn parked is named, with the keys of its events, in
 * *note when given (a fail's op), else in the expiries' park notes — for the cluster log's
 * park mark (server/clusterflow.h 6.). Listing its keys failed: no note (logged; a node that
 * takes the session over then delivers its input again, as before park marks). */
static int end_lease(cph_turns *tu, lease *l, uint8_t state, const char *error, bool count,
                     cph_park_note *note) {
  csession *s = l->session;
  uint32_t max_attempts = (uint32_t)tu->env->policy->leases.max_attempts;
  uint32_t attempt = state == CPH_TURN_SUPERSEDED || !count ? 0 : 1;
  bool park = false;
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  for (size_t i = 0; i < l->n_inbox_ids && attempt; i++) {
    int idx = inbox_index(s, l->inbox_ids[i]);
    if (idx < 0)
      continue;
    inbox_item it = s->inbox[idx];
    it.attempts++;
    if (it.attempts >= max_attempts)
      park = true;
  }
  cph_park_note pn = {0};
  bool noting = park && tu->env->report_consumed;
  int krc = CPH_OK;
  for (size_t i = 0; noting && krc == CPH_OK && i < l->n_inbox_ids; i++) {
    int idx = inbox_index(s, l->inbox_ids[i]);
    if (idx >= 0)
      krc = inbox_event_keys(&t, s->id, &s->inbox[idx], &pn.keys);
  }
  for (size_t i = 0; i < l->n_inbox_ids; i++) {
    int idx = inbox_index(s, l->inbox_ids[i]);
    if (idx < 0)
      continue;
    inbox_item it = s->inbox[idx];
    it.attempts += attempt;
    put_inbox_status(&t, s, &it, park ? CPH_INBOX_PARKED : CPH_INBOX_STAGED, park ? l->turn_id : 0);
  }
  cph_key tk = cph_key_of_u64(l->turn_id);
  cph_turn_rec tr;
  if (cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr) == CPH_OK) {
    pn.attempts = tr.attempts;
    tr.state = park ? CPH_TURN_PARKED : state;
    char *old_error = tr.error;
    tr.error = (char *)error;
    tr.completed_ms = cph_wall_ms();
    cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    /* history: the session's turn list shows it, however it ended — its place there is the
     * slot its kept context moves in (handover.h), and every leased turn has one */
    turnrecs_ended(&t, &tr);
    tr.error = old_error;
    cph_record_free(&cph_turn_desc, &tr);
  }
  cph_txn_del(&t, CPH_DB_ACTIVE_TURNS, &tk);
  if (park)
    cph_txn_put(&t, CPH_DB_PARKED_TURNS, &tk, "", 0);
  bool job_failed = false;
  if (l->job_id)
    maint_job_retry(tu->maint, &t, s, l->job_id, error, &job_failed);
  int rc = cph_txn_commit(&t);
  if (rc) {
    cph_park_note_free(&pn);
    return rc;
  }
  if (park)
    parked_count_add(tu, s->id, 1);
  if (noting) {
    bool ok = krc == CPH_OK && (pn.session = strdup(s->id)) != NULL &&
              (pn.error = strdup(error ? error : "")) != NULL;
    if (ok) {
      pn.turn_id = l->turn_id;
      if (note) {
        *note = pn;
        pn = (cph_park_note){0};
      } else {
        ok = park_noted(tu, &pn) == CPH_OK; /* taken: pn is left empty */
      }
    }
    if (!ok)
      cph_log(CPH_LOG_WARN, "turn %llu of '%s' parked, but listing its events for the cluster "
              "log failed (%s): a node that takes the session over delivers its input again",
              (unsigned long long)l->turn_id, s->id, cph_strerror(krc ? krc : CPH_ENOMEM));
    cph_park_note_free(&pn);
  }
  if (state != CPH_TURN_SUPERSEDED) /* neither failed nor expired: revoked for newer input */
    metrics_turn_ended(tu->metrics, s->lane, state == CPH_TURN_EXPIRED);
  if (l->job_id) {
    s->running_job = 0;
    if (job_failed)
      maint_job_finished(tu->maint, s, l->job_id); /* out of attempts: the job leaves the queue */
  }
  for (size_t i = 0; i < l->n_inbox_ids; i++) {
    int idx = inbox_index(s, l->inbox_ids[i]);
    if (idx < 0)
      continue;
    s->inbox[idx].attempts += attempt;
    s->inbox[idx].turn_id = 0;
    if (park)
      csession_inbox_remove(s, (uint32_t)idx);
  }
  s->running_turn = 0;
  cph_sched_finish(tu->env->sched, s->sid, 0, false);
  if (l->kind == CPH_KIND_AUTONOMY_TICK)
    sessions_tick_schedule(tu->sessions, s);
  sessions_update_work(tu->sessions, s);
  if (park)
    cph_log(CPH_LOG_WARN, "turn %llu of '%s' parked after %u attempts: %s",
            (unsigned long long)l->turn_id, s->id, max_attempts, error);
  if (!note && tu->env->report_consumed && !l->job_id) /* no op carries its items (a fail's) */
    ended_noted(tu, s, l->turn_id);
  lease_free(cph_hmap_del(&tu->leases, l->key));
  return CPH_OK;
}

/* ---------------------------------------------------------------- operations */

/* The entries that arrived for l's session since it was leased and are in no turn: staged,
 * or pending until this pass's poll_inbox stages them (ingest wrote them staged already).
 * Returns how many; fills items[0..max) with the staged ones when items is given. O(inbox). */
static size_t arrivals(const lease *l, inbox_item **items, size_t max) {
  const csession *s = l->session;
  size_t n = 0;
  for (uint32_t i = 0; i < s->n_inbox; i++) {
    inbox_item *it = &s->inbox[i];
    if (it->turn_id || it->id <= l->watermark)
      continue;
    if (!items) {
      n += it->status == CPH_INBOX_STAGED || it->status == CPH_INBOX_PENDING;
    } else if (it->status == CPH_INBOX_STAGED && n < max) {
      items[n++] = it;
    }
  }
  return n;
}

/* The lease the op names: CPH_OK with *out, or the op's error already set. */
static int check_lease(cph_turns *tu, cph_op *op, lease **out) {
  lease *l = lease_find(tu, op->u.turn.turn_id);
  if (l) {
    if (!token_matches(l->token, op->u.turn.lease))
      return op_fail(op, CPH_ECONFLICT, "lease", "lease does not match turn %llu",
                     (unsigned long long)op->u.turn.turn_id);
    *out = l;
    return CPH_OK;
  }
  /* Not active: find out why, so the worker gets the right answer. */
  cph_key tk = cph_key_of_u64(op->u.turn.turn_id);
  cph_turn_rec tr;
  int rc = cph_txn_get_record(&tu->env->txn, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  if (rc == CPH_ENOTFOUND)
    return op_fail(op, CPH_ENOTFOUND, "id", "no turn %llu", (unsigned long long)op->u.turn.turn_id);
  if (rc)
    return op_fail(op, rc, NULL, "%s", tu->env->txn.err.msg);
  if (tr.origin) { /* history another node made (core/turnrecs.h): no lease of it is live */
    op_fail(op, CPH_ECONFLICT, "lease",
            "turn %llu is the record of turn %s, carried here with its session's state: it "
            "ended there and is never leased, heartbeated or completed again",
            (unsigned long long)op->u.turn.turn_id, tr.origin);
    cph_record_free(&cph_turn_desc, &tr);
    return op->rc;
  }
  bool same = token_matches(tr.lease, op->u.turn.lease);
  uint8_t state = tr.state;
  cph_record_free(&cph_turn_desc, &tr);
  if (!same)
    return op_fail(op, CPH_ECONFLICT, "lease", "lease does not match turn %llu",
                   (unsigned long long)op->u.turn.turn_id);
  if (state == CPH_TURN_COMPLETED && op->kind == CPH_OP_COMPLETE) {
    op->u.turn.already = true; /* complete is idempotent for the same lease */
    return CPH_ENOTFOUND;
  }
  if (state == CPH_TURN_SUPERSEDED)
    return op_fail(op, CPH_ESUPERSEDED, "lease",
                   "turn %llu was superseded: input arrived while it ran and its session's "
                   "while_running is restart; its input is leased again as a new turn (what "
                   "this lease did is not undone, and nothing of it is recorded)",
                   (unsigned long long)op->u.turn.turn_id);
  return op_fail(op, CPH_ECONFLICT, "lease", "the lease of turn %llu has ended (%s)",
                 (unsigned long long)op->u.turn.turn_id,
                 state == CPH_TURN_COMPLETED ? "completed"
                 : state == CPH_TURN_PARKED  ? "parked"
                                             : "expired or failed");
}

static void turn_heartbeat(cph_turns *tu, cph_op *op) {
  lease *l = NULL;
  if (check_lease(tu, op, &l))
    return;
  int64_t ttl_ms = tu->env->policy->leases.ttl_seconds * 1000;
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  cph_key tk = cph_key_of_u64(l->turn_id);
  cph_turn_rec tr;
  if (cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr) == CPH_OK) {
    tr.deadline_ms = cph_wall_ms() + ttl_ms;
    op->u.turn.deadline_ms = tr.deadline_ms;
    cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    cph_record_free(&cph_turn_desc, &tr);
  }
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
  l->deadline_ns = env_now(tu->env) + ttl_ms * CPH_NS_PER_MS;
  /* What arrived since the lease (DESIGN §4): counted under :merge (the worker may take it)
   * and :interrupt (the first arrival asks the worker to stop; the answer says so from then
   * on, whatever the mode becomes). */
  op->u.turn.while_running = sessions_while_running(tu->sessions, l->session);
  op->u.turn.arrived = arrivals(l, NULL, 0);
  if (op->u.turn.while_running == CPH_POLICY_WR_INTERRUPT && op->u.turn.arrived && !l->job_id)
    l->interrupt_asked = true;
  op->u.turn.interrupt = l->interrupt_asked;
}

/* POST /v1/turns/{id}/take (while_running :merge, DESIGN §4): the entries staged for the
 * session since the lease (mentions first, then oldest; at most :max-batch) move into the
 * running turn — its lease's inbox_ids, its record's inbox_seqs and input — so its
 * completion consumes them and its reply lists them as sources; a failed or expired turn
 * leaves them staged with the rest. The answer is those entries, as a lease's staged. */
static void turn_take(cph_turns *tu, cph_op *op) {
  lease *l = NULL;
  if (check_lease(tu, op, &l))
    return;
  csession *s = l->session;
  cph_policy_while_running mode = sessions_while_running(tu->sessions, s);
  if (mode != CPH_POLICY_WR_MERGE || l->job_id) {
    op_fail(op, CPH_ECONFLICT, "while_running",
            "turn %llu cannot take arrivals: its session's while_running is %s, not merge",
            (unsigned long long)l->turn_id,
            l->job_id ? "(a job turn)" : cph_policy_while_running_name(mode));
    return;
  }
  size_t max = (size_t)tu->env->policy->sessions.max_batch;
  inbox_item **items = calloc(max, sizeof *items);
  size_t n = items ? arrivals(l, items, max) : 0;
  if (!items) {
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  op->u.turn.n_taken = 0;
  op->u.turn.taken = calloc(n ? n : 1, sizeof *op->u.turn.taken);
  uint64_t *ids = realloc(l->inbox_ids, (l->n_inbox_ids + n + 1) * sizeof *ids);
  if (!op->u.turn.taken || !ids) {
    free(items);
    if (ids)
      l->inbox_ids = ids;
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  l->inbox_ids = ids;
  qsort(items, n, sizeof *items, staged_order);
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  cph_key tk = cph_key_of_u64(l->turn_id);
  cph_turn_rec tr;
  int rc = cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  bool have_tr = rc == CPH_OK;
  cph_buf input = CPH_BUF_INIT;
  for (size_t i = 0; i < n && rc == CPH_OK; i++) {
    rc = staged_fill(&t, s, items[i], &op->u.turn.taken[i]);
    if (rc == CPH_OK)
      op->u.turn.n_taken++;
  }
  uint64_t *seqs = NULL;
  if (rc == CPH_OK && n) {
    /* The record shows the turn as it now is: its entries and its input (the user core its
     * completion leaves in the tree) with the taken bodies after a newline each. */
    seqs = malloc((tr.n_inbox_seqs + n) * sizeof *seqs);
    cph_buf_puts(&input, tr.input ? tr.input : "");
    if (tr.kind == CPH_TURN_AUTONOMY_TICK) { /* a tick that takes input becomes an inbox turn */
      cph_buf_reset(&input);
      cph_buf_puts(&input, INBOX_INPUT_MARK);
      tr.kind = CPH_TURN_INBOX;
    }
    for (size_t i = 0; i < n; i++) {
      if (input.len > sizeof INBOX_INPUT_MARK - 1)
        cph_buf_putc(&input, '\n');
      cph_buf_puts(&input, op->u.turn.taken[i].body);
    }
    char *text = cph_buf_steal(&input);
    if (!seqs || !text) {
      free(text);
      rc = CPH_ENOMEM;
    } else {
      memcpy(seqs, tr.inbox_seqs, tr.n_inbox_seqs * sizeof *seqs);
      for (size_t i = 0; i < n; i++)
        seqs[tr.n_inbox_seqs + i] = items[i]->id;
      free(tr.inbox_seqs);
      tr.inbox_seqs = seqs;
      tr.n_inbox_seqs += (uint32_t)n;
      seqs = NULL;
      free(tr.input);
      tr.input = text;
      cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    }
  }
  free(seqs);
  cph_buf_free(&input);
  if (have_tr)
    cph_record_free(&cph_turn_desc, &tr);
  if (rc || cph_txn_commit(&t)) {
    if (t.mdb)
      cph_txn_abort(&t);
    op_fail(op, rc ? rc : t.ret, NULL, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    free(items);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    items[i]->turn_id = l->turn_id;
    l->inbox_ids[l->n_inbox_ids++] = items[i]->id;
  }
  free(items);
}

static void turn_complete_work(cph_turns *tu, cph_op *op);

/* report_consumed (cluster mode): the keys of the events of s's live entries ids[0..n), into
 * op->u.turn.consumed, with the session when there are any. CPH_OK, CPH_ENOMEM or the store's
 * error. */
static int consumed_keys(cph_txn *t, const csession *s, const uint64_t *ids, size_t n, cph_op *op) {
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    int idx = inbox_index(s, ids[i]);
    if (idx >= 0)
      rc = inbox_event_keys(t, s->id, &s->inbox[idx], &op->u.turn.consumed);
  }
  if (rc == CPH_OK && op->u.turn.consumed.count && !(op->u.turn.consumed_session = strdup(s->id)))
    rc = CPH_ENOMEM;
  return rc;
}

/* report_consumed, a completion repeated (`already`): the keys its first completion consumed,
 * from the stored records — only the entries the turn consumed (an interrupted turn consumed
 * none: its entries went back to staged, for a later turn to consume). The op's error on
 * failure. */
static void already_consumed_keys(cph_turns *tu, cph_op *op) {
  cph_txn *t = &tu->env->txn;
  cph_key tk = cph_key_of_u64(op->u.turn.turn_id);
  cph_turn_rec tr;
  int rc = cph_txn_get_record(t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  if (rc) {
    op_fail(op, rc, NULL, "%s", t->err.msg[0] ? t->err.msg : cph_strerror(rc));
    return;
  }
  for (uint32_t i = 0; rc == CPH_OK && i < tr.n_inbox_seqs; i++) {
    cph_key ik = inbox_key(tr.session, tr.inbox_seqs[i]);
    cph_inbox_rec ir;
    int grc = cph_txn_get_record(t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &ir);
    if (grc == CPH_ENOTFOUND)
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    if (ir.status == CPH_INBOX_CONSUMED && ir.turn_id == tr.id) {
      inbox_item it = {0};
      it.id = tr.inbox_seqs[i];
      it.event_id = ir.event_id;
      it.created_ms = ir.created_ms;
      rc = inbox_fold_get(t, tr.session, &it);
      if (rc == CPH_OK)
        rc = inbox_event_keys(t, tr.session, &it, &op->u.turn.consumed);
    }
    cph_record_free(&cph_inbox_desc, &ir);
  }
  if (rc == CPH_OK && op->u.turn.consumed.count &&
      !(op->u.turn.consumed_session = strdup(tr.session)))
    rc = CPH_ENOMEM;
  cph_record_free(&cph_turn_desc, &tr);
  if (rc)
    op_fail(op, rc, NULL, "listing the events turn %llu consumed: %s",
            (unsigned long long)op->u.turn.turn_id, t->err.msg[0] ? t->err.msg : cph_strerror(rc));
}

/* The engine owns a job turn's work from lease to completion, whatever the outcome. */
static void turn_complete(cph_turns *tu, cph_op *op) {
  turn_complete_work(tu, op);
  cph_job_work_free(op->u.turn.job);
  op->u.turn.job = NULL;
}

/* Fills op->u.turn.state for session id, and its items: the turn records (handover.h), the
 * memories minted[0..n_minted) the completion minted, the reply reply_id it wrote to the
 * replies stream (0: none) and turn kept_turn's kept context (0: none); a failure leaves the
 * state NULL and is logged (the completion stands; the cluster log then keeps the session's
 * previous state). */
static void state_to_op(cph_turns *tu, const char *id, const uint64_t *minted, size_t n_minted,
                        uint64_t reply_id, uint64_t kept_turn, cph_op *op) {
  csession *s = id ? sessions_get(tu->sessions, id) : NULL;
  if (!s)
    return;
  cph_buf b = {0};
  cph_handover st = {tu->env, tu->sessions, tu->trees, tu->memory, tu->turnlog};
  int rc = handover_export(&st, s, &b);
  if (rc == CPH_OK && !cph_buf_error(&b) &&
      (op->u.turn.consumed_session || (op->u.turn.consumed_session = strdup(id)))) {
    op->u.turn.state_len = b.len;
    op->u.turn.state = (uint8_t *)cph_buf_steal(&b);
    if ((rc = handover_turn_items(&st, id, false, &op->u.turn.items)) != CPH_OK)
      cph_log(CPH_LOG_WARN, "reading the turn records of session '%s' for the cluster log: %s "
              "(the state carries the newest)", id, cph_strerror(rc));
    if ((rc = handover_memory_items(&st, id, minted, n_minted, &op->u.turn.items)) != CPH_OK)
      cph_log(CPH_LOG_WARN, "reading the memories the completion minted in session '%s' for "
              "the cluster log: %s (the state carries the newest)", id, cph_strerror(rc));
    if ((rc = handover_reply_item(&st, id, reply_id, &op->u.turn.items)) != CPH_OK)
      cph_log(CPH_LOG_WARN, "reading reply %llu of session '%s' for the cluster log: %s (the "
              "state carries the newest)", (unsigned long long)reply_id, id, cph_strerror(rc));
    if (kept_turn && (rc = handover_kept_item(&st, id, kept_turn, &op->u.turn.items)) != CPH_OK)
      cph_log(CPH_LOG_WARN, "reading the kept context of turn %llu of session '%s' for the "
              "cluster log: %s (it does not move with the session)",
              (unsigned long long)kept_turn, id, cph_strerror(rc));
  } else if (rc == CPH_ELIMIT) {
    cph_log(CPH_LOG_WARN, "the state of session '%s' (its context tree) is over %u bytes, the "
            "most the cluster log takes: not put, its previous state stays there", id,
            CPH_HANDOVER_MAX_BYTES);
  } else {
    cph_log(CPH_LOG_WARN, "reading the state of session '%s' for the cluster log: %s", id,
            cph_strerror(rc ? rc : CPH_ENOMEM));
  }
  cph_buf_free(&b);
}

/* The session of a stored turn (malloc'd), or NULL. */
static char *turn_session(cph_turns *tu, uint64_t turn_id) {
  cph_key tk = cph_key_of_u64(turn_id);
  cph_turn_rec tr;
  if (cph_txn_get_record(&tu->env->txn, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr) != CPH_OK)
    return NULL;
  char *id = strdup(tr.session);
  cph_record_free(&cph_turn_desc, &tr);
  return id;
}

static void turn_complete_work(cph_turns *tu, cph_op *op) {
  lease *l = NULL;
  int rc = check_lease(tu, op, &l);
  if (rc) {
    if (op->u.turn.already) {
      op->rc = CPH_OK;
      if (tu->env->report_consumed) {
        already_consumed_keys(tu, op);
        char *id = op->rc == CPH_OK ? turn_session(tu, op->u.turn.turn_id) : NULL;
        state_to_op(tu, id, NULL, 0, 0, 0, op);
        free(id);
      }
    }
    return;
  }
  csession *s = l->session;
  if (op->u.turn.reply_channel && strlen(op->u.turn.reply_channel) > 256) {
    op_fail(op, CPH_EINVAL, "reply.channel", "reply.channel: a channel name is 1 to 256 bytes");
    return;
  }
  /* An interrupted completion (while_running :interrupt, DESIGN §4) records what the turn
   * did — its cost, its reply (the worker's account of the work it did, each tool call with
   * its result), its memories and jobs — but consumes none of its input: the entries it
   * carried go back to staged (attempts unchanged), so the next turn carries them together
   * with what arrived, and each event is consumed once, by that completed turn (§5). So the
   * tree, the episode and the channel cursors stay as they were: the next turn sees the old
   * input as its trigger again, the reply as the session's own message before it. */
  bool interrupted = op->u.turn.interrupted;
  if (interrupted && !l->interrupt_asked) {
    op_fail(op, CPH_ECONFLICT, "interrupted",
            "turn %llu was not asked to interrupt: complete it without interrupted",
            (unsigned long long)l->turn_id);
    return;
  }
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  int64_t now_ms = cph_wall_ms();
  /* The reply goes to its channel, else the channel of the turn's first staged message. */
  char *first_channel = NULL;
  for (size_t i = 0; i < l->n_inbox_ids; i++) {
    int idx = inbox_index(s, l->inbox_ids[i]);
    if (idx < 0)
      continue;
    if (!interrupted) /* an interrupted turn's entries stay staged, as ingest wrote them */
      put_inbox_status(&t, s, &s->inbox[idx], CPH_INBOX_CONSUMED, l->turn_id);
    if (!first_channel) {
      cph_key ek = cph_key_of_u64(s->inbox[idx].event_id);
      cph_event_rec ev;
      if (cph_txn_get_record(&t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev) == CPH_OK) {
        first_channel = strdup(ev.channel);
        cph_record_free(&cph_event_desc, &ev);
      }
    }
  }
  if (!interrupted && tu->env->report_consumed) {
    int krc = consumed_keys(&t, s, l->inbox_ids, l->n_inbox_ids, op);
    if (krc) {
      free(first_channel);
      cph_txn_abort(&t);
      op_fail(op, krc, NULL, "listing the events turn %llu consumed: %s",
              (unsigned long long)l->turn_id, t.err.msg[0] ? t.err.msg : cph_strerror(krc));
      return;
    }
  }
  uint64_t reply_id = 0;
  if (op->u.turn.reply_body) {
    char direct[160];
    snprintf(direct, sizeof direct, "direct:%s", s->id);
    const char *chan = op->u.turn.reply_channel ? op->u.turn.reply_channel
                       : first_channel          ? first_channel
                                                : direct;
    uint64_t event_id = 0;
    cph_txn_next_id(&t, "event", &event_id);
    cph_event_rec ev = {0};
    ev.id = event_id;
    ev.channel = (char *)chan;
    ev.sender = s->id;
    ev.body = op->u.turn.reply_body;
    ev.kind = "reply";
    ev.ts_ms = ev.received_ms = now_ms;
    ev.status = CPH_EVENT_STORED;
    cph_key ek = cph_key_of_u64(event_id);
    cph_txn_put_record(&t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
    history_append(&t, chan, event_id, NULL);
    cph_reply_rec rr = {0,            s->id,
                        (char *)chan, op->u.turn.reply_body,
                        l->inbox_ids, (uint32_t)l->n_inbox_ids,
                        l->turn_id,   now_ms,
                        NULL};
    replystream_put(&t, &rr, tu->env->reply_origin_node, l->token);
    reply_id = rr.id;
    if (tu->env->report_consumed) { /* for the other nodes' copies of chan (cluster mode) */
      free(op->u.turn.reply_written_channel);
      op->u.turn.reply_written_channel = strdup(chan);
      op->u.turn.reply_written_ms = now_ms;
    }
  }
  free(first_channel);
  /* memories the worker minted, scoped to the session (DESIGN §7); in cluster mode their ids,
   * for their items (state_to_op) */
  uint64_t *minted = tu->env->report_consumed && op->u.turn.n_memories
                         ? calloc(op->u.turn.n_memories, sizeof *minted)
                         : NULL;
  size_t n_minted = 0;
  for (size_t i = 0; i < op->u.turn.n_memories; i++)
    if (op->u.turn.memories[i].text && *op->u.turn.memories[i].text &&
        memory_mint(tu->memory, &t, s->id, CPH_MEMORY_RAW, op->u.turn.memories[i].text, 0, true,
                    minted ? &minted[n_minted] : NULL) == CPH_OK &&
        minted)
      n_minted++;
  for (size_t i = 0; i < op->u.turn.n_enqueue; i++) {
    cph_job_kind_t kind;
    const cph_job_in *ji = &op->u.turn.enqueue[i];
    if (cph_job_kind_parse(ji->job, &kind) != CPH_OK) {
      char f[48];
      snprintf(f, sizeof f, "enqueue[%zu].job", i);
      cph_txn_abort(&t);
      maint_pending_drop(tu->maint);
      op_fail(op, CPH_EINVAL, f, "%s: unknown job '%s'", f, ji->job ? ji->job : "");
      free(minted);
      return;
    }
    uint64_t jid;
    uint64_t group =
        ji->args && strncmp(ji->args, "group=", 6) == 0 ? strtoull(ji->args + 6, NULL, 10) : 0;
    maint_job_write(tu->maint, &t, kind, ji->args, group, &jid);
  }
  uint64_t compacted = 0; /* a gc_commit's group, for its items (cluster mode) */
  if (l->job_id)
    maint_job_apply(tu->maint, &t, s, l->job_id, op->u.turn.job, &compacted);
  cph_key tk = cph_key_of_u64(l->turn_id);
  cph_turn_rec tr;
  cph_pact_tree tree; /* the episode's tree: kept decoded (trees_keep) once t committed */
  cph_pact_tree_init(&tree);
  bool tree_saved = false;
  char *old_error = NULL;
  if (cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr) == CPH_OK) {
    if (tr.kind != CPH_TURN_JOB && !interrupted) {
      /* The episode (DESIGN §6): the input and reply join the session's PACT tree as message
       * cores, then TTL -> cadence -> lifecycle -> ODI. */
      if (trees_load(tu->trees, &t, s->id, &tree) == CPH_OK &&
          cph_pact_complete_turn(&tree, input_core_text(&tr), op->u.turn.reply_body) == CPH_OK) {
        trees_prune_history(&tree);
        tree_saved = trees_save(tu->trees, &t, s->id, &tree) == CPH_OK;
      }
    }
    tr.state = CPH_TURN_COMPLETED;
    tr.completed_ms = now_ms;
    tr.cost_tokens = op->u.turn.tokens;
    tr.tool_calls = op->u.turn.tool_calls;
    old_error = tr.error;
    if (interrupted) /* its record says why its input was not consumed */
      tr.error = "interrupted: input arrived (while_running interrupt); input staged again";
    cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    turnrecs_ended(&t, &tr);
    tr.error = old_error;
    cph_record_free(&cph_turn_desc, &tr);
  }
  cph_txn_del(&t, CPH_DB_ACTIVE_TURNS, &tk);
  /* Charge first (in memory) so the stored credits are the charged ones; undone below if
   * the write fails. */
  double credits_before = cph_sched_credits(tu->env->sched, s->sid);
  /* §3.8: tokens feed the lane's tokens bucket and, under :charge :tokens, the credits. */
  cph_sched_cost cost = {op->u.turn.tool_calls, op->u.turn.tokens};
  cph_sched_finish_cost(tu->env->sched, s->sid, &cost, true);
  if (!interrupted)
    s->episode++;
  persist_session_credits(tu->sessions, &t, s);
  if (!interrupted) /* channel views: the cursors move to what the turn saw */
    context_cursors_advance(&t, s->id, &l->views);
  int commit_rc = cph_txn_commit(&t);
  if (commit_rc == CPH_OK && tree_saved)
    trees_keep(tu->trees, s->id, &tree);
  cph_pact_tree_free(&tree);
  if (commit_rc) {
    /* Credits and episode back as they were. The scheduler counted the turn's end (its slot
     * is free); the lease stays, and its expiry stages the input again. */
    if (!interrupted)
      s->episode--;
    csession_reassign(tu->sessions, s, s->lane, credits_before);
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    maint_pending_drop(tu->maint);
    s->running_turn = 0; /* the lease stays; expiry will stage the input again */
    free(minted);
    return;
  }
  maint_pending_apply(tu->maint);
  metrics_turn_completed(tu->metrics, s->lane, op); /* its tool_stats too */
  if (l->job_id)
    maint_job_finished(tu->maint, s, l->job_id);
  for (size_t i = 0; i < l->n_inbox_ids; i++) {
    int idx = inbox_index(s, l->inbox_ids[i]);
    if (idx < 0)
      continue;
    if (interrupted)
      s->inbox[idx].turn_id = 0; /* staged for the next turn, with what arrived */
    else
      csession_inbox_remove(s, (uint32_t)idx);
  }
  if (reply_id > tu->last_reply_id)
    tu->last_reply_id = reply_id;
  s->running_turn = 0;
  if (l->kind == CPH_KIND_REPORT)
    reports_done(tu->reports, s, env_now(tu->env)); /* the next: an interval from now */
  if (l->kind == CPH_KIND_AUTONOMY_TICK || s->autonomy_interval_s)
    sessions_tick_schedule(tu->sessions, s); /* the next tick is an interval after this turn */
  sessions_update_work(tu->sessions, s);
  uint64_t turn_id = l->turn_id;
  lease_free(cph_hmap_del(&tu->leases, l->key));
  if (tu->env->report_consumed)
    state_to_op(tu, s->id, minted, n_minted, reply_id, turn_id, op);
  free(minted);
  if (tu->env->report_consumed && compacted) {
    cph_handover st = {tu->env, tu->sessions, tu->trees, tu->memory, tu->turnlog};
    int grc = handover_gc_items(&st, compacted, &op->u.turn.job_items);
    if (grc)
      cph_log(CPH_LOG_WARN, "reading the memories gc group %llu compacted for the cluster log: "
              "%s (a takeover then brings its sources back, to be compacted again)",
              (unsigned long long)compacted, cph_strerror(grc));
  }
}

static void turn_fail(cph_turns *tu, cph_op *op) {
  lease *l = NULL;
  if (check_lease(tu, op, &l))
    return;
  csession *s = l->session;
  bool job = l->kind == CPH_KIND_JOB; /* not indexed by session: no item */
  int rc = end_lease(tu, l, CPH_TURN_FAILED, op->u.turn.error ? op->u.turn.error : "failed",
                     !op->u.turn.away, &op->u.turn.park);
  if (rc) {
    op_fail(op, rc, NULL, "%s", cph_strerror(rc));
    return;
  }
  if (op->u.turn.away) { /* not picked again until this node serves it again */
    s->away = true;
    sessions_update_work(tu->sessions, s);
  }
  /* the failed turn's record and kept context, as items (cluster) */
  if (tu->env->report_consumed && !job &&
      ((op->u.turn.consumed_session = strdup(s->id)) == NULL ||
       (rc = ended_items(tu, s, op->u.turn.turn_id, true, &op->u.turn.items)) != CPH_OK))
    cph_log(CPH_LOG_WARN, "reading the record and kept context of failed turn %llu of session "
            "'%s' for the cluster log: %s (the session's next state carries the record)",
            (unsigned long long)op->u.turn.turn_id, s->id, cph_strerror(rc ? rc : CPH_ENOMEM));
}

static void turn_requeue(cph_turns *tu, cph_op *op) {
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  cph_key tk = cph_key_of_u64(op->u.turn.turn_id);
  cph_turn_rec tr;
  int rc = cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  if (rc) {
    cph_txn_abort(&t);
    if (rc == CPH_ENOTFOUND)
      op_fail(op, rc, "id", "no turn %llu", (unsigned long long)op->u.turn.turn_id);
    else
      op_fail(op, rc, NULL, "%s", t.err.msg);
    return;
  }
  csession *s = sessions_get(tu->sessions, tr.session);
  if (tr.state != CPH_TURN_PARKED || !s || tr.origin) {
    /* a record with an origin is another node's, history here: the input it parked is held
     * here, if at all, under a turn of this node's own (turns_park_keys) */
    op_fail(op, CPH_ECONFLICT, "id", "turn %llu is not parked%s", (unsigned long long)tr.id,
            !s          ? " (its session was deleted)"
            : tr.origin ? " here: it is history another node parked (the input it held is "
                          "parked here under a turn of this node's own, GET /v1/turns?state="
                          "parked)"
                        : "");
    cph_record_free(&cph_turn_desc, &tr);
    cph_txn_abort(&t);
    return;
  }
  inbox_item *back = calloc(tr.n_inbox_seqs ? tr.n_inbox_seqs : 1, sizeof *back);
  size_t n = 0;
  for (uint32_t i = 0; back && i < tr.n_inbox_seqs; i++) {
    cph_key ik = inbox_key(s->id, tr.inbox_seqs[i]);
    cph_inbox_rec ir;
    if (cph_txn_get_record(&t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &ir) != CPH_OK)
      continue;
    inbox_item it = {0};
    it.id = tr.inbox_seqs[i];
    it.event_id = ir.event_id;
    it.status = CPH_INBOX_STAGED;
    it.mentioned = ir.mentioned;
    it.created_ms = ir.created_ms;
    inbox_fold_get(&t, s->id, &it); /* its count comes back with it (a bad record: count 1) */
    put_inbox_status(&t, s, &it, CPH_INBOX_STAGED, 0);
    back[n++] = it;
    cph_record_free(&cph_inbox_desc, &ir);
  }
  /* Cluster mode: the keys of what comes back, for the cluster log's unpark mark
   * (server/clusterflow.h 6.). */
  cph_park_note *pn = &op->u.turn.park;
  int krc = CPH_OK;
  for (size_t i = 0; tu->env->report_consumed && back && krc == CPH_OK && i < n; i++)
    krc = inbox_event_keys(&t, s->id, &back[i], &pn->keys);
  if (tu->env->report_consumed && krc == CPH_OK &&
      (!(pn->session = strdup(s->id)) || !(pn->error = strdup(tr.error ? tr.error : ""))))
    krc = CPH_ENOMEM;
  pn->turn_id = tr.id;
  pn->attempts = tr.attempts;
  if (krc != CPH_OK) { /* the requeue stands; a takeover may find the input parked still */
    cph_log(CPH_LOG_WARN, "requeueing turn %llu of '%s': listing its events for the cluster log "
            "failed (%s): a node that takes the session over may hold them parked again",
            (unsigned long long)tr.id, s->id, cph_strerror(krc));
    cph_park_note_free(pn);
  }
  tr.state = CPH_TURN_REQUEUED;
  cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  cph_txn_del(&t, CPH_DB_PARKED_TURNS, &tk);
  cph_record_free(&cph_turn_desc, &tr);
  /* Live again before the commit: the session's folded map, if it has one, is rewritten from
   * the live inbox, and must list these (their ids may be below its `through`, inbox.h). */
  size_t pushed = 0;
  while (back && pushed < n && csession_inbox_push(s, &back[pushed]) == CPH_OK)
    pushed++;
  rc = back && pushed == n ? inbox_folded_put(&t, s, 0) : CPH_ENOMEM;
  if (rc || cph_txn_commit(&t)) {
    if (t.mdb)
      cph_txn_abort(&t);
    for (size_t i = 0; i < pushed; i++) {
      int at = inbox_index(s, back[i].id);
      if (at >= 0)
        csession_inbox_remove(s, (uint32_t)at);
    }
    op_fail(op, t.ret ? t.ret : rc ? rc : CPH_ENOMEM, NULL, "%s",
            t.err.msg[0] ? t.err.msg : cph_strerror(t.ret ? t.ret : rc ? rc : CPH_ENOMEM));
    cph_park_note_free(pn);
    free(back);
    return;
  }
  free(back);
  parked_count_add(tu, s->id, -1);
  sessions_update_work(tu->sessions, s);
  if (tu->env->report_consumed) { /* its record, requeued now, as an item again (cluster) */
    cph_handover st = {tu->env, tu->sessions, tu->trees, tu->memory, tu->turnlog};
    if ((op->u.turn.consumed_session = strdup(s->id)) == NULL ||
        (rc = handover_turn_item(&st, s->id, op->u.turn.turn_id, &op->u.turn.items)) != CPH_OK)
      cph_log(CPH_LOG_WARN, "reading the requeued turn %llu of session '%s' for the cluster log: "
              "%s (a node that takes the session over may list it parked)",
              (unsigned long long)op->u.turn.turn_id, s->id,
              cph_strerror(rc ? rc : CPH_ENOMEM));
  }
}

/* Pushes a copy of key onto v unless it is there already (a handful of keys: linear). */
static int held_push(cph_strv *v, const char *key) {
  for (size_t i = 0; i < v->count; i++)
    if (strcmp(v->items[i], key) == 0)
      return CPH_OK;
  char **items = realloc(v->items, (v->count + 1) * sizeof *items);
  if (!items)
    return CPH_ENOMEM;
  v->items = items;
  if (!(items[v->count] = strdup(key)))
    return CPH_ENOMEM;
  v->count++;
  return CPH_OK;
}

/* Of entry it of session `session` (its fold read), the keys `want` names into held; *hit
 * when there is one. */
static int wanted_keys(cph_txn *t, const char *session, const inbox_item *it,
                       const cph_hmap *want, cph_strv *held, bool *hit) {
  cph_strv keys = {0};
  int rc = inbox_event_keys(t, session, it, &keys);
  *hit = false;
  for (size_t k = 0; rc == CPH_OK && k < keys.count; k++)
    if (cph_hmap_get(want, keys.items[k])) {
      *hit = true;
      rc = held_push(held, keys.items[k]);
    }
  cph_strv_free(&keys);
  return rc;
}

/* The keys `want` names that s's turns parked before hold, into held: a read of every parked
 * turn (there are few) and of their entries. */
static int parked_ids(cph_txn *t, const char *session, uint64_t **out, size_t *n);

static int held_before(cph_txn *t, const csession *s, const cph_hmap *want, cph_strv *held) {
  uint64_t *ids;
  size_t n_ids;
  int rc = parked_ids(t, s->id, &ids, &n_ids);
  for (size_t j = 0; rc == CPH_OK && j < n_ids; j++) {
    cph_key tk = cph_key_of_u64(ids[j]);
    cph_turn_rec tr;
    int grc = cph_txn_get_record(t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
    if (grc == CPH_ENOTFOUND)
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    for (uint32_t i = 0; grc == CPH_OK && i < tr.n_inbox_seqs; i++) {
      cph_key ik = inbox_key(s->id, tr.inbox_seqs[i]);
      cph_inbox_rec ir;
      if (cph_txn_get_record(t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &ir) != CPH_OK)
        continue;
      inbox_item it = {0};
      it.id = tr.inbox_seqs[i];
      it.event_id = ir.event_id;
      it.created_ms = ir.created_ms;
      bool hit;
      grc = inbox_fold_get(t, s->id, &it);
      if (grc == CPH_OK)
        grc = wanted_keys(t, s->id, &it, want, held, &hit);
      cph_record_free(&cph_inbox_desc, &ir);
    }
    cph_record_free(&cph_turn_desc, &tr);
    if (grc)
      rc = grc;
  }
  free(ids);
  return rc;
}

/* turns.h: as end_lease parks a turn — its record parked, its entries parked under it and out
 * of the live inbox — but for the live entries (no turn carries them) standing for a wanted
 * key, and with the attempts and error another node's park mark gave. Its input is built as a
 * lease builds it (build_turn: "inbox:" and the entries' bodies in the order a lease stages
 * them), so it reads as the turn another node parked. */
void turns_park_keys(cph_turns *tu, cph_op *op) {
  csession *s = op->u.ingest.park_session ? sessions_get(tu->sessions, op->u.ingest.park_session)
                                          : NULL;
  if (!s || !op->u.ingest.n_park_keys || op->rc != CPH_OK)
    return;
  cph_hmap want = CPH_HMAP_INIT;
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < op->u.ingest.n_park_keys; i++)
    rc = cph_hmap_put(&want, op->u.ingest.park_keys[i], (void *)op->u.ingest.park_keys[i]);
  cph_strv *held = &op->u.ingest.park_held;
  uint32_t *at = calloc(s->n_inbox ? s->n_inbox : 1, sizeof *at); /* indices of those taken */
  inbox_item **items = calloc(s->n_inbox ? s->n_inbox : 1, sizeof *items);
  size_t n = 0;
  if (rc == CPH_OK && (!at || !items))
    rc = CPH_ENOMEM;
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  for (uint32_t i = 0; rc == CPH_OK && i < s->n_inbox; i++) {
    bool hit = false;
    if (!s->inbox[i].turn_id)
      rc = wanted_keys(&t, s->id, &s->inbox[i], &want, held, &hit);
    if (hit) {
      at[n] = i;
      items[n++] = &s->inbox[i];
    }
  }
  uint64_t turn_id = 0;
  cph_buf input = CPH_BUF_INIT;
  uint64_t *ids = n ? calloc(n, sizeof *ids) : NULL;
  if (rc == CPH_OK && n && !ids)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK && n) {
    qsort(items, n, sizeof *items, staged_order);
    cph_buf_puts(&input, INBOX_INPUT_MARK);
    for (size_t i = 0; rc == CPH_OK && i < n; i++) {
      cph_staged_msg m = {0};
      rc = staged_fill(&t, s, items[i], &m);
      if (rc == CPH_OK) {
        if (i)
          cph_buf_putc(&input, '\n');
        cph_buf_puts(&input, m.body);
      }
      free(m.channel);
      free(m.sender);
      free(m.body);
      free(m.event_ids);
      ids[i] = items[i]->id;
    }
    char *text = rc == CPH_OK ? cph_buf_steal(&input) : NULL;
    if (rc == CPH_OK && !text)
      rc = CPH_ENOMEM;
    if (rc == CPH_OK)
      rc = cph_txn_next_id(&t, "turn", &turn_id);
    cph_turn_rec tr = {0};
    tr.id = turn_id;
    tr.session = s->id;
    tr.lane = (uint8_t)s->lane;
    tr.kind = CPH_TURN_INBOX;
    tr.state = CPH_TURN_PARKED;
    if (rc == CPH_OK && RAND_bytes(tr.lease, sizeof tr.lease) != 1) /* never handed out */
      rc = CPH_EIO;
    tr.inbox_seqs = ids;
    tr.n_inbox_seqs = (uint32_t)n;
    tr.episode = s->episode;
    tr.attempts = op->u.ingest.park_attempts;
    tr.input = text;
    tr.created_ms = tr.completed_ms = cph_wall_ms();
    tr.error = (char *)op->u.ingest.park_error;
    cph_key tk = cph_key_of_u64(turn_id);
    if (rc == CPH_OK) {
      cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
      cph_txn_put(&t, CPH_DB_PARKED_TURNS, &tk, "", 0);
    }
    for (size_t i = 0; rc == CPH_OK && i < n; i++) {
      inbox_item it = *items[i];
      it.attempts = op->u.ingest.park_attempts;
      put_inbox_status(&t, s, &it, CPH_INBOX_PARKED, turn_id);
    }
    free(text);
  }
  cph_buf_free(&input);
  free(ids);
  free(items);
  if (rc == CPH_OK && parked_any(tu, s->id)) /* this one (if any) is not counted yet */
    rc = held_before(&t, s, &want, held);
  cph_hmap_free(&want);
  if (rc == CPH_OK && cph_txn_commit(&t) != CPH_OK)
    rc = t.ret ? t.ret : CPH_EIO;
  if (rc) {
    if (t.mdb)
      cph_txn_abort(&t);
    cph_strv_free(held);
    free(at);
    op_fail(op, rc, NULL, "parking the input of '%s' another node parked: %s", s->id,
            t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    return;
  }
  for (size_t i = n; i-- > 0;) /* from the end: the indices before stay valid (they ascend) */
    csession_inbox_remove(s, at[i]);
  free(at);
  op->u.ingest.park_turn = turn_id;
  if (n)
    parked_count_add(tu, s->id, 1);
  sessions_update_work(tu->sessions, s);
  if (n)
    cph_log(CPH_LOG_INFO, "turn %llu of '%s': %zu entries parked as another node parked them "
            "(POST /v1/turns/%llu/requeue brings them back)",
            (unsigned long long)turn_id, s->id, n, (unsigned long long)turn_id);
}

/* parked_ids' walk: the ids of one session's parked turns. */
typedef struct parked_ids_of {
  const char *session;
  uint64_t *ids;
  size_t n, cap;
} parked_ids_of;

static int add_parked_id(cph_turn_rec *tr, void *ctx) {
  parked_ids_of *w = ctx;
  if (strcmp(tr->session, w->session) != 0)
    return CPH_OK;
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 4;
    uint64_t *v = realloc(w->ids, cap * sizeof *v);
    if (!v)
      return CPH_ENOMEM;
    w->ids = v;
    w->cap = cap;
  }
  w->ids[w->n++] = tr->id;
  return CPH_OK;
}

/* The ids of session's parked turns (malloc'd, *n of them), read before any of them changes. */
static int parked_ids(cph_txn *t, const char *session, uint64_t **out, size_t *n) {
  parked_ids_of w = {.session = session};
  int rc = parked_each(t, add_parked_id, &w);
  *out = w.ids;
  *n = w.n;
  return rc;
}

/* Whether any of keys is in m. */
static bool any_in(const cph_strv *keys, const cph_hmap *m) {
  for (size_t i = 0; i < keys->count; i++)
    if (cph_hmap_get(m, keys->items[i]))
      return true;
  return false;
}

/* One parked turn of s (turns_retain_parked): its entries, each with its keys, as stored. */
typedef struct parked_entry {
  inbox_item it;
  bool mentioned;
  cph_strv keys;
} parked_entry;

/* turns.h: CPH_OP_INBOX_RETAIN's second part (cephalon.h), after sessions.c's: the session's
 * parked turns against what the log says of their keys. Entries requeued join the live inbox
 * (and the folded map is rewritten, as a requeue does); the rest is written in a child
 * transaction. */
void turns_retain_parked(cph_turns *tu, cph_op *op) {
  csession *s = sessions_get(tu->sessions, op->u.retain.session);
  if (!s || op->rc != CPH_OK || !parked_any(tu, s->id))
    return;
  cph_hmap keep = CPH_HMAP_INIT, parked = CPH_HMAP_INIT, unparked = CPH_HMAP_INIT;
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < op->u.retain.n_keep; i++)
    rc = cph_hmap_put(&keep, op->u.retain.keep[i], (void *)op->u.retain.keep[i]);
  for (size_t i = 0; rc == CPH_OK && i < op->u.retain.n_parked; i++)
    rc = cph_hmap_put(&parked, op->u.retain.parked[i], (void *)op->u.retain.parked[i]);
  for (size_t i = 0; rc == CPH_OK && i < op->u.retain.n_unparked; i++)
    rc = cph_hmap_put(&unparked, op->u.retain.unparked[i], (void *)op->u.retain.unparked[i]);
  cph_txn t;
  cph_txn_begin_child(&tu->env->txn, &t);
  uint64_t *ids = NULL;
  size_t n_ids = 0, pushed = 0;
  if (rc == CPH_OK)
    rc = parked_ids(&t, s->id, &ids, &n_ids);
  inbox_item *back = NULL; /* the entries requeued, pushed into the live inbox */
  size_t n_back = 0, cap_back = 0;
  for (size_t k = 0; rc == CPH_OK && k < n_ids; k++) {
    cph_key tk = cph_key_of_u64(ids[k]);
    cph_turn_rec tr;
    if ((rc = cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr)) != CPH_OK)
      break;
    parked_entry *es = calloc(tr.n_inbox_seqs ? tr.n_inbox_seqs : 1, sizeof *es);
    size_t n_es = 0, n_keys = 0;
    bool any_parked = false, any_kept = false, any_unparked = false;
    if (!es)
      rc = CPH_ENOMEM;
    for (uint32_t i = 0; rc == CPH_OK && i < tr.n_inbox_seqs; i++) {
      cph_key ik = inbox_key(s->id, tr.inbox_seqs[i]);
      cph_inbox_rec ir;
      if (cph_txn_get_record(&t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &ir) != CPH_OK)
        continue;
      parked_entry *e = &es[n_es++];
      e->it.id = tr.inbox_seqs[i];
      e->it.event_id = ir.event_id;
      e->it.mentioned = ir.mentioned;
      e->it.created_ms = ir.created_ms;
      e->it.attempts = ir.attempts;
      cph_record_free(&cph_inbox_desc, &ir);
      rc = inbox_fold_get(&t, s->id, &e->it);
      if (rc == CPH_OK)
        rc = inbox_event_keys(&t, s->id, &e->it, &e->keys);
      n_keys += e->keys.count;
      any_parked |= any_in(&e->keys, &parked);
      any_kept |= any_in(&e->keys, &keep);
      any_unparked |= any_in(&e->keys, &unparked);
    }
    /* stays parked: marked so, or no key to tell by, or kept with no unpark mark */
    bool requeue = rc == CPH_OK && !any_parked && n_keys && any_kept && any_unparked;
    bool drop = rc == CPH_OK && !any_parked && n_keys && !any_kept;
    for (size_t i = 0; rc == CPH_OK && !any_parked && n_keys && any_kept && !any_unparked &&
                       i < n_es;
         i++)
      for (size_t j = 0; rc == CPH_OK && j < es[i].keys.count; j++)
        if (cph_hmap_get(&keep, es[i].keys.items[j]))
          rc = held_push(&op->u.retain.held, es[i].keys.items[j]);
    for (size_t i = 0; rc == CPH_OK && (requeue || drop) && i < n_es; i++) {
      parked_entry *e = &es[i];
      if (requeue && any_in(&e->keys, &keep)) {
        e->it.status = CPH_INBOX_STAGED;
        e->it.attempts = 0;
        put_inbox_status(&t, s, &e->it, CPH_INBOX_STAGED, 0);
        if (n_back == cap_back) {
          cap_back = cap_back ? 2 * cap_back : 8;
          inbox_item *v = realloc(back, cap_back * sizeof *v);
          if (!v) {
            rc = CPH_ENOMEM;
            break;
          }
          back = v;
        }
        back[n_back++] = e->it;
      } else {
        put_inbox_status(&t, s, &e->it, CPH_INBOX_CONSUMED, 0);
      }
    }
    if (rc == CPH_OK && (requeue || drop)) {
      tr.state = CPH_TURN_REQUEUED;
      cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
      cph_txn_del(&t, CPH_DB_PARKED_TURNS, &tk);
      if (requeue)
        op->u.retain.parked_requeued++;
      else
        op->u.retain.parked_dropped++;
      cph_log(CPH_LOG_INFO,
              "parked turn %llu of '%s' %s: its input was %s on another node while this one did "
              "not serve the session",
              (unsigned long long)tr.id, s->id, requeue ? "requeued" : "is no longer parked",
              requeue ? "requeued" : "consumed");
    }
    for (size_t i = 0; es && i < n_es; i++)
      cph_strv_free(&es[i].keys);
    free(es);
    cph_record_free(&cph_turn_desc, &tr);
  }
  free(ids);
  cph_hmap_free(&keep);
  cph_hmap_free(&parked);
  cph_hmap_free(&unparked);
  /* Live again before the commit: the folded map is rewritten from the live inbox (turn_requeue) */
  while (rc == CPH_OK && pushed < n_back && csession_inbox_push(s, &back[pushed]) == CPH_OK)
    pushed++;
  if (rc == CPH_OK && pushed < n_back)
    rc = CPH_ENOMEM;
  if (rc == CPH_OK && n_back)
    rc = inbox_folded_put(&t, s, 0);
  if (rc == CPH_OK && cph_txn_commit(&t) != CPH_OK)
    rc = t.ret ? t.ret : CPH_EIO;
  if (rc) {
    if (t.mdb)
      cph_txn_abort(&t);
    for (size_t i = 0; i < pushed; i++) {
      int at = inbox_index(s, back[i].id);
      if (at >= 0)
        csession_inbox_remove(s, (uint32_t)at);
    }
    cph_strv_free(&op->u.retain.held);
    op->u.retain.parked_requeued = op->u.retain.parked_dropped = 0;
    op_fail(op, rc, NULL, "retaining the parked turns of '%s': %s", s->id,
            t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
  for (uint32_t i = 0; i < op->u.retain.parked_requeued + op->u.retain.parked_dropped; i++)
    parked_count_add(tu, s->id, -1);
  free(back);
  sessions_update_work(tu->sessions, s);
}

void turns_session_deleted(cph_turns *tu, cph_op *op) {
  const char *id = op->u.session.in.id;
  if (op->rc != CPH_OK || !tu->env->report_consumed || !id || !parked_any(tu, id))
    return;
  cph_txn *t = &tu->env->txn;
  uint64_t *ids = NULL;
  size_t n = 0;
  int rc = parked_ids(t, id, &ids, &n);
  for (size_t k = 0; rc == CPH_OK && k < n; k++) {
    cph_key tk = cph_key_of_u64(ids[k]);
    cph_turn_rec tr;
    if ((rc = cph_txn_get_record(t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr)) != CPH_OK)
      break;
    for (uint32_t i = 0; rc == CPH_OK && i < tr.n_inbox_seqs; i++) {
      cph_key ik = inbox_key(id, tr.inbox_seqs[i]);
      cph_inbox_rec ir;
      if (cph_txn_get_record(t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &ir) != CPH_OK)
        continue;
      inbox_item it = {0};
      it.id = tr.inbox_seqs[i];
      it.event_id = ir.event_id;
      it.created_ms = ir.created_ms;
      cph_record_free(&cph_inbox_desc, &ir);
      rc = inbox_fold_get(t, id, &it);
      if (rc == CPH_OK)
        rc = inbox_event_keys(t, id, &it, &op->u.session.consumed);
    }
    cph_record_free(&cph_turn_desc, &tr);
  }
  free(ids);
  if (rc != CPH_OK) /* the delete stands; only the shard's watermark may stay behind */
    cph_log(CPH_LOG_WARN, "session '%s' deleted, but listing the events of its parked turns for "
            "the cluster log failed (%s): its shard's watermark stays below them here",
            id, cph_strerror(rc));
}

void turns_apply(cph_turns *tu, cph_op *op) {
  switch (op->kind) {
  case CPH_OP_HEARTBEAT:
    turn_heartbeat(tu, op);
    break;
  case CPH_OP_COMPLETE:
    turn_complete(tu, op);
    break;
  case CPH_OP_FAIL:
    turn_fail(tu, op);
    break;
  case CPH_OP_TAKE:
    turn_take(tu, op);
    break;
  case CPH_OP_SESSION_STATE: {
    cph_handover st = {tu->env, tu->sessions, tu->trees, tu->memory, tu->turnlog};
    uint64_t newest_reply = 0, outbox_items = 0;
    handover_import(&st, op, &newest_reply, &outbox_items);
    maint_outbox_queued(tu->maint, outbox_items, cph_wall_ms());
    if (newest_reply > tu->last_reply_id) /* GET /v1/replies offers them once committed */
      tu->last_reply_id = newest_reply;
    break;
  }
  default:
    turn_requeue(tu, op);
    break;
  }
}

void turns_supersede(cph_turns *tu, csession *s) {
  lease *l = s->running_turn ? lease_find(tu, s->running_turn) : NULL;
  if (!l || l->job_id)
    return;
  int rc =
      end_lease(tu, l, CPH_TURN_SUPERSEDED, "superseded: input arrived (while_running restart)",
                false, NULL);
  if (rc) /* the lease stays; it ends by its worker or its deadline, as under :enqueue */
    cph_log(CPH_LOG_WARN, "could not supersede turn %llu of '%s': %s",
            (unsigned long long)s->running_turn, s->id, cph_strerror(rc));
}

/* ---------------------------------------------------------------- reconcile */

/* §3.6 job 4: leases past their deadline end; waiting lease requests past theirs time out. */
void turns_reconcile(cph_turns *tu) {
  int64_t now = env_now(tu->env);
  /* Collect first: ending a lease changes the map. */
  lease **expired = NULL;
  size_t n = 0, cap = 0;
  for (size_t i = 0; i < tu->leases.cap; i++) {
    lease *l = tu->leases.slots[i].value;
    if (!tu->leases.slots[i].key || l->deadline_ns > now)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 8;
      lease **p = realloc(expired, cap * sizeof *p);
      if (!p)
        break;
      expired = p;
    }
    expired[n++] = l;
  }
  for (size_t i = 0; i < n; i++)
    end_lease(tu, expired[i], CPH_TURN_EXPIRED, "lease expired", true, NULL);
  free(expired);
  for (size_t i = 0; i < tu->waiters.len;) {
    cph_op *w = op_queue_at(&tu->waiters, i);
    if (w->u.lease.deadline_ns > now) {
      i++;
      continue;
    }
    op_queue_remove(&tu->waiters, w);
    op_fail(w, CPH_ETIMEDOUT, NULL, "no turn within wait_ms");
    waiter_done(tu, w);
  }
}

/* ---------------------------------------------------------------- recovery */

/* The largest 8-byte key of db (its keys are big-endian u64s), 0 if none. O(log n): keys
 * ascend, so it is the last one (a key of another length, never written, is stepped over). */
static uint64_t last_key_u64(cph_store *store, cph_db db) {
  cph_txn t;
  uint64_t last = 0;
  if (cph_txn_begin(store, false, &t) != CPH_OK)
    return 0;
  cph_cursor c;
  cph_val k;
  if (cph_cursor_open(&t, db, &c) == CPH_OK) {
    int rc = cph_cursor_last(&c, &k, NULL);
    for (int n = 0; rc == CPH_OK && k.len != 8 && n < 64; n++)
      rc = cph_cursor_prev(&c, &k, NULL);
    if (rc == CPH_OK && k.len == 8)
      last = cph_be64_get(k.data);
    cph_cursor_close(&c);
  }
  cph_txn_abort(&t);
  return last;
}

/* At open: leases in flight when the daemon stopped are expired (a crash is not the worker's
 * attempt, so attempts do not grow) and their input stays staged for the next turn. */
int turns_recover(cph_turns *tu, cph_err *err) {
  tu->last_reply_id = last_key_u64(tu->env->store, CPH_DB_REPLIES);
  int prc = parked_counts_load(tu);
  if (prc != CPH_OK)
    return cph_err_set(err, prc, "reading the parked turns: %s", cph_strerror(prc));
  cph_txn t;
  int rc = cph_txn_begin(tu->env->store, true, &t);
  cph_cursor c;
  cph_val k;
  uint64_t *ids = NULL;
  size_t n = 0, cap = 0;
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_ACTIVE_TURNS, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, NULL); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, NULL)) {
    if (k.len != 8)
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 16;
      uint64_t *p = realloc(ids, cap * sizeof *p);
      if (!p) {
        rc = CPH_ENOMEM;
        break;
      }
      ids = p;
    }
    ids[n++] = cph_be64_get(k.data);
  }
  cph_cursor_close(&c);
  if (rc != CPH_ENOTFOUND && rc != CPH_OK) {
    free(ids);
    cph_txn_abort(&t);
    return cph_err_set(err, rc, "recovering leases: %s",
                       t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
  for (size_t i = 0; i < n; i++) {
    cph_key tk = cph_key_of_u64(ids[i]);
    cph_turn_rec tr;
    if (cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr) == CPH_OK) {
      metrics_turn_ended(tu->metrics, (cph_lane)tr.lane, true);
      tr.state = CPH_TURN_EXPIRED;
      char *old = tr.error;
      tr.error = "lease ended by a restart";
      cph_txn_put_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
      turnrecs_ended(&t, &tr); /* history, as any turn that ended (end_lease) */
      tr.error = old;
      cph_record_free(&cph_turn_desc, &tr);
    }
    cph_txn_del(&t, CPH_DB_ACTIVE_TURNS, &tk);
  }
  free(ids);
  uint64_t dev = 0, ino = 0;
  rc = cph_store_file_identity(tu->env->store, &dev, &ino);
  if (rc == CPH_OK)
    rc = replystream_identity(&t, dev, ino, tu->replies_stream);
  if (rc) {
    cph_txn_abort(&t);
    return cph_err_set(err, rc, "reading the replies stream's identity: %s",
                       t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
  rc = cph_txn_commit(&t);
  if (rc)
    return cph_err_set(err, rc, "recovering leases: %s", t.err.msg);
  if (n)
    cph_log(CPH_LOG_INFO,
            "expired %zu lease(s) left from before the restart; their input is "
            "staged again",
            n);
  return CPH_OK;
}

/* ---------------------------------------------------------------- reads */

int turns_replies(cph_turns *tu, uint64_t after, size_t limit, cph_reply_info **out, size_t *n,
                  uint64_t *next, cph_err *err) {
  if (!limit || limit > 1000)
    limit = 1000;
  *n = 0;
  *next = after;
  *out = calloc(limit, sizeof **out);
  if (!*out)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  if (after >= tu->last_reply_id)
    return CPH_OK;
  cph_txn t;
  int rc = cph_txn_begin(tu->env->store, false, &t);
  cph_cursor c;
  cph_val k, v;
  cph_key start = cph_key_of_u64(after + 1);
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_REPLIES, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, &start, &k, &v); rc == CPH_OK && *n < limit;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_reply_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_reply_desc, v.data, v.len, &r, &derr)) {
      cph_log(CPH_LOG_WARN, "replies: skipping a corrupt record: %s", derr.msg);
      continue;
    }
    cph_reply_info *ri = &(*out)[(*n)++];
    ri->id = r.id;
    ri->session = r.session;
    ri->channel = r.channel;
    ri->body = r.body;
    ri->source_inbox_ids = r.source_inbox_ids;
    ri->n_source_inbox_ids = r.n_source_inbox_ids;
    ri->ts_ms = r.ts_ms;
    ri->origin = r.origin;
    *next = r.id;
    /* ownership moved to ri */
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return cph_err_set(err, rc, "%s", t.err.msg);
  return CPH_OK;
}

/* turns_parked's walk: every parked turn as the listing shows it. */
typedef struct parked_list {
  cph_parked_turn *items;
  size_t n, cap;
} parked_list;

static int add_parked(cph_turn_rec *tr, void *ctx) {
  parked_list *l = ctx;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    cph_parked_turn *p = realloc(l->items, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    l->items = p;
    l->cap = cap;
  }
  cph_parked_turn *p = &l->items[l->n++];
  p->id = tr->id;
  p->session = tr->session;
  p->attempts = tr->attempts;
  p->inbox_ids = tr->inbox_seqs;
  p->n_inbox_ids = tr->n_inbox_seqs;
  p->error = tr->error;
  tr->session = NULL; /* taken */
  tr->inbox_seqs = NULL;
  tr->n_inbox_seqs = 0;
  tr->error = NULL;
  return CPH_OK;
}

int turns_parked(cph_store *store, cph_parked_turn **out, size_t *n, cph_err *err) {
  parked_list l = {0};
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  if (rc == CPH_OK) {
    rc = parked_each(&t, add_parked, &l);
    if (rc)
      cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    cph_txn_abort(&t);
  } else {
    cph_err_set(err, rc, "%s", cph_strerror(rc));
  }
  if (rc) { /* nothing half-listed */
    for (size_t i = 0; i < l.n; i++)
      cph_parked_turn_free(&l.items[i]);
    free(l.items);
    l = (parked_list){0};
  }
  *out = l.items;
  *n = l.n;
  return rc;
}

static const char *const TURN_STATES[CPH_TURN_STATE_COUNT] = {
    "leased", "completed", "failed", "expired", "parked", "requeued", "superseded"};

void cph_turn_record_free(cph_turn_record *t) {
  free(t->session);
  free(t->worker);
  free(t->input);
  free(t->error);
  free(t->origin);
  memset(t, 0, sizeof *t);
}

/* tr's record as the API shows it, taking tr's strings (tr is left to free). */
static int record_from(const char *node, cph_turn_rec *tr, cph_turn_record *o) {
  *o = (cph_turn_record){0};
  char origin[TURNRECS_ORIGIN_MAX];
  turnrecs_origin(origin, node, tr);
  if (origin[0] && !(o->origin = strdup(origin)))
    return CPH_ENOMEM;
  o->id = tr->id;
  o->session = tr->session;
  o->lane = (cph_lane)tr->lane;
  o->kind = (cph_turn_kind_t)tr->kind;
  o->state = TURN_STATES[tr->state];
  o->worker = tr->worker;
  o->episode = tr->episode;
  o->attempts = tr->attempts;
  o->input = tr->input;
  o->created_ms = tr->created_ms;
  o->deadline_ms = tr->deadline_ms;
  o->completed_ms = tr->completed_ms;
  o->cost_tokens = tr->cost_tokens;
  o->tool_calls = tr->tool_calls;
  o->error = tr->error;
  tr->session = tr->worker = tr->input = tr->error = NULL;
  return CPH_OK;
}

int turns_record(cph_store *store, const char *node, uint64_t id, cph_turn_record *out,
                 cph_err *err) {
  *out = (cph_turn_record){0};
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  cph_turn_rec tr = {0};
  cph_key tk = cph_key_of_u64(id);
  if (rc == CPH_OK)
    rc = cph_txn_get_record(&t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  if (rc == CPH_OK)
    rc = record_from(node, &tr, out);
  cph_record_free(&cph_turn_desc, &tr);
  if (rc == CPH_ENOTFOUND)
    cph_err_set(err, rc, "no turn %llu", (unsigned long long)id);
  else if (rc)
    cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  cph_txn_abort(&t);
  return rc;
}

typedef struct record_list {
  const char *node;
  cph_turn_record *v;
  size_t n, cap;
  int rc;
} record_list;

static bool list_record(void *ctx, const cph_turn_rec *tr) {
  record_list *l = ctx;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    cph_turn_record *g = realloc(l->v, cap * sizeof *g);
    if (!g) {
      l->rc = CPH_ENOMEM;
      return false;
    }
    l->v = g;
    l->cap = cap;
  }
  cph_turn_rec copy = *tr; /* record_from takes its strings: they are tr's, so copied first */
  copy.session = strdup(tr->session);
  copy.worker = tr->worker ? strdup(tr->worker) : NULL;
  copy.input = tr->input ? strdup(tr->input) : NULL;
  copy.error = tr->error ? strdup(tr->error) : NULL;
  bool ok = copy.session && (copy.worker || !tr->worker) && (copy.input || !tr->input) &&
            (copy.error || !tr->error);
  l->rc = ok ? record_from(l->node, &copy, &l->v[l->n]) : CPH_ENOMEM;
  if (l->rc == CPH_OK)
    l->n++;
  free(copy.session);
  free(copy.worker);
  free(copy.input);
  free(copy.error);
  return l->rc == CPH_OK;
}

int turns_session_records(cph_store *store, const char *node, const char *session, size_t limit,
                          cph_turn_record **out, size_t *n, cph_err *err) {
  record_list l = {node, NULL, 0, 0, CPH_OK};
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  if (rc == CPH_OK)
    rc = turnrecs_session_newest(&t, session, limit, list_record, &l);
  if (rc == CPH_OK)
    rc = l.rc;
  if (rc) {
    cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    for (size_t i = 0; i < l.n; i++)
      cph_turn_record_free(&l.v[i]);
    free(l.v);
    l.v = NULL;
    l.n = 0;
  }
  cph_txn_abort(&t);
  *out = l.v;
  *n = l.n;
  return rc;
}
