/* The queue cap's folded entries in the store (core/inbox.h, schema 4): an entry folded away
 * keeps its inbox record as written and the session's folded map tells it from a live one;
 * the events one request folds into an overflow entry are one member row.
 *
 * - A restart serves the inboxes as they were: the folded entries stay folded (counted in the
 *   overflow entry, never staged again), the live ones come back, a lease in flight included.
 * - Schema 3 -> 4 at open: a data directory written in the previous layout — every folded
 *   entry's record rewritten with status `folded`, no folded maps, one member row per folded
 *   event, one scope-index row per memory — is refused by a plain
 *   store open, opens through the engine, and serves the same turns as the directory it was
 *   made from: the same entries with the same counts and event ids, every routed event once.
 *
 * Parking and requeue (which must rewrite the map) are covered, with restarts, by
 * test_accounting_property. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "common/log.h"
#include "core/inbox.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

static const char *POLICY = "{:sessions {:janitor? false :max-queue 4 :max-batch 3}\n"
                            " :dedupe {:min-length 1000000}\n"
                            " :store {:sync :none}}\n";

#define MAX_EVENTS 256
#define N_SESSIONS 2
static const char *const SESSIONS[N_SESSIONS] = {"ann", "bob"};

/* Which events were routed to each session (by the engine's answers). */
typedef struct routed {
  uint8_t to[N_SESSIONS][MAX_EVENTS];
  uint64_t max_event;
} routed;

static int session_index(const char *id) {
  for (int i = 0; i < N_SESSIONS; i++)
    if (!strcmp(SESSIONS[i], id))
      return i;
  fail_msg("unknown session %s", id);
  return -1;
}

/* One request of n events on chan (numbered from i), the first mentioning `mention`. */
static void post_n(cph_fixture *f, routed *r, const char *chan, const char *mention, int i,
                   size_t n) {
  char body[8][64];
  char *mentions[1] = {(char *)mention};
  cph_event_in ev[8];
  assert_true(n <= 8);
  for (size_t e = 0; e < n; e++) {
    snprintf(body[e], sizeof body[e], "message %d on %s", i + (int)e, chan);
    ev[e] = (cph_event_in){.channel = (char *)chan, .sender = "carol", .body = body[e]};
  }
  if (mention)
    ev[0].mentions = (cph_strv){mentions, 1};
  cph_op op = {0};
  cph_fixture_ingest(f, ev, n, &op);
  for (size_t e = 0; e < n; e++) {
    const cph_event_result *res = &op.u.ingest.results[e];
    assert_int_equal(res->status, CPH_EV_QUEUED);
    assert_true(res->id < MAX_EVENTS);
    for (size_t j = 0; j < res->sessions.count; j++)
      r->to[session_index(res->sessions.items[j])][res->id] = 1;
    if (res->id > r->max_event)
      r->max_event = res->id;
  }
  cph_op_clear_results(&op);
  cph_engine_run_pass(f->e); /* staged from the next pass */
}

static void post(cph_fixture *f, routed *r, const char *chan, const char *mention, int i) {
  post_n(f, r, chan, mention, i, 1);
}

/* Both sessions overflow (a queue of 4), one with a mention among its entries and a lease in
 * flight while more arrive; the engine is left open. */
static void script(cph_fixture *f, routed *r) {
  const char *general[1] = {"general"}, *both[2] = {"general", "ops"};
  cph_fixture_create_session(f, "ann", CPH_LANE_INTERACTIVE, general, 1);
  cph_fixture_create_session(f, "bob", CPH_LANE_INTERACTIVE, both, 2);
  int i = 0;
  for (; i < 7; i++)
    post(f, r, "general", NULL, i);
  cph_op lease;
  cph_fixture_lease(f, "w", &lease); /* in flight while the queue cap folds around it */
  cph_op_clear_results(&lease);
  for (; i < 14; i++)
    post(f, r, i % 2 ? "general" : "ops", i == 9 ? "ann" : NULL, i);
  post_n(f, r, "general", NULL, i, 6); /* one request folds several: one member row */
}

/* Leases and completes until nothing is runnable (a lease in flight at a restart expired and
 * came back); appends each turn's entries to out as text, one line each, and counts the
 * events each session's turns carried. */
