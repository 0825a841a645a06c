/* The write-ahead log of :sync :always (contract in store.h, "durability"; README "Storage").
 *
 * While the log is on, LMDB commits with MDB_NOSYNC: a commit writes its pages and its meta
 * page to the page cache and flushes nothing. What makes a commit durable is its record in
 * the log: every put, delete and empty of the txn, in order, written with one pwrite after
 * the LMDB commit and before the commit is numbered, and made durable by a flush of the log
 * file (sequential pages of one file, not ~40 pages scattered over the data file).
 *
 * The data file alone may be anything after a machine crash (a meta page may have reached
 * the disk before the pages it points to). A checkpoint makes it usable again: at a commit T
 * the writer thread copies the two meta pages of data.mdb and begins a read txn on snapshot
 * T (the pin: LMDB reuses no page of T while it is open, so T's pages stay on disk as they
 * were); a checkpoint thread flushes the data file (T's pages are then on disk) and writes
 * the meta copy to `checkpoint` (tmp + flush + rename + dir flush). From then on the data
 * file holds T whatever happens later: recovery writes the copied meta pages back at offset
 * 0, LMDB opens T (pages written after T are free space to it), and the log's records after
 * T are applied again. The previous pin is released once a newer checkpoint is on disk.
 *
 * Log files: LOG_FILES files wal.0.. of LOG_FILE_BYTES, pre-zeroed and flushed when created,
 * reused round robin from offset 0 (a flush of a file whose size does not change commits no
 * file-system metadata). Each checkpoint switches to the next file; the checkpoint names the
 * file commits after T went to. A record is [u32 len][u32 crc][u64 seq][len bytes]: it is
 * valid when its crc matches and seq is exactly the next one; records left from an earlier
 * round of the file fail the seq check, records of an earlier run of the log (the seqs start
 * again) fail the crc, which covers the run's random salt (kept in the checkpoint) too.
 *
 * Threads: the writer thread records, writes records, starts checkpoints; the flusher (or
 * any thread) calls cph_wal_sync; the checkpoint thread does the rest. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/log.h"
#include "store_internal.h"

/* Three files: commits after the durable checkpoint's T are in its file and the next, and
 * the file after those is free to be overwritten (one checkpoint in flight at a time). */
#define LOG_FILES 3
/* Pre-zeroed size: ~100 ms of :always commits at ~10 KB each fits many times over. A record
 * that does not fit grows the file (the flush then commits the new size too). */
#define LOG_FILE_BYTES (16u << 20)
/* The least time between two checkpoint starts. Each checkpoint flushes every data page
 * written since the last one; measured (/work/notes/wal-proto.md, bench/PROFILE.md "Fewer
 * syncs per cycle"): 20 ms gave ~765 cycles/s, 100 ms ~980, because fewer, larger data
 * flushes delay fewer log flushes queued behind them on the one disk, and a pinned snapshot
 * held longer makes LMDB rewrite fewer pages per cycle. Longer costs a longer replay after a
 * crash (up to ~2 intervals of commits) and a data file that grows while a pin is held. */
#define CHECKPOINT_MS 100

/* How long cph_wal_held_pages remembers its highest count (why: there). */
#define HELD_PEAK_MS 10000

#define CKPT_MAGIC "CPHCKPT1"
#define CKPT_VERSION 1u
#define REC_HEAD 16 /* u32 len, u32 crc, u64 seq */
#define OP_HEAD 8   /* u8 op, u8 db, u16 key len, u32 val len */
/* A record buffer larger than this shrinks after its commit; up to it, it is kept: an ingest
 * pass records a few MB, and growing the buffer to that again each pass (realloc copies and
 * page faults) cost ingest ~2 µs of CPU per event. */
#define BUF_KEEP (32u << 20)
#define BUF_MIN 16384u

typedef struct ckpt_job {
  /* Whether it flushes the data file and its own file: not under :none, whose log (kept for
   * the span, store.h) promises a process crash nothing lost, not a machine crash. */
  bool flush;
  uint8_t *meta; /* the two meta pages of data.mdb as of T */
  MDB_txn *pin;  /* read txn on snapshot T */
  uint64_t seq;  /* T */
  unsigned file; /* where commits after T go */
} ckpt_job;

typedef struct cph_wal {
  _Atomic bool on; /* records commits (:always, started); read by cph_store_sync's thread */
  /* The record buffer of the open write txn chain: the frame header's room, then the ops.
   * Writer thread only. */
  uint8_t *buf;
  size_t len, cap;
  uint64_t salt; /* this run of the log */
  unsigned page; /* LMDB's page size: the meta pages are 2 of it */
  int fds[LOG_FILES];

  pthread_mutex_t mu; /* cur, off, dirty, the checkpoint hand-off below */
  pthread_mutex_t sync_mu; /* one cph_wal_sync at a time (each clears the dirty bits) */
  unsigned cur;  /* the file records go to */
  off_t off;     /* where the next record goes in it (writer thread) */
  unsigned dirty; /* bit per file: written since its last flush */

  /* checkpoints */
  long interval_ms;
  struct timespec last_start;
  bool broken; /* a checkpoint failed: no more switches (the durable one needs its files) */
  pthread_t thread;
  bool thread_on;
  pthread_cond_t cv;
  bool has_job, in_flight, stopping;
  ckpt_job job;
  MDB_txn *pin; /* the pin of the newest checkpoint on disk (checkpoint thread once started) */
  uint64_t pin_seq; /* its T */
  _Atomic uint64_t pin_txnid; /* its LMDB txn id, 0 when none: the oldest pin held */
  size_t held_peak; /* cph_wal_held_pages: the most seen since held_peak_at */
  struct timespec held_peak_at;
  bool room_made; /* the last cph_wal_make_room released pages: the next one does not */

  /* recovery: the checkpoint read at open, until the log starts or the store closes */
  bool recovering;
  ckpt_job rec;
  char **rec_names; /* the checkpoint's database name table */
  unsigned rec_ndb;
} cph_wal;

static void path_of(const cph_store *s, const char *name, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", s->dir, name);
}

