/* bench/pageshim.c — an LD_PRELOAD shim for cephalond that counts what its store writes:
 * bytes of pwrite/pwrite64 and of writev on regular files (LMDB writes a page alone with pwrite, a
 * run of adjacent pages with lseek + writev: both are the pages a commit writes), commits,
 * and puts, deletes and value bytes per LMDB database. Written to $CPH_PAGESHIM_OUT when the
 * daemon exits. Built and used by bench/pages.sh; measurement only, never in the daemon. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <lmdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

enum { MAX_DBI = 256 };

static atomic_ulong pwrite_bytes, writev_bytes, commits;
static atomic_ulong db_puts[MAX_DBI], db_dels[MAX_DBI], put_bytes[MAX_DBI];
static char names[MAX_DBI][48];

static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_commit)(MDB_txn *);
static int (*real_put)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *, unsigned);
static int (*real_cursor_put)(MDB_cursor *, MDB_val *, MDB_val *, unsigned);
static int (*real_del)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *);
static int (*real_cursor_del)(MDB_cursor *, unsigned);
static int (*real_dbi_open)(MDB_txn *, const char *, unsigned, MDB_dbi *);

__attribute__((constructor)) static void shim_init(void) {
  real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
  real_writev = dlsym(RTLD_NEXT, "writev");
  real_commit = dlsym(RTLD_NEXT, "mdb_txn_commit");
  real_put = dlsym(RTLD_NEXT, "mdb_put");
  real_cursor_put = dlsym(RTLD_NEXT, "mdb_cursor_put");
  real_del = dlsym(RTLD_NEXT, "mdb_del");
  real_cursor_del = dlsym(RTLD_NEXT, "mdb_cursor_del");
  real_dbi_open = dlsym(RTLD_NEXT, "mdb_dbi_open");
}

__attribute__((destructor)) static void shim_report(void) {
  const char *path = getenv("CPH_PAGESHIM_OUT");
  FILE *o = path ? fopen(path, "w") : NULL;
  if (!o)
    return;
  fprintf(o, "store_bytes %lu pwrite_bytes %lu writev_bytes %lu commits %lu\n",
          (unsigned long)(pwrite_bytes + writev_bytes), (unsigned long)pwrite_bytes,
          (unsigned long)writev_bytes, (unsigned long)commits);
  for (int i = 0; i < MAX_DBI; i++)
    if (db_puts[i] || db_dels[i])
      fprintf(o, "db %s puts %lu dels %lu put_bytes %lu\n", names[i][0] ? names[i] : "?",
              (unsigned long)db_puts[i], (unsigned long)db_dels[i], (unsigned long)put_bytes[i]);
  fclose(o);
}

static void count_put(MDB_dbi d, const MDB_val *v) {
  if (d < MAX_DBI) {
    db_puts[d]++;
    put_bytes[d] += v->mv_size;
  }
}

int mdb_dbi_open(MDB_txn *t, const char *name, unsigned flags, MDB_dbi *d) {
  int rc = real_dbi_open(t, name, flags, d);
  if (rc == 0 && name && *d < MAX_DBI)
    snprintf(names[*d], sizeof names[*d], "%s", name);
  return rc;
}

ssize_t pwrite64(int fd, const void *b, size_t n, off_t off) {
  pwrite_bytes += n;
  return real_pwrite64(fd, b, n, off);
}

/* liblmdb calls pwrite (the same call on 64-bit Linux) */
ssize_t pwrite(int fd, const void *b, size_t n, off_t off) {
  pwrite_bytes += n;
  return real_pwrite64(fd, b, n, off);
}

ssize_t writev(int fd, const struct iovec *v, int n) {
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
    for (int i = 0; i < n; i++)
      writev_bytes += v[i].iov_len;
  return real_writev(fd, v, n);
}

int mdb_txn_commit(MDB_txn *t) {
  commits++;
  return real_commit(t);
}

int mdb_put(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v, unsigned flags) {
  count_put(d, v);
  return real_put(t, d, k, v, flags);
}

int mdb_cursor_put(MDB_cursor *c, MDB_val *k, MDB_val *v, unsigned flags) {
  count_put(mdb_cursor_dbi(c), v);
  return real_cursor_put(c, k, v, flags);
}

int mdb_del(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v) {
  if (d < MAX_DBI)
    db_dels[d]++;
  return real_del(t, d, k, v);
}

int mdb_cursor_del(MDB_cursor *c, unsigned flags) {
  MDB_dbi d = mdb_cursor_dbi(c);
  if (d < MAX_DBI)
    db_dels[d]++;
  return real_cursor_del(c, flags);
}
