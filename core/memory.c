/* Memories (DESIGN §7): minting, and the embed queue they join. Retrieval is in search.c. */
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "memory.h"
#include "origins.h"

static uint32_t tokens_estimate(const char *text) {
  size_t n = strlen(text);
  size_t t = (n + 3) / 4; /* ceil(bytes/4), DESIGN §6 */
  return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

/* ---------------------------------------------------------------- the embed queue's rows */

/* Writes the range first..last as one row (memory.h). */
static int embed_row_put(cph_txn *t, uint64_t first, uint64_t last, bool append) {
  cph_key k = cph_key_of_u64(first);
  uint8_t v[8];
  cph_be64_put(v, last);
  size_t len = last > first ? sizeof v : 0;
  return append ? cph_txn_append(t, CPH_DB_EMBED_QUEUE, &k, v, len)
                : cph_txn_put(t, CPH_DB_EMBED_QUEUE, &k, v, len);
}

/* A row's range; false for a row of neither form (it is skipped, and taken out by no one). */
static bool embed_row(const cph_val *k, const cph_val *v, uint64_t *first, uint64_t *last) {
  if (k->len != 8 || (v->len != 0 && v->len != 8))
    return false;
  *first = cph_be64_get(k->data);
  *last = v->len ? cph_be64_get(v->data) : *first;
  return *last >= *first;
}

/* Queues id under a request's batch: it extends the held range when it follows it, else the
 * held range is written (ids ascend: it sorts after every row) and id starts the next one. */
static int embed_hold(cph_memory *m, cph_txn *t, uint64_t id) {
  if (m->embed_last && id == m->embed_last + 1) {
    m->embed_last = id;
    return CPH_OK;
  }
  int rc = m->embed_last ? embed_row_put(t, m->embed_first, m->embed_last, true) : CPH_OK;
  m->embed_first = m->embed_last = id;
  return rc;
}

int memory_embed_unqueue(cph_txn *t, uint64_t id) {
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_EMBED_QUEUE, &c);
  if (rc)
    return rc;
  cph_key k = cph_key_of_u64(id);
  cph_val rk, rv;
  rc = cph_cursor_seek(&c, &k, &rk, &rv); /* the row at id, else the one before holds it */
  if ((rc == CPH_OK && !(rk.len == 8 && cph_be64_get(rk.data) == id)) || rc == CPH_ENOTFOUND)
    rc = cph_cursor_prev(&c, &rk, &rv);
  uint64_t first = 0, last = 0;
  if (rc == CPH_OK && !(embed_row(&rk, &rv, &first, &last) && first <= id && id <= last))
    rc = CPH_ENOTFOUND;
  cph_cursor_close(&c);
  if (rc)
    return rc;
  k = cph_key_of_u64(first);
  rc = cph_txn_del(t, CPH_DB_EMBED_QUEUE, &k);
  if (rc == CPH_OK && first < id)
    rc = embed_row_put(t, first, id - 1, false);
  if (rc == CPH_OK && id < last)
    rc = embed_row_put(t, id + 1, last, false);
  return rc;
}

