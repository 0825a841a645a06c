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

/* A tenant's weight (§3.9); tenants not listed weigh 1, as do sessions without a tenant. */
typedef struct cph_sched_tenant_weight {
  const char *name; /* non-empty */
  double weight;    /* CPH_SCHED_MIN_WEIGHT .. CPH_SCHED_MAX_WEIGHT */
} cph_sched_tenant_weight;

#define CPH_SCHED_MIN_WEIGHT 0.001
#define CPH_SCHED_MAX_WEIGHT 1e6
#define CPH_SCHED_MAX_TOKENS_PER_UNIT INT64_C(1000000000)

typedef enum cph_sched_charge {
  CPH_CHARGE_TURN = 0, /* a completed turn costs cost[lane] (§3.2) */
  CPH_CHARGE_TOKENS    /* it costs cost[lane] × tokens / tokens_per_unit (§3.8) */
} cph_sched_charge;

/* The fields after trickle_per_minute are the choices of §3 rules 8–10; all zero means none of
 * them (the behaviour of rules 1–7 alone). */
typedef struct cph_sched_config {
  int64_t turns_per_minute[CPH_LANE_COUNT];
  int64_t tool_calls_per_minute[CPH_LANE_COUNT];
  double refill_per_second;
  double credit_max;
  double credit_min; /* <= credit_max; usually -credit_max */
  double cost[CPH_LANE_COUNT];
  uint32_t concurrency;           /* >= 1 */
  uint32_t trickle_per_minute;    /* guaranteed outbox batches a minute; 0 = none */
  /* §3.8: a third bucket per lane, tokens per minute charged at completion; 0 = no token
   * budget (the lane's budget is turns and tool calls only). */
  int64_t tokens_per_minute[CPH_LANE_COUNT];
  cph_sched_charge charge;
  int64_t tokens_per_unit;        /* CPH_CHARGE_TOKENS: >= 1 */
  /* §3.10: seats reserved per lane out of concurrency; their sum <= concurrency. */
  uint32_t seats[CPH_LANE_COUNT];
  /* §3.9: weights by tenant name. Read by cph_sched_new/configure and not kept: the
   * scheduler copies what it needs (the array may be freed after the call). */
  const cph_sched_tenant_weight *tenants;
  size_t n_tenants;
  /* §3.9: the longest run of consecutive picks one tenant's group may take in its lane
   * (see "Runs" below); 0 or 1 = none: every pick follows the tenant order exactly. */
  uint32_t tenant_run_max;
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

/* Cluster mode (DESIGN §14 "Budgets"): sets the lanes' per-minute budgets to this node's
 * share of the cluster's. Unlike cph_sched_configure, a bucket whose budget grows keeps its
 * level (it fills at the new rate) and one whose budget shrinks is cut to its new capacity:
 * rebalancing never adds tokens. So while the nodes' shares sum to the budget, the §3 rule 1
 * bound holds for the cluster as a whole. Values as in cph_sched_config (0..max). */
int cph_sched_set_budgets(cph_sched *s, const int64_t turns[CPH_LANE_COUNT],
                          const int64_t tool_calls[CPH_LANE_COUNT],
                          const int64_t tokens[CPH_LANE_COUNT]);

/* Cluster mode (DESIGN §14, :cluster :concurrency): sets how many turns may run at once on
 * this node — its share of the cluster's — and the lanes' seats out of it. 0 is allowed here
 * (start nothing), unlike in a configuration. Running turns above a smaller limit go on to
 * their end; nothing is preempted. CPH_EINVAL when the seats add up to more than the limit. A
 * later cph_sched_configure sets the configuration's values again. */
int cph_sched_set_concurrency(cph_sched *s, uint32_t concurrency,
                              const uint32_t seats[CPH_LANE_COUNT]);

/* ---- sessions ---- */

/* Adds a session with credits = max (a new session, §3.2). id is copied; ids are unique.
 * The copy, cph_sched_id(sid), keeps its address until cph_sched_remove(sid) or
 * cph_sched_free: a caller may borrow it as its own key for the session instead of keeping a
 * second copy (the engine does). */
int cph_sched_add(cph_sched *s, const char *id, cph_lane lane, cph_sid *out);
/* Adds a session with given credits (restart recovery); clamped into [min, max]. */
int cph_sched_restore(cph_sched *s, const char *id, cph_lane lane, double credits,
                      cph_sid *out);
/* Sets a registered session's lane and credits (clamped into [min, max]) in place: its sid,
 * id, tenant, work, pause and running turn stay as they are. A queued session keeps its place
 * in the wait order; a running one's turn counts in the new lane from here (its seat, its
 * finish's charges). For a class change, and for credits a session's state brought from
 * another node while a turn of it may be running here. CPH_EINVAL for a bad lane or credits
 * that are not finite (nothing changed). */
int cph_sched_reassign(cph_sched *s, cph_sid sid, cph_lane lane, double credits);
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

/* What a completed turn reports it used (the complete request's cost). */
typedef struct cph_sched_cost {
  uint64_t tool_calls;
  uint64_t tokens;
} cph_sched_cost;

/* The turn of a running session ended. Tool calls are charged to the lane's tool-calls
 * bucket and tokens to its tokens bucket (when it has one: §3.8); when charge_credits, the
 * turn's price comes off the session's credits (floored at min): cost[lane] under
 * CPH_CHARGE_TURN, floor(cost[lane] × tokens / tokens_per_unit) under CPH_CHARGE_TOKENS (in
 * credit units). The session queues again at now if it still has work. */
void cph_sched_finish_cost(cph_sched *s, cph_sid sid, const cph_sched_cost *cost,
                           bool charge_credits);
/* cph_sched_finish_cost with tool_calls and no tokens. */
void cph_sched_finish(cph_sched *s, cph_sid sid, uint64_t tool_calls, bool charge_credits);

/* ---- tenants (§3.9) ----
 *
 * Inside a lane, turns go to the tenants that have runnable sessions in proportion to their
 * weights — start-time fair queueing: each (tenant, lane) that has runnable sessions holds a
 * start tag; the pick serves the smallest (tag, tenant index — ties go to the tenant the
 * scheduler knew first: the config's in order, then as sessions name them), moves that tag
 * on by CPH_TENANT_VSCALE / weight and moves the lane's virtual time up to the tag it
 * served; a tenant that becomes runnable starts at max(virtual time, its last finish tag), so
 * an idle tenant banks nothing. Inside the tenant, rule 3 (b)–(d) as before.
 * O(log tenants + log sessions) per pick. Until a session names a tenant, every lane has only
 * the default tenant and the pick is exactly the pick of rules 1–7 (no tenant heap is kept). */
#define CPH_TENANT_VSCALE INT64_C(1000000000000)

/* Runs. Keeping the tenant order costs a pick about 200 instructions (bench/PROFILE.md) — at
 * a lane's peak that is a third of the pick. So at machine rates the group at the top of the
 * order serves a run of up to q consecutive picks before the order is consulted again; each
 * pick of the run still moves the group's tag on by one step, so long-run shares are exactly
 * the weights and a run only lets a tenant be up to q - 1 picks ahead of (or behind) its fair
 * place. q is sized from the lane's own pace: at each run's start, once a tenth of a second
 * has passed since it was last sized, q = picks in that span per minute / (1,000 × groups
 * with runnable sessions), within [1, tenant_run_max] — a run is at most a thousandth of the
 * picks an average tenant of the lane gets in a minute. Below 1,000 picks per tenant per
 * minute q is 1 and the order is exact; a configuration change ends every run. The forecast
 * of cph_sched_why follows the order as if q were 1. */
#define CPH_SCHED_TENANT_RUN_DEFAULT 16
#define CPH_SCHED_TENANT_RUN_LIMIT 1024

/* Sets the session's tenant; NULL or "" is the default tenant (weight 1). The name is copied
 * (once per distinct tenant). A queued session moves to its new tenant keeping its place in
 * the wait order. CPH_OK or CPH_ENOMEM (nothing changed). */
int cph_sched_set_tenant(cph_sched *s, cph_sid sid, const char *tenant);
/* "" for the default tenant. Valid until the scheduler is freed. */
const char *cph_sched_tenant(const cph_sched *s, cph_sid sid);

typedef struct cph_tenant_stats {
  const char *name;  /* "" = the default tenant; valid until the scheduler is freed */
  double weight;
  uint64_t sessions; /* registered sessions naming it */
  uint64_t runnable[CPH_LANE_COUNT];
  uint64_t started[CPH_LANE_COUNT]; /* turns started since the scheduler was created */
} cph_tenant_stats;

/* Tenants the scheduler knows: index 0 is the default tenant, then every tenant a session
 * named or the config listed, in order of first appearance. */
uint32_t cph_sched_tenant_count(const cph_sched *s);
void cph_sched_tenant_stats(const cph_sched *s, uint32_t index, cph_tenant_stats *out);

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
  CPH_WHY_RUNNABLE,         /* waiting its turn: rank and what put it there */
  CPH_WHY_SEATS_RESERVED    /* seats are free, but held for other lanes' reservations (§3.10) */
} cph_why_reason;

