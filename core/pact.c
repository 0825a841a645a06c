/* The PACT context tree (DESIGN §6): coordinates, selectors, the episode step and the render
 * order. Contract in pact.h; decisions the header leaves open are stated where they are made:
 *   - insert places a lifecycle node at stage 0 (its at/ttl come from lifecycle[0]) and a new
 *     node is never waiting; cadence and lifecycle cannot be combined (§6 gives no meaning to
 *     a cadence past the last stage, where a lifecycle node is removed);
 *   - ODI with a negative delta removes a node whose depth would fall below 0 (see odi_shift);
 *   - the step keeps t->nodes in seq order (it sorts them if a loader left them otherwise), so
 *     a pointer from cph_pact_find is valid only until the next insert, delete or step. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pact.h"

/* ---------------------------------------------------------------- allocation */

/* Test hook (tests/unit/test_pact.c declares it; not part of pact.h): when > 0, allocations
 * count it down and the one that brings it to 0 fails, so every ENOMEM path is exercised. */
long cph_pact__fail_alloc_countdown;

static bool alloc_fails(void) {
  return cph_pact__fail_alloc_countdown > 0 && --cph_pact__fail_alloc_countdown == 0;
}

static void *p_malloc(size_t n) { return alloc_fails() ? NULL : malloc(n); }
static void *p_calloc(size_t n, size_t size) { return alloc_fails() ? NULL : calloc(n, size); }
static void *p_realloc(void *p, size_t n) { return alloc_fails() ? NULL : realloc(p, n); }
static char *p_strdup(const char *s) { return alloc_fails() ? NULL : strdup(s); }
static char *p_strndup(const char *s, size_t n) { return alloc_fails() ? NULL : strndup(s, n); }

/* ---------------------------------------------------------------- text cursor */

/* A position in the text being parsed; columns in messages are 1-based byte columns. */
typedef struct cursor {
  const char *s;
  size_t i;
} cursor;

static size_t col(const cursor *c) { return c->i + 1; }

static char peek(const cursor *c) { return c->s[c->i]; }

static void skip_ws(cursor *c) {
  while (c->s[c->i] == ' ' || c->s[c->i] == '\t')
    c->i++;
}

/* What sits at the cursor, for "found ..." in messages. */
static const char *found(const cursor *c, char buf[16]) {
  unsigned char ch = (unsigned char)c->s[c->i];
  if (ch == '\0')
    return "end of input";
  if (ch >= 0x20 && ch < 0x7f)
    snprintf(buf, 16, "'%c'", ch);
  else
    snprintf(buf, 16, "byte 0x%02x", ch);
  return buf;
}

static int expected(cursor *c, cph_err *err, const char *what) {
  char b[16];
  return cph_err_set(err, CPH_EPARSE, "expected %s at column %zu, found %s", what, col(c),
                     found(c, b));
}

/* An optionally negative decimal that fits int32_t. */
static int parse_int(cursor *c, int32_t *out, cph_err *err) {
  cursor start = *c;
  bool neg = peek(c) == '-';
  if (neg)
    c->i++;
  if (peek(c) < '0' || peek(c) > '9') {
    *c = start;
    return expected(c, err, "an integer");
  }
  int64_t v = 0;
  while (peek(c) >= '0' && peek(c) <= '9') {
    v = v * 10 + (peek(c) - '0');
    if (v > (int64_t)INT32_MAX + 1)
      return cph_err_set(err, CPH_EPARSE, "integer out of range at column %zu", col(&start));
    c->i++;
  }
  if (neg)
    v = -v;
  if (v > INT32_MAX)
    return cph_err_set(err, CPH_EPARSE, "integer out of range at column %zu", col(&start));
  *out = (int32_t)v;
  return CPH_OK;
}

static int expect_char(cursor *c, char ch, cph_err *err) {
  if (peek(c) == ch) {
    c->i++;
    return CPH_OK;
  }
  char what[8];
  snprintf(what, sizeof what, "'%c'", ch);
  return expected(c, err, what);
}

static int expect_end(cursor *c, const char *what, cph_err *err) {
  skip_ws(c);
  if (peek(c) == '\0')
    return CPH_OK;
  return expected(c, err, what);
}

/* The lower bounds every coordinate obeys: depth >= -1, position >= 0 (offset is free). */
enum { PART_DEPTH, PART_POSITION, PART_OFFSET };
static const char *const part_name[] = {"depth", "position", "offset"};
static const int32_t part_min[] = {-1, 0, INT32_MIN};

