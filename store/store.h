/* store/ — the LMDB environment, its named databases and a transaction wrapper.
 *
 * One environment holds every record kind in its own named database (DESIGN §11). The
 * schema version lives in `meta` and is checked at open: a mismatch refuses to open, except
 * that the engine migrates the previous version (cph_store_open_migrating).
 *
 * Transactions carry a sticky error (as in Knot DNS): after the first failure every later
 * call on the transaction does nothing and returns that error, and cph_txn_commit() aborts
 * and returns it. So a writer can issue a sequence of puts and check once, at commit.
 * CPH_ENOTFOUND from a get is an answer, not a failure, and is not sticky. */
#ifndef CEPHALON_STORE_STORE_H
#define CEPHALON_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/buf.h"
#include "cephalon/error.h"
#include "keys.h"
#include "records.h"

/* Bump when any database's key layout or any record version changes. */
/* 2: "context" holds one tree value per session; "memory_scopes" indexes memories by scope.
 * 3: "context" holds a header and one record per node for each session (core/trees.h); a
 *    schema-2 data dir is migrated at open (cph_store_open_migrating).
 * 4: an inbox entry the queue cap folds away keeps its record as written; the session's
 *    folded map in "inbox_folds" tells it from a live one (core/inbox.h); a member row and a
 *    "memory_scopes" row may hold what one ingest request wrote (inbox.h, memory.h). A
 *    schema-3 data dir opens as it is (its folded entries' records say `folded`, its rows
 *    hold one each): the migration only records the new version, so that a schema-3 build
 *    refuses the data dir.
 * 5: an "embed_queue" row may hold a range of ids (core/memory.h); an ingest request's
 *    exact-dedupe entries are one row in "dedupe" (core/dedupe_exact.c). A schema-4 (or -3)
 *    data dir opens as it is (its embed-queue rows hold one id each: a range of one; its
 *    time-ordered exact entries are read beside the rows); the migration records the version
 *    only.
 * 6: kept turn contexts, their refs entries and their rows are one database, "turn_kept"
 *    (core/turnlog.c, Keys), where schema 5 had "turn_contexts", "turn_row_refs" and
 *    "turn_rows": a lease's keeping touches one B-tree instead of three. A schema-5 (or older)
 *    data dir's entries are moved at open (turnlog_migrate) and the three left empty. */
#define CPH_STORE_SCHEMA_VERSION 6u

