/* Folded inbox entries in the store (inbox.h). */
#include "inbox.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define INBOX_FOLD_VERSION 1
#define INBOX_FOLD_LEN 22 /* version, fold, be64 fold_key, be32 count, be64 last_ms */

const char *inbox_fold_name(uint8_t fold) {
  switch (fold) {
  case INBOX_FOLD_REPEAT: return "repeat";
  case INBOX_FOLD_OVERFLOW: return "overflow";
  default: return "none";
  }
}

static cph_key entry_key(const char *session, uint64_t inbox_id) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, inbox_id);
  return k;
}

/* Logs that the inbox_folds value at key (key_len bytes) is corrupt — `what` says how — and
 * returns CPH_ECORRUPT. */
static int folds_corrupt(const void *key, size_t key_len, const char *what, ...)
    __attribute__((format(printf, 3, 4)));
static int folds_corrupt(const void *key, size_t key_len, const char *what, ...) {
  char k[200], why[200];
  cph_key_describe(key, key_len, k, sizeof k);
  va_list ap;
  va_start(ap, what);
  vsnprintf(why, sizeof why, what, ap);
  va_end(ap);
  cph_log(CPH_LOG_ERROR, "corrupt record in database \"inbox_folds\" at key %s: %s", k, why);
  return CPH_ECORRUPT;
}

#define INBOX_FOLDED_VERSION 1
#define INBOX_FOLDED_HEAD 9 /* version, be64 through; then be64 live ids */
#define INBOX_FOLDED_STACK 64 /* live ids encoded without a malloc */

int inbox_folded_get(cph_txn *t, const char *session, inbox_folded *f) {
  *f = (inbox_folded){0};
  cph_key k = entry_key(session, 0);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_INBOX_FOLDS, &k, &v);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  const uint8_t *p = v.data;
  if (v.len < INBOX_FOLDED_HEAD || (v.len - INBOX_FOLDED_HEAD) % 8 ||
      p[0] != INBOX_FOLDED_VERSION) {
    return folds_corrupt(k.data, k.len,
                         "expected a version %d folded map (9 + 8n bytes), got %zu bytes",
                         INBOX_FOLDED_VERSION, v.len);
  }
  f->through = cph_be64_get(p + 1);
  f->live = p + INBOX_FOLDED_HEAD;
  f->n = (v.len - INBOX_FOLDED_HEAD) / 8;
  return CPH_OK;
}

