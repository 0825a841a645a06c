/* cephalon-bench ingest and cycle: a real cephalond on loopback, driven over HTTP/1.1 by
 * client threads with their own kept-alive connections (DESIGN §12).
 *
 *   ingest: durable ingest, 1,000 events per request, :store :sync :always; events/s.
 *   cycle:  post one event -> lease -> complete, per client; cycles/s at :sync :always or
 *           :none (the anchors in bench_anchor.c run the same shape).
 *
 * Both start cephalond on a free port with a temp dir (proc.h), create one interactive
 * session per client subscribed to its own channel, run the load (load.h), and stop it. */
#define _GNU_SOURCE /* asprintf */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "load.h"
#include "net.h"
#include "proc.h"

/* ---------------------------------------------------------------- shared */

/* splitmix64: the bench's deterministic pseudo-random stream. */
uint64_t cph_bench_rand(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

static const char *const syllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "to", "vi",
                                        "da", "fe", "gu", "ho", "ji", "pe", "qu", "zo"};

/* Writes a body of about `len` bytes: a unique tag, then pseudo-words, so no two bodies are
 * exact or near duplicates (§5) and each takes the full ingest path. Returns its length. */
size_t cph_bench_body(char *out, size_t len, uint64_t tag, uint64_t *rng) {
  int n = snprintf(out, len + 1, "m%" PRIx64, tag);
  size_t at = n > 0 ? (size_t)n : 0;
  while (at + 1 < len) {
    uint64_t r = cph_bench_rand(rng);
    out[at++] = ' ';
    for (int s = 0; s < 3 && at < len; s++, r >>= 4) {
      const char *syl = syllables[r & 15];
      out[at++] = syl[0];
      if (at < len)
        out[at++] = syl[1];
    }
  }
  out[at] = '\0';
  return at;
}

/* POST with a fresh connection for setup calls; 0 when the answer is `want`. */
static int post_expect(int port, const char *path, const char *body, int want) {
  cph_bench_conn c = CPH_BENCH_CONN_INIT;
  cph_bench_resp r;
  int rc = -1;
  if (cph_bench_conn_open(&c, port) == 0 &&
      cph_bench_http(&c, "POST", path, body, strlen(body), &r) == 0) {
    rc = r.status == want ? 0 : -1;
    if (rc)
      fprintf(stderr, "cephalon-bench: POST %s -> %d %s\n", path, r.status, r.body);
  }
  cph_bench_conn_free(&c);
  return rc;
}

/* A cluster: each session is created on the node that owns it — the one that answers 200;
 * the others answer 421. owner[i] (when given) is the port of session i's owner. window > 0
 * sets the sessions' context_window_tokens (else the policy default). */
static int create_sessions_on_owners(const int *ports, int n_ports, int n, const char *prefix,
                                     int *owner, uint64_t window) {
  char body[320], win[48] = "";
  if (window)
    snprintf(win, sizeof win, ",\"context_window_tokens\":%" PRIu64, window);
  for (int i = 0; i < n; i++) {
    snprintf(body, sizeof body,
             "{\"id\":\"%s-%d\",\"class\":\"interactive\",\"subscribe\":[\"%s-chan-%d\"]%s}",
             prefix, i, prefix, i, win);
    int created = 0;
    for (int k = 0; k < n_ports && !created; k++) {
      cph_bench_conn c = CPH_BENCH_CONN_INIT;
      cph_bench_resp r;
      if (cph_bench_conn_open(&c, ports[k]) == 0 &&
          cph_bench_http(&c, "POST", "/v1/sessions", body, strlen(body), &r) == 0)
        created = r.status == 200 || r.status == 409; /* 409: it exists there already */
      cph_bench_conn_free(&c);
      if (created && owner)
        owner[i] = ports[k];
    }
    if (!created) {
      fprintf(stderr, "cephalon-bench: no node created session %s-%d\n", prefix, i);
      return -1;
    }
  }
  return 0;
}

/* One interactive session per client, "PREFIX-<i>", subscribed to channel "PREFIX-chan-<i>";
 * window > 0 sets its context_window_tokens (else the policy default). */
