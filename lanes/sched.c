/* The scheduler of DESIGN §3 (contract in sched.h).
 *
 * How the pick stays O(log n) without scanning sessions:
 *
 * Every session refills at the same rate r, so while a session's credits are below max they
 * equal K + r·t with K = c0 - r·t0 fixed between charges. Ordering by current credits is
 * therefore ordering by K, which does not change with time. Sessions that have reached max
 * all tie on credits and go by wait. So each lane keeps two ordered sets of queued sessions:
 *
 *   at_max  — credits == max, ordered by (queued_since asc, id asc)
 *   below   — credits <  max, ordered by (K desc, queued_since asc, id asc)
 *
 * and at each pick first moves from `below` into `at_max` every session whose K + r·now has
 * reached max — always the head of `below`, so each move is one pop. Every at_max session
 * outranks every below session, so the lane's next session is at_max's head, or below's.
 *
 * Each ordered set is a sorted ring (entries that arrive in order are appended: O(1),
 * sequential memory) plus a binary heap for the ones that arrive out of order; its head is
 * the better of the two heads. Under saturation sessions re-queue in order, so the heap
 * stays small and the cost per pick barely grows with the number of sessions.
 *
 * Removal is lazy: a session that leaves a set (picked, paused, out of work, removed) bumps
 * its generation; entries with a stale generation are dropped when they reach a head.
 *
 * A stale entry is still compared while it sits in a ring or heap (as the ring's back, inside
 * heap sifts), and the comparison reads its session's id. So a removed session's slot keeps
 * its id and is not reused until no set holds an entry naming it (`refs`); otherwise the
 * entry's order would change under it (a reused id) or crash (a freed one). */
#include "sched.h"

#include "pass.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "common/slab.h"

typedef __int128 i128;

/* ---------------------------------------------------------------- ordered sets */

typedef struct entry {
  i128 key;         /* below: K; at_max: 0 */
  int64_t queued_ns; /* queued_since */
  cph_sid sid;
  uint32_t gen;
} entry;

typedef struct ring {
  entry *items;
  uint32_t head, len, cap; /* cap is a power of two */
} ring;

typedef struct heap {
  entry *items;
  uint32_t len, cap;
} heap;

typedef struct oset {
  ring ring;
  heap heap;
} oset;

enum { WHERE_NONE, WHERE_AT_MAX, WHERE_BELOW };

typedef struct session {
  char *id;          /* from the sched's id slab; NULL for a free slot */
  int64_t c0;        /* credits (units) as of t0 */
  int64_t t0;
  int64_t queued_ns; /* when it last became runnable */
  uint32_t gen;      /* bumped whenever it leaves a set */
  uint8_t lane;
  uint8_t where;     /* WHERE_*: the set holding its live entry */
  bool has_work;
  bool paused;
  bool running;
  bool trickle;
  bool removed;      /* removed by the caller; the slot is freed when refs reaches 0 */
  uint32_t refs;     /* entries in sets, live or stale, that name this slot */
} session;

typedef struct bucket {
  int64_t level;    /* units; may be negative for tool calls */
  int64_t per_min;  /* budget per minute = refill in units per ns */
  int64_t at_ns;    /* level is as of this time */
} bucket;

typedef struct lane_state {
  bucket turns;
  bucket tools;
  oset at_max;
  oset below;
  uint64_t runnable;
  uint64_t running;
  uint64_t started_total;
} lane_state;

struct cph_sched {
  const cph_clock *clock;
  cph_sched_config cfg;
  int64_t rate;     /* credit units per ns */
  int64_t c_max;    /* credit units */
  int64_t c_min;
  int64_t cost[CPH_LANE_COUNT];
  lane_state lanes[CPH_LANE_COUNT];
  session *sessions;
  uint32_t n_sessions, cap_sessions;
  cph_strslab ids;       /* session ids: one copy each, no malloc header */
  cph_sid *free_sids;
  uint32_t n_free, cap_free;
  uint32_t n_removed;    /* removed slots still named by set entries */
  cph_sid *trickle_sids; /* sessions with a due outbox batch; few (usually the janitor) */
  uint32_t n_trickle, cap_trickle;
  int64_t trickle_due_ns; /* when the next outbox batch is due (§3.5) */
  uint32_t running;
};

/* Full order of §3.3 within one set: key desc, queued_since asc, id asc. < 0 when a goes
 * first. */
static int entry_cmp(const cph_sched *s, const entry *a, const entry *b) {
  if (a->key != b->key)
    return a->key > b->key ? -1 : 1;
  if (a->queued_ns != b->queued_ns)
    return a->queued_ns < b->queued_ns ? -1 : 1;
  if (a->sid == b->sid)
    return 0;
  return strcmp(s->sessions[a->sid].id, s->sessions[b->sid].id);
}

