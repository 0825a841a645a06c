/* Transactions with a sticky error, typed record access and cursors (contract in store.h). */
#include <ctype.h>
#include <stdarg.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* Records the first failure; later ones keep the first message. */
static int txn_fail(cph_txn *t, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int txn_fail(cph_txn *t, int code, const char *fmt, ...) {
  if (t->ret == CPH_OK) {
    va_list ap;
    va_start(ap, fmt);
    cph_err_vset(&t->err, code, fmt, ap);
    va_end(ap);
    t->ret = code;
  }
  return t->ret;
}

/* An LMDB failure on (db, key), worded for the person who has to fix it. */
static int txn_fail_mdb(cph_txn *t, int rc, const char *op, cph_db db, const cph_key *k) {
  char key[160];
  cph_key_describe(k->data, k->len, key, sizeof key);
  int code = cph_store_map_error(rc);
  if (rc == MDB_MAP_FULL)
    atomic_store(&t->store->map_full, true); /* the engine grows the map and retries */
  if (code == CPH_EFULL) {
    MDB_envinfo info;
    mdb_env_info(t->store->env, &info);
    return txn_fail(t, code,
                    "storage full: %s in database \"%s\" at key %s found no room in the %zu MiB "
                    "map of data dir '%s' (%s)",
                    op, cph_db_name(db), key, info.me_mapsize >> 20, t->store->dir,
                    rc == MDB_MAP_FULL ? "the map grows up to :server :max-map-size-mb"
                                       : "the disk is full");
  }
  return txn_fail(t, code, "%s in database \"%s\" at key %s failed: %s", op, cph_db_name(db),
                  key, mdb_strerror(rc));
}

/* A txn whose child is open takes no call (store.h, cph_txn.child). */
static int check_no_child(cph_txn *t, const char *op, cph_db db) {
  if (!t->child)
    return CPH_OK;
  return txn_fail(t, CPH_ESTATE, "%s in database \"%s\" on a transaction whose nested one is open",
                  op, cph_db_name(db));
}

static int check_key(cph_txn *t, cph_db db, const cph_key *k) {
  if (check_no_child(t, "a call", db))
    return t->ret;
  if (k->overflow || k->len == 0)
    return txn_fail(t, CPH_ELIMIT, "key for database \"%s\" is %s", cph_db_name(db),
                    k->overflow ? "longer than 511 bytes" : "empty");
  return CPH_OK;
}

int cph_txn_begin(cph_store *s, bool write, cph_txn *t) {
  if (cph_span_wanted(s)) { /* store.h "the span" */
    if (write)
      return cph_span_begin_pass(s, t);
    if (cph_span_view(s, t))
      return CPH_OK;
  }
  return cph_txn_begin_top(s, write, t);
}

int cph_txn_begin_top(cph_store *s, bool write, cph_txn *t) {
  memset(t, 0, sizeof *t);
  t->store = s;
  t->write = write;
  MDB_txn *txn;
  if (write)
    pthread_mutex_lock(&s->write_mu); /* store_internal.h: until the txn ends */
  int rc = mdb_txn_begin(s->env, NULL, write ? 0 : MDB_RDONLY, &txn);
  if (rc) {
    if (write)
      pthread_mutex_unlock(&s->write_mu);
    return txn_fail(t, cph_store_map_error(rc), "cannot begin a %s transaction in '%s': %s",
                    write ? "write" : "read", s->dir, mdb_strerror(rc));
  }
  t->mdb = txn;
  atomic_fetch_add(&s->open_txns, 1); /* a remap must wait for it (cph_store_grow) */
  return CPH_OK;
}

/* Closes t's put cursors: before it ends (LMDB would free them, but t must forget them), and
 * before it begins a child (which would otherwise shadow each one, a copy per child). */
static void put_cursors_close(cph_txn *t) {
  for (int db = 0; db < CPH_DB_COUNT; db++)
    if (t->put_cursor[db]) {
      mdb_cursor_close(t->put_cursor[db]);
      t->put_cursor[db] = NULL;
    }
}

int cph_txn_begin_child(cph_txn *parent, cph_txn *child) {
  memset(child, 0, sizeof *child);
  if (parent->mdb)
    put_cursors_close(parent);
  child->store = parent->store;
  child->parent = parent;
  child->write = true;
  child->wal_mark = cph_wal_mark(parent->store);
  if (parent->ret)
    return txn_fail(child, parent->ret, "%s", parent->err.msg);
  if (!parent->mdb || !parent->write)
    return txn_fail(child, CPH_ESTATE, "nested transaction outside a write transaction");
  if (parent->child)
    return txn_fail(child, CPH_ESTATE, "a second nested transaction while one is open");
  if (!parent->dirty && !parent->n_undo && !parent->cursors) {
    /* Nothing of the parent's for an abort to keep: share its LMDB txn (store.h). */
    child->mdb = parent->mdb;
    child->borrowed = true;
    parent->child = child;
    return CPH_OK;
  }
  MDB_txn *txn;
  int rc = mdb_txn_begin(parent->store->env, parent->mdb, 0, &txn);
  if (rc)
    return txn_fail(child, cph_store_map_error(rc), "cannot begin a nested transaction: %s",
                    mdb_strerror(rc));
  child->mdb = txn;
  parent->child = child;
  return CPH_OK;
}

static void counters_end(cph_txn *t, bool landed);
static int counters_write(cph_txn *t);

/* A transaction ended (committed or aborted): a top-level one no longer holds off a remap
 * nor other writers, a child no longer blocks its parent. */
static void txn_closed(cph_txn *t) {
  if (!t->parent) {
    atomic_fetch_sub(&t->store->open_txns, 1);
    if (t->write)
      pthread_mutex_unlock(&t->store->write_mu);
  } else if (t->parent->child == t)
    t->parent->child = NULL;
}

/* A borrowed child that wrote (or failed: LMDB may have changed pages before it did) is
 * aborted. Its writes are in the LMDB txn it shares with its lender (its parent, or the
 * nearest ancestor that is not borrowed itself), and nothing else is: every txn between them
 * lent because it had written nothing. So that LMDB txn is aborted and a fresh one begun in
 * its place, as the lender's parent's child when the lender is a child. Should the begin
 * fail, each txn of the chain fails with that error and ends (its commit returns it). */
static void lender_restart(cph_txn *t) {
  cph_txn *lender = t->parent;
  while (lender->borrowed)
    lender = lender->parent;
  mdb_txn_abort(lender->mdb);
  MDB_txn *fresh = NULL;
  int rc = mdb_txn_begin(t->store->env, lender->parent ? lender->parent->mdb : NULL, 0, &fresh);
  for (cph_txn *p = t->parent;; p = p->parent) {
    p->mdb = fresh;
    if (rc)
      txn_fail(p, cph_store_map_error(rc),
               "cannot begin a write transaction in '%s' again after a nested one was "
               "aborted: %s",
               t->store->dir, mdb_strerror(rc));
    if (p == lender)
      break;
  }
  if (rc)
    txn_closed(lender);
}

void cph_txn_abort(cph_txn *t) {
  if (t->view) { /* reads through the span chain: ending it ends nothing there */
    t->mdb = NULL;
    return;
  }
  if (t->mdb && t->write) /* its ops leave the log's record buffer too */
    cph_wal_cut(t->store, t->parent ? t->wal_mark : 0);
  if (t->mdb && t->borrowed) {
    put_cursors_close(t);
    if (t->dirty || t->ret) /* ids it took touched no page: counters_end gives them back */
      lender_restart(t);
    txn_closed(t);
  } else if (t->mdb) {
    put_cursors_close(t);
    mdb_txn_abort(t->mdb);
    txn_closed(t);
  }
  t->mdb = NULL;
  counters_end(t, false);
}

/* A top-level write commit that changed something just landed: number it, count the disk
 * flushes LMDB did for it, and note what it made durable (store.h). LMDB commits a txn that
 * changed nothing without any write or flush, so such a txn gets no number. */
static void commit_landed(cph_txn *t, bool deferred) {
  cph_store *s = t->store;
  if (t->parent || !t->write)
    return;
  if (!t->dirty) {
    cph_wal_discard(s);
    return;
  }
  if (cph_wal_on(s) && t->span) {
    cph_wal_span_end(s); /* its passes' records went to the log as they landed */
    return;
  }
  if (cph_wal_on(s)) {
    /* Its record goes to the log before it gets its number (store/wal.c): a kill -9 from
     * here on loses nothing, and a flush that reads the number finds the record written.
     * LMDB flushed nothing (MDB_NOSYNC); the flush is the log's: now, or the next sync. */
    cph_wal_commit(s);
    if (s->sync != CPH_SYNC_ALWAYS) /* the log kept for the span (store.h): as without it */
      cph_store_note_durable(s, cph_store_commit_seq(s));
    else if (!deferred)
      cph_wal_sync(s, NULL); /* a failure is sticky: the durable number stays behind */
    return;
  }
  uint64_t seq = atomic_fetch_add(&s->commit_seq, 1) + 1;
  if (s->sync != CPH_SYNC_ALWAYS) {
    cph_store_note_durable(s, seq); /* :batch, :none: all they promise */
  } else if (deferred) {
    atomic_fetch_add(&s->fsyncs, 1); /* the data pages' fdatasync; the meta page waits */
    cph_store_note_durable(s, seq - 1);
  } else {
    atomic_fetch_add(&s->fsyncs, 2); /* fdatasync, then the meta page written O_DSYNC */
    cph_store_note_durable(s, seq);
  }
}

static void pass_landed(cph_txn *t, bool deferred);
static int pass_counters_record(cph_txn *t);

static int txn_commit(cph_txn *t, bool deferred) {
  if (t->view) {
    t->mdb = NULL;
    return CPH_OK;
  }
  bool pass = t->parent && t->parent->span, asked_deferred = deferred;
  if (!t->mdb)
    return t->ret ? t->ret : txn_fail(t, CPH_ESTATE, "transaction already ended");
  if (!t->parent && t->n_undo)
    counters_write(t);
  if (pass && t->dirty && cph_wal_on(t->store))
    pass_counters_record(t);
  if (t->ret) {
    /* After MDB_MAP_FULL and friends LMDB requires an abort; nothing of this txn lands. */
    cph_txn_abort(t);
    return t->ret;
  }
  put_cursors_close(t);
  if (t->borrowed) { /* its writes are in the parent's LMDB txn already */
    t->mdb = NULL;
    txn_closed(t);
    counters_end(t, true);
    t->parent->dirty |= t->dirty;
    if (pass)
      pass_landed(t, asked_deferred);
    return CPH_OK;
  }
  /* MDB_NOMETASYNC for this commit only, when LMDB syncs at all (not with the log on: then
   * the env has MDB_NOSYNC). LMDB reads the flag inside mdb_txn_commit, on this (the only
   * writer) thread; the flusher thread never reads it (cph_store_sync). */
  bool wal = cph_wal_on(t->store);
  deferred = deferred && !t->parent && t->store->sync == CPH_SYNC_ALWAYS;
  if (deferred && !wal)
    mdb_env_set_flags(t->store->env, MDB_NOMETASYNC, 1);
  int rc = mdb_txn_commit(t->mdb);
  if (deferred && !wal)
    mdb_env_set_flags(t->store->env, MDB_NOMETASYNC, 0);
  t->mdb = NULL; /* LMDB frees the txn whether or not the commit succeeded */
  counters_end(t, rc == MDB_SUCCESS);
  if (rc == MDB_SUCCESS) {
    if (t->parent)
      t->parent->dirty |= t->dirty;
    if (pass)
      pass_landed(t, asked_deferred);
    commit_landed(t, deferred);
  } else if (!t->parent) {
    cph_wal_discard(t->store);
  } else {
    cph_wal_cut(t->store, t->wal_mark);
  }
  txn_closed(t); /* after the log record: commits reach the log in the order they land */
  if (rc) {
    int code = cph_store_map_error(rc);
    if (rc == MDB_MAP_FULL)
      atomic_store(&t->store->map_full, true);
    if (code == CPH_EFULL)
      return txn_fail(t, code,
                      "storage full: commit to data dir '%s' failed: %s (%s)", t->store->dir,
                      mdb_strerror(rc),
                      rc == MDB_MAP_FULL ? "the map grows up to :server :max-map-size-mb"
                                         : "the disk is full");
    return txn_fail(t, code, "commit to data dir '%s' failed: %s", t->store->dir,
                    mdb_strerror(rc));
  }
  return CPH_OK;
}

int cph_txn_commit(cph_txn *t) { return txn_commit(t, false); }
int cph_txn_commit_deferred(cph_txn *t) { return txn_commit(t, true); }

/* With the log on (store/wal.c), an op that changed the txn goes to the log's record buffer
 * too; a failure to record it fails the txn (its commit would land without its record). */
static int wal_note(cph_txn *t, int op, cph_db db, const void *k, size_t klen, const void *v,
                    size_t vlen) {
  if (!cph_wal_on(t->store))
    return CPH_OK;
  int rc = cph_wal_record(t->store, op, db, k, klen, v, vlen);
  if (rc)
    return txn_fail(t, rc, "%s recording a change to database \"%s\" for the log",
                    rc == CPH_ENOMEM ? "out of memory" : "value too large", cph_db_name(db));
  return CPH_OK;
}

static int txn_put(cph_txn *t, cph_db db, const cph_key *k, const void *val, size_t len,
                   bool append) {
  if (t->ret)
    return t->ret;
  if (!t->mdb || !t->write)
    return txn_fail(t, CPH_ESTATE, "put into database \"%s\" outside a write transaction",
                    cph_db_name(db));
  if (check_key(t, db, k))
    return t->ret;
  MDB_val mk = {k->len, (void *)k->data};
  MDB_val mv = {len, (void *)val};
  /* From a database's second put in the txn on, mdb_put with a cursor kept from its previous
   * put: LMDB starts from the cursor's page when the key falls inside it (as a run of keys in
   * one range does: a session's inbox, a channel's history) and searches from the root
   * otherwise. The writes are the same. */
  _Static_assert(CPH_DB_COUNT <= 64, "put_once has a bit per database");
  MDB_cursor *c = t->put_cursor[db];
  int rc = MDB_SUCCESS;
  if (!c && !(t->put_once & (1ull << db))) { /* a cursor costs an allocation: not for one put */
    t->put_once |= 1ull << db;
  } else if (!c && (rc = mdb_cursor_open(t->mdb, t->store->dbi[db], &c)) == MDB_SUCCESS) {
    t->put_cursor[db] = c;
  }
  if (rc == MDB_SUCCESS) {
    rc = MDB_KEYEXIST;
    if (append) /* LMDB answers MDB_KEYEXIST, and changes nothing, for a key not past the last */
      rc = c ? mdb_cursor_put(c, &mk, &mv, MDB_APPEND)
             : mdb_put(t->mdb, t->store->dbi[db], &mk, &mv, MDB_APPEND);
    if (rc == MDB_KEYEXIST)
      rc = c ? mdb_cursor_put(c, &mk, &mv, 0) : mdb_put(t->mdb, t->store->dbi[db], &mk, &mv, 0);
  }
  if (rc)
    return txn_fail_mdb(t, rc, "put", db, k);
  t->dirty = true;
  return wal_note(t, CPH_WAL_PUT, db, k->data, k->len, val, len);
}

int cph_txn_put(cph_txn *t, cph_db db, const cph_key *k, const void *val, size_t len) {
  return txn_put(t, db, k, val, len, false);
}

int cph_txn_append(cph_txn *t, cph_db db, const cph_key *k, const void *val, size_t len) {
  return txn_put(t, db, k, val, len, true);
}

int cph_txn_get(cph_txn *t, cph_db db, const cph_key *k, cph_val *out) {
  if (t->ret)
    return t->ret;
  if (!t->mdb)
    return txn_fail(t, CPH_ESTATE, "get from database \"%s\" outside a transaction",
                    cph_db_name(db));
  if (check_key(t, db, k))
    return t->ret;
  MDB_val mk = {k->len, (void *)k->data};
  MDB_val mv;
  int rc = mdb_get(t->mdb, t->store->dbi[db], &mk, &mv);
  if (rc == MDB_NOTFOUND)
    return CPH_ENOTFOUND;
  if (rc)
    return txn_fail_mdb(t, rc, "get", db, k);
  out->data = mv.mv_data;
  out->len = mv.mv_size;
  return CPH_OK;
}

int cph_txn_del(cph_txn *t, cph_db db, const cph_key *k) {
  if (t->ret)
    return t->ret;
  if (!t->mdb || !t->write)
    return txn_fail(t, CPH_ESTATE, "delete from database \"%s\" outside a write transaction",
                    cph_db_name(db));
  if (check_key(t, db, k))
    return t->ret;
  MDB_val mk = {k->len, (void *)k->data};
  int rc = mdb_del(t->mdb, t->store->dbi[db], &mk, NULL);
  if (rc == MDB_NOTFOUND)
    return CPH_ENOTFOUND;
  if (rc)
    return txn_fail_mdb(t, rc, "delete", db, k);
  t->dirty = true;
  return wal_note(t, CPH_WAL_DEL, db, k->data, k->len, NULL, 0);
}

static int txn_put_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                          const void *rec, bool append) {
  if (t->ret)
    return t->ret;
  if (!t->mdb || !t->write) /* before touching the writer's scratch space */
    return txn_fail(t, CPH_ESTATE, "put into database \"%s\" outside a write transaction",
                    cph_db_name(db));
  /* Encoded on the stack (most records); a larger one, whose size that pass told, a second
   * time into the store's scratch block, kept between records up to CPH_STORE_SCRATCH_KEEP
   * bytes. */
  cph_store *s = t->store;
  uint8_t small[CPH_RECORD_SMALL], *p = small;
  size_t n = cph_record_encode_to(desc, rec, small, sizeof small);
  if (n > sizeof small) {
    if (n > s->scratch_cap) {
      uint8_t *grown = realloc(s->scratch, n);
      if (!grown)
        return txn_fail(t, CPH_ENOMEM, "out of memory encoding a %s", cph_record_name(desc));
      s->scratch = grown;
      s->scratch_cap = n;
    }
    p = s->scratch;
    cph_record_encode_to(desc, rec, p, n);
  }
  int rc = txn_put(t, db, k, p, n, append);
  if (s->scratch_cap > CPH_STORE_SCRATCH_KEEP) {
    free(s->scratch);
    s->scratch = NULL;
    s->scratch_cap = 0;
  }
  return rc;
}

