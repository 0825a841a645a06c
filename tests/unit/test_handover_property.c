/* A moved session's next turn shows the model what it would have shown on the node it left
 * (server/clusterflow.h 11., core/handover.c): the property behind cluster mode's takeover, in
 * one process. Per seeded case, two engines x and y (two nodes) with session "a" (a random
 * window, subscribed to "room"); on x the session answers a random number of messages of
 * random lengths from three senders, on its direct channel or in "room" (sometimes with a
 * memory its worker gives, sometimes after a node a worker inserts), each in a turn of its
 * own; the last completion's state is imported into y. In half the cases the session answers
 * more on y and its state goes back to x, which still holds its copy from before (a node that
 * comes back). Then the same message is posted to "a" on the node it left and on its owner
 * and leased: the two turns' messages (every role, text and coordinate, in order), history
 * sections, memory sections (kind, scope, text) and token accounts (what was cut) must be
 * equal. That covers the tree, the channel history a turn shows (as much as its window and
 * its reads allow: more than the newest 64 entries once), and the memories listed in place of
 * the history the window cuts. On failure the seed is printed (rerun:
 * CPH_PROPERTY_SEED=<seed> CPH_PROPERTY_CASES=1; CPH_TEST_DEBUG=1 prints each case's draw). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/buf.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/prop.h"

#define DEFAULT_CASES 40
#define MAX_TURNS 260 /* past what one turn reads of a channel (512 entries) with its replies */

static const uint64_t WINDOWS[] = {256, 1024, 8192, 32768, 200000};

static const char *const WORDS[] = {"kettle", "orbit", "lantern", "quarry", "velvet", "harbor",
                                    "cinder", "meadow", "pylon",  "saffron", "tundra", "walnut"};

/* A text of about `len` bytes: a unique head ("<tag> <i>, <hex>") and random words, so that no
 * two fold as near-duplicates (DESIGN §5). */
static void text(rng *r, char *out, size_t cap, const char *tag, int i, size_t len) {
  size_t at = (size_t)snprintf(out, cap, "%s %d, %08x", tag, i, (unsigned)below(r, 0xffffffffu));
  while (at + 12 < len && at + 12 < cap)
    at += (size_t)snprintf(out + at, cap - at, " %s", WORDS[below(r, 12)]);
}

/* Budgets that never hold a turn back; warm_channels 0 reads channel history from the store,
 * else from the channels' warm tails (core/chantail.h): both ways are drawn. */
static cph_fixture *node(const char *tag, uint64_t seed, uint64_t window, int warm_channels) {
  char name[48], policy[512];
  snprintf(name, sizeof name, "hop_%s_%llu", tag, (unsigned long long)seed);
  snprintf(policy, sizeof policy,
           "{:scheduler {:lanes {:interactive {:turns 1000000 :tool-calls 1000000}}\n"
           "             :credits {:refill-per-second 0 :cost {:interactive 0}}}\n"
           " :sessions {:warm-channels %d :janitor? false}\n"
           " :store {:sync :none}}\n",
           warm_channels);
  cph_fixture *f = cph_fixture_new(name, policy);
  cph_op create = {0};
  create.kind = CPH_OP_SESSION_CREATE;
  create.u.session.in.id = "a";
  create.u.session.in.lane = CPH_LANE_INTERACTIVE;
  create.u.session.in.context_window_tokens = window;
  char *rooms[] = {"room"};
  create.u.session.in.subscribe.items = rooms;
  create.u.session.in.subscribe.count = 1;
  if (cph_fixture_run(f, &create))
    fail_msg("create a: %s", create.err.msg);
  cph_op_clear_results(&create);
  cph_engine_report_consumed(f->e, true);
  assert_int_equal(cph_engine_reply_origins(f->e, tag), CPH_OK); /* cluster mode's identities */
  return f;
}

/* Posts body to "a" on f (in the channel "room" from `sender` when room) and leases its turn
 * into *lease. */
static void post_and_lease(cph_fixture *f, const char *body, bool room, const char *sender,
                           cph_op *lease) {
  cph_event_in ev = {0};
  if (room)
    ev.channel = "room";
  else
    ev.session = "a";
  ev.sender = (char *)sender;
  ev.body = (char *)body;
  cph_op in;
  cph_fixture_ingest(f, &ev, 1, &in);
  cph_op_clear_results(&in);
  cph_fixture_lease(f, "w", lease);
  if (lease->u.lease.turn.id == 0 || strcmp(lease->u.lease.turn.session, "a") != 0)
    fail_msg("no turn of \"a\" leased after posting \"%.40s\"", body);
}

