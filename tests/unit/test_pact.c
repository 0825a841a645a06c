/* The PACT tree (DESIGN §6, core/pact.h): the three worked examples episode by episode, ODI,
 * completing turns, selectors and coordinates (valid and invalid), render order, insert
 * validation, copies, update and delete. Pure: no engine, no LMDB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pact.h"

#define NONE CPH_PACT_NO_TTL

/* ---------------------------------------------------------------- helpers */

static cph_pact_node proto(int32_t depth, int32_t position, int32_t offset, const char *content) {
  cph_pact_node n = {0};
  n.at.depth = depth;
  n.at.position = position;
  n.at.offset = offset;
  n.content = (char *)content;
  n.ttl = NONE;
  return n;
}

static uint64_t put(cph_pact_tree *t, const cph_pact_node *n) {
  uint64_t id = 0;
  cph_err err = {0};
  if (cph_pact_insert(t, n, &id, &err))
    fail_msg("insert %s: %s", n->content, err.msg);
  return id;
}

/* The one node with this content, or NULL. Re-created nodes change id, so tests that follow a
 * node through episodes name it by its content. */
static cph_pact_node *by_content(cph_pact_tree *t, const char *content) {
  cph_pact_node *hit = NULL;
  for (size_t i = 0; i < t->n; i++) {
    if (!strcmp(t->nodes[i].content, content)) {
      if (hit)
        fail_msg("two nodes hold %s", content);
      hit = &t->nodes[i];
    }
  }
  return hit;
}

static void assert_at(const cph_pact_node *n, int32_t depth, int32_t position, int32_t offset) {
  assert_non_null(n);
  char got[48];
  cph_coord_format(&n->at, got);
  char want[48];
  cph_coord want_c = {depth, position, offset};
  cph_coord_format(&want_c, want);
  assert_string_equal(got, want);
}

/* Live (rendered) = in the tree and not waiting. */
static bool live(const cph_pact_node *n) { return n && !n->waiting; }

/* ---------------------------------------------------------------- §6 worked examples */

/* Episode of insertion = 0; delta 0 so ODI never moves anything. Tables written from §6:
 * "ttl=3: present at 0,1,2; gone at 3." */
static void test_worked_example_ttl3_present_at_0_1_2_gone_from_3(void **state) {
  (void)state;
  static const bool present[13] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node p = proto(0, 1, 0, "ttl3");
  p.ttl = 3;
  uint64_t id = put(&t, &p);
  for (int ep = 0; ep <= 12; ep++) {
    if (ep > 0)
      cph_pact_step(&t, 0);
    assert_int_equal(t.episode, ep);
    cph_pact_node *n = by_content(&t, "ttl3");
    if (present[ep]) {
      assert_true(live(n));
      assert_int_equal(n->id, id);
      assert_at(n, 0, 1, 0);
    } else {
      assert_null(n); /* no cadence: expired means removed */
    }
  }
  cph_pact_tree_free(&t);
}

/* "ttl=2, cadence=5: present 0,1; gone 2,3,4; re-created at 5, present 5,6; gone 7,8,9; back
 * at 10." Each re-creation draws a new id; coordinates and content never change. */
static void test_worked_example_cadence_recreates_with_new_id_at_5_and_10(void **state) {
  (void)state;
  static const bool present[13] = {1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0};
  /* ids while present: the first insert is id 1; re-creations at 5 and 10 draw 2 and 3. */
  static const uint64_t id_when_present[13] = {1, 1, 0, 0, 0, 2, 2, 0, 0, 0, 3, 3, 0};
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node p = proto(0, 2, 0, "cadence");
  p.ttl = 2;
  p.cadence = 5;
  assert_int_equal(put(&t, &p), 1);
  size_t idx[4];
  for (int ep = 0; ep <= 12; ep++) {
    if (ep > 0)
      cph_pact_step(&t, 0);
    cph_pact_node *n = by_content(&t, "cadence");
    assert_non_null(n); /* waiting, not removed */
    assert_at(n, 0, 2, 0);
    assert_int_equal(n->ttl, 2);
    assert_int_equal(n->seq, 1); /* re-creation keeps the creation order */
    if (present[ep]) {
      assert_false(n->waiting);
      assert_int_equal(n->id, id_when_present[ep]);
      assert_int_equal(cph_pact_render_order(&t, idx), 1);
    } else {
      assert_true(n->waiting);
      assert_int_equal(cph_pact_render_order(&t, idx), 0); /* waiting nodes are not rendered */
    }
  }
  assert_int_equal(cph_pact_find(&t, 3)->created_at_episode, 10);
  assert_null(cph_pact_find(&t, 1));
  cph_pact_tree_free(&t);
}

/* "lifecycle [d0,0,1 ttl 2] [d0,0,-1 ttl 3] [d0,0,-2]: offset 1 at 0,1; offset -1 at 2,3,4;
 * offset -2 from 5 on." The node keeps its id; its ttl is its current stage's. */
static void test_worked_example_lifecycle_moves_offset_1_then_minus1_then_minus2(void **state) {
  (void)state;
  static const int32_t offset[13] = {1, 1, -1, -1, -1, -2, -2, -2, -2, -2, -2, -2, -2};
  static const uint32_t stage[13] = {0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2};
  static const int32_t ttl[13] = {2, 2, 3, 3, 3, NONE, NONE, NONE, NONE, NONE, NONE, NONE, NONE};
  static const uint64_t created[13] = {0, 0, 2, 2, 2, 5, 5, 5, 5, 5, 5, 5, 5};
  cph_pact_stage stages[3] = {{{0, 0, 1}, 2}, {{0, 0, -1}, 3}, {{0, 0, -2}, NONE}};
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node p = proto(7, 7, 7, "lifecycle"); /* at/ttl come from stage 0 */
  p.lifecycle = stages;
  p.n_lifecycle = 3;
  uint64_t id = put(&t, &p);
  for (int ep = 0; ep <= 12; ep++) {
    if (ep > 0)
      cph_pact_step(&t, 0);
    cph_pact_node *n = by_content(&t, "lifecycle");
    assert_true(live(n));
    assert_int_equal(n->id, id);
    assert_at(n, 0, 0, offset[ep]);
    assert_int_equal(n->stage, stage[ep]);
    assert_int_equal(n->ttl, ttl[ep]);
    assert_int_equal(n->created_at_episode, created[ep]);
  }
  cph_pact_tree_free(&t);
}

/* The three examples in one tree behave exactly as alone: nodes do not affect each other. */
static void test_worked_examples_together_in_one_tree(void **state) {
  (void)state;
  static const bool ttl3[13] = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  static const bool cad[13] = {1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0};
  static const int32_t lc[13] = {1, 1, -1, -1, -1, -2, -2, -2, -2, -2, -2, -2, -2};
  cph_pact_stage stages[3] = {{{0, 0, 1}, 2}, {{0, 0, -1}, 3}, {{0, 0, -2}, NONE}};
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node a = proto(0, 1, 0, "ttl3");
  a.ttl = 3;
  cph_pact_node b = proto(0, 2, 0, "cadence");
  b.ttl = 2;
  b.cadence = 5;
  cph_pact_node c = proto(0, 0, 0, "lifecycle");
  c.lifecycle = stages;
  c.n_lifecycle = 3;
  put(&t, &a);
  put(&t, &b);
  put(&t, &c);
  uint64_t cad_id = 0;
  for (int ep = 0; ep <= 12; ep++) {
    if (ep > 0)
      cph_pact_step(&t, 0);
    assert_int_equal(live(by_content(&t, "ttl3")), ttl3[ep]);
    if (ttl3[ep])
      assert_at(by_content(&t, "ttl3"), 0, 1, 0);
    cph_pact_node *n = by_content(&t, "cadence");
    assert_int_equal(live(n), cad[ep]);
    assert_at(n, 0, 2, 0);
    if (cad[ep] && (ep == 0 || !cad[ep - 1])) { /* (re-)created: a new id every time */
      assert_true(n->id != cad_id);
      cad_id = n->id;
    } else if (cad[ep]) {
      assert_int_equal(n->id, cad_id);
    }
    assert_at(by_content(&t, "lifecycle"), 0, 0, lc[ep]);
  }
  cph_pact_tree_free(&t);
}

