/* cephalon-bench backup — the online backup of a store of --mb MiB (default 1024): how long
 * the copy takes, and what it does to the daemon's latency meanwhile (issue #18: "backup of a
 * 1 GiB store: time and the daemon's latency while it runs").
 *
 * Fills the store with 1 KiB events (1,000 per request), then a probe client posts one event
 * per request for --seconds before the backup and throughout it; the summary compares the
 * probe's p50/p99 in the two phases. The daemon and the copy live in the bench's temp dir. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "net.h"
#include "proc.h"

#define FILL_EVENTS 1000
#define BODY_BYTES 1024

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile of v (sorted in place), in ms. */
static double quantile_ms(int64_t *v, size_t n, double q) {
  if (!n)
    return 0;
  qsort(v, n, sizeof *v, cmp_i64);
  size_t i = (size_t)(q * (double)(n - 1));
  return (double)v[i] / 1e6;
}

/* One request of `n` events of BODY_BYTES on channel "fill", bodies distinct per seq. */
static size_t events_body(char *buf, size_t cap, int n, uint64_t seq, uint64_t *rng) {
  size_t len = (size_t)snprintf(buf, cap, "{\"events\":[");
  char body[BODY_BYTES + 1];
  for (int i = 0; i < n; i++) {
    cph_bench_body(body, BODY_BYTES, seq * FILL_EVENTS + (uint64_t)i, rng);
    len += (size_t)snprintf(buf + len, cap - len,
                            "%s{\"channel\":\"fill\",\"sender\":\"bench\",\"body\":\"%s\"}",
                            i ? "," : "", body);
  }
  len += (size_t)snprintf(buf + len, cap - len, "]}");
  return len;
}

/* Probes for `seconds` (or, with until_done, until the backup is no longer running), keeping
 * each request's latency in lat (*n of them, up to cap). */
static int probe(cph_bench_conn *c, cph_bench_conn *status, double seconds, bool until_done,
                 int64_t *lat, size_t cap, size_t *n, uint64_t *seq, uint64_t *rng) {
  char buf[BODY_BYTES + 256];
  int64_t end = cph_bench_now_ns() + (int64_t)(seconds * 1e9);
  for (int k = 0;; k++) {
    if (!until_done && cph_bench_now_ns() >= end)
      return 0;
    if (until_done && k % 10 == 0) {
      cph_bench_resp r;
      if (cph_bench_http(status, "GET", "/v1/admin/backup", NULL, 0, &r) || r.status != 200)
        return -1;
      if (!strstr(r.body, "\"running\""))
        return strstr(r.body, "\"done\"") ? 0 : -1;
    }
    size_t len = events_body(buf, sizeof buf, 1, (*seq)++, rng);
    int64_t t0 = cph_bench_now_ns();
    cph_bench_resp r;
    if (cph_bench_http(c, "POST", "/v1/events", buf, len, &r) || r.status != 200)
      return -1;
    if (*n < cap)
      lat[(*n)++] = cph_bench_now_ns() - t0;
  }
}

static void usage(FILE *f) {
  fprintf(f, "usage: cephalon-bench backup [--mb N] [--seconds S]\n"
             "  --mb N       store size to back up, in MiB of events (default 1024)\n"
             "  --seconds S  probe seconds before the backup (default 3)\n");
}

