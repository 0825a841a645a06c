#define _GNU_SOURCE /* asprintf */
/* Per-channel backpressure (DESIGN §5): rates, triggers, degrade steps with hysteresis, and
 * GET /v1/channels/{id}.
 * Contract in backpressure.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backpressure.h"
#include "common/clock.h"
#include "common/hmap.h"
#include "common/log.h"
#include "store/store.h"

#define CHECK_PERIOD_NS CPH_NS_PER_S
#define CHANNEL_REC_V1 1
#define CHANNEL_REC_V1_LEN 10 /* version, step, since_ms */
#define CHANNEL_REC_VERSION 2
#define CHANNEL_REC_LEN 27 /* version, step, since_ms, cause, figure, limit */
#define IDLE_EVICT_S 120   /* a quiet channel at step 0 is forgotten after this */
#define BUCKETS 60
#define FAM_SLOT_S 5 /* family growth: a sliding minute of 12 five-second slots */
#define FAM_SLOTS 12

typedef struct bp_family {
  uint64_t family; /* 0 = free slot */
  int64_t slot;    /* engine-clock second / FAM_SLOT_S of the newest slot */
  uint32_t counts[FAM_SLOTS];
  uint64_t sum;
} bp_family;

/* Family growth, allocated only for channels that have duplicates. */
typedef struct bp_extra {
  bp_family fams[BP_FAMILIES_TRACKED];
} bp_extra;

/* What put a channel at its step: the trigger (its figure over its limit at that check), or
 * the policy's floor or cap. Kept while the channel steps back down; cleared at step 0. */
enum {
  BP_CAUSE_NONE,
  BP_CAUSE_EVENTS,
  BP_CAUSE_FAMILY,
  BP_CAUSE_EMBED_QUEUE,
  BP_CAUSE_MAINTENANCE,
  BP_CAUSE_POLICY,
  BP_CAUSE_UNKNOWN, /* a v1 record: stored before causes were */
  BP_CAUSE_COUNT
};

typedef struct bp_cause {
  uint8_t kind; /* BP_CAUSE_* */
  uint64_t figure, limit;
} bp_cause;

typedef struct bp_channel {
  char *name;
  uint8_t step;      /* as persisted */
  bp_cause cause;    /* as persisted: why it is at `step` */
  unsigned triggers; /* CPH_BP_TRIGGER_* at the last check */
  uint32_t calm;     /* consecutive calm intervals */
  int64_t since_ms;  /* when `step` began (engine_wall_ms scale); 0 = never changed */
  int64_t next_eval_ns;
  uint32_t buckets[BUCKETS]; /* events per engine-clock second, by second % 60 */
  uint32_t fresh[BUCKETS];   /* of those, the new ones: not a repeat of a tracked family */
  int64_t last_sec;          /* the newest second the buckets hold */
  uint64_t epm;              /* sum of buckets */
  uint64_t fresh_epm;        /* sum of fresh */
  int64_t last_event_ns;
  bp_extra *x;
} bp_channel;

typedef struct cph_backpressure {
  cph_hmap channels; /* name -> bp_channel */
  struct bp_channel *last; /* what channel_get found last; NULL once channels are freed */
  int64_t next_check_ns;
  uint32_t maint_streak;
} cph_backpressure;

/* ---------------------------------------------------------------- names */

const char *cph_bp_step_name(uint32_t step) {
  static const char *const names[] = {
      "normal",        "aggregate_only", "skip_aggregate_embeddings", "widen_dedupe_window",
      "delay_reports", "drop_payloads"};
  return step <= BP_STEP_MAX ? names[step] : "unknown";
}

