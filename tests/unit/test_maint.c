/* Maintenance through the engine's public API on a virtual clock and a temp LMDB: compaction
 * (plan locks, the group-hash gate), retrieval with summary substitution, the outbox, and
 * retention (DESIGN §7). The test plays cephalond's maintenance worker: lease (internal) ->
 * cph_job_execute -> complete. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "tests/support/httpd_double.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

static const char *POLICY =
    "{:sessions {:janitor? true}\n"
    " :gc {:min-age-hours 1000}\n" /* no automatic plans: the tests choose the groups */
    " :maintenance {:retention {:events {:payload-keep-days 0 :metadata-keep-days 1}}}\n"
    " :store {:sync :none}}\n";

typedef cph_fixture fixture;

static cph_httpd *g_index; /* the HTTP vector index double, for the tests that use one */

static int setup_with(void **state, const char *policy_text) {
  *state = cph_fixture_new("maint", policy_text);
  return 0;
}

static int setup(void **state) { return setup_with(state, POLICY); }

/* The HTTP index double answers every request from its script, whatever the path; one reply
 * body serves both calls: upserts read "upserted", deletes read "deleted". */
static const char *INDEX_OK = "{\"upserted\":3,\"deleted\":[1,2,3]}";

static int setup_http_index(void **state) {
  g_index = cph_httpd_start();
  cph_httpd_set_default(g_index, (cph_httpd_reply){200, INDEX_OK, 0});
  char policy[1024];
  snprintf(policy, sizeof policy,
           "{:sessions {:janitor? true}\n"
           " :gc {:min-age-hours 1000}\n"
           " :vector-index {:kind :http :url \"%s\"}\n"
           " :maintenance {:outbox {:backoff-base-ms 1 :backoff-max-ms 20 :drain-interval-s 1}}\n"
           " :store {:sync :none}}\n",
           cph_httpd_url(g_index));
  return setup_with(state, policy);
}

/* The maintenance lane can start one turn a minute; the outbox trickle is 60 batches a
 * minute. */
static int setup_tight_budget(void **state) {
  return setup_with(state, "{:sessions {:janitor? true}\n"
                           " :gc {:min-age-hours 1000}\n"
                           " :scheduler {:lanes {:maintenance {:turns 1 :tool-calls 1}}}\n"
                           " :maintenance {:outbox {:min-batches-per-minute 60 :drain-interval-s 1}}\n"
                           " :store {:sync :none}}\n");
}

static int teardown(void **state) {
  if (g_index) {
    cph_httpd_stop(g_index);
    g_index = NULL;
  }
  cph_fixture_free(*state);
  return 0;
}

/* Runs maintenance turns until three leases in a row find nothing; returns how many ran. */
static int run_maintenance(fixture *f) {
  int ran = 0, idle = 0;
  while (idle < 3 && ran < 500) {
    cph_op lease = {0};
    lease.kind = CPH_OP_LEASE;
    lease.u.lease.worker = "test-maint";
    lease.u.lease.internal = true;
    lease.u.lease.deadline_ns = cph_clock_now(&f->clock);
    if (cph_fixture_run(f, &lease) != CPH_OK) {
      idle++;
      continue;
    }
    idle = 0;
    ran++;
    cph_job_work *job = lease.u.lease.turn.job;
    lease.u.lease.turn.job = NULL;
    if (job)
      cph_job_execute(cph_engine_policy(f->e), job); /* what a worker thread does */
    cph_op done = {0};
    done.kind = CPH_OP_COMPLETE;
    done.u.turn.turn_id = lease.u.lease.turn.id;
    memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
    done.u.turn.job = job;
    if (cph_fixture_run(f, &done) != CPH_OK)
      fail_msg("completing maintenance turn: %s", done.err.msg);
    cph_op_clear_results(&lease);
  }
  return ran;
}

static void enqueue(fixture *f, const char *job, const char *args) {
  cph_op op = {0};
  op.kind = CPH_OP_JOB_ENQUEUE;
  op.u.job.in.job = (char *)job;
  op.u.job.in.args = (char *)args;
  if (cph_fixture_run(f, &op))
    fail_msg("enqueue %s: %s", job, op.err.msg);
}

