/* Report turns (DESIGN §4). Private to core/.
 *
 * A session with report_interval_s > 0 is a reporter: what reaches it through its channels
 * (not named: no mention, no explicit session) is *held* — staged and counted as usual (the
 * accounting rule), but it does not make the session runnable by itself. At most once per
 * interval, and only when something is held, the session gets a turn of kind `report` whose
 * input lists what arrived per channel and family (counts, first/last time, a sample); the
 * turn carries the held entries, so completing it consumes them. An event that names the
 * session makes it runnable at once as usual (an inbox turn, carrying everything staged).
 * Backpressure step 4 on a channel of the held entries stretches the interval by
 * :backpressure :report-delay-factor.
 *
 * State: per reporter its interval and the engine-clock time of its last report (a restart
 * counts from the open). reports_tick(), from reconcile, marks due reporters at most once a
 * second — O(reporters) then — and sets csession.report_due, which engine_update_work reads.
 * 
 * One way: the engine hands this module the sessions, the policy, backpressure and the clock;
 * it calls nothing of the engine's. */
#ifndef CEPHALON_CORE_REPORTS_H
#define CEPHALON_CORE_REPORTS_H

#include <stdbool.h>
#include <stdint.h>

#include "backpressure.h"
#include "session.h"
#include "store/store.h"

/* The state this module owns: per reporter session its interval and last report. */
typedef struct cph_reports cph_reports;

/* What a check reads, handed in by the engine: the policy in force, backpressure's steps
 * (step 4 stretches the interval), a transaction to read events through, the engine clock. */
typedef struct reports_env {
  const cph_policy *p;
  const cph_backpressure *bp;
  cph_txn *t;
  int64_t now_ns;
} reports_env;

int reports_open(cph_reports **out);
void reports_close(cph_reports *rp);
/* Registers s as a reporter every interval_s seconds from now (0: not a reporter). s must
 * stay registered until reports_forget (the session's delete). */
int reports_set(cph_reports *rp, csession *s, uint32_t interval_s, int64_t now_ns);
void reports_forget(cph_reports *rp, const char *id);
/* Whether entry it of s is held for the next report. */
static inline bool reports_holds(const csession *s, const inbox_item *it) {
  return s->reports && !it->mentioned && !it->direct;
}
/* True when s has staged entries that are not held (they make it runnable at once). */
bool reports_has_unheld(const csession *s);
/* From reconcile: marks the reporters whose report is due and that hold something, and tells
 * on_due (the engine: the session has work now). */
void reports_tick(cph_reports *rp, const reports_env *env, void (*on_due)(void *ctx, csession *s),
                  void *ctx);
/* A report turn of s completed: the next one is an interval from now_ns. */
void reports_done(cph_reports *rp, csession *s, int64_t now_ns);
/* Seconds until s's next report may run (0: due now; -1: not a reporter). */
int64_t reports_next_in_s(const cph_reports *rp, const csession *s, const reports_env *env);
/* The report's input for the staged entries of a turn: "report:" then per channel a line
 * "#chan: N messages, HH:MM–HH:MM" and per entry "- ×k sender: text". Owned by the caller. */
char *reports_input(const cph_staged_msg *staged, size_t n);

#endif
