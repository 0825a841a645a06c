#define _GNU_SOURCE
/* cephalonctl as a user runs it: a real process against the real cephalond (DESIGN §9), plus
 * a scripted one-shot HTTP server that pins down the client's side of the wire exactly
 * (request line, headers, JSON bodies, chunked answers, error lines), and the usage and
 * unreachable-daemon paths that need no server at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* ---------------------------------------------------------------- running cephalonctl */

typedef struct ctl_result {
  int status; /* exit code, -1 if it did not exit normally */
  char *out;
  char *err;
} ctl_result;

/* Runs $CPH_BIN_DIR/cephalonctl [--url url] args... (args NULL-terminated). */
static void ctl(ctl_result *r, const char *url, const char *const *args) {
  const char *dir = getenv("CPH_BIN_DIR");
  if (!dir)
    fail_msg("CPH_BIN_DIR is not set");
  char *bin;
  assert_true(asprintf(&bin, "%s/cephalonctl", dir) > 0);
  const char *argv[40];
  size_t n = 0;
  argv[n++] = bin;
  if (url) {
    argv[n++] = "--url";
    argv[n++] = url;
  }
  for (size_t i = 0; args[i]; i++) {
    assert_true(n < 39);
    argv[n++] = args[i];
  }
  argv[n] = NULL;
  r->status = cph_test_run(argv, &r->out, &r->err);
  free(bin);
}

static void ctl_free(ctl_result *r) {
  free(r->out);
  free(r->err);
}

/* Fails with the whole output when the exit code is not the expected one. */
static void expect_exit(const ctl_result *r, int want, const char *what) {
  if (r->status != want)
    fail_msg("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r->status, want, r->out,
             r->err);
}

static void expect_contains(const char *text, const char *needle, const char *what) {
  if (!strstr(text, needle))
    fail_msg("%s: '%s' not found in:\n%s", what, needle, text);
}

static bool starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Exactly one line. */
static bool one_line(const char *s) {
  const char *nl = strchr(s, '\n');
  return nl && nl[1] == '\0';
}

/* A loopback port that refuses connections: bound but never listening, held by the caller
 * so nothing else can take it meanwhile. */
static int refusing_port(int *fd_out) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof sin), 0);
  socklen_t len = sizeof sin;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
  *fd_out = fd;
  return ntohs(sin.sin_port);
}

/* ---------------------------------------------------------------- a scripted HTTP server */

/* Serves one canned answer per connection, in order, from a child process, and records each
 * request (head and body) in a file, separated by REQ_SEP. */
#define REQ_SEP "\n=====\n"

typedef struct fake_server {
  pid_t pid;
  int port;
  char url[64];
  char *capture_path;
} fake_server;

static void child_serve(int lfd, const char *const *answers, const char *capture_path) {
  alarm(20); /* never outlive a broken test */
  FILE *cap = fopen(capture_path, "w");
  if (!cap)
    _exit(2);
  for (size_t i = 0; answers[i]; i++) {
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
      _exit(3);
    size_t cap_len = 1 << 16, len = 0;
    char *buf = malloc(cap_len);
    size_t want = SIZE_MAX; /* total request bytes, known once the head is in */
    while (len < want) {
      ssize_t n = recv(c, buf + len, cap_len - len - 1, 0);
      if (n <= 0)
        break;
      len += (size_t)n;
      buf[len] = '\0';
      char *end = strstr(buf, "\r\n\r\n");
      if (end && want == SIZE_MAX) {
        size_t body = 0;
        for (char *h = buf; h < end; h = strstr(h, "\r\n") + 2)
          if (strncasecmp(h, "Content-Length:", 15) == 0)
            body = strtoul(h + 15, NULL, 10);
        want = (size_t)(end + 4 - buf) + body;
      }
    }
    fwrite(buf, 1, len, cap);
    fputs(REQ_SEP, cap);
    fflush(cap);
    free(buf);
    const char *a = answers[i];
    size_t alen = strlen(a);
    while (alen > 0) {
      ssize_t n = send(c, a, alen, MSG_NOSIGNAL);
      if (n <= 0)
        break;
      a += n;
      alen -= (size_t)n;
    }
    close(c);
  }
  fclose(cap);
  _exit(0);
}

static void fake_start(fake_server *f, const char *const *answers) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(lfd >= 0);
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof sin), 0);
  assert_int_equal(listen(lfd, 8), 0);
  socklen_t len = sizeof sin;
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &len), 0);
  f->port = ntohs(sin.sin_port);
  snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", f->port);
  f->capture_path = cph_test_write_tmpfile(".req", "");
  fflush(NULL);
  f->pid = fork();
  assert_true(f->pid >= 0);
  if (f->pid == 0)
    child_serve(lfd, answers, f->capture_path);
  close(lfd);
}

/* Waits for the server to finish and returns what it was sent (free() it). */
static char *fake_finish(fake_server *f) {
  int status;
  assert_int_equal(waitpid(f->pid, &status, 0), f->pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    kill(f->pid, SIGKILL);
    fail_msg("the scripted server did not get every request (status %d)", status);
  }
  char *text = cph_test_read_file(f->capture_path, NULL);
  assert_non_null(text);
  unlink(f->capture_path);
  free(f->capture_path);
  return text;
}

/* An answer with a Content-Length. free() it. */
static char *answer(const char *status_line, const char *body) {
  char *a;
  assert_true(asprintf(&a,
                       "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: "
                       "%zu\r\nConnection: close\r\n\r\n%s",
                       status_line, strlen(body), body) > 0);
  return a;
}

/* A 200 answer in chunked transfer coding, one chunk per piece (the second with a chunk
 * extension), ending with a trailer field. free() it. */
