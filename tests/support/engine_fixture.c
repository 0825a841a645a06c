#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_fixture.h"
#include "cephalon/policy.h"
#include "cephalon/providers.h"
#include "store/records.h"
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

void cph_fixture_policy_for_run(cph_policy *p) {
  const char *span = getenv("CPH_TEST_SPAN_MS");
  if (span && *span)
    p->store.span_ms = strtoll(span, NULL, 10);
}

void cph_fixture_open(cph_fixture *f) {
  cph_policy *p = NULL;
  cph_err err = {0};
  if (cph_policy_load_text("fixture.edn", f->policy, strlen(f->policy), &p, &err))
    fail_msg("policy: %s", err.msg);
  cph_fixture_policy_for_run(p);
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

void cph_fixture_create_session(cph_fixture *f, const char *id, cph_lane lane,
                                const char *const *subscribe, size_t n) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = lane;
  op.u.session.in.subscribe.items = (char **)subscribe;
  op.u.session.in.subscribe.count = n;
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

void cph_fixture_ingest(cph_fixture *f, cph_event_in *events, size_t n, cph_op *op) {
  *op = (cph_op){0};
  op->kind = CPH_OP_INGEST;
  op->u.ingest.events = events;
  op->u.ingest.n_events = n;
  if (cph_fixture_run(f, op))
    fail_msg("ingest: %s", op->err.msg);
}

void cph_fixture_ingest_results(cph_fixture *f, cph_event_in *events, size_t n,
                                cph_ingest_status *st, uint64_t *ids) {
  cph_op op;
  cph_fixture_ingest(f, events, n, &op);
  for (size_t i = 0; i < n; i++) {
    st[i] = op.u.ingest.results[i].status;
    ids[i] = op.u.ingest.results[i].id;
  }
  cph_op_clear_results(&op);
}

void cph_fixture_lease(cph_fixture *f, const char *worker, cph_op *op) {
  *op = (cph_op){0};
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = (char *)worker; /* read only */
  op->u.lease.deadline_ns = cph_clock_now(&f->clock) + 5 * CPH_NS_PER_S;
  if (cph_fixture_run(f, op))
    fail_msg("lease: %s", op->err.msg);
}

int cph_fixture_run_steps(cph_fixture *f, cph_op *op, int *passes) {
  int called = 0, n = 0;
  op->done = cph_fixture_count_done;
  op->ctx = &called;
  assert_int_equal(cph_engine_submit(f->e, op), CPH_OK);
  while (!called && n < 100000) {
    cph_engine_run_pass(f->e);
    n++;
  }
  assert_int_equal(called, 1);
  if (passes)
    *passes = n;
  return op->rc;
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

/* The map a test opens a store with: room for any test's data. */
#define TEST_STORE_MAP ((size_t)256 << 20)

cph_store *cph_fixture_store_open(const char *dir) {
  cph_store_options o = {dir, TEST_STORE_MAP, CPH_SYNC_NONE};
  cph_store *st = NULL;
  cph_err err = {0};
  if (cph_store_open(&o, &st, &err))
    fail_msg("store %s: %s", dir, err.msg);
  return st;
}

void cph_fixture_copy_store(const cph_fixture *from, const cph_fixture *to) {
  char a[4200], b[4200];
  snprintf(a, sizeof a, "%s/data.mdb", from->dir);
  snprintf(b, sizeof b, "%s/data.mdb", to->dir);
  cph_test_copy_file(a, b);
}

void cph_fixture_expect_schema(const char *dir, int version) {
  cph_store_options o = {dir, TEST_STORE_MAP, CPH_SYNC_NONE};
  cph_store *st = NULL;
  cph_err err = {0};
  char want[64];
  snprintf(want, sizeof want, "has storage schema version %d", version);
  assert_int_equal(cph_store_open(&o, &st, &err), CPH_ESCHEMA);
  if (!strstr(err.msg, want))
    fail_msg("opening %s: \"%s\", want it to say \"%s\"", dir, err.msg, want);
}

size_t cph_fixture_store_each(const char *dir, int db,
                              bool (*fn)(void *ctx, const void *key, size_t key_len,
                                         const void *val, size_t val_len),
                              void *ctx) {
  cph_store *st = cph_fixture_store_open(dir);
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

/* The distinct texts of a scope's live raw memories, with how many memories have each. */
typedef struct scope_texts {
  const char *scope;
  char **v;
  int *copies;
  size_t n, cap, total;
} scope_texts;

static bool note_scope_text(void *ctx, const void *key, size_t key_len, const void *val,
                            size_t val_len) {
  (void)key;
  (void)key_len;
  scope_texts *l = ctx;
  cph_memory_rec m;
  cph_err err;
  if (cph_record_decode(&cph_memory_desc, val, val_len, &m, &err))
    fail_msg("a memory record does not decode: %s", err.msg);
  if (!m.deleted && m.kind == CPH_MEMORY_RAW && strcmp(m.session, l->scope) == 0) {
    size_t i = 0;
    while (i < l->n && strcmp(l->v[i], m.text) != 0)
      i++;
    if (i == l->n) {
      if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        l->copies = realloc(l->copies, l->cap * sizeof *l->copies);
        assert_true(l->v && l->copies);
      }
      assert_non_null(l->v[l->n] = strdup(m.text));
      l->copies[l->n++] = 0;
    }
    l->copies[i]++;
    l->total++;
  }
  cph_record_free(&cph_memory_desc, &m);
  return true;
}

size_t cph_fixture_scope_raw_memories(cph_fixture *f, const char *scope, int *most) {
  scope_texts l = {.scope = scope};
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_store_each(f->dir, CPH_DB_MEMORIES, note_scope_text, &l);
  cph_fixture_open(f);
  *most = 0;
  for (size_t i = 0; i < l.n; i++) {
    if (l.copies[i] > *most)
      *most = l.copies[i];
    free(l.v[i]);
  }
  free(l.v);
  free(l.copies);
  return l.total;
}

void cph_fixture_search(cph_fixture *f, const char *session, const char *query, size_t k,
                        cph_op *op) {
  *op = (cph_op){0};
  op->kind = CPH_OP_MEMORY_SEARCH;
  op->u.search.session = (char *)session; /* read only */
  op->u.search.query = (char *)query;
  op->u.search.k = k;
  if (cph_fixture_run(f, op) != CPH_OK)
    fail_msg("searching %s for '%s': %s", session, query, op->err.msg);
}

void cph_fixture_search_lines(cph_fixture *f, const char *session, const char *query, char *out,
                              size_t cap) {
  cph_op op;
  cph_fixture_search(f, session, query, 50, &op);
  size_t len = 0;
  out[0] = '\0';
  for (size_t i = 0; i < op.u.search.n_hits; i++) {
    len += (size_t)snprintf(out + len, cap - len, "%llu %s %s\n",
                            (unsigned long long)op.u.search.hits[i].id, op.u.search.hits[i].kind,
                            op.u.search.hits[i].text);
    assert_true(len < cap);
  }
  cph_op_clear_results(&op);
}

uint64_t cph_test_event_family(cph_engine *e, uint64_t id) {
  cph_event_info ev;
  cph_err err;
  if (cph_engine_get_event(e, id, &ev, &err))
    fail_msg("event %llu: %s", (unsigned long long)id, err.msg);
  uint64_t fam = ev.family;
  cph_event_info_free(&ev);
  return fam;
}

void cph_fixture_items_take(cph_fixture_items *l, cph_state_items *from) {
  cph_state_item *v = realloc(l->v, (l->n + from->n + 1) * sizeof *v);
  assert_non_null(v);
  l->v = v;
  for (size_t i = 0; i < from->n; i++)
    l->v[l->n++] = from->v[i];
  free(from->v);
  *from = (cph_state_items){0};
}

void cph_fixture_items_free(cph_fixture_items *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    free(l->v[i].data);
  }
  free(l->v);
  *l = (cph_fixture_items){0};
}

void cph_fixture_items_last_per_name(cph_fixture_items *l) {
  size_t n = 0;
  for (size_t i = 0; i < l->n; i++) {
    bool later = false;
    for (size_t k = i + 1; k < l->n && !later; k++)
      later = strcmp(l->v[k].name, l->v[i].name) == 0;
    if (later) {
      free(l->v[i].name);
      free(l->v[i].data);
    } else {
      l->v[n++] = l->v[i];
    }
  }
  l->n = n;
}

int cph_fixture_run_maintenance(cph_fixture *f, void (*on_done)(cph_op *done, void *ctx),
                                void *ctx) {
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
      fail_msg("completing a maintenance turn: %s", done.err.msg);
    if (on_done)
      on_done(&done, ctx);
    cph_op_clear_results(&done);
    cph_op_clear_results(&lease);
  }
  return ran;
}

void cph_fixture_seal(cph_fixture *f, const char *session, const char *trigger, cph_op *op) {
  *op = (cph_op){0};
  op->kind = CPH_OP_CONTEXT_SEAL;
  op->u.context.session = (char *)session; /* read only */
  op->u.context.trigger = (char *)trigger;
  if (cph_fixture_run(f, op) != CPH_OK)
    fail_msg("seal %s of %s: %s", trigger, session, op->err.msg);
  assert_true(op->u.context.seal_id > 0);
}
