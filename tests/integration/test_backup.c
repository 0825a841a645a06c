/* Online backup (issue #18 item 3): `cephalonctl backup DIR` copies the store of a daemon that
 * keeps taking writes, and a second daemon started on the copy serves every session and every
 * event acknowledged before the backup began. Bad directories are refused with a clear error
 * and change nothing. The real cephalond and cephalonctl over loopback, temp data dirs. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* A long span (README "One write transaction across passes"): the writes of the last second
 * before the backup are in the span, and the copy must hold them all the same. */
static const char *POLICY = "{:sessions {:janitor? false}\n"
                            " :store {:span-ms 1000}\n"
                            " :dedupe {:min-length 1000000}}\n";

#define MAX_ACKED 200000
#define SESSIONS 20

typedef struct writer {
  int port;
  atomic_bool stop;
  atomic_long n_acked; /* acked[0 .. n_acked) are final */
  int64_t *acked;      /* event ids, in the order their POSTs were answered */
  int errors;
} writer;

/* Posts events of 20 per request to the sessions' channel until told to stop. */
static void *write_loop(void *arg) {
  writer *w = arg;
  for (int n = 0; !atomic_load(&w->stop); n++) {
    char body[4096];
    size_t len = (size_t)snprintf(body, sizeof body, "{\"events\":[");
    for (int i = 0; i < 20; i++)
      len += (size_t)snprintf(body + len, sizeof body - len,
                              "%s{\"channel\":\"general\",\"sender\":\"alice\","
                              "\"body\":\"message %d.%d written during the backup\"}",
                              i ? "," : "", n, i);
    snprintf(body + len, sizeof body - len, "]}");
    cph_test_response r = cph_test_api(w->port, "POST", "/v1/events", NULL, body);
    json_t *j = r.status == 200 ? cph_test_json(&r) : NULL;
    json_t *results = j ? json_object_get(j, "results") : NULL;
    if (!results) {
      w->errors++;
    } else {
      long at = atomic_load(&w->n_acked);
      for (size_t i = 0; i < json_array_size(results) && at < MAX_ACKED; i++)
        w->acked[at++] = json_integer_value(json_object_get(json_array_get(results, i), "id"));
      atomic_store(&w->n_acked, at);
    }
    json_decref(j);
    cph_test_response_free(&r);
  }
  return NULL;
}

