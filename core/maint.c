#define _GNU_SOURCE
/* Maintenance jobs (DESIGN §2, §7); contracts in maint.h. The gc steps are in gc.c, below:
 * they are handed gc_job_write to queue their next step and return what a commit changed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "maint.h"
#include "providers.h"

#define EMBED_BATCH_MAX 256
#define RETENTION_SCAN_PER_JOB 20000

static const char *const job_names[CPH_JOBK_COUNT] = {
    "embed_memory", "aggregate_upsert", "gc_plan", "gc_summarize", "gc_commit", "outbox_drain",
    "retention_redact_events"};

const char *cph_job_kind_name(cph_job_kind_t k) {
  return (unsigned)k < CPH_JOBK_COUNT ? job_names[k] : "unknown";
}

int cph_job_kind_parse(const char *name, cph_job_kind_t *out) {
  for (int i = 0; i < CPH_JOBK_COUNT; i++)
    if (name && strcmp(name, job_names[i]) == 0) {
      *out = (cph_job_kind_t)i;
      return CPH_OK;
    }
  return CPH_EINVAL;
}

void cph_job_work_free(cph_job_work *w) {
  if (!w)
    return;
  for (size_t i = 0; i < w->n_items; i++) {
    if (w->texts)
      free(w->texts[i]);
    if (w->scopes)
      free(w->scopes[i]);
  }
  free(w->texts);
  free(w->scopes);
  free(w->memory_ids);
  free(w->vectors);
  free(w->summary);
  free(w->outbox_ids);
  free(w->model);
  free(w->confirmed);
  free(w);
}

/* ---------------------------------------------------------------- execute (worker thread) */

/* The batch's vectors to the HTTP index, one upsert per shard (cph_vindex_shard), shards in
 * ascending order: one request touches one partition. The first failure fails the batch (it
 * is embedded and sent again whole: upserts are idempotent). */
static int upsert_by_shard(const cph_policy *p, const cph_job_work *w, cph_err *err) {
  cph_vitem *items = calloc(w->n_items, sizeof *items);
  if (!items)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  int64_t shards = p->vector_index.shards;
  int rc = CPH_OK;
  for (int64_t shard = 0; rc == CPH_OK && shard < (shards > 1 ? shards : 1); shard++) {
    size_t n = 0;
    for (size_t i = 0; i < w->n_items; i++)
      if (cph_vindex_shard(w->memory_ids[i], shards) == (uint32_t)shard)
        items[n++] =
            (cph_vitem){w->memory_ids[i], w->scopes[i], w->vectors + i * w->dims, w->dims};
    if (n)
      rc = cph_vindex_remote_upsert(w->providers, &p->vector_index, (uint32_t)shard, items, n,
                                    err);
  }
  free(items);
  return rc;
}

void cph_job_execute(const cph_policy *p, cph_job_work *w) {
  cph_err err = {0};
  w->rc = CPH_OK;
  switch (w->kind) {
  case CPH_JOBK_EMBED_MEMORY:
    if (!w->n_items)
      break;
    if (p->providers.embeddings.kind == CPH_POLICY_PROVIDER_BUILTIN) {
      for (size_t i = 0; i < w->n_items; i++)
        cph_embed_builtin(w->texts[i], w->dims, w->vectors + i * w->dims);
    } else {
      w->rc = cph_embed_remote(w->providers, &p->providers.embeddings,
                               (const char *const *)w->texts, w->n_items, w->vectors, &err);
    }
    if (w->rc == CPH_OK && w->remote_index)
      w->rc = upsert_by_shard(p, w, &err);
    break;
  case CPH_JOBK_GC_SUMMARIZE:
    if (p->providers.summarizer.kind == CPH_POLICY_PROVIDER_BUILTIN)
      w->summary = cph_summarize_extractive((const char *const *)w->texts, w->n_items,
                                            (size_t)p->providers.summarizer.max_tokens);
    else
      w->rc = cph_summarize_remote(w->providers, &p->providers.summarizer,
                                   (const char *const *)w->texts, w->n_items, &w->summary, &err);
    if (w->rc == CPH_OK && !w->summary)
      w->rc = CPH_ENOMEM;
    break;
  case CPH_JOBK_OUTBOX_DRAIN:
    if (w->remote_index && w->n_items)
      w->rc = cph_vindex_remote_delete(w->providers, &p->vector_index, w->shard, w->model,
                                       w->memory_ids, w->n_items, w->confirmed, &err);
    /* the embedded index is deleted from in the apply pass: it lives in LMDB */
    break;
  default:
    break; /* the other jobs are all LMDB work, done in the apply pass */
  }
  if (w->rc)
    snprintf(w->error, sizeof w->error, "%.255s", err.msg[0] ? err.msg : cph_strerror(w->rc));
}

/* ---------------------------------------------------------------- the job queue */

