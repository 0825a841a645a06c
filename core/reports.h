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
 * second — O(reporters) then — and sets csession.report_due, which engine_update_work reads. */
#ifndef CEPHALON_CORE_REPORTS_H
#define CEPHALON_CORE_REPORTS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine_internal.h"

int reports_open(cph_engine *e);
void reports_close(cph_engine *e);
/* Registers s as a reporter every interval_s seconds from now (0: not a reporter). */
int reports_set(cph_engine *e, csession *s, uint32_t interval_s);
void reports_forget(cph_engine *e, const char *id);
/* Whether entry it of s is held for the next report. */
static inline bool reports_holds(const csession *s, const inbox_item *it) {
  return s->reports && !it->mentioned && !it->direct;
}
/* True when s has staged entries that are not held (they make it runnable at once). */
bool reports_has_unheld(const csession *s);
/* From reconcile: marks the reporters whose report is due and that hold something. */
void reports_tick(cph_engine *e);
/* A report turn of s completed: the next one is an interval from now. */
void reports_done(cph_engine *e, csession *s);
/* Seconds until s's next report may run (0: due now; -1: not a reporter). */
int64_t reports_next_in_s(cph_engine *e, const csession *s);
/* The report's input for the staged entries of a turn: "report:" then per channel a line
 * "#chan: N messages, HH:MM–HH:MM" and per entry "- ×k sender: text". Owned by the caller. */
char *reports_input(const cph_staged_msg *staged, size_t n);

#endif
