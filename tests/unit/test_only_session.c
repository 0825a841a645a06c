/* cph_event_in.only_session (include/cephalon/cephalon.h), what cluster mode applies logged
 * events with (server/clusterflow.h): the event is stored in its channel's history as any, but
 * reaches only its named session — mentioned when it is among the mentions — and never the
 * channel's subscribers or the other mentioned sessions (the log delivers to those). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "tests/support/engine_fixture.h"

static void create(cph_fixture *f, const char *id, const char *subscribe) {
  cph_op op = {0};
  char *subs[] = {(char *)subscribe};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  if (subscribe) {
    op.u.session.in.subscribe.items = subs;
    op.u.session.in.subscribe.count = 1;
  }
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  cph_op_clear_results(&op);
}

/* Ingests one event; returns its result's status and fills reached (comma-joined). */
static cph_ingest_status ingest(cph_fixture *f, cph_event_in *ev, char *reached, size_t size) {
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = ev;
  op.u.ingest.n_events = 1;
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  cph_event_result *res = &op.u.ingest.results[0];
  reached[0] = '\0';
  for (size_t i = 0; i < res->sessions.count; i++) {
    if (i)
      strncat(reached, ",", size - strlen(reached) - 1);
    strncat(reached, res->sessions.items[i], size - strlen(reached) - 1);
  }
  cph_ingest_status st = res->status;
  cph_op_clear_results(&op);
  return st;
}

static void test_only_session_reaches_the_named_session_alone(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("only_session", "{}");
  create(f, "a", "general");
  create(f, "b", "general");
  create(f, "m", NULL);
  char reached[128];

  /* Without the flag: the channel's subscribers and the mention. */
  cph_event_in plain = {0};
  plain.channel = "general";
  plain.sender = "ann";
  plain.body = "hello everyone";
  char *mentions[] = {"m"};
  plain.mentions.items = mentions;
  plain.mentions.count = 1;
  assert_int_equal(ingest(f, &plain, reached, sizeof reached), CPH_EV_QUEUED);
  assert_int_equal(strlen(reached), strlen("a,b,m"));

  /* With it and no session: stored in the channel, reaching nobody. */
  cph_event_in none = plain;
  none.body = "hello again, quietly";
  none.only_session = true;
  assert_int_equal(ingest(f, &none, reached, sizeof reached), CPH_EV_STORED);
  assert_string_equal(reached, "");

  /* With a session: that one only, even when others are mentioned. */
  cph_event_in one = plain;
  one.body = "for a, mentioning a and m";
  one.session = "a";
  char *both[] = {"a", "m"};
  one.mentions.items = both;
  one.mentions.count = 2;
  one.only_session = true;
  assert_int_equal(ingest(f, &one, reached, sizeof reached), CPH_EV_QUEUED);
  assert_string_equal(reached, "a");
  cph_fixture_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_only_session_reaches_the_named_session_alone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
