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
  int64_t started_at; /* while running: when its turn started */
  size_t tenant;      /* index in cph_ref.tenants; 0 = the default tenant */
} ref_session;

/* §3.9, per tenant and lane. */
typedef struct ref_tenant {
  char *name; /* "" = the default tenant */
  wide tag[CPH_LANE_COUNT];    /* start tag, while backlogged */
  wide finish[CPH_LANE_COUNT]; /* finish tag of its last pick */
  bool backlogged[CPH_LANE_COUNT]; /* has runnable sessions in the lane (as last synced) */
} ref_tenant;

typedef struct ref_weight {
  char *name;
  double weight;
} ref_weight;

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
  ref_bucket tokens[CPH_LANE_COUNT]; /* per_minute 0: no token budget */
  uint64_t started[CPH_LANE_COUNT];
  ref_session *s;
  size_t n, cap;
  uint32_t running;
  int64_t trickle_due; /* the next outbox batch is due at this time */
  ref_weight *weights; /* the config's tenant weights, copied */
  size_t n_weights;
  ref_tenant *tenants; /* [0] is the default tenant */
  size_t n_tenants;
  bool tenants_on;     /* some session has named a tenant: tags count from here */
  wide vtime[CPH_LANE_COUNT];
  /* §3.9 runs, per lane: the tenant serving it, the picks left, the run length and the span
   * it was sized over (span_ns, span_picks tenant picks since). */
  size_t run_t[CPH_LANE_COUNT];
  uint32_t run_left[CPH_LANE_COUNT];
  uint32_t run_q[CPH_LANE_COUNT];
  int64_t span_ns[CPH_LANE_COUNT];
  uint64_t span_picks[CPH_LANE_COUNT];
  int64_t done_at[CPH_LANE_COUNT][CPH_SCHED_WINDOW]; /* the last completions, as a ring */
  int64_t done_len[CPH_LANE_COUNT][CPH_SCHED_WINDOW];
  uint64_t n_done[CPH_LANE_COUNT];
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
    refill(&r->tokens[i], now);
  }
}

/* §3.1, §3.8 */
static bool has_budget(const cph_ref *r, int lane) {
  return r->turns[lane].level >= TOKEN && r->tools[lane].level > 0 &&
         (r->tokens[lane].per_minute == 0 || r->tokens[lane].level > 0);
}

/* ---------------------------------------------------------------- tenants (§3.9) */

static double weight_of(const cph_ref *r, size_t t) {
  double w = 1;
  for (size_t i = 0; t && i < r->n_weights; i++)
    if (strcmp(r->weights[i].name, r->tenants[t].name) == 0)
      w = r->weights[i].weight;
  return w;
}

static wide inc_of(const cph_ref *r, size_t t) { return llround(1e12 / weight_of(r, t)); }

static size_t tenant_index(cph_ref *r, const char *name) {
  if (!name || !name[0])
    return 0;
  for (size_t i = 1; i < r->n_tenants; i++)
    if (strcmp(r->tenants[i].name, name) == 0)
      return i;
  r->tenants = realloc(r->tenants, (r->n_tenants + 1) * sizeof *r->tenants);
  if (!r->tenants)
    abort();
  ref_tenant *t = &r->tenants[r->n_tenants];
  memset(t, 0, sizeof *t);
  t->name = strdup(name);
  if (!t->name)
    abort();
  return r->n_tenants++;
}

/* Tenants are known in this order, which breaks ties between equal start tags: the default,
 * then the config's (in its order, at creation and at each reload), then as sessions name
 * them. */
