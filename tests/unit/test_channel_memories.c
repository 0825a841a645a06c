/* A channel's memories through the cluster log (server/clusterflow.h 16.; include/cephalon/
 * cephalon.h: cph_event_in.memory_item, cph_event_result.memory_part,
 * cph_channel_memories_item, CPH_OP_CHANNEL_MEMORIES). Node x applies a channel's events as
 * the log's `in` messages: each raw memory it mints comes back as a part; node y, which held
 * copies of only the newest events (as a node whose sessions got them forwarded does), imports
 * the items and then holds every memory of the channel once — by origin for what an import
 * brought before, or the same event applied by another node, and by text for its own copies.
 * An item that is malformed or of another channel is refused, named and counted; the others
 * are taken. */
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
#include "common/clock.h"
#include "store/records.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"

#define EVENTS 300
#define PER_ITEM 100
#define Y_SAW 50 /* y applied the newest 50 itself */

static void fact(int i, char *out, size_t cap) {
  snprintf(out, cap, "fact %03d: the launch of project q%03d moved to day %d", i, i, i + 1);
}

/* How apply_how applies an event. */
enum {
  LOG_ITEM = 1, /* memory_item: the `in` event's applier, whose memory comes back as a part */
  ORIGIN = 2,   /* memory_origin: minted under the event's origin, as every log event is now */
  STAGED = 4,   /* staged for the channel's subscriber "a" (else applied to no session) */
  FORWARD = 8,  /* under another key, as a forward of the event is ("f<i>") */
};

/* Applies events [from, to) of channel "news" on f as log events (keys k<i>, fixed times),
 * as `how` says; the parts, in order, into parts/lens (when not NULL). */
static void apply_how(cph_fixture *f, int from, int to, unsigned how, uint8_t **parts,
                      size_t *lens) {
  bool log = how & LOG_ITEM;
  for (int i = from; i < to; i++) {
    char body[96], key[16];
    fact(i, body, sizeof body);
    snprintf(key, sizeof key, "%s%d", how & FORWARD ? "f" : "k", i);
    cph_event_in ev = {.channel = "news", .sender = "ann", .body = body, .key = key,
                       .ts_ms = 1700000000000 + i, .only_session = !(how & STAGED),
                       .memory_item = log, .memory_origin = how & ORIGIN};
    cph_op op;
    cph_fixture_ingest(f, &ev, 1, &op);
    assert_int_equal(op.rc, CPH_OK);
    cph_event_result *res = &op.u.ingest.results[0];
    if (log) {
      assert_non_null(res->memory_part); /* a raw memory of "#news" */
      assert_true(res->memory_id > 0);
    } else {
      assert_null(res->memory_part);
    }
    if (parts && res->memory_part) {
      free(parts[i]); /* another node's part of the same event, replaced */
      parts[i] = res->memory_part;
      lens[i] = res->memory_part_len;
      res->memory_part = NULL; /* ours now */
    }
    cph_op_clear_results(&op);
  }
}

/* As a node did before events minted under their origins: a node's copies, and an applier
 * whose part gets its event's origin all the same. */
static void apply(cph_fixture *f, int from, int to, bool log, uint8_t **parts, size_t *lens) {
  apply_how(f, from, to, log ? LOG_ITEM : 0, parts, lens);
}

/* The op's answer to importing items[0..n) of channel "news" into f; out: added, held,
 * refused. */
static int import(cph_fixture *f, const cph_state_item *items, size_t n, uint32_t out[3]) {
  cph_op op = {0};
  op.kind = CPH_OP_CHANNEL_MEMORIES;
  op.u.channel.channel = "news";
  op.u.channel.items = items;
  op.u.channel.n_items = n;
  int rc = cph_fixture_run_steps(f, &op, NULL);
  out[0] = op.u.channel.added;
  out[1] = op.u.channel.held;
  out[2] = op.u.channel.refused;
  cph_op_clear_results(&op);
  return rc;
}

typedef struct scope_count {
  int by_text[EVENTS];
  int other;   /* live raw memories of "#news" that are none of the facts */
  int deleted; /* raw memories of "#news" compaction replaced (tombstones) */
  int64_t created[EVENTS];
} scope_count;

static bool count_memory(void *ctx, const void *key, size_t key_len, const void *val,
                         size_t val_len) {
  (void)key;
  (void)key_len;
  scope_count *sc = ctx;
  cph_memory_rec m;
  cph_err err;
  if (cph_record_decode(&cph_memory_desc, val, val_len, &m, &err))
    fail_msg("a memory record does not decode: %s", err.msg);
  if (m.deleted && m.kind == CPH_MEMORY_RAW && strcmp(m.session, "#news") == 0)
    sc->deleted++;
  if (!m.deleted && m.kind == CPH_MEMORY_RAW && strcmp(m.session, "#news") == 0) {
    int i = -1;
    char want[96];
    if (sscanf(m.text, "fact %d:", &i) == 1 && i >= 0 && i < EVENTS &&
        (fact(i, want, sizeof want), strcmp(want, m.text) == 0)) {
      sc->by_text[i]++;
      sc->created[i] = m.created_ms;
    } else {
      sc->other++;
    }
  }
  cph_record_free(&cph_memory_desc, &m);
  return true;
}

/* f's raw memories of "#news", counted by fact (the engine closed for the read, then opened). */
static void count(cph_fixture *f, scope_count *sc) {
  memset(sc, 0, sizeof *sc);
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, count_memory, sc);
  cph_fixture_open(f);
}

static cph_fixture *node_with_policy(const char *tag, const char *name, const char *policy) {
  static const char *const news[] = {"news"};
  cph_fixture *f = cph_fixture_new(tag, policy);
  cph_fixture_create_session(f, "a", CPH_LANE_INTERACTIVE, news, 1);
  cph_engine_report_consumed(f->e, true);
  assert_int_equal(cph_engine_reply_origins(f->e, name), CPH_OK);
  return f;
}

static cph_fixture *node(const char *tag, const char *name) {
  return node_with_policy(tag, name, "{}");
}

/* The parts[from..to) as the log keeps them, an item per PER_ITEM, into items; how many. */
static size_t items_of(uint8_t *const *parts, const size_t *lens, int from, int to,
                       cph_state_item *items) {
  size_t n = 0;
  for (int i = from; i < to; i += PER_ITEM, n++) {
    items[n].name = "c";
    assert_int_equal(cph_channel_memories_item((const uint8_t *const *)&parts[i], &lens[i],
                                               to - i < PER_ITEM ? (size_t)(to - i) : PER_ITEM,
                                               &items[n].data, &items[n].len),
                     CPH_OK);
  }
  return n;
}

