/* The tree store (trees.h): a session's PACT tree as a header and one record per node in
 * database "context", the cache of decoded trees, and the migration from schema 2's one value
 * per session. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "trees.h"

/* Message cores deeper than this are dropped after each episode: the conversation itself stays
 * in the channel history (LMDB), and without a bound every turn would load and rewrite a tree
 * that grows by one or two nodes per turn forever. */
#define HISTORY_CORES_MAX_DEPTH 128

size_t trees_prune_history(cph_pact_tree *tree) {
  size_t dropped = 0;
  for (size_t i = 0; i < tree->n;) {
    const cph_pact_node *n = &tree->nodes[i];
    if (n->role && n->at.depth > HISTORY_CORES_MAX_DEPTH && cph_pact_delete(tree, n->id) == CPH_OK) {
      dropped++;
      continue; /* the array shifted: look at index i again */
    }
    i++;
  }
  return dropped;
}

/* ---------------------------------------------------------------- record <-> node */

/* Moves r's strings into n (r keeps what is left to free). */
static int node_from_rec(cph_ctxnode_rec *r, cph_pact_node *n) {
  memset(n, 0, sizeof *n);
  n->id = r->id;
  n->at = (cph_coord){(int32_t)r->depth, (int32_t)r->position, (int32_t)r->offset};
  n->content = r->content;
  n->role = r->role;
  n->key = r->key;
  n->tags = r->tags;
  n->n_tags = r->n_tags;
  r->content = r->role = r->key = NULL;
  r->tags = NULL;
  r->n_tags = 0;
  n->ttl = (int32_t)r->ttl;
  n->cadence = (int32_t)r->cadence;
  n->stage = r->stage;
  n->created_at_episode = r->created_at_episode;
  n->seq = r->seq;
  n->waiting = r->waiting;
  uint32_t stages = r->n_lc_depth;
  if (stages && stages == r->n_lc_position && stages == r->n_lc_offset && stages == r->n_lc_ttl) {
    n->lifecycle = calloc(stages, sizeof *n->lifecycle);
    if (!n->lifecycle)
      return CPH_ENOMEM;
    for (uint32_t i = 0; i < stages; i++)
      n->lifecycle[i] = (cph_pact_stage){{(int32_t)r->lc_depth[i], (int32_t)r->lc_position[i],
                                          (int32_t)r->lc_offset[i]},
                                         (int32_t)r->lc_ttl[i]};
    n->n_lifecycle = stages;
  }
  return CPH_OK;
}

/* Borrowing view of n as a record; *lc holds 4 * n_lifecycle int64s owned by the caller. */
static void rec_from_node(const cph_pact_node *n, cph_ctxnode_rec *r, int64_t *lc) {
  memset(r, 0, sizeof *r);
  r->id = n->id;
  r->depth = n->at.depth;
  r->position = n->at.position;
  r->offset = n->at.offset;
  r->content = n->content;
  r->role = n->role;
  r->ttl = n->ttl;
  r->cadence = n->cadence;
  uint32_t k = n->n_lifecycle;
  for (uint32_t i = 0; i < k; i++) {
    lc[i] = n->lifecycle[i].at.depth;
    lc[k + i] = n->lifecycle[i].at.position;
    lc[2 * k + i] = n->lifecycle[i].at.offset;
    lc[3 * k + i] = n->lifecycle[i].ttl;
  }
  r->lc_depth = lc;
  r->lc_position = lc + k;
  r->lc_offset = lc + 2 * k;
  r->lc_ttl = lc + 3 * k;
  r->n_lc_depth = r->n_lc_position = r->n_lc_offset = r->n_lc_ttl = k;
  r->stage = n->stage;
  r->key = n->key;
  r->tags = n->tags;
  r->n_tags = n->n_tags;
  r->created_at_episode = n->created_at_episode;
  r->seq = n->seq;
  r->waiting = n->waiting;
}

/* ---------------------------------------------------------------- keys and errors */

/* The header's key, session\0; a node's is the same followed by its be64 seq. */
static cph_key head_key(const char *session) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  return k;
}

static cph_key node_key(const char *session, uint64_t seq) {
  cph_key k = head_key(session);
  cph_key_u64(&k, seq);
  return k;
}

