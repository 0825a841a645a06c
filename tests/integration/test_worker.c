/* cephalon-worker end to end (DESIGN §13): the real cephalond, the real worker binary, a real
 * MCP server from npm (@modelcontextprotocol/server-filesystem, pinned in tests/mcp and
 * installed into the build dir by the mcp_install fixture), and a model endpoint double that
 * speaks the OpenAI chat-completions wire format and decides its answers from what it is
 * sent. Everything on 127.0.0.1. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/model_double.h"
#include "tests/support/testutil.h"

#define MODEL_KEY "sk-test-worker-key-0123456789"
#define FILE_TEXT "the launch code is PAPAYA-42"

/* ---------------------------------------------------------------- the model's behaviour */

typedef enum mode {
  MODE_TOOL,       /* read_text_file of the test's file, then a reply quoting the tool result */
  MODE_INVALID,    /* arguments not JSON, then missing "path", then a text answer */
  MODE_FAIL_FIRST, /* 500 once, then a text answer */
  MODE_SLOW,       /* answers after 4 s */
  MODE_HANG,       /* answers after 60 s (or when the client hangs up) */
  MODE_ECHO,       /* answers at once */
  MODE_ARRIVE      /* the first request: read_text_file, answered after 1.5 s (the test posts
                    * a message meanwhile); every later one: a text answer at once */
} mode;

#define MAX_SEEN 8

typedef struct model_state {
  pthread_mutex_t mu;
  mode mode;
  char file[512];
  int requests;
  int failures_left;
  char offered[512];    /* tool names of the first request that offered tools */
  char auth[256];       /* Authorization of the last request */
  bool saw_tool_result; /* a request carried a role:tool message with the file's text */
  bool tool_call_id_ok; /* ... answering our call id */
  int dangling;         /* requests with an assistant tool call lacking its tool result */
  char *seen[MAX_SEEN]; /* MODE_ARRIVE: each request's messages as JSON text */
} model_state;

/* True when some assistant tool call of the request has no `tool` message answering it right
 * after (providers refuse such a conversation for good: DESIGN §4's "no dangling call"). */
static bool has_dangling_call(const cph_md_request *rq) {
  json_t *msgs = json_object_get(rq->json, "messages");
  for (size_t i = 0; i < json_array_size(msgs); i++) {
    size_t k;
    json_t *call;
    json_array_foreach(json_object_get(json_array_get(msgs, i), "tool_calls"), k, call) {
      const char *id = json_string_value(json_object_get(call, "id"));
      bool answered = false;
      for (size_t j = i + 1; j < json_array_size(msgs); j++) {
        json_t *r = json_array_get(msgs, j);
        const char *role = json_string_value(json_object_get(r, "role"));
        if (!role || strcmp(role, "tool") != 0)
          break;
        const char *rid = json_string_value(json_object_get(r, "tool_call_id"));
        answered |= id && rid && strcmp(id, rid) == 0;
      }
      if (!answered)
        return true;
    }
  }
  return false;
}

static const json_t *last_message(const cph_md_request *rq) {
  json_t *msgs = json_object_get(rq->json, "messages");
  return json_array_get(msgs, json_array_size(msgs) - 1);
}

static int tool_messages(const cph_md_request *rq) {
  int n = 0;
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(rq->json, "messages"), i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    n += role && strcmp(role, "tool") == 0;
  }
  return n;
}

