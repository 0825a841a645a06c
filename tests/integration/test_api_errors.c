/* The HTTP contract at its edges (DESIGN §9), against the real cephalond on a free loopback
 * port with a temp data dir: every 4xx path answers its status and the error format naming
 * the field; bearer tokens and scopes; msgpack in and out (and the strict msgpack reader);
 * long-polls that time out, wake on work, count per client and notice a client leaving;
 * shutdown that answers waiting clients; policy reload over HTTP. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <msgpack.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* Small limits so each one is easy to cross. */
static const char *POLICY = "{:server {:max-body-bytes 4096\n"
                            "          :max-events-per-request 5\n"
                            "          :max-string-bytes 64\n"
                            "          :max-long-polls-per-client 2\n"
                            "          :max-wait-ms 10000}}\n";

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static int start_with(void **state, const char *policy_text) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", policy_text);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    return -1;
  *state = f;
  return 0;
}

static int setup(void **state) { return start_with(state, POLICY); }

static int teardown(void **state) {
  fixture *f = *state;
  if (f->d.pid > 0)
    assert_int_equal(cph_test_daemon_stop(&f->d), 0); /* clean exit, no sanitizer report */
  else
    cph_test_daemon_stop(&f->d);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

/* method path body -> expects an error answer with status, code and field. */
static void expect_error(fixture *f, const char *method, const char *path, const char *body,
                         int status, const char *code, const char *field) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  if (r.status != status)
    fail_msg("%s %s %s: want %d, got %d: %s", method, path, body ? body : "", status, r.status,
             r.body ? r.body : "");
  cph_test_expect_error(&r, status, code, field);
  cph_test_response_free(&r);
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

static void create_session(fixture *f, const char *id, const char *channel) {
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"%s\"]}",
           id, channel);
  json_decref(call_ok(f, "POST", "/v1/sessions", body, 200));
}

static void post_event(fixture *f, const char *channel, const char *text) {
  char body[256];
  snprintf(body, sizeof body,
           "{\"events\":[{\"channel\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", channel,
           text);
  json_decref(call_ok(f, "POST", "/v1/events", body, 200));
}

/* ---------------------------------------------------------------- 400 */

static void test_invalid_json_is_400_with_its_position(void **state) {
  fixture *f = *state;
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, "{\"events\": [");
  cph_test_expect_error(&r, 400, "bad_request", NULL);
  assert_non_null(strstr(r.body, "line 1, column"));
  cph_test_response_free(&r);
  expect_error(f, "POST", "/v1/sessions", "[1, 2]", 400, "bad_request", NULL);
  expect_error(f, "POST", "/v1/sessions", "{\"id\":\"a\",\"id\":\"b\",\"class\":\"interactive\"}",
               400, "bad_request", NULL); /* duplicate keys are refused, not guessed */
}

static void test_missing_and_wrong_typed_fields_name_the_field(void **state) {
  fixture *f = *state;
  /* events: structure is the server's, named down to the element */
  expect_error(f, "POST", "/v1/events", "{}", 400, "bad_request", "events");
  expect_error(f, "POST", "/v1/events", "{\"events\":5}", 400, "bad_request", "events");
  expect_error(f, "POST", "/v1/events", "{\"events\":[7]}", 400, "bad_request", "events[0]");
  expect_error(f, "POST", "/v1/events",
               "{\"events\":[{\"channel\":\"a\",\"sender\":\"u\",\"body\":\"x\"},{},{},"
               "{\"channel\":7}]}",
               400, "bad_request", "events[3].channel");
  expect_error(f, "POST", "/v1/events", "{\"events\":[{\"channel\":\"a\",\"mentions\":[\"s\",1]}]}",
               400, "bad_request", "events[0].mentions[1]");
  expect_error(f, "POST", "/v1/events", "{\"events\":[{\"channel\":\"a\",\"ts_ms\":\"now\"}]}",
               400, "bad_request", "events[0].ts_ms");
  /* sessions */
  expect_error(f, "POST", "/v1/sessions", "{\"class\":\"interactive\"}", 400, "bad_request", "id");
  expect_error(f, "POST", "/v1/sessions", "{\"id\":\"s\"}", 400, "bad_request", "class");
  expect_error(f, "POST", "/v1/sessions", "{\"id\":5,\"class\":\"interactive\"}", 400,
               "bad_request", "id");
  expect_error(f, "POST", "/v1/sessions", "{\"id\":\"s\",\"class\":\"urgent\"}", 400,
               "bad_request", "class");
  expect_error(f, "POST", "/v1/sessions",
               "{\"id\":\"s\",\"class\":\"interactive\",\"subscribe\":\"general\"}", 400,
               "bad_request", "subscribe");
  expect_error(f, "POST", "/v1/sessions",
               "{\"id\":\"s\",\"class\":\"interactive\",\"autonomy_interval_s\":-5}", 400,
               "bad_request", "autonomy_interval_s");
  expect_error(f, "POST", "/v1/sessions", "{\"id\":\"bad id!\",\"class\":\"interactive\"}", 400,
               "bad_request", "id"); /* the engine's check, answered with its field */
  expect_error(f, "GET", "/v1/sessions?limit=many", NULL, 400, "bad_request", "limit");
  expect_error(f, "GET", "/v1/sessions?class=vip", NULL, 400, "bad_request", "class");
  expect_error(f, "GET", "/v1/sessions?state=asleep", NULL, 400, "bad_request", "state");
  /* turns */
  expect_error(f, "POST", "/v1/turns/lease", "{}", 400, "bad_request", "worker");
  expect_error(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":-1}", 400,
               "bad_request", "wait_ms");
  expect_error(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"lanes\":[\"fast\"]}", 400,
               "bad_request", "lanes[0]");
  expect_error(f, "POST", "/v1/turns/1/complete", "{}", 400, "bad_request", "lease");
  expect_error(f, "POST", "/v1/turns/1/complete", "{\"lease\":\"abc\"}", 400, "bad_request",
               "lease");
  const char *lease = "\"lease\":\"0123456789abcdef0123456789abcdef\"";
  char body[256];
  snprintf(body, sizeof body, "{%s}", lease);
  expect_error(f, "POST", "/v1/turns/1/complete", body, 400, "bad_request", "cost");
  snprintf(body, sizeof body, "{%s,\"cost\":{\"tokens\":\"ten\",\"tool_calls\":0}}", lease);
  expect_error(f, "POST", "/v1/turns/1/complete", body, 400, "bad_request", "cost.tokens");
  snprintf(body, sizeof body, "{%s,\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{}}", lease);
  expect_error(f, "POST", "/v1/turns/1/complete", body, 400, "bad_request", "reply.body");
  snprintf(body, sizeof body,
           "{%s,\"cost\":{\"tokens\":1,\"tool_calls\":0},\"memories\":[{\"text\":1}]}", lease);
  expect_error(f, "POST", "/v1/turns/1/complete", body, 400, "bad_request", "memories[0].text");
  expect_error(f, "GET", "/v1/turns?state=running", NULL, 400, "bad_request", "state");
  expect_error(f, "GET", "/v1/replies?after=-3", NULL, 400, "bad_request", "after");
}