static int push_job(csession *s, uint64_t id) {
  if (s->n_jobs == s->cap_jobs) {
    uint32_t cap = s->cap_jobs ? s->cap_jobs * 2 : 8;
    uint64_t *p = realloc(s->jobs, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    s->jobs = p;
    s->cap_jobs = cap;
  }
  s->jobs[s->n_jobs++] = id;
  return CPH_OK;
}

static void remove_job(csession *s, uint64_t id) {
  for (uint32_t i = 0; i < s->n_jobs; i++)
    if (s->jobs[i] == id) {
      memmove(&s->jobs[i], &s->jobs[i + 1], (s->n_jobs - i - 1) * sizeof *s->jobs);
      s->n_jobs--;
      return;
    }
}

int maint_job_write(cph_maint *m, cph_txn *t, cph_job_kind_t kind, const char *args,
                    uint64_t group_id, uint64_t *id_out) {
  csession *s = sessions_get(m->sessions, "janitor");
  if (!s)
    return cph_err_set(&t->err, CPH_ESTATE,
                       "no maintenance session: enable :sessions :janitor? to run jobs");
  uint64_t id = 0;
  int rc = cph_txn_next_id(t, "job", &id);
  if (rc)
    return rc;
  cph_job_rec j = {0};
  j.id = id;
  j.session = s->id;
  j.kind = (uint8_t)kind;
  j.state = CPH_JOB_QUEUED;
  j.args = (char *)args;
  j.group_id = group_id;
  j.created_ms = cph_wall_ms();
  cph_key k = cph_key_of_u64(id);
  rc = cph_txn_put_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
  if (rc)
    return rc;
  if (m->n_pending == m->cap_pending) {
    size_t cap = m->cap_pending ? m->cap_pending * 2 : 16;
    maint_pending_job *p = realloc(m->pending, cap * sizeof *p);
    if (!p)
      return cph_err_set(&t->err, CPH_ENOMEM, "out of memory queueing a job");
    m->pending = p;
    m->cap_pending = cap;
  }
  m->pending[m->n_pending++] = (maint_pending_job){s, id, kind};
  *id_out = id;
  return CPH_OK;
}

/* gc's way to queue its next step (gc.h: gc_jobs). */
static int gc_job_write(void *ctx, cph_txn *t, cph_job_kind_t kind, const char *args,
                        uint64_t group_id) {
  uint64_t id;
  return maint_job_write(ctx, t, kind, args, group_id, &id);
}

/* A job whose record committed joins its session's queue. */
static void job_queued(cph_maint *m, csession *s, uint64_t job_id, cph_job_kind_t kind) {
  if (push_job(s, job_id) == CPH_OK)
    m->queued[kind]++;
  if (kind == CPH_JOBK_OUTBOX_DRAIN)
    cph_sched_set_trickle(m->env->sched, s->sid, true); /* §3.5: a batch is owed */
  sessions_update_work(m->sessions, s);
}

void maint_pending_apply(cph_maint *m) {
  for (size_t i = 0; m && i < m->n_pending; i++)
    job_queued(m, m->pending[i].session, m->pending[i].id, m->pending[i].kind);
  if (m)
    m->n_pending = 0;
}

void maint_pending_drop(cph_maint *m) {
  if (m)
    m->n_pending = 0;
}

int maint_enqueue(cph_maint *m, cph_job_kind_t kind, const char *args, uint64_t group_id,
                  uint64_t *id_out) {
  cph_txn t;
  cph_txn_begin_child(&m->env->txn, &t);
  uint64_t id = 0;
  int rc = maint_job_write(m, &t, kind, args, group_id, &id);
  if (rc) {
    cph_txn_abort(&t);
    maint_pending_drop(m);
    return rc;
  }
  rc = cph_txn_commit(&t);
  if (rc) {
    maint_pending_drop(m);
    return rc;
  }
  maint_pending_apply(m);
  if (id_out)
    *id_out = id;
  return CPH_OK;
}

/* ---------------------------------------------------------------- prepare */

static int prepare_embed(const cph_policy *p, cph_txn *t, cph_job_work *w) {
  size_t limit = (size_t)p->maintenance.embeddings.batch_size;
  if (limit > EMBED_BATCH_MAX)
    limit = EMBED_BATCH_MAX;
  w->dims = (uint32_t)p->providers.embeddings.dimensions;
  w->memory_ids = calloc(limit, sizeof *w->memory_ids);
  w->texts = calloc(limit, sizeof *w->texts);
  w->scopes = calloc(limit, sizeof *w->scopes);
  w->remote_index = p->vector_index.kind == CPH_POLICY_INDEX_HTTP;
  if (!w->memory_ids || !w->texts || !w->scopes)
    return CPH_ENOMEM;
  size_t n = 0;
  int rc = memory_embed_pending(t, w->memory_ids, limit, &n);
  if (rc)
    return rc;
  for (size_t i = 0; i < n; i++) {
    cph_key mk = cph_key_of_u64(w->memory_ids[i]);
    cph_memory_rec m;
    if (cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK)
      break;
    w->texts[w->n_items] = strdup(m.text);
    w->scopes[w->n_items] = strdup(m.session);
    w->n_items++;
    cph_record_free(&cph_memory_desc, &m);
  }
  w->vectors = calloc(w->n_items ? w->n_items * w->dims : 1, sizeof *w->vectors);
  return w->vectors ? CPH_OK : CPH_ENOMEM;
}

/* One batch of pending, due outbox items of a single model and shard, oldest first. */
static int prepare_outbox(const cph_policy *p, cph_txn *t, cph_job_work *w) {
  size_t limit = (size_t)p->maintenance.outbox.batch_size;
  int64_t now = cph_wall_ms();
  w->outbox_ids = calloc(limit, sizeof *w->outbox_ids);
  w->memory_ids = calloc(limit, sizeof *w->memory_ids);
  w->confirmed = calloc(limit, sizeof *w->confirmed);
  w->remote_index = p->vector_index.kind == CPH_POLICY_INDEX_HTTP;
  if (!w->outbox_ids || !w->memory_ids || !w->confirmed)
    return CPH_ENOMEM;
  cph_cursor c;
  cph_val k, v;
  int rc = cph_cursor_open(t, CPH_DB_OUTBOX, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK && w->n_items < limit;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_outbox_rec o;
    cph_err derr;
    if (cph_record_decode(&cph_outbox_desc, v.data, v.len, &o, &derr))
      continue;
    bool take = o.status == CPH_OUTBOX_PENDING && o.next_attempt_ms <= now &&
                (!w->model || (strcmp(o.model, w->model) == 0 && o.shard == w->shard));
    if (take) {
      if (!w->model) {
        w->model = strdup(o.model);
        w->shard = o.shard;
      }
      w->outbox_ids[w->n_items] = o.id;
      w->memory_ids[w->n_items] = o.memory_id;
      w->n_items++;
    }
    cph_record_free(&cph_outbox_desc, &o);
  }
  cph_cursor_close(&c);
  return rc == CPH_OK || rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

int maint_job_start(cph_maint *m, cph_txn *t, csession *s, bool trickle, uint64_t turn_id,
                    cph_job_work **work_out, uint64_t *job_id_out) {
  (void)turn_id;
  if (!s->n_jobs)
    return CPH_ENOTFOUND;
  /* The trickle runs the outbox batch; otherwise jobs go in order. */
  uint64_t job_id = s->jobs[0];
  cph_job_rec j;
  cph_key k;
  int rc;
  for (uint32_t i = 0; i < s->n_jobs; i++) {
    k = cph_key_of_u64(s->jobs[i]);
    rc = cph_txn_get_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
    if (rc)
      return rc;
    if (!trickle || j.kind == CPH_JOBK_OUTBOX_DRAIN) {
      job_id = s->jobs[i];
      break;
    }
    cph_record_free(&cph_job_desc, &j);
    if (i + 1 == s->n_jobs)
      return CPH_ENOTFOUND;
  }
  cph_job_work *w = calloc(1, sizeof *w);
  if (!w) {
    cph_record_free(&cph_job_desc, &j);
    return CPH_ENOMEM;
  }
  w->job_id = job_id;
  w->kind = (cph_job_kind_t)j.kind;
  w->group_id = j.group_id;
  w->providers = m->env->providers;
  switch (w->kind) {
  case CPH_JOBK_EMBED_MEMORY:
    rc = prepare_embed(m->env->policy, t, w);
    break;
  case CPH_JOBK_OUTBOX_DRAIN:
    rc = prepare_outbox(m->env->policy, t, w);
    break;
  case CPH_JOBK_GC_SUMMARIZE:
    rc = gc_summarize_prepare(&m->gc, t, j.group_id, w);
    break;
  default:
    rc = CPH_OK; /* applied in the completion pass */
    break;
  }
  if (rc == CPH_OK) {
    j.state = CPH_JOB_RUNNING;
    j.attempts++;
    rc = cph_txn_put_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
  }
  cph_record_free(&cph_job_desc, &j);
  if (rc) {
    cph_job_work_free(w);
    return rc;
  }
  *work_out = w;
  *job_id_out = job_id;
  return CPH_OK;
}

void maint_job_started(cph_maint *m, csession *s, uint64_t job_id) {
  (void)m;
  s->running_job = job_id;
}

/* ---------------------------------------------------------------- apply */

static int64_t backoff_ms(const cph_policy *p, uint32_t attempts) {
  double base = (double)p->maintenance.outbox.backoff_base_ms;
  double max = (double)p->maintenance.outbox.backoff_max_ms;
  double d = base * pow(2.0, attempts > 30 ? 30 : (double)attempts - 1);
  if (d > max)
    d = max;
  /* full jitter in [d/2, d): retries of many items spread out instead of arriving together */
  double jitter = 0.5 + 0.5 * ((double)(random() % 1000000) / 1e6);
  return (int64_t)(d * jitter);
}

static int apply_embed(cph_memory *mem, cph_txn *t, const cph_job_work *w) {
  for (size_t i = 0; i < w->n_items; i++) {
    cph_key mk = cph_key_of_u64(w->memory_ids[i]);
    memory_embed_unqueue(t, w->memory_ids[i]);
    cph_memory_rec m;
    if (cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK)
      continue;
    if (m.embed_status == CPH_EMBED_PENDING && !m.deleted) {
      if (!w->remote_index)
        cph_vindex_put(t, m.session, m.id, w->vectors + i * w->dims, w->dims);
      m.embed_status = CPH_EMBED_READY;
      memory_put(mem, t, &m);
    }
    cph_record_free(&cph_memory_desc, &m);
  }
  return t->ret;
}

/* created_ms of the oldest pending outbox item as t sees it, 0 if none: after a drain the
 * oldest may have gone, and cephalon_outbox_oldest_age_seconds must not keep counting from it.
 * Ids ascend with creation; the scan costs what prepare_outbox's own scan from the start does. */
static int64_t outbox_oldest_pending_ms(cph_txn *t) {
  cph_cursor c;
  cph_val k, v;
  int64_t oldest = 0;
  int rc = cph_cursor_open(t, CPH_DB_OUTBOX, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK && !oldest;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_outbox_rec o;
    cph_err derr;
    if (cph_record_decode(&cph_outbox_desc, v.data, v.len, &o, &derr))
      continue;
    if (o.status == CPH_OUTBOX_PENDING)
      oldest = o.created_ms ? o.created_ms : 1;
    cph_record_free(&cph_outbox_desc, &o);
  }
  cph_cursor_close(&c);
  return oldest;
}

static int apply_outbox(const cph_policy *p, cph_memory *mem, cph_txn *t,
                        const cph_job_work *w, uint64_t *done_out) {
  int64_t now = cph_wall_ms();
  uint64_t done = 0;
  for (size_t i = 0; i < w->n_items; i++) {
    cph_key ok = cph_key_of_u64(w->outbox_ids[i]);
    cph_outbox_rec o;
    if (cph_txn_get_record(t, CPH_DB_OUTBOX, &ok, &cph_outbox_desc, &o) != CPH_OK)
      continue;
    cph_key mk = cph_key_of_u64(o.memory_id);
    cph_memory_rec m;
    bool have_m = cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) == CPH_OK;
    bool confirmed = false;
    if (!w->remote_index) {
      /* the embedded index: the delete is ours to do, here, in this transaction */
      int rc = have_m ? cph_vindex_del(t, m.session, o.memory_id) : CPH_ENOTFOUND;
      confirmed = rc == CPH_OK || rc == CPH_ENOTFOUND;
    } else {
      confirmed = w->rc == CPH_OK && w->confirmed[i];
    }
    if (confirmed) {
      /* done only after the index confirmed (DESIGN §7) */
      o.status = CPH_OUTBOX_DONE;
      o.done_ms = now;
      done++;
      if (have_m) {
        m.embed_status = CPH_EMBED_DELETED;
        memory_put(mem, t, &m);
      }
    } else {
      o.attempts++;
      o.next_attempt_ms = now + backoff_ms(p, o.attempts);
      char *old = o.last_error;
      o.last_error = (char *)(w->rc ? w->error : "not confirmed by the index");
      cph_txn_put_record(t, CPH_DB_OUTBOX, &ok, &cph_outbox_desc, &o);
      o.last_error = old;
    }
    if (confirmed)
      cph_txn_put_record(t, CPH_DB_OUTBOX, &ok, &cph_outbox_desc, &o);
    if (have_m)
      cph_record_free(&cph_memory_desc, &m);
    cph_record_free(&cph_outbox_desc, &o);
  }
  *done_out = done;
  return t->ret;
}

/* One bounded slice of the events, oldest ids first, wrapping around: payloads past
 * :payload-keep-days go (hash and metadata stay), records past :metadata-keep-days go. */
static int apply_retention(cph_maint *m, cph_txn *t) {
  int64_t now = cph_wall_ms();
  cph_cursor c;
  cph_val k, v;
  cph_key start = cph_key_of_u64(m->retention_cursor);
  int rc = cph_cursor_open(t, CPH_DB_EVENTS, &c);
  int scanned = 0;
  uint64_t last = 0;
  for (rc = rc ? rc : cph_cursor_seek(&c, &start, &k, &v);
       rc == CPH_OK && scanned < RETENTION_SCAN_PER_JOB; rc = cph_cursor_next(&c, &k, &v)) {
    scanned++;
    cph_event_rec ev;
    cph_err derr;
    if (k.len != 8 || cph_record_decode(&cph_event_desc, v.data, v.len, &ev, &derr))
      continue;
    last = ev.id;
    const cph_policy_retention *keep = cph_policy_retention_for(m->env->policy, ev.channel);
    int64_t age_ms = now - ev.received_ms;
    if (age_ms > keep->metadata_keep_days * 86400000LL) {
      cph_record_free(&cph_event_desc, &ev);
      cph_evcache_drop(m->evcache, last); /* the cache never shows what the store lost */
      rc = cph_cursor_del(&c);
      if (rc)
        break;
      continue;
    }
    if (ev.body && age_ms > keep->payload_keep_days * 86400000LL) {
      /* the payload goes; the hash, sender, channel, times and family stay */
      free(ev.body);
      ev.body = NULL;
      cph_key ek = cph_key_of_u64(ev.id);
      cph_evcache_drop(m->evcache, ev.id);
      rc = cph_txn_put_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev);
      cph_record_free(&cph_event_desc, &ev);
      if (rc)
        break;
      /* a put can move the cursor's page: find our place again */
      rc = cph_cursor_seek(&c, &ek, &k, &v);
      if (rc)
        break;
      continue;
    }
    cph_record_free(&cph_event_desc, &ev);
  }
  cph_cursor_close(&c);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND)
    return rc;
  /* wrap around at the end so old events behind a long-kept channel are seen again */
  m->retention_cursor = rc == CPH_ENOTFOUND ? 0 : last + 1;
  return CPH_OK;
}