static void log_path(const cph_store *s, unsigned i, char *out, size_t cap) {
  snprintf(out, cap, "%s/wal.%u", s->dir, i);
}

static int fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int e = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return e;
}

static int write_all(int fd, const void *p, size_t n, off_t off) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = pwrite(fd, b, n, off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return errno;
    b += w;
    n -= (size_t)w;
    off += w;
  }
  return 0;
}

static int read_all(int fd, void *p, size_t n, off_t off) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = pread(fd, b, n, off);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return errno;
    if (r == 0)
      return EIO; /* short */
    b += r;
    n -= (size_t)r;
    off += r;
  }
  return 0;
}

/* A log or checkpoint failure: sticky, as a failed flush (store.h): what the log holds can no
 * longer be vouched for, so nothing more is acknowledged as durable. */
static void wal_fail(cph_store *s, const char *what, int e) {
  pthread_mutex_lock(&s->flush_mu);
  if (atomic_load(&s->flush_failed) == CPH_OK) {
    snprintf(s->flush_msg, sizeof s->flush_msg,
             "data dir '%s': flushing to disk failed (%s): %s; what was written since the last "
             "good flush may "
             "not be on disk, and nothing more is acknowledged as stored until cephalond "
             "restarts",
             s->dir, what, strerror(e));
    atomic_store(&s->flush_failed, cph_store_map_error(e) ? cph_store_map_error(e) : CPH_EIO);
  }
  pthread_mutex_unlock(&s->flush_mu);
  cph_error("data dir '%s': flushing to disk failed (%s): %s", s->dir, what, strerror(e));
}

static uint32_t rec_crc(uint64_t salt, uint64_t seq, const uint8_t *body, size_t n) {
  uint8_t head[16];
  memcpy(head, &salt, 8);
  memcpy(head + 8, &seq, 8);
  uLong c = crc32(0L, head, sizeof head);
  return n ? (uint32_t)crc32(c, body, (uInt)n) : (uint32_t)c; /* crc32(c, NULL, 0) is 0 */
}

static long ms_since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (now.tv_sec - t0->tv_sec) * 1000L + (now.tv_nsec - t0->tv_nsec) / 1000000L;
}

/* ---------------------------------------------------------------- lifetime */

