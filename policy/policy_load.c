/* Reading and validating a policy file: cph_policy_load_text, cph_policy_load_file. Errors
 * say FILE:LINE:COL and the key path (include/cephalon/policy.h). */
#include "cephalon/policy.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cephalon/edn.h"
#include "common/buf.h"
#include "policy/policy_internal.h"

/* A policy file larger than this is refused rather than read into memory. */
#define POLICY_MAX_BYTES (16u * 1024 * 1024)
/* "got <value>" shows at most this many bytes of the value, then "...". */
#define SHOW_MAX 40
#define SHOW_CAP (SHOW_MAX + 8)
/* Deepest key path in the schema is 5 segments (:maintenance :retention :channels "id" :key). */
#define PATH_MAX_DEPTH 12

/* ======================================================================================
 * What messages show: numbers, choices, values.
 * ==================================================================================== */

static double field_as_double(const void *base, const ps_field *f) {
  return f->kind == PS_INT ? (double)get_int(base, f->off) : get_num(base, f->off);
}

/* d for a message: integral values without a fraction ("1000000000"). */
static void format_plain(double d, char *out, size_t cap) {
  if (d > -1e15 && d < 1e15 && d == (double)(int64_t)d) /* range first: the cast needs it */
    snprintf(out, cap, "%" PRId64, (int64_t)d);
  else
    cph__policy_shortest_double(d, out, cap);
}

/* ":a, :b, :c" */
static void choice_list(const char *const *choices, int skip, char *out, size_t cap) {
  size_t n = 0;
  out[0] = '\0';
  for (int i = 0; choices[i]; i++) {
    if (i == skip)
      continue;
    int w = snprintf(out + n, cap - n, "%s:%s", n ? ", " : "", choices[i]);
    if (w < 0 || (size_t)w >= cap - n)
      return;
    n += (size_t)w;
  }
}

static int choice_index(const char *const *choices, const char *name) {
  for (int i = 0; choices[i]; i++)
    if (strcmp(choices[i], name) == 0)
      return i;
  return -1;
}

/* The value as EDN for "got ...", cut after SHOW_MAX bytes (on a UTF-8 boundary). */
static const char *show(const cph_edn *v, char out[SHOW_CAP]) {
  cph_buf b = CPH_BUF_INIT;
  cph_edn_write(v, &b);
  if (cph_buf_error(&b) || !b.data) {
    snprintf(out, SHOW_CAP, "%s", cph_edn_type_name(v->type));
  } else if (b.len > SHOW_MAX) {
    size_t n = SHOW_MAX;
    while (n > 0 && ((unsigned char)b.data[n] & 0xC0) == 0x80)
      n--;
    snprintf(out, SHOW_CAP, "%.*s...", (int)n, b.data);
  } else {
    snprintf(out, SHOW_CAP, "%s", b.data);
  }
  cph_buf_free(&b);
  return out;
}

/* ======================================================================================
 * Parsing.
 * ==================================================================================== */

typedef enum seg_kind { SEG_KEY, SEG_CHANNEL, SEG_INDEX } seg_kind;

typedef struct seg {
  seg_kind kind;
  const char *s; /* SEG_KEY: keyword name; SEG_CHANNEL: channel id (no NUL inside) */
  size_t index;  /* SEG_INDEX */
} seg;

typedef struct pctx {
  const char *file;
  cph_err *err;
  seg path[PATH_MAX_DEPTH]; /* key path from the root to the value being read */
  int depth;
} pctx;

static void push(pctx *c, seg_kind kind, const char *s, size_t index) {
  assert(c->depth < PATH_MAX_DEPTH);
  c->path[c->depth++] = (seg){kind, s, index};
}

static void pop(pctx *c) { c->depth--; }

static int oom(pctx *c) { return cph_err_set(c->err, CPH_ENOMEM, "%s: out of memory", c->file); }

