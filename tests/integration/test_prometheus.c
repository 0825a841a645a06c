/* A real Prometheus scrapes a real cephalond (DESIGN §10): turns run over HTTP must show up
 * in Prometheus' own query API with the value cephalond's GET /metrics reports, and every
 * query of deploy/grafana-dashboard.json must be valid PromQL to that Prometheus.
 *
 * Needs the `prometheus` binary (Debian package prometheus, installed by
 * scripts/install-deps.sh); the test fails, saying so, when it is missing. Everything runs on
 * 127.0.0.1: cephalond on a port of its choosing, Prometheus on a free port, with a temp
 * config (scrape_interval 1s) and a temp TSDB directory. Both are stopped with SIGTERM and
 * must exit 0; Prometheus also gets PR_SET_PDEATHSIG so a crashed test leaves nothing
 * behind. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define PROMETHEUS_BIN "/usr/bin/prometheus"
#define READY_TIMEOUT_MS 20000
#define SCRAPE_TIMEOUT_MS 20000 /* bounded wait for Prometheus to report a value */
#define STOP_TIMEOUT_MS 15000
#define TURNS 3

static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :leases {:ttl-seconds 30}}\n";

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- HTTP on loopback */

/* A loopback port nothing listens on right now (bound, read, released: another process
 * could take it in between, which start_prometheus handles by retrying). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof sin), 0);
  socklen_t len = sizeof sin;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
  close(fd);
  return ntohs(sin.sin_port);
}

/* Decodes a chunked body in place (Prometheus, a Go server, chunks larger answers). */
static void dechunk(cph_test_response *r) {
  if (!r->headers || !strcasestr(r->headers, "transfer-encoding: chunked"))
    return;
  char *in = r->body, *out = r->body, *end = r->body + r->body_len;
  while (in < end) {
    char *stop = NULL;
    unsigned long n = strtoul(in, &stop, 16);
    char *crlf = strstr(in, "\r\n");
    if (!crlf || stop == in || n == 0 || crlf + 2 + n > end)
      break;
    memmove(out, crlf + 2, n);
    out += n;
    in = crlf + 2 + n + 2;
  }
  *out = '\0';
  r->body_len = (size_t)(out - r->body);
}

static cph_test_response http_get(int port, const char *path) {
  cph_test_response r = cph_test_http(port, "GET", path, NULL, NULL);
  dechunk(&r);
  return r;
}

static char *url_encode(const char *s) {
  char *out = malloc(strlen(s) * 3 + 1);
  assert_non_null(out);
  char *o = out;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
        c == '-' || c == '_' || c == '.' || c == '~')
      *o++ = (char)c;
    else
      o += sprintf(o, "%%%02X", c);
  }
  *o = '\0';
  return out;
}

/* ---------------------------------------------------------------- Prometheus */

typedef struct prom {
  pid_t pid;
  int port;
  char *dir; /* temp: config, TSDB, log */
  char *config;
  char *log;
} prom;

static char *prom_log(const prom *p) {
  char *s = cph_test_read_file(p->log, NULL);
  return s ? s : strdup("");
}

/* Starts Prometheus scraping 127.0.0.1:target_port every second; 0 once /-/ready answers
 * 200, -1 if it exited (its log printed) or never got ready. */
static int prom_start_once(prom *p, int target_port) {
  p->port = free_port();
  char *cfg_text;
  assert_true(asprintf(&cfg_text,
                       "global:\n"
                       "  scrape_interval: 1s\n"
                       "  scrape_timeout: 1s\n"
                       "  evaluation_interval: 1s\n"
                       "scrape_configs:\n"
                       "  - job_name: cephalon\n"
                       "    metrics_path: /metrics\n"
                       "    static_configs:\n"
                       "      - targets: [\"127.0.0.1:%d\"]\n",
                       target_port) > 0);
  FILE *f = fopen(p->config, "w");
  assert_non_null(f);
  assert_true(fputs(cfg_text, f) >= 0);
  assert_int_equal(fclose(f), 0);
  free(cfg_text);

  char *a_config, *a_tsdb, *a_listen;
  assert_true(asprintf(&a_config, "--config.file=%s", p->config) > 0);
  assert_true(asprintf(&a_tsdb, "--storage.tsdb.path=%s/tsdb", p->dir) > 0);
  assert_true(asprintf(&a_listen, "--web.listen-address=127.0.0.1:%d", p->port) > 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the test */
    if (getppid() != parent)
      _exit(126);
    int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) {
      dup2(null, 0);
      close(null);
    }
    execl(PROMETHEUS_BIN, "prometheus", a_config, a_tsdb, a_listen, "--log.level=warn",
          (char *)NULL);
    fprintf(stderr, "exec %s: %s\n", PROMETHEUS_BIN, strerror(errno));
    _exit(127);
  }
  free(a_config);
  free(a_tsdb);
  free(a_listen);
  p->pid = pid;

  for (int64_t start = now_ms(); now_ms() - start < READY_TIMEOUT_MS; sleep_ms(100)) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p->pid = 0;
      char *log = prom_log(p);
      print_error("prometheus exited (status %d) before it was ready:\n%s\n", status, log);
      free(log);
      return -1;
    }
    cph_test_response r = http_get(p->port, "/-/ready");
    int st = r.status;
    cph_test_response_free(&r);
    if (st == 200)
      return 0;
  }
  char *log = prom_log(p);
  print_error("prometheus not ready within %d ms:\n%s\n", READY_TIMEOUT_MS, log);
  free(log);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  p->pid = 0;
  return -1;
}