/* NULL for BP_CAUSE_NONE. */
static const char *cause_name(uint8_t kind) {
  switch (kind) {
  case BP_CAUSE_EVENTS: return cph_bp_trigger_name(CPH_BP_TRIGGER_EVENTS);
  case BP_CAUSE_FAMILY: return cph_bp_trigger_name(CPH_BP_TRIGGER_FAMILY_GROWTH);
  case BP_CAUSE_EMBED_QUEUE: return cph_bp_trigger_name(CPH_BP_TRIGGER_EMBED_QUEUE);
  case BP_CAUSE_MAINTENANCE: return cph_bp_trigger_name(CPH_BP_TRIGGER_MAINTENANCE);
  case BP_CAUSE_POLICY: return "policy";
  case BP_CAUSE_UNKNOWN: return "unknown";
  }
  return NULL;
}

/* "family_growth 57/min > 50", for the log. */
static void cause_describe(const bp_cause *c, const cph_policy_channel *cfg, char *buf,
                           size_t size) {
  unsigned long long fig = (unsigned long long)c->figure, lim = (unsigned long long)c->limit;
  switch (c->kind) {
  case BP_CAUSE_EVENTS:
  case BP_CAUSE_FAMILY:
    snprintf(buf, size, "%s %llu/min > %llu", cause_name(c->kind), fig, lim);
    break;
  case BP_CAUSE_EMBED_QUEUE:
    snprintf(buf, size, "%s %llu queued > %llu", cause_name(c->kind), fig, lim);
    break;
  case BP_CAUSE_MAINTENANCE:
    snprintf(buf, size, "%s exhausted at %llu checks in a row > %llu", cause_name(c->kind), fig,
             lim);
    break;
  case BP_CAUSE_POLICY:
    snprintf(buf, size, "policy: :degrade-to-aggregate-only? %s, :max-step %lld",
             cfg->degrade_to_aggregate_only ? "true" : "false", (long long)cfg->max_step);
    break;
  default:
    snprintf(buf, size, "%s", cause_name(c->kind) ? cause_name(c->kind) : "none");
  }
}

const char *cph_bp_trigger_name(unsigned bit) {
  switch (bit) {
  case CPH_BP_TRIGGER_EVENTS: return "events_per_minute";
  case CPH_BP_TRIGGER_FAMILY_GROWTH: return "family_growth";
  case CPH_BP_TRIGGER_EMBED_QUEUE: return "embedding_queue";
  case CPH_BP_TRIGGER_MAINTENANCE: return "maintenance_budget";
  }
  return "unknown";
}

/* ---------------------------------------------------------------- channel state */

static void channel_free(bp_channel *c) {
  free(c->x);
  free(c->name);
  free(c);
}

static bp_channel *channel_get(cph_backpressure *bp, const char *name, bool create,
                               int64_t now_sec) {
  /* Every event of an ingest request asks, mostly for one channel: the last one first. */
  if (bp->last && strcmp(bp->last->name, name) == 0)
    return bp->last;
  bp_channel *c = cph_hmap_get(&bp->channels, name);
  if (c)
    bp->last = c;
  if (c || !create)
    return c;
  c = calloc(1, sizeof *c);
  if (!c || !(c->name = strdup(name)) || cph_hmap_put(&bp->channels, c->name, c)) {
    if (c)
      free(c->name);
    free(c);
    return NULL;
  }
  c->last_sec = now_sec;
  return c;
}

static bp_extra *extra_of(bp_channel *c) {
  if (!c->x)
    c->x = calloc(1, sizeof *c->x);
  return c->x;
}

/* Moves the 60 s window up to `sec`, dropping seconds that fell out of it. */
static void advance(bp_channel *c, int64_t sec) {
  if (sec <= c->last_sec)
    return;
  if (sec - c->last_sec >= BUCKETS) {
    memset(c->buckets, 0, sizeof c->buckets);
    memset(c->fresh, 0, sizeof c->fresh);
    c->epm = c->fresh_epm = 0;
  } else {
    for (int64_t s = c->last_sec + 1; s <= sec; s++) {
      c->epm -= c->buckets[s % BUCKETS];
      c->fresh_epm -= c->fresh[s % BUCKETS];
      c->buckets[s % BUCKETS] = 0;
      c->fresh[s % BUCKETS] = 0;
    }
  }
  c->last_sec = sec;
}

