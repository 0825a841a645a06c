/* Memories (DESIGN §7): minting, tags, and the embed queue they join. Private to core/.
 * Retrieval is search.c's. The module's in-memory state is two facts, the number of memories
 * waiting for an embedding and the accesses not yet written into the memories' records
 * (memaccess.h); it owns them (cph_memory) and others read or change them only through the
 * functions here and in memaccess.h. */
#ifndef CEPHALON_CORE_MEMORY_H
#define CEPHALON_CORE_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "memaccess.h"
#include "store/store.h"

typedef struct cph_memory {
  uint64_t embed_queue_len; /* memories waiting for an embedding (recounted at open) */
  cph_memaccess access;     /* accesses counted, not yet in the records (kept through a failed
                             * commit: memaccess_pass_end drops that pass's part) */
} cph_memory;

/* The embed queue: its length, set from the store at open (the count LMDB keeps), and the n
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
/* An aggregate memory is tagged with its family ("family:<id>", out holds 32 bytes), so the
 * family keeps one memory that aggregate_upsert updates in place (DESIGN §5). */
void memory_family_tag(uint64_t family, char out[32]);
int memory_add_tag(cph_txn *t, uint64_t id, const char *tag);
/* Writes every access count pending in m->access into its record (memaccess.h), in a child of
 * t: a memory deleted since, or undecodable, drops its count. Does nothing when the pass
 * already noted accesses or flushed. An error leaves the counts pending and t unchanged. */
int memory_flush_accesses(cph_memory *m, cph_txn *t);
/* Reads memory id as t sees it. CPH_ENOTFOUND when it is absent, or when its record does not
 * decode: that one is skipped with a warning naming `reader` and the memory, as every reader
 * of memories skips it, not a failure of the reader; other errors are t's. */
int memory_read(cph_txn *t, uint64_t id, cph_memory_rec *m, const char *reader);
/* Replaces a memory's text (and token estimate); an embedded one is queued to embed again. */
int memory_set_text(cph_memory *m, cph_txn *t, uint64_t id, const char *text);
/* The index of memories by scope (database memory_scopes) keeps raw memories apart from the
 * others (summaries, aggregates), so a turn can fill each part of its memory budget without
 * reading through the other: key = scope\0 "raw"|"other"\0 u64 memory id -> be64 source event
 * id (0 = none), so a turn skips memories of events it already shows without reading them.
 * This is the key prefix. */
static inline void memory_scope_prefix(cph_key *k, const char *scope, bool raw) {
  cph_key_reset(k);
  cph_key_str(k, scope);
  cph_key_str(k, raw ? "raw" : "other");
}

#endif
