/* The public API of the Cephalon engine. The daemon, the CLI, tests and benches use only
 * this header (and the others in include/cephalon/).
 *
 * Step 1 scope: an engine owns the policy in force and the LMDB store. Later steps add
 * sessions, ingest, turns, context and maintenance to this same handle. */
#ifndef CEPHALON_CEPHALON_H
#define CEPHALON_CEPHALON_H

#include <stdbool.h>
#include <stdint.h>

#include "cephalon/error.h"
#include "cephalon/lane.h"
#include "cephalon/policy.h"

typedef struct cph_engine cph_engine;

typedef struct cph_engine_options {
  const char *data_dir; /* overrides :server :data-dir when non-NULL */
} cph_engine_options;

/* Opens the engine on a policy. The engine takes ownership of policy (also on failure).
 * Errors name what failed and where (data dir, schema version, storage full). */
int cph_engine_open(cph_policy *policy, const cph_engine_options *opts, cph_engine **out,
                    cph_err *err);
void cph_engine_close(cph_engine *e);

/* Swaps in a new policy (takes ownership). Settings that need a restart (data dir, map
 * size) keep their old values until then; the result says so in err->msg with CPH_OK. */
int cph_engine_reload(cph_engine *e, cph_policy *policy, cph_err *err);

const cph_policy *cph_engine_policy(const cph_engine *e);
/* Increments with every successful reload; 1 after open. */
uint64_t cph_engine_policy_generation(const cph_engine *e);

typedef struct cph_engine_storage {
  uint64_t map_size_bytes;
  uint64_t used_bytes;
} cph_engine_storage;
int cph_engine_storage_stats(cph_engine *e, cph_engine_storage *out);

#endif
