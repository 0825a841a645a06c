/* cephalon-bench beanstalkd and redis: the anchors of DESIGN §12, run the way the cycle
 * scenario runs cephalond — same client count, same payload size, closed loop, one
 * connection per client thread, a server started on a free loopback port with a temp dir
 * and stopped after.
 *
 *   beanstalkd:        put -> reserve -> delete (the job any client reserves; one shared
 *                      tube), in memory or with the binlog fsynced after every write
 *                      (-b DIR -f 0).
 *   redis:             LPUSH -> RPOP on one shared list (--work queue), no persistence or
 *                      appendonly yes + appendfsync always.
 *   redis --work agent: the agent app on Redis that §12's cycle rows compare against, doing
 *                      the turn work cephalond's cycle does: per client, LPUSH the event to
 *                      inbox:<client>, BRPOP it, LRANGE the last 40 entries of
 *                      history:<client> (the context), then RPUSH event and reply to the
 *                      history and LTRIM it to 1,000 entries (those two pipelined in one
 *                      round trip, as an app would send them).
 * One op = one cycle; the figure is cycles/s. Every reply is checked. */
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

/* The agent app's history: the context read each cycle and the bound LTRIM keeps. */
#define AGENT_CONTEXT_ENTRIES 40
#define AGENT_HISTORY_MAX 1000

typedef struct anchor_ctx {
  int port;
  size_t body_bytes;
  pid_t pid;         /* the server, for its CPU time */
  int64_t cpu_ns[2]; /* its CPU time when the measured window opened and closed; -1 unknown */
  /* Totals over the clients, added by anchor_teardown (main thread, after the run). */
  uint64_t nils;                         /* queue: RPOPs that found the list empty */
  uint64_t context_reads, context_bytes; /* agent: LRANGEs and the bytes they returned */
} anchor_ctx;

typedef struct anchor_client {
  anchor_ctx *ctx;
  int id;
  cph_bench_conn conn;
  uint64_t rng;
  char req[4096];
  uint64_t nils;
  uint64_t context_reads, context_bytes;
  /* agent: this client's keys, and history:<id>'s length as the last RPUSH and LTRIM left it
   * (the client alone writes it), so every LRANGE's entry count is checked */
  char inbox[24], history[24];
  long long history_len;
} anchor_client;

static int anchor_setup(void *ctx, int id, void **state) {
  anchor_client *c = calloc(1, sizeof *c);
  if (!c)
    return -1;
  c->ctx = ctx;
  c->id = id;
  c->conn = (cph_bench_conn)CPH_BENCH_CONN_INIT;
  c->rng = UINT64_C(0xA4C40000) + (uint64_t)id;
  snprintf(c->inbox, sizeof c->inbox, "inbox:%d", id);
  snprintf(c->history, sizeof c->history, "history:%d", id);
  if (cph_bench_conn_open(&c->conn, c->ctx->port)) {
    free(c);
    return -1;
  }
  *state = c;
  return 0;
}

