/* Warm context = rebuilt context (issue #17 item 1), as a property: a turn assembled from the
 * warm channel tails (core/chantail.h) is exactly the turn assembled from the store.
 *
 * Each case runs two engines side by side on the same seeded operations: one keeps few or
 * many channels warm (:sessions :warm-channels 1, 2, 3 or 1024, so tails are evicted and
 * rebuilt all the time or never), the other none (0: every turn reads its history from the
 * store). Operations: sessions with random windows and subscriptions; users and agents posting
 * to channels, with mentions; turns leased and completed with replies (which land in the
 * channel as the session's own messages), failed, or left to expire; context nodes with TTLs
 * and cadences; restarts of both engines. Every leased turn of the two must be the same: its
 * sections, channel views, messages and token accounts, compared field by field in one
 * canonical text. The engines opened at different real times, so what follows the wall clock
 * is kept out of the comparison: times are left out, credits do not move (no refill, no cost:
 * a restart refills for the real time it took) and content dedupe is off (its window is
 * wall-clock time).
 *
 * CPH_PROPERTY_SEED=<n> runs from that seed; CPH_PROPERTY_CASES=<n> sets how many cases. A
 * failure prints the case's seed: rerun with CPH_PROPERTY_SEED=<seed> CPH_PROPERTY_CASES=1.
 *
 * The same cases check the kept contexts (core/turnlog.c; :context :keep-turns 1, 2, 3 or 8
 * per case): every leased turn reads back from the explorer with exactly the messages the
 * lease gave. The rebuilt engine keeps them as version-2 records (texts by hash), the warm one
 * as version-3 records (rows) — in half the cases switching between the two versions now and
 * then, so trims meet both — and the two read back alike, messages, their nodes and the tree
 * field by field. When a case ends (restarts, evictions and trims behind it), every turn the
 * warm engine still keeps reads back as it did when it was leased, and the rows and texts held
 * are exactly those its kept turns name — none missing, none left behind, none twice (a third
 * of the cases name new rows now and then by their whole hash, as before row names carried
 * the turn that added them, so a session holds both kinds and must reuse either).
 *
 * Keeping uses each session's warm state (core/turnwarm.h): the warm engine keeps them within
 * a bound drawn per case (none, so every lease rebuilds from the store; about one session's,
 * so they are evicted and rebuilt all the time; the default), the rebuilt engine none. Half
 * the cases reload keep-turns now and then on both engines (0 included: the sessions' kept
 * turns go at their next lease; a lower bound trims several at once). After every lease the
 * session keeps at most keep-turns turns, and at every restart (warm states gone, not yet
 * rebuilt) the rows and texts held are exactly those named. Now and then a session is deleted
 * and created again under its id (its kept turns go with it). These draws come from a stream of
 * their own, so the operations of a seed are what they were without them.
 *
 * The memories a turn lists come, on the warm engine, from the records kept decoded between
 * turns (core/memcache.h; a bound of a record or two, or the default), on the rebuilt one
 * from the store at every lease; the access counts written back each second rewrite them.
 *
 * In half the cases the warm engine's leases defer keeping (cph_op u.lease.defer_keep, as the
 * daemon's leases do with a request thread: core/turnlog.h, "Deferred keeping"): the test works
 * each job out — on a thread of its own now and then — and writes it before it reads the turn
 * back. Now and then, between the lease and the write, another session's turn runs and is kept
 * (with the warm states' bound, which must not take a state a job in flight holds), a node is
 * inserted into the session's tree (the job keeps the tree its lease read, and must not hand it
 * back to the tree cache: the next lease would render it without the node), or the job is
 * abandoned (its turn is not
 * kept on the warm engine: neither compared nor expected in the explorer, and the next lease of
 * the session rebuilds its warm state from the store). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "cephalon/policy.h"
#include "common/buf.h"
#include "common/clock.h"
#include "core/memory.h"
#include "core/turnlog.h"
#include "store/keys.h"
#include "store/records.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/prop.h"

#define DEFAULT_CASES 400
#define STEPS 60
#define MAX_SESSIONS 4
#define N_CHANNELS 3

static const char *const CHANNELS[N_CHANNELS] = {"general", "ops", "random"};
static const char *const USERS[] = {"alice", "bob", "carol"};
static const char *const TEXTS[] = {
    "can someone look at the failing deploy of the api service",
    "the nightly backup finished without errors",
    "ok",
    ("please summarise what happened in this channel since yesterday, with the open questions "
     "first and who asked them, then the decisions, then everything else worth knowing"),
    "restart the worker pool on host alpha",
    "restart the worker pool on host beta",
    "restart the backup pool on host beta", /* the length of the one above, other bytes */
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* A kept turn as the warm engine's explorer read it back when it was leased. */
typedef struct kept_read {
  char session[16];
  uint64_t turn;
  char *text; /* kept_canonical */
} kept_read;

typedef struct pair {
  cph_fixture *warm, *cold;
  uint64_t seed;
  int n_sessions;
  char ids[MAX_SESSIONS][16];
  bool mixed;   /* the warm engine switches between record versions 2 and 3 */
  bool warm_v2; /* ... and writes version 2 now */
  bool hash_names; /* the warm engine names new rows by their whole hash (the layout before row
                      names carried their turn: turnlog.c, "Row names") now */
  long long warm_bytes; /* the warm engine's bound on its kept contexts' warm states */
  long long memory_cache_bytes; /* the warm engine's bound on its decoded memories; cold: 0 */
  int warm_channels, keep; /* the policies' :sessions :warm-channels (warm engine), keep-turns */
  bool defer;   /* the warm engine's leases defer keeping (turnlog.h, "Deferred keeping") */
  bool nested;  /* a turn runs while another's keep job is in flight */
  rng dr;       /* what becomes of each deferred job: a stream of its own */
  kept_read *reads;
  size_t n_reads, cap_reads;
} pair;