/* Tries a few ports: the free port can be taken between our probe and Prometheus' bind. */
static void prom_start(prom *p, int target_port) {
  memset(p, 0, sizeof *p);
  p->dir = cph_test_tmpdir("prometheus");
  assert_true(asprintf(&p->config, "%s/prometheus.yml", p->dir) > 0);
  assert_true(asprintf(&p->log, "%s/prometheus.log", p->dir) > 0);
  for (int attempt = 0; attempt < 3; attempt++)
    if (prom_start_once(p, target_port) == 0)
      return;
  fail_msg("could not start prometheus (log in %s)", p->log);
}

/* SIGTERM and a bounded wait; returns the exit status (or -1 after a SIGKILL). */
static int prom_stop(prom *p) {
  int rc = -1;
  if (p->pid > 0) {
    kill(p->pid, SIGTERM);
    int status = 0;
    int64_t start = now_ms();
    pid_t got;
    while ((got = waitpid(p->pid, &status, WNOHANG)) == 0 && now_ms() - start < STOP_TIMEOUT_MS)
      sleep_ms(50);
    if (got == p->pid) {
      rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, NULL, 0);
    }
    p->pid = 0;
  }
  return rc;
}

static void prom_free(prom *p) {
  if (p->dir)
    cph_test_rmtree(p->dir);
  free(p->dir);
  free(p->config);
  free(p->log);
  memset(p, 0, sizeof *p);
}

/* Runs an instant query. Returns the parsed answer's "data" (new reference) when Prometheus
 * answered {"status":"success"}; NULL otherwise, with *error set to what it said (free it). */
static json_t *prom_query(const prom *p, const char *query, char **error) {
  char *q = url_encode(query);
  char *path;
  assert_true(asprintf(&path, "/api/v1/query?query=%s", q) > 0);
  free(q);
  cph_test_response r = http_get(p->port, path);
  free(path);
  json_t *j = r.body_len ? json_loads(r.body, 0, NULL) : NULL;
  json_t *data = NULL;
  *error = NULL;
  const char *status = json_string_value(json_object_get(j, "status"));
  if (r.status == 200 && status && strcmp(status, "success") == 0) {
    data = json_incref(json_object_get(j, "data"));
  } else if (asprintf(error, "HTTP %d: %s", r.status, r.body ? r.body : "(no answer)") < 0) {
    abort();
  }
  json_decref(j);
  cph_test_response_free(&r);
  return data;
}

/* The value of the query's single sample: true with *value set, false when the result is
 * empty. Fails the test when the query is refused or answers several series. */
static bool prom_scalar(const prom *p, const char *query, double *value) {
  char *error;
  json_t *data = prom_query(p, query, &error);
  if (!data)
    fail_msg("prometheus refused '%s': %s", query, error);
  json_t *result = json_object_get(data, "result");
  assert_true(json_is_array(result));
  if (json_array_size(result) == 0) {
    json_decref(data);
    return false;
  }
  if (json_array_size(result) != 1)
    fail_msg("'%s' answered %zu series, want 1", query, json_array_size(result));
  const char *text = json_string_value(json_array_get(json_object_get(json_array_get(result, 0),
                                                                      "value"), 1));
  assert_non_null(text);
  *value = strtod(text, NULL);
  json_decref(data);
  return true;
}

/* Waits (bounded) until the query reports want. Returns the last value seen (NAN if none). */
static double prom_wait_value(const prom *p, const char *query, double want) {
  double last = NAN;
  for (int64_t start = now_ms(); now_ms() - start < SCRAPE_TIMEOUT_MS; sleep_ms(250)) {
    double v;
    if (prom_scalar(p, query, &v)) {
      last = v;
      if (v == want)
        return v;
    }
  }
  return last;
}

