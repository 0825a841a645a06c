/* The daemon's answers checked against docs/openapi.json: see oas.h. */
#define _GNU_SOURCE
#include "oas.h"
#include "testutil.h"

#include <msgpack.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct cph_oas {
  json_t *doc;
  json_t *owned; /* the loaded document, or NULL when borrowed */
};

cph_oas *cph_oas_from_json(json_t *doc) {
  cph_oas *d = calloc(1, sizeof *d);
  if (!d)
    abort();
  d->doc = doc;
  return d;
}

cph_oas *cph_oas_load(const char *path, char *err, size_t size) {
  json_error_t je;
  json_t *doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!doc) {
    snprintf(err, size, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    return NULL;
  }
  if (!json_is_object(json_object_get(doc, "paths"))) {
    snprintf(err, size, "%s: no \"paths\" object", path);
    json_decref(doc);
    return NULL;
  }
  cph_oas *d = cph_oas_from_json(doc);
  d->owned = doc;
  return d;
}

void cph_oas_free(cph_oas *d) {
  if (!d)
    return;
  json_decref(d->owned);
  free(d);
}

/* ================================================================ JSON Schema */

typedef struct vctx {
  const cph_oas *d;
  bool strict;
  int quiet;  /* > 0 inside a oneOf/anyOf trial: failures are not reported */
  bool failed; /* err holds the first reported failure */
  char *err;
  size_t size;
  char ptr[1024]; /* JSON pointer of the value being checked */
  size_t ptr_len;
  int depth;
} vctx;

static bool fail(vctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(vctx *c, const char *fmt, ...) {
  if (c->quiet || c->failed)
    return false;
  c->failed = true;
  int n = snprintf(c->err, c->size, "at %s: ", c->ptr_len ? c->ptr : "(the body)");
  if (n >= 0 && (size_t)n < c->size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + n, c->size - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return false;
}

/* Appends "/seg" (RFC 6901 escaped) to the pointer; returns the old length to pop back to. */
static size_t ptr_push(vctx *c, const char *seg) {
  size_t old = c->ptr_len;
  char buf[256];
  size_t n = 0;
  buf[n++] = '/';
  for (const char *p = seg; *p && n + 2 < sizeof buf; p++) {
    if (*p == '~' || *p == '/') {
      buf[n++] = '~';
      buf[n++] = *p == '~' ? '0' : '1';
    } else {
      buf[n++] = *p;
    }
  }
  if (c->ptr_len + n < sizeof c->ptr) {
    memcpy(c->ptr + c->ptr_len, buf, n);
    c->ptr_len += n;
    c->ptr[c->ptr_len] = '\0';
  }
  return old;
}

static void ptr_pop(vctx *c, size_t old) {
  c->ptr_len = old;
  c->ptr[old] = '\0';
}

/* A local reference "#/a/b~1c" in the document; NULL when it does not resolve. */
static const json_t *resolve(const cph_oas *d, const char *ref) {
  if (ref[0] != '#')
    return NULL;
  const json_t *node = d->doc;
  const char *p = ref + 1;
  while (node && *p == '/') {
    p++;
    char seg[256];
    size_t n = 0;
    for (; *p && *p != '/' && n + 1 < sizeof seg; p++) {
      if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
        seg[n++] = p[1] == '0' ? '~' : '/';
        p++;
      } else {
        seg[n++] = *p;
      }
    }
    seg[n] = '\0';
    if (json_is_object(node)) {
      node = json_object_get(node, seg);
    } else if (json_is_array(node)) {
      char *end;
      unsigned long i = strtoul(seg, &end, 10);
      node = *end ? NULL : json_array_get(node, i);
    } else {
      node = NULL;
    }
  }
  return *p ? NULL : node;
}

static const char *type_of(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: return "object";
  case JSON_ARRAY: return "array";
  case JSON_STRING: return "string";
  case JSON_INTEGER: return "integer";
  case JSON_REAL: return "number";
  case JSON_TRUE:
  case JSON_FALSE: return "boolean";
  case JSON_NULL: return "null";
  }
  return "?";
}

static bool is_type(const json_t *v, const char *name) {
  if (strcmp(name, "integer") == 0) { /* 2020-12: a number with a zero fraction is one */
    if (json_is_integer(v))
      return true;
    if (!json_is_real(v))
      return false;
    double x = json_real_value(v);
    if (x != x || x - x != 0) /* NaN, infinite */
      return false;
    /* beyond +-2^63 every double is a whole number (and the cast would be undefined) */
    return x <= -9.2e18 || x >= 9.2e18 || x == (double)(int64_t)x;
  }
  if (strcmp(name, "number") == 0)
    return json_is_number(v);
  return strcmp(name, type_of(v)) == 0;
}