static void copy_weights(cph_ref *r, const cph_sched_config *cfg) {
  for (size_t i = 0; i < cfg->n_tenants; i++)
    tenant_index(r, cfg->tenants[i].name);
  for (size_t i = 0; i < r->n_weights; i++)
    free(r->weights[i].name);
  free(r->weights);
  r->n_weights = cfg->n_tenants;
  r->weights = calloc(cfg->n_tenants + 1, sizeof *r->weights);
  if (!r->weights)
    abort();
  for (size_t i = 0; i < cfg->n_tenants; i++) {
    r->weights[i].name = strdup(cfg->tenants[i].name);
    r->weights[i].weight = cfg->tenants[i].weight;
  }
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

static bool has_runnable(const cph_ref *r, size_t t, int lane) {
  for (size_t i = 0; i < r->n; i++)
    if (r->s[i].id && r->s[i].tenant == t && (int)r->s[i].lane == lane && runnable(&r->s[i]))
      return true;
  return false;
}

/* After every operation: a (tenant, lane) that gained runnable sessions starts at
 * max(virtual time, its last finish tag). */
static void sync_tenants(cph_ref *r) {
  for (size_t t = 0; t < r->n_tenants; t++)
    for (int l = 0; l < CPH_LANE_COUNT; l++) {
      ref_tenant *x = &r->tenants[t];
      bool now = has_runnable(r, t, l);
      if (!now && r->run_t[l] == t)
        r->run_left[l] = 0; /* a run ends when its tenant runs out of runnable sessions */
      if (now && !x->backlogged[l])
        x->tag[l] = x->finish[l] > r->vtime[l] ? x->finish[l] : r->vtime[l];
      x->backlogged[l] = now;
    }
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
    r->tokens[i] = (ref_bucket){cfg->tokens_per_minute[i], 0, now};
    r->tokens[i].level = capacity(&r->tokens[i]);
  }
  r->tenants = calloc(1, sizeof *r->tenants);
  if (!r->tenants)
    abort();
  r->tenants[0].name = strdup("");
  r->n_tenants = 1;
  copy_weights(r, cfg);
  return r;
}

void cph_ref_free(cph_ref *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++)
    free(r->s[i].id);
  free(r->s);
  for (size_t i = 0; i < r->n_tenants; i++)
    free(r->tenants[i].name);
  free(r->tenants);
  for (size_t i = 0; i < r->n_weights; i++)
    free(r->weights[i].name);
  free(r->weights);
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
    rescale(&r->tokens[i], cfg->tokens_per_minute[i], now);
  }
  copy_weights(r, cfg);
  for (size_t i = 0; i < r->n; i++) {
    ref_session *se = &r->s[i];
    if (!se->id)
      continue;
    se->credits = session_credits(r, se, now); /* under the old rate and max */
    se->credits_at = now;
  }
  r->cfg = *cfg;
  r->cfg.tenants = NULL; /* copied above */
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    r->run_left[l] = 0; /* a configuration change ends every run */
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
  sync_tenants(r);
  return CPH_OK;
}

bool cph_ref_exists(const cph_ref *r, const char *id) { return find(r, id) != NULL; }

void cph_ref_set_work(cph_ref *r, const char *id, bool has_work) {
  ref_session *se = find(r, id);
  se->has_work = has_work;
  requeue(r, se);
  sync_tenants(r);
}

void cph_ref_set_paused(cph_ref *r, const char *id, bool paused) {
  ref_session *se = find(r, id);
  se->paused = paused;
  requeue(r, se);
  sync_tenants(r);
}

const char *cph_ref_tenant_name(const cph_ref *r, uint32_t index) {
  return index < r->n_tenants ? r->tenants[index].name : "";
}

void cph_ref_set_tenant(cph_ref *r, const char *id, const char *tenant) {
  size_t t = tenant_index(r, tenant);
  if (t)
    r->tenants_on = true;
  find(r, id)->tenant = t;
  sync_tenants(r);
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
  se->started_at = now;
  r->running++;
  r->started[se->lane]++;
}

static uint32_t lane_running(const cph_ref *r, int lane) {
  uint32_t n = 0;
  for (size_t i = 0; i < r->n; i++)
    n += r->s[i].id && (int)r->s[i].lane == lane && r->s[i].running;
  return n;
}

static bool lane_has_runnable(const cph_ref *r, int lane) {
  for (size_t i = 0; i < r->n; i++)
    if (r->s[i].id && (int)r->s[i].lane == lane && runnable(&r->s[i]))
      return true;
  return false;
}

/* §3.10: a lane may take a free seat below its reservation, or while more seats are free than
 * the other lanes with runnable sessions and budget have reserved and unused. */