/* X(enum suffix, database name) */
#define CPH_DB_LIST(X)                                                                    \
  X(META, "meta")             /* schema version, id counters */                          \
  X(SESSIONS, "sessions")     /* id -> session */                                        \
  X(EVENTS, "events")         /* u64 event id -> event */                                \
  X(CHANNEL_LOG, "channel_log") /* channel\0 u64 seq -> u64 event id (channel history) */ \
  X(IDEM_KEYS, "idem_keys")   /* idempotency key -> u64 event id + u64 time */           \
  X(INBOX, "inbox")           /* session\0 u64 seq -> inbox message */                   \
  X(INBOX_FOLDS, "inbox_folds") /* session\0 u64 seq [u64 event] -> fold (inbox.h) */ \
  X(TURNS, "turns")           /* u64 turn id -> turn */                                  \
  X(ACTIVE_TURNS, "active_turns") /* u64 turn id -> "" while leased (restart expires them) */ \
  X(PARKED_TURNS, "parked_turns") /* u64 turn id -> "" while parked */                   \
  X(REPLIES, "replies")       /* u64 reply id -> reply */                                \
  X(REPLY_ORIGINS, "reply_origins") /* origin\0 -> u64 reply id (cluster mode, core/replystream.h) */ \
  X(REPLY_SESSIONS, "reply_sessions") /* session\0 u64 reply id -> "" (cluster mode, replystream.h) */ \
  X(TURN_ORIGINS, "turn_origins") /* origin\0 -> u64 turn id: records imported (core/turnrecs.h) */ \
  X(TURN_SESSIONS, "turn_sessions") /* session\0 u64 turn id -> be64 ordinal (turnrecs.h) */ \
  X(MEMORIES, "memories")     /* u64 memory id -> memory */                              \
  X(MEMORY_SCOPES, "memory_scopes") /* scope\0 class\0 u64 id -> u64 source event (memory.c) */ \
  X(MEMORY_ORIGINS, "memory_origins") /* origin\0 -> u64 memory id: memories imported (handover.c) */ \
  X(JOBS, "jobs")             /* u64 job id -> job */                                    \
  X(OUTBOX, "outbox")         /* u64 item id -> outbox item */                           \
  X(GC_GROUPS, "gc_groups")   /* u64 group id -> gc group */                             \
  X(AGGREGATES, "aggregates") /* u64 family -> aggregate */                              \
  X(CONTEXT, "context")       /* session\0 [u64 seq] -> PACT tree header / node (trees.h) */ \
  X(SEALS, "seals")           /* session\0 u64 seal id -> sealed rendered context */    \
  X(SEAL_ORIGINS, "seal_origins") /* origin\0 -> u64 seal id: seals imported (core/seals.h) */ \
  X(TURN_CONTEXTS, "turn_contexts") /* schema <= 5 only: moved into turn_kept (schema 6) */ \
  X(TURN_TEXTS, "turn_texts") /* session\0 u64 text hash -> a kept context's text (turnlog) */ \
  X(TURN_TEXT_REFS, "turn_text_refs") /* session\0 u64 turn id -> its texts' hashes (turnlog) */ \
  X(TURN_ROWS, "turn_rows")   /* schema <= 5 only: moved into turn_kept (schema 6) */ \
  X(TURN_ROW_REFS, "turn_row_refs") /* schema <= 5 only: moved into turn_kept (schema 6) */ \
  X(TURN_KEPT, "turn_kept")   /* session\0 'k'|'r' ... -> kept turn contexts and their rows (turnlog.c) */ \
  X(CURSORS, "cursors")       /* session\0 channel\0 -> u64 channel index */             \
  X(VECTORS, "vectors")       /* scope\0 u64 memory id -> u32 dims + float32[dims] */   \
  X(EMBED_QUEUE, "embed_queue") /* u64 first id -> "" or be64 last id: pending embeddings */ \
  X(CHANNELS, "channels")     /* channel -> backpressure state (dedupe/backpressure) */   \
  X(DEDUPE, "dedupe")         /* 0xFE u64 row -> exact entries; 0xFF u64 time hash -> one; \0 hash -> family */ \

typedef enum cph_db {
#define CPH__DB_ENUM(name, label) CPH_DB_##name,
  CPH_DB_LIST(CPH__DB_ENUM)
#undef CPH__DB_ENUM
      CPH_DB_COUNT
} cph_db;

const char *cph_db_name(cph_db db);

typedef enum cph_sync_mode {
  CPH_SYNC_ALWAYS, /* every commit durable before it is acknowledged: the write-ahead log */
  CPH_SYNC_BATCH,  /* no fsync on commit; cph_store_sync() is called on a timer */
  CPH_SYNC_NONE    /* never fsync; the OS writes back when it likes */
} cph_sync_mode;

typedef struct cph_store_options {
  const char *dir;     /* created if missing */
  size_t map_size;     /* bytes; the most the data may grow to */
  cph_sync_mode sync;
} cph_store_options;

typedef struct cph_store cph_store;

/* Opens (creating if needed) the environment in o->dir. Errors: CPH_ESCHEMA when the data
 * was written by a different schema version, CPH_EIO / CPH_ESTORE otherwise; err->msg says
 * which directory and why. A data dir of the previous schema is refused too: only the
 * engine migrates (cph_store_open_migrating, below). */
int cph_store_open(const cph_store_options *o, cph_store **out, cph_err *err);

