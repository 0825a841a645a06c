/* Structured logs: one logfmt record per line on stderr,
 *
 *   ts=2026-11-21T08:44:13.123Z level=info msg="cephalond ready" listen=127.0.0.1:7070 auth=off
 *
 * ts, level and msg always come first; msg is quoted with \" \\ \n escaped; cph_log_kv adds
 * key=value fields after it. The level is set by the policy (:server :log-level) or
 * --log-level. Never log secrets (tokens, API keys): log names and hashes instead. */
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
/* A record whose msg is the formatted text. */
void cph_log(cph_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A record with msg and fields: kv_fmt formats "key=value key=value"; a value that may hold
 * spaces or quotes must go through cph_log_quote first. */
void cph_log_kv(cph_log_level level, const char *msg, const char *kv_fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* s as a logfmt value: bare when it is safe, else quoted and escaped, into buf. */
const char *cph_log_quote(const char *s, char *buf, unsigned size);

#define cph_debug(...) cph_log(CPH_LOG_DEBUG, __VA_ARGS__)
#define cph_info(...) cph_log(CPH_LOG_INFO, __VA_ARGS__)
#define cph_warn(...) cph_log(CPH_LOG_WARN, __VA_ARGS__)
#define cph_error(...) cph_log(CPH_LOG_ERROR, __VA_ARGS__)

#endif