/* How many recent completions per lane the forecast (§3.11) looks at. */
#define CPH_SCHED_WINDOW 32

typedef struct cph_why {
  cph_why_reason reason;
  cph_lane lane;
  double credits;
  int64_t waiting_ns;    /* since queued, when runnable */
  int64_t until_ns;      /* LANE_NO_BUDGET: clock time when the lane has budget again */
  uint64_t rank;         /* RUNNABLE: 1 = next in its lane */
  uint64_t lane_runnable;  /* runnable sessions in its lane */
  uint64_t ahead_in_higher_lanes; /* runnable sessions in higher lanes that have budget */
  /* §3.11, for every queued session (not only RUNNABLE), 0 otherwise. The positions are the
   * order the picks would take if nothing else changed (no arrivals, no returns): */
  uint64_t position;           /* in its lane: 1 = the lane's next pick */
  uint64_t tenant_position;    /* among its tenant's runnable sessions in the lane */
  uint64_t tenant_runnable;
  uint64_t turns_ahead;        /* position - 1 + ahead_in_higher_lanes */
  /* Estimated start: now + position × the mean spacing of the lane's last completions
   * (at most CPH_SCHED_WINDOW, measured up to now so an idle lane's estimate grows), no
   * earlier than until_ns; -1 when the lane has completed nothing yet. */
  int64_t est_start_ns;
  uint32_t tenant;             /* its tenant's index (cph_sched_tenant_stats) */
} cph_why;

