/* Ingest's text work, off the loop (DESIGN §12: durable ingest).
 *
 * The engine applies a POST /v1/events inside its pass, on the loop's thread, and that thread
 * is what bounds ingest. Part of each event's work depends on its text alone: normalising the
 * body and hashing it for content dedupe (SHA-256, simhash, the identifier signature), about a
 * tenth of the event's cost. A request of CPH_INGEST_PREP_MIN_EVENTS or more is handed here:
 *   loop:   events decoded -> queue the job (the dedupe settings copied into it)
 *   thread: cph_event_prepare() for each event, into the request's cph_event_prep array
 *   loop:   (woken through a pipe) submit the op; the engine takes the prepared hashes
 * The engine checks each prep against the settings in force and computes what does not
 * match, so a reload in between changes no verdict. Nothing is answered before the pass that
 * applies the request commits, as without this service; a request is never dropped here: a
 * full queue or no thread means the caller submits at once, and at shutdown every held
 * request is submitted. */
#include <pthread.h>
#include <stdlib.h>

#include "ingest_prep.h"
#include "reply.h"
#include "request.h"
#include "server.h"

#define QUEUE_MAX 64

typedef struct ijob {
  struct ijob *next;
  cph_req *r; /* its events and preps are the thread's until the job is done */
  void (*on_done)(cph_req *r);
  cph_event_prep *preps; /* in r's arena, one per event; each event's prep points here */
  int32_t shingle_words;
  int64_t min_length;
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

static void prepare_all(cph_event_hasher *h, ijob *j) {
  cph_op *op = &j->r->op;
  for (size_t i = 0; i < op->u.ingest.n_events; i++)
    if (cph_event_prepare(h, &op->u.ingest.events[i], j->shingle_words, j->min_length,
                          &j->preps[i]) != CPH_OK)
      return; /* out of memory: the rest stay not ready, the engine computes them */
}

static void *prep_main(void *arg) {
  struct cph_ingest_pool *pool = arg;
  cph_event_hasher *h = cph_event_hasher_new(); /* NULL: jobs pass through unprepared */
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stopping && !pool->queued.head)
      pthread_cond_wait(&pool->cv, &pool->mu);
    if (pool->stopping)
      break;
    ijob *j = list_pop(&pool->queued);
    pthread_mutex_unlock(&pool->mu);
    if (h)
      prepare_all(h, j);
    pthread_mutex_lock(&pool->mu);
    list_push(&pool->done, j);
    cph_wake_signal(&pool->wake);
  }
  pthread_mutex_unlock(&pool->mu);
  cph_event_hasher_free(h);
  return NULL;
}

/* ---------------------------------------------------------------- the loop side */

static void submit(ijob *j) {
  cph_req *r = j->r;
  void (*on_done)(cph_req *) = j->on_done;
  free(j);
  if (!cph_req_submit(r, CPH_OP_INGEST, on_done))
    cph_req_end(r); /* answered (503) by submit; the request was ours */
}

static void on_wake(void *arg) {
  struct cph_ingest_pool *pool = arg;
  pthread_mutex_lock(&pool->mu);
  ijob_list done = pool->done;
  pool->done = (ijob_list){0};
  pthread_mutex_unlock(&pool->mu);
  for (ijob *j; (j = list_pop(&done)) != NULL;)
    submit(j);
}

bool cph_ingest_prep_submit(cph_ingest_pool *pool, cph_req *r, void (*on_done)(cph_req *r)) {
  size_t n = r->op.u.ingest.n_events;
  if (!pool || !pool->n_threads || n < CPH_INGEST_PREP_MIN_EVENTS)
    return false;
  pthread_mutex_lock(&pool->mu);
  bool room = !pool->stopping && pool->queued.n < QUEUE_MAX;
  pthread_mutex_unlock(&pool->mu);
  if (!room)
    return false;
  ijob *j = calloc(1, sizeof *j);
  cph_event_prep *preps = j ? cph_req_alloc(r, n * sizeof *preps) : NULL;
  if (!preps) {
    free(j);
    return false; /* out of memory: cph_req_alloc recorded the 500 */
  }
  const cph_policy *p = cph_engine_policy(pool->srv->engine);
  j->r = r;
  j->on_done = on_done;
  j->preps = preps;
  j->shingle_words = (int32_t)p->dedupe.shingle_words;
  j->min_length = p->dedupe.min_length;
  for (size_t i = 0; i < n; i++)
    r->op.u.ingest.events[i].prep = &preps[i]; /* not ready until the thread fills it */
  r->async = true; /* answered from the op's done, after the thread */
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
    submit(j);
  for (ijob *j; (j = list_pop(&pool->queued)) != NULL;)
    submit(j);
  cph_wake_free(&pool->wake);
  pthread_mutex_destroy(&pool->mu);
  pthread_cond_destroy(&pool->cv);
  free(pool->threads);
  free(pool);
}
