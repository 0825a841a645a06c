/* GET /metrics against the real cephalond (DESIGN §10): the scrape passes the real
 * `promtool check metrics` (Debian package prometheus, installed by scripts/install-deps.sh),
 * counters move with traffic by exactly what the traffic did, pick waits are counted once per
 * started turn, rejected reloads (API and SIGHUP) are counted and leave the generation alone,
 * a valid reload shows its budgets on the next scrape, the route honours scopes, and
 * :metrics :enabled? false answers 404. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* Content dedupe off, so every distinct event is `queued` whatever its text. */
#define POLICY_BODY(turns)                                                                    \
  "{:scheduler {:concurrency 4\n"                                                             \
  "             :lanes {:interactive {:turns " turns " :tool-calls 1200}}}\n"                 \
  " :dedupe {:window-seconds 0}\n"                                                            \
  " :store {:sync :none}}\n"

static const char *POLICY = POLICY_BODY("600");
static const char *POLICY_RELOADED = POLICY_BODY("90");

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int start_with(void **state, const char *policy_text) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", policy_text);
  *state = f;
  return cph_test_daemon_start(&f->d, f->policy, NULL, NULL) == 0 ? 0 : -1;
}

static int setup(void **state) { return start_with(state, POLICY); }

static int teardown(void **state) {
  fixture *f = *state;
  if (f->d.pid > 0)
    assert_int_equal(cph_test_daemon_stop(&f->d), 0); /* clean exit, no sanitizer report */
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

static void write_policy(fixture *f, const char *text) {
  FILE *fp = fopen(f->policy, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
}

static json_t *call_ok(fixture *f, const char *method, const char *path, const char *body,
                       int want) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  if (r.status != want)
    fail_msg("%s %s: want %d, got %d: %s", method, path, want, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  return j;
}

/* GET /metrics: 200 with the 0.0.4 content type; the body (free it). */
static char *scrape(fixture *f) {
  cph_test_response r = cph_test_http(f->d.port, "GET", "/metrics", NULL, NULL);
  if (r.status != 200)
    fail_msg("GET /metrics: %d %s", r.status, r.body ? r.body : "");
  char ct[128];
  assert_non_null(cph_test_header(&r, "Content-Type", ct, sizeof ct));
  assert_string_equal(ct, "text/plain; version=0.0.4; charset=utf-8");
  char *body = r.body;
  r.body = NULL;
  cph_test_response_free(&r);
  return body;
}

/* The value of the sample line that starts with `series ` ("name{labels}" as written). */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ')
      return strtod(p + n + 1, NULL);
  fail_msg("no sample %s in the scrape:\n%s", series, text);
  return NAN;
}

static double lane_sample(const char *text, const char *name, const char *lane) {
  char series[160];
  snprintf(series, sizeof series, "%s{lane=\"%s\"}", name, lane);
  return sample(text, series);
}

/* Leases the next turn (waiting up to 5 s) and completes it with these tool_stats. */
static void run_turn(fixture *f, unsigned valid, unsigned invalid, unsigned repairs,
                     unsigned denies) {
  json_t *j = call_ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w1\",\"wait_ms\":5000}", 200);
  json_t *turn = json_object_get(j, "turn");
  assert_string_equal(json_string_value(json_object_get(turn, "lane")), "interactive");
  char path[96], body[512];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, sizeof body,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":10,\"tool_calls\":%u},"
           "\"tool_stats\":{\"valid\":%u,\"invalid\":%u,\"repairs\":%u,\"guard_denies\":%u,"
           "\"tools\":{\"read_file\":{\"calls\":%u,\"invalid\":%u,\"errors\":0},"
           "\"web \\\"search\\\"\":{\"calls\":1,\"errors\":1}}}}",
           json_string_value(json_object_get(turn, "lease")), valid + invalid, valid, invalid,
           repairs, denies, valid + invalid, invalid);
  json_decref(j);
  json_decref(call_ok(f, "POST", path, body, 200));
}

