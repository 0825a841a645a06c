#define _GNU_SOURCE
/* Retrieval (DESIGN §7): GET /v1/memories/search.
 *
 * Hard filters: never a deleted memory, never one whose embedding is deleted, never one outside
 * the session's readable scopes (its own and its channels'); a vector hit replaced by a summary
 * is answered by that summary, once. Every memory returned counts as an access (access_count,
 * last_access) — which is why search is an operation applied in a pass, not a read.
 *
 * Two kinds of hits, merged:
 * - vector hits: cosine similarity of the query's embedding against the vector index, the best
 *   k * VECTOR_OVERFETCH of each scope. Their embedding is computed in the pass only for the
 *   built-in embedder with the embedded index (no network, microseconds); otherwise the caller
 *   ran cph_search_prepare on a thread of its own and hands the results in.
 * - lexical hits: the query's terms against the texts of each scope's newest memories, read
 *   through the scope index (memory_scope_prefix) newest first — at least the LEX_RECENT newest
 *   of each scope and class, and on down to the oldest memory still waiting for its embedding,
 *   at most LEX_WALK_MAX per scope and class and LEX_SCAN_MAX per search. So a memory is found
 *   as soon as the request that wrote it answered, while its embedding is queued, whatever the
 *   embedder; cost is bounded by those caps whatever the store holds (O(log n) seeks plus at
 *   most LEX_SCAN_MAX records), and with no embedding backlog it is LEX_RECENT per scope.
 *
 * Terms: runs of letters, digits and non-ASCII bytes, ASCII lower-cased, a plural 's' dropped
 * ("passwords" = "password"); the query's stop words ("the", "is", ...) are not terms unless the
 * query has nothing else. lexical = matched distinct query terms / distinct query terms, in
 * [0, 1].
 *
 * The merge rule (README "Memory search" says the same):
 * 1. Candidates are deduplicated by memory id (after summary substitution), keeping the best
 *    vector and lexical score each had.
 * 2. score = max(vector, lexical): both lie in [0, 1] with 1 a perfect match, and either kind of
 *    evidence suffices. A memory with no vector yet (queued) competes by its lexical score.
 * 3. Noise gate: the built-in embedder hashes words, so for it a vector hit that shares no query
 *    term is hash-collision noise and counts 0. An external (semantic) embedder's score counts
 *    as it is.
 * 4. Hits scoring <= 0 are never returned; a query that matches nothing answers no hit.
 * 5. Order: score, then vector score, then newer (higher id) first; the first k are returned. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "memory.h"
#include "ops.h"
#include "providers.h"
#include "search.h"
#include "sessions.h"

#define SCOPES_MAX 64
#define QUERY_TERMS_MAX 32
#define VECTOR_OVERFETCH 4 /* room for filtered hits and their substitutes */
#define LEX_RECENT 16      /* per scope and class: the newest are always read */
#define LEX_WALK_MAX 256   /* per scope and class: at most this many read */
#define LEX_SCAN_MAX 1024  /* per search: at most this many read over all scopes */
#define REPLACED_HOPS_MAX 8

static const char *memory_kind_name(uint8_t k) {
  static const char *const names[] = {"raw", "summary", "aggregate"};
  return k < 3 ? names[k] : "unknown";
}

static size_t clamp_k(size_t k) {
  return k == 0 ? CPH_SEARCH_K_DEFAULT : k > CPH_SEARCH_K_MAX ? CPH_SEARCH_K_MAX : k;
}

static bool memory_gone(const cph_memory_rec *m) {
  return m->deleted || m->embed_status == CPH_EMBED_DELETED;
}

/* ---------------------------------------------------------------- terms */

/* Word bytes as the built-in embedder reads them (core/embed.c): ASCII letters and digits and
 * every byte of a multi-byte UTF-8 sequence. */
static bool word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

static unsigned char fold(unsigned char c) {
  return c >= 'A' && c <= 'Z' ? (unsigned char)(c - 'A' + 'a') : c;
}

