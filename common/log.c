#include "log.h"

#include <stdarg.h>
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

void cph_log(cph_log_level level, const char *fmt, ...) {
  if (level < current_level)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char line[2048];
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                   tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  /* One write per line so concurrent writers never interleave mid-line. */
  fprintf(stderr, "%s\n", line);
}
