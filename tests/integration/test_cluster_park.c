/* Cluster mode: a parked turn survives a takeover as a parked turn (server/clusterflow.h 6.,
 * 8.) — a real etcd, NATS JetStream and two cephalond on 127.0.0.1, with :leases :max-attempts 2.
 *
 * Session t00 gets two events on the node that owns it, whose turn fails twice and is parked
 * there (GET /v1/turns?state=parked lists it; each fail answered 200 once the log held its
 * marks); a third event arrives after the park and is left staged. That node is killed -9. On
 * the survivor, which took t00 over:
 *   - the turn is listed parked, with its attempts, error and input (both texts);
 *   - no lease carries the parked input: the next lease of t00 carries the third event only,
 *     and nothing more comes;
 *   - the survivor, killed -9 and started again on its data, holds the turn parked still;
 *   - a requeue there (answered 200 once the log held its unpark mark) brings the input back:
 *     the next lease carries both texts, each once; completing it consumes them.
 * Then the dead node comes back on its data (it still holds its own copy of the parked turn,
 * and the shards move back to it), and the survivor is killed -9, so the node that parked the
 * turn serves t00 again: it neither lists the turn parked nor delivers its input again, and the
 * log trims past it. Before park marks the survivor delivered the parked input to a turn at
 * once, and listed no parked turn: the test fails there. Without etcd or nats-server the test
 * fails and says what to install. */
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

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

#define NODES 2
#define SHARDS 8
#define TTL_S 2
#define SESSIONS 4

static const char EXTRA[] =
    ":leases {:max-attempts 2}\n"
    " :scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

static const char *const PARKED_TEXT[2] = {"parked one: the build is red", "parked two: please look"};
static const char FRESH_TEXT[] = "fresh three: after the park";

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int parker, survivor; /* the node that parked the turn, the one that took t00 over */
  char *parker_dir;     /* its data, while it is down */
  long long parker_turn; /* the turn's id on the node that parked it */
} bench;

/* POSTs events (a JSON array's inside) through node n; asserts 200 and every event accepted.
 * Returns the highest log position of the answer. */
static long long post_events(cph_test_cluster *c, int n, const char *events) {
  char body[1024];
  snprintf(body, sizeof body, "{\"events\":[%s]}", events);
  cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("POST /v1/events on n%d: %d %s", n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  long long pos = 0;
  size_t i;
  json_t *e;
  json_array_foreach(json_object_get(j, "events"), i, e) {
    const char *status = json_string_value(json_object_get(e, "status"));
    assert_true(status && strcmp(status, "accepted") == 0);
    long long p = json_integer_value(json_object_get(e, "pos"));
    if (p > pos)
      pos = p;
  }
  json_decref(j);
  return pos;
}

/* Leases on node n, waiting up to wait_ms (min_pos: 0 none): the lease answer's "turn" (new
 * reference), or NULL when none came (204). */
static json_t *lease(cph_test_cluster *c, int n, int wait_ms, long long min_pos) {
  char body[160];
  if (min_pos)
    snprintf(body, sizeof body, "{\"worker\":\"w\",\"wait_ms\":%d,\"min_pos\":%lld}", wait_ms,
             min_pos);
  else
    snprintf(body, sizeof body, "{\"worker\":\"w\",\"wait_ms\":%d}", wait_ms);
  cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL, body);
  if (r.status == 204) {
    cph_test_response_free(&r);
    return NULL;
  }
  if (r.status != 200)
    fail_msg("lease on n%d: %d %s", n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  json_t *turn = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  assert_non_null(turn);
  return turn;
}

/* How many of turn's staged entries show text. */
static int staged_with(const json_t *turn, const char *text) {
  int n = 0;
  size_t i;
  json_t *m;
  json_array_foreach(json_object_get(turn, "staged"), i, m) {
    const char *body = json_string_value(json_object_get(m, "body"));
    n += body && strstr(body, text) != NULL;
  }
  return n;
}

/* POST path body on node n; asserts the status. */
static void post_expect(cph_test_cluster *c, int n, const char *path, const char *body,
                        int status) {
  cph_test_response r = cph_test_api(c->port[n], "POST", path, NULL, body);
  if (r.status != status)
    fail_msg("POST %s on n%d: %d, want %d: %s", path, n, r.status, status,
             r.body ? r.body : "");
  cph_test_response_free(&r);
}

/* Fails turn (leased on node n) with `error`; the answer must be 200. */
static void fail_turn(cph_test_cluster *c, int n, const json_t *turn, const char *error) {
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/fail",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"error\":\"%s\"}",
           json_string_value(json_object_get(turn, "lease")), error);
  post_expect(c, n, path, body, 200);
}

