/* Ingest's request work, off the loop (DESIGN §12: durable ingest).
 *
 * The engine applies a POST /v1/events inside its pass, on the loop's thread, and that thread
 * is what bounds ingest. Part of each request's work needs neither the engine nor libevent:
 * decoding its JSON and, for each event, normalising the body and hashing it for content
 * dedupe (SHA-256, simhash, the identifier signature) — about a sixth of the request's cost.
 * routes_events.c hands a large request here:
 *   loop:   the body pulled up contiguous, the limits and dedupe settings copied -> queue
 *   thread: the job's work (decode into r's arena, cph_event_prepare for each event)
 *   loop:   (woken through a pipe) the job's done: submit the op, or fall back to the generic
 *           decoder, or answer an error
 * While a job is out, nothing on the loop touches its request (libevent keeps a request whose
 * client left until it is answered, so its body stays readable). The engine checks each prep
 * against the dedupe settings in force, so a reload in between changes no verdict. Nothing is
 * answered before the pass that applies the request commits, as without this service; a
 * request is never dropped here: a full queue or no thread means the route does the work
 * itself, and at shutdown every held job is finished on the loop. */
#include <pthread.h>
#include <stdlib.h>

#include "ingest_prep.h"
#include "request.h"
#include "server.h"

#define QUEUE_MAX 64

typedef struct ijob {
  struct ijob *next;
  cph_req *r; /* the thread's until the job is done */
  cph_ingest_job_fns fns;
  void *arg;
  bool worked;
} ijob;

typedef struct ijob_list {
  ijob *head, *tail;
  size_t n;
} ijob_list;

struct cph_ingest_pool {
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
  struct cph_ingest_pool *pool = arg;
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
    list_push(&pool->done, j);
    cph_wake_signal(&pool->wake);
  }
  pthread_mutex_unlock(&pool->mu);
  cph_event_hasher_free(h);
  return NULL;
}

/* ---------------------------------------------------------------- the loop side */

/* Ends a job on the loop. */
static void finish(ijob *j) {
  if (!j->worked)
    j->fns.work(j->r, j->arg, NULL);
  cph_ingest_job_fns fns = j->fns;
  cph_req *r = j->r;
  void *arg = j->arg;
  free(j);
  fns.done(r, arg);
}

static void on_wake(void *arg) {
  struct cph_ingest_pool *pool = arg;
  pthread_mutex_lock(&pool->mu);
  ijob_list done = pool->done;
  pool->done = (ijob_list){0};
  pthread_mutex_unlock(&pool->mu);
  for (ijob *j; (j = list_pop(&done)) != NULL;)
    finish(j);
}

bool cph_ingest_prep_take(cph_ingest_pool *pool, cph_req *r, const cph_ingest_job_fns *fns,
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
  r->async = true; /* answered from done (or the op it submits) */
  pthread_mutex_lock(&pool->mu);
  list_push(&pool->queued, j);
  pthread_cond_signal(&pool->cv);
  pthread_mutex_unlock(&pool->mu);
  return true;
}

int cph_ingest_prep_start(cph_srv *s, int n, cph_ingest_pool **out) {
  struct cph_ingest_pool *pool = calloc(1, sizeof *pool);
  *out = pool;
  if (!pool)
    return CPH_ENOMEM;
  pool->srv = s;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->cv, NULL);
  int rc = cph_wake_init(&pool->wake, s->base, on_wake, pool, "ingest thread");
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

void cph_ingest_prep_stop(cph_ingest_pool *pool) {
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