static int check_min(int part, int32_t v, size_t column, cph_err *err) {
  if (v >= part_min[part])
    return CPH_OK;
  return cph_err_set(err, CPH_EPARSE, "%s must be >= %d at column %zu, found %d",
                     part_name[part], (int)part_min[part], column, (int)v);
}

/* ---------------------------------------------------------------- coordinates */

int cph_coord_parse(const char *s, cph_coord *out, cph_err *err) {
  if (!s || !out)
    return cph_err_set(err, CPH_EINVAL, "coordinate: no text");
  cursor c = {s, 0};
  int32_t v[3];
  int rc;
  skip_ws(&c);
  if ((rc = expect_char(&c, 'd', err)))
    return rc;
  for (int part = PART_DEPTH; part <= PART_OFFSET; part++) {
    if (part != PART_DEPTH) {
      skip_ws(&c);
      if ((rc = expect_char(&c, ',', err)))
        return rc;
      skip_ws(&c);
    }
    size_t at = col(&c);
    if ((rc = parse_int(&c, &v[part], err)) || (rc = check_min(part, v[part], at, err)))
      return rc;
  }
  if ((rc = expect_end(&c, "end of coordinate", err)))
    return rc;
  out->depth = v[PART_DEPTH];
  out->position = v[PART_POSITION];
  out->offset = v[PART_OFFSET];
  return CPH_OK;
}

/* Writes v in decimal at p; returns the end. (Coordinates render for every message of every
 * turn: no printf here.) */
