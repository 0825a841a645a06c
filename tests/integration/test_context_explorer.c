/* The context explorer's API against the real daemon (issue #18 item 2): each leased turn's
 * context is kept, bounded by :context :keep-turns per session; the diff between two kept turns
 * names the nodes, messages and section items that entered, left or changed, with the reason
 * (a TTL that expired, a cadence, the window budget, a consumed obligation); parts a lease left
 * out are named, not reported as gone; errors name the field; `cephalonctl context diff` prints
 * the same; GET /v1/sessions?prefix= (the console's search) finds ids by prefix; and a lease's
 * kept context can be read as soon as the lease is answered, with clients leasing at once (the
 * daemon works it out beside the loop: core/turnlog.h, "Deferred keeping"). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int start(void **state, const char *policy) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", policy);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    return -1;
  *state = f;
  return 0;
}

static int setup(void **state) { return start(state, "{:sessions {:janitor? false}}\n"); }

static int setup_keep3(void **state) {
  return start(state, "{:sessions {:janitor? false} :context {:keep-turns 3}}\n");
}

/* Budgets that never bind: 8 clients x 20 turns within a few seconds. */
static int setup_busy(void **state) {
  return start(state, "{:sessions {:janitor? false}\n"
                      " :scheduler {:lanes {:interactive {:turns 100000 :tool-calls 100000}}}}\n");
}

static int setup_keep0(void **state) {
  return start(state, "{:sessions {:janitor? false} :context {:keep-turns 0}}\n");
}

/* The daemon must exit 0 on SIGTERM: under CPH_DAEMON_WRAPPER=valgrind a memory error or a
 * leak makes it exit 99 and fails the test. */
static int teardown(void **state) {
  fixture *f = *state;
  int rc = cph_test_daemon_stop(&f->d);
  if (rc != 0)
    print_error("cephalond exited with status %d\n", rc);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return rc == 0 ? 0 : -1;
}

static json_t *call(fixture *f, int *status, const char *method, const char *path,
                    const char *body) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  *status = r.status;
  json_t *j = cph_test_json(&r);
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

static void session(fixture *f, const char *id, const char *extra) {
  char body[256];
  snprintf(body, sizeof body,
           "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"%s-chan\"]%s}", id, id,
           extra ? extra : "");
  json_decref(ok(f, "POST", "/v1/sessions", body));
}

static void node(fixture *f, const char *sid, const char *json) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/context", sid);
  json_decref(ok(f, "POST", path, json));
}

/* One inbox turn of session sid: post body to its channel, lease (with `include` when given),
 * complete with a reply. Returns the turn id. */
static json_int_t turn_with(fixture *f, const char *sid, const char *body, const char *include) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"events\":[{\"channel\":\"%s-chan\",\"sender\":\"ann\",\"body\":\"%s\"}]}", sid,
           body);
  json_decref(ok(f, "POST", "/v1/events", json));
  snprintf(json, sizeof json, "{\"worker\":\"w\",\"wait_ms\":5000%s%s}",
           include ? ",\"include\":" : "", include ? include : "");
  json_t *l = ok(f, "POST", "/v1/turns/lease", json);
  json_t *t = json_object_get(l, "turn");
  assert_string_equal(json_string_value(json_object_get(t, "session")), sid);
  json_int_t id = json_integer_value(json_object_get(t, "id"));
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)id);
  snprintf(
      json, sizeof json,
      "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"re: %s\"}}",
      json_string_value(json_object_get(t, "lease")), body);
  json_decref(ok(f, "POST", path, json));
  json_decref(l);
  return id;
}

static json_int_t turn(fixture *f, const char *sid, const char *body) {
  return turn_with(f, sid, body, NULL);
}

static json_t *diff(fixture *f, const char *sid, json_int_t from, json_int_t to) {
  char path[160];
  snprintf(path, sizeof path, "/v1/sessions/%s/context/diff?from=%lld&to=%lld", sid,
           (long long)from, (long long)to);
  return ok(f, "GET", path, NULL);
}

/* The change in diff[part][change] whose content is `content`, or NULL. */
static json_t *change(json_t *d, const char *part, const char *kind, const char *content) {
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(json_object_get(d, part), kind), i, c) {
    const char *s = json_string_value(json_object_get(c, "content"));
    if (s && strcmp(s, content) == 0)
      return c;
  }
  return NULL;
}

