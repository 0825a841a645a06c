#include "longpoll.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "request.h"

/* ---------------------------------------------------------------- the state */

cph_longpolls *cph_longpolls_new(struct event_base *base) {
  cph_longpolls *lp = calloc(1, sizeof *lp);
  if (lp)
    lp->base = base;
  return lp;
}

bool cph_longpolls_replies_waiting(const cph_longpolls *lp) { return lp && lp->repliers; }

/* ---------------------------------------------------------------- per-client cap */

typedef struct lp_client {
  char key[64]; /* peer address; the hmap key points here */
  int64_t open;
} lp_client;

bool cph_lp_acquire(cph_longpolls *lp, cph_req *r, int64_t cap) {
  lp_client *c = cph_hmap_get(&lp->clients, r->peer);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c)
      return false;
    snprintf(c->key, sizeof c->key, "%s", r->peer);
    if (cph_hmap_put(&lp->clients, c->key, c) != CPH_OK) {
      free(c);
      return false;
    }
  }
  if (c->open >= cap)
    return false;
  c->open++;
  r->lp_counted = true;
  return true;
}

void cph_lp_release(cph_longpolls *lp, cph_req *r) {
  if (!r->lp_counted)
    return;
  r->lp_counted = false;
  lp_client *c = cph_hmap_get(&lp->clients, r->peer);
  if (!c)
    return;
  if (--c->open <= 0) { /* forget idle clients: the map holds only clients that wait */
    cph_hmap_del(&lp->clients, c->key);
    free(c);
  }
}

void cph_longpolls_free(cph_longpolls *lp) {
  if (!lp)
    return;
  for (size_t i = 0; i < lp->clients.cap; i++)
    if (lp->clients.slots[i].key)
      free(lp->clients.slots[i].value);
  cph_hmap_free(&lp->clients);
  free(lp);
}

/* ---------------------------------------------------------------- lists */

void cph_lp_list_add(cph_req **head, cph_req *r, void (*stop)(cph_req *r)) {
  r->lp_stop = stop;
  r->lp_prev = NULL;
  r->lp_next = *head;
  if (*head)
    (*head)->lp_prev = r;
  *head = r;
  r->lp_listed = true;
}

void cph_lp_list_remove(cph_req **head, cph_req *r) {
  if (!r->lp_listed)
    return;
  if (r->lp_prev)
    r->lp_prev->lp_next = r->lp_next;
  else
    *head = r->lp_next;
  if (r->lp_next)
    r->lp_next->lp_prev = r->lp_prev;
  r->lp_prev = r->lp_next = NULL;
  r->lp_listed = false;
}

/* ---------------------------------------------------------------- client gone */

static void on_peer_readable(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  cph_req *r = arg;
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return;
  void (*gone)(cph_req *) = r->lp_gone;
  cph_lp_unwatch(r);
  if (n > 0) /* more requests behind this one: the client is alive; libevent reads them later */
    return;
  cph_debug("%s: client left a waiting %s", r->peer, r->route ? r->route->pattern : "request");
  if (gone)
    gone(r);
}

void cph_lp_watch(cph_longpolls *lp, cph_req *r, void (*gone)(cph_req *r)) {
  struct evhttp_connection *conn = r->ev ? evhttp_request_get_connection(r->ev) : NULL;
  struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
  evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
  if (fd < 0)
    return;
  r->lp_watch = event_new(lp->base, fd, EV_READ | EV_PERSIST, on_peer_readable, r);
  if (!r->lp_watch || event_add(r->lp_watch, NULL) != 0) {
    if (r->lp_watch)
      event_free(r->lp_watch);
    r->lp_watch = NULL;
    return; /* not fatal: the long-poll still ends at its deadline */
  }
  r->lp_gone = gone;
}

void cph_lp_unwatch(cph_req *r) {
  if (r->lp_watch) {
    event_free(r->lp_watch);
    r->lp_watch = NULL;
  }
  r->lp_gone = NULL;
}

void cph_lp_finish(cph_longpolls *lp, cph_req **head, cph_req *r) {
  cph_lp_list_remove(head, r);
  cph_lp_unwatch(r);
  cph_lp_release(lp, r);
  if (r->lp_timer) {
    event_free(r->lp_timer);
    r->lp_timer = NULL;
  }
}

/* ---------------------------------------------------------------- shutdown */

void cph_longpolls_stop(cph_longpolls *lp) {
  if (!lp)
    return;
  /* Each call removes r from its list (or leaves it waiting for its `done`, marked). */
  cph_req **lists[] = {&lp->leases, &lp->repliers};
  for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
    for (cph_req *r = *lists[i], *next; r; r = next) {
      next = r->lp_next;
      r->lp_stop(r);
    }
}
