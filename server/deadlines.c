/* Deadlines for clients that send slowly: see deadlines.h for the contract. */
#include "deadlines.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "server.h"

/* Drops logged at info per second; the rest at debug, and their number at info with the
 * next drop after that second (a flood of trickling clients must not flood the log; the
 * metric counts them all). */
#define DROP_LOG_PER_S 10
/* At most this much unread input is discarded before closing a dropped connection. Closing
 * a socket with unread input makes the kernel send a reset, which can destroy the 408 before
 * the client reads it; a trickling client has next to nothing queued. */
#define DRAIN_MAX_BYTES (64 * 1024)
/* The most one read or write of a connection moves (see cph_deadlines_bevcb). */
#define IO_CHUNK_MAX (1024 * 1024)

typedef enum conn_phase {
  PHASE_HEAD,    /* reading the request head: its deadline runs */
  PHASE_BODY,    /* the head ended, reading the body: its deadline runs */
  PHASE_ROUTED,  /* the request was read whole; until its answer is written: no deadline */
  PHASE_IDLE,    /* kept alive after an answer, no byte of the next request yet: no deadline */
} conn_phase;

typedef struct conn conn;

/* One accepted connection. Owned by this module; freed when evhttp closes the connection
 * (on_close), or at registration when evhttp already dropped it. */
struct conn {
  cph_deadlines *d;
  struct bufferevent *bev;
  struct evhttp_connection *evcon; /* NULL until registered */
  evutil_socket_t fd;              /* -1 until registered */
  struct evbuffer_cb_entry *in_cb, *out_cb;
  struct event *timer;
  conn_phase phase;
  int64_t started_ns; /* when the running phase's clock started */
  int64_t limit_s;    /* the running phase's timeout, read from the policy at its start */
  /* The head scanner: bytes in the current line (CR not counted) and whether a non-empty
   * line was seen, so the empty line after one ends the head. */
  size_t line_len;
  bool had_line;
  conn *next_pending; /* the registration list */
};

struct cph_deadlines {
  cph_srv *srv;
  struct event *ev_register; /* activated by the bevcb: registers the pending conns */
  conn *pending;             /* made by the bevcb, not yet registered */
  conn **by_fd;              /* registered conns by socket (sockets are small integers) */
  size_t by_fd_cap;
  uint64_t dropped_header, dropped_body;
  int64_t log_window_ns; /* the second DROP_LOG_PER_S counts in */
  unsigned logged_in_window;
};

static int64_t now_ns(const cph_deadlines *d) { return cph_clock_now(&d->srv->clock); }

static const cph_policy_server *policy(const cph_deadlines *d) {
  return &cph_engine_policy(d->srv->engine)->server;
}

/* ================================================================ phases */

static void disarm(conn *c) { evtimer_del(c->timer); }

/* Starts the clock of the head or the body at started_ns. */
static void start_phase(conn *c, conn_phase phase, int64_t started_ns) {
  c->phase = phase;
  c->started_ns = started_ns;
  c->limit_s = phase == PHASE_HEAD ? policy(c->d)->header_timeout_seconds
                                   : policy(c->d)->body_timeout_seconds;
  int64_t left = started_ns + c->limit_s * CPH_NS_PER_S - now_ns(c->d);
  if (left < 0)
    left = 0;
  int64_t us = (left + 999) / 1000; /* never fire before the deadline */
  struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
  evtimer_add(c->timer, &tv);
}

/* A new request begins (a connection accepted, or the next one on a kept-alive connection):
 * the scanner looks for a fresh head. */
static void reset_scanner(conn *c) {
  c->line_len = 0;
  c->had_line = false;
}

/* Feeds n bytes of the head to the scanner; true when they hold the head's end. evhttp
 * ends a line at LF or CRLF, so an empty line after a non-empty one ends the head (leading
 * empty lines are evhttp's to reject). */
static bool scan_head(conn *c, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\n') {
      if (c->line_len == 0 && c->had_line)
        return true;
      if (c->line_len > 0)
        c->had_line = true;
      c->line_len = 0;
    } else if (p[i] != '\r') {
      c->line_len++;
    }
  }
  return false;
}

