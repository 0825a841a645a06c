/* The replies stream's records, origins and indexes: see replystream.h. */
#include "replystream.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void replystream_origin(char *buf, const char *node, uint64_t id, const uint8_t token[8]) {
  snprintf(buf, REPLYSTREAM_ORIGIN_MAX, "%.*s/%" PRIu64 "/%016" PRIx64, REPLYSTREAM_NODE_MAX,
           node, id, cph_be64_get(token));
}

/* The two index rows of rr (replystream.h). */
static int index_origin(cph_txn *t, const cph_reply_rec *rr) {
  cph_key ok, sk;
  cph_key_reset(&ok);
  cph_key_str(&ok, rr->origin);
  uint8_t be[8];
  cph_be64_put(be, rr->id);
  int rc = cph_txn_put(t, CPH_DB_REPLY_ORIGINS, &ok, be, sizeof be);
  cph_key_reset(&sk);
  cph_key_str(&sk, rr->session);
  cph_key_u64(&sk, rr->id);
  if (rc == CPH_OK)
    rc = cph_txn_put(t, CPH_DB_REPLY_SESSIONS, &sk, "", 0);
  return rc;
}

int replystream_put(cph_txn *t, cph_reply_rec *rr, const char *node, const uint8_t token[8]) {
  int rc = cph_txn_next_id(t, "reply", &rr->id);
  cph_reply_rec stored = *rr;
  char minted[REPLYSTREAM_ORIGIN_MAX];
  if (rc == CPH_OK && !stored.origin && node) {
    replystream_origin(minted, node, stored.id, token);
    stored.origin = minted;
  }
  cph_key rk = cph_key_of_u64(stored.id);
  if (rc == CPH_OK)
    rc = cph_txn_put_record(t, CPH_DB_REPLIES, &rk, &cph_reply_desc, &stored);
  if (rc == CPH_OK && stored.origin)
    rc = index_origin(t, &stored);
  return rc;
}

int replystream_holds(cph_txn *t, const char *origin, bool *held) {
  cph_key ok;
  cph_key_reset(&ok);
  cph_key_str(&ok, origin);
  cph_val v;
  int rc = ok.overflow ? CPH_ENOTFOUND : cph_txn_get(t, CPH_DB_REPLY_ORIGINS, &ok, &v);
  *held = rc == CPH_OK;
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int replystream_session_newest(cph_txn *t, const char *session, size_t max,
                               bool (*fn)(void *ctx, const cph_reply_rec *r), void *ctx) {
  cph_key from;
  cph_key_reset(&from);
  cph_key_str(&from, session);
  size_t plen = from.len;
  cph_key_u64(&from, UINT64_MAX);
  if (from.overflow)
    return CPH_OK; /* no session of that name was indexed */
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_REPLY_SESSIONS, &c);
  if (rc)
    return rc;
  cph_val k;
  /* the session's rows end just below (session, UINT64_MAX): the row before the first at or
   * after it, or the last row of the database */
  rc = cph_cursor_seek(&c, &from, &k, NULL);
  rc = rc == CPH_OK         ? cph_cursor_prev(&c, &k, NULL)
       : rc == CPH_ENOTFOUND ? cph_cursor_last(&c, &k, NULL)
                             : rc;
  for (size_t n = 0; rc == CPH_OK && n < max; n++) {
    if (k.len != plen + 8 || memcmp(k.data, from.data, plen) != 0)
      break;
    cph_key rk = cph_key_of_u64(cph_be64_get((const uint8_t *)k.data + plen));
    cph_reply_rec r;
    int grc = cph_txn_get_record(t, CPH_DB_REPLIES, &rk, &cph_reply_desc, &r);
    if (grc == CPH_OK) {
      bool more = !r.origin || fn(ctx, &r);
      cph_record_free(&cph_reply_desc, &r);
      if (!more)
        break;
    } else if (grc != CPH_ENOTFOUND) {
      rc = grc;
      break;
    }
    rc = cph_cursor_prev(&c, &k, NULL);
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int replystream_forget_session(cph_txn *t, const char *session) {
  cph_key start;
  cph_key_reset(&start);
  cph_key_str(&start, session);
  if (start.overflow)
    return CPH_OK;
  return cph_txn_del_prefix(t, CPH_DB_REPLY_SESSIONS, &start);
}
