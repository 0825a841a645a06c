/* The origin and session indexes of records other nodes made: see origins.h. */
#include "origins.h"

#include <stdlib.h>
#include <string.h>

int origins_put(cph_txn *t, cph_db db, const char *origin, uint64_t id) {
  cph_key ok;
  cph_key_reset(&ok);
  cph_key_str(&ok, origin);
  uint8_t be[8];
  cph_be64_put(be, id);
  return cph_txn_put(t, db, &ok, be, sizeof be);
}

int origins_forget(cph_txn *t, cph_db db, const char *origin) {
  cph_key ok;
  cph_key_reset(&ok);
  cph_key_str(&ok, origin);
  int rc = ok.overflow ? CPH_ENOTFOUND : cph_txn_del(t, db, &ok);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int origins_find(cph_txn *t, cph_db db, const char *origin, bool *held, uint64_t *id) {
  cph_key ok;
  cph_key_reset(&ok);
  cph_key_str(&ok, origin);
  cph_val v;
  int rc = ok.overflow ? CPH_ENOTFOUND : cph_txn_get(t, db, &ok, &v);
  *held = rc == CPH_OK;
  if (id)
    *id = rc == CPH_OK && v.len == 8 ? cph_be64_get(v.data) : 0;
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int origins_session_put(cph_txn *t, cph_db db, const char *session, uint64_t id) {
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, session);
  cph_key_u64(&sk, id);
  return cph_txn_put(t, db, &sk, "", 0);
}

int origins_session_put_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t id,
                                uint64_t ordinal) {
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, session);
  cph_key_u64(&sk, id);
  uint8_t v[8];
  cph_be64_put(v, ordinal);
  return cph_txn_put(t, db, &sk, v, sizeof v);
}

int origins_session_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t id,
                            uint64_t *ordinal) {
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, session);
  cph_key_u64(&sk, id);
  *ordinal = 0;
  if (sk.overflow)
    return CPH_OK;
  cph_val v;
  int rc = cph_txn_get(t, db, &sk, &v);
  if (rc == CPH_OK && v.len == 8)
    *ordinal = cph_be64_get(v.data);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

static int count_row(void *ctx, uint64_t id) {
  (void)id;
  ++*(uint64_t *)ctx;
  return CPH_OK;
}

int origins_session_next_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t *next) {
  cph_key from;
  cph_key_reset(&from);
  cph_key_str(&from, session);
  size_t plen = from.len;
  cph_key_u64(&from, UINT64_MAX);
  *next = 1;
  if (from.overflow)
    return CPH_OK;
  cph_cursor c;
  int rc = cph_cursor_open(t, db, &c);
  if (rc)
    return rc;
  cph_val k, v;
  rc = cph_cursor_seek(&c, &from, &k, NULL);
  rc = rc == CPH_OK         ? cph_cursor_prev(&c, &k, &v)
       : rc == CPH_ENOTFOUND ? cph_cursor_last(&c, &k, &v)
                             : rc;
  bool row = rc == CPH_OK && k.len == plen + 8 && memcmp(k.data, from.data, plen) == 0;
  bool counted = row && v.len == 8;
  if (counted)
    *next = cph_be64_get(v.data) + 1;
  cph_cursor_close(&c);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  if (!row || counted)
    return CPH_OK;
  uint64_t n = 0; /* rows from before ordinals: counted once, the next row holds the count */
  rc = origins_session_newest(t, db, session, SIZE_MAX, count_row, &n);
  *next = n + 1;
  return rc;
}

int origins_session_newest(cph_txn *t, cph_db db, const char *session, size_t max,
                           int (*fn)(void *ctx, uint64_t id), void *ctx) {
  cph_key from;
  cph_key_reset(&from);
  cph_key_str(&from, session);
  size_t plen = from.len;
  cph_key_u64(&from, UINT64_MAX);
  if (from.overflow)
    return CPH_OK; /* no session of that name was indexed */
  cph_cursor c;
  int rc = cph_cursor_open(t, db, &c);
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
    rc = fn(ctx, cph_be64_get((const uint8_t *)k.data + plen));
    if (rc == CPH_OK)
      rc = cph_cursor_prev(&c, &k, NULL);
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND || rc == ORIGINS_STOP ? CPH_OK : rc;
}

int origins_session_forget(cph_txn *t, cph_db db, const char *session) {
  cph_key start;
  cph_key_reset(&start);
  cph_key_str(&start, session);
  if (start.overflow)
    return CPH_OK;
  return cph_txn_del_prefix(t, db, &start);
}

uint64_t origins_own_id(const char *node, const char *origin) {
  size_t node_len = node ? strnlen(node, ORIGINS_NODE_MAX) : 0;
  if (!node || strncmp(origin, node, node_len) != 0 || origin[node_len] != '/')
    return 0;
  const char *digits = origin + node_len + 1;
  char *end = NULL;
  unsigned long long id = *digits >= '0' && *digits <= '9' ? strtoull(digits, &end, 10) : 0;
  if (!end || *end != '/' || strlen(end + 1) != 16)
    return 0;
  return (uint64_t)id;
}
