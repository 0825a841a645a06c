/* The reference model of DESIGN §3 (see sched_ref.h). Plain on purpose: every question is
 * answered by looking at every session. */
#include "sched_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

typedef __int128 wide;

#define TOKEN CPH_BUCKET_UNITS_PER_TOKEN
/* Bucket levels never go below this (about -38 million tokens), so they stay inside int64
 * whatever is charged or rescaled. */
#define FLOOR (INT64_MIN / 4)

static int64_t floored(wide level) { return level < FLOOR ? FLOOR : (int64_t)level; }

typedef struct ref_session {
  char *id; /* NULL: free slot */
  cph_lane lane;
  int64_t credits; /* units, as of credits_at */
  int64_t credits_at;
  bool has_work;
  bool paused;
  bool running;
  bool trickle;
  bool queued; /* runnable, with queued_since valid */
  int64_t queued_since;
} ref_session;

typedef struct ref_bucket {
  int64_t per_minute; /* also the refill in units per ns */
  int64_t level;      /* units, as of at */
  int64_t at;
} ref_bucket;

struct cph_ref {
  const cph_clock *clock;
  cph_sched_config cfg;
  ref_bucket turns[CPH_LANE_COUNT];
  ref_bucket tools[CPH_LANE_COUNT];
  uint64_t started[CPH_LANE_COUNT];
  ref_session *s;
  size_t n, cap;
  uint32_t running;
  int64_t trickle_due; /* the next outbox batch is due at this time */
};

/* ---------------------------------------------------------------- arithmetic (the rule) */

static int64_t units_of_credits(double c) { return (int64_t)llround(c * 1e12); }
static int64_t rate_of(const cph_sched_config *cfg) {
  return (int64_t)llround(cfg->refill_per_second * 1000.0);
}
static int64_t max_of(const cph_sched_config *cfg) { return units_of_credits(cfg->credit_max); }
static int64_t min_of(const cph_sched_config *cfg) { return units_of_credits(cfg->credit_min); }

static int64_t now_of(const cph_ref *r) { return cph_clock_now(r->clock); }

static int64_t trickle_interval(const cph_ref *r) {
  return 60 * CPH_NS_PER_S / r->cfg.trickle_per_minute;
}

static int64_t session_credits(const cph_ref *r, const ref_session *se, int64_t now) {
  wide c = (wide)se->credits + (wide)rate_of(&r->cfg) * (now - se->credits_at);
  wide max = max_of(&r->cfg);
  return (int64_t)(c < max ? c : max);
}

static int64_t capacity(const ref_bucket *b) { return b->per_minute * TOKEN; }

static void refill(ref_bucket *b, int64_t now) {
  if (now <= b->at)
    return;
  wide level = (wide)b->level + (wide)b->per_minute * (now - b->at);
  if (level > capacity(b))
    level = capacity(b);
  b->level = (int64_t)level;
  b->at = now;
}

static void refill_lanes(cph_ref *r, int64_t now) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    refill(&r->turns[i], now);
    refill(&r->tools[i], now);
  }
}

/* §3.1 */
static bool has_budget(const cph_ref *r, int lane) {
  return r->turns[lane].level >= TOKEN && r->tools[lane].level > 0;
}

/* ---------------------------------------------------------------- sessions */

static ref_session *find(const cph_ref *r, const char *id) {
  for (size_t i = 0; i < r->n; i++)
    if (r->s[i].id && strcmp(r->s[i].id, id) == 0)
      return &r->s[i];
  return NULL;
}

static bool runnable(const ref_session *se) {
  return se->has_work && !se->paused && !se->running;
}

/* Keeps queued/queued_since true after any change: a session queues at the instant it
 * becomes runnable and keeps that place while it stays runnable. */
static void requeue(cph_ref *r, ref_session *se) {
  bool now_runnable = runnable(se);
  if (now_runnable && !se->queued) {
    se->queued = true;
    se->queued_since = now_of(r);
  } else if (!now_runnable) {
    se->queued = false;
  }
}

cph_ref *cph_ref_new(const cph_sched_config *cfg, const cph_clock *clock) {
  cph_ref *r = calloc(1, sizeof *r);
  if (!r)
    abort();
  r->clock = clock;
  r->cfg = *cfg;
  int64_t now = now_of(r);
  r->trickle_due = now; /* the first batch is due at once */
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    r->turns[i] = (ref_bucket){cfg->turns_per_minute[i], 0, now};
    r->turns[i].level = capacity(&r->turns[i]);
    r->tools[i] = (ref_bucket){cfg->tool_calls_per_minute[i], 0, now};
    r->tools[i].level = capacity(&r->tools[i]);
  }
  return r;
}

