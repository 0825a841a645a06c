/* The background flusher (contract in store.h): one thread that runs cph_store_sync() when
 * asked, so the writer thread can build its next transaction while the disk flushes the last
 * one. It only calls fdatasync and touches atomics and its own fields: no LMDB call, so it
 * needs no part of LMDB's thread rules. */
#include <pthread.h>
#include <stdlib.h>

#include "common/log.h"
#include "store_internal.h"

typedef struct cph_flusher {
  pthread_t thread;
  pthread_cond_t cv;  /* with the store's flush_mu */
  bool asked;         /* a flush was asked for and has not started */
  bool stopping;
  void (*done)(void *ctx);
  void *ctx;
} cph_flusher;

static void *flusher_main(void *arg) {
  cph_store *s = arg;
  cph_flusher *f = s->flusher;
  pthread_mutex_lock(&s->flush_mu);
  for (;;) {
    while (!f->asked && !f->stopping)
      pthread_cond_wait(&f->cv, &s->flush_mu);
    if (!f->asked) /* stopping, and nothing left to flush */
      break;
    f->asked = false; /* asks from here on wait for the next round: they may be newer */
    pthread_mutex_unlock(&s->flush_mu);
    cph_err err = {0};
    if (cph_store_sync(s, &err) != CPH_OK)
      cph_error("%s", err.msg);
    f->done(f->ctx);
    pthread_mutex_lock(&s->flush_mu);
  }
  pthread_mutex_unlock(&s->flush_mu);
  return NULL;
}

int cph_store_flusher_start(cph_store *s, void (*done)(void *ctx), void *ctx) {
  if (s->flusher)
    return CPH_ESTATE;
  cph_flusher *f = calloc(1, sizeof *f);
  if (!f)
    return CPH_ENOMEM;
  f->done = done;
  f->ctx = ctx;
  pthread_cond_init(&f->cv, NULL);
  s->flusher = f;
  if (pthread_create(&f->thread, NULL, flusher_main, s) != 0) {
    s->flusher = NULL;
    pthread_cond_destroy(&f->cv);
    free(f);
    return CPH_EIO;
  }
  return CPH_OK;
}

void cph_store_flush_async(cph_store *s) {
  cph_flusher *f = s->flusher;
  if (!f) {
    cph_store_sync(s, NULL); /* a failure is sticky: cph_store_flush_error() tells */
    return;
  }
  pthread_mutex_lock(&s->flush_mu);
  f->asked = true;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&s->flush_mu);
}

void cph_store_flusher_stop(cph_store *s) {
  cph_flusher *f = s->flusher;
  if (!f)
    return;
  pthread_mutex_lock(&s->flush_mu);
  f->stopping = true;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&s->flush_mu);
  pthread_join(f->thread, NULL);
  s->flusher = NULL;
  pthread_cond_destroy(&f->cv);
  free(f);
}