/* The next word of *p: its start and length; false at the end. */
static bool next_word(const char **p, const char **word, size_t *len) {
  const unsigned char *s = (const unsigned char *)*p;
  while (*s && !word_byte(*s))
    s++;
  if (!*s)
    return false;
  const unsigned char *start = s;
  while (*s && word_byte(*s))
    s++;
  *word = (const char *)start;
  *len = (size_t)(s - start);
  *p = (const char *)s;
  return true;
}

/* FNV-1a of the folded word, a plural 's' dropped (not from "ss" words, nor from words of
 * three letters or fewer: "bus", "gas", "its"). */
static uint64_t term_hash(const char *w, size_t len) {
  if (len > 3 && fold((unsigned char)w[len - 1]) == 's' && fold((unsigned char)w[len - 2]) != 's')
    len--;
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < len; i++)
    h = (h ^ fold((unsigned char)w[i])) * UINT64_C(0x100000001b3);
  return h;
}

static bool stop_word(const char *w, size_t len) {
  static const char *const words[] = {
      "a",    "about", "an",   "and",   "are",  "as",    "at",   "be",   "but",   "by",
      "can",  "do",    "does", "for",   "from", "had",   "has",  "have", "how",   "i",
      "if",   "in",    "into", "is",    "it",   "its",   "me",   "my",   "no",    "not",
      "of",   "on",    "or",   "our",   "so",   "than",  "that", "the",  "their", "them",
      "then", "there", "they", "this",  "to",   "was",   "we",   "were", "what",  "when",
      "where", "which", "who", "why",   "will", "with",  "you",  "your"};
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
    if (strlen(words[i]) == len && strncasecmp(words[i], w, len) == 0)
      return true;
  return false;
}

typedef struct qterms {
  uint64_t h[QUERY_TERMS_MAX];
  size_t n;
} qterms;

static void qterms_add(qterms *q, uint64_t h) {
  for (size_t i = 0; i < q->n; i++)
    if (q->h[i] == h)
      return;
  if (q->n < QUERY_TERMS_MAX)
    q->h[q->n++] = h;
}

/* The query's distinct terms (the first QUERY_TERMS_MAX), stop words left out unless the query
 * holds nothing else. */
static void query_terms(const char *query, qterms *out) {
  out->n = 0;
  const char *p = query, *w;
  size_t len;
  while (next_word(&p, &w, &len))
    if (!stop_word(w, len))
      qterms_add(out, term_hash(w, len));
  for (p = query; out->n == 0 && next_word(&p, &w, &len);)
    qterms_add(out, term_hash(w, len));
}

/* Matched distinct query terms / query terms, in [0, 1]. One pass over text. */
static float lexical_score(const qterms *q, const char *text) {
  if (!q->n || !text)
    return 0;
  uint64_t found = 0, all = q->n == 64 ? UINT64_MAX : (UINT64_C(1) << q->n) - 1;
  const char *p = text, *w;
  size_t len;
  while (found != all && next_word(&p, &w, &len)) {
    uint64_t h = term_hash(w, len);
    for (size_t i = 0; i < q->n; i++)
      if (q->h[i] == h)
        found |= UINT64_C(1) << i;
  }
  return (float)__builtin_popcountll(found) / (float)q->n;
}

/* ---------------------------------------------------------------- scopes */

/* The scopes a session may read: its own, its direct channel's and its channels' (at most
 * max). CPH_ENOTFOUND when the session has no record; the names are malloc'd. */