/* ---------------------------------------------------------------- ODI */

/* One tree stepped with deltas +1, +2, -1. Permanent and sticky (ttl 1, cadence 1) nodes at
 * depth >= 0 shift; TTL'd non-sticky nodes (with or without a cadence) stay; depth -1 never
 * moves; position and offset never change. Sticky nodes are re-created (new id) every
 * episode, in creation order, and then shift. A lifecycle node that reaches its permanent
 * last stage in a step is permanent by (5) of that same step, so it shifts at once. */
static void test_odi_shifts_permanent_and_sticky_nodes_by_the_message_delta(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node perm1 = proto(0, 1, 0, "perm1");
  cph_pact_node perm2 = proto(2, 0, -1, "perm2");
  cph_pact_node sticky = proto(1, 2, 3, "sticky");
  sticky.ttl = 1;
  sticky.cadence = 1;
  cph_pact_node ttl10 = proto(1, 1, 0, "ttl10");
  ttl10.ttl = 10;
  cph_pact_node cad = proto(0, 3, 0, "ttl5-cadence1"); /* has a cadence, but ttl != 1 */
  cad.ttl = 5;
  cad.cadence = 1;
  cph_pact_node sys = proto(-1, 0, 0, "sys");
  cph_pact_node sys_sticky = proto(-1, 1, 0, "sys-sticky");
  sys_sticky.ttl = 1;
  sys_sticky.cadence = 1;
  cph_pact_stage stages[2] = {{{0, 5, 0}, 1}, {{0, 5, 1}, NONE}};
  cph_pact_node lc = proto(0, 0, 0, "lifecycle");
  lc.lifecycle = stages;
  lc.n_lifecycle = 2;
  put(&t, &perm1);      /* id 1 */
  put(&t, &perm2);      /* id 2 */
  put(&t, &sticky);     /* id 3 */
  put(&t, &ttl10);      /* id 4 */
  put(&t, &cad);        /* id 5 */
  put(&t, &sys);        /* id 6 */
  put(&t, &sys_sticky); /* id 7 */
  put(&t, &lc);         /* id 8 */

  /* Written by hand: depth after each step; position/offset as inserted (the lifecycle node's
   * offset is its stage's). */
  static const int32_t deltas[3] = {+1, +2, -1};
  static const struct {
    const char *name;
    int32_t depth[3];
    int32_t position, offset;
  } want[] = {
      {"perm1", {1, 3, 2}, 1, 0},        {"perm2", {3, 5, 4}, 0, -1},
      {"sticky", {2, 4, 3}, 2, 3},       {"ttl10", {1, 1, 1}, 1, 0},
      {"ttl5-cadence1", {0, 0, 0}, 3, 0}, {"sys", {-1, -1, -1}, 0, 0},
      {"sys-sticky", {-1, -1, -1}, 1, 0}, {"lifecycle", {1, 3, 2}, 5, 1},
  };
  /* Sticky re-creations draw ids in creation order: sticky (seq 3) before sys-sticky (seq 7). */
  static const uint64_t sticky_id[3] = {9, 11, 13}, sys_sticky_id[3] = {10, 12, 14};
  for (int s = 0; s < 3; s++) {
    cph_pact_step(&t, deltas[s]);
    assert_int_equal(t.episode, s + 1);
    assert_int_equal(t.n, 8);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
      cph_pact_node *n = by_content(&t, want[i].name);
      assert_true(live(n));
      assert_at(n, want[i].depth[s], want[i].position, want[i].offset);
    }
    assert_int_equal(by_content(&t, "sticky")->id, sticky_id[s]);
    assert_int_equal(by_content(&t, "sys-sticky")->id, sys_sticky_id[s]);
    assert_int_equal(by_content(&t, "perm1")->id, 1);
  }
  cph_pact_tree_free(&t);
}

/* Decision: a negative delta means the newest |delta| messages are gone, so a shifting node
 * pushed below depth 0 is removed (not clamped at 0, which would pile old history onto the
 * current message). Nodes that do not shift stay where they are. */
static void test_odi_negative_delta_removes_nodes_pushed_below_depth_0(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node d0 = proto(0, 0, 0, "d0");
  cph_pact_node d1 = proto(1, 0, 0, "d1");
  cph_pact_node d2 = proto(2, 1, 0, "d2");
  cph_pact_node sticky = proto(0, 1, 0, "sticky-d0");
  sticky.ttl = 1;
  sticky.cadence = 1;
  cph_pact_node ttl = proto(0, 2, 0, "ttl-d0");
  ttl.ttl = 5;
  cph_pact_node sys = proto(-1, 0, 0, "sys");
  put(&t, &d0);
  put(&t, &d1);
  put(&t, &d2);
  put(&t, &sticky);
  put(&t, &ttl);
  put(&t, &sys);

  cph_pact_step(&t, -1);
  assert_null(by_content(&t, "d0"));
  assert_null(by_content(&t, "sticky-d0"));
  assert_at(by_content(&t, "d1"), 0, 0, 0);
  assert_at(by_content(&t, "d2"), 1, 1, 0);
  assert_at(by_content(&t, "ttl-d0"), 0, 2, 0);
  assert_at(by_content(&t, "sys"), -1, 0, 0);
  assert_int_equal(t.n, 4);

  cph_pact_step(&t, -2);
  assert_null(by_content(&t, "d1"));
  assert_null(by_content(&t, "d2"));
  assert_at(by_content(&t, "ttl-d0"), 0, 2, 0);
  assert_at(by_content(&t, "sys"), -1, 0, 0);
  assert_int_equal(t.n, 2);
  cph_pact_tree_free(&t);
}

/* ---------------------------------------------------------------- complete_turn */

static void assert_core(cph_pact_tree *t, const char *content, const char *role, int32_t depth) {
  cph_pact_node *n = by_content(t, content);
  assert_true(live(n));
  assert_string_equal(n->role, role);
  assert_int_equal(n->ttl, NONE);
  assert_at(n, depth, 0, 0);
}

/* Cores land at depths delta..1 (input above reply), depth 0 stays free for the next current
 * message, and everything that shifts moves by delta: older history, attachments of the
 * current message (permanent and sticky), which end up on the input just appended. */