static char *put_i32(char *p, int32_t v) {
  if (v >= 0 && v < 1000) { /* nearly every coordinate: a lease formats one per message */
    if (v >= 100)
      *p++ = (char)('0' + v / 100);
    if (v >= 10)
      *p++ = (char)('0' + v / 10 % 10);
    *p++ = (char)('0' + v % 10);
    return p;
  }
  char digits[11];
  int n = 0;
  uint32_t u = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
  do {
    digits[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0)
    *p++ = '-';
  while (n)
    *p++ = digits[--n];
  return p;
}

size_t cph_coord_format(const cph_coord *c, char buf[48]) {
  char *p = buf;
  *p++ = 'd';
  p = put_i32(p, c->depth);
  *p++ = ',';
  *p++ = ' ';
  p = put_i32(p, c->position);
  *p++ = ',';
  *p++ = ' ';
  p = put_i32(p, c->offset);
  *p = '\0';
  return (size_t)(p - buf);
}

/* ---------------------------------------------------------------- selectors */

typedef struct sel_range {
  bool any; /* '*' */
  int32_t lo, hi; /* inclusive; lo <= hi */
} sel_range;

enum { SEL_COORD, SEL_KEY, SEL_TAG, SEL_ID };

struct cph_selector {
  int kind;
  sel_range part[3]; /* SEL_COORD: depth, position, offset */
  char *name;        /* SEL_KEY, SEL_TAG */
  uint64_t id;       /* SEL_ID */
};

/* One part: '*', an integer, or a range a..b with a <= b; each bound obeys the part's minimum. */
static int parse_part(cursor *c, int part, sel_range *r, cph_err *err) {
  if (peek(c) == '*') {
    c->i++;
    r->any = true;
    return CPH_OK;
  }
  if (peek(c) != '-' && (peek(c) < '0' || peek(c) > '9'))
    return expected(c, err, "an integer, a range a..b or '*'");
  size_t lo_col = col(c);
  int rc = parse_int(c, &r->lo, err);
  if (rc || (rc = check_min(part, r->lo, lo_col, err)))
    return rc;
  r->hi = r->lo;
  if (peek(c) == '.' && c->s[c->i + 1] == '.') {
    c->i += 2;
    if (peek(c) != '-' && (peek(c) < '0' || peek(c) > '9'))
      return expected(c, err, "an integer after '..'");
    if ((rc = parse_int(c, &r->hi, err)))
      return rc;
    if (r->lo > r->hi)
      return cph_err_set(err, CPH_EPARSE,
                         "%s range %d..%d at column %zu: start is greater than end",
                         part_name[part], (int)r->lo, (int)r->hi, lo_col);
  }
  return CPH_OK;
}

static int parse_coord_selector(cursor *c, cph_selector *sel, cph_err *err) {
  int rc;
  c->i++; /* 'd' */
  for (int part = PART_DEPTH; part <= PART_OFFSET; part++) {
    if (part != PART_DEPTH) {
      skip_ws(c);
      if ((rc = expect_char(c, ',', err)))
        return rc;
      skip_ws(c);
    }
    if ((rc = parse_part(c, part, &sel->part[part], err)))
      return rc;
  }
  return expect_end(c, "end of selector", err);
}

/* A NAME of {key=NAME} / {tag=NAME}: one or more bytes up to '}', none of them blank, a
 * control byte or a brace (so "{key= a}" is an error, not the key " a"). */
static int parse_name(cursor *c, const char *field, char **out, cph_err *err) {
  size_t start = c->i;
  for (;;) {
    unsigned char ch = (unsigned char)peek(c);
    if (ch == '}' || ch == '\0')
      break;
    if (ch <= 0x20 || ch == 0x7f || ch == '{') {
      char b[16];
      return cph_err_set(err, CPH_EPARSE, "unexpected %s in %s name at column %zu",
                         found(c, b), field, col(c));
    }
    c->i++;
  }
  if (c->i == start) {
    char what[32];
    snprintf(what, sizeof what, "a name after '%s='", field);
    return expected(c, err, what);
  }
  *out = p_strndup(c->s + start, c->i - start);
  return *out ? CPH_OK : cph_err_set(err, CPH_ENOMEM, "selector: out of memory");
}

static int parse_id(cursor *c, uint64_t *out, cph_err *err) {
  size_t start = col(c);
  if (peek(c) < '0' || peek(c) > '9')
    return expected(c, err, "a decimal id after 'id='");
  uint64_t v = 0;
  while (peek(c) >= '0' && peek(c) <= '9') {
    unsigned d = (unsigned)(peek(c) - '0');
    if (v > (UINT64_MAX - d) / 10)
      return cph_err_set(err, CPH_EPARSE, "id out of range at column %zu", start);
    v = v * 10 + d;
    c->i++;
  }
  if (v == 0) /* ids start at 1 */
    return cph_err_set(err, CPH_EPARSE, "id must be >= 1 at column %zu", start);
  *out = v;
  return CPH_OK;
}

static int parse_brace_selector(cursor *c, cph_selector *sel, cph_err *err) {
  int rc;
  c->i++; /* '{' */
  if (!strncmp(c->s + c->i, "key=", 4)) {
    c->i += 4;
    sel->kind = SEL_KEY;
    rc = parse_name(c, "key", &sel->name, err);
  } else if (!strncmp(c->s + c->i, "tag=", 4)) {
    c->i += 4;
    sel->kind = SEL_TAG;
    rc = parse_name(c, "tag", &sel->name, err);
  } else if (!strncmp(c->s + c->i, "id=", 3)) {
    c->i += 3;
    sel->kind = SEL_ID;
    rc = parse_id(c, &sel->id, err);
  } else {
    return expected(c, err, "'key=', 'tag=' or 'id='");
  }
  if (rc || (rc = expect_char(c, '}', err)))
    return rc;
  return expect_end(c, "end of selector", err);
}

int cph_selector_parse(const char *s, cph_selector **out, cph_err *err) {
  if (!s || !out)
    return cph_err_set(err, CPH_EINVAL, "selector: no text");
  *out = NULL;
  /* strnlen: never walk further than one byte past the limit of an over-long text. */
  size_t len = strnlen(s, CPH_PACT_SELECTOR_MAX + 1);
  if (len > CPH_PACT_SELECTOR_MAX)
    return cph_err_set(err, CPH_ELIMIT, "selector longer than %d bytes", CPH_PACT_SELECTOR_MAX);
  cph_selector *sel = p_calloc(1, sizeof *sel);
  if (!sel)
    return cph_err_set(err, CPH_ENOMEM, "selector: out of memory");
  cursor c = {s, 0};
  int rc;
  skip_ws(&c);
  if (peek(&c) == 'd') {
    sel->kind = SEL_COORD;
    rc = parse_coord_selector(&c, sel, err);
  } else if (peek(&c) == '{') {
    rc = parse_brace_selector(&c, sel, err);
  } else {
    rc = expected(&c, err, "'d' (coordinates) or '{' (key, tag or id)");
  }
  if (rc) {
    cph_selector_free(sel);
    return rc;
  }
  *out = sel;
  return CPH_OK;
}

static bool range_has(const sel_range *r, int32_t v) {
  return r->any || (v >= r->lo && v <= r->hi);
}

bool cph_selector_match(const cph_selector *sel, const cph_pact_node *n) {
  switch (sel->kind) {
  case SEL_COORD:
    return range_has(&sel->part[PART_DEPTH], n->at.depth) &&
           range_has(&sel->part[PART_POSITION], n->at.position) &&
           range_has(&sel->part[PART_OFFSET], n->at.offset);
  case SEL_KEY:
    return n->key && !strcmp(n->key, sel->name);
  case SEL_TAG:
    for (uint32_t i = 0; i < n->n_tags; i++)
      if (n->tags[i] && !strcmp(n->tags[i], sel->name))
        return true;
    return false;
  case SEL_ID:
    return n->id == sel->id;
  }
  return false;
}

void cph_selector_free(cph_selector *sel) {
  if (!sel)
    return;
  free(sel->name);
  free(sel);
}

/* ---------------------------------------------------------------- nodes */

static void tags_free(char **tags, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    free(tags[i]);
  free(tags);
}

static void node_free(cph_pact_node *n) {
  free(n->content);
  free(n->role);
  free(n->key);
  tags_free(n->tags, n->n_tags);
  free(n->lifecycle);
  memset(n, 0, sizeof *n);
}

/* strdup that keeps NULL as NULL; *ok turns false on an allocation failure. */
static char *dup_opt(const char *s, bool *ok) {
  if (!s)
    return NULL;
  char *d = p_strdup(s);
  if (!d)
    *ok = false;
  return d;
}

static int tags_copy(char ***dst, char *const *src, uint32_t n) {
  *dst = NULL;
  if (n == 0)
    return CPH_OK;
  char **t = p_calloc(n, sizeof *t);
  if (!t)
    return CPH_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    if (!(t[i] = p_strdup(src[i]))) {
      tags_free(t, i);
      return CPH_ENOMEM;
    }
  }
  *dst = t;
  return CPH_OK;
}

