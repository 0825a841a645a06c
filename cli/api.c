/* cephalonctl's side of the HTTP API (DESIGN §9): one call, its errors, JSON helpers. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/http_client.h"

/* ---------------------------------------------------------------- calls */

void cli_reply_free(cli_reply *r) {
  free(r->body);
  json_decref(r->json);
  memset(r, 0, sizeof *r);
}

void cli_put_clean(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    fputc(c < 0x20 || c == 0x7f ? '?' : c, f);
  }
}

/* The first line of a non-JSON error body, at most 200 bytes, for the message. */
static void put_body_excerpt(FILE *f, const char *body) {
  size_t n = strcspn(body, "\r\n");
  char excerpt[201];
  snprintf(excerpt, sizeof excerpt, "%.*s", (int)(n < 200 ? n : 200), body);
  cli_put_clean(f, excerpt);
}

void cli_print_http_error(const cli_reply *r) {
  const json_t *e = json_is_object(r->json) ? json_object_get(r->json, "error") : NULL;
  const char *code = cli_json_string(e, "code");
  const char *message = cli_json_string(e, "message");
  const char *field = cli_json_string(e, "field");
  fprintf(stderr, "cephalonctl: %d", r->status);
  if (code || message) {
    if (code) {
      fputc(' ', stderr);
      cli_put_clean(stderr, code);
    }
    if (message) {
      fputs(": ", stderr);
      cli_put_clean(stderr, message);
    }
    if (field && field[0]) {
      fputs(" (field: ", stderr);
      cli_put_clean(stderr, field);
      fputc(')', stderr);
    }
  } else {
    if (r->reason[0]) {
      fputc(' ', stderr);
      cli_put_clean(stderr, r->reason);
    }
    if (r->body && r->body[strspn(r->body, " \t\r\n")]) {
      fputs(": ", stderr);
      put_body_excerpt(stderr, r->body + strspn(r->body, " \t\r\n"));
    }
  }
  fputc('\n', stderr);
}

/* Reports a malformed --url without echoing a URL that might hold a password. */
static int bad_url(const char *url, const char *why) {
  if (strchr(url, '@'))
    fprintf(stderr, "cephalonctl: bad --url: %s\n", why);
  else
    fprintf(stderr, "cephalonctl: bad --url '%s': %s\n", url, why);
  return CLI_EXIT_USAGE;
}

/* One exchange with ctx->url (cli_call without following a 421). */
static int call_once(const cli_ctx *ctx, const char *method, const char *path, const json_t *body,
                     int timeout_ms, int flags, cli_reply *out) {
  memset(out, 0, sizeof *out);
  cph_httpc_url url;
  const char *why = NULL;
  if (cph_httpc_url_parse(ctx->url, &url, &why) != 0) {
    cph_httpc_url_free(&url);
    return bad_url(ctx->url, why);
  }
  char *text = NULL;
  if (body && !(text = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY))) {
    cph_httpc_url_free(&url);
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  cph_httpc_request req = {
      .method = method,
      .path = path,
      .token = ctx->token,
      .user_agent = "cephalonctl",
      .body = text,
      .body_len = text ? strlen(text) : 0,
      .timeout_ms = timeout_ms,
      .cancel = ctx->cancel,
      .cancel_arg = ctx->cancel_arg,
  };
  cph_httpc_response resp;
  char err[512];
  int rc = cph_httpc_do(&url, &req, &resp, err, sizeof err);
  free(text);
  cph_httpc_url_free(&url);

  switch (rc) {
  case CPH_HTTPC_OK: break;
  case CPH_HTTPC_ECONNECT:
    fprintf(stderr, "cephalonctl: cannot reach cephalond at %s: %s\n", ctx->url, err);
    return CLI_EXIT_FAIL;
  case CPH_HTTPC_EINVAL: fprintf(stderr, "cephalonctl: %s\n", err); return CLI_EXIT_USAGE;
  case CPH_HTTPC_ECANCELED: return CLI_EXIT_FAIL; /* the caller asked: nothing to report */
  default:
    fprintf(stderr, "cephalonctl: %s %s at %s: %s\n", method, path, ctx->url, err);
    return CLI_EXIT_FAIL;
  }

  out->status = resp.status;
  snprintf(out->reason, sizeof out->reason, "%s", resp.reason);
  out->body = resp.body;
  out->body_len = resp.body_len;
  resp.body = NULL;
  bool success = resp.status >= 200 && resp.status < 300;
  json_error_t jerr;
  if (out->body_len > 0 &&
      !(out->json = json_loadb(out->body, out->body_len, JSON_DECODE_ANY, &jerr)) && success) {
    fprintf(stderr, "cephalonctl: %s %s: the answer (%d) is not JSON: %s\n", method, path,
            out->status, jerr.text);
    return CLI_EXIT_FAIL;
  }
  if (!success && !(flags & CLI_CALL_ANY_STATUS)) {
    cli_print_http_error(out);
    return CLI_EXIT_FAIL;
  }
  return CLI_EXIT_OK;
}

/* The owner's URL a 421 `misdirected` names (DESIGN §14: error.owner.url), or NULL. */
static const char *misdirected_to(const cli_reply *r) {
  if (r->status != 421 || !json_is_object(r->json))
    return NULL;
  const json_t *owner = json_object_get(json_object_get(r->json, "error"), "owner");
  const char *url = cli_json_string(owner, "url");
  return url && url[0] ? url : NULL;
}

/* In a cluster a session's routes answer only on the node that owns its shard; any other
 * answers 421 naming it. The call is sent there once, as cephalon-worker does, so every
 * command works against any node; a second 421 (the shard moved again meanwhile) is reported
 * as it is. */
