/* The blocking HTTP/1.1 client of cephalonctl and the network providers: one request per
 * connection, the whole exchange bounded by one deadline. See http_client.h. */
#include "common/http_client.h"

#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"

#define DEFAULT_TIMEOUT_MS 30000
#define MAX_LINE 8192          /* one status, header or chunk-size line */
#define MAX_HEADER_BYTES 65536 /* all header lines of one answer together */

/* ---------------------------------------------------------------- URL */

static char *dup_range(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = '\0';
  }
  return p;
}

void cph_httpc_url_free(cph_httpc_url *u) {
  free(u->host);
  free(u->port);
  free(u->host_header);
  free(u->prefix);
  memset(u, 0, sizeof *u);
}

int cph_httpc_url_parse(const char *text, cph_httpc_url *out, const char **why) {
  memset(out, 0, sizeof *out);
  static const char scheme[] = "http://";
  if (strncasecmp(text, "https://", 8) == 0) {
    *why = CPH_HTTPC_NO_HTTPS;
    return -1;
  }
  if (strncasecmp(text, scheme, sizeof scheme - 1) != 0) {
    *why = "expected http://HOST[:PORT][/PREFIX]";
    return -1;
  }
  for (const char *p = text; *p; p++) {
    if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
      *why = "spaces and control characters are not allowed";
      return -1;
    }
  }
  const char *auth = text + sizeof scheme - 1;
  size_t auth_len = strcspn(auth, "/?#");
  const char *rest = auth + auth_len;
  if (strpbrk(rest, "?#")) {
    *why = "a query or fragment is not allowed in the base URL";
    return -1;
  }
  if (memchr(auth, '@', auth_len)) {
    *why = "user info (user@host) is not supported; use --token";
    return -1;
  }

  const char *host = auth, *host_end, *port = NULL;
  if (auth_len > 0 && auth[0] == '[') { /* [IPv6 literal] */
    const char *close = memchr(auth, ']', auth_len);
    if (!close) {
      *why = "unterminated '[' in the host";
      return -1;
    }
    host = auth + 1;
    host_end = close;
    if (close + 1 < rest) {
      if (close[1] != ':') {
        *why = "expected ':' after ']'";
        return -1;
      }
      port = close + 2;
    }
  } else {
    const char *colon = memchr(auth, ':', auth_len);
    host_end = colon ? colon : rest;
    if (colon) {
      if (memchr(colon + 1, ':', (size_t)(rest - colon - 1))) {
        *why = "put an IPv6 address in brackets: http://[::1]:7070";
        return -1;
      }
      port = colon + 1;
    }
  }
  if (host_end == host) {
    *why = "missing host";
    return -1;
  }
  unsigned long port_num = 80;
  if (port && port < rest) { /* "host:" with an empty port means the default, as in RFC 3986 */
    size_t plen = (size_t)(rest - port);
    if (plen > 5 || strspn(port, "0123456789") < plen) {
      *why = "the port must be a number from 1 to 65535";
      return -1;
    }
    port_num = strtoul(port, NULL, 10);
    if (port_num < 1 || port_num > 65535) {
      *why = "the port must be a number from 1 to 65535";
      return -1;
    }
  }
  size_t prefix_len = strlen(rest);
  while (prefix_len > 0 && rest[prefix_len - 1] == '/')
    prefix_len--;

  char port_text[8];
  snprintf(port_text, sizeof port_text, "%lu", port_num);
  out->host = dup_range(host, (size_t)(host_end - host));
  out->port = dup_range(port_text, strlen(port_text));
  out->host_header = dup_range(auth, auth_len);
  out->prefix = dup_range(rest, prefix_len);
  if (!out->host || !out->port || !out->host_header || !out->prefix) {
    cph_httpc_url_free(out);
    *why = "out of memory";
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- connecting and sending */

/* The whole exchange shares one deadline. Before every blocking socket call the socket's
 * SO_SNDTIMEO/SO_RCVTIMEO are set to the time left, so no single call can overrun it. */
typedef struct deadline {
  cph_clock clock;
  int64_t end_ns;
  int timeout_ms; /* as given, for messages */
} deadline;

static void deadline_start(deadline *d, int timeout_ms) {
  cph_clock_init_monotonic(&d->clock);
  d->timeout_ms = timeout_ms;
  d->end_ns = cph_clock_now(&d->clock) + (int64_t)timeout_ms * CPH_NS_PER_MS;
}

static double seconds(const deadline *d) { return d->timeout_ms / 1000.0; }

/* Sets the socket timeouts to the time left. Returns 0, 1 when the deadline has passed, or -1
 * (errno set) when setsockopt fails. */
static int arm(int fd, const deadline *d) {
  int64_t left_ns = d->end_ns - cph_clock_now(&d->clock);
  if (left_ns <= 0)
    return 1;
  int64_t left_us = (left_ns + 999) / 1000; /* never 0: a zero timeval means "no timeout" */
  struct timeval tv = {.tv_sec = (time_t)(left_us / 1000000),
                       .tv_usec = (suseconds_t)(left_us % 1000000)};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
    return -1;
  return 0;
}

/* Tries every address of the host in order. On failure err holds the reason of the last
 * attempt — for a single loopback address that is exactly "Connection refused". */
static int connect_to(const cph_httpc_url *url, const deadline *d, int *fd_out, char *err,
                      size_t err_len) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  int gai = getaddrinfo(url->host, url->port, &hints, &res);
  if (gai != 0) {
    snprintf(err, err_len, "cannot resolve host '%s': %s", url->host,
             gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
    return CPH_HTTPC_ECONNECT;
  }
  /* Every failure here, a connect timeout included, means "cannot reach" (ECONNECT). */
  int rc = CPH_HTTPC_ECONNECT;
  snprintf(err, err_len, "no address for host '%s'", url->host);
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      snprintf(err, err_len, "%s", strerror(errno));
      continue;
    }
    /* On Linux SO_SNDTIMEO also bounds a blocking connect (it fails with EINPROGRESS). */
    int armed = arm(fd, d);
    if (armed != 0) {
      if (armed > 0) {
        snprintf(err, err_len, "%s (no answer within %g s)", strerror(ETIMEDOUT), seconds(d));
      } else {
        snprintf(err, err_len, "%s", strerror(errno));
      }
      close(fd);
      if (armed > 0)
        break;
      continue;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      *fd_out = fd;
      rc = CPH_HTTPC_OK;
      break;
    }
    int e = errno;
    close(fd);
    if (e == EINPROGRESS || e == EAGAIN || e == EWOULDBLOCK || e == ETIMEDOUT)
      snprintf(err, err_len, "%s (no answer within %g s)", strerror(ETIMEDOUT), seconds(d));
    else
      snprintf(err, err_len, "%s", strerror(e));
  }
  freeaddrinfo(res);
  return rc;
}

