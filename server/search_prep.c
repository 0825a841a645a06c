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
 * The queue and the threads are offload.h's (an instance of search's own: a provider's slow
 * call never holds up ingest's work). A failure or timeout does not fail the search: the
 * engine answers lexically and the answer says "degraded". A full queue and a job that waited
 * in the queue past the provider's :timeout-ms (the provider is down and the threads are busy
 * timing out) go the same way at once, so a dead endpoint costs searches at most one timeout,
 * never a pile-up; so do the searches still queued at shutdown.
 * Each job carries a private copy of the provider settings (maint_workers.h), so a policy
 * reload never frees what a thread reads. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "maint_workers.h"
#include "offload.h"
#include "reply.h"
#include "request.h"
#include "search_prep.h"
#include "server.h"

struct cph_search_pool {
  cph_offload_pool *threads; /* the job queue and its threads (offload.h), search's own */
  uint64_t degraded;         /* searches answered degraded (for the log's rate limit) */
};

typedef struct sjob {
  cph_search_pool *pool;
  void (*on_done)(cph_req *r);
  cph_policy *policy;                    /* the thread's copy of the provider settings */
  const struct cph_providers *providers; /* the engine's table (static: outlives the job) */
  char *query;
  cph_strv scopes;
  size_t k;
  int64_t queued_ns;
  cph_search_prep prep; /* filled by the thread */
} sjob;

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

/* ---------------------------------------------------------------- the thread */

static void job_work(cph_req *r, void *arg, cph_event_hasher *h) {
  (void)r;
  (void)h;
  sjob *j = arg;
  cph_clock clock;
  cph_clock_init_monotonic(&clock);
  if (cph_clock_now(&clock) - j->queued_ns > wait_limit_ns(j->policy)) {
    j->prep.degraded = true;
    snprintf(j->prep.error, sizeof j->prep.error,
             "waited past the provider's :timeout-ms for a search thread");
  } else {
    cph_search_prepare(j->policy, j->providers, j->query, (const char *const *)j->scopes.items,
                       j->scopes.count, j->k, &j->prep);
  }
}

/* At shutdown, a search no thread took is answered lexically at once: calling the providers
 * from the loop could hold the stop for their timeouts. */
static void job_cancel(cph_req *r, void *arg) {
  (void)r;
  sjob *j = arg;
  j->prep.degraded = true;
  snprintf(j->prep.error, sizeof j->prep.error, "cephalond is stopping");
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

static void job_done(cph_req *r, void *arg) {
  sjob *j = arg;
  if (j->prep.degraded && j->pool->degraded++ % 100 == 0)
    cph_warn("memory search degraded to the lexical match (%llu so far): %s",
             (unsigned long long)j->pool->degraded, j->prep.error);
  hand_in(r, &j->prep);
  void (*on_done)(cph_req *) = j->on_done;
  job_free(j);
  if (!cph_req_submit(r, CPH_OP_MEMORY_SEARCH, on_done))
    cph_req_end(r); /* answered (503) by submit; the request was ours */
}

bool cph_search_prep_submit(cph_search_pool *pool, cph_req *r, cph_strv *scopes,
                            void (*on_done)(cph_req *r)) {
  if (!pool)
    return false;
  sjob *j = calloc(1, sizeof *j);
  if (!j)
    return false;
  j->pool = pool;
  j->policy = cph_provider_snapshot(cph_engine_policy(r->srv->engine));
  j->providers = cph_engine_providers(r->srv->engine);
  j->query = strdup(r->op.u.search.query ? r->op.u.search.query : "");
  if (!j->policy || !j->query) {
    job_free(j);
    return false;
  }
  j->on_done = on_done;
  j->k = r->op.u.search.k;
  j->scopes = *scopes;
  j->queued_ns = cph_clock_now(&r->srv->clock);
  static const cph_offload_fns fns = {job_work, job_done, job_cancel};
  if (cph_offload_take(pool->threads, r, &fns, j)) {
    *scopes = (cph_strv){0}; /* the job's now */
    return true;
  }
  j->scopes = (cph_strv){0}; /* still the caller's */
  job_free(j);
  return false;
}

int cph_search_prep_start(cph_srv *s, int n, cph_search_pool **out) {
  cph_search_pool *pool = calloc(1, sizeof *pool);
  *out = pool;
  if (!pool)
    return CPH_ENOMEM;
  return cph_offload_start(s, n, "search thread", &pool->threads);
}

void cph_search_prep_stop(cph_search_pool *pool) {
  if (!pool)
    return;
  cph_offload_stop(pool->threads);
  free(pool);
}
