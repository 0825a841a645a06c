/* The files in deploy/ are what an operator installs as they are, so they are checked like
 * code: the Grafana dashboard is valid JSON whose every panel queries only metrics cephalond
 * exports (DESIGN §10), the systemd unit carries the keys the service relies on (and passes
 * `systemd-analyze verify` where that tool exists), and the Prometheus config scrapes
 * cephalond (and passes `promtool check config` where that tool exists). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* The metric names GET /metrics exports (histograms by their _bucket series). */
static const char *const METRICS[] = {
    "cephalon_turns_started_total",       "cephalon_turns_completed_total",
    "cephalon_lane_turn_tokens",          "cephalon_lane_tool_call_tokens",
    "cephalon_lane_runnable_sessions",    "cephalon_lane_running_turns",
    "cephalon_pick_wait_seconds_bucket",  "cephalon_outbox_pending",
    "cephalon_outbox_oldest_age_seconds", "cephalon_compaction_groups_committed_total",
    "cephalon_memories_deleted_total",    "cephalon_events_total",
    "cephalon_dedupe_exact_hits_total",   "cephalon_dedupe_near_hits_total",
    "cephalon_backpressure_step",         "cephalon_policy_reload_failures_total",
    "cephalon_policy_generation",
};
#define N_METRICS (sizeof METRICS / sizeof METRICS[0])

static bool known_metric(const char *name) {
  for (size_t i = 0; i < N_METRICS; i++)
    if (strcmp(name, METRICS[i]) == 0)
      return true;
  return false;
}

/* ---------------------------------------------------------------- PromQL metric names */

#define MAX_NAMES 16
#define NAME_MAX_LEN 128

typedef struct promql_names {
  char names[MAX_NAMES][NAME_MAX_LEN];
  size_t n;
  bool overflow;
} promql_names;

static bool ident_start(char c) { return isalpha((unsigned char)c) || c == '_' || c == ':'; }
static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == ':'; }

/* Keywords followed by a parenthesised label list ("sum by (lane)"). */
static bool grouping_keyword(const char *w) {
  static const char *const kw[] = {"by", "without", "on", "ignoring", "group_left", "group_right"};
  for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
    if (strcmp(w, kw[i]) == 0)
      return true;
  return false;
}

/* Aggregation operators: "sum by (lane) (...)" puts a keyword, not '(', after the name. */
static bool aggregation(const char *w) {
  static const char *const kw[] = {"sum",     "avg",      "min",    "max",
                                   "count",   "stddev",   "stdvar", "topk",
                                   "bottomk", "quantile", "group",  "count_values"};
  for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
    if (strcmp(w, kw[i]) == 0)
      return true;
  return false;
}

/* Binary operators and modifiers spelled as words. */
static bool word_operator(const char *w) {
  static const char *const kw[] = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"};
  for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
    if (strcasecmp(w, kw[i]) == 0)
      return true;
  return false;
}

/* Index just past the bracket that closes the one at s[i] (open/close), skipping quoted
 * strings; strlen(s) when it never closes. */
static size_t skip_bracketed(const char *s, size_t i, char open, char close) {
  int depth = 0;
  for (; s[i]; i++) {
    char c = s[i];
    if (c == '"' || c == '\'' || c == '`') {
      for (i++; s[i] && s[i] != c; i++)
        if (s[i] == '\\' && c != '`' && s[i + 1])
          i++;
      if (!s[i])
        return i;
      continue;
    }
    if (c == open)
      depth++;
    else if (c == close && --depth == 0)
      return i + 1;
  }
  return i;
}

/* The metric names a PromQL expression selects: identifiers that are not function names
 * (followed by '('), aggregation operators or keywords, and not inside label matchers {...},
 * range/subquery brackets [...], grouping label lists, or strings. Enough PromQL for
 * dashboards; not a full parser. */
