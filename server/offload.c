/* Request work beside the loop (DESIGN §12: durable ingest, the turn cycle).
 *
 * The engine runs on the loop's thread, and that thread is what bounds ingest and the turn
 * cycle. Part of a request's work needs neither the engine nor libevent, and routes hand it
 * here as a job — work(r, arg, h) on a pool thread, then done(r, arg) on the loop, woken
 * through a pipe:
 *   - a large POST /v1/events (routes_events.c): decoding its JSON into r's arena and, for
 *     each event, the text hashes of content dedupe (cph_event_prepare) — about a sixth of the
 *     request's cost; done submits the op (or falls back to the generic decoder);
 *   - a lease answer (routes_turns.c): writing the turn's JSON — a tenth of a cycle; done
 *     sends it;
 *   - in a pool of its own (search_prep.c), a memory search's embedder and index calls.
 * While a job is out, nothing on the loop touches its request (libevent keeps a request whose
 * client left until it is answered, so its body stays readable), and what the work reads is
 * the request's own (its arena, its op's inputs or results). Nothing is answered earlier than
 * without this service; a request is never dropped here: a full queue or no thread means the
 * route does the work itself, and at shutdown every held job is finished on the loop. */
#include <pthread.h>
#include <stdlib.h>

#include "offload.h"
#include "request.h"
#include "server.h"

#define QUEUE_MAX 64

typedef struct ijob {
  struct ijob *next;
  cph_req *r; /* the thread's until the job is done */
  cph_offload_fns fns;
  void *arg;
  bool worked;
} ijob;

typedef struct ijob_list {
  ijob *head, *tail;
  size_t n;
} ijob_list;

struct cph_offload_pool {
  cph_srv *srv;
  pthread_t *threads;
  int n_threads;
  pthread_mutex_t mu; /* guards the lists and stopping */
  pthread_cond_t cv;
  ijob_list queued, done;
  bool stopping;
  cph_wake wake; /* signalled by a thread when a job is done */
};

static void list_push(ijob_list *l, ijob *j) {
  j->next = NULL;
  if (l->tail)
    l->tail->next = j;
  else
    l->head = j;
  l->tail = j;
  l->n++;
}

static ijob *list_pop(ijob_list *l) {
  ijob *j = l->head;
  if (j) {
    l->head = j->next;
    if (!l->head)
      l->tail = NULL;
    l->n--;
  }
  return j;
}

/* ---------------------------------------------------------------- the threads */

static void *prep_main(void *arg) {
  struct cph_offload_pool *pool = arg;
  cph_event_hasher *h = cph_event_hasher_new(); /* NULL: events go unprepared */
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stopping && !pool->queued.head)
      pthread_cond_wait(&pool->cv, &pool->mu);
    if (pool->stopping)
      break;
    ijob *j = list_pop(&pool->queued);
    pthread_mutex_unlock(&pool->mu);
    j->fns.work(j->r, j->arg, h);
    j->worked = true;
    pthread_mutex_lock(&pool->mu);
    /* One wake per batch: a list that held jobs already has its wake pending, and the loop
     * empties the pipe before it takes the list (wake.h), so it takes this job too. */
    bool signal = !pool->done.head;
    list_push(&pool->done, j);
    if (signal)
      cph_wake_signal(&pool->wake);
  }
  pthread_mutex_unlock(&pool->mu);
  cph_event_hasher_free(h);
  return NULL;
}

/* ---------------------------------------------------------------- the loop side */

/* Ends a job on the loop. */
static void finish(ijob *j) {
  if (!j->worked && j->fns.cancel)
    j->fns.cancel(j->r, j->arg);
  else if (!j->worked)
    j->fns.work(j->r, j->arg, NULL);
  cph_offload_fns fns = j->fns;
  cph_req *r = j->r;
  void *arg = j->arg;
  free(j);
  fns.done(r, arg);
}

static void on_wake(void *arg) {
  struct cph_offload_pool *pool = arg;
  pthread_mutex_lock(&pool->mu);
  ijob_list done = pool->done;
  pool->done = (ijob_list){0};
  pthread_mutex_unlock(&pool->mu);
  for (ijob *j; (j = list_pop(&done)) != NULL;)
    finish(j);
}

bool cph_offload_take(cph_offload_pool *pool, cph_req *r, const cph_offload_fns *fns,
                          void *arg) {
  if (!pool || !pool->n_threads)
    return false;
  pthread_mutex_lock(&pool->mu);
  bool room = !pool->stopping && pool->queued.n < QUEUE_MAX;
  pthread_mutex_unlock(&pool->mu);
  ijob *j = room ? calloc(1, sizeof *j) : NULL;
  if (!j)
    return false;
  j->r = r;
  j->fns = *fns;
  j->arg = arg;
  if (!r->answering)
    r->async = true; /* before its op: done answers it or submits */
  pthread_mutex_lock(&pool->mu);
  list_push(&pool->queued, j);
  pthread_cond_signal(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  return true;
}

int cph_offload_start(cph_srv *s, int n, const char *who, cph_offload_pool **out) {
  struct cph_offload_pool *pool = calloc(1, sizeof *pool);
  *out = pool;
  if (!pool)
    return CPH_ENOMEM;
  pool->srv = s;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->cv, NULL);
  int rc = cph_wake_init(&pool->wake, s->base, on_wake, pool, who);
  if (rc)
    return rc;
  if (n <= 0)
    return CPH_OK;
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

void cph_offload_stop(cph_offload_pool *pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pool->mu);
  pool->stopping = true;
  pthread_cond_broadcast(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  for (int i = 0; i < pool->n_threads; i++)
    pthread_join(pool->threads[i], NULL);
  /* The threads are gone: what is left is the loop's. Done jobs first (they came first). */
  for (ijob *j; (j = list_pop(&pool->done)) != NULL;)
    finish(j);
  for (ijob *j; (j = list_pop(&pool->queued)) != NULL;)
    finish(j);
  cph_wake_free(&pool->wake);
  pthread_mutex_destroy(&pool->mu);
  pthread_cond_destroy(&pool->cv);
  free(pool->threads);
  free(pool);
}
