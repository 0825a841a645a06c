/* The check that holds the daemon's answers to docs/openapi.json (tests/support/oas.h) catches
 * what it must: each case here is an answer or a value that has to fail, with the JSON pointer
 * of the mismatch in the message, beside the ones that have to pass. Runs on the real
 * document, plus small inline schemas for the keywords it does not use. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/oas.h"
#include "tests/support/testutil.h"

static int setup(void **state) {
  char *path = cph_test_source_path("docs/openapi.json");
  char err[512];
  cph_oas *d = cph_oas_load(path, err, sizeof err);
  free(path);
  if (!d)
    fail_msg("%s", err);
  *state = d;
  return 0;
}

static int teardown(void **state) {
  cph_oas_free(*state);
  return 0;
}

static json_t *parse(const char *text) {
  json_error_t je;
  json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
  if (!j)
    fail_msg("bad test JSON: %s: %s", je.text, text);
  return j;
}

/* The answer must pass. */
static void pass(cph_oas *d, const char *method, const char *target, int status, const char *ct,
                 const char *body) {
  json_t *j = body && *body && strstr(ct, "json") ? parse(body) : NULL;
  char err[1024];
  if (!cph_oas_check_answer(d, method, target, status, ct, body && *body, j, err, sizeof err))
    fail_msg("%s %s -> %d should pass: %s", method, target, status, err);
  json_decref(j);
}

/* The answer must fail, with want in the message. */
static void reject(cph_oas *d, const char *method, const char *target, int status,
                   const char *ct, const char *body, const char *want) {
  json_t *j = body && *body && ct && strstr(ct, "json") ? json_loads(body, JSON_DECODE_ANY, NULL)
                                                         : NULL;
  char err[1024];
  if (cph_oas_check_answer(d, method, target, status, ct, body && *body, j, err, sizeof err))
    fail_msg("%s %s -> %d should fail (%s): %s", method, target, status, want, body);
  if (!strstr(err, want))
    fail_msg("%s %s -> %d failed, but not with \"%s\": %s", method, target, status, want, err);
  json_decref(j);
}

#define SESSION                                                                              \
  "\"id\":\"s1\",\"class\":\"interactive\",\"state\":\"idle\",\"credits\":30.0,"                \
  "\"episode\":0,\"subscribe\":[\"general\"],\"member\":[],\"autonomy_interval_s\":null,"      \
  "\"report_interval_s\":null,\"context_window_tokens\":8192,\"system\":null,\"tools\":[],"     \
  "\"paused\":false,\"pending\":0,\"staged\":0,\"folded\":0,\"while_running\":\"enqueue\",\"while_running_from_class\":true"

static void test_a_true_answer_passes(void **state) {
  cph_oas *d = *state;
  pass(d, "GET", "/v1/sessions/s1", 200, "application/json", "{" SESSION "}");
  pass(d, "GET", "/v1/sessions?class=interactive&limit=5", 200, "application/json",
       "{\"sessions\":[{" SESSION "}],\"next\":\"s1\"}");
  pass(d, "POST", "/v1/turns/lease", 204, NULL, NULL);
  pass(d, "GET", "/v1/sessions/nobody", 404, "application/json",
       "{\"error\":{\"code\":\"not_found\",\"message\":\"no session\",\"field\":\"id\"}}");
  pass(d, "GET", "/metrics", 200, "text/plain; version=0.0.4; charset=utf-8",
       "cephalon_passes_total 1\n");
  pass(d, "GET", "/healthz", 200, "application/json", "{\"status\":\"ok\"}");
}

