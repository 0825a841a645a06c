/* Maintenance and memory routes (DESIGN §9):
 *   POST /v1/maintenance/jobs {job, args?}   -> 202 {"job_id"}
 *   GET  /v1/maintenance/jobs?state=&limit=  -> {"jobs": [...]}
 *   GET  /v1/gc/groups?state=&limit=         -> {"groups": [group]}
 *   GET  /v1/gc/groups/{id}                  -> group
 *   GET  /v1/outbox?status=&limit=           -> {"items": [...], "pending", "oldest_age_seconds"}
 *   GET  /v1/memories/search?session=&q=&k=  -> {"memories": [{id, kind, text, score, session,
 *                                                created_ms}], "degraded"?: true}
 *                                                (counts as an access; core/search.c ranks) */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "routes.h"
#include "search_prep.h"
#include "server.h"

/* A job's args object as the engine's "key=value" text: {"group": 12} -> "group=12",
 * {"sources": [3, 4]} -> "sources=3,4"; the first key only (every job takes one). */
const char *cph_job_args_text(cph_req *r, json_t *args, const char *path) {
  if (!args)
    return NULL;
  const char *key;
  json_t *v;
  json_object_foreach(args, key, v) {
    char buf[4096];
    size_t len = (size_t)snprintf(buf, sizeof buf, "%s=", key);
    if (len >= sizeof buf) { /* the key alone fills buf: appending the value would overrun it */
      cph_req_fail(r, 413, "too_large", path, "%s is too long", path);
      return NULL;
    }
    if (json_is_integer(v)) {
      len += (size_t)snprintf(buf + len, sizeof buf - len, "%lld", (long long)json_integer_value(v));
    } else if (json_is_string(v)) {
      len += (size_t)snprintf(buf + len, sizeof buf - len, "%s", json_string_value(v));
    } else if (json_is_array(v)) {
      for (size_t i = 0; i < json_array_size(v) && len < sizeof buf; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) {
          char f[160];
          snprintf(f, sizeof f, "%s.%s[%zu]", path, key, i);
          cph_req_fail(r, 400, "bad_request", f, "%s: expected an integer", f);
          return NULL;
        }
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%lld", i ? "," : "",
                                (long long)json_integer_value(x));
      }
    } else {
      char f[160];
      snprintf(f, sizeof f, "%s.%s", path, key);
      cph_req_fail(r, 400, "bad_request", f, "%s: expected an integer, a string or a list", f);
      return NULL;
    }
    if (len >= sizeof buf) {
      cph_req_fail(r, 413, "too_large", path, "%s is too long", path);
      return NULL;
    }
    char *out = cph_req_alloc(r, len + 1);
    if (out)
      memcpy(out, buf, len + 1);
    return out;
  }
  return NULL;
}

static void job_done(cph_req *r) {
  if (r->op.rc) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "job_id", cph_json_u64(r->op.u.job.job_id));
  cph_reply_json(r, 202, o);
}

void cph_route_job_post(cph_req *r) {
  const char *job = NULL;
  json_t *args = NULL;
  cph_in_str(r, r->body, "", "job", CPH_IN_REQUIRED, &job);
  cph_in_obj(r, r->body, "", "args", 0, &args);
  const char *text = r->error.set ? NULL : cph_job_args_text(r, args, "args");
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  r->op.u.job.in.job = (char *)job;
  r->op.u.job.in.args = (char *)text;
  cph_req_submit(r, CPH_OP_JOB_ENQUEUE, job_done);
}

static json_t *u64_array(const uint64_t *v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, cph_json_u64(v[i]));
  return a;
}

void cph_route_jobs_list(cph_req *r) {
  uint64_t limit;
  if (!cph_query_u64(r, "limit", 100, 1000, &limit)) {
    cph_reply_failure(r);
    return;
  }
  cph_job_info *jobs;
  size_t n;
  cph_err err;
  int rc = cph_engine_jobs(r->srv->engine, cph_req_query(r, "state"), (size_t)limit, &jobs, &n, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_u64(jobs[i].id));
    json_object_set_new(o, "job", json_string(jobs[i].kind));
    json_object_set_new(o, "state", json_string(jobs[i].state));
    json_object_set_new(o, "session", cph_json_str(jobs[i].session));
    json_object_set_new(o, "args", cph_json_str(jobs[i].args));
    json_object_set_new(o, "group_id", jobs[i].group_id ? cph_json_u64(jobs[i].group_id) : json_null());
    json_object_set_new(o, "attempts", json_integer(jobs[i].attempts));
    json_object_set_new(o, "created_ms", json_integer(jobs[i].created_ms));
    json_object_set_new(o, "finished_ms", jobs[i].finished_ms ? json_integer(jobs[i].finished_ms) : json_null());
    json_object_set_new(o, "error", cph_json_str(jobs[i].error));
    json_array_append_new(arr, o);
    cph_job_info_free(&jobs[i]);
  }
  free(jobs);
  json_t *body = json_object();
  json_object_set_new(body, "jobs", arr);
  cph_reply_json(r, 200, body);
}