static int session_scopes(cph_txn *t, const char *id, char **out, size_t max, size_t *n_out) {
  size_t n = 0;
  *n_out = 0;
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, id);
  if (k.overflow)
    return CPH_ENOTFOUND;
  cph_session_rec r;
  int rc = cph_txn_get_record(t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  if (rc)
    return rc;
  if (!(out[n++] = strdup(id)))
    rc = CPH_ENOMEM;
  /* Its direct channel: events sent to the session alone mint their memories there (ingest.c
   * event_channel), and they are as much its own as the channels' (DESIGN §7). */
  if (rc == CPH_OK && asprintf(&out[n++], "%cdirect:%s", CPH_CHANNEL_SCOPE_PREFIX, id) < 0) {
    out[--n] = NULL;
    rc = CPH_ENOMEM;
  }
  for (uint32_t i = 0; rc == CPH_OK && i < r.n_subscribe && n < max; i++)
    if (asprintf(&out[n++], "%c%s", CPH_CHANNEL_SCOPE_PREFIX, r.subscribe[i]) < 0) {
      out[--n] = NULL;
      rc = CPH_ENOMEM;
    }
  for (uint32_t i = 0; rc == CPH_OK && i < r.n_member && n < max; i++)
    if (asprintf(&out[n++], "%c%s", CPH_CHANNEL_SCOPE_PREFIX, r.member[i]) < 0) {
      out[--n] = NULL;
      rc = CPH_ENOMEM;
    }
  cph_record_free(&cph_session_desc, &r);
  *n_out = n;
  return rc;
}

static bool scope_readable(const char *scope, char *const *scopes, size_t n) {
  for (size_t i = 0; scope && i < n; i++)
    if (strcmp(scope, scopes[i]) == 0)
      return true;
  return false;
}

void cph_strv_free(cph_strv *v) {
  for (size_t i = 0; v && i < v->count; i++)
    free(v->items[i]);
  if (v) {
    free(v->items);
    v->items = NULL;
    v->count = 0;
  }
}

int search_memory_scopes(cph_store *store, const char *session, cph_strv *out, cph_err *err) {
  out->items = calloc(SCOPES_MAX, sizeof *out->items);
  out->count = 0;
  if (!out->items)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  rc = session_scopes(&t, session ? session : "", out->items, SCOPES_MAX, &out->count);
  cph_txn_abort(&t);
  if (rc == CPH_ENOTFOUND)
    return cph_err_set(err, rc, "no session '%s'", session ? session : "");
  if (rc)
    return cph_err_set(err, rc, "reading session '%s': %s", session ? session : "",
                       t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  return CPH_OK;
}

/* ---------------------------------------------------------------- preparing (off the pass) */

bool cph_search_needs_prepare(const cph_policy *p) {
  return p->providers.embeddings.kind != CPH_POLICY_PROVIDER_BUILTIN ||
         p->vector_index.kind != CPH_POLICY_INDEX_EMBEDDED;
}

static void prep_degrade(cph_search_prep *out, const char *why) {
  out->degraded = true;
  snprintf(out->error, sizeof out->error, "%.255s", why);
}

void cph_search_prepare(const cph_policy *p, const cph_providers *providers,
                        const char *query, const char *const *scopes, size_t n_scopes, size_t k,
                        cph_search_prep *out) {
  memset(out, 0, sizeof *out);
  uint32_t dims = (uint32_t)p->providers.embeddings.dimensions;
  float *q = calloc(dims ? dims : 1, sizeof *q);
  if (!q) {
    prep_degrade(out, "out of memory");
    return;
  }
  cph_err err = {0};
  int rc = CPH_OK;
  if (p->providers.embeddings.kind == CPH_POLICY_PROVIDER_BUILTIN)
    cph_embed_builtin(query, dims, q);
  else
    rc = cph_embed_remote(providers, &p->providers.embeddings, &query, 1, q, &err);
  if (rc) {
    free(q);
    prep_degrade(out, err.msg[0] ? err.msg : cph_strerror(rc));
    return;
  }
  out->query_vector = q;
  out->dims = dims;
  if (p->vector_index.kind != CPH_POLICY_INDEX_HTTP || !n_scopes)
    return;
  size_t want = clamp_k(k) * VECTOR_OVERFETCH;
  if (!(out->index_hits = calloc(n_scopes * want, sizeof *out->index_hits))) {
    prep_degrade(out, "out of memory");
    return;
  }
  /* One call per scope (the index searches one scope at a time); the first failure stops the
   * rest, so a hung index costs one :timeout-ms, not one per scope. */
  for (size_t i = 0; i < n_scopes; i++) {
    size_t got = 0;
    rc = cph_vindex_remote_search(providers, &p->vector_index, scopes[i], q, dims, want,
                                  out->index_hits + out->n_index_hits, &got, &err);
    if (rc) {
      prep_degrade(out, err.msg[0] ? err.msg : cph_strerror(rc));
      return;
    }
    out->n_index_hits += got;
  }
}

void cph_search_prep_free(cph_search_prep *prep) {
  if (!prep)
    return;
  free(prep->query_vector);
  free(prep->index_hits);
  memset(prep, 0, sizeof *prep);
}

/* ---------------------------------------------------------------- candidates */

typedef struct cand {
  uint64_t id; /* the live memory answered (a summary standing in for its source) */
  float vec;   /* best vector score, when has_vec */
  float lex;   /* lexical score, [0, 1] */
  float score; /* by the merge rule */
  bool has_vec;
} cand;

typedef struct cands {
  cand *v;
  size_t n, cap;
} cands;

static int cands_push(cands *c, cand x) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    cand *p = realloc(c->v, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    c->v = p;
    c->cap = cap;
  }
  c->v[c->n++] = x;
  return CPH_OK;
}