static void test_invalid_event_is_rejected_per_event_not_400(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  json_t *j = call_ok(f, "POST", "/v1/events",
                      "{\"events\":[{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"ok\"},"
                      "{\"sender\":\"ann\",\"body\":\"nowhere\"}]}",
                      200);
  json_t *results = json_object_get(j, "results");
  assert_int_equal(json_array_size(results), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(results, 0), "status")),
                      "queued");
  json_t *bad = json_array_get(results, 1);
  assert_string_equal(json_string_value(json_object_get(bad, "status")), "rejected");
  assert_string_equal(json_string_value(json_object_get(bad, "field")), "channel");
  assert_non_null(json_string_value(json_object_get(bad, "reason")));
  assert_true(json_is_null(json_object_get(bad, "id")));
  json_decref(j);
}

/* ---------------------------------------------------------------- 404, 405, 409 */

/* One node applies an event before it answers its post: min_pos (DESIGN §14, cluster mode) is
 * checked and ignored, never waited for — a position far ahead answers at once. */
static void test_min_pos_is_checked_and_ignored_on_a_single_node(void **state) {
  fixture *f = *state;
  create_session(f, "mp", "mpc");
  post_event(f, "mpc", "hi");
  int64_t t0 = cph_test_now_ms();
  json_t *j = call_ok(f, "GET", "/v1/sessions/mp?min_pos=900000000", NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(j, "pending")) +
                       json_integer_value(json_object_get(j, "staged")),
                   1);
  json_decref(j);
  json_decref(call_ok(f, "GET", "/v1/sessions/mp/why?min_pos=0", NULL, 200));
  j = call_ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"min_pos\":900000000}", 200);
  json_decref(j);
  assert_true(cph_test_now_ms() - t0 < 2000);
  expect_error(f, "GET", "/v1/sessions/mp?min_pos=abc", NULL, 400, "bad_request", "min_pos");
  expect_error(f, "GET", "/v1/sessions/mp/context?min_pos=-1", NULL, 400, "bad_request", "min_pos");
  expect_error(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"min_pos\":-3}", 400,
               "bad_request", "min_pos");
}

static void test_unknown_things_are_404(void **state) {
  fixture *f = *state;
  expect_error(f, "GET", "/v1/sessions/nobody", NULL, 404, "not_found", "id");
  expect_error(f, "GET", "/v1/sessions/nobody/why", NULL, 404, "not_found", "id");
  expect_error(f, "GET", "/v1/sessions/%ff%fe", NULL, 404, "not_found", "id"); /* not UTF-8 */
  expect_error(f, "PUT", "/v1/sessions/nobody", "{\"paused\":true}", 404, "not_found", "id");
  expect_error(f, "DELETE", "/v1/sessions/nobody", NULL, 404, "not_found", "id");
  const char *hb = "{\"lease\":\"0123456789abcdef0123456789abcdef\"}";
  expect_error(f, "POST", "/v1/turns/987654/heartbeat", hb, 404, "not_found", "id");
  expect_error(f, "POST", "/v1/turns/x/heartbeat", hb, 404, "not_found", "id");
  expect_error(f, "POST", "/v1/turns/987654/requeue", "{}", 404, "not_found", "id");
  expect_error(f, "GET", "/v1/no/such/route", NULL, 404, "not_found", NULL);
  expect_error(f, "DELETE", "/v1/events", NULL, 405, "method_not_allowed", NULL);
  /* a literal segment beats a parameter: this is the lease route, not turn "lease" */
  expect_error(f, "GET", "/v1/turns/lease", NULL, 405, "method_not_allowed", NULL);
  expect_error(f, "GET", "/v1/turns/987654", NULL, 404, "not_found", "id");
}

