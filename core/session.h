/* A session and its live inbox as the engine keeps them in memory (DESIGN §2, §4). Private to
 * core/. The types every concern of the engine shares — the sessions registry (sessions.c)
 * owns the structs; other modules read them and change a session's inbox only through the
 * functions below. */
#ifndef CEPHALON_CORE_SESSION_H
#define CEPHALON_CORE_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "lanes/sched.h"

/* One live inbox entry (pending or staged): one event, or several counted in one (DESIGN §5:
 * repeats of a family and the queue cap's overflow fold into an entry instead of vanishing).
 * event_id is its first event; the others are member rows in CPH_DB_INBOX_FOLDS (inbox.h). */
typedef struct inbox_item {
  uint64_t id; /* global inbox message id, increasing with arrival */
  uint64_t event_id;
  uint8_t status; /* CPH_INBOX_PENDING or CPH_INBOX_STAGED */
  bool mentioned;
  bool direct;       /* named by an event (mention or explicit session): never held (reports.h) */
  uint8_t fold;      /* inbox_fold (inbox.h): why events are folded into it */
  uint32_t attempts; /* turns that carried it and did not complete */
  uint64_t turn_id;  /* the running turn carrying it, 0 if none */
  int64_t created_ms;
  uint32_t count;    /* events it stands for, >= 1 */
  uint64_t fold_key; /* INBOX_FOLD_REPEAT: the family whose repeats join it */
  int64_t last_ms;   /* arrival of its newest event */
} inbox_item;

/* One session in memory. A million idle ones must fit in 256 bytes of RSS each (DESIGN §12),
 * so: the struct lives in the engine's session slab (no malloc header), its fields are ordered
 * to leave no padding (112 bytes), and its id is not a copy of its own but the scheduler's
 * (one copy per session). */
typedef struct csession {
  /* Borrowed: cph_sched_id(sid), valid while the session is registered under sid — that is,
   * always (a session keeps its sid while it lives). Never written or freed through this
   * pointer; not const only because records borrow it for encoding. */
  char *id;
  /* Live messages in id order: inbox[0 .. n_inbox). The array sits inbox_head entries into
   * an allocation of 1 << inbox_cap_log2 entries (none while inbox is NULL), so that removing
   * an entry near the front moves the entries before it, not the whole tail (sessions.c).
   * Only csession_inbox_push/remove (and the session's free) touch the allocation. */
  inbox_item *inbox;
  uint32_t n_inbox, inbox_head;
  uint32_t n_pending;
  uint32_t n_staged;
  uint64_t folded; /* events the queue cap folded into its overflow entries */
  uint64_t running_turn;  /* 0 when not running */
  uint64_t episode;
  int64_t next_tick_ns; /* when its next autonomy tick is due; 0 = none */
  uint64_t *jobs; /* queued maintenance jobs, oldest first (maintenance sessions) */
  uint32_t n_jobs, cap_jobs;
  uint64_t running_job; /* the job its running turn executes, 0 if none */
  cph_sid sid;
  cph_lane lane;
  uint32_t autonomy_interval_s;
  uint32_t tick_heap_pos; /* index in the tick heap + 1; 0 = not in it */
  bool paused;
  bool in_pending_list; /* queued for the next poll_inbox */
  bool tick_due;
  bool reports;    /* report_interval_s > 0: reports.h holds its channel traffic */
  bool report_due; /* its report is due and it holds something */
  /* Its own while_running as stored (0: its class's default, else 1 + the mode); the mode
   * in force is sessions_while_running(). In the struct's padding: no bytes added. */
  uint8_t while_running;
  uint8_t inbox_cap_log2; /* see inbox */
  /* Cluster mode: another node serves it now (a turn of it was handed back, cph_op
   * u.turn.away): never picked until an inbox retain says this node serves it again. In
   * memory only; in the last byte of padding. */
  bool away;
} csession;

typedef struct channel {
  char *name;
  csession **subscribers;
  size_t n_subscribers, cap_subscribers;
  csession **members;
  size_t n_members, cap_members;
} channel;

/* Inserts item keeping the inbox in id order (ids arrive in order except on requeue) and
 * counts it pending or staged. CPH_OK or CPH_ENOMEM (nothing changed). Amortised O(1) at the
 * end. Either call may move every entry: pointers into s->inbox do not outlive them. */
int csession_inbox_push(csession *s, const inbox_item *item);
/* Removes s->inbox[index]: O(min(index, n_inbox - index)), so removing the oldest entries
 * (the queue cap's overflow fold, a turn's completion) costs O(1) each. */
void csession_inbox_remove(csession *s, uint32_t index);

#endif
