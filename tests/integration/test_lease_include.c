/* The lease's `include` over HTTP (DESIGN §9, issue 17 item 5): a worker that asks for some
 * parts of the turn gets exactly those, each byte for byte what the whole answer carries for
 * the same turn state, in JSON and msgpack and on a long poll; a bad `include` is a 400 naming
 * the field that takes no lease. The same turn is leased again and again by failing it: a
 * failed lease moves no cursor and changes neither the tree nor the history, so each lease sees
 * the same state. */
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
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

/* Enough attempts for every lease of a test to be of the same turn (none gets parked). */
static const char *POLICY = "{:leases {:max-attempts 50}\n"
                            " :sessions {:janitor? false}}\n";

/* The members every answer carries, whatever it includes. */
static const char *const IDENTITY[] = {"id",          "lease",    "session",
                                       "lane",        "kind",     "episode",
                                       "deadline_ms", "attempts", "tools_named"};
#define N_IDENTITY (sizeof IDENTITY / sizeof IDENTITY[0])

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
  json_t *whole; /* the default answer's turn for the prepared state */
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
  json_decref(f->whole);
  cph_test_daemon_stop(&f->d);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

static json_t *ok(fixture *f, const char *method, const char *path, const char *body) {
  cph_test_response r = cph_test_api(f->d.port, method, path, NULL, body);
  json_t *j = cph_test_json(&r);
  if (r.status != 200 && r.status != 201)
    fail_msg("%s %s: %d %s", method, path, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  return j;
}

static void post_event(fixture *f, const char *sender, const char *body) {
  char json[512];
  snprintf(json, sizeof json,
           "{\"events\":[{\"channel\":\"general\",\"sender\":\"%s\",\"body\":\"%s\"}]}", sender,
           body);
  json_decref(ok(f, "POST", "/v1/events", json));
}

/* The lease answer's turn for a JSON request body (200 asserted). */
static json_t *lease_json(fixture *f, const char *body) {
  json_t *j = ok(f, "POST", "/v1/turns/lease", body);
  json_t *turn = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  assert_non_null(turn);
  return turn;
}

static void finish(fixture *f, const json_t *turn, const char *verb, const char *extra) {
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/%s",
           (long long)json_integer_value(json_object_get(turn, "id")), verb);
  snprintf(body, sizeof body, "{\"lease\":\"%s\"%s}",
           json_string_value(json_object_get(turn, "lease")), extra);
  json_decref(ok(f, "POST", path, body));
}

static void fail_turn(fixture *f, const json_t *turn) { finish(f, turn, "fail", ""); }

/* Asserts o's members are exactly the identity fields plus `parts` (NULL-terminated). */
static void expect_members(const json_t *turn, const char *const *parts) {
  size_t want = N_IDENTITY;
  for (size_t i = 0; i < N_IDENTITY; i++)
    if (!json_object_get(turn, IDENTITY[i]))
      fail_msg("the answer lacks \"%s\"", IDENTITY[i]);
  for (; *parts; parts++, want++)
    if (!json_object_get(turn, *parts))
      fail_msg("the answer lacks \"%s\"", *parts);
  if (json_object_size(turn) != want) {
    char *dump = json_dumps(turn, JSON_COMPACT);
    fail_msg("%zu members, want %zu: %.2000s", json_object_size(turn), want, dump);
  }
}

