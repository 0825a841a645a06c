#define _GNU_SOURCE /* pipe2 */
/* MCP clients over stdio (JSON-RPC 2.0, one message per line): each server is started once
 * with /bin/sh -c COMMAND in its own process group, initialised (initialize, then
 * notifications/initialized), its tools listed (tools/list, following nextCursor), and
 * called with tools/call. Calls from many turn threads share one server: each request has
 * its own id and a reader thread hands every answer to the caller waiting for that id. A
 * server that exits is started again by the next call that needs it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/worker.h"

#define MCP_PROTOCOL_VERSION "2025-06-18"
#define START_TIMEOUT_MS 60000 /* npx may download the server on its first start */
#define MAX_LINE ((size_t)32 << 20)

typedef struct pending {
  int64_t id;
  json_t *answer; /* the whole response object, once it came */
  struct pending *next;
} pending;

typedef struct server {
  char *name, *command;
  size_t index;
  pthread_mutex_t lock;       /* everything below */
  pthread_cond_t cond;        /* an answer came, or the server went away */
  pthread_mutex_t start_lock; /* one (re)start at a time */
  pid_t pid;                  /* 0: not running */
  int to_fd, from_fd;         /* its stdin, its stdout; -1 when closed */
  bool reader_running;        /* the reader thread is to be joined */
  pthread_t reader;
  bool alive;          /* the reader sees the stream open */
  bool ready;          /* initialised and listed */
  uint64_t generation; /* bumped at each start */
  int64_t next_id;
  pending *waiting;
  wk_tool *tools;
  size_t n_tools;
  char error[256]; /* why the last start failed */
} server;

struct wk_mcp {
  server *servers;
  size_t n;
};

void wk_tools_free(wk_tool *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(t[i].name);
    free(t[i].description);
    json_decref(t[i].schema);
  }
  free(t);
}

/* ---------------------------------------------------------------- the reader */

/* Answers a request the server sent us: we offer no client features. Called with s->lock. */
static void refuse_request(server *s, json_t *id) {
  json_t *msg = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id, "error", "code",
                          -32601, "message", "method not supported by cephalon-worker");
  char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
  if (text && s->to_fd >= 0) {
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the NUL: written as one line */
    ssize_t w = write(s->to_fd, text, len + 1);
    (void)w;
  }
  free(text);
  json_decref(msg);
}

static void deliver(server *s, const char *line, size_t len) {
  json_error_t jerr;
  json_t *msg = json_loadb(line, len, 0, &jerr);
  if (!json_is_object(msg)) {
    json_decref(msg); /* servers may print other lines; they are not ours */
    return;
  }
  json_t *id = json_object_get(msg, "id");
  pthread_mutex_lock(&s->lock);
  if (json_object_get(msg, "method")) {
    if (id)
      refuse_request(s, id);
    json_decref(msg); /* a notification (logging, list_changed): nothing to do */
  } else if (json_is_integer(id)) {
    pending *p = s->waiting;
    while (p && p->id != json_integer_value(id))
      p = p->next;
    if (p && !p->answer) {
      p->answer = msg;
      msg = NULL;
      pthread_cond_broadcast(&s->cond);
    }
    json_decref(msg);
  } else {
    json_decref(msg);
  }
  pthread_mutex_unlock(&s->lock);
}

static void *reader_main(void *arg) {
  server *s = arg;
  cph_buf line = CPH_BUF_INIT;
  char chunk[16384];
  int fd = s->from_fd;
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    for (ssize_t i = 0; i < n; i++) {
      if (chunk[i] == '\n') {
        deliver(s, line.data ? line.data : "", line.len);
        cph_buf_reset(&line);
      } else if (line.len < MAX_LINE) {
        cph_buf_putc(&line, chunk[i]);
      }
    }
  }
  cph_buf_free(&line);
  pthread_mutex_lock(&s->lock);
  s->alive = false;
  s->ready = false;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* ---------------------------------------------------------------- process */

