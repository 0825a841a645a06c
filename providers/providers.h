/* The network providers: the OpenAI-compatible embedder and chat summariser and the HTTP vector
 * index client, JSON (jansson) over common/http_client (libcurl; http and https). Errors name
 * the URL. Every function blocks, bounded by its cfg's :timeout-ms, and is thread-safe.
 *
 * Dependencies run one way: providers/ uses common/ and the public types of include/cephalon/
 * (the policy structs, cph_vhit, the table); the engine never includes this header — it is
 * handed cph_providers_network() at open (cph_engine_options.providers) by the daemon, the
 * tests and the bench. */
#ifndef CEPHALON_PROVIDERS_PROVIDERS_H
#define CEPHALON_PROVIDERS_PROVIDERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"
#include "cephalon/policy.h"
#include "cephalon/providers.h"

/* cph_providers_network() (public: cephalon/providers.h) is the table of the functions below
 * (ctx unused), with configure setting the HTTP client's process-wide CA file from
 * :providers :ca-file. */

/* ---- embeddings ---- */

/* An OpenAI-compatible embeddings endpoint: POST cfg->url with {"model", "input": [texts]},
 * Authorization from the environment variable cfg->api_key_env (if set), timeout
 * cfg->timeout_ms. out holds n * cfg->dimensions floats (a response of another width is an
 * error). */
int cph_embed_openai(const cph_policy_embedder *cfg, const char *const *texts, size_t n,
                     float *out, cph_err *err);

/* ---- summaries ---- */

/* An OpenAI-compatible chat endpoint: POST cfg->url with {"model", "messages": [system
 * "Summarise ...", user <texts joined>], "max_tokens"}; the summary is
 * choices[0].message.content, trimmed, never empty. */
int cph_summarize_openai(const cph_policy_summarizer *cfg, const char *const *texts, size_t n,
                         char **out, cph_err *err);

/* ---- the HTTP vector index (REST contract in docs/vector-index.md) ---- */

/* POST {url}/upsert {"shard", "items": [{"id", "scope", "vector"}]} -> 200 {"upserted": n}. */
int cph_vindex_http_upsert(const cph_policy_vector_index *cfg, uint32_t shard,
                           const cph_vitem *items, size_t n, cph_err *err);
/* POST {url}/delete {"shard", "model", "ids": [id...]} -> 200 {"deleted": [id...]}: only the
 * ids the index confirms are reported in confirmed[] (true per item). */
int cph_vindex_http_delete(const cph_policy_vector_index *cfg, uint32_t shard,
                           const char *model, const uint64_t *ids, size_t n, bool *confirmed,
                           cph_err *err);
/* POST {url}/search {"scope", "vector", "k"} -> 200 {"hits": [{"id", "score"}]}: best first
 * (equal scores: lower id first), at most k. */
int cph_vindex_http_search(const cph_policy_vector_index *cfg, const char *scope,
                           const float *q, uint32_t dims, size_t k, cph_vhit *out, size_t *n,
                           cph_err *err);

#endif
