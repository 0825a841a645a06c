/* Online map growth (issue #18 item 4, DESIGN §13): the LMDB map starts at :server
 * :map-size-mb and doubles while the daemon runs whenever it is full, so a 4 MiB map takes
 * 12,000 events of 1 KiB without a single 507, every one of them readable afterwards and after
 * a restart, which goes on growing it. (A map at its ceiling, :max-map-size-mb, answering 507:
 * test_disk_full.) The real cephalond over loopback with a temp data dir. */
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

/* Dedupe off (bodies are never shorter than :min-length): every event is stored whole. */
static const char *POLICY = "{:server {:map-size-mb 4}\n"
                            " :sessions {:janitor? false}\n"
                            " :dedupe {:min-length 1000000}}\n";

#define EVENTS 12000
#define PER_REQUEST 100

/* A 1 KiB body, distinct per event. */
static void body_of(int n, char *out, size_t size) {
  int len = snprintf(out, size, "event %06d ", n);
  for (; len < 1024 && (size_t)len + 1 < size; len++)
    out[len] = (char)('a' + (n + len) % 26);
  out[len] = '\0';
}

static int64_t metric(int port, const char *name) {
  cph_test_response r = cph_test_api(port, "GET", "/metrics", NULL, NULL);
  int64_t v = -1;
  size_t len = strlen(name);
  for (const char *at = r.body; at && *at; at = strchr(at, '\n'), at = at ? at + 1 : NULL)
    if (strncmp(at, name, len) == 0 && at[len] == ' ') {
      v = (int64_t)strtod(at + len + 1, NULL);
      break;
    }
  cph_test_response_free(&r);
  return v;
}

static void test_a_4_mib_map_takes_12000_events_of_1_kib(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(".edn", POLICY);
  char *dir = cph_test_tmpdir("mapgrow");
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, dir, NULL), 0);
  int64_t map_before = metric(d.port, "cephalon_lmdb_map_size_bytes");
  assert_int_equal(map_before, 4 << 20);
  cph_test_response s = cph_test_api(d.port, "POST", "/v1/sessions", NULL,
                                     "{\"id\":\"s1\",\"class\":\"interactive\","
                                     "\"subscribe\":[\"general\"]}");
  assert_int_equal(s.status, 200);
  cph_test_response_free(&s);

  int64_t *ids = calloc(EVENTS, sizeof *ids);
  size_t body_cap = (size_t)PER_REQUEST * 1200 + 64;
  char *req = malloc(body_cap);
  for (int n = 0; n < EVENTS; n += PER_REQUEST) {
    size_t len = (size_t)snprintf(req, body_cap, "{\"events\":[");
    for (int i = 0; i < PER_REQUEST; i++) {
      char body[1100];
      body_of(n + i, body, sizeof body);
      len += (size_t)snprintf(req + len, body_cap - len,
                              "%s{\"channel\":\"general\",\"sender\":\"alice\",\"body\":\"%s\"}",
                              i ? "," : "", body);
    }
    snprintf(req + len, body_cap - len, "]}");
    cph_test_response r = cph_test_api(d.port, "POST", "/v1/events", NULL, req);
    if (r.status != 200)
      fail_msg("events %d..%d: %d %.300s", n, n + PER_REQUEST - 1, r.status, r.body);
    json_t *j = cph_test_json(&r);
    json_t *results = json_object_get(j, "results");
    assert_int_equal(json_array_size(results), PER_REQUEST);
    for (int i = 0; i < PER_REQUEST; i++)
      ids[n + i] = json_integer_value(json_object_get(json_array_get(results, (size_t)i), "id"));
    json_decref(j);
    cph_test_response_free(&r);
  }
  int64_t map_after = metric(d.port, "cephalon_lmdb_map_size_bytes");
  assert_true(map_after > map_before);                                       /* it grew ... */
  assert_int_equal(metric(d.port, "cephalon_storage_full_errors_total"), 0); /* ... unseen */

  /* Every event is there, before and after a restart (the grown map outlives it). */
  for (int pass = 0; pass < 2; pass++) {
    for (int n = 0; n < EVENTS; n += 97) {
      char path[64], body[1100];
      snprintf(path, sizeof path, "/v1/events/%lld", (long long)ids[n]);
      cph_test_response r = cph_test_api(d.port, "GET", path, NULL, NULL);
      if (r.status != 200)
        fail_msg("event %d (id %lld): %d %s", n, (long long)ids[n], r.status, r.body);
      body_of(n, body, sizeof body);
      json_t *j = cph_test_json(&r);
      assert_string_equal(json_string_value(json_object_get(j, "body")), body);
      json_decref(j);
      cph_test_response_free(&r);
    }
    if (pass == 0) { /* reopened at :map-size-mb or the data's size, it grows again */
      cph_test_daemon_stop(&d);
      assert_int_equal(cph_test_daemon_start(&d, policy, dir, NULL), 0);
      for (int k = 0; k < 5; k++) {
        cph_test_response r = cph_test_api(d.port, "POST", "/v1/events", NULL, req);
        if (r.status != 200)
          fail_msg("after the restart: %d %.300s", r.status, r.body);
        cph_test_response_free(&r);
      }
    }
  }
  cph_test_daemon_stop(&d);
  free(req);
  free(ids);
  cph_test_rmtree(dir);
  free(dir);
  unlink(policy);
  free(policy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_4_mib_map_takes_12000_events_of_1_kib),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
