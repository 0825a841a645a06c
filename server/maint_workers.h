/* cephalond's maintenance workers: see maint_workers.c. */
#ifndef CEPHALON_SERVER_MAINT_WORKERS_H
#define CEPHALON_SERVER_MAINT_WORKERS_H

#include <stdbool.h>

typedef struct cph_srv cph_srv;

/* Starts n workers (:maintenance :workers) after the engine is open and the loop exists. */
int cph_maint_workers_start(cph_srv *s, int n);
/* Stops them (at shutdown, before the last passes). */
void cph_maint_workers_stop(cph_srv *s);
/* A completion is with the engine (shutdown waits for it). */
bool cph_maint_workers_busy(const cph_srv *s);

#endif
