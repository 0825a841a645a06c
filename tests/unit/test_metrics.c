/* Metrics (DESIGN §10): the Prometheus text writer against hand-made expected text (HELP and
 * TYPE lines, escaping, cumulative histogram buckets, numbers), and the engine's counters
 * through the public API on a virtual clock and a temp LMDB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/buf.h"
#include "common/clock.h"
#include "core/metrics.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

/* ---------------------------------------------------------------- the writer */

static char *write_text(metric_registry *r) {
  cph_buf out = CPH_BUF_INIT;
  assert_int_equal(metric_registry_write(r, &out), CPH_OK);
  metric_registry_free(r);
  return cph_buf_steal(&out);
}

static void expect_text(char *got, const char *want) {
  if (strcmp(got, want) != 0)
    fail_msg("exposition differs.\n--- want\n%s--- got\n%s---", want, got);
  free(got);
}

static void test_every_family_gets_help_and_type_and_escapes_help(void **state) {
  (void)state;
  metric_registry *r = metric_registry_new();
  metric_family *f = metric_family_add(r, "x_requests_total", METRIC_COUNTER,
                                       "Requests\\served\nper path.", "path", NULL, 0);
  metric_counter_set(metric_series_add(f, "/a"), 7);
  metric_counter_set(metric_series_add(f, "/b"), UINT64_MAX);
  metric_add_gauge(r, "x_temperature_celsius", "Temperature.", -2.5);
  metric_family_add(r, "x_queue_items", METRIC_GAUGE, "No series yet.", "queue", NULL, 0);
  metric_add_counter(r, "x_passes_total", "Passes.", 0);
  expect_text(write_text(r), "# HELP x_requests_total Requests\\\\served\\nper path.\n"
                             "# TYPE x_requests_total counter\n"
                             "x_requests_total{path=\"/a\"} 7\n"
                             "x_requests_total{path=\"/b\"} 18446744073709551615\n"
                             "# HELP x_temperature_celsius Temperature.\n"
                             "# TYPE x_temperature_celsius gauge\n"
                             "x_temperature_celsius -2.5\n"
                             "# HELP x_queue_items No series yet.\n"
                             "# TYPE x_queue_items gauge\n"
                             "# HELP x_passes_total Passes.\n"
                             "# TYPE x_passes_total counter\n"
                             "x_passes_total 0\n");
}

static void test_label_values_escape_quote_backslash_newline_and_bad_utf8(void **state) {
  (void)state;
  metric_registry *r = metric_registry_new();
  metric_family *f =
      metric_family_add(r, "x_step", METRIC_GAUGE, "Step per channel.", "channel", NULL, 0);
  metric_gauge_set(metric_series_add(f, "say \"hi\"\\now\nthen"), 1);
  metric_gauge_set(metric_series_add(f, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), 2);
  /* a stray byte, an overlong '/', a UTF-16 surrogate, a code point past U+10FFFF and a cut
   * sequence: every byte that is not part of a well-formed sequence becomes U+FFFD */
  metric_gauge_set(metric_series_add(f, "\xFF|\xC0\xAF|\xED\xA0\x80|\xF4\x90\x80\x80|\xE2\x82"),
                   3);
#define R "\xEF\xBF\xBD"
  expect_text(write_text(r), "# HELP x_step Step per channel.\n"
                             "# TYPE x_step gauge\n"
                             "x_step{channel=\"say \\\"hi\\\"\\\\now\\nthen\"} 1\n"
                             "x_step{channel=\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"} 2\n"
                             "x_step{channel=\"" R "|" R R "|" R R R "|" R R R R "|" R R "\"} 3\n");
#undef R
}

static void test_two_labels_are_written_in_order_and_escaped(void **state) {
  (void)state;
  metric_registry *r = metric_registry_new();
  metric_family *f =
      metric_family_add(r, "x_step", METRIC_GAUGE, "Step per channel.", "channel", NULL, 0);
  assert_true(metric_family_add_label(f, "trigger"));
  assert_false(metric_family_add_label(f, "third")); /* METRIC_LABELS_MAX */
  const char *a[2] = {"ops", "family_growth"}, *b[2] = {"say \"hi\"", NULL};
  metric_gauge_set(metric_series_addv(f, a), 1);
  metric_gauge_set(metric_series_addv(f, b), 0);
  assert_false(metric_family_add_label(f, "late")); /* it has series */
  metric_family *h = metric_family_add(r, "x_wait_seconds", METRIC_HISTOGRAM, "Waits.", "lane",
                                       (const double[]){1}, 1);
  assert_true(metric_family_add_label(h, "tenant"));
  const char *c[2] = {"interactive", "acme"};
  metric_hist_observe(metric_series_hist(metric_series_addv(h, c)), 0.5);
  expect_text(write_text(r), "# HELP x_step Step per channel.\n"
                             "# TYPE x_step gauge\n"
                             "x_step{channel=\"ops\",trigger=\"family_growth\"} 1\n"
                             "x_step{channel=\"say \\\"hi\\\"\"} 0\n" /* empty = absent */
                             "# HELP x_wait_seconds Waits.\n"
                             "# TYPE x_wait_seconds histogram\n"
                             "x_wait_seconds_bucket{lane=\"interactive\",tenant=\"acme\",le=\"1\"} 1\n"
                             "x_wait_seconds_bucket{lane=\"interactive\",tenant=\"acme\",le=\"+Inf\"} 1\n"
                             "x_wait_seconds_sum{lane=\"interactive\",tenant=\"acme\"} 0.5\n"
                             "x_wait_seconds_count{lane=\"interactive\",tenant=\"acme\"} 1\n");
}