static bool entry_live(const cph_sched *s, const entry *e) {
  return s->sessions[e->sid].gen == e->gen;
}

static void release_slot(cph_sched *s, cph_sid sid);

/* An entry naming sid has left its set. */
static void drop_ref(cph_sched *s, cph_sid sid) {
  session *se = &s->sessions[sid];
  if (--se->refs == 0 && se->removed)
    release_slot(s, sid);
}

static bool ring_push(ring *r, entry e) {
  if (r->len == r->cap) {
    uint32_t cap = r->cap ? r->cap * 2 : 16;
    entry *items = malloc((size_t)cap * sizeof *items);
    if (!items)
      return false;
    for (uint32_t i = 0; i < r->len; i++)
      items[i] = r->items[(r->head + i) & (r->cap - 1)];
    free(r->items);
    r->items = items;
    r->head = 0;
    r->cap = cap;
  }
  r->items[(r->head + r->len) & (r->cap - 1)] = e;
  r->len++;
  return true;
}

static entry *ring_front(ring *r) { return r->len ? &r->items[r->head] : NULL; }
static entry *ring_back(ring *r) {
  return r->len ? &r->items[(r->head + r->len - 1) & (r->cap - 1)] : NULL;
}
static void ring_pop(ring *r) {
  r->head = (r->head + 1) & (r->cap - 1);
  r->len--;
}

static bool heap_push(const cph_sched *s, heap *h, entry e) {
  if (h->len == h->cap) {
    uint32_t cap = h->cap ? h->cap * 2 : 16;
    entry *items = realloc(h->items, (size_t)cap * sizeof *items);
    if (!items)
      return false;
    h->items = items;
    h->cap = cap;
  }
  uint32_t i = h->len++;
  while (i > 0) {
    uint32_t parent = (i - 1) / 2;
    if (entry_cmp(s, &h->items[parent], &e) <= 0)
      break;
    h->items[i] = h->items[parent];
    i = parent;
  }
  h->items[i] = e;
  return true;
}

static void heap_pop(const cph_sched *s, heap *h) {
  entry last = h->items[--h->len];
  uint32_t i = 0, n = h->len;
  for (;;) {
    uint32_t child = 2 * i + 1;
    if (child >= n)
      break;
    if (child + 1 < n && entry_cmp(s, &h->items[child + 1], &h->items[child]) < 0)
      child++;
    if (entry_cmp(s, &last, &h->items[child]) <= 0)
      break;
    h->items[i] = h->items[child];
    i = child;
  }
  if (n)
    h->items[i] = last;
}

static bool oset_push(cph_sched *s, oset *o, entry e) {
  entry *back = ring_back(&o->ring);
  bool ok = !back || entry_cmp(s, back, &e) < 0 ? ring_push(&o->ring, e)
                                                 : heap_push(s, &o->heap, e);
  if (ok)
    s->sessions[e.sid].refs++;
  return ok;
}

/* The set's first live entry, dropping stale ones on the way; NULL when empty. */
static entry *oset_head(cph_sched *s, oset *o) {
  entry *r;
  while ((r = ring_front(&o->ring)) && !entry_live(s, r)) {
    cph_sid sid = r->sid;
    ring_pop(&o->ring);
    drop_ref(s, sid);
  }
  while (o->heap.len && !entry_live(s, &o->heap.items[0])) {
    cph_sid sid = o->heap.items[0].sid;
    heap_pop(s, &o->heap);
    drop_ref(s, sid);
  }
  entry *h = o->heap.len ? &o->heap.items[0] : NULL;
  if (!r)
    return h;
  if (!h)
    return r;
  return entry_cmp(s, r, h) <= 0 ? r : h;
}

static void oset_pop_head(cph_sched *s, oset *o, const entry *head) {
  cph_sid sid = head->sid;
  if (head == ring_front(&o->ring))
    ring_pop(&o->ring);
  else
    heap_pop(s, &o->heap);
  drop_ref(s, sid);
}

/* Drops stale entries once they outnumber live ones, so a session that keeps gaining and
 * losing work cannot grow a set without bound. Amortised O(1) per push. */
