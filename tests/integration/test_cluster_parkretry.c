/* Cluster mode: a park mark the log did not take is sent again until it does (server/
 * clusterflow.h 6.), so the node that takes the session over holds the turn parked — a real
 * etcd, NATS JetStream and three cephalond on 127.0.0.1, with :leases :max-attempts 2.
 *
 * The nodes start with the test hook CPH_TEST_FAIL_PARK_MARKS=2: the first two park marks each
 * sends fail unsent, as a mark the log did not take in time does. A turn that fails twice
 * parks, and that second fail answers 503, saying the mark is sent again:
 *   - on one node, session B's turn parks: its park mark is not taken by its first attempt nor
 *     by the resend 1 s later, and is taken by the next, 2 s after that (log.parks there: 2
 *     failures, 2 retries, one park mark);
 *   - on another, session A's turn parks and is requeued at once (its unpark mark taken) and
 *     left staged: its park mark, due again a second later, is given up (the turn is no longer
 *     parked), so no park mark lands after the unpark;
 *   - on A's node, session C's turn (its lane of its own) parks, its mark's first attempt
 *     fails, and the node is stopped (SIGTERM) at once: its stop sends the mark now and waits
 *     for the log (before, a stop dropped it: the third node listed nothing of C parked).
 * Then B's node is killed -9. On the third, which took all three sessions over: B's and C's
 * turns are listed parked with their texts (B's with its attempts and error); A's is not, and
 * A's next turn there carries its text once; nothing more is leased. Before resends B's mark
 * was counted and dropped: the survivor listed nothing parked (the test fails there); with A's
 * resend not given up after its requeue, it landed after the unpark and the survivor listed
 * A's turn parked (checked). Without etcd or nats-server the test fails and says what to
 * install. */
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
#include "tests/support/testutil.h"

#define NODES 3
#define SHARDS 8
#define TTL_S 2
#define SESSIONS 6

static const char EXTRA[] =
    ":leases {:max-attempts 2 :ttl-seconds 2}\n"
    " :scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}";

static const char A_TEXT[] = "alpha: requeued before its mark went again";
static const char B_TEXT[] = "bravo: parked while the log was away";
static const char C_TEXT[] = "charlie: parked just before its node stopped";
static const char D_TEXT[] = "delta: parked again before its unpark mark went again";
static const char E_TEXT[] = "echo: requeued while the log was away";

/* POST path body on node n; asserts the status, returns the answer's body (malloc'd). */
static char *post_expect(cph_test_cluster *c, int n, const char *path, const char *body,
                         int status) {
  cph_test_response r = cph_test_api(c->port[n], "POST", path, NULL, body);
  if (r.status != status)
    fail_msg("POST %s on n%d: %d, want %d: %s", path, n, r.status, status,
             r.body ? r.body : "");
  char *out = strdup(r.body ? r.body : "");
  cph_test_response_free(&r);
  return out;
}

/* One event of session s with text on node n; the log position of its answer. */
static long long post_one(cph_test_cluster *c, int n, const char *s, const char *text,
                          const char *key) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\",\"key\":\"%s\"}]}",
           s, text, key);
  char *a = post_expect(c, n, "/v1/events", body, 200);
  json_t *j = json_loads(a, 0, NULL);
  free(a);
  long long pos = json_integer_value(
      json_object_get(json_array_get(json_object_get(j, "events"), 0), "pos"));
  json_decref(j);
  return pos;
}

/* A turn of session s leased on node n within 5 s (min_pos pos; of lane `lane` only, when
 * given), or the test fails. */
