/* The deterministic scheduler simulator (contract in sim.h). */
#include "sim.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "pass.h"

/* ---------------------------------------------------------------- randomness */

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

typedef struct rng {
  uint64_t s; /* xorshift64* state, never 0 */
} rng;

static rng rng_seed(uint64_t seed, uint64_t session, uint64_t stream) {
  uint64_t x = seed ^ (session * UINT64_C(0x100000001b3)) ^ (stream << 56);
  rng r = {splitmix64(&x)};
  if (r.s == 0)
    r.s = UINT64_C(0x2545f4914f6cdd1d);
  return r;
}

static uint64_t rng_next(rng *r) {
  uint64_t x = r->s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  r->s = x;
  return x * UINT64_C(0x2545f4914f6cdd1d);
}

/* Uniform in [0, 1). */
static double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

static int64_t seconds_ns(double s) { return (int64_t)llround(s * 1e9); }

/* An exponential interval with the given mean, at least 1 ns. */
static int64_t rng_exp_ns(rng *r, double mean_s) {
  int64_t ns = seconds_ns(-mean_s * log1p(-rng_unit(r)));
  return ns < 1 ? 1 : ns;
}

/* ---------------------------------------------------------------- growable arrays */

typedef struct vec {
  int64_t *v;
  size_t n, cap;
} vec;

static bool vec_push(vec *a, int64_t x) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 256;
    int64_t *p = realloc(a->v, cap * sizeof *p);
    if (!p)
      return false;
    a->v = p;
    a->cap = cap;
  }
  a->v[a->n++] = x;
  return true;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array; 0 when empty. */
static int64_t percentile(const vec *a, double p) {
  if (!a->n)
    return 0;
  size_t rank = (size_t)ceil(p / 100.0 * (double)a->n);
  if (rank < 1)
    rank = 1;
  return a->v[rank - 1];
}

/* ---------------------------------------------------------------- events */

enum { EV_ARRIVAL, EV_COMPLETE, EV_TICK, EV_RELOAD, EV_END };

typedef struct event {
  int64_t at;
  uint64_t seq; /* ties at one instant go in the order they were scheduled */
  uint32_t kind;
  uint32_t session;
} event;

typedef struct event_heap {
  event *e;
  size_t n, cap;
} event_heap;

static bool ev_before(const event *a, const event *b) {
  return a->at != b->at ? a->at < b->at : a->seq < b->seq;
}

static void heap_up(event_heap *h, size_t i) {
  event x = h->e[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!ev_before(&x, &h->e[parent]))
      break;
    h->e[i] = h->e[parent];
    i = parent;
  }
  h->e[i] = x;
}

static event heap_pop(event_heap *h) {
  event top = h->e[0];
  event x = h->e[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n)
      break;
    if (c + 1 < h->n && ev_before(&h->e[c + 1], &h->e[c]))
      c++;
    if (!ev_before(&h->e[c], &x))
      break;
    h->e[i] = h->e[c];
    i = c;
  }
  if (h->n)
    h->e[i] = x;
  return top;
}

/* ---------------------------------------------------------------- the simulation */

typedef struct sim_session {
  const cph_sim_session *cfg;
  cph_sid sid;
  rng arrivals, durations;
  uint64_t pending; /* arrived, not yet staged */
  uint64_t staged;
  bool dirty;       /* on the pending list */
  bool running;
  bool outbox_turn; /* the running turn is an outbox batch */
} sim_session;

typedef struct sim {
  const cph_sim_config *cfg;
  cph_sim_result *out;
  cph_clock clock;
  cph_sched *s;
  sim_session *ss;
  size_t n;
  cph_sid *sids;     /* session -> sid */
  uint32_t *by_sid;  /* sid -> session */
  size_t n_by_sid;
  uint32_t *dirty;
  size_t n_dirty;
  event_heap events;
  uint64_t seq;
  int64_t warmup_ns, end_ns, tick_ns, outbox_ns;
  uint32_t max_batch;
  vec lane_waits[CPH_LANE_COUNT];
  vec group_waits[CPH_SIM_GROUPS];
  uint64_t *minutes; /* outbox batches per whole measured minute */
  size_t n_minutes;
  size_t cap_picks;
  int err;
} sim;

static void schedule(sim *m, int64_t at, uint32_t kind, uint32_t session) {
  /* Capacity is reserved up front: one arrival and one completion per session, plus tick,
   * reload and end. */
  m->events.e[m->events.n] = (event){at, m->seq++, kind, session};
  heap_up(&m->events, m->events.n++);
}