/* Keywords that only annotate: never checked. */
static bool is_annotation(const char *k) {
  static const char *const names[] = {"description", "title",    "example",   "examples",
                                      "default",     "format",   "deprecated", "readOnly",
                                      "writeOnly",   "$comment"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(k, names[i]) == 0)
      return true;
  return false;
}

static bool is_checked(const char *k) {
  static const char *const names[] = {
      "$ref",      "type",      "properties", "required",  "additionalProperties",
      "items",     "enum",      "const",      "oneOf",     "anyOf",
      "allOf",     "minimum",   "maximum",    "minLength", "maxLength",
      "pattern",   "minItems",  "maxItems",   "maxProperties"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(k, names[i]) == 0)
      return true;
  return false;
}

static bool check(vctx *c, const json_t *schema, const json_t *v);

static size_t utf8_chars(const char *s) {
  size_t n = 0;
  for (; *s; s++)
    if (((unsigned char)*s & 0xC0) != 0x80)
      n++;
  return n;
}

/* Whether schema's type (after $refs) admits v's JSON type: picks the oneOf/anyOf branch
 * worth reporting when none matches. */
static bool type_admits(const vctx *c, const json_t *schema, const json_t *v) {
  for (int hops = 0; hops < 16 && json_is_object(schema); hops++) {
    const json_t *ref = json_object_get(schema, "$ref");
    const json_t *t = json_object_get(schema, "type");
    if (json_is_string(t))
      return is_type(v, json_string_value(t));
    if (json_is_array(t)) {
      size_t i;
      json_t *x;
      json_array_foreach(t, i, x) if (json_is_string(x) && is_type(v, json_string_value(x))) return true;
      return false;
    }
    if (json_object_get(schema, "const"))
      return json_equal(json_object_get(schema, "const"), (json_t *)v);
    if (!json_is_string(ref))
      return true;
    schema = resolve(c->d, json_string_value(ref));
  }
  return true;
}

static bool check_alternatives(vctx *c, const char *kw, const json_t *list, const json_t *v) {
  if (!json_is_array(list) || json_array_size(list) == 0)
    return fail(c, "the schema's %s is not a non-empty list", kw);
  size_t matched = 0, i;
  json_t *s;
  c->quiet++;
  json_array_foreach(list, i, s) if (check(c, s, v)) matched++;
  c->quiet--;
  bool one = strcmp(kw, "oneOf") == 0;
  if (matched == 1 || (!one && matched > 1))
    return true;
  if (matched > 1)
    return fail(c, "%s %s matches %zu of the oneOf schemas, not exactly one", type_of(v),
                c->ptr_len ? "value" : "body", matched);
  /* None matched: report why the likeliest branch failed. */
  json_array_foreach(list, i, s) if (type_admits(c, s, v)) return check(c, s, v);
  return fail(c, "%s matches none of the %s schemas", type_of(v), kw);
}

static bool check_object(vctx *c, const json_t *schema, const json_t *v) {
  bool ok = true;
  const json_t *props = json_object_get(schema, "properties");
  const json_t *required = json_object_get(schema, "required");
  const json_t *addl = json_object_get(schema, "additionalProperties");
  const json_t *maxp = json_object_get(schema, "maxProperties");
  size_t i;
  json_t *x;
  if (required) {
    json_array_foreach(required, i, x) {
      if (json_is_string(x) && !json_object_get(v, json_string_value(x)))
        ok = fail(c, "the required member \"%s\" is missing", json_string_value(x)) && ok;
    }
  }
  if (json_is_integer(maxp) && (json_int_t)json_object_size(v) > json_integer_value(maxp))
    ok = fail(c, "%zu members, more than maxProperties %lld", json_object_size(v),
              (long long)json_integer_value(maxp)) && ok;
  const char *key;
  json_t *member;
  json_object_foreach((json_t *)v, key, member) {
    const json_t *ps = props ? json_object_get(props, key) : NULL;
    size_t old = ptr_push(c, key);
    if (ps) {
      ok = check(c, ps, member) && ok;
    } else if (json_is_false(addl) || (!addl && props && c->strict)) {
      ok = fail(c, "a member the document does not list (%s)",
                addl ? "additionalProperties: false"
                     : "the check is strict: every field the daemon sends must be documented") &&
           ok;
    } else if (json_is_object(addl)) {
      ok = check(c, addl, member) && ok;
    }
    ptr_pop(c, old);
    if (!ok && (c->quiet || c->failed))
      return false;
  }
  return ok;
}