/* Fails the load: "FILE:LINE:COL: <key path>: <what>". */
static int perr(pctx *c, cph_edn_pos pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(pctx *c, cph_edn_pos pos, const char *fmt, ...) {
  char what[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);

  cph_buf b = CPH_BUF_INIT;
  cph_buf_printf(&b, "%s:%u:%u: ", c->file, (unsigned)pos.line, (unsigned)pos.column);
  for (int i = 0; i < c->depth; i++) {
    const seg *s = &c->path[i];
    if (i)
      cph_buf_putc(&b, ' ');
    if (s->kind == SEG_KEY)
      cph_buf_printf(&b, ":%s", s->s);
    else if (s->kind == SEG_CHANNEL)
      cph__policy_write_string(&b, s->s, strlen(s->s));
    else
      cph_buf_printf(&b, "%zu", s->index);
  }
  if (c->depth)
    cph_buf_puts(&b, ": ");
  cph_buf_puts(&b, what);
  if (cph_buf_error(&b)) {
    cph_buf_free(&b);
    return oom(c);
  }
  /* Cut an over-long message on a UTF-8 boundary: messages may end up in JSON. */
  size_t cap = sizeof c->err->msg - 4;
  if (b.len > cap) {
    while (cap > 0 && ((unsigned char)b.data[cap] & 0xC0) == 0x80)
      cap--;
    b.len = cap;
    b.data[cap] = '\0';
    cph_buf_puts(&b, "...");
  }
  cph_err_set(c->err, CPH_EPOLICY, "%s", b.data);
  cph_buf_free(&b);
  return CPH_EPOLICY;
}

static bool pos_after(cph_edn_pos a, cph_edn_pos b) {
  return a.line > b.line || (a.line == b.line && a.column > b.column);
}

/* Optimal string alignment distance (edits: insert, delete, substitute, swap adjacent);
 * INT_MAX for names too long to be a typo of a key. */
static int edit_distance(const char *a, const char *b) {
  enum { MAXN = 64 };
  size_t n = strlen(a), m = strlen(b);
  if (n > MAXN || m > MAXN)
    return INT_MAX;
  int d[MAXN + 1][MAXN + 1];
  for (size_t i = 0; i <= n; i++)
    d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++)
    d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++) {
    for (size_t j = 1; j <= m; j++) {
      int cost = a[i - 1] != b[j - 1];
      int v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v)
        v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < v)
        v = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  }
  return d[n][m];
}

static size_t common_prefix(const char *a, const char *b) {
  size_t n = 0;
  while (a[n] && a[n] == b[n])
    n++;
  return n;
}

/* The known key the user most likely meant: the closest within 2 edits (and fewer edits
 * than the name is long, so ":a" suggests nothing); failing that, the one key sharing the
 * longest prefix, when that prefix is at least 3 characters and half the name. -1 if none. */
static int suggest(const ps_table *t, const char *name) {
  size_t len = strlen(name);
  int best = -1, best_d = 3;
  for (size_t i = 0; i < t->count; i++) {
    int d = edit_distance(name, t->fields[i].name);
    if (d < best_d && (size_t)d < len) {
      best_d = d;
      best = (int)i;
    }
  }
  if (best >= 0)
    return best;
  size_t best_p = 0;
  bool tie = false;
  for (size_t i = 0; i < t->count; i++) {
    size_t p = common_prefix(name, t->fields[i].name);
    if (p > best_p) {
      best_p = p;
      best = (int)i;
      tie = false;
    } else if (p == best_p && p > 0) {
      tie = true;
    }
  }
  if (best < 0 || tie || best_p < 3 || best_p * 2 < len)
    return -1;
  return best;
}

static int unknown_key(pctx *c, const ps_table *t, const cph_edn *key) {
  int s = suggest(t, key->u.str.ptr);
  if (s >= 0)
    return perr(c, key->pos, "unknown key, did you mean :%s?", t->fields[s].name);
  char list[512];
  size_t n = 0;
  list[0] = '\0';
  for (size_t i = 0; i < t->count && n < sizeof list; i++) {
    int w = snprintf(list + n, sizeof list - n, "%s:%s", i ? ", " : "", t->fields[i].name);
    if (w < 0)
      break;
    n += (size_t)w;
  }
  return perr(c, key->pos, "unknown key, expected one of %s", list);
}