/* Fails unless the two turns show the same messages and token accounts. */
static void same_turn(uint64_t seed, const cph_turn_info *x, const cph_turn_info *y) {
  CPH_PROP_CHECK(seed, x->n_messages == y->n_messages,
                 "the turn shows %zu messages on the node it left, %zu on its new owner",
                 x->n_messages, y->n_messages);
  for (size_t i = 0; i < x->n_messages; i++) {
    const cph_message *a = &x->messages[i], *b = &y->messages[i];
    CPH_PROP_CHECK(seed,
                   strcmp(a->role, b->role) == 0 && strcmp(a->content, b->content) == 0 &&
                       strcmp(a->coord, b->coord) == 0,
                   "message %zu of %zu: %s [%s] \"%.120s\" on the node it left, %s [%s] "
                   "\"%.120s\" on its new owner",
                   i, x->n_messages, a->role, a->coord, a->content, b->role, b->coord,
                   b->content);
  }
  CPH_PROP_CHECK(seed, x->n_history == y->n_history,
                 "the history section lists %zu entries on the node it left, %zu on its new "
                 "owner",
                 x->n_history, y->n_history);
  for (size_t i = 0; i < x->n_history; i++) {
    const cph_history_entry *a = &x->history[i], *b = &y->history[i];
    CPH_PROP_CHECK(seed,
                   strcmp(a->channel, b->channel) == 0 && strcmp(a->sender, b->sender) == 0 &&
                       strcmp(a->body, b->body) == 0 && a->ts_ms == b->ts_ms,
                   "history entry %zu of %zu: %s \"%.80s\" on the node it left, %s \"%.80s\" "
                   "on its new owner",
                   i, x->n_history, a->sender, a->body, b->sender, b->body);
  }
  /* memories by kind, scope and text (their ids are each node's own) */
  CPH_PROP_CHECK(seed, x->n_memories == y->n_memories,
                 "the memory section lists %zu memories on the node it left (the oldest "
                 "\"%.60s\"), %zu on its new owner",
                 x->n_memories, x->n_memories ? x->memories[x->n_memories - 1].text : "",
                 y->n_memories);
  for (size_t i = 0; i < x->n_memories; i++) {
    const cph_memory_item *a = &x->memories[i], *b = &y->memories[i];
    CPH_PROP_CHECK(seed,
                   strcmp(a->kind, b->kind) == 0 && strcmp(a->scope, b->scope) == 0 &&
                       strcmp(a->text, b->text) == 0,
                   "memory %zu of %zu: %s %s \"%.80s\" on the node it left, %s %s \"%.80s\" on "
                   "its new owner",
                   i, x->n_memories, a->kind, a->scope, a->text, b->kind, b->scope, b->text);
  }
  const cph_context_tokens *a = &x->tokens, *b = &y->tokens;
  CPH_PROP_CHECK(seed,
                 a->conversation_history == b->conversation_history &&
                     a->recent_memory == b->recent_memory && a->history_cut == b->history_cut &&
                     a->messages == b->messages && a->messages_cut == b->messages_cut,
                 "token accounts: history %u/%u, memory %u/%u, history cut %u/%u, messages "
                 "%u/%u, messages cut %u/%u (the node it left / its new owner)",
                 a->conversation_history, b->conversation_history, a->recent_memory,
                 b->recent_memory, a->history_cut, b->history_cut, a->messages, b->messages,
                 a->messages_cut, b->messages_cut);
}

/* `turns` turns of "a" on f, drawn from r; the last completion's state into *state (freed
 * first; *state stays when turns is 0). */