static void model(void *arg, const cph_md_request *rq, cph_md_answer *out) {
  model_state *s = arg;
  pthread_mutex_lock(&s->mu);
  s->requests++;
  cph_md_header(rq, "Authorization", s->auth, sizeof s->auth);
  json_t *tools = json_object_get(rq->json, "tools");
  if (json_array_size(tools) && !s->offered[0]) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
      const char *name =
          json_string_value(json_object_get(json_object_get(t, "function"), "name"));
      size_t used = strlen(s->offered);
      snprintf(s->offered + used, sizeof s->offered - used, "%s%s", used ? "," : "",
               name ? name : "?");
    }
  }
  if (strcmp(rq->path, "/v1/chat/completions") != 0 || !rq->json) {
    out->status = 404;
    out->body = cph_md_error_body("no such route");
    pthread_mutex_unlock(&s->mu);
    return;
  }
  const json_t *last = last_message(rq);
  const char *role = json_string_value(json_object_get(last, "role"));
  switch (s->mode) {
  case MODE_TOOL:
    if (role && strcmp(role, "tool") == 0) {
      const char *text = json_string_value(json_object_get(last, "content"));
      s->saw_tool_result = text && strstr(text, FILE_TEXT);
      const char *id = json_string_value(json_object_get(last, "tool_call_id"));
      s->tool_call_id_ok = id && strcmp(id, "call_read_1") == 0;
      char reply[1024];
      snprintf(reply, sizeof reply, "The file says: %s", text ? text : "(nothing)");
      out->body = cph_md_chat_text(reply, 30);
    } else {
      char args[700];
      snprintf(args, sizeof args, "{\"path\":\"%s\"}", s->file);
      out->body = cph_md_chat_tool_call("call_read_1", "read_text_file", args, 20);
    }
    break;
  case MODE_INVALID: {
    int seen = tool_messages(rq);
    if (seen == 0)
      out->body = cph_md_chat_tool_call("call_bad_1", "read_text_file", "{\"path\": oops", 5);
    else if (seen == 1)
      out->body = cph_md_chat_tool_call("call_bad_2", "read_text_file", "{}", 5);
    else
      out->body = cph_md_chat_text("I could not read it", 5);
    break;
  }
  case MODE_FAIL_FIRST:
    if (s->failures_left > 0) {
      s->failures_left--;
      out->status = 500;
      out->body = cph_md_error_body("the model is overloaded");
    } else {
      out->body = cph_md_chat_text("recovered after a failure", 7);
    }
    break;
  case MODE_SLOW:
    out->delay_ms = 4000;
    out->body = cph_md_chat_text("a slow but sure answer", 11);
    break;
  case MODE_HANG:
    out->delay_ms = 60000;
    out->body = cph_md_chat_text("too late", 1);
    break;
  case MODE_ECHO:
    out->body = cph_md_chat_text("echo", 3);
    break;
  case MODE_ARRIVE: {
    s->dangling += has_dangling_call(rq);
    if (s->requests <= MAX_SEEN)
      s->seen[s->requests - 1] =
          json_dumps(json_object_get(rq->json, "messages"), JSON_COMPACT);
    if (s->requests == 1) {
      char args[700];
      snprintf(args, sizeof args, "{\"path\":\"%s\"}", s->file);
      out->body = cph_md_chat_tool_call("call_read_1", "read_text_file", args, 20);
      out->delay_ms = 1500;
    } else {
      out->body = cph_md_chat_text("done", 5);
    }
    break;
  }
  }
  pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- fixture */

typedef struct fixture {
  cph_test_daemon d;
  char *policy;
  char *dir; /* the filesystem server's root */
  model_state st;
  cph_md *md;
  char llm[96];
  pid_t workers[2];
  char *logs[2];
} fixture;

static int start(void **state, const char *policy_text) {
  fixture *f = calloc(1, sizeof *f);
  *state = f;
  pthread_mutex_init(&f->st.mu, NULL);
  f->dir = cph_test_tmpdir("worker-fs");
  snprintf(f->st.file, sizeof f->st.file, "%s/note.txt", f->dir);
  FILE *fp = fopen(f->st.file, "w");
  assert_non_null(fp);
  fputs(FILE_TEXT "\n", fp);
  fclose(fp);
  f->md = cph_md_start(model, &f->st, NULL, NULL);
  snprintf(f->llm, sizeof f->llm, "%s/v1", cph_md_url(f->md));
  f->policy = cph_test_write_tmpfile(".edn", policy_text);
  return cph_test_daemon_start(&f->d, f->policy, NULL, NULL) == 0 ? 0 : -1;
}

static int setup(void **state) { return start(state, "{:store {:sync :none}}\n"); }

static int setup_short_leases(void **state) {
  return start(state, "{:store {:sync :none} :leases {:ttl-seconds 2}}\n");
}

static int stop_worker(fixture *f, int i, int sig);

static int teardown(void **state) {
  fixture *f = *state;
  for (int i = 0; i < 2; i++) {
    if (f->workers[i] > 0)
      stop_worker(f, i, SIGTERM);
    if (f->logs[i]) {
      unlink(f->logs[i]);
      free(f->logs[i]);
    }
  }
  if (f->d.pid > 0)
    cph_test_daemon_stop(&f->d);
  cph_md_stop(f->md);
  cph_test_rmtree(f->dir);
  free(f->dir);
  unlink(f->policy);
  free(f->policy);
  pthread_mutex_destroy(&f->st.mu);
  for (int i = 0; i < MAX_SEEN; i++)
    free(f->st.seen[i]);
  free(f);
  return 0;
}

