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
 * Tenants (§3.9): the two sets belong to a `group`, the runnable sessions of one tenant in
 * one lane. Until a session names a tenant there is one group per lane (the default tenant's)
 * and the pick takes it directly. From then on each lane also keeps the groups that have
 * runnable sessions in order of their start tags (start-time fair queueing, see sched.h): per
 * weight class a ring with a heap beside it, the classes in a tournament (see tclass,
 * lane_state), and the pick takes the group at the winning class's head: O(log classes) more
 * per pick, rarely O(log tenants). At machine rates that group serves a run of picks (sched.h,
 * "Runs"): the order is consulted once per run, and a pick inside a run costs what a plain
 * pick does plus a count (run_settle applies the run's tags when they are next read).
 *
 * A stale entry is still compared while it sits in a ring or heap (as the ring's back, inside
 * heap sifts), and the comparison reads its session's id. So a removed session's slot keeps
 * its id and is not reused until no set holds an entry naming it (`refs`, which counts stale
 * entries only: a removed session has no live one); otherwise the entry's order would change
 * under it (a reused id) or crash (a freed one). Each set counts its stale entries too: while
 * it has none, its head is live without a look at its session, and the pick reads no session
 * at all (take_head). */
#include "sched.h"

#include "pass.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "common/hmap.h"
#include "common/hugepage.h"
#include "common/slab.h"

typedef __int128 i128;

/* The pick and finish run millions of times a second (DESIGN §12): their small helpers are
 * inlined whatever the compiler's size heuristics say. */
#define HOT_INLINE inline __attribute__((always_inline))

/* ---------------------------------------------------------------- ordered sets */

typedef struct entry {
  i128 key;          /* below: K; at_max: 0 */
  int64_t queued_ns; /* queued_since */
  cph_sid sid;
  uint32_t gen;
} entry;

_Static_assert(64 % sizeof(entry) == 0, "entries tile cache lines (ring_grow aligns rings)");

/* A ring's index wraps two ways. Until tenants come on, every ring's cap is a power of two
 * and the plain lane's pick and finish wrap by a mask. Once they are on, rings grow *tight*
 * (tring_grow): a few entries at a time, so a saturated group's ring ends within a few entries
 * of its peak length and its finishes append onto the lines its last run's picks just read,
 * not on lines a rotation of the lane's groups old (bench/PROFILE.md); its index wraps by a
 * comparison, which is right for any cap, a power of two included. tenants_on never goes back
 * off, so a masked wrap never meets a tight ring (cph_sched_audit checks the caps). */
typedef struct ring {
  entry *items;
  uint32_t head, len, cap; /* cap is even (entries tile lines); a power of two until tenants */
} ring;

typedef struct heap {
  entry *items;
  uint32_t len, cap;
} heap;

typedef struct oset {
  ring ring;
  heap heap;
  uint32_t stale; /* its stale entries: while there are none, its heads are live without a
                     look at their sessions, so the pick reads no session (see take_head) */
} oset;

enum { WHERE_NONE, WHERE_AT_MAX, WHERE_BELOW };

typedef struct session {
  char *id;   /* from the sched's id slab; NULL for a free slot */
  int64_t c0; /* credits (units) as of t0 */
  int64_t t0;
  int64_t queued_ns; /* when it last became runnable */
  uint32_t gen;      /* bumped whenever it leaves a set */
  uint32_t refs;     /* stale entries in sets that name this slot (its live entry is not
                        counted, so taking it touches no session) */
  uint32_t tenant;   /* index in cph_sched.tenants (0 = the default); kept here, not in an
                        array beside, so the pick reads one line per session */
  uint8_t lane;
  uint8_t where; /* WHERE_*: the set holding its live entry */
  bool running;  /* a byte of its own, not a bit beside the flags: a finish writes it without
                    reading the line (finish, "a finish from the pick") */
  bool has_work : 1;
  bool paused : 1;
  bool trickle : 1;
  bool removed : 1; /* removed by the caller; the slot is freed when refs reaches 0 */
} session;

_Static_assert(sizeof(session) == 48, "a session stays 48 bytes (the memory row of §12)");

typedef struct bucket {
  int64_t level;   /* units; may be negative for tool calls and tokens */
  int64_t per_min; /* budget per minute = refill in units per ns */
  int64_t at_ns;   /* level is as of this time */
} bucket;

/* The runnable sessions of one tenant in one lane. */
typedef struct group {
  oset at_max;
  oset below;
  uint64_t runnable; /* live entries in the two sets */
  i128 vtag;         /* while in the lane's tenant order its start tag, out of it the finish
                        tag of its last pick */
  uint32_t hgen;     /* the generation of its live slot; slots of older ones are stale, and
                        so are all of them once it leaves (leaving bumps it) */
  bool in_heap;      /* it has a live slot in its lane's tenant order */
  uint32_t tenant;   /* index in cph_sched.tenants */
  uint64_t started;
  struct tclass *cls; /* its class in the lane (its tenant's step); NULL until it joins */
} group;

/* A group's place in its lane's tenant order. The keys live in the slot, so ordering reads
 * only slots; a group that leaves bumps hgen and its slot is dropped when it surfaces. A slot
 * with vstart TAG_NONE names no group: the key of a class without slots. */
typedef struct tslot {
  i128 vstart;
  uint32_t tenant; /* the tie-break: the tenant the scheduler knew first goes first */
  uint32_t gen;
  group *g;
} tslot;

/* The groups with runnable sessions of one lane whose tenants have the same step (weight),
 * by (vstart, tenant). A served group's next tag is its tag plus the step, which in start-time
 * fair queueing is at least every other tag of its class — so slots mostly arrive in order and
 * are appended to a ring (O(1)); the few that do not (a group joining at the lane's virtual
 * time) go to a heap beside it. The lane orders its classes by their heads in a tournament
 * (see lane_state): a pick costs O(log classes) plus, rarely, O(log groups). */
typedef struct tclass {
  int64_t inc;
  tslot *ring;
  uint32_t head, len, cap; /* cap is a power of two */
  tslot *heap;
  uint32_t hlen, hcap;
  uint32_t live; /* live slots */
  uint32_t idx;  /* its index in the lane's classes, and its leaf in the tournament */
} tclass;

typedef struct tenant {
  char *name; /* "" for the default tenant */
  double weight;
  int64_t inc;       /* start-tag step per turn: CPH_TENANT_VSCALE / weight */
  uint64_t sessions; /* registered sessions naming it */
  group g[CPH_LANE_COUNT];
} tenant;

typedef struct lane_state {
  bucket turns;
  bucket tools;
  bucket tokens;    /* per_min 0: no token budget (§3.8) */
  tclass **classes; /* every class of the lane (tenants on), by idx */
  /* The classes' order: a tournament over `leaves` leaves, a power of two >= n_classes.
   * keys[i] is class i's key: no later than every slot it holds, live or stale (TAG_NONE when
   * it holds none, and for the leaves past n_classes); it is its head, unless it is a stale
   * slot, which is put right when it comes out on top. wins[k] (1 <= k < leaves) is the class
   * with the smaller key of the two that won below node k (children 2k, 2k + 1; leaf i is
   * node leaves + i), wins[0] the overall winner. A changed key replays its path: log2(leaves)
   * comparisons without a data-dependent branch — the order of classes changes from pick to
   * pick, and a mispredicted branch costs more than the comparisons. */
  tslot *keys;
  uint32_t *wins;
  uint32_t n_classes, leaves;
  uint32_t live_groups; /* groups with a live slot */
  i128 vtime;           /* the largest start tag the lane has served */
  /* §3.9 runs (sched.h). run_g serves the lane's run while run_left > 0 (its leaving the order
   * zeroes run_left); meanwhile its slot keeps the tag the run started at, until run_end puts
   * it right. The run's picks are counted in run_done and settled (run_settle) into run_g's
   * vtag and started, the lane's vtime and span_picks only when something reads them, so a
   * pick inside a run touches none of them. The run length run_q was sized over the span that
   * began at span_ns, in which the lane made span_picks tenant picks. */
  group *run_g;
  uint32_t run_left;
  uint32_t run_done;
  uint32_t run_len;   /* the run's length when it started */
  group *run_next;    /* a guess at the next run's group, for prefetching; NULL: none */
  uint32_t run_q;
  int64_t span_ns;
  uint64_t span_picks;
  uint64_t runnable;
  uint64_t running;
  uint64_t started_total;
  /* The last completions (§3.11): ring of CPH_SCHED_WINDOW, n_done in all. */
  int64_t done_at[CPH_SCHED_WINDOW];
  int64_t done_len[CPH_SCHED_WINDOW];
  uint64_t n_done;
} lane_state;

enum { STARTS_MAX = 64 }; /* a power of two */

struct cph_sched {
  const cph_clock *clock;
  cph_sched_config cfg;
  int64_t rate;  /* credit units per ns */
  int64_t c_max; /* credit units */
  int64_t c_min;
  int64_t cost[CPH_LANE_COUNT];
  lane_state lanes[CPH_LANE_COUNT];
  session *sessions;
  uint32_t n_sessions, cap_sessions;
  cph_strslab ids; /* session ids: one copy each, no malloc header */
  cph_sid *free_sids;
  uint32_t n_free, cap_free;
  uint32_t n_removed;    /* removed slots still named by set entries */
  cph_sid *trickle_sids; /* sessions with a due outbox batch; few (usually the janitor) */
  uint32_t n_trickle, cap_trickle;
  int64_t trickle_due_ns; /* when the next outbox batch is due (§3.5) */
  uint32_t running;
  uint32_t seats_total; /* sum of cfg.seats: 0 = no reservations (§3.10) */
  bool tokens_budgeted; /* some lane has a tokens budget (§3.8) */
  tenant dflt;          /* tenant 0: sessions that name none */
  tenant **tenants;     /* tenants[0] == &dflt */
  uint32_t n_tenants, cap_tenants;
  cph_hmap tenant_by_name; /* name -> tenant *, every tenant but the default */
  bool tenants_on;         /* some session has named a tenant; until then every session is
                              the default tenant's and the pick is the plain one */
  /* Picks not yet written to their sessions (see take_head), oldest first: a ring of
   * STARTS_MAX from starts_head. */
  struct started {
    cph_sid sid;
    uint32_t gen;  /* the session's generation once it has left its set */
    int64_t at_ns; /* when its turn started */
    /* What the pick knew of the session from its entry, for a finish that comes while this
     * start is still pending (finish): its credits as K (credits at time t = min(c_max, K +
     * rate·t), an at_max entry's put so that they are c_max), its group and lane. */
    i128 key;
    struct group *g;
    uint8_t lane;
  } starts[STARTS_MAX];
  uint32_t starts_head, n_starts;
};

static void starts_flush(cph_sched *s);

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

/* A stale entry naming sid has left its set. */
static void drop_ref(cph_sched *s, cph_sid sid) {
  session *se = &s->sessions[sid];
  if (--se->refs == 0 && se->removed)
    release_slot(s, sid);
}

/* A full ring doubles. Out of line: the push's usual path is inlined, and must stay small. */
static __attribute__((noinline)) bool ring_grow(ring *r) {
  uint32_t cap = r->cap ? r->cap * 2 : 16;
  /* aligned to cache lines (cap * 32 bytes is a multiple of 64): an entry then never
   * straddles two lines, and a prefetch of one fetches all of it */
  entry *items = aligned_alloc(64, (size_t)cap * sizeof *items);
  if (!items)
    return false;
  for (uint32_t i = 0; i < r->len; i++)
    items[i] = r->items[(r->head + i) & (r->cap - 1)];
  free(r->items);
  r->items = items;
  r->head = 0;
  r->cap = cap;
  return true;
}

static entry *ring_front(ring *r) { return r->len ? &r->items[r->head] : NULL; }
static void ring_pop(ring *r) {
  r->head = (r->head + 1) & (r->cap - 1);
  r->len--;
}

/* The tight ring's functions (tenants on). The index wraps by a comparison, which is right for
 * any cap, a power of two included; the branch rather than a conditional move, so that the
 * pick's next front does not wait for it (the wrap is taken once a lap). */
static HOT_INLINE uint32_t tring_at(const ring *r, uint32_t i) {
  uint32_t k = r->head + i; /* i <= len <= cap, head < cap */
  if (__builtin_expect(k >= r->cap, 0))
    k -= r->cap;
  return k;
}

/* A tight ring grows by RING_TIGHT_STEP entries up to RING_TIGHT_MAX, then by an eighth:
 * amortised O(1) copies a push either way (at most RING_TIGHT_MAX / 16 below, about 9
 * above). */
enum { RING_TIGHT_STEP = 8, RING_TIGHT_MAX = 4096 };

static __attribute__((noinline)) bool tring_grow(ring *r) {
  uint32_t cap = !r->cap                  ? 16
                 : r->cap < RING_TIGHT_MAX ? r->cap + RING_TIGHT_STEP
                                           : r->cap + ((r->cap / 8) & ~7u);
  entry *items = aligned_alloc(64, (size_t)cap * sizeof *items); /* as ring_grow's */
  if (!items)
    return false;
  for (uint32_t i = 0; i < r->len; i++)
    items[i] = r->items[tring_at(r, i)];
  free(r->items);
  r->items = items;
  r->head = 0;
  r->cap = cap;
  return true;
}


static void tring_pop(ring *r) {
  r->head = tring_at(r, 1);
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

/* Puts the entry {key, queued_ns, sid, gen} into o: after the ring's back when it comes after
 * it, else into the heap. It is written field by field into the ring's next slot first, and
 * compared there: an entry built in a local and copied into the ring was read back in wider
 * loads than it was written with (its 128-bit key), a store-forwarding stall at every push
 * (bench/PROFILE.md, "Entries written in place"). A full ring grows first. */
static HOT_INLINE bool oset_push(cph_sched *s, oset *o, i128 key, int64_t queued_ns,
                                 cph_sid sid, uint32_t gen) {
  ring *r = &o->ring;
  if (__builtin_expect(r->len == r->cap, 0) && !ring_grow(r))
    return false;
  entry *x = &r->items[(r->head + r->len) & (r->cap - 1)];
  x->key = key;
  x->queued_ns = queued_ns;
  x->sid = sid;
  x->gen = gen;
  if (!r->len || entry_cmp(s, &r->items[(r->head + r->len - 1) & (r->cap - 1)], x) < 0) {
    r->len++;
    return true;
  }
  return heap_push(s, &o->heap, *x); /* the slot stays past the ring's end */
}

/* The set's first live entry, dropping stale ones on the way; NULL when empty. With no stale
 * entry in the set, no session is read. */
static entry *oset_head(cph_sched *s, oset *o) {
  entry *r = ring_front(&o->ring);
  while (o->stale && r && !entry_live(s, r)) {
    cph_sid sid = r->sid;
    ring_pop(&o->ring);
    o->stale--;
    drop_ref(s, sid);
    r = ring_front(&o->ring);
  }
  while (o->stale && o->heap.len && !entry_live(s, &o->heap.items[0])) {
    cph_sid sid = o->heap.items[0].sid;
    heap_pop(s, &o->heap);
    o->stale--;
    drop_ref(s, sid);
  }
  entry *h = o->heap.len ? &o->heap.items[0] : NULL;
  if (!r)
    return h;
  if (!h)
    return r;
  return entry_cmp(s, r, h) <= 0 ? r : h;
}

/* head is the live head oset_head returned: its session has no ref to drop. */
static void oset_pop_head(cph_sched *s, oset *o, const entry *head) {
  if (head == ring_front(&o->ring))
    ring_pop(&o->ring);
  else
    heap_pop(s, &o->heap);
}

/* The same on a tight ring (tenants on). Copies of the plain functions on purpose: one body
 * for both forms, specialised through a constant argument and forced inlining, compiled the
 * plain oset_head and oset_push to other code (register use, block order: objdump), and the
 * plain pick's code is kept as it was measured. */
static HOT_INLINE bool oset_push_tight(cph_sched *s, oset *o, i128 key, int64_t queued_ns,
                                       cph_sid sid, uint32_t gen) {
  ring *r = &o->ring;
  if (__builtin_expect(r->len == r->cap, 0) && !tring_grow(r))
    return false;
  entry *x = &r->items[tring_at(r, r->len)];
  x->key = key;
  x->queued_ns = queued_ns;
  x->sid = sid;
  x->gen = gen;
  if (!r->len || entry_cmp(s, &r->items[tring_at(r, r->len - 1)], x) < 0) {
    r->len++;
    return true;
  }
  return heap_push(s, &o->heap, *x); /* the slot stays past the ring's end */
}

static entry *oset_head_tight(cph_sched *s, oset *o) {
  entry *r = ring_front(&o->ring);
  while (o->stale && r && !entry_live(s, r)) {
    cph_sid sid = r->sid;
    tring_pop(&o->ring);
    o->stale--;
    drop_ref(s, sid);
    r = ring_front(&o->ring);
  }
  while (o->stale && o->heap.len && !entry_live(s, &o->heap.items[0])) {
    cph_sid sid = o->heap.items[0].sid;
    heap_pop(s, &o->heap);
    o->stale--;
    drop_ref(s, sid);
  }
  entry *h = o->heap.len ? &o->heap.items[0] : NULL;
  if (!r)
    return h;
  if (!h)
    return r;
  return entry_cmp(s, r, h) <= 0 ? r : h;
}

static void oset_pop_head_tight(cph_sched *s, oset *o, const entry *head) {
  if (head == ring_front(&o->ring))
    tring_pop(&o->ring);
  else
    heap_pop(s, &o->heap);
}

/* Drops stale entries once they outnumber live ones, so a session that keeps gaining and
 * losing work cannot grow a set without bound. Amortised O(1) per push. */
static void oset_compact(cph_sched *s, oset *o, uint64_t live) {
  uint64_t size = (uint64_t)o->ring.len + o->heap.len;
  if (size < 1024 || size < 4 * live)
    return;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < o->ring.len; i++) {
    entry e = o->ring.items[tring_at(&o->ring, i)];
    if (entry_live(s, &e))
      o->ring.items[tring_at(&o->ring, kept++)] = e;
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
  o->stale = 0;
}

static void oset_clear(cph_sched *s, oset *o) {
  for (uint32_t i = 0; i < o->ring.len; i++) {
    const entry *e = &o->ring.items[tring_at(&o->ring, i)];
    if (!entry_live(s, e))
      drop_ref(s, e->sid);
  }
  for (uint32_t i = 0; i < o->heap.len; i++)
    if (!entry_live(s, &o->heap.items[i]))
      drop_ref(s, o->heap.items[i].sid);
  o->ring.len = o->ring.head = 0;
  o->heap.len = 0;
  o->stale = 0;
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

/* Finite credits from outside (a restart, a state import) in units, clamped into [min, max]
 * before the conversion, which overflows past ±9.2e6 credits. */
static int64_t credits_clamped(const cph_sched *s, double credits) {
  double max = (double)s->c_max / 1e12, min = (double)s->c_min / 1e12;
  return credits >= max ? s->c_max : credits <= min ? s->c_min : credits_units(credits);
}

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
 * above 0; §3.8: and, when it budgets tokens, its tokens bucket is above 0. */
static bool lane_has_budget(const lane_state *l) {
  return l->turns.level >= CPH_BUCKET_UNITS_PER_TOKEN && l->tools.level > 0 &&
         (l->tokens.per_min == 0 || l->tokens.level > 0); /* §3.8: tokens, when budgeted */
}

/* §3.5: the spacing of guaranteed outbox batches; trickle_per_minute > 0. */
static int64_t trickle_interval(const cph_sched *s) {
  return 60 * CPH_NS_PER_S / s->cfg.trickle_per_minute;
}

/* ---------------------------------------------------------------- tenant heaps */

static HOT_INLINE group *group_of(const cph_sched *s, cph_sid sid) {
  const session *se = &s->sessions[sid];
  return s->tenants_on ? &s->tenants[se->tenant]->g[se->lane] : (group *)&s->dflt.g[se->lane];
}

/* §3.9: the order of groups in a lane: start tag, then the tenant's index. Without a branch:
 * the tenants' comparison is the borrow into the tags' difference, which cannot overflow —
 * tags start at 0 and grow by at most 10^15 a pick, far from TAG_NONE, itself far from the
 * type's limit. */
static HOT_INLINE bool slot_before(const tslot *a, const tslot *b) {
  return a->vstart - b->vstart - (a->tenant < b->tenant) < 0;
}

#define TAG_NONE ((i128)1 << 120)

/* A group out of the order has bumped hgen since its last slot (theap_leave), so the slot's
 * generation alone says whether it is live. */
static HOT_INLINE bool slot_live(const tslot *t) { return t->g->hgen == t->gen; }

/* ---- a class's ordered slots: ring + heap */

static tslot *cring_front(tclass *c) { return c->len ? &c->ring[c->head] : NULL; }
static tslot *cring_back(tclass *c) {
  return c->len ? &c->ring[(c->head + c->len - 1) & (c->cap - 1)] : NULL;
}
static void cring_pop(tclass *c) {
  c->head = (c->head + 1) & (c->cap - 1);
  c->len--;
}

static bool cring_push(tclass *c, const tslot *x) {
  if (c->len == c->cap) {
    uint32_t cap = c->cap ? 2 * c->cap : 8;
    tslot *p = malloc((size_t)cap * sizeof *p);
    if (!p)
      return false;
    for (uint32_t i = 0; i < c->len; i++)
      p[i] = c->ring[(c->head + i) & (c->cap - 1)];
    free(c->ring);
    c->ring = p;
    c->head = 0;
    c->cap = cap;
  }
  c->ring[(c->head + c->len++) & (c->cap - 1)] = *x;
  return true;
}

static void cheap_slot_up(tclass *c, uint32_t i) {
  tslot x = c->heap[i];
  while (i > 0 && slot_before(&x, &c->heap[(i - 1) / 2])) {
    c->heap[i] = c->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  c->heap[i] = x;
}

static void cheap_slot_down(tclass *c, uint32_t i) {
  tslot x = c->heap[i];
  for (;;) {
    uint32_t k = 2 * i + 1;
    if (k >= c->hlen)
      break;
    if (k + 1 < c->hlen && slot_before(&c->heap[k + 1], &c->heap[k]))
      k++;
    if (!slot_before(&c->heap[k], &x))
      break;
    c->heap[i] = c->heap[k];
    i = k;
  }
  c->heap[i] = x;
}

static void cheap_slot_pop(tclass *c) {
  c->heap[0] = c->heap[--c->hlen];
  if (c->hlen)
    cheap_slot_down(c, 0);
}

/* Drops stale slots once they outnumber live ones four to one: amortised O(1) per push. */
static void cset_compact(tclass *c) {
  uint32_t size = c->len + c->hlen;
  if (size < 64 || size < 4 * c->live)
    return;
  uint32_t kept = 0;
  for (uint32_t i = 0; i < c->len; i++) {
    tslot x = c->ring[(c->head + i) & (c->cap - 1)];
    if (slot_live(&x))
      c->ring[(c->head + kept++) & (c->cap - 1)] = x;
  }
  c->len = kept;
  kept = 0;
  for (uint32_t i = 0; i < c->hlen; i++)
    if (slot_live(&c->heap[i]))
      c->heap[kept++] = c->heap[i];
  c->hlen = kept;
  for (uint32_t i = kept / 2; i-- > 0;)
    cheap_slot_down(c, i);
}

/* x goes to the heap, the ring's back being after it. */
static bool cset_push_heap(tclass *c, const tslot *x) {
  if (c->hlen == c->hcap) {
    uint32_t cap = c->hcap ? 2 * c->hcap : 8;
    tslot *p = realloc(c->heap, (size_t)cap * sizeof *p);
    if (!p)
      return false;
    c->heap = p;
    c->hcap = cap;
  }
  c->heap[c->hlen] = *x;
  cheap_slot_up(c, c->hlen++);
  return true;
}

/* Stale slots are dropped (cset_compact) only when the ring or heap is full and would
 * otherwise grow: that keeps memory O(live slots), and the usual push — one comparison with
 * the ring's back and one store — checks nothing more. */
static HOT_INLINE bool cset_push(tclass *c, const tslot *x) {
  tslot *back = cring_back(c);
  bool in_ring = !back || slot_before(back, x);
  if (__builtin_expect(in_ring ? c->len == c->cap : c->hlen == c->hcap, 0))
    cset_compact(c); /* removes slots only: x still belongs where it was placed */
  if (!in_ring)
    return cset_push_heap(c, x);
  if (__builtin_expect(c->len == c->cap, 0))
    return cring_push(c, x);
  c->ring[(c->head + c->len++) & (c->cap - 1)] = *x;
  return true;
}

/* The class's first live slot, dropping stale ones on the way; NULL when none. */
static tslot *cset_head(tclass *c) {
  tslot *r;
  while ((r = cring_front(c)) && !slot_live(r))
    cring_pop(c);
  while (c->hlen && !slot_live(&c->heap[0]))
    cheap_slot_pop(c);
  tslot *h = c->hlen ? &c->heap[0] : NULL;
  if (!r)
    return h;
  if (!h)
    return r;
  return slot_before(r, h) ? r : h;
}

static void cset_pop(tclass *c, const tslot *head) {
  if (head == cring_front(c))
    cring_pop(c);
  else
    cheap_slot_pop(c);
}

/* ---- the lane's classes: a tournament over their keys (lane_state) */

/* Class i's key changed: the matches on its path are played again. */
static HOT_INLINE void tour_replay(lane_state *l, uint32_t i) {
  if (l->leaves == 1) {
    l->wins[0] = 0;
    return;
  }
  /* the match with its sibling leaf, then with the winners of the sibling subtrees above */
  uint32_t w = slot_before(&l->keys[i ^ 1], &l->keys[i]) ? i ^ 1 : i;
  uint32_t n = (l->leaves + i) >> 1;
  l->wins[n] = w;
  for (; n > 1; n >>= 1) {
    uint32_t o = l->wins[n ^ 1];
    w = slot_before(&l->keys[o], &l->keys[w]) ? o : w;
    l->wins[n >> 1] = w;
  }
  l->wins[0] = w;
}

/* Plays every match from the keys. */
static void tour_build(lane_state *l) {
  for (uint32_t k = l->leaves; k-- > 1;) {
    uint32_t a = 2 * k >= l->leaves ? 2 * k - l->leaves : l->wins[2 * k];
    uint32_t b = 2 * k + 1 >= l->leaves ? 2 * k + 1 - l->leaves : l->wins[2 * k + 1];
    l->wins[k] = slot_before(&l->keys[b], &l->keys[a]) ? b : a;
  }
  l->wins[0] = l->leaves > 1 ? l->wins[1] : 0;
}

/* After its head may have changed, class c's key becomes its head (dropping stale slots on
 * the way), or TAG_NONE when it has none. */
static void class_refresh(lane_state *l, tclass *c) {
  tslot *h = cset_head(c);
  static const tslot none = {TAG_NONE, 0, 0, NULL};
  l->keys[c->idx] = h ? *h : none;
  tour_replay(l, c->idx);
}

/* The group's class in the lane, created on first need; NULL on OOM. */
static tclass *class_of(const cph_sched *s, lane_state *l, group *g) {
  if (g->cls)
    return g->cls;
  int64_t inc = s->tenants[g->tenant]->inc;
  for (uint32_t i = 0; i < l->n_classes; i++)
    if (l->classes[i]->inc == inc)
      return g->cls = l->classes[i];
  if (l->n_classes == l->leaves) {
    uint32_t leaves = l->leaves ? 2 * l->leaves : 1;
    tclass **a = realloc(l->classes, (size_t)leaves * sizeof *a);
    if (!a)
      return NULL;
    l->classes = a;
    tslot *k = realloc(l->keys, (size_t)leaves * sizeof *k);
    if (!k)
      return NULL;
    l->keys = k;
    uint32_t *w = realloc(l->wins, (size_t)leaves * sizeof *w);
    if (!w)
      return NULL;
    l->wins = w;
    for (uint32_t i = l->leaves; i < leaves; i++)
      l->keys[i] = (tslot){TAG_NONE, 0, 0, NULL};
    l->leaves = leaves;
    tour_build(l);
  }
  tclass *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->inc = inc;
  c->idx = l->n_classes;
  l->classes[l->n_classes++] = c; /* its key is TAG_NONE already */
  return g->cls = c;
}

/* Frees the lane's classes; the groups that had live slots keep in_heap as it was (the caller
 * says what becomes of them). */
static void lane_classes_clear(cph_sched *s, lane_state *l, int lane) {
  for (uint32_t i = 0; i < l->n_classes; i++) {
    free(l->classes[i]->ring);
    free(l->classes[i]->heap);
    free(l->classes[i]);
    l->keys[i] = (tslot){TAG_NONE, 0, 0, NULL};
  }
  if (l->leaves)
    tour_build(l);
  l->n_classes = l->live_groups = 0;
  l->run_left = 0;
  for (uint32_t t = 0; t < s->n_tenants; t++)
    s->tenants[t]->g[lane].cls = NULL;
}

/* g joins the lane's tenant order with start tag vstart. */
static bool tjoin(const cph_sched *s, lane_state *l, group *g, i128 vstart) {
  tclass *c = class_of(s, l, g);
  if (!c)
    return false;
  tslot x = {vstart, g->tenant, g->hgen + 1, g};
  if (!cset_push(c, &x))
    return false;
  g->vtag = vstart;
  g->hgen++;
  g->in_heap = true;
  c->live++;
  l->live_groups++;
  if (slot_before(&x, &l->keys[c->idx])) { /* the key stays no later than every slot */
    l->keys[c->idx] = x;
    tour_replay(l, c->idx);
  }
  return true;
}

/* The picks of the lane's run so far, applied as the pick rule has them one by one: each moved
 * run_g's tag one step, and the lane's virtual time up to the tag it served (the last is the
 * largest). */
static HOT_INLINE void run_settle(lane_state *l) {
  uint32_t n = l->run_done;
  if (!n)
    return;
  group *g = l->run_g;
  i128 last = g->vtag + (i128)(n - 1) * g->cls->inc;
  if (last > l->vtime)
    l->vtime = last;
  g->vtag = last + g->cls->inc;
  g->started += n;
  l->span_picks += n;
  l->run_done = 0;
}

/* A group that gained its first runnable session joins at max(virtual time, its last
 * finish): an idle tenant banks nothing. */
static bool theap_insert(const cph_sched *s, lane_state *l, group *g) {
  run_settle(l);
  return tjoin(s, l, g, g->vtag > l->vtime ? g->vtag : l->vtime);
}

/* It has no runnable session left: its slot goes stale (and its class's key with it, put
 * right when the class comes out on top); a run it was serving ends. */
static void theap_leave(lane_state *l, group *g) {
  if (g == l->run_g && l->run_left) {
    run_settle(l);
    l->run_left = 0;
  }
  g->in_heap = false;
  g->hgen++;
  g->cls->live--;
  l->live_groups--;
}

/* The lane's next group: the winning class's key, once that key is live; NULL when none. */
static HOT_INLINE group *theap_top(lane_state *l) {
  /* With a live slot somewhere, the winner's key is no later than it: the loop ends on a live
   * key, and never on TAG_NONE. */
  if (!l->live_groups)
    return NULL;
  for (;;) {
    tslot *k = &l->keys[l->wins[0]];
    /* A live key is its class's head: it is no later than every slot of the class. */
    if (slot_live(k))
      return k->g;
    class_refresh(l, l->classes[l->wins[0]]);
  }
}

/* g, the lane's next group, was just served: its slot moves on to its next tag, or (its last
 * session picked) it has left. */
static HOT_INLINE void theap_served(lane_state *l, group *g) {
  tclass *c = g->cls;
  if (__builtin_expect(g->in_heap && !c->hlen, 1)) {
    /* The usual case. With no heap, g's slot is the ring's front: the live key is no later
     * than every slot and the ring runs strictly in order (a slot equal to the back goes to
     * the heap). The slot moves on to the back, when it comes after the back — as a ring's
     * slots do, its tags running in steps of one weight. */
    uint32_t m = c->cap - 1, head = c->head, len = c->len;
    tslot x = {g->vtag, g->tenant, g->hgen, g};
    if (len == 1 || slot_before(&c->ring[(head + len - 1) & m], &x)) {
      c->ring[(head + len) & m] = x; /* over the front itself when the ring is full */
      c->head = head = (head + 1) & m;
      l->keys[c->idx] = c->ring[head]; /* live or not: see below */
      tour_replay(l, c->idx);
      return;
    }
  }
  if (!g->in_heap) {
    class_refresh(l, c);
    return;
  }
  /* g's slot is the class's head (theap_top); most often the ring's front already. */
  tslot *front = cring_front(c);
  if (front && front->g == g && front->gen == g->hgen)
    cring_pop(c);
  else
    cset_pop(c, cset_head(c));
  tslot x = {g->vtag, g->tenant, g->hgen, g};
  if (!cset_push(c, &x)) { /* out of memory: it leaves, and rejoins on its next change */
    theap_leave(l, g);
    class_refresh(l, c);
    return;
  }
  /* The new key is the smaller of the ring's front and the heap's top, live or not (a stale
   * one is dropped when it comes out on top): no look at the groups behind them here. */
  tslot *k = cring_front(c);
  if (c->hlen && (!k || slot_before(&c->heap[0], k)))
    k = &c->heap[0];
  l->keys[c->idx] = *k;
  tour_replay(l, c->idx);
}

/* §3.9 runs: the length of the run starting now (sched.h: sized every tenth of a second from
 * the lane's pace, at most the configured maximum, at least 1). */
static uint32_t run_length(const cph_sched *s, lane_state *l, int64_t now) {
  int64_t span = now - l->span_ns;
  if (span >= CPH_NS_PER_S / 10 || span < 0) {
    /* picks per minute over 1,000 per live group, in integers (the reference model of the
     * tests computes the same) */
    i128 q = span > 0 && l->live_groups
                 ? (i128)l->span_picks * 60 * CPH_NS_PER_S / ((i128)span * 1000 * l->live_groups)
                 : 1;
    if (q > CPH_SCHED_TENANT_RUN_LIMIT)
      q = CPH_SCHED_TENANT_RUN_LIMIT;
    l->run_q = q < 1 ? 1 : (uint32_t)q;
    l->span_ns = now;
    l->span_picks = 0;
  }
  uint32_t max = s->cfg.tenant_run_max > 1 ? s->cfg.tenant_run_max : 1;
  uint32_t q = l->run_q ? l->run_q : 1;
  return q < max ? q : max;
}

/* g's run has ended and it was served last: its slot moves on to its tag (theap_served). That
 * needs its slot at the head of its class, which a q = 1 run always leaves it; a group that
 * joined the class during a longer run may have come before it (joining at the tag just
 * served, with a smaller tenant index), and then g rejoins at its tag instead, its old slot
 * going stale. */
static void run_end(const cph_sched *s, lane_state *l, group *g) {
  if (g->in_heap) {
    const tslot *k = &l->keys[g->cls->idx];
    if (k->g != g || k->gen != g->hgen) {
      theap_leave(l, g);
      tjoin(s, l, g, g->vtag); /* out of memory: out of the order until a session queues */
      return;
    }
  }
  theap_served(l, g);
}

/* Ends every lane's run (a configuration change): afterwards each group in a tenant order has
 * its slot at its vtag again. */
static void runs_end(cph_sched *s) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    run_settle(l);
    if (l->run_left) {
      l->run_left = 0;
      run_end(s, l, l->run_g);
    }
  }
}

/* Walks the live groups of a lane: it = {0}, then next_live(l, &it) until NULL. */
typedef struct live_iter {
  uint32_t c, i;
  bool in_heap_part;
} live_iter;

static group *next_live(lane_state *l, live_iter *it) {
  for (; it->c < l->n_classes; it->c++, it->i = 0, it->in_heap_part = false) {
    tclass *c = l->classes[it->c];
    if (!it->in_heap_part) {
      while (it->i < c->len) {
        tslot *x = &c->ring[(c->head + it->i++) & (c->cap - 1)];
        if (slot_live(x))
          return x->g;
      }
      it->in_heap_part = true;
      it->i = 0;
    }
    while (it->i < c->hlen) {
      tslot *x = &c->heap[it->i++];
      if (slot_live(x))
        return x->g;
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------- sessions in sets */

static bool session_runnable(const session *se) {
  return se->has_work && !se->paused && !se->running;
}

/* Puts a runnable session's entry into its group's sets as of now; its credits are
 * materialised at now so K = c0 - r·t0 is exact from here on. Counts nothing. */
static HOT_INLINE bool push_entry_as(cph_sched *s, group *g, cph_sid sid, int64_t now,
                                     int64_t queued_ns, int64_t credits, uint32_t gen);

static HOT_INLINE bool push_entry(cph_sched *s, group *g, cph_sid sid, int64_t now,
                                  int64_t queued_ns) {
  const session *se = &s->sessions[sid];
  return push_entry_as(s, g, sid, now, queued_ns, credits_at(s, se, now), se->gen);
}

/* push_entry with the session's credits at now and its generation given: what it writes of
 * the session it does not read. */
static HOT_INLINE bool push_entry_as(cph_sched *s, group *g, cph_sid sid, int64_t now,
                                     int64_t queued_ns, int64_t credits, uint32_t gen) {
  session *se = &s->sessions[sid];
  se->c0 = credits;
  se->t0 = now;
  se->queued_ns = queued_ns;
  se->gen = gen; /* before the push: the compaction below tells live entries by it */
  bool ok, at_max = credits >= s->c_max;
  oset *o = at_max ? &g->at_max : &g->below;
  i128 key = at_max ? 0 : (i128)credits - (i128)s->rate * now;
  se->where = at_max ? WHERE_AT_MAX : WHERE_BELOW;
  ok = s->tenants_on ? oset_push_tight(s, o, key, queued_ns, sid, gen)
                     : oset_push(s, o, key, queued_ns, sid, gen);
  oset_compact(s, o, g->runnable + 1);
  if (!ok) {
    se->where = WHERE_NONE;
    se->gen = gen + 1;
  }
  return ok;
}

/* The counters (and, with tenants on, the lane's tenant heap) follow a group's runnable
 * sessions. A group that cannot join the heap for lack of memory is still counted and tries
 * again when one of its sessions next queues; until then it is not picked. */
static HOT_INLINE void count_in(cph_sched *s, lane_state *l, group *g) {
  l->runnable++;
  g->runnable++;
  if (s->tenants_on && !g->in_heap)
    theap_insert(s, l, g);
}

static HOT_INLINE void count_out(cph_sched *s, lane_state *l, group *g) {
  l->runnable--;
  if (--g->runnable == 0 && g->in_heap)
    theap_leave(l, g);
}

static void enqueue(cph_sched *s, cph_sid sid, int64_t now, int64_t queued_ns) {
  /* Out of memory: the session is not queued; it stays has_work and is re-offered on its
   * next state change. Counted as not runnable so counters stay true. */
  group *g = group_of(s, sid);
  if (push_entry(s, g, sid, now, queued_ns))
    count_in(s, &s->lanes[s->sessions[sid].lane], g);
}

/* g is the session's group (group_of). */
static HOT_INLINE void dequeue_from(cph_sched *s, group *g, cph_sid sid) {
  session *se = &s->sessions[sid];
  if (se->where == WHERE_NONE)
    return;
  se->gen++; /* its entry goes stale */
  se->refs++;
  (se->where == WHERE_AT_MAX ? &g->at_max : &g->below)->stale++;
  se->where = WHERE_NONE;
  count_out(s, &s->lanes[se->lane], g);
}

static HOT_INLINE void dequeue(cph_sched *s, cph_sid sid) {
  dequeue_from(s, group_of(s, sid), sid);
}

/* Re-evaluates a session after any change of its flags. */
static HOT_INLINE void update_queue(cph_sched *s, cph_sid sid) {
  session *se = &s->sessions[sid];
  bool queued = se->where != WHERE_NONE;
  if (session_runnable(se) && !queued)
    enqueue(s, sid, cph_clock_now(s->clock), cph_clock_now(s->clock));
  else if (!session_runnable(se) && queued)
    dequeue(s, sid);
}

/* Moves every session whose credits reached max from `below` to `at_max`. */
static void promote(cph_sched *s, lane_state *l, group *g, int64_t now) {
  i128 threshold = (i128)s->c_max - (i128)s->rate * now; /* K >= threshold <=> at max */
  entry *e;
  while ((e = oset_head(s, &g->below)) && e->key >= threshold) {
    int64_t queued_ns = e->queued_ns;
    cph_sid sid = e->sid;
    uint32_t gen = e->gen;
    oset_pop_head(s, &g->below, e);
    s->sessions[sid].where = WHERE_AT_MAX;
    if (!oset_push(s, &g->at_max, 0, queued_ns, sid, gen)) {
      session *se = &s->sessions[sid];
      se->gen++;
      se->where = WHERE_NONE;
      count_out(s, l, g);
    }
  }
}

/* The same on tight rings (tenants on). */
static void promote_tight(cph_sched *s, lane_state *l, group *g, int64_t now) {
  i128 threshold = (i128)s->c_max - (i128)s->rate * now; /* K >= threshold <=> at max */
  entry *e;
  while ((e = oset_head_tight(s, &g->below)) && e->key >= threshold) {
    int64_t queued_ns = e->queued_ns;
    cph_sid sid = e->sid;
    uint32_t gen = e->gen;
    oset_pop_head_tight(s, &g->below, e);
    s->sessions[sid].where = WHERE_AT_MAX;
    if (!oset_push_tight(s, &g->at_max, 0, queued_ns, sid, gen)) {
      session *se = &s->sessions[sid];
      se->gen++;
      se->where = WHERE_NONE;
      count_out(s, l, g);
    }
  }
}

/* The group's next session, with its sets brought up to now; NULL if none. */
static entry *group_head(cph_sched *s, lane_state *l, group *g, int64_t now, oset **from) {
  promote(s, l, g, now);
  entry *e = oset_head(s, &g->at_max);
  *from = &g->at_max;
  if (!e) {
    e = oset_head(s, &g->below);
    *from = &g->below;
  }
  return e;
}

static entry *group_head_tight(cph_sched *s, lane_state *l, group *g, int64_t now,
                               oset **from) {
  promote_tight(s, l, g, now);
  entry *e = oset_head_tight(s, &g->at_max);
  *from = &g->at_max;
  if (!e) {
    e = oset_head_tight(s, &g->below);
    *from = &g->below;
  }
  return e;
}

/* ---- prefetching: the pick's reads are known ahead, so their cache misses are started
 * early. A wrong guess (a stale entry or slot) costs one wasted prefetch, never a wrong
 * pick: nothing here is read for its value except to compute an address. */

/* A set's ring is served front first: the session PREFETCH_SESSIONS entries on, which a
 * plain pick writes (take_head), is loaded while the picks before it run. */
enum { PREFETCH_SESSIONS = 8 };

static HOT_INLINE void ring_prefetch(const cph_sched *s, const ring *r) {
  if (r->len > PREFETCH_SESSIONS)
    __builtin_prefetch(&s->sessions[r->items[(r->head + PREFETCH_SESSIONS) & (r->cap - 1)].sid]);
}

/* The set a group's next pick comes from, as far as can be told without promoting. */
static HOT_INLINE const ring *group_next_ring(const group *g) {
  return g->at_max.ring.len ? &g->at_max.ring : &g->below.ring;
}

/* Tenants on, a lane's picks go round its classes' rings, one slot at a time, and each slot
 * leads to a group, then its set's front entry — loads a pick would otherwise wait for one
 * after another (the session it names is not read: take_head). After serving class c, the
 * group PREFETCH_GROUP_AT slots on is fetched, and the one PREFETCH_SETS_AT slots on (fetched
 * by then) gives the addresses of the rest: its front entry and the back entry its next
 * finish compares with. Every line the pick reads is fetched, not only those it waits on: a
 * load that misses holds up the retirement of all that follows it, even when nothing depends
 * on its value. */
enum { PREFETCH_GROUP_AT = 4, PREFETCH_SETS_AT = 2 };

static HOT_INLINE void class_prefetch(const tclass *c) {
  uint32_t m = c->cap - 1; /* the class's ring of slots: a power of two */
  if (c->len > PREFETCH_GROUP_AT) {
    const group *g = c->ring[(c->head + PREFETCH_GROUP_AT) & m].g;
    __builtin_prefetch(g);
    __builtin_prefetch((const char *)g + 64);
  }
  if (c->len > PREFETCH_SETS_AT) {
    const group *g = c->ring[(c->head + PREFETCH_SETS_AT) & m].g;
    const ring *r = group_next_ring(g);
    if (r->len)
      __builtin_prefetch(&r->items[r->head]);
    const ring *b = &g->below.ring;
    if (b->len) { /* and the entry after it, which the finish writes (a store miss stalls too) */
      __builtin_prefetch(&b->items[tring_at(b, b->len - 1)]);
      __builtin_prefetch(&b->items[tring_at(b, b->len)]);
    }
  }
}

/* With one or two groups in the served class, the slots ahead are the same group's next
 * picks, and class_prefetch has nothing to look at: the group's own set is read ahead. Its
 * picks interleave with the other classes' (unlike a lane without tenants, whose set the
 * hardware streams), so the entry PREFETCH_SET_ENTRY on is fetched. */
enum { PREFETCH_SET_ENTRY = 24 };

static HOT_INLINE void set_prefetch(const ring *r) {
  if (r->len > PREFETCH_SET_ENTRY)
    __builtin_prefetch(&r->items[tring_at(r, PREFETCH_SET_ENTRY)]);
}

/* ---------------------------------------------------------------- config */

int cph_sched_config_check(const cph_sched_config *cfg, const char **why) {
  const char *w = NULL;
  uint64_t seats = 0;
  for (int i = 0; i < CPH_LANE_COUNT && !w; i++) {
    if (cfg->turns_per_minute[i] < 0 || cfg->turns_per_minute[i] > CPH_SCHED_MAX_PER_MINUTE ||
        cfg->tool_calls_per_minute[i] < 0 ||
        cfg->tool_calls_per_minute[i] > CPH_SCHED_MAX_PER_MINUTE || cfg->tokens_per_minute[i] < 0 ||
        cfg->tokens_per_minute[i] > CPH_SCHED_MAX_PER_MINUTE)
      w = "lane budgets must be from 0 to 100000000 per minute";
    else if (!(cfg->cost[i] >= 0 && cfg->cost[i] <= CPH_SCHED_MAX_CREDITS))
      w = "credit costs must be from 0 to 1000000";
    seats += cfg->seats[i];
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
  else if (cfg->charge != CPH_CHARGE_TURN && cfg->charge != CPH_CHARGE_TOKENS)
    w = "charge must be by turn or by tokens";
  else if (cfg->charge == CPH_CHARGE_TOKENS &&
           (cfg->tokens_per_unit < 1 || cfg->tokens_per_unit > CPH_SCHED_MAX_TOKENS_PER_UNIT))
    w = "tokens-per-unit must be from 1 to 1000000000";
  else if (seats > cfg->concurrency)
    w = "the lanes' seats add up to more than concurrency";
  else if (cfg->n_tenants && !cfg->tenants)
    w = "tenant weights missing";
  else if (cfg->tenant_run_max > CPH_SCHED_TENANT_RUN_LIMIT)
    w = "tenant-run-max must be from 0 to 1024";
  for (size_t i = 0; !w && i < cfg->n_tenants; i++) {
    const cph_sched_tenant_weight *t = &cfg->tenants[i];
    if (!t->name || !t->name[0])
      w = "a tenant needs a name";
    else if (!(t->weight >= CPH_SCHED_MIN_WEIGHT && t->weight <= CPH_SCHED_MAX_WEIGHT))
      w = "tenant weights must be from 0.001 to 1000000";
  }
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

static int64_t weight_inc(double weight) { return (int64_t)llround(1e12 / weight); }

static void tenant_init(tenant *t, char *name, uint32_t index) {
  memset(t, 0, sizeof *t);
  t->name = name;
  t->weight = 1;
  t->inc = weight_inc(1);
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    t->g[i].tenant = index;
}

/* The tenant named name (not ""), created with weight 1 if new; NULL on OOM. */
static tenant *tenant_get(cph_sched *s, const char *name) {
  tenant *t = cph_hmap_get(&s->tenant_by_name, name);
  if (t)
    return t;
  if (s->n_tenants == s->cap_tenants) {
    uint32_t cap = 2 * s->cap_tenants;
    tenant **p = realloc(s->tenants, (size_t)cap * sizeof *p);
    if (!p)
      return NULL;
    s->tenants = p;
    s->cap_tenants = cap;
  }
  t = malloc(sizeof *t);
  char *copy = strdup(name);
  if (!t || !copy || cph_hmap_put(&s->tenant_by_name, copy, t) != CPH_OK) {
    free(t);
    free(copy);
    return NULL;
  }
  tenant_init(t, copy, s->n_tenants);
  s->tenants[s->n_tenants++] = t;
  return t;
}

/* Weights from the config: listed tenants get theirs (created if new), every other weighs 1.
 * Start tags already given keep their value; the new step applies from the next pick. A
 * tenant that cannot be created for lack of memory is created, weight 1, when a session
 * names it. */
static bool apply_tenant_config(cph_sched *s, const cph_sched_config *cfg) {
  bool changed = false;
  for (uint32_t i = 1; i < s->n_tenants; i++) {
    changed |= s->tenants[i]->inc != weight_inc(1);
    s->tenants[i]->weight = 1;
    s->tenants[i]->inc = weight_inc(1);
  }
  for (size_t i = 0; i < cfg->n_tenants; i++) {
    tenant *t = tenant_get(s, cfg->tenants[i].name);
    if (t) {
      changed |= t->inc != weight_inc(cfg->tenants[i].weight);
      t->weight = cfg->tenants[i].weight;
      t->inc = weight_inc(t->weight);
    }
  }
  return changed;
}

/* New weights move groups between classes (a class is one step): each lane's order is built
 * again, every live group keeping its start tag. O(groups), on reload only. Out of memory,
 * the old classes stay: the order stays right (a class's ring falls back on its heap) and
 * only the speed suffers. */
static void tenant_reclass(cph_sched *s) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    group **live = malloc((l->live_groups + 1) * sizeof *live);
    if (!live)
      continue;
    uint32_t n = 0;
    live_iter it = {0, 0, false};
    for (group *g; (g = next_live(l, &it));)
      live[n++] = g;
    lane_classes_clear(s, l, i);
    for (uint32_t k = 0; k < n; k++) {
      live[k]->in_heap = false;
      tjoin(s, l, live[k], live[k]->vtag);
    }
    free(live);
  }
}

static void keep_config(cph_sched *s, const cph_sched_config *cfg) {
  s->cfg = *cfg;
  s->cfg.tenants = NULL; /* not ours to keep */
  s->cfg.n_tenants = 0;
  s->seats_total = 0;
  s->tokens_budgeted = false;
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    s->seats_total += cfg->seats[i];
    s->tokens_budgeted |= cfg->tokens_per_minute[i] > 0;
  }
}

cph_sched *cph_sched_new(const cph_sched_config *cfg, const cph_clock *clock) {
  if (cph_sched_config_check(cfg, NULL))
    return NULL;
  cph_sched *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->clock = clock;
  keep_config(s, cfg);
  cph_strslab_init(&s->ids);
  s->tenant_by_name = (cph_hmap)CPH_HMAP_INIT;
  s->tenants = malloc(4 * sizeof *s->tenants);
  if (!s->tenants) {
    free(s);
    return NULL;
  }
  s->cap_tenants = 4;
  tenant_init(&s->dflt, "", 0);
  s->tenants[s->n_tenants++] = &s->dflt;
  apply_credit_config(s, cfg);
  apply_tenant_config(s, cfg);
  int64_t now = cph_clock_now(clock);
  s->trickle_due_ns = now;
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    l->turns = (bucket){0, cfg->turns_per_minute[i], now};
    l->turns.level = bucket_cap(&l->turns); /* buckets start full */
    l->tools = (bucket){0, cfg->tool_calls_per_minute[i], now};
    l->tools.level = bucket_cap(&l->tools);
    l->tokens = (bucket){0, cfg->tokens_per_minute[i], now};
    l->tokens.level = bucket_cap(&l->tokens);
  }
  return s;
}

static void tenant_free_sets(tenant *t) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    oset_free(&t->g[i].at_max);
    oset_free(&t->g[i].below);
  }
}

void cph_sched_free(cph_sched *s) {
  if (!s)
    return;
  for (uint32_t i = 0; i < s->n_sessions; i++)
    cph_strslab_free(&s->ids, s->sessions[i].id);
  cph_strslab_destroy(&s->ids);
  for (int i = 0; i < CPH_LANE_COUNT; i++) { /* before the tenants: it reads them */
    lane_classes_clear(s, &s->lanes[i], i);
    free(s->lanes[i].classes);
    free(s->lanes[i].keys);
    free(s->lanes[i].wins);
  }
  for (uint32_t i = 0; i < s->n_tenants; i++) {
    tenant_free_sets(s->tenants[i]);
    if (i) {
      free(s->tenants[i]->name);
      free(s->tenants[i]);
    }
  }
  free(s->tenants);
  cph_hmap_free(&s->tenant_by_name);
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

/* A share's new budget: refilled to now at the old rate; a growing bucket keeps its level,
 * a shrinking one is cut to its capacity (cph_sched_set_budgets). */
static void bucket_reshare(bucket *b, int64_t per_min, int64_t now) {
  bucket_refill(b, now);
  b->per_min = per_min;
  if (b->level > bucket_cap(b))
    b->level = bucket_cap(b);
}

int cph_sched_set_budgets(cph_sched *s, const int64_t turns[CPH_LANE_COUNT],
                          const int64_t tool_calls[CPH_LANE_COUNT],
                          const int64_t tokens[CPH_LANE_COUNT]) {
  cph_sched_config check = s->cfg; /* the same ranges as a configuration's */
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    check.turns_per_minute[i] = turns[i];
    check.tool_calls_per_minute[i] = tool_calls[i];
    check.tokens_per_minute[i] = tokens[i];
  }
  if (cph_sched_config_check(&check, NULL) != CPH_OK)
    return CPH_EINVAL;
  int64_t now = cph_clock_now(s->clock);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    bucket_reshare(&s->lanes[i].turns, turns[i], now);
    bucket_reshare(&s->lanes[i].tools, tool_calls[i], now);
    bucket_reshare(&s->lanes[i].tokens, tokens[i], now);
    s->cfg.turns_per_minute[i] = turns[i];
    s->cfg.tool_calls_per_minute[i] = tool_calls[i];
    s->cfg.tokens_per_minute[i] = tokens[i];
  }
  s->tokens_budgeted = false;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    s->tokens_budgeted |= tokens[i] > 0;
  return CPH_OK;
}

int cph_sched_set_concurrency(cph_sched *s, uint32_t concurrency,
                              const uint32_t seats[CPH_LANE_COUNT]) {
  uint64_t total = 0;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    total += seats[i];
  if (total > concurrency)
    return CPH_EINVAL;
  s->cfg.concurrency = concurrency;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    s->cfg.seats[i] = seats[i];
  s->seats_total = (uint32_t)total;
  return CPH_OK;
}

int cph_sched_configure(cph_sched *s, const cph_sched_config *cfg) {
  int rc = cph_sched_config_check(cfg, NULL);
  if (rc)
    return rc;
  starts_flush(s);
  runs_end(s);
  int64_t now = cph_clock_now(s->clock);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    bucket_rescale(&s->lanes[i].turns, cfg->turns_per_minute[i], now);
    bucket_rescale(&s->lanes[i].tools, cfg->tool_calls_per_minute[i], now);
    bucket_rescale(&s->lanes[i].tokens, cfg->tokens_per_minute[i], now);
  }
  bool credits_changed = cfg->refill_per_second != s->cfg.refill_per_second ||
                         cfg->credit_max != s->cfg.credit_max ||
                         cfg->credit_min != s->cfg.credit_min;
  if (credits_changed) {
    /* Materialise every session's credits under the old settings, then re-queue under the
     * new ones: K depends on the rate and at_max on the cap. O(n log n), on reload only.
     * Counters and tenant heaps stay as they are: the same sessions stay runnable. */
    for (uint32_t i = 0; i < s->n_sessions; i++) {
      session *se = &s->sessions[i];
      if (se->id && !se->removed) {
        se->c0 = credits_at(s, se, now);
        se->t0 = now;
      }
    }
    apply_credit_config(s, cfg);
    for (uint32_t t = 0; t < s->n_tenants; t++)
      for (int i = 0; i < CPH_LANE_COUNT; i++) {
        oset_clear(s, &s->tenants[t]->g[i].at_max);
        oset_clear(s, &s->tenants[t]->g[i].below);
      }
    for (uint32_t i = 0; i < s->n_sessions; i++) {
      session *se = &s->sessions[i];
      if (!se->id || se->removed)
        continue;
      se->c0 = se->c0 > s->c_max ? s->c_max : se->c0 < s->c_min ? s->c_min : se->c0;
      if (se->where != WHERE_NONE) {
        se->gen++;
        se->where = WHERE_NONE;
        /* keeps its place in the wait order */
        group *g = group_of(s, i);
        if (!push_entry(s, g, i, now, se->queued_ns))
          count_out(s, &s->lanes[se->lane], g);
      }
    }
  } else {
    apply_credit_config(s, cfg); /* costs */
  }
  if (apply_tenant_config(s, cfg) && s->tenants_on)
    tenant_reclass(s);
  keep_config(s, cfg);
  if (cfg->trickle_per_minute && s->trickle_due_ns > now + trickle_interval(s))
    s->trickle_due_ns = now + trickle_interval(s); /* a faster trickle applies at once */
  return CPH_OK;
}