static void oset_compact(cph_sched *s, oset *o, uint64_t live) {
  uint64_t size = (uint64_t)o->ring.len + o->heap.len;
  if (size < 1024 || size < 4 * live)
    return;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < o->ring.len; i++) {
    entry e = o->ring.items[(o->ring.head + i) & (o->ring.cap - 1)];
    if (entry_live(s, &e))
      o->ring.items[(o->ring.head + kept++) & (o->ring.cap - 1)] = e;
    else
      drop_ref(s, e.sid);
  }
  o->ring.len = kept;
  heap old = o->heap;
  o->heap.len = 0;
  for (uint32_t i = 0; i < old.len; i++) {
    if (entry_live(s, &old.items[i]))
      o->heap.items[o->heap.len++] = old.items[i];
    else
      drop_ref(s, old.items[i].sid);
  }
  /* Re-heapify in place: sift each kept entry up from a prefix that is a heap. */
  uint32_t n = o->heap.len;
  o->heap.len = 0;
  for (uint32_t i = 0; i < n; i++)
    heap_push(s, &o->heap, o->heap.items[i]);
}

static void oset_clear(cph_sched *s, oset *o) {
  for (uint32_t i = 0; i < o->ring.len; i++)
    drop_ref(s, o->ring.items[(o->ring.head + i) & (o->ring.cap - 1)].sid);
  for (uint32_t i = 0; i < o->heap.len; i++)
    drop_ref(s, o->heap.items[i].sid);
  o->ring.len = o->ring.head = 0;
  o->heap.len = 0;
}

static void oset_free(oset *o) {
  free(o->ring.items);
  free(o->heap.items);
  memset(o, 0, sizeof *o);
}

/* ---------------------------------------------------------------- arithmetic */

static int64_t clamp_i128(i128 v, int64_t lo, int64_t hi) {
  return v < lo ? lo : v > hi ? hi : (int64_t)v;
}

static int64_t credits_units(double credits) { return (int64_t)llround(credits * 1e12); }

/* Credits of a session at now: refilled from (c0, t0), capped at max. */
static int64_t credits_at(const cph_sched *s, const session *se, int64_t now) {
  i128 c = (i128)se->c0 + (i128)s->rate * (now - se->t0);
  return clamp_i128(c, INT64_MIN, s->c_max);
}

static int64_t bucket_cap(const bucket *b) { return b->per_min * CPH_BUCKET_UNITS_PER_TOKEN; }

static void bucket_refill(bucket *b, int64_t now) {
  if (now <= b->at_ns)
    return;
  i128 level = (i128)b->level + (i128)b->per_min * (now - b->at_ns);
  b->level = clamp_i128(level, INT64_MIN / 4, bucket_cap(b));
  b->at_ns = now;
}

static void bucket_charge(bucket *b, int64_t tokens) {
  i128 level = (i128)b->level - (i128)tokens * CPH_BUCKET_UNITS_PER_TOKEN;
  b->level = clamp_i128(level, INT64_MIN / 4, INT64_MAX);
}

/* §3.1: a lane has budget while its turns bucket holds >= 1 token and its tool-calls bucket is
 * above 0. */
static bool lane_has_budget(const lane_state *l) {
  return l->turns.level >= CPH_BUCKET_UNITS_PER_TOKEN && l->tools.level > 0;
}

/* §3.5: the spacing of guaranteed outbox batches; trickle_per_minute > 0. */
static int64_t trickle_interval(const cph_sched *s) {
  return 60 * CPH_NS_PER_S / s->cfg.trickle_per_minute;
}

/* ---------------------------------------------------------------- sessions in sets */

static bool session_runnable(const session *se) {
  return se->has_work && !se->paused && !se->running;
}

/* Puts a runnable session into its lane's sets as of now; its credits are materialised at
 * now so K = c0 - r·t0 is exact from here on. */
static void enqueue(cph_sched *s, cph_sid sid, int64_t now, int64_t queued_ns) {
  session *se = &s->sessions[sid];
  lane_state *l = &s->lanes[se->lane];
  se->c0 = credits_at(s, se, now);
  se->t0 = now;
  se->queued_ns = queued_ns;
  entry e = {0, queued_ns, sid, se->gen};
  bool ok;
  if (se->c0 >= s->c_max) {
    se->where = WHERE_AT_MAX;
    ok = oset_push(s, &l->at_max, e);
  } else {
    e.key = (i128)se->c0 - (i128)s->rate * now;
    se->where = WHERE_BELOW;
    ok = oset_push(s, &l->below, e);
  }
  oset_compact(s, se->where == WHERE_AT_MAX ? &l->at_max : &l->below, l->runnable + 1);
  if (!ok) {
    /* Out of memory: the session is not queued; it stays has_work and is re-offered on its
     * next state change. Counted as not runnable so counters stay true. */
    se->where = WHERE_NONE;
    se->gen++;
    return;
  }
  l->runnable++;
}