/* ---------------------------------------------------------------- the canonical text */

/* Times of day ("12:04") in texts come from each engine's wall clock: masked. */
static void put_text(cph_buf *b, const char *s) {
  if (!s) {
    cph_buf_append(b, "(null)", 6);
    return;
  }
  for (const char *p = s; *p; p++) {
    bool hhmm = p[0] >= '0' && p[0] <= '9' && p[1] >= '0' && p[1] <= '9' && p[2] == ':' &&
                p[3] >= '0' && p[3] <= '9' && p[4] >= '0' && p[4] <= '9';
    if (hhmm) {
      cph_buf_append(b, "HH:MM", 5);
      p += 4;
    } else {
      cph_buf_putc(b, *p);
    }
  }
}

static void put(cph_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(cph_buf *b, const char *fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  cph_buf_append(b, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
}

/* Everything a worker sees of a turn but its lease token and wall-clock times. */
static char *canonical(const cph_turn_info *t) {
  cph_buf b = CPH_BUF_INIT;
  put(&b, "turn %llu session %s lane %d kind %d episode %llu attempts %u\ninput ",
      (unsigned long long)t->id, t->session, (int)t->lane, (int)t->kind,
      (unsigned long long)t->episode, t->attempts);
  put_text(&b, t->input);
  put(&b, "\nstate credits %.6f turns %.6f tools %.6f state %d\n", t->current_state.credits,
      t->current_state.turns_left, t->current_state.tool_calls_left, (int)t->current_state.state);
  for (size_t i = 0; i < t->n_staged; i++) {
    const cph_staged_msg *m = &t->staged[i];
    put(&b, "staged %llu count %u fold %s mentioned %d from ", (unsigned long long)m->event_id,
        m->count, m->fold, m->mentioned);
    put_text(&b, m->sender);
    put(&b, " in %s: ", m->channel);
    put_text(&b, m->body);
    cph_buf_putc(&b, '\n');
  }
  for (size_t i = 0; i < t->n_obligations; i++) {
    put(&b, "obligation %llu ", (unsigned long long)t->obligations[i].id);
    put_text(&b, t->obligations[i].sender);
    cph_buf_putc(&b, ' ');
    put_text(&b, t->obligations[i].preview);
    cph_buf_putc(&b, '\n');
  }
  for (size_t i = 0; i < t->n_history; i++) {
    const cph_history_entry *h = &t->history[i];
    put(&b, "history %llu %s ", (unsigned long long)h->event_id, h->channel);
    put_text(&b, h->sender);
    cph_buf_putc(&b, ' ');
    put_text(&b, h->body);
    cph_buf_putc(&b, '\n');
  }
  for (size_t i = 0; i < t->n_memories; i++) {
    const cph_memory_item *m = &t->memories[i];
    put(&b, "memory %llu %s %s accesses %llu ", (unsigned long long)m->id, m->kind, m->scope,
        (unsigned long long)m->access_count);
    put_text(&b, m->text);
    cph_buf_putc(&b, '\n');
  }
  for (size_t i = 0; i < t->n_tools; i++)
    put(&b, "tool %s\n", t->tools[i].name);
  for (size_t i = 0; i < t->n_views; i++) {
    const cph_channel_view *v = &t->views[i];
    put(&b, "view %s cursor %llu had %d seen %llu away %u\n", v->channel,
        (unsigned long long)v->cursor, v->had_cursor, (unsigned long long)v->seen_index, v->away);
  }
  for (size_t i = 0; i < t->n_messages; i++) {
    const cph_message *m = &t->messages[i];
    put(&b, "message %s %s name %s: ", m->coord, m->role, m->name ? m->name : "-");
    put_text(&b, m->content);
    cph_buf_putc(&b, '\n');
  }
  const cph_context_tokens *k = &t->tokens;
  put(&b,
      "tokens window %u state %u obligations %u history %u memory %u tools %u sections %u "
      "messages %u history_cut %u messages_cut %u\n",
      k->window, k->current_state, k->pending_obligations, k->conversation_history,
      k->recent_memory, k->available_tools, k->sections, k->messages, k->history_cut,
      k->messages_cut);
  cph_buf_putc(&b, '\0');
  return cph_buf_steal(&b);
}

/* ---------------------------------------------------------------- both engines at once */

/* Runs a copy of op on each engine; both must answer alike. Returns the warm one's rc. */
/* Each engine runs with its knobs: the warm one writes version 3 (or 2 now and then) and keeps
 * warm states within warm_bytes; the rebuilt one writes version 2 and keeps none (every lease
 * reads the session's kept turns from the store). */
static void knobs(const pair *p, bool warm) {
  turnlog_test_write_v2(warm ? p->warm_v2 : true);
  turnlog_test_warm_bytes(warm ? p->warm_bytes : 0);
  turnlog_test_hash_names(warm && p->hash_names);
}

static void knobs_off(void) {
  turnlog_test_write_v2(false);
  turnlog_test_warm_bytes(-1);
  turnlog_test_hash_names(false);
}

static int run_both(pair *p, cph_op *warm_op, cph_op *cold_op) {
  knobs(p, true);
  int rw = cph_fixture_run(p->warm, warm_op);
  knobs(p, false);
  int rc = cph_fixture_run(p->cold, cold_op);
  knobs_off();
  if (rw != rc)
    fail_msg("seed %llu: the engines answered differently: %d (%s) vs %d (%s)",
             (unsigned long long)p->seed, rw, warm_op->err.msg, rc, cold_op->err.msg);
  return rw;
}

static void pass_both(pair *p) {
  knobs(p, true);
  cph_engine_run_pass(p->warm->e);
  knobs(p, false);
  cph_engine_run_pass(p->cold->e);
  knobs_off();
}

static void advance_both(pair *p, int64_t ns) {
  cph_clock_advance(&p->warm->clock, ns);
  cph_clock_advance(&p->cold->clock, ns);
}

/* Creates session i on both engines (its subscriptions, window and tick drawn from r). */
static void create_session(pair *p, rng *r, int i) {
  static const uint32_t windows[] = {256, 400, 1024, 8192};
  char *subs[N_CHANNELS];
  size_t n = 0;
  for (int c = 0; c < N_CHANNELS; c++)
    if (below(r, 2))
      subs[n++] = (char *)CHANNELS[c];
  uint32_t window = windows[below(r, 4)];
  uint32_t tick = below(r, 4) == 0 ? 3 : 0;
  cph_op ops[2] = {{0}};
  for (int k = 0; k < 2; k++) {
    ops[k].kind = CPH_OP_SESSION_CREATE;
    ops[k].u.session.in.id = p->ids[i];
    ops[k].u.session.in.lane = CPH_LANE_INTERACTIVE;
    ops[k].u.session.in.subscribe.items = subs;
    ops[k].u.session.in.subscribe.count = n;
    ops[k].u.session.in.context_window_tokens = window;
    ops[k].u.session.in.autonomy_interval_s = tick;
  }
  if (run_both(p, &ops[0], &ops[1]))
    fail_msg("seed %llu: create %s: %s", (unsigned long long)p->seed, p->ids[i], ops[0].err.msg);
  cph_op_clear_results(&ops[0]);
  cph_op_clear_results(&ops[1]);
}

static void create_sessions(pair *p, rng *r) {
  p->n_sessions = 1 + (int)below(r, MAX_SESSIONS);
  for (int i = 0; i < p->n_sessions; i++) {
    snprintf(p->ids[i], sizeof p->ids[i], "agent%d", i);
    create_session(p, r, i);
  }
}

/* Deletes a session on both engines (refused alike while it has a turn running) and creates
 * it again under the same id: its kept turns go with it, and its warm state must not outlive
 * them. */
static void recreate_session(pair *p, rng *r) {
  int i = (int)below(r, (uint32_t)p->n_sessions);
  cph_op ops[2] = {{0}};
  for (int k = 0; k < 2; k++) {
    ops[k].kind = CPH_OP_SESSION_DELETE;
    ops[k].u.session.in.id = p->ids[i];
  }
  int rc = run_both(p, &ops[0], &ops[1]);
  cph_op_clear_results(&ops[0]);
  cph_op_clear_results(&ops[1]);
  if (rc == CPH_OK)
    create_session(p, r, i);
}

static void post(pair *p, rng *r) {
  cph_event_in evs[3];
  char *mention[3][1];
  size_t n = 1 + below(r, 3);
  memset(evs, 0, sizeof evs);
  for (size_t i = 0; i < n; i++) {
    bool agent = below(r, 4) == 0; /* another agent speaking in the channel */
    evs[i].channel = (char *)CHANNELS[below(r, N_CHANNELS)];
    evs[i].sender = agent ? p->ids[below(r, (uint32_t)p->n_sessions)] : (char *)USERS[below(r, 3)];
    evs[i].body = (char *)TEXTS[below(r, N_TEXTS)];
    if (below(r, 5) == 0) {
      mention[i][0] = p->ids[below(r, (uint32_t)p->n_sessions)];
      evs[i].mentions = (cph_strv){mention[i], 1};
    }
  }
  cph_op ops[2] = {{0}};
  for (int k = 0; k < 2; k++) {
    ops[k].kind = CPH_OP_INGEST;
    ops[k].u.ingest.events = evs;
    ops[k].u.ingest.n_events = n;
  }
  if (run_both(p, &ops[0], &ops[1]))
    fail_msg("seed %llu: ingest: %s", (unsigned long long)p->seed, ops[0].err.msg);
  for (size_t i = 0; i < n; i++)
    if (ops[0].u.ingest.results[i].status != ops[1].u.ingest.results[i].status ||
        ops[0].u.ingest.results[i].id != ops[1].u.ingest.results[i].id)
      fail_msg("seed %llu: event %zu: status %d id %llu vs status %d id %llu",
               (unsigned long long)p->seed, i, (int)ops[0].u.ingest.results[i].status,
               (unsigned long long)ops[0].u.ingest.results[i].id,
               (int)ops[1].u.ingest.results[i].status,
               (unsigned long long)ops[1].u.ingest.results[i].id);
  cph_op_clear_results(&ops[0]);
  cph_op_clear_results(&ops[1]);
}

static void insert_node_in(pair *p, rng *r, const char *in);
static void insert_node(pair *p, rng *r) { insert_node_in(p, r, NULL); }

/* A node inserted into session `in` (NULL: one drawn) on both. */
static void insert_node_in(pair *p, rng *r, const char *in) {
  static const char *const AT[] = {"d-1, 1, 0", "d0, 1, 0", "d1, 1, 0", "d2, 0, 1", "d0, 1, 1"};
  static const char *const CONTENT[] = {"remember: the api deploy is frozen", "tone: short answers",
                                        "open question from alice"};
  cph_op ops[2] = {{0}};
  uint32_t ttl = below(r, 3) ? 1 + below(r, 4) : 0;
  uint32_t cadence = ttl && below(r, 2) ? 2 + below(r, 3) : 0;
  const char *session = in ? in : p->ids[below(r, (uint32_t)p->n_sessions)];
  const char *at = AT[below(r, 5)];
  const char *content = CONTENT[below(r, 3)];
  for (int k = 0; k < 2; k++) {
    ops[k].kind = CPH_OP_CONTEXT_INSERT;
    ops[k].u.context.session = (char *)session;
    ops[k].u.context.node.at = (char *)at;
    ops[k].u.context.node.content = (char *)content;
    ops[k].u.context.node.ttl = ttl;
    ops[k].u.context.node.cadence = cadence;
  }
  run_both(p, &ops[0], &ops[1]); /* a refused node is refused by both */
  cph_op_clear_results(&ops[0]);
  cph_op_clear_results(&ops[1]);
}

/* What the explorer reads back of a kept turn's messages and tree, every field. */
static char *kept_canonical(const cph_turn_context *c) {
  cph_buf b = CPH_BUF_INIT;
  put(&b, "turn %llu kind %d episode %llu messages %zu nodes %zu\n", (unsigned long long)c->turn.id,
      (int)c->turn.kind, (unsigned long long)c->turn.episode, c->n_messages, c->n_nodes);
  for (size_t i = 0; i < c->n_messages; i++) {
    put(&b, "message %s %s node %llu: ", c->messages[i].coord, c->messages[i].role,
        (unsigned long long)c->message_nodes[i]);
    cph_buf_append(&b, c->messages[i].content, strlen(c->messages[i].content));
    cph_buf_putc(&b, '\n');
  }
  for (size_t i = 0; i < c->n_nodes; i++) {
    const cph_kept_node *n = &c->nodes[i];
    put(&b, "node %llu %s %s ttl %lld cadence %lld created %llu waiting %d stage %u/%u: ",
        (unsigned long long)n->id, n->at, n->role ? n->role : "-", (long long)n->ttl,
        (long long)n->cadence, (unsigned long long)n->created_at_episode, n->waiting, n->stage,
        n->n_lifecycle);
    cph_buf_append(&b, n->content ? n->content : "(null)", n->content ? strlen(n->content) : 6);
    cph_buf_putc(&b, '\n');
  }
  cph_buf_putc(&b, '\0');
  return cph_buf_steal(&b);
}

static char *kept_read_back(pair *p, cph_fixture *f, const char *session, uint64_t turn) {
  cph_turn_context c;
  cph_err err;
  if (cph_engine_turn_context(f->e, session, turn, &c, &err) != CPH_OK)
    fail_msg("seed %llu: turn %llu of %s (%s) is not kept: %s", (unsigned long long)p->seed,
             (unsigned long long)turn, session, f == p->warm ? "warm" : "rebuilt", err.msg);
  char *s = kept_canonical(&c);
  cph_turn_context_free(&c);
  return s;
}

/* The node each kept message renders, worked out again from the kept tree as the contract
 * says, with coordinates compared as text: the first unused live node (render order) with the
 * message's coordinate and content — none of the cores on an inbox turn. The kept tree holds
 * previews, so a node's content is taken as the message's when it is a whole prefix of it
 * (the test's texts are shorter than a preview, bar one that no two nodes share). */
static void check_message_nodes(pair *p, const cph_turn_info *t, const cph_turn_context *c) {
  bool inbox = t->kind == CPH_KIND_INBOX && t->n_staged > 0;
  bool *used = calloc(c->n_nodes + 1, sizeof *used);
  assert_non_null(used);
  for (size_t m = 0; m < c->n_messages; m++) {
    const cph_message *msg = &c->messages[m];
    uint64_t want = 0;
    for (size_t i = 0; i < c->n_nodes && !want; i++) {
      const cph_kept_node *n = &c->nodes[i];
      size_t len = strlen(n->content);
      bool core = n->role && n->role[0];
      if (n->waiting || used[i] || (inbox && core) || strcmp(n->at, msg->coord) != 0 ||
          strncmp(n->content, msg->content, len) != 0 ||
          (msg->content[len] && len < 150))
        continue;
      used[i] = true;
      want = n->id;
    }
    if (c->message_nodes[m] != want)
      fail_msg("seed %llu: turn %llu message %zu (%s) kept as rendered by node %llu, not %llu",
               (unsigned long long)p->seed, (unsigned long long)t->id, m, msg->coord,
               (unsigned long long)c->message_nodes[m], (unsigned long long)want);
  }
  free(used);
}

/* The explorer reads the turn back with exactly the messages the lease gave; the warm engine's
 * kept turn (version 3, or 2 now and then) reads back as the rebuilt one's (version 2). */
static void check_kept(pair *p, const cph_turn_info *t, const cph_turn_info *cold) {
  char *w = kept_read_back(p, p->warm, t->session, t->id);
  char *c2 = kept_read_back(p, p->cold, cold->session, cold->id);
  if (strcmp(w, c2) != 0) {
    fprintf(stderr, "---- warm (version %d)\n%s---- rebuilt (version 2)\n%s", p->warm_v2 ? 2 : 3,
            w, c2);
    fail_msg("seed %llu: turn %llu: the kept contexts read back differently",
             (unsigned long long)p->seed, (unsigned long long)t->id);
  }
  free(c2);
  if (p->n_reads == p->cap_reads) {
    p->cap_reads = p->cap_reads ? 2 * p->cap_reads : 32;
    p->reads = realloc(p->reads, p->cap_reads * sizeof *p->reads);
    assert_non_null(p->reads);
  }
  kept_read *kr = &p->reads[p->n_reads++];
  snprintf(kr->session, sizeof kr->session, "%s", t->session);
  kr->turn = t->id;
  kr->text = w;
  cph_turn_context c;
  cph_err err;
  if (cph_engine_turn_context(p->warm->e, t->session, t->id, &c, &err) != CPH_OK)
    fail_msg("seed %llu: turn %llu is not kept: %s", (unsigned long long)p->seed,
             (unsigned long long)t->id, err.msg);
  if (c.n_messages != t->n_messages)
    fail_msg("seed %llu: turn %llu kept %zu messages, leased %zu", (unsigned long long)p->seed,
             (unsigned long long)t->id, c.n_messages, t->n_messages);
  for (size_t m = 0; m < c.n_messages; m++)
    if (strcmp(c.messages[m].role, t->messages[m].role) != 0 ||
        strcmp(c.messages[m].content, t->messages[m].content) != 0)
      fail_msg("seed %llu: turn %llu message %zu kept as \"%s\", leased as \"%s\"",
               (unsigned long long)p->seed, (unsigned long long)t->id, m, c.messages[m].content,
               t->messages[m].content);
  check_message_nodes(p, t, &c);
  cph_turn_context_free(&c);
}

/* The bound: after its lease, the session keeps at most keep-turns turns (none at 0). */
static void check_bound(pair *p, const char *session, uint64_t turn) {
  cph_kept_turn *kt;
  size_t n;
  cph_err err;
  if (cph_engine_kept_turns(p->warm->e, session, &kt, &n, &err) != CPH_OK)
    fail_msg("seed %llu: kept turns of %s: %s", (unsigned long long)p->seed, session, err.msg);
  cph_kept_turns_free(kt, n);
  if (n > (size_t)p->keep)
    fail_msg("seed %llu: %s keeps %zu turns after turn %llu, keep-turns is %d",
             (unsigned long long)p->seed, session, n, (unsigned long long)turn, p->keep);
}

/* ---- the texts held by hash: exactly what the refs name */

typedef struct keyset {
  char **v;
  size_t n, cap;
} keyset;

/* Appends the key as hex (duplicates too: keyset_sort drops them). */
static void keyset_add(keyset *k, const void *data, size_t len) {
  if (k->n == k->cap) {
    k->cap = k->cap ? 2 * k->cap : 64;
    k->v = realloc(k->v, k->cap * sizeof *k->v);
    assert_non_null(k->v);
  }
  char *hex = malloc(2 * len + 1);
  assert_non_null(hex);
  for (size_t j = 0; j < len; j++)
    snprintf(hex + 2 * j, 3, "%02x", ((const unsigned char *)data)[j]);
  hex[2 * len] = '\0';
  k->v[k->n++] = hex;
}

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every text key (session\0 hash). */
static bool text_key_seen(void *ctx, const void *key, size_t key_len, const void *val,
                          size_t val_len) {
  (void)val;
  (void)val_len;
  keyset_add(ctx, key, key_len);
  return true;
}

/* Every text key a refs entry (session\0 turn -> hashes) names. */
static bool refs_seen(void *ctx, const void *key, size_t key_len, const void *val, size_t val_len) {
  size_t prefix = key_len - 8;
  for (size_t i = 0; i + 8 <= val_len; i += 8) {
    unsigned char k[300];
    assert_true(prefix + 8 <= sizeof k);
    memcpy(k, key, prefix);
    memcpy(k + prefix, (const unsigned char *)val + i, 8);
    keyset_add(ctx, k, prefix + 8);
  }
  return true;
}

/* Sorted, each key once. */
static void keyset_sort(keyset *k) {
  if (k->n) /* an empty set has no array */
    qsort(k->v, k->n, sizeof *k->v, str_cmp);
  size_t n = 0;
  for (size_t i = 0; i < k->n; i++) {
    if (n && strcmp(k->v[n - 1], k->v[i]) == 0)
      free(k->v[i]);
    else
      k->v[n++] = k->v[i];
  }
  k->n = n;
}

/* Every row a refs entry (session\0 turn -> be64 prev, be64 added, be64 n, be32 messages,
 * be32 nodes, n be64 rows, ...) names, as session\0 hash. */
static bool rows_named(void *ctx, const void *key, size_t key_len, const void *val,
                       size_t val_len) {
  assert_true(val_len >= 32);
  uint64_t n = cph_be64_get((const unsigned char *)val + 16);
  assert_true(32 + 8 * n <= val_len);
  size_t prefix = key_len - 8;
  for (uint64_t i = 0; i < n; i++) {
    unsigned char k[300];
    assert_true(prefix + 8 <= sizeof k);
    memcpy(k, key, prefix);
    memcpy(k + prefix, (const unsigned char *)val + 32 + 8 * i, 8);
    keyset_add(ctx, k, prefix + 8);
  }
  return true;
}

/* The key of every kept record of version 3 (its messages and nodes are rows). */
static bool rows_turns(void *ctx, const void *key, size_t key_len, const void *val,
                       size_t val_len) {
  cph_turnctx_rec r = {0};
  cph_err err;
  if (cph_record_decode(&cph_turnctx_desc, val, val_len, &r, &err) != CPH_OK)
    fail_msg("a kept record does not decode: %s", err.msg);
  if (r.rows)
    keyset_add(ctx, key, key_len);
  cph_record_free(&cph_turnctx_desc, &r);
  return true;
}

static void keyset_free(keyset *k) {
  for (size_t i = 0; i < k->n; i++)
    free(k->v[i]);
  free(k->v);
}

/* Every row held, as session\0 + its bytes: no two rows of a session are the same row. */
static bool row_seen(void *ctx, const void *key, size_t key_len, const void *val, size_t val_len) {
  assert_true(key_len >= 8);
  unsigned char *k = malloc(key_len - 8 + val_len);
  assert_non_null(k);
  memcpy(k, key, key_len - 8);
  memcpy(k + key_len - 8, val, val_len);
  keyset_add(ctx, k, key_len - 8 + val_len);
  free(k);
  return true;
}

/* "turn_kept" holds three kinds of entries under a session (core/turnlog.c, Keys): records
 * (session\0 'k' turn), refs entries (session\0 'k' turn 'f') and rows (session\0 'r' row).
 * The callbacks above take one kind keyed session\0 u64, as the three databases of schema 5
 * held them: kept_each hands fn the entries of one kind ('k', 'f' or 'r') keyed so. */
typedef struct kind_filter {
  char kind;
  bool (*fn)(void *ctx, const void *key, size_t key_len, const void *val, size_t val_len);
  void *ctx;
} kind_filter;

static bool of_kind(void *ctx, const void *key, size_t key_len, const void *val, size_t val_len) {
  kind_filter *f = ctx;
  const unsigned char *k = key;
  size_t n = strnlen(key, key_len);
  if (n + 10 > key_len)
    fail_msg("a key of turn_kept is too short (%zu bytes)", key_len);
  char kind = k[n + 1] == 'r' && key_len == n + 10   ? 'r'
              : k[n + 1] == 'k' && key_len == n + 10 ? 'k'
              : k[n + 1] == 'k' && key_len == n + 11 && k[n + 10] == 'f' ? 'f'
                                                                          : 0;
  if (!kind)
    fail_msg("a key of turn_kept is of no kind (%zu bytes)", key_len);
  if (kind != f->kind)
    return true;
  unsigned char old[300];
  assert_true(n + 9 <= sizeof old);
  memcpy(old, k, n + 1);
  memcpy(old + n + 1, k + n + 2, 8);
  return f->fn(f->ctx, old, n + 9, val, val_len);
}

static void kept_each(const char *dir, char kind,
                      bool (*fn)(void *ctx, const void *key, size_t key_len, const void *val,
                                 size_t val_len),
                      void *ctx) {
  kind_filter f = {kind, fn, ctx};
  cph_fixture_store_each(dir, CPH_DB_TURN_KEPT, of_kind, &f);
}

/* The rows held are exactly those the refs entries name, the refs entries are exactly those
 * of the kept records of version 3, and a text that came back while its row was held reused
 * that row, whichever way it was named (by its whole hash, or its identity under a turn). */
static void check_rows(pair *p) {
  keyset bodies = {0};
  kept_each(p->warm->dir, 'r', row_seen, &bodies);
  size_t n_rows = bodies.n;
  keyset_sort(&bodies);
  if (bodies.n != n_rows)
    fail_msg("seed %llu: %zu rows held, %zu different ones: a text came back as a second row",
             (unsigned long long)p->seed, n_rows, bodies.n);
  keyset_free(&bodies);
  keyset held = {0}, named = {0}, refs = {0}, turns = {0};
  kept_each(p->warm->dir, 'r', text_key_seen, &held);
  kept_each(p->warm->dir, 'f', rows_named, &named);
  kept_each(p->warm->dir, 'f', text_key_seen, &refs);
  kept_each(p->warm->dir, 'k', rows_turns, &turns);
  keyset *sets[] = {&held, &named, &refs, &turns};
  for (int i = 0; i < 4; i++)
    keyset_sort(sets[i]);
  for (int pair_i = 0; pair_i < 2; pair_i++) {
    keyset *a = sets[2 * pair_i], *b = sets[2 * pair_i + 1];
    const char *what = pair_i ? "refs entries" : "rows";
    if (a->n != b->n)
      fail_msg("seed %llu: %zu %s held, %zu named", (unsigned long long)p->seed, a->n, what, b->n);
    for (size_t i = 0; i < a->n; i++)
      if (strcmp(a->v[i], b->v[i]) != 0)
        fail_msg("seed %llu: %s: %s held, %s named", (unsigned long long)p->seed, what, a->v[i],
                 b->v[i]);
  }
  for (int i = 0; i < 4; i++)
    keyset_free(sets[i]);
}

static void check_texts(pair *p) {
  keyset held = {0}, named = {0};
  cph_fixture_store_each(p->warm->dir, CPH_DB_TURN_TEXTS, text_key_seen, &held);
  cph_fixture_store_each(p->warm->dir, CPH_DB_TURN_TEXT_REFS, refs_seen, &named);
  keyset_sort(&held);
  keyset_sort(&named);
  if (held.n != named.n)
    fail_msg("seed %llu: %zu texts held, the kept turns name %zu", (unsigned long long)p->seed,
             held.n, named.n);
  for (size_t i = 0; i < held.n; i++)
    if (strcmp(held.v[i], named.v[i]) != 0)
      fail_msg("seed %llu: text %s held, %s named", (unsigned long long)p->seed, held.v[i],
               named.v[i]);
  for (size_t i = 0; i < held.n; i++)
    free(held.v[i]);
  for (size_t i = 0; i < named.n; i++)
    free(named.v[i]);
  free(held.v);
  free(named.v);
}

/* Every turn the warm engine still keeps reads back as it did when it was leased. */
static void recheck_kept(pair *p) {
  for (int s = 0; s < p->n_sessions; s++) {
    cph_kept_turn *kt;
    size_t n;
    cph_err err;
    if (cph_engine_kept_turns(p->warm->e, p->ids[s], &kt, &n, &err) != CPH_OK)
      fail_msg("seed %llu: kept turns of %s: %s", (unsigned long long)p->seed, p->ids[s], err.msg);
    for (size_t i = 0; i < n; i++) {
      const kept_read *kr = NULL;
      for (size_t j = 0; j < p->n_reads; j++)
        if (p->reads[j].turn == kt[i].id && strcmp(p->reads[j].session, p->ids[s]) == 0)
          kr = &p->reads[j];
      if (!kr)
        fail_msg("seed %llu: turn %llu of %s is kept but was never leased",
                 (unsigned long long)p->seed, (unsigned long long)kt[i].id, p->ids[s]);
      char *now = kept_read_back(p, p->warm, p->ids[s], kt[i].id);
      if (strcmp(now, kr->text) != 0) {
        fprintf(stderr, "---- at lease\n%s---- now\n%s", kr->text, now);
        fail_msg("seed %llu: turn %llu of %s reads back differently than at its lease",
                 (unsigned long long)p->seed, (unsigned long long)kt[i].id, p->ids[s]);
      }
      free(now);
    }
    cph_kept_turns_free(kt, n);
  }
}

static void *compute_job(void *job) {
  cph_keep_job_compute(job);
  return NULL;
}

/* What becomes of the warm engine's deferred keep job of lease l (its turn): worked out (on a
 * thread of its own a third of the time) and written, or — now and then — written after a node
 * was inserted into the session's tree on both engines (the job holds the tree the lease read:
 * it must keep that one, and not give it back to the tree cache, whose next lease would
 * render it without the node), or abandoned. Returns 'k' when the turn is kept, 'a' when not. */
static bool turn(pair *p, rng *r);

static char finish_deferred(pair *p, cph_op *l, rng *r) {
  if (!l->u.lease.keep)
    return 'k'; /* kept inline (or not to be kept) */
  uint32_t what = below(&p->dr, 12);
  if (!p->nested && below(&p->dr, 4) == 0) {
    /* another session's turn, kept and its warm states bounded, while this job is in flight:
     * the bound must not take this job's warm state */
    p->nested = true;
    turn(p, r);
    p->nested = false;
  }
  if (what <= 1) { /* abandoned, worked out or not; the turn info stays for the comparisons */
    knobs(p, true);
    if (what == 1)
      cph_keep_job_compute(l->u.lease.keep);
    turnlog_keep_abandon(l->u.lease.keep);
    knobs_off();
    l->u.lease.keep = NULL;
    return 'a';
  }
  if (what <= 4) /* the session's tree changes while the job is in flight */
    insert_node_in(p, &p->dr, l->u.lease.turn.session);
  knobs(p, true);
  if (below(&p->dr, 3) == 0) {
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, compute_job, l->u.lease.keep), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
  } else {
    cph_keep_job_compute(l->u.lease.keep);
  }
  cph_engine_keep_write(p->warm->e, l);
  knobs_off();
  assert_null(l->u.lease.keep);
  return 'k';
}

/* Leases a turn on both; they must be the same turn. Then completes (with a reply, and a
 * memory now and then), fails, or leaves it to expire — the same on both. */
static bool turn(pair *p, rng *r) {
  cph_op l[2] = {{0}};
  cph_fixture *f[2] = {p->warm, p->cold};
  for (int k = 0; k < 2; k++) {
    l[k].kind = CPH_OP_LEASE;
    l[k].u.lease.worker = "w";
    l[k].u.lease.deadline_ns = cph_clock_now(&f[k]->clock);
  }
  l[0].u.lease.defer_keep = p->defer;
  if (run_both(p, &l[0], &l[1]) != CPH_OK) {
    cph_op_clear_results(&l[0]);
    cph_op_clear_results(&l[1]);
    return false;
  }
  char kept = finish_deferred(p, &l[0], r);
  char *a = canonical(&l[0].u.lease.turn), *b = canonical(&l[1].u.lease.turn);
  if (strcmp(a, b) != 0) {
    fprintf(stderr, "---- warm\n%s---- rebuilt\n%s", a, b);
    fail_msg("seed %llu: turn %llu: the warm context differs from the rebuilt one",
             (unsigned long long)p->seed, (unsigned long long)l[0].u.lease.turn.id);
  }
  free(a);
  free(b);
  if (p->keep > 0 && kept == 'k')
    check_kept(p, &l[0].u.lease.turn, &l[1].u.lease.turn);
  if (kept == 'k') /* an abandoned job trims nothing either (its lease failed, as far as it knows) */
    check_bound(p, l[0].u.lease.turn.session, l[0].u.lease.turn.id);
  uint32_t how = below(r, 10);
  char reply[96];
  snprintf(reply, sizeof reply, "%s here: %s", l[0].u.lease.turn.session, TEXTS[below(r, N_TEXTS)]);
  cph_memory_in mem = {.text = "the api deploy is frozen until friday"};
  bool with_memory = below(r, 4) == 0;
  bool with_reply = below(r, 5) != 0; /* drawn once: both engines get the same completion */
  if (how >= 2) {
    cph_op c[2] = {{0}};
    for (int k = 0; k < 2; k++) {
      c[k].kind = CPH_OP_COMPLETE;
      c[k].u.turn.turn_id = l[k].u.lease.turn.id;
      snprintf(c[k].u.turn.lease, sizeof c[k].u.turn.lease, "%s", l[k].u.lease.turn.lease);
      c[k].u.turn.reply_body = with_reply ? reply : NULL;
      c[k].u.turn.memories = with_memory ? &mem : NULL;
      c[k].u.turn.n_memories = with_memory;
    }
    if (run_both(p, &c[0], &c[1]))
      fail_msg("seed %llu: complete: %s", (unsigned long long)p->seed, c[0].err.msg);
    cph_op_clear_results(&c[0]);
    cph_op_clear_results(&c[1]);
  } else if (how == 1) {
    cph_op c[2] = {{0}};
    for (int k = 0; k < 2; k++) {
      c[k].kind = CPH_OP_FAIL;
      c[k].u.turn.turn_id = l[k].u.lease.turn.id;
      snprintf(c[k].u.turn.lease, sizeof c[k].u.turn.lease, "%s", l[k].u.lease.turn.lease);
      c[k].u.turn.error = "model error";
    }
    run_both(p, &c[0], &c[1]);
    cph_op_clear_results(&c[0]);
    cph_op_clear_results(&c[1]);
  } /* else: left to expire */
  cph_op_clear_results(&l[0]);
  cph_op_clear_results(&l[1]);
  return true;
}

static void check_texts(pair *p);
static void check_rows(pair *p);

/* A restart of both; while the warm engine is closed, the rows and texts it holds must be
 * exactly those its kept turns name (with its warm states gone, and before they are rebuilt). */
static void restart_both(pair *p) {
  cph_engine_close(p->warm->e);
  p->warm->e = NULL;
  cph_engine_close(p->cold->e);
  p->cold->e = NULL;
  check_texts(p);
  check_rows(p);
  memory_test_cache_bytes(p->memory_cache_bytes);
  cph_fixture_open(p->warm);
  memory_test_cache_bytes(0);
  cph_fixture_open(p->cold);
  memory_test_cache_bytes(-1);
}

static const char *policy(char *buf, size_t size, int warm_channels, int keep_turns);

/* A policy reload on both engines: keep-turns becomes keep (0 deletes what the sessions kept at
 * their next lease, a lower bound trims several turns at once). */
static void reload_keep(pair *p, int keep) {
  cph_fixture *f[2] = {p->warm, p->cold};
  for (int k = 0; k < 2; k++) {
    char text[512];
    policy(text, sizeof text, k ? 0 : p->warm_channels, keep);
    cph_policy *pol;
    cph_err err;
    if (cph_policy_load_text("reload.edn", text, strlen(text), &pol, &err) != CPH_OK ||
        (cph_fixture_policy_for_run(pol), cph_engine_reload(f[k]->e, pol, &err)) != CPH_OK)
      fail_msg("seed %llu: reload: %s", (unsigned long long)p->seed, err.msg);
    free(f[k]->policy); /* restarts read it */
    f[k]->policy = strdup(text);
    assert_non_null(f[k]->policy);
  }
  p->keep = keep;
}

static const char *policy(char *buf, size_t size, int warm_channels, int keep_turns) {
  snprintf(buf, size,
           "{:scheduler {:concurrency 2\n"
           "             :lanes {:interactive {:turns 100000 :tool-calls 100000}}\n"
           "             :credits {:refill-per-second 0 :cost {:interactive 0}}}\n"
           " :dedupe {:window-seconds 0}\n"
           " :leases {:ttl-seconds 5 :max-attempts 3}\n"
           " :sessions {:warm-channels %d :janitor? false :max-batch 2}\n"
           " :store {:sync :none}\n"
           " :server {:map-size-mb 64}\n"
           " :context {:keep-turns %d}}\n",
           warm_channels, keep_turns);
  return buf;
}

static void run_case(uint64_t seed) {
  rng r = {seed};
  static const int warm_choices[] = {1, 2, 3, 1024};
  char wp[512], cp[512];
  pair p = {0};
  p.seed = seed;
  static const int keep_choices[] = {1, 2, 3, 8};
  p.keep = keep_choices[below(&r, 4)];
  p.warm_channels = warm_choices[below(&r, 4)];
  /* The warm engine keeps memory records decoded (core/memcache.h) within a bound of its own
   * stream: a record or two (evicted all the time) or the default; the cold one none. */
  rng mr = {seed ^ 0x3e3c0ac4e5ull};
  static const long long cache_bytes[] = {600, -1};
  p.memory_cache_bytes = cache_bytes[below(&mr, 2)];
  memory_test_cache_bytes(p.memory_cache_bytes);
  p.warm = cph_fixture_new("warm", policy(wp, sizeof wp, p.warm_channels, p.keep));
  memory_test_cache_bytes(0);
  p.cold = cph_fixture_new("cold", policy(cp, sizeof cp, 0, p.keep));
  memory_test_cache_bytes(-1);
  create_sessions(&p, &r);
  p.mixed = below(&r, 2) == 0;
  p.dr = (rng){seed ^ 0xdefe44eddull};
  p.defer = below(&p.dr, 2) == 0;
  /* The kept contexts' warm states and keep-turns changes draw from their own stream, so the
   * operations above are the cases they were before. Bounds: none kept (every lease rebuilds),
   * about one session's (evicted all the time), the default. */
  rng kr = {seed ^ 0x5eed0fca11ab1eull};
  static const long long warm_bytes[] = {0, 24 << 10, 96 << 10, -1};
  p.warm_bytes = warm_bytes[below(&kr, 4)];
  bool keep_changes = below(&kr, 2) == 0;
  /* In a third of the cases the warm engine names new rows by their whole hash now and then,
   * as before row names carried their turn, so both kinds of names meet in one session. */
  bool names_mixed = below(&kr, 3) == 0;
  for (int step = 0; step < STEPS; step++) {
    if (keep_changes && below(&kr, 12) == 0) {
      static const int reload_choices[] = {0, 1, 2, 3, 5, 8};
      reload_keep(&p, reload_choices[below(&kr, 6)]);
    }
    if (below(&kr, 25) == 0)
      recreate_session(&p, &kr);
    if (p.mixed && below(&r, 8) == 0)
      p.warm_v2 = !p.warm_v2;
    if (names_mixed && below(&kr, 6) == 0)
      p.hash_names = !p.hash_names;
    uint32_t what = below(&r, 20);
    if (what == 0) /* a busy channel: tails past one read step (64 entries) and past 512 */
      for (uint32_t n = 20 + below(&r, 60); n > 0; n--)
        post(&p, &r);
    else if (what < 8)
      post(&p, &r);
    else if (what < 15)
      turn(&p, &r);
    else if (what < 17)
      insert_node(&p, &r);
    else if (what < 19)
      advance_both(&p, (int64_t)(1 + below(&r, 6)) * CPH_NS_PER_S); /* expiries, ticks */
    else
      restart_both(&p);
    pass_both(&p);
  }
  while (turn(&p, &r)) /* drain: every remaining turn compared too */
    pass_both(&p);
  recheck_kept(&p);
  restart_both(&p);
  recheck_kept(&p);
  cph_engine_close(p.warm->e);
  p.warm->e = NULL;
  check_texts(&p);
  check_rows(&p);
  for (size_t i = 0; i < p.n_reads; i++)
    free(p.reads[i].text);
  free(p.reads);
  cph_fixture_free(p.warm);
  cph_fixture_free(p.cold);
}

static void test_warm_context_equals_rebuilt_context(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(17001, DEFAULT_CASES, &seed, &cases);
  print_message("warm context property: %ld cases from seed %llu\n", cases,
                (unsigned long long)seed);
  for (long i = 0; i < cases; i++)
    run_case(seed + (uint64_t)i);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warm_context_equals_rebuilt_context),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