/* A session completes an autonomy tick with these memories (no events: memory ids are 1..n). */
static void mint_memories(fixture *f, const char *const *texts, size_t n) {
  cph_op create = {0};
  create.kind = CPH_OP_SESSION_CREATE;
  create.u.session.in.id = "s1";
  create.u.session.in.lane = CPH_LANE_INTERACTIVE;
  create.u.session.in.autonomy_interval_s = 1;
  assert_int_equal(cph_fixture_run(f, &create), CPH_OK);
  cph_op_clear_results(&create);
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e);
  cph_op lease = {0};
  lease.kind = CPH_OP_LEASE;
  lease.u.lease.worker = "w";
  lease.u.lease.deadline_ns = cph_clock_now(&f->clock) + CPH_NS_PER_S;
  assert_int_equal(cph_fixture_run(f, &lease), CPH_OK);
  cph_memory_in mems[8] = {{0}};
  for (size_t i = 0; i < n; i++)
    mems[i].text = (char *)texts[i];
  cph_op done = {0};
  done.kind = CPH_OP_COMPLETE;
  done.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
  done.u.turn.memories = mems;
  done.u.turn.n_memories = n;
  assert_int_equal(cph_fixture_run(f, &done), CPH_OK);
  cph_op_clear_results(&lease);
  /* pause it so its autonomy ticks stay out of the way */
  cph_op up = {0};
  up.kind = CPH_OP_SESSION_UPDATE;
  up.u.session.in.id = "s1";
  up.u.session.in.state = CPH_STATE_PAUSED;
  up.u.session.set = CPH_SET_PAUSED;
  assert_int_equal(cph_fixture_run(f, &up), CPH_OK);
  cph_op_clear_results(&up);
}

static cph_memory_hit *search(fixture *f, const char *q, size_t *n, cph_op *op) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_MEMORY_SEARCH;
  op->u.search.session = "s1";
  op->u.search.query = (char *)q;
  op->u.search.k = 10;
  if (cph_fixture_run(f, op))
    fail_msg("search: %s", op->err.msg);
  *n = op->u.search.n_hits;
  return op->u.search.hits;
}

