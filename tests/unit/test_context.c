/* Turn context assembly through the engine's public API, on a virtual clock and a temp LMDB
 * (DESIGN §6): the five sections inside the window, history cut oldest first, raw memory
 * giving way to summaries, memory accesses, and the multi-agent channel views with their
 * cursors (agents as "[name]" system messages, the away block, mid-conversation mentions,
 * cursors across a restart). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "store/records.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

/* Content dedupe off (similar test bodies must stay distinct messages); short summaries. */
static const char *POLICY = "{:sessions {:janitor? false :max-batch 64}\n"
                            " :dedupe {:min-length 1000000}\n"
                            " :store {:sync :none}}\n";

static const char *POLICY_MAINT = "{:sessions {:janitor? true :max-batch 64}\n"
                                  " :gc {:min-age-hours 1000}\n"
                                  " :dedupe {:min-length 1000000}\n"
                                  " :providers {:summarizer {:max-tokens 16}}\n"
                                  " :store {:sync :none}}\n";

/* Automatic gc plans of any memory read at most once. */
static const char *POLICY_GC = "{:sessions {:janitor? true :max-batch 64}\n"
                               " :gc {:min-age-hours 0 :max-access 1}\n"
                               " :dedupe {:min-length 1000000}\n"
                               " :store {:sync :none}}\n";

typedef cph_fixture fixture;

static int setup_with(void **state, const char *policy) {
  *state = cph_fixture_new("context", policy);
  return 0;
}

static int setup(void **state) { return setup_with(state, POLICY); }
static int setup_maint(void **state) { return setup_with(state, POLICY_MAINT); }
static int setup_gc(void **state) { return setup_with(state, POLICY_GC); }

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

typedef struct session_spec {
  const char *id;
  const char *subscribe; /* one channel or NULL */
  const char *member;    /* one channel or NULL */
  uint32_t autonomy_s;
  uint32_t window; /* 0 = the policy default */
  const char *tool;
} session_spec;

static void create(fixture *f, session_spec sp) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)sp.id;
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  char *sub[1] = {(char *)sp.subscribe}, *mem[1] = {(char *)sp.member}, *tools[1] = {(char *)sp.tool};
  if (sp.subscribe)
    op.u.session.in.subscribe = (cph_strv){sub, 1};
  if (sp.member)
    op.u.session.in.member = (cph_strv){mem, 1};
  if (sp.tool)
    op.u.session.in.tools = (cph_strv){tools, 1};
  op.u.session.in.autonomy_interval_s = sp.autonomy_s;
  op.u.session.in.context_window_tokens = sp.window;
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", sp.id, op.err.msg);
  cph_op_clear_results(&op);
}

static void update(fixture *f, const char *id, unsigned set, cph_session_state_t state,
                   uint32_t window) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_UPDATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.state = state;
  op.u.session.in.context_window_tokens = window;
  op.u.session.set = set;
  if (cph_fixture_run(f, &op))
    fail_msg("update %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

static void pause_session(fixture *f, const char *id) {
  update(f, id, CPH_SET_PAUSED, CPH_STATE_PAUSED, 0);
}
static void resume_session(fixture *f, const char *id) {
  update(f, id, CPH_SET_PAUSED, CPH_STATE_IDLE, 0);
}

/* Posts one event (sender "ann" when NULL), mentioning `mention` when set. */
static void post(fixture *f, const char *channel, const char *sender, const char *body,
                 const char *mention) {
  char *mentions[1] = {(char *)mention};
  cph_event_in ev = {0};
  ev.channel = (char *)channel;
  ev.sender = (char *)(sender ? sender : "ann");
  ev.body = (char *)body;
  if (mention)
    ev.mentions = (cph_strv){mentions, 1};
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = &ev;
  op.u.ingest.n_events = 1;
  if (cph_fixture_run(f, &op) || op.u.ingest.results[0].status == CPH_EV_REJECTED)
    fail_msg("ingest: %s", op.err.msg);
  cph_op_clear_results(&op);
  cph_engine_run_pass(f->e); /* stage it (§3.6: visible from the next pass) */
}

/* Leases the next turn (it must exist); the caller frees with cph_op_clear_results. */
static cph_turn_info *lease(fixture *f, cph_op *op) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w1";
  op->u.lease.deadline_ns = cph_clock_now(&f->clock) + 10 * CPH_NS_PER_S;
  if (cph_fixture_run(f, op))
    fail_msg("lease: %s", op->err.msg);
  return &op->u.lease.turn;
}

static void complete(fixture *f, const cph_turn_info *t, const char *reply,
                     const char *const *memories, size_t n_memories) {
  cph_memory_in mems[8] = {{0}};
  for (size_t i = 0; i < n_memories; i++)
    mems[i].text = (char *)memories[i];
  cph_op op = {0};
  op.kind = CPH_OP_COMPLETE;
  op.u.turn.turn_id = t->id;
  memcpy(op.u.turn.lease, t->lease, sizeof op.u.turn.lease);
  op.u.turn.reply_body = (char *)reply;
  op.u.turn.memories = mems;
  op.u.turn.n_memories = n_memories;
  if (cph_fixture_run(f, &op))
    fail_msg("complete: %s", op.err.msg);
}

/* Makes the session's autonomy tick due (interval 1 s) and leases it. */
static cph_turn_info *lease_tick(fixture *f, cph_op *op) {
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e);
  cph_turn_info *t = lease(f, op);
  assert_int_equal(t->kind, CPH_KIND_AUTONOMY_TICK);
  return t;
}

/* Index of the message with this role and content, -1 if none. */
static int find_message(const cph_turn_info *t, const char *role, const char *content) {
  for (size_t i = 0; i < t->n_messages; i++)
    if (strcmp(t->messages[i].role, role) == 0 && strcmp(t->messages[i].content, content) == 0)
      return (int)i;
  return -1;
}

/* The away block, or NULL. */
static const cph_message *away_block(const cph_turn_info *t) {
  const cph_message *found = NULL;
  for (size_t i = 0; i < t->n_messages; i++)
    if (strncmp(t->messages[i].content, "MESSAGES WHILE YOU WERE AWAY", 28) == 0) {
      assert_null(found); /* one block */
      found = &t->messages[i];
    }
  if (found)
    assert_string_equal(found->role, "system");
  return found;
}