int cph_bench_backup(int argc, char **argv) {
  uint64_t mb = 1024, seconds = 3;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--mb", 1, 65536, &mb)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 1, 600, &seconds))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench backup: bad option \"%s\"\n", argv[i]);
    usage(stderr);
    return 2;
  }
  char policy[2048];
  if (cph_bench_policy(policy, sizeof policy, "batch", 64, 10, 1, ":dedupe {:min-length 1000000}"))
    return 1;
  cph_bench_daemon d;
  if (cph_bench_daemon_start(&d, policy, NULL, 20000)) {
    cph_bench_daemon_free(&d);
    return 1;
  }
  int status = 1;
  cph_bench_conn c = CPH_BENCH_CONN_INIT, st = CPH_BENCH_CONN_INIT;
  size_t cap = (size_t)FILL_EVENTS * (BODY_BYTES + 80) + 64;
  char *buf = malloc(cap);
  int64_t *before = calloc(1000000, sizeof *before), *during = calloc(1000000, sizeof *during);
  uint64_t rng = 42, seq = 0;
  size_t n_before = 0, n_during = 0;
  if (!buf || !before || !during || cph_bench_conn_open(&c, d.port))
    goto out;

  /* Fill: events of 1 KiB until the store's used bytes reach mb MiB. */
  int64_t t_fill = cph_bench_now_ns();
  for (;;) {
    cph_bench_resp r;
    if (cph_bench_http(&c, "GET", "/metrics", NULL, 0, &r) || r.status != 200) {
      fprintf(stderr, "cephalon-bench backup: GET /metrics failed\n");
      goto out;
    }
    const char *used = strstr(r.body, "\ncephalon_lmdb_used_bytes ");
    if (used && strtod(used + 26, NULL) >= (double)(mb << 20))
      break;
    size_t len = events_body(buf, cap, FILL_EVENTS, seq++, &rng);
    if (cph_bench_http(&c, "POST", "/v1/events", buf, len, &r) || r.status != 200) {
      fprintf(stderr, "cephalon-bench backup: fill: %d %.200s\n", r.status, r.body);
      goto out;
    }
  }
  double fill_s = (double)(cph_bench_now_ns() - t_fill) / 1e9;
  /* Opened now: a connection idle past :server :header-timeout-seconds would be closed. */
  if (cph_bench_conn_open(&st, d.port))
    goto out;

  if (probe(&c, &st, (double)seconds, false, before, 1000000, &n_before, &seq, &rng)) {
    fprintf(stderr, "cephalon-bench backup: the probe failed\n");
    goto out;
  }
  char req[4400];
  int rl = snprintf(req, sizeof req, "{\"dir\":\"%s/backup\"}", d.dir);
  cph_bench_resp r;
  int64_t t0 = cph_bench_now_ns();
  if (cph_bench_http(&st, "POST", "/v1/admin/backup", req, (size_t)rl, &r) || r.status != 202) {
    fprintf(stderr, "cephalon-bench backup: start: %d %.200s\n", r.status, r.body);
    goto out;
  }
  if (probe(&c, &st, 0, true, during, 1000000, &n_during, &seq, &rng)) {
    fprintf(stderr, "cephalon-bench backup: the backup failed or the probe did\n");
    goto out;
  }
  double backup_s = (double)(cph_bench_now_ns() - t0) / 1e9;
  uint64_t bytes = 0;
  if (cph_bench_http(&st, "GET", "/v1/admin/backup", NULL, 0, &r) || r.status != 200 ||
      cph_bench_json_u64(r.body, "bytes", &bytes)) {
    fprintf(stderr, "cephalon-bench backup: GET /v1/admin/backup failed\n");
    goto out;
  }
  double b50 = quantile_ms(before, n_before, 0.5), b99 = quantile_ms(before, n_before, 0.99);
  double d50 = quantile_ms(during, n_during, 0.5), d99 = quantile_ms(during, n_during, 0.99);
  printf("store              %" PRIu64 " MiB of 1 KiB events, filled in %.1f s\n", mb, fill_s);
  printf("backup             %.2f s, %.1f MiB written (compacted), %.0f MiB/s\n", backup_s,
         (double)bytes / 1048576.0, (double)bytes / 1048576.0 / backup_s);
  printf("probe (1 event)    before: p50 %.2f ms p99 %.2f ms (%zu requests); during: p50 %.2f "
         "ms p99 %.2f ms (%zu requests)\n",
         b50, b99, n_before, d50, d99, n_during);
  printf("backup store_mb=%" PRIu64 " seconds=%.2f bytes=%" PRIu64 " mb_per_s=%.0f "
         "probe_p50_ms_before=%.2f probe_p99_ms_before=%.2f probe_p50_ms_during=%.2f "
         "probe_p99_ms_during=%.2f\n",
         mb, backup_s, bytes, (double)bytes / 1048576.0 / backup_s, b50, b99, d50, d99);
  status = 0;
out:
  cph_bench_conn_free(&c);
  cph_bench_conn_free(&st);
  free(buf);
  free(before);
  free(during);
  cph_bench_daemon_free(&d);
  return status;
}