static int send_all(int fd, const char *data, size_t len, const deadline *d, char *err,
                    size_t err_len) {
  while (len > 0) {
    int armed = arm(fd, d);
    if (armed < 0) {
      snprintf(err, err_len, "sending the request: %s", strerror(errno));
      return CPH_HTTPC_EIO;
    }
    ssize_t n = armed > 0 ? -1 : send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (armed == 0 && errno == EINTR)
        continue;
      if (armed > 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
        snprintf(err, err_len, "could not send the request within %g s", seconds(d));
        return CPH_HTTPC_ETIMEOUT;
      }
      snprintf(err, err_len, "sending the request: %s", strerror(errno));
      return CPH_HTTPC_EIO;
    }
    data += n;
    len -= (size_t)n;
  }
  return CPH_HTTPC_OK;
}

/* A header value may not carry CR, LF or other control characters (header injection). */
static bool header_safe(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f)
      return false;
  return true;
}

static void build_request(cph_buf *b, const cph_httpc_url *url, const cph_httpc_request *req) {
  /* An empty target (base URL without a path, empty path) is the root. */
  bool root = url->prefix[0] == '\0' && req->path[0] == '\0';
  cph_buf_printf(b, "%s %s%s HTTP/1.1\r\n", req->method, root ? "/" : url->prefix, req->path);
  cph_buf_printf(b, "Host: %s\r\n", url->host_header);
  cph_buf_printf(b, "User-Agent: %s\r\n", req->user_agent ? req->user_agent : "cephalon");
  cph_buf_puts(b, "Accept: application/json\r\nConnection: close\r\n");
  if (req->token)
    cph_buf_printf(b, "Authorization: Bearer %s\r\n", req->token);
  for (const char *const *h = req->headers; h && *h; h++)
    cph_buf_printf(b, "%s\r\n", *h);
  bool has_body = req->body != NULL;
  if (has_body)
    cph_buf_printf(b, "Content-Type: %s\r\n",
                   req->content_type ? req->content_type : "application/json");
  /* Always frame POST/PUT: some servers answer 411 to a body-less POST without a length. */
  if (has_body || strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0)
    cph_buf_printf(b, "Content-Length: %zu\r\n", has_body ? req->body_len : 0);
  cph_buf_puts(b, "\r\n");
  if (has_body)
    cph_buf_append(b, req->body, req->body_len);
}