static void test_channel_memories_move_whole_and_once(void **state) {
  (void)state;
  cph_fixture *x = node("chanmem_items_x", "x"), *y = node("chanmem_items_y", "y");
  uint8_t *parts[EVENTS] = {0};
  size_t lens[EVENTS] = {0};
  apply(x, 0, EVENTS, true, parts, lens);
  apply(y, EVENTS - Y_SAW, EVENTS, false, NULL, NULL); /* its own copies of the newest */

  /* the parts as the log keeps them: an item per 100 events */
  cph_state_item items[EVENTS / PER_ITEM + 2] = {{0}};
  size_t n_items = items_of(parts, lens, 0, EVENTS, items);
  /* one cut short and one of another channel: refused, the rest taken */
  uint8_t *cut = malloc(items[0].len);
  assert_non_null(cut);
  memcpy(cut, items[0].data, items[0].len);
  items[n_items++] = (cph_state_item){"cut", cut, items[0].len - 3};
  cph_fixture *z = node("chanmem_items_z", "z");
  static const char *const other[] = {"other"};
  cph_fixture_create_session(z, "b", CPH_LANE_INTERACTIVE, other, 1);
  char body[] = "a fact of another channel";
  cph_event_in ev = {.channel = "other", .sender = "ann", .body = body, .key = "o1",
                     .ts_ms = 5, .only_session = true, .memory_item = true};
  cph_op op;
  cph_fixture_ingest(z, &ev, 1, &op);
  const uint8_t *op_part = op.u.ingest.results[0].memory_part;
  size_t op_len = op.u.ingest.results[0].memory_part_len;
  assert_non_null(op_part);
  uint8_t *foreign = NULL;
  size_t foreign_len = 0;
  assert_int_equal(cph_channel_memories_item(&op_part, &op_len, 1, &foreign, &foreign_len), CPH_OK);
  cph_op_clear_results(&op);
  items[n_items++] = (cph_state_item){"other", foreign, foreign_len};

  uint32_t out[3];
  assert_int_equal(import(y, items, n_items, out), CPH_OK);
  assert_int_equal(out[0], EVENTS - Y_SAW); /* added */
  assert_int_equal(out[1], Y_SAW);          /* its own copies: held */
  assert_int_equal(out[2], 2);              /* refused */
  scope_count was, is;
  count(x, &was);
  count(y, &is);
  for (int i = 0; i < EVENTS; i++) {
    if (was.by_text[i] != 1 || is.by_text[i] != 1)
      fail_msg("fact %d: %d on x, %d on y (want 1 and 1)", i, was.by_text[i], is.by_text[i]);
    if (i < EVENTS - Y_SAW && is.created[i] != was.created[i]) /* its age moves with it */
      fail_msg("fact %d was made at %lld on x, %lld on y", i, (long long)was.created[i],
               (long long)is.created[i]);
  }
  assert_int_equal(is.other, 0);

  /* again (a shard taken twice), and the same events as another node applied them (same
   * origins, other creation times): nothing more */
  assert_int_equal(import(y, items, n_items - 2, out), CPH_OK);
  assert_int_equal(out[0], 0);
  assert_int_equal(out[1], EVENTS);
  apply(z, 0, 10, true, parts, lens); /* z's parts of the first ten replace x's */
  cph_state_item again = {"z", NULL, 0};
  assert_int_equal(cph_channel_memories_item((const uint8_t *const *)parts, lens, 10, &again.data,
                                             &again.len),
                   CPH_OK);
  assert_int_equal(import(y, &again, 1, out), CPH_OK);
  assert_int_equal(out[0], 0);
  assert_int_equal(out[1], 10);
  count(y, &is);
  for (int i = 0; i < EVENTS; i++)
    assert_int_equal(is.by_text[i], 1);

  /* a node that holds nothing of the channel takes all of it, embeds it (the janitor), and a
   * search there finds the oldest */
  cph_fixture *w = node("chanmem_items_w", "w");
  assert_int_equal(import(w, items, n_items - 2, out), CPH_OK);
  assert_int_equal(out[0], EVENTS);
  assert_true(cph_fixture_run_maintenance(w, NULL, NULL) > 0);
  char lines[4096];
  cph_fixture_search_lines(w, "a", "q000", lines, sizeof lines);
  if (!strstr(lines, "fact 000: the launch of project q000 moved to day 1"))
    fail_msg("a search for the oldest fact finds:\n%s", lines);

  /* deliveries of the events as log events (memory_origin: forwards, a rebuild's, under
   * their own keys): one before the import minted its memory under the event's origin, which
   * the import holds; one after it finds the imported memory by that origin and mints none,
   * as does the same forward delivered twice over */
  cph_fixture *v = node("chanmem_items_v", "v");
  apply_how(v, 7, 8, ORIGIN | FORWARD, NULL, NULL);
  assert_int_equal(import(v, items, n_items - 2, out), CPH_OK);
  assert_int_equal(out[0], EVENTS - 1);
  assert_int_equal(out[1], 1);
  apply_how(v, 5, 6, ORIGIN | FORWARD, NULL, NULL);
  apply_how(v, 250, 300, ORIGIN | FORWARD | STAGED, NULL, NULL);
  scope_count vs;
  count(v, &vs);
  for (int i = 0; i < EVENTS; i++)
    if (vs.by_text[i] != 1)
      fail_msg("fact %d: %d raw memories on v, want 1", i, vs.by_text[i]);
  assert_int_equal(vs.other, 0);
  cph_fixture_free(v);

  for (size_t i = 0; i < n_items; i++)
    free(items[i].data);
  free(again.data);
  for (int i = 0; i < EVENTS; i++)
    free(parts[i]);
  cph_fixture_free(x);
  cph_fixture_free(y);
  cph_fixture_free(z);
  cph_fixture_free(w);
}

/* Rewrites the event origins f's memories were minted under (CPH_DB_MEMORY_ORIGINS: 0xFE be64
 * id -> origin, origin\0 -> be64 id) to the form a build before the time led wrote: "e:" and
 * the hash alone. The engine closed; *n how many. */
