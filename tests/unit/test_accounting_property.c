/* The accounting rule (DESIGN §5), as a property: whatever mix of people, bots, mentions,
 * direct messages, idempotency retries, repeats, floods, backpressure, queue overflow, failed
 * and expired leases, turns parked after too many attempts and requeued, and restarts (the
 * queue cap's folded entries are told at load by each session's folded map, which a requeue
 * must keep right: core/inbox.h), every event accepted for a session reaches it exactly once
 * — as its own staged entry or counted inside one — over the turns it completes.
 *
 * Each case draws a policy, sessions and an operation sequence from one seed, runs it through
 * the engine's public API on a virtual clock and a fresh LMDB, drains every session, and checks
 * for each session that the event ids of all its completed turns' entries are exactly the
 * events routed to it (the model below says which: its explicit session, else the channel's
 * subscribers, plus every mention), each once, and that every entry's count equals its ids.
 * And that the worker reads what was written: an entry of one event shows that event's text,
 * and a folded entry shows its first event's text among its lines — whatever backpressure did
 * (step 5 drops the payload of a repeat only where another entry already shows its text).
 *
 * CPH_PROPERTY_SEED=<n> runs from that seed; CPH_PROPERTY_CASES=<n> sets how many cases. A
 * failure prints the case's seed: rerun with CPH_PROPERTY_SEED=<seed> CPH_PROPERTY_CASES=1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "common/log.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/prop.h"
#include "tests/support/testutil.h"

#define MAX_SESSIONS 5
#define N_CHANNELS 4
#define MAX_EVENTS 4096
#define DEFAULT_CASES 2000

static const char *const CHANNELS[N_CHANNELS] = {"general", "ops", "alerts", "floor"};
static const char *const SENDERS[] = {"alice", "bob", "carol", "nagios", "feedbot"};
/* Repeats, near variants (one word apart), number variants, short chat. */
static const char *const TEXTS[] = {
    "restart the web service on host alpha",
    "restart the web service on host beta",
    "nightly backup job failed on storage node seven please check",
    "nightly backup job failed on storage node eight please check",
    "queue depth on worker pool is now 3 items waiting",
    "queue depth on worker pool is now 12 items waiting",
    "deploy build 41 to staging",
    "ok",
    "sounds good",
    "can you check why the nightly backup of the users database failed again",
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* What the test knows: which sessions exist, what they listen to, and per session the events
 * routed to it and the events its completed turns carried. */
typedef struct model {
  int n_sessions;
  char ids[MAX_SESSIONS][16];
  bool subscribed[MAX_SESSIONS][N_CHANNELS];
  uint8_t *routed[MAX_SESSIONS];   /* routed[s][event id] = 1 */
  uint32_t *carried[MAX_SESSIONS]; /* times a completed turn carried it */
  char *text[MAX_EVENTS];          /* each accepted event's body */
  uint64_t max_event;
  uint64_t seed;
} model;

static int session_index(const model *m, const char *id) {
  for (int i = 0; i < m->n_sessions; i++)
    if (strcmp(m->ids[i], id) == 0)
      return i;
  return -1;
}

static void create_sessions(cph_fixture *f, model *m, rng *r) {
  m->n_sessions = 2 + (int)below(r, MAX_SESSIONS - 1);
  for (int i = 0; i < m->n_sessions; i++) {
    snprintf(m->ids[i], sizeof m->ids[i], "s%d", i);
    char *subs[N_CHANNELS];
    size_t n = 0;
    for (int c = 0; c < N_CHANNELS; c++)
      if ((m->subscribed[i][c] = below(r, 2)))
        subs[n++] = (char *)CHANNELS[c];
    cph_op op = {0};
    op.kind = CPH_OP_SESSION_CREATE;
    op.u.session.in.id = m->ids[i];
    op.u.session.in.lane = below(r, 2) ? CPH_LANE_INTERACTIVE : CPH_LANE_OPERATIONAL;
    op.u.session.in.subscribe.items = subs;
    op.u.session.in.subscribe.count = n;
    static const uint32_t report_every[] = {0, 0, 2, 5}; /* some hold for report turns */
    op.u.session.in.report_interval_s = report_every[below(r, 4)];
    if (cph_fixture_run(f, &op))
      fail_msg("seed %llu: create %s: %s", (unsigned long long)m->seed, m->ids[i], op.err.msg);
    cph_op_clear_results(&op);
  }
}

/* One request of 1..6 events. The model routes each accepted event itself and checks the
 * engine's `sessions` against it. */
static void post_request(cph_fixture *f, model *m, rng *r) {
  cph_event_in evs[6];
  char *mentions[6][2];
  char bodies[6][128], keys[6][16];
  size_t n = 1 + below(r, 6);
  memset(evs, 0, sizeof evs);
  bool flood = below(r, 8) == 0; /* a bot repeating one alert */
  for (size_t i = 0; i < n; i++) {
    cph_event_in *e = &evs[i];
    e->sender = (char *)SENDERS[flood ? 3 : below(r, 5)];
    uint32_t pick = flood ? 2 : below(r, N_TEXTS + 3);
    if (pick < N_TEXTS)
      snprintf(bodies[i], sizeof bodies[i], "%s", TEXTS[pick]);
    else
      snprintf(bodies[i], sizeof bodies[i], "a distinct message number %llu",
               (unsigned long long)next(r) % 100000);
    e->body = bodies[i];
    if (!flood && below(r, 6) == 0)
      e->session = m->ids[below(r, (uint32_t)m->n_sessions)]; /* a direct message */
    else
      e->channel = (char *)CHANNELS[flood ? 2 : below(r, N_CHANNELS)];
    if (!flood && below(r, 4) == 0) {
      size_t k = 1 + below(r, 2);
      for (size_t j = 0; j < k; j++)
        mentions[i][j] = below(r, 5) == 0 ? "ghost" : m->ids[below(r, (uint32_t)m->n_sessions)];
      e->mentions.items = mentions[i];
      e->mentions.count = k;
    }
    if (below(r, 5) == 0) { /* an idempotency key from a small pool: some are retries */
      snprintf(keys[i], sizeof keys[i], "k%u", below(r, 6));
      e->key = keys[i];
    }
  }
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = evs;
  op.u.ingest.n_events = n;
  if (cph_fixture_run(f, &op))
    fail_msg("seed %llu: ingest: %s", (unsigned long long)m->seed, op.err.msg);
  for (size_t i = 0; i < n; i++) {
    const cph_event_result *res = &op.u.ingest.results[i];
    if (res->status == CPH_EV_REJECTED || res->status == CPH_EV_DUPLICATE)
      continue; /* a retry of a stored event, or nothing stored */
    if (res->id >= MAX_EVENTS)
      fail_msg("seed %llu: event id %llu past the test's table", (unsigned long long)m->seed,
               (unsigned long long)res->id);
    if (res->id > m->max_event)
      m->max_event = res->id;
    free(m->text[res->id]);
    m->text[res->id] = strdup(evs[i].body);
    bool want[MAX_SESSIONS] = {0};
    const cph_event_in *e = &evs[i];
    if (e->session) {
      want[session_index(m, e->session)] = true;
    } else {
      int c = 0;
      while (strcmp(CHANNELS[c], e->channel))
        c++;
      for (int s = 0; s < m->n_sessions; s++)
        want[s] = m->subscribed[s][c];
    }
    for (size_t j = 0; j < e->mentions.count; j++) {
      int s = session_index(m, e->mentions.items[j]);
      if (s >= 0)
        want[s] = true;
    }
    bool got[MAX_SESSIONS] = {0};
    for (size_t j = 0; j < res->sessions.count; j++) {
      int s = session_index(m, res->sessions.items[j]);
      if (s < 0 || got[s])
        fail_msg("seed %llu: event %llu answered session '%s' twice or unknown",
                 (unsigned long long)m->seed, (unsigned long long)res->id,
                 res->sessions.items[j]);
      got[s] = true;
    }
    for (int s = 0; s < m->n_sessions; s++) {
      if (want[s] != got[s])
        fail_msg("seed %llu: event %llu (%s) routed to %s: model %d, engine %d",
                 (unsigned long long)m->seed, (unsigned long long)res->id, e->body, m->ids[s],
                 want[s], got[s]);
      if (want[s])
        m->routed[s][res->id] = 1;
    }
  }
  cph_op_clear_results(&op);
}

/* Checks one turn's entries and, when completed, counts what it carried. */
static void note_turn(model *m, const cph_turn_info *t, bool completed) {
  int s = session_index(m, t->session);
  if (s < 0)
    fail_msg("seed %llu: turn of unknown session %s", (unsigned long long)m->seed, t->session);
  for (size_t i = 0; i < t->n_staged; i++) {
    const cph_staged_msg *e = &t->staged[i];
    if (e->count != e->n_event_ids || e->count == 0 || e->event_ids[0] != e->event_id)
      fail_msg("seed %llu: entry %llu of %s: count %u, %zu ids", (unsigned long long)m->seed,
               (unsigned long long)e->id, t->session, e->count, e->n_event_ids);
    const char *want = e->event_id < MAX_EVENTS ? m->text[e->event_id] : NULL;
    bool shown =
        want && (e->count == 1 ? strcmp(e->body, want) == 0 : strstr(e->body, want) != NULL);
    if (!shown)
      fail_msg("seed %llu: entry %llu of %s (%u events, fold %s) shows \"%s\", not the text of "
               "its event %llu: \"%s\"",
               (unsigned long long)m->seed, (unsigned long long)e->id, t->session, e->count,
               e->fold, e->body, (unsigned long long)e->event_id, want ? want : "(unknown)");
    if (!completed)
      continue;
    for (size_t j = 0; j < e->n_event_ids; j++) {
      if (e->event_ids[j] >= MAX_EVENTS)
        fail_msg("seed %llu: event id %llu out of range", (unsigned long long)m->seed,
                 (unsigned long long)e->event_ids[j]);
      m->carried[s][e->event_ids[j]]++;
    }
  }
}

/* Leases one turn (any lane); then completes it, fails it, or leaves it to expire. false when
 * nothing was ready. */
static bool run_turn(cph_fixture *f, model *m, rng *r, int how) {
  cph_op op = {0};
  op.kind = CPH_OP_LEASE;
  op.u.lease.worker = "w";
  op.u.lease.deadline_ns = cph_clock_now(&f->clock);
  if (cph_fixture_run(f, &op) != CPH_OK) {
    cph_op_clear_results(&op);
    return false;
  }
  const cph_turn_info *t = &op.u.lease.turn;
  if (how < 0)
    how = (int)below(r, 10);
  if (how >= 2) {
    cph_op c = {0};
    c.kind = CPH_OP_COMPLETE;
    c.u.turn.turn_id = t->id;
    snprintf(c.u.turn.lease, sizeof c.u.turn.lease, "%s", t->lease);
    c.u.turn.reply_body = below(r, 2) ? "on it" : NULL;
    int rc = cph_fixture_run(f, &c);
    if (rc)
      fail_msg("seed %llu: complete turn %llu: %s", (unsigned long long)m->seed,
               (unsigned long long)t->id, c.err.msg);
    note_turn(m, t, true);
    cph_op_clear_results(&c);
  } else if (how == 1) {
    cph_op c = {0};
    c.kind = CPH_OP_FAIL;
    c.u.turn.turn_id = t->id;
    snprintf(c.u.turn.lease, sizeof c.u.turn.lease, "%s", t->lease);
    c.u.turn.error = "model error";
    cph_fixture_run(f, &c);
    note_turn(m, t, false);
    cph_op_clear_results(&c);
  } else {
    note_turn(m, t, false); /* left to expire */
  }
  cph_op_clear_results(&op);
  return true;
}

/* Requeues every parked turn: its entries are staged again. */
static void requeue_parked(cph_fixture *f, const model *m) {
  cph_parked_turn *p = NULL;
  size_t n = 0;
  cph_err err;
  if (cph_engine_parked_turns(f->e, &p, &n, &err))
    fail_msg("seed %llu: parked turns: %s", (unsigned long long)m->seed, err.msg);
  for (size_t i = 0; i < n; i++) {
    cph_op op = {0};
    op.kind = CPH_OP_REQUEUE;
    op.u.turn.turn_id = p[i].id;
    if (cph_fixture_run(f, &op))
      fail_msg("seed %llu: requeue turn %llu: %s", (unsigned long long)m->seed,
               (unsigned long long)p[i].id, op.err.msg);
    cph_op_clear_results(&op);
    cph_parked_turn_free(&p[i]);
  }
  free(p);
}

static const char *policy_for(rng *r, char *buf, size_t size) {
  static const int queues[] = {2, 3, 5, 1000};
  static const int batches[] = {1, 2, 64};
  /* Drawn one by one, in this order: the order a call evaluates its arguments in is the
   * compiler's, and a seed must give the same policy whatever built the test. */
  int attempts = below(r, 2) ? 2 : 1000;
  int queue = queues[below(r, 4)];
  int batch = batches[below(r, 3)];
  int window_s = below(r, 2) ? 300 : 5;
  int interval_s = below(r, 2) ? 10 : 1; /* 1 s: ops reaches step 5 */
  int ops_per_minute = (int[]){0, 20, 3}[below(r, 3)];
  snprintf(buf, size,
           "{:scheduler {:concurrency 2\n"
           "             :lanes {:interactive {:turns 100000 :tool-calls 100000}\n"
           "                     :operational {:turns 100000 :tool-calls 100000}}}\n"
           " :leases {:ttl-seconds 5 :max-attempts %d}\n"
           " :sessions {:max-queue %d :max-batch %d :janitor? false}\n"
           " :store {:sync :none}\n"
           " :server {:map-size-mb 64}\n"
           " :dedupe {:window-seconds %d :min-length 12 :near-distance 10\n"
           "          :bulk [\"alerts\" \"feedbot\"]}\n"
           " :backpressure {:interval-s %d :recover-intervals 2\n"
           "                :channels {\"floor\" {:degrade-to-aggregate-only? true}\n"
           "                           \"ops\" {:max-events-per-minute %d}}}}\n",
           attempts, queue, batch, window_s, interval_s, ops_per_minute);
  return buf;
}

static void run_case(uint64_t seed) {
  rng r = {seed};
  model m = {0};
  m.seed = seed;
  char policy[1024];
  cph_fixture *f = cph_fixture_new("accounting", policy_for(&r, policy, sizeof policy));
  for (int s = 0; s < MAX_SESSIONS; s++) {
    m.routed[s] = calloc(MAX_EVENTS, 1);
    m.carried[s] = calloc(MAX_EVENTS, sizeof(uint32_t));
  }
  create_sessions(f, &m, &r);
  int ops = 20 + (int)below(&r, 60);
  for (int i = 0; i < ops; i++) {
    uint32_t what = below(&r, 100);
    if (what < 50)
      post_request(f, &m, &r);
    else if (what < 80)
      run_turn(f, &m, &r, -1);
    else if (what < 93)
      cph_clock_advance(&f->clock, (int64_t)below(&r, 8000) * CPH_NS_PER_MS);
    else if (what < 96)
      requeue_parked(f, &m);
    else {
      cph_engine_close(f->e); /* a restart: leases in flight expire, inboxes come back */
      cph_fixture_open(f);
    }
  }
  /* Drain: every lease left open expires and every report falls due (a delayed one within
   * 4 x 5 s); then complete until nothing is left. */
  for (int rounds = 0; rounds < 10000; rounds++) {
    bool ran = run_turn(f, &m, &r, 2);
    for (int wait = 0; !ran && wait < 10; wait++) {
      cph_clock_advance(&f->clock, 6 * CPH_NS_PER_S);
      cph_engine_run_pass(f->e);
      requeue_parked(f, &m); /* what expired leases parked */
      ran = run_turn(f, &m, &r, 2);
    }
    if (!ran)
      break;
  }
  for (int s = 0; s < m.n_sessions; s++) {
    cph_session_info info;
    cph_err err;
    if (cph_engine_get_session(f->e, m.ids[s], &info, &err))
      fail_msg("seed %llu: get %s: %s", (unsigned long long)seed, m.ids[s], err.msg);
    if (info.pending + info.staged) {
      cph_why_info w;
      cph_engine_why(f->e, m.ids[s], &w, &err);
      fail_msg("seed %llu: %s still holds %u entries after the drain (why: %s, report in %lld s)",
               (unsigned long long)seed, m.ids[s], info.pending + info.staged, w.reason,
               (long long)w.next_report_in_s);
    }
    cph_session_info_free(&info);
    for (uint64_t id = 1; id <= m.max_event; id++)
      if (m.carried[s][id] != m.routed[s][id])
        fail_msg("seed %llu: session %s, event %llu: routed %u, carried by completed turns "
                 "%u times",
                 (unsigned long long)seed, m.ids[s], (unsigned long long)id, m.routed[s][id],
                 m.carried[s][id]);
  }
  for (int s = 0; s < MAX_SESSIONS; s++) {
    free(m.routed[s]);
    free(m.carried[s]);
  }
  for (uint64_t id = 0; id < MAX_EVENTS; id++)
    free(m.text[id]);
  cph_fixture_free(f);
}

static void test_every_routed_event_reaches_its_session_exactly_once(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(20261125, DEFAULT_CASES, &seed, &cases);
  print_message("accounting property: %ld cases from seed %llu\n", cases,
                (unsigned long long)seed);
  for (long i = 0; i < cases; i++)
    run_case(seed + (uint64_t)i);
}

int main(void) {
  cph_log_set_level(CPH_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_routed_event_reaches_its_session_exactly_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