/* ---------------------------------------------------------------- sessions */

static int add_session(cph_sched *s, const char *id, cph_lane lane, int64_t credits, cph_sid *out) {
  if ((unsigned)lane >= CPH_LANE_COUNT || !id)
    return CPH_EINVAL;
  starts_flush(s);
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
  s->dflt.sessions++;
  *out = sid;
  return CPH_OK;
}

/* A scheduler of HUGE_SESSIONS sessions or more keeps them on huge pages, where the system
 * grants them (MADV_HUGEPAGE): with tenants its picks touch sessions all over the array, a
 * page walk each on 4 KiB pages (bench/PROFILE.md). Below that the array is small enough for
 * the TLB's reach, and a huge page would only round a small scheduler's memory up to 2 MiB. */
enum { HUGE_SESSIONS = 1 << 18 };

int cph_sched_reserve(cph_sched *s, size_t n) {
  if (n <= s->cap_sessions)
    return CPH_OK;
  if (n >= CPH_SID_NONE)
    return CPH_ENOMEM;
  session *p;
  if (n < HUGE_SESSIONS) {
    p = realloc(s->sessions, n * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
  } else {
    size_t bytes = (n * sizeof *p + CPH_HUGE_PAGE - 1) & ~(CPH_HUGE_PAGE - 1);
    p = aligned_alloc(CPH_HUGE_PAGE, bytes);
    if (!p)
      return CPH_ENOMEM;
    cph_huge_advise(p, bytes);
    if (s->n_sessions)
      memcpy(p, s->sessions, (size_t)s->n_sessions * sizeof *p);
    free(s->sessions);
  }
  s->sessions = p;
  s->cap_sessions = (uint32_t)n;
  return CPH_OK;
}

int cph_sched_add(cph_sched *s, const char *id, cph_lane lane, cph_sid *out) {
  return add_session(s, id, lane, s->c_max, out);
}

int cph_sched_restore(cph_sched *s, const char *id, cph_lane lane, double credits, cph_sid *out) {
  if (!isfinite(credits))
    return CPH_EINVAL;
  return add_session(s, id, lane, credits_clamped(s, credits), out);
}

int cph_sched_reassign(cph_sched *s, cph_sid sid, cph_lane lane, double credits) {
  if ((unsigned)lane >= CPH_LANE_COUNT || !isfinite(credits))
    return CPH_EINVAL;
  starts_flush(s); /* a pending start's record names the session's group and credits */
  session *se = &s->sessions[sid];
  int64_t now = cph_clock_now(s->clock);
  bool queued = se->where != WHERE_NONE;
  int64_t queued_ns = se->queued_ns; /* while running: when its turn started */
  if (queued)
    dequeue(s, sid);
  if (se->running && se->lane != lane) {
    s->lanes[se->lane].running--;
    s->lanes[lane].running++;
  }
  se->lane = (uint8_t)lane;
  se->c0 = credits_clamped(s, credits);
  se->t0 = now;
  if (queued)
    enqueue(s, sid, now, queued_ns);
  return CPH_OK;
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
  starts_flush(s);
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
  dequeue(s, sid);
  s->tenants[s->sessions[sid].tenant]->sessions--;
  se->gen++;
  se->removed = true;
  s->n_removed++;
  if (se->refs == 0)
    release_slot(s, sid);
  return CPH_OK;
}

void cph_sched_set_work(cph_sched *s, cph_sid sid, bool has_work) {
  starts_flush(s);
  s->sessions[sid].has_work = has_work;
  update_queue(s, sid);
}

void cph_sched_set_paused(cph_sched *s, cph_sid sid, bool paused) {
  starts_flush(s);
  s->sessions[sid].paused = paused;
  update_queue(s, sid);
}

void cph_sched_set_trickle(cph_sched *s, cph_sid sid, bool pending) {
  starts_flush(s);
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

/* ---------------------------------------------------------------- tenants */

/* Tenants come on: every session is the default tenant's, and each lane's default group
 * joins its (new) tenant heap if it has runnable sessions. */
static int enable_tenants(cph_sched *s) {
  s->tenants_on = true;
  for (int i = 0; i < CPH_LANE_COUNT; i++) /* counted per tenant from here on */
    s->dflt.g[i].started = s->lanes[i].started_total;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    if (s->dflt.g[i].runnable && !theap_insert(s, &s->lanes[i], &s->dflt.g[i])) {
      for (int j = 0; j <= i; j++) {
        s->dflt.g[j].in_heap = false;
        lane_classes_clear(s, &s->lanes[j], j);
      }
      s->tenants_on = false;
      return CPH_ENOMEM;
    }
  return CPH_OK;
}

int cph_sched_set_tenant(cph_sched *s, cph_sid sid, const char *name) {
  starts_flush(s);
  uint32_t to = 0;
  if (name && name[0]) {
    tenant *t = tenant_get(s, name);
    if (!t)
      return CPH_ENOMEM;
    to = t->g[0].tenant;
  }
  uint32_t from = s->sessions[sid].tenant;
  if (to == from)
    return CPH_OK;
  if (!s->tenants_on && enable_tenants(s) != CPH_OK)
    return CPH_ENOMEM;
  session *se = &s->sessions[sid];
  bool queued = se->where != WHERE_NONE;
  int64_t queued_ns = se->queued_ns;
  if (queued)
    dequeue(s, sid);
  s->tenants[from]->sessions--;
  s->tenants[to]->sessions++;
  se->tenant = to;
  if (queued)
    enqueue(s, sid, cph_clock_now(s->clock), queued_ns); /* keeps its place in the wait order */
  return CPH_OK;
}

const char *cph_sched_tenant(const cph_sched *s, cph_sid sid) {
  return s->tenants[s->sessions[sid].tenant]->name;
}

uint32_t cph_sched_tenant_count(const cph_sched *s) { return s->n_tenants; }

void cph_sched_tenant_stats(const cph_sched *s, uint32_t index, cph_tenant_stats *out) {
  memset(out, 0, sizeof *out);
  if (index >= s->n_tenants)
    return;
  const tenant *t = s->tenants[index];
  out->name = t->name;
  out->weight = t->weight;
  out->sessions = t->sessions;
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    out->runnable[i] = t->g[i].runnable;
    /* Until tenants are on, every turn is the default tenant's and only the lane counts. */
    const lane_state *l = &s->lanes[i];
    uint64_t in_run = l->run_g == &t->g[i] ? l->run_done : 0; /* picks not yet settled */
    out->started[i] = s->tenants_on ? t->g[i].started + in_run
                      : index       ? 0
                                    : s->lanes[i].started_total;
  }
}

/* ---------------------------------------------------------------- the pick */

static void refill_all(cph_sched *s, int64_t now) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    bucket_refill(&s->lanes[i].turns, now);
    bucket_refill(&s->lanes[i].tools, now);
  }
  if (s->tokens_budgeted) /* an unbudgeted tokens bucket's level is never read */
    for (int i = 0; i < CPH_LANE_COUNT; i++)
      bucket_refill(&s->lanes[i].tokens, now);
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

