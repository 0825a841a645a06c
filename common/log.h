/* One-line logs to stderr: `2026-11-21T08:44:13.123Z info cephalond ready listen=...`.
 * Never log secrets (tokens, API keys): log names and hashes instead. */
#ifndef CEPHALON_COMMON_LOG_H
#define CEPHALON_COMMON_LOG_H

typedef enum cph_log_level {
  CPH_LOG_DEBUG = 0,
  CPH_LOG_INFO = 1,
  CPH_LOG_WARN = 2,
  CPH_LOG_ERROR = 3
} cph_log_level;

void cph_log_set_level(cph_log_level level);
int cph_log_parse_level(const char *name, cph_log_level *out); /* CPH_OK or CPH_EINVAL */
void cph_log(cph_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define cph_debug(...) cph_log(CPH_LOG_DEBUG, __VA_ARGS__)
#define cph_info(...) cph_log(CPH_LOG_INFO, __VA_ARGS__)
#define cph_warn(...) cph_log(CPH_LOG_WARN, __VA_ARGS__)
#define cph_error(...) cph_log(CPH_LOG_ERROR, __VA_ARGS__)

#endif
