/* A session's PACT tree in LMDB (database "context": session\0 + u64 node id -> node record;
 * node id 0 holds the tree header: episode, next id, next seq), the context operations
 * (insert, delete, seal) and the context reads (select, dry-run step, seals). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

#define TREE_NODES_MAX 4096 /* a session's tree; inserts beyond it are refused (413) */
/* Message cores deeper than this are dropped after each episode: the conversation itself stays
 * in the channel history (LMDB), and without a bound every turn would load and rewrite a tree
 * that grows by one or two nodes per turn forever. */
#define HISTORY_CORES_MAX_DEPTH 128

size_t pact_prune_history(cph_pact_tree *tree) {
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

static cph_key node_key(const char *session, uint64_t id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, id);
  return k;
}

/* ---------------------------------------------------------------- record <-> node */

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

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
#define PACT_CACHE_SLOTS 512

struct pact_cached {
  char *session; /* NULL: empty */
  cph_pact_tree tree;
};

static struct pact_cached *cache_slot(cph_engine *e, const char *session) {
  if (!e->trees && !(e->trees = calloc(PACT_CACHE_SLOTS, sizeof *e->trees)))
    return NULL;
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const unsigned char *p = (const unsigned char *)session; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return &e->trees[h % PACT_CACHE_SLOTS];
}

static void cached_clear(struct pact_cached *c) {
  free(c->session);
  c->session = NULL;
  cph_pact_tree_free(&c->tree);
  cph_pact_tree_init(&c->tree);
}

static void cache_drop(cph_engine *e, const char *session) {
  struct pact_cached *c = e->trees ? cache_slot(e, session) : NULL;
  if (c && c->session && strcmp(c->session, session) == 0)
    cached_clear(c);
}

