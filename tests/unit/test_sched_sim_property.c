/* DESIGN §3 rules 1, 8–10 and §12 over the simulator (lanes/sim), on seeded random
 * workloads:
 *   - tenants saturating a lane get shares of its started turns within 2% (relative) of their
 *     weight shares over a measured minute, whatever their session counts;
 *   - a lane's reserved seats are back in its hands within one turn's length of the other
 *     lanes, however saturated those are;
 *   - no lane ever starts more turns, or is charged more tool calls or tokens, over any window
 *     than rule 1's bound allows.
 * (That credits charged by tokens order sessions as §3 says is the reference model's job:
 * test_sched_property compares every pick with it, :charge :tokens in half the configs.)
 *
 * Each property runs CPH_PROPERTY_CASES cases (default below) from CPH_PROPERTY_SEED; a
 * failure names its case's seed: rerun with CPH_PROPERTY_SEED=<seed> CPH_PROPERTY_CASES=1. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "lanes/sim.h"
#include "tests/support/prop.h"

#define DEFAULT_CASES 700
#define DEFAULT_SEED UINT64_C(1907)

static double unit(rng *r) { return (double)(next(r) >> 11) * 0x1.0p-53; }

/* Budgets that never bind, nothing else set. */
static cph_sched_config roomy(uint32_t concurrency) {
  cph_sched_config c;
  memset(&c, 0, sizeof c);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    c.turns_per_minute[i] = CPH_SCHED_MAX_PER_MINUTE;
    c.tool_calls_per_minute[i] = CPH_SCHED_MAX_PER_MINUTE;
    c.cost[i] = 1;
  }
  c.refill_per_second = 1;
  c.credit_max = 30;
  c.credit_min = -30;
  c.concurrency = concurrency;
  c.tenant_run_max = CPH_SCHED_TENANT_RUN_DEFAULT; /* as the policy's default */
  return c;
}

static void run(uint64_t seed, const cph_sim_config *c, cph_sim_result *r) {
  int rc = cph_sim_run(c, r);
  if (rc)
    fail_msg("seed %" PRIu64 ": cph_sim_run: %d", seed, rc);
  if (r->double_starts || r->over_concurrency)
    fail_msg("seed %" PRIu64 ": %" PRIu64 " double starts, %" PRIu64 " picks over concurrency",
             seed, r->double_starts, r->over_concurrency);
}

/* ---------------------------------------------------------------- tenant shares */

static const char *const tenant_names[] = {"acme", "beta", "gamma", "delta"};

/* pace: turns a minute are about 6,000 × pace. At pace 1 the tenant order runs exact or
 * nearly (runs of 1–3 picks, lanes/sched.h); at pace 20 the lane makes 120,000 picks a minute
 * and runs reach their maximum of 16. */
