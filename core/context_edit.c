/* The context operations and reads (context_edit.h) over the tree store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "context_edit.h"
#include "handover.h"
#include "ops.h"
#include "seals.h"

#define TREE_NODES_MAX 4096 /* a session's tree; inserts beyond it are refused (413) */

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

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

static void context_insert(cph_context *cx, cph_op *op, csession *s) {
  if (op->u.context.node.n_lifecycle > 32) {
    op_fail(op, CPH_ELIMIT, "lifecycle", "lifecycle: at most 32 stages");
    return;
  }
  cph_pact_stage stages[32];
  cph_pact_node proto;
  if (parse_node(op, &proto, stages))
    return;
  cph_txn t;
  cph_txn_begin_child(&cx->env->txn, &t);
  cph_pact_tree tree;
  int rc = trees_load(cx->trees, &t, s->id, &tree);
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
    else if ((rc = trees_save(cx->trees, &t, s->id, &tree)) != CPH_OK || cph_txn_commit(&t) != CPH_OK)
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
  } else if ((rc = trees_save(cx->trees, &t, s->id, &tree)) != CPH_OK || cph_txn_commit(&t) != CPH_OK) {
    op_fail(op, t.ret ? t.ret : rc, NULL, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  }
  if (t.mdb)
    cph_txn_abort(&t);
  cph_pact_tree_free(&tree);
}

static void context_delete(cph_context *cx, cph_op *op, csession *s) {
  cph_txn t;
  cph_txn_begin_child(&cx->env->txn, &t);
  cph_pact_tree tree;
  int rc = trees_load(cx->trees, &t, s->id, &tree);
  if (rc == CPH_OK && cph_pact_delete(&tree, op->u.context.node_id) != CPH_OK)
    rc = op_fail(op, CPH_ENOTFOUND, "node", "no context node %llu in '%s'",
                 (unsigned long long)op->u.context.node_id, s->id);
  else if (rc == CPH_OK)
    rc = trees_save(cx->trees, &t, s->id, &tree);
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

/* Cluster mode: the session's state after an edit or a seal (seal_id: the seal, then also given
 * as an item), for the cluster log: the answer waits until the log holds it, as a completion's
 * does (server/clusterflow.h 11.), so a node inserted, a node deleted or a seal made and
 * answered 200 moves with its session even when no completion follows it. A failure leaves
 * u.context.state NULL and is logged (the change stands here; the log keeps the session's
 * previous state, and its next completion carries the change). */
static void state_to_op(cph_context *cx, const csession *s, cph_op *op, uint64_t seal_id) {
  cph_buf b = {0};
  cph_handover st = {cx->env, cx->sessions, cx->trees, cx->memory, NULL};
  int rc = handover_export(&st, s, &b);
  if (rc == CPH_OK && !cph_buf_error(&b)) {
    op->u.context.state_len = b.len;
    op->u.context.state = (uint8_t *)cph_buf_steal(&b);
    if (seal_id && (rc = handover_seal_item(&st, s->id, seal_id, &op->u.context.items)))
      cph_log(CPH_LOG_WARN, "reading seal %llu of session '%s' for the cluster log: %s (the "
              "state carries the newest)", (unsigned long long)seal_id, s->id, cph_strerror(rc));
  } else {
    cph_log(CPH_LOG_WARN, "reading the state of session '%s' for the cluster log after %s: %s",
            s->id, seal_id ? "a seal" : "a change of its context",
            cph_strerror(rc ? rc : CPH_ENOMEM));
  }
  cph_buf_free(&b);
}

static void context_seal(cph_context *cx, cph_op *op, csession *s) {
  const char *trigger = op->u.context.trigger;
  if (!trigger || !*trigger || strlen(trigger) > 128) {
    op_fail(op, CPH_EINVAL, "trigger", "trigger: a name of 1 to 128 bytes");
    return;
  }
  cph_txn t;
  cph_txn_begin_child(&cx->env->txn, &t);
  cph_pact_tree tree;
  int rc = trees_load(cx->trees, &t, s->id, &tree);
  if (rc) {
    op_fail(op, rc, NULL, "%s", t.err.msg);
    cph_txn_abort(&t);
    return;
  }
  cph_seal_rec r = {0};
  r.session = s->id;
  r.trigger = (char *)trigger;
  r.episode = s->episode;
  r.created_ms = cph_wall_ms();
  render_messages(&tree, &r);
  seals_put(&t, &r);
  r.session = r.trigger = NULL; /* borrowed */
  uint64_t id = r.id;
  cph_record_free(&cph_seal_desc, &r);
  cph_pact_tree_free(&tree);
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
  op->u.context.seal_id = id;
  if (cx->env->report_consumed)
    state_to_op(cx, s, op, id);
}

void context_ops_apply(cph_context *cx, cph_op *op) {
  const char *id = op->u.context.session;
  csession *s = id ? sessions_get(cx->sessions, id) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "id", "no session '%s'", id ? id : "");
    return;
  }
  switch (op->kind) {
  case CPH_OP_CONTEXT_INSERT:
    context_insert(cx, op, s);
    break;
  case CPH_OP_CONTEXT_DELETE:
    context_delete(cx, op, s);
    break;
  default:
    context_seal(cx, op, s);
    return;
  }
  if (op->rc == CPH_OK && cx->env->report_consumed)
    state_to_op(cx, s, op, 0);
}

/* ---------------------------------------------------------------- reads */

static int load_for_read(cph_context *cx, const char *session, cph_pact_tree *tree, cph_err *err) {
  if (!sessions_get(cx->sessions, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", session);
  cph_txn t;
  int rc = cph_txn_begin(cx->env->store, false, &t);
  if (rc == CPH_OK)
    rc = trees_load(cx->trees, &t, session, tree);
  if (rc)
    cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  cph_txn_abort(&t);
  return rc;
}

int context_nodes(cph_context *cx, const char *session, const char *selector,
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
  int rc = load_for_read(cx, session, &tree, err);
  if (rc == CPH_OK) {
    *episode = tree.episode;
    rc = tree_nodes(&tree, sel, out, n);
    /* read between passes, so it is the committed tree: kept for the session's next turn */
    trees_keep(cx->trees, session, &tree);
    cph_pact_tree_free(&tree);
  }
  cph_selector_free(sel);
  return rc;
}

int context_step_preview(cph_context *cx, const char *session, size_t episodes,
                         cph_context_step **out, cph_err *err) {
  *out = NULL;
  if (episodes == 0 || episodes > 1000)
    return cph_err_set(err, CPH_EINVAL, "episodes: expected 1 to 1000");
  cph_pact_tree tree;
  int rc = load_for_read(cx, session, &tree, err);
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
    free(seals[i].origin);
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

int context_seals(cph_context *cx, const char *session, cph_seal_info **out, size_t *n,
                  cph_err *err) {
  *out = NULL;
  *n = 0;
  if (!sessions_get(cx->sessions, session))
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", session);
  cph_txn t;
  int rc = cph_txn_begin(cx->env->store, false, &t);
  cph_cursor c;
  cph_val k, v;
  cph_key start = seals_key(session, 0);
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
    char origin[SEALS_ORIGIN_MAX];
    seals_origin(origin, cx->env->reply_origin_node, &r);
    si->origin = origin[0] ? strdup(origin) : NULL;
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
