/* The loop's wake pipe (contract in wake.h). */
#define _GNU_SOURCE /* pipe2 */
#include "wake.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "cephalon/error.h"
#include "common/log.h"

static void on_readable(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  cph_wake *w = arg;
  char buf[64];
  /* Emptied before the callback, so a signal after the callback looked is never lost; a
   * short read emptied the pipe (level-triggered: a byte written since wakes the loop again). */
  while (read(fd, buf, sizeof buf) == (ssize_t)sizeof buf)
    ;
  w->cb(w->arg);
}

int cph_wake_init(cph_wake *w, struct event_base *base, void (*cb)(void *arg), void *arg,
                  const char *who) {
  *w = (cph_wake){{-1, -1}, NULL, cb, arg, who};
  if (pipe2(w->fd, O_NONBLOCK | O_CLOEXEC) != 0) {
    w->fd[0] = w->fd[1] = -1;
    return CPH_EIO;
  }
  w->ev = event_new(base, w->fd[0], EV_READ | EV_PERSIST, on_readable, w);
  if (!w->ev || event_add(w->ev, NULL) != 0)
    return CPH_ENOMEM;
  return CPH_OK;
}

void cph_wake_signal(cph_wake *w) {
  char byte = 1;
  if (write(w->fd[1], &byte, 1) < 0 && errno != EAGAIN)
    cph_warn("%s: cannot wake the loop: %s", w->who, strerror(errno));
}

void cph_wake_free(cph_wake *w) {
  if (w->ev)
    event_free(w->ev);
  w->ev = NULL;
  for (int i = 0; i < 2; i++) {
    if (w->fd[i] >= 0)
      close(w->fd[i]);
    w->fd[i] = -1;
  }
}