/* The away block's content; the block must be there. */
static const char *away_text(const cph_turn_info *t) {
  const cph_message *m = away_block(t);
  assert_non_null(m);
  return m->content;
}

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void assert_inside_window(const cph_turn_info *t) {
  uint32_t sum = t->tokens.current_state + t->tokens.pending_obligations +
                 t->tokens.conversation_history + t->tokens.recent_memory +
                 t->tokens.available_tools;
  assert_int_equal(t->tokens.sections, sum);
  assert_true(t->tokens.sections <= t->tokens.window);
  assert_true(t->tokens.messages <= t->tokens.window);
}

/* Inserts a permanent PACT node into the session's tree. */
static void insert_node(fixture *f, const char *session, const char *at, const char *content) {
  cph_op op = {0};
  op.kind = CPH_OP_CONTEXT_INSERT;
  op.u.context.session = (char *)session;
  op.u.context.node.at = (char *)at;
  op.u.context.node.content = (char *)content;
  if (cph_fixture_run(f, &op))
    fail_msg("insert %s: %s", at, op.err.msg);
}

/* ---------------------------------------------------------------- sections */

static void test_inbox_turn_lists_obligations_and_only_its_senders_history(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .subscribe = "general", .tool = "search"});
  post(f, "general", "ann", "hello from ann", NULL);
  post(f, "general", "bob", "bob talks about something else", NULL);
  post(f, "random", "ann", "ann in another channel", NULL); /* reaches nobody: stored */
  cph_op l1;
  cph_turn_info *t = lease(f, &l1);
  assert_int_equal(t->n_staged, 2);
  complete(f, t, "hi ann and bob", NULL, 0);
  cph_op_clear_results(&l1);

  post(f, "general", "ann", "ann again, a question", NULL);
  cph_op l2;
  t = lease(f, &l2);
  assert_int_equal(t->kind, CPH_KIND_INBOX);
  /* pending_obligations: staged_count and id, sender, preview per staged message */
  assert_int_equal(t->n_staged, 1);
  assert_int_equal(t->n_obligations, 1);
  assert_int_equal(t->obligations[0].id, t->staged[0].id);
  assert_string_equal(t->obligations[0].sender, "ann");
  assert_string_equal(t->obligations[0].preview, "ann again, a question");
  /* conversation_history: ann's and the session's own entries in general, oldest first —
   * not bob's, not ann's in random, not the staged message itself */
  assert_int_equal(t->n_history, 2);
  assert_string_equal(t->history[0].body, "hello from ann");
  assert_string_equal(t->history[1].body, "hi ann and bob");
  assert_string_equal(t->history[1].sender, "s1");
  for (size_t i = 0; i < t->n_history; i++)
    assert_string_equal(t->history[i].channel, "general");
  /* available_tools: per-tool counts are not reported by completions: 0 */
  assert_int_equal(t->n_tools, 1);
  assert_string_equal(t->tools[0].name, "search");
  assert_int_equal(t->tools[0].calls_this_turn, 0);
  assert_int_equal(t->tools[0].calls_this_minute, 0);
  /* messages: the channel view (users -> user named by their sender, own -> assistant), the
   * trigger at depth 0; ann and bob both speak, so each user message says who */
  int ann = find_message(t, "user", "ann: hello from ann");
  int bob = find_message(t, "user", "bob: bob talks about something else");
  int own = find_message(t, "assistant", "hi ann and bob");
  assert_true(ann >= 0 && bob >= 0 && own >= 0);
  assert_string_equal(t->messages[ann].name, "ann");
  assert_string_equal(t->messages[bob].name, "bob");
  assert_null(t->messages[own].name);
  assert_int_equal(find_message(t, "user", "ann: ann in another channel"), -1);
  const cph_message *last = &t->messages[t->n_messages - 1];
  assert_string_equal(last->role, "user");
  assert_string_equal(last->content, "ann: ann again, a question");
  assert_string_equal(last->name, "ann");
  assert_string_equal(last->coord, "d0, 0, 0");
  assert_null(away_block(t)); /* a subscriber misses nothing its inbox had */
  /* the tree's cores (the inputs) are replaced by the channel view, not repeated; the wire's
   * "inbox:" marker is nowhere in the messages */
  for (size_t i = 0; i < t->n_messages; i++)
    assert_false(contains(t->messages[i].content, "inbox:"));
  assert_int_equal(t->n_views, 1);
  assert_string_equal(t->views[0].channel, "general");
  assert_true(t->views[0].had_cursor);
  assert_inside_window(t);
  cph_op_clear_results(&l2);
}

static void test_autonomy_tick_has_no_obligations_and_no_history(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "auto", .subscribe = "general", .autonomy_s = 1});
  post(f, "general", "ann", "earlier chatter", NULL);
  cph_op l1;
  cph_turn_info *t = lease(f, &l1);
  assert_int_equal(t->kind, CPH_KIND_INBOX);
  complete(f, t, "noted", NULL, 0);
  cph_op_clear_results(&l1);

  cph_op l2;
  t = lease_tick(f, &l2);
  assert_int_equal(t->n_staged, 0);       /* staged_count 0 */
  assert_int_equal(t->n_obligations, 0);  /* obligations: none */
  assert_int_equal(t->n_history, 0);      /* history: none */
  assert_int_equal(t->n_views, 0);
  assert_int_equal(t->tokens.conversation_history, 0);
  /* messages: the tree whole (the last turn's cores: its input's words, without the wire's
   * "inbox:" marker), then the tick at depth 0 */
  assert_true(find_message(t, "user", "earlier chatter") >= 0);
  assert_true(find_message(t, "assistant", "noted") >= 0);
  for (size_t i = 0; i < t->n_messages; i++)
    assert_false(contains(t->messages[i].content, "inbox:"));
  const cph_message *last = &t->messages[t->n_messages - 1];
  assert_string_equal(last->content, "autonomy_tick");
  assert_string_equal(last->coord, "d0, 0, 0");
  assert_inside_window(t);
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l2);

  /* the tick's own core keeps its name */
  cph_op l3;
  t = lease_tick(f, &l3);
  assert_true(find_message(t, "user", "autonomy_tick") >= 0 &&
              find_message(t, "user", "autonomy_tick") < (int)t->n_messages - 1);
  assert_true(find_message(t, "user", "earlier chatter") >= 0);
  cph_op_clear_results(&l3);
}

