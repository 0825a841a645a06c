/* Compaction (DESIGN §7): gc_plan -> gc_summarize -> gc_commit, with plan locks and the
 * group-hash gate. Contracts in gc.h. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "gc.h"
#include "providers.h"

#define SCOPES_PER_PLAN 256

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

void gc_group_hash(const uint64_t *sorted_ids, size_t n, int64_t newest_ts_ms,
                   uint64_t total_tokens, char out[65]) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  unsigned char digest[32];
  unsigned len = 0;
  char num[32];
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  for (size_t i = 0; i < n; i++) {
    int w = snprintf(num, sizeof num, "%s%llu", i ? "," : "", (unsigned long long)sorted_ids[i]);
    EVP_DigestUpdate(ctx, num, (size_t)w);
  }
  int w = snprintf(num, sizeof num, "|%lld|", (long long)newest_ts_ms);
  EVP_DigestUpdate(ctx, num, (size_t)w);
  w = snprintf(num, sizeof num, "%llu", (unsigned long long)total_tokens);
  EVP_DigestUpdate(ctx, num, (size_t)w);
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  out[64] = '\0';
}

/* ---------------------------------------------------------------- plan */

typedef struct builder {
  char *scope;
  uint64_t *ids;
  size_t n, cap;
  int64_t newest_ms;
  uint64_t tokens;
} builder;

/* Writes one planned group over ids (taking their plan locks) and queues its gc_summarize. */
static int write_group(const cph_gc *gc, cph_txn *t, const char *scope, uint64_t *ids, size_t n,
                       int64_t newest_ms, uint64_t tokens) {
  qsort(ids, n, sizeof *ids, cmp_u64);
  uint64_t gid = 0;
  int rc = cph_txn_next_id(t, "gc_group", &gid);
  if (rc)
    return rc;
  cph_gc_group_rec g = {0};
  char hash[65];
  gc_group_hash(ids, n, newest_ms, tokens, hash);
  g.id = gid;
  g.session = (char *)scope;
  g.state = CPH_GC_PLANNED;
  g.source_ids = ids;
  g.n_source_ids = (uint32_t)n;
  g.newest_ts_ms = newest_ms;
  g.total_tokens_est = tokens;
  g.group_hash = hash;
  g.created_ms = g.updated_ms = cph_wall_ms();
  cph_key gk = cph_key_of_u64(gid);
  rc = cph_txn_put_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, &g);
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    cph_key mk = cph_key_of_u64(ids[i]);
    cph_memory_rec m;
    rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (rc)
      break;
    m.gc_group = gid; /* the plan lock */
    rc = memory_put(gc->memory, t, &m);
    cph_record_free(&cph_memory_desc, &m);
  }
  if (rc == CPH_OK)
    rc = gc->jobs.write(gc->jobs.ctx, t, CPH_JOBK_GC_SUMMARIZE, NULL, gid);
  return rc;
}

/* "sources=3,4,5": an explicit plan of chosen memories (an operator's compaction, and how two
 * overlapping plans can exist: an explicit plan takes its sources' locks even when another
 * planned group holds them, and the commit gate decides which group wins). */
static int plan_explicit(const cph_gc *gc, cph_txn *t, const char *list) {
  uint64_t ids[1024];
  size_t n = 0;
  for (const char *p = list; *p && n < 1024;) {
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p)
      return cph_err_set(&t->err, CPH_EINVAL, "gc_plan: sources must be memory ids, e.g. 3,4,5");
    ids[n++] = v;
    p = *end == ',' ? end + 1 : end;
  }
  if (n < 2)
    return cph_err_set(&t->err, CPH_EINVAL, "gc_plan: a group needs at least two sources");
  int64_t newest = 0;
  uint64_t tokens = 0;
  char *scope = NULL;
  int rc = CPH_OK;
  for (size_t i = 0; i < n && rc == CPH_OK; i++) {
    cph_key mk = cph_key_of_u64(ids[i]);
    cph_memory_rec m;
    rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (rc == CPH_ENOTFOUND)
      rc = cph_err_set(&t->err, CPH_EINVAL, "gc_plan: no memory %llu", (unsigned long long)ids[i]);
    if (rc)
      break;
    if (m.deleted)
      rc = cph_err_set(&t->err, CPH_EINVAL, "gc_plan: memory %llu is deleted",
                       (unsigned long long)ids[i]);
    if (m.created_ms > newest)
      newest = m.created_ms;
    tokens += m.tokens_est;
    if (!scope)
      scope = strdup(m.session);
    cph_record_free(&cph_memory_desc, &m);
  }
  if (rc == CPH_OK)
    rc = write_group(gc, t, scope ? scope : "", ids, n, newest, tokens);
  free(scope);
  return rc;
}