int cph_txn_put_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                       const void *rec) {
  return txn_put_record(t, db, k, desc, rec, false);
}

int cph_txn_append_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                          const void *rec) {
  return txn_put_record(t, db, k, desc, rec, true);
}

int cph_txn_get_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                       void *rec) {
  return cph_txn_get_record_some(t, db, k, desc, rec, UINT64_MAX);
}

int cph_txn_get_record_some(cph_txn *t, cph_db db, const cph_key *k,
                            const cph_record_desc *desc, void *rec, uint64_t fields) {
  cph_val v = {NULL, 0};
  int rc = cph_txn_get(t, db, k, &v);
  if (rc)
    return rc;
  cph_err derr;
  rc = cph_record_decode_some(desc, v.data, v.len, rec, fields, &derr);
  if (rc) {
    char key[160];
    cph_key_describe(k->data, k->len, key, sizeof key);
    return txn_fail(t, rc, "corrupt record in database \"%s\" at key %s: %s", cph_db_name(db),
                    key, derr.msg);
  }
  return CPH_OK;
}

int cph_txn_space(cph_txn *t, size_t *live_bytes, size_t *map_bytes) {
  if (t->ret)
    return t->ret;
  if (!t->mdb)
    return CPH_ESTATE;
  MDB_envinfo info;
  int rc = mdb_env_info(t->store->env, &info);
  size_t pages = 0, psize = 0;
  /* MAIN_DBI (1) is the catalogue of named databases; the free list (0) is not readable. */
  for (int i = -1; rc == MDB_SUCCESS && i < CPH_DB_COUNT; i++) {
    MDB_stat st;
    rc = mdb_stat(t->mdb, i < 0 ? 1 : t->store->dbi[i], &st);
    if (rc == MDB_SUCCESS) {
      pages += st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages;
      psize = st.ms_psize;
    }
  }
  if (rc) /* not sticky: a failed look at the sizes spoils none of the txn's writes */
    return cph_store_map_error(rc);
  pages += cph_wal_held_pages(t->store); /* free, but not reusable yet: no room either */
  *live_bytes = pages * psize;
  if (map_bytes)
    *map_bytes = info.me_mapsize;
  return CPH_OK;
}

