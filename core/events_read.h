/* Reading one stored event back (GET /v1/events/{id}). Private to core/. */
#ifndef CEPHALON_CORE_EVENTS_READ_H
#define CEPHALON_CORE_EVENTS_READ_H

#include "cephalon/cephalon.h"
#include "store/store.h"

/* The event with id, from the store; CPH_ENOTFOUND when there is none. */
int events_get(cph_store *store, uint64_t id, cph_event_info *out, cph_err *err);

#endif
