/* cephalon-bench beanstalkd and redis: the anchors of DESIGN §12, run the way the cycle
 * scenario runs cephalond — same client count, same payload size, closed loop, one
 * connection per client thread, a server started on a free loopback port with a temp dir
 * and stopped after.
 *
 *   beanstalkd: put -> reserve -> delete (the job any client reserves; one shared tube), in
 *               memory or with the binlog fsynced after every write (-b DIR -f 0).
 *   redis:      LPUSH -> RPOP on one shared list, no persistence or appendonly yes +
 *               appendfsync always.
 * One op = one cycle; the figure is cycles/s. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "load.h"
#include "net.h"
#include "proc.h"

/* A reserve that waits longer than this (s) counts as a lost job: a failure. */
#define RESERVE_TIMEOUT_S 5

typedef struct anchor_ctx {
  int port;
  size_t body_bytes;
} anchor_ctx;

typedef struct anchor_client {
  const anchor_ctx *ctx;
  int id;
  cph_bench_conn conn;
  uint64_t rng;
  char req[2048];
  uint64_t nils; /* redis: RPOPs that found the list empty */
} anchor_client;

static int anchor_setup(void *ctx, int id, void **state) {
  anchor_client *c = calloc(1, sizeof *c);
  if (!c)
    return -1;
  c->ctx = ctx;
  c->id = id;
  c->conn = (cph_bench_conn)CPH_BENCH_CONN_INIT;
  c->rng = UINT64_C(0xA4C40000) + (uint64_t)id;
  if (cph_bench_conn_open(&c->conn, c->ctx->port)) {
    free(c);
    return -1;
  }
  *state = c;
  return 0;
}

static uint64_t g_redis_nils; /* added up by teardown (main thread, after the run) */

static void anchor_teardown(void *state) {
  anchor_client *c = state;
  g_redis_nils += c->nils;
  cph_bench_conn_free(&c->conn);
  free(c);
}

/* ---------------------------------------------------------------- beanstalkd */

static int beanstalkd_op(void *state, uint64_t seq) {
  anchor_client *c = state;
  char body[1024];
  size_t blen = cph_bench_body(body, c->ctx->body_bytes, ((uint64_t)c->id << 48) ^ seq, &c->rng);
  int n = snprintf(c->req, sizeof c->req, "put 1024 0 60 %zu\r\n%s\r\n", blen, body);
  char *line;
  size_t len;
  if (cph_bench_conn_write(&c->conn, c->req, (size_t)n) ||
      cph_bench_conn_line(&c->conn, &line, &len) || strncmp(line, "INSERTED ", 9) != 0)
    return -1;
  static const char reserve[] = "reserve-with-timeout 5\r\n";
  _Static_assert(RESERVE_TIMEOUT_S == 5, "the command says 5");
  if (cph_bench_conn_write(&c->conn, reserve, sizeof reserve - 1) ||
      cph_bench_conn_line(&c->conn, &line, &len))
    return -1;
  uint64_t id;
  size_t bytes;
  if (sscanf(line, "RESERVED %" SCNu64 " %zu", &id, &bytes) != 2) {
    fprintf(stderr, "cephalon-bench beanstalkd: reserve -> %s\n", line);
    return -1;
  }
  char *data;
  if (cph_bench_conn_bytes(&c->conn, bytes + 2, &data))
    return -1;
  n = snprintf(c->req, sizeof c->req, "delete %" PRIu64 "\r\n", id);
  if (cph_bench_conn_write(&c->conn, c->req, (size_t)n) ||
      cph_bench_conn_line(&c->conn, &line, &len) || strcmp(line, "DELETED") != 0)
    return -1;
  return 0;
}

/* ---------------------------------------------------------------- redis */

static int redis_op(void *state, uint64_t seq) {
  anchor_client *c = state;
  char body[1024];
  size_t blen = cph_bench_body(body, c->ctx->body_bytes, ((uint64_t)c->id << 48) ^ seq, &c->rng);
  int n = snprintf(c->req, sizeof c->req, "*3\r\n$5\r\nLPUSH\r\n$10\r\nbench:jobs\r\n$%zu\r\n%s\r\n",
                   blen, body);
  char *line;
  size_t len;
  if (cph_bench_conn_write(&c->conn, c->req, (size_t)n) ||
      cph_bench_conn_line(&c->conn, &line, &len) || line[0] != ':') {
    fprintf(stderr, "cephalon-bench redis: LPUSH failed\n");
    return -1;
  }
  static const char rpop[] = "*2\r\n$4\r\nRPOP\r\n$10\r\nbench:jobs\r\n";
  if (cph_bench_conn_write(&c->conn, rpop, sizeof rpop - 1) ||
      cph_bench_conn_line(&c->conn, &line, &len) || line[0] != '$')
    return -1;
  long bytes = strtol(line + 1, NULL, 10);
  if (bytes < 0) { /* cannot happen in this closed loop (a push precedes every pop) */
    c->nils++;
    return 0;
  }
  char *data;
  return cph_bench_conn_bytes(&c->conn, (size_t)bytes + 2, &data);
}

