/* Sessions: create, update (incl. pause), delete, load at open, and the session reads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "inbox.h"
#include "ops.h"
#include "reports.h"
#include "sessions.h"

#define ID_MAX 128

bool session_id_valid(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > ID_MAX)
    return false;
  for (const char *p = id; *p; p++) {
    char c = *p;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '@' || c == '-';
    if (!ok)
      return false;
  }
  return true;
}

bool cph_tenant_valid(const char *tenant) { return tenant && session_id_valid(tenant); }

static cph_key session_key(const char *id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, id);
  return k;
}

/* ---------------------------------------------------------------- in-memory sessions */

/* The struct's size is part of the memory budget per idle session (DESIGN §12): keep it. */
_Static_assert(sizeof(csession) <= 112, "csession grew: mind the RSS per idle session");

/* The index's key for a handle: the id of the session registered under that sid. */
static const char *session_key_of(const void *ctx, uint32_t sid) {
  const cph_sessions *ss = ctx;
  return ss->by_sid[sid]->id;
}

void sessions_init(cph_sessions *ss, cph_core_env *env, struct cph_reports *reports,
                   struct cph_backpressure *bp, const sessions_hooks *hooks) {
  memset(ss, 0, sizeof *ss);
  ss->env = env;
  ss->reports = reports;
  ss->bp = bp;
  ss->hooks = *hooks;
  cph_slab_init(&ss->slab, sizeof(csession));
  cph_idmap_init(&ss->by_id, session_key_of, ss);
}

void sessions_clear(cph_sessions *ss) {
  for (size_t i = 0; i < ss->cap_by_sid; i++)
    if (ss->by_sid[i])
      csession_free(ss, ss->by_sid[i]);
  cph_idmap_free(&ss->by_id);
  cph_slab_destroy(&ss->slab);
  for (size_t i = 0; i < ss->channels.cap; i++) {
    channel *c = ss->channels.slots[i].value;
    if (!ss->channels.slots[i].key)
      continue;
    free(c->subscribers);
    free(c->members);
    free(c->name);
    free(c);
  }
  cph_hmap_free(&ss->channels);
  ss->last_channel = NULL;
  free(ss->by_sid);
  free(ss->pending);
  free(ss->tick_heap);
  sessions_hooks hooks = ss->hooks;
  *ss = (cph_sessions){.hooks = hooks};
}

/* ---------------------------------------------------------------- lookups */

csession *sessions_get(const cph_sessions *ss, const char *id) {
  uint32_t sid = cph_idmap_get(&ss->by_id, id);
  return sid == CPH_IDMAP_NONE ? NULL : ss->by_sid[sid];
}

channel *sessions_channel(cph_sessions *ss, const char *name, bool create) {
  /* An ingest request's events are mostly of one channel: the last one found is asked first. */
  if (ss->last_channel && strcmp(ss->last_channel->name, name) == 0)
    return ss->last_channel;
  channel *c = cph_hmap_get(&ss->channels, name);
  if (c)
    ss->last_channel = c;
  if (c || !create)
    return c;
  c = calloc(1, sizeof *c);
  if (!c || !(c->name = strdup(name)) || cph_hmap_put(&ss->channels, c->name, c) != CPH_OK) {
    if (c)
      free(c->name);
    free(c);
    return NULL;
  }
  return c;
}

/* ---------------------------------------------------------------- scheduling state */

void sessions_mark_pending(cph_sessions *ss, csession *s) {
  if (s->in_pending_list)
    return;
  if (ss->n_pending == ss->cap_pending) {
    size_t cap = ss->cap_pending ? ss->cap_pending * 2 : 64;
    csession **p = realloc(ss->pending, cap * sizeof *p);
    if (!p)
      return; /* staged on a later mark; pending state is in LMDB either way */
    ss->pending = p;
    ss->cap_pending = cap;
  }
  ss->pending[ss->n_pending++] = s;
  s->in_pending_list = true;
}

/* Stages every pending message of the sessions that received some (§3.6 job 1). Memory
 * only: ingest already wrote them `staged`, in this pass's transaction. New messages arrive
 * at the end and every pass stages them, so each scan walks back from the end and stops once
 * it found them all: O(new messages), not O(inbox). */
uint64_t sessions_stage_pending(cph_sessions *ss) {
  uint64_t staged = 0;
  for (size_t i = 0; i < ss->n_pending; i++) {
    csession *s = ss->pending[i];
    uint32_t left = s->n_pending;
    for (uint32_t j = s->n_inbox; j-- > 0 && left;)
      if (s->inbox[j].status == CPH_INBOX_PENDING) {
        s->inbox[j].status = CPH_INBOX_STAGED;
        left--;
      }
    staged += s->n_pending;
    s->n_staged += s->n_pending;
    s->n_pending = 0;
    s->in_pending_list = false;
    sessions_update_work(ss, s);
  }
  ss->n_pending = 0;
  return staged;
}

/* A session has work when it has staged input or a due autonomy tick (§3.3); a reporter's
 * held input counts only once its report is due (reports.h). */
void sessions_update_work(cph_sessions *ss, csession *s) {
  cph_sched_set_paused(ss->env->sched, s->sid, s->paused || s->away);
  bool input = s->n_staged > 0 && (!s->reports || s->report_due || reports_has_unheld(s));
  cph_sched_set_work(ss->env->sched, s->sid, input || s->tick_due || s->n_jobs > 0);
}

/* In sid order, so the scheduler's slots and the slab are walked (nearly) in address order:
 * at a million sessions that is the difference between streaming and a cache miss each. */
void sessions_update_work_all(cph_sessions *ss) {
  for (size_t i = 0; i < ss->cap_by_sid; i++)
    if (ss->by_sid[i])
      sessions_update_work(ss, ss->by_sid[i]);
}

/* ---- autonomy ticks: a min-heap on next_tick_ns; tick_heap_pos is a session's index + 1 */

static bool tick_less(const csession *a, const csession *b) {
  return a->next_tick_ns < b->next_tick_ns;
}