/* a and b hold the same value, member order included. */
static void expect_same(const json_t *a, const json_t *b, const char *what) {
  char *x = json_dumps(a, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
  char *y = json_dumps(b, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
  if (!x || !y || strcmp(x, y) != 0 || !json_equal(a, b))
    fail_msg("%s differs:\n%.3000s\nvs\n%.3000s", what, x ? x : "(none)", y ? y : "(none)");
  free(x);
  free(y);
}

static const json_t *section(const json_t *turn, const char *name) {
  return json_object_get(json_object_get(turn, "sections"), name);
}

/* The memory minted at the first completion as turn's recent_memory shows it, or NULL. */
#define MINTED "ann runs the standup"
static const json_t *minted(const json_t *turn) {
  size_t i;
  const json_t *m;
  json_array_foreach(section(turn, "recent_memory"), i, m) {
    const char *text = json_string_value(json_object_get(m, "text"));
    if (text && strcmp(text, MINTED) == 0)
      return m;
  }
  return NULL;
}

/* Its access count (each inclusion counts one; 0 when not shown). */
static json_int_t memory_accesses(const json_t *turn) {
  return json_integer_value(json_object_get(minted(turn), "access_count"));
}

/* A session with a system prompt, tools, a context node, a memory and four completed turns of
 * history, then two users' messages waiting: the next turn's messages carry every kind of
 * message (system, tree component, history, several people), its sections all five. The
 * window is small enough that the messages' history is cut against the budget that pricing
 * the obligations and tools leaves (core/context.h), so messages that came out the same
 * without those sections built show that they are still priced. Leases the whole turn once
 * (f->whole) and fails it, so the same turn is leasable again. */
static void prepare(fixture *f) {
  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"],"
                 "\"system\":\"You are s1.\",\"tools\":[\"search\",\"calc\"],"
                 "\"context_window_tokens\":256}"));
  json_decref(ok(f, "POST", "/v1/sessions/s1/context",
                 "{\"at\":\"d0, 1, 0\",\"content\":\"remember: standup at 10\"}"));
  const char *asks[] = {"when is the standup of the platform team this week?",
                        "and when do we have lunch together after it?",
                        "where is the room for it, the usual one on the fourth floor?",
                        "is there coffee in that room or should we bring some?"};
  const char *replies[] = {"At 10.", "At 12.", "Room 4.", "Yes."};
  for (int i = 0; i < 4; i++) {
    post_event(f, "ann", asks[i]);
    json_t *t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000}");
    char extra[256];
    snprintf(extra, sizeof extra,
             ",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"reply\":{\"body\":\"%s\"}%s",
             replies[i], i == 0 ? ",\"memories\":[{\"text\":\"" MINTED "\"}]" : "");
    finish(f, t, "complete", extra);
    json_decref(t);
  }
  post_event(f, "ann", "is the standup moved to another day this week? I heard something about "
                        "Thursday from the platform team but nobody wrote it down anywhere");
  post_event(f, "bob", "same question from me: the calendar still says Tuesday and I have a "
                        "conflict on Thursday morning with the customer call at nine");
  f->whole = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000}");
  const char *const all[] = {"input",         "staged", "sections", "messages",
                             "channel_views", "tokens", NULL};
  expect_members(f->whole, all); /* the default: the whole turn, as before `include` */
  assert_true(json_array_size(json_object_get(f->whole, "messages")) >= 7);
  assert_true(json_integer_value(json_object_get(json_object_get(f->whole, "tokens"),
                                                 "messages_cut")) >= 1);
  assert_true(json_array_size(section(f->whole, "conversation_history")) >= 1);
  assert_true(memory_accesses(f->whole) > 0);
  assert_int_equal(json_array_size(section(f->whole, "available_tools")), 2);
  fail_turn(f, f->whole);
}

static void test_include_messages_carries_the_same_messages_and_nothing_else(void **state) {
  fixture *f = *state;
  prepare(f);
  json_t *t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[\"messages\"]}");
  /* the same staged input, leased a second time */
  assert_int_equal(json_integer_value(json_object_get(t, "attempts")),
                   json_integer_value(json_object_get(f->whole, "attempts")) + 1);
  const char *const parts[] = {"messages", NULL};
  expect_members(t, parts);
  expect_same(json_object_get(t, "messages"), json_object_get(f->whole, "messages"), "messages");
  fail_turn(f, t);
  json_decref(t);

  /* recent_memory was left out, so it was not read: no access was counted for it */
  t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000}");
  assert_int_equal(memory_accesses(t), memory_accesses(f->whole) + 1);
  expect_same(json_object_get(t, "messages"), json_object_get(f->whole, "messages"),
              "messages after a messages-only lease");
  json_decref(t);
}