/* Ends the server's process (if any) and its reader: stdin closed first, so a well-behaved
 * server exits by itself; then SIGTERM and SIGKILL to its process group. */
static void server_kill(server *s) {
  pthread_mutex_lock(&s->lock);
  int to = s->to_fd;
  s->to_fd = -1;
  pid_t pid = s->pid;
  s->pid = 0;
  bool join = s->reader_running;
  s->reader_running = false;
  pthread_mutex_unlock(&s->lock);
  if (to >= 0)
    close(to);
  if (pid > 0) {
    int status;
    bool gone = false;
    for (int i = 0; i < 40 && !gone; i++) { /* 2 s */
      gone = waitpid(pid, &status, WNOHANG) == pid;
      if (!gone)
        usleep(50000);
    }
    if (!gone) {
      kill(-pid, SIGTERM);
      for (int i = 0; i < 40 && !gone; i++) {
        gone = waitpid(pid, &status, WNOHANG) == pid;
        if (!gone)
          usleep(50000);
      }
    }
    if (!gone) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  if (join)
    pthread_join(s->reader, NULL);
  if (s->from_fd >= 0) {
    close(s->from_fd);
    s->from_fd = -1;
  }
}

static int server_spawn(server *s) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0)
    return -1;
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    return -1;
  }
  if (pid == 0) {
    setpgid(0, 0); /* its own group: stopping it stops what it started (npx -> node) */
    dup2(in[0], 0);
    dup2(out[1], 1);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execl("/bin/sh", "sh", "-c", s->command, (char *)NULL);
    _exit(127);
  }
  setpgid(pid, pid);
  close(in[0]);
  close(out[1]);
  pthread_mutex_lock(&s->lock);
  s->pid = pid;
  s->to_fd = in[1];
  s->from_fd = out[0];
  s->alive = true;
  s->ready = false;
  s->generation++;
  pthread_mutex_unlock(&s->lock);
  if (pthread_create(&s->reader, NULL, reader_main, s) != 0) {
    server_kill(s);
    return -1;
  }
  pthread_mutex_lock(&s->lock);
  s->reader_running = true;
  pthread_mutex_unlock(&s->lock);
  return 0;
}

/* ---------------------------------------------------------------- JSON-RPC */

/* Writes msg as one line. Called with s->lock. */
static int send_line(server *s, json_t *msg) {
  char *text = json_dumps(msg, JSON_COMPACT);
  if (!text)
    return -1;
  size_t len = strlen(text);
  text[len] = '\n';
  size_t off = 0;
  int rc = 0;
  while (off < len + 1) {
    ssize_t w = write(s->to_fd, text + off, len + 1 - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      rc = -1;
      break;
    }
    off += (size_t)w;
  }
  free(text);
  return rc;
}

typedef enum rpc_rc { RPC_OK, RPC_ERROR, RPC_GONE, RPC_TIMEOUT, RPC_STOPPED } rpc_rc;

/* Sends method(params) (params stolen) and waits for its answer: RPC_OK with *result (the
 * "result" member, a new reference), RPC_ERROR with the JSON-RPC error's message in err,
 * or a transport outcome with err filled. */