static bool is_lower_hex64(const char *s, size_t len) {
  if (len != 64)
    return false;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return true;
}

/* HOST:PORT with a non-empty host (an IPv6 host in brackets) and a port 0..65535 (0 lets
 * the OS pick, which tests use). */
static bool is_host_port(const char *s) {
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s)
    return false;
  const char *p = colon + 1;
  size_t digits = strspn(p, "0123456789");
  if (digits == 0 || digits > 5 || p[digits] != '\0' || atol(p) > 65535)
    return false;
  size_t host_len = (size_t)(colon - s);
  if (s[0] == '[')
    return host_len > 2 && s[host_len - 1] == ']' && memchr(s + 1, ']', host_len - 2) == NULL;
  for (const char *h = s; h < colon; h++)
    if (*h == ':' || *h == '[' || *h == ']' || *h == '/' || *h == ' ' || *h == '\t')
      return false;
  return true;
}

static const char *string_expectation(const ps_field *f) {
  if (f->flags & PS_HOSTPORT)
    return "a string HOST:PORT";
  if (f->flags & PS_HEX64)
    return "a string of 64 lower-case hex characters";
  if (f->flags & PS_NONEMPTY)
    return "a non-empty string";
  return "a string";
}

static bool is_plain_string(const cph_edn *v) {
  return v->type == CPH_EDN_STRING && strlen(v->u.str.ptr) == v->u.str.len;
}

static int parse_string(pctx *c, const ps_field *f, void *base, const cph_edn *v) {
  char got[SHOW_CAP];
  bool ok = is_plain_string(v);
  if (ok && (f->flags & PS_HOSTPORT))
    ok = is_host_port(v->u.str.ptr);
  if (ok && (f->flags & PS_HEX64))
    ok = is_lower_hex64(v->u.str.ptr, v->u.str.len);
  if (ok && (f->flags & PS_NONEMPTY))
    ok = v->u.str.len > 0;
  if (!ok)
    return perr(c, v->pos, "expected %s, got %s", string_expectation(f), show(v, got));
  char *s = strdup(v->u.str.ptr);
  if (!s)
    return oom(c);
  free(get_str(base, f->off));
  set_str(base, f->off, s);
  return CPH_OK;
}

static int parse_scopes(pctx *c, const ps_field *f, void *base, const cph_edn *v) {
  char got[SHOW_CAP], list[256];
  choice_list(f->choices, -1, list, sizeof list);
  if ((v->type != CPH_EDN_SET && v->type != CPH_EDN_VECTOR) || v->u.coll.count == 0)
    return perr(c, v->pos, "expected a non-empty set of %s, got %s", list, show(v, got));
  unsigned mask = 0;
  for (size_t i = 0; i < v->u.coll.count; i++) {
    const cph_edn *item = &v->u.coll.items[i];
    int k = item->type == CPH_EDN_KEYWORD ? choice_index(f->choices, item->u.str.ptr) : -1;
    if (k < 0)
      return perr(c, item->pos, "expected one of %s, got %s", list, show(item, got));
    mask |= 1u << k;
  }
  set_scopes(base, f->off, mask);
  return CPH_OK;
}

static int parse_section(pctx *c, const ps_table *t, void *base, const cph_edn *map,
                         bool seeded);

static int parse_vector(pctx *c, const ps_field *f, void *base, const cph_edn *v) {
  char got[SHOW_CAP];
  if (v->type != CPH_EDN_VECTOR || v->u.coll.count < (size_t)f->imin) {
    if (f->imin > 0)
      return perr(c, v->pos, "expected a vector of at least %" PRId64 " map%s, got %s", f->imin,
                  f->imin == 1 ? "" : "s", show(v, got));
    return perr(c, v->pos, "expected a vector of maps, got %s", show(v, got));
  }
  cph__policy_free_array(f, base);
  size_t n = v->u.coll.count;
  if (n == 0)
    return CPH_OK;
  void *arr = calloc(n, f->child->size);
  if (!arr)
    return oom(c);
  /* Published at once (zeroed entries are safe to free) so every exit leaves it owned. */
  set_ptr(base, f->off, arr);
  set_size(base, f->count_off, n);
  for (size_t i = 0; i < n; i++) {
    void *elem = element(arr, f->child, i);
    if (cph__policy_init_fields(f->child, elem) != CPH_OK)
      return oom(c);
    push(c, SEG_INDEX, NULL, i);
    int rc = parse_section(c, f->child, elem, &v->u.coll.items[i], false);
    pop(c);
    if (rc)
      return rc;
  }
  return CPH_OK;
}