static bool seat_free(const cph_ref *r, int lane) {
  if (r->running >= r->cfg.concurrency)
    return false;
  if (lane_running(r, lane) < r->cfg.seats[lane])
    return true;
  uint64_t owed = 0;
  for (int m = 0; m < CPH_LANE_COUNT; m++) {
    uint32_t running = lane_running(r, m);
    if (m != lane && lane_has_runnable(r, m) && has_budget(r, m) && running < r->cfg.seats[m])
      owed += r->cfg.seats[m] - running;
  }
  return r->cfg.concurrency - r->running > owed;
}

/* §3.9: the tenant a lane serves next — the smallest (start tag, name) among those with
 * runnable sessions there; the default tenant while no session has named one. */
static size_t next_tenant(const cph_ref *r, int lane, const bool *skip_session) {
  size_t best = SIZE_MAX;
  for (size_t t = 0; t < r->n_tenants; t++) {
    bool any = false;
    for (size_t i = 0; i < r->n && !any; i++)
      any = r->s[i].id && r->s[i].tenant == t && (int)r->s[i].lane == lane &&
            runnable(&r->s[i]) && !(skip_session && skip_session[i]);
    if (!any)
      continue;
    /* ties: the tenant known first (indices count up, so the first found stays) */
    if (best == SIZE_MAX || r->tenants[t].tag[lane] < r->tenants[best].tag[lane])
      best = t;
  }
  return best;
}

/* §3.9 runs: the length of a run that starts now, as lanes/sched.h states it: once a tenth of
 * a second has passed since the lane's last sizing, q = (picks in that span per minute) / (1,000 ×
 * tenants with runnable sessions in the lane), in [1, CPH_SCHED_TENANT_RUN_LIMIT]; the run is
 * min(q, max(1, tenant_run_max)) picks. */
static uint32_t run_length(cph_ref *r, int lane, int64_t now) {
  int64_t span = now - r->span_ns[lane];
  if (span >= CPH_NS_PER_S / 10 || span < 0) {
    uint64_t groups = 0;
    for (size_t t = 0; t < r->n_tenants; t++)
      groups += has_runnable(r, t, lane);
    wide q = 1;
    if (span > 0 && groups)
      q = (wide)r->span_picks[lane] * 60 * CPH_NS_PER_S / ((wide)span * 1000 * (wide)groups);
    if (q < 1)
      q = 1;
    if (q > CPH_SCHED_TENANT_RUN_LIMIT)
      q = CPH_SCHED_TENANT_RUN_LIMIT;
    r->run_q[lane] = (uint32_t)q;
    r->span_ns[lane] = now;
    r->span_picks[lane] = 0;
  }
  uint32_t max = r->cfg.tenant_run_max > 1 ? r->cfg.tenant_run_max : 1;
  uint32_t q = r->run_q[lane] ? r->run_q[lane] : 1;
  return q < max ? q : max;
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
      sync_tenants(r);
      return;
    }
  }

  /* §3.3 (a): lanes in priority order; the first with budget, a seat for it and a runnable
   * session; §3.9: in it, the next tenant's; (b)-(d) inside the tenant. */
  for (int lane = 0; lane < CPH_LANE_COUNT; lane++) {
    if (!has_budget(r, lane) || !seat_free(r, lane))
      continue;
    size_t t = 0;
    if (r->tenants_on && r->run_left[lane]) {
      t = r->run_t[lane]; /* the run goes on (sync_tenants ended it if t ran out) */
    } else if (r->tenants_on) {
      t = next_tenant(r, lane, NULL);
      if (t != SIZE_MAX) {
        r->run_t[lane] = t;
        r->run_left[lane] = run_length(r, lane, now);
      }
    }
    ref_session *best = NULL;
    for (size_t i = 0; i < r->n && t != SIZE_MAX; i++) {
      ref_session *se = &r->s[i];
      if (se->id && (int)se->lane == lane && runnable(se) && se->tenant == t &&
          (!best || goes_before(r, se, best, now)))
        best = se;
    }
    if (best) {
      start(r, best, false, now, out);
      r->turns[lane].level -= TOKEN;
      if (r->tenants_on) {
        ref_tenant *x = &r->tenants[t];
        if (x->tag[lane] > r->vtime[lane]) /* never back (runs: lanes/sched.h) */
          r->vtime[lane] = x->tag[lane];
        x->finish[lane] = x->tag[lane] + inc_of(r, t);
        if (has_runnable(r, t, lane))
          x->tag[lane] = x->finish[lane];
        r->span_picks[lane]++;
        r->run_left[lane]--;
      }
      sync_tenants(r);
      return;
    }
  }
}

