/* The write-ahead log of :sync :always (store/wal.c) on real LMDB in temp dirs: a process
 * killed with SIGKILL at a random moment reopens with exactly what it committed (no less
 * than it saw durable), with and without one write txn spanning its commits (the span, whose
 * own commit may fail and be applied again from the log), and a read after each commit sees
 * it; a torn last record, a scribbled meta page, a damaged checkpoint and mode switches. Seeds: CPH_PROPERTY_SEED / CPH_PROPERTY_CASES (tests/support/prop.h). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "store/store_internal.h"
#include "tests/support/prop.h"
#include "tests/support/testutil.h"

/* ---------------------------------------------------------------- the model */

#define NDB 4
#define NKEY 40
static const cph_db DBS[NDB] = {CPH_DB_SESSIONS, CPH_DB_EVENTS, CPH_DB_INBOX, CPH_DB_JOBS};

typedef struct slot {
  bool present;
  uint32_t len;
  uint64_t tag; /* the value's bytes are a function of (tag, len) */
  uint64_t h;   /* the entry's hash while present */
} slot;

/* The store's content as the child's txns see it: its hash is the sum of its entries'. */
typedef struct model {
  slot s[NDB][NKEY];
  uint64_t sum;
} model;

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t entry_hash(int db, const void *k, size_t kl, const void *v, size_t vl) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)db;
  for (size_t i = 0; i < kl; i++)
    h = (h ^ ((const uint8_t *)k)[i]) * 0x100000001b3ull;
  h = mix(h ^ kl);
  for (size_t i = 0; i < vl; i++)
    h = (h ^ ((const uint8_t *)v)[i]) * 0x100000001b3ull;
  return mix(h ^ (vl << 20));
}

static cph_key key_of(int i) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "k");
  cph_key_u64(&k, (uint64_t)i);
  return k;
}

static void value_of(uint64_t tag, uint32_t len, uint8_t *out) {
  rng r = {tag};
  for (uint32_t i = 0; i < len; i += 8) {
    uint64_t x = next(&r);
    memcpy(out + i, &x, len - i < 8 ? len - i : 8);
  }
}

static void model_set(model *m, int d, int i, uint64_t tag, uint32_t len, const uint8_t *v) {
  slot *s = &m->s[d][i];
  if (s->present)
    m->sum -= s->h;
  cph_key k = key_of(i);
  s->present = true;
  s->tag = tag;
  s->len = len;
  s->h = entry_hash(d, k.data, k.len, v, len);
  m->sum += s->h;
}

static void model_del(model *m, int d, int i) {
  slot *s = &m->s[d][i];
  if (s->present)
    m->sum -= s->h;
  s->present = false;
}

/* The store's content, hashed as the model's: every entry of the test's databases. */
static uint64_t store_hash(cph_store *s, size_t *entries) {
  cph_txn t;
  uint64_t sum = 0;
  size_t n = 0;
  if (cph_txn_begin(s, false, &t) != CPH_OK)
    return 1;
  for (int d = 0; d < NDB; d++) {
    cph_cursor c;
    cph_val k, v;
    cph_cursor_open(&t, DBS[d], &c);
    for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
         rc = cph_cursor_next(&c, &k, &v)) {
      sum += entry_hash(d, k.data, k.len, v.data, v.len);
      n++;
    }
    cph_cursor_close(&c);
  }
  cph_txn_abort(&t);
  if (entries)
    *entries = n;
  return sum;
}

/* ---------------------------------------------------------------- the child */

typedef struct msg {
  char kind; /* 'I' intent: seq and the model's hash once it lands; 'C' landed; 'F' failed;
              * 'D' durable up to seq; 'N' the id the txn in progress took (in seq) */
  uint64_t seq, hash;
} msg;

static int g_pipe = -1;

static void say(char kind, uint64_t seq, uint64_t hash) {
  msg m = {kind, seq, hash};
  if (write(g_pipe, &m, sizeof m) != (ssize_t)sizeof m)
    _exit(5);
}

static void child_fail(const char *what, int d, int i) {
  fprintf(stderr, "test_wal child: %s (db %d key %d)\n", what, d, i);
  _exit(3);
}

