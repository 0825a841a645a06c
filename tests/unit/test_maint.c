#define _GNU_SOURCE
/* Maintenance through the engine's public API on a virtual clock and a temp LMDB: compaction
 * (plan locks, the group-hash gate), retrieval with summary substitution, the outbox, and
 * retention (DESIGN §7). The test plays cephalond's maintenance worker: lease (internal) ->
 * cph_job_execute -> complete. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "store/store.h"
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
static int run_maintenance(fixture *f) { return cph_fixture_run_maintenance(f, NULL, NULL); }

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
  cph_event_in ev = {.channel = "news", .sender = "ann",
                     .body = "a payload that retention will remove"};
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
  cph_event_in ev = {.channel = "news", .sender = "ann", .body = (char *)body};
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

/* ---------------------------------------------------------------- memory search */

static bool hits_have(const cph_memory_hit *hits, size_t n, uint64_t id) {
  for (size_t i = 0; i < n; i++)
    if (hits[i].id == id)
      return true;
  return false;
}

static void assert_scores_positive_best_first(const cph_memory_hit *hits, size_t n) {
  for (size_t i = 0; i < n; i++) {
    assert_true(hits[i].score > 0);
    assert_true(i == 0 || hits[i].score <= hits[i - 1].score);
  }
}

/* DESIGN §7 "reads see writes": no embedding job has run, every embedding is still queued, and
 * the memories are found all the same (lexically), the best match first. */
static void test_queued_memories_are_found_before_their_embedding(void **state) {
  fixture *f = *state;
  mint_memories(f, TEXTS, 4);
  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.embed_queue, 4);
  assert_false(cph_search_needs_prepare(cph_engine_policy(f->e)));

  cph_op op;
  size_t n;
  cph_memory_hit *hits = search(f, "rust compiler upgrade", &n, &op);
  assert_int_equal(n, 3);         /* 1 (rust, compilers), 2 (rust), 3 (all three) */
  assert_int_equal(hits[0].id, 3); /* every term */
  assert_true(hits[0].score > 0.99);
  assert_int_equal(hits[1].id, 1); /* two of three: "compilers" counts as "compiler" */
  assert_false(hits_have(hits, n, 4)); /* gardening shares nothing */
  assert_scores_positive_best_first(hits, n);
  assert_false(op.u.search.degraded);
  cph_op_clear_results(&op);

  hits = search(f, "zebra violin", &n, &op);
  assert_int_equal(n, 0);
  cph_op_clear_results(&op);
  hits = search(f, "the of and", &n, &op); /* stop words only: they are the terms then */
  assert_true(n >= 1);
  assert_scores_positive_best_first(hits, n);
  cph_op_clear_results(&op);

  /* embedded now: the same answer, vector and lexical merged */
  run_maintenance(f);
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.embed_queue, 0);
  hits = search(f, "rust compiler upgrade", &n, &op);
  assert_true(n >= 3);
  assert_int_equal(hits[0].id, 3);
  assert_false(hits_have(hits, n, 4)); /* hash collisions alone never make a hit */
  assert_scores_positive_best_first(hits, n);
  cph_op_clear_results(&op);
}

/* Embedding batches of 5: a request's 12 memories are queued as one row, which the batches
 * take apart from its front. */
static int setup_small_embed_batches(void **state) {
  return setup_with(state, "{:sessions {:janitor? true}\n"
                           " :gc {:min-age-hours 1000}\n"
                           " :maintenance {:embeddings {:batch-size 5}}\n"
                           " :store {:sync :none}}\n");
}

static bool count_row(void *ctx, const void *key, size_t key_len, const void *val,
                      size_t val_len) {
  (void)ctx, (void)key, (void)key_len, (void)val, (void)val_len;
  return true;
}

