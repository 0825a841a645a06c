/* cephalond — the Cephalon daemon.
 *
 *   cephalond --policy FILE [--data DIR] [--listen HOST:PORT] [--log-level LEVEL]
 *
 * Flags override the policy. Logs one line when ready, listening address included (the bound
 * port, so --listen HOST:0 tells which port it got). SIGHUP reloads the policy file (an
 * invalid file is rejected and the old policy stays in force). SIGTERM and SIGINT stop it
 * cleanly: no new requests are accepted, waiting long-polls are answered, passes run until
 * the engine holds no queued operation (so in-flight commits finish and their clients are
 * answered), replies are flushed, and it exits 0. A second signal exits at once.
 *
 * This file: arguments, lifecycle, signals, and driving the engine (passes, timers). It owns
 * the cph_srv (server.h) and hands it down.
 *
 * main.c wires: listen -> http -> routes -> services -> reply -> request -> server -> engine.
 * Includes and calls between server files go down that list only; nothing calls main.c
 * (what a lower file needs of it is in server.c, or handed down as s->reload).
 *   listen.c         the --listen address
 *   http.c           transport: routing table, auth, dispatch to the routes
 *   routes_*.c       the API, one area per file (routes.h)
 *   services         long-polls (longpoll.c, s->lp), maintenance workers (maint_workers.c,
 *                    s->maint), memory-search threads (search_prep.c, s->search): started
 *                    and stopped here, used by the routes; they call neither routes nor main
 *                    (search_prep uses maint_workers' provider snapshot); request deadlines
 *                    (deadlines.c, s->deadlines): every connection's bufferevent is made
 *                    there, http.c says when a request is routed, /metrics reads its counts
 *   reply.c          answering: replies, the error format, answers after an engine op
 *   request.c        the request context: memory, lifetime, query, body, fields
 *   server.c         a pass soon, a replies wake soon, the answer accounting of a shutdown
 *   leaves           auth.c (http), emit.c (routes), mpjson.c (request, reply) */
#define _GNU_SOURCE /* pipe2 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <fcntl.h>
#include <getopt.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cephalon/cephalon.h"
#include "common/log.h"
#include "http.h"
#include "offload.h"
#include "listen.h"
#include "cephalon/providers.h"
#include "cluster.h"
#include "clusterflow.h"
#include "deadlines.h"
#include "longpoll.h"
#include "backup.h"
#include "maint_workers.h"
#include "routes.h"
#include "search_prep.h"
#include "server.h"

/* How long a shutdown waits for in-flight work before exiting anyway. */
#define STOP_DEADLINE_S 10
/* Threads embedding search queries through an external provider (search_prep.c). They mostly
 * wait on the network; two keep one slow call from holding up every search. */
#define SEARCH_THREADS 2
/* Largest request head libevent reads (request line + headers). */
#define MAX_HEADERS_BYTES (64 * 1024)

static void usage(FILE *f) {
  fprintf(f, "usage: cephalond --policy FILE [--data DIR] [--listen HOST:PORT] "
             "[--log-level debug|info|warn|error]\n");
}

static struct timeval tv_of_ns(int64_t ns) {
  if (ns < 0)
    ns = 0;
  int64_t us = (ns + 999) / 1000; /* round up: never wake before the moment asked for */
  struct timeval tv = {(time_t)(us / 1000000), (suseconds_t)(us % 1000000)};
  return tv;
}

/* ================================================================ driving the engine */

static void arm_wakeup(cph_srv *s) {
  int64_t next = cph_engine_next_wakeup_ns(s->engine);
  if (next == INT64_MAX) {
    evtimer_del(s->ev_wakeup);
    return;
  }
  /* At least 1 ms: a moment the pass just run did not act on will not be acted on by an
   * immediate rerun either, and must not turn into a busy loop. */
  int64_t delay = next - cph_clock_now(&s->clock);
  struct timeval tv = tv_of_ns(delay < CPH_NS_PER_MS ? CPH_NS_PER_MS : delay);
  evtimer_add(s->ev_wakeup, &tv);
}

/* What a loop callback that may have answered operations does after: another pass if one
 * is wanted, the next wakeup, the replies long-polls, a shutdown that may be done. */