static void tick_swap(cph_sessions *ss, size_t i, size_t j) {
  csession *t = ss->tick_heap[i];
  ss->tick_heap[i] = ss->tick_heap[j];
  ss->tick_heap[j] = t;
  ss->tick_heap[i]->tick_heap_pos = i + 1;
  ss->tick_heap[j]->tick_heap_pos = j + 1;
}

static void tick_sift(cph_sessions *ss, size_t i) {
  while (i > 0 && tick_less(ss->tick_heap[i], ss->tick_heap[(i - 1) / 2])) {
    tick_swap(ss, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
  for (;;) {
    size_t l = 2 * i + 1, best = i;
    if (l < ss->n_ticks && tick_less(ss->tick_heap[l], ss->tick_heap[best]))
      best = l;
    if (l + 1 < ss->n_ticks && tick_less(ss->tick_heap[l + 1], ss->tick_heap[best]))
      best = l + 1;
    if (best == i)
      return;
    tick_swap(ss, i, best);
    i = best;
  }
}

static void tick_remove(cph_sessions *ss, csession *s) {
  if (!s->tick_heap_pos)
    return;
  size_t i = s->tick_heap_pos - 1;
  s->tick_heap_pos = 0;
  ss->n_ticks--;
  if (i != ss->n_ticks) {
    ss->tick_heap[i] = ss->tick_heap[ss->n_ticks];
    ss->tick_heap[i]->tick_heap_pos = i + 1;
    tick_sift(ss, i);
  }
}

void sessions_tick_schedule(cph_sessions *ss, csession *s) {
  tick_remove(ss, s);
  s->tick_due = false;
  if (!s->autonomy_interval_s) {
    s->next_tick_ns = 0;
    return;
  }
  s->next_tick_ns = env_now(ss->env) + (int64_t)s->autonomy_interval_s * CPH_NS_PER_S;
  if (ss->n_ticks == ss->cap_ticks) {
    size_t cap = ss->cap_ticks ? ss->cap_ticks * 2 : 64;
    csession **p = realloc(ss->tick_heap, cap * sizeof *p);
    if (!p)
      return;
    ss->tick_heap = p;
    ss->cap_ticks = cap;
  }
  ss->tick_heap[ss->n_ticks] = s;
  s->tick_heap_pos = ++ss->n_ticks;
  tick_sift(ss, ss->n_ticks - 1);
}

void sessions_ticks_fire(cph_sessions *ss) {
  int64_t now = env_now(ss->env);
  while (ss->n_ticks && ss->tick_heap[0]->next_tick_ns <= now) {
    csession *s = ss->tick_heap[0];
    tick_remove(ss, s);
    s->tick_due = true;
    sessions_update_work(ss, s);
  }
}

int64_t sessions_next_tick_ns(const cph_sessions *ss) {
  return ss->n_ticks ? ss->tick_heap[0]->next_tick_ns : INT64_MAX;
}

/* Makes by_sid cover sid. */
static int by_sid_fit(cph_sessions *ss, size_t n) {
  if (n <= ss->cap_by_sid)
    return CPH_OK;
  size_t cap = ss->cap_by_sid ? ss->cap_by_sid : 64;
  while (cap < n)
    cap *= 2;
  csession **p = realloc(ss->by_sid, cap * sizeof *p);
  if (!p)
    return CPH_ENOMEM;
  memset(p + ss->cap_by_sid, 0, (cap - ss->cap_by_sid) * sizeof *p);
  ss->by_sid = p;
  ss->cap_by_sid = cap;
  return CPH_OK;
}

int sessions_reserve(cph_sessions *ss, size_t n) {
  if (cph_idmap_reserve(&ss->by_id, n) || cph_sched_reserve(ss->env->sched, n) ||
      by_sid_fit(ss, n))
    return CPH_ENOMEM;
  return CPH_OK;
}

csession *csession_new(cph_sessions *ss, const char *id, cph_lane lane, double credits,
                       bool restore) {
  csession *s = cph_slab_alloc(&ss->slab);
  if (!s)
    return NULL;
  s->lane = lane;
  int rc = restore ? cph_sched_restore(ss->env->sched, id, lane, credits, &s->sid)
                   : cph_sched_add(ss->env->sched, id, lane, &s->sid);
  if (rc)
    goto fail;
  if (by_sid_fit(ss, (size_t)s->sid + 1) != CPH_OK)
    goto fail_sched;
  s->id = (char *)cph_sched_id(ss->env->sched, s->sid);
  ss->by_sid[s->sid] = s;
  if (cph_idmap_put(&ss->by_id, s->id, s->sid) != CPH_OK) {
    ss->by_sid[s->sid] = NULL;
    goto fail_sched;
  }
  return s;
fail_sched:
  cph_sched_remove(ss->env->sched, s->sid);
fail:
  cph_slab_free(&ss->slab, s);
  return NULL;
}

/* Frees s; the caller took it out of the index and the scheduler. */
void csession_free(cph_sessions *ss, csession *s) {
  if (ss->by_sid && s->sid < ss->cap_by_sid)
    ss->by_sid[s->sid] = NULL;
  free(s->inbox ? s->inbox - s->inbox_head : NULL);
  free(s->jobs);
  cph_slab_free(&ss->slab, s);
}

int csession_reassign(cph_sessions *ss, csession *s, cph_lane lane, double credits) {
  int rc = cph_sched_reassign(ss->env->sched, s->sid, lane, credits);
  if (rc == CPH_OK)
    s->lane = lane;
  return rc;
}

/* The live inbox is a window into its allocation: entries removed near the front leave a gap
 * before it (inbox_head entries) rather than moving everything after them. The gap is taken
 * back when the end runs out of room: the window moves down when the gap is at least half
 * the entries (each entry moved then was paid for by two removals), else the allocation
 * doubles. So the allocation stays under three times the most entries held, and a queue at
 * its cap that folds its oldest entry and takes a new one per event moves O(1) entries per
 * event, not O(queue). */
static inline uint32_t inbox_cap(const csession *s) {
  return s->inbox ? (uint32_t)1 << s->inbox_cap_log2 : 0;
}

static int inbox_room_at_end(csession *s) {
  inbox_item *base = s->inbox ? s->inbox - s->inbox_head : NULL;
  if (s->inbox_head + s->n_inbox < inbox_cap(s))
    return CPH_OK;
  if (s->inbox_head > 0 && s->inbox_head >= s->n_inbox / 2) {
    memmove(base, s->inbox, s->n_inbox * sizeof *s->inbox);
    s->inbox = base;
    s->inbox_head = 0;
    return CPH_OK;
  }
  uint8_t log2 = s->inbox ? (uint8_t)(s->inbox_cap_log2 + 1) : 2; /* 4 entries first */
  if (log2 > 31)
    return CPH_ENOMEM;
  inbox_item *p = realloc(base, ((size_t)1 << log2) * sizeof *p);
  if (!p)
    return CPH_ENOMEM;
  s->inbox = p + s->inbox_head;
  s->inbox_cap_log2 = log2;
  return CPH_OK;
}

int csession_inbox_push(csession *s, const inbox_item *item) {
  if (inbox_room_at_end(s))
    return CPH_ENOMEM;
  /* Ids arrive in increasing order except on requeue: keep the array sorted. */
  uint32_t at = s->n_inbox;
  while (at > 0 && s->inbox[at - 1].id > item->id)
    at--;
  memmove(&s->inbox[at + 1], &s->inbox[at], (s->n_inbox - at) * sizeof *s->inbox);
  s->inbox[at] = *item;
  s->n_inbox++;
  if (item->status == CPH_INBOX_PENDING)
    s->n_pending++;
  else
    s->n_staged++;
  return CPH_OK;
}

void csession_inbox_remove(csession *s, uint32_t index) {
  if (s->inbox[index].status == CPH_INBOX_PENDING)
    s->n_pending--;
  else
    s->n_staged--;
  uint32_t after = s->n_inbox - index - 1;
  if (index < after) { /* the entries before it move up one: the window starts one later */
    memmove(&s->inbox[1], &s->inbox[0], index * sizeof *s->inbox);
    s->inbox++;
    s->inbox_head++;
  } else {
    memmove(&s->inbox[index], &s->inbox[index + 1], after * sizeof *s->inbox);
  }
  s->n_inbox--;
  if (s->n_inbox == 0) { /* empty: the window goes back to the allocation's start */
    s->inbox -= s->inbox_head;
    s->inbox_head = 0;
  }
}

/* ---------------------------------------------------------------- channel index */

static int list_add(csession ***list, size_t *n, size_t *cap, csession *s) {
  for (size_t i = 0; i < *n; i++)
    if ((*list)[i] == s)
      return CPH_OK;
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 4;
    csession **p = realloc(*list, c * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    *list = p;
    *cap = c;
  }
  (*list)[(*n)++] = s;
  return CPH_OK;
}

static void list_del(csession **list, size_t *n, csession *s) {
  for (size_t i = 0; i < *n; i++)
    if (list[i] == s) {
      list[i] = list[--*n];
      return;
    }
}

static int sessions_channels_attach(cph_sessions *ss, csession *s, const cph_session_rec *rec) {
  for (uint32_t i = 0; i < rec->n_subscribe; i++) {
    channel *c = sessions_channel(ss, rec->subscribe[i], true);
    if (!c || list_add(&c->subscribers, &c->n_subscribers, &c->cap_subscribers, s))
      return CPH_ENOMEM;
  }
  for (uint32_t i = 0; i < rec->n_member; i++) {
    channel *c = sessions_channel(ss, rec->member[i], true);
    if (!c || list_add(&c->members, &c->n_members, &c->cap_members, s))
      return CPH_ENOMEM;
  }
  return CPH_OK;
}

/* O(channels): on delete and update only. */
static void sessions_channels_detach(cph_sessions *ss, csession *s) {
  for (size_t i = 0; i < ss->channels.cap; i++) {
    channel *c = ss->channels.slots[i].value;
    if (!ss->channels.slots[i].key)
      continue;
    list_del(c->subscribers, &c->n_subscribers, s);
    list_del(c->members, &c->n_members, s);
  }
}

/* ---------------------------------------------------------------- records <-> info */

static char **strv_dup(char *const *items, size_t n) {
  char **out = calloc(n ? n : 1, sizeof *out);
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (!(out[i] = strdup(items[i]))) {
      while (i--)
        free(out[i]);
      free(out);
      return NULL;
    }
  return out;
}

static void strv_free(char **items, size_t n) {
  for (size_t i = 0; items && i < n; i++)
    free(items[i]);
  free(items);
}

void cph_session_info_free(cph_session_info *s) {
  free(s->id);
  strv_free(s->subscribe.items, s->subscribe.count);
  strv_free(s->member.items, s->member.count);
  strv_free(s->tools.items, s->tools.count);
  free(s->system);
  free(s->tenant);
  memset(s, 0, sizeof *s);
}

const char *cph_session_state_name(cph_session_state_t st) {
  switch (st) {
  case CPH_STATE_IDLE: return "idle";
  case CPH_STATE_QUEUED: return "queued";
  case CPH_STATE_RUNNING: return "running";
  case CPH_STATE_PAUSED: return "paused";
  }
  return "unknown";
}

cph_policy_while_running sessions_while_running(const cph_sessions *ss, const csession *s) {
  if (s->while_running > 0 && s->while_running <= CPH_POLICY_WR_COUNT)
    return (cph_policy_while_running)(s->while_running - 1);
  return ss->env->policy->sessions.while_running[s->lane];
}

static cph_session_state_t live_state(const csession *s) {
  if (s->running_turn)
    return CPH_STATE_RUNNING;
  if (s->paused)
    return CPH_STATE_PAUSED;
  if (s->n_staged > 0 || s->tick_due)
    return CPH_STATE_QUEUED;
  return CPH_STATE_IDLE;
}

/* Info from the stored record plus the live state. */
static int info_from(cph_sessions *ss, const cph_session_rec *r, const csession *s,
                     cph_session_info *out) {
  memset(out, 0, sizeof *out);
  out->id = strdup(r->id);
  out->lane = (cph_lane)r->lane;
  out->state = live_state(s);
  out->credits = cph_sched_credits(ss->env->sched, s->sid);
  out->episode = s->episode;
  out->subscribe.items = strv_dup(r->subscribe, r->n_subscribe);
  out->subscribe.count = r->n_subscribe;
  out->member.items = strv_dup(r->member, r->n_member);
  out->member.count = r->n_member;
  out->tools.items = strv_dup(r->tools, r->n_tools);
  out->tools.count = r->n_tools;
  out->autonomy_interval_s = r->autonomy_interval_s;
  out->report_interval_s = r->report_interval_s;
  out->context_window_tokens = r->context_window_tokens;
  out->system = r->system ? strdup(r->system) : NULL;
  out->pending = s->n_pending;
  out->staged = s->n_staged;
  out->folded = s->folded;
  out->while_running = sessions_while_running(ss, s);
  out->while_running_class = s->while_running == 0;
  out->tenant = r->tenant ? strdup(r->tenant) : NULL;
  if (!out->id || !out->subscribe.items || !out->member.items || !out->tools.items ||
      (r->system && !out->system) || (r->tenant && !out->tenant)) {
    cph_session_info_free(out);
    return CPH_ENOMEM;
  }
  return CPH_OK;
}

/* Validates a channel list; field is e.g. "subscribe". */
static int check_channels(cph_op *op, const cph_strv *v, const char *field) {
  for (size_t i = 0; i < v->count; i++) {
    size_t n = v->items[i] ? strlen(v->items[i]) : 0;
    if (n == 0 || n > 256) {
      char f[64];
      snprintf(f, sizeof f, "%s[%zu]", field, i);
      return op_fail(op, CPH_EINVAL, f, "%s: a channel name is 1 to 256 bytes", f);
    }
  }
  return CPH_OK;
}

/* Copies the settable fields of in (per `set`) into the record. Pointers are borrowed. */
static void rec_apply(cph_session_rec *r, const cph_session_info *in, unsigned set) {
  if (set & CPH_SET_SUBSCRIBE) {
    r->subscribe = in->subscribe.items;
    r->n_subscribe = (uint32_t)in->subscribe.count;
  }
  if (set & CPH_SET_MEMBER) {
    r->member = in->member.items;
    r->n_member = (uint32_t)in->member.count;
  }
  if (set & CPH_SET_AUTONOMY)
    r->autonomy_interval_s = in->autonomy_interval_s;
  if (set & CPH_SET_REPORT)
    r->report_interval_s = in->report_interval_s;
  if (set & CPH_SET_WINDOW)
    r->context_window_tokens = in->context_window_tokens;
  if (set & CPH_SET_SYSTEM)
    r->system = in->system;
  if (set & CPH_SET_TOOLS) {
    r->tools = in->tools.items;
    r->n_tools = (uint32_t)in->tools.count;
  }
  if (set & CPH_SET_PAUSED)
    r->state = in->state == CPH_STATE_PAUSED ? CPH_SESSION_PAUSED : CPH_SESSION_IDLE;
  if (set & CPH_SET_CLASS)
    r->lane = (uint8_t)in->lane;
  if (set & CPH_SET_WHILE_RUNNING)
    r->while_running = in->while_running_class ? 0 : (uint8_t)(1 + in->while_running);
  if (set & CPH_SET_TENANT)
    r->tenant = in->tenant && in->tenant[0] ? in->tenant : NULL;
}

static int validate_fields(cph_op *op, const cph_session_info *in, unsigned set) {
  if ((set & CPH_SET_SUBSCRIBE) && check_channels(op, &in->subscribe, "subscribe"))
    return op->rc;
  if ((set & CPH_SET_MEMBER) && check_channels(op, &in->member, "member"))
    return op->rc;
  if ((set & CPH_SET_CLASS) && (unsigned)in->lane >= CPH_LANE_COUNT)
    return op_fail(op, CPH_EINVAL, "class",
                   "class: expected interactive, operational or maintenance");
  if ((set & CPH_SET_WHILE_RUNNING) && !in->while_running_class &&
      (unsigned)in->while_running >= CPH_POLICY_WR_COUNT)
    return op_fail(op, CPH_EINVAL, "while_running",
                   "while_running: expected enqueue, merge, interrupt, restart or reject");
  if ((set & CPH_SET_TENANT) && in->tenant && in->tenant[0] && !cph_tenant_valid(in->tenant))
    return op_fail(op, CPH_EINVAL, "tenant",
                   "tenant: 1 to 128 characters of A-Z a-z 0-9 . _ : @ -");
  if ((set & CPH_SET_WINDOW) && in->context_window_tokens &&
      (in->context_window_tokens < 256 || in->context_window_tokens > 10000000))
    return op_fail(op, CPH_EINVAL, "context_window_tokens",
                   "context_window_tokens: expected 256 to 10000000");
  return CPH_OK;
}

/* Writes rec for s and (re)derives the in-memory settings that come from it. */
int persist_session_credits(cph_sessions *ss, cph_txn *t, csession *s) {
  cph_key k = session_key(s->id);
  cph_session_rec r;
  int rc = cph_txn_get_record(t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  if (rc)
    return rc;
  r.credits = cph_sched_credits(ss->env->sched, s->sid);
  r.credits_at_ms = cph_wall_ms();
  r.episode = s->episode;
  r.updated_ms = r.credits_at_ms;
  rc = cph_txn_put_record(t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  cph_record_free(&cph_session_desc, &r);
  return rc;
}

/* ---------------------------------------------------------------- operations */

static void session_create(cph_sessions *ss, cph_op *op) {
  cph_session_info *in = &op->u.session.in;
  if (!in->id || !session_id_valid(in->id)) {
    op_fail(op, CPH_EINVAL, "id", "id: 1 to 128 characters of A-Z a-z 0-9 . _ : @ -");
    return;
  }
  unsigned all = CPH_SET_SUBSCRIBE | CPH_SET_MEMBER | CPH_SET_AUTONOMY | CPH_SET_REPORT |
                 CPH_SET_WINDOW | CPH_SET_SYSTEM | CPH_SET_TOOLS | CPH_SET_CLASS |
                 CPH_SET_TENANT |
                 (op->u.session.set & (CPH_SET_PAUSED | CPH_SET_WHILE_RUNNING));
  if (validate_fields(op, in, all))
    return;
  if (sessions_get(ss, in->id)) {
    op_fail(op, CPH_EEXISTS, "id", "session '%s' already exists", in->id);
    return;
  }
  cph_session_rec r = {0};
  r.id = in->id;
  r.credits = ss->env->policy->scheduler.credits.max; /* a new session starts at max (§3.2) */
  r.credits_at_ms = r.created_ms = r.updated_ms = cph_wall_ms();
  rec_apply(&r, in, all);
  if (!r.context_window_tokens)
    r.context_window_tokens = (uint32_t)ss->env->policy->sessions.context_window_tokens;
  cph_txn t;
  cph_key k = session_key(in->id);
  cph_txn_begin_child(&ss->env->txn, &t);
  cph_txn_put_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
  csession *s = csession_new(ss, in->id, in->lane, 0, false);
  if (!s || sessions_channels_attach(ss, s, &r) ||
      cph_sched_set_tenant(ss->env->sched, s->sid, r.tenant)) {
    op_fail(op, CPH_ENOMEM, NULL, "out of memory creating session '%s'", in->id);
    return;
  }
  s->paused = r.state == CPH_SESSION_PAUSED;
  s->autonomy_interval_s = r.autonomy_interval_s;
  s->while_running = r.while_running;
  sessions_tick_schedule(ss, s);
  if (reports_set(ss->reports, s, r.report_interval_s, env_now(ss->env)) != CPH_OK)
    cph_warn("session '%s': out of memory for its reports; they wait for a restart", s->id);
  sessions_update_work(ss, s);
  if (info_from(ss, &r, s, &op->u.session.out))
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
}

static void session_update(cph_sessions *ss, cph_op *op) {
  cph_session_info *in = &op->u.session.in;
  unsigned set = op->u.session.set;
  csession *s = in->id ? sessions_get(ss, in->id) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "id", "no session '%s'", in->id ? in->id : "");
    return;
  }
  if (validate_fields(op, in, set))
    return;
  if ((set & CPH_SET_CLASS) && in->lane != s->lane && s->running_turn) {
    op_fail(op, CPH_ESTATE, "class", "session '%s' has a running turn; change its class later",
            s->id);
    return;
  }
  cph_txn t;
  cph_key k = session_key(s->id);
  cph_session_rec r;
  cph_txn_begin_child(&ss->env->txn, &t);
  if (cph_txn_get_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r) != CPH_OK) {
    op_fail(op, t.ret ? t.ret : CPH_ENOTFOUND, NULL, "%s", t.err.msg);
    cph_txn_abort(&t);
    return;
  }
  /* Keep the record's own arrays to free them after the borrowed ones were written. */
  cph_session_rec own = r;
  rec_apply(&r, in, set);
  if ((set & CPH_SET_WINDOW) && !r.context_window_tokens) /* null or 0: as on create */
    r.context_window_tokens = (uint32_t)ss->env->policy->sessions.context_window_tokens;
  r.updated_ms = cph_wall_ms();
  r.episode = s->episode;
  r.credits = cph_sched_credits(ss->env->sched, s->sid);
  r.credits_at_ms = r.updated_ms;
  cph_txn_put_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    cph_record_free(&cph_session_desc, &own);
    return;
  }
  if (set & (CPH_SET_SUBSCRIBE | CPH_SET_MEMBER)) {
    sessions_channels_detach(ss, s);
    sessions_channels_attach(ss, s, &r);
  }
  if ((set & CPH_SET_CLASS) && in->lane != s->lane)
    /* A new lane, keeping its credits (no turn runs: refused above). */
    csession_reassign(ss, s, in->lane, cph_sched_credits(ss->env->sched, s->sid));
  if ((set & CPH_SET_TENANT) && cph_sched_set_tenant(ss->env->sched, s->sid, r.tenant))
    cph_warn("session '%s': out of memory for its tenant; it counts as the default tenant's "
             "until a restart", s->id);
  if (set & CPH_SET_PAUSED)
    s->paused = r.state == CPH_SESSION_PAUSED;
  if (set & CPH_SET_WHILE_RUNNING) /* applies to what arrives from now on */
    s->while_running = r.while_running;
  if (set & CPH_SET_AUTONOMY) {
    s->autonomy_interval_s = r.autonomy_interval_s;
    sessions_tick_schedule(ss, s);
  }
  if ((set & CPH_SET_REPORT) &&
      reports_set(ss->reports, s, r.report_interval_s, env_now(ss->env)) != CPH_OK)
    cph_warn("session '%s': out of memory for its reports; they wait for a restart", s->id);
  sessions_update_work(ss, s);
  if (info_from(ss, &r, s, &op->u.session.out))
    op_fail(op, CPH_ENOMEM, NULL, "out of memory");
  cph_record_free(&cph_session_desc, &own);
}