static void test_complete_turn_places_cores_at_delta_to_1_and_shifts_history(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node sys = proto(-1, 0, 0, "system prompt");
  cph_pact_node sticky = proto(0, 1, 0, "sticky note");
  sticky.ttl = 1;
  sticky.cadence = 1;
  cph_pact_node attach = proto(0, 2, 0, "attachment");
  cph_pact_node brief = proto(0, 3, 0, "brief"); /* TTL'd: stays on depth 0, then expires */
  brief.ttl = 2;
  put(&t, &sys);
  put(&t, &sticky);
  put(&t, &attach);
  put(&t, &brief);

  assert_int_equal(cph_pact_complete_turn(&t, "hi", "hello"), CPH_OK);
  assert_int_equal(t.episode, 1);
  assert_core(&t, "hi", "user", 2);
  assert_core(&t, "hello", "assistant", 1);
  assert_int_equal(by_content(&t, "hi")->created_at_episode, 0); /* appended, then stepped */
  assert_at(by_content(&t, "sticky note"), 2, 1, 0);
  assert_at(by_content(&t, "attachment"), 2, 2, 0);
  assert_at(by_content(&t, "brief"), 0, 3, 0);
  assert_at(by_content(&t, "system prompt"), -1, 0, 0);

  assert_int_equal(cph_pact_complete_turn(&t, "again", NULL), CPH_OK); /* no reply: delta 1 */
  assert_int_equal(t.episode, 2);
  assert_core(&t, "again", "user", 1);
  assert_core(&t, "hello", "assistant", 2);
  assert_core(&t, "hi", "user", 3);
  assert_at(by_content(&t, "sticky note"), 3, 1, 0);
  assert_at(by_content(&t, "attachment"), 3, 2, 0);
  assert_null(by_content(&t, "brief"));

  assert_int_equal(cph_pact_complete_turn(&t, "q", "a"), CPH_OK);
  assert_int_equal(t.episode, 3);
  assert_core(&t, "q", "user", 2);
  assert_core(&t, "a", "assistant", 1);
  assert_core(&t, "again", "user", 3);
  assert_core(&t, "hello", "assistant", 4);
  assert_core(&t, "hi", "user", 5);
  assert_at(by_content(&t, "sticky note"), 5, 1, 0);
  assert_at(by_content(&t, "attachment"), 5, 2, 0);
  assert_at(by_content(&t, "system prompt"), -1, 0, 0);

  static const char *const order[] = {"system prompt", "hi", "sticky note", "attachment",
                                      "hello", "again", "q", "a"};
  size_t idx[16];
  assert_int_equal(cph_pact_render_order(&t, idx), 8);
  for (size_t i = 0; i < 8; i++)
    assert_string_equal(t.nodes[idx[i]].content, order[i]);

  /* No input: nothing appended, no step. */
  assert_int_equal(cph_pact_complete_turn(&t, NULL, "x"), CPH_EINVAL);
  assert_int_equal(t.episode, 3);
  assert_int_equal(t.n, 8);
  cph_pact_tree_free(&t);
}

/* ---------------------------------------------------------------- selectors */

/* The fixed tree of the selector table: letters A.. are ids 1.. */
static void selector_tree(cph_pact_tree *t) {
  static char *sys_tags[] = {"sys"}, *tools_tags[] = {"tools"}, *notepin[] = {"note", "pin"},
              *pin[] = {"pin"}, *note[] = {"note"};
  static const struct {
    int32_t d, p, o;
    const char *key;
    char **tags;
    uint32_t n_tags;
  } spec[] = {
      {-1, 0, 0, "system", sys_tags, 1}, /* A */
      {-1, 1, 0, NULL, tools_tags, 1},   /* B */
      {0, 0, 0, "current", NULL, 0},     /* C */
      {0, 1, -1, NULL, notepin, 2},      /* D */
      {0, 1, 2, NULL, NULL, 0},          /* E */
      {1, 0, 0, "reply", NULL, 0},       /* F */
      {1, 2, -3, NULL, pin, 1},          /* G */
      {2, 0, 0, NULL, NULL, 0},          /* H */
      {3, 1, 1, "old", NULL, 0},         /* I */
      {5, 3, -2, NULL, note, 1},         /* J */
  };
  cph_pact_tree_init(t);
  for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
    char content[2] = {(char)('A' + i), 0};
    cph_pact_node n = proto(spec[i].d, spec[i].p, spec[i].o, content);
    n.key = (char *)spec[i].key;
    n.tags = spec[i].tags;
    n.n_tags = spec[i].n_tags;
    assert_int_equal(put(t, &n), i + 1);
  }
}

static void test_selectors_match_the_expected_nodes_of_a_fixed_tree(void **state) {
  (void)state;
  /* A d-1,0,0 {key system, tag sys}   B d-1,1,0 {tag tools}   C d0,0,0 {key current}
   * D d0,1,-1 {tags note pin}         E d0,1,2                F d1,0,0 {key reply}
   * G d1,2,-3 {tag pin}               H d2,0,0                I d3,1,1 {key old}
   * J d5,3,-2 {tag note} */
  static const struct {
    const char *sel, *matches;
  } table[] = {
      {"d*, *, *", "ABCDEFGHIJ"},
      {"d*,*,*", "ABCDEFGHIJ"},
      {"d-1, *, *", "AB"},
      {"d-1, 0, 0", "A"},
      {"d0, 0, 0", "C"},
      {"d0, *, *", "CDE"},
      {"d0, 1, *", "DE"},
      {"d0, 1, -1", "D"},
      {"d0, 1, -1..0", "D"},
      {"d0, 1, 0..5", "E"},
      {"d1..3, *, *", "FGHI"},
      {"d1..3, 1, *", "I"},
      {"d1..3, 0, 0", "FH"},
      {"d-1..0, *, *", "ABCDE"},
      {"d*, 0, *", "ACFH"},
      {"d*, 1..2, *", "BDEGI"},
      {"d*, *, -3..-1", "DGJ"},
      {"d*, *, 0", "ABCFH"},
      {"d4..9, *, *", "J"},
      {"d6..9, *, *", ""},
      {"d5,3,-2", "J"},
      {"  d2 ,0 , 0  ", "H"},
      {"d1,\t2,\t-3", "G"},
      {"d0..0, 0..0, 0..0", "C"},
      {"d*, 3, *", "J"},
      {"d-1..5, 0..3, -3..2", "ABCDEFGHIJ"},
      {"d3..3, 1..1, 1..1", "I"},
      {"{key=reply}", "F"},
      {"{key=system}", "A"},
      {"{key=missing}", ""},
      {"{tag=pin}", "DG"},
      {"{tag=note}", "DJ"},
      {"{tag=sys}", "A"},
      {"{id=7}", "G"},
      {"{id=1}", "A"},
      {"{id=99}", ""},
      {" {key=old} ", "I"},
  };
  cph_pact_tree t;
  selector_tree(&t);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    cph_selector *sel = NULL;
    cph_err err = {0};
    if (cph_selector_parse(table[i].sel, &sel, &err))
      fail_msg("selector \"%s\": %s", table[i].sel, err.msg);
    char got[16] = {0};
    size_t k = 0;
    for (size_t j = 0; j < t.n; j++)
      if (cph_selector_match(sel, &t.nodes[j]))
        got[k++] = t.nodes[j].content[0];
    if (strcmp(got, table[i].matches))
      fail_msg("selector \"%s\" matched \"%s\", want \"%s\"", table[i].sel, got,
               table[i].matches);
    cph_selector_free(sel);
  }
  cph_pact_tree_free(&t);
}

