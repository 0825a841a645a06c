/* The live operations view (GET /v1/top, cephalonctl top): the busiest sessions and the
 * channels under backpressure.
 *
 * These are on-demand admin reads, not part of the scheduler pass: each scans an in-memory
 * map once. top_sessions() is O(sessions · log n) for the scan plus n short LMDB
 * read transactions for the chosen sessions' records; top_channel_steps() is
 * O(tracked channels · log channels). Neither writes anything. */
#include <stdlib.h>
#include <string.h>

#include "backpressure.h"
#include "sessions.h"
#include "top.h"

/* ---------------------------------------------------------------- busiest sessions */

typedef struct top_cand {
  const csession *s;
  uint64_t load; /* staged + pending */
} top_cand;

/* Whether a ranks before b: more load first, then lower id (a total order, since ids are
 * unique, so the answer does not depend on the hash map's layout). */
static bool top_before(const top_cand *a, const top_cand *b) {
  if (a->load != b->load)
    return a->load > b->load;
  return strcmp(a->s->id, b->s->id) < 0;
}

/* The heap keeps the n best candidates seen so far with the worst of them at the root, so
 * a newcomer is compared with the root only. */
static void heap_sift_down(top_cand *h, size_t len, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, worst = i;
    if (l < len && top_before(&h[worst], &h[l]))
      worst = l;
    if (r < len && top_before(&h[worst], &h[r]))
      worst = r;
    if (worst == i)
      return;
    top_cand tmp = h[i];
    h[i] = h[worst];
    h[worst] = tmp;
    i = worst;
  }
}

static void heap_sift_up(top_cand *h, size_t i) {
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!top_before(&h[parent], &h[i]))
      return;
    top_cand tmp = h[i];
    h[i] = h[parent];
    h[parent] = tmp;
    i = parent;
  }
}

static int cand_cmp(const void *pa, const void *pb) {
  const top_cand *a = pa, *b = pb;
  return top_before(a, b) ? -1 : top_before(b, a) ? 1 : 0;
}

int top_sessions(cph_sessions *ss, size_t n, cph_session_info **out, size_t *n_out,
                 cph_err *err) {
  *out = NULL;
  *n_out = 0;
  if (n == 0)
    n = CPH_TOP_SESSIONS_DEFAULT;
  if (n > CPH_TOP_SESSIONS_MAX)
    n = CPH_TOP_SESSIONS_MAX;
  top_cand *heap = malloc(n * sizeof *heap);
  if (!heap)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  size_t len = 0;
  for (size_t i = 0; i < sessions_sid_cap(ss); i++) {
    const csession *s = sessions_at(ss, i);
    if (!s)
      continue;
    top_cand c = {s, (uint64_t)s->n_staged + s->n_pending};
    if (c.load == 0)
      continue;
    if (len < n) {
      heap[len] = c;
      heap_sift_up(heap, len++);
    } else if (top_before(&c, &heap[0])) {
      heap[0] = c;
      heap_sift_down(heap, len, 0);
    }
  }
  qsort(heap, len, sizeof *heap, cand_cmp);

  int rc = CPH_OK;
  cph_session_info *list = len ? calloc(len, sizeof *list) : NULL;
  if (len && !list)
    rc = cph_err_set(err, CPH_ENOMEM, "out of memory");
  size_t got = 0;
  for (size_t i = 0; rc == CPH_OK && i < len; i++) {
    /* The full read (record + live state) reuses the session read's rules; the session
     * exists in memory, so its record does too unless the store fails. */
    int grc = sessions_info(ss, heap[i].s->id, &list[got], err);
    if (grc == CPH_OK)
      got++;
    else if (grc != CPH_ENOTFOUND)
      rc = grc;
  }
  free(heap);
  if (rc != CPH_OK) {
    for (size_t i = 0; i < got; i++)
      cph_session_info_free(&list[i]);
    free(list);
    return rc;
  }
  *out = list;
  *n_out = got;
  return CPH_OK;
}

/* ---------------------------------------------------------------- backpressure steps */

typedef struct steps_acc {
  uint32_t min_step;
  cph_channel_step *items;
  size_t n, cap;
  bool oom;
} steps_acc;

static void steps_collect(void *ctx, const char *chan, int step) {
  steps_acc *a = ctx;
  if (a->oom || step < 0 || (uint32_t)step < a->min_step)
    return;
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 16;
    cph_channel_step *p = realloc(a->items, cap * sizeof *p);
    if (!p) {
      a->oom = true;
      return;
    }
    a->items = p;
    a->cap = cap;
  }
  cph_channel_step *c = &a->items[a->n];
  c->channel = strdup(chan);
  if (!c->channel) {
    a->oom = true;
    return;
  }
  c->step = (uint32_t)step;
  c->step_name = cph_bp_step_name(c->step);
  a->n++;
}

/* Deepest step first, then by name. */
static int step_cmp(const void *pa, const void *pb) {
  const cph_channel_step *a = pa, *b = pb;
  if (a->step != b->step)
    return a->step > b->step ? -1 : 1;
  return strcmp(a->channel, b->channel);
}

void cph_channel_steps_free(cph_channel_step *steps, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(steps[i].channel);
  free(steps);
}

int top_channel_steps(struct cph_backpressure *bp, const cph_policy *policy, uint32_t min_step,
                      cph_channel_step **out, size_t *n, cph_err *err) {
  steps_acc a = {.min_step = min_step};
  backpressure_foreach(bp, policy, steps_collect, &a);
  if (a.oom) {
    cph_channel_steps_free(a.items, a.n);
    *out = NULL;
    *n = 0;
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  }
  if (a.n > 1)
    qsort(a.items, a.n, sizeof *a.items, step_cmp);
  *out = a.items;
  *n = a.n;
  return CPH_OK;
}