static const char *reason(json_t *c) { return json_string_value(json_object_get(c, "reason")); }

static void test_diff_names_what_entered_and_left_with_the_reason(void **state) {
  fixture *f = *state;
  session(f, "s1", NULL);
  node(f, "s1", "{\"at\":\"d0, 1, 0\",\"content\":\"remind: standup\",\"ttl\":1}");
  node(f, "s1", "{\"at\":\"d0, 3, 0\",\"content\":\"every other turn\",\"ttl\":1,\"cadence\":2}");
  node(f, "s1", "{\"at\":\"d-1, 1, 0\",\"content\":\"always here\"}");
  json_int_t a = turn(f, "s1", "hello");
  node(f, "s1", "{\"at\":\"d0, 2, 0\",\"content\":\"new note\"}");
  json_int_t b = turn(f, "s1", "again");
  json_int_t c = turn(f, "s1", "third");

  json_t *d = diff(f, "s1", a, b);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(d, "from"), "id")), a);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(d, "to"), "id")), b);
  /* the reminder's TTL of 1 ran out when turn a completed (episode 0 -> 1) */
  json_t *x = change(d, "nodes", "left", "remind: standup");
  assert_non_null(x);
  assert_string_equal(reason(x), "ttl_expired");
  assert_non_null(strstr(json_string_value(json_object_get(x, "detail")), "expired at episode 1"));
  x = change(d, "messages", "left", "remind: standup"); /* and so did the message it rendered */
  assert_non_null(x);
  assert_string_equal(reason(x), "ttl_expired");
  /* the cadence node expired too and waits for episode 2 */
  assert_string_equal(reason(change(d, "nodes", "left", "every other turn")), "cadence");
  /* inserted between the turns */
  x = change(d, "nodes", "entered", "new note");
  assert_non_null(x);
  assert_string_equal(reason(x), "inserted");
  assert_non_null(change(d, "messages", "entered", "new note"));
  /* a permanent system node stays: no change listed */
  assert_null(change(d, "nodes", "left", "always here"));
  assert_null(change(d, "nodes", "entered", "always here"));
  /* turn a's trigger is history in turn b; its obligation was consumed */
  x = change(d, "conversation_history", "entered", "hello");
  assert_non_null(x);
  assert_string_equal(json_string_value(json_object_get(x, "sender")), "ann");
  assert_string_equal(reason(change(d, "pending_obligations", "left", "ann: hello")), "consumed");
  assert_non_null(change(d, "pending_obligations", "entered", "ann: again"));
  x = change(d, "messages", "changed", "hello");
  assert_non_null(x);
  assert_string_equal(json_string_value(json_object_get(x, "from_at")), "d0, 0, 0");
  json_decref(d);

  /* episode 2: the cadence re-creates its node under a new id */
  d = diff(f, "s1", b, c);
  x = change(d, "nodes", "entered", "every other turn");
  assert_non_null(x);
  assert_string_equal(reason(x), "cadence");
  json_decref(d);

  /* backwards: what turn a had and turn c lacks is still explained, and what c added is
   * "not yet created" in a */
  d = diff(f, "s1", c, a);
  assert_string_equal(reason(change(d, "nodes", "left", "new note")), "not_yet_created");
  json_decref(d);

  /* one kept context, whole */
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/s1/turns/%lld/context", (long long)a);
  json_t *k = ok(f, "GET", path, NULL);
  assert_string_equal(json_string_value(json_object_get(json_object_get(k, "turn"), "kind")),
                      "inbox");
  json_t *msgs = json_object_get(k, "messages");
  bool found = false;
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (strcmp(json_string_value(json_object_get(m, "content")), "remind: standup") == 0) {
      found = true;
      assert_true(json_is_integer(json_object_get(m, "node"))); /* rendered from a tree node */
    }
  }
  assert_true(found);
  assert_true(json_array_size(json_object_get(k, "nodes")) >= 3);
  json_decref(k);
}