int cph_txn_count(cph_txn *t, cph_db db, size_t *n) {
  if (t->ret)
    return t->ret;
  if (!t->mdb)
    return CPH_ESTATE;
  MDB_stat st;
  int rc = mdb_stat(t->mdb, t->store->dbi[db], &st);
  if (rc)
    return cph_store_map_error(rc);
  *n = st.ms_entries;
  return CPH_OK;
}

int cph_txn_del_prefix(cph_txn *t, cph_db db, const cph_key *prefix) {
  cph_cursor cur;
  int rc = cph_cursor_open(t, db, &cur);
  if (rc)
    return rc;
  cph_val k;
  for (rc = cph_cursor_seek(&cur, prefix, &k, NULL); rc == CPH_OK;
       rc = cph_cursor_seek(&cur, prefix, &k, NULL)) {
    if (k.len < prefix->len || memcmp(k.data, prefix->data, prefix->len) != 0)
      break;
    if ((rc = cph_cursor_del(&cur)))
      break;
  }
  cph_cursor_close(&cur);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int cph_txn_empty(cph_txn *t, cph_db db) {
  if (t->ret)
    return t->ret;
  if (!t->mdb || !t->write)
    return txn_fail(t, CPH_ESTATE, "empty database \"%s\" outside a write transaction",
                    cph_db_name(db));
  if (check_no_child(t, "emptying", db))
    return t->ret;
  int rc = mdb_drop(t->mdb, t->store->dbi[db], 0);
  if (rc) {
    cph_key all;
    cph_key_reset(&all);
    return txn_fail_mdb(t, rc, "empty", db, &all);
  }
  t->dirty = true;
  return wal_note(t, CPH_WAL_EMPTY, db, NULL, 0, NULL, 0);
}

/* ---------------------------------------------------------------- id counters */

/* Beyond this many cached counters, a top-level txn's end forgets them all (each one costs
 * a get again when next used); per-channel counters would otherwise grow without bound. */
#define COUNTERS_KEEP 4096

typedef struct cph_counter_undo {
  cph_counter *c;
  uint64_t next;        /* the counter before the txn took ids from it */
  const cph_txn *owner; /* and its owner then */
} cph_counter_undo;

static uint64_t counter_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  return h;
}

