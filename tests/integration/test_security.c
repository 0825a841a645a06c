/* Security edges of the HTTP API (DESIGN §9), against the real cephalond on loopback:
 * - every route in server/http.c's table but /healthz and /readyz answers 401 without a token
 *   and 403 to a token without one of its scopes, when :auth is on (the table is read from the
 *   source, so a route added later is walked too);
 * - a client that sends half a request and stalls is dropped after :server :timeout-seconds,
 *   while other clients are served and long-polls longer than the timeout are not cut;
 * - tokens never reach the log, even at :debug, nor an error answer;
 * - long-polls are capped per client (:max-long-polls-per-client) and the places come back;
 * - at :log-level :warn the ready record is still written. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

/* ---------------------------------------------------------------- tokens */

enum { SC_INGEST = 1, SC_WORKER = 2, SC_ADMIN = 4, SC_READ = 8 };

static const struct {
  unsigned scope;
  const char *name; /* the policy keyword and the token's name */
  const char *token;
} TOKENS[] = {
    {SC_INGEST, "ingest", "sec-ingest-Qx81rT0aZk"},
    {SC_WORKER, "worker", "sec-worker-7hWm2LpPq9"},
    {SC_ADMIN, "admin", "sec-admin-Vn4cS0dRt3"},
    {SC_READ, "read", "sec-read-Ey6gBb1uJx"},
};
enum { N_TOKENS = sizeof TOKENS / sizeof TOKENS[0] };
/* holds every scope: for a full worker flow through one token */
static const char *TOKEN_ALL = "sec-all-scopes-Hk3ZtW9mQa";

/* The :auth policy with one token per scope plus one with all four; extra goes inside the map. */
static char *auth_policy(const char *extra) {
  char *h[N_TOKENS], *hall = cph_test_sha256_hex(TOKEN_ALL);
  for (int i = 0; i < N_TOKENS; i++)
    h[i] = cph_test_sha256_hex(TOKENS[i].token);
  char *text;
  if (asprintf(&text,
               "{:auth {:tokens [{:name \"%s\" :sha256 \"%s\" :scopes #{:%s}}\n"
               "                 {:name \"%s\" :sha256 \"%s\" :scopes #{:%s}}\n"
               "                 {:name \"%s\" :sha256 \"%s\" :scopes #{:%s}}\n"
               "                 {:name \"%s\" :sha256 \"%s\" :scopes #{:%s}}\n"
               "                 {:name \"all\" :sha256 \"%s\" :scopes #{:ingest :worker "
               ":admin :read}}]}\n"
               " %s}\n",
               TOKENS[0].name, h[0], TOKENS[0].name, TOKENS[1].name, h[1], TOKENS[1].name,
               TOKENS[2].name, h[2], TOKENS[2].name, TOKENS[3].name, h[3], TOKENS[3].name,
               hall, extra ? extra : "") < 0)
    abort();
  for (int i = 0; i < N_TOKENS; i++)
    free(h[i]);
  free(hall);
  return text;
}

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static fixture *g_fixture; /* the running one, for the teardown after a failure */

static fixture *start(const char *policy_text) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", policy_text);
  g_fixture = f;
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    fail_msg("cephalond did not start with policy:\n%s", policy_text);
  return f;
}

static void release(fixture *f) {
  unlink(f->policy);
  free(f->policy);
  free(f);
  g_fixture = NULL;
}

static void stop(fixture *f) {
  int rc = cph_test_daemon_stop(&f->d);
  release(f);
  assert_int_equal(rc, 0); /* clean exit, no sanitizer report */
}

static int teardown(void **state) {
  (void)state;
  if (g_fixture) {
    cph_test_daemon_stop(&g_fixture->d);
    release(g_fixture);
  }
  return 0;
}

/* ---------------------------------------------------------------- the route table */

typedef struct route {
  char method[8];
  char pattern[128];
  unsigned scopes; /* 0: public */
} route;