void cph_ref_finish_cost(cph_ref *r, const char *id, uint64_t tool_calls, uint64_t tokens,
                         bool charge_credits) {
  ref_session *se = find(r, id);
  if (!se || !se->running)
    return;
  int64_t now = now_of(r);
  ref_bucket *tools = &r->tools[se->lane];
  refill(tools, now);
  tools->level = floored((wide)tools->level - (wide)tool_calls * TOKEN);
  ref_bucket *tok = &r->tokens[se->lane];
  if (tok->per_minute) {
    refill(tok, now);
    tok->level = floored((wide)tok->level - (wide)tokens * TOKEN);
  }
  int64_t c = session_credits(r, se, now);
  if (charge_credits) {
    wide cost = units_of_credits(r->cfg.cost[se->lane]);
    if (r->cfg.charge == CPH_CHARGE_TOKENS)
      cost = cost * (wide)tokens / r->cfg.tokens_per_unit; /* §3.8 */
    wide after = (wide)c - cost;
    c = after < min_of(&r->cfg) ? min_of(&r->cfg) : (int64_t)after;
  }
  uint64_t slot = r->n_done[se->lane]++ % CPH_SCHED_WINDOW;
  r->done_at[se->lane][slot] = now;
  r->done_len[se->lane][slot] = now - se->started_at;
  se->credits = c;
  se->credits_at = now;
  se->running = false;
  r->running--;
  requeue(r, se);
  sync_tenants(r);
}

void cph_ref_finish(cph_ref *r, const char *id, uint64_t tool_calls, bool charge_credits) {
  cph_ref_finish_cost(r, id, tool_calls, 0, charge_credits);
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
  int64_t c = r->tokens[lane].per_minute ? time_to_reach(&r->tokens[lane], 1) : 0;
  a = a > b ? a : b;
  return a > c ? a : c;
}

/* §3.11: the session's place in its lane's pick order, by playing the picks forward on a copy
 * of the tenants' tags with nothing else changing. */
static uint64_t forecast_position(cph_ref *r, const ref_session *me, int64_t now) {
  int lane = me->lane;
  bool *taken = calloc(r->n + 1, sizeof *taken);
  wide *tags = calloc(r->n_tenants, sizeof *tags);
  if (!taken || !tags)
    abort();
  for (size_t t = 0; t < r->n_tenants; t++)
    tags[t] = r->tenants[t].tag[lane];
  uint64_t position = 0;
  for (;;) {
    size_t t = 0;
    if (r->tenants_on) {
      t = SIZE_MAX;
      for (size_t u = 0; u < r->n_tenants; u++) {
        bool any = false;
        for (size_t i = 0; i < r->n && !any; i++)
          any = r->s[i].id && r->s[i].tenant == u && (int)r->s[i].lane == lane &&
                runnable(&r->s[i]) && !taken[i];
        if (any && (t == SIZE_MAX || tags[u] < tags[t]))
          t = u;
      }
    }
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < r->n; i++) {
      ref_session *se = &r->s[i];
      if (se->id && (int)se->lane == lane && runnable(se) && !taken[i] && se->tenant == t &&
          (best == SIZE_MAX || goes_before(r, se, &r->s[best], now)))
        best = i;
    }
    position++;
    if (best == SIZE_MAX || &r->s[best] == me)
      break;
    taken[best] = true;
    tags[t] += inc_of(r, t);
  }
  free(taken);
  free(tags);
  return position;
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
  } else if (!seat_free(r, me->lane)) {
    out->reason = CPH_WHY_SEATS_RESERVED;
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
  out->est_start_ns = -1;
  out->tenant = (uint32_t)me->tenant; /* the reference's own index: compare names, not this */
  if (me->running || me->paused || !me->has_work)
    return;
  /* §3.11 */
  out->tenant_position = 1;
  uint64_t higher = 0;
  for (size_t i = 0; i < r->n; i++) {
    ref_session *se = &r->s[i];
    if (!se->id || !runnable(se))
      continue;
    if (se->lane == me->lane && se->tenant == me->tenant) {
      out->tenant_runnable++;
      if (se != me && goes_before(r, se, me, now))
        out->tenant_position++;
    }
    if (se->lane < me->lane && has_budget(r, se->lane))
      higher++;
  }
  out->position = forecast_position(r, me, now);
  out->turns_ahead = out->position - 1 + higher;
  int lane = me->lane;
  uint64_t n = r->n_done[lane] < CPH_SCHED_WINDOW ? r->n_done[lane] : CPH_SCHED_WINDOW;
  if (n) {
    int64_t oldest = r->done_at[lane][(r->n_done[lane] - n) % CPH_SCHED_WINDOW];
    wide at = (wide)now + (wide)(now - oldest) * (wide)out->position / (wide)n;
    out->est_start_ns = at > INT64_MAX ? INT64_MAX : (int64_t)at;
    if (out->reason == CPH_WHY_LANE_NO_BUDGET && out->until_ns > out->est_start_ns)
      out->est_start_ns = out->until_ns;
  }
}