/* Starts cephalon-worker number i with the filesystem MCP server and extra args. */
static void start_worker(fixture *f, int i, const char *const *extra) {
  const char *bin = getenv("CPH_BIN_DIR"), *mcp_dir = getenv("CPH_MCP_DIR");
  if (!bin || !mcp_dir)
    fail_msg("CPH_BIN_DIR and CPH_MCP_DIR must be set (run through ctest)");
  char exe[512], daemon[64], mcp[1200], name[32];
  snprintf(exe, sizeof exe, "%s/cephalon-worker", bin);
  snprintf(daemon, sizeof daemon, "http://127.0.0.1:%d", f->d.port);
  snprintf(mcp, sizeof mcp,
           "fs=node %s/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js %s",
           mcp_dir, f->dir);
  snprintf(name, sizeof name, "test-worker-%d", i);
  const char *argv[32] = {exe, "--daemon", daemon, "--llm", f->llm, "--model", "test-model",
                          "--api-key-env", "CPH_TEST_MODEL_KEY", "--mcp", mcp,
                          "--lease-wait-ms", "500", "--name", name};
  size_t n = 15;
  for (size_t k = 0; extra && extra[k] && n < 31; k++)
    argv[n++] = extra[k];
  argv[n] = NULL;
  if (!f->logs[i]) {
    char tag[32];
    snprintf(tag, sizeof tag, ".worker%d.log", i);
    f->logs[i] = cph_test_write_tmpfile(tag, "");
  }
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(f->logs[i], O_WRONLY | O_APPEND);
    dup2(fd, 2);
    dup2(fd, 1);
    setenv("CPH_TEST_MODEL_KEY", MODEL_KEY, 1);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  f->workers[i] = pid;
}

static char *worker_log(fixture *f, int i) {
  char *s = cph_test_read_file(f->logs[i], NULL);
  return s ? s : strdup("");
}

/* Sends sig and waits up to 20 s; returns the exit status (128+signal when killed). */
static int stop_worker(fixture *f, int i, int sig) {
  kill(f->workers[i], sig);
  int status = 0;
  for (int waited = 0; waited < 20000; waited += 20) {
    if (waitpid(f->workers[i], &status, WNOHANG) == f->workers[i]) {
      f->workers[i] = 0;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(20000);
  }
  kill(f->workers[i], SIGKILL);
  waitpid(f->workers[i], &status, 0);
  f->workers[i] = 0;
  char *log = worker_log(f, i);
  fail_msg("the worker did not exit within 20 s of signal %d; its log:\n%s", sig, log);
  return -1;
}

static json_t *api(fixture *f, const char *method, const char *path, const char *body,
                   int want) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  if (r.status != want)
    fail_msg("%s %s: %d, want %d: %s", method, path, r.status, want, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  return j;
}

static void session(fixture *f, const char *id, const char *tools_json) {
  char body[512];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"%s%s}", id,
           tools_json ? ",\"tools\":" : "", tools_json ? tools_json : "");
  json_decref(api(f, "POST", "/v1/sessions", body, 200));
}

static void event(fixture *f, const char *session_id, const char *text) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", session_id,
           text);
  json_decref(api(f, "POST", "/v1/events", body, 200));
}

/* Every reply so far. */
static json_t *replies(fixture *f) {
  json_t *j = api(f, "GET", "/v1/replies?after=0", NULL, 200);
  json_t *arr = json_incref(json_object_get(j, "replies"));
  json_decref(j);
  return arr;
}

/* Waits up to timeout_ms for n replies; returns them. */
static json_t *wait_replies(fixture *f, size_t n, int timeout_ms) {
  int64_t end = cph_test_now_ms() + timeout_ms;
  for (;;) {
    json_t *r = replies(f);
    if (json_array_size(r) >= n || cph_test_now_ms() > end)
      return r;
    json_decref(r);
    usleep(50000);
  }
}