static void to_hash_only_origins(cph_fixture *f, size_t *n) {
  enum { MAX = 16, NEW_LEN = 2 + 16 + 64 };
  uint8_t ids[MAX][9];
  char was[MAX][NEW_LEN + 1];
  *n = 0;
  cph_engine_close(f->e);
  f->e = NULL;
  cph_store *st = cph_fixture_store_open(f->dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_MEMORY_ORIGINS, &c), CPH_OK);
  cph_key from = {.data = {0xFE}, .len = 1};
  cph_val k, v;
  for (int rc = cph_cursor_seek(&c, &from, &k, &v); rc == CPH_OK && *n < MAX;
       rc = cph_cursor_next(&c, &k, &v)) {
    const uint8_t *kp = k.data;
    if (k.len != 9 || kp[0] != 0xFE || v.len != NEW_LEN || memcmp(v.data, "e:", 2) != 0)
      continue;
    memcpy(ids[*n], kp, 9);
    memcpy(was[*n], v.data, NEW_LEN);
    was[*n][NEW_LEN] = '\0';
    (*n)++;
  }
  cph_cursor_close(&c);
  for (size_t i = 0; i < *n; i++) {
    char old[2 + 64 + 1] = "e:";
    memcpy(old + 2, was[i] + 2 + 16, 64 + 1);
    cph_key mk = {.len = 9};
    memcpy(mk.data, ids[i], 9);
    assert_int_equal(cph_txn_put(&t, CPH_DB_MEMORY_ORIGINS, &mk, old, strlen(old)), CPH_OK);
    cph_key ok;
    cph_key_reset(&ok);
    cph_key_str(&ok, was[i]);
    assert_int_equal(cph_txn_del(&t, CPH_DB_MEMORY_ORIGINS, &ok), CPH_OK);
    cph_key_reset(&ok);
    cph_key_str(&ok, old);
    assert_int_equal(cph_txn_put(&t, CPH_DB_MEMORY_ORIGINS, &ok, ids[i] + 1, 8), CPH_OK);
  }
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  cph_fixture_open(f);
}

/* A data directory of a build before the event's identity led with its time: a memory minted
 * under the hash alone is held by its text when the channel's items come (their origins are
 * of the new form, which no index here holds) — not stored a second time. */
static void test_a_memory_under_an_older_origin_is_held_by_its_text(void **state) {
  (void)state;
  cph_fixture *x = node("chanmem_v1_x", "x"), *u = node("chanmem_v1_u", "u");
  uint8_t *parts[10] = {0};
  size_t lens[10] = {0};
  apply(x, 0, 10, true, parts, lens);
  apply_how(u, 7, 8, ORIGIN | FORWARD, NULL, NULL); /* u minted event 7's under its origin */
  size_t rewritten;
  to_hash_only_origins(u, &rewritten);
  assert_int_equal(rewritten, 1);
  cph_state_item it = {"x", NULL, 0};
  assert_int_equal(
      cph_channel_memories_item((const uint8_t *const *)parts, lens, 10, &it.data, &it.len),
      CPH_OK);
  uint32_t out[3];
  assert_int_equal(import(u, &it, 1, out), CPH_OK);
  if (out[0] != 9 || out[1] != 1 || out[2] != 0)
    fail_msg("the import added %u, held %u and refused %u; want 9, 1 and 0", out[0], out[1],
             out[2]);
  scope_count is;
  count(u, &is);
  for (int i = 0; i < 10; i++)
    if (is.by_text[i] != 1)
      fail_msg("fact %d: %d raw memories on u, want 1", i, is.by_text[i]);
  free(it.data);
  for (int i = 0; i < 10; i++)
    free(parts[i]);
  cph_fixture_free(x);
  cph_fixture_free(u);
}

static uint8_t *consume_all(cph_fixture *f, size_t events, size_t *len);

/* A node that compacted its own copy of a channel keeps it compacted. y's copies (the events
 * applied as forwards are) were replaced by summaries by y's gc; the raw memories it replaced
 * stay as tombstones, and they are copies y holds: the channel's items, imported at a takeover,
 * bring none of them back — live again, they would be searched beside their summaries and,
 * with ids newer than y's newest, listed by the next turn as the channel's recent memory. */
static void test_channel_memories_compacted_copies_stay_compacted(void **state) {
  (void)state;
  cph_fixture *x = node("chanmem_gc_x", "x");
  cph_fixture *y = node_with_policy("chanmem_gc_y", "y",
                                    "{:sessions {:janitor? true}"
                                    " :gc {:min-age-hours 0 :max-access 1000000"
                                    "      :plan-interval-s 60}"
                                    " :scheduler {:lanes {:maintenance {:turns 100000}}}}");
  uint8_t *parts[EVENTS] = {0};
  size_t lens[EVENTS] = {0};
  apply_how(x, 0, EVENTS, LOG_ITEM | STAGED, parts, lens);
  apply(y, 0, EVENTS, false, NULL, NULL);
  cph_clock_advance(&y->clock, 61 * CPH_NS_PER_S); /* y's gc_plan is due */
  cph_fixture_run_maintenance(y, NULL, NULL);
  scope_count before, after;
  count(y, &before);
  int compacted = 0;
  for (int i = 0; i < EVENTS; i++)
    compacted += before.by_text[i] == 0;
  if (compacted < EVENTS / 2 || before.deleted != compacted)
    fail_msg("y's gc compacted %d of its %d copies (%d tombstones): the test needs most",
             compacted, EVENTS, before.deleted);

  cph_state_item items[EVENTS / PER_ITEM] = {{0}};
  size_t n_items = items_of(parts, lens, 0, EVENTS, items);
  uint32_t out[3];
  assert_int_equal(import(y, items, n_items, out), CPH_OK);
  if (out[0] != 0 || out[1] != EVENTS)
    fail_msg("the import added %u and held %u of the channel's %d memories; want 0 and %d",
             out[0], out[1], EVENTS, EVENTS);
  count(y, &after);
  for (int i = 0; i < EVENTS; i++)
    if (after.by_text[i] != before.by_text[i])
      fail_msg("fact %d: %d live raw copies on y before the import, %d after", i,
               before.by_text[i], after.by_text[i]);

  /* then x's state of "a", which carries the channel's newest raw memories (all 300, live on
   * x): none comes back either */
  size_t len = 0;
  uint8_t *blob = consume_all(x, EVENTS, &len);
  cph_op st = {0};
  st.kind = CPH_OP_SESSION_STATE;
  st.u.state.session = "a";
  st.u.state.data = blob;
  st.u.state.len = len;
  assert_int_equal(cph_fixture_run(y, &st), CPH_OK);
  cph_op_clear_results(&st);
  count(y, &after);
  for (int i = 0; i < EVENTS; i++)
    if (after.by_text[i] != before.by_text[i])
      fail_msg("fact %d: %d live raw copies on y before x's state, %d after", i,
               before.by_text[i], after.by_text[i]);
  free(blob);
  for (size_t i = 0; i < n_items; i++)
    free(items[i].data);
  for (int i = 0; i < EVENTS; i++)
    free(parts[i]);
  cph_fixture_free(x);
  cph_fixture_free(y);
}

