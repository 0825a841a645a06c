/* The EDN reader: cph_edn_parse (contract in include/cephalon/edn.h).
 *
 * The reader is one pass over the lexer's tokens (edn_lex.c) with an explicit stack of open
 * forms (list, vector, map, set, tag, discard). Nesting therefore costs heap, never C stack:
 * the depth limit is checked before a frame is pushed, so 100,000 '[' end in a clean error.
 * An atom, or a collection whose closing bracket was just read, is "delivered" to the
 * innermost open form. Errors say where, as line:column. */
#include "policy/edn_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "common/buf.h"

/* ---------------------------------------------------------------------------------------------
 * State
 * ------------------------------------------------------------------------------------------- */

typedef enum frame_kind {
  FRAME_LIST,
  FRAME_VECTOR,
  FRAME_MAP,
  FRAME_SET,
  FRAME_TAGGED,
  FRAME_DISCARD
} frame_kind;

/* Map keys / set elements already in a frame, for duplicate detection: open addressing over
 * (hash, item index + 1; 0 = empty), at most half full. A new element costs O(1) expected
 * probes plus one cph_edn_equal per equal hash, and hashing is linear in its size, so a
 * collection costs O(total size) instead of O(n^2) deep comparisons. */
typedef struct seen_slot {
  uint64_t hash;
  size_t index1;
} seen_slot;

typedef struct seen_table {
  seen_slot *slots;
  size_t cap, used; /* cap is 0 or a power of two */
} seen_table;

typedef struct frame {
  frame_kind kind;
  cph_edn_pos pos; /* the opening token: '(' '[' '{', '#' of "#{", "#_" or "#tag" */
  cph_edn *items;  /* forms read so far; for a map keys and values alternate */
  size_t count, cap;
  char *tag; /* FRAME_TAGGED */
  seen_table seen;
} frame;

typedef struct parser {
  edn_lexer lx; /* the input, the cursor and where errors go */
  frame *stack;
  size_t depth, stack_cap;
  unsigned max_depth;
  bool allow_duplicates;
  cph_edn result; /* the top-level value, once have_result */
  bool have_result;
} parser;

/* ---------------------------------------------------------------------------------------------
 * The stack of open forms
 * ------------------------------------------------------------------------------------------- */

static const char *kind_name(frame_kind k) {
  switch (k) {
  case FRAME_LIST:
    return "list";
  case FRAME_VECTOR:
    return "vector";
  case FRAME_MAP:
    return "map";
  case FRAME_SET:
    return "set";
  case FRAME_TAGGED:
    return "tagged literal";
  case FRAME_DISCARD:
    return "discard";
  }
  return "form";
}

static int closer_of(frame_kind k) {
  return k == FRAME_LIST ? ')' : k == FRAME_VECTOR ? ']' : '}';
}

/* Frees what the frame still owns (after an error, or its leftovers once closed). */
static void frame_release(frame *f) {
  for (size_t i = 0; i < f->count; i++)
    cph_edn__free_contents(&f->items[i]);
  free(f->items);
  free(f->tag);
  free(f->seen.slots);
}

static frame *top(parser *p) { return &p->stack[p->depth - 1]; }

static void pop(parser *p) { frame_release(&p->stack[--p->depth]); }

/* Opens a frame for the form starting at `at`, after its opening token (`skip` bytes). tag,
 * if any, becomes the frame's on success and is freed on failure. */
static int push(parser *p, frame_kind kind, cph_edn_pos at, size_t skip, char *tag) {
  if (p->depth >= p->max_depth) {
    free(tag);
    return cph_edn__fail(&p->lx, at, "nesting deeper than %u", p->max_depth);
  }
  frame *st = cph_edn__grow(p->stack, &p->stack_cap, p->depth + 1, sizeof *p->stack);
  if (!st) {
    free(tag);
    return cph_edn__oom(&p->lx);
  }
  p->stack = st;
  p->stack[p->depth++] = (frame){.kind = kind, .pos = at, .tag = tag};
  edn_bump_n(&p->lx, skip);
  return CPH_OK;
}

static bool seen_grow(seen_table *t) {
  size_t ncap = t->cap ? t->cap * 2 : 16;
  if (ncap > SIZE_MAX / sizeof *t->slots)
    return false;
  seen_slot *slots = cph_edn__malloc(ncap * sizeof *slots);
  if (!slots)
    return false;
  memset(slots, 0, ncap * sizeof *slots);
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->slots[i].index1)
      continue;
    size_t j = t->slots[i].hash & (ncap - 1);
    while (slots[j].index1)
      j = (j + 1) & (ncap - 1);
    slots[j] = t->slots[i];
  }
  free(t->slots);
  t->slots = slots;
  t->cap = ncap;
  return true;
}