/* How a data dir of an older schema is brought up to this one: `run` rewrites what changed
 * since schema `found` (from <= found < CPH_STORE_SCHEMA_VERSION) inside the write
 * transaction it is given; the store then records CPH_STORE_SCHEMA_VERSION in the same
 * transaction and commits, so a migration happens entirely or not at all. `run` returns
 * CPH_OK or the error (t's sticky error, or its own in *err). */
struct cph_txn;
typedef struct cph_store_migration {
  uint32_t from; /* the oldest schema version it reads */
  int (*run)(void *ctx, uint32_t found, struct cph_txn *t, cph_err *err);
  void *ctx;
} cph_store_migration;

/* cph_store_open, except that a data dir of schema m->from or later (m may be NULL: none) is
 * migrated by m before the open returns. Any other version but this build's is refused
 * as by cph_store_open. */
int cph_store_open_migrating(const cph_store_options *o, const cph_store_migration *m,
                             cph_store **out, cph_err *err);
void cph_store_close(cph_store *s);

int cph_store_set_sync_mode(cph_store *s, cph_sync_mode mode, cph_err *err);

/* A consistent, compacted copy of the store into dir (LMDB's copy with compaction, through a
 * read transaction of its own): callable from any thread while writers keep writing; the copy
 * holds what was committed when it began. dir is created; it must not exist yet, or be empty.
 * Starting a store on the copy gives that state back. */
int cph_store_copy(cph_store *s, const char *dir, cph_err *err);
/* Whether dir may take a copy: it does not exist, or is an empty directory. CPH_EEXISTS when
 * it holds something, CPH_EINVAL when it cannot be read or is no directory (err says which).
 * Any thread. */
int cph_store_copy_dir_check(const char *dir, cph_err *err);
/* The identity of the store's data file (its device and inode): the same for every start on
 * the same directory (also once moved within its file system), another one for a copy of it
 * (cph_store_copy, or a data directory copied by hand). CPH_OK or CPH_EIO. */
int cph_store_file_identity(cph_store *s, uint64_t *dev, uint64_t *ino);
/* ---- durability: commit numbers, flushes and the background flusher ----
 *
 * Every top-level write commit that changed something gets the next commit number (1, 2, ...).
 * A commit is *durable* when a crash of the machine, not only of the process, cannot undo
 * it; cph_store_durable_seq() is the highest number for which that holds, and it covers every
 * commit before it (LMDB's commits are ordered: a flush makes all earlier ones durable too).
 * Under :batch and :none a commit counts as durable when it returns: those modes promise no
 * more (DESIGN §4).
 *
 * How :always keeps the promise (store/wal.c): LMDB commits without flushing (MDB_NOSYNC),
 * and each top-level commit's changes — its puts, deletes and empties, in order — go to the
 * write-ahead log in the data dir with one write before the commit gets its number. A flush
 * is an fdatasync of the log (sequential pages of one or two files), so a process killed at
 * any point loses no commit (its record is in the page cache) and a machine crash loses none
 * that was durable. Every 100 ms a checkpoint pins the snapshot of the last commit (LMDB then
 * reuses none of its pages), flushes the data file and saves its meta pages to `checkpoint`;
 * an open after a crash writes those back, so LMDB sees that snapshot, and applies the log's
 * commits after it again. A clean close (or leaving :always) flushes the data file and
 * removes `checkpoint`: the data file alone is then the store. Files: wal.0, wal.1, wal.2
 * (16 MiB each, reused in turn), checkpoint.
 *
 * A flush that fails is sticky until the store is closed: the kernel may have dropped the
 * pages it could not write, so no later flush can vouch for them (a later fdatasync may
 * succeed without them). From then on cph_store_sync() fails at once with the first error and
 * the durable number never moves again; cph_store_flush_error() reports it. */

