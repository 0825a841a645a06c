/* The embedded vector index, in LMDB (database "vectors"; core/providers.h). The HTTP index is
 * a network provider (providers/vindex_http.c), reached through the engine's cph_providers. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* ---------------------------------------------------------------- HTTP index (the table) */

static int no_index(cph_err *err) {
  return cph_err_set(err, CPH_ESTATE,
                     "vector index: :vector-index :kind :http is not available: the engine was "
                     "opened without network providers");
}

int cph_vindex_remote_upsert(const cph_providers *prov, const cph_policy_vector_index *cfg,
                             uint32_t shard, const cph_vitem *items, size_t n, cph_err *err) {
  if (!prov || !prov->index_upsert)
    return no_index(err);
  return prov->index_upsert(prov->ctx, cfg, shard, items, n, err);
}

int cph_vindex_remote_delete(const cph_providers *prov, const cph_policy_vector_index *cfg,
                             uint32_t shard, const char *model, const uint64_t *ids, size_t n,
                             bool *confirmed, cph_err *err) {
  for (size_t i = 0; i < n; i++) /* whatever the table does, nothing is confirmed by default */
    confirmed[i] = false;
  if (!prov || !prov->index_delete)
    return no_index(err);
  return prov->index_delete(prov->ctx, cfg, shard, model, ids, n, confirmed, err);
}

int cph_vindex_remote_search(const cph_providers *prov, const cph_policy_vector_index *cfg,
                             const char *scope, const float *q, uint32_t dims, size_t k,
                             cph_vhit *out, size_t *n, cph_err *err) {
  *n = 0;
  if (!prov || !prov->index_search)
    return no_index(err);
  return prov->index_search(prov->ctx, cfg, scope, q, dims, k, out, n, err);
}
