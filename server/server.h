/* The daemon's shared state, owned by main.c and handed down to every other server file, and
 * the few operations on it those files may call (server.c; they never call main.c).
 *
 * One thread: everything here runs on the libevent loop of main.c. The engine is driven only
 * from that loop (cph_srv_schedule_pass), never from inside a route handler. */
#ifndef CEPHALON_SERVER_SERVER_H
#define CEPHALON_SERVER_SERVER_H

#include <event2/event.h>
#include <event2/http.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "wake.h"

typedef struct cph_srv cph_srv;
typedef struct cph_req cph_req;

struct cph_srv {
  struct cph_longpolls *lp;        /* longpoll.c */
  struct cph_maint_pool *maint;    /* maint_workers.c */
  struct cph_search_pool *search;  /* search_prep.c */
  struct cph_offload_pool *offload; /* offload.c: request work beside the loop */
  struct cph_backup *backup;       /* backup.c: the online backup, one at a time */
  struct cph_cluster *cluster;     /* cluster.c; NULL without :cluster (a single node) */
  struct cph_cflow *cflow;         /* clusterflow.c; NULL without :cluster :nats */
  struct cph_deadlines *deadlines; /* deadlines.c; NULL outside main.c (the fuzz harness) */
  struct event_base *base;
  struct evhttp *http;
  struct evhttp_bound_socket *bound; /* NULL once we stop accepting */
  cph_engine *engine;
  const char *policy_path;
  bool listen_loopback; /* decides whether a reload may drop :auth */
  bool log_level_fixed; /* --log-level given: reloads keep it */
  cph_clock clock;      /* monotonic; the engine's scale (lease deadlines) */
  /* Set by main.c before the first request: re-reads the --policy file (cph_srv_reload). */
  int (*reload)(cph_srv *s, cph_err *err);

  /* Driving the engine (main.c). */
  struct event *ev_pass;    /* zero-delay timer: one pass, coalesced */
  struct event *ev_tick;    /* :scheduler :tick-ms */
  struct event *ev_wakeup;  /* cph_engine_next_wakeup_ns */
  struct event *ev_sync;    /* :store :sync :batch */
  struct event *ev_replies; /* zero-delay timer: wake replies long-polls */
  /* The engine's flush thread signals it when a flush finished (cph_engine_hooks.flushed);
   * the loop then answers what became durable. */
  cph_wake flushed;
  bool pass_scheduled;
  bool replies_scheduled;
  uint64_t last_reply_seen; /* newest reply id when the replies long-polls last looked */
  int64_t tick_ms, sync_ms; /* what the timers are armed with */
  uint64_t passes;
  uint64_t pass_errors;

  /* The size of the last lease answer: the next one's buffer starts that big, so a 60 KB
   * turn is not written through a dozen reallocs and copies (routes_turns.c). */
  size_t lease_bytes_hint;

  /* Requests. */
  cph_req *reqs;    /* every live request */
  size_t open_reqs; /* dispatched and not yet answered */
  size_t unflushed; /* answered, reply not yet fully written */

  /* Shutdown. */
  bool stopping;
  bool flush_grace; /* only unflushed replies are left; the deadline was shortened */
  /* Set by clusterflow.c while copies, items or park marks it made wait for the cluster log
   * with no request waiting for them (cph_cflow_stop_begin): a stop waits for them too. */
  bool log_unsettled;
  struct event *ev_stop_deadline;
  struct event *ev_budget; /* cluster mode: the lanes' budget shares, every second */
};

/* ---- server.c ---- */

/* Schedules one engine pass soon (a zero-delay timer, so I/O is served in between); calls
 * coalesce while one is pending. */
void cph_srv_schedule_pass(cph_srv *s);
/* Re-reads the --policy file and swaps it in (SIGHUP and POST /v1/admin/policy/reload) via
 * s->reload. On failure the old policy stays; err says why (file:line:col for a bad file).
 * On success err->msg may carry a note (settings that need a restart). */
int cph_srv_reload(cph_srv *s, cph_err *err);
/* Called once per dispatched request when its answer is handed to libevent, and once per
 * such answer when libevent has written it: lets a shutdown complete. */
void cph_srv_request_closed(cph_srv *s);
void cph_srv_reply_flushed(cph_srv *s);
/* Ends the loop once a shutdown has nothing left to wait for (see server.c). */
void cph_srv_maybe_finish_stop(cph_srv *s);
/* Fires s->ev_replies soon (main.c's wake of the replies long-polls; calls coalesce). */
void cph_srv_wake_replies_later(cph_srv *s);

#endif
