/* The LMDB environment: open/close, named databases, schema check, error mapping. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "store_internal.h"

static const char *const db_names[CPH_DB_COUNT] = {
#define CPH__DB_NAME(name, label) label,
    CPH_DB_LIST(CPH__DB_NAME)
#undef CPH__DB_NAME
};

const char *cph_db_name(cph_db db) {
  return (unsigned)db < CPH_DB_COUNT ? db_names[db] : "unknown";
}

int cph_store_map_error(int rc) {
  switch (rc) {
  case MDB_SUCCESS:
    return CPH_OK;
  case MDB_NOTFOUND:
    return CPH_ENOTFOUND;
  case MDB_KEYEXIST:
    return CPH_EEXISTS;
  case MDB_MAP_FULL:
  case ENOSPC:
  case EDQUOT:
    return CPH_EFULL;
  case MDB_TXN_FULL:
  case MDB_BAD_VALSIZE:
  case MDB_DBS_FULL:
    return CPH_ELIMIT;
  case MDB_CORRUPTED:
  case MDB_PAGE_NOTFOUND:
  case MDB_INVALID:
  case MDB_INCOMPATIBLE:
    return CPH_ECORRUPT;
  case MDB_VERSION_MISMATCH:
    return CPH_ESCHEMA;
  case MDB_READERS_FULL:
  case EAGAIN:
  case EBUSY:
    return CPH_EBUSY;
  case ENOMEM:
    return CPH_ENOMEM;
  case EIO:
  case EACCES:
  case EPERM:
  case ENOENT:
  case ENOTDIR:
  case EROFS:
    return CPH_EIO;
  default:
    return CPH_ESTORE;
  }
}

/* Creates dir and its parents, like mkdir -p. */
static int make_dirs(const char *dir) {
  char path[4096];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof path)
    return ENAMETOOLONG;
  memcpy(path, dir, n + 1);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return errno;
    *p = '/';
  }
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return errno;
  struct stat st;
  if (stat(path, &st) != 0)
    return errno;
  return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* The pid /proc/locks names as holding a flock on the file open as fd, or 0 when it cannot
 * tell (no /proc, or the lock went away meanwhile). */
static long flock_holder(int fd) {
  struct stat st;
  FILE *f = fstat(fd, &st) == 0 ? fopen("/proc/locks", "r") : NULL;
  if (!f)
    return 0;
  char line[256];
  long pid = 0;
  while (!pid && fgets(line, sizeof line, f)) {
    char kind[16];
    long holder;
    unsigned maj, min;
    unsigned long ino;
    if (sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%lu", kind, &holder, &maj, &min, &ino) == 5 &&
        strcmp(kind, "FLOCK") == 0 && maj == major(st.st_dev) && min == minor(st.st_dev) &&
        ino == (unsigned long)st.st_ino)
      pid = holder;
  }
  fclose(f);
  return pid;
}

/* How long an open waits for a data dir's lock before it refuses: a holder that is closing
 * the store, or a process on its way out, lets go within it. */
#define LOCK_WAIT_MS 1000

/* One process at a time owns a data dir: LMDB alone would let two daemons share it, and two
 * schedulers over one store would hand the same turn out twice. */
static int lock_dir(const char *dir, int *fd_out, cph_err *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/cephalon.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return cph_err_set(err, CPH_EIO, "data dir '%s': cannot create %s: %s", dir, path,
                       strerror(errno));
  int e = 0;
  for (int waited_ms = 0;; waited_ms += 10) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      *fd_out = fd;
      return CPH_OK;
    }
    e = errno;
    if (e != EWOULDBLOCK || waited_ms >= LOCK_WAIT_MS)
      break;
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
  long holder = e == EWOULDBLOCK ? flock_holder(fd) : 0;
  close(fd);
  if (e != EWOULDBLOCK)
    return cph_err_set(err, CPH_EIO, "data dir '%s': cannot lock: %s", dir, strerror(e));
  if (holder) /* this process's own pid when it holds the dir elsewhere */
    return cph_err_set(err, CPH_EBUSY, "data dir '%s' is in use by another process (pid %ld)",
                       dir, holder);
  return cph_err_set(err, CPH_EBUSY, "data dir '%s' is in use by another process", dir);
}

