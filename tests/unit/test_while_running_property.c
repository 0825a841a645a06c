/* Arrivals during a running turn (DESIGN §4 `while_running`), as a property of the engine:
 * under every mode — enqueue, merge, interrupt, restart, reject, per session or from the
 * class default — and whatever the interleaving of events, leases held open, heartbeats,
 * takes, normal and interrupted completions, stale completions of superseded leases, fails,
 * expiries and restarts, the accounting rule (§5) holds: every event that reached a session
 * (the result's `sessions`) is carried by exactly one completed, not interrupted, turn of it
 * — in its lease's `staged` or in a take's `taken` — and an event a session refused
 * (`busy`, reason session_busy) never reaches it.
 *
 * Also per step: `busy` only ever names a session in :reject with a turn the test holds;
 * `taken` only on a :merge session; `interrupt` only on :interrupt after something arrived;
 * a superseded lease's heartbeat and completion answer CPH_ESUPERSEDED (or, once it
 * expired, a conflict) and change nothing.
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

#define MAX_SESSIONS 4
#define N_CHANNELS 3
#define MAX_EVENTS 4096
#define DEFAULT_CASES 1500

static const char *const CHANNELS[N_CHANNELS] = {"general", "ops", "alerts"};
static const char *const TEXTS[] = {
    "restart the web service on host alpha", "no, the staging cluster",
    "nightly backup job failed on storage node seven please check", "ok",
    "deploy build 41 to staging", "restart the web service on host alpha",
};
#define N_TEXTS (sizeof TEXTS / sizeof TEXTS[0])

/* A turn the test holds open: its lease op (owning the turn) and what it took since. */
typedef struct held {
  bool open;
  cph_op lease;
  uint64_t *taken; /* event ids of the entries taken into it */
  size_t n_taken, cap_taken;
  bool asked;      /* a heartbeat said interrupt */
} held;

typedef struct model {
  uint64_t seed;
  int n_sessions;
  char ids[MAX_SESSIONS][16];
  bool subscribed[MAX_SESSIONS][N_CHANNELS];
  cph_policy_while_running mode[MAX_SESSIONS];
  held turn[MAX_SESSIONS]; /* at most one turn per session (serial order) */
  uint8_t *routed[MAX_SESSIONS];
  uint32_t *carried[MAX_SESSIONS];
  uint64_t max_event;
  uint64_t busy_answers, takes, interrupts, superseded;
} model;

#define FAIL(m, ...)                                                                          \
  do {                                                                                        \
    char msg_[1024];                                                                          \
    snprintf(msg_, sizeof msg_, __VA_ARGS__);                                                 \
    fail_msg("seed %llu: %s", (unsigned long long)(m)->seed, msg_);                          \
  } while (0)

static int session_index(const model *m, const char *id) {
  for (int i = 0; i < m->n_sessions; i++)
    if (strcmp(m->ids[i], id) == 0)
      return i;
  return -1;
}

static void count_carried(model *m, int s, uint64_t id) {
  if (id >= MAX_EVENTS)
    FAIL(m, "event id %llu out of range", (unsigned long long)id);
  m->carried[s][id]++;
}

static void held_drop(held *h) {
  if (h->open)
    cph_op_clear_results(&h->lease);
  free(h->taken);
  memset(h, 0, sizeof *h);
}

/* ---------------------------------------------------------------- operations */

static void create_sessions(cph_fixture *f, model *m, rng *r,
                            const cph_policy_while_running class_mode[2]) {
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
    if (below(r, 3)) { /* its own mode; else the class's */
      op.u.session.in.while_running = (cph_policy_while_running)below(r, CPH_POLICY_WR_COUNT);
      op.u.session.set = CPH_SET_WHILE_RUNNING;
    }
    if (cph_fixture_run(f, &op))
      FAIL(m, "create %s: %s", m->ids[i], op.err.msg);
    m->mode[i] = op.u.session.set ? op.u.session.in.while_running
                                  : class_mode[op.u.session.in.lane == CPH_LANE_OPERATIONAL];
    if (op.u.session.out.while_running != m->mode[i] ||
        op.u.session.out.while_running_class != !op.u.session.set)
      FAIL(m, "%s: while_running %d (class %d), want %d", m->ids[i],
           op.u.session.out.while_running, op.u.session.out.while_running_class, m->mode[i]);
    cph_op_clear_results(&op);
  }
}