int cph_wal_init(cph_store *s, cph_err *err) {
  cph_wal *w = calloc(1, sizeof *w);
  if (!w)
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening the store");
  if (!(w->buf = malloc(BUF_MIN))) {
    free(w);
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening the store");
  }
  w->cap = BUF_MIN;
  for (int i = 0; i < LOG_FILES; i++)
    w->fds[i] = -1;
  w->interval_ms = CHECKPOINT_MS;
  pthread_mutex_init(&w->mu, NULL);
  pthread_mutex_init(&w->sync_mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  s->wal = w;
  return CPH_OK;
}

void cph_wal_set_checkpoint_ms(cph_store *s, long ms) { s->wal->interval_ms = ms; }

bool cph_wal_on(const cph_store *s) { return s->wal && s->wal->on; }

static void rec_names_free(cph_wal *w) {
  for (unsigned i = 0; i < w->rec_ndb; i++)
    free(w->rec_names[i]);
  free(w->rec_names);
  w->rec_names = NULL;
  w->rec_ndb = 0;
}

static void recovery_end(cph_wal *w) {
  if (w->rec.pin)
    mdb_txn_abort(w->rec.pin);
  free(w->rec.meta);
  memset(&w->rec, 0, sizeof w->rec);
  rec_names_free(w);
  w->recovering = false;
}

void cph_wal_free(cph_store *s) {
  cph_wal *w = s->wal;
  if (!w)
    return;
  /* cph_wal_stop ran if the log was on; what is left is a recovery that did not finish (its
   * checkpoint stays for the next open) */
  recovery_end(w);
  if (w->pin)
    mdb_txn_abort(w->pin);
  for (int i = 0; i < LOG_FILES; i++)
    if (w->fds[i] >= 0)
      close(w->fds[i]);
  free(w->buf);
  pthread_mutex_destroy(&w->mu);
  pthread_mutex_destroy(&w->sync_mu);
  pthread_cond_destroy(&w->cv);
  free(w);
  s->wal = NULL;
}

/* ---------------------------------------------------------------- the record buffer */

int cph_wal_record(cph_store *s, int op, cph_db db, const void *k, size_t klen, const void *v,
                   size_t vlen) {
  cph_wal *w = s->wal;
  if (vlen > UINT32_MAX || klen > UINT16_MAX)
    return CPH_ELIMIT;
  size_t start = w->len ? w->len : REC_HEAD;
  size_t need = start + OP_HEAD + klen + vlen;
  if (need > UINT32_MAX)
    return CPH_ELIMIT;
  if (need > w->cap) {
    size_t cap = w->cap ? w->cap : BUF_MIN;
    while (cap < need)
      cap *= 2;
    uint8_t *b = realloc(w->buf, cap);
    if (!b)
      return CPH_ENOMEM;
    w->buf = b;
    w->cap = cap;
  }
  uint8_t *p = w->buf + start;
  p[0] = (uint8_t)op;
  p[1] = (uint8_t)db;
  uint16_t kl = (uint16_t)klen;
  uint32_t vl = (uint32_t)vlen;
  memcpy(p + 2, &kl, 2);
  memcpy(p + 4, &vl, 4);
  if (klen)
    memcpy(p + OP_HEAD, k, klen);
  if (vlen)
    memcpy(p + OP_HEAD + klen, v, vlen);
  w->len = need;
  return CPH_OK;
}

size_t cph_wal_mark(const cph_store *s) { return s->wal ? s->wal->len : 0; }

void cph_wal_cut(cph_store *s, size_t mark) {
  cph_wal *w = s->wal;
  if (w && mark <= w->len)
    w->len = mark <= REC_HEAD ? 0 : mark;
}

static void buf_reset(cph_wal *w) {
  w->len = 0;
  uint8_t *b;
  if (w->cap > BUF_KEEP && (b = realloc(w->buf, BUF_MIN)) != NULL) {
    w->buf = b;
    w->cap = BUF_MIN;
  }
}

/* ---------------------------------------------------------------- commits and syncs */

static void maybe_checkpoint(cph_store *s);

/* Writes the record buffer as the next commit's record and numbers it; returns its bytes. */
static size_t record_write(cph_store *s) {
  cph_wal *w = s->wal;
  uint64_t seq = atomic_load(&s->commit_seq) + 1;
  if (w->len == 0) /* a txn that changed something records something: be safe anyway */
    w->len = REC_HEAD; /* the buffer always has room for the header (BUF_MIN) */
  uint32_t body = (uint32_t)(w->len - REC_HEAD);
  uint32_t crc = rec_crc(w->salt, seq, w->buf + REC_HEAD, body);
  memcpy(w->buf, &body, 4);
  memcpy(w->buf + 4, &crc, 4);
  memcpy(w->buf + 8, &seq, 8);
  int e = write_all(w->fds[w->cur], w->buf, w->len, w->off);
  if (e)
    wal_fail(s, "writing the log", e);
  w->off += (off_t)w->len;
  pthread_mutex_lock(&w->mu);
  w->dirty |= 1u << w->cur;
  pthread_mutex_unlock(&w->mu);
  /* Numbered only now: a sync that reads commit_seq finds this record written. */
  atomic_store(&s->commit_seq, seq);
  size_t bytes = w->len;
  buf_reset(w);
  return bytes;
}

void cph_wal_commit(cph_store *s) {
  record_write(s);
  maybe_checkpoint(s);
}

cph_wal_pos cph_wal_pos_next(const cph_store *s) {
  return (cph_wal_pos){s->wal->cur, s->wal->off};
}

/* No checkpoint here: its pin would be a snapshot without this pass (LMDB has not committed
 * the span), while the checkpoint would say it holds every commit numbered so far. */
size_t cph_wal_commit_pass(cph_store *s) { return record_write(s); }

void cph_wal_span_end(cph_store *s) {
  /* The span's own puts are its counters (txn.c counters_write), which its passes' records
   * carry already: no record, so commit numbers stay those of the passes. */
  buf_reset(s->wal);
  maybe_checkpoint(s);
}

void cph_wal_discard(cph_store *s) { buf_reset(s->wal); }

int cph_wal_sync(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  pthread_mutex_lock(&w->sync_mu);
  pthread_mutex_lock(&w->mu);
  /* Every commit numbered up to here has its record in a file whose bit is set, or in one a
   * sync before this one flushed. */
  uint64_t covered = atomic_load(&s->commit_seq);
  unsigned mask = w->dirty;
  w->dirty = 0;
  pthread_mutex_unlock(&w->mu);
  int e = 0;
  for (unsigned i = 0; i < LOG_FILES; i++) {
    if (!(mask & (1u << i)))
      continue;
    if (fdatasync(w->fds[i]) != 0 && !e)
      e = errno;
    atomic_fetch_add(&s->fsyncs, 1);
  }
  pthread_mutex_unlock(&w->sync_mu);
  if (e)
    wal_fail(s, "flushing the log", e);
  else
    cph_store_note_durable(s, covered);
  return cph_store_flush_error(s, err);
}

/* ---------------------------------------------------------------- checkpoints */

/* The checkpoint file: magic, version, page size, T, salt, the file of the commits after T,
 * the database name table (index -> name, so that another build maps records by name), the
 * two meta pages, then a crc of everything before it. */
static int ckpt_encode(const cph_store *s, const ckpt_job *j, uint8_t **out, size_t *len) {
  const cph_wal *w = s->wal;
  size_t n = 8 + 4 + 4 + 8 + 8 + 4 + 4 + 2 * (size_t)w->page + 4;
  for (int i = 0; i < CPH_DB_COUNT; i++)
    n += 1 + strlen(cph_db_name((cph_db)i));
  uint8_t *b = malloc(n), *p = b;
  if (!b)
    return ENOMEM;
  uint32_t u32;
  memcpy(p, CKPT_MAGIC, 8), p += 8;
  u32 = CKPT_VERSION, memcpy(p, &u32, 4), p += 4;
  memcpy(p, &w->page, 4), p += 4;
  memcpy(p, &j->seq, 8), p += 8;
  memcpy(p, &w->salt, 8), p += 8;
  memcpy(p, &j->file, 4), p += 4;
  u32 = CPH_DB_COUNT, memcpy(p, &u32, 4), p += 4;
  for (int i = 0; i < CPH_DB_COUNT; i++) {
    const char *name = cph_db_name((cph_db)i);
    size_t l = strlen(name);
    *p++ = (uint8_t)l;
    memcpy(p, name, l), p += l;
  }
  memcpy(p, j->meta, 2 * (size_t)w->page), p += 2 * (size_t)w->page;
  u32 = (uint32_t)crc32(0L, b, (uInt)(p - b));
  memcpy(p, &u32, 4), p += 4;
  *out = b;
  *len = (size_t)(p - b);
  return 0;
}

/* Makes j's snapshot the one a recovery starts from: the data file flushed (T's pages, which
 * the pin keeps from being overwritten, are then on disk), then the checkpoint file replaced
 * atomically. On success the pin of the previous checkpoint may go. */
static int ckpt_write(cph_store *s, const ckpt_job *j, const char **what) {
  char tmp[4200], fin[4200];
  path_of(s, "checkpoint.tmp", tmp, sizeof tmp);
  path_of(s, "checkpoint", fin, sizeof fin);
  *what = "flushing the data file for a checkpoint";
  int e = 0;
  if (j->flush) {
    e = fdatasync(s->fd) == 0 ? 0 : errno;
    atomic_fetch_add(&s->fsyncs, 1);
  }
  if (e)
    return e;
  uint8_t *b;
  size_t n;
  *what = "writing the checkpoint";
  if ((e = ckpt_encode(s, j, &b, &n)) != 0)
    return e;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    e = errno;
  else if ((e = write_all(fd, b, n, 0)) == 0 && j->flush && fdatasync(fd) != 0)
    e = errno;
  free(b);
  if (fd >= 0)
    close(fd);
  if (e)
    return e;
  *what = "renaming the checkpoint";
  if (rename(tmp, fin) != 0)
    return errno;
  *what = "flushing the data dir";
  return j->flush ? fsync_dir(s->dir) : 0;
}

static void *ckpt_main(void *arg) {
  cph_store *s = arg;
  cph_wal *w = s->wal;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->has_job && !w->stopping)
      pthread_cond_wait(&w->cv, &w->mu);
    if (!w->has_job)
      break;
    ckpt_job j = w->job;
    w->has_job = false;
    pthread_mutex_unlock(&w->mu);
    const char *what;
    int e = ckpt_write(s, &j, &what);
    free(j.meta);
    if (e) {
      /* The previous checkpoint stays the durable one: its pin stays, this one goes, and no
       * more files are switched (the next switch could overwrite the ones it needs). */
      wal_fail(s, what, e);
      mdb_txn_abort(j.pin);
    } else {
      if (w->pin)
        mdb_txn_abort(w->pin);
      w->pin = j.pin;
      atomic_store(&w->pin_txnid, (uint64_t)mdb_txn_id(j.pin));
      w->pin_seq = j.seq;
    }
    pthread_mutex_lock(&w->mu);
    if (e)
      w->broken = true;
    w->in_flight = false;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

/* Right after commit T on the writer thread (no other commit between): the meta pages as of
 * T, and the pin. LMDB wrote the meta page with pwrite (MDB_NOSYNC, no MDB_WRITEMAP), so
 * pread finds it in the page cache. */
static int ckpt_take(cph_store *s, ckpt_job *j, const char **what) {
  cph_wal *w = s->wal;
  memset(j, 0, sizeof *j);
  j->flush = s->sync != CPH_SYNC_NONE;
  j->seq = atomic_load(&s->commit_seq);
  *what = "reading the meta pages for a checkpoint";
  j->meta = malloc(2 * (size_t)w->page);
  if (!j->meta)
    return ENOMEM;
  int e = read_all(s->fd, j->meta, 2 * (size_t)w->page, 0);
  if (e) {
    free(j->meta);
    j->meta = NULL;
    return e;
  }
  /* The pin is not counted in open_txns: cph_store_grow may remap with it open. LMDB 0.9.24
   * allows that: mdb_env_set_mapsize refuses only while a write txn is open (me_txn), and a
   * read txn that reads nothing holds no pointer into the map (its root pages are copies in
   * the txn; its reader slot is in the lock file's own mapping), and aborting it
   * (mdb_txn_end) touches only the reader slot and the txn's own fields. */
  *what = "pinning the checkpoint's snapshot";
  int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &j->pin);
  if (rc) {
    free(j->meta);
    j->meta = NULL;
    j->pin = NULL;
    return rc == MDB_READERS_FULL ? EAGAIN : rc;
  }
  return 0;
}

