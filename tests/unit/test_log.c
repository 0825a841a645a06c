/* Structured logs: one logfmt record per line, fields in order, msg escaped, level filter. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "tests/support/testutil.h"

/* Runs fn with stderr going to a temp file; returns what was written. */
static char *capture(void (*fn)(void)) {
  char *path = cph_test_write_tmpfile(".log", "");
  fflush(stderr);
  int saved = dup(2);
  int fd = open(path, O_WRONLY | O_TRUNC);
  dup2(fd, 2);
  close(fd);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  char *text = cph_test_read_file(path, NULL);
  unlink(path);
  free(path);
  return text;
}

static void write_records(void) {
  cph_log_set_level(CPH_LOG_INFO);
  cph_debug("not shown at info");
  cph_info("plain message");
  cph_warn("a \"quoted\" word and a\nnewline");
  char q[64];
  cph_log_kv(CPH_LOG_ERROR, "turn parked", "turn=%d session=%s reason=%s", 7, "s1",
             cph_log_quote("model crashed twice", q, sizeof q));
}

static void test_records_are_logfmt_one_per_line(void **state) {
  (void)state;
  char *text = capture(write_records);
  char *lines[8];
  int n = 0;
  for (char *save, *l = strtok_r(text, "\n", &save); l && n < 8; l = strtok_r(NULL, "\n", &save))
    lines[n++] = l;
  assert_int_equal(n, 3); /* debug filtered out; the newline stayed inside its record */
  regex_t re;
  assert_int_equal(regcomp(&re, "^ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z level=[a-z]+ msg=\"",
                           REG_EXTENDED | REG_NOSUB), 0);
  for (int i = 0; i < n; i++)
    assert_int_equal(regexec(&re, lines[i], 0, NULL, 0), 0);
  regfree(&re);
  assert_non_null(strstr(lines[0], "level=info msg=\"plain message\""));
  assert_non_null(strstr(lines[1], "level=warn msg=\"a \\\"quoted\\\" word and a\\nnewline\""));
  assert_non_null(strstr(lines[2], "level=error msg=\"turn parked\" turn=7 session=s1 "
                                   "reason=\"model crashed twice\""));
  free(text);
}

static void test_level_names_parse(void **state) {
  (void)state;
  cph_log_level l;
  assert_int_equal(cph_log_parse_level("warn", &l), 0);
  assert_int_equal(l, CPH_LOG_WARN);
  assert_true(cph_log_parse_level("loud", &l) != 0);
  char buf[32];
  assert_string_equal(cph_log_quote("bare-value", buf, sizeof buf), "bare-value");
  assert_string_equal(cph_log_quote("a=b", buf, sizeof buf), "\"a=b\"");
  assert_string_equal(cph_log_quote("", buf, sizeof buf), "\"\"");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_records_are_logfmt_one_per_line),
      cmocka_unit_test(test_level_names_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