static void anchor_teardown(void *state) {
  anchor_client *c = state;
  c->ctx->nils += c->nils;
  c->ctx->context_reads += c->context_reads;
  c->ctx->context_bytes += c->context_bytes;
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
  int n = snprintf(c->req, sizeof c->req,
                   "*3\r\n$5\r\nLPUSH\r\n$10\r\nbench:jobs\r\n$%zu\r\n%s\r\n", blen, body);
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

/* ---------------------------------------------------------------- redis: the agent app */

/* Writes one RESP command (an array of n bulk strings) at buf + *at; -1 if it does not fit. */
static int resp_cmd(char *buf, size_t cap, size_t *at, int n, const char *const *args,
                    const size_t *lens) {
  int w = snprintf(buf + *at, cap - *at, "*%d\r\n", n);
  if (w < 0 || (size_t)w >= cap - *at)
    return -1;
  *at += (size_t)w;
  for (int i = 0; i < n; i++) {
    w = snprintf(buf + *at, cap - *at, "$%zu\r\n", lens[i]);
    if (w < 0 || (size_t)w + lens[i] + 2 >= cap - *at)
      return -1;
    *at += (size_t)w;
    memcpy(buf + *at, args[i], lens[i]);
    *at += lens[i];
    memcpy(buf + *at, "\r\n", 2);
    *at += 2;
  }
  return 0;
}

/* Reads one reply line and checks its type byte (':' integer, '*' array, '+' status); the
 * line is valid until the next read. Prints what came instead. */
static int resp_line(anchor_client *c, char type, const char *cmd, char **line) {
  size_t len;
  if (cph_bench_conn_line(&c->conn, line, &len)) {
    fprintf(stderr, "cephalon-bench redis: %s: no reply\n", cmd);
    return -1;
  }
  if ((*line)[0] != type) {
    fprintf(stderr, "cephalon-bench redis: %s -> %.200s\n", cmd, *line);
    return -1;
  }
  return 0;
}

/* Reads a reply line of `type` and its integer (an integer, or an array's or a bulk string's
 * length). */
static int resp_num(anchor_client *c, char type, const char *cmd, long long *out) {
  char *line, *end;
  if (resp_line(c, type, cmd, &line))
    return -1;
  *out = strtoll(line + 1, &end, 10);
  if (end == line + 1 || *end) {
    fprintf(stderr, "cephalon-bench redis: %s -> %.200s\n", cmd, line);
    return -1;
  }
  return 0;
}

/* Reads a bulk string that must not be nil; *data (not NUL-terminated) is valid until the
 * next read. */
static int resp_bulk(anchor_client *c, const char *cmd, char **data, size_t *len) {
  long long n;
  if (resp_num(c, '$', cmd, &n))
    return -1;
  if (n < 0) {
    fprintf(stderr, "cephalon-bench redis: %s: nil where a value was due\n", cmd);
    return -1;
  }
  *len = (size_t)n;
  return cph_bench_conn_bytes(&c->conn, (size_t)n + 2, data);
}

static int redis_agent_op(void *state, uint64_t seq) {
  anchor_client *c = state;
  uint64_t tag = ((uint64_t)c->id << 48) ^ seq;
  char event[1024], reply[1024];
  size_t elen = cph_bench_body(event, c->ctx->body_bytes, tag, &c->rng);
  size_t rlen = cph_bench_body(reply, c->ctx->body_bytes, (UINT64_C(1) << 63) | tag, &c->rng);
  size_t ilen = strlen(c->inbox), hlen = strlen(c->history), at;
  long long n;
  char *data;
  size_t len;

  /* 1. the event arrives: LPUSH inbox:<id> event */
  at = 0;
  if (resp_cmd(c->req, sizeof c->req, &at, 3, (const char *[]){"LPUSH", c->inbox, event},
               (size_t[]){5, ilen, elen}) ||
      cph_bench_conn_write(&c->conn, c->req, at) || resp_num(c, ':', "LPUSH", &n))
    return -1;
  if (n != 1) { /* the client's own inbox, emptied by its BRPOP every cycle */
    fprintf(stderr, "cephalon-bench redis: LPUSH -> %lld entries, expected 1\n", n);
    return -1;
  }

  /* 2. the agent takes it: BRPOP inbox:<id> 1 -> [key, event] */
  at = 0;
  if (resp_cmd(c->req, sizeof c->req, &at, 3, (const char *[]){"BRPOP", c->inbox, "1"},
               (size_t[]){5, ilen, 1}) ||
      cph_bench_conn_write(&c->conn, c->req, at) || resp_num(c, '*', "BRPOP", &n))
    return -1;
  if (n != 2) {
    fprintf(stderr, "cephalon-bench redis: BRPOP -> %lld elements (timed out?)\n", n);
    return -1;
  }
  if (resp_bulk(c, "BRPOP", &data, &len))
    return -1;
  if (len != ilen || memcmp(data, c->inbox, len) != 0) {
    fprintf(stderr, "cephalon-bench redis: BRPOP answered for another key\n");
    return -1;
  }
  if (resp_bulk(c, "BRPOP", &data, &len))
    return -1;
  if (len != elen || memcmp(data, event, len) != 0) {
    fprintf(stderr, "cephalon-bench redis: BRPOP returned another event than was pushed\n");
    return -1;
  }

  /* 3. its context: LRANGE history:<id> -40 -1 */
  at = 0;
  if (resp_cmd(c->req, sizeof c->req, &at, 4, (const char *[]){"LRANGE", c->history, "-40", "-1"},
               (size_t[]){6, hlen, 3, 2}) ||
      cph_bench_conn_write(&c->conn, c->req, at) || resp_num(c, '*', "LRANGE", &n))
    return -1;
  _Static_assert(AGENT_CONTEXT_ENTRIES == 40, "the command says -40");
  long long want = c->history_len < AGENT_CONTEXT_ENTRIES ? c->history_len : AGENT_CONTEXT_ENTRIES;
  if (n != want) {
    fprintf(stderr, "cephalon-bench redis: LRANGE -> %lld entries, expected %lld\n", n, want);
    return -1;
  }
  for (long long i = 0; i < n; i++) {
    if (resp_bulk(c, "LRANGE", &data, &len))
      return -1;
    c->context_bytes += len;
  }
  c->context_reads++;

  /* 4. the turn's record: RPUSH history:<id> event reply, LTRIM history:<id> -1000 -1, in
   * one round trip */
  at = 0;
  _Static_assert(AGENT_HISTORY_MAX == 1000, "the command says -1000");
  if (resp_cmd(c->req, sizeof c->req, &at, 4, (const char *[]){"RPUSH", c->history, event, reply},
               (size_t[]){5, hlen, elen, rlen}) ||
      resp_cmd(c->req, sizeof c->req, &at, 4, (const char *[]){"LTRIM", c->history, "-1000", "-1"},
               (size_t[]){5, hlen, 5, 2}) ||
      cph_bench_conn_write(&c->conn, c->req, at) || resp_num(c, ':', "RPUSH", &n))
    return -1;
  if (n != c->history_len + 2) {
    fprintf(stderr, "cephalon-bench redis: RPUSH -> %lld entries, expected %lld\n", n,
            c->history_len + 2);
    return -1;
  }
  char *line;
  if (resp_line(c, '+', "LTRIM", &line))
    return -1;
  if (strcmp(line, "+OK") != 0) {
    fprintf(stderr, "cephalon-bench redis: LTRIM -> %.200s\n", line);
    return -1;
  }
  c->history_len = n < AGENT_HISTORY_MAX ? n : AGENT_HISTORY_MAX;
  return 0;
}

/* ---------------------------------------------------------------- the scenarios */

/* The server's CPU time at both ends of the measured window. */
static void anchor_window(void *ctx, bool end) {
  anchor_ctx *a = ctx;
  a->cpu_ns[end] = cph_bench_cpu_ns(a->pid);
}

static void anchor_usage(FILE *f, const char *name, const char *modes, bool redis) {
  fprintf(f,
          "usage: cephalon-bench %s [--mode %s]%s [--clients N] [--seconds S] "
          "[--body-bytes B]\n"
          "  --mode M        see DESIGN §12 (default: the first)\n",
          name, modes, redis ? " [--work queue|agent]" : "");
  if (redis)
    fprintf(f, "  --work W        queue: LPUSH -> RPOP on one list (default); agent: the agent "
               "app of §12's cycle rows (LPUSH, BRPOP, LRANGE -40, RPUSH event and reply + "
               "LTRIM 1000)\n");
  fprintf(f, "  --clients N     client threads, each with its own connection (default 8)\n"
             "  --seconds S     measured seconds (default 10; 1 s warm-up before)\n"
             "  --body-bytes B  job payload size, and the agent's reply (default 64, as the "
             "cycle scenario)\n");
}

static int anchor_main(int argc, char **argv, bool redis) {
  const char *name = redis ? "redis" : "beanstalkd";
  const char *modes = redis ? "none|always" : "memory|fsync";
  uint64_t clients = 8, seconds = 10, body_bytes = 64;
  bool durable = false, agent = false;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      anchor_usage(stdout, name, modes, redis);
      return 0;
    }
    if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
      const char *m = argv[i + 1];
      if (strcmp(m, redis ? "always" : "fsync") == 0)
        durable = true;
      else if (strcmp(m, redis ? "none" : "memory") == 0)
        durable = false;
      else {
        anchor_usage(stderr, name, modes, redis);
        return 2;
      }
      i += 2;
      continue;
    }
    if (redis && strcmp(argv[i], "--work") == 0 && i + 1 < argc) {
      const char *w = argv[i + 1];
      if (strcmp(w, "agent") == 0)
        agent = true;
      else if (strcmp(w, "queue") == 0)
        agent = false;
      else {
        anchor_usage(stderr, name, modes, redis);
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
    anchor_usage(stderr, name, modes, redis);
    return 2;
  }
  cph_bench_server srv;
  if ((redis ? cph_bench_redis_start(&srv, durable) : cph_bench_beanstalkd_start(&srv, durable)))
    return 1;
  anchor_ctx ctx = {
      .port = srv.port, .body_bytes = (size_t)body_bytes, .pid = srv.pid, .cpu_ns = {-1, -1}};
  int (*op)(void *, uint64_t) = !redis ? beanstalkd_op : agent ? redis_agent_op : redis_op;
  cph_bench_load l = {.clients = (int)clients,
                      .warmup_s = 1.0,
                      .seconds = (double)seconds,
                      .setup = anchor_setup,
                      .op = op,
                      .teardown = anchor_teardown,
                      .ctx = &ctx,
                      .window = anchor_window};
  cph_bench_load_result res;
  int rc = cph_bench_load_run(&l, &res);
  cph_bench_server_stop(&srv);
  if (rc)
    return 1;
  const char *mode =
      redis ? (durable ? "appendonly yes, appendfsync always" : "in memory (no persistence)")
            : (durable ? "binlog, fsync every op (-b DIR -f 0)" : "in memory");
  const char *label = redis ? (durable ? "always" : "none") : (durable ? "fsync" : "memory");
  const char *work = !redis  ? "put -> reserve -> delete (one tube)"
                     : agent ? "LPUSH inbox:<c> -> BRPOP inbox:<c> -> LRANGE history:<c> -40 -1 -> "
                               "RPUSH history:<c> event reply + LTRIM -1000 -1 (pipelined)"
                             : "LPUSH -> RPOP (one shared list)";
  char cpu[32] = "n/a";
  if (res.ops && ctx.cpu_ns[0] >= 0 && ctx.cpu_ns[1] >= 0)
    snprintf(cpu, sizeof cpu, "%.1f",
             (double)(ctx.cpu_ns[1] - ctx.cpu_ns[0]) / 1e3 / (double)res.ops);
  double context_bytes =
      ctx.context_reads ? (double)ctx.context_bytes / (double)ctx.context_reads : 0.0;
  printf("%-18s %s\n", name, mode);
  printf("clients            %" PRIu64 " (one connection each), %" PRIu64 "-byte payloads\n",
         clients, body_bytes);
  printf("cycle              %s\n", work);
  printf("cycles             %" PRIu64 " in %.2f s (errors %" PRIu64 ")\n", res.ops, res.seconds,
         res.errors);
  printf("cycle latency      p50 %.3f ms, p99 %.3f ms, max %.3f ms\n", res.lat_p50_us / 1e3,
         res.lat_p99_us / 1e3, res.lat_max_us / 1e3);
  if (redis && !agent)
    printf("empty pops         %" PRIu64 "\n", ctx.nils);
  if (agent)
    printf("context read       mean %.0f bytes per LRANGE (%d entries once the history has them)\n",
           context_bytes, AGENT_CONTEXT_ENTRIES);
  printf("server cpu         %s us per cycle (/proc/%d/stat utime+stime over the window, "
         "10 ms ticks)\n",
         cpu, (int)ctx.pid);
  printf("cycles/s           %.0f\n", res.ops_per_s);
  printf("%s cycles_per_s=%.0f mode=%s", name, res.ops_per_s, label);
  if (redis)
    printf(" work=%s", agent ? "agent" : "queue");
  printf(" clients=%" PRIu64 " body_bytes=%" PRIu64, clients, body_bytes);
  if (agent)
    printf(" context_bytes=%.0f", context_bytes);
  printf(" cpu_us_per_cycle=%s p50_ms=%.3f p99_ms=%.3f errors=%" PRIu64 "\n", cpu,
         res.lat_p50_us / 1e3, res.lat_p99_us / 1e3, res.errors);
  return res.errors ? 1 : 0;
}

int cph_bench_beanstalkd(int argc, char **argv) { return anchor_main(argc, argv, false); }
int cph_bench_redis(int argc, char **argv) { return anchor_main(argc, argv, true); }