static void session_delete(cph_sessions *ss, cph_op *op) {
  const char *id = op->u.session.in.id;
  csession *s = id ? sessions_get(ss, id) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "id", "no session '%s'", id ? id : "");
    return;
  }
  if (s->running_turn) {
    op_fail(op, CPH_ESTATE, NULL, "session '%s' has a running turn; delete it after the turn",
            s->id);
    return;
  }
  cph_txn t;
  cph_key k = session_key(s->id);
  cph_txn_begin_child(&ss->env->txn, &t);
  cph_txn_del(&t, CPH_DB_SESSIONS, &k);
  /* Its tree and cursors go too: a new session with this id starts fresh. */
  if (ss->hooks.delete_state)
    ss->hooks.delete_state(ss->hooks.ctx, &t, s->id);
  /* Its live inbox goes with it; events stay in their channels' history. */
  for (uint32_t i = 0; i < s->n_inbox; i++) {
    cph_key ik;
    cph_key_reset(&ik);
    cph_key_str(&ik, s->id);
    cph_key_u64(&ik, s->inbox[i].id);
    cph_txn_del(&t, CPH_DB_INBOX, &ik);
  }
  /* Cluster mode: what its inbox held is consumed with it (the done marks). */
  int krc = CPH_OK;
  for (uint32_t i = 0; ss->env->report_consumed && krc == CPH_OK && i < s->n_inbox; i++)
    krc = inbox_event_keys(&t, s->id, &s->inbox[i], &op->u.session.consumed);
  if (krc) {
    cph_txn_abort(&t);
    cph_strv_free(&op->u.session.consumed);
    op_fail(op, krc, NULL, "listing the events of session '%s': %s", s->id,
            t.err.msg[0] ? t.err.msg : cph_strerror(krc));
    return;
  }
  if (cph_txn_commit(&t)) {
    op_fail(op, t.ret, NULL, "%s", t.err.msg);
    return;
  }
  sessions_channels_detach(ss, s);
  cph_idmap_del(&ss->by_id, s->id); /* before the scheduler frees the id */
  cph_sched_remove(ss->env->sched, s->sid);
  sessions_tick_schedule(ss, (s->autonomy_interval_s = 0, s));
  reports_forget(ss->reports, s->id);
  for (size_t i = 0; i < ss->n_pending; i++)
    if (ss->pending[i] == s)
      ss->pending[i] = ss->pending[--ss->n_pending];
  csession_free(ss, s);
}