static void test_conflicts_are_409(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  expect_error(f, "POST", "/v1/sessions", "{\"id\":\"s1\",\"class\":\"operational\"}", 409,
               "conflict", "id");
  expect_error(f, "PUT", "/v1/sessions/s1", "{\"id\":\"s2\"}", 400, "bad_request", "id");
  post_event(f, "general", "hello");
  json_t *j = call_ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}", 200);
  json_t *turn = json_object_get(j, "turn");
  assert_non_null(turn);
  long long id = (long long)json_integer_value(json_object_get(turn, "id"));
  char path[96], body[256];
  const char *wrong = "ffffffffffffffffffffffffffffffff";
  snprintf(path, sizeof path, "/v1/turns/%lld/heartbeat", id);
  snprintf(body, sizeof body, "{\"lease\":\"%s\"}", wrong);
  expect_error(f, "POST", path, body, 409, "conflict", "lease");
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", id);
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0}}",
           wrong);
  expect_error(f, "POST", path, body, 409, "conflict", "lease");
  /* the right lease still works after the wrong ones */
  snprintf(path, sizeof path, "/v1/turns/%lld/heartbeat", id);
  snprintf(body, sizeof body, "{\"lease\":\"%s\"}",
           json_string_value(json_object_get(turn, "lease")));
  json_t *hb = call_ok(f, "POST", path, body, 200);
  assert_true(json_integer_value(json_object_get(hb, "deadline_ms")) > 0);
  json_decref(hb);
  /* a session with a running turn cannot be deleted */
  expect_error(f, "DELETE", "/v1/sessions/s1", NULL, 409, "conflict", NULL);
  json_decref(j);
}

/* ---------------------------------------------------------------- 413 */

static void test_oversize_requests_are_413(void **state) {
  fixture *f = *state;
  /* body over :max-body-bytes (4096) */
  size_t n = 5000;
  char *big = malloc(n + 64);
  int off = snprintf(big, n + 64, "{\"events\":[],\"pad\":\"");
  memset(big + off, 'x', n);
  strcpy(big + off + n, "\"}");
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, big);
  cph_test_expect_error(&r, 413, "too_large", NULL);
  cph_test_response_free(&r);
  free(big);
  /* far over it, libevent refuses it before reading it: the status still says so */
  n = 64 * 1024;
  big = malloc(n + 1);
  memset(big, ' ', n);
  big[n] = '\0';
  big[0] = '{';
  big[n - 1] = '}';
  r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, big);
  assert_int_equal(r.status, 413);
  cph_test_response_free(&r);
  free(big);
  /* more than :max-events-per-request (5) */
  expect_error(f, "POST", "/v1/events", "{\"events\":[{},{},{},{},{},{}]}", 413, "too_large",
               "events");
  /* a string over :max-string-bytes (64), named by its path */
  char body[512];
  snprintf(body, sizeof body,
           "{\"events\":[{\"channel\":\"c\",\"sender\":\"u\",\"body\":\"ok\"},"
           "{\"channel\":\"c\",\"sender\":\"u\",\"body\":\"%065d\"}]}",
           0);
  expect_error(f, "POST", "/v1/events", body, 413, "too_large", "events[1].body");
  snprintf(body, sizeof body, "{\"id\":\"s\",\"class\":\"interactive\",\"system\":\"%070d\"}", 0);
  expect_error(f, "POST", "/v1/sessions", body, 413, "too_large", "system");
}

/* ---------------------------------------------------------------- msgpack */