/* A turn that no message triggers (a tick) recalls the memories of every channel its session
 * listens to — the one of what was said to it alone (its direct channel) too — and no other
 * session's. */
static void test_autonomy_tick_recalls_what_was_said_to_it_alone(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "auto", .subscribe = "general", .autonomy_s = 1});
  create(f, (session_spec){.id = "other", .subscribe = "elsewhere"});
  const char *said[][2] = {{"auto", "the deploy key for auto lives in vault path ops/auto"},
                           {"other", "the deploy key for other lives in vault path ops/other"}};
  for (int k = 0; k < 2; k++) {
    cph_event_in ev = {.session = (char *)said[k][0], .sender = "ann", .body = (char *)said[k][1]};
    cph_op op = {0};
    op.kind = CPH_OP_INGEST;
    op.u.ingest.events = &ev;
    op.u.ingest.n_events = 1;
    assert_int_equal(cph_fixture_run(f, &op), CPH_OK);
    assert_int_equal(op.u.ingest.results[0].status, CPH_EV_QUEUED);
    cph_op_clear_results(&op);
    cph_engine_run_pass(f->e);
  }
  for (int k = 0; k < 3; k++) { /* auto's and other's turns, then auto's of the channel */
    if (k == 2)
      post(f, "general", "ann", "standup moved to ten", NULL);
    cph_op l;
    cph_turn_info *t = lease(f, &l);
    complete(f, t, NULL, NULL, 0);
    cph_op_clear_results(&l);
  }

  cph_op l;
  cph_turn_info *t = lease_tick(f, &l);
  int direct = -1, general = -1;
  for (size_t i = 0; i < t->n_memories; i++) {
    const cph_memory_item *m = &t->memories[i];
    if (strcmp(m->text, said[0][1]) == 0 && strcmp(m->scope, "#direct:auto") == 0)
      direct = (int)i;
    if (strcmp(m->text, "standup moved to ten") == 0 && strcmp(m->scope, "#general") == 0)
      general = (int)i;
    assert_string_not_equal(m->text, said[1][1]);
  }
  if (direct < 0 || general < 0)
    fail_msg("the tick's recent_memory: what was said to auto alone %s, its channel's %s",
             direct < 0 ? "missing" : "listed", general < 0 ? "missing" : "listed");
  cph_op_clear_results(&l);
}

static void test_small_window_cuts_history_oldest_first(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .subscribe = "general", .window = 256});
  static const char *const words[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot",
                                      "golf", "hotel", "india", "juliet", "kilo", "lima"};
  char body[12][96];
  for (int i = 0; i < 12; i++) {
    snprintf(body[i], sizeof body[i], "message %02d about %s, long enough to weigh a few tokens",
             i, words[i]);
    post(f, "general", "ann", body[i], NULL);
  }
  cph_op l1;
  cph_turn_info *t = lease(f, &l1);
  assert_int_equal(t->n_staged, 12);
  /* previews shrink to nothing, then only the first obligations fit: staged_count says 12 */
  assert_true(t->n_obligations >= 1 && t->n_obligations < 12);
  assert_int_equal(t->obligations[0].id, t->staged[0].id);
  assert_string_equal(t->obligations[0].preview, "...");
  assert_inside_window(t);
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l1);

  post(f, "general", "ann", "and now?", NULL);
  cph_op l2;
  t = lease(f, &l2);
  assert_true(t->n_history > 0);
  assert_true(t->n_history < 12);
  assert_true(t->tokens.history_cut > 0);
  /* the newest survive, contiguous, oldest first */
  for (size_t i = 0; i < t->n_history; i++)
    assert_string_equal(t->history[i].body, body[12 - t->n_history + i]);
  /* the messages' history part is cut the same way: the oldest go */
  assert_true(t->tokens.messages_cut > 0);
  assert_int_equal(find_message(t, "user", body[0]), -1);
  assert_true(find_message(t, "user", body[11]) >= 0);
  assert_inside_window(t);
  cph_op_clear_results(&l2);
}

static void test_tree_nodes_render_around_the_channel_view_without_its_cores(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .subscribe = "general"});
  post(f, "general", "ann", "first", NULL);
  cph_op l;
  cph_turn_info *t = lease(f, &l);
  complete(f, t, "reply one", NULL, 0); /* the tree now has cores "first", "reply one" */
  cph_op_clear_results(&l);
  insert_node(f, "s1", "d-1, 0, 0", "persona: terse");
  insert_node(f, "s1", "d1, 1, 0", "note on the newest history message");
  insert_node(f, "s1", "d0, 0, 1", "reminder after the current message");
  post(f, "general", "ann", "second", NULL);
  t = lease(f, &l);
  static const char *const want[][3] = {
      {"system", "persona: terse", "d-1, 0, 0"},
      {"user", "first", "d2, 0, 0"},
      {"assistant", "reply one", "d1, 0, 0"},
      {"system", "note on the newest history message", "d1, 1, 0"},
      {"user", "second", "d0, 0, 0"},
      {"system", "reminder after the current message", "d0, 0, 1"},
  };
  assert_int_equal(t->n_messages, 6); /* the tree's own cores are not repeated */
  for (size_t i = 0; i < 6; i++) {
    assert_string_equal(t->messages[i].role, want[i][0]);
    assert_string_equal(t->messages[i].content, want[i][1]);
    assert_string_equal(t->messages[i].coord, want[i][2]);
  }
  assert_inside_window(t);
  cph_op_clear_results(&l);
}

/* ---------------------------------------------------------------- memory */

