/* The PACT context over HTTP and through cephalonctl (DESIGN §6, §9): a reminder with a TTL
 * expires as turns complete, nodes are selected and deleted, bad coordinates and selectors get
 * 400s naming the field, seals snapshot the rendered context, and `context step` is a dry run. */
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

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", "{:sessions {:janitor? false}}\n");
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

static json_t *call(fixture *f, int *status, const char *method, const char *path,
                    const char *body) {
  cph_test_response r = cph_test_http(f->d.port, method, path,
                                      body ? "Content-Type: application/json\r\n" : NULL, body);
  *status = r.status;
  json_t *j = r.body_len ? json_loads(r.body, 0, NULL) : NULL;
  cph_test_response_free(&r);
  return j;
}

static json_t *ok(fixture *f, const char *method, const char *path, const char *body) {
  int st;
  json_t *j = call(f, &st, method, path, body);
  if (st != 200) {
    char *dump = j ? json_dumps(j, 0) : NULL;
    fail_msg("%s %s: %d %s", method, path, st, dump ? dump : "");
  }
  return j;
}

/* One inbox turn: post, lease, complete with a reply. */
static void run_turn(fixture *f, const char *body, const char *reply) {
  char json[512];
  snprintf(json, sizeof json, "{\"events\":[{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"%s\"}]}",
           body);
  json_decref(ok(f, "POST", "/v1/events", json));
  json_t *l = ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
  json_t *t = json_object_get(l, "turn");
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(t, "id")));
  snprintf(json, sizeof json,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"%s\"}}",
           json_string_value(json_object_get(t, "lease")), reply);
  json_decref(ok(f, "POST", path, json));
  json_decref(l);
}

/* The nodes of the session's context matching sel (NULL = all). */
static json_t *nodes(fixture *f, const char *sel, json_int_t *episode) {
  char path[256] = "/v1/sessions/s1/context";
  if (sel) { /* percent-encode what a query string cannot carry as is */
    char *o = path + strlen(path);
    o += sprintf(o, "?select=");
    for (const char *p = sel; *p; p++)
      o += strchr(" ,{}=", *p) ? sprintf(o, "%%%02X", (unsigned char)*p) : sprintf(o, "%c", *p);
  }
  json_t *j = ok(f, "GET", path, NULL);
  if (episode)
    *episode = json_integer_value(json_object_get(j, "episode"));
  json_t *n = json_incref(json_object_get(j, "nodes"));
  json_decref(j);
  return n;
}

static bool has_content(json_t *list, const char *content) {
  size_t i;
  json_t *n;
  json_array_foreach(list, i, n) if (strcmp(json_string_value(json_object_get(n, "content")), content) == 0) return true;
  return false;
}

static void test_reminder_with_ttl_expires_as_turns_complete(void **state) {
  fixture *f = *state;
  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}"));
  json_t *node = ok(f, "POST", "/v1/sessions/s1/context",
                    "{\"at\":\"d0, 1, 0\",\"content\":\"remind: standup at 10\",\"ttl\":2,"
                    "\"key\":\"standup\",\"tags\":[\"reminder\"]}");
  assert_string_equal(json_string_value(json_object_get(node, "at")), "d0, 1, 0");
  assert_int_equal(json_integer_value(json_object_get(node, "ttl")), 2);
  assert_int_equal(json_integer_value(json_object_get(node, "created_at_episode")), 0);
  json_decref(node);

  json_int_t episode;
  json_t *n = nodes(f, NULL, &episode);
  assert_int_equal(episode, 0);
  assert_true(has_content(n, "remind: standup at 10"));
  json_decref(n);

  run_turn(f, "hello", "hi ann");
  n = nodes(f, NULL, &episode);
  assert_int_equal(episode, 1);
  assert_true(has_content(n, "remind: standup at 10")); /* age 1 < ttl 2 */
  assert_true(has_content(n, "hello")); /* the turn's input, a user core (no "inbox:") */
  assert_true(has_content(n, "hi ann"));                /* its reply, an assistant core */
  json_decref(n);

  run_turn(f, "still there?", "yes");
  n = nodes(f, NULL, &episode);
  assert_int_equal(episode, 2);
  assert_false(has_content(n, "remind: standup at 10")); /* age 2 >= ttl 2: expired */
  assert_true(has_content(n, "hi ann"));                  /* history stays */
  json_decref(n);
}

