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
 *   session\0 u64 inbox id u64 event  -> "" (one member row per folded event)
 * The fold record's key is a prefix of its member rows' keys, so one cursor walk reads an
 * entry's fold record first and then its members in event-id order. Rows stay after the entry
 * is consumed: they are the record of which events a turn carried. */
#ifndef CEPHALON_CORE_INBOX_H
#define CEPHALON_CORE_INBOX_H

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
/* Moves every member row of entry `from` to entry `to` and deletes from's fold record. */
int inbox_fold_move(cph_txn *t, const char *session, uint64_t from, uint64_t to);
/* Fills it->count, fold, fold_key and last_ms from its fold record; an entry without one keeps
 * count 1, fold none and last_ms = created_ms. CPH_OK, or CPH_ECORRUPT naming the key. */
int inbox_fold_get(cph_txn *t, const char *session, inbox_item *it);
/* The entry's event ids: its first, then its members in id order (malloc'd; *n = count, or
 * fewer when members are missing). */
int inbox_fold_events(cph_txn *t, const char *session, const inbox_item *it, uint64_t **ids,
                      size_t *n);
/* Appends to out (a cph_strv grown here) a copy of the idempotency key of every event entry
 * `it` stands for — its first, then its members — leaving out events without a key or no
 * longer stored: what cluster mode's done marks name (server/clusterflow.h). CPH_OK, CPH_ENOMEM,
 * or the store's error (a corrupt event record fails t). */
int inbox_event_keys(cph_txn *t, const char *session, const inbox_item *it, cph_strv *out);

#endif
