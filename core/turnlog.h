/* Kept turn contexts (the context explorer, issue #18): what each leased turn's context was,
 * kept for the newest :context :keep-turns turns of every session, and the diff between two
 * of them. Private to core/.
 *
 * ---- What is kept (database "turn_kept", key session\0 'k' u64 turn id) ----
 * At lease, in the lease's transaction, one cph_turnctx_rec (store/records.h) per turn that is
 * not a job turn: the rendered messages (role, content, coord, and the tree node each renders,
 * found by coordinate and content among the tree's live nodes), the sections' items by id
 * (history events, memories, obligations with their previews, tools), the token accounts and
 * cuts, the staged messages' events and channels, and the session's PACT tree as the turn saw
 * it (every node, waiting ones too: id, coordinate, role, a 160-byte preview and a hash of
 * the content, ttl, cadence, created_at_episode, lifecycle stage). A lease that left parts out
 * (`include`) keeps what was assembled: those parts are empty and `omit` names them, so the
 * diff says it cannot compare them rather than report them as gone.
 * The messages and the nodes are kept as rows, each once per session (record version 3: rows
 * under session\0 'r' in the same database, with each turn's refs entry beside its record
 * naming its rows in order with their depths; turnlog.c says how): a row holds no depth, so a lease writes the rows that are new
 * since the session's newest kept turn — its new messages and cores — not its whole window.
 * Records of versions 1 (texts inline) and 2 (texts by hash in "turn_texts", named by
 * "turn_text_refs") still read, and are trimmed like the others.
 *
 * ---- The bound ----
 * Writing a turn's context deletes the session's oldest ones beyond keep-turns in the same
 * transaction, so a session never holds more than keep-turns (after a policy change, from its
 * next lease on). keep-turns 0 writes nothing and deletes what the session kept. Cost per
 * lease (the tree is the turn's, loaded and ordered once by context assembly), with the
 * session's warm state (turnwarm.h) held: one cursor seek to check it against the store; per
 * message and node a comparison with the one at its place in the previous kept turn (its
 * text compared and, when it is new, hashed and copied once); one put for the record, one for
 * its refs entry and one per new row; for a trimmed turn two deletes and one per row that no
 * remaining turn names. Without it (after a restart, an eviction, a pass that did not
 * commit) the lease first reads every kept turn's refs entry of the session and hashes every
 * row. Keeping runs in a nested transaction: a failure (a full map) loses the kept context,
 * never the lease, and drops the warm state.
 *
 * ---- The diff (from -> to) ----
 * Nodes by id, messages by (role, content) then coordinate, section items by id. For what
 * left, the reason is worked out from the two kept trees and the store as it is now (the
 * reasons are listed at cph_context_change in cephalon.h):
 *   - a node that is waiting in `to`: "cadence"; gone with ttl reached at to's episode
 *     (episode >= created_at_episode + ttl): "ttl_expired", or "lifecycle" on its last
 *     stage; a message core gone: "history_bound"; any other node gone: "deleted" (nothing
 *     else removes a node without a TTL);
 *   - a message a tree node rendered: that node's reason, or "turn_kind" when the node is
 *     still there (an inbox turn's channel view replaces the tree's message cores); a history
 *     message gone while `to` cut messages: "window_budget";
 *   - a history entry older than every entry of `to` while `to` cut history: "window_budget";
 *     of a channel `to` does not show: "not_in_scope";
 *   - a memory deleted with replaced_by: "compaction"; minted from an event `to` shows:
 *     "shown_as_history"; still live while `to` lists newer memories: "window_budget";
 *   - an obligation of a turn that completed: "consumed";
 *   - anything else: "unknown". Message cores move one depth per message every turn; their
 *     moves are not listed (only other nodes' moves: ODI shift, lifecycle).
 * Reads open their own read transaction; at most a few hundred records each. */
#ifndef CEPHALON_CORE_TURNLOG_H
#define CEPHALON_CORE_TURNLOG_H

#include <stdbool.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "env.h"
#include "store/store.h"
#include "context.h"
#include "turnwarm.h"

