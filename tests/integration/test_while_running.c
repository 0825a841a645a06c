/* Arrivals during a running turn (DESIGN §4 `while_running`), end to end: the real cephalond
 * over HTTP on loopback. For each mode, a message posted while a turn is leased ends where the
 * mode says — the next turn (enqueue), the running turn through take (merge), the next turn
 * together with the interrupted turn's input (interrupt), a new lease of all input after the
 * old one was superseded (restart), nowhere with reason session_busy (reject) — and every
 * event that reached the session is carried by exactly one completed turn. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

#define EMPTY_WAIT_MS 700

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int setup(void **state) {
  *state = calloc(1, sizeof(fixture));
  return *state ? 0 : -1;
}

static int teardown(void **state) {
  fixture *f = *state;
  int rc = cph_test_daemon_stop(&f->d);
  if (f->policy) {
    unlink(f->policy);
    free(f->policy);
  }
  free(f);
  return rc == 0 ? 0 : -1;
}

/* Starts the daemon; class_mode is the interactive class's default (:enqueue if NULL). */
static void boot(fixture *f, const char *class_mode) {
  char policy[512];
  snprintf(policy, sizeof policy,
           "{:store {:sync :none}\n"
           " :sessions {:janitor? false :while-running {:interactive :%s}}}\n",
           class_mode ? class_mode : "enqueue");
  f->policy = cph_test_write_tmpfile(".edn", policy);
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, NULL, NULL), 0);
}