static void test_scrape_passes_promtool_and_counts_the_traffic(void **state) {
  fixture *f = *state;
  char *before = scrape(f);
  cph_test_promtool_check(before);
  assert_int_equal(lane_sample(before, "cephalon_turns_started_total", "interactive"), 0);
  assert_int_equal(sample(before, "cephalon_events_total{status=\"queued\"}"), 0);
  free(before);

  json_decref(call_ok(f, "POST", "/v1/sessions",
                      "{\"id\":\"m1\",\"class\":\"interactive\",\"subscribe\":[\"ops\"]}", 200));
  /* three rounds: two events, then one turn carrying them, completed with tool_stats */
  enum { ROUNDS = 3, EVENTS_PER_ROUND = 2 };
  unsigned valid_sum = 0, invalid_sum = 0, repairs_sum = 0, denies_sum = 0;
  for (unsigned i = 0; i < ROUNDS; i++) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"events\":[{\"channel\":\"ops\",\"sender\":\"ann\",\"body\":\"round %u: the "
             "build is green\"},{\"channel\":\"ops\",\"sender\":\"bob\",\"body\":\"round %u: "
             "deploying now\"}]}",
             i, i);
    json_t *j = call_ok(f, "POST", "/v1/events", body, 200);
    json_t *results = json_object_get(j, "results");
    for (size_t k = 0; k < EVENTS_PER_ROUND; k++)
      assert_string_equal(
          json_string_value(json_object_get(json_array_get(results, k), "status")), "queued");
    json_decref(j);
    unsigned valid = i + 1, invalid = 1, repairs = i, denies = i % 2;
    run_turn(f, valid, invalid, repairs, denies);
    valid_sum += valid;
    invalid_sum += invalid;
    repairs_sum += repairs;
    denies_sum += denies;
  }
  /* one rejected event: counted by its status too */
  json_decref(call_ok(f, "POST", "/v1/events", "{\"events\":[{\"sender\":\"ann\",\"body\":\"x\"}]}",
                      200));

  char *t = scrape(f);
  cph_test_promtool_check(t);
  assert_true(lane_sample(t, "cephalon_turns_started_total", "interactive") >= ROUNDS);
  assert_int_equal(lane_sample(t, "cephalon_turns_started_total", "interactive"), ROUNDS);
  assert_int_equal(lane_sample(t, "cephalon_turns_completed_total", "interactive"), ROUNDS);
  assert_int_equal(lane_sample(t, "cephalon_turns_failed_total", "interactive"), 0);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"queued\"}"),
                   ROUNDS * EVENTS_PER_ROUND);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"rejected\"}"), 1);
  /* every started turn, in every lane (the janitor's job turns included), had its pick wait
   * observed once */
  static const char *const lanes[] = {"interactive", "operational", "maintenance"};
  for (int i = 0; i < 3; i++)
    assert_int_equal(lane_sample(t, "cephalon_pick_wait_seconds_count", lanes[i]),
                     lane_sample(t, "cephalon_turns_started_total", lanes[i]));
  assert_int_equal(sample(t, "cephalon_tool_calls_total{result=\"valid\"}"), valid_sum);
  assert_int_equal(sample(t, "cephalon_tool_calls_total{result=\"invalid\"}"), invalid_sum);
  assert_int_equal(sample(t, "cephalon_tool_call_repairs_total"), repairs_sum);
  /* the per-tool map: a series per tool and result, the label value escaped */
  assert_int_equal(sample(t, "cephalon_tool_calls_total{tool=\"read_file\",result=\"valid\"}"),
                   valid_sum);
  assert_int_equal(
      sample(t, "cephalon_tool_calls_total{tool=\"read_file\",result=\"invalid\"}"),
      invalid_sum);
  assert_int_equal(sample(t, "cephalon_tool_calls_total{tool=\"read_file\",result=\"error\"}"),
                   0);
  assert_int_equal(
      sample(t, "cephalon_tool_calls_total{tool=\"web \\\"search\\\"\",result=\"error\"}"),
      ROUNDS);
  assert_int_equal(
      sample(t, "cephalon_tool_calls_total{tool=\"web \\\"search\\\"\",result=\"valid\"}"),
      0);
  assert_int_equal(lane_sample(t, "cephalon_turn_tokens_total", "interactive"), 10 * ROUNDS);
  assert_int_equal(sample(t, "cephalon_guard_denies_total"), denies_sum);
  assert_true(sample(t, "cephalon_context_inclusion_count_count") >= ROUNDS);
  assert_true(sample(t, "cephalon_sessions") >= 1);
  assert_int_equal(lane_sample(t, "cephalon_lane_budget_turns_per_minute", "interactive"), 600);
  assert_true(lane_sample(t, "cephalon_lane_turn_tokens", "interactive") <= 600);
  assert_true(sample(t, "cephalon_lmdb_used_bytes") > 0);
  assert_true(sample(t, "cephalon_lmdb_map_size_bytes") >= sample(t, "cephalon_lmdb_used_bytes"));
  assert_true(sample(t, "cephalon_scheduler_passes_total") > 0);
  free(t);
}