typedef struct fact_order {
  int v[EVENTS + 8];
  int n;
  int other; /* live raw memories of "#news" that are none of the facts */
} fact_order;

static bool order_memory(void *ctx, const void *key, size_t key_len, const void *val,
                         size_t val_len) {
  (void)key;
  (void)key_len;
  fact_order *fo = ctx;
  cph_memory_rec m;
  cph_err err;
  if (cph_record_decode(&cph_memory_desc, val, val_len, &m, &err))
    fail_msg("a memory record does not decode: %s", err.msg);
  int i = -1;
  if (!m.deleted && m.kind == CPH_MEMORY_RAW && strcmp(m.session, "#news") == 0) {
    if (sscanf(m.text, "fact %d:", &i) == 1 && fo->n < EVENTS + 8)
      fo->v[fo->n++] = i;
    else
      fo->other++;
  }
  cph_record_free(&cph_memory_desc, &m);
  return true;
}

/* f's live raw memories of "#news" in id order: the facts' numbers, and how many others. */
static void facts_in_id_order(cph_fixture *f, fact_order *fo) {
  memset(fo, 0, sizeof *fo);
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, order_memory, fo);
  cph_fixture_open(f);
}

typedef struct done_log {
  const cph_op *order[2];
  int n;
} done_log;

static void log_done(cph_op *op, void *ctx) {
  done_log *dl = ctx;
  if (dl->n < 2)
    dl->order[dl->n] = op;
  dl->n++;
}

/* A big import goes in steps (CPH_CHANNEL_IMPORT_STEP memories a pass; 64 here), and what is
 * queued meanwhile is applied between them: an event posted right after the import's
 * submission is answered before the import ends. Stored in steps, the memories are what one
 * step stores — every fact once, in the order they were made (ids), the node's own copies
 * held across the steps (y saw the newest 50: they come in the last steps) —, and the live
 * event's memory is not an item's: it neither counts nor stops one. */
static void test_channel_memories_in_steps(void **state) {
  (void)state;
  cph_fixture *x = node("chanmem_steps_x", "x"), *one = node("chanmem_steps_one", "one"),
              *stepped = node("chanmem_steps_64", "stepped");
  uint8_t *parts[EVENTS] = {0};
  size_t lens[EVENTS] = {0};
  apply(x, 0, EVENTS, true, parts, lens);
  apply(one, EVENTS - Y_SAW, EVENTS, false, NULL, NULL);
  apply(stepped, EVENTS - Y_SAW, EVENTS, false, NULL, NULL);
  cph_state_item items[EVENTS / PER_ITEM] = {{0}};
  size_t n_items = items_of(parts, lens, 0, EVENTS, items);

  cph_op op = {0};
  op.kind = CPH_OP_CHANNEL_MEMORIES;
  op.u.channel.channel = "news";
  op.u.channel.items = items;
  op.u.channel.n_items = n_items;
  int passes = 0;
  assert_int_equal(cph_fixture_run_steps(one, &op, &passes), CPH_OK);
  assert_int_equal(passes, 1); /* 300 memories: one step */
  assert_int_equal(op.u.channel.added, EVENTS - Y_SAW);
  assert_int_equal(op.u.channel.held, Y_SAW);
  cph_op_clear_results(&op);

  done_log dl = {0};
  memset(&op, 0, sizeof op);
  op.kind = CPH_OP_CHANNEL_MEMORIES;
  op.u.channel.channel = "news";
  op.u.channel.items = items;
  op.u.channel.n_items = n_items;
  op.u.channel.step = 64;
  op.done = log_done;
  op.ctx = &dl;
  assert_int_equal(cph_engine_submit(stepped->e, &op), CPH_OK);
  char body[] = "breaking: the launch window opens tonight";
  cph_event_in ev = {.channel = "news", .sender = "bo", .body = body};
  cph_op in = {0};
  in.kind = CPH_OP_INGEST;
  in.u.ingest.events = &ev;
  in.u.ingest.n_events = 1;
  in.done = log_done;
  in.ctx = &dl;
  assert_int_equal(cph_engine_submit(stepped->e, &in), CPH_OK);
  passes = 0;
  while (dl.n < 2 && passes < 100) {
    cph_engine_run_pass(stepped->e);
    passes++;
  }
  assert_int_equal(dl.n, 2);
  assert_int_equal(passes, (EVENTS + 63) / 64); /* five steps, a pass each */
  assert_ptr_equal(dl.order[0], &in);           /* the event did not wait for the import */
  assert_ptr_equal(dl.order[1], &op);
  assert_int_equal(in.rc, CPH_OK);
  assert_int_equal(op.rc, CPH_OK);
  if (op.u.channel.added != EVENTS - Y_SAW || op.u.channel.held != Y_SAW)
    fail_msg("in steps the import added %u and held %u; want %d and %d", op.u.channel.added,
             op.u.channel.held, EVENTS - Y_SAW, Y_SAW);
  assert_null(op.u.channel.cont);
  cph_op_clear_results(&op);
  cph_op_clear_results(&in);

  fact_order a, b;
  facts_in_id_order(one, &a);
  facts_in_id_order(stepped, &b);
  assert_int_equal(a.other, 0);
  assert_int_equal(b.other, 1); /* the live event's */
  assert_int_equal(a.n, EVENTS);
  assert_int_equal(b.n, EVENTS);
  for (int i = 0; i < EVENTS; i++)
    if (a.v[i] != b.v[i])
      fail_msg("memory %d by id: fact %d imported in one step, fact %d in steps", i, a.v[i],
               b.v[i]);
  for (int i = 0; i < EVENTS; i++) /* its own copies (the newest 50), then the rest, oldest first */
    assert_int_equal(b.v[i], i < Y_SAW ? EVENTS - Y_SAW + i : i - Y_SAW);

  for (size_t i = 0; i < n_items; i++)
    free(items[i].data);
  for (int i = 0; i < EVENTS; i++)
    free(parts[i]);
  cph_fixture_free(x);
  cph_fixture_free(one);
  cph_fixture_free(stepped);
}

/* news's memories on f by kind: raw ones with text `text`, and aggregates. */
typedef struct kind_count {
  const char *text;
  int raw, aggregate;
} kind_count;

