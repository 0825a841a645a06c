/* The accounting rule (DESIGN §4, §5), end to end: the real cephalond over HTTP on loopback.
 * Every event accepted for a session reaches a leased turn either as its own staged entry or
 * counted inside one (`count`, `event_ids`): repeats fold, the queue cap folds, a restart and
 * a kill -9 lose nothing acknowledged, and nothing is ever shown twice. Each test posts, then
 * leases and completes until the inbox is empty, and checks what the turns carried. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

/* A lease that waits this long and answers 204 means the inbox is empty: every pass that
 * could stage something runs well within it. */
#define EMPTY_WAIT_MS 1000

typedef struct fixture {
  char *policy; /* temp policy file */
  char *dir;    /* a data dir kept across restarts, or NULL */
  cph_test_daemon d;
} fixture;

static int setup(void **state) {
  *state = calloc(1, sizeof(fixture));
  return *state ? 0 : -1;
}

/* Fails the test when the daemon does not exit cleanly on SIGTERM (under the sanitizers, a
 * leak or an error report makes its exit status non-zero). */
static int teardown(void **state) {
  fixture *f = *state;
  int rc = cph_test_daemon_stop(&f->d);
  if (rc != 0)
    fprintf(stderr, "cephalond exited with %d on SIGTERM\n", rc);
  if (f->policy) {
    unlink(f->policy);
    free(f->policy);
  }
  if (f->dir) {
    cph_test_rmtree(f->dir);
    free(f->dir);
  }
  free(f);
  return rc == 0 ? 0 : -1;
}

/* Starts the daemon with this policy text; with keep_dir, on a data dir that outlives it. */
static void boot(fixture *f, const char *policy, bool keep_dir) {
  f->policy = cph_test_write_tmpfile(".edn", policy);
  if (keep_dir)
    f->dir = cph_test_tmpdir("accounting");
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, f->dir, NULL), 0);
}

/* Stops the daemon with sig (SIGTERM: a clean exit; SIGKILL: a crash) and starts it again on
 * the same data dir and policy. */
static void restart(fixture *f, int sig) {
  int rc = cph_test_daemon_signal_wait(&f->d, sig);
  assert_int_equal(rc, sig == SIGTERM ? 0 : 128 + sig);
  cph_test_daemon_stop(&f->d); /* keeps f->dir: it was given */
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, f->dir, NULL), 0);
}

static const char *str(const json_t *o, const char *k) {
  const char *s = json_string_value(json_object_get(o, k));
  return s ? s : "";
}
static json_int_t num(const json_t *o, const char *k) {
  return json_integer_value(json_object_get(o, k));
}

/* One request; fails the test unless it answers `want`. Returns the parsed answer. */
static json_t *call(fixture *f, int want, const char *method, const char *path, const char *body) {
  int st;
  char *raw = NULL;
  json_t *j = body ? cph_hc_call_raw(f->d.port, NULL, &st, &raw, method, path, "%s", body)
                   : cph_hc_call_raw(f->d.port, NULL, &st, &raw, method, path, NULL);
  if (st != want)
    fail_msg("%s %s %s: status %d, want %d: %s", method, path, body ? body : "", st, want,
             raw ? raw : "");
  free(raw);
  return j;
}

static void create_session(fixture *f, const char *id, const char *subscribe) {
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"%s\"]}",
           id, subscribe);
  json_decref(call(f, 200, "POST", "/v1/sessions", body));
}

static json_t *event(const char *channel, const char *sender, const char *body) {
  return json_pack("{s:s,s:s,s:s}", "channel", channel, "sender", sender, "body", body);
}

/* POSTs events (steals the array) and returns the results array (new reference), one result
 * per event. */
static json_t *post(fixture *f, json_t *events) {
  size_t n = json_array_size(events);
  json_t *req = json_pack("{s:o}", "events", events);
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  json_t *ans = call(f, 200, "POST", "/v1/events", body);
  json_t *results = json_incref(json_object_get(ans, "results"));
  if (json_array_size(results) != n)
    fail_msg("POST /v1/events %s: %zu results for %zu events", body, json_array_size(results), n);
  free(body);
  json_decref(ans);
  return results;
}