/* ---------------------------------------------------------------- reading the answer */

typedef struct reader {
  int fd;
  const deadline *deadline;
  size_t pos, len; /* unread bytes are buf[pos, len) */
  char buf[16384];
} reader;

/* Makes unread bytes available. Returns 1 if there are some, 0 at end of stream, or a
 * CPH_HTTPC_E* code with err filled. */
static int reader_fill(reader *r, char *err, size_t err_len) {
  if (r->pos < r->len)
    return 1;
  r->pos = r->len = 0;
  for (;;) {
    int armed = arm(r->fd, r->deadline);
    if (armed < 0) {
      snprintf(err, err_len, "connection lost: %s", strerror(errno));
      return CPH_HTTPC_EIO;
    }
    ssize_t n = armed > 0 ? -1 : recv(r->fd, r->buf, sizeof r->buf, 0);
    if (n >= 0) {
      r->len = (size_t)n;
      return n > 0;
    }
    if (armed == 0 && errno == EINTR)
      continue;
    if (armed > 0 || errno == EAGAIN || errno == EWOULDBLOCK) {
      snprintf(err, err_len, "no complete answer within %g s", seconds(r->deadline));
      return CPH_HTTPC_ETIMEOUT;
    }
    snprintf(err, err_len, "connection lost: %s", strerror(errno));
    return CPH_HTTPC_EIO;
  }
}

/* Reads one line (LF or CRLF terminated, terminator dropped) into line. Returns 0, 1 when the
 * stream ended first (line holds what came), or a CPH_HTTPC_E* code. */
static int read_line(reader *r, cph_buf *line, char *err, size_t err_len) {
  cph_buf_reset(line);
  cph_buf_append(line, "", 0); /* data is never NULL after a successful read */
  for (;;) {
    int f = reader_fill(r, err, err_len);
    if (f < 0)
      return f;
    if (f == 0 && cph_buf_error(line) != 0) {
      snprintf(err, err_len, "out of memory");
      return CPH_HTTPC_ENOMEM;
    }
    if (f == 0)
      return 1;
    char *start = r->buf + r->pos;
    size_t avail = r->len - r->pos;
    char *nl = memchr(start, '\n', avail);
    size_t take = nl ? (size_t)(nl - start) : avail;
    cph_buf_append(line, start, take);
    r->pos += take + (nl ? 1 : 0);
    if (line->len > MAX_LINE) {
      snprintf(err, err_len, "bad answer: a line longer than %d bytes", MAX_LINE);
      return CPH_HTTPC_EPROTO;
    }
    if (nl) {
      if (cph_buf_error(line) != 0) {
        snprintf(err, err_len, "out of memory");
        return CPH_HTTPC_ENOMEM;
      }
      if (line->len > 0 && line->data[line->len - 1] == '\r')
        line->data[--line->len] = '\0';
      return 0;
    }
  }
}

