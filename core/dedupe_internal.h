/* Dedupe's state and its exact-entry store, shared by the files of the module: dedupe.c
 * (near rings, families, the per-event protocol, lifecycle), dedupe_exact.c (the stored
 * entries, their keys and the in-memory filter) and dedupe_text.c (normalising, simhash).
 * Private to those files; the module's contract is dedupe.h. */
#ifndef CEPHALON_CORE_DEDUPE_INTERNAL_H
#define CEPHALON_CORE_DEDUPE_INTERNAL_H

#include <openssl/evp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/hmap.h"
#include "dedupe.h"
#include "simidx.h"
#include "store/store.h"

#define ENTRY_VERSION 1
#define ENTRY_LEN 41
#define INDEX_LEN 9
#define XKEY_TAG 0xFF   /* first byte of a time-ordered exact entry's key (up to schema 4) */
#define XKEY_LEN 41     /* XKEY_TAG, be64 last_ms, sha256 */
#define ROW_TAG 0xFE    /* first byte of a row of exact entries' key (schema 5) */
#define COPY_TAG 0xFD   /* first byte of a repeat's copy mark's key (dedupe_copy_seen) */
#define COPY_ID_LEN 16  /* the message identity's bytes in a copy mark's key */
#define COPY_KEY_LEN (1 + 8 + COPY_ID_LEN) /* COPY_TAG, be64 the message's time, identity */
#define ROW_KEY_LEN 9   /* ROW_TAG, be64 row number */
#define ROW_VERSION 2   /* a row's first byte */
#define ROW_HEAD 9      /* ROW_VERSION, be64 the newest last_ms of its entries */
#define ROW_ENTRY 72    /* sha256, family, event id, first_ms, last_ms, simhash */
#define ROW_MAX 4096    /* entries per row: a request of more writes several */
/* Where a stored copy is (an xslot's `loc`): a row's entry, LOC_ROW | row << 16 | index; or,
 * without LOC_ROW, the last_ms of a schema-4 entry's key (with the hash, the whole key). */
#define LOC_ROW (1ull << 63)
#define LOC_OF(row, i) (LOC_ROW | (row) << 16 | (uint64_t)(i))
#define XS_MIN_CAP 1024 /* the filter's smallest table */
#define XS_NONE SIZE_MAX
#define RING_MIN 4       /* rings start small: most channels see few distinct messages */
#define INDEX_MIN_LEN 64 /* below this many entries a linear scan is as fast as the index */
/* Expired exact entries looked at per check: this, plus twice the entries added since the
 * last check, so pruning keeps up with any ingest rate (amortised O(1) per event). */
#define PRUNE_BASE 512
#define SWEEP_PERIOD_MS 10000 /* how often idle rings are freed */
#define PRUNE_PERIOD_MS 1000  /* how often expired exact entries are pruned */

typedef struct ring_entry {
  uint64_t family; /* 0 = none yet */
  uint64_t event_id;
  int64_t first_ms;
  int64_t last_ms; /* the window slides from here */
  uint64_t idsig;  /* dedupe_idsig() of its text: near duplicates must agree on it */
  uint64_t sender; /* fnv1a64 of its sender: sender-only bulk folds within one sender */
} ring_entry;

/* Recent simhashes of one channel: a circular buffer that grows from RING_MIN to
 * DEDUPE_RING_MAX; when full the oldest entry is overwritten. The hashes sit in their own
 * array so a scan reads 8 bytes per entry and touches an entry's rest only when it is near
 * enough to matter. From INDEX_MIN_LEN entries on, a banded index (simidx.h) over the ring's
 * slots narrows the lookup to the entries that share a band with the query. */
typedef struct dd_channel {
  char *name;
  uint64_t *hashes;
  ring_entry *ring;
  uint32_t cap, len; /* occupied slots: 0..len-1 (all of them once full) */
  uint32_t next;     /* where the next push goes: the oldest entry once full */
  int64_t last_ms;
  simidx idx; /* bands == 0: none (built by dedupe_classify, for :near-distance + 1 bands) */
} dd_channel;

typedef struct top_entry {
  uint64_t family;
  uint64_t count;
} top_entry;