static int64_t now_of(const sim *m) { return cph_clock_now(&m->clock); }
static bool measuring(const sim *m) { return now_of(m) >= m->warmup_ns; }

static bool has_own_work(const sim_session *x) {
  return x->cfg->arrival == CPH_SIM_SATURATED || x->staged > 0;
}

static void set_work(sim *m, sim_session *x) {
  cph_sched_set_work(m->s, x->sid, has_own_work(x) || x->cfg->outbox);
}

static void next_arrival(sim *m, uint32_t i) {
  sim_session *x = &m->ss[i];
  if (x->cfg->arrival == CPH_SIM_POISSON && x->cfg->arrivals_per_s > 0)
    schedule(m, now_of(m) + rng_exp_ns(&x->arrivals, 1.0 / x->cfg->arrivals_per_s),
             EV_ARRIVAL, i);
}

static int64_t turn_ns(sim_session *x) {
  if (x->cfg->turn_exponential)
    return rng_exp_ns(&x->durations, x->cfg->turn_s);
  int64_t ns = seconds_ns(x->cfg->turn_s);
  return ns < 1 ? 1 : ns;
}

/* ---- pass hooks */

static uint32_t hook_workers(void *ctx) {
  sim *m = ctx;
  uint32_t conc = cph_sched_concurrency(m->s), running = cph_sched_running(m->s);
  return running < conc ? conc - running : 0;
}

static size_t entry_of(const sim *m, const sim_session *x) {
  return (size_t)(x->cfg - m->cfg->sessions);
}

/* What the session's turn reports at completion (an outbox batch: nothing). */
static uint64_t turn_tokens(const sim *m, const sim_session *x) {
  return x->outbox_turn || !m->cfg->tokens ? 0 : m->cfg->tokens[entry_of(m, x)];
}

static void record_pick(sim *m, uint32_t i, const cph_pick *pick, bool outbox, int64_t ns) {
  cph_sim_result *out = m->out;
  const cph_sim_session *c = m->ss[i].cfg;
  if (m->cfg->record_picks) {
    if (out->n_picks == m->cap_picks) {
      size_t cap = m->cap_picks ? 2 * m->cap_picks : 1024;
      cph_sim_pick *p = realloc(out->picks, cap * sizeof *p);
      if (!p) {
        m->err = CPH_ENOMEM;
        return;
      }
      out->picks = p;
      m->cap_picks = cap;
    }
    out->picks[out->n_picks++] =
        (cph_sim_pick){now_of(m),
                       i,
                       pick->lane,
                       pick->trickle,
                       outbox,
                       pick->waited_ns,
                       now_of(m) + ns,
                       outbox ? 0 : c->tool_calls,
                       turn_tokens(m, &m->ss[i])};
  }
  if (!measuring(m))
    return;
  out->lanes[pick->lane].turns++;
  out->groups[c->group].turns++;
  out->session_turns[i]++;
  if (!vec_push(&m->lane_waits[pick->lane], pick->waited_ns) ||
      !vec_push(&m->group_waits[c->group], pick->waited_ns))
    m->err = CPH_ENOMEM;
  if (outbox) {
    out->outbox_batches++;
    out->trickle_picks += pick->trickle;
    size_t minute = (size_t)((now_of(m) - m->warmup_ns) / (60 * CPH_NS_PER_S));
    if (minute < m->n_minutes)
      m->minutes[minute]++;
  }
}

static void hook_start(void *ctx, const cph_pick *pick) {
  sim *m = ctx;
  if (pick->sid >= m->n_by_sid) {
    m->err = CPH_ESTATE;
    return;
  }
  uint32_t i = m->by_sid[pick->sid];
  sim_session *x = &m->ss[i];
  if (x->running)
    m->out->double_starts++;
  if (cph_sched_running(m->s) > cph_sched_concurrency(m->s))
    m->out->over_concurrency++;
  x->running = true;

  bool outbox = pick->trickle || (x->cfg->outbox && !has_own_work(x));
  x->outbox_turn = outbox;
  int64_t ns;
  if (outbox) {
    if (!pick->trickle)
      cph_sched_trickle_ran(m->s); /* §3.5: a batch run by the normal pick counts */
    ns = m->outbox_ns;
  } else {
    ns = turn_ns(x);
    if (x->cfg->arrival == CPH_SIM_POISSON) {
      x->staged -= x->staged < m->max_batch ? x->staged : m->max_batch;
      set_work(m, x); /* no staged input left: do not queue again at completion */
    }
  }
  record_pick(m, i, pick, outbox, ns);
  schedule(m, now_of(m) + ns, EV_COMPLETE, i);
}