static void promql_metric_names(const char *expr, promql_names *out) {
  memset(out, 0, sizeof *out);
  size_t i = 0;
  while (expr[i]) {
    char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {
      size_t j = i + 1;
      for (; expr[j] && expr[j] != c; j++)
        if (expr[j] == '\\' && c != '`' && expr[j + 1])
          j++;
      i = expr[j] ? j + 1 : j;
    } else if (c == '{') {
      i = skip_bracketed(expr, i, '{', '}');
    } else if (c == '[') {
      i = skip_bracketed(expr, i, '[', ']');
    } else if (c == '$') { /* a dashboard variable outside a matcher: $__interval */
      for (i++; ident_char(expr[i]); i++) {
      }
    } else if (isdigit((unsigned char)c) || (c == '.' && isdigit((unsigned char)expr[i + 1]))) {
      for (; isalnum((unsigned char)expr[i]) || expr[i] == '.'; i++) { /* 0.99, 1e3, 5m */
      }
    } else if (ident_start(c)) {
      char word[NAME_MAX_LEN];
      size_t n = 0;
      for (; ident_char(expr[i]); i++)
        if (n + 1 < sizeof word)
          word[n++] = expr[i];
      word[n] = '\0';
      size_t j = i;
      while (isspace((unsigned char)expr[j]))
        j++;
      if (grouping_keyword(word)) {
        if (expr[j] == '(')
          i = skip_bracketed(expr, j, '(', ')');
      } else if (expr[j] == '(' || aggregation(word) || word_operator(word)) {
        /* a function or aggregation, or an operator word */
      } else if (out->n < MAX_NAMES) {
        snprintf(out->names[out->n++], NAME_MAX_LEN, "%s", word);
      } else {
        out->overflow = true;
      }
    } else {
      i++;
    }
  }
}

static void test_promql_names_skip_functions_labels_and_ranges(void **state) {
  (void)state;
  promql_names p;
  promql_metric_names("histogram_quantile(0.99, sum by (lane, le) "
                      "(rate(cephalon_pick_wait_seconds_bucket{lane=\"in{x}\",le=~\"$v\"}[5m])))",
                      &p);
  assert_int_equal(p.n, 1);
  assert_string_equal(p.names[0], "cephalon_pick_wait_seconds_bucket");

  promql_metric_names("sum(rate(a_total[1m])) by (status) / ignoring(x) group_left b_total "
                      "offset 5m or vector(0) and on() c",
                      &p);
  assert_int_equal(p.n, 3);
  assert_string_equal(p.names[0], "a_total");
  assert_string_equal(p.names[1], "b_total");
  assert_string_equal(p.names[2], "c");
}

/* Proves the dashboard check below is not vacuous: an unknown name is caught. */
static void test_promql_names_catch_a_metric_that_is_not_exported(void **state) {
  (void)state;
  promql_names p;
  promql_metric_names("sum by (lane) (rate(cephalon_turns_started_totl[1m]))", &p);
  assert_int_equal(p.n, 1);
  assert_false(known_metric(p.names[0]));
}

/* ---------------------------------------------------------------- the Grafana dashboard */