int memory_embed_pending(cph_txn *t, uint64_t *ids, size_t max, size_t *n) {
  *n = 0;
  cph_cursor c;
  cph_val k, v;
  int rc = cph_cursor_open(t, CPH_DB_EMBED_QUEUE, &c);
  if (rc)
    return rc;
  for (rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK && *n < max;
       rc = cph_cursor_next(&c, &k, &v)) {
    uint64_t first, last;
    if (!embed_row(&k, &v, &first, &last))
      continue;
    for (uint64_t id = first; *n < max; id++) {
      ids[(*n)++] = id;
      if (id == last)
        break;
    }
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

uint64_t memory_embed_oldest(cph_txn *t) {
  uint64_t id = UINT64_MAX;
  size_t n;
  return memory_embed_pending(t, &id, 1, &n) == CPH_OK && n ? id : UINT64_MAX;
}

int memory_embed_count(cph_txn *t, uint64_t *n) {
  *n = 0;
  cph_cursor c;
  cph_val k, v;
  int rc = cph_cursor_open(t, CPH_DB_EMBED_QUEUE, &c);
  if (rc)
    return rc;
  for (rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    uint64_t first, last;
    if (embed_row(&k, &v, &first, &last))
      *n += last - first + 1;
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* ---------------------------------------------------------------- a request's index rows */

/* Holds (scope, raw, id, source) for memory_batch_flush. CPH_ENOMEM: not held. */
static int held_add(cph_memory *m, const char *scope, bool raw, uint64_t id, uint64_t source) {
  if (m->n_held == m->cap_held) {
    size_t cap = m->cap_held ? m->cap_held * 2 : 256;
    memory_held *p = realloc(m->held, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    m->held = p;
    m->cap_held = cap;
  }
  /* the previous entry's scope, usually the same, else a copy at the arena's end */
  bool same = m->n_held && strcmp(m->scopes + m->held[m->n_held - 1].scope_at, scope) == 0;
  size_t at = same ? m->held[m->n_held - 1].scope_at : m->scopes_len;
  if (!same) {
    size_t len = strlen(scope) + 1;
    if (m->scopes_len + len > m->scopes_cap) {
      size_t cap = m->scopes_cap ? m->scopes_cap * 2 : 4096;
      while (cap < m->scopes_len + len)
        cap *= 2;
      char *p = realloc(m->scopes, cap);
      if (!p)
        return CPH_ENOMEM;
      m->scopes = p;
      m->scopes_cap = cap;
    }
    memcpy(m->scopes + m->scopes_len, scope, len);
    m->scopes_len += len;
  }
  m->held[m->n_held++] = (memory_held){at, NULL, raw, id, source};
  return CPH_OK;
}

void memory_batch_begin(cph_memory *m, int64_t now_ms) {
  m->batch_ms = now_ms;
  m->n_held = m->scopes_len = 0;
  m->embed_first = m->embed_last = 0;
  m->batching = true;
}

void memory_batch_forget(cph_memory *m) {
  m->n_held = m->scopes_len = 0;
  m->embed_first = m->embed_last = 0;
  m->batching = false;
}

void memory_free(cph_memory *m) {
  memcache_clear(&m->cache);
  free(m->held);
  free(m->scopes);
  m->held = NULL;
  m->scopes = NULL;
  m->n_held = m->cap_held = m->scopes_len = m->scopes_cap = 0;
  m->batching = false;
}

/* By scope, class, then id: a row's entries together, ascending. */
static int held_cmp(const void *a, const void *b) {
  const memory_held *x = a, *y = b;
  int c = x->scope == y->scope ? 0 : strcmp(x->scope, y->scope); /* often one arena copy */
  if (c)
    return c;
  if (x->raw != y->raw)
    return x->raw ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

#define ROW_STACK 64 /* entries of a row encoded without a malloc */

int memory_batch_flush(cph_memory *m, cph_txn *t) {
  if (!m->batching)
    return t->ret;
  m->batching = false;
  int rc = m->embed_last ? embed_row_put(t, m->embed_first, m->embed_last, true) : t->ret;
  m->embed_first = m->embed_last = 0;
  bool sorted = true; /* one scope and class, as a request on one channel mints: in order */
  for (size_t i = 0; i < m->n_held; i++) {
    m->held[i].scope = m->scopes + m->held[i].scope_at;
    sorted = sorted && (i == 0 || held_cmp(&m->held[i - 1], &m->held[i]) < 0);
  }
  if (!sorted)
    qsort(m->held, m->n_held, sizeof *m->held, held_cmp);
  uint8_t stack[8 + 16 * ROW_STACK];
  for (size_t i = 0, j; i < m->n_held && rc == CPH_OK; i = j) {
    const memory_held *h = &m->held[i];
    for (j = i + 1; j < m->n_held && m->held[j].raw == h->raw &&
                    !strcmp(m->held[j].scope, h->scope);
         j++)
      ;
    size_t len = 8 + 16 * (j - i - 1);
    uint8_t *v = len <= sizeof stack ? stack : malloc(len);
    if (!v) {
      rc = CPH_ENOMEM;
      break;
    }
    cph_be64_put(v, h->source);
    for (size_t e = i + 1; e < j; e++) {
      cph_be64_put(v + 8 + 16 * (e - i - 1), m->held[e].id);
      cph_be64_put(v + 16 + 16 * (e - i - 1), m->held[e].source);
    }
    cph_key sk;
    memory_scope_prefix(&sk, h->scope, h->raw);
    cph_key_u64(&sk, h->id);
    rc = cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &sk, v, len);
    if (v != stack)
      free(v);
  }
  m->n_held = m->scopes_len = 0;
  return rc;
}

/* ---------------------------------------------------------------- reading the index */

int memory_scope_open(cph_txn *t, const char *scope, bool raw, memory_scope_cursor *sc) {
  memset(sc, 0, sizeof *sc);
  memory_scope_prefix(&sc->prefix, scope, raw);
  return cph_cursor_open(t, CPH_DB_MEMORY_SCOPES, &sc->cur);
}

void memory_scope_close(memory_scope_cursor *sc) {
  cph_cursor_close(&sc->cur);
  free(sc->row);
  sc->row = NULL;
  sc->row_cap = 0;
}

/* Entry `at` of the row under the cursor into id, source. */
static void scope_entry(memory_scope_cursor *sc, size_t at) {
  sc->at = at;
  if (at == 0) {
    sc->id = sc->first;
    sc->source = sc->source0;
    return;
  }
  sc->id = cph_be64_get(sc->row + 16 * (at - 1));
  sc->source = cph_be64_get(sc->row + 8 + 16 * (at - 1));
}

/* Takes the row the cursor answered (rc, k, v): its entries, the cursor at its first
 * (newest: false) or last. A row outside the scope's class, or no row: id 0. */
static int scope_row(memory_scope_cursor *sc, int rc, const cph_val *k, const cph_val *v,
                     bool newest) {
  sc->id = sc->source = 0;
  sc->n = sc->at = 0;
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  if (k->len != sc->prefix.len + 8 || memcmp(k->data, sc->prefix.data, sc->prefix.len) != 0)
    return CPH_OK;
  sc->first = cph_be64_get((const uint8_t *)k->data + sc->prefix.len);
  sc->source0 = 0;
  sc->n = 1;
  if (v->len >= 8 && (v->len - 8) % 16 == 0) { /* else an index value of an old shape */
    sc->source0 = cph_be64_get(v->data);
    size_t more = v->len - 8;
    if (more > sc->row_cap) {
      uint8_t *p = realloc(sc->row, more);
      if (!p)
        return CPH_ENOMEM;
      sc->row = p;
      sc->row_cap = more;
    }
    if (more)
      memcpy(sc->row, (const uint8_t *)v->data + 8, more);
    sc->n += more / 16;
  }
  scope_entry(sc, newest ? sc->n - 1 : 0);
  return CPH_OK;
}

int memory_scope_newest(memory_scope_cursor *sc) {
  cph_key end = sc->prefix;
  cph_key_u64(&end, UINT64_MAX);
  if (end.overflow) { /* a scope too long to be stored has no memories */
    sc->id = 0;
    return CPH_OK;
  }
  cph_val k, v;
  int rc = cph_cursor_seek(&sc->cur, &end, &k, &v);
  rc = rc == CPH_OK         ? cph_cursor_prev(&sc->cur, &k, &v)
       : rc == CPH_ENOTFOUND ? cph_cursor_last(&sc->cur, &k, &v)
                             : rc;
  return scope_row(sc, rc, &k, &v, true);
}

int memory_scope_oldest(memory_scope_cursor *sc) {
  cph_val k, v;
  int rc = cph_cursor_seek(&sc->cur, &sc->prefix, &k, &v);
  return scope_row(sc, rc, &k, &v, false);
}

int memory_scope_older(memory_scope_cursor *sc) {
  if (!sc->id)
    return CPH_OK;
  if (sc->at > 0) {
    scope_entry(sc, sc->at - 1);
    return CPH_OK;
  }
  cph_val k, v;
  int rc = cph_cursor_prev(&sc->cur, &k, &v);
  return scope_row(sc, rc, &k, &v, true);
}

int memory_scope_newer(memory_scope_cursor *sc) {
  if (!sc->id)
    return CPH_OK;
  if (sc->at + 1 < sc->n) {
    scope_entry(sc, sc->at + 1);
    return CPH_OK;
  }
  cph_val k, v;
  int rc = cph_cursor_next(&sc->cur, &k, &v);
  return scope_row(sc, rc, &k, &v, false);
}

/* ---------------------------------------------------------------- minting */

/* Stores m (its id set here, its embedding queued with embed) and indexes it by scope. */
static int mint_record(cph_memory *mem, cph_txn *t, cph_memory_rec m, bool embed,
                       uint64_t *id_out) {
  uint64_t id = 0;
  int rc = cph_txn_next_id(t, "memory", &id);
  if (rc)
    return rc;
  memcache_minted(&mem->cache, id); /* a rollback gives the id to another memory */
  const char *scope = m.session;
  uint64_t source_event_id = m.source_event_id;
  uint8_t kind = m.kind;
  m.id = id;
  m.embed_status = embed ? CPH_EMBED_PENDING : CPH_EMBED_NONE;
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  rc = cph_txn_append_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m); /* ids ascend */
  if (rc == CPH_OK && !(mem->batching && held_add(mem, scope, kind == CPH_MEMORY_RAW, id,
                                                    source_event_id) == CPH_OK)) {
    /* turns read their scopes' memories through this index (context.c) */
    cph_key sk;
    memory_scope_prefix(&sk, scope, kind == CPH_MEMORY_RAW);
    cph_key_u64(&sk, id);
    uint8_t source[8];
    cph_be64_put(source, source_event_id);
    rc = cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &sk, source, sizeof source);
  }
  if (rc == CPH_OK && embed) {
    rc = mem->batching ? embed_hold(mem, t, id) : embed_row_put(t, id, id, true);
    if (rc == CPH_OK)
      mem->embed_queue_len++; /* recounted from the database at open */
  }
  if (rc == CPH_OK && id_out)
    *id_out = id;
  return rc;
}

int memory_mint(cph_memory *mem, cph_txn *t, const char *scope, uint8_t kind, const char *text,
                uint64_t source_event_id, bool embed, uint64_t *id_out) {
  cph_memory_rec m = {0};
  m.session = (char *)scope;
  m.kind = kind;
  m.text = (char *)text;
  m.tokens_est = tokens_estimate(text);
  m.created_ms = mem->batching ? mem->batch_ms : cph_wall_ms();
  m.source_event_id = source_event_id;
  return mint_record(mem, t, m, embed, id_out);
}

/* The FNV-1a hash of a memory's scope, creation time and text: an origin's last 16 digits. */
static uint64_t origin_hash(const cph_memory_rec *m) {
  uint64_t h = 14695981039346656037ull;
  uint8_t ms[8];
  cph_be64_put(ms, (uint64_t)m->created_ms);
  for (const char *p = m->session ? m->session : "";; p++) {
    h = (h ^ (uint8_t)*p) * 1099511628211ull;
    if (!*p)
      break;
  }
  for (int i = 0; i < 8; i++)
    h = (h ^ ms[i]) * 1099511628211ull;
  for (const char *p = m->text ? m->text : ""; *p; p++)
    h = (h ^ (uint8_t)*p) * 1099511628211ull;
  return h;
}

void memory_origin(char *buf, const char *node, const cph_memory_rec *m) {
  snprintf(buf, MEMORY_ORIGIN_MAX, "%.*s/%" PRIu64 "/%016" PRIx64, ORIGINS_NODE_MAX, node, m->id,
           origin_hash(m));
}

/* The key of memory id's row in memory_origins that names the origin it was imported with:
 * 0xFF (no origin starts with it: origins are text) and the id. */
static cph_key origin_of_key(uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_byte(&k, 0xFF);
  cph_key_u64(&k, id);
  return k;
}

/* The key of memory id's row in memory_origins that names the origin it was minted under
 * (memory_note_origin): 0xFE and the id — apart from the adopted ones' (memory_adopted_from
 * walks those). */
static cph_key origin_minted_key(uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_byte(&k, 0xFE);
  cph_key_u64(&k, id);
  return k;
}

bool memory_is_adopted(cph_txn *t, uint64_t id) {
  cph_key k = origin_of_key(id);
  cph_val v;
  return cph_txn_get(t, CPH_DB_MEMORY_ORIGINS, &k, &v) == CPH_OK;
}

/* Whether a stored origin is one this build's copies of the memory carry: not an event's of
 * the form before the time led (MEMORY_EVENT_ORIGIN_V1_LEN), which no copy carries now. */
static bool origin_current(const cph_val *v) {
  return !(v->len == MEMORY_EVENT_ORIGIN_V1_LEN && memcmp(v->data, "e:", 2) == 0);
}

bool memory_has_origin(cph_txn *t, uint64_t id) {
  cph_key k = origin_of_key(id);
  cph_val v;
  if (cph_txn_get(t, CPH_DB_MEMORY_ORIGINS, &k, &v) == CPH_OK)
    return origin_current(&v);
  k = origin_minted_key(id);
  return cph_txn_get(t, CPH_DB_MEMORY_ORIGINS, &k, &v) == CPH_OK && origin_current(&v);
}

void memory_event_origin(const char *scope, const char *sender, int64_t ts_ms, const char *text,
                         char *out) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  char ts[24];
  int tl = snprintf(ts, sizeof ts, "%" PRId64, ts_ms);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  /* each part with its terminating NUL, so no two splits of the same bytes meet */
  bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
            EVP_DigestUpdate(ctx, scope, strlen(scope) + 1) &&
            EVP_DigestUpdate(ctx, sender, strlen(sender) + 1) &&
            EVP_DigestUpdate(ctx, ts, (size_t)tl + 1) &&
            EVP_DigestUpdate(ctx, text, strlen(text)) && EVP_DigestFinal_ex(ctx, md, &len) &&
            len == 32;
  EVP_MD_CTX_free(ctx);
  if (!ok)
    memset(md, 0, 32); /* cannot happen with a working libcrypto; the origin is still one */
  /* by hand, not snprintf: every event of the cluster log computes one (ingest.c) */
  static const char hex[] = "0123456789abcdef";
  out[0] = 'e';
  out[1] = ':';
  for (unsigned i = 0; i < 16; i++) /* the time, most significant digit first */
    out[2 + i] = hex[((uint64_t)ts_ms >> (60 - 4 * i)) & 15];
  char *h = out + MEMORY_EVENT_ORIGIN_HASH_AT;
  for (unsigned i = 0; i < 32; i++) {
    h[2 * i] = hex[md[i] >> 4];
    h[2 * i + 1] = hex[md[i] & 15];
  }
  out[MEMORY_EVENT_ORIGIN_LEN] = '\0';
}

int memory_note_origin(cph_txn *t, uint64_t id, const char *origin) {
  int rc = origins_put(t, CPH_DB_MEMORY_ORIGINS, origin, id);
  cph_key k = origin_minted_key(id);
  return rc ? rc : cph_txn_put(t, CPH_DB_MEMORY_ORIGINS, &k, origin, strlen(origin));
}

int memory_adopted_from(cph_txn *t, uint64_t from, int (*fn)(void *ctx, uint64_t id), void *ctx) {
  cph_key k = origin_of_key(from);
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_MEMORY_ORIGINS, &c);
  if (rc)
    return rc;
  cph_val key;
  for (rc = cph_cursor_seek(&c, &k, &key, NULL); rc == CPH_OK;
       rc = cph_cursor_next(&c, &key, NULL)) {
    const uint8_t *p = key.data;
    if (key.len != 9 || p[0] != 0xFF)
      break;
    rc = fn(ctx, cph_be64_get(p + 1));
    if (rc)
      break;
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int memory_origin_of(cph_txn *t, const char *node, const cph_memory_rec *m, char *buf) {
  cph_key k = origin_of_key(m->id);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_MEMORY_ORIGINS, &k, &v);
  if (rc == CPH_ENOTFOUND) { /* minted here under an event's origin? */
    k = origin_minted_key(m->id);
    rc = cph_txn_get(t, CPH_DB_MEMORY_ORIGINS, &k, &v);
  }
  if (rc == CPH_ENOTFOUND) {
    memory_origin(buf, node, m);
    return CPH_OK;
  }
  if (rc)
    return rc;
  snprintf(buf, MEMORY_ORIGIN_MAX, "%.*s", (int)(v.len < MEMORY_ORIGIN_MAX ? v.len : 0),
           (const char *)v.data);
  return CPH_OK;
}

int memory_find_origin(cph_txn *t, const char *node, const char *origin, uint64_t *id) {
  bool held = false;
  *id = 0;
  int rc = origins_find(t, CPH_DB_MEMORY_ORIGINS, origin, &held, id);
  uint64_t own = rc == CPH_OK && !held ? origins_own_id(node, origin) : 0;
  if (!own)
    return rc;
  /* made here? the memory of that id, with this origin (not an older data dir's) */
  cph_memory_rec m;
  rc = memory_read(t, own, &m, "importing memories");
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  char mine[MEMORY_ORIGIN_MAX];
  memory_origin(mine, node, &m);
  if (strcmp(mine, origin) == 0)
    *id = own;
  cph_record_free(&cph_memory_desc, &m);
  return CPH_OK;
}

int memory_adopt(cph_memory *mem, cph_txn *t, const cph_memory_rec *m, const char *origin,
                  uint64_t *id_out) {
  cph_memory_rec r = *m;
  r.tokens_est = tokens_estimate(m->text);
  r.deleted = false;
  r.replaced_by = 0;
  r.source_event_id = 0;
  r.gc_group = 0;
  uint64_t id = 0;
  int rc = mint_record(mem, t, r, true, &id);
  if (rc == CPH_OK)
    rc = origins_put(t, CPH_DB_MEMORY_ORIGINS, origin, id);
  cph_key k = origin_of_key(id);
  if (rc == CPH_OK)
    rc = cph_txn_put(t, CPH_DB_MEMORY_ORIGINS, &k, origin, strlen(origin));
  if (rc == CPH_OK && id_out)
    *id_out = id;
  return rc;
}

/* memory_read, and the record's size in the store. */
static int read_sized(cph_txn *t, uint64_t id, cph_memory_rec *m, size_t *len,
                      const char *reader) {
  cph_key k = cph_key_of_u64(id);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_MEMORIES, &k, &v);
  if (rc)
    return rc;
  cph_err derr;
  if (cph_record_decode(&cph_memory_desc, v.data, v.len, m, &derr)) {
    cph_log(CPH_LOG_WARN, "%s: skipping memory %llu: %s", reader, (unsigned long long)id,
            derr.msg);
    return CPH_ENOTFOUND;
  }
  *len = v.len;
  return CPH_OK;
}

int memory_read(cph_txn *t, uint64_t id, cph_memory_rec *m, const char *reader) {
  size_t len;
  return read_sized(t, id, m, &len, reader);
}

int memory_borrow(cph_memory *mem, cph_txn *t, uint64_t id, const cph_memory_rec **out,
                  const char *reader) {
  if ((*out = memcache_get(&mem->cache, id)))
    return CPH_OK;
  cph_memory_rec m;
  size_t len;
  int rc = read_sized(t, id, &m, &len, reader);
  if (rc)
    return rc;
  if (!(*out = memcache_keep(&mem->cache, &m, len))) {
    cph_record_free(&cph_memory_desc, &m);
    return CPH_ENOMEM;
  }
  return CPH_OK;
}

static long long test_cache_bytes = -1;
void memory_test_cache_bytes(long long bytes) { test_cache_bytes = bytes; }

void memory_cache_open(cph_memory *m) {
  memcache_init(&m->cache, test_cache_bytes >= 0 ? (size_t)test_cache_bytes : MEMORY_CACHE_BYTES);
}

void memory_pass_end(cph_memory *m) { memcache_pass_end(&m->cache); }

int memory_put(cph_memory *mem, cph_txn *t, const cph_memory_rec *rec) {
  memcache_mark_written(&mem->cache, rec->id);
  cph_key k = cph_key_of_u64(rec->id);
  return cph_txn_put_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, rec);
}