static uint64_t hook_poll(void *ctx) {
  sim *m = ctx;
  uint64_t staged = 0;
  for (size_t k = 0; k < m->n_dirty; k++) {
    sim_session *x = &m->ss[m->dirty[k]];
    x->staged += x->pending;
    staged += x->pending;
    x->pending = 0;
    x->dirty = false;
    set_work(m, x);
  }
  m->n_dirty = 0;
  return staged;
}

static void run_passes(sim *m) {
  cph_pass_hooks h = {.ctx = m, .workers_waiting = hook_workers, .start_turn = hook_start,
                      .poll_inbox = hook_poll};
  cph_pass_result r;
  /* A pass that staged input schedules the next one at once (§3.6). Arrivals only come from
   * events, so the second pass stages nothing and the loop ends. */
  do {
    cph_sched_pass(m->s, &h, &r);
    m->out->passes++;
    uint32_t running = cph_sched_running(m->s);
    if (running > m->out->max_running)
      m->out->max_running = running;
    if (m->cfg->observe)
      m->cfg->observe(m->cfg->observe_ctx, m->s, now_of(m), m->sids, m->n);
  } while (r.staged > 0 && !m->err);
}

static void complete(sim *m, uint32_t i) {
  sim_session *x = &m->ss[i];
  cph_sched_cost cost = {x->outbox_turn ? 0 : x->cfg->tool_calls, turn_tokens(m, x)};
  x->running = false;
  cph_sched_finish_cost(m->s, x->sid, &cost, true);
  if (measuring(m)) {
    m->out->lanes[x->cfg->lane].tool_calls += cost.tool_calls;
    m->out->groups[x->cfg->group].tool_calls += cost.tool_calls;
    m->out->lanes[x->cfg->lane].tokens += cost.tokens;
    m->out->groups[x->cfg->group].tokens += cost.tokens;
  }
}

/* Returns false at the end of the run. */
static bool apply(sim *m, const event *e) {
  switch (e->kind) {
  case EV_ARRIVAL: {
    sim_session *x = &m->ss[e->session];
    x->pending++;
    if (!x->dirty) {
      x->dirty = true;
      m->dirty[m->n_dirty++] = e->session;
    }
    next_arrival(m, e->session);
    return true;
  }
  case EV_COMPLETE:
    complete(m, e->session);
    return true;
  case EV_TICK:
    schedule(m, e->at + m->tick_ns, EV_TICK, 0);
    return true;
  case EV_RELOAD:
    if (cph_sched_configure(m->s, &m->cfg->reload_cfg) != CPH_OK)
      m->err = CPH_EINVAL;
    return true;
  default:
    return false;
  }
}

/* ---------------------------------------------------------------- setup and results */

static int check_config(const cph_sim_config *c) {
  if (cph_sched_config_check(&c->sched, NULL) != CPH_OK)
    return CPH_EINVAL;
  if (c->reload && (cph_sched_config_check(&c->reload_cfg, NULL) != CPH_OK ||
                    !(c->reload_at_s >= 0)))
    return CPH_EINVAL;
  if (!c->sessions || !c->n_sessions || !(c->duration_s > 0) || !(c->warmup_s >= 0) ||
      c->warmup_s >= c->duration_s || !(c->outbox_batch_s >= 0))
    return CPH_EINVAL;
  for (size_t i = 0; i < c->n_sessions; i++) {
    const cph_sim_session *s = &c->sessions[i];
    if ((unsigned)s->lane >= CPH_LANE_COUNT || s->group >= CPH_SIM_GROUPS ||
        !(s->arrivals_per_s >= 0) || !(s->turn_s >= 0) || s->arrival > CPH_SIM_SATURATED)
      return CPH_EINVAL;
  }
  return CPH_OK;
}

static double jain(const uint64_t *turns, const sim *m, uint32_t group) {
  double sum = 0, sq = 0;
  size_t n = 0;
  for (size_t i = 0; i < m->n; i++) {
    if (m->ss[i].cfg->group != group)
      continue;
    double x = (double)turns[i];
    sum += x;
    sq += x * x;
    n++;
  }
  if (!n)
    return 0;
  return sq > 0 ? sum * sum / ((double)n * sq) : 1.0;
}

