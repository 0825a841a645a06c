#define _GNU_SOURCE
/* cephalond as a user runs it: real process, real loopback port, temp data dir. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

static char *copy_example_policy(void) {
  char *src = cph_test_source_path("cephalon.policy.edn.example");
  char *text = cph_test_read_file(src, NULL);
  assert_non_null(text);
  char *path = cph_test_write_tmpfile(".edn", text);
  free(text);
  free(src);
  return path;
}

static void test_daemon_serves_health_and_json_errors(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  assert_true(d.port > 0);

  cph_test_response r = cph_test_http(d.port, "GET", "/healthz", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "{\"status\":\"ok\"}\n");
  cph_test_response_free(&r);

  r = cph_test_http(d.port, "GET", "/readyz", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"policy_generation\":1"));
  cph_test_response_free(&r);

  r = cph_test_http(d.port, "GET", "/v1/nothing-here", NULL, NULL);
  assert_int_equal(r.status, 404);
  assert_non_null(strstr(r.headers, "Content-Type: application/json"));
  assert_non_null(strstr(r.body, "\"error\":{\"code\":\"not_found\""));
  cph_test_response_free(&r);

  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

static void test_sighup_reloads_and_rejects_a_broken_policy(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);

  kill(d.pid, SIGHUP);
  assert_true(cph_test_daemon_log_wait(&d, "policy reloaded from", 5000));
  cph_test_response r = cph_test_http(d.port, "GET", "/readyz", NULL, NULL);
  assert_non_null(strstr(r.body, "\"policy_generation\":2"));
  cph_test_response_free(&r);

  FILE *f = fopen(policy, "w");
  fputs("{:scheduler {:concurrency \"four\"}}\n", f);
  fclose(f);
  kill(d.pid, SIGHUP);
  assert_true(cph_test_daemon_log_wait(&d, "policy reload rejected", 5000));
  char *log = cph_test_daemon_log(&d);
  assert_non_null(strstr(log, ":1:27: :scheduler :concurrency: expected"));
  free(log);
  r = cph_test_http(d.port, "GET", "/readyz", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"policy_generation\":2")); /* old policy stays */
  cph_test_response_free(&r);

  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

static void test_refuses_non_loopback_listen_without_auth(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  char *dir = cph_test_tmpdir("noauth");
  char *exe;
  assert_true(asprintf(&exe, "%s/cephalond", getenv("CPH_BIN_DIR")) > 0);
  const char *argv[] = {exe, "--policy", policy, "--data", dir, "--listen", "0.0.0.0:0", NULL};
  char *out, *err;
  assert_int_equal(cph_test_run(argv, &out, &err), 1);
  assert_non_null(strstr(err, "refusing to listen on 0.0.0.0:0 without :auth"));
  free(out);
  free(err);
  free(exe);
  cph_test_rmtree(dir);
  free(dir);
  unlink(policy);
  free(policy);
}

static void test_broken_policy_stops_startup_with_file_line_col(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(".edn", "{:leases {:ttl-seconds 0}}\n");
  char *dir = cph_test_tmpdir("badpol");
  char *exe;
  assert_true(asprintf(&exe, "%s/cephalond", getenv("CPH_BIN_DIR")) > 0);
  const char *argv[] = {exe, "--policy", policy, "--data", dir, "--listen", "127.0.0.1:0", NULL};
  char *out, *err;
  assert_int_equal(cph_test_run(argv, &out, &err), 1);
  char expected[512];
  snprintf(expected, sizeof expected, "%s:1:24: :leases :ttl-seconds:", policy);
  if (!strstr(err, expected))
    fail_msg("stderr '%s' lacks '%s'", err, expected);
  free(out);
  free(err);
  free(exe);
  cph_test_rmtree(dir);
  free(dir);
  unlink(policy);
  free(policy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_daemon_serves_health_and_json_errors),
      cmocka_unit_test(test_sighup_reloads_and_rejects_a_broken_policy),
      cmocka_unit_test(test_refuses_non_loopback_listen_without_auth),
      cmocka_unit_test(test_broken_policy_stops_startup_with_file_line_col),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