/* CPH_OP_INBOX_RETAIN (include/cephalon/cephalon.h): cluster mode's rebuild drops what a
 * turn of another node consumed while this one did not serve the session. The entries go as a
 * completion's do: their records say consumed (by no turn here), memory follows the commit. */
static void session_retain(cph_sessions *ss, cph_op *op) {
  csession *s = op->u.retain.session ? sessions_get(ss, op->u.retain.session) : NULL;
  if (!s) {
    op_fail(op, CPH_ENOTFOUND, "session", "no session '%s'",
            op->u.retain.session ? op->u.retain.session : "");
    return;
  }
  s->away = false; /* this node serves it (again) */
  if (s->reports || !s->n_inbox) {
    sessions_update_work(ss, s);
    return; /* a reporter's held traffic is reports.h's: left as it is */
  }
  cph_hmap keep = CPH_HMAP_INIT;
  bool *drop = calloc(s->n_inbox, sizeof *drop);
  int rc = drop ? CPH_OK : CPH_ENOMEM;
  for (size_t i = 0; rc == CPH_OK && i < op->u.retain.n_keep; i++)
    rc = cph_hmap_put(&keep, op->u.retain.keep[i], (void *)op->u.retain.keep[i]);
  cph_txn t;
  cph_txn_begin_child(&ss->env->txn, &t);
  for (uint32_t i = 0; rc == CPH_OK && i < s->n_inbox; i++) {
    const inbox_item *it = &s->inbox[i];
    if (it->turn_id)
      continue;
    cph_strv keys = {0};
    rc = inbox_event_keys(&t, s->id, it, &keys);
    bool kept = keys.count == 0;
    for (size_t k = 0; rc == CPH_OK && !kept && k < keys.count; k++)
      kept = cph_hmap_get(&keep, keys.items[k]) != NULL;
    cph_strv_free(&keys);
    if (rc != CPH_OK || kept)
      continue;
    drop[i] = true;
    cph_inbox_rec r = {s->id,         it->id, it->event_id, CPH_INBOX_CONSUMED,
                       it->mentioned, 0,      it->attempts, it->created_ms};
    cph_key k;
    cph_key_reset(&k);
    cph_key_str(&k, s->id);
    cph_key_u64(&k, it->id);
    cph_txn_put_record(&t, CPH_DB_INBOX, &k, &cph_inbox_desc, &r);
  }
  cph_hmap_free(&keep);
  if (rc == CPH_OK && cph_txn_commit(&t) != CPH_OK)
    rc = t.ret;
  if (rc) {
    if (t.mdb)
      cph_txn_abort(&t);
    op_fail(op, rc, NULL, "retaining the inbox of '%s': %s", s->id,
            t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    free(drop);
    sessions_update_work(ss, s);
    return;
  }
  for (uint32_t i = s->n_inbox; i-- > 0;) /* from the end: the indices before stay valid */
    if (drop[i]) {
      csession_inbox_remove(s, i);
      op->u.retain.dropped++;
    }
  free(drop);
  sessions_update_work(ss, s);
}

void sessions_apply(cph_sessions *ss, cph_op *op) {
  switch (op->kind) {
  case CPH_OP_SESSION_CREATE:
    session_create(ss, op);
    break;
  case CPH_OP_SESSION_UPDATE:
    session_update(ss, op);
    break;
  case CPH_OP_INBOX_RETAIN:
    session_retain(ss, op);
    break;
  default:
    session_delete(ss, op);
    break;
  }
}

/* ---------------------------------------------------------------- load at open */

static int janitor_create(cph_sessions *ss, cph_err *err);

/* Credits carry over a restart: refilled for the time the daemon was down (until now_ms),
 * capped at max. */
static double restored_credits(const cph_sessions *ss, const cph_session_rec *r, int64_t now_ms) {
  const cph_policy_credits *c = &ss->env->policy->scheduler.credits;
  double down_s = (double)(now_ms - r->credits_at_ms) / 1000.0;
  double credits = r->credits + (down_s > 0 ? down_s * c->refill_per_second : 0);
  if (!isfinite(credits) || credits > c->max)
    credits = c->max;
  return credits < c->min ? c->min : credits;
}

/* Whether event id was posted to session id explicitly (its `session`): a reporter's entry
 * that names it is never held for a report. Read for reporters' live entries at open only. */
static bool event_names_session(cph_txn *t, uint64_t id, const char *session) {
  static const char *const fields[] = {"session"};
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_event_rec ev;
  uint64_t mask = cph_record_field_mask(&cph_event_desc, fields, 1);
  if (cph_txn_get_record_some(t, CPH_DB_EVENTS, &k, &cph_event_desc, &ev, mask) != CPH_OK)
    return false;
  bool named = ev.session && strcmp(ev.session, session) == 0;
  cph_record_free(&cph_event_desc, &ev);
  return named;
}

static int load_inbox(cph_sessions *ss, cph_txn *t, cph_err *err) {
  cph_cursor c;
  cph_val k, v;
  int rc = cph_cursor_open(t, CPH_DB_INBOX, &c);
  const csession *mapped = NULL; /* the session whose folded map `folded` is */
  inbox_folded folded = {0};
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_inbox_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_inbox_desc, v.data, v.len, &r, &derr)) {
      char key[160];
      cph_key_describe(k.data, k.len, key, sizeof key);
      cph_cursor_close(&c);
      return cph_err_set(err, CPH_ECORRUPT, "corrupt record in database \"inbox\" at key %s: %s",
                         key, derr.msg);
    }
    csession *s = sessions_get(ss, r.session);
    if (s && s != mapped && (r.status == CPH_INBOX_PENDING || r.status == CPH_INBOX_STAGED)) {
      /* a session's records are contiguous (the key leads with it): its map is read once */
      mapped = s;
      int frc = inbox_folded_get(t, s->id, &folded);
      if (frc) {
        cph_record_free(&cph_inbox_desc, &r);
        cph_cursor_close(&c);
        return cph_err_set(err, frc, "inbox of session '%s': cannot read its folded map: %s",
                           s->id, cph_strerror(frc));
      }
    }
    /* The inbox id is the key's trailing u64. */
    uint64_t inbox_id = cph_be64_get((const uint8_t *)k.data + k.len - 8);
    if (s && (r.status == CPH_INBOX_PENDING || r.status == CPH_INBOX_STAGED) &&
        !inbox_folded_holds(&folded, inbox_id)) {
      inbox_item it = {0};
      it.id = inbox_id;
      it.event_id = r.event_id;
      it.status = r.status;
      it.mentioned = r.mentioned;
      it.attempts = r.attempts;
      it.created_ms = r.created_ms;
      int frc = inbox_fold_get(t, s->id, &it); /* what is folded into it: O(1) per live entry */
      if (frc == CPH_OK && s->reports && !it.mentioned)
        it.direct = event_names_session(t, it.event_id, s->id);
      if (frc) {
        char key[160];
        cph_key_describe(k.data, k.len, key, sizeof key);
        cph_record_free(&cph_inbox_desc, &r);
        cph_cursor_close(&c);
        return cph_err_set(err, frc, "inbox entry %s: cannot read what is folded into it: %s",
                           key, cph_strerror(frc));
      }
      if (csession_inbox_push(s, &it)) {
        cph_record_free(&cph_inbox_desc, &r);
        cph_cursor_close(&c);
        return cph_err_set(err, CPH_ENOMEM, "out of memory loading inboxes");
      }
      if (r.status == CPH_INBOX_PENDING)
        sessions_mark_pending(ss, s);
    }
    cph_record_free(&cph_inbox_desc, &r);
  }
  cph_cursor_close(&c);
  if (rc != CPH_ENOTFOUND)
    return cph_err_set(err, rc, "%s", t->err.msg);
  return CPH_OK;
}