static void post_request(cph_fixture *f, model *m, rng *r) {
  cph_event_in evs[4];
  char *mentions[4][1];
  memset(evs, 0, sizeof evs);
  size_t n = 1 + below(r, 4);
  for (size_t i = 0; i < n; i++) {
    cph_event_in *e = &evs[i];
    e->sender = below(r, 2) ? "alice" : "bob";
    e->body = (char *)TEXTS[below(r, N_TEXTS)];
    if (below(r, 3) == 0)
      e->session = m->ids[below(r, (uint32_t)m->n_sessions)];
    else
      e->channel = (char *)CHANNELS[below(r, N_CHANNELS)];
    if (below(r, 5) == 0) {
      mentions[i][0] = m->ids[below(r, (uint32_t)m->n_sessions)];
      e->mentions.items = mentions[i];
      e->mentions.count = 1;
    }
  }
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = evs;
  op.u.ingest.n_events = n;
  if (cph_fixture_run(f, &op))
    FAIL(m, "ingest: %s", op.err.msg);
  for (size_t i = 0; i < n; i++) {
    const cph_event_result *res = &op.u.ingest.results[i];
    const cph_event_in *e = &evs[i];
    if (res->id == 0 || res->status == CPH_EV_DUPLICATE)
      FAIL(m, "event %zu: status %s without an id", i, cph_ingest_status_name(res->status));
    if (res->id >= MAX_EVENTS)
      FAIL(m, "event id %llu past the table", (unsigned long long)res->id);
    if (res->id > m->max_event)
      m->max_event = res->id;
    bool want[MAX_SESSIONS] = {0};
    if (e->session) {
      want[session_index(m, e->session)] = true;
    } else {
      int c = 0;
      while (strcmp(CHANNELS[c], e->channel))
        c++;
      for (int s = 0; s < m->n_sessions; s++)
        want[s] = m->subscribed[s][c];
    }
    if (e->mentions.count)
      want[session_index(m, e->mentions.items[0])] = true;
    bool got[MAX_SESSIONS] = {0}, busy[MAX_SESSIONS] = {0};
    for (size_t j = 0; j < res->sessions.count; j++)
      got[session_index(m, res->sessions.items[j])] = true;
    for (size_t j = 0; j < res->busy.count; j++)
      busy[session_index(m, res->busy.items[j])] = true;
    size_t n_got = 0;
    for (int s = 0; s < m->n_sessions; s++) {
      if (want[s] != (got[s] || busy[s]) || (got[s] && busy[s]))
        FAIL(m, "event %llu to %s: routed %d, reached %d, refused %d",
             (unsigned long long)res->id, m->ids[s], want[s], got[s], busy[s]);
      /* Refused only by a :reject session whose turn may still run (the test holds it; it
       * may have expired, in which case the event reaches it). */
      if (busy[s] && (m->mode[s] != CPH_POLICY_WR_REJECT || !m->turn[s].open))
        FAIL(m, "event %llu refused by %s (mode %s, turn held %d)", (unsigned long long)res->id,
             m->ids[s], cph_policy_while_running_name(m->mode[s]), m->turn[s].open);
      if (busy[s])
        m->busy_answers++;
      if (got[s])
        m->routed[s][res->id] = 1;
      n_got += got[s];
    }
    bool refused = res->busy.count > 0 && n_got == 0;
    if (refused != (res->status == CPH_EV_REJECTED) ||
        (refused && (!res->reason || strcmp(res->reason, "session_busy"))))
      FAIL(m, "event %llu: status %s reason %s with %zu reached, %zu refused",
           (unsigned long long)res->id, cph_ingest_status_name(res->status),
           res->reason ? res->reason : "-", n_got, res->busy.count);
  }
  cph_op_clear_results(&op);
}