int cli_call(const cli_ctx *ctx, const char *method, const char *path, const json_t *body,
             int timeout_ms, int flags, cli_reply *out) {
  int rc = call_once(ctx, method, path, body, timeout_ms, flags | CLI_CALL_ANY_STATUS, out);
  const char *owner = rc == CLI_EXIT_OK ? misdirected_to(out) : NULL;
  if (owner && strcmp(owner, ctx->url) != 0) {
    cli_reply first = *out;
    cli_ctx there = *ctx;
    there.url = owner; /* borrowed from first, freed after the call */
    rc = call_once(&there, method, path, body, timeout_ms, flags | CLI_CALL_ANY_STATUS, out);
    cli_reply_free(&first);
  }
  if (rc == CLI_EXIT_OK && (out->status < 200 || out->status >= 300) &&
      !(flags & CLI_CALL_ANY_STATUS)) {
    cli_print_http_error(out);
    return CLI_EXIT_FAIL;
  }
  return rc;
}

int cli_get(const cli_ctx *ctx, const cph_buf *path, cli_reply *reply, bool *printed) {
  *printed = false;
  memset(reply, 0, sizeof *reply);
  if (cph_buf_error(path) != 0) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  int rc = cli_call(ctx, "GET", path->data, NULL, CLI_TIMEOUT_MS, 0, reply);
  if (rc == CLI_EXIT_OK && ctx->json) {
    *printed = true;
    rc = cli_print_reply_json(reply);
  }
  return rc;
}

/* ---------------------------------------------------------------- output */

int cli_finish_output(void) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    perror("cephalonctl: writing the output");
    return CLI_EXIT_FAIL;
  }
  return CLI_EXIT_OK;
}

int cli_print_json(const json_t *v) {
  /* 15 significant digits print 28.1 as 28.1, not 28.100000000000001. */
  char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY |
                              JSON_REAL_PRECISION(15));
  if (!s) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  fputs(s, stdout);
  fputc('\n', stdout);
  free(s);
  return cli_finish_output();
}

int cli_print_reply_json(const cli_reply *r) {
  if (r->json)
    return cli_print_json(r->json);
  if (r->body_len > 0) {
    fwrite(r->body, 1, r->body_len, stdout);
    if (r->body[r->body_len - 1] != '\n')
      fputc('\n', stdout);
  }
  return cli_finish_output();
}

/* ---------------------------------------------------------------- URLs */

/* RFC 3986 unreserved characters, plus ':' and '@' which a path segment and a query may
 * carry as they are — so every valid session id (DESIGN §2) goes through unchanged. */
static bool url_plain(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_' || c == '~' || c == ':' || c == '@';
}

static void put_encoded(cph_buf *b, const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (url_plain(c)) {
      cph_buf_putc(b, (char)c);
    } else {
      char esc[3] = {'%', hex[c >> 4], hex[c & 15]};
      cph_buf_append(b, esc, 3);
    }
  }
}

void cli_path_segment(cph_buf *b, const char *s) { put_encoded(b, s); }

void cli_query_param(cph_buf *b, const char *name, const char *value) {
  cph_buf_putc(b, b->data && strchr(b->data, '?') ? '&' : '?');
  cph_buf_puts(b, name);
  cph_buf_putc(b, '=');
  put_encoded(b, value);
}

void cli_on_stop_signals(void (*handler)(int sig)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

void cli_query_u64(cph_buf *b, const char *name, uint64_t value) {
  char n[24];
  snprintf(n, sizeof n, "%llu", (unsigned long long)value);
  cli_query_param(b, name, n);
}

/* ---------------------------------------------------------------- JSON values */

const char *cli_json_string(const json_t *obj, const char *key) {
  if (!json_is_object(obj))
    return NULL;
  return json_string_value(json_object_get(obj, key));
}

bool cli_json_number(const json_t *obj, const char *key, double *out) {
  const json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
  if (!json_is_number(v))
    return false;
  *out = json_number_value(v);
  return true;
}

static void format_real(cph_buf *b, double d) {
  if (!isfinite(d) || fabs(d) >= 1e15) {
    cph_buf_printf(b, "%g", d);
    return;
  }
  char s[64];
  int n = snprintf(s, sizeof s, "%.3f", d);
  while (n > 0 && s[n - 1] == '0' && s[n - 2] != '.') /* keep one decimal: 28.0 */
    s[--n] = '\0';
  cph_buf_puts(b, s);
}

static bool is_scalar(const json_t *v) {
  return json_is_string(v) || json_is_number(v) || json_is_boolean(v) || json_is_null(v);
}

void cli_format_value(cph_buf *b, const json_t *v) {
  if (!v || json_is_null(v)) {
    cph_buf_putc(b, '-');
  } else if (json_is_string(v)) {
    cph_buf_append(b, json_string_value(v), json_string_length(v));
  } else if (json_is_integer(v)) {
    cph_buf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
  } else if (json_is_real(v)) {
    format_real(b, json_real_value(v));
  } else if (json_is_boolean(v)) {
    cph_buf_puts(b, json_is_true(v) ? "true" : "false");
  } else {
    bool flat = json_is_array(v);
    size_t i;
    const json_t *item;
    if (flat)
      json_array_foreach(v, i, item) flat = flat && is_scalar(item);
    if (flat && json_array_size(v) == 0) {
      cph_buf_putc(b, '-');
    } else if (flat) {
      json_array_foreach(v, i, item) {
        if (i > 0)
          cph_buf_puts(b, ", ");
        cli_format_value(b, item);
      }
    } else {
      char *s = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
      if (s)
        cph_buf_puts(b, s);
      else
        b->failed = true;
      free(s);
    }
  }
}