static rpc_rc rpc(server *s, const char *method, json_t *params, int timeout_ms,
                  const atomic_bool *stop, json_t **result, char *err, size_t err_len) {
  *result = NULL;
  pthread_mutex_lock(&s->lock);
  if (!s->alive || s->to_fd < 0) {
    pthread_mutex_unlock(&s->lock);
    json_decref(params);
    snprintf(err, err_len, "MCP server %s is not running", s->name);
    return RPC_GONE;
  }
  uint64_t gen = s->generation;
  pending me = {.id = ++s->next_id};
  me.next = s->waiting;
  s->waiting = &me;
  json_t *msg = json_pack("{s:s, s:I, s:s, s:o}", "jsonrpc", "2.0", "id", (json_int_t)me.id,
                          "method", method, "params", params ? params : json_object());
  rpc_rc rc = RPC_OK;
  if (!msg || send_line(s, msg) != 0) {
    rc = RPC_GONE;
    snprintf(err, err_len, "MCP server %s: cannot write to it (%s)", s->name,
             msg ? strerror(errno) : "out of memory");
  }
  json_decref(msg);
  int64_t deadline = cph_mono_ms() + timeout_ms;
  while (rc == RPC_OK && !me.answer) {
    if (!s->alive || s->generation != gen) {
      rc = RPC_GONE;
      snprintf(err, err_len, "MCP server %s exited during %s", s->name, method);
      break;
    }
    if (stop && atomic_load(stop)) {
      rc = RPC_STOPPED;
      snprintf(err, err_len, "worker stopping during %s of MCP server %s", method, s->name);
      break;
    }
    int64_t left = deadline - cph_mono_ms();
    if (left <= 0) {
      rc = RPC_TIMEOUT;
      snprintf(err, err_len, "MCP server %s: %s timed out after %d ms", s->name, method,
               timeout_ms);
      break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t step = left < 200 ? left : 200; /* wakes to look at stop */
    ts.tv_nsec += (long)(step % 1000) * 1000000L;
    ts.tv_sec += step / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&s->cond, &s->lock, &ts);
  }
  for (pending **pp = &s->waiting; *pp; pp = &(*pp)->next)
    if (*pp == &me) {
      *pp = me.next;
      break;
    }
  pthread_mutex_unlock(&s->lock);
  if (me.answer) {
    json_t *e = json_object_get(me.answer, "error");
    if (e) {
      const char *m = json_string_value(json_object_get(e, "message"));
      snprintf(err, err_len, "%s (code %lld)", m ? m : "error",
               (long long)json_integer_value(json_object_get(e, "code")));
      rc = RPC_ERROR;
    } else {
      *result = json_incref(json_object_get(me.answer, "result"));
      if (!*result) {
        rc = RPC_ERROR;
        snprintf(err, err_len, "an answer with neither result nor error");
      }
    }
    json_decref(me.answer);
  }
  return rc;
}

static int notify(server *s, const char *method) {
  json_t *msg = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
  pthread_mutex_lock(&s->lock);
  int rc = msg && s->to_fd >= 0 ? send_line(s, msg) : -1;
  pthread_mutex_unlock(&s->lock);
  json_decref(msg);
  return rc;
}

/* tools/list, every page, into a fresh array. */
static int list_tools(server *s, wk_tool **out, size_t *n, char *err, size_t err_len) {
  *out = NULL;
  *n = 0;
  char *cursor = NULL;
  int rc = 0;
  do {
    json_t *params = cursor ? json_pack("{s:s}", "cursor", cursor) : json_object();
    free(cursor);
    cursor = NULL;
    json_t *res;
    if (rpc(s, "tools/list", params, START_TIMEOUT_MS, NULL, &res, err, err_len) != RPC_OK) {
      rc = -1;
      break;
    }
    json_t *tools = json_object_get(res, "tools");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
      const char *name = json_string_value(json_object_get(t, "name"));
      if (!name)
        continue;
      wk_tool *p = realloc(*out, (*n + 1) * sizeof *p);
      if (!p) {
        rc = -1;
        break;
      }
      *out = p;
      const char *desc = json_string_value(json_object_get(t, "description"));
      json_t *schema = json_object_get(t, "inputSchema");
      p[*n] = (wk_tool){.name = strdup(name),
                        .description = strdup(desc ? desc : ""),
                        .schema = json_is_object(schema) ? json_deep_copy(schema)
                                                         : json_pack("{s:s}", "type", "object"),
                        .server = s->index};
      (*n)++;
    }
    const char *next = json_string_value(json_object_get(res, "nextCursor"));
    if (next && next[0])
      cursor = strdup(next);
    json_decref(res);
  } while (rc == 0 && cursor);
  free(cursor);
  return rc;
}

/* Starts the server unless it runs: spawn, initialize, notifications/initialized,
 * tools/list. 0 when it is ready. */