/* Duplicates that joined f in the last minute (55 to 60 s, by five-second slots). */
static uint64_t family_rate(bp_family *f, int64_t sec) {
  int64_t slot = sec / FAM_SLOT_S;
  if (slot > f->slot) {
    if (slot - f->slot >= FAM_SLOTS) {
      memset(f->counts, 0, sizeof f->counts);
      f->sum = 0;
    } else {
      for (int64_t s = f->slot + 1; s <= slot; s++) {
        f->sum -= f->counts[s % FAM_SLOTS];
        f->counts[s % FAM_SLOTS] = 0;
      }
    }
    f->slot = slot;
  }
  return f->sum;
}

/* Counts a repeat joining family; true when the family was not tracked (new to the channel,
 * or back after its slot went to a faster one). */
static bool family_grew(bp_channel *c, uint64_t family, int64_t sec) {
  bp_extra *x = extra_of(c);
  if (!x)
    return true;
  bp_family *f = NULL, *slowest = &x->fams[0];
  for (int i = 0; i < BP_FAMILIES_TRACKED; i++) {
    if (x->fams[i].family == family) {
      f = &x->fams[i];
      break;
    }
    if (family_rate(&x->fams[i], sec) < family_rate(slowest, sec))
      slowest = &x->fams[i];
  }
  bool untracked = !f;
  if (!f) {
    f = slowest; /* replaces the slowest-growing (or a free) slot */
    memset(f, 0, sizeof *f);
    f->family = family;
    f->slot = sec / FAM_SLOT_S;
  }
  family_rate(f, sec);
  f->counts[f->slot % FAM_SLOTS]++;
  f->sum++;
  return untracked;
}

static uint64_t family_growth(bp_channel *c, int64_t sec) {
  uint64_t best = 0;
  for (int i = 0; c->x && i < BP_FAMILIES_TRACKED; i++) {
    uint64_t r = c->x->fams[i].family ? family_rate(&c->x->fams[i], sec) : 0;
    if (r > best)
      best = r;
  }
  return best;
}

static void step_bounds(const cph_policy_channel *cfg, int *floor, int *cap) {
  *cap = (int)(cfg->max_step < 0 ? 0 : cfg->max_step > BP_STEP_MAX ? BP_STEP_MAX : cfg->max_step);
  *floor = cfg->degrade_to_aggregate_only ? BP_STEP_AGGREGATE_ONLY : BP_STEP_NORMAL;
  if (*floor > *cap)
    *floor = *cap;
}

static int effective_step(const cph_policy *p, const char *name, const bp_channel *c) {
  int floor, cap;
  step_bounds(cph_policy_backpressure_for(p, name), &floor, &cap);
  int step = c ? c->step : 0;
  return step < floor ? floor : step > cap ? cap : step;
}

/* ---------------------------------------------------------------- ingest side */

int backpressure_step(const cph_backpressure *bp, const cph_policy *p, const char *chan) {
  const bp_channel *c = bp ? cph_hmap_get(&bp->channels, chan) : NULL;
  return effective_step(p, chan, c);
}

bool backpressure_embed_allowed(const cph_policy *p, int step, bool aggregate) {
  if (aggregate && step >= BP_STEP_SKIP_AGGREGATE_EMBEDDINGS)
    return false;
  return !(p->maintenance.embeddings.pause_on_backpressure && step > BP_STEP_NORMAL);
}

bool backpressure_reports_delayed(const cph_backpressure *bp, const cph_policy *p,
                                  const char *chan) {
  return backpressure_step(bp, p, chan) >= BP_STEP_DELAY_REPORTS;
}

