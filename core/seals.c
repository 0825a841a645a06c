/* Seals and their origins: see seals.h. */
#include "seals.h"

#include <stdio.h>
#include <string.h>

#include "origins.h"

cph_key seals_key(const char *session, uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, id);
  return k;
}

int seals_put(cph_txn *t, cph_seal_rec *r) {
  char counter[160];
  snprintf(counter, sizeof counter, "seal:%s", r->session);
  int rc = cph_txn_next_id(t, counter, &r->id);
  cph_key k = seals_key(r->session, r->id);
  if (rc == CPH_OK)
    rc = cph_txn_put_record(t, CPH_DB_SEALS, &k, &cph_seal_desc, r);
  return rc;
}

/* The 8 bytes of a seal made here that its origin shows: FNV-1a 64 of its session, a NUL and
 * its creation time (big-endian). Not a secret, only a tell between seals of one id. */
static void seal_token(const cph_seal_rec *r, uint8_t token[8]) {
  uint64_t h = 14695981039346656037ull;
  uint8_t ms[8];
  cph_be64_put(ms, (uint64_t)r->created_ms);
  for (const char *p = r->session;; p++) {
    h = (h ^ (uint8_t)*p) * 1099511628211ull;
    if (!*p)
      break;
  }
  for (int i = 0; i < 8; i++)
    h = (h ^ ms[i]) * 1099511628211ull;
  cph_be64_put(token, h);
}

void seals_origin(char *buf, const char *node, const cph_seal_rec *r) {
  uint8_t token[8];
  if (r->origin) {
    snprintf(buf, SEALS_ORIGIN_MAX, "%s", r->origin);
  } else if (node) {
    seal_token(r, token);
    replystream_origin(buf, node, r->id, token);
  } else {
    buf[0] = '\0';
  }
}

int seals_holds(cph_txn *t, const char *node, const char *session, const char *origin,
                bool *held) {
  int rc = origins_find(t, CPH_DB_SEAL_ORIGINS, origin, held, NULL);
  uint64_t id = rc == CPH_OK && !*held ? origins_own_id(node, origin) : 0;
  if (!id)
    return rc;
  /* made here? the seal of that id, with this origin (not an older data dir's) */
  cph_key k = seals_key(session, id);
  cph_seal_rec r;
  rc = k.overflow ? CPH_ENOTFOUND : cph_txn_get_record(t, CPH_DB_SEALS, &k, &cph_seal_desc, &r);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  char mine[SEALS_ORIGIN_MAX];
  seals_origin(mine, node, &r);
  *held = !r.origin && strcmp(mine, origin) == 0;
  cph_record_free(&cph_seal_desc, &r);
  return CPH_OK;
}

int seals_import(cph_txn *t, cph_seal_rec *r) {
  int rc = seals_put(t, r);
  if (rc == CPH_OK)
    rc = origins_put(t, CPH_DB_SEAL_ORIGINS, r->origin, r->id);
  return rc;
}

int seals_delete_session(cph_txn *t, const char *session) {
  static const char *const fields[] = {"origin"};
  uint64_t mask = cph_record_field_mask(&cph_seal_desc, fields, 1);
  cph_key start;
  cph_key_reset(&start);
  cph_key_str(&start, session);
  if (start.overflow)
    return CPH_OK; /* no seal has such a key */
  cph_cursor cur;
  int rc = cph_cursor_open(t, CPH_DB_SEALS, &cur);
  cph_val k, v;
  /* seek again after each delete: a delete may move the cursor's page */
  while (rc == CPH_OK && (rc = cph_cursor_seek(&cur, &start, &k, &v)) == CPH_OK) {
    if (k.len < start.len || memcmp(k.data, start.data, start.len) != 0)
      break;
    cph_seal_rec r = {0};
    cph_err err;
    if (cph_record_decode_some(&cph_seal_desc, v.data, v.len, &r, mask, &err) != CPH_OK) {
      char what[160];
      cph_key_describe(k.data, k.len, what, sizeof what);
      rc = cph_err_set(&t->err, CPH_ECORRUPT, "database \"seals\": the seal at %s: %s", what,
                       err.msg);
      break;
    }
    if (r.origin)
      rc = origins_forget(t, CPH_DB_SEAL_ORIGINS, r.origin);
    cph_record_free(&cph_seal_desc, &r);
    if (rc == CPH_OK)
      rc = cph_cursor_del(&cur);
  }
  cph_cursor_close(&cur);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

typedef struct newest_walk {
  cph_txn *t;
  const char *session;
  bool (*fn)(void *ctx, const cph_seal_rec *r);
  void *ctx;
} newest_walk;

static int newest_seal(void *ctx, uint64_t id) {
  newest_walk *w = ctx;
  cph_key k = seals_key(w->session, id);
  cph_seal_rec r;
  int rc = cph_txn_get_record(w->t, CPH_DB_SEALS, &k, &cph_seal_desc, &r);
  if (rc)
    return rc;
  bool more = w->fn(w->ctx, &r);
  cph_record_free(&cph_seal_desc, &r);
  return more ? CPH_OK : ORIGINS_STOP;
}

int seals_session_newest(cph_txn *t, const char *session, size_t max,
                         bool (*fn)(void *ctx, const cph_seal_rec *r), void *ctx) {
  newest_walk w = {t, session, fn, ctx};
  return origins_session_newest(t, CPH_DB_SEALS, session, max, newest_seal, &w);
}