static int server_ensure(server *s, char *err, size_t err_len) {
  pthread_mutex_lock(&s->start_lock);
  pthread_mutex_lock(&s->lock);
  bool ready = s->ready && s->alive;
  pthread_mutex_unlock(&s->lock);
  int rc = 0;
  if (!ready) {
    server_kill(s); /* what is left of the last one */
    if (server_spawn(s) != 0) {
      snprintf(err, err_len, "MCP server %s: cannot start: %s", s->name, strerror(errno));
      rc = -1;
    } else {
      json_t *params =
          json_pack("{s:s, s:{}, s:{s:s, s:s}}", "protocolVersion", MCP_PROTOCOL_VERSION,
                    "capabilities", "clientInfo", "name", "cephalon-worker", "version", "1.0");
      json_t *res = NULL;
      char why[256];
      if (rpc(s, "initialize", params, START_TIMEOUT_MS, NULL, &res, why, sizeof why) != RPC_OK) {
        snprintf(err, err_len, "MCP server %s: initialize: %s", s->name, why);
        rc = -1;
      } else if (notify(s, "notifications/initialized") != 0) {
        snprintf(err, err_len, "MCP server %s: exited after initialize", s->name);
        rc = -1;
      }
      json_decref(res);
      wk_tool *tools = NULL;
      size_t n = 0;
      if (rc == 0 && list_tools(s, &tools, &n, why, sizeof why) != 0) {
        snprintf(err, err_len, "MCP server %s: tools/list: %s", s->name, why);
        wk_tools_free(tools, n);
        rc = -1;
      }
      if (rc == 0) {
        pthread_mutex_lock(&s->lock);
        wk_tools_free(s->tools, s->n_tools);
        s->tools = tools;
        s->n_tools = n;
        s->ready = s->alive;
        pthread_mutex_unlock(&s->lock);
        cph_log_kv(CPH_LOG_INFO, "MCP server ready", "server=%s tools=%zu", s->name, n);
      } else {
        server_kill(s);
      }
    }
    if (rc != 0) {
      snprintf(s->error, sizeof s->error, "%s", err);
      cph_log_kv(CPH_LOG_WARN, "MCP server failed", "server=%s", s->name);
    }
  }
  pthread_mutex_unlock(&s->start_lock);
  return rc;
}

/* ---------------------------------------------------------------- the API */

wk_mcp *wk_mcp_start(const wk_config *cfg, char *err, size_t err_len) {
  err[0] = '\0';
  wk_mcp *m = calloc(1, sizeof *m);
  if (!m || (cfg->n_mcp && !(m->servers = calloc(cfg->n_mcp, sizeof *m->servers)))) {
    free(m);
    return NULL;
  }
  m->n = cfg->n_mcp;
  for (size_t i = 0; i < m->n; i++) {
    server *s = &m->servers[i];
    s->name = cfg->mcp[i].name;
    s->command = cfg->mcp[i].command;
    s->index = i;
    s->to_fd = s->from_fd = -1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->start_lock, NULL);
    pthread_cond_init(&s->cond, NULL);
  }
  for (size_t i = 0; i < m->n; i++) {
    char why[320];
    if (server_ensure(&m->servers[i], why, sizeof why) != 0) {
      size_t used = strlen(err);
      snprintf(err + used, err_len - used, "%s%s", used ? "\n" : "", why);
    }
  }
  return m;
}

void wk_mcp_stop(wk_mcp *m) {
  if (!m)
    return;
  for (size_t i = 0; i < m->n; i++) {
    server *s = &m->servers[i];
    server_kill(s);
    wk_tools_free(s->tools, s->n_tools);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->start_lock);
    pthread_cond_destroy(&s->cond);
  }
  free(m->servers);
  free(m);
}

size_t wk_mcp_count(const wk_mcp *m) { return m ? m->n : 0; }
const char *wk_mcp_name(const wk_mcp *m, size_t i) { return m->servers[i].name; }