static void drain(cph_fixture *f, uint32_t carried[N_SESSIONS][MAX_EVENTS], char *out,
                  size_t cap) {
  size_t len = strlen(out);
  for (int turns = 0; turns < 1000; turns++) {
    cph_op op = {0};
    op.kind = CPH_OP_LEASE;
    op.u.lease.worker = "w";
    op.u.lease.deadline_ns = cph_clock_now(&f->clock);
    if (cph_fixture_run(f, &op) != CPH_OK) {
      cph_op_clear_results(&op);
      return;
    }
    const cph_turn_info *t = &op.u.lease.turn;
    int s = session_index(t->session);
    for (size_t i = 0; i < t->n_staged; i++) {
      const cph_staged_msg *m = &t->staged[i];
      assert_int_equal(m->count, m->n_event_ids);
      len += (size_t)snprintf(out + len, cap - len, "%s entry %llu %s count %u:", t->session,
                              (unsigned long long)m->id, m->fold, m->count);
      for (size_t j = 0; j < m->n_event_ids; j++) {
        assert_true(m->event_ids[j] < MAX_EVENTS);
        carried[s][m->event_ids[j]]++;
        len += (size_t)snprintf(out + len, cap - len, " %llu",
                                (unsigned long long)m->event_ids[j]);
      }
      len += (size_t)snprintf(out + len, cap - len, "\n");
      assert_true(len < cap);
    }
    cph_op c = {0};
    c.kind = CPH_OP_COMPLETE;
    c.u.turn.turn_id = t->id;
    snprintf(c.u.turn.lease, sizeof c.u.turn.lease, "%s", t->lease);
    assert_int_equal(cph_fixture_run(f, &c), CPH_OK);
    cph_op_clear_results(&c);
    cph_op_clear_results(&op);
  }
  fail_msg("drain: still runnable after 1000 turns");
}

/* Every routed event carried exactly once by the completed turns. */
static void each_once(const routed *r, uint32_t carried[N_SESSIONS][MAX_EVENTS]) {
  for (int s = 0; s < N_SESSIONS; s++)
    for (uint64_t id = 1; id <= r->max_event; id++)
      if (carried[s][id] != r->to[s][id])
        fail_msg("session %s, event %llu: routed %u, carried %u times", SESSIONS[s],
                 (unsigned long long)id, r->to[s][id], carried[s][id]);
}

static uint32_t queued(cph_fixture *f, const char *session) {
  cph_session_info info;
  cph_err err;
  assert_int_equal(cph_engine_get_session(f->e, session, &info, &err), CPH_OK);
  uint32_t n = info.pending + info.staged;
  cph_session_info_free(&info);
  return n;
}


/* ---------------------------------------------------------------- schema 3, as it was */

/* Splits every member row of session's entries that holds several events (schema 4: one row
 * per request's overflow fold) into one row per event, as schema 3 wrote them. Returns how
 * many rows were split. */
static size_t split_member_rows(cph_txn *t, const char *session) {
  cph_key prefix;
  cph_key_reset(&prefix);
  cph_key_str(&prefix, session);
  typedef struct row {
    cph_key key;
    uint64_t more[MAX_EVENTS];
    size_t n;
  } row;
  static row rows[16];
  size_t n_rows = 0;
  cph_cursor c;
  assert_int_equal(cph_cursor_open(t, CPH_DB_INBOX_FOLDS, &c), CPH_OK);
  cph_val k, v;
  for (int rc = cph_cursor_seek(&c, &prefix, &k, &v);
       rc == CPH_OK && k.len > prefix.len && !memcmp(k.data, prefix.data, prefix.len);
       rc = cph_cursor_next(&c, &k, &v)) {
    if (k.len != prefix.len + 16 || v.len == 0)
      continue; /* a fold record, the folded map, or a row of one event */
    assert_true(n_rows < 16 && v.len % 8 == 0 && v.len / 8 <= MAX_EVENTS);
    row *r = &rows[n_rows++];
    memcpy(r->key.data, k.data, k.len);
    r->key.len = k.len;
    r->key.overflow = false;
    r->n = v.len / 8;
    for (size_t i = 0; i < r->n; i++)
      r->more[i] = cph_be64_get((const uint8_t *)v.data + 8 * i);
  }
  cph_cursor_close(&c);
  for (size_t i = 0; i < n_rows; i++) {
    assert_int_equal(cph_txn_put(t, CPH_DB_INBOX_FOLDS, &rows[i].key, "", 0), CPH_OK);
    for (size_t j = 0; j < rows[i].n; j++) {
      cph_key mk = rows[i].key;
      mk.len -= 8;
      cph_key_u64(&mk, rows[i].more[j]);
      assert_int_equal(cph_txn_put(t, CPH_DB_INBOX_FOLDS, &mk, "", 0), CPH_OK);
    }
  }
  return n_rows;
}

