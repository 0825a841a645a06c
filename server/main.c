/* cephalond — the Cephalon daemon.
 *
 *   cephalond --policy FILE [--data DIR] [--listen HOST:PORT] [--log-level LEVEL]
 *
 * Flags override the policy. Logs one line when ready, listening address included. SIGTERM
 * and SIGINT stop it cleanly (exit 0); SIGHUP reloads the policy file (an invalid file is
 * rejected and the old policy stays in force). */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/log.h"
#include "listen.h"

typedef struct daemon_state {
  struct event_base *base;
  struct evhttp *http;
  cph_engine *engine;
  const char *policy_path;
} daemon_state;

static void usage(FILE *f) {
  fprintf(f, "usage: cephalond --policy FILE [--data DIR] [--listen HOST:PORT] "
             "[--log-level debug|info|warn|error]\n");
}

/* ---------------------------------------------------------------- HTTP */

static void reply_json(struct evhttp_request *req, int status, const char *reason,
                       const char *json) {
  struct evbuffer *body = evbuffer_new();
  if (!body) {
    evhttp_send_error(req, 500, "out of memory");
    return;
  }
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                    "application/json");
  evbuffer_add_printf(body, "%s\n", json);
  evhttp_send_reply(req, status, reason, body);
  evbuffer_free(body);
}

static void handle_healthz(struct evhttp_request *req, void *arg) {
  (void)arg;
  reply_json(req, 200, "OK", "{\"status\":\"ok\"}");
}

static void handle_readyz(struct evhttp_request *req, void *arg) {
  daemon_state *d = arg;
  char json[160];
  snprintf(json, sizeof json, "{\"status\":\"ready\",\"policy_generation\":%llu}",
           (unsigned long long)cph_engine_policy_generation(d->engine));
  reply_json(req, 200, "OK", json);
}

/* Every other path: the error format of DESIGN §9. */
static void handle_unknown(struct evhttp_request *req, void *arg) {
  (void)arg;
  reply_json(req, 404, "Not Found",
             "{\"error\":{\"code\":\"not_found\",\"message\":\"no such route\",\"field\":null}}");
}

/* ---------------------------------------------------------------- signals */

static void on_stop(evutil_socket_t sig, short events, void *arg) {
  (void)events;
  daemon_state *d = arg;
  cph_info("cephalond stopping on %s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  event_base_loopexit(d->base, NULL);
}

static void on_reload(evutil_socket_t sig, short events, void *arg) {
  (void)sig;
  (void)events;
  daemon_state *d = arg;
  cph_policy *p = NULL;
  cph_err err = {0};
  if (cph_policy_load_file(d->policy_path, &p, &err) != CPH_OK) {
    cph_error("policy reload rejected, the old policy stays in force: %s", err.msg);
    return;
  }
  if (cph_engine_reload(d->engine, p, &err) != CPH_OK) {
    cph_error("policy reload failed, the old policy stays in force: %s", err.msg);
    return;
  }
  cph_info("policy reloaded from %s generation=%llu%s%s", d->policy_path,
           (unsigned long long)cph_engine_policy_generation(d->engine), err.msg[0] ? "; " : "",
           err.msg);
}

/* ---------------------------------------------------------------- main */

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

int main(int argc, char **argv) {
  const char *policy_path = NULL, *data_dir = NULL, *listen_arg = NULL, *level_arg = NULL;
  static const struct option longopts[] = {{"policy", required_argument, NULL, 'p'},
                                           {"data", required_argument, NULL, 'd'},
                                           {"listen", required_argument, NULL, 'l'},
                                           {"log-level", required_argument, NULL, 'v'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'p': policy_path = optarg; break;
    case 'd': data_dir = optarg; break;
    case 'l': listen_arg = optarg; break;
    case 'v': level_arg = optarg; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
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
  if (!policy->auth_enabled && !cph_listen_is_loopback(&addr)) {
    fprintf(stderr,
            "cephalond: refusing to listen on %s:%u without :auth in the policy; add :auth "
            "tokens or listen on a loopback address\n",
            addr.host, addr.port);
    cph_policy_free(policy);
    return 1;
  }

  int status = 1;
  daemon_state d = {0};
  d.policy_path = policy_path;
  cph_engine_options eo = {.data_dir = data_dir};
  if (cph_engine_open(policy, &eo, &d.engine, &err) != CPH_OK) {
    fprintf(stderr, "cephalond: %s\n", err.msg);
    return 1;
  }
  struct event *ev_term = NULL, *ev_int = NULL, *ev_hup = NULL;
  signal(SIGPIPE, SIG_IGN);
  d.base = event_base_new();
  d.http = d.base ? evhttp_new(d.base) : NULL;
  if (!d.http) {
    cph_error("cannot create the event loop");
    goto out;
  }
  evhttp_set_timeout(d.http, (int)cph_engine_policy(d.engine)->server.timeout_seconds);
  evhttp_set_max_body_size(d.http, (ev_ssize_t)cph_engine_policy(d.engine)->server.max_body_bytes);
  evhttp_set_cb(d.http, "/healthz", handle_healthz, &d);
  evhttp_set_cb(d.http, "/readyz", handle_readyz, &d);
  evhttp_set_gencb(d.http, handle_unknown, &d);
  struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(d.http, addr.host, addr.port);
  if (!bound) {
    cph_error("cannot listen on %s:%u (address in use or not available)", addr.host, addr.port);
    goto out;
  }
  addr.port = bound_port(bound, addr.port); /* --listen HOST:0 picks a free port */
  ev_term = evsignal_new(d.base, SIGTERM, on_stop, &d);
  ev_int = evsignal_new(d.base, SIGINT, on_stop, &d);
  ev_hup = evsignal_new(d.base, SIGHUP, on_reload, &d);
  if (!ev_term || !ev_int || !ev_hup || evsignal_add(ev_term, NULL) || evsignal_add(ev_int, NULL) ||
      evsignal_add(ev_hup, NULL)) {
    cph_error("cannot install signal handlers");
    goto out;
  }
  cph_info("cephalond ready listen=%s:%u data=%s policy=%s", addr.host, addr.port,
           data_dir ? data_dir : cph_engine_policy(d.engine)->server.data_dir, policy_path);
  event_base_dispatch(d.base);
  status = 0;
  cph_info("cephalond stopped");
out:
  if (ev_term)
    event_free(ev_term);
  if (ev_int)
    event_free(ev_int);
  if (ev_hup)
    event_free(ev_hup);
  if (d.http)
    evhttp_free(d.http);
  if (d.base)
    event_base_free(d.base);
  cph_engine_close(d.engine);
  return status;
}