/* The aggregate memory of a family carries the tag "family:<id>" (memory_tag_family). Looked
 * for among the "other" (non-raw) memories of the scope: O(summaries and aggregates of one
 * channel), for a maintenance job. 0 when there is none. */
static uint64_t family_memory_find(cph_txn *t, const char *scope, const char *tag) {
  memory_scope_cursor c;
  if (memory_scope_open(t, scope, false, &c))
    return 0;
  uint64_t found = 0;
  for (int rc = memory_scope_oldest(&c); rc == CPH_OK && c.id && !found;
       rc = memory_scope_newer(&c)) {
    uint64_t id = c.id;
    cph_key mk = cph_key_of_u64(id);
    cph_memory_rec m;
    if (cph_txn_get_record(t, CPH_DB_MEMORIES, &mk, &cph_memory_desc, &m) != CPH_OK)
      continue;
    for (uint32_t i = 0; i < m.n_tags && !found; i++)
      if (!m.deleted && m.kind == CPH_MEMORY_AGGREGATE && strcmp(m.tags[i], tag) == 0)
        found = id;
    cph_record_free(&cph_memory_desc, &m);
  }
  memory_scope_close(&c);
  return found;
}

/* aggregate_upsert: the family's one aggregate memory reflects its current count — updated in
 * place (DESIGN §5: one memory per family, never a new one per run); minted only when the
 * family has none yet. */
