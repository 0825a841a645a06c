/* cephalon-bench: the servers a scenario starts (cephalond, beanstalkd, redis-server), their
 * temp dirs, and cleaning up after them.
 *
 * Contract: every process started here and every temp dir made here is registered; a
 * scenario stops and removes its own, and whatever is still registered at exit is killed
 * (SIGKILL) and removed by an atexit handler. On SIGINT/SIGTERM/SIGHUP the bench kills its
 * children, removes its temp dirs and exits at once. A child also gets SIGKILL if the bench
 * dies any other way (PR_SET_PDEATHSIG), so no server outlives it; bench/run.sh points
 * TMPDIR at a work dir it removes too. Servers listen on 127.0.0.1 only. */
#ifndef CEPHALON_BENCH_PROC_H
#define CEPHALON_BENCH_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Installs the signal and exit handlers (main calls it once). */
void cph_bench_proc_init(void);

/* A fresh directory $TMPDIR/cephalon-bench-TAG.XXXXXX (malloc'd path), registered for
 * removal; NULL on failure. */
char *cph_bench_tmpdir(const char *tag);
/* Removes a tree made by cph_bench_tmpdir and unregisters it; frees path. */
void cph_bench_tmpdir_remove(char *path);

/* Starts argv[0] (a path, or a name looked up in PATH) with stdout and stderr to log_path.
 * Returns the pid (registered) or -1. */
pid_t cph_bench_spawn(const char *const *argv, const char *log_path);
/* Sends sig, waits up to timeout_ms (then SIGKILL), reaps, unregisters. Returns the exit
 * status, 128 + signal, or -1. */
int cph_bench_stop(pid_t pid, int sig, int timeout_ms);
/* True while pid runs (reaps it if it exited; then unregisters it). */
bool cph_bench_alive(pid_t pid);

/* The path of a Cephalon command: $CPH_BIN_DIR/NAME, else next to cephalon-bench, else
 * build/bin/NAME. malloc'd. */
char *cph_bench_bin(const char *name);

/* ---- cephalond ---- */

typedef struct cph_bench_daemon {
  pid_t pid;
  int port;
  char *dir;      /* temp dir: policy.edn, data/, log */
  char *data_dir; /* dir/data unless given */
  char *log_path;
  int64_t ready_ns; /* from spawn to its ready line */
  /* Its CPU time (user + system, 10 ms ticks) when the ready line was seen: what the start
   * cost, much less moved by other load on the machine than ready_ns; -1 if unknown. */
  int64_t ready_cpu_ns;
} cph_bench_daemon;

/* Writes policy_text to DIR/policy.edn and starts cephalond on 127.0.0.1:0 with data in
 * DIR/data (or data_dir when non-NULL: kept by stop), waiting up to timeout_ms for its ready
 * line. 0, or -1 with its log on stderr. */
int cph_bench_daemon_start(cph_bench_daemon *d, const char *policy_text, const char *data_dir,
                           int timeout_ms);
/* Restarts a stopped daemon on the same dir and data; ready_ns is measured again. */
int cph_bench_daemon_restart(cph_bench_daemon *d, int timeout_ms);
/* SIGTERM and wait (stop only; the dir stays). Exit status or -1. */
int cph_bench_daemon_stop(cph_bench_daemon *d);
/* Stops if running and removes the temp dir. */
void cph_bench_daemon_free(cph_bench_daemon *d);
/* Resident set of a process in bytes (VmRSS; anon_out: RssAnon), from /proc. -1 on failure. */
int64_t cph_bench_rss(pid_t pid, int64_t *anon_out);
/* User + system CPU time of a process, all its threads, in ns (10 ms ticks), from
 * /proc/PID/stat; -1 on failure. */
int64_t cph_bench_cpu_ns(pid_t pid);

/* The policy the daemon scenarios run with (EDN, written into buf; -1 if it does not fit):
 * :store :sync `sync` ("always", "batch" or "none"); :concurrency `concurrency`; interactive
 * and operational budgets at the maximum (so the figure is the engine's cost, not a budget);
 * the maintenance lane at `maint_turns_per_minute` with the outbox trickle at
 * `trickle_per_minute`; backpressure never degrades (:max-step 0), so every event takes the
 * full ingest path; a map large enough for the run; log level info (the ready line). `extra` is EDN placed
 * inside the top-level map (keys not set above), or NULL. */
int cph_bench_policy(char *buf, size_t cap, const char *sync, int concurrency,
                     int maint_turns_per_minute, int trickle_per_minute, const char *extra);

/* ---- anchors ---- */

typedef struct cph_bench_server {
  pid_t pid;
  int port;
  char *dir; /* temp dir: data and log */
} cph_bench_server;

/* beanstalkd on 127.0.0.1, in memory, or with its binlog in the temp dir and an fsync after
 * every write (-b DIR -f 0). */
int cph_bench_beanstalkd_start(cph_bench_server *s, bool fsync_every_op);
/* redis-server on 127.0.0.1 with no persistence, or appendonly yes + appendfsync always. */
int cph_bench_redis_start(cph_bench_server *s, bool appendfsync_always);
/* Stops it and removes its temp dir. */
void cph_bench_server_stop(cph_bench_server *s);

#endif
