/* The service as a worker and a connector use it: the real cephalond over HTTP on loopback
 * with a temp data dir (DESIGN §4, §9). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

static const char *POLICY = "{:leases {:ttl-seconds 1 :max-attempts 2}\n"
                            " :sessions {:max-queue 3}\n"
                            " :scheduler {:concurrency 8}}\n";

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

/* One request with a JSON body (printf-style); returns the parsed reply (or NULL) and the
 * status in *status. */
static json_t *call(fixture *f, int *status, const char *method, const char *path,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static json_t *call(fixture *f, int *status, const char *method, const char *path,
                    const char *fmt, ...) {
  char *body = NULL;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&body, fmt, ap) < 0)
      abort();
    va_end(ap);
  }
  cph_test_response r = cph_test_http(f->d.port, method, path,
                                      body ? "Content-Type: application/json\r\n" : NULL, body);
  free(body);
  *status = r.status;
  json_t *j = r.body_len ? json_loads(r.body, 0, NULL) : NULL;
  cph_test_response_free(&r);
  return j;
}

static void expect(fixture *f, int want, const char *method, const char *path, const char *body) {
  int st;
  json_t *j = call(f, &st, method, path, "%s", body);
  if (st != want) {
    char *dump = j ? json_dumps(j, 0) : NULL;
    fail_msg("%s %s: status %d, want %d: %s", method, path, st, want, dump ? dump : "");
  }
  json_decref(j);
}

static void create(fixture *f, const char *id, const char *subscribe) {
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"%s\"]}", id,
           subscribe);
  expect(f, 200, "POST", "/v1/sessions", body);
}

/* Leases a turn (waits up to wait_ms); NULL on 204. */
static json_t *lease(fixture *f, int wait_ms) {
  int st;
  json_t *j = call(f, &st, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":%d}", wait_ms);
  if (st == 204) {
    json_decref(j);
    return NULL;
  }
  if (st != 200)
    fail_msg("lease: status %d", st);
  json_t *turn = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  return turn;
}

static const char *str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static json_int_t num(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }

static int complete(fixture *f, json_t *turn, const char *lease_tok, const char *reply, json_t **out) {
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)num(turn, "id"));
  int st;
  json_t *j = call(f, &st, "POST", path,
                   "{\"lease\":\"%s\",\"cost\":{\"tokens\":10,\"tool_calls\":1}%s%s%s}",
                   lease_tok ? lease_tok : str(turn, "lease"), reply ? ",\"reply\":{\"body\":\"" : "",
                   reply ? reply : "", reply ? "\"}" : "");
  if (out)
    *out = j;
  else
    json_decref(j);
  return st;
}

static void post_event(fixture *f, const char *channel, const char *body, const char *mention) {
  char json[512];
  if (mention)
    snprintf(json, sizeof json,
             "{\"events\":[{\"channel\":\"%s\",\"sender\":\"u\",\"body\":\"%s\",\"mentions\":[\"%s\"]}]}",
             channel, body, mention);
  else
    snprintf(json, sizeof json, "{\"events\":[{\"channel\":\"%s\",\"sender\":\"u\",\"body\":\"%s\"}]}",
             channel, body);
  expect(f, 200, "POST", "/v1/events", json);
}

static void test_lease_complete_reply_round_trip_over_http(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  int st;
  json_t *r = call(f, &st, "POST", "/v1/events",
                   "{\"events\":[{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"hi\"}]}");
  assert_int_equal(st, 200);
  json_t *res = json_array_get(json_object_get(r, "results"), 0);
  assert_string_equal(str(res, "status"), "queued");
  assert_string_equal(json_string_value(json_array_get(json_object_get(res, "sessions"), 0)), "s1");
  json_decref(r);

  json_t *turn = lease(f, 5000);
  assert_non_null(turn);
  assert_string_equal(str(turn, "session"), "s1");
  assert_string_equal(str(turn, "kind"), "inbox");
  assert_string_equal(str(turn, "input"), "inbox:hi");
  assert_int_equal(strlen(str(turn, "lease")), 32);
  json_t *staged = json_array_get(json_object_get(turn, "staged"), 0);
  assert_string_equal(str(staged, "sender"), "ann");
  json_int_t inbox_id = num(staged, "id");
  assert_non_null(json_object_get(json_object_get(turn, "sections"), "pending_obligations"));

  assert_int_equal(complete(f, turn, NULL, "hello ann", NULL), 200);
  assert_int_equal(complete(f, turn, NULL, "hello ann", NULL), 200); /* idempotent */
  json_t *rep = call(f, &st, "GET", "/v1/replies?after=0", NULL);
  assert_int_equal(st, 200);
  json_t *replies = json_object_get(rep, "replies");
  assert_int_equal(json_array_size(replies), 1);
  json_t *one = json_array_get(replies, 0);
  assert_string_equal(str(one, "body"), "hello ann");
  assert_string_equal(str(one, "channel"), "general");
  assert_int_equal(json_integer_value(json_array_get(json_object_get(one, "source_inbox_ids"), 0)),
                   inbox_id);
  json_decref(rep);
  json_decref(turn);
}