static bool count_kinds(void *ctx, const void *key, size_t key_len, const void *val,
                        size_t val_len) {
  (void)key;
  (void)key_len;
  kind_count *kc = ctx;
  cph_memory_rec m;
  cph_err err;
  if (cph_record_decode(&cph_memory_desc, val, val_len, &m, &err))
    fail_msg("a memory record does not decode: %s", err.msg);
  if (!m.deleted && strcmp(m.session, "#news") == 0) {
    kc->raw += m.kind == CPH_MEMORY_RAW && strcmp(m.text, kc->text) == 0;
    kc->aggregate += m.kind == CPH_MEMORY_AGGREGATE;
  }
  cph_record_free(&cph_memory_desc, &m);
  return true;
}

/* One message of ann's in #news as a copy of the cluster log carries it (its time fixed where
 * it was accepted; memory_item as the `in` event's applier gives it): for session, or for the
 * channel's history alone (session NULL); its status. */
static int said_at(cph_fixture *f, const char *key, const char *session, int64_t ts_ms,
                   const char *body, bool item) {
  cph_event_in ev = {.channel = "news", .sender = "ann", .body = (char *)body, .key = (char *)key,
                     .session = (char *)session, .ts_ms = ts_ms, .only_session = true,
                     .memory_item = item, .memory_origin = true};
  cph_op op;
  cph_fixture_ingest(f, &ev, 1, &op);
  assert_int_equal(op.rc, CPH_OK);
  int status = op.u.ingest.results[0].status;
  cph_op_clear_results(&op);
  return status;
}

/* One copy of "the build is green again" by ann on f; its status. */
static int copy_of(cph_fixture *f, const char *key, const char *session, int64_t ts_ms,
                   bool item) {
  return said_at(f, key, session, ts_ms, "the build is green again", item);
}

/* What a turn of session on f shows of the message: in its messages (how often, and, unless
 * away_ok, whether in an away block), in recent_memory. */
static void shown_once_in(cph_fixture *f, const char *session, bool away_ok) {
  cph_op l;
  cph_fixture_lease(f, "w", &l);
  const cph_turn_info *t = &l.u.lease.turn;
  assert_string_equal(t->session, session);
  int in_messages = 0;
  for (size_t i = 0; i < t->n_messages; i++) {
    if (strstr(t->messages[i].content, "the build is green again"))
      in_messages++;
    if (!away_ok && strstr(t->messages[i].content, "MESSAGES WHILE YOU WERE AWAY"))
      fail_msg("%s's turn shows an away block: %s", session, t->messages[i].content);
  }
  if (in_messages != 1)
    fail_msg("%s's turn shows the message %d times, want once", session, in_messages);
  for (size_t i = 0; i < t->n_memories; i++)
    if (strstr(t->memories[i].text, "the build is green again"))
      fail_msg("%s's turn lists the memory %s '%s' beside the message", session,
               t->memories[i].kind, t->memories[i].text);
  cph_op_clear_results(&l);
}

static void shown_once(cph_fixture *f, const char *session) {
  shown_once_in(f, session, false);
}

/* Node "x" in cluster mode (its etcd and NATS never reached: the engine alone), with "a" and
 * "b" subscribed to "news": where copies of one message meet. */
static cph_fixture *copies_node(const char *tag) {
  static const char *const news[] = {"news"};
  cph_fixture *f = node_with_policy(tag, "x",
                                    "{:cluster {:node \"x\" :advertise \"http://127.0.0.1:9\""
                                    " :etcd [\"http://127.0.0.1:9\"]"
                                    " :nats [\"nats://127.0.0.1:9\"]}}");
  cph_fixture_create_session(f, "b", CPH_LANE_INTERACTIVE, news, 1);
  return f;
}

/* Where text is among the turn's messages, and among its conversation_history entries. */
static size_t message_at(const cph_turn_info *t, const char *text) {
  for (size_t i = 0; i < t->n_messages; i++)
    if (strstr(t->messages[i].content, text))
      return i;
  fail_msg("the turn's messages do not show '%s'", text);
  return 0;
}

static size_t history_at(const cph_turn_info *t, const char *text) {
  for (size_t i = 0; i < t->n_history; i++)
    if (strstr(t->history[i].body, text))
      return i;
  fail_msg("the turn's conversation_history does not list '%s'", text);
  return 0;
}

/* A node's copy of a channel gets a message late when another node accepted it — a reply
 * another node's session wrote, an event its channel's owner applied after newer ones
 * (server/clusterflow.h 3., 14.) — and appends it to its log then. A turn shows the
 * conversation in the order it was said (each copy carries the time its message was
 * accepted), the same on every node: before, "bravo" (said second, arrived third) came after
 * "charlie" in b's turn on this node and before it on the node that accepted it. The late
 * copy b has not seen yet still comes in the away block, in its time among the block's. */
static void test_late_copies_are_shown_in_the_order_they_were_said(void **state) {
  (void)state;
  cph_fixture *f = copies_node("chanmem_copy_order");
  const int64_t T = 1700000000000;
  assert_int_equal(said_at(f, "h1", NULL, T + 1000, "alpha: the deploy started", false),
                   CPH_EV_STORED);
  assert_int_equal(said_at(f, "h3", NULL, T + 3000, "charlie: the deploy finished", false),
                   CPH_EV_STORED);
  assert_int_equal(said_at(f, "h2", NULL, T + 2000, "bravo: the tests passed", false),
                   CPH_EV_STORED);
  assert_int_equal(said_at(f, "q4", "b", T + 4000, "delta: is it live?", false), CPH_EV_QUEUED);
  /* after b's trigger: two more, the older of them late */
  assert_int_equal(said_at(f, "h6", NULL, T + 6000, "foxtrot: traffic moved", false),
                   CPH_EV_STORED);
  assert_int_equal(said_at(f, "h5", NULL, T + 5000, "echo: the cache warmed", false),
                   CPH_EV_STORED);
  cph_op l;
  cph_fixture_lease(f, "w", &l);
  const cph_turn_info *t = &l.u.lease.turn;
  assert_string_equal(t->session, "b");
  static const char *const said[] = {"alpha:", "bravo:", "charlie:"};
  for (size_t i = 1; i < 3; i++) {
    if (message_at(t, said[i - 1]) >= message_at(t, said[i]))
      fail_msg("b's messages show '%s' (%zu) before '%s' (%zu): not in the order said", said[i],
               message_at(t, said[i]), said[i - 1], message_at(t, said[i - 1]));
    if (history_at(t, said[i - 1]) >= history_at(t, said[i]))
      fail_msg("b's conversation_history lists '%s' before '%s'", said[i], said[i - 1]);
  }
  assert_true(message_at(t, "charlie:") < message_at(t, "delta:"));
  /* the away block: one message, echo's line before foxtrot's */
  size_t away = message_at(t, "MESSAGES WHILE YOU WERE AWAY");
  const char *block = t->messages[away].content;
  const char *echo = strstr(block, "echo:"), *foxtrot = strstr(block, "foxtrot:");
  if (!echo || !foxtrot || echo > foxtrot)
    fail_msg("b's away block is not in the order said: %s", block);
  cph_op_clear_results(&l);
  cph_fixture_free(f);
}