static int body_too_big(char *err, size_t err_len) {
  snprintf(err, err_len, "bad answer: the body is larger than %zu MiB", CPH_HTTPC_MAX_BODY >> 20);
  return CPH_HTTPC_EPROTO;
}

/* Appends exactly n bytes to out. */
static int read_exact(reader *r, size_t n, cph_buf *out, char *err, size_t err_len) {
  if (n > CPH_HTTPC_MAX_BODY - out->len)
    return body_too_big(err, err_len);
  while (n > 0) {
    int f = reader_fill(r, err, err_len);
    if (f < 0)
      return f;
    if (f == 0) {
      snprintf(err, err_len, "bad answer: the body ended %zu bytes early", n);
      return CPH_HTTPC_EPROTO;
    }
    size_t take = r->len - r->pos < n ? r->len - r->pos : n;
    cph_buf_append(out, r->buf + r->pos, take);
    r->pos += take;
    n -= take;
  }
  return CPH_HTTPC_OK;
}

static int read_to_eof(reader *r, cph_buf *out, char *err, size_t err_len) {
  for (;;) {
    int f = reader_fill(r, err, err_len);
    if (f < 0)
      return f;
    if (f == 0)
      return CPH_HTTPC_OK;
    size_t take = r->len - r->pos;
    if (take > CPH_HTTPC_MAX_BODY - out->len)
      return body_too_big(err, err_len);
    cph_buf_append(out, r->buf + r->pos, take);
    r->pos = r->len;
  }
}

static int read_chunked(reader *r, cph_buf *out, cph_buf *line, char *err, size_t err_len) {
  for (;;) {
    int rc = read_line(r, line, err, err_len);
    if (rc < 0)
      return rc;
    const char *p = line->data;
    size_t size = 0, digits = 0;
    for (;; p++, digits++) {
      int v;
      if (*p >= '0' && *p <= '9')
        v = *p - '0';
      else if (*p >= 'a' && *p <= 'f')
        v = *p - 'a' + 10;
      else if (*p >= 'A' && *p <= 'F')
        v = *p - 'A' + 10;
      else
        break;
      if (size > CPH_HTTPC_MAX_BODY)
        return body_too_big(err, err_len);
      size = size * 16 + (size_t)v;
    }
    /* After the digits only chunk extensions (";name=value") or whitespace may follow. */
    if (rc == 1 || digits == 0 || (*p && *p != ';' && *p != ' ' && *p != '\t')) {
      snprintf(err, err_len, "bad answer: invalid chunk size line");
      return CPH_HTTPC_EPROTO;
    }
    if (size == 0)
      break;
    if ((rc = read_exact(r, size, out, err, err_len)) != 0)
      return rc;
    rc = read_line(r, line, err, err_len);
    if (rc < 0)
      return rc;
    if (rc == 1 || line->len != 0) {
      snprintf(err, err_len, "bad answer: a chunk is not followed by CRLF");
      return CPH_HTTPC_EPROTO;
    }
  }
  /* Trailer fields until the empty line; the stream ending instead is tolerated since the
   * body is already complete. */
  for (;;) {
    int rc = read_line(r, line, err, err_len);
    if (rc < 0)
      return rc;
    if (rc == 1 || line->len == 0)
      return CPH_HTTPC_OK;
  }
}

/* Parses "HTTP/1.x SSS reason". */
static int parse_status_line(const char *s, cph_httpc_response *resp) {
  if (strncmp(s, "HTTP/1.", 7) != 0 || (s[7] != '0' && s[7] != '1') || s[8] != ' ')
    return -1;
  const char *c = s + 9;
  if (c[0] < '1' || c[0] > '5' || c[1] < '0' || c[1] > '9' || c[2] < '0' || c[2] > '9' ||
      (c[3] != ' ' && c[3] != '\0'))
    return -1;
  resp->status = (c[0] - '0') * 100 + (c[1] - '0') * 10 + (c[2] - '0');
  snprintf(resp->reason, sizeof resp->reason, "%s", c[3] ? c + 4 : "");
  return 0;
}

