/* Cluster mode: a parked turn survives a takeover as a parked turn (server/clusterflow.h 6.,
 * 8.) — a real etcd, NATS JetStream and two cephalond on 127.0.0.1, with :leases :max-attempts 2
 * and a lease TTL of 2 s.
 *
 * On the node that owns session t00, two events get a turn that fails twice and is parked
 * (each fail answered 200 once the log held its marks); a third event gets a turn whose lease
 * expires twice, parked too (its park mark logged after the pass, not waited for); a fourth
 * event arrives after that and is left staged. GET /v1/turns?state=parked lists both there.
 * That node is killed -9. On the survivor, which took t00 over:
 *   - both turns are listed parked, each with its attempts, error and input;
 *   - both are among t00's ended turns (GET /v1/turns?session=), parked, under the origins
 *     they had on the node that parked them, and their kept contexts show their texts (the
 *     records and contexts moved as items — the fail's, and the expiry's taken after its
 *     pass — as history: the turns listed parked above are the survivor's own);
 *   - no lease carries parked input: the next lease of t00 carries the fourth event only, and
 *     nothing more comes;
 *   - the survivor, killed -9 and started again on its data, holds them parked still;
 *   - a requeue there of the failed turn (answered 200 once the log held its unpark mark)
 *     brings its input back: the next lease carries both its texts, each once; completing it
 *     consumes them. The expired one stays parked.
 * Then the node that parked them comes back on its data, still holding its own copies, and the
 * survivor is killed -9, so that node serves t00 again: it lists the turn still parked and not
 * the one requeued and consumed elsewhere, delivers nothing again, refuses to requeue the stale
 * copy, and nothing of the shard is pending but the parked input. Before park marks the
 * survivor delivered the parked input to a turn at once and listed no parked turn: the test
 * fails there. Without etcd or nats-server the test fails and says what to install. */
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
    ":leases {:max-attempts 2 :ttl-seconds 2}\n"
    " :scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

static const char *const PARKED_TEXT[2] = {"parked one: the build is red",
                                           "parked two: please look"};
static const char EXPIRED_TEXT[] = "expired three: nobody came back";
static const char FRESH_TEXT[] = "fresh four: after the parks";

typedef struct bench {
  cph_test_cluster *c;
  int owner[SESSIONS];
  int parker, survivor; /* the node that parked the turn, the one that took t00 over */
  char *parker_dir;     /* its data, while it is down */
  long long failed_turn, expired_turn; /* the parked turns' ids on the node that parked them */
} bench;

/* POSTs events (a JSON array's inside) through node n; asserts 200 and every event accepted.
 * Returns the highest log position of the answer. */
/* method path (with body) on node n answered 200: its JSON (a new reference), or the test
 * fails saying what it answered. */