static void test_include_sections_carries_the_same_sections_and_no_messages(void **state) {
  fixture *f = *state;
  prepare(f);
  json_t *t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[\"sections\"]}");
  const char *const parts[] = {"sections", NULL};
  expect_members(t, parts);
  assert_int_equal(json_object_size(json_object_get(t, "sections")), 5);
  const char *same[] = {"pending_obligations", "conversation_history", "available_tools"};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
    expect_same(section(t, same[i]), section(f->whole, same[i]), same[i]);
  /* the same memories, the minted one now read a second time */
  const json_t *mems = section(t, "recent_memory"), *whole_mems = section(f->whole, "recent_memory");
  assert_int_equal(json_array_size(mems), json_array_size(whole_mems));
  for (size_t i = 0; i < json_array_size(mems); i++)
    expect_same(json_object_get(json_array_get(mems, i), "text"),
                json_object_get(json_array_get(whole_mems, i), "text"), "a memory");
  assert_non_null(minted(t));
  assert_int_equal(memory_accesses(t), memory_accesses(f->whole) + 1);
  assert_string_equal(json_string_value(json_object_get(section(t, "current_state"), "turn_kind")),
                      "inbox");
  fail_turn(f, t);
  json_decref(t);

  /* one section, with tokens: the answer's figures count only what it carries */
  t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000,"
                    "\"include\":[\"sections.available_tools\",\"tokens\",\"input\"]}");
  const char *const some[] = {"sections", "tokens", "input", NULL};
  expect_members(t, some);
  assert_int_equal(json_object_size(json_object_get(t, "sections")), 1);
  expect_same(section(t, "available_tools"), section(f->whole, "available_tools"),
              "available_tools");
  expect_same(json_object_get(t, "input"), json_object_get(f->whole, "input"), "input");
  const json_t *tok = json_object_get(t, "tokens"), *whole_tok = json_object_get(f->whole, "tokens");
  json_int_t tools = json_integer_value(json_object_get(whole_tok, "available_tools"));
  assert_true(tools > 0);
  assert_int_equal(json_integer_value(json_object_get(tok, "available_tools")), tools);
  assert_int_equal(json_integer_value(json_object_get(tok, "sections")), tools);
  assert_int_equal(json_integer_value(json_object_get(tok, "messages")), 0);
  assert_int_equal(json_integer_value(json_object_get(tok, "recent_memory")), 0);
  expect_same(json_object_get(tok, "window"), json_object_get(whole_tok, "window"), "window");
  json_decref(t);
}

static void test_bad_include_is_400_naming_the_field_and_takes_no_lease(void **state) {
  fixture *f = *state;
  prepare(f);
  const char *bad[] = {
      "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[\"messages\",\"history\"]}",
      "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[\"sections.bogus\"]}",
      "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":\"messages\"}",
      "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[1]}",
      "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":{\"messages\":true}}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cph_test_response r = cph_test_api(f->d.port, "POST", "/v1/turns/lease", NULL, bad[i]);
    cph_test_expect_error(&r, 400, "bad_request", "include");
    cph_test_response_free(&r);
  }
  /* the turn is still there, and none of those counted as an attempt */
  json_t *t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[\"messages\"]}");
  assert_int_equal(json_integer_value(json_object_get(t, "attempts")),
                   json_integer_value(json_object_get(f->whole, "attempts")) + 1);
  expect_same(json_object_get(t, "messages"), json_object_get(f->whole, "messages"), "messages");
  json_decref(t);
}

static void pack_str(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

/* A msgpack lease request {worker, wait_ms, include: parts} (n names). */
static cph_test_response lease_msgpack(fixture *f, const char *const *parts, size_t n) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 3);
  pack_str(&pk, "worker");
  pack_str(&pk, "w");
  pack_str(&pk, "wait_ms");
  msgpack_pack_int(&pk, 5000);
  pack_str(&pk, "include");
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++)
    pack_str(&pk, parts[i]);
  cph_test_response r = cph_test_http_raw(
      f->d.port, "POST", "/v1/turns/lease",
      "Content-Type: application/msgpack\r\nAccept: application/msgpack\r\n", sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  return r;
}

