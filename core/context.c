/* Turn context assembly (DESIGN §6): current_state, pending_obligations, conversation_history,
 * recent_memory and available_tools inside the session's window, the channel views with their
 * cursors, and `messages` (the PACT tree merged with the channel view). The contract, the
 * budget split and the channel-view rules are in context.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arena.h"
#include "common/buf.h"
#include "common/log.h"
#include "context.h"
#include "lanes/sched.h"
#include "memory.h"
#include "pact.h"

#define ITEM_OVERHEAD 4u /* per listed item: its id / role / coordinate and punctuation */

/* Shares of A = window - current_state, in percent, in flow order (context.h). */
#define SHARE_OBLIGATIONS 25u
#define SHARE_TOOLS 5u
#define SHARE_HISTORY 40u
#define SHARE_MEMORY 30u
#define RAW_SHARE 60u /* of the memory budget: raw memories; the rest goes to summaries */

/* Work per turn, whatever the window: channel-log entries read over all the turn's channels
 * (context.h: CONTEXT_HISTORY_READS_MAX, split evenly, at least CONTEXT_HISTORY_READS_MIN
 * each), memory records read, memories listed. */
#define MEMORY_SCAN_MAX 1024
#define OTHER_ITEMS_MAX 16
#define REPLACED_HOPS_MAX 8 /* replaced_by links followed to find a stand-in */

#define AWAY_HEADER "MESSAGES WHILE YOU WERE AWAY"
#define SENDER_COPIES 8 /* distinct senders whose strings a turn copies once (ctx.copies) */
#define CORE_COORD_MAX 48

/* Obligation previews shrink through these lengths (bytes) until the list fits. */
static const size_t PREVIEW_STEPS[] = {120, 80, 48, 24, 0};

/* ---------------------------------------------------------------- small helpers */

static uint64_t tok_len(size_t bytes) { return bytes / 4 + (bytes % 4 != 0); }
static uint64_t tok(const char *s) { return tok_len(s ? strlen(s) : 0); }
static uint32_t clamp32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v; }

static cph_key cursor_key(const char *session, const char *chan) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_str(&k, chan);
  return k;
}

/* Three strings copied into the turn's arena (cph_turn_info.strings): a message's, a history
 * entry's or a memory item's. */
static bool pack3(cph_turn_info *ti, const char *x, size_t xn, const char *y, size_t yn,
                  const char *z, size_t zn, char **a, char **b, char **c) {
  char *p = cph_arena_alloc(&ti->strings, xn + yn + zn + 3);
  *a = *b = *c = NULL;
  if (!p)
    return false;
  memcpy(p, x, xn);
  p[xn] = '\0';
  *a = p;
  *b = p + xn + 1;
  memcpy(*b, y, yn);
  (*b)[yn] = '\0';
  *c = *b + yn + 1;
  memcpy(*c, z, zn);
  (*c)[zn] = '\0';
  return true;
}

static char *concat3(const char *a, const char *b, const char *c) {
  size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
  char *s = malloc(n);
  if (s)
    snprintf(s, n, "%s%s%s", a, b, c);
  return s;
}

/* How a sender speaks in a message (DESIGN §6 channel views). */
typedef enum speaker { SPEAKER_OWN, SPEAKER_AGENT, SPEAKER_USER } speaker;

/* A message as the model sees it, in the turn's arena: "[sender] body" from an agent,
 * "sender: body" from a user when several people talk (`several`), else the body — then
 * body_copy when set (the body already in the arena: conversation_history's copy) rather than
 * a second copy. The lengths are the strings' strlen; *len gets the message's. */
static char *say(cph_turn_info *ti, speaker who, bool several, const char *sender, size_t slen,
                 const char *body, size_t blen, char *body_copy, size_t *len) {
  const char *sep = who == SPEAKER_AGENT ? "] " : who == SPEAKER_USER && several ? ": " : NULL;
  *len = blen;
  if (!sep)
    return body_copy ? body_copy : cph_arena_strndup(&ti->strings, body, blen);
  size_t bracket = who == SPEAKER_AGENT;
  size_t n = *len = bracket + slen + 2 + blen;
  char *s = cph_arena_alloc(&ti->strings, n + 1);
  if (!s)
    return NULL;
  char *p = s;
  if (bracket)
    *p++ = '[';
  memcpy(p, sender, slen);
  p += slen;
  memcpy(p, sep, 2);
  memcpy(p + 2, body, blen);
  s[n] = '\0';
  return s;
}

/* Bytes say() writes at most for a user's message whatever `several` (the budget counts the
 * prefix whenever it may be there). */
static size_t said_len(speaker who, size_t slen, size_t blen) {
  size_t prefix = who == SPEAKER_AGENT ? slen + 3 : who == SPEAKER_USER ? slen + 2 : 0;
  return prefix + blen;
}

/* A sender as OpenAI's message `name` (^[a-zA-Z0-9_-]{1,64}$): every other character (one
 * UTF-8 sequence, or one stray byte) becomes '_', cut at 64 bytes; an empty sender is
 * "user". The text keeps the real sender. */
static char *openai_name(cph_turn_info *ti, const char *sender) {
  char out[65];
  size_t o = 0;
  const unsigned char *p = (const unsigned char *)sender;
  while (*p && o < 64) {
    unsigned char ch = *p++;
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-';
    out[o++] = ok ? (char)ch : '_';
    if (ch >= 0xC0)
      while ((*p & 0xC0) == 0x80)
        p++; /* the rest of that character */
  }
  if (!o)
    return cph_arena_strndup(&ti->strings, "user", 4);
  return cph_arena_strndup(&ti->strings, out, o);
}

/* A set of u64 ids: append, then sort once, then look up. */
typedef struct idset {
  uint64_t *v;
  size_t n, cap;
} idset;

static int u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int idset_add(idset *s, uint64_t id) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    uint64_t *p = realloc(s->v, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    s->v = p;
    s->cap = cap;
  }
  s->v[s->n++] = id;
  return CPH_OK;
}

/* The sets arrive nearly in order (note_shown appends the few staged ids, then the history in
 * event order; an inbox is in id order but for requeued entries): with few descents an
 * insertion sort is linear, where qsort's merge sort with a callback cost 2% of a lease. */
static void idset_sort(idset *s) {
  size_t descents = 0;
  for (size_t i = 1; i < s->n; i++)
    descents += s->v[i - 1] > s->v[i];
  if (!descents)
    return;
  if (descents > 8) {
    qsort(s->v, s->n, sizeof *s->v, u64_cmp);
    return;
  }
  for (size_t i = 1; i < s->n; i++) {
    uint64_t x = s->v[i];
    size_t j = i;
    for (; j > 0 && s->v[j - 1] > x; j--)
      s->v[j] = s->v[j - 1];
    s->v[j] = x;
  }
}

static bool idset_has(const idset *s, uint64_t id) {
  return s->n && bsearch(&id, s->v, s->n, sizeof *s->v, u64_cmp) != NULL;
}