/* Reads `static const cph_route routes[] = {...};` from server/http.c: every
 * {EVHTTP_REQ_M, "/pattern", SCOPE_A | SCOPE_B, ...} entry. */
static size_t read_route_table(route *out, size_t max) {
  char *path = cph_test_source_path("server/http.c");
  char *src = cph_test_read_file(path, NULL);
  if (!src)
    fail_msg("cannot read %s", path);
  free(path);
  char *table = strstr(src, "cph_route routes[] = {");
  assert_non_null(table);
  char *end = strstr(table, "\n};");
  assert_non_null(end);
  *end = '\0';
  size_t n = 0;
  for (char *p = strstr(table, "{EVHTTP_REQ_"); p && n < max; p = strstr(p + 1, "{EVHTTP_REQ_")) {
    route *r = &out[n];
    memset(r, 0, sizeof *r);
    const char *m = p + strlen("{EVHTTP_REQ_");
    size_t ml = strcspn(m, ",");
    assert_true(ml < sizeof r->method);
    memcpy(r->method, m, ml);
    char *q1 = strchr(m, '"'), *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
    assert_non_null(q2);
    assert_true((size_t)(q2 - q1 - 1) < sizeof r->pattern);
    memcpy(r->pattern, q1 + 1, (size_t)(q2 - q1 - 1));
    char *sc = q2 + 1;
    while (*sc == ',' || *sc == ' ' || *sc == '\n')
      sc++;
    size_t sl = strcspn(sc, ",");
    char expr[128];
    snprintf(expr, sizeof expr, "%.*s", (int)sl, sc);
    r->scopes = 0;
    if (strstr(expr, "INGEST"))
      r->scopes |= SC_INGEST;
    if (strstr(expr, "WORKER"))
      r->scopes |= SC_WORKER;
    if (strstr(expr, "ADMIN"))
      r->scopes |= SC_ADMIN;
    if (strstr(expr, "READ"))
      r->scopes |= SC_READ;
    if (!r->scopes && strcmp(expr, "0") != 0)
      fail_msg("route %s %s: cannot read its scopes '%s'", r->method, r->pattern, expr);
    n++;
  }
  free(src);
  return n;
}

/* The pattern with its {params} filled in (values that exist nowhere: auth comes first). */
static void concrete_path(const char *pattern, char *out, size_t size) {
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < size;) {
    if (*p == '{') {
      const char *close = strchr(p, '}');
      int w = snprintf(out + o, size - o, "7");
      o += (size_t)w;
      p = close ? close + 1 : p + strlen(p);
    } else {
      out[o++] = *p++;
    }
  }
  out[o] = '\0';
}

/* A body the route accepts far enough to answer without waiting: leases must not long-poll. */
static const char *body_for(const route *r) {
  if (strcmp(r->method, "GET") == 0 || strcmp(r->method, "DELETE") == 0)
    return NULL;
  if (strstr(r->pattern, "/lease"))
    return "{\"worker\":\"sec\",\"wait_ms\":0}";
  return "{}";
}

static int status_of(int port, const route *r, const char *token) {
  char path[256];
  concrete_path(r->pattern, path, sizeof path);
  int st;
  char *raw = NULL;
  const char *body = body_for(r);
  json_t *j = body ? cph_hc_call_raw(port, token, &st, &raw, r->method, path, "%s", body)
                   : cph_hc_call_raw(port, token, &st, &raw, r->method, path, NULL);
  /* the answer never echoes a token */
  for (int i = 0; raw && i < N_TOKENS; i++)
    if (strstr(raw, TOKENS[i].token))
      fail_msg("%s %s echoed a token: %s", r->method, path, raw);
  if ((st == 401 || st == 403) &&
      !json_is_string(json_object_get(json_object_get(j, "error"), "code")))
    fail_msg("%s %s: %d without the error format: %s", r->method, path, st, raw ? raw : "");
  free(raw);
  json_decref(j);
  return st;
}