static void pack_str(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

/* The value under key in a msgpack map, or NULL. */
static const msgpack_object *mp_get(const msgpack_object *map, const char *key) {
  if (map->type != MSGPACK_OBJECT_MAP)
    return NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
        memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

static bool mp_str_is(const msgpack_object *o, const char *s) {
  return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
         memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static const char *MP_HEADERS = "Content-Type: application/msgpack\r\n"
                                "Accept: application/msgpack\r\n";

static void test_msgpack_request_and_response_round_trip(void **state) {
  fixture *f = *state;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  pack_str(&pk, "id");
  pack_str(&pk, "mp1");
  pack_str(&pk, "class");
  pack_str(&pk, "operational");
  pack_str(&pk, "subscribe");
  msgpack_pack_array(&pk, 1);
  pack_str(&pk, "general");
  cph_test_response r =
      cph_test_http_raw(f->d.port, "POST", "/v1/sessions", MP_HEADERS, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(r.status, 200);
  char ct[64];
  assert_non_null(cph_test_header(&r, "Content-Type", ct, sizeof ct));
  assert_string_equal(ct, "application/msgpack");
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  assert_int_equal(msgpack_unpack_next(&up, r.body, r.body_len, &off), MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(off, r.body_len);
  assert_true(mp_str_is(mp_get(&up.data, "id"), "mp1"));
  assert_true(mp_str_is(mp_get(&up.data, "class"), "operational"));
  const msgpack_object *sub = mp_get(&up.data, "subscribe");
  assert_non_null(sub);
  assert_int_equal(sub->type, MSGPACK_OBJECT_ARRAY);
  assert_true(mp_str_is(&sub->via.array.ptr[0], "general"));
  msgpack_unpacked_destroy(&up);
  cph_test_response_free(&r);

  /* msgpack in, JSON out (no Accept) */
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 1);
  pack_str(&pk, "events");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 4);
  pack_str(&pk, "channel");
  pack_str(&pk, "general");
  pack_str(&pk, "sender");
  pack_str(&pk, "ann");
  pack_str(&pk, "body");
  pack_str(&pk, "packed");
  pack_str(&pk, "ts_ms");
  msgpack_pack_uint64(&pk, 1700000000000ull);
  r = cph_test_http_raw(f->d.port, "POST", "/v1/events",
                        "Content-Type: application/msgpack\r\n", sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  json_t *res = json_array_get(json_object_get(j, "results"), 0);
  assert_string_equal(json_string_value(json_object_get(res, "status")), "queued");
  json_decref(j);
  cph_test_response_free(&r);

  /* errors come back in msgpack too */
  r = cph_test_http_raw(f->d.port, "GET", "/v1/sessions/nobody", "Accept: application/msgpack\r\n",
                        NULL, 0);
  assert_int_equal(r.status, 404);
  msgpack_unpacked_init(&up);
  off = 0;
  assert_int_equal(msgpack_unpack_next(&up, r.body, r.body_len, &off), MSGPACK_UNPACK_SUCCESS);
  const msgpack_object *err = mp_get(&up.data, "error");
  assert_true(mp_str_is(mp_get(err, "code"), "not_found"));
  assert_true(mp_str_is(mp_get(err, "field"), "id"));
  msgpack_unpacked_destroy(&up);
  cph_test_response_free(&r);
}

/* One batch that meets every per-event status: queued, duplicate (key seen in the same
 * batch), stored (nobody subscribed), rejected (with reason and field), aggregated. */
static const char *STATUS_BATCH =
    "{\"events\":["
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"hello there everyone\",\"key\":\"k1\"},"
    "{\"channel\":\"general\",\"sender\":\"bob\",\"body\":\"another body here\",\"key\":\"k1\"},"
    "{\"channel\":\"quiet\",\"sender\":\"ann\",\"body\":\"nobody listens here\"},"
    "{\"sender\":\"ann\",\"body\":\"neither channel nor session\"},"
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"hello there everyone\"}]}";

/* The ingest answer (POST /v1/events) for STATUS_BATCH on a fresh daemon, as JSON text
 * (msgpack in and out converted back to compact JSON): member order and shape are fixed. */
static char *status_batch_answer(fixture *f, bool msgpack) {
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/sessions", NULL,
                                     "{\"id\":\"s1\",\"class\":\"operational\","
                                     "\"subscribe\":[\"general\"]}");
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  if (!msgpack) {
    r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, STATUS_BATCH);
    assert_int_equal(r.status, 200);
    assert_true(r.body_len > 0 && r.body[r.body_len - 1] == '\n');
    char *text = strndup(r.body, r.body_len - 1);
    cph_test_response_free(&r);
    return text;
  }
  json_t *in = json_loads(STATUS_BATCH, 0, NULL);
  assert_non_null(in);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  json_t *events = json_object_get(in, "events");
  msgpack_pack_map(&pk, 1);
  pack_str(&pk, "events");
  msgpack_pack_array(&pk, json_array_size(events));
  size_t i;
  json_t *ev;
  json_array_foreach(events, i, ev) {
    msgpack_pack_map(&pk, json_object_size(ev));
    const char *k;
    json_t *v;
    json_object_foreach(ev, k, v) {
      pack_str(&pk, k);
      pack_str(&pk, json_string_value(v));
    }
  }
  json_decref(in);
  r = cph_test_http_raw(f->d.port, "POST", "/v1/events", MP_HEADERS, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  assert_int_equal(r.status, 200);
  char ct[64];
  assert_non_null(cph_test_header(&r, "Content-Type", ct, sizeof ct));
  assert_string_equal(ct, "application/msgpack");
  json_t *j = cph_test_msgpack_json(r.body, r.body_len);
  assert_non_null(j);
  char *text = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  cph_test_response_free(&r);
  return text;
}

static void test_ingest_answer_has_one_shape_in_json_and_msgpack(void **state) {
  fixture *f = *state;
  char *json_text = status_batch_answer(f, false);
  assert_string_equal(
      json_text,
      "{\"results\":["
      "{\"id\":1,\"status\":\"queued\",\"sessions\":[\"s1\"]},"
      "{\"id\":1,\"status\":\"duplicate\",\"sessions\":[]},"
      "{\"id\":2,\"status\":\"stored\",\"sessions\":[]},"
      "{\"id\":null,\"status\":\"rejected\",\"sessions\":[],"
      "\"reason\":\"an event needs a channel or a session\",\"field\":\"channel\"},"
      "{\"id\":3,\"status\":\"aggregated\",\"sessions\":[\"s1\"]}]}");
  /* The same batch on a fresh daemon, in msgpack: the same answer value for value. */
  assert_int_equal(cph_test_daemon_stop(&f->d), 0);
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, NULL, NULL), 0);
  char *mp_text = status_batch_answer(f, true);
  assert_string_equal(mp_text, json_text);
  free(mp_text);
  free(json_text);
}

/* ---------------------------------------------------------------- fast event decoding */

/* One event each (JSON text of the object), meant to cross the edges of the fast decoder in
 * routes_events.c: escapes, \u escapes, raw UTF-8, nulls, repeated keys, bad types and
 * sizes. */
static const char *const DECODE_CASES[] = {
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"tab\\tnl\\nq\\\"bs\\\\sl\\/end\","
    "\"ts_ms\":1700000000000}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"caf\\u00e9 au lait ok\",\"ts_ms\":1}",
    "{\"channel\":\"general\",\"sender\":\"bob\",\"body\":\"d\xc3\xa9j\xc3\xa0 vu \xe2\x80\x94 "
    "\xf0\x9f\x99\x82 ok\",\"ts_ms\":2,\"mentions\":[\"s2\"],\"kind\":\"chat\",\"key\":\"k-1\"}",
    "{\"channel\":null,\"session\":\"s1\",\"sender\":\"ann\",\"body\":\"direct message body\","
    "\"ts_ms\":3,\"mentions\":[],\"kind\":null}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"x\",\"body\":\"y\"}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"real ts\",\"ts_ms\":1.5}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"negative ts\",\"ts_ms\":-1}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"big ts\","
    "\"ts_ms\":9223372036854775808}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"12345678901234567890123456789012345"
    "678901234567890123456789012345\"}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"bad \xff byte\"}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"mention types\","
    "\"mentions\":[\"s2\",5]}",
    "{\"channel\":\"general\",\"sender\":7,\"body\":\"sender type\"}",
    "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"unclosed\"",
    "{}",
};

/* What POST /v1/events answers for `event` (generic: with an unknown key first, which only the
 * generic decoder takes), and the stored event without its receive time, as one string. */
static char *decode_case_answer(fixture *f, const char *event, bool generic) {
  char body[1024];
  snprintf(body, sizeof body, "{\"events\":[%s%s]}", generic ? "{\"zz\":0," : "",
           generic ? event + 1 : event);
  if (generic && strcmp(event, "{}") == 0)
    snprintf(body, sizeof body, "{\"events\":[{\"zz\":0}]}");
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, body);
  json_t *j = cph_test_json(&r);
  char *out = NULL;
  if (r.status != 200) { /* messages may quote a byte position: status, code, field */
    json_t *e = json_object_get(j, "error");
    const char *field = json_string_value(json_object_get(e, "field"));
    if (asprintf(&out, "%d %s %s", r.status, json_string_value(json_object_get(e, "code")),
                 field ? field : "null") < 0)
      abort();
  } else {
    char *results = json_dumps(j, JSON_COMPACT);
    json_t *res = json_array_get(json_object_get(j, "results"), 0);
    char *stored = NULL;
    if (json_integer_value(json_object_get(res, "id")) > 0) {
      char path[64];
      snprintf(path, sizeof path, "/v1/events/%lld",
               (long long)json_integer_value(json_object_get(res, "id")));
      cph_test_response g = cph_test_api(f->d.port, "GET", path, NULL, NULL);
      assert_int_equal(g.status, 200);
      json_t *ev = cph_test_json(&g);
      json_object_del(ev, "received_ms");
      stored = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);
      json_decref(ev);
      cph_test_response_free(&g);
    }
    if (asprintf(&out, "200 %s %s", results, stored ? stored : "-") < 0)
      abort();
    free(results);
    free(stored);
  }
  json_decref(j);
  cph_test_response_free(&r);
  return out;
}