void cph_ref_free(cph_ref *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++)
    free(r->s[i].id);
  free(r->s);
  free(r);
}

static void rescale(ref_bucket *b, int64_t per_minute, int64_t now) {
  refill(b, now);
  int64_t old_cap = capacity(b);
  b->per_minute = per_minute;
  int64_t new_cap = capacity(b);
  if (old_cap == 0) {
    b->level = new_cap;
    return;
  }
  wide level = (wide)b->level * new_cap / old_cap; /* C division: toward zero */
  b->level = floored(level > new_cap ? new_cap : level);
}

void cph_ref_configure(cph_ref *r, const cph_sched_config *cfg) {
  int64_t now = now_of(r);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    rescale(&r->turns[i], cfg->turns_per_minute[i], now);
    rescale(&r->tools[i], cfg->tool_calls_per_minute[i], now);
  }
  for (size_t i = 0; i < r->n; i++) {
    ref_session *se = &r->s[i];
    if (!se->id)
      continue;
    se->credits = session_credits(r, se, now); /* under the old rate and max */
    se->credits_at = now;
  }
  r->cfg = *cfg;
  if (cfg->trickle_per_minute && r->trickle_due > now + trickle_interval(r))
    r->trickle_due = now + trickle_interval(r);
  int64_t lo = min_of(cfg), hi = max_of(cfg);
  for (size_t i = 0; i < r->n; i++) {
    ref_session *se = &r->s[i];
    if (se->credits > hi)
      se->credits = hi;
    if (se->credits < lo)
      se->credits = lo;
  }
}

static int add(cph_ref *r, const char *id, cph_lane lane, int64_t credits) {
  if (find(r, id))
    return CPH_EEXISTS;
  ref_session *se = NULL;
  for (size_t i = 0; i < r->n && !se; i++)
    if (!r->s[i].id)
      se = &r->s[i];
  if (!se) {
    if (r->n == r->cap) {
      r->cap = r->cap ? 2 * r->cap : 16;
      r->s = realloc(r->s, r->cap * sizeof *r->s);
      if (!r->s)
        abort();
    }
    se = &r->s[r->n++];
  }
  memset(se, 0, sizeof *se);
  se->id = strdup(id);
  if (!se->id)
    abort();
  se->lane = lane;
  int64_t lo = min_of(&r->cfg), hi = max_of(&r->cfg);
  se->credits = credits > hi ? hi : credits < lo ? lo : credits;
  se->credits_at = now_of(r);
  return CPH_OK;
}

int cph_ref_add(cph_ref *r, const char *id, cph_lane lane) {
  return add(r, id, lane, max_of(&r->cfg));
}

int cph_ref_restore(cph_ref *r, const char *id, cph_lane lane, double credits) {
  return add(r, id, lane, units_of_credits(credits));
}

int cph_ref_remove(cph_ref *r, const char *id) {
  ref_session *se = find(r, id);
  if (!se)
    return CPH_ENOTFOUND;
  if (se->running)
    return CPH_ESTATE;
  free(se->id);
  memset(se, 0, sizeof *se);
  return CPH_OK;
}

bool cph_ref_exists(const cph_ref *r, const char *id) { return find(r, id) != NULL; }

void cph_ref_set_work(cph_ref *r, const char *id, bool has_work) {
  ref_session *se = find(r, id);
  se->has_work = has_work;
  requeue(r, se);
}

void cph_ref_set_paused(cph_ref *r, const char *id, bool paused) {
  ref_session *se = find(r, id);
  se->paused = paused;
  requeue(r, se);
}

void cph_ref_set_trickle(cph_ref *r, const char *id, bool pending) {
  ref_session *se = find(r, id);
  if (pending && !se->trickle) {
    /* Batches are owed only while one is pending: the first pending batch after none finds
     * the schedule no earlier than now. */
    bool any = false;
    for (size_t i = 0; i < r->n; i++)
      any |= r->s[i].id && r->s[i].trickle;
    if (!any && r->trickle_due < now_of(r))
      r->trickle_due = now_of(r);
  }
  se->trickle = pending;
}