/* Flushes every commit that returned before the call to disk (fdatasync of the data file; of
 * the log files that hold them under :always).
 * Safe to call from any thread, also while another thread writes (it touches no LMDB state:
 * only the file descriptor and atomics). On success those commits are durable; a failure is
 * sticky (above) and err says which directory and why. */
int cph_store_sync(cph_store *s, cph_err *err);

/* The newest commit number handed out, and the newest known durable. Any thread. */
uint64_t cph_store_commit_seq(const cph_store *s);
uint64_t cph_store_durable_seq(const cph_store *s);
/* CPH_OK, or the code of the first failed flush with its message in err (when non-NULL). */
int cph_store_flush_error(cph_store *s, cph_err *err);

/* Starts the background flusher: a thread that runs cph_store_sync() whenever
 * cph_store_flush_async() asks, then calls done(ctx) ON THAT THREAD (so done must only do
 * what is safe from another thread: e.g. write to a pipe). Asks made while a flush runs are
 * served by one more flush after it, so done may be called fewer times than asked. CPH_OK,
 * or CPH_ENOMEM / CPH_EIO when the thread cannot start (nothing changed then). */
int cph_store_flusher_start(cph_store *s, void (*done)(void *ctx), void *ctx);
/* Asks the flusher for a flush covering every commit so far; returns at once. Without a
 * running flusher it flushes inline (same effect, the caller waits). */
void cph_store_flush_async(cph_store *s);
/* Lets the flush in progress (and one asked for) finish, then stops and joins the thread.
 * Does nothing when no flusher runs. cph_store_close() calls it. */
void cph_store_flusher_stop(cph_store *s);

/* ---- online map growth (DESIGN §13) ----
 * The map starts at the size the store was opened with and grows while the daemon runs: a
 * write that finds the map full fails (CPH_EFULL) and marks it (cph_store_map_full); the
 * engine, between passes, grows it (cph_store_grow) and applies the write again. A full
 * disk (ENOSPC) is not a full map: it stays an error. A restart opens the map at the size
 * asked for or the data's size, whichever is larger, and it grows again from there. */
bool cph_store_map_full(cph_store *s);
/* A writer that keeps its own reserve (ingest) found the map too full for it. */
void cph_store_note_map_full(cph_store *s);
/* Doubles the map, up to max_bytes and to what the disk can hold (the data file's size plus
 * its free space). Only with no transaction open and no copy running in the process: else
 * CPH_EBUSY (try again later). CPH_EFULL when it cannot grow (err says why: the ceiling or the
 * disk). Clears the mark on success. Under :always it may first write a checkpoint instead,
 * which releases the pages the previous one's pin kept from reuse, and answer CPH_EBUSY (the
 * mark cleared: apply the write again); the next call after that grows. */
int cph_store_grow(cph_store *s, size_t max_bytes, cph_err *err);

/* ---- one write transaction across passes: the span (:sync :always only) ----
 * With the span on, a top-level write txn begun on the writer thread is a child of one
 * long-lived LMDB write txn (the span), begun with the first of them. Committing such a txn
 * (a pass) commits it into the span and writes its record to the log — numbered, and made
 * durable by the log's flush exactly as a top-level commit's (store.h "durability"): a
 * process killed with the span open loses nothing acknowledged, an open replays it. The
 * span's own LMDB commit (cph_store_span_end) then writes the data file's pages of many
 * passes once — the hot pages of a turn cycle are rewritten once per span, not once per
 * pass — and may start a checkpoint; checkpoints start only there.
 *
 * Reads see every committed pass: a read txn begun on the writer thread while the span is
 * open reads through the innermost txn of the open chain (`view`; ending it ends nothing).
 * Begin and end such a read within one call: it must not stay open across a write txn's
 * begin, commit or abort. Other threads read snapshots (a copy, a checkpoint): they see the
 * span's passes once it ended, so the caller ends it first where that matters (a backup).
 *
 * The span ends (commits) when the caller says (cph_store_span_end: by time and size), and by
 * itself before the map grows, the sync mode changes or the store closes. Should its LMDB
 * commit fail (a full map or disk while writing pages), its passes are applied again from
 * the log in a new top-level txn (cph_store_span_replay: at once, and before any later write
 * begins); until that succeeds, write txns fail to begin, saying why. After a replay that
 * failed, the next attempt waits 100 ms, doubling up to 5 s (a write begun meanwhile fails at
 * once with the last attempt's error and when the next one is); a grow of the map tries at
 * once. Off by default.
 *
 * Under :batch and :none the span keeps the log too (cph_store_span_enable starts it, with
 * its checkpoints): its records are written as under :always but flushed only as the mode
 * says (:batch by the flusher, :none never; a checkpoint under :none flushes nothing), so a
 * process killed with the span open loses nothing, as without the span. Turning the span on
 * or off starts or stops the log outside :always (the errors of cph_wal_start/stop). */