void backpressure_note_event(cph_backpressure *bp, const char *chan, uint64_t family_joined,
                             int64_t now) {
  if (!bp)
    return;
  int64_t sec = now / CPH_NS_PER_S;
  bp_channel *c = channel_get(bp, chan, true, sec);
  if (!c)
    return; /* out of memory: this event goes uncounted */
  advance(c, sec);
  c->buckets[sec % BUCKETS]++;
  c->epm++;
  c->last_event_ns = now;
  /* New work: a distinct message (a raw memory), or the repeat that starts a family (its
   * aggregate memory); later repeats of a tracked family make none. */
  if (!family_joined || family_grew(c, family_joined, sec)) {
    c->fresh[sec % BUCKETS]++;
    c->fresh_epm++;
  }
}

/* ---------------------------------------------------------------- the check */

static int persist_step(cph_txn *parent, const char *name, int step, int64_t since_ms,
                        const bp_cause *cause) {
  cph_txn t;
  int rc = cph_txn_begin_child(parent, &t);
  if (rc)
    return rc;
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, name);
  if (step == 0) {
    cph_txn_del(&t, CPH_DB_CHANNELS, &k); /* CPH_ENOTFOUND is fine and not sticky */
  } else {
    uint8_t v[CHANNEL_REC_LEN];
    v[0] = CHANNEL_REC_VERSION;
    v[1] = (uint8_t)step;
    cph_be64_put(v + 2, (uint64_t)since_ms);
    v[10] = cause->kind;
    cph_be64_put(v + 11, cause->figure);
    cph_be64_put(v + 19, cause->limit);
    cph_txn_put(&t, CPH_DB_CHANNELS, &k, v, sizeof v);
  }
  rc = cph_txn_commit(&t);
  if (rc)
    cph_error("backpressure: cannot store the step of channel \"%s\": %s", name, t.err.msg);
  return rc;
}

/* The engine-wide figures a check compares, taken once per check. */
typedef struct bp_engine_load {
  uint64_t total_fresh;   /* new events (no repeats) in the last minute over all channels */
  uint64_t embed_queue;   /* memories waiting for an embedding */
  uint64_t embed_limit;   /* :maintenance :embeddings :max-queue */
  uint64_t maint_streak;  /* checks in a row without maintenance budget while work waited */
} bp_engine_load;

/* The pass's transaction (persistence) and the policy in force, for one check. */
typedef struct bp_check {
  const cph_policy *p;
  cph_txn *parent;
} bp_check;

/* Records a trigger that holds; the first one (in bit order) is the cause. */
static void trigger_hold(unsigned *t, bp_cause *first, unsigned bit, uint8_t kind,
                         uint64_t figure, uint64_t limit) {
  if (!*t)
    *first = (bp_cause){kind, figure, limit};
  *t |= bit;
}

/* The triggers holding for c. Each holds only while its figure is over its limit; a limit of
 * 0 in the policy is no limit. *first is the first that holds, with its figure and limit. */
static unsigned triggers_of(bp_channel *c, const cph_policy_channel *cfg, int64_t sec,
                            const bp_engine_load *load, bp_cause *first) {
  unsigned t = 0;
  if (cfg->max_events_per_minute > 0 && c->epm > (uint64_t)cfg->max_events_per_minute)
    trigger_hold(&t, first, CPH_BP_TRIGGER_EVENTS, BP_CAUSE_EVENTS, c->epm,
                 (uint64_t)cfg->max_events_per_minute);
  uint64_t growth = family_growth(c, sec);
  if (cfg->max_family_growth_per_minute > 0 &&
      growth > (uint64_t)cfg->max_family_growth_per_minute)
    trigger_hold(&t, first, CPH_BP_TRIGGER_FAMILY_GROWTH, BP_CAUSE_FAMILY, growth,
                 (uint64_t)cfg->max_family_growth_per_minute);
  /* Repeats mint and embed nothing: only a channel's new events make engine-wide work. */
  bool loud = c->fresh_epm >= BP_LOUD_MIN_EPM &&
              c->fresh_epm * BP_LOUD_SHARE >= load->total_fresh;
  if (loud && load->embed_queue > load->embed_limit)
    trigger_hold(&t, first, CPH_BP_TRIGGER_EMBED_QUEUE, BP_CAUSE_EMBED_QUEUE, load->embed_queue,
                 load->embed_limit);
  if (loud && load->maint_streak > BP_MAINT_STREAK_MAX)
    trigger_hold(&t, first, CPH_BP_TRIGGER_MAINTENANCE, BP_CAUSE_MAINTENANCE,
                 load->maint_streak, BP_MAINT_STREAK_MAX);
  return t;
}