/* A string in a collection (a channel id key, a PS_STRINGS element) and where it stood, so
 * sorting finds duplicates and source order still picks which one to report. */
typedef struct channel_key {
  const cph_edn *key; /* a plain string (no NUL inside), so strcmp compares all of it */
  size_t index;       /* source order */
} channel_key;

static int channel_key_cmp(const void *pa, const void *pb) {
  const channel_key *a = pa, *b = pb;
  int r = strcmp(a->key->u.str.ptr, b->key->u.str.ptr);
  if (r)
    return r;
  return a->index < b->index ? -1 : a->index > b->index;
}

/* A map from channel id to a child map. Each entry starts as a copy of the sibling named by
 * f->seed (already read: channel maps are read after the rest of their section), so the
 * stored entries are the effective settings. Entries are stored sorted by id. */
static int parse_channels(pctx *c, const ps_table *t, const ps_field *f, void *base,
                          const cph_edn *v) {
  char got[SHOW_CAP];
  /* Channel maps start from a seed section; other named maps (:tenants) have none. */
  const char *what = f->seed ? "channel id" : "name";
  if (v->type != CPH_EDN_MAP)
    return perr(c, v->pos, "expected a map from %s to settings, got %s", what, show(v, got));
  size_t n = v->u.coll.count;
  const cph_edn *items = v->u.coll.items;
  for (size_t i = 0; i < n; i++) {
    const cph_edn *k = &items[2 * i];
    if (!is_plain_string(k) || k->u.str.len == 0)
      return perr(c, k->pos, "expected a %s (a non-empty string) as key, got %s", what,
                  show(k, got));
  }
  cph__policy_free_array(f, base);
  if (n == 0)
    return CPH_OK;

  int rc = CPH_OK;
  channel_key *sorted = malloc(n * sizeof *sorted);
  size_t *slot = malloc(n * sizeof *slot);
  void *arr = calloc(n, f->child->size);
  if (!sorted || !slot || !arr) {
    free(arr);
    rc = oom(c);
    goto done;
  }
  set_ptr(base, f->off, arr);
  set_size(base, f->count_off, n);

  for (size_t i = 0; i < n; i++)
    sorted[i] = (channel_key){&items[2 * i], i};
  qsort(sorted, n, sizeof *sorted, channel_key_cmp);
  /* Equal ids sort together in source order; report the earliest second occurrence. */
  const channel_key *dup = NULL, *first = NULL;
  for (size_t r = 1, group = 0; r < n; r++) {
    if (strcmp(sorted[r].key->u.str.ptr, sorted[group].key->u.str.ptr) != 0) {
      group = r;
      continue;
    }
    if (r == group + 1 && (!dup || sorted[r].index < dup->index)) {
      dup = &sorted[r];
      first = &sorted[group];
    }
  }
  if (dup) {
    push(c, SEG_CHANNEL, dup->key->u.str.ptr, 0);
    rc = perr(c, dup->key->pos, "duplicate key, first given at line %u column %u",
              (unsigned)first->key->pos.line, (unsigned)first->key->pos.column);
    pop(c);
    goto done;
  }
  for (size_t r = 0; r < n; r++)
    slot[sorted[r].index] = r;

  const void *seed = f->seed ? cat(base, sibling(t, f->seed)->off) : NULL;
  for (size_t i = 0; i < n; i++) {
    const cph_edn *k = &items[2 * i];
    void *elem = element(arr, f->child, slot[i]);
    char *id = strdup(k->u.str.ptr);
    if (!id || (seed ? cph__policy_copy_fields(f->child, elem, seed)
                     : cph__policy_init_fields(f->child, elem)) != CPH_OK) {
      free(id);
      rc = oom(c);
      goto done;
    }
    free(get_str(elem, f->child->id_off));
    set_str(elem, f->child->id_off, id);
    push(c, SEG_CHANNEL, k->u.str.ptr, 0);
    rc = parse_section(c, f->child, elem, &items[2 * i + 1], true);
    pop(c);
    if (rc)
      goto done;
  }
done:
  free(sorted);
  free(slot);
  return rc;
}