static int apply_aggregate_upsert(cph_maint *m, cph_txn *t, const char *args) {
  uint64_t family = args && strncmp(args, "family=", 7) == 0 ? strtoull(args + 7, NULL, 10) : 0;
  if (!family)
    return CPH_OK;
  cph_key fk = cph_key_of_u64(family);
  cph_aggregate_rec a;
  int rc = cph_txn_get_record(t, CPH_DB_AGGREGATES, &fk, &cph_aggregate_desc, &a);
  if (rc)
    return rc == CPH_ENOTFOUND ? CPH_OK : rc;
  char *text = NULL;
  if (asprintf(&text, "[aggregate] %llu similar messages in %s: %s",
               (unsigned long long)a.dup_count, a.n_channels ? a.channels[0] : "?", a.sample) < 0)
    text = NULL;
  char scope[300], tag[32];
  snprintf(scope, sizeof scope, "#%s", a.n_channels ? a.channels[0] : "");
  memory_family_tag(family, tag);
  uint64_t id = family_memory_find(t, scope, tag);
  if (!text) {
    rc = CPH_ENOMEM;
  } else if (id) {
    rc = memory_set_text(m->memory, t, id, text);
  } else {
    rc = memory_mint(m->memory, t, scope, CPH_MEMORY_AGGREGATE, text, 0, false, &id);
    if (rc == CPH_OK)
      rc = memory_add_tag(m->memory, t, id, tag);
  }
  free(text);
  cph_record_free(&cph_aggregate_desc, &a);
  return rc;
}

