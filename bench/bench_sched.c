/* cephalon-bench sched: the scheduler's pick + finish cycle in process (DESIGN §12: at least
 * 2,000,000 a second at 100k runnable sessions; the cost at 1M within 2× of the cost at 10k).
 *
 * N sessions, spread over the three lanes, all saturated (always runnable again when their
 * turn ends). Each cycle picks up to `concurrency` sessions, then finishes them one by one
 * (one tool call each, credits charged), a virtual clock advancing 1 µs before each finish,
 * so every completion has its own instant as real ones do. Budgets are the policy maximum
 * (100,000,000 a minute, about 1.67M a second) and virtual time runs at 1M turns a second,
 * so budgets never bind: the figure is the cost of the scheduler's data structures. With
 * every lane saturated, strict lane priority serves the interactive third of the sessions.
 * One op = one pick plus its finish.
 *
 * --tenants T spreads the sessions round-robin over T tenants with weights 1, 2, 3, 4, 1, ...
 * (DESIGN §3.9), so each pick also goes through the lane's tenant heap: run.sh sets the figure
 * at 1,000 tenants beside the one without (§12: within 10%). The timed part runs at 1M picks
 * a virtual second, so the lane hands out tenant runs of --tenant-run-max picks (lanes/sched.h).
 *
 * Besides the wall clock it reports the thread's CPU time per op, which other processes on a
 * shared machine do not inflate by preempting it.
 *
 * --pair builds both schedulers (without tenants and with --tenants T) in one process and times
 * them in alternating blocks (sched_pair), for the ratio §12 judges. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"
#include "lanes/sched.h"

static void sched_usage(FILE *f) {
  fprintf(f, "usage: cephalon-bench sched [--sessions N] [--ops M] [--concurrency C] "
             "[--tenants T] [--tenant-run-max R] [--shuffle] [--pair [--rounds K]]\n"
             "  --sessions N     runnable sessions, over the three lanes (default 100000)\n"
             "  --ops M          timed pick + finish cycles (default max(2000000, 4 N))\n"
             "  --concurrency C  turns picked before they finish (default 64)\n"
             "  --tenants T      sessions spread over T weighted tenants (default 0: none)\n"
             "  --tenant-run-max R  :scheduler :tenant-run-max (default the policy's, 16;\n"
             "                   1: the exact tenant order)\n"
             "  --shuffle        session ids in a seeded random order (default: ids in the\n"
             "                   order sessions are added)\n"
             "  --pair           the same sessions without tenants and with --tenants T, both\n"
             "                   in this process, timed in K alternating blocks of M cycles\n"
             "                   (default M max(1000000, N)); prints the median of the\n"
             "                   blocks' ratios (with tenants / without, in picks/s)\n"
             "  --rounds K       --pair's blocks on each side (default 11)\n"
             "                   (prints each side's median CPU ns a cycle, and the median\n"
             "                   and quartiles of the blocks' ratios)\n");
}

/* Runs `ops` cycles; returns the number done (less only if nothing could be picked). */
static uint64_t cycles(cph_sched *s, cph_clock *clock, cph_sid *batch, uint32_t conc,
                       uint64_t ops) {
  uint64_t done = 0;
  cph_pick p;
  while (done < ops) {
    uint32_t k = 0;
    while (k < conc && done + k < ops && cph_sched_pick(s, &p) == 0)
      batch[k++] = p.sid;
    if (k == 0)
      break;
    for (uint32_t j = 0; j < k; j++) {
      cph_clock_advance(clock, 1000); /* each completion at its own instant */
      cph_sched_finish(s, batch[j], 1, true);
    }
    done += k;
  }
  return done;
}

/* One scheduler under test, with the virtual clock it reads (cph_sched_new keeps a pointer to
 * it: a bench_sched stays where it was built). */
typedef struct bench_sched {
  cph_sched *s;
  cph_clock clock;
} bench_sched;

typedef struct sched_opts {
  uint64_t n, ops, conc, n_tenants, run_max, rounds;
  bool shuffle, pair;
} sched_opts;

/* Builds b: o->n saturated sessions over the three lanes, round-robin over n_tenants weighted
 * tenants when n_tenants > 0; 0, or -1 after saying why. */