/* ---------------------------------------------------------------- cephalond */

/* The value of the series `name{label="value"}` in cephalond's exposition; false if absent. */
static bool metrics_value(int port, const char *name, const char *label, double *value) {
  cph_test_response r = http_get(port, "/metrics");
  if (r.status != 200) {
    char msg[512];
    snprintf(msg, sizeof msg, "GET /metrics answered %d (has the /metrics route landed?): %s",
             r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
    fail_msg("%s", msg);
  }
  char *prefix, *matcher;
  assert_true(asprintf(&prefix, "%s{", name) > 0);
  assert_true(asprintf(&matcher, "%s\"", label) > 0);
  bool found = false;
  for (char *line = r.body; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl)
      *nl = '\0';
    char *close = strchr(line, '}');
    if (strncmp(line, prefix, strlen(prefix)) == 0 && close) {
      *close = '\0';
      bool match = strstr(line, matcher) != NULL;
      if (match) {
        *value = strtod(close + 1, NULL);
        found = true;
        break;
      }
    }
    line = nl ? nl + 1 : NULL;
  }
  free(prefix);
  free(matcher);
  cph_test_response_free(&r);
  return found;
}

static json_t *api(int port, const char *method, const char *path, const char *body, int want) {
  cph_test_response r = cph_test_http(port, method, path,
                                      body ? "Content-Type: application/json\r\n" : NULL, body);
  if (r.status != want)
    fail_msg("%s %s: status %d, want %d: %s", method, path, r.status, want,
             r.body ? r.body : "");
  json_t *j = r.body_len ? json_loads(r.body, 0, NULL) : NULL;
  cph_test_response_free(&r);
  return j;
}

/* One interactive turn: an event for the session, a lease, a completion. */
static void run_turn(int port, const char *session, int i) {
  char body[256];
  snprintf(body, sizeof body,
           "{\"events\":[{\"session\":\"%s\",\"channel\":\"ops\",\"sender\":\"u\","
           "\"body\":\"turn number %d for prometheus\"}]}",
           session, i);
  json_decref(api(port, "POST", "/v1/events", body, 200));
  json_t *leased = api(port, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}", 200);
  json_t *turn = json_object_get(leased, "turn");
  assert_string_equal(json_string_value(json_object_get(turn, "session")), session);
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":7,\"tool_calls\":0}}",
           json_string_value(json_object_get(turn, "lease")));
  json_decref(api(port, "POST", path, body, 200));
  json_decref(leased);
}

/* ---------------------------------------------------------------- the test */

/* The families the dashboard and deploy/README rely on (histograms by their base name). */
static const char *const DASHBOARD_FAMILIES[] = {
    "cephalon_turns_started_total",   "cephalon_turns_completed_total",
    "cephalon_lane_turn_tokens",      "cephalon_lane_tool_call_tokens",
    "cephalon_lane_runnable_sessions", "cephalon_lane_running_turns",
    "cephalon_pick_wait_seconds",     "cephalon_outbox_pending",
    "cephalon_outbox_oldest_age_seconds", "cephalon_compaction_groups_committed_total",
    "cephalon_memories_deleted_total", "cephalon_events_total",
    "cephalon_dedupe_exact_hits_total", "cephalon_dedupe_near_hits_total",
    "cephalon_backpressure_step",     "cephalon_policy_reload_failures_total",
    "cephalon_policy_generation",
};

/* Each family is declared ("# TYPE name ...") in cephalond's exposition, also while it has
 * no series yet, so the dashboard never queries a name the daemon does not have. */
static void check_exposition_declares_dashboard_families(int port) {
  cph_test_response r = http_get(port, "/metrics");
  assert_int_equal(r.status, 200);
  for (size_t i = 0; i < sizeof DASHBOARD_FAMILIES / sizeof DASHBOARD_FAMILIES[0]; i++) {
    char *needle;
    assert_true(asprintf(&needle, "\n# TYPE %s ", DASHBOARD_FAMILIES[i]) > 0);
    bool found = strstr(r.body, needle) != NULL || /* or on the first line */
                 strncmp(r.body, needle + 1, strlen(needle + 1)) == 0;
    free(needle);
    if (!found) {
      cph_test_response_free(&r);
      fail_msg("GET /metrics declares no family %s", DASHBOARD_FAMILIES[i]);
    }
  }
  cph_test_response_free(&r);
}