static json_t *lease_of(cph_test_cluster *c, int n, const char *s, long long pos,
                        const char *lane) {
  char body[200], lanes[64] = "";
  if (lane)
    snprintf(lanes, sizeof lanes, ",\"lanes\":[\"%s\"]", lane);
  snprintf(body, sizeof body, "{\"worker\":\"w\",\"wait_ms\":5000,\"min_pos\":%lld%s}", pos,
           lanes);
  cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/turns/lease", NULL, body);
  if (r.status != 200)
    fail_msg("lease of %s on n%d: %d %s", s, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  json_t *turn = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  assert_non_null(turn);
  assert_string_equal(json_string_value(json_object_get(turn, "session")), s);
  return turn;
}

/* Fails turn on node n with error `model down`, expecting status; the answer's body. */
static char *fail_turn(cph_test_cluster *c, int n, const json_t *turn, int status) {
  char path[96], body[256];
  snprintf(path, sizeof path, "/v1/turns/%lld/fail",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, sizeof body, "{\"lease\":\"%s\",\"error\":\"model down\"}",
           json_string_value(json_object_get(turn, "lease")));
  return post_expect(c, n, path, body, status);
}

/* Session s (of lane `lane`, or NULL) gets a turn on node n that fails twice (parked after the
 * second, whose answer is `parked`: 503 when its mark is not taken, saying it is sent again);
 * the parked turn's id. */
static long long park_one(cph_test_cluster *c, int n, const char *s, long long pos,
                          const char *lane, int parked) {
  long long id = 0;
  for (int attempt = 1; attempt <= 2; attempt++) {
    json_t *turn = lease_of(c, n, s, pos, lane);
    id = json_integer_value(json_object_get(turn, "id"));
    char *answer = fail_turn(c, n, turn, attempt == 1 ? 200 : parked);
    if (attempt == 2 && parked == 503 && !strstr(answer, "sent again until the log takes it"))
      fail_msg("the fail that parked %s's turn on n%d answered %s", s, n, answer);
    free(answer);
    json_decref(turn);
  }
  return id;
}

/* A new operational-lane session u00, u01, ... that lands on node n (the sessions made on
 * the way stay, on their nodes), its id into id; `known`: how many sessions the nodes knew
 * before. */
static void operational_session_on(cph_test_cluster *c, int n, int known, char *id,
                                   size_t size) {
  id[0] = '\0';
  for (int i = 0; !id[0]; i++) {
    assert_true(i < 40);
    char body[96], made[16];
    snprintf(made, sizeof made, "u%02d", i);
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"operational\"}", made);
    if (cph_tc_post_on_owner(c, n, "/v1/sessions", body) == n)
      snprintf(id, size, "%s", made);
    cph_tc_wait_known(c, known + i + 1);
  }
}

/* GET /v1/cluster log.parks.<name> on node n. */
static long long parks(cph_test_cluster *c, int n, const char *name) {
  return cph_tc_log_counter(c, n, "parks", name);
}

/* Waits up to ms for log.parks.<name> on node n to be want. */
static void parks_reach(cph_test_cluster *c, int n, const char *name, long long want, int ms) {
  for (int64_t until = cph_test_now_ms() + ms; parks(c, n, name) != want;) {
    if (cph_test_now_ms() > until)
      fail_msg("n%d's log.parks.%s is %lld after %d ms, not %lld (failures %lld, retries %lld, "
               "pending %lld, given up %lld)",
               n, name, parks(c, n, name), ms, want, parks(c, n, "failures"),
               parks(c, n, "retries"), parks(c, n, "pending"), parks(c, n, "given_up"));
    cph_tc_sleep_ms(100);
  }
}

/* Node n's parked turns of session s: how many, and the last one's attempts, error, input. */
static int parked_of(cph_test_cluster *c, int n, const char *s, int *attempts, char *error,
                     size_t error_size, char *input, size_t input_size) {
  cph_test_response r = cph_test_api(c->port[n], "GET", "/v1/turns?state=parked", NULL, NULL);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  int found = 0;
  size_t i;
  json_t *t;
  json_array_foreach(json_object_get(j, "turns"), i, t) {
    if (strcmp(json_string_value(json_object_get(t, "session")), s) != 0)
      continue;
    found++;
    *attempts = (int)json_integer_value(json_object_get(t, "attempts"));
    const char *e = json_string_value(json_object_get(t, "error"));
    snprintf(error, error_size, "%s", e ? e : "");
    char path[64];
    snprintf(path, sizeof path, "/v1/turns/%lld",
             (long long)json_integer_value(json_object_get(t, "id")));
    cph_test_response g = cph_test_api(c->port[n], "GET", path, NULL, NULL);
    assert_int_equal(g.status, 200);
    json_t *rec = cph_test_json(&g);
    cph_test_response_free(&g);
    const char *in = json_string_value(json_object_get(rec, "input"));
    snprintf(input, input_size, "%s", in ? in : "");
    json_decref(rec);
  }
  json_decref(j);
  return found;
}