static int sched_build(bench_sched *b, const sched_opts *o, uint64_t n_tenants) {
  uint64_t n = o->n;
  cph_sched_config cfg = {
      {CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE},
      {CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE},
      1.0,
      30,
      -30,
      {2, 1, 1},
      (uint32_t)o->conc,
      0,
      {0},
      CPH_CHARGE_TURN,
      0,
      {0},
      NULL,
      0,
      (uint32_t)o->run_max};
  char(*names)[24] = n_tenants ? calloc(n_tenants, sizeof *names) : NULL;
  cph_sched_tenant_weight *weights = n_tenants ? calloc(n_tenants, sizeof *weights) : NULL;
  for (uint64_t t = 0; names && weights && t < n_tenants; t++) {
    snprintf(names[t], sizeof names[t], "t%06" PRIu64, t);
    weights[t] = (cph_sched_tenant_weight){names[t], (double)(1 + t % 4)};
  }
  cfg.tenants = weights;
  cfg.n_tenants = weights ? n_tenants : 0;
  cph_clock_init_virtual(&b->clock, 0);
  bool oom = n_tenants && (!names || !weights);
  b->s = oom ? NULL : cph_sched_new(&cfg, &b->clock);
  free(weights); /* the scheduler keeps its own copy of the weights */
  if (!b->s) {
    fprintf(stderr, "cephalon-bench sched: out of memory\n");
    free(names);
    return -1;
  }
  char id[32];
  for (uint64_t i = 0; i < n; i++) {
    cph_sid sid;
    /* --shuffle: i -> i·2654435761 mod n, a permutation (the multiplier is a prime that
     * divides no n the option accepts), so the wait order (by id) visits sessions in an
     * order unrelated to their slots, as a daemon's sessions do. */
    uint64_t num = o->shuffle ? (uint64_t)((unsigned __int128)i * 2654435761u % n) : i;
    snprintf(id, sizeof id, "s%08" PRIu64, num);
    if (cph_sched_add(b->s, id, (cph_lane)(i % CPH_LANE_COUNT), &sid) ||
        (n_tenants && cph_sched_set_tenant(b->s, sid, names[(i / CPH_LANE_COUNT) % n_tenants]))) {
      fprintf(stderr, "cephalon-bench sched: cannot add session %" PRIu64 "\n", i);
      free(names);
      cph_sched_free(b->s);
      b->s = NULL;
      return -1;
    }
    cph_sched_set_work(b->s, sid, true);
  }
  free(names); /* the scheduler copied each name once */
  return 0;
}