/* Splits every row of the memory scope index that holds several entries (schema 4: one row
 * per request, scope and class) into one row per memory (key ... id -> be64 source), as
 * schema 3 wrote them. Returns how many rows were split. */
static size_t split_scope_rows(cph_txn *t) {
  typedef struct srow {
    cph_key key;
    uint8_t v[8 + 16 * 32];
    size_t len;
  } srow;
  static srow rows[32];
  size_t n = 0;
  cph_cursor c;
  assert_int_equal(cph_cursor_open(t, CPH_DB_MEMORY_SCOPES, &c), CPH_OK);
  cph_val k, v;
  for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    if (v.len <= 8)
      continue;
    assert_true(n < 32 && v.len <= sizeof rows[n].v && (v.len - 8) % 16 == 0);
    memcpy(rows[n].key.data, k.data, k.len);
    rows[n].key.len = k.len;
    rows[n].key.overflow = false;
    memcpy(rows[n].v, v.data, v.len);
    rows[n].len = v.len;
    n++;
  }
  cph_cursor_close(&c);
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &rows[i].key, rows[i].v, 8), CPH_OK);
    for (size_t e = 8; e < rows[i].len; e += 16) {
      cph_key mk = rows[i].key;
      mk.len -= 8;
      cph_key_u64(&mk, cph_be64_get(rows[i].v + e));
      assert_int_equal(cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &mk, rows[i].v + e + 8, 8), CPH_OK);
    }
  }
  return n;
}

/* Writes dir's inboxes back as schema 3 held them: every entry a folded map says was folded
 * away gets its record rewritten with status `folded` (what schema 3's ingest did), the maps
 * go, each member row holds one event, each scope-index row one memory, the schema version is
 * 3. Returns how many records were rewritten. */