/* §3.10: whether the lane may take one of the free seats now (buckets refilled). Below its
 * reservation it may; above it, only while more seats are free than the other lanes that
 * have runnable sessions and budget still have reserved and unused — so a lane whose work
 * returns gets its seats back as running turns end, and nothing is preempted. */
static HOT_INLINE bool seat_free(const cph_sched *s, int lane) {
  if (s->running >= s->cfg.concurrency)
    return false;
  if (!s->seats_total)
    return true;
  if (s->lanes[lane].running < s->cfg.seats[lane])
    return true;
  uint64_t owed = 0;
  for (int m = 0; m < CPH_LANE_COUNT; m++) {
    const lane_state *o = &s->lanes[m];
    if (m != lane && o->runnable && o->running < s->cfg.seats[m] && lane_has_budget(o))
      owed += s->cfg.seats[m] - o->running;
  }
  return s->cfg.concurrency - s->running > owed;
}

/* g is the session's group (group_of). */
static HOT_INLINE void start(cph_sched *s, group *g, cph_sid sid, cph_pick *out, int64_t now) {
  session *se = &s->sessions[sid];
  lane_state *l = &s->lanes[se->lane];
  out->waited_ns = se->where != WHERE_NONE ? now - se->queued_ns : 0;
  dequeue_from(s, g, sid);
  se->queued_ns = now; /* while running: when its turn started (for the lane's window) */
  se->running = true;
  s->running++;
  l->running++;
  l->started_total++;
  out->lane = (cph_lane)se->lane;
}

