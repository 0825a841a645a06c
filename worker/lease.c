/* The lease answer, read without a jansson tree for its messages (contract in worker.h).
 *
 * A lease answer is mostly turn.messages (about 31 KB of a window's history), and the worker
 * only passes each message's role, content and name on to the model. Parsing them into a tree,
 * freeing it and dumping it again took about half the worker's CPU a turn (bench/PROFILE.md,
 * "The reference worker's own cost"). Here a scanner finds the messages' span in the answer's
 * text, copies those three members of each message as they are written (a JSON value taken
 * from valid JSON is valid JSON), and jansson parses the rest with `[]` in the span's place.
 *
 * The scanner checks the structure it walks (strings closed, brackets matched, members
 * separated) but not every literal; the rest of the answer goes through jansson whole, and an
 * answer the scanner cannot walk is parsed whole as before (wk_lease_read says which). */
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "worker/worker.h"

typedef struct scan {
  const char *p, *end;
} scan;

static void ws(scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
    s->p++;
}

/* At a '"': moves past the closing quote. */
static bool skip_string(scan *s) {
  for (s->p++; s->p < s->end; s->p++) {
    if (*s->p == '\\') {
      s->p++; /* the escaped character (a \u's digits are plain characters) */
      continue;
    }
    if (*s->p == '"') {
      s->p++;
      return true;
    }
  }
  return false;
}

/* Moves past one value of any kind. Containers nest up to MAX_DEPTH. */
#define MAX_DEPTH 512
static bool skip_value(scan *s) {
  ws(s);
  if (s->p >= s->end)
    return false;
  if (*s->p == '"')
    return skip_string(s);
  if (*s->p != '{' && *s->p != '[') { /* a number, true, false or null */
    const char *from = s->p;
    while (s->p < s->end && strchr("+-.0123456789eEtrufalsn", *s->p) && *s->p)
      s->p++;
    return s->p > from;
  }
  char open[MAX_DEPTH];
  int depth = 0;
  while (s->p < s->end) {
    char c = *s->p;
    if (c == '"') {
      if (!skip_string(s))
        return false;
      continue;
    }
    if (c == '{' || c == '[') {
      if (depth == MAX_DEPTH)
        return false;
      open[depth++] = c;
    } else if (c == '}' || c == ']') {
      if (depth == 0 || open[depth - 1] != (c == '}' ? '{' : '['))
        return false;
      if (--depth == 0) {
        s->p++;
        return true;
      }
    }
    s->p++;
  }
  return false;
}

/* At a '{' (after ws): calls `member` for each member with the key's text (between the
 * quotes, escapes as written) and the scanner at the value, which member must skip. */
typedef bool (*member_fn)(void *arg, const char *key, size_t key_len, scan *s);
static bool each_member(scan *s, member_fn member, void *arg) {
  ws(s);
  if (s->p >= s->end || *s->p != '{')
    return false;
  s->p++;
  ws(s);
  if (s->p < s->end && *s->p == '}') {
    s->p++;
    return true;
  }
  for (;;) {
    ws(s);
    if (s->p >= s->end || *s->p != '"')
      return false;
    const char *key = s->p + 1;
    if (!skip_string(s))
      return false;
    size_t key_len = (size_t)(s->p - 1 - key);
    ws(s);
    if (s->p >= s->end || *s->p != ':')
      return false;
    s->p++;
    ws(s);
    if (!member(arg, key, key_len, s))
      return false;
    ws(s);
    if (s->p < s->end && *s->p == ',') {
      s->p++;
      continue;
    }
    if (s->p < s->end && *s->p == '}') {
      s->p++;
      return true;
    }
    return false;
  }
}

static bool key_is(const char *key, size_t len, const char *name) {
  return len == strlen(name) && memcmp(key, name, len) == 0;
}

/* ---------------------------------------------------------------- one message */

typedef struct span {
  const char *p;
  size_t len;
} span;

typedef struct message {
  span role, content, name; /* the values' text; len 0: absent */
} message;

static bool message_member(void *arg, const char *key, size_t len, scan *s) {
  message *m = arg;
  span *into = key_is(key, len, "role")      ? &m->role
               : key_is(key, len, "content") ? &m->content
               : key_is(key, len, "name")    ? &m->name
                                             : NULL;
  const char *from = s->p;
  if (!skip_value(s))
    return false;
  if (into) /* a repeated member: the last one counts, as in jansson */
    *into = (span){from, (size_t)(s->p - from)};
  return true;
}

/* As initial_messages did with the tree: role (default "user"), content (default ""), and
 * name when it is a string. */