static void test_selectors_delete_and_errors_name_the_field(void **state) {
  fixture *f = *state;
  json_decref(ok(f, "POST", "/v1/sessions", "{\"id\":\"s1\",\"class\":\"interactive\"}"));
  json_t *a = ok(f, "POST", "/v1/sessions/s1/context",
                 "{\"at\":\"d-1, 0, 0\",\"content\":\"you are terse\",\"key\":\"persona\"}");
  json_t *b = ok(f, "POST", "/v1/sessions/s1/context",
                 "{\"at\":\"d0, 2, 1\",\"content\":\"a note\",\"tags\":[\"note\"]}");
  json_int_t b_id = json_integer_value(json_object_get(b, "id"));
  json_decref(a);
  json_decref(b);

  json_t *n = nodes(f, "{key=persona}", NULL);
  assert_int_equal(json_array_size(n), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(n, 0), "content")), "you are terse");
  json_decref(n);
  n = nodes(f, "d0, 1..3, *", NULL);
  assert_int_equal(json_array_size(n), 1);
  json_decref(n);
  n = nodes(f, "{tag=note}", NULL);
  assert_int_equal(json_array_size(n), 1);
  json_decref(n);

  int st;
  json_t *err = call(f, &st, "POST", "/v1/sessions/s1/context", "{\"at\":\"x0, 0, 0\",\"content\":\"bad\"}");
  assert_int_equal(st, 400);
  assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "field")), "at");
  json_decref(err);
  err = call(f, &st, "GET", "/v1/sessions/s1/context?select=d1..%2C", NULL);
  assert_int_equal(st, 400);
  assert_string_equal(json_string_value(json_object_get(json_object_get(err, "error"), "field")), "select");
  json_decref(err);

  /* the same key again updates the node in place: same id, new content */
  json_t *again = ok(f, "POST", "/v1/sessions/s1/context",
                     "{\"at\":\"d-1, 0, 0\",\"content\":\"you are verbose\",\"key\":\"persona\"}");
  n = nodes(f, "{key=persona}", NULL);
  assert_int_equal(json_array_size(n), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(n, 0), "content")),
                      "you are verbose");
  assert_int_equal(json_integer_value(json_object_get(again, "id")),
                   json_integer_value(json_object_get(json_array_get(n, 0), "id")));
  json_decref(n);
  json_decref(again);

  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/s1/context/%lld", (long long)b_id);
  json_decref(ok(f, "DELETE", path, NULL));
  json_t *gone = call(f, &st, "DELETE", path, NULL);
  assert_int_equal(st, 404);
  json_decref(gone);
  n = nodes(f, "{tag=note}", NULL);
  assert_int_equal(json_array_size(n), 0);
  json_decref(n);
}

static void test_seal_snapshots_and_step_is_a_dry_run(void **state) {
  fixture *f = *state;
  json_decref(ok(f, "POST", "/v1/sessions", "{\"id\":\"s1\",\"class\":\"interactive\"}"));
  json_decref(ok(f, "POST", "/v1/sessions/s1/context",
                 "{\"at\":\"d0, 1, 0\",\"content\":\"short-lived\",\"ttl\":1}"));
  json_t *seal = ok(f, "POST", "/v1/sessions/s1/seal", "{\"trigger\":\"handoff\"}");
  assert_true(json_integer_value(json_object_get(seal, "seal_id")) >= 1);
  json_decref(seal);
  json_t *seals = ok(f, "GET", "/v1/sessions/s1/seals", NULL);
  json_t *one = json_array_get(json_object_get(seals, "seals"), 0);
  assert_string_equal(json_string_value(json_object_get(one, "trigger")), "handoff");
  json_t *msg = json_array_get(json_object_get(one, "messages"), 0);
  assert_string_equal(json_string_value(json_object_get(msg, "content")), "short-lived");
  assert_string_equal(json_string_value(json_object_get(msg, "coord")), "d0, 1, 0");
  json_decref(seals);

  json_t *steps = ok(f, "GET", "/v1/sessions/s1/context/step?episodes=2", NULL);
  json_t *first = json_array_get(json_object_get(steps, "steps"), 0);
  assert_int_equal(json_integer_value(json_object_get(first, "episode")), 1);
  assert_int_equal(json_array_size(json_object_get(first, "nodes")), 0); /* ttl 1: gone at 1 */
  json_decref(steps);
  json_int_t episode;
  json_t *n = nodes(f, NULL, &episode); /* ...but nothing changed */
  assert_int_equal(episode, 0);
  assert_true(has_content(n, "short-lived"));
  json_decref(n);

  /* the same through cephalonctl */
  char *exe, url[64];
  assert_true(asprintf(&exe, "%s/cephalonctl", getenv("CPH_BIN_DIR")) > 0);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", f->d.port);
  const char *show[] = {exe, "--url", url, "context", "show", "s1", NULL};
  char *out, *err;
  assert_int_equal(cph_test_run(show, &out, &err), 0);
  assert_non_null(strstr(out, "s1 at episode 0"));
  assert_non_null(strstr(out, "short-lived"));
  free(out);
  free(err);
  const char *step[] = {exe, "--url", url, "context", "step", "s1", "--episodes", "1", NULL};
  assert_int_equal(cph_test_run(step, &out, &err), 0);
  assert_non_null(strstr(out, "episode 1:"));
  assert_null(strstr(out, "short-lived"));
  free(out);
  free(err);
  free(exe);
}

