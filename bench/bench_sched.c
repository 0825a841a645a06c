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
 * shared machine do not inflate by preempting it. */
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
             "[--tenants T] [--tenant-run-max R] [--shuffle]\n"
             "  --sessions N     runnable sessions, over the three lanes (default 100000)\n"
             "  --ops M          timed pick + finish cycles (default max(2000000, 4 N))\n"
             "  --concurrency C  turns picked before they finish (default 64)\n"
             "  --tenants T      sessions spread over T weighted tenants (default 0: none)\n"
             "  --tenant-run-max R  :scheduler :tenant-run-max (default the policy's, 16;\n"
             "                   1: the exact tenant order)\n"
             "  --shuffle        session ids in a seeded random order (default: ids in the\n"
             "                   order sessions are added)\n");
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

int cph_bench_sched(int argc, char **argv) {
  uint64_t n = 100000, ops = 0, conc = 64, n_tenants = 0;
  uint64_t run_max = CPH_SCHED_TENANT_RUN_DEFAULT; /* the policy's :scheduler :tenant-run-max */
  bool shuffle = false;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--shuffle") == 0) {
      shuffle = true;
      i++;
      continue;
    }
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      sched_usage(stdout);
      return 0;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--sessions", 1, 100000000, &n)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--ops", 1, UINT64_MAX, &ops)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--concurrency", 1, 1000000, &conc)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--tenants", 0, 1000000, &n_tenants)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--tenant-run-max", 1, CPH_SCHED_TENANT_RUN_LIMIT,
                               &run_max))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench sched: unknown option \"%s\"\n", argv[i]);
    sched_usage(stderr);
    return 2;
  }
  if (!ops)
    ops = 4 * n > 2000000 ? 4 * n : 2000000;

  cph_sched_config cfg = {
      {CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE},
      {CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE, CPH_SCHED_MAX_PER_MINUTE},
      1.0,
      30,
      -30,
      {2, 1, 1},
      (uint32_t)conc,
      0,
      {0},
      CPH_CHARGE_TURN,
      0,
      {0},
      NULL,
      0,
      (uint32_t)run_max};
  char(*names)[24] = n_tenants ? calloc(n_tenants, sizeof *names) : NULL;
  cph_sched_tenant_weight *weights = n_tenants ? calloc(n_tenants, sizeof *weights) : NULL;
  for (uint64_t t = 0; names && weights && t < n_tenants; t++) {
    snprintf(names[t], sizeof names[t], "t%06" PRIu64, t);
    weights[t] = (cph_sched_tenant_weight){names[t], (double)(1 + t % 4)};
  }
  cfg.tenants = weights;
  cfg.n_tenants = weights ? n_tenants : 0;
  cph_clock clock;
  cph_clock_init_virtual(&clock, 0);
  bool oom = n_tenants && (!names || !weights);
  cph_sched *s = oom ? NULL : cph_sched_new(&cfg, &clock);
  free(weights); /* the scheduler keeps its own copy of the weights */
  cph_sid *batch = malloc(conc * sizeof *batch);
  if (!s || !batch) {
    fprintf(stderr, "cephalon-bench sched: out of memory\n");
    free(batch);
    free(names);
    cph_sched_free(s);
    return 1;
  }

  int64_t t0 = cph_bench_now_ns();
  char id[32];
  for (uint64_t i = 0; i < n; i++) {
    cph_sid sid;
    /* --shuffle: i -> i·2654435761 mod n, a permutation (the multiplier is a prime that
     * divides no n the option accepts), so the wait order (by id) visits sessions in an
     * order unrelated to their slots, as a daemon's sessions do. */
    uint64_t num = shuffle ? (uint64_t)((unsigned __int128)i * 2654435761u % n) : i;
    snprintf(id, sizeof id, "s%08" PRIu64, num);
    if (cph_sched_add(s, id, (cph_lane)(i % CPH_LANE_COUNT), &sid) ||
        (n_tenants && cph_sched_set_tenant(s, sid, names[(i / CPH_LANE_COUNT) % n_tenants]))) {
      fprintf(stderr, "cephalon-bench sched: cannot add session %" PRIu64 "\n", i);
      free(batch);
      free(names);
      cph_sched_free(s);
      return 1;
    }
    cph_sched_set_work(s, sid, true);
  }
  int64_t t1 = cph_bench_now_ns();
  free(names); /* the scheduler copied each name once */
  names = NULL;

  /* Warm up: every session of the lane being served cycles once, so the timed part sees
   * the steady state (credits charged, sets in their saturated shape). */
  uint64_t warm = cycles(s, &clock, batch, (uint32_t)conc, n);
  struct timespec c2, c3;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c2);
  int64_t t2 = cph_bench_now_ns();
  uint64_t done = cycles(s, &clock, batch, (uint32_t)conc, ops);
  int64_t t3 = cph_bench_now_ns();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c3);
  double cpu_ns = (double)(c3.tv_sec - c2.tv_sec) * 1e9 + (double)(c3.tv_nsec - c2.tv_nsec);
  if (done < ops || warm < n) {
    fprintf(stderr, "cephalon-bench sched: only %" PRIu64 " of %" PRIu64 " picks succeeded\n", done,
            ops);
    free(batch);
    cph_sched_free(s);
    return 1;
  }

  double secs = (double)(t3 - t2) / 1e9;
  double ops_per_s = (double)done / secs;
  double ns_per_op = (double)(t3 - t2) / (double)done;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("sessions           %" PRIu64 " (runnable, over 3 lanes)\n", n);
  printf("tenants            %" PRIu64 "%s\n", n_tenants, n_tenants ? " (weights 1-4)" : "");
  printf("concurrency        %" PRIu64 "\n", conc);
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
         n, n_tenants, ops_per_s, ns_per_op, cpu_ns / (double)done);
  free(batch);
  cph_sched_free(s);
  return 0;
}