static int tree_corrupt(cph_txn *t, const void *key, size_t key_len, const char *what) {
  char desc[200];
  cph_key_describe(key, key_len, desc, sizeof desc);
  return cph_err_set(&t->err, CPH_ECORRUPT,
                     "corrupt record in database \"context\" at key %s: %s", desc, what);
}

/* Appends a node slot to tree and moves r into it. */
static int tree_push(cph_pact_tree *tree, cph_ctxnode_rec *r) {
  if (tree->n == tree->cap) {
    size_t cap = tree->cap ? tree->cap * 2 : 16;
    cph_pact_node *p = realloc(tree->nodes, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    tree->nodes = p;
    tree->cap = cap;
  }
  int rc = node_from_rec(r, &tree->nodes[tree->n]);
  tree->n++; /* counted even when incomplete, so cph_pact_tree_free releases it */
  return rc;
}

/* ---------------------------------------------------------------- load */

/* Decodes one node record (key k) of a tree whose header says `shift` into tree. */
static int read_node(cph_txn *t, const cph_val *k, const cph_val *v, size_t prefix,
                     int64_t shift, cph_pact_tree *tree) {
  if (k->len != prefix + 8)
    return tree_corrupt(t, k->data, k->len, "not a node key (session, then an 8-byte seq)");
  cph_ctxnode_rec r = {0};
  cph_err derr;
  if (cph_record_decode(&cph_ctxnode_desc, v->data, v->len, &r, &derr))
    return tree_corrupt(t, k->data, k->len, derr.msg);
  const char *bad = NULL;
  int64_t depth = 0;
  if (r.seq != cph_be64_get((const uint8_t *)k->data + prefix))
    bad = "its seq is not its key's";
  else if (r.anchored &&
           (__builtin_sub_overflow(shift, r.depth, &depth) || depth < 0 || depth > INT32_MAX))
    bad = "its anchor puts it outside depths 0 .. 2147483647";
  else if (!r.anchored && (r.depth < -1 || r.depth > INT32_MAX))
    bad = "depth outside -1 .. 2147483647";
  else if (r.position < 0 || r.position > INT32_MAX || r.offset < INT32_MIN ||
           r.offset > INT32_MAX)
    bad = "position or offset out of range";
  if (bad) {
    cph_record_free(&cph_ctxnode_desc, &r);
    return tree_corrupt(t, k->data, k->len, bad);
  }
  if (r.anchored)
    r.depth = depth;
  int rc = tree_push(tree, &r);
  cph_record_free(&cph_ctxnode_desc, &r);
  return rc;
}

/* The header at session\0, then the nodes after it while the key starts with session\0. */
static int read_tree(cph_txn *t, const char *session, cph_pact_tree *out) {
  cph_key hk = head_key(session);
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CONTEXT, &c);
  if (rc)
    return rc;
  cph_val k, v;
  cph_ctxhead_rec h = {0};
  bool have_head = false;
  rc = cph_cursor_seek(&c, &hk, &k, &v);
  if (rc == CPH_OK && k.len == hk.len && memcmp(k.data, hk.data, hk.len) == 0) {
    cph_err derr;
    if (cph_record_decode(&cph_ctxhead_desc, v.data, v.len, &h, &derr))
      rc = tree_corrupt(t, k.data, k.len, derr.msg);
    else
      rc = cph_cursor_next(&c, &k, &v);
    have_head = true;
  }
  for (; rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    if (k.len < hk.len || memcmp(k.data, hk.data, hk.len) != 0)
      break; /* the next session's */
    if (!have_head)
      rc = tree_corrupt(t, k.data, k.len, "a node without its tree's header");
    else
      rc = read_node(t, &k, &v, hk.len, h.shift, out);
    if (rc)
      break;
  }
  cph_cursor_close(&c);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  if (have_head) {
    if (h.count != out->n) {
      char what[96];
      snprintf(what, sizeof what, "the header counts %u nodes, the store holds %zu",
               (unsigned)h.count, out->n);
      return tree_corrupt(t, hk.data, hk.len, what);
    }
    out->episode = h.episode;
    out->next_id = h.next_id;
    out->next_seq = h.next_seq;
    out->shift = h.shift;
  }
  return CPH_OK;
}

/* ---------------------------------------------------------------- save */