static int create_sessions(int port, int n, const char *prefix, uint64_t window) {
  char body[320], win[48] = "";
  if (window)
    snprintf(win, sizeof win, ",\"context_window_tokens\":%" PRIu64, window);
  for (int i = 0; i < n; i++) {
    snprintf(body, sizeof body,
             "{\"id\":\"%s-%d\",\"class\":\"interactive\",\"subscribe\":[\"%s-chan-%d\"]%s}",
             prefix, i, prefix, i, win);
    if (post_expect(port, "/v1/sessions", body, 200) &&
        post_expect(port, "/v1/sessions", body, 201))
      return -1;
  }
  return 0;
}

typedef struct http_ctx {
  int port;
  const int *ports; /* cluster mode (ingest --nodes): client i talks to ports[i % n_ports] */
  int n_ports;
  const int *client_ports; /* cluster mode (cycle --nodes): client i talks to client_ports[i],
                              the owner of its session */
  int events_per_request;
  size_t body_bytes;
  const char *prefix;
  int subscribed;      /* ingest: events go to the clients' subscribed channels, else unrouted */
  size_t reply_bytes;  /* cycle: the reply each complete carries (0: none) */
  size_t memories;     /* cycle: the worker memories each complete carries */
  const char *include; /* cycle: the lease's `,"include":[...]` member, "" for the whole turn */
  /* Totals over the clients, added by client_teardown (main thread, after the run). */
  uint64_t queued, stored, aggregated, other, empty_leases, turns, turn_bytes;
  /* cycle: the daemon over the measured window (cycle_window), -1 where unknown */
  pid_t pid;
  int64_t cpu_ns[2], passes[2], fsyncs[2];
  /* cycle: where a client's cycle waits — wall ns summed over the clients' finished cycles for
   * each step (post, lease, complete), and those cycles, read at the window's ends */
  _Atomic uint64_t step_ns[3], step_cycles;
  uint64_t step_at[2][3], step_cycles_at[2];
} http_ctx;

typedef struct http_client {
  http_ctx *ctx;
  int id;
  cph_bench_conn conn;
  uint64_t rng;
  char *req;
  size_t req_cap;
  uint64_t queued, stored, aggregated, other; /* ingest statuses seen */
  uint64_t empty_leases;                      /* cycle: 204s before a turn came */
  uint64_t turns, turn_bytes;                 /* cycle: lease answers and their size */
} http_client;

static int client_setup(void *ctx, int id, void **state) {
  http_client *c = calloc(1, sizeof *c);
  if (!c)
    return -1;
  c->ctx = ctx;
  c->id = id;
  c->conn = (cph_bench_conn)CPH_BENCH_CONN_INIT;
  c->rng = UINT64_C(0x5EED0000) + (uint64_t)id;
  const http_ctx *h = ctx;
  c->req_cap = (size_t)h->events_per_request * (h->body_bytes + 128) + 64;
  c->req = malloc(c->req_cap);
  int port = h->client_ports ? h->client_ports[id]
             : h->n_ports     ? h->ports[id % h->n_ports]
                              : h->port;
  if (!c->req || cph_bench_conn_open(&c->conn, port)) {
    free(c->req);
    free(c);
    return -1;
  }
  *state = c;
  return 0;
}

static void client_teardown(void *state) {
  http_client *c = state;
  http_ctx *h = c->ctx;
  h->queued += c->queued;
  h->stored += c->stored;
  h->aggregated += c->aggregated;
  h->other += c->other;
  h->empty_leases += c->empty_leases;
  h->turns += c->turns;
  h->turn_bytes += c->turn_bytes;
  cph_bench_conn_free(&c->conn);
  free(c->req);
  free(c);
}

/* Builds {"events":[...]} with n events for this client into c->req. */
static size_t build_events(http_client *c, int n, uint64_t seq) {
  const http_ctx *h = c->ctx;
  size_t at = (size_t)snprintf(c->req, c->req_cap, "{\"events\":[");
  char body[1024];
  size_t blen = h->body_bytes < sizeof body - 1 ? h->body_bytes : sizeof body - 1;
  for (int i = 0; i < n; i++) {
    uint64_t tag = ((uint64_t)c->id << 48) ^ (seq * (uint64_t)n + (uint64_t)i);
    cph_bench_body(body, blen, tag, &c->rng);
    int w;
    if (h->subscribed)
      w = snprintf(c->req + at, c->req_cap - at,
                   "%s{\"channel\":\"%s-chan-%d\",\"sender\":\"user-%d\",\"body\":\"%s\"}",
                   i ? "," : "", h->prefix, c->id, c->id, body);
    else
      w = snprintf(c->req + at, c->req_cap - at,
                   "%s{\"channel\":\"%s-open-%d\",\"sender\":\"user-%d\",\"body\":\"%s\"}",
                   i ? "," : "", h->prefix, c->id, c->id, body);
    at += (size_t)w;
  }
  at += (size_t)snprintf(c->req + at, c->req_cap - at, "]}");
  return at;
}

