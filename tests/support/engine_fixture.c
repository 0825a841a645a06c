#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine_fixture.h"
#include "cephalon/providers.h"
#include "store/store.h"
#include "testutil.h"

cph_fixture *cph_fixture_new(const char *tag, const char *policy_edn) {
  cph_fixture *f = calloc(1, sizeof *f);
  if (!f || !(f->policy = strdup(policy_edn)))
    fail_msg("fixture: out of memory");
  f->dir = cph_test_tmpdir(tag);
  cph_clock_init_virtual(&f->clock, 1000 * CPH_NS_PER_S);
  cph_fixture_open(f);
  return f;
}

void cph_fixture_open(cph_fixture *f) {
  cph_policy *p = NULL;
  cph_err err = {0};
  if (cph_policy_load_text("fixture.edn", f->policy, strlen(f->policy), &p, &err))
    fail_msg("policy: %s", err.msg);
  cph_engine_options o = {f->dir, &f->clock, cph_providers_network()};
  if (cph_engine_open(p, &o, &f->e, &err))
    fail_msg("open: %s", err.msg);
}

void cph_fixture_free(cph_fixture *f) {
  if (!f)
    return;
  cph_engine_close(f->e);
  cph_test_rmtree(f->dir);
  free(f->dir);
  free(f->policy);
  free(f);
}

void cph_fixture_count_done(cph_op *op, void *ctx) {
  (void)op;
  (*(int *)ctx)++;
}

int cph_fixture_run(cph_fixture *f, cph_op *op) {
  int called = 0;
  op->done = cph_fixture_count_done;
  op->ctx = &called;
  assert_int_equal(cph_engine_submit(f->e, op), CPH_OK);
  cph_engine_run_pass(f->e);
  assert_int_equal(called, 1);
  return op->rc;
}

size_t cph_fixture_store_each(const char *dir, int db,
                              bool (*fn)(void *ctx, const void *key, size_t key_len,
                                         const void *val, size_t val_len),
                              void *ctx) {
  cph_store_options o = {dir, (size_t)64 << 20, CPH_SYNC_NONE};
  cph_store *st;
  cph_err err;
  if (cph_store_open(&o, &st, &err))
    fail_msg("store %s: %s", dir, err.msg);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, false, &t), CPH_OK);
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, (cph_db)db, &c), CPH_OK);
  size_t n = 0;
  cph_val k, v;
  for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v))
    n += fn(ctx, k.data, k.len, v.data, v.len);
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  cph_store_close(st);
  return n;
}