static cph_counter *counter_find(cph_counter_table *ct, const char *name) {
  if (!ct->cap)
    return NULL;
  size_t m = ((uintptr_t)name >> 3) & (CPH_COUNTER_MEMO - 1);
  if (ct->memo[m].asked == name && strcmp(ct->memo[m].c->name, name) == 0)
    return ct->memo[m].c;
  for (size_t i = counter_hash(name) & (ct->cap - 1);; i = (i + 1) & (ct->cap - 1)) {
    cph_counter *c = ct->slots[i];
    if (c && strcmp(c->name, name) != 0)
      continue;
    if (c) {
      ct->memo[m].asked = name;
      ct->memo[m].c = c;
    }
    return c;
  }
}

static int counter_insert(cph_counter_table *ct, cph_counter *c) {
  if ((ct->len + 1) * 4 >= ct->cap * 3) {
    size_t cap = ct->cap ? ct->cap * 2 : 16;
    cph_counter **slots = calloc(cap, sizeof *slots);
    if (!slots)
      return CPH_ENOMEM;
    for (size_t i = 0; i < ct->cap; i++) {
      if (!ct->slots[i])
        continue;
      size_t j = counter_hash(ct->slots[i]->name) & (cap - 1);
      while (slots[j])
        j = (j + 1) & (cap - 1);
      slots[j] = ct->slots[i];
    }
    free(ct->slots);
    ct->slots = slots;
    ct->cap = cap;
  }
  size_t j = counter_hash(c->name) & (ct->cap - 1);
  while (ct->slots[j])
    j = (j + 1) & (ct->cap - 1);
  ct->slots[j] = c;
  ct->len++;
  return CPH_OK;
}