static uint64_t count_of(const char *s, const char *needle) {
  uint64_t n = 0;
  size_t len = strlen(needle);
  while ((s = strstr(s, needle)) != NULL) {
    n++;
    s += len;
  }
  return n;
}

/* ---------------------------------------------------------------- ingest */

static int ingest_op(void *state, uint64_t seq) {
  http_client *c = state;
  size_t len = build_events(c, c->ctx->events_per_request, seq);
  cph_bench_resp r;
  if (cph_bench_http(&c->conn, "POST", "/v1/events", c->req, len, &r) || r.status != 200) {
    fprintf(stderr, "cephalon-bench ingest: POST /v1/events -> %d %.300s\n", r.status,
            r.body ? r.body : "");
    return -1;
  }
  /* a cluster answers "accepted" once the log took the event (its owner queues it) */
  uint64_t q =
      count_of(r.body, "\"status\":\"queued\"") + count_of(r.body, "\"status\":\"accepted\"");
  uint64_t s = count_of(r.body, "\"status\":\"stored\"");
  uint64_t a = count_of(r.body, "\"status\":\"aggregated\"");
  c->queued += q;
  c->stored += s;
  c->aggregated += a;
  c->other += (uint64_t)c->ctx->events_per_request - q - s - a;
  return 0;
}

static void ingest_usage(FILE *f) {
  fprintf(f,
          "usage: cephalon-bench ingest [--clients N] [--events E] [--seconds S] "
          "[--sync always|batch|none] [--body-bytes B] [--unrouted]\n"
          "  --clients N     client threads, each with its own connection (default 8)\n"
          "  --events E      events per request (default 1000)\n"
          "  --seconds S     measured seconds (default 10; 1 s warm-up before)\n"
          "  --sync MODE     :store :sync (default always)\n"
          "  --body-bytes B  event body size (default 64)\n"
          "  --unrouted      post to channels nobody subscribes to (status stored)\n"
          "  --nodes P,P,..  post to running cluster nodes on 127.0.0.1 at these ports (the\n"
          "                  clients spread over them; no daemon is started; bench/cluster.sh)\n");
}

static const char *sync_arg(int argc, char **argv, int *i) {
  if (strcmp(argv[*i], "--sync") == 0 && *i + 1 < argc) {
    const char *v = argv[*i + 1];
    if (strcmp(v, "always") && strcmp(v, "batch") && strcmp(v, "none"))
      return NULL;
    *i += 2;
    return v;
  }
  return NULL;
}

/* --nodes P,P,...: the ports of running cluster nodes on 127.0.0.1, into nodes[16]. Returns
 * how many, or -1 (said on stderr) when the list is empty, too long or has a bad port. */
static int nodes_arg(const char *cmd, const char *list, int nodes[16]) {
  int n = 0;
  for (const char *p = list; *p;) {
    char *end;
    long port = strtol(p, &end, 10);
    if (end == p || port < 1 || port > 65535 || (*end != ',' && *end != '\0') || n == 16) {
      fprintf(stderr, "cephalon-bench %s: --nodes: bad port list \"%s\" (at most 16 ports)\n",
              cmd, list);
      return -1;
    }
    nodes[n++] = (int)port;
    p = *end ? end + 1 : end;
  }
  if (n == 0)
    fprintf(stderr, "cephalon-bench %s: --nodes: no port given\n", cmd);
  return n ? n : -1;
}