/* The §7 formula, computed here from the group's own fields. */
static void expected_hash(const cph_gc_group_info *g, char out[65]) {
  char text[1024];
  size_t len = 0;
  for (size_t i = 0; i < g->n_source_ids; i++)
    len += (size_t)snprintf(text + len, sizeof text - len, "%s%llu", i ? "," : "",
                            (unsigned long long)g->source_ids[i]);
  len += (size_t)snprintf(text + len, sizeof text - len, "|%lld|%llu", (long long)g->newest_ts_ms,
                          (unsigned long long)g->total_tokens_est);
  unsigned char d[32];
  unsigned dlen;
  EVP_Digest(text, len, d, &dlen, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++)
    snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static const char *const TEXTS[] = {
    "the user prefers short answers about rust compilers",
    "the user asked about rust borrow checker errors twice",
    "rust compiler upgrade planned for friday release",
    "gardening tips: water tomatoes early in the morning",
};

static void test_overlapping_plans_one_commits_the_other_aborts(void **state) {
  fixture *f = *state;
  mint_memories(f, TEXTS, 4);
  run_maintenance(f); /* embeds all four */

  enqueue(f, "gc_plan", "sources=1,2,3");
  enqueue(f, "gc_plan", "sources=3,4"); /* overlaps the first on memory 3 */
  run_maintenance(f);

  cph_gc_group_info *groups;
  size_t n;
  cph_err err;
  assert_int_equal(cph_engine_gc_groups(f->e, NULL, 10, &groups, &n, &err), CPH_OK);
  assert_int_equal(n, 2);
  const cph_gc_group_info *a = groups[0].n_source_ids == 3 ? &groups[0] : &groups[1];
  const cph_gc_group_info *b = a == &groups[0] ? &groups[1] : &groups[0];
  assert_string_equal(a->state, "committed");
  assert_string_equal(b->state, "aborted"); /* memory 3 changed under it: the gate refused */
  assert_true(a->summary_id > 4);
  char want[65];
  expected_hash(a, want);
  assert_string_equal(a->group_hash, want);
  expected_hash(b, want);
  assert_string_equal(b->group_hash, want);

  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.groups_committed_total, 1);
  assert_int_equal(st.memories_deleted_total, 3); /* no memory deleted twice */
  assert_int_equal(st.summaries_created_total, 1);
  uint64_t summary = a->summary_id;
  for (size_t i = 0; i < n; i++)
    cph_gc_group_info_free(&groups[i]);
  free(groups);

  /* the aborted group asked for a new plan */
  cph_job_info *jobs;
  assert_int_equal(cph_engine_jobs(f->e, NULL, 50, &jobs, &n, &err), CPH_OK);
  int plans = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(jobs[i].kind, "gc_plan") == 0)
      plans++;
    cph_job_info_free(&jobs[i]);
  }
  free(jobs);
  assert_int_equal(plans, 3);

  /* retrieval: never a deleted memory; the summary stands in for its sources, once */
  cph_op op;
  size_t hits_n;
  cph_memory_hit *hits = search(f, "rust compiler answers", &hits_n, &op);
  int summaries = 0;
  for (size_t i = 0; i < hits_n; i++) {
    assert_true(hits[i].id == 4 || hits[i].id == summary);
    if (hits[i].id == summary) {
      summaries++;
      assert_string_equal(hits[i].kind, "summary");
    }
  }
  assert_int_equal(summaries, 1);
  cph_op_clear_results(&op);

  /* the sources' vectors go through the outbox and are confirmed */
  cph_outbox_info *items;
  assert_int_equal(cph_engine_outbox(f->e, NULL, 10, &items, &n, &err), CPH_OK);
  assert_int_equal(n, 3);
  for (size_t i = 0; i < n; i++) {
    assert_string_equal(items[i].status, "done");
    cph_outbox_info_free(&items[i]);
  }
  free(items);
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.outbox_pending, 0);
}

static void test_retention_drops_payloads_and_keeps_hash_and_metadata(void **state) {
  fixture *f = *state;
  cph_event_in ev = {"news", "ann", "a payload that retention will remove", NULL, {NULL, 0},
                     NULL, NULL, 0};
  cph_op ing = {0};
  ing.kind = CPH_OP_INGEST;
  ing.u.ingest.events = &ev;
  ing.u.ingest.n_events = 1;
  assert_int_equal(cph_fixture_run(f, &ing), CPH_OK);
  uint64_t id = ing.u.ingest.results[0].id;
  cph_op_clear_results(&ing);
  cph_event_info before, after;
  cph_err err;
  assert_int_equal(cph_engine_get_event(f->e, id, &before, &err), CPH_OK);
  assert_non_null(before.body);

  struct timespec ms = {0, 5 * 1000 * 1000};
  nanosleep(&ms, NULL); /* payload-keep-days 0: anything older than now */
  enqueue(f, "retention_redact_events", NULL);
  run_maintenance(f);

  assert_int_equal(cph_engine_get_event(f->e, id, &after, &err), CPH_OK);
  assert_null(after.body);                                   /* payload gone */
  assert_string_equal(after.body_sha256, before.body_sha256); /* hash kept */
  assert_string_equal(after.channel, "news");                 /* metadata kept */
  assert_string_equal(after.sender, "ann");
  assert_int_equal(after.ts_ms, before.ts_ms);
  cph_event_info_free(&before);
  cph_event_info_free(&after);
}

static size_t count_deletes(void) {
  size_t n = 0;
  for (size_t i = 0; i < cph_httpd_count(g_index); i++) {
    cph_httpd_request r;
    if (cph_httpd_request_at(g_index, i, &r)) {
      n += strcmp(r.path, "/delete") == 0;
      cph_httpd_request_free(&r);
    }
  }
  return n;
}