static char *chunked_answer(const char *const *pieces) {
  char *a = strdup("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                   "Transfer-Encoding: chunked\r\n\r\n");
  assert_non_null(a);
  for (size_t i = 0; pieces[i]; i++) {
    char *next;
    assert_true(asprintf(&next, "%s%zx%s\r\n%s\r\n", a, strlen(pieces[i]),
                         i == 1 ? ";ext=1" : "", pieces[i]) > 0);
    free(a);
    a = next;
  }
  char *done;
  assert_true(asprintf(&done, "%s0\r\nX-Trailer: 1\r\n\r\n", a) > 0);
  free(a);
  return done;
}

/* The JSON body of the n-th (0-based) recorded request. */
static json_t *request_json(const char *capture, int n) {
  const char *req = capture;
  for (int i = 0; i < n; i++) {
    req = strstr(req, REQ_SEP);
    assert_non_null(req);
    req += strlen(REQ_SEP);
  }
  const char *body = strstr(req, "\r\n\r\n");
  assert_non_null(body);
  const char *end = strstr(body, REQ_SEP);
  json_error_t e;
  json_t *j = json_loadb(body + 4, (size_t)(end - body - 4), 0, &e);
  if (!j)
    fail_msg("request %d body is not JSON (%s): %s", n, e.text, body + 4);
  return j;
}

/* ---------------------------------------------------------------- no server needed */

static void test_unreachable_daemon_says_cannot_reach_and_exits_1(void **state) {
  (void)state;
  int fd;
  int port = refusing_port(&fd);
  char url[64], want[160];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  snprintf(want, sizeof want, "cephalonctl: cannot reach cephalond at %s: Connection refused\n",
           url);
  ctl_result r;
  /* --follow does not start retrying a daemon that was never there: it says so, exit 1. */
  ctl(&r, url, (const char *const[]){"replies", "--follow", NULL});
  expect_exit(&r, 1, "replies --follow");
  assert_string_equal(r.out, "");
  assert_string_equal(r.err, want);
  ctl_free(&r);
  ctl(&r, url, (const char *const[]){"--token", "do-not-print-me", "status", NULL});
  expect_exit(&r, 1, "status");
  assert_string_equal(r.out, "");
  assert_string_equal(r.err, want);
  assert_null(strstr(r.err, "do-not-print-me"));
  ctl_free(&r);

  /* $CEPHALON_URL is the default --url. */
  setenv("CEPHALON_URL", url, 1);
  ctl(&r, NULL, (const char *const[]){"sessions", "show", "s1", NULL});
  unsetenv("CEPHALON_URL");
  expect_exit(&r, 1, "sessions show with CEPHALON_URL");
  assert_string_equal(r.err, want);
  ctl_free(&r);
  close(fd);
}

static void test_bad_usage_exits_2_with_usage_on_stderr(void **state) {
  (void)state;
  int fd;
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", refusing_port(&fd));
  /* None of these may reach the network: the URL refuses, which would be exit 1. */
  const char *const *const cases[] = {
      (const char *const[]){"status", "extra", NULL},
      (const char *const[]){"lanes", "--frob", NULL},
      (const char *const[]){"sessions", NULL},
      (const char *const[]){"sessions", "frob", NULL},
      (const char *const[]){"sessions", "show", NULL},
      (const char *const[]){"sessions", "show", "a", "b", NULL},
      (const char *const[]){"sessions", "why", NULL},
      (const char *const[]){"sessions", "list", "--limit", "many", NULL},
      (const char *const[]){"sessions", "list", "--limit", "-1", NULL},
      (const char *const[]){"sessions", "list", "--class", NULL},
      (const char *const[]){"events", NULL},
      (const char *const[]){"events", "post", "--channel", "general", NULL},
      (const char *const[]){"events", "post", "hello", NULL},
      (const char *const[]){"events", "post", "--channel", "a", "--channel", "b", "x", NULL},
      (const char *const[]){"turns", NULL},
      (const char *const[]){"turns", "lease", NULL},
      (const char *const[]){"turns", "lease", "--worker", "w", "--wait-ms", "soon", NULL},
      (const char *const[]){"turns", "lease", "--worker", "w", "--lanes", "a,,b", NULL},
      (const char *const[]){"turns", "complete", "t1", NULL},
      (const char *const[]){"turns", "complete", "--lease", "L", NULL},
      (const char *const[]){"turns", "complete", "t1", "--lease", "L", "--reply-channel", "c",
                            NULL},
      (const char *const[]){"turns", "complete", "t1", "--lease", "L", "--tokens", "1.5", NULL},
      (const char *const[]){"policy", "reload", "now", NULL},
      (const char *const[]){"replies", "--after", "-1", NULL},
      (const char *const[]){"replies", "--limit", "1001", NULL},
      (const char *const[]){"replies", "--follow=yes", NULL},
      (const char *const[]){"replies", "--follow", "--wait-ms", "soon", NULL},
      (const char *const[]){"replies", "extra", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ctl_result r;
    ctl(&r, url, cases[i]);
    if (r.status != 2)
      fail_msg("case %zu (%s %s): exit %d, want 2; stderr: %s", i, cases[i][0],
               cases[i][1] ? cases[i][1] : "", r.status, r.err);
    assert_string_equal(r.out, "");
    if (!strstr(r.err, "usage: cephalonctl"))
      fail_msg("case %zu: no usage on stderr: %s", i, r.err);
    ctl_free(&r);
  }
  /* A URL we cannot use is bad usage too, and says why. */
  ctl_result r;
  ctl(&r, "ftp://127.0.0.1:7070", (const char *const[]){"status", NULL});
  expect_exit(&r, 2, "ftp URL");
  expect_contains(r.err, "expected http[s]://", "ftp URL");
  ctl_free(&r);
  close(fd);
}

static void test_help_lists_every_command(void **state) {
  (void)state;
  ctl_result r;
  ctl(&r, NULL, (const char *const[]){"help", NULL});
  expect_exit(&r, 0, "help");
  const char *forms[] = {"status",           "sessions list",  "sessions show ID",
                         "sessions why ID",  "lanes",          "events post --channel C",
                         "turns lease --worker W", "turns complete ID --lease L",
                         "policy check FILE", "policy reload",
                         "replies [--after N] [--limit N] [--wait-ms N] [--follow]"};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
    expect_contains(r.out, forms[i], "help");
  ctl_free(&r);
  ctl(&r, NULL, (const char *const[]){"turns", "--help", NULL});
  expect_exit(&r, 0, "turns --help");
  expect_contains(r.out, "usage: cephalonctl turns lease", "turns --help");
  ctl_free(&r);
}

/* ---------------------------------------------------------------- the client's wire format */

static void test_client_sends_token_and_reads_a_chunked_answer(void **state) {
  (void)state;
  /* The JSON split mid-token over chunks, one with an extension, and a trailer. */
  char *chunked = chunked_answer((const char *const[]){
      "{\"id\":\"s1\",\"class\":\"inte", "racti",
      "ve\",\"state\":\"queued\",\"credits\":28.25,\"episode\":3,\"subscribe\":[\"general\","
      "\"ops\"],\"member\":[],\"system\":\"line one\\nline two\"",
      "}", NULL});
  fake_server f;
  fake_start(&f, (const char *const[]){chunked, NULL});
  ctl_result r;
  ctl(&r, f.url, (const char *const[]){"--token", "sekret", "sessions", "show", "s1", NULL});
  char *req = fake_finish(&f);
  expect_exit(&r, 0, "sessions show");
  assert_string_equal(r.err, "");
  assert_string_equal(r.out, "id:        s1\n"
                             "class:     interactive\n"
                             "state:     queued\n"
                             "credits:   28.25\n"
                             "episode:   3\n"
                             "subscribe: general, ops\n"
                             "member:    -\n"
                             "system:    line one\n"
                             "           line two\n");
  assert_true(starts_with(req, "GET /v1/sessions/s1 HTTP/1.1\r\n"));
  char host[64];
  snprintf(host, sizeof host, "\r\nHost: 127.0.0.1:%d\r\n", f.port);
  expect_contains(req, host, "request");
  expect_contains(req, "\r\nAuthorization: Bearer sekret\r\n", "request");
  assert_null(strstr(r.out, "sekret"));
  free(req);
  free(chunked);
  ctl_free(&r);
}

static void test_http_error_prints_code_message_and_field(void **state) {
  (void)state;
  char *a404 = answer("404 Not Found", "{\"error\":{\"code\":\"not_found\",\"message\":\"no "
                                       "session 'x'\",\"field\":null}}");
  char *a400 = answer("400 Bad Request", "{\"error\":{\"code\":\"invalid\",\"message\":"
                                         "\"expected a string\",\"field\":\"channel\"}}");
  /* Not JSON, no Content-Length: the body runs to the end of the connection. */
  const char *a502 = "HTTP/1.0 502 Bad Gateway\r\n\r\nupstream\x1b[31m down\nmore\n";
  fake_server f;
  fake_start(&f, (const char *const[]){a404, a400, a502, NULL});
  ctl_result r;
  ctl(&r, f.url, (const char *const[]){"sessions", "show", "x", NULL});
  expect_exit(&r, 1, "404");
  assert_string_equal(r.out, "");
  assert_string_equal(r.err, "cephalonctl: 404 not_found: no session 'x'\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"events", "post", "--session", "s1", "hi", NULL});
  expect_exit(&r, 1, "400");
  assert_string_equal(r.err, "cephalonctl: 400 invalid: expected a string (field: channel)\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"lanes", NULL});
  expect_exit(&r, 1, "502");
  assert_string_equal(r.err, "cephalonctl: 502 Bad Gateway: upstream?[31m down\n");
  ctl_free(&r);
  free(fake_finish(&f));
  free(a404);
  free(a400);
}

static void test_why_prints_one_readable_line_per_reason(void **state) {
  (void)state;
  /* 2026-01-02 09:31:05.250 local time, whatever the zone. */
  struct tm tm = {.tm_year = 126, .tm_mon = 0, .tm_mday = 2, .tm_hour = 9, .tm_min = 31,
                  .tm_sec = 5, .tm_isdst = -1};
  long long until_ms = (long long)mktime(&tm) * 1000 + 250;
  char budget[256];
  snprintf(budget, sizeof budget,
           "{\"session\":\"s2\",\"reason\":\"lane_out_of_budget\",\"lane\":\"operational\","
           "\"until_ms\":%lld}",
           until_ms);
  char *a1 = answer("200 OK", "{\"session\":\"s1\",\"reason\":\"runnable\",\"lane\":"
                              "\"interactive\",\"credits\":28.0,\"waiting_s\":1.24,\"rank\":2,"
                              "\"lane_runnable\":5,\"ahead_in_higher_lanes\":0}");
  char *a2 = answer("200 OK", budget);
  char *a3 = answer("200 OK", "{\"reasons\":[{\"reason\":\"paused\"},{\"reason\":\"no_input\"},"
                              "{\"reason\":\"concurrency_full\"}]}");
  fake_server f;
  fake_start(&f, (const char *const[]){a1, a2, a3, NULL});
  ctl_result r;
  ctl(&r, f.url, (const char *const[]){"sessions", "why", "s1", NULL});
  expect_exit(&r, 0, "why runnable");
  assert_string_equal(r.out, "s1: runnable, rank 2 of 5 in interactive (credits 28.0, waiting "
                             "1.2 s)\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"sessions", "why", "s2", NULL});
  expect_exit(&r, 0, "why budget");
  assert_string_equal(r.out, "s2: lane out of budget until 09:31:05 (operational)\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"sessions", "why", "s3", NULL});
  expect_exit(&r, 0, "why list");
  assert_string_equal(r.out, "s3: paused\ns3: no input\ns3: concurrency full\n");
  ctl_free(&r);
  char *req = fake_finish(&f);
  assert_true(starts_with(req, "GET /v1/sessions/s1/why HTTP/1.1\r\n"));
  free(req);
  free(a1);
  free(a2);
  free(a3);
}

static void test_events_post_sends_one_event_and_prints_the_result(void **state) {
  (void)state;
  char *a = answer("200 OK",
                   "{\"results\":[{\"id\":7,\"status\":\"queued\",\"sessions\":[\"s1\",\"s2\"]}]}");
  char *b = answer("200 OK", "{\"results\":[{\"id\":7,\"status\":\"duplicate\",\"sessions\":[]}]}");
  char *c = answer("200 OK", "{\"results\":[{\"id\":0,\"status\":\"rejected\",\"sessions\":[],"
                             "\"reason\":\"body too long\"}]}");
  fake_server f;
  fake_start(&f, (const char *const[]){a, b, c, NULL});
  ctl_result r;
  ctl(&r, f.url,
      (const char *const[]){"events", "post", "--channel", "general", "--sender", "alice",
                            "--mention", "s2", "--mention", "s3", "--key", "k-1", "--",
                            "--hello--", NULL});
  expect_exit(&r, 0, "events post");
  assert_string_equal(r.out, "event 7: queued, sessions s1, s2\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"events", "post", "--session", "s1", "hi", NULL});
  expect_exit(&r, 0, "events post duplicate");
  assert_string_equal(r.out, "event 7: duplicate, already stored under this id\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"events", "post", "--channel", "c", "x", NULL});
  expect_exit(&r, 1, "events post rejected");
  assert_string_equal(r.err, "cephalonctl: event rejected: body too long\n");
  ctl_free(&r);

  char *req = fake_finish(&f);
  assert_true(starts_with(req, "POST /v1/events HTTP/1.1\r\n"));
  expect_contains(req, "\r\nContent-Type: application/json\r\n", "request");
  json_t *want = json_loads("{\"events\":[{\"channel\":\"general\",\"sender\":\"alice\","
                            "\"body\":\"--hello--\",\"mentions\":[\"s2\",\"s3\"],\"key\":\"k-1\"}]}",
                            0, NULL);
  json_t *got = request_json(req, 0);
  assert_true(json_equal(want, got));
  json_decref(got);
  json_decref(want);
  /* Without --channel: session given, default sender. */
  got = request_json(req, 1);
  want = json_loads("{\"events\":[{\"sender\":\"cephalonctl\",\"body\":\"hi\",\"session\":\"s1\"}]}",
                    0, NULL);
  assert_true(json_equal(want, got));
  json_decref(got);
  json_decref(want);
  free(req);
  free(a);
  free(b);
  free(c);
}

static void test_turns_lease_and_complete_on_the_wire(void **state) {
  (void)state;
  char *turn = answer(
      "200 OK",
      "{\"turn\":{\"id\":\"t9\",\"lease\":\"0123abcd\",\"session\":\"s1\",\"lane\":"
      "\"interactive\",\"kind\":\"inbox\",\"input\":\"inbox:hello\\nagain\",\"episode\":3,"
      "\"deadline_ms\":12,\"staged\":[{\"id\":1,\"event_id\":5,\"channel\":\"general\","
      "\"sender\":\"alice\",\"body\":\"hello\",\"mentioned\":true}]}}");
  const char *none = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
  char *done = answer("200 OK", "{\"ok\":true}");
  fake_server f;
  fake_start(&f, (const char *const[]){turn, none, done, NULL});
  ctl_result r;
  ctl(&r, f.url,
      (const char *const[]){"turns", "lease", "--worker", "w1", "--lanes",
                            "interactive,operational", "--wait-ms", "250", NULL});
  expect_exit(&r, 0, "turns lease");
  assert_string_equal(r.out, "turn t9 lease 0123abcd\n"
                             "session s1, lane interactive, kind inbox, episode 3, deadline_ms 12\n"
                             "staged:\n"
                             "  event 5 in general from alice (mentioned): hello\n"
                             "input:\n"
                             "  inbox:hello\n"
                             "  again\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"turns", "lease", "--worker", "w1", NULL});
  expect_exit(&r, 3, "turns lease 204");
  assert_string_equal(r.out, "no turn\n");
  assert_string_equal(r.err, "");
  ctl_free(&r);
  ctl(&r, f.url,
      (const char *const[]){"turns", "complete", "t9", "--lease", "0123abcd", "--tokens", "120",
                            "--reply", "hi alice", "--reply-channel", "general", NULL});
  expect_exit(&r, 0, "turns complete");
  assert_string_equal(r.out, "turn t9 completed\n");
  ctl_free(&r);

  char *req = fake_finish(&f);
  assert_true(starts_with(req, "POST /v1/turns/lease HTTP/1.1\r\n"));
  json_t *got = request_json(req, 0);
  json_t *want = json_loads(
      "{\"worker\":\"w1\",\"lanes\":[\"interactive\",\"operational\"],\"wait_ms\":250}", 0, NULL);
  assert_true(json_equal(want, got));
  json_decref(got);
  json_decref(want);
  got = request_json(req, 1);
  want = json_loads("{\"worker\":\"w1\"}", 0, NULL);
  assert_true(json_equal(want, got));
  json_decref(got);
  json_decref(want);
  expect_contains(req, "POST /v1/turns/t9/complete HTTP/1.1\r\n", "request");
  got = request_json(req, 2);
  want = json_loads("{\"lease\":\"0123abcd\",\"cost\":{\"tokens\":120,\"tool_calls\":0},"
                    "\"reply\":{\"body\":\"hi alice\",\"channel\":\"general\"}}",
                    0, NULL);
  assert_true(json_equal(want, got));
  json_decref(got);
  json_decref(want);
  free(req);
  free(turn);
  free(done);
}

static void test_status_lanes_and_json_from_scripted_answers(void **state) {
  (void)state;
  const char *lanes_body =
      "{\"lanes\":[{\"name\":\"interactive\",\"turns_left\":59.5,\"tool_calls_left\":120,"
      "\"runnable\":2,\"running\":1,\"budget\":{\"turns\":60,\"tool_calls\":120}},"
      "{\"name\":\"operational\",\"turns_left\":30,\"tool_calls_left\":-3.25,\"runnable\":0,"
      "\"running\":0,\"budget\":{\"turns\":30,\"tool_calls\":60}}],"
      "\"concurrency\":{\"limit\":4,\"in_use\":1}}";
  char *health = answer("200 OK", "{\"status\":\"ok\"}");
  char *ready = answer("200 OK", "{\"status\":\"ready\",\"policy_generation\":3}");
  char *lanes = answer("200 OK", lanes_body);
  char *not_ready = answer("503 Service Unavailable",
                           "{\"error\":{\"code\":\"not_ready\",\"message\":\"recovering\"}}");
  fake_server f;
  fake_start(&f, (const char *const[]){health, ready, lanes, lanes, lanes, health, not_ready,
                                       NULL});
  ctl_result r;
  ctl(&r, f.url, (const char *const[]){"status", NULL});
  expect_exit(&r, 0, "status");
  char want[1024];
  snprintf(want, sizeof want,
           "cephalond at %s: reachable, ready\n"
           "policy generation: 3\n"
           "concurrency: 1 of 4 in use\n"
           "LANE         TURNS_LEFT  TOOL_CALLS_LEFT  RUNNABLE  RUNNING\n"
           "interactive        59.5            120.0         2        1\n"
           "operational        30.0             -3.2         0        0\n",
           f.url);
  assert_string_equal(r.out, want);
  ctl_free(&r);

  ctl(&r, f.url, (const char *const[]){"lanes", NULL});
  expect_exit(&r, 0, "lanes");
  assert_string_equal(r.out,
                      "LANE         TURNS_LEFT  TURNS/MIN  TOOL_CALLS_LEFT  TOOL_CALLS/MIN  "
                      "RUNNABLE  RUNNING\n"
                      "interactive        59.5         60            120.0             120  "
                      "       2        1\n"
                      "operational        30.0         30             -3.2              60  "
                      "       0        0\n"
                      "concurrency: 1 of 4 in use\n");
  ctl_free(&r);

  /* --json: the body as the server sent it, pretty-printed. */
  ctl(&r, f.url, (const char *const[]){"--json", "lanes", NULL});
  expect_exit(&r, 0, "--json lanes");
  json_t *got = json_loads(r.out, 0, NULL), *sent = json_loads(lanes_body, 0, NULL);
  assert_non_null(got);
  assert_true(json_equal(got, sent));
  assert_non_null(strstr(r.out, "\n  \"lanes\": [\n")); /* indented */
  json_decref(got);
  json_decref(sent);
  ctl_free(&r);

  /* Not ready: reported, exit 1. */
  ctl(&r, f.url, (const char *const[]){"status", NULL});
  expect_exit(&r, 1, "status not ready");
  snprintf(want, sizeof want, "cephalond at %s: reachable, not ready\n", f.url);
  assert_string_equal(r.out, want);
  assert_string_equal(r.err, "cephalonctl: 503 not_ready: recovering\n");
  ctl_free(&r);

  char *req = fake_finish(&f);
  assert_true(starts_with(req, "GET /healthz HTTP/1.1\r\n"));
  expect_contains(req, "GET /readyz HTTP/1.1\r\n", "requests");
  expect_contains(req, "GET /v1/lanes HTTP/1.1\r\n", "requests");
  free(req);
  free(health);
  free(ready);
  free(lanes);
  free(not_ready);
}

static void test_sessions_list_builds_the_query_and_prints_a_table(void **state) {
  (void)state;
  char *a = answer("200 OK", "{\"sessions\":[{\"id\":\"s1\",\"class\":\"interactive\",\"state\":"
                             "\"idle\",\"credits\":30,\"episode\":0,\"subscribe\":[\"general\"]},"
                             "{\"id\":\"ops:x@y\",\"class\":\"operational\",\"state\":\"queued\","
                             "\"credits\":-1.5,\"episode\":12,\"subscribe\":[]}],"
                             "\"next\":\"ops:x@y\"}");
  char *empty = answer("200 OK", "{\"sessions\":[]}");
  fake_server f;
  fake_start(&f, (const char *const[]){a, empty, NULL});
  ctl_result r;
  ctl(&r, f.url,
      (const char *const[]){"sessions", "list", "--class", "interactive", "--state", "queued",
                            "--after", "a b&c", "--limit", "2", NULL});
  expect_exit(&r, 0, "sessions list");
  assert_string_equal(r.out, "ID       CLASS        STATE   CREDITS  EPISODE  SUBSCRIBE\n"
                             "s1       interactive  idle       30.0        0  general\n"
                             "ops:x@y  operational  queued     -1.5       12  -\n"
                             "more: cephalonctl sessions list --after ops:x@y\n");
  ctl_free(&r);
  ctl(&r, f.url, (const char *const[]){"sessions", "list", NULL});
  expect_exit(&r, 0, "sessions list empty");
  assert_string_equal(r.out, "no sessions\n");
  ctl_free(&r);
  char *req = fake_finish(&f);
  assert_true(starts_with(
      req, "GET /v1/sessions?class=interactive&state=queued&after=a%20b%26c&limit=2 HTTP/1.1\r\n"));
  expect_contains(req, "GET /v1/sessions HTTP/1.1\r\n", "requests");
  free(req);
  free(a);
  free(empty);
}

/* ---------------------------------------------------------------- against the real daemon */

typedef struct daemon_fixture {
  cph_test_daemon d;
  char *policy;
  char url[64];
} daemon_fixture;

static int daemon_setup(void **state) {
  daemon_fixture *fx = calloc(1, sizeof *fx);
  char *src = cph_test_source_path("cephalon.policy.edn.example");
  char *text = cph_test_read_file(src, NULL);
  free(src);
  if (!fx || !text)
    return -1;
  fx->policy = cph_test_write_tmpfile(".edn", text);
  free(text);
  if (cph_test_daemon_start(&fx->d, fx->policy, NULL, NULL) != 0) {
    unlink(fx->policy);
    free(fx->policy);
    free(fx);
    return -1;
  }
  snprintf(fx->url, sizeof fx->url, "http://127.0.0.1:%d", fx->d.port);
  *state = fx;
  return 0;
}

static int daemon_teardown(void **state) {
  daemon_fixture *fx = *state;
  int rc = cph_test_daemon_stop(&fx->d);
  unlink(fx->policy);
  free(fx->policy);
  free(fx);
  return rc == 0 ? 0 : -1;
}

static void test_daemon_status_is_reachable_and_ready(void **state) {
  daemon_fixture *fx = *state;
  ctl_result r;
  ctl(&r, fx->url, (const char *const[]){"status", NULL});
  expect_exit(&r, 0, "status");
  assert_string_equal(r.err, "");
  char first[128];
  snprintf(first, sizeof first, "cephalond at %s: reachable, ready\n", fx->url);
  assert_true(starts_with(r.out, first));
  expect_contains(r.out, "policy generation: 1\n", "status");
  expect_contains(r.out, "concurrency: 0 of 4 in use\n", "status");
  expect_contains(r.out, "\ninteractive ", "status");
  expect_contains(r.out, "\noperational ", "status");
  expect_contains(r.out, "\nmaintenance ", "status");
  ctl_free(&r);
}

/* Finds "WORD VALUE" in text and copies VALUE (up to a blank or newline). */
static void field_after(const char *text, const char *word, char *out, size_t n) {
  const char *p = strstr(text, word);
  if (!p)
    fail_msg("'%s' not in: %s", word, text);
  p += strlen(word);
  size_t len = strcspn(p, " \n");
  assert_true(len > 0 && len < n);
  memcpy(out, p, len);
  out[len] = '\0';
}

static void test_daemon_event_is_leased_and_completed_through_the_cli(void **state) {
  daemon_fixture *fx = *state;
  cph_test_response h = cph_test_http(
      fx->d.port, "POST", "/v1/sessions", "Content-Type: application/json\r\n",
      "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}");
  if (h.status != 200 && h.status != 201)
    fail_msg("POST /v1/sessions: %d %s", h.status, h.body ? h.body : "");
  cph_test_response_free(&h);

  ctl_result r;
  ctl(&r, fx->url,
      (const char *const[]){"events", "post", "--channel", "general", "--sender", "alice",
                            "hello from the cli", NULL});
  expect_exit(&r, 0, "events post");
  assert_true(starts_with(r.out, "event "));
  expect_contains(r.out, ": queued, sessions s1\n", "events post");
  assert_true(one_line(r.out));
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"turns", "lease", "--worker", "w1", "--lanes",
                                         "interactive", "--wait-ms", "5000", NULL});
  expect_exit(&r, 0, "turns lease");
  assert_true(starts_with(r.out, "turn "));
  char turn_id[160], lease[160];
  field_after(r.out, "turn ", turn_id, sizeof turn_id);
  field_after(r.out, " lease ", lease, sizeof lease);
  expect_contains(r.out, "session s1, lane interactive, kind inbox", "turns lease");
  expect_contains(r.out, "from alice: hello from the cli\n", "turns lease");
  expect_contains(r.out, "input:\n  inbox:hello from the cli\n", "turns lease");
  ctl_free(&r);

  const char *const complete[] = {"turns",    "complete",   turn_id, "--lease",
                                  lease,      "--tokens",   "42",    "--tool-calls",
                                  "1",        "--reply",    "hi alice", NULL};
  ctl(&r, fx->url, complete);
  expect_exit(&r, 0, "turns complete");
  char want[256];
  snprintf(want, sizeof want, "turn %s completed\n", turn_id);
  assert_string_equal(r.out, want);
  ctl_free(&r);
  /* Completion is idempotent for the same lease (DESIGN §4). */
  ctl(&r, fx->url, complete);
  expect_exit(&r, 0, "turns complete again");
  ctl_free(&r);

  /* The reply went out on the replies stream. */
  h = cph_test_http(fx->d.port, "GET", "/v1/replies?after=0", NULL, NULL);
  assert_int_equal(h.status, 200);
  expect_contains(h.body, "hi alice", "replies");
  cph_test_response_free(&h);

  /* The session's ended turns: this one, completed, with the cost it was completed with;
   * and its record on its own. */
  ctl(&r, fx->url, (const char *const[]){"turns", "list", "--session", "s1", NULL});
  expect_exit(&r, 0, "turns list");
  assert_true(starts_with(r.out, "ID "));
  expect_contains(r.out, "STATE", "turns list");
  char row[256];
  snprintf(row, sizeof row, "%s  completed  inbox  interactive  ", turn_id);
  expect_contains(r.out, row, "turns list");
  expect_contains(r.out, "  42           1  w1", "turns list");
  ctl_free(&r);
  ctl(&r, fx->url, (const char *const[]){"turns", "show", turn_id, NULL});
  expect_exit(&r, 0, "turns show");
  snprintf(row, sizeof row, "id  %s\n", turn_id);
  assert_true(starts_with(r.out, row));
  expect_contains(r.out, "\nstate  completed\n", "turns show");
  expect_contains(r.out, "\ncost.tokens  42\n", "turns show");
  expect_contains(r.out, "\ncost.tool_calls  1\n", "turns show");
  expect_contains(r.out, "\nworker  w1\n", "turns show");
  ctl_free(&r);
  ctl(&r, fx->url, (const char *const[]){"turns", "list", NULL});
  expect_exit(&r, 2, "turns list without --session");
  ctl_free(&r);

  /* Nothing left to do: no turn, exit 3. */
  ctl(&r, fx->url, (const char *const[]){"turns", "lease", "--worker", "w1", "--wait-ms", "0",
                                         NULL});
  expect_exit(&r, 3, "turns lease with nothing queued");
  assert_string_equal(r.out, "no turn\n");
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"sessions", "show", "s1", NULL});
  expect_exit(&r, 0, "sessions show");
  assert_true(starts_with(r.out, "id:"));
  expect_contains(r.out, " s1\n", "sessions show");
  expect_contains(r.out, "\nclass:", "sessions show");
  expect_contains(r.out, " interactive\n", "sessions show");
  expect_contains(r.out, "\nsubscribe:", "sessions show");
  expect_contains(r.out, " general\n", "sessions show");
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"sessions", "why", "s1", NULL});
  expect_exit(&r, 0, "sessions why");
  assert_true(starts_with(r.out, "s1: no input"));
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"sessions", "list", "--class", "interactive", NULL});
  expect_exit(&r, 0, "sessions list");
  assert_true(starts_with(r.out, "ID "));
  expect_contains(r.out, "\ns1 ", "sessions list");
  ctl_free(&r);

  /* --json prints the server's JSON. */
  ctl(&r, fx->url, (const char *const[]){"--json", "sessions", "show", "s1", NULL});
  expect_exit(&r, 0, "--json sessions show");
  json_error_t e;
  json_t *j = json_loads(r.out, 0, &e);
  if (!j)
    fail_msg("--json sessions show is not JSON (%s): %s", e.text, r.out);
  json_t *s = json_object_get(j, "session") ? json_object_get(j, "session") : j;
  assert_string_equal(json_string_value(json_object_get(s, "id")), "s1");
  assert_string_equal(json_string_value(json_object_get(s, "class")), "interactive");
  json_decref(j);
  ctl_free(&r);
}

static void test_daemon_lanes_and_json_output(void **state) {
  daemon_fixture *fx = *state;
  ctl_result r;
  ctl(&r, fx->url, (const char *const[]){"lanes", NULL});
  expect_exit(&r, 0, "lanes");
  assert_true(starts_with(r.out, "LANE "));
  expect_contains(r.out, "\ninteractive ", "lanes");
  expect_contains(r.out, "\noperational ", "lanes");
  expect_contains(r.out, "\nmaintenance ", "lanes");
  expect_contains(r.out, "\nconcurrency: ", "lanes");
  expect_contains(r.out, " of 4 in use\n", "lanes");
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"--json", "lanes", NULL});
  expect_exit(&r, 0, "--json lanes");
  json_t *j = json_loads(r.out, 0, NULL);
  assert_non_null(j);
  assert_int_equal(json_array_size(json_object_get(j, "lanes")), 3);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "concurrency"),
                                                      "limit")),
                   4);
  json_decref(j);
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"--json", "status", NULL});
  expect_exit(&r, 0, "--json status");
  j = json_loads(r.out, 0, NULL);
  assert_non_null(j);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "healthz"),
                                                        "status")),
                      "ok");
  assert_true(json_is_object(json_object_get(j, "lanes")));
  json_decref(j);
  ctl_free(&r);

  ctl(&r, fx->url, (const char *const[]){"--json", "sessions", "list", NULL});
  expect_exit(&r, 0, "--json sessions list");
  j = json_loads(r.out, 0, NULL);
  assert_non_null(j);
  json_decref(j);
  ctl_free(&r);
}