/* The most memory the sessions' warm states take together (turnwarm.h's bound): about 150 KB
 * a session at the default window, so a few hundred sessions keep theirs. */
#define TURNLOG_WARM_BYTES ((size_t)64 << 20)

/* The kept contexts are in the store; what it holds in memory is each recently leased
 * session's warm state (turnwarm.h), which only makes keeping cheaper: it is checked against
 * the store at every lease and rebuilt from it when missing or stale. The tree a turn is kept
 * with is the one its context was rendered from (context_tree, handed in by the lease). */
/* Keeping's working arrays, per message and node of the turn being kept (cap of each), and a
 * row's bytes or the refs entry: the loop's in cph_turnlog, a deferred job's its own. */
typedef struct turnlog_scratch {
  cph_buf head;
  uint64_t *rows, *dist, *chash;
  int32_t *depth;
  uint32_t *code;
  size_t cap;
} turnlog_scratch;

typedef struct cph_turnlog {
  cph_core_env *env;       /* :context :keep-turns, the store */
  cph_turnwarms warm;      /* by session */
  turnlog_scratch scratch; /* turnlog_keep's (the loop's) */
} cph_turnlog;

void turnlog_init(cph_turnlog *tl, cph_core_env *env);
/* Forgets every warm state (the engine rebuilding its memory from the store). */
void turnlog_clear(cph_turnlog *tl);
void turnlog_free(cph_turnlog *tl);

/* At lease, inside the lease's transaction t, after context assembly filled ti and tree (the
 * session's tree in render order, as t reads it): keeps ti's context as turn turn_id and trims
 * the session's kept turns to keep-turns. Job turns are not kept. Never fails the lease: a
 * failure (or a tree that could not be read) is logged and nothing is kept. */
void turnlog_keep(cph_turnlog *tl, cph_txn *t, uint64_t turn_id, const cph_turn_info *ti,
                  const context_tree *tree);

/* ---- Deferred keeping: working a kept context out beside the loop
 * Keeping is the largest single cost of a lease on the event loop (bench/PROFILE.md), and all
 * but its writes can run on another thread. A lease asked to (cph_op u.lease.defer_keep) does
 * at its pass only what needs the store: turnlog_keep_begin checks the session's warm state
 * against the store (rebuilding it when stale) and returns a job holding the turn's info, its
 * tree (context_tree_hold) and the warm state, pinned (turnwarm.h). turnlog_keep_compute, on
 * any one thread, works out every put and delete — the comparisons with the previous kept turn,
 * the new rows, the refs entry, the record, the trim — and advances the warm state as
 * turnlog_keep would. turnlog_keep_write, on the loop after the lease's pass committed and
 * before the lease is answered (so a read that follows the answer sees it), makes those writes
 * in a write transaction of its own and ends the job; turnlog_keep_abandon ends one that is not
 * to be written (the lease failed). A session has at most one job at a time, so jobs of
 * different sessions may be computed on different threads at once (each works on its own
 * session's warm state, which the loop leaves alone while it is pinned). Between a job's pass
 * and its end, whatever drops the session's warm state — its delete, a state import, a failed
 * pass (turnlog_clear), another lease of the session (kept inline: rare, as a session runs one
 * turn at a time) — marks the pinned one dead, and the job keeps nothing (logged at debug);
 * the next lease rebuilds the warm state from the store.
 * Only version-3 keeping is deferred: with keep-turns 0, in the version-2 test mode, with a
 * tree that could not be read, or when the warm state holds a turn of an older record version
 * (its trim reads the store), turnlog_keep_begin keeps inline and returns NULL. */
typedef struct cph_keep_job cph_keep_job;

/* In the lease's transaction t, instead of turnlog_keep: the job (ti and the op it belongs to
 * must live until the job ends; *tree moves into it), or NULL when the turn was kept inline or
 * is not kept. cx releases the tree at the end. Never fails the lease. */
cph_keep_job *turnlog_keep_begin(cph_turnlog *tl, cph_context *cx, cph_txn *t, uint64_t turn_id,
                                 const cph_turn_info *ti, context_tree *tree);