void cph_counters_free(cph_counter_table *ct) {
  for (size_t i = 0; i < ct->cap; i++)
    if (ct->slots[i]) {
      free(ct->slots[i]->name);
      free(ct->slots[i]);
    }
  free(ct->slots);
  memset(ct, 0, sizeof *ct);
}

static cph_key counter_key(const char *name) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "next_id");
  cph_key_str(&k, name);
  return k;
}

/* Reads the stored counter through t (nobody took ids from it since it was last written,
 * else it would be cached). */
static int counter_load(cph_txn *t, const char *name, cph_counter **out) {
  cph_key k = counter_key(name);
  cph_val v;
  uint64_t next = 1;
  int rc = cph_txn_get(t, CPH_DB_META, &k, &v);
  if (rc == CPH_OK) {
    if (v.len != 8)
      return txn_fail(t, CPH_ECORRUPT,
                      "corrupt record in database \"meta\" at key \"next_id\"/\"%s\": %zu bytes, "
                      "expected 8",
                      name, v.len);
    next = cph_be64_get(v.data);
  } else if (rc != CPH_ENOTFOUND) {
    return rc;
  }
  cph_counter *c = calloc(1, sizeof *c);
  if (!c || !(c->name = strdup(name)) || counter_insert(&t->store->counters, c)) {
    if (c)
      free(c->name);
    free(c);
    return txn_fail(t, CPH_ENOMEM, "out of memory caching counter \"%s\"", name);
  }
  c->next = next;
  *out = c;
  return CPH_OK;
}

