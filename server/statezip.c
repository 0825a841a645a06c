/* The cluster log's packed states (contract in statezip.h). */
#include "statezip.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "wake.h"

bool cph_statezip_packed(const uint8_t *value, size_t len) {
  return len >= 4 && memcmp(value, CPH_STATEZIP_MAGIC, 4) == 0;
}

int cph_statezip_pack(const uint8_t *raw, size_t len, int level, size_t max_raw, size_t headroom,
                      uint8_t **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (len > max_raw || len > UINT32_MAX || len > (size_t)UINT_MAX)
    return CPH_ELIMIT;
  uLong bound = compressBound((uLong)len);
  uint8_t *buf = malloc(headroom + CPH_STATEZIP_HEADER + bound);
  if (!buf)
    return CPH_ENOMEM;
  uint8_t *h = buf + headroom;
  memcpy(h, CPH_STATEZIP_MAGIC, 4);
  for (int i = 0; i < 4; i++)
    h[4 + i] = (uint8_t)(len >> (24 - 8 * i));
  uLongf zlen = bound;
  int zrc = compress2(h + CPH_STATEZIP_HEADER, &zlen, raw, (uLong)len, level);
  if (zrc != Z_OK) { /* Z_MEM_ERROR; Z_BUF_ERROR cannot happen within compressBound */
    free(buf);
    return CPH_ENOMEM;
  }
  *out = buf;
  *out_len = headroom + CPH_STATEZIP_HEADER + zlen;
  return CPH_OK;
}

int cph_statezip_unpack(const uint8_t *value, size_t len, size_t max_raw, uint8_t **out,
                        size_t *out_len, char *why, size_t why_size) {
  *out = NULL;
  *out_len = 0;
  if (!cph_statezip_packed(value, len))
    return CPH_OK;
  if (len < CPH_STATEZIP_HEADER) {
    snprintf(why, why_size, "a packed state cut in its header (%zu bytes)", len);
    return CPH_ECORRUPT;
  }
  size_t stated = 0;
  for (int i = 0; i < 4; i++)
    stated = stated << 8 | value[4 + i];
  if (stated > max_raw) {
    snprintf(why, why_size, "a packed state that says it holds %zu bytes, over the %zu a state "
             "may hold", stated, max_raw);
    return CPH_ELIMIT;
  }
  if (len - CPH_STATEZIP_HEADER > (size_t)UINT_MAX) {
    snprintf(why, why_size, "a packed state of %zu bytes, more than zlib reads at once", len);
    return CPH_ELIMIT;
  }
  /* One byte beyond the stated length: a stream that inflates to more fills it, and is told. */
  uint8_t *buf = malloc(stated + 1);
  if (!buf)
    return CPH_ENOMEM;
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit(&z) != Z_OK) {
    free(buf);
    return CPH_ENOMEM;
  }
  z.next_in = (Bytef *)(value + CPH_STATEZIP_HEADER);
  z.avail_in = (uInt)(len - CPH_STATEZIP_HEADER);
  z.next_out = buf;
  z.avail_out = (uInt)(stated + 1);
  int zrc = inflate(&z, Z_FINISH);
  size_t got = stated + 1 - z.avail_out;
  size_t left = z.avail_in;
  const char *zmsg = z.msg;
  int rc = CPH_OK;
  if (zrc == Z_MEM_ERROR) {
    rc = CPH_ENOMEM;
  } else if (zrc == Z_STREAM_END && got == stated && left == 0) {
    rc = CPH_OK;
  } else if (zrc == Z_STREAM_END && got != stated) {
    snprintf(why, why_size, "a packed state that says it holds %zu bytes inflates to %zu",
             stated, got);
    rc = CPH_ECORRUPT;
  } else if (zrc == Z_STREAM_END) {
    snprintf(why, why_size, "a packed state with %zu bytes after its stream", left);
    rc = CPH_ECORRUPT;
  } else if (got > stated) {
    snprintf(why, why_size, "a packed state that says it holds %zu bytes inflates to more",
             stated);
    rc = CPH_ECORRUPT;
  } else if (zrc == Z_BUF_ERROR) { /* every byte read, the stream not ended */
    snprintf(why, why_size, "a packed state cut in its stream (%zu of %zu bytes inflated)", got,
             stated);
    rc = CPH_ECORRUPT;
  } else {
    snprintf(why, why_size, "a packed state whose stream does not inflate (zlib: %s)",
             zmsg ? zmsg : zError(zrc));
    rc = CPH_ECORRUPT;
  }
  inflateEnd(&z);
  if (rc != CPH_OK) {
    free(buf);
    return rc;
  }
  *out = buf;
  *out_len = stated;
  return CPH_OK;
}

