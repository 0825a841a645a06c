/* chantail — the warm part of a turn's context: each recently used channel's newest history
 * entries (channel-log index, event id, and the event's sender, body and time) kept in memory,
 * so that a lease does not walk the channel log and copy every event again. Private to core/;
 * pass thread only.
 *
 * A tail is a contiguous run of a channel's newest entries. It is brought up to date when a
 * turn asks for it (chantails_get): one seek finds the channel's newest index and only the
 * entries written since are read. It reaches further back on demand (chantail_newest), never
 * beyond CHANTAIL_MAX entries, and an entry's event is read on first use (chantail_load). The
 * channel log only grows (nothing deletes its entries), so the entries a tail holds stay
 * true; their events change only through retention, which drops them from the event cache —
 * and every drop or clear of the event cache (its generation) empties every tail here.
 *
 * Contract (a tail never shows what the store does not hold):
 * - entries are read through the caller's transaction, so a tail can hold what a pass wrote
 *   before it committed: the engine empties the tails when a pass commit fails, and whenever
 *   it rebuilds memory from the store (chantails_clear);
 * - strings a caller borrows from a tail's entries stay valid until chantails_release: no
 *   get, newest or load call frees them.
 *
 * Senders are held once (chantails_sender): every entry an event of one sender loaded, over
 * all tails, points at the same string, so two senders a caller got from here are equal
 * exactly when their pointers are — a lease compares each history entry's sender with the
 * session's id and the staged senders by pointer, with no memcmp (context.c).
 *
 * Bound: chantails_release(keep) keeps the `keep` most recently used tails (the policy's
 * :sessions :warm-channels) and frees the rest; keep 0 makes every turn build its tails from
 * the store, which is how the property test checks that warm and rebuilt contexts agree. */
#ifndef CEPHALON_CORE_CHANTAIL_H
#define CEPHALON_CORE_CHANTAIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hmap.h"
#include "common/lru.h"
#include "evcache.h"
#include "store/store.h"

/* The most entries a tail holds: a turn reads at most this many of a channel (context.c). */
#define CHANTAIL_MAX 512

typedef struct chantail_entry {
  uint64_t index; /* in its channel's log */
  uint64_t event_id;
  int64_t ts_ms;
  const char *sender; /* loaded: held once for all tails (chantails_sender); NULL when the event
                       * is gone (retention deleted it) */
  char *body;                  /* loaded: NULL when gone or its payload was redacted */
  size_t sender_len, body_len; /* strlen of each (0 for NULL): measured once, when loaded */
  bool loaded;                 /* sender, body and ts_ms were read */
} chantail_entry;

typedef struct chantail {
  char *channel;
  chantail_entry *v; /* entries v[off .. off + n), index ascending */
  size_t off, n, cap;
  bool whole; /* holds the channel's oldest entry: nothing older to read */
  cph_lru_link lru; /* in the tails' recency order */
} chantail;

typedef struct cph_chantails {
  cph_hmap by_channel; /* channel -> chantail (the key is the tail's channel) */
  cph_hmap senders;    /* sender -> its held copy (chantail_sender; the key is the copy's text) */
  cph_lru lru; /* the tails, most recently used first */
  size_t n;
  cph_evcache *evcache; /* events read on a tail miss; its generation: retention changed one */
  uint64_t evcache_generation;
  uint64_t event_fields; /* what an entry reads of its event: sender, body, ts_ms */
} cph_chantails;

void chantails_init(cph_chantails *ct, cph_evcache *evcache);
void chantails_clear(cph_chantails *ct); /* frees every tail */
void chantails_free(cph_chantails *ct);

/* The channel's tail, up to date with what t holds. CPH_OK, or a store error / CPH_ENOMEM. */
int chantails_get(cph_chantails *ct, cph_txn *t, const char *channel, chantail **out);
/* The i-th newest entry (0 = the newest), read from t when the tail does not reach that far
 * yet; NULL past the channel's oldest entry or CHANTAIL_MAX (then *rc is CPH_OK) or on an
 * error (*rc says which). */
chantail_entry *chantail_newest(chantail *tl, cph_txn *t, size_t i, int *rc);
/* Reads e's event fields on first use: from the event cache, else the store (then cached). */
int chantail_load(cph_chantails *ct, cph_txn *t, chantail_entry *e);
/* The held copy of sender, one more holder counted (an entry, or a caller until it calls
 * chantails_sender_drop): the string every entry loaded from an event of that sender points
 * at, so a caller compares an entry's sender with it by pointer. NULL without memory. */
const char *chantails_sender(cph_chantails *ct, const char *sender);
/* One holder of a held sender (from chantails_sender) less; NULL is ignored. */
void chantails_sender_drop(cph_chantails *ct, const char *sender);
/* The end of a turn's use: keeps the `keep` most recently used tails, frees the others. */
void chantails_release(cph_chantails *ct, size_t keep);

#endif
