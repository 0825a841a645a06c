/* The network providers as a function table the engine is handed at open
 * (cph_engine_options.providers): the OpenAI-compatible embedder, the chat summariser and the
 * HTTP vector index (REST contract in docs/vector-index.md). The engine knows only this table;
 * the real one is cph_providers_network() in providers/providers.h, which speaks JSON over
 * HTTP. The built-in providers (feature-hashing embedder, extractive summariser, the embedded
 * LMDB vector index) are the engine's own and need no table.
 *
 * Contract, for every function of a table:
 * - ctx is the table's ctx, passed back unchanged;
 * - 0 (CPH_OK) or a negative cph error code, err filled with what failed and where (the URL);
 * - it blocks (each call bounded by its cfg's :timeout-ms) and is called only from the
 *   daemon's maintenance and search threads, never from the event loop and never with an LMDB
 *   transaction open (DESIGN §7), so it must be thread-safe: several threads call it at once;
 * - cfg is borrowed for the call only.
 * A NULL table, or a NULL entry, means that provider is unavailable: a job or search that the
 * policy sends to it fails with CPH_ESTATE and a message naming the policy key. The table must
 * outlive the engine. */
#ifndef CEPHALON_PROVIDERS_H
#define CEPHALON_PROVIDERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h" /* cph_vhit */
#include "cephalon/error.h"
#include "cephalon/policy.h"

/* One vector for the HTTP index. */
typedef struct cph_vitem {
  uint64_t memory_id;
  const char *scope;
  const float *vector; /* NULL for deletes */
  uint32_t dims;
} cph_vitem;

typedef struct cph_providers {
  /* :providers :embeddings {:kind :openai}: out holds n * cfg->dimensions floats, input i's
   * vector at out + i * dimensions; a response of another width is an error. n == 0 is 0. */
  int (*embed)(void *ctx, const cph_policy_embedder *cfg, const char *const *texts, size_t n,
               float *out, cph_err *err);
  /* :providers :summarizer {:kind :openai}: *out is a malloc'd, non-empty summary of
   * texts[0..n) (NULL on error). */
  int (*summarize)(void *ctx, const cph_policy_summarizer *cfg, const char *const *texts,
                   size_t n, char **out, cph_err *err);
  /* :vector-index {:kind :http}: puts every item of items[0..n) (all of one shard), replacing
   * any vector of the same id; n == 0 is 0. */
  int (*index_upsert)(void *ctx, const cph_policy_vector_index *cfg, uint32_t shard,
                      const cph_vitem *items, size_t n, cph_err *err);
  /* Deletes ids[0..n) (vectors of model, all of one shard); confirmed[i] is set true only for
   * the ids the index confirms (all false on error). */
  int (*index_delete)(void *ctx, const cph_policy_vector_index *cfg, uint32_t shard,
                      const char *model, const uint64_t *ids, size_t n, bool *confirmed,
                      cph_err *err);
  /* The k best hits of scope for q, best first (equal scores: lower id first), *n <= k. */
  int (*index_search)(void *ctx, const cph_policy_vector_index *cfg, const char *scope,
                      const float *q, uint32_t dims, size_t k, cph_vhit *out, size_t *n,
                      cph_err *err);
  /* Applies the settings the providers share (:providers :ca-file). Called by the engine on
   * its own thread at open and at every reload; may be NULL. */
  void (*configure)(void *ctx, const cph_policy_providers *cfg);
  void *ctx;
} cph_providers;

/* The network providers (providers/: OpenAI-compatible embedder and summariser, the HTTP
 * vector index; libcurl and jansson), for cph_engine_options.providers. Static: valid for the
 * life of the process. A program that links cph_providers has it; the engine never calls it. */
const cph_providers *cph_providers_network(void);

#endif
