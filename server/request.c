/* The request context: its memory, its lifetime, its recorded error, its query and body, and
 * typed access to body fields. See request.h. */
#include "request.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/keyvalq_struct.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include "mpjson.h"
#include "server.h"

/* ================================================================ request memory */

struct cph_arena_block {
  cph_arena_block *next;
  size_t used, cap;
  max_align_t data[];
};

#define ARENA_BLOCK 4096

void *cph_req_alloc(cph_req *r, size_t n) {
  size_t need = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
  if (need < n) {
    cph_req_fail(r, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  cph_arena_block *b = r->arena;
  if (!b || b->cap - b->used < need) {
    size_t cap = need > ARENA_BLOCK ? need : ARENA_BLOCK;
    b = malloc(sizeof *b + cap);
    if (!b) {
      cph_req_fail(r, 500, "internal", NULL, "out of memory");
      return NULL;
    }
    b->cap = cap;
    b->used = 0;
    b->next = r->arena;
    r->arena = b;
  }
  void *p = (char *)b->data + b->used;
  b->used += need;
  memset(p, 0, n);
  return p;
}

static void arena_free(cph_req *r) {
  cph_arena_block *b = r->arena;
  while (b) {
    cph_arena_block *next = b->next;
    free(b);
    b = next;
  }
  r->arena = NULL;
}

cph_req *cph_req_new(cph_srv *s, struct evhttp_request *ev) {
  cph_req *r = calloc(1, sizeof *r);
  if (!r)
    return NULL;
  r->srv = s;
  r->ev = ev;
  TAILQ_INIT(&r->query);
  r->next = s->reqs;
  if (s->reqs)
    s->reqs->prev = r;
  s->reqs = r;
  return r;
}

void cph_req_end(cph_req *r) {
  if (r->in_done) { /* on_done's caller still reads r: it ends it (on_op_done) */
    r->end_wanted = true;
    return;
  }
  cph_srv *s = r->srv;
  if (r->prev)
    r->prev->next = r->next;
  else
    s->reqs = r->next;
  if (r->next)
    r->next->prev = r->prev;
  if (r->lp_timer)
    event_free(r->lp_timer);
  if (r->lp_watch)
    event_free(r->lp_watch);
  if (r->query_parsed)
    evhttp_clear_headers(&r->query);
  json_decref(r->body);
  arena_free(r);
  free(r);
}

/* ================================================================ errors */

void cph_req_vfail(cph_req *r, int status, const char *code, const char *field,
                    const char *fmt, va_list ap) {
  if (r->error.set)
    return;
  r->error.set = true;
  r->error.status = status;
  r->error.code = code;
  snprintf(r->error.field, sizeof r->error.field, "%s", field ? field : "");
  vsnprintf(r->error.message, sizeof r->error.message, fmt, ap);
}

void cph_req_fail(cph_req *r, int status, const char *code, const char *field, const char *fmt,
                  ...) {
  va_list ap;
  va_start(ap, fmt);
  cph_req_vfail(r, status, code, field, fmt, ap);
  va_end(ap);
}

/* ================================================================ request data */

const char *cph_req_query(cph_req *r, const char *key) {
  return r->query_parsed ? evhttp_find_header(&r->query, key) : NULL;
}

bool cph_query_u64(cph_req *r, const char *key, uint64_t def, uint64_t max, uint64_t *out) {
  const char *v = cph_req_query(r, key);
  if (!v || !*v) {
    *out = def;
    return true;
  }
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (*end != '\0' || v[0] == '-' || v[0] == '+' || errno == ERANGE || n > max) {
    cph_req_fail(r, 400, "bad_request", key, "%s must be an integer from 0 to %" PRIu64, key, max);
    return false;
  }
  *out = n;
  return true;
}

const char *cph_field_path(char *buf, size_t size, const char *path, const char *key) {
  snprintf(buf, size, "%s%s%s", path, path[0] ? "." : "", key);
  return buf;
}

/* The field, or NULL when absent or JSON null. */
static json_t *field_get(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return v && !json_is_null(v) ? v : NULL;
}

static bool missing(cph_req *r, const char *path, const char *key, unsigned flags) {
  if (!(flags & CPH_IN_REQUIRED))
    return true;
  char f[192];
  cph_field_path(f, sizeof f, path, key);
  cph_req_fail(r, 400, "bad_request", f, "%s is required", f);
  return false;
}

static bool wrong_type(cph_req *r, const char *path, const char *key, const char *expected) {
  char f[192];
  cph_field_path(f, sizeof f, path, key);
  cph_req_fail(r, 400, "bad_request", f, "%s must be %s", f, expected);
  return false;
}

bool cph_in_str(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                const char **out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_string(v))
    return wrong_type(r, path, key, "a string");
  *out = json_string_value(v);
  return true;
}

bool cph_in_u64(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                uint64_t max, uint64_t *out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_integer(v) || json_integer_value(v) < 0 ||
      (uint64_t)json_integer_value(v) > max) {
    char expected[64];
    snprintf(expected, sizeof expected, "an integer from 0 to %" PRIu64, max);
    return wrong_type(r, path, key, expected);
  }
  *out = (uint64_t)json_integer_value(v);
  return true;
}