static void test_histogram_buckets_are_cumulative_and_end_in_inf(void **state) {
  (void)state;
  static const double bounds[] = {0.5, 1, 2.5};
  metric_registry *r = metric_registry_new();
  metric_family *f = metric_family_add(r, "x_wait_seconds", METRIC_HISTOGRAM, "Waits.", "lane",
                                       bounds, 3);
  metric_hist *h = metric_series_hist(metric_series_add(f, "fast"));
  assert_non_null(h);
  const double obs[] = {0.5, 0.7, 1, 3, 100, NAN, 0}; /* a bound is in its own bucket (le) */
  for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++)
    metric_hist_observe(h, obs[i]);
  metric_series_hist(metric_series_add(f, "idle")); /* no observations */
  metric_hist *u = metric_series_hist(metric_series_add(
      metric_family_add(r, "x_size_bytes", METRIC_HISTOGRAM, "Sizes.", NULL, bounds + 1, 1),
      NULL));
  metric_hist_observe(u, 1);
  expect_text(write_text(r), "# HELP x_wait_seconds Waits.\n"
                             "# TYPE x_wait_seconds histogram\n"
                             "x_wait_seconds_bucket{lane=\"fast\",le=\"0.5\"} 2\n"
                             "x_wait_seconds_bucket{lane=\"fast\",le=\"1\"} 4\n"
                             "x_wait_seconds_bucket{lane=\"fast\",le=\"2.5\"} 4\n"
                             "x_wait_seconds_bucket{lane=\"fast\",le=\"+Inf\"} 6\n"
                             "x_wait_seconds_sum{lane=\"fast\"} 105.2\n"
                             "x_wait_seconds_count{lane=\"fast\"} 6\n"
                             "x_wait_seconds_bucket{lane=\"idle\",le=\"0.5\"} 0\n"
                             "x_wait_seconds_bucket{lane=\"idle\",le=\"1\"} 0\n"
                             "x_wait_seconds_bucket{lane=\"idle\",le=\"2.5\"} 0\n"
                             "x_wait_seconds_bucket{lane=\"idle\",le=\"+Inf\"} 0\n"
                             "x_wait_seconds_sum{lane=\"idle\"} 0\n"
                             "x_wait_seconds_count{lane=\"idle\"} 0\n"
                             "# HELP x_size_bytes Sizes.\n"
                             "# TYPE x_size_bytes histogram\n"
                             "x_size_bytes_bucket{le=\"1\"} 1\n"
                             "x_size_bytes_bucket{le=\"+Inf\"} 1\n"
                             "x_size_bytes_sum 1\n"
                             "x_size_bytes_count 1\n");
}

static void test_numbers_are_exact_and_shortest(void **state) {
  (void)state;
  char buf[32];
  assert_string_equal(metric_format_double(0, buf), "0");
  assert_string_equal(metric_format_double(-0.0, buf), "0");
  assert_string_equal(metric_format_double(42, buf), "42");
  assert_string_equal(metric_format_double(-7, buf), "-7");
  assert_string_equal(metric_format_double(0.1, buf), "0.1");
  assert_string_equal(metric_format_double(0.0025, buf), "0.0025");
  assert_string_equal(metric_format_double(1e-05, buf), "1e-05");
  assert_string_equal(metric_format_double(1.0 / 3, buf), "0.3333333333333333");
  assert_string_equal(metric_format_double(9007199254740992.0, buf), "9007199254740992");
  assert_string_equal(metric_format_double(1e20, buf), "1e+20");
  assert_string_equal(metric_format_double(NAN, buf), "NaN");
  assert_string_equal(metric_format_double(INFINITY, buf), "+Inf");
  assert_string_equal(metric_format_double(-INFINITY, buf), "-Inf");
}

/* ---------------------------------------------------------------- the engine's metrics */

static const char *POLICY = "{:scheduler {:concurrency 4\n"
                            "             :credits {:max 30 :min -30}}\n"
                            " :leases {:ttl-seconds 5 :max-attempts 5}\n"
                            " :sessions {:janitor? false}\n"
                            " :store {:sync :none}}\n";