int cph_bench_ingest(int argc, char **argv) {
  uint64_t clients = 8, events = 1000, seconds = 10, body_bytes = 64;
  const char *sync = "always";
  bool unrouted = false;
  int nodes[16], n_nodes = 0;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      ingest_usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--nodes") == 0 && i + 1 < argc) {
      if ((n_nodes = nodes_arg("ingest", argv[i + 1], nodes)) < 0)
        return 2;
      i += 2;
      continue;
    }
    if (strcmp(argv[i], "--unrouted") == 0) {
      unrouted = true;
      i++;
      continue;
    }
    const char *s = sync_arg(argc, argv, &i);
    if (s) {
      sync = s;
      continue;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--clients", 1, 256, &clients)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--events", 1, 100000, &events)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 1, 600, &seconds)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--body-bytes", 16, 1000, &body_bytes))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench ingest: bad option \"%s\"\n", argv[i]);
    ingest_usage(stderr);
    return 2;
  }

  if (events > 1000) {
    fprintf(stderr, "cephalon-bench ingest: at most 1000 events per request "
                    "(:server :max-events-per-request in the bench policy)\n");
    return 2;
  }
  char policy[2048];
  if (cph_bench_policy(policy, sizeof policy, sync, 64, 10, 1, NULL))
    return 1;
  cph_bench_daemon d = {0};
  d.pid = -1;
  if (!n_nodes && cph_bench_daemon_start(&d, policy, NULL, 20000)) {
    cph_bench_daemon_free(&d);
    return 1;
  }
  int status = 1;
  http_ctx h = {.port = d.port,
                .ports = nodes,
                .n_ports = n_nodes,
                .events_per_request = (int)events,
                .body_bytes = (size_t)body_bytes,
                .prefix = "ingest",
                .subscribed = !unrouted};
  if (n_nodes ? create_sessions_on_owners(nodes, n_nodes, (int)clients, "ingest", NULL, 0)
              : create_sessions(d.port, (int)clients, "ingest", 0))
    goto out;
  cph_bench_load l = {.clients = (int)clients,
                      .warmup_s = 1.0,
                      .seconds = (double)seconds,
                      .setup = client_setup,
                      .op = ingest_op,
                      .teardown = client_teardown,
                      .ctx = &h};
  cph_bench_load_result res;
  if (cph_bench_load_run(&l, &res))
    goto out;
  int64_t rss_anon;
  int64_t rss = n_nodes ? 0 : cph_bench_rss(d.pid, &rss_anon);
  double eps = res.ops_per_s * (double)events;
  if (n_nodes)
    printf("cluster            %d nodes (their own policies), %s events, %" PRIu64 "-byte bodies\n",
           n_nodes, unrouted ? "unrouted" : "routed (one subscriber each)", body_bytes);
  else
    printf("cephalond          :store :sync :%s, %s events, %" PRIu64 "-byte bodies\n", sync,
           unrouted ? "unrouted" : "routed (one subscriber each)", body_bytes);
  printf("clients            %" PRIu64 " (one connection each), %" PRIu64 " events per request\n",
         clients, events);
  printf("requests           %" PRIu64 " in %.2f s (errors %" PRIu64 ")\n", res.ops, res.seconds,
         res.errors);
  printf("request latency    p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", res.lat_p50_us / 1e3,
         res.lat_p99_us / 1e3, res.lat_max_us / 1e3);
  printf("statuses           queued %" PRIu64 ", stored %" PRIu64 ", aggregated %" PRIu64
         ", other %" PRIu64 " (all requests, warm-up included)\n",
         h.queued, h.stored, h.aggregated, h.other);
  printf("events/s           %.0f\n", eps);
  printf("daemon rss         %.1f MiB at the end\n", (double)rss / 1048576.0);
  printf("ingest events_per_s=%.0f requests_per_s=%.1f events_per_request=%" PRIu64
         " clients=%" PRIu64 " sync=%s nodes=%d p50_ms=%.2f p99_ms=%.2f errors=%" PRIu64 "\n",
         eps, res.ops_per_s, events, clients, sync, n_nodes ? n_nodes : 1, res.lat_p50_us / 1e3,
         res.lat_p99_us / 1e3, res.errors);
  status = res.errors ? 1 : 0;
out:
  cph_bench_daemon_free(&d);
  return status;
}

/* ---------------------------------------------------------------- cycle */

/* A lease waits up to LEASE_WAIT_MS; the cycle fails after LEASE_MAX_EMPTY empty answers in
 * a row. One turn may carry several events of its session (§4: every staged message), so
 * there can be fewer turns than events: a client may find no turn left once the others
 * stopped, and then gives up quietly (cph_bench_load_stopping). */
#define LEASE_MAX_EMPTY 50
#define LEASE_WAIT_MS 200