static void test_a_requests_embeddings_are_one_row_and_drain_in_batches(void **state) {
  fixture *f = *state;
  const char *subs[] = {"general"};
  cph_fixture_create_session(f, "s1", CPH_LANE_INTERACTIVE, subs, 1); /* searches its scopes */
  char body[12][64];
  cph_event_in ev[12];
  for (int i = 0; i < 12; i++) {
    snprintf(body[i], sizeof body[i], "status report %d from the %s team", i,
             i == 7 ? "walrus" : "usual");
    ev[i] = (cph_event_in){.channel = "general", .sender = "carol", .body = body[i]};
  }
  cph_op op = {0};
  cph_fixture_ingest(f, ev, 12, &op);
  cph_op_clear_results(&op);
  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.embed_queue, 12);
  cph_engine_close(f->e); /* one row for the twelve; recounted as twelve at open */
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_EMBED_QUEUE, count_row, NULL), 1);
  cph_fixture_open(f);
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.embed_queue, 12);

  assert_true(run_maintenance(f) >= 3); /* 5 + 5 + 2 */
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.embed_queue, 0);
  size_t n;
  cph_memory_hit *hits = search(f, "walrus", &n, &op);
  assert_int_equal(n, 1);
  assert_non_null(strstr(hits[0].text, "walrus"));
  cph_op_clear_results(&op);
  cph_engine_close(f->e);
  f->e = NULL;
  assert_int_equal(cph_fixture_store_each(f->dir, CPH_DB_EMBED_QUEUE, count_row, NULL), 0);
  cph_fixture_open(f);
  cph_engine_maint_stats(f->e, &st);
  assert_int_equal(st.embed_queue, 0);
}

/* An external embedder the op was not prepared for: the engine never calls it in the pass; the
 * answer is lexical and says so. */
static int setup_external_embedder(void **state) {
  return setup_with(state, "{:sessions {:janitor? true}\n"
                           " :gc {:min-age-hours 1000}\n"
                           " :providers {:embeddings {:kind :openai\n"
                           "                          :url \"http://127.0.0.1:9/v1/embeddings\"}}\n"
                           " :store {:sync :none}}\n");
}

static void test_unprepared_search_with_external_embedder_is_lexical_and_degraded(void **state) {
  fixture *f = *state;
  assert_true(cph_search_needs_prepare(cph_engine_policy(f->e)));
  mint_memories(f, TEXTS, 4);
  cph_op op;
  size_t n;
  cph_memory_hit *hits = search(f, "tomatoes morning", &n, &op);
  assert_int_equal(n, 1);
  assert_int_equal(hits[0].id, 4);
  assert_true(op.u.search.degraded);
  cph_op_clear_results(&op);
}

/* An HTTP vector index double that keeps what it is sent: /upsert stores, /delete removes,
 * /search ranks a scope's vectors by cosine. It checks that every id it is sent lies in the
 * shard the request names (id mod SHARDS). */
#define SHARDS 3
#define VDOUBLE_MAX 32

typedef struct vdouble {
  pthread_mutex_t mu;
  size_t n;
  uint64_t ids[VDOUBLE_MAX];
  char scopes[VDOUBLE_MAX][32];
  double vec[VDOUBLE_MAX][256];
  size_t dims[VDOUBLE_MAX];
  bool down;
  int wrong_shard;
  int upserts_per_shard[SHARDS];
} vdouble;

static vdouble g_vd = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void vd_check_shard(vdouble *d, json_int_t shard, json_int_t id) {
  if (shard < 0 || shard >= SHARDS || id % SHARDS != shard)
    d->wrong_shard++;
}

static char *vd_upsert(vdouble *d, json_t *req) {
  json_int_t shard = json_integer_value(json_object_get(req, "shard"));
  json_t *items = json_object_get(req, "items");
  if (shard >= 0 && shard < SHARDS)
    d->upserts_per_shard[shard]++;
  for (size_t i = 0; i < json_array_size(items); i++) {
    json_t *it = json_array_get(items, i);
    json_int_t id = json_integer_value(json_object_get(it, "id"));
    vd_check_shard(d, shard, id);
    size_t slot = d->n;
    for (size_t j = 0; j < d->n; j++)
      if (d->ids[j] == (uint64_t)id)
        slot = j;
    if (slot == VDOUBLE_MAX)
      continue;
    if (slot == d->n)
      d->n++;
    d->ids[slot] = (uint64_t)id;
    snprintf(d->scopes[slot], sizeof d->scopes[slot], "%s",
             json_string_value(json_object_get(it, "scope")));
    json_t *v = json_object_get(it, "vector");
    d->dims[slot] = json_array_size(v) < 256 ? json_array_size(v) : 256;
    for (size_t k = 0; k < d->dims[slot]; k++)
      d->vec[slot][k] = json_number_value(json_array_get(v, k));
  }
  char *out = NULL;
  if (asprintf(&out, "{\"upserted\":%zu}", json_array_size(items)) < 0)
    abort();
  return out;
}

