/* One JSON request to an OpenAI-compatible endpoint (contract in openai_http.h). */
#include "openai_http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_client.h"

int openai_bad_answer(cph_err *err, const char *what, const char *url, const char *fmt, ...) {
  char detail[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return cph_err_set(err, CPH_EPARSE, "%s %s: bad answer: %s", what, url, detail);
}

int openai_post(const char *what, const char *url, const char *bearer, int timeout_ms,
                const json_t *req, json_t **answer, cph_err *err) {
  *answer = NULL;
  char *body = json_dumps(req, JSON_COMPACT);
  if (!body)
    return cph_err_set(err, CPH_ENOMEM, "%s %s: out of memory", what, url);
  cph_httpc_response resp = {0};
  int rc = cph_httpc_post_json(url, "", body, strlen(body), bearer, timeout_ms, &resp, err);
  if (rc) {
    cph_err tmp = *err;
    rc = cph_err_set(err, rc, "%s: %s", what, tmp.msg);
  } else if ((rc = cph_httpc_check_status(&resp, what, url, err)) == CPH_OK) {
    json_error_t jerr;
    if (!(*answer = json_loadb(resp.body, resp.body_len, 0, &jerr)))
      rc = openai_bad_answer(err, what, url, "not JSON: %s (line %d, column %d)", jerr.text,
                             jerr.line, jerr.column);
  }
  cph_httpc_response_free(&resp);
  free(body);
  return rc;
}