/* Scans input from offset on while the head is being read; the head's end starts the body. */
static void scan_input(conn *c, struct evbuffer *in, size_t offset) {
  size_t len = evbuffer_get_length(in);
  while (c->phase == PHASE_HEAD && offset < len) {
    unsigned char chunk[1024];
    struct evbuffer_ptr pos;
    if (evbuffer_ptr_set(in, &pos, offset, EVBUFFER_PTR_SET) != 0)
      return;
    ev_ssize_t n = evbuffer_copyout_from(in, &pos, chunk, sizeof chunk);
    if (n <= 0)
      return;
    offset += (size_t)n;
    if (scan_head(c, chunk, (size_t)n))
      start_phase(c, PHASE_BODY, now_ns(c->d));
  }
}

/* Input buffer callback: bytes read from the client (or consumed by evhttp's parser, which
 * changes nothing here). */
static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg) {
  conn *c = arg;
  if (info->n_added == 0)
    return;
  if (c->phase == PHASE_IDLE) { /* the first byte of the next request on a kept-alive one */
    reset_scanner(c);
    start_phase(c, PHASE_HEAD, now_ns(c->d));
  }
  /* While ROUTED, bytes that arrive as the answer is written belong to the next request:
   * on_output scans them once the answer is out. */
  if (c->phase == PHASE_HEAD)
    scan_input(c, in, evbuffer_get_length(in) - info->n_added);
}

/* Output buffer callback: once a routed request's answer is written whole (the buffer runs
 * empty: evhttp writes an answer in one piece), the connection waits for the next request. */
static void on_output(struct evbuffer *out, const struct evbuffer_cb_info *info, void *arg) {
  conn *c = arg;
  if (c->phase != PHASE_ROUTED || info->n_deleted == 0 || evbuffer_get_length(out) > 0)
    return;
  c->phase = PHASE_IDLE;
  struct evbuffer *in = bufferevent_get_input(c->bev);
  if (evbuffer_get_length(in) > 0) { /* the next request was already waiting (pipelined) */
    reset_scanner(c);
    start_phase(c, PHASE_HEAD, now_ns(c->d));
    scan_input(c, in, 0);
  }
}

/* ================================================================ dropping */

static const char *phase_name(conn_phase p) { return p == PHASE_HEAD ? "header" : "body"; }

/* The 408 of a body that ran out, written straight to the socket: evhttp has no request to
 * answer yet. Best effort: the client may not read it, and nothing else is queued (skipped
 * when something is, e.g. a 100 Continue still unwritten). */