static char *vd_delete(vdouble *d, json_t *req) {
  json_int_t shard = json_integer_value(json_object_get(req, "shard"));
  json_t *ids = json_object_get(req, "ids");
  for (size_t i = 0; i < json_array_size(ids); i++) {
    uint64_t id = (uint64_t)json_integer_value(json_array_get(ids, i));
    vd_check_shard(d, shard, (json_int_t)id);
    for (size_t j = 0; j < d->n; j++)
      if (d->ids[j] == id)
        d->ids[j] = 0; /* gone: never found again */
  }
  json_t *ans = json_pack("{s:O}", "deleted", ids);
  char *out = json_dumps(ans, JSON_COMPACT);
  json_decref(ans);
  return out;
}

static char *vd_search(vdouble *d, json_t *req) {
  const char *scope = json_string_value(json_object_get(req, "scope"));
  json_t *q = json_object_get(req, "vector");
  json_int_t k = json_integer_value(json_object_get(req, "k"));
  json_t *hits = json_array();
  bool taken[VDOUBLE_MAX] = {0};
  for (json_int_t r = 0; r < k; r++) { /* selection: best remaining first */
    size_t best = VDOUBLE_MAX;
    double best_score = -2;
    for (size_t j = 0; j < d->n; j++) {
      if (taken[j] || !d->ids[j] || !scope || strcmp(d->scopes[j], scope) != 0 ||
          d->dims[j] != json_array_size(q))
        continue;
      double dot = 0, a = 0, b = 0;
      for (size_t x = 0; x < d->dims[j]; x++) {
        double qx = json_number_value(json_array_get(q, x));
        dot += qx * d->vec[j][x];
        a += qx * qx;
        b += d->vec[j][x] * d->vec[j][x];
      }
      double score = a > 0 && b > 0 ? dot / (sqrt(a) * sqrt(b)) : 0;
      if (score > best_score) {
        best = j;
        best_score = score;
      }
    }
    if (best == VDOUBLE_MAX)
      break;
    taken[best] = true;
    json_array_append_new(hits, json_pack("{s:I, s:f}", "id", (json_int_t)d->ids[best], "score",
                                          best_score));
  }
  json_t *ans = json_pack("{s:o}", "hits", hits);
  char *out = json_dumps(ans, JSON_COMPACT);
  json_decref(ans);
  return out;
}

static void vd_handler(const char *method, const char *path, const char *body, size_t len,
                       void *ctx, cph_httpd_reply *out) {
  (void)method;
  vdouble *d = ctx;
  json_t *req = json_loadb(body, len, 0, NULL);
  pthread_mutex_lock(&d->mu);
  char *answer = NULL;
  if (d->down || !req)
    *out = (cph_httpd_reply){500, strdup("{\"error\":{\"message\":\"index down\"}}"), 0};
  else if (strcmp(path, "/upsert") == 0)
    answer = vd_upsert(d, req);
  else if (strcmp(path, "/delete") == 0)
    answer = vd_delete(d, req);
  else if (strcmp(path, "/search") == 0)
    answer = vd_search(d, req);
  else
    *out = (cph_httpd_reply){404, strdup("{}"), 0};
  pthread_mutex_unlock(&d->mu);
  if (answer)
    *out = (cph_httpd_reply){200, answer, 0};
  json_decref(req);
}

