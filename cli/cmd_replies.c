/* cephalonctl replies [--after N] [--limit N] [--wait-ms N] [--follow] — the outbound replies
 * stream (GET /v1/replies, DESIGN §9), and the reference for a connector's reading loop.
 *
 * On one node: one read of the stream after N (--wait-ms: a long-poll), or with --follow
 * long-polls from there on, one cursor, until SIGINT or SIGTERM (then exit 0).
 *
 * In cluster mode (GET /v1/cluster answers 200; a single node answers 404) each reply has an
 * `origin`, its identity cluster-wide, "<node>/<id there>/<16 hex>", and a node that takes a
 * dead node's sessions over offers every reply of theirs it lacks again under the same origins
 * (core/replystream.h). So, as the README's "Running a cluster" asks of a connector: every
 * node the cluster lists is read, one cursor each (starting at --after for the nodes listed at
 * start, at 0 for a node that joins later: all of its stream is new to us), and a reply is
 * printed only if it was not delivered already: its origin names a node whose stream we read
 * past its id there (own_* below: a node's stream is read in order), or it is among the
 * origins printed (seen_* below). With --follow each node has a thread of its own (a
 * long-poll on one node must not delay another's replies); the list is read again every
 * DISCOVER_EVERY_MS, from --url or, when that fails, from any node listed; a node that
 * leaves the list stops being polled (its cursor is kept, should it come back), a node that
 * fails is retried with a backoff, its cursor kept. A cursor is for one stream: a node whose
 * answers name another `stream` (started on another data directory, or a copy) is read again
 * from 0 (read_page), in cluster mode too. Without --follow every node is read once
 * and the union printed, deduplicated. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

#define MAX_LIMIT 1000                   /* the API's */
#define FOLLOW_WAIT_MS 25000             /* --follow's default long-poll */
#define MAX_WAIT_MS 3600000
#define DISCOVER_EVERY_MS 5000           /* "every few seconds" (README) */
#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 8000
#define MAX_NODES 64
#define STREAM_ID_MAX 17                 /* a replies stream's identity: 16 hex digits */
/* Origins printed that were read from another node than the one they name, remembered per
 * session (below); those read from the node they name are covered by own_* whatever their
 * number. */
#define KEEP_PER_SESSION 64

static void replies_usage(FILE *out) {
  fprintf(out,
          "usage: cephalonctl replies [--after N] [--limit N] [--wait-ms N] [--follow]\n"
          "  Prints the replies after N (default 0) on the stream connectors deliver from:\n"
          "  a table, or with --json one reply object per line, as the API gives it.\n"
          "  --limit N    at most N per read (up to %d; 0 or none: the daemon's 100)\n"
          "  --wait-ms N  wait up to N ms for a reply when there is none yet (--follow: %d)\n"
          "  --follow     keep reading until Ctrl-C. In a cluster every node is read (one\n"
          "               cursor each, --after for each) and each origin printed once.\n",
          MAX_LIMIT, FOLLOW_WAIT_MS);
}

/* ---------------------------------------------------------------- stopping */

/* Set by SIGINT/SIGTERM, or by a reader that met a failure retrying cannot mend; read by
 * every thread (a lock-free atomic: safe in a signal handler and between threads). */
static atomic_int replies_stop;

static void on_stop_signal(int sig) {
  (void)sig;
  atomic_store(&replies_stop, 1);
}

/* cli_ctx.cancel: a long-poll under way ends within a second of SIGINT/SIGTERM. */
static int stop_requested(void *arg) {
  (void)arg;
  return atomic_load(&replies_stop);
}

