/* The live operations view: GET /v1/top on the real cephalond (busiest sessions ranked by
 * staged + pending, lanes as GET /v1/lanes answers them, maintenance stats, degraded
 * channels, the read scope) and `cephalonctl top` as a user runs it (one frame with --once,
 * a redrawing screen until SIGINT otherwise, and no terminal control from the daemon's
 * strings). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* "loud" is aggregate-only whenever it carries traffic: a degraded channel on demand. */
static const char *POLICY =
    "{:scheduler {:concurrency 4}\n"
    " :backpressure {:channels {\"loud\" {:degrade-to-aggregate-only? true}}}}\n";

#define N_SESSIONS 15 /* s00..s14; s_i gets i/2 messages: ties, and zeros that are left out */

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
  char url[64];
} fixture;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static json_t *get_json(int port, const char *path, const char *token, int want) {
  cph_test_response r = cph_test_api(port, "GET", path, token, NULL);
  if (r.status != want)
    fail_msg("GET %s: status %d, want %d: %s", path, r.status, want, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  return j;
}

static void post(int port, const char *path, const char *body) {
  cph_test_response r = cph_test_api(port, "POST", path, NULL, body);
  if (r.status != 200)
    fail_msg("POST %s: status %d: %s", path, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

/* Sessions s00..s14 (interactive, no subscriptions) with i/2 messages each, all in one
 * request, addressed by `session`; plus one event on "loud" and one on "quiet". The bodies
 * are shorter than :dedupe :min-length (12), so none is taken for a near duplicate of
 * another. */
static void populate(int port) {
  for (int i = 0; i < N_SESSIONS; i++) {
    char body[128];
    snprintf(body, sizeof body, "{\"id\":\"s%02d\",\"class\":\"interactive\"}", i);
    post(port, "/v1/sessions", body);
  }
  char *events = strdup("{\"events\":[");
  assert_non_null(events);
  bool first = true;
  for (int i = 0; i < N_SESSIONS; i++)
    for (int k = 0; k < i / 2; k++) {
      char *next;
      assert_true(asprintf(&next,
                           "%s%s{\"session\":\"s%02d\",\"channel\":\"ops\",\"sender\":\"u\","
                           "\"body\":\"m%d s%02d\"}",
                           events, first ? "" : ",", i, k, i) > 0);
      free(events);
      events = next;
      first = false;
    }
  char *all;
  assert_true(asprintf(&all,
                       "%s,{\"channel\":\"loud\",\"sender\":\"u\",\"body\":\"a loud message\"},"
                       "{\"channel\":\"quiet\",\"sender\":\"u\",\"body\":\"a quiet message\"}]}",
                       events) > 0);
  free(events);
  post(port, "/v1/events", all);
  free(all);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", POLICY);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    return -1;
  snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", f->d.port);
  populate(f->d.port);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cph_test_daemon_stop(&f->d);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

/* ---------------------------------------------------------------- GET /v1/top */

static const char *str(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}
static json_int_t num(const json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

/* The ids of the answer's sessions, "s14,s12,..." */
static void session_ids(const json_t *top, char *out, size_t size) {
  out[0] = '\0';
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(top, "sessions"), i, s) {
    size_t n = strlen(out);
    snprintf(out + n, size - n, "%s%s", i ? "," : "", str(s, "id"));
  }
}

static void test_top_ranks_sessions_by_staged_plus_pending_ties_by_id(void **state) {
  fixture *f = *state;
  json_t *top = get_json(f->d.port, "/v1/top", NULL, 200);
  char ids[512];
  session_ids(top, ids, sizeof ids);
  /* loads: s14 7, s12-s13 6, s10-s11 5, s08-s09 4, s06-s07 3, s04-s05 2, ...; 10 by default */
  assert_string_equal(ids, "s14,s12,s13,s10,s11,s08,s09,s06,s07,s04");
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(top, "sessions"), i, s) {
    int idx = atoi(str(s, "id") + 1);
    assert_int_equal(num(s, "staged") + num(s, "pending"), idx / 2);
    assert_string_equal(str(s, "class"), "interactive");
    const char *st = str(s, "state");
    assert_true(strcmp(st, "queued") == 0 || strcmp(st, "idle") == 0);
    assert_true(json_is_number(json_object_get(s, "credits")));
    assert_int_equal(num(s, "dropped"), 0);
    assert_true(json_is_integer(json_object_get(s, "episode")));
  }
  json_decref(top);

  top = get_json(f->d.port, "/v1/top?limit=3", NULL, 200);
  session_ids(top, ids, sizeof ids);
  assert_string_equal(ids, "s14,s12,s13");
  json_decref(top);

  /* Every session with input, and none without (s00, s01 have nothing waiting). */
  top = get_json(f->d.port, "/v1/top?limit=100", NULL, 200);
  session_ids(top, ids, sizeof ids);
  assert_string_equal(ids, "s14,s12,s13,s10,s11,s08,s09,s06,s07,s04,s05,s02,s03");
  json_decref(top);
}

static void test_top_rejects_a_bad_limit_naming_it(void **state) {
  fixture *f = *state;
  cph_test_response r = cph_test_api(f->d.port, "GET", "/v1/top?limit=101", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", "limit");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/v1/top?limit=ten", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", "limit");
  cph_test_response_free(&r);
}

/* Whether the two answers' lanes agree on what is runnable and running. */
static bool lanes_agree(json_t *a, json_t *b) {
  for (size_t i = 0; i < json_array_size(a) && i < json_array_size(b); i++) {
    json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
    if (num(x, "runnable") != num(y, "runnable") || num(x, "running") != num(y, "running"))
      return false;
  }
  return true;
}

static void test_top_lanes_match_v1_lanes_and_maintenance_is_reported(void **state) {
  fixture *f = *state;
  /* The janitor's maintenance turns start and end between two requests: read both until
   * they caught the same moment (they do within a few tries). */
  json_t *top = NULL, *lanes = NULL;
  for (int tries = 0; tries < 50; tries++) {
    json_decref(top);
    json_decref(lanes);
    top = get_json(f->d.port, "/v1/top", NULL, 200);
    lanes = get_json(f->d.port, "/v1/lanes", NULL, 200);
    if (lanes_agree(json_object_get(top, "lanes"), json_object_get(lanes, "lanes")))
      break;
    usleep(20000);
  }
  json_t *a = json_object_get(top, "lanes"), *b = json_object_get(lanes, "lanes");
  assert_int_equal(json_array_size(a), 3);
  assert_int_equal(json_array_size(a), json_array_size(b));
  for (size_t i = 0; i < json_array_size(a); i++) {
    json_t *x = json_array_get(a, i), *y = json_array_get(b, i);
    /* the same keys; the bucket levels refill continuously, so compare the rest exactly */
    assert_int_equal(json_object_size(x), json_object_size(y));
    const char *key;
    json_t *v;
    json_object_foreach(y, key, v) assert_non_null(json_object_get(x, key));
    assert_string_equal(str(x, "name"), str(y, "name"));
    assert_true(json_equal(json_object_get(x, "budget"), json_object_get(y, "budget")));
    assert_int_equal(num(x, "runnable"), num(y, "runnable"));
    assert_int_equal(num(x, "running"), num(y, "running"));
  }
  /* 13 sessions have input and no worker: all runnable in interactive */
  assert_int_equal(num(json_array_get(a, 0), "runnable"), 13);
  assert_true(json_equal(json_object_get(top, "concurrency"), json_object_get(lanes, "concurrency")));

  json_t *m = json_object_get(top, "maintenance");
  const char *keys[] = {"outbox_pending",         "outbox_oldest_age_seconds",
                        "embed_queue",            "groups_committed_total",
                        "memories_deleted_total", "summaries_created_total"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (!json_is_number(json_object_get(m, keys[i])))
      fail_msg("maintenance.%s missing", keys[i]);
  assert_int_equal(num(m, "outbox_pending"), 0);
  assert_int_equal(num(top, "policy_generation"), 1);
  assert_true(num(top, "ts_ms") > 1600000000000LL);
  json_decref(top);
  json_decref(lanes);
}

static void test_top_lists_only_degraded_channels(void **state) {
  fixture *f = *state;
  json_t *top = get_json(f->d.port, "/v1/top", NULL, 200);
  json_t *list = json_object_get(top, "degraded_channels");
  assert_int_equal(json_array_size(list), 1);
  json_t *c = json_array_get(list, 0);
  assert_string_equal(str(c, "channel"), "loud");
  assert_int_equal(num(c, "step"), 1);
  assert_string_equal(str(c, "step_name"), "aggregate_only");
  assert_int_equal(num(top, "degraded_channels_total"), 1);
  json_decref(top);
}

static void test_top_needs_the_read_scope(void **state) {
  (void)state;
  const char *TOK_READ = "top-read-token", *TOK_INGEST = "top-ingest-token";
  char *h_read = cph_test_sha256_hex(TOK_READ), *h_ingest = cph_test_sha256_hex(TOK_INGEST);
  char *policy_text;
  assert_true(asprintf(&policy_text,
                       "{:auth {:tokens [{:name \"dash\" :sha256 \"%s\" :scopes #{:read}}\n"
                       "                 {:name \"conn\" :sha256 \"%s\" :scopes #{:ingest}}]}}\n",
                       h_read, h_ingest) > 0);
  char *policy = cph_test_write_tmpfile(".edn", policy_text);
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  json_decref(get_json(d.port, "/v1/top", TOK_READ, 200));
  cph_test_response r = cph_test_api(d.port, "GET", "/v1/top", TOK_INGEST, NULL);
  cph_test_expect_error(&r, 403, "forbidden", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(d.port, "GET", "/v1/top", NULL, NULL);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  cph_test_response_free(&r);
  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
  free(policy_text);
  free(h_read);
  free(h_ingest);
}

/* ---------------------------------------------------------------- cephalonctl top */

typedef struct ctl_result {
  int status;
  char *out;
  char *err;
} ctl_result;

static char *ctl_path(void) {
  const char *dir = getenv("CPH_BIN_DIR");
  if (!dir)
    fail_msg("CPH_BIN_DIR is not set");
  char *bin;
  assert_true(asprintf(&bin, "%s/cephalonctl", dir) > 0);
  return bin;
}

/* Runs cephalonctl --url url args... to completion. */
static void ctl(ctl_result *r, const char *url, const char *const *args) {
  char *bin = ctl_path();
  const char *argv[24];
  size_t n = 0;
  argv[n++] = bin;
  argv[n++] = "--url";
  argv[n++] = url;
  for (size_t i = 0; args[i]; i++) {
    assert_true(n < 23);
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

static void expect_exit(const ctl_result *r, int want, const char *what) {
  if (r->status != want)
    fail_msg("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r->status, want, r->out,
             r->err);
}

static void expect_contains(const char *text, const char *needle, const char *what) {
  if (!strstr(text, needle))
    fail_msg("%s: '%s' not found in:\n%s", what, needle, text);
}

static size_t count(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

static void test_ctl_top_once_prints_one_plain_frame(void **state) {
  fixture *f = *state;
  ctl_result r;
  ctl(&r, f->url, (const char *const[]){"top", "--once", NULL});
  expect_exit(&r, 0, "top --once");
  assert_string_equal(r.err, "");
  assert_null(strchr(r.out, '\033')); /* no escape sequence at all: fit for scripts */
  expect_contains(r.out, f->url, "header");
  expect_contains(r.out, "policy generation 1", "header");
  /* No worker leases here; only the janitor's own maintenance turn may be running. */
  const char *conc = strstr(r.out, "concurrency: ");
  int in_use = -1, limit = -1;
  if (!conc || sscanf(conc, "concurrency: %d of %d in use", &in_use, &limit) != 2 ||
      limit != 4 || in_use < 0 || in_use > 1)
    fail_msg("concurrency: want 0 or 1 (the janitor) of 4 in use in:\n%s", r.out);
  expect_contains(r.out, "LANE", "lanes table");
  expect_contains(r.out, "interactive", "lanes table");
  expect_contains(r.out, "maintenance", "lanes table");
  expect_contains(r.out, "busiest sessions", "sessions");
  expect_contains(r.out, "s14", "sessions");
  assert_null(strstr(r.out, "s00")); /* nothing waiting: not listed */
  expect_contains(r.out, "outbox: 0 pending", "maintenance");
  expect_contains(r.out, "loud", "backpressure");
  expect_contains(r.out, "aggregate_only", "backpressure");
  assert_null(strstr(r.out, "quiet"));
  /* s14 before s12 (more waiting), s12 before s13 (tie: by id) */
  const char *a = strstr(r.out, "s14"), *b = strstr(r.out, "s12"), *c = strstr(r.out, "s13");
  assert_true(a && b && c && a < b && b < c);
  ctl_free(&r);

  ctl(&r, f->url, (const char *const[]){"top", "--once", "--limit", "2", NULL});
  expect_exit(&r, 0, "top --once --limit 2");
  expect_contains(r.out, "s12", "limit 2");
  assert_null(strstr(r.out, "s13"));
  ctl_free(&r);
}

static void test_ctl_top_json_once_prints_the_daemon_answer(void **state) {
  fixture *f = *state;
  char *bin = ctl_path();
  ctl_result r;
  r.status = cph_test_run((const char *const[]){bin, "--url", f->url, "--json", "top", "--once",
                                                NULL},
                          &r.out, &r.err);
  free(bin);
  expect_exit(&r, 0, "--json top --once");
  json_t *j = json_loads(r.out, 0, NULL);
  assert_non_null(j);
  assert_int_equal(json_array_size(json_object_get(j, "sessions")), 10);
  assert_true(json_is_object(json_object_get(j, "maintenance")));
  json_decref(j);
  ctl_free(&r);
}

/* Without --once: the screen is cleared and redrawn each interval until SIGINT; exit 0. */
static void test_ctl_top_redraws_until_interrupted(void **state) {
  fixture *f = *state;
  char *bin = ctl_path();
  char *out_path = cph_test_write_tmpfile(".out", "");
  char *err_path = cph_test_write_tmpfile(".err", "");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_TRUNC), e = open(err_path, O_WRONLY | O_TRUNC);
    dup2(o, 1);
    dup2(e, 2);
    execl(bin, bin, "--url", f->url, "top", "--interval", "0.2", (char *)NULL);
    _exit(127);
  }
  /* At least three frames (one at once, then every 0.2 s), bounded. */
  char *out = NULL;
  for (int waited = 0; waited < 10000; waited += 50) {
    free(out);
    out = cph_test_read_file(out_path, NULL);
    if (out && count(out, "\033[H\033[2J") >= 3)
      break;
    sleep_ms(50);
  }
  kill(pid, SIGINT);
  int status = 0;
  for (int waited = 0; waited < 5000 && waitpid(pid, &status, WNOHANG) == 0; waited += 20)
    sleep_ms(20);
  if (kill(pid, 0) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    fail_msg("cephalonctl top did not stop on SIGINT");
  }
  free(out);
  out = cph_test_read_file(out_path, NULL);
  char *err = cph_test_read_file(err_path, NULL);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("top after SIGINT: status %d\nstderr: %s", status, err);
  assert_true(count(out, "\033[H\033[2J") >= 3);
  assert_int_equal(count(out, "\033[H\033[2J"), count(out, "busiest sessions"));
  expect_contains(out, "Ctrl-C quits", "live header");
  assert_string_equal(err, "");
  free(out);
  free(err);
  unlink(out_path);
  unlink(err_path);
  free(out_path);
  free(err_path);
  free(bin);
}

static void test_ctl_top_bad_usage_exits_2(void **state) {
  fixture *f = *state;
  const char *const bad[][5] = {
      {"top", "--interval", "0", NULL},     {"top", "--interval", "soon", NULL},
      {"top", "--interval", "inf", NULL},   {"top", "--limit", "101", NULL},
      {"top", "now", NULL},                 {"top", "--frobnicate", NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ctl_result r;
    ctl(&r, f->url, bad[i]);
    expect_exit(&r, 2, bad[i][1]);
    expect_contains(r.err, "usage: cephalonctl top", bad[i][1]);
    assert_string_equal(r.out, "");
    ctl_free(&r);
  }
  ctl_result r;
  ctl(&r, f->url, (const char *const[]){"top", "--help", NULL});
  expect_exit(&r, 0, "top --help");
  expect_contains(r.out, "--once", "help");
  ctl_free(&r);
}

static void test_ctl_top_once_fails_when_unreachable(void **state) {
  (void)state;
  ctl_result r;
  /* port 1 on loopback: nothing listens there (and we may not bind it) */
  ctl(&r, "http://127.0.0.1:1", (const char *const[]){"top", "--once", NULL});
  expect_exit(&r, 1, "unreachable");
  expect_contains(r.err, "cannot reach cephalond", "unreachable");
  ctl_free(&r);
}

/* A channel name is the daemon's free-form text: it must not reach the terminal as control
 * characters (here an ESC that would clear the screen). */
static void test_ctl_top_prints_no_control_characters_from_the_daemon(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(
      ".edn", "{:backpressure {:defaults {:degrade-to-aggregate-only? true}}}\n");
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  post(d.port, "/v1/events",
       "{\"events\":[{\"channel\":\"ev\\u001b[2Jil\",\"sender\":\"u\",\"body\":\"hello\"}]}");
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
  json_t *top = get_json(d.port, "/v1/top", NULL, 200);
  assert_string_equal(str(json_array_get(json_object_get(top, "degraded_channels"), 0), "channel"),
                      "ev\033[2Jil");
  json_decref(top);
  ctl_result r;
  ctl(&r, url, (const char *const[]){"top", "--once", NULL});
  expect_exit(&r, 0, "top --once");
  assert_null(strchr(r.out, '\033'));
  expect_contains(r.out, "ev?[2Jil", "cleaned channel name");
  ctl_free(&r);
  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

/* A flood that degrades many channels: the view lists the deepest 100 and counts the rest. */
static void test_top_caps_the_degraded_channels_it_lists(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(
      ".edn", "{:backpressure {:defaults {:degrade-to-aggregate-only? true}}}\n");
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  char *events = strdup("{\"events\":[");
  assert_non_null(events);
  for (int i = 0; i < 105; i++) {
    char *next;
    assert_true(asprintf(&next, "%s%s{\"channel\":\"c%03d\",\"sender\":\"u\",\"body\":\"hi\"}",
                         events, i ? "," : "", i) > 0);
    free(events);
    events = next;
  }
  char *all;
  assert_true(asprintf(&all, "%s]}", events) > 0);
  free(events);
  post(d.port, "/v1/events", all);
  free(all);
  json_t *top = get_json(d.port, "/v1/top", NULL, 200);
  json_t *list = json_object_get(top, "degraded_channels");
  assert_int_equal(json_array_size(list), 100);
  assert_int_equal(num(top, "degraded_channels_total"), 105);
  assert_string_equal(str(json_array_get(list, 0), "channel"), "c000"); /* same step: by name */
  assert_string_equal(str(json_array_get(list, 99), "channel"), "c099");
  json_decref(top);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", d.port);
  ctl_result r;
  ctl(&r, url, (const char *const[]){"top", "--once", NULL});
  expect_exit(&r, 0, "top --once");
  expect_contains(r.out, "c099", "listed");
  assert_null(strstr(r.out, "c100"));
  expect_contains(r.out, "... and 5 more degraded channels", "the rest counted");
  ctl_free(&r);
  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_top_ranks_sessions_by_staged_plus_pending_ties_by_id),
      cmocka_unit_test(test_top_rejects_a_bad_limit_naming_it),
      cmocka_unit_test(test_top_lanes_match_v1_lanes_and_maintenance_is_reported),
      cmocka_unit_test(test_top_lists_only_degraded_channels),
      cmocka_unit_test(test_ctl_top_once_prints_one_plain_frame),
      cmocka_unit_test(test_ctl_top_json_once_prints_the_daemon_answer),
      cmocka_unit_test(test_ctl_top_redraws_until_interrupted),
      cmocka_unit_test(test_ctl_top_bad_usage_exits_2),
      cmocka_unit_test(test_ctl_top_once_fails_when_unreachable),
      cmocka_unit_test(test_top_needs_the_read_scope),
      cmocka_unit_test(test_ctl_top_prints_no_control_characters_from_the_daemon),
      cmocka_unit_test(test_top_caps_the_degraded_channels_it_lists),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
