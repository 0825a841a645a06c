/* Private to store/. */
#ifndef CEPHALON_STORE_INTERNAL_H
#define CEPHALON_STORE_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

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

/* Where a record begins in the log: its file and offset. */
typedef struct cph_wal_pos {
  unsigned file;
  off_t off;
} cph_wal_pos;

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

  /* Held by a top-level write txn from its begin to its end (after its log record is
   * written): the log's record buffer belongs to the one write txn chain, and commits reach
   * the log in the order they land, whichever thread writes. */
  pthread_mutex_t write_mu;
  struct cph_wal *wal; /* the write-ahead log of :always (wal.c); allocated at open */

  /* The span (store.h; span.c). Writer thread only. */
  bool span_on;      /* asked for (cph_store_span_enable); used only while the log is on */
  bool span_open;
  cph_txn span;
  pthread_t span_thread; /* the writer thread: reads there go through the span */
  uint64_t span_base;    /* commit_seq when it began: LMDB holds every commit up to it */
  size_t span_bytes;     /* log bytes its passes wrote */
  /* A span whose commit failed: its passes' records, commits span_base+1 .. replay_last,
   * start at replay_at in the log, and wait to be applied again (cph_store_span_replay). */
  bool replay_pending;
  uint64_t replay_first, replay_last;
  /* After a replay that failed: no pass begins another before replay_retry_ns (monotonic);
   * the wait doubles from SPAN_REPLAY_BACKOFF_MIN_MS up to _MAX_MS (span.c); a pass begun
   * before fails with the last attempt's error (replay_rc, replay_err). */
  int64_t replay_retry_ns, replay_backoff_ns;
  int replay_rc;
  cph_err replay_err;
  bool span_commit_fails; /* tests: the next span commit fails (its LMDB txn aborted) */
  cph_wal_pos span_at, replay_at;
};

/* ---- the write-ahead log (wal.c; the file's head comment says how it works) ----
 * All run on the writer thread (holding write_mu, or at open/close) except cph_wal_sync and
 * cph_wal_on, which any thread may call. */
/* ---- the span (span.c; store.h) ---- writer thread
 * cph_txn_begin's top-level begin without the span; whether write begins go into the span;
 * a pass begun in it (a child of the span, which begins first when none is open; a replay
 * that waits runs first); a read through the open span chain (false: none here, read a
 * snapshot); a pass landed in it with its record of `bytes`. */
int cph_txn_begin_top(cph_store *s, bool write, cph_txn *t);
/* Whether the log is kept: under :always, and for the span in every mode. */
bool store_log_wanted(const cph_store *s);
bool cph_span_wanted(const cph_store *s);
int cph_span_begin_pass(cph_store *s, cph_txn *t);
bool cph_span_view(cph_store *s, cph_txn *t);
void cph_span_pass_landed(cph_store *s, size_t bytes);

#define CPH_WAL_PUT 1
#define CPH_WAL_DEL 2
#define CPH_WAL_EMPTY 3
int cph_wal_init(cph_store *s, cph_err *err);
void cph_wal_free(cph_store *s);
/* Open, before mdb_env_open: a `checkpoint` in the data dir is read (a damaged one is an
 * error naming it) and its meta pages written back into data.mdb. */
int cph_wal_restore(cph_store *s, cph_err *err);
/* Right after mdb_env_open: pins the restored snapshot while the recovery writes. */
int cph_wal_pin_recovery(cph_store *s, cph_err *err);
/* After the databases are open, before migrations: applies the log's commits after the
 * checkpoint; outside :always then flushes the data file and drops the checkpoint. */
int cph_wal_replay(cph_store *s, cph_err *err);
/* Turns the log on (entering :always, or at the end of an :always open): log files created
 * if missing, LMDB set to MDB_NOSYNC, a first checkpoint written before it returns. */
int cph_wal_start(cph_store *s, cph_err *err);
/* Turns it off (leaving :always, clean close): the data file flushed, `checkpoint` removed. */
int cph_wal_stop(cph_store *s, cph_err *err);
bool cph_wal_on(const cph_store *s);
/* Tests: the least time between checkpoints (wal.c's CHECKPOINT_MS otherwise). */
void cph_wal_set_checkpoint_ms(cph_store *s, long ms);
/* The write txn chain's record buffer: an op appended (CPH_ENOMEM, CPH_ELIMIT), its length
 * (a child's mark), cut back to a mark (an aborted child; 0: all), emptied. */
int cph_wal_record(cph_store *s, int op, cph_db db, const void *k, size_t klen, const void *v,
                   size_t vlen);
size_t cph_wal_mark(const cph_store *s);
void cph_wal_cut(cph_store *s, size_t mark);
void cph_wal_discard(cph_store *s);
/* A top-level commit that changed something landed in LMDB: its record written to the log,
 * then commit_seq bumped; maybe a checkpoint started. */
void cph_wal_commit(cph_store *s);
/* The span (store.h): where the next record goes; a pass landed in the span (its record
 * written and numbered, no checkpoint: LMDB has not committed it; returns its bytes); the
 * span committed in LMDB (no record of its own: its counters are in its passes'; maybe a
 * checkpoint); the
 * records of commits first..last from `at` applied again in one top-level LMDB txn (a span
 * whose commit failed). */
cph_wal_pos cph_wal_pos_next(const cph_store *s);
size_t cph_wal_commit_pass(cph_store *s);
void cph_wal_span_end(cph_store *s);
int cph_wal_replay_span(cph_store *s, cph_wal_pos at, uint64_t first, uint64_t last,
                        cph_err *err);
/* The map is full (cph_store_grow, writer thread, no txn open): when the checkpoint pins
 * hold pages freed since an older commit, a checkpoint of the current commit is written now
 * and the older pins released, and CPH_EBUSY says to apply the write again (map_full
 * cleared). CPH_OK when there is nothing to release, or it was done for the last full map
 * already with nothing committed since: grow instead. Another code: the checkpoint failed. */
int cph_wal_make_room(cph_store *s, cph_err *err);
/* Pages LMDB freed that a checkpoint pin keeps from reuse (until the next checkpoint): the
 * free list's records from the oldest pin's txn on, or the most counted over the last few
 * seconds if more (wal.c). 0 with the log off. O(records). Writer thread. */
size_t cph_wal_held_pages(cph_store *s);
/* Flushes the log files that may hold commits up to commit_seq, then notes them durable. */
int cph_wal_sync(cph_store *s, cph_err *err);

/* Records up to this size reuse the scratch space; a larger one frees it afterwards. */
#define CPH_STORE_SCRATCH_KEEP (64u << 10)

void cph_counters_free(cph_counter_table *ct);

/* Raises durable_seq to at least seq, unless a flush failed (env.c). Any thread. */
void cph_store_note_durable(cph_store *s, uint64_t seq);

#endif
