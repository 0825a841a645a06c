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
 *   - sources: what the newest kept turn's messages and nodes were made of (each one's key
 *     bytes and text, copied, with the row and content hash they gave), so that keeping the
 *     next turn finds an unchanged message's row by comparing bytes, not by hashing them.
 *
 * Contract: a turnwarm is exact — the turns, rows and lasts the store holds — whenever its
 * newest turn is the store's newest kept turn of the session. turnlog.c checks that at every
 * lease and rebuilds it from the store otherwise (a restart, an eviction, a pass that did not
 * commit); whoever changes one and then fails drops it (turnwarms_drop).
 *
 * Bound: turnwarms_release keeps the most recently used turnwarms whose memory (copies and
 * tables, turnwarm.bytes) sums to at most max_bytes and frees the others; max_bytes 0 keeps
 * none, so every lease rebuilds from the store. */
#ifndef CEPHALON_CORE_TURNWARM_H
#define CEPHALON_CORE_TURNWARM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/hmap.h"

typedef struct tw_turn {
  uint64_t id;
  uint64_t *dies;
  size_t n_dies, cap_dies;
  bool rows; /* it has a refs entry (record version 3) */
} tw_turn;

typedef struct tw_slot {
  uint64_t row;
  uint64_t last; /* 0 = empty slot (turn ids start at 1) */
  uint32_t code; /* the caller's, kept with the row while last is the turn being kept */
} tw_slot;

/* A message or node as it was hashed: key bytes and text, at offsets into bytes. */
typedef struct tw_source {
  uint64_t fp; /* the caller's fingerprint of key and text */
  uint64_t row, chash;
  size_t key_off, key_len, text_off, text_len;
} tw_source;

typedef struct tw_sources {
  tw_source *v;
  size_t n, cap;
  uint32_t *index; /* by fp: source + 1, 0 = empty */
  size_t mask;     /* index has mask + 1 slots (0: none) */
  cph_buf bytes;
} tw_sources;

typedef struct turnwarm {
  char *session;
  tw_turn *turns; /* oldest first */
  size_t n_turns, cap_turns;
  uint64_t *cur;
  size_t n_cur, cap_cur;
  tw_slot *slots; /* last, open addressing by the row's low bits */
  size_t mask, used;
  tw_sources src, next; /* the newest turn's; the one being kept (turnwarm_sources_done) */
  size_t bytes;         /* what it holds, as of the last turnwarms_release */
  struct turnwarm *lru_prev, *lru_next; /* most recently used first */
} turnwarm;

typedef struct cph_turnwarms {
  cph_hmap by_session; /* session -> turnwarm (the key is the turnwarm's session) */
  turnwarm *lru_head, *lru_tail;
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
/* Frees the least recently used turnwarms until the rest fit in max_bytes. */
void turnwarms_release(cph_turnwarms *tw);

/* The newest kept turn it holds (0: none). */
uint64_t turnwarm_newest(const turnwarm *w);
/* The newest kept turn naming row (0: none is held), and the code set with it. */
uint64_t turnwarm_last(const turnwarm *w, uint64_t row, uint32_t *code);
/* Sets row's last turn and code. CPH_OK or CPH_ENOMEM. */
int turnwarm_set_last(turnwarm *w, uint64_t row, uint64_t turn, uint32_t code);
/* Turn `turn` is kept after the newest, naming rows[0..n) (each once; their lasts already set
 * to turn): the newest's rows whose last is not turn go on its dies list. */
int turnwarm_advance(turnwarm *w, uint64_t turn, bool has_rows, const uint64_t *rows, size_t n);
/* Forgets the oldest turn and the rows of its dies list whose last it still is, calling
 * gone(ctx, row) for each before it is forgotten; stops at gone's first error (returned).
 * Never the newest (its rows die with no list): a turnwarm of one turn is left as it is. */
int turnwarm_trim_oldest(turnwarm *w, int (*gone)(void *ctx, uint64_t row), void *ctx);

/* The newest turn's source with this fingerprint, key and text; NULL when none. */
const tw_source *turnwarm_find(const turnwarm *w, uint64_t fp, const void *key, size_t key_len,
                               const char *text, size_t text_len);
/* Adds a source of the turn being kept (found by turnwarm_find once turnwarm_sources_done). */
int turnwarm_add_source(turnwarm *w, uint64_t fp, uint64_t row, uint64_t chash, const void *key,
                        size_t key_len, const char *text, size_t text_len);
/* The turn being kept is the newest: its sources replace the newest's. */
void turnwarm_sources_done(turnwarm *w);

#endif
