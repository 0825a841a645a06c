/* The memory scope index with rows of several entries (core/memory.h, schema 4): an ingest
 * request writes one row per scope and class for the memories it mints. Every reader goes
 * through memory_scope_cursor, which must give each entry once, in id order, either way, with
 * its source event — across rows of one entry (single mints, schema 3's rows) and of many. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/log.h"
#include "core/memory.h"
#include "store/store.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

static const char *POLICY = "{:sessions {:janitor? false}\n"
                            " :dedupe {:min-length 1000000}\n"
                            " :store {:sync :none}}\n";

#define MAX_IDS 64

/* One request of n events on "general"; event `special` (if < n) says "kumquat". Their ids
 * are appended to ids. */
static void post(cph_fixture *f, int first, int n, int special, uint64_t *ids, size_t *n_ids) {
  char body[16][64];
  cph_event_in ev[16];
  for (int i = 0; i < n; i++) {
    snprintf(body[i], sizeof body[i], "%s status line %d", i == special ? "kumquat" : "plain",
             first + i);
    ev[i] = (cph_event_in){.channel = "general", .sender = "carol", .body = body[i]};
  }
  cph_op op = {0};
  cph_fixture_ingest(f, ev, (size_t)n, &op);
  for (int i = 0; i < n; i++) {
    assert_int_equal(op.u.ingest.results[i].status, CPH_EV_QUEUED);
    ids[(*n_ids)++] = op.u.ingest.results[i].id;
  }
  cph_op_clear_results(&op);
}

/* Walks the raw index of "#general" in dir newest first (or oldest first), checking each
 * entry's memory: stored, raw, its source the event the walk says. Returns the sources. */
static size_t walk(const char *dir, bool newest_first, uint64_t *sources) {
  cph_store_options o = {dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st;
  cph_err err = {0};
  if (cph_store_open(&o, &st, &err))
    fail_msg("store %s: %s", dir, err.msg);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, false, &t), CPH_OK);
  memory_scope_cursor c;
  assert_int_equal(memory_scope_open(&t, "#general", true, &c), CPH_OK);
  int rc = newest_first ? memory_scope_newest(&c) : memory_scope_oldest(&c);
  size_t n = 0;
  uint64_t last = 0;
  for (; rc == CPH_OK && c.id;
       rc = newest_first ? memory_scope_older(&c) : memory_scope_newer(&c)) {
    assert_true(n < MAX_IDS);
    if (n)
      assert_true(newest_first ? c.id < last : c.id > last);
    last = c.id;
    cph_key mk = cph_key_of_u64(c.id);
    cph_memory_rec m;
    assert_int_equal(cph_txn_get_record(&t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m), CPH_OK);
    assert_int_equal(m.kind, CPH_MEMORY_RAW);
    assert_true(m.source_event_id == c.source);
    cph_record_free(&cph_memory_desc, &m);
    sources[n++] = c.source;
  }
  assert_int_equal(rc, CPH_OK);
  memory_scope_close(&c);
  /* rows of several entries are there: fewer rows than entries */
  size_t rows = 0;
  cph_cursor cur;
  cph_val k;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_MEMORY_SCOPES, &cur), CPH_OK);
  for (int r = cph_cursor_seek(&cur, NULL, &k, NULL); r == CPH_OK;
       r = cph_cursor_next(&cur, &k, NULL))
    rows++;
  cph_cursor_close(&cur);
  assert_true(rows < n);
  cph_txn_abort(&t);
  cph_store_close(st);
  return n;
}

static void test_every_entry_of_request_rows_is_read_once_in_id_order(void **state) {
  (void)state;
  cph_fixture *f = cph_fixture_new("memory-index", POLICY);
  const char *general[1] = {"general"};
  cph_fixture_create_session(f, "s1", CPH_LANE_INTERACTIVE, general, 1);
  uint64_t ids[MAX_IDS];
  size_t n_ids = 0;
  post(f, 0, 12, -1, ids, &n_ids); /* a row of 12 */
  post(f, 12, 1, -1, ids, &n_ids); /* a row of one (as every row of schema 3) */
  post(f, 13, 5, 2, ids, &n_ids);  /* a row of 5, "kumquat" inside it */

  /* the search's lexical walk reads the index newest first: it finds what is inside a row */
  cph_op op;
  cph_fixture_search(f, "s1", "kumquat", 10, &op);
  bool found = false;
  for (size_t i = 0; i < op.u.search.n_hits; i++)
    found |= strstr(op.u.search.hits[i].text, "kumquat status line 15") != NULL;
  assert_true(found);
  cph_op_clear_results(&op);
  cph_engine_close(f->e);
  f->e = NULL;

  uint64_t newest[MAX_IDS], oldest[MAX_IDS];
  assert_int_equal(walk(f->dir, true, newest), n_ids);
  assert_int_equal(walk(f->dir, false, oldest), n_ids);
  for (size_t i = 0; i < n_ids; i++) {
    assert_true(oldest[i] == ids[i]); /* each memory's source: its event, in order */
    assert_true(newest[i] == ids[n_ids - 1 - i]);
  }
  cph_fixture_open(f);
  cph_fixture_free(f);
}

int main(void) {
  cph_log_set_level(CPH_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_entry_of_request_rows_is_read_once_in_id_order),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