static json_t *group_json(const cph_gc_group_info *g) {
  json_t *o = json_object();
  json_object_set_new(o, "group_id", cph_json_u64(g->group_id));
  json_object_set_new(o, "state", json_string(g->state));
  json_object_set_new(o, "source_ids", u64_array(g->source_ids, g->n_source_ids));
  json_object_set_new(o, "newest_ts_ms", json_integer(g->newest_ts_ms));
  json_object_set_new(o, "total_tokens_est", cph_json_u64(g->total_tokens_est));
  json_object_set_new(o, "group_hash", json_string(g->group_hash));
  json_object_set_new(o, "summary_id", g->summary_id ? cph_json_u64(g->summary_id) : json_null());
  json_object_set_new(o, "session", cph_json_str(g->session));
  return o;
}

void cph_route_gc_groups(cph_req *r) {
  uint64_t limit;
  if (!cph_query_u64(r, "limit", 100, 1000, &limit)) {
    cph_reply_failure(r);
    return;
  }
  cph_gc_group_info *groups;
  size_t n;
  cph_err err;
  int rc = cph_engine_gc_groups(r->srv->engine, cph_req_query(r, "state"), (size_t)limit, &groups,
                                &n, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_array_append_new(arr, group_json(&groups[i]));
    cph_gc_group_info_free(&groups[i]);
  }
  free(groups);
  json_t *body = json_object();
  json_object_set_new(body, "groups", arr);
  cph_reply_json(r, 200, body);
}

void cph_route_gc_group(cph_req *r) {
  char *end;
  unsigned long long id = strtoull(r->params[0], &end, 10);
  if (*end || !id) {
    cph_reply_error(r, 400, "bad_request", "id", "id: expected a group id");
    return;
  }
  cph_gc_group_info g;
  cph_err err;
  int rc = cph_engine_gc_group(r->srv->engine, id, &g, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : NULL);
    return;
  }
  json_t *o = group_json(&g);
  cph_gc_group_info_free(&g);
  cph_reply_json(r, 200, o);
}

void cph_route_outbox(cph_req *r) {
  uint64_t limit;
  if (!cph_query_u64(r, "limit", 100, 1000, &limit)) {
    cph_reply_failure(r);
    return;
  }
  cph_outbox_info *items;
  size_t n;
  cph_err err;
  int rc = cph_engine_outbox(r->srv->engine, cph_req_query(r, "status"), (size_t)limit, &items,
                             &n, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, NULL);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_u64(items[i].id));
    json_object_set_new(o, "op", json_string(items[i].op));
    json_object_set_new(o, "status", json_string(items[i].status));
    json_object_set_new(o, "memory_id", cph_json_u64(items[i].memory_id));
    json_object_set_new(o, "model", cph_json_str(items[i].model));
    json_object_set_new(o, "shard", json_integer(items[i].shard));
    json_object_set_new(o, "attempts", json_integer(items[i].attempts));
    json_object_set_new(o, "created_ms", json_integer(items[i].created_ms));
    json_object_set_new(o, "next_attempt_ms", json_integer(items[i].next_attempt_ms));
    json_object_set_new(o, "done_ms", items[i].done_ms ? json_integer(items[i].done_ms) : json_null());
    json_object_set_new(o, "last_error", cph_json_str(items[i].last_error));
    json_array_append_new(arr, o);
    cph_outbox_info_free(&items[i]);
  }
  free(items);
  cph_maint_stats st;
  cph_engine_maint_stats(r->srv->engine, &st);
  json_t *body = json_object();
  json_object_set_new(body, "items", arr);
  json_object_set_new(body, "pending", cph_json_u64(st.outbox_pending));
  json_object_set_new(body, "oldest_age_seconds", json_real(st.outbox_oldest_age_seconds));
  cph_reply_json(r, 200, body);
}

static void search_done(cph_req *r) {
  if (r->op.rc) {
    cph_reply_rc(r, r->op.rc, r->op.err.msg, r->op.field);
    return;
  }
  json_t *arr = json_array();
  for (size_t i = 0; i < r->op.u.search.n_hits; i++) {
    const cph_memory_hit *h = &r->op.u.search.hits[i];
    json_t *o = json_object();
    json_object_set_new(o, "id", cph_json_u64(h->id));
    json_object_set_new(o, "kind", json_string(h->kind));
    json_object_set_new(o, "text", cph_json_str(h->text));
    json_object_set_new(o, "score", json_real(h->score));
    json_object_set_new(o, "session", cph_json_str(h->session));
    json_object_set_new(o, "created_ms", json_integer(h->created_ms));
    json_array_append_new(arr, o);
  }
  json_t *body = json_object();
  json_object_set_new(body, "memories", arr);
  /* Only when it holds: the vector half is missing (the embedder or index failed or timed
   * out), so these are the lexical hits alone. */
  if (r->op.u.search.degraded)
    json_object_set_new(body, "degraded", json_true());
  cph_reply_json(r, 200, body);
}