static void test_history_cut_by_the_window_is_window_budget(void **state) {
  fixture *f = *state;
  session(f, "w1", ",\"context_window_tokens\":256");
  char body[256];
  json_int_t ids[8];
  for (int i = 0; i < 8; i++) {
    snprintf(body, sizeof body, "message %d: %.*s", i, 120,
             "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
             "incididunt ut labore et dolore magna aliqua ut enim ad minim veniam quis nostrud");
    ids[i] = turn(f, "w1", body);
  }
  /* by the last turns the window holds only the newest history: what the earlier turn still
   * showed left because the window cut it */
  json_t *d = diff(f, "w1", ids[5], ids[7]);
  size_t n = 0, i;
  json_t *x;
  json_t *left = json_object_get(json_object_get(d, "conversation_history"), "left");
  json_array_foreach(left, i, x) {
    assert_string_equal(reason(x), "window_budget");
    n++;
  }
  assert_true(n > 0);
  assert_true(json_integer_value(json_object_get(
                  json_object_get(json_object_get(d, "to"), "tokens"), "history_cut")) > 0);
  json_decref(d);
}

static void test_parts_left_out_by_include_are_named_not_reported_gone(void **state) {
  fixture *f = *state;
  session(f, "s2", NULL);
  json_int_t a = turn(f, "s2", "first");
  json_int_t b = turn_with(f, "s2", "second", "[\"messages\"]");
  json_t *d = diff(f, "s2", a, b);
  json_t *omitted = json_object_get(json_object_get(d, "to"), "omitted");
  bool history = false;
  size_t i;
  json_t *v;
  json_array_foreach(omitted, i, v) history |=
      strcmp(json_string_value(v), "sections.conversation_history") == 0;
  assert_true(history);
  /* pending_obligations were left out of b: nothing is reported as gone from them */
  assert_int_equal(
      json_array_size(json_object_get(json_object_get(d, "pending_obligations"), "left")), 0);
  /* messages were kept for both: compared */
  assert_non_null(change(d, "messages", "entered", "second"));
  json_decref(d);
}

static void test_errors_name_the_field(void **state) {
  fixture *f = *state;
  session(f, "s3", NULL);
  json_int_t a = turn(f, "s3", "only");
  int st;
  char path[160];
  snprintf(path, sizeof path, "/v1/sessions/s3/context/diff?to=%lld", (long long)a);
  cph_test_response r = cph_test_api(f->d.port, "GET", path, NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", "from");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/v1/sessions/s3/context/diff?from=x&to=1", NULL, NULL);
  cph_test_expect_error(&r, 400, "bad_request", "from");
  cph_test_response_free(&r);
  snprintf(path, sizeof path, "/v1/sessions/s3/context/diff?from=%lld&to=999999", (long long)a);
  r = cph_test_api(f->d.port, "GET", path, NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", "to");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/v1/sessions/nobody/context/diff?from=1&to=2", NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", "id");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/v1/sessions/nobody/turns", NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", "id");
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/v1/sessions/s3/turns/999999/context", NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", "turn");
  cph_test_response_free(&r);
  json_decref(call(f, &st, "GET", "/v1/sessions/s3/turns", NULL));
  assert_int_equal(st, 200);
}

static json_t *kept(fixture *f, const char *sid) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s/turns", sid);
  json_t *j = ok(f, "GET", path, NULL);
  json_t *t = json_incref(json_object_get(j, "turns"));
  json_decref(j);
  return t;
}

static void test_keep_turns_bounds_the_kept_contexts_per_session(void **state) {
  fixture *f = *state;
  session(f, "k1", NULL);
  session(f, "k2", NULL);
  json_int_t ids[5];
  for (int i = 0; i < 5; i++) {
    char body[32];
    snprintf(body, sizeof body, "turn %d", i);
    ids[i] = turn(f, "k1", body);
  }
  json_int_t other = turn(f, "k2", "elsewhere");
  json_t *t = kept(f, "k1");
  assert_int_equal(json_array_size(t), 3); /* the newest three, oldest first */
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(json_integer_value(json_object_get(json_array_get(t, i), "id")), ids[2 + i]);
  json_decref(t);
  t = kept(f, "k2"); /* another session's bound is its own */
  assert_int_equal(json_array_size(t), 1);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(t, 0), "id")), other);
  json_decref(t);
  char path[160];
  snprintf(path, sizeof path, "/v1/sessions/k1/context/diff?from=%lld&to=%lld", (long long)ids[0],
           (long long)ids[4]);
  cph_test_response r = cph_test_api(f->d.port, "GET", path, NULL, NULL);
  cph_test_expect_error(&r, 404, "not_found", "from"); /* dropped by the bound */
  cph_test_response_free(&r);
  json_decref(diff(f, "k1", ids[2], ids[4]));

  /* deleting a session deletes what it kept: a new session of the same id starts empty */
  json_decref(ok(f, "DELETE", "/v1/sessions/k1", NULL));
  session(f, "k1", NULL);
  t = kept(f, "k1");
  assert_int_equal(json_array_size(t), 0);
  json_decref(t);
}