static int put_value(cph_trees *tr, cph_txn *t, const cph_key *k, const cph_record_desc *d,
                     const void *rec) {
  cph_buf *b = &tr->scratch; /* reused across saves: no allocation per turn at steady state */
  cph_buf_reset(b);
  int rc = cph_record_encode(d, rec, b);
  if (rc)
    return rc;
  tr->written.puts++;
  tr->written.put_bytes += b->len;
  return cph_txn_put(t, CPH_DB_CONTEXT, k, b->data, b->len);
}

static int put_node(cph_trees *tr, cph_txn *t, const char *session, const cph_pact_tree *tree,
                    const cph_pact_node *n) {
  int64_t lc_fixed[4 * 8];
  size_t lc_n = 4 * (n->n_lifecycle ? n->n_lifecycle : 1);
  int64_t *lc = lc_n <= 4 * 8 ? lc_fixed : calloc(lc_n, sizeof *lc);
  if (!lc)
    return CPH_ENOMEM;
  cph_ctxnode_rec r;
  rec_from_node(n, &r, lc);
  r.anchored = cph_pact_shifts(n);
  if (r.anchored)
    r.depth = tree->shift - n->at.depth;
  cph_key k = node_key(session, n->seq);
  int rc = put_value(tr, t, &k, &cph_ctxnode_desc, &r);
  if (lc != lc_fixed)
    free(lc);
  return rc;
}

