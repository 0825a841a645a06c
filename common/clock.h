/* The one clock interface (STYLE: time comes from one place so tests and simulations can run
 * a virtual clock). Time is int64 nanoseconds on a monotonic scale; the origin is arbitrary,
 * so only differences mean anything. Wall-clock timestamps for records come from
 * cph_wall_ms(), which is not used for scheduling. */
#ifndef CEPHALON_COMMON_CLOCK_H
#define CEPHALON_COMMON_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define CPH_NS_PER_MS INT64_C(1000000)
#define CPH_NS_PER_S INT64_C(1000000000)

typedef struct cph_clock {
  bool is_virtual;
  int64_t virtual_ns; /* the current time of a virtual clock */
} cph_clock;

static inline void cph_clock_init_monotonic(cph_clock *c) {
  c->is_virtual = false;
  c->virtual_ns = 0;
}

static inline void cph_clock_init_virtual(cph_clock *c, int64_t start_ns) {
  c->is_virtual = true;
  c->virtual_ns = start_ns;
}

/* The monotonic time now. For what measures real time and is never simulated (the cluster's
 * threads and timers, the worker's deadlines); what a test may run on a virtual clock takes a
 * cph_clock instead. */
static inline int64_t cph_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * CPH_NS_PER_S + ts.tv_nsec;
}

static inline int64_t cph_mono_ms(void) { return cph_mono_ns() / CPH_NS_PER_MS; }

static inline int64_t cph_clock_now(const cph_clock *c) {
  return c->is_virtual ? c->virtual_ns : cph_mono_ns();
}

/* Virtual clocks only; time never goes backwards (a negative step is ignored). */
static inline void cph_clock_advance(cph_clock *c, int64_t ns) {
  if (c->is_virtual && ns > 0)
    c->virtual_ns += ns;
}

/* Milliseconds since the Unix epoch, for timestamps stored in records. */
static inline int64_t cph_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "HH:MM" (UTC) of a wall-clock time in ms, as turn inputs show times to the model ("--:--"
 * for a time gmtime cannot break down). */
static inline void cph_hhmm_utc(int64_t ms, char out[8]) {
  time_t secs = (time_t)(ms / 1000);
  struct tm tm;
  if (!gmtime_r(&secs, &tm))
    snprintf(out, 8, "--:--");
  else
    snprintf(out, 8, "%02d:%02d", tm.tm_hour % 100, tm.tm_min % 100);
}

#endif
