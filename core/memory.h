/* Memories (DESIGN §7): minting, tags, and the embed queue they join. Private to core/.
 * Retrieval is search.c's. The module's in-memory state is four facts: the number of memories
 * waiting for an embedding, the accesses not yet written into the memories' records
 * (memaccess.h), the scope-index entries of the ingest request being applied (held until
 * its end), and the records kept decoded for turns (memcache.h); it owns them (cph_memory)
 * and others read or change them only through the functions here and in memaccess.h.
 *
 * Every write of a memory record goes through this module (memory_mint, memory_put and the
 * functions built on them), which is what keeps memcache.h's records equal to the store's;
 * no other module puts into the memories database. */
#ifndef CEPHALON_CORE_MEMORY_H
#define CEPHALON_CORE_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "memaccess.h"
#include "memcache.h"
#include "store/store.h"

/* A scope-index entry a request minted, held until memory_batch_flush (memory_mint). */
typedef struct memory_held {
  size_t scope_at;   /* its scope's name: at this offset in the batch's arena (scopes) */
  const char *scope; /* the same, as a pointer: set by the flush */
  bool raw;
  uint64_t id, source;
} memory_held;

typedef struct cph_memory {
  uint64_t embed_queue_len; /* memories waiting for an embedding (recounted at open) */
  cph_memaccess access;     /* accesses counted, not yet in the records (kept through a failed
                             * commit: memaccess_pass_end drops that pass's part) */
  cph_memcache cache;       /* records kept decoded for turns (memory_borrow) */
  /* Between memory_batch_begin and memory_batch_flush/forget (one ingest request): the scope
   * index entries minted, written as one row per scope and class at the flush. */
  bool batching;
  int64_t batch_ms; /* the batch's request time: its memories' created_ms (one clock read) */
  uint64_t embed_first, embed_last; /* the embed-queue range held (0, 0: none) */
  memory_held *held;
  size_t n_held, cap_held;
  char *scopes; /* the held entries' scope names, NUL-terminated, one after the other */
  size_t scopes_len, scopes_cap;
} cph_memory;

/* The embed queue: its length, set from the store at open (memory_embed_count), and the n
 * memories that left it (embedded, or deleted before their turn). */
static inline uint64_t memory_embed_queue(const cph_memory *m) { return m->embed_queue_len; }
static inline void memory_embed_queue_set(cph_memory *m, uint64_t n) { m->embed_queue_len = n; }
static inline void memory_embed_queue_done(cph_memory *m, uint64_t n) {
  m->embed_queue_len -= n < m->embed_queue_len ? n : m->embed_queue_len;
}

/* Scope of a channel-wide memory (minted from an event): "#" + channel; '#' never appears in
 * a session id, so scopes cannot collide. */
#define CPH_CHANNEL_SCOPE_PREFIX '#'
/* Mints a memory in t (DESIGN §7): kind raw/summary/aggregate, tokens_est = ceil(bytes/4).
 * With embed, its embedding is queued (embed_status pending, database embed_queue); without,
 * embed_status is none. */
int memory_mint(cph_memory *m, cph_txn *t, const char *scope, uint8_t kind, const char *text,
                uint64_t source_event_id, bool embed, uint64_t *id_out);
/* Cluster mode (server/clusterflow.h 13.): a memory's identity across nodes, its origin
 * "<node>/<id there>/<16 hex digits>" — the node that made it, its id there and a hash of its
 * scope, creation time and text (so a node started again under its name on an empty data dir
 * makes new ones). A memory imported from another node keeps its origin in the index
 * memory_origins (origin -> id here); one made here stores none: memory_origin works it out.
 *   memory_origin: m's origin as node (this node's name) gives it to a memory made here, into
 *     buf (MEMORY_ORIGIN_MAX bytes).
 *   memory_origin_of: m's origin: the one it was imported with, else memory_origin's.
 *   memory_find_origin: *id the memory here of origin — imported with it, or made here — else
 *     0.
 *   memory_adopt: stores m, a memory another node made (its scope, kind, text, tags, times
 *     and access count; not deleted, no source event, no plan lock), under a new id here, its
 *     embedding queued, and indexes its origin both ways (origin -> id, and 0xFF be64 id ->
 *     origin). The caller checked memory_find_origin. */
