/* cephalon-bench: scenarios. Each scenario takes its own argv (argv[0] is the scenario name),
 * prints its figures and ends with exactly one line `SCENARIO key=value ...` (DESIGN §1).
 * It returns the process exit status: 0, 1 on failure, 2 on a usage error. */
#ifndef CEPHALON_BENCH_BENCH_H
#define CEPHALON_BENCH_BENCH_H

#include <stdbool.h>
#include <stdint.h>

int cph_bench_sched(int argc, char **argv);

/* Option helpers for scenarios: `--name VALUE` or `--name=VALUE`. If argv[*i] is the option,
 * parses its value (advancing *i past it) and returns 1; returns 0 if argv[*i] is another
 * option; -1 (after printing why) if the value is missing or not a number in [min, max]. */
int cph_bench_opt_u64(int argc, char **argv, int *i, const char *name, uint64_t min,
                      uint64_t max, uint64_t *out);

/* A monotonic wall-clock reading in nanoseconds, for measuring. */
int64_t cph_bench_now_ns(void);

#endif