static void outbox_state(fixture *f, size_t *pending, size_t *done, uint32_t *max_attempts) {
  cph_outbox_info *items;
  size_t n;
  cph_err err;
  assert_int_equal(cph_engine_outbox(f->e, NULL, 50, &items, &n, &err), CPH_OK);
  *pending = *done = 0;
  *max_attempts = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(items[i].status, "done") == 0)
      (*done)++;
    else
      (*pending)++;
    if (items[i].attempts > *max_attempts)
      *max_attempts = items[i].attempts;
    cph_outbox_info_free(&items[i]);
  }
  free(items);
}

/* DESIGN §7: deletes that fail back off and are retried; an item is done only after the index
 * confirmed it. */
static void test_http_index_500s_back_off_and_items_finish_only_after_success(void **state) {
  fixture *f = *state;
  mint_memories(f, TEXTS, 3);
  run_maintenance(f); /* embedded and upserted to the index */
  cph_httpd_set_default(g_index, (cph_httpd_reply){500, "{\"error\":\"index down\"}", 0});
  enqueue(f, "gc_plan", "sources=1,2,3");
  run_maintenance(f); /* committed; the first delete batch fails */

  size_t pending, done;
  uint32_t attempts;
  outbox_state(f, &pending, &done, &attempts);
  assert_int_equal(pending, 3);
  assert_int_equal(done, 0);
  assert_int_equal(attempts, 1);
  size_t deletes_before = count_deletes();
  assert_true(deletes_before >= 1);

  /* still failing: backed off, tried again, still not done */
  struct timespec pause = {0, 30 * 1000 * 1000}; /* past the 20 ms backoff cap */
  nanosleep(&pause, NULL);
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
  run_maintenance(f);
  outbox_state(f, &pending, &done, &attempts);
  assert_int_equal(pending, 3);
  assert_true(attempts >= 2);
  assert_true(count_deletes() > deletes_before);

  /* the index is back: the retry is confirmed and only then done */
  cph_httpd_set_default(g_index, (cph_httpd_reply){200, INDEX_OK, 0});
  nanosleep(&pause, NULL);
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
  run_maintenance(f);
  outbox_state(f, &pending, &done, &attempts);
  assert_int_equal(pending, 0);
  assert_int_equal(done, 3);
  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.outbox_pending, 0);
}

/* DESIGN §3.5: with the maintenance lane's budget spent, outbox batches still run. The lane
 * may start one turn a minute; each round below advances 61 s, so exactly one normal
 * maintenance turn runs per round. In the round whose one turn is gc_commit, the outbox items
 * it creates can only be drained by the trickle. */
static void test_outbox_trickle_runs_with_the_maintenance_budget_spent(void **state) {
  fixture *f = *state;
  mint_memories(f, TEXTS, 3);
  cph_maint_stats st;
  for (int i = 0; i < 10; i++) { /* embed the three sources, a minute at a time */
    cph_engine_maint_stats(f->e, &st);
    if (st.embed_queue == 0)
      break;
    cph_clock_advance(&f->clock, 61 * CPH_NS_PER_S);
    run_maintenance(f);
  }
  assert_int_equal(st.embed_queue, 0);
  enqueue(f, "gc_plan", "sources=1,2,3");
  bool committed = false;
  for (int i = 0; i < 20 && !committed; i++) {
    cph_clock_advance(&f->clock, 61 * CPH_NS_PER_S);
    run_maintenance(f);
    cph_engine_maint_stats(f->e, &st);
    committed = st.groups_committed_total == 1;
  }
  assert_true(committed);
  /* Same round, same virtual instant: the lane has no budget left... */
  cph_lane_info lanes[CPH_LANE_COUNT];
  uint32_t limit, in_use;
  cph_engine_lanes(f->e, lanes, &limit, &in_use);
  assert_true(lanes[CPH_LANE_MAINTENANCE].turns_left < 1.0);
  /* ...yet the three vector deletes were applied and confirmed. */
  size_t pending, done;
  uint32_t attempts;
  outbox_state(f, &pending, &done, &attempts);
  assert_int_equal(done, 3);
  assert_int_equal(pending, 0);
}