static bool check_array(vctx *c, const json_t *schema, const json_t *v) {
  const json_t *items = json_object_get(schema, "items");
  const json_t *mini = json_object_get(schema, "minItems");
  const json_t *maxi = json_object_get(schema, "maxItems");
  size_t n = json_array_size(v);
  if (json_is_integer(mini) && (json_int_t)n < json_integer_value(mini))
    return fail(c, "%zu items, fewer than minItems %lld", n, (long long)json_integer_value(mini));
  if (json_is_integer(maxi) && (json_int_t)n > json_integer_value(maxi))
    return fail(c, "%zu items, more than maxItems %lld", n, (long long)json_integer_value(maxi));
  if (!items)
    return true;
  for (size_t i = 0; i < n; i++) {
    char idx[24];
    snprintf(idx, sizeof idx, "%zu", i);
    size_t old = ptr_push(c, idx);
    bool ok = check(c, items, json_array_get(v, i));
    ptr_pop(c, old);
    if (!ok)
      return false;
  }
  return true;
}

static bool check_string(vctx *c, const json_t *schema, const json_t *v) {
  const char *s = json_string_value(v);
  const json_t *minl = json_object_get(schema, "minLength");
  const json_t *maxl = json_object_get(schema, "maxLength");
  const json_t *pattern = json_object_get(schema, "pattern");
  size_t n = utf8_chars(s);
  if (json_is_integer(minl) && (json_int_t)n < json_integer_value(minl))
    return fail(c, "\"%.60s\" is shorter than minLength %lld", s,
                (long long)json_integer_value(minl));
  if (json_is_integer(maxl) && (json_int_t)n > json_integer_value(maxl))
    return fail(c, "\"%.60s\" is longer than maxLength %lld", s,
                (long long)json_integer_value(maxl));
  if (json_is_string(pattern)) {
    regex_t re;
    if (regcomp(&re, json_string_value(pattern), REG_EXTENDED | REG_NOSUB) != 0)
      return fail(c, "the schema's pattern %s is not a POSIX extended regex",
                  json_string_value(pattern));
    int rc = regexec(&re, s, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
      return fail(c, "\"%.60s\" does not match the pattern %s", s, json_string_value(pattern));
  }
  return true;
}

static bool check_number(vctx *c, const json_t *schema, const json_t *v) {
  const json_t *min = json_object_get(schema, "minimum");
  const json_t *max = json_object_get(schema, "maximum");
  double x = json_number_value(v);
  if (json_is_number(min) && x < json_number_value(min))
    return fail(c, "%g is below the minimum %g", x, json_number_value(min));
  if (json_is_number(max) && x > json_number_value(max))
    return fail(c, "%g is above the maximum %g", x, json_number_value(max));
  return true;
}

static bool check(vctx *c, const json_t *schema, const json_t *v) {
  if (json_is_true(schema))
    return true;
  if (json_is_false(schema))
    return fail(c, "no value is allowed here");
  if (!json_is_object(schema))
    return fail(c, "the schema is not an object");
  if (++c->depth > 64) {
    c->depth--;
    return fail(c, "schemas nested over 64 deep (a $ref loop?)");
  }
  bool ok = true;
  const char *k;
  json_t *kv;
  json_object_foreach((json_t *)schema, k, kv) {
    if (!is_checked(k) && !is_annotation(k)) {
      ok = fail(c, "the schema uses \"%s\", which this validator does not check", k);
      goto out;
    }
  }
  const json_t *ref = json_object_get(schema, "$ref");
  if (ref) {
    const json_t *target = json_is_string(ref) ? resolve(c->d, json_string_value(ref)) : NULL;
    if (!target) {
      ok = fail(c, "unresolved $ref %s", json_is_string(ref) ? json_string_value(ref) : "?");
      goto out;
    }
    if (!check(c, target, v)) {
      ok = false;
      goto out;
    }
  }
  const json_t *type = json_object_get(schema, "type");
  if (json_is_string(type) && !is_type(v, json_string_value(type))) {
    ok = fail(c, "%s is not of type %s", type_of(v), json_string_value(type));
    goto out;
  }
  if (json_is_array(type)) {
    bool any = false;
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t) any = any || (json_is_string(t) && is_type(v, json_string_value(t)));
    if (!any) {
      char *types = json_dumps(type, JSON_COMPACT);
      ok = fail(c, "%s is not of type %s", type_of(v), types ? types : "?");
      free(types);
      goto out;
    }
  }
  const json_t *cst = json_object_get(schema, "const");
  if (cst && !json_equal(cst, (json_t *)v)) {
    char *want = json_dumps(cst, JSON_COMPACT | JSON_ENCODE_ANY);
    char *got = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    ok = fail(c, "%.80s is not the constant %s", got ? got : "?", want ? want : "?");
    free(want);
    free(got);
    goto out;
  }
  const json_t *en = json_object_get(schema, "enum");
  if (en) {
    bool any = false;
    size_t i;
    json_t *e;
    json_array_foreach(en, i, e) any = any || json_equal(e, (json_t *)v);
    if (!any) {
      char *got = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      char *want = json_dumps(en, JSON_COMPACT);
      ok = fail(c, "%.80s is not one of %s", got ? got : "?", want ? want : "?");
      free(got);
      free(want);
      goto out;
    }
  }
  const json_t *all = json_object_get(schema, "allOf");
  if (all) {
    size_t i;
    json_t *s;
    json_array_foreach(all, i, s) if (!check(c, s, v)) {
      ok = false;
      goto out;
    }
  }
  if (json_object_get(schema, "oneOf") &&
      !check_alternatives(c, "oneOf", json_object_get(schema, "oneOf"), v)) {
    ok = false;
    goto out;
  }
  if (json_object_get(schema, "anyOf") &&
      !check_alternatives(c, "anyOf", json_object_get(schema, "anyOf"), v)) {
    ok = false;
    goto out;
  }
  if (json_is_object(v))
    ok = check_object(c, schema, v);
  else if (json_is_array(v))
    ok = check_array(c, schema, v);
  else if (json_is_string(v))
    ok = check_string(c, schema, v);
  else if (json_is_number(v))
    ok = check_number(c, schema, v);
out:
  c->depth--;
  return ok;
}