static void test_wrong_lease_is_409_and_expired_lease_restages_input(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  post_event(f, "general", "job", NULL);
  json_t *first = lease(f, 5000);
  assert_non_null(first);
  assert_int_equal(complete(f, first, "0123456789abcdef0123456789abcdef", NULL, NULL), 409);
  /* the 1 s lease runs out; the next worker gets the same input */
  json_t *second = lease(f, 5000);
  assert_non_null(second);
  assert_string_equal(str(second, "input"), "inbox:job");
  assert_true(num(second, "id") != num(first, "id"));
  assert_int_equal(complete(f, first, NULL, NULL, NULL), 409); /* too late */
  assert_int_equal(complete(f, second, NULL, NULL, NULL), 200);
  json_decref(first);
  json_decref(second);
}

static void test_parked_after_max_attempts_and_requeue(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  post_event(f, "general", "poison", NULL);
  for (int i = 0; i < 2; i++) {
    json_t *t = lease(f, 5000);
    assert_non_null(t);
    char path[96], body[96];
    snprintf(path, sizeof path, "/v1/turns/%lld/fail", (long long)num(t, "id"));
    snprintf(body, sizeof body, "{\"lease\":\"%s\",\"error\":\"model crashed\"}", str(t, "lease"));
    expect(f, 200, "POST", path, body);
    json_decref(t);
  }
  int st;
  json_t *parked = call(f, &st, "GET", "/v1/turns?state=parked", NULL);
  assert_int_equal(st, 200);
  json_t *turns = json_object_get(parked, "turns");
  assert_int_equal(json_array_size(turns), 1);
  json_int_t id = num(json_array_get(turns, 0), "id");
  json_decref(parked);
  assert_null(lease(f, 300));
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", (long long)id);
  expect(f, 200, "POST", path, "{}");
  json_t *t = lease(f, 5000);
  assert_non_null(t);
  assert_string_equal(str(t, "input"), "inbox:poison");
  json_decref(t);
}

static void test_mentions_jump_the_queue_and_cap_folds_oldest_unmentioned(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  expect(f, 200, "POST", "/v1/events",
         "{\"events\":["
         "{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"u1\"},"
         "{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"u2\"},"
         "{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"m1\",\"mentions\":[\"s1\"]},"
         "{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"u3\"}]}");
  json_t *t = lease(f, 5000);
  assert_non_null(t);
  /* max-queue 3: u1 and u2 were folded into one overflow entry, counted; the mention first */
  const char *input = str(t, "input");
  const char *head = "inbox:m1\n2 older messages folded by the queue cap, ";
  assert_true(strncmp(input, head, strlen(head)) == 0);
  assert_non_null(strstr(input, "\n- u: u1\n- u: u2\nu3"));
  json_t *staged = json_object_get(t, "staged");
  assert_int_equal(json_array_size(staged), 3);
  json_t *ovf = json_array_get(staged, 1);
  assert_int_equal(num(ovf, "count"), 2);
  assert_string_equal(str(ovf, "fold"), "overflow");
  assert_int_equal(json_array_size(json_object_get(ovf, "event_ids")), 2);
  json_decref(t);
  int st;
  json_t *s = call(f, &st, "GET", "/v1/sessions/s1", NULL);
  assert_int_equal(st, 200);
  assert_string_equal(str(s, "id"), "s1");
  assert_string_equal(str(s, "class"), "interactive");
  json_decref(s);
}