int sessions_load(cph_sessions *ss, cph_err *err) {
  cph_txn t;
  int rc = cph_txn_begin(ss->env->store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  /* Sized once for what is stored (+1: the janitor, if new): no rehash, no regrowth. Failing
   * here is not fatal; the structures grow as sessions load. */
  size_t count = 0;
  if (cph_txn_count(&t, CPH_DB_SESSIONS, &count) == CPH_OK)
    sessions_reserve(ss, count + 1);
  int64_t now_ms = cph_wall_ms(); /* once: a million clock reads add up */
  cph_cursor c;
  cph_val k, v;
  rc = cph_cursor_open(&t, CPH_DB_SESSIONS, &c);
  for (rc = rc ? rc : cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_session_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_session_desc, v.data, v.len, &r, &derr)) {
      char key[160];
      cph_key_describe(k.data, k.len, key, sizeof key);
      rc = cph_err_set(err, CPH_ECORRUPT,
                       "corrupt record in database \"sessions\" at key %s: %s", key, derr.msg);
      goto out;
    }
    csession *s = csession_new(ss, r.id, (cph_lane)r.lane, restored_credits(ss, &r, now_ms), true);
    if (!s || sessions_channels_attach(ss, s, &r)) {
      cph_record_free(&cph_session_desc, &r);
      rc = cph_err_set(err, CPH_ENOMEM, "out of memory loading sessions");
      goto out;
    }
    if (r.tenant && cph_sched_set_tenant(ss->env->sched, s->sid, r.tenant)) {
      cph_record_free(&cph_session_desc, &r);
      rc = cph_err_set(err, CPH_ENOMEM, "out of memory loading sessions");
      goto out;
    }
    s->paused = r.state == CPH_SESSION_PAUSED;
    s->episode = r.episode;
    s->autonomy_interval_s = r.autonomy_interval_s;
    s->while_running = r.while_running;
    sessions_tick_schedule(ss, s);
    if (reports_set(ss->reports, s, r.report_interval_s, env_now(ss->env)) != CPH_OK) {
      cph_record_free(&cph_session_desc, &r);
      rc = cph_err_set(err, CPH_ENOMEM, "out of memory loading sessions");
      goto out;
    }
    cph_record_free(&cph_session_desc, &r);
  }
  if (rc != CPH_ENOTFOUND) {
    rc = cph_err_set(err, rc, "%s", t.err.msg);
    goto out;
  }
  cph_cursor_close(&c);
  rc = load_inbox(ss, &t, err);
  if (rc == CPH_OK)
    sessions_update_work_all(ss);