static int undo_push(cph_txn *t, cph_counter *c, uint64_t next, const cph_txn *owner) {
  if (t->n_undo == t->cap_undo) {
    size_t cap = t->cap_undo ? t->cap_undo * 2 : 8;
    cph_counter_undo *u = realloc(t->undo, cap * sizeof *u);
    if (!u)
      return txn_fail(t, CPH_ENOMEM, "out of memory taking an id from counter \"%s\"", c->name);
    t->undo = u;
    t->cap_undo = cap;
  }
  t->undo[t->n_undo++] = (cph_counter_undo){c, next, owner};
  c->owner = t;
  return CPH_OK;
}

/* The txn ended without its writes landing: its counters go back, newest change first. */
static void counters_rollback(cph_txn *t) {
  while (t->n_undo) {
    cph_counter_undo *u = &t->undo[--t->n_undo];
    u->c->next = u->next;
    u->c->owner = u->owner;
  }
}

/* A child's writes joined its parent: so do its undo records (the parent keeps its own,
 * older record of a counter both used). */
static void counters_merge_into_parent(cph_txn *t) {
  cph_txn *p = t->parent;
  for (size_t i = 0; i < t->n_undo; i++) {
    cph_counter_undo *u = &t->undo[i];
    if (u->owner == p)
      u->c->owner = p;
    else if (undo_push(p, u->c, u->next, u->owner) != CPH_OK)
      u->c->owner = u->owner; /* the parent failed (sticky): its commit will not land */
  }
  t->n_undo = 0;
}