void maint_outbox_queued(cph_maint *m, uint64_t n, int64_t now_ms) {
  if (n && !m->outbox_pending)
    m->outbox_oldest_ms = now_ms;
  m->outbox_pending += n;
}

/* What a gc_commit changed, counted (the maintenance stats) and the outbox items it queued. */
static void note_gc_commit(cph_maint *m, const gc_commit_result *r) {
  m->groups_committed_total++;
  m->summaries_created_total++;
  m->memories_deleted_total += r->deleted;
  maint_outbox_queued(m, r->outbox_items, r->now_ms);
}

int maint_job_apply(cph_maint *m, cph_txn *t, csession *s, uint64_t job_id, cph_job_work *w,
                    uint64_t *compacted) {
  (void)s;
  *compacted = 0;
  cph_key k = cph_key_of_u64(job_id);
  cph_job_rec j;
  int rc = cph_txn_get_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
  if (rc)
    return rc;
  uint64_t outbox_done = 0;
  if (w && w->rc) {
    rc = CPH_OK; /* the executed part failed: recorded on the job; outbox items back off */
    if (j.kind == CPH_JOBK_OUTBOX_DRAIN)
      rc = apply_outbox(m->env->policy, m->memory, t, w, &outbox_done);
  } else {
    switch (j.kind) {
    case CPH_JOBK_EMBED_MEMORY:
      rc = w ? apply_embed(m->memory, t, w) : CPH_OK;
      break;
    case CPH_JOBK_OUTBOX_DRAIN:
      rc = w ? apply_outbox(m->env->policy, m->memory, t, w, &outbox_done) : CPH_OK;
      break;
    case CPH_JOBK_GC_PLAN:
      rc = gc_plan_apply(&m->gc, t, j.args);
      break;
    case CPH_JOBK_GC_SUMMARIZE:
      rc = w ? gc_summarize_apply(&m->gc, t, j.group_id, w) : CPH_OK;
      break;
    case CPH_JOBK_GC_COMMIT: {
      gc_commit_result res;
      rc = gc_commit_apply(&m->gc, t, j.group_id, &res);
      if (rc == CPH_OK && res.committed) {
        note_gc_commit(m, &res);
        *compacted = j.group_id;
      }
      break;
    }
    case CPH_JOBK_RETENTION_REDACT_EVENTS:
      rc = apply_retention(m, t);
      break;
    case CPH_JOBK_AGGREGATE_UPSERT:
      rc = apply_aggregate_upsert(m, t, j.args);
      break;
    }
  }
  /* The job itself failed without spoiling the txn (a gc_plan naming a deleted or unknown
   * memory): it ends failed with the reason. Returning the error instead left it "running"
   * for ever — the completion ignores it — and ran it again at every restart. */
  const char *own_error = NULL;
  if (rc != CPH_OK && !t->ret) {
    own_error = t->err.code == rc && t->err.msg[0] ? t->err.msg : cph_strerror(rc);
    rc = CPH_OK;
  }
  j.state = (w && w->rc) || own_error ? CPH_JOB_FAILED : CPH_JOB_DONE;
  j.finished_ms = cph_wall_ms();
  char *old = j.error;
  j.error = w && w->rc ? w->error : (char *)own_error;
  if (rc == CPH_OK)
    rc = cph_txn_put_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
  j.error = old;
  if (j.kind == CPH_JOBK_OUTBOX_DRAIN && rc == CPH_OK)
    m->outbox_pending -= outbox_done < m->outbox_pending ? outbox_done : m->outbox_pending;
  if (j.kind == CPH_JOBK_OUTBOX_DRAIN && rc == CPH_OK && outbox_done)
    m->outbox_oldest_ms = outbox_oldest_pending_ms(t);
  if (j.kind == CPH_JOBK_EMBED_MEMORY && rc == CPH_OK && w && !w->rc)
    memory_embed_queue_done(m->memory, w->n_items);
  if (j.kind == CPH_JOBK_EMBED_MEMORY && w && w->rc)
    /* the embedder or index is failing: try again after a drain interval, not every pass */
    m->next_embed_ns =
        env_now(m->env) + m->env->policy->maintenance.outbox.drain_interval_s * CPH_NS_PER_S;
  cph_record_free(&cph_job_desc, &j);
  return rc;
}