static int setup_sharded_http_index(void **state) {
  pthread_mutex_lock(&g_vd.mu);
  memset(g_vd.ids, 0, sizeof g_vd.ids);
  memset(g_vd.upserts_per_shard, 0, sizeof g_vd.upserts_per_shard);
  g_vd.n = 0;
  g_vd.down = false;
  g_vd.wrong_shard = 0;
  pthread_mutex_unlock(&g_vd.mu);
  g_index = cph_httpd_start();
  cph_httpd_set_handler(g_index, vd_handler, &g_vd);
  char policy[1024];
  snprintf(policy, sizeof policy,
           "{:sessions {:janitor? true}\n"
           " :gc {:min-age-hours 1000}\n"
           " :vector-index {:kind :http :url \"%s\" :shards %d}\n"
           " :maintenance {:outbox {:backoff-base-ms 1 :backoff-max-ms 20 :drain-interval-s 1}}\n"
           " :store {:sync :none}}\n",
           cph_httpd_url(g_index), SHARDS);
  return setup_with(state, policy);
}

/* A search op carrying what cph_search_prepare found for q (as cephalond's search threads do). */
static cph_memory_hit *prepared_search(fixture *f, const char *q, cph_search_prep *prep,
                                       size_t *n, cph_op *op) {
  cph_strv scopes;
  cph_err err;
  assert_int_equal(cph_engine_memory_scopes(f->e, "s1", &scopes, &err), CPH_OK);
  assert_int_equal(scopes.count, 2); /* its own and its direct channel's */
  assert_string_equal(scopes.items[0], "s1");
  assert_string_equal(scopes.items[1], "#direct:s1");
  cph_search_prepare(cph_engine_policy(f->e), cph_engine_providers(f->e), q,
                     (const char *const *)scopes.items, scopes.count, 10, prep);
  cph_strv_free(&scopes);
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_MEMORY_SEARCH;
  op->u.search.session = "s1";
  op->u.search.query = (char *)q;
  op->u.search.query_vector = prep->query_vector;
  op->u.search.dims = prep->dims;
  op->u.search.index_hits = prep->index_hits;
  op->u.search.n_index_hits = prep->n_index_hits;
  op->u.search.degraded = prep->degraded;
  if (cph_fixture_run(f, op))
    fail_msg("search: %s", op->err.msg);
  *n = op->u.search.n_hits;
  return op->u.search.hits;
}

/* DESIGN §7: search works with the HTTP index (the query's hits come from it, asked off the
 * pass), and falls back to the lexical answer, degraded, when it is down. Index work is
 * batched per shard = memory id mod :shards, outbox items included. */
static void test_http_index_search_and_shards(void **state) {
  fixture *f = *state;
  mint_memories(f, TEXTS, 4); /* ids 1..4 */
  run_maintenance(f);         /* embedded: upserted, one request per shard */
  pthread_mutex_lock(&g_vd.mu);
  assert_int_equal(g_vd.n, 4);
  for (int s = 0; s < SHARDS; s++)
    assert_int_equal(g_vd.upserts_per_shard[s], 1);
  pthread_mutex_unlock(&g_vd.mu);

  cph_search_prep prep;
  cph_op op;
  size_t n;
  cph_memory_hit *hits = prepared_search(f, "rust compiler upgrade friday", &prep, &n, &op);
  assert_false(prep.degraded);
  assert_true(prep.n_index_hits >= 1);
  assert_int_equal(prep.index_hits[0].memory_id, 3); /* the index ranked it first */
  assert_true(n >= 1);
  assert_int_equal(hits[0].id, 3);
  assert_false(op.u.search.degraded);
  assert_false(hits_have(hits, n, 4));
  assert_scores_positive_best_first(hits, n);
  cph_op_clear_results(&op);
  cph_search_prep_free(&prep);

  /* the index is down: 200-equivalent answer, lexical, degraded */
  pthread_mutex_lock(&g_vd.mu);
  g_vd.down = true;
  pthread_mutex_unlock(&g_vd.mu);
  hits = prepared_search(f, "rust compiler upgrade friday", &prep, &n, &op);
  assert_true(prep.degraded);
  assert_non_null(strstr(prep.error, "vector index"));
  assert_true(op.u.search.degraded);
  assert_true(n >= 1);
  assert_int_equal(hits[0].id, 3);
  assert_scores_positive_best_first(hits, n);
  cph_op_clear_results(&op);
  cph_search_prep_free(&prep);
  pthread_mutex_lock(&g_vd.mu);
  g_vd.down = false;
  pthread_mutex_unlock(&g_vd.mu);

  /* compaction: the sources' deletes go through the outbox, each item in its shard */
  enqueue(f, "gc_plan", "sources=1,2,3,4");
  run_maintenance(f);
  cph_maint_stats st;
  cph_engine_maint_stats(f->e, &st);
  for (int round = 0; round < 10 && st.outbox_pending; round++) { /* a drain per shard */
    cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
    run_maintenance(f);
    cph_engine_maint_stats(f->e, &st);
  }
  cph_outbox_info *items;
  cph_err err;
  assert_int_equal(cph_engine_outbox(f->e, NULL, 10, &items, &n, &err), CPH_OK);
  assert_int_equal(n, 4);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(items[i].shard, items[i].memory_id % SHARDS);
    assert_string_equal(items[i].status, "done");
    cph_outbox_info_free(&items[i]);
  }
  free(items);
  pthread_mutex_lock(&g_vd.mu);
  assert_int_equal(g_vd.wrong_shard, 0);
  pthread_mutex_unlock(&g_vd.mu);

  /* the sources are gone from search; their summary answers, once */
  hits = prepared_search(f, "rust compiler", &prep, &n, &op);
  assert_true(n >= 1);
  for (size_t i = 0; i < n; i++) {
    assert_true(hits[i].id > 4);
    assert_string_equal(hits[i].kind, "summary");
  }
  assert_int_equal(n, 1);
  cph_op_clear_results(&op);
  cph_search_prep_free(&prep);
}