static void test_invalid_selectors_say_what_was_expected_where(void **state) {
  (void)state;
  static const struct {
    const char *sel, *msg;
  } table[] = {
      {"", "expected 'd' (coordinates) or '{' (key, tag or id) at column 1, found end of input"},
      {"x1, 0, 0", "expected 'd' (coordinates) or '{' (key, tag or id) at column 1, found 'x'"},
      {"d1, 0", "expected ',' at column 6, found end of input"},
      {"d1, 0, 0, 0", "expected end of selector at column 9, found ','"},
      {"d3..1, *, *", "depth range 3..1 at column 2: start is greater than end"},
      {"d*, *, 5..-5", "offset range 5..-5 at column 8: start is greater than end"},
      {"d-2, *, *", "depth must be >= -1 at column 2, found -2"},
      {"d-3..2, *, *", "depth must be >= -1 at column 2, found -3"},
      {"d*, -1, *", "position must be >= 0 at column 5, found -1"},
      {"d1.., *, *", "expected an integer after '..' at column 5, found ','"},
      {"d1, x, 0", "expected an integer, a range a..b or '*' at column 5, found 'x'"},
      {"d 1, 0, 0", "expected an integer, a range a..b or '*' at column 2, found ' '"},
      {"d1..2..3, *, *", "expected ',' at column 6, found '.'"},
      {"d1, 0, *x", "expected end of selector at column 9, found 'x'"},
      {"d99999999999, 0, 0", "integer out of range at column 2"},
      {"d-, 0, 0", "expected an integer at column 2, found '-'"},
      {"{name=x}", "expected 'key=', 'tag=' or 'id=' at column 2, found 'n'"},
      {"{key=}", "expected a name after 'key=' at column 6, found '}'"},
      {"{key=abc", "expected '}' at column 9, found end of input"},
      {"{tag=a b}", "unexpected ' ' in tag name at column 7"},
      {"{id=0}", "id must be >= 1 at column 5"},
      {"{id=x}", "expected a decimal id after 'id=' at column 5, found 'x'"},
      {"{id=-1}", "expected a decimal id after 'id=' at column 5, found '-'"},
      {"{id=99999999999999999999}", "id out of range at column 5"},
      {"{key=a} x", "expected end of selector at column 9, found 'x'"},
      {"{key=a}{tag=b}", "expected end of selector at column 8, found '{'"},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    cph_selector *sel = (cph_selector *)&sel; /* must be reset to NULL on failure */
    cph_err err = {0};
    int rc = cph_selector_parse(table[i].sel, &sel, &err);
    if (rc != CPH_EPARSE)
      fail_msg("selector \"%s\": rc %d (%s), want EPARSE", table[i].sel, rc, err.msg);
    assert_null(sel);
    assert_int_equal(err.code, CPH_EPARSE);
    if (strcmp(err.msg, table[i].msg))
      fail_msg("selector \"%s\": \"%s\", want \"%s\"", table[i].sel, err.msg, table[i].msg);
  }
}

/* Over CPH_PACT_SELECTOR_MAX bytes is CPH_ELIMIT, whatever the text; exactly the limit parses. */
static void test_selector_longer_than_the_limit_is_elimit(void **state) {
  (void)state;
  char text[CPH_PACT_SELECTOR_MAX + 2];
  memset(text, ' ', sizeof text);
  memcpy(text, "d*, *, *", 8);
  text[CPH_PACT_SELECTOR_MAX] = '\0';
  cph_selector *sel = NULL;
  cph_err err = {0};
  assert_int_equal(cph_selector_parse(text, &sel, &err), CPH_OK);
  cph_selector_free(sel);

  text[CPH_PACT_SELECTOR_MAX] = ' ';
  text[CPH_PACT_SELECTOR_MAX + 1] = '\0';
  sel = NULL;
  assert_int_equal(cph_selector_parse(text, &sel, &err), CPH_ELIMIT);
  assert_null(sel);
  assert_string_equal(err.msg, "selector longer than 512 bytes");
}

/* ---------------------------------------------------------------- coordinates */

static void test_coordinates_parse_and_format(void **state) {
  (void)state;
  static const struct {
    const char *text;
    cph_coord want;
    const char *formatted;
  } ok[] = {
      {"d0, 1, 0", {0, 1, 0}, "d0, 1, 0"},
      {"d-1,0,0", {-1, 0, 0}, "d-1, 0, 0"},
      {"  d3 , 2 ,\t-4 ", {3, 2, -4}, "d3, 2, -4"},
      {"d2147483647, 2147483647, -2147483648",
       {INT32_MAX, INT32_MAX, INT32_MIN},
       "d2147483647, 2147483647, -2147483648"},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    cph_coord c;
    cph_err err = {0};
    if (cph_coord_parse(ok[i].text, &c, &err))
      fail_msg("coordinate \"%s\": %s", ok[i].text, err.msg);
    assert_int_equal(c.depth, ok[i].want.depth);
    assert_int_equal(c.position, ok[i].want.position);
    assert_int_equal(c.offset, ok[i].want.offset);
    char buf[48];
    cph_coord_format(&c, buf);
    assert_string_equal(buf, ok[i].formatted);
    cph_coord back;
    assert_int_equal(cph_coord_parse(buf, &back, &err), CPH_OK); /* round trip */
    assert_memory_equal(&back, &c, sizeof c);
  }
  /* Every small value (the formatter's fast path) and its edges, against printf. */
  for (int32_t v = -150; v <= 1050; v++) {
    cph_coord c = {v, v == 99 ? 100 : v / 7, -v};
    char buf[48], want[64];
    cph_coord_format(&c, buf);
    snprintf(want, sizeof want, "d%d, %d, %d", c.depth, c.position, c.offset);
    assert_string_equal(buf, want);
  }
}

static void test_invalid_coordinates_say_what_and_which_column(void **state) {
  (void)state;
  static const struct {
    const char *text, *msg;
  } table[] = {
      {"", "expected 'd' at column 1, found end of input"},
      {"0, 1, 0", "expected 'd' at column 1, found '0'"},
      {"d0, 1", "expected ',' at column 6, found end of input"},
      {"d0, -1, 0", "position must be >= 0 at column 5, found -1"},
      {"d-2, 0, 0", "depth must be >= -1 at column 2, found -2"},
      {"d0, *, 0", "expected an integer at column 5, found '*'"},
      {"d0, 1, 0 x", "expected end of coordinate at column 10, found 'x'"},
      {"d0..1, 0, 0", "expected ',' at column 3, found '.'"},
      {"d2147483648, 0, 0", "integer out of range at column 2"},
      {"d0, 0, -2147483649", "integer out of range at column 8"},
      {"d0; 1; 0", "expected ',' at column 3, found ';'"},
      {"D0, 1, 0", "expected 'd' at column 1, found 'D'"},
      {"d0, 1, 0\x01", "expected end of coordinate at column 9, found byte 0x01"},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    cph_coord c = {42, 42, 42};
    cph_err err = {0};
    int rc = cph_coord_parse(table[i].text, &c, &err);
    if (rc != CPH_EPARSE)
      fail_msg("coordinate \"%s\": rc %d, want EPARSE", table[i].text, rc);
    assert_int_equal(c.depth, 42); /* untouched on failure */
    if (strcmp(err.msg, table[i].msg))
      fail_msg("coordinate \"%s\": \"%s\", want \"%s\"", table[i].text, err.msg, table[i].msg);
  }
}

/* ---------------------------------------------------------------- render order */

