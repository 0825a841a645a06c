/* Durability under :store :sync :always (DESIGN §4, issue 17 item 3), through the engine's
 * public API on a temp LMDB: which passes flush, that a pass acknowledging a durable write is
 * answered only once its commit is on disk while a lease needs no flush of its own, that the
 * next commit's flush carries an earlier pass, and that a failed flush fails what waits on it.
 *
 * The store's own flushes (of the write-ahead log on the flush thread or inline, and of the
 * data file at a checkpoint: store/wal.c) call fdatasync, which this test wraps
 * (-Wl,--wrap=fdatasync, CMakeLists.txt) to hold a flush at a gate, make it fail, or count
 * the log's. Under :always LMDB itself flushes nothing (MDB_NOSYNC). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cephalon/cephalon.h"
#include "tests/support/engine_fixture.h"

static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :sessions {:janitor? false}\n"
                            " :store {:sync :always}}\n";

/* ---------------------------------------------------------------- the wrapped fdatasync */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static bool g_gate_closed;  /* flushes wait while set */
static int g_at_gate;       /* flushes waiting at the gate */
static int g_fail_errno;    /* non-zero: flushes fail with it */
static int g_hooks;         /* times the engine's flushed hook ran */
static int g_log_flushes;   /* fdatasync calls on a log file (wal.N) */

static bool is_log_file(int fd) {
  char link[64], path[4200];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0)
    return false;
  path[n] = '\0';
  const char *slash = strrchr(path, '/');
  return slash && strncmp(slash, "/wal.", 5) == 0;
}

int __real_fdatasync(int fd);
int __wrap_fdatasync(int fd);
int __wrap_fdatasync(int fd) {
  bool log = is_log_file(fd);
  pthread_mutex_lock(&g_mu);
  g_log_flushes += log;
  g_at_gate++;
  pthread_cond_broadcast(&g_cv);
  while (g_gate_closed)
    pthread_cond_wait(&g_cv, &g_mu);
  g_at_gate--;
  int e = g_fail_errno;
  pthread_mutex_unlock(&g_mu);
  if (e) {
    errno = e;
    return -1;
  }
  return __real_fdatasync(fd);
}

static void gate(bool closed) {
  pthread_mutex_lock(&g_mu);
  g_gate_closed = closed;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

/* The engine's flushed hook: on its flush thread. */
static void on_flushed(void *ctx) {
  (void)ctx;
  pthread_mutex_lock(&g_mu);
  g_hooks++;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
}

/* Waits (5 s at most) until *counter >= want. */
static void wait_for(int *counter, int want) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  pthread_mutex_lock(&g_mu);
  while (*counter < want && pthread_cond_timedwait(&g_cv, &g_mu, &until) == 0)
    ;
  int got = *counter;
  pthread_mutex_unlock(&g_mu);
  if (got < want)
    fail_msg("waited 5 s for %d, got %d", want, got);
}

static int hooks_now(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_hooks;
  pthread_mutex_unlock(&g_mu);
  return n;
}

/* ---------------------------------------------------------------- fixture and operations */

static int setup(void **state) {
  gate(false);
  g_fail_errno = 0;
  *state = cph_fixture_new("sync", POLICY);
  return 0;
}

static int teardown(void **state) {
  gate(false);
  cph_fixture_free(*state);
  g_fail_errno = 0;
  return 0;
}

static void use_flush_thread(cph_fixture *f) {
  cph_engine_hooks h = {NULL, NULL, on_flushed};
  cph_engine_set_hooks(f->e, &h);
}

static int log_flushes(void) {
  pthread_mutex_lock(&g_mu);
  int n = g_log_flushes;
  pthread_mutex_unlock(&g_mu);
  return n;
}

/* Answer log: which operations were answered, in order. */
static const cph_op *g_answered[16];
static int g_n_answered;

static void note_answer(cph_op *op, void *ctx) {
  (void)ctx;
  if (g_n_answered < 16)
    g_answered[g_n_answered] = op;
  g_n_answered++;
}

static void submit(cph_fixture *f, cph_op *op) {
  op->done = note_answer;
  op->ctx = NULL;
  assert_int_equal(cph_engine_submit(f->e, op), CPH_OK);
}

/* Submits op, runs a pass and, with the flush thread, waits for the flush that answers it. */
static int run_settled(cph_fixture *f, cph_op *op) {
  int before = g_n_answered;
  submit(f, op);
  cph_engine_run_pass(f->e);
  for (int i = 0; i < 500 && g_n_answered == before; i++) {
    int h = hooks_now();
    cph_engine_flushed(f->e);
    if (g_n_answered == before)
      wait_for(&g_hooks, h + 1);
  }
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, before + 1);
  return op->rc;
}

static cph_op create_op(const char *id) {
  static char *subs[1] = {"general"};
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  op.u.session.in.subscribe.items = subs;
  op.u.session.in.subscribe.count = 1;
  return op;
}

/* An ingest op of one event to "general"; ev must outlive the op. */
static cph_op post_op(cph_event_in *ev, const char *body) {
  memset(ev, 0, sizeof *ev);
  ev->channel = "general";
  ev->sender = "user";
  ev->body = (char *)body;
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = ev;
  op.u.ingest.n_events = 1;
  return op;
}