/* Any thread, once per job. */
void turnlog_keep_compute(cph_keep_job *j);
/* Loop only, between passes, after turnlog_keep_compute returned: writes the job (a write
 * transaction of its own; a failure, or a job that could not be worked out, is logged and
 * keeps nothing) and frees it. */
void turnlog_keep_write(cph_keep_job *j);
/* Loop only: frees a job that is not to be written (computed or not). */
void turnlog_keep_abandon(cph_keep_job *j);

/* Tests only: while on, kept contexts are written as version-2 records (texts by hash, no
 * rows), so that a data dir holding both versions can be made and read. Process-wide. */
void turnlog_test_write_v2(bool on);
/* Tests only: the warm states' bound in bytes from the next lease on (0: none is kept, every
 * lease rebuilds from the store; -1: TURNLOG_WARM_BYTES). Process-wide. */
void turnlog_test_warm_bytes(long long bytes);
/* Name new rows by their whole 64-bit hash, as before row names carried their turn (turnlog.c,
 * "Row names"): for tests that a data directory holding both kinds keeps working. */
void turnlog_test_hash_names(bool on);

/* Deletes every kept context of a session (session deletion). */
/* Storage schema 6 (store/store.h): moves a schema-5 data dir's kept contexts, refs entries
 * and rows from their three databases into "turn_kept" (turnlog.c, Keys), inside the
 * migration's transaction t. CPH_OK, or the error with err saying what and where (a key that
 * is not a session id and a number: CPH_ECORRUPT). */
#define TURNLOG_MIGRATES_FROM 5u /* the newest schema version turnlog_migrate rewrites */
int turnlog_migrate(cph_txn *t, cph_err *err);

int turnlog_delete_session(cph_turnlog *tl, cph_txn *t, const char *session);

/* ---- carried with a session's state (core/handover.c, cluster mode)
 * A kept context moves to a shard's new owner as one self-contained record: the version-2
 * shape the read path materialises (messages with role, content and coordinate; nodes with
 * their previews; the tools; token accounts), texts inline, no hashes, no rows — as a
 * version-1 record holds it. The sections' history, memories and obligations and the staged
 * events are left out and marked omitted: they are this node's ids, read from its store. The
 * new owner stores it as such a record (one put, no rows, so "every row a kept record names is
 * held, and only those" holds untouched), under the turn id the turn's record got there, and
 * trims the session to its own keep-turns. */
#define TURNLOG_CARRY_MAX 8 /* the most turns turnlog_newest hands over */

/* Calls fn(ctx, r) for the session's newest min(max, TURNLOG_CARRY_MAX) kept contexts, newest
 * first, each read through t and made self-contained (above; r->turn_id is this node's id; fn
 * may not keep r's strings). A kept context that cannot be read is logged and skipped. CPH_OK,
 * fn's error, or the store's. Reads only. */
int turnlog_newest(cph_txn *t, const char *session, size_t max,
                   int (*fn)(void *ctx, cph_turnctx_rec *r), void *ctx);

/* What is wrong with a carried record of session (NULL: nothing): another session's, not
 * self-contained, or arrays that disagree. */
const char *turnlog_carried_problem(const cph_turnctx_rec *r, const char *session);

/* Stores the carried record r (turnlog_carried_problem said nothing) as kept turn `turn` of its
 * session, unless that turn is kept already, then trims the session to :context :keep-turns
 * (keep-turns 0: stores nothing). The session's warm state is dropped: the next lease rebuilds
 * it from the store. CPH_OK or the store's error. */
int turnlog_import(cph_turnlog *tl, cph_txn *t, uint64_t turn, cph_turnctx_rec *r);

/* ---- reads (cephalon.h: cph_engine_kept_turns, _turn_context, _context_diff) */
int turnlog_list(cph_store *store, const char *session, cph_kept_turn **out, size_t *n,
                 cph_err *err);
int turnlog_get(cph_store *store, const char *session, uint64_t turn, cph_turn_context *out,
                cph_err *err);
int turnlog_diff(cph_store *store, const char *session, uint64_t from, uint64_t to,
                 cph_context_diff *out, cph_err *err);

#endif