static void test_every_route_but_health_needs_a_token_with_its_scope(void **state) {
  (void)state;
  route routes[128];
  size_t n = read_route_table(routes, 128);
  print_message("route table: %zu routes\n", n);
  assert_true(n >= 30);
  char *text = auth_policy(":server {:log-level :debug}");
  fixture *f = start(text);
  free(text);
  int port = f->d.port;
  size_t checked = 0, public_routes = 0;
  for (size_t i = 0; i < n; i++) {
    const route *r = &routes[i];
    bool health = strcmp(r->pattern, "/healthz") == 0 || strcmp(r->pattern, "/readyz") == 0;
    if (health) {
      if (r->scopes != 0)
        fail_msg("%s %s should be public", r->method, r->pattern);
      assert_int_equal(status_of(port, r, NULL), 200);
      public_routes++;
      continue;
    }
    /* The web console's files hold no data (its API calls carry a token): public, like the
     * health routes, and answered without a token (/ui/7 is no file: 404, not 401). */
    bool page = strcmp(r->pattern, "/ui") == 0 || strcmp(r->pattern, "/") == 0;
    bool console = page || strcmp(r->pattern, "/ui/{file}") == 0;
    if (console) {
      if (r->scopes != 0 || strcmp(r->method, "GET") != 0)
        fail_msg("%s %s should be a public GET", r->method, r->pattern);
      assert_int_equal(status_of(port, r, NULL), page ? 200 : 404);
      public_routes++;
      continue;
    }
    if (r->scopes == 0)
      fail_msg("%s %s is public: only /healthz, /readyz and the console's files may be",
               r->method, r->pattern);
    int st = status_of(port, r, NULL);
    if (st != 401)
      fail_msg("%s %s without a token: want 401, got %d", r->method, r->pattern, st);
    st = status_of(port, r, "not-a-known-token");
    if (st != 401)
      fail_msg("%s %s with an unknown token: want 401, got %d", r->method, r->pattern, st);
    for (int t = 0; t < N_TOKENS; t++) {
      st = status_of(port, r, TOKENS[t].token);
      bool admitted = (r->scopes & TOKENS[t].scope) != 0;
      if (!admitted && st != 403)
        fail_msg("%s %s with a %s token (route scopes %#x): want 403, got %d", r->method,
                 r->pattern, TOKENS[t].name, r->scopes, st);
      if (admitted && (st == 401 || st == 403))
        fail_msg("%s %s with a %s token (route scopes %#x): refused with %d", r->method,
                 r->pattern, TOKENS[t].name, r->scopes, st);
    }
    checked++;
  }
  assert_int_equal(public_routes, 5); /* health 2, the console 3 */
  print_message("%zu routes refuse 401 without a token and 403 without their scope\n", checked);

  /* nothing of this reached the log */
  char *log = cph_test_daemon_log(&f->d);
  for (int t = 0; t < N_TOKENS; t++)
    if (strstr(log, TOKENS[t].token))
      fail_msg("the %s token is in the log", TOKENS[t].name);
  assert_null(strstr(log, "not-a-known-token"));
  free(log);
  stop(f);
}

/* ---------------------------------------------------------------- secrets in logs */

static json_t *call(int port, const char *token, int want, const char *method, const char *path,
                    const char *body) {
  int st;
  char *raw = NULL;
  json_t *j = body ? cph_hc_call_raw(port, token, &st, &raw, method, path, "%s", body)
                   : cph_hc_call_raw(port, token, &st, &raw, method, path, NULL);
  if (st != want)
    fail_msg("%s %s: want %d, got %d: %s", method, path, want, st, raw ? raw : "");
  free(raw);
  return j;
}