bool cph_oas_validate(const cph_oas *d, const json_t *schema, const json_t *value, bool strict,
                      char *err, size_t size) {
  vctx c = {.d = d, .strict = strict, .err = err, .size = size};
  if (size)
    err[0] = '\0';
  bool ok = check(&c, schema, value);
  if (!ok && !c.failed)
    snprintf(err, size, "does not match");
  return ok;
}

/* ================================================================ answers */

/* Whether the path (no query) matches the template "/v1/sessions/{id}"; *literal counts the
 * literal segments, so the most specific of several matches can be picked. */
static bool path_matches(const char *tmpl, const char *path, int *literal) {
  *literal = 0;
  while (*tmpl && *path) {
    if (*tmpl != '/' || *path != '/')
      return false;
    tmpl++;
    path++;
    const char *te = strchr(tmpl, '/'), *pe = strchr(path, '/');
    size_t tl = te ? (size_t)(te - tmpl) : strlen(tmpl);
    size_t pl = pe ? (size_t)(pe - path) : strlen(path);
    if (tl >= 2 && tmpl[0] == '{' && tmpl[tl - 1] == '}') {
      if (pl == 0)
        return false;
    } else if (tl != pl || memcmp(tmpl, path, tl) != 0) {
      return false;
    } else {
      (*literal)++;
    }
    tmpl += tl;
    path += pl;
  }
  return *tmpl == '\0' && *path == '\0';
}

/* A response or media type that may be a $ref. */
static const json_t *deref(const cph_oas *d, const json_t *node) {
  for (int hops = 0; hops < 8 && json_is_object(node); hops++) {
    const json_t *ref = json_object_get(node, "$ref");
    if (!json_is_string(ref))
      return node;
    node = resolve(d, json_string_value(ref));
  }
  return node;
}

static bool is_json_like(const char *media) {
  return strcmp(media, "application/json") == 0 || strcmp(media, "application/msgpack") == 0;
}

