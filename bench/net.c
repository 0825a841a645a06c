/* cephalon-bench: loopback connections, HTTP/1.1 keep-alive, and JSON scanning (net.h). */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define CONN_BUF_MIN 65536

static struct sockaddr_in loopback(int port) {
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof sin);
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sin;
}

int cph_bench_conn_open(cph_bench_conn *c, int port) {
  c->fd = -1;
  c->port = port;
  c->len = c->off = 0;
  if (!c->buf) {
    c->cap = CONN_BUF_MIN;
    c->buf = malloc(c->cap);
    if (!c->buf)
      return -1;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in sin = loopback(port);
  struct timeval tv = {CPH_BENCH_IO_TIMEOUT_S, 0};
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
    close(fd);
    return -1;
  }
  c->fd = fd;
  return 0;
}

void cph_bench_conn_close(cph_bench_conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  c->len = c->off = 0;
}

void cph_bench_conn_free(cph_bench_conn *c) {
  cph_bench_conn_close(c);
  free(c->buf);
  free(c->aux);
  c->buf = c->aux = NULL;
  c->cap = c->aux_cap = 0;
}

int cph_bench_conn_write(cph_bench_conn *c, const void *data, size_t len) {
  const char *p = data;
  while (len > 0) {
    ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads more bytes after [off, len), keeping room for want unconsumed bytes + a NUL. */
static int fill(cph_bench_conn *c, size_t want) {
  if (c->off > 0 && (c->off == c->len || c->cap - c->len < CONN_BUF_MIN / 4)) {
    memmove(c->buf, c->buf + c->off, c->len - c->off);
    c->len -= c->off;
    c->off = 0;
  }
  size_t need = (want > c->len ? want : c->len) + CONN_BUF_MIN / 4 + 1;
  if (need > c->cap) {
    size_t cap = c->cap * 2 > need ? c->cap * 2 : need;
    char *b = realloc(c->buf, cap);
    if (!b)
      return -1;
    c->buf = b;
    c->cap = cap;
  }
  for (;;) {
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    c->len += (size_t)n;
    return 0;
  }
}

int cph_bench_conn_line(cph_bench_conn *c, char **line, size_t *len) {
  size_t scanned = c->off;
  for (;;) {
    char *nl = memchr(c->buf + scanned, '\n', c->len - scanned);
    if (nl) {
      char *start = c->buf + c->off;
      size_t n = (size_t)(nl - start);
      if (n > 0 && start[n - 1] == '\r')
        n--;
      start[n] = '\0';
      c->off = (size_t)(nl - c->buf) + 1;
      *line = start;
      *len = n;
      return 0;
    }
    size_t pending = c->len - c->off;
    if (fill(c, pending + 1))
      return -1;
    scanned = c->off + pending; /* fill may have moved the data to the front */
  }
}

int cph_bench_conn_bytes(cph_bench_conn *c, size_t n, char **out) {
  while (c->len - c->off < n)
    if (fill(c, n))
      return -1;
  *out = c->buf + c->off;
  c->off += n;
  return 0;
}

int cph_bench_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  struct sockaddr_in sin = loopback(0);
  socklen_t len = sizeof sin;
  int port = 0;
  if (bind(fd, (struct sockaddr *)&sin, sizeof sin) == 0 &&
      getsockname(fd, (struct sockaddr *)&sin, &len) == 0)
    port = ntohs(sin.sin_port);
  close(fd);
  return port;
}

bool cph_bench_port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  struct sockaddr_in sin = loopback(port);
  bool ok = connect(fd, (struct sockaddr *)&sin, sizeof sin) == 0;
  close(fd);
  return ok;
}

/* ---------------------------------------------------------------- HTTP/1.1 */

/* Keeps a copy of n bytes in the connection's aux buffer, NUL-terminated. */
static char *aux_keep(cph_bench_conn *c, size_t at, const char *data, size_t n) {
  if (at + n + 1 > c->aux_cap) {
    size_t cap = c->aux_cap ? c->aux_cap : 4096;
    while (at + n + 1 > cap)
      cap *= 2;
    char *b = realloc(c->aux, cap);
    if (!b)
      return NULL;
    c->aux = b;
    c->aux_cap = cap;
  }
  memcpy(c->aux + at, data, n);
  c->aux[at + n] = '\0';
  return c->aux;
}