void cph_ref_lane_stats(cph_ref *r, cph_lane lane, cph_lane_stats *out) {
  memset(out, 0, sizeof *out);
  int64_t now = now_of(r);
  refill_lanes(r, now);
  out->turns_left = (double)r->turns[lane].level / TOKEN;
  out->tool_calls_left = (double)r->tools[lane].level / TOKEN;
  out->tokens_left =
      r->tokens[lane].per_minute ? (double)r->tokens[lane].level / TOKEN : 0;
  out->has_budget = has_budget(r, lane);
  for (size_t i = 0; i < r->n; i++) {
    const ref_session *se = &r->s[i];
    if (!se->id || se->lane != lane)
      continue;
    out->runnable += runnable(se);
    out->running += se->running;
  }
  out->started_total = r->started[lane];
  for (size_t t = 0; t < r->n_tenants; t++)
    out->tenants_runnable += has_runnable(r, t, lane);
  uint32_t run_max = r->cfg.tenant_run_max > 1 ? r->cfg.tenant_run_max : 1;
  out->tenant_run = !r->tenants_on || !r->run_q[lane] ? 1
                    : r->run_q[lane] < run_max ? r->run_q[lane] : run_max;
  /* §3.10: over-reservation turns are covered by the shared pool in lane order, the rest
   * borrowed; lent seats are the unused reservations others hold, counted in lane order. */
  uint64_t pool = r->cfg.concurrency, borrowed_total = 0;
  for (int m = 0; m < CPH_LANE_COUNT; m++)
    pool -= r->cfg.seats[m];
  for (int m = 0; m < CPH_LANE_COUNT; m++) {
    uint64_t run = lane_running(r, m), seats = r->cfg.seats[m];
    uint64_t over = run > seats ? run - seats : 0, covered = over < pool ? over : pool;
    pool -= covered;
    borrowed_total += over - covered;
    if (m == (int)lane)
      out->seats_borrowed = (uint32_t)(over - covered);
  }
  for (int m = 0; m < CPH_LANE_COUNT; m++) {
    uint64_t run = lane_running(r, m), seats = r->cfg.seats[m];
    uint64_t unused = run < seats ? seats - run : 0;
    uint64_t lent = unused < borrowed_total ? unused : borrowed_total;
    borrowed_total -= lent;
    if (m == (int)lane)
      out->seats_lent = (uint32_t)lent;
  }
  out->seats = r->cfg.seats[lane];
  uint64_t n = r->n_done[lane] < CPH_SCHED_WINDOW ? r->n_done[lane] : CPH_SCHED_WINDOW;
  out->window = (uint32_t)n;
  if (n) {
    int64_t sum = 0;
    for (uint64_t i = 0; i < n; i++)
      sum += r->done_len[lane][(r->n_done[lane] - 1 - i) % CPH_SCHED_WINDOW];
    out->mean_turn_ns = sum / (int64_t)n;
    out->mean_spacing_ns =
        (now - r->done_at[lane][(r->n_done[lane] - n) % CPH_SCHED_WINDOW]) / (int64_t)n;
  }
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
