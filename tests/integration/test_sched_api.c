/* Scheduling over HTTP against the real cephalond (DESIGN §3 rules 8–11, §9): `tenant` on
 * sessions (create, update, get, list, kept across a restart), /why's tenant and forecast,
 * credits charged by tokens, /v1/lanes' seats, token budget and recent completions, and a
 * reload refusing seats over concurrency with the keys named. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* Refill is slow so a charge stays visible; no janitor, so the lanes hold only our turns. */
static const char *POLICY =
    "{:sessions {:janitor? false}\n"
    " :scheduler {:concurrency 3\n"
    "             :lanes {:interactive {:turns 600 :tool-calls 600 :seats 1}\n"
    "                     :operational {:turns 600 :tool-calls 600 :tokens 100000}}\n"
    "             :credits {:refill-per-second 0.001 :max 30\n"
    "                       :charge :tokens :tokens-per-unit 1000}\n"
    "             :tenants {\"acme\" {:weight 3}}}}\n";

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

static json_t *call(fixture *f, int want, const char *method, const char *path, const char *body) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  if (r.status != want)
    fail_msg("%s %s: status %d, expected %d: %s", method, path, r.status, want,
             r.body ? r.body : "");
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

static void create(fixture *f, const char *id, const char *cls, const char *tenant) {
  char body[256];
  if (tenant)
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"%s\",\"tenant\":\"%s\"}", id, cls,
             tenant);
  else
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"%s\"}", id, cls);
  json_t *j = call(f, 200, "POST", "/v1/sessions", body);
  if (tenant)
    assert_string_equal(str(j, "tenant"), tenant);
  else
    assert_true(json_is_null(json_object_get(j, "tenant")));
  json_decref(j);
}

static json_t *get(fixture *f, const char *fmt, const char *id) {
  char path[160];
  snprintf(path, sizeof path, fmt, id);
  return call(f, 200, "GET", path, NULL);
}

static void post_to(fixture *f, const char *session, const char *text) {
  char body[256];
  snprintf(body, sizeof body,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"u\",\"body\":\"%s\"}]}", session, text);
  json_decref(call(f, 200, "POST", "/v1/events", body));
}

/* /why of id once its reason is `reason` (the pass that stages input comes soon). */
static json_t *why_when(fixture *f, const char *id, const char *reason) {
  for (int i = 0; i < 200; i++) {
    json_t *w = get(f, "/v1/sessions/%s/why", id);
    if (str(w, "reason") && strcmp(str(w, "reason"), reason) == 0)
      return w;
    json_decref(w);
    usleep(10000);
  }
  fail_msg("session %s never became %s", id, reason);
  return NULL;
}

