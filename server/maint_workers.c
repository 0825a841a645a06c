#define _GNU_SOURCE
/* cephalond's own maintenance workers (DESIGN §2: jobs are never given to external workers).
 *
 * Each worker is a lease loop on the event loop plus a thread:
 *   loop:   lease (internal: maintenance lane, job turns) -> hand the job's work to its thread
 *   thread: cph_job_execute() — the embedder, summariser or HTTP index call; it may block, which
 *           is why it runs here and not on the loop; no LMDB transaction is open meanwhile
 *   loop:   (woken through a pipe) complete the turn with the executed work -> lease again
 * The thread gets a private copy of the provider settings, so a policy reload never frees what
 * it is reading. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clusterflow.h"
#include "common/log.h"
#include "maint_workers.h"
#include "server.h"

#define LEASE_WAIT_S 60

typedef struct worker {
  struct cph_maint_pool *pool;
  int index;
  char name[32];
  pthread_t thread;
  cph_op lease_op;
  cph_op complete_op;
  bool leasing;    /* lease_op is with the engine */
  bool completing; /* complete_op is with the engine */
  /* handed to the thread (under pool->mu) */
  cph_job_work *work;
  cph_policy *policy; /* the thread's copy */
  bool executed;
  uint64_t turn_id;
  char lease[33];
} worker;

struct cph_maint_pool {
  cph_srv *srv;
  worker *workers;
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stopping;
  cph_wake wake; /* signalled by a thread when its job is executed */
};

static void lease_next(worker *w);

/* Only the settings cph_job_execute and cph_search_prepare read, deep-copied. */
cph_policy *cph_provider_snapshot(const cph_policy *p) {
  cph_policy *c = cph_policy_new_default();
  if (!c)
    return NULL;
  char **dst[] = {&c->providers.embeddings.url,
                  &c->providers.embeddings.model,
                  &c->providers.embeddings.api_key_env,
                  &c->providers.summarizer.url,
                  &c->providers.summarizer.model,
                  &c->providers.summarizer.api_key_env,
                  &c->vector_index.url};
  char *const src[] = {p->providers.embeddings.url,
                       p->providers.embeddings.model,
                       p->providers.embeddings.api_key_env,
                       p->providers.summarizer.url,
                       p->providers.summarizer.model,
                       p->providers.summarizer.api_key_env,
                       p->vector_index.url};
  for (size_t i = 0; i < sizeof dst / sizeof dst[0]; i++) {
    char *copy = strdup(src[i] ? src[i] : "");
    if (!copy) {
      cph_policy_free(c);
      return NULL;
    }
    free(*dst[i]);
    *dst[i] = copy;
  }
  c->providers.embeddings.kind = p->providers.embeddings.kind;
  c->providers.embeddings.dimensions = p->providers.embeddings.dimensions;
  c->providers.embeddings.timeout_ms = p->providers.embeddings.timeout_ms;
  c->providers.summarizer.kind = p->providers.summarizer.kind;
  c->providers.summarizer.timeout_ms = p->providers.summarizer.timeout_ms;
  c->providers.summarizer.max_tokens = p->providers.summarizer.max_tokens;
  c->vector_index.kind = p->vector_index.kind;
  c->vector_index.shards = p->vector_index.shards;
  c->vector_index.timeout_ms = p->vector_index.timeout_ms;
  return c;
}

/* ---------------------------------------------------------------- the thread */

static void *worker_main(void *arg) {
  worker *w = arg;
  struct cph_maint_pool *pool = w->pool;
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stopping && (!w->work || w->executed))
      pthread_cond_wait(&pool->cv, &pool->mu);
    if (pool->stopping)
      break;
    cph_job_work *work = w->work;
    cph_policy *policy = w->policy;
    pthread_mutex_unlock(&pool->mu);
    cph_job_execute(policy, work); /* may block on the network: the loop is not waiting */
    pthread_mutex_lock(&pool->mu);
    w->executed = true;
    cph_wake_signal(&pool->wake);
  }
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

/* ---------------------------------------------------------------- the loop side */

static void complete_done(cph_op *op, void *ctx) {
  worker *w = ctx;
  w->completing = false;
  if (op->rc && op->rc != CPH_ECONFLICT)
    cph_warn("maintenance worker %s: completing turn %llu: %s", w->name,
             (unsigned long long)w->turn_id, op->err.msg);
  /* cluster mode: what a gc_commit compacted in a session's own scope, for the log to keep
   * (clusterflow.h 13.) */
  const cph_session_items *ji = &op->u.turn.job_items;
  if (op->rc == CPH_OK && ji->session && ji->items.n && w->pool->srv->cflow)
    cph_cflow_items(w->pool->srv->cflow, ji->session, &ji->items);
  cph_op_clear_results(op);
  lease_next(w);
}