/* What kept contexts hold once per session — the rows of turn_kept (keys session\0 'r' row),
 * the texts of turn_texts (records of version 2): how many, and their bytes; and how many refs
 * entries name them (one per kept turn: session\0 'k' turn 'f' in turn_kept, and turn_text_refs).
 */
static void texts_held(const char *dir, size_t *n, size_t *bytes, size_t *n_refs) {
  cph_store_options o = {dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st;
  cph_err err;
  assert_int_equal(cph_store_open(&o, &st, &err), CPH_OK);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, false, &t), CPH_OK);
  *n = *bytes = *n_refs = 0;
  static const cph_db dbs[] = {CPH_DB_TURN_KEPT, CPH_DB_TURN_TEXTS, CPH_DB_TURN_TEXT_REFS};
  for (size_t d = 0; d < sizeof dbs / sizeof dbs[0]; d++) {
    cph_cursor c;
    assert_int_equal(cph_cursor_open(&t, dbs[d], &c), CPH_OK);
    cph_val k, v;
    for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
         rc = cph_cursor_next(&c, &k, &v)) {
      size_t sn = strnlen(k.data, k.len);
      const char *kind = (const char *)k.data + sn + 1;
      if (d == 0 && sn + 10 == k.len && *kind == 'k')
        continue; /* a record */
      bool refs = d == 2 || (d == 0 && sn + 11 == k.len && *kind == 'k');
      if (refs) {
        (*n_refs)++;
      } else {
        (*n)++;
        *bytes += v.len;
      }
    }
    cph_cursor_close(&c);
  }
  cph_txn_abort(&t);
  cph_store_close(st);
}

/* A kept context is stored as rows named by hash, each once per session (core/turnlog.c):
 * what the explorer reads back is exactly what the lease gave the worker, turn after turn,
 * while the texts held stay about one window's worth however many turns pass, and go with
 * the session. */