/* A sample of the scrape, or -1 when absent. */
static double metric(fixture *f, const char *series) {
  cph_test_response r = cph_test_api(f->d.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  double v = -1;
  size_t n = strlen(series);
  for (const char *p = r.body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ') {
      v = strtod(p + n + 1, NULL);
      break;
    }
  cph_test_response_free(&r);
  return v;
}

static bool wait_metric(fixture *f, const char *series, double want, int timeout_ms) {
  int64_t end = cph_test_now_ms() + timeout_ms;
  while (cph_test_now_ms() < end) {
    if (metric(f, series) == want)
      return true;
    usleep(50000);
  }
  return false;
}

static int model_requests(fixture *f) {
  pthread_mutex_lock(&f->st.mu);
  int n = f->st.requests;
  pthread_mutex_unlock(&f->st.mu);
  return n;
}

#define TURNS(what) "cephalon_turns_" what "_total{lane=\"interactive\"}"

/* ---------------------------------------------------------------- cases */

static void test_a_question_that_needs_a_tool_is_answered_from_the_tools_real_output(
    void **state) {
  fixture *f = *state;
  f->st.mode = MODE_TOOL;
  /* The session names two tools: only those are offered, out of the server's fourteen. */
  session(f, "reader", "[\"read_text_file\",\"list_directory\"]");
  start_worker(f, 0, NULL);
  event(f, "reader", "what does note.txt say?");
  json_t *r = wait_replies(f, 1, 60000);
  if (json_array_size(r) != 1) {
    char *log = worker_log(f, 0);
    fail_msg("no reply; the worker's log:\n%s", log);
  }
  json_t *reply = json_array_get(r, 0);
  assert_string_equal(json_string_value(json_object_get(reply, "session")), "reader");
  const char *body = json_string_value(json_object_get(reply, "body"));
  if (!strstr(body, "The file says: ") || !strstr(body, FILE_TEXT))
    fail_msg("the reply is not built from the file: %s", body);
  json_decref(r);

  pthread_mutex_lock(&f->st.mu);
  assert_true(f->st.saw_tool_result);
  assert_true(f->st.tool_call_id_ok);
  assert_int_equal(f->st.requests, 2); /* the tool round, then the answer */
  assert_string_equal(f->st.offered, "read_text_file,list_directory");
  assert_string_equal(f->st.auth, "Bearer " MODEL_KEY);
  pthread_mutex_unlock(&f->st.mu);

  /* cost and stats reached the daemon: tokens 20 + 30, one valid call of read_text_file */
  assert_true(wait_metric(f, TURNS("completed"), 1, 5000));
  assert_int_equal(metric(f, "cephalon_turn_tokens_total{lane=\"interactive\"}"), 50);
  assert_int_equal(
      metric(f, "cephalon_tool_calls_total{tool=\"read_text_file\",result=\"valid\"}"), 1);
  assert_int_equal(metric(f, "cephalon_tool_calls_total{result=\"valid\"}"), 1);

  assert_int_equal(stop_worker(f, 0, SIGTERM), 0);
  char *log = worker_log(f, 0);
  if (strstr(log, MODEL_KEY))
    fail_msg("the worker logged the model's key:\n%s", log);
  if (!strstr(log, "outcome=completed") || !strstr(log, "session=reader") ||
      !strstr(log, "rounds=2") || !strstr(log, "tokens=50") || !strstr(log, " ms="))
    fail_msg("no turn line with session, rounds, tokens and ms:\n%s", log);
  free(log);
}

/* Creates a session with while_running `mode` that may read files. */
static void session_while(fixture *f, const char *id, const char *wr) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"id\":\"%s\",\"class\":\"interactive\",\"tools\":[\"read_text_file\"],"
           "\"while_running\":\"%s\"}",
           id, wr);
  json_decref(api(f, "POST", "/v1/sessions", body, 200));
}

/* Posts `text` to the session once the model holds its first (tool-calling) answer back. */
static void post_during_first_call(fixture *f, const char *id, const char *text) {
  for (int waited = 0; model_requests(f) < 1 && waited < 30000; waited += 10)
    usleep(10000);
  if (model_requests(f) < 1) {
    char *log = worker_log(f, 0);
    fail_msg("the worker never called the model; its log:\n%s", log);
  }
  event(f, id, text);
}

static char *seen(fixture *f, int i) {
  pthread_mutex_lock(&f->st.mu);
  char *s = f->st.seen[i] ? strdup(f->st.seen[i]) : NULL;
  pthread_mutex_unlock(&f->st.mu);
  return s;
}

/* :interrupt — the worker stops at the next safe point (after the tool's result, before the
 * next model call), completes with interrupted and an account of its tool calls; the next turn
 * carries the old and the new message, and its messages hold no tool call without its
 * result: the interrupted turn's call is in the history with its result. */
