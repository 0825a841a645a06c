/* Ingest (DESIGN §4, §9).
 *
 *   POST /v1/events {"events": [{channel, sender, body, session?, mentions?, kind?, ts_ms?,
 *                                key?}, ...]}
 *     -> 200 {"results": [{"id", "status", "sessions", "reason"?, "field"?, "busy"?}]},
 *        answered only after the transaction holding the events committed.
 *     busy: [{"session", "reason": "session_busy"}] — sessions it was routed to that refused
 *     it (their turn was running, while_running :reject); status is "rejected" (reason
 *     session_busy) only when it reached no session, and its id is there: it was stored.
 *
 * Split of the checks: the server answers 400 for the structure (no "events" array, an
 * element that is not an object, a field of the wrong type — the field is named, e.g.
 * "events[3].channel") and 413 for the size (:max-events-per-request, :max-string-bytes);
 * whether an event makes sense (a channel or a session, a sender, ...) is the engine's call,
 * answered per event as status "rejected" with "reason" and "field", so one bad event never
 * sinks a batch.
 *
 * Decoding: a plain JSON body goes through fast_events (no jansson tree); anything it does
 * not take — msgpack, escapes it leaves alone, every error — through the generic decoder.
 * Both give the same events and the same answers (test_api_errors checks them side by side). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "clusterflow.h"
#include "emit.h"
#include "routes.h"
#include "server.h"

/* Writes {"results": [...]} with cph_emit: one result object per event, in request order,
 * members id, status, sessions, then reason and field when set. The same shape the jansson
 * path used to build; writing it straight into the buffer saves a node per value. */
static void results_reply(cph_req *r, const cph_event_result *results, size_t n) {
  cph_buf body = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &body, r->msgpack_out);
  cph_emit_object(&w, 1);
  cph_emit_key(&w, "results");
  cph_emit_array(&w, results ? n : 0);
  for (size_t i = 0; results && i < n; i++) {
    const cph_event_result *res = &results[i];
    cph_emit_object(&w, 3 + (res->reason != NULL) + (res->field != NULL) +
                            (res->busy.count > 0));
    cph_emit_key(&w, "id");
    if (res->id)
      cph_emit_u64(&w, res->id);
    else
      cph_emit_str(&w, NULL);
    cph_emit_key(&w, "status");
    cph_emit_str(&w, cph_ingest_status_name(res->status));
    cph_emit_key(&w, "sessions");
    cph_emit_array(&w, res->sessions.count);
    for (size_t j = 0; j < res->sessions.count; j++)
      cph_emit_str(&w, res->sessions.items[j]);
    cph_emit_end(&w);
    if (res->reason) {
      cph_emit_key(&w, "reason");
      cph_emit_str(&w, res->reason);
    }
    if (res->field) {
      cph_emit_key(&w, "field");
      cph_emit_str(&w, res->field);
    }
    if (res->busy.count) {
      cph_emit_key(&w, "busy");
      cph_emit_array(&w, res->busy.count);
      for (size_t j = 0; j < res->busy.count; j++) {
        cph_emit_object(&w, 2);
        cph_emit_key(&w, "session");
        cph_emit_str(&w, res->busy.items[j]);
        cph_emit_key(&w, "reason");
        cph_emit_str(&w, "session_busy");
        cph_emit_end(&w);
      }
      cph_emit_end(&w);
    }
    cph_emit_end(&w);
  }
  cph_emit_end(&w);
  cph_emit_end(&w);
  cph_reply_emitted(r, 200, &body);
}

static void ingest_done(cph_req *r) {
  cph_op *op = &r->op;
  if (op->rc != CPH_OK) {
    cph_reply_rc(r, op->rc, op->err.msg, op->field);
    return;
  }
  results_reply(r, op->u.ingest.results, op->u.ingest.n_events);
}

/* ---------------------------------------------------------------- the common case, fast
 *
 * Most ingest bodies are plain: {"events": [{"channel": "...", ...}, ...]} with known fields,
 * string values without \u escapes, a non-negative integer ts_ms. fast_events decodes such a
 * body straight into cph_event_in (strings copied into the request's arena), without a
 * jansson tree. It accepts only bodies the generic path (json_loadb + the cph_in_* checks)
 * would accept with the same values, and gives up — false, nothing answered — on anything
 * else: unknown or repeated keys, other value types, \u escapes, ill-formed UTF-8, a string
 * over :max-string-bytes, more events than :max-events-per-request, no events. The generic
 * path then decodes the body and answers exactly as before (errors name their field). */