static void test_idempotency_key_is_stored_once(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  const char *ev = "{\"events\":[{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"x\",\"key\":\"k-1\"}]}";
  int st;
  json_t *a = call(f, &st, "POST", "/v1/events", "%s", ev);
  json_t *b = call(f, &st, "POST", "/v1/events", "%s", ev);
  json_t *ra = json_array_get(json_object_get(a, "results"), 0);
  json_t *rb = json_array_get(json_object_get(b, "results"), 0);
  assert_string_equal(str(rb, "status"), "duplicate");
  assert_int_equal(num(ra, "id"), num(rb, "id"));
  json_decref(a);
  json_decref(b);
  json_t *t = lease(f, 5000);
  assert_string_equal(str(t, "input"), "inbox:x");
  assert_int_equal(complete(f, t, NULL, NULL, NULL), 200);
  json_decref(t);
  assert_null(lease(f, 300));
}

static void test_long_poll_times_out_with_204_and_wakes_on_ingest(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  assert_null(lease(f, 200));
  pid_t child = fork();
  if (child == 0) {
    usleep(300 * 1000);
    post_event(f, "general", "wake", NULL);
    _exit(0);
  }
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  json_t *t = lease(f, 20000);
  clock_gettime(CLOCK_MONOTONIC, &b);
  assert_non_null(t);
  assert_string_equal(str(t, "input"), "inbox:wake");
  double waited = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  assert_true(waited < 10.0); /* woke on the ingest, not at its 20 s wait */
  json_decref(t);
}

static void test_autonomy_tick_over_http_has_no_obligations(void **state) {
  fixture *f = *state;
  expect(f, 200, "POST", "/v1/sessions",
         "{\"id\":\"ticker\",\"class\":\"operational\",\"autonomy_interval_s\":1}");
  json_t *t = lease(f, 5000);
  assert_non_null(t);
  assert_string_equal(str(t, "kind"), "autonomy_tick");
  assert_string_equal(str(t, "input"), "autonomy_tick");
  assert_int_equal(json_array_size(json_object_get(t, "staged")), 0);
  json_t *sections = json_object_get(t, "sections");
  json_t *obligations = json_object_get(sections, "pending_obligations");
  assert_int_equal(num(obligations, "staged_count"), 0);
  assert_string_equal(json_string_value(json_object_get(sections, "conversation_history")), "none");
  assert_int_equal(complete(f, t, NULL, NULL, NULL), 200);
  json_decref(t);
}

/* context_window_tokens set by PUT is stored, read back, and bounds the next leased turn;
 * PUT null puts the policy default (8192) back, as POST does for a session that sets none. */
static void test_put_context_window_is_stored_and_bounds_the_next_turn(void **state) {
  fixture *f = *state;
  create(f, "s1", "general");
  int st;
  json_t *s = call(f, &st, "PUT", "/v1/sessions/s1", "{\"context_window_tokens\":300}");
  assert_int_equal(st, 200);
  assert_int_equal(num(s, "context_window_tokens"), 300);
  json_decref(s);
  s = call(f, &st, "GET", "/v1/sessions/s1", NULL);
  assert_int_equal(st, 200);
  assert_int_equal(num(s, "context_window_tokens"), 300);
  json_decref(s);

  /* 12 messages of 200 bytes: listed whole they would take ~600 tokens of obligations */
  char body[201];
  memset(body, 'x', 200);
  body[200] = '\0';
  for (int i = 0; i < 12; i++) {
    body[0] = (char)('a' + i); /* distinct: no dedupe */
    post_event(f, "general", body, NULL);
  }
  json_t *turn = lease(f, 5000);
  assert_non_null(turn);
  /* max-queue 3: the oldest ten are one overflow entry, counted; all twelve are carried */
  json_t *staged = json_object_get(turn, "staged");
  assert_int_equal(json_array_size(staged), 3);
  json_int_t carried = 0;
  for (size_t i = 0; i < json_array_size(staged); i++)
    carried += num(json_array_get(staged, i), "count");
  assert_int_equal(carried, 12);
  json_t *tokens = json_object_get(turn, "tokens");
  assert_int_equal(num(tokens, "window"), 300);
  assert_true(num(tokens, "sections") <= 300);
  /* the obligations had to shrink to fit: no preview holds a whole body */
  json_t *obl = json_object_get(json_object_get(json_object_get(turn, "sections"),
                                                "pending_obligations"),
                                "messages");
  assert_true(json_array_size(obl) > 0);
  for (size_t i = 0; i < json_array_size(obl); i++)
    assert_true(strlen(str(json_array_get(obl, i), "preview")) < 200);
  assert_int_equal(complete(f, turn, NULL, NULL, NULL), 200);
  json_decref(turn);

  s = call(f, &st, "PUT", "/v1/sessions/s1", "{\"context_window_tokens\":null}");
  assert_int_equal(st, 200);
  assert_int_equal(num(s, "context_window_tokens"), 8192);
  json_decref(s);
  s = call(f, &st, "GET", "/v1/sessions/s1", NULL);
  assert_int_equal(num(s, "context_window_tokens"), 8192);
  json_decref(s);
}