static void test_daemon_unknown_session_is_404_exit_1(void **state) {
  daemon_fixture *fx = *state;
  const char *const *const cases[] = {
      (const char *const[]){"sessions", "show", "nosuch", NULL},
      (const char *const[]){"sessions", "why", "nosuch", NULL},
  };
  for (size_t i = 0; i < 2; i++) {
    ctl_result r;
    ctl(&r, fx->url, cases[i]);
    expect_exit(&r, 1, cases[i][1]);
    assert_string_equal(r.out, "");
    if (!starts_with(r.err, "cephalonctl: 404 not_found: ") || !one_line(r.err))
      fail_msg("sessions %s nosuch: stderr %s", cases[i][1], r.err);
    expect_contains(r.err, "nosuch", "404 message names the session");
    ctl_free(&r);
  }
}

/* Runs last: it moves the policy generation on. */
static void test_daemon_policy_reload_moves_the_generation(void **state) {
  daemon_fixture *fx = *state;
  ctl_result r;
  ctl(&r, fx->url, (const char *const[]){"policy", "reload", NULL});
  expect_exit(&r, 0, "policy reload");
  assert_true(starts_with(r.out, "policy reloaded"));
  ctl_free(&r);
  ctl(&r, fx->url, (const char *const[]){"status", NULL});
  expect_exit(&r, 0, "status after reload");
  expect_contains(r.out, "policy generation: 2\n", "status after reload");
  ctl_free(&r);
}