/* The messages a turn answers (depth 0) come late too: the log delivers b its copy of a
 * message said elsewhere after one said later here. The turn stages them in the order they
 * were said, in its messages and in its input; before, in the order they arrived. */
static void test_late_triggers_are_staged_in_the_order_they_were_said(void **state) {
  (void)state;
  cph_fixture *f = copies_node("chanmem_trigger_order");
  const int64_t T = 1700000000000;
  assert_int_equal(said_at(f, "q2", "b", T + 2000, "bravo: is it live?", false), CPH_EV_QUEUED);
  assert_int_equal(said_at(f, "q1", "b", T + 1000, "alpha: the deploy finished", false),
                   CPH_EV_QUEUED);
  cph_op l;
  cph_fixture_lease(f, "w", &l);
  const cph_turn_info *t = &l.u.lease.turn;
  assert_string_equal(t->session, "b");
  assert_int_equal(t->n_staged, 2);
  if (message_at(t, "alpha:") >= message_at(t, "bravo:"))
    fail_msg("b's turn shows 'bravo:' (%zu) before 'alpha:' (%zu): not in the order said",
             message_at(t, "bravo:"), message_at(t, "alpha:"));
  assert_string_equal(t->staged[0].body, "alpha: the deploy finished");
  assert_string_equal(t->input, "inbox:alpha: the deploy finished\nbravo: is it live?");
  cph_op_clear_results(&l);
  cph_fixture_free(f);
}

/* Cluster mode gives each session its own copy of a channel's message (the channel's owner
 * applies the `in` event, then a forward to each subscriber wherever it lives, this node
 * included: server/clusterflow.h 3.). Several copies of one message on one node are one
 * message, as on one node: the channel's history holds it once, no copy is a repeat of
 * another (no family, no "[aggregate] repeated" memory), one raw memory, and each
 * subscriber's turn shows it once — not also as a message from while it was away, not also as
 * a memory. A real repeat (the same words later) still folds. Before: the later copies were
 * exact repeats of the first, and every subscriber's turn listed "[aggregate] repeated in
 * #news" and, on the in event's node, showed the message twice. */
static void test_copies_of_one_message_on_one_node_are_one_message(void **state) {
  (void)state;
  cph_fixture *f = copies_node("chanmem_copies");
  assert_int_equal(copy_of(f, "in1", NULL, 1700000000000, true), CPH_EV_STORED);
  assert_int_equal(copy_of(f, "f1a", "a", 1700000000000, false), CPH_EV_QUEUED);
  assert_int_equal(copy_of(f, "f1b", "b", 1700000000000, false), CPH_EV_QUEUED);
  kind_count kc = {.text = "the build is green again"};
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, count_kinds, &kc);
  cph_fixture_open(f);
  if (kc.raw != 1 || kc.aggregate != 0)
    fail_msg("the three copies made %d raw memories and %d aggregates; want 1 and 0", kc.raw,
             kc.aggregate);
  shown_once(f, "a");
  shown_once(f, "b");
  /* the same words a minute later: a repeat, folded as before */
  assert_int_equal(copy_of(f, "f2a", "a", 1700000060000, false), CPH_EV_AGGREGATED);
  cph_fixture_free(f);
}

/* A copy that comes after many newer messages in its channel — a batch of a thousand applied
 * before its forwards, a busy channel — is still the same message: found by the raw memory
 * the first copy minted, not only among the channel's newest 256 entries. Before: a forward
 * 300 messages late was an exact repeat of its own `in` event (AGGREGATED, an "[aggregate]
 * repeated in #news" memory). */
static void test_a_late_copy_is_still_one_message(void **state) {
  (void)state;
  cph_fixture *f = copies_node("chanmem_late_copy");
  assert_int_equal(copy_of(f, "in1", NULL, 1700000000000, true), CPH_EV_STORED);
  enum { LATER = 300 };
  static char bodies[LATER][32];
  static char keys[LATER][16];
  cph_event_in later[LATER];
  for (int i = 0; i < LATER; i++) {
    snprintf(bodies[i], sizeof bodies[i], "status line %d", i);
    snprintf(keys[i], sizeof keys[i], "n%d", i);
    later[i] = (cph_event_in){.channel = "news", .sender = "cy", .body = bodies[i],
                              .key = keys[i], .ts_ms = 1700000000001 + i, .only_session = true,
                              .memory_item = true, .memory_origin = true};
  }
  cph_op op;
  cph_fixture_ingest(f, later, LATER, &op);
  assert_int_equal(op.rc, CPH_OK);
  for (int i = 0; i < LATER; i++)
    assert_int_equal(op.u.ingest.results[i].status, CPH_EV_STORED);
  cph_op_clear_results(&op);
  int a = copy_of(f, "f1a", "a", 1700000000000, false);
  int b = copy_of(f, "f1b", "b", 1700000000000, false);
  if (a != CPH_EV_QUEUED || b != CPH_EV_QUEUED)
    fail_msg("copies %d messages late were %s and %s, want queued", LATER,
             cph_ingest_status_name(a), cph_ingest_status_name(b));
  kind_count kc = {.text = "the build is green again"};
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, count_kinds, &kc);
  cph_fixture_open(f);
  if (kc.raw != 1 || kc.aggregate != 0)
    fail_msg("the late copies made %d raw memories and %d aggregates; want 1 and 0", kc.raw,
             kc.aggregate);
  /* the 300 later messages, whose copies to a have not come yet, are shown as from while it
   * was away; the message itself once */
  shown_once_in(f, "a", true);
  /* the same words a minute later: a repeat, folded as before */
  assert_int_equal(copy_of(f, "f2a", "a", 1700000060000, false), CPH_EV_AGGREGATED);
  cph_fixture_free(f);
}