static void test_wrong_answers_fail_with_the_pointer_of_the_mismatch(void **state) {
  cph_oas *d = *state;
  /* a member of the wrong type, deep in a list */
  reject(d, "GET", "/v1/sessions", 200, "application/json",
         "{\"sessions\":[{" SESSION ",\"x\":1}],\"next\":null}", "at /sessions/0/x:");
  const char *bad_credits = "{\"id\":\"s1\",\"class\":\"interactive\",\"state\":\"idle\","
                            "\"credits\":\"lots\",\"episode\":0,\"subscribe\":[],\"member\":[],"
                            "\"autonomy_interval_s\":null,\"report_interval_s\":null,"
                            "\"context_window_tokens\":1,\"system\":null,\"tools\":[],"
                            "\"paused\":false,\"pending\":0,\"staged\":0,\"folded\":0,\"while_running\":\"enqueue\",\"while_running_from_class\":true}";
  reject(d, "GET", "/v1/sessions/s1", 200, "application/json", bad_credits,
         "at /credits: string is not of type number");
  /* a required member missing */
  reject(d, "DELETE", "/v1/sessions/s1", 200, "application/json", "{\"id\":\"s1\"}",
         "required member \"deleted\" is missing");
  /* not one of the enum */
  reject(d, "GET", "/v1/sessions/s1/why", 200, "application/json",
         "{\"session\":\"s1\",\"reason\":\"sleepy\",\"lane\":\"interactive\",\"credits\":1,"
         "\"waiting_s\":0,\"until_ms\":null,\"rank\":null,\"lane_runnable\":0,"
         "\"ahead_in_higher_lanes\":0,\"staged\":0,\"pending\":0,\"next_report_in_s\":null}",
         "at /reason: \"sleepy\" is not one of");
  /* null where the document does not allow it */
  reject(d, "POST", "/v1/turns/2/heartbeat", 200, "application/json",
         "{\"id\":2,\"deadline_ms\":null}", "at /deadline_ms: null is not of type integer");
  /* a const */
  reject(d, "POST", "/v1/turns/2/complete", 200, "application/json",
         "{\"id\":2,\"status\":\"done\",\"already\":false}", "at /status:");
  /* a real where an integer belongs */
  reject(d, "POST", "/v1/sessions/s1/seal", 200, "application/json", "{\"seal_id\":1.5}",
         "at /seal_id: number is not of type integer");
  /* a pattern */
  reject(d, "GET", "/v1/events/1", 200, "application/json",
         "{\"id\":1,\"channel\":null,\"sender\":null,\"body\":null,\"kind\":null,"
         "\"session\":null,\"ts_ms\":0,\"received_ms\":0,\"status\":\"stored\","
         "\"body_sha256\":\"xyz\",\"family\":null}",
         "at /body_sha256: \"xyz\" does not match the pattern");
  /* the error format */
  reject(d, "GET", "/v1/sessions/nobody", 404, "application/json",
         "{\"error\":{\"code\":\"not_found\",\"message\":\"\",\"field\":null}}",
         "at /error/message:");
  reject(d, "GET", "/v1/sessions/nobody", 404, "application/json", "{\"message\":\"no\"}",
         "required member \"error\" is missing");
}

static void test_undocumented_routes_statuses_and_types_fail(void **state) {
  cph_oas *d = *state;
  reject(d, "GET", "/v1/secret", 200, "application/json", "{}", "no operation GET /v1/secret");
  reject(d, "PATCH", "/v1/sessions/s1", 200, "application/json", "{}", "no operation PATCH");
  /* an unknown route may be refused, in the error format */
  pass(d, "GET", "/v1/secret", 404, "application/json",
       "{\"error\":{\"code\":\"not_found\",\"message\":\"no such route\",\"field\":null}}");
  reject(d, "GET", "/v1/secret", 404, "text/plain", "nope", "not in the error format");
  reject(d, "GET", "/v1/lanes", 418, "application/json", "{}", "status 418 is not documented");
  reject(d, "GET", "/v1/lanes", 200, "text/html", "<p>", "Content-Type text/html is not documented");
  reject(d, "POST", "/v1/turns/lease", 204, "application/json", "{}", "has none");
  reject(d, "GET", "/v1/lanes", 200, "application/json", NULL, "no body");
  reject(d, "GET", "/healthz", 200, "application/json", "{\"status\":", "not valid application/json");
}

