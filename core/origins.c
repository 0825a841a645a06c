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

/* (session, id): a row's key in a by-session index. */
static cph_key session_key(const char *session, uint64_t id) {
  cph_key sk;
  cph_key_reset(&sk);
  cph_key_str(&sk, session);
  cph_key_u64(&sk, id);
  return sk;
}

int origins_session_put(cph_txn *t, cph_db db, const char *session, uint64_t id) {
  cph_key sk = session_key(session, id);
  return cph_txn_put(t, db, &sk, "", 0);
}

int origins_session_put_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t id,
                                uint64_t ordinal) {
  cph_key sk = session_key(session, id);
  uint8_t v[8];
  cph_be64_put(v, ordinal);
  return cph_txn_put(t, db, &sk, v, sizeof v);
}

int origins_session_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t id,
                            uint64_t *ordinal) {
  cph_key sk = session_key(session, id);
  *ordinal = 0;
  if (sk.overflow)
    return CPH_OK;
  cph_val v;
  int rc = cph_txn_get(t, db, &sk, &v);
  if (rc == CPH_OK && v.len == 8)
    *ordinal = cph_be64_get(v.data);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* Calls fn(ctx, id, value) for session's rows in db, newest first, at most max, while it
 * returns CPH_OK (ORIGINS_STOP ends the walk: CPH_OK). */
static int walk_newest(cph_txn *t, cph_db db, const char *session, size_t max,
                       int (*fn)(void *ctx, uint64_t id, const cph_val *v), void *ctx) {
  cph_key from = session_key(session, UINT64_MAX);
  if (from.overflow)
    return CPH_OK; /* no session of that name was indexed */
  size_t plen = from.len - 8;
  cph_cursor c;
  int rc = cph_cursor_open(t, db, &c);
  if (rc)
    return rc;
  cph_val k, v;
  /* the session's rows end just below (session, UINT64_MAX): the row before the first at or
   * after it, or the last row of the database */
  rc = cph_cursor_seek(&c, &from, &k, NULL);
  rc = rc == CPH_OK         ? cph_cursor_prev(&c, &k, &v)
       : rc == CPH_ENOTFOUND ? cph_cursor_last(&c, &k, &v)
                             : rc;
  for (size_t n = 0; rc == CPH_OK && n < max; n++) {
    if (k.len != plen + 8 || memcmp(k.data, from.data, plen) != 0)
      break;
    rc = fn(ctx, cph_be64_get((const uint8_t *)k.data + plen), &v);
    if (rc == CPH_OK)
      rc = cph_cursor_prev(&c, &k, &v);
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND || rc == ORIGINS_STOP ? CPH_OK : rc;
}

/* The newest row's ordinal (0: it holds none), or that there is a row at all. */
typedef struct newest_row {
  bool any;
  uint64_t ordinal;
} newest_row;

static int note_newest(void *ctx, uint64_t id, const cph_val *v) {
  (void)id;
  newest_row *r = ctx;
  r->any = true;
  r->ordinal = v->len == 8 ? cph_be64_get(v->data) : 0;
  return ORIGINS_STOP;
}

static int count_row(void *ctx, uint64_t id, const cph_val *v) {
  (void)id;
  (void)v;
  ++*(uint64_t *)ctx;
  return CPH_OK;
}

int origins_session_next_ordinal(cph_txn *t, cph_db db, const char *session, uint64_t *next) {
  newest_row r = {false, 0};
  int rc = walk_newest(t, db, session, 1, note_newest, &r);
  *next = r.ordinal + 1;
  if (rc || !r.any || r.ordinal)
    return rc;
  uint64_t n = 0; /* rows from before ordinals: counted once, the next row holds the count */
  rc = walk_newest(t, db, session, SIZE_MAX, count_row, &n);
  *next = n + 1;
  return rc;
}

/* origins_session_newest's fn, under walk_newest. */
typedef struct id_walk {
  int (*fn)(void *ctx, uint64_t id);
  void *ctx;
} id_walk;

static int walk_id(void *ctx, uint64_t id, const cph_val *v) {
  (void)v;
  const id_walk *w = ctx;
  return w->fn(w->ctx, id);
}

int origins_session_newest(cph_txn *t, cph_db db, const char *session, size_t max,
                           int (*fn)(void *ctx, uint64_t id), void *ctx) {
  id_walk w = {fn, ctx};
  return walk_newest(t, db, session, max, walk_id, &w);
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