/* Opens every named database and checks (or, on a new environment, writes) the schema
 * version. *migrate_from gets the data dir's version when m migrates it (m->from or later,
 * older than this build's), else stays 0. */
static int open_databases(cph_store *s, const cph_store_migration *m, uint32_t *migrate_from,
                          cph_err *err) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
  if (rc)
    return cph_err_set(err, cph_store_map_error(rc), "data dir '%s': cannot begin: %s", s->dir,
                       mdb_strerror(rc));
  for (int i = 0; i < CPH_DB_COUNT; i++) {
    rc = mdb_dbi_open(txn, db_names[i], MDB_CREATE, &s->dbi[i]);
    if (rc) {
      cph_err_set(err, cph_store_map_error(rc), "data dir '%s': cannot open database \"%s\": %s",
                  s->dir, db_names[i], mdb_strerror(rc));
      goto fail;
    }
  }
  MDB_val key = {sizeof CPH_META_SCHEMA_KEY - 1, (void *)CPH_META_SCHEMA_KEY};
  MDB_val val;
  rc = mdb_get(txn, s->dbi[CPH_DB_META], &key, &val);
  if (rc == MDB_NOTFOUND) {
    uint8_t be[4];
    cph_be32_put(be, CPH_STORE_SCHEMA_VERSION);
    val.mv_size = sizeof be;
    val.mv_data = be;
    rc = mdb_put(txn, s->dbi[CPH_DB_META], &key, &val, 0);
    if (rc) {
      cph_err_set(err, cph_store_map_error(rc), "data dir '%s': cannot write schema version: %s",
                  s->dir, mdb_strerror(rc));
      goto fail;
    }
  } else if (rc) {
    cph_err_set(err, cph_store_map_error(rc), "data dir '%s': cannot read schema version: %s",
                s->dir, mdb_strerror(rc));
    goto fail;
  } else if (val.mv_size != 4) {
    cph_err_set(err, CPH_ECORRUPT,
                "data dir '%s': corrupt record in database \"meta\" at key \"%s\": %zu bytes, "
                "expected 4",
                s->dir, CPH_META_SCHEMA_KEY, val.mv_size);
    goto fail;
  } else {
    uint32_t found = cph_be32_get(val.mv_data);
    if (m && m->from && found >= m->from && found < CPH_STORE_SCHEMA_VERSION) {
      *migrate_from = found;
    } else if (found != CPH_STORE_SCHEMA_VERSION) {
      cph_err_set(err, CPH_ESCHEMA,
                  "data dir '%s' has storage schema version %u, but this build reads version %u; "
                  "use a build that matches, or move the data dir away to start fresh",
                  s->dir, found, CPH_STORE_SCHEMA_VERSION);
      goto fail;
    }
  }
  rc = mdb_txn_commit(txn);
  if (rc)
    return cph_err_set(err, cph_store_map_error(rc), "data dir '%s': cannot commit: %s", s->dir,
                       mdb_strerror(rc));
  return CPH_OK;
fail:
  mdb_txn_abort(txn);
  return err ? err->code : CPH_ESTORE;
}

static unsigned env_flags_for(cph_sync_mode mode) {
  return mode == CPH_SYNC_ALWAYS ? 0 : MDB_NOSYNC;
}

/* Runs m in one write txn that also records this build's schema version. */
static int migrate(cph_store *s, const cph_store_migration *m, uint32_t found, cph_err *err) {
  cph_err why = {0};
  cph_txn t;
  int rc = cph_txn_begin(s, true, &t);
  if (rc == CPH_OK && (rc = m->run(m->ctx, found, &t, &why)) == CPH_OK) {
    uint8_t be[4];
    cph_be32_put(be, CPH_STORE_SCHEMA_VERSION);
    cph_key k;
    cph_key_reset(&k);
    memcpy(k.data, CPH_META_SCHEMA_KEY, sizeof CPH_META_SCHEMA_KEY - 1);
    k.len = sizeof CPH_META_SCHEMA_KEY - 1;
    cph_txn_put(&t, CPH_DB_META, &k, be, sizeof be);
    rc = cph_txn_commit(&t); /* ends t whatever the outcome */
  } else if (t.mdb) {
    cph_txn_abort(&t);
  }
  if (rc == CPH_OK)
    return CPH_OK;
  return cph_err_set(err, rc,
                     "data dir '%s': migrating storage schema version %u to %u failed, nothing "
                     "was changed: %s",
                     s->dir, found, CPH_STORE_SCHEMA_VERSION,
                     why.msg[0]  ? why.msg
                     : t.err.msg[0] ? t.err.msg
                                    : cph_strerror(rc));
}