static void idset_free(idset *s) {
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- the assembly state */

/* One channel-log entry the turn may show (staged and inbox messages are never entries). */
typedef struct hentry {
  uint64_t event_id;
  uint64_t index; /* in its channel */
  size_t view;    /* its channel: index into ti->views */
  const char *sender; /* held by the tails (chantails_sender): equal senders, equal pointers */
  char *body;         /* borrowed from the channel's tail (chantail.h), unless owned */
  size_t sender_len, body_len; /* their strlen, measured once per event (chantail.h) */
  bool owned; /* read from the store for this turn alone (scan_channel_store): its body and its
               * hold on the sender are the turn's, given back in ctx_free */
  int64_t ts_ms;
  bool own;         /* the session's own message */
  bool agent;       /* from another session */
  bool away;        /* after the cursor and from others: the away block */
  bool for_section; /* a staged message's sender or the session: conversation_history */
  bool in_section, in_messages;
  char *body_copy; /* in_section: its body in the turn's arena, which a message showing the
                    * body alone shares (say) */
} hentry;

/* Per channel view, what ti->views does not carry. */
typedef struct vstate {
  bool subscribed;
  bool mentioned;
  bool staged_found;
  uint64_t oldest_staged_index;
} vstate;

/* A message to render, with the coordinate it sorts by. */
typedef struct ritem {
  cph_coord at;
  const char *role; /* a literal */
  char *content;    /* in the turn's arena, content_len bytes */
  size_t content_len;
  char *name; /* in the turn's arena; user messages only */
} ritem;

typedef struct ctx {
  cph_context *cx;
  cph_txn *t;
  csession *s;
  const cph_session_rec *rec;
  cph_turn_info *ti;
  bool inbox;
  uint64_t window;
  uint64_t avail; /* window - current_state */
  uint64_t carry; /* unused share flowing to the next section */
  uint64_t history_budget;
  idset staged_events; /* this turn's staged messages */
  idset inbox_events;  /* every live inbox message of the session (pending or staged) */
  bool log_copies;     /* the cluster log delivers copies of channel events (log_copy) */
  /* With log_copies: the session's live inbox entries this turn does not stage (their first
   * event's channel, sender, body and time; load_waiting), for log_copy. */
  struct waiting_copy {
    cph_event_rec ev;
    size_t sender_len;
  } *waiting;
  size_t n_waiting;
  /* With log_copies: the history entries that are copies of this turn's staged messages
   * (log_copy): shown, as the staged message is — their memory is not listed too. */
  idset staged_copies;
  idset shown_events;  /* what the turn shows: staged, history, channel view */
  vstate *vs;
  hentry *entries; /* the scratch's (context_scratch): grown there, kept for the next lease */
  size_t n_entries;
  context_tree *tr; /* the caller's: the tree is loaded and ordered here, released there */
  int64_t now_ms;
  /* The session id and the staged senders as the tails hold them (chantails_sender), held for
   * the turn: every history entry's sender is compared with them by pointer. staged_sender and
   * staged_len (the staged senders' strlen, for log_copy) are NULL when the turn stages
   * nothing. */
  const char *id_sender;
  const char **staged_sender;
  size_t *staged_len;
  /* The last sender looked up among the sessions (a held pointer), and whether it is one: a
   * channel's history is mostly a few speakers, so most entries ask about the previous one's
   * sender again. No session is made or deleted while a turn is assembled. */
  const char *agent_memo;
  bool agent_memo_is;
  /* Each sender's strings in the turn's arena, made once per turn for every history entry
   * and message it sent (found by its held pointer): its text (a history entry's sender) and
   * its OpenAI name (a user message's). A channel's history is a few speakers; senders past
   * SENDER_COPIES get a copy per use. */
  struct sender_copy {
    const char *held;
    char *text, *name;
  } copies[SENDER_COPIES];
  size_t n_copies;
} ctx;

/* Whether sender (held by the tails, as long as the turn's entries) is another session. */
static bool is_agent(ctx *c, const char *sender) {
  if (sender != c->agent_memo) {
    c->agent_memo_is = sessions_get(c->cx->sessions, sender) != NULL;
    c->agent_memo = sender;
  }
  return c->agent_memo_is;
}

/* held's (a held sender, len bytes) text, or its OpenAI name when `name`, in the turn's arena:
 * made on the turn's first use, the same pointer after. NULL without memory. */
static char *sender_copy(ctx *c, const char *held, size_t len, bool name) {
  struct sender_copy *sc = NULL;
  for (size_t i = 0; i < c->n_copies && !sc; i++)
    if (c->copies[i].held == held)
      sc = &c->copies[i];
  if (!sc && c->n_copies < SENDER_COPIES) {
    sc = &c->copies[c->n_copies++];
    *sc = (struct sender_copy){held, NULL, NULL};
  }
  char **slot = sc ? (name ? &sc->name : &sc->text) : NULL;
  if (slot && *slot)
    return *slot;
  char *s = name ? openai_name(c->ti, held) : cph_arena_strndup(&c->ti->strings, held, len);
  if (slot)
    *slot = s;
  return s;
}

static uint64_t share(const ctx *c, uint64_t pct) { return c->avail * pct / 100; }

/* Whether the lease answer carries `part` (cph_turn_part): a section left out is still priced,
 * since the budgets flow on from it, but not copied into ti. */
static bool wanted(const ctx *c, unsigned part) { return !(c->ti->omit & part); }

/* ---------------------------------------------------------------- 1. current_state */

static void build_state(ctx *c) {
  cph_turn_info *ti = c->ti;
  cph_lane_stats st;
  cph_sched_lane_stats(c->cx->env->sched, c->s->lane, &st);
  ti->current_state.credits = cph_sched_credits(c->cx->env->sched, c->s->sid);
  ti->current_state.turns_left = st.turns_left;
  ti->current_state.tool_calls_left = st.tool_calls_left;
  ti->current_state.state = CPH_STATE_RUNNING;
  ti->current_state.time_ms = c->now_ms;
  /* What a worker renders for it, to price it. */
  char line[320];
  snprintf(line, sizeof line,
           "lane=%s credits=%.2f turns_left=%.2f tool_calls_left=%.2f state=%s episode=%llu "
           "turn_kind=%s time_ms=%lld",
           cph_lane_name(ti->lane), ti->current_state.credits, ti->current_state.turns_left,
           ti->current_state.tool_calls_left, cph_session_state_name(ti->current_state.state),
           (unsigned long long)ti->episode, cph_turn_kind_name(ti->kind),
           (long long)ti->current_state.time_ms);
  uint64_t cost = tok(line) + ITEM_OVERHEAD;
  ti->tokens.current_state = clamp32(cost);
  c->avail = c->window > cost ? c->window - cost : 0;
}

/* ---------------------------------------------------------------- 2. pending_obligations */

/* Bytes of body kept in a preview of at most max bytes (cut on a UTF-8 boundary), and the
 * preview's length ("..." appended when cut). */
static size_t preview_cut(const char *body, size_t max, size_t *len_out) {
  size_t len = strlen(body);
  if (len <= max) {
    *len_out = len;
    return len;
  }
  size_t cut = max;
  while (cut > 0 && ((unsigned char)body[cut] & 0xc0) == 0x80)
    cut--;
  *len_out = cut + 3;
  return cut;
}

static uint64_t obligation_cost(const cph_staged_msg *m, size_t max) {
  size_t len;
  preview_cut(m->body ? m->body : "", max, &len);
  return tok(m->sender) + tok_len(len) + ITEM_OVERHEAD;
}

static int build_obligations(ctx *c) {
  cph_turn_info *ti = c->ti;
  uint64_t budget = share(c, SHARE_OBLIGATIONS) + c->carry;
  size_t steps = sizeof PREVIEW_STEPS / sizeof PREVIEW_STEPS[0];
  size_t max = 0, keep = 0;
  uint64_t used = 0;
  for (size_t i = 0; i < steps && keep == 0 && ti->n_staged; i++) {
    uint64_t total = 0;
    for (size_t j = 0; j < ti->n_staged; j++)
      total += obligation_cost(&ti->staged[j], PREVIEW_STEPS[i]);
    if (total <= budget) {
      max = PREVIEW_STEPS[i];
      keep = ti->n_staged;
      used = total;
    }
  }
  if (keep == 0) /* not even without previews: the first ones that fit (mentions first) */
    for (size_t j = 0; j < ti->n_staged; j++) {
      uint64_t cost = obligation_cost(&ti->staged[j], 0);
      if (used + cost > budget)
        break;
      used += cost;
      keep++;
    }
  size_t listed = wanted(c, CPH_PART_OBLIGATIONS) ? keep : 0;
  if (listed) {
    ti->obligations = calloc(listed, sizeof *ti->obligations);
    if (!ti->obligations)
      return CPH_ENOMEM;
  }
  for (size_t j = 0; j < listed; j++) {
    const cph_staged_msg *m = &ti->staged[j];
    const char *body = m->body ? m->body : "";
    size_t len, cut = preview_cut(body, max, &len);
    cph_obligation *o = &ti->obligations[ti->n_obligations++];
    o->id = m->id;
    o->sender = strdup(m->sender);
    o->preview = malloc(len + 1);
    if (!o->sender || !o->preview)
      return CPH_ENOMEM;
    memcpy(o->preview, body, cut);
    memcpy(o->preview + cut, "...", len - cut); /* 0 or 3 bytes */
    o->preview[len] = '\0';
  }
  if (keep < ti->n_staged)
    cph_log(CPH_LOG_DEBUG, "turn of '%s': %zu of %zu obligations fit the window", c->s->id, keep,
            ti->n_staged);
  ti->tokens.pending_obligations = clamp32(used);
  c->carry = budget - used;
  return CPH_OK;
}

/* ---------------------------------------------------------------- 5. available_tools */

/* Per-tool counts: completions report tool calls as totals only, so both counts are 0 (see
 * context.h). */
static int build_tools(ctx *c) {
  cph_turn_info *ti = c->ti;
  uint64_t budget = share(c, SHARE_TOOLS) + c->carry, used = 0;
  const cph_session_rec *rec = c->rec;
  bool listed = wanted(c, CPH_PART_TOOLS);
  ti->n_tools_named = rec->n_tools;
  if (rec->n_tools && listed) {
    ti->tools = calloc(rec->n_tools, sizeof *ti->tools);
    if (!ti->tools)
      return CPH_ENOMEM;
  }
  for (uint32_t i = 0; i < rec->n_tools; i++) {
    uint64_t cost = tok(rec->tools[i]) + ITEM_OVERHEAD;
    if (used + cost > budget)
      break;
    used += cost;
    if (!listed)
      continue;
    cph_tool_usage *u = &ti->tools[ti->n_tools];
    if (!(u->name = strdup(rec->tools[i])))
      return CPH_ENOMEM;
    ti->n_tools++;
  }
  ti->tokens.available_tools = clamp32(used);
  c->carry = budget - used;
  return CPH_OK;
}

/* ---------------------------------------------------------------- channel views */

static bool is_subscriber(cph_sessions *ss, const char *channel_name, const csession *s) {
  channel *ch = sessions_channel(ss, channel_name, false);
  for (size_t i = 0; ch && i < ch->n_subscribers; i++)
    if (ch->subscribers[i] == s)
      return true;
  return false;
}

/* One view per distinct channel of the staged messages, in order of first appearance. */
static int views_init(ctx *c) {
  cph_turn_info *ti = c->ti;
  ti->views = calloc(ti->n_staged, sizeof *ti->views);
  c->vs = calloc(ti->n_staged, sizeof *c->vs);
  if (!ti->views || !c->vs)
    return CPH_ENOMEM;
  for (size_t i = 0; i < ti->n_staged; i++) {
    const cph_staged_msg *m = &ti->staged[i];
    size_t v = 0;
    while (v < ti->n_views && strcmp(ti->views[v].channel, m->channel) != 0)
      v++;
    if (v == ti->n_views) {
      if (!(ti->views[v].channel = strdup(m->channel)))
        return CPH_ENOMEM;
      ti->n_views++;
      c->vs[v].subscribed = is_subscriber(c->cx->sessions, m->channel, c->s);
    }
    c->vs[v].mentioned |= m->mentioned;
  }
  for (size_t v = 0; v < ti->n_views; v++) {
    int rc = context_cursor_get(c->t, c->s->id, ti->views[v].channel, &ti->views[v].cursor);
    if (rc == CPH_OK)
      ti->views[v].had_cursor = true;
    else if (rc != CPH_ENOTFOUND)
      return rc;
  }
  return CPH_OK;
}

/* *v (of *cap elements of size each) with room for at least n: grown to twice n when short,
 * so a scratch array reaches its size in a lease or two and then stays. */
static bool scratch_room(void **v, size_t *cap, size_t n, size_t size) {
  if (n <= *cap)
    return true;
  void *p = realloc(*v, 2 * n * size);
  if (!p)
    return false;
  *v = p;
  *cap = 2 * n;
  return true;
}

static int entry_push(ctx *c, const hentry *h) {
  context_scratch *sc = &c->cx->scratch;
  if (!scratch_room((void **)&sc->entries, &sc->cap_entries, c->n_entries + 1, sizeof *h))
    return CPH_ENOMEM;
  c->entries = sc->entries;
  c->entries[c->n_entries++] = *h;
  return CPH_OK;
}

/* Bytes of "[sender] body". */
static size_t prefixed_len(const hentry *h) { return h->sender_len + 3 + h->body_len; }

static speaker speaker_of(const hentry *h) {
  return h->own ? SPEAKER_OWN : h->agent ? SPEAKER_AGENT : SPEAKER_USER;
}

/* What a history message of the view costs (the away block's lines cost less each, and the
 * block once its header; see select_view). */
static uint64_t view_cost(const hentry *h) {
  return tok_len(said_len(speaker_of(h), h->sender_len, h->body_len)) + ITEM_OVERHEAD;
}

static uint64_t section_cost(const hentry *h, const char *channel_name) {
  return tok(channel_name) + tok_len(h->sender_len) + tok_len(h->body_len) + ITEM_OVERHEAD;
}

/* h's speaker and whether conversation_history may list it, from its held sender: pointers
 * compared, exactly as the strings would be (chantail.h). */
static void entry_classify(ctx *c, hentry *h) {
  h->own = h->sender == c->id_sender;
  h->agent = !h->own && is_agent(c, h->sender);
  h->for_section = h->own;
  for (size_t i = 0; i < c->ti->n_staged && !h->for_section; i++)
    h->for_section = h->sender == c->staged_sender[i];
}

typedef enum copy_kind { NOT_A_COPY, STAGED_COPY, WAITING_COPY } copy_kind;

/* Whether a history entry of view v (its sender, body and time) is one of the session's inbox
 * entries under another event id: one of the turn's staged messages (STAGED_COPY), or one
 * still waiting in its inbox for a later turn (WAITING_COPY). With the cluster log each
 * session gets its own copy of a channel event (DESIGN §14), and a node's channel history
 * holds the first copy applied there — the channel owner's, or another session's — the later
 * ones folding into it as exact repeats; so the session's copy need not be the one the history
 * holds. Every copy carries the time the event was accepted, so the same channel, sender, body
 * and time is the same message: the current message, or a later turn's trigger — not history,
 * as its own copy would not be (found by id before this is asked). Without the log an inbox
 * entry's event is its own history entry, and two events that merely look alike (the same
 * words in the same millisecond) stay two: so this is asked only with the log. */
static copy_kind log_copy(const ctx *c, size_t v, const char *sender, size_t sender_len,
                          const char *body, int64_t ts_ms) {
  if (!c->log_copies)
    return NOT_A_COPY;
  const cph_turn_info *ti = c->ti;
  const char *view_channel = ti->views[v].channel;
  for (size_t i = 0; i < ti->n_staged; i++) {
    const cph_staged_msg *m = &ti->staged[i];
    if (m->ts_ms == ts_ms && m->body && c->staged_len[i] == sender_len &&
        memcmp(m->sender, sender, sender_len) == 0 && strcmp(m->body, body) == 0 &&
        strcmp(m->channel, view_channel) == 0)
      return STAGED_COPY;
  }
  for (size_t i = 0; i < c->n_waiting; i++) {
    const cph_event_rec *e = &c->waiting[i].ev;
    if (e->ts_ms == ts_ms && c->waiting[i].sender_len == sender_len &&
        memcmp(e->sender, sender, sender_len) == 0 && strcmp(e->body, body) == 0 &&
        strcmp(e->channel, view_channel) == 0)
      return WAITING_COPY;
  }
  return NOT_A_COPY;
}

/* With the log (log_copy): the channel, sender, body and time of the first event of each of
 * the session's live inbox entries this turn does not stage. One read each, in cluster mode
 * only; an event retention removed, or whose payload is gone, has nothing to be shown by. */
static int load_waiting(ctx *c) {
  static const char *const fields[] = {"channel", "sender", "body", "ts_ms"};
  uint64_t mask = cph_record_field_mask(&cph_event_desc, fields, 4);
  const csession *s = c->s;
  size_t n = 0;
  for (uint32_t i = 0; i < s->n_inbox; i++)
    n += !idset_has(&c->staged_events, s->inbox[i].event_id);
  if (!n)
    return CPH_OK;
  if (!(c->waiting = calloc(n, sizeof *c->waiting)))
    return CPH_ENOMEM;
  for (uint32_t i = 0; i < s->n_inbox; i++) {
    uint64_t id = s->inbox[i].event_id;
    if (idset_has(&c->staged_events, id))
      continue;
    cph_key k = cph_key_of_u64(id);
    struct waiting_copy *w = &c->waiting[c->n_waiting];
    int rc = cph_txn_get_record_some(c->t, CPH_DB_EVENTS, &k, &cph_event_desc, &w->ev, mask);
    if (rc == CPH_ENOTFOUND)
      continue;
    if (rc)
      return rc;
    if (!w->ev.channel || !w->ev.sender || !w->ev.body) {
      cph_record_free(&cph_event_desc, &w->ev);
      memset(&w->ev, 0, sizeof w->ev);
      continue;
    }
    w->sender_len = strlen(w->ev.sender);
    c->n_waiting++;
  }
  return CPH_OK;
}

/* scan_channel without warm tails (:sessions :warm-channels 0): walks the channel log in the
 * store and reads each event shown, every turn — the context rebuilt from the store, which
 * the warm one must equal (tests/unit/test_warm_context_property.c). Its entries own their
 * strings. */
static int scan_channel_store(ctx *c, size_t v, uint64_t messages_budget, int max_reads) {
  cph_channel_view *view = &c->ti->views[v];
  const char *chan = view->channel;
  size_t prefix = strlen(chan) + 1;
  cph_cursor cur;
  int rc = cph_cursor_open(c->t, CPH_DB_CHANNEL_LOG, &cur);
  if (rc)
    return rc;
  cph_key end;
  cph_key_reset(&end);
  cph_key_str(&end, chan);
  cph_key_u64(&end, UINT64_MAX);
  cph_val k, val;
  rc = cph_cursor_seek(&cur, &end, &k, &val);
  rc = rc == CPH_OK || rc == CPH_ENOTFOUND ? cph_cursor_prev(&cur, &k, &val) : rc;
  uint64_t section_seen = 0, messages_seen = 0; /* lower bounds of what was read */
  for (int scanned = 0; rc == CPH_OK && scanned < max_reads;
       scanned++, rc = cph_cursor_prev(&cur, &k, &val)) {
    if (k.len != prefix + 8 || memcmp(k.data, chan, prefix) != 0 || val.len != 8)
      break;
    uint64_t index = cph_be64_get((const uint8_t *)k.data + prefix);
    uint64_t event_id = cph_be64_get(val.data);
    if (!view->seen_index)
      view->seen_index = index; /* the newest entry: what the turn saw */
    if (idset_has(&c->staged_events, event_id)) {
      c->vs[v].staged_found = true;
      c->vs[v].oldest_staged_index = index; /* read newest first: the last one is the oldest */
      continue;
    }
    if (idset_has(&c->inbox_events, event_id))
      continue; /* a later turn's trigger */
    if (section_seen >= c->history_budget && messages_seen >= messages_budget)
      break;
    /* sender, body and time: from the event cache, else the store (then cached) */
    const cph_evcache_entry *ce = cph_evcache_get(c->cx->tails->evcache, event_id);
    cph_event_rec ev = {0};
    if (ce) {
      ev.ts_ms = ce->ts_ms;
      ev.sender = strdup(ce->sender);
      ev.body = ce->body ? strdup(ce->body) : NULL;
      if (!ev.sender || (ce->body && !ev.body)) {
        cph_record_free(&cph_event_desc, &ev);
        rc = CPH_ENOMEM;
        break;
      }
    } else {
      cph_key ek = cph_key_of_u64(event_id);
      int erc = cph_txn_get_record_some(c->t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev,
                                        c->cx->tails->event_fields);
      if (erc == CPH_ENOTFOUND)
        continue; /* retention removed it */
      if (erc) {
        rc = erc;
        break;
      }
      cph_evcache_put(c->cx->tails->evcache, event_id, ev.ts_ms, ev.sender, ev.body);
    }
    copy_kind copy = ev.body ? log_copy(c, v, ev.sender, strlen(ev.sender), ev.body, ev.ts_ms)
                             : NOT_A_COPY;
    if (copy == STAGED_COPY) {
      c->vs[v].staged_found = true;
      c->vs[v].oldest_staged_index = index;
      if (idset_add(&c->staged_copies, event_id))
        rc = CPH_ENOMEM;
    } else if (copy == WAITING_COPY) {
      /* a later turn's trigger */
    } else if (ev.body) { /* a redacted payload has nothing to show */
      hentry h = {0};
      h.event_id = event_id;
      h.index = index;
      h.view = v;
      h.sender = chantails_sender(c->cx->tails, ev.sender);
      h.body = ev.body;
      h.sender_len = strlen(ev.sender);
      h.body_len = strlen(ev.body);
      h.ts_ms = ev.ts_ms;
      h.owned = true;
      if (h.sender)
        entry_classify(c, &h);
      if (h.sender && entry_push(c, &h) == CPH_OK) {
        ev.body = NULL; /* moved into the entry */
        messages_seen += tok_len(h.body_len);
        if (h.for_section)
          section_seen += tok_len(h.body_len);
      } else {
        rc = CPH_ENOMEM;
        c->agent_memo = NULL; /* it may be h.sender, dropped here */
        chantails_sender_drop(c->cx->tails, h.sender);
      }
    }
    cph_record_free(&cph_event_desc, &ev);
    if (rc == CPH_ENOMEM)
      break;
  }
  cph_cursor_close(&cur);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* Reads view v's channel from its newest entry back, until the entries read cover both the
 * section's and the messages' history budgets (or max_reads). The entries and their events
 * come from the channel's warm tail (chantail.h); the history entries borrow its strings. */
static int scan_channel(ctx *c, size_t v, uint64_t messages_budget, int max_reads) {
  if (!c->cx->env->policy->sessions.warm_channels)
    return scan_channel_store(c, v, messages_budget, max_reads);
  cph_channel_view *view = &c->ti->views[v];
  chantail *tl;
  int rc = chantails_get(c->cx->tails, c->t, view->channel, &tl);
  if (rc)
    return rc;
  uint64_t section_seen = 0, messages_seen = 0; /* lower bounds of what was read */
  chantail_entry *e;
  for (int scanned = 0;
       scanned < max_reads && (e = chantail_newest(tl, c->t, (size_t)scanned, &rc)) != NULL;
       scanned++) {
    if (!view->seen_index)
      view->seen_index = e->index; /* the newest entry: what the turn saw */
    if (idset_has(&c->staged_events, e->event_id)) {
      c->vs[v].staged_found = true;
      c->vs[v].oldest_staged_index = e->index; /* read newest first: the last is the oldest */
      continue;
    }
    if (idset_has(&c->inbox_events, e->event_id))
      continue; /* a later turn's trigger */
    if (section_seen >= c->history_budget && messages_seen >= messages_budget)
      break;
    if ((rc = chantail_load(c->cx->tails, c->t, e)) != CPH_OK)
      break;
    if (!e->sender || !e->body)
      continue; /* retention removed the event, or redacted its payload: nothing to show */
    copy_kind copy = log_copy(c, v, e->sender, e->sender_len, e->body, e->ts_ms);
    if (copy == STAGED_COPY) {
      c->vs[v].staged_found = true;
      c->vs[v].oldest_staged_index = e->index;
      if ((rc = idset_add(&c->staged_copies, e->event_id)) != CPH_OK)
        break;
    }
    if (copy != NOT_A_COPY)
      continue; /* the current message, or a later turn's trigger */
    hentry h = {0};
    h.event_id = e->event_id;
    h.index = e->index;
    h.view = v;
    h.sender = e->sender;
    h.body = e->body;
    h.sender_len = e->sender_len;
    h.body_len = e->body_len;
    h.ts_ms = e->ts_ms;
    entry_classify(c, &h);
    if ((rc = entry_push(c, &h)) != CPH_OK)
      break;
    messages_seen += tok_len(h.body_len);
    if (h.for_section)
      section_seen += tok_len(h.body_len);
  }
  return rc;
}

static int entry_cmp(const void *a, const void *b) {
  const hentry *x = a, *y = b;
  return x->event_id < y->event_id ? -1 : x->event_id > y->event_id;
}

/* By the time the message was accepted, then in event order (cluster mode: entries_sort). */
static int entry_time_cmp(const void *a, const void *b) {
  const hentry *x = a, *y = b;
  if (x->ts_ms != y->ts_ms)
    return x->ts_ms < y->ts_ms ? -1 : 1;
  return entry_cmp(a, b);
}

/* The entries in event order. A channel is read newest first, so one view's entries come
 * strictly descending: they are reversed rather than sorted (qsort's merge sort moved each
 * entry about nine times, 5% of a lease's instructions); several views' are sorted.
 * Cluster mode (log_copies): in the order their messages were accepted. A node's copy of a
 * channel gets the other nodes' entries late — a reply another node's session wrote, an event
 * its channel's owner applied after newer ones (server/clusterflow.h 3., 14.) — at the end of
 * its log, and every copy carries the time its message was accepted (fixed where it was): so
 * a turn shows the conversation in the order it happened, the same on every node, not in the
 * order this node's copy got it. Which entries are seen and which come in the away block
 * stays by the channel's index (classify): a late copy the session has not seen is away. */
static void entries_sort(ctx *c) {
  hentry *e = c->entries;
  size_t n = c->n_entries;
  bool asc = true, desc = true;
  for (size_t i = 1; i < n && (asc || desc); i++) {
    asc = asc && e[i - 1].event_id < e[i].event_id;
    desc = desc && e[i - 1].event_id > e[i].event_id;
  }
  if (!asc && !desc) {
    qsort(e, n, sizeof *e, entry_cmp);
  } else if (!asc) { /* descending */
    for (size_t i = 0, j = n - 1; i < j; i++, j--) {
      hentry tmp = e[i];
      e[i] = e[j];
      e[j] = tmp;
    }
  }
  if (!c->log_copies)
    return;
  for (size_t i = 1; i < n; i++)
    if (entry_time_cmp(&e[i - 1], &e[i]) > 0) { /* a late copy: rare, so checked first */
      qsort(e, n, sizeof *e, entry_time_cmp);
      return;
    }
}

/* Where each view starts (context.h) and which entries are in the away block. */
static void classify(ctx *c) {
  cph_turn_info *ti = c->ti;
  for (size_t v = 0; v < ti->n_views; v++) {
    cph_channel_view *view = &ti->views[v];
    if (view->had_cursor)
      continue;
    if (c->vs[v].mentioned && !c->vs[v].subscribed)
      view->cursor = 0; /* first mentioned mid-conversation: it sees all history */
    else if (c->vs[v].staged_found)
      view->cursor = c->vs[v].oldest_staged_index - 1;
    else
      view->cursor = 0; /* its oldest staged message is older than everything read */
  }
  for (size_t i = 0; i < c->n_entries; i++) {
    hentry *h = &c->entries[i];
    h->away = !h->own && h->index > ti->views[h->view].cursor;
  }
}

/* conversation_history: the newest section entries that fit, listed oldest first. */
static int select_section(ctx *c) {
  cph_turn_info *ti = c->ti;
  uint64_t used = 0;
  size_t n = 0;
  uint32_t cut = 0;
  bool full = false;
  for (size_t i = c->n_entries; i-- > 0;) {
    hentry *h = &c->entries[i];
    if (!h->for_section)
      continue;
    uint64_t cost = section_cost(h, ti->views[h->view].channel);
    if (full || used + cost > c->history_budget) {
      full = true; /* oldest cut first: nothing older gets in after a cut */
      cut++;
      continue;
    }
    used += cost;
    h->in_section = true;
    n++;
  }
  if (!wanted(c, CPH_PART_HISTORY))
    n = 0; /* selected all the same: the memory section skips what the history shows */
  if (n) {
    ti->history = malloc(n * sizeof *ti->history); /* each entry written whole below */
    if (!ti->history)
      return CPH_ENOMEM;
  }
  for (size_t i = 0; n && i < c->n_entries; i++) {
    hentry *h = &c->entries[i];
    if (!h->in_section)
      continue;
    cph_history_entry *he = &ti->history[ti->n_history++];
    he->event_id = h->event_id;
    he->ts_ms = h->ts_ms;
    he->channel = ti->views[h->view].channel; /* the view's, freed with the turn */
    he->sender = sender_copy(c, h->sender, h->sender_len, false);
    he->body = h->body_copy = cph_arena_strndup(&ti->strings, h->body, h->body_len);
    if (!he->sender || !he->body)
      return CPH_ENOMEM;
  }
  ti->tokens.conversation_history = clamp32(used);
  ti->tokens.history_cut = cut;
  c->carry = c->history_budget - used;
  return CPH_OK;
}

/* The messages' history part: the newest entries that fit budget, oldest cut first. */
static void select_view(ctx *c, uint64_t budget) {
  uint64_t used = 0;
  bool away_started = false, full = false;
  uint32_t cut = 0;
  for (size_t i = c->n_entries; i-- > 0;) {
    hentry *h = &c->entries[i];
    uint64_t cost = h->away ? tok_len(prefixed_len(h) + 1) : view_cost(h);
    if (h->away && !away_started)
      cost += tok(AWAY_HEADER) + ITEM_OVERHEAD;
    if (full || used + cost > budget) {
      full = true;
      cut++;
      continue;
    }
    used += cost;
    away_started |= h->away;
    h->in_messages = true;
    if (h->away)
      c->ti->views[h->view].away++;
  }
  c->ti->tokens.messages_cut += cut;
}

static int note_shown(ctx *c) {
  for (size_t i = 0; i < c->ti->n_staged; i++)
    if (idset_add(&c->shown_events, c->ti->staged[i].event_id))
      return CPH_ENOMEM;
  for (size_t i = 0; i < c->staged_copies.n; i++)
    if (idset_add(&c->shown_events, c->staged_copies.v[i]))
      return CPH_ENOMEM;
  for (size_t i = 0; i < c->n_entries; i++)
    if ((c->entries[i].in_section || c->entries[i].in_messages) &&
        idset_add(&c->shown_events, c->entries[i].event_id))
      return CPH_ENOMEM;
  idset_sort(&c->shown_events);
  return CPH_OK;
}

/* ---------------------------------------------------------------- 4. recent_memory */

static const char *memory_kind_name(uint8_t k) {
  static const char *const names[] = {"raw", "summary", "aggregate"};
  return k < 3 ? names[k] : "unknown";
}

typedef struct mcand {
  const cph_memory_rec *m; /* borrowed (memory_borrow): valid through this turn's assembly */
  uint64_t cost;
  bool take;
} mcand;

typedef struct mlist {
  mcand *v;
  size_t n, cap;
  uint64_t cost; /* sum */
} mlist;

static int mlist_push(mlist *l, const cph_memory_rec *m) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    mcand *p = realloc(l->v, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    l->v = p;
    l->cap = cap;
  }
  mcand *mc = &l->v[l->n++];
  mc->m = m;
  mc->cost = tok(m->text) + ITEM_OVERHEAD;
  mc->take = false;
  l->cost += mc->cost;
  return CPH_OK;
}

static bool mlist_has(const mlist *l, uint64_t id) {
  for (size_t i = 0; i < l->n; i++)
    if (l->v[i].m->id == id)
      return true;
  return false;
}

static void mlist_free(mlist *l) {
  free(l->v); /* the records are borrowed */
  memset(l, 0, sizeof *l);
}

static int mcand_newest_first(const void *a, const void *b) {
  const mcand *x = a, *y = b;
  return x->m->id > y->m->id ? -1 : x->m->id < y->m->id;
}

/* The scopes the section reads: the session's own, and its channels' ("#channel") — an inbox
 * turn's the channels of its messages (its direct channel when one was sent to it alone), any
 * other turn's every channel it listens to, its direct channel included (what was said to it
 * alone is as much its own as the channels'; DESIGN §7). */
static int memory_scopes(ctx *c, char ***out, size_t *n) {
  const cph_turn_info *ti = c->ti;
  const cph_session_rec *rec = c->rec;
  size_t cap = 1 + (c->inbox ? ti->n_views : 1 + (size_t)rec->n_subscribe + rec->n_member);
  char **sc = calloc(cap, sizeof *sc);
  if (!sc)
    return CPH_ENOMEM;
  *out = sc;
  *n = 0;
  if (!(sc[(*n)++] = strdup(c->s->id)))
    return CPH_ENOMEM;
  for (size_t i = 0; c->inbox && i < ti->n_views; i++)
    if (!(sc[(*n)++] = concat3("#", ti->views[i].channel, "")))
      return CPH_ENOMEM;
  if (!c->inbox && !(sc[(*n)++] = concat3("#direct:", c->s->id, "")))
    return CPH_ENOMEM;
  for (uint32_t i = 0; !c->inbox && i < rec->n_subscribe; i++)
    if (!(sc[(*n)++] = concat3("#", rec->subscribe[i], "")))
      return CPH_ENOMEM;
  for (uint32_t i = 0; !c->inbox && i < rec->n_member; i++)
    if (!(sc[(*n)++] = concat3("#", rec->member[i], "")))
      return CPH_ENOMEM;
  return CPH_OK;
}

static bool scope_in(const char *scope, char **scopes, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(scope, scopes[i]) == 0)
      return true;
  return false;
}