/* A batch started: the next is due one interval after this one was due, but no earlier than
 * a minute ago and no later than one interval from now. */
static void trickle_batch_started(cph_ref *r, int64_t now) {
  if (r->cfg.trickle_per_minute == 0) {
    r->trickle_due = now;
    return;
  }
  int64_t next = r->trickle_due + trickle_interval(r);
  if (next < now - 60 * CPH_NS_PER_S)
    next = now - 60 * CPH_NS_PER_S;
  if (next > now + trickle_interval(r))
    next = now + trickle_interval(r);
  r->trickle_due = next;
}

void cph_ref_trickle_ran(cph_ref *r) { trickle_batch_started(r, now_of(r)); }

/* ---------------------------------------------------------------- the pick */

/* §3.3 (b)-(d): true when a goes before b. */
static bool goes_before(const cph_ref *r, const ref_session *a, const ref_session *b,
                        int64_t now) {
  int64_t ca = session_credits(r, a, now), cb = session_credits(r, b, now);
  if (ca != cb)
    return ca > cb;
  if (a->queued_since != b->queued_since)
    return a->queued_since < b->queued_since;
  return strcmp(a->id, b->id) < 0;
}

static bool trickle_due(const cph_ref *r, int64_t now) {
  return r->cfg.trickle_per_minute != 0 && now >= r->trickle_due;
}

static void start(cph_ref *r, ref_session *se, bool trickle, int64_t now, cph_ref_pick *out) {
  out->id = se->id;
  out->lane = se->lane;
  out->trickle = trickle;
  out->waited_ns = se->queued ? now - se->queued_since : 0;
  se->running = true;
  se->queued = false;
  r->running++;
  r->started[se->lane]++;
}

void cph_ref_pick_next(cph_ref *r, cph_ref_pick *out) {
  memset(out, 0, sizeof *out);
  if (r->running >= r->cfg.concurrency)
    return; /* §3.4 */
  int64_t now = now_of(r);
  refill_lanes(r, now);

  /* §3.5: a due trickle batch takes the free slot ahead of everything and bypasses budget. */
  if (trickle_due(r, now)) {
    ref_session *best = NULL;
    for (size_t i = 0; i < r->n; i++) {
      ref_session *se = &r->s[i];
      if (se->id && se->trickle && !se->running && !se->paused &&
          (!best || strcmp(se->id, best->id) < 0))
        best = se;
    }
    if (best) {
      start(r, best, true, now, out);
      trickle_batch_started(r, now);
      return;
    }
  }

  /* §3.3 (a): lanes in priority order; the first with budget and a runnable session. */
  for (int lane = 0; lane < CPH_LANE_COUNT; lane++) {
    if (!has_budget(r, lane))
      continue;
    ref_session *best = NULL;
    for (size_t i = 0; i < r->n; i++) {
      ref_session *se = &r->s[i];
      if (se->id && (int)se->lane == lane && runnable(se) &&
          (!best || goes_before(r, se, best, now)))
        best = se;
    }
    if (best) {
      start(r, best, false, now, out);
      r->turns[lane].level -= TOKEN;
      return;
    }
  }
}

void cph_ref_finish(cph_ref *r, const char *id, uint64_t tool_calls, bool charge_credits) {
  ref_session *se = find(r, id);
  if (!se || !se->running)
    return;
  int64_t now = now_of(r);
  ref_bucket *tools = &r->tools[se->lane];
  refill(tools, now);
  tools->level = floored((wide)tools->level - (wide)tool_calls * TOKEN);
  int64_t c = session_credits(r, se, now);
  if (charge_credits) {
    c -= units_of_credits(r->cfg.cost[se->lane]);
    if (c < min_of(&r->cfg))
      c = min_of(&r->cfg);
  }
  se->credits = c;
  se->credits_at = now;
  se->running = false;
  r->running--;
  requeue(r, se);
}

/* ---------------------------------------------------------------- introspection */

int64_t cph_ref_credit_units(const cph_ref *r, const char *id) {
  return session_credits(r, find(r, id), now_of(r));
}

double cph_ref_credits(const cph_ref *r, const char *id) {
  return (double)cph_ref_credit_units(r, id) / 1e12;
}

