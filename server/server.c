/* What any server file may ask of the server struct main.c owns: a pass soon, a wake of the
 * replies long-polls soon, a policy reload (main.c's, through s->reload), and the answer
 * accounting that lets a shutdown end. Only the struct's own fields and the engine's public
 * API are used here: nothing above this file is called.
 *
 * tests/fuzz/fuzz_api_json.c stands in for all six (it drives passes itself, without
 * main.c's event loop, and never stops). */
#include "server.h"

#include <event2/event.h>

/* How long it waits for answers already handed to libevent to be written. */
#define FLUSH_GRACE_MS 1000

void cph_srv_schedule_pass(cph_srv *s) {
  if (s->pass_scheduled)
    return;
  /* A zero-delay timer, not event_active: the loop polls sockets before running it, so a
   * stream of passes that each want another never starves I/O. */
  struct timeval zero = {0, 0};
  if (evtimer_add(s->ev_pass, &zero) == 0)
    s->pass_scheduled = true;
}

void cph_srv_wake_replies_later(cph_srv *s) {
  if (s->replies_scheduled)
    return;
  struct timeval zero = {0, 0};
  if (evtimer_add(s->ev_replies, &zero) == 0)
    s->replies_scheduled = true;
}

int cph_srv_reload(cph_srv *s, cph_err *err) { return s->reload(s, err); }

/* A shutdown ends when every request was answered, the engine holds no queued operation,
 * the cluster log took what this node made for it (log_unsettled), and every answer was
 * written. A failed write never reports, so once only unwritten answers are left the wait is
 * cut to FLUSH_GRACE_MS. */
void cph_srv_maybe_finish_stop(cph_srv *s) {
  if (!s->stopping || s->open_reqs > 0 || s->log_unsettled || cph_engine_pass_wanted(s->engine))
    return;
  if (s->unflushed == 0) {
    event_base_loopexit(s->base, NULL);
  } else if (!s->flush_grace) {
    s->flush_grace = true;
    struct timeval tv = {0, FLUSH_GRACE_MS * 1000};
    evtimer_add(s->ev_stop_deadline, &tv);
  }
}

void cph_srv_request_closed(cph_srv *s) {
  if (s->open_reqs > 0)
    s->open_reqs--;
  cph_srv_maybe_finish_stop(s);
}

void cph_srv_reply_flushed(cph_srv *s) {
  if (s->unflushed > 0)
    s->unflushed--;
  cph_srv_maybe_finish_stop(s);
}