static bool memory_gone(const cph_memory_rec *m) {
  return m->deleted || m->embed_status == CPH_EMBED_DELETED;
}

/* The live memory standing in for a deleted one: its replaced_by chain followed (borrowed).
 * CPH_ENOTFOUND when the chain ends without one. */
static int stand_in(ctx *c, uint64_t id, const cph_memory_rec **out) {
  for (int hops = 0; id && hops < REPLACED_HOPS_MAX; hops++) {
    int rc = memory_borrow(c->cx->memory, c->t, id, out, "recent_memory");
    if (rc)
      return rc;
    if (!memory_gone(*out))
      return CPH_OK;
    id = (*out)->replaced_by;
  }
  return CPH_ENOTFOUND;
}

/* One scope's entries of one class in the memory index (memory.h), newest first. */
typedef memory_scope_cursor scope_walk;

static int scope_walk_open(cph_txn *t, const char *scope, bool raw, scope_walk *w) {
  int rc = memory_scope_open(t, scope, raw, w);
  if (rc == CPH_OK)
    rc = memory_scope_newest(w);
  if (rc)
    memory_scope_close(w);
  return rc;
}

/* The newest memory id not yet taken over all walks (merging them), 0 when none is left;
 * *source is its source event. A walk that fails to step ends (as a failed step did). */
