/* Content dedupe and duplicate families (DESIGN §5). Private to core/.
 *
 * Exact dedupe: SHA-256 of (channel, sender, normalised body) — normalised = ASCII lower-case,
 * every whitespace run collapsed to one space, trimmed — seen within :dedupe :window-seconds of
 * its last occurrence (a sliding window: a message repeated more often than the window stays a
 * duplicate). The index lives in memory — a hash table of the window's hashes, each with the
 * time of its entry's newest copy, bounded by the window — and in LMDB (CPH_DB_DEDUPE), where
 * entries are written time-ordered (appended at the B-tree's end) and pruned from the front;
 * it is rebuilt from there at open, so it survives a restart. A hash never seen reads nothing
 * from LMDB; a repeat reads its entry.
 *
 * Near dedupe: a 64-bit simhash over shingles of :shingle-words consecutive normalised words;
 * an event within Hamming distance :near-distance of a recent event of the same channel (any
 * sender) is a near duplicate. Recent simhashes are kept in memory only, per channel, in a ring
 * of at most DEDUPE_RING_MAX entries that are inside the window; a restart forgets them (exact
 * dedupe still works). Every eligible event joins its channel's ring, near dedupe or not, so a
 * channel entering backpressure folds at once. Cost per event: a probe of the exact filter
 * (an LMDB get only for a repeat) and, where near folding applies, the banded ring lookup
 * (at most DEDUPE_RING_MAX XOR+popcounts).
 *
 * Bodies whose normalised form is shorter than :min-length bytes are never deduplicated
 * ("ok" twice is chat), and a :window-seconds of 0 turns content dedupe off.
 *
 * Families: a family appears when the first duplicate arrives; its dup_count then counts the
 * original and every duplicate (2 at creation). Its sample is the original's body, first_ms
 * the original's arrival, last_ms the newest duplicate. The same normalised content keeps one
 * family across channels and windows: a new family is looked up by the SHA-256 of the
 * normalised body alone first, and joining it adds the original and the duplicate (+2) and the
 * channel. An event that repeats after the window expired is an original again (not counted).
 *
 * Protocol per event (ingest.c): dedupe_classify() reads; dedupe_write() writes in the
 * request's child txn; dedupe_commit() updates memory once the event's writes are in (the
 * next event of the request must see it). A request that fails after that calls
 * dedupe_rollback(), which returns to its dedupe_savepoint(). */
#ifndef CEPHALON_CORE_DEDUPE_H
#define CEPHALON_CORE_DEDUPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"

#include "cephalon/cephalon.h"
#include "cephalon/policy.h"

struct cph_txn;
/* The state this module owns: the recent simhash rings per channel, the family count and the
 * top families, the hash context. Handed to it by the engine; it reaches nothing else: the
 * policy section, the time and the transaction come in as arguments. */
typedef struct cph_dedupe cph_dedupe;

#define DEDUPE_RING_MAX 1024   /* recent simhashes kept per channel */
#define DEDUPE_TOP_MAX 256     /* families kept in the in-memory top list */
#define DEDUPE_SAMPLE_MAX 1024 /* bytes of the first body kept as a family's sample */

/* ---- pure helpers (unit-tested directly) ---- */

/* The normalised body (malloc'd, NUL-terminated; NULL on out of memory); *len its length. */
char *dedupe_normalise(const char *body, size_t *len);
/* Simhash of an already normalised text over shingles of `shingle_words` words (a text with
 * fewer words is one shingle). 0 for an empty text. */
uint64_t dedupe_simhash(const char *normalised, size_t len, int shingle_words);
int dedupe_hamming(uint64_t a, uint64_t b);
/* Signature of a normalised text's identifier-like words (numbers, ids, hosts, versions) in
 * order; 0 when it has none. Near duplicates must have equal signatures (DESIGN §5: never
 * fold two texts that differ in a number or an identifier-like token). */
uint64_t dedupe_idsig(const char *normalised, size_t len);

/* ---- per event ---- */