static int cycle_op(void *state, uint64_t seq) {
  http_client *c = state;
  int64_t t_post = cph_bench_now_ns();
  /* 1. post one event to this client's channel */
  size_t len = build_events(c, 1, seq);
  cph_bench_resp r;
  if (cph_bench_http(&c->conn, "POST", "/v1/events", c->req, len, &r) || r.status != 200) {
    fprintf(stderr, "cephalon-bench cycle: POST /v1/events -> %d %.300s\n", r.status,
            r.body ? r.body : "");
    return -1;
  }
  int64_t t_lease = cph_bench_now_ns();
  /* 2. lease a turn (any session's: the scheduler decides) */
  char lease_req[512];
  int lease_len = snprintf(lease_req, sizeof lease_req, "{\"worker\":\"w-%d\",\"wait_ms\":%d%s}",
                           c->id, LEASE_WAIT_MS, c->ctx->include);
  for (int tries = 0;; tries++) {
    if (cph_bench_http(&c->conn, "POST", "/v1/turns/lease", lease_req, (size_t)lease_len, &r)) {
      fprintf(stderr, "cephalon-bench cycle: lease failed (connection)\n");
      return -1;
    }
    if (r.status == 200)
      break;
    if (r.status == 204 && cph_bench_load_stopping())
      return 0;
    if (r.status != 204 || tries + 1 >= LEASE_MAX_EMPTY) {
      fprintf(stderr, "cephalon-bench cycle: lease -> %d %.300s\n", r.status, r.body ? r.body : "");
      return -1;
    }
    c->empty_leases++;
  }
  int64_t t_complete = cph_bench_now_ns();
  c->turns++;
  c->turn_bytes += r.body_len;
  const char *turn = cph_bench_json_find(r.body, "turn");
  uint64_t id;
  char lease[40];
  if (!turn || cph_bench_json_u64(turn, "id", &id) ||
      cph_bench_json_str(turn, "lease", lease, sizeof lease)) {
    fprintf(stderr, "cephalon-bench cycle: no turn id or lease in %.300s\n", r.body);
    return -1;
  }
  /* 3. complete it, with a reply (it joins the session's history, as the Redis agent app's
   * RPUSH of event and reply does) */
  char path[64], body[2048], reply[1024] = "", memories[640] = "";
  snprintf(path, sizeof path, "/v1/turns/%" PRIu64 "/complete", id);
  /* --memories: what the worker asks to remember, ~60 bytes each */
  for (size_t k = 0, at = 0; k < c->ctx->memories && at < sizeof memories; k++)
    at += (size_t)snprintf(memories + at, sizeof memories - at,
                           "%s{\"text\":\"client %d remembers turn %" PRIu64 " point %zu\"}",
                           k ? "," : ",\"memories\":[", c->id, seq, k);
  if (c->ctx->memories)
    snprintf(memories + strlen(memories), sizeof memories - strlen(memories), "]");
  int blen;
  if (c->ctx->reply_bytes) {
    cph_bench_body(reply, c->ctx->reply_bytes,
                   (UINT64_C(1) << 63) | (((uint64_t)c->id << 48) ^ seq), &c->rng);
    blen = snprintf(body, sizeof body,
                    "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},"
                    "\"reply\":{\"body\":\"%s\"}%s}",
                    lease, reply, memories);
  } else {
    blen = snprintf(body, sizeof body,
                    "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0}%s}", lease,
                    memories);
  }
  if (cph_bench_http(&c->conn, "POST", path, body, (size_t)blen, &r) || r.status != 200) {
    fprintf(stderr, "cephalon-bench cycle: complete -> %d %.300s\n", r.status,
            r.body ? r.body : "");
    return -1;
  }
  int64_t t_end = cph_bench_now_ns();
  atomic_fetch_add_explicit(&c->ctx->step_ns[0], (uint64_t)(t_lease - t_post), memory_order_relaxed);
  atomic_fetch_add_explicit(&c->ctx->step_ns[1], (uint64_t)(t_complete - t_lease),
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&c->ctx->step_ns[2], (uint64_t)(t_end - t_complete),
                            memory_order_relaxed);
  atomic_fetch_add_explicit(&c->ctx->step_cycles, 1, memory_order_relaxed);
  return 0;
}

