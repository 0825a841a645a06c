/* The built-in embedder: feature hashing (core/providers.h). The OpenAI-compatible one is a
 * network provider (providers/embed_openai.c), reached through the engine's cph_providers. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "core/providers.h"

/* ---------------------------------------------------------------- built-in */

/* The hash is part of the stored format: vectors in the index were made with it, so changing
 * any constant below is a new model (give it a new :model name and re-embed). */
#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)
#define SEED_UNIGRAM UINT64_C(0x9e3779b97f4a7c15)
#define SEED_BIGRAM UINT64_C(0xc2b2ae3d27d4eb4f)
#define BIGRAM_WEIGHT 0.5f /* a shared phrase counts, but less than its two shared words */

/* splitmix64's finaliser: FNV-1a alone leaves the low bits (the bucket) poorly mixed for short
 * words. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= UINT64_C(0xbf58476d1ce4e5b9);
  x ^= x >> 27;
  x *= UINT64_C(0x94d049bb133111eb);
  x ^= x >> 31;
  return x;
}

/* Word bytes: ASCII letters and digits, and every byte of a multi-byte UTF-8 sequence (so
 * non-Latin words are words too; only ASCII is case-folded). */
static bool word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

/* The bucket comes from the low 32 bits, the sign from bit 63 (the "second hash"): after
 * mix64 they are independent, so collisions cancel out on average instead of piling up. */
static void add_feature(float *out, uint32_t dims, uint64_t h, float w) {
  uint32_t bucket = (uint32_t)(h & UINT32_MAX) % dims;
  out[bucket] += (h >> 63) ? -w : w;
}

void cph_embed_builtin(const char *text, uint32_t dims, float *out) {
  if (dims == 0)
    return;
  memset(out, 0, (size_t)dims * sizeof *out);
  if (!text)
    return;
  const unsigned char *p = (const unsigned char *)text;
  uint64_t prev = 0;
  bool have_prev = false;
  while (*p) {
    if (!word_byte(*p)) {
      p++;
      continue;
    }
    uint64_t h = FNV_OFFSET;
    for (; *p && word_byte(*p); p++) {
      unsigned char c = *p;
      if (c >= 'A' && c <= 'Z')
        c = (unsigned char)(c - 'A' + 'a');
      h = (h ^ c) * FNV_PRIME;
    }
    add_feature(out, dims, mix64(h ^ SEED_UNIGRAM), 1.0f);
    if (have_prev) /* order matters: "dog bites" is not "bites dog" */
      add_feature(out, dims, mix64(((prev << 23) | (prev >> 41)) ^ h ^ SEED_BIGRAM),
                  BIGRAM_WEIGHT);
    prev = h;
    have_prev = true;
  }
  double sum = 0;
  for (uint32_t i = 0; i < dims; i++)
    sum += (double)out[i] * out[i];
  if (sum <= 0) /* empty text, or features that cancelled exactly: the zero vector */
    return;
  double inv = 1.0 / sqrt(sum);
  for (uint32_t i = 0; i < dims; i++)
    out[i] = (float)(out[i] * inv);
}

/* ---------------------------------------------------------------- network (the table) */

int cph_embed_remote(const cph_providers *prov, const cph_policy_embedder *cfg,
                     const char *const *texts, size_t n, float *out, cph_err *err) {
  if (!prov || !prov->embed)
    return cph_err_set(err, CPH_ESTATE,
                       "embeddings: :providers :embeddings :kind :openai is not available: the "
                       "engine was opened without network providers");
  return prov->embed(prov->ctx, cfg, texts, n, out, err);
}