/* A pending start is written to its session: what start() writes. */
static HOT_INLINE void start_apply(cph_sched *s, const struct started *st) {
  session *se = &s->sessions[st->sid];
  se->gen = st->gen;
  se->where = WHERE_NONE;
  se->queued_ns = st->at_ns; /* while running: when its turn started (for the lane's window) */
  se->running = true;
}

static HOT_INLINE void starts_pop(cph_sched *s) {
  start_apply(s, &s->starts[s->starts_head]);
  s->starts_head = (s->starts_head + 1) & (STARTS_MAX - 1);
  s->n_starts--;
}

/* Writes every pending start. Every entry point but the pick and the accessors of what a
 * start does not change calls it first, so a session is never read with its start pending. */
static void starts_flush(cph_sched *s) {
  while (s->n_starts)
    starts_pop(s);
}

/* Writes the pending starts up to sid's, if it has one: what its finish needs. The picks'
 * order is the usual order of finishes, so that is most often the oldest start alone. */
static HOT_INLINE void starts_flush_to(cph_sched *s, cph_sid sid) {
  for (uint32_t i = 0; i < s->n_starts; i++)
    if (s->starts[(s->starts_head + i) & (STARTS_MAX - 1)].sid == sid) {
      for (uint32_t k = 0; k <= i; k++)
        starts_pop(s);
      return;
    }
}