/* The automatic plan's groups being built, one per scope (at most SCOPES_PER_PLAN). */
typedef struct plan_state {
  const cph_gc *gc;
  cph_txn *t;
  int64_t cutoff; /* created at or before it: old enough */
  builder *bs;
  size_t nb;
  int64_t groups;
} plan_state;

/* Whether m is a candidate of the automatic plan (below). */
static bool plan_candidate(const plan_state *ps, const cph_memory_rec *m) {
  const cph_policy_gc *g = &ps->gc->env->policy->gc;
  uint64_t pending = 0;
  int64_t last_ms;
  memaccess_pending(&ps->gc->memory->access, m->id, &pending, &last_ms);
  return m->kind == CPH_MEMORY_RAW && !m->deleted && !m->gc_group && m->created_ms <= ps->cutoff &&
         m->access_count + pending <= (uint64_t)g->max_access;
}

/* Adds candidate m to its scope's group, writing the group first when m would take it past
 * :group-max-tokens (a group of at least two goes; a lone oversized memory just restarts). */
static int plan_add(plan_state *ps, const cph_memory_rec *m) {
  builder *b = NULL;
  for (size_t i = 0; i < ps->nb; i++)
    if (strcmp(ps->bs[i].scope, m->session) == 0)
      b = &ps->bs[i];
  if (!b && ps->nb < SCOPES_PER_PLAN) {
    b = &ps->bs[ps->nb++];
    b->scope = strdup(m->session);
  }
  if (!b)
    return CPH_OK;
  int rc = CPH_OK;
  if (b->n && b->tokens + m->tokens_est > (uint64_t)ps->gc->env->policy->gc.group_max_tokens) {
    if (b->n >= 2) {
      rc = write_group(ps->gc, ps->t, b->scope, b->ids, b->n, b->newest_ms, b->tokens);
      ps->groups++;
    }
    b->n = 0;
    b->tokens = 0;
    b->newest_ms = 0;
  }
  if (rc == CPH_OK && b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 16;
    uint64_t *p = realloc(b->ids, cap * sizeof *p);
    if (p) {
      b->ids = p;
      b->cap = cap;
    }
  }
  if (rc == CPH_OK && b->n < b->cap) {
    b->ids[b->n++] = m->id;
    b->tokens += m->tokens_est;
    if (m->created_ms > b->newest_ms)
      b->newest_ms = m->created_ms;
  }
  return rc;
}

/* Collects an adopted memory's id (memory_adopted_from) into a cph_buf of uint64_t. */
static int note_adopted(void *ctx, uint64_t id) {
  cph_buf_append(ctx, &id, sizeof id);
  return cph_buf_error(ctx) ? CPH_ENOMEM : CPH_OK;
}

/* The automatic plan: raw, undeleted, unlocked memories older than :gc :min-age-hours with
 * access_count <= :gc :max-access (accesses not yet written into the record included:
 * memaccess.h), grouped per scope in creation order, at most
 * :group-max-tokens a group and :max-groups-per-plan groups. Memories are read in id order,
 * which is creation order for those minted here, so the read stops at the first one minted
 * here too young; then it reads the memories adopted from other nodes (memory_adopted_from:
 * their ids are new here, their ages what they were) with ids past that one. Cost: every
 * memory before that point, as always, plus those adopted after it — at most what the node
 * adopted in the last :min-age-hours once its own memories keep coming. */