/* Deep copy of every field; on failure dst holds nothing to free. */
static int node_copy(cph_pact_node *dst, const cph_pact_node *src) {
  *dst = *src;
  dst->content = dst->role = dst->key = NULL;
  dst->tags = NULL;
  dst->lifecycle = NULL;
  dst->n_tags = 0;
  dst->n_lifecycle = 0;
  bool ok = true;
  dst->content = dup_opt(src->content, &ok);
  dst->role = dup_opt(src->role, &ok);
  dst->key = dup_opt(src->key, &ok);
  if (ok && tags_copy(&dst->tags, src->tags, src->n_tags) == CPH_OK)
    dst->n_tags = src->n_tags;
  else
    ok = false;
  if (ok && src->lifecycle) {
    dst->lifecycle = p_malloc(src->n_lifecycle * sizeof *dst->lifecycle);
    if (dst->lifecycle) {
      memcpy(dst->lifecycle, src->lifecycle, src->n_lifecycle * sizeof *dst->lifecycle);
      dst->n_lifecycle = src->n_lifecycle;
    } else {
      ok = false;
    }
  }
  if (!ok) {
    node_free(dst);
    return CPH_ENOMEM;
  }
  return CPH_OK;
}

static int check_coord(const cph_coord *c, const char *where, cph_err *err) {
  if (c->depth < -1)
    return cph_err_set(err, CPH_EINVAL, "%sdepth must be >= -1, got %d", where, (int)c->depth);
  if (c->position < 0)
    return cph_err_set(err, CPH_EINVAL, "%sposition must be >= 0, got %d", where,
                       (int)c->position);
  return CPH_OK;
}

static int check_ttl(int32_t ttl, const char *where, cph_err *err) {
  if (ttl == CPH_PACT_NO_TTL || ttl >= 1)
    return CPH_OK;
  return cph_err_set(err, CPH_EINVAL, "%sttl must be >= 1 or none, got %d", where, (int)ttl);
}

static int check_tags(char *const *tags, uint32_t n, cph_err *err) {
  if (n && !tags)
    return cph_err_set(err, CPH_EINVAL, "%u tags but no tag array", (unsigned)n);
  for (uint32_t i = 0; i < n; i++)
    if (!tags[i])
      return cph_err_set(err, CPH_EINVAL, "tag %u is missing", (unsigned)i);
  return CPH_OK;
}

