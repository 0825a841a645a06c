#define _GNU_SOURCE
/* The vector half of memory searches (DESIGN §7 "reads see writes"), off the loop.
 *
 * With an OpenAI-compatible embedder or the HTTP vector index, a search needs the network
 * before the engine can rank it: the query's embedding, and the index's hits per scope. The
 * engine applies searches inside a scheduler pass, where a blocking call would stall every
 * session, so the route hands the search here:
 *   loop:   the session's scopes (a read) -> queue the job
 *   thread: cph_search_prepare() — embedder and index calls, each bounded by its :timeout-ms
 *   loop:   (woken through a pipe) the results copied into the request -> submit the op
 * A failure or timeout does not fail the search: the engine answers lexically and the answer
 * says "degraded". A full queue (QUEUE_MAX searches waiting) and a job that waited in the queue
 * past the provider's :timeout-ms (the provider is down and the threads are busy timing out) go
 * the same way at once, so a dead endpoint costs searches at most one timeout, never a pile-up.
 * Each job carries a private copy of the provider settings (maint_workers.h), so a policy
 * reload never frees what a thread reads. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "maint_workers.h"
#include "reply.h"
#include "request.h"
#include "search_prep.h"
#include "server.h"

#define QUEUE_MAX 64

typedef struct sjob {
  struct sjob *next;
  cph_req *r; /* touched on the loop only */
  void (*on_done)(cph_req *r);
  cph_policy *policy;                    /* the thread's copy of the provider settings */
  const struct cph_providers *providers; /* the engine's table (static: outlives the job) */
  char *query;
  cph_strv scopes;
  size_t k;
  int64_t queued_ns;
  cph_search_prep prep; /* filled by the thread */
} sjob;

typedef struct sjob_list {
  sjob *head, *tail;
  size_t n;
} sjob_list;

struct cph_search_pool {
  cph_srv *srv;
  pthread_t *threads;
  int n_threads;
  pthread_mutex_t mu; /* guards the lists and stopping */
  pthread_cond_t cv;
  sjob_list queued, done;
  bool stopping;
  cph_wake wake;     /* signalled by a thread when a job is done */
  uint64_t degraded; /* searches answered degraded (for the log's rate limit) */
};

static void list_push(sjob_list *l, sjob *j) {
  j->next = NULL;
  if (l->tail)
    l->tail->next = j;
  else
    l->head = j;
  l->tail = j;
  l->n++;
}

static sjob *list_pop(sjob_list *l) {
  sjob *j = l->head;
  if (j) {
    l->head = j->next;
    if (!l->head)
      l->tail = NULL;
    l->n--;
  }
  return j;
}

static void job_free(sjob *j) {
  cph_policy_free(j->policy);
  free(j->query);
  cph_strv_free(&j->scopes);
  cph_search_prep_free(&j->prep);
  free(j);
}

/* How long a job may wait for a thread: the timeout of the first call it would make. */
static int64_t wait_limit_ns(const cph_policy *p) {
  int64_t ms = p->providers.embeddings.kind != CPH_POLICY_PROVIDER_BUILTIN
                   ? p->providers.embeddings.timeout_ms
                   : p->vector_index.timeout_ms;
  return ms * CPH_NS_PER_MS;
}

/* ---------------------------------------------------------------- the threads */

static void *prep_main(void *arg) {
  struct cph_search_pool *pool = arg;
  cph_clock clock;
  cph_clock_init_monotonic(&clock);
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stopping && !pool->queued.head)
      pthread_cond_wait(&pool->cv, &pool->mu);
    if (pool->stopping)
      break;
    sjob *j = list_pop(&pool->queued);
    pthread_mutex_unlock(&pool->mu);
    if (cph_clock_now(&clock) - j->queued_ns > wait_limit_ns(j->policy)) {
      j->prep.degraded = true;
      snprintf(j->prep.error, sizeof j->prep.error,
               "waited past the provider's :timeout-ms for a search thread");
    } else {
      cph_search_prepare(j->policy, j->providers, j->query, (const char *const *)j->scopes.items,
                         j->scopes.count, j->k, &j->prep);
    }
    pthread_mutex_lock(&pool->mu);
    list_push(&pool->done, j);
    cph_wake_signal(&pool->wake);
  }
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

/* ---------------------------------------------------------------- the loop side */