/* Leases a turn and holds it open. */
static void lease_one(cph_fixture *f, model *m) {
  held h = {0};
  h.lease.kind = CPH_OP_LEASE;
  h.lease.u.lease.worker = "w";
  h.lease.u.lease.deadline_ns = cph_clock_now(&f->clock);
  if (cph_fixture_run(f, &h.lease) != CPH_OK) {
    cph_op_clear_results(&h.lease);
    return;
  }
  const cph_turn_info *t = &h.lease.u.lease.turn;
  int s = session_index(m, t->session);
  if (s < 0)
    FAIL(m, "turn of unknown session %s", t->session);
  if (m->turn[s].open) /* the engine let the old one go (expiry, supersede): forget it */
    held_drop(&m->turn[s]);
  if (t->while_running != m->mode[s])
    FAIL(m, "turn %llu says while_running %d, session %s has %d", (unsigned long long)t->id,
         t->while_running, m->ids[s], m->mode[s]);
  h.open = true;
  m->turn[s] = h;
}

static void turn_op(cph_op *op, cph_op_kind kind, const cph_turn_info *t) {
  memset(op, 0, sizeof *op);
  op->kind = kind;
  op->u.turn.turn_id = t->id;
  snprintf(op->u.turn.lease, sizeof op->u.turn.lease, "%s", t->lease);
}

/* A lease the engine may have ended: answers that say so. */
static bool ended(int rc) {
  return rc == CPH_ESUPERSEDED || rc == CPH_ECONFLICT;
}

static void heartbeat(cph_fixture *f, model *m, int s) {
  held *h = &m->turn[s];
  cph_op op;
  turn_op(&op, CPH_OP_HEARTBEAT, &h->lease.u.lease.turn);
  int rc = cph_fixture_run(f, &op);
  if (rc == CPH_OK) {
    if (op.u.turn.interrupt && (m->mode[s] != CPH_POLICY_WR_INTERRUPT || !(op.u.turn.arrived || h->asked)))
      FAIL(m, "%s (mode %s): interrupt with %u arrived", m->ids[s],
           cph_policy_while_running_name(m->mode[s]), op.u.turn.arrived);
    h->asked |= op.u.turn.interrupt;
  } else if (!ended(rc)) {
    FAIL(m, "heartbeat of %s: %s", m->ids[s], op.err.msg);
  } else if (rc == CPH_ESUPERSEDED && m->mode[s] != CPH_POLICY_WR_RESTART) {
    FAIL(m, "heartbeat of %s (mode %s) answered superseded", m->ids[s],
         cph_policy_while_running_name(m->mode[s]));
  }
  cph_op_clear_results(&op);
}

static void take(cph_fixture *f, model *m, int s) {
  held *h = &m->turn[s];
  cph_op op;
  turn_op(&op, CPH_OP_TAKE, &h->lease.u.lease.turn);
  int rc = cph_fixture_run(f, &op);
  if (rc == CPH_OK) {
    if (m->mode[s] != CPH_POLICY_WR_MERGE)
      FAIL(m, "take on %s (mode %s) answered", m->ids[s],
           cph_policy_while_running_name(m->mode[s]));
    for (size_t i = 0; i < op.u.turn.n_taken; i++) {
      const cph_staged_msg *e = &op.u.turn.taken[i];
      if (e->count != e->n_event_ids || !e->count)
        FAIL(m, "taken entry %llu: count %u, %zu ids", (unsigned long long)e->id, e->count,
             e->n_event_ids);
      for (size_t j = 0; j < e->n_event_ids; j++) {
        if (h->n_taken == h->cap_taken) {
          h->cap_taken = h->cap_taken ? 2 * h->cap_taken : 16;
          h->taken = realloc(h->taken, h->cap_taken * sizeof *h->taken);
        }
        h->taken[h->n_taken++] = e->event_ids[j];
      }
      m->takes++;
    }
  } else if (rc == CPH_ECONFLICT || rc == CPH_ESUPERSEDED) {
    if (m->mode[s] == CPH_POLICY_WR_MERGE && rc == CPH_ESUPERSEDED)
      FAIL(m, "take on merging %s answered superseded", m->ids[s]);
  } else {
    FAIL(m, "take on %s: %s", m->ids[s], op.err.msg);
  }
  cph_op_clear_results(&op);
}