static void test_cluster_parkretry_a_park_mark_not_taken_is_sent_again(void **state) {
  (void)state;
  int owner[SESSIONS];
  setenv("CPH_TEST_FAIL_PARK_MARKS", "2", 1); /* the nodes' environment only */
  cph_test_cluster *c = cph_tc_up_t(NODES, SHARDS, TTL_S, EXTRA, SESSIONS, owner);
  unsetenv("CPH_TEST_FAIL_PARK_MARKS");
  /* sessions A and B served by two different nodes, and the third node */
  int pa = owner[0], pb = -1;
  for (int i = 1; i < SESSIONS && pb < 0; i++)
    if (owner[i] != pa)
      pb = owner[i];
  assert_true(pb >= 0);
  char a[8] = "", b[8] = "";
  for (int i = 0; i < SESSIONS; i++) {
    if (owner[i] == pa && !a[0])
      snprintf(a, sizeof a, "t%02d", i);
    if (owner[i] == pb && !b[0])
      snprintf(b, sizeof b, "t%02d", i);
  }
  int s = 3 - pa - pb;

  /* B: parked; its mark fails once more (1 s later), then the log takes it (2 s after) */
  long long pos = post_one(c, pb, b, B_TEXT, "bravo-1");
  park_one(c, pb, b, pos, NULL, 503);
  parks_reach(c, pb, "park_marks", 1, 10000);
  assert_int_equal(parks(c, pb, "retries"), 2);
  assert_int_equal(parks(c, pb, "failures"), 2);
  assert_int_equal(parks(c, pb, "pending"), 0);

  /* A: parked (its mark not taken), requeued at once (its unpark mark taken) and left
   * staged: its park mark, due again a second later, is given up */
  pos = post_one(c, pa, a, A_TEXT, "alpha-1");
  long long a_turn = park_one(c, pa, a, pos, NULL, 503);
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", a_turn);
  free(post_expect(c, pa, path, "{}", 200));
  parks_reach(c, pa, "given_up", 1, 5000);
  assert_int_equal(parks(c, pa, "unpark_marks"), 1);
  assert_int_equal(parks(c, pa, "park_marks"), 0);
  assert_int_equal(parks(c, pa, "retries"), 0);
  printf("n%d: %s's park mark taken on its second resend; n%d: %s's given up after its "
         "requeue\n",
         pb, b, pa, a);

  /* C, another session of A's node: parked there, its mark's first attempt fails (that node's
   * hook has one failure left) and the node is stopped (SIGTERM) at once, before the mark's
   * resend is due: the stop sends it now and waits until the log took it */
  char cs[16]; /* in a lane of its own: A's requeued turn waits on that node too */
  operational_session_on(c, pa, SESSIONS, cs, sizeof cs);
  pos = post_one(c, pa, cs, C_TEXT, "charlie-1");
  park_one(c, pa, cs, pos, "operational", 503);
  int64_t t0 = cph_test_now_ms();
  int rc = cph_tc_stop_node(c, pa);
  printf("n%d: %s parked, its mark not taken; n%d stopped in %lld ms (exit %d)\n", pa, cs, pa,
         (long long)(cph_test_now_ms() - t0), rc);
  assert_int_equal(rc, 0);

  /* B's node dies: the third holds B and C parked, not A, whose text its next turn carries */
  free(cph_tc_kill_node(c, pb, false));
  cph_tc_settle(c, SHARDS, "after A's node stopped and B's was killed");
  int attempts = 0;
  char error[64], input[512];
  int n_b = parked_of(c, s, b, &attempts, error, sizeof error, input, sizeof input);
  if (n_b != 1)
    fail_msg("after the takeover: n%d lists %d parked turns of %s, not 1", s, n_b, b);
  assert_int_equal(attempts, 2);
  assert_string_equal(error, "model down");
  assert_non_null(strstr(input, B_TEXT));
  int n_c = parked_of(c, s, cs, &attempts, error, sizeof error, input, sizeof input);
  if (n_c != 1)
    fail_msg("after the takeover: n%d lists %d parked turns of %s (parked just before its node "
             "stopped), not 1",
             s, n_c, cs);
  assert_non_null(strstr(input, C_TEXT));
  int n_a = parked_of(c, s, a, &attempts, error, sizeof error, input, sizeof input);
  if (n_a != 0)
    fail_msg("after the takeover: n%d lists %s's requeued turn parked (%d)", s, a, n_a);
  json_t *turn = lease_of(c, s, a, 0, NULL);
  char *staged = json_dumps(json_object_get(turn, "staged"), JSON_COMPACT);
  if (json_array_size(json_object_get(turn, "staged")) != 1 || !strstr(staged, A_TEXT))
    fail_msg("after the takeover: %s's turn on n%d carries %s, want its text once", a, s, staged);
  free(staged);
  cph_tc_complete(c, s, turn, "alpha done");
  json_decref(turn);
  for (int64_t until = cph_test_now_ms() + 2000; cph_test_now_ms() < until;) {
    cph_test_response r = cph_test_api(c->port[s], "POST", "/v1/turns/lease", NULL,
                                       "{\"worker\":\"w\",\"wait_ms\":300}");
    if (r.status == 200)
      fail_msg("after the takeover: n%d leased another turn: %s", s, r.body ? r.body : "");
    assert_int_equal(r.status, 204);
    cph_test_response_free(&r);
  }
  printf("n%d stopped and n%d killed -9: n%d lists %s's and %s's turns parked with their texts, "
         "delivers %s's requeued input once, and nothing more\n",
         pa, pb, s, b, cs, a);
  cph_tc_free(c);
}