static int run_ctl(int port, const char *const *args, char **out, char **err) {
  const char *bin = getenv("CPH_BIN_DIR");
  char ctl[4096], url[64];
  snprintf(ctl, sizeof ctl, "%s/cephalonctl", bin ? bin : "build/bin");
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  const char *argv[16] = {ctl, "--url", url};
  size_t n = 3;
  for (size_t i = 0; args[i] && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  return cph_test_run(argv, out, err);
}

static void test_backup_under_writes_restores_everything_acknowledged_before(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(".edn", POLICY);
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  for (int i = 0; i < SESSIONS; i++) {
    char body[160];
    snprintf(body, sizeof body,
             "{\"id\":\"agent%d\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}", i);
    cph_test_response r = cph_test_api(d.port, "POST", "/v1/sessions", NULL, body);
    if (r.status != 200)
      fail_msg("create agent%d: %d %s", i, r.status, r.body);
    cph_test_response_free(&r);
  }
  writer w = {.port = d.port};
  w.acked = calloc(MAX_ACKED, sizeof *w.acked);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, write_loop, &w), 0);
  while (atomic_load(&w.n_acked) < 2000) /* a store with something in it, writes under way */
    usleep(10000);

  char *parent = cph_test_tmpdir("backup");
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/copy", parent);
  long acked_before = atomic_load(&w.n_acked); /* acknowledged before the backup began */
  char *out = NULL, *err = NULL;
  const char *args[] = {"backup", dir, NULL};
  int rc = run_ctl(d.port, args, &out, &err);
  long acked_after = atomic_load(&w.n_acked);
  atomic_store(&w.stop, true);
  pthread_join(th, NULL);
  if (rc != 0)
    fail_msg("cephalonctl backup exited %d: %s %s", rc, out, err);
  assert_non_null(strstr(out, "backup done: "));
  assert_int_equal(w.errors, 0);
  assert_true(acked_after > acked_before); /* the daemon took writes while it copied */

  /* The status route says the same. */
  cph_test_response st = cph_test_api(d.port, "GET", "/v1/admin/backup", NULL, NULL);
  assert_int_equal(st.status, 200);
  json_t *sj = cph_test_json(&st);
  assert_string_equal(json_string_value(json_object_get(sj, "state")), "done");
  assert_string_equal(json_string_value(json_object_get(sj, "dir")), dir);
  assert_true(json_integer_value(json_object_get(sj, "bytes")) > 0);
  json_decref(sj);
  cph_test_response_free(&st);

  /* A second daemon on the copy: every session, every event acknowledged before. */
  cph_test_daemon d2;
  assert_int_equal(cph_test_daemon_start(&d2, policy, dir, NULL), 0);
  for (int i = 0; i < SESSIONS; i++) {
    char path[64];
    snprintf(path, sizeof path, "/v1/sessions/agent%d", i);
    cph_test_response r = cph_test_api(d2.port, "GET", path, NULL, NULL);
    assert_int_equal(r.status, 200);
    cph_test_response_free(&r);
  }
  for (long i = 0; i < acked_before; i += (i < acked_before - 50 ? 7 : 1)) {
    char path[64];
    snprintf(path, sizeof path, "/v1/events/%lld", (long long)w.acked[i]);
    cph_test_response r = cph_test_api(d2.port, "GET", path, NULL, NULL);
    if (r.status != 200)
      fail_msg("event %lld (acknowledged before the backup) is not in the copy: %d %s",
               (long long)w.acked[i], r.status, r.body);
    cph_test_response_free(&r);
  }
  /* The copy's replies stream is another one (its ids may go back from what a connector of
   * the original read): GET /v1/replies names another stream there. */
  char *streams[2];
  int ports[2] = {d.port, d2.port};
  for (int k = 0; k < 2; k++) {
    cph_test_response r = cph_test_api(ports[k], "GET", "/v1/replies?after=0&limit=1", NULL, NULL);
    assert_int_equal(r.status, 200);
    json_t *j = cph_test_json(&r);
    cph_test_response_free(&r);
    const char *id = json_string_value(json_object_get(j, "stream"));
    assert_non_null(id);
    streams[k] = strdup(id);
    json_decref(j);
  }
  assert_string_not_equal(streams[0], streams[1]);
  free(streams[0]);
  free(streams[1]);
  cph_test_daemon_stop(&d2);
  cph_test_daemon_stop(&d);
  free(out);
  free(err);
  free(w.acked);
  cph_test_rmtree(parent);
  free(parent);
  unlink(policy);
  free(policy);
}

static void test_bad_directories_are_refused(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(".edn", POLICY);
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);

  cph_test_response r =
      cph_test_api(d.port, "POST", "/v1/admin/backup", NULL, "{\"dir\":\"relative/path\"}");
  cph_test_expect_error(&r, 400, "bad_request", "dir");
  cph_test_response_free(&r);

  char *full = cph_test_tmpdir("backup-full"); /* exists and is not empty */
  char file[4200];
  snprintf(file, sizeof file, "%s/keep.txt", full);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fputs("do not overwrite\n", f);
  fclose(f);
  char body[4300];
  snprintf(body, sizeof body, "{\"dir\":\"%s\"}", full);
  r = cph_test_api(d.port, "POST", "/v1/admin/backup", NULL, body);
  cph_test_expect_error(&r, 409, "conflict", "dir");
  cph_test_response_free(&r);
  char *kept = cph_test_read_file(file, NULL);
  assert_string_equal(kept, "do not overwrite\n");
  free(kept);

  r = cph_test_api(d.port, "POST", "/v1/admin/backup", NULL, "{}");
  cph_test_expect_error(&r, 400, "bad_request", "dir");
  cph_test_response_free(&r);

  cph_test_response st = cph_test_api(d.port, "GET", "/v1/admin/backup", NULL, NULL);
  json_t *sj = cph_test_json(&st);
  assert_string_equal(json_string_value(json_object_get(sj, "state")), "none");
  json_decref(sj);
  cph_test_response_free(&st);

  cph_test_daemon_stop(&d);
  cph_test_rmtree(full);
  free(full);
  unlink(policy);
  free(policy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backup_under_writes_restores_everything_acknowledged_before),
      cmocka_unit_test(test_bad_directories_are_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