/* The complaint about one PS_STRINGS element, or NULL when it is fine. */
static const char *string_item_problem(const ps_field *f, const cph_edn *item, char *buf,
                                       size_t cap) {
  if (item->type != CPH_EDN_STRING)
    return "a string";
  if (!is_plain_string(item))
    return "a string without NUL characters";
  if (item->u.str.len < (size_t)f->imin || item->u.str.len > (size_t)f->imax) {
    snprintf(buf, cap, "a string of %" PRId64 " to %" PRId64 " bytes", f->imin, f->imax);
    return buf;
  }
  return NULL;
}

/* A set or vector of strings, stored in source order. A vector's repeats are dropped (the
 * first stays); a set's are an error, as EDN forbids them (the reader lets them through so
 * that this message can name the key path). Problems are reported in source order: the
 * search for repeats covers only the elements before the first bad one. O(n log n). */
static int parse_strings(pctx *c, const ps_field *f, void *base, const cph_edn *v) {
  char got[SHOW_CAP], what[64];
  bool is_set = v->type == CPH_EDN_SET;
  if (!is_set && v->type != CPH_EDN_VECTOR)
    return perr(c, v->pos, "expected a set or vector of strings, got %s", show(v, got));
  const cph_edn *items = v->u.coll.items;
  size_t n = v->u.coll.count, bad = 0;
  while (bad < n && !string_item_problem(f, &items[bad], what, sizeof what))
    bad++;

  int rc = CPH_OK;
  channel_key *sorted = NULL;
  bool *keep = NULL;
  char **arr = NULL;
  size_t kept = 0;
  if (bad > 0) {
    sorted = malloc(bad * sizeof *sorted);
    keep = malloc(bad * sizeof *keep);
    if (!sorted || !keep) {
      rc = oom(c);
      goto done;
    }
    for (size_t i = 0; i < bad; i++) {
      sorted[i] = (channel_key){&items[i], i};
      keep[i] = true;
    }
    qsort(sorted, bad, sizeof *sorted, channel_key_cmp);
    /* Equal strings sort together in source order: all but the first of a run repeat it. */
    const channel_key *dup = NULL, *first = NULL;
    for (size_t r = 1, run = 0; r < bad; r++) {
      if (strcmp(sorted[r].key->u.str.ptr, sorted[run].key->u.str.ptr) != 0) {
        run = r;
        continue;
      }
      keep[sorted[r].index] = false;
      if (!dup || sorted[r].index < dup->index) {
        dup = &sorted[r];
        first = &sorted[run];
      }
    }
    if (is_set && dup) {
      push(c, SEG_INDEX, NULL, dup->index);
      rc = perr(c, dup->key->pos, "duplicate set element, first given at line %u column %u",
                (unsigned)first->key->pos.line, (unsigned)first->key->pos.column);
      pop(c);
      goto done;
    }
  }
  if (bad < n) {
    const char *problem = string_item_problem(f, &items[bad], what, sizeof what);
    push(c, SEG_INDEX, NULL, bad);
    rc = perr(c, items[bad].pos, "expected %s, got %s", problem, show(&items[bad], got));
    pop(c);
    goto done;
  }

  cph__policy_free_strings(f, base);
  if (n == 0)
    goto done;
  arr = calloc(n, sizeof *arr);
  if (!arr) {
    rc = oom(c);
    goto done;
  }
  /* Published at once, the count growing with each copy, so every exit leaves it owned. */
  set_ptr(base, f->off, arr);
  for (size_t i = 0; i < n; i++) {
    if (!keep[i])
      continue;
    if (!(arr[kept] = strdup(items[i].u.str.ptr))) {
      rc = oom(c);
      goto done;
    }
    set_size(base, f->count_off, ++kept);
  }
done:
  free(sorted);
  free(keep);
  return rc;
}