int cph_store_open(const cph_store_options *o, cph_store **out, cph_err *err) {
  return cph_store_open_migrating(o, NULL, out, err);
}

int cph_store_open_migrating(const cph_store_options *o, const cph_store_migration *m,
                             cph_store **out, cph_err *err) {
  *out = NULL;
  cph_store *s = calloc(1, sizeof *s);
  if (!s)
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening the store");
  s->lock_fd = -1;
  s->fd = -1;
  s->sync = o->sync;
  pthread_mutex_init(&s->flush_mu, NULL);
  pthread_mutex_init(&s->write_mu, NULL);
  s->dir = strdup(o->dir);
  int rc;
  if (!s->dir) {
    rc = cph_err_set(err, CPH_ENOMEM, "out of memory opening the store");
    goto fail;
  }
  if ((rc = cph_wal_init(s, err)) != CPH_OK)
    goto fail;
  int e = make_dirs(o->dir);
  if (e) {
    rc = cph_err_set(err, CPH_EIO, "data dir '%s': cannot create: %s", o->dir, strerror(e));
    goto fail;
  }
  rc = lock_dir(o->dir, &s->lock_fd, err);
  if (rc)
    goto fail;
  e = mdb_env_create(&s->env);
  if (e) {
    rc = cph_err_set(err, cph_store_map_error(e), "cannot create LMDB environment: %s",
                     mdb_strerror(e));
    goto fail;
  }
  mdb_env_set_maxdbs(s->env, CPH_DB_COUNT);
  e = mdb_env_set_mapsize(s->env, o->map_size);
  if (e) {
    rc = cph_err_set(err, cph_store_map_error(e), "data dir '%s': map size %zu refused: %s",
                     o->dir, o->map_size, mdb_strerror(e));
    goto fail;
  }
  /* After a crash under :always: the checkpoint's snapshot back in place (store/wal.c). */
  if ((rc = cph_wal_restore(s, err)) != CPH_OK)
    goto fail;
  /* MDB_NOTLS: read transactions are tied to our cph_txn, not to a thread. */
  e = mdb_env_open(s->env, o->dir, MDB_NOTLS | env_flags_for(o->sync), 0644);
  if (e) {
    rc = cph_err_set(err, cph_store_map_error(e), "data dir '%s': cannot open LMDB: %s", o->dir,
                     mdb_strerror(e));
    goto fail;
  }
  e = mdb_env_get_fd(s->env, &s->fd);
  if (e) {
    rc = cph_err_set(err, cph_store_map_error(e), "data dir '%s': no file descriptor: %s",
                     o->dir, mdb_strerror(e));
    goto fail;
  }
  uint32_t migrate_from = 0;
  /* The log's commits after the checkpoint are applied before any migration reads them. */
  rc = cph_wal_pin_recovery(s, err);
  if (rc == CPH_OK)
    rc = open_databases(s, m, &migrate_from, err);
  if (rc == CPH_OK)
    rc = cph_wal_replay(s, err);
  if (rc == CPH_OK && migrate_from)
    rc = migrate(s, m, migrate_from, err);
  if (rc == CPH_OK && o->sync == CPH_SYNC_ALWAYS)
    rc = cph_wal_start(s, err);
  if (rc)
    goto fail;
  *out = s;
  return CPH_OK;
fail:
  cph_store_close(s);
  return rc;
}