static uint8_t g_val[12000];

/* Random ops in t, applied to m as they succeed; children nested up to depth 3. */
static void run_ops(rng *r, cph_store *s, cph_txn *t, model *m, int depth) {
  int nops = 1 + (int)below(r, depth ? 6 : 12);
  for (int n = 0; n < nops && t->ret == CPH_OK; n++) {
    int d = (int)below(r, NDB), i = (int)below(r, NKEY);
    cph_key k = key_of(i);
    uint32_t what = below(r, 100);
    if (what < 40) {
      uint32_t len = below(r, 10) == 0 ? 2000 + below(r, 9000) : 1 + below(r, 300);
      uint64_t tag = next(r);
      value_of(tag, len, g_val);
      int rc = below(r, 4) == 0 ? cph_txn_append(t, DBS[d], &k, g_val, len)
                                : cph_txn_put(t, DBS[d], &k, g_val, len);
      if (rc == CPH_OK)
        model_set(m, d, i, tag, len, g_val);
    } else if (what < 55) {
      int rc = cph_txn_del(t, DBS[d], &k);
      if (rc == CPH_OK && !m->s[d][i].present)
        child_fail("deleted a key the model does not hold", d, i);
      if (rc == CPH_ENOTFOUND && m->s[d][i].present)
        child_fail("a key the model holds is missing", d, i);
      if (rc == CPH_OK)
        model_del(m, d, i);
    } else if (what < 64) {
      cph_cursor c;
      cph_val ck, cv;
      if (cph_cursor_open(t, DBS[d], &c) != CPH_OK)
        continue;
      if (cph_cursor_seek(&c, &k, &ck, &cv) == CPH_OK) {
        int j = (int)cph_be64_get((const uint8_t *)ck.data + 2);
        if (cph_cursor_del(&c) == CPH_OK)
          model_del(m, d, j);
      }
      cph_cursor_close(&c);
    } else if (what < 66) {
      cph_key all;
      cph_key_reset(&all);
      cph_key_str(&all, "k");
      if (cph_txn_del_prefix(t, DBS[d], &all) == CPH_OK)
        for (int j = 0; j < NKEY; j++)
          model_del(m, d, j);
    } else if (what < 68) {
      if (cph_txn_empty(t, DBS[d]) == CPH_OK)
        for (int j = 0; j < NKEY; j++)
          model_del(m, d, j);
    } else if (what < 82 && depth < 3) {
      model inner = *m;
      cph_txn c;
      if (cph_txn_begin_child(t, &c) != CPH_OK) {
        cph_txn_abort(&c);
        continue;
      }
      run_ops(r, s, &c, &inner, depth + 1);
      if (below(r, 3) == 0)
        cph_txn_abort(&c);
      else if (cph_txn_commit(&c) == CPH_OK)
        *m = inner;
    } else {
      cph_val v;
      int rc = cph_txn_get(t, DBS[d], &k, &v);
      const slot *sl = &m->s[d][i];
      if (rc == CPH_ENOTFOUND ? sl->present
                              : rc == CPH_OK && (!sl->present || v.len != sl->len ||
                                                 entry_hash(d, k.data, k.len, v.data, v.len) !=
                                                     sl->h))
        child_fail("a get disagrees with the model", d, i);
    }
  }
}

static void flushed(void *ctx) { (void)ctx; }

/* A read txn begun after a commit sees it: with the span (store.h) open, it reads through it. */
static void read_sees_commits(rng *r, cph_store *s, const model *m) {
  cph_txn t;
  if (cph_txn_begin(s, false, &t) != CPH_OK)
    child_fail(t.err.msg, -1, -1);
  for (int n = 0; n < 4; n++) {
    int d = (int)below(r, NDB), i = (int)below(r, NKEY);
    cph_key k = key_of(i);
    cph_val v;
    int rc = cph_txn_get(&t, DBS[d], &k, &v);
    const slot *sl = &m->s[d][i];
    if (rc == CPH_ENOTFOUND ? sl->present
                            : rc != CPH_OK || !sl->present || v.len != sl->len ||
                                  entry_hash(d, k.data, k.len, v.data, v.len) != sl->h)
      child_fail("a read after a commit disagrees with it", d, i);
  }
  cph_txn_abort(&t);
}