static int parse_value(pctx *c, const ps_field *f, void *base, const cph_edn *v) {
  char got[SHOW_CAP], lo[40], hi[40], list[256];
  switch (f->kind) {
  case PS_INT:
    if (v->type == CPH_EDN_INT && v->u.integer >= f->imin && v->u.integer <= f->imax) {
      set_int(base, f->off, v->u.integer);
      return CPH_OK;
    }
    if (v->type != CPH_EDN_INT && v->type != CPH_EDN_BIGINT) /* wrong type, as DESIGN §8 words it */
      return perr(c, v->pos, "expected %s, got %s",
                  f->imin == 1   ? "a positive integer"
                  : f->imin == 0 ? "a non-negative integer"
                                 : "an integer",
                  show(v, got));
    return perr(c, v->pos, "expected an integer from %" PRId64 " to %" PRId64 ", got %s",
                f->imin, f->imax, show(v, got));
  case PS_NUM: {
    bool is_num = v->type == CPH_EDN_INT || v->type == CPH_EDN_FLOAT;
    double d = v->type == CPH_EDN_INT ? (double)v->u.integer
               : v->type == CPH_EDN_FLOAT ? v->u.floating
                                          : 0;
    bool above = (f->flags & PS_MIN_EXCLUSIVE) ? d > f->dmin : d >= f->dmin;
    if (is_num && above && d <= f->dmax) { /* NaN fails both comparisons */
      set_num(base, f->off, d);
      return CPH_OK;
    }
    format_plain(f->dmin, lo, sizeof lo);
    format_plain(f->dmax, hi, sizeof hi);
    if (f->flags & PS_MIN_EXCLUSIVE)
      return perr(c, v->pos, "expected a number greater than %s and at most %s, got %s", lo, hi,
                  show(v, got));
    return perr(c, v->pos, "expected a number from %s to %s, got %s", lo, hi, show(v, got));
  }
  case PS_BOOL:
    if (v->type != CPH_EDN_BOOL)
      return perr(c, v->pos, "expected true or false, got %s", show(v, got));
    set_bool(base, f->off, v->u.boolean);
    return CPH_OK;
  case PS_STR:
    return parse_string(c, f, base, v);
  case PS_CHOICE: {
    int k = v->type == CPH_EDN_KEYWORD ? choice_index(f->choices, v->u.str.ptr) : -1;
    if (k < 0) {
      choice_list(f->choices, -1, list, sizeof list);
      return perr(c, v->pos, "expected one of %s, got %s", list, show(v, got));
    }
    set_choice(base, f->off, k);
    return CPH_OK;
  }
  case PS_SCOPES:
    return parse_scopes(c, f, base, v);
  case PS_SECTION:
    if (f->flags & PS_OPTIONAL)
      set_bool(base, f->present_off, true);
    return parse_section(c, f->child, at(base, f->off), v, false);
  case PS_VECTOR:
    return parse_vector(c, f, base, v);
  case PS_STRINGS:
    return parse_strings(c, f, base, v);
  case PS_CHANNELS: /* read by parse_section once its seed is complete */
    break;
  }
  return CPH_OK;
}

static const char *number_kind(const ps_field *f) {
  return f->kind == PS_INT ? "an integer" : "a number";
}

/* Cross-field constraints of one map, on its final (seeded or defaulted) values. The error
 * names whichever of the two fields comes later in the file, at that field's value. */
