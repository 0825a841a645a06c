/* Duplicate families and channel state over HTTP against the real cephalond
 * (DESIGN §5, §9): GET /v1/aggregates?top= and GET /v1/channels/{id}. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

static const char *POLICY =
    "{:sessions {:janitor? false}\n"
    " :dedupe {:window-seconds 300 :min-length 12}\n"
    " :backpressure {:interval-s 10 :recover-intervals 3\n"
    "                :channels {\"367156652140658699\" {:max-events-per-minute 600\n"
    "                                                 :degrade-to-aggregate-only? true}\n"
    "                           \"alerts\" {:max-family-growth-per-minute 30}}}}\n";

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", POLICY);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cph_test_daemon_stop(&f->d);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

/* A request; returns the parsed JSON body (or NULL) and the status in *status. */
static json_t *call(fixture *f, int *status, const char *method, const char *path,
                    const char *body) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  *status = r.status;
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  return j;
}

static const char *str(const json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}
static json_int_t num(const json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

/* Posts events [{channel, sender, body}] and returns the statuses joined by ','. */
static char *post(fixture *f, const char *events_json) {
  char *body = NULL;
  if (asprintf(&body, "{\"events\":%s}", events_json) < 0)
    abort();
  int st;
  json_t *j = call(f, &st, "POST", "/v1/events", body);
  free(body);
  assert_int_equal(st, 200);
  char *out = calloc(1, 1024);
  json_t *results = json_object_get(j, "results");
  for (size_t i = 0; i < json_array_size(results); i++) {
    if (i)
      strcat(out, ",");
    strcat(out, str(json_array_get(results, i), "status"));
  }
  json_decref(j);
  return out;
}

static void test_aggregates_lists_top_families_by_dup_count(void **state) {
  fixture *f = *state;
  int st;
  json_t *j = call(f, &st, "POST", "/v1/sessions",
                   "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}");
  assert_int_equal(st, 200);
  json_decref(j);

  char *statuses = post(
      f, "[{\"channel\":\"general\",\"sender\":\"a\",\"body\":\"disk full on node seven\"},"
         "{\"channel\":\"general\",\"sender\":\"a\",\"body\":\"disk full on node seven\"},"
         "{\"channel\":\"general\",\"sender\":\"a\",\"body\":\"DISK  full on node seven\"},"
         "{\"channel\":\"general\",\"sender\":\"b\",\"body\":\"deploy 42 finished fine\"},"
         "{\"channel\":\"general\",\"sender\":\"b\",\"body\":\"deploy 42 finished fine\"},"
         "{\"channel\":\"general\",\"sender\":\"c\",\"body\":\"ok\"},"
         "{\"channel\":\"general\",\"sender\":\"c\",\"body\":\"ok\"}]");
  assert_string_equal(statuses, "queued,aggregated,aggregated,queued,aggregated,queued,queued");
  free(statuses);

  j = call(f, &st, "GET", "/v1/aggregates?top=5", NULL);
  assert_int_equal(st, 200);
  json_t *list = json_object_get(j, "aggregates");
  assert_int_equal(json_array_size(list), 2);
  json_t *top = json_array_get(list, 0);
  assert_true(num(top, "family") > 0);
  assert_int_equal(num(top, "dup_count"), 3);
  assert_string_equal(str(top, "sample"), "disk full on node seven");
  assert_string_equal(json_string_value(json_array_get(json_object_get(top, "channels"), 0)),
                      "general");
  assert_true(num(top, "first_ms") > 0);
  assert_true(num(top, "last_ms") >= num(top, "first_ms"));
  assert_int_equal(num(json_array_get(list, 1), "dup_count"), 2);
  json_decref(j);

  j = call(f, &st, "GET", "/v1/aggregates?top=1", NULL);
  assert_int_equal(st, 200);
  assert_int_equal(json_array_size(json_object_get(j, "aggregates")), 1);
  json_decref(j);

  cph_test_response r = cph_test_api(f->d.port, "GET", "/v1/aggregates?top=many", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", "top");
  cph_test_response_free(&r);
}

static void test_channel_state_shows_step_rates_and_settings(void **state) {
  fixture *f = *state;
  int st;
  json_t *j = call(f, &st, "POST", "/v1/sessions",
                   "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}");
  json_decref(j);
  char *statuses = post(
      f, "[{\"channel\":\"general\",\"sender\":\"a\",\"body\":\"hello\"},"
         "{\"channel\":\"general\",\"sender\":\"a\",\"body\":\"world\"}]");
  free(statuses);

  j = call(f, &st, "GET", "/v1/channels/general", NULL);
  assert_int_equal(st, 200);
  assert_string_equal(str(j, "id"), "general");
  assert_int_equal(num(j, "step"), 0);
  assert_string_equal(str(j, "step_name"), "normal");
  assert_int_equal(num(j, "events_per_minute"), 2);
  assert_int_equal(json_array_size(json_object_get(j, "triggers")), 0);
  assert_int_equal(num(j, "subscribers"), 1);
  json_t *settings = json_object_get(j, "settings");
  assert_int_equal(num(settings, "max_events_per_minute"), 0);
  assert_int_equal(num(settings, "interval_s"), 10);
  assert_int_equal(num(settings, "recover_intervals"), 3);
  assert_int_equal(num(settings, "dedupe_window_seconds"), 300);
  json_decref(j);

  /* the seed channel: aggregate-only is its floor */
  j = call(f, &st, "GET", "/v1/channels/367156652140658699", NULL);
  assert_int_equal(st, 200);
  assert_int_equal(num(j, "step"), 1);
  assert_string_equal(str(j, "step_name"), "aggregate_only");
  settings = json_object_get(j, "settings");
  assert_int_equal(num(settings, "max_events_per_minute"), 600);
  assert_true(json_is_true(json_object_get(settings, "degrade_to_aggregate_only")));
  json_decref(j);
  /* aggregate-only stores what reaches nobody; only a repeat is "aggregated" */
  statuses = post(f, "[{\"channel\":\"367156652140658699\",\"sender\":\"a\",\"body\":\"hi\"}]");
  assert_string_equal(statuses, "stored");
  free(statuses);

  cph_test_response r = cph_test_api(f->d.port, "GET", "/v1/channels/nowhere", NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", NULL);
  cph_test_response_free(&r);
}

/* Waits up to timeout_ms for GET /v1/channels/{id} to show `step`; returns the last answer. */
static json_t *channel_wait_step(fixture *f, const char *id, json_int_t step, int timeout_ms) {
  char path[128];
  snprintf(path, sizeof path, "/v1/channels/%s", id);
  int64_t until = cph_test_now_ms() + timeout_ms;
  for (;;) {
    int st;
    json_t *j = call(f, &st, "GET", path, NULL);
    assert_int_equal(st, 200);
    if (num(j, "step") == step || cph_test_now_ms() >= until)
      return j;
    json_decref(j);
    usleep(50 * 1000);
  }
}

/* A JSON array of n copies of one monitor's alert in `channel`; free() it. */
static char *repeated_alert_json(const char *channel, int n) {
  char one[160];
  snprintf(one, sizeof one,
           "{\"channel\":\"%s\",\"sender\":\"monitor\","
           "\"body\":\"ALERT disk usage above 90%% on host alpha\"}",
           channel);
  size_t len = strlen(one) + 1;
  char *out = malloc((size_t)n * len + 2);
  assert_non_null(out);
  char *p = out;
  *p++ = '[';
  for (int i = 0; i < n; i++)
    p += sprintf(p, "%s%s", i ? "," : "", one);
  strcpy(p, "]");
  return out;
}

/* 50 identical alerts (issue 14): with the default policy (0 = no limit) the channel stays
 * at step 0 with no trigger; where the policy limits family growth to 30 a minute the channel
 * goes to step 1 and says why — in /v1/channels/{id}, in one log line and as the metric's
 * trigger label — while a channel held at step 1 by :degrade-to-aggregate-only? names the
 * policy. */
static void test_repeated_alert_degrades_only_under_a_limit_and_names_its_trigger(void **state) {
  fixture *f = *state;
  int st;
  json_decref(call(f, &st, "POST", "/v1/sessions",
                   "{\"id\":\"oncall\",\"class\":\"operational\","
                   "\"subscribe\":[\"ops\",\"alerts\"]}"));
  assert_int_equal(st, 200);
  char *ops = repeated_alert_json("ops", 50), *alerts = repeated_alert_json("alerts", 50);
  free(post(f, ops));
  free(post(f, alerts));
  free(ops);
  free(alerts);

  json_t *j = channel_wait_step(f, "alerts", 1, 5000);
  assert_int_equal(num(j, "step"), 1);
  assert_string_equal(str(j, "step_name"), "aggregate_only");
  json_t *trig = json_object_get(j, "trigger");
  assert_string_equal(str(trig, "name"), "family_growth");
  assert_int_equal(num(trig, "figure"), 49); /* the original is no growth */
  assert_int_equal(num(trig, "limit"), 30);
  json_t *list = json_object_get(j, "triggers");
  assert_int_equal(json_array_size(list), 1);
  assert_string_equal(json_string_value(json_array_get(list, 0)), "family_growth");
  json_decref(j);
  assert_true(cph_test_daemon_log_wait(
      &f->d, "backpressure: channel #alerts: step 0 -> 1 aggregate_only (family_growth 49/min > 30)",
      2000));

  /* by now the check ran over "ops" too (same check, same figures): still normal */
  j = channel_wait_step(f, "ops", 0, 0);
  assert_int_equal(num(j, "step"), 0);
  assert_true(json_is_null(json_object_get(j, "trigger")));
  assert_int_equal(json_array_size(json_object_get(j, "triggers")), 0);
  assert_int_equal(num(j, "events_per_minute"), 50);
  assert_int_equal(num(j, "family_growth_per_minute"), 49);
  json_decref(j);
  char *log = cph_test_daemon_log(&f->d);
  assert_null(strstr(log, "channel #ops:"));
  free(log);

  j = call(f, &st, "GET", "/v1/channels/367156652140658699", NULL);
  assert_int_equal(num(j, "step"), 1);
  trig = json_object_get(j, "trigger");
  assert_string_equal(str(trig, "name"), "policy");
  assert_true(json_is_null(json_object_get(trig, "figure")));
  json_decref(j);

  cph_test_response r = cph_test_api(f->d.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(
      strstr(r.body, "cephalon_backpressure_step{channel=\"alerts\",trigger=\"family_growth\"} 1\n"));
  assert_non_null(strstr(
      r.body, "cephalon_backpressure_step{channel=\"367156652140658699\",trigger=\"policy\"} 1\n"));
  assert_null(strstr(r.body, "cephalon_backpressure_step{channel=\"ops\""));
  cph_test_promtool_check(r.body);
  cph_test_response_free(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_aggregates_lists_top_families_by_dup_count, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_channel_state_shows_step_rates_and_settings, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_repeated_alert_degrades_only_under_a_limit_and_names_its_trigger, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