static uint64_t scope_walks_next(scope_walk *w, size_t n, uint64_t *source) {
  size_t best = n;
  for (size_t i = 0; i < n; i++)
    if (w[i].id && (best == n || w[i].id > w[best].id))
      best = i;
  if (best == n)
    return 0;
  uint64_t id = w[best].id;
  *source = w[best].source;
  if (memory_scope_older(&w[best]) != CPH_OK)
    w[best].id = 0;
  return id;
}

/* Reads the turn's scopes' memories of one class (raw, or summaries and aggregates) newest
 * first into `to` until it could fill `budget` or its item cap, reading at most
 * MEMORY_SCAN_MAX records. Through the index, other sessions' memories and the other class
 * cost nothing. Gone memories add their replaced_by to `replaced`. */
static int scan_class(ctx *c, char **scopes, size_t n_scopes, bool raw, uint64_t budget, mlist *to,
                      idset *replaced) {
  size_t cap = raw ? CONTEXT_RAW_ITEMS_MAX : OTHER_ITEMS_MAX;
  scope_walk *walks = calloc(n_scopes ? n_scopes : 1, sizeof *walks);
  if (!walks)
    return CPH_ENOMEM;
  size_t n_walks = 0;
  int rc = CPH_OK;
  while (n_walks < n_scopes &&
         (rc = scope_walk_open(c->t, scopes[n_walks], raw, &walks[n_walks])) == CPH_OK)
    n_walks++;
  uint64_t id, source = 0;
  for (int scanned = 0; rc == CPH_OK && scanned < MEMORY_SCAN_MAX && to->cost < budget &&
                        to->n < cap && (id = scope_walks_next(walks, n_walks, &source)) != 0;
       scanned++) {
    if (raw && source && idset_has(&c->shown_events, source))
      continue; /* its event is in the turn already: not read at all */
    const cph_memory_rec *m;
    int grc = memory_borrow(c->cx->memory, c->t, id, &m, "recent_memory");
    if (grc == CPH_ENOTFOUND) /* undecodable (warned), or in the scope index but not stored */
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    if (memory_gone(m)) { /* never shown; its summary stands in for it */
      if (m->replaced_by && idset_add(replaced, m->replaced_by))
        rc = CPH_ENOMEM;
    } else if (!(m->kind == CPH_MEMORY_RAW && m->source_event_id &&
                 idset_has(&c->shown_events, m->source_event_id))) { /* not shown already */
      rc = mlist_push(to, m);
    }
  }
  for (size_t i = 0; i < n_walks; i++)
    memory_scope_close(&walks[i]);
  free(walks);
  return rc;
}