/* ---------------------------------------------------------------- cephalonctl replies */

/* Creates interactive session id on fx's daemon; may_exist: a 409 (it is there) is fine. */
static void create_session(const daemon_fixture *fx, const char *id, bool may_exist) {
  char body[96];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", id);
  cph_test_response h = cph_test_api(fx->d.port, "POST", "/v1/sessions", NULL, body);
  if (h.status != 200 && h.status != 201 && !(may_exist && h.status == 409))
    fail_msg("POST /v1/sessions: %d %s", h.status, h.body ? h.body : "");
  cph_test_response_free(&h);
}

/* One turn of session `session` answered with reply `body`: an event to its direct channel,
 * leased (interactive lane) and completed; the reply's id on the stream. */
static long long answer_with(const daemon_fixture *fx, const char *session, const char *body) {
  char json[256];
  snprintf(json, sizeof json,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"q for %s\"}]}",
           session, body);
  cph_test_response h = cph_test_api(fx->d.port, "POST", "/v1/events", NULL, json);
  assert_int_equal(h.status, 200);
  cph_test_response_free(&h);
  h = cph_test_api(fx->d.port, "POST", "/v1/turns/lease", NULL,
                   "{\"worker\":\"w\",\"lanes\":[\"interactive\"],\"wait_ms\":5000}");
  if (h.status != 200)
    fail_msg("lease: %d %s", h.status, h.body ? h.body : "");
  json_t *j = cph_test_json(&h);
  cph_test_response_free(&h);
  json_t *turn = json_object_get(j, "turn");
  assert_string_equal(json_string_value(json_object_get(turn, "session")), session);
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(json, sizeof json, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},"
                              "\"reply\":{\"body\":\"%s\"}}",
           json_string_value(json_object_get(turn, "lease")), body);
  json_decref(j);
  h = cph_test_api(fx->d.port, "POST", path, NULL, json);
  if (h.status != 200)
    fail_msg("complete: %d %s", h.status, h.body ? h.body : "");
  cph_test_response_free(&h);
  h = cph_test_api(fx->d.port, "GET", "/v1/replies?after=0&limit=1000", NULL, NULL);
  j = cph_test_json(&h);
  cph_test_response_free(&h);
  long long last = json_integer_value(json_object_get(j, "next"));
  json_decref(j);
  return last;
}