/* The result is `status` and reached exactly session s1. */
static void expect_result(const json_t *res, const char *status) {
  const json_t *sessions = json_object_get(res, "sessions");
  const char *first = json_string_value(json_array_get(sessions, 0));
  if (strcmp(str(res, "status"), status) != 0 || json_array_size(sessions) != 1 || !first ||
      strcmp(first, "s1") != 0 || num(res, "id") <= 0) {
    char *dump = json_dumps(res, JSON_COMPACT);
    fail_msg("result %s: want status %s reaching [\"s1\"]", dump, status);
  }
}

/* Posts `body` from `sender` on `channel` n times, in requests of `per_request` events, and
 * appends the answered ids to ids[*n_ids]. Every result reaches s1 (queued for the first of
 * a fresh family when first_queued, aggregated otherwise; either when first_queued < 0). */
static void post_repeats(fixture *f, const char *channel, const char *sender, const char *body,
                         int n, int per_request, int first_queued, json_int_t *ids, size_t *n_ids) {
  for (int sent = 0; sent < n;) {
    json_t *events = json_array();
    int k = n - sent < per_request ? n - sent : per_request;
    for (int i = 0; i < k; i++)
      json_array_append_new(events, event(channel, sender, body));
    json_t *results = post(f, events);
    for (int i = 0; i < k; i++, sent++) {
      json_t *res = json_array_get(results, (size_t)i);
      if (first_queued < 0)
        expect_result(res, strcmp(str(res, "status"), "queued") == 0 ? "queued" : "aggregated");
      else
        expect_result(res, sent == 0 && first_queued ? "queued" : "aggregated");
      ids[(*n_ids)++] = num(res, "id");
    }
    json_decref(results);
  }
}

/* Leases a turn (waiting up to wait_ms); NULL on 204. */
static json_t *lease(fixture *f, int wait_ms) {
  char body[96];
  snprintf(body, sizeof body, "{\"worker\":\"w\",\"wait_ms\":%d}", wait_ms);
  int st;
  char *raw = NULL;
  json_t *j = cph_hc_call_raw(f->d.port, NULL, &st, &raw, "POST", "/v1/turns/lease", "%s", body);
  if (st == 204) {
    free(raw);
    json_decref(j);
    return NULL;
  }
  if (st != 200)
    fail_msg("lease: status %d: %s", st, raw ? raw : "");
  free(raw);
  json_t *turn = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  return turn;
}

static void complete(fixture *f, const json_t *turn) {
  char path[96], body[160];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)num(turn, "id"));
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"cost\":{\"tokens\":10,\"tool_calls\":0}}",
           str(turn, "lease"));
  json_decref(call(f, 200, "POST", path, body));
}

/* A leased inbox turn of s1 whose input is "inbox:" + its staged bodies joined by "\n"
 * (DESIGN §4); each staged entry counts its events (count == |event_ids|, first is
 * event_id). Appends its staged entries to `into`. */
static void take_turn(const json_t *turn, json_t *into) {
  char *dump = json_dumps(turn, JSON_COMPACT);
  if (strcmp(str(turn, "session"), "s1") != 0 || strcmp(str(turn, "kind"), "inbox") != 0)
    fail_msg("want an inbox turn of s1, got %s", dump);
  const json_t *staged = json_object_get(turn, "staged");
  if (json_array_size(staged) == 0)
    fail_msg("inbox turn without staged entries: %s", dump);
  size_t cap = strlen(str(turn, "input")) + 64;
  char *want = malloc(cap);
  size_t used = (size_t)snprintf(want, cap, "inbox:");
  size_t i;
  const json_t *m;
  json_array_foreach(staged, i, m) {
    const char *body = str(m, "body");
    if (used + strlen(body) + 2 > cap)
      fail_msg("input shorter than its staged bodies: %s", dump);
    used += (size_t)snprintf(want + used, cap - used, "%s%s", i ? "\n" : "", body);
    const json_t *ids = json_object_get(m, "event_ids");
    if (num(m, "count") < 1 || (size_t)num(m, "count") != json_array_size(ids) ||
        json_integer_value(json_array_get(ids, 0)) != num(m, "event_id"))
      fail_msg("staged entry %zu does not count its events: %s", i, dump);
    json_array_append(into, (json_t *)m);
  }
  if (strcmp(want, str(turn, "input")) != 0)
    fail_msg("input is not \"inbox:\" + the staged bodies: %s", dump);
  free(want);
  free(dump);
}

