#define _GNU_SOURCE
/* Retrieval (DESIGN §7): GET /v1/memories/search. Hard filters: never a deleted memory, never
 * one whose embedding is deleted; a hit replaced by a summary is answered by that summary,
 * once. Every memory returned counts as an access (access_count, last_access) — which is why
 * search is an operation applied in a pass, not a read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "providers.h"

#define SCOPES_MAX 64

static cph_key u64_key(uint64_t v) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, v);
  return k;
}

static const char *memory_kind_name(uint8_t k) {
  static const char *const names[] = {"raw", "summary", "aggregate"};
  return k < 3 ? names[k] : "unknown";
}

/* The scopes a session may read: its own and its channels'. */
static size_t session_scopes(cph_txn *t, const char *id, char **out, size_t max) {
  size_t n = 0;
  out[n++] = strdup(id);
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, id);
  cph_session_rec r;
  if (cph_txn_get_record(t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r) != CPH_OK)
    return n;
  for (uint32_t i = 0; i < r.n_subscribe && n < max; i++)
    if (asprintf(&out[n], "#%s", r.subscribe[i]) >= 0)
      n++;
  for (uint32_t i = 0; i < r.n_member && n < max; i++)
    if (asprintf(&out[n], "#%s", r.member[i]) >= 0)
      n++;
  cph_record_free(&cph_session_desc, &r);
  return n;
}

static int hit_cmp(const void *a, const void *b) {
  const cph_vhit *x = a, *y = b;
  return x->score > y->score ? -1 : x->score < y->score;
}

void search_apply(cph_engine *e, cph_op *op) {
  const char *session = op->u.search.session;
  size_t k = op->u.search.k ? op->u.search.k : 10;
  if (k > 100)
    k = 100;
  if (!session || !engine_session(e, session)) {
    op_fail(op, CPH_ENOTFOUND, "session", "no session '%s'", session ? session : "");
    return;
  }
  if (!op->u.search.query || !*op->u.search.query) {
    op_fail(op, CPH_EINVAL, "q", "q: a query is required");
    return;
  }
  if (e->policy->providers.embeddings.kind != CPH_POLICY_PROVIDER_BUILTIN ||
      e->policy->vector_index.kind != CPH_POLICY_INDEX_EMBEDDED) {
    op_fail(op, CPH_ESTATE, NULL,
            "memory search needs the built-in embedder and the embedded index for now; an "
            "external provider or index is used by maintenance jobs only");
    return;
  }
  uint32_t dims = (uint32_t)e->policy->providers.embeddings.dimensions;
  float *q = calloc(dims, sizeof *q);
  size_t cap = k * 4; /* room for filtered hits and their substitutes */
  cph_vhit *hits = calloc(cap * SCOPES_MAX, sizeof *hits);
  char *scopes[SCOPES_MAX] = {0};
  op->u.search.hits = calloc(k, sizeof *op->u.search.hits);
  if (!q || !hits || !op->u.search.hits) {
    free(q);
    free(hits);
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
    return;
  }
  cph_embed_builtin(op->u.search.query, dims, q);

  cph_txn t;
  cph_txn_begin_child(&e->txn, &t);
  size_t n_scopes = session_scopes(&t, session, scopes, SCOPES_MAX);
  size_t n_hits = 0;
  for (size_t i = 0; i < n_scopes; i++) {
    size_t got = 0;
    if (scopes[i] && cph_vindex_search(&t, scopes[i], q, dims, cap, hits + n_hits, &got) == CPH_OK)
      n_hits += got;
  }
  qsort(hits, n_hits, sizeof *hits, hit_cmp);

  uint64_t *seen = calloc(n_hits ? n_hits * 2 : 1, sizeof *seen);
  size_t n_seen = 0;
  int64_t now = cph_wall_ms();
  for (size_t i = 0; i < n_hits && op->u.search.n_hits < k && seen; i++) {
    uint64_t id = hits[i].memory_id;
    cph_memory_rec m;
    cph_key mk = u64_key(id);
    if (cph_txn_get_record(&t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK)
      continue;
    /* A deleted memory never comes back; its summary stands in for it. */
    for (int hops = 0; (m.deleted || m.embed_status == CPH_EMBED_DELETED) && hops < 8; hops++) {
      uint64_t next = m.replaced_by;
      cph_record_free(&cph_memory_desc, &m);
      m.id = 0;
      if (!next)
        break;
      mk = u64_key(next);
      if (cph_txn_get_record(&t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK) {
        m.id = 0;
        break;
      }
    }
    if (!m.id)
      continue;
    bool dup = false;
    for (size_t j = 0; j < n_seen && !dup; j++)
      dup = seen[j] == m.id;
    if (dup || m.deleted || m.embed_status == CPH_EMBED_DELETED) {
      cph_record_free(&cph_memory_desc, &m);
      continue;
    }
    seen[n_seen++] = m.id;
    /* inclusion counts as an access (DESIGN §7) */
    m.access_count++;
    m.last_access_ms = now;
    cph_txn_put_record(&t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    cph_memory_hit *h = &op->u.search.hits[op->u.search.n_hits++];
    h->id = m.id;
    h->kind = strdup(memory_kind_name(m.kind));
    h->text = strdup(m.text);
    h->score = hits[i].score;
    h->session = strdup(m.session);
    h->created_ms = m.created_ms;
    cph_record_free(&cph_memory_desc, &m);
  }
  free(seen);
  for (size_t i = 0; i < n_scopes; i++)
    free(scopes[i]);
  free(hits);
  free(q);
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
}