void maint_job_finished(cph_maint *m, csession *s, uint64_t job_id) {
  (void)m; /* the per-kind counts are recomputed by maint_tick from the queue */
  remove_job(s, job_id);
  s->running_job = 0;
}

int maint_job_retry(cph_maint *m, cph_txn *t, csession *s, uint64_t job_id, const char *error,
                    bool *failed) {
  cph_key k = cph_key_of_u64(job_id);
  cph_job_rec j;
  int rc = cph_txn_get_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
  if (rc)
    return rc;
  *failed = j.attempts >= (uint32_t)m->env->policy->leases.max_attempts;
  j.state = *failed ? CPH_JOB_FAILED : CPH_JOB_QUEUED;
  char *old = j.error;
  j.error = (char *)error;
  if (*failed)
    j.finished_ms = cph_wall_ms();
  rc = cph_txn_put_record(t, CPH_DB_JOBS, &k, &cph_job_desc, &j);
  j.error = old;
  cph_record_free(&cph_job_desc, &j);
  (void)s;
  return rc;
}

/* ---------------------------------------------------------------- schedules */

void maint_tick(cph_maint *m) {
  csession *janitor = m ? sessions_get(m->sessions, "janitor") : NULL;
  if (!janitor)
    return;
  int64_t now = env_now(m->env);
  /* Reading the pass txn's view: jobs queued in this pass are visible to it. */
  uint64_t counts[CPH_JOBK_COUNT] = {0};
  for (uint32_t i = 0; i < janitor->n_jobs; i++) {
    cph_key k = cph_key_of_u64(janitor->jobs[i]);
    cph_job_rec j;
    if (cph_txn_get_record(&m->env->txn, CPH_DB_JOBS, &k, &cph_job_desc, &j) == CPH_OK) {
      counts[j.kind]++;
      cph_record_free(&cph_job_desc, &j);
    }
  }
  memcpy(m->queued, counts, sizeof counts);
  const cph_policy *p = m->env->policy;
  if (now >= m->next_gc_plan_ns) {
    if (!counts[CPH_JOBK_GC_PLAN])
      maint_enqueue(m, CPH_JOBK_GC_PLAN, NULL, 0, NULL);
    m->next_gc_plan_ns = now + p->gc.plan_interval_s * CPH_NS_PER_S;
  }
  if (now >= m->next_retention_ns) {
    if (!counts[CPH_JOBK_RETENTION_REDACT_EVENTS])
      maint_enqueue(m, CPH_JOBK_RETENTION_REDACT_EVENTS, NULL, 0, NULL);
    m->next_retention_ns = now + p->maintenance.retention.interval_s * CPH_NS_PER_S;
  }
  if (m->outbox_pending && !counts[CPH_JOBK_OUTBOX_DRAIN] && now >= m->next_drain_ns) {
    maint_enqueue(m, CPH_JOBK_OUTBOX_DRAIN, NULL, 0, NULL);
    m->next_drain_ns = now + p->maintenance.outbox.drain_interval_s * CPH_NS_PER_S;
  }
  if (memory_embed_queue(m->memory) && !counts[CPH_JOBK_EMBED_MEMORY] && now >= m->next_embed_ns)
    maint_enqueue(m, CPH_JOBK_EMBED_MEMORY, NULL, 0, NULL);
  /* §3.5: the trickle is owed while the outbox has work; dropping the flag between batches
   * would forfeit the catch-up of batches the scheduler owes. */
  cph_sched_set_trickle(m->env->sched, janitor->sid,
                        m->outbox_pending > 0 && counts[CPH_JOBK_OUTBOX_DRAIN] > 0);
}

