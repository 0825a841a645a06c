/* A small blocking HTTP/1.1 client for cephalonctl (private to cli/).
 *
 * One request per connection: the request says `Connection: close` and the answer is read to
 * its framing (Content-Length, chunked, or end of stream). http:// only — cephalonctl talks to
 * a daemon on loopback or a trusted network; put TLS in front with a proxy if needed.
 *
 * Timeouts are per socket operation (SO_SNDTIMEO/SO_RCVTIMEO): connect, every send and every
 * recv must make progress within timeout_ms. A long-poll caller passes its wait plus a margin. */
#ifndef CEPHALON_CLI_HTTP_CLIENT_H
#define CEPHALON_CLI_HTTP_CLIENT_H

#include <stddef.h>

/* A parsed base URL: http://HOST[:PORT][/PREFIX]. */
typedef struct cli_url {
  char *host;        /* as given, without the brackets of an IPv6 literal */
  char *port;        /* decimal; "80" when the URL has none */
  char *host_header; /* the Host header value: HOST[:PORT] exactly as written */
  char *prefix;      /* path prefix without a trailing '/'; "" when none */
} cli_url;

/* Parses text into *out. Returns 0, or -1 with *why set to a static description (and *out
 * left empty). Free with cli_url_free in both cases. */
int cli_url_parse(const char *text, cli_url *out, const char **why);
void cli_url_free(cli_url *u);

typedef struct cli_http_request {
  const char *method;       /* "GET", "POST", ... */
  const char *path;         /* starts with '/', already percent-encoded; appended to the prefix */
  const char *token;        /* NULL: no Authorization header; never written anywhere else */
  const char *content_type; /* of body; NULL means application/json */
  const char *body;         /* NULL: no body (POST and PUT still send Content-Length: 0) */
  size_t body_len;
  int timeout_ms; /* per connect/send/recv; <= 0 means 30 s */
} cli_http_request;

typedef struct cli_http_response {
  int status;       /* 100..599 */
  char reason[64];  /* reason phrase, truncated */
  char *body;       /* NUL-terminated (may contain NULs before body_len); free with _free */
  size_t body_len;
} cli_http_response;

/* Errors, each with a detail string in err (e.g. strerror text). */
enum {
  CLI_HTTP_OK = 0,
  CLI_HTTP_ECONNECT = -1, /* name lookup or connect failed: the daemon cannot be reached */
  CLI_HTTP_ETIMEOUT = -2, /* a connect, send or recv made no progress within the timeout */
  CLI_HTTP_EIO = -3,      /* the connection failed after it was made */
  CLI_HTTP_EPROTO = -4,   /* the answer is not HTTP/1.x we can read */
  CLI_HTTP_ENOMEM = -5,
  CLI_HTTP_EINVAL = -6 /* the request itself is unsendable (e.g. a token with a newline) */
};

/* Largest answer body accepted; bigger answers fail with CLI_HTTP_EPROTO. */
#define CLI_HTTP_MAX_BODY ((size_t)64 << 20)

/* Sends req to url and reads the whole answer into *resp. Returns CLI_HTTP_OK (whatever the
 * HTTP status), or a CLI_HTTP_E* code with a one-line detail in err. *resp is always safe to
 * free. Interim 1xx answers are skipped. Does not touch SIGPIPE (uses MSG_NOSIGNAL). */
int cli_http_do(const cli_url *url, const cli_http_request *req, cli_http_response *resp,
                char *err, size_t err_len);
void cli_http_response_free(cli_http_response *resp);

#endif