/* The message of `list` with this role and content, or NULL. */
static json_t *message(json_t *list, const char *role, const char *content) {
  size_t i;
  json_t *m;
  json_array_foreach(list, i, m) {
    if (strcmp(json_string_value(json_object_get(m, "role")), role) == 0 &&
        strcmp(json_string_value(json_object_get(m, "content")), content) == 0)
      return m;
  }
  return NULL;
}

static const char *name_of(json_t *m) { return json_string_value(json_object_get(m, "name")); }

/* Completes a leased turn (a JSON turn object) with a reply. */
static void complete_turn(fixture *f, json_t *t, const char *reply) {
  char path[64], json[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(t, "id")));
  snprintf(json, sizeof json,
           "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"%s\"}}",
           json_string_value(json_object_get(t, "lease")), reply);
  json_decref(ok(f, "POST", path, json));
}

/* DESIGN §6 channel views, over HTTP in JSON and msgpack: who said what. Each user message
 * carries its sender as `name`; alice and bob both speaking, each text starts "sender: ". */
static void test_turn_messages_name_their_senders_in_json_and_msgpack(void **state) {
  fixture *f = *state;
  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"ops\"]}"));
  json_decref(ok(f, "POST", "/v1/events",
                 "{\"events\":[{\"channel\":\"ops\",\"sender\":\"alice\","
                 "\"body\":\"restart the web service on host alpha\"},"
                 "{\"channel\":\"ops\",\"sender\":\"bob\",\"body\":\"what time is standup?\"}]}"));
  json_t *l = ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
  json_t *t = json_object_get(l, "turn");
  json_t *msgs = json_object_get(t, "messages");
  json_t *a = message(msgs, "user", "alice: restart the web service on host alpha");
  json_t *b = message(msgs, "user", "bob: what time is standup?");
  assert_non_null(a);
  assert_non_null(b);
  assert_string_equal(name_of(a), "alice");
  assert_string_equal(name_of(b), "bob");
  complete_turn(f, t, "restarted; standup is at 10");
  json_decref(l);

  /* the next turn in msgpack: the same fields, the history named too */
  json_decref(ok(f, "POST", "/v1/events",
                 "{\"events\":[{\"channel\":\"ops\",\"sender\":\"alice\",\"body\":\"thanks\"}]}"));
  cph_test_response r =
      cph_test_http(f->d.port, "POST", "/v1/turns/lease",
                    "Content-Type: application/json\r\nAccept: application/msgpack\r\n",
                    "{\"worker\":\"w\",\"wait_ms\":5000}");
  assert_int_equal(r.status, 200);
  l = cph_test_msgpack_json(r.body, r.body_len);
  cph_test_response_free(&r);
  assert_non_null(l);
  t = json_object_get(l, "turn");
  msgs = json_object_get(t, "messages");
  assert_string_equal(name_of(message(msgs, "user", "alice: thanks")), "alice");
  assert_string_equal(name_of(message(msgs, "user", "bob: what time is standup?")), "bob");
  json_t *own = message(msgs, "assistant", "restarted; standup is at 10");
  assert_non_null(own);
  assert_null(json_object_get(own, "name")); /* only user messages are named */
  complete_turn(f, t, "you're welcome");
  json_decref(l);
}