static bool family_counts(void *ctx, const void *key, size_t key_len, const void *val,
                          size_t val_len) {
  (void)key;
  (void)key_len;
  uint64_t *counts = ctx; /* [0]: families, [1]: the last one's count */
  cph_aggregate_rec a;
  cph_err err;
  if (cph_record_decode(&cph_aggregate_desc, val, val_len, &a, &err))
    fail_msg("a family record does not decode: %s", err.msg);
  counts[0]++;
  counts[1] = a.dup_count;
  cph_record_free(&cph_aggregate_desc, &a);
  return true;
}

/* How many events the staged entries of session's turn on f stand for; *entries how many
 * entries there are. */
static uint32_t staged_events(cph_fixture *f, const char *session, size_t *entries) {
  cph_op l;
  cph_fixture_lease(f, "w", &l);
  assert_int_equal(l.rc, CPH_OK);
  assert_string_equal(l.u.lease.turn.session, session);
  *entries = l.u.lease.turn.n_staged;
  uint32_t n = 0;
  for (size_t i = 0; i < l.u.lease.turn.n_staged; i++)
    n += l.u.lease.turn.staged[i].count;
  cph_op_clear_results(&l);
  return n;
}

/* A repeat has copies too (the `in` event and a forward to each subscriber, on the channel
 * owner's node; or forwards to two sessions on one node), and none of them finds the message
 * in the history (a repeat adds no entry) or by a raw memory (it mints none). Its family
 * counts it once — the message and its repeat: 2 — and each subscriber's turn has both in
 * one entry, the message with its count. Before: every copy counted again (the family said
 * 4), and the count grew with the number of subscribers on the node; and the repeat was an
 * entry of its own beside the message (its forward matched no entry: each holds its own
 * copy's event). */
static void test_copies_of_a_repeat_count_it_once(void **state) {
  (void)state;
  cph_fixture *f = copies_node("chanmem_repeat_copies");
  /* times of now: a copy mark lasts while its message's time is in the dedupe window */
  const int64_t t0 = cph_wall_ms() - 20000, t1 = t0 + 5000;
  assert_int_equal(copy_of(f, "in1", NULL, t0, true), CPH_EV_STORED);
  assert_int_equal(copy_of(f, "f1a", "a", t0, false), CPH_EV_QUEUED);
  assert_int_equal(copy_of(f, "f1b", "b", t0, false), CPH_EV_QUEUED);
  /* the same words five seconds later, by the same sender: a repeat, with its copies */
  assert_int_equal(copy_of(f, "in2", NULL, t1, true), CPH_EV_AGGREGATED);
  assert_int_equal(copy_of(f, "f2a", "a", t1, false), CPH_EV_AGGREGATED);
  assert_int_equal(copy_of(f, "f2b", "b", t1, false), CPH_EV_AGGREGATED);
  uint64_t fam[2] = {0, 0};
  kind_count kc = {.text = "the build is green again"};
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_AGGREGATES, family_counts, fam);
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, count_kinds, &kc);
  cph_fixture_open(f);
  if (fam[0] != 1 || fam[1] != 2)
    fail_msg("a message and its one repeat, three copies each, made %llu families counting "
             "%llu; want 1 counting 2",
             (unsigned long long)fam[0], (unsigned long long)fam[1]);
  if (kc.raw != 1 || kc.aggregate != 1)
    fail_msg("%d raw memories and %d aggregates; want 1 and 1", kc.raw, kc.aggregate);
  /* each subscriber's turn has the message and its repeat — the copies that counted nothing
   * in the family still reached their sessions — in one entry, as on one node: the repeat
   * folded into the entry of the session's own copy of the message */
  for (int i = 0; i < 2; i++) {
    const char *session = i ? "b" : "a";
    size_t entries;
    uint32_t events = staged_events(f, session, &entries);
    if (events != 2 || entries != 1)
      fail_msg("%s's turn has %u events in %zu entries; want 2 in 1", session, events, entries);
  }
  /* a third time, its copies in the other order: counted once more */
  const int64_t t2 = t1 + 5000;
  assert_int_equal(copy_of(f, "f3b", "b", t2, false), CPH_EV_AGGREGATED);
  assert_int_equal(copy_of(f, "in3", NULL, t2, true), CPH_EV_AGGREGATED);
  assert_int_equal(copy_of(f, "f3a", "a", t2, false), CPH_EV_AGGREGATED);
  fam[0] = fam[1] = 0;
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_AGGREGATES, family_counts, fam);
  cph_fixture_open(f);
  if (fam[0] != 1 || fam[1] != 3)
    fail_msg("after a second repeat the family counts %llu in %llu families; want 3 in 1",
             (unsigned long long)fam[1], (unsigned long long)fam[0]);
  cph_fixture_free(f);
}

/* An event that mints no raw memory (an exact repeat within the dedupe window) gives no part;
 * nor does one applied without memory_item (a forward, a history copy). */
static void test_channel_memories_only_what_was_minted(void **state) {
  (void)state;
  cph_fixture *x = node("chanmem_minted_x", "x");
  char body[] = "the same words twice";
  cph_event_in ev[2] = {
      {.channel = "news", .sender = "ann", .body = body, .key = "r1", .ts_ms = 1,
       .only_session = true, .memory_item = true},
      {.channel = "news", .sender = "ann", .body = body, .key = "r2", .ts_ms = 2,
       .only_session = true, .memory_item = true}};
  cph_op op;
  cph_fixture_ingest(x, ev, 2, &op);
  assert_int_equal(op.rc, CPH_OK);
  assert_non_null(op.u.ingest.results[0].memory_part);
  assert_int_equal(op.u.ingest.results[1].status, CPH_EV_AGGREGATED);
  assert_null(op.u.ingest.results[1].memory_part);
  cph_op_clear_results(&op);
  cph_fixture_free(x);
}

/* Leases and completes f's turns of session "a" until they consumed `events` events; the last
 * completion's state (*len bytes). */
static uint8_t *consume_all(cph_fixture *f, size_t events, size_t *len) {
  uint8_t *state = NULL;
  size_t consumed = 0;
  for (int turns = 0; consumed < events && turns < 1000; turns++) {
    cph_op lease;
    cph_fixture_lease(f, "w", &lease);
    for (size_t i = 0; i < lease.u.lease.turn.n_staged; i++)
      consumed += lease.u.lease.turn.staged[i].count;
    cph_op done = {0};
    done.kind = CPH_OP_COMPLETE;
    done.u.turn.turn_id = lease.u.lease.turn.id;
    memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
    done.u.turn.reply_body = "noted";
    assert_int_equal(cph_fixture_run(f, &done), CPH_OK);
    done.u.turn.reply_body = NULL;
    free(state);
    state = done.u.turn.state;
    *len = done.u.turn.state_len;
    done.u.turn.state = NULL;
    cph_op_clear_results(&done);
    cph_op_clear_results(&lease);
  }
  assert_int_equal(consumed, events);
  assert_non_null(state);
  return state;
}