/* Reads a chunked body into the aux buffer. */
static int read_chunked(cph_bench_conn *c, char **body, size_t *body_len) {
  size_t len = 0;
  if (!aux_keep(c, 0, "", 0))
    return -1;
  for (;;) {
    char *line;
    size_t n;
    if (cph_bench_conn_line(c, &line, &n))
      return -1;
    unsigned long size = strtoul(line, NULL, 16);
    if (size == 0) {
      do { /* trailers until the empty line */
        if (cph_bench_conn_line(c, &line, &n))
          return -1;
      } while (n > 0);
      break;
    }
    char *data;
    if (cph_bench_conn_bytes(c, size, &data) || !aux_keep(c, len, data, size))
      return -1;
    len += size;
    if (cph_bench_conn_line(c, &line, &n)) /* the CRLF after the chunk */
      return -1;
  }
  *body = c->aux;
  *body_len = len;
  return 0;
}

static int http_once(cph_bench_conn *c, const char *method, const char *path, const char *body,
                     size_t body_len, cph_bench_resp *r) {
  char head[512];
  int hn = snprintf(head, sizeof head,
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n",
                    method, path, body_len);
  if (hn < 0 || (size_t)hn >= sizeof head)
    return -1;
  if (cph_bench_conn_write(c, head, (size_t)hn) ||
      (body_len && cph_bench_conn_write(c, body, body_len)))
    return -1;
  char *line;
  size_t n;
  if (cph_bench_conn_line(c, &line, &n) || n < 12 || strncmp(line, "HTTP/1.", 7) != 0)
    return -1;
  r->status = atoi(line + 9);
  long content_length = -1;
  bool chunked = false, close_after = false;
  for (;;) {
    if (cph_bench_conn_line(c, &line, &n))
      return -1;
    if (n == 0)
      break;
    if (strncasecmp(line, "Content-Length:", 15) == 0)
      content_length = strtol(line + 15, NULL, 10);
    else if (strncasecmp(line, "Transfer-Encoding:", 18) == 0 && strstr(line, "chunked"))
      chunked = true;
    else if (strncasecmp(line, "Connection:", 11) == 0 && strstr(line, "close"))
      close_after = true;
  }
  if (chunked) {
    if (read_chunked(c, &r->body, &r->body_len))
      return -1;
  } else if (content_length > 0) {
    if (cph_bench_conn_bytes(c, (size_t)content_length, &r->body))
      return -1;
    r->body_len = (size_t)content_length;
    /* NUL-terminated in place when nothing follows it (one request in flight: the usual
     * case; fill() keeps a byte free past the data), else copied out of the way. */
    if (c->off == c->len)
      r->body[r->body_len] = '\0';
    else if (!(r->body = aux_keep(c, 0, r->body, r->body_len)))
      return -1;
  } else {
    r->body = c->buf + c->len; /* empty, NUL-terminated free space */
    c->buf[c->len] = '\0';
    r->body_len = 0;
  }
  if (close_after)
    cph_bench_conn_close(c);
  return 0;
}

int cph_bench_http(cph_bench_conn *c, const char *method, const char *path, const char *body,
                   size_t body_len, cph_bench_resp *r) {
  r->status = -1;
  r->body = NULL;
  r->body_len = 0;
  if (c->fd < 0 && cph_bench_conn_open(c, c->port))
    return -1;
  if (http_once(c, method, path, body, body_len, r)) {
    cph_bench_conn_close(c);
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- JSON scanning */

const char *cph_bench_json_find(const char *json, const char *key) {
  size_t klen = strlen(key);
  for (const char *p = json; (p = strchr(p, '"')) != NULL; p++) {
    if (strncmp(p + 1, key, klen) == 0 && p[1 + klen] == '"' && p[2 + klen] == ':')
      return p + 3 + klen;
  }
  return NULL;
}

int cph_bench_json_u64(const char *json, const char *key, uint64_t *out) {
  const char *v = cph_bench_json_find(json, key);
  if (!v || *v < '0' || *v > '9')
    return -1;
  *out = strtoull(v, NULL, 10);
  return 0;
}

int cph_bench_json_str(const char *json, const char *key, char *out, size_t cap) {
  const char *v = cph_bench_json_find(json, key);
  if (!v || *v != '"')
    return -1;
  const char *end = strchr(v + 1, '"');
  if (!end || (size_t)(end - v - 1) >= cap)
    return -1;
  memcpy(out, v + 1, (size_t)(end - v - 1));
  out[end - v - 1] = '\0';
  return 0;
}