/* One request; fails the test unless it answers `want`. Returns the parsed answer. */
static json_t *call(fixture *f, int want, const char *method, const char *path,
                    const char *body) {
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

static void fail_json(const char *what, const json_t *j) {
  char *dump = json_dumps(j, JSON_COMPACT);
  fail_msg("%s: %s", what, dump ? dump : "(null)");
}

/* A session subscribed to "general"; mode NULL: its class's default. */
static void create_session(fixture *f, const char *id, const char *mode) {
  char body[256];
  if (mode)
    snprintf(body, sizeof body,
             "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"general\"],"
             "\"while_running\":\"%s\"}",
             id, mode);
  else
    snprintf(body, sizeof body,
             "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}", id);
  json_t *s = call(f, 200, "POST", "/v1/sessions", body);
  if (mode && strcmp(cph_hc_str(s, "while_running"), mode) != 0)
    fail_json("session create: while_running", s);
  json_decref(s);
}

/* Posts one event (a direct message to `session`, or on "general" when session is NULL);
 * returns its result (new reference). */
static json_t *post(fixture *f, const char *session, const char *body) {
  char req[512];
  if (session)
    snprintf(req, sizeof req,
             "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", session,
             body);
  else
    snprintf(req, sizeof req,
             "{\"events\":[{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"%s\"}]}", body);
  json_t *ans = call(f, 200, "POST", "/v1/events", req);
  json_t *res = json_incref(json_array_get(json_object_get(ans, "results"), 0));
  json_decref(ans);
  return res;
}

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

/* POST /v1/turns/{id}/<what> with the turn's lease and `extra` members; answers `want`. */
static json_t *turn_call(fixture *f, const json_t *turn, const char *what, const char *extra,
                         int want) {
  char path[96], body[512];
  snprintf(path, sizeof path, "/v1/turns/%lld/%s", (long long)cph_hc_int(turn, "id"), what);
  snprintf(body, sizeof body, "{\"lease\":\"%s\"%s%s}", cph_hc_str(turn, "lease"),
           extra ? "," : "", extra ? extra : "");
  return call(f, want, "POST", path, body);
}

static void complete(fixture *f, const json_t *turn, const char *extra) {
  char members[384];
  snprintf(members, sizeof members, "\"cost\":{\"tokens\":10,\"tool_calls\":0}%s%s",
           extra ? "," : "", extra ? extra : "");
  json_decref(turn_call(f, turn, "complete", members, 200));
}

/* The bodies of a turn's staged entries (or a take's taken), joined by '|'. */
static void bodies(const json_t *entries, char *out, size_t size) {
  size_t used = 0, i;
  const json_t *m;
  out[0] = '\0';
  json_array_foreach(entries, i, m)
    used += (size_t)snprintf(out + used, used < size ? size - used : 0, "%s%s", i ? "|" : "",
                             cph_hc_str(m, "body"));
}

static void expect_bodies(const json_t *entries, const char *want, const json_t *context) {
  char got[1024];
  bodies(entries, got, sizeof got);
  if (strcmp(got, want) != 0) {
    char what[1200];
    snprintf(what, sizeof what, "entries \"%s\", want \"%s\"", got, want);
    fail_json(what, context);
  }
}

/* Leases s1's next turn (it must come) and checks its staged bodies. */
static json_t *lease_expect(fixture *f, const char *want_bodies) {
  json_t *t = lease(f, 5000);
  if (!t)
    fail_msg("no turn came; want one carrying \"%s\"", want_bodies);
  expect_bodies(json_object_get(t, "staged"), want_bodies, t);
  return t;
}

static void expect_no_turn(fixture *f) {
  json_t *t = lease(f, EMPTY_WAIT_MS);
  if (t)
    fail_json("want no turn left", t);
}

/* ---------------------------------------------------------------- the modes */

static void test_enqueue_stages_arrivals_for_the_next_turn(void **state) {
  fixture *f = *state;
  boot(f, NULL);
  create_session(f, "s1", NULL); /* the class default: enqueue */
  json_decref(post(f, NULL, "first question"));
  json_t *t1 = lease_expect(f, "first question");
  if (json_object_get(t1, "while_running")) /* enqueue turns look as they always did */
    fail_json("an enqueue turn names while_running", t1);
  json_t *res = post(f, NULL, "second thought");
  if (strcmp(cph_hc_str(res, "status"), "queued") != 0)
    fail_json("arrival during the turn", res);
  json_decref(res);
  json_t *hb = turn_call(f, t1, "heartbeat", NULL, 200);
  if (json_object_get(hb, "arrived") || json_object_get(hb, "interrupt"))
    fail_json("an enqueue heartbeat says more than it did", hb);
  json_decref(hb);
  json_decref(turn_call(f, t1, "take", NULL, 409)); /* take is merge's */
  complete(f, t1, NULL);
  json_t *t2 = lease_expect(f, "second thought");
  complete(f, t2, NULL);
  expect_no_turn(f);
  json_decref(t1);
  json_decref(t2);
}

static void test_merge_takes_arrivals_into_the_running_turn(void **state) {
  fixture *f = *state;
  boot(f, NULL);
  create_session(f, "s1", "merge");
  json_decref(post(f, NULL, "restart host alpha"));
  json_t *t1 = lease_expect(f, "restart host alpha");
  if (strcmp(cph_hc_str(t1, "while_running"), "merge") != 0)
    fail_json("a merge turn says its mode", t1);
  json_t *hb = turn_call(f, t1, "heartbeat", NULL, 200);
  if (cph_hc_int(hb, "arrived") != 0 || !json_object_get(hb, "arrived"))
    fail_json("heartbeat before any arrival", hb);
  json_decref(hb);
  json_decref(post(f, NULL, "no, the staging cluster"));
  json_decref(post(f, "s1", "and beta too"));
  /* a pass stages them: the heartbeat counts them pending or staged */
  hb = turn_call(f, t1, "heartbeat", NULL, 200);
  if (cph_hc_int(hb, "arrived") != 2)
    fail_json("heartbeat after two arrivals: want arrived 2", hb);
  json_decref(hb);
  json_t *taken = turn_call(f, t1, "take", NULL, 200);
  expect_bodies(json_object_get(taken, "taken"), "no, the staging cluster|and beta too", taken);
  json_int_t taken_id = cph_hc_int(json_array_get(json_object_get(taken, "taken"), 0), "id");
  json_decref(taken);
  hb = turn_call(f, t1, "heartbeat", NULL, 200);
  if (cph_hc_int(hb, "arrived") != 0)
    fail_json("heartbeat after the take: want arrived 0", hb);
  json_decref(hb);
  taken = turn_call(f, t1, "take", NULL, 200); /* nothing new: an empty list */
  if (json_array_size(json_object_get(taken, "taken")) != 0)
    fail_json("a second take", taken);
  json_decref(taken);
  complete(f, t1, "\"reply\":{\"body\":\"restarted the staging cluster and beta\"}");
  expect_no_turn(f); /* the taken entries were consumed by the turn that took them */
  /* the reply lists them as its sources: they were the turn's input */
  json_t *rep = call(f, 200, "GET", "/v1/replies?after=0", NULL);
  json_t *src = json_object_get(json_array_get(json_object_get(rep, "replies"), 0),
                                "source_inbox_ids");
  bool found = false;
  size_t i;
  json_t *v;
  json_array_foreach(src, i, v) found |= json_integer_value(v) == taken_id;
  if (json_array_size(src) != 3 || !found)
    fail_json("the reply's sources: want the leased and both taken entries", rep);
  json_decref(rep);
  json_decref(t1);
}

static void test_interrupt_stops_the_turn_and_the_next_carries_old_and_new(void **state) {
  fixture *f = *state;
  boot(f, NULL);
  create_session(f, "s1", "interrupt");
  json_decref(post(f, NULL, "restart host alpha"));
  json_t *t1 = lease_expect(f, "restart host alpha");
  json_t *hb = turn_call(f, t1, "heartbeat", NULL, 200);
  if (json_object_get(hb, "interrupt"))
    fail_json("interrupt before anything arrived", hb);
  json_decref(hb);
  /* not asked: an interrupted completion is refused and changes nothing */
  json_decref(turn_call(f, t1, "complete",
                        "\"cost\":{\"tokens\":1,\"tool_calls\":0},\"interrupted\":true", 409));
  json_decref(post(f, NULL, "no, the staging cluster"));
  hb = turn_call(f, t1, "heartbeat", NULL, 200);
  if (json_object_get(hb, "interrupt") != json_true() || cph_hc_int(hb, "arrived") != 1)
    fail_json("heartbeat after an arrival: want interrupt true, arrived 1", hb);
  json_decref(hb);
  complete(f, t1,
           "\"interrupted\":true,\"reply\":{\"body\":\"Interrupted. Done so far: "
           "restart_host alpha -> restarted\"}");
  /* the next turn carries the old input and the new together */
  json_t *t2 = lease_expect(f, "restart host alpha|no, the staging cluster");
  if (cph_hc_int(t2, "attempts") != 1)
    fail_json("an interrupted turn is not a failed attempt", t2);
  complete(f, t2, NULL);
  expect_no_turn(f);
  json_decref(t1);
  json_decref(t2);
}

static void test_restart_supersedes_the_lease_and_its_stale_completion_changes_nothing(
    void **state) {
  fixture *f = *state;
  boot(f, NULL);
  create_session(f, "s1", "restart");
  json_decref(post(f, NULL, "restart host alpha"));
  json_t *t1 = lease_expect(f, "restart host alpha");
  json_t *before = call(f, 200, "GET", "/v1/sessions/s1", NULL);
  json_t *res = post(f, NULL, "no, the staging cluster");
  if (strcmp(cph_hc_str(res, "status"), "queued") != 0)
    fail_json("an arrival under restart is queued", res);
  json_decref(res);
  /* the old lease is gone: heartbeat and completion answer 409 superseded */
  json_t *e = turn_call(f, t1, "heartbeat", NULL, 409);
  if (strcmp(cph_hc_str(json_object_get(e, "error"), "code"), "superseded") != 0)
    fail_json("heartbeat of a superseded lease", e);
  json_decref(e);
  e = turn_call(f, t1, "complete",
                "\"cost\":{\"tokens\":5,\"tool_calls\":1},\"reply\":{\"body\":\"stale\"},"
                "\"memories\":[{\"text\":\"stale memory\"}]",
                409);
  if (strcmp(cph_hc_str(json_object_get(e, "error"), "code"), "superseded") != 0)
    fail_json("completion of a superseded lease", e);
  json_decref(e);
  /* ... and changed nothing: no reply, the same episode */
  json_t *rep = call(f, 200, "GET", "/v1/replies?after=0", NULL);
  if (json_array_size(json_object_get(rep, "replies")) != 0)
    fail_json("a stale completion left a reply", rep);
  json_decref(rep);
  json_t *after = call(f, 200, "GET", "/v1/sessions/s1", NULL);
  if (cph_hc_int(after, "episode") != cph_hc_int(before, "episode"))
    fail_json("a stale completion moved the episode", after);
  json_decref(before);
  json_decref(after);
  /* the turn is leased again with all input */
  json_t *t2 = lease_expect(f, "restart host alpha|no, the staging cluster");
  if (cph_hc_int(t2, "id") == cph_hc_int(t1, "id"))
    fail_json("a new lease is a new turn", t2);
  complete(f, t2, NULL);
  expect_no_turn(f);
  json_decref(t1);
  json_decref(t2);
}

static void test_reject_answers_each_event_with_session_busy(void **state) {
  fixture *f = *state;
  boot(f, NULL);
  create_session(f, "s1", "reject");
  create_session(f, "s2", "enqueue");
  json_decref(post(f, "s1", "restart host alpha"));
  json_t *t1 = lease_expect(f, "restart host alpha");
  /* a direct message: refused, stored (it has an id), reaching nobody */
  json_t *res = post(f, "s1", "no, the staging cluster");
  const json_t *busy = json_array_get(json_object_get(res, "busy"), 0);
  if (strcmp(cph_hc_str(res, "status"), "rejected") != 0 ||
      strcmp(cph_hc_str(res, "reason"), "session_busy") != 0 || cph_hc_int(res, "id") <= 0 ||
      json_array_size(json_object_get(res, "sessions")) != 0 ||
      strcmp(cph_hc_str(busy, "session"), "s1") != 0 ||
      strcmp(cph_hc_str(busy, "reason"), "session_busy") != 0)
    fail_json("a direct message to a busy rejecting session", res);
  char path[64];
  snprintf(path, sizeof path, "/v1/events/%lld", (long long)cph_hc_int(res, "id"));
  json_decref(call(f, 200, "GET", path, NULL)); /* stored all the same */
  json_decref(res);
  /* on the channel: reaches s2, refused by s1 — queued, with s1 in busy */
  res = post(f, NULL, "is anyone restarting things?");
  busy = json_array_get(json_object_get(res, "busy"), 0);
  if (strcmp(cph_hc_str(res, "status"), "queued") != 0 ||
      json_array_size(json_object_get(res, "sessions")) != 1 ||
      strcmp(json_string_value(json_array_get(json_object_get(res, "sessions"), 0)), "s2") ||
      strcmp(cph_hc_str(busy, "session"), "s1") != 0 ||
      strcmp(cph_hc_str(busy, "reason"), "session_busy") != 0)
    fail_json("a channel message reaching s2, refused by busy s1", res);
  json_decref(res);
  complete(f, t1, NULL);
  /* s2's turn carries the channel message; s1 gets nothing of what it refused */
  json_t *t2 = lease_expect(f, "is anyone restarting things?");
  if (strcmp(cph_hc_str(t2, "session"), "s2") != 0)
    fail_json("want s2's turn", t2);
  complete(f, t2, NULL);
  expect_no_turn(f);
  /* not busy any more: accepted — the sender's resend repeats a stored text, so it may be
   * answered aggregated (DESIGN §5), reaching s1 all the same */
  res = post(f, "s1", "no, the staging cluster");
  const char *st = cph_hc_str(res, "status");
  if ((strcmp(st, "queued") != 0 && strcmp(st, "aggregated") != 0) ||
      json_array_size(json_object_get(res, "sessions")) != 1 || json_object_get(res, "busy"))
    fail_json("a message to an idle rejecting session", res);
  json_decref(res);
  json_t *t3 = lease_expect(f, "no, the staging cluster");
  complete(f, t3, NULL);
  json_decref(t1);
  json_decref(t2);
  json_decref(t3);
}

/* ---------------------------------------------------------------- the setting */

static void test_while_running_follows_the_class_until_set_and_is_validated(void **state) {
  fixture *f = *state;
  boot(f, "reject");
  create_session(f, "s1", NULL);
  json_t *s = call(f, 200, "GET", "/v1/sessions/s1", NULL);
  if (strcmp(cph_hc_str(s, "while_running"), "reject") != 0 ||
      json_object_get(s, "while_running_from_class") != json_true())
    fail_json("a session without its own mode shows its class's", s);
  json_decref(s);
  s = call(f, 200, "PUT", "/v1/sessions/s1", "{\"while_running\":\"merge\"}");
  if (strcmp(cph_hc_str(s, "while_running"), "merge") != 0 ||
      json_object_get(s, "while_running_from_class") != json_false())
    fail_json("PUT while_running merge", s);
  json_decref(s);
  s = call(f, 200, "GET", "/v1/sessions?limit=10", NULL);
  if (strcmp(cph_hc_str(json_array_get(json_object_get(s, "sessions"), 0), "while_running"),
             "merge") != 0)
    fail_json("the list shows it", s);
  json_decref(s);
  s = call(f, 200, "PUT", "/v1/sessions/s1", "{\"while_running\":null}");
  if (strcmp(cph_hc_str(s, "while_running"), "reject") != 0 ||
      json_object_get(s, "while_running_from_class") != json_true())
    fail_json("PUT while_running null: back to the class", s);
  json_decref(s);
  json_t *e = call(f, 400, "PUT", "/v1/sessions/s1", "{\"while_running\":\"debounce\"}");
  if (strcmp(cph_hc_str(json_object_get(e, "error"), "field"), "while_running") != 0 ||
      !strstr(cph_hc_str(json_object_get(e, "error"), "message"), "merge"))
    fail_json("an unknown mode", e);
  json_decref(e);
  e = call(f, 400, "POST", "/v1/sessions",
           "{\"id\":\"s2\",\"class\":\"interactive\",\"while_running\":7}");
  json_decref(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_enqueue_stages_arrivals_for_the_next_turn, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_merge_takes_arrivals_into_the_running_turn, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_interrupt_stops_the_turn_and_the_next_carries_old_and_new, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_restart_supersedes_the_lease_and_its_stale_completion_changes_nothing, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_reject_answers_each_event_with_session_busy, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_while_running_follows_the_class_until_set_and_is_validated, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