/* Waits up to 10 s until the file at path holds needle. */
static void wait_file_holds(const char *path, const char *needle) {
  for (int64_t t0 = cph_test_now_ms(); cph_test_now_ms() - t0 < 10000;) {
    char *text = cph_test_read_file(path, NULL);
    bool there = text && strstr(text, needle);
    free(text);
    if (there)
      return;
    struct timespec ts = {0, 20000000L};
    nanosleep(&ts, NULL);
  }
  char *text = cph_test_read_file(path, NULL);
  fail_msg("'%s' did not appear within 10 s in:\n%s", needle, text ? text : "");
}

/* The replies stream after `after` as the API gives it (a JSON array). */
static json_t *stream_after(const daemon_fixture *fx, long long after) {
  char path[96];
  snprintf(path, sizeof path, "/v1/replies?after=%lld&limit=1000", after);
  cph_test_response h = cph_test_api(fx->d.port, "GET", path, NULL, NULL);
  assert_int_equal(h.status, 200);
  json_t *j = cph_test_json(&h);
  cph_test_response_free(&h);
  json_t *list = json_incref(json_object_get(j, "replies"));
  json_decref(j);
  return list;
}

/* Each line of out is one JSON object, equal to the stream's objects in order. */
static void expect_json_lines(const char *out, const json_t *want, const char *what) {
  size_t n = 0;
  for (const char *line = out; *line; n++) {
    size_t len = strcspn(line, "\n");
    json_error_t e;
    json_t *got = json_loadb(line, len, 0, &e);
    if (!got)
      fail_msg("%s: line %zu is not JSON (%s): %.*s", what, n + 1, e.text, (int)len, line);
    if (n >= json_array_size(want) || !json_equal(got, json_array_get(want, n)))
      fail_msg("%s: line %zu is not the stream's reply %zu:\n%s", what, n + 1, n + 1, out);
    json_decref(got);
    line += len + (line[len] == '\n');
  }
  if (n != json_array_size(want))
    fail_msg("%s: %zu lines for %zu replies:\n%s", what, n, json_array_size(want), out);
}

