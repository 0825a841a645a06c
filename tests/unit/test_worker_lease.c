/* The worker's lease reader (worker/lease.c): the messages it writes as text for the model
 * must be what a tree of the whole answer gives — each message's role (default "user"),
 * content (default "") and name when a string — and the rest of the answer the same tree
 * with turn.messages empty. A property over seeded random answers (strings with escapes,
 * control characters and non-ASCII text, members in any order, other members and nested
 * values, written compact or indented), then the cases the scanner hands to jansson whole
 * and the texts that are not answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "tests/support/prop.h"
#include "worker/worker.h"

static const char *const PIECES[] = {"a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\x01",
                                     "é", "✓", "𝄞", "{", "}", "[", "]", ",", ":", "null", "0"};

static json_t *random_string(rng *r) {
  char s[256] = "";
  size_t n = below(r, 12);
  for (size_t i = 0; i < n; i++)
    strcat(s, PIECES[below(r, sizeof PIECES / sizeof *PIECES)]);
  return json_string(s);
}

/* Any JSON value, nesting up to depth. */
static json_t *random_value(rng *r, int depth) {
  switch (below(r, depth > 0 ? 7 : 5)) {
  case 0:
    return random_string(r);
  case 1:
    return json_integer((json_int_t)next(r) % 100000 - 50000);
  case 2:
    return json_real((double)below(r, 1000) / 8.0 - 20.0);
  case 3:
    return below(r, 2) ? json_true() : json_false();
  case 4:
    return json_null();
  case 5: {
    json_t *a = json_array();
    for (uint32_t i = below(r, 4); i > 0; i--)
      json_array_append_new(a, random_value(r, depth - 1));
    return a;
  }
  default: {
    json_t *o = json_object();
    for (uint32_t i = below(r, 4); i > 0; i--) {
      char k[16];
      snprintf(k, sizeof k, "k%u", below(r, 6));
      json_object_set_new(o, k, random_value(r, depth - 1));
    }
    return o;
  }
  }
}

/* A message as the daemon writes one, but with members left out, of other types, or
 * among others (coord, and names the worker never reads). */
static json_t *random_message(rng *r) {
  static const char *const KEYS[] = {"role", "content", "name", "coord", "other"};
  json_t *m = json_object();
  uint32_t n = 1 + below(r, 6);
  for (uint32_t i = 0; i < n; i++) {
    const char *k = KEYS[below(r, 5)];
    json_t *v = below(r, 4) ? random_string(r) : random_value(r, 2);
    json_object_set_new(m, k, v);
  }
  return m;
}

/* What wk_turn_run sent before the reader: the tree's messages, as the model takes them. */
static json_t *expected_messages(const json_t *answer) {
  json_t *out = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(json_object_get(answer, "turn"), "messages"), i, m) {
    json_t *o = json_object();
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content"),
           *name = json_object_get(m, "name");
    json_object_set_new(o, "role", role ? json_incref(role) : json_string("user"));
    json_object_set_new(o, "content", content ? json_incref(content) : json_string(""));
    if (json_is_string(name))
      json_object_set(o, "name", name);
    json_array_append_new(out, o);
  }
  return out;
}

/* Reads text and checks it against the tree of the same text; returns whether the reader
 * walked it (false: parsed whole). */
static bool check_read(uint64_t seed, const char *text) {
  json_t *whole = json_loads(text, 0, NULL);
  CPH_PROP_CHECK(seed, whole, "the generated answer does not parse: %.200s", text);
  wk_lease l;
  CPH_PROP_CHECK(seed, wk_lease_read(text, strlen(text), &l) == 0, "not read: %.300s", text);
  char *listed = malloc(l.messages.len + 3);
  snprintf(listed, l.messages.len + 3, "[%s]", l.messages.data ? l.messages.data : "");
  json_error_t jerr;
  json_t *got = json_loads(listed, 0, &jerr);
  CPH_PROP_CHECK(seed, got, "its messages are not JSON (%s): %.300s", jerr.text, listed);
  json_t *want = expected_messages(whole);
  CPH_PROP_CHECK(seed, json_equal(got, want), "messages differ\n got %.400s\nfrom %.400s", listed,
                 text);
  CPH_PROP_CHECK(seed, l.n_messages == json_array_size(want), "%zu messages counted, %zu given",
                 l.n_messages, json_array_size(want));
  json_t *turn = json_object_get(whole, "turn");
  if (json_is_array(json_object_get(turn, "messages")))
    json_object_set_new(turn, "messages", json_array());
  CPH_PROP_CHECK(seed, json_equal(l.answer, whole), "the rest of the answer differs: %.300s",
                 text);
  bool walked = !l.whole;
  free(listed);
  json_decref(got);
  json_decref(want);
  json_decref(whole);
  wk_lease_free(&l);
  return walked;
}