static void test_rejected_reloads_are_counted_and_a_valid_one_shows_its_budget(void **state) {
  fixture *f = *state;
  char *t = scrape(f);
  assert_int_equal(sample(t, "cephalon_policy_generation"), 1);
  assert_int_equal(sample(t, "cephalon_policy_reload_failures_total"), 0);
  free(t);

  /* over the API */
  write_policy(f, "{:scheduler {:concurrency \"four\"}}\n");
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/admin/policy/reload", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", NULL);
  cph_test_response_free(&r);
  t = scrape(f);
  assert_int_equal(sample(t, "cephalon_policy_reload_failures_total"), 1);
  assert_int_equal(sample(t, "cephalon_policy_generation"), 1);
  free(t);

  /* on SIGHUP: the daemon handles it on its loop, so scrape until it shows (at most 5 s) */
  kill(f->d.pid, SIGHUP);
  int64_t until = cph_test_now_ms() + 5000;
  for (t = scrape(f); sample(t, "cephalon_policy_reload_failures_total") < 2 &&
                      cph_test_now_ms() < until;
       t = scrape(f)) {
    free(t);
    usleep(20 * 1000);
  }
  assert_int_equal(sample(t, "cephalon_policy_reload_failures_total"), 2);
  assert_int_equal(sample(t, "cephalon_policy_generation"), 1);
  assert_int_equal(lane_sample(t, "cephalon_lane_budget_turns_per_minute", "interactive"), 600);
  free(t);

  /* a valid one: the next scrape has the new generation and budget */
  write_policy(f, POLICY_RELOADED);
  json_decref(call_ok(f, "POST", "/v1/admin/policy/reload", NULL, 200));
  t = scrape(f);
  cph_test_promtool_check(t);
  assert_int_equal(sample(t, "cephalon_policy_generation"), 2);
  assert_int_equal(sample(t, "cephalon_policy_reload_failures_total"), 2);
  assert_int_equal(lane_sample(t, "cephalon_lane_budget_turns_per_minute", "interactive"), 90);
  assert_int_equal(
      lane_sample(t, "cephalon_lane_budget_tool_calls_per_minute", "interactive"), 1200);
  free(t);
}

static void test_metrics_disabled_answers_404(void **state) {
  fixture *f = *state;
  cph_test_response r = cph_test_http(f->d.port, "GET", "/metrics", NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", NULL);
  cph_test_response_free(&r);
}

static int setup_disabled(void **state) {
  return start_with(state, "{:metrics {:enabled? false}}\n");
}

static const char *TOK_READ = "tok-read-metrics-5c1e";
static const char *TOK_INGEST = "tok-ingest-metrics-77a0";

static int setup_auth(void **state) {
  char *read_hash = cph_test_sha256_hex(TOK_READ), *ingest_hash = cph_test_sha256_hex(TOK_INGEST);
  char *text;
  if (asprintf(&text,
               "{:auth {:tokens [{:name \"prometheus\" :sha256 \"%s\" :scopes #{:read}}\n"
               "                 {:name \"connector\" :sha256 \"%s\" :scopes #{:ingest}}]}}\n",
               read_hash, ingest_hash) < 0)
    abort();
  free(read_hash);
  free(ingest_hash);
  int rc = start_with(state, text);
  free(text);
  return rc;
}

static void test_metrics_need_the_read_scope(void **state) {
  fixture *f = *state;
  cph_test_response r = cph_test_api(f->d.port, "GET", "/metrics", NULL, NULL);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/metrics", TOK_INGEST, NULL);
  cph_test_expect_error(&r, 403, "forbidden", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/metrics", TOK_READ, NULL);
  assert_int_equal(r.status, 200);
  cph_test_promtool_check(r.body);
  cph_test_response_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_scrape_passes_promtool_and_counts_the_traffic, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_rejected_reloads_are_counted_and_a_valid_one_shows_its_budget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_metrics_disabled_answers_404, setup_disabled,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_metrics_need_the_read_scope, setup_auth, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
