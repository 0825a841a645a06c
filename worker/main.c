/* cephalon-worker: N threads per node (one daemon, or every node of a cluster), each
 * long-polls a lease and runs the turn (turn.c). SIGTERM or SIGINT: no new leases; what runs
 * is failed at once (turn.c sees the stop flag), then exit 0.
 * --check probes the daemon, the model and every MCP server and exits 0 or 1. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "worker/worker.h"

static atomic_bool stop_flag;

/* ---------------------------------------------------------------- signals */

/* Signals are blocked in every thread; this one takes them. */
static void *signal_main(void *arg) {
  sigset_t *set = arg;
  for (;;) {
    int sig = 0;
    if (sigwait(set, &sig) != 0)
      continue;
    if (sig == SIGUSR1) /* main's wake-up at exit */
      return NULL;
    if (!atomic_exchange(&stop_flag, true))
      cph_log_kv(CPH_LOG_INFO, "stopping: no new leases, running turns end now", "signal=%d", sig);
  }
}

/* ---------------------------------------------------------------- leasing */

/* The lease asks only for what turn.c reads besides the identity fields: the messages it
 * sends the model and available_tools, which narrows its tools (the daemon then neither copies
 * nor writes the other sections, and reads no memories for them). */
static json_t *lease_body(const wk_config *cfg) {
  json_t *body = json_pack("{s:s, s:i, s:[s, s]}", "worker", cfg->worker_name, "wait_ms",
                           cfg->lease_wait_ms, "include", "messages", "sections.available_tools");
  if (cfg->lanes) {
    json_t *lanes = json_array();
    char copy[256];
    snprintf(copy, sizeof copy, "%s", cfg->lanes);
    char *save = NULL;
    for (char *l = strtok_r(copy, ",", &save); l; l = strtok_r(NULL, ",", &save))
      json_array_append_new(lanes, json_string(l));
    json_object_set_new(body, "lanes", lanes);
  }
  return body;
}

static void *turn_thread(void *arg) {
  const wk_ctx *ctx = arg;
  json_t *body = lease_body(ctx->cfg);
  wk_beat *beat = wk_beat_new(ctx);
  if (!beat) { /* before any lease: nothing is left waiting */
    cph_log(CPH_LOG_ERROR, "out of memory: a turn thread stops");
    json_decref(body);
    return NULL;
  }
  int backoff_ms = 0;
  while (!atomic_load(ctx->stop)) {
    if (backoff_ms) { /* the daemon is away: try again, a little later each time */
      for (int slept = 0; slept < backoff_ms && !atomic_load(ctx->stop); slept += 100) {
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
      }
      if (atomic_load(ctx->stop))
        break;
    }
    wk_lease lease;
    char err[512];
    /* Not cancelled by SIGTERM: a lease granted while we hang up would be left to expire.
     * The wait is short instead, and a turn that comes after the stop is failed at once. */
    int status = wk_daemon_lease(ctx, body, ctx->cfg->lease_wait_ms + 15000, &lease, err,
                                 sizeof err);
    if (status == 200 && json_is_object(json_object_get(lease.answer, "turn"))) {
      backoff_ms = 0;
      wk_turn_run(ctx, &lease, beat);
    } else if (status == 204) {
      backoff_ms = 0;
    } else {
      cph_log_kv(CPH_LOG_WARN, "lease failed", "status=%d", status);
      backoff_ms = backoff_ms ? (backoff_ms * 2 > 10000 ? 10000 : backoff_ms * 2) : 250;
    }
    wk_lease_free(&lease);
  }
  wk_beat_free(beat);
  json_decref(body);
  return NULL;
}

/* ---------------------------------------------------------------- the nodes (DESIGN §14)
 *
 * Given any node of a cluster, the worker long-polls every node: GET /v1/cluster lists them,
 * and each gets --concurrency threads of its own (a turn is leased, heartbeated and completed
 * on the node that leased it; a call that lands on a node that no longer owns the turn is
 * followed once to the owner, wk_daemon_call). The list is read again every
 * DISCOVER_EVERY_MS: a node that joins gets its threads then; the threads of a node that
 * left back off and retry it, as they would a daemon that went away. Without a cluster
 * (GET /v1/cluster answers 404, or the daemon is not up yet) there is one node, --daemon,
 * and the list is asked for again all the same. */

#define DISCOVER_EVERY_MS 15000

typedef struct node_threads {
  wk_ctx ctx; /* ctx.node = url */
  char *url;
  pthread_t *threads;
  int started;
} node_threads;

typedef struct fleet {
  node_threads *v;
  size_t n, cap;
} fleet;

static bool fleet_has(const fleet *f, const char *url) {
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->v[i].url, url) == 0)
      return true;
  return false;
}

