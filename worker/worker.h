/* cephalon-worker, the reference LLM worker (DESIGN §13): leases turns from cephalond, runs
 * the model (OpenAI chat completions) with the tools of its MCP servers, completes or fails
 * each turn. One internal header for its files:
 *
 *   config.c  options from argv and an EDN file (wk_config_*)
 *   mcp.c     MCP stdio clients: spawn, initialize, tools/list, tools/call, restart (wk_mcp_*)
 *   schema.c  tool arguments against a tool's input schema (wk_schema_check)
 *   lease.c   the lease answer: its messages as text for the model, the rest as a tree
 *   turn.c    one turn: model rounds, tool calls, heartbeats, complete/fail (wk_turn_run)
 *   main.c    threads, leasing, signals, --check
 *
 * Calls go one way: main -> turn -> lease, mcp, schema -> config. JSON is jansson; HTTP is
 * common/http_client.h (libcurl). No key or token is ever logged. */
#ifndef CEPHALON_WORKER_H
#define CEPHALON_WORKER_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/buf.h"
#include "common/http_client.h"

/* ---------------------------------------------------------------- configuration */

typedef struct wk_mcp_spec {
  char *name;    /* the server's name, from NAME=COMMAND */
  char *command; /* run with /bin/sh -c (so ARGS are split as a shell would) */
} wk_mcp_spec;

typedef struct wk_config {
  char *daemon; /* base URL of cephalond */
  char *llm;    /* base URL of the OpenAI-compatible API ({llm}/chat/completions) */
  char *model;
  char *api_key_env; /* env var with the model's key; NULL: no Authorization */
  char *token_env;   /* env var with the daemon's bearer token; NULL: none */
  char *worker_name; /* the lease's `worker`; default cephalon-worker-<host>-<pid> */
  char *lanes;       /* "interactive,operational" or NULL (all) */
  char *ca_file;     /* https CA for the daemon and the model; NULL: system bundle */
  wk_mcp_spec *mcp;
  size_t n_mcp;
  int concurrency;     /* turns at once, 1..256 (default 1) */
  int max_tool_rounds; /* default 8 */
  int lease_wait_ms;   /* long-poll wait per lease request (default 5000) */
  int llm_timeout_ms;  /* one model call (default 300000) */
  int tool_timeout_ms; /* one tool call (default 120000) */
  bool check;          /* --check: probe everything and exit */
  bool check_config;   /* --check-config: print the effective options and exit (no network) */
} wk_config;

/* Fills cfg from argv (a --config file first, then the flags over it). Returns 0; or 2 after
 * printing the usage error (file:line:col for the EDN file) to stderr; or 1 for --help
 * (usage printed to stdout). */
int wk_config_load(wk_config *cfg, int argc, char **argv);
/* The effective options as EDN (env var names only, never their values). */
void wk_config_print(const wk_config *cfg, FILE *out);
void wk_config_free(wk_config *cfg);

/* ---------------------------------------------------------------- MCP */

typedef struct wk_tool {
  char *name;
  char *description;
  json_t *schema; /* inputSchema (an object; {"type":"object"} when the server gave none) */
  size_t server;  /* index into the servers */
} wk_tool;

typedef struct wk_mcp wk_mcp;

/* Starts every server (initialize + tools/list). Returns NULL only on out of memory; a
 * server that fails to start is reported in err (one line per server) and retried at its
 * first call. */
wk_mcp *wk_mcp_start(const wk_config *cfg, char *err, size_t err_len);
void wk_mcp_stop(wk_mcp *m);

/* A snapshot of the tools of every live server, in server order (first name wins). The
 * caller frees it with wk_tools_free. */
int wk_mcp_tools(wk_mcp *m, wk_tool **out, size_t *n);
void wk_tools_free(wk_tool *t, size_t n);

/* Outcome of one tools/call. */
typedef enum wk_call_result {
  WK_CALL_OK,       /* *text is the tool's output */
  WK_CALL_TOOL_ERR, /* isError or a JSON-RPC error: *text says what; the model sees it */
  WK_CALL_FAILED    /* transport: the server died, timed out or cannot start; fail the turn */
} wk_call_result;