/* The pick takes e, the live head of g's set `from` in lane l, and its session starts: what
 * start() does, but with the facts it reads taken from the entry (a live entry's gen and
 * queued_ns are its session's), so the pick never waits for the session's line. A lane
 * without tenants takes its sessions in id order, which the hardware streams, and writes the
 * start at once. With tenants (defer) a lane's sessions come in no order the hardware can
 * stream (bench/PROFILE.md), and the writes are left pending (starts) until something reads
 * the session — most often the turn's finish, dozens of picks later: the pick starts the
 * line's fetch, and it has long arrived when it is written, without a fetch ahead through
 * the entries that name it. The start also keeps what the entry says of the session's
 * credits, and its group and lane, so that such a finish writes the session without reading
 * it (finish). A session popped but not yet written has no live entry (its only one was
 * this), so nothing the picks read in between depends on it. */
static HOT_INLINE void take_head(cph_sched *s, lane_state *l, group *g, oset *from,
                                 const entry *e, cph_pick *out, int64_t now, bool defer) {
  cph_sid sid = e->sid;
  int64_t queued_ns = e->queued_ns;
  struct started st = {sid, e->gen + 1, now, 0, g, (uint8_t)(l - s->lanes)};
  if (defer) { /* tenants on */
    /* a live entry's key is its session's K; an at_max entry's session has max credits */
    st.key = from == &g->at_max ? (i128)s->c_max - (i128)s->rate * now : e->key;
    oset_pop_head_tight(s, from, e);
  } else {
    oset_pop_head(s, from, e);
  }
  if (defer) {
    if (s->n_starts == STARTS_MAX)
      starts_pop(s);
    s->starts[(s->starts_head + s->n_starts++) & (STARTS_MAX - 1)] = st;
    const session *se = &s->sessions[sid];
    __builtin_prefetch(se, 1);
    __builtin_prefetch((const char *)(se + 1) - 1, 1);
  } else {
    start_apply(s, &st);
  }
  count_out(s, l, g);
  s->running++;
  l->running++;
  l->started_total++;
  out->sid = sid;
  out->lane = (cph_lane)(l - s->lanes);
  out->trickle = false;
  out->waited_ns = now - queued_ns;
}