/* Before a top-level commit: every counter the txn used is written once. */
static int counters_write(cph_txn *t) {
  for (size_t i = 0; i < t->n_undo && !t->ret; i++) {
    cph_key k = counter_key(t->undo[i].c->name);
    uint8_t be[8];
    cph_be64_put(be, t->undo[i].c->next);
    cph_txn_put(t, CPH_DB_META, &k, be, sizeof be);
  }
  return t->ret;
}

/* Before a pass (a child of the span, store.h) commits: its record carries the values of the
 * counters it and the span took ids from (LMDB gets them only at the span's commit, by
 * counters_write), so a replay needs nothing of the span's own commit. A failure to record
 * them fails the pass. */
static int pass_counters_record(cph_txn *t) {
  for (int level = 0; level < 2 && t->ret == CPH_OK; level++) {
    const cph_txn *owner = level ? t->parent : t;
    for (size_t i = 0; i < owner->n_undo && t->ret == CPH_OK; i++) {
      cph_key k = counter_key(owner->undo[i].c->name);
      uint8_t be[8];
      cph_be64_put(be, owner->undo[i].c->next);
      wal_note(t, CPH_WAL_PUT, CPH_DB_META, k.data, k.len, be, sizeof be);
    }
  }
  return t->ret;
}

/* A pass just committed into the span: its changes go to the log now, as a commit of their
 * own, flushed inline unless the caller deferred it, as a top-level commit's record. */
static void pass_landed(cph_txn *t, bool deferred) {
  cph_store *s = t->store;
  if (!t->dirty)
    return;
  cph_span_pass_landed(s, cph_wal_commit_pass(s));
  if (s->sync != CPH_SYNC_ALWAYS) /* :batch, :none: all they promise (store.h) */
    cph_store_note_durable(s, cph_store_commit_seq(s));
  else if (!deferred)
    cph_wal_sync(s, NULL); /* a failure is sticky: the durable number stays behind */
}

/* Ends the counter bookkeeping of a txn that just ended: `landed` says whether its writes
 * joined the parent (or the disk, for a top-level txn). */
static void counters_end(cph_txn *t, bool landed) {
  if (!t->write)
    return; /* a read txn takes no ids, and a write txn may be open beside it */
  if (!landed)
    counters_rollback(t);
  else if (t->parent)
    counters_merge_into_parent(t);
  else
    for (size_t i = 0; i < t->n_undo; i++)
      t->undo[i].c->owner = NULL;
  free(t->undo);
  t->undo = NULL;
  t->n_undo = t->cap_undo = 0;
  if (!t->parent && t->store->counters.len > COUNTERS_KEEP)
    cph_counters_free(&t->store->counters); /* none is owned: no write txn is open */
}

int cph_txn_next_id(cph_txn *t, const char *counter, uint64_t *out) {
  if (t->ret)
    return t->ret;
  if (!t->mdb || !t->write)
    return txn_fail(t, CPH_ESTATE, "counter \"%s\" used outside a write transaction", counter);
  if (check_no_child(t, "an id", CPH_DB_META))
    return t->ret;
  cph_counter *c = counter_find(&t->store->counters, counter);
  int rc = c ? CPH_OK : counter_load(t, counter, &c);
  if (rc)
    return rc;
  if (c->owner != t && (rc = undo_push(t, c, c->next, c->owner)) != CPH_OK)
    return rc;
  *out = c->next++;
  return CPH_OK;
}

/* ---------------------------------------------------------------- cursors */

int cph_cursor_open(cph_txn *t, cph_db db, cph_cursor *c) {
  c->txn = t;
  c->db = db;
  c->mdb = NULL;
  c->counted = false;
  if (t->ret)
    return t->ret;
  if (!t->mdb)
    return txn_fail(t, CPH_ESTATE, "cursor on database \"%s\" outside a transaction",
                    cph_db_name(db));
  if (check_no_child(t, "a cursor", db))
    return t->ret;
  MDB_cursor *cur;
  int rc = mdb_cursor_open(t->mdb, t->store->dbi[db], &cur);
  if (rc)
    return txn_fail(t, cph_store_map_error(rc), "cannot open a cursor on database \"%s\": %s",
                    cph_db_name(db), mdb_strerror(rc));
  c->mdb = cur;
  if (t->write) { /* a txn with a cursor open lends its LMDB txn to no child */
    t->cursors++;
    c->counted = true;
  }
  return CPH_OK;
}

void cph_cursor_close(cph_cursor *c) {
  if (c->mdb) {
    mdb_cursor_close(c->mdb);
    if (c->counted)
      c->txn->cursors--;
  }
  c->mdb = NULL;
  c->counted = false;
}