/* True when some entry of list has a "content" starting with prefix. */
static bool any_content_starts(json_t *list, const char *prefix) {
  size_t i;
  json_t *n;
  json_array_foreach(list, i, n) {
    if (strncmp(json_string_value(json_object_get(n, "content")), prefix, strlen(prefix)) == 0)
      return true;
  }
  return false;
}

/* Issue 14: the turn's `input` keeps the wire's "inbox:" marker, but the user core completion
 * leaves in the session's tree — and so its seals and the messages of later turns — holds
 * the words alone; an autonomy tick's core stays "autonomy_tick". */
static void test_inbox_marker_stays_on_the_wire_and_out_of_the_tree(void **state) {
  fixture *f = *state;
  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"ops\"]}"));
  json_decref(ok(f, "POST", "/v1/events",
                 "{\"events\":[{\"channel\":\"ops\",\"sender\":\"alice\","
                 "\"body\":\"restart the web service on host alpha\"},"
                 "{\"channel\":\"ops\",\"sender\":\"bob\",\"body\":\"what time is standup?\"}]}"));
  json_t *l = ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
  json_t *t = json_object_get(l, "turn");
  assert_string_equal(json_string_value(json_object_get(t, "input")),
                      "inbox:restart the web service on host alpha\nwhat time is standup?");
  json_t *msgs = json_object_get(t, "messages");
  assert_string_equal(name_of(message(msgs, "user", "alice: restart the web service on host alpha")),
                      "alice");
  assert_string_equal(name_of(message(msgs, "user", "bob: what time is standup?")), "bob");
  complete_turn(f, t, "restarted; standup is at 10");
  json_decref(l);

  const char *words = "restart the web service on host alpha\nwhat time is standup?";
  json_t *n = nodes(f, NULL, NULL);
  assert_true(has_content(n, words));
  assert_true(has_content(n, "restarted; standup is at 10"));
  assert_false(any_content_starts(n, "inbox:"));
  json_decref(n);
  json_decref(ok(f, "POST", "/v1/sessions/s1/seal", "{\"trigger\":\"check\"}"));
  json_t *seals = ok(f, "GET", "/v1/sessions/s1/seals", NULL);
  json_t *sealed = json_object_get(json_array_get(json_object_get(seals, "seals"), 0), "messages");
  assert_non_null(message(sealed, "user", words));
  assert_false(any_content_starts(sealed, "inbox:"));
  json_decref(seals);

  /* the next turn, an autonomy tick, renders the tree whole: the words, no marker */
  json_decref(ok(f, "PUT", "/v1/sessions/s1", "{\"autonomy_interval_s\":1}"));
  l = ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
  t = json_object_get(l, "turn");
  assert_string_equal(json_string_value(json_object_get(t, "kind")), "autonomy_tick");
  msgs = json_object_get(t, "messages");
  assert_non_null(message(msgs, "user", words));
  assert_non_null(message(msgs, "assistant", "restarted; standup is at 10"));
  assert_false(any_content_starts(msgs, "inbox:"));
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  assert_string_equal(json_string_value(json_object_get(last, "content")), "autonomy_tick");
  complete_turn(f, t, "all quiet");
  json_decref(l);
  json_decref(ok(f, "PUT", "/v1/sessions/s1", "{\"autonomy_interval_s\":null}"));
  n = nodes(f, NULL, NULL);
  assert_true(has_content(n, "autonomy_tick")); /* a tick's core keeps its name */
  assert_true(has_content(n, words));
  json_decref(n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reminder_with_ttl_expires_as_turns_complete, setup, teardown),
      cmocka_unit_test_setup_teardown(test_selectors_delete_and_errors_name_the_field, setup, teardown),
      cmocka_unit_test_setup_teardown(test_seal_snapshots_and_step_is_a_dry_run, setup, teardown),
      cmocka_unit_test_setup_teardown(test_turn_messages_name_their_senders_in_json_and_msgpack,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_inbox_marker_stays_on_the_wire_and_out_of_the_tree,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