static cph_op lease_op(cph_fixture *f) {
  cph_op op = {0};
  op.kind = CPH_OP_LEASE;
  op.u.lease.worker = "w1";
  op.u.lease.deadline_ns = cph_clock_now(&f->clock) + 10 * CPH_NS_PER_S;
  return op;
}

static cph_op complete_op(const cph_turn_info *t, const char *reply) {
  cph_op op = {0};
  op.kind = CPH_OP_COMPLETE;
  op.u.turn.turn_id = t->id;
  snprintf(op.u.turn.lease, sizeof op.u.turn.lease, "%s", t->lease);
  op.u.turn.reply_body = (char *)reply;
  return op;
}

static void replies_free(cph_reply_info *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    cph_reply_info_free(&r[i]);
  free(r);
}

/* ---------------------------------------------------------------- tests */

/* Without the flush thread every pass answers before cph_engine_run_pass returns, as before;
 * what changed is the cost: a durable pass flushes the log once (its record), a pass that
 * only serves a lease flushes nothing (store/wal.c: LMDB commits with MDB_NOSYNC). A
 * checkpoint may flush the data file meanwhile, so the log's flushes are counted. */
static void test_a_durable_pass_flushes_the_log_once_and_a_lease_pass_not_at_all(void **state) {
  cph_fixture *f = *state;
  cph_op c = create_op("s1");
  assert_int_equal(cph_fixture_run(f, &c), CPH_OK);
  cph_op_clear_results(&c);

  cph_event_in ev;
  int before = log_flushes();
  cph_op p = post_op(&ev, "hello");
  assert_int_equal(cph_fixture_run(f, &p), CPH_OK);
  cph_op_clear_results(&p);
  assert_int_equal(log_flushes() - before, 1);

  before = log_flushes();
  cph_op l = lease_op(f);
  assert_int_equal(cph_fixture_run(f, &l), CPH_OK);
  assert_int_equal(log_flushes() - before, 0);

  before = log_flushes();
  cph_op done = complete_op(&l.u.lease.turn, "hi");
  assert_int_equal(cph_fixture_run(f, &done), CPH_OK);
  assert_int_equal(log_flushes() - before, 1);
  cph_op_clear_results(&l);

  /* the reply is acknowledged, so it shows */
  cph_reply_info *r;
  size_t n;
  uint64_t next;
  cph_err err;
  assert_int_equal(cph_engine_replies(f->e, 0, 10, &r, &n, &next, &err), CPH_OK);
  assert_int_equal(n, 1);
  assert_string_equal(r[0].body, "hi");
  replies_free(r, n);
}

/* With the flush thread (the daemon): an ingest is answered only after the flush that
 * covers its commit finished; a lease with no durable pass before it is answered at once,
 * whatever the disk is doing; a completion waits for its flush like the ingest. */
static void test_a_durable_pass_waits_for_its_flush_and_a_lease_for_none(void **state) {
  cph_fixture *f = *state;
  use_flush_thread(f);
  cph_op c = create_op("s1");
  assert_int_equal(run_settled(f, &c), CPH_OK);
  cph_op_clear_results(&c);

  gate(true);
  cph_event_in ev;
  cph_op p = post_op(&ev, "hello");
  int answered = g_n_answered;
  submit(f, &p);
  cph_engine_run_pass(f->e);
  wait_for(&g_at_gate, 1); /* the flush thread is in fdatasync, held */
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, answered); /* committed, not on disk: no answer */
  assert_true(cph_engine_answers_held(f->e));
  int h = hooks_now();
  gate(false);
  wait_for(&g_hooks, h + 1);
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, answered + 1);
  assert_int_equal(p.rc, CPH_OK);
  assert_int_equal(p.u.ingest.results[0].status, CPH_EV_QUEUED);
  assert_false(cph_engine_answers_held(f->e));
  cph_op_clear_results(&p);

  gate(true); /* the lease: no flush of its own, and none before it pending */
  cph_op l = lease_op(f);
  submit(f, &l);
  cph_engine_run_pass(f->e);
  assert_int_equal(g_n_answered, answered + 2);
  assert_int_equal(l.rc, CPH_OK);
  assert_string_equal(l.u.lease.turn.input, "inbox:hello");

  cph_op done = complete_op(&l.u.lease.turn, "hi");
  submit(f, &done);
  cph_engine_run_pass(f->e);
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, answered + 2);
  /* and the reply does not show before the completion is acknowledged */
  cph_reply_info *r;
  size_t n;
  uint64_t next;
  cph_err err;
  assert_int_equal(cph_engine_replies(f->e, 0, 10, &r, &n, &next, &err), CPH_OK);
  assert_int_equal(n, 0);
  replies_free(r, n);
  assert_int_equal(cph_engine_last_reply_id(f->e), 0);
  h = hooks_now();
  gate(false);
  wait_for(&g_hooks, h + 1);
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, answered + 3);
  assert_int_equal(done.rc, CPH_OK);
  assert_int_equal(cph_engine_replies(f->e, 0, 10, &r, &n, &next, &err), CPH_OK);
  assert_int_equal(n, 1);
  replies_free(r, n);
  cph_op_clear_results(&l);
  cph_op_clear_results(&done);
}