static const char *const MEMS[] = {
    "one: the deployment pipeline for the billing service runs every night at two and emails "
    "the on-call engineer when a stage fails, which happened three times last week alone ok.",
    "two: the customer asked for invoices as PDF attachments rather than links, and prefers "
    "them to arrive on the first business day of every month with the usual cost breakdown.",
    "three: the staging database was migrated to the new cluster on tuesday; the old replicas "
    "stay read-only for a fortnight in case a rollback is needed by the payments team there.",
    "four: the team agreed to freeze feature work during the audit and to review every open "
    "pull request touching authentication before friday, with two approvals required on each.",
    "five: latency alerts fire when the p99 of the checkout endpoint passes eight hundred ms "
    "for five minutes; they page the platform rotation rather than the product engineers ok.",
    "six: the new hire starts monday and needs read access to the analytics warehouse, a "
    "laptop with the standard image, and an introduction to the incident response runbook.",
};

/* Runs cephalond's maintenance turns until three leases in a row find nothing. */
static void run_maintenance(fixture *f) { cph_fixture_run_maintenance(f, NULL, NULL); }

static void enqueue(fixture *f, const char *job, const char *args) {
  cph_op op = {0};
  op.kind = CPH_OP_JOB_ENQUEUE;
  op.u.job.in.job = (char *)job;
  op.u.job.in.args = (char *)args;
  if (cph_fixture_run(f, &op))
    fail_msg("enqueue %s: %s", job, op.err.msg);
}

static const cph_memory_item *find_memory(const cph_turn_info *t, uint64_t id) {
  for (size_t i = 0; i < t->n_memories; i++)
    if (t->memories[i].id == id)
      return &t->memories[i];
  return NULL;
}

static void test_every_included_memory_counts_as_an_access(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .autonomy_s = 1});
  cph_op l;
  cph_turn_info *t = lease_tick(f, &l);
  assert_int_equal(t->n_memories, 0);
  complete(f, t, NULL, MEMS, 2); /* memories 1 and 2 */
  cph_op_clear_results(&l);

  t = lease_tick(f, &l);
  assert_int_equal(t->n_memories, 2);
  assert_int_equal(t->memories[0].id, 2); /* newest first */
  assert_string_equal(t->memories[0].kind, "raw");
  assert_string_equal(t->memories[0].scope, "s1");
  assert_int_equal(t->memories[0].access_count, 1);
  assert_int_equal(t->memories[1].access_count, 1);
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);

  /* the count was written, and grows with every inclusion */
  t = lease_tick(f, &l);
  assert_int_equal(find_memory(t, 1)->access_count, 2);
  assert_int_equal(find_memory(t, 2)->access_count, 2);
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);
}

/* memory_counts: the stored access count of memories 1 and 2 (cph_fixture_store_each). */
typedef struct stored_counts {
  uint64_t count[3];
} stored_counts;

static bool note_count(void *ctx, const void *key, size_t key_len, const void *val,
                       size_t val_len) {
  (void)key;
  (void)key_len;
  stored_counts *sc = ctx;
  cph_memory_rec m;
  cph_err err;
  if (cph_record_decode(&cph_memory_desc, val, val_len, &m, &err))
    fail_msg("a memory record does not decode: %s", err.msg);
  if (m.id >= 1 && m.id <= 2)
    sc->count[m.id] = m.access_count;
  cph_record_free(&cph_memory_desc, &m);
  return true;
}

static stored_counts memory_counts(fixture *f) {
  stored_counts sc = {{0}};
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, note_count, &sc);
  return sc;
}

/* Access counts are counted in memory and written in batches (core/memaccess.h): a read sees
 * every access at once; the store has them within a second (kept through a kill -9, here the
 * child's _exit), and all of them after a clean close. What the crash took is at most the
 * last second's accesses, as the README says. */
static void test_access_counts_reach_the_store_within_a_second_and_at_close(void **state) {
  fixture *f = *state;
  cph_engine_close(f->e);
  f->e = NULL;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* the daemon that crashes */
    cph_fixture_open(f);
    create(f, (session_spec){.id = "s1", .autonomy_s = 1});
    cph_op l;
    cph_turn_info *t = lease_tick(f, &l);
    complete(f, t, NULL, MEMS, 2); /* memories 1 and 2 */
    cph_op_clear_results(&l);
    t = lease_tick(f, &l); /* their first access */
    int ok = find_memory(t, 1) && find_memory(t, 1)->access_count == 1;
    complete(f, t, NULL, NULL, 0);
    cph_op_clear_results(&l);
    cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
    cph_engine_run_pass(f->e); /* a second later: the flush */
    cph_event_in ev = {0};
    ev.session = "s1";
    ev.sender = "ann";
    ev.body = "a question right after";
    cph_op in;
    cph_fixture_ingest(f, &ev, 1, &in);
    cph_op_clear_results(&in);
    cph_engine_run_pass(f->e);
    t = lease(f, &l); /* the second access: read at once, in the store a second later */
    ok = ok && t->kind == CPH_KIND_INBOX && find_memory(t, 2) &&
         find_memory(t, 2)->access_count == 2;
    _exit(ok ? 0 : 3); /* no close: the memory of the process is gone */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  stored_counts sc = memory_counts(f);
  assert_int_equal(sc.count[1], 1); /* flushed a second after the access */
  assert_int_equal(sc.count[2], 1); /* the access of the crash's last second was not */

  cph_fixture_open(f); /* restarted: the count goes on from what was stored */
  cph_op l;
  cph_clock_advance(&f->clock, 2 * CPH_NS_PER_S);
  cph_engine_run_pass(f->e);
  cph_turn_info *t = lease(f, &l); /* the question again: its lease expired with the crash */
  assert_int_equal(t->kind, CPH_KIND_INBOX);
  assert_non_null(find_memory(t, 2));
  assert_int_equal(find_memory(t, 2)->access_count, 2);
  cph_op_clear_results(&l);
  cph_engine_close(f->e); /* a clean close writes what is counted */
  f->e = NULL;
  sc = memory_counts(f);
  assert_int_equal(sc.count[1], 2);
  assert_int_equal(sc.count[2], 2);
  cph_fixture_open(f);
}

/* gc's :max-access counts the accesses not yet written into the records (core/memaccess.h):
 * a memory read more often than allowed is never planned, whether or not its count reached
 * the store. Memories 1 and 2 are read twice, within the same second; 3 and 4 never. */