/* Says why a session is or is not running. O(runnable sessions in its lane + tenants): a
 * diagnostic, never on the hot path. */
void cph_sched_why(cph_sched *s, cph_sid sid, cph_why *out);
const char *cph_why_reason_name(cph_why_reason r);

typedef struct cph_lane_stats {
  /* The budgets per minute the lane runs on (the configuration's, or in a cluster this
   * node's share: cph_sched_set_budgets). */
  int64_t budget_turns, budget_tool_calls, budget_tokens;
  double turns_left;      /* tokens in the turns bucket now */
  double tool_calls_left; /* may be negative */
  bool has_budget;
  uint64_t runnable;
  uint64_t running;
  uint64_t started_total;
  double tokens_left;     /* §3.8: may be negative; 0 without a token budget */
  /* §3.10: running turns over the lane's reservation split into what the shared pool
   * (concurrency - all reservations) covers, attributed to lanes in priority order, and what
   * is borrowed from other lanes' unused reservations (borrowed); lent is how many of this
   * lane's reserved seats others hold now, attributed in lane order. */
  uint32_t seats;         /* reserved */
  uint32_t seats_lent;
  uint32_t seats_borrowed;
  uint64_t tenants_runnable; /* tenants with runnable sessions in the lane */
  /* §3.9: the length of the runs the lane hands out now (see "Runs"; 1 = the exact order) */
  uint32_t tenant_run;
  /* §3.11: over the lane's last completions (see cph_why): how many, the mean spacing
   * between them (ns, to now) and the mean turn length (ns); 0 when none. */
  uint32_t window;
  int64_t mean_spacing_ns;
  int64_t mean_turn_ns;
} cph_lane_stats;

void cph_sched_lane_stats(cph_sched *s, cph_lane lane, cph_lane_stats *out);

/* For tests: CPH_OK when the counts the pick trusts instead of reading sessions agree with
 * what they count — each set's stale entries, each session's refs (the stale entries that
 * name it), and every pick not yet written to its session (sched.c, take_head) naming a
 * session with no live entry — CPH_ESTATE when one does not, CPH_ENOMEM. O(sessions +
 * entries): never on a hot path. */
int cph_sched_audit(const cph_sched *s);
uint32_t cph_sched_running(const cph_sched *s);
uint32_t cph_sched_concurrency(const cph_sched *s);

#endif
