/* lanes/sim — a deterministic simulator of the scheduler (DESIGN §3, §12).
 *
 * It runs the real scheduler (cph_sched + cph_sched_pass) on a virtual clock and steps time
 * event by event: the next message arrival, the next turn completion, the next scheduler tick
 * or the scheduled reload, whichever comes first. Events at one instant are applied together,
 * then passes run — again at once while a pass staged input, as the engine does — with
 * workers_waiting = free concurrency (workers are never the bottleneck).
 *
 * Each session has an arrival process (none, Poisson with a rate, or saturated: always has
 * work), a turn duration (fixed or exponential with a mean) and a number of tool calls per
 * turn. A message that arrives is pending until the next pass's poll_inbox stages it; a turn
 * takes up to max_batch staged messages. An `outbox` session is the janitor: it always holds a
 * due outbox batch (cph_sched_set_trickle), so trickle picks run batches; its normal picks run
 * its own work, or an outbox batch when it has none.
 *
 * Rules 8–10 come with the scheduler config (token budgets, :charge :tokens, seats, tenant
 * weights); the config says each entry's tenant and the tokens its turns report.
 *
 * Same config and seed, same result, bit for bit: randomness comes from per-session
 * splitmix64/xorshift streams (arrivals and durations apart), so changing one session's
 * traffic does not change any other session's arrivals or durations. */
#ifndef CEPHALON_LANES_SIM_H
#define CEPHALON_LANES_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sched.h"

#define CPH_SIM_GROUPS 8

typedef enum cph_sim_arrival {
  CPH_SIM_NONE,      /* never has work of its own (an outbox-only janitor) */
  CPH_SIM_POISSON,   /* messages arrive at arrivals_per_s */
  CPH_SIM_SATURATED  /* always has work */
} cph_sim_arrival;

typedef struct cph_sim_session {
  cph_lane lane;
  cph_sim_arrival arrival;
  double arrivals_per_s; /* POISSON */
  double turn_s;         /* turn duration, or its mean when turn_exponential */
  bool turn_exponential;
  uint32_t tool_calls;   /* reported at each completion */
  uint32_t group;        /* < CPH_SIM_GROUPS; results are kept per group too */
  uint32_t count;        /* this many identical sessions; 0 means 1 */
  bool outbox;           /* the janitor: always has a due outbox batch */
} cph_sim_session;

typedef struct cph_sim_pick {
  int64_t at_ns;    /* since the start of the run */
  uint32_t session; /* index among the expanded sessions, in config order */
  cph_lane lane;
  bool trickle;
  bool outbox;      /* the turn ran an outbox batch (trickle or normal pick) */
  int64_t waited_ns;
  int64_t end_ns;   /* when the turn completes (its charges are made then) */
  uint32_t tool_calls; /* what its completion reports */
  uint64_t tokens;
} cph_sim_pick;

/* Called after every pass, for tests that check invariants along the run. sids[i] is the
 * scheduler's handle of session i. */
typedef void (*cph_sim_observe_fn)(void *ctx, cph_sched *s, int64_t now_ns, const cph_sid *sids,
                                   size_t n);

typedef struct cph_sim_config {
  cph_sched_config sched;
  const cph_sim_session *sessions;
  size_t n_sessions;       /* entries in sessions (each may stand for `count` sessions) */
  double duration_s;
  double warmup_s;         /* statistics ignore picks and completions before this */
  uint32_t tick_ms;        /* the scheduler timer; 0 means 5 (the policy default) */
  uint32_t max_batch;      /* messages one turn takes; 0 means 64 */
  double outbox_batch_s;   /* how long an outbox batch runs; 0 means 0.05 */
  uint64_t seed;
  bool reload;             /* apply reload_cfg at reload_at_s */
  double reload_at_s;
  cph_sched_config reload_cfg;
  bool record_picks;       /* keep every pick in the result */
  /* Per entry of sessions, or NULL for none: the tenant its sessions name (NULL or "" =
   * none, §3.9) and the tokens each of their turns reports at completion (§3.8). */
  const char *const *tenants;
  const uint64_t *tokens;
  cph_sim_observe_fn observe;
  void *observe_ctx;
} cph_sim_config;

typedef struct cph_sim_stats {
  uint64_t turns;       /* turns started (trickle picks included) */
  uint64_t tool_calls;  /* charged at completions */
  uint64_t tokens;      /* charged at completions */
  double share;         /* of all turns started */
  int64_t wait_p50_ns;  /* pick wait: runnable -> picked (cph_pick.waited_ns) */
  int64_t wait_p90_ns;
  int64_t wait_p99_ns;
  int64_t wait_max_ns;
} cph_sim_stats;

typedef struct cph_sim_result {
  double measured_s;    /* duration_s - warmup_s */
  cph_sim_stats lanes[CPH_LANE_COUNT];
  cph_sim_stats groups[CPH_SIM_GROUPS];
  uint32_t group_sessions[CPH_SIM_GROUPS];
  double jain[CPH_SIM_GROUPS]; /* Jain's index over per-session turns; 0 for an empty group */
  uint64_t outbox_batches;     /* trickle picks plus outbox batches run by normal picks */
  uint64_t trickle_picks;
  double outbox_per_minute;    /* mean over whole measured minutes */
  uint64_t outbox_min_per_minute; /* fewest in any whole measured minute */
  uint32_t max_running;        /* most turns running at once */
  uint32_t tenant_run[CPH_LANE_COUNT]; /* the lanes' tenant run lengths at the end (§3.9) */
  uint64_t passes;
  uint64_t double_starts;      /* picks of a session that was running: must be 0 */
  uint64_t over_concurrency;   /* picks made with concurrency already full: must be 0 */
  size_t n_sessions;           /* expanded */
  uint64_t *session_turns;     /* per expanded session, measured */
  cph_sim_pick *picks;         /* record_picks: every pick from t = 0, in order */
  size_t n_picks;
} cph_sim_result;

/* Runs one simulation. CPH_OK, CPH_EINVAL for a bad config (invalid scheduler config, a
 * group out of range, no sessions, a negative rate or duration), CPH_ENOMEM. Free the result
 * with cph_sim_result_free, also after an error. */
int cph_sim_run(const cph_sim_config *cfg, cph_sim_result *out);
void cph_sim_result_free(cph_sim_result *r);

/* A human-readable report: per lane, per non-empty group, trickle, concurrency. */
void cph_sim_print(const cph_sim_result *r, FILE *f);

#endif