static json_t *load_dashboard(void) {
  char *path = cph_test_source_path("deploy/grafana-dashboard.json");
  json_error_t jerr;
  json_t *d = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  if (!d)
    fail_msg("%s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column, jerr.text);
  free(path);
  return d;
}

static void test_dashboard_is_valid_grafana_json(void **state) {
  (void)state;
  json_t *d = load_dashboard();
  assert_true(json_is_object(d));
  assert_true(json_is_string(json_object_get(d, "title")));
  assert_true(json_is_string(json_object_get(d, "uid")));
  assert_true(json_is_integer(json_object_get(d, "schemaVersion")));
  json_t *panels = json_object_get(d, "panels");
  assert_true(json_is_array(panels));
  assert_true(json_array_size(panels) >= 8);

  json_int_t ids[64];
  size_t n_ids = 0;
  size_t i;
  json_t *p;
  json_array_foreach(panels, i, p) {
    const char *title = json_string_value(json_object_get(p, "title"));
    if (!title || !*title)
      fail_msg("panel %zu has no title", i);
    if (!json_is_string(json_object_get(p, "type")))
      fail_msg("panel '%s' has no type", title);
    json_t *id = json_object_get(p, "id");
    if (!json_is_integer(id))
      fail_msg("panel '%s' has no integer id", title);
    for (size_t k = 0; k < n_ids; k++)
      if (ids[k] == json_integer_value(id))
        fail_msg("panel '%s' reuses id %lld", title, (long long)ids[k]);
    assert_true(n_ids < 64);
    ids[n_ids++] = json_integer_value(id);
    json_t *grid = json_object_get(p, "gridPos");
    const char *keys[] = {"h", "w", "x", "y"};
    for (size_t k = 0; k < 4; k++)
      if (!json_is_integer(json_object_get(grid, keys[k])))
        fail_msg("panel '%s': gridPos.%s missing", title, keys[k]);
    if (json_integer_value(json_object_get(grid, "x")) +
            json_integer_value(json_object_get(grid, "w")) >
        24)
      fail_msg("panel '%s' is wider than Grafana's 24 columns", title);
  }
  json_decref(d);
}

/* Every panel has targets, and every target's expr selects at least one metric, all of
 * them exported by cephalond; together the panels cover what the dashboard promises. */
static void test_dashboard_queries_only_exported_metrics(void **state) {
  (void)state;
  json_t *d = load_dashboard();
  bool used[N_METRICS] = {false};
  bool has_quantile = false, has_turn_rate = false;
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(d, "panels"), i, p) {
    const char *title = json_string_value(json_object_get(p, "title"));
    json_t *targets = json_object_get(p, "targets");
    if (!json_is_array(targets) || json_array_size(targets) == 0)
      fail_msg("panel '%s' has no targets", title);
    size_t t;
    json_t *target;
    json_array_foreach(targets, t, target) {
      const char *expr = json_string_value(json_object_get(target, "expr"));
      if (!expr || !*expr)
        fail_msg("panel '%s' target %zu has no expr", title, t);
      if (!json_is_string(json_object_get(target, "refId")))
        fail_msg("panel '%s' target %zu has no refId", title, t);
      promql_names names;
      promql_metric_names(expr, &names);
      if (names.n == 0 || names.overflow)
        fail_msg("panel '%s': cannot tell the metrics of '%s'", title, expr);
      for (size_t k = 0; k < names.n; k++) {
        if (!known_metric(names.names[k]))
          fail_msg("panel '%s' queries '%s', which cephalond does not export (in '%s')", title,
                   names.names[k], expr);
        for (size_t m = 0; m < N_METRICS; m++)
          if (strcmp(names.names[k], METRICS[m]) == 0)
            used[m] = true;
      }
      if (strstr(expr, "histogram_quantile(") && strstr(expr, "cephalon_pick_wait_seconds_bucket"))
        has_quantile = true;
      if (strstr(expr, "rate(cephalon_turns_started_total"))
        has_turn_rate = true;
    }
  }
  assert_true(has_quantile);
  assert_true(has_turn_rate);
  /* The panels the deploy README lists: lanes, maintenance, ingest, backpressure. */
  static const char *const required[] = {"cephalon_turns_started_total",
                                         "cephalon_lane_turn_tokens",
                                         "cephalon_lane_runnable_sessions",
                                         "cephalon_pick_wait_seconds_bucket",
                                         "cephalon_outbox_pending",
                                         "cephalon_outbox_oldest_age_seconds",
                                         "cephalon_compaction_groups_committed_total",
                                         "cephalon_memories_deleted_total",
                                         "cephalon_events_total",
                                         "cephalon_dedupe_exact_hits_total",
                                         "cephalon_dedupe_near_hits_total",
                                         "cephalon_backpressure_step"};
  for (size_t r = 0; r < sizeof required / sizeof required[0]; r++)
    for (size_t m = 0; m < N_METRICS; m++)
      if (strcmp(required[r], METRICS[m]) == 0 && !used[m])
        fail_msg("no panel shows %s", required[r]);
  json_decref(d);
}