/* t00's parked turns on node n (GET /v1/turns?state=parked): how many; the id, attempts and
 * error of the last one into *id, *attempts and error (64 bytes), its input into input (512
 * bytes, from GET /v1/turns/{id}). */
static int parked_of_t00(cph_test_cluster *c, int n, long long *id, int *attempts, char *error,
                         char *input) {
  cph_test_response r = cph_test_api(c->port[n], "GET", "/v1/turns?state=parked", NULL, NULL);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  int found = 0;
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(j, "turns"), i, t) {
    if (strcmp(json_string_value(json_object_get(t, "session")), "t00") != 0)
      continue;
    found++;
    *id = json_integer_value(json_object_get(t, "id"));
    *attempts = (int)json_integer_value(json_object_get(t, "attempts"));
    const char *e = json_string_value(json_object_get(t, "error"));
    snprintf(error, 64, "%s", e ? e : "");
    assert_int_equal(json_array_size(json_object_get(t, "inbox_ids")), 2);
  }
  json_decref(j);
  if (found) {
    char path[64];
    snprintf(path, sizeof path, "/v1/turns/%lld", *id);
    r = cph_test_api(c->port[n], "GET", path, NULL, NULL);
    assert_int_equal(r.status, 200);
    j = cph_test_json(&r);
    cph_test_response_free(&r);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "parked");
    const char *in = json_string_value(json_object_get(j, "input"));
    snprintf(input, 512, "%s", in ? in : "");
    json_decref(j);
  }
  return found;
}

/* The parked turn as node n lists it: once, attempts 2, the worker's error and both texts. */
static long long expect_parked(cph_test_cluster *c, int n, const char *when) {
  long long id = 0;
  int attempts = 0;
  char error[64] = "", input[512] = "";
  int found = parked_of_t00(c, n, &id, &attempts, error, input);
  if (found != 1)
    fail_msg("%s: n%d lists %d parked turns of t00, not 1", when, n, found);
  if (attempts != 2 || strcmp(error, "model down") != 0 || !strstr(input, PARKED_TEXT[0]) ||
      !strstr(input, PARKED_TEXT[1]) || strstr(input, FRESH_TEXT))
    fail_msg("%s: n%d lists t00's parked turn %lld with attempts %d, error \"%s\", input "
             "\"%s\"",
             when, n, id, attempts, error, input);
  return id;
}

/* No lease on node n carries anything of t00 for ms milliseconds. */
static void expect_nothing(cph_test_cluster *c, int n, int ms, const char *when) {
  for (int64_t until = cph_test_now_ms() + ms; cph_test_now_ms() < until;) {
    json_t *turn = lease(c, n, 300, 0);
    if (!turn)
      continue;
    const char *s = json_string_value(json_object_get(turn, "session"));
    char *dump = json_dumps(json_object_get(turn, "staged"), JSON_COMPACT);
    fail_msg("%s: n%d leased a turn of %s: %s", when, n, s ? s : "?", dump ? dump : "?");
  }
}