/* Completes (normally, or interrupted when asked and the coin says so) or fails the held
 * turn of s; counts what a normal completion carried. */
static void finish(cph_fixture *f, model *m, rng *r, int s, bool fail) {
  held *h = &m->turn[s];
  const cph_turn_info *t = &h->lease.u.lease.turn;
  cph_op op;
  turn_op(&op, fail ? CPH_OP_FAIL : CPH_OP_COMPLETE, t);
  bool interrupted = !fail && h->asked && below(r, 4) != 0;
  op.u.turn.interrupted = interrupted;
  op.u.turn.reply_body = below(r, 2) ? "done so far: restart_host(alpha) -> restarted" : NULL;
  if (fail)
    op.u.turn.error = "model error";
  int rc = cph_fixture_run(f, &op);
  if (rc == CPH_OK && !fail && !interrupted && !op.u.turn.already) {
    for (size_t i = 0; i < t->n_staged; i++) {
      const cph_staged_msg *e = &t->staged[i];
      if (e->count != e->n_event_ids || !e->count)
        FAIL(m, "entry %llu: count %u, %zu ids", (unsigned long long)e->id, e->count,
             e->n_event_ids);
      for (size_t j = 0; j < e->n_event_ids; j++)
        count_carried(m, s, e->event_ids[j]);
    }
    for (size_t i = 0; i < h->n_taken; i++)
      count_carried(m, s, h->taken[i]);
  } else if (rc == CPH_OK && interrupted) {
    m->interrupts++;
  } else if (rc == CPH_ESUPERSEDED) {
    if (m->mode[s] != CPH_POLICY_WR_RESTART)
      FAIL(m, "completion of %s (mode %s) answered superseded", m->ids[s],
           cph_policy_while_running_name(m->mode[s]));
    m->superseded++;
    /* a second try changes nothing either */
    cph_op again;
    turn_op(&again, CPH_OP_COMPLETE, t);
    if (cph_fixture_run(f, &again) != CPH_ESUPERSEDED)
      FAIL(m, "a stale completion of %s, retried, did not answer superseded", m->ids[s]);
    cph_op_clear_results(&again);
  } else if (rc != CPH_OK && !ended(rc)) {
    FAIL(m, "%s of %s: %s", fail ? "fail" : "complete", m->ids[s], op.err.msg);
  }
  cph_op_clear_results(&op);
  held_drop(h);
}

static const char *policy_for(rng *r, char *buf, size_t size,
                              cph_policy_while_running class_mode[2]) {
  class_mode[0] = (cph_policy_while_running)below(r, CPH_POLICY_WR_COUNT);
  class_mode[1] = (cph_policy_while_running)below(r, CPH_POLICY_WR_COUNT);
  static const int batches[] = {1, 2, 64};
  static const int queues[] = {3, 1000};
  snprintf(buf, size,
           "{:scheduler {:concurrency 4\n"
           "             :lanes {:interactive {:turns 100000 :tool-calls 100000}\n"
           "                     :operational {:turns 100000 :tool-calls 100000}}}\n"
           " :leases {:ttl-seconds 5 :max-attempts 1000}\n"
           " :sessions {:max-queue %d :max-batch %d :janitor? false\n"
           "            :while-running {:interactive :%s :operational :%s}}\n"
           " :store {:sync :none}\n"
           " :server {:map-size-mb 64}}\n",
           queues[below(r, 2)], batches[below(r, 3)],
           cph_policy_while_running_name(class_mode[0]),
           cph_policy_while_running_name(class_mode[1]));
  return buf;
}

