/* cephalon-bench SCENARIO [options]: in-process and side-by-side benchmarks (DESIGN §12).
 * Scenarios live in a table; a new one is a function in its own file plus one row here. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "proc.h"

typedef struct scenario {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
} scenario;

static const scenario scenarios[] = {
    {"sched", "pick + finish cycles in process on N saturated sessions (--sessions N [--ops M])",
     cph_bench_sched},
    {"ingest", "durable ingest over HTTP against cephalond, 1,000 events per request",
     cph_bench_ingest},
    {"cycle", "post 1 event -> lease -> complete over HTTP, 8 clients (--sync always|none)",
     cph_bench_cycle},
    {"beanstalkd", "anchor: put -> reserve -> delete, 8 clients (--mode memory|fsync)",
     cph_bench_beanstalkd},
    {"redis",
     "anchor: LPUSH -> RPOP, or the agent app (--work agent), 8 clients (--mode none|always)",
     cph_bench_redis},
    {"fairness", "Jain's index over equal saturated sessions (lanes/sim, virtual time)",
     cph_bench_fairness},
    {"spam", "one channel at 100x: quiet sessions' p99 pick wait vs no spam (lanes/sim)",
     cph_bench_spam},
    {"maintenance", "outbox trickle under full interactive load and compaction (lanes/sim)",
     cph_bench_maintenance},
    {"tenants", "tenant shares by weight and seats coming back (lanes/sim, DESIGN §3.9-3.10)",
     cph_bench_tenants},
    {"memory", "RSS per idle session and restart to ready (--sessions N --events M)",
     cph_bench_memory},
    {"worker", "cephalon-worker's own cost per turn against an instant model (--concurrency N)",
     cph_bench_worker},
    {"console", "the web console's pages' API calls at N sessions (--sessions N)",
     cph_bench_console},
    {"backup", "online backup of a store of N MiB: time, and the daemon's latency meanwhile "
               "(--mb N)",
     cph_bench_backup},
    {"history-copies",
     "a cluster node's cost to apply copies into a channel's history, in process "
     "(--history N --copies K --batch B)",
     cph_bench_history_copies},
    {"cluster-fill",
     "a running cluster's shard with N sessions and M unconsumed events, for "
     "bench/cluster-takeover.sh (--nodes P,P,P --victim P)",
     cph_bench_cluster_fill},
};

#define N_SCENARIOS (sizeof scenarios / sizeof scenarios[0])

static void usage(FILE *f) {
  fprintf(f, "usage: cephalon-bench SCENARIO [options]\n"
             "       cephalon-bench SCENARIO --help\n\n"
             "Each scenario ends with one line `SCENARIO key=value ...`.\n\nscenarios:\n");
  for (size_t i = 0; i < N_SCENARIOS; i++)
    fprintf(f, "  %-10s %s\n", scenarios[i].name, scenarios[i].summary);
}

int cph_bench_opt_u64(int argc, char **argv, int *i, const char *name, uint64_t min,
                      uint64_t max, uint64_t *out) {
  const char *arg = argv[*i];
  size_t len = strlen(name);
  const char *value;
  if (strncmp(arg, name, len) != 0)
    return 0;
  if (arg[len] == '=') {
    value = arg + len + 1;
  } else if (arg[len] == '\0') {
    if (*i + 1 >= argc) {
      fprintf(stderr, "cephalon-bench: %s needs a value\n", name);
      return -1;
    }
    value = argv[++*i];
  } else {
    return 0;
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(value, &end, 10);
  if (errno || end == value || *end || value[0] == '-' || v < min || v > max) {
    fprintf(stderr, "cephalon-bench: %s: expected a number from %" PRIu64 " to %" PRIu64
                    ", got \"%s\"\n",
            name, min, max, value);
    return -1;
  }
  *out = v;
  (*i)++;
  return 1;
}

int64_t cph_bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < N_SCENARIOS; i++)
    if (strcmp(argv[1], scenarios[i].name) == 0) {
      cph_bench_proc_init();
      setvbuf(stdout, NULL, _IOLBF, 0);
      return scenarios[i].run(argc - 1, argv + 1);
    }
  fprintf(stderr, "cephalon-bench: unknown scenario \"%s\"\n\n", argv[1]);
  usage(stderr);
  return 2;
}
