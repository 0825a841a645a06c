/* cephalon-bench: closed-loop load from N client threads (load.h). */
#include "load.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

/* Latency histogram: log2 groups of 32 linear sub-buckets over nanoseconds (about 3%
 * resolution), up to 2^40 ns. */
#define SUB_BITS 5
#define SUB (1 << SUB_BITS)
#define N_BUCKETS ((40 - SUB_BITS + 1) * SUB)

enum { PHASE_WARMUP, PHASE_MEASURE, PHASE_STOP };

typedef struct worker {
  const cph_bench_load *l;
  void *state;
  atomic_int *phase;
  pthread_t thread;
  uint64_t ops, errors, max_ns;
  uint32_t hist[N_BUCKETS];
} worker;

static atomic_bool g_stopping;

bool cph_bench_load_stopping(void) { return atomic_load(&g_stopping); }

static int bucket_of(uint64_t ns) {
  if (ns < SUB)
    return (int)ns;
  int msb = 63 - __builtin_clzll(ns);
  if (msb >= 40)
    return N_BUCKETS - 1;
  int group = msb - SUB_BITS + 1;
  int sub = (int)((ns >> (msb - SUB_BITS)) & (SUB - 1));
  return group * SUB + sub;
}

/* The lower bound of a bucket, in ns. */
static uint64_t bucket_value(int b) {
  int group = b / SUB, sub = b % SUB;
  if (group == 0)
    return (uint64_t)sub;
  int msb = group + SUB_BITS - 1;
  return ((uint64_t)1 << msb) | ((uint64_t)sub << (msb - SUB_BITS));
}

static void *worker_main(void *arg) {
  worker *w = arg;
  const cph_bench_load *l = w->l;
  for (uint64_t seq = 0; !l->max_ops_per_client || seq < l->max_ops_per_client; seq++) {
    int before = atomic_load_explicit(w->phase, memory_order_acquire);
    if (before == PHASE_STOP)
      break;
    int64_t t0 = cph_bench_now_ns();
    if (l->op(w->state, seq)) {
      w->errors++;
      break;
    }
    int64_t t1 = cph_bench_now_ns();
    if (before == PHASE_MEASURE &&
        atomic_load_explicit(w->phase, memory_order_acquire) == PHASE_MEASURE) {
      uint64_t ns = (uint64_t)(t1 - t0);
      w->ops++;
      w->hist[bucket_of(ns)]++;
      if (ns > w->max_ns)
        w->max_ns = ns;
    }
  }
  return NULL;
}

static void sleep_ns(int64_t ns) {
  if (ns <= 0)
    return;
  struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  nanosleep(&ts, NULL);
}

int cph_bench_load_run(const cph_bench_load *l, cph_bench_load_result *out) {
  memset(out, 0, sizeof *out);
  worker *ws = calloc((size_t)l->clients, sizeof *ws);
  if (!ws)
    return -1;
  atomic_int phase = PHASE_WARMUP;
  atomic_store(&g_stopping, false);
  int started = 0, rc = 0;
  for (int i = 0; i < l->clients; i++) {
    ws[i].l = l;
    ws[i].phase = &phase;
    if (l->setup(l->ctx, i, &ws[i].state)) {
      fprintf(stderr, "cephalon-bench: client %d could not set up\n", i);
      rc = -1;
      goto out;
    }
    started = i + 1;
  }
  for (int i = 0; i < l->clients; i++)
    if (pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]) != 0) {
      atomic_store(&phase, PHASE_STOP);
      for (int j = 0; j < i; j++)
        pthread_join(ws[j].thread, NULL);
      rc = -1;
      goto out;
    }
  sleep_ns((int64_t)(l->warmup_s * 1e9));
  if (l->window)
    l->window(l->ctx, false);
  atomic_store(&phase, PHASE_MEASURE);
  int64_t t0 = cph_bench_now_ns();
  int64_t end = t0 + (int64_t)(l->seconds * 1e9);
  while (cph_bench_now_ns() < end)
    sleep_ns(10000000 < end - cph_bench_now_ns() ? 10000000 : end - cph_bench_now_ns());
  atomic_store(&phase, PHASE_STOP);
  atomic_store(&g_stopping, true);
  int64_t t1 = cph_bench_now_ns();
  if (l->window)
    l->window(l->ctx, true);
  for (int i = 0; i < l->clients; i++)
    pthread_join(ws[i].thread, NULL);

  static uint64_t hist[N_BUCKETS];
  memset(hist, 0, sizeof hist);
  uint64_t max_ns = 0;
  for (int i = 0; i < l->clients; i++) {
    out->ops += ws[i].ops;
    out->errors += ws[i].errors;
    for (int b = 0; b < N_BUCKETS; b++)
      hist[b] += ws[i].hist[b];
    if (ws[i].max_ns > max_ns)
      max_ns = ws[i].max_ns;
  }
  out->seconds = (double)(t1 - t0) / 1e9;
  out->ops_per_s = out->seconds > 0 ? (double)out->ops / out->seconds : 0;
  uint64_t seen = 0, p50 = (out->ops + 1) / 2, p99 = out->ops - out->ops / 100;
  bool have50 = false;
  for (int b = 0; b < N_BUCKETS && out->ops; b++) {
    seen += hist[b];
    if (!have50 && seen >= p50) {
      out->lat_p50_us = (double)bucket_value(b) / 1e3;
      have50 = true;
    }
    if (seen >= p99) {
      out->lat_p99_us = (double)bucket_value(b) / 1e3;
      break;
    }
  }
  out->lat_max_us = (double)max_ns / 1e3;
out:
  for (int i = 0; i < started; i++)
    if (l->teardown)
      l->teardown(ws[i].state);
  free(ws);
  return rc;
}