/* Keywords the document does not use today, on inline schemas. */
static void test_keywords_on_inline_schemas(void **state) {
  (void)state;
  json_t *doc = parse("{\"paths\":{},\"components\":{\"schemas\":{"
                      "\"A\":{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#/components/schemas/N\"}}},"
                      "\"N\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9},"
                      "\"Loop\":{\"$ref\":\"#/components/schemas/Loop\"}}}}");
  cph_oas *d = cph_oas_from_json(doc);
  struct {
    const char *schema, *value;
    bool strict, ok;
    const char *want;
  } cases[] = {
      {"{\"$ref\":\"#/components/schemas/A\"}", "{\"n\":5}", true, true, NULL},
      {"{\"$ref\":\"#/components/schemas/A\"}", "{\"n\":10}", true, false, "at /n: 10 is above"},
      {"{\"$ref\":\"#/components/schemas/A\"}", "{\"n\":0}", true, false, "at /n: 0 is below"},
      {"{\"$ref\":\"#/components/schemas/A\"}", "{\"m\":1}", true, false, "at /m:"},
      {"{\"$ref\":\"#/components/schemas/A\"}", "{\"m\":1}", false, true, NULL},
      {"{\"$ref\":\"#/components/schemas/Nope\"}", "1", true, false, "unresolved $ref"},
      {"{\"$ref\":\"#/components/schemas/Loop\"}", "1", true, false, "nested over 64"},
      {"{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}", false, false, "at /a:"},
      {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", "{\"a\":1}", true,
       false, "at /a: integer is not of type string"},
      {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1", true, false,
       "matches 2 of the oneOf"},
      {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}]}", "true", true, false,
       "matches none"},
      {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "1", true, true, NULL},
      {"{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":3}]}", "2", true, false, "below"},
      {"{\"type\":[\"string\",\"null\"]}", "null", true, true, NULL},
      {"{\"type\":[\"string\",\"null\"]}", "1", true, false, "is not of type [\"string\",\"null\"]"},
      {"{\"type\":\"integer\"}", "2.0", true, true, NULL}, /* 2020-12: an integer */
      {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"\\u00e9\\u00e9\"", true, true,
       NULL}, /* characters, not bytes */
      {"{\"type\":\"string\",\"maxLength\":3}", "\"abcd\"", true, false, "longer than maxLength"},
      {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2}", "[1,2,3]", true,
       false, "more than maxItems"},
      {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", "[1,\"2\"]", true, false,
       "at /1: string is not of type integer"},
      {"{\"maxProperties\":1}", "{\"a\":1,\"b\":2}", true, false, "more than maxProperties"},
      {"{\"enum\":[\"a\",\"b\"]}", "\"c\"", true, false, "is not one of [\"a\",\"b\"]"},
      {"{\"type\":\"object\",\"properties\":{\"a/b\":{\"const\":1}}}", "{\"a/b\":2}", true, false,
       "at /a~1b:"},
      {"{\"not\":{\"type\":\"string\"}}", "1", true, false, "does not check"},
      {"{\"type\":\"string\",\"format\":\"date-time\",\"description\":\"d\"}", "\"x\"", true,
       true, NULL},
      {"false", "1", true, false, "no value is allowed"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *schema = parse(cases[i].schema), *value = parse(cases[i].value);
    char err[512];
    bool ok = cph_oas_validate(d, schema, value, cases[i].strict, err, sizeof err);
    if (ok != cases[i].ok)
      fail_msg("case %zu: %s against %s: want %s, got %s (%s)", i, cases[i].value,
               cases[i].schema, cases[i].ok ? "pass" : "fail", ok ? "pass" : "fail", err);
    if (!ok && !strstr(err, cases[i].want))
      fail_msg("case %zu: want \"%s\" in: %s", i, cases[i].want, err);
    json_decref(schema);
    json_decref(value);
  }
  cph_oas_free(d);
  json_decref(doc);
}

/* msgpack answers are checked as the same JSON value. */
static void test_msgpack_bodies_read_as_json(void **state) {
  cph_oas *d = *state;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 2);
  msgpack_pack_str_with_body(&pk, "status", 6);
  msgpack_pack_str_with_body(&pk, "ready", 5);
  msgpack_pack_str_with_body(&pk, "policy_generation", 17);
  msgpack_pack_double(&pk, 1.0);
  json_t *j = cph_oas_msgpack_json(sb.data, sb.size);
  assert_non_null(j);
  char err[512];
  assert_true(cph_oas_check_answer(d, "GET", "/readyz", 200, "application/msgpack", true, j, err,
                                   sizeof err));
  json_decref(j);
  assert_null(cph_oas_msgpack_json(sb.data, sb.size - 1)); /* cut short */
  msgpack_sbuffer_destroy(&sb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_true_answer_passes),
      cmocka_unit_test(test_wrong_answers_fail_with_the_pointer_of_the_mismatch),
      cmocka_unit_test(test_undocumented_routes_statuses_and_types_fail),
      cmocka_unit_test(test_keywords_on_inline_schemas),
      cmocka_unit_test(test_msgpack_bodies_read_as_json),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
