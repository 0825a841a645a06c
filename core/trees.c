/* The tree store (trees.h): a session's PACT tree as one value in database "context", and the
 * cache of decoded trees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---------------------------------------------------------------- load / save */

/* A session's tree is one value in database "context", key = the session id:
 *   be64 episode, be64 next node id, be64 next seq, be32 node count,
 *   then per node: be32 length + the node record (msgpack, cph_ctxnode_desc).
 * The tree is always read and written whole (every episode may shift every node's depth), so
 * one value costs one B-tree lookup and one write per turn instead of one per node. */
#define TREE_HEADER_BYTES 28u

static cph_key tree_key(const char *session) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  return k;
}

static int tree_corrupt(cph_txn *t, const char *session, const char *what) {
  return cph_err_set(&t->err, CPH_ECORRUPT,
                     "corrupt record in database \"context\" at key \"%s\": %s", session, what);
}

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

static int tree_decode(cph_txn *t, const char *session, const uint8_t *p, size_t len,
                       cph_pact_tree *out) {
  if (len < TREE_HEADER_BYTES)
    return tree_corrupt(t, session, "shorter than the tree header");
  out->episode = cph_be64_get(p);
  out->next_id = cph_be64_get(p + 8);
  out->next_seq = cph_be64_get(p + 16);
  uint32_t count = cph_be32_get(p + 24);
  size_t at = TREE_HEADER_BYTES;
  for (uint32_t i = 0; i < count; i++) {
    if (len - at < 4)
      return tree_corrupt(t, session, "node length past the end");
    uint32_t n = cph_be32_get(p + at);
    at += 4;
    if (len - at < n)
      return tree_corrupt(t, session, "node record past the end");
    cph_ctxnode_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_ctxnode_desc, p + at, n, &r, &derr)) {
      char what[sizeof derr.msg + 32];
      snprintf(what, sizeof what, "node %u: %s", i, derr.msg);
      return tree_corrupt(t, session, what);
    }
    int rc = tree_push(out, &r);
    cph_record_free(&cph_ctxnode_desc, &r);
    if (rc)
      return rc;
    at += n;
  }
  if (at != len)
    return tree_corrupt(t, session, "bytes after the last node");
  return CPH_OK;
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

static void cache_drop(cph_trees *tr, const char *session) {
  struct trees_slot *c = tr->slots ? cache_slot(tr, session) : NULL;
  if (c && c->session && strcmp(c->session, session) == 0)
    cached_clear(c);
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
}

void trees_init(cph_trees *tr) {
  tr->slots = NULL;
  tr->scratch = (cph_buf)CPH_BUF_INIT;
}

void trees_free(cph_trees *tr) {
  trees_cache_clear(tr);
  free(tr->slots);
  tr->slots = NULL;
  cph_buf_free(&tr->scratch);
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
  cph_key k = tree_key(session);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_CONTEXT, &k, &v);
  if (rc == CPH_OK)
    rc = tree_decode(t, session, v.data, v.len, out);
  else if (rc == CPH_ENOTFOUND)
    rc = CPH_OK; /* a session without context nodes yet */
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
  cph_key k = tree_key(session);
  int rc = cph_txn_del(t, CPH_DB_CONTEXT, &k);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int trees_save(cph_trees *tr, cph_txn *t, const char *session, const cph_pact_tree *tree) {
  cache_drop(tr, session); /* the caller keeps the new tree once its transaction committed */
  cph_buf *b = &tr->scratch; /* reused across saves: no allocation per turn at steady state */
  cph_buf_reset(b);
  uint8_t header[TREE_HEADER_BYTES];
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
    int rc = cph_record_encode(&cph_ctxnode_desc, &r, b);
    if (lc != lc_fixed)
      free(lc);
    if (rc)
      return rc;
    cph_be32_put((uint8_t *)b->data + len_at, (uint32_t)(b->len - len_at - 4));
  }
  if (cph_buf_error(b))
    return CPH_ENOMEM;
  cph_key k = tree_key(session);
  return cph_txn_put(t, CPH_DB_CONTEXT, &k, b->data, b->len);
}