typedef enum dedupe_kind { DEDUPE_NONE, DEDUPE_EXACT, DEDUPE_NEAR } dedupe_kind;

/* Where near-duplicate folding applies (DESIGN §5): only to bulk traffic, never to an event
 * that names a session. OFF: exact repeats only; CHANNEL: near duplicates of any sender in the
 * channel (a bulk channel, or one at backpressure step >= 1); SENDER: near duplicates of the
 * same sender only (a bulk sender on an ordinary channel). */
typedef enum dedupe_near { DEDUPE_NEAR_OFF, DEDUPE_NEAR_CHANNEL, DEDUPE_NEAR_SENDER } dedupe_near;

typedef struct dedupe_verdict {
  dedupe_kind kind;
  bool eligible;           /* long enough and dedupe on: indexed whatever the verdict */
  uint8_t sha256[32];      /* of (channel, sender, normalised body); set for every event */
  uint64_t simhash;        /* 0 when not eligible */
  uint64_t idsig;          /* dedupe_idsig(), when eligible */
  uint64_t sender_hash;    /* when eligible */
  uint64_t original_event; /* duplicate: the event it repeats */
  int64_t original_first_ms;
  int distance;       /* near: Hamming distance to the original */
  int32_t ring_index; /* the ring entry matched, -1 none */
  /* Filled by dedupe_write for a duplicate. */
  uint64_t family;
  uint64_t dup_count;  /* the family's count after this event */
  bool family_created; /* a new family (not one joined from another channel/window) */
  char *sample;        /* the family's sample (owned) when family_created */
  /* Internal. */
  char *norm;
  size_t norm_len;
  size_t xslot; /* the exact filter's slot of this hash, SIZE_MAX none */
  uint64_t xloc; /* where dedupe_write put this event's exact entry (for the filter) */
} dedupe_verdict;

/* The text half of dedupe_classify, ahead of it and on any thread (cph_event_prepare): the
 * normalised body's length and exact hash for chan and sender, and — when it is at least
 * min_length bytes — its simhash (over shingle_words), idsig and sender hash, each exactly
 * what dedupe_classify would compute. CPH_OK or CPH_ENOMEM. */
int dedupe_prepare(cph_event_hasher *h, const char *chan, const char *sender, const char *body,
                   int32_t shingle_words, int64_t min_length, cph_event_prep *out);
cph_event_hasher *dedupe_hasher_new(void); /* NULL on out of memory */
void dedupe_hasher_free(cph_event_hasher *h);
/* Starts loading the exact filter's slot for sha (a hint: no effect on any verdict). */
void dedupe_prefetch(const cph_dedupe *d, const uint8_t sha256[32]);

/* Classifies body for channel/sender at now_ms (engine_wall_ms) with the window multiplied by
 * window_mult (backpressure step 3 widens it); near says whether and how near duplicates
 * count; pre (optional) is dedupe_prepare's result for the same event, taken for what it
 * computed under the settings in p. Reads through t only. CPH_OK, or CPH_ENOMEM. */
int dedupe_classify(cph_dedupe *d, const cph_policy_dedupe *p, struct cph_txn *t,
                    const char *chan, const char *sender, const char *body, int64_t now_ms,
                    uint32_t window_mult, dedupe_near near, const cph_event_prep *pre,
                    dedupe_verdict *v);
/* Writes the exact-dedupe entry and, for a duplicate, creates or updates its family (setting
 * v->family and v->dup_count). Writes through t; errors are t's sticky error. */
int dedupe_write(cph_dedupe *d, struct cph_txn *t, const char *chan, const char *body,
                 uint64_t event_id, int64_t now_ms, dedupe_verdict *v);
/* After the event's writes: the ring, the counters and the top list follow. */
void dedupe_commit(cph_dedupe *d, const char *chan, uint64_t event_id, int64_t now_ms,
                   const dedupe_verdict *v);
/* Opens a request of at most n_events events: remembers the counters and the top list
 * (O(DEDUPE_TOP_MAX)) and reserves the exact filter's room for them (it grows here, never in
 * the request, so the request's changes can be undone by position); dedupe_rollback()
 * restores the counters and the filter and forgets every ring — the rings are a cache a
 * restart forgets too, so near dedupe only misses the repeats of what came before the
 * failure. For the rare failed request. Every dedupe_commit belongs to such a request. */
