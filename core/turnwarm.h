/* turnwarm — a session's kept turn contexts as keeping the next one needs them, held in memory
 * between leases (core/turnlog.c's warm state, as chantail.h is context assembly's). Private
 * to core/; pass thread only. It knows rows only as 64-bit names; turnlog.c says what they are
 * and reads and writes the store.
 *
 * Per session, one turnwarm:
 *   - turns: the session's kept turns, oldest first; each with `dies`, the rows it named that
 *     the kept turn after it did not (a row no later kept turn named again dies with it);
 *   - last: row -> the newest kept turn that names it. A row is held iff a kept turn names it,
 *     so trimming turn T deletes exactly the rows of T's dies list whose last is still T —
 *     without reading the refs entries of the turns that remain;
 *   - cur: the newest kept turn's rows, each once;
 *   - items: what the newest kept turn's messages and nodes were made of (each one's key
 *     and text, copied once, with the row and content hash they gave), so that keeping the
 *     next turn finds an unchanged message's row by comparing it with the one at its place,
 *     not by hashing it; only what is new is copied.
 *
 * Contract: a turnwarm is exact — the turns, rows and lasts the store holds — whenever its
 * newest turn is the store's newest kept turn of the session. turnlog.c checks that at every
 * lease and rebuilds it from the store otherwise (a restart, an eviction, a pass that did not
 * commit); whoever changes one and then fails drops it (turnwarms_drop).
 *
 * Bound: turnwarms_release keeps the most recently used turnwarms whose memory (copies and
 * tables, turnwarm.held — about twice the newest turn's texts at most) sums to at most
 * max_bytes and frees the others; max_bytes 0 keeps none, so every lease rebuilds from the
 * store.
 *
 * Pins (keeping beside the loop, turnlog.h "Deferred keeping"): a turnwarm a job keeps a turn
 * with is pinned from its lease's pass until the job was written. While pinned, one job at a
 * time works on it on another thread, and the loop touches none of it but `pins`, `dead` and
 * its place in the recency order: turnwarms_release neither frees nor measures it, and
 * turnwarms_drop, turnwarms_fresh and turnwarms_clear take it out of the set and mark it
 * dead instead of freeing it — its jobs then see it dead and keep nothing — and the last
 * unpin frees it. */
#ifndef CEPHALON_CORE_TURNWARM_H
#define CEPHALON_CORE_TURNWARM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/hmap.h"
#include "common/lru.h"

typedef struct tw_turn {
  uint64_t id;
  uint64_t *dies;
  size_t n_dies, cap_dies;
  bool rows; /* it has a refs entry (record version 3) */
} tw_turn;

typedef struct tw_slot {
  uint64_t row;
  uint64_t last; /* 0 = empty slot (turn ids start at 1) */
  uint32_t code; /* the caller's (turnwarm_claim) */
} tw_slot;

/* What a message's or node's row is made of, as the caller compares it: a kind and an id, two
 * short strings and the text (equal keys make equal rows). */
typedef struct tw_key {
  uint32_t kind;
  uint64_t id;
  const void *s1, *s2;
  size_t n1, n2;
  const char *text;
  size_t n_text;
} tw_key;

/* An item of the newest kept turn: its key (s1, s2 and text one after another at off in the
 * turnwarm's bytes) and the row and content hash it gave. */
typedef struct tw_item {
  uint64_t id, row, chash;
  uint32_t kind, n1, n2;
  size_t n_text, off;
} tw_item;

typedef struct tw_items {
  tw_item *v;
  size_t n, cap;
} tw_items;

/* How far past the expected place turnwarm_find looks for an item. */
#define TW_SCAN 16
/* The keys' bytes are compacted once those no item names exceed the live ones by this much: a
 * copy of the live keys every few dozen leases, amortized to a few bytes per new one. */
#define TW_SLACK 4096

