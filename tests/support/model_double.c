/* The model endpoint double (see model_double.h): an accept thread, a thread per connection,
 * optional TLS through OpenSSL's SSL_* API. */
#define _GNU_SOURCE
#include "model_double.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEAD 65536
#define MAX_BODY (16u << 20)
#define MAX_CONNS 256

typedef struct conn {
  struct cph_md *m;
  int fd;
  SSL *ssl;
  pthread_t thread;
  atomic_bool done;
} conn;

struct cph_md {
  int listen_fd;
  int port;
  char url[64];
  cph_md_handler handler;
  void *arg;
  SSL_CTX *tls;
  pthread_t acceptor;
  atomic_bool stop;
  pthread_mutex_t mu; /* conns, count */
  conn *conns[MAX_CONNS];
  size_t n_conns;
  size_t count;
  size_t accepted;
};

static void die(const char *what) {
  fprintf(stderr, "model_double: %s: %s\n", what, strerror(errno));
  abort();
}

/* ---------------------------------------------------------------- I/O */

/* Waits for fd to be readable: 1 ready, 0 stop asked, -1 hung up or error. Bytes already
 * buffered by TLS count as readable. */
static int wait_readable(conn *c, int timeout_ms) {
  if (c->ssl && SSL_pending(c->ssl) > 0)
    return 1;
  for (int waited = 0; timeout_ms < 0 || waited < timeout_ms; waited += 100) {
    if (atomic_load(&c->m->stop))
      return 0;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r > 0)
      return (p.revents & (POLLIN | POLLHUP | POLLERR)) ? 1 : -1;
    if (r < 0 && errno != EINTR)
      return -1;
  }
  return 0;
}

static ssize_t conn_read(conn *c, char *buf, size_t len) {
  if (wait_readable(c, -1) != 1)
    return -1;
  if (c->ssl) {
    int n = SSL_read(c->ssl, buf, (int)len);
    return n > 0 ? n : -1;
  }
  ssize_t n = recv(c->fd, buf, len, 0);
  return n > 0 ? n : -1;
}