static int by_id(const void *a, const void *b) {
  const cand *x = a, *y = b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Best first: score, then vector score, then the newer memory. */
static int best_first(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->score != y->score)
    return x->score > y->score ? -1 : 1;
  float xv = x->has_vec ? x->vec : 0, yv = y->has_vec ? y->vec : 0;
  if (xv != yv)
    return xv > yv ? -1 : 1;
  return x->id > y->id ? -1 : x->id < y->id;
}

typedef struct search_ctx {
  cph_txn *t;
  char **scopes;
  size_t n_scopes;
  qterms q;
  cands c;
} search_ctx;

/* Reads memory id (memory_read: an undecodable one is skipped, not a failure). */
static int read_memory(cph_txn *t, uint64_t id, cph_memory_rec *m) {
  return memory_read(t, id, m, "memory search");
}

/* The live memory for a vector hit on id: itself, or the summary its replaced_by chain leads
 * to; CPH_ENOTFOUND when there is none (or it lies outside the readable scopes). */
static int live_memory(search_ctx *s, uint64_t id, cph_memory_rec *m) {
  for (int hops = 0; id && hops < REPLACED_HOPS_MAX; hops++) {
    int rc = read_memory(s->t, id, m);
    if (rc)
      return rc;
    if (!memory_gone(m)) {
      if (scope_readable(m->session, s->scopes, s->n_scopes))
        return CPH_OK;
      cph_record_free(&cph_memory_desc, m);
      return CPH_ENOTFOUND;
    }
    id = m->replaced_by;
    cph_record_free(&cph_memory_desc, m);
  }
  return CPH_ENOTFOUND;
}

static int add_vector_hits(search_ctx *s, const cph_vhit *hits, size_t n) {
  for (size_t i = 0; i < n; i++) {
    cph_memory_rec m;
    int rc = live_memory(s, hits[i].memory_id, &m);
    if (rc == CPH_ENOTFOUND)
      continue;
    if (rc)
      return rc;
    float v = isfinite(hits[i].score) ? hits[i].score : 0;
    rc = cands_push(&s->c, (cand){m.id, v, lexical_score(&s->q, m.text), 0, true});
    cph_record_free(&cph_memory_desc, &m);
    if (rc)
      return rc;
  }
  return CPH_OK;
}

/* One scope's memories of one class, newest first, through the scope index: the LEX_RECENT
 * newest, then on while they are not older than the oldest queued embedding, within the
 * caps. Gone memories are skipped (their summaries are newer, and read on their own). */