static void test_an_interrupted_turn_then_a_normal_one_leave_no_dangling_tool_call(
    void **state) {
  fixture *f = *state;
  f->st.mode = MODE_ARRIVE;
  session_while(f, "ops", "interrupt");
  start_worker(f, 0, NULL);
  event(f, "ops", "read note.txt and restart host alpha");
  post_during_first_call(f, "ops", "no, the staging cluster");
  json_t *r = wait_replies(f, 2, 60000);
  if (json_array_size(r) != 2) {
    char *log = worker_log(f, 0);
    fail_msg("want 2 replies (the interrupted account, the answer); the worker's log:\n%s", log);
  }
  const char *account = json_string_value(json_object_get(json_array_get(r, 0), "body"));
  if (!strstr(account, "interrupted") || !strstr(account, "read_text_file") ||
      !strstr(account, FILE_TEXT))
    fail_msg("the interrupted turn's reply does not account for its tool call: %s", account);
  assert_string_equal(json_string_value(json_object_get(json_array_get(r, 1), "body")), "done");
  json_decref(r);
  pthread_mutex_lock(&f->st.mu);
  int requests = f->st.requests, dangling = f->st.dangling;
  pthread_mutex_unlock(&f->st.mu);
  assert_int_equal(requests, 2); /* the tool round of turn 1 (interrupted after it), turn 2 */
  assert_int_equal(dangling, 0);
  char *second = seen(f, 1);
  /* turn 2: the old and the new input, and the interrupted turn's call with its result */
  if (!second || !strstr(second, "restart host alpha") ||
      !strstr(second, "no, the staging cluster") || !strstr(second, FILE_TEXT))
    fail_msg("turn 2's messages lack the old input, the new one or the tool's result: %s",
             second ? second : "(none)");
  free(second);
  char *log = worker_log(f, 0);
  if (!strstr(log, "outcome=interrupted") || !strstr(log, "outcome=completed"))
    fail_msg("want an interrupted turn, then a completed one:\n%s", log);
  free(log);
}

/* :merge — the message posted during the turn is taken before the next model call, after the
 * tool's result, and answered by the same turn: one reply, no second turn. */
static void test_merge_takes_a_message_into_the_running_turn_before_the_next_model_call(
    void **state) {
  fixture *f = *state;
  f->st.mode = MODE_ARRIVE;
  session_while(f, "ops", "merge");
  start_worker(f, 0, NULL);
  event(f, "ops", "read note.txt");
  post_during_first_call(f, "ops", "and tell me its length too");
  json_t *r = wait_replies(f, 1, 60000);
  if (json_array_size(r) != 1) {
    char *log = worker_log(f, 0);
    fail_msg("no reply; the worker's log:\n%s", log);
  }
  json_t *src = json_object_get(json_array_get(r, 0), "source_inbox_ids");
  assert_int_equal(json_array_size(src), 2); /* the leased message and the taken one */
  json_decref(r);
  usleep(1200 * 1000); /* no second turn comes: the taken message was consumed */
  pthread_mutex_lock(&f->st.mu);
  int requests = f->st.requests, dangling = f->st.dangling;
  pthread_mutex_unlock(&f->st.mu);
  assert_int_equal(requests, 2);
  assert_int_equal(dangling, 0);
  char *second = seen(f, 1);
  /* the taken message comes after the tool's result: [..., assistant call, tool, user] */
  const char *tool = second ? strstr(second, "\"role\":\"tool\"") : NULL;
  const char *merged = second ? strstr(second, "and tell me its length too") : NULL;
  if (!tool || !merged || merged < tool)
    fail_msg("the taken message is not after the tool's result: %s", second ? second : "-");
  free(second);
  char *log = worker_log(f, 0);
  if (!strstr(log, "taken=1"))
    fail_msg("the worker's turn line does not say it took one entry:\n%s", log);
  free(log);
}

static void test_invalid_tool_arguments_are_counted_per_tool(void **state) {
  fixture *f = *state;
  f->st.mode = MODE_INVALID;
  session(f, "sloppy", NULL);
  start_worker(f, 0, NULL);
  event(f, "sloppy", "read something");
  json_t *r = wait_replies(f, 1, 60000);
  assert_int_equal(json_array_size(r), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(r, 0), "body")),
                      "I could not read it");
  json_decref(r);
  assert_true(wait_metric(f, TURNS("completed"), 1, 5000));
  /* "{"path": oops" is not JSON; "{}" lacks the required path: two invalid, none run */
  assert_int_equal(
      metric(f, "cephalon_tool_calls_total{tool=\"read_text_file\",result=\"invalid\"}"), 2);
  assert_int_equal(
      metric(f, "cephalon_tool_calls_total{tool=\"read_text_file\",result=\"valid\"}"), 0);
  assert_int_equal(metric(f, "cephalon_tool_calls_total{result=\"invalid\"}"), 2);
  assert_int_equal(model_requests(f), 3);
}

