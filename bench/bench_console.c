/* cephalon-bench console: how fast the web console's pages answer at N sessions (issue #18:
 * "console pages answer within 100 ms at 100k sessions").
 *
 * 1. An engine in process creates N idle sessions (cph_bench_fill_sessions).
 * 2. cephalond starts on that store; over HTTP one more session gets a context node with a TTL
 *    and TURNS inbox turns (post, lease, complete), so it has kept contexts and replies.
 * 3. Every API call a console page makes (and the console's own files) is timed TRIES times,
 *    one at a time on a kept-alive connection: the median and the slowest, in ms. A page
 *    makes its calls at once, so it answers in about its slowest call.
 * Ends with `console sessions=N worst_median_ms=... worst_max_ms=... within_100ms=yes|no`. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "net.h"
#include "proc.h"

#define TURNS 5
#define TRIES 30

static int call(cph_bench_conn *c, const char *method, const char *path, const char *body,
                cph_bench_resp *r) {
  if (cph_bench_http(c, method, path, body, body ? strlen(body) : 0, r) || r->status != 200) {
    fprintf(stderr, "cephalon-bench console: %s %s: %d %s\n", method, path, r->status,
            r->body ? r->body : "");
    return -1;
  }
  return 0;
}

/* One inbox turn of session "console"; its id into *id. */
static int turn(cph_bench_conn *c, int i, uint64_t *id) {
  char body[256], lease[40], path[64];
  cph_bench_resp r;
  snprintf(body, sizeof body,
           "{\"events\":[{\"channel\":\"console-chan\",\"sender\":\"ann\",\"body\":\"question %d\"}]}", i);
  if (call(c, "POST", "/v1/events", body, &r) ||
      call(c, "POST", "/v1/turns/lease", "{\"worker\":\"bench\",\"wait_ms\":5000}", &r) ||
      cph_bench_json_u64(r.body, "id", id) || cph_bench_json_str(r.body, "lease", lease, sizeof lease))
    return -1;
  snprintf(path, sizeof path, "/v1/turns/%" PRIu64 "/complete", *id);
  snprintf(body, sizeof body,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":10,\"tool_calls\":0},\"reply\":{\"body\":\"answer %d\"}}",
           lease, i);
  return call(c, "POST", path, body, &r);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

int cph_bench_console(int argc, char **argv) {
  uint64_t n = 100000;
  for (int i = 1; i < argc;) {
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--sessions", 1, 10000000, &n))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "usage: cephalon-bench console [--sessions N] (default 100000)\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  char policy_text[2048];
  if (cph_bench_policy(policy_text, sizeof policy_text, "none", 8, 10, 1, NULL))
    return 1;
  int status = 1;
  cph_bench_daemon d = {0};
  cph_bench_conn c = CPH_BENCH_CONN_INIT;
  char *dir = cph_bench_tmpdir("console");
  char *data = NULL;
  if (!dir || asprintf(&data, "%s/data", dir) < 0)
    goto out;
  if (cph_bench_fill_sessions(policy_text, data, n) ||
      cph_bench_daemon_start(&d, policy_text, data, 120000) ||
      cph_bench_conn_open(&c, d.port))
    goto out;
  cph_bench_resp r;
  if (call(&c, "POST", "/v1/sessions",
           "{\"id\":\"console\",\"class\":\"interactive\",\"subscribe\":[\"console-chan\"]}", &r) ||
      call(&c, "POST", "/v1/sessions/console/context",
           "{\"at\":\"d0, 1, 0\",\"content\":\"remind: standup\",\"ttl\":2}", &r))
    goto out;
  uint64_t ids[TURNS];
  for (int i = 0; i < TURNS; i++)
    if (turn(&c, i, &ids[i]))
      goto out;

  char mid[32], prefix[32], ctx[96], diff[128];
  snprintf(mid, sizeof mid, "idle-%07" PRIu64, n / 2);
  snprintf(prefix, sizeof prefix, "idle-%05" PRIu64, n / 200);
  snprintf(ctx, sizeof ctx, "/v1/sessions/console/turns/%" PRIu64 "/context", ids[TURNS - 1]);
  snprintf(diff, sizeof diff, "/v1/sessions/console/context/diff?from=%" PRIu64 "&to=%" PRIu64,
           ids[0], ids[TURNS - 1]);
  char p_after[96], p_prefix[96], p_session[96], p_why[96];
  snprintf(p_after, sizeof p_after, "/v1/sessions?limit=50&after=%s", mid);
  snprintf(p_prefix, sizeof p_prefix, "/v1/sessions?limit=50&prefix=%s", prefix);
  snprintf(p_session, sizeof p_session, "/v1/sessions/%s", mid);
  snprintf(p_why, sizeof p_why, "/v1/sessions/%s/why", mid);
  const struct {
    const char *page, *path;
  } calls[] = {
      {"files", "/ui"},
      {"files", "/ui/app.js"},
      {"lanes", "/v1/lanes"},
      {"lanes", "/v1/top?limit=10"},
      {"sessions", "/v1/sessions?limit=50"},
      {"sessions", p_after},
      {"sessions", p_prefix},
      {"session", p_session},
      {"session", p_why},
      {"session", "/v1/sessions/console/turns"},
      {"session", "/v1/replies?after=0&limit=1000&wait_ms=0"},
      {"parked", "/v1/turns?state=parked"},
      {"channels", "/v1/channels/console-chan"},
      {"channels", "/v1/aggregates?top=20"},
      {"explorer", ctx},
      {"explorer", diff},
  };
  double worst_median = 0, worst_max = 0;
  printf("%-9s %-62s %10s %10s\n", "page", "call", "median_ms", "max_ms");
  for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
    int64_t t[TRIES];
    for (int i = 0; i < TRIES; i++) {
      int64_t t0 = cph_bench_now_ns();
      if (call(&c, "GET", calls[k].path, NULL, &r))
        goto out;
      t[i] = cph_bench_now_ns() - t0;
    }
    qsort(t, TRIES, sizeof t[0], cmp_i64);
    double median = (double)t[TRIES / 2] / 1e6, max = (double)t[TRIES - 1] / 1e6;
    printf("%-9s %-62s %10.2f %10.2f\n", calls[k].page, calls[k].path, median, max);
    if (median > worst_median)
      worst_median = median;
    if (max > worst_max)
      worst_max = max;
  }
  printf("console sessions=%" PRIu64 " worst_median_ms=%.2f worst_max_ms=%.2f within_100ms=%s\n", n,
         worst_median, worst_max, worst_max <= 100 ? "yes" : "no");
  status = 0;
out:
  cph_bench_conn_free(&c);
  cph_bench_daemon_free(&d);
  free(data);
  if (dir)
    cph_bench_tmpdir_remove(dir);
  return status;
}