static void maybe_checkpoint(cph_store *s) {
  cph_wal *w = s->wal;
  if (ms_since(&w->last_start) < w->interval_ms || s->span_open || s->replay_pending)
    return; /* the span's: as in cph_wal_make_room */
  pthread_mutex_lock(&w->mu);
  bool busy = w->in_flight || w->broken;
  pthread_mutex_unlock(&w->mu);
  if (busy)
    return;
  clock_gettime(CLOCK_MONOTONIC, &w->last_start);
  ckpt_job j;
  const char *what;
  int e = ckpt_take(s, &j, &what);
  if (e) {
    wal_fail(s, what, e);
    pthread_mutex_lock(&w->mu);
    w->broken = true;
    pthread_mutex_unlock(&w->mu);
    return;
  }
  pthread_mutex_lock(&w->mu);
  w->cur = (w->cur + 1) % LOG_FILES;
  w->off = 0;
  j.file = w->cur;
  w->job = j;
  w->has_job = w->in_flight = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

int cph_wal_make_room(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  if (!w || !w->on)
    return CPH_OK;
  pthread_mutex_lock(&w->mu);
  while (w->in_flight) /* its pin becomes w->pin (or goes) */
    pthread_cond_wait(&w->cv, &w->mu);
  bool broken = w->broken;
  pthread_mutex_unlock(&w->mu);
  uint64_t now = atomic_load(&s->commit_seq);
  /* Every other call at most: a write that finds the map full again right after goes on to
   * growth or its CPH_EFULL, so no write is applied again forever. */
  bool again = w->room_made;
  w->room_made = false;
  /* Not while a span is open or waits to be applied again: the data file then lacks commits
   * numbered already, and a checkpoint would say it holds them (store.h, the span). */
  if (broken || again || !w->pin || w->pin_seq >= now || s->span_open || s->replay_pending)
    return CPH_OK;
  ckpt_job j;
  const char *what;
  int e = ckpt_take(s, &j, &what);
  if (!e) {
    pthread_mutex_lock(&w->mu);
    w->cur = (w->cur + 1) % LOG_FILES;
    w->off = 0;
    j.file = w->cur;
    pthread_mutex_unlock(&w->mu);
    e = ckpt_write(s, &j, &what);
    free(j.meta);
  }
  if (e) {
    if (j.pin)
      mdb_txn_abort(j.pin);
    wal_fail(s, what, e);
    pthread_mutex_lock(&w->mu);
    w->broken = true;
    pthread_mutex_unlock(&w->mu);
    return cph_store_flush_error(s, err);
  }
  mdb_txn_abort(w->pin);
  w->pin = j.pin;
  atomic_store(&w->pin_txnid, (uint64_t)mdb_txn_id(j.pin));
  w->pin_seq = j.seq;
  w->room_made = true;
  clock_gettime(CLOCK_MONOTONIC, &w->last_start);
  atomic_store(&s->map_full, false);
  return cph_err_set(err, CPH_EBUSY,
                     "data dir '%s': a checkpoint released the pages its pin held; the write "
                     "is applied again",
                     s->dir);
}

size_t cph_wal_held_pages(cph_store *s) {
  cph_wal *w = s->wal;
  uint64_t oldest = w && w->on ? atomic_load(&w->pin_txnid) : 0;
  if (!oldest)
    return 0;
  /* LMDB lets only a read txn look at the free list (FREE_DBI, 0): a record keyed by the
   * txn that freed its pages, the value a page list whose first word is its length. A
   * record reaches reuse once its key is below the oldest reader's txn id: the pin's. */
  MDB_txn *r;
  if (mdb_txn_begin(s->env, NULL, MDB_RDONLY, &r) != MDB_SUCCESS)
    return 0;
  MDB_cursor *c;
  size_t pages = 0;
  if (mdb_cursor_open(r, 0, &c) == MDB_SUCCESS) {
    size_t key = (size_t)oldest;
    MDB_val k = {sizeof key, &key}, v;
    for (int rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
      size_t n = 0;
      if (v.mv_size >= sizeof n)
        memcpy(&n, v.mv_data, sizeof n);
      pages += n;
    }
    mdb_cursor_close(c);
  }
  mdb_txn_abort(r);
  /* The count swings from near 0 right after a checkpoint to its most just before the next;
   * a writer that keeps headroom (ingest) would let a small request in at the low point and
   * refuse it at the high one. The most seen over the last HELD_PEAK_MS is what it gets. */
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  if (pages >= w->held_peak || ms_since(&w->held_peak_at) > HELD_PEAK_MS) {
    w->held_peak = pages;
    w->held_peak_at = now;
  }
  return w->held_peak;
}

/* ---------------------------------------------------------------- start and stop */

static int open_log_files(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  char path[4200];
  bool created = false;
  void *zero = NULL;
  int e = 0;
  for (unsigned i = 0; i < LOG_FILES && !e; i++) {
    if (w->fds[i] >= 0)
      continue;
    log_path(s, i, path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      e = errno;
      break;
    }
    w->fds[i] = fd;
    if (st.st_size >= (off_t)LOG_FILE_BYTES)
      continue;
    created = true;
    if (s->sync == CPH_SYNC_NONE) {
      /* Never flushed under :none: its size is enough (a later mode that flushes commits the
       * extents with its first flushes; written full, they would cost ~50 ms a data dir). */
      if (ftruncate(fd, (off_t)LOG_FILE_BYTES) != 0)
        e = errno;
      continue;
    }
    /* Written full once: a later flush then has no file size or extents to commit. */
    if (!zero && !(zero = calloc(1, 1u << 20))) {
      e = ENOMEM;
      break;
    }
    for (off_t o = 0; !e && o < (off_t)LOG_FILE_BYTES; o += 1u << 20)
      e = write_all(fd, zero, 1u << 20, o);
    if (!e && fdatasync(fd) != 0)
      e = errno;
  }
  free(zero);
  if (!e && created && s->sync != CPH_SYNC_NONE)
    e = fsync_dir(s->dir);
  if (e)
    return cph_err_set(err, cph_store_map_error(e), "data dir '%s': cannot create %s: %s",
                       s->dir, path, strerror(e));
  return CPH_OK;
}

int cph_wal_start(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  if (w->on)
    return CPH_OK;
  MDB_stat st;
  int rc = mdb_env_stat(s->env, &st);
  if (rc)
    return cph_err_set(err, cph_store_map_error(rc), "data dir '%s': %s", s->dir,
                       mdb_strerror(rc));
  w->page = st.ms_psize;
  if ((rc = open_log_files(s, err)) != CPH_OK)
    return rc;
  /* A new run of the log: records of earlier runs, which hold the same seqs, fail the crc. */
  if (getrandom(&w->salt, sizeof w->salt, 0) != (ssize_t)sizeof w->salt) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    w->salt = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 16);
  }
  /* From here on LMDB flushes nothing; the first checkpoint, below, flushes the data file, so
   * every commit so far is in it and T is the snapshot a crash goes back to. */
  int e = mdb_env_set_flags(s->env, MDB_NOSYNC, 1);
  if (e)
    return cph_err_set(err, cph_store_map_error(e), "data dir '%s': %s", s->dir,
                       mdb_strerror(e));
  ckpt_job j;
  const char *what;
  w->cur = 0;
  w->off = 0;
  w->dirty = 0;
  e = ckpt_take(s, &j, &what);
  if (!e) {
    j.file = 0;
    e = ckpt_write(s, &j, &what);
    free(j.meta);
  }
  if (e) {
    if (j.pin && e)
      mdb_txn_abort(j.pin);
    mdb_env_set_flags(s->env, MDB_NOSYNC, s->sync != CPH_SYNC_ALWAYS);
    return cph_err_set(err, cph_store_map_error(e) ? cph_store_map_error(e) : CPH_EIO,
                       "data dir '%s': %s: %s", s->dir, what, strerror(e));
  }
  recovery_end(w); /* the checkpoint read at open is superseded: its pin may go */
  if (w->pin)
    mdb_txn_abort(w->pin);
  w->pin = j.pin;
  atomic_store(&w->pin_txnid, (uint64_t)mdb_txn_id(j.pin));
  w->pin_seq = j.seq;
  w->room_made = false;
  w->broken = false;
  w->has_job = w->in_flight = w->stopping = false;
  clock_gettime(CLOCK_MONOTONIC, &w->last_start);
  if (pthread_create(&w->thread, NULL, ckpt_main, s) != 0) {
    mdb_env_set_flags(s->env, MDB_NOSYNC, s->sync != CPH_SYNC_ALWAYS);
    return cph_err_set(err, CPH_EIO, "data dir '%s': cannot start the checkpoint thread",
                       s->dir);
  }
  w->thread_on = true;
  w->on = true;
  cph_store_note_durable(s, atomic_load(&s->commit_seq));
  return CPH_OK;
}