int cph_store_span_enable(cph_store *s, bool on, cph_err *err);
bool cph_store_span_open(const cph_store *s);
/* Log bytes the open span's passes wrote (a bound on its dirty pages), 0 when none is open. */
size_t cph_store_span_bytes(const cph_store *s);
/* Commits the open span (CPH_OK when none is open). On failure its passes await a replay. */
int cph_store_span_end(cph_store *s, cph_err *err);
bool cph_store_span_replay_pending(const cph_store *s);
/* Applies the passes of a span whose commit failed again, from the log. CPH_EFULL with the
 * map marked full (cph_store_map_full) when the map needs to grow first. */
int cph_store_span_replay(cph_store *s, cph_err *err);

typedef struct cph_store_stats {
  size_t map_size;   /* bytes reserved */
  size_t used_bytes; /* pages in use * page size */
  /* Disk flushes the store waited for since open: its fdatasync calls — of the log under
   * :always (cph_store_sync, the flusher, a cph_txn_commit), of the data file at a
   * checkpoint, and of the data file under :batch. What "fsyncs per cycle" in the bench
   * counts. */
  uint64_t fsyncs;
} cph_store_stats;
int cph_store_stats_get(cph_store *s, cph_store_stats *out);

/* Unmaps from this process the map pages it has touched so far (madvise MADV_DONTNEED over
 * the used part of the map). The data stays in the page cache and on disk; LMDB faults a page
 * back in on its next read. Call it after a full scan (loading at open) so pages read once do
 * not count in the process's RSS. Safe with transactions open: the map is a shared file
 * mapping, so nothing is lost. Returns CPH_OK or the madvise failure (nothing changed then). */
int cph_store_release_pages(cph_store *s);

/* Maps an LMDB return code or errno to a project code (MDB_MAP_FULL/ENOSPC -> CPH_EFULL,
 * MDB_NOTFOUND -> CPH_ENOTFOUND, MDB_CORRUPTED -> CPH_ECORRUPT, ...). */
int cph_store_map_error(int mdb_rc);

/* ---- transactions ---- */

typedef struct cph_val {
  const void *data;
  size_t len;
} cph_val;

struct cph_counter_undo;

typedef struct cph_txn {
  cph_store *store;
  void *mdb; /* MDB_txn *; NULL once committed or aborted */
  struct cph_txn *parent; /* the enclosing txn of a child, NULL for a top-level one */
  bool write;
  bool dirty;  /* something was written (a child's writes join its parent at commit) */
  int ret;     /* sticky: the first error, CPH_OK while none */
  cph_err err; /* what the first error was, and where */
  /* The counters this txn took ids from, with their values before it (cph_txn_next_id). */
  struct cph_counter_undo *undo;
  size_t n_undo, cap_undo;
  /* The cursor each database's puts go through (MDB_cursor *, opened by its second put in the
   * txn, closed when the txn ends or begins a child), so that a put whose key lands on the
   * page of the database's previous put finds it without a search from the root (txn.c). */
  void *put_cursor[CPH_DB_COUNT];
  uint64_t put_once; /* bit db: db had a put, without a cursor (a txn's only put opens none) */
  /* A child begun on a parent that had written nothing shares the parent's LMDB txn instead
   * of opening an LMDB child (cph_txn_begin_child): `borrowed` says so. */
  bool borrowed;
  unsigned cursors; /* cph_cursors open on this write txn (a parent with one lends nothing) */
  /* Its child while one is open: then this txn refuses every call (CPH_ESTATE, sticky), as
   * LMDB refuses a parent's calls while its child is open — a borrowed child included. */
  struct cph_txn *child;
  size_t wal_mark; /* a child's: the log's record buffer length when it began (store/wal.c) */
  /* The span (below): `span` marks the long-lived top-level txn itself; `view` a read txn
   * that reads through the open span chain instead of a snapshot of its own. */
  bool span, view;
} cph_txn;

