/* cephalon-bench: scenarios. Each scenario takes its own argv (argv[0] is the scenario name),
 * prints its figures and ends with exactly one line `SCENARIO key=value ...` (DESIGN §1).
 * It returns the process exit status: 0, 1 on failure, 2 on a usage error. */
#ifndef CEPHALON_BENCH_BENCH_H
#define CEPHALON_BENCH_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include <stddef.h>

int cph_bench_sched(int argc, char **argv);
int cph_bench_ingest(int argc, char **argv);
int cph_bench_cycle(int argc, char **argv);
int cph_bench_beanstalkd(int argc, char **argv);
int cph_bench_redis(int argc, char **argv);
int cph_bench_memory(int argc, char **argv);
int cph_bench_fairness(int argc, char **argv);
int cph_bench_spam(int argc, char **argv);
int cph_bench_maintenance(int argc, char **argv);
int cph_bench_tenants(int argc, char **argv);
int cph_bench_worker(int argc, char **argv);
int cph_bench_console(int argc, char **argv);
int cph_bench_backup(int argc, char **argv);
int cph_bench_cluster_fill(int argc, char **argv);
int cph_bench_history_copies(int argc, char **argv);

/* Creates n idle interactive sessions ("idle-0000000", ...) in the store at data, through an
 * engine in process opened with policy_text (bench_memory.c). 0 or -1. */
int cph_bench_fill_sessions(const char *policy_text, const char *data, uint64_t n);

/* Option helpers for scenarios: `--name VALUE` or `--name=VALUE`. If argv[*i] is the option,
 * parses its value (advancing *i past it) and returns 1; returns 0 if argv[*i] is another
 * option; -1 (after printing why) if the value is missing or not a number in [min, max]. */
int cph_bench_opt_u64(int argc, char **argv, int *i, const char *name, uint64_t min,
                      uint64_t max, uint64_t *out);

/* A monotonic wall-clock reading in nanoseconds, for measuring. */
int64_t cph_bench_now_ns(void);

/* splitmix64 over *state: the bench's deterministic pseudo-random numbers. */
uint64_t cph_bench_rand(uint64_t *state);
/* Writes a NUL-terminated body of `len` bytes into out (len + 1 bytes): a unique hex tag,
 * then pseudo-words from rng, so bodies are neither exact nor near duplicates (DESIGN §5).
 * JSON-safe (letters, digits, spaces). Returns its length. */
size_t cph_bench_body(char *out, size_t len, uint64_t tag, uint64_t *rng);

#endif