/* A full map (a pass's, a span's commit, a span's replay): grown, as the engine does. */
static void grow_or_fail(cph_store *s, cph_err *err) {
  int g = CPH_EFULL;
  for (int tries = 0; tries < 8 && (g == CPH_EFULL || g == CPH_EBUSY); tries++)
    g = cph_store_grow(s, (size_t)1 << 30, err);
  if (g != CPH_OK && g != CPH_EBUSY) /* EBUSY: a checkpoint made room */
    child_fail(err->msg, -1, -1);
}

static void child_main(uint64_t seed, const char *dir, int fd) {
  g_pipe = fd;
  rng r = {seed};
  cph_store_options o = {dir, (size_t)(1 + below(&r, 3)) << 20, CPH_SYNC_ALWAYS};
  cph_store *s;
  cph_err err = {0};
  if (cph_store_open(&o, &s, &err) != CPH_OK)
    child_fail(err.msg, -1, -1);
  cph_wal_set_checkpoint_ms(s, 1 + (long)below(&r, 30));
  if (below(&r, 4) != 0 && cph_store_flusher_start(s, flushed, NULL) != CPH_OK)
    child_fail("flusher", -1, -1);
  model committed = {0};
  /* what the store holds at open: empty on the first run */
  if (store_hash(s, NULL) != 0)
    child_fail("the store is not empty at the start", -1, -1);
  uint64_t durable = 0;
  /* Half the cases commit into a span (store.h): its passes' records make them durable, its
   * own commit comes every few txns, a quarter of those fail and are applied again from the
   * log (span_commit_fails). A third start in :none or :batch, where the span keeps the log
   * too, and every case may switch modes now and then. */
  static const cph_sync_mode MODES[3] = {CPH_SYNC_ALWAYS, CPH_SYNC_NONE, CPH_SYNC_BATCH};
  bool span = below(&r, 2) == 0;
  if (cph_store_span_enable(s, span, &err) != CPH_OK)
    child_fail(err.msg, -1, -1);
  if (below(&r, 3) == 0 &&
      cph_store_set_sync_mode(s, MODES[1 + below(&r, 2)], &err) != CPH_OK)
    child_fail(err.msg, -1, -1);
  say('R', 0, 0); /* the parent's timer starts now: opening made the log files */
  for (;;) {
    if (below(&r, 150) == 0 &&
        cph_store_set_sync_mode(s, MODES[below(&r, 3)], &err) != CPH_OK)
      child_fail(err.msg, -1, -1);
    cph_txn t;
    if (cph_txn_begin(s, true, &t) != CPH_OK)
      child_fail(t.err.msg, -1, -1);
    model m = committed;
    run_ops(&r, s, &t, &m, 0);
    uint64_t id;
    /* An id taken (a counter of meta), kept in the txn's writes: once it lands, a reopened
     * store hands out only higher ids. */
    if (below(&r, 2) == 0 && t.ret == CPH_OK && cph_txn_next_id(&t, "wal_test", &id) == CPH_OK) {
      cph_key k = key_of(NKEY - 1);
      value_of(id, 8, g_val);
      if (cph_txn_put(&t, CPH_DB_JOBS, &k, g_val, 8) == CPH_OK) {
        model_set(&m, NDB - 1, NKEY - 1, id, 8, g_val);
        say('N', id, 0);
      }
    }
    bool dirty = t.dirty && t.ret == CPH_OK;
    uint64_t seq = cph_store_commit_seq(s) + 1;
    if (dirty)
      say('I', seq, m.sum);
    int rc = below(&r, 3) == 0 ? cph_txn_commit(&t) : cph_txn_commit_deferred(&t);
    if (rc == CPH_OK && dirty) {
      if (cph_store_commit_seq(s) != seq)
        child_fail("the commit got another number", -1, -1);
      committed = m;
      say('C', seq, m.sum);
    } else if (rc == CPH_OK) {
      committed = m; /* nothing changed */
    } else {
      if (dirty)
        say('F', seq, 0);
      if (rc != CPH_EFULL)
        child_fail(t.err.msg, -1, -1);
      if (cph_store_map_full(s))
        grow_or_fail(s, &err);
    }
    if (below(&r, 3) == 0)
      read_sees_commits(&r, s, &committed);
    if (span && below(&r, 8) == 0) {
      s->span_commit_fails = below(&r, 4) == 0;
      int e = cph_store_span_end(s, &err);
      if (e == CPH_EFULL)
        grow_or_fail(s, &err);
      else if (e != CPH_OK)
        child_fail(err.msg, -1, -1);
      if (cph_store_span_replay_pending(s))
        child_fail("a span's passes still wait to be applied again", -1, -1);
      read_sees_commits(&r, s, &committed);
    }
    if (below(&r, 2) == 0)
      cph_store_flush_async(s);
    uint64_t d = cph_store_durable_seq(s);
    if (d > durable) {
      durable = d;
      say('D', d, 0);
    }
    if (cph_store_flush_error(s, &err) != CPH_OK)
      child_fail(err.msg, -1, -1);
  }
}

