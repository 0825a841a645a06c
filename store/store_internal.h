/* Private to store/. */
#ifndef CEPHALON_STORE_INTERNAL_H
#define CEPHALON_STORE_INTERNAL_H

#include <lmdb.h>

#include "store.h"

#define CPH_META_SCHEMA_KEY "schema_version"

/* One id counter of meta's "next_id" family, cached (txn.c). `next` is the next id to hand
 * out as the open write txn chain sees it; meta holds it only from the top-level commit on. */
typedef struct cph_counter {
  char *name;
  uint64_t next;
  const cph_txn *owner; /* innermost open txn holding an undo record for it, NULL none */
} cph_counter;

/* The counters looked up since the last eviction: open addressing, linear probing. */
typedef struct cph_counter_table {
  cph_counter **slots;
  size_t cap, len; /* cap a power of two (or 0), len < cap * 3/4 */
} cph_counter_table;

struct cph_store {
  MDB_env *env;
  MDB_dbi dbi[CPH_DB_COUNT];
  char *dir;
  int lock_fd;
  cph_sync_mode sync;
  cph_counter_table counters;
  /* cph_txn_put_record's encoding space, kept between calls (no malloc per record). Only a
   * write txn encodes, and LMDB lets one write txn chain exist at a time, so one is enough. */
  cph_buf scratch;
};

/* Records up to this size reuse the scratch space; a larger one frees it afterwards. */
#define CPH_STORE_SCRATCH_KEEP (64u << 10)

void cph_counters_free(cph_counter_table *ct);

#endif