static void fill_stats(cph_sim_stats *st, vec *waits, uint64_t total) {
  if (waits->n)
    qsort(waits->v, waits->n, sizeof *waits->v, cmp_i64);
  st->share = total ? (double)st->turns / (double)total : 0;
  st->wait_p50_ns = percentile(waits, 50);
  st->wait_p90_ns = percentile(waits, 90);
  st->wait_p99_ns = percentile(waits, 99);
  st->wait_max_ns = waits->n ? waits->v[waits->n - 1] : 0;
}

static void finish_results(sim *m) {
  cph_sim_result *out = m->out;
  uint64_t total = 0;
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    total += out->lanes[l].turns;
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    fill_stats(&out->lanes[l], &m->lane_waits[l], total);
    cph_lane_stats st;
    cph_sched_lane_stats(m->s, (cph_lane)l, &st);
    out->tenant_run[l] = st.tenant_run;
  }
  for (uint32_t g = 0; g < CPH_SIM_GROUPS; g++) {
    fill_stats(&out->groups[g], &m->group_waits[g], total);
    out->jain[g] = jain(out->session_turns, m, g);
  }
  for (size_t i = 0; i < m->n; i++)
    out->group_sessions[m->ss[i].cfg->group]++;
  if (m->n_minutes) {
    uint64_t sum = 0, min = UINT64_MAX;
    for (size_t k = 0; k < m->n_minutes; k++) {
      sum += m->minutes[k];
      min = m->minutes[k] < min ? m->minutes[k] : min;
    }
    out->outbox_per_minute = (double)sum / (double)m->n_minutes;
    out->outbox_min_per_minute = min;
  }
}

static int setup(sim *m) {
  const cph_sim_config *c = m->cfg;
  for (size_t i = 0; i < c->n_sessions; i++)
    m->n += c->sessions[i].count ? c->sessions[i].count : 1;
  m->ss = calloc(m->n, sizeof *m->ss);
  m->sids = calloc(m->n, sizeof *m->sids);
  m->dirty = calloc(m->n, sizeof *m->dirty);
  m->out->session_turns = calloc(m->n, sizeof *m->out->session_turns);
  m->events.cap = 2 * m->n + 8;
  m->events.e = calloc(m->events.cap, sizeof *m->events.e);
  m->n_minutes = (size_t)((m->end_ns - m->warmup_ns) / (60 * CPH_NS_PER_S));
  m->minutes = calloc(m->n_minutes + 1, sizeof *m->minutes);
  cph_clock_init_virtual(&m->clock, 0);
  m->s = cph_sched_new(&c->sched, &m->clock);
  if (!m->ss || !m->sids || !m->dirty || !m->out->session_turns || !m->events.e ||
      !m->minutes || !m->s)
    return CPH_ENOMEM;
  m->out->n_sessions = m->n;

  size_t i = 0;
  uint32_t max_sid = 0;
  for (size_t k = 0; k < c->n_sessions; k++) {
    uint32_t count = c->sessions[k].count ? c->sessions[k].count : 1;
    for (uint32_t j = 0; j < count; j++, i++) {
      sim_session *x = &m->ss[i];
      x->cfg = &c->sessions[k];
      x->arrivals = rng_seed(c->seed, i, 1);
      x->durations = rng_seed(c->seed, i, 2);
      char id[32];
      snprintf(id, sizeof id, "s%06zu", i);
      int rc = cph_sched_add(m->s, id, x->cfg->lane, &x->sid);
      if (!rc && c->tenants && c->tenants[k])
        rc = cph_sched_set_tenant(m->s, x->sid, c->tenants[k]);
      if (rc)
        return rc;
      m->sids[i] = x->sid;
      max_sid = x->sid > max_sid ? x->sid : max_sid;
    }
  }
  m->n_by_sid = (size_t)max_sid + 1;
  m->by_sid = calloc(m->n_by_sid, sizeof *m->by_sid);
  if (!m->by_sid)
    return CPH_ENOMEM;
  for (i = 0; i < m->n; i++)
    m->by_sid[m->sids[i]] = (uint32_t)i;

  for (i = 0; i < m->n; i++) {
    sim_session *x = &m->ss[i];
    if (x->cfg->outbox)
      cph_sched_set_trickle(m->s, x->sid, true);
    set_work(m, x);
    next_arrival(m, (uint32_t)i);
  }
  schedule(m, m->tick_ns, EV_TICK, 0);
  if (c->reload)
    schedule(m, seconds_ns(c->reload_at_s), EV_RELOAD, 0);
  schedule(m, m->end_ns, EV_END, 0);
  return CPH_OK;
}

