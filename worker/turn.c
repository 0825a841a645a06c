/* One leased turn: model rounds with the MCP tools, heartbeats while anything runs, then
 * complete (reply, cost, per-tool stats) or fail (the reason; the daemon retries it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/worker.h"

#define DAEMON_TIMEOUT_MS 10000
#define MAX_STATS 256 /* distinct tool names counted per turn (the daemon takes 256) */

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- the daemon */

/* One call to the daemon at base; *owner gets the owner's URL of a 421 (malloc'd) or NULL. */
/* With lease non-NULL, a 200's body is read into it by wk_lease_read, not into *resp_json. */
static int daemon_call_at(const wk_ctx *ctx, const char *base, const char *method, const char *path,
                          const char *text, int timeout_ms, json_t **resp_json, wk_lease *lease,
                          char **owner, char *err, size_t err_len) {
  *owner = NULL;
  cph_httpc_url url;
  const char *why = NULL;
  if (cph_httpc_url_parse(base, &url, &why) != 0) {
    cph_httpc_url_free(&url);
    snprintf(err, err_len, "bad daemon URL %s: %s", base, why);
    return -1;
  }
  cph_httpc_request req = {.method = method,
                           .path = path,
                           .token = ctx->daemon_token,
                           .user_agent = "cephalon-worker",
                           .body = text,
                           .body_len = text ? strlen(text) : 0,
                           .timeout_ms = timeout_ms};
  cph_httpc_response resp;
  char detail[400];
  int rc = cph_httpc_do(&url, &req, &resp, detail, sizeof detail);
  cph_httpc_url_free(&url);
  if (rc != CPH_HTTPC_OK) {
    snprintf(err, err_len, "%s %s: %s", method, path, detail);
    return -1;
  }
  if (lease && resp.status == 200 && resp.body_len) {
    int status = resp.status;
    if (wk_lease_read(resp.body, resp.body_len, lease) != 0) {
      snprintf(err, err_len, "%s %s: the answer is not JSON", method, path);
      status = -1;
    }
    cph_httpc_response_free(&resp);
    return status;
  }
  json_t *j = resp.body_len ? json_loadb(resp.body, resp.body_len, 0, NULL) : NULL;
  if (resp.status >= 300) {
    json_t *e = json_object_get(j, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    snprintf(err, err_len, "%s %s: HTTP %d: %.200s", method, path, resp.status, m ? m : resp.body);
    const char *o = json_string_value(json_object_get(json_object_get(e, "owner"), "url"));
    if (resp.status == 421 && o && o[0])
      *owner = strdup(o);
  }
  if (resp_json)
    *resp_json = j;
  else
    json_decref(j);
  int status = resp.status;
  cph_httpc_response_free(&resp);
  return status;
}

static int daemon_call(const wk_ctx *ctx, const char *method, const char *path, json_t *body,
                       int timeout_ms, json_t **resp_json, wk_lease *lease, char *err,
                       size_t err_len) {
  if (resp_json)
    *resp_json = NULL;
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  char *owner = NULL;
  int status = daemon_call_at(ctx, ctx->node ? ctx->node : ctx->cfg->daemon, method, path, text,
                              timeout_ms, resp_json, lease, &owner, err, err_len);
  if (status == 421 && owner) { /* the shard moved: once to the node that owns it now */
    if (resp_json) {
      json_decref(*resp_json);
      *resp_json = NULL;
    }
    char *again = NULL;
    status = daemon_call_at(ctx, owner, method, path, text, timeout_ms, resp_json, lease, &again,
                            err, err_len);
    free(again);
  }
  free(owner);
  free(text);
  return status;
}

int wk_daemon_call(const wk_ctx *ctx, const char *method, const char *path, json_t *body,
                   int timeout_ms, json_t **resp_json, char *err, size_t err_len) {
  return daemon_call(ctx, method, path, body, timeout_ms, resp_json, NULL, err, err_len);
}

int wk_daemon_lease(const wk_ctx *ctx, json_t *body, int timeout_ms, wk_lease *lease,
                    char *err, size_t err_len) {
  memset(lease, 0, sizeof *lease);
  return daemon_call(ctx, "POST", "/v1/turns/lease", body, timeout_ms, NULL, lease, err,
                     err_len);
}

/* ---------------------------------------------------------------- heartbeats
 *
 * One heartbeat thread per turn thread, made once and armed for each turn (a thread made and
 * joined for each turn took about a third of the worker's CPU against an instant model:
 * bench/PROFILE.md, "The reference worker's own cost"). Armed, it
 * posts the turn's heartbeat every interval; disarmed, it waits for the next turn. A disarm
 * waits for a heartbeat in flight, so nothing of the turn is used after the turn ended. */

struct wk_beat {
  const wk_ctx *ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* CLOCK_MONOTONIC: arm, disarm, quit */
  pthread_cond_t idle_cv; /* a heartbeat in flight ended */
  bool armed, quit, calling;
  uint64_t turn;          /* bumped by each arm and disarm: a wait or call of another turn's */
  char path[96];
  char *lease;            /* the armed turn's (owned) */
  int interval_ms;
  atomic_bool lost;       /* the daemon said the lease is gone (409, 404): stop working */
  atomic_bool interrupt;  /* a heartbeat said "interrupt": stop at the next safe point */
  pthread_t th;
  bool started;
};
typedef struct wk_beat beat;

static void *beat_main(void *arg) {
  beat *b = arg;
  pthread_mutex_lock(&b->mu);
  while (!b->quit) {
    if (!b->armed) {
      pthread_cond_wait(&b->cv, &b->mu);
      continue;
    }
    uint64_t turn = b->turn;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += b->interval_ms / 1000;
    ts.tv_nsec += (long)(b->interval_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    while (!b->quit && b->turn == turn && pthread_cond_timedwait(&b->cv, &b->mu, &ts) == 0) {
    }
    if (b->quit || b->turn != turn)
      continue;
    b->calling = true; /* path and lease stay as they are until the disarm sees it false */
    pthread_mutex_unlock(&b->mu);
    json_t *body = json_pack("{s:s}", "lease", b->lease);
    char err[512];
    json_t *ans = NULL;
    int status =
        wk_daemon_call(b->ctx, "POST", b->path, body, DAEMON_TIMEOUT_MS, &ans, err, sizeof err);
    json_decref(body);
    if (status == 200 && json_is_true(json_object_get(ans, "interrupt")))
      atomic_store(&b->interrupt, true);
    json_decref(ans);
    if (status == 404 || status == 409 || status == 410) {
      atomic_store(&b->lost, true);
      cph_log_kv(CPH_LOG_WARN, "lease lost", "path=%s status=%d", b->path, status);
    } else if (status != 200) {
      cph_log_kv(CPH_LOG_WARN, "heartbeat failed", "path=%s status=%d", b->path, status);
    }
    pthread_mutex_lock(&b->mu);
    b->calling = false;
    pthread_cond_broadcast(&b->idle_cv);
  }
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

wk_beat *wk_beat_new(const wk_ctx *ctx) {
  beat *b = calloc(1, sizeof *b);
  if (!b)
    return NULL;
  b->ctx = ctx;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&b->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_cond_init(&b->idle_cv, NULL);
  pthread_mutex_init(&b->mu, NULL);
  atomic_init(&b->lost, false);
  atomic_init(&b->interrupt, false);
  b->started = pthread_create(&b->th, NULL, beat_main, b) == 0;
  if (!b->started)
    cph_log(CPH_LOG_WARN, "no heartbeat thread: turns longer than a lease will lose it");
  return b;
}

void wk_beat_free(wk_beat *b) {
  if (!b)
    return;
  pthread_mutex_lock(&b->mu);
  b->quit = true;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
  if (b->started)
    pthread_join(b->th, NULL);
  free(b->lease);
  pthread_cond_destroy(&b->cv);
  pthread_cond_destroy(&b->idle_cv);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

/* Heartbeats for turn id under lease from now until beat_disarm (none when the lease cannot
 * be copied: the turn runs without them, as it does without the thread). */
static void beat_arm(beat *b, uint64_t id, const char *lease, int64_t deadline_ms) {
  pthread_mutex_lock(&b->mu);
  b->turn++;
  snprintf(b->path, sizeof b->path, "/v1/turns/%llu/heartbeat", (unsigned long long)id);
  free(b->lease);
  b->lease = strdup(lease);
  int64_t ttl = deadline_ms - wall_ms();
  /* A third of the lease's time: two heartbeats may be lost before it ends. */
  b->interval_ms = ttl > 300 ? (int)(ttl / 3 > 600000 ? 600000 : ttl / 3) : 100;
  atomic_store(&b->lost, false);
  atomic_store(&b->interrupt, false);
  b->armed = b->lease != NULL;
  pthread_cond_signal(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

static void beat_disarm(beat *b) {
  pthread_mutex_lock(&b->mu);
  b->armed = false;
  b->turn++;
  pthread_cond_signal(&b->cv);
  while (b->calling)
    pthread_cond_wait(&b->idle_cv, &b->mu);
  pthread_mutex_unlock(&b->mu);
}

/* ---------------------------------------------------------------- per-tool counts */

typedef struct tool_stat {
  char *name;
  uint64_t calls, invalid, errors;
} tool_stat;

typedef struct stats {
  tool_stat items[MAX_STATS];
  size_t n;
  uint64_t calls, invalid;
} stats;

static tool_stat *stat_for(stats *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->items[i].name, name) == 0)
      return &s->items[i];
  if (s->n == MAX_STATS)
    return &s->items[MAX_STATS - 1]; /* the last one takes the rest */
  tool_stat *t = &s->items[s->n++];
  t->name = strndup(name[0] ? name : "_unnamed", 128);
  return t;
}

static json_t *stats_json(const stats *s) {
  json_t *tools = json_object();
  for (size_t i = 0; i < s->n; i++)
    if (s->items[i].name)
      json_object_set_new(tools, s->items[i].name,
                          json_pack("{s:I, s:I, s:I}", "calls", (json_int_t)s->items[i].calls,
                                    "invalid", (json_int_t)s->items[i].invalid, "errors",
                                    (json_int_t)s->items[i].errors));
  return json_pack("{s:I, s:I, s:i, s:i, s:o}", "valid", (json_int_t)(s->calls - s->invalid),
                   "invalid", (json_int_t)s->invalid, "repairs", 0, "guard_denies", 0, "tools",
                   tools);
}

static void stats_free(stats *s) {
  for (size_t i = 0; i < s->n; i++)
    free(s->items[i].name);
}

/* ---------------------------------------------------------------- the model */

typedef struct cancel_arg {
  const atomic_bool *stop;
  atomic_bool *lost;
} cancel_arg;

static int should_cancel(void *arg) {
  cancel_arg *c = arg;
  return atomic_load(c->stop) || atomic_load(c->lost);
}

cph_httpc_request wk_model_request(const wk_ctx *ctx, const char *text, int timeout_ms) {
  return (cph_httpc_request){.method = "POST",
                             .path = "/chat/completions",
                             .token = ctx->api_key,
                             .user_agent = "cephalon-worker",
                             .body = text,
                             .body_len = text ? strlen(text) : 0,
                             .timeout_ms = timeout_ms};
}

/* POST {llm}/chat/completions. 0 with *answer (the parsed body), or -1 with why. */
static int model_call(const wk_ctx *ctx, const char *text, cancel_arg *cancel, json_t **answer,
                      char *why, size_t why_len) {
  *answer = NULL;
  cph_httpc_url url;
  const char *bad = NULL;
  if (cph_httpc_url_parse(ctx->cfg->llm, &url, &bad) != 0) {
    cph_httpc_url_free(&url);
    snprintf(why, why_len, "model: bad URL: %s", bad);
    return -1;
  }
  cph_httpc_request req = wk_model_request(ctx, text, ctx->cfg->llm_timeout_ms);
  req.cancel = should_cancel;
  req.cancel_arg = cancel;
  cph_httpc_response resp;
  char detail[400];
  int rc = text ? cph_httpc_do(&url, &req, &resp, detail, sizeof detail) : CPH_HTTPC_ENOMEM;
  cph_httpc_url_free(&url);
  if (rc == CPH_HTTPC_ECANCELED) {
    snprintf(why, why_len, "%s", atomic_load(cancel->stop) ? "worker stopping" : "lease lost");
    return -1;
  }
  if (rc != CPH_HTTPC_OK) {
    snprintf(why, why_len, "model: %s", rc == CPH_HTTPC_ENOMEM ? "out of memory" : detail);
    return -1;
  }
  json_error_t jerr;
  json_t *j = json_loadb(resp.body, resp.body_len, 0, &jerr);
  if (resp.status < 200 || resp.status >= 300) {
    const json_t *e = json_object_get(j, "error");
    const char *m =
        json_is_string(e) ? json_string_value(e) : json_string_value(json_object_get(e, "message"));
    snprintf(why, why_len, "model: HTTP %d%s%.300s", resp.status, m || resp.body_len ? ": " : "",
             m ? m : resp.body);
    for (char *p = why; *p; p++)
      if ((unsigned char)*p < 0x20)
        *p = ' ';
    json_decref(j);
    cph_httpc_response_free(&resp);
    return -1;
  }
  cph_httpc_response_free(&resp);
  if (!json_is_object(j)) {
    snprintf(why, why_len, "model: the answer is not a JSON object (%s)", jerr.text);
    json_decref(j);
    return -1;
  }
  *answer = j;
  return 0;
}

/* ---------------------------------------------------------------- tools */

/* The tools the turn may use: every MCP tool, or when the session names tools (tools_named
 * > 0), those of them in sections.available_tools. */
static void narrow_tools(json_t *turn, wk_tool **tools, size_t *n) {
  if (json_integer_value(json_object_get(turn, "tools_named")) <= 0)
    return;
  json_t *avail = json_object_get(json_object_get(turn, "sections"), "available_tools");
  size_t kept = 0;
  for (size_t i = 0; i < *n; i++) {
    bool named = false;
    size_t k;
    json_t *a;
    json_array_foreach(avail, k, a) {
      const char *name = json_string_value(json_object_get(a, "name"));
      if (!name)
        name = json_string_value(a);
      if (name && strcmp(name, (*tools)[i].name) == 0)
        named = true;
    }
    if (named) {
      (*tools)[kept++] = (*tools)[i];
    } else {
      free((*tools)[i].name);
      free((*tools)[i].description);
      json_decref((*tools)[i].schema);
    }
  }
  *n = kept;
}

static json_t *tools_json(const wk_tool *tools, size_t n) {
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(arr, json_pack("{s:s, s:{s:s, s:s, s:O}}", "type", "function", "function",
                                         "name", tools[i].name, "description", tools[i].description,
                                         "parameters", tools[i].schema));
  return arr;
}

static const wk_tool *find_tool(const wk_tool *tools, size_t n, const char *name) {
  for (size_t i = 0; name && i < n; i++)
    if (strcmp(tools[i].name, name) == 0)
      return &tools[i];
  return NULL;
}

/* Runs one tool call of the model; appends its `tool` message. -1 with why when the turn must
 * fail (the server is gone, the worker stops). */
static int run_tool_call(const wk_ctx *ctx, const wk_tool *tools, size_t n_tools, json_t *call,
                         json_t *messages, stats *st, cancel_arg *cancel, char *why,
                         size_t why_len) {
  json_t *fn = json_object_get(call, "function");
  const char *id = json_string_value(json_object_get(call, "id"));
  const char *name = json_string_value(json_object_get(fn, "name"));
  json_t *raw = json_object_get(fn, "arguments");
  tool_stat *ts = stat_for(st, name ? name : "");
  ts->calls++;
  st->calls++;
  char *output = NULL;
  char problem[300] = "";
  const wk_tool *tool = find_tool(tools, n_tools, name);
  json_t *args = NULL;
  if (!tool) {
    snprintf(problem, sizeof problem, "unknown tool \"%.100s\"", name ? name : "");
  } else if (json_is_object(raw)) { /* some servers send the object itself */
    args = json_incref(raw);
  } else if (json_is_string(raw)) {
    const char *s = json_string_value(raw);
    json_error_t jerr;
    args = s[strspn(s, " \t\r\n")] ? json_loads(s, JSON_DECODE_ANY, &jerr) : json_object();
    if (!args)
      snprintf(problem, sizeof problem, "arguments are not JSON: %s", jerr.text);
  } else if (!raw || json_is_null(raw)) {
    args = json_object();
  } else {
    snprintf(problem, sizeof problem, "arguments must be a JSON string");
  }
  if (!problem[0] && wk_schema_check(tool->schema, args, problem, sizeof problem) != 0) {
    /* problem says what */
  }
  if (problem[0]) {
    ts->invalid++;
    st->invalid++;
    size_t len = strlen(problem) + 64;
    output = malloc(len);
    if (output)
      snprintf(output, len, "invalid arguments: %s", problem);
  } else {
    wk_call_result r = wk_mcp_call(ctx->mcp, tool->server, tool->name, args,
                                   ctx->cfg->tool_timeout_ms, cancel->stop, &output);
    if (r == WK_CALL_FAILED) {
      snprintf(why, why_len, "tool %s: %s", tool->name, output ? output : "failed");
      free(output);
      json_decref(args);
      return -1;
    }
    if (r == WK_CALL_TOOL_ERR)
      ts->errors++;
  }
  json_decref(args);
  json_array_append_new(messages, json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                                            id ? id : "", "content", output ? output : ""));
  free(output);
  return 0;
}

/* ---------------------------------------------------------------- the turn */

/* Writes the turn's own messages not written yet (`own`, from *done on: the model's answers,
 * tool results, arrivals) after the request's start in `head` — `{"model":...,"messages":[`,
 * the lease's messages as they came (wk_lease: role, content, name) and the own messages of
 * the rounds before — so each message is written once a turn, not once a round. `comma`: head
 * holds a message before own[0]. */
static void head_extend(cph_buf *head, bool comma, const json_t *own, size_t *done) {
  for (; *done < json_array_size(own); (*done)++) {
    char *t = json_dumps(json_array_get(own, *done), JSON_COMPACT);
    if (!t) {
      head->failed = true; /* a dump out of memory: the request is incomplete */
      return;
    }
    if (comma || *done)
      cph_buf_putc(head, ',');
    cph_buf_puts(head, t);
    free(t);
  }
}

/* The model request of a round, as text: head (head_extend's) closed, with the tools when
 * offered. NULL when out of memory. */
static char *request_text(const cph_buf *head, const char *tools) {
  cph_buf b = CPH_BUF_INIT;
  cph_buf_append(&b, head->data, head->len);
  cph_buf_putc(&b, ']');
  if (tools) {
    cph_buf_puts(&b, ",\"tools\":");
    cph_buf_puts(&b, tools);
    cph_buf_puts(&b, ",\"tool_choice\":\"auto\"");
  }
  cph_buf_putc(&b, '}');
  if (cph_buf_error(&b)) {
    cph_buf_free(&b);
    return NULL;
  }
  return cph_buf_steal(&b);
}

/* Completes or fails with a few retries when the daemon cannot be reached: the lease must not
 * be left to expire for a hiccup. */
static int finish(const wk_ctx *ctx, const char *path, json_t *body, char *err, size_t len) {
  int status = -1;
  for (int attempt = 0; attempt < 5; attempt++) {
    status = wk_daemon_call(ctx, "POST", path, body, DAEMON_TIMEOUT_MS, NULL, err, len);
    if (status >= 0 && status != 503)
      break;
    struct timespec ts = {0, 200000000L * (attempt + 1)};
    nanosleep(&ts, NULL);
  }
  return status;
}

/* ---------------------------------------------------------------- arrivals during the turn */

/* A heartbeat from the turn's own thread, at a safe point (DESIGN §4 :interrupt): true when
 * the daemon asks the turn to stop. The heartbeat thread's answers set the same flag; this
 * one only makes the check prompt instead of every third of the lease. */
static bool interrupt_asked(const wk_ctx *ctx, beat *b) {
  if (atomic_load(&b->interrupt))
    return true;
  if (!b->lease) /* not armed (out of memory): no heartbeat to ask with */
    return false;
  json_t *body = json_pack("{s:s}", "lease", b->lease), *ans = NULL;
  char err[512];
  int status = wk_daemon_call(ctx, "POST", b->path, body, DAEMON_TIMEOUT_MS, &ans, err, sizeof err);
  json_decref(body);
  if (status == 200 && json_is_true(json_object_get(ans, "interrupt")))
    atomic_store(&b->interrupt, true);
  else if (status == 404 || status == 409)
    atomic_store(&b->lost, true);
  json_decref(ans);
  return atomic_load(&b->interrupt);
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* OpenAI's `name`: ^[a-zA-Z0-9_-]{1,64}$, any other character as '_' (as the daemon does). */
static json_t *participant_name(const char *sender) {
  char name[65];
  size_t n = 0;
  for (; sender && sender[n] && n < 64; n++) {
    char c = sender[n];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-';
    name[n] = ok ? c : '_';
  }
  name[n] = '\0';
  return n ? json_string(name) : NULL;
}

/* :merge (DESIGN §4): takes what arrived for the session into this turn, as user messages at
 * the end of the conversation. Called only before a model call, when every tool call of the
 * conversation has its result, so a user message never splits a call from its result.
 * Returns how many entries were taken. */
static size_t take_arrivals(const wk_ctx *ctx, uint64_t id, const char *lease, json_t *messages) {
  char path[96], err[512];
  snprintf(path, sizeof path, "/v1/turns/%llu/take", (unsigned long long)id);
  json_t *body = json_pack("{s:s}", "lease", lease), *ans = NULL;
  int status = wk_daemon_call(ctx, "POST", path, body, DAEMON_TIMEOUT_MS, &ans, err, sizeof err);
  json_decref(body);
  size_t n = 0, i;
  json_t *m;
  if (status == 200)
    json_array_foreach(json_object_get(ans, "taken"), i, m) {
      json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content",
                              or_empty(json_string_value(json_object_get(m, "body"))));
      json_t *name = participant_name(json_string_value(json_object_get(m, "sender")));
      if (name)
        json_object_set_new(msg, "name", name);
      json_array_append_new(messages, msg);
      n++;
    }
  else if (status != 409) /* 409: the session stopped merging; the input waits its turn */
    cph_log_kv(CPH_LOG_WARN, "take failed", "path=%s status=%d", path, status);
  json_decref(ans);
  return n;
}

/* What an interrupted turn did, for its completion's reply: each tool call of the turn's own
 * messages (wk_turn_run keeps only those as a tree, after the lease's text) with its result,
 * so the history the next turn reads keeps every call with its result (the turn stops only
 * where each call has one). NULL when it made none. */
static char *interrupted_account(const json_t *messages) {
  cph_buf b = CPH_BUF_INIT;
  size_t calls = 0;
  for (size_t i = 0; i < json_array_size(messages); i++) {
    json_t *m = json_array_get(messages, i);
    size_t k;
    json_t *call;
    json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
      json_t *fn = json_object_get(call, "function");
      const char *cid = json_string_value(json_object_get(call, "id"));
      json_t *args = json_object_get(fn, "arguments");
      char *args_text = json_is_string(args) ? strdup(json_string_value(args))
                                             : json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
      const char *result = "(no result)";
      for (size_t j = i + 1; j < json_array_size(messages); j++) {
        json_t *r = json_array_get(messages, j);
        const char *rid = json_string_value(json_object_get(r, "tool_call_id"));
        if (rid && cid && strcmp(rid, cid) == 0) {
          result = or_empty(json_string_value(json_object_get(r, "content")));
          break;
        }
      }
      cph_buf_printf(&b, "%s- %s %s -> %.2000s", calls ? "\n" : "",
                     or_empty(json_string_value(json_object_get(fn, "name"))),
                     args_text ? args_text : "{}", result);
      free(args_text);
      calls++;
    }
  }
  if (!calls) {
    cph_buf_free(&b);
    return NULL;
  }
  cph_buf head = CPH_BUF_INIT;
  cph_buf_printf(&head,
                 "(interrupted by new messages before I finished; tool calls made so "
                 "far, with their results:)\n%.*s",
                 (int)b.len, b.data);
  cph_buf_free(&b);
  char *out = cph_buf_steal(&head);
  cph_buf_free(&head);
  return out;
}

void wk_turn_run(const wk_ctx *ctx, const wk_lease *leased, wk_beat *bt) {
  json_t *turn = json_object_get(leased->answer, "turn");
  int64_t started = cph_mono_ms();
  uint64_t id = (uint64_t)json_integer_value(json_object_get(turn, "id"));
  const char *lease = json_string_value(json_object_get(turn, "lease"));
  const char *session = json_string_value(json_object_get(turn, "session"));
  const char *lane = json_string_value(json_object_get(turn, "lane"));
  int64_t deadline = json_integer_value(json_object_get(turn, "deadline_ms"));
  if (!lease || !session)
    return;

  wk_tool *tools = NULL;
  size_t n_tools = 0;
  wk_mcp_tools(ctx->mcp, &tools, &n_tools);
  narrow_tools(turn, &tools, &n_tools);
  json_t *offered = tools_json(tools, n_tools);
  char *offered_text = n_tools ? json_dumps(offered, JSON_COMPACT) : NULL;
  /* The request's start, written once: the model and the lease's messages as they came. */
  cph_buf head = CPH_BUF_INIT;
  json_t *model = json_string(ctx->cfg->model);
  char *model_text = json_dumps(model, JSON_ENCODE_ANY);
  json_decref(model);
  cph_buf_puts(&head, "{\"model\":");
  cph_buf_puts(&head, model_text ? model_text : "\"\"");
  free(model_text);
  cph_buf_puts(&head, ",\"messages\":[");
  cph_buf_append(&head, leased->messages.data, leased->messages.len);
  json_t *messages = json_array(); /* the turn's own messages, after the lease's */
  size_t own_written = 0;           /* of them, those in head */
  /* DESIGN §4: merge -> take arrivals before each model call; interrupt -> stop at a safe
   * point when asked. Absent (enqueue and the others): the turn runs as it always did. */
  const char *wr = json_string_value(json_object_get(turn, "while_running"));
  bool merge = wr && strcmp(wr, "merge") == 0;
  bool interruptible = wr && strcmp(wr, "interrupt") == 0;
  bool interrupted = false;
  size_t taken = 0;
  stats st;
  memset(&st, 0, sizeof st);
  uint64_t tokens = 0;
  int rounds = 0;
  char why[600] = "";
  char *reply = NULL;

  beat *b = bt;
  beat_arm(b, id, lease, deadline);
  cancel_arg cancel = {.stop = ctx->stop, .lost = &b->lost};
  for (int round = 0;; round++) {
    if (atomic_load(ctx->stop)) {
      snprintf(why, sizeof why, "worker stopping");
      break;
    }
    if (atomic_load(&b->lost)) {
      snprintf(why, sizeof why, "lease lost");
      break;
    }
    /* A safe point: every tool call so far has its result. */
    if (interruptible && round > 0 && interrupt_asked(ctx, b)) {
      interrupted = true;
      reply = interrupted_account(messages);
      break;
    }
    if (merge)
      taken += take_arrivals(ctx, id, lease, messages);
    bool offer = n_tools > 0 && round < ctx->cfg->max_tool_rounds;
    head_extend(&head, leased->n_messages > 0, messages, &own_written);
    char *req = request_text(&head, offer ? offered_text : NULL);
    if (!req || cph_buf_error(&head)) {
      free(req);
      snprintf(why, sizeof why, "out of memory writing the model request");
      break;
    }
    json_t *answer = NULL;
    int rc = model_call(ctx, req, &cancel, &answer, why, sizeof why);
    free(req);
    if (rc != 0)
      break;
    rounds++;
    json_t *usage = json_object_get(answer, "usage");
    json_int_t total = json_integer_value(json_object_get(usage, "total_tokens"));
    if (total <= 0) /* some servers give only the parts */
      total = json_integer_value(json_object_get(usage, "prompt_tokens")) +
              json_integer_value(json_object_get(usage, "completion_tokens"));
    if (total > 0)
      tokens += (uint64_t)total;
    json_t *msg = json_object_get(json_array_get(json_object_get(answer, "choices"), 0), "message");
    if (!json_is_object(msg)) {
      snprintf(why, sizeof why, "model: the answer has no choices[0].message");
      json_decref(answer);
      break;
    }
    json_t *calls = json_object_get(msg, "tool_calls");
    const char *content = json_string_value(json_object_get(msg, "content"));
    if (!offer || !json_is_array(calls) || json_array_size(calls) == 0) {
      reply = strdup(content ? content : "");
      json_decref(answer);
      break;
    }
    json_array_append_new(messages,
                          json_pack("{s:s, s:O, s:O}", "role", "assistant", "content",
                                    content ? json_object_get(msg, "content") : json_null(),
                                    "tool_calls", calls));
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
      rc = run_tool_call(ctx, tools, n_tools, call, messages, &st, &cancel, why, sizeof why);
      if (rc != 0)
        break;
    }
    json_decref(answer);
    if (rc != 0)
      break;
  }
  beat_disarm(b);

  char path[96], err[512];
  const char *outcome;
  int status;
  if ((reply || interrupted) && !atomic_load(&b->lost)) {
    snprintf(path, sizeof path, "/v1/turns/%llu/complete", (unsigned long long)id);
    json_t *body =
        json_pack("{s:s, s:{s:I, s:I}, s:o}", "lease", lease, "cost", "tokens", (json_int_t)tokens,
                  "tool_calls", (json_int_t)st.calls, "tool_stats", stats_json(&st));
    if (reply && reply[0])
      json_object_set_new(body, "reply", json_pack("{s:s}", "body", reply));
    if (interrupted) /* its input is staged again: the next turn carries it with the new */
      json_object_set_new(body, "interrupted", json_true());
    status = finish(ctx, path, body, err, sizeof err);
    json_decref(body);
    outcome = status != 200 ? "complete_refused" : interrupted ? "interrupted" : "completed";
  } else {
    if (!why[0])
      snprintf(why, sizeof why, "lease lost");
    snprintf(path, sizeof path, "/v1/turns/%llu/fail", (unsigned long long)id);
    json_t *body = json_pack("{s:s, s:s}", "lease", lease, "error", why);
    status = finish(ctx, path, body, err, sizeof err);
    json_decref(body);
    outcome = status == 200 ? "failed" : "fail_refused";
  }
  char q_session[300], q_why[700], q_err[700];
  cph_log_kv(
      status == 200 ? CPH_LOG_INFO : CPH_LOG_WARN, "turn",
      "turn=%llu session=%s lane=%s outcome=%s rounds=%d taken=%zu tokens=%llu "
      "tool_calls=%llu tool_invalid=%llu ms=%lld reason=%s status=%d%s%s",
      (unsigned long long)id, cph_log_quote(session, q_session, sizeof q_session),
      lane ? lane : "?", outcome, rounds, taken, (unsigned long long)tokens,
      (unsigned long long)st.calls, (unsigned long long)st.invalid,
      (long long)(cph_mono_ms() - started), cph_log_quote(why, q_why, sizeof q_why), status,
      status == 200 ? "" : " error=", status == 200 ? "" : cph_log_quote(err, q_err, sizeof q_err));
  free(reply);
  stats_free(&st);
  json_decref(messages);
  json_decref(offered);
  free(offered_text);
  cph_buf_free(&head);
  wk_tools_free(tools, n_tools);
}
