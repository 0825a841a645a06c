/* Cluster mode: a completion whose session state the log did not take answers 503, and the same
 * completion sent again puts the state and the done mark (server/clusterflow.h 11.) — a real
 * etcd, one NATS server and two cephalond on 127.0.0.1.
 *
 * Node n1 starts with the test hook CPH_TEST_FAIL_STATES=1 (server/clusterflow.c): its first
 * session state fails unsent, as if the log had not answered. A session on n1 gets a question;
 * its turn's completion answers 503, and the same completion sent again (what cephalon-worker
 * does on a 503) answers 200 with "already": true. n1 is then killed -9 and n0 takes the
 * session over: its next turn there carries only the next question — the first was consumed,
 * not delivered again — and shows the first question and its reply once each. Without the
 * second completion the test fails (checked): n0's next turn carries the first question
 * again. */
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

#define NODES 2
#define SHARDS 16
#define TTL_S 2
#define SESSIONS 8

static const char EXTRA[] = ":scheduler {:lanes {:interactive {:turns 1000000}}}";

/* Posts body as session's question through node n (asserted 200). */
static void ask(cph_test_cluster *c, int n, const char *session, const char *body) {
  char req[256];
  snprintf(req, sizeof req,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", session,
           body);
  cph_test_response r = cph_test_api(c->port[n], "POST", "/v1/events", NULL, req);
  if (r.status != 200)
    fail_msg("posting '%s' on n%d: %d %s", body, n, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
}

/* How many of the lease's messages have exactly this content. */
static int messages_with(json_t *turn, const char *content) {
  json_t *messages = json_object_get(turn, "messages");
  int count = 0;
  for (size_t i = 0; i < json_array_size(messages); i++) {
    const char *m = json_string_value(json_object_get(json_array_get(messages, i), "content"));
    count += m && strcmp(m, content) == 0;
  }
  return count;
}

static void test_cluster_stateretry_a_completion_sent_again_puts_its_state(void **state) {
  (void)state;
  cph_test_cluster *c = cph_tc_new();
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  cph_tc_start_node(c, 0, SHARDS, TTL_S, EXTRA);
  setenv("CPH_TEST_FAIL_STATES", "1", 1); /* n1's environment only */
  cph_tc_start_node(c, 1, SHARDS, TTL_S, EXTRA);
  unsetenv("CPH_TEST_FAIL_STATES");
  cph_tc_settle(c, SHARDS, "start");
  const char *session = NULL;
  char ids[SESSIONS][8];
  for (int s = 0; s < SESSIONS; s++) {
    snprintf(ids[s], sizeof ids[s], "t%02d", s);
    char body[96];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", ids[s]);
    if (cph_tc_post_on_owner(c, s % NODES, "/v1/sessions", body) == 1 && !session)
      session = ids[s];
  }
  assert_non_null(session); /* one of them is n1's */
  cph_tc_wait_known(c, SESSIONS);

  ask(c, 1, session, "question one");
  json_t *lease = cph_tc_lease_of(c, 1, session, "the first lease");
  json_t *turn = json_object_get(lease, "turn");
  cph_test_response r = cph_tc_complete_try(c, 1, turn, "the first answer", 10, 0);
  if (r.status != 503)
    fail_msg("the completion whose state failed: %d %s, want 503", r.status,
             r.body ? r.body : "");
  printf("the completion whose state failed answered 503: %s\n", r.body ? r.body : "");
  cph_test_response_free(&r);
  r = cph_tc_complete_try(c, 1, turn, "the first answer", 10, 0);
  if (r.status != 200)
    fail_msg("the completion sent again: %d %s, want 200", r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  assert_true(json_is_true(json_object_get(j, "already")));
  json_decref(j);
  cph_test_response_free(&r);
  json_decref(lease);

  cph_tc_kill_node(c, 1, false);
  cph_tc_settle(c, SHARDS, "after the kill");
  ask(c, 0, session, "question two");
  lease = cph_tc_lease_of(c, 0, session, "the lease on the new owner");
  turn = json_object_get(lease, "turn");
  const char *input = json_string_value(json_object_get(turn, "input"));
  if (!input || strcmp(input, "inbox:question two") != 0)
    fail_msg("the new owner's turn carries '%s', want only the second question (the first "
             "was consumed)",
             input ? input : "(none)");
  if (messages_with(turn, "the first answer") != 1 || messages_with(turn, "question one") != 1)
    fail_msg("the new owner's turn shows the first answer %d times and the first question %d "
             "times, want once each",
             messages_with(turn, "the first answer"), messages_with(turn, "question one"));
  printf("after the kill -9 the new owner's turn carries only '%s' and shows the first reply "
         "once\n",
         input);
  json_decref(lease);
  cph_tc_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_stateretry_a_completion_sent_again_puts_its_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