#define MEMORY_ORIGIN_MAX (128 + 48)
/* Whether memory id was adopted (memory_adopt) rather than minted here. */
bool memory_is_adopted(cph_txn *t, uint64_t id);
/* Cluster mode (server/clusterflow.h 16.): the raw memory a channel's event mints has the
 * event's identity cluster-wide as its origin, the same on every node that applies the event
 * (its `in` message's applier, the nodes its forwards reach, a rebuild delivering it again):
 * "e:", its time (fixed where the event was accepted; 16 hex digits) and the SHA-256, in hex,
 * of its scope, the event's sender, its time and its text (the event's body) — not its key,
 * which differs per forward. Two events alike in all four are one: exact repeats, which dedupe
 * folds anyway. The time leads so that the origin index (origin -> id) grows at its end, as
 * events come in time order: with the hash alone every memory minted dirtied a random page of
 * it, and a three-node ingest wrote ~1.7x the pages (bench/cluster.sh). An origin of the form
 * before (MEMORY_EVENT_ORIGIN_V1_LEN, no time) is still taken in an item of an older node.
 *   memory_event_origin: that origin, into out (MEMORY_EVENT_ORIGIN_LEN + 1 bytes).
 *   memory_note_origin: indexes the origin of memory id, minted here, both ways (origin -> id,
 *     and 0xFE be64 id -> origin), so memory_find_origin finds it and memory_origin_of gives
 *     it.
 *   memory_has_origin: whether memory id was adopted or minted under an origin — a copy that
 *     an import matches by its origin, not by its text. Not under an event's origin of the
 *     form before (a data directory of an older build): no copy carries that one now, so the
 *     memory is matched by its text. */
#define MEMORY_EVENT_ORIGIN_LEN (2 + 16 + 64)
#define MEMORY_EVENT_ORIGIN_HASH_AT (2 + 16) /* where the hash's hex digits start */
#define MEMORY_EVENT_ORIGIN_V1_LEN (2 + 64)
void memory_event_origin(const char *scope, const char *sender, int64_t ts_ms, const char *text,
                         char *out);
int memory_note_origin(cph_txn *t, uint64_t id, const char *origin);
bool memory_has_origin(cph_txn *t, uint64_t id);
/* Calls fn(ctx, id) for the memories adopted here with ids from `from` on, in id order, while
 * it returns CPH_OK (its error ends the walk and is returned). One cursor step each: the
 * automatic gc plan reads them past the first memory minted here that is too young (their ids
 * are new here, their ages are not). CPH_OK, fn's error or the store's. */
int memory_adopted_from(cph_txn *t, uint64_t from, int (*fn)(void *ctx, uint64_t id), void *ctx);
void memory_origin(char *buf, const char *node, const cph_memory_rec *m);
int memory_origin_of(cph_txn *t, const char *node, const cph_memory_rec *m, char *buf);
int memory_find_origin(cph_txn *t, const char *node, const char *origin, uint64_t *id);
int memory_adopt(cph_memory *mem, cph_txn *t, const cph_memory_rec *m, const char *origin,
                  uint64_t *id_out);
/* An aggregate memory is tagged with its family ("family:<id>", out holds 32 bytes), so the
 * family keeps one memory that aggregate_upsert updates in place (DESIGN §5). */
void memory_family_tag(uint64_t family, char out[32]);
int memory_add_tag(cph_memory *m, cph_txn *t, uint64_t id, const char *tag);
/* Writes rec as memory rec->id's record in t (replacing it). The only way a memory's record
 * changes besides minting. */
int memory_put(cph_memory *m, cph_txn *t, const cph_memory_rec *rec);
/* Writes every access count pending in m->access into its record (memaccess.h), in a child of
 * t: a memory deleted since, or undecodable, drops its count. Does nothing when the pass
 * already noted accesses or flushed. An error leaves the counts pending and t unchanged. */
int memory_flush_accesses(cph_memory *m, cph_txn *t);
/* Reads memory id as t sees it. CPH_ENOTFOUND when it is absent, or when its record does not
 * decode: that one is skipped with a warning naming `reader` and the memory, as every reader
 * of memories skips it, not a failure of the reader; other errors are t's. */
int memory_read(cph_txn *t, uint64_t id, cph_memory_rec *m, const char *reader);
/* memory_read for a turn's context, on the pass thread, inside the pass's transaction t: the
 * record from the cache when it is kept (memcache.h), else read, decoded and kept. *out is
 * borrowed: valid until a memory is written or the pass ends (memory_pass_end); not freed by
 * the caller. */
int memory_borrow(cph_memory *m, cph_txn *t, uint64_t id, const cph_memory_rec **out,
                  const char *reader);