void cph_store_close(cph_store *s) {
  if (!s)
    return;
  cph_err span_err = {0};
  int span_rc = cph_store_span_end(s, &span_err);
  if (span_rc == CPH_OK)
    span_rc = cph_store_span_replay(s, &span_err);
  if (span_rc != CPH_OK) {
    /* Its passes stay in the log, and the checkpoint the next open replays them from: a
     * failed flush keeps it (cph_wal_stop). */
    cph_error("closing the store: %s", span_err.msg);
    pthread_mutex_lock(&s->flush_mu);
    if (atomic_load(&s->flush_failed) == CPH_OK) {
      snprintf(s->flush_msg, sizeof s->flush_msg, "%.255s", span_err.msg);
      atomic_store(&s->flush_failed, span_err.code ? span_err.code : CPH_EIO);
    }
    pthread_mutex_unlock(&s->flush_mu);
  }
  cph_store_flusher_stop(s);
  if (s->wal) {
    cph_err err = {0};
    if (cph_wal_stop(s, &err) != CPH_OK)
      cph_error("closing the store: %s", err.msg);
    cph_wal_free(s); /* before the env: it ends the pins */
  }
  if (s->env)
    mdb_env_close(s->env);
  if (s->lock_fd >= 0)
    close(s->lock_fd); /* releases the flock */
  cph_counters_free(&s->counters);
  free(s->scratch);
  free(s->dir);
  pthread_mutex_destroy(&s->flush_mu);
  pthread_mutex_destroy(&s->write_mu);
  free(s);
}

int cph_store_copy_dir_check(const char *dir, cph_err *err) {
  DIR *d = opendir(dir);
  if (!d) {
    if (errno == ENOENT)
      return CPH_OK;
    return cph_err_set(err, CPH_EINVAL, "backup dir '%s': %s", dir, strerror(errno));
  }
  bool empty = true;
  for (struct dirent *de; empty && (de = readdir(d)) != NULL;)
    empty = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0;
  closedir(d);
  return empty ? CPH_OK
               : cph_err_set(err, CPH_EEXISTS,
                             "backup dir '%s' is not empty: give a new directory", dir);
}

int cph_store_copy(cph_store *s, const char *dir, cph_err *err) {
  int rc = cph_store_copy_dir_check(dir, err);
  if (rc)
    return rc;
  int e = make_dirs(dir);
  if (e)
    return cph_err_set(err, CPH_EIO, "backup dir '%s': cannot create: %s", dir, strerror(e));
  atomic_fetch_add(&s->open_txns, 1); /* the copy reads through a txn of its own */
  e = mdb_env_copy2(s->env, dir, MDB_CP_COMPACT);
  atomic_fetch_sub(&s->open_txns, 1);
  if (e)
    return cph_err_set(err, cph_store_map_error(e), "backup to '%s' failed: %s", dir,
                       mdb_strerror(e));
  return CPH_OK;
}

void cph_store_note_durable(cph_store *s, uint64_t seq) {
  uint64_t cur = atomic_load(&s->durable_seq);
  while (cur < seq && atomic_load(&s->flush_failed) == CPH_OK &&
         !atomic_compare_exchange_weak(&s->durable_seq, &cur, seq))
    ;
}

uint64_t cph_store_commit_seq(const cph_store *s) { return atomic_load(&s->commit_seq); }
uint64_t cph_store_durable_seq(const cph_store *s) { return atomic_load(&s->durable_seq); }

int cph_store_flush_error(cph_store *s, cph_err *err) {
  int code = atomic_load(&s->flush_failed); /* seq_cst: flush_msg was written before */
  if (code != CPH_OK && err)
    cph_err_set(err, code, "%s", s->flush_msg);
  return code;
}

/* fdatasync on LMDB's descriptor is what mdb_env_sync(env, 1) does for an environment
 * without MDB_WRITEMAP on Linux; calling it directly keeps this thread-safe: mdb_env_sync
 * reads env->me_flags, which the writer thread changes around a deferred commit. */
bool cph_store_map_full(cph_store *s) { return atomic_load(&s->map_full); }

void cph_store_note_map_full(cph_store *s) { atomic_store(&s->map_full, true); }