/* Everything insert validates, on a node as it will be stored (at/ttl already from stage 0). */
static int check_node(const cph_pact_node *n, cph_err *err) {
  int rc;
  if (!n->content)
    return cph_err_set(err, CPH_EINVAL, "content is required");
  if ((rc = check_coord(&n->at, "", err)) || (rc = check_ttl(n->ttl, "", err)))
    return rc;
  if (n->cadence < 0)
    return cph_err_set(err, CPH_EINVAL, "cadence must be >= 0, got %d", (int)n->cadence);
  if ((rc = check_tags(n->tags, n->n_tags, err)))
    return rc;
  if (!n->lifecycle && n->n_lifecycle)
    return cph_err_set(err, CPH_EINVAL, "%u lifecycle stages but no stage array",
                       (unsigned)n->n_lifecycle);
  if (!n->lifecycle)
    return CPH_OK;
  if (n->n_lifecycle == 0)
    return cph_err_set(err, CPH_EINVAL, "lifecycle has no stages");
  if (n->cadence)
    return cph_err_set(err, CPH_EINVAL, "a node cannot have both a cadence and a lifecycle");
  for (uint32_t i = 0; i < n->n_lifecycle; i++) {
    const cph_pact_stage *st = &n->lifecycle[i];
    char where[40];
    snprintf(where, sizeof where, "lifecycle stage %u: ", (unsigned)i);
    if ((rc = check_coord(&st->at, where, err)) || (rc = check_ttl(st->ttl, where, err)))
      return rc;
    if (st->ttl == CPH_PACT_NO_TTL && i + 1 < n->n_lifecycle)
      return cph_err_set(err, CPH_EINVAL,
                         "lifecycle stage %u: only the last stage may have no ttl", (unsigned)i);
  }
  return CPH_OK;
}

/* ---------------------------------------------------------------- the tree */

void cph_pact_tree_init(cph_pact_tree *t) {
  memset(t, 0, sizeof *t);
  t->next_id = 1;
  t->next_seq = 1;
}

void cph_pact_tree_free(cph_pact_tree *t) {
  for (size_t i = 0; i < t->n; i++)
    node_free(&t->nodes[i]);
  free(t->nodes);
  cph_pact_tree_init(t);
}

static int reserve(cph_pact_tree *t, size_t want) {
  if (want <= t->cap)
    return CPH_OK;
  size_t cap = t->cap ? t->cap : 8;
  while (cap < want) {
    if (cap > SIZE_MAX / 2 / sizeof *t->nodes)
      return CPH_ENOMEM;
    cap *= 2;
  }
  cph_pact_node *nodes = p_realloc(t->nodes, cap * sizeof *nodes);
  if (!nodes)
    return CPH_ENOMEM;
  t->nodes = nodes;
  t->cap = cap;
  return CPH_OK;
}

int cph_pact_tree_copy(cph_pact_tree *dst, const cph_pact_tree *src) {
  cph_pact_tree_init(dst);
  if (reserve(dst, src->n))
    return CPH_ENOMEM;
  for (size_t i = 0; i < src->n; i++) {
    if (node_copy(&dst->nodes[i], &src->nodes[i])) {
      cph_pact_tree_free(dst);
      return CPH_ENOMEM;
    }
    dst->n = i + 1;
  }
  dst->episode = src->episode;
  dst->next_id = src->next_id;
  dst->next_seq = src->next_seq;
  dst->shift = src->shift;
  memcpy(dst->removed, src->removed, sizeof dst->removed);
  dst->n_removed = src->n_removed;
  dst->removed_overflow = src->removed_overflow;
  return CPH_OK;
}

void cph_pact_changes_clear(cph_pact_tree *t) {
  for (size_t i = 0; i < t->n; i++)
    t->nodes[i].dirty = false;
  t->n_removed = 0;
  t->removed_overflow = false;
}

/* Notes the removal of n for the store (see "Change tracking" in pact.h). */
static void note_removed(cph_pact_tree *t, const cph_pact_node *n) {
  if (t->n_removed < CPH_PACT_REMOVED_MAX)
    t->removed[t->n_removed++] = n->seq;
  else
    t->removed_overflow = true;
}

int cph_pact_insert(cph_pact_tree *t, const cph_pact_node *proto, uint64_t *id_out,
                    cph_err *err) {
  if (!proto)
    return cph_err_set(err, CPH_EINVAL, "no node to insert");
  /* The stored shape first: a new node is live, at stage 0 of its lifecycle ("stage 0 is the
   * node's first placement"), so its at and ttl are that stage's. */
  cph_pact_node shape = *proto;
  shape.waiting = false;
  shape.stage = 0;
  if (shape.lifecycle && shape.n_lifecycle) {
    shape.at = shape.lifecycle[0].at;
    shape.ttl = shape.lifecycle[0].ttl;
  }
  int rc = check_node(&shape, err);
  if (rc)
    return rc;
  if (reserve(t, t->n + 1))
    return cph_err_set(err, CPH_ENOMEM, "insert: out of memory");
  cph_pact_node *n = &t->nodes[t->n];
  if (node_copy(n, &shape))
    return cph_err_set(err, CPH_ENOMEM, "insert: out of memory");
  n->id = t->next_id++;
  n->seq = t->next_seq++;
  n->created_at_episode = t->episode;
  n->dirty = true;
  t->n++;
  if (id_out)
    *id_out = n->id;
  return CPH_OK;
}