static void complete_turn(worker *w, cph_job_work *work) {
  cph_op *op = &w->complete_op;
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_COMPLETE;
  op->done = complete_done;
  op->ctx = w;
  op->u.turn.turn_id = w->turn_id;
  memcpy(op->u.turn.lease, w->lease, sizeof w->lease);
  op->u.turn.job = work; /* the engine frees it */
  w->completing = true;
  if (cph_engine_submit(w->pool->srv->engine, op) != CPH_OK) {
    w->completing = false;
    cph_job_work_free(work);
    cph_warn("maintenance worker %s: cannot complete turn %llu: %s", w->name,
             (unsigned long long)w->turn_id, op->err.msg);
    return;
  }
  cph_srv_schedule_pass(w->pool->srv);
}

static void lease_done(cph_op *op, void *ctx) {
  worker *w = ctx;
  struct cph_maint_pool *pool = w->pool;
  w->leasing = false;
  if (op->rc != CPH_OK) {
    cph_op_clear_results(op);
    lease_next(w); /* timed out: nothing to do for a while; ask again */
    return;
  }
  cph_turn_info *t = &op->u.lease.turn;
  w->turn_id = t->id;
  memcpy(w->lease, t->lease, sizeof w->lease);
  cph_job_work *work = t->job;
  t->job = NULL;
  cph_op_clear_results(op);
  if (!work) {
    /* a maintenance session's inbox or tick turn: nothing to execute; it is consumed */
    complete_turn(w, NULL);
    return;
  }
  cph_policy *snap = cph_provider_snapshot(cph_engine_policy(pool->srv->engine));
  pthread_mutex_lock(&pool->mu);
  cph_policy_free(w->policy);
  w->policy = snap;
  w->work = work;
  w->executed = false;
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
}

static void lease_next(worker *w) {
  struct cph_maint_pool *pool = w->pool;
  if (pool->stopping || w->leasing || w->completing)
    return;
  cph_op *op = &w->lease_op;
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->done = lease_done;
  op->ctx = w;
  op->u.lease.worker = w->name;
  op->u.lease.internal = true;
  op->u.lease.deadline_ns = cph_clock_now(&pool->srv->clock) + LEASE_WAIT_S * CPH_NS_PER_S;
  w->leasing = true;
  if (cph_engine_submit(pool->srv->engine, op) != CPH_OK) {
    w->leasing = false;
    cph_warn("maintenance worker %s: cannot lease: %s", w->name, op->err.msg);
    return;
  }
  cph_srv_schedule_pass(pool->srv);
}

static void on_wake(void *arg) {
  struct cph_maint_pool *pool = arg;
  for (int i = 0; i < pool->n; i++) {
    worker *w = &pool->workers[i];
    pthread_mutex_lock(&pool->mu);
    cph_job_work *done = w->executed && w->work ? w->work : NULL;
    if (done) {
      w->work = NULL;
      w->executed = false;
    }
    pthread_mutex_unlock(&pool->mu);
    if (done)
      complete_turn(w, done);
  }
}

int cph_maint_workers_start(cph_srv *s, int n, cph_maint_pool **out) {
  struct cph_maint_pool *pool = calloc(1, sizeof *pool);
  *out = pool;
  if (!pool)
    return CPH_ENOMEM;
  pool->srv = s;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->cv, NULL);
  int rc = cph_wake_init(&pool->wake, s->base, on_wake, pool, "maintenance worker");
  if (rc)
    return rc;
  pool->workers = calloc((size_t)n, sizeof *pool->workers);
  if (!pool->workers)
    return CPH_ENOMEM;
  for (int i = 0; i < n; i++) {
    worker *w = &pool->workers[i];
    w->pool = pool;
    w->index = i;
    snprintf(w->name, sizeof w->name, "cephalond-maint-%d", i + 1);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
      return CPH_EIO;
    pool->n = i + 1;
    lease_next(w);
  }
  cph_info("%d maintenance worker(s) started", n);
  return CPH_OK;
}

/* Withdraws waiting leases and joins the threads (a job in flight finishes first: the
 * providers' timeouts bound the wait). Turns they held expire or are completed by the last
 * passes. */
void cph_maint_workers_stop(cph_maint_pool *pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pool->mu);
  pool->stopping = true;
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->n; i++) {
    worker *w = &pool->workers[i];
    pthread_join(w->thread, NULL);
    if (w->leasing && cph_engine_cancel_lease(pool->srv->engine, &w->lease_op))
      w->leasing = false;
    cph_job_work_free(w->work);
    cph_policy_free(w->policy);
  }
  cph_wake_free(&pool->wake);
  pthread_mutex_destroy(&pool->mu);
  pthread_cond_destroy(&pool->cv);
  free(pool->workers);
  free(pool);
}

bool cph_maint_workers_busy(const cph_maint_pool *pool) {
  for (int i = 0; pool && i < pool->n; i++)
    if (pool->workers[i].completing)
      return true;
  return false;
}