static void test_daemon_replies_follow_prints_each_reply_once_in_order(void **state) {
  daemon_fixture *fx = *state;
  create_session(fx, "rf", false);
  json_t *before = stream_after(fx, 0); /* earlier tests' replies */
  long long base = 0;
  if (json_array_size(before))
    base = json_integer_value(
        json_object_get(json_array_get(before, json_array_size(before) - 1), "id"));
  json_decref(before);

  /* two replies before the follower starts, three while it runs */
  answer_with(fx, "rf", "before one");
  long long second = answer_with(fx, "rf", "before two");
  char *dir = cph_test_tmpdir("ctl-follow");
  char out_path[512], err_path[512], bin[512], url_after[32];
  snprintf(out_path, sizeof out_path, "%s/out", dir);
  snprintf(err_path, sizeof err_path, "%s/err", dir);
  snprintf(bin, sizeof bin, "%s/cephalonctl", getenv("CPH_BIN_DIR"));
  snprintf(url_after, sizeof url_after, "%lld", base);
  const char *argv[] = {bin,       "--url",  fx->url, "--json",      "replies", "--follow",
                        "--after", url_after, "--wait-ms", "1000", NULL};
  pid_t pid = cph_test_spawn(argv, out_path, err_path);
  assert_true(pid > 0);
  wait_file_holds(out_path, "\"before two\"");
  answer_with(fx, "rf", "during one");
  answer_with(fx, "rf", "during two");
  answer_with(fx, "rf", "during three");
  wait_file_holds(out_path, "\"during three\"");
  int status = cph_test_signal_wait(pid, SIGINT, 5000);
  char *out = cph_test_read_file(out_path, NULL), *err = cph_test_read_file(err_path, NULL);
  if (status != 0)
    fail_msg("replies --follow after SIGINT: exit %d\nstderr: %s", status, err);
  assert_string_equal(err, "");
  json_t *want = stream_after(fx, base);
  assert_int_equal(json_array_size(want), 5);
  expect_json_lines(out, want, "replies --follow --json");
  json_decref(want);
  free(out);
  free(err);

  /* SIGTERM stops it too, exit 0 (a new file: the old one holds the needle already) */
  snprintf(out_path, sizeof out_path, "%s/out2", dir);
  pid = cph_test_spawn(argv, out_path, err_path);
  wait_file_holds(out_path, "\"during three\"");
  assert_int_equal(cph_test_signal_wait(pid, SIGTERM, 5000), 0);
  cph_test_rmtree(dir);
  free(dir);

  /* --after: exactly the replies after it, once (no --follow: one read) */
  char after[32];
  snprintf(after, sizeof after, "%lld", second);
  ctl_result r;
  ctl(&r, fx->url, (const char *const[]){"--json", "replies", "--after", after, NULL});
  expect_exit(&r, 0, "replies --after");
  want = stream_after(fx, second);
  assert_int_equal(json_array_size(want), 3);
  expect_json_lines(r.out, want, "replies --after");
  json_decref(want);
  ctl_free(&r);

  /* the table, --limit */
  ctl(&r, fx->url, (const char *const[]){"replies", "--after", after, "--limit", "2", NULL});
  expect_exit(&r, 0, "replies table");
  char table[256]; /* ids below 100 here: the ID column is two wide, right-aligned */
  snprintf(table, sizeof table,
           "ID  SESSION  CHANNEL    BODY\n"
           "%2lld  rf       direct:rf  during one\n"
           "%2lld  rf       direct:rf  during two\n",
           second + 1, second + 2);
  assert_string_equal(r.out, table);
  ctl_free(&r);
}

