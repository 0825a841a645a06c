/* A reference model of DESIGN §3 for the property test: an array of sessions and a linear
 * scan that applies the pick rules literally. It is slow on purpose and shares no code or
 * structure with lanes/sched.c; what it shares is the fixed-point arithmetic documented in
 * lanes/sched.h, which is part of the rule (it decides ties):
 *   - time in int64 ns; bucket levels in 1/(60·10^9) token, so B per minute refills B units/ns;
 *   - credits in 10^-12 credit; refill rate round(refill_per_second·1000) units/ns;
 *   - credits(now) = min(max, c0 + rate·(now - t0)).
 *
 * Sessions are named by their id string (not by sid) so the test can drive both models with
 * the same operations. Every function takes the time from the clock given at creation.
 *
 * Rules 8–11 are applied as literally: a lane's tokens bucket; the price of a turn by tokens;
 * seats as "a lane may take a free seat below its reservation, or while more seats are free
 * than the other lanes with runnable sessions and budget have reserved and unused"; tenants
 * as start-time fair queueing written out per (tenant, lane) — a start tag, a last finish
 * tag, joining at max(lane's virtual time, last finish) when it gains runnable sessions, ties
 * to the tenant known first (the config's in order, then as sessions name them),
 * tags counted only once some session has named a tenant (before that every session is the
 * default tenant's and there is nothing to share); runs (lanes/sched.h) as a tenant kept for
 * the run's length unless it runs out of runnable sessions or the configuration changes,
 * the length sized by the formula sched.h states; the forecast by playing the lane's picks
 * forward on a copy, one pick per tenant turn (as sched.h says it is). */
#ifndef CEPHALON_TESTS_SCHED_REF_H
#define CEPHALON_TESTS_SCHED_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "lanes/sched.h"

typedef struct cph_ref cph_ref;

cph_ref *cph_ref_new(const cph_sched_config *cfg, const cph_clock *clock);
void cph_ref_free(cph_ref *r);

/* Reload: buckets keep their fill ratio (a bucket whose old capacity was 0 starts full),
 * credits are carried as they stand now and clamped into the new [min, max]. */
void cph_ref_configure(cph_ref *r, const cph_sched_config *cfg);

/* 0, or CPH_EEXISTS for an id already present. */
int cph_ref_add(cph_ref *r, const char *id, cph_lane lane);
int cph_ref_restore(cph_ref *r, const char *id, cph_lane lane, double credits);
/* 0, CPH_ENOTFOUND, or CPH_ESTATE when the session is running. */
int cph_ref_remove(cph_ref *r, const char *id);
bool cph_ref_exists(const cph_ref *r, const char *id);

void cph_ref_set_work(cph_ref *r, const char *id, bool has_work);
void cph_ref_set_paused(cph_ref *r, const char *id, bool paused);
void cph_ref_set_trickle(cph_ref *r, const char *id, bool pending);
void cph_ref_trickle_ran(cph_ref *r);

typedef struct cph_ref_pick {
  const char *id; /* NULL: nothing may start */
  cph_lane lane;
  bool trickle;
  int64_t waited_ns;
} cph_ref_pick;

void cph_ref_pick_next(cph_ref *r, cph_ref_pick *out);
void cph_ref_finish(cph_ref *r, const char *id, uint64_t tool_calls, bool charge_credits);
void cph_ref_finish_cost(cph_ref *r, const char *id, uint64_t tool_calls, uint64_t tokens,
                         bool charge_credits);
/* NULL or "" = the default tenant. */
void cph_ref_set_tenant(cph_ref *r, const char *id, const char *tenant);
/* The name of the reference's tenant index (as cph_why.tenant gives it); "" = default. */
const char *cph_ref_tenant_name(const cph_ref *r, uint32_t index);

/* Exact credits now, in 10^-12 units. */
int64_t cph_ref_credit_units(const cph_ref *r, const char *id);
double cph_ref_credits(const cph_ref *r, const char *id);
bool cph_ref_is_running(const cph_ref *r, const char *id);
uint32_t cph_ref_running(const cph_ref *r);

/* The same answer cph_sched_why gives, computed by scanning. */
void cph_ref_why(cph_ref *r, const char *id, cph_why *out);
void cph_ref_lane_stats(cph_ref *r, cph_lane lane, cph_lane_stats *out);

/* The nearest future instant (> now) at which something the pick depends on crosses a
 * threshold with no further operation: a lane's turns bucket reaching exactly one token or
 * its tool-calls bucket becoming positive, a session's credits reaching max, the trickle
 * falling due. 0 when nothing is pending. For tests that jump exactly onto boundaries. */
int64_t cph_ref_next_boundary(cph_ref *r);

/* Turns started by lane since creation, trickle picks included. */
uint64_t cph_ref_started(const cph_ref *r, cph_lane lane);

#endif