/* Fills raw and other candidates (DESIGN §6 recent_memory): each class newest first until it
 * could fill its budget, then the stand-ins of gone memories the scans met. */
static int scan_memories(ctx *c, char **scopes, size_t n_scopes, uint64_t raw_budget,
                         uint64_t budget, mlist *raw, mlist *other) {
  idset replaced = {0};
  int rc = scan_class(c, scopes, n_scopes, true, raw_budget, raw, &replaced);
  if (rc == CPH_OK)
    rc = scan_class(c, scopes, n_scopes, false, budget, other, &replaced);
  /* Summaries are newer than their sources, so most stand-ins were read already; the rest
   * (a chain, or a summary past the scan) are fetched. */
  for (size_t i = 0; rc == CPH_OK && i < replaced.n; i++) {
    if (mlist_has(raw, replaced.v[i]) || mlist_has(other, replaced.v[i]))
      continue;
    const cph_memory_rec *m;
    int grc = stand_in(c, replaced.v[i], &m);
    if (grc == CPH_ENOTFOUND)
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    mlist *to = m->kind == CPH_MEMORY_RAW ? raw : other;
    if (mlist_has(raw, m->id) || mlist_has(other, m->id) ||
        !scope_in(m->session, scopes, n_scopes) ||
        to->n >= (to == raw ? CONTEXT_RAW_ITEMS_MAX : OTHER_ITEMS_MAX))
      continue;
    rc = mlist_push(to, m);
  }
  idset_free(&replaced);
  if (other->n)
    qsort(other->v, other->n, sizeof *other->v, mcand_newest_first);
  return rc;
}