static int plan_auto(const cph_gc *gc, cph_txn *t) {
  const cph_policy_gc *g = &gc->env->policy->gc;
  plan_state ps = {gc, t, cph_wall_ms() - (int64_t)(g->min_age_hours * 3600000.0),
                   calloc(SCOPES_PER_PLAN, sizeof(builder)), 0, 0};
  uint64_t young = 0; /* the first memory minted here too young to plan; 0: none */
  int rc = ps.bs ? CPH_OK : CPH_ENOMEM;
  cph_cursor c;
  cph_val k, v;
  if (rc == CPH_OK)
    rc = cph_cursor_open(t, CPH_DB_MEMORIES, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v);
       rc == CPH_OK && ps.groups < g->max_groups_per_plan; rc = cph_cursor_next(&c, &k, &v)) {
    cph_memory_rec m;
    cph_err derr;
    if (cph_record_decode(&cph_memory_desc, v.data, v.len, &m, &derr))
      continue;
    if (plan_candidate(&ps, &m))
      rc = plan_add(&ps, &m);
    else if (m.created_ms > ps.cutoff && !memory_is_adopted(t, m.id))
      young = m.id; /* ids follow creation time here: nothing later minted here is old enough */
    cph_record_free(&cph_memory_desc, &m);
    if (young)
      break;
  }
  if (ps.bs)
    cph_cursor_close(&c);
  if (rc == CPH_ENOTFOUND)
    rc = CPH_OK;
  cph_buf adopted = {0};
  if (rc == CPH_OK && young && ps.groups < g->max_groups_per_plan)
    rc = memory_adopted_from(t, young, note_adopted, &adopted);
  for (size_t i = 0; rc == CPH_OK && i < adopted.len / 8 && ps.groups < g->max_groups_per_plan;
       i++) {
    uint64_t id;
    memcpy(&id, adopted.data + 8 * i, 8);
    cph_key mk = cph_key_of_u64(id);
    cph_memory_rec m;
    int grc = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (grc == CPH_OK && plan_candidate(&ps, &m))
      rc = plan_add(&ps, &m);
    if (grc == CPH_OK)
      cph_record_free(&cph_memory_desc, &m);
    else if (grc != CPH_ENOTFOUND && grc != CPH_EINVAL)
      rc = grc;
  }
  cph_buf_free(&adopted);
  for (size_t i = 0; i < ps.nb; i++) {
    if (rc == CPH_OK && ps.bs[i].n >= 2 && ps.groups < g->max_groups_per_plan) {
      rc = write_group(gc, t, ps.bs[i].scope, ps.bs[i].ids, ps.bs[i].n, ps.bs[i].newest_ms,
                       ps.bs[i].tokens);
      ps.groups++;
    }
    free(ps.bs[i].scope);
    free(ps.bs[i].ids);
  }
  free(ps.bs);
  if (ps.groups)
    cph_log(CPH_LOG_INFO, "gc_plan: %lld group(s) planned", (long long)ps.groups);
  return rc;
}

int gc_plan_apply(const cph_gc *gc, cph_txn *t, const char *args) {
  if (args && strncmp(args, "sources=", 8) == 0)
    return plan_explicit(gc, t, args + 8);
  return plan_auto(gc, t);
}

/* ---------------------------------------------------------------- summarize */

int gc_summarize_prepare(const cph_gc *gc, cph_txn *t, uint64_t group_id, cph_job_work *w) {
  (void)gc;
  cph_key gk = cph_key_of_u64(group_id);
  cph_gc_group_rec g;
  int rc = cph_txn_get_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, &g);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  if (g.state == CPH_GC_PLANNED) {
    w->texts = calloc(g.n_source_ids ? g.n_source_ids : 1, sizeof *w->texts);
    for (uint32_t i = 0; w->texts && i < g.n_source_ids; i++) {
      cph_key mk = cph_key_of_u64(g.source_ids[i]);
      cph_memory_rec m;
      if (cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK)
        continue;
      w->texts[w->n_items++] = strdup(m.text);
      cph_record_free(&cph_memory_desc, &m);
    }
  }
  cph_record_free(&cph_gc_group_desc, &g);
  return CPH_OK;
}

int gc_summarize_apply(const cph_gc *gc, cph_txn *t, uint64_t group_id, const cph_job_work *w) {
  cph_key gk = cph_key_of_u64(group_id);
  cph_gc_group_rec g;
  int rc = cph_txn_get_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, &g);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  if (g.state == CPH_GC_PLANNED && w->summary) {
    char *old = g.summary_text;
    g.summary_text = w->summary;
    g.state = CPH_GC_SUMMARIZED;
    g.updated_ms = cph_wall_ms();
    rc = cph_txn_put_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, &g);
    g.summary_text = old;
    if (rc == CPH_OK)
      rc = gc->jobs.write(gc->jobs.ctx, t, CPH_JOBK_GC_COMMIT, NULL, group_id);
  }
  cph_record_free(&cph_gc_group_desc, &g);
  return rc;
}

/* ---------------------------------------------------------------- commit */