int memory_flush_accesses(cph_memory *mem, cph_txn *t) {
  if (!memaccess_flush_allowed(&mem->access))
    return CPH_OK;
  cph_txn c;
  int rc = cph_txn_begin_child(t, &c);
  size_t cursor = 0;
  uint64_t id, count;
  int64_t last_ms;
  while (rc == CPH_OK && memaccess_next_done(&mem->access, &cursor, &id, &count, &last_ms)) {
    cph_memory_rec m;
    int grc = memory_read(&c, id, &m, "memory access counts");
    if (grc == CPH_ENOTFOUND) /* deleted since (or undecodable): nothing to add to */
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    m.access_count += count;
    if (last_ms > m.last_access_ms)
      m.last_access_ms = last_ms;
    rc = memory_put(mem, &c, &m);
    cph_record_free(&cph_memory_desc, &m);
  }
  if (rc == CPH_OK)
    rc = cph_txn_commit(&c);
  else
    cph_txn_abort(&c);
  if (rc == CPH_OK)
    memaccess_flushed(&mem->access);
  else
    cph_log(CPH_LOG_WARN, "memory access counts: %s; kept for the next flush", cph_strerror(rc));
  return rc;
}

void memory_family_tag(uint64_t family, char out[32]) {
  snprintf(out, 32, "family:%llu", (unsigned long long)family);
}

