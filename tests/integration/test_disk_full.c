/* A full store (DESIGN §11): with a tiny LMDB map that may not grow (its ceiling,
 * :max-map-size-mb, is its size), ingest answers 507 naming the cause and the setting to
 * change, while reads, leases and completions keep working; after the ceiling is raised
 * (policy + restart) ingest resumes and nothing acknowledged before is lost. The real
 * cephalond over loopback with a temp data dir. (The map growing by itself: test_map_growth.) */
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
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

/* Dedupe off (bodies are never shorter than :min-length): every event is a fresh message.
 * 2 MiB, not 1: under :sync :always the checkpoint's pin keeps the pages freed since the last
 * checkpoint from reuse (store/wal.c), a few hundred KiB at this test's pace, which ingest
 * counts as used (cph_txn_space); a 1 MiB map, half of it the workers' reserve, held fewer
 * than the 100 events the test wants before it filled. */
static const char *POLICY_TINY = "{:server {:map-size-mb 2 :max-map-size-mb 2}\n"
                                 " :sessions {:janitor? false}\n"
                                 " :dedupe {:min-length 1000000}}\n";
static const char *POLICY_GROWN = "{:server {:map-size-mb 64 :max-map-size-mb 64}\n"
                                  " :sessions {:janitor? false}\n"
                                  " :dedupe {:min-length 1000000}}\n";

enum { EVENTS_PER_REQUEST = 8, MAX_REQUESTS = 2000, MAX_ACKED = EVENTS_PER_REQUEST * MAX_REQUESTS };

typedef struct acked {
  int64_t id;
  int n; /* the event's number: its body is body_of(n) */
} acked;

static void body_of(int n, char *out, size_t size) {
  /* ~300 bytes: a few hundred fill the 1 MiB map */
  snprintf(out, size,
           "event %06d: the quick brown fox jumps over the lazy dog while the store fills up; "
           "padding padding padding padding padding padding padding padding padding padding "
           "padding padding padding padding padding padding padding padding padding padding "
           "padding padding padding padding padding padding padding padding #%06d",
           n, n);
}

/* Posts events n..n+count-1 to "general"; returns the status and appends acked ids. */
static int post_batch(int port, int n, int count, acked *out, size_t *n_out, char **raw) {
  char *json = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&json, &len);
  fputs("{\"events\":[", f);
  for (int i = 0; i < count; i++) {
    char body[512];
    body_of(n + i, body, sizeof body);
    fprintf(f, "%s{\"channel\":\"general\",\"sender\":\"filler\",\"body\":\"%s\"}", i ? "," : "",
            body);
  }
  fputs("]}", f);
  fclose(f);
  int st;
  json_t *j = cph_hc_call_raw(port, NULL, &st, raw, "POST", "/v1/events", "%s", json);
  free(json);
  if (st == 200) {
    json_t *results = json_object_get(j, "results");
    assert_int_equal(json_array_size(results), count);
    for (int i = 0; i < count; i++) {
      json_t *r = json_array_get(results, (size_t)i);
      assert_string_equal(cph_hc_str(r, "status"), "queued");
      out[*n_out].id = cph_hc_int(r, "id");
      out[*n_out].n = n + i;
      (*n_out)++;
    }
  }
  json_decref(j);
  return st;
}

static void expect_event(int port, const acked *a) {
  char path[64], body[512];
  snprintf(path, sizeof path, "/v1/events/%lld", (long long)a->id);
  body_of(a->n, body, sizeof body);
  int st;
  json_t *j = cph_hc_call(port, NULL, &st, "GET", path, NULL);
  if (st != 200 || strcmp(cph_hc_str(j, "body"), body) != 0)
    fail_msg("acknowledged event %lld (#%d) lost: status %d body '%s'", (long long)a->id, a->n,
             st, cph_hc_str(j, "body"));
  json_decref(j);
}

/* Leases one turn and completes it with a reply; returns the number of staged messages. */
static size_t lease_and_complete(int port, const char *reply) {
  int st;
  json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":3000}");
  if (st != 200)
    fail_msg("lease on a full store: status %d", st);
  json_t *turn = json_object_get(j, "turn");
  size_t staged = json_array_size(json_object_get(turn, "staged"));
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)cph_hc_int(turn, "id"));
  char *raw = NULL;
  json_t *c = cph_hc_call_raw(port, NULL, &st, &raw, "POST", path,
                              "{\"lease\":\"%s\",\"cost\":{\"tokens\":5,\"tool_calls\":0},"
                              "\"reply\":{\"body\":\"%s\"}}",
                              cph_hc_str(turn, "lease"), reply);
  if (st != 200)
    fail_msg("complete on a full store: status %d: %s", st, raw ? raw : "");
  assert_string_equal(cph_hc_str(c, "status"), "completed");
  free(raw);
  json_decref(c);
  json_decref(j);
  return staged;
}

static bool reply_present(int port, const char *body) {
  int st;
  json_t *j = cph_hc_call(port, NULL, &st, "GET", "/v1/replies?after=0", NULL);
  bool found = false;
  json_t *replies = json_object_get(j, "replies");
  for (size_t i = 0; i < json_array_size(replies); i++)
    found |= strcmp(cph_hc_str(json_array_get(replies, i), "body"), body) == 0;
  json_decref(j);
  return st == 200 && found;
}