static void test_a_model_error_fails_the_turn_and_it_is_retried(void **state) {
  fixture *f = *state;
  f->st.mode = MODE_FAIL_FIRST;
  f->st.failures_left = 1;
  session(f, "retry", NULL);
  start_worker(f, 0, NULL);
  event(f, "retry", "hello");
  json_t *r = wait_replies(f, 1, 60000);
  assert_int_equal(json_array_size(r), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(r, 0), "body")),
                      "recovered after a failure");
  json_decref(r);
  /* failed once (the 500), leased again, completed: two attempts, nothing expired */
  assert_true(wait_metric(f, TURNS("completed"), 1, 5000));
  assert_int_equal(metric(f, TURNS("failed")), 1);
  assert_int_equal(metric(f, TURNS("started")), 2);
  assert_int_equal(metric(f, TURNS("expired")), 0);
  char *log = worker_log(f, 0);
  if (!strstr(log, "outcome=failed") || !strstr(log, "HTTP 500"))
    fail_msg("the failure and its reason are not logged:\n%s", log);
  free(log);
}

/* Two turns in a row on the worker's one turn thread: its heartbeat thread, kept between
 * turns, is armed again for the second (worker/turn.c). */
static void test_a_model_slower_than_the_lease_is_kept_alive_by_heartbeats(void **state) {
  fixture *f = *state; /* :leases :ttl-seconds 2; the model takes 4 s */
  f->st.mode = MODE_SLOW;
  session(f, "patient", NULL);
  static const char *const one_thread[] = {"--concurrency", "1", NULL};
  start_worker(f, 0, one_thread);
  event(f, "patient", "take your time");
  assert_true(wait_metric(f, TURNS("started"), 1, 10000));
  event(f, "patient", "and then this"); /* staged for the next turn, on the same thread */
  json_t *r = wait_replies(f, 2, 40000);
  assert_int_equal(json_array_size(r), 2);
  for (size_t i = 0; i < 2; i++)
    assert_string_equal(json_string_value(json_object_get(json_array_get(r, i), "body")),
                        "a slow but sure answer");
  json_decref(r);
  assert_true(wait_metric(f, TURNS("completed"), 2, 5000));
  assert_int_equal(metric(f, TURNS("expired")), 0);
  assert_int_equal(metric(f, TURNS("started")), 2);
  assert_int_equal(model_requests(f), 2);
}

static void test_sigterm_mid_turn_fails_it_at_once_and_leaves_no_lease_to_expire(
    void **state) {
  fixture *f = *state; /* :leases :ttl-seconds 2, so an expiry would show within the test */
  f->st.mode = MODE_HANG;
  session(f, "interrupted", NULL);
  start_worker(f, 0, NULL);
  event(f, "interrupted", "this will take forever");
  int64_t end = cph_test_now_ms() + 30000;
  while (model_requests(f) < 1 && cph_test_now_ms() < end)
    usleep(20000);
  assert_int_equal(model_requests(f), 1);
  int64_t t0 = cph_test_now_ms();
  assert_int_equal(stop_worker(f, 0, SIGTERM), 0);
  int64_t took = cph_test_now_ms() - t0;
  if (took > 5000)
    fail_msg("the worker took %lld ms to stop", (long long)took);
  /* failed by the worker, not expired: the daemon knows at once */
  assert_int_equal(metric(f, TURNS("failed")), 1);
  sleep(3); /* longer than the lease: an open lease would have expired by now */
  assert_int_equal(metric(f, TURNS("expired")), 0);
  char *log = worker_log(f, 0);
  if (!strstr(log, "outcome=failed") || !strstr(log, "worker stopping"))
    fail_msg("no failed turn with its reason in the log:\n%s", log);
  free(log);

  /* The input was not lost: the next worker runs the turn again. */
  f->st.mode = MODE_ECHO;
  start_worker(f, 1, NULL);
  json_t *r = wait_replies(f, 1, 30000);
  assert_int_equal(json_array_size(r), 1);
  json_decref(r);
}