/* Lists mc in the turn. Inclusion counts as an access (DESIGN §7): the lease notes it once it
 * started (turns.c, memaccess.h), and the count listed is the one after this access — the
 * record's, what is counted but not yet written, and this one. */
static int memory_include(ctx *c, const mcand *mc) {
  const cph_memory_rec *m = mc->m;
  uint64_t pending = 0;
  int64_t last_ms = 0;
  memaccess_pending(&c->cx->memory->access, m->id, &pending, &last_ms);
  cph_memory_item *it = &c->ti->memories[c->ti->n_memories++];
  it->id = m->id;
  const char *kind = memory_kind_name(m->kind);
  it->created_ms = m->created_ms;
  it->access_count = m->access_count + pending + 1;
  return pack3(c->ti, kind, strlen(kind), m->session, strlen(m->session), m->text,
               strlen(m->text), &it->kind, &it->scope, &it->text)
             ? CPH_OK
             : CPH_ENOMEM;
}

static int build_memory(ctx *c) {
  cph_turn_info *ti = c->ti;
  uint64_t budget = share(c, SHARE_MEMORY) + c->carry;
  uint64_t raw_budget = budget * RAW_SHARE / 100;
  char **scopes = NULL;
  size_t n_scopes = 0;
  mlist raw = {0}, other = {0};
  int rc = memory_scopes(c, &scopes, &n_scopes);
  if (rc == CPH_OK)
    rc = scan_memories(c, scopes, n_scopes, raw_budget, budget, &raw, &other);
  /* Raw first, newest first, inside the raw budget; then summaries and aggregates in what
   * the memory budget has left. Greedy: one that does not fit leaves room for a smaller. */
  uint64_t raw_used = 0, used = 0;
  size_t n = 0;
  for (size_t i = 0; rc == CPH_OK && i < raw.n; i++)
    if (raw_used + raw.v[i].cost <= raw_budget) {
      raw_used += raw.v[i].cost;
      raw.v[i].take = true;
      n++;
    }
  used = raw_used;
  for (size_t i = 0; rc == CPH_OK && i < other.n; i++)
    if (used + other.v[i].cost <= budget) {
      used += other.v[i].cost;
      other.v[i].take = true;
      n++;
    }
  if (rc == CPH_OK && n && !(ti->memories = calloc(n, sizeof *ti->memories)))
    rc = CPH_ENOMEM;
  for (size_t i = 0; rc == CPH_OK && i < raw.n; i++)
    if (raw.v[i].take)
      rc = memory_include(c, &raw.v[i]);
  for (size_t i = 0; rc == CPH_OK && i < other.n; i++)
    if (other.v[i].take)
      rc = memory_include(c, &other.v[i]);
  ti->tokens.recent_memory = clamp32(used);
  c->carry = budget >= used ? budget - used : 0;
  mlist_free(&raw);
  mlist_free(&other);
  for (size_t i = 0; i < n_scopes; i++)
    free(scopes[i]);
  free(scopes);
  return rc;
}

/* ---------------------------------------------------------------- messages */

static int depth_rank(int32_t d) { return d < 0 ? 0 : d == 0 ? 2 : 1; }

/* PACT render order on coordinates: depth -1; history deepest (oldest) first; depth 0; then
 * position, then offset. */
static int coord_cmp(const cph_coord *a, const cph_coord *b) {
  int ra = depth_rank(a->depth), rb = depth_rank(b->depth);
  if (ra != rb)
    return ra < rb ? -1 : 1;
  if (a->depth != b->depth)
    return a->depth > b->depth ? -1 : 1;
  if (a->position != b->position)
    return a->position < b->position ? -1 : 1;
  return a->offset < b->offset ? -1 : a->offset > b->offset;
}

static uint64_t message_cost(const char *content) { return tok(content) + ITEM_OVERHEAD; }

/* A tree core the channel view replaces (inbox turns) — not rendered at all. */
static bool tree_core(const cph_pact_node *n) { return n->role != NULL; }

/* A tree core that is cut-able history (other turns). */
static bool tree_history_core(const cph_pact_node *n) { return n->role && n->at.depth >= 1; }

static const char *role_name(speaker who) {
  return who == SPEAKER_OWN ? "assistant" : who == SPEAKER_AGENT ? "system" : "user";
}

/* Appends one core message; content (len bytes) is in the turn's arena (NULL: out of
 * memory). */
static int add_ritem(ritem *v, size_t *n, int32_t depth, const char *role, char *content,
                     size_t len) {
  if (!content)
    return CPH_ENOMEM;
  v[(*n)++] = (ritem){{depth, 0, 0}, role, content, len, NULL};
  return CPH_OK;
}

/* Appends what sender (held: chantails_sender) said, content (len bytes) in the turn's arena,
 * in its role; a user's message carries the sender as its name. */
static int add_said(ctx *c, ritem *v, size_t *n, int32_t depth, speaker who, const char *sender,
                    char *content, size_t len) {
  int rc = add_ritem(v, n, depth, role_name(who), content, len);
  if (rc == CPH_OK && who == SPEAKER_USER && !(v[*n - 1].name = sender_copy(c, sender, 0, true)))
    rc = CPH_ENOMEM;
  return rc;
}

static speaker speaker_by_name(const ctx *c, const char *sender) {
  if (strcmp(sender, c->s->id) == 0)
    return SPEAKER_OWN;
  return sessions_get(c->cx->sessions, sender) ? SPEAKER_AGENT : SPEAKER_USER;
}

/* Whether several distinct people (users: neither the session nor another agent) speak in
 * the turn's channel-view messages: the history shown, the away block and the triggers.
 * Senders are compared as held pointers (entries' and staged_sender: one string per sender). */
static bool several_people(const ctx *c) {
  const char *first = NULL;
  for (size_t i = 0; i < c->n_entries; i++) {
    const hentry *h = &c->entries[i];
    if (!h->in_messages || speaker_of(h) != SPEAKER_USER)
      continue;
    if (first && first != h->sender)
      return true;
    first = h->sender;
  }
  for (size_t i = 0; i < c->ti->n_staged; i++) {
    const char *sender = c->staged_sender[i];
    if (speaker_by_name(c, sender) != SPEAKER_USER)
      continue;
    if (first && first != sender)
      return true;
    first = sender;
  }
  return false;
}

/* The channel view as core messages in render order: history (depth k..1, the away block the
 * newest), then the triggers at depth 0. *out is the scratch's (context_scratch); the strings
 * are the turn's (its arena). */
static int view_items(ctx *c, ritem **out, size_t *n_out) {
  cph_turn_info *ti = c->ti;
  size_t seen = 0, away = 0;
  for (size_t i = 0; i < c->n_entries; i++)
    if (c->entries[i].in_messages)
      c->entries[i].away ? away++ : seen++;
  context_scratch *sc = &c->cx->scratch;
  if (!scratch_room((void **)&sc->items, &sc->cap_items, seen + 1 + ti->n_staged, sizeof(ritem)))
    return CPH_ENOMEM;
  ritem *v = sc->items;
  size_t n = 0;
  int rc = CPH_OK;
  bool several = several_people(c);
  int32_t depth = (int32_t)(seen + (away ? 1 : 0));
  for (size_t i = 0; rc == CPH_OK && i < c->n_entries; i++) {
    const hentry *h = &c->entries[i];
    if (!h->in_messages || h->away)
      continue;
    speaker who = speaker_of(h);
    size_t len;
    char *content =
        say(ti, who, several, h->sender, h->sender_len, h->body, h->body_len, h->body_copy, &len);
    rc = add_said(c, v, &n, depth--, who, h->sender, content, len);
  }
  if (rc == CPH_OK && away) {
    cph_buf b = CPH_BUF_INIT;
    cph_buf_puts(&b, AWAY_HEADER);
    for (size_t i = 0; i < c->n_entries; i++) {
      const hentry *h = &c->entries[i];
      if (h->in_messages && h->away)
        cph_buf_printf(&b, "\n[%s] %s", h->sender, h->body);
    }
    rc = add_ritem(v, &n, depth--, "system",
                   cph_buf_error(&b) ? NULL : cph_arena_strndup(&ti->strings, b.data, b.len), b.len);
    cph_buf_free(&b);
  }
  for (size_t i = 0; rc == CPH_OK && i < ti->n_staged; i++) {
    const cph_staged_msg *m = &ti->staged[i];
    speaker who = speaker_by_name(c, m->sender);
    const char *body = m->body ? m->body : "";
    size_t len;
    char *content = say(ti, who, several, m->sender, c->staged_len[i], body, strlen(body), NULL, &len);
    rc = add_said(c, v, &n, 0, who, c->staged_sender[i], content, len);
  }
  *out = v;
  *n_out = n;
  return rc;
}