/* Every dashboard query, with its Grafana variables given values, is accepted by Prometheus. */
static void check_dashboard_queries(const prom *p) {
  char *path = cph_test_source_path("deploy/grafana-dashboard.json");
  json_error_t jerr;
  json_t *d = json_load_file(path, 0, &jerr);
  if (!d)
    fail_msg("%s: %s", path, jerr.text);
  size_t i, t, checked = 0;
  json_t *panel, *target;
  json_array_foreach(json_object_get(d, "panels"), i, panel) {
    json_array_foreach(json_object_get(panel, "targets"), t, target) {
      const char *expr = json_string_value(json_object_get(target, "expr"));
      assert_non_null(expr);
      /* $instance -> ".*" (All), $__range -> a range; nothing else is used. */
      char q[2048];
      size_t n = 0;
      for (const char *s = expr; *s && n + 8 < sizeof q;) {
        if (strncmp(s, "$instance", 9) == 0) {
          n += (size_t)snprintf(q + n, sizeof q - n, ".*");
          s += 9;
        } else if (strncmp(s, "$__range", 8) == 0) {
          n += (size_t)snprintf(q + n, sizeof q - n, "1m");
          s += 8;
        } else {
          q[n++] = *s++;
        }
      }
      q[n] = '\0';
      assert_null(strchr(q, '$'));
      char *error;
      json_t *data = prom_query(p, q, &error);
      if (!data)
        fail_msg("panel '%s': prometheus refused '%s': %s",
                 json_string_value(json_object_get(panel, "title")), q, error);
      json_decref(data);
      checked++;
    }
  }
  assert_true(checked > 0);
  json_decref(d);
  free(path);
}

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
  bool daemon_up;
  prom p;
} fixture;

static int setup(void **state) {
  if (access(PROMETHEUS_BIN, X_OK) != 0) {
    fprintf(stderr, "%s is not installed (Debian package prometheus; scripts/install-deps.sh "
                    "installs it)\n", PROMETHEUS_BIN);
    return -1;
  }
  fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->policy = cph_test_write_tmpfile(".edn", POLICY);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0) {
    unlink(f->policy);
    free(f->policy);
    free(f);
    return -1;
  }
  f->daemon_up = true;
  *state = f;
  return 0;
}

/* Also after a failed assertion: nothing may keep running. */
static int teardown(void **state) {
  fixture *f = *state;
  prom_stop(&f->p);
  prom_free(&f->p);
  if (f->daemon_up)
    cph_test_daemon_stop(&f->d);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

static void test_prometheus_scrapes_turns_started_from_cephalond(void **state) {
  fixture *f = *state;
  int port = f->d.port;
  prom *p = &f->p;
  const char *series = "cephalon_turns_started_total";
  double before = 0;
  if (!metrics_value(port, series, "lane=\"interactive", &before))
    before = 0; /* a family may list no series before its first turn */

  prom_start(p, port);
  /* Prometheus is scraping cephalond, and sees the value before the turns. */
  double up = prom_wait_value(p, "up{job=\"cephalon\"}", 1);
  if (up != 1)
    fail_msg("prometheus never scraped cephalond successfully (up = %g):\n%s", up, prom_log(p));
  char query[256];
  snprintf(query, sizeof query, "%s{job=\"cephalon\",lane=\"interactive\"}", series);
  double seen = prom_wait_value(p, query, before);
  if (before > 0 && seen != before)
    fail_msg("prometheus reports %s = %g before any turn, cephalond %g", query, seen, before);

  json_decref(api(port, "POST", "/v1/sessions", "{\"id\":\"prom-1\",\"class\":\"interactive\"}",
                  200));
  for (int i = 0; i < TURNS; i++)
    run_turn(port, "prom-1", i);

  double now = 0;
  assert_true(metrics_value(port, series, "lane=\"interactive", &now));
  if (now != before + TURNS)
    fail_msg("cephalond counts %g turns started, want %g + %d", now, before, TURNS);
  seen = prom_wait_value(p, query, now);
  if (seen != now)
    fail_msg("prometheus reports %s = %g within %d ms, cephalond %g\n%s", query, seen,
             SCRAPE_TIMEOUT_MS, now, prom_log(p));
  check_dashboard_queries(p);
  check_exposition_declares_dashboard_families(port);

  int prom_exit = prom_stop(p);
  if (prom_exit != 0)
    fail_msg("prometheus did not stop cleanly on SIGTERM (exit %d):\n%s", prom_exit,
             prom_log(p));
  f->daemon_up = false;
  assert_int_equal(cph_test_daemon_stop(&f->d), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_prometheus_scrapes_turns_started_from_cephalond, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
