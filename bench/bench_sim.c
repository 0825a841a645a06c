/* cephalon-bench fairness, spam and maintenance: the real scheduler (lanes/) on a virtual
 * clock through lanes/sim (DESIGN §12), so hours of traffic take a second and every figure
 * is reproducible from its seed.
 *
 *   fairness:    equal saturated sessions; Jain's index over their turns (>= 0.99), in two
 *                regimes: the lane budget binding (credits decide), and budgets roomy with
 *                many sessions (the concurrency slots decide).
 *   spam:        one channel at 100x the others; the quiet interactive sessions' p99 pick
 *                wait against their p99 in the same run without the spam (<= 2x), the lane
 *                share over time, pick-wait percentiles per lane.
 *   maintenance: full interactive load, compaction work spending the whole maintenance
 *                budget, the janitor holding outbox batches: outbox batches per minute
 *                against :min-batches-per-minute (the trickle holds).
 * --data DIR writes the series the plots are drawn from (bench/run.sh). fairness and spam
 * also run with DESIGN §3.9–3.10 on: --with-tenants puts the sessions in tenants of equal
 * weight (fairness: four; spam: the quiet sessions, the spammer, operational and maintenance
 * each their own), --with-seats reserves a seat each for operational and maintenance. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "lanes/sim.h"

/* The seed policy of DESIGN §8, as the scheduler sees it. */
static cph_sched_config seed_policy(void) {
  cph_sched_config c = {{60, 30, 10}, {120, 60, 20}, 1.0, 30, -30, {2, 1, 1}, 4, 1, {0}, CPH_CHARGE_TURN, 0, {0}, NULL, 0,
                         CPH_SCHED_TENANT_RUN_DEFAULT}; /* the policy's default */
  return c;
}

static int sim_run(const cph_sim_config *c, cph_sim_result *r, const char *what) {
  int rc = cph_sim_run(c, r);
  if (rc) {
    fprintf(stderr, "cephalon-bench %s: the simulation failed (%d)\n", what, rc);
    cph_sim_result_free(r);
  }
  if (!rc && (r->double_starts || r->over_concurrency)) {
    fprintf(stderr, "cephalon-bench %s: scheduler violations in the simulation\n", what);
    cph_sim_print(r, stderr);
    cph_sim_result_free(r);
    return -1;
  }
  return rc ? -1 : 0;
}

static bool with_tenants, with_seats;

/* Parses the shared options: --data DIR, --seed S, --with-tenants, --with-seats. 1 =
 * consumed, 0 = not ours, -1 bad. */
static int sim_opt(int argc, char **argv, int *i, const char **data, uint64_t *seed) {
  if (strcmp(argv[*i], "--with-tenants") == 0 || strcmp(argv[*i], "--with-seats") == 0) {
    *(argv[*i][7] == 't' ? &with_tenants : &with_seats) = true;
    (*i)++;
    return 1;
  }
  if (strcmp(argv[*i], "--data") == 0) {
    if (*i + 1 >= argc)
      return -1;
    *data = argv[*i + 1];
    *i += 2;
    return 1;
  }
  return cph_bench_opt_u64(argc, argv, i, "--seed", 0, UINT64_MAX, seed);
}

static FILE *data_file(const char *dir, const char *name) {
  if (!dir)
    return NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f)
    fprintf(stderr, "cephalon-bench: cannot write %s\n", path);
  return f;
}

/* ---------------------------------------------------------------- fairness */