static void test_include_in_msgpack_request_and_answer(void **state) {
  fixture *f = *state;
  prepare(f);
  const char *const worker[] = {"messages", "sections.available_tools"};
  cph_test_response r = lease_msgpack(f, worker, 2);
  assert_int_equal(r.status, 200);
  char ct[64];
  assert_non_null(cph_test_header(&r, "Content-Type", ct, sizeof ct));
  assert_string_equal(ct, "application/msgpack");
  json_t *j = cph_test_msgpack_json(r.body, r.body_len);
  cph_test_response_free(&r);
  json_t *t = json_object_get(j, "turn");
  const char *const parts[] = {"messages", "sections", NULL};
  expect_members(t, parts);
  assert_int_equal(json_object_size(json_object_get(t, "sections")), 1);
  expect_same(json_object_get(t, "messages"), json_object_get(f->whole, "messages"), "messages");
  expect_same(section(t, "available_tools"), section(f->whole, "available_tools"),
              "available_tools");
  fail_turn(f, t);
  json_decref(j);

  const char *const bad[] = {"messages", "everything"};
  r = lease_msgpack(f, bad, 2);
  assert_int_equal(r.status, 400);
  json_t *e = cph_test_msgpack_json(r.body, r.body_len);
  cph_test_response_free(&r);
  assert_string_equal(json_string_value(json_object_get(json_object_get(e, "error"), "field")),
                      "include");
  json_decref(e);
  json_t *again = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000}");
  expect_same(json_object_get(again, "messages"), json_object_get(f->whole, "messages"),
              "messages");
  json_decref(again);
}

/* Reads what the server sends on fd until it closes (the request said Connection: close). */
static char *read_all(int fd) {
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap + 1);
  ssize_t n;
  while (buf && (n = recv(fd, buf + len, cap - len, 0)) > 0) {
    len += (size_t)n;
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
    }
  }
  if (buf)
    buf[len] = '\0';
  return buf;
}

static void test_long_polled_lease_keeps_its_include(void **state) {
  fixture *f = *state;
  json_decref(ok(f, "POST", "/v1/sessions",
                 "{\"id\":\"s1\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}"));
  int fd = cph_test_http_send_only(f->d.port, "POST", "/v1/turns/lease",
                                   "{\"worker\":\"w\",\"wait_ms\":10000,"
                                   "\"include\":[\"staged\",\"channel_views\"]}");
  assert_true(fd >= 0);
  usleep(200 * 1000); /* the lease is waiting when the event arrives */
  post_event(f, "ann", "wake up");
  char *raw = read_all(fd);
  close(fd);
  assert_non_null(raw);
  const char *body = strstr(raw, "\r\n\r\n");
  assert_non_null(body);
  assert_true(strncmp(raw, "HTTP/1.1 200", 12) == 0);
  json_t *j = json_loads(body + 4, 0, NULL);
  json_t *t = json_object_get(j, "turn");
  const char *const parts[] = {"staged", "channel_views", NULL};
  expect_members(t, parts);
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(json_object_get(t, "staged"), 0), "body")),
      "wake up");
  assert_string_equal(json_string_value(json_object_get(
                          json_array_get(json_object_get(t, "channel_views"), 0), "channel")),
                      "general");
  /* the cursor moves at completion although the answer had no messages */
  finish(f, t, "complete", ",\"cost\":{\"tokens\":1,\"tool_calls\":0}");
  json_decref(j);
  free(raw);
  post_event(f, "ann", "again");
  t = lease_json(f, "{\"worker\":\"w\",\"wait_ms\":5000,\"include\":[\"channel_views\"]}");
  const json_t *v = json_array_get(json_object_get(t, "channel_views"), 0);
  assert_true(json_object_get(v, "had_cursor") == json_true());
  json_decref(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_include_messages_carries_the_same_messages_and_nothing_else, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_include_sections_carries_the_same_sections_and_no_messages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_include_is_400_naming_the_field_and_takes_no_lease,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_include_in_msgpack_request_and_answer, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_long_polled_lease_keeps_its_include, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