/* The pick in a lane of the default tenant alone (tenants off): its group's next session. */
static HOT_INLINE bool pick_plain(cph_sched *s, lane_state *l, int lane, int64_t now,
                                  cph_pick *out) {
  group *g = &s->dflt.g[lane];
  oset *from;
  entry *e = group_head(s, l, g, now, &from);
  if (!e)
    return false;
  take_head(s, l, g, from, e, out, now, false);
  ring_prefetch(s, &from->ring);
  return true;
}

/* Prefetching for runs. A run's picks come one after another from its group's set, whose
 * entries were written a whole rotation of the lane's groups ago: lines the hardware does not
 * stream (the sessions they name are the picks' own business: take_head). Below
 * RUN_PREFETCH_SESSIONS sessions those lines are mostly still in the caches, and fetching
 * them ahead (the run's entries, the next run's group and entries) cost more than it saved (at
 * 100k sessions with 1,000 tenants: 54 against 52 ns a pick + finish; at 1M: 65 against 81),
 * so only larger schedulers do. */
enum { RUN_PREFETCH_SESSIONS = 1 << 18 };

/* The lines of the first n entries of r's front (two entries a line), and of the entries
 * after the back of below, where the run's finishes will append: the free slots before
 * below's front, n at most. A tight ring (tenants on) has few, and its appends past them land
 * on the slots the run's picks free, whose lines are r's front when r is below; more than the
 * free slots would make it grow into new memory, so no more of the old is fetched. */
static HOT_INLINE void run_entries_prefetch(const ring *r, const ring *below, uint32_t n) {
  uint32_t k = n < r->len ? n : r->len;
  for (uint32_t i = 0; i < k; i += 2)
    __builtin_prefetch(&r->items[tring_at(r, i)]);
  uint32_t free_slots = below->cap - below->len;
  uint32_t kb = n < free_slots ? n : free_slots;
  for (uint32_t i = 0; i < kb; i += 2)
    __builtin_prefetch(&below->items[tring_at(below, below->len + i)], 1);
}