/* One step per interval while a trigger holds (the first at once), back one step per
 * :recover-intervals calm intervals; returns the new step. */
static int next_step(const cph_policy *p, bp_channel *c, unsigned trig, int64_t now) {
  int floor, cap;
  step_bounds(cph_policy_backpressure_for(p, c->name), &floor, &cap);
  int step = c->step < floor ? floor : c->step > cap ? cap : c->step;
  int64_t interval = p->backpressure.interval_s * CPH_NS_PER_S;
  if (trig) {
    c->calm = 0;
    if (step < cap && (step == floor || now >= c->next_eval_ns)) {
      step++;
      c->next_eval_ns = now + interval;
    } else if (step == cap) {
      c->next_eval_ns = now + interval; /* calm intervals count from the last busy check */
    }
  } else if (step > floor) {
    if (c->triggers) {
      c->next_eval_ns = now + interval; /* the first calm check starts the first interval */
    } else if (now >= c->next_eval_ns) {
      c->next_eval_ns = now + interval;
      if (++c->calm >= (uint32_t)p->backpressure.recover_intervals) {
        step--;
        c->calm = 0;
      }
    }
  } else {
    c->calm = 0;
  }
  return step;
}

static bool idle(const bp_channel *c, int64_t now) {
  return !c->step && !c->epm && now - c->last_event_ns >= IDLE_EVICT_S * CPH_NS_PER_S;
}

/* Moves c to `step` (persisted first) and says why in one log line. raised: the trigger that
 * holds, if one does. Up with a trigger: that trigger is the cause. Up without one (the
 * floor), or down past a lowered :max-step: the policy. Down by recovery: the trigger that
 * raised it stays the cause, except at the floor (the policy holds it there) and at 0. */
static void step_change(const bp_check *k, bp_channel *c, const cph_policy_channel *cfg,
                        int step, const bp_cause *raised, int64_t now_ms) {
  const bp_cause none = {BP_CAUSE_NONE, 0, 0}, policy = {BP_CAUSE_POLICY, 0, 0};
  int floor, cap;
  step_bounds(cfg, &floor, &cap);
  bool recovery = step < c->step && c->step <= cap;
  bp_cause cause;
  if (step > c->step)
    cause = raised ? *raised : policy;
  else if (step == 0)
    cause = none;
  else if (!recovery || step == floor)
    cause = policy;
  else
    cause = c->cause;
  if (persist_step(k->parent, c->name, step, now_ms, &cause) != CPH_OK)
    return; /* tried again at the next check */
  char why[256], was[128];
  if (recovery) {
    cause_describe(&c->cause, cfg, was, sizeof was);
    snprintf(why, sizeof why, "recovery: calm for %lld intervals of %lld s; raised by %s",
             (long long)k->p->backpressure.recover_intervals,
             (long long)k->p->backpressure.interval_s, was);
  } else {
    cause_describe(&cause, cfg, why, sizeof why);
  }
  cph_info("backpressure: channel #%s: step %d -> %d %s (%s)", c->name, c->step, step,
           cph_bp_step_name((uint32_t)step), why);
  c->step = (uint8_t)step;
  c->cause = cause;
  c->since_ms = now_ms;
}

