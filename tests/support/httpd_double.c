/* The HTTP server double (see httpd_double.h): a thread serving scripted replies on loopback
 * and recording every request to a log file. */
#define _GNU_SOURCE
#include "httpd_double.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEAD 65536           /* request line and headers */
#define MAX_BODY (64u << 20)     /* request body */
#define IO_TIMEOUT_MS 10000      /* a client that stalls this long mid-request is dropped */

typedef struct reply_copy {
  int status;
  char *body;
  int delay_ms;
} reply_copy;

struct cph_httpd {
  int listen_fd;
  int stop_pipe[2]; /* writing a byte to [1] wakes the thread and makes it exit */
  int port;
  char url[64];
  char *log_path;
  FILE *log; /* written by the server thread only */
  pthread_t thread;

  pthread_mutex_t mu; /* guards everything below */
  reply_copy *script;
  size_t script_len, script_next;
  reply_copy dflt;
  cph_httpd_handler handler; /* answers instead of dflt when set */
  void *handler_ctx;
  size_t count;
};

static void die(const char *what) {
  fprintf(stderr, "httpd_double: %s: %s\n", what, strerror(errno));
  abort();
}

static char *xstrdup(const char *s) {
  char *p = strdup(s ? s : "");
  if (!p)
    die("strdup");
  return p;
}

/* ---------------------------------------------------------------- I/O with stop and timeout */

/* Waits until fd is ready for events or the stop pipe fires. 1 = ready, 0 = timed out,
 * -1 = stopping (or poll failed). */
static int wait_fd(cph_httpd *d, int fd, short events, int timeout_ms) {
  struct pollfd p[2] = {{fd, events, 0}, {d->stop_pipe[0], POLLIN, 0}};
  int n;
  while ((n = poll(p, 2, timeout_ms)) < 0 && errno == EINTR)
    ;
  if (n < 0 || p[1].revents)
    return -1;
  return n > 0 ? 1 : 0;
}

/* 10 ms, or less if stop is requested. False when stopping. */
static bool sleep_briefly(cph_httpd *d) {
  struct pollfd p = {d->stop_pipe[0], POLLIN, 0};
  int n;
  while ((n = poll(&p, 1, 10)) < 0 && errno == EINTR)
    ;
  return n == 0;
}

/* Holds an answer back for ms. False when stopping or when the client hung up meanwhile
 * (a client that timed out is not kept waiting for, so the next request is served at once). */
static bool delay(cph_httpd *d, int fd, int ms) {
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    long spent = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (spent >= ms)
      return true;
    int r = wait_fd(d, fd, POLLIN, (int)(ms - spent));
    if (r < 0)
      return false;
    if (r > 0) {
      char c;
      ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        return false; /* hung up */
      if (n > 0 && !sleep_briefly(d))
        return false; /* pipelined bytes: ignore them, but do not spin */
    }
  }
}

static bool send_all(cph_httpd *d, int fd, const char *data, size_t len) {
  while (len > 0) {
    if (wait_fd(d, fd, POLLOUT, IO_TIMEOUT_MS) != 1)
      return false;
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data += n;
    len -= (size_t)n;
  }
  return true;
}

/* ---------------------------------------------------------------- one request */

typedef struct request {
  char *buf; /* head (NUL-terminated at the blank line) then body */
  size_t cap, len;
  size_t head_len; /* bytes up to and including the blank line */
  size_t body_len;
} request;

/* Reads a request head and its Content-Length body. False on a broken or stalled client. */
static bool read_request(cph_httpd *d, int fd, request *r) {
  r->cap = 4096;
  r->len = r->head_len = r->body_len = 0;
  if (!(r->buf = malloc(r->cap)))
    die("malloc");
  size_t need = 0; /* total bytes wanted once the head is known */
  for (;;) {
    if (r->head_len == 0) {
      char *end = r->len >= 4 ? memmem(r->buf, r->len, "\r\n\r\n", 4) : NULL;
      if (end) {
        r->head_len = (size_t)(end - r->buf) + 4;
        /* Content-Length, case-insensitively, at a line start. */
        for (char *line = r->buf; line < r->buf + r->head_len;) {
          char *eol = memmem(line, (size_t)(r->buf + r->head_len - line), "\r\n", 2);
          if (!eol)
            break;
          if (strncasecmp(line, "Content-Length:", 15) == 0)
            r->body_len = strtoul(line + 15, NULL, 10);
          line = eol + 2;
        }
        if (r->body_len > MAX_BODY)
          return false;
        need = r->head_len + r->body_len;
      } else if (r->len > MAX_HEAD) {
        return false;
      }
    }
    if (r->head_len && r->len >= need)
      return true;
    if (r->len + 4096 + 1 > r->cap) {
      size_t ncap = r->cap * 2 > need + 1 ? r->cap * 2 : need + 1;
      char *nb = realloc(r->buf, ncap);
      if (!nb)
        die("realloc");
      r->buf = nb;
      r->cap = ncap;
    }
    if (wait_fd(d, fd, POLLIN, IO_TIMEOUT_MS) != 1)
      return false;
    ssize_t n = recv(fd, r->buf + r->len, r->cap - r->len - 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    r->len += (size_t)n;
  }
}

/* Appends the record of r to the log (format in the header) and flushes it. */
static void record(cph_httpd *d, const request *r) {
  const char *head = r->buf;
  size_t line_len = strcspn(head, "\r\n");
  char method[32] = "", target[2048] = "";
  sscanf(head, "%31s %2047s", method, target);
  fprintf(d->log, "> %s %s %zu\n", method, target, r->body_len);
  /* Header lines, CRLF turned into LF. */
  const char *p = head + line_len + 2, *end = head + r->head_len - 2;
  while (p < end) {
    const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
    if (!eol)
      eol = end;
    fprintf(d->log, "%.*s\n", (int)(eol - p), p);
    p = eol + 2;
  }
  fputc('\n', d->log);
  fwrite(r->buf + r->head_len, 1, r->body_len, d->log);
  fputc('\n', d->log);
  if (fflush(d->log) != 0)
    die("writing the request log");
}

static const char *reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 201: return "Created";
  case 204: return "No Content";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 429: return "Too Many Requests";
  case 500: return "Internal Server Error";
  case 503: return "Service Unavailable";
  default: return "Status";
  }
}