typedef struct turnwarm {
  char *session;
  tw_turn *turns; /* oldest first */
  size_t n_turns, cap_turns;
  uint64_t *cur;
  size_t n_cur, cap_cur;
  tw_slot *slots; /* last, open addressing by the row's low bits */
  size_t mask, used;
  tw_items items[2], next[2]; /* per list: the newest turn's, the one being kept */
  cph_buf bytes; /* the items' keys: appended, compacted when mostly unused (turnwarm_items_done) */
  size_t held; /* the memory it holds, as of the last turnwarms_release */
  cph_lru_link lru; /* in the warm states' recency order */
  uint32_t pins;    /* jobs keeping with it that were not written yet (the loop's) */
  atomic_bool dead; /* out of the set while pinned: its jobs keep nothing; freed at the last unpin */
} turnwarm;

typedef struct cph_turnwarms {
  cph_hmap by_session; /* session -> turnwarm (the key is the turnwarm's session) */
  cph_lru lru; /* the warm states, most recently used first */
  size_t bytes, max_bytes;
} cph_turnwarms;

void turnwarms_init(cph_turnwarms *tw, size_t max_bytes);
void turnwarms_clear(cph_turnwarms *tw); /* frees every turnwarm */
void turnwarms_free(cph_turnwarms *tw);

/* The session's turnwarm, now the most recently used; NULL when none is held. */
turnwarm *turnwarms_get(cph_turnwarms *tw, const char *session);
/* A new empty turnwarm for the session, replacing any. CPH_OK or CPH_ENOMEM. */
int turnwarms_fresh(cph_turnwarms *tw, const char *session, turnwarm **out);
void turnwarms_drop(cph_turnwarms *tw, const char *session);
/* Frees the least recently used turnwarms until the rest fit in max_bytes (pinned ones stay). */
void turnwarms_release(cph_turnwarms *tw);
/* Pins w for a job (above). Loop only. */
void turnwarms_pin(turnwarm *w);
/* A job of w ended (its work is over): unpins it; frees it when it is dead and no job pins it
 * any more, else measures it again. Loop only. */
void turnwarms_unpin(cph_turnwarms *tw, turnwarm *w);
/* Whether w was taken out of the set while pinned (any thread: the loop sets it). */
bool turnwarm_dead(const turnwarm *w);

/* The newest kept turn it holds (0: none). */
uint64_t turnwarm_newest(const turnwarm *w);
/* The held row (named by a kept turn) that is `row`, else one whose low `bits` bits are row's;
 * false when none is. turnlog.c names rows so that equal low bits mean equal rows (turnlog.c,
 * "Row names"); the slots are homed by those bits, so this is one probe run. */
bool turnwarm_held_like(const turnwarm *w, uint64_t row, unsigned bits, uint64_t *found);
/* Row is named by turn: its last naming turn becomes turn, *was gets the one before (turn
 * itself when turn named it already; 0: none). Returns where the row's code is kept, for the
 * caller to read or set, valid until the next claim; NULL when out of memory. */
uint32_t *turnwarm_claim(turnwarm *w, uint64_t row, uint64_t turn, uint64_t *was);
/* Turn `turn` is kept after the newest, naming rows[0..n) (each once; their lasts already set
 * to turn): the newest's rows whose last is not turn go on its dies list. */
int turnwarm_advance(turnwarm *w, uint64_t turn, bool has_rows, const uint64_t *rows, size_t n);
/* Forgets the oldest turn and the rows of its dies list whose last it still is, calling
 * gone(ctx, row) for each before it is forgotten; stops at gone's first error (returned).
 * Never the newest (its rows die with no list): a turnwarm of one turn is left as it is. */
int turnwarm_trim_oldest(turnwarm *w, int (*gone)(void *ctx, uint64_t row), void *ctx);

/* Of the newest turn's items in list l (0 or 1: the caller's messages and nodes), the first one
 * equal to k among those from *pos on (at most TW_SCAN of them: consecutive turns list their
 * items mostly in the same order); *pos moves past it. NULL when none. */
const tw_item *turnwarm_find(const turnwarm *w, int l, size_t *pos, const tw_key *k);
/* Adds an item to list l of the turn being kept: `same` is the item turnwarm_find gave (its
 * bytes are shared), NULL to copy k's. CPH_OK or CPH_ENOMEM. */
int turnwarm_add_item(turnwarm *w, int l, const tw_key *k, const tw_item *same, uint64_t row,
                      uint64_t chash);
/* The turn being kept is the newest: its items replace the newest's. */
void turnwarm_items_done(turnwarm *w);

#endif