/* Depth -1, then history oldest -> newest (deepest first), then depth 0; inside a depth by
 * position, then offset ascending; ties by seq (insertion). Waiting nodes are left out. */
static void test_render_order_system_history_deepest_first_then_current(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  static const struct {
    int32_t d, p, o;
    const char *content;
  } ins[] = {
      {0, 0, 0, "cur"},        {2, 1, 0, "h2 att"},   {-1, 0, 0, "sys"},
      {1, 0, 0, "h1"},         {2, 0, 0, "h2"},       {0, 1, -1, "cur before"},
      {0, 1, 0, "cur att"},    {2, 0, -1, "h2 before"}, {2, 0, 1, "h2 after"},
      {-1, 0, 0, "sys2"},      {2, 1, 0, "h2 att 2"}, {10, 0, 0, "h10"},
      {-1, 0, -5, "sys first"},
  };
  for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) {
    cph_pact_node n = proto(ins[i].d, ins[i].p, ins[i].o, ins[i].content);
    put(&t, &n);
  }
  cph_pact_node w = proto(1, 0, 1, "waiting"); /* expires at 1, waits for episode 3 */
  w.ttl = 1;
  w.cadence = 3;
  put(&t, &w);
  cph_pact_step(&t, 0);
  assert_true(by_content(&t, "waiting")->waiting);

  static const char *const want[] = {"sys first", "sys",      "sys2",       "h10",
                                     "h2 before", "h2",       "h2 after",   "h2 att",
                                     "h2 att 2",  "h1",       "cur",        "cur before",
                                     "cur att"};
  size_t idx[16];
  size_t n = cph_pact_render_order(&t, idx);
  assert_int_equal(n, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < n; i++)
    if (strcmp(t.nodes[idx[i]].content, want[i]))
      fail_msg("render[%zu] = %s, want %s", i, t.nodes[idx[i]].content, want[i]);

  cph_pact_step(&t, 0);
  cph_pact_step(&t, 0); /* episode 3: the waiting node is back, between h1 and cur */
  n = cph_pact_render_order(&t, idx);
  assert_int_equal(n, 14);
  assert_string_equal(t.nodes[idx[9]].content, "h1");
  assert_string_equal(t.nodes[idx[10]].content, "waiting");
  cph_pact_tree_free(&t);

  cph_pact_tree_init(&t);
  assert_int_equal(cph_pact_render_order(&t, idx), 0);
  cph_pact_tree_free(&t);
}

/* ---------------------------------------------------------------- insert validation */

static void test_insert_rejects_invalid_nodes_and_leaves_the_tree_unchanged(void **state) {
  (void)state;
  static char *one_tag[] = {"x"};
  cph_pact_stage mid_none[2] = {{{0, 0, 1}, NONE}, {{0, 0, 2}, 3}};
  cph_pact_stage bad_pos[2] = {{{0, 0, 1}, 2}, {{0, -3, 2}, NONE}};
  cph_pact_stage bad_ttl[2] = {{{0, 0, 1}, 2}, {{0, 0, 2}, 0}};
  cph_pact_stage bad_depth[1] = {{{-4, 0, 0}, 2}};
  cph_pact_stage good[2] = {{{0, 0, 1}, 2}, {{0, 0, 2}, NONE}};
  struct {
    cph_pact_node n;
    const char *msg;
  } table[] = {
      {proto(-2, 0, 0, "x"), "depth must be >= -1, got -2"},
      {proto(0, -1, 0, "x"), "position must be >= 0, got -1"},
      {proto(0, 0, 0, NULL), "content is required"},
      {proto(0, 0, 0, "x"), "ttl must be >= 1 or none, got 0"},
      {proto(0, 0, 0, "x"), "ttl must be >= 1 or none, got -5"},
      {proto(0, 0, 0, "x"), "cadence must be >= 0, got -1"},
      {proto(0, 0, 0, "x"), "lifecycle stage 0: only the last stage may have no ttl"},
      {proto(0, 0, 0, "x"), "lifecycle stage 1: position must be >= 0, got -3"},
      {proto(0, 0, 0, "x"), "lifecycle stage 1: ttl must be >= 1 or none, got 0"},
      {proto(0, 0, 0, "x"), "depth must be >= -1, got -4"},
      {proto(0, 0, 0, "x"), "a node cannot have both a cadence and a lifecycle"},
      {proto(0, 0, 0, "x"), "lifecycle has no stages"},
      {proto(0, 0, 0, "x"), "2 lifecycle stages but no stage array"},
      {proto(0, 0, 0, "x"), "2 tags but no tag array"},
  };
  table[3].n.ttl = 0;
  table[4].n.ttl = -5;
  table[5].n.cadence = -1;
  table[6].n.lifecycle = mid_none;
  table[6].n.n_lifecycle = 2;
  table[7].n.lifecycle = bad_pos;
  table[7].n.n_lifecycle = 2;
  table[8].n.lifecycle = bad_ttl;
  table[8].n.n_lifecycle = 2;
  table[9].n.lifecycle = bad_depth; /* stage 0 is the placement, so the plain message */
  table[9].n.n_lifecycle = 1;
  table[10].n.lifecycle = good;
  table[10].n.n_lifecycle = 2;
  table[10].n.cadence = 2;
  table[11].n.lifecycle = good;
  table[11].n.n_lifecycle = 0;
  table[12].n.n_lifecycle = 2;
  table[13].n.n_tags = 2;
  (void)one_tag;

  cph_pact_tree t;
  cph_pact_tree_init(&t);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    cph_err err = {0};
    uint64_t id = 77;
    assert_int_equal(cph_pact_insert(&t, &table[i].n, &id, &err), CPH_EINVAL);
    assert_int_equal(id, 77);
    if (strcmp(err.msg, table[i].msg))
      fail_msg("insert %zu: \"%s\", want \"%s\"", i, err.msg, table[i].msg);
  }
  assert_int_equal(t.n, 0);
  assert_int_equal(t.next_id, 1);
  assert_int_equal(t.next_seq, 1);

  /* The valid ones: ids and seqs from 1, created at the tree's episode; the proto's id, seq,
   * waiting and stage are not taken over. */
  cph_pact_node ok = proto(-1, 0, 0, "ok");
  ok.id = 999;
  ok.seq = 999;
  ok.waiting = true;
  ok.stage = 5;
  ok.ttl = 4;
  ok.cadence = 2;
  ok.tags = one_tag;
  ok.n_tags = 1;
  assert_int_equal(put(&t, &ok), 1);
  cph_pact_step(&t, 0);
  cph_pact_node lc = proto(9, 9, 9, "lc");
  lc.lifecycle = good;
  lc.n_lifecycle = 2;
  assert_int_equal(put(&t, &lc), 2);
  cph_pact_node *a = cph_pact_find(&t, 1), *b = cph_pact_find(&t, 2);
  assert_int_equal(a->seq, 1);
  assert_false(a->waiting);
  assert_int_equal(a->stage, 0);
  assert_string_equal(a->tags[0], "x");
  assert_ptr_not_equal(a->tags, one_tag); /* a deep copy */
  assert_int_equal(b->seq, 2);
  assert_int_equal(b->created_at_episode, 1);
  assert_at(b, 0, 0, 1); /* stage 0's placement, not the proto's at */
  assert_int_equal(b->ttl, 2);
  assert_ptr_not_equal(b->lifecycle, good);
  cph_pact_tree_free(&t);
}