static void test_gc_counts_pending_accesses(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .autonomy_s = 1});
  cph_op l;
  cph_turn_info *t = lease_tick(f, &l);
  complete(f, t, NULL, MEMS, 2); /* memories 1 and 2 */
  cph_op_clear_results(&l);
  for (int i = 0; i < 2; i++) { /* two inbox turns, no time passing: both counts pending */
    cph_event_in ev = {0};
    ev.session = "s1";
    ev.sender = "ann";
    ev.body = i ? "and another question" : "a question";
    cph_op in;
    cph_fixture_ingest(f, &ev, 1, &in);
    cph_op_clear_results(&in);
    cph_engine_run_pass(f->e);
    t = lease(f, &l);
    assert_non_null(find_memory(t, 1));
    assert_int_equal(find_memory(t, 1)->access_count, (uint64_t)i + 1);
    complete(f, t, NULL, i ? NULL : MEMS + 2, i ? 0 : 2); /* memories 3 and 4, never read */
    cph_op_clear_results(&l);
  }
  pause_session(f, "s1");
  enqueue(f, "gc_plan", NULL); /* the automatic plan: :max-access 1, no minimum age */
  run_maintenance(f);
  cph_gc_group_info *groups;
  size_t n;
  cph_err err;
  assert_int_equal(cph_engine_gc_groups(f->e, NULL, 10, &groups, &n, &err), CPH_OK);
  bool planned[5] = {false};
  for (size_t g = 0; g < n; g++) {
    for (size_t i = 0; i < groups[g].n_source_ids; i++)
      if (groups[g].source_ids[i] < 5)
        planned[groups[g].source_ids[i]] = true;
    cph_gc_group_info_free(&groups[g]);
  }
  free(groups);
  assert_false(planned[1]); /* read twice: over :max-access */
  assert_false(planned[2]);
  assert_true(planned[3]); /* never read: planned */
  assert_true(planned[4]);
}

static void test_small_window_raw_memory_gives_way_to_summaries(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .autonomy_s = 1});
  cph_op l;
  cph_turn_info *t = lease_tick(f, &l);
  complete(f, t, NULL, MEMS, 6); /* raw memories 1..6 */
  cph_op_clear_results(&l);
  pause_session(f, "s1"); /* its ticks stay out of the maintenance turns' way */
  run_maintenance(f);
  enqueue(f, "gc_plan", "sources=1,2,3"); /* compaction: a summary (7) replaces 1..3 */
  run_maintenance(f);
  cph_gc_group_info *groups;
  size_t n;
  cph_err err;
  assert_int_equal(cph_engine_gc_groups(f->e, "committed", 10, &groups, &n, &err), CPH_OK);
  assert_int_equal(n, 1);
  uint64_t summary = groups[0].summary_id;
  cph_gc_group_info_free(&groups[0]);
  free(groups);
  resume_session(f, "s1");

  /* a large window: every live raw memory and the summary; the deleted sources never */
  t = lease_tick(f, &l);
  assert_non_null(find_memory(t, 4));
  assert_non_null(find_memory(t, 5));
  assert_non_null(find_memory(t, 6));
  assert_non_null(find_memory(t, summary));
  assert_string_equal(find_memory(t, summary)->kind, "summary");
  for (uint64_t id = 1; id <= 3; id++)
    assert_null(find_memory(t, id));
  assert_string_equal(t->memories[0].kind, "raw"); /* raw first */
  assert_string_equal(t->memories[t->n_memories - 1].kind, "summary");
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);

  /* a small window: raw memory gives way — fewer raw, the summary still in */
  update(f, "s1", CPH_SET_WINDOW, CPH_STATE_IDLE, 256);
  t = lease_tick(f, &l);
  size_t raw = 0;
  for (size_t i = 0; i < t->n_memories; i++)
    raw += strcmp(t->memories[i].kind, "raw") == 0;
  assert_true(raw >= 1);
  assert_true(raw < 3);
  assert_non_null(find_memory(t, 6)); /* the newest raw ones keep their place */
  assert_non_null(find_memory(t, summary));
  for (uint64_t id = 1; id <= 3; id++)
    assert_null(find_memory(t, id));
  assert_inside_window(t);
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);
}

/* ---------------------------------------------------------------- channel views */

static void test_agents_see_each_other_as_system_and_users_as_user(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "A", .subscribe = "room"});
  create(f, (session_spec){.id = "B", .subscribe = "room"});
  pause_session(f, "B");
  post(f, "room", "ann", "hello agents", NULL);
  cph_op la;
  cph_turn_info *t = lease(f, &la);
  assert_string_equal(t->session, "A");
  complete(f, t, "A here", NULL, 0);
  cph_op_clear_results(&la);
  resume_session(f, "B");

  cph_op lb;
  t = lease(f, &lb);
  assert_string_equal(t->session, "B");
  /* A's reply came after B's start: it is what B missed, as "[A] ..." */
  const cph_message *away = away_block(t);
  assert_non_null(away);
  assert_string_equal(away->content, "MESSAGES WHILE YOU WERE AWAY\n[A] A here");
  assert_null(away->name);
  /* one person speaks: her text as is, her name on the message */
  assert_string_equal(t->messages[t->n_messages - 1].content, "hello agents");
  assert_string_equal(t->messages[t->n_messages - 1].role, "user");
  assert_string_equal(t->messages[t->n_messages - 1].name, "ann");
  assert_int_equal(t->views[0].away, 1);
  complete(f, t, "B here", NULL, 0);
  cph_op_clear_results(&lb);

  /* a second round: A goes first again, then B */
  pause_session(f, "B");
  post(f, "room", "ann", "second question", NULL);
  t = lease(f, &la);
  assert_string_equal(t->session, "A");
  assert_true(find_message(t, "assistant", "A here") >= 0);
  assert_true(find_message(t, "user", "hello agents") >= 0);
  assert_string_equal(away_text(t), "MESSAGES WHILE YOU WERE AWAY\n[B] B here");
  complete(f, t, "A again", NULL, 0);
  cph_op_clear_results(&la);
  resume_session(f, "B");

  t = lease(f, &lb);
  assert_string_equal(t->session, "B");
  /* before its cursor: the user as user, the other agent as a system message with its name */
  int user = find_message(t, "user", "hello agents");
  int agent = find_message(t, "system", "[A] A here");
  int own = find_message(t, "assistant", "B here");
  assert_true(user >= 0 && agent > user && own > agent);
  assert_null(t->messages[agent].name); /* agents speak through the "[name]" prefix */
  assert_string_equal(away_text(t), "MESSAGES WHILE YOU WERE AWAY\n[A] A again");
  const cph_message *last = &t->messages[t->n_messages - 1];
  assert_string_equal(last->role, "user");
  assert_string_equal(last->content, "second question");
  assert_string_equal(last->coord, "d0, 0, 0");
  assert_inside_window(t);
  cph_op_clear_results(&lb);
}