static void after_answers(cph_srv *s) {
  cph_cflow_passed(s->cflow); /* park marks, and items of turns that ended unasked */
  if (cph_engine_pass_wanted(s->engine))
    cph_srv_schedule_pass(s);
  arm_wakeup(s);
  /* Belt and braces with the replies_appended hook: a pass that added replies wakes the
   * replies long-polls. */
  uint64_t last = cph_engine_last_reply_id(s->engine);
  if (last != s->last_reply_seen) {
    s->last_reply_seen = last;
    if (cph_longpolls_replies_waiting(s->lp))
      cph_srv_wake_replies_later(s);
  }
  cph_srv_maybe_finish_stop(s);
}

/* One pass per callback; a pass that wants a successor gets it through the zero-delay timer
 * (never a loop here), so requests keep being read between passes. */
static void on_pass(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_srv *s = arg;
  s->pass_scheduled = false;
  int rc = cph_engine_run_pass(s->engine);
  s->passes++;
  if (rc != CPH_OK) {
    /* Every operation of the pass was already answered with the error; say it in the log
     * without flooding it at the tick rate. */
    if (s->pass_errors++ % 1000 == 0)
      cph_error("pass failed: %s (%llu failed passes so far)", cph_strerror(rc),
                (unsigned long long)s->pass_errors);
  }
  after_answers(s);
}

/* Engine hook, ON THE ENGINE'S FLUSH THREAD: only wake the loop. A full pipe already holds
 * a wake, so EAGAIN loses nothing. */
static void hook_flushed(void *ctx) {
  cph_srv *s = ctx;
  cph_wake_signal(&s->flushed);
}

/* Cluster mode, every second: the demand goes to the cluster thread, this node's share of
 * the lanes' budgets comes back (cluster.h), and the scheduler runs on it. */
static void on_budget_tick(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_srv *s = arg;
  if (!s->cluster) /* stopping: the cluster left first */
    return;
  cph_lane_info lanes[CPH_LANE_COUNT];
  uint32_t limit, in_use;
  cph_engine_lanes(s->engine, lanes, &limit, &in_use);
  uint64_t runnable[CPH_LANE_COUNT], busy = in_use;
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    busy += runnable[l] = lanes[l].runnable;
  cph_cluster_note_demand(s->cluster, runnable, busy);
  double share[CPH_LANE_COUNT];
  cph_cluster_budget_share(s->cluster, share); /* 0 while it has none: it starts nothing */
  cph_engine_set_budget_share(s->engine, share);
  uint32_t slots;
  if (cph_cluster_concurrency_share(s->cluster, in_use, &slots))
    cph_engine_set_concurrency_share(s->engine, slots);
  cph_srv_schedule_pass(s); /* a larger share may start turns now */
}

/* A flush finished: answer the operations it made durable (or failed). */
static void on_flushed(void *arg) {
  cph_srv *s = arg;
  cph_engine_flushed(s->engine);
  after_answers(s);
}

static void on_timer_pass(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_srv_schedule_pass(arg);
}

static void on_sync(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_srv *s = arg;
  int rc = cph_engine_sync(s->engine);
  if (rc != CPH_OK)
    cph_error("sync failed: %s", cph_strerror(rc));
}

static void on_replies(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_srv *s = arg;
  s->replies_scheduled = false;
  cph_replies_wake(s);
}

/* Engine hook, called inside a pass after its commit: only schedule, never answer from
 * inside the engine. */
static void hook_replies_appended(void *ctx, uint64_t last_reply_id) {
  (void)last_reply_id;
  cph_srv *s = ctx;
  if (cph_longpolls_replies_waiting(s->lp))
    cph_srv_wake_replies_later(s);
}

/* (Re)applies the policy's timers and HTTP limits; at start and after every reload. Limits
 * apply to connections accepted from then on. */