static void run_case(uint64_t seed, model *totals) {
  rng r = {seed};
  model m = {0};
  m.seed = seed;
  char policy[1024];
  cph_policy_while_running class_mode[2];
  cph_fixture *f = cph_fixture_new("while", policy_for(&r, policy, sizeof policy, class_mode));
  for (int s = 0; s < MAX_SESSIONS; s++) {
    m.routed[s] = calloc(MAX_EVENTS, 1);
    m.carried[s] = calloc(MAX_EVENTS, sizeof(uint32_t));
  }
  create_sessions(f, &m, &r, class_mode);
  int ops = 30 + (int)below(&r, 70);
  for (int i = 0; i < ops; i++) {
    uint32_t what = below(&r, 100);
    int s = (int)below(&r, (uint32_t)m.n_sessions);
    if (what < 40) {
      post_request(f, &m, &r);
    } else if (what < 55) {
      lease_one(f, &m);
    } else if (what < 85 && m.turn[s].open) {
      uint32_t how = below(&r, 10);
      if (how < 4)
        heartbeat(f, &m, s);
      else if (how < 6)
        take(f, &m, s);
      else
        finish(f, &m, &r, s, how == 9);
    } else if (what < 95) {
      cph_clock_advance(&f->clock, (int64_t)below(&r, 4000) * CPH_NS_PER_MS);
    } else if (what < 97) {
      cph_engine_close(f->e); /* a restart: leases in flight expire, inboxes come back */
      cph_fixture_open(f);
      for (int k = 0; k < m.n_sessions; k++)
        held_drop(&m.turn[k]);
    }
  }
  /* Drain: finish what is held, then lease and complete until nothing is left. */
  for (int k = 0; k < m.n_sessions; k++)
    if (m.turn[k].open)
      finish(f, &m, &r, k, false);
  for (int rounds = 0; rounds < 10000; rounds++) {
    bool ran = false;
    for (int wait = 0; !ran && wait < 4; wait++) {
      lease_one(f, &m);
      for (int k = 0; k < m.n_sessions; k++)
        if (m.turn[k].open) {
          finish(f, &m, &r, k, false);
          ran = true;
        }
      if (!ran) {
        cph_clock_advance(&f->clock, 6 * CPH_NS_PER_S);
        cph_engine_run_pass(f->e);
      }
    }
    if (!ran)
      break;
  }
  for (int s = 0; s < m.n_sessions; s++) {
    cph_session_info info;
    cph_err err;
    if (cph_engine_get_session(f->e, m.ids[s], &info, &err))
      FAIL(&m, "get %s: %s", m.ids[s], err.msg);
    if (info.pending + info.staged)
      FAIL(&m, "%s still holds %u entries after the drain", m.ids[s], info.pending + info.staged);
    cph_session_info_free(&info);
    for (uint64_t id = 1; id <= m.max_event; id++)
      if (m.carried[s][id] != m.routed[s][id])
        FAIL(&m, "session %s (mode %s), event %llu: reached it %u, carried by completed turns "
                 "%u times",
             m.ids[s], cph_policy_while_running_name(m.mode[s]), (unsigned long long)id,
             m.routed[s][id], m.carried[s][id]);
  }
  totals->busy_answers += m.busy_answers;
  totals->takes += m.takes;
  totals->interrupts += m.interrupts;
  totals->superseded += m.superseded;
  for (int s = 0; s < MAX_SESSIONS; s++) {
    held_drop(&m.turn[s]);
    free(m.routed[s]);
    free(m.carried[s]);
  }
  cph_fixture_free(f);
}

static void test_every_mode_keeps_each_reached_event_carried_exactly_once(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(20260419, DEFAULT_CASES, &seed, &cases);
  print_message("while_running property: %ld cases from seed %llu\n", cases,
                (unsigned long long)seed);
  model totals = {0};
  for (long i = 0; i < cases; i++)
    run_case(seed + (uint64_t)i, &totals);
  print_message("  refusals %llu, entries taken %llu, interrupted completions %llu, stale "
                "completions of superseded leases %llu\n",
                (unsigned long long)totals.busy_answers, (unsigned long long)totals.takes,
                (unsigned long long)totals.interrupts, (unsigned long long)totals.superseded);
  /* The mix must reach every mode's path, or the property proves little. */
  if (cases >= 200)
    assert_true(totals.busy_answers && totals.takes && totals.interrupts && totals.superseded);
}

int main(void) {
  cph_log_set_level(CPH_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_mode_keeps_each_reached_event_carried_exactly_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
