/* Project-wide error codes.
 *
 * Contract: every fallible function returns int — 0 (CPH_OK) on success or one of the
 * negative codes below. cph_strerror() gives the one-line meaning of a code. Where the
 * caller needs to know *what* and *where* (which file, key, database), the function also
 * takes a cph_err* and fills its message; the return value is always err->code. */
#ifndef CEPHALON_ERROR_H
#define CEPHALON_ERROR_H

#include <stdarg.h>
#include <stddef.h>

/* X(name, value, message) — values are stable; never renumber. */
#define CPH_ERRNO_MAP(X)                                               \
  X(NOMEM, -1, "out of memory")                                        \
  X(INVAL, -2, "invalid argument")                                     \
  X(NOTFOUND, -3, "not found")                                         \
  X(EXISTS, -4, "already exists")                                      \
  X(FULL, -5, "storage full")                                          \
  X(CORRUPT, -6, "corrupt record")                                     \
  X(SCHEMA, -7, "storage schema version mismatch")                     \
  X(IO, -8, "I/O error")                                               \
  X(STORE, -9, "storage error")                                        \
  X(PARSE, -10, "parse error")                                         \
  X(POLICY, -11, "invalid policy")                                     \
  X(LIMIT, -12, "limit exceeded")                                      \
  X(BUSY, -13, "busy")                                                 \
  X(CONFLICT, -14, "conflict")                                         \
  X(AUTH, -15, "unauthorized")                                         \
  X(FORBIDDEN, -16, "forbidden")                                       \
  X(TIMEDOUT, -17, "timed out")                                        \
  X(STATE, -18, "invalid state")                                      \
  X(SUPERSEDED, -19, "superseded: the turn was revoked for newer input")

enum {
  CPH_OK = 0,
#define CPH__ERRNO_ENUM(name, value, msg) CPH_E##name = (value),
  CPH_ERRNO_MAP(CPH__ERRNO_ENUM)
#undef CPH__ERRNO_ENUM
};

/* The message for a code; never NULL ("unknown error" for a code not in the list). */
const char *cph_strerror(int code);

/* The symbolic name of a code ("FULL", "CORRUPT", ...); "OK" for 0. */
const char *cph_errname(int code);

/* Detail that travels with a code: what failed and where. */
typedef struct cph_err {
  int code;
  char msg[512];
} cph_err;

/* Sets err (if non-NULL) and returns code, so callers can write
 * `return cph_err_set(err, CPH_EINVAL, "bad %s", what);`. */
int cph_err_set(cph_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cph_err_vset(cph_err *err, int code, const char *fmt, va_list ap);
void cph_err_clear(cph_err *err);

#endif
