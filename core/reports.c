/* Report turns (reports.h). */
#include "reports.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backpressure.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/hmap.h"

#define CHECK_PERIOD_NS CPH_NS_PER_S
#define REPORT_LINES_MAX 20 /* entries listed per channel; the rest are counted */

typedef struct report_state {
  char *id; /* owned: the map's key */
  csession *s; /* the registry's: stable until the session is deleted (reports_forget) */
  uint32_t interval_s;
  int64_t last_ns; /* engine clock: the last report (or registration, or open) */
} report_state;

typedef struct cph_reports {
  cph_hmap by_id;
  int64_t next_check_ns;
} cph_reports;

int reports_open(cph_reports **out) {
  *out = calloc(1, sizeof **out);
  return *out ? CPH_OK : CPH_ENOMEM;
}

void reports_close(cph_reports *rp) {
  if (!rp)
    return;
  cph_hmap *m = &rp->by_id;
  for (size_t i = 0; i < m->cap; i++)
    if (m->slots[i].key) {
      report_state *r = m->slots[i].value;
      free(r->id);
      free(r);
    }
  cph_hmap_free(m);
  free(rp);
}

void reports_forget(cph_reports *rp, const char *id) {
  report_state *r = rp ? cph_hmap_del(&rp->by_id, id) : NULL;
  if (r) {
    free(r->id);
    free(r);
  }
}

int reports_set(cph_reports *rp, csession *s, uint32_t interval_s, int64_t now_ns) {
  s->report_due = false;
  s->reports = false;
  if (!interval_s) {
    reports_forget(rp, s->id);
    return CPH_OK;
  }
  report_state *r = cph_hmap_get(&rp->by_id, s->id);
  if (!r) {
    r = calloc(1, sizeof *r);
    if (!r || !(r->id = strdup(s->id)) || cph_hmap_put(&rp->by_id, r->id, r)) {
      if (r)
        free(r->id);
      free(r);
      return CPH_ENOMEM;
    }
  }
  r->s = s;
  r->interval_s = interval_s;
  r->last_ns = now_ns;
  s->reports = true;
  return CPH_OK;
}

bool reports_has_unheld(const csession *s) {
  for (uint32_t i = 0; i < s->n_inbox; i++)
    if (s->inbox[i].status == CPH_INBOX_STAGED && !reports_holds(s, &s->inbox[i]))
      return true;
  return false;
}

/* Whether the channel of event id (read through t) is at backpressure step 4 or more. */
static bool event_channel_delayed(const reports_env *env, uint64_t id) {
  static const char *const fields[] = {"channel"};
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_event_rec ev;
  uint64_t mask = cph_record_field_mask(&cph_event_desc, fields, 1);
  if (cph_txn_get_record_some(env->t, CPH_DB_EVENTS, &k, &cph_event_desc, &ev, mask) != CPH_OK)
    return false;
  bool delayed = ev.channel && backpressure_reports_delayed(env->bp, env->p, ev.channel);
  cph_record_free(&cph_event_desc, &ev);
  return delayed;
}

/* The interval in force: stretched when a channel of the held entries is at step 4. O(inbox)
 * event reads, once a second per reporter holding something. */
static int64_t interval_ns(const reports_env *env, const csession *s, const report_state *r) {
  int64_t ns = (int64_t)r->interval_s * CPH_NS_PER_S;
  for (uint32_t i = 0; i < s->n_inbox; i++) {
    const inbox_item *it = &s->inbox[i];
    if (reports_holds(s, it) && !it->turn_id && event_channel_delayed(env, it->event_id))
      return ns * env->p->backpressure.report_delay_factor;
  }
  return ns;
}

void reports_tick(cph_reports *rp, const reports_env *env, void (*on_due)(void *ctx, csession *s),
                  void *ctx) {
  int64_t now = env->now_ns;
  if (!rp || now < rp->next_check_ns)
    return;
  rp->next_check_ns = now + CHECK_PERIOD_NS;
  for (size_t i = 0; i < rp->by_id.cap; i++) {
    if (!rp->by_id.slots[i].key)
      continue;
    report_state *r = rp->by_id.slots[i].value;
    csession *s = r->s;
    if (s->report_due || !s->n_staged || s->running_turn)
      continue;
    if (now - r->last_ns >= interval_ns(env, s, r)) {
      s->report_due = true;
      on_due(ctx, s);
    }
  }
}

void reports_done(cph_reports *rp, csession *s, int64_t now_ns) {
  report_state *r = rp ? cph_hmap_get(&rp->by_id, s->id) : NULL;
  if (r)
    r->last_ns = now_ns;
  s->report_due = false;
}

int64_t reports_next_in_s(const cph_reports *rp, const csession *s, const reports_env *env) {
  report_state *r = rp ? cph_hmap_get(&rp->by_id, s->id) : NULL;
  if (!r)
    return -1;
  if (s->report_due)
    return 0;
  int64_t left = r->last_ns + interval_ns(env, s, r) - env->now_ns;
  return left > 0 ? (left + CPH_NS_PER_S - 1) / CPH_NS_PER_S : 0;
}

/* The first line of a folded body (fold_describe): the entry's own text for a single event. */
static void first_line(const char *body, cph_buf *b) {
  const char *nl = strchr(body, '\n');
  cph_buf_append(b, body, nl ? (size_t)(nl - body) : strlen(body));
}

char *reports_input(const cph_staged_msg *staged, size_t n) {
  cph_buf b = CPH_BUF_INIT;
  cph_buf_puts(&b, "report:");
  bool *done = calloc(n ? n : 1, sizeof *done);
  if (!done)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    if (done[i])
      continue;
    /* One channel: its totals, then its entries (each a family or one message). */
    uint64_t total = 0;
    int64_t first = staged[i].ts_ms, last = staged[i].last_ms;
    for (size_t j = i; j < n; j++)
      if (strcmp(staged[j].channel, staged[i].channel) == 0) {
        total += staged[j].count;
        if (staged[j].ts_ms < first)
          first = staged[j].ts_ms;
        if (staged[j].last_ms > last)
          last = staged[j].last_ms;
      }
    char f[8], l[8];
    cph_hhmm_utc(first, f);
    cph_hhmm_utc(last, l);
    cph_buf_printf(&b, "\n#%s: %llu message%s, %s–%s", staged[i].channel,
                   (unsigned long long)total, total == 1 ? "" : "s", f, l);
    size_t listed = 0;
    uint64_t unlisted = 0;
    for (size_t j = i; j < n; j++) {
      if (done[j] || strcmp(staged[j].channel, staged[i].channel) != 0)
        continue;
      done[j] = true;
      if (listed == REPORT_LINES_MAX) {
        unlisted += staged[j].count;
        continue;
      }
      listed++;
      cph_buf_printf(&b, "\n- ×%u %s: ", staged[j].count, staged[j].sender);
      first_line(staged[j].body, &b);
    }
    if (unlisted)
      cph_buf_printf(&b, "\n- … and %llu more", (unsigned long long)unlisted);
  }
  free(done);
  return cph_buf_steal(&b);
}