/* One slot of the exact-entry filter: a hash's first 8 bytes (never 0: 0 marks an empty
 * slot) and where its newest stored copy is (LOC_OF above), where the entry itself is read
 * (only for a slot whose tag matches: a repeat, or one tag collision in 2^64). */
typedef struct xslot {
  uint64_t tag;
  uint64_t loc;
} xslot;

/* A slot as it was before a request changed it (dedupe_rollback puts it back). */
typedef struct xundo {
  size_t pos;
  xslot before;
} xundo;

/* An exact entry a request wrote, not yet in the store (dd_entries_flush): entry i of the
 * held row. */
typedef struct dd_pending {
  int64_t last_ms;
  uint8_t sha[32];
  uint64_t family, event_id;
  int64_t first_ms;
  uint64_t simhash;
} dd_pending;

/* SHA-256 through libcrypto: a context and the algorithm, fetched once (EVP_sha256() in a
 * digest init fetches it on every call). md NULL: every hash is zeros (content dedupe then
 * matches nothing). */
struct cph_event_hasher {
  EVP_MD_CTX *md;
  EVP_MD *sha256;
};

typedef struct cph_dedupe {
  cph_hmap channels; /* name -> dd_channel */
  /* The ring ring_of found last: a request's events are mostly of one channel, and each event
   * asks twice. NULL after the rings it may be among are freed. */
  struct dd_channel *last_ring;
  /* A request's exact entries, held from dedupe_savepoint to dedupe_flush and then written as
   * one row (row number `row`, from the "dedupe_row" counter when the first is held; 0: none
   * yet), in the order they were written. Reads in the request find them here by their
   * location. Not batching (out of memory, or outside a request): each entry is written at
   * once, a row of its own. */
  dd_pending *pend;
  size_t n_pend, cap_pend;
  uint64_t row;
  bool batching;
  uint8_t *rowbuf; /* the held row's value as it is encoded: room for cap_pend entries */
  /* The exact entries of the window: open addressing, linear probing, a power-of-two table at
   * most 3/4 full; deletes (pruning only) shift the probe chain back, so there are no
   * tombstones. A request never grows the table (dedupe_savepoint reserves its room) and
   * never deletes, so its undo log of slot positions stays valid. */
  xslot *xs;
  size_t xs_cap, xs_len;
  xundo *undo;
  size_t n_undo, cap_undo;
  struct cph_event_hasher hash;
  int64_t next_prune_ms; /* dedupe_tick prunes at most once a second */
  uint64_t exact_hits, near_hits, families;
  /* The top families by count, largest first. Exact, not an estimate: counts only grow and
   * every increment passes through top_note, so a family outside the list can never exceed
   * its smallest member. */
  top_entry top[DEDUPE_TOP_MAX];
  size_t n_top;
  uint64_t added_since_prune;
  int64_t next_sweep_ms;
  /* dedupe_savepoint(): the counters and the top list as they were. */
  struct {
    uint64_t exact_hits, near_hits, families, added_since_prune;
    top_entry top[DEDUPE_TOP_MAX];
    size_t n_top;
  } saved;
} cph_dedupe;

typedef struct dd_entry {
  uint64_t family;
  uint64_t event_id;
  int64_t first_ms;
  int64_t last_ms;
  uint64_t simhash;
} dd_entry;