static int run_checks(pctx *c, const ps_table *t, const void *base, const cph_edn *map,
                      const cph_edn *const *given) {
  char got[SHOW_CAP], num[40], list[256];
  for (size_t i = 0; i < t->check_count; i++) {
    const ps_check *k = &t->checks[i];
    int ia = find_field(t, k->a), ib = find_field(t, k->b);
    assert(ia >= 0 && ib >= 0);
    const ps_field *fa = &t->fields[ia], *fb = &t->fields[ib];
    const cph_edn *va = given[ia], *vb = given[ib];
    bool b_later = vb && (!va || pos_after(vb->pos, va->pos));
    const cph_edn *late = b_later ? vb : va ? va : map;
    int rc;
    switch (k->kind) {
    case PS_CHECK_LE: {
      double a = field_as_double(base, fa), b = field_as_double(base, fb);
      if (a <= b)
        continue;
      if (b_later) {
        format_plain(a, num, sizeof num);
        push(c, SEG_KEY, fb->name, 0);
        rc = perr(c, late->pos, "expected %s >= :%s (%s), got %s", number_kind(fb), fa->name,
                  num, show(late, got));
      } else {
        format_plain(b, num, sizeof num);
        push(c, SEG_KEY, fa->name, 0);
        rc = perr(c, late->pos, "expected %s <= :%s (%s), got %s", number_kind(fa), fb->name,
                  num, show(late, got));
      }
      pop(c);
      return rc;
    }
    case PS_CHECK_URL_FOR: {
      const char *url = get_str(base, fb->off);
      if (get_choice(base, fa->off) != (int)k->choice || (url && url[0]))
        continue;
      if (b_later) {
        push(c, SEG_KEY, fb->name, 0);
        rc = perr(c, late->pos, "expected a non-empty URL when :%s is :%s, got %s", fa->name,
                  fa->choices[k->choice], show(late, got));
      } else {
        choice_list(fa->choices, (int)k->choice, list, sizeof list);
        push(c, SEG_KEY, fa->name, 0);
        rc = perr(c, late->pos, "expected %s unless :%s is set, got %s", list, fb->name,
                  show(late, got));
      }
      pop(c);
      return rc;
    }
    }
  }
  return CPH_OK;
}

/* Reads a map described by t into base. Keys are checked in source order (keyword, known,
 * not repeated); channel maps are read last because they start from a sibling section.
 * seeded: base already holds a channel entry's inherited values, so absent keys keep them
 * instead of being derived. */
static int parse_section(pctx *c, const ps_table *t, void *base, const cph_edn *map,
                         bool seeded) {
  char got[SHOW_CAP];
  if (map->type != CPH_EDN_MAP)
    return perr(c, map->pos, "expected a map, got %s", show(map, got));
  const cph_edn *keys[PS_MAX_FIELDS] = {0}, *vals[PS_MAX_FIELDS] = {0};
  const cph_edn *items = map->u.coll.items;
  int rc;
  for (size_t i = 0; i < map->u.coll.count; i++) {
    const cph_edn *k = &items[2 * i], *v = &items[2 * i + 1];
    if (k->type != CPH_EDN_KEYWORD)
      return perr(c, k->pos, "expected a keyword key, got %s", show(k, got));
    int idx = find_field(t, k->u.str.ptr);
    push(c, SEG_KEY, k->u.str.ptr, 0);
    if (idx < 0) {
      rc = unknown_key(c, t, k);
    } else if (keys[idx]) {
      rc = perr(c, k->pos, "duplicate key, first given at line %u column %u",
                (unsigned)keys[idx]->pos.line, (unsigned)keys[idx]->pos.column);
    } else {
      keys[idx] = k;
      vals[idx] = v;
      rc = parse_value(c, &t->fields[idx], base, v);
    }
    pop(c);
    if (rc)
      return rc;
  }
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    if (f->kind != PS_CHANNELS || !vals[i])
      continue;
    push(c, SEG_KEY, f->name, 0);
    rc = parse_channels(c, t, f, base, vals[i]);
    pop(c);
    if (rc)
      return rc;
  }
  if (!seeded)
    cph__policy_derive_defaults(t, base, vals);
  for (size_t i = 0; i < t->count; i++)
    if ((t->fields[i].flags & PS_REQUIRED) && !vals[i])
      return perr(c, map->pos, "missing required key :%s", t->fields[i].name);
  rc = run_checks(c, t, base, map, vals);
  if (rc == CPH_OK && t->validate) {
    char msg[300];
    const char *key = NULL;
    if (t->validate(base, &key, msg, sizeof msg)) {
      int idx = key ? find_field(t, key) : -1;
      const cph_edn *at = idx >= 0 && vals[idx] ? vals[idx] : map;
      if (at != map)
        push(c, SEG_KEY, t->fields[idx].name, 0);
      rc = perr(c, at->pos, "%s", msg);
      if (at != map)
        pop(c);
    }
  }
  return rc;
}