/* DESIGN §6 channel views: a user message carries its sender as OpenAI's `name` (sanitised to
 * ^[a-zA-Z0-9_-]{1,64}$, the real sender kept in the text), and with several people in the
 * turn each user message starts "sender: ". */
static void test_users_are_named_and_prefixed_when_several_speak(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "ops-agent", .subscribe = "ops"});
  post(f, "ops", "alice", "restart the web service on host alpha", NULL);
  post(f, "ops", "bob", "and check the disk on beta", NULL);
  cph_op l;
  cph_turn_info *t = lease(f, &l);
  assert_int_equal(t->n_staged, 2);
  assert_int_equal(t->n_messages, 2);
  assert_string_equal(t->messages[0].role, "user");
  assert_string_equal(t->messages[0].name, "alice");
  assert_string_equal(t->messages[0].content, "alice: restart the web service on host alpha");
  assert_string_equal(t->messages[1].name, "bob");
  assert_string_equal(t->messages[1].content, "bob: and check the disk on beta");
  assert_inside_window(t);
  complete(f, t, "on it", NULL, 0);
  cph_op_clear_results(&l);

  /* a sender OpenAI would refuse as a name: one '_' per other character, cut at 64 */
  const char *odd = "Zo\xC3\xAB Smith <zoe@example.com>";
  post(f, "ops", odd, "is it back up?", NULL);
  t = lease(f, &l);
  const cph_message *last = &t->messages[t->n_messages - 1];
  assert_string_equal(last->name, "Zo__Smith__zoe_example_com_");
  /* alice and bob are in the history: several people, the real sender in the text */
  assert_string_equal(last->content, "Zo\xC3\xAB Smith <zoe@example.com>: is it back up?");
  assert_true(find_message(t, "user", "alice: restart the web service on host alpha") >= 0);
  assert_true(find_message(t, "assistant", "on it") >= 0);
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);

  char longest[101];
  memset(longest, 'x', 100);
  longest[100] = '\0';
  post(f, "ops", longest, "one more", NULL);
  t = lease(f, &l);
  last = &t->messages[t->n_messages - 1];
  assert_int_equal(strlen(last->name), 64);
  assert_int_equal(strspn(last->name, "x"), 64);
  cph_op_clear_results(&l);
}

static void test_agent_mentioned_mid_conversation_sees_all_history(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "C"}); /* neither subscribed nor a member */
  create(f, (session_spec){.id = "D"});
  post(f, "room", "ann", "first thing ann said", NULL);
  post(f, "room", "bob", "bob replied to it", NULL);
  post(f, "room", "ann", "C, can you help?", "C");
  cph_op l;
  cph_turn_info *t = lease(f, &l);
  assert_string_equal(t->session, "C");
  assert_false(t->views[0].had_cursor);
  assert_int_equal(t->views[0].cursor, 0);
  assert_string_equal(away_text(t), "MESSAGES WHILE YOU WERE AWAY\n"
                                              "[ann] first thing ann said\n"
                                              "[bob] bob replied to it");
  /* ann and bob speak in this turn (the away block counts): the trigger says who */
  assert_string_equal(t->messages[t->n_messages - 1].content, "ann: C, can you help?");
  assert_string_equal(t->messages[t->n_messages - 1].name, "ann");
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);

  /* mentioned on a channel's first message: it starts fresh, nothing before */
  post(f, "fresh", "ann", "D, a brand new topic", "D");
  t = lease(f, &l);
  assert_string_equal(t->session, "D");
  assert_null(away_block(t));
  assert_int_equal(t->n_history, 0);
  assert_int_equal(t->n_messages, 1);
  assert_string_equal(t->messages[0].content, "D, a brand new topic"); /* one person */
  assert_string_equal(t->messages[0].name, "ann");
  cph_op_clear_results(&l);
}

static void test_returning_agent_gets_exactly_what_it_missed(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "A", .subscribe = "room"});
  create(f, (session_spec){.id = "C", .member = "room"});
  pause_session(f, "A");
  post(f, "room", "ann", "q1 for C", "C");
  cph_op l;
  cph_turn_info *t = lease(f, &l);
  assert_string_equal(t->session, "C");
  complete(f, t, "C answers q1", NULL, 0);
  cph_op_clear_results(&l);
  resume_session(f, "A");
  t = lease(f, &l);
  assert_string_equal(t->session, "A");
  complete(f, t, "A chimes in", NULL, 0);
  cph_op_clear_results(&l);
  pause_session(f, "A"); /* A's inbox fills; C is the one to run */

  post(f, "room", "ann", "chat while C is away", NULL);
  post(f, "room", "bob", "more chat from bob", NULL);
  post(f, "room", "ann", "q2 for C", "C");
  t = lease(f, &l);
  assert_string_equal(t->session, "C");
  assert_true(t->views[0].had_cursor);
  /* exactly the messages it missed: not its own reply, not the staged mention */
  assert_string_equal(away_text(t), "MESSAGES WHILE YOU WERE AWAY\n"
                                              "[A] A chimes in\n"
                                              "[ann] chat while C is away\n"
                                              "[bob] more chat from bob");
  assert_true(find_message(t, "user", "ann: q1 for C") >= 0);
  assert_true(find_message(t, "assistant", "C answers q1") >= 0);
  assert_string_equal(t->messages[t->n_messages - 1].content, "ann: q2 for C");
  assert_int_equal(t->n_staged, 1);
  cph_op_clear_results(&l);
}