static void decode_cases_run(fixture *f, bool generic, char **answers) {
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/sessions", NULL,
                                     "{\"id\":\"s1\",\"class\":\"operational\","
                                     "\"subscribe\":[\"general\"]}");
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "POST", "/v1/sessions", NULL,
                   "{\"id\":\"s2\",\"class\":\"operational\"}");
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  size_t n = sizeof DECODE_CASES / sizeof *DECODE_CASES;
  for (size_t i = 0; i < n; i++)
    answers[i] = decode_case_answer(f, DECODE_CASES[i], generic);
  /* more events than :max-events-per-request (5), and none */
  const char *ev = "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"many\"}";
  char body[1024];
  snprintf(body, sizeof body, "{\"events\":[%s,%s,%s,%s,%s,%s]}", ev, ev, ev, ev, ev, ev);
  r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, body);
  cph_test_expect_error(&r, 413, "too_large", "events");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "POST", "/v1/events", NULL, "{\"events\":[]}");
  assert_int_equal(r.status, 200);
  assert_true(r.body_len > 0 && strncmp(r.body, "{\"results\":[]}\n", r.body_len) == 0);
  cph_test_response_free(&r);
}

static void test_fast_and_generic_event_decoding_answer_and_store_the_same(void **state) {
  fixture *f = *state;
  enum { N = sizeof DECODE_CASES / sizeof *DECODE_CASES };
  char *fast[N], *generic[N];
  decode_cases_run(f, false, fast);
  /* a fresh daemon, so that ids and dedupe verdicts line up */
  assert_int_equal(cph_test_daemon_stop(&f->d), 0);
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, NULL, NULL), 0);
  decode_cases_run(f, true, generic);
  for (size_t i = 0; i < N; i++) {
    if (strcmp(fast[i], generic[i]) != 0)
      fail_msg("case %zu: fast \"%s\" but generic \"%s\"", i, fast[i], generic[i]);
    free(fast[i]);
    free(generic[i]);
  }
}