/* Aborts group g: releases the plan locks it holds and queues a new gc_plan. */
static int abort_group(const cph_gc *gc, cph_txn *t, cph_gc_group_rec *g, const char *why) {
  for (uint32_t i = 0; i < g->n_source_ids; i++) {
    cph_key mk = cph_key_of_u64(g->source_ids[i]);
    cph_memory_rec m;
    if (cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK)
      continue;
    if (m.gc_group == g->id) {
      m.gc_group = 0;
      memory_put(gc->memory, t, &m);
    }
    cph_record_free(&cph_memory_desc, &m);
  }
  g->state = CPH_GC_ABORTED;
  g->updated_ms = cph_wall_ms();
  cph_key gk = cph_key_of_u64(g->id);
  int rc = cph_txn_put_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, g);
  if (rc == CPH_OK)
    rc = gc->jobs.write(gc->jobs.ctx, t, CPH_JOBK_GC_PLAN, NULL, 0);
  cph_log(CPH_LOG_INFO, "gc_commit: group %llu aborted (%s); planning again",
          (unsigned long long)g->id, why);
  return rc;
}

int gc_tombstone(cph_memory *mem, const cph_policy *policy, cph_txn *t, cph_memory_rec *m,
                 uint64_t replaced_by, int64_t now_ms, uint64_t *outbox_items) {
  int rc = CPH_OK;
  m->deleted = true; /* the tombstone: the record stays, its text is never served again */
  m->replaced_by = replaced_by;
  if (m->embed_status == CPH_EMBED_READY) {
    uint64_t oid = 0;
    rc = cph_txn_next_id(t, "outbox", &oid);
    cph_outbox_rec o = {0};
    o.id = oid;
    o.op = CPH_OUTBOX_VECTOR_DELETE;
    o.status = CPH_OUTBOX_PENDING;
    o.memory_id = m->id;
    o.model = policy->providers.embeddings.model;
    o.shard = cph_vindex_shard(m->id, policy->vector_index.shards);
    o.created_ms = o.next_attempt_ms = now_ms;
    cph_key ok = cph_key_of_u64(oid);
    if (rc == CPH_OK)
      rc = cph_txn_put_record(t, CPH_DB_OUTBOX, &ok, &cph_outbox_desc, &o);
    (*outbox_items)++;
  } else if (m->embed_status == CPH_EMBED_PENDING) {
    memory_embed_unqueue(t, m->id); /* never embed what is already gone */
    m->embed_status = CPH_EMBED_DELETED;
    memory_embed_queue_done(mem, 1);
  }
  if (rc == CPH_OK)
    rc = memory_put(mem, t, m);
  return rc;
}

int gc_commit_apply(const cph_gc *gc, cph_txn *t, uint64_t group_id, gc_commit_result *out) {
  *out = (gc_commit_result){0};
  cph_key gk = cph_key_of_u64(group_id);
  cph_gc_group_rec g;
  int rc = cph_txn_get_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, &g);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc; /* the group is gone: nothing to commit */
  if (g.state != CPH_GC_SUMMARIZED || !g.summary_text) {
    rc = g.state == CPH_GC_PLANNED ? abort_group(gc, t, &g, "not summarised") : CPH_OK;
    cph_record_free(&cph_gc_group_desc, &g);
    return rc;
  }
  /* Recompute the gate from the sources as they are now. */
  uint64_t *ids = malloc((g.n_source_ids ? g.n_source_ids : 1) * sizeof *ids);
  memcpy(ids, g.source_ids, g.n_source_ids * sizeof *ids);
  qsort(ids, g.n_source_ids, sizeof *ids, cmp_u64);
  int64_t newest = 0;
  uint64_t tokens = 0;
  const char *why = NULL;
  for (uint32_t i = 0; i < g.n_source_ids && !why; i++) {
    cph_key mk = cph_key_of_u64(ids[i]);
    cph_memory_rec m;
    if (cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK) {
      why = "a source no longer exists";
      break;
    }
    if (m.deleted)
      why = "a source was deleted by another group";
    if (m.created_ms > newest)
      newest = m.created_ms;
    tokens += m.tokens_est;
    cph_record_free(&cph_memory_desc, &m);
  }
  char hash[65];
  gc_group_hash(ids, g.n_source_ids, newest, tokens, hash);
  if (!why && strcmp(hash, g.group_hash) != 0)
    why = "the group hash changed";
  free(ids);
  if (why) {
    rc = abort_group(gc, t, &g, why);
    cph_record_free(&cph_gc_group_desc, &g);
    return rc;
  }

  uint64_t summary_id = 0;
  rc = memory_mint(gc->memory, t, g.session, CPH_MEMORY_SUMMARY, g.summary_text, 0, true,
                   &summary_id);
  uint64_t outbox_items = 0;
  int64_t now = cph_wall_ms();
  for (uint32_t i = 0; rc == CPH_OK && i < g.n_source_ids; i++) {
    cph_key mk = cph_key_of_u64(g.source_ids[i]);
    cph_memory_rec m;
    rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m);
    if (rc)
      break;
    rc = gc_tombstone(gc->memory, gc->env->policy, t, &m, summary_id, now, &outbox_items);
    cph_record_free(&cph_memory_desc, &m);
  }
  if (rc == CPH_OK) {
    g.state = CPH_GC_COMMITTED;
    g.summary_id = summary_id;
    g.updated_ms = now;
    rc = cph_txn_put_record(t, CPH_DB_GC_GROUPS, &gk, &cph_gc_group_desc, &g);
  }
  if (rc == CPH_OK) {
    *out = (gc_commit_result){true, g.n_source_ids, outbox_items, now};
    cph_log(CPH_LOG_INFO, "gc_commit: group %llu committed: %u memories -> summary %llu",
            (unsigned long long)g.id, g.n_source_ids, (unsigned long long)summary_id);
  }
  cph_record_free(&cph_gc_group_desc, &g);
  return rc;
}