/* Requeues turn `turn` on node n, whose unpark mark the hook fails: 503, saying it is sent
 * again. */
static void requeue_unlogged(cph_test_cluster *c, int n, long long turn) {
  char path[64];
  snprintf(path, sizeof path, "/v1/turns/%lld/requeue", turn);
  char *answer = post_expect(c, n, path, "{}", 503);
  if (!strstr(answer, "unpark mark") || !strstr(answer, "sent again until the log takes it"))
    fail_msg("the requeue whose unpark mark was not taken answered %s", answer);
  free(answer);
}

/* The nodes start with CPH_TEST_FAIL_UNPARK_MARKS=2: each node's first two unpark mark
 * attempts fail unsent. On one node, session E's turn (a lane of its own) parks (its park mark
 * taken) and is requeued: the requeue answers 503, saying the unpark mark is sent again, and
 * the resend, a second later, is taken. Session D's turn on the same node parks and is
 * requeued the same way, but before its unpark mark goes again D's next turn takes that input
 * and parks it again (its own park mark taken): D's unpark mark is given up — landing after
 * that park mark it would have unparked the input. The node is killed -9: the node that takes
 * both sessions over lists nothing of E parked and leases E's text once, and lists D's turn
 * parked with its text. Before unpark marks were sent again it held E's input parked; with
 * D's resend not given up it listed nothing of D parked (both checked). */
static void test_cluster_parkretry_an_unpark_mark_not_taken_is_sent_again(void **state) {
  (void)state;
  int owner[2];
  setenv("CPH_TEST_FAIL_UNPARK_MARKS", "2", 1); /* the nodes' environment only */
  cph_test_cluster *c = cph_tc_up_t(2, SHARDS, TTL_S, EXTRA, 2, owner);
  unsetenv("CPH_TEST_FAIL_UNPARK_MARKS");
  const char *d = "t00";
  int x = owner[0], other = 1 - x;
  char e[16]; /* in a lane of its own, so that D's leases do not take its input */
  operational_session_on(c, x, 2, e, sizeof e);
  long long pos = post_one(c, x, e, E_TEXT, "echo-1");
  requeue_unlogged(c, x, park_one(c, x, e, pos, "operational", 200));
  pos = post_one(c, x, d, D_TEXT, "delta-1");
  requeue_unlogged(c, x, park_one(c, x, d, pos, "interactive", 200));
  park_one(c, x, d, 0, "interactive", 200); /* the requeued input, parked again at once */
  parks_reach(c, x, "unpark_marks", 1, 10000);
  parks_reach(c, x, "given_up", 1, 10000);
  assert_int_equal(parks(c, x, "retries"), 1);
  assert_int_equal(parks(c, x, "pending"), 0);
  assert_int_equal(parks(c, x, "park_marks"), 3);
  printf("n%d: %s's unpark mark taken on its first resend, %s's given up (parked again)\n", x,
         e, d);

  free(cph_tc_kill_node(c, x, false));
  cph_tc_settle(c, SHARDS, "after their node was killed");
  int attempts = 0;
  char error[64], input[512];
  int n_e = parked_of(c, other, e, &attempts, error, sizeof error, input, sizeof input);
  if (n_e != 0)
    fail_msg("after the takeover: n%d lists %d parked turns of %s, requeued before its node "
             "died; want none",
             other, n_e, e);
  int n_d = parked_of(c, other, d, &attempts, error, sizeof error, input, sizeof input);
  if (n_d != 1 || !strstr(input, D_TEXT))
    fail_msg("after the takeover: n%d lists %d parked turns of %s (input %s), parked again "
             "after its requeue; want 1 with its text",
             other, n_d, d, input);
  json_t *turn = lease_of(c, other, e, 0, "operational");
  char *staged = json_dumps(json_object_get(turn, "staged"), JSON_COMPACT);
  if (json_array_size(json_object_get(turn, "staged")) != 1 || !strstr(staged, E_TEXT))
    fail_msg("after the takeover: %s's turn on n%d carries %s, want its text once", e, other,
             staged);
  free(staged);
  cph_tc_complete(c, other, turn, "echo done");
  json_decref(turn);
  printf("n%d killed -9: n%d leases %s's requeued input once and lists %s's turn parked\n", x,
         other, e, d);
  cph_tc_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_parkretry_a_park_mark_not_taken_is_sent_again),
      cmocka_unit_test(test_cluster_parkretry_an_unpark_mark_not_taken_is_sent_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