int cph_txn_begin(cph_store *s, bool write, cph_txn *t);
/* A nested write transaction inside parent (LMDB child txn). Committing it folds its writes
 * into the parent; aborting it (or a failure in it, e.g. storage full) discards only its own
 * writes and leaves the parent usable — so one failing request does not sink the others of a
 * group commit. The parent must not be used while the child is open.
 *
 * When the parent has written nothing yet (no put, delete or id taken, and no cursor open),
 * the child writes straight into the parent's LMDB txn: an LMDB child costs two allocations
 * of 2 MiB and 1 MiB (its dirty and free page lists) and a merge at commit, and a group
 * commit's first request (the only one when the daemon is not busy) has nothing to protect.
 * Aborting such a child aborts the LMDB txn it shares and begins a fresh one for the parent,
 * which sees the store as it was (it had written nothing, and this thread is the only
 * writer). Either way the contract above holds. */
int cph_txn_begin_child(cph_txn *parent, cph_txn *child);
/* Commits a write transaction (a read one just ends). If the txn already failed, aborts it
 * and returns its sticky error; on a failed commit (e.g. disk full) everything the txn wrote
 * is discarded and the error returned. */
int cph_txn_commit(cph_txn *t);
/* Commits a top-level write txn like cph_txn_commit, but under :sync :always without waiting
 * for it to become durable: its record goes to the write-ahead log (a page-cache write, no
 * flush; LMDB flushes nothing either), and it becomes durable with the next flush of the log —
 * cph_store_sync(), the flusher's, or a later cph_txn_commit's, which flushes the log inline.
 * So a pass's commit costs no disk wait on the writer thread, and the flush can run elsewhere
 * (the flusher) while the next pass is built. (LMDB's own MDB_NOSYNC alone would not do: a
 * meta page may reach the disk before the pages it points to, and LMDB cannot read such an
 * environment after a machine crash. The log's checkpoints, store.h "durability", are what
 * make the data file usable again.) Under :batch and :none it is cph_txn_commit. */
int cph_txn_commit_deferred(cph_txn *t);
void cph_txn_abort(cph_txn *t);

int cph_txn_put(cph_txn *t, cph_db db, const cph_key *k, const void *val, size_t len);
/* The same, for a key that usually sorts after every key of db (an id from a counter): LMDB
 * then places it at the end without a search (about half the cost of a put). A key that does
 * not sort last is put as by cph_txn_put; the result is the same either way. */
int cph_txn_append(cph_txn *t, cph_db db, const cph_key *k, const void *val, size_t len);
/* Values from get and cursors point into the map: valid until the txn ends or writes. */
int cph_txn_get(cph_txn *t, cph_db db, const cph_key *k, cph_val *out);
/* CPH_ENOTFOUND (not sticky) when the key is absent. */
int cph_txn_del(cph_txn *t, cph_db db, const cph_key *k);