/* The raw memories of the next turn of "a" on f (after one more message to "news"), a line
 * each: "scope text". */
static void next_raw_memories(cph_fixture *f, char *out, size_t cap) {
  char body[] = "what ships next?";
  cph_event_in ev = {.channel = "news", .sender = "bo", .body = body};
  cph_op in;
  cph_fixture_ingest(f, &ev, 1, &in);
  cph_op_clear_results(&in);
  cph_op lease;
  cph_fixture_lease(f, "w", &lease);
  assert_int_equal(lease.rc, CPH_OK);
  const cph_turn_info *t = &lease.u.lease.turn;
  size_t at = 0;
  out[0] = '\0';
  for (size_t i = 0; i < t->n_memories && at < cap; i++)
    if (strcmp(t->memories[i].kind, "raw") == 0)
      at += (size_t)snprintf(out + at, cap - at, "%s %s\n", t->memories[i].scope,
                             t->memories[i].text);
  assert_true(at < cap);
  cph_op_clear_results(&lease);
}

/* What a takeover does (server/clusterflow.h 16.): the channel's items stored before the
 * session's state. The state carries the newest raw memories (its history's worth and 32
 * more); the items carry all 1,200. The new node's next turn lists the raw memories the old
 * node's listed, in order — the items' older memories got lower ids there than the state's, and
 * the state's, held already, are linked to their moved events (so the turn does not list a
 * memory whose message its history shows) — and it holds every note once. Imported the other
 * way round (the state first), the old notes come out newest and the turn lists them instead. */
static void test_channel_memories_before_the_state_keep_the_turns_memories(void **state) {
  (void)state;
  cph_fixture *x = node("chanmem_order_x", "x"), *y = node("chanmem_order_y", "y"),
              *z = node("chanmem_order_z", "z");
  enum { NOTES = 1200 };
  uint8_t **parts = calloc(NOTES, sizeof *parts);
  size_t *lens = calloc(NOTES, sizeof *lens);
  assert_non_null(parts);
  assert_non_null(lens);
  cph_state_item items[NOTES / PER_ITEM] = {{0}};
  for (int i = 0; i < NOTES; i += PER_ITEM) {
    for (int k = i; k < i + PER_ITEM; k++) { /* as the log applies them: staged for "a" */
      char body[96], key[16];
      snprintf(body, sizeof body, "note %04d: project q%04d ships on day %d", k, k, k + 1);
      snprintf(key, sizeof key, "n%d", k);
      cph_event_in ev = {.channel = "news", .sender = "ann", .body = body, .key = key,
                         .ts_ms = 1700000000000 + k, .memory_item = true};
      cph_op op;
      cph_fixture_ingest(x, &ev, 1, &op);
      assert_int_equal(op.rc, CPH_OK);
      parts[k] = op.u.ingest.results[0].memory_part;
      lens[k] = op.u.ingest.results[0].memory_part_len;
      assert_non_null(parts[k]);
      op.u.ingest.results[0].memory_part = NULL;
      cph_op_clear_results(&op);
    }
    items[i / PER_ITEM].name = "c";
    assert_int_equal(cph_channel_memories_item((const uint8_t *const *)&parts[i], &lens[i],
                                               PER_ITEM, &items[i / PER_ITEM].data,
                                               &items[i / PER_ITEM].len),
                     CPH_OK);
  }
  size_t len = 0;
  uint8_t *blob = consume_all(x, NOTES, &len);

  uint32_t out[3];
  assert_int_equal(import(y, items, NOTES / PER_ITEM, out), CPH_OK);
  assert_int_equal(out[0], NOTES);
  cph_op st = {0};
  st.kind = CPH_OP_SESSION_STATE;
  st.u.state.session = "a";
  st.u.state.data = blob;
  st.u.state.len = len;
  assert_int_equal(cph_fixture_run(y, &st), CPH_OK);
  cph_op_clear_results(&st);
  static char was[16384], is[16384], other[16384];
  next_raw_memories(x, was, sizeof was);
  next_raw_memories(y, is, sizeof is);
  assert_non_null(strstr(was, "#news note ")); /* older than the history it shows */
  if (strcmp(is, was) != 0)
    fail_msg("the new node lists:\n%.1200s\nthe old one:\n%.1200s", is, was);
  int most = 0;
  size_t held = cph_fixture_scope_raw_memories(y, "#news", &most);
  if (held != NOTES + 1 || most != 1) /* and "what ships next?" */
    fail_msg("the new node holds %zu raw memories of the channel, a text up to %d times; want "
             "%d, once each", held, most, NOTES + 1);

  /* the state first: the turn lists other memories than the old node's */
  memset(&st, 0, sizeof st);
  st.kind = CPH_OP_SESSION_STATE;
  st.u.state.session = "a";
  st.u.state.data = blob;
  st.u.state.len = len;
  assert_int_equal(cph_fixture_run(z, &st), CPH_OK);
  cph_op_clear_results(&st);
  assert_int_equal(import(z, items, NOTES / PER_ITEM, out), CPH_OK);
  next_raw_memories(z, other, sizeof other);
  assert_string_not_equal(other, was);

  for (size_t i = 0; i < NOTES / PER_ITEM; i++)
    free(items[i].data);
  for (int i = 0; i < NOTES; i++)
    free(parts[i]);
  free(parts);
  free(lens);
  free(blob);
  cph_fixture_free(x);
  cph_fixture_free(y);
  cph_fixture_free(z);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_channel_memories_move_whole_and_once),
      cmocka_unit_test(test_channel_memories_only_what_was_minted),
      cmocka_unit_test(test_channel_memories_compacted_copies_stay_compacted),
      cmocka_unit_test(test_channel_memories_in_steps),
      cmocka_unit_test(test_copies_of_one_message_on_one_node_are_one_message),
      cmocka_unit_test(test_a_late_copy_is_still_one_message),
      cmocka_unit_test(test_late_copies_are_shown_in_the_order_they_were_said),
      cmocka_unit_test(test_late_triggers_are_staged_in_the_order_they_were_said),
      cmocka_unit_test(test_copies_of_a_repeat_count_it_once),
      cmocka_unit_test(test_a_memory_under_an_older_origin_is_held_by_its_text),
      cmocka_unit_test(test_channel_memories_before_the_state_keep_the_turns_memories),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