/* Copies what the engine reads into the request (it outlives the op). */
static void hand_in(cph_req *r, const cph_search_prep *prep) {
  if (prep->query_vector && prep->dims) {
    float *v = cph_req_alloc(r, (size_t)prep->dims * sizeof *v);
    if (v) {
      memcpy(v, prep->query_vector, (size_t)prep->dims * sizeof *v);
      r->op.u.search.query_vector = v;
      r->op.u.search.dims = prep->dims;
    }
  }
  if (prep->n_index_hits) {
    cph_vhit *h = cph_req_alloc(r, prep->n_index_hits * sizeof *h);
    if (h) {
      memcpy(h, prep->index_hits, prep->n_index_hits * sizeof *h);
      r->op.u.search.index_hits = h;
      r->op.u.search.n_index_hits = prep->n_index_hits;
    }
  }
  r->op.u.search.degraded = prep->degraded;
}

static void on_wake(void *arg) {
  struct cph_search_pool *pool = arg;
  pthread_mutex_lock(&pool->mu);
  sjob_list done = pool->done;
  pool->done = (sjob_list){0};
  pthread_mutex_unlock(&pool->mu);
  for (sjob *j; (j = list_pop(&done)) != NULL;) {
    cph_req *r = j->r;
    if (j->prep.degraded && pool->degraded++ % 100 == 0)
      cph_warn("memory search degraded to the lexical match (%llu so far): %s",
               (unsigned long long)pool->degraded, j->prep.error);
    hand_in(r, &j->prep);
    void (*on_done)(cph_req *) = j->on_done;
    job_free(j);
    if (!cph_req_submit(r, CPH_OP_MEMORY_SEARCH, on_done))
      cph_req_end(r); /* answered (503) by submit; the request was ours */
  }
}

bool cph_search_prep_submit(cph_search_pool *pool, cph_req *r, cph_strv *scopes,
                            void (*on_done)(cph_req *r)) {
  if (!pool || !pool->n_threads)
    return false;
  pthread_mutex_lock(&pool->mu);
  bool room = !pool->stopping && pool->queued.n < QUEUE_MAX;
  pthread_mutex_unlock(&pool->mu);
  if (!room)
    return false;
  sjob *j = calloc(1, sizeof *j);
  if (!j)
    return false;
  j->policy = cph_provider_snapshot(cph_engine_policy(pool->srv->engine));
  j->providers = cph_engine_providers(pool->srv->engine);
  j->query = strdup(r->op.u.search.query ? r->op.u.search.query : "");
  if (!j->policy || !j->query) {
    job_free(j);
    return false;
  }
  j->r = r;
  j->on_done = on_done;
  j->k = r->op.u.search.k;
  j->scopes = *scopes;
  *scopes = (cph_strv){0};
  j->queued_ns = cph_clock_now(&pool->srv->clock);
  r->async = true; /* answered from the op's done, after the thread */
  pthread_mutex_lock(&pool->mu);
  list_push(&pool->queued, j);
  pthread_cond_signal(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  return true;
}

int cph_search_prep_start(cph_srv *s, int n, cph_search_pool **out) {
  struct cph_search_pool *pool = calloc(1, sizeof *pool);
  *out = pool;
  if (!pool)
    return CPH_ENOMEM;
  pool->srv = s;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->cv, NULL);
  int rc = cph_wake_init(&pool->wake, s->base, on_wake, pool, "search thread");
  if (rc)
    return rc;
  pool->threads = calloc((size_t)n, sizeof *pool->threads);
  if (!pool->threads)
    return CPH_ENOMEM;
  for (int i = 0; i < n; i++) {
    if (pthread_create(&pool->threads[i], NULL, prep_main, pool) != 0)
      return CPH_EIO;
    pool->n_threads = i + 1;
  }
  return CPH_OK;
}

void cph_search_prep_stop(cph_search_pool *pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pool->mu);
  pool->stopping = true;
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->n_threads; i++)
    pthread_join(pool->threads[i], NULL);
  for (sjob *j; (j = list_pop(&pool->queued)) != NULL;)
    job_free(j);
  for (sjob *j; (j = list_pop(&pool->done)) != NULL;)
    job_free(j);
  cph_wake_free(&pool->wake);
  pthread_mutex_destroy(&pool->mu);
  pthread_cond_destroy(&pool->cv);
  free(pool->threads);
  free(pool);
}