out:
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  if (rc == CPH_OK && ss->env->policy->sessions.janitor && !sessions_get(ss, "janitor"))
    rc = janitor_create(ss, err);
  return rc;
}

/* The built-in maintenance session (DESIGN §2), created once. */
static int janitor_create(cph_sessions *ss, cph_err *err) {
  cph_txn t;
  int rc = cph_txn_begin(ss->env->store, true, &t);
  cph_session_rec r = {0};
  r.id = "janitor";
  r.lane = CPH_LANE_MAINTENANCE;
  r.credits = ss->env->policy->scheduler.credits.max;
  r.credits_at_ms = r.created_ms = r.updated_ms = cph_wall_ms();
  r.context_window_tokens = (uint32_t)ss->env->policy->sessions.context_window_tokens;
  cph_key k = session_key("janitor");
  if (rc == CPH_OK)
    cph_txn_put_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  if (cph_txn_commit(&t))
    return cph_err_set(err, t.ret, "creating the janitor session: %s", t.err.msg);
  csession *s = csession_new(ss, "janitor", CPH_LANE_MAINTENANCE, 0, false);
  return s ? CPH_OK : cph_err_set(err, CPH_ENOMEM, "out of memory creating the janitor");
}

/* ---------------------------------------------------------------- reads */

int sessions_info(cph_sessions *ss, const char *id, cph_session_info *out, cph_err *err) {
  csession *s = sessions_get(ss, id);
  if (!s)
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", id);
  cph_txn t;
  int rc = cph_txn_begin(ss->env->store, false, &t);
  cph_key k = session_key(id);
  cph_session_rec r;
  if (rc == CPH_OK)
    rc = cph_txn_get_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &r);
  if (rc) {
    cph_err_set(err, rc, "%s", t.err.msg[0] ? t.err.msg : cph_strerror(rc));
    cph_txn_abort(&t);
    return rc;
  }
  rc = info_from(ss, &r, s, out);
  cph_record_free(&cph_session_desc, &r);
  cph_txn_abort(&t);
  return rc ? cph_err_set(err, rc, "out of memory") : CPH_OK;
}

