/* The sessions registry (DESIGN §2, §3.3): every session in memory, the channels' subscriber
 * and member lists, the sessions waiting for poll_inbox and the autonomy-tick heap. Private
 * to core/.
 *
 * It owns the csession structs (in a slab), their index by id and by scheduler handle (sid),
 * and the channel structs. Other modules look sessions up and read them here; they change a
 * session's inbox through session.h and its scheduling state through the functions below.
 * It applies the session operations (create, update, delete) and implements the session
 * reads. What other modules keep per session (the context tree, channel cursors) is deleted
 * with the session through the delete_state hook the engine wires. */
#ifndef CEPHALON_CORE_SESSIONS_H
#define CEPHALON_CORE_SESSIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hmap.h"
#include "common/idmap.h"
#include "common/slab.h"
#include "env.h"
#include "session.h"

struct cph_reports;
struct cph_backpressure;

typedef struct sessions_hooks {
  void *ctx;
  /* Deletes, in t, what other modules store of the session (its tree, its cursors). */
  int (*delete_state)(void *ctx, cph_txn *t, const char *session);
} sessions_hooks;

typedef struct cph_sessions {
  cph_core_env *env;
  struct cph_reports *reports; /* reporters' held traffic (reports.h) */
  struct cph_backpressure *bp; /* for the report interval a why answer shows */
  sessions_hooks hooks;
  cph_slab slab;     /* the csession structs */
  cph_idmap by_id;   /* id -> sid (the key read back through by_sid) */
  csession **by_sid; /* sid -> session, NULL for a free handle */
  size_t cap_by_sid;
  cph_hmap channels;  /* name -> channel */
  channel *last_channel; /* what sessions_channel found last (channels live until clear) */
  csession **pending; /* sessions with pending messages, for poll_inbox */
  size_t n_pending, cap_pending;
  csession **tick_heap; /* min-heap on next_tick_ns */
  size_t n_ticks, cap_ticks;
} cph_sessions;

/* The empty registry over env's scheduler. Then sessions_load (at open and after a failed
 * commit); sessions_clear frees it all. */
void sessions_init(cph_sessions *ss, cph_core_env *env, struct cph_reports *reports,
                   struct cph_backpressure *bp, const sessions_hooks *hooks);
int sessions_load(cph_sessions *ss, cph_err *err);
void sessions_clear(cph_sessions *ss);

/* ---- lookups and walks */
csession *sessions_get(const cph_sessions *ss, const char *id);
static inline size_t sessions_count(const cph_sessions *ss) { return ss->by_id.len; }
/* Every session is sessions_at(ss, sid) for one sid < sessions_sid_cap (NULL for a free
 * handle): the way to visit them all, in (nearly) address order. */
static inline size_t sessions_sid_cap(const cph_sessions *ss) { return ss->cap_by_sid; }
static inline csession *sessions_at(const cph_sessions *ss, size_t sid) { return ss->by_sid[sid]; }
channel *sessions_channel(cph_sessions *ss, const char *name, bool create);
bool session_id_valid(const char *id);

/* The while_running mode in force for s (DESIGN §4): its own, else its class's default in
 * the policy in force. */
cph_policy_while_running sessions_while_running(const cph_sessions *ss, const csession *s);

/* ---- scheduling state */
/* Queues s for the next poll_inbox (its pending messages become staged). */
void sessions_mark_pending(cph_sessions *ss, csession *s);
/* poll_inbox (§3.6): the marked sessions' pending messages become staged (in memory: ingest
 * wrote them staged already); returns how many. */
uint64_t sessions_stage_pending(cph_sessions *ss);
/* Tells the scheduler whether s has work: staged input (a reporter's only once its report is
 * due), a due tick or a queued job. */
void sessions_update_work(cph_sessions *ss, csession *s);
void sessions_update_work_all(cph_sessions *ss);
/* (Re)arms s's next autonomy tick at now + interval, or disarms it. */
void sessions_tick_schedule(cph_sessions *ss, csession *s);
/* Marks every session whose tick is due (reconcile). */
void sessions_ticks_fire(cph_sessions *ss);
/* When the next tick falls due; INT64_MAX when none is armed. */
int64_t sessions_next_tick_ns(const cph_sessions *ss);

/* ---- sessions in memory */
csession *csession_new(cph_sessions *ss, const char *id, cph_lane lane, double credits,
                       bool restore);
void csession_free(cph_sessions *ss, csession *s);
/* Moves s to lane with credits in the scheduler (class change, a state import, a failed
 * commit's rollback), in place: its sid, id, work and running turn stay
 * (cph_sched_reassign). CPH_OK, or CPH_EINVAL for credits that are not finite (s unchanged). */
int csession_reassign(cph_sessions *ss, csession *s, cph_lane lane, double credits);
/* Presizes the index, by_sid and the scheduler for n sessions in all. */
int sessions_reserve(cph_sessions *ss, size_t n);
/* Writes s's credits into its record in t (after a turn's charge). */
int persist_session_credits(cph_sessions *ss, cph_txn *t, csession *s);

/* ---- operations and reads */
void sessions_apply(cph_sessions *ss, cph_op *op); /* create, update, delete, inbox retain */
int sessions_info(cph_sessions *ss, const char *id, cph_session_info *out, cph_err *err);
int sessions_list(cph_sessions *ss, const cph_session_filter *f, cph_session_info **out, size_t *n,
                  cph_err *err);
int sessions_why(cph_sessions *ss, const char *id, cph_why_info *out, cph_err *err);

#endif