static void apply_policy(cph_srv *s) {
  const cph_policy *p = cph_engine_policy(s->engine);
  if (p->scheduler.tick_ms != s->tick_ms) {
    s->tick_ms = p->scheduler.tick_ms;
    struct timeval tv = tv_of_ns(s->tick_ms * CPH_NS_PER_MS);
    event_del(s->ev_tick);
    event_add(s->ev_tick, &tv);
  }
  int64_t sync_ms = p->store.sync == CPH_POLICY_SYNC_BATCH ? p->store.sync_interval_ms : 0;
  if (sync_ms != s->sync_ms) {
    s->sync_ms = sync_ms;
    event_del(s->ev_sync);
    if (sync_ms > 0) {
      struct timeval tv = tv_of_ns(sync_ms * CPH_NS_PER_MS);
      event_add(s->ev_sync, &tv);
    }
  }
  evhttp_set_timeout(s->http, (int)p->server.timeout_seconds);
  /* libevent answers a body over its own limit with a bare 413 before reading it. Its limit
   * is twice ours, so a body somewhat over :max-body-bytes still gets the JSON 413 (from
   * request.c) while a huge one is refused unread. */
  int64_t max_body = p->server.max_body_bytes;
  evhttp_set_max_body_size(s->http, max_body > INT64_MAX / 2 ? -1 : (ev_ssize_t)(max_body * 2));
  evhttp_set_max_headers_size(s->http, MAX_HEADERS_BYTES);
  if (!s->log_level_fixed)
    cph_log_set_level((cph_log_level)p->server.log_level);
}

/* ================================================================ reload */

/* s->reload: POST /v1/admin/policy/reload reaches it through cph_srv_reload. */
static int reload_policy(cph_srv *s, cph_err *err) {
  cph_policy *p = NULL;
  int rc = cph_policy_load_file(s->policy_path, &p, err);
  if (rc != CPH_OK) {
    cph_error("policy reload rejected, the old policy stays in force: %s", err->msg);
    cph_engine_note_reload_failure(s->engine);
    return rc;
  }
  if (!p->auth_enabled && !s->listen_loopback) {
    cph_policy_free(p);
    rc = cph_err_set(err, CPH_EPOLICY,
                     "%s: no :auth section, but cephalond listens on a non-loopback address; "
                     "keep :auth tokens or restart on a loopback address",
                     s->policy_path);
    cph_error("policy reload rejected, the old policy stays in force: %s", err->msg);
    cph_engine_note_reload_failure(s->engine);
    return rc;
  }
  rc = cph_engine_reload(s->engine, p, err);
  if (rc != CPH_OK) {
    cph_error("policy reload failed, the old policy stays in force: %s", err->msg);
    cph_engine_note_reload_failure(s->engine);
    return rc;
  }
  apply_policy(s);
  cph_info("policy reloaded from %s generation=%llu%s%s", s->policy_path,
           (unsigned long long)cph_engine_policy_generation(s->engine), err->msg[0] ? "; " : "",
           err->msg);
  return CPH_OK;
}

/* ================================================================ signals */

static void on_stop_deadline(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_srv *s = arg;
  if (s->open_reqs || s->unflushed > 0)
    cph_warn("stop: %zu requests unanswered and %zu answers unwritten at the deadline; exiting "
             "anyway",
             s->open_reqs, s->unflushed);
  event_base_loopexit(s->base, NULL);
}

static void on_stop(evutil_socket_t sig, short events, void *arg) {
  (void)events;
  cph_srv *s = arg;
  const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
  if (s->stopping) {
    cph_warn("second %s: exiting without waiting", name);
    event_base_loopexit(s->base, NULL);
    return;
  }
  cph_info("cephalond stopping on %s", name);
  s->stopping = true;
  if (s->bound) {
    evhttp_del_accept_socket(s->http, s->bound);
    s->bound = NULL;
  }
  cph_longpolls_stop(s->lp);
  struct timeval tv = {STOP_DEADLINE_S, 0};
  evtimer_add(s->ev_stop_deadline, &tv);
  cph_cflow_stop_begin(s->cflow); /* what waits to be sent again goes now */
  cph_srv_schedule_pass(s);
  cph_srv_maybe_finish_stop(s);
}

static void on_reload(evutil_socket_t sig, short events, void *arg) {
  (void)sig;
  (void)events;
  cph_err err = {0};
  reload_policy(arg, &err); /* logs either way */
}

/* ================================================================ main */