static void expect_msgpack_400(fixture *f, const void *body, size_t len, const char *needle) {
  cph_test_response r = cph_test_http_raw(f->d.port, "POST", "/v1/sessions",
                                          "Content-Type: application/msgpack\r\n", body, len);
  cph_test_expect_error(&r, 400, "bad_request", NULL);
  if (!strstr(r.body, needle))
    fail_msg("message lacks '%s': %s", needle, r.body);
  cph_test_response_free(&r);
}

static void test_forged_msgpack_lengths_are_refused_without_allocating(void **state) {
  fixture *f = *state;
  /* A 4-billion-element array, map and string declared in a few bytes. */
  const unsigned char arr32[] = {0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
  expect_msgpack_400(f, arr32, sizeof arr32, "array of 4294967295 elements");
  const unsigned char map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'k'};
  expect_msgpack_400(f, map32, sizeof map32, "map of 4294967295 entries");
  const unsigned char str32[] = {0x81, 0xa2, 'i', 'd', 0xdb, 0x7f, 0xff, 0xff, 0xff, 'a'};
  expect_msgpack_400(f, str32, sizeof str32, "string of 2147483647 bytes");
  const unsigned char intkey[] = {0x81, 0x01, 0x02};
  expect_msgpack_400(f, intkey, sizeof intkey, "map key is not a string");
  const unsigned char trailing[] = {0x80, 0xc0};
  expect_msgpack_400(f, trailing, sizeof trailing, "trailing bytes");
  const unsigned char badutf8[] = {0x81, 0xa2, 'i', 'd', 0xa2, 0xc3, 0x28};
  expect_msgpack_400(f, badutf8, sizeof badutf8, "not valid UTF-8");
  /* the daemon is still fine */
  cph_test_response r = cph_test_api(f->d.port, "GET", "/healthz", NULL, NULL);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
}

/* ---------------------------------------------------------------- auth */

static const char *TOK_INGEST = "tok-ingest-5f1e9c";
static const char *TOK_WORKER = "tok-worker-a81d77";
static const char *TOK_ADMIN = "tok-admin-0c44b2";
static const char *TOK_READ = "tok-read-93aa10";

static int setup_auth(void **state) {
  char *h[4] = {cph_test_sha256_hex(TOK_INGEST), cph_test_sha256_hex(TOK_WORKER),
                cph_test_sha256_hex(TOK_ADMIN), cph_test_sha256_hex(TOK_READ)};
  char *text;
  if (asprintf(&text,
               "{:auth {:tokens [{:name \"connector\" :sha256 \"%s\" :scopes #{:ingest}}\n"
               "                 {:name \"runner\" :sha256 \"%s\" :scopes #{:worker}}\n"
               "                 {:name \"ops\" :sha256 \"%s\" :scopes #{:admin}}\n"
               "                 {:name \"dashboard\" :sha256 \"%s\" :scopes #{:read}}]}}\n",
               h[0], h[1], h[2], h[3]) < 0)
    abort();
  for (int i = 0; i < 4; i++)
    free(h[i]);
  int rc = start_with(state, text);
  free(text);
  return rc;
}

static int call_status(fixture *f, const char *method, const char *path, const char *token,
                       const char *body) {
  cph_test_response r = cph_test_api(f->d.port, method, path, token, body);
  int st = r.status;
  cph_test_response_free(&r);
  return st;
}