bool cph_oas_check_answer(const cph_oas *d, const char *method, const char *target, int status,
                          const char *content_type, bool has_body, const json_t *body,
                          char *err, size_t size) {
  char path[2048];
  snprintf(path, sizeof path, "%s", target);
  path[strcspn(path, "?#")] = '\0';
  char m[16];
  size_t i = 0;
  for (; method[i] && i + 1 < sizeof m; i++)
    m[i] = (char)(method[i] >= 'A' && method[i] <= 'Z' ? method[i] + 32 : method[i]);
  m[i] = '\0';
  char media[128] = "";
  if (content_type) {
    snprintf(media, sizeof media, "%s", content_type);
    media[strcspn(media, "; ")] = '\0';
    for (char *p = media; *p; p++)
      *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
  }

  const json_t *paths = json_object_get(d->doc, "paths");
  const json_t *op = NULL;
  const char *tmpl_found = NULL;
  int best = -1;
  const char *tmpl;
  json_t *item;
  /* The most specific template the path matches (the most literal segments, as the daemon
   * routes), whatever its methods: GET /v1/turns/lease is the lease path's, which has no GET,
   * not /v1/turns/{id}'s. */
  json_object_foreach((json_t *)paths, tmpl, item) {
    int literal;
    if (path_matches(tmpl, path, &literal) && literal > best) {
      best = literal;
      op = json_object_get(item, m);
      tmpl_found = tmpl;
    }
  }

  if (!op) {
    /* Not a documented operation: only an error may answer it, in the error format (or the
     * HTTP layer's own page for a request it refused before routing). */
    if (status < 400) {
      snprintf(err, size, "answered %d, but the document has no operation %s %s", status,
               method, path);
      return false;
    }
    if (strcmp(media, "text/html") == 0)
      return true;
    if (!body || !is_json_like(media)) {
      snprintf(err, size, "an error for an undocumented operation, not in the error format "
               "(Content-Type %s)", content_type ? content_type : "none");
      return false;
    }
    const json_t *schema = resolve(d, "#/components/schemas/Error");
    if (!schema) {
      snprintf(err, size, "the document has no #/components/schemas/Error");
      return false;
    }
    return cph_oas_validate(d, schema, body, true, err, size);
  }

  char code[8];
  snprintf(code, sizeof code, "%d", status);
  const json_t *responses = json_object_get(op, "responses");
  const json_t *resp = deref(d, json_object_get(responses, code));
  if (!resp) {
    snprintf(err, size, "status %d is not documented for %s %s", status, method, tmpl_found);
    return false;
  }
  const json_t *content = json_object_get(resp, "content");
  if (!content || json_object_size(content) == 0) {
    if (has_body) {
      snprintf(err, size, "a body, but the document's %d answer of %s %s has none", status,
               method, tmpl_found);
      return false;
    }
    return true;
  }
  if (!has_body) {
    snprintf(err, size, "no body, but the document's %d answer of %s %s has one", status,
             method, tmpl_found);
    return false;
  }
  const json_t *mt = deref(d, json_object_get(content, media));
  if (!mt) {
    snprintf(err, size, "Content-Type %s is not documented for the %d answer of %s %s",
             content_type ? content_type : "(none)", status, method, tmpl_found);
    return false;
  }
  const json_t *schema = json_object_get(mt, "schema");
  if (!schema)
    return true;
  if (is_json_like(media)) {
    if (!body) {
      snprintf(err, size, "the body is not valid %s", media);
      return false;
    }
    return cph_oas_validate(d, schema, body, true, err, size);
  }
  /* A text media type: the schema can only say "a string". */
  const json_t *t = json_object_get(deref(d, schema), "type");
  if (!json_is_string(t) || strcmp(json_string_value(t), "string") != 0) {
    snprintf(err, size, "the %s answer's schema is not a string", media);
    return false;
  }
  return true;
}

/* ================================================================ msgpack */

static json_t *mp_value(const msgpack_object *o, int depth) {
  if (depth > 64)
    return NULL;
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: return json_null();
  case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    return o->via.u64 > (uint64_t)INT64_MAX ? NULL : json_integer((json_int_t)o->via.u64);
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: return json_real(o->via.f64);
  case MSGPACK_OBJECT_STR: return json_stringn(o->via.str.ptr, o->via.str.size);
  case MSGPACK_OBJECT_ARRAY: {
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < o->via.array.size; i++) {
      json_t *x = mp_value(&o->via.array.ptr[i], depth + 1);
      if (!x || json_array_append_new(a, x) != 0) {
        json_decref(a);
        return NULL;
      }
    }
    return a;
  }
  case MSGPACK_OBJECT_MAP: {
    json_t *m = json_object();
    for (uint32_t i = 0; m && i < o->via.map.size; i++) {
      const msgpack_object *k = &o->via.map.ptr[i].key;
      json_t *x = k->type == MSGPACK_OBJECT_STR ? mp_value(&o->via.map.ptr[i].val, depth + 1)
                                                 : NULL;
      char *key = x ? strndup(k->via.str.ptr, k->via.str.size) : NULL;
      if (!key || json_object_set_new(m, key, x) != 0) {
        free(key);
        json_decref(x);
        json_decref(m);
        return NULL;
      }
      free(key);
    }
    return m;
  }
  default: return NULL;
  }
}