static void dequeue(cph_sched *s, session *se) {
  if (se->where == WHERE_NONE)
    return;
  se->gen++; /* its entry goes stale */
  se->where = WHERE_NONE;
  s->lanes[se->lane].runnable--;
}

/* Re-evaluates a session after any change of its flags. */
static void update_queue(cph_sched *s, cph_sid sid) {
  session *se = &s->sessions[sid];
  bool queued = se->where != WHERE_NONE;
  if (session_runnable(se) && !queued)
    enqueue(s, sid, cph_clock_now(s->clock), cph_clock_now(s->clock));
  else if (!session_runnable(se) && queued)
    dequeue(s, se);
}

/* Moves every session whose credits reached max from `below` to `at_max`. */
static void promote(cph_sched *s, lane_state *l, int64_t now) {
  i128 threshold = (i128)s->c_max - (i128)s->rate * now; /* K >= threshold <=> at max */
  entry *e;
  while ((e = oset_head(s, &l->below)) && e->key >= threshold) {
    entry moved = *e;
    oset_pop_head(s, &l->below, e);
    moved.key = 0;
    s->sessions[moved.sid].where = WHERE_AT_MAX;
    if (!oset_push(s, &l->at_max, moved)) {
      session *se = &s->sessions[moved.sid];
      se->gen++;
      se->where = WHERE_NONE;
      l->runnable--;
    }
  }
}

/* The lane's next session, with the sets brought up to now; NULL if none. */
static entry *lane_head(cph_sched *s, lane_state *l, int64_t now, oset **from) {
  promote(s, l, now);
  entry *e = oset_head(s, &l->at_max);
  *from = &l->at_max;
  if (!e) {
    e = oset_head(s, &l->below);
    *from = &l->below;
  }
  return e;
}

/* ---------------------------------------------------------------- config */

int cph_sched_config_check(const cph_sched_config *cfg, const char **why) {
  const char *w = NULL;
  for (int i = 0; i < CPH_LANE_COUNT && !w; i++) {
    if (cfg->turns_per_minute[i] < 0 || cfg->turns_per_minute[i] > CPH_SCHED_MAX_PER_MINUTE ||
        cfg->tool_calls_per_minute[i] < 0 ||
        cfg->tool_calls_per_minute[i] > CPH_SCHED_MAX_PER_MINUTE)
      w = "lane budgets must be from 0 to 100000000 per minute";
    else if (!(cfg->cost[i] >= 0 && cfg->cost[i] <= CPH_SCHED_MAX_CREDITS))
      w = "credit costs must be from 0 to 1000000";
  }
  if (w) {
  } else if (!(cfg->refill_per_second >= 0 && cfg->refill_per_second <= CPH_SCHED_MAX_REFILL))
    w = "refill-per-second must be from 0 to 1000000";
  else if (!(cfg->credit_max > 0 && cfg->credit_max <= CPH_SCHED_MAX_CREDITS))
    w = "credit max must be above 0 and at most 1000000";
  else if (!(cfg->credit_min >= -CPH_SCHED_MAX_CREDITS && cfg->credit_min <= cfg->credit_max))
    w = "credit min must be from -1000000 to max";
  else if (cfg->concurrency < 1)
    w = "concurrency must be at least 1";
  if (why)
    *why = w;
  return w ? CPH_EINVAL : CPH_OK;
}

static void apply_credit_config(cph_sched *s, const cph_sched_config *cfg) {
  s->rate = (int64_t)llround(cfg->refill_per_second * 1000.0);
  s->c_max = credits_units(cfg->credit_max);
  s->c_min = credits_units(cfg->credit_min);
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    s->cost[i] = credits_units(cfg->cost[i]);
}

cph_sched *cph_sched_new(const cph_sched_config *cfg, const cph_clock *clock) {
  if (cph_sched_config_check(cfg, NULL))
    return NULL;
  cph_sched *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->clock = clock;
  s->cfg = *cfg;
  cph_strslab_init(&s->ids);
  apply_credit_config(s, cfg);
  int64_t now = cph_clock_now(clock);
  s->trickle_due_ns = now;
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    l->turns = (bucket){0, cfg->turns_per_minute[i], now};
    l->turns.level = bucket_cap(&l->turns); /* buckets start full */
    l->tools = (bucket){0, cfg->tool_calls_per_minute[i], now};
    l->tools.level = bucket_cap(&l->tools);
  }
  return s;
}