static uint16_t bound_port(struct evhttp_bound_socket *bound, uint16_t fallback) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &len) != 0)
    return fallback;
  if (ss.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return fallback;
}

/* After the loop: answer what can be answered, then free everything (ASan runs the tests). */
static void shutdown_all(cph_srv *s) {
  /* First: answer what waits for the cluster log and close it (it reads the shard map);
   * then revoke the cluster lease, so this node's shards move to the others now. */
  cph_cflow_quiesce(s->cflow);
  cph_cluster_stop(s->cluster);
  s->cluster = NULL;
  cph_backup_free(s->backup); /* a running copy finishes first: it reads the engine's store */
  s->backup = NULL;
  /* First, while the maintenance workers whose operations may wait are still there: stop
   * the flush thread; operations waiting for a flush get it and their answers, and the last
   * passes below flush before they answer. */
  if (s->engine) {
    cph_engine_hooks inline_flush = {s, hook_replies_appended, NULL};
    cph_engine_set_hooks(s->engine, &inline_flush);
  }
  cph_search_prep_stop(s->search);
  s->search = NULL;
  cph_offload_stop(s->offload); /* finishes what it holds: the passes below apply it */
  s->offload = NULL;
  cph_maint_workers_stop(s->maint);
  s->maint = NULL;
  if (s->engine && s->http) {
    cph_longpolls_stop(s->lp);
    /* Flush what is still queued so no acknowledged-looking op is left half done. */
    for (int i = 0; i < 100 && cph_engine_pass_wanted(s->engine); i++)
      cph_engine_run_pass(s->engine);
  }
  cph_http_release_all(s);
  cph_cflow_free(s->cflow); /* after the last pass: its operations are done */
  s->cflow = NULL;
  if (s->http)
    evhttp_free(s->http);
  cph_deadlines_free(s->deadlines); /* after evhttp_free: it closes every connection */
  s->deadlines = NULL;
  struct event **evs[] = {&s->ev_pass,    &s->ev_tick,          &s->ev_wakeup, &s->ev_sync,
                          &s->ev_replies, &s->ev_stop_deadline, &s->ev_budget};
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    if (*evs[i]) {
      event_free(*evs[i]);
      *evs[i] = NULL;
    }
  cph_longpolls_free(s->lp);
  s->lp = NULL;
  cph_wake_free(&s->flushed);
}

/* LMDB allocates a nested transaction's page lists (2 MiB and 1 MiB) when it begins and frees
 * them when it ends: for every pass committed into the store's span (store.h) and every
 * request of a pass after its first. By default glibc gives such blocks back to the kernel at
 * each free (its trim threshold follows its dynamic mmap threshold up) and the next begin
 * faults them in again: a sixth of the loop's samples in the span's profile
 * (bench/PROFILE.md "One write transaction across passes"). Fixed thresholds keep them in
 * the heap; at most 16 MiB of freed memory at the heap's top stays mapped. */
static void malloc_keep_txn_lists(void) {
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
}