int memory_add_tag(cph_memory *mem, cph_txn *t, uint64_t id, const char *tag) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_memory_rec m;
  int rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  if (rc)
    return rc;
  char **tags = realloc(m.tags, (m.n_tags + 1) * sizeof *tags);
  if (!tags) {
    cph_record_free(&cph_memory_desc, &m);
    return CPH_ENOMEM;
  }
  m.tags = tags;
  if (!(tags[m.n_tags] = strdup(tag))) {
    cph_record_free(&cph_memory_desc, &m);
    return CPH_ENOMEM;
  }
  m.n_tags++;
  rc = memory_put(mem, t, &m);
  cph_record_free(&cph_memory_desc, &m);
  return rc;
}

int memory_link_source(cph_memory *mem, cph_txn *t, uint64_t id, uint64_t event_id) {
  cph_key k = cph_key_of_u64(id);
  cph_memory_rec m;
  int rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  if (rc)
    return rc;
  if (m.kind == CPH_MEMORY_RAW && !m.source_event_id && event_id) {
    m.source_event_id = event_id;
    rc = memory_put(mem, t, &m);
    cph_key sk;
    memory_scope_prefix(&sk, m.session, true);
    cph_key_u64(&sk, id);
    uint8_t source[8];
    cph_be64_put(source, event_id);
    if (rc == CPH_OK)
      rc = cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &sk, source, sizeof source);
  }
  cph_record_free(&cph_memory_desc, &m);
  return rc;
}

int memory_set_text(cph_memory *mem, cph_txn *t, uint64_t id, const char *text) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_memory_rec m;
  int rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  if (rc)
    return rc;
  char *old = m.text;
  m.text = (char *)text;
  m.tokens_est = tokens_estimate(text);
  bool reembed = m.embed_status == CPH_EMBED_READY;
  if (reembed)
    m.embed_status = CPH_EMBED_PENDING; /* its vector describes the old text */
  rc = memory_put(mem, t, &m);
  m.text = old;
  cph_record_free(&cph_memory_desc, &m);
  if (rc == CPH_OK && reembed) {
    rc = embed_row_put(t, id, id, false); /* not queued while ready: no row holds it */
    if (rc == CPH_OK)
      mem->embed_queue_len++;
  }
  return rc;
}