static int lexical_walk(search_ctx *s, const char *scope, bool raw, uint64_t pending_from,
                        size_t *budget) {
  memory_scope_cursor c; /* a scope too long to be stored has no memories: id 0 */
  int rc = memory_scope_open(s->t, scope, raw, &c);
  if (rc)
    return rc;
  rc = memory_scope_newest(&c);
  for (size_t read = 0; rc == CPH_OK && c.id && *budget > 0 && read < LEX_WALK_MAX;
       rc = memory_scope_older(&c)) {
    uint64_t id = c.id;
    if (read >= LEX_RECENT && id < pending_from)
      break;
    read++;
    (*budget)--;
    cph_memory_rec m;
    int grc = read_memory(s->t, id, &m);
    if (grc == CPH_ENOTFOUND)
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    float lex = memory_gone(&m) ? 0 : lexical_score(&s->q, m.text);
    cph_record_free(&cph_memory_desc, &m);
    if (lex > 0 && (rc = cands_push(&s->c, (cand){id, 0, lex, 0, false})) != CPH_OK)
      break;
  }
  memory_scope_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* Dedupes by id (best of each score), applies the merge rule, drops hits <= 0, sorts. */
static void merge(search_ctx *s, bool builtin_embedder) {
  cands *c = &s->c;
  if (!c->n)
    return;
  qsort(c->v, c->n, sizeof *c->v, by_id);
  size_t n = 0;
  for (size_t i = 0; i < c->n; i++) {
    cand *x = &c->v[i];
    if (n && c->v[n - 1].id == x->id) {
      cand *y = &c->v[n - 1];
      if (x->has_vec && (!y->has_vec || x->vec > y->vec))
        y->vec = x->vec;
      y->has_vec |= x->has_vec;
      if (x->lex > y->lex)
        y->lex = x->lex;
      continue;
    }
    c->v[n++] = *x;
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    cand x = c->v[i];
    float v = x.has_vec ? x.vec : 0;
    if (builtin_embedder && x.lex <= 0)
      v = 0; /* hash-collision noise (rule 3) */
    if (v > 1)
      v = 1;
    x.score = v > x.lex ? v : x.lex;
    if (x.score > 0)
      c->v[kept++] = x;
  }
  c->n = kept;
  qsort(c->v, c->n, sizeof *c->v, best_first);
}

/* ---------------------------------------------------------------- the op */

/* The vector hits of the embedded index for query vector q, over every scope. */
static int embedded_vector_hits(search_ctx *s, const float *q, uint32_t dims, size_t want) {
  cph_vhit *hits = calloc(want, sizeof *hits);
  if (!hits)
    return CPH_ENOMEM;
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < s->n_scopes; i++) {
    size_t got = 0;
    rc = cph_vindex_search(s->t, s->scopes[i], q, dims, want, hits, &got);
    if (rc == CPH_OK)
      rc = add_vector_hits(s, hits, got);
  }
  free(hits);
  return rc;
}

/* Fills op's hits from the first k candidates (search_apply counts each as an access once the
 * search's reads are in). */
static int answer(search_ctx *s, cph_op *op, size_t k) {
  size_t n = s->c.n < k ? s->c.n : k;
  op->u.search.hits = calloc(n ? n : 1, sizeof *op->u.search.hits);
  if (!op->u.search.hits)
    return CPH_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    cph_key mk = cph_key_of_u64(s->c.v[i].id);
    cph_memory_rec m;
    int rc = cph_txn_get_record(s->t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (rc)
      return rc;
    cph_memory_hit *h = &op->u.search.hits[op->u.search.n_hits++];
    h->id = m.id;
    h->kind = strdup(memory_kind_name(m.kind));
    h->text = strdup(m.text ? m.text : "");
    h->score = s->c.v[i].score;
    h->session = strdup(m.session ? m.session : "");
    h->created_ms = m.created_ms;
    cph_record_free(&cph_memory_desc, &m);
    if (rc)
      return rc;
    if (!h->kind || !h->text || !h->session)
      return CPH_ENOMEM;
  }
  return CPH_OK;
}