/* The group likely to serve the lane's run after g's, in class c: g's slot moves to its
 * class's back, so that class's key becomes the slot after g's; the other classes' keys stay.
 * A guess from which only addresses are computed; NULL when there is none. Past 8 classes
 * only g's own is looked at. */
static HOT_INLINE group *run_next_guess(const lane_state *l, const tclass *c) {
  const tslot *best = c->len > 1 ? &c->ring[(c->head + 1) & (c->cap - 1)] : NULL;
  if (l->n_classes <= 8)
    for (uint32_t i = 0; i < l->n_classes; i++)
      if (i != c->idx && l->keys[i].g && (!best || slot_before(&l->keys[i], best)))
        best = &l->keys[i];
  return best ? best->g : NULL;
}

/* The next run's lines, fetched in two stages while this run's picks go on, so that they
 * arrive before they are needed even from memory (a 16-pick run at 1M sessions is over in
 * about a microsecond): at the run's start its group, halfway (the group has arrived by then:
 * its fields give the addresses) the entries its run will take and the lines its finishes
 * will append to. */
static HOT_INLINE void run_next_group_prefetch(const group *g) {
  __builtin_prefetch(g);
  __builtin_prefetch((const char *)g + 64);
}

/* §3.9: the pick in a lane with tenants on: the next session of the group serving the lane's
 * run, or of the group at the top of the tenant order, which starts a run. */
static HOT_INLINE bool pick_tenant(cph_sched *s, lane_state *l, int64_t now, cph_pick *out) {
  group *g = l->run_g;
  if (!l->run_left) {
    if (!(g = theap_top(l)))
      return false;
    l->run_g = g;
    l->run_left = l->run_len = run_length(s, l, now);
    bool fetched = g == l->run_next; /* by the last run, when it guessed right */
    bool big = s->n_sessions >= RUN_PREFETCH_SESSIONS;
    l->run_next = NULL;
    if (l->run_left > 1 && !fetched && big)
      run_entries_prefetch(group_next_ring(g), &g->below.ring, l->run_len);
    if (l->run_left >= 8 && big && (l->run_next = run_next_guess(l, g->cls)))
      run_next_group_prefetch(l->run_next);
  }
  oset *from;
  entry *e = group_head_tight(s, l, g, now, &from);
  if (!e) {
    run_settle(l);
    l->run_left = 0;
    return false;
  }
  /* The lane's virtual time moves up to the tag served — never back: a run's later tags can be
   * past the next group's (with runs of one it only ever moves forward anyway), and a group
   * that left unserved keeps its start tag as its finish, which is only right while virtual
   * time never goes back. The group's next tag is one step on. Both are settled later
   * (run_settle); take_head may take the group out of the order if this was its last session,
   * which ends the run. */
  tclass *c = g->cls;
  l->run_done++;
  take_head(s, l, g, from, e, out, now, true);
  if (l->run_left && --l->run_left) {
    /* The run goes on: its next pick reads this set's front, as a plain pick does; a long
     * run fetches the next run's entries halfway. */
    if (l->run_next && l->run_left == l->run_len / 2) {
      const group *n = l->run_next;
      run_entries_prefetch(group_next_ring(n), &n->below.ring, l->run_len);
    }
    return true;
  }
  run_settle(l);
  run_end(s, l, g);
  if (c->len > PREFETCH_SETS_AT)
    class_prefetch(c);
  else
    set_prefetch(&from->ring);
  return true;
}

int cph_sched_pick(cph_sched *s, cph_pick *out) {
  return cph_sched_pick_lanes(s, CPH_LANES_ALL, out);
}

int cph_sched_pick_lanes(cph_sched *s, unsigned lane_mask, cph_pick *out) {
  if (s->running >= s->cfg.concurrency)
    return CPH_ENOTFOUND;
  int64_t now = cph_clock_now(s->clock);
  refill_all(s, now);

  if (trickle_due(s, now))
    starts_flush(s); /* the candidates' running flags are read */
  cph_sid t = trickle_candidate(s, now);
  if (t != CPH_SID_NONE && (lane_mask & (1u << s->sessions[t].lane))) {
    out->sid = t;
    out->trickle = true;
    group *g = group_of(s, t);
    if (s->tenants_on)
      g->started++;
    start(s, g, t, out, now);
    trickle_started(s, now);
    return CPH_OK;
  }
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    if (!(lane_mask & (1u << i)) || !l->runnable || !lane_has_budget(l) ||
        (s->seats_total && !seat_free(s, i)))
      continue;
    if (!(s->tenants_on ? pick_tenant(s, l, now, out) : pick_plain(s, l, i, now, out)))
      continue;
    bucket_charge(&l->turns, 1);
    return CPH_OK;
  }
  return CPH_ENOTFOUND;
}

static int64_t count_units(uint64_t n) {
  return n > (uint64_t)INT64_MAX / CPH_BUCKET_UNITS_PER_TOKEN
             ? INT64_MAX / CPH_BUCKET_UNITS_PER_TOKEN
             : (int64_t)n;
}

/* What a completed turn costs in credit units (§3.2, §3.8). */
static i128 turn_price(const cph_sched *s, cph_lane lane, uint64_t tokens) {
  if (s->cfg.charge != CPH_CHARGE_TOKENS)
    return s->cost[lane];
  return (i128)s->cost[lane] * (i128)tokens / s->cfg.tokens_per_unit;
}

_Static_assert((CPH_SCHED_WINDOW & (CPH_SCHED_WINDOW - 1)) == 0, "a power of two");

/* A finish's bookkeeping of its lane: the tool calls and tokens against the lane's budgets,
 * the turn in the lane's window of completions (started_ns: when it started), one turn fewer
 * running. */
static HOT_INLINE void finish_lane(cph_sched *s, lane_state *l, int64_t now, int64_t started_ns,
                                   uint64_t tool_calls, uint64_t tokens) {
  bucket_refill(&l->tools, now);
  bucket_charge(&l->tools, count_units(tool_calls));
  if (l->tokens.per_min) {
    bucket_refill(&l->tokens, now);
    bucket_charge(&l->tokens, count_units(tokens));
  }
  uint32_t slot = (uint32_t)(l->n_done++ & (CPH_SCHED_WINDOW - 1));
  l->done_at[slot] = now;
  l->done_len[slot] = now - started_ns;
  s->running--;
  l->running--;
}

/* Credits c after a turn of the lane that used tokens, when it charges (§3.2, §3.8). */
static HOT_INLINE int64_t charged(const cph_sched *s, int lane, int64_t c, uint64_t tokens,
                                  bool charge_credits) {
  if (charge_credits && s->cfg.charge == CPH_CHARGE_TURN) {
    c -= s->cost[lane]; /* both within ±10^18: no overflow */
    if (c < s->c_min)
      c = s->c_min;
  } else if (charge_credits) {
    i128 v = (i128)c - turn_price(s, (cph_lane)lane, tokens);
    c = v < s->c_min ? s->c_min : (int64_t)v;
  }
  return c;
}

/* A finish from the pick: with tenants on, a turn most often ends while its start is still the
 * oldest pending one (take_head; finishes come in the order of their picks). Then its session
 * is exactly as the pick left it — every entry point that could change it (its work, pause,
 * tenant, the configuration) writes the pending starts first — and the start record st holds
 * all the finish needs of it: its credits as K, its group and lane, the start's time and
 * generation. So the finish writes the session's line (its credits, its new entry's facts)
 * without a read of it: the stores need not wait for the line as a load would (bench/
 * PROFILE.md, "a finish from the pick"). What finish() and update_queue() do, in that case. */
static HOT_INLINE void finish_from_pick(cph_sched *s, const struct started *st,
                                        uint64_t tool_calls, uint64_t tokens,
                                        bool charge_credits) {
  int64_t now = cph_clock_now(s->clock);
  lane_state *l = &s->lanes[st->lane];
  finish_lane(s, l, now, st->at_ns, tool_calls, tokens);
  int64_t c = clamp_i128(st->key + (i128)s->rate * now, INT64_MIN, s->c_max);
  session *se = &s->sessions[st->sid];
  /* c0 and t0 are as the session was queued: the start changed neither */
  assert(c == credits_at(s, se, now));
  c = charged(s, st->lane, c, tokens, charge_credits);
  se->running = false;
  /* update_queue's enqueue, with what the pick knew: the session was runnable when picked,
   * and nothing changed its work or pause since (that would have written its start) */
  assert(se->has_work && !se->paused && st->g == group_of(s, st->sid));
  if (push_entry_as(s, st->g, st->sid, now, now, c, st->gen))
    count_in(s, l, st->g);
}

/* Otherwise a finish writes the pending starts up to its own and reads its session. */
static HOT_INLINE void finish(cph_sched *s, cph_sid sid, uint64_t tool_calls, uint64_t tokens,
                              bool charge_credits) {
  if (s->n_starts && s->starts[s->starts_head].sid == sid) {
    struct started st = s->starts[s->starts_head];
    s->starts_head = (s->starts_head + 1) & (STARTS_MAX - 1);
    s->n_starts--;
    finish_from_pick(s, &st, tool_calls, tokens, charge_credits);
    return;
  }
  starts_flush_to(s, sid);
  session *se = &s->sessions[sid];
  if (!se->running)
    return;
  int64_t now = cph_clock_now(s->clock);
  lane_state *l = &s->lanes[se->lane];
  finish_lane(s, l, now, se->queued_ns /* while running: when the turn started */, tool_calls,
              tokens);
  se->c0 = charged(s, se->lane, credits_at(s, se, now), tokens, charge_credits);
  se->t0 = now;
  se->running = false;
  update_queue(s, sid);
}

void cph_sched_finish_cost(cph_sched *s, cph_sid sid, const cph_sched_cost *cost,
                           bool charge_credits) {
  finish(s, sid, cost->tool_calls, cost->tokens, charge_credits);
}

void cph_sched_finish(cph_sched *s, cph_sid sid, uint64_t tool_calls, bool charge_credits) {
  finish(s, sid, tool_calls, 0, charge_credits);
}

/* check_credits: sessions whose credits reached max move to the wait-ordered set. */
void cph_sched_check_credits(cph_sched *s) {
  starts_flush(s);
  int64_t now = cph_clock_now(s->clock);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    lane_state *l = &s->lanes[i];
    if (!s->tenants_on) {
      promote(s, l, &s->dflt.g[i], now);
      continue;
    }
    /* Only groups with runnable sessions hold live entries; promote never changes which. */
    live_iter it = {0, 0, false};
    for (group *g; (g = next_live(l, &it));)
      promote_tight(s, l, g, now);
  }
}

/* top_up_credits: lane buckets refilled to now (credits refill lazily, by formula). */
void cph_sched_top_up(cph_sched *s) { refill_all(s, cph_clock_now(s->clock)); }

/* ---------------------------------------------------------------- introspection */

double cph_sched_credits(const cph_sched *s, cph_sid sid) {
  return (double)credits_at(s, &s->sessions[sid], cph_clock_now(s->clock)) / 1e12;
}

const char *cph_sched_id(const cph_sched *s, cph_sid sid) { return s->sessions[sid].id; }
cph_lane cph_sched_lane(const cph_sched *s, cph_sid sid) { return (cph_lane)s->sessions[sid].lane; }
bool cph_sched_is_running(const cph_sched *s, cph_sid sid) {
  for (uint32_t i = 0; i < s->n_starts; i++) /* a start not yet written */
    if (s->starts[(s->starts_head + i) & (STARTS_MAX - 1)].sid == sid)
      return true;
  return s->sessions[sid].running;
}
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
  const bucket *above_zero[2] = {&l->tools, l->tokens.per_min ? &l->tokens : NULL};
  for (int i = 0; i < 2; i++) {
    const bucket *b = above_zero[i];
    if (!b || b->level > 0)
      continue;
    if (b->per_min == 0)
      return INT64_MAX;
    int64_t need = 1 - b->level;
    int64_t t = now + (need + b->per_min - 1) / b->per_min;
    until = t > until ? t : until;
  }
  return until;
}