static void test_tokens_and_scopes(void **state) {
  fixture *f = *state;
  int port = f->d.port;
  /* health needs no token */
  assert_int_equal(call_status(f, "GET", "/healthz", NULL, NULL), 200);
  assert_int_equal(call_status(f, "GET", "/readyz", NULL, NULL), 200);
  /* no token, an unknown token, another scheme: 401 */
  cph_test_response r = cph_test_api(port, "GET", "/v1/lanes", NULL, NULL);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  char hdr[64];
  assert_non_null(cph_test_header(&r, "WWW-Authenticate", hdr, sizeof hdr));
  cph_test_response_free(&r);
  r = cph_test_api(port, "GET", "/v1/lanes", "not-a-token", NULL);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  cph_test_response_free(&r);
  r = cph_test_http_raw(port, "GET", "/v1/lanes", "Authorization: Basic dG9rOng=\r\n", NULL, 0);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(port, "GET", "/v1/no/such/route", NULL, NULL); /* routes stay hidden */
  assert_int_equal(r.status, 401);
  cph_test_response_free(&r);

  /* a token without the route's scope: 403 */
  const char *session = "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}";
  r = cph_test_api(port, "POST", "/v1/sessions", TOK_INGEST, session);
  cph_test_expect_error(&r, 403, "forbidden", NULL);
  cph_test_response_free(&r);
  assert_int_equal(call_status(f, "POST", "/v1/sessions", TOK_ADMIN, session), 200);
  const char *event = "{\"events\":[{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"hi\"}]}";
  assert_int_equal(call_status(f, "POST", "/v1/events", TOK_READ, event), 403);
  assert_int_equal(call_status(f, "POST", "/v1/events", TOK_WORKER, event), 403);
  assert_int_equal(call_status(f, "POST", "/v1/events", TOK_INGEST, event), 200);
  assert_int_equal(call_status(f, "GET", "/v1/lanes", TOK_INGEST, NULL), 403);
  assert_int_equal(call_status(f, "GET", "/v1/lanes", TOK_READ, NULL), 200);
  assert_int_equal(call_status(f, "GET", "/v1/sessions/s1", TOK_READ, NULL), 200);
  assert_int_equal(call_status(f, "GET", "/v1/replies", TOK_WORKER, NULL), 200);
  assert_int_equal(call_status(f, "GET", "/v1/replies", TOK_READ, NULL), 200);
  assert_int_equal(call_status(f, "GET", "/v1/replies", TOK_INGEST, NULL), 403);
  const char *lease = "{\"worker\":\"w\",\"wait_ms\":2000}";
  assert_int_equal(call_status(f, "POST", "/v1/turns/lease", TOK_ADMIN, lease), 403);
  assert_int_equal(call_status(f, "POST", "/v1/turns/lease", TOK_WORKER, lease), 200);
  assert_int_equal(call_status(f, "POST", "/v1/admin/policy/reload", TOK_READ, NULL), 403);
  assert_int_equal(call_status(f, "POST", "/v1/admin/policy/reload", TOK_ADMIN, NULL), 200);
  assert_int_equal(call_status(f, "DELETE", "/v1/sessions/s1", TOK_WORKER, NULL), 403);

  /* tokens never reach the log */
  char *log = cph_test_daemon_log(&f->d);
  assert_null(strstr(log, TOK_INGEST));
  assert_null(strstr(log, TOK_WORKER));
  assert_null(strstr(log, TOK_ADMIN));
  assert_null(strstr(log, TOK_READ));
  assert_null(strstr(log, "not-a-token"));
  free(log);
}

/* ---------------------------------------------------------------- long-polls */

typedef struct timed_call {
  int port;
  const char *method, *path, *body;
  cph_test_response r;
  int64_t done_ms;
} timed_call;

static void *timed_call_thread(void *arg) {
  timed_call *c = arg;
  c->r = cph_test_api(c->port, c->method, c->path, NULL, c->body);
  c->done_ms = cph_test_now_ms();
  return NULL;
}

static void test_lease_long_poll_times_out_with_204_and_wakes_on_ingest(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  int64_t t0 = cph_test_now_ms();
  cph_test_response r =
      cph_test_api(f->d.port, "POST", "/v1/turns/lease", NULL, "{\"worker\":\"w\",\"wait_ms\":300}");
  int64_t waited = cph_test_now_ms() - t0;
  assert_int_equal(r.status, 204);
  assert_int_equal(r.body_len, 0);
  assert_true(waited >= 250); /* it did wait */
  cph_test_response_free(&r);

  timed_call c = {f->d.port, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":10000}",
                  {0}, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, timed_call_thread, &c), 0);
  sleep_ms(300); /* the lease is waiting now */
  int64_t ingest_ms = cph_test_now_ms();
  post_event(f, "general", "wake up");
  pthread_join(th, NULL);
  assert_int_equal(c.r.status, 200);
  json_t *j = cph_test_json(&c.r);
  assert_string_equal(json_string_value(json_object_get(json_object_get(j, "turn"), "input")),
                      "inbox:wake up");
  json_decref(j);
  cph_test_response_free(&c.r);
  /* woken by the ingest, not by its 10 s wait */
  if (c.done_ms - ingest_ms >= 2000)
    fail_msg("lease answered %lld ms after the ingest", (long long)(c.done_ms - ingest_ms));
}

static void test_replies_long_poll_times_out_empty_and_answers_at_once_when_there_are_replies(
    void **state) {
  fixture *f = *state;
  int64_t t0 = cph_test_now_ms();
  json_t *j = call_ok(f, "GET", "/v1/replies?after=0&wait_ms=300", NULL, 200);
  assert_true(cph_test_now_ms() - t0 >= 250);
  assert_int_equal(json_array_size(json_object_get(j, "replies")), 0);
  assert_int_equal(json_integer_value(json_object_get(j, "next")), 0);
  json_decref(j);

  /* a waiting replies poll wakes when a completion appends a reply */
  create_session(f, "s1", "general");
  post_event(f, "general", "ping");
  j = call_ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}", 200);
  json_t *turn = json_object_get(j, "turn");
  timed_call c = {f->d.port, "GET", "/v1/replies?after=0&wait_ms=10000", NULL, {0}, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, timed_call_thread, &c), 0);
  sleep_ms(300);
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, sizeof body,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":3,\"tool_calls\":0},\"reply\":{\"body\":\"pong\"}}",
           json_string_value(json_object_get(turn, "lease")));
  int64_t complete_ms = cph_test_now_ms();
  json_decref(call_ok(f, "POST", path, body, 200));
  json_decref(j);
  pthread_join(th, NULL);
  assert_int_equal(c.r.status, 200);
  assert_true(c.done_ms - complete_ms < 2000);
  j = cph_test_json(&c.r);
  json_t *one = json_array_get(json_object_get(j, "replies"), 0);
  assert_string_equal(json_string_value(json_object_get(one, "body")), "pong");
  assert_string_equal(json_string_value(json_object_get(one, "session")), "s1");
  json_int_t next = json_integer_value(json_object_get(j, "next"));
  assert_true(next >= json_integer_value(json_object_get(one, "id")));
  json_decref(j);
  cph_test_response_free(&c.r);
}