/* The bound of the records kept decoded, at open: MEMORY_CACHE_BYTES unless a test set one. */
#define MEMORY_CACHE_BYTES ((size_t)32 << 20)
void memory_cache_open(cph_memory *m);
void memory_test_cache_bytes(long long bytes); /* tests: the next opens' bound; -1 resets */
/* The pass ended, committed or not (memcache_pass_end). */
void memory_pass_end(cph_memory *m);
/* Replaces a memory's text (and token estimate); an embedded one is queued to embed again. */
int memory_set_text(cph_memory *m, cph_txn *t, uint64_t id, const char *text);
/* Links raw memory id, which has no source event (one a channel's memories item brought,
 * handover.c), to event_id, this node's copy of the event it was minted from: its record and
 * its scope index row, so a turn that shows the event does not list the memory too. Nothing
 * for a memory of another class or with a source already. CPH_ENOTFOUND, or the store's
 * error. */
int memory_link_source(cph_memory *mem, cph_txn *t, uint64_t id, uint64_t event_id);
/* The index of memories by scope (database memory_scopes) keeps raw memories apart from the
 * others (summaries, aggregates), so a turn can fill each part of its memory budget without
 * reading through the other: key = scope\0 "raw"|"other"\0 u64 memory id -> be64 source event
 * id (0 = none), so a turn skips memories of events it already shows without reading them.
 * Schema 4: a row may hold the entries one ingest request minted in its scope and class — its
 * key the smallest id, its value that id's source and then (be64 id, be64 source) for each
 * further id, ascending. Rows never overlap in ids (a request's ids are all newer than the
 * rows before it), so rows in key order and entries in row order are id order. Read it
 * through memory_scope_cursor only. This is the key prefix. */
static inline void memory_scope_prefix(cph_key *k, const char *scope, bool raw) {
  cph_key_reset(k);
  cph_key_str(k, scope);
  cph_key_str(k, raw ? "raw" : "other");
}

/* Holds memory_mint's scope-index entries until memory_batch_flush writes them (one row per
 * scope and class), and its embed-queue entries as ranges of consecutive ids (one row per
 * range); memory_batch_forget drops them (the request failed). Nothing may read the scope
 * index or the embed queue in between. Out of memory while holding: index entries are written
 * at once. The batch's memories are created at now_ms (the request's time, one clock read). */
void memory_batch_begin(cph_memory *m, int64_t now_ms);
int memory_batch_flush(cph_memory *m, cph_txn *t);
void memory_batch_forget(cph_memory *m);
/* Frees the held entries and the cached records (the cache stays open, empty). */
void memory_free(cph_memory *m);

/* The embed queue (database embed_queue): the memories whose embedding is pending, oldest id
 * first. Schema 5: a row is a range of ids — key be64 first id, value be64 last id (> first),
 * or empty for a range of one (schema 4's only form: a schema-4 row is a range of one). Rows
 * never overlap. An ingest request writes one row per run of consecutive ids it queued
 * (memory_batch_flush); memory_set_text queues one id. Read and change it only through these:
 *   memory_embed_unqueue: takes id out of its range (the row goes, shrinks, or is split in
 *     two); CPH_ENOTFOUND (not sticky) when id is not queued. O(log rows).
 *   memory_embed_pending: the up to max oldest queued ids, ascending, into ids (*n of them).
 *   memory_embed_oldest: the oldest queued id; UINT64_MAX when none is (or on an error).
 *   memory_embed_count: how many ids are queued; walks every row (one per request, not one
 *     per memory). */
int memory_embed_unqueue(cph_txn *t, uint64_t id);
int memory_embed_pending(cph_txn *t, uint64_t *ids, size_t max, size_t *n);
uint64_t memory_embed_oldest(cph_txn *t);
int memory_embed_count(cph_txn *t, uint64_t *n);

/* One scope's entries of one class in the scope index, one entry at a time whatever rows hold
 * them. After open, position with newest or oldest, then step; `id` is the entry under it, 0
 * when there is none (past either end of the scope's class). `source` is its source event (0
 * if none, or a value of an old shape). Each call CPH_OK or the store's error. */
typedef struct memory_scope_cursor {
  cph_cursor cur;
  cph_key prefix;
  uint64_t id, source;
  uint64_t first, source0; /* the row's first entry (its key's id) */
  uint8_t *row; /* the row's further entries (a copy: writes in the txn may move the store's) */
  size_t row_cap;
  size_t n, at; /* entries in the row, and which is under the cursor */
} memory_scope_cursor;

int memory_scope_open(cph_txn *t, const char *scope, bool raw, memory_scope_cursor *sc);
int memory_scope_newest(memory_scope_cursor *sc);
int memory_scope_oldest(memory_scope_cursor *sc);
int memory_scope_older(memory_scope_cursor *sc);
int memory_scope_newer(memory_scope_cursor *sc);
void memory_scope_close(memory_scope_cursor *sc);

#endif