void search_apply(cph_core_env *env, const cph_sessions *ss, cph_memory *memory, cph_op *op) {
  const char *session = op->u.search.session;
  size_t k = clamp_k(op->u.search.k);
  if (!session || !sessions_get(ss, session)) {
    op_fail(op, CPH_ENOTFOUND, "session", "no session '%s'", session ? session : "");
    return;
  }
  if (!op->u.search.query || !*op->u.search.query) {
    op_fail(op, CPH_EINVAL, "q", "q: a query is required");
    return;
  }
  const cph_policy *p = env->policy;
  uint32_t dims = (uint32_t)p->providers.embeddings.dimensions;
  bool builtin = p->providers.embeddings.kind == CPH_POLICY_PROVIDER_BUILTIN;
  bool embedded = p->vector_index.kind == CPH_POLICY_INDEX_EMBEDDED;
  /* A prepared vector of another width (the policy was reloaded meanwhile) is not used. */
  const float *given = op->u.search.query_vector && op->u.search.dims == dims
                           ? op->u.search.query_vector
                           : NULL;

  cph_txn t;
  cph_txn_begin_child(&env->txn, &t);
  char *scopes[SCOPES_MAX] = {0};
  search_ctx s = {.t = &t, .scopes = scopes};
  float *own = NULL;
  bool vectors = false;
  int rc = session_scopes(&t, session, scopes, SCOPES_MAX, &s.n_scopes);
  if (rc == CPH_ENOTFOUND && !t.ret) {
    cph_txn_abort(&t);
    op_fail(op, CPH_ENOTFOUND, "session", "no session '%s'", session);
    return;
  }
  query_terms(op->u.search.query, &s.q);

  if (rc == CPH_OK && embedded) {
    const float *q = given;
    if (!q && builtin && (own = calloc(dims ? dims : 1, sizeof *own)) != NULL) {
      cph_embed_builtin(op->u.search.query, dims, own);
      q = own;
    }
    if (q) {
      vectors = true;
      rc = embedded_vector_hits(&s, q, dims, k * VECTOR_OVERFETCH);
    }
  } else if (rc == CPH_OK && given) { /* the HTTP index answered cph_search_prepare */
    vectors = true;
    rc = add_vector_hits(&s, op->u.search.index_hits, op->u.search.n_index_hits);
  }

  uint64_t pending_from = rc == CPH_OK ? memory_embed_oldest(&t) : UINT64_MAX;
  size_t budget = LEX_SCAN_MAX;
  for (size_t i = 0; rc == CPH_OK && i < s.n_scopes; i++) {
    rc = lexical_walk(&s, scopes[i], true, pending_from, &budget);
    if (rc == CPH_OK)
      rc = lexical_walk(&s, scopes[i], false, pending_from, &budget);
  }
  if (rc == CPH_OK) {
    merge(&s, builtin);
    rc = answer(&s, op, k);
  }
  op->u.search.degraded = op->u.search.degraded || !vectors;

  free(own);
  free(s.c.v);
  for (size_t i = 0; i < s.n_scopes; i++)
    free(scopes[i]);
  if (rc && !t.ret) { /* out of memory, say: nothing of this op is kept */
    cph_txn_abort(&t);
    op_fail(op, rc, NULL, "memory search: %s", cph_strerror(rc));
    return;
  }
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
  /* Every hit returned counts as an access (DESIGN §7), written with the next flush. */
  int64_t now = cph_wall_ms();
  for (size_t i = 0; i < op->u.search.n_hits; i++)
    if (memaccess_note(&memory->access, op->u.search.hits[i].id, now) != CPH_OK)
      cph_log(CPH_LOG_WARN, "memory search: out of memory counting an access to memory %llu",
              (unsigned long long)op->u.search.hits[i].id);
}