/* ---------------------------------------------------------------- the scenarios */

static void anchor_usage(FILE *f, const char *name, const char *modes) {
  fprintf(f,
          "usage: cephalon-bench %s [--mode %s] [--clients N] [--seconds S] "
          "[--body-bytes B]\n"
          "  --mode M        see DESIGN §12 (default: the first)\n"
          "  --clients N     client threads, each with its own connection (default 8)\n"
          "  --seconds S     measured seconds (default 10; 1 s warm-up before)\n"
          "  --body-bytes B  job payload size (default 64, as the cycle scenario)\n",
          name, modes);
}

static int anchor_main(int argc, char **argv, bool redis) {
  const char *name = redis ? "redis" : "beanstalkd";
  const char *modes = redis ? "none|always" : "memory|fsync";
  uint64_t clients = 8, seconds = 10, body_bytes = 64;
  bool durable = false;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      anchor_usage(stdout, name, modes);
      return 0;
    }
    if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
      const char *m = argv[i + 1];
      if (strcmp(m, redis ? "always" : "fsync") == 0)
        durable = true;
      else if (strcmp(m, redis ? "none" : "memory") == 0)
        durable = false;
      else {
        anchor_usage(stderr, name, modes);
        return 2;
      }
      i += 2;
      continue;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--clients", 1, 256, &clients)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 1, 600, &seconds)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--body-bytes", 16, 1000, &body_bytes))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench %s: bad option \"%s\"\n", name, argv[i]);
    anchor_usage(stderr, name, modes);
    return 2;
  }
  cph_bench_server srv;
  if ((redis ? cph_bench_redis_start(&srv, durable) : cph_bench_beanstalkd_start(&srv, durable)))
    return 1;
  anchor_ctx ctx = {srv.port, (size_t)body_bytes};
  cph_bench_load l = {(int)clients, 1.0, (double)seconds, 0, anchor_setup,
                      redis ? redis_op : beanstalkd_op, anchor_teardown, &ctx};
  cph_bench_load_result res;
  g_redis_nils = 0;
  int rc = cph_bench_load_run(&l, &res);
  cph_bench_server_stop(&srv);
  if (rc)
    return 1;
  const char *mode = redis ? (durable ? "appendonly yes, appendfsync always" : "no persistence")
                           : (durable ? "binlog, fsync every op (-b DIR -f 0)" : "in memory");
  const char *label = redis ? (durable ? "always" : "none") : (durable ? "fsync" : "memory");
  printf("%-18s %s\n", name, mode);
  printf("clients            %" PRIu64 " (one connection each), %" PRIu64 "-byte payloads\n",
         clients, body_bytes);
  printf("cycle              %s\n",
         redis ? "LPUSH -> RPOP (one shared list)" : "put -> reserve -> delete (one tube)");
  printf("cycles             %" PRIu64 " in %.2f s (errors %" PRIu64 ")\n", res.ops, res.seconds,
         res.errors);
  printf("cycle latency      p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", res.lat_p50_us / 1e3,
         res.lat_p99_us / 1e3, res.lat_max_us / 1e3);
  if (redis)
    printf("empty pops         %" PRIu64 "\n", g_redis_nils);
  printf("cycles/s           %.0f\n", res.ops_per_s);
  printf("%s cycles_per_s=%.0f mode=%s clients=%" PRIu64 " body_bytes=%" PRIu64
         " p50_ms=%.3f p99_ms=%.3f errors=%" PRIu64 "\n",
         name, res.ops_per_s, label, clients, body_bytes, res.lat_p50_us / 1e3,
         res.lat_p99_us / 1e3, res.errors);
  return res.errors ? 1 : 0;
}

int cph_bench_beanstalkd(int argc, char **argv) { return anchor_main(argc, argv, false); }
int cph_bench_redis(int argc, char **argv) { return anchor_main(argc, argv, true); }