static void test_tenant_is_kept_on_sessions_across_update_and_restart(void **state) {
  fixture *f = *state;
  create(f, "t-a1", "interactive", "acme");
  create(f, "t-d1", "operational", NULL);
  json_t *j = get(f, "/v1/sessions/%s", "t-a1");
  assert_string_equal(str(j, "tenant"), "acme");
  json_decref(j);

  j = call(f, 200, "PUT", "/v1/sessions/t-d1", "{\"tenant\":\"beta.co\"}");
  assert_string_equal(str(j, "tenant"), "beta.co");
  json_decref(j);
  j = call(f, 200, "PUT", "/v1/sessions/t-a1", "{\"tenant\":null}");
  assert_true(json_is_null(json_object_get(j, "tenant")));
  json_decref(j);
  j = call(f, 200, "PUT", "/v1/sessions/t-a1", "{\"tenant\":\"acme\",\"paused\":false}");
  assert_string_equal(str(j, "tenant"), "acme");
  json_decref(j);
  /* A PUT that does not name the tenant keeps it. */
  j = call(f, 200, "PUT", "/v1/sessions/t-a1", "{\"system\":\"be brief\"}");
  assert_string_equal(str(j, "tenant"), "acme");
  json_decref(j);

  cph_test_response r = cph_test_api(f->d.port, "PUT", "/v1/sessions/t-a1", NULL,
                                     "{\"tenant\":\"no spaces please\"}");
  cph_test_expect_error(&r, 400, "bad_request", "tenant");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "POST", "/v1/sessions", NULL,
                   "{\"id\":\"t-x\",\"class\":\"interactive\",\"tenant\":7}");
  cph_test_expect_error(&r, 400, "bad_request", "tenant");
  cph_test_response_free(&r);

  j = call(f, 200, "GET", "/v1/sessions?after=t-&limit=10", NULL);
  json_t *list = json_object_get(j, "sessions");
  int seen = 0;
  for (size_t i = 0; i < json_array_size(list); i++) {
    json_t *s = json_array_get(list, i);
    if (strcmp(str(s, "id"), "t-a1") == 0)
      assert_string_equal(str(s, "tenant"), "acme"), seen++;
    if (strcmp(str(s, "id"), "t-d1") == 0)
      assert_string_equal(str(s, "tenant"), "beta.co"), seen++;
  }
  assert_int_equal(seen, 2);
  json_decref(j);

  /* Restart on the same data: the tenant is in the session record. */
  char *dir = strdup(f->d.data_dir);
  f->d.keep_data = true;
  cph_test_daemon_stop(&f->d);
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, dir, NULL), 0);
  j = get(f, "/v1/sessions/%s", "t-a1");
  assert_string_equal(str(j, "tenant"), "acme");
  json_decref(j);
  j = get(f, "/v1/sessions/%s/why", "t-d1");
  assert_string_equal(str(j, "tenant"), "beta.co");
  json_decref(j);
  f->d.keep_data = false; /* the restarted daemon's stop removes it */
  free(dir);
}

/* Three interactive sessions queued with no worker: /why gives each its place (the three
 * places are 1, 2, 3 and agree with turns_ahead), no estimate until the lane has completed
 * something; the lease goes to position 1; its completion charges credits by tokens; then
 * the others have an estimated start. */