void cph_statezip_job_run(cph_statezip_job *job, int level) {
  int64_t t0 = cph_mono_ns();
  job->out = NULL;
  job->out_len = 0;
  job->packed = false;
  int rc = cph_statezip_pack(job->raw, job->raw_len, level, CPH_SESSION_STATE_MAX_BYTES,
                             job->headroom, &job->out, &job->out_len);
  if (rc == CPH_OK && job->out_len - job->headroom >= job->raw_len) {
    free(job->out); /* no smaller: the raw state, which every reader takes as it is */
    job->out = NULL;
    rc = CPH_EINVAL;
  } else if (rc == CPH_OK) {
    job->packed = true;
  }
  if (rc != CPH_OK && rc != CPH_ENOMEM && (job->out = malloc(job->headroom + job->raw_len))) {
    memcpy(job->out + job->headroom, job->raw, job->raw_len);
    job->out_len = job->headroom + job->raw_len;
  }
  job->pack_ns = cph_mono_ns() - t0;
}

/* ================================================================ the packer */

struct cph_statezip_packer {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stopping;
  int level;
  cph_statezip_job *todo, *todo_tail; /* submitted, not packed */
  cph_statezip_job *done, *done_tail; /* packed, not handed back */
  cph_wake wake;
  void (*cb)(void *arg, cph_statezip_job *job);
  void *arg;
};

static void append(cph_statezip_job **head, cph_statezip_job **tail, cph_statezip_job *job) {
  job->next = NULL;
  if (*tail)
    (*tail)->next = job;
  else
    *head = job;
  *tail = job;
}

static void *packer_thread(void *arg) {
  cph_statezip_packer *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stopping && !p->todo)
      pthread_cond_wait(&p->cv, &p->mu);
    if (p->stopping)
      break;
    cph_statezip_job *job = p->todo;
    p->todo = job->next;
    if (!p->todo)
      p->todo_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    cph_statezip_job_run(job, p->level);
    pthread_mutex_lock(&p->mu);
    bool was_empty = p->done == NULL;
    append(&p->done, &p->done_tail, job);
    if (was_empty) /* otherwise the loop has a wake coming for the list */
      cph_wake_signal(&p->wake);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* On the loop: hands back every packed job, in order. */
static void on_packed(void *arg) {
  cph_statezip_packer *p = arg;
  pthread_mutex_lock(&p->mu);
  cph_statezip_job *jobs = p->done;
  p->done = p->done_tail = NULL;
  pthread_mutex_unlock(&p->mu);
  while (jobs) {
    cph_statezip_job *job = jobs;
    jobs = job->next;
    job->next = NULL;
    p->cb(p->arg, job);
  }
}

int cph_statezip_packer_start(struct event_base *base, int level,
                              void (*done)(void *arg, cph_statezip_job *job), void *arg,
                              cph_statezip_packer **out) {
  *out = NULL;
  cph_statezip_packer *p = calloc(1, sizeof *p);
  if (!p)
    return CPH_ENOMEM;
  p->level = level;
  p->cb = done;
  p->arg = arg;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  int rc = cph_wake_init(&p->wake, base, on_packed, p, "the state packer");
  if (rc == CPH_OK && pthread_create(&p->thread, NULL, packer_thread, p) != 0)
    rc = CPH_EIO;
  if (rc != CPH_OK) {
    cph_wake_free(&p->wake);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return rc;
  }
  *out = p;
  return CPH_OK;
}

bool cph_statezip_packer_submit(cph_statezip_packer *p, cph_statezip_job *job) {
  if (!p)
    return false;
  pthread_mutex_lock(&p->mu);
  bool ok = !p->stopping;
  if (ok) {
    append(&p->todo, &p->todo_tail, job);
    pthread_cond_signal(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return ok;
}

void cph_statezip_packer_stop(cph_statezip_packer *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stopping = true;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->thread, NULL);
  for (cph_statezip_job *job = p->done; job; job = job->next) {
    free(job->out);
    job->out = NULL;
  }
  cph_wake_free(&p->wake);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}