static size_t index_of(const cph_pact_tree *t, uint64_t id) {
  for (size_t i = 0; i < t->n; i++)
    if (t->nodes[i].id == id)
      return i;
  return SIZE_MAX;
}

cph_pact_node *cph_pact_find(cph_pact_tree *t, uint64_t id) {
  size_t i = index_of(t, id);
  return i == SIZE_MAX ? NULL : &t->nodes[i];
}

/* Removes node i, keeping the others in order (the array stays in seq order). */
static void remove_at(cph_pact_tree *t, size_t i) {
  note_removed(t, &t->nodes[i]);
  node_free(&t->nodes[i]);
  memmove(&t->nodes[i], &t->nodes[i + 1], (t->n - i - 1) * sizeof *t->nodes);
  t->n--;
}

int cph_pact_delete(cph_pact_tree *t, uint64_t id) {
  size_t i = index_of(t, id);
  if (i == SIZE_MAX)
    return CPH_ENOTFOUND;
  remove_at(t, i);
  return CPH_OK;
}

/* Replaces the masked fields, all or nothing: the new node is validated and its strings
 * allocated before the old ones are freed. TTL keeps created_at_episode (age still counts from
 * creation, so a ttl at or below the age expires at the next step). A lifecycle node's ttl is
 * its current stage's, so it may be none only on the last stage; its lifecycle itself is not
 * updatable. */
int cph_pact_update(cph_pact_tree *t, uint64_t id, const cph_pact_node *fields, unsigned mask,
                    cph_err *err) {
  const unsigned all = CPH_PACT_SET_CONTENT | CPH_PACT_SET_TTL | CPH_PACT_SET_CADENCE |
                       CPH_PACT_SET_KEY | CPH_PACT_SET_TAGS | CPH_PACT_SET_AT;
  if (!fields || (mask & ~all))
    return cph_err_set(err, CPH_EINVAL, "update: unknown field mask 0x%x", mask & ~all);
  cph_pact_node *n = cph_pact_find(t, id);
  if (!n)
    return cph_err_set(err, CPH_ENOTFOUND, "node %llu not found", (unsigned long long)id);

  cph_pact_node next = *n;
  if (mask & CPH_PACT_SET_CONTENT)
    next.content = fields->content;
  if (mask & CPH_PACT_SET_TTL)
    next.ttl = fields->ttl;
  if (mask & CPH_PACT_SET_CADENCE)
    next.cadence = fields->cadence;
  if (mask & CPH_PACT_SET_KEY)
    next.key = fields->key;
  if (mask & CPH_PACT_SET_TAGS) {
    next.tags = fields->tags;
    next.n_tags = fields->n_tags;
  }
  if (mask & CPH_PACT_SET_AT)
    next.at = fields->at;
  int rc = check_node(&next, err);
  if (rc)
    return rc;
  if (n->lifecycle && next.ttl == CPH_PACT_NO_TTL && n->stage + 1 < n->n_lifecycle)
    return cph_err_set(err, CPH_EINVAL,
                       "lifecycle stage %u: only the last stage may have no ttl",
                       (unsigned)n->stage);

  bool ok = true;
  char *content = (mask & CPH_PACT_SET_CONTENT) ? dup_opt(fields->content, &ok) : NULL;
  char *key = (mask & CPH_PACT_SET_KEY) ? dup_opt(fields->key, &ok) : NULL;
  char **tags = NULL;
  if ((mask & CPH_PACT_SET_TAGS) && tags_copy(&tags, fields->tags, fields->n_tags))
    ok = false;
  if (!ok) {
    free(content);
    free(key);
    if (tags)
      tags_free(tags, fields->n_tags);
    return cph_err_set(err, CPH_ENOMEM, "update: out of memory");
  }
  if (mask & CPH_PACT_SET_CONTENT) {
    free(n->content);
    n->content = content;
  }
  if (mask & CPH_PACT_SET_KEY) {
    free(n->key);
    n->key = key;
  }
  if (mask & CPH_PACT_SET_TAGS) {
    tags_free(n->tags, n->n_tags);
    n->tags = tags;
    n->n_tags = fields->n_tags;
  }
  n->ttl = next.ttl;
  n->cadence = next.cadence;
  n->at = next.at;
  n->dirty = true;
  return CPH_OK;
}

/* ---------------------------------------------------------------- the episode step */

