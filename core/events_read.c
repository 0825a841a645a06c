/* GET /v1/events/{id}: what the store holds of an event (DESIGN §5, §7 retention). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events_read.h"

void cph_event_info_free(cph_event_info *ev) {
  free(ev->channel);
  free(ev->sender);
  free(ev->body);
  free(ev->kind);
  free(ev->session);
  memset(ev, 0, sizeof *ev);
}

int events_get(cph_store *store, uint64_t id, cph_event_info *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_event_rec r;
  if (rc == CPH_OK)
    rc = cph_txn_get_record(&t, CPH_DB_EVENTS, &k, &cph_event_desc, &r);
  if (rc) {
    if (rc == CPH_ENOTFOUND)
      cph_err_set(err, rc, "no event %llu", (unsigned long long)id);
    else
      cph_err_set(err, rc, "%s", t.err.msg);
    cph_txn_abort(&t);
    return rc;
  }
  static const char *const status[] = {"queued", "stored", "aggregated"};
  out->id = r.id;
  out->channel = r.channel;
  out->sender = r.sender;
  out->body = r.body;
  out->kind = r.kind;
  out->session = r.session;
  out->ts_ms = r.ts_ms;
  out->received_ms = r.received_ms;
  out->status = r.status < 3 ? status[r.status] : "unknown";
  for (int i = 0; i < 32; i++)
    snprintf(out->body_sha256 + 2 * i, 3, "%02x", r.body_sha256[i]);
  out->family = r.family;
  r.channel = r.sender = r.body = r.kind = r.session = NULL;
  cph_record_free(&cph_event_desc, &r);
  cph_txn_abort(&t);
  return CPH_OK;
}
