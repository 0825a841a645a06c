/* Private to store/. */
#ifndef CEPHALON_STORE_INTERNAL_H
#define CEPHALON_STORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>

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
#define CPH_COUNTER_MEMO 8

typedef struct cph_counter_table {
  cph_counter **slots;
  size_t cap, len; /* cap a power of two (or 0), len < cap * 3/4 */
  /* The counters found last, by the address of the name they were asked by: an ingested event
   * takes ids from four counters, named by literals or by one buffer, so the same address asks
   * again and only a strcmp confirms it (no hash of the name). Counters are never freed one by
   * one, and cph_counters_free empties this too. */
  struct {
    const char *asked;
    cph_counter *c;
  } memo[CPH_COUNTER_MEMO];
} cph_counter_table;

struct cph_store {
  MDB_env *env;
  MDB_dbi dbi[CPH_DB_COUNT];
  char *dir;
  int lock_fd;
  cph_sync_mode sync;
  cph_counter_table counters;
  /* cph_txn_put_record's encoding space for records over CPH_RECORD_SMALL bytes (smaller
   * ones are encoded on the stack), kept between calls: no malloc per record. Only a write txn
   * encodes, and LMDB lets one write txn chain exist at a time, so one is enough. */
  uint8_t *scratch;
  size_t scratch_cap;

  /* Durability (store.h). The writer thread bumps commit_seq; durable_seq, fsyncs and the
   * flush error are also written by the flusher thread, so all of them are atomics. */
  int fd; /* the data file (mdb_env_get_fd): what cph_store_sync flushes, from any thread */
  _Atomic uint64_t commit_seq, durable_seq, fsyncs;
  _Atomic int flush_failed;  /* CPH_OK, or the code of the first failed flush (sticky) */
  char flush_msg[256];       /* its message: written once, before flush_failed is set */
  pthread_mutex_t flush_mu;  /* guards the flusher's fields below and flush_msg's writing */
  struct cph_flusher *flusher; /* flush.c; NULL when none runs */

  /* Map growth (store.h). open_txns counts top-level transactions and copies in progress:
   * LMDB may remap only when there are none. map_full: a write found the map full. */
  _Atomic int open_txns;
  _Atomic bool map_full;
};

/* Records up to this size reuse the scratch space; a larger one frees it afterwards. */
#define CPH_STORE_SCRATCH_KEEP (64u << 10)

void cph_counters_free(cph_counter_table *ct);

/* Raises durable_seq to at least seq, unless a flush failed (env.c). Any thread. */
void cph_store_note_durable(cph_store *s, uint64_t seq);

#endif