int cph_sim_run(const cph_sim_config *cfg, cph_sim_result *out) {
  memset(out, 0, sizeof *out);
  int rc = check_config(cfg);
  if (rc)
    return rc;
  sim m = {0};
  m.cfg = cfg;
  m.out = out;
  m.warmup_ns = seconds_ns(cfg->warmup_s);
  m.end_ns = seconds_ns(cfg->duration_s);
  m.tick_ns = (int64_t)(cfg->tick_ms ? cfg->tick_ms : 5) * CPH_NS_PER_MS;
  m.outbox_ns = seconds_ns(cfg->outbox_batch_s > 0 ? cfg->outbox_batch_s : 0.05);
  if (m.outbox_ns < 1)
    m.outbox_ns = 1;
  m.max_batch = cfg->max_batch ? cfg->max_batch : 64;
  out->measured_s = cfg->duration_s - cfg->warmup_s;

  rc = setup(&m);
  if (!rc) {
    run_passes(&m);
    bool more = true;
    while (more && !m.err) {
      event e = heap_pop(&m.events);
      cph_clock_advance(&m.clock, e.at - now_of(&m));
      more = apply(&m, &e);
      while (more && m.events.n && m.events.e[0].at == e.at) {
        event next = heap_pop(&m.events);
        more = apply(&m, &next);
      }
      if (more && !m.err)
        run_passes(&m);
    }
    rc = m.err;
  }
  if (!rc)
    finish_results(&m);

  cph_sched_free(m.s);
  free(m.ss);
  free(m.sids);
  free(m.by_sid);
  free(m.dirty);
  free(m.events.e);
  free(m.minutes);
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    free(m.lane_waits[l].v);
  for (int g = 0; g < CPH_SIM_GROUPS; g++)
    free(m.group_waits[g].v);
  return rc;
}

void cph_sim_result_free(cph_sim_result *r) {
  free(r->session_turns);
  free(r->picks);
  r->session_turns = NULL;
  r->picks = NULL;
  r->n_picks = 0;
}

void cph_sim_print(const cph_sim_result *r, FILE *f) {
  fprintf(f, "sim: %.1f s measured, %zu sessions, %" PRIu64 " passes, max running %u\n",
          r->measured_s, r->n_sessions, r->passes, r->max_running);
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    const cph_sim_stats *s = &r->lanes[l];
    fprintf(f,
            "  lane %-11s turns %8" PRIu64 " (%5.1f%%)  %6.2f/min  tool calls %8" PRIu64
            "  tokens %10" PRIu64 "  wait p50 %.4f p90 %.4f p99 %.4f max %.4f s\n",
            cph_lane_name((cph_lane)l), s->turns, 100 * s->share,
            r->measured_s > 0 ? (double)s->turns * 60 / r->measured_s : 0, s->tool_calls,
            s->tokens,
            s->wait_p50_ns / 1e9, s->wait_p90_ns / 1e9, s->wait_p99_ns / 1e9,
            s->wait_max_ns / 1e9);
  }
  for (int g = 0; g < CPH_SIM_GROUPS; g++) {
    const cph_sim_stats *s = &r->groups[g];
    if (!r->group_sessions[g])
      continue;
    fprintf(f,
            "  group %d (%u sessions) turns %8" PRIu64 " (%5.1f%%)  Jain %.4f  wait p50 %.4f "
            "p90 %.4f p99 %.4f max %.4f s\n",
            g, r->group_sessions[g], s->turns, 100 * s->share, r->jain[g], s->wait_p50_ns / 1e9,
            s->wait_p90_ns / 1e9, s->wait_p99_ns / 1e9, s->wait_max_ns / 1e9);
  }
  fprintf(f, "  outbox batches %" PRIu64 " (%" PRIu64 " by trickle): %.2f/min, fewest %" PRIu64
             " in a minute\n",
          r->outbox_batches, r->trickle_picks, r->outbox_per_minute, r->outbox_min_per_minute);
  if (r->double_starts || r->over_concurrency)
    fprintf(f, "  VIOLATIONS: %" PRIu64 " double starts, %" PRIu64 " picks over concurrency\n",
            r->double_starts, r->over_concurrency);
}