static void cycle_usage(FILE *f) {
  fprintf(f, "usage: cephalon-bench cycle [--sync always|batch|none] [--clients N] "
             "[--seconds S] [--body-bytes B] [--reply-bytes R] [--memories M] [--window T] "
             "[--include P,...] [--warm-channels N] [--keep-turns N] [--nodes P,P,...]\n"
             "  --sync MODE      :store :sync (default always)\n"
             "  --clients N      client threads, each with its own connection and session "
             "(default 8)\n"
             "  --seconds S      measured seconds (default 10; 1 s warm-up before)\n"
             "  --body-bytes B   event body size (default 64; the anchors put the same)\n"
             "  --reply-bytes R  the reply body each complete carries (default 64, as the "
             "Redis agent app's; 0: none)\n"
             "  --memories M     worker memories each complete carries (default 0; at most 8)\n"
             "  --window T       the sessions' context_window_tokens (default: the policy's)\n"
             "  --include P,...  lease only these parts of the turn (the lease's `include`, e.g.\n"
             "                   messages,sections.available_tools as cephalon-worker asks);\n"
             "                   default: the whole turn\n"
             "  --warm-channels N  :sessions :warm-channels (default: the policy's; 0: every lease "
             "reads its history from the store)\n"
             "  --keep-turns N   :context :keep-turns (default: the policy's; 0: no turn context "
             "is kept)\n"
             "  --nodes P,P,...  run against running cluster nodes on 127.0.0.1 at these ports\n"
             "                   (no daemon is started; their own policies apply, so --sync,\n"
             "                   --warm-channels and --keep-turns are refused): each client's\n"
             "                   session is created on its owner, and the client posts, leases\n"
             "                   and completes there; every event goes through the log\n"
             "                   (bench/cluster.sh)\n");
}

/* --include a,b,c as the lease body's member `,"include":["a","b","c"]` in out; -1 when a
 * name is empty or is not made of [A-Za-z0-9_.] (the daemon answers 400 to an unknown one). */
static int include_member(const char *list, char *out, size_t size) {
  size_t n = (size_t)snprintf(out, size, ",\"include\":[");
  for (const char *p = list; n < size;) {
    size_t len = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.");
    if (len == 0 || (p[len] != ',' && p[len] != '\0')) {
      fprintf(stderr, "cephalon-bench cycle: --include: bad part list \"%s\"\n", list);
      return -1;
    }
    n += (size_t)snprintf(out + n, size - n, "%s\"%.*s\"", p == list ? "" : ",", (int)len, p);
    if (p[len] == '\0')
      break;
    p += len + 1;
  }
  if (n + 2 > size) {
    fprintf(stderr, "cephalon-bench cycle: --include: list too long\n");
    return -1;
  }
  memcpy(out + n, "]", 2);
  return 0;
}

/* The value of an unlabelled counter or gauge in cephalond's GET /metrics, or -1. */
static int64_t metric_value(int port, const char *name) {
  cph_bench_conn c = CPH_BENCH_CONN_INIT;
  cph_bench_resp r;
  int64_t v = -1;
  size_t len = strlen(name);
  if (cph_bench_conn_open(&c, port) == 0 &&
      cph_bench_http(&c, "GET", "/metrics", NULL, 0, &r) == 0 && r.status == 200)
    for (const char *at = r.body; at && *at; at = strchr(at, '\n'), at = at ? at + 1 : NULL)
      if (strncmp(at, name, len) == 0 && at[len] == ' ') {
        v = (int64_t)strtod(at + len + 1, NULL);
        break;
      }
  cph_bench_conn_free(&c);
  return v;
}

/* The daemon's CPU time, scheduler passes and disk flushes at both ends of the measured
 * window. */
static void cycle_window(void *ctx, bool end) {
  http_ctx *h = ctx;
  for (int k = 0; k < 3; k++)
    h->step_at[end][k] = atomic_load(&h->step_ns[k]);
  h->step_cycles_at[end] = atomic_load(&h->step_cycles);
  if (h->pid <= 0) /* a cluster's nodes run outside the bench */
    return;
  h->cpu_ns[end] = cph_bench_cpu_ns(h->pid);
  h->passes[end] = metric_value(h->port, "cephalon_scheduler_passes_total");
  h->fsyncs[end] = metric_value(h->port, "cephalon_lmdb_fsyncs_total");
}