int main(int argc, char **argv) {
  malloc_keep_txn_lists();
  const char *policy_path = NULL, *data_dir = NULL, *listen_arg = NULL, *level_arg = NULL;
  static const struct option longopts[] = {
      {"policy", required_argument, NULL, 'p'}, {"data", required_argument, NULL, 'd'},
      {"listen", required_argument, NULL, 'l'}, {"log-level", required_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'p':
      policy_path = optarg;
      break;
    case 'd':
      data_dir = optarg;
      break;
    case 'l':
      listen_arg = optarg;
      break;
    case 'v':
      level_arg = optarg;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (!policy_path || optind != argc) {
    usage(stderr);
    return 2;
  }

  cph_err err = {0};
  cph_policy *policy = NULL;
  if (cph_policy_load_file(policy_path, &policy, &err) != CPH_OK) {
    fprintf(stderr, "cephalond: %s\n", err.msg);
    return 1;
  }
  cph_log_level level = (cph_log_level)policy->server.log_level;
  if (level_arg && cph_log_parse_level(level_arg, &level) != CPH_OK) {
    fprintf(stderr, "cephalond: --log-level must be debug, info, warn or error\n");
    cph_policy_free(policy);
    return 2;
  }
  cph_log_set_level(level);

  cph_listen_addr addr;
  if (cph_listen_parse(listen_arg ? listen_arg : policy->server.listen, &addr, &err)) {
    fprintf(stderr, "cephalond: %s\n", err.msg);
    cph_policy_free(policy);
    return 1;
  }
  bool loopback = cph_listen_is_loopback(&addr);
  if (!policy->auth_enabled && !loopback) {
    fprintf(stderr,
            "cephalond: refusing to listen on %s:%u without :auth in the policy; add :auth "
            "tokens or listen on a loopback address\n",
            addr.host, addr.port);
    cph_policy_free(policy);
    return 1;
  }

  int status = 1;
  cph_srv s = {0};
  s.flushed = (cph_wake){{-1, -1}, NULL, NULL, NULL, NULL};
  s.policy_path = policy_path;
  s.listen_loopback = loopback;
  s.log_level_fixed = level_arg != NULL;
  s.reload = reload_policy;
  cph_clock_init_monotonic(&s.clock);
  /* One clock for both: lease long-poll deadlines are on the engine's scale. */
  cph_engine_options eo = {
      .data_dir = data_dir, .clock = &s.clock, .providers = cph_providers_network()};
  if (cph_engine_open(policy, &eo, &s.engine, &err) != CPH_OK) {
    fprintf(stderr, "cephalond: %s\n", err.msg);
    return 1;
  }
  s.last_reply_seen = cph_engine_last_reply_id(s.engine);

  struct event *ev_term = NULL, *ev_int = NULL, *ev_hup = NULL;
  signal(SIGPIPE, SIG_IGN);
  /* epoll's changelist: the event changes of one loop round (evhttp turns a connection's
   * read and write interest off and on around every request) reach the kernel as one
   * epoll_ctl per descriptor at the round's end, or none when they cancel out. The caveat
   * libevent documents (a descriptor dup'ed and both registered) does not arise here. */
  struct event_config *ecfg = event_config_new();
  if (ecfg)
    event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
  s.base = ecfg ? event_base_new_with_config(ecfg) : NULL;
  if (ecfg)
    event_config_free(ecfg);
  s.http = s.base ? evhttp_new(s.base) : NULL;
  if (!s.http) {
    cph_error("cannot create the event loop");
    goto out;
  }
  s.ev_pass = evtimer_new(s.base, on_pass, &s);
  s.ev_tick = event_new(s.base, -1, EV_PERSIST, on_timer_pass, &s);
  s.ev_wakeup = evtimer_new(s.base, on_timer_pass, &s);
  s.ev_sync = event_new(s.base, -1, EV_PERSIST, on_sync, &s);
  s.ev_replies = evtimer_new(s.base, on_replies, &s);
  s.ev_stop_deadline = evtimer_new(s.base, on_stop_deadline, &s);
  s.lp = cph_longpolls_new(s.base);
  int wake_rc = cph_wake_init(&s.flushed, s.base, on_flushed, &s, "flush thread");
  s.deadlines = cph_deadlines_new(&s);
  if (!s.ev_pass || !s.ev_tick || !s.ev_wakeup || !s.ev_sync || !s.ev_replies ||
      !s.ev_stop_deadline || !s.lp || wake_rc != CPH_OK || !s.deadlines) {
    cph_error("cannot create timers");
    goto out;
  }
  /* The disk flush of :sync :always overlaps the next pass (cph_engine_hooks.flushed). */
  cph_engine_hooks hooks = {&s, hook_replies_appended, hook_flushed};
  cph_engine_set_hooks(s.engine, &hooks);
  /* Every connection's bufferevent comes from deadlines.c, which times the request's head
   * and body (:server :header-timeout-seconds, :body-timeout-seconds). */
  evhttp_set_bevcb(s.http, cph_deadlines_bevcb, s.deadlines);
  evhttp_set_allowed_methods(s.http,
                             EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
  evhttp_set_gencb(s.http, cph_http_dispatch, &s);
  apply_policy(&s);
  s.bound = evhttp_bind_socket_with_handle(s.http, addr.host, addr.port);
  if (!s.bound) {
    cph_error("cannot listen on %s:%u (address in use or not available)", addr.host, addr.port);
    goto out;
  }
  addr.port = bound_port(s.bound, addr.port); /* --listen HOST:0 picks a free port */
  /* Answers go out whole: without this a reply that spans two segments waits for the
   * client's delayed ACK (40 ms) on a kept-alive connection. Linux passes the option on to
   * accepted sockets. */
  int one = 1;
  setsockopt(evhttp_bound_socket_get_fd(s.bound), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ev_term = evsignal_new(s.base, SIGTERM, on_stop, &s);
  ev_int = evsignal_new(s.base, SIGINT, on_stop, &s);
  ev_hup = evsignal_new(s.base, SIGHUP, on_reload, &s);
  if (!ev_term || !ev_int || !ev_hup || evsignal_add(ev_term, NULL) || evsignal_add(ev_int, NULL) ||
      evsignal_add(ev_hup, NULL)) {
    cph_error("cannot install signal handlers");
    goto out;
  }
  if (cph_maint_workers_start(&s, (int)cph_engine_policy(s.engine)->maintenance.workers,
                              &s.maint)) {
    cph_error("cannot start the maintenance workers");
    goto out;
  }
  if (cph_search_prep_start(&s, SEARCH_THREADS, &s.search)) {
    cph_error("cannot start the memory search threads");
    goto out;
  }
  if (cph_offload_start(&s, (int)cph_engine_policy(s.engine)->server.request_threads,
                        "request thread", &s.offload)) {
    cph_error("cannot start the request threads");
    goto out;
  }
  if (!(s.backup = cph_backup_new())) {
    cph_error("out of memory starting the backup service");
    goto out;
  }
  if (cph_engine_policy(s.engine)->cluster_enabled &&
      cph_cluster_start(&cph_engine_policy(s.engine)->cluster, &s.cluster, &err) != CPH_OK) {
    cph_error("cluster mode: %s", err.msg);
    goto out;
  }
  if (s.cluster) { /* DESIGN §14 "Budgets": no turn starts before the cluster gave a share */
    double none[CPH_LANE_COUNT] = {0};
    cph_engine_set_budget_share(s.engine, none);
    uint32_t slots;
    if (cph_cluster_concurrency_share(s.cluster, 0, &slots)) /* 0: it holds no slot yet */
      cph_engine_set_concurrency_share(s.engine, slots);
    s.ev_budget = event_new(s.base, -1, EV_PERSIST, on_budget_tick, &s);
    struct timeval second = {1, 0};
    if (!s.ev_budget || evtimer_add(s.ev_budget, &second) != 0) {
      cph_error("cluster mode: cannot create the budget timer");
      goto out;
    }
  }
  if (s.cluster && cph_engine_policy(s.engine)->cluster.nats_count > 0 &&
      cph_cflow_start(&s, &s.cflow, &err) != CPH_OK) {
    cph_error("cluster mode: the log: %s", err.msg);
    goto out;
  }
  cph_srv_schedule_pass(&s); /* recovery may have left work (expired leases restaged) */
  char qdata[512], qpolicy[512];
  /* The ready record is a contract (DESIGN §1: supervisors and tests wait for it), written
   * whatever :log-level says. */
  if (level > CPH_LOG_INFO)
    cph_log_set_level(CPH_LOG_INFO);
  cph_log_kv(CPH_LOG_INFO, "cephalond ready", "listen=%s:%u data=%s policy=%s auth=%s", addr.host,
             addr.port,
             cph_log_quote(data_dir ? data_dir : cph_engine_policy(s.engine)->server.data_dir,
                           qdata, sizeof qdata),
             cph_log_quote(policy_path, qpolicy, sizeof qpolicy),
             cph_engine_policy(s.engine)->auth_enabled ? "on" : "off");
  cph_log_set_level(level);
  event_base_dispatch(s.base);
  status = 0;
  cph_info("cephalond stopped after %llu passes", (unsigned long long)s.passes);
out:
  if (ev_term)
    event_free(ev_term);
  if (ev_int)
    event_free(ev_int);
  if (ev_hup)
    event_free(ev_hup);
  shutdown_all(&s);
  if (s.base)
    event_base_free(s.base);
  cph_engine_close(s.engine);
  return status;
}