/* The test's daemon, data dir and policy: the teardown cleans up after a failure too. */
static cph_test_daemon d;
static char *policy, *dir;

static int teardown(void **state) {
  (void)state;
  if (d.log_path)
    cph_test_daemon_stop(&d);
  if (dir)
    cph_test_rmtree(dir);
  if (policy)
    unlink(policy);
  free(dir);
  free(policy);
  dir = policy = NULL;
  return 0;
}

static void test_full_map_refuses_ingest_with_507_and_keeps_serving_then_grows(void **state) {
  (void)state;
  policy = cph_test_write_tmpfile(".edn", POLICY_TINY);
  dir = cph_test_tmpdir("diskfull");
  assert_int_equal(cph_test_daemon_start(&d, policy, dir, NULL), 0);
  int st;
  json_decref(cph_hc_call(d.port, NULL, &st, "POST", "/v1/sessions",
                          "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}"));
  assert_int_equal(st, 200);

  /* Fill the map: every acknowledged event is remembered. */
  acked *ack = calloc(MAX_ACKED, sizeof *ack);
  size_t n_ack = 0;
  int next = 0, req = 0;
  char *raw = NULL;
  for (; req < MAX_REQUESTS; req++) {
    free(raw);
    raw = NULL;
    st = post_batch(d.port, next, EVENTS_PER_REQUEST, ack, &n_ack, &raw);
    next += EVENTS_PER_REQUEST;
    if (st != 200)
      break;
  }
  print_message("map full after %d requests, %zu events acknowledged\n", req, n_ack);
  if (st != 507)
    fail_msg("ingest into a full 1 MiB map: want 507, got %d: %s", st, raw ? raw : "");
  assert_true(n_ack > 100); /* the map held a fair amount before it filled */
  json_t *answer = json_loads(raw, 0, NULL);
  json_t *err = json_object_get(answer, "error");
  const char *code = cph_hc_str(err, "code"), *msg = cph_hc_str(err, "message");
  assert_string_equal(code, "storage_full");
  if (!strstr(msg, "storage full") || !strstr(msg, ":max-map-size-mb"))
    fail_msg("the 507 message should say storage full and name :max-map-size-mb: %s", msg);
  json_decref(answer);
  free(raw);
  raw = NULL;

  /* Still full: a second attempt is refused the same way (and does not wedge anything). */
  size_t before = n_ack;
  st = post_batch(d.port, next, 1, ack, &n_ack, NULL);
  next += 1;
  assert_int_equal(st, 507);
  assert_int_equal(n_ack, before);

  /* Reads work. */
  expect_event(d.port, &ack[0]);
  expect_event(d.port, &ack[n_ack - 1]);
  json_decref(cph_hc_call(d.port, NULL, &st, "GET", "/v1/sessions/s1", NULL));
  assert_int_equal(st, 200);
  json_decref(cph_hc_call(d.port, NULL, &st, "GET", "/v1/lanes", NULL));
  assert_int_equal(st, 200);
  json_decref(cph_hc_call(d.port, NULL, &st, "GET", "/healthz", NULL));
  assert_int_equal(st, 200);

  /* Leases and completions work: a few worker cycles on the full store. */
  size_t consumed = 0;
  for (int i = 0; i < 3; i++) {
    char reply[64];
    snprintf(reply, sizeof reply, "reply-on-full-store-%d", i);
    consumed += lease_and_complete(d.port, reply);
    assert_true(reply_present(d.port, reply));
  }
  assert_true(consumed > 0);
  /* ...and a full store still refuses ingest. */
  st = post_batch(d.port, next, 1, ack, &n_ack, NULL);
  next += 1;
  assert_int_equal(st, 507);

  /* A clean stop, then the map grows (policy + restart). */
  assert_int_equal(cph_test_daemon_stop(&d), 0);
  FILE *fp = fopen(policy, "w");
  assert_non_null(fp);
  fputs(POLICY_GROWN, fp);
  fclose(fp);
  assert_int_equal(cph_test_daemon_start(&d, policy, dir, NULL), 0);

  before = n_ack;
  for (int i = 0; i < 10; i++) {
    st = post_batch(d.port, next, EVENTS_PER_REQUEST, ack, &n_ack, NULL);
    next += EVENTS_PER_REQUEST;
    assert_int_equal(st, 200);
  }
  assert_int_equal(n_ack, before + 10 * EVENTS_PER_REQUEST);
  /* Nothing acknowledged was lost, before or after the map grew. */
  for (size_t i = 0; i < n_ack; i++)
    expect_event(d.port, &ack[i]);
  for (int i = 0; i < 3; i++) {
    char reply[64];
    snprintf(reply, sizeof reply, "reply-on-full-store-%d", i);
    assert_true(reply_present(d.port, reply));
  }
  /* The grown store serves workers as before. */
  lease_and_complete(d.port, "after-growth");
  assert_true(reply_present(d.port, "after-growth"));

  assert_int_equal(cph_test_daemon_stop(&d), 0);
  free(ack);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_full_map_refuses_ingest_with_507_and_keeps_serving_then_grows,
                                teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