bool cph_ref_is_running(const cph_ref *r, const char *id) { return find(r, id)->running; }
uint32_t cph_ref_running(const cph_ref *r) { return r->running; }
uint64_t cph_ref_started(const cph_ref *r, cph_lane lane) { return r->started[lane]; }

/* Nanoseconds until level + per_minute·t >= target, or INT64_MAX if never. */
static int64_t time_to_reach(const ref_bucket *b, int64_t target) {
  if (b->level >= target)
    return 0;
  if (b->per_minute == 0 || capacity(b) < target)
    return INT64_MAX;
  int64_t need = target - b->level;
  return need / b->per_minute + (need % b->per_minute != 0);
}

static int64_t lane_budget_in(const cph_ref *r, int lane) {
  int64_t a = time_to_reach(&r->turns[lane], TOKEN);
  int64_t b = time_to_reach(&r->tools[lane], 1);
  return a > b ? a : b;
}

void cph_ref_why(cph_ref *r, const char *id, cph_why *out) {
  memset(out, 0, sizeof *out);
  int64_t now = now_of(r);
  refill_lanes(r, now);
  ref_session *me = find(r, id);
  out->lane = me->lane;
  out->credits = (double)session_credits(r, me, now) / 1e12;
  for (size_t i = 0; i < r->n; i++)
    if (r->s[i].id && r->s[i].lane == me->lane && runnable(&r->s[i]))
      out->lane_runnable++;
  if (me->running) {
    out->reason = CPH_WHY_RUNNING;
  } else if (me->paused) {
    out->reason = CPH_WHY_PAUSED;
  } else if (!me->has_work) {
    out->reason = CPH_WHY_NO_INPUT;
  } else if (!has_budget(r, me->lane)) {
    out->reason = CPH_WHY_LANE_NO_BUDGET;
    out->waiting_ns = now - me->queued_since;
    int64_t in = lane_budget_in(r, me->lane);
    out->until_ns = in == INT64_MAX ? INT64_MAX : now + in;
  } else if (r->running >= r->cfg.concurrency) {
    out->reason = CPH_WHY_CONCURRENCY_FULL;
    out->waiting_ns = now - me->queued_since;
  } else {
    out->reason = CPH_WHY_RUNNABLE;
    out->waiting_ns = now - me->queued_since;
    out->rank = 1;
    for (size_t i = 0; i < r->n; i++) {
      ref_session *se = &r->s[i];
      if (!se->id || !runnable(se))
        continue;
      if (se->lane == me->lane && se != me && goes_before(r, se, me, now))
        out->rank++;
      if (se->lane < me->lane && has_budget(r, se->lane))
        out->ahead_in_higher_lanes++;
    }
  }
}

void cph_ref_lane_stats(cph_ref *r, cph_lane lane, cph_lane_stats *out) {
  memset(out, 0, sizeof *out);
  int64_t now = now_of(r);
  refill_lanes(r, now);
  out->turns_left = (double)r->turns[lane].level / TOKEN;
  out->tool_calls_left = (double)r->tools[lane].level / TOKEN;
  out->has_budget = has_budget(r, lane);
  for (size_t i = 0; i < r->n; i++) {
    const ref_session *se = &r->s[i];
    if (!se->id || se->lane != lane)
      continue;
    out->runnable += runnable(se);
    out->running += se->running;
  }
  out->started_total = r->started[lane];
}

int64_t cph_ref_next_boundary(cph_ref *r) {
  int64_t now = now_of(r);
  refill_lanes(r, now);
  int64_t best = INT64_MAX;
  for (int lane = 0; lane < CPH_LANE_COUNT; lane++) {
    int64_t in = lane_budget_in(r, lane);
    if (in > 0 && in < best)
      best = in;
  }
  int64_t rate = rate_of(&r->cfg), max = max_of(&r->cfg);
  for (size_t i = 0; i < r->n && rate > 0; i++) {
    const ref_session *se = &r->s[i];
    if (!se->id)
      continue;
    int64_t c = session_credits(r, se, now);
    if (c < max) {
      wide need = (wide)max - c;
      wide in = need / rate + (need % rate != 0);
      if (in > 0 && in < best)
        best = (int64_t)in;
    }
  }
  if (r->cfg.trickle_per_minute) {
    int64_t in = r->trickle_due - now;
    if (in > 0 && in < best)
      best = in;
  }
  return best == INT64_MAX ? 0 : now + best;
}
