/* The HTTP vector index client (cph_vindex_http_*, providers/providers.h; the REST contract is
 * docs/vector-index.md). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_client.h"
#include "providers/providers.h"

/* Best first: higher score, then the lower id — the order the embedded index answers in
 * (core/vindex.c), so a search ranks the same whichever index serves it. */
static int best_first(const void *a, const void *b) {
  const cph_vhit *x = a, *y = b;
  if (x->score != y->score)
    return x->score > y->score ? -1 : 1;
  return x->memory_id < y->memory_id ? -1 : x->memory_id > y->memory_id;
}

/* "{url}/{op}" as the request goes out: the base URL's trailing '/' dropped. */
static const char *endpoint(const char *url, const char *op, char *buf, size_t len) {
  int base_len = (int)strlen(url);
  while (base_len > 0 && url[base_len - 1] == '/')
    base_len--;
  snprintf(buf, len, "%.*s/%s", base_len, url, op);
  return buf;
}

static int bad_answer(cph_err *err, const char *url, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad_answer(cph_err *err, const char *url, const char *op, const char *fmt, ...) {
  char what[400], where[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return cph_err_set(err, CPH_EPARSE, "vector index %s: bad answer: %s",
                     endpoint(url, op, where, sizeof where), what);
}

static int no_memory(cph_err *err, const char *url, const char *op) {
  char where[400];
  return cph_err_set(err, CPH_ENOMEM, "vector index %s: out of memory",
                     endpoint(url, op, where, sizeof where));
}

/* POSTs req to {url}/{op} and parses the 2xx answer into *answer (a JSON object). Takes
 * ownership of req. */
static int index_call(const cph_policy_vector_index *cfg, const char *op, json_t *req,
                      json_t **answer, cph_err *err) {
  *answer = NULL;
  const char *url = cfg->url ? cfg->url : "";
  char path[32];
  snprintf(path, sizeof path, "/%s", op);
  cph_httpc_response resp = {0};
  /* 9 significant digits print every float32 exactly enough to read it back bit for bit. */
  char *body = req ? json_dumps(req, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
  json_decref(req);
  int rc;
  if (!url[0]) {
    rc = cph_err_set(err, CPH_EINVAL, "vector index: no :url configured");
    goto out;
  }
  if (!body) {
    rc = no_memory(err, url, op);
    goto out;
  }
  if ((rc = cph_httpc_post_json(url, path, body, strlen(body), NULL, (int)cfg->timeout_ms, &resp,
                                err)) != 0) {
    cph_err tmp = *err;
    rc = cph_err_set(err, rc, "vector index: %s", tmp.msg);
    goto out;
  }
  char shown[400];
  if ((rc = cph_httpc_check_status(&resp, "vector index", endpoint(url, op, shown, sizeof shown),
                                   err)) != 0)
    goto out;
  json_error_t jerr;
  json_t *root = json_loadb(resp.body, resp.body_len, 0, &jerr);
  if (!root) {
    rc = bad_answer(err, url, op, "not JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                    jerr.column);
    goto out;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    rc = bad_answer(err, url, op, "expected a JSON object");
    goto out;
  }
  *answer = root;
  rc = CPH_OK;
out:
  free(body);
  cph_httpc_response_free(&resp);
  return rc;
}

/* Ids travel as JSON integers, which jansson holds as signed 64-bit. */
static json_t *id_json(uint64_t id) {
  return id <= (uint64_t)INT64_MAX ? json_integer((json_int_t)id) : NULL;
}

static json_t *vector_json(const float *v, uint32_t dims) {
  json_t *a = json_array();
  for (uint32_t i = 0; a && i < dims; i++)
    if (json_array_append_new(a, json_real(v[i]))) { /* NULL for NaN and infinities */
      json_decref(a);
      a = NULL;
    }
  return a;
}

int cph_vindex_http_upsert(const cph_policy_vector_index *cfg, uint32_t shard,
                           const cph_vitem *items, size_t n, cph_err *err) {
  const char *url = cfg->url ? cfg->url : "";
  if (n == 0)
    return CPH_OK;
  json_t *req = json_object(), *arr = json_array();
  if (!req || !arr || json_object_set_new(req, "shard", json_integer(shard)) ||
      json_object_set(req, "items", arr)) {
    json_decref(req);
    json_decref(arr);
    return no_memory(err, url, "upsert");
  }
  json_decref(arr); /* req holds it */
  for (size_t i = 0; i < n; i++) {
    const cph_vitem *it = &items[i];
    json_t *id = id_json(it->memory_id);
    json_t *scope = it->scope ? json_string(it->scope) : NULL;
    json_t *vec = it->vector && it->dims ? vector_json(it->vector, it->dims) : NULL;
    json_t *obj = json_object();
    bool ok = id && scope && vec && obj && !json_object_set(obj, "id", id) &&
              !json_object_set(obj, "scope", scope) && !json_object_set(obj, "vector", vec) &&
              !json_array_append(arr, obj);
    json_decref(id);
    json_decref(scope);
    json_decref(vec);
    json_decref(obj);
    if (!ok) {
      json_decref(req);
      char where[400];
      return cph_err_set(err, CPH_EINVAL,
                         "vector index %s: item %zu (memory %llu) cannot be sent: it needs an "
                         "id below 2^63, a UTF-8 scope and a finite vector",
                         endpoint(url, "upsert", where, sizeof where), i,
                         (unsigned long long)it->memory_id);
    }
  }
  json_t *answer;
  int rc = index_call(cfg, "upsert", req, &answer, err);
  if (rc)
    return rc;
  const json_t *up = json_object_get(answer, "upserted");
  if (!json_is_integer(up))
    rc = bad_answer(err, url, "upsert", "expected {\"upserted\": n}");
  else if (json_integer_value(up) != (json_int_t)n)
    rc = bad_answer(err, url, "upsert", "upserted %lld of %zu items",
                    (long long)json_integer_value(up), n);
  json_decref(answer);
  return rc;
}

int cph_vindex_http_delete(const cph_policy_vector_index *cfg, uint32_t shard,
                           const char *model, const uint64_t *ids, size_t n, bool *confirmed,
                           cph_err *err) {
  const char *url = cfg->url ? cfg->url : "";
  for (size_t i = 0; i < n; i++)
    confirmed[i] = false;
  if (n == 0)
    return CPH_OK;
  json_t *req = json_object(), *arr = json_array();
  bool ok = req && arr && !json_object_set_new(req, "shard", json_integer(shard)) &&
            !json_object_set_new(req, "model", json_string(model ? model : "")) &&
            !json_object_set(req, "ids", arr);
  for (size_t i = 0; ok && i < n; i++) {
    json_t *id = id_json(ids[i]);
    if (!id) {
      json_decref(req);
      json_decref(arr);
      char where[400];
      return cph_err_set(err, CPH_EINVAL, "vector index %s: id %llu is not below 2^63",
                         endpoint(url, "delete", where, sizeof where),
                         (unsigned long long)ids[i]);
    }
    ok = !json_array_append_new(arr, id);
  }
  json_decref(arr);
  if (!ok) {
    json_decref(req);
    return no_memory(err, url, "delete");
  }
  json_t *answer;
  int rc = index_call(cfg, "delete", req, &answer, err);
  if (rc)
    return rc;
  /* Validate the whole list before confirming anything: a malformed answer confirms
   * nothing. Ids the index lists that were not asked for are ignored. */
  const json_t *deleted = json_object_get(answer, "deleted");
  size_t i;
  const json_t *v;
  if (!json_is_array(deleted)) {
    rc = bad_answer(err, url, "delete", "expected {\"deleted\": [id, ...]}");
  } else {
    json_array_foreach(deleted, i, v) {
      if (!json_is_integer(v) || json_integer_value(v) < 0) {
        rc = bad_answer(err, url, "delete", "deleted[%zu] is not a memory id", i);
        break;
      }
    }
  }
  if (rc == CPH_OK)
    json_array_foreach(deleted, i, v) {
      uint64_t id = (uint64_t)json_integer_value(v);
      for (size_t j = 0; j < n; j++)
        if (ids[j] == id)
          confirmed[j] = true;
    }
  json_decref(answer);
  return rc;
}

int cph_vindex_http_search(const cph_policy_vector_index *cfg, const char *scope,
                           const float *q, uint32_t dims, size_t k, cph_vhit *out, size_t *n,
                           cph_err *err) {
  const char *url = cfg->url ? cfg->url : "";
  *n = 0;
  if (k == 0)
    return CPH_OK;
  json_t *req = json_object();
  json_t *s = scope ? json_string(scope) : NULL;
  json_t *vec = q && dims ? vector_json(q, dims) : NULL;
  bool ok = req && s && vec && !json_object_set(req, "scope", s) &&
            !json_object_set(req, "vector", vec) &&
            !json_object_set_new(req, "k", json_integer((json_int_t)k));
  json_decref(s);
  json_decref(vec);
  if (!ok) {
    json_decref(req);
    char where[400];
    return cph_err_set(err, CPH_EINVAL,
                       "vector index %s: the query needs a UTF-8 scope and a finite vector",
                       endpoint(url, "search", where, sizeof where));
  }
  json_t *answer;
  int rc = index_call(cfg, "search", req, &answer, err);
  if (rc)
    return rc;
  const json_t *hits = json_object_get(answer, "hits");
  size_t count = json_is_array(hits) ? json_array_size(hits) : 0;
  cph_vhit *all = count ? malloc(count * sizeof *all) : NULL;
  if (!json_is_array(hits)) {
    rc = bad_answer(err, url, "search", "expected {\"hits\": [{\"id\", \"score\"}, ...]}");
  } else if (count && !all) {
    rc = no_memory(err, url, "search");
  } else {
    for (size_t i = 0; i < count; i++) {
      const json_t *h = json_array_get(hits, i);
      const json_t *id = json_is_object(h) ? json_object_get(h, "id") : NULL;
      const json_t *score = json_is_object(h) ? json_object_get(h, "score") : NULL;
      double sc = json_is_number(score) ? json_number_value(score) : NAN;
      if (!json_is_integer(id) || json_integer_value(id) < 0 || !isfinite(sc)) {
        rc = bad_answer(err, url, "search",
                        "hits[%zu] needs an integer \"id\" and a finite \"score\"", i);
        break;
      }
      all[i] = (cph_vhit){(uint64_t)json_integer_value(id), (float)sc};
    }
  }
  if (rc == CPH_OK) {
    /* Best first whatever order the index used; at most k even if it sent more. */
    if (count)
      qsort(all, count, sizeof *all, best_first);
    *n = count < k ? count : k;
    if (*n)
      memcpy(out, all, *n * sizeof *out);
  }
  free(all);
  json_decref(answer);
  return rc;
}