void backpressure_tick(cph_backpressure *bp, const cph_policy *p, cph_txn *parent, int64_t now,
                       int64_t now_ms, const backpressure_load *engine_load) {
  if (!bp || now < bp->next_check_ns)
    return;
  bp->next_check_ns = now + CHECK_PERIOD_NS;
  int64_t sec = now / CPH_NS_PER_S;
  bp_check k = {p, parent};
  bp->maint_streak = engine_load->maintenance_starved ? bp->maint_streak + 1 : 0;
  bp_engine_load load = {0, engine_load->embed_queue,
                         (uint64_t)p->maintenance.embeddings.max_queue, bp->maint_streak};

  /* O(tracked channels) once a second: channels quiet for IDLE_EVICT_S at step 0 leave. */
  for (size_t i = 0; i < bp->channels.cap; i++)
    if (bp->channels.slots[i].key) {
      bp_channel *c = bp->channels.slots[i].value;
      advance(c, sec);
      load.total_fresh += c->fresh_epm;
    }
  size_t n_idle = 0;
  bp_channel **gone = malloc((bp->channels.len ? bp->channels.len : 1) * sizeof *gone);
  for (size_t i = 0; i < bp->channels.cap; i++) {
    if (!bp->channels.slots[i].key)
      continue;
    bp_channel *c = bp->channels.slots[i].value;
    const cph_policy_channel *cfg = cph_policy_backpressure_for(p, c->name);
    bp_cause first = {0};
    unsigned trig = triggers_of(c, cfg, sec, &load, &first);
    int step = next_step(p, c, trig, now);
    c->triggers = trig;
    if (step != c->step)
      step_change(&k, c, cfg, step, trig ? &first : NULL, now_ms);
    if (gone && idle(c, now))
      gone[n_idle++] = c;
  }
  if (n_idle)
    bp->last = NULL;
  for (size_t i = 0; i < n_idle; i++) {
    cph_hmap_del(&bp->channels, gone[i]->name);
    channel_free(gone[i]);
  }
  free(gone);
}

/* ---------------------------------------------------------------- lifecycle */

int backpressure_open(cph_txn *t, const cph_policy *p, int64_t now, cph_backpressure **out,
                      cph_err *err) {
  cph_backpressure *bp = calloc(1, sizeof *bp);
  *out = bp;
  if (!bp)
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening backpressure");
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CHANNELS, &c);
  if (rc == CPH_OK) {
    cph_val k, v;
    for (rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
      const uint8_t *d = v.data;
      const char *name = k.data;
      bool v1 = v.len == CHANNEL_REC_V1_LEN && d[0] == CHANNEL_REC_V1;
      bool v2 = v.len == CHANNEL_REC_LEN && d[0] == CHANNEL_REC_VERSION &&
                d[10] < BP_CAUSE_COUNT;
      if (k.len < 2 || name[k.len - 1] != '\0' || memchr(name, '\0', k.len - 1) ||
          !(v1 || v2) || d[1] > BP_STEP_MAX) {
        char desc[160];
        cph_key_describe(k.data, k.len, desc, sizeof desc);
        cph_err_set(err, CPH_ECORRUPT,
                    "corrupt record in database \"channels\" at key %s: %zu bytes, expected a "
                    "v%d or v%d channel step",
                    desc, v.len, CHANNEL_REC_V1, CHANNEL_REC_VERSION);
        rc = CPH_ECORRUPT;
        break;
      }
      bp_channel *ch = channel_get(bp, name, true, now / CPH_NS_PER_S);
      if (!ch) {
        rc = cph_err_set(err, CPH_ENOMEM, "out of memory loading channel steps");
        break;
      }
      ch->step = d[1];
      ch->since_ms = (int64_t)cph_be64_get(d + 2);
      if (v2)
        ch->cause = (bp_cause){d[10], cph_be64_get(d + 11), cph_be64_get(d + 19)};
      else
        ch->cause = (bp_cause){ch->step ? BP_CAUSE_UNKNOWN : BP_CAUSE_NONE, 0, 0};
      ch->last_event_ns = now;
      ch->next_eval_ns = now + p->backpressure.interval_s * CPH_NS_PER_S;
    }
    cph_cursor_close(&c);
  }
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc && !err->msg[0])
    cph_err_set(err, rc, "loading channel steps: %s", t->err.msg);
  return rc;
}

