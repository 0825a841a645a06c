/* lanes/ — the scheduler of DESIGN §3: lane budgets, session credits, the pick, concurrency
 * and the outbox trickle. Pure scheduling over a clock: no storage, no HTTP, no JSON.
 *
 * Arithmetic is exact integers so every ordering is reproducible (the property test compares
 * pick sequences with a reference scan, bit for bit):
 *   - time is int64 nanoseconds from a cph_clock;
 *   - bucket levels are in units of 1/(60·10^9) token, so a budget of B per minute refills
 *     exactly B units per nanosecond;
 *   - credits are in units of 10^-12 credit ("pico-credits"); the refill rate is quantised to
 *     1/1000 credit per second, i.e. round(refill_per_second * 1000) units per nanosecond.
 *
 * Pick order (§3.3): the highest-priority lane that has budget and a runnable session; in it
 * the highest credits, then the oldest queued_since, then the smallest id. O(log n) per pick
 * and O(1) when sessions queue in order, which saturated traffic does (see sched.c). */
#ifndef CEPHALON_LANES_SCHED_H
#define CEPHALON_LANES_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "cephalon/lane.h"
#include "common/clock.h"

#define CPH_BUCKET_UNITS_PER_TOKEN INT64_C(60000000000) /* 60 s in ns */
#define CPH_CREDIT_UNITS INT64_C(1000000000000)         /* per credit */

/* Policy limits that keep the fixed-point arithmetic inside int64 (checked by configure). */
#define CPH_SCHED_MAX_PER_MINUTE INT64_C(100000000)
#define CPH_SCHED_MAX_CREDITS 1e6
#define CPH_SCHED_MAX_REFILL 1e6

typedef struct cph_sched_config {
  int64_t turns_per_minute[CPH_LANE_COUNT];
  int64_t tool_calls_per_minute[CPH_LANE_COUNT];
  double refill_per_second;
  double credit_max;
  double credit_min; /* <= credit_max; usually -credit_max */
  double cost[CPH_LANE_COUNT];
  uint32_t concurrency;           /* >= 1 */
  uint32_t trickle_per_minute;    /* guaranteed outbox batches a minute; 0 = none */
} cph_sched_config;

typedef uint32_t cph_sid; /* a session's handle inside the scheduler */
#define CPH_SID_NONE UINT32_MAX

typedef struct cph_sched cph_sched;

/* The clock must outlive the scheduler. Returns NULL on OOM or an invalid config (see
 * cph_sched_config_check). */
cph_sched *cph_sched_new(const cph_sched_config *cfg, const cph_clock *clock);
void cph_sched_free(cph_sched *s);

/* CPH_OK, or CPH_EINVAL with a reason in *why (static string) when a value is out of the
 * ranges above. */
int cph_sched_config_check(const cph_sched_config *cfg, const char **why);

/* Live policy change. Buckets keep their fill ratio; credits are carried over as they stand
 * now, clamped into the new [min, max]; concurrency and trickle take effect at once. */
int cph_sched_configure(cph_sched *s, const cph_sched_config *cfg);

/* ---- sessions ---- */

/* Adds a session with credits = max (a new session, §3.2). id is copied; ids are unique.
 * The copy, cph_sched_id(sid), keeps its address until cph_sched_remove(sid) or
 * cph_sched_free: a caller may borrow it as its own key for the session instead of keeping a
 * second copy (the engine does). */
int cph_sched_add(cph_sched *s, const char *id, cph_lane lane, cph_sid *out);
/* Adds a session with given credits (restart recovery); clamped into [min, max]. */
int cph_sched_restore(cph_sched *s, const char *id, cph_lane lane, double credits,
                      cph_sid *out);
/* Room for n sessions in all without growing (a restart knows how many it loads). */
int cph_sched_reserve(cph_sched *s, size_t n);
/* Removes a session that is not running (CPH_ESTATE if it is). The sid may be reused, and the
 * id string cph_sched_id(sid) returned may be freed at once: a caller that borrows it must stop
 * using it first (to re-register a session, add the new sid from the old id, then remove). */