static void test_tokens_never_reach_the_log_after_authenticated_traffic(void **state) {
  (void)state;
  char *text = auth_policy(":server {:log-level :debug}");
  fixture *f = start(text);
  int port = f->d.port;
  const char *admin = TOKENS[2].token, *ingest = TOKENS[0].token, *worker = TOKENS[1].token,
             *reader = TOKENS[3].token;
  json_decref(call(port, admin, 200, "POST", "/v1/sessions",
                   "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}"));
  json_decref(call(port, ingest, 200, "POST", "/v1/events",
                   "{\"events\":[{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"hello\"}]}"));
  json_t *j = call(port, worker, 200, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
  json_t *turn = json_object_get(j, "turn");
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/heartbeat", (long long)cph_hc_int(turn, "id"));
  snprintf(body, sizeof body, "{\"lease\":\"%s\"}", cph_hc_str(turn, "lease"));
  json_decref(call(port, worker, 200, "POST", path, body));
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)cph_hc_int(turn, "id"));
  snprintf(body, sizeof body,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"hi\"},"
           "\"memories\":[{\"text\":\"remember the token never leaks\"}]}",
           cph_hc_str(turn, "lease"));
  json_decref(call(port, worker, 200, "POST", path, body));
  json_decref(j);
  json_decref(call(port, reader, 200, "GET", "/v1/replies?after=0", NULL));
  json_decref(call(port, TOKEN_ALL, 200, "GET", "/v1/sessions/s1", NULL));
  json_decref(call(port, admin, 200, "POST", "/v1/admin/policy/reload", NULL));
  json_decref(call(port, reader, 200, "GET", "/v1/admin/policy", NULL));
  json_decref(call(port, admin, 202, "POST", "/v1/maintenance/jobs", "{\"job\":\"outbox_drain\"}"));
  /* refusals are logged at debug: with the token's name, never the token */
  json_decref(call(port, reader, 403, "POST", "/v1/events", "{\"events\":[]}"));
  json_decref(call(port, "Bearer-looking-secret-1234", 401, "GET", "/v1/lanes", NULL));
  /* a SIGHUP reload logs the policy source: hashes only */
  kill(f->d.pid, SIGHUP);
  assert_true(cph_test_daemon_log_wait(&f->d, "policy reloaded", 5000));
  /* the policy read back over HTTP holds hashes, not tokens */
  j = call(port, admin, 200, "GET", "/v1/admin/policy", NULL);
  char *dump = json_dumps(j, 0);
  for (int t = 0; t < N_TOKENS; t++)
    assert_null(strstr(dump, TOKENS[t].token));
  free(dump);
  json_decref(j);

  /* the daemon logged the traffic (debug level), but no token */
  char *log = cph_test_daemon_log(&f->d);
  assert_non_null(strstr(log, "lacks the scope"));
  assert_non_null(strstr(log, "unauthorized"));
  for (int t = 0; t < N_TOKENS; t++)
    if (strstr(log, TOKENS[t].token))
      fail_msg("the %s token is in the log:\n%s", TOKENS[t].name, log);
  assert_null(strstr(log, TOKEN_ALL));
  assert_null(strstr(log, "Bearer-looking-secret-1234"));
  free(log);
  stop(f);
  free(text);
}

/* ---------------------------------------------------------------- slow clients */

/* The monotonic time (ms) at which the server ended the connection (EOF or reset), waiting
 * at most until deadline_ms; the bytes it sent first go to got (may be NULL). -1 when it was
 * still open at the deadline. The socket's receive timeout paces the loop. */
static int64_t dropped_at(int fd, int64_t deadline_ms, char *got, size_t size) {
  size_t used = 0;
  while (cph_hc_now_ms() < deadline_ms) {
    char buf[512];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return cph_hc_now_ms();
    if (n > 0 && got && used + 1 < size) {
      size_t k = (size_t)n < size - used - 1 ? (size_t)n : size - used - 1;
      memcpy(got + used, buf, k);
      used += k;
      got[used] = '\0';
    }
  }
  return -1;
}