static size_t write_schema3(const char *dir) {
  cph_store *st = cph_fixture_store_open(dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  size_t rewritten = 0;
  for (int s = 0; s < N_SESSIONS; s++) {
    inbox_folded fm;
    assert_int_equal(inbox_folded_get(&t, SESSIONS[s], &fm), CPH_OK);
    assert_true(fm.through > 0); /* the script folded both */
    inbox_folded kept = fm;      /* copied: the puts below may move the store's value */
    uint8_t *live = malloc(fm.n * 8 + 1);
    assert_non_null(live);
    memcpy(live, fm.live, fm.n * 8);
    kept.live = live;
    cph_key prefix;
    cph_key_reset(&prefix);
    cph_key_str(&prefix, SESSIONS[s]);
    cph_cursor c;
    assert_int_equal(cph_cursor_open(&t, CPH_DB_INBOX, &c), CPH_OK);
    cph_val k, v;
    uint64_t ids[MAX_EVENTS];
    size_t n = 0;
    for (int rc = cph_cursor_seek(&c, &prefix, &k, &v);
         rc == CPH_OK && k.len == prefix.len + 8 && !memcmp(k.data, prefix.data, prefix.len);
         rc = cph_cursor_next(&c, &k, &v)) {
      uint64_t id = cph_be64_get((const uint8_t *)k.data + prefix.len);
      if (inbox_folded_holds(&kept, id))
        ids[n++] = id;
    }
    cph_cursor_close(&c);
    for (size_t i = 0; i < n; i++) {
      cph_key ik = prefix;
      cph_key_u64(&ik, ids[i]);
      cph_inbox_rec r;
      assert_int_equal(cph_txn_get_record(&t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &r), CPH_OK);
      if (r.status != CPH_INBOX_STAGED && r.status != CPH_INBOX_PENDING) {
        cph_record_free(&cph_inbox_desc, &r);
        continue; /* consumed or parked: the map does not speak for it */
      }
      r.status = CPH_INBOX_FOLDED;
      assert_int_equal(cph_txn_put_record(&t, CPH_DB_INBOX, &ik, &cph_inbox_desc, &r), CPH_OK);
      cph_record_free(&cph_inbox_desc, &r);
      rewritten++;
    }
    free(live);
    cph_key mk = prefix;
    cph_key_u64(&mk, 0);
    assert_int_equal(cph_txn_del(&t, CPH_DB_INBOX_FOLDS, &mk), CPH_OK);
    assert_true(split_member_rows(&t, SESSIONS[s]) > 0); /* the request-long folds */
  }
  assert_true(split_scope_rows(&t) > 0); /* the request of 6 minted its memories in one row */
  cph_key vk;
  cph_key_reset(&vk);
  memcpy(vk.data, "schema_version", 14);
  vk.len = 14;
  uint8_t v3[4] = {0, 0, 0, 3};
  assert_int_equal(cph_txn_put(&t, CPH_DB_META, &vk, v3, sizeof v3), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  return rewritten;
}

/* ---------------------------------------------------------------- the tests */

static void test_folded_entries_stay_folded_across_a_restart(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("folded-restart", POLICY);
  routed r = {0};
  script(f, &r);
  uint32_t before[N_SESSIONS];
  for (int s = 0; s < N_SESSIONS; s++)
    before[s] = queued(f, SESSIONS[s]);
  cph_engine_close(f->e); /* the lease in flight expires: its entries come back staged */
  cph_fixture_open(f);
  for (int s = 0; s < N_SESSIONS; s++) /* queued counts what the lease held too */
    assert_true(queued(f, SESSIONS[s]) >= before[s] && queued(f, SESSIONS[s]) <= 4 + 3);
  static uint32_t carried[N_SESSIONS][MAX_EVENTS];
  memset(carried, 0, sizeof carried);
  static char turns[1 << 16];
  turns[0] = '\0';
  drain(f, carried, turns, sizeof turns);
  assert_non_null(strstr(turns, "overflow"));
  each_once(&r, carried);
  cph_fixture_free(f);
}

static void test_a_schema3_data_dir_opens_and_serves_the_same(void **state) {
  (void)state;
  cph_fixture *a = cph_fixture_new("folded-migrate-a", POLICY);
  routed r = {0};
  script(a, &r);
  cph_engine_close(a->e);
  a->e = NULL;

  /* B: a copy of A written back as schema 3 */
  cph_fixture *b = cph_fixture_new("folded-migrate-b", POLICY);
  cph_engine_close(b->e);
  b->e = NULL;
  cph_fixture_copy_store(a, b);
  size_t folded = write_schema3(b->dir);
  print_message("schema 3: %zu folded records\n", folded);
  assert_true(folded >= 14); /* 20 events, 4 queued and 1 overflow entry each: most folded */
  cph_fixture_expect_schema(b->dir, 3); /* only the engine migrates */

  b->clock = a->clock;
  cph_fixture_open(b); /* migrates */
  cph_engine_close(b->e);
  b->e = NULL;
  cph_store_close(cph_fixture_store_open(b->dir)); /* this build's schema now */

  cph_fixture_open(a);
  cph_fixture_open(b);
  for (int s = 0; s < N_SESSIONS; s++)
    assert_int_equal(queued(a, SESSIONS[s]), queued(b, SESSIONS[s]));
  static char found_a[1 << 14], found_b[1 << 14];
  cph_fixture_search_lines(a, "bob", "message", found_a, sizeof found_a);
  cph_fixture_search_lines(b, "bob", "message", found_b, sizeof found_b);
  assert_string_equal(found_a, found_b); /* the same memories, read through either index */
  assert_non_null(strstr(found_b, "message 17 on general"));
  static uint32_t carried_a[N_SESSIONS][MAX_EVENTS], carried_b[N_SESSIONS][MAX_EVENTS];
  memset(carried_a, 0, sizeof carried_a);
  memset(carried_b, 0, sizeof carried_b);
  static char turns_a[1 << 16], turns_b[1 << 16];
  turns_a[0] = turns_b[0] = '\0';
  drain(a, carried_a, turns_a, sizeof turns_a);
  drain(b, carried_b, turns_b, sizeof turns_b);
  assert_string_equal(turns_a, turns_b);
  assert_non_null(strstr(turns_b, "overflow"));
  each_once(&r, carried_a);
  each_once(&r, carried_b);
  cph_fixture_free(a);
  cph_fixture_free(b);
}

int main(void) {
  cph_log_set_level(CPH_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_folded_entries_stay_folded_across_a_restart),
      cmocka_unit_test(test_a_schema3_data_dir_opens_and_serves_the_same),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