int cph_bench_fairness(int argc, char **argv) {
  const char *data = NULL;
  uint64_t seed = 24;
  for (int i = 1; i < argc;) {
    int r = sim_opt(argc, argv, &i, &data, &seed);
    if (r < 0)
      return 2;
    if (r)
      continue;
    fprintf(stderr, "usage: cephalon-bench fairness [--seed S] [--data DIR] [--with-tenants] "
                    "[--with-seats]\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  /* A: 16 equal saturated interactive sessions, seed policy: the lane's 60 turns a minute
   * bind, so credits decide who gets each token. One virtual hour. With tenants: four
   * entries of four sessions, each entry a tenant of weight 1. */
  static const char *const four[] = {"t0", "t1", "t2", "t3"};
  static const cph_sched_tenant_weight equal[] = {{"t0", 1}, {"t1", 1}, {"t2", 1}, {"t3", 1}};
  cph_sim_session a_ss[4];
  for (int k = 0; k < 4; k++)
    a_ss[k] = (cph_sim_session){CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, true, 1, 0,
                                with_tenants ? 4 : 16, false};
  cph_sim_config a = {0};
  a.sched = seed_policy();
  a.sched.trickle_per_minute = 0;
  if (with_seats)
    a.sched.seats[CPH_LANE_OPERATIONAL] = a.sched.seats[CPH_LANE_MAINTENANCE] = 1;
  if (with_tenants) {
    a.sched.tenants = equal;
    a.sched.n_tenants = 4;
    a.tenants = four;
  }
  a.sessions = a_ss;
  a.n_sessions = with_tenants ? 4 : 1;
  a.duration_s = 3600;
  a.warmup_s = 60;
  a.seed = seed;
  /* B: 1,000 equal saturated interactive sessions, budgets that never bind, 64 slots:
   * credits and wait time decide among many. Ten virtual minutes. */
  cph_sim_session b_ss[4];
  for (int k = 0; k < 4; k++)
    b_ss[k] = (cph_sim_session){CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 1.0, true, 1, 0,
                                with_tenants ? 250 : 1000, false};
  cph_sim_config b = {0};
  b.sched = seed_policy();
  b.sched.turns_per_minute[0] = 10000000;
  b.sched.tool_calls_per_minute[0] = 10000000;
  b.sched.concurrency = 64;
  b.sched.trickle_per_minute = 0;
  if (with_seats)
    b.sched.seats[CPH_LANE_OPERATIONAL] = b.sched.seats[CPH_LANE_MAINTENANCE] = 1;
  if (with_tenants) {
    b.sched.tenants = equal;
    b.sched.n_tenants = 4;
    b.tenants = four;
  }
  b.sessions = b_ss;
  b.n_sessions = with_tenants ? 4 : 1;
  b.duration_s = 600;
  b.warmup_s = 30;
  b.seed = seed;
  cph_sim_result ra, rb;
  int64_t t0 = cph_bench_now_ns();
  if (sim_run(&a, &ra, "fairness"))
    return 1;
  if (sim_run(&b, &rb, "fairness")) {
    cph_sim_result_free(&ra);
    return 1;
  }
  int64_t t1 = cph_bench_now_ns();
  uint64_t amin = UINT64_MAX, amax = 0, bmin = UINT64_MAX, bmax = 0;
  for (size_t i = 0; i < ra.n_sessions; i++) {
    amin = ra.session_turns[i] < amin ? ra.session_turns[i] : amin;
    amax = ra.session_turns[i] > amax ? ra.session_turns[i] : amax;
  }
  for (size_t i = 0; i < rb.n_sessions; i++) {
    bmin = rb.session_turns[i] < bmin ? rb.session_turns[i] : bmin;
    bmax = rb.session_turns[i] > bmax ? rb.session_turns[i] : bmax;
  }
  printf("A: 16 saturated interactive sessions, seed policy (60 turns/min binds), %.0f s:\n"
         "   turns %" PRIu64 ", per session %" PRIu64 "..%" PRIu64 ", Jain %.5f\n",
         ra.measured_s, ra.lanes[0].turns, amin, amax, ra.jain[0]);
  printf("B: 1000 saturated interactive sessions, roomy budgets, concurrency 64, %.0f s:\n"
         "   turns %" PRIu64 ", per session %" PRIu64 "..%" PRIu64 ", Jain %.5f\n",
         rb.measured_s, rb.lanes[0].turns, bmin, bmax, rb.jain[0]);
  printf("simulated in %.2f s (seed %" PRIu64 ")\n", (double)(t1 - t0) / 1e9, seed);
  FILE *f = data_file(data, "fairness.tsv");
  if (f) {
    fprintf(f, "# session\tturns_A\n");
    for (size_t i = 0; i < ra.n_sessions; i++)
      fprintf(f, "%zu\t%" PRIu64 "\n", i, ra.session_turns[i]);
    fclose(f);
  }
  double jain = ra.jain[0] < rb.jain[0] ? ra.jain[0] : rb.jain[0];
  printf("fairness jain=%.5f jain_budget_bound=%.5f jain_many_sessions=%.5f sessions=16,1000"
         " tenants=%d seats=%d seed=%" PRIu64 "\n",
         jain, ra.jain[0], rb.jain[0], with_tenants ? 4 : 0, with_seats ? 2 : 0, seed);
  cph_sim_result_free(&ra);
  cph_sim_result_free(&rb);
  return 0;
}

/* ---------------------------------------------------------------- spam */

/* Groups of the spam scenario. */
enum { G_QUIET, G_SPAM, G_OPER, G_MAINT, G_JANITOR };

static void spam_config(cph_sim_config *c, cph_sim_session *ss, double factor, uint64_t seed,
                        double duration) {
  const double quiet_rate = 0.25; /* messages a second per quiet session */
  /* 8 quiet interactive sessions; the spam channel's one subscriber at factor x their rate;
   * a light operational and maintenance load and the janitor, so lane shares mean something. */
  ss[0] = (cph_sim_session){CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, quiet_rate, 1.0, true, 1,
                            G_QUIET, 8, false};
  ss[1] = (cph_sim_session){CPH_LANE_INTERACTIVE, CPH_SIM_POISSON, quiet_rate * factor, 1.0,
                            true, 1, G_SPAM, 1, false};
  ss[2] = (cph_sim_session){CPH_LANE_OPERATIONAL, CPH_SIM_POISSON, 0.05, 2.0, true, 1, G_OPER, 4,
                            false};
  ss[3] = (cph_sim_session){CPH_LANE_MAINTENANCE, CPH_SIM_POISSON, 0.02, 2.0, true, 0, G_MAINT, 2,
                            false};
  ss[4] = (cph_sim_session){CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, G_JANITOR, 1,
                            true};
  memset(c, 0, sizeof *c);
  c->sched = seed_policy();
  /* Interactive at 600 turns a minute (the quiet load alone is 120): the budget does not
   * bind, the 4 slots do — the regime where a spammer could crowd quiet sessions out. */
  c->sched.turns_per_minute[CPH_LANE_INTERACTIVE] = 600;
  c->sched.tool_calls_per_minute[CPH_LANE_INTERACTIVE] = 100000;
  static const char *const tenants[] = {"quiet", "spammer", "ops", "maint", NULL};
  if (with_tenants)
    c->tenants = tenants; /* all weight 1 */
  if (with_seats)
    c->sched.seats[CPH_LANE_OPERATIONAL] = c->sched.seats[CPH_LANE_MAINTENANCE] = 1;
  c->sessions = ss;
  c->n_sessions = 5;
  c->duration_s = duration;
  c->warmup_s = 120;
  c->seed = seed;
  c->record_picks = true;
}

/* Lane shares per minute (and the spam session's share) of one run, appended as columns. */
static void share_series(const cph_sim_result *r, uint32_t spam_index, size_t minutes,
                         double (*out)[4]) {
  uint64_t (*count)[4] = calloc(minutes, sizeof *count);
  if (!count)
    return;
  for (size_t i = 0; i < r->n_picks; i++) {
    size_t m = (size_t)(r->picks[i].at_ns / 60000000000LL);
    if (m >= minutes)
      continue;
    count[m][r->picks[i].lane]++;
    if (r->picks[i].session == spam_index)
      count[m][3]++;
  }
  for (size_t m = 0; m < minutes; m++) {
    uint64_t total = count[m][0] + count[m][1] + count[m][2];
    for (int k = 0; k < 4; k++)
      out[m][k] = total ? (double)count[m][k] / (double)total : 0;
  }
  free(count);
}

int cph_bench_spam(int argc, char **argv) {
  const char *data = NULL;
  uint64_t seed = 7, factor = 100, duration = 3600;
  for (int i = 1; i < argc;) {
    int r = sim_opt(argc, argv, &i, &data, &seed);
    if (!r)
      r = cph_bench_opt_u64(argc, argv, &i, "--factor", 1, 100000, &factor);
    if (!r)
      r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 300, 864000, &duration);
    if (r < 0)
      return 2;
    if (r)
      continue;
    fprintf(stderr, "usage: cephalon-bench spam [--factor F] [--seconds S] [--seed S] "
                    "[--data DIR] [--with-tenants] [--with-seats]\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  cph_sim_session ss_base[5], ss_spam[5];
  cph_sim_config cb, cs;
  spam_config(&cb, ss_base, 1, seed, (double)duration);
  spam_config(&cs, ss_spam, (double)factor, seed, (double)duration);
  cph_sim_result base, spam;
  if (sim_run(&cb, &base, "spam"))
    return 1;
  if (sim_run(&cs, &spam, "spam")) {
    cph_sim_result_free(&base);
    return 1;
  }
  int64_t p99_base = base.groups[G_QUIET].wait_p99_ns, p99_spam = spam.groups[G_QUIET].wait_p99_ns;
  double ratio = p99_base > 0 ? (double)p99_spam / (double)p99_base : 0;
  printf("8 quiet interactive sessions at 0.25 msg/s; the spam channel's session at %" PRIu64
         "x; 4 operational, 2 maintenance, the janitor; seed policy, interactive 600 "
         "turns/min, concurrency 4; %" PRIu64 " s\n",
         factor, duration);
  printf("-- without spam (the spam session at 1x):\n");
  cph_sim_print(&base, stdout);
  printf("-- with spam (%" PRIu64 "x):\n", factor);
  cph_sim_print(&spam, stdout);
  printf("quiet p99 pick wait: %.4f s with spam, %.4f s without: ratio %.3f (target <= 2)\n",
         p99_spam / 1e9, p99_base / 1e9, ratio);
  /* The spam session is the 9th expanded session (after the 8 quiet ones). */
  size_t minutes = (size_t)(duration / 60);
  double(*sb)[4] = calloc(minutes, sizeof *sb);
  double(*sp)[4] = calloc(minutes, sizeof *sp);
  if (sb && sp) {
    share_series(&base, 8, minutes, sb);
    share_series(&spam, 8, minutes, sp);
  }
  FILE *f = data_file(data, "spam_share.tsv");
  if (f && sb && sp) {
    fprintf(f, "# minute\tspam_interactive\tspam_operational\tspam_maintenance\tspam_session"
               "\tbase_interactive\tbase_operational\tbase_maintenance\tbase_session\n");
    for (size_t m = 0; m < minutes; m++)
      fprintf(f, "%zu\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\n", m, sp[m][0], sp[m][1],
              sp[m][2], sp[m][3], sb[m][0], sb[m][1], sb[m][2], sb[m][3]);
  }
  if (f)
    fclose(f);
  free(sb);
  free(sp);
  f = data_file(data, "spam_wait.tsv");
  if (f) {
    fprintf(f, "# who\tp50_s\tp90_s\tp99_s\n");
    static const char *const lanes[] = {"interactive", "operational", "maintenance"};
    for (int l = 0; l < CPH_LANE_COUNT; l++) {
      fprintf(f, "%s(no-spam)\t%.4f\t%.4f\t%.4f\n", lanes[l], base.lanes[l].wait_p50_ns / 1e9,
              base.lanes[l].wait_p90_ns / 1e9, base.lanes[l].wait_p99_ns / 1e9);
      fprintf(f, "%s(spam)\t%.4f\t%.4f\t%.4f\n", lanes[l], spam.lanes[l].wait_p50_ns / 1e9,
              spam.lanes[l].wait_p90_ns / 1e9, spam.lanes[l].wait_p99_ns / 1e9);
    }
    fprintf(f, "quiet(no-spam)\t%.4f\t%.4f\t%.4f\n", base.groups[G_QUIET].wait_p50_ns / 1e9,
            base.groups[G_QUIET].wait_p90_ns / 1e9, base.groups[G_QUIET].wait_p99_ns / 1e9);
    fprintf(f, "quiet(spam)\t%.4f\t%.4f\t%.4f\n", spam.groups[G_QUIET].wait_p50_ns / 1e9,
            spam.groups[G_QUIET].wait_p90_ns / 1e9, spam.groups[G_QUIET].wait_p99_ns / 1e9);
    fclose(f);
  }
  printf("spam quiet_p99_ratio=%.3f quiet_p99_spam_s=%.4f quiet_p99_nospam_s=%.4f factor=%" PRIu64
         " spam_share=%.3f interactive_share=%.3f outbox_min_per_min=%" PRIu64 " tenants=%d"
         " seats=%d seed=%" PRIu64 "\n",
         ratio, p99_spam / 1e9, p99_base / 1e9, factor, spam.groups[G_SPAM].share,
         spam.lanes[CPH_LANE_INTERACTIVE].share, spam.outbox_min_per_minute, with_tenants,
         with_seats, seed);
  cph_sim_result_free(&base);
  cph_sim_result_free(&spam);
  return 0;
}

/* ---------------------------------------------------------------- maintenance */

int cph_bench_maintenance(int argc, char **argv) {
  const char *data = NULL;
  uint64_t seed = 25, duration = 3600;
  for (int i = 1; i < argc;) {
    int r = sim_opt(argc, argv, &i, &data, &seed);
    if (!r)
      r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 300, 864000, &duration);
    if (r < 0)
      return 2;
    if (r)
      continue;
    fprintf(stderr, "usage: cephalon-bench maintenance [--seconds S] [--seed S] [--data DIR]\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  static const uint32_t rates[] = {1, 6, 60};
  uint64_t worst_shortfall = 0, seed_fewest = 0, fewest[3] = {0, 0, 0};
  double seed_mean = 0, seed_interactive = 0;
  bool held = true;
  FILE *f = data_file(data, "maintenance.tsv");
  if (f)
    fprintf(f, "# guaranteed_per_min\tmean_per_min\tfewest_in_a_minute\n");
  printf("full interactive load (16 saturated sessions, 2 s turns, budget roomy: every slot "
         "busy), 8 saturated operational, 4 compaction sessions saturating the maintenance "
         "budget (10 turns/min), the janitor holding outbox batches; concurrency 4; %" PRIu64
         " s per rate\n",
         duration);
  for (size_t k = 0; k < sizeof rates / sizeof rates[0]; k++) {
    cph_sim_session ss[] = {
        {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 2.0, true, 1, 0, 16, false},
        {CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 2.0, true, 1, 1, 8, false},
        {CPH_LANE_MAINTENANCE, CPH_SIM_SATURATED, 0, 5.0, true, 1, 2, 4, false},
        {CPH_LANE_MAINTENANCE, CPH_SIM_NONE, 0, 0, false, 0, 3, 1, true},
    };
    cph_sim_config c = {0};
    c.sched = seed_policy();
    c.sched.turns_per_minute[0] = c.sched.turns_per_minute[1] = 100000;
    c.sched.tool_calls_per_minute[0] = c.sched.tool_calls_per_minute[1] = 1000000;
    c.sched.trickle_per_minute = rates[k];
    c.sessions = ss;
    c.n_sessions = 4;
    c.duration_s = (double)duration;
    c.warmup_s = 60;
    c.seed = seed;
    cph_sim_result r;
    if (sim_run(&c, &r, "maintenance")) {
      if (f)
        fclose(f);
      return 1;
    }
    printf("-- :min-batches-per-minute %u\n", rates[k]);
    cph_sim_print(&r, stdout);
    printf("   outbox batches %.2f/min (fewest %" PRIu64 " in a minute; guaranteed %u): %s\n",
           r.outbox_per_minute, r.outbox_min_per_minute, rates[k],
           r.outbox_min_per_minute >= rates[k] ? "held" : "NOT held");
    if (f)
      fprintf(f, "%u\t%.3f\t%" PRIu64 "\n", rates[k], r.outbox_per_minute,
              r.outbox_min_per_minute);
    fewest[k] = r.outbox_min_per_minute;
    /* The guarantee is judged at the rates a policy sets (the seed's 1, and 6); at 60 a
     * minute the batches are due every second and each waits for a free slot (up to one
     * turn), so a whole-minute window may see one fewer: reported, not judged. */
    if (r.outbox_min_per_minute < rates[k] && rates[k] <= 6) {
      held = false;
      if (rates[k] - r.outbox_min_per_minute > worst_shortfall)
        worst_shortfall = rates[k] - r.outbox_min_per_minute;
    }
    if (k == 0) { /* the seed policy's rate: its figures go in the summary line */
      seed_mean = r.outbox_per_minute;
      seed_fewest = r.outbox_min_per_minute;
      seed_interactive = r.lanes[CPH_LANE_INTERACTIVE].share;
    }
    cph_sim_result_free(&r);
  }
  if (f)
    fclose(f);
  printf("maintenance trickle_held=%s batches_per_min=%.2f fewest_per_min=%" PRIu64
         " guaranteed_per_min=1 interactive_share=%.3f fewest_at_1_6_60=%" PRIu64 ",%" PRIu64
         ",%" PRIu64 " worst_shortfall=%" PRIu64 " seed=%" PRIu64 "\n",
         held ? "yes" : "no", seed_mean, seed_fewest, seed_interactive, fewest[0], fewest[1],
         fewest[2], worst_shortfall, seed);
  return held ? 0 : 1;
}

/* ---------------------------------------------------------------- tenants and seats */

/* DESIGN §12: tenants of weights 1:2:5 saturating a lane with very different session counts
 * (1,000, 10 and 100): each one's share of the turns started over a measured minute against
 * its weight share; then a lane's reserved seats under a saturated higher lane: the longest a
 * session of the reserving lane waits, against the other lane's turn length. */
int cph_bench_tenants(int argc, char **argv) {
  const char *data = NULL;
  uint64_t seed = 19;
  for (int i = 1; i < argc;) {
    int r = sim_opt(argc, argv, &i, &data, &seed);
    if (r < 0)
      return 2;
    if (r)
      continue;
    fprintf(stderr, "usage: cephalon-bench tenants [--seed S]\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  static const cph_sched_tenant_weight weights[] = {{"one", 1}, {"two", 2}, {"five", 5}};
  static const char *const names[] = {"one", "two", "five"};
  static const uint32_t counts[] = {1000, 10, 100};
  cph_sim_session ss[3];
  for (int k = 0; k < 3; k++)
    ss[k] = (cph_sim_session){CPH_LANE_OPERATIONAL, CPH_SIM_SATURATED, 0, 0.05, true, 1,
                              (uint32_t)k, counts[k], false};
  cph_sim_config c = {0};
  c.sched = seed_policy();
  c.sched.turns_per_minute[CPH_LANE_OPERATIONAL] = 100000;
  c.sched.tool_calls_per_minute[CPH_LANE_OPERATIONAL] = 1000000;
  c.sched.trickle_per_minute = 0;
  c.sched.tenants = weights;
  c.sched.n_tenants = 3;
  c.tenants = names;
  c.sessions = ss;
  c.n_sessions = 3;
  c.duration_s = 70;
  c.warmup_s = 10;
  c.seed = seed;
  cph_sim_result r;
  if (sim_run(&c, &r, "tenants"))
    return 1;
  uint64_t total = r.groups[0].turns + r.groups[1].turns + r.groups[2].turns;
  double worst = 0;
  printf("3 tenants, weights 1:2:5, 1000/10/100 saturated operational sessions, concurrency 4,"
         " one measured minute:\n");
  for (int k = 0; k < 3; k++) {
    double want = weights[k].weight / 8, got = total ? (double)r.groups[k].turns / total : 0;
    double err = want > 0 ? (got - want) / want : 0;
    worst = err < 0 ? (-err > worst ? -err : worst) : (err > worst ? err : worst);
    printf("   %-5s %4u sessions: %6" PRIu64 " turns, share %.4f, weight share %.4f (%+.2f%%)\n",
           names[k], counts[k], r.groups[k].turns, got, want, 100 * err);
  }
  cph_sim_result_free(&r);

  /* Seats: maintenance reserves 1 of 4; 16 interactive sessions saturate with 2 s turns;
   * 2 maintenance sessions get work now and then. */
  cph_sim_session st[] = {
      {CPH_LANE_INTERACTIVE, CPH_SIM_SATURATED, 0, 2.0, false, 1, 0, 16, false},
      {CPH_LANE_MAINTENANCE, CPH_SIM_POISSON, 0.05, 1.0, true, 0, 1, 1, false},
  };
  cph_sim_config s = {0};
  s.sched = seed_policy();
  s.sched.turns_per_minute[0] = 100000;
  s.sched.tool_calls_per_minute[0] = 1000000;
  s.sched.trickle_per_minute = 0;
  s.sched.seats[CPH_LANE_MAINTENANCE] = 1;
  s.sessions = st;
  s.n_sessions = 2;
  s.duration_s = 3600;
  s.seed = seed;
  if (sim_run(&s, &r, "tenants"))
    return 1;
  double wait = r.groups[1].wait_max_ns / 1e9;
  printf("seats: maintenance reserves 1 of 4 under 16 saturated interactive sessions (2 s turns):"
         " %" PRIu64 " maintenance turns, longest wait %.3f s (p99 %.3f s)\n",
         r.groups[1].turns, wait, r.groups[1].wait_p99_ns / 1e9);
  uint64_t seat_turns = r.groups[1].turns;
  cph_sim_result_free(&r);
  printf("tenants share_err_max=%.5f seats_wait_max_s=%.3f turn_s=2.000 seat_turns=%" PRIu64
         " seed=%" PRIu64 "\n",
         worst, wait, seat_turns, seed);
  return 0;
}