static int put_head(cph_trees *tr, cph_txn *t, const char *session, const cph_pact_tree *tree) {
  cph_ctxhead_rec h = {tree->episode, tree->next_id, tree->next_seq, tree->shift,
                       (uint32_t)tree->n};
  cph_key k = head_key(session);
  return put_value(tr, t, &k, &cph_ctxhead_desc, &h);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Deletes every stored node of session whose seq the tree no longer holds: for when pact
 * noted more removals than it keeps (one walk over the session's node keys). */
static int delete_absent(cph_trees *tr, cph_txn *t, const char *session,
                         const cph_pact_tree *tree) {
  uint64_t *seqs = malloc((tree->n ? tree->n : 1) * sizeof *seqs);
  if (!seqs)
    return CPH_ENOMEM;
  for (size_t i = 0; i < tree->n; i++)
    seqs[i] = tree->nodes[i].seq;
  qsort(seqs, tree->n, sizeof *seqs, cmp_u64);
  cph_key start = node_key(session, 0);
  size_t prefix = start.len - 8;
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CONTEXT, &c);
  cph_val k;
  if (rc == CPH_OK)
    rc = cph_cursor_seek(&c, &start, &k, NULL);
  while (rc == CPH_OK && k.len == prefix + 8 && memcmp(k.data, start.data, prefix) == 0) {
    uint64_t seq = cph_be64_get((const uint8_t *)k.data + prefix);
    if (bsearch(&seq, seqs, tree->n, sizeof *seqs, cmp_u64)) {
      rc = cph_cursor_next(&c, &k, NULL);
      continue;
    }
    if ((rc = cph_cursor_del(&c)) != CPH_OK)
      break;
    tr->written.dels++;
    rc = cph_cursor_next(&c, &k, NULL); /* after a delete LMDB's cursor stands on the next */
  }
  cph_cursor_close(&c);
  free(seqs);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* Writes the header and the nodes `all` or dirty says, deletions first (a seq given back by a
 * failed complete_turn may be noted removed and then reused). */
static int write_tree(cph_trees *tr, cph_txn *t, const char *session, cph_pact_tree *tree,
                      bool all) {
  int rc = CPH_OK;
  if (tree->removed_overflow) {
    rc = delete_absent(tr, t, session, tree);
  } else {
    for (uint32_t i = 0; i < tree->n_removed && rc == CPH_OK; i++) {
      cph_key k = node_key(session, tree->removed[i]);
      rc = cph_txn_del(t, CPH_DB_CONTEXT, &k);
      if (rc == CPH_OK)
        tr->written.dels++;
      else if (rc == CPH_ENOTFOUND)
        rc = CPH_OK; /* inserted and removed between two saves */
    }
  }
  for (size_t i = 0; i < tree->n && rc == CPH_OK; i++)
    if (all || tree->nodes[i].dirty)
      rc = put_node(tr, t, session, tree, &tree->nodes[i]);
  if (rc == CPH_OK)
    rc = put_head(tr, t, session, tree);
  if (rc == CPH_OK && (rc = t->ret) == CPH_OK) {
    cph_pact_changes_clear(tree);
    tr->written.saves++;
  }
  return rc;
}
/* ---------------------------------------------------------------- the tree cache */

/* Trees kept decoded: direct-mapped on a hash of the session id. A full tree of 130 nodes of
 * ~150 bytes is ~20 KB, so the cache holds at most ~10 MB. */
#define TREES_CACHE_SLOTS 512

struct trees_slot {
  char *session; /* NULL: empty */
  cph_pact_tree tree;
};

static struct trees_slot *cache_slot(cph_trees *tr, const char *session) {
  if (!tr->slots && !(tr->slots = calloc(TREES_CACHE_SLOTS, sizeof *tr->slots)))
    return NULL;
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)session; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return &tr->slots[h % TREES_CACHE_SLOTS];
}

static void cached_clear(struct trees_slot *c) {
  free(c->session);
  c->session = NULL;
  cph_pact_tree_free(&c->tree);
  cph_pact_tree_init(&c->tree);
}

struct trees_hold {
  uint64_t token;
  char *session;
  bool stale;
};

static void holds_stale(cph_trees *tr, const char *session) {
  for (size_t i = 0; i < tr->n_holds; i++)
    if (!session || strcmp(tr->holds[i].session, session) == 0)
      tr->holds[i].stale = true;
}

uint64_t trees_hold(cph_trees *tr, const char *session) {
  if (tr->n_holds == tr->cap_holds) {
    size_t cap = tr->cap_holds ? 2 * tr->cap_holds : 8;
    struct trees_hold *h = realloc(tr->holds, cap * sizeof *h);
    if (!h)
      return 0;
    tr->holds = h;
    tr->cap_holds = cap;
  }
  char *copy = strdup(session);
  if (!copy)
    return 0;
  tr->holds[tr->n_holds++] = (struct trees_hold){++tr->next_hold, copy, false};
  return tr->next_hold;
}

void trees_keep_held(cph_trees *tr, uint64_t token, const char *session, cph_pact_tree *tree) {
  for (size_t i = 0; token && i < tr->n_holds; i++) {
    if (tr->holds[i].token != token)
      continue;
    bool stale = tr->holds[i].stale;
    free(tr->holds[i].session);
    tr->holds[i] = tr->holds[--tr->n_holds];
    if (!stale)
      trees_keep(tr, session, tree);
    return;
  }
}

static void cache_drop(cph_trees *tr, const char *session) {
  struct trees_slot *c = tr->slots ? cache_slot(tr, session) : NULL;
  if (c && c->session && strcmp(c->session, session) == 0)
    cached_clear(c);
  if (tr->n_holds)
    holds_stale(tr, session);
}

void trees_keep(cph_trees *tr, const char *session, cph_pact_tree *tree) {
  struct trees_slot *c = cache_slot(tr, session);
  char *copy = c ? strdup(session) : NULL;
  if (!copy) {
    free(copy);
    return; /* out of memory: the tree stays with the caller, uncached */
  }
  cached_clear(c);
  c->session = copy;
  c->tree = *tree;
  cph_pact_tree_init(tree);
}

void trees_cache_clear(cph_trees *tr) {
  for (size_t i = 0; tr->slots && i < TREES_CACHE_SLOTS; i++)
    if (tr->slots[i].session)
      cached_clear(&tr->slots[i]);
  holds_stale(tr, NULL);
}

void trees_init(cph_trees *tr) {
  tr->slots = NULL;
  tr->holds = NULL;
  tr->n_holds = tr->cap_holds = 0;
  tr->next_hold = 0;
  tr->scratch = (cph_buf)CPH_BUF_INIT;
  memset(&tr->written, 0, sizeof tr->written);
}

void trees_free(cph_trees *tr) {
  trees_cache_clear(tr);
  free(tr->slots);
  tr->slots = NULL;
  cph_buf_free(&tr->scratch);
  for (size_t i = 0; i < tr->n_holds; i++)
    free(tr->holds[i].session);
  free(tr->holds);
  tr->holds = NULL;
  tr->n_holds = tr->cap_holds = 0;
}

int trees_load(cph_trees *tr, cph_txn *t, const char *session, cph_pact_tree *out) {
  cph_pact_tree_init(out);
  struct trees_slot *c = tr->slots ? cache_slot(tr, session) : NULL;
  if (c && c->session && strcmp(c->session, session) == 0) {
    *out = c->tree; /* taken: the caller keeps it back, or it is read again next time */
    cph_pact_tree_init(&c->tree);
    free(c->session);
    c->session = NULL;
    return CPH_OK;
  }
  int rc = read_tree(t, session, out);
  if (rc) {
    cph_pact_tree_free(out);
    cph_pact_tree_init(out); /* callers free the tree whatever the outcome */
    return rc;
  }
  if (!out->next_id)
    out->next_id = 1;
  if (!out->next_seq)
    out->next_seq = 1;
  return CPH_OK;
}

int trees_delete(cph_trees *tr, cph_txn *t, const char *session) {
  cache_drop(tr, session);
  cph_key hk = head_key(session);
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CONTEXT, &c);
  cph_val k;
  if (rc == CPH_OK)
    rc = cph_cursor_seek(&c, &hk, &k, NULL);
  while (rc == CPH_OK && k.len >= hk.len && memcmp(k.data, hk.data, hk.len) == 0) {
    if ((rc = cph_cursor_del(&c)) == CPH_OK)
      rc = cph_cursor_next(&c, &k, NULL); /* after a delete LMDB's cursor stands on the next */
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int trees_export(cph_trees *tr, cph_txn *t, const char *session, cph_buf *out) {
  (void)tr; /* the store holds what the cache does (trees_keep's contract) */
  size_t count_at = out->len;
  uint8_t be[4] = {0};
  cph_buf_append(out, be, 4);
  uint32_t count = 0;
  cph_key hk = head_key(session);
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CONTEXT, &c);
  cph_val k, v;
  if (rc == CPH_OK)
    rc = cph_cursor_seek(&c, &hk, &k, &v);
  while (rc == CPH_OK && k.len >= hk.len && memcmp(k.data, hk.data, hk.len) == 0) {
    cph_be32_put(be, (uint32_t)(k.len - hk.len));
    cph_buf_append(out, be, 4);
    cph_buf_append(out, (const uint8_t *)k.data + hk.len, k.len - hk.len);
    cph_be32_put(be, (uint32_t)v.len);
    cph_buf_append(out, be, 4);
    cph_buf_append(out, v.data, v.len);
    count++;
    rc = cph_cursor_next(&c, &k, &v);
  }
  cph_cursor_close(&c);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  if (cph_buf_error(out))
    return CPH_ENOMEM;
  cph_be32_put((uint8_t *)out->data + count_at, count);
  return CPH_OK;
}

int trees_import(cph_trees *tr, cph_txn *t, const char *session, const uint8_t *data, size_t len,
                 size_t *used) {
  size_t at = 0;
  if (len < 4)
    return CPH_EINVAL;
  uint32_t count = cph_be32_get(data);
  at = 4;
  int rc = trees_delete(tr, t, session);
  cph_key hk = head_key(session);
  for (uint32_t i = 0; rc == CPH_OK && i < count; i++) {
    if (len - at < 4)
      return CPH_EINVAL;
    uint32_t kl = cph_be32_get(data + at);
    at += 4;
    if (len - at < (size_t)kl + 4 || hk.len + kl > CPH_KEY_MAX)
      return CPH_EINVAL;
    cph_key k = hk;
    memcpy(k.data + k.len, data + at, kl);
    k.len += kl;
    at += kl;
    uint32_t vl = cph_be32_get(data + at);
    at += 4;
    if (len - at < vl)
      return CPH_EINVAL;
    rc = cph_txn_put(t, CPH_DB_CONTEXT, &k, data + at, vl);
    at += vl;
  }
  *used = at;
  return rc;
}

int trees_import_is_behind(cph_trees *tr, cph_txn *t, const char *session, const uint8_t *data,
                           size_t len, size_t *used, bool *behind) {
  (void)tr; /* the store holds what the cache does (trees_keep's contract) */
  *behind = false;
  if (len < 4)
    return CPH_EINVAL;
  uint32_t count = cph_be32_get(data);
  size_t at = 4;
  const uint8_t *head = NULL, *newest = NULL;
  uint32_t head_len = 0, newest_len = 0;
  uint64_t newest_seq = 0;
  for (uint32_t i = 0; i < count; i++) {
    if (len - at < 4)
      return CPH_EINVAL;
    uint32_t kl = cph_be32_get(data + at);
    at += 4;
    if (len - at < (size_t)kl + 4)
      return CPH_EINVAL;
    const uint8_t *key = data + at;
    at += kl;
    uint32_t vl = cph_be32_get(data + at);
    at += 4;
    if (len - at < vl)
      return CPH_EINVAL;
    if (kl == 0) {
      head = data + at;
      head_len = vl;
    } else if (kl == 8 && (!newest || cph_be64_get(key) > newest_seq)) {
      newest_seq = cph_be64_get(key);
      newest = data + at;
      newest_len = vl;
    }
    at += vl;
  }
  *used = at;
  if (!head || !newest)
    return CPH_OK;
  cph_ctxhead_rec theirs = {0}, ours = {0};
  cph_err derr = {0};
  if (cph_record_decode(&cph_ctxhead_desc, head, head_len, &theirs, &derr))
    return CPH_EINVAL;
  cph_key hk = head_key(session), nk = node_key(session, newest_seq);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_CONTEXT, &hk, &v);
  if (rc == CPH_OK && cph_record_decode(&cph_ctxhead_desc, v.data, v.len, &ours, &derr))
    return CPH_OK; /* ours unreadable: theirs is taken */
  if (rc == CPH_OK && ours.episode > theirs.episode &&
      (rc = cph_txn_get(t, CPH_DB_CONTEXT, &nk, &v)) == CPH_OK)
    *behind = v.len == newest_len && memcmp(v.data, newest, newest_len) == 0;
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int trees_save(cph_trees *tr, cph_txn *t, const char *session, cph_pact_tree *tree) {
  cache_drop(tr, session); /* the caller keeps the new tree once its transaction committed */
  return write_tree(tr, t, session, tree, false);
}

/* ---------------------------------------------------------------- schema 2 (migration) */

/* Schema 2's value at key session\0: be64 episode, be64 next node id, be64 next seq, be32
 * node count, then per node be32 length + the node record (version 1). */
#define V2_HEADER_BYTES 28u

static int v2_decode(cph_txn *t, const cph_val *k, const uint8_t *p, size_t len,
                     cph_pact_tree *out) {
  if (len < V2_HEADER_BYTES)
    return tree_corrupt(t, k->data, k->len, "shorter than the tree header");
  out->episode = cph_be64_get(p);
  out->next_id = cph_be64_get(p + 8);
  out->next_seq = cph_be64_get(p + 16);
  uint32_t count = cph_be32_get(p + 24);
  size_t at = V2_HEADER_BYTES;
  for (uint32_t i = 0; i < count; i++) {
    if (len - at < 4)
      return tree_corrupt(t, k->data, k->len, "node length past the end");
    uint32_t n = cph_be32_get(p + at);
    at += 4;
    if (len - at < n)
      return tree_corrupt(t, k->data, k->len, "node record past the end");
    cph_ctxnode_rec r = {0};
    cph_err derr;
    if (cph_record_decode(&cph_ctxnode_v1_desc, p + at, n, &r, &derr)) {
      char what[sizeof derr.msg + 32];
      snprintf(what, sizeof what, "node %u: %s", i, derr.msg);
      return tree_corrupt(t, k->data, k->len, what);
    }
    int rc = tree_push(out, &r);
    cph_record_free(&cph_ctxnode_v1_desc, &r);
    if (rc)
      return rc;
    at += n;
  }
  if (at != len)
    return tree_corrupt(t, k->data, k->len, "bytes after the last node");
  return CPH_OK;
}

int trees_v2_encode(const cph_pact_tree *tree, cph_buf *b) {
  uint8_t header[V2_HEADER_BYTES];
  cph_be64_put(header, tree->episode);
  cph_be64_put(header + 8, tree->next_id);
  cph_be64_put(header + 16, tree->next_seq);
  cph_be32_put(header + 24, (uint32_t)tree->n);
  cph_buf_append(b, header, sizeof header);
  int64_t lc_fixed[4 * 8];
  for (size_t i = 0; i < tree->n && !cph_buf_error(b); i++) {
    const cph_pact_node *n = &tree->nodes[i];
    size_t lc_n = 4 * (n->n_lifecycle ? n->n_lifecycle : 1);
    int64_t *lc = lc_n <= 4 * 8 ? lc_fixed : calloc(lc_n, sizeof *lc);
    if (!lc)
      return CPH_ENOMEM;
    cph_ctxnode_rec r;
    rec_from_node(n, &r, lc);
    size_t len_at = b->len;
    uint8_t len_be[4] = {0};
    cph_buf_append(b, len_be, sizeof len_be);
    int rc = cph_record_encode(&cph_ctxnode_v1_desc, &r, b);
    if (lc != lc_fixed)
      free(lc);
    if (rc)
      return rc;
    if (!cph_buf_error(b))
      cph_be32_put((uint8_t *)b->data + len_at, (uint32_t)(b->len - len_at - 4));
  }
  return cph_buf_error(b);
}

static int by_seq_then_id(const void *a, const void *b) {
  const cph_pact_node *x = a, *y = b;
  if (x->seq != y->seq)
    return x->seq < y->seq ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Seqs become keys: a schema-2 tree whose seqs are not distinct and non-zero (none written by
 * pact is; this is for damaged or hand-made data) is renumbered 1.. in its creation order,
 * which is all a seq means (pact.h), so nothing observable changes. Returns whether it was. */
static bool renumber_if_needed(cph_pact_tree *tree) {
  qsort(tree->nodes, tree->n, sizeof *tree->nodes, by_seq_then_id);
  bool ok = tree->n == 0 || tree->nodes[0].seq != 0;
  for (size_t i = 1; ok && i < tree->n; i++)
    ok = tree->nodes[i].seq != tree->nodes[i - 1].seq;
  if (ok)
    return false;
  for (size_t i = 0; i < tree->n; i++)
    tree->nodes[i].seq = i + 1;
  if (tree->next_seq <= tree->n)
    tree->next_seq = tree->n + 1;
  return true;
}

/* The sessions that have a tree value: every key of database "context" (schema 2 has nothing
 * else there), copied, since the rewrite moves the pages under a cursor. */
static int v2_sessions(cph_txn *t, char ***out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t cap = 0;
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_CONTEXT, &c);
  cph_val k;
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, NULL); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, NULL)) {
    const char *key = k.data;
    if (k.len < 2 || key[k.len - 1] != '\0' || memchr(key, '\0', k.len - 1)) {
      rc = tree_corrupt(t, k.data, k.len, "not a schema-2 tree key (a session id and a NUL)");
      break;
    }
    if (*n == cap) {
      cap = cap ? cap * 2 : 64;
      char **p = realloc(*out, cap * sizeof *p);
      if (!p) {
        rc = CPH_ENOMEM;
        break;
      }
      *out = p;
    }
    if (!((*out)[*n] = strdup(key))) {
      rc = CPH_ENOMEM;
      break;
    }
    (*n)++;
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int trees_migrate(void *ctx, cph_txn *t, cph_err *err) {
  cph_trees *tr = ctx;
  char **sessions;
  size_t n_sessions, nodes = 0, renumbered = 0;
  int rc = v2_sessions(t, &sessions, &n_sessions);
  for (size_t i = 0; i < n_sessions && rc == CPH_OK; i++) {
    cph_key k = head_key(sessions[i]);
    cph_val v;
    cph_pact_tree tree;
    cph_pact_tree_init(&tree);
    rc = cph_txn_get(t, CPH_DB_CONTEXT, &k, &v);
    cph_val kv = {k.data, k.len};
    if (rc == CPH_OK)
      rc = v2_decode(t, &kv, v.data, v.len, &tree);
    if (rc == CPH_OK) {
      renumbered += renumber_if_needed(&tree);
      nodes += tree.n;
      /* the header overwrites the old value at the same key; every node is new */
      rc = write_tree(tr, t, sessions[i], &tree, true);
    }
    cph_pact_tree_free(&tree);
  }
  for (size_t i = 0; i < n_sessions; i++)
    free(sessions[i]);
  free(sessions);
  if (rc)
    return cph_err_set(err, rc, "%s", t->err.msg[0] ? t->err.msg : cph_strerror(rc));
  cph_info("store: migrated %zu context trees (%zu nodes) from storage schema 2 to one record "
           "per node%s",
           n_sessions, nodes, renumbered ? " (some with their node seqs renumbered)" : "");
  return CPH_OK;
}
