#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine_fixture.h"
#include "providers/providers.h"
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