/* GET /v1/cluster log.parks.<name> on node n. */
static long long parks_count(cph_test_cluster *c, int n, const char *name) {
  json_t *v = cph_tc_view(c, n);
  json_t *parks = json_object_get(json_object_get(v, "log"), "parks");
  if (!json_is_integer(json_object_get(parks, name)))
    fail_msg("n%d's GET /v1/cluster has no log.parks.%s", n, name);
  long long x = json_integer_value(json_object_get(parks, name));
  json_decref(v);
  return x;
}

/* Waits until the nodes up serve and have bound every shard. */
static void settle(cph_test_cluster *c, const char *what) {
  cph_tc_settle(c, SHARDS, what);
}

static int setup(void **state) {
  bench *b = calloc(1, sizeof *b);
  b->c = cph_tc_up_t(NODES, SHARDS, TTL_S, EXTRA, SESSIONS, b->owner);
  b->parker = b->owner[0];
  b->survivor = 1 - b->parker;
  *state = b;
  return 0;
}

static int teardown(void **state) {
  bench *b = *state;
  if (!b)
    return 0;
  cph_tc_free(b->c);
  if (b->parker_dir)
    cph_test_rmtree(b->parker_dir);
  free(b->parker_dir);
  free(b);
  return 0;
}

static void test_cluster_park_a_parked_turn_stays_parked_on_the_new_owner_until_requeued(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int p = b->parker, s = b->survivor;
  char events[800];
  snprintf(events, sizeof events,
           "{\"session\":\"t00\",\"sender\":\"ann\",\"body\":\"%s\",\"key\":\"park-1\"},"
           "{\"session\":\"t00\",\"sender\":\"bob\",\"body\":\"%s\",\"key\":\"park-2\"}",
           PARKED_TEXT[0], PARKED_TEXT[1]);
  long long pos = post_events(c, p, events);
  /* two attempts, both failed: parked after the second (:max-attempts 2) */
  for (int attempt = 1; attempt <= 2; attempt++) {
    json_t *turn = lease(c, p, 5000, pos);
    if (!turn)
      fail_msg("attempt %d: no turn of t00 on n%d within 5 s", attempt, p);
    assert_string_equal(json_string_value(json_object_get(turn, "session")), "t00");
    assert_int_equal(staged_with(turn, PARKED_TEXT[0]), 1);
    assert_int_equal(staged_with(turn, PARKED_TEXT[1]), 1);
    fail_turn(c, p, turn, "model down");
    json_decref(turn);
  }
  b->parker_turn = expect_parked(c, p, "on the node that parked it");
  assert_int_equal(parks_count(c, p, "park_marks"), 1); /* the second fail's, waited for */
  snprintf(events, sizeof events,
           "{\"session\":\"t00\",\"sender\":\"cy\",\"body\":\"%s\",\"key\":\"fresh-3\"}",
           FRESH_TEXT);
  post_events(c, p, events); /* staged there, and left so */

  b->parker_dir = cph_tc_kill_node(c, p, true);
  settle(c, "after the kill of the node that parked it");
  long long id = expect_parked(c, s, "after the takeover");
  /* the parked input is not delivered: t00's next turn carries the fresh event alone */
  json_t *turn = lease(c, s, 5000, 0);
  if (!turn)
    fail_msg("no turn of t00 on n%d within 5 s after the takeover", s);
  assert_string_equal(json_string_value(json_object_get(turn, "session")), "t00");
  if (staged_with(turn, FRESH_TEXT) != 1 || staged_with(turn, "parked ") != 0 ||
      json_array_size(json_object_get(turn, "staged")) != 1) {
    char *dump = json_dumps(json_object_get(turn, "staged"), JSON_COMPACT);
    fail_msg("t00's first turn on n%d after the takeover carries %s, want the fresh event "
             "alone",
             s, dump ? dump : "?");
  }
  cph_tc_complete(c, s, turn, "on it");
  json_decref(turn);
  expect_nothing(c, s, 1500, "after the takeover");
  assert_true(parks_count(c, s, "rebuilt") >= 1);
  printf("n%d killed -9: t00's turn is parked on n%d (turn %lld), its input not delivered\n", p,
         s, id);

  /* the same node restarted on its data holds it parked still */
  cph_tc_kill_restart_node(c, s, SHARDS, TTL_S, EXTRA);
  settle(c, "after the restart");
  long long again = expect_parked(c, s, "after a restart of the node holding it");
  assert_int_equal(again, id);
  expect_nothing(c, s, 1500, "after the restart");

  /* a requeue there brings the input back: one turn carries both texts, once each */
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", id);
  post_expect(c, s, path, "{}", 200);
  turn = lease(c, s, 5000, 0);
  if (!turn)
    fail_msg("no turn of t00 on n%d within 5 s after the requeue", s);
  if (staged_with(turn, PARKED_TEXT[0]) != 1 || staged_with(turn, PARKED_TEXT[1]) != 1 ||
      json_array_size(json_object_get(turn, "staged")) != 2) {
    char *dump = json_dumps(json_object_get(turn, "staged"), JSON_COMPACT);
    fail_msg("t00's turn on n%d after the requeue carries %s, want both parked texts once",
             s, dump ? dump : "?");
  }
  cph_tc_complete(c, s, turn, "fixed");
  json_decref(turn);
  long long none_id = 0;
  int attempts = 0;
  char error[64], input[512];
  assert_int_equal(parked_of_t00(c, s, &none_id, &attempts, error, input), 0);
  expect_nothing(c, s, 1000, "after the requeued turn completed");
  assert_int_equal(parks_count(c, s, "unpark_marks"), 1);
  printf("requeued on n%d: its one turn carried both texts once, and completed\n", s);
}