int cph_store_grow(cph_store *s, size_t max_bytes, cph_err *err) {
  /* A remap needs every txn ended: the span's passes land in the data file first. A span
   * whose commit, or whose replay, found the map full is replayed once it grew. */
  int rc = cph_store_span_end(s, err);
  if (rc && !(rc == CPH_EFULL && s->replay_pending))
    return rc;
  if (atomic_load(&s->open_txns) > 0)
    return cph_err_set(err, CPH_EBUSY, "data dir '%s': the map cannot grow while a "
                       "transaction or a backup reads it", s->dir);
  /* Under the log, the pages freed since the oldest checkpoint pin are not reusable yet: a
   * checkpoint now releases them. Once per full map: if the retry finds it full again, the
   * map grows (or the write fails) as without the log. */
  rc = cph_wal_make_room(s, err);
  if (rc == CPH_EBUSY && s->replay_pending) { /* the room may be enough for it */
    int replayed = cph_store_span_replay(s, err);
    if (replayed)
      return replayed;
  }
  if (rc != CPH_OK)
    return rc; /* CPH_EBUSY: room made, try again; or the checkpoint's failure */
  MDB_envinfo info;
  mdb_env_info(s->env, &info);
  size_t now = info.me_mapsize;
  size_t want = now > max_bytes / 2 ? max_bytes : now * 2;
  /* Never more than the disk can hold: the data file's size plus the space left on it. */
  char path[4200];
  struct stat st;
  struct statvfs fs;
  snprintf(path, sizeof path, "%s/data.mdb", s->dir);
  if (stat(path, &st) == 0 && statvfs(s->dir, &fs) == 0) {
    size_t disk = (size_t)st.st_size + (size_t)fs.f_bavail * fs.f_frsize;
    if (want > disk)
      want = disk;
  }
  long page = sysconf(_SC_PAGESIZE);
  want -= want % (size_t)(page > 0 ? page : 4096);
  if (want <= now)
    return cph_err_set(err, CPH_EFULL,
                       "storage full: the %zu MiB map of data dir '%s' cannot grow: %s", now >> 20,
                       s->dir,
                       now >= max_bytes ? "it is at :server :max-map-size-mb"
                                        : "the disk holding it is full");
  int e = mdb_env_set_mapsize(s->env, want);
  if (e)
    return cph_err_set(err, cph_store_map_error(e), "data dir '%s': growing the map to %zu MiB "
                       "failed: %s", s->dir, want >> 20, mdb_strerror(e));
  atomic_store(&s->map_full, false);
  return cph_store_span_replay(s, err); /* CPH_OK when none waits */
}

int cph_store_sync(cph_store *s, cph_err *err) {
  int failed = cph_store_flush_error(s, err);
  if (failed)
    return failed;
  if (cph_wal_on(s)) /* the log holds every commit since its checkpoint */
    return cph_wal_sync(s, err);
  /* Every commit that returned before this point wrote its pages and meta page already. */
  uint64_t covered = atomic_load(&s->commit_seq);
  int e = fdatasync(s->fd) == 0 ? 0 : errno;
  atomic_fetch_add(&s->fsyncs, 1);
  if (e == 0) {
    cph_store_note_durable(s, covered);
    return CPH_OK;
  }
  pthread_mutex_lock(&s->flush_mu);
  if (atomic_load(&s->flush_failed) == CPH_OK) {
    snprintf(s->flush_msg, sizeof s->flush_msg,
             "data dir '%s': flushing to disk failed: %s; what was written since the last "
             "good flush may not be on disk, and nothing more is acknowledged as stored until "
             "cephalond restarts",
             s->dir, strerror(e));
    atomic_store(&s->flush_failed, cph_store_map_error(e));
  }
  pthread_mutex_unlock(&s->flush_mu);
  return cph_store_flush_error(s, err);
}