/* Counts live entries of o that go before `me`, and the live total. */
static void oset_count(const cph_sched *s, const oset *o, const entry *me, uint64_t *before,
                       uint64_t *total) {
  for (uint32_t i = 0; i < o->ring.len; i++) {
    const entry *e = &o->ring.items[tring_at(&o->ring, i)];
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

/* §3.11: how many picks of group h come before the k-th pick of group g (k >= 1) if nothing
 * changes: h's tags run vtag, vtag + inc, ... while it has sessions, g's k-th is
 * g.vtag + (k-1)·inc_g, and the heap serves (tag, tenant index) in order. */
static uint64_t picks_before(const cph_sched *s, const group *h, const group *g, uint64_t k) {
  i128 mine = g->vtag + (i128)(k - 1) * s->tenants[g->tenant]->inc;
  i128 inc = s->tenants[h->tenant]->inc;
  if (h->vtag > mine)
    return 0;
  i128 n = (mine - h->vtag) / inc; /* tags strictly below mine, but for an exact hit */
  if ((mine - h->vtag) % inc != 0 || h->tenant < g->tenant)
    n++;
  return n < (i128)h->runnable ? (uint64_t)n : h->runnable;
}

/* The forecast's clock: now + position × the mean spacing of the lane's last completions. */
static int64_t estimate_start(const lane_state *l, uint64_t position, int64_t now) {
  uint64_t n = l->n_done < CPH_SCHED_WINDOW ? l->n_done : CPH_SCHED_WINDOW;
  if (!n)
    return -1;
  int64_t oldest = l->done_at[(l->n_done - n) % CPH_SCHED_WINDOW];
  i128 at = (i128)now + (i128)(now - oldest) * position / n;
  return at > INT64_MAX ? INT64_MAX : (int64_t)at;
}

void cph_sched_why(cph_sched *s, cph_sid sid, cph_why *out) {
  memset(out, 0, sizeof *out);
  starts_flush(s);
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    run_settle(&s->lanes[i]); /* the forecast reads the groups' tags */
  session *se = &s->sessions[sid];
  int64_t now = cph_clock_now(s->clock);
  refill_all(s, now);
  lane_state *l = &s->lanes[se->lane];
  group *g = group_of(s, sid);
  out->lane = (cph_lane)se->lane;
  out->credits = (double)credits_at(s, se, now) / 1e12;
  out->lane_runnable = l->runnable;
  out->tenant = s->sessions[sid].tenant;
  out->est_start_ns = -1;
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
  } else if (s->running >= s->cfg.concurrency) {
    out->reason = CPH_WHY_CONCURRENCY_FULL;
  } else if (!seat_free(s, se->lane)) {
    out->reason = CPH_WHY_SEATS_RESERVED;
  } else {
    out->reason = CPH_WHY_RUNNABLE;
  }

  /* Its place among its tenant's runnable sessions in the lane (rule 3 (b)–(d)). */
  if (s->tenants_on)
    promote_tight(s, l, g, now);
  else
    promote(s, l, g, now);
  entry me = {0, se->queued_ns, sid, se->gen};
  if (se->where == WHERE_BELOW)
    me.key = (i128)se->c0 - (i128)s->rate * se->t0;
  uint64_t before = 0, total = 0;
  if (se->where == WHERE_AT_MAX) {
    oset_count(s, &g->at_max, &me, &before, &total);
  } else {
    uint64_t at_max_total = 0, ignored = 0;
    oset_count(s, &g->at_max, NULL, &ignored, &at_max_total);
    before = at_max_total;
    oset_count(s, &g->below, &me, &before, &total);
  }
  out->tenant_position = before + 1;
  out->tenant_runnable = g->runnable;
  out->position = out->tenant_position;
  if (s->tenants_on) {
    live_iter it = {0, 0, false};
    for (group *h; (h = next_live(l, &it));)
      if (h != g)
        out->position += picks_before(s, h, g, out->tenant_position);
  }
  uint64_t higher = 0;
  for (int i = 0; i < se->lane; i++)
    if (lane_has_budget(&s->lanes[i]))
      higher += s->lanes[i].runnable;
  out->turns_ahead = out->position - 1 + higher;
  out->est_start_ns = estimate_start(l, out->position, now);
  if (out->est_start_ns >= 0 && out->reason == CPH_WHY_LANE_NO_BUDGET &&
      out->until_ns > out->est_start_ns)
    out->est_start_ns = out->until_ns;
  if (out->reason == CPH_WHY_RUNNABLE) {
    /* rank and ahead_in_higher_lanes keep their meaning from before tenants: the place by
     * rule 3 (b)–(d) among the whole lane's runnable sessions. */
    out->rank = before + 1;
    if (s->tenants_on) {
      live_iter it = {0, 0, false};
      for (group *h; (h = next_live(l, &it));) {
        if (h == g)
          continue;
        promote_tight(s, l, h, now);
        uint64_t at_max_total = 0, ignored = 0, b = 0, t = 0;
        if (se->where == WHERE_AT_MAX) {
          oset_count(s, &h->at_max, &me, &b, &t);
        } else {
          oset_count(s, &h->at_max, NULL, &ignored, &at_max_total);
          b = at_max_total;
          oset_count(s, &h->below, &me, &b, &t);
        }
        out->rank += b;
      }
    }
    out->ahead_in_higher_lanes = higher;
  }
}

const char *cph_why_reason_name(cph_why_reason r) {
  switch (r) {
  case CPH_WHY_NO_INPUT:
    return "no_input";
  case CPH_WHY_PAUSED:
    return "paused";
  case CPH_WHY_RUNNING:
    return "running";
  case CPH_WHY_LANE_NO_BUDGET:
    return "lane_out_of_budget";
  case CPH_WHY_CONCURRENCY_FULL:
    return "concurrency_full";
  case CPH_WHY_RUNNABLE:
    return "runnable";
  case CPH_WHY_SEATS_RESERVED:
    return "seats_reserved";
  }
  return "unknown";
}

/* §3.10: running turns over each lane's reservation are covered by the shared pool first,
 * in lane priority order; the rest is borrowed from unused reservations, which are counted
 * as lent in lane order. */
static void seat_split(const cph_sched *s, uint32_t lent[CPH_LANE_COUNT],
                       uint32_t borrowed[CPH_LANE_COUNT]) {
  uint64_t pool = s->cfg.concurrency - s->seats_total, owed = 0;
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    uint64_t running = s->lanes[i].running, seats = s->cfg.seats[i];
    uint64_t over = running > seats ? running - seats : 0;
    uint64_t covered = over < pool ? over : pool;
    pool -= covered;
    borrowed[i] = (uint32_t)(over - covered);
    owed += over - covered;
  }
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    uint64_t running = s->lanes[i].running, seats = s->cfg.seats[i];
    uint64_t unused = running < seats ? seats - running : 0;
    uint64_t take = unused < owed ? unused : owed;
    lent[i] = (uint32_t)take;
    owed -= take;
  }
}

void cph_sched_lane_stats(cph_sched *s, cph_lane lane, cph_lane_stats *out) {
  memset(out, 0, sizeof *out);
  int64_t now = cph_clock_now(s->clock);
  lane_state *l = &s->lanes[lane];
  bucket_refill(&l->turns, now);
  bucket_refill(&l->tools, now);
  bucket_refill(&l->tokens, now);
  out->budget_turns = l->turns.per_min;
  out->budget_tool_calls = l->tools.per_min;
  out->budget_tokens = l->tokens.per_min;
  out->turns_left = (double)l->turns.level / CPH_BUCKET_UNITS_PER_TOKEN;
  out->tool_calls_left = (double)l->tools.level / CPH_BUCKET_UNITS_PER_TOKEN;
  out->tokens_left = l->tokens.per_min ? (double)l->tokens.level / CPH_BUCKET_UNITS_PER_TOKEN : 0;
  out->has_budget = lane_has_budget(l);
  out->runnable = l->runnable;
  out->running = l->running;
  out->started_total = l->started_total;
  uint32_t lent[CPH_LANE_COUNT], borrowed[CPH_LANE_COUNT];
  seat_split(s, lent, borrowed);
  out->seats = s->cfg.seats[lane];
  out->seats_lent = lent[lane];
  out->seats_borrowed = borrowed[lane];
  out->tenants_runnable = s->tenants_on ? l->live_groups : s->dflt.g[lane].runnable > 0;
  uint32_t run_max = s->cfg.tenant_run_max > 1 ? s->cfg.tenant_run_max : 1;
  out->tenant_run = !s->tenants_on || !l->run_q ? 1 : l->run_q < run_max ? l->run_q : run_max;
  uint64_t n = l->n_done < CPH_SCHED_WINDOW ? l->n_done : CPH_SCHED_WINDOW;
  out->window = (uint32_t)n;
  if (n) {
    int64_t sum = 0;
    for (uint64_t i = 0; i < n; i++)
      sum += l->done_len[(l->n_done - 1 - i) % CPH_SCHED_WINDOW];
    out->mean_turn_ns = sum / (int64_t)n;
    out->mean_spacing_ns = (now - l->done_at[(l->n_done - n) % CPH_SCHED_WINDOW]) / (int64_t)n;
  }
}

/* Counts o's stale entries into stale[sid] and live ones into live[sid]; returns the stale. */
static uint32_t audit_oset(const cph_sched *s, const oset *o, uint32_t *stale, uint32_t *live) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < o->ring.len + o->heap.len; i++) {
    const entry *e = i < o->ring.len ? &o->ring.items[tring_at(&o->ring, i)]
                                     : &o->heap.items[i - o->ring.len];
    if (entry_live(s, e)) {
      live[e->sid]++;
    } else {
      stale[e->sid]++;
      n++;
    }
  }
  return n;
}

/* A ring's shape: its cap even (entries tile lines) and a power of two while tenants are off
 * (the plain pick and finish wrap by a mask), head inside it, and its entries, live or stale,
 * strictly in order (as oset_push appends them). */
static bool audit_ring(const cph_sched *s, const ring *r) {
  if (r->cap % 2 || r->len > r->cap || (r->cap && r->head >= r->cap) ||
      (!s->tenants_on && (r->cap & (r->cap - 1))))
    return false;
  for (uint32_t i = 1; i < r->len; i++)
    if (entry_cmp(s, &r->items[tring_at(r, i - 1)], &r->items[tring_at(r, i)]) >= 0)
      return false;
  return true;
}

int cph_sched_audit(const cph_sched *s) {
  uint32_t *stale = calloc(s->n_sessions + 1, sizeof *stale);
  uint32_t *live = calloc(s->n_sessions + 1, sizeof *live);
  int rc = stale && live ? CPH_OK : CPH_ENOMEM;
  for (uint32_t t = 0; !rc && t < s->n_tenants; t++)
    for (int i = 0; i < CPH_LANE_COUNT; i++) {
      const group *g = &s->tenants[t]->g[i];
      if (audit_oset(s, &g->at_max, stale, live) != g->at_max.stale ||
          audit_oset(s, &g->below, stale, live) != g->below.stale ||
          !audit_ring(s, &g->at_max.ring) || !audit_ring(s, &g->below.ring))
        rc = CPH_ESTATE;
    }
  for (uint32_t i = 0; !rc && i < s->n_sessions; i++)
    if (stale[i] != s->sessions[i].refs || live[i] > 1)
      rc = CPH_ESTATE;
  for (uint32_t i = 0; !rc && i < s->n_starts; i++) {
    const struct started *st = &s->starts[(s->starts_head + i) & (STARTS_MAX - 1)];
    const session *se = &s->sessions[st->sid];
    if (live[st->sid] || se->running || st->gen != se->gen + 1 || st->lane != se->lane ||
        st->g != group_of(s, st->sid) ||
        clamp_i128(st->key + (i128)s->rate * st->at_ns, INT64_MIN, s->c_max) !=
            credits_at(s, se, st->at_ns)) /* what a finish from the pick takes (finish) */
      rc = CPH_ESTATE;
  }
  free(stale);
  free(live);
  return rc;
}