/* ---------------------------------------------------------------- the systemd unit */

#define UNIT_MAX_KEYS 128

typedef struct unit_entry {
  char section[32];
  char key[64];
  char value[256];
} unit_entry;

typedef struct unit_file {
  unit_entry e[UNIT_MAX_KEYS];
  size_t n;
} unit_file;

/* A systemd unit file as [Section] Key=Value lines; comments (# ;) and blanks skipped.
 * Fails the test on a line that is neither, on an unknown section, or on a continuation
 * line (the unit uses none, so one would be a mistake). */
static void unit_parse(const char *text, unit_file *u) {
  memset(u, 0, sizeof *u);
  char section[32] = "";
  int lineno = 0;
  for (const char *line = text; *line;) {
    size_t len = strcspn(line, "\n");
    char buf[512];
    lineno++;
    assert_true(len < sizeof buf);
    memcpy(buf, line, len);
    buf[len] = '\0';
    line += len + (line[len] == '\n');
    char *s = buf;
    while (isspace((unsigned char)*s))
      s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
      *--end = '\0';
    if (!*s || *s == '#' || *s == ';')
      continue;
    if (end[-1] == '\\')
      fail_msg("unit line %d: continuation lines are not expected", lineno);
    if (*s == '[') {
      if (end[-1] != ']' || (size_t)(end - s) - 2 >= sizeof section)
        fail_msg("unit line %d: bad section header '%s'", lineno, s);
      snprintf(section, sizeof section, "%.*s", (int)(end - s - 2), s + 1);
      if (strcmp(section, "Unit") != 0 && strcmp(section, "Service") != 0 &&
          strcmp(section, "Install") != 0)
        fail_msg("unit line %d: unexpected section [%s]", lineno, section);
      continue;
    }
    char *eq = strchr(s, '=');
    if (!eq || !section[0])
      fail_msg("unit line %d: not Key=Value inside a section: '%s'", lineno, s);
    assert_true(u->n < UNIT_MAX_KEYS);
    unit_entry *e = &u->e[u->n++];
    snprintf(e->section, sizeof e->section, "%s", section);
    snprintf(e->key, sizeof e->key, "%.*s", (int)(eq - s), s);
    snprintf(e->value, sizeof e->value, "%s", eq + 1);
  }
}

/* The last value of section.key (systemd: later assignments win), NULL if unset. */
static const char *unit_get(const unit_file *u, const char *section, const char *key) {
  const char *v = NULL;
  for (size_t i = 0; i < u->n; i++)
    if (strcmp(u->e[i].section, section) == 0 && strcmp(u->e[i].key, key) == 0)
      v = u->e[i].value;
  return v;
}

static void expect_unit_key(const unit_file *u, const char *section, const char *key,
                            const char *want) {
  const char *v = unit_get(u, section, key);
  if (!v)
    fail_msg("cephalond.service: [%s] %s is not set (want '%s')", section, key, want);
  if (strcmp(v, want) != 0)
    fail_msg("cephalond.service: [%s] %s=%s, want '%s'", section, key, v, want);
}

/* The keys the service depends on, checked by reading the file: always, whether or not
 * systemd-analyze is installed. */