/* ---------------------------------------------------------------- the parent */

static cph_store *open_store(const char *dir, cph_sync_mode mode, cph_err *err) {
  cph_store_options o = {dir, 1u << 20, mode};
  cph_store *s = NULL;
  return cph_store_open(&o, &s, err) == CPH_OK ? s : NULL;
}

static long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* One case: a child writes for a random while and is killed; the reopened store must hold
 * the model of its last landed commit, or of the one it was committing when killed (a kill
 * loses nothing the page cache holds) — so never less than what it saw durable. */
static void kill_case(uint64_t seed) {
  char *dir = cph_test_tmpdir("wal");
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    child_main(seed, dir, fds[1]);
    _exit(4);
  }
  close(fds[1]);
  rng r = {seed ^ 0x5eed};
  long run_ms = 10 + (long)below(&r, 250), until = now_ms() + 5000;
  uint64_t landed = 0, landed_hash = 0, pending_hash = 0, durable = 0;
  uint64_t landed_id = 0, pending_id = 0; /* the highest id a landed commit took; the open one's */
  bool pending = false, open = true;
  int status = 0;
  bool exited = false;
  msg m;
  size_t have = 0;
  for (;;) {
    long left = until - now_ms();
    if (left <= 0 && !exited) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      exited = true;
    }
    struct pollfd p = {fds[0], POLLIN, 0};
    if (open && poll(&p, 1, exited ? 0 : (int)(left > 0 ? left : 0)) <= 0) {
      if (exited)
        break;
      continue;
    }
    ssize_t n = read(fds[0], (char *)&m + have, sizeof m - have);
    if (n <= 0) {
      open = false;
      if (exited)
        break;
      continue;
    }
    have += (size_t)n;
    if (have < sizeof m)
      continue;
    have = 0;
    switch (m.kind) {
    case 'R':
      until = now_ms() + run_ms;
      break;
    case 'I':
      pending = true;
      pending_hash = m.hash;
      CPH_PROP_CHECK(seed, m.seq == landed + 1, "commit %llu after %llu",
                     (unsigned long long)m.seq, (unsigned long long)landed);
      break;
    case 'C':
      landed = m.seq;
      landed_hash = m.hash;
      pending = false;
      if (pending_id > landed_id)
        landed_id = pending_id;
      pending_id = 0;
      break;
    case 'F':
      pending = false;
      pending_id = 0;
      break;
    case 'D':
      durable = m.seq;
      break;
    case 'N':
      pending_id = m.seq;
      break;
    }
  }
  close(fds[0]);
  CPH_PROP_CHECK(seed, WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                 "the child ended by itself (status %d): see its message above", status);
  CPH_PROP_CHECK(seed, durable <= landed, "durable %llu past the last landed commit %llu",
                 (unsigned long long)durable, (unsigned long long)landed);
  cph_err err = {0};
  cph_store *s = open_store(dir, below(&r, 2) ? CPH_SYNC_ALWAYS : CPH_SYNC_BATCH, &err);
  CPH_PROP_CHECK(seed, s != NULL, "reopen failed: %s", err.msg);
  size_t entries;
  uint64_t h = store_hash(s, &entries);
  cph_txn t;
  uint64_t next_id = 0;
  CPH_PROP_CHECK(seed, cph_txn_begin(s, true, &t) == CPH_OK, "begin after reopen: %s", t.err.msg);
  CPH_PROP_CHECK(seed, cph_txn_next_id(&t, "wal_test", &next_id) == CPH_OK, "next id: %s",
                 t.err.msg);
  cph_txn_abort(&t);
  cph_store_close(s);
  CPH_PROP_CHECK(seed, next_id > landed_id,
                 "the reopened store hands out id %llu, which a landed commit took already",
                 (unsigned long long)next_id);
  CPH_PROP_CHECK(seed, h == landed_hash || (pending && h == pending_hash),
                 "after %llu commits (durable up to %llu) the reopened store (%zu entries) "
                 "holds neither the last landed commit nor the one in progress",
                 (unsigned long long)landed, (unsigned long long)durable, entries);
  /* and the recovered store reopens the same (the recovery's own checkpoint is sound) */
  s = open_store(dir, CPH_SYNC_ALWAYS, &err);
  CPH_PROP_CHECK(seed, s != NULL, "second reopen failed: %s", err.msg);
  CPH_PROP_CHECK(seed, store_hash(s, NULL) == h, "the second reopen differs");
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

