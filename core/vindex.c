/* The vector index: embedded in LMDB (database "vectors") and the HTTP index client
 * (core/providers.h; the REST contract is docs/vector-index.md). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/http_client.h"
#include "core/providers.h"

/* ---------------------------------------------------------------- embedded: encoding */

/* Values are little-endian whatever the host, so a data directory moves between machines. */
static void le32_put(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t le32_get(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float le_float_get(const uint8_t *p) {
  uint32_t bits = le32_get(p);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static void vector_key(cph_key *k, const char *scope, uint64_t memory_id) {
  cph_key_reset(k);
  cph_key_str(k, scope);
  cph_key_u64(k, memory_id);
}

/* Marks the txn failed the way store/ does (sticky ret + message), for a value the store
 * cannot know is malformed: a vector's length must match its dims. */
static int corrupt(cph_txn *t, const cph_val *key, const char *why) {
  if (t->ret)
    return t->ret;
  char desc[160];
  cph_key_describe(key->data, key->len, desc, sizeof desc);
  t->ret = CPH_ECORRUPT;
  return cph_err_set(&t->err, CPH_ECORRUPT, "corrupt record in database \"vectors\" at key %s: %s",
                     desc, why);
}

/* ---------------------------------------------------------------- embedded: put, del */

/* Invalid arguments (no vector, 0 dims, a NaN or infinity) are CPH_EINVAL and do not fail the
 * transaction; a key too long for LMDB is the txn's sticky CPH_ELIMIT. */
int cph_vindex_put(cph_txn *t, const char *scope, uint64_t memory_id, const float *v,
                   uint32_t dims) {
  if (t->ret)
    return t->ret;
  if (!scope || !v || dims == 0 || dims > (UINT32_MAX - 4) / 4)
    return CPH_EINVAL;
  for (uint32_t i = 0; i < dims; i++)
    if (!isfinite(v[i]))
      return CPH_EINVAL;
  size_t len = 4 + (size_t)dims * 4;
  uint8_t *val = malloc(len);
  if (!val)
    return CPH_ENOMEM;
  le32_put(val, dims);
  for (uint32_t i = 0; i < dims; i++) {
    uint32_t bits;
    memcpy(&bits, &v[i], sizeof bits);
    le32_put(val + 4 + (size_t)i * 4, bits);
  }
  cph_key k;
  vector_key(&k, scope, memory_id);
  int rc = cph_txn_put(t, CPH_DB_VECTORS, &k, val, len);
  free(val);
  return rc;
}

int cph_vindex_del(cph_txn *t, const char *scope, uint64_t memory_id) {
  if (!scope)
    return CPH_EINVAL;
  cph_key k;
  vector_key(&k, scope, memory_id);
  return cph_txn_del(t, CPH_DB_VECTORS, &k);
}

/* ---------------------------------------------------------------- embedded: search */

/* a ranks below b: lower score, or the same score and a later id (earlier memories win ties,
 * so results do not depend on anything but the data). */
static bool worse(const cph_vhit *a, const cph_vhit *b) {
  return a->score < b->score || (a->score == b->score && a->memory_id > b->memory_id);
}

/* heap[0..n) is a min-heap under worse(): the root is the weakest of the best k so far. */
static void sift_down(cph_vhit *heap, size_t n, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && worse(&heap[l], &heap[m]))
      m = l;
    if (r < n && worse(&heap[r], &heap[m]))
      m = r;
    if (m == i)
      return;
    cph_vhit tmp = heap[i];
    heap[i] = heap[m];
    heap[m] = tmp;
    i = m;
  }
}

static void sift_up(cph_vhit *heap, size_t i) {
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!worse(&heap[i], &heap[parent]))
      return;
    cph_vhit tmp = heap[i];
    heap[i] = heap[parent];
    heap[parent] = tmp;
    i = parent;
  }
}

static int best_first(const void *a, const void *b) {
  const cph_vhit *x = a, *y = b;
  return worse(y, x) ? -1 : worse(x, y) ? 1 : 0;
}

/* Cost: one pass over the scope's vectors, O(N * dims + N log k), no allocation beyond out.
 * Vectors of another width (left by an earlier model) are skipped, and so are zero vectors
 * (empty texts): cosine means nothing for them. A zero query finds nothing. */
int cph_vindex_search(cph_txn *t, const char *scope, const float *q, uint32_t dims, size_t k,
                      cph_vhit *out, size_t *n) {
  *n = 0;
  if (t->ret)
    return t->ret;
  if (!scope || !q || dims == 0)
    return CPH_EINVAL;
  if (k == 0)
    return CPH_OK;
  double qnorm = 0;
  for (uint32_t i = 0; i < dims; i++)
    qnorm += (double)q[i] * q[i];
  if (!(qnorm > 0) || !isfinite(qnorm))
    return CPH_OK;
  qnorm = sqrt(qnorm);

  cph_key prefix;
  cph_key_reset(&prefix);
  cph_key_str(&prefix, scope);
  if (prefix.overflow)
    return CPH_OK; /* a scope too long to be stored has no vectors */
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_VECTORS, &c);
  if (rc)
    return rc;
  size_t have = 0;
  cph_val key, val;
  for (rc = cph_cursor_seek(&c, &prefix, &key, &val); rc == CPH_OK;
       rc = cph_cursor_next(&c, &key, &val)) {
    if (key.len < prefix.len || memcmp(key.data, prefix.data, prefix.len) != 0)
      break; /* past the scope */
    if (key.len != prefix.len + 8) {
      rc = corrupt(t, &key, "the key does not end in an 8-byte memory id");
      break;
    }
    const uint8_t *p = val.data;
    if (val.len < 4 || (val.len - 4) % 4 != 0 || le32_get(p) != (val.len - 4) / 4) {
      rc = corrupt(t, &key, "the value is not u32 dims + dims float32");
      break;
    }
    if (le32_get(p) != dims)
      continue;
    double dot = 0, vnorm = 0;
    for (uint32_t i = 0; i < dims; i++) {
      double x = le_float_get(p + 4 + (size_t)i * 4);
      dot += x * q[i];
      vnorm += x * x;
    }
    if (!(vnorm > 0) || !isfinite(vnorm) || !isfinite(dot))
      continue;
    cph_vhit hit = {cph_be64_get((const uint8_t *)key.data + prefix.len),
                    (float)(dot / (sqrt(vnorm) * qnorm))};
    if (have < k) {
      out[have] = hit;
      sift_up(out, have++);
    } else if (worse(&out[0], &hit)) {
      out[0] = hit;
      sift_down(out, have, 0);
    }
  }
  cph_cursor_close(&c);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  if (have)
    qsort(out, have, sizeof *out, best_first);
  *n = have;
  return CPH_OK;
}

/* ---------------------------------------------------------------- HTTP index client */

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