static void test_unit_has_the_required_keys(void **state) {
  (void)state;
  char *path = cph_test_source_path("deploy/cephalond.service");
  char *text = cph_test_read_file(path, NULL);
  if (!text)
    fail_msg("cannot read %s", path);
  unit_file *u = malloc(sizeof *u);
  assert_non_null(u);
  unit_parse(text, u);
  const char *desc = unit_get(u, "Unit", "Description");
  assert_true(desc && *desc);
  expect_unit_key(u, "Service", "Type", "simple");
  expect_unit_key(u, "Service", "ExecStart",
                  "/usr/local/bin/cephalond --policy /etc/cephalon/policy.edn "
                  "--data /var/lib/cephalon");
  expect_unit_key(u, "Service", "ExecReload", "/bin/kill -HUP $MAINPID");
  expect_unit_key(u, "Service", "User", "cephalon");
  expect_unit_key(u, "Service", "Restart", "on-failure");
  expect_unit_key(u, "Service", "NoNewPrivileges", "yes");
  expect_unit_key(u, "Service", "ProtectSystem", "strict");
  expect_unit_key(u, "Service", "ReadWritePaths", "/var/lib/cephalon");
  expect_unit_key(u, "Service", "PrivateTmp", "yes");
  expect_unit_key(u, "Service", "ProtectHome", "yes");
  expect_unit_key(u, "Service", "CapabilityBoundingSet", "");
  expect_unit_key(u, "Install", "WantedBy", "multi-user.target");
  free(u);
  free(text);
  free(path);
}

static bool executable(const char *path) { return access(path, X_OK) == 0; }

/* Verifies deploy/<unit> with ExecStart's binary (/usr/local/bin/<binary>) pointed at the one
 * just built. */
static void verify_unit(const char *tool, const char *unit, const char *binary) {
  char *rel;
  assert_true(asprintf(&rel, "deploy/%s", unit) > 0);
  char *src = cph_test_source_path(rel);
  char *text = cph_test_read_file(src, NULL);
  assert_non_null(text);
  const char *bin_dir = getenv("CPH_BIN_DIR");
  assert_non_null(bin_dir);
  char *built, *needle;
  assert_true(asprintf(&built, "%s/%s", bin_dir, binary) > 0);
  assert_true(executable(built));
  assert_true(asprintf(&needle, "ExecStart=/usr/local/bin/%s ", binary) > 0);
  char *at = strstr(text, needle);
  assert_non_null(at);
  char *copy;
  assert_true(asprintf(&copy, "%.*sExecStart=%s %s", (int)(at - text), text, built,
                       at + strlen(needle)) > 0);
  char *dir = cph_test_tmpdir("unit");
  char *unit_path;
  assert_true(asprintf(&unit_path, "%s/%s", dir, unit) > 0);
  FILE *f = fopen(unit_path, "w");
  assert_non_null(f);
  assert_true(fputs(copy, f) >= 0);
  assert_int_equal(fclose(f), 0);

  char *out = NULL, *err = NULL;
  int status =
      cph_test_run((const char *const[]){tool, "verify", "--man=no", unit_path, NULL}, &out, &err);
  if (status != 0 || strstr(err, unit) || strstr(out, unit))
    fail_msg("systemd-analyze verify %s: exit %d\nstdout: %s\nstderr: %s", unit, status, out, err);
  free(out);
  free(err);
  cph_test_rmtree(dir);
  free(dir);
  free(unit_path);
  free(copy);
  free(needle);
  free(built);
  free(text);
  free(src);
  free(rel);
}

/* Where systemd-analyze exists, the units must verify without a single complaint about them.
 * verify insists that ExecStart's binary exists, so a copy points it at the binary just
 * built; everything else is the file as shipped. Without the tool the test says so (the
 * keys are asserted by test_unit_has_the_required_keys either way). */
static void test_unit_passes_systemd_analyze_verify(void **state) {
  (void)state;
  const char *tool = executable("/usr/bin/systemd-analyze") ? "/usr/bin/systemd-analyze"
                     : executable("/bin/systemd-analyze")   ? "/bin/systemd-analyze"
                                                            : NULL;
  if (!tool) {
    print_message("systemd-analyze not installed: the units are checked by their keys only\n");
    return;
  }
  verify_unit(tool, "cephalond.service", "cephalond");
  verify_unit(tool, "cephalon-worker.service", "cephalon-worker");
}