/* ---------------------------------------------------------------- open / close */

int maint_open(cph_core_env *env, cph_sessions *sessions, cph_memory *memory,
               cph_evcache *evcache, cph_maint **out, cph_err *err) {
  cph_maint *m = calloc(1, sizeof *m);
  *out = m;
  if (!m)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  m->env = env;
  m->sessions = sessions;
  m->memory = memory;
  m->evcache = evcache;
  m->gc = (cph_gc){env, memory, {m, gc_job_write}};
  int64_t now = env_now(env);
  m->next_gc_plan_ns = now + env->policy->gc.plan_interval_s * CPH_NS_PER_S;
  m->next_retention_ns = now + env->policy->maintenance.retention.interval_s * CPH_NS_PER_S;
  m->next_drain_ns = now;
  cph_txn t;
  int rc = cph_txn_begin(env->store, true, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  cph_cursor c;
  cph_val k, v;
  /* Jobs queued or running at shutdown are queued again (a running one lost its lease). */
  rc = cph_cursor_open(&t, CPH_DB_JOBS, &c);
  uint64_t *requeue = NULL;
  size_t n_requeue = 0, cap = 0;
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_job_rec j;
    cph_err derr;
    if (cph_record_decode(&cph_job_desc, v.data, v.len, &j, &derr))
      continue;
    if (j.state == CPH_JOB_QUEUED || j.state == CPH_JOB_RUNNING) {
      csession *s = sessions_get(sessions, j.session);
      if (s && push_job(s, j.id) == CPH_OK) {
        m->queued[j.kind]++;
        if (j.state == CPH_JOB_RUNNING && n_requeue == cap) {
          cap = cap ? cap * 2 : 8;
          uint64_t *p = realloc(requeue, cap * sizeof *p);
          if (p)
            requeue = p;
        }
        if (j.state == CPH_JOB_RUNNING && n_requeue < cap)
          requeue[n_requeue++] = j.id;
      }
    }
    cph_record_free(&cph_job_desc, &j);
  }
  cph_cursor_close(&c);
  for (size_t i = 0; i < n_requeue; i++) {
    cph_key jk = cph_key_of_u64(requeue[i]);
    cph_job_rec j;
    if (cph_txn_get_record(&t, CPH_DB_JOBS, &jk, &cph_job_desc, &j) == CPH_OK) {
      j.state = CPH_JOB_QUEUED;
      cph_txn_put_record(&t, CPH_DB_JOBS, &jk, &cph_job_desc, &j);
      cph_record_free(&cph_job_desc, &j);
    }
  }
  free(requeue);
  /* Counters derived from the store. */
  rc = cph_cursor_open(&t, CPH_DB_OUTBOX, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_outbox_rec o;
    cph_err derr;
    if (cph_record_decode(&cph_outbox_desc, v.data, v.len, &o, &derr))
      continue;
    if (o.status == CPH_OUTBOX_PENDING) {
      m->outbox_pending++;
      if (!m->outbox_oldest_ms || o.created_ms < m->outbox_oldest_ms)
        m->outbox_oldest_ms = o.created_ms;
    }
    cph_record_free(&cph_outbox_desc, &o);
  }
  cph_cursor_close(&c);
  /* A row per ingest request's run of ids (memory.h): ten million events are about ten
   * thousand rows to walk here, not ten million. */
  uint64_t queued = 0;
  if (memory_embed_count(&t, &queued) == CPH_OK)
    memory_embed_queue_set(memory, queued);
  rc = cph_txn_commit(&t);
  if (rc)
    return cph_err_set(err, rc, "loading maintenance jobs: %s", t.err.msg);
  sessions_update_work_all(sessions);
  return CPH_OK;
}