int wk_mcp_tools(wk_mcp *m, wk_tool **out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t cap = 0;
  for (size_t i = 0; m && i < m->n; i++) {
    server *s = &m->servers[i];
    pthread_mutex_lock(&s->lock);
    for (size_t j = 0; j < s->n_tools; j++) {
      bool dup = false;
      for (size_t k = 0; k < *n && !dup; k++)
        dup = strcmp((*out)[k].name, s->tools[j].name) == 0;
      if (dup)
        continue; /* the first server's tool of a name wins */
      if (*n == cap) {
        cap = cap ? cap * 2 : 16;
        wk_tool *p = realloc(*out, cap * sizeof *p);
        if (!p) {
          pthread_mutex_unlock(&s->lock);
          return -1;
        }
        *out = p;
      }
      (*out)[(*n)++] = (wk_tool){.name = strdup(s->tools[j].name),
                                 .description = strdup(s->tools[j].description),
                                 .schema = json_deep_copy(s->tools[j].schema),
                                 .server = i};
    }
    pthread_mutex_unlock(&s->lock);
  }
  return 0;
}

/* The text of a tools/call result: its text items joined by newlines; other items (images,
 * resources) as their JSON; structuredContent when there is no content. */
static char *result_text(json_t *res) {
  cph_buf b = CPH_BUF_INIT;
  json_t *content = json_object_get(res, "content");
  size_t i;
  json_t *item;
  json_array_foreach(content, i, item) {
    if (b.len)
      cph_buf_putc(&b, '\n');
    const char *text = json_string_value(json_object_get(item, "text"));
    if (text) {
      cph_buf_puts(&b, text);
    } else {
      char *dump = json_dumps(item, JSON_COMPACT);
      if (dump)
        cph_buf_puts(&b, dump);
      free(dump);
    }
  }
  if (!json_array_size(content) && json_object_get(res, "structuredContent")) {
    char *dump = json_dumps(json_object_get(res, "structuredContent"), JSON_COMPACT);
    if (dump)
      cph_buf_puts(&b, dump);
    free(dump);
  }
  cph_buf_putc(&b, '\0');
  return cph_buf_steal(&b);
}

wk_call_result wk_mcp_call(wk_mcp *m, size_t index, const char *name, json_t *args, int timeout_ms,
                           const atomic_bool *stop, char **text) {
  *text = NULL;
  server *s = &m->servers[index];
  char err[512];
  if (server_ensure(s, err, sizeof err) != 0) {
    *text = strdup(err);
    return WK_CALL_FAILED;
  }
  json_t *params = json_pack("{s:s, s:O}", "name", name, "arguments", args);
  json_t *res = NULL;
  rpc_rc rc = rpc(s, "tools/call", params, timeout_ms, stop, &res, err, sizeof err);
  wk_call_result out;
  if (rc == RPC_OK) {
    *text = result_text(res);
    out = json_is_true(json_object_get(res, "isError")) ? WK_CALL_TOOL_ERR : WK_CALL_OK;
  } else if (rc == RPC_ERROR) {
    size_t len = strlen(err) + 32;
    if ((*text = malloc(len)))
      snprintf(*text, len, "error: %s", err);
    out = WK_CALL_TOOL_ERR;
  } else {
    *text = strdup(err);
    out = WK_CALL_FAILED;
  }
  json_decref(res);
  return out;
}

int wk_mcp_probe(wk_mcp *m, size_t i, char *out, size_t out_len) {
  server *s = &m->servers[i];
  char err[512];
  if (server_ensure(s, err, sizeof err) != 0) {
    snprintf(out, out_len, "%s", err);
    return -1;
  }
  pthread_mutex_lock(&s->lock);
  cph_buf b = CPH_BUF_INIT;
  cph_buf_printf(&b, "%zu tools:", s->n_tools);
  for (size_t j = 0; j < s->n_tools; j++)
    cph_buf_printf(&b, " %s", s->tools[j].name);
  pthread_mutex_unlock(&s->lock);
  cph_buf_putc(&b, '\0');
  snprintf(out, out_len, "%s", b.data ? b.data : "");
  cph_buf_free(&b);
  return 0;
}