/* Every event acknowledged before a kill -9 is there after the restart, exactly once. */
static void test_kill_9_after_acknowledged_ingest_loses_nothing(void **state) {
  fixture *f = *state;
  /* This test needs no queue cap in the way: its own daemon with the default max-queue. */
  cph_test_daemon_stop(&f->d);
  unlink(f->policy);
  free(f->policy);
  f->policy = cph_test_write_tmpfile(".edn", "{:sessions {:max-batch 1000}}\n");
  char *dir = cph_test_tmpdir("kill9");
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, dir, NULL), 0);
  create(f, "s1", "general");
  create(f, "s2", "other");
  enum { N = 60 };
  for (int i = 0; i < N; i++) {
    int st;
    json_t *j = call(f, &st, "POST", "/v1/events",
                     "{\"events\":[{\"channel\":\"%s\",\"sender\":\"u\",\"body\":\"e%d\"}]}",
                     i % 2 ? "other" : "general", i);
    json_decref(j);
    assert_int_equal(st, 200); /* acknowledged: committed */
  }
  assert_int_equal(cph_test_daemon_signal_wait(&f->d, SIGKILL), 128 + SIGKILL);
  cph_test_daemon_stop(&f->d); /* keeps the data dir: it was given */
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, dir, NULL), 0);
  /* Every acknowledged message comes back staged (written so in the pass that took it). */
  for (int i = 0; i < 2; i++) {
    int st;
    json_t *s = call(f, &st, "GET", i ? "/v1/sessions/s2" : "/v1/sessions/s1", NULL);
    assert_int_equal(st, 200);
    assert_int_equal(json_integer_value(json_object_get(s, "staged")), N / 2);
    assert_int_equal(json_integer_value(json_object_get(s, "pending")), 0);
    json_decref(s);
  }

  int seen[N] = {0};
  json_t *t;
  while ((t = lease(f, 500))) {
    char *input = strdup(str(t, "input"));
    for (char *tok = strtok(input + strlen("inbox:"), "\n"); tok; tok = strtok(NULL, "\n"))
      if (tok[0] == 'e' && atoi(tok + 1) < N)
        seen[atoi(tok + 1)]++;
    free(input);
    assert_int_equal(complete(f, t, NULL, NULL, NULL), 200);
    json_decref(t);
  }
  for (int i = 0; i < N; i++)
    if (seen[i] != 1)
      fail_msg("event e%d came back %d times after kill -9", i, seen[i]);
  cph_test_daemon_stop(&f->d);
  cph_test_rmtree(dir);
  free(dir);
  /* teardown stops f->d again: harmless, pid is 0 */
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_lease_complete_reply_round_trip_over_http, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_lease_is_409_and_expired_lease_restages_input, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_parked_after_max_attempts_and_requeue, setup, teardown),
      cmocka_unit_test_setup_teardown(test_mentions_jump_the_queue_and_cap_folds_oldest_unmentioned,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_key_is_stored_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_long_poll_times_out_with_204_and_wakes_on_ingest, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_put_context_window_is_stored_and_bounds_the_next_turn,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_autonomy_tick_over_http_has_no_obligations, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_kill_9_after_acknowledged_ingest_loses_nothing, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