void cph_sched_free(cph_sched *s) {
  if (!s)
    return;
  for (uint32_t i = 0; i < s->n_sessions; i++)
    cph_strslab_free(&s->ids, s->sessions[i].id);
  cph_strslab_destroy(&s->ids);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    oset_free(&s->lanes[i].at_max);
    oset_free(&s->lanes[i].below);
  }
  free(s->sessions);
  free(s->free_sids);
  free(s->trickle_sids);
  free(s);
}

/* Keeps the bucket's fill ratio across a capacity change (issue: live policy changes). */
static void bucket_rescale(bucket *b, int64_t per_min, int64_t now) {
  bucket_refill(b, now);
  int64_t old_cap = bucket_cap(b);
  b->per_min = per_min;
  int64_t new_cap = bucket_cap(b);
  if (old_cap == 0)
    b->level = new_cap;
  else
    b->level = clamp_i128((i128)b->level * new_cap / old_cap, INT64_MIN / 4, new_cap);
}

int cph_sched_configure(cph_sched *s, const cph_sched_config *cfg) {
  int rc = cph_sched_config_check(cfg, NULL);
  if (rc)
    return rc;
  int64_t now = cph_clock_now(s->clock);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    bucket_rescale(&s->lanes[i].turns, cfg->turns_per_minute[i], now);
    bucket_rescale(&s->lanes[i].tools, cfg->tool_calls_per_minute[i], now);
  }
  bool credits_changed = cfg->refill_per_second != s->cfg.refill_per_second ||
                         cfg->credit_max != s->cfg.credit_max ||
                         cfg->credit_min != s->cfg.credit_min;
  if (credits_changed) {
    /* Materialise every session's credits under the old settings, then re-queue under the
     * new ones: K depends on the rate and at_max on the cap. O(n log n), on reload only. */
    for (uint32_t i = 0; i < s->n_sessions; i++) {
      session *se = &s->sessions[i];
      if (se->id && !se->removed) {
        se->c0 = credits_at(s, se, now);
        se->t0 = now;
      }
    }
    apply_credit_config(s, cfg);
    for (int i = 0; i < CPH_LANE_COUNT; i++) {
      oset_clear(s, &s->lanes[i].at_max);
      oset_clear(s, &s->lanes[i].below);
      s->lanes[i].runnable = 0;
    }
    for (uint32_t i = 0; i < s->n_sessions; i++) {
      session *se = &s->sessions[i];
      if (!se->id || se->removed)
        continue;
      se->c0 = se->c0 > s->c_max ? s->c_max : se->c0 < s->c_min ? s->c_min : se->c0;
      if (se->where != WHERE_NONE) {
        se->gen++;
        se->where = WHERE_NONE;
        enqueue(s, i, now, se->queued_ns); /* keeps its place in the wait order */
      }
    }
  } else {
    apply_credit_config(s, cfg); /* costs */
  }
  s->cfg = *cfg;
  if (cfg->trickle_per_minute && s->trickle_due_ns > now + trickle_interval(s))
    s->trickle_due_ns = now + trickle_interval(s); /* a faster trickle applies at once */
  return CPH_OK;
}

/* ---------------------------------------------------------------- sessions */

static int add_session(cph_sched *s, const char *id, cph_lane lane, int64_t credits,
                       cph_sid *out) {
  if ((unsigned)lane >= CPH_LANE_COUNT || !id)
    return CPH_EINVAL;
  if (!s->n_free && s->n_sessions == s->cap_sessions &&
      cph_sched_reserve(s, s->cap_sessions ? (size_t)s->cap_sessions * 2 : 64) != CPH_OK)
    return CPH_ENOMEM;
  char *copy = cph_strslab_dup(&s->ids, id);
  if (!copy)
    return CPH_ENOMEM;
  cph_sid sid;
  if (s->n_free) {
    sid = s->free_sids[--s->n_free];
  } else {
    sid = s->n_sessions++;
    s->sessions[sid].gen = 0;
  }
  session *se = &s->sessions[sid];
  uint32_t gen = se->gen + 1; /* a reused slot must not revive its old entries */
  memset(se, 0, sizeof *se);
  se->id = copy;
  se->gen = gen;
  se->lane = (uint8_t)lane;
  se->c0 = credits > s->c_max ? s->c_max : credits < s->c_min ? s->c_min : credits;
  se->t0 = cph_clock_now(s->clock);
  *out = sid;
  return CPH_OK;
}

int cph_sched_reserve(cph_sched *s, size_t n) {
  if (n <= s->cap_sessions)
    return CPH_OK;
  if (n >= CPH_SID_NONE)
    return CPH_ENOMEM;
  session *p = realloc(s->sessions, n * sizeof *p);
  if (!p)
    return CPH_ENOMEM;
  s->sessions = p;
  s->cap_sessions = (uint32_t)n;
  return CPH_OK;
}

