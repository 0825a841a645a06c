/* `cephalonctl policy check` run as a real process: exit codes, stdout and stderr.
 * Expected messages are written by hand (columns counted in the comments). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct run_result {
  int status; /* exit code; -1 if the process did not exit normally */
  char *out;  /* everything written to stdout */
  char *err;  /* everything written to stderr */
} run_result;

static char *path_join(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  assert_non_null(p);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

static char *env_path(const char *var, const char *name) {
  const char *dir = getenv(var);
  if (!dir)
    fail_msg("%s is not set", var);
  return path_join(dir, name);
}

static char *read_fd(int fd) {
  assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
  size_t len = 0, cap = 4096;
  char *s = malloc(cap);
  assert_non_null(s);
  for (;;) {
    if (len + 1 >= cap) {
      cap *= 2;
      s = realloc(s, cap);
      assert_non_null(s);
    }
    ssize_t n = read(fd, s + len, cap - len - 1);
    if (n < 0 && errno == EINTR)
      continue;
    assert_true(n >= 0);
    if (n == 0)
      break;
    len += (size_t)n;
  }
  s[len] = '\0';
  return s;
}

/* Runs $CPH_BIN_DIR/cephalonctl with args (NULL-terminated), capturing stdout and stderr in
 * temp files (no pipes, so a large output cannot deadlock). */
static void run_ctl(run_result *r, const char *const *args) {
  char *bin = env_path("CPH_BIN_DIR", "cephalonctl");
  const char *argv[32];
  size_t n = 0;
  argv[n++] = bin;
  for (; args[n - 1] && n < 31; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;

  char out_path[] = "/tmp/cph-cli-out-XXXXXX", err_path[] = "/tmp/cph-cli-err-XXXXXX";
  int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
  assert_true(out_fd >= 0 && err_fd >= 0);
  unlink(out_path);
  unlink(err_path);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
      _exit(126);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    assert_int_equal(errno, EINTR);
  r->status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r->out = read_fd(out_fd);
  r->err = read_fd(err_fd);
  close(out_fd);
  close(err_fd);
  free(bin);
}

static void run_result_free(run_result *r) {
  free(r->out);
  free(r->err);
}

static char *write_temp_policy(const char *text) {
  char tmpl[] = "/tmp/cph-policy-XXXXXX";
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  size_t len = strlen(text);
  assert_int_equal(write(fd, text, len), (ssize_t)len);
  close(fd);
  char *path = strdup(tmpl);
  assert_non_null(path);
  return path;
}

static bool starts_with(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void test_check_example_prints_the_effective_policy(void **state) {
  (void)state;
  char *example = env_path("CPH_SOURCE_DIR", "cephalon.policy.edn.example");
  run_result r;
  run_ctl(&r, (const char *const[]){"policy", "check", example, NULL});
  if (r.status != 0)
    fail_msg("exit %d, stderr: %s", r.status, r.err);
  assert_true(r.out[0] == '{');
  assert_non_null(strstr(r.out, ":concurrency 4"));
  assert_non_null(strstr(r.out, "\"367156652140658699\" {:max-events-per-minute 600"));
  assert_string_equal(r.err, "");

  /* The printed policy is itself a valid policy that prints the same. */
  char *again = write_temp_policy(r.out);
  run_result r2;
  run_ctl(&r2, (const char *const[]){"policy", "check", again, NULL});
  assert_int_equal(r2.status, 0);
  assert_string_equal(r2.out, r.out);
  unlink(again);
  free(again);
  run_result_free(&r2);

  /* Global options go before the command and do not disturb it. */
  run_result r3;
  run_ctl(&r3, (const char *const[]){"--url", "http://127.0.0.1:1", "--token=t", "--json",
                                     "policy", "check", example, NULL});
  assert_int_equal(r3.status, 0);
  assert_string_equal(r3.out, r.out);
  run_result_free(&r3);
  run_result_free(&r);
  free(example);
}

static void test_check_broken_file_names_file_line_column_and_key(void **state) {
  (void)state;
  /* line 2: 13 spaces, :lanes 14, { 21, :interactive 22, { 35, :turns 36, "sixty" at 43 */
  char *path = write_temp_policy("{:scheduler {:concurrency 4\n"
                                 "             :lanes {:interactive {:turns \"sixty\"}}}}\n");
  run_result r;
  run_ctl(&r, (const char *const[]){"policy", "check", path, NULL});
  assert_int_equal(r.status, 1);
  assert_string_equal(r.out, "");
  char want[512];
  snprintf(want, sizeof want,
           "%s:2:43: :scheduler :lanes :interactive :turns: expected a positive integer, got "
           "\"sixty\"\n",
           path);
  assert_string_equal(r.err, want);
  run_result_free(&r);
  unlink(path);
  free(path);

  /* An unknown key, with the suggestion. { 1, :scheduler 2-11, { 13, :concurency at 14 */
  path = write_temp_policy("{:scheduler {:concurency 8}}\n");
  run_ctl(&r, (const char *const[]){"policy", "check", path, NULL});
  assert_int_equal(r.status, 1);
  snprintf(want, sizeof want,
           "%s:1:14: :scheduler :concurency: unknown key, did you mean :concurrency?\n", path);
  assert_string_equal(r.err, want);
  run_result_free(&r);
  unlink(path);
  free(path);

  /* A syntax error. { 1, :server 2-8, { 10, :listen 11-17, unterminated string at 19 */
  path = write_temp_policy("{:server {:listen \"127.0.0.1:7070}}\n");
  run_ctl(&r, (const char *const[]){"policy", "check", path, NULL});
  assert_int_equal(r.status, 1);
  snprintf(want, sizeof want, "%s:1:19: unterminated string\n", path);
  assert_string_equal(r.err, want);
  run_result_free(&r);
  unlink(path);
  free(path);
}

static void test_check_missing_file_fails(void **state) {
  (void)state;
  run_result r;
  run_ctl(&r, (const char *const[]){"policy", "check", "/nonexistent-cephalon/p.edn", NULL});
  assert_int_equal(r.status, 1);
  assert_string_equal(r.out, "");
  assert_string_equal(r.err, "/nonexistent-cephalon/p.edn: No such file or directory\n");
  run_result_free(&r);
}

static void test_bad_usage_exits_2_with_usage_on_stderr(void **state) {
  (void)state;
  const char *const *const cases[] = {
      (const char *const[]){NULL},
      (const char *const[]){"bogus", NULL},
      (const char *const[]){"policy", NULL},
      (const char *const[]){"policy", "check", NULL},
      (const char *const[]){"policy", "lint", "x.edn", NULL},
      (const char *const[]){"policy", "check", "a.edn", "b.edn", NULL},
      (const char *const[]){"--url", NULL},
      (const char *const[]){"--frobnicate", "policy", "check", "x.edn", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_result r;
    run_ctl(&r, cases[i]);
    if (r.status != 2)
      fail_msg("case %zu: exit %d, want 2", i, r.status);
    assert_string_equal(r.out, "");
    if (!strstr(r.err, "usage: cephalonctl"))
      fail_msg("case %zu: no usage on stderr: %s", i, r.err);
    run_result_free(&r);
  }
}

static void test_help_prints_usage_and_exits_0(void **state) {
  (void)state;
  const char *const *const cases[] = {
      (const char *const[]){"--help", NULL},
      (const char *const[]){"-h", NULL},
      (const char *const[]){"help", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_result r;
    run_ctl(&r, cases[i]);
    assert_int_equal(r.status, 0);
    assert_true(starts_with(r.out, "usage: cephalonctl [--url URL] [--token TOKEN] [--json] "
                                   "COMMAND ..."));
    assert_non_null(strstr(r.out, "policy check FILE"));
    assert_string_equal(r.err, "");
    run_result_free(&r);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_check_example_prints_the_effective_policy),
      cmocka_unit_test(test_check_broken_file_names_file_line_column_and_key),
      cmocka_unit_test(test_check_missing_file_fails),
      cmocka_unit_test(test_bad_usage_exits_2_with_usage_on_stderr),
      cmocka_unit_test(test_help_prints_usage_and_exits_0),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