/* Leases and completes s1's turns until a lease answers 204; returns every staged entry they
 * carried, in order. */
static json_t *drain(fixture *f) {
  json_t *entries = json_array();
  json_t *turn;
  while ((turn = lease(f, EMPTY_WAIT_MS))) {
    take_turn(turn, entries);
    complete(f, turn);
    json_decref(turn);
  }
  return entries;
}

static int cmp_id(const void *a, const void *b) {
  json_int_t x = *(const json_int_t *)a, y = *(const json_int_t *)b;
  return (x > y) - (x < y);
}

/* The entries account for exactly the events `want` (n of them): their counts sum to n and
 * their event_ids, taken together, are those ids, each once. */
static void expect_accounted(const json_t *entries, const json_int_t *want, size_t n) {
  json_int_t *got = calloc(n + 1, sizeof *got);
  json_int_t *exp = malloc((n + 1) * sizeof *exp);
  memcpy(exp, want, n * sizeof *exp);
  size_t n_got = 0;
  json_int_t sum = 0;
  size_t i, j;
  const json_t *m, *id;
  json_array_foreach(entries, i, m) {
    sum += num(m, "count");
    json_array_foreach(json_object_get(m, "event_ids"), j, id) {
      if (n_got == n)
        fail_msg("more event ids than the %zu events posted", n);
      got[n_got++] = json_integer_value(id);
    }
  }
  if (sum != (json_int_t)n || n_got != n) {
    char *dump = json_dumps(entries, JSON_COMPACT);
    fail_msg("counts sum to %lld and %zu event ids are listed, want %zu: %s", (long long)sum,
             n_got, n, dump);
  }
  qsort(got, n, sizeof *got, cmp_id);
  qsort(exp, n, sizeof *exp, cmp_id);
  for (size_t k = 0; k < n; k++)
    if (got[k] != exp[k])
      fail_msg("event ids differ at %zu (sorted): turns carried %lld, posts answered %lld", k,
               (long long)got[k], (long long)exp[k]);
  free(got);
  free(exp);
}

/* ---------------------------------------------------------------- tests */

/* DESIGN §5: "A human who writes 'restart host beta' after 'restart host alpha' is heard
 * twice." On a channel that is not bulk, nothing people write folds: similar messages that
 * differ in a word, a number or an identifier each reach the turn as their own entry. */
static void test_similar_messages_from_people_each_reach_the_turn(void **state) {
  fixture *f = *state;
  boot(f, "{}\n", false);
  create_session(f, "s1", "ops");
  static const char *const msgs[][2] = {
      {"alice", "restart the web service on host alpha"},
      {"monitor-bot", "disk usage on db-1 is at 91 percent"},
      {"bob", "restart the web service on host beta"},
      {"carol", "remember round 0"},
      {"dave", "deploy build 40 to staging"},
      {"carol", "restart the web service on host gamma"},
      {"alice", "remember round 1"},
      {"bob", "remember round 2"},
      {"monitor-bot", "disk usage on db-1 is at 92 percent"},
      {"alice", "deploy build 41 to staging"},
      {"dave", "remember round 3"},
      {"carol", "can you check why the nightly backup of the orders database failed again"},
      {"carol", "remember round 4"},
      {"bob", "can you check why the nightly backup of the users database failed again"},
      {"dave", "remember round 5"},
      {"monitor-bot", "disk usage on db-2 is at 92 percent"},
      {"alice", "remember round 6"},
      {"bob", "remember round 7"},
  };
  enum { N = sizeof msgs / sizeof msgs[0] };
  json_int_t ids[N];
  /* in requests of 1, 2 and 3 events, mixed */
  for (size_t at = 0, per = 1; at < N; at += per, per = per % 3 + 1) {
    json_t *events = json_array();
    for (size_t i = at; i < at + per && i < N; i++)
      json_array_append_new(events, event("ops", msgs[i][0], msgs[i][1]));
    json_t *results = post(f, events);
    for (size_t i = at; i < at + per && i < N; i++) {
      json_t *res = json_array_get(results, i - at);
      expect_result(res, "queued");
      ids[i] = num(res, "id");
    }
    json_decref(results);
  }

  json_t *entries = drain(f);
  expect_accounted(entries, ids, N);
  assert_int_equal(json_array_size(entries), N);
  for (size_t i = 0; i < N; i++) {
    size_t found = 0, k;
    const json_t *m;
    json_array_foreach(entries, k, m) {
      if (num(m, "event_id") != ids[i])
        continue;
      found++;
      if (num(m, "count") != 1 || strcmp(str(m, "fold"), "none") != 0 ||
          strcmp(str(m, "body"), msgs[i][1]) != 0 || strcmp(str(m, "sender"), msgs[i][0]) != 0) {
        char *dump = json_dumps(m, JSON_COMPACT);
        fail_msg("\"%s\" from %s reached the turn as %s", msgs[i][1], msgs[i][0], dump);
      }
    }
    if (found != 1)
      fail_msg("\"%s\" from %s reached %zu staged entries, want 1", msgs[i][1], msgs[i][0],
               found);
  }
  json_decref(entries);
}