int cph_sched_add(cph_sched *s, const char *id, cph_lane lane, cph_sid *out) {
  return add_session(s, id, lane, s->c_max, out);
}

int cph_sched_restore(cph_sched *s, const char *id, cph_lane lane, double credits,
                      cph_sid *out) {
  if (!isfinite(credits))
    return CPH_EINVAL;
  return add_session(s, id, lane, credits_units(credits), out);
}

/* The slot of a removed session that no set names any more becomes free. */
static void release_slot(cph_sched *s, cph_sid sid) {
  session *se = &s->sessions[sid];
  cph_strslab_free(&s->ids, se->id);
  se->id = NULL;
  se->removed = false;
  s->n_removed--;
  s->free_sids[s->n_free++] = sid; /* room reserved by cph_sched_remove */
}

int cph_sched_remove(cph_sched *s, cph_sid sid) {
  session *se = &s->sessions[sid];
  if (se->running)
    return CPH_ESTATE;
  /* Room on the free list for every removed slot, so releasing one never allocates. */
  if (s->n_free + s->n_removed + 1 > s->cap_free) {
    uint32_t cap = s->cap_free ? s->cap_free * 2 : 64;
    cph_sid *p = realloc(s->free_sids, (size_t)cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    s->free_sids = p;
    s->cap_free = cap;
  }
  cph_sched_set_trickle(s, sid, false);
  dequeue(s, se);
  se->gen++;
  se->removed = true;
  s->n_removed++;
  if (se->refs == 0)
    release_slot(s, sid);
  return CPH_OK;
}

void cph_sched_set_work(cph_sched *s, cph_sid sid, bool has_work) {
  s->sessions[sid].has_work = has_work;
  update_queue(s, sid);
}

void cph_sched_set_paused(cph_sched *s, cph_sid sid, bool paused) {
  s->sessions[sid].paused = paused;
  update_queue(s, sid);
}

void cph_sched_set_trickle(cph_sched *s, cph_sid sid, bool pending) {
  session *se = &s->sessions[sid];
  if (se->trickle == pending)
    return;
  if (pending) {
    int64_t now = cph_clock_now(s->clock);
    if (s->n_trickle == 0 && s->trickle_due_ns < now)
      s->trickle_due_ns = now; /* nothing was owed while no batch was pending */
    if (s->n_trickle == s->cap_trickle) {
      uint32_t cap = s->cap_trickle ? s->cap_trickle * 2 : 4;
      cph_sid *p = realloc(s->trickle_sids, (size_t)cap * sizeof *p);
      if (!p)
        return; /* the normal pick still serves it */
      s->trickle_sids = p;
      s->cap_trickle = cap;
    }
    s->trickle_sids[s->n_trickle++] = sid;
  } else {
    for (uint32_t i = 0; i < s->n_trickle; i++)
      if (s->trickle_sids[i] == sid) {
        s->trickle_sids[i] = s->trickle_sids[--s->n_trickle];
        break;
      }
  }
  se->trickle = pending;
}

/* An outbox batch started at now. The next is due one interval after this one was due, not
 * after it started: a batch that waited for a free slot does not push the schedule back (that
 * drift gave fewer than trickle_per_minute batches a minute under saturation), and batches
 * owed are caught up at the next free slots. Clamped to [now - 1 min, now + interval]: the
 * schedule falls at most a minute behind (older debt is forgiven) and batches run early by
 * normal picks bank nothing. */
static void trickle_started(cph_sched *s, int64_t now) {
  if (s->cfg.trickle_per_minute == 0) {
    s->trickle_due_ns = now;
    return;
  }
  int64_t interval = trickle_interval(s), lag = 60 * CPH_NS_PER_S;
  int64_t next = s->trickle_due_ns + interval;
  s->trickle_due_ns = next < now - lag ? now - lag : next > now + interval ? now + interval : next;
}

void cph_sched_trickle_ran(cph_sched *s) { trickle_started(s, cph_clock_now(s->clock)); }

/* ---------------------------------------------------------------- the pick */

static void refill_all(cph_sched *s, int64_t now) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    bucket_refill(&s->lanes[i].turns, now);
    bucket_refill(&s->lanes[i].tools, now);
  }
}

static bool trickle_due(const cph_sched *s, int64_t now) {
  if (s->cfg.trickle_per_minute == 0 || s->n_trickle == 0)
    return false;
  return now >= s->trickle_due_ns;
}

