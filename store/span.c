/* One write transaction across passes: the span (contract in store.h, "the span").
 *
 * Why: under :always a pass's LMDB commit wrote every page it touched (a turn cycle's hot
 * pages: the session record, its inbox, the turn index, the channel's history) once per pass,
 * ~40 pages scattered over the data file, and most of the writer thread's time per cycle went
 * to those commits (bench/PROFILE.md "One write transaction across passes"). The log already
 * makes each pass durable on its own (wal.c), so the data file only needs the pages of many
 * passes once: passes commit into the span (an LMDB child commit: a merge of page lists), and
 * the span commits every :store :span-ms.
 *
 * Writer thread only, like every write txn. */
#include <pthread.h>
#include <stdio.h>

#include "common/clock.h"
#include "common/log.h"
#include "store_internal.h"

/* How long passes wait before trying again a replay that failed (a damaged record, a full disk:
 * causes that go away by an operator's hand, not by retrying). Each attempt reads the span's
 * records from the log and applies them in a new LMDB txn; without a wait every pass (every
 * request, under load) made one. A grow of the map (env.c) tries at once, whatever the wait. */
#define SPAN_REPLAY_BACKOFF_MIN_MS 100
#define SPAN_REPLAY_BACKOFF_MAX_MS 5000

/* The store keeps no clock of its own: real time, as the log's checkpoints wait it. */
static const cph_clock MONOTONIC = {.is_virtual = false};

bool store_log_wanted(const cph_store *s) { return s->sync == CPH_SYNC_ALWAYS || s->span_on; }

int cph_store_span_enable(cph_store *s, bool on, cph_err *err) {
  if (on == s->span_on)
    return CPH_OK;
  if (!on) {
    int rc = cph_store_span_end(s, err);
    if (rc == CPH_OK)
      rc = cph_store_span_replay(s, err);
    if (rc)
      return rc;
  }
  s->span_on = on;
  int rc = CPH_OK;
  if (on && !cph_wal_on(s))
    rc = cph_wal_start(s, err); /* :batch, :none: the log is what makes a pass stay */
  else if (!on && !store_log_wanted(s))
    rc = cph_wal_stop(s, err);
  if (rc)
    s->span_on = !on;
  return rc;
}

bool cph_store_span_open(const cph_store *s) { return s->span_open; }

size_t cph_store_span_bytes(const cph_store *s) { return s->span_open ? s->span_bytes : 0; }

bool cph_store_span_replay_pending(const cph_store *s) { return s->replay_pending; }

bool cph_span_wanted(const cph_store *s) { return s->span_on && cph_wal_on(s); }

int cph_span_begin_pass(cph_store *s, cph_txn *t) {
  if (s->replay_pending) {
    cph_err err = {0};
    int64_t wait_ns = s->replay_retry_ns - cph_clock_now(&MONOTONIC);
    int rc = wait_ns > 0 ? cph_err_set(&err, s->replay_rc, "%s (next attempt in %lld ms)",
                                       s->replay_err.msg, (long long)(wait_ns / 1000000 + 1))
                         : cph_store_span_replay(s, &err);
    if (rc) {
      memset(t, 0, sizeof *t);
      t->store = s;
      t->write = true;
      t->ret = rc;
      t->err = err;
      return rc;
    }
  }
  if (s->span_open && s->span.ret) { /* broken (a fresh LMDB txn could not be begun): end it */
    cph_err err = {0};
    if (cph_store_span_end(s, &err) != CPH_OK)
      cph_error("%s", err.msg);
  }
  if (!s->span_open) {
    int rc = cph_txn_begin_top(s, true, &s->span);
    if (rc) {
      *t = s->span; /* its error, for the caller */
      memset(&s->span, 0, sizeof s->span);
      return rc;
    }
    s->span.span = true;
    s->span_open = true;
    s->span_thread = pthread_self();
    s->span_base = cph_store_commit_seq(s);
    s->span_at = cph_wal_pos_next(s);
    s->span_bytes = 0;
  }
  return cph_txn_begin_child(&s->span, t);
}

