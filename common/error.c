#include "cephalon/error.h"

#include <stdio.h>

const char *cph_strerror(int code) {
  switch (code) {
  case CPH_OK:
    return "success";
#define CPH__ERRNO_STR(name, value, msg) \
  case value:                            \
    return msg;
    CPH_ERRNO_MAP(CPH__ERRNO_STR)
#undef CPH__ERRNO_STR
  default:
    return "unknown error";
  }
}

const char *cph_errname(int code) {
  switch (code) {
  case CPH_OK:
    return "OK";
#define CPH__ERRNO_NAME(name, value, msg) \
  case value:                             \
    return #name;
    CPH_ERRNO_MAP(CPH__ERRNO_NAME)
#undef CPH__ERRNO_NAME
  default:
    return "UNKNOWN";
  }
}

int cph_err_vset(cph_err *err, int code, const char *fmt, va_list ap) {
  if (err) {
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  }
  return code;
}

int cph_err_set(cph_err *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cph_err_vset(err, code, fmt, ap);
  va_end(ap);
  return code;
}

void cph_err_clear(cph_err *err) {
  if (err) {
    err->code = CPH_OK;
    err->msg[0] = '\0';
  }
}