/* §3.5: the trickle session to run now, if one is due; the smallest id among those ready. */
static cph_sid trickle_candidate(const cph_sched *s, int64_t now) {
  if (!trickle_due(s, now))
    return CPH_SID_NONE;
  cph_sid best = CPH_SID_NONE;
  for (uint32_t i = 0; i < s->n_trickle; i++) {
    const session *se = &s->sessions[s->trickle_sids[i]];
    if (se->running || se->paused)
      continue;
    if (best == CPH_SID_NONE || strcmp(se->id, s->sessions[best].id) < 0)
      best = s->trickle_sids[i];
  }
  return best;
}

static void start(cph_sched *s, session *se, cph_pick *out, int64_t now) {
  lane_state *l = &s->lanes[se->lane];
  out->waited_ns = se->where != WHERE_NONE ? now - se->queued_ns : 0;
  dequeue(s, se);
  se->running = true;
  s->running++;
  l->running++;
  l->started_total++;
  out->lane = (cph_lane)se->lane;
}

int cph_sched_pick(cph_sched *s, cph_pick *out) {
  return cph_sched_pick_lanes(s, CPH_LANES_ALL, out);
}

int cph_sched_pick_lanes(cph_sched *s, unsigned lane_mask, cph_pick *out) {
  if (s->running >= s->cfg.concurrency)
    return CPH_ENOTFOUND;
  int64_t now = cph_clock_now(s->clock);
  refill_all(s, now);

  cph_sid t = trickle_candidate(s, now);
  if (t != CPH_SID_NONE && (lane_mask & (1u << s->sessions[t].lane))) {
    out->sid = t;
    out->trickle = true;
    start(s, &s->sessions[t], out, now);
    trickle_started(s, now);
    return CPH_OK;
  }
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    if (!(lane_mask & (1u << i)) || !l->runnable || !lane_has_budget(l))
      continue;
    oset *from;
    entry *e = lane_head(s, l, now, &from);
    if (!e)
      continue;
    cph_sid sid = e->sid;
    oset_pop_head(s, from, e);
    out->sid = sid;
    out->trickle = false;
    start(s, &s->sessions[sid], out, now);
    bucket_charge(&l->turns, 1);
    return CPH_OK;
  }
  return CPH_ENOTFOUND;
}

void cph_sched_finish(cph_sched *s, cph_sid sid, uint64_t tool_calls, bool charge_credits) {
  session *se = &s->sessions[sid];
  if (!se->running)
    return;
  int64_t now = cph_clock_now(s->clock);
  lane_state *l = &s->lanes[se->lane];
  bucket_refill(&l->tools, now);
  bucket_charge(&l->tools, tool_calls > (uint64_t)INT64_MAX / CPH_BUCKET_UNITS_PER_TOKEN
                               ? INT64_MAX / CPH_BUCKET_UNITS_PER_TOKEN
                               : (int64_t)tool_calls);
  int64_t c = credits_at(s, se, now);
  if (charge_credits) {
    c -= s->cost[se->lane];
    if (c < s->c_min)
      c = s->c_min;
  }
  se->c0 = c;
  se->t0 = now;
  se->running = false;
  s->running--;
  l->running--;
  update_queue(s, sid);
}

/* check_credits: sessions whose credits reached max move to the wait-ordered set. */
void cph_sched_check_credits(cph_sched *s) {
  int64_t now = cph_clock_now(s->clock);
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    promote(s, &s->lanes[i], now);
}

/* top_up_credits: lane buckets refilled to now (credits refill lazily, by formula). */
void cph_sched_top_up(cph_sched *s) { refill_all(s, cph_clock_now(s->clock)); }

/* ---------------------------------------------------------------- introspection */

double cph_sched_credits(const cph_sched *s, cph_sid sid) {
  return (double)credits_at(s, &s->sessions[sid], cph_clock_now(s->clock)) / 1e12;
}

const char *cph_sched_id(const cph_sched *s, cph_sid sid) { return s->sessions[sid].id; }
cph_lane cph_sched_lane(const cph_sched *s, cph_sid sid) {
  return (cph_lane)s->sessions[sid].lane;
}
bool cph_sched_is_running(const cph_sched *s, cph_sid sid) { return s->sessions[sid].running; }
uint32_t cph_sched_running(const cph_sched *s) { return s->running; }
uint32_t cph_sched_concurrency(const cph_sched *s) { return s->cfg.concurrency; }