static void test_cursors_survive_a_restart(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "C", .member = "room"});
  post(f, "room", "ann", "before C was asked", NULL);
  post(f, "room", "ann", "C, first question", "C");
  cph_op l;
  cph_turn_info *t = lease(f, &l);
  assert_string_equal(away_text(t),
                      "MESSAGES WHILE YOU WERE AWAY\n[ann] before C was asked");
  uint64_t seen = t->views[0].seen_index;
  complete(f, t, NULL, NULL, 0);
  cph_op_clear_results(&l);
  post(f, "room", "bob", "said after C's turn", NULL);

  cph_engine_close(f->e);
  cph_fixture_open(f);

  post(f, "room", "ann", "C, second question", "C");
  t = lease(f, &l);
  assert_true(t->views[0].had_cursor);
  assert_int_equal(t->views[0].cursor, seen);
  assert_string_equal(away_text(t),
                      "MESSAGES WHILE YOU WERE AWAY\n[bob] said after C's turn");
  /* what it had processed is ordinary history now */
  assert_true(find_message(t, "user", "ann: before C was asked") >= 0); /* bob spoke too */
  assert_true(find_message(t, "user", "ann: C, first question") >= 0);
  cph_op_clear_results(&l);
}

static void test_failed_turn_does_not_move_the_cursor(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "C", .member = "room"});
  post(f, "room", "ann", "context C should see", NULL);
  post(f, "room", "ann", "C, please look", "C");
  cph_op l;
  cph_turn_info *t = lease(f, &l);
  assert_non_null(away_block(t));
  cph_op fail = {0};
  fail.kind = CPH_OP_FAIL;
  fail.u.turn.turn_id = t->id;
  memcpy(fail.u.turn.lease, t->lease, sizeof fail.u.turn.lease);
  assert_int_equal(cph_fixture_run(f, &fail), CPH_OK);
  cph_op_clear_results(&l);
  t = lease(f, &l); /* the same input again, seen the same way */
  assert_false(t->views[0].had_cursor);
  assert_string_equal(away_text(t),
                      "MESSAGES WHILE YOU WERE AWAY\n[ann] context C should see");
  cph_op_clear_results(&l);
}

/* A session's memories are found through its scope, however many other sessions minted since:
 * more than a turn's scan limit (1024 records) of someone else's memories must not hide it. */
static void test_own_memory_found_behind_many_of_other_sessions(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .autonomy_s = 1});
  create(f, (session_spec){.id = "s2", .autonomy_s = 1});
  pause_session(f, "s2");
  cph_op l;
  cph_turn_info *t = lease_tick(f, &l);
  assert_string_equal(t->session, "s1");
  static const char *const MINE[] = {"s1 keeps this one"};
  complete(f, t, NULL, MINE, 1);
  uint64_t mine = 1; /* the first memory minted */
  cph_op_clear_results(&l);

  pause_session(f, "s1");
  resume_session(f, "s2");
  static const char *const THEIRS[] = {"x", "x", "x", "x", "x", "x", "x", "x"};
  for (int i = 0; i < 1100 / 8 + 1; i++) {
    t = lease_tick(f, &l);
    assert_string_equal(t->session, "s2");
    complete(f, t, NULL, THEIRS, 8);
    cph_op_clear_results(&l);
  }
  pause_session(f, "s2");
  resume_session(f, "s1");
  t = lease_tick(f, &l);
  assert_string_equal(t->session, "s1");
  assert_int_equal(t->n_memories, 1);
  assert_int_equal(t->memories[0].id, mine);
  assert_string_equal(t->memories[0].text, "s1 keeps this one");
  cph_op_clear_results(&l);
}

/* The tree is stored whole per session: every field of every node survives a restart. */
static void test_tree_survives_a_restart_field_by_field(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1"});
  insert_node(f, "s1", "d-1, 0, 0", "you are s1");
  cph_context_stage_in stages[2] = {{"d0, 0, 1", 2}, {"d0, 0, -1", 0}};
  char *tags[2] = {"a", "b"};
  cph_op op = {0};
  op.kind = CPH_OP_CONTEXT_INSERT;
  op.u.context.session = "s1";
  op.u.context.node.content = "reminder";
  op.u.context.node.lifecycle = stages;
  op.u.context.node.n_lifecycle = 2;
  op.u.context.node.key = "r1";
  op.u.context.node.tags = (cph_strv){tags, 2};
  op.u.context.node.at = "d0, 0, 1";
  if (cph_fixture_run(f, &op))
    fail_msg("insert: %s", op.err.msg);
  memset(&op, 0, sizeof op);
  op.kind = CPH_OP_CONTEXT_INSERT;
  op.u.context.session = "s1";
  op.u.context.node.at = "d1, 2, 0";
  op.u.context.node.content = "every fifth";
  op.u.context.node.ttl = 2;
  op.u.context.node.cadence = 5;
  assert_int_equal(cph_fixture_run(f, &op), CPH_OK);

  cph_context_node_info *before, *after;
  size_t n_before, n_after;
  uint64_t ep_before, ep_after;
  cph_err err;
  assert_int_equal(cph_engine_context(f->e, "s1", NULL, &before, &n_before, &ep_before, &err),
                   CPH_OK);
  assert_int_equal(n_before, 3);
  cph_engine_close(f->e);
  cph_fixture_open(f);
  assert_int_equal(cph_engine_context(f->e, "s1", NULL, &after, &n_after, &ep_after, &err),
                   CPH_OK);
  assert_int_equal(n_after, n_before);
  assert_int_equal(ep_after, ep_before);
  for (size_t i = 0; i < n_before; i++) {
    const cph_context_node_info *a = &before[i], *b = &after[i];
    assert_int_equal(a->id, b->id);
    assert_string_equal(a->at, b->at);
    assert_string_equal(a->content, b->content);
    assert_int_equal(a->ttl, b->ttl);
    assert_int_equal(a->cadence, b->cadence);
    assert_int_equal(a->n_lifecycle, b->n_lifecycle);
    for (size_t j = 0; j < a->n_lifecycle; j++) {
      assert_string_equal(a->lifecycle[j].at, b->lifecycle[j].at);
      assert_int_equal(a->lifecycle[j].ttl, b->lifecycle[j].ttl);
    }
    assert_true((a->key == NULL) == (b->key == NULL));
    if (a->key)
      assert_string_equal(a->key, b->key);
    assert_int_equal(a->tags.count, b->tags.count);
    for (size_t j = 0; j < a->tags.count; j++)
      assert_string_equal(a->tags.items[j], b->tags.items[j]);
  }
  const cph_context_node_info *r = NULL;
  for (size_t i = 0; i < n_after; i++)
    if (after[i].key && strcmp(after[i].key, "r1") == 0)
      r = &after[i];
  assert_non_null(r);
  assert_int_equal(r->n_lifecycle, 2);
  assert_int_equal(r->tags.count, 2);
  cph_context_nodes_free(before, n_before);
  cph_context_nodes_free(after, n_after);
}

