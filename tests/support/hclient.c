#define _GNU_SOURCE
#include "hclient.h"
#include "oas.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int cph_hc_connect(int port, int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct timeval tv = {timeout_ms / 1000, (suseconds_t)(timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const char *p, size_t len) {
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads until the peer closes (Connection: close) or the timeout; NUL-terminated. */
static char *recv_all(int fd, size_t *len_out) {
  size_t cap = 8192, len = 0;
  char *buf = malloc(cap);
  if (!buf)
    return NULL;
  for (;;) {
    if (cap - len < 2) {
      char *p = realloc(buf, cap * 2);
      if (!p) {
        free(buf);
        return NULL;
      }
      buf = p;
      cap *= 2;
    }
    ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) { /* a timeout or a reset: whatever came is all there is */
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        len = 0; /* timed out: the answer is incomplete */
      break;
    }
    if (n == 0)
      break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  *len_out = len;
  return buf;
}

static json_t *vcall(int port, const char *token, int *status, char **raw, const char *method,
                     const char *path, const char *fmt, va_list ap) {
  *status = -1;
  if (raw)
    *raw = NULL;
  char *body = NULL;
  if (fmt && vasprintf(&body, fmt, ap) < 0)
    return NULL;
  int fd = cph_hc_connect(port, CPH_HC_TIMEOUT_MS);
  if (fd < 0) {
    free(body);
    return NULL;
  }
  char auth[600] = "";
  if (token)
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
  size_t blen = body ? strlen(body) : 0;
  char *req = NULL;
  int n = asprintf(&req,
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s"
                   "Content-Length: %zu\r\n\r\n%s",
                   method, path, auth, body ? "Content-Type: application/json\r\n" : "", blen,
                   body ? body : "");
  free(body);
  if (n < 0) {
    close(fd);
    return NULL;
  }
  int rc = send_all(fd, req, (size_t)n);
  free(req);
  /* A server that answers early (413) may close before the body is sent: read anyway. */
  (void)rc;
  size_t len = 0;
  char *buf = recv_all(fd, &len);
  close(fd);
  if (!buf)
    return NULL;
  char *sep = strstr(buf, "\r\n\r\n");
  if (len < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || !sep) {
    free(buf);
    return NULL;
  }
  *status = atoi(buf + 9);
  const char *b = sep + 4;
  size_t blen_in = len - (size_t)(b - buf);
  *sep = '\0'; /* the head, for the check against docs/openapi.json */
  cph_oas_expect_answer(port, method, path, *status, buf, b, blen_in);
  json_t *j = blen_in ? json_loadb(b, blen_in, 0, NULL) : NULL;
  if (raw)
    *raw = strdup(b);
  free(buf);
  return j;
}

json_t *cph_hc_call(int port, const char *token, int *status, const char *method,
                    const char *path, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *j = vcall(port, token, status, NULL, method, path, fmt, ap);
  va_end(ap);
  return j;
}

json_t *cph_hc_call_raw(int port, const char *token, int *status, char **raw,
                        const char *method, const char *path, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  json_t *j = vcall(port, token, status, raw, method, path, fmt, ap);
  va_end(ap);
  return j;
}

const char *cph_hc_str(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "";
}

int64_t cph_hc_int(const json_t *o, const char *key) {
  return (int64_t)json_integer_value(json_object_get(o, key));
}

int64_t cph_hc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cph_hc_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

uint64_t cph_hc_rand(cph_hc_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int64_t cph_hc_rand_range(cph_hc_rng *r, int64_t lo, int64_t hi) {
  if (hi <= lo)
    return lo;
  return lo + (int64_t)(cph_hc_rand(r) % (uint64_t)(hi - lo + 1));
}

int cph_hc_append_line(const char *path, const char *fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return -1;
  if ((size_t)n > sizeof line - 2)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    return -1;
  ssize_t w = write(fd, line, (size_t)n);
  close(fd);
  return w == n ? 0 : -1;
}