bool cph_in_i64(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                int64_t min, int64_t max, int64_t *out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
    char expected[96];
    snprintf(expected, sizeof expected, "an integer from %" PRId64 " to %" PRId64, min, max);
    return wrong_type(r, path, key, expected);
  }
  *out = (int64_t)json_integer_value(v);
  return true;
}

bool cph_in_bool(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                 bool *out) {
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_boolean(v))
    return wrong_type(r, path, key, "true or false");
  *out = json_is_true(v);
  return true;
}

bool cph_in_strv(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                 cph_strv *out) {
  out->items = NULL;
  out->count = 0;
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_array(v))
    return wrong_type(r, path, key, "an array of strings");
  size_t n = json_array_size(v);
  if (n == 0)
    return true;
  char **items = cph_req_alloc(r, n * sizeof *items);
  if (!items)
    return false;
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_array_get(v, i);
    if (!json_is_string(s)) {
      char f[192], fi[224];
      cph_field_path(f, sizeof f, path, key);
      snprintf(fi, sizeof fi, "%s[%zu]", f, i);
      cph_req_fail(r, 400, "bad_request", fi, "%s must be a string", fi);
      return false;
    }
    /* The engine takes char ** but does not write through it (inputs stay the caller's). */
    items[i] = (char *)json_string_value(s);
  }
  out->items = items;
  out->count = n;
  return true;
}

bool cph_in_obj(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                json_t **out) {
  *out = NULL;
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_object(v))
    return wrong_type(r, path, key, "an object");
  *out = v;
  return true;
}

bool cph_in_arr(cph_req *r, json_t *obj, const char *path, const char *key, unsigned flags,
                json_t **out) {
  *out = NULL;
  json_t *v = field_get(obj, key);
  if (!v)
    return missing(r, path, key, flags);
  if (!json_is_array(v))
    return wrong_type(r, path, key, "an array");
  *out = v;
  return true;
}

/* ================================================================ body decoding */

/* Every string (and key) in the body must fit :server :max-string-bytes; the first one that
 * does not is named by its path ("events[3].body"). Iterative depth is bounded by the
 * decoders (jansson: 2048, msgpack: CPH_MPJSON_MAX_DEPTH). Walked first without a path (NULL:
 * no failure recorded either); only a body that fails is walked again building the paths,
 * which a body that fits never needs. */
