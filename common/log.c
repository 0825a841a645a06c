#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cephalon/error.h"

static cph_log_level current_level = CPH_LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

void cph_log_set_level(cph_log_level level) { current_level = level; }

int cph_log_parse_level(const char *name, cph_log_level *out) {
  for (int i = 0; i <= CPH_LOG_ERROR; i++)
    if (strcmp(name, level_names[i]) == 0) {
      *out = (cph_log_level)i;
      return CPH_OK;
    }
  return CPH_EINVAL;
}

/* Appends s quoted, escaping what would break the record; stops at the end of out. */
static size_t put_quoted(char *out, size_t size, const char *s) {
  size_t n = 0;
  if (n + 1 < size)
    out[n++] = '"';
  for (; *s && n + 3 < size; s++) {
    char c = *s;
    if (c == '"' || c == '\\') {
      out[n++] = '\\';
      out[n++] = c;
    } else if (c == '\n' || c == '\r') {
      out[n++] = '\\';
      out[n++] = c == '\n' ? 'n' : 'r';
    } else {
      out[n++] = (unsigned char)c < 0x20 ? ' ' : c;
    }
  }
  if (n + 1 < size)
    out[n++] = '"';
  out[n < size ? n : size - 1] = '\0';
  return n;
}

const char *cph_log_quote(const char *s, char *buf, unsigned size) {
  bool bare = *s != '\0';
  for (const char *p = s; *p && bare; p++)
    bare = (unsigned char)*p > 0x20 && *p != '"' && *p != '=' && *p != '\\';
  if (bare)
    snprintf(buf, size, "%s", s);
  else
    put_quoted(buf, size, s);
  return buf;
}

static void emit(cph_log_level level, const char *msg, const char *fields) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char line[4096];
  int n = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s msg=",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                   tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
  size_t len = (size_t)n + put_quoted(line + n, sizeof line - (size_t)n - 1, msg);
  if (fields && *fields && len + 2 < sizeof line)
    len += (size_t)snprintf(line + len, sizeof line - len, " %s", fields);
  /* One write per record so concurrent writers never interleave mid-line. */
  fprintf(stderr, "%.*s\n", (int)(len < sizeof line ? len : sizeof line - 1), line);
}

void cph_log(cph_log_level level, const char *fmt, ...) {
  if (level < current_level)
    return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  emit(level, msg, NULL);
}

void cph_log_kv(cph_log_level level, const char *msg, const char *kv_fmt, ...) {
  if (level < current_level)
    return;
  char fields[2048];
  va_list ap;
  va_start(ap, kv_fmt);
  vsnprintf(fields, sizeof fields, kv_fmt, ap);
  va_end(ap);
  emit(level, msg, fields);
}