/* The worker's unit: its config, its environment file for keys, a clean SIGTERM stop. */
static void test_worker_unit_has_the_required_keys(void **state) {
  (void)state;
  char *path = cph_test_source_path("deploy/cephalon-worker.service");
  char *text = cph_test_read_file(path, NULL);
  if (!text)
    fail_msg("cannot read %s", path);
  unit_file *u = malloc(sizeof *u);
  assert_non_null(u);
  unit_parse(text, u);
  expect_unit_key(u, "Service", "Type", "simple");
  expect_unit_key(u, "Service", "ExecStart",
                  "/usr/local/bin/cephalon-worker --config /etc/cephalon/worker.edn");
  expect_unit_key(u, "Service", "EnvironmentFile", "-/etc/cephalon/worker.env");
  expect_unit_key(u, "Service", "User", "cephalon");
  expect_unit_key(u, "Service", "Restart", "on-failure");
  expect_unit_key(u, "Service", "KillMode", "mixed");
  expect_unit_key(u, "Service", "NoNewPrivileges", "yes");
  expect_unit_key(u, "Service", "ProtectSystem", "strict");
  expect_unit_key(u, "Service", "CapabilityBoundingSet", "");
  expect_unit_key(u, "Install", "WantedBy", "multi-user.target");
  free(u);
  free(text);
  free(path);
  /* The example config it points at is one the worker reads. */
  char *example = cph_test_source_path("deploy/worker.edn.example");
  const char *bin_dir = getenv("CPH_BIN_DIR");
  char *exe;
  assert_true(asprintf(&exe, "%s/cephalon-worker", bin_dir) > 0);
  char *out = NULL, *err = NULL;
  /* --check-config reads it and prints the effective options; nothing is started. */
  int status = cph_test_run((const char *const[]){exe, "--config", example, "--check-config", NULL},
                            &out, &err);
  if (status != 0 || !strstr(out, ":model \"llama3.2\"") || !strstr(out, ":concurrency 4") ||
      !strstr(out, "\"fs\" \"npx -y @modelcontextprotocol/server-filesystem"))
    fail_msg("worker.edn.example: exit %d\n%s%s", status, out, err);
  free(out);
  free(err);
  free(exe);
  free(example);
}

/* ---------------------------------------------------------------- the cluster's files */

/* deploy/cluster/: a node's policy cephalonctl accepts, with the :cluster section a node needs;
 * a NATS JetStream server config nats-server accepts (it is installed with the dependencies:
 * without it the test fails and says so); and the cephalond drop-in that orders it after
 * etcd and NATS. */
static void test_cluster_files_are_what_their_tools_accept(void **state) {
  (void)state;
  const char *bin_dir = getenv("CPH_BIN_DIR");
  char *ctl, *out = NULL, *err = NULL;
  assert_true(asprintf(&ctl, "%s/cephalonctl", bin_dir) > 0);
  char *policy = cph_test_source_path("deploy/cluster/node.policy.edn.example");
  int status =
      cph_test_run((const char *const[]){ctl, "policy", "check", policy, NULL}, &out, &err);
  if (status != 0 || !strstr(out, ":cluster {:node \"a\"") || !strstr(out, ":replicas 3") ||
      !strstr(out, ":nats [\"nats://"))
    fail_msg("node.policy.edn.example: exit %d\n%s%s", status, out, err);
  free(out);
  free(err);
  const char *nats = executable("/usr/sbin/nats-server")  ? "/usr/sbin/nats-server"
                     : executable("/usr/bin/nats-server") ? "/usr/bin/nats-server"
                                                          : NULL;
  if (!nats)
    fail_msg("nats-server is not installed (Debian package nats-server, which "
             "scripts/install-deps.sh installs): cannot check deploy/cluster/nats-server.conf");
  char *conf = cph_test_source_path("deploy/cluster/nats-server.conf");
  status = cph_test_run((const char *const[]){nats, "-t", "-c", conf, NULL}, &out, &err);
  if (status != 0 || !strstr(err, "is valid"))
    fail_msg("nats-server -t -c %s: exit %d\n%s%s", conf, status, out, err);
  free(out);
  free(err);
  char *text = cph_test_read_file(conf, NULL);
  assert_non_null(strstr(text, "jetstream {"));
  assert_non_null(strstr(text, "cluster {"));
  free(text);
  char *dropin = cph_test_source_path("deploy/cluster/cephalond-cluster.conf");
  text = cph_test_read_file(dropin, NULL);
  assert_non_null(text);
  unit_file *u = malloc(sizeof *u);
  assert_non_null(u);
  unit_parse(text, u);
  const char *after = unit_get(u, "Unit", "After");
  assert_true(after && strstr(after, "etcd.service") && strstr(after, "nats-server.service"));
  free(u);
  free(text);
  free(dropin);
  free(conf);
  free(policy);
  free(ctl);
}