/* Sleeps ms, in steps of 100 ms, or less when a stop signal comes. */
static void nap(unsigned ms) {
  for (unsigned slept = 0; slept < ms && !atomic_load(&replies_stop); slept += 100) {
    struct timespec ts = {0, (long)(ms - slept < 100 ? ms - slept : 100) * 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* ---------------------------------------------------------------- read from their node
 *
 * A node's own replies carry origins "<its name>/<its id>/..." and its stream is read in
 * order, one cursor: so once a reply of node N's own with id i was read from N, every own
 * reply of N up to i was (from the cursor we started N at: --after says the earlier ones are
 * had). A reply of N offered again by the node that took its session over is then delivered
 * already when its id there is at most the highest own id read from N — exact, and with one
 * number per node however many replies moved. */

typedef struct own_read {
  char *node;
  uint64_t id; /* the highest id of the node's own replies read from its own stream */
} own_read;

typedef struct own_set {
  own_read *v;
  size_t n, cap;
} own_set;

/* origin "<node>/<digits>/<hex>": the node name's length and the id; false when not so. */
static bool origin_parts(const char *origin, size_t *name_len, uint64_t *id) {
  const char *last = strrchr(origin, '/');
  const char *mid = last;
  while (mid && mid > origin && mid[-1] != '/')
    mid--;
  if (!last || !mid || mid == origin || mid == last)
    return false; /* mid: the id's first digit, after the node's '/' */
  uint64_t v = 0;
  for (const char *c = mid; c < last; c++) {
    if (*c < '0' || *c > '9' || v > (UINT64_MAX - 9) / 10)
      return false;
    v = v * 10 + (uint64_t)(*c - '0');
  }
  *name_len = (size_t)(mid - 1 - origin);
  *id = v;
  return *name_len > 0;
}

static own_read *own_find(own_set *o, const char *node, size_t len) {
  for (size_t i = 0; i < o->n; i++)
    if (strlen(o->v[i].node) == len && memcmp(o->v[i].node, node, len) == 0)
      return &o->v[i];
  return NULL;
}

/* Notes that node's own reply id was read from node; -1 out of memory. */
static int own_note(own_set *o, const char *node, uint64_t id) {
  own_read *r = own_find(o, node, strlen(node));
  if (!r) {
    if (o->n == o->cap) {
      size_t cap = o->cap ? 2 * o->cap : 8;
      own_read *v = realloc(o->v, cap * sizeof *v);
      if (!v)
        return -1;
      o->v = v;
      o->cap = cap;
    }
    if (!(o->v[o->n].node = strdup(node)))
      return -1;
    o->v[o->n].id = 0;
    r = &o->v[o->n++];
  }
  if (id > r->id)
    r->id = id;
  return 0;
}

/* node's stream started over (another data directory): its ids mean new replies now. */
static void own_forget(own_set *o, const char *node) {
  own_read *r = own_find(o, node, strlen(node));
  if (r)
    r->id = 0;
}

static void own_free(own_set *o) {
  for (size_t i = 0; i < o->n; i++)
    free(o->v[i].node);
  free(o->v);
  memset(o, 0, sizeof *o);
}

/* ---------------------------------------------------------------- delivered origins
 *
 * The origins printed that were read from another node than the one they name (or whose node
 * was not known), remembered per session: the newest KEEP_PER_SESSION for each (a ring). Such
 * a reply is offered again only if its session moves again before the node it came from read
 * it back from its own stream. Why per session and not one global bounded set: a session's
 * replies are offered again however many replies other sessions made meanwhile, so a global
 * set of any fixed size could be flushed by busy sessions while a quiet session's replies are
 * still offered again. Cost: up to 64 origins per session seen; a lookup compares at most 64
 * of them. */

typedef struct seen_session {
  char *session;
  char *origin[KEEP_PER_SESSION];
  unsigned next; /* the ring's slot written next (its oldest once full) */
  struct seen_session *chain;
} seen_session;

typedef struct seen_set {
  seen_session **bucket;
  size_t nbucket, count; /* count: sessions */
} seen_set;

static size_t seen_hash(const char *s, size_t nbucket) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return (size_t)(h % nbucket);
}

/* Doubles the buckets once there are more sessions than buckets; 0, or -1 out of memory. */
static int seen_grow(seen_set *set) {
  size_t n = set->nbucket ? set->nbucket * 2 : 256;
  seen_session **b = calloc(n, sizeof *b);
  if (!b)
    return -1;
  for (size_t i = 0; i < set->nbucket; i++)
    for (seen_session *s = set->bucket[i], *next; s; s = next) {
      next = s->chain;
      size_t h = seen_hash(s->session, n);
      s->chain = b[h];
      b[h] = s;
    }
  free(set->bucket);
  set->bucket = b;
  set->nbucket = n;
  return 0;
}

static seen_session *seen_find(const seen_set *set, const char *session) {
  if (!set->nbucket)
    return NULL;
  seen_session *s = set->bucket[seen_hash(session, set->nbucket)];
  while (s && strcmp(s->session, session) != 0)
    s = s->chain;
  return s;
}

/* Whether origin is among those remembered for session. */
static bool seen_has(const seen_set *set, const char *session, const char *origin) {
  const seen_session *s = seen_find(set, session);
  for (unsigned i = 0; s && i < KEEP_PER_SESSION && s->origin[i]; i++)
    if (strcmp(s->origin[i], origin) == 0)
      return true;
  return false;
}

/* 1: origin was not delivered in session and is now remembered; 0: delivered already;
 * -1: out of memory. */
static int seen_add(seen_set *set, const char *session, const char *origin) {
  if (set->count >= set->nbucket && seen_grow(set) != 0)
    return -1;
  size_t h = seen_hash(session, set->nbucket);
  seen_session *s = set->bucket[h];
  while (s && strcmp(s->session, session) != 0)
    s = s->chain;
  if (!s) {
    if (!(s = calloc(1, sizeof *s)) || !(s->session = strdup(session))) {
      free(s);
      return -1;
    }
    s->chain = set->bucket[h];
    set->bucket[h] = s;
    set->count++;
  }
  for (unsigned i = 0; i < KEEP_PER_SESSION && s->origin[i]; i++)
    if (strcmp(s->origin[i], origin) == 0)
      return 0;
  char *copy = strdup(origin);
  if (!copy)
    return -1;
  free(s->origin[s->next]);
  s->origin[s->next] = copy;
  s->next = (s->next + 1) % KEEP_PER_SESSION;
  return 1;
}

static void seen_free(seen_set *set) {
  for (size_t i = 0; i < set->nbucket; i++)
    for (seen_session *s = set->bucket[i], *next; s; s = next) {
      next = s->chain;
      for (unsigned k = 0; k < KEEP_PER_SESSION; k++)
        free(s->origin[k]);
      free(s->session);
      free(s);
    }
  free(set->bucket);
  memset(set, 0, sizeof *set);
}

/* ---------------------------------------------------------------- printing */

/* What every reader prints into; the lock is held around each page, so the lines of two
 * nodes never interleave and the delivered set has one writer at a time. */
typedef struct printer {
  pthread_mutex_t mu;
  bool json, cluster;
  cli_table *table;  /* without --follow: rows gathered, printed aligned at the end */
  bool header_done;  /* with --follow: the header line went out */
  seen_set seen;     /* cluster mode only */
  own_set own;       /* cluster mode only */
  int rc;            /* sticky: CLI_EXIT_FAIL after an allocation or write failed */
} printer;

/* The columns on one node, and in a cluster (where ids are each node's own). */
static const char *const headers[2][4] = {{"ID", "SESSION", "CHANNEL", "BODY"},
                                          {"ORIGIN", "SESSION", "CHANNEL", "BODY"}};

/* A cell with control characters replaced by '?' (cli_put_clean's rule), in b. */
static const char *clean_cell(cph_buf *b, const json_t *v) {
  cph_buf_reset(b);
  cph_buf tmp = CPH_BUF_INIT;
  cli_format_value(&tmp, v);
  for (size_t i = 0; i < tmp.len; i++) {
    unsigned char c = (unsigned char)tmp.data[i];
    cph_buf_putc(b, c < 0x20 || c == 0x7f ? '?' : (char)c);
  }
  cph_buf_free(&tmp);
  return b->failed || !b->data ? "-" : b->data;
}

/* 1: print the reply with this origin, read from node `from` (its name; NULL: not known);
 * 0: delivered already. Caller holds p->mu. */
static int fresh_origin(printer *p, const char *session, const char *origin, const char *from) {
  size_t len = 0;
  uint64_t id = 0;
  bool parsed = origin_parts(origin, &len, &id);
  bool own = parsed && from && strlen(from) == len && memcmp(origin, from, len) == 0;
  if (own) { /* its own stream: every own reply of it up to here is read now */
    if (own_note(&p->own, from, id) != 0)
      return -1;
    /* printed from another node before (its node was down, and is back on its data)? */
    return seen_has(&p->seen, session, origin) ? 0 : 1;
  }
  const own_read *r = parsed ? own_find(&p->own, origin, len) : NULL;
  if (r && id <= r->id)
    return 0; /* read from its own node already */
  return seen_add(&p->seen, session, origin);
}

/* Prints (or, in table mode, gathers) one reply the stream of node `from` gave (its name;
 * NULL: not known); caller holds p->mu. */
static void print_one(printer *p, const json_t *reply, const char *from) {
  const char *origin = cli_json_string(reply, "origin");
  const char *session = cli_json_string(reply, "session");
  if (p->cluster && origin) {
    int fresh = fresh_origin(p, session ? session : "", origin, from);
    if (fresh < 0 && p->rc == CLI_EXIT_OK) {
      fprintf(stderr, "cephalonctl: out of memory\n");
      p->rc = CLI_EXIT_FAIL;
    }
    if (fresh <= 0)
      return;
  }
  if (p->json) {
    char *s = json_dumps(reply, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!s) {
      p->rc = CLI_EXIT_FAIL;
      return;
    }
    puts(s);
    free(s);
    return;
  }
  static const char *const keys[2][4] = {{"id", "session", "channel", "body"},
                                         {"origin", "session", "channel", "body"}};
  cph_buf b[4] = {CPH_BUF_INIT, CPH_BUF_INIT, CPH_BUF_INIT, CPH_BUF_INIT};
  const char *cells[4];
  for (int c = 0; c < 4; c++)
    cells[c] = clean_cell(&b[c], json_object_get(reply, keys[p->cluster][c]));
  if (p->table) {
    cli_table_add(p->table, cells);
  } else {
    /* Streaming rows cannot be aligned to widths not yet seen: two spaces apart. */
    if (!p->header_done)
      printf("%s  %s  %s  %s\n", headers[p->cluster][0], headers[p->cluster][1],
             headers[p->cluster][2], headers[p->cluster][3]);
    p->header_done = true;
    printf("%s  %s  %s  %s\n", cells[0], cells[1], cells[2], cells[3]);
  }
  for (int c = 0; c < 4; c++)
    cph_buf_free(&b[c]);
}

/* ---------------------------------------------------------------- reading a node */

typedef struct read_opts {
  uint64_t wait_ms;
  uint64_t limit; /* 0: the daemon's default */
} read_opts;

/* One GET /v1/replies on url (node `name`; NULL: not known) after *cursor: prints its replies
 * and moves *cursor to its "next". stream (STREAM_ID_MAX bytes, or NULL): the identity of the
 * stream the cursor is for, "" before the first read; an answer of another stream (the daemon
 * there started on another data directory, or a copy: its ids start over) prints nothing,
 * moves the cursor to 0 and takes the new identity, so the next read starts that stream from
 * its beginning. CLI_EXIT_OK, or another code after the problem went to stderr. */
static int read_page(const cli_ctx *ctx, const char *url, const char *name, const read_opts *o,
                     uint64_t *cursor, char *stream, printer *p) {
  cli_ctx node = *ctx;
  node.url = url;
  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/replies");
  cli_query_u64(&path, "after", *cursor);
  cli_query_u64(&path, "wait_ms", o->wait_ms);
  if (o->limit)
    cli_query_u64(&path, "limit", o->limit);
  if (cph_buf_error(&path) != 0) {
    cph_buf_free(&path);
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  cli_reply r;
  int rc = cli_call(&node, "GET", path.data, NULL, (int)o->wait_ms + CLI_TIMEOUT_MS, 0, &r);
  const json_t *list = json_object_get(r.json, "replies");
  const json_t *next = json_object_get(r.json, "next");
  if (rc == CLI_EXIT_OK && (!json_is_array(list) || !json_is_integer(next))) {
    fprintf(stderr, "cephalonctl: GET /v1/replies at %s: unexpected answer (no \"replies\" "
                    "list or \"next\")\n", url);
    rc = CLI_EXIT_FAIL;
  }
  const char *id = rc == CLI_EXIT_OK ? cli_json_string(r.json, "stream") : NULL;
  if (stream && id && stream[0] && strcmp(stream, id) != 0) {
    fprintf(stderr, "cephalonctl: %s: its replies stream is another one now (%.16s, was %s): "
                    "reading it from the start\n", url, id, stream);
    snprintf(stream, STREAM_ID_MAX, "%s", id);
    *cursor = 0;
    if (name) {
      pthread_mutex_lock(&p->mu);
      own_forget(&p->own, name);
      pthread_mutex_unlock(&p->mu);
    }
    cli_reply_free(&r);
    cph_buf_free(&path);
    return CLI_EXIT_OK;
  }
  if (stream && id)
    snprintf(stream, STREAM_ID_MAX, "%s", id);
  if (rc == CLI_EXIT_OK) {
    size_t i;
    const json_t *reply;
    pthread_mutex_lock(&p->mu);
    json_array_foreach(list, i, reply) print_one(p, reply, name);
    if (!p->table && cli_finish_output() != CLI_EXIT_OK)
      p->rc = CLI_EXIT_FAIL;
    rc = p->rc;
    pthread_mutex_unlock(&p->mu);
    /* An empty answer's next is the after it was given: never moves the cursor back. */
    if (json_integer_value(next) > 0 && (uint64_t)json_integer_value(next) > *cursor)
      *cursor = (uint64_t)json_integer_value(next);
  }
  cli_reply_free(&r);
  cph_buf_free(&path);
  return rc;
}

/* ---------------------------------------------------------------- the nodes */

typedef struct node {
  char *url;
  char *name;         /* as GET /v1/cluster lists it; NULL: not known (never changes once set) */
  char stream[STREAM_ID_MAX]; /* the identity of the stream `cursor` is for ("": none yet) */
  uint64_t cursor;    /* this node's stream: the last id read; only its thread moves it */
  atomic_bool listed; /* in the node list last read: polled only while it is */
  pthread_t thread;
  bool started;
  struct follower *f;
} node;

typedef struct follower {
  const cli_ctx *ctx;
  read_opts opts;
  printer *p;
  node nodes[MAX_NODES]; /* fixed addresses: each thread holds its own */
  size_t n;
  atomic_int fatal; /* a reader's CLI_EXIT_FAIL that retrying cannot mend (a write failed) */
} follower;

static void *node_thread(void *arg) {
  node *nd = arg;
  follower *f = nd->f;
  unsigned backoff = 0;
  while (!atomic_load(&replies_stop)) {
    if (!atomic_load(&nd->listed)) {
      nap(200);
      continue;
    }
    int rc = read_page(f->ctx, nd->url, nd->name, &f->opts, &nd->cursor, nd->stream, f->p);
    if (rc == CLI_EXIT_OK) {
      backoff = 0;
      continue;
    }
    if (atomic_load(&replies_stop))
      break;
    pthread_mutex_lock(&f->p->mu);
    bool broken = f->p->rc != CLI_EXIT_OK;
    pthread_mutex_unlock(&f->p->mu);
    if (broken || rc == CLI_EXIT_USAGE) {
      atomic_store(&f->fatal, broken ? CLI_EXIT_FAIL : rc);
      atomic_store(&replies_stop, 1);
      break;
    }
    backoff = backoff ? (backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2)
                      : BACKOFF_MIN_MS;
    fprintf(stderr, "cephalonctl: %s: retrying in %u ms (from after=%llu)\n", nd->url, backoff,
            (unsigned long long)nd->cursor);
    nap(backoff);
  }
  return NULL;
}

/* The index of url's node (named name, NULL: not known), added (listed, its cursor at
 * `after`; with threads, its reader started) unless known; -1 when it cannot be added (full,
 * or out of memory). */
static int follower_add(follower *f, const char *url, const char *name, uint64_t after,
                        bool threads) {
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->nodes[i].url, url) == 0)
      return (int)i;
  if (f->n == MAX_NODES)
    return -1;
  node *nd = &f->nodes[f->n];
  if (!(nd->url = strdup(url)))
    return -1;
  if (name && !(nd->name = strdup(name))) {
    free(nd->url);
    return -1;
  }
  nd->cursor = after;
  nd->f = f;
  atomic_store(&nd->listed, true);
  f->n++;
  if (threads && pthread_create(&nd->thread, NULL, node_thread, nd) == 0)
    nd->started = true;
  return threads && !nd->started ? -1 : (int)(f->n - 1);
}

/* GET /v1/cluster at url. 1: a cluster, its node list applied (the nodes it no longer lists
 * stop being polled, new ones start at `after`); 0: not a cluster (404); -1: failed, said
 * on stderr. */
static int discover(follower *f, const char *url, uint64_t after, bool threads) {
  cli_ctx at = *f->ctx;
  at.url = url;
  cli_reply r;
  int rc = cli_call(&at, "GET", "/v1/cluster", NULL, CLI_TIMEOUT_MS, CLI_CALL_ANY_STATUS, &r);
  int out = -1;
  const json_t *nodes = json_object_get(r.json, "nodes");
  if (rc == CLI_EXIT_OK && r.status == 404) {
    out = 0;
  } else if (rc == CLI_EXIT_OK && (r.status < 200 || r.status >= 300)) {
    cli_print_http_error(&r);
  } else if (rc == CLI_EXIT_OK && !json_is_array(nodes)) {
    fprintf(stderr, "cephalonctl: GET /v1/cluster at %s: unexpected answer (no \"nodes\")\n",
            url);
  } else if (rc == CLI_EXIT_OK) {
    /* the new list applied in one pass at the end: a node listed before and now is never
     * seen unlisted by its reader meanwhile */
    bool listed[MAX_NODES] = {false};
    size_t i;
    const json_t *nd;
    out = 1;
    json_array_foreach(nodes, i, nd) {
      const char *u = cli_json_string(nd, "url");
      const char *name = cli_json_string(nd, "node");
      int k = u && u[0] ? follower_add(f, u, name, after, threads) : -2;
      if (k >= 0)
        listed[k] = true;
      else if (k == -1)
        fprintf(stderr, "cephalonctl: cannot read node %s (more than %d nodes, or out of "
                        "memory)\n", u, MAX_NODES);
    }
    for (size_t n = 0; n < f->n; n++)
      atomic_store(&f->nodes[n].listed, listed[n]);
  }
  cli_reply_free(&r);
  return out;
}

/* Reads the list again, from --url or else from any node known; nodes joined since start
 * read their streams from 0. */
static void rediscover(follower *f) {
  if (discover(f, f->ctx->url, 0, true) == 1)
    return;
  for (size_t i = 0; i < f->n && !atomic_load(&replies_stop); i++)
    if (strcmp(f->nodes[i].url, f->ctx->url) != 0 && discover(f, f->nodes[i].url, 0, true) == 1)
      return;
}

static void follower_free(follower *f) {
  for (size_t i = 0; i < f->n; i++) {
    if (f->nodes[i].started)
      pthread_join(f->nodes[i].thread, NULL);
    free(f->nodes[i].url);
    free(f->nodes[i].name);
  }
}

/* ---------------------------------------------------------------- the command */

/* --follow: every node's reader thread until a stop signal (exit 0) or a failure retrying
 * cannot mend (a bad URL, stdout gone). */
static int follow(follower *f, bool cluster, uint64_t after) {
  if (!cluster && follower_add(f, f->ctx->url, NULL, after, true) < 0) {
    fprintf(stderr, "cephalonctl: cannot start reading (out of memory)\n");
    return CLI_EXIT_FAIL;
  }
  if (cluster)
    for (size_t i = 0; i < f->n; i++)
      if (pthread_create(&f->nodes[i].thread, NULL, node_thread, &f->nodes[i]) == 0)
        f->nodes[i].started = true;
  while (!atomic_load(&replies_stop)) {
    nap(DISCOVER_EVERY_MS);
    if (cluster && !atomic_load(&replies_stop))
      rediscover(f);
  }
  return atomic_load(&f->fatal);
}

int cli_cmd_replies(const cli_ctx *ctx, int argc, char **argv) {
  cli_uint after = {0}, limit = {0}, wait_ms = {0};
  const char *follow_flag = NULL;
  const cli_opt opts[] = {
      {"--after", CLI_OPT_UINT, &after, INT64_MAX},
      {"--limit", CLI_OPT_UINT, &limit, MAX_LIMIT},
      {"--wait-ms", CLI_OPT_UINT, &wait_ms, MAX_WAIT_MS},
  };
  /* --follow takes no value: taken out before the options are parsed. */
  char *rest[64];
  int nrest = 0;
  bool options_done = false;
  for (int i = 1; i < argc; i++) {
    options_done |= strcmp(argv[i], "--") == 0;
    if (!options_done && strncmp(argv[i], "--follow=", 9) == 0) {
      fprintf(stderr, "cephalonctl: --follow takes no value\n");
      replies_usage(stderr);
      return CLI_EXIT_USAGE;
    }
    if (!options_done && strcmp(argv[i], "--follow") == 0) {
      follow_flag = argv[i];
      continue;
    }
    if (nrest == 64) {
      replies_usage(stderr);
      return CLI_EXIT_USAGE;
    }
    rest[nrest++] = argv[i];
  }
  const char *pos[1];
  size_t npos;
  int pr = cli_parse_args(nrest, rest, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
  if (pr == 1) {
    replies_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (pr < 0) {
    replies_usage(stderr);
    return CLI_EXIT_USAGE;
  }

  cli_ctx c = *ctx;
  if (follow_flag) {
    cli_on_stop_signals(on_stop_signal);
    c.cancel = stop_requested;
  }
  printer p = {.json = ctx->json, .rc = CLI_EXIT_OK};
  pthread_mutex_init(&p.mu, NULL);
  cli_table table = {0};
  if (!follow_flag && !ctx->json)
    p.table = &table;
  follower *f = calloc(1, sizeof *f);
  if (!f) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  f->ctx = &c;
  f->p = &p;
  f->opts.limit = limit.value;
  f->opts.wait_ms = wait_ms.set ? wait_ms.value : follow_flag ? FOLLOW_WAIT_MS : 0;

  int rc = CLI_EXIT_OK;
  int cluster = discover(f, c.url, after.value, false);
  if (cluster < 0) {
    rc = CLI_EXIT_FAIL;
  } else {
    p.cluster = cluster == 1;
    if (p.table)
      cli_table_init(p.table, 4, headers[p.cluster], p.cluster ? 0 : 1);
    /* a node still joining may list no node yet: read the one we were given */
    if (p.cluster && f->n == 0 && follower_add(f, c.url, NULL, after.value, false) < 0) {
      fprintf(stderr, "cephalonctl: out of memory\n");
      rc = CLI_EXIT_FAIL;
    } else if (follow_flag) {
      rc = follow(f, p.cluster, after.value);
    } else if (!p.cluster) {
      uint64_t cursor = after.value;
      rc = read_page(&c, c.url, NULL, &f->opts, &cursor, NULL, &p);
    } else {
      /* Every node once; a node that fails is reported and the others still printed. */
      for (size_t i = 0; i < f->n; i++) {
        int r = read_page(&c, f->nodes[i].url, f->nodes[i].name, &f->opts,
                          &f->nodes[i].cursor, f->nodes[i].stream, &p);
        if (r != CLI_EXIT_OK)
          rc = r;
      }
    }
  }
  follower_free(f);
  free(f);
  if (p.table && p.table->headers && (rc == CLI_EXIT_OK || p.table->rows > 0)) {
    int r = cli_table_print(p.table, stdout);
    if (r == CLI_EXIT_OK)
      r = cli_finish_output();
    if (rc == CLI_EXIT_OK)
      rc = r;
  }
  cli_table_free(&table);
  seen_free(&p.seen);
  own_free(&p.own);
  pthread_mutex_destroy(&p.mu);
  return rc;
}