static void test_a_killed_writer_reopens_with_every_commit_it_made(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(20261130, 40, &seed, &cases);
  for (long c = 0; c < cases; c++)
    kill_case(seed + (uint64_t)c);
}

/* ---------------------------------------------------------------- crafted crashes */

/* A child commits keys 1..n (each fully synced: durable) in "events" and exits without
 * closing the store: the data dir as a crash of the process leaves it. Checkpoints only the
 * first, so every record is in wal.0. */
static void crash_after_commits(const char *dir, int n) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    cph_err err = {0};
    cph_store *s = open_store(dir, CPH_SYNC_ALWAYS, &err);
    if (!s)
      _exit(2);
    cph_wal_set_checkpoint_ms(s, 1000000);
    for (int i = 1; i <= n; i++) {
      cph_txn t;
      cph_key k = cph_key_of_u64((uint64_t)i);
      char v[32];
      snprintf(v, sizeof v, "value %d", i);
      cph_txn_begin(s, true, &t);
      cph_txn_put(&t, CPH_DB_EVENTS, &k, v, strlen(v));
      if (cph_txn_commit(&t) != CPH_OK || cph_store_durable_seq(s) != (uint64_t)i)
        _exit(3);
    }
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static int count_events(cph_store *s, int *highest) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  cph_cursor c;
  cph_val k, v;
  int n = 0;
  *highest = 0;
  cph_cursor_open(&t, CPH_DB_EVENTS, &c);
  for (int rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    n++;
    *highest = (int)cph_be64_get(k.data);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  return n;
}