void backpressure_close(cph_backpressure *bp) {
  if (!bp)
    return;
  for (size_t i = 0; i < bp->channels.cap; i++)
    if (bp->channels.slots[i].key)
      channel_free(bp->channels.slots[i].value);
  cph_hmap_free(&bp->channels);
  free(bp);
}

void backpressure_foreach(const cph_backpressure *bp, const cph_policy *p,
                          void (*fn)(void *ctx, const char *chan, int step), void *ctx) {
  if (!bp)
    return;
  for (size_t i = 0; i < bp->channels.cap; i++)
    if (bp->channels.slots[i].key) {
      const bp_channel *c = bp->channels.slots[i].value;
      fn(ctx, c->name, effective_step(p, c->name, c));
    }
}

/* Why the channel is at its effective step: its stored cause, or the policy when the floor or
 * :max-step makes the effective step differ from the stored one (before the next check). */
static cph_bp_cause cause_info(const cph_policy *p, const char *name, const bp_channel *c) {
  cph_bp_cause out = {0};
  int step = effective_step(p, name, c);
  if (step == 0)
    return out;
  uint8_t kind = c && c->step == step ? c->cause.kind : BP_CAUSE_POLICY;
  if (kind == BP_CAUSE_NONE)
    kind = BP_CAUSE_UNKNOWN; /* not written so; never without a reason */
  out.name = cause_name(kind);
  out.has_figure = kind != BP_CAUSE_POLICY && kind != BP_CAUSE_UNKNOWN;
  if (out.has_figure) {
    out.figure = c->cause.figure;
    out.limit = c->cause.limit;
  }
  return out;
}

const char *backpressure_trigger(const cph_backpressure *bp, const cph_policy *p,
                                 const char *chan) {
  const bp_channel *c = bp ? cph_hmap_get(&bp->channels, chan) : NULL;
  const char *name = cause_info(p, chan, c).name;
  return name ? name : "none";
}

/* ---------------------------------------------------------------- GET /v1/channels/{id} */

void cph_channel_info_free(cph_channel_info *c) {
  if (!c)
    return;
  free(c->id);
  memset(c, 0, sizeof *c);
}

bool backpressure_channel_info(cph_backpressure *bp, const cph_policy *p, const char *id,
                               int64_t now, cph_channel_info *out) {
  const cph_policy_channel *cfg = cph_policy_backpressure_for(p, id);
  bp_channel *c = bp ? cph_hmap_get(&bp->channels, id) : NULL;
  bool configured = cfg != &p->backpressure.defaults;
  int64_t sec = now / CPH_NS_PER_S;
  out->step = (uint32_t)effective_step(p, id, c);
  out->step_name = cph_bp_step_name(out->step);
  out->trigger = cause_info(p, id, c);
  if (c) {
    advance(c, sec);
    out->events_per_minute = c->epm;
    out->family_growth_per_minute = family_growth(c, sec);
    out->triggers = c->triggers;
    out->since_ms = c->since_ms;
    out->calm_intervals = c->calm;
  }
  out->settings.max_events_per_minute = cfg->max_events_per_minute;
  out->settings.max_family_growth_per_minute = cfg->max_family_growth_per_minute;
  out->settings.degrade_to_aggregate_only = cfg->degrade_to_aggregate_only;
  out->settings.max_step = cfg->max_step;
  out->settings.interval_s = p->backpressure.interval_s;
  out->settings.recover_intervals = p->backpressure.recover_intervals;
  out->settings.dedupe_window_seconds =
      p->dedupe.window_seconds * (out->step >= BP_STEP_WIDEN_DEDUPE ? BP_DEDUPE_WIDEN : 1);
  return c || configured;
}