typedef cph_fixture fixture;

static int setup(void **state) {
  *state = cph_fixture_new("metrics", POLICY);
  return 0;
}

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

static void create_session(fixture *f, const char *id, const char *subscribe) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  char *subs[1] = {(char *)subscribe};
  op.u.session.in.subscribe.items = subs;
  op.u.session.in.subscribe.count = subscribe ? 1 : 0;
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

static cph_ingest_status post(fixture *f, const char *channel, const char *body,
                              const char *key) {
  cph_event_in ev = {.channel = (char *)channel, .sender = "ann", .body = (char *)body,
                     .key = (char *)key};
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = &ev;
  op.u.ingest.n_events = 1;
  if (cph_fixture_run(f, &op))
    fail_msg("ingest: %s", op.err.msg);
  cph_ingest_status st = op.u.ingest.results[0].status;
  cph_op_clear_results(&op);
  return st;
}

static void lease(fixture *f, cph_op *op) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w1";
  op->u.lease.deadline_ns = cph_clock_now(&f->clock) + 10 * CPH_NS_PER_S;
  if (cph_fixture_run(f, op))
    fail_msg("lease: %s", op->err.msg);
}

static void end_turn(fixture *f, cph_op_kind kind, const cph_turn_info *t, uint64_t valid,
                     uint64_t invalid, uint64_t repairs, uint64_t denies) {
  cph_op op = {0};
  op.kind = kind;
  op.u.turn.turn_id = t->id;
  snprintf(op.u.turn.lease, sizeof op.u.turn.lease, "%s", t->lease);
  op.u.turn.tool_calls = valid + invalid;
  op.u.turn.tool_stats.valid = valid;
  op.u.turn.tool_stats.invalid = invalid;
  op.u.turn.tool_stats.repairs = repairs;
  op.u.turn.tool_stats.guard_denies = denies;
  if (cph_fixture_run(f, &op))
    fail_msg("end turn: %s", op.err.msg);
}

/* The value of the sample line that starts with `series ` in the exposition. */
static double sample(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ')
      return strtod(p + n + 1, NULL);
  fail_msg("no sample %s in the exposition:\n%s", series, text);
  return NAN;
}

static char *scrape(fixture *f) {
  size_t len = 0;
  char *text = cph_engine_metrics_text(f->e, &len);
  assert_non_null(text);
  assert_int_equal(strlen(text), len);
  return text;
}

static void test_turns_tool_stats_and_events_are_counted_where_they_happen(void **state) {
  fixture *f = *state;
  create_session(f, "s1", "general");
  assert_int_equal(post(f, "general", "first message of the day", "k1"), CPH_EV_QUEUED);
  assert_int_equal(post(f, "general", "again with the same key", "k1"), CPH_EV_DUPLICATE);
  assert_int_equal(post(f, "nowhere", "nobody listens here at all", NULL), CPH_EV_STORED);
  assert_int_equal(post(f, "general", NULL, NULL), CPH_EV_REJECTED);
  cph_engine_run_pass(f->e); /* stages the message: the session queues now */

  /* completed after 2 s of (virtual) waiting, with its tool_stats */
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
  cph_op a;
  lease(f, &a);
  end_turn(f, CPH_OP_COMPLETE, &a.u.lease.turn, 3, 1, 2, 1);
  cph_op_clear_results(&a);
  /* failed by the worker */
  assert_int_equal(post(f, "general", "second message of the day", NULL), CPH_EV_QUEUED);
  cph_engine_run_pass(f->e);
  cph_op b;
  lease(f, &b);
  end_turn(f, CPH_OP_FAIL, &b.u.lease.turn, 0, 0, 0, 0);
  cph_op_clear_results(&b);
  /* expired: past its 5 s lease */
  cph_op c;
  lease(f, &c);
  cph_clock_advance(&f->clock, 6 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e);
  cph_op_clear_results(&c);

  char *t = scrape(f);
  assert_int_equal(sample(t, "cephalon_turns_started_total{lane=\"interactive\"}"), 3);
  assert_int_equal(sample(t, "cephalon_turns_started_total{lane=\"operational\"}"), 0);
  assert_int_equal(sample(t, "cephalon_turns_completed_total{lane=\"interactive\"}"), 1);
  assert_int_equal(sample(t, "cephalon_turns_failed_total{lane=\"interactive\"}"), 1);
  assert_int_equal(sample(t, "cephalon_turns_expired_total{lane=\"interactive\"}"), 1);
  assert_int_equal(sample(t, "cephalon_pick_wait_seconds_count{lane=\"interactive\"}"), 3);
  /* the first waited exactly 2 s; the retries queued again at once */
  assert_int_equal(sample(t, "cephalon_pick_wait_seconds_bucket{lane=\"interactive\",le=\"1\"}"),
                   2);
  assert_int_equal(
      sample(t, "cephalon_pick_wait_seconds_bucket{lane=\"interactive\",le=\"2.5\"}"), 3);
  assert_true(sample(t, "cephalon_pick_wait_seconds_sum{lane=\"interactive\"}") == 2.0);
  assert_int_equal(sample(t, "cephalon_context_inclusion_count_count"), 3);
  assert_int_equal(sample(t, "cephalon_tool_calls_total{result=\"valid\"}"), 3);
  assert_int_equal(sample(t, "cephalon_tool_calls_total{result=\"invalid\"}"), 1);
  assert_int_equal(sample(t, "cephalon_tool_call_repairs_total"), 2);
  assert_int_equal(sample(t, "cephalon_guard_denies_total"), 1);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"queued\"}"), 2);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"duplicate\"}"), 1);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"stored\"}"), 1);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"rejected\"}"), 1);
  assert_int_equal(sample(t, "cephalon_events_total{status=\"aggregated\"}"), 0);
  assert_int_equal(sample(t, "cephalon_sessions"), 1);
  assert_int_equal(sample(t, "cephalon_lane_runnable_sessions{lane=\"interactive\"}"), 1);
  assert_int_equal(sample(t, "cephalon_lane_budget_turns_per_minute{lane=\"interactive\"}"), 60);
  assert_int_equal(sample(t, "cephalon_policy_generation"), 1);
  assert_true(sample(t, "cephalon_scheduler_passes_total") >= 10);
  free(t);

  cph_engine_note_reload_failure(f->e);
  t = scrape(f);
  assert_int_equal(sample(t, "cephalon_policy_reload_failures_total"), 1);
  free(t);
}

