/* cph_wake — another thread asks the event loop to run a callback: the thread writes a byte
 * to a pipe the loop watches, and the loop drains the pipe and calls back once for however
 * many wakes came since. The engine's flush thread, the maintenance workers and the search
 * threads each hand their results to the loop so.
 *
 * cph_wake_signal may be called from any thread, any number of times; a full pipe already
 * holds a wake, so it loses nothing. The callback runs on the loop thread, after the pipe was
 * emptied: a signaller whose results sit where the callback takes them all may skip its
 * signal while an earlier one's results are still there untaken. */
#ifndef CEPHALON_SERVER_WAKE_H
#define CEPHALON_SERVER_WAKE_H

#include <event2/event.h>

typedef struct cph_wake {
  int fd[2]; /* -1 while not open */
  struct event *ev;
  void (*cb)(void *arg);
  void *arg;
  const char *who; /* for the warning when a wake cannot be written */
} cph_wake;

/* Opens the pipe and watches it on base. CPH_OK, CPH_EIO (no pipe) or CPH_ENOMEM. w is safe
 * to free (cph_wake_free) whatever this returned. */
int cph_wake_init(cph_wake *w, struct event_base *base, void (*cb)(void *arg), void *arg,
                  const char *who);
void cph_wake_signal(cph_wake *w);
/* Stops watching and closes the pipe; no thread may signal it any more. */
void cph_wake_free(cph_wake *w);

#endif