static bool check_strings(cph_req *r, json_t *v, char *path, size_t plen, size_t cap,
                          size_t max) {
  if (json_is_string(v)) {
    if (json_string_length(v) <= max)
      return true;
    if (path)
      cph_req_fail(r, 413, "too_large", path[0] ? path : NULL,
                   "%s is %zu bytes, longer than :max-string-bytes %zu", path[0] ? path : "string",
                   json_string_length(v), max);
    return false;
  }
  if (json_is_array(v)) {
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
      size_t nl = plen;
      if (path) {
        int w = snprintf(path + plen, cap - plen, "[%zu]", i);
        nl = w > 0 && (size_t)w < cap - plen ? plen + (size_t)w : plen;
      }
      if (!check_strings(r, json_array_get(v, i), path, nl, cap, max))
        return false;
      if (path)
        path[plen] = '\0';
    }
    return true;
  }
  if (json_is_object(v)) {
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(v, key, key_len, val) {
      size_t nl = plen;
      if (path) {
        int w = snprintf(path + plen, cap - plen, "%s%.*s", plen ? "." : "",
                         (int)(key_len > 64 ? 64 : key_len), key);
        nl = w > 0 && (size_t)w < cap - plen ? plen + (size_t)w : plen;
      }
      if (key_len > max) {
        if (path)
          cph_req_fail(r, 413, "too_large", path, "a key is %zu bytes, longer than "
                       ":max-string-bytes %zu", key_len, max);
        return false;
      }
      if (!check_strings(r, val, path, nl, cap, max))
        return false;
      if (path)
        path[plen] = '\0';
    }
  }
  return true;
}

static bool is_msgpack_type(const char *ct) {
  if (!ct)
    return false;
  while (*ct == ' ')
    ct++;
  return strncasecmp(ct, "application/msgpack", 19) == 0 ||
         strncasecmp(ct, "application/x-msgpack", 21) == 0;
}

const char *cph_req_raw_json(cph_req *r, size_t *len) {
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  struct evbuffer *in = evhttp_request_get_input_buffer(r->ev);
  *len = evbuffer_get_length(in);
  if (*len == 0 || (int64_t)*len > p->server.max_body_bytes ||
      is_msgpack_type(evhttp_find_header(evhttp_request_get_input_headers(r->ev),
                                         "Content-Type")))
    return NULL;
  return (const char *)evbuffer_pullup(in, -1);
}

bool cph_req_decode_body(cph_req *r) {
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  struct evbuffer *in = evhttp_request_get_input_buffer(r->ev);
  size_t len = evbuffer_get_length(in);
  if ((int64_t)len > p->server.max_body_bytes) {
    cph_req_fail(r, 413, "too_large", NULL, "request body is %zu bytes, more than "
                 ":max-body-bytes %" PRId64, len, p->server.max_body_bytes);
    return false;
  }
  if (len == 0) {
    r->body = json_object();
    return r->body != NULL;
  }
  const char *data = (const char *)evbuffer_pullup(in, -1);
  if (!data) {
    cph_req_fail(r, 500, "internal", NULL, "out of memory");
    return false;
  }
  const char *ct = evhttp_find_header(evhttp_request_get_input_headers(r->ev), "Content-Type");
  if (is_msgpack_type(ct)) {
    char err[256];
    r->body = cph_mpjson_read(data, len, err, sizeof err);
    if (!r->body) {
      cph_req_fail(r, 400, "bad_request", NULL, "%s", err);
      return false;
    }
  } else {
    json_error_t je;
    r->body = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    if (!r->body) {
      cph_req_fail(r, 400, "bad_request", NULL, "invalid JSON at line %d, column %d (byte %d): %s",
                   je.line, je.column, je.position, je.text);
      return false;
    }
  }
  if (!json_is_object(r->body)) {
    cph_req_fail(r, 400, "bad_request", NULL, "the request body must be an object");
    return false;
  }
  size_t max = (size_t)p->server.max_string_bytes;
  if (check_strings(r, r->body, NULL, 0, 0, max))
    return true;
  char path[256] = "";
  return check_strings(r, r->body, path, 0, sizeof path, max);
}