/* Records f->items[index] as a key/element; fails if an equal one was recorded already. */
static int check_duplicate(parser *p, frame *f, size_t index) {
  seen_table *t = &f->seen;
  if ((t->used + 1) * 2 > t->cap && !seen_grow(t))
    return cph_edn__oom(&p->lx);
  const cph_edn *v = &f->items[index];
  uint64_t h = cph_edn__hash(v);
  size_t j = h & (t->cap - 1);
  for (; t->slots[j].index1; j = (j + 1) & (t->cap - 1)) {
    if (t->slots[j].hash != h || !cph_edn_equal(&f->items[t->slots[j].index1 - 1], v))
      continue;
    char shown[96];
    cph_buf text = CPH_BUF_INIT;
    cph_edn_write(v, &text);
    cph_edn__show(shown, sizeof shown, text.data ? text.data : "", text.data ? text.len : 0);
    cph_buf_free(&text);
    return cph_edn__fail(&p->lx, v->pos, "duplicate %s %s",
                         f->kind == FRAME_MAP ? "map key" : "set element", shown);
  }
  t->slots[j] = (seen_slot){h, index + 1};
  t->used++;
  return CPH_OK;
}

/* Appends v (taking ownership) to the collection frame f. */
static int append(parser *p, frame *f, cph_edn *v) {
  cph_edn *items = cph_edn__grow(f->items, &f->cap, f->count + 1, sizeof *f->items);
  if (!items) {
    cph_edn__free_contents(v);
    return cph_edn__oom(&p->lx);
  }
  f->items = items;
  f->items[f->count++] = *v;
  bool keyed = f->kind == FRAME_SET || (f->kind == FRAME_MAP && f->count % 2 == 1);
  if (keyed && !p->allow_duplicates)
    return check_duplicate(p, f, f->count - 1);
  return CPH_OK;
}

/* Hands a finished value (ownership included) to the innermost open form: a discard drops it,
 * a tag wraps it and passes the tagged value on outward, a collection keeps it. With nothing
 * open it is the document's value. */
static int deliver(parser *p, cph_edn *v) {
  while (p->depth > 0) {
    frame *f = top(p);
    if (f->kind == FRAME_DISCARD) {
      cph_edn__free_contents(v);
      pop(p);
      return CPH_OK;
    }
    if (f->kind != FRAME_TAGGED)
      return append(p, f, v);
    cph_edn *inner = cph_edn__malloc(sizeof *inner);
    if (!inner) {
      cph_edn__free_contents(v);
      return cph_edn__oom(&p->lx);
    }
    *inner = *v;
    *v = (cph_edn){.type = CPH_EDN_TAGGED, .pos = f->pos};
    v->u.tagged.tag = f->tag;
    v->u.tagged.value = inner;
    f->tag = NULL;
    pop(p);
  }
  p->result = *v;
  p->have_result = true;
  return CPH_OK;
}

/* A closing bracket `c` at `at`. */
static int close_form(parser *p, int c, cph_edn_pos at) {
  if (p->depth == 0)
    return cph_edn__fail(&p->lx, at, "unexpected '%c'", c);
  frame *f = top(p);
  if (f->kind == FRAME_DISCARD)
    return cph_edn__fail(&p->lx, f->pos, "discard with nothing to discard");
  if (f->kind == FRAME_TAGGED)
    return cph_edn__fail(&p->lx, f->pos, "tagged literal #%.60s has no value", f->tag);
  if (c != closer_of(f->kind))
    return cph_edn__fail(&p->lx, at,
                         "unexpected '%c', expected '%c' to close the %s at %" PRIu32 ":%" PRIu32,
                         c, closer_of(f->kind), kind_name(f->kind), f->pos.line, f->pos.column);
  if (f->kind == FRAME_MAP && f->count % 2 != 0)
    return cph_edn__fail(&p->lx, f->pos, "map literal must contain an even number of forms");
  static const cph_edn_type types[] = {
      [FRAME_LIST] = CPH_EDN_LIST, [FRAME_VECTOR] = CPH_EDN_VECTOR,
      [FRAME_MAP] = CPH_EDN_MAP, [FRAME_SET] = CPH_EDN_SET};
  cph_edn v = {.type = types[f->kind], .pos = f->pos};
  v.u.coll.items = f->items;
  v.u.coll.count = f->kind == FRAME_MAP ? f->count / 2 : f->count;
  f->items = NULL;
  f->count = 0;
  pop(p);
  edn_bump(&p->lx);
  return deliver(p, &v);
}