/* k: absent, empty or 0 = CPH_SEARCH_K_DEFAULT; above CPH_SEARCH_K_MAX it is clamped (a
 * client asking for "as many as you have" gets the most we give); anything but a
 * non-negative integer is a 400 naming k. */
static bool search_k(cph_req *r, size_t *out) {
  const char *v = cph_req_query(r, "k");
  *out = CPH_SEARCH_K_DEFAULT;
  if (!v || !*v)
    return true;
  if (strspn(v, "0123456789") != strlen(v)) {
    cph_reply_error(r, 400, "bad_request", "k",
                    "k: expected a non-negative integer (0 means %d; above %d counts as %d), "
                    "got \"%.40s\"",
                    CPH_SEARCH_K_DEFAULT, CPH_SEARCH_K_MAX, CPH_SEARCH_K_MAX, v);
    return false;
  }
  /* digits only: compare by length first, so a number of any size is clamped */
  size_t len = strlen(v);
  while (len > 1 && *v == '0') {
    v++;
    len--;
  }
  unsigned long k = len > 6 ? CPH_SEARCH_K_MAX : strtoul(v, NULL, 10);
  *out = k == 0 ? CPH_SEARCH_K_DEFAULT : k > CPH_SEARCH_K_MAX ? CPH_SEARCH_K_MAX : (size_t)k;
  return true;
}

void cph_route_memories_search(cph_req *r) {
  size_t k;
  const char *session = cph_req_query(r, "session");
  const char *q = cph_req_query(r, "q");
  if (!search_k(r, &k))
    return;
  if (!session || !*session) {
    cph_reply_error(r, 400, "bad_request", "session", "session: required");
    return;
  }
  if (!q || !*q) {
    cph_reply_error(r, 400, "bad_request", "q", "q: a query is required");
    return;
  }
  r->op.u.search.session = (char *)session;
  r->op.u.search.query = (char *)q;
  r->op.u.search.k = k;
  cph_engine *e = r->srv->engine;
  if (cph_search_needs_prepare(cph_engine_policy(e))) {
    /* The query goes through the embedder (and the HTTP index) on a search thread first;
     * never in the pass. */
    cph_strv scopes = {0};
    cph_err err = {0};
    int rc = cph_engine_memory_scopes(e, session, &scopes, &err);
    if (rc) {
      cph_strv_free(&scopes);
      cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "session" : NULL);
      return;
    }
    if (cph_search_prep_submit(r->srv->search, r, &scopes, search_done))
      return;
    cph_strv_free(&scopes);
    r->op.u.search.degraded = true; /* no thread could take it: lexical at once */
  }
  cph_req_submit(r, CPH_OP_MEMORY_SEARCH, search_done);
}

void cph_route_event_get(cph_req *r) {
  char *end;
  unsigned long long id = strtoull(r->params[0], &end, 10);
  if (*end || !id) {
    cph_reply_error(r, 400, "bad_request", "id", "id: expected an event id");
    return;
  }
  cph_event_info ev;
  cph_err err;
  int rc = cph_engine_get_event(r->srv->engine, id, &ev, &err);
  if (rc) {
    cph_reply_rc(r, rc, err.msg, rc == CPH_ENOTFOUND ? "id" : NULL);
    return;
  }
  json_t *o = json_object();
  json_object_set_new(o, "id", cph_json_u64(ev.id));
  json_object_set_new(o, "channel", cph_json_str(ev.channel));
  json_object_set_new(o, "sender", cph_json_str(ev.sender));
  json_object_set_new(o, "body", cph_json_str(ev.body));
  json_object_set_new(o, "kind", cph_json_str(ev.kind));
  json_object_set_new(o, "session", cph_json_str(ev.session));
  json_object_set_new(o, "ts_ms", json_integer(ev.ts_ms));
  json_object_set_new(o, "received_ms", json_integer(ev.received_ms));
  json_object_set_new(o, "status", json_string(ev.status));
  json_object_set_new(o, "body_sha256", json_string(ev.body_sha256));
  json_object_set_new(o, "family", ev.family ? cph_json_u64(ev.family) : json_null());
  cph_event_info_free(&ev);
  cph_reply_json(r, 200, o);
}
