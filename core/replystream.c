/* The replies stream's records, origins and indexes: see replystream.h. */
#include "replystream.h"

#include <inttypes.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#include "origins.h"

void replystream_origin(char *buf, const char *node, uint64_t id, const uint8_t token[8]) {
  snprintf(buf, REPLYSTREAM_ORIGIN_MAX, "%.*s/%" PRIu64 "/%016" PRIx64, REPLYSTREAM_NODE_MAX,
           node, id, cph_be64_get(token));
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
    rc = origins_put(t, CPH_DB_REPLY_ORIGINS, stored.origin, stored.id);
  if (rc == CPH_OK && stored.origin)
    rc = origins_session_put(t, CPH_DB_REPLY_SESSIONS, stored.session, stored.id);
  return rc;
}

/* In "meta" under "replies_stream": 8 random bytes, then be64 dev and be64 ino of the data
 * file they were minted for. */
int replystream_identity(cph_txn *t, uint64_t dev, uint64_t ino, char *id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "replies_stream");
  cph_val v;
  uint8_t rec[24];
  int rc = cph_txn_get(t, CPH_DB_META, &k, &v);
  bool same = rc == CPH_OK && v.len == sizeof rec &&
              cph_be64_get((const uint8_t *)v.data + 8) == dev &&
              cph_be64_get((const uint8_t *)v.data + 16) == ino;
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  if (same) {
    memcpy(rec, v.data, 8);
  } else {
    if (RAND_bytes(rec, 8) != 1)
      return CPH_EIO;
    cph_be64_put(rec + 8, dev);
    cph_be64_put(rec + 16, ino);
    if ((rc = cph_txn_put(t, CPH_DB_META, &k, rec, sizeof rec)) != CPH_OK)
      return rc;
  }
  snprintf(id, REPLYSTREAM_ID_LEN + 1, "%016" PRIx64, cph_be64_get(rec));
  return CPH_OK;
}

int replystream_offer(cph_txn *t, const cph_reply_rec *carried, uint64_t *added) {
  *added = 0;
  bool held = false;
  int rc = origins_find(t, CPH_DB_REPLY_ORIGINS, carried->origin, &held, NULL);
  if (rc != CPH_OK || held)
    return rc;
  cph_reply_rec rr = {.session = carried->session,
                      .channel = carried->channel,
                      .body = carried->body,
                      .ts_ms = carried->ts_ms,
                      .origin = carried->origin};
  rc = replystream_put(t, &rr, NULL, NULL);
  if (rc == CPH_OK)
    *added = rr.id;
  return rc;
}

typedef struct newest_walk {
  cph_txn *t;
  bool (*fn)(void *ctx, const cph_reply_rec *r);
  void *ctx;
} newest_walk;

static int newest_reply(void *ctx, uint64_t id) {
  newest_walk *w = ctx;
  cph_key rk = cph_key_of_u64(id);
  cph_reply_rec r;
  int rc = cph_txn_get_record(w->t, CPH_DB_REPLIES, &rk, &cph_reply_desc, &r);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  bool more = !r.origin || w->fn(w->ctx, &r);
  cph_record_free(&cph_reply_desc, &r);
  return more ? CPH_OK : ORIGINS_STOP;
}

int replystream_session_newest(cph_txn *t, const char *session, size_t max,
                               bool (*fn)(void *ctx, const cph_reply_rec *r), void *ctx) {
  newest_walk w = {t, fn, ctx};
  return origins_session_newest(t, CPH_DB_REPLY_SESSIONS, session, max, newest_reply, &w);
}

int replystream_forget_session(cph_txn *t, const char *session) {
  return origins_session_forget(t, CPH_DB_REPLY_SESSIONS, session);
}
