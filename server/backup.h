/* Online backup (DESIGN §13), a service main.c creates, keeps in s->backup and frees: one copy
 * at a time of the engine's store into a new directory, on a thread of its own, while the
 * daemon goes on serving. POST /v1/admin/backup starts it; GET /v1/admin/backup (and
 * `cephalonctl backup`) follows it. */
#ifndef CEPHALON_SERVER_BACKUP_H
#define CEPHALON_SERVER_BACKUP_H

#include <stdint.h>

#include "cephalon/cephalon.h"

typedef struct cph_backup cph_backup;

typedef struct cph_backup_status {
  const char *state; /* "none" (never started), "running", "done", "failed" */
  char dir[4096];
  uint64_t bytes;                  /* written so far (running) or in all (done) */
  int64_t started_ms, finished_ms; /* wall clock; finished 0 while running */
  char error[512];                 /* failed: why */
} cph_backup_status;

cph_backup *cph_backup_new(void); /* NULL on out of memory */
/* Waits for a running copy to finish (shutdown: before the engine closes), then frees b. */
void cph_backup_free(cph_backup *b);
/* Starts copying e's store into dir: an absolute path that does not exist or is an empty
 * directory. CPH_ESTATE when a copy is running; CPH_EINVAL / CPH_EEXISTS for a dir that will
 * not do (err says why); CPH_ENOMEM / CPH_EIO when the thread cannot start. */
int cph_backup_start(cph_backup *b, cph_engine *e, const char *dir, cph_err *err);
void cph_backup_status_get(cph_backup *b, cph_backup_status *out);

#endif