/* A role that outlives the turn: the literal when it is one a message takes (a tree's cores
 * are "user" or "assistant", pact.h; other nodes render as "system"), else a copy in the
 * turn's arena. NULL without memory. */
static const char *lasting_role(cph_turn_info *ti, const char *role) {
  static const char *const ROLES[] = {"system", "user", "assistant"};
  for (size_t i = 0; i < sizeof ROLES / sizeof ROLES[0]; i++)
    if (strcmp(role, ROLES[i]) == 0)
      return ROLES[i];
  return cph_arena_strndup(&ti->strings, role, strlen(role));
}

/* Appends a message in role (a string that outlives the turn: a literal, or lasting_role's);
 * `owned`, when set, is content already in the turn's arena (owned_len bytes, taken as it is),
 * else content is copied there; name (may be NULL) is in the arena too. */
static int push_message(cph_turn_info *ti, const char *role, const char *content, char *owned,
                        size_t owned_len, char *name, const cph_coord *at) {
  char coord[CORE_COORD_MAX];
  size_t coord_len = cph_coord_format(at, coord);
  cph_message *m = &ti->messages[ti->n_messages++];
  const char *text = content ? content : "";
  size_t len = owned ? owned_len : strlen(text);
  m->role = (char *)role;
  m->coord = cph_arena_strndup(&ti->strings, coord, coord_len);
  m->content = owned ? owned : cph_arena_strndup(&ti->strings, text, len);
  bool ok = role && m->coord && m->content;
  m->name = name;
  m->content_len = len;
  m->coord_len = coord_len;
  m->depth = at->depth;
  m->position = at->position;
  m->offset = at->offset;
  m->measured = true;
  ti->tokens.messages = clamp32((uint64_t)ti->tokens.messages + tok_len(len) + ITEM_OVERHEAD);
  return ok ? CPH_OK : CPH_ENOMEM;
}

/* The cost of what messages never cut: the system prompt, tree nodes that are not history
 * (or, on an inbox turn, not cores), and the current message(s). */
static uint64_t fixed_messages_cost(ctx *c) {
  uint64_t cost = c->rec->system ? message_cost(c->rec->system) : 0;
  for (size_t i = 0; c->tr->ok && i < c->tr->tree.n; i++) {
    const cph_pact_node *nd = &c->tr->tree.nodes[i];
    if (nd->waiting || (c->inbox ? tree_core(nd) : tree_history_core(nd)))
      continue;
    cost += message_cost(nd->content);
  }
  if (c->inbox) {
    for (size_t i = 0; i < c->ti->n_staged; i++) {
      const cph_staged_msg *m = &c->ti->staged[i];
      cost += tok_len(said_len(speaker_by_name(c, m->sender), strlen(m->sender),
                               m->body ? strlen(m->body) : 0)) +
              ITEM_OVERHEAD;
    }
  } else {
    cost += message_cost(c->ti->input);
  }
  return cost;
}

/* Fills ti->messages: the system prompt, then the tree's nodes merged with the channel view
 * (inbox) or the input (other turns), history cut to messages_budget. */
static int build_messages(ctx *c, uint64_t messages_budget) {
  cph_turn_info *ti = c->ti;
  const cph_pact_tree *tree = &c->tr->tree;
  size_t live = c->tr->ok ? c->tr->n_live : 0;
  context_scratch *sc = &c->cx->scratch;
  if (!scratch_room((void **)&sc->order, &sc->cap_order, live, sizeof *sc->order))
    return CPH_ENOMEM;
  size_t *idx = sc->order; /* the render order, SIZE_MAX where cut */
  if (live)
    memcpy(idx, c->tr->order, live * sizeof *idx);
  /* Which tree nodes render: on an inbox turn all but the cores; otherwise all, with the
   * history cores cut oldest (deepest) first to the budget. */
  size_t kept = 0;
  uint64_t used = 0;
  bool full = false;
  for (size_t i = live; i-- > 0;) {
    const cph_pact_node *nd = &tree->nodes[idx[i]];
    bool keep;
    if (c->inbox) {
      keep = !tree_core(nd);
    } else if (tree_history_core(nd)) {
      uint64_t cost = message_cost(nd->content);
      keep = !full && used + cost <= messages_budget;
      if (keep)
        used += cost;
      else
        ti->tokens.messages_cut++;
      full |= !keep;
    } else {
      keep = true;
    }
    if (!keep)
      idx[i] = SIZE_MAX;
    else
      kept++;
  }
  ritem *extra = NULL;
  size_t n_extra = 0;
  int rc = CPH_OK;
  if (c->inbox) {
    rc = view_items(c, &extra, &n_extra);
  } else if (scratch_room((void **)&sc->items, &sc->cap_items, 1, sizeof *extra)) {
    extra = sc->items;
    const char *input = ti->input ? ti->input : "";
    size_t len = strlen(input);
    rc = add_ritem(extra, &n_extra, 0, "user", cph_arena_strndup(&ti->strings, input, len), len);
  } else {
    rc = CPH_ENOMEM;
  }
  size_t cap = 1 + kept + n_extra;
  /* not zeroed: push_message writes every field of each message it counts */
  if (rc == CPH_OK && !(ti->messages = malloc(cap * sizeof *ti->messages)))
    rc = CPH_ENOMEM;
  if (rc == CPH_OK && c->rec->system) {
    cph_coord sys = {-1, 0, 0};
    rc = push_message(ti, "system", c->rec->system, NULL, 0, NULL, &sys);
  }
  /* Merge two lists already in render order; a channel-view core goes first on a tie. */
  size_t i = 0, j = 0;
  while (rc == CPH_OK && (i < live || j < n_extra)) {
    if (i < live && idx[i] == SIZE_MAX) {
      i++;
      continue;
    }
    const cph_pact_node *nd = i < live ? &tree->nodes[idx[i]] : NULL;
    if (j < n_extra && (!nd || coord_cmp(&extra[j].at, &nd->at) <= 0)) {
      rc = push_message(ti, extra[j].role, NULL, extra[j].content, extra[j].content_len,
                        extra[j].name, &extra[j].at);
      j++;
    } else {
      const char *role = nd->role ? lasting_role(ti, nd->role) : "system";
      rc = push_message(ti, role, nd->content, NULL, 0, NULL, &nd->at);
      i++;
    }
  }
  return rc;
}

/* ---------------------------------------------------------------- assembly */

static void ctx_free(ctx *c) {
  for (size_t i = 0; i < c->n_entries; i++)
    if (c->entries[i].owned) { /* the others' strings are the tails' (chantails_release) */
      chantails_sender_drop(c->cx->tails, c->entries[i].sender);
      free(c->entries[i].body);
    }
  chantails_sender_drop(c->cx->tails, c->id_sender);
  for (size_t i = 0; c->staged_sender && i < c->ti->n_staged; i++)
    chantails_sender_drop(c->cx->tails, c->staged_sender[i]);
  free(c->staged_sender);
  free(c->vs);
  free(c->staged_len);
  for (size_t i = 0; i < c->n_waiting; i++)
    cph_record_free(&cph_event_desc, &c->waiting[i].ev);
  free(c->waiting);
  idset_free(&c->staged_events);
  idset_free(&c->inbox_events);
  idset_free(&c->shown_events);
  idset_free(&c->staged_copies);
}

/* Loads the session's tree into c->tr and orders it. A tree that cannot be read (other than
 * for memory) leaves c->tr not ok and the turn is rendered without it. */
static int load_tree(ctx *c) {
  context_tree *tr = c->tr;
  int rc = trees_load(c->cx->trees, c->t, c->s->id, &tr->tree);
  tr->loaded = true; /* trees_load leaves a tree to free whatever the outcome */
  if (rc == CPH_OK) {
    size_t n = tr->tree.n;
    if (!(tr->order = malloc((n ? n : 1) * sizeof *tr->order)))
      return CPH_ENOMEM;
    size_t k = tr->n_live = cph_pact_render_order(&tr->tree, tr->order);
    for (size_t i = 0; i < n; i++)
      if (tr->tree.nodes[i].waiting)
        tr->order[k++] = i;
    tr->ok = true;
    return CPH_OK;
  }
  if (rc != CPH_ENOMEM && !c->t->ret) {
    /* A tree that cannot be read must not stop the session's turns: render without it. */
    cph_log(CPH_LOG_WARN, "turn of '%s' rendered without its context tree: %s", c->s->id,
            c->t->err.msg[0] ? c->t->err.msg : cph_strerror(rc));
    rc = CPH_OK;
  }
  return rc;
}

void context_tree_hold(cph_context *cx, const char *session, context_tree *tr) {
  tr->held = true;
  if (tr->ok)
    tr->hold = trees_hold(cx->trees, session);
}

void context_tree_release(cph_context *cx, const char *session, context_tree *tr) {
  if (tr->ok && tr->held) /* held past its pass: back only if the session's tree did not change */
    trees_keep_held(cx->trees, tr->hold, session, &tr->tree);
  else if (tr->ok) /* read, never changed: it matches the store as the lease's parent sees it */
    trees_keep(cx->trees, session, &tr->tree);
  if (tr->loaded)
    cph_pact_tree_free(&tr->tree);
  free(tr->order);
  memset(tr, 0, sizeof *tr);
}

