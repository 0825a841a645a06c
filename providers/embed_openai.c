/* The OpenAI-compatible embeddings client (cph_embed_openai, providers/providers.h). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_client.h"
#include "providers/openai_http.h"
#include "providers/providers.h"

/* Fills out[] from {"data": [{"embedding": [...], "index": i}, ...]}. Items are placed by
 * their "index" when present (the API allows any order), else by position; every input
 * must get exactly one embedding of exactly dims numbers. */
static int parse_embeddings(const json_t *root, const char *url, size_t n, uint32_t dims,
                            float *out, cph_err *err) {
  const json_t *data = json_is_object(root) ? json_object_get(root, "data") : NULL;
  if (!json_is_array(data))
    return openai_bad_answer(err, "embeddings", url, "expected an object with a \"data\" array");
  if (json_array_size(data) != n)
    return openai_bad_answer(err, "embeddings", url, "\"data\" has %zu items for %zu inputs",
                             json_array_size(data), n);
  bool *seen = calloc(n, sizeof *seen);
  if (!seen)
    return cph_err_set(err, CPH_ENOMEM, "embeddings %s: out of memory", url);
  int rc = CPH_OK;
  for (size_t i = 0; i < n && rc == CPH_OK; i++) {
    const json_t *item = json_array_get(data, i);
    const json_t *emb = json_is_object(item) ? json_object_get(item, "embedding") : NULL;
    const json_t *index = json_is_object(item) ? json_object_get(item, "index") : NULL;
    size_t slot = i;
    if (index) {
      json_int_t ix = json_is_integer(index) ? json_integer_value(index) : -1;
      if (ix < 0 || (uint64_t)ix >= n) {
        rc = openai_bad_answer(err, "embeddings", url,
                               "data[%zu].index is not an integer from 0 to %zu", i, n - 1);
        break;
      }
      slot = (size_t)ix;
    }
    if (seen[slot]) {
      rc = openai_bad_answer(err, "embeddings", url, "two embeddings for input %zu", slot);
      break;
    }
    seen[slot] = true;
    if (!json_is_array(emb)) {
      rc = openai_bad_answer(err, "embeddings", url, "data[%zu].embedding is not an array", i);
      break;
    }
    if (json_array_size(emb) != dims) {
      rc = openai_bad_answer(err, "embeddings", url,
                             "data[%zu].embedding has %zu dimensions, expected %u "
                             "(:providers :embeddings :dimensions)",
                             i, json_array_size(emb), dims);
      break;
    }
    float *dst = out + slot * dims;
    for (uint32_t d = 0; d < dims; d++) {
      const json_t *x = json_array_get(emb, d);
      double v = json_is_number(x) ? json_number_value(x) : NAN;
      if (!isfinite(v) || fabs(v) > 3.0e38) {
        rc = openai_bad_answer(err, "embeddings", url,
                               "data[%zu].embedding[%u] is not a finite number", i, d);
        break;
      }
      dst[d] = (float)v;
    }
  }
  free(seen);
  return rc;
}

int cph_embed_openai(const cph_policy_embedder *cfg, const char *const *texts, size_t n, float *out,
                     cph_err *err) {
  const char *url = cfg->url ? cfg->url : "";
  if (!url[0])
    return cph_err_set(err, CPH_EINVAL, "embeddings: no :url configured");
  if (cfg->dimensions <= 0 || cfg->dimensions > UINT32_MAX)
    return cph_err_set(err, CPH_EINVAL, "embeddings %s: :dimensions %lld is out of range", url,
                       (long long)cfg->dimensions);
  if (n == 0)
    return CPH_OK;
  uint32_t dims = (uint32_t)cfg->dimensions;
  const char *bearer;
  int rc = cph_httpc_bearer_from_env(cfg->api_key_env, &bearer, err);
  if (rc)
    return rc;

  json_t *root = NULL, *answer = NULL;
  json_t *input = json_array();
  root = json_object();
  if (!input || !root ||
      json_object_set_new(root, "model", json_string(cfg->model ? cfg->model : "")) ||
      json_object_set(root, "input", input)) {
    rc = cph_err_set(err, CPH_ENOMEM, "embeddings %s: out of memory", url);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_string(texts[i] ? texts[i] : "");
    if (!s) { /* jansson refuses invalid UTF-8 */
      rc = cph_err_set(err, CPH_EINVAL, "embeddings %s: input %zu is not valid UTF-8", url, i);
      goto out;
    }
    if (json_array_append_new(input, s)) {
      rc = cph_err_set(err, CPH_ENOMEM, "embeddings %s: out of memory", url);
      goto out;
    }
  }
  /* cfg->url is the endpoint itself (e.g. http://127.0.0.1:8080/v1/embeddings). */
  if ((rc = openai_post("embeddings", url, bearer, (int)cfg->timeout_ms, root, &answer, err)))
    goto out;
  rc = parse_embeddings(answer, url, n, dims, out, err);
out:
  json_decref(input);
  json_decref(root);
  json_decref(answer);
  return rc;
}