bool inbox_folded_holds(const inbox_folded *f, uint64_t id) {
  if (id > f->through)
    return false;
  size_t lo = 0, hi = f->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    uint64_t m = cph_be64_get(f->live + 8 * mid);
    if (m == id)
      return false;
    if (m < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return true;
}

int inbox_folded_put(cph_txn *t, const csession *s, uint64_t folded) {
  inbox_folded old;
  int rc = inbox_folded_get(t, s->id, &old);
  if (rc)
    return rc;
  uint64_t through = old.through > folded ? old.through : folded;
  if (!through)
    return t->ret; /* nothing folded away, ever: no map */
  size_t n = 0; /* the live inbox is in id order: the entries <= through lead it */
  while (n < s->n_inbox && s->inbox[n].id <= through)
    n++;
  uint8_t stack[INBOX_FOLDED_HEAD + 8 * INBOX_FOLDED_STACK];
  size_t len = INBOX_FOLDED_HEAD + 8 * n;
  uint8_t *v = len <= sizeof stack ? stack : malloc(len);
  if (!v)
    return CPH_ENOMEM;
  v[0] = INBOX_FOLDED_VERSION;
  cph_be64_put(v + 1, through);
  for (size_t i = 0; i < n; i++)
    cph_be64_put(v + INBOX_FOLDED_HEAD + 8 * i, s->inbox[i].id);
  cph_key k = entry_key(s->id, 0);
  rc = cph_txn_put(t, CPH_DB_INBOX_FOLDS, &k, v, len);
  if (v != stack)
    free(v);
  return rc;
}

int inbox_fold_put(cph_txn *t, const char *session, const inbox_item *it) {
  uint8_t v[INBOX_FOLD_LEN];
  v[0] = INBOX_FOLD_VERSION;
  v[1] = it->fold;
  cph_be64_put(v + 2, it->fold_key);
  cph_be32_put(v + 10, it->count);
  cph_be64_put(v + 14, (uint64_t)it->last_ms);
  cph_key k = entry_key(session, it->id);
  return cph_txn_put(t, CPH_DB_INBOX_FOLDS, &k, v, sizeof v);
}

int inbox_fold_add(cph_txn *t, const char *session, uint64_t inbox_id, uint64_t event_id) {
  cph_key k = entry_key(session, inbox_id);
  cph_key_u64(&k, event_id);
  return cph_txn_put(t, CPH_DB_INBOX_FOLDS, &k, "", 0);
}

#define MEMBERS_STACK 64 /* a member row's further ids encoded without a malloc */

int inbox_fold_add_many(cph_txn *t, const char *session, uint64_t inbox_id,
                        const uint64_t *event_ids, size_t n) {
  if (!n)
    return t->ret;
  uint8_t stack[8 * MEMBERS_STACK];
  size_t len = 8 * (n - 1);
  uint8_t *v = len <= sizeof stack ? stack : malloc(len);
  if (!v)
    return CPH_ENOMEM;
  for (size_t i = 1; i < n; i++)
    cph_be64_put(v + 8 * (i - 1), event_ids[i]);
  cph_key k = entry_key(session, inbox_id);
  cph_key_u64(&k, event_ids[0]);
  int rc = cph_txn_put(t, CPH_DB_INBOX_FOLDS, &k, v, len);
  if (v != stack)
    free(v);
  return rc;
}

/* Calls row(ctx, first, more, n_more) for every member row of the entry, in key order (its
 * first member's id); stops at the first error. A row whose value is not whole ids is
 * CPH_ECORRUPT, logged with its key. */
static int member_rows_each(cph_txn *t, const char *session, uint64_t inbox_id,
                            int (*row)(void *ctx, uint64_t first, const uint8_t *more, size_t n),
                            void *ctx) {
  cph_key prefix = entry_key(session, inbox_id);
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_INBOX_FOLDS, &c);
  if (rc)
    return rc;
  cph_val k, v;
  for (rc = cph_cursor_seek(&c, &prefix, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    if (k.len < prefix.len || memcmp(k.data, prefix.data, prefix.len) != 0)
      break;
    if (k.len != prefix.len + 8)
      continue; /* the fold record itself */
    if (v.len % 8) {
      rc = folds_corrupt(k.data, k.len, "a member row of %zu bytes, not whole event ids", v.len);
      break;
    }
    rc = row(ctx, cph_be64_get((const uint8_t *)k.data + prefix.len), v.data, v.len / 8);
    if (rc)
      break;
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

typedef struct id_list {
  uint64_t *ids;
  size_t n, cap;
} id_list;

static int id_list_add(void *ctx, uint64_t id) {
  id_list *l = ctx;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    uint64_t *p = realloc(l->ids, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    l->ids = p;
    l->cap = cap;
  }
  l->ids[l->n++] = id;
  return CPH_OK;
}

/* Adds every member of a row to the id_list ctx. */
static int row_ids_add(void *ctx, uint64_t first, const uint8_t *more, size_t n) {
  int rc = id_list_add(ctx, first);
  for (size_t i = 0; rc == CPH_OK && i < n; i++)
    rc = id_list_add(ctx, cph_be64_get(more + 8 * i));
  return rc;
}

/* The rows of an entry as collected by inbox_fold_move: each row's first id (its key), and
 * every member. */
typedef struct rows_list {
  id_list keys, ids;
} rows_list;

static int rows_add(void *ctx, uint64_t first, const uint8_t *more, size_t n) {
  rows_list *r = ctx;
  int rc = id_list_add(&r->keys, first);
  return rc ? rc : row_ids_add(&r->ids, first, more, n);
}

static int ids_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int inbox_fold_move(cph_txn *t, const char *session, uint64_t from, uint64_t to) {
  /* Collected first: the cursor must not walk rows this very loop writes. */
  rows_list r = {0};
  int rc = member_rows_each(t, session, from, rows_add, &r);
  for (size_t i = 0; rc == CPH_OK && i < r.keys.n; i++) {
    cph_key k = entry_key(session, from);
    cph_key_u64(&k, r.keys.ids[i]);
    rc = cph_txn_del(t, CPH_DB_INBOX_FOLDS, &k);
  }
  if (rc == CPH_OK && r.ids.n) { /* one row under `to`, in id order */
    qsort(r.ids.ids, r.ids.n, sizeof *r.ids.ids, ids_cmp);
    rc = inbox_fold_add_many(t, session, to, r.ids.ids, r.ids.n);
  }
  free(r.keys.ids);
  free(r.ids.ids);
  if (rc == CPH_OK) {
    cph_key k = entry_key(session, from);
    rc = cph_txn_del(t, CPH_DB_INBOX_FOLDS, &k);
    if (rc == CPH_ENOTFOUND)
      rc = CPH_OK;
  }
  return rc;
}

int inbox_fold_get(cph_txn *t, const char *session, inbox_item *it) {
  it->count = 1;
  it->fold = INBOX_FOLD_NONE;
  it->fold_key = 0;
  it->last_ms = it->created_ms;
  cph_key k = entry_key(session, it->id);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_INBOX_FOLDS, &k, &v);
  if (rc == CPH_ENOTFOUND)
    return CPH_OK;
  if (rc)
    return rc;
  const uint8_t *p = v.data;
  if (v.len != INBOX_FOLD_LEN || p[0] != INBOX_FOLD_VERSION || p[1] > INBOX_FOLD_OVERFLOW ||
      cph_be32_get(p + 10) == 0) {
    return folds_corrupt(k.data, k.len, "expected %d bytes of version %d, got %zu bytes",
                         INBOX_FOLD_LEN, INBOX_FOLD_VERSION, v.len);
  }
  it->fold = p[1];
  it->fold_key = cph_be64_get(p + 2);
  it->count = cph_be32_get(p + 10);
  it->last_ms = (int64_t)cph_be64_get(p + 14);
  return CPH_OK;
}

int inbox_fold_events(cph_txn *t, const char *session, const inbox_item *it, uint64_t **ids,
                      size_t *n) {
  id_list l = {0};
  int rc = id_list_add(&l, it->event_id);
  if (rc == CPH_OK && it->count > 1)
    rc = member_rows_each(t, session, it->id, row_ids_add, &l);
  if (rc == CPH_OK && l.n > 2) /* the members in id order, whatever rows hold them */
    qsort(l.ids + 1, l.n - 1, sizeof *l.ids, ids_cmp);
  if (rc) {
    free(l.ids);
    *ids = NULL;
    *n = 0;
    return rc;
  }
  *ids = l.ids;
  *n = l.n;
  return CPH_OK;
}

/* Appends a copy of s to v. v's array holds max(4, the next power of two) entries once it has
 * any, so it grows when count reaches 4, 8, 16... */
static int strv_push(cph_strv *v, const char *s) {
  size_t n = v->count;
  if (n == 0 || (n >= 4 && (n & (n - 1)) == 0)) {
    char **items = realloc(v->items, (n ? 2 * n : 4) * sizeof *items);
    if (!items)
      return CPH_ENOMEM;
    v->items = items;
  }
  if (!(v->items[n] = strdup(s)))
    return CPH_ENOMEM;
  v->count++;
  return CPH_OK;
}

int inbox_event_keys(cph_txn *t, const char *session, const inbox_item *it, cph_strv *out) {
  static const char *const fields[] = {"key"};
  uint64_t mask = cph_record_field_mask(&cph_event_desc, fields, 1);
  uint64_t *ids = NULL;
  size_t n = 0;
  int rc = inbox_fold_events(t, session, it, &ids, &n);
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    cph_key k;
    cph_key_reset(&k);
    cph_key_u64(&k, ids[i]);
    cph_event_rec ev;
    int grc = cph_txn_get_record_some(t, CPH_DB_EVENTS, &k, &cph_event_desc, &ev, mask);
    if (grc == CPH_ENOTFOUND)
      continue; /* retention deleted it: nothing left to name */
    if (grc) {
      rc = grc;
      break;
    }
    if (ev.key)
      rc = strv_push(out, ev.key);
    cph_record_free(&cph_event_desc, &ev);
  }
  free(ids);
  return rc;
}