/* 1,200 sessions with the sample's bound at 1,000 (metrics_test_credits_sample_max; the
 * daemon's is 10,000, the same code): one scrape samples at most 1,000 of them, and
 * consecutive scrapes start from rotating offsets, so they cover every session. */
static void test_credits_are_sampled_within_the_cap(void **state) {
  fixture *f = *state;
  enum { N = 1200, BATCH = 400, SAMPLE_MAX = 1000 };
  metrics_test_credits_sample_max(SAMPLE_MAX);
  static cph_op ops[BATCH];
  static char ids[BATCH][16];
  int called = 0;
  for (int base = 0; base < N; base += BATCH) {
    for (int i = 0; i < BATCH; i++) {
      snprintf(ids[i], sizeof ids[i], "s%05d", base + i);
      memset(&ops[i], 0, sizeof ops[i]);
      ops[i].kind = CPH_OP_SESSION_CREATE;
      ops[i].u.session.in.id = ids[i];
      ops[i].u.session.in.lane = CPH_LANE_OPERATIONAL;
      ops[i].done = cph_fixture_count_done;
      ops[i].ctx = &called;
      assert_int_equal(cph_engine_submit(f->e, &ops[i]), CPH_OK);
    }
    cph_engine_run_pass(f->e);
    for (int i = 0; i < BATCH; i++) {
      assert_int_equal(ops[i].rc, CPH_OK);
      cph_op_clear_results(&ops[i]);
    }
  }
  assert_int_equal(called, N);
  uint64_t seen = 0;
  int scrapes = 0;
  while (seen < N && scrapes < 16) {
    char *t = scrape(f);
    double n = sample(t, "cephalon_session_credits_count");
    assert_true(n >= 1 && n <= SAMPLE_MAX);
    /* every session is new: at max, in the top bucket */
    assert_true(sample(t, "cephalon_session_credits_bucket{le=\"30\"}") == n);
    assert_true(sample(t, "cephalon_session_credits_bucket{le=\"24\"}") == 0);
    assert_int_equal(sample(t, "cephalon_sessions"), N);
    seen += (uint64_t)n;
    scrapes++;
    free(t);
  }
  /* the offsets 0..stride-1 partition the scheduler slots: exactly N over one cycle */
  assert_int_equal(seen, N);
  assert_true(scrapes >= 2);
  metrics_test_credits_sample_max(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_family_gets_help_and_type_and_escapes_help),
      cmocka_unit_test(test_label_values_escape_quote_backslash_newline_and_bad_utf8),
      cmocka_unit_test(test_two_labels_are_written_in_order_and_escaped),
      cmocka_unit_test(test_histogram_buckets_are_cumulative_and_end_in_inf),
      cmocka_unit_test(test_numbers_are_exact_and_shortest),
      cmocka_unit_test_setup_teardown(
          test_turns_tool_stats_and_events_are_counted_where_they_happen, setup, teardown),
      cmocka_unit_test_setup_teardown(test_credits_are_sampled_within_the_cap, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