/* When the lane will have budget again, assuming nothing else is charged. */
static int64_t budget_until(const lane_state *l, int64_t now) {
  int64_t until = now;
  if (l->turns.level < CPH_BUCKET_UNITS_PER_TOKEN) {
    if (l->turns.per_min == 0)
      return INT64_MAX;
    int64_t need = CPH_BUCKET_UNITS_PER_TOKEN - l->turns.level;
    int64_t t = now + (need + l->turns.per_min - 1) / l->turns.per_min;
    until = t > until ? t : until;
  }
  if (l->tools.level <= 0) {
    if (l->tools.per_min == 0)
      return INT64_MAX;
    int64_t need = 1 - l->tools.level;
    int64_t t = now + (need + l->tools.per_min - 1) / l->tools.per_min;
    until = t > until ? t : until;
  }
  return until;
}

/* Counts live entries of o that go before `me`, and the live total. */
static void oset_count(const cph_sched *s, const oset *o, const entry *me, uint64_t *before,
                       uint64_t *total) {
  for (uint32_t i = 0; i < o->ring.len; i++) {
    const entry *e = &o->ring.items[(o->ring.head + i) & (o->ring.cap - 1)];
    if (!entry_live(s, e))
      continue;
    (*total)++;
    if (me && entry_cmp(s, e, me) < 0)
      (*before)++;
  }
  for (uint32_t i = 0; i < o->heap.len; i++) {
    const entry *e = &o->heap.items[i];
    if (!entry_live(s, e))
      continue;
    (*total)++;
    if (me && entry_cmp(s, e, me) < 0)
      (*before)++;
  }
}

void cph_sched_why(cph_sched *s, cph_sid sid, cph_why *out) {
  memset(out, 0, sizeof *out);
  session *se = &s->sessions[sid];
  int64_t now = cph_clock_now(s->clock);
  refill_all(s, now);
  lane_state *l = &s->lanes[se->lane];
  out->lane = (cph_lane)se->lane;
  out->credits = (double)credits_at(s, se, now) / 1e12;
  out->lane_runnable = l->runnable;
  if (se->running) {
    out->reason = CPH_WHY_RUNNING;
    return;
  }
  if (se->paused) {
    out->reason = CPH_WHY_PAUSED;
    return;
  }
  if (!se->has_work || se->where == WHERE_NONE) {
    out->reason = CPH_WHY_NO_INPUT;
    return;
  }
  out->waiting_ns = now - se->queued_ns;
  if (!lane_has_budget(l)) {
    out->reason = CPH_WHY_LANE_NO_BUDGET;
    out->until_ns = budget_until(l, now);
    return;
  }
  if (s->running >= s->cfg.concurrency) {
    out->reason = CPH_WHY_CONCURRENCY_FULL;
    return;
  }
  out->reason = CPH_WHY_RUNNABLE;
  promote(s, l, now);
  entry me = {0, se->queued_ns, sid, se->gen};
  if (se->where == WHERE_BELOW)
    me.key = (i128)se->c0 - (i128)s->rate * se->t0;
  uint64_t before = 0, total = 0;
  if (se->where == WHERE_AT_MAX) {
    oset_count(s, &l->at_max, &me, &before, &total);
  } else {
    uint64_t at_max_total = 0, ignored = 0;
    oset_count(s, &l->at_max, NULL, &ignored, &at_max_total);
    before = at_max_total;
    oset_count(s, &l->below, &me, &before, &total);
  }
  out->rank = before + 1;
  for (int i = 0; i < se->lane; i++)
    if (lane_has_budget(&s->lanes[i]))
      out->ahead_in_higher_lanes += s->lanes[i].runnable;
}

const char *cph_why_reason_name(cph_why_reason r) {
  switch (r) {
  case CPH_WHY_NO_INPUT: return "no_input";
  case CPH_WHY_PAUSED: return "paused";
  case CPH_WHY_RUNNING: return "running";
  case CPH_WHY_LANE_NO_BUDGET: return "lane_out_of_budget";
  case CPH_WHY_CONCURRENCY_FULL: return "concurrency_full";
  case CPH_WHY_RUNNABLE: return "runnable";
  }
  return "unknown";
}

void cph_sched_lane_stats(cph_sched *s, cph_lane lane, cph_lane_stats *out) {
  int64_t now = cph_clock_now(s->clock);
  lane_state *l = &s->lanes[lane];
  bucket_refill(&l->turns, now);
  bucket_refill(&l->tools, now);
  out->turns_left = (double)l->turns.level / CPH_BUCKET_UNITS_PER_TOKEN;
  out->tool_calls_left = (double)l->tools.level / CPH_BUCKET_UNITS_PER_TOKEN;
  out->has_budget = lane_has_budget(l);
  out->runnable = l->runnable;
  out->running = l->running;
  out->started_total = l->started_total;
}