/* A person who says the same thing twice straight to the session is heard as one entry that
 * counts both (exact repeat, DESIGN §5). */
static void test_repeated_direct_message_is_one_entry_counting_both(void **state) {
  fixture *f = *state;
  boot(f, "{}\n", false);
  create_session(f, "s1", "ops");
  const char *text = "please page the database on-call engineer about the outage";
  json_int_t ids[2];
  for (int i = 0; i < 2; i++) {
    json_t *events = json_array();
    json_array_append_new(events, json_pack("{s:s,s:s,s:s}", "session", "s1", "sender", "pat",
                                            "body", text));
    json_t *results = post(f, events);
    expect_result(json_array_get(results, 0), i ? "aggregated" : "queued");
    ids[i] = num(json_array_get(results, 0), "id");
    json_decref(results);
  }
  assert_true(ids[0] != ids[1]);

  json_t *entries = drain(f);
  assert_int_equal(json_array_size(entries), 1);
  const json_t *m = json_array_get(entries, 0);
  expect_accounted(entries, ids, 2);
  assert_int_equal(num(m, "count"), 2);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(m, "event_ids"), 0)), ids[0]);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(m, "event_ids"), 1)), ids[1]);
  assert_string_equal(str(m, "fold"), "repeat");
  assert_string_equal(str(m, "channel"), "direct:s1");
  const char *body = str(m, "body");
  if (strncmp(body, text, strlen(text)) != 0 || !strstr(body, "(×2, last "))
    fail_msg("folded body \"%s\": want \"%s (×2, last HH:MM)\"", body, text);
  json_decref(entries);
}

/* A bot repeating one alert 200 times: the session hears it counted, not 200 times, and not
 * fewer — the counts sum to 200 and the event ids are exactly the 200 posted. */
static void test_alert_flood_folds_into_an_entry_counting_every_event(void **state) {
  fixture *f = *state;
  boot(f, "{}\n", false);
  create_session(f, "s1", "ops");
  enum { N = 200, PER = 25 };
  json_int_t ids[N];
  size_t n = 0;
  post_repeats(f, "ops", "nagios-bot", "CRITICAL disk /var is full on db-primary", N, PER, 1, ids,
               &n);
  assert_int_equal(n, N);

  json_t *entries = drain(f);
  expect_accounted(entries, ids, N);
  assert_true(json_array_size(entries) >= 1);
  assert_true(json_array_size(entries) <= N / PER); /* folded, not one per event */
  const json_t *m = json_array_get(entries, 0);
  assert_string_equal(str(m, "fold"), "repeat");
  if (json_array_size(entries) == 1 && !strstr(str(m, "body"), "(×200, last "))
    fail_msg("folded body \"%s\": want \"... (×200, last HH:MM)\"", str(m, "body"));
  json_decref(entries);
}

/* On a bulk channel near duplicates fold, but never two alerts that differ in a number
 * (DESIGN §5): each queue depth reaches the turn as its own entry. Controls: the same depth
 * posted again folds into that depth's entry, and the same alert naming another consumer
 * group (a word, not a number) is near enough to fold — so what keeps the depths apart is the
 * number, not their distance. */