/* The replies stream's identity (GET /v1/replies "stream"). */
static char *stream_identity(const daemon_fixture *fx) {
  cph_test_response h = cph_test_api(fx->d.port, "GET", "/v1/replies?after=0&limit=1", NULL, NULL);
  assert_int_equal(h.status, 200);
  json_t *j = cph_test_json(&h);
  cph_test_response_free(&h);
  const char *id = json_string_value(json_object_get(j, "stream"));
  assert_non_null(id);
  assert_int_equal(strlen(id), 16);
  char *copy = strdup(id);
  json_decref(j);
  return copy;
}

/* Starts fx's daemon again at the same address, on data_dir (NULL: a new, empty one). */
static void restart_at_same_address(daemon_fixture *fx, const char *data_dir) {
  int port = fx->d.port;
  assert_int_equal(cph_test_daemon_stop(&fx->d), 0);
  char listen[32];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  const char *const extra[] = {"--listen", listen, NULL};
  assert_int_equal(cph_test_daemon_start(&fx->d, fx->policy, data_dir, extra), 0);
  assert_int_equal(fx->d.port, port);
  create_session(fx, "rs", data_dir != NULL); /* on its data dir: there already */
}

/* A daemon started again at the same address on another data directory: its stream starts
 * over (ids from 1) under another identity, and the follower reads it from its start and
 * prints every new reply. Without the identity it asked for ids past its old cursor and
 * printed none of them. On the same data directory the identity stays. */