/* The node that parked the turn comes back on its data, still holding its own copy of it:
 * wherever t00 is served, no node lists it parked, none delivers its input again, and the stale
 * copy is not requeued (409). Then the survivor is killed -9 and that node serves t00 again: its
 * rebuild takes the copy off its parked list (its input was consumed elsewhere), and nothing of
 * the shard stays pending. */
static void test_cluster_park_the_node_that_parked_it_neither_lists_nor_delivers_it_again(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int p = b->parker, s = b->survivor;
  assert_non_null(b->parker_dir);
  cph_tc_start_node_on(c, p, SHARDS, TTL_S, EXTRA, b->parker_dir);
  b->parker_dir = NULL;
  settle(c, "the node that parked it came back");
  long long id = 0;
  int attempts = 0;
  char error[64], input[512], path[64];
  for (int n = 0; n < NODES; n++) {
    if (parked_of_t00(c, n, &id, &attempts, error, input) != 0)
      fail_msg("n%d lists t00's turn %lld parked after n%d came back", n, id, p);
    expect_nothing(c, n, 1000, "after the node that parked it came back");
  }
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", b->parker_turn);
  post_expect(c, p, path, "{}", 409);

  cph_tc_kill_node(c, s, false);
  settle(c, "after the kill of the survivor");
  if (parked_of_t00(c, p, &id, &attempts, error, input) != 0)
    fail_msg("n%d lists t00's turn %lld parked after it took t00 back", p, id);
  expect_nothing(c, p, 1500, "after the node that parked it took t00 back");
  post_expect(c, p, path, "{}", 409);
  json_t *v = cph_tc_view(c, p);
  json_int_t pending = json_integer_value(
      json_object_get(json_object_get(json_object_get(v, "log"), "rebuild"), "pending"));
  json_decref(v);
  assert_int_equal(pending, 0);
  printf("n%d came back and took t00 again: its stale parked turn %lld neither listed nor "
         "delivered, nothing pending\n",
         p, b->parker_turn);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_park_a_parked_turn_stays_parked_on_the_new_owner_until_requeued),
      cmocka_unit_test(
          test_cluster_park_the_node_that_parked_it_neither_lists_nor_delivers_it_again),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
