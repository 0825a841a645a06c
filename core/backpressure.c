#define _GNU_SOURCE /* asprintf */
/* Per-channel backpressure (DESIGN §5): rates, triggers, degrade steps with hysteresis, and
 * GET /v1/channels/{id}.
 * Contract in backpressure.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backpressure.h"
#include "common/log.h"
#include "dedupe.h"
#include "engine_internal.h"

#define CHECK_PERIOD_NS CPH_NS_PER_S
#define CHANNEL_REC_VERSION 1
#define CHANNEL_REC_LEN 10 /* version, step, since_ms */
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

typedef struct bp_channel {
  char *name;
  uint8_t step;      /* as persisted */
  unsigned triggers; /* CPH_BP_TRIGGER_* at the last check */
  uint32_t calm;     /* consecutive calm intervals */
  int64_t since_ms;  /* when `step` began (dedupe_now_ms scale); 0 = never changed */
  int64_t next_eval_ns;
  uint32_t buckets[BUCKETS]; /* events per engine-clock second, by second % 60 */
  int64_t last_sec;          /* the newest second the buckets hold */
  uint64_t epm;              /* sum of buckets */
  int64_t last_event_ns;
  bp_extra *x;
} bp_channel;

typedef struct cph_backpressure {
  cph_hmap channels; /* name -> bp_channel */
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
  bp_channel *c = cph_hmap_get(&bp->channels, name);
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
    c->epm = 0;
  } else {
    for (int64_t s = c->last_sec + 1; s <= sec; s++) {
      c->epm -= c->buckets[s % BUCKETS];
      c->buckets[s % BUCKETS] = 0;
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

static void family_grew(bp_channel *c, uint64_t family, int64_t sec) {
  bp_extra *x = extra_of(c);
  if (!x)
    return;
  bp_family *f = NULL, *slowest = &x->fams[0];
  for (int i = 0; i < BP_FAMILIES_TRACKED; i++) {
    if (x->fams[i].family == family) {
      f = &x->fams[i];
      break;
    }
    if (family_rate(&x->fams[i], sec) < family_rate(slowest, sec))
      slowest = &x->fams[i];
  }
  if (!f) {
    f = slowest; /* replaces the slowest-growing (or a free) slot */
    memset(f, 0, sizeof *f);
    f->family = family;
    f->slot = sec / FAM_SLOT_S;
  }
  family_rate(f, sec);
  f->counts[f->slot % FAM_SLOTS]++;
  f->sum++;
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

int backpressure_step(cph_engine *e, const char *chan) {
  const bp_channel *c = e->bp ? cph_hmap_get(&e->bp->channels, chan) : NULL;
  return effective_step(e->policy, chan, c);
}

bool backpressure_embed_allowed(const cph_engine *e, int step, bool aggregate) {
  if (aggregate && step >= BP_STEP_SKIP_AGGREGATE_EMBEDDINGS)
    return false;
  return !(e->policy->maintenance.embeddings.pause_on_backpressure && step > BP_STEP_NORMAL);
}

bool backpressure_reports_delayed(cph_engine *e, const char *chan) {
  return backpressure_step(e, chan) >= BP_STEP_DELAY_REPORTS;
}

void backpressure_note_event(cph_engine *e, const char *chan, uint64_t family_joined) {
  if (!e->bp)
    return;
  int64_t now = engine_now(e), sec = now / CPH_NS_PER_S;
  bp_channel *c = channel_get(e->bp, chan, true, sec);
  if (!c)
    return; /* out of memory: this event goes uncounted */
  advance(c, sec);
  c->buckets[sec % BUCKETS]++;
  c->epm++;
  c->last_event_ns = now;
  if (family_joined)
    family_grew(c, family_joined, sec);
}

/* ---------------------------------------------------------------- the check */

static int persist_step(cph_engine *e, const char *name, int step, int64_t since_ms) {
  cph_txn t;
  int rc = cph_txn_begin_child(&e->txn, &t);
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
    cph_txn_put(&t, CPH_DB_CHANNELS, &k, v, sizeof v);
  }
  rc = cph_txn_commit(&t);
  if (rc)
    cph_error("backpressure: cannot store the step of channel \"%s\": %s", name, t.err.msg);
  return rc;
}

static unsigned triggers_of(bp_channel *c, const cph_policy_channel *cfg, int64_t sec,
                            uint64_t total_epm, bool embed_full, bool maint_exhausted) {
  unsigned t = 0;
  if (cfg->max_events_per_minute > 0 && c->epm > (uint64_t)cfg->max_events_per_minute)
    t |= CPH_BP_TRIGGER_EVENTS;
  if (cfg->max_family_growth_per_minute > 0 &&
      family_growth(c, sec) > (uint64_t)cfg->max_family_growth_per_minute)
    t |= CPH_BP_TRIGGER_FAMILY_GROWTH;
  bool loud = c->epm >= BP_LOUD_MIN_EPM && c->epm * BP_LOUD_SHARE >= total_epm;
  if (loud && embed_full)
    t |= CPH_BP_TRIGGER_EMBED_QUEUE;
  if (loud && maint_exhausted)
    t |= CPH_BP_TRIGGER_MAINTENANCE;
  return t;
}

/* One step per interval while a trigger holds (the first at once), back one step per
 * :recover-intervals calm intervals; returns the new step. */
static int next_step(cph_engine *e, bp_channel *c, unsigned trig, int64_t now) {
  const cph_policy *p = e->policy;
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

void backpressure_tick(cph_engine *e) {
  cph_backpressure *bp = e->bp;
  if (!bp)
    return;
  int64_t now = engine_now(e);
  if (now < bp->next_check_ns)
    return;
  bp->next_check_ns = now + CHECK_PERIOD_NS;
  int64_t sec = now / CPH_NS_PER_S;
  int64_t now_ms = dedupe_now_ms(e);
  const cph_policy *p = e->policy;

  cph_lane_stats st;
  cph_sched_lane_stats(e->sched, CPH_LANE_MAINTENANCE, &st);
  bp->maint_streak = !st.has_budget && st.runnable > 0 ? bp->maint_streak + 1 : 0;
  bool maint_exhausted = bp->maint_streak >= BP_MAINT_STREAK;
  bool embed_full = e->embed_queue_len > (uint64_t)p->maintenance.embeddings.max_queue;

  /* O(tracked channels) once a second: channels quiet for IDLE_EVICT_S at step 0 leave. */
  uint64_t total = 0;
  for (size_t i = 0; i < bp->channels.cap; i++)
    if (bp->channels.slots[i].key) {
      bp_channel *c = bp->channels.slots[i].value;
      advance(c, sec);
      total += c->epm;
    }
  size_t n_idle = 0;
  bp_channel **gone = malloc((bp->channels.len ? bp->channels.len : 1) * sizeof *gone);
  for (size_t i = 0; i < bp->channels.cap; i++) {
    if (!bp->channels.slots[i].key)
      continue;
    bp_channel *c = bp->channels.slots[i].value;
    const cph_policy_channel *cfg = cph_policy_backpressure_for(p, c->name);
    unsigned trig = triggers_of(c, cfg, sec, total, embed_full, maint_exhausted);
    int step = next_step(e, c, trig, now);
    c->triggers = trig;
    if (step != c->step && persist_step(e, c->name, step, now_ms) == CPH_OK) {
      cph_info("backpressure: channel \"%s\" step %d -> %d (%s)", c->name, c->step, step,
               cph_bp_step_name((uint32_t)step));
      c->step = (uint8_t)step;
      c->since_ms = now_ms;
    }
    if (gone && idle(c, now))
      gone[n_idle++] = c;
  }
  for (size_t i = 0; i < n_idle; i++) {
    cph_hmap_del(&bp->channels, gone[i]->name);
    channel_free(gone[i]);
  }
  free(gone);
  dedupe_tick(e, now_ms);
}

/* ---------------------------------------------------------------- lifecycle */

int backpressure_open(cph_engine *e, cph_err *err) {
  cph_backpressure *bp = calloc(1, sizeof *bp);
  if (!bp)
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening backpressure");
  e->bp = bp;
  int64_t now = engine_now(e);
  cph_txn t;
  int rc = cph_txn_begin(e->store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  cph_cursor c;
  rc = cph_cursor_open(&t, CPH_DB_CHANNELS, &c);
  if (rc == CPH_OK) {
    cph_val k, v;
    for (rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
      const uint8_t *d = v.data;
      const char *name = k.data;
      if (k.len < 2 || name[k.len - 1] != '\0' || memchr(name, '\0', k.len - 1) ||
          v.len != CHANNEL_REC_LEN || d[0] != CHANNEL_REC_VERSION || d[1] > BP_STEP_MAX) {
        char desc[160];
        cph_key_describe(k.data, k.len, desc, sizeof desc);
        cph_err_set(err, CPH_ECORRUPT,
                    "corrupt record in database \"channels\" at key %s: %zu bytes, expected a "
                    "v%d channel step",
                    desc, v.len, CHANNEL_REC_VERSION);
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
      ch->last_event_ns = now;
      ch->next_eval_ns = now + e->policy->backpressure.interval_s * CPH_NS_PER_S;
    }
    cph_cursor_close(&c);
  }
  cph_txn_abort(&t);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc && !err->msg[0])
    cph_err_set(err, rc, "loading channel steps: %s", t.err.msg);
  return rc;
}

void backpressure_close(cph_engine *e) {
  cph_backpressure *bp = e->bp;
  if (!bp)
    return;
  for (size_t i = 0; i < bp->channels.cap; i++)
    if (bp->channels.slots[i].key)
      channel_free(bp->channels.slots[i].value);
  cph_hmap_free(&bp->channels);
  free(bp);
  e->bp = NULL;
}

void backpressure_foreach(cph_engine *e, void (*fn)(void *ctx, const char *chan, int step),
                          void *ctx) {
  if (!e->bp)
    return;
  for (size_t i = 0; i < e->bp->channels.cap; i++)
    if (e->bp->channels.slots[i].key) {
      const bp_channel *c = e->bp->channels.slots[i].value;
      fn(ctx, c->name, effective_step(e->policy, c->name, c));
    }
}

/* ---------------------------------------------------------------- GET /v1/channels/{id} */

void cph_channel_info_free(cph_channel_info *c) {
  if (!c)
    return;
  free(c->id);
  memset(c, 0, sizeof *c);
}

/* True when the channel has at least one history entry. */
static bool has_history(cph_engine *e, const char *name) {
  cph_txn t;
  if (cph_txn_begin(e->store, false, &t) != CPH_OK)
    return false;
  bool found = false;
  cph_cursor c;
  if (cph_cursor_open(&t, CPH_DB_CHANNEL_LOG, &c) == CPH_OK) {
    cph_key k;
    cph_key_reset(&k);
    cph_key_str(&k, name);
    cph_val kv;
    size_t prefix = strlen(name) + 1;
    found = !k.overflow && cph_cursor_seek(&c, &k, &kv, NULL) == CPH_OK && kv.len >= prefix &&
            memcmp(kv.data, k.data, prefix) == 0;
    cph_cursor_close(&c);
  }
  cph_txn_abort(&t);
  return found;
}

int cph_engine_channel(cph_engine *e, const char *id, cph_channel_info *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  if (!id || !*id || strlen(id) > 256)
    return cph_err_set(err, CPH_EINVAL, "a channel name is 1 to 256 bytes");
  const cph_policy *p = e->policy;
  const cph_policy_channel *cfg = cph_policy_backpressure_for(p, id);
  bp_channel *c = e->bp ? cph_hmap_get(&e->bp->channels, id) : NULL;
  channel *ch = engine_channel(e, id, false);
  bool configured = cfg != &p->backpressure.defaults;
  if (!c && !ch && !configured && !has_history(e, id))
    return cph_err_set(err, CPH_ENOTFOUND, "no such channel: %s", id);
  if (!(out->id = strdup(id)))
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  int64_t sec = engine_now(e) / CPH_NS_PER_S;
  out->step = (uint32_t)effective_step(p, id, c);
  out->step_name = cph_bp_step_name(out->step);
  if (c) {
    advance(c, sec);
    out->events_per_minute = c->epm;
    out->family_growth_per_minute = family_growth(c, sec);
    out->triggers = c->triggers;
    out->since_ms = c->since_ms;
    out->calm_intervals = c->calm;
  }
  if (ch) {
    out->subscribers = (uint32_t)ch->n_subscribers;
    out->members = (uint32_t)ch->n_members;
  }
  out->settings.max_events_per_minute = cfg->max_events_per_minute;
  out->settings.max_family_growth_per_minute = cfg->max_family_growth_per_minute;
  out->settings.degrade_to_aggregate_only = cfg->degrade_to_aggregate_only;
  out->settings.max_step = cfg->max_step;
  out->settings.interval_s = p->backpressure.interval_s;
  out->settings.recover_intervals = p->backpressure.recover_intervals;
  out->settings.dedupe_window_seconds =
      p->dedupe.window_seconds * (out->step >= BP_STEP_WIDEN_DEDUPE ? BP_DEDUPE_WIDEN : 1);
  return CPH_OK;
}