static double thread_cpu_ns(void) {
  struct timespec c;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
  return (double)c.tv_sec * 1e9 + (double)c.tv_nsec;
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, uint64_t n) {
  qsort(v, n, sizeof *v, dbl_cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* --pair: the scheduler without tenants (A) and the one with --tenants T (B), both in this
 * process, timed in alternating blocks of --ops cycles (A then B, then B then A, ...), each
 * block on the thread's CPU clock. A slow spell of a shared machine — which lasts longer than
 * a block — then slows both sides of a round alike, where separate runs a minute apart would
 * each catch a different one (bench/run.sh's pairs measured 0.488 and 1.166 for the same
 * code). The figure: the median over rounds of A's CPU ns per cycle over B's, which is B's
 * picks/s over A's. */
static int sched_pair(const sched_opts *o) {
  bench_sched ab[2];
  if (sched_build(&ab[0], o, 0))
    return 1;
  if (sched_build(&ab[1], o, o->n_tenants)) {
    cph_sched_free(ab[0].s);
    return 1;
  }
  cph_sid *batch = malloc(o->conc * sizeof *batch);
  double *ns[2] = {calloc(o->rounds, sizeof(double)), calloc(o->rounds, sizeof(double))};
  double *ratio = calloc(o->rounds, sizeof(double));
  int rc = 1;
  if (!batch || !ns[0] || !ns[1] || !ratio) {
    fprintf(stderr, "cephalon-bench sched: out of memory\n");
    goto out;
  }
  for (int k = 0; k < 2; k++) /* warm-up, as the single run's */
    if (cycles(ab[k].s, &ab[k].clock, batch, (uint32_t)o->conc, o->n) < o->n) {
      fprintf(stderr, "cephalon-bench sched: the warm-up could not pick\n");
      goto out;
    }
  for (uint64_t r = 0; r < o->rounds; r++) {
    for (int j = 0; j < 2; j++) {
      int k = (int)(r % 2) ^ j;
      double c0 = thread_cpu_ns();
      uint64_t done = cycles(ab[k].s, &ab[k].clock, batch, (uint32_t)o->conc, o->ops);
      double c1 = thread_cpu_ns();
      if (done < o->ops) {
        fprintf(stderr, "cephalon-bench sched: only %" PRIu64 " of %" PRIu64 " picks\n", done,
                o->ops);
        goto out;
      }
      ns[k][r] = (c1 - c0) / (double)done;
    }
    ratio[r] = ns[0][r] / ns[1][r];
  }
  printf("rounds             %" PRIu64 " of %" PRIu64 " cycles on each side\n", o->rounds, o->ops);
  printf("ratios             ");
  for (uint64_t r = 0; r < o->rounds; r++)
    printf("%s%.3f", r ? "/" : "", ratio[r]);
  printf("\n");
  double med = median(ratio, o->rounds); /* sorts ratio */
  double q1 = ratio[o->rounds / 4], q3 = ratio[(3 * o->rounds) / 4];
  double a = median(ns[0], o->rounds), b = median(ns[1], o->rounds);
  printf("sched-pair sessions=%" PRIu64 " tenants=%" PRIu64 " rounds=%" PRIu64
         " plain_cpu_ns_per_op=%.1f tenant_cpu_ns_per_op=%.1f ratio=%.3f ratio_q1=%.3f"
         " ratio_q3=%.3f\n",
         o->n, o->n_tenants, o->rounds, a, b, med, q1, q3);
  rc = 0;
out:
  free(batch);
  free(ns[0]);
  free(ns[1]);
  free(ratio);
  cph_sched_free(ab[0].s);
  cph_sched_free(ab[1].s);
  return rc;
}

int cph_bench_sched(int argc, char **argv) {
  sched_opts o = {.n = 100000, .conc = 64, .run_max = CPH_SCHED_TENANT_RUN_DEFAULT, .rounds = 11};
  for (int i = 1; i < argc;) {
    bool *flag = strcmp(argv[i], "--shuffle") == 0 ? &o.shuffle
                 : strcmp(argv[i], "--pair") == 0  ? &o.pair
                                                   : NULL;
    if (flag) {
      *flag = true;
      i++;
      continue;
    }
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      sched_usage(stdout);
      return 0;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--sessions", 1, 100000000, &o.n)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--ops", 1, UINT64_MAX, &o.ops)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--concurrency", 1, 1000000, &o.conc)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--tenants", 0, 1000000, &o.n_tenants)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--rounds", 1, 1000, &o.rounds)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--tenant-run-max", 1, CPH_SCHED_TENANT_RUN_LIMIT,
                               &o.run_max))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench sched: unknown option \"%s\"\n", argv[i]);
    sched_usage(stderr);
    return 2;
  }
  if (o.pair) {
    if (!o.n_tenants) {
      fprintf(stderr, "cephalon-bench sched: --pair compares against --tenants T (T > 0)\n");
      return 2;
    }
    if (!o.ops)
      o.ops = o.n > 1000000 ? o.n : 1000000;
    return sched_pair(&o);
  }
  if (!o.ops)
    o.ops = 4 * o.n > 2000000 ? 4 * o.n : 2000000;

  bench_sched b;
  int64_t t0 = cph_bench_now_ns();
  if (sched_build(&b, &o, o.n_tenants))
    return 1;
  cph_sched *s = b.s;
  cph_sid *batch = malloc(o.conc * sizeof *batch);
  if (!batch) {
    fprintf(stderr, "cephalon-bench sched: out of memory\n");
    cph_sched_free(s);
    return 1;
  }
  int64_t t1 = cph_bench_now_ns();

  /* Warm up: every session of the lane being served cycles once, so the timed part sees
   * the steady state (credits charged, sets in their saturated shape). */
  uint64_t warm = cycles(s, &b.clock, batch, (uint32_t)o.conc, o.n);
  double c2 = thread_cpu_ns();
  int64_t t2 = cph_bench_now_ns();
  uint64_t done = cycles(s, &b.clock, batch, (uint32_t)o.conc, o.ops);
  int64_t t3 = cph_bench_now_ns();
  double cpu_ns = thread_cpu_ns() - c2;
  if (done < o.ops || warm < o.n) {
    fprintf(stderr, "cephalon-bench sched: only %" PRIu64 " of %" PRIu64 " picks succeeded\n", done,
            o.ops);
    free(batch);
    cph_sched_free(s);
    return 1;
  }

  double secs = (double)(t3 - t2) / 1e9;
  double ops_per_s = (double)done / secs;
  double ns_per_op = (double)(t3 - t2) / (double)done;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("sessions           %" PRIu64 " (runnable, over 3 lanes)\n", o.n);
  printf("tenants            %" PRIu64 "%s\n", o.n_tenants, o.n_tenants ? " (weights 1-4)" : "");
  printf("concurrency        %" PRIu64 "\n", o.conc);
  printf("setup              %.3f s (add + set_work)\n", (double)(t1 - t0) / 1e9);
  printf("warm-up cycles     %" PRIu64 " in %.3f s\n", warm, (double)(t2 - t1) / 1e9);
  printf("timed cycles       %" PRIu64 " in %.3f s\n", done, secs);
  for (int l = 0; l < CPH_LANE_COUNT; l++) {
    cph_lane_stats st;
    cph_sched_lane_stats(s, (cph_lane)l, &st);
    printf("lane %-13s started %" PRIu64 ", runnable %" PRIu64 ", tenant runs of %u\n",
           cph_lane_name((cph_lane)l), st.started_total, st.runnable, st.tenant_run);
  }
  printf("max rss            %ld KiB\n", ru.ru_maxrss);
  printf("sched sessions=%" PRIu64 " tenants=%" PRIu64 " ops_per_s=%.0f ns_per_op=%.1f "
         "cpu_ns_per_op=%.1f\n",
         o.n, o.n_tenants, ops_per_s, ns_per_op, cpu_ns / (double)done);
  free(batch);
  cph_sched_free(s);
  return 0;
}