int cph_store_set_sync_mode(cph_store *s, cph_sync_mode mode, cph_err *err) {
  if (mode == s->sync)
    return CPH_OK;
  /* The span's passes are in the log this change stops: into the data file first. */
  int rc = cph_store_span_end(s, err);
  if (rc == CPH_OK)
    rc = cph_store_span_replay(s, err);
  if (rc)
    return rc;
  /* The log stops (the data file flushed, the checkpoint dropped: every commit so far is in
   * the data file), and starts again in the new mode if it keeps one: its first checkpoint
   * then flushes the data file under :always and :batch, so earlier unsynced commits are not
   * left behind, and a checkpoint taken unflushed under :none is not relied on. */
  rc = cph_wal_stop(s, err);
  if (rc)
    return rc;
  cph_sync_mode was = s->sync;
  s->sync = mode;
  if (store_log_wanted(s) && (rc = cph_wal_start(s, err)) != CPH_OK) {
    s->sync = was;
    return rc;
  }
  int e = mdb_env_set_flags(s->env, MDB_NOSYNC, 1); /* :always too: the log syncs, not LMDB */
  if (e)
    return cph_err_set(err, cph_store_map_error(e), "cannot change sync mode: %s",
                       mdb_strerror(e));
  if (mode != CPH_SYNC_ALWAYS) /* every commit counts as durable when it returns (store.h) */
    cph_store_note_durable(s, cph_store_commit_seq(s));
  return CPH_OK;
}

/* The start and length of the mapping that holds p, from /proc/self/maps. LMDB does not
 * say where its map is (mdb_env_info's me_mapaddr is only the address asked for with
 * MDB_FIXEDMAP), but every value a read transaction returns points into it. */
static int mapping_of(const void *p, uintptr_t *start, size_t *len) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return CPH_EIO;
  char line[512];
  int rc = CPH_ENOTFOUND;
  uintptr_t a = (uintptr_t)p;
  while (rc == CPH_ENOTFOUND && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= a && a < hi) {
      *start = lo;
      *len = hi - lo;
      rc = CPH_OK;
    }
    /* a line longer than the buffer: skip its rest, so it is not read as a line */
    while (!strchr(line, '\n') && fgets(line, sizeof line, f))
      ;
  }
  fclose(f);
  return rc;
}

int cph_store_release_pages(cph_store *s) {
  MDB_envinfo info;
  MDB_stat st;
  int e = mdb_env_info(s->env, &info);
  if (!e)
    e = mdb_env_stat(s->env, &st);
  if (e)
    return cph_store_map_error(e);
  /* A pointer into the map: the schema version, always there. */
  MDB_txn *txn;
  e = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
  if (e)
    return cph_store_map_error(e);
  MDB_val key = {sizeof CPH_META_SCHEMA_KEY - 1, (void *)CPH_META_SCHEMA_KEY}, val;
  e = mdb_get(txn, s->dbi[CPH_DB_META], &key, &val);
  const void *inside = e ? NULL : val.mv_data;
  mdb_txn_abort(txn);
  if (e)
    return cph_store_map_error(e);
  uintptr_t start;
  size_t len;
  int rc = mapping_of(inside, &start, &len);
  if (rc)
    return rc;
  if (len != info.me_mapsize) /* not LMDB's one mapping of the whole map: touch nothing */
    return CPH_ENOTFOUND;
  size_t used = (size_t)(info.me_last_pgno + 1) * st.ms_psize;
  if (used < len)
    len = used;
  long sys_page = sysconf(_SC_PAGESIZE);
  size_t page = sys_page > 0 ? (size_t)sys_page : 4096;
  len = (len + page - 1) / page * page;
  return madvise((void *)start, len, MADV_DONTNEED) == 0 ? CPH_OK
                                                        : cph_store_map_error(errno);
}

int cph_store_file_identity(cph_store *s, uint64_t *dev, uint64_t *ino) {
  mdb_filehandle_t fd;
  struct stat st;
  if (mdb_env_get_fd(s->env, &fd) != 0 || fstat(fd, &st) != 0)
    return CPH_EIO;
  *dev = (uint64_t)st.st_dev;
  *ino = (uint64_t)st.st_ino;
  return CPH_OK;
}

int cph_store_stats_get(cph_store *s, cph_store_stats *out) {
  MDB_envinfo info;
  MDB_stat st;
  int e = mdb_env_info(s->env, &info);
  if (!e)
    e = mdb_env_stat(s->env, &st);
  if (e)
    return cph_store_map_error(e);
  out->map_size = info.me_mapsize;
  out->used_bytes = (size_t)(info.me_last_pgno + 1) * st.ms_psize;
  out->fsyncs = atomic_load(&s->fsyncs);
  return CPH_OK;
}