/* Answers keep pass order: while the flush of an ingest is held, the next pass (a lease)
 * commits but is not answered — its turn carries what the ingest staged — and the ingest's
 * flush answers both, the ingest first. (A commit flushes nothing itself under the log, so
 * the lease's commit no longer carries the ingest to disk as LMDB's in-commit flush did.) */
static void test_a_lease_waits_for_the_durable_pass_before_it_and_answers_keep_their_order(
    void **state) {
  cph_fixture *f = *state;
  use_flush_thread(f);
  cph_op c = create_op("s1");
  assert_int_equal(run_settled(f, &c), CPH_OK);
  cph_op_clear_results(&c);
  cph_event_in ev1, ev2;
  cph_op p1 = post_op(&ev1, "first");
  assert_int_equal(run_settled(f, &p1), CPH_OK);
  cph_op_clear_results(&p1);

  gate(true);
  cph_op p2 = post_op(&ev2, "second");
  int answered = g_n_answered;
  submit(f, &p2);
  cph_engine_run_pass(f->e);
  wait_for(&g_at_gate, 1); /* the flush thread is in fdatasync, held */
  assert_int_equal(g_n_answered, answered);
  cph_op l = lease_op(f);
  submit(f, &l);
  cph_engine_run_pass(f->e);
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, answered);
  int h = hooks_now();
  gate(false);
  wait_for(&g_hooks, h + 1);
  cph_engine_flushed(f->e);
  assert_int_equal(g_n_answered, answered + 2);
  assert_ptr_equal(g_answered[answered], &p2);
  assert_ptr_equal(g_answered[answered + 1], &l);
  assert_int_equal(p2.rc, CPH_OK);
  assert_int_equal(l.rc, CPH_OK);
  /* The turn carries "second", staged by the ingest's pass: that is why the lease may not
   * be answered before the ingest's commit is on disk. */
  assert_string_equal(l.u.lease.turn.input, "inbox:first\nsecond");
  cph_op_clear_results(&p2);
  cph_op_clear_results(&l);
}

/* A flush that fails: the ingest waiting on it is answered with the error (not as stored),
 * and so is every later pass that needs a flush — until a restart. */
static void test_a_failed_flush_fails_what_waits_on_it_and_stays_failed(void **state) {
  cph_fixture *f = *state;
  use_flush_thread(f);
  cph_op c = create_op("s1");
  assert_int_equal(run_settled(f, &c), CPH_OK);
  cph_op_clear_results(&c);

  g_fail_errno = EIO;
  cph_event_in ev;
  cph_op p = post_op(&ev, "lost?");
  int rc = run_settled(f, &p);
  assert_int_not_equal(rc, CPH_OK);
  assert_non_null(strstr(p.err.msg, "flushing to disk failed"));
  cph_op_clear_results(&p);

  g_fail_errno = 0; /* the disk is back: too late, nothing can vouch for the lost pages */
  cph_op p2 = post_op(&ev, "later");
  assert_int_not_equal(run_settled(f, &p2), CPH_OK);
  assert_non_null(strstr(p2.err.msg, "until cephalond restarts"));
  cph_op_clear_results(&p2);

  /* a restart starts afresh: what the store holds is served, and writes are acknowledged */
  cph_engine_close(f->e);
  f->e = NULL;
  cph_fixture_open(f);
  use_flush_thread(f);
  cph_op p3 = post_op(&ev, "after the restart");
  assert_int_equal(run_settled(f, &p3), CPH_OK);
  cph_op_clear_results(&p3);
}

/* Stopping the flush thread (the daemon's shutdown) answers what still waits. */
static void test_dropping_the_flush_hook_answers_what_waits(void **state) {
  cph_fixture *f = *state;
  use_flush_thread(f);
  cph_op c = create_op("s1");
  assert_int_equal(run_settled(f, &c), CPH_OK);
  cph_op_clear_results(&c);
  gate(true);
  cph_event_in ev;
  cph_op p = post_op(&ev, "hello");
  int answered = g_n_answered;
  submit(f, &p);
  cph_engine_run_pass(f->e);
  assert_int_equal(g_n_answered, answered);
  gate(false);
  cph_engine_hooks none = {0};
  cph_engine_set_hooks(f->e, &none);
  assert_int_equal(g_n_answered, answered + 1);
  assert_int_equal(p.rc, CPH_OK);
  assert_false(cph_engine_answers_held(f->e));
  cph_op_clear_results(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_a_durable_pass_flushes_the_log_once_and_a_lease_pass_not_at_all, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_durable_pass_waits_for_its_flush_and_a_lease_for_none,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_a_lease_waits_for_the_durable_pass_before_it_and_answers_keep_their_order, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_a_failed_flush_fails_what_waits_on_it_and_stays_failed,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_dropping_the_flush_hook_answers_what_waits, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