/* ---------------------------------------------------------------- reads */

static const char *gc_state_name(uint8_t s) {
  static const char *const names[] = {"planned", "summarized", "committed", "aborted"};
  return s < 4 ? names[s] : "unknown";
}

void cph_gc_group_info_free(cph_gc_group_info *g) {
  free(g->source_ids);
  free(g->session);
  memset(g, 0, sizeof *g);
}

static void group_info_take(cph_gc_group_rec *r, cph_gc_group_info *out) {
  out->group_id = r->id;
  out->state = gc_state_name(r->state);
  out->source_ids = r->source_ids;
  out->n_source_ids = r->n_source_ids;
  out->newest_ts_ms = r->newest_ts_ms;
  out->total_tokens_est = r->total_tokens_est;
  snprintf(out->group_hash, sizeof out->group_hash, "%s", r->group_hash);
  out->summary_id = r->summary_id;
  out->session = r->session;
  r->source_ids = NULL;
  r->n_source_ids = 0;
  r->session = NULL;
}

int gc_group(cph_store *store, uint64_t id, cph_gc_group_info *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  cph_key k = cph_key_of_u64(id);
  cph_gc_group_rec r;
  if (rc == CPH_OK)
    rc = cph_txn_get_record(&t, CPH_DB_GC_GROUPS, &k, &cph_gc_group_desc, &r);
  if (rc == CPH_OK) {
    group_info_take(&r, out);
    cph_record_free(&cph_gc_group_desc, &r);
  } else if (rc == CPH_ENOTFOUND) {
    cph_err_set(err, rc, "no gc group %llu", (unsigned long long)id);
  } else {
    cph_err_set(err, rc, "%s", t.err.msg);
  }
  cph_txn_abort(&t);
  return rc;
}

int gc_groups(cph_store *store, const char *state, size_t limit, cph_gc_group_info **out,
              size_t *n, cph_err *err) {
  if (!limit || limit > 1000)
    limit = limit ? 1000 : 100;
  *n = 0;
  *out = calloc(limit, sizeof **out);
  if (!*out)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  cph_cursor c;
  cph_val k, v;
  cph_key end = cph_key_of_u64(UINT64_MAX);
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_GC_GROUPS, &c);
  if (rc == CPH_OK) {
    rc = cph_cursor_seek(&c, &end, &k, &v);
    rc = rc == CPH_OK || rc == CPH_ENOTFOUND ? cph_cursor_prev(&c, &k, &v) : rc;
  }
  for (; rc == CPH_OK && *n < limit; rc = cph_cursor_prev(&c, &k, &v)) {
    cph_gc_group_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_gc_group_desc, v.data, v.len, &r, &derr))
      continue;
    if (!state || strcmp(state, gc_state_name(r.state)) == 0)
      group_info_take(&r, &(*out)[(*n)++]);
    cph_record_free(&cph_gc_group_desc, &r);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  return rc == CPH_OK || rc == CPH_ENOTFOUND ? CPH_OK : cph_err_set(err, rc, "%s", t.err.msg);
}