static int send_str(int fd, const char *s) {
  return send(fd, s, strlen(s), MSG_NOSIGNAL) == (ssize_t)strlen(s) ? 0 : -1;
}

static void test_slow_clients_are_dropped_after_the_timeout_and_long_polls_are_not(void **state) {
  (void)state;
  fixture *f = start("{:server {:timeout-seconds 1}}\n");
  int port = f->d.port;
  /* half a request head, then nothing */
  int a = cph_hc_connect(port, 100);
  assert_true(a >= 0);
  assert_int_equal(send_str(a, "GET /v1/lanes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow"), 0);
  int64_t sent_a = cph_hc_now_ms();
  /* a whole head and half the body it announced */
  int b = cph_hc_connect(port, 100);
  assert_true(b >= 0);
  assert_int_equal(send_str(b, "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
                               "{\"events\":[{\"channel\":"),
                   0);
  int64_t sent_b = cph_hc_now_ms();
  /* an idle kept-alive connection after one answered request */
  int c = cph_hc_connect(port, 100);
  assert_true(c >= 0);
  assert_int_equal(send_str(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), 0);
  int64_t sent_c = cph_hc_now_ms();
  /* meanwhile everyone else is served at once */
  int64_t t0 = cph_hc_now_ms();
  int st;
  json_decref(cph_hc_call(port, NULL, &st, "GET", "/v1/lanes", NULL));
  assert_int_equal(st, 200);
  assert_true(cph_hc_now_ms() - t0 < 500);

  char got[1024] = "";
  int64_t deadline = cph_hc_now_ms() + 4000;
  int64_t da = dropped_at(a, deadline, NULL, 0);
  int64_t db = dropped_at(b, deadline, NULL, 0);
  int64_t dc = dropped_at(c, deadline, got, sizeof got);
  if (da < 0 || db < 0 || dc < 0)
    fail_msg("a stalled connection outlived :timeout-seconds 1 by 3 s (dropped: %s %s %s)",
             da < 0 ? "no" : "yes", db < 0 ? "no" : "yes", dc < 0 ? "no" : "yes");
  da -= sent_a;
  db -= sent_b;
  dc -= sent_c;
  print_message("dropped after %lld ms (half a head), %lld ms (half a body), %lld ms (idle)\n",
                (long long)da, (long long)db, (long long)dc);
  /* dropped by the timeout, not at once: roughly a second after the last byte */
  assert_true(da >= 700 && db >= 700 && dc >= 700);
  assert_true(da <= 3000 && db <= 3000 && dc <= 3000);
  assert_non_null(strstr(got, "HTTP/1.1 200")); /* the idle one was answered first */
  close(a);
  close(b);
  close(c);

  /* A lease long-poll waits its wait_ms even when that is longer than the timeout. */
  json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/sessions",
                          "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}"));
  assert_int_equal(st, 200);
  t0 = cph_hc_now_ms();
  json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease",
                          "{\"worker\":\"w\",\"wait_ms\":2500}"));
  int64_t waited = cph_hc_now_ms() - t0;
  if (st != 204 || waited < 2300)
    fail_msg("a 2.5 s lease long-poll with a 1 s timeout: status %d after %lld ms", st,
             (long long)waited);
  t0 = cph_hc_now_ms();
  json_decref(cph_hc_call(port, NULL, &st, "GET", "/v1/replies?after=0&wait_ms=2500", NULL));
  waited = cph_hc_now_ms() - t0;
  if (st != 200 || waited < 2300)
    fail_msg("a 2.5 s replies long-poll with a 1 s timeout: status %d after %lld ms", st,
             (long long)waited);
  stop(f);
}

/* ---------------------------------------------------------------- long-poll cap */