static int assemble(ctx *c) {
  cph_turn_info *ti = c->ti;
  build_state(c);
  if (ti->kind == CPH_KIND_JOB)
    return build_tools(c); /* cephalond's own work: no conversation, no memory */
  int rc = build_obligations(c);
  if (rc == CPH_OK)
    rc = build_tools(c);
  for (size_t i = 0; rc == CPH_OK && i < ti->n_staged; i++)
    rc = idset_add(&c->staged_events, ti->staged[i].event_id);
  for (uint32_t i = 0; rc == CPH_OK && i < c->s->n_inbox; i++)
    rc = idset_add(&c->inbox_events, c->s->inbox[i].event_id);
  idset_sort(&c->staged_events);
  idset_sort(&c->inbox_events);
  if (rc == CPH_OK && c->log_copies)
    rc = load_waiting(c);
  if (rc == CPH_OK)
    rc = load_tree(c);
  /* conversation_history and the messages' history part share one budget; messages also
   * stay inside the window with their fixed part. */
  c->history_budget = share(c, SHARE_HISTORY) + c->carry;
  uint64_t fixed = rc == CPH_OK ? fixed_messages_cost(c) : 0;
  uint64_t messages_budget = c->window > fixed ? c->window - fixed : 0;
  if (messages_budget > c->history_budget)
    messages_budget = c->history_budget;
  if (rc == CPH_OK && c->inbox) {
    rc = views_init(c);
    int reads = ti->n_views ? CONTEXT_HISTORY_READS_MAX / (int)ti->n_views : 0;
    if (reads < CONTEXT_HISTORY_READS_MIN)
      reads = CONTEXT_HISTORY_READS_MIN;
    for (size_t v = 0; rc == CPH_OK && v < ti->n_views; v++)
      rc = scan_channel(c, v, messages_budget, reads);
    if (rc == CPH_OK) {
      entries_sort(c);
      classify(c);
      rc = select_section(c);
      select_view(c, messages_budget);
    }
  } else {
    c->carry = c->history_budget; /* `none` on an autonomy tick: its share flows to memory */
  }
  /* Nothing after this point feeds the other parts: what is left out is skipped whole (and
   * a memory not shown is not an access). */
  if (rc == CPH_OK && wanted(c, CPH_PART_MEMORY))
    rc = note_shown(c);
  if (rc == CPH_OK && wanted(c, CPH_PART_MEMORY))
    rc = build_memory(c);
  if (rc == CPH_OK && wanted(c, CPH_PART_MESSAGES))
    rc = build_messages(c, messages_budget);
  return rc;
}

/* What a history entry reads of an event (the record's field table does not change: worked out
 * once). */
void context_init(cph_context *cx, cph_core_env *env, cph_sessions *sessions, cph_trees *trees,
                  cph_chantails *tails, cph_memory *memory) {
  *cx = (cph_context){.env = env, .sessions = sessions, .trees = trees, .tails = tails,
                      .memory = memory};
}

/* The most elements a scratch array keeps between leases: one that a turn over many
 * channels, or a large tree, grew further is given back, not held for the next lease. */
#define SCRATCH_KEEP_MAX (4 * CONTEXT_HISTORY_READS_MAX)

/* Frees scratch array *v when it holds more than max elements. */
static void scratch_cap(void **v, size_t *cap, size_t max) {
  if (*cap > max) {
    free(*v);
    *v = NULL;
    *cap = 0;
  }
}

static void scratch_trim(context_scratch *sc, size_t max) {
  scratch_cap((void **)&sc->entries, &sc->cap_entries, max);
  scratch_cap((void **)&sc->items, &sc->cap_items, max);
  scratch_cap((void **)&sc->order, &sc->cap_order, max);
}

void context_free(cph_context *cx) { scratch_trim(&cx->scratch, 0); }

int context_assemble(cph_context *cx, cph_txn *t, csession *s, const cph_session_rec *rec,
                     cph_turn_info *ti, context_tree *tree) {
  ctx c;
  memset(&c, 0, sizeof c);
  c.cx = cx;
  c.tr = tree;
  c.t = t;
  c.s = s;
  c.rec = rec;
  c.ti = ti;
  c.inbox = ti->kind == CPH_KIND_INBOX && ti->n_staged > 0;
  c.window = rec->context_window_tokens ? rec->context_window_tokens
                                        : (uint64_t)cx->env->policy->sessions.context_window_tokens;
  c.now_ms = cph_wall_ms();
  ti->tokens.window = clamp32(c.window);
  c.log_copies = cx->env->policy->cluster_enabled && cx->env->policy->cluster.nats_count;
  int rc = CPH_OK;
  if (!(c.id_sender = chantails_sender(cx->tails, s->id)))
    rc = CPH_ENOMEM;
  if (rc == CPH_OK && ti->n_staged &&
      (!(c.staged_len = malloc(ti->n_staged * sizeof *c.staged_len)) ||
       !(c.staged_sender = calloc(ti->n_staged, sizeof *c.staged_sender))))
    rc = CPH_ENOMEM;
  for (size_t i = 0; rc == CPH_OK && i < ti->n_staged; i++) {
    c.staged_len[i] = strlen(ti->staged[i].sender);
    if (!(c.staged_sender[i] = chantails_sender(cx->tails, ti->staged[i].sender)))
      rc = CPH_ENOMEM;
  }
  if (rc == CPH_OK)
    rc = assemble(&c);
  ti->tokens.sections = clamp32((uint64_t)ti->tokens.current_state +
                                ti->tokens.pending_obligations + ti->tokens.conversation_history +
                                ti->tokens.recent_memory + ti->tokens.available_tools);
  ctx_free(&c);
  scratch_trim(&cx->scratch, SCRATCH_KEEP_MAX);
  /* The tails the turn borrowed from are free to go now; the policy bounds how many stay. */
  chantails_release(cx->tails, (size_t)cx->env->policy->sessions.warm_channels);
  if (rc && !t->ret && rc != CPH_ENOMEM)
    cph_err_set(&t->err, rc, "assembling the context of '%s': %s", s->id, cph_strerror(rc));
  return rc;
}

void context_turn_free(cph_turn_info *ti) {
  for (size_t i = 0; i < ti->n_obligations; i++) {
    free(ti->obligations[i].sender);
    free(ti->obligations[i].preview);
  }
  free(ti->obligations);
  free(ti->memories); /* their strings are in ti->strings (cph_turn_info_free) */
  for (size_t i = 0; i < ti->n_views; i++)
    free(ti->views[i].channel);
  free(ti->views);
  ti->obligations = NULL;
  ti->memories = NULL;
  ti->views = NULL;
  ti->n_obligations = ti->n_memories = ti->n_views = 0;
}

/* ---------------------------------------------------------------- cursors */

int context_views_copy(context_views *v, const cph_turn_info *ti) {
  if (!ti->n_views)
    return CPH_OK;
  v->channels = calloc(ti->n_views, sizeof *v->channels);
  v->seen = calloc(ti->n_views, sizeof *v->seen);
  if (!v->channels || !v->seen) {
    context_views_free(v);
    return CPH_ENOMEM;
  }
  for (size_t i = 0; i < ti->n_views; i++) {
    if (!(v->channels[i] = strdup(ti->views[i].channel))) {
      context_views_free(v);
      return CPH_ENOMEM;
    }
    v->seen[i] = ti->views[i].seen_index;
    v->n = i + 1;
  }
  return CPH_OK;
}

void context_views_free(context_views *v) {
  for (size_t i = 0; v->channels && i < v->n; i++)
    free(v->channels[i]);
  free(v->channels);
  free(v->seen);
  v->channels = NULL;
  v->seen = NULL;
  v->n = 0;
}

int context_cursor_get(cph_txn *t, const char *session, const char *chan, uint64_t *index) {
  cph_key k = cursor_key(session, chan);
  cph_val val;
  int rc = cph_txn_get(t, CPH_DB_CURSORS, &k, &val);
  if (rc == CPH_OK && val.len != 8)
    return CPH_ENOTFOUND; /* none this build writes: as if it had none */
  if (rc == CPH_OK)
    *index = cph_be64_get(val.data);
  return rc;
}

int context_cursors_advance(cph_txn *t, const char *session, const context_views *v) {
  for (size_t i = 0; i < v->n; i++) {
    if (!v->seen[i])
      continue;
    cph_key k = cursor_key(session, v->channels[i]);
    cph_val old;
    int rc = cph_txn_get(t, CPH_DB_CURSORS, &k, &old);
    if (rc == CPH_OK && old.len == 8 && cph_be64_get(old.data) >= v->seen[i])
      continue; /* never backwards */
    if (rc != CPH_OK && rc != CPH_ENOTFOUND)
      return rc;
    uint8_t val[8];
    cph_be64_put(val, v->seen[i]);
    if ((rc = cph_txn_put(t, CPH_DB_CURSORS, &k, val, sizeof val)))
      return rc;
  }
  return CPH_OK;
}

int context_cursors_delete(cph_txn *t, const char *session) {
  cph_key start;
  cph_key_reset(&start);
  cph_key_str(&start, session);
  return cph_txn_del_prefix(t, CPH_DB_CURSORS, &start);
}
