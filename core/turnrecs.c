/* Turn records as history: see turnrecs.h. */
#include "turnrecs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "origins.h"

/* Indexes tr under its session with the next ordinal. */
static int index_by_session(cph_txn *t, const cph_turn_rec *tr) {
  uint64_t ordinal;
  int rc = origins_session_next_ordinal(t, CPH_DB_TURN_SESSIONS, tr->session, &ordinal);
  if (rc == CPH_OK)
    rc = origins_session_put_ordinal(t, CPH_DB_TURN_SESSIONS, tr->session, tr->id, ordinal);
  return rc;
}

int turnrecs_ended(cph_txn *t, const cph_turn_rec *tr) {
  if (tr->kind == CPH_TURN_JOB)
    return CPH_OK;
  return index_by_session(t, tr);
}

int turnrecs_ordinal(cph_txn *t, const char *session, uint64_t turn, uint64_t *ordinal) {
  return origins_session_ordinal(t, CPH_DB_TURN_SESSIONS, session, turn, ordinal);
}

void turnrecs_origin(char *buf, const char *node, const cph_turn_rec *tr) {
  if (tr->origin)
    snprintf(buf, TURNRECS_ORIGIN_MAX, "%s", tr->origin);
  else if (node)
    replystream_origin(buf, node, tr->id, tr->lease);
  else
    buf[0] = '\0';
}

int turnrecs_holds(cph_txn *t, const char *node, const char *origin, bool *held) {
  int rc = origins_find(t, CPH_DB_TURN_ORIGINS, origin, held, NULL);
  uint64_t id = rc == CPH_OK && !*held ? origins_own_id(node, origin) : 0;
  if (!id)
    return rc;
  /* made here? the record of that id, with this origin (not an older data dir's) */
  cph_key tk = cph_key_of_u64(id);
  cph_turn_rec tr;
  rc = cph_txn_get_record_some(t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr, 0);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  char mine[TURNRECS_ORIGIN_MAX];
  turnrecs_origin(mine, node, &tr);
  *held = !tr.origin && strcmp(mine, origin) == 0;
  cph_record_free(&cph_turn_desc, &tr);
  return CPH_OK;
}

int turnrecs_import(cph_txn *t, cph_turn_rec *tr) {
  int rc = cph_txn_next_id(t, "turn", &tr->id);
  memset(tr->lease, 0, sizeof tr->lease);
  free(tr->inbox_seqs);
  tr->inbox_seqs = NULL;
  tr->n_inbox_seqs = 0;
  tr->job_id = 0;
  cph_key tk = cph_key_of_u64(tr->id);
  if (rc == CPH_OK)
    rc = cph_txn_put_record(t, CPH_DB_TURNS, &tk, &cph_turn_desc, tr);
  if (rc == CPH_OK)
    rc = origins_put(t, CPH_DB_TURN_ORIGINS, tr->origin, tr->id);
  if (rc == CPH_OK)
    rc = index_by_session(t, tr);
  return rc;
}

typedef struct newest_walk {
  cph_txn *t;
  bool (*fn)(void *ctx, const cph_turn_rec *tr);
  void *ctx;
} newest_walk;

static int newest_turn(void *ctx, uint64_t id) {
  newest_walk *w = ctx;
  cph_key tk = cph_key_of_u64(id);
  cph_turn_rec tr;
  int rc = cph_txn_get_record(w->t, CPH_DB_TURNS, &tk, &cph_turn_desc, &tr);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  bool more = w->fn(w->ctx, &tr);
  cph_record_free(&cph_turn_desc, &tr);
  return more ? CPH_OK : ORIGINS_STOP;
}

int turnrecs_session_newest(cph_txn *t, const char *session, size_t max,
                            bool (*fn)(void *ctx, const cph_turn_rec *tr), void *ctx) {
  newest_walk w = {t, fn, ctx};
  return origins_session_newest(t, CPH_DB_TURN_SESSIONS, session, max, newest_turn, &w);
}

int turnrecs_forget_session(cph_txn *t, const char *session) {
  return origins_session_forget(t, CPH_DB_TURN_SESSIONS, session);
}