static const char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    s[--n] = '\0';
  return s;
}

/* True when the last transfer coding in a Transfer-Encoding value is "chunked". */
static bool last_coding_is_chunked(const char *value) {
  const char *last = strrchr(value, ',');
  last = last ? last + 1 : value;
  while (*last == ' ' || *last == '\t')
    last++;
  return strncasecmp(last, "chunked", 7) == 0 && (last[7] == '\0' || last[7] == ' ' ||
                                                  last[7] == '\t' || last[7] == ';');
}

typedef struct framing {
  bool chunked;
  bool has_te; /* some Transfer-Encoding, chunked or not */
  bool has_length;
  size_t length;
} framing;

static int read_head(reader *r, cph_httpc_response *resp, framing *fr, cph_buf *line, char *err,
                     size_t err_len) {
  for (;;) { /* loops over interim 1xx answers */
    int rc = read_line(r, line, err, err_len);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      snprintf(err, err_len, line->len ? "bad answer: the connection closed in the status line"
                                       : "the connection closed without an answer");
      return line->len ? CPH_HTTPC_EPROTO : CPH_HTTPC_EIO;
    }
    if (parse_status_line(line->data, resp) != 0) {
      snprintf(err, err_len, "bad answer: not an HTTP/1.x status line");
      return CPH_HTTPC_EPROTO;
    }
    memset(fr, 0, sizeof *fr);
    size_t header_bytes = 0;
    for (;;) {
      if ((rc = read_line(r, line, err, err_len)) < 0)
        return rc;
      if (rc == 1) {
        snprintf(err, err_len, "bad answer: the connection closed in the headers");
        return CPH_HTTPC_EPROTO;
      }
      if (line->len == 0)
        break;
      header_bytes += line->len;
      char *colon = strchr(line->data, ':');
      if (header_bytes > MAX_HEADER_BYTES || !colon || colon == line->data) {
        snprintf(err, err_len, header_bytes > MAX_HEADER_BYTES ? "bad answer: headers too large"
                                                                : "bad answer: malformed header");
        return CPH_HTTPC_EPROTO;
      }
      *colon = '\0';
      const char *value = trim(colon + 1);
      if (strcasecmp(line->data, "Transfer-Encoding") == 0) {
        fr->has_te = true;
        fr->chunked = last_coding_is_chunked(value);
      } else if (strcasecmp(line->data, "Content-Length") == 0) {
        /* Digits only; a repeated header must agree (RFC 9112 §6.3). */
        size_t len = strlen(value);
        bool valid = len > 0 && len <= 19 && strspn(value, "0123456789") == len;
        size_t n = valid ? (size_t)strtoull(value, NULL, 10) : 0;
        if (!valid || (fr->has_length && n != fr->length)) {
          snprintf(err, err_len, "bad answer: invalid Content-Length");
          return CPH_HTTPC_EPROTO;
        }
        fr->has_length = true;
        fr->length = n;
      }
    }
    if (resp->status == 101) {
      snprintf(err, err_len, "bad answer: unexpected protocol switch");
      return CPH_HTTPC_EPROTO;
    }
    if (resp->status >= 200)
      return CPH_HTTPC_OK;
  }
}

static int read_response(reader *r, const cph_httpc_request *req, cph_httpc_response *resp,
                         char *err, size_t err_len) {
  cph_buf line = CPH_BUF_INIT, body = CPH_BUF_INIT;
  framing fr;
  int rc = read_head(r, resp, &fr, &line, err, err_len);
  if (rc != 0)
    goto out;
  bool no_body = strcmp(req->method, "HEAD") == 0 || resp->status == 204 || resp->status == 304;
  if (no_body)
    rc = CPH_HTTPC_OK;
  else if (fr.chunked)
    rc = read_chunked(r, &body, &line, err, err_len);
  else if (fr.has_length && !fr.has_te)
    rc = read_exact(r, fr.length, &body, err, err_len);
  else /* no framing, or a coding we do not decode: the body runs to the end of the stream */
    rc = read_to_eof(r, &body, err, err_len);
  if (rc != 0)
    goto out;
  if (cph_buf_error(&body) != 0 || cph_buf_error(&line) != 0) {
    snprintf(err, err_len, "out of memory");
    rc = CPH_HTTPC_ENOMEM;
    goto out;
  }
  resp->body_len = body.len;
  resp->body = body.data ? cph_buf_steal(&body) : calloc(1, 1);
  if (!resp->body) {
    snprintf(err, err_len, "out of memory");
    rc = CPH_HTTPC_ENOMEM;
  }
out:
  cph_buf_free(&line);
  cph_buf_free(&body);
  return rc;
}