/* The data file holds every commit (flushed), so no checkpoint is needed: it goes, so that
 * a later open does not go back to it. */
static int drop_checkpoint(cph_store *s, const char **what) {
  char fin[4200];
  path_of(s, "checkpoint", fin, sizeof fin);
  /* Under :none nothing is flushed (the log kept for the span, store.h): what a killed process
   * wrote is in the page cache, and :none promises a machine crash nothing. */
  bool flush = s->sync != CPH_SYNC_NONE;
  *what = "flushing the data file";
  int e = 0;
  if (flush) {
    e = fdatasync(s->fd) == 0 ? 0 : errno;
    atomic_fetch_add(&s->fsyncs, 1);
  }
  if (e)
    return e;
  *what = "removing the checkpoint";
  if (unlink(fin) != 0 && errno != ENOENT)
    return errno;
  *what = "flushing the data dir";
  return flush ? fsync_dir(s->dir) : 0;
}

int cph_wal_stop(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  if (!w || !w->on)
    return CPH_OK;
  /* The checkpoint in flight finishes first: its rename must not follow the unlink below. */
  pthread_mutex_lock(&w->mu);
  w->stopping = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->thread_on)
    pthread_join(w->thread, NULL);
  w->thread_on = false;
  w->on = false;
  buf_reset(w);
  const char *what = NULL;
  int e = 0;
  if (atomic_load(&s->flush_failed) == CPH_OK)
    e = drop_checkpoint(s, &what);
  /* After a failure the checkpoint and its pinned pages stay as they are on disk: recovery
   * goes back to them. The pin itself ends with this process's view of the file. */
  if (w->pin)
    mdb_txn_abort(w->pin);
  w->pin = NULL;
  atomic_store(&w->pin_txnid, 0);
  if (e) {
    wal_fail(s, what, e);
    return cph_store_flush_error(s, err);
  }
  return atomic_load(&s->flush_failed) == CPH_OK ? CPH_OK : cph_store_flush_error(s, err);
}

