/* Online backup: one copy at a time, on its own thread (contract in backup.h).
 *
 * The thread only calls cph_engine_backup, which reads the store through a transaction of its
 * own; the event loop never waits for it. Its state is shared under one mutex: the loop reads
 * it (status), the thread writes the outcome once. Progress is the size of the copy's data
 * file so far, read with stat() when asked. */
#include "backup.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"

typedef enum { BK_NONE, BK_RUNNING, BK_DONE, BK_FAILED } bk_state;

struct cph_backup {
  pthread_mutex_t mu;
  pthread_t thread;
  bool joinable; /* a thread was started and not yet joined */
  bk_state state;
  cph_engine *engine;
  char dir[4096];
  uint64_t bytes;
  int64_t started_ms, finished_ms;
  char error[512];
};

static uint64_t file_bytes(const char *dir) {
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/data.mdb", dir);
  return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static void *copy_thread(void *arg) {
  cph_backup *b = arg;
  cph_err err = {0};
  int rc = cph_engine_backup(b->engine, b->dir, &err);
  uint64_t bytes = file_bytes(b->dir);
  pthread_mutex_lock(&b->mu);
  b->state = rc == CPH_OK ? BK_DONE : BK_FAILED;
  b->bytes = bytes;
  b->finished_ms = cph_wall_ms();
  snprintf(b->error, sizeof b->error, "%s", rc == CPH_OK ? "" : err.msg);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

cph_backup *cph_backup_new(void) {
  cph_backup *b = calloc(1, sizeof *b);
  if (b && pthread_mutex_init(&b->mu, NULL) != 0) {
    free(b);
    return NULL;
  }
  return b;
}

void cph_backup_free(cph_backup *b) {
  if (!b)
    return;
  if (b->joinable)
    pthread_join(b->thread, NULL);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

/* A directory the copy may go to: absolute, and new or empty (the store's own check). */
static int check_dir(const char *dir, cph_err *err) {
  if (!dir || dir[0] != '/')
    return cph_err_set(err, CPH_EINVAL, "dir: an absolute path is needed");
  if (strlen(dir) >= 4000)
    return cph_err_set(err, CPH_EINVAL, "dir: at most 4000 bytes");
  return cph_engine_backup_dir_check(dir, err);
}

int cph_backup_start(cph_backup *b, cph_engine *e, const char *dir, cph_err *err) {
  pthread_mutex_lock(&b->mu);
  bool running = b->state == BK_RUNNING;
  pthread_mutex_unlock(&b->mu);
  if (running)
    return cph_err_set(err, CPH_ESTATE, "a backup is running (to '%s'): wait for it", b->dir);
  int rc = check_dir(dir, err);
  if (rc)
    return rc;
  if (b->joinable) { /* the last copy's thread has ended (its state is final): reap it */
    pthread_join(b->thread, NULL);
    b->joinable = false;
  }
  cph_engine_backup_begin(e); /* the copy holds every write answered before it */
  pthread_mutex_lock(&b->mu);
  b->state = BK_RUNNING;
  b->engine = e;
  snprintf(b->dir, sizeof b->dir, "%s", dir);
  b->bytes = 0;
  b->started_ms = cph_wall_ms();
  b->finished_ms = 0;
  b->error[0] = '\0';
  pthread_mutex_unlock(&b->mu);
  int e2 = pthread_create(&b->thread, NULL, copy_thread, b);
  if (e2) {
    pthread_mutex_lock(&b->mu);
    b->state = BK_FAILED;
    snprintf(b->error, sizeof b->error, "cannot start the backup thread: %s", strerror(e2));
    pthread_mutex_unlock(&b->mu);
    return cph_err_set(err, CPH_EIO, "cannot start the backup thread: %s", strerror(e2));
  }
  b->joinable = true;
  return CPH_OK;
}

void cph_backup_status_get(cph_backup *b, cph_backup_status *out) {
  static const char *const NAMES[] = {"none", "running", "done", "failed"};
  pthread_mutex_lock(&b->mu);
  out->state = NAMES[b->state];
  snprintf(out->dir, sizeof out->dir, "%s", b->dir);
  out->bytes = b->bytes;
  out->started_ms = b->started_ms;
  out->finished_ms = b->finished_ms;
  snprintf(out->error, sizeof out->error, "%s", b->error);
  bool running = b->state == BK_RUNNING;
  pthread_mutex_unlock(&b->mu);
  if (running)
    out->bytes = file_bytes(out->dir); /* the copy so far */
}