int cph_sched_remove(cph_sched *s, cph_sid sid);

/* The engine says whether the session has work (staged input, a due tick or a queued job).
 * A session with work, not paused and not running is runnable and queues at now. */
void cph_sched_set_work(cph_sched *s, cph_sid sid, bool has_work);
void cph_sched_set_paused(cph_sched *s, cph_sid sid, bool paused);
/* The session holds a due outbox_drain job (§3.5). */
void cph_sched_set_trickle(cph_sched *s, cph_sid sid, bool pending);
/* An outbox batch started by the normal pick counts toward the trickle. */
void cph_sched_trickle_ran(cph_sched *s);

/* ---- the pick ---- */

typedef struct cph_pick {
  cph_sid sid;
  cph_lane lane;
  bool trickle; /* picked by the trickle guarantee: run its outbox_drain job */
  int64_t waited_ns; /* now - queued_since */
} cph_pick;

/* Starts the next turn: CPH_OK and *out, or CPH_ENOTFOUND when nothing may start (nothing
 * runnable, no lane with budget, or concurrency full). Takes one turn token from the lane
 * (not for trickle picks, which bypass the budget) and marks the session running. */
int cph_sched_pick(cph_sched *s, cph_pick *out);

#define CPH_LANES_ALL ((1u << CPH_LANE_COUNT) - 1)
/* The pick restricted to the lanes in lane_mask (bit 1 << lane): the same rules among those
 * lanes — a worker that only runs some lanes gets the session the scheduler would choose among
 * them. The trickle applies only when the trickle session's lane is in the mask. */
int cph_sched_pick_lanes(cph_sched *s, unsigned lane_mask, cph_pick *out);

/* The turn of a running session ended. tool_calls are charged to the lane's tool-calls
 * bucket; when charge_credits, cost[lane] comes off the session's credits (floored at min).
 * The session queues again at now if it still has work. */
void cph_sched_finish(cph_sched *s, cph_sid sid, uint64_t tool_calls, bool charge_credits);

/* ---- introspection ---- */

double cph_sched_credits(const cph_sched *s, cph_sid sid);
const char *cph_sched_id(const cph_sched *s, cph_sid sid);
cph_lane cph_sched_lane(const cph_sched *s, cph_sid sid);
bool cph_sched_is_running(const cph_sched *s, cph_sid sid);

typedef enum cph_why_reason {
  CPH_WHY_NO_INPUT,
  CPH_WHY_PAUSED,
  CPH_WHY_RUNNING,
  CPH_WHY_LANE_NO_BUDGET,   /* until_ns says when the lane will have budget again */
  CPH_WHY_CONCURRENCY_FULL,
  CPH_WHY_RUNNABLE          /* waiting its turn: rank and what put it there */
} cph_why_reason;

typedef struct cph_why {
  cph_why_reason reason;
  cph_lane lane;
  double credits;
  int64_t waiting_ns;    /* since queued, when runnable */
  int64_t until_ns;      /* LANE_NO_BUDGET: clock time when the lane has budget again */
  uint64_t rank;         /* RUNNABLE: 1 = next in its lane */
  uint64_t lane_runnable;  /* runnable sessions in its lane */
  uint64_t ahead_in_higher_lanes; /* runnable sessions in higher lanes that have budget */
} cph_why;

/* Says why a session is or is not running. O(runnable sessions in its lane): a diagnostic,
 * never on the hot path. */
void cph_sched_why(cph_sched *s, cph_sid sid, cph_why *out);
const char *cph_why_reason_name(cph_why_reason r);

typedef struct cph_lane_stats {
  double turns_left;      /* tokens in the turns bucket now */
  double tool_calls_left; /* may be negative */
  bool has_budget;
  uint64_t runnable;
  uint64_t running;
  uint64_t started_total;
} cph_lane_stats;

void cph_sched_lane_stats(cph_sched *s, cph_lane lane, cph_lane_stats *out);
uint32_t cph_sched_running(const cph_sched *s);
uint32_t cph_sched_concurrency(const cph_sched *s);

#endif