/* ---------------------------------------------------------------- recovery */

static int ckpt_read(cph_store *s, cph_wal *w, const char *path, cph_err *err) {
  size_t n = 0;
  uint8_t *b = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  int e = 0;
  if (fd < 0 || fstat(fd, &st) != 0)
    e = errno;
  else if (st.st_size < 48 || st.st_size > (1 << 24))
    e = -1;
  else if (!(b = malloc((size_t)st.st_size)))
    e = ENOMEM;
  else
    e = read_all(fd, b, n = (size_t)st.st_size, 0);
  if (fd >= 0)
    close(fd);
  uint32_t crc = 0;
  if (!e) {
    memcpy(&crc, b + n - 4, 4);
    if (crc != (uint32_t)crc32(0L, b, (uInt)(n - 4)) || memcmp(b, CKPT_MAGIC, 8) != 0)
      e = -1;
  }
  const uint8_t *p = b + 8, *end = b + n - 4;
  uint32_t version = 0, ndb = 0;
  if (!e) {
    memcpy(&version, p, 4), p += 4;
    memcpy(&w->page, p, 4), p += 4;
    memcpy(&w->rec.seq, p, 8), p += 8;
    memcpy(&w->salt, p, 8), p += 8;
    memcpy(&w->rec.file, p, 4), p += 4;
    memcpy(&ndb, p, 4), p += 4;
    if (version != CKPT_VERSION || w->rec.file >= LOG_FILES || ndb > 255 || w->page < 512 ||
        w->page > (1u << 16))
      e = -1;
  }
  if (!e && !(w->rec_names = calloc(ndb ? ndb : 1, sizeof *w->rec_names)))
    e = ENOMEM;
  for (uint32_t i = 0; !e && i < ndb; i++) {
    size_t l = p < end ? *p++ : 0;
    if (l == 0 || (size_t)(end - p) < l) {
      e = -1;
    } else if (!(w->rec_names[i] = strndup((const char *)p, l))) {
      e = ENOMEM;
    } else {
      w->rec_ndb = i + 1;
      p += l;
    }
  }
  if (!e && (size_t)(end - p) != 2 * (size_t)w->page)
    e = -1;
  if (!e && !(w->rec.meta = malloc(2 * (size_t)w->page)))
    e = ENOMEM;
  if (!e)
    memcpy(w->rec.meta, p, 2 * (size_t)w->page);
  free(b);
  if (e == -1)
    return cph_err_set(err, CPH_ECORRUPT,
                       "data dir '%s': the checkpoint %s is damaged (bad checksum or layout); "
                       "it is written by rename, so this is not a crash: restore the data dir "
                       "from a backup",
                       s->dir, path);
  if (e)
    return cph_err_set(err, cph_store_map_error(e), "data dir '%s': cannot read %s: %s",
                       s->dir, path, strerror(e));
  return CPH_OK;
}

int cph_wal_restore(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  char path[4200], data[4200];
  path_of(s, "checkpoint", path, sizeof path);
  if (access(path, F_OK) != 0)
    return CPH_OK; /* no log to go back to: a clean close, or never :always */
  int rc = ckpt_read(s, w, path, err);
  if (rc)
    return rc;
  /* The meta pages as of T, back at offset 0: LMDB opens snapshot T, whose pages the pin
   * kept intact; whatever was written after T is free space to it. */
  path_of(s, "data.mdb", data, sizeof data);
  int fd = open(data, O_WRONLY | O_CLOEXEC);
  int e = fd < 0 ? errno : write_all(fd, w->rec.meta, 2 * (size_t)w->page, 0);
  if (!e && fdatasync(fd) != 0)
    e = errno;
  if (fd >= 0)
    close(fd);
  if (e)
    return cph_err_set(err, cph_store_map_error(e),
                       "data dir '%s': cannot restore the checkpoint's meta pages into %s: %s",
                       s->dir, data, strerror(e));
  w->recovering = true;
  return CPH_OK;
}

int cph_wal_pin_recovery(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  if (!w->recovering)
    return CPH_OK;
  /* Snapshot T stays intact while the replay and the migrations commit, until a new
   * checkpoint (or a flushed data file without one) supersedes it: a crash in between goes
   * back to T again. */
  int rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &w->rec.pin);
  if (rc) {
    w->rec.pin = NULL;
    return cph_err_set(err, cph_store_map_error(rc), "data dir '%s': cannot begin: %s", s->dir,
                       mdb_strerror(rc));
  }
  return CPH_OK;
}

/* One valid record found by the scan: where its body is. */
typedef struct rec_ref {
  unsigned file;
  off_t off;
  uint32_t len;
} rec_ref;