/* ---------------------------------------------------------------- the Prometheus config */

static void test_prometheus_config_scrapes_cephalond(void **state) {
  (void)state;
  char *path = cph_test_source_path("deploy/prometheus.yml");
  char *text = cph_test_read_file(path, NULL);
  if (!text)
    fail_msg("cannot read %s", path);
  assert_non_null(strstr(text, "scrape_configs:"));
  assert_non_null(strstr(text, "job_name: cephalon"));
  assert_non_null(strstr(text, "metrics_path: /metrics"));
  assert_non_null(strstr(text, "\"127.0.0.1:7070\""));
  /* The bearer-token variant is there, commented out. */
  assert_non_null(strstr(text, "#   authorization:"));
  assert_non_null(strstr(text, "#     type: Bearer"));
  assert_non_null(strstr(text, "#     credentials_file:"));

  const char *tool = executable("/usr/bin/promtool") ? "/usr/bin/promtool" : NULL;
  if (tool) {
    char *out = NULL, *err = NULL;
    int status =
        cph_test_run((const char *const[]){tool, "check", "config", path, NULL}, &out, &err);
    if (status != 0)
      fail_msg("promtool check config %s: exit %d\n%s%s", path, status, out, err);
    free(out);
    free(err);
  } else {
    print_message("promtool not installed: prometheus.yml checked by its contents only\n");
  }
  free(text);
  free(path);
}

static void test_readme_describes_each_file(void **state) {
  (void)state;
  char *path = cph_test_source_path("deploy/README.md");
  char *text = cph_test_read_file(path, NULL);
  if (!text)
    fail_msg("cannot read %s", path);
  assert_non_null(strstr(text, "cephalond.service"));
  assert_non_null(strstr(text, "cephalon-worker.service"));
  assert_non_null(strstr(text, "prometheus.yml"));
  assert_non_null(strstr(text, "grafana-dashboard.json"));
  assert_non_null(strstr(text, "cluster/node.policy.edn.example"));
  assert_non_null(strstr(text, "cluster/nats-server.conf"));
  assert_non_null(strstr(text, "cluster/cephalond-cluster.conf"));
  free(text);
  free(path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_promql_names_skip_functions_labels_and_ranges),
      cmocka_unit_test(test_promql_names_catch_a_metric_that_is_not_exported),
      cmocka_unit_test(test_dashboard_is_valid_grafana_json),
      cmocka_unit_test(test_dashboard_queries_only_exported_metrics),
      cmocka_unit_test(test_unit_has_the_required_keys),
      cmocka_unit_test(test_unit_passes_systemd_analyze_verify),
      cmocka_unit_test(test_worker_unit_has_the_required_keys),
      cmocka_unit_test(test_prometheus_config_scrapes_cephalond),
      cmocka_unit_test(test_cluster_files_are_what_their_tools_accept),
      cmocka_unit_test(test_readme_describes_each_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