static void test_two_workers_never_complete_the_same_turn_twice(void **state) {
  fixture *f = *state;
  f->st.mode = MODE_ECHO;
  enum { SESSIONS = 24 };
  for (int i = 0; i < SESSIONS; i++) {
    char id[32];
    snprintf(id, sizeof id, "s%02d", i);
    session(f, id, NULL);
  }
  const char *const conc[] = {"--concurrency", "4", NULL};
  start_worker(f, 0, conc);
  start_worker(f, 1, conc);
  for (int i = 0; i < SESSIONS; i++) {
    char id[32];
    snprintf(id, sizeof id, "s%02d", i);
    event(f, id, "ping");
  }
  json_t *r = wait_replies(f, SESSIONS, 60000);
  assert_true(wait_metric(f, TURNS("completed"), SESSIONS, 10000));
  usleep(500000); /* a duplicate completion would show up now */
  json_decref(r);
  r = replies(f);
  assert_int_equal(json_array_size(r), SESSIONS);
  bool seen[SESSIONS] = {false};
  size_t i;
  json_t *reply;
  json_array_foreach(r, i, reply) {
    int k = atoi(json_string_value(json_object_get(reply, "session")) + 1);
    assert_true(k >= 0 && k < SESSIONS);
    assert_false(seen[k]);
    seen[k] = true;
  }
  json_decref(r);
  assert_int_equal(metric(f, TURNS("completed")), SESSIONS);
  assert_int_equal(metric(f, TURNS("started")), SESSIONS);
  assert_int_equal(model_requests(f), SESSIONS);
  /* each turn id completed in exactly one worker's log, once */
  char *logs[2] = {worker_log(f, 0), worker_log(f, 1)};
  int total = 0, per_worker[2] = {0, 0};
  for (int w = 0; w < 2; w++)
    for (const char *p = logs[w]; (p = strstr(p, "outcome=completed")); p++)
      per_worker[w]++, total++;
  assert_int_equal(total, SESSIONS);
  for (unsigned long id = 1; id < 10 * SESSIONS; id++) {
    char needle[48];
    snprintf(needle, sizeof needle, "turn=%lu ", id);
    int hits = 0;
    for (int w = 0; w < 2; w++)
      for (const char *p = logs[w]; (p = strstr(p, needle)); p++)
        hits++;
    assert_true(hits <= 1);
  }
  free(logs[0]);
  free(logs[1]);
  assert_int_equal(stop_worker(f, 0, SIGTERM), 0);
  assert_int_equal(stop_worker(f, 1, SIGTERM), 0);
}

static void test_check_reports_what_works_and_exits_1_when_something_fails(void **state) {
  fixture *f = *state;
  const char *bin = getenv("CPH_BIN_DIR"), *mcp_dir = getenv("CPH_MCP_DIR");
  char exe[512], daemon[64], fs[1200];
  snprintf(exe, sizeof exe, "%s/cephalon-worker", bin);
  snprintf(daemon, sizeof daemon, "http://127.0.0.1:%d", f->d.port);
  snprintf(fs, sizeof fs,
           "fs=node %s/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js %s",
           mcp_dir, f->dir);
  /* Everything reachable: /models is a 404 here, so a one-token completion is tried. */
  f->st.mode = MODE_ECHO;
  const char *ok_argv[] = {exe, "--check", "--daemon", daemon, "--llm", f->llm, "--model", "m",
                           "--mcp", fs, NULL};
  char *out = NULL, *err = NULL;
  int rc = cph_test_run(ok_argv, &out, &err);
  if (rc != 0 || !strstr(out, "ok      daemon") || !strstr(out, "ok      model") ||
      !strstr(out, "ok      mcp fs:") || !strstr(out, "read_text_file"))
    fail_msg("--check: exit %d\n%s\n%s", rc, out, err);
  free(out);
  free(err);
  /* A server that is not there: exit 1 and it says which. */
  const char *bad_argv[] = {exe,   "--check", "--daemon", daemon, "--llm", f->llm, "--model",
                            "m",   "--mcp",   "ghost=/nonexistent/mcp-server", NULL};
  rc = cph_test_run(bad_argv, &out, &err);
  if (rc != 1 || !strstr(out, "FAILED  mcp ghost") || !strstr(out, "ok      daemon"))
    fail_msg("--check with a missing server: exit %d\n%s\n%s", rc, out, err);
  free(out);
  free(err);
}