/* The records that follow T: from the checkpoint's file at offset 0, on through the next
 * files, while each record's crc matches and its seq is the next one. */
static int scan(cph_store *s, rec_ref **out, size_t *n_out, uint8_t **body_buf, cph_err *err) {
  cph_wal *w = s->wal;
  rec_ref *refs = NULL;
  size_t n = 0, cap = 0;
  uint64_t want = w->rec.seq + 1;
  uint8_t *buf = NULL;
  size_t buf_cap = 0;
  int e = 0;
  unsigned file = w->rec.file;
  for (unsigned k = 0; k < LOG_FILES && !e; k++, file = (file + 1) % LOG_FILES) {
    int fd = w->fds[file];
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
      break;
    off_t off = 0;
    size_t before = n;
    for (;;) {
      uint8_t head[REC_HEAD];
      if (off + REC_HEAD > st.st_size || read_all(fd, head, REC_HEAD, off) != 0)
        break;
      uint32_t len, crc;
      uint64_t seq;
      memcpy(&len, head, 4);
      memcpy(&crc, head + 4, 4);
      memcpy(&seq, head + 8, 8);
      if (seq != want || off + REC_HEAD + (off_t)len > st.st_size)
        break;
      if (len > buf_cap) {
        uint8_t *nb = realloc(buf, len);
        if (!nb) {
          e = ENOMEM;
          break;
        }
        buf = nb;
        buf_cap = len;
      }
      if (read_all(fd, buf, len, off + REC_HEAD) != 0 ||
          rec_crc(w->salt, seq, buf, len) != crc)
        break;
      if (n == cap) {
        cap = cap ? cap * 2 : 256;
        rec_ref *nr = realloc(refs, cap * sizeof *refs);
        if (!nr) {
          e = ENOMEM;
          break;
        }
        refs = nr;
      }
      refs[n++] = (rec_ref){file, off + REC_HEAD, len};
      off += REC_HEAD + (off_t)len;
      want++;
    }
    if (n == before && k > 0)
      break; /* this file does not continue the log */
  }
  if (e) {
    free(refs);
    free(buf);
    return cph_err_set(err, CPH_ENOMEM, "out of memory reading the log of '%s'", s->dir);
  }
  *out = refs;
  *n_out = n;
  *body_buf = buf;
  return CPH_OK;
}

/* Applies one record's ops in txn. MDB codes; *bad set when the record makes no sense. */
static int apply(MDB_txn *txn, const MDB_dbi *map, unsigned ndb, const uint8_t *p, size_t len,
                 bool *bad) {
  const uint8_t *end = p + len;
  while (p < end) {
    if ((size_t)(end - p) < OP_HEAD)
      return *bad = true, MDB_CORRUPTED;
    uint8_t op = p[0], db = p[1];
    uint16_t kl;
    uint32_t vl;
    memcpy(&kl, p + 2, 2);
    memcpy(&vl, p + 4, 4);
    p += OP_HEAD;
    if ((size_t)(end - p) < (size_t)kl + vl || db >= ndb)
      return *bad = true, MDB_CORRUPTED;
    MDB_val k = {kl, (void *)p}, v = {vl, (void *)(p + kl)};
    p += kl + vl;
    int rc;
    switch (op) {
    case CPH_WAL_PUT:
      rc = mdb_put(txn, map[db], &k, &v, 0);
      break;
    case CPH_WAL_DEL:
      rc = mdb_del(txn, map[db], &k, NULL);
      if (rc == MDB_NOTFOUND)
        rc = MDB_SUCCESS;
      break;
    case CPH_WAL_EMPTY:
      rc = mdb_drop(txn, map[db], 0);
      break;
    default:
      return *bad = true, MDB_CORRUPTED;
    }
    if (rc)
      return rc;
  }
  return MDB_SUCCESS;
}

/* Records per replay txn: the pin keeps T intact across them, so a crash during the replay
 * just replays again; a few txns keep each one's dirty pages bounded. */
#define REPLAY_BATCH 4096

static int replay_batch(cph_store *s, const MDB_dbi *map, const rec_ref *refs, size_t n,
                        uint8_t **buf, size_t *buf_cap, cph_err *err) {
  cph_wal *w = s->wal;
  for (;;) {
    MDB_txn *txn = NULL;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc)
      txn = NULL;
    bool bad = false;
    size_t i = 0;
    for (; rc == MDB_SUCCESS && i < n; i++) {
      if (refs[i].len > *buf_cap) {
        uint8_t *nb = realloc(*buf, refs[i].len);
        if (!nb) {
          rc = ENOMEM;
          break;
        }
        *buf = nb;
        *buf_cap = refs[i].len;
      }
      int e = read_all(w->fds[refs[i].file], *buf, refs[i].len, refs[i].off);
      rc = e ? e : apply(txn, map, w->rec_ndb, *buf, refs[i].len, &bad);
    }
    if (rc == MDB_SUCCESS)
      return (rc = mdb_txn_commit(txn)) == MDB_SUCCESS
                 ? CPH_OK
                 : cph_err_set(err, cph_store_map_error(rc),
                               "data dir '%s': replaying the log: commit failed: %s", s->dir,
                               mdb_strerror(rc));
    if (txn)
      mdb_txn_abort(txn);
    if (rc == MDB_MAP_FULL) { /* the snapshot plus the replay need more room: double it */
      MDB_envinfo info;
      mdb_env_info(s->env, &info);
      int g = mdb_env_set_mapsize(s->env, info.me_mapsize * 2);
      if (g == MDB_SUCCESS)
        continue;
      rc = g;
    }
    if (bad)
      return cph_err_set(err, CPH_ECORRUPT,
                         "data dir '%s': the log has a record with a valid checksum that "
                         "cannot be applied (commit %llu after the checkpoint)",
                         s->dir, (unsigned long long)(w->rec.seq + i));
    return cph_err_set(err, cph_store_map_error(rc), "data dir '%s': replaying the log: %s",
                       s->dir, mdb_strerror(rc));
  }
}