int sessions_list(cph_sessions *ss, const cph_session_filter *f, cph_session_info **out,
                  size_t *n, cph_err *err) {
  size_t limit = f && f->limit ? f->limit : 100;
  if (limit > 1000)
    limit = 1000;
  *out = calloc(limit, sizeof **out);
  *n = 0;
  if (!*out)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  cph_txn t;
  int rc = cph_txn_begin(ss->env->store, false, &t);
  cph_cursor c;
  cph_val k, v;
  cph_key start;
  cph_key_reset(&start);
  if (f && f->after) {
    cph_key_str(&start, f->after);
    start.data[start.len - 1] = 1; /* just past "after\0": the next id */
  }
  const char *prefix = f && f->prefix && *f->prefix ? f->prefix : NULL;
  size_t plen = prefix ? strlen(prefix) : 0;
  if (prefix && (!f->after || strcmp(f->after, prefix) < 0)) {
    cph_key_reset(&start); /* the prefix without its NUL: the first id that begins with it */
    cph_key_str(&start, prefix);
    start.len--;
  }
  if (rc == CPH_OK)
    rc = cph_cursor_open(&t, CPH_DB_SESSIONS, &c);
  if (rc == CPH_OK)
    rc = cph_cursor_seek(&c, start.len ? &start : NULL, &k, &v);
  for (; rc == CPH_OK && *n < limit; rc = cph_cursor_next(&c, &k, &v)) {
    if (prefix && (k.len < plen || memcmp(k.data, prefix, plen) != 0))
      break; /* past the ids that begin with it */
    cph_session_rec r;
    cph_err derr;
    if (cph_record_decode(&cph_session_desc, v.data, v.len, &r, &derr)) {
      cph_warn("sessions list: skipping a corrupt session record: %s", derr.msg);
      continue;
    }
    csession *s = sessions_get(ss, r.id);
    bool keep = s && (!f || !f->by_lane || (cph_lane)r.lane == f->lane) &&
                (!f || !f->by_state || live_state(s) == f->state);
    if (keep && info_from(ss, &r, s, &(*out)[*n]) == CPH_OK)
      (*n)++;
    cph_record_free(&cph_session_desc, &r);
  }
  cph_cursor_close(&c);
  cph_txn_abort(&t);
  if (rc != CPH_OK && rc != CPH_ENOTFOUND) {
    for (size_t i = 0; i < *n; i++)
      cph_session_info_free(&(*out)[i]);
    free(*out);
    *out = NULL;
    *n = 0;
    return cph_err_set(err, rc, "%s", t.err.msg);
  }
  return CPH_OK;
}