static int by_seq(const void *a, const void *b) {
  const cph_pact_node *x = a, *y = b;
  if (x->seq != y->seq)
    return x->seq < y->seq ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* "In creation order": insert appends with a growing seq and removal keeps the order, so the
 * array is already sorted unless a loader built it otherwise. */
static void sort_by_seq(cph_pact_tree *t) {
  for (size_t i = 1; i < t->n; i++) {
    if (by_seq(&t->nodes[i - 1], &t->nodes[i]) > 0) {
      qsort(t->nodes, t->n, sizeof *t->nodes, by_seq);
      return;
    }
  }
}

static bool is_permanent(const cph_pact_node *n) { return n->ttl == CPH_PACT_NO_TTL; }
static bool is_sticky(const cph_pact_node *n) { return n->ttl == 1 && n->cadence == 1; }

/* What (2)-(4) do to one node; false = remove it. */
static bool age_node(cph_pact_tree *t, cph_pact_node *n) {
  uint64_t ep = t->episode;
  if (!n->waiting && n->ttl != CPH_PACT_NO_TTL) {
    /* (2) TTL. A created_at_episode ahead of the tree (a corrupt load) counts as age 0. */
    uint64_t age = ep >= n->created_at_episode ? ep - n->created_at_episode : 0;
    if (age >= (uint64_t)n->ttl) {
      if (n->lifecycle) {
        /* (4) lifecycle: a lifecycle node moves instead of expiring. */
        if (n->stage + 1 >= n->n_lifecycle)
          return false;
        n->stage++;
        n->at = n->lifecycle[n->stage].at;
        n->ttl = n->lifecycle[n->stage].ttl;
        n->created_at_episode = ep;
        n->dirty = true;
        return true;
      }
      if (n->cadence <= 0)
        return false;
      n->waiting = true;
      n->dirty = true;
    }
  }
  if (n->waiting) {
    /* (3) cadence. A waiting node whose cadence was since set to 0 waits for nothing: it is
     * removed (and episode % 0 is never computed). */
    if (n->cadence <= 0)
      return false;
    if (ep % (uint64_t)n->cadence == 0) {
      n->waiting = false;
      n->id = t->next_id++;
      n->created_at_episode = ep;
      n->dirty = true;
    }
  }
  return true;
}

/* (5) ODI on one node; false = remove it. A negative delta means the newest |delta| messages
 * are gone, so a node pushed below depth 0 belonged to a message that no longer exists and is
 * removed. Clamping it at 0 instead would pile removed history (message cores included) onto
 * the current message. A depth that would pass INT32_MAX stays at INT32_MAX. */
bool cph_pact_shifts(const cph_pact_node *n) {
  return n->at.depth >= 0 && (is_permanent(n) || is_sticky(n));
}

static bool odi_shift(cph_pact_node *n, int32_t delta) {
  if (!cph_pact_shifts(n))
    return true;
  int64_t d = (int64_t)n->at.depth + delta;
  if (d < 0)
    return false;
  if (d > INT32_MAX) {
    d = INT32_MAX;
    n->dirty = true; /* not where the shift alone would put it */
  }
  n->at.depth = (int32_t)d;
  return true;
}

/* The step. Nodes with seq >= fresh_seq (the cores complete_turn has just appended at their
 * final depths) sit out the ODI shift. One pass in seq order is the same as running (2), (3)
 * and (4) as separate passes: a node's outcome depends only on itself, and the only shared
 * state, next_id for re-created nodes, is drawn in seq order either way. */
static void pact_step(cph_pact_tree *t, int32_t delta, uint64_t fresh_seq) {
  sort_by_seq(t);
  t->episode++;
  t->shift += delta;
  size_t kept = 0;
  for (size_t i = 0; i < t->n; i++) {
    cph_pact_node *n = &t->nodes[i];
    bool keep = age_node(t, n);
    if (keep && delta != 0 && n->seq < fresh_seq)
      keep = odi_shift(n, delta);
    if (!keep) {
      note_removed(t, n);
      node_free(n);
      continue;
    }
    if (kept != i)
      t->nodes[kept] = *n;
    kept++;
  }
  t->n = kept;
}

void cph_pact_step(cph_pact_tree *t, int32_t delta) { pact_step(t, delta, UINT64_MAX); }

/* The cores go straight to their final depths (input at delta, reply at 1) and are kept out of
 * this step's shift, rather than being placed at depth 0 and shifted: the reply would need
 * depth -1 before the shift, which is the system depth and never moves. All or nothing. */
int cph_pact_complete_turn(cph_pact_tree *t, const char *input, const char *reply) {
  if (!input)
    return CPH_EINVAL;
  int32_t delta = reply ? 2 : 1;
  uint64_t fresh_seq = t->next_seq;
  cph_pact_node core = {0};
  core.ttl = CPH_PACT_NO_TTL;
  core.at.depth = delta;
  core.content = (char *)input;
  core.role = (char *)"user";
  uint64_t input_id;
  int rc = cph_pact_insert(t, &core, &input_id, NULL);
  if (rc)
    return rc;
  if (reply) {
    core.at.depth = 1;
    core.content = (char *)reply;
    core.role = (char *)"assistant";
    if ((rc = cph_pact_insert(t, &core, NULL, NULL))) {
      cph_pact_delete(t, input_id);
      t->next_id--; /* nothing else drew an id or seq since */
      t->next_seq--;
      return rc;
    }
  }
  pact_step(t, delta, fresh_seq);
  return CPH_OK;
}

/* ---------------------------------------------------------------- render order */

/* Depth -1 first, then history deepest (oldest) first, then depth 0. */
static int64_t depth_rank(int32_t d) {
  if (d < 0)
    return INT64_MIN;
  if (d == 0)
    return INT64_MAX;
  return -(int64_t)d;
}

/* A node's place in render order as three unsigned words and its index, compared in that
 * order: depth rank, then (position, offset), then seq, then index — a total order, so the
 * result never depends on the sort. Built once per node, so the sort compares integers
 * instead of reading nodes (about 1,500 comparisons for a tree of 110). */
typedef struct render_key {
  uint64_t rank, place, seq;
  size_t idx;
} render_key;

static render_key render_key_of(const cph_pact_tree *t, size_t i) {
  const cph_pact_node *x = &t->nodes[i];
  uint64_t pos = (uint32_t)x->at.position ^ 0x80000000u, off = (uint32_t)x->at.offset ^ 0x80000000u;
  return (render_key){(uint64_t)depth_rank(x->at.depth) ^ (1ull << 63), pos << 32 | off, x->seq, i};
}

static bool render_less(const render_key *a, const render_key *b) {
  if (a->rank != b->rank)
    return a->rank < b->rank;
  if (a->place != b->place)
    return a->place < b->place;
  if (a->seq != b->seq)
    return a->seq < b->seq;
  return a->idx < b->idx;
}

static void sift_down(render_key *k, size_t root, size_t n) {
  for (;;) {
    size_t child = 2 * root + 1;
    if (child >= n)
      return;
    if (child + 1 < n && render_less(&k[child], &k[child + 1]))
      child++;
    if (!render_less(&k[root], &k[child]))
      return;
    render_key tmp = k[root];
    k[root] = k[child];
    k[child] = tmp;
    root = child;
  }
}

#define RENDER_KEYS_STACK 256

/* Heap sort of the live nodes' keys, skipped when they are in order already (one comparison
 * per node; a tree whose nodes are only message cores is, since cores are created oldest
 * first): O(n log n), no allocation up to RENDER_KEYS_STACK live
 * nodes. Without memory for a bigger tree's keys, the order is still right: insertion of
 * each key into place, O(n^2) but never wrong. */
size_t cph_pact_render_order(const cph_pact_tree *t, size_t *idx) {
  render_key stack[RENDER_KEYS_STACK], *k = stack;
  size_t live = 0;
  for (size_t i = 0; i < t->n; i++)
    live += !t->nodes[i].waiting;
  if (live > RENDER_KEYS_STACK && !(k = p_malloc(live * sizeof *k))) {
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++) {
      if (t->nodes[i].waiting)
        continue;
      render_key ki = render_key_of(t, i);
      size_t j = n++;
      for (; j > 0; j--) {
        render_key kj = render_key_of(t, idx[j - 1]);
        if (!render_less(&ki, &kj))
          break;
        idx[j] = idx[j - 1];
      }
      idx[j] = i;
    }
    return n;
  }
  size_t n = 0, descents = 0;
  for (size_t i = 0; i < t->n; i++)
    if (!t->nodes[i].waiting) {
      k[n] = render_key_of(t, i);
      descents += n > 0 && render_less(&k[n], &k[n - 1]);
      n++;
    }
  if (descents > 0) { /* out of order (a tree of message cores alone is not: oldest first) */
    for (size_t i = n / 2; i-- > 0;)
      sift_down(k, i, n);
    for (size_t end = n; end > 1; end--) {
      render_key tmp = k[0];
      k[0] = k[end - 1];
      k[end - 1] = tmp;
      sift_down(k, 0, end - 1);
    }
  }
  for (size_t i = 0; i < n; i++)
    idx[i] = k[i].idx;
  if (k != stack)
    free(k);
  return n;
}