/* ---------------------------------------------------------------- copy, update, delete */

static void test_tree_copy_is_deep_and_independent(void **state) {
  (void)state;
  static char *tags[] = {"a", "b"};
  cph_pact_stage stages[2] = {{{0, 0, 1}, 1}, {{0, 0, 2}, NONE}};
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node n1 = proto(1, 0, 0, "one");
  n1.key = "k1";
  n1.tags = tags;
  n1.n_tags = 2;
  n1.role = "user";
  cph_pact_node n2 = proto(0, 0, 0, "two");
  n2.lifecycle = stages;
  n2.n_lifecycle = 2;
  put(&t, &n1);
  put(&t, &n2);

  cph_pact_tree c;
  assert_int_equal(cph_pact_tree_copy(&c, &t), CPH_OK);
  assert_int_equal(c.n, 2);
  assert_int_equal(c.next_id, t.next_id);
  assert_int_equal(c.next_seq, t.next_seq);
  assert_int_equal(c.episode, t.episode);
  assert_ptr_not_equal(c.nodes[0].content, t.nodes[0].content);
  assert_ptr_not_equal(c.nodes[0].tags[1], t.nodes[0].tags[1]);
  assert_ptr_not_equal(c.nodes[1].lifecycle, t.nodes[1].lifecycle);
  assert_string_equal(c.nodes[0].key, "k1");
  assert_string_equal(c.nodes[0].role, "user");

  /* A dry run on the copy: the original does not move. */
  cph_pact_node f = {0};
  f.content = "changed";
  assert_int_equal(cph_pact_update(&c, 1, &f, CPH_PACT_SET_CONTENT, NULL), CPH_OK);
  cph_pact_step(&c, 3);
  assert_int_equal(cph_pact_delete(&c, 2), CPH_OK);
  uint64_t id = put(&c, &n1);
  assert_int_equal(id, 3);

  assert_int_equal(t.episode, 0);
  assert_int_equal(t.n, 2);
  assert_int_equal(t.next_id, 3);
  assert_string_equal(cph_pact_find(&t, 1)->content, "one");
  assert_at(cph_pact_find(&t, 1), 1, 0, 0);
  assert_at(cph_pact_find(&t, 2), 0, 0, 1);
  assert_int_equal(cph_pact_find(&t, 2)->stage, 0);
  assert_at(cph_pact_find(&c, 1), 4, 0, 0);

  /* And the other way round. */
  cph_pact_tree_free(&t);
  assert_string_equal(cph_pact_find(&c, 1)->content, "changed");
  assert_string_equal(cph_pact_find(&c, 1)->tags[0], "a");
  cph_pact_tree_free(&c);

  cph_pact_tree empty, copy;
  cph_pact_tree_init(&empty);
  assert_int_equal(cph_pact_tree_copy(&copy, &empty), CPH_OK);
  assert_int_equal(copy.n, 0);
  assert_int_equal(copy.next_id, 1);
  cph_pact_tree_free(&copy);
  cph_pact_tree_free(&empty);
}

static void test_update_replaces_masked_fields_all_or_nothing(void **state) {
  (void)state;
  static char *old_tags[] = {"old"}, *new_tags[] = {"n1", "n2"};
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node n = proto(1, 1, 0, "before");
  n.key = "k";
  n.tags = old_tags;
  n.n_tags = 1;
  uint64_t id = put(&t, &n);

  cph_pact_node f = {0};
  f.content = "after";
  f.key = NULL; /* clears the key */
  f.tags = new_tags;
  f.n_tags = 2;
  f.ttl = 4;
  f.cadence = 2;
  f.at = (cph_coord){0, 2, -1};
  cph_err err = {0};
  assert_int_equal(cph_pact_update(&t, id,
                                   &f,
                                   CPH_PACT_SET_CONTENT | CPH_PACT_SET_KEY | CPH_PACT_SET_TAGS |
                                       CPH_PACT_SET_TTL | CPH_PACT_SET_CADENCE |
                                       CPH_PACT_SET_AT,
                                   &err),
                   CPH_OK);
  cph_pact_node *u = cph_pact_find(&t, id);
  assert_string_equal(u->content, "after");
  assert_null(u->key);
  assert_int_equal(u->n_tags, 2);
  assert_string_equal(u->tags[1], "n2");
  assert_ptr_not_equal(u->tags, new_tags);
  assert_int_equal(u->ttl, 4);
  assert_int_equal(u->cadence, 2);
  assert_at(u, 0, 2, -1);

  /* Only the masked fields: content alone leaves the rest. */
  cph_pact_node g = {0};
  g.content = "third";
  g.ttl = 0; /* not in the mask: ignored */
  assert_int_equal(cph_pact_update(&t, id, &g, CPH_PACT_SET_CONTENT, &err), CPH_OK);
  assert_string_equal(u->content, "third");
  assert_int_equal(u->ttl, 4);

  /* Invalid: nothing changes. */
  cph_pact_node bad = {0};
  bad.content = "never";
  bad.ttl = 0;
  assert_int_equal(cph_pact_update(&t, id, &bad, CPH_PACT_SET_CONTENT | CPH_PACT_SET_TTL, &err),
                   CPH_EINVAL);
  assert_string_equal(err.msg, "ttl must be >= 1 or none, got 0");
  assert_string_equal(u->content, "third");
  bad.at = (cph_coord){-2, 0, 0};
  assert_int_equal(cph_pact_update(&t, id, &bad, CPH_PACT_SET_AT, &err), CPH_EINVAL);
  assert_string_equal(err.msg, "depth must be >= -1, got -2");
  bad.content = NULL;
  assert_int_equal(cph_pact_update(&t, id, &bad, CPH_PACT_SET_CONTENT, &err), CPH_EINVAL);
  assert_string_equal(err.msg, "content is required");
  assert_int_equal(cph_pact_update(&t, id, &bad, 64, &err), CPH_EINVAL);
  assert_int_equal(cph_pact_update(&t, 999, &g, CPH_PACT_SET_CONTENT, &err), CPH_ENOTFOUND);
  assert_string_equal(err.msg, "node 999 not found");
  assert_string_equal(u->content, "third");
  assert_at(u, 0, 2, -1);

  /* A lifecycle node's ttl is its stage's: none only on the last stage; no cadence. */
  cph_pact_stage stages[2] = {{{0, 0, 1}, 2}, {{0, 0, 2}, 3}};
  cph_pact_node lc = proto(0, 0, 0, "lc");
  lc.lifecycle = stages;
  lc.n_lifecycle = 2;
  uint64_t lid = put(&t, &lc);
  cph_pact_node none = {0};
  none.ttl = NONE;
  assert_int_equal(cph_pact_update(&t, lid, &none, CPH_PACT_SET_TTL, &err), CPH_EINVAL);
  assert_string_equal(err.msg, "lifecycle stage 0: only the last stage may have no ttl");
  none.cadence = 1;
  assert_int_equal(cph_pact_update(&t, lid, &none, CPH_PACT_SET_CADENCE, &err), CPH_EINVAL);
  assert_string_equal(err.msg, "a node cannot have both a cadence and a lifecycle");
  cph_pact_step(&t, 0);
  cph_pact_step(&t, 0); /* stage 1, the last */
  assert_int_equal(cph_pact_find(&t, lid)->stage, 1);
  assert_int_equal(cph_pact_update(&t, lid, &none, CPH_PACT_SET_TTL, &err), CPH_OK);
  assert_int_equal(cph_pact_find(&t, lid)->ttl, NONE);
  cph_pact_tree_free(&t);
}