int cph_wal_replay(cph_store *s, cph_err *err) {
  cph_wal *w = s->wal;
  if (!w->recovering)
    return CPH_OK;
  char first[4200];
  log_path(s, w->rec.file, first, sizeof first);
  if (access(first, F_OK) != 0)
    return cph_err_set(err, CPH_ECORRUPT,
                       "data dir '%s': the log file %s, which the checkpoint says holds the "
                       "commits after it, is missing: restore the data dir from a backup",
                       s->dir, first);
  int rc = open_log_files(s, err);
  if (rc)
    return rc;
  /* The checkpoint's database indexes, by name, in this build's handles. */
  MDB_dbi map[256];
  MDB_txn *txn;
  int e = mdb_txn_begin(s->env, NULL, 0, &txn);
  for (unsigned i = 0; !e && i < w->rec_ndb; i++) {
    int mine = -1;
    for (int d = 0; d < CPH_DB_COUNT && mine < 0; d++)
      if (strcmp(cph_db_name((cph_db)d), w->rec_names[i]) == 0)
        mine = d;
    if (mine >= 0)
      map[i] = s->dbi[mine];
    else
      e = mdb_dbi_open(txn, w->rec_names[i], MDB_CREATE, &map[i]);
  }
  if (!e)
    e = mdb_txn_commit(txn);
  else
    mdb_txn_abort(txn);
  if (e)
    return cph_err_set(err, cph_store_map_error(e),
                       "data dir '%s': cannot open the databases the log names: %s", s->dir,
                       mdb_strerror(e));
  rec_ref *refs = NULL;
  size_t n = 0;
  uint8_t *buf = NULL;
  if ((rc = scan(s, &refs, &n, &buf, err)) != CPH_OK)
    return rc;
  size_t buf_cap = 0;
  free(buf);
  buf = NULL;
  /* Replay commits do not flush: the data file is flushed once at the end (a new checkpoint,
   * or the checkpoint dropped), and until then T and the log are what a crash goes back to. */
  unsigned flags;
  mdb_env_get_flags(s->env, &flags);
  mdb_env_set_flags(s->env, MDB_NOSYNC, 1);
  for (size_t i = 0; rc == CPH_OK && i < n; i += REPLAY_BATCH)
    rc = replay_batch(s, map, refs + i, n - i < REPLAY_BATCH ? n - i : REPLAY_BATCH, &buf,
                      &buf_cap, err);
  mdb_env_set_flags(s->env, MDB_NOSYNC, (flags & MDB_NOSYNC) != 0);
  free(buf);
  free(refs);
  if (rc)
    return rc;
  cph_info("data dir '%s': recovered from the checkpoint at commit %llu: %zu commit%s replayed "
           "from the log (it ends at commit %llu)",
           s->dir, (unsigned long long)w->rec.seq, n, n == 1 ? "" : "s",
           (unsigned long long)(w->rec.seq + n));
  if (s->sync == CPH_SYNC_ALWAYS)
    return CPH_OK; /* the log's start, after the migrations, writes a new checkpoint */
  const char *what;
  if ((e = drop_checkpoint(s, &what)) != 0)
    return cph_err_set(err, cph_store_map_error(e), "data dir '%s': %s: %s", s->dir, what,
                       strerror(e));
  recovery_end(w);
  return CPH_OK;
}

/* ---------------------------------------------------------------- a span applied again */

/* The span's records were written one after another in one file (checkpoints, which switch
 * files, start only when a span ends); a record not found where the last one ended is looked
 * for at the start of the next file all the same, as the open's scan would. */
int cph_wal_replay_span(cph_store *s, cph_wal_pos at, uint64_t first, uint64_t last,
                        cph_err *err) {
  cph_wal *w = s->wal;
  MDB_txn *txn = NULL;
  int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
  uint8_t *buf = NULL;
  size_t cap = 0;
  bool bad = false, switched = false;
  uint64_t seq = first;
  while (rc == MDB_SUCCESS && seq <= last) {
    uint8_t head[REC_HEAD];
    uint32_t len = 0, crc = 0;
    uint64_t found = 0;
    int fd = w->fds[at.file];
    if (fd >= 0 && read_all(fd, head, REC_HEAD, at.off) == 0) {
      memcpy(&len, head, 4);
      memcpy(&crc, head + 4, 4);
      memcpy(&found, head + 8, 8);
    }
    if (found != seq) {
      if (switched) {
        bad = true;
        break;
      }
      switched = true;
      at = (cph_wal_pos){(at.file + 1) % LOG_FILES, 0};
      continue;
    }
    if (len > cap) {
      uint8_t *nb = realloc(buf, len);
      if (!nb) {
        rc = ENOMEM;
        break;
      }
      buf = nb;
      cap = len;
    }
    int e = read_all(fd, buf, len, at.off + REC_HEAD);
    if (e || rec_crc(w->salt, seq, buf, len) != crc) {
      bad = true;
      break;
    }
    rc = apply(txn, s->dbi, CPH_DB_COUNT, buf, len, &bad);
    at.off += REC_HEAD + (off_t)len;
    seq++;
  }
  free(buf);
  if (rc == MDB_SUCCESS && !bad) {
    rc = mdb_txn_commit(txn);
    txn = NULL;
  }
  if (txn)
    mdb_txn_abort(txn);
  if (rc == MDB_SUCCESS && !bad)
    return CPH_OK;
  if (bad)
    return cph_err_set(err, CPH_ECORRUPT,
                       "data dir '%s': applying acknowledged commits %llu..%llu again from the "
                       "log: commit %llu is not where it was written (restart cephalond: the "
                       "open replays the log)",
                       s->dir, (unsigned long long)first, (unsigned long long)last,
                       (unsigned long long)seq);
  if (rc == MDB_MAP_FULL)
    atomic_store(&s->map_full, true);
  return cph_err_set(err, cph_store_map_error(rc),
                     "data dir '%s': applying acknowledged commits %llu..%llu again from the log "
                     "failed at commit %llu: %s",
                     s->dir, (unsigned long long)first, (unsigned long long)last,
                     (unsigned long long)seq, mdb_strerror(rc));
}