static void test_why_forecast_and_charge_by_tokens(void **state) {
  fixture *f = *state;
  const char *ids[] = {"w-a1", "w-a2", "w-n1"};
  create(f, ids[0], "interactive", "acme");
  create(f, ids[1], "interactive", "acme");
  create(f, ids[2], "interactive", NULL);
  for (int i = 0; i < 3; i++)
    post_to(f, ids[i], "please look at the build");
  int seen[4] = {0};
  const char *first = NULL;
  for (int i = 0; i < 3; i++) {
    json_t *w = why_when(f, ids[i], "runnable");
    json_int_t pos = num(w, "position");
    assert_true(pos >= 1 && pos <= 3);
    seen[pos]++;
    if (pos == 1)
      first = ids[i];
    assert_int_equal(num(w, "turns_ahead"), pos - 1);
    assert_int_equal(num(w, "tenant_runnable"), i < 2 ? 2 : 1);
    assert_true(num(w, "tenant_position") >= 1 &&
                num(w, "tenant_position") <= num(w, "tenant_runnable"));
    if (i < 2)
      assert_string_equal(str(w, "tenant"), "acme");
    else
      assert_true(json_is_null(json_object_get(w, "tenant")));
    assert_true(json_is_null(json_object_get(w, "est_start_ms")));
    json_decref(w);
  }
  assert_int_equal(seen[1] + seen[2] + seen[3], 3);
  assert_true(seen[1] == 1 && seen[2] == 1 && seen[3] == 1);

  json_t *j = call(f, 200, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":2000}");
  json_t *turn = json_object_get(j, "turn");
  assert_string_equal(str(turn, "session"), first);
  char path[96], body[160];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)num(turn, "id"));
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":2000,\"tool_calls\":0}}",
           str(turn, "lease"));
  json_decref(call(f, 200, "POST", path, body));
  json_decref(j);

  /* :cost :interactive 2 x 2000 tokens / 1000 = 4 credits. */
  j = get(f, "/v1/sessions/%s", first);
  double credits = json_real_value(json_object_get(j, "credits"));
  if (!(credits > 25.9 && credits < 26.1))
    fail_msg("credits after a 2000-token turn: %f, expected about 26", credits);
  json_decref(j);

  for (int i = 0; i < 3; i++) {
    if (ids[i] == first)
      continue;
    json_t *w = get(f, "/v1/sessions/%s/why", ids[i]);
    assert_string_equal(str(w, "reason"), "runnable");
    assert_true(num(w, "position") >= 1 && num(w, "position") <= 2);
    assert_true(json_is_integer(json_object_get(w, "est_start_ms")));
    assert_true(json_real_value(json_object_get(w, "est_start_in_s")) >= 0);
    json_decref(w);
  }
  j = call(f, 200, "GET", "/v1/lanes", NULL);
  json_t *lanes = json_object_get(j, "lanes");
  json_t *inter = json_array_get(lanes, 0), *oper = json_array_get(lanes, 1);
  assert_string_equal(str(inter, "name"), "interactive");
  assert_int_equal(num(json_object_get(inter, "recent"), "completions"), 1);
  assert_int_equal(num(json_object_get(inter, "seats"), "reserved"), 1);
  assert_int_equal(num(json_object_get(inter, "seats"), "lent"), 0);
  assert_int_equal(num(json_object_get(inter, "seats"), "borrowed"), 0);
  /* acme and the default, unless the default's only session was the one that ran */
  assert_int_equal(num(inter, "tenants_runnable"), strcmp(first, "w-n1") == 0 ? 1 : 2);
  assert_int_equal(num(inter, "tenant_run"), 1); /* a lane at human rates: the exact order */
  assert_true(json_is_null(json_object_get(json_object_get(inter, "budget"), "tokens")));
  assert_int_equal(num(json_object_get(oper, "budget"), "tokens"), 100000);
  assert_true(json_real_value(json_object_get(oper, "tokens_left")) > 99999);
  json_decref(j);

  cph_test_response m = cph_test_api(f->d.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(m.status, 200);
  /* The default tenant's series has an empty label: Prometheus writes it without one. */
  const char *want = strncmp(first, "w-a", 3) == 0
                         ? "cephalon_tenant_turns_started_total{tenant=\"acme\"} 1"
                         : "cephalon_tenant_turns_started_total 1";
  if (!strstr(m.body, want))
    fail_msg("metrics lack '%s'", want);
  assert_non_null(strstr(m.body, "cephalon_lane_seats_reserved{lane=\"interactive\"} 1"));
  cph_test_promtool_check(m.body);
  cph_test_response_free(&m);
}

static void test_reload_refuses_seats_over_concurrency(void **state) {
  fixture *f = *state;
  FILE *fp = fopen(f->policy, "w");
  fputs("{:scheduler {:concurrency 2\n"
        "             :lanes {:interactive {:seats 2} :maintenance {:seats 1}}}}\n",
        fp);
  fclose(fp);
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/admin/policy/reload", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", NULL);
  char where[512];
  snprintf(where, sizeof where, "%s:2:21: :scheduler :lanes: seats reserved add up to 3",
           f->policy);
  if (!strstr(r.body, where) || !strstr(r.body, ":interactive :seats 2") ||
      !strstr(r.body, ":maintenance :seats 1") || !strstr(r.body, ":concurrency 2"))
    fail_msg("reload error does not name the keys: %s", r.body);
  cph_test_response_free(&r);
  json_t *j = call(f, 200, "GET", "/v1/lanes", NULL);
  assert_int_equal(num(json_object_get(j, "concurrency"), "limit"), 3); /* the old one stays */
  json_decref(j);
  fp = fopen(f->policy, "w");
  fputs(POLICY, fp);
  fclose(fp);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_tenant_is_kept_on_sessions_across_update_and_restart),
      T(test_why_forecast_and_charge_by_tokens),
      T(test_reload_refuses_seats_over_concurrency),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