bool cph_span_view(cph_store *s, cph_txn *t) {
  if (!s->span_open || !pthread_equal(pthread_self(), s->span_thread))
    return false;
  cph_txn *leaf = &s->span;
  while (leaf->child)
    leaf = leaf->child;
  if (!leaf->mdb)
    return false;
  memset(t, 0, sizeof *t);
  t->store = s;
  t->mdb = leaf->mdb;
  t->view = true;
  return true;
}

void cph_span_pass_landed(cph_store *s, size_t bytes) { s->span_bytes += bytes; }

int cph_store_span_end(cph_store *s, cph_err *err) {
  if (!s->span_open)
    return CPH_OK;
  s->span_open = false;
  uint64_t first = s->span_base + 1;
  size_t bytes = s->span_bytes;
  /* Its passes' records already went to the log; its commit writes only the counters. */
  int rc;
  cph_err why = {0};
  if (s->span_commit_fails) { /* a test's fault (store_internal.h) */
    s->span_commit_fails = false;
    cph_txn_abort(&s->span);
    rc = cph_err_set(&why, CPH_EIO, "commit to data dir '%s' failed: injected by a test",
                     s->dir);
  } else if ((rc = cph_txn_commit_deferred(&s->span)) == CPH_OK) {
    return CPH_OK;
  } else {
    why = s->span.err;
  }
  uint64_t last = cph_store_commit_seq(s);
  if (last < first) { /* no pass of it wrote: nothing acknowledged is missing */
    cph_warn("data dir '%s': an empty write transaction failed to commit: %s", s->dir,
             why.msg);
    return CPH_OK;
  }
  /* Its abort gave the ids its passes took back to the counters, but those passes stand (the
   * replay puts the counters they recorded back): forget them, the next use reloads. */
  cph_counters_free(&s->counters);
  s->replay_pending = true;
  s->replay_at = s->span_at;
  s->replay_first = first;
  s->replay_last = last;
  cph_error("data dir '%s': committing %llu acknowledged commits (%zu bytes of log) into the "
            "data file failed: %s; applying them again from the log",
            s->dir, (unsigned long long)(last - first + 1), bytes, why.msg);
  return cph_store_span_replay(s, err);
}

int cph_store_span_replay(cph_store *s, cph_err *err) {
  if (!s->replay_pending)
    return CPH_OK;
  pthread_mutex_lock(&s->write_mu);
  atomic_fetch_add(&s->open_txns, 1);
  int rc = cph_wal_replay_span(s, s->replay_at, s->replay_first, s->replay_last, err);
  atomic_fetch_sub(&s->open_txns, 1);
  if (rc == CPH_OK) {
    s->replay_pending = false;
    cph_info("data dir '%s': commits %llu..%llu applied again from the log", s->dir,
             (unsigned long long)s->replay_first, (unsigned long long)s->replay_last);
    cph_wal_span_end(s); /* LMDB holds every commit numbered: a checkpoint may start */
    s->replay_backoff_ns = 0;
    s->replay_retry_ns = 0;
  } else {
    int64_t min = (int64_t)SPAN_REPLAY_BACKOFF_MIN_MS * 1000000,
            max = (int64_t)SPAN_REPLAY_BACKOFF_MAX_MS * 1000000;
    s->replay_backoff_ns = !s->replay_backoff_ns         ? min
                           : s->replay_backoff_ns >= max / 2 ? max
                                                             : 2 * s->replay_backoff_ns;
    s->replay_retry_ns = cph_clock_now(&MONOTONIC) + s->replay_backoff_ns;
    s->replay_rc = rc;
    s->replay_err = *err;
  }
  pthread_mutex_unlock(&s->write_mu);
  return rc;
}