static void serve(cph_httpd *d, int fd) {
  request r = {0};
  if (!read_request(d, fd, &r)) {
    free(r.buf);
    return;
  }
  record(d, &r);

  reply_copy rep;
  pthread_mutex_lock(&d->mu);
  d->count++;
  bool scripted = d->script_next < d->script_len;
  const reply_copy *src = scripted ? &d->script[d->script_next++] : &d->dflt;
  rep.status = src->status;
  rep.delay_ms = src->delay_ms;
  rep.body = scripted || !d->handler ? xstrdup(src->body) : NULL;
  cph_httpd_handler fn = scripted ? NULL : d->handler;
  void *ctx = d->handler_ctx;
  pthread_mutex_unlock(&d->mu);
  if (fn) {
    char method[32] = "", target[2048] = "";
    sscanf(r.buf, "%31s %2047s", method, target);
    cph_httpd_reply out = {200, NULL, 0};
    char *body = r.buf + r.head_len;
    body[r.body_len] = '\0'; /* read_request leaves a byte spare */
    fn(method, target, body, r.body_len, ctx, &out);
    rep = (reply_copy){out.status, (char *)out.body, out.delay_ms};
    if (!rep.body)
      rep.body = xstrdup("");
  }
  free(r.buf);

  if (rep.delay_ms > 0 && !delay(d, fd, rep.delay_ms)) {
    free(rep.body);
    return;
  }
  if (rep.status > 0) {
    char head[256];
    size_t blen = strlen(rep.body);
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     rep.status, reason(rep.status), blen);
    if (send_all(d, fd, head, (size_t)n))
      send_all(d, fd, rep.body, blen);
  }
  free(rep.body);
}

