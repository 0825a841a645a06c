/* cph_providers_network(): the network providers as the engine's function table
 * (cephalon/providers.h). */
#include "common/http_client.h"
#include "providers/providers.h"

static int embed(void *ctx, const cph_policy_embedder *cfg, const char *const *texts, size_t n,
                 float *out, cph_err *err) {
  (void)ctx;
  return cph_embed_openai(cfg, texts, n, out, err);
}

static int summarize(void *ctx, const cph_policy_summarizer *cfg, const char *const *texts,
                     size_t n, char **out, cph_err *err) {
  (void)ctx;
  return cph_summarize_openai(cfg, texts, n, out, err);
}

static int index_upsert(void *ctx, const cph_policy_vector_index *cfg, uint32_t shard,
                        const cph_vitem *items, size_t n, cph_err *err) {
  (void)ctx;
  return cph_vindex_http_upsert(cfg, shard, items, n, err);
}

static int index_delete(void *ctx, const cph_policy_vector_index *cfg, uint32_t shard,
                        const char *model, const uint64_t *ids, size_t n, bool *confirmed,
                        cph_err *err) {
  (void)ctx;
  return cph_vindex_http_delete(cfg, shard, model, ids, n, confirmed, err);
}

static int index_search(void *ctx, const cph_policy_vector_index *cfg, const char *scope,
                        const float *q, uint32_t dims, size_t k, cph_vhit *out, size_t *n,
                        cph_err *err) {
  (void)ctx;
  return cph_vindex_http_search(cfg, scope, q, dims, k, out, n, err);
}

/* The https trust of every provider URL is the HTTP client's process default. */
static void configure(void *ctx, const cph_policy_providers *cfg) {
  (void)ctx;
  cph_httpc_set_ca_file(cfg->ca_file);
}

static const cph_providers network = {
    .embed = embed,
    .summarize = summarize,
    .index_upsert = index_upsert,
    .index_delete = index_delete,
    .index_search = index_search,
    .configure = configure,
    .ctx = NULL,
};

const cph_providers *cph_providers_network(void) { return &network; }