/* ---------------------------------------------------------------- one request */

void cph_httpc_response_free(cph_httpc_response *resp) {
  free(resp->body);
  memset(resp, 0, sizeof *resp);
}

/* An extra header line is "Name: value" with a token name and no control characters. */
static bool extra_header_ok(const char *h) {
  size_t name = strcspn(h, ":");
  if (name == 0 || h[name] != ':' || !header_safe(h))
    return false;
  for (size_t i = 0; i < name; i++)
    if (h[i] == ' ' || h[i] == '\t' || h[i] == '(' || h[i] == ')' || h[i] == ',' ||
        h[i] == '/' || h[i] == ';' || h[i] == '"')
      return false;
  return true;
}

static const char *unsafe_part(const cph_httpc_request *req) {
  if (req->token && !header_safe(req->token))
    return "the token";
  if (!header_safe(req->path))
    return "the request path";
  if (req->user_agent && !header_safe(req->user_agent))
    return "the user agent";
  for (const char *const *h = req->headers; h && *h; h++)
    if (!extra_header_ok(*h))
      return "an extra header";
  return NULL;
}

int cph_httpc_do(const cph_httpc_url *url, const cph_httpc_request *req,
                 cph_httpc_response *resp, char *err, size_t err_len) {
  memset(resp, 0, sizeof *resp);
  err[0] = '\0';
  const char *unsafe = unsafe_part(req);
  if (unsafe) {
    /* A header line is not echoed: it may be a credential. */
    snprintf(err, err_len, "%s contains control characters or is malformed", unsafe);
    return CPH_HTTPC_EINVAL;
  }
  deadline d;
  deadline_start(&d, req->timeout_ms > 0 ? req->timeout_ms : DEFAULT_TIMEOUT_MS);

  cph_buf out = CPH_BUF_INIT;
  build_request(&out, url, req);
  if (cph_buf_error(&out) != 0) {
    cph_buf_free(&out);
    snprintf(err, err_len, "out of memory");
    return CPH_HTTPC_ENOMEM;
  }
  int fd = -1;
  int rc = connect_to(url, &d, &fd, err, err_len);
  if (rc != 0) {
    cph_buf_free(&out);
    return rc;
  }
  rc = send_all(fd, out.data, out.len, &d, err, err_len);
  cph_buf_free(&out);

  /* No shutdown(SHUT_WR) after sending: a server may take the half-close for a client that
   * went away and drop a long-poll (turns lease) it was holding for us. */
  reader r;
  r.fd = fd;
  r.deadline = &d;
  r.pos = r.len = 0;
  if (rc == CPH_HTTPC_EIO) {
    /* The server may have answered (413, 401) and closed before reading all we sent: prefer
     * its answer to our send error. */
    char send_err[256];
    snprintf(send_err, sizeof send_err, "%s", err);
    if (read_response(&r, req, resp, err, err_len) == CPH_HTTPC_OK) {
      rc = CPH_HTTPC_OK;
    } else {
      cph_httpc_response_free(resp);
      snprintf(err, err_len, "%s", send_err);
    }
  } else if (rc == CPH_HTTPC_OK) {
    rc = read_response(&r, req, resp, err, err_len);
    if (rc != 0)
      cph_httpc_response_free(resp);
  }
  close(fd);
  return rc;
}