static void test_kept_texts_are_stored_once_and_read_back_exactly(void **state) {
  fixture *f = *state;
  session(f, "x1", ",\"system\":\"You are a careful assistant.\"");
  enum { TURNS = 12 };
  json_int_t ids[TURNS];
  json_t *leased[TURNS];
  size_t leased_bytes = 0;
  for (int i = 0; i < TURNS; i++) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"events\":[{\"channel\":\"x1-chan\",\"sender\":\"ann\",\"body\":\"message "
             "%d: the staging cluster needs a restart before the %d o'clock deploy\"}]}",
             i, i % 12 + 1);
    json_decref(ok(f, "POST", "/v1/events", json));
    json_t *l = ok(f, "POST", "/v1/turns/lease", "{\"worker\":\"w\",\"wait_ms\":5000}");
    json_t *t = json_object_get(l, "turn");
    ids[i] = json_integer_value(json_object_get(t, "id"));
    leased[i] = json_incref(json_object_get(t, "messages"));
    char path[64];
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)ids[i]);
    snprintf(json, sizeof json,
             "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},"
             "\"reply\":{\"body\":\"done with %d\"}}",
             json_string_value(json_object_get(t, "lease")), i);
    json_decref(ok(f, "POST", path, json));
    json_decref(l);
  }
  /* the newest three are kept (keep-turns 3), each message as leased, in order */
  for (int i = TURNS - 3; i < TURNS; i++) {
    char path[96];
    snprintf(path, sizeof path, "/v1/sessions/x1/turns/%lld/context", (long long)ids[i]);
    json_t *c = ok(f, "GET", path, NULL);
    json_t *got = json_object_get(c, "messages");
    assert_int_equal(json_array_size(got), json_array_size(leased[i]));
    assert_true(json_array_size(got) >= 2 * (size_t)(i / 2)); /* the history grows */
    for (size_t m = 0; m < json_array_size(got); m++) {
      json_t *a = json_array_get(leased[i], m), *b = json_array_get(got, m);
      assert_string_equal(json_string_value(json_object_get(b, "role")),
                          json_string_value(json_object_get(a, "role")));
      const char *content = json_string_value(json_object_get(a, "content"));
      assert_string_equal(json_string_value(json_object_get(b, "content")), content);
      leased_bytes += strlen(content);
    }
    json_decref(c);
  }
  for (int i = 0; i < TURNS; i++)
    json_decref(leased[i]);
  char *dir = strdup(f->d.data_dir);
  f->d.keep_data = true;
  assert_int_equal(cph_test_daemon_stop(&f->d), 0);
  size_t n, bytes, n_refs;
  texts_held(dir, &n, &bytes, &n_refs);
  assert_int_equal(n_refs, 3);
  /* three kept turns share all but their newest messages: each row is held once, so what is
   * held is about one turn's messages and tree nodes (each with its coordinate, role and node
   * fields: the cores' texts show twice, as messages and as node previews), where keeping the
   * three turns whole would hold three times that */
  assert_true(n > 0);
  assert_true(bytes < 2 * leased_bytes);

  /* deleting the session deletes its rows */
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, dir, NULL), 0);
  json_decref(ok(f, "DELETE", "/v1/sessions/x1", NULL));
  f->d.keep_data = true;
  assert_int_equal(cph_test_daemon_stop(&f->d), 0);
  texts_held(dir, &n, &bytes, &n_refs);
  assert_int_equal(n, 0);
  assert_int_equal(n_refs, 0);
  assert_int_equal(cph_test_daemon_start(&f->d, f->policy, dir, NULL), 0); /* for teardown */
  f->d.keep_data = false;                                                  /* teardown removes it */
  free(dir);
}

static void test_keep_turns_zero_keeps_nothing(void **state) {
  fixture *f = *state;
  session(f, "z1", NULL);
  turn(f, "z1", "not kept");
  json_t *t = kept(f, "z1");
  assert_int_equal(json_array_size(t), 0);
  json_decref(t);
}

static void test_cephalonctl_context_diff_prints_the_reasons(void **state) {
  fixture *f = *state;
  session(f, "c1", NULL);
  node(f, "c1", "{\"at\":\"d0, 1, 0\",\"content\":\"remind: standup\",\"ttl\":1}");
  json_int_t a = turn(f, "c1", "hello");
  json_int_t b = turn(f, "c1", "again");
  char *exe, url[64], from[24], to[24];
  assert_true(asprintf(&exe, "%s/cephalonctl", getenv("CPH_BIN_DIR")) > 0);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", f->d.port);
  snprintf(from, sizeof from, "%lld", (long long)a);
  snprintf(to, sizeof to, "%lld", (long long)b);
  char *out, *err;
  const char *argv[] = {exe, "--url", url, "context", "diff", "c1", from, to, NULL};
  assert_int_equal(cph_test_run(argv, &out, &err), 0);
  char head[160];
  snprintf(head, sizeof head, "c1: turn %s (inbox, episode 0) -> turn %s (inbox, episode 1)", from,
           to);
  assert_non_null(strstr(out, head));
  bool found = false; /* one row: node, left, ttl_expired, the content and the detail */
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"))
    found |= strncmp(line, "node ", 5) == 0 && strstr(line, " left ") &&
             strstr(line, "ttl_expired") && strstr(line, "remind: standup") &&
             strstr(line, "expired at episode 1");
  assert_true(found);
  free(out);
  free(err);
  const char *json[] = {exe, "--url", url, "--json", "context", "diff", "c1", from, to, NULL};
  assert_int_equal(cph_test_run(json, &out, &err), 0);
  json_t *j = json_loads(out, 0, NULL);
  assert_non_null(j);
  assert_string_equal(reason(change(j, "nodes", "left", "remind: standup")), "ttl_expired");
  json_decref(j);
  free(out);
  free(err);
  const char *turns[] = {exe, "--url", url, "context", "turns", "c1", NULL};
  assert_int_equal(cph_test_run(turns, &out, &err), 0);
  assert_non_null(strstr(out, "inbox:hello"));
  free(out);
  free(err);
  const char *missing[] = {exe, "--url", url, "context", "diff", "c1", from, "999999", NULL};
  assert_int_equal(cph_test_run(missing, &out, &err), 1);
  assert_non_null(strstr(err, "not kept"));
  free(out);
  free(err);
  const char *bad[] = {exe, "--url", url, "context", "diff", "c1", from, NULL};
  assert_int_equal(cph_test_run(bad, &out, &err), 2);
  free(out);
  free(err);
  free(exe);
}

