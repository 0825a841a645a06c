/* cephalond's maintenance workers, a service main.c starts, keeps in s->maint and stops: see
 * maint_workers.c. */
#ifndef CEPHALON_SERVER_MAINT_WORKERS_H
#define CEPHALON_SERVER_MAINT_WORKERS_H

#include <stdbool.h>

typedef struct cph_srv cph_srv;
typedef struct cph_maint_pool cph_maint_pool;
struct cph_policy;

/* A private copy of the provider settings of p (:providers, :vector-index) for a thread that
 * calls providers while the loop may reload the policy; NULL on out of memory. Free with
 * cph_policy_free. */
struct cph_policy *cph_provider_snapshot(const struct cph_policy *p);

/* Starts n workers (:maintenance :workers) after the engine is open and the loop exists;
 * they use s's engine, clock and loop and schedule passes on it. *out is set even when it
 * fails: cph_maint_workers_stop undoes what was started. */
int cph_maint_workers_start(cph_srv *s, int n, cph_maint_pool **out);
/* Stops them (at shutdown, before the last passes) and frees pool; NULL is fine. */
void cph_maint_workers_stop(cph_maint_pool *pool);
/* A completion is with the engine (shutdown waits for it). */
bool cph_maint_workers_busy(const cph_maint_pool *pool);

#endif