int sessions_why(cph_sessions *ss, const char *id, cph_why_info *out, cph_err *err) {
  csession *s = sessions_get(ss, id);
  if (!s)
    return cph_err_set(err, CPH_ENOTFOUND, "no session '%s'", id);
  cph_why w;
  cph_sched_why(ss->env->sched, s->sid, &w);
  memset(out, 0, sizeof *out);
  out->reason = cph_why_reason_name(w.reason);
  out->lane = w.lane;
  out->credits = w.credits;
  out->waiting_s = (double)w.waiting_ns / 1e9;
  if (w.reason == CPH_WHY_LANE_NO_BUDGET)
    out->until_ms = w.until_ns == INT64_MAX
                        ? 0
                        : cph_wall_ms() + (w.until_ns - env_now(ss->env)) / CPH_NS_PER_MS;
  out->rank = w.rank;
  out->lane_runnable = w.lane_runnable;
  out->ahead_in_higher_lanes = w.ahead_in_higher_lanes;
  snprintf(out->tenant, sizeof out->tenant, "%s", cph_sched_tenant(ss->env->sched, s->sid));
  out->position = w.position;
  out->tenant_position = w.tenant_position;
  out->tenant_runnable = w.tenant_runnable;
  out->turns_ahead = w.turns_ahead;
  out->est_start_ms = out->est_start_in_s = -1;
  if (w.est_start_ns >= 0) {
    int64_t in_ns = w.est_start_ns - env_now(ss->env);
    out->est_start_in_s = (double)in_ns / 1e9;
    out->est_start_ms = cph_wall_ms() + in_ns / CPH_NS_PER_MS;
  }
  out->staged = s->n_staged;
  out->pending = s->n_pending;
  cph_txn t;
  out->next_report_in_s = -1;
  if (s->reports && cph_txn_begin(ss->env->store, false, &t) == CPH_OK) {
    reports_env env = {ss->env->policy, ss->bp, &t, env_now(ss->env)};
    out->next_report_in_s = reports_next_in_s(ss->reports, s, &env);
    cph_txn_abort(&t);
  }
  if (w.reason == CPH_WHY_NO_INPUT && s->reports && s->n_staged + s->n_pending > 0)
    out->reason = "waiting_for_report";
  return CPH_OK;
}