static void test_jobs_need_known_kinds_and_group_args(void **state) {
  fixture *f = *state;
  cph_op op = {0};
  op.kind = CPH_OP_JOB_ENQUEUE;
  op.u.job.in.job = "defragment";
  assert_int_equal(cph_fixture_run(f, &op), CPH_EINVAL);
  assert_string_equal(op.field, "job");
  op.u.job.in.job = "gc_commit";
  op.u.job.in.args = NULL;
  assert_int_equal(cph_fixture_run(f, &op), CPH_EINVAL);
  assert_string_equal(op.field, "args");
}

/* Retention's redaction reaches turn histories at once: the engine keeps recent events in
 * memory for histories (core/evcache.h), and a redacted payload must leave it with the store. */
static void post_news(fixture *f, const char *body) {
  cph_event_in ev = {"news", "ann", (char *)body, NULL, {NULL, 0}, NULL, NULL, 0};
  cph_op ing = {0};
  ing.kind = CPH_OP_INGEST;
  ing.u.ingest.events = &ev;
  ing.u.ingest.n_events = 1;
  assert_int_equal(cph_fixture_run(f, &ing), CPH_OK);
  cph_op_clear_results(&ing);
  cph_engine_run_pass(f->e); /* staged from the next pass on */
}

/* Leases the reader's inbox turn and reports whether its conversation_history shows `text`
 * (the staged message itself is not history); completes the turn. */
static bool turn_shows(fixture *f, const char *text) {
  cph_op l = {0};
  l.kind = CPH_OP_LEASE;
  l.u.lease.worker = "w1";
  l.u.lease.deadline_ns = cph_clock_now(&f->clock) + 10 * CPH_NS_PER_S;
  if (cph_fixture_run(f, &l) != CPH_OK)
    fail_msg("lease: %s", l.err.msg);
  const cph_turn_info *t = &l.u.lease.turn;
  assert_string_equal(t->session, "reader");
  bool shown = false;
  for (size_t i = 0; i < t->n_history; i++)
    shown |= t->history[i].body && strstr(t->history[i].body, text) != NULL;
  cph_op done = {0};
  done.kind = CPH_OP_COMPLETE;
  done.u.turn.turn_id = t->id;
  memcpy(done.u.turn.lease, t->lease, sizeof done.u.turn.lease);
  if (cph_fixture_run(f, &done) != CPH_OK)
    fail_msg("complete: %s", done.err.msg);
  cph_op_clear_results(&l);
  return shown;
}

static void test_redacted_payload_leaves_turn_histories_at_once(void **state) {
  fixture *f = *state;
  char *sub[1] = {"news"};
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = "reader";
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  op.u.session.in.subscribe = (cph_strv){sub, 1};
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
  cph_op_clear_results(&op);

  post_news(f, "first: a payload retention will remove");
  assert_false(turn_shows(f, "first:")); /* staged, not history */
  post_news(f, "second message");
  assert_true(turn_shows(f, "first:")); /* history now (and in the event cache) */

  struct timespec ms = {0, 5 * 1000 * 1000};
  nanosleep(&ms, NULL); /* payload-keep-days 0: anything older than now */
  enqueue(f, "retention_redact_events", NULL);
  run_maintenance(f);

  post_news(f, "third message");
  assert_false(turn_shows(f, "first:"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_overlapping_plans_one_commits_the_other_aborts, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_redacted_payload_leaves_turn_histories_at_once, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_retention_drops_payloads_and_keeps_hash_and_metadata,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_jobs_need_known_kinds_and_group_args, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_http_index_500s_back_off_and_items_finish_only_after_success, setup_http_index,
          teardown),
      cmocka_unit_test_setup_teardown(test_outbox_trickle_runs_with_the_maintenance_budget_spent,
                                      setup_tight_budget, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