static json_t *api_ok(cph_test_cluster *c, int n, const char *method, const char *path,
                      const char *body) {
  cph_test_response r = cph_test_api(c->port[n], method, path, NULL, body);
  if (r.status != 200)
    fail_msg("%s %s on n%d: %d %s", method, path, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  return j;
}

static long long post_events(cph_test_cluster *c, int n, const char *events) {
  char body[1024];
  snprintf(body, sizeof body, "{\"events\":[%s]}", events);
  json_t *j = api_ok(c, n, "POST", "/v1/events", body);
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

/* A parked turn of t00 as GET /v1/turns?state=parked (and GET /v1/turns/{id}) show it. */
typedef struct parked {
  long long id;
  int attempts;
  size_t entries;
  char error[64], input[512];
} parked;

/* t00's parked turns on node n: how many (at most 4) into out[]. */
static int parked_of_t00(cph_test_cluster *c, int n, parked *out) {
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
    assert_true(found < 4);
    parked *o = &out[found++];
    o->id = json_integer_value(json_object_get(t, "id"));
    o->attempts = (int)json_integer_value(json_object_get(t, "attempts"));
    o->entries = json_array_size(json_object_get(t, "inbox_ids"));
    const char *e = json_string_value(json_object_get(t, "error"));
    snprintf(o->error, sizeof o->error, "%s", e ? e : "");
    char path[64];
    snprintf(path, sizeof path, "/v1/turns/%lld", o->id);
    cph_test_response g = cph_test_api(c->port[n], "GET", path, NULL, NULL);
    assert_int_equal(g.status, 200);
    json_t *rec = cph_test_json(&g);
    cph_test_response_free(&g);
    assert_string_equal(json_string_value(json_object_get(rec, "state")), "parked");
    const char *in = json_string_value(json_object_get(rec, "input"));
    snprintf(o->input, sizeof o->input, "%s", in ? in : "");
    json_decref(rec);
  }
  json_decref(j);
  return found;
}

/* Among got[0..n): the one turn parked with `error` — attempts 2, one entry per text of
 * texts[0..n_texts), its input showing each and nothing of the fresh event; its id, or the
 * test fails saying `when`. */
static long long find_parked(const parked *got, int n, int node, const char *error,
                             const char *const *texts, size_t n_texts, const char *when) {
  const parked *p = NULL;
  for (int i = 0; i < n; i++)
    if (strcmp(got[i].error, error) == 0) {
      if (p)
        fail_msg("%s: n%d lists two parked turns of t00 with error \"%s\"", when, node, error);
      p = &got[i];
    }
  if (!p)
    fail_msg("%s: n%d lists no parked turn of t00 with error \"%s\" (%d others)", when, node,
             error, n);
  bool texts_ok = p->entries == n_texts && !strstr(p->input, FRESH_TEXT);
  for (size_t k = 0; k < n_texts; k++)
    texts_ok &= strstr(p->input, texts[k]) != NULL;
  if (p->attempts != 2 || !texts_ok)
    fail_msg("%s: n%d lists t00's parked turn %lld (\"%s\") with attempts %d, %zu entries, "
             "input \"%s\"",
             when, node, p->id, error, p->attempts, p->entries, p->input);
  return p->id;
}

/* Node n lists t00's two parked turns (the failed one, the expired one): exactly those.
 * Their ids into *failed and *expired. */
static void expect_parked(cph_test_cluster *c, int n, const char *when, long long *failed,
                          long long *expired) {
  parked got[4];
  int k = parked_of_t00(c, n, got);
  if (k != 2)
    fail_msg("%s: n%d lists %d parked turns of t00, not 2", when, n, k);
  static const char *const expired_texts[] = {EXPIRED_TEXT};
  *failed = find_parked(got, k, n, "model down", PARKED_TEXT, 2, when);
  *expired = find_parked(got, k, n, "lease expired", expired_texts, 1, when);
}

/* In t00's ended turns on node n (GET /v1/turns?session=t00): the one turn parked with
 * `error`, with an origin (copied into origin when it is "", else it must be that one); its
 * kept context (GET /v1/sessions/t00/turns/{id}/context) shows texts[0..n_texts). */
static void expect_parked_history(cph_test_cluster *c, int n, const char *error_want,
                                  const char *const *texts, size_t n_texts, char *origin,
                                  size_t cap, const char *when) {
  json_t *j = api_ok(c, n, "GET", "/v1/turns?session=t00", NULL);
  long long id = 0;
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(j, "turns"), i, t) {
    const char *state = json_string_value(json_object_get(t, "state"));
    const char *error = json_string_value(json_object_get(t, "error"));
    if (!state || strcmp(state, "parked") != 0 || !error || strcmp(error, error_want) != 0)
      continue;
    const char *o = json_string_value(json_object_get(t, "origin"));
    if (id || !o)
      fail_msg("%s: n%d lists %s parked turn of t00 with error \"%s\"%s", when, n,
               id ? "a second" : "a", error_want, id ? "" : " without an origin");
    if (!origin[0])
      snprintf(origin, cap, "%s", o);
    else if (strcmp(origin, o) != 0)
      fail_msg("%s: n%d lists t00's parked turn as %s, not %s", when, n, o, origin);
    id = json_integer_value(json_object_get(t, "id"));
  }
  json_decref(j);
  if (!id)
    fail_msg("%s: n%d lists no turn parked with \"%s\" among t00's ended turns", when, n,
             error_want);
  char path[96];
  snprintf(path, sizeof path, "/v1/sessions/t00/turns/%lld/context", id);
  cph_test_response k = cph_test_api(c->port[n], "GET", path, NULL, NULL);
  for (i = 0; i < n_texts; i++)
    if (k.status != 200 || !strstr(k.body, texts[i]))
      fail_msg("%s: %s on n%d: %d, %s \"%s\"", when, path, n, k.status,
               k.status == 200 ? "without" : k.body ? k.body : "", texts[i]);
  cph_test_response_free(&k);
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
  return cph_tc_log_counter(c, n, "parks", name);
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
  assert_int_equal(parks_count(c, p, "park_marks"), 1); /* the second fail's, waited for */
  /* two attempts, both leases left to expire (2 s each): parked by the expiry */
  snprintf(events, sizeof events,
           "{\"session\":\"t00\",\"sender\":\"cy\",\"body\":\"%s\",\"key\":\"exp-3\"}",
           EXPIRED_TEXT);
  pos = post_events(c, p, events);
  for (int attempt = 1; attempt <= 2; attempt++) {
    json_t *turn = lease(c, p, 8000, pos);
    if (!turn)
      fail_msg("expiring attempt %d: no turn of t00 on n%d within 8 s", attempt, p);
    assert_int_equal(staged_with(turn, EXPIRED_TEXT), 1);
    assert_int_equal(json_array_size(json_object_get(turn, "staged")), 1);
    json_decref(turn);
  }
  /* its mark is not waited for: the parker logs it after the pass that parked it */
  for (int64_t until = cph_test_now_ms() + 10000; parks_count(c, p, "park_marks") < 2;) {
    if (cph_test_now_ms() > until)
      fail_msg("n%d logged %lld park marks in 10 s, not 2", p, parks_count(c, p, "park_marks"));
    cph_tc_sleep_ms(100);
  }
  expect_parked(c, p, "on the node that parked them", &b->failed_turn, &b->expired_turn);
  snprintf(events, sizeof events,
           "{\"session\":\"t00\",\"sender\":\"dee\",\"body\":\"%s\",\"key\":\"fresh-4\"}",
           FRESH_TEXT);
  post_events(c, p, events); /* staged there, and left so */
  static const char *const expired_texts[] = {EXPIRED_TEXT};
  char origin[128] = "", expired_origin[128] = "";
  expect_parked_history(c, p, "model down", PARKED_TEXT, 2, origin, sizeof origin,
                        "on the node that parked it");
  expect_parked_history(c, p, "lease expired", expired_texts, 1, expired_origin,
                        sizeof expired_origin, "on the node that parked it");

  b->parker_dir = cph_tc_kill_node(c, p, true);
  settle(c, "after the kill of the node that parked them");
  long long failed = 0, expired = 0;
  expect_parked(c, s, "after the takeover", &failed, &expired);
  /* the parked turns' records and kept contexts moved with it, as history (the ones parked
   * there are the survivor's own, above): the failed one's as its fail's items, the expired
   * one's as the items of a turn that ended with no request */
  expect_parked_history(c, s, "model down", PARKED_TEXT, 2, origin, sizeof origin,
                        "after the takeover");
  expect_parked_history(c, s, "lease expired", expired_texts, 1, expired_origin,
                        sizeof expired_origin, "after the takeover");
  assert_int_equal(parks_count(c, s, "rebuilt"), 2);
  /* the parked input is not delivered: t00's next turn carries the fresh event alone */
  json_t *turn = lease(c, s, 5000, 0);
  if (!turn)
    fail_msg("no turn of t00 on n%d within 5 s after the takeover", s);
  assert_string_equal(json_string_value(json_object_get(turn, "session")), "t00");
  if (staged_with(turn, FRESH_TEXT) != 1 || json_array_size(json_object_get(turn, "staged")) != 1) {
    char *dump = json_dumps(json_object_get(turn, "staged"), JSON_COMPACT);
    fail_msg("t00's first turn on n%d after the takeover carries %s, want the fresh event "
             "alone",
             s, dump ? dump : "?");
  }
  cph_tc_complete(c, s, turn, "on it");
  json_decref(turn);
  expect_nothing(c, s, 1500, "after the takeover");
  printf("n%d killed -9: t00's two turns are parked on n%d (turns %lld and %lld), their input "
         "not delivered\n",
         p, s, failed, expired);

  /* the same node restarted on its data holds them parked still */
  cph_tc_kill_restart_node(c, s, SHARDS, TTL_S, EXTRA);
  settle(c, "after the restart");
  long long failed2 = 0, expired2 = 0;
  expect_parked(c, s, "after a restart of the node holding them", &failed2, &expired2);
  assert_int_equal(failed2, failed);
  assert_int_equal(expired2, expired);
  expect_nothing(c, s, 1500, "after the restart");

  /* a requeue there brings the failed turn's input back: one turn carries both texts once */
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", failed);
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
  parked got[4];
  assert_int_equal(parked_of_t00(c, s, got), 1);
  assert_int_equal(got[0].id, expired);
  expect_nothing(c, s, 1000, "after the requeued turn completed");
  assert_int_equal(parks_count(c, s, "unpark_marks"), 1);
  printf("requeued on n%d: its one turn carried both texts once, and completed\n", s);
}