typedef struct fast_in {
  cph_req *r;
  const char *p, *end;
  size_t max_str;
} fast_in;

enum { F_CHANNEL, F_SENDER, F_BODY, F_SESSION, F_KIND, F_KEY, F_MENTIONS, F_TS_MS, F_COUNT };
static const char *const FIELD_NAMES[F_COUNT] = {"channel", "sender", "body",     "session",
                                                 "kind",    "key",    "mentions", "ts_ms"};

static void fast_ws(fast_in *f) {
  while (f->p < f->end && (*f->p == ' ' || *f->p == '\t' || *f->p == '\n' || *f->p == '\r'))
    f->p++;
}

/* Skips whitespace, then c if it is next. */
static bool fast_lit(fast_in *f, char c) {
  fast_ws(f);
  if (f->p < f->end && *f->p == c) {
    f->p++;
    return true;
  }
  return false;
}

/* Whether any of the 8 bytes in x is a quote, a backslash, a control character (< 0x20) or
 * not ASCII: the bytes fast_str looks at one by one. The usual SWAR tests (a zero byte of
 * x ^ c; a byte under 0x20; the top bit), exact when the top bits are clear. */
static inline bool swar_special(uint64_t x) {
  const uint64_t ones = 0x0101010101010101ull, tops = 0x8080808080808080ull;
  uint64_t q = x ^ (ones * '"'), b = x ^ (ones * '\\');
  uint64_t hit = ((q - ones) & ~q) | ((b - ones) & ~b) | (x - ones * 0x20) | x;
  return (hit & tops) != 0;
}

/* A string value into the arena (NUL-terminated); false on anything fast_events leaves to
 * the generic path. */
static bool fast_str(fast_in *f, char **out) {
  if (!fast_lit(f, '"'))
    return false;
  const char *start = f->p;
  bool escaped = false;
  while (f->p < f->end) {
    uint64_t x; /* plain ASCII 8 bytes at a time; anything else one by one */
    while (f->end - f->p >= 8 && (memcpy(&x, f->p, 8), !swar_special(x)))
      f->p += 8;
    if (f->p >= f->end)
      break;
    uint8_t c = (uint8_t)*f->p;
    if (c == '"')
      break;
    if (c < 0x20)
      return false;
    if (c == '\\') {
      if (f->end - f->p < 2 || f->p[1] == 'u')
        return false;
      escaped = true;
      f->p += 2;
    } else if (c >= 0x80) {
      size_t n = cph_utf8_seq((const uint8_t *)f->p, (size_t)(f->end - f->p));
      if (!n)
        return false;
      f->p += n;
    } else {
      f->p++;
    }
  }
  if (f->p >= f->end)
    return false;
  size_t raw = (size_t)(f->p - start);
  f->p++; /* the closing quote */
  char *s = cph_req_alloc(f->r, raw + 1);
  if (!s)
    return false;
  size_t n = 0;
  if (!escaped) {
    memcpy(s, start, raw);
    n = raw;
  } else {
    for (size_t i = 0; i < raw; i++) {
      if (start[i] != '\\') {
        s[n++] = start[i];
        continue;
      }
      switch (start[++i]) {
      case '"': s[n++] = '"'; break;
      case '\\': s[n++] = '\\'; break;
      case '/': s[n++] = '/'; break;
      case 'b': s[n++] = '\b'; break;
      case 'f': s[n++] = '\f'; break;
      case 'n': s[n++] = '\n'; break;
      case 'r': s[n++] = '\r'; break;
      case 't': s[n++] = '\t'; break;
      default: return false;
      }
    }
  }
  s[n] = '\0';
  if (n > f->max_str)
    return false;
  *out = s;
  return true;
}