static void test_long_polls_are_capped_per_client_and_given_back(void **state) {
  (void)state;
  fixture *f = start("{:server {:max-long-polls-per-client 3 :max-wait-ms 20000}}\n");
  int port = f->d.port;
  int fds[3];
  fds[0] = cph_test_http_send_only(port, "POST", "/v1/turns/lease", "{\"worker\":\"a\",\"wait_ms\":15000}");
  fds[1] = cph_test_http_send_only(port, "POST", "/v1/turns/lease", "{\"worker\":\"b\",\"wait_ms\":15000}");
  fds[2] = cph_test_http_send_only(port, "GET", "/v1/replies?after=0&wait_ms=15000", NULL);
  for (int i = 0; i < 3; i++)
    assert_true(fds[i] >= 0);
  cph_hc_sleep_ms(300);
  /* a fourth long-poll of either kind is refused at once, with the setting named */
  int st;
  char *raw = NULL;
  int64_t t0 = cph_hc_now_ms();
  json_decref(cph_hc_call_raw(port, NULL, &st, &raw, "POST", "/v1/turns/lease",
                              "{\"worker\":\"c\",\"wait_ms\":15000}"));
  assert_int_equal(st, 429);
  assert_true(cph_hc_now_ms() - t0 < 1000);
  assert_non_null(strstr(raw, ":max-long-polls-per-client"));
  free(raw);
  json_decref(cph_hc_call(port, NULL, &st, "GET", "/v1/replies?after=0&wait_ms=15000", NULL));
  assert_int_equal(st, 429);
  /* ordinary requests are not long-polls: still served */
  json_decref(cph_hc_call(port, NULL, &st, "GET", "/v1/lanes", NULL));
  assert_int_equal(st, 200);
  json_decref(cph_hc_call(port, NULL, &st, "GET", "/v1/replies?after=0", NULL));
  assert_int_equal(st, 200);
  /* one client leaves: exactly one place comes back */
  close(fds[0]);
  cph_hc_sleep_ms(300);
  int extra = cph_test_http_send_only(port, "POST", "/v1/turns/lease", "{\"worker\":\"d\",\"wait_ms\":15000}");
  assert_true(extra >= 0);
  cph_hc_sleep_ms(300);
  json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease", "{\"worker\":\"e\",\"wait_ms\":100}"));
  assert_int_equal(st, 429);
  /* all leave: every place comes back */
  close(fds[1]);
  close(fds[2]);
  close(extra);
  cph_hc_sleep_ms(300);
  for (int i = 0; i < 3; i++) {
    json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease", "{\"worker\":\"f\",\"wait_ms\":0}"));
    assert_int_equal(st, 204);
  }
  stop(f);
}

/* ---------------------------------------------------------------- quiet logs */

/* A hardened deployment logs at :warn; the ready record (what supervisors and these tests
 * wait for) is still written, and nothing else at info is. */
static void test_ready_record_is_written_even_at_log_level_warn(void **state) {
  (void)state;
  fixture *f = start("{:server {:log-level :warn}}\n");
  char *log = cph_test_daemon_log(&f->d);
  assert_non_null(strstr(log, "msg=\"cephalond ready\""));
  assert_null(strstr(log, "maintenance worker(s) started")); /* an info record */
  free(log);
  int st;
  json_decref(cph_hc_call(f->d.port, NULL, &st, "GET", "/healthz", NULL));
  assert_int_equal(st, 200);
  stop(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_every_route_but_health_needs_a_token_with_its_scope, teardown),
      cmocka_unit_test_teardown(test_tokens_never_reach_the_log_after_authenticated_traffic,
                                teardown),
      cmocka_unit_test_teardown(
          test_slow_clients_are_dropped_after_the_timeout_and_long_polls_are_not, teardown),
      cmocka_unit_test_teardown(test_long_polls_are_capped_per_client_and_given_back, teardown),
      cmocka_unit_test_teardown(test_ready_record_is_written_even_at_log_level_warn, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