/* The node that parked the turns comes back on its data, still holding its own copies of
 * both: wherever t00 is served, only the expired turn is listed parked (once, on the node
 * serving t00), nothing is delivered again, and neither stale copy is requeued on a node that
 * does not serve t00 (409). Then the survivor is killed -9 and that node serves t00 again: its
 * rebuild keeps its copy of the expired turn parked and takes the requeued one off its parked
 * list (its input was consumed elsewhere); the only events pending there are the parked one's. */
static void test_cluster_park_the_node_that_parked_them_settles_its_copies_by_the_marks(
    void **state) {
  bench *b = *state;
  cph_test_cluster *c = b->c;
  int p = b->parker, s = b->survivor;
  assert_non_null(b->parker_dir);
  cph_tc_start_node_on(c, p, SHARDS, TTL_S, EXTRA, b->parker_dir);
  b->parker_dir = NULL;
  settle(c, "the node that parked them came back");
  parked got[4];
  int listed = 0;
  for (int n = 0; n < NODES; n++) {
    int k = parked_of_t00(c, n, got);
    for (int i = 0; i < k; i++)
      if (strcmp(got[i].error, "lease expired") != 0)
        fail_msg("n%d lists t00's turn %lld (\"%s\") parked after n%d came back", n, got[i].id,
                 got[i].error, p);
    listed += k;
    expect_nothing(c, n, 1000, "after the node that parked them came back");
  }
  assert_int_equal(listed, 1);
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", b->failed_turn);
  post_expect(c, p, path, "{}", 409);

  cph_tc_kill_node(c, s, false);
  settle(c, "after the kill of the survivor");
  assert_int_equal(parked_of_t00(c, p, got), 1);
  assert_int_equal(got[0].id, b->expired_turn); /* its own copy, still parked */
  assert_string_equal(got[0].error, "lease expired");
  expect_nothing(c, p, 1500, "after the node that parked them took t00 back");
  post_expect(c, p, path, "{}", 409); /* requeued and consumed elsewhere: not parked here */
  /* the expired turn's event, held by its park */
  assert_int_equal(cph_tc_log_counter(c, p, "rebuild", "pending"), 1);
  printf("n%d came back and took t00 again: it lists its turn %lld parked still, not turn "
         "%lld (requeued and consumed on n%d), and delivers nothing\n",
         p, b->expired_turn, b->failed_turn, s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(
          test_cluster_park_a_parked_turn_stays_parked_on_the_new_owner_until_requeued),
      cmocka_unit_test(
          test_cluster_park_the_node_that_parked_them_settles_its_copies_by_the_marks),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
