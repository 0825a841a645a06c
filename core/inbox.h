/* A session's inbox entries and the events folded into them (DESIGN §4, §5). Private to core/.
 *
 * The accounting rule: every event routed to a session reaches it as its own entry or counted
 * inside one. An entry (inbox_item, session.h) stands for `count` events: its first,
 * event_id, and the others folded in later — repeats of one family (INBOX_FOLD_REPEAT) or the
 * older messages the queue cap folded into the session's overflow entry (INBOX_FOLD_OVERFLOW).
 *
 * In the store, the inbox record (CPH_DB_INBOX) keeps the entry's first event; an entry that
 * folds others also has rows in CPH_DB_INBOX_FOLDS:
 *   session\0 u64 inbox id            -> fold record: u8 version, u8 fold, be64 fold_key,
 *                                        be32 count, be64 last_ms (INBOX_FOLD_LEN bytes)
 *   session\0 u64 inbox id u64 event  -> a member row: "" (that event), or (schema 4) be64 ids
 *                                        of more events folded in with it (one row for the
 *                                        members a request's queue cap folds into an entry)
 *   session\0 u64 0                  -> the session's folded map (schema 4): u8 version,
 *                                        be64 through, be64 id of each live entry <= through
 * The fold record's key is a prefix of its member rows' keys, so one cursor walk reads an
 * entry's fold record first and then its members in event-id order. Rows stay after the entry
 * is consumed: they are the record of which events a turn carried.
 *
 * Which inbox records the queue cap folded away. Up to schema 3 each was rewritten with status
 * `folded` (a put per folded event); from schema 4 its record stays as it was written (staged)
 * and the session's folded map tells: a stored entry of the session whose status is pending or
 * staged is folded iff its id is <= the map's `through` and is not among the map's live ids.
 * The map is written from the live inbox in memory (every live entry <= through is listed), so
 * it must be rewritten whenever an entry <= through becomes live again without being in the
 * live inbox when the map was written: a parked turn's requeue (turns.c). Records written
 * `folded` by schema 3 stay skipped by their status (inbox ids start at 1: 0 is no entry). */
#ifndef CEPHALON_CORE_INBOX_H
#define CEPHALON_CORE_INBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "session.h"
#include "store/store.h"

typedef enum inbox_fold {
  INBOX_FOLD_NONE,    /* one event (count may still grow by an exact repeat) */
  INBOX_FOLD_REPEAT,  /* repeats of family fold_key */
  INBOX_FOLD_OVERFLOW /* older messages folded by :sessions :max-queue */
} inbox_fold;

const char *inbox_fold_name(uint8_t fold); /* "none", "repeat", "overflow" */

/* Writes it's fold record (count, fold, fold_key, last_ms). Errors are t's sticky error. */
int inbox_fold_put(cph_txn *t, const char *session, const inbox_item *it);
/* Adds event_id as a member of entry inbox_id. */
int inbox_fold_add(cph_txn *t, const char *session, uint64_t inbox_id, uint64_t event_id);
/* Adds event_ids[0..n) as members of entry inbox_id in one row (keyed by the first; the ids
 * are distinct and members of no entry). n 0: nothing. Errors are t's or CPH_ENOMEM. */
int inbox_fold_add_many(cph_txn *t, const char *session, uint64_t inbox_id,
                        const uint64_t *event_ids, size_t n);
/* Moves every member of entry `from` to entry `to` (as one row) and deletes from's fold
 * record. */
int inbox_fold_move(cph_txn *t, const char *session, uint64_t from, uint64_t to);
/* Fills it->count, fold, fold_key and last_ms from its fold record; an entry without one keeps
 * count 1, fold none and last_ms = created_ms. CPH_OK, or CPH_ECORRUPT naming the key. */
int inbox_fold_get(cph_txn *t, const char *session, inbox_item *it);
/* The entry's event ids: its first, then its members in id order (malloc'd; *n = count, or
 * fewer when members are missing). */
int inbox_fold_events(cph_txn *t, const char *session, const inbox_item *it, uint64_t **ids,
                      size_t *n);
/* A session's folded map as read: `live` points into the store's value (valid while the txn
 * is and writes nothing), n big-endian ids in ascending order. through 0: no map. */
typedef struct inbox_folded {
  uint64_t through;
  const uint8_t *live;
  size_t n;
} inbox_folded;

/* Reads session's folded map (none: through 0). CPH_OK, or CPH_ECORRUPT naming the key. */
int inbox_folded_get(cph_txn *t, const char *session, inbox_folded *f);
/* Whether the stored entry `id` (pending or staged by its record) was folded away. O(log n). */
bool inbox_folded_holds(const inbox_folded *f, uint64_t id);
/* Rewrites s's folded map so that it covers `folded` (the highest entry id just folded away
 * by the queue cap; 0: none, only refresh a map that exists) from s's live inbox as it is
 * now: through = max(the stored through, folded). O(live entries <= through). Errors are t's
 * sticky error or CPH_ECORRUPT. */
int inbox_folded_put(cph_txn *t, const csession *s, uint64_t folded);

/* Appends to out (a cph_strv grown here) a copy of the idempotency key of every event entry
 * `it` stands for — its first, then its members — leaving out events without a key or no
 * longer stored: what cluster mode's done marks name (server/clusterflow.h). CPH_OK, CPH_ENOMEM,
 * or the store's error (a corrupt event record fails t). */
int inbox_event_keys(cph_txn *t, const char *session, const inbox_item *it, cph_strv *out);

#endif