void maint_close(cph_maint *m) {
  if (m)
    free(m->pending);
  free(m);
}

/* ---------------------------------------------------------------- reads */

static const char *job_state_name(uint8_t s) {
  static const char *const names[] = {"queued", "running", "done", "failed"};
  return s < 4 ? names[s] : "unknown";
}

void cph_job_info_free(cph_job_info *j) {
  free(j->session);
  free(j->args);
  free(j->error);
  memset(j, 0, sizeof *j);
}

int maint_jobs(cph_store *store, const char *state, size_t limit, cph_job_info **out, size_t *n,
               cph_err *err) {
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
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_JOBS, &c);
  cph_key end = cph_key_of_u64(UINT64_MAX);
  if (rc == CPH_OK) {
    rc = cph_cursor_seek(&c, &end, &k, &v);
    rc = rc == CPH_OK || rc == CPH_ENOTFOUND ? cph_cursor_prev(&c, &k, &v) : rc;
  }
  for (; rc == CPH_OK && *n < limit; rc = cph_cursor_prev(&c, &k, &v)) {
    cph_job_rec j;
    cph_err derr;
    if (cph_record_decode(&cph_job_desc, v.data, v.len, &j, &derr))
      continue;
    if (!state || strcmp(state, job_state_name(j.state)) == 0) {
      cph_job_info *ji = &(*out)[(*n)++];
      ji->id = j.id;
      ji->kind = cph_job_kind_name((cph_job_kind_t)j.kind);
      ji->state = job_state_name(j.state);
      ji->session = j.session;
      ji->args = j.args;
      ji->group_id = j.group_id;
      ji->attempts = j.attempts;
      ji->created_ms = j.created_ms;
      ji->finished_ms = j.finished_ms;
      ji->error = j.error;
      j.session = j.args = j.error = NULL;
    }
    cph_record_free(&cph_job_desc, &j);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  return rc == CPH_OK || rc == CPH_ENOTFOUND ? CPH_OK : cph_err_set(err, rc, "%s", t.err.msg);
}

void cph_outbox_info_free(cph_outbox_info *o) {
  free(o->model);
  free(o->last_error);
  memset(o, 0, sizeof *o);
}

int maint_outbox(cph_store *store, const char *status, size_t limit, cph_outbox_info **out,
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
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_OUTBOX, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK && *n < limit;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_outbox_rec o;
    cph_err derr;
    if (cph_record_decode(&cph_outbox_desc, v.data, v.len, &o, &derr))
      continue;
    const char *st = o.status == CPH_OUTBOX_PENDING ? "pending" : "done";
    if (!status || strcmp(status, st) == 0) {
      cph_outbox_info *oi = &(*out)[(*n)++];
      oi->id = o.id;
      oi->op = "vector_delete";
      oi->status = st;
      oi->memory_id = o.memory_id;
      oi->model = o.model;
      oi->shard = o.shard;
      oi->attempts = o.attempts;
      oi->created_ms = o.created_ms;
      oi->next_attempt_ms = o.next_attempt_ms;
      oi->done_ms = o.done_ms;
      oi->last_error = o.last_error;
      o.model = o.last_error = NULL;
    }
    cph_record_free(&cph_outbox_desc, &o);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  return rc == CPH_OK || rc == CPH_ENOTFOUND ? CPH_OK : cph_err_set(err, rc, "%s", t.err.msg);
}

void maint_stats(const cph_maint *m, cph_maint_stats *out) {
  memset(out, 0, sizeof *out);
  if (!m)
    return;
  out->outbox_pending = m->outbox_pending;
  out->outbox_oldest_age_seconds = m->outbox_pending && m->outbox_oldest_ms
                                       ? (double)(cph_wall_ms() - m->outbox_oldest_ms) / 1000.0
                                       : 0;
  out->embed_queue = memory_embed_queue(m->memory);
  out->groups_committed_total = m->groups_committed_total;
  out->memories_deleted_total = m->memories_deleted_total;
  out->summaries_created_total = m->summaries_created_total;
}