static void test_daemon_replies_follow_reads_a_new_stream_from_its_start(void **state) {
  daemon_fixture *fx = *state;
  create_session(fx, "rs", false);
  for (int i = 0; i < 5; i++) {
    char body[32];
    snprintf(body, sizeof body, "old %d", i);
    answer_with(fx, "rs", body);
  }
  char *first = stream_identity(fx);

  /* the same data directory: the same stream */
  char *same_dir = strdup(fx->d.data_dir);
  fx->d.keep_data = true;
  restart_at_same_address(fx, same_dir);
  char *again = stream_identity(fx);
  assert_string_equal(again, first);
  free(again);

  char *dir = cph_test_tmpdir("ctl-stream");
  char out_path[512], err_path[512], bin[512];
  snprintf(out_path, sizeof out_path, "%s/out", dir);
  snprintf(err_path, sizeof err_path, "%s/err", dir);
  snprintf(bin, sizeof bin, "%s/cephalonctl", getenv("CPH_BIN_DIR"));
  const char *argv[] = {bin,        "--url",     fx->url, "--json", "replies",
                        "--follow", "--wait-ms", "300",   NULL};
  pid_t pid = cph_test_spawn(argv, out_path, err_path);
  assert_true(pid > 0);
  wait_file_holds(out_path, "\"old 4\"");

  /* a new, empty data directory at the same address: ids 1 and 2 again */
  restart_at_same_address(fx, NULL);
  cph_test_rmtree(same_dir);
  free(same_dir);
  char *second = stream_identity(fx);
  assert_string_not_equal(second, first);
  assert_int_equal(answer_with(fx, "rs", "new 0"), 1);
  assert_int_equal(answer_with(fx, "rs", "new 1"), 2);
  wait_file_holds(out_path, "\"new 1\"");
  int status = cph_test_signal_wait(pid, SIGINT, 5000);
  char *out = cph_test_read_file(out_path, NULL), *err = cph_test_read_file(err_path, NULL);
  if (status != 0)
    fail_msg("replies --follow after SIGINT: exit %d\nstderr: %s", status, err);
  expect_contains(err, "its replies stream is another one now", "the follower's stderr");
  /* every reply once, the old stream's then the new one's */
  const char *want[] = {"old 0", "old 1", "old 2", "old 3", "old 4", "new 0", "new 1"};
  size_t lines = 0;
  for (const char *line = out; line && *line; lines++) {
    size_t len = strcspn(line, "\n");
    json_t *o = json_loadb(line, len, 0, NULL);
    const char *body = json_string_value(json_object_get(o, "body"));
    if (lines >= sizeof want / sizeof *want || !body || strcmp(body, want[lines]) != 0)
      fail_msg("the follower's line %zu is not \"%s\":\n%s", lines + 1,
               lines < sizeof want / sizeof *want ? want[lines] : "(none)", out);
    json_decref(o);
    line += len + (line[len] == '\n');
  }
  assert_int_equal(lines, sizeof want / sizeof *want);
  free(out);
  free(err);
  free(first);
  free(second);
  cph_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest offline[] = {
      cmocka_unit_test(test_unreachable_daemon_says_cannot_reach_and_exits_1),
      cmocka_unit_test(test_bad_usage_exits_2_with_usage_on_stderr),
      cmocka_unit_test(test_help_lists_every_command),
      cmocka_unit_test(test_client_sends_token_and_reads_a_chunked_answer),
      cmocka_unit_test(test_http_error_prints_code_message_and_field),
      cmocka_unit_test(test_why_prints_one_readable_line_per_reason),
      cmocka_unit_test(test_events_post_sends_one_event_and_prints_the_result),
      cmocka_unit_test(test_turns_lease_and_complete_on_the_wire),
      cmocka_unit_test(test_status_lanes_and_json_from_scripted_answers),
      cmocka_unit_test(test_sessions_list_builds_the_query_and_prints_a_table),
  };
  const struct CMUnitTest with_daemon[] = {
      cmocka_unit_test(test_daemon_status_is_reachable_and_ready),
      cmocka_unit_test(test_daemon_event_is_leased_and_completed_through_the_cli),
      cmocka_unit_test(test_daemon_lanes_and_json_output),
      cmocka_unit_test(test_daemon_unknown_session_is_404_exit_1),
      cmocka_unit_test(test_daemon_policy_reload_moves_the_generation),
      cmocka_unit_test(test_daemon_replies_follow_prints_each_reply_once_in_order),
      cmocka_unit_test_setup_teardown(test_daemon_replies_follow_reads_a_new_stream_from_its_start,
                                      daemon_setup, daemon_teardown),
  };
  int failed = cmocka_run_group_tests_name("cephalonctl without a daemon", offline, NULL, NULL);
  failed += cmocka_run_group_tests_name("cephalonctl against cephalond", with_daemon,
                                        daemon_setup, daemon_teardown);
  return failed;
}