void dedupe_savepoint(cph_dedupe *d, size_t n_events);
/* Writes the request's exact entries, which dedupe_write holds from dedupe_savepoint on (read
 * back from memory until then), in key order: each lands at the tree's end instead of on one
 * of its last pages at random. Before the request's txn commits. Errors are t's sticky one. */
int dedupe_flush(cph_dedupe *d, struct cph_txn *t);
void dedupe_rollback(cph_dedupe *d);
void dedupe_verdict_free(dedupe_verdict *v);

/* Cluster mode: a repeat's copies are one repeat. A node applies each copy of a message it
 * gets — the channel's `in` event, a forward to each of its sessions (server/clusterflow.h
 * 3.) — and a copy of a repeat is a repeat again; its family counts the repeat once: the
 * later copies fold into their sessions' entries without dedupe_write or dedupe_commit.
 * *seen: this node applied a copy of the message at ts_ms (the time it was accepted, which
 * every copy carries) with identity id (its first 16 bytes: a hash of channel, sender, time
 * and body) already; if not, marks it in t. A mark is a key COPY_TAG be64(ts_ms) id in the
 * dedupe database, pruned with the exact entries once ts_ms left the widest window. CPH_OK or
 * the store's error (t's sticky one). */
int dedupe_copy_seen(cph_dedupe *d, struct cph_txn *t, int64_t ts_ms, const uint8_t *id,
                     size_t id_len, bool *seen);

/* ---- lifecycle and upkeep ---- */

/* Builds the in-memory state (family count, top list, the exact filter) from the store, read
 * through t; the engine calls it from memory_load, so a failed commit rebuilds it too (the
 * rings start empty then). O(families + stored exact entries). A store holding exact entries
 * of the layout before the time-ordered one has them moved first, in a write txn of its own
 * (no other write txn may be open). */
int dedupe_open(struct cph_txn *t, cph_dedupe **out, cph_err *err);
void dedupe_close(cph_dedupe *d);

/* Which channels use the widened window (backpressure step 3): backpressure owns the step,
 * the engine hands dedupe this question and the factor. */
typedef struct dedupe_widening {
  bool (*widened)(void *ctx, const char *chan);
  void *ctx;
  uint32_t factor; /* the widest window is window-seconds x factor */
} dedupe_widening;
/* Upkeep, from reconcile (works at most once a second): deletes a bounded number of expired
 * exact-dedupe entries from the front of the time-ordered range in a child txn of parent
 * (and their filter slots), frees idle rings and shrinks an oversized filter. */
void dedupe_tick(cph_dedupe *d, const cph_policy_dedupe *p, struct cph_txn *parent,
                 int64_t now_ms, const dedupe_widening *widen);

/* The engine's dedupe (engine.c): for tests that read the counters directly. */
const cph_dedupe *cph__engine_dedupe(const cph_engine *e);

/* ---- counters for metrics (DESIGN §10) ---- */

typedef struct dedupe_stats {
  uint64_t exact_hits_total; /* cephalon_dedupe_exact_hits_total */
  uint64_t near_hits_total;  /* cephalon_dedupe_near_hits_total */
  uint64_t aggregate_count;  /* cephalon_aggregate_count: families stored */
} dedupe_stats;
void dedupe_stats_get(const cph_dedupe *d, dedupe_stats *out);

/* The top families by dup_count, largest first (at most max): for
 * cephalon_aggregate_dup_count{family}. Returns how many were written. */
size_t dedupe_top(const cph_dedupe *d, uint64_t *families, uint64_t *dup_counts, size_t max);
/* GET /v1/aggregates: the top families (at most top, 10 when 0), read through t. */
int dedupe_aggregates(const cph_dedupe *d, struct cph_txn *t, size_t top,
                      cph_aggregate_info **out, size_t *n, cph_err *err);

#endif
