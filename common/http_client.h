/* A small blocking HTTP client over libcurl, shared by cephalonctl (cli/), the network
 * providers of core/ (OpenAI-compatible embeddings and chat, the HTTP vector index) and
 * cephalon-worker.
 *
 * http:// and https://. For https the peer is verified against the system CA bundle, or against
 * one CA file: the request's ca_file, else the process default (cph_httpc_set_ca_file, which
 * cephalond sets from :providers :ca-file).
 *
 * Keep-alive: finished transfers return their libcurl handle to a small process-wide pool, so
 * the next request to the same host reuses the open connection. Proxies: libcurl's environment
 * variables (http_proxy, HTTPS_PROXY, NO_PROXY) are honoured.
 *
 * Timeout: timeout_ms bounds the whole exchange — connecting, sending and reading the complete
 * answer must all finish within it. A long-poll caller passes its wait plus a margin.
 *
 * Thread-safe: the handle pool is locked; libcurl is initialised once (pthread_once); no
 * signal is ever raised (CURLOPT_NOSIGNAL; SIGPIPE is ignored by libcurl around its writes). */
#ifndef CEPHALON_COMMON_HTTP_CLIENT_H
#define CEPHALON_COMMON_HTTP_CLIENT_H

#include <stddef.h>

#include "cephalon/error.h"

/* A parsed base URL: http[s]://HOST[:PORT][/PREFIX]. */
typedef struct cph_httpc_url {
  char *host;        /* as given, without the brackets of an IPv6 literal */
  char *port;        /* decimal; "80" (http) or "443" (https) when the URL has none */
  char *host_header; /* the Host header value: HOST[:PORT] exactly as written */
  char *prefix;      /* path prefix without a trailing '/'; "" when none */
  int https;         /* 1 for https:// */
} cph_httpc_url;

/* Parses text into *out. Returns 0, or -1 with *why set to a static description (and *out
 * left empty). Free with cph_httpc_url_free in both cases. */
int cph_httpc_url_parse(const char *text, cph_httpc_url *out, const char **why);
void cph_httpc_url_free(cph_httpc_url *u);

typedef struct cph_httpc_request {
  const char *method; /* "GET", "POST", ... */
  const char *path;   /* starts with '/' (or is ""), percent-encoded; appended to the prefix */
  const char *token;  /* NULL: no Authorization header; else "Authorization: Bearer <token>" */
  const char *const *headers; /* NULL or a NULL-terminated list of extra "Name: value" lines */
  const char *user_agent;     /* NULL means "cephalon" */
  const char *content_type;   /* of body; NULL means application/json */
  const char *body;           /* NULL: no body (POST and PUT still send Content-Length: 0) */
  size_t body_len;
  int timeout_ms;      /* the whole exchange; <= 0 means 30 s */
  const char *ca_file; /* https: the CA to trust; NULL means the process default */
  /* NULL, or asked about once per second or more often while the exchange runs: a non-zero
   * answer abandons it (CPH_HTTPC_ECANCELED). */
  int (*cancel)(void *arg);
  void *cancel_arg;
  /* NULL, or the body is handed over as it arrives (a stream, such as etcd's watch) instead
   * of kept in the response: a non-zero answer abandons the exchange (CPH_HTTPC_ECANCELED). */
  int (*on_data)(void *arg, const char *data, size_t len);
  void *on_data_arg;
} cph_httpc_request;

typedef struct cph_httpc_response {
  int status;      /* 100..599 */
  char reason[64]; /* reason phrase, truncated */
  char *body;      /* NUL-terminated (may contain NULs before body_len); free with _free */
  size_t body_len;
} cph_httpc_response;

/* Transport errors of cph_httpc_do, each with a one-line detail. */
enum {
  CPH_HTTPC_OK = 0,
  CPH_HTTPC_ECONNECT = -1, /* name lookup or connect failed: the server cannot be reached */
  CPH_HTTPC_ETIMEOUT = -2, /* the exchange did not finish within the timeout */
  CPH_HTTPC_EIO = -3,      /* the connection failed after it was made */
  CPH_HTTPC_EPROTO = -4,   /* the answer is not HTTP/1.x we can read */
  CPH_HTTPC_ENOMEM = -5,
  CPH_HTTPC_EINVAL = -6,   /* the request itself is unsendable (e.g. a header with a newline) */
  CPH_HTTPC_ETLS = -7,     /* the TLS handshake failed: unknown CA, wrong name, bad CA file */
  CPH_HTTPC_ECANCELED = -8 /* the request's cancel callback said stop */
};

/* Largest answer body accepted; bigger answers fail with CPH_HTTPC_EPROTO. */
#define CPH_HTTPC_MAX_BODY ((size_t)64 << 20)

/* Sends req to url and reads the whole answer into *resp. Returns CPH_HTTPC_OK (whatever the
 * HTTP status), or a CPH_HTTPC_E* code with a one-line detail in err. *resp is always safe to
 * free. Interim 1xx answers are skipped. */
int cph_httpc_do(const cph_httpc_url *url, const cph_httpc_request *req, cph_httpc_response *resp,
                 char *err, size_t err_len);
void cph_httpc_response_free(cph_httpc_response *resp);

/* The project error code for a CPH_HTTPC_E* code: ETIMEOUT -> CPH_ETIMEDOUT, ENOMEM ->
 * CPH_ENOMEM, EINVAL -> CPH_EINVAL, EPROTO -> CPH_EPARSE, the rest -> CPH_EIO. */
int cph_httpc_errcode(int httpc_rc);

/* The CA file https requests trust when theirs is NULL; NULL or "" means the system bundle.
 * Copied; safe to call while other threads send. Returns CPH_OK or CPH_ENOMEM. */
int cph_httpc_set_ca_file(const char *path);

/* Closes the pooled connections and frees libcurl's global state. Call at most once, at exit,
 * when no request is running (optional: it only makes leak checkers quiet). */
void cph_httpc_global_cleanup(void);

/* ---- the convenience the providers use ---- */

/* POSTs body (a JSON text) to base_url + path with an optional bearer token and reads the
 * answer. Every failure — a bad URL, a transport error — is a project code with a
 * message that names the URL: `POST http://host:1234/v1/embeddings: connection refused`.
 * The HTTP status is not judged here (see cph_httpc_check_status). */
int cph_httpc_post_json(const char *base_url, const char *path, const char *body, size_t body_len,
                        const char *bearer, int timeout_ms, cph_httpc_response *resp, cph_err *err);

/* CPH_OK for a 2xx answer; otherwise a project code (401 -> CPH_EAUTH, 403 -> CPH_EFORBIDDEN,
 * 404 -> CPH_ENOTFOUND, 408/504 -> CPH_ETIMEDOUT, 429/503 -> CPH_EBUSY, other 4xx ->
 * CPH_EINVAL, other 5xx and anything else -> CPH_EIO) with the message `what URL: HTTP 500
 * Internal Server Error: <first line of the body, at most 200 bytes, control characters as
 * '?'>`. */
int cph_httpc_check_status(const cph_httpc_response *resp, const char *what, const char *url,
                           cph_err *err);

/* The bearer token from the environment variable named env_name: *token = NULL when env_name
 * is NULL or "" (no key configured). A named variable that is unset or empty is CPH_EAUTH
 * ("environment variable X (api-key-env) is not set"), so a missing key is reported before
 * the request instead of as a 401 afterwards. The value is never copied into messages. */
int cph_httpc_bearer_from_env(const char *env_name, const char **token, cph_err *err);

#endif
