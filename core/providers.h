/* Embedders, summarisers and the vector index — the pieces a maintenance job calls.
 *
 * The built-in ones live here (core/embed.c, core/summarize.c, core/vindex.c): pure, no JSON,
 * no network. The network ones (OpenAI-compatible embedder and summariser, the HTTP vector
 * index) are not core's: the engine is handed them as a cph_providers table at open
 * (cephalon/providers.h) and reaches them only through the *_remote functions below, which
 * say so clearly when the table lacks one.
 *
 * Contract: every function here is pure with respect to the engine (no engine state, no LMDB
 * write transaction held by the caller across them). The network ones block and are called
 * only from maintenance worker threads, never from the event loop (DESIGN §7, issue: no LMDB
 * write transaction across a summariser, embedder or network call). Thread-safe. */
#ifndef CEPHALON_CORE_PROVIDERS_H
#define CEPHALON_CORE_PROVIDERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "cephalon/error.h"
#include "cephalon/policy.h"
#include "cephalon/providers.h"
#include "store/store.h"

/* ---- embeddings ---- */

/* The built-in embedder: feature hashing of lower-cased word unigrams and bigrams into `dims`
 * floats, signed by a second hash bit, L2-normalised (an all-zero vector for empty text).
 * Deterministic; no network. */
void cph_embed_builtin(const char *text, uint32_t dims, float *out);

/* The network embedder (:kind :openai) through prov->embed: out holds n * cfg->dimensions
 * floats. CPH_ESTATE, naming the policy key, when prov has none. Blocking. */
int cph_embed_remote(const cph_providers *prov, const cph_policy_embedder *cfg,
                     const char *const *texts, size_t n, float *out, cph_err *err);

/* ---- summaries ---- */

/* The built-in extractive summariser: the most informative sentences of texts (scored by
 * word frequency across all texts, first sentences win ties), in their original order, within
 * max_tokens (token = ceil(bytes/4)). Never empty for non-empty input. Returns malloc'd text. */
char *cph_summarize_extractive(const char *const *texts, size_t n, size_t max_tokens);

/* The network summariser (:kind :openai) through prov->summarize: *out is malloc'd.
 * CPH_ESTATE, naming the policy key, when prov has none. Blocking. */
int cph_summarize_remote(const cph_providers *prov, const cph_policy_summarizer *cfg,
                         const char *const *texts, size_t n, char **out, cph_err *err);

/* ---- the embedded vector index (in LMDB, database "vectors") ----
 * Key: scope\0 + u64 memory id. Value: u32 dims + dims float32 (little-endian). */

/* Replaces any vector of the id. CPH_EINVAL (not sticky) for no vector, 0 dims or a NaN or
 * infinite value. */
int cph_vindex_put(cph_txn *t, const char *scope, uint64_t memory_id, const float *v,
                   uint32_t dims);
/* CPH_ENOTFOUND when absent (not an error for deletes that already happened). */
int cph_vindex_del(cph_txn *t, const char *scope, uint64_t memory_id);

/* cph_vhit (memory id, cosine similarity) is public: cephalon/cephalon.h. */

/* The k best hits in scope by cosine similarity, best first (equal scores: lower id first);
 * *n <= k. Brute force over the scope's vectors. Vectors of another width and zero vectors are
 * skipped; a zero query finds nothing. A malformed stored value is CPH_ECORRUPT, sticky on t,
 * with t->err naming the key. */
int cph_vindex_search(cph_txn *t, const char *scope, const float *q, uint32_t dims, size_t k,
                      cph_vhit *out, size_t *n);

/* ---- shards ----
 * The shard a memory's vector belongs to: memory id mod :vector-index :shards (0 with one
 * shard). The id is the only key an index item has (docs/vector-index.md: "an id is identified
 * by id alone"), so the rule needs nothing else and gives every shard the same share of ids.
 * Upserts and outbox deletes are batched per shard; the embedded index, a single partition,
 * records the shard on outbox items all the same, so the batches do not change when the index
 * moves to HTTP. An item keeps the shard it was given when :shards is changed later (a shard is
 * a routing hint; the index must find an id whatever shard names it). */
static inline uint32_t cph_vindex_shard(uint64_t memory_id, int64_t shards) {
  return shards > 1 ? (uint32_t)(memory_id % (uint64_t)shards) : 0;
}

/* ---- the HTTP vector index (:vector-index {:kind :http}), through prov->index_* ----
 * Each is CPH_ESTATE, naming the policy key, when prov has none. Blocking. */

int cph_vindex_remote_upsert(const cph_providers *prov, const cph_policy_vector_index *cfg,
                             uint32_t shard, const cph_vitem *items, size_t n, cph_err *err);
/* confirmed[i] is true only for the ids the index confirmed (all false on error). */
int cph_vindex_remote_delete(const cph_providers *prov, const cph_policy_vector_index *cfg,
                             uint32_t shard, const char *model, const uint64_t *ids, size_t n,
                             bool *confirmed, cph_err *err);
int cph_vindex_remote_search(const cph_providers *prov, const cph_policy_vector_index *cfg,
                             const char *scope, const float *q, uint32_t dims, size_t k,
                             cph_vhit *out, size_t *n, cph_err *err);

#endif
