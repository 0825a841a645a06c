/* The web console in a real headless browser (issue #18 item 2): the real cephalond with
 * :auth (a read-only token and an admin token), live sessions and turns — two kept turns of
 * one session between which a node with a TTL left and another entered, and a parked turn —
 * then tests/ui/console.test.mjs drives Debian's Chromium through the console: the pages show
 * the sessions and turns, a session made meanwhile appears without reloading, requeue is
 * refused with the read token and works with the admin token, and the diff view shows the
 * node that left ("TTL expired") and the one that entered. Here, through the API: the turn
 * the console requeued is no longer parked and its input is leased again.
 *
 * Chromium missing (or Node, or playwright-core) fails the test with a message saying what to
 * install: it is never skipped. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define READ_TOKEN "viewer-token-for-the-console-test"
#define ADMIN_TOKEN "admin-token-for-the-console-test"

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  char *rh = cph_test_sha256_hex(READ_TOKEN), *ah = cph_test_sha256_hex(ADMIN_TOKEN);
  char policy[1024];
  snprintf(policy, sizeof policy,
           "{:auth {:tokens [{:name \"viewer\" :sha256 \"%s\" :scopes #{:read}}\n"
           "                 {:name \"admin\" :sha256 \"%s\" :scopes #{:admin :read :ingest :worker}}]}\n"
           " :sessions {:janitor? false}\n"
           " :leases {:max-attempts 1}}\n",
           rh, ah);
  free(rh);
  free(ah);
  f->policy = cph_test_write_tmpfile(".edn", policy);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    return -1;
  *state = f;
  return 0;
}

/* The daemon must exit 0 on SIGTERM: under CPH_DAEMON_WRAPPER=valgrind a memory error or a
 * leak makes it exit 99 and fails the test. */
static int teardown(void **state) {
  fixture *f = *state;
  int rc = cph_test_daemon_stop(&f->d);
  if (rc != 0)
    print_error("cephalond exited with status %d\n", rc);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return rc == 0 ? 0 : -1;
}

static json_t *ok(fixture *f, const char *method, const char *path, const char *body) {
  cph_test_response r = cph_test_api(f->d.port, method, path, ADMIN_TOKEN, body);
  json_t *j = cph_test_json(&r);
  if (r.status != 200)
    fail_msg("%s %s: %d %s", method, path, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  return j;
}

static void post(fixture *f, const char *channel, const char *body) {
  char json[256];
  snprintf(json, sizeof json,
           "{\"events\":[{\"channel\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", channel, body);
  json_decref(ok(f, "POST", "/v1/events", json));
}

/* Leases the next turn, which must be session's; returns it (the caller frees). */
static json_t *lease(fixture *f, const char *session) {
  json_t *l = ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
  json_t *t = json_incref(json_object_get(l, "turn"));
  json_decref(l);
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "session")), session);
  return t;
}

static json_int_t complete(fixture *f, json_t *t, const char *reply) {
  json_int_t id = json_integer_value(json_object_get(t, "id"));
  char path[64], json[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)id);
  snprintf(json, sizeof json,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"%s\"}}",
           json_string_value(json_object_get(t, "lease")), reply);
  json_decref(ok(f, "POST", path, json));
  json_decref(t);
  return id;
}

static void test_console_in_a_headless_browser(void **state) {
  fixture *f = *state;
  const char *chromium = getenv("CPH_UI_CHROMIUM") ? getenv("CPH_UI_CHROMIUM") : "/usr/bin/chromium";
  if (access(chromium, X_OK) != 0)
    fail_msg("no Chromium at %s: the console test needs Debian's chromium "
             "(scripts/install-deps.sh installs it; or set CPH_UI_CHROMIUM)",
             chromium);
  const char *modules = getenv("CPH_UI_MODULES");
  if (!modules)
    fail_msg("CPH_UI_MODULES is not set: run this test through ctest (its ui_install fixture "
             "installs playwright-core)");

  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"alice\",\"class\":\"interactive\",\"subscribe\":[\"alice-chan\"]}"));
  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"bob\",\"class\":\"interactive\",\"subscribe\":[\"bob-chan\"]}"));
  json_decref(ok(f, "POST", "/v1/sessions", "{\"id\":\"zed-1\",\"class\":\"operational\"}"));
  json_decref(ok(f, "POST", "/v1/sessions", "{\"id\":\"zed-2\",\"class\":\"operational\"}"));

  /* alice: a reminder that lives one episode, a turn, a note, another turn */
  json_decref(ok(f, "POST", "/v1/sessions/alice/context",
                 "{\"at\":\"d0, 1, 0\",\"content\":\"remind: standup\",\"ttl\":1}"));
  post(f, "alice-chan", "hello");
  json_int_t from = complete(f, lease(f, "alice"), "re: hello");
  json_decref(ok(f, "POST", "/v1/sessions/alice/context",
                 "{\"at\":\"d0, 2, 0\",\"content\":\"new note\"}"));
  post(f, "alice-chan", "again");
  json_int_t to = complete(f, lease(f, "alice"), "re: again");

  /* bob: a turn that fails once, parked (:max-attempts 1) */
  post(f, "bob-chan", "please park me");
  json_t *t = lease(f, "bob");
  json_int_t parked = json_integer_value(json_object_get(t, "id"));
  char path[64], json[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/fail", (long long)parked);
  snprintf(json, sizeof json, "{\"lease\":\"%s\",\"error\":\"model unreachable\"}",
           json_string_value(json_object_get(t, "lease")));
  json_decref(ok(f, "POST", path, json));
  json_decref(t);
  json_t *p = ok(f, "GET", "/v1/turns?state=parked", NULL);
  assert_int_equal(json_array_size(json_object_get(p, "turns")), 1);
  json_decref(p);

  char url[64], sfrom[24], sto[24], spark[24];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", f->d.port);
  snprintf(sfrom, sizeof sfrom, "%lld", (long long)from);
  snprintf(sto, sizeof sto, "%lld", (long long)to);
  snprintf(spark, sizeof spark, "%lld", (long long)parked);
  setenv("CPH_UI_URL", url, 1);
  setenv("CPH_UI_CHROMIUM", chromium, 1);
  setenv("CPH_UI_READ_TOKEN", READ_TOKEN, 1);
  setenv("CPH_UI_ADMIN_TOKEN", ADMIN_TOKEN, 1);
  setenv("CPH_UI_SESSION", "alice", 1);
  setenv("CPH_UI_FROM", sfrom, 1);
  setenv("CPH_UI_TO", sto, 1);
  setenv("CPH_UI_PARKED", spark, 1);
  char *script = cph_test_source_path("tests/ui/console.test.mjs");
  const char *argv[] = {"/usr/bin/env", "node", script, NULL};
  char *out = NULL, *err = NULL;
  int rc = cph_test_run(argv, &out, &err);
  if (rc != 0)
    fail_msg("the browser test failed (exit %d; node and Chromium are needed):\n%s%s", rc,
             out ? out : "", err ? err : "");
  assert_non_null(strstr(out, "every check passed"));
  free(out);
  free(err);
  free(script);

  /* the console's requeue requeued: nothing parked, and bob's input is leased again */
  p = ok(f, "GET", "/v1/turns?state=parked", NULL);
  assert_int_equal(json_array_size(json_object_get(p, "turns")), 0);
  json_decref(p);
  t = lease(f, "bob");
  assert_non_null(strstr(json_string_value(json_object_get(t, "input")), "please park me"));
  json_decref(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_console_in_a_headless_browser, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