static bool exists(const char *dir, const char *name) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* Runs fn with stderr going to a temp file, and returns what it wrote (malloc'd). */
static char *capture_stderr(cph_store *(*fn)(const char *dir, cph_err *err), const char *dir,
                            cph_store **out, cph_err *err) {
  char *path = cph_test_write_tmpfile(".log", "");
  fflush(stderr);
  int saved = dup(2), fd = open(path, O_WRONLY | O_TRUNC);
  dup2(fd, 2);
  close(fd);
  *out = fn(dir, err);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  size_t len;
  char *text = cph_test_read_file(path, &len);
  unlink(path);
  free(path);
  return text;
}

static cph_store *open_always(const char *dir, cph_err *err) {
  return open_store(dir, CPH_SYNC_ALWAYS, err);
}

/* Opens file `name` of dir for writing (its path into path), asserting it opened. */
static int open_in(const char *dir, const char *name, char *path, size_t cap) {
  snprintf(path, cap, "%s/%s", dir, name);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  return fd;
}

/* Flips the bits of mask in the byte at off of fd. */
static void flip_byte(int fd, off_t off, uint8_t mask) {
  uint8_t b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= mask;
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
}

/* The last record of the log cut short (a machine crash while it was written): it was never
 * acknowledged as durable, so the store comes back at the commit before it, and says so. */
static void test_a_torn_last_record_reopens_at_the_commit_before_it(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("waltorn");
  crash_after_commits(dir, 20);
  /* walk wal.0's records to the 20th and damage its last byte */
  char p[4200];
  int fd = open_in(dir, "wal.0", p, sizeof p);
  off_t off = 0, last = -1;
  for (int i = 1; i <= 20; i++) {
    uint8_t head[16];
    assert_int_equal(pread(fd, head, 16, off), 16);
    uint32_t len;
    uint64_t seq;
    memcpy(&len, head, 4);
    memcpy(&seq, head + 8, 8);
    assert_int_equal(seq, (uint64_t)i);
    last = off + 16 + (off_t)len - 1;
    off += 16 + (off_t)len;
  }
  flip_byte(fd, last, 0xff);
  close(fd);

  cph_store *s;
  cph_err err = {0};
  char *log = capture_stderr(open_always, dir, &s, &err);
  assert_non_null(s);
  assert_non_null(strstr(log, "19 commits replayed"));
  free(log);
  int highest;
  assert_int_equal(count_events(s, &highest), 19);
  assert_int_equal(highest, 19);
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

/* A later commit's meta page on disk before its pages (what MDB_NOSYNC allows a machine
 * crash to leave): both meta pages garbage after the crash. Recovery writes the checkpoint's
 * back and replays the log: nothing is lost. */
static void test_a_scribbled_meta_page_loses_nothing(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("walmeta");
  crash_after_commits(dir, 30);
  char p[4200];
  int fd = open_in(dir, "data.mdb", p, sizeof p);
  uint8_t junk[8192];
  memset(junk, 0xab, sizeof junk);
  assert_int_equal(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
  close(fd);
  cph_err err = {0};
  cph_store *s = open_store(dir, CPH_SYNC_BATCH, &err);
  if (!s)
    fail_msg("reopen: %s", err.msg);
  int highest;
  assert_int_equal(count_events(s, &highest), 30);
  assert_int_equal(highest, 30);
  /* opened outside :always: the replayed data is flushed and the checkpoint dropped */
  assert_false(exists(dir, "checkpoint"));
  cph_store_close(s);
  s = open_store(dir, CPH_SYNC_ALWAYS, &err);
  assert_non_null(s);
  assert_int_equal(count_events(s, &highest), 30);
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

/* A checkpoint is replaced by rename, so a damaged one is not a crash: the open refuses,
 * naming the file, and changes nothing. */
static void test_a_damaged_checkpoint_is_an_error_naming_it(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("walckpt");
  crash_after_commits(dir, 3);
  char p[4200];
  int fd = open_in(dir, "checkpoint", p, sizeof p);
  flip_byte(fd, 30, 1);
  close(fd);
  cph_err err = {0};
  cph_store *s = open_store(dir, CPH_SYNC_ALWAYS, &err);
  assert_null(s);
  assert_int_equal(err.code, CPH_ECORRUPT);
  assert_non_null(strstr(err.msg, p));
  cph_test_rmtree(dir);
  free(dir);
}

static void put_event(cph_store *s, uint64_t id) {
  cph_txn t;
  cph_key k = cph_key_of_u64(id);
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
  assert_int_equal(cph_txn_put(&t, CPH_DB_EVENTS, &k, "x", 1), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
}

/* :always keeps a checkpoint and three 16 MiB log files; leaving it, or a clean close,
 * leaves the data file flushed and no checkpoint, and the data reopens intact. */
static void test_mode_switches_and_a_clean_close_leave_no_checkpoint(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("walmode");
  cph_err err = {0};
  cph_store *s = open_store(dir, CPH_SYNC_ALWAYS, &err);
  assert_non_null(s);
  assert_true(exists(dir, "checkpoint"));
  for (int i = 0; i < 3; i++) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/wal.%d", dir, i);
    assert_int_equal(stat(p, &st), 0);
    assert_true(st.st_size >= (off_t)16 << 20);
  }
  put_event(s, 1);
  assert_int_equal(cph_store_durable_seq(s), 1);
  assert_int_equal(cph_store_set_sync_mode(s, CPH_SYNC_NONE, &err), CPH_OK);
  assert_false(exists(dir, "checkpoint"));
  put_event(s, 2);
  assert_int_equal(cph_store_set_sync_mode(s, CPH_SYNC_ALWAYS, &err), CPH_OK);
  assert_true(exists(dir, "checkpoint"));
  assert_int_equal(cph_store_durable_seq(s), 2); /* the first checkpoint flushed the data */
  put_event(s, 3);
  cph_txn t;
  cph_key k = cph_key_of_u64(4);
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
  cph_txn_put(&t, CPH_DB_EVENTS, &k, "y", 1);
  assert_int_equal(cph_txn_commit_deferred(&t), CPH_OK);
  assert_int_equal(cph_store_durable_seq(s), 3); /* deferred: durable with the next sync */
  assert_int_equal(cph_store_sync(s, &err), CPH_OK);
  assert_int_equal(cph_store_durable_seq(s), 4);
  cph_store_close(s);
  assert_false(exists(dir, "checkpoint"));
  s = open_store(dir, CPH_SYNC_NONE, &err);
  assert_non_null(s);
  int highest;
  assert_int_equal(count_events(s, &highest), 4);
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

/* A span whose commit fails and whose replay fails too (its first record damaged here, as a
 * disk error might): writes are refused with the reason, nothing is lost, no write tries the
 * replay again before the wait after the failed attempt is over, and once the record reads
 * right again the next write's begin after it applies the passes and goes on. */
static void test_a_span_that_cannot_be_applied_again_refuses_writes_until_it_is(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("walspan");
  cph_err err = {0};
  cph_store *s = open_store(dir, CPH_SYNC_ALWAYS, &err);
  assert_non_null(s);
  assert_int_equal(cph_store_span_enable(s, true, &err), CPH_OK);
  put_event(s, 1); /* the span begins with it */
  assert_true(cph_store_span_open(s));
  cph_wal_pos at = s->span_at;
  put_event(s, 2);
  put_event(s, 3);
  char name[16], p[4200];
  snprintf(name, sizeof name, "wal.%u", at.file);
  int fd = open_in(dir, name, p, sizeof p);
  flip_byte(fd, at.off + 20, 0x10); /* inside the first pass's record */
  s->span_commit_fails = true;
  assert_int_not_equal(cph_store_span_end(s, &err), CPH_OK);
  assert_true(cph_store_span_replay_pending(s));
  assert_non_null(strstr(err.msg, "again from the log"));
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_ECORRUPT);
  assert_non_null(strstr(t.err.msg, "acknowledged commits 1..3"));
  flip_byte(fd, at.off + 20, 0x10);
  close(fd);
  /* A begin within the wait after the failed attempt tries nothing: refused with the last
   * attempt's error and when the next one is, the passes still waiting. */
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_ECORRUPT);
  assert_non_null(strstr(t.err.msg, "acknowledged commits 1..3"));
  assert_non_null(strstr(t.err.msg, "next attempt in"));
  assert_true(cph_store_span_replay_pending(s));
  usleep(250 * 1000); /* past the first wait (100 ms: span.c) */
  put_event(s, 4); /* its begin applies the three again first */
  assert_false(cph_store_span_replay_pending(s));
  int highest;
  assert_int_equal(count_events(s, &highest), 4);
  assert_int_equal(highest, 4);
  cph_store_close(s);
  s = open_store(dir, CPH_SYNC_ALWAYS, &err);
  assert_non_null(s);
  assert_int_equal(count_events(s, &highest), 4);
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_span_that_cannot_be_applied_again_refuses_writes_until_it_is),
      cmocka_unit_test(test_a_torn_last_record_reopens_at_the_commit_before_it),
      cmocka_unit_test(test_a_scribbled_meta_page_loses_nothing),
      cmocka_unit_test(test_a_damaged_checkpoint_is_an_error_naming_it),
      cmocka_unit_test(test_mode_switches_and_a_clean_close_leave_no_checkpoint),
      cmocka_unit_test(test_a_killed_writer_reopens_with_every_commit_it_made),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