static void run_turns(uint64_t seed, rng *r, cph_fixture *f, int first, int turns,
                      size_t longest, uint8_t **state, size_t *state_len,
                      cph_fixture_items *items) {
  char body[1024], reply[1024], memory[256];
  for (int i = first; i < first + turns; i++) {
    text(r, body, sizeof body, "question", i, 8 + below(r, (uint32_t)longest));
    static const char *const senders[] = {"ann", "bob", "cy"};
    cph_op lease;
    post_and_lease(f, body, below(r, 3) == 0, senders[below(r, 3)], &lease);
    if (below(r, 16) == 0) { /* a node a worker inserts */
      cph_op ins = {0};
      ins.kind = CPH_OP_CONTEXT_INSERT;
      ins.u.context.session = "a";
      text(r, memory, sizeof memory, "note", i, 30);
      ins.u.context.node.at = "d0, 1, 0";
      ins.u.context.node.content = memory;
      ins.u.context.node.ttl = below(r, 2) ? 0 : 1 + below(r, 20);
      if (cph_fixture_run(f, &ins))
        fail_msg("seed %llu: inserting a node: %s", (unsigned long long)seed, ins.err.msg);
      cph_op_clear_results(&ins);
    }
    cph_op done = {0};
    done.kind = CPH_OP_COMPLETE;
    done.u.turn.turn_id = lease.u.lease.turn.id;
    memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
    text(r, reply, sizeof reply, "reply", i, 8 + below(r, (uint32_t)longest));
    done.u.turn.reply_body = reply;
    cph_memory_in m = {0};
    if (below(r, 4) == 0) {
      text(r, memory, sizeof memory, "keepsake", i, 40);
      m.text = memory;
      done.u.turn.memories = &m;
      done.u.turn.n_memories = 1;
    }
    done.u.turn.tokens = 10;
    if (cph_fixture_run(f, &done))
      fail_msg("seed %llu: completing turn %d: %s", (unsigned long long)seed, i, done.err.msg);
    done.u.turn.reply_body = NULL;
    done.u.turn.memories = NULL;
    done.u.turn.n_memories = 0;
    free(*state);
    *state = done.u.turn.state;
    *state_len = done.u.turn.state_len;
    done.u.turn.state = NULL;
    cph_fixture_items_take(items, &done.u.turn.items);
    cph_op_clear_results(&done);
    cph_op_clear_results(&lease);
    if (below(r, 12) == 0) { /* a seal: it puts the session's state too, and is an item */
      char trigger[32];
      snprintf(trigger, sizeof trigger, "seal %d", i);
      cph_op seal;
      cph_fixture_seal(f, "a", trigger, &seal);
      if (seal.u.context.state) {
        free(*state);
        *state = seal.u.context.state;
        *state_len = seal.u.context.state_len;
        seal.u.context.state = NULL;
      }
      cph_fixture_items_take(items, &seal.u.context.items);
      cph_op_clear_results(&seal);
    }
  }
  CPH_PROP_CHECK(seed, *state != NULL, "the last completion exported no state");
}

/* Imports the state and the items as the log's bucket holds them (its newest value per key)
 * into "a" on f, as a node taking the shard over does. */
static void import_state(uint64_t seed, cph_fixture *f, const uint8_t *state, size_t len,
                         const cph_fixture_items *items) {
  cph_state_item *last = calloc(items->n ? items->n : 1, sizeof *last);
  assert_non_null(last);
  size_t n = 0;
  for (size_t i = 0; i < items->n; i++) {
    bool later = false;
    for (size_t k = i + 1; k < items->n && !later; k++)
      later = strcmp(items->v[k].name, items->v[i].name) == 0;
    if (!later)
      last[n++] = items->v[i];
  }
  cph_op imp = {0};
  imp.kind = CPH_OP_SESSION_STATE;
  imp.u.state.session = "a";
  imp.u.state.data = state;
  imp.u.state.len = len;
  imp.u.state.items = last;
  imp.u.state.n_items = n;
  int rc = cph_fixture_run(f, &imp);
  CPH_PROP_CHECK(seed, rc == CPH_OK, "importing the state (%zu bytes) and %zu items: %s", len, n,
                 imp.err.msg);
  CPH_PROP_CHECK(seed, imp.u.state.items_refused == 0, "%u of %zu items refused",
                 imp.u.state.items_refused, n);
  cph_op_clear_results(&imp);
  free(last);
}

/* What a user reads of "a" on f — its context tree, its ended turns and its seals — one line
 * each, into a malloc'd string. Ids are each node's own and left out; origins are the
 * records' identities in the cluster. */