static void test_messages_read_as_text_equal_the_tree(void **state) {
  (void)state;
  uint64_t seed0;
  long cases;
  cph_property_run(4242, 3000, &seed0, &cases);
  long walked = 0;
  for (long c = 0; c < cases; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rng r = {seed};
    json_t *turn = json_object();
    /* the identity members, and others before and after the messages */
    json_object_set_new(turn, "id", json_integer((json_int_t)below(&r, 1000000)));
    json_object_set_new(turn, "lease", random_string(&r));
    if (below(&r, 2))
      json_object_set_new(turn, "sections", random_value(&r, 3));
    json_t *msgs = json_array();
    for (uint32_t i = below(&r, 9); i > 0; i--)
      json_array_append_new(msgs, random_message(&r));
    json_object_set_new(turn, "messages", msgs);
    if (below(&r, 2))
      json_object_set_new(turn, "session", random_string(&r));
    if (below(&r, 3) == 0) /* a "messages" elsewhere is not the turn's */
      json_object_set_new(turn, "staged", json_pack("[{s:[i]}]", "messages", 1));
    json_t *answer = json_object();
    if (below(&r, 2))
      json_object_set_new(answer, "messages", json_pack("[s]", "not the turn's"));
    json_object_set_new(answer, "turn", turn);
    size_t flags = below(&r, 2) ? JSON_COMPACT : JSON_INDENT(below(&r, 4));
    if (below(&r, 2))
      flags |= JSON_ENSURE_ASCII;
    char *text = json_dumps(answer, flags);
    json_decref(answer);
    walked += check_read(seed, text);
    free(text);
  }
  /* The point of the reader: it walks what the daemon writes, it does not fall back. */
  assert_int_equal(walked, cases);
}

/* A turn without messages, messages that are not an array, a message that is not an object,
 * and nesting deeper than the scanner follows: parsed whole, with the same results. */
static void test_answers_the_scanner_does_not_walk_are_parsed_whole(void **state) {
  (void)state;
  assert_false(check_read(1, "{\"turn\":{\"id\":1,\"lease\":\"l\"}}"));
  assert_false(check_read(2, "{\"turn\":{\"id\":1,\"messages\":{\"role\":\"user\"}}}"));
  assert_false(check_read(3, "{\"turn\":{\"messages\":[\"hello\",{\"role\":\"user\"}]}}"));
  char deep[4096] = "{\"turn\":{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"d\":";
  for (int i = 0; i < 600; i++)
    strcat(deep, "[");
  for (int i = 0; i < 600; i++)
    strcat(deep, "]");
  strcat(deep, "}}");
  assert_false(check_read(4, deep));
  /* Whitespace everywhere the grammar allows it is still walked. */
  assert_true(check_read(5, " { \"turn\" : { \"messages\" : [ { \"content\" : \"a\" , "
                            "\"role\" : \"assistant\" } , { } ] } } "));
}

static void test_text_that_is_no_answer_is_refused(void **state) {
  (void)state;
  static const char *const BAD[] = {"", "{", "{\"turn\":{\"messages\":[{\"role\":\"user\"}]}",
                                    "{\"turn\":{\"messages\":[{\"role\":\"us}]}}", "not json",
                                    "{\"turn\":{\"messages\":[]}} trailing"};
  for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
    wk_lease l;
    assert_int_equal(wk_lease_read(BAD[i], strlen(BAD[i]), &l), -1);
    assert_null(l.answer);
    assert_null(l.messages.data);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_messages_read_as_text_equal_the_tree),
      cmocka_unit_test(test_answers_the_scanner_does_not_walk_are_parsed_whole),
      cmocka_unit_test(test_text_that_is_no_answer_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