static void test_bulk_alerts_differing_in_a_number_never_fold_together(void **state) {
  fixture *f = *state;
  boot(f, "{:dedupe {:bulk [\"alerts\"]}}\n", false);
  create_session(f, "s1", "alerts");
  static const int depths[] = {3, 12, 7, 40, 41, 5, 99, 120, 8, 64};
  enum { N = sizeof depths / sizeof depths[0] };
  char texts[N][160];
  json_int_t ids[N + 3];
  for (size_t i = 0; i < N; i++) {
    snprintf(texts[i], sizeof texts[i],
             "ALERT the primary message broker reports queue depth %d for the orders consumer "
             "group",
             depths[i]);
    json_t *events = json_array();
    json_array_append_new(events, event("alerts", "monitor-bot", texts[i]));
    json_t *results = post(f, events);
    expect_result(json_array_get(results, 0), "queued");
    ids[i] = num(json_array_get(results, 0), "id");
    json_decref(results);
  }
  /* the control: depth 3 again, an exact repeat */
  json_t *events = json_array();
  json_array_append_new(events, event("alerts", "monitor-bot", texts[0]));
  json_t *results = post(f, events);
  expect_result(json_array_get(results, 0), "aggregated");
  ids[N] = num(json_array_get(results, 0), "id");
  json_decref(results);
  /* the near-duplicate control: two groups named by words fold into one entry */
  static const char *const worded[] = {
      "ALERT the primary message broker reports queue depth high for the orders consumer group",
      "ALERT the primary message broker reports queue depth high for the billing consumer group"};
  for (size_t i = 0; i < 2; i++) {
    events = json_array();
    json_array_append_new(events, event("alerts", "monitor-bot", worded[i]));
    results = post(f, events);
    expect_result(json_array_get(results, 0), i ? "aggregated" : "queued");
    ids[N + 1 + i] = num(json_array_get(results, 0), "id");
    json_decref(results);
  }

  json_t *entries = drain(f);
  expect_accounted(entries, ids, N + 3);
  assert_int_equal(json_array_size(entries), N + 1);
  size_t k;
  const json_t *m, *near = NULL;
  json_array_foreach(entries, k, m) if (num(m, "event_id") == ids[N + 1]) near = m;
  assert_non_null(near);
  assert_int_equal(num(near, "count"), 2);
  assert_string_equal(str(near, "fold"), "repeat");
  if (!strstr(str(near, "body"), worded[0]) || !strstr(str(near, "body"), worded[1]))
    fail_msg("near-duplicate entry \"%s\" does not show both texts", str(near, "body"));
  for (size_t i = 0; i < N; i++) {
    const json_t *hit = NULL;
    json_array_foreach(entries, k, m) if (num(m, "event_id") == ids[i]) hit = m;
    if (!hit)
      fail_msg("queue depth %d has no entry of its own", depths[i]);
    json_int_t want = i == 0 ? 2 : 1;
    if (num(hit, "count") != want || strncmp(str(hit, "body"), texts[i], strlen(texts[i])) != 0) {
      char *dump = json_dumps(hit, JSON_COMPACT);
      fail_msg("queue depth %d: want count %lld and its own text, got %s", depths[i],
               (long long)want, dump);
    }
  }
  json_decref(entries);
}

/* The queue cap (:sessions :max-queue) folds the oldest queued entries into one overflow
 * entry instead of dropping them (DESIGN §4): 20 distinct messages on a cap of 5 all reach
 * the turn, counted; the session and the metric say how many were folded. */