static char *session_reads(cph_fixture *f) {
  cph_buf b = {0};
  cph_context_node_info *nodes;
  size_t n;
  uint64_t episode;
  cph_err err = {0};
  assert_int_equal(cph_engine_context(f->e, "a", NULL, &nodes, &n, &episode, &err), CPH_OK);
  char line[160];
  snprintf(line, sizeof line, "episode %llu\n", (unsigned long long)episode);
  cph_buf_puts(&b, line);
  for (size_t i = 0; i < n; i++) {
    snprintf(line, sizeof line, "node %s ttl %lld cadence %lld made %llu %s: ", nodes[i].at,
             (long long)nodes[i].ttl, (long long)nodes[i].cadence,
             (unsigned long long)nodes[i].created_at_episode,
             nodes[i].role ? nodes[i].role : "-");
    cph_buf_puts(&b, line);
    cph_buf_puts(&b, nodes[i].content ? nodes[i].content : "");
    cph_buf_puts(&b, "\n");
  }
  cph_context_nodes_free(nodes, n);
  cph_turn_record *turns;
  assert_int_equal(cph_engine_session_turn_records(f->e, "a", 100000, &turns, &n, &err), CPH_OK);
  for (size_t i = 0; i < n; i++) {
    snprintf(line, sizeof line, "turn %s %s episode %llu tokens %llu: ", turns[i].origin,
             turns[i].state, (unsigned long long)turns[i].episode,
             (unsigned long long)turns[i].cost_tokens);
    cph_buf_puts(&b, line);
    cph_buf_puts(&b, turns[i].input ? turns[i].input : "");
    cph_buf_puts(&b, "\n");
    cph_turn_record_free(&turns[i]);
  }
  free(turns);
  cph_seal_info *seals;
  assert_int_equal(cph_engine_seals(f->e, "a", &seals, &n, &err), CPH_OK);
  for (size_t i = 0; i < n; i++) {
    snprintf(line, sizeof line, "seal %s %s episode %llu, %zu messages\n", seals[i].origin,
             seals[i].trigger, (unsigned long long)seals[i].episode, seals[i].n_messages);
    cph_buf_puts(&b, line);
    for (size_t k = 0; k < seals[i].n_messages; k++) {
      cph_buf_puts(&b, seals[i].messages[k].role);
      cph_buf_puts(&b, ": ");
      cph_buf_puts(&b, seals[i].messages[k].content);
      cph_buf_puts(&b, "\n");
    }
  }
  cph_seals_free(seals, n);
  cph_buf_append(&b, "", 1);
  assert_false(cph_buf_error(&b));
  return cph_buf_steal(&b);
}

/* The first line where a and b differ, for the failure message. */
static void first_difference(const char *a, const char *b, char *out, size_t cap) {
  size_t line = 1;
  while (*a && *a == *b) {
    line += *a == '\n';
    a++;
    b++;
  }
  while (line > 1 && a[-1] != '\n') {
    a--;
    b--;
  }
  snprintf(out, cap, "line %zu: \"%.*s\" on the node it left, \"%.*s\" on its new owner", line,
           (int)strcspn(a, "\n"), a, (int)strcspn(b, "\n"), b);
}

/* The session answers on x, moves to y; in half the cases it answers more there and moves
 * back to x, which still holds its copy from before (a node that comes back). The node it
 * left and its new owner then lease the same message. */
static void run_case(uint64_t seed) {
  rng r = {seed};
  uint64_t window = WINDOWS[below(&r, sizeof WINDOWS / sizeof *WINDOWS)];
  int turns = 1 + (int)below(&r, MAX_TURNS);
  int back = below(&r, 2) ? 1 + (int)below(&r, MAX_TURNS / 2) : 0;
  size_t longest = 16 + below(&r, 600);
  if (getenv("CPH_TEST_DEBUG"))
    printf("seed %llu: window %llu, %d turns, %d more after a move and back, texts up to %zu "
           "bytes\n",
           (unsigned long long)seed, (unsigned long long)window, turns, back, longest + 8);
  int warm = below(&r, 2) ? 64 : 0;
  cph_fixture *x = node("x", seed, window, warm), *y = node("y", seed, window, warm);
  uint8_t *state = NULL;
  size_t state_len = 0;
  cph_fixture_items items = {0}; /* every item put, in order */
  run_turns(seed, &r, x, 0, turns, longest, &state, &state_len, &items);
  import_state(seed, y, state, state_len, &items);
  cph_fixture *left = x, *owner = y;
  if (back) {
    run_turns(seed, &r, y, turns, back, longest, &state, &state_len, &items);
    import_state(seed, x, state, state_len, &items);
    left = y;
    owner = x;
  }
  char *was = session_reads(left), *is = session_reads(owner);
  if (strcmp(was, is) != 0) {
    char diff[600];
    first_difference(was, is, diff, sizeof diff);
    CPH_PROP_CHECK(seed, false, "what a user reads of the session differs: %s", diff);
  }
  free(was);
  free(is);
  cph_fixture_items_free(&items);
  cph_op lx, ly;
  post_and_lease(left, "the probe", false, "ann", &lx);
  post_and_lease(owner, "the probe", false, "ann", &ly);
  same_turn(seed, &lx.u.lease.turn, &ly.u.lease.turn);
  cph_op_clear_results(&lx);
  cph_op_clear_results(&ly);
  free(state);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

static void test_a_moved_sessions_next_turn_equals_the_one_it_left(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(20261129, DEFAULT_CASES, &seed, &cases);
  print_message("handover property: %ld cases from seed %llu\n", cases,
                (unsigned long long)seed);
  for (long i = 0; i < cases; i++)
    run_case(seed + (uint64_t)i);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_moved_sessions_next_turn_equals_the_one_it_left),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