/* A key without escapes, matched against the event fields: its index, or -1. */
static int fast_key(fast_in *f) {
  if (!fast_lit(f, '"'))
    return -1;
  const char *start = f->p;
  while (f->p < f->end && *f->p != '"' && *f->p != '\\' && (uint8_t)*f->p >= 0x20)
    f->p++;
  if (f->p >= f->end || *f->p != '"')
    return -1;
  size_t len = (size_t)(f->p - start);
  f->p++;
  if (!fast_lit(f, ':'))
    return -1;
  for (int i = 0; i < F_COUNT; i++)
    if (strlen(FIELD_NAMES[i]) == len && memcmp(FIELD_NAMES[i], start, len) == 0)
      return i;
  return -1;
}

/* JSON null, which the generic path reads as an absent field. */
static bool fast_null(fast_in *f) {
  fast_ws(f);
  if (f->end - f->p >= 4 && memcmp(f->p, "null", 4) == 0) {
    f->p += 4;
    return true;
  }
  return false;
}

/* A JSON integer from 0 to INT64_MAX (no fraction, no exponent, no leading zero). */
static bool fast_i64(fast_in *f, int64_t *out) {
  fast_ws(f);
  const char *start = f->p;
  uint64_t v = 0;
  while (f->p < f->end && *f->p >= '0' && *f->p <= '9') {
    uint64_t d = (uint64_t)(*f->p - '0');
    if (v > ((uint64_t)INT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
    f->p++;
  }
  size_t n = (size_t)(f->p - start);
  if (n == 0 || (n > 1 && *start == '0'))
    return false;
  if (f->p < f->end && (*f->p == '.' || *f->p == 'e' || *f->p == 'E'))
    return false;
  *out = (int64_t)v;
  return true;
}

static bool fast_mentions(fast_in *f, cph_strv *out) {
  if (!fast_lit(f, '['))
    return false;
  size_t n = 0, cap = 0;
  char **items = NULL;
  if (fast_lit(f, ']')) {
    out->items = NULL;
    out->count = 0;
    return true;
  }
  do {
    if (n == cap) {
      cap = cap ? 2 * cap : 4;
      char **grown = cph_req_alloc(f->r, cap * sizeof *grown);
      if (!grown)
        return false;
      if (n)
        memcpy(grown, items, n * sizeof *items);
      items = grown;
    }
    if (!fast_str(f, &items[n++]))
      return false;
  } while (fast_lit(f, ','));
  if (!fast_lit(f, ']'))
    return false;
  out->items = items;
  out->count = n;
  return true;
}

static bool fast_event(fast_in *f, cph_event_in *in) {
  memset(in, 0, sizeof *in);
  if (!fast_lit(f, '{'))
    return false;
  if (fast_lit(f, '}'))
    return true;
  unsigned seen = 0;
  char **strs[F_MENTIONS] = {&in->channel, &in->sender, &in->body,
                             &in->session, &in->kind,   &in->key};
  do {
    int k = fast_key(f);
    if (k < 0 || (seen & (1u << k)))
      return false; /* unknown, or repeated: JSON_REJECT_DUPLICATES answers that */
    seen |= 1u << k;
    if (fast_null(f))
      continue;
    bool ok = k < F_MENTIONS  ? fast_str(f, strs[k])
              : k == F_TS_MS ? fast_i64(f, &in->ts_ms)
                             : fast_mentions(f, &in->mentions);
    if (!ok)
      return false;
  } while (fast_lit(f, ','));
  return fast_lit(f, '}');
}

/* Decodes the request the fast way into *events / *n; false (nothing answered) to leave it
 * to the generic path. */
static bool fast_events(cph_req *r, cph_event_in **events, size_t *n_events) {
  size_t len;
  const char *data = cph_req_raw_json(r, &len);
  if (!data)
    return false;
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  fast_in f = {r, data, data + len, (size_t)p->server.max_string_bytes};
  int64_t max = p->server.max_events_per_request;
  static const char EVENTS_KEY[] = "\"events\"";
  if (!fast_lit(&f, '{'))
    return false;
  fast_ws(&f);
  if ((size_t)(f.end - f.p) < sizeof EVENTS_KEY - 1 ||
      memcmp(f.p, EVENTS_KEY, sizeof EVENTS_KEY - 1) != 0)
    return false;
  f.p += sizeof EVENTS_KEY - 1;
  if (!fast_lit(&f, ':') || !fast_lit(&f, '[') || fast_lit(&f, ']'))
    return false;
  cph_event_in *in = NULL;
  size_t n = 0, cap = 0;
  do {
    if ((int64_t)n >= max)
      return false; /* 413, from the generic path */
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      cph_event_in *grown = cph_req_alloc(r, cap * sizeof *grown);
      if (!grown)
        return false;
      if (n)
        memcpy(grown, in, n * sizeof *in);
      in = grown;
    }
    if (!fast_event(&f, &in[n++]))
      return false;
  } while (fast_lit(&f, ','));
  if (!fast_lit(&f, ']') || !fast_lit(&f, '}'))
    return false;
  fast_ws(&f);
  if (f.p != f.end)
    return false;
  *events = in;
  *n_events = n;
  return true;
}

void cph_route_events_post(cph_req *r) {
  cph_event_in *fast = NULL;
  size_t n_fast = 0;
  if (fast_events(r, &fast, &n_fast) && !r->error.set) {
    if (r->srv->cflow) { /* cluster mode: through the log, on any node */
      cph_cflow_ingest(r, fast, n_fast);
      return;
    }
    if (!cph_cluster_gate_events(r, fast, n_fast))
      return;
    r->op.u.ingest.events = fast;
    r->op.u.ingest.n_events = n_fast;
    cph_req_submit(r, CPH_OP_INGEST, ingest_done);
    return;
  }
  if (r->error.set || !cph_req_decode_body(r)) {
    cph_reply_failure(r);
    return;
  }
  const cph_policy *p = cph_engine_policy(r->srv->engine);
  json_t *events = NULL;
  if (!cph_in_arr(r, r->body, "", "events", CPH_IN_REQUIRED, &events)) {
    cph_reply_failure(r);
    return;
  }
  size_t n = json_array_size(events);
  if ((int64_t)n > p->server.max_events_per_request) {
    cph_reply_error(r, 413, "too_large", "events",
                    "%zu events in one request; :max-events-per-request is %" PRId64, n,
                    p->server.max_events_per_request);
    return;
  }
  if (n == 0) {
    results_reply(r, NULL, 0);
    return;
  }
  cph_event_in *in = cph_req_alloc(r, n * sizeof *in);
  if (!in) {
    cph_reply_failure(r);
    return;
  }
  for (size_t i = 0; i < n && !r->error.set; i++) {
    char path[32];
    snprintf(path, sizeof path, "events[%zu]", i);
    json_t *ev = json_array_get(events, i);
    if (!json_is_object(ev)) {
      cph_req_fail(r, 400, "bad_request", path, "%s must be an object", path);
      break;
    }
    const char *channel = NULL, *sender = NULL, *body = NULL, *session = NULL, *kind = NULL,
               *key = NULL;
    cph_in_str(r, ev, path, "channel", 0, &channel);
    cph_in_str(r, ev, path, "sender", 0, &sender);
    cph_in_str(r, ev, path, "body", 0, &body);
    cph_in_str(r, ev, path, "session", 0, &session);
    cph_in_str(r, ev, path, "kind", 0, &kind);
    cph_in_str(r, ev, path, "key", 0, &key);
    cph_in_strv(r, ev, path, "mentions", 0, &in[i].mentions);
    cph_in_i64(r, ev, path, "ts_ms", 0, 0, INT64_MAX, &in[i].ts_ms);
    /* Inputs borrowed from the decoded body, which outlives the op; the engine only reads. */
    in[i].channel = (char *)channel;
    in[i].sender = (char *)sender;
    in[i].body = (char *)body;
    in[i].session = (char *)session;
    in[i].kind = (char *)kind;
    in[i].key = (char *)key;
  }
  if (r->error.set) {
    cph_reply_failure(r);
    return;
  }
  if (r->srv->cflow) {
    cph_cflow_ingest(r, in, n);
    return;
  }
  if (!cph_cluster_gate_events(r, in, n))
    return;
  r->op.u.ingest.events = in;
  r->op.u.ingest.n_events = n;
  cph_req_submit(r, CPH_OP_INGEST, ingest_done);
}
