/* The request threads' hand-off (server/offload.c over server/wake.c): every job a pool
 * takes is worked on a pool thread and then done on the loop exactly once, however the
 * jobs bunch up — the loop is woken once per batch of finished jobs, and a wake skipped
 * because one is pending must never strand a job. And at stop, every job still held is
 * ended on the loop: worked ones done, unworked ones cancelled (or worked there) then done. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <event2/event.h>

#include "server/offload.h"
#include "server/request.h"
#include "server/server.h"

#define JOBS 20000

typedef struct job {
  bool worked_on_thread; /* work ran on a pool thread, not the loop */
  int worked, done, cancelled;
} job;

typedef struct run {
  cph_srv srv;
  cph_offload_pool *pool;
  pthread_t loop_thread;
  job *jobs;
  cph_req *reqs;
  size_t n, submitted, taken, finished;
  uint64_t seed;
  struct event *feeder, *deadline;
  bool timed_out;
} run;

static run *g_run;

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void work(cph_req *r, void *arg, cph_event_hasher *h) {
  (void)r;
  (void)h;
  job *j = arg;
  j->worked++;
  j->worked_on_thread = !pthread_equal(pthread_self(), g_run->loop_thread);
  if (next_rand(&(uint64_t){(uintptr_t)arg}) % 64 == 0)
    usleep(50); /* now and then a slow one, so finished jobs pile up behind it */
}

static void done(cph_req *r, void *arg) {
  (void)r;
  job *j = arg;
  j->done++;
  assert_true(pthread_equal(pthread_self(), g_run->loop_thread));
  if (++g_run->finished == g_run->n)
    event_base_loopbreak(g_run->srv.base);
}

static void cancel(cph_req *r, void *arg) {
  (void)r;
  ((job *)arg)->cancelled++;
}

static const cph_offload_fns fns = {work, done, cancel};

/* Hands the pool a burst of jobs, as a loop round of requests would; what the pool does not
 * take (queue full) the loop works and ends itself, as the routes do. */
static void feed(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  run *rn = arg;
  size_t burst = 1 + next_rand(&rn->seed) % 96;
  for (size_t b = 0; b < burst && rn->submitted < rn->n; b++) {
    size_t i = rn->submitted++;
    if (cph_offload_take(rn->pool, &rn->reqs[i], &fns, &rn->jobs[i])) {
      rn->taken++;
    } else {
      work(&rn->reqs[i], &rn->jobs[i], NULL);
      done(&rn->reqs[i], &rn->jobs[i]);
    }
  }
  if (rn->submitted < rn->n) {
    struct timeval tv = {0, (suseconds_t)(next_rand(&rn->seed) % 3 == 0 ? 200 : 0)};
    event_add(rn->feeder, &tv);
  }
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  run *rn = arg;
  rn->timed_out = true;
  event_base_loopbreak(rn->srv.base);
}

static void run_init(run *rn, size_t n, int threads, uint64_t seed) {
  memset(rn, 0, sizeof *rn);
  g_run = rn;
  rn->srv.base = event_base_new();
  assert_non_null(rn->srv.base);
  rn->loop_thread = pthread_self();
  rn->n = n;
  rn->seed = seed;
  rn->jobs = calloc(n, sizeof *rn->jobs);
  rn->reqs = calloc(n, sizeof *rn->reqs);
  assert_non_null(rn->jobs);
  assert_non_null(rn->reqs);
  assert_int_equal(cph_offload_start(&rn->srv, threads, "test", &rn->pool), CPH_OK);
}

static void run_free(run *rn) {
  if (rn->feeder)
    event_free(rn->feeder);
  if (rn->deadline)
    event_free(rn->deadline);
  event_base_free(rn->srv.base);
  free(rn->jobs);
  free(rn->reqs);
}

/* 20,000 jobs in bursts of 1-96 from the loop, with one and with two threads: each is worked
 * once and done once, on the loop, and the loop gets them all without a wake from anywhere
 * else (a stranded job would leave the loop waiting until the deadline). */
static void test_every_taken_job_is_done_once_on_the_loop(void **state) {
  (void)state;
  for (int threads = 1; threads <= 2; threads++) {
    run rn;
    run_init(&rn, JOBS, threads, 0x5eed0ff1 + (uint64_t)threads);
    rn.feeder = evtimer_new(rn.srv.base, feed, &rn);
    rn.deadline = evtimer_new(rn.srv.base, on_deadline, &rn);
    struct timeval zero = {0, 0}, limit = {30, 0};
    event_add(rn.feeder, &zero);
    event_add(rn.deadline, &limit);
    event_base_dispatch(rn.srv.base);
    if (rn.timed_out)
      fail_msg("%d thread(s): %zu of %zu jobs done after 30 s (%zu taken by the pool)", threads,
               rn.finished, rn.n, rn.taken);
    assert_true(rn.taken > rn.n / 2); /* the pool did take most of them */
    size_t on_thread = 0;
    for (size_t i = 0; i < rn.n; i++) {
      if (rn.jobs[i].worked != 1 || rn.jobs[i].done != 1 || rn.jobs[i].cancelled != 0)
        fail_msg("%d thread(s): job %zu worked %d, done %d, cancelled %d times", threads, i,
                 rn.jobs[i].worked, rn.jobs[i].done, rn.jobs[i].cancelled);
      on_thread += rn.jobs[i].worked_on_thread;
    }
    assert_int_equal(on_thread, rn.taken);
    cph_offload_stop(rn.pool);
    run_free(&rn);
  }
}

/* Stopping with jobs held: those queued are cancelled and done, those worked are done, each
 * once, on the stopping thread (the loop's). */
static void test_stop_ends_every_held_job(void **state) {
  (void)state;
  run rn;
  run_init(&rn, 64, 1, 7);
  size_t taken = 0;
  for (size_t i = 0; i < rn.n; i++)
    taken += cph_offload_take(rn.pool, &rn.reqs[i], &fns, &rn.jobs[i]);
  assert_true(taken > 0);
  rn.n = taken; /* the loop never runs: done is called by the stop */
  cph_offload_stop(rn.pool);
  for (size_t i = 0; i < taken; i++) {
    job *j = &rn.jobs[i];
    assert_int_equal(j->done, 1);
    assert_int_equal(j->worked + j->cancelled, 1);
  }
  assert_int_equal(rn.finished, taken);
  run_free(&rn);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_taken_job_is_done_once_on_the_loop),
      cmocka_unit_test(test_stop_ends_every_held_job),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