int cph_httpc_errcode(int httpc_rc) {
  switch (httpc_rc) {
  case CPH_HTTPC_OK: return CPH_OK;
  case CPH_HTTPC_ETIMEOUT: return CPH_ETIMEDOUT;
  case CPH_HTTPC_ENOMEM: return CPH_ENOMEM;
  case CPH_HTTPC_EINVAL: return CPH_EINVAL;
  case CPH_HTTPC_EPROTO: return CPH_EPARSE;
  default: return CPH_EIO;
  }
}

/* ---------------------------------------------------------------- the providers' helpers */

int cph_httpc_post_json(const char *base_url, const char *path, const char *body,
                        size_t body_len, const char *bearer, int timeout_ms,
                        cph_httpc_response *resp, cph_err *err) {
  memset(resp, 0, sizeof *resp);
  /* Messages name the URL as configured plus the path: userinfo is refused by the parser,
   * so the text holds no credential. */
  const char *shown = base_url ? base_url : "";
  int shown_len = (int)strlen(shown);
  while (shown_len > 0 && path[0] == '/' && shown[shown_len - 1] == '/')
    shown_len--; /* the parser drops it too: "http://h/x/" + "/op" is http://h/x/op */
  cph_httpc_url url;
  const char *why = NULL;
  if (cph_httpc_url_parse(shown, &url, &why) != 0) {
    cph_httpc_url_free(&url);
    return cph_err_set(err, CPH_EINVAL, "POST %.*s%s: bad URL: %s", shown_len, shown, path,
                       why);
  }
  cph_httpc_request req = {
      .method = "POST",
      .path = path,
      .token = bearer,
      .body = body,
      .body_len = body_len,
      .timeout_ms = timeout_ms,
  };
  char detail[400];
  int rc = cph_httpc_do(&url, &req, resp, detail, sizeof detail);
  cph_httpc_url_free(&url);
  if (rc != CPH_HTTPC_OK)
    return cph_err_set(err, cph_httpc_errcode(rc), "POST %.*s%s: %s%s", shown_len, shown, path,
                       rc == CPH_HTTPC_ECONNECT ? "cannot connect: " : "", detail);
  return CPH_OK;
}

static int status_code(int status) {
  switch (status) {
  case 401: return CPH_EAUTH;
  case 403: return CPH_EFORBIDDEN;
  case 404: return CPH_ENOTFOUND;
  case 408:
  case 504: return CPH_ETIMEDOUT;
  case 429:
  case 503: return CPH_EBUSY;
  default: return status >= 400 && status < 500 ? CPH_EINVAL : CPH_EIO;
  }
}

int cph_httpc_check_status(const cph_httpc_response *resp, const char *what, const char *url,
                           cph_err *err) {
  if (resp->status >= 200 && resp->status < 300)
    return CPH_OK;
  /* The first line of the body, trimmed, control characters replaced: servers put their
   * error there, and a log line must stay one line. */
  char excerpt[201] = "";
  if (resp->body) {
    const char *b = resp->body + strspn(resp->body, " \t\r\n");
    size_t n = strcspn(b, "\r\n");
    if (n > 200)
      n = 200;
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)b[i];
      excerpt[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    excerpt[n] = '\0';
  }
  return cph_err_set(err, status_code(resp->status), "%s %s: HTTP %d%s%s%s%s", what, url,
                     resp->status, resp->reason[0] ? " " : "", resp->reason,
                     excerpt[0] ? ": " : "", excerpt);
}

int cph_httpc_bearer_from_env(const char *env_name, const char **token, cph_err *err) {
  *token = NULL;
  if (!env_name || !env_name[0])
    return CPH_OK;
  const char *v = getenv(env_name);
  if (!v || !v[0])
    return cph_err_set(err, CPH_EAUTH, "environment variable %s (api-key-env) is not set",
                       env_name);
  if (!header_safe(v))
    return cph_err_set(err, CPH_EAUTH,
                       "environment variable %s (api-key-env) holds control characters",
                       env_name);
  *token = v;
  return CPH_OK;
}