static void test_sessions_list_finds_ids_by_prefix(void **state) {
  fixture *f = *state;
  const char *ids[] = {"ab", "abc", "abd", "ac", "b", "aa"};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    session(f, ids[i], NULL);
  json_t *j = ok(f, "GET", "/v1/sessions?prefix=ab", NULL);
  json_t *list = json_object_get(j, "sessions");
  assert_int_equal(json_array_size(list), 3);
  assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "id")), "ab");
  assert_string_equal(json_string_value(json_object_get(json_array_get(list, 2), "id")), "abd");
  json_decref(j);
  j = ok(f, "GET", "/v1/sessions?prefix=ab&limit=2", NULL); /* pages inside the prefix */
  assert_string_equal(json_string_value(json_object_get(j, "next")), "abc");
  json_decref(j);
  j = ok(f, "GET", "/v1/sessions?prefix=ab&after=abc", NULL);
  list = json_object_get(j, "sessions");
  assert_int_equal(json_array_size(list), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "id")), "abd");
  json_decref(j);
  j = ok(f, "GET", "/v1/sessions?prefix=zz", NULL);
  assert_int_equal(json_array_size(json_object_get(j, "sessions")), 0);
  json_decref(j);
}

/* ---- a lease's kept context, read right after its answer, with 8 clients at once ---- */

#define READERS 8
#define READER_ROUNDS 20

typedef struct reader {
  int port;
  char sid[16];
  char failure[512]; /* the first thing that went wrong ("" when nothing did) */
  int offload_sized; /* leases answered with 16 KiB or more (written on the request thread) */
  int checked;       /* leased turns whose kept context was read */
} reader;

static json_t *reader_call(reader *rd, const char *method, const char *path, const char *body,
                           int want) {
  cph_test_response r = cph_test_api(rd->port, method, path, NULL, body);
  json_t *j = r.status == want ? cph_test_json(&r) : NULL;
  if (!j && !rd->failure[0])
    snprintf(rd->failure, sizeof rd->failure, "%s %s: %d %.300s", method, path, r.status,
             r.body ? r.body : "");
  cph_test_response_free(&r);
  return j;
}

/* Each round: an event of ~1.2 KB (so the lease answers pass 16 KiB after a dozen rounds and
 * are written on the request thread, and the first ones are not), a lease (of whichever
 * session's turn is ready: the readers are workers), at once the kept context of the leased
 * turn — it must be there, with the lease's messages — then the completion. */