/* A TTL update keeps created_at_episode: a ttl at or below the node's age expires it at the
 * next step. A waiting node whose cadence is set to 0 waits for nothing and is removed. */
static void test_update_ttl_counts_from_creation_and_cadence_0_ends_waiting(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node a = proto(0, 0, 0, "a");
  a.ttl = 10;
  cph_pact_node w = proto(0, 1, 0, "w");
  w.ttl = 1;
  w.cadence = 4;
  uint64_t ida = put(&t, &a), idw = put(&t, &w);
  cph_pact_step(&t, 0);
  cph_pact_step(&t, 0);
  assert_true(cph_pact_find(&t, idw)->waiting);
  cph_pact_node f = {0};
  f.ttl = 3;
  assert_int_equal(cph_pact_update(&t, ida, &f, CPH_PACT_SET_TTL, NULL), CPH_OK);
  f.cadence = 0;
  assert_int_equal(cph_pact_update(&t, idw, &f, CPH_PACT_SET_CADENCE, NULL), CPH_OK);
  cph_pact_step(&t, 0); /* episode 3: a's age 3 >= 3 */
  assert_null(cph_pact_find(&t, ida));
  assert_null(by_content(&t, "w"));
  assert_int_equal(t.n, 0);
  cph_pact_tree_free(&t);
}

static void test_delete_removes_the_node_and_reports_unknown_ids(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node a = proto(0, 0, 0, "a"), b = proto(1, 0, 0, "b"), c = proto(2, 0, 0, "c");
  uint64_t ia = put(&t, &a), ib = put(&t, &b), ic = put(&t, &c);
  assert_int_equal(cph_pact_delete(&t, ib), CPH_OK);
  assert_null(cph_pact_find(&t, ib));
  assert_int_equal(cph_pact_delete(&t, ib), CPH_ENOTFOUND);
  assert_int_equal(cph_pact_delete(&t, 0), CPH_ENOTFOUND);
  assert_int_equal(t.n, 2);
  assert_string_equal(cph_pact_find(&t, ia)->content, "a");
  assert_string_equal(cph_pact_find(&t, ic)->content, "c");
  /* Ids are never reused. */
  assert_int_equal(put(&t, &b), 4);
  size_t idx[4];
  assert_int_equal(cph_pact_render_order(&t, idx), 3);
  assert_string_equal(t.nodes[idx[0]].content, "c");
  assert_string_equal(t.nodes[idx[1]].content, "b");
  assert_string_equal(t.nodes[idx[2]].content, "a");
  cph_pact_tree_free(&t);
}

/* A loader may hand the step a tree out of seq order; TTL and re-creation ids still follow
 * creation order. */
static void test_step_follows_creation_order_even_when_the_array_is_not(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  cph_pact_node x = proto(0, 0, 0, "first");
  x.ttl = 1;
  x.cadence = 1;
  cph_pact_node y = proto(0, 1, 0, "second");
  y.ttl = 1;
  y.cadence = 1;
  put(&t, &x);
  put(&t, &y);
  cph_pact_node tmp = t.nodes[0]; /* swap: the array now runs second, first */
  t.nodes[0] = t.nodes[1];
  t.nodes[1] = tmp;
  cph_pact_step(&t, 0);
  assert_int_equal(by_content(&t, "first")->id, 3);
  assert_int_equal(by_content(&t, "second")->id, 4);
  cph_pact_tree_free(&t);
}

/* ---------------------------------------------------------------- allocation failures */

/* The countdown in core/pact.c: the N-th allocation from now fails (0 = off). */
extern long cph_pact__fail_alloc_countdown;

/* Everything observable about a tree, for "unchanged" checks. */
static void describe(const cph_pact_tree *t, char *buf, size_t size) {
  size_t k = (size_t)snprintf(buf, size, "ep %llu next %llu/%llu;",
                              (unsigned long long)t->episode, (unsigned long long)t->next_id,
                              (unsigned long long)t->next_seq);
  for (size_t i = 0; i < t->n && k < size; i++) {
    const cph_pact_node *n = &t->nodes[i];
    char at[48];
    cph_coord_format(&n->at, at);
    k += (size_t)snprintf(buf + k, size - k, " [%llu %s %s key=%s tags=%u ttl=%d]",
                          (unsigned long long)n->id, at, n->content, n->key ? n->key : "-",
                          (unsigned)n->n_tags, (int)n->ttl);
  }
}

/* Runs op with the N-th allocation failing, N = 1, 2, ... until it succeeds: every failure is
 * CPH_ENOMEM and leaves the tree as it was (ASan reports any leak). Returns how many failed. */
static int fail_each_allocation(cph_pact_tree *t, int (*op)(cph_pact_tree *)) {
  char before[2048], after[2048];
  describe(t, before, sizeof before);
  for (long n = 1;; n++) {
    cph_pact__fail_alloc_countdown = n;
    int rc = op(t);
    bool untouched = cph_pact__fail_alloc_countdown > 0;
    cph_pact__fail_alloc_countdown = 0;
    if (rc == CPH_OK) {
      assert_true(untouched); /* succeeded only because the N-th allocation never came */
      return (int)n - 1;
    }
    assert_int_equal(rc, CPH_ENOMEM);
    describe(t, after, sizeof after);
    assert_string_equal(after, before);
  }
}

static char *rich_tags[] = {"t1", "t2", "t3"};
static cph_pact_stage rich_stages[2] = {{{0, 0, 1}, 2}, {{0, 0, 2}, NONE}};

static cph_pact_node rich_node(void) {
  cph_pact_node n = proto(1, 0, 0, "rich");
  n.role = "user";
  n.key = "k";
  n.tags = rich_tags;
  n.n_tags = 3;
  n.lifecycle = rich_stages;
  n.n_lifecycle = 2;
  return n;
}

static int op_insert(cph_pact_tree *t) {
  cph_pact_node n = rich_node();
  cph_err err = {0};
  int rc = cph_pact_insert(t, &n, NULL, &err);
  if (rc)
    assert_string_equal(err.msg, "insert: out of memory");
  return rc;
}

static int op_update(cph_pact_tree *t) {
  cph_pact_node f = {0};
  f.content = "updated";
  f.key = "k2";
  f.tags = rich_tags;
  f.n_tags = 3;
  return cph_pact_update(t, 1, &f, CPH_PACT_SET_CONTENT | CPH_PACT_SET_KEY | CPH_PACT_SET_TAGS,
                         NULL);
}

static int op_complete_turn(cph_pact_tree *t) { return cph_pact_complete_turn(t, "in", "out"); }

static int op_copy(cph_pact_tree *t) {
  cph_pact_tree c;
  c.n = 12345; /* must be initialised by the copy, even on failure */
  int rc = cph_pact_tree_copy(&c, t);
  if (rc)
    assert_int_equal(c.n, 0);
  else
    assert_int_equal(c.n, t->n);
  cph_pact_tree_free(&c);
  return rc;
}