static void send_408(conn *c) {
  if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
    return;
  char body[256], msg[512];
  int blen = snprintf(body, sizeof body,
                      "{\"error\":{\"code\":\"request_timeout\",\"message\":\"the request body "
                      "did not arrive within :server :body-timeout-seconds (%lld s)\","
                      "\"field\":null}}\n",
                      (long long)c->limit_s);
  int mlen = snprintf(msg, sizeof msg,
                      "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                      blen, body);
  if (blen > 0 && mlen > 0 && (size_t)mlen < sizeof msg)
    (void)!send(c->fd, msg, (size_t)mlen, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void drain_socket(evutil_socket_t fd) {
  char scratch[4096];
  for (size_t total = 0; total < DRAIN_MAX_BYTES;) {
    ssize_t n = recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
    if (n <= 0)
      return;
    total += (size_t)n;
  }
}

static void log_drop(cph_deadlines *d, conn *c) {
  int64_t now = now_ns(d);
  if (now - d->log_window_ns >= CPH_NS_PER_S) {
    if (d->logged_in_window > DROP_LOG_PER_S)
      cph_log_kv(CPH_LOG_INFO, "slow clients dropped", "more=%u",
                 d->logged_in_window - DROP_LOG_PER_S);
    d->log_window_ns = now;
    d->logged_in_window = 0;
  }
  cph_log_level level = d->logged_in_window++ < DROP_LOG_PER_S ? CPH_LOG_INFO : CPH_LOG_DEBUG;
  char *addr = NULL;
  ev_uint16_t port = 0;
  evhttp_connection_get_peer(c->evcon, &addr, &port);
  cph_log_kv(level, "slow client dropped", "peer=%s:%u phase=%s timeout_s=%lld",
             addr ? addr : "?", (unsigned)port, phase_name(c->phase), (long long)c->limit_s);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  conn *c = arg;
  cph_deadlines *d = c->d;
  if (c->phase != PHASE_HEAD && c->phase != PHASE_BODY)
    return; /* not reached: leaving those phases disarms the timer */
  log_drop(d, c);
  if (c->phase == PHASE_HEAD) {
    d->dropped_header++;
  } else {
    d->dropped_body++;
    send_408(c);
  }
  drain_socket(c->fd);
  /* Safe here: nothing of evhttp is on the stack. It calls on_close, which frees c and its
   * timer (the one running: libevent allows freeing a non-persistent event in its callback). */
  evhttp_connection_free(c->evcon);
}

/* ================================================================ connections */

static void conn_free(conn *c) {
  if (c->timer)
    event_free(c->timer);
  free(c);
}

/* evhttp is closing the connection (the client left, an error, a timeout, the answer had
 * Connection: close, a drop here, or evhttp_free): c goes with it. The bufferevent still
 * exists; its buffer callbacks are removed so nothing reaches the freed c. */
static void on_close(struct evhttp_connection *evcon, void *arg) {
  (void)evcon;
  conn *c = arg;
  cph_deadlines *d = c->d;
  if (c->in_cb)
    evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->in_cb);
  if (c->out_cb)
    evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->out_cb);
  if (c->fd >= 0 && (size_t)c->fd < d->by_fd_cap && d->by_fd[c->fd] == c)
    d->by_fd[c->fd] = NULL;
  conn_free(c);
}

static bool index_fd(cph_deadlines *d, conn *c) {
  if (c->fd < 0)
    return false;
  size_t fd = (size_t)c->fd;
  if (fd >= d->by_fd_cap) {
    size_t cap = d->by_fd_cap ? d->by_fd_cap : 256;
    while (cap <= fd)
      cap *= 2;
    conn **grown = realloc(d->by_fd, cap * sizeof *grown);
    if (!grown)
      return false;
    memset(grown + d->by_fd_cap, 0, (cap - d->by_fd_cap) * sizeof *grown);
    d->by_fd = grown;
    d->by_fd_cap = cap;
  }
  d->by_fd[fd] = c;
  return true;
}

/* Registers one conn made by the bevcb, once evhttp has set its connection up. evhttp sets
 * its callbacks on the bufferevent with the connection as their argument, and clears them
 * when it frees it (the reference taken in the bevcb keeps the memory until here). */
static void register_conn(cph_deadlines *d, conn *c) {
  bufferevent_event_cb eventcb = NULL;
  void *evcon = NULL;
  bufferevent_getcb(c->bev, NULL, NULL, &eventcb, &evcon);
  if (!eventcb || !evcon) { /* evhttp refused the connection (out of memory) */
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_decref(c->bev);
    conn_free(c);
    return;
  }
  c->evcon = evcon;
  c->fd = bufferevent_getfd(c->bev);
  c->in_cb = evbuffer_add_cb(bufferevent_get_input(c->bev), on_input, c);
  c->out_cb = evbuffer_add_cb(bufferevent_get_output(c->bev), on_output, c);
  if (!c->in_cb || !c->out_cb || !index_fd(d, c)) {
    /* Without its callbacks a deadline could cut a routed request: refuse the connection
     * (on_close, through evhttp_connection_free, frees c). */
    cph_warn("out of memory tracking a connection's deadlines; closing it");
    bufferevent_decref(c->bev);
    evhttp_connection_set_closecb(c->evcon, on_close, c);
    evhttp_connection_free(c->evcon);
    return;
  }
  evhttp_connection_set_closecb(c->evcon, on_close, c);
  bufferevent_decref(c->bev); /* evhttp's own reference keeps it from here */
  /* the head's clock started at the accept (started_ns, set by the bevcb) */
  start_phase(c, PHASE_HEAD, c->started_ns);
  scan_input(c, bufferevent_get_input(c->bev), 0);
}

static void register_pending(cph_deadlines *d) {
  while (d->pending) {
    conn *c = d->pending;
    d->pending = c->next_pending;
    c->next_pending = NULL;
    register_conn(d, c);
  }
}

/* Activated by the bevcb, so it runs in the same loop iteration as the accept, after evhttp
 * finished setting the connection up and before the loop polls for its first bytes. */
static void on_register(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  register_pending(arg);
}

struct bufferevent *cph_deadlines_bevcb(struct event_base *base, void *arg) {
  cph_deadlines *d = arg;
  conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->d = d;
  c->fd = -1;
  c->phase = PHASE_HEAD;
  c->started_ns = now_ns(d);
  c->timer = evtimer_new(base, on_deadline, c);
  /* Options 0, as evhttp's own: evhttp closes the socket itself. */
  c->bev = c->timer ? bufferevent_socket_new(base, -1, 0) : NULL;
  if (!c->bev) {
    conn_free(c);
    return NULL;
  }
  /* libevent writes at most 16 KiB per readiness by default: a 70 KB lease answer went out
   * in five writes, each a wake-up of the client and a trip through the loop with the write
   * event armed again. A whole answer now moves in one call when the socket takes it. Reads
   * stay 4 KiB a round whatever this says: libevent 2.1's evbuffer_read takes at most
   * EVBUFFER_MAX_READ (4096) bytes a call (strace of `cephalon-bench ingest`: every readv of
   * a 1,000-event request of ~115 KB returns 4096), so such a request takes some thirty
   * reads, one a loop round; the cap here only matters with a libevent that lifts that one. */
  bufferevent_set_max_single_write(c->bev, IO_CHUNK_MAX);
  bufferevent_set_max_single_read(c->bev, IO_CHUNK_MAX);
  bufferevent_incref(c->bev); /* dropped in register_conn */
  c->next_pending = d->pending;
  d->pending = c;
  event_active(d->ev_register, EV_TIMEOUT, 0);
  return c->bev;
}

void cph_deadlines_dispatched(cph_deadlines *d, struct evhttp_request *ev) {
  if (d->pending) /* cannot happen (see on_register); cheap insurance */
    register_pending(d);
  struct evhttp_connection *evcon = evhttp_request_get_connection(ev);
  struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
  evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
  if (fd < 0 || (size_t)fd >= d->by_fd_cap)
    return;
  conn *c = d->by_fd[fd];
  if (!c || c->evcon != evcon)
    return;
  disarm(c);
  c->phase = PHASE_ROUTED;
}

/* ================================================================ lifetime and metrics */

cph_deadlines *cph_deadlines_new(cph_srv *s) {
  cph_deadlines *d = calloc(1, sizeof *d);
  if (!d)
    return NULL;
  d->srv = s;
  d->ev_register = event_new(s->base, -1, 0, on_register, d);
  if (!d->ev_register) {
    free(d);
    return NULL;
  }
  return d;
}

void cph_deadlines_free(cph_deadlines *d) {
  if (!d)
    return;
  /* Connections still pending were accepted in the loop's last iteration; evhttp_free has
   * freed them (our reference kept the bufferevent). */
  while (d->pending) {
    conn *c = d->pending;
    d->pending = c->next_pending;
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_decref(c->bev);
    conn_free(c);
  }
  event_free(d->ev_register);
  free(d->by_fd);
  free(d);
}

int cph_deadlines_metrics(const cph_deadlines *d, cph_buf *out) {
  cph_buf_puts(out,
               "# HELP cephalon_http_timeouts_total Connections dropped because the client did "
               "not send its request head (phase header, :server :header-timeout-seconds) or "
               "body (phase body, :server :body-timeout-seconds) in time.\n"
               "# TYPE cephalon_http_timeouts_total counter\n");
  cph_buf_printf(out, "cephalon_http_timeouts_total{phase=\"header\"} %llu\n",
                 (unsigned long long)(d ? d->dropped_header : 0));
  cph_buf_printf(out, "cephalon_http_timeouts_total{phase=\"body\"} %llu\n",
                 (unsigned long long)(d ? d->dropped_body : 0));
  return cph_buf_error(out);
}
