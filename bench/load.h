/* cephalon-bench: closed-loop load from N client threads (each with its own connection).
 *
 * Each thread calls `op` in a loop. The run is: warm-up, then the measured window, then
 * stop; every thread stops at the end of the window or after max_ops_per_client ops,
 * whichever is first, and an op that fails stops its thread (counted in errors). Throughput
 * and latency percentiles count only ops that completed inside the measured window. */
#ifndef CEPHALON_BENCH_LOAD_H
#define CEPHALON_BENCH_LOAD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cph_bench_load {
  int clients;
  double warmup_s;
  double seconds; /* the measured window */
  uint64_t max_ops_per_client; /* 0 = no cap besides time */
  /* Per thread: opens what the thread needs into *state. 0 or -1 (the run fails). */
  int (*setup)(void *ctx, int client, void **state);
  /* One closed-loop operation (for example one put+reserve+delete). 0 or -1. */
  int (*op)(void *state, uint64_t seq);
  void (*teardown)(void *state);
  void *ctx;
  /* Optional, on the main thread: called with end false just before the measured window
   * opens and with end true just after it closed (clients may still be finishing an op), so
   * a scenario can read a server's CPU time or counters over the window. */
  void (*window)(void *ctx, bool end);
} cph_bench_load;

typedef struct cph_bench_load_result {
  uint64_t ops;     /* completed in the measured window */
  uint64_t errors;  /* failed ops (each ends its thread) */
  double seconds;   /* the measured window as it really ran */
  double ops_per_s;
  double lat_p50_us, lat_p99_us, lat_max_us; /* per op, measured window */
} cph_bench_load_result;

/* True once the running load's measured window ended: an op waiting for something that
 * other clients would have caused (a turn, a job) may give up and return 0 (it is not
 * counted). One load runs at a time. */
bool cph_bench_load_stopping(void);

/* Runs the load. 0, or -1 when a setup failed or a thread could not start. */
int cph_bench_load_run(const cph_bench_load *l, cph_bench_load_result *out);

#endif