/* Starts --concurrency turn threads on url. The fleet's array holds each node's ctx at a
 * fixed address: it is grown before any thread of a new node starts, and entries never move
 * after (cap is set once, below). */
static void fleet_start(fleet *f, const wk_ctx *base, const char *url) {
  if (f->n == f->cap || fleet_has(f, url))
    return;
  node_threads *nt = &f->v[f->n];
  nt->url = strdup(url);
  nt->threads = calloc((size_t)base->cfg->concurrency, sizeof *nt->threads);
  if (!nt->url || !nt->threads) {
    free(nt->url);
    free(nt->threads);
    return;
  }
  nt->ctx = *base;
  nt->ctx.node = nt->url;
  nt->started = 0;
  for (int i = 0; i < base->cfg->concurrency; i++)
    if (pthread_create(&nt->threads[nt->started], NULL, turn_thread, &nt->ctx) == 0)
      nt->started++;
  f->n++;
  cph_log_kv(CPH_LOG_INFO, "long-polling a node", "url=%s threads=%d", url, nt->started);
}

/* The nodes' URLs from GET /v1/cluster on cfg->daemon; none (n 0) when it is no cluster. */
static void discover(const wk_ctx *base, fleet *f) {
  json_t *j = NULL;
  char err[512];
  int status = wk_daemon_call(base, "GET", "/v1/cluster", NULL, 10000, &j, err, sizeof err);
  size_t i;
  json_t *node;
  if (status == 200)
    json_array_foreach(json_object_get(j, "nodes"), i, node) {
      const char *url = json_string_value(json_object_get(node, "url"));
      if (url && url[0])
        fleet_start(f, base, url);
    }
  json_decref(j);
}

static void sleep_unless_stopped(int ms) {
  for (int slept = 0; slept < ms && !atomic_load(&stop_flag); slept += 100) {
    struct timespec ts = {0, 100000000L};
    nanosleep(&ts, NULL);
  }
}

/* Runs the worker's turn threads until SIGTERM; the number of threads started. */
static int run_fleet(const wk_ctx *base) {
  fleet f = {calloc(64, sizeof *f.v), 0, 64}; /* at most 64 nodes are polled */
  if (!f.v)
    return 0;
  discover(base, &f);
  bool cluster = f.n > 0;
  if (!cluster)
    fleet_start(&f, base, base->cfg->daemon);
  else
    cph_log_kv(CPH_LOG_INFO, "cluster: long-polling every node", "nodes=%zu", f.n);
  while (!atomic_load(&stop_flag)) { /* a daemon not up at start may turn out a cluster */
    sleep_unless_stopped(DISCOVER_EVERY_MS);
    if (!atomic_load(&stop_flag))
      discover(base, &f);
  }
  int started = 0;
  for (size_t i = 0; i < f.n; i++) {
    for (int t = 0; t < f.v[i].started; t++)
      pthread_join(f.v[i].threads[t], NULL);
    started += f.v[i].started;
    free(f.v[i].threads);
    free(f.v[i].url);
  }
  free(f.v);
  return started;
}

/* ---------------------------------------------------------------- --check */