static int cursor_step(cph_cursor *c, MDB_val *mk, MDB_cursor_op op, cph_val *key,
                       cph_val *val) {
  cph_txn *t = c->txn;
  if (t->ret)
    return t->ret;
  if (!c->mdb)
    return txn_fail(t, CPH_ESTATE, "cursor on database \"%s\" is closed", cph_db_name(c->db));
  MDB_val mv;
  int rc = mdb_cursor_get(c->mdb, mk, &mv, op);
  if (rc == MDB_NOTFOUND)
    return CPH_ENOTFOUND;
  if (rc)
    return txn_fail(t, cph_store_map_error(rc), "cursor on database \"%s\" failed: %s",
                    cph_db_name(c->db), mdb_strerror(rc));
  if (key) {
    key->data = mk->mv_data;
    key->len = mk->mv_size;
  }
  if (val) {
    val->data = mv.mv_data;
    val->len = mv.mv_size;
  }
  return CPH_OK;
}

int cph_cursor_seek(cph_cursor *c, const cph_key *k, cph_val *key, cph_val *val) {
  MDB_val mk = {0, NULL};
  if (!k)
    return cursor_step(c, &mk, MDB_FIRST, key, val);
  if (check_key(c->txn, c->db, k))
    return c->txn->ret;
  mk.mv_size = k->len;
  mk.mv_data = (void *)k->data;
  return cursor_step(c, &mk, MDB_SET_RANGE, key, val);
}

int cph_cursor_next(cph_cursor *c, cph_val *key, cph_val *val) {
  MDB_val mk = {0, NULL};
  return cursor_step(c, &mk, MDB_NEXT, key, val);
}

int cph_cursor_prev(cph_cursor *c, cph_val *key, cph_val *val) {
  MDB_val mk = {0, NULL};
  /* MDB_PREV on a cursor that a failed MDB_SET_RANGE left unpositioned goes to the last item. */
  return cursor_step(c, &mk, MDB_PREV, key, val);
}

int cph_cursor_last(cph_cursor *c, cph_val *key, cph_val *val) {
  MDB_val mk = {0, NULL};
  return cursor_step(c, &mk, MDB_LAST, key, val);
}

int cph_cursor_del(cph_cursor *c) {
  cph_txn *t = c->txn;
  if (t->ret)
    return t->ret;
  if (!t->write || !c->mdb)
    return txn_fail(t, CPH_ESTATE, "cursor delete in database \"%s\" outside a write txn",
                    cph_db_name(c->db));
  /* The key is recorded before the delete: after it, the page it points into has changed. */
  size_t mark = cph_wal_mark(t->store);
  if (cph_wal_on(t->store)) {
    MDB_val mk = {0, NULL}, mv;
    int g = mdb_cursor_get(c->mdb, &mk, &mv, MDB_GET_CURRENT);
    if (g)
      return txn_fail(t, cph_store_map_error(g), "cursor delete in database \"%s\" failed: %s",
                      cph_db_name(c->db), mdb_strerror(g));
    if (wal_note(t, CPH_WAL_DEL, c->db, mk.mv_data, mk.mv_size, NULL, 0))
      return t->ret;
  }
  int rc = mdb_cursor_del(c->mdb, 0);
  if (rc) {
    cph_wal_cut(t->store, mark);
    return txn_fail(t, cph_store_map_error(rc), "cursor delete in database \"%s\" failed: %s",
                    cph_db_name(c->db), mdb_strerror(rc));
  }
  t->dirty = true;
  return CPH_OK;
}

/* ---------------------------------------------------------------- key description */

void cph_key_describe(const void *key, size_t len, char *buf, size_t bufsize) {
  const uint8_t *p = key;
  cph_buf out = CPH_BUF_INIT;
  size_t i = 0;
  while (i < len) {
    if (out.len)
      cph_buf_putc(&out, '/');
    size_t j = i;
    while (j < len && isprint(p[j]))
      j++;
    if (j > i && (j == len || p[j] == '\0')) {
      /* A printable string segment (NUL-terminated inside composite keys). */
      cph_buf_printf(&out, "\"%.*s\"", (int)(j - i), (const char *)p + i);
      i = j < len ? j + 1 : j;
    } else if (len - i >= 8 && (len - i == 8 || len - i == 16)) {
      cph_buf_printf(&out, "%llu", (unsigned long long)cph_be64_get(p + i));
      i += 8;
    } else {
      cph_buf_puts(&out, "0x");
      for (; i < len; i++)
        cph_buf_printf(&out, "%02x", p[i]);
    }
  }
  snprintf(buf, bufsize, "%s", out.data ? out.data : "(empty)");
  cph_buf_free(&out);
}