static void test_long_polls_per_client_are_capped_and_freed_when_the_client_leaves(void **state) {
  fixture *f = *state;
  const char *wait = "{\"worker\":\"w\",\"wait_ms\":10000}";
  int a = cph_test_http_send_only(f->d.port, "POST", "/v1/turns/lease", wait);
  int b = cph_test_http_send_only(f->d.port, "GET", "/v1/replies?wait_ms=10000", NULL);
  assert_true(a >= 0 && b >= 0);
  sleep_ms(300);
  /* :max-long-polls-per-client 2 are held: a third is 429 */
  cph_test_response r =
      cph_test_api(f->d.port, "POST", "/v1/turns/lease", NULL, "{\"worker\":\"w\",\"wait_ms\":100}");
  cph_test_expect_error(&r, 429, "too_many_requests", NULL);
  cph_test_response_free(&r);
  /* the two clients walk away: their places are given back well before their 10 s */
  close(a);
  close(b);
  sleep_ms(300);
  r = cph_test_api(f->d.port, "POST", "/v1/turns/lease", NULL, "{\"worker\":\"w\",\"wait_ms\":100}");
  assert_int_equal(r.status, 204);
  cph_test_response_free(&r);
}

static void test_sigterm_answers_waiting_long_poll_and_exits_0(void **state) {
  fixture *f = *state;
  timed_call c = {f->d.port, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":10000}",
                  {0}, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, timed_call_thread, &c), 0);
  sleep_ms(300);
  int64_t t0 = cph_test_now_ms();
  assert_int_equal(cph_test_daemon_signal_wait(&f->d, SIGTERM), 0);
  pthread_join(th, NULL);
  assert_int_equal(c.r.status, 204); /* answered, not dropped */
  assert_true(c.done_ms - t0 < 2000);
  cph_test_response_free(&c.r);
  assert_true(cph_test_daemon_log_wait(&f->d, "cephalond stopped", 1000));
}

/* ---------------------------------------------------------------- admin */

static void test_policy_is_readable_and_reload_rejects_a_bad_file(void **state) {
  fixture *f = *state;
  json_t *j = call_ok(f, "GET", "/v1/admin/policy", NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(j, "generation")), 1);
  assert_non_null(strstr(json_string_value(json_object_get(j, "edn")), ":max-events-per-request 5"));
  json_decref(j);

  FILE *fp = fopen(f->policy, "w");
  fputs("{:server {:max-wait-ms \"long\"}}\n", fp);
  fclose(fp);
  cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/admin/policy/reload", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", NULL);
  char where[512];
  snprintf(where, sizeof where, "%s:1:24: :server :max-wait-ms", f->policy);
  if (!strstr(r.body, where))
    fail_msg("reload error lacks '%s': %s", where, r.body);
  cph_test_response_free(&r);
  j = call_ok(f, "GET", "/v1/admin/policy", NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(j, "generation")), 1); /* old one stays */
  json_decref(j);

  fp = fopen(f->policy, "w");
  fputs(POLICY, fp);
  fclose(fp);
  j = call_ok(f, "POST", "/v1/admin/policy/reload", NULL, 200);
  assert_int_equal(json_integer_value(json_object_get(j, "generation")), 2);
  json_decref(j);
  j = call_ok(f, "GET", "/v1/lanes", NULL, 200);
  assert_int_equal(json_array_size(json_object_get(j, "lanes")), 3);
  assert_non_null(json_object_get(json_object_get(j, "concurrency"), "limit"));
  json_decref(j);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_invalid_json_is_400_with_its_position),
      T(test_missing_and_wrong_typed_fields_name_the_field),
      T(test_invalid_event_is_rejected_per_event_not_400),
      T(test_unknown_things_are_404),
      T(test_min_pos_is_checked_and_ignored_on_a_single_node),
      T(test_conflicts_are_409),
      T(test_oversize_requests_are_413),
      T(test_msgpack_request_and_response_round_trip),
      T(test_ingest_answer_has_one_shape_in_json_and_msgpack),
      T(test_fast_and_generic_event_decoding_answer_and_store_the_same),
      T(test_forged_msgpack_lengths_are_refused_without_allocating),
      cmocka_unit_test_setup_teardown(test_tokens_and_scopes, setup_auth, teardown),
      T(test_lease_long_poll_times_out_with_204_and_wakes_on_ingest),
      T(test_replies_long_poll_times_out_empty_and_answers_at_once_when_there_are_replies),
      T(test_long_polls_per_client_are_capped_and_freed_when_the_client_leaves),
      T(test_sigterm_answers_waiting_long_poll_and_exits_0),
      T(test_policy_is_readable_and_reload_rejects_a_bad_file),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
