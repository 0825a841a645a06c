/* Parsing and checking the listen address. */
#ifndef CEPHALON_SERVER_LISTEN_H
#define CEPHALON_SERVER_LISTEN_H

#include <stdbool.h>
#include <stdint.h>

#include "cephalon/error.h"

typedef struct cph_listen_addr {
  char host[256]; /* without brackets */
  uint16_t port;
} cph_listen_addr;

/* "HOST:PORT" or "[V6]:PORT". */
int cph_listen_parse(const char *text, cph_listen_addr *out, cph_err *err);
/* True when every address the host resolves to is loopback (127.0.0.0/8, ::1). */
bool cph_listen_is_loopback(const cph_listen_addr *a);

#endif