static void *reader_main(void *arg) {
  reader *rd = arg;
  char body[1400], json[1700], path[160];
  for (int round = 0; round < READER_ROUNDS && !rd->failure[0]; round++) {
    int n = snprintf(body, sizeof body, "%s round %d:", rd->sid, round);
    while (n < 1200)
      n += snprintf(body + n, sizeof body - (size_t)n, " word%d", n);
    snprintf(json, sizeof json,
             "{\"events\":[{\"channel\":\"%s-chan\",\"sender\":\"ann\",\"body\":\"%s\"}]}",
             rd->sid, body);
    json_decref(reader_call(rd, "POST", "/v1/events", json, 200));
    /* 204: the turns of the sessions with input were taken (a session's events staged
     * together make one turn, so there are fewer turns than events) */
    cph_test_response lr = cph_test_api(rd->port, "POST", "/v1/turns/lease", NULL,
                                        "{\"worker\":\"w\",\"wait_ms\":2000}");
    json_t *l = lr.status == 200 ? cph_test_json(&lr) : NULL;
    if (lr.status != 200 && lr.status != 204 && !rd->failure[0])
      snprintf(rd->failure, sizeof rd->failure, "POST /v1/turns/lease: %d %.300s", lr.status,
               lr.body ? lr.body : "");
    cph_test_response_free(&lr);
    if (!l)
      continue;
    rd->checked++;
    char *dumped = json_dumps(l, JSON_COMPACT);
    if (dumped && strlen(dumped) >= 16 * 1024)
      rd->offload_sized++;
    free(dumped);
    json_t *t = json_object_get(l, "turn");
    json_int_t id = json_integer_value(json_object_get(t, "id"));
    json_t *msgs = json_object_get(t, "messages");
    snprintf(path, sizeof path, "/v1/sessions/%s/turns/%lld/context",
             json_string_value(json_object_get(t, "session")), (long long)id);
    json_t *c = reader_call(rd, "GET", path, NULL, 200);
    json_t *kept_msgs = c ? json_object_get(c, "messages") : NULL;
    for (size_t m = 0; c && !rd->failure[0] && m < json_array_size(msgs); m++) {
      const char *leased = json_string_value(json_object_get(json_array_get(msgs, m), "content"));
      const char *held = json_string_value(json_object_get(json_array_get(kept_msgs, m), "content"));
      if (json_array_size(kept_msgs) != json_array_size(msgs))
        snprintf(rd->failure, sizeof rd->failure, "turn %lld: kept %zu messages, leased %zu",
                 (long long)id, json_array_size(kept_msgs), json_array_size(msgs));
      else if (!leased || !held || strcmp(leased, held) != 0)
        snprintf(rd->failure, sizeof rd->failure, "turn %lld: message %zu kept as \"%.60s\", "
                 "leased as \"%.60s\"", (long long)id, m, held ? held : "(none)",
                 leased ? leased : "(none)");
    }
    json_decref(c);
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)id);
    snprintf(json, sizeof json,
             "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},"
             "\"reply\":{\"body\":\"noted %d\"}}",
             json_string_value(json_object_get(t, "lease")), round);
    json_decref(reader_call(rd, "POST", path, json, 200));
    json_decref(l);
  }
  return NULL;
}

static void test_a_leases_kept_context_is_there_when_the_lease_is_answered(void **state) {
  fixture *f = *state;
  reader rd[READERS];
  pthread_t th[READERS];
  for (int i = 0; i < READERS; i++) {
    memset(&rd[i], 0, sizeof rd[i]);
    rd[i].port = f->d.port;
    snprintf(rd[i].sid, sizeof rd[i].sid, "r%d", i);
    session(f, rd[i].sid, NULL);
  }
  for (int i = 0; i < READERS; i++)
    assert_int_equal(pthread_create(&th[i], NULL, reader_main, &rd[i]), 0);
  int offload_sized = 0, checked = 0;
  for (int i = 0; i < READERS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    if (rd[i].failure[0])
      fail_msg("session %s: %s", rd[i].sid, rd[i].failure);
    offload_sized += rd[i].offload_sized;
    checked += rd[i].checked;
  }
  assert_true(checked >= READERS * READER_ROUNDS / 4);
  /* both ways a lease is answered were taken: written on the loop, and on the request thread */
  assert_true(offload_sized > 0);
  assert_true(offload_sized < READERS * READER_ROUNDS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_diff_names_what_entered_and_left_with_the_reason, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_history_cut_by_the_window_is_window_budget, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_parts_left_out_by_include_are_named_not_reported_gone,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors_name_the_field, setup, teardown),
      cmocka_unit_test_setup_teardown(test_keep_turns_bounds_the_kept_contexts_per_session,
                                      setup_keep3, teardown),
      cmocka_unit_test_setup_teardown(test_keep_turns_zero_keeps_nothing, setup_keep0, teardown),
      cmocka_unit_test_setup_teardown(test_kept_texts_are_stored_once_and_read_back_exactly,
                                      setup_keep3, teardown),
      cmocka_unit_test_setup_teardown(test_cephalonctl_context_diff_prints_the_reasons, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_sessions_list_finds_ids_by_prefix, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_a_leases_kept_context_is_there_when_the_lease_is_answered, setup_busy, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