json_t *cph_oas_msgpack_json(const void *data, size_t len) {
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  json_t *j = NULL;
  if (msgpack_unpack_next(&up, data, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len)
    j = mp_value(&up.data, 0);
  msgpack_unpacked_destroy(&up);
  return j;
}

/* ================================================================ the clients' hook */

#define MAX_WATCHED 64

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static int watched[MAX_WATCHED];

void cph_oas_watch_port(int port) {
  pthread_mutex_lock(&watch_lock);
  for (int i = 0; i < MAX_WATCHED; i++)
    if (watched[i] == port || watched[i] == 0) {
      watched[i] = port;
      break;
    }
  pthread_mutex_unlock(&watch_lock);
}

void cph_oas_unwatch_port(int port) {
  pthread_mutex_lock(&watch_lock);
  for (int i = 0; i < MAX_WATCHED; i++)
    if (watched[i] == port)
      watched[i] = -1; /* a hole: a later watch may reuse it */
  pthread_mutex_unlock(&watch_lock);
}

static bool is_watched(int port) {
  bool yes = false;
  pthread_mutex_lock(&watch_lock);
  for (int i = 0; i < MAX_WATCHED && watched[i] != 0 && !yes; i++)
    yes = watched[i] == port;
  pthread_mutex_unlock(&watch_lock);
  return yes;
}

static pthread_once_t doc_once = PTHREAD_ONCE_INIT;
static cph_oas *the_doc;

static void load_doc(void) {
  char *path = cph_test_source_path("docs/openapi.json");
  char err[512];
  the_doc = cph_oas_load(path, err, sizeof err);
  if (!the_doc) {
    fprintf(stderr, "openapi: cannot load the document the answers are checked against: %s\n",
            err);
    abort();
  }
  free(path);
}

/* The value of header name in head ("Name: value\r\n" lines), copied into buf; NULL if absent. */
static const char *header(const char *head, const char *name, char *buf, size_t size) {
  size_t nlen = strlen(name);
  for (const char *line = strstr(head, "\r\n"); line; line = strstr(line, "\r\n")) {
    line += 2;
    if (strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
      const char *v = line + nlen + 1;
      while (*v == ' ' || *v == '\t')
        v++;
      size_t len = strcspn(v, "\r\n");
      snprintf(buf, size, "%.*s", (int)len, v);
      return buf;
    }
  }
  return NULL;
}

void cph_oas_expect_answer(int port, const char *method, const char *target, int status,
                           const char *head, const char *body, size_t body_len) {
  if (status < 0 || !head || !is_watched(port))
    return;
  char cl[32], ct[128];
  const char *length = header(head, "Content-Length", cl, sizeof cl);
  if (length && (size_t)strtoull(length, NULL, 10) > body_len)
    return; /* cut short: the daemon was killed mid-answer, or the client gave up */
  const char *type = header(head, "Content-Type", ct, sizeof ct);
  pthread_once(&doc_once, load_doc);
  json_t *value = NULL;
  if (body_len && type && strncasecmp(type, "application/json", 16) == 0)
    value = json_loadb(body, body_len, JSON_DECODE_ANY, NULL);
  else if (body_len && type && strncasecmp(type, "application/msgpack", 19) == 0)
    value = cph_oas_msgpack_json(body, body_len);
  char err[1024];
  bool ok = cph_oas_check_answer(the_doc, method, target, status, type, body_len > 0, value, err,
                                 sizeof err);
  if (ok) {
    json_decref(value);
    return;
  }
  /* a msgpack body is shown as the JSON value it was checked as */
  char *shown = value && type && strncasecmp(type, "application/msgpack", 19) == 0
                    ? json_dumps(value, JSON_COMPACT | JSON_ENCODE_ANY)
                    : NULL;
  const char *text = shown ? shown : body ? body : "";
  size_t len = shown ? strlen(shown) : body_len;
  fprintf(stderr,
          "openapi: %s %s -> %d: %s\n"
          "  (the answer does not match docs/openapi.json: fix the document, or the daemon)\n"
          "  the body%s: %.*s%s\n",
          method, target, status, err, shown ? " (msgpack, as JSON)" : "",
          (int)(len > 2000 ? 2000 : len), text, len > 2000 ? "..." : "");
  abort();
}