void pact_keep(cph_engine *e, const char *session, cph_pact_tree *tree) {
  struct pact_cached *c = cache_slot(e, session);
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

void pact_cache_clear(cph_engine *e) {
  for (size_t i = 0; e->trees && i < PACT_CACHE_SLOTS; i++)
    if (e->trees[i].session)
      cached_clear(&e->trees[i]);
}

int pact_load(cph_engine *e, cph_txn *t, const char *session, cph_pact_tree *out) {
  cph_pact_tree_init(out);
  struct pact_cached *c = e->trees ? cache_slot(e, session) : NULL;
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

int pact_delete_all(cph_engine *e, cph_txn *t, const char *session) {
  cache_drop(e, session);
  cph_key k = tree_key(session);
  int rc = cph_txn_del(t, CPH_DB_CONTEXT, &k);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int pact_save(cph_engine *e, cph_txn *t, const char *session, const cph_pact_tree *tree) {
  cache_drop(e, session); /* the caller keeps the new tree once its transaction committed */
  cph_buf *b = &e->scratch; /* reused across saves: no allocation per turn at steady state */
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

/* ---------------------------------------------------------------- node info */

static void info_from_node(const cph_pact_node *n, cph_context_node_info *o) {
  memset(o, 0, sizeof *o);
  o->id = n->id;
  cph_coord_format(&n->at, o->at);
  o->content = strdup(n->content ? n->content : "");
  o->role = dup_opt(n->role);
  o->ttl = n->ttl;
  o->cadence = n->cadence;
  if (n->n_lifecycle) {
    o->lifecycle = calloc(n->n_lifecycle, sizeof *o->lifecycle);
    for (uint32_t i = 0; o->lifecycle && i < n->n_lifecycle; i++) {
      cph_coord_format(&n->lifecycle[i].at, o->lifecycle[i].at);
      o->lifecycle[i].ttl = n->lifecycle[i].ttl;
    }
    o->n_lifecycle = o->lifecycle ? n->n_lifecycle : 0;
  }
  o->key = dup_opt(n->key);
  if (n->n_tags) {
    o->tags.items = calloc(n->n_tags, sizeof *o->tags.items);
    for (uint32_t i = 0; o->tags.items && i < n->n_tags; i++)
      o->tags.items[i] = strdup(n->tags[i]);
    o->tags.count = o->tags.items ? n->n_tags : 0;
  }
  o->created_at_episode = n->created_at_episode;
}

void cph_context_nodes_free(cph_context_node_info *nodes, size_t n) {
  for (size_t i = 0; nodes && i < n; i++) {
    free(nodes[i].content);
    free(nodes[i].role);
    free(nodes[i].lifecycle);
    free(nodes[i].key);
    for (size_t j = 0; j < nodes[i].tags.count; j++)
      free(nodes[i].tags.items[j]);
    free(nodes[i].tags.items);
  }
  free(nodes);
}

/* The live nodes in render order, optionally filtered. */
static int tree_nodes(const cph_pact_tree *tree, const cph_selector *sel,
                      cph_context_node_info **out, size_t *n) {
  *n = 0;
  size_t *idx = calloc(tree->n ? tree->n : 1, sizeof *idx);
  *out = calloc(tree->n ? tree->n : 1, sizeof **out);
  if (!idx || !*out) {
    free(idx);
    free(*out);
    *out = NULL;
    return CPH_ENOMEM;
  }
  size_t live = cph_pact_render_order(tree, idx);
  for (size_t i = 0; i < live; i++) {
    const cph_pact_node *node = &tree->nodes[idx[i]];
    if (!sel || cph_selector_match(sel, node))
      info_from_node(node, &(*out)[(*n)++]);
  }
  free(idx);
  return CPH_OK;
}

/* ---------------------------------------------------------------- operations */

static int parse_node(cph_op *op, cph_pact_node *proto, cph_pact_stage *stages) {
  const cph_context_node_in *in = &op->u.context.node;
  cph_err err = {0};
  memset(proto, 0, sizeof *proto);
  if (!in->at || cph_coord_parse(in->at, &proto->at, &err))
    return op_fail(op, CPH_EINVAL, "at", "at: %s",
                   in->at ? err.msg : "required, e.g. \"d0, 1, 0\"");
  if (!in->content)
    return op_fail(op, CPH_EINVAL, "content", "content: required");
  if (in->ttl < 0 || in->ttl > INT32_MAX)
    return op_fail(op, CPH_EINVAL, "ttl", "ttl: expected episodes >= 1 (absent: permanent)");
  if (in->cadence < 0 || in->cadence > INT32_MAX)
    return op_fail(op, CPH_EINVAL, "cadence", "cadence: expected episodes >= 1");
  proto->content = in->content;
  proto->ttl = in->ttl ? (int32_t)in->ttl : CPH_PACT_NO_TTL;
  proto->cadence = (int32_t)in->cadence;
  proto->key = in->key;
  proto->tags = in->tags.items;
  proto->n_tags = (uint32_t)in->tags.count;
  for (size_t i = 0; i < in->n_lifecycle; i++) {
    char field[48];
    snprintf(field, sizeof field, "lifecycle[%zu].at", i);
    if (!in->lifecycle[i].at || cph_coord_parse(in->lifecycle[i].at, &stages[i].at, &err))
      return op_fail(op, CPH_EINVAL, field, "%s: %s", field,
                     in->lifecycle[i].at ? err.msg : "required");
    stages[i].ttl = in->lifecycle[i].ttl ? (int32_t)in->lifecycle[i].ttl : CPH_PACT_NO_TTL;
  }
  if (in->n_lifecycle) {
    proto->lifecycle = stages;
    proto->n_lifecycle = (uint32_t)in->n_lifecycle;
    proto->at = stages[0].at; /* a lifecycle node starts at its first stage */
    proto->ttl = stages[0].ttl;
  }
  return CPH_OK;
}

static void context_insert(cph_engine *e, cph_op *op, csession *s) {
  if (op->u.context.node.n_lifecycle > 32) {
    op_fail(op, CPH_ELIMIT, "lifecycle", "lifecycle: at most 32 stages");
    return;
  }
  cph_pact_stage stages[32];
  cph_pact_node proto;
  if (parse_node(op, &proto, stages))
    return;
  cph_txn t;
  cph_txn_begin_child(&e->env.txn, &t);
  cph_pact_tree tree;
  int rc = pact_load(e, &t, s->id, &tree);
  if (rc) {
    op_fail(op, rc, NULL, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    cph_txn_abort(&t);
    return;
  }
  cph_err err = {0};
  /* A node with the key of a live node updates that node in place (same id): "insert or
   * update" by key, so a worker can keep one reminder fresh instead of stacking copies. */
  cph_pact_node *existing = NULL;
  for (size_t i = 0; proto.key && i < tree.n && !existing; i++)
    if (tree.nodes[i].key && !tree.nodes[i].waiting && strcmp(tree.nodes[i].key, proto.key) == 0)
      existing = &tree.nodes[i];
  if (existing && !proto.n_lifecycle) {
    op->u.context.node_id = existing->id;
    op->u.context.updated = true;
    unsigned mask = CPH_PACT_SET_CONTENT | CPH_PACT_SET_TTL | CPH_PACT_SET_CADENCE |
                    CPH_PACT_SET_TAGS | CPH_PACT_SET_AT;
    rc = cph_pact_update(&tree, existing->id, &proto, mask, &err);
    if (rc)
      op_fail(op, rc == CPH_EPARSE ? CPH_EINVAL : rc, "at", "%s", err.msg);
    else if ((rc = pact_save(e, &t, s->id, &tree)) != CPH_OK || cph_txn_commit(&t) != CPH_OK)
      op_fail(op, t.ret ? t.ret : rc, NULL, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  } else if (tree.n >= TREE_NODES_MAX) {
    op_fail(op, CPH_ELIMIT, NULL, "the context of '%s' holds %d nodes, the most it may", s->id,
            TREE_NODES_MAX);
  } else if ((rc = cph_pact_insert(&tree, &proto, &op->u.context.node_id, &err)) != CPH_OK) {
    /* the field the problem is about: the module's messages name it */
    const char *field = strstr(err.msg, "lifecycle") ? "lifecycle"
                        : strstr(err.msg, "cadence") ? "cadence"
                        : strstr(err.msg, "ttl")     ? "ttl"
                                                     : "at";
    op_fail(op, rc == CPH_EPARSE ? CPH_EINVAL : rc, rc == CPH_ENOMEM ? NULL : field, "%s",
            err.msg);
  } else if ((rc = pact_save(e, &t, s->id, &tree)) != CPH_OK || cph_txn_commit(&t) != CPH_OK) {
    op_fail(op, t.ret ? t.ret : rc, NULL, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
  if (t.mdb)
    cph_txn_abort(&t);
  cph_pact_tree_free(&tree);
}

static void context_delete(cph_engine *e, cph_op *op, csession *s) {
  cph_txn t;
  cph_txn_begin_child(&e->env.txn, &t);
  cph_pact_tree tree;
  int rc = pact_load(e, &t, s->id, &tree);
  if (rc == CPH_OK && cph_pact_delete(&tree, op->u.context.node_id) != CPH_OK)
    rc = op_fail(op, CPH_ENOTFOUND, "node", "no context node %llu in '%s'",
                 (unsigned long long)op->u.context.node_id, s->id);
  else if (rc == CPH_OK)
    rc = pact_save(e, &t, s->id, &tree);
  if (rc == CPH_OK && cph_txn_commit(&t))
    rc = op_fail(op, t.ret, NULL, "%s", t.err.msg);
  else if (rc && !op->rc)
    op_fail(op, rc, NULL, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  if (t.mdb)
    cph_txn_abort(&t);
  cph_pact_tree_free(&tree);
}

/* The tree rendered as messages: message cores keep their role; depth -1 and other nodes are
 * system context. */
static void render_messages(const cph_pact_tree *tree, cph_seal_rec *r) {
  size_t *idx = calloc(tree->n ? tree->n : 1, sizeof *idx);
  size_t live = idx ? cph_pact_render_order(tree, idx) : 0;
  r->roles = calloc(live ? live : 1, sizeof *r->roles);
  r->contents = calloc(live ? live : 1, sizeof *r->contents);
  r->coords = calloc(live ? live : 1, sizeof *r->coords);
  for (size_t i = 0; r->roles && r->contents && r->coords && i < live; i++) {
    const cph_pact_node *n = &tree->nodes[idx[i]];
    char coord[48];
    cph_coord_format(&n->at, coord);
    r->roles[i] = strdup(n->role ? n->role : "system");
    r->contents[i] = strdup(n->content ? n->content : "");
    r->coords[i] = strdup(coord);
    r->n_roles = r->n_contents = r->n_coords = (uint32_t)(i + 1);
  }
  free(idx);
}

static void context_seal(cph_engine *e, cph_op *op, csession *s) {
  const char *trigger = op->u.context.trigger;
  if (!trigger || !*trigger || strlen(trigger) > 128) {
    op_fail(op, CPH_EINVAL, "trigger", "trigger: a name of 1 to 128 bytes");
    return;
  }
  cph_txn t;
  cph_txn_begin_child(&e->env.txn, &t);
  cph_pact_tree tree;
  int rc = pact_load(e, &t, s->id, &tree);
  if (rc) {
    op_fail(op, rc, NULL, "%s", t.err.msg);
    cph_txn_abort(&t);
    return;
  }
  cph_seal_rec r = {0};
  char counter[160];
  snprintf(counter, sizeof counter, "seal:%s", s->id);
  cph_txn_next_id(&t, counter, &r.id);
  r.session = s->id;
  r.trigger = (char *)trigger;
  r.episode = s->episode;
  r.created_ms = cph_wall_ms();
  render_messages(&tree, &r);
  cph_key k = node_key(s->id, r.id);
  cph_txn_put_record(&t, CPH_DB_SEALS, &k, &cph_seal_desc, &r);
  r.session = r.trigger = NULL; /* borrowed */
  cph_record_free(&cph_seal_desc, &r);
  cph_pact_tree_free(&tree);
  uint64_t id;
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
  id = cph_be64_get(k.data + k.len - 8);
  op->u.context.seal_id = id;
}

void context_ops_apply(cph_engine *e, cph_op *op) {
  const char *id = op->u.context.session;
  csession *s = id ? engine_session(e, id) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "id", "no session '%s'", id ? id : "");
    return;
  }
  switch (op->kind) {
  case CPH_OP_CONTEXT_INSERT:
    context_insert(e, op, s);
    break;
  case CPH_OP_CONTEXT_DELETE:
    context_delete(e, op, s);
    break;
  default:
    context_seal(e, op, s);
    break;
  }
}

/* ---------------------------------------------------------------- reads */

static int load_for_read(cph_engine *e, const char *session, cph_pact_tree *tree, cph_err *err) {
  if (!engine_session(e, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", session);
  cph_txn t;
  int rc = cph_txn_begin(e->env.store, false, &t);
  if (rc == CPH_OK)
    rc = pact_load(e, &t, session, tree);
  if (rc)
    cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  cph_txn_abort(&t);
  return rc;
}

int cph_engine_context(cph_engine *e, const char *session, const char *selector,
                       cph_context_node_info **out, size_t *n, uint64_t *episode, cph_err *err) {
  *out = NULL;
  *n = 0;
  cph_selector *sel = NULL;
  if (selector) {
    int prc = cph_selector_parse(selector, &sel, err);
    if (prc)
      return err->code = prc == CPH_EPARSE ? CPH_EINVAL : prc; /* a bad request, 400 */
  }
  cph_pact_tree tree;
  int rc = load_for_read(e, session, &tree, err);
  if (rc == CPH_OK) {
    *episode = tree.episode;
    rc = tree_nodes(&tree, sel, out, n);
    /* read between passes, so it is the committed tree: kept for the session's next turn */
    pact_keep(e, session, &tree);
    cph_pact_tree_free(&tree);
  }
  cph_selector_free(sel);
  return rc;
}

int cph_engine_context_step(cph_engine *e, const char *session, size_t episodes,
                            cph_context_step **out, cph_err *err) {
  *out = NULL;
  if (episodes == 0 || episodes > 1000)
    return cph_err_set(err, CPH_EINVAL, "episodes: expected 1 to 1000");
  cph_pact_tree tree;
  int rc = load_for_read(e, session, &tree, err);
  if (rc)
    return rc;
  *out = calloc(episodes, sizeof **out);
  for (size_t i = 0; *out && i < episodes && rc == CPH_OK; i++) {
    cph_pact_step(&tree, 0); /* on a private copy of the stored tree: nothing is written */
    (*out)[i].episode = tree.episode;
    rc = tree_nodes(&tree, NULL, &(*out)[i].nodes, &(*out)[i].n);
  }
  cph_pact_tree_free(&tree);
  if (!*out)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  return rc;
}

void cph_context_steps_free(cph_context_step *steps, size_t n) {
  for (size_t i = 0; steps && i < n; i++)
    cph_context_nodes_free(steps[i].nodes, steps[i].n);
  free(steps);
}

void cph_seals_free(cph_seal_info *seals, size_t n) {
  for (size_t i = 0; seals && i < n; i++) {
    free(seals[i].trigger);
    for (size_t j = 0; j < seals[i].n_messages; j++) {
      free(seals[i].messages[j].role);
      free(seals[i].messages[j].content);
      free(seals[i].messages[j].coord);
      free(seals[i].messages[j].name);
    }
    free(seals[i].messages);
  }
  free(seals);
}

int cph_engine_seals(cph_engine *e, const char *session, cph_seal_info **out, size_t *n,
                     cph_err *err) {
  *out = NULL;
  *n = 0;
  if (!engine_session(e, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", session);
  cph_txn t;
  int rc = cph_txn_begin(e->env.store, false, &t);
  cph_cursor c;
  cph_val k, v;
  cph_key start = node_key(session, 0);
  size_t prefix = strlen(session) + 1, cap = 0;
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_SEALS, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, &start, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    if (k.len != prefix + 8 || memcmp(k.data, start.data, prefix) != 0)
      break;
    cph_seal_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_seal_desc, v.data, v.len, &r, &derr))
      continue;
    if (*n == cap) {
      cap = cap ? cap * 2 : 8;
      cph_seal_info *p = realloc(*out, cap * sizeof *p);
      if (!p) {
        cph_record_free(&cph_seal_desc, &r);
        rc = CPH_ENOMEM;
        break;
      }
      *out = p;
    }
    cph_seal_info *si = &(*out)[(*n)++];
    memset(si, 0, sizeof *si);
    si->id = r.id;
    si->trigger = r.trigger;
    r.trigger = NULL;
    si->episode = r.episode;
    si->created_ms = r.created_ms;
    si->messages = calloc(r.n_roles ? r.n_roles : 1, sizeof *si->messages);
    for (uint32_t i = 0; si->messages && i < r.n_roles && i < r.n_contents && i < r.n_coords; i++) {
      si->messages[i].role = r.roles[i];
      si->messages[i].content = r.contents[i];
      si->messages[i].coord = r.coords[i];
      r.roles[i] = r.contents[i] = r.coords[i] = NULL;
      si->n_messages = i + 1;
    }
    cph_record_free(&cph_seal_desc, &r);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  return CPH_OK;
}