/* Calls tool `name` of server `server` with args (an object). *text is malloc'd (free it).
 * Blocks up to timeout_ms; gives up early when *stop becomes true. A dead server is
 * restarted (once per call). */
wk_call_result wk_mcp_call(wk_mcp *m, size_t server, const char *name, json_t *args, int timeout_ms,
                           const atomic_bool *stop, char **text);

/* --check: initialize + tools/list for server i, with a one-line summary in out. */
int wk_mcp_probe(wk_mcp *m, size_t i, char *out, size_t out_len);
size_t wk_mcp_count(const wk_mcp *m);
const char *wk_mcp_name(const wk_mcp *m, size_t i);

/* ---------------------------------------------------------------- arguments */

/* 0 when args (already parsed) satisfy schema at its top level: an object, every required
 * property present, each given property of the declared JSON type(s). Otherwise -1 with why
 * ("missing required property \"path\"", "property \"n\" must be integer"). */
int wk_schema_check(const json_t *schema, const json_t *args, char *why, size_t why_len);

/* ---------------------------------------------------------------- the lease answer */

/* A lease answer read for the model (lease.c): the turn's messages as the model takes them,
 * written as JSON text straight from the answer's text, and the rest of the answer as a tree
 * (jansson), so the bulk of it is neither parsed into a tree, freed nor dumped again. */
typedef struct wk_lease {
  json_t *answer;   /* the answer, with turn.messages emptied ([]) */
  cph_buf messages; /* each message's role (default "user"), content (default "") and name
                       (when a string), as JSON objects separated by commas, no brackets */
  size_t n_messages;
  bool whole; /* the scanner could not walk the text: it was parsed whole, as before */
} wk_lease;

/* 0, or -1 when text is not a JSON answer (nothing to free then). */
int wk_lease_read(const char *text, size_t len, wk_lease *out);
void wk_lease_free(wk_lease *l);

/* ---------------------------------------------------------------- a turn */

typedef struct wk_ctx {
  const wk_config *cfg;
  const char *node; /* the daemon this context's calls go to: cfg->daemon, or in a
                       cluster one node's URL from GET /v1/cluster (NULL: cfg->daemon) */
  wk_mcp *mcp;
  const char *daemon_token; /* from token_env, or NULL */
  const char *api_key;      /* from api_key_env, or NULL */
  atomic_bool *stop;        /* SIGTERM: stop leasing, fail what is running */
} wk_ctx;

/* A turn thread's heartbeat thread (turn.c), made once and armed for each of its turns.
 * NULL when out of memory; a thread that cannot start is logged, and its turns run without
 * heartbeats. */
typedef struct wk_beat wk_beat;
wk_beat *wk_beat_new(const wk_ctx *ctx);
void wk_beat_free(wk_beat *b);

/* Runs the leased turn (a lease answer, wk_lease_read) to its end with beat's heartbeats:
 * completes it, or fails it with the reason. Logs one line. Never returns with the lease
 * still open unless the daemon cannot be reached at all. */
void wk_turn_run(const wk_ctx *ctx, const wk_lease *lease, wk_beat *beat);

/* POST /chat/completions with body `text` (JSON) to the model: the request, for
 * cph_httpc_do against cfg->llm (the key, if any, as the bearer token). */
cph_httpc_request wk_model_request(const wk_ctx *ctx, const char *text, int timeout_ms);

/* A call to the daemon (ctx->node): method path with an optional JSON body; *resp_json gets
 * the answer's JSON (or NULL). A 421 (in a cluster, another node owns what the call names)
 * is followed once to the owner's URL that the answer gives. Returns the HTTP status, or -1
 * with err filled. */
int wk_daemon_call(const wk_ctx *ctx, const char *method, const char *path, json_t *body,
                   int timeout_ms, json_t **resp_json, char *err, size_t err_len);
/* wk_daemon_call for a lease: a 200's body is read by wk_lease_read into *lease (which the
 * caller frees when the call returned 200 with a turn: lease->answer non-NULL). */
int wk_daemon_lease(const wk_ctx *ctx, json_t *body, int timeout_ms, wk_lease *lease,
                    char *err, size_t err_len);

#endif