/* FNV-1a over n bytes (channel names, senders, shingles). */
static inline uint64_t dd_fnv1a64(const char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* ---- dedupe_exact.c: keys, entries and the exact-entry filter */

/* Appends n raw bytes to k (k->overflow past CPH_KEY_MAX). */
void dd_key_bytes(cph_key *k, const uint8_t *p, size_t n);
/* Keys: a time-ordered exact entry's; the family index entry of a content hash; a family's
 * aggregate record (CPH_DB_AGGREGATES). */
cph_key dd_xkey(int64_t last_ms, const uint8_t sha[32]);
cph_key dd_index_key(const uint8_t content_sha[32]);
cph_key dd_family_key(uint64_t family);
/* An exact entry's value: false when v is not one (wrong length or version). */
bool dd_entry_decode(const cph_val *v, dd_entry *d);
/* Logs a value that does not decode, with its key: it is treated as absent. */
void dd_log_bad_value(const cph_key *k, size_t len);
int dd_entry_put(cph_txn *t, const cph_key *k, const dd_entry *d);
/* Writes e (its last_ms included) as sha's newest copy: held for the request's flush while
 * batching, else written at once; *loc says where (for dd_xs_set). Errors are t's sticky
 * error. */
int dd_entry_write(cph_dedupe *d, cph_txn *t, const uint8_t sha[32], const dd_entry *e,
                   uint64_t *loc);
/* Starts holding a request's entries (room for about n); stops and forgets them. */
void dd_entries_batch(cph_dedupe *d, size_t n);
void dd_entries_forget(cph_dedupe *d);
/* Writes the held entries as a row and stops holding. Errors are t's sticky error. */
int dd_entries_flush(cph_dedupe *d, cph_txn *t);

/* SHA-256 of channel \0 sender \0 normalised body. */
void dd_exact_sha(cph_event_hasher *h, const char *chan, const char *sender, const char *norm,
                  size_t norm_len, uint8_t out[32]);
/* SHA-256 of the normalised body alone: the family index's key. */
void dd_content_sha(cph_event_hasher *h, const char *norm, size_t norm_len, uint8_t out[32]);

/* A copy of s cut to DEDUPE_SAMPLE_MAX bytes on a UTF-8 character boundary. */
char *dd_sample_dup(const char *s, size_t max);
/* A hash's filter tag: its first 8 bytes, never 0 (0 marks an empty slot). */
uint64_t dd_xs_tag(const uint8_t sha[32]);

/* Rehashes into cap slots (a power of two, room for every slot). CPH_ENOMEM leaves the table
 * as it was. O(old cap + cap). */
int dd_xs_resize(cph_dedupe *d, size_t cap);

/* Room for n more slots without passing 3/4 full. */
int dd_xs_reserve(cph_dedupe *d, size_t n);

/* Frees a table of cap slots made by dd_xs_resize (NULL is fine). */
void dd_xs_free(xslot *xs, size_t cap);

/* The slot of sha's newest stored copy, with that entry read through t; XS_NONE when sha has
 * none. A hash never seen reads nothing from the store. */
size_t dd_xs_find(const cph_dedupe *d, cph_txn *t, const uint8_t sha[32], dd_entry *en);
/* Starts loading the cache lines where dd_xs_find(sha) will probe first: the table is far
 * larger than the caches, so the probe is a miss that other work can overlap. No effect on
 * anything else. */
void dd_xs_prefetch(const cph_dedupe *d, const uint8_t sha[32]);

/* sha's newest copy is now the one at loc: its slot pos (xs_find's answer) follows, or a
 * new slot is taken. Logged for dedupe_rollback. Within a request the room was reserved by
 * dedupe_savepoint; without it (out of memory) the hash is left out — its repeats go
 * unnoticed, nothing worse. */
void dd_xs_set(cph_dedupe *d, size_t pos, const uint8_t sha[32], uint64_t loc);

/* Pruning deleted the copy (tag, loc): its slot goes if it names that copy (a newer copy
 * keeps it). Backward-shift deletion: the entries after it in the probe chain that may move
 * up, do. */
void dd_xs_forget(cph_dedupe *d, uint64_t tag, uint64_t loc);

/* Builds the filter from the stored entries, read through t: oldest first (schema 4's
 * time-ordered entries, then the rows in row order), so a hash's newer copy takes over its
 * older copy's slot. Telling a newer copy from another hash with the same tag reads the
 * store, only when tags match (a repeat). O(entries). */
int dd_xs_load(cph_dedupe *d, cph_txn *t);

/* A row's value (v) read: its newest last_ms and its number of entries; false when v is not
 * a row (then it is logged with its key k). */
bool dd_row_decode(const cph_key *k, const cph_val *v, int64_t *newest_ms, size_t *n);
/* Entry i's hash in a row's value. */
static inline const uint8_t *dd_row_sha(const cph_val *v, size_t i) {
  return (const uint8_t *)v->data + ROW_HEAD + i * ROW_ENTRY;
}
cph_key dd_row_key(uint64_t row);

#endif
