/* Turns (DESIGN §4): lease requests waiting for a turn, the leases in flight, and every step
 * of a turn's life — start (agent_turn), heartbeat, complete, fail, requeue, expiry with
 * attempt counting and parking, restart recovery — and the replies and parked-turn reads.
 * Private to core/.
 *
 * It owns the leases (in memory only: at a restart those in flight are expired, §4), the
 * waiting lease requests and the newest reply id. It is handed the modules a turn touches:
 * the sessions registry, context assembly and the tree store, the turn log, maintenance (job
 * turns), memory (a completion's memories), reports and the metrics. A served or failed waiter is
 * answered after the pass commits: it goes onto the engine's done queue. */
#ifndef CEPHALON_CORE_TURNS_H
#define CEPHALON_CORE_TURNS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/hmap.h"
#include "context.h"
#include "env.h"
#include "maint.h"
#include "memory.h"
#include "metrics.h"
#include "ops.h"
#include "replystream.h"
#include "sessions.h"
#include "trees.h"
#include "turnlog.h"

struct cph_reports;

/* The most bytes of ended turns' items (turns_notes below) waiting before kept contexts are
 * left out of them: a few hundred kept contexts at the default window. */
#define TURNS_ENDED_BYTES_MAX ((size_t)32 << 20)

/* Notes a pass leaves for the cluster log (turns.c): elements of one type at v, n of them,
 * room for cap; v[0..committed) are of passes that committed, the rest of the pass under way. */
typedef struct turns_notes {
  void *v;
  size_t n, cap, committed;
} turns_notes;

typedef struct cph_turns {
  cph_core_env *env;
  cph_sessions *sessions;
  cph_context *context;
  cph_trees *trees;
  cph_turnlog *turnlog; /* keeps each leased turn's context (the context explorer) */
  cph_maint *maint;     /* NULL until maintenance opened */
  cph_memory *memory;
  struct cph_reports *reports;
  cph_metrics *metrics;
  op_queue *done;         /* the engine's: called back after the pass commits */
  cph_hmap leases;        /* turn id as decimal string -> lease (key owned by the lease) */
  op_queue waiters;       /* lease requests waiting for a turn, oldest first */
  uint64_t last_reply_id; /* the newest reply stored */
  char replies_stream[REPLYSTREAM_ID_LEN + 1]; /* the stream's identity (replystream.h) */
  /* Cluster mode (report_consumed): the turns lease expiries parked (cph_park_note), for the
   * cluster log's park marks (cph_engine_take_parks); and the items (handover.h) of the turns
   * that ended with no operation to carry them — an expiry, a supersede: each one's record
   * and kept context (cph_session_items, cph_engine_take_ended_items). */
  turns_notes parks, ended;
  /* The bytes of the ended items waiting (their data): past TURNS_ENDED_BYTES_MAX a turn's
   * kept context is left out (its record still goes), counted in ended_kept_skipped until the
   * pass ends and logs it — a mass expiry must not hold every kept context in memory. */
  size_t ended_bytes, ended_kept_skipped;
  /* Session id -> how many of its turns are parked here (sessions with none are absent; read
   * from the store at turns_recover, kept with each park and requeue): a rebuild's retain
   * reads the parked turns of those sessions only (turns_retain_parked). parked_unknown: out of
   * memory once, so the map may miss one — every retain reads them all until the next load. */
  cph_hmap parked_by_session;
  bool parked_unknown;
} cph_turns;

/* The waiters survive a rebuild of memory; the leases do not (turns_clear_leases, then
 * turns_recover). turns_free ends both (answer the waiters first: turns_fail_waiters). */
void turns_init(cph_turns *tu);
void turns_clear_leases(cph_turns *tu);
void turns_free(cph_turns *tu);
/* At open and after a failed commit: leases in flight are expired (a crash is not the
 * worker's attempt) and their input stays staged; last_reply_id is read back. */
int turns_recover(cph_turns *tu, cph_err *err);

/* ---- waiting lease requests */
/* CPH_OK, or CPH_ENOMEM (the caller answers op). */
int turns_wait(cph_turns *tu, cph_op *op);
/* Removes a waiting request (its client went away); true if it was waiting. */
bool turns_cancel_wait(cph_turns *tu, cph_op *op);
/* Answers every waiter with rc and msg, now (shutdown). */
void turns_fail_waiters(cph_turns *tu, int rc, const char *msg);
/* The earliest lease or waiter deadline; INT64_MAX when none. */
int64_t turns_next_deadline_ns(const cph_turns *tu);

/* ---- the pass */
uint32_t turns_serve_waiters(cph_turns *tu); /* agent_turn (§3.6 job 0) */
void turns_apply(cph_turns *tu, cph_op *op); /* heartbeat, complete, fail, requeue */
void turns_reconcile(cph_turns *tu);         /* expire leases, time out waiters */
/* while_running :restart (DESIGN §4): input reached s while its turn ran, so that lease is
 * revoked — its record says superseded, its heartbeats and completion answer
 * CPH_ESUPERSEDED and change nothing — and its input is staged again, attempts unchanged,
 * for the next turn with what arrived. A job turn, or no running turn: nothing happens. */
void turns_supersede(cph_turns *tu, csession *s);

/* Cluster mode's rebuild: the park of an ingest op (u.ingest.park_session, cephalon.h), after
 * its events went in, in the same pass. Sets the op's error only when the store fails. */
void turns_park_keys(cph_turns *tu, cph_op *op);
/* CPH_OP_INBOX_RETAIN's part about the session's parked turns (cephalon.h), after
 * sessions_apply's, in the same pass. */
void turns_retain_parked(cph_turns *tu, cph_op *op);
/* A session delete committed (cluster mode, report_consumed): the keys of the events its
 * parked turns carry join the op's u.session.consumed — the session's done mark then names
 * them, so its shard's watermark moves past them. Its parked turns stay listed, as on a single
 * node (their requeue answers that the session was deleted). */
void turns_session_deleted(cph_turns *tu, cph_op *op);
/* The pass ended: its expiries' park notes and its ended turns' items are handed over from
 * now on (committed), or dropped (the pass was rolled back: nothing of it ended or parked). */
void turns_notes_pass_end(cph_turns *tu, bool committed);
/* cph_engine_take_parks and cph_engine_take_ended_items (cephalon.h). */
int turns_take_parks(cph_turns *tu, cph_park_note **out, size_t *n);
int turns_take_ended_items(cph_turns *tu, cph_session_items **out, size_t *n);

/* ---- reads */
int turns_replies(cph_turns *tu, uint64_t after, size_t limit, cph_reply_info **out, size_t *n,
                  uint64_t *next, cph_err *err);
int turns_parked(cph_store *store, cph_parked_turn **out, size_t *n, cph_err *err);
/* cph_engine_turn_record and _session_turn_records (cephalon.h); node: this node's name in
 * cluster mode (the origin of the records made here), else NULL. */
int turns_record(cph_store *store, const char *node, uint64_t id, cph_turn_record *out,
                 cph_err *err);
int turns_session_records(cph_store *store, const char *node, const char *session, size_t limit,
                          cph_turn_record **out, size_t *n, cph_err *err);

#endif