/* ======================================================================================
 * Public API: loading.
 * ==================================================================================== */

int cph_policy_load_text(const char *name, const char *text, size_t len, cph_policy **out,
                         cph_err *err) {
  char got[SHOW_CAP];
  *out = NULL;
  if (!name)
    name = "policy";
  pctx c = {.file = name, .err = err, .depth = 0};
  cph_edn_options opts = {.max_depth = 0, .allow_duplicate_keys = true};
  cph_edn_error perr_info = {0};
  cph_edn *root = NULL;
  int rc = cph_edn_parse(text, len, &opts, &root, &perr_info);
  if (rc == CPH_ENOMEM)
    return cph_err_set(err, CPH_ENOMEM, "%s: out of memory", name);
  if (rc != CPH_OK)
    return cph_err_set(err, CPH_EPOLICY, "%s:%u:%u: %s", name, (unsigned)perr_info.line,
                       (unsigned)perr_info.column, perr_info.message);

  cph_policy *p = cph_policy_new_default();
  char *source = strdup(name);
  if (!p || !source) {
    rc = cph_err_set(err, CPH_ENOMEM, "%s: out of memory", name);
    goto fail;
  }
  free(p->source);
  p->source = source;
  source = NULL;

  if (root->type != CPH_EDN_MAP) {
    rc = cph_err_set(err, CPH_EPOLICY, "%s:%u:%u: expected a map at the top level, got %s", name,
                     (unsigned)root->pos.line, (unsigned)root->pos.column, show(root, got));
    goto fail;
  }
  rc = parse_section(&c, &cph__policy_schema, p, root, false);
  if (rc)
    goto fail;
  cph_edn_free(root);
  *out = p;
  return CPH_OK;

fail:
  free(source);
  cph_policy_free(p);
  cph_edn_free(root);
  return rc;
}

int cph_policy_load_file(const char *path, cph_policy **out, cph_err *err) {
  *out = NULL;
  cph_buf text = CPH_BUF_INIT;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  int e = 0;
  if (fd < 0) {
    e = errno;
  } else {
    struct stat st;
    if (fstat(fd, &st) != 0)
      e = errno;
    else if (S_ISDIR(st.st_mode))
      e = EISDIR;
  }
  while (fd >= 0 && !e) {
    char chunk[65536];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      e = errno;
      break;
    }
    if (n == 0)
      break;
    if (text.len + (size_t)n > POLICY_MAX_BYTES) {
      close(fd);
      cph_buf_free(&text);
      return cph_err_set(err, CPH_EPOLICY, "%s: larger than %u bytes", path, POLICY_MAX_BYTES);
    }
    cph_buf_append(&text, chunk, (size_t)n);
  }
  if (fd >= 0)
    close(fd);
  if (e) {
    char msg[128];
    if (strerror_r(e, msg, sizeof msg) != 0)
      snprintf(msg, sizeof msg, "error %d", e);
    cph_buf_free(&text);
    return cph_err_set(err, CPH_EIO, "%s: %s", path, msg);
  }
  if (cph_buf_error(&text)) {
    cph_buf_free(&text);
    return cph_err_set(err, CPH_ENOMEM, "%s: out of memory", path);
  }
  int rc = cph_policy_load_text(path, text.data ? text.data : "", text.len, out, err);
  cph_buf_free(&text);
  return rc;
}