static int check(const wk_ctx *ctx) {
  int failed = 0;
  char err[512];
  json_t *j = NULL;
  int status = wk_daemon_call(ctx, "GET", "/healthz", NULL, 10000, &j, err, sizeof err);
  json_decref(j);
  if (status == 200)
    printf("ok      daemon %s: healthz 200\n", ctx->cfg->daemon);
  else
    printf("FAILED  daemon %s: %s\n", ctx->cfg->daemon, err), failed = 1;

  cph_httpc_url url;
  const char *why = NULL;
  if (cph_httpc_url_parse(ctx->cfg->llm, &url, &why) == 0) {
    cph_httpc_request req = {.method = "GET",
                             .path = "/models",
                             .token = ctx->api_key,
                             .user_agent = "cephalon-worker",
                             .timeout_ms = 15000};
    cph_httpc_response resp;
    int rc = cph_httpc_do(&url, &req, &resp, err, sizeof err);
    if (rc == CPH_HTTPC_OK && resp.status >= 200 && resp.status < 300) {
      json_t *m = json_loadb(resp.body, resp.body_len, 0, NULL);
      json_t *data = json_object_get(m, "data");
      bool listed = false;
      size_t i;
      json_t *d;
      json_array_foreach(data, i, d) {
        const char *mid = json_string_value(json_object_get(d, "id"));
        listed |= mid && strcmp(mid, ctx->cfg->model) == 0;
      }
      printf("ok      model %s: %zu models%s\n", ctx->cfg->llm, json_array_size(data),
             listed ? ", the model is listed" : "");
      json_decref(m);
    } else if (rc == CPH_HTTPC_OK) {
      /* No /models: a one-token completion tells as much. */
      cph_httpc_response_free(&resp);
      json_t *body = json_pack("{s:s, s:[{s:s, s:s}], s:i}", "model", ctx->cfg->model, "messages",
                               "role", "user", "content", "ping", "max_tokens", 1);
      char *text = json_dumps(body, JSON_COMPACT);
      json_decref(body);
      cph_httpc_request post = wk_model_request(ctx, text, 60000);
      rc = cph_httpc_do(&url, &post, &resp, err, sizeof err);
      free(text);
      if (rc == CPH_HTTPC_OK && resp.status >= 200 && resp.status < 300)
        printf("ok      model %s: a one-token completion answered\n", ctx->cfg->llm);
      else if (rc == CPH_HTTPC_OK)
        printf("FAILED  model %s: HTTP %d %.200s\n", ctx->cfg->llm, resp.status, resp.body),
            failed = 1;
      else
        printf("FAILED  model %s: %s\n", ctx->cfg->llm, err), failed = 1;
    } else {
      printf("FAILED  model %s: %s\n", ctx->cfg->llm, err), failed = 1;
    }
    cph_httpc_response_free(&resp);
  }
  cph_httpc_url_free(&url);

  for (size_t i = 0; i < wk_mcp_count(ctx->mcp); i++) {
    char out[2048];
    if (wk_mcp_probe(ctx->mcp, i, out, sizeof out) == 0)
      printf("ok      mcp %s: %s\n", wk_mcp_name(ctx->mcp, i), out);
    else
      printf("FAILED  mcp %s: %s\n", wk_mcp_name(ctx->mcp, i), out), failed = 1;
  }
  fflush(stdout);
  return failed;
}

/* ---------------------------------------------------------------- main */

static int key_from_env(const char *var, const char *what, const char **out) {
  *out = NULL;
  if (!var)
    return 0;
  const char *v = getenv(var);
  if (!v || !v[0]) {
    fprintf(stderr, "cephalon-worker: environment variable %s (%s) is not set\n", var, what);
    return -1;
  }
  for (const char *p = v; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) {
      fprintf(stderr,
              "cephalon-worker: environment variable %s (%s) holds control "
              "characters\n",
              var, what);
      return -1;
    }
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  wk_config cfg;
  int rc = wk_config_load(&cfg, argc, argv);
  if (rc) {
    wk_config_free(&cfg);
    return rc == 1 ? 0 : 2;
  }
  if (cfg.check_config) {
    wk_config_print(&cfg, stdout);
    wk_config_free(&cfg);
    return 0;
  }
  wk_ctx ctx = {.cfg = &cfg, .stop = &stop_flag};
  if (key_from_env(cfg.api_key_env, "--api-key-env", &ctx.api_key) != 0 ||
      key_from_env(cfg.token_env, "--token-env", &ctx.daemon_token) != 0) {
    wk_config_free(&cfg);
    return 2;
  }
  if (cfg.ca_file)
    cph_httpc_set_ca_file(cfg.ca_file);

  /* Every thread (MCP readers, turns, heartbeats) inherits this mask. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN); /* a dead MCP server's pipe is an error, not a signal */
  atomic_init(&stop_flag, false);
  pthread_t sig_thread;
  pthread_create(&sig_thread, NULL, signal_main, &set);

  char err[2048];
  ctx.mcp = wk_mcp_start(&cfg, err, sizeof err);
  if (!ctx.mcp) {
    fprintf(stderr, "cephalon-worker: out of memory\n");
    return 1;
  }
  if (err[0] && !cfg.check)
    cph_log_kv(CPH_LOG_WARN, "some MCP servers did not start; retried at their first call",
               "servers=%zu", cfg.n_mcp);

  int exit_code = 0;
  if (cfg.check) {
    exit_code = check(&ctx);
  } else {
    cph_log_kv(CPH_LOG_INFO, "cephalon-worker ready",
               "worker=%s concurrency=%d mcp_servers=%zu max_tool_rounds=%d", cfg.worker_name,
               cfg.concurrency, cfg.n_mcp, cfg.max_tool_rounds);
    int started = run_fleet(&ctx);
    if (!started)
      exit_code = 1;
    cph_log_kv(CPH_LOG_INFO, "cephalon-worker stopped", "worker=%s", cfg.worker_name);
  }
  pthread_kill(sig_thread, SIGUSR1);
  pthread_join(sig_thread, NULL);
  wk_mcp_stop(ctx.mcp);
  wk_config_free(&cfg);
  cph_httpc_global_cleanup();
  return exit_code;
}