static void tenant_case(uint64_t seed, double pace) {
  rng r = {seed};
  uint32_t conc = 1 + (uint32_t)below(&r, 12);
  cph_lane lane = (cph_lane)below(&r, CPH_LANE_COUNT);
  size_t n_tenants = 2 + (size_t)below(&r, 3);
  static const double weight_choices[] = {1, 2, 5, 3, 0.5, 1.5, 8};
  cph_sched_tenant_weight weights[4];
  cph_sim_session ss[5];
  const char *tenants[5] = {NULL};
  memset(ss, 0, sizeof ss);
  double total_w = 0;
  /* Enough turns that one turn is a small part of the smallest share: about 6000 a minute. */
  double turn_s = conc / (100.0 * pace);
  bool exponential = below(&r, 2);
  size_t n = 0;
  for (size_t t = 0; t < n_tenants; t++) {
    weights[t] = (cph_sched_tenant_weight){tenant_names[t], weight_choices[below(&r, 7)]};
    total_w += weights[t].weight;
    /* More sessions than concurrency, so the tenant always has one runnable: from just
     * enough to a hundred times more. */
    uint32_t count = conc + 1 + (uint32_t)(below(&r, 4) == 0 ? below(&r, 2000) : below(&r, 40));
    ss[n] = (cph_sim_session){
        lane,        CPH_SIM_SATURATED,      0,           turn_s * (0.5 + unit(&r)),
        exponential, (uint32_t)below(&r, 3), (uint32_t)t, count,
        false};
    tenants[n++] = tenant_names[t];
  }
  /* Sometimes the default tenant (weight 1) shares the lane too. */
  bool with_default = below(&r, 3) == 0;
  if (with_default) {
    ss[n] = (cph_sim_session){
        lane, CPH_SIM_SATURATED, 0, turn_s, exponential, 0, 4, conc + 1 + (uint32_t)below(&r, 100),
        false};
    tenants[n++] = NULL;
    total_w += 1;
  }
  cph_sim_config c;
  memset(&c, 0, sizeof c);
  c.sched = roomy(conc);
  c.sched.tenants = weights;
  c.sched.n_tenants = n_tenants;
  c.sessions = ss;
  c.n_sessions = n;
  c.tenants = tenants;
  c.duration_s = 65;
  c.warmup_s = 5;  /* the measured minute */
  c.tick_ms = 100; /* passes also run at every arrival and completion */
  c.sched.tenant_run_max = (uint32_t)(1 + below(&r, 2) * 15); /* exact, or runs of up to 16 */
  c.seed = seed;
  cph_sim_result res;
  run(seed, &c, &res);
  /* at machine rates the runs were on (lanes/sched.h sizes them from the pace) */
  if (pace > 1 && c.sched.tenant_run_max > 1 && res.tenant_run[lane] < 2)
    fail_msg("seed %" PRIu64 ": runs of %u picks at %g times the pace", seed,
             res.tenant_run[lane], pace);
  uint64_t all = 0;
  for (size_t k = 0; k < n; k++)
    all += res.groups[ss[k].group].turns;
  if (all < 1000)
    fail_msg("seed %" PRIu64 ": only %" PRIu64 " turns in the minute", seed, all);
  for (size_t k = 0; k < n; k++) {
    double w = k < n_tenants ? weights[k].weight : 1;
    double want = w / total_w, got = (double)res.groups[ss[k].group].turns / (double)all;
    if (fabs(got - want) > 0.02 * want)
      fail_msg("seed %" PRIu64 ": tenant %s (weight %g, %u sessions): share %.4f, weight share "
               "%.4f (concurrency %u, %zu tenants%s)",
               seed, tenants[k] ? tenants[k] : "(default)", w, ss[k].count, got, want, conc,
               n_tenants, with_default ? " + default" : "");
  }
  cph_sim_result_free(&res);
}

static void test_tenant_shares_follow_weights_whatever_their_session_counts(void **state) {
  (void)state;
  uint64_t seed;
  long n;
  cph_property_run(DEFAULT_SEED, DEFAULT_CASES, &seed, &n);
  print_message("tenant shares: %ld cases from seed %" PRIu64 "\n", n, seed);
  for (long i = 0; i < n; i++)
    tenant_case(seed + (uint64_t)i, 1);
}

/* The same at machine rates, where the tenant order hands out runs of up to 16 picks
 * (lanes/sched.h): the shares over the minute still follow the weights within 2%. */
static void test_tenant_shares_follow_weights_at_machine_rates(void **state) {
  (void)state;
  uint64_t seed;
  long n;
  cph_property_run(DEFAULT_SEED + 1000000, DEFAULT_CASES / 20, &seed, &n);
  print_message("tenant shares at 20x the pace: %ld cases from seed %" PRIu64 "\n", n, seed);
  for (long i = 0; i < n; i++)
    tenant_case(seed + (uint64_t)i, 20);
}

/* ---------------------------------------------------------------- seats */

static void seats_case(uint64_t seed) {
  rng r = {seed ^ UINT64_C(0x5ea75)};
  uint32_t conc = 2 + (uint32_t)below(&r, 9);
  cph_lane reserved = (cph_lane)below(&r, CPH_LANE_COUNT);
  uint32_t seats = 1 + (uint32_t)below(&r, conc - 1);
  double turn_s = 0.1 + 2 * unit(&r); /* every other lane's turns take this long */
  cph_sim_session ss[3];
  size_t n = 0;
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    if ((cph_lane)l == reserved)
      continue;
    if (n && below(&r, 2)) /* one or both other lanes saturated */
      continue;
    ss[n++] =
        (cph_sim_session){(cph_lane)l, CPH_SIM_SATURATED, 0, turn_s, false, 1, 1, conc + 5, false};
  }
  /* The reserved lane never wants more than its seats: its sessions come and go. */
  uint32_t mine = 1 + (uint32_t)below(&r, seats);
  ss[n++] = (cph_sim_session){reserved,
                              CPH_SIM_POISSON,
                              0.05 + 2 * unit(&r),
                              0.01 + 0.5 * unit(&r),
                              below(&r, 2),
                              0,
                              0,
                              mine,
                              false};
  cph_sim_config c;
  memset(&c, 0, sizeof c);
  c.sched = roomy(conc);
  c.sched.seats[reserved] = seats;
  c.sessions = ss;
  c.n_sessions = n;
  c.duration_s = 120;
  c.tick_ms = 100;
  c.seed = seed;
  c.record_picks = true;
  cph_sim_result res;
  run(seed, &c, &res);
  int64_t bound = (int64_t)llround(turn_s * 1e9);
  uint64_t picks = 0;
  for (size_t i = 0; i < res.n_picks; i++) {
    const cph_sim_pick *p = &res.picks[i];
    if (p->lane != reserved)
      continue;
    picks++;
    if (p->waited_ns > bound)
      fail_msg("seed %" PRIu64 ": lane %s (%u seats of %u, %u sessions) waited %.3f s at "
               "%.3f s; the other lanes' turns take %.3f s",
               seed, cph_lane_name(reserved), seats, conc, mine, p->waited_ns / 1e9, p->at_ns / 1e9,
               turn_s);
  }
  if (!picks)
    fail_msg("seed %" PRIu64 ": the reserved lane never ran", seed);
  cph_sim_result_free(&res);
}