static int conn_write(conn *c, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = c->ssl ? SSL_write(c->ssl, buf, (int)len) : send(c->fd, buf, len, MSG_NOSIGNAL);
    if (n <= 0)
      return -1;
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Sleeps delay_ms unless stop is asked or the client hangs up (then -1). */
static int hold_back(conn *c, int delay_ms) {
  for (int waited = 0; waited < delay_ms; waited += 50) {
    if (atomic_load(&c->m->stop))
      return -1;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 50) > 0) {
      char b;
      if (p.revents & (POLLHUP | POLLERR))
        return -1;
      if (!c->ssl && recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
        return -1;
      if (c->ssl) /* TLS bytes: a close_notify or the next request; either way, wait */
        usleep(50000);
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- one connection */

static const char *reason(int status) {
  switch (status) {
  case 200: return "OK";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 429: return "Too Many Requests";
  case 500: return "Internal Server Error";
  case 503: return "Service Unavailable";
  default: return "Status";
  }
}

static void *conn_main(void *arg) {
  conn *c = arg;
  cph_md *m = c->m;
  if (m->tls) {
    c->ssl = SSL_new(m->tls);
    SSL_set_fd(c->ssl, c->fd);
    if (SSL_accept(c->ssl) != 1) { /* e.g. the client refused our certificate */
      ERR_clear_error();
      goto out;
    }
  }
  char *buf = malloc(MAX_HEAD + 1);
  size_t have = 0;
  if (!buf)
    die("malloc");
  for (;;) {
    char *end = NULL;
    while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
      if (have >= MAX_HEAD)
        goto done;
      ssize_t n = conn_read(c, buf + have, MAX_HEAD - have);
      if (n <= 0)
        goto done;
      have += (size_t)n;
    }
    size_t head_len = (size_t)(end - buf) + 4;
    buf[head_len - 2] = '\0';
    char method[16] = "", path[1024] = "";
    sscanf(buf, "%15s %1023s", method, path);
    const char *headers = strstr(buf, "\r\n") ? strstr(buf, "\r\n") + 2 : "";
    size_t body_len = 0;
    for (const char *h = headers; *h; h = strstr(h, "\r\n") ? strstr(h, "\r\n") + 2 : "") {
      if (strncasecmp(h, "Content-Length:", 15) == 0)
        body_len = strtoul(h + 15, NULL, 10);
      if (!strstr(h, "\r\n"))
        break;
    }
    if (body_len > MAX_BODY)
      goto done;
    char *body = malloc(body_len + 1);
    if (!body)
      die("malloc");
    size_t got = have - head_len < body_len ? have - head_len : body_len;
    memcpy(body, buf + head_len, got);
    size_t extra = have - head_len - got; /* a pipelined next request */
    while (got < body_len) {
      ssize_t n = conn_read(c, body + got, body_len - got);
      if (n <= 0) {
        free(body);
        goto done;
      }
      got += (size_t)n;
    }
    body[body_len] = '\0';
    char *hcopy = strdup(headers);
    memmove(buf, buf + head_len + (have - head_len - extra), extra);
    have = extra;

    pthread_mutex_lock(&m->mu);
    m->count++;
    pthread_mutex_unlock(&m->mu);
    cph_md_request rq = {.method = method, .path = path, .headers = hcopy, .body = body,
                         .body_len = body_len,
                         .json = body_len ? json_loadb(body, body_len, 0, NULL) : NULL};
    cph_md_answer a = {.status = 200};
    m->handler(m->arg, &rq, &a);
    json_decref(rq.json);
    free(body);
    free(hcopy);
    int ok = a.status > 0 && hold_back(c, a.delay_ms) == 0;
    if (ok) {
      size_t blen = a.body ? strlen(a.body) : 0;
      char head[256];
      int hl = snprintf(head, sizeof head,
                        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\n\r\n",
                        a.status, reason(a.status), blen);
      ok = conn_write(c, head, (size_t)hl) == 0 && conn_write(c, a.body ? a.body : "", blen) == 0;
    }
    free(a.body);
    if (!ok)
      break;
  }
done:
  free(buf);
out:
  if (c->ssl) {
    SSL_shutdown(c->ssl);
    SSL_free(c->ssl);
    c->ssl = NULL;
  }
  shutdown(c->fd, SHUT_RDWR);
  atomic_store(&c->done, true);
  return NULL;
}

/* ---------------------------------------------------------------- server */

/* Joins and frees finished connections. Called with m->mu. */
static void reap(cph_md *m, bool all) {
  size_t kept = 0;
  for (size_t i = 0; i < m->n_conns; i++) {
    conn *c = m->conns[i];
    if (all || atomic_load(&c->done)) {
      pthread_join(c->thread, NULL);
      close(c->fd);
      free(c);
    } else {
      m->conns[kept++] = c;
    }
  }
  m->n_conns = kept;
}

static void *accept_main(void *arg) {
  cph_md *m = arg;
  while (!atomic_load(&m->stop)) {
    struct pollfd p = {.fd = m->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0)
      continue;
    int fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    pthread_mutex_lock(&m->mu);
    reap(m, false);
    if (m->n_conns == MAX_CONNS) {
      pthread_mutex_unlock(&m->mu);
      close(fd);
      continue;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c)
      die("calloc");
    c->m = m;
    c->fd = fd;
    atomic_init(&c->done, false);
    if (pthread_create(&c->thread, NULL, conn_main, c) != 0)
      die("pthread_create");
    m->conns[m->n_conns++] = c;
    m->accepted++;
    pthread_mutex_unlock(&m->mu);
  }
  return NULL;
}

cph_md *cph_md_start(cph_md_handler handler, void *arg, const char *cert_pem,
                     const char *key_pem) {
  cph_md *m = calloc(1, sizeof *m);
  if (!m)
    die("calloc");
  m->handler = handler;
  m->arg = arg;
  atomic_init(&m->stop, false);
  pthread_mutex_init(&m->mu, NULL);
  if (cert_pem) {
    m->tls = SSL_CTX_new(TLS_server_method());
    if (!m->tls || SSL_CTX_use_certificate_chain_file(m->tls, cert_pem) != 1 ||
        SSL_CTX_use_PrivateKey_file(m->tls, key_pem, SSL_FILETYPE_PEM) != 1) {
      ERR_print_errors_fp(stderr);
      die("TLS setup");
    }
  }
  m->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (m->listen_fd < 0)
    die("socket");
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  if (bind(m->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(m->listen_fd, 128) != 0 ||
      getsockname(m->listen_fd, (struct sockaddr *)&sa, &sl) != 0)
    die("bind/listen");
  m->port = ntohs(sa.sin_port);
  snprintf(m->url, sizeof m->url, "%s://127.0.0.1:%d", cert_pem ? "https" : "http", m->port);
  if (pthread_create(&m->acceptor, NULL, accept_main, m) != 0)
    die("pthread_create");
  return m;
}

void cph_md_stop(cph_md *m) {
  if (!m)
    return;
  atomic_store(&m->stop, true);
  pthread_join(m->acceptor, NULL);
  pthread_mutex_lock(&m->mu);
  reap(m, true);
  pthread_mutex_unlock(&m->mu);
  close(m->listen_fd);
  if (m->tls)
    SSL_CTX_free(m->tls);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

int cph_md_port(const cph_md *m) { return m->port; }
const char *cph_md_url(const cph_md *m) { return m->url; }

size_t cph_md_count(cph_md *m) {
  pthread_mutex_lock(&m->mu);
  size_t n = m->count;
  pthread_mutex_unlock(&m->mu);
  return n;
}

size_t cph_md_connections(cph_md *m) {
  pthread_mutex_lock(&m->mu);
  size_t n = m->accepted;
  pthread_mutex_unlock(&m->mu);
  return n;
}

/* ---------------------------------------------------------------- bodies */

static char *dump(json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s)
    die("json_dumps");
  return s;
}

static json_t *usage(int total) {
  int prompt = total / 2;
  return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens",
                   total - prompt, "total_tokens", total);
}

char *cph_md_chat_text(const char *content, int total_tokens) {
  return dump(json_pack("{s:s, s:s, s:i, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], s:o}", "id",
                        "chatcmpl-test", "object", "chat.completion", "created", 1, "model",
                        "test-model", "choices", "index", 0, "message", "role", "assistant",
                        "content", content, "finish_reason", "stop", "usage",
                        usage(total_tokens)));
}

char *cph_md_chat_tool_call(const char *call_id, const char *tool, const char *arguments,
                            int total_tokens) {
  return dump(json_pack(
      "{s:s, s:s, s:i, s:s, s:[{s:i, s:{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}, s:s}], s:o}",
      "id", "chatcmpl-test", "object", "chat.completion", "created", 1, "model", "test-model",
      "choices", "index", 0, "message", "role", "assistant", "content", "tool_calls", "id",
      call_id, "type", "function", "function", "name", tool, "arguments", arguments,
      "finish_reason", "tool_calls", "usage", usage(total_tokens)));
}

char *cph_md_error_body(const char *message) {
  return dump(json_pack("{s:{s:s, s:s}}", "error", "message", message, "type", "server_error"));
}

bool cph_md_header(const cph_md_request *rq, const char *name, char *buf, size_t len) {
  size_t n = strlen(name);
  for (const char *h = rq->headers; h && *h;) {
    const char *eol = strstr(h, "\r\n");
    if (strncasecmp(h, name, n) == 0 && h[n] == ':') {
      const char *v = h + n + 1;
      while (*v == ' ')
        v++;
      size_t vl = eol ? (size_t)(eol - v) : strlen(v);
      snprintf(buf, len, "%.*s", (int)vl, v);
      return true;
    }
    if (!eol)
      break;
    h = eol + 2;
  }
  return false;
}

void cph_md_make_cert(const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 "
           "-addext subjectAltName=IP:127.0.0.1 -keyout '%s/key.pem' -out '%s/cert.pem' "
           ">/dev/null 2>&1",
           dir, dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "model_double: openssl could not make a certificate\n");
    abort();
  }
}