/* "#{", "#_", "##Inf" or "#tag"; the cursor is on '#'. */

/* ---------------------------------------------------------------------------------------------
 * Forms: collections, #{} sets, #_ discard, #tag literals, atoms
 * ------------------------------------------------------------------------------------------- */

/* "#{", "#_", "##Inf" or "#tag"; the cursor is on '#'. */
static int read_dispatch(parser *p, cph_edn_pos at) {
  int d = edn_peek_at(&p->lx, 1);
  if (d == '{')
    return push(p, FRAME_SET, at, 2, NULL);
  if (d == '_')
    return push(p, FRAME_DISCARD, at, 2, NULL);
  if (d == '#') {
    cph_edn v = {.pos = at};
    int rc = cph_edn__lex_symbolic(&p->lx, &v);
    if (rc) {
      cph_edn__free_contents(&v);
      return rc;
    }
    return deliver(p, &v);
  }
  char *tag;
  size_t skip;
  int rc = cph_edn__lex_tag(&p->lx, at, &tag, &skip);
  if (rc)
    return rc;
  return push(p, FRAME_TAGGED, at, skip, tag);
}

static int read_atom(parser *p, int c, cph_edn_pos at) {
  cph_edn v = {.pos = at};
  int rc = cph_edn__lex_atom(&p->lx, c, &v);
  if (rc) {
    cph_edn__free_contents(&v);
    return rc;
  }
  return deliver(p, &v);
}

/* ---------------------------------------------------------------------------------------------
 * The document
 * ------------------------------------------------------------------------------------------- */

/* End of input: fine only with a value read and nothing left open. */
static int at_end(parser *p) {
  if (p->depth > 0) {
    frame *f = top(p);
    if (f->kind == FRAME_DISCARD)
      return cph_edn__fail(&p->lx, f->pos, "discard with nothing to discard");
    if (f->kind == FRAME_TAGGED)
      return cph_edn__fail(&p->lx, f->pos, "tagged literal #%.60s has no value", f->tag);
    return cph_edn__fail(&p->lx, f->pos, "unterminated %s", kind_name(f->kind));
  }
  if (!p->have_result)
    return cph_edn__fail(&p->lx, edn_here(&p->lx), "no value");
  return CPH_OK;
}

static int parse_document(parser *p) {
  for (;;) {
    cph_edn__skip_space(&p->lx);
    int c = edn_peek(&p->lx);
    cph_edn_pos at = edn_here(&p->lx);
    int rc;
    if (c < 0)
      return at_end(p);
    if (c == ')' || c == ']' || c == '}')
      rc = close_form(p, c, at);
    else if (p->depth == 0 && p->have_result && !(c == '#' && edn_peek_at(&p->lx, 1) == '_'))
      rc = cph_edn__fail(&p->lx, at, "unexpected data after the value");
    else if (c == '(')
      rc = push(p, FRAME_LIST, at, 1, NULL);
    else if (c == '[')
      rc = push(p, FRAME_VECTOR, at, 1, NULL);
    else if (c == '{')
      rc = push(p, FRAME_MAP, at, 1, NULL);
    else if (c == '#')
      rc = read_dispatch(p, at);
    else
      rc = read_atom(p, c, at);
    if (rc)
      return rc;
  }
}

int cph_edn_parse(const char *text, size_t len, const cph_edn_options *opts, cph_edn **out,
                  cph_edn_error *err) {
  if (err)
    *err = (cph_edn_error){0};
  if (!out)
    return CPH_EINVAL;
  *out = NULL;
  if (!text && len)
    return CPH_EINVAL;
  parser p = {
      .lx = {.s = (const unsigned char *)(text ? text : ""), .len = len, .line = 1, .col = 1,
             .err = err},
      .max_depth = !opts || !opts->max_depth            ? CPH_EDN_DEFAULT_MAX_DEPTH
                   : opts->max_depth > CPH_EDN_MAX_DEPTH_LIMIT ? CPH_EDN_MAX_DEPTH_LIMIT
                                                             : opts->max_depth,
      .allow_duplicates = opts && opts->allow_duplicate_keys,
  };
  int rc = parse_document(&p);
  if (rc == CPH_OK) {
    cph_edn *node = cph_edn__malloc(sizeof *node);
    if (node) {
      *node = p.result;
      p.have_result = false;
      *out = node;
    } else {
      rc = cph_edn__oom(&p.lx);
    }
  }
  while (p.depth > 0)
    pop(&p);
  free(p.stack);
  if (p.have_result)
    cph_edn__free_contents(&p.result);
  return rc;
}