static void test_queue_cap_folds_into_overflow_entry_and_drops_nothing(void **state) {
  fixture *f = *state;
  boot(f, "{:sessions {:max-queue 5}}\n", false);
  create_session(f, "s1", "ops");
  enum { N = 20 };
  json_int_t ids[N];
  for (int i = 0; i < N; i++) {
    char text[96];
    snprintf(text, sizeof text, "status note %d: the %s shift handed over", i,
             i % 2 ? "night" : "day");
    json_t *events = json_array();
    json_array_append_new(events, event("ops", i % 3 ? "erin" : "frank", text));
    json_t *results = post(f, events);
    expect_result(json_array_get(results, 0), "queued");
    ids[i] = num(json_array_get(results, 0), "id");
    json_decref(results);
  }
  json_t *s = call(f, 200, "GET", "/v1/sessions/s1", NULL);
  json_int_t folded = num(s, "folded");
  if (!json_is_integer(json_object_get(s, "folded")) || folded <= 0 || folded > N) {
    char *dump = json_dumps(s, JSON_COMPACT);
    fail_msg("GET /v1/sessions/s1 after %d messages on a cap of 5: want 0 < folded <= %d: %s", N,
             N, dump);
  }
  json_decref(s);

  json_t *entries = drain(f);
  expect_accounted(entries, ids, N);
  assert_true(json_array_size(entries) <= 5);
  size_t overflow = 0, k;
  const json_t *m;
  json_array_foreach(entries, k, m) if (strcmp(str(m, "fold"), "overflow") == 0) overflow++;
  assert_int_equal(overflow, 1);
  json_decref(entries);

  cph_test_response r = cph_test_http(f->d.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  const char *line = strstr(r.body, "\ncephalon_inbox_overflow_folded_total ");
  if (!line)
    fail_msg("/metrics has no cephalon_inbox_overflow_folded_total sample");
  long long total = atoll(line + strlen("\ncephalon_inbox_overflow_folded_total "));
  if (total < folded)
    fail_msg("cephalon_inbox_overflow_folded_total %lld, want >= %lld (the session's folded)",
             total, (long long)folded);
  cph_test_response_free(&r);
}

/* The value of an unlabelled counter or gauge in /metrics. */
static long long metric(fixture *f, const char *name) {
  cph_test_response r = cph_test_http(f->d.port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  char want[128];
  snprintf(want, sizeof want, "\n%s ", name);
  const char *line = strstr(r.body, want);
  if (!line)
    fail_msg("/metrics has no %s sample", name);
  long long v = atoll(line + strlen(want));
  cph_test_response_free(&r);
  return v;
}

/* A flood that spans a restart: everything acknowledged before and after is counted once. */
static void flood_across_restart(fixture *f, int sig) {
  boot(f, "{:store {:sync :always}}\n", true);
  create_session(f, "s1", "ops");
  enum { N = 100 };
  json_int_t ids[2 * N];
  size_t n = 0;
  const char *text = "WARNING replication lag on replica-3 above threshold";
  /* requests of 20: the daemon hashes their texts on a request thread (server/offload.c) */
  post_repeats(f, "ops", "nagios-bot", text, N, 20, 1, ids, &n);
  long long prepared = metric(f, "cephalon_ingest_prepared_events_total");
  if (prepared != N)
    fail_msg("cephalon_ingest_prepared_events_total %lld after %d events in requests of 20: the "
             "request thread should have hashed every one",
             prepared, N);
  restart(f, sig);
  /* the dedupe window may or may not survive the restart: queued or aggregated, counted */
  post_repeats(f, "ops", "nagios-bot", text, N, 20, -1, ids, &n);
  assert_int_equal(n, 2 * N);

  json_t *entries = drain(f);
  expect_accounted(entries, ids, 2 * N);
  json_decref(entries);
}

static void test_flood_across_sigterm_restart_counts_every_event_once(void **state) {
  flood_across_restart(*state, SIGTERM);
}

static void test_flood_across_kill_9_counts_every_acknowledged_event_once(void **state) {
  flood_across_restart(*state, SIGKILL);
}

/* Repeats that arrive while their entry is in a running turn are staged anew (DESIGN §5):
 * the next turn counts exactly the new ones, none of those the first turn carried. */
static void test_repeats_during_a_leased_turn_are_staged_anew(void **state) {
  fixture *f = *state;
  boot(f, "{}\n", false);
  create_session(f, "s1", "ops");
  enum { N = 50 };
  json_int_t first[N], second[N];
  size_t n1 = 0, n2 = 0;
  const char *text = "heartbeat missed from edge-router-7 in the last minute";
  post_repeats(f, "ops", "watchdog", text, N, 10, 1, first, &n1);

  json_t *t1 = lease(f, 5000);
  assert_non_null(t1);
  json_t *e1 = json_array();
  take_turn(t1, e1);
  expect_accounted(e1, first, N);
  assert_int_equal(json_array_size(e1), 1);

  post_repeats(f, "ops", "watchdog", text, N, 10, 0, second, &n2);
  complete(f, t1);

  json_t *t2 = lease(f, 5000);
  assert_non_null(t2);
  json_t *e2 = json_array();
  take_turn(t2, e2);
  complete(f, t2);
  expect_accounted(e2, second, N);
  assert_int_equal(json_array_size(e2), 1);
  const json_t *m = json_array_get(e2, 0);
  assert_int_equal(num(m, "count"), N);
  assert_string_equal(str(m, "fold"), "repeat");
  assert_int_equal(num(m, "event_id"), second[0]);
  assert_null(lease(f, EMPTY_WAIT_MS)); /* nothing left, nothing shown twice */
  json_decref(t1);
  json_decref(t2);
  json_decref(e1);
  json_decref(e2);
}

/* DESIGN §4 report turns over HTTP: a reporter's channel traffic waits for its report (a lease
 * in between gets nothing, /why says when), then one `report` turn carries every event counted,
 * and the next report comes no sooner than an interval later. */
static void test_report_turns_arrive_at_the_interval_with_every_event(void **state) {
  fixture *f = *state;
  boot(f, "{:store {:sync :none} :sessions {:janitor? false}}\n", false);
  json_decref(call(f, 200, "POST", "/v1/sessions",
                   "{\"id\":\"s1\",\"class\":\"operational\",\"subscribe\":[\"alerts\"],"
                   "\"report_interval_s\":3}"));
  int64_t t0 = cph_test_now_ms();
  json_int_t ids[40];
  size_t n_ids = 0;
  post_repeats(f, "alerts", "nagios", "disk usage on db-1 is above ninety percent", 30, 10, 1,
               ids, &n_ids);
  post_repeats(f, "alerts", "nagios", "certificate for api.example.com expires soon", 10, 10, 1,
               ids, &n_ids);
  json_t *why = call(f, 200, "GET", "/v1/sessions/s1/why", NULL);
  assert_string_equal(str(why, "reason"), "waiting_for_report");
  assert_true(num(why, "next_report_in_s") >= 1 && num(why, "next_report_in_s") <= 3);
  json_decref(why);
  assert_null(lease(f, 1000)); /* held: nothing runs before the report is due */
  json_t *turn = lease(f, 5000);
  assert_non_null(turn);
  assert_true(cph_test_now_ms() - t0 >= 2900); /* not before its interval */
  assert_string_equal(str(turn, "kind"), "report");
  const char *head = "report:\n#alerts: 40 messages, ";
  assert_true(strncmp(str(turn, "input"), head, strlen(head)) == 0);
  assert_non_null(strstr(str(turn, "input"), "\n- ×30 nagios: disk usage on db-1"));
  expect_accounted(json_object_get(turn, "staged"), ids, n_ids);
  complete(f, turn);
  int64_t done = cph_test_now_ms();
  json_decref(turn);
  /* the next one: only once something arrived, and an interval after the last */
  json_int_t more[1];
  size_t n_more = 0;
  post_repeats(f, "alerts", "nagios", "replication lag on db-2 above threshold", 1, 1, 1, more,
               &n_more);
  turn = lease(f, 6000);
  assert_non_null(turn);
  assert_true(cph_test_now_ms() - done >= 2900);
  assert_string_equal(str(turn, "kind"), "report");
  expect_accounted(json_object_get(turn, "staged"), more, n_more);
  complete(f, turn);
  json_decref(turn);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_similar_messages_from_people_each_reach_the_turn, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_repeated_direct_message_is_one_entry_counting_both,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_alert_flood_folds_into_an_entry_counting_every_event,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_bulk_alerts_differing_in_a_number_never_fold_together,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_queue_cap_folds_into_overflow_entry_and_drops_nothing,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_flood_across_sigterm_restart_counts_every_event_once,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_flood_across_kill_9_counts_every_acknowledged_event_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_repeats_during_a_leased_turn_are_staged_anew, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_report_turns_arrive_at_the_interval_with_every_event,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