static void message_write(cph_buf *out, const message *m) {
  cph_buf_puts(out, "{\"role\":");
  if (m->role.len)
    cph_buf_append(out, m->role.p, m->role.len);
  else
    cph_buf_puts(out, "\"user\"");
  cph_buf_puts(out, ",\"content\":");
  if (m->content.len)
    cph_buf_append(out, m->content.p, m->content.len);
  else
    cph_buf_puts(out, "\"\"");
  if (m->name.len && m->name.p[0] == '"') {
    cph_buf_puts(out, ",\"name\":");
    cph_buf_append(out, m->name.p, m->name.len);
  }
  cph_buf_putc(out, '}');
}

/* At the messages' '[': writes each message into out, comma-separated. */
static bool messages_copy(scan *s, cph_buf *out, size_t *n) {
  ws(s);
  if (s->p >= s->end || *s->p != '[')
    return false;
  s->p++;
  ws(s);
  if (s->p < s->end && *s->p == ']') {
    s->p++;
    return true;
  }
  for (;;) {
    message m;
    memset(&m, 0, sizeof m);
    ws(s);
    if (!each_member(s, message_member, &m))
      return false;
    if (*n)
      cph_buf_putc(out, ',');
    message_write(out, &m);
    (*n)++;
    ws(s);
    if (s->p < s->end && *s->p == ',') {
      s->p++;
      continue;
    }
    if (s->p < s->end && *s->p == ']') {
      s->p++;
      return true;
    }
    return false;
  }
}

/* ---------------------------------------------------------------- the answer */

typedef struct finder {
  span messages; /* turn.messages' value */
  int level;     /* 0: the answer's members, 1: the turn's */
} finder;

static bool find_member(void *arg, const char *key, size_t len, scan *s) {
  finder *f = arg;
  if (f->level == 0 && key_is(key, len, "turn") && *s->p == '{') {
    f->level = 1;
    bool ok = each_member(s, find_member, f);
    f->level = 0;
    return ok;
  }
  const char *from = s->p;
  if (!skip_value(s))
    return false;
  if (f->level == 1 && key_is(key, len, "messages"))
    f->messages = (span){from, (size_t)(s->p - from)};
  return true;
}

int wk_lease_read(const char *text, size_t len, wk_lease *out) {
  memset(out, 0, sizeof *out);
  finder f;
  memset(&f, 0, sizeof f);
  scan s = {text, text + len};
  bool walked = each_member(&s, find_member, &f);
  ws(&s);
  cph_buf msgs = CPH_BUF_INIT;
  size_t n = 0;
  if (walked && s.p == s.end && f.messages.p) {
    scan m = {f.messages.p, f.messages.p + f.messages.len};
    walked = messages_copy(&m, &msgs, &n);
  }
  if (!walked || !f.messages.p) { /* not walked, or no messages: the whole text as before */
    cph_buf_free(&msgs);
    out->answer = json_loadb(text, len, 0, NULL);
    if (!out->answer)
      return -1;
    json_t *turn = json_object_get(out->answer, "turn");
    json_t *list = json_object_get(turn, "messages");
    if (json_is_array(list)) { /* the same text from the tree */
      size_t i;
      json_t *m;
      cph_buf b = CPH_BUF_INIT;
      json_array_foreach(list, i, m) {
        json_t *o = json_object();
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content"),
               *name = json_object_get(m, "name");
        json_object_set_new(o, "role", role ? json_incref(role) : json_string("user"));
        json_object_set_new(o, "content", content ? json_incref(content) : json_string(""));
        if (json_is_string(name))
          json_object_set(o, "name", name);
        char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
        json_decref(o);
        if (i)
          cph_buf_putc(&b, ',');
        cph_buf_puts(&b, t ? t : "{}");
        free(t);
      }
      out->messages = b;
      out->n_messages = json_array_size(list);
      json_object_set_new(turn, "messages", json_array());
    }
    out->whole = true;
    return 0;
  }
  /* The answer with "[]" for the messages: small, for jansson. */
  cph_buf rest = CPH_BUF_INIT;
  size_t head = (size_t)(f.messages.p - text);
  cph_buf_append(&rest, text, head);
  cph_buf_puts(&rest, "[]");
  cph_buf_append(&rest, f.messages.p + f.messages.len, len - head - f.messages.len);
  out->answer = json_loadb(rest.data, rest.len, 0, NULL);
  cph_buf_free(&rest);
  if (!out->answer || cph_buf_error(&msgs)) {
    json_decref(out->answer);
    out->answer = NULL;
    cph_buf_free(&msgs);
    return -1;
  }
  out->messages = msgs;
  out->n_messages = n;
  return 0;
}

void wk_lease_free(wk_lease *l) {
  json_decref(l->answer);
  cph_buf_free(&l->messages);
  memset(l, 0, sizeof *l);
}