int cph_bench_cycle(int argc, char **argv) {
  uint64_t clients = 8, seconds = 10, body_bytes = 64, reply_bytes = 64, window = 0;
  uint64_t memories = 0;
  uint64_t warm_channels = UINT64_MAX; /* the policy's default */
  uint64_t keep_turns = UINT64_MAX;    /* likewise */
  const char *sync = "always", *include = NULL;
  char include_json[384] = "";
  int nodes[16], n_nodes = 0;
  bool node_local = false; /* an option that sets the started daemon's policy was given */
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      cycle_usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--nodes") == 0 && i + 1 < argc) {
      if ((n_nodes = nodes_arg("cycle", argv[i + 1], nodes)) < 0)
        return 2;
      i += 2;
      continue;
    }
    node_local |= strcmp(argv[i], "--sync") == 0 || strcmp(argv[i], "--warm-channels") == 0 ||
                  strcmp(argv[i], "--keep-turns") == 0;
    if (strcmp(argv[i], "--include") == 0 && i + 1 < argc) {
      include = argv[i + 1];
      if (include_member(include, include_json, sizeof include_json))
        return 2;
      i += 2;
      continue;
    }
    const char *s = sync_arg(argc, argv, &i);
    if (s) {
      sync = s;
      continue;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--clients", 1, 256, &clients)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 1, 600, &seconds)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--body-bytes", 16, 1000, &body_bytes)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--reply-bytes", 0, 1000, &reply_bytes)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--memories", 0, 8, &memories)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--window", 64, 10000000, &window)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--warm-channels", 0, 1000000, &warm_channels)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--keep-turns", 0, 10000, &keep_turns))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench cycle: bad option \"%s\"\n", argv[i]);
    cycle_usage(stderr);
    return 2;
  }
  if (n_nodes && node_local) {
    fprintf(stderr, "cephalon-bench cycle: --nodes runs on the nodes' own policies: "
                    "--sync, --warm-channels and --keep-turns do not apply\n");
    return 2;
  }
  char policy[2048], extra[128] = "";
  if (warm_channels != UINT64_MAX)
    snprintf(extra, sizeof extra, ":sessions {:warm-channels %" PRIu64 "}", warm_channels);
  if (keep_turns != UINT64_MAX)
    snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
             " :context {:keep-turns %" PRIu64 "}", keep_turns);
  /* Concurrency at least the clients: every client may hold a turn at once. */
  if (cph_bench_policy(policy, sizeof policy, sync, (int)clients < 64 ? 64 : (int)clients, 10, 1,
                       extra))
    return 1;
  cph_bench_daemon d = {0};
  d.pid = -1;
  if (!n_nodes && cph_bench_daemon_start(&d, policy, NULL, 20000)) {
    cph_bench_daemon_free(&d);
    return 1;
  }
  int status = 1;
  int *owner = n_nodes ? calloc(clients, sizeof *owner) : NULL;
  http_ctx h = {.port = d.port,
                .client_ports = owner,
                .events_per_request = 1,
                .body_bytes = (size_t)body_bytes,
                .prefix = "cycle",
                .subscribed = 1,
                .reply_bytes = (size_t)reply_bytes,
                .memories = (size_t)memories,
                .include = include_json,
                .pid = d.pid,
                .cpu_ns = {-1, -1},
                .passes = {-1, -1},
                .fsyncs = {-1, -1}};
  if (n_nodes ? !owner || create_sessions_on_owners(nodes, n_nodes, (int)clients, "cycle", owner,
                                                    window)
              : create_sessions(d.port, (int)clients, "cycle", window))
    goto out;
  /* A cluster's daemons were started elsewhere: their CPU, passes and flushes are not read. */
  cph_bench_load l = {.clients = (int)clients,
                      .warmup_s = 1.0,
                      .seconds = (double)seconds,
                      .setup = client_setup,
                      .op = cycle_op,
                      .teardown = client_teardown,
                      .ctx = &h,
                      .window = cycle_window};
  cph_bench_load_result res;
  if (cph_bench_load_run(&l, &res))
    goto out;
  if (n_nodes)
    printf("cluster            %d nodes (their own policies); context window the default\n",
           n_nodes);
  else
    printf("cephalond          :store :sync :%s; context window %s tokens\n", sync,
           window ? "per --window" : "the default");
  if (window)
    printf("context window     %" PRIu64 " tokens\n", window);
  printf("clients            %" PRIu64 " (one connection and one session each), %" PRIu64
         "-byte bodies\n",
         clients, body_bytes);
  printf("lease include      %s\n", include ? include : "(none: the whole turn)");
  printf("cycle              POST /v1/events (1 event) -> POST /v1/turns/lease -> "
         "POST /v1/turns/{id}/complete\n");
  printf("cycles             %" PRIu64 " in %.2f s (errors %" PRIu64 ")\n", res.ops, res.seconds,
         res.errors);
  printf("cycle latency      p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", res.lat_p50_us / 1e3,
         res.lat_p99_us / 1e3, res.lat_max_us / 1e3);
  printf("lease answers      %" PRIu64 " turns, mean %.0f bytes; %" PRIu64
         " empty (204) before a turn\n",
         h.turns, h.turns ? (double)h.turn_bytes / (double)h.turns : 0.0, h.empty_leases);
  printf("cycles/s           %.0f\n", res.ops_per_s);
  /* mean wall ms of each step of a client's cycle over the window */
  double step_ms[3] = {0, 0, 0};
  uint64_t step_n = h.step_cycles_at[1] - h.step_cycles_at[0];
  for (int k = 0; k < 3 && step_n; k++)
    step_ms[k] = (double)(h.step_at[1][k] - h.step_at[0][k]) / 1e6 / (double)step_n;
  printf("cycle steps        post %.2f ms, lease %.2f ms, complete %.2f ms (means: each the "
         "wait for its answer)\n",
         step_ms[0], step_ms[1], step_ms[2]);

  /* The daemon's cost per cycle over the measured window. Fsyncs are the store's count of
   * the disk flushes it waited for (cephalon_lmdb_fsyncs_total): every fdatasync — in a
   * commit, on the flush thread, on the :batch timer — and every O_DSYNC meta-page write. */
  char cpu[32] = "n/a", fsyncs[32] = "n/a", passes[32] = "n/a";
  double lease_bytes = h.turns ? (double)h.turn_bytes / (double)h.turns : 0.0;
  if (res.ops && h.cpu_ns[0] >= 0 && h.cpu_ns[1] >= 0)
    snprintf(cpu, sizeof cpu, "%.1f", (double)(h.cpu_ns[1] - h.cpu_ns[0]) / 1e3 / (double)res.ops);
  if (res.ops && h.passes[0] >= 0 && h.passes[1] >= 0)
    snprintf(passes, sizeof passes, "%.3f", (double)(h.passes[1] - h.passes[0]) / (double)res.ops);
  if (res.ops && h.fsyncs[0] >= 0 && h.fsyncs[1] >= 0)
    snprintf(fsyncs, sizeof fsyncs, "%.3f", (double)(h.fsyncs[1] - h.fsyncs[0]) / (double)res.ops);
  if (n_nodes)
    printf("daemon cpu         n/a (the nodes run outside the bench)\n");
  else
    printf("daemon cpu         %s us per cycle (/proc/%d/stat utime+stime over the window, "
           "10 ms ticks)\n",
           cpu, (int)d.pid);
  printf("passes             %s per cycle (cephalon_scheduler_passes_total over the window)\n",
         passes);
  printf("fsyncs             %s per cycle (cephalon_lmdb_fsyncs_total over the window: "
         "fdatasync calls and O_DSYNC meta-page writes)\n",
         fsyncs);
  printf("cycle cycles_per_s=%.0f sync=%s clients=%" PRIu64 " body_bytes=%" PRIu64
         " reply_bytes=%" PRIu64 " memories=%" PRIu64 " window=%" PRIu64
         " include=%s lease_bytes=%.0f cpu_us_per_cycle=%s fsyncs_per_cycle=%s"
         " passes_per_cycle=%s nodes=%d p50_ms=%.2f p99_ms=%.2f post_ms=%.2f lease_ms=%.2f"
         " complete_ms=%.2f errors=%" PRIu64 "\n",
         res.ops_per_s, n_nodes ? "nodes" : sync, clients, body_bytes, reply_bytes, memories,
         window,
         include ? include : "all", lease_bytes, cpu, fsyncs, passes, n_nodes ? n_nodes : 1,
         res.lat_p50_us / 1e3, res.lat_p99_us / 1e3, step_ms[0], step_ms[1], step_ms[2],
         res.errors);
  status = res.errors ? 1 : 0;
out:
  free(owner);
  cph_bench_daemon_free(&d);
  return status;
}