/* A damaged tree value is reported, naming the database and the session; nothing crashes and
 * other sessions are untouched. */
static void test_corrupt_tree_is_named_and_contained(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1"});
  create(f, (session_spec){.id = "s2"});
  insert_node(f, "s1", "d-1, 0, 0", "you are s1");
  insert_node(f, "s2", "d-1, 0, 0", "you are s2");
  cph_engine_close(f->e);
  f->e = NULL;

  cph_store *st;
  cph_store_options so = {f->dir, 64u << 20, CPH_SYNC_NONE};
  cph_err err = {0};
  if (cph_store_open(&so, &st, &err))
    fail_msg("store: %s", err.msg);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "s1");
  cph_val v;
  assert_int_equal(cph_txn_get(&t, CPH_DB_CONTEXT, &k, &v), CPH_OK);
  uint8_t *cut = malloc(v.len);
  memcpy(cut, v.data, v.len);
  assert_int_equal(cph_txn_put(&t, CPH_DB_CONTEXT, &k, cut, v.len - 3), CPH_OK); /* truncated */
  free(cut);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);

  cph_fixture_open(f);
  cph_context_node_info *nodes;
  size_t n;
  uint64_t ep;
  assert_int_equal(cph_engine_context(f->e, "s1", NULL, &nodes, &n, &ep, &err), CPH_ECORRUPT);
  assert_non_null(strstr(err.msg, "database \"context\""));
  assert_non_null(strstr(err.msg, "\"s1\""));
  assert_int_equal(cph_engine_context(f->e, "s2", NULL, &nodes, &n, &ep, &err), CPH_OK);
  assert_int_equal(n, 1);
  assert_string_equal(nodes[0].content, "you are s2");
  cph_context_nodes_free(nodes, n);
}

/* Trees are kept decoded between turns (pact_keep): what turns and reads see must be what the
 * store holds — across lease, completion, an insert between turns, and a restart. */
static void test_kept_trees_match_the_store(void **state) {
  fixture *f = *state;
  create(f, (session_spec){.id = "s1", .autonomy_s = 1});
  insert_node(f, "s1", "d-1, 1, 0", "rule one");
  cph_op l;
  for (int i = 0; i < 3; i++) {
    cph_turn_info *t = lease_tick(f, &l);
    assert_true(find_message(t, "system", "rule one") >= 0);
    char reply[32];
    snprintf(reply, sizeof reply, "reply %d", i);
    complete(f, t, reply, NULL, 0);
    cph_op_clear_results(&l);
  }
  insert_node(f, "s1", "d-1, 2, 0", "rule two"); /* between turns: the next one shows it */
  cph_turn_info *t = lease_tick(f, &l);
  assert_true(find_message(t, "system", "rule two") >= 0);
  assert_true(find_message(t, "assistant", "reply 2") >= 0);
  complete(f, t, "reply 3", NULL, 0);
  cph_op_clear_results(&l);

  cph_context_node_info *mem, *disk;
  size_t n_mem, n_disk;
  uint64_t ep_mem, ep_disk;
  cph_err err;
  assert_int_equal(cph_engine_context(f->e, "s1", NULL, &mem, &n_mem, &ep_mem, &err), CPH_OK);
  cph_engine_close(f->e);
  cph_fixture_open(f); /* nothing cached: read from the store */
  assert_int_equal(cph_engine_context(f->e, "s1", NULL, &disk, &n_disk, &ep_disk, &err),
                   CPH_OK);
  assert_int_equal(ep_mem, 4);
  assert_int_equal(ep_disk, ep_mem);
  assert_int_equal(n_disk, n_mem);
  for (size_t i = 0; i < n_mem; i++) {
    assert_int_equal(mem[i].id, disk[i].id);
    assert_string_equal(mem[i].at, disk[i].at);
    assert_string_equal(mem[i].content, disk[i].content);
  }
  cph_context_nodes_free(mem, n_mem);
  cph_context_nodes_free(disk, n_disk);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_inbox_turn_lists_obligations_and_only_its_senders_history, setup, teardown),
      cmocka_unit_test_setup_teardown(test_autonomy_tick_has_no_obligations_and_no_history,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_autonomy_tick_recalls_what_was_said_to_it_alone,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_small_window_cuts_history_oldest_first, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_tree_nodes_render_around_the_channel_view_without_its_cores, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_access_counts_reach_the_store_within_a_second_and_at_close, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gc_counts_pending_accesses, setup_gc, teardown),
      cmocka_unit_test_setup_teardown(test_every_included_memory_counts_as_an_access, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_small_window_raw_memory_gives_way_to_summaries,
                                      setup_maint, teardown),
      cmocka_unit_test_setup_teardown(test_agents_see_each_other_as_system_and_users_as_user,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_users_are_named_and_prefixed_when_several_speak, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_agent_mentioned_mid_conversation_sees_all_history,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_returning_agent_gets_exactly_what_it_missed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cursors_survive_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_turn_does_not_move_the_cursor, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_own_memory_found_behind_many_of_other_sessions, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_tree_survives_a_restart_field_by_field, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_tree_is_named_and_contained, setup, teardown),
      cmocka_unit_test_setup_teardown(test_kept_trees_match_the_store, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