static void test_reserved_seats_return_within_one_turn(void **state) {
  (void)state;
  uint64_t seed;
  long n;
  cph_property_run(DEFAULT_SEED, DEFAULT_CASES, &seed, &n);
  print_message("seats: %ld cases from seed %" PRIu64 "\n", n, seed);
  for (long i = 0; i < n; i++)
    seats_case(seed + (uint64_t)i);
}

/* ---------------------------------------------------------------- budgets over windows */

typedef struct stamp {
  int64_t at;
  uint64_t amount;
} stamp;

static int stamp_cmp(const void *a, const void *b) {
  const stamp *x = a, *y = b;
  return (x->at > y->at) - (x->at < y->at);
}

/* The most `amount` in any closed window [t, t + w]; s sorted by time. */
static uint64_t max_in_window(const stamp *s, size_t n, int64_t w) {
  uint64_t best = 0, sum = 0;
  for (size_t lo = 0, hi = 0; lo < n; lo++) {
    while (hi < n && s[hi].at <= s[lo].at + w)
      sum += s[hi++].amount;
    best = sum > best ? sum : best;
    sum -= s[lo].amount;
  }
  return best;
}

static void budget_case(uint64_t seed) {
  rng r = {seed ^ UINT64_C(0xb0d6e7)};
  cph_sched_config sc = roomy(1 + (uint32_t)below(&r, 8));
  static const int64_t turns[] = {1, 3, 10, 60, 600};
  static const int64_t tools[] = {1, 5, 60, 300, 5000};
  static const int64_t tokens[] = {0, 0, 1000, 20000, 300000};
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    sc.turns_per_minute[l] = turns[below(&r, 5)];
    sc.tool_calls_per_minute[l] = tools[below(&r, 5)];
    sc.tokens_per_minute[l] = tokens[below(&r, 5)];
  }
  if (below(&r, 2)) {
    sc.charge = CPH_CHARGE_TOKENS;
    sc.tokens_per_unit = 1000;
  }
  uint32_t left = sc.concurrency;
  for (int l = 0; l < CPH_LANE_COUNT && below(&r, 2); l++) {
    sc.seats[l] = (uint32_t)below(&r, left + 1);
    left -= sc.seats[l];
  }
  static const cph_sched_tenant_weight weights[] = {{"acme", 3}, {"beta", 1}};
  sc.tenants = weights;
  sc.n_tenants = 2;
  sc.trickle_per_minute = below(&r, 2) ? 6 : 0;

  cph_sim_session ss[7];
  const char *tenants[7] = {NULL};
  uint64_t toks[7] = {0};
  size_t n = 0;
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    for (int k = 0; k < 2; k++) {
      bool saturated = below(&r, 2);
      ss[n] = (cph_sim_session){(cph_lane)l,    saturated ? CPH_SIM_SATURATED : CPH_SIM_POISSON,
                                0.2 + unit(&r), 0.05 + 3 * unit(&r),
                                below(&r, 2),   (uint32_t)below(&r, 21),
                                (uint32_t)n,    1 + (uint32_t)below(&r, 6),
                                false};
      toks[n] = below(&r, 3) ? below(&r, 50000) : 0;
      tenants[n] = k ? weights[below(&r, 2)].name : NULL;
      n++;
    }
  if (sc.trickle_per_minute)
    ss[n++] = (cph_sim_session){CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 6, 1, true};
  cph_sim_config c;
  memset(&c, 0, sizeof c);
  c.sched = sc;
  c.sessions = ss;
  c.n_sessions = n;
  c.tenants = tenants;
  c.tokens = toks;
  c.duration_s = 240;
  c.tick_ms = 50;
  c.seed = seed;
  c.record_picks = true;
  cph_sim_result res;
  run(seed, &c, &res);

  stamp *starts = calloc(res.n_picks + 1, sizeof *starts);
  stamp *calls = calloc(res.n_picks + 1, sizeof *calls);
  stamp *burnt = calloc(res.n_picks + 1, sizeof *burnt);
  int64_t end = (int64_t)(c.duration_s * 1e9);
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    size_t ns = 0, nc = 0;
    uint64_t most_calls = 0, most_tokens = 0;
    for (size_t i = 0; i < res.n_picks; i++) {
      const cph_sim_pick *p = &res.picks[i];
      if (p->lane != (cph_lane)l)
        continue;
      if (!p->trickle) /* trickle batches bypass the budget (§3.5) and charge nothing */
        starts[ns++] = (stamp){p->at_ns, 1};
      if (p->end_ns <= end) { /* charged at completion, within the run */
        calls[nc] = (stamp){p->end_ns, p->tool_calls};
        burnt[nc++] = (stamp){p->end_ns, p->tokens};
      }
      most_calls = p->tool_calls > most_calls ? p->tool_calls : most_calls;
      most_tokens = p->tokens > most_tokens ? p->tokens : most_tokens;
    }
    qsort(calls, nc, sizeof *calls, stamp_cmp);
    qsort(burnt, nc, sizeof *burnt, stamp_cmp);
    static const double windows[] = {0.5, 1, 7, 30, 60, 150, 240};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
      int64_t wn = (int64_t)(windows[w] * 1e9);
      double minutes = windows[w] / 60;
      /* Rule 1: at most turns x W/60 + turns turns start in any window of W seconds. */
      double turn_bound = (double)sc.turns_per_minute[l] * (minutes + 1);
      uint64_t got = max_in_window(starts, ns, wn);
      if ((double)got > turn_bound + 1e-9)
        fail_msg("seed %" PRIu64 ": lane %s started %" PRIu64 " turns in %.1f s, budget %" PRId64
                 "/min allows %.2f",
                 seed, cph_lane_name((cph_lane)l), got, windows[w], sc.turns_per_minute[l],
                 turn_bound);
      /* Charged at completion, so a lane overspends by at most what the turns running when
       * its bucket ran out report: concurrency x the most one turn reports. */
      double call_bound = (double)sc.tool_calls_per_minute[l] * (minutes + 1) +
                          (double)sc.concurrency * (double)most_calls;
      got = max_in_window(calls, nc, wn);
      if ((double)got > call_bound + 1e-9)
        fail_msg("seed %" PRIu64 ": lane %s was charged %" PRIu64 " tool calls in %.1f s, "
                 "bound %.1f",
                 seed, cph_lane_name((cph_lane)l), got, windows[w], call_bound);
      if (sc.tokens_per_minute[l]) {
        double token_bound = (double)sc.tokens_per_minute[l] * (minutes + 1) +
                             (double)sc.concurrency * (double)most_tokens;
        got = max_in_window(burnt, nc, wn);
        if ((double)got > token_bound + 1e-9)
          fail_msg("seed %" PRIu64 ": lane %s was charged %" PRIu64 " tokens in %.1f s, "
                   "bound %.1f",
                   seed, cph_lane_name((cph_lane)l), got, windows[w], token_bound);
      }
    }
  }
  free(starts);
  free(calls);
  free(burnt);
  cph_sim_result_free(&res);
}

static void test_lane_budget_never_exceeded_over_any_window(void **state) {
  (void)state;
  uint64_t seed;
  long n;
  cph_property_run(DEFAULT_SEED, DEFAULT_CASES, &seed, &n);
  print_message("budgets: %ld cases from seed %" PRIu64 "\n", n, seed);
  for (long i = 0; i < n; i++)
    budget_case(seed + (uint64_t)i);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tenant_shares_follow_weights_whatever_their_session_counts),
      cmocka_unit_test(test_tenant_shares_follow_weights_at_machine_rates),
      cmocka_unit_test(test_reserved_seats_return_within_one_turn),
      cmocka_unit_test(test_lane_budget_never_exceeded_over_any_window),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