static void *server_main(void *arg) {
  cph_httpd *d = arg;
  for (;;) {
    int ready = wait_fd(d, d->listen_fd, POLLIN, -1);
    if (ready < 0)
      break;
    int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    serve(d, fd);
    close(fd);
  }
  return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

cph_httpd *cph_httpd_start(void) {
  cph_httpd *d = calloc(1, sizeof *d);
  if (!d)
    die("calloc");
  d->dflt.status = 200;
  d->dflt.body = xstrdup("{}");
  pthread_mutex_init(&d->mu, NULL);

  if (pipe2(d->stop_pipe, O_CLOEXEC) != 0)
    die("pipe");
  d->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (d->listen_fd < 0)
    die("socket");
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (bind(d->listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      listen(d->listen_fd, 64) != 0 ||
      getsockname(d->listen_fd, (struct sockaddr *)&addr, &alen) != 0)
    die("listen on 127.0.0.1:0");
  d->port = ntohs(addr.sin_port);
  snprintf(d->url, sizeof d->url, "http://127.0.0.1:%d", d->port);

  const char *tmp = getenv("TMPDIR");
  if (asprintf(&d->log_path, "%s/cph-httpd-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0)
    die("asprintf");
  int lfd = mkstemp(d->log_path);
  if (lfd < 0 || !(d->log = fdopen(lfd, "w")))
    die("the request log");

  if ((errno = pthread_create(&d->thread, NULL, server_main, d)) != 0)
    die("pthread_create");
  return d;
}

static void free_script(cph_httpd *d) {
  for (size_t i = 0; i < d->script_len; i++)
    free(d->script[i].body);
  free(d->script);
  d->script = NULL;
  d->script_len = d->script_next = 0;
}

void cph_httpd_stop(cph_httpd *d) {
  if (!d)
    return;
  char b = 1;
  while (write(d->stop_pipe[1], &b, 1) < 0 && errno == EINTR)
    ;
  pthread_join(d->thread, NULL);
  close(d->listen_fd);
  close(d->stop_pipe[0]);
  close(d->stop_pipe[1]);
  fclose(d->log);
  unlink(d->log_path);
  free(d->log_path);
  free_script(d);
  free(d->dflt.body);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

int cph_httpd_port(const cph_httpd *d) { return d->port; }
const char *cph_httpd_url(const cph_httpd *d) { return d->url; }
const char *cph_httpd_log_path(const cph_httpd *d) { return d->log_path; }

void cph_httpd_script(cph_httpd *d, const cph_httpd_reply *replies, size_t n) {
  reply_copy *copy = n ? calloc(n, sizeof *copy) : NULL;
  if (n && !copy)
    die("calloc");
  for (size_t i = 0; i < n; i++)
    copy[i] = (reply_copy){replies[i].status, xstrdup(replies[i].body), replies[i].delay_ms};
  pthread_mutex_lock(&d->mu);
  free_script(d);
  d->script = copy;
  d->script_len = n;
  pthread_mutex_unlock(&d->mu);
}

void cph_httpd_set_default(cph_httpd *d, cph_httpd_reply reply) {
  char *body = xstrdup(reply.body);
  pthread_mutex_lock(&d->mu);
  free(d->dflt.body);
  d->dflt = (reply_copy){reply.status, body, reply.delay_ms};
  pthread_mutex_unlock(&d->mu);
}

void cph_httpd_set_handler(cph_httpd *d, cph_httpd_handler fn, void *ctx) {
  pthread_mutex_lock(&d->mu);
  d->handler = fn;
  d->handler_ctx = ctx;
  pthread_mutex_unlock(&d->mu);
}

size_t cph_httpd_count(cph_httpd *d) {
  pthread_mutex_lock(&d->mu);
  size_t n = d->count;
  pthread_mutex_unlock(&d->mu);
  return n;
}

/* ---------------------------------------------------------------- reading the log back */

static char *read_log(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *buf = NULL;
  size_t cap = 0;
  *len = 0;
  for (;;) {
    if (cap - *len < 4096) {
      char *nb = realloc(buf, cap = cap ? cap * 2 : 8192);
      if (!nb)
        die("realloc");
      buf = nb;
    }
    size_t got = fread(buf + *len, 1, cap - *len - 1, f);
    *len += got;
    if (got == 0)
      break;
  }
  fclose(f);
  buf[*len] = '\0';
  return buf;
}

static char *dup_range(const char *p, size_t n) {
  char *s = malloc(n + 1);
  if (!s)
    die("malloc");
  memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

bool cph_httpd_request_at(cph_httpd *d, size_t i, cph_httpd_request *out) {
  memset(out, 0, sizeof *out);
  size_t len;
  char *log = read_log(d->log_path, &len);
  if (!log)
    return false;
  bool found = false;
  const char *p = log, *end = log + len;
  for (size_t k = 0; p < end; k++) {
    char method[32], target[2048];
    size_t blen;
    if (sscanf(p, "> %31s %2047s %zu", method, target, &blen) != 3)
      break;
    /* hdr ends the record line; blank is the '\n' just before the empty line. */
    const char *hdr = strchr(p, '\n'), *blank = NULL;
    if (hdr)
      blank = hdr[1] == '\n' ? hdr /* no headers */ : strstr(hdr + 1, "\n\n");
    if (!blank || blank + 2 + blen + 1 > end)
      break;
    const char *body = blank + 2;
    if (k == i) {
      out->method = xstrdup(method);
      out->path = xstrdup(target);
      out->headers = dup_range(hdr + 1, (size_t)(blank + 1 - (hdr + 1)));
      out->body = dup_range(body, blen);
      out->body_len = blen;
      found = true;
      break;
    }
    p = body + blen + 1;
  }
  free(log);
  return found;
}

bool cph_httpd_request_header(const cph_httpd_request *r, const char *name, char *buf,
                              size_t len) {
  size_t nlen = strlen(name);
  for (const char *line = r->headers; line && *line;) {
    const char *eol = strchr(line, '\n');
    size_t llen = eol ? (size_t)(eol - line) : strlen(line);
    if (llen > nlen && line[nlen] == ':' && strncasecmp(line, name, nlen) == 0) {
      const char *v = line + nlen + 1;
      while (*v == ' ' || *v == '\t')
        v++;
      snprintf(buf, len, "%.*s", (int)(line + llen - v), v);
      return true;
    }
    line = eol ? eol + 1 : line + llen;
  }
  return false;
}

void cph_httpd_request_free(cph_httpd_request *r) {
  free(r->method);
  free(r->path);
  free(r->headers);
  free(r->body);
  memset(r, 0, sizeof *r);
}
