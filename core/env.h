/* What the engine hands every module of core/: the layers below core (store, policy,
 * scheduler, clock, providers) and the pass's write transaction. Private to core/.
 *
 * The engine (engine.c) owns it and is its only writer: it replaces the policy on reload
 * (between passes), rebuilds the scheduler with memory after a failed commit, and opens and
 * commits txn around each pass. Modules keep a pointer to it and read it; they never keep a
 * copy of a field, since each may change between passes. The clock is one value every module
 * reads through env_now(): no module asks a sibling for the time. */
#ifndef CEPHALON_CORE_ENV_H
#define CEPHALON_CORE_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "lanes/sched.h"
#include "store/store.h"

struct cph_providers;

typedef struct cph_core_env {
  cph_policy *policy; /* the current policy */
  uint64_t policy_generation;
  cph_store *store;
  const char *data_dir;
  const cph_clock *clock;             /* the engine clock (monotonic, or a test's virtual clock) */
  int64_t wall_base_ms, wall_base_ns; /* env_wall_ms(): the wall time at open, engine clock */
  const struct cph_providers *providers; /* given at open; NULL = none */
  cph_sched *sched;                      /* the scheduler of the sessions in memory */
  cph_txn txn;                           /* the pass's write transaction: open only inside a pass */
  /* Completions and session deletes name the events they consumed (cluster mode's done marks,
   * cph_engine_report_consumed): off on a single node, where nothing of it is done. */
  bool report_consumed;
  /* Cluster mode (cph_engine_reply_origins): this node's name, which the origin of each reply
   * written here carries (core/replystream.h); NULL on a single node: no origins, no index. */
  char *reply_origin_node;
} cph_core_env;

static inline int64_t env_now(const cph_core_env *env) { return cph_clock_now(env->clock); }

/* Wall-clock milliseconds that advance with the engine clock: the real time at open plus
 * engine-clock time since (stored times, dedupe windows). */
static inline int64_t env_wall_ms(const cph_core_env *env) {
  return env->wall_base_ms + (cph_clock_now(env->clock) - env->wall_base_ns) / CPH_NS_PER_MS;
}

/* The room a full store keeps for leases, completions and maintenance (DESIGN §11: a full
 * disk fails ingest, not workers): 1/16 of the map, at least 8 MiB, at most half the map.
 * Ingest stops short of it, and so does what is optional, such as a kept turn context. A
 * completion of a full 64-message turn writes some 100 KiB, copies on write included. */
static inline size_t env_write_reserve(size_t map) {
  size_t reserve = map / 16, floor = (size_t)8 << 20;
  if (reserve < floor)
    reserve = floor < map / 2 ? floor : map / 2;
  return reserve;
}

#endif