static void test_config_file_errors_say_file_line_and_column(void **state) {
  (void)state;
  const char *bin = getenv("CPH_BIN_DIR");
  char exe[512];
  snprintf(exe, sizeof exe, "%s/cephalon-worker", bin);
  char *path = cph_test_write_tmpfile(".edn", "{:daemon \"http://127.0.0.1:1\"\n"
                                              " :llm \"http://127.0.0.1:2/v1\"\n"
                                              " :model \"m\"\n"
                                              " :concurrency \"eight\"}\n");
  const char *argv[] = {exe, "--config", path, NULL};
  char *out = NULL, *err = NULL;
  int rc = cph_test_run(argv, &out, &err);
  char want[600];
  snprintf(want, sizeof want, "%s:4:15: :concurrency: expected an integer from 1 to 256",
           path);
  if (rc != 2 || !strstr(err, want))
    fail_msg("exit %d, stderr:\n%s\nwant: %s", rc, err, want);
  free(out);
  free(err);
  unlink(path);
  free(path);

  path = cph_test_write_tmpfile(".edn", "{:daemon \"http://127.0.0.1:1\" :modle \"m\"}");
  const char *argv2[] = {exe, "--config", path, NULL};
  rc = cph_test_run(argv2, &out, &err);
  snprintf(want, sizeof want, "%s:1:31: unknown key :modle", path);
  if (rc != 2 || !strstr(err, want))
    fail_msg("exit %d, stderr:\n%s\nwant: %s", rc, err, want);
  free(out);
  free(err);
  unlink(path);
  free(path);
}

static void test_config_file_runs_the_worker_like_the_flags(void **state) {
  fixture *f = *state;
  f->st.mode = MODE_ECHO;
  session(f, "cfg", NULL);
  char text[2048];
  const char *mcp_dir = getenv("CPH_MCP_DIR");
  snprintf(text, sizeof text,
           "{:daemon \"http://127.0.0.1:%d\" :llm \"%s\" :model \"from-file\"\n"
           " :mcp {\"fs\" \"node %s/node_modules/@modelcontextprotocol/server-filesystem/dist/"
           "index.js %s\"}\n"
           " :concurrency 2 :lanes [:interactive] :max-tool-rounds 3 :lease-wait-ms 500}\n",
           f->d.port, f->llm, mcp_dir, f->dir);
  char *path = cph_test_write_tmpfile(".edn", text);
  f->logs[0] = cph_test_write_tmpfile(".worker0.log", "");
  const char *bin = getenv("CPH_BIN_DIR");
  char exe[512];
  snprintf(exe, sizeof exe, "%s/cephalon-worker", bin);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(f->logs[0], O_WRONLY | O_APPEND);
    dup2(fd, 2);
    execl(exe, exe, "--config", path, (char *)NULL);
    _exit(127);
  }
  f->workers[0] = pid;
  event(f, "cfg", "hi");
  json_t *r = wait_replies(f, 1, 30000);
  assert_int_equal(json_array_size(r), 1);
  json_decref(r);
  assert_int_equal(stop_worker(f, 0, SIGTERM), 0);
  char *log = worker_log(f, 0);
  if (!strstr(log, "concurrency=2") || !strstr(log, "max_tool_rounds=3"))
    fail_msg("the file's options are not in force:\n%s", log);
  free(log);
  unlink(path);
  free(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_a_question_that_needs_a_tool_is_answered_from_the_tools_real_output, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_invalid_tool_arguments_are_counted_per_tool, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_an_interrupted_turn_then_a_normal_one_leave_no_dangling_tool_call, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_merge_takes_a_message_into_the_running_turn_before_the_next_model_call, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_a_model_error_fails_the_turn_and_it_is_retried,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_a_model_slower_than_the_lease_is_kept_alive_by_heartbeats, setup_short_leases,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_sigterm_mid_turn_fails_it_at_once_and_leaves_no_lease_to_expire,
          setup_short_leases, teardown),
      cmocka_unit_test_setup_teardown(test_two_workers_never_complete_the_same_turn_twice,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_check_reports_what_works_and_exits_1_when_something_fails, setup, teardown),
      cmocka_unit_test(test_config_file_errors_say_file_line_and_column),
      cmocka_unit_test_setup_teardown(test_config_file_runs_the_worker_like_the_flags, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