/* Encodes rec with desc and puts it. */
int cph_txn_put_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                       const void *rec);
/* cph_txn_put_record with cph_txn_append's placement. */
int cph_txn_append_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                          const void *rec);
/* Gets and decodes. A value that fails to decode is CPH_ECORRUPT (sticky) with a message
 * naming the database and the key: `corrupt record in database "sessions" at key "s1": ...`. */
int cph_txn_get_record(cph_txn *t, cph_db db, const cph_key *k, const cph_record_desc *desc,
                       void *rec);
/* The same, copying only the strings and arrays of `fields` (cph_record_decode_some). */
int cph_txn_get_record_some(cph_txn *t, cph_db db, const cph_key *k,
                            const cph_record_desc *desc, void *rec, uint64_t fields);

/* What the data holds as t sees it (its own uncommitted writes included): the pages of every
 * named database's tree and of the catalogue, times the page size — not the pages LMDB freed
 * for reuse, nor the free-page list itself; but under :always, the freed pages that the
 * checkpoint's pin keeps from reuse until the next checkpoint (store/wal.c) count, as they
 * are no room either. *map_bytes gets the map size. O(databases), plus O(free-list records
 * since the pin) under :always; a failure returns the code without making the txn fail. Lets a writer keep headroom before
 * MDB_MAP_FULL (ingest does, DESIGN §11). */
int cph_txn_space(cph_txn *t, size_t *live_bytes, size_t *map_bytes);

/* How many entries db holds as t sees it. O(1) (LMDB keeps the count); a failure returns
 * the code without making the txn fail. */
int cph_txn_count(cph_txn *t, cph_db db, size_t *n);

/* Next id from a named counter in meta (starts at 1), persisted with the txn.
 *
 * Counters live in memory once looked up (one get per counter until the store evicts it),
 * and a top-level txn writes each counter it used once, just before it commits — not once
 * per id. An aborted txn (child or top-level), or a failed commit, gives its ids back: the
 * counter returns to its value before that txn. So ids are never issued twice, and the
 * stored counter is always past every id in committed data. O(1) per id. The store must be
 * the only writer of the environment (cph_store_open locks the directory). */
int cph_txn_next_id(cph_txn *t, const char *counter, uint64_t *out);

/* ---- cursors: ordered iteration ---- */

typedef struct cph_cursor {
  cph_txn *txn;
  void *mdb; /* MDB_cursor * */
  cph_db db;
  bool counted; /* in txn->cursors (a write txn's) until closed */
} cph_cursor;

int cph_cursor_open(cph_txn *t, cph_db db, cph_cursor *c);
void cph_cursor_close(cph_cursor *c);
/* Positions at the first key >= k (or the first key when k is NULL). CPH_ENOTFOUND at end. */
int cph_cursor_seek(cph_cursor *c, const cph_key *k, cph_val *key, cph_val *val);
int cph_cursor_next(cph_cursor *c, cph_val *key, cph_val *val);
/* The entry before the cursor; after a seek that ran off the end (CPH_ENOTFOUND), the last
 * entry of the database. CPH_ENOTFOUND before the first. */
int cph_cursor_prev(cph_cursor *c, cph_val *key, cph_val *val);
/* Positions at the last entry; CPH_ENOTFOUND when the database is empty. O(log n). */
int cph_cursor_last(cph_cursor *c, cph_val *key, cph_val *val);
/* Deletes the entry under the cursor. */
int cph_cursor_del(cph_cursor *c);
/* Deletes every key of db that starts with prefix's bytes (a session's rows, say). CPH_OK or
 * t's sticky error. */
int cph_txn_del_prefix(cph_txn *t, cph_db db, const cph_key *prefix);
/* Empties db (its pages go to the free list at commit; the database stays). CPH_OK or t's
 * sticky error. */
int cph_txn_empty(cph_txn *t, cph_db db);

/* Writes a readable form of a key into buf: printable segments quoted, 8-byte segments as
 * decimal numbers, anything else as hex — e.g. "s1"/42. */
void cph_key_describe(const void *key, size_t len, char *buf, size_t bufsize);

#endif
