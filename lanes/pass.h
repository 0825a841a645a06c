/* The scheduler pass (DESIGN §3.6): the due jobs in this fixed priority order, one after
 * another —
 *   0 agent_turn      hand runnable sessions to waiting workers (picks)
 *   1 poll_inbox      stage pending messages (the engine's hook)
 *   2 check_credits   bring credit order up to now (sessions that reached max)
 *   3 top_up_credits  refill lane buckets to now
 *   4 reconcile       expire leases, fix counters (the engine's hook)
 * Because agent_turn runs before poll_inbox, a message pending when a pass starts is seen by
 * a turn only in the next pass. The engine runs exactly this pass and nothing else decides
 * who runs. */
#ifndef CEPHALON_LANES_PASS_H
#define CEPHALON_LANES_PASS_H

#include <stdbool.h>
#include <stdint.h>

#include "sched.h"

typedef enum cph_pass_job {
  CPH_PASS_AGENT_TURN,
  CPH_PASS_POLL_INBOX,
  CPH_PASS_CHECK_CREDITS,
  CPH_PASS_TOP_UP_CREDITS,
  CPH_PASS_RECONCILE,
  CPH_PASS_JOB_COUNT
} cph_pass_job;

const char *cph_pass_job_name(cph_pass_job job);

typedef struct cph_pass_hooks {
  void *ctx;
  /* agent_turn: how many turns may be handed out now (waiting workers). */
  uint32_t (*workers_waiting)(void *ctx);
  /* agent_turn: a session was picked; the engine builds and leases its turn. */
  void (*start_turn)(void *ctx, const cph_pick *pick);
  /* agent_turn, for drivers whose workers accept only some lanes: when set, the pass calls
   * it instead of the workers_waiting/start_turn loop; it serves each waiting worker with
   * cph_sched_pick_lanes (so the scheduler still decides who runs) and returns how many turns
   * it started. */
  uint32_t (*agent_turn)(void *ctx);
  /* poll_inbox: stage pending input; returns how many messages it staged. */
  uint64_t (*poll_inbox)(void *ctx);
  /* reconcile: expire leases and fix counters. */
  void (*reconcile)(void *ctx);
  /* Called before each job, for tests and tracing; may be NULL. */
  void (*trace)(void *ctx, cph_pass_job job);
} cph_pass_hooks;

typedef struct cph_pass_result {
  uint32_t started; /* turns handed out */
  uint64_t staged;  /* messages staged: the engine runs the next pass at once if > 0 */
} cph_pass_result;

void cph_sched_pass(cph_sched *s, const cph_pass_hooks *h, cph_pass_result *out);

/* check_credits and top_up_credits on their own (the pass calls them). */
void cph_sched_check_credits(cph_sched *s);
void cph_sched_top_up(cph_sched *s);

#endif