/* DESIGN §5: a family keeps one aggregate memory, updated in place — aggregate_upsert refreshes
 * its count, never mints a new memory per run. Counted in the closed engine's store. */
typedef struct text_out {
  char *text;
  size_t size;
} text_out;

/* A live aggregate memory (its text kept in the text_out). */
static bool is_aggregate_memory(void *ctx, const void *k, size_t klen, const void *v,
                                size_t vlen) {
  (void)k, (void)klen;
  text_out *out = ctx;
  cph_memory_rec m;
  cph_err err;
  assert_int_equal(cph_record_decode(&cph_memory_desc, v, vlen, &m, &err), CPH_OK);
  bool yes = m.kind == CPH_MEMORY_AGGREGATE && !m.deleted;
  if (yes)
    snprintf(out->text, out->size, "%s", m.text);
  cph_record_free(&cph_memory_desc, &m);
  return yes;
}

static size_t aggregate_memories(const char *dir, char *text, size_t size) {
  text_out out = {text, size};
  return cph_fixture_store_each(dir, CPH_DB_MEMORIES, is_aggregate_memory, &out);
}

static void test_aggregate_upsert_updates_the_familys_one_memory(void **state) {
  fixture *f = *state;
  cph_event_in ev = {0};
  ev.channel = "alerts";
  ev.sender = "nagios";
  ev.body = "disk usage on db-1 is above ninety percent";
  for (int i = 0; i < 3; i++) {
    cph_op op = {0};
    op.kind = CPH_OP_INGEST;
    op.u.ingest.events = &ev;
    op.u.ingest.n_events = 1;
    assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
    cph_op_clear_results(&op);
  }
  for (int run = 0; run < 3; run++) {
    enqueue(f, "aggregate_upsert", "family=1");
    run_maintenance(f);
  }
  cph_engine_close(f->e);
  char text[512] = "";
  assert_int_equal(aggregate_memories(f->dir, text, sizeof text), 1);
  assert_non_null(strstr(text, "3 similar messages in alerts"));
  cph_fixture_open(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_aggregate_upsert_updates_the_familys_one_memory, setup,
                                      teardown),
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
      cmocka_unit_test_setup_teardown(test_queued_memories_are_found_before_their_embedding,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_requests_embeddings_are_one_row_and_drain_in_batches,
                                      setup_small_embed_batches, teardown),
      cmocka_unit_test_setup_teardown(
          test_unprepared_search_with_external_embedder_is_lexical_and_degraded,
          setup_external_embedder, teardown),
      cmocka_unit_test_setup_teardown(test_http_index_search_and_shards,
                                      setup_sharded_http_index, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