static void test_every_allocation_failure_is_enomem_and_changes_nothing(void **state) {
  (void)state;
  cph_pact_tree t;
  cph_pact_tree_init(&t);
  assert_true(fail_each_allocation(&t, op_insert) >= 7); /* array, 3 strings, tags x4, stages */
  for (int i = 0; i < 8; i++) /* fill the array to its first capacity */
    assert_int_equal(op_insert(&t), CPH_OK);
  assert_true(fail_each_allocation(&t, op_insert) >= 8); /* now the array grows too */
  assert_true(fail_each_allocation(&t, op_update) >= 5);
  assert_true(fail_each_allocation(&t, op_complete_turn) >= 4); /* the reply's failures undo */
  assert_true(fail_each_allocation(&t, op_copy) >= 10);

  for (long n = 1; n < 4; n++) {
    cph_selector *sel = (cph_selector *)&sel;
    cph_err err = {0};
    cph_pact__fail_alloc_countdown = n;
    int rc = cph_selector_parse("{key=abc}", &sel, &err);
    cph_pact__fail_alloc_countdown = 0;
    if (rc == CPH_OK) {
      cph_selector_free(sel);
      assert_int_equal(n, 3); /* the selector and its name */
      break;
    }
    assert_int_equal(rc, CPH_ENOMEM);
    assert_null(sel);
  }
  cph_pact_tree_free(&t);
}

/* ---- render order against an independent sort ---- */

static const cph_pact_tree *g_ref_tree;

static uint64_t next_rand(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* DESIGN §6's render order, written out: depth -1, then history deepest first, then depth 0;
 * then position, offset, creation (seq), and the array index last. */
static int ref_cmp(const void *pa, const void *pb) {
  size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
  const cph_pact_node *x = &g_ref_tree->nodes[a], *y = &g_ref_tree->nodes[b];
  int gx = x->at.depth < 0 ? 0 : x->at.depth == 0 ? 2 : 1;
  int gy = y->at.depth < 0 ? 0 : y->at.depth == 0 ? 2 : 1;
  if (gx != gy)
    return gx < gy ? -1 : 1;
  if (gx == 1 && x->at.depth != y->at.depth)
    return x->at.depth > y->at.depth ? -1 : 1;
  if (x->at.position != y->at.position)
    return x->at.position < y->at.position ? -1 : 1;
  if (x->at.offset != y->at.offset)
    return x->at.offset < y->at.offset ? -1 : 1;
  if (x->seq != y->seq)
    return x->seq < y->seq ? -1 : 1;
  return a < b ? -1 : a > b;
}

/* Random trees of up to 600 nodes (so both the keys kept on the stack and the allocated ones),
 * with ties in every field, some laid out in order already or but for one swap, and with the
 * allocation of the keys failing (the fallback): the order is always the reference's. */
static void test_render_order_matches_an_independent_sort(void **state) {
  (void)state;
  uint64_t r = 20261128;
  for (int round = 0; round < 300; round++) {
    cph_pact_tree t = {0};
    t.n = (size_t)(next_rand(&r) % 600);
    t.nodes = calloc(t.n ? t.n : 1, sizeof *t.nodes);
    assert_non_null(t.nodes);
    for (size_t i = 0; i < t.n; i++) {
      cph_pact_node *n = &t.nodes[i];
      n->at.depth = (int32_t)(next_rand(&r) % 7) - 1;
      if (next_rand(&r) % 50 == 0)
        n->at.depth = INT32_MAX;
      n->at.position = (int32_t)(next_rand(&r) % 4) - (next_rand(&r) % 20 == 0 ? INT32_MAX : 0);
      n->at.offset = (int32_t)(next_rand(&r) % 5) - 2;
      n->seq = next_rand(&r) % 40;
      n->waiting = next_rand(&r) % 8 == 0;
    }
    if (round % 4 == 1 && t.n > 1) { /* laid out in render order already (the sort's shortcut), */
      size_t *ord = malloc(t.n * sizeof *ord);
      cph_pact_node *laid = malloc(t.n * sizeof *laid);
      assert_non_null(ord);
      assert_non_null(laid);
      for (size_t i = 0; i < t.n; i++)
        ord[i] = i;
      g_ref_tree = &t;
      qsort(ord, t.n, sizeof *ord, ref_cmp);
      for (size_t i = 0; i < t.n; i++)
        laid[i] = t.nodes[ord[i]];
      free(ord);
      free(t.nodes);
      t.nodes = laid;
      if (round % 8 == 5) { /* or but for one pair swapped */
        size_t a = (size_t)(next_rand(&r) % t.n), b = (size_t)(next_rand(&r) % t.n);
        cph_pact_node x = t.nodes[a];
        t.nodes[a] = t.nodes[b];
        t.nodes[b] = x;
      }
    }
    size_t *got = calloc(t.n + 1, sizeof *got), *want = calloc(t.n + 1, sizeof *want);
    assert_non_null(got);
    assert_non_null(want);
    size_t nw = 0;
    for (size_t i = 0; i < t.n; i++)
      if (!t.nodes[i].waiting)
        want[nw++] = i;
    g_ref_tree = &t;
    qsort(want, nw, sizeof *want, ref_cmp);
    cph_pact__fail_alloc_countdown = round % 3 == 0 ? 1 : 0; /* the keys' allocation fails */
    size_t ng = cph_pact_render_order(&t, got);
    cph_pact__fail_alloc_countdown = 0;
    assert_int_equal(ng, nw);
    for (size_t i = 0; i < nw; i++)
      if (got[i] != want[i])
        fail_msg("round %d, %zu nodes: position %zu is node %zu, want %zu", round, t.n, i, got[i],
                 want[i]);
    free(got);
    free(want);
    free(t.nodes);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_worked_example_ttl3_present_at_0_1_2_gone_from_3),
      cmocka_unit_test(test_worked_example_cadence_recreates_with_new_id_at_5_and_10),
      cmocka_unit_test(test_worked_example_lifecycle_moves_offset_1_then_minus1_then_minus2),
      cmocka_unit_test(test_worked_examples_together_in_one_tree),
      cmocka_unit_test(test_odi_shifts_permanent_and_sticky_nodes_by_the_message_delta),
      cmocka_unit_test(test_odi_negative_delta_removes_nodes_pushed_below_depth_0),
      cmocka_unit_test(test_complete_turn_places_cores_at_delta_to_1_and_shifts_history),
      cmocka_unit_test(test_selectors_match_the_expected_nodes_of_a_fixed_tree),
      cmocka_unit_test(test_invalid_selectors_say_what_was_expected_where),
      cmocka_unit_test(test_selector_longer_than_the_limit_is_elimit),
      cmocka_unit_test(test_coordinates_parse_and_format),
      cmocka_unit_test(test_invalid_coordinates_say_what_and_which_column),
      cmocka_unit_test(test_render_order_system_history_deepest_first_then_current),
      cmocka_unit_test(test_render_order_matches_an_independent_sort),
      cmocka_unit_test(test_insert_rejects_invalid_nodes_and_leaves_the_tree_unchanged),
      cmocka_unit_test(test_tree_copy_is_deep_and_independent),
      cmocka_unit_test(test_update_replaces_masked_fields_all_or_nothing),
      cmocka_unit_test(test_update_ttl_counts_from_creation_and_cadence_0_ends_waiting),
      cmocka_unit_test(test_delete_removes_the_node_and_reports_unknown_ids),
      cmocka_unit_test(test_step_follows_creation_order_even_when_the_array_is_not),
      cmocka_unit_test(test_every_allocation_failure_is_enomem_and_changes_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
