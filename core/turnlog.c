/* Kept turn contexts and the context diff (contract in turnlog.h). */
#include "turnlog.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "pact.h"
#include "turnwarm.h"

#define PREVIEW_MAX 160
#define N_TOKENS 10

/* Node flags (cph_turnctx_rec.node_flags). */
#define NODE_WAITING 1u
#define NODE_STAGE(f) ((uint32_t)(((f) >> 8) & 0xff))
#define NODE_STAGES(f) ((uint32_t)(((f) >> 16) & 0xff))

/* ---------------------------------------------------------------- helpers */

static cph_key turn_key(const char *session, uint64_t turn) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_u64(&k, turn);
  return k;
}

/* ---- Keys of "turn_kept" (schema 6)
 * A session's kept turns and their rows live in one B-tree, under the session's id:
 *   session\0 'k' be64(turn)       its record (cph_turnctx_rec)
 *   session\0 'k' be64(turn) 'f'   its refs entry: the rows it names (rows_keep)
 *   session\0 'r' be64(row)        a row: a kept message or node (Row names, below)
 * Why one tree and not three (schema 5 had turn_contexts, turn_row_refs and turn_rows): every
 * lease puts a record, a refs entry and a few rows and its trim deletes as many, and each
 * B-tree a pass touches has its whole root-to-leaf path written again. In one tree the three
 * share their upper pages, and a turn's record and refs entry share a leaf — fewer pages a
 * cycle (bench/PROFILE.md, "One tree for kept contexts"). */
#define KEPT_TURN 'k'
#define KEPT_ROW 'r'
#define KEPT_REFS 'f'

/* session\0 tag be64(x) */
static cph_key tagged_key(const char *session, uint8_t tag, uint64_t x) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, session);
  cph_key_byte(&k, tag);
  cph_key_u64(&k, x);
  return k;
}

static cph_key kept_key(const char *session, uint64_t turn) {
  return tagged_key(session, KEPT_TURN, turn);
}

static cph_key refs_key(const char *session, uint64_t turn) {
  cph_key k = kept_key(session, turn);
  cph_key_byte(&k, KEPT_REFS);
  return k;
}

static cph_key row_key(const char *session, uint64_t row) {
  return tagged_key(session, KEPT_ROW, row);
}

/* Whether k (of "turn_kept") is a record key of the session whose prefix (id and NUL) is
 * prefix[0..n); its turn into *turn. */
static bool is_kept_record(const cph_val *k, const uint8_t *prefix, size_t n, uint64_t *turn) {
  const uint8_t *d = k->data;
  if (k->len != n + 9 || memcmp(d, prefix, n) != 0 || d[n] != KEPT_TURN)
    return false;
  *turn = cph_be64_get(d + n + 1);
  return true;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  int n = vsnprintf(NULL, 0, f, ap);
  va_end(ap);
  char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (s) {
    va_start(ap, f);
    vsnprintf(s, (size_t)n + 1, f, ap);
    va_end(ap);
  }
  return s;
}

static char *dup_opt(const char *s) { return s ? strdup(s) : NULL; }

/* The length of s's first PREVIEW_MAX bytes, cut on a UTF-8 boundary. */
static size_t preview_len(const char *s) {
  size_t n = s ? strnlen(s, PREVIEW_MAX + 1) : 0; /* no need to measure past the cut */
  if (n > PREVIEW_MAX) {
    n = PREVIEW_MAX;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
      n--;
  }
  return n;
}

/* A copy of s's preview (preview_len). */
static char *preview(const char *s) {
  size_t n = preview_len(s);
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s ? s : "", n);
    p[n] = '\0';
  }
  return p;
}

/* The depth of a coordinate "d1, 0, 0" (0 when it cannot be read). */
static long coord_depth(const char *at) {
  return at && at[0] == 'd' ? strtol(at + 1, NULL, 10) : 0;
}

static bool ids_has(const uint64_t *ids, size_t n, uint64_t id) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == id)
      return true;
  return false;
}

static bool strs_has(char *const *v, size_t n, const char *s) {
  for (size_t i = 0; s && i < n; i++)
    if (strcmp(v[i], s) == 0)
      return true;
  return false;
}

/* ---------------------------------------------------------------- texts by hash
 *
 * Most of a kept context's bytes are its messages' and node previews' texts, and consecutive
 * turns of a session show nearly the same ones. So a record (version 2) holds each text's
 * hash (msg_hashes, node_preview_hashes; msg_contents and node_previews stay empty) and the
 * texts are kept once per session:
 *   "turn_texts"      session\0 u64 hash -> the text's bytes
 *   "turn_text_refs"  session\0 u64 turn -> the turn's distinct hashes, 8 bytes
 *                                            each, big-endian
 * Invariant: every hash named by a refs entry has its text. Keeping turn T puts the texts
 * whose hashes the newest kept turn's refs do not name (those it names exist) — on most
 * leases the one or two new messages, not the window. Trimming deletes a text only when no
 * remaining turn names it. A version-1 record holds its texts and reads as before.
 * The hash is not cryptographic: a collision within one session would show one text for
 * another in the explorer (nothing else reads these texts). */

static uint64_t text_hash(const char *s, size_t n) {
  const uint64_t m = 0xc2b2ae3d27d4eb4full;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * m;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  memcpy(&w, s + i, n - i);
  h = (h ^ w) * m;
  h ^= h >> 32;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

/* The texts of the turn being kept: messages borrowed from the turn, previews owned. */
typedef struct text {
  uint64_t hash;
  const char *s;
  size_t len;
} text;

typedef struct texts {
  text *v;
  size_t n, cap;
  char **owned; /* the previews */
  size_t n_owned;
  char (*at)[48]; /* version 2: the nodes' coordinates, formatted (the record borrows them) */
  bool no_hash;   /* version 3: rows name the texts (texts_add is not called), the record's
                  * node arrays stay empty (the rows read the tree) and the previews are not
                  * copied: pv_len[i] is node i's (its content's first bytes) */
  size_t *pv_len;
  size_t n_pv;
} texts;

static int texts_add(texts *tx, const char *s, uint64_t *hash_out) {
  if (tx->n == tx->cap) {
    size_t cap = tx->cap ? 2 * tx->cap : 64;
    text *p = realloc(tx->v, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    tx->v = p;
    tx->cap = cap;
  }
  size_t len = strlen(s);
  *hash_out = text_hash(s, len);
  tx->v[tx->n++] = (text){*hash_out, s, len};
  return CPH_OK;
}

static void texts_free(texts *tx) {
  for (size_t i = 0; i < tx->n_owned; i++)
    free(tx->owned[i]);
  free(tx->owned);
  free(tx->pv_len);
  free(tx->v);
  free(tx->at);
}

/* A refs value: n hashes, big-endian. Read in place (it may be unaligned). */
static uint64_t ref_at(const cph_val *v, size_t i) {
  return cph_be64_get((const uint8_t *)v->data + 8 * i);
}

static cph_key text_key(const char *session, uint64_t hash) { return turn_key(session, hash); }

/* A set of hashes (open addressing; the hashes are already well mixed, so their low bits
 * index it), with a mark per member. A turn has a few hundred texts: no sort, O(n). */
typedef struct hset {
  uint64_t *slot; /* 0 = empty; the hash 0 is kept in zero/zero_mark */
  bool *mark;
  size_t mask;
  bool zero, zero_mark;
} hset;

static int hset_init(hset *h, size_t n) {
  size_t cap = 16;
  while (cap < 2 * n)
    cap *= 2;
  *h = (hset){calloc(cap, sizeof *h->slot), calloc(cap, sizeof *h->mark), cap - 1, false, false};
  return h->slot && h->mark ? CPH_OK : CPH_ENOMEM;
}

static void hset_free(hset *h) {
  free(h->slot);
  free(h->mark);
}

/* The member's index, or where it would go; SIZE_MAX for the hash 0. */
static size_t hset_find(const hset *h, uint64_t x) {
  if (!x)
    return SIZE_MAX;
  size_t i = x & h->mask;
  while (h->slot[i] && h->slot[i] != x)
    i = (i + 1) & h->mask;
  return i;
}

/* Adds x; false if it was a member already. Room was sized by hset_init. */
static bool hset_add(hset *h, uint64_t x) {
  size_t i = hset_find(h, x);
  bool *in = i == SIZE_MAX ? &h->zero : NULL;
  if (in) {
    bool was = *in;
    *in = true;
    return !was;
  }
  if (h->slot[i])
    return false;
  h->slot[i] = x;
  return true;
}

static bool hset_has(const hset *h, uint64_t x) {
  size_t i = hset_find(h, x);
  return i == SIZE_MAX ? h->zero : h->slot[i] != 0;
}

/* Marks member x; true if it was a member and not yet marked. */
static bool hset_mark(hset *h, uint64_t x) {
  size_t i = hset_find(h, x);
  bool *m = i == SIZE_MAX ? (h->zero ? &h->zero_mark : NULL) : h->slot[i] ? &h->mark[i] : NULL;
  if (!m || *m)
    return false;
  *m = true;
  return true;
}

static bool hset_marked(const hset *h, uint64_t x) {
  size_t i = hset_find(h, x);
  return i == SIZE_MAX ? h->zero_mark : h->mark[i];
}

/* Keeps turn's texts: dedupes tx by hash, puts the texts the session's newest refs entry does
 * not name, and puts the turn's refs entry. */
static int texts_keep(cph_txn *t, const char *session, uint64_t turn, texts *tx) {
  hset mine, newest_set = {0};
  int rc = hset_init(&mine, tx->n);
  size_t n = 0;
  for (size_t i = 0; rc == CPH_OK && i < tx->n; i++)
    if (hset_add(&mine, tx->v[i].hash))
      tx->v[n++] = tx->v[i];
  tx->n = n;
  hset_free(&mine);
  if (rc)
    return rc;
  /* the session's newest refs entry: the last key with its prefix */
  cph_cursor cur;
  if ((rc = cph_cursor_open(t, CPH_DB_TURN_TEXT_REFS, &cur)) != CPH_OK)
    return rc;
  cph_key start = turn_key(session, 0), past = turn_key(session, UINT64_MAX);
  size_t prefix = strlen(session) + 1;
  cph_val k, newest = {0};
  rc = cph_cursor_seek(&cur, &past, &k, NULL); /* no turn id is UINT64_MAX */
  if (rc == CPH_OK || rc == CPH_ENOTFOUND)
    rc = cph_cursor_prev(&cur, &k, &newest);
  bool have = rc == CPH_OK && k.len == prefix + 8 && memcmp(k.data, start.data, prefix) == 0;
  if (rc == CPH_OK || rc == CPH_ENOTFOUND)
    rc = hset_init(&newest_set, have ? newest.len / 8 : 0);
  for (size_t i = 0; rc == CPH_OK && have && i < newest.len / 8; i++)
    hset_add(&newest_set, ref_at(&newest, i));
  cph_cursor_close(&cur); /* newest is not read past here: the puts may move its page */
  uint8_t *refs = rc == CPH_OK ? malloc(n ? 8 * n : 1) : NULL;
  if (rc == CPH_OK && !refs)
    rc = CPH_ENOMEM;
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    cph_be64_put(refs + 8 * i, tx->v[i].hash);
    if (!hset_has(&newest_set, tx->v[i].hash)) {
      cph_key tk = text_key(session, tx->v[i].hash);
      rc = cph_txn_put(t, CPH_DB_TURN_TEXTS, &tk, tx->v[i].s, tx->v[i].len);
    }
  }
  if (rc == CPH_OK) {
    cph_key rk = turn_key(session, turn);
    rc = cph_txn_put(t, CPH_DB_TURN_TEXT_REFS, &rk, refs, 8 * n);
  }
  hset_free(&newest_set);
  free(refs);
  return rc;
}

/* Turns gone[0..n) were deleted: deletes their refs entries and the texts that only they
 * named. The remaining refs entries are walked oldest first, and the walk stops once each
 * candidate is found named (most are, by the oldest remaining turn). */
static int texts_trim(cph_txn *t, const char *session, const uint64_t *gone, size_t n_gone) {
  size_t prefix = strlen(session) + 1;
  uint64_t *dead = NULL;
  size_t n_dead = 0, cap_dead = 0;
  int rc = CPH_OK;
  for (size_t g = 0; g < n_gone && rc == CPH_OK; g++) {
    cph_key rk = turn_key(session, gone[g]);
    cph_val v;
    rc = cph_txn_get(t, CPH_DB_TURN_TEXT_REFS, &rk, &v);
    if (rc == CPH_ENOTFOUND) { /* a version-1 record: its texts were its own */
      rc = CPH_OK;
      continue;
    }
    size_t n = rc == CPH_OK ? v.len / 8 : 0;
    if (n_dead + n > cap_dead) {
      size_t cap = 2 * (n_dead + n);
      uint64_t *p = realloc(dead, cap * sizeof *p);
      if (!p) {
        rc = CPH_ENOMEM;
        break;
      }
      dead = p;
      cap_dead = cap;
    }
    for (size_t i = 0; i < n; i++)
      dead[n_dead++] = ref_at(&v, i);
    if (rc == CPH_OK)
      rc = cph_txn_del(t, CPH_DB_TURN_TEXT_REFS, &rk);
  }
  hset cand = {0};
  size_t unmarked = 0;
  if (rc == CPH_OK && n_dead && (rc = hset_init(&cand, n_dead)) == CPH_OK)
    for (size_t i = 0; i < n_dead; i++)
      unmarked += hset_add(&cand, dead[i]);
  /* What a remaining refs entry names stays (marked). Values are read in place: nothing is
   * written until the walk is over. */
  cph_cursor cur;
  if (rc == CPH_OK && unmarked && (rc = cph_cursor_open(t, CPH_DB_TURN_TEXT_REFS, &cur)) == 0) {
    cph_key start = turn_key(session, 0);
    cph_val k, v;
    for (rc = cph_cursor_seek(&cur, &start, &k, &v); rc == CPH_OK && unmarked;
         rc = cph_cursor_next(&cur, &k, &v)) {
      if (k.len != prefix + 8 || memcmp(k.data, start.data, prefix) != 0)
        break;
      for (size_t i = 0; i < v.len / 8 && unmarked; i++)
        unmarked -= hset_mark(&cand, ref_at(&v, i));
    }
    cph_cursor_close(&cur);
    if (rc == CPH_ENOTFOUND)
      rc = CPH_OK;
  }
  for (size_t i = 0; i < n_dead && rc == CPH_OK; i++) {
    if (hset_marked(&cand, dead[i]) || !hset_mark(&cand, dead[i]))
      continue; /* named by a remaining turn, or deleted already (named twice) */
    cph_key tk = text_key(session, dead[i]);
    rc = cph_txn_del(t, CPH_DB_TURN_TEXTS, &tk);
  }
  hset_free(&cand);
  free(dead);
  return rc;
}

/* ---------------------------------------------------------------- rows (version 3)
 *
 * Version 2 still wrote every message's and node's coordinate, role and hashes on every lease
 * (a few hundred of each), and the texts' refs. A version-3 record keeps no message or node
 * itself (its arrays from msg_roles on are empty, `rows` is set): each is a row, kept once
 * per session, in "turn_kept" (Keys, above),
 *   session\0 'r' u64 row name -> the row (layout below)
 * and named in order by the turn's refs entry, with its depth beside it:
 *   session\0 'k' u64 turn 'f' -> be64 prev, be64 n_added, be64 n, be32 messages,
 *                                 be32 nodes, then the turn's n distinct rows (be64
 *                                 each, the n_added it added first), then per
 *                                 message and per node in order: be32 its index
 *                                 among the distinct rows, be32 its depth
 * where prev is the session's newest kept turn when this one was kept (0: none), and a row is
 * added when that turn did not name it. A row holds everything but the depth, so a message or
 * node that only moved (the history shifting by the turn's new messages, the ODI shift) is the
 * row the previous kept turn named: a lease puts the rows that are new since that turn (on
 * most leases the turn's new messages and its new cores) and a refs entry of raw hashes and
 * indexes, instead of encoding every text and coordinate again.
 * Invariant: every row a kept record names is held, and only those. Keeping and trimming go
 * through the session's warm state (core/turnwarm.h, rebuilt from the refs entries when it is
 * missing or stale): a message or node equal, field by field, to one at its place in the
 * previous kept turn has that one's row, so only the new ones are hashed; the rows added are
 * those whose newest naming turn is not the previous one; and trimming turn T deletes the rows
 * T named that the turn after it did not and that no later turn named again (T's dies list, the
 * rows' last naming turn) — no refs entry read. An older-version record has no refs entry and
 * names no row.
 *
 * Row layout (integers big-endian):
 *   message: 'm' (the depth goes before the coordinate's first ',') or 'M' (the coordinate
 *            is stored whole: it is not "d<depth>,..." as cph_coord_format writes it), be64
 *            node, be32 n + the role, be32 n + the coordinate without its depth ("d, 0, 0"),
 *            then the content (the rest of the value);
 *   node:    'n', be64 id, be32 position, be32 offset, be64 ttl, be64 cadence, be64 created,
 *            be64 flags, be64 content hash, be32 n + the role, then the preview (the rest).
 * The row hash is lanes_hash of the text seeded with lanes_hash of the row before its text
 * (ROW_SEED): the text is hashed where it lies, and copied only into a new row. */

/* Test knobs (turnlog.h): write version-2 records; the warm states' bound (-1: the default). */
static bool write_v2;
void turnlog_test_write_v2(bool on) { write_v2 = on; }
static long long test_warm_bytes = -1;
void turnlog_test_warm_bytes(long long bytes) { test_warm_bytes = bytes; }

/* A row's hash: two lanes of 8 bytes each per step (half text_hash's steps; rows are hashed
 * on every lease, texts only when version-2 records are written). Not cryptographic, as
 * text_hash: a collision within a session would show one row for another in the explorer. */
static uint64_t lanes_hash(const void *data, size_t n, uint64_t seed) {
  const char *s = data;
  uint64_t a = seed ^ (n * 0xff51afd7ed558ccdull), b = 0xc2b2ae3d27d4eb4full ^ n;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t x, y;
    memcpy(&x, s + i, 8);
    memcpy(&y, s + i + 8, 8);
    a = (a ^ x) * 0x9e3779b97f4a7c15ull;
    b = (b ^ y) * 0xc4ceb9fe1a85ec53ull;
    a ^= a >> 31;
    b ^= b >> 29;
  }
  uint64_t x = 0, y = 0;
  size_t rest = n - i;
  memcpy(&x, s + i, rest < 8 ? rest : 8);
  if (rest > 8)
    memcpy(&y, s + i + 8, rest - 8);
  a = (a ^ x) * 0x9e3779b97f4a7c15ull;
  b = (b ^ y) * 0xc4ceb9fe1a85ec53ull;
  uint64_t h = a ^ (b >> 32 | b << 32);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

/* The depth of a coordinate as cph_coord_format writes it ("d-1, 0, 0", "d12, 1, 0"), with
 * where its digits end; false for any other text (leading zeros, "-0", no digits). */
static bool coord_split(const char *at, int32_t *depth, size_t *end) {
  if (at[0] != 'd')
    return false;
  size_t i = 1;
  bool neg = at[i] == '-';
  i += neg;
  size_t d0 = i;
  int64_t v = 0;
  while (at[i] >= '0' && at[i] <= '9' && i - d0 < 10)
    v = v * 10 + (at[i++] - '0');
  size_t nd = i - d0;
  if (nd == 0 || at[i] != ',' || (at[d0] == '0' && (nd > 1 || neg)) || v > INT32_MAX)
    return false;
  *depth = (int32_t)(neg ? -v : v);
  *end = i;
  return true;
}

/* Where the depth's digits end in a coordinate cph_coord_format wrote from that depth
 * ("d12, 0, 0": 3): 'd', a '-' for a negative, the digits (counted by comparison: a lease's
 * depths have one to three, and a division loop cost what the strchr did). */
static size_t depth_end(int32_t depth) {
  uint64_t v = depth < 0 ? 0u - (uint64_t)(int64_t)depth : (uint64_t)depth;
  size_t end = 2 + (depth < 0); /* 'd', '-', the first digit */
  for (uint64_t p = 10; v >= p; p *= 10)
    end++;
  return end;
}

#ifndef NDEBUG
/* Debug builds: what context assembly measured of a message is what its strings say. */
static bool measured_as_written(const cph_message *m, const char *coord, size_t end,
                                const char *content, size_t content_len) {
  int32_t depth;
  size_t e;
  return coord_split(coord, &depth, &e) && depth == m->depth && e == end &&
         content_len == strlen(content) && m->coord_len == strlen(coord);
}
#endif

/* A message's row head (everything but the content) into b; its depth into *depth. */
static void msg_row_head(cph_buf *b, const char *role, const char *coord, uint64_t node,
                         int32_t *depth) {
  size_t end = 0;
  bool split = coord_split(coord, depth, &end);
  if (!split)
    *depth = 0;
  size_t nr = strlen(role), nc = split ? strlen(coord + end) : 0;
  uint8_t h[128]; /* the usual head, written at once */
  if (split && 1 + 8 + 4 + nr + 4 + 1 + nc <= sizeof h) {
    uint8_t *p = h;
    *p++ = 'm';
    cph_be64_put(p, node);
    cph_be32_put(p + 8, (uint32_t)nr);
    memcpy(p + 12, role, nr);
    p += 12 + nr;
    cph_be32_put(p, (uint32_t)(nc + 1));
    p[4] = 'd';
    memcpy(p + 5, coord + end, nc);
    cph_buf_append(b, h, (size_t)(p + 5 + nc - h));
    return;
  }
  cph_buf_putc(b, split ? 'm' : 'M');
  cph_buf_put_be64(b, node);
  cph_buf_put_str32(b, role);
  if (split) {
    size_t n = strlen(coord + end);
    cph_buf_put_be32(b, (uint32_t)(n + 1));
    cph_buf_putc(b, 'd');
    cph_buf_append(b, coord + end, n);
  } else {
    cph_buf_put_str32(b, coord);
  }
}

/* Where a node row's content hash lies (node_row_head). */
#define NODE_ROW_CHASH 49

/* The flags a node is kept with (cph_turnctx_rec.node_flags). */
static uint64_t node_flags(const cph_pact_node *nd) {
  return (nd->waiting ? NODE_WAITING : 0) | (uint64_t)(nd->stage & 0xff) << 8 |
         (uint64_t)(nd->n_lifecycle & 0xff) << 16;
}

/* nd's row head (everything but the preview) into b, chash its content's text_hash. */
static void node_row_head(cph_buf *b, const cph_pact_node *nd, uint64_t chash) {
  uint8_t h[NODE_ROW_CHASH + 8 + 4];
  h[0] = 'n';
  cph_be64_put(h + 1, nd->id);
  cph_be32_put(h + 9, (uint32_t)nd->at.position);
  cph_be32_put(h + 13, (uint32_t)nd->at.offset);
  cph_be64_put(h + 17, (uint64_t)(int64_t)nd->ttl);
  cph_be64_put(h + 25, (uint64_t)(int64_t)nd->cadence);
  cph_be64_put(h + 33, nd->created_at_episode);
  cph_be64_put(h + 41, node_flags(nd));
  cph_be64_put(h + NODE_ROW_CHASH, chash);
  const char *role = nd->role ? nd->role : "";
  size_t nr = strlen(role);
  cph_be32_put(h + NODE_ROW_CHASH + 8, (uint32_t)nr);
  cph_buf_append(b, h, sizeof h);
  cph_buf_append(b, role, nr);
}

#define REFS_HEAD 32 /* be64 prev, be64 n_added, be64 n_distinct, be32 messages, be32 nodes */

/* A refs entry's value: its predecessor, how many rows it added, how many it names. */
static bool refs_parse(const cph_val *v, uint64_t *prev, size_t *n_added, size_t *n) {
  if (v->len < REFS_HEAD)
    return false;
  const uint8_t *p = v->data;
  *prev = cph_be64_get(p);
  uint64_t added = cph_be64_get(p + 8), distinct = cph_be64_get(p + 16);
  uint64_t ordered = (uint64_t)cph_be32_get(p + 24) + cph_be32_get(p + 28);
  if (added > distinct || distinct > v->len / 8 || v->len != REFS_HEAD + 8 * distinct + 8 * ordered)
    return false;
  *n_added = (size_t)added;
  *n = (size_t)distinct;
  return true;
}

/* Distinct row i of a refs entry's value, read in place. */
static uint64_t refs_row(const cph_val *v, size_t i) {
  return cph_be64_get((const uint8_t *)v->data + REFS_HEAD + 8 * i);
}

/* A version-3 turn's messages and nodes as rows, in order, each with its depth (the refs
 * entry's ordered part; nothing of it is in the record). */
typedef struct rowlist {
  uint64_t *msg_rows, *node_rows;
  int32_t *msg_depths, *node_depths;
  uint32_t n_msg_rows, n_node_rows;
} rowlist;

static void rowlist_free(rowlist *l) {
  free(l->msg_rows);
  free(l->node_rows);
  free(l->msg_depths);
  free(l->node_depths);
}

/* Deletes every key of db with the session's prefix (its id and NUL). */
static int delete_prefixed(cph_txn *t, cph_db db, const char *session) {
  cph_key start;
  cph_key_reset(&start);
  cph_key_str(&start, session);
  size_t prefix = start.len;
  cph_cursor cur;
  int rc = cph_cursor_open(t, db, &cur);
  if (rc)
    return rc;
  cph_val k;
  for (;;) {
    rc = cph_cursor_seek(&cur, &start, &k, NULL);
    if (rc != CPH_OK || k.len < prefix || memcmp(k.data, start.data, prefix) != 0)
      break;
    if ((rc = cph_cursor_del(&cur)) != CPH_OK)
      break;
  }
  cph_cursor_close(&cur);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* The session's newest max kept turns, newest first, into ids[0..*n). */
static int newest_kepts(cph_txn *t, const char *session, size_t max, uint64_t *ids, size_t *n) {
  *n = 0;
  cph_cursor cur;
  int rc = cph_cursor_open(t, CPH_DB_TURN_KEPT, &cur);
  if (rc)
    return rc;
  /* records and refs entries alternate from the newest down: skip the refs */
  cph_key start = kept_key(session, 0), past = kept_key(session, UINT64_MAX);
  size_t prefix = strlen(session) + 1;
  cph_val k;
  rc = cph_cursor_seek(&cur, &past, &k, NULL); /* no turn id is UINT64_MAX */
  while ((rc == CPH_OK || rc == CPH_ENOTFOUND) && *n < max) {
    rc = cph_cursor_prev(&cur, &k, NULL);
    if (rc != CPH_OK || k.len < prefix + 9 || memcmp(k.data, start.data, prefix + 1) != 0)
      break;
    uint64_t turn;
    if (is_kept_record(&k, start.data, prefix, &turn))
      ids[(*n)++] = turn;
  }
  cph_cursor_close(&cur);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* The session's newest kept turn (0: none). */
static int newest_kept(cph_txn *t, const char *session, uint64_t *turn) {
  size_t n;
  *turn = 0;
  return newest_kepts(t, session, 1, turn, &n);
}

/* ---- Writes worked out before they are made
 * Keeping puts into and deletes from "turn_kept" only. It records them first, in order, in
 * one buffer — per write a tag ('p' a put; 'd' a delete of a key that must be there, 'g' of
 * one that may be gone already), be32 the key's length, the key, and for a put be32 the
 * value's length and the value — so that a deferred job (turnlog.h) can work them out on
 * another thread and the loop make them later; keeping inline makes them at once. */
typedef struct kept_writes {
  cph_buf b; /* a failure to grow sticks: kw_apply answers CPH_ENOMEM */
} kept_writes;

static void kw_head(kept_writes *kw, char tag, const cph_key *k) {
  uint8_t h[5];
  h[0] = (uint8_t)tag;
  cph_be32_put(h + 1, (uint32_t)k->len);
  cph_buf_append(&kw->b, h, sizeof h);
  cph_buf_append(&kw->b, k->data, k->len);
}

static void kw_put(kept_writes *kw, const cph_key *k, const void *v, size_t n) {
  uint8_t l[4];
  kw_head(kw, 'p', k);
  cph_be32_put(l, (uint32_t)n);
  cph_buf_append(&kw->b, l, sizeof l);
  cph_buf_append(&kw->b, v, n);
}

/* A put of rec, encoded as cph_txn_put_record would. */
static void kw_put_record(kept_writes *kw, const cph_key *k, const cph_record_desc *d,
                          const void *rec) {
  uint8_t l[4] = {0};
  kw_head(kw, 'p', k);
  cph_buf_append(&kw->b, l, sizeof l); /* the length, once known */
  if (cph_buf_error(&kw->b) != CPH_OK)
    return;
  size_t at = kw->b.len, room = kw->b.cap - at - 1; /* the NUL stays */
  size_t n = cph_record_encode_to(d, rec, kw->b.data + at, room);
  if (n > room) { /* encoded again into room enough */
    if (!cph_buf_grow(&kw->b, n))
      return;
    cph_record_encode_to(d, rec, kw->b.data + at, n);
  }
  cph_be32_put((uint8_t *)kw->b.data + at - 4, (uint32_t)n);
  kw->b.len = at + n;
  kw->b.data[kw->b.len] = '\0';
}

static void kw_del(kept_writes *kw, const cph_key *k, bool may_be_gone) {
  kw_head(kw, may_be_gone ? 'g' : 'd', k);
}

/* Makes kw's writes through t, in order: CPH_OK, or the first failure (t's sticky error, or
 * CPH_ENOTFOUND for a 'd' whose key was not there). */
static int kw_apply(const kept_writes *kw, cph_txn *t) {
  if (cph_buf_error(&kw->b) != CPH_OK)
    return cph_err_set(&t->err, CPH_ENOMEM, "out of memory keeping a turn's context");
  if (kw->b.len == 0) /* nothing to write, and maybe no buffer: no arithmetic on NULL */
    return CPH_OK;
  const uint8_t *p = (const uint8_t *)kw->b.data, *end = p + kw->b.len;
  int rc = CPH_OK;
  while (rc == CPH_OK && p < end) {
    char tag = (char)p[0];
    cph_key k;
    cph_key_reset(&k);
    k.len = cph_be32_get(p + 1);
    memcpy(k.data, p + 5, k.len);
    p += 5 + k.len;
    if (tag == 'p') {
      uint32_t n = cph_be32_get(p);
      rc = cph_txn_put(t, CPH_DB_TURN_KEPT, &k, p + 4, n);
      p += 4 + n;
    } else {
      rc = cph_txn_del(t, CPH_DB_TURN_KEPT, &k);
      if (rc == CPH_ENOTFOUND && tag == 'g')
        rc = CPH_OK;
    }
  }
  return rc;
}

/* ptr reallocated to n elements; ok cleared (and ptr unchanged) without memory. */
#define REGROW(ptr, n, ok)                                                                     \
  do {                                                                                         \
    void *q_ = realloc((ptr), (n) * sizeof *(ptr));                                            \
    if (q_)                                                                                    \
      (ptr) = q_;                                                                              \
    else                                                                                       \
      (ok) = false;                                                                            \
  } while (0)

/* Room for n rows of the turn being kept in sc's arrays. */
static int scratch_reserve(turnlog_scratch *sc, size_t n) {
  if (n <= sc->cap)
    return CPH_OK;
  size_t cap = 2 * n;
  bool ok = true;
  REGROW(sc->rows, cap, ok);
  REGROW(sc->dist, cap, ok);
  REGROW(sc->chash, cap, ok);
  REGROW(sc->depth, cap, ok);
  REGROW(sc->code, cap, ok);
  if (!ok)
    return CPH_ENOMEM;
  sc->cap = cap;
  return CPH_OK;
}

/* The session's warm state (core/turnwarm.h) as the store holds it: the one held when its
 * newest turn is the store's newest kept turn, else one rebuilt from the kept turns' refs
 * entries (each turn's rows set as its rows' last, the previous turn's other rows on its dies
 * list). It then has no items: the next lease hashes every row. */
static int warm_for(cph_turnlog *tl, cph_txn *t, const char *session, turnwarm **out) {
  uint64_t newest;
  int rc = newest_kept(t, session, &newest);
  turnwarm *w = rc ? NULL : turnwarms_get(&tl->warm, session);
  if (rc || (w && turnwarm_newest(w) == newest)) {
    *out = w;
    return rc;
  }
  if ((rc = turnwarms_fresh(&tl->warm, session, &w)) != CPH_OK)
    return rc;
  cph_cursor cur;
  if ((rc = cph_cursor_open(t, CPH_DB_TURN_KEPT, &cur)) != CPH_OK)
    return rc;
  cph_key start = kept_key(session, 0);
  size_t prefix = strlen(session) + 1;
  cph_val k;
  for (rc = cph_cursor_seek(&cur, &start, &k, NULL); rc == CPH_OK;
       rc = cph_cursor_next(&cur, &k, NULL)) {
    if (k.len < prefix + 9 || memcmp(k.data, start.data, prefix + 1) != 0)
      break;
    uint64_t id, prev, was;
    if (!is_kept_record(&k, start.data, prefix, &id))
      continue; /* a refs entry: read with its record */
    cph_key rk = refs_key(session, id);
    cph_val v;
    size_t n_added, n = 0;
    rc = cph_txn_get(t, CPH_DB_TURN_KEPT, &rk, &v);
    bool has_rows = rc == CPH_OK;
    if (rc == CPH_ENOTFOUND) /* an older-version record: it names no rows */
      rc = CPH_OK;
    else if (rc == CPH_OK && !refs_parse(&v, &prev, &n_added, &n))
      rc = cph_err_set(&t->err, CPH_ECORRUPT, "database \"turn_kept\": a bad entry of '%s'",
                       session);
    if (rc == CPH_OK)
      rc = scratch_reserve(&tl->scratch, n);
    for (size_t i = 0; rc == CPH_OK && i < n; i++)
      if (!turnwarm_claim(w, tl->scratch.dist[i] = refs_row(&v, i), id, &was))
        rc = CPH_ENOMEM;
    if (rc == CPH_OK)
      rc = turnwarm_advance(w, id, has_rows, tl->scratch.dist, n);
    if (rc)
      break;
  }
  cph_cursor_close(&cur);
  if (rc == CPH_ENOTFOUND)
    rc = CPH_OK;
  *out = w;
  return rc;
}

#define ROW_SEED 0x8ebc6af09c88c6e3ull

/* ---- Row names
 * A row's name is its key in "turn_kept" (after the session and 'r'). It was its 64-bit hash, which put
 * a lease's few new rows, and the few its trim deletes, on as many random leaves of the
 * session's rows — each leaf a page written again, with its path, every lease. Now a new row is
 * named by the low ROW_IDENT_BITS bits of its hash (its identity: two rows whose names share
 * them are the same row) under the low 16 bits of the turn that adds it, so that the rows one
 * lease adds sort together, and so do the rows one trim deletes (history messages leave the
 * window in the order they came in, so they were added together too): a leaf or two a lease.
 * The turn bits wrap every 65,536 turns of the daemon, which only moves where the next rows
 * go. A row is found again by its identity (turnwarm_held_like), so a text that comes back
 * while its row is held reuses that row whatever turn named it; a row named by its whole hash
 * (kept before this layout) is found by that first, and reused as it is: old and new names live
 * side by side, and no data directory needs rewriting. Identities are 48 bits: a new row
 * wrongly taken for a held one of its session (which the explorer would then show in its
 * place) takes two different texts of one session with equal low 48 bits of their hashes —
 * about once in 10^11 leases of a session holding 400 rows. */
#define ROW_IDENT_BITS 48
#define ROW_IDENT_MASK ((UINT64_C(1) << ROW_IDENT_BITS) - 1)

static bool test_hash_names;
void turnlog_test_hash_names(bool on) { test_hash_names = on; }

/* The name of the row whose hash is h, kept by turn: the held row it is, else a new name. */
static uint64_t row_name(const turnwarm *w, uint64_t h, uint64_t turn) {
  uint64_t held;
  if (turnwarm_held_like(w, h, ROW_IDENT_BITS, &held))
    return held;
  if (test_hash_names)
    return h;
  return (turn & 0xffff) << ROW_IDENT_BITS | (h & ROW_IDENT_MASK);
}
#define CODE_NAMED 0x80000000u /* a row's code (turnwarm_claim): named by the previous turn */

/* Turn's messages and nodes as rows: each one's row (from the warm items when it is a
 * message or node of the session's previous kept turn, compared field by field, else hashed),
 * the rows the previous turn does not name put, this turn's refs entry put, and w advanced to
 * this turn.
 * r is the version-2 shape fill_rec built (its node arrays unused: the nodes are read from
 * the tree), tx its previews' lengths. */
static int rows_keep(turnlog_scratch *sc, kept_writes *kw, turnwarm *w, const char *session,
                     uint64_t turn, const cph_turnctx_rec *r, const cph_turn_info *ti,
                     const context_tree *ct, const texts *tx) {
  size_t nm = r->n_msg_roles, nn = ct->tree.n, n = nm + nn;
  if (tx->n_pv != nn)
    return CPH_ENOMEM; /* fill_nodes stopped short */
  int rc = scratch_reserve(sc, n);
  cph_buf *head = &sc->head;
  /* each message's and node's row: hashed only when it is not an item of the previous kept
   * turn (a node's key leaves its content hash out: that is hashed then too) */
  size_t pos[2] = {0, 0};
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    const cph_pact_node *nd = i < nm ? NULL : &ct->tree.nodes[ct->order[i - nm]];
    tw_key k;
    uint8_t fixed[40]; /* a node's fields, as the key compares them */
    if (nd) {
      memcpy(fixed, &nd->at.position, 4);
      memcpy(fixed + 4, &nd->at.offset, 4);
      int64_t v[4] = {nd->ttl, nd->cadence, (int64_t)nd->created_at_episode,
                      (int64_t)node_flags(nd)};
      memcpy(fixed + 8, v, sizeof v);
      const char *role = nd->role ? nd->role : "";
      k = (tw_key){'n', nd->id, role, fixed, strlen(role), sizeof fixed, nd->content,
                   strlen(nd->content)};
      sc->depth[i] = nd->at.depth;
    } else {
      const cph_message *msg = &ti->messages[i];
      const char *coord = r->msg_coords[i], *content = msg->content ? msg->content : "";
      size_t end = 0, content_len;
      bool split;
      size_t coord_len;
      if (msg->measured) { /* context assembly wrote coord from these numbers (push_message) */
        split = true;
        sc->depth[i] = msg->depth;
        end = depth_end(msg->depth);
        content_len = msg->content_len;
        coord_len = msg->coord_len;
      } else {
        split = coord_split(coord, &sc->depth[i], &end);
        content_len = strlen(content);
        coord_len = strlen(coord);
      }
      assert(!msg->measured || measured_as_written(msg, coord, end, content, content_len));
      if (!split) {
        sc->depth[i] = 0;
        end = 0;
      }
      k = (tw_key){split ? 'm' : 'M', r->msg_nodes[i], r->msg_roles[i], coord + end,
                   strlen(r->msg_roles[i]), coord_len - end, content, content_len};
    }
    const tw_item *same = turnwarm_find(w, nd != NULL, &pos[nd != NULL], &k);
    sc->rows[i] = same ? same->row : 0;
    sc->chash[i] = same ? same->chash : 0;
    if (!same) {
      size_t len = k.n_text;
      cph_buf_reset(head);
      if (nd) { /* the row's text is the preview */
        node_row_head(head, nd, sc->chash[i] = text_hash(k.text, k.n_text));
        len = tx->pv_len[i - nm];
      } else {
        int32_t d;
        msg_row_head(head, r->msg_roles[i], r->msg_coords[i], r->msg_nodes[i], &d);
      }
      if ((rc = cph_buf_error(head)) != CPH_OK)
        break;
      uint64_t h = lanes_hash(k.text, len, lanes_hash(head->data, head->len, ROW_SEED));
      sc->rows[i] = row_name(w, h, turn);
    }
    rc = turnwarm_add_item(w, nd != NULL, &k, same, sc->rows[i], sc->chash[i]);
  }
  /* which rows the previous kept turn does not name: those are put, and listed first */
  uint64_t prev = turnwarm_newest(w);
  size_t n_added = 0, n_named = 0;
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    uint64_t last;
    uint32_t *code = turnwarm_claim(w, sc->rows[i], turn, &last);
    if (!code) {
      rc = CPH_ENOMEM;
      break;
    }
    if (last == turn) { /* named twice in this turn */
      sc->code[i] = *code;
      continue;
    }
    bool named = prev && last == prev;
    sc->code[i] = *code = named ? CODE_NAMED | (uint32_t)n_named++ : (uint32_t)n_added++;
    if (named)
      continue;
    cph_buf_reset(head);
    const char *str;
    size_t len;
    if (i < nm) {
      int32_t d;
      msg_row_head(head, r->msg_roles[i], r->msg_coords[i], r->msg_nodes[i], &d);
      str = ti->messages[i].content ? ti->messages[i].content : "";
      len = ti->messages[i].measured ? ti->messages[i].content_len : strlen(str);
    } else {
      const cph_pact_node *nd = &ct->tree.nodes[ct->order[i - nm]];
      node_row_head(head, nd, sc->chash[i]);
      str = nd->content;
      len = tx->pv_len[i - nm];
    }
    cph_buf_append(head, str, len);
    if ((rc = cph_buf_error(head)) == CPH_OK) {
      cph_key rk = row_key(session, sc->rows[i]);
      kw_put(kw, &rk, head->data, head->len);
    }
  }
  /* the refs entry: its head, the distinct rows (the added ones first), then the turn's rows in
   * order as (index among the distinct ones, depth) */
  size_t n_distinct = n_added + n_named, len = REFS_HEAD + 8 * n_distinct + 8 * n;
  cph_buf_reset(head);
  if (rc == CPH_OK && cph_buf_grow(head, len)) {
    uint8_t *refs = (uint8_t *)head->data;
    cph_be64_put(refs, prev);
    cph_be64_put(refs + 8, n_added);
    cph_be64_put(refs + 16, n_distinct);
    cph_be32_put(refs + 24, (uint32_t)nm);
    cph_be32_put(refs + 28, (uint32_t)nn);
    uint8_t *o = refs + REFS_HEAD + 8 * n_distinct;
    for (size_t i = 0; i < n; i++, o += 8) {
      uint32_t c = sc->code[i];
      size_t ix = c & CODE_NAMED ? n_added + (c & ~CODE_NAMED) : c;
      cph_be64_put(refs + REFS_HEAD + 8 * ix, sc->rows[i]);
      sc->dist[ix] = sc->rows[i];
      cph_be32_put(o, (uint32_t)ix);
      cph_be32_put(o + 4, (uint32_t)sc->depth[i]);
    }
    cph_key ak = refs_key(session, turn);
    kw_put(kw, &ak, refs, len);
  } else if (rc == CPH_OK) {
    rc = CPH_ENOMEM;
  }
  if (rc == CPH_OK)
    rc = turnwarm_advance(w, turn, true, sc->dist, n_distinct);
  if (rc == CPH_OK)
    turnwarm_items_done(w);
  return rc;
}

/* Reads a row's string at *p (be32 n + bytes) into a new string; false when the row is short. */
static bool row_str(const uint8_t **p, const uint8_t *end, char **out) {
  if (end - *p < 4)
    return false;
  uint32_t n = cph_be32_get(*p);
  *p += 4;
  if ((size_t)(end - *p) < n || !(*out = malloc(n + 1)))
    return false;
  memcpy(*out, *p, n);
  (*out)[n] = '\0';
  *p += n;
  return true;
}

static char *row_rest(const uint8_t *p, const uint8_t *end) {
  char *s = malloc((size_t)(end - p) + 1);
  if (s) {
    memcpy(s, p, (size_t)(end - p));
    s[end - p] = '\0';
  }
  return s;
}

/* Frees a decoded (empty) array and allocates n zeroed entries in its place. */
#define REALLOC_FIELD(r, field, count, n)                                                          \
  (free((r)->field), (r)->count = 0, ((r)->field = calloc((n) ? (n) : 1, sizeof *(r)->field)))

/* A version-3 record's messages and nodes, looked up by row into the version-2 arrays, so the
 * rest reads every record alike. */
/* Turn's ordered rows from its refs entry into l. */
static int rows_read(cph_txn *t, const char *session, uint64_t turn, rowlist *l, cph_err *err) {
  cph_key k = refs_key(session, turn);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_TURN_KEPT, &k, &v);
  uint64_t prev;
  size_t n_added, n_distinct;
  if (rc == CPH_OK && !refs_parse(&v, &prev, &n_added, &n_distinct))
    rc = CPH_ECORRUPT;
  if (rc == CPH_ENOTFOUND || rc == CPH_ECORRUPT)
    return cph_err_set(err, CPH_ECORRUPT,
                       "database \"turn_kept\": the entry of turn %llu of '%s' is %s",
                       (unsigned long long)turn, session, rc == CPH_ENOTFOUND ? "missing" : "bad");
  if (rc)
    return cph_err_set(err, rc, "%s", t->err.msg);
  const uint8_t *p = v.data;
  uint32_t nm = cph_be32_get(p + 24), nn = cph_be32_get(p + 28);
  l->msg_rows = calloc(nm ? nm : 1, sizeof *l->msg_rows);
  l->msg_depths = calloc(nm ? nm : 1, sizeof *l->msg_depths);
  l->node_rows = calloc(nn ? nn : 1, sizeof *l->node_rows);
  l->node_depths = calloc(nn ? nn : 1, sizeof *l->node_depths);
  if (!l->msg_rows || !l->msg_depths || !l->node_rows || !l->node_depths)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  const uint8_t *o = p + REFS_HEAD + 8 * n_distinct;
  for (uint32_t i = 0; i < nm + nn; i++, o += 8) {
    uint32_t ix = cph_be32_get(o);
    if (ix >= n_distinct)
      return cph_err_set(err, CPH_ECORRUPT,
                         "database \"turn_kept\": the entry of turn %llu of '%s' is bad",
                         (unsigned long long)turn, session);
    uint64_t h = refs_row(&v, ix);
    int32_t d = (int32_t)cph_be32_get(o + 4);
    if (i < nm) {
      l->msg_rows[i] = h;
      l->msg_depths[i] = d;
    } else {
      l->node_rows[i - nm] = h;
      l->node_depths[i - nm] = d;
    }
  }
  l->n_msg_rows = nm;
  l->n_node_rows = nn;
  return CPH_OK;
}

/* l's rows into r's version-2 arrays. */
static int rows_materialize(cph_txn *t, const char *session, uint64_t turn, const rowlist *l,
                            cph_turnctx_rec *r, cph_err *err) {
  uint32_t nm = l->n_msg_rows, nn = l->n_node_rows;
  if (!REALLOC_FIELD(r, msg_roles, n_msg_roles, nm) ||
      !REALLOC_FIELD(r, msg_contents, n_msg_contents, nm) ||
      !REALLOC_FIELD(r, msg_coords, n_msg_coords, nm) ||
      !REALLOC_FIELD(r, msg_nodes, n_msg_nodes, nm) || !REALLOC_FIELD(r, node_ids, n_node_ids, nn) ||
      !REALLOC_FIELD(r, node_at, n_node_at, nn) || !REALLOC_FIELD(r, node_roles, n_node_roles, nn) ||
      !REALLOC_FIELD(r, node_previews, n_node_previews, nn) ||
      !REALLOC_FIELD(r, node_hashes, n_node_hashes, nn) ||
      !REALLOC_FIELD(r, node_ttl, n_node_ttl, nn) ||
      !REALLOC_FIELD(r, node_cadence, n_node_cadence, nn) ||
      !REALLOC_FIELD(r, node_created, n_node_created, nn) ||
      !REALLOC_FIELD(r, node_flags, n_node_flags, nn))
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  for (uint32_t i = 0; i < nm + nn; i++) {
    uint64_t h = i < nm ? l->msg_rows[i] : l->node_rows[i - nm];
    cph_key rk = row_key(session, h);
    cph_val v;
    int rc = cph_txn_get(t, CPH_DB_TURN_KEPT, &rk, &v);
    if (rc == CPH_ENOTFOUND)
      return cph_err_set(err, CPH_ECORRUPT,
                         "database \"turn_kept\": the row %016llx of turn %llu of '%s' is missing",
                         (unsigned long long)h, (unsigned long long)turn, session);
    if (rc)
      return cph_err_set(err, rc, "%s", t->err.msg);
    const uint8_t *p = v.data, *end = p + v.len;
    bool ok = v.len >= 1;
    if (ok && i < nm && (p[0] == 'm' || p[0] == 'M') && v.len >= 9) {
      bool split = p[0] == 'm';
      r->msg_nodes[i] = cph_be64_get(p + 1);
      p += 9;
      char *coord = NULL;
      ok = row_str(&p, end, &r->msg_roles[i]) && row_str(&p, end, &coord);
      if (ok && split) { /* "d" + depth + the rest */
        char *full = fmt("d%lld%s", (long long)l->msg_depths[i], coord + 1);
        free(coord);
        coord = full;
        ok = full != NULL;
      }
      r->msg_coords[i] = coord;
      ok = ok && (r->msg_contents[i] = row_rest(p, end)) != NULL;
      r->n_msg_roles = r->n_msg_contents = r->n_msg_coords = r->n_msg_nodes = i + 1;
    } else if (ok && i >= nm && p[0] == 'n' && v.len >= 61) {
      uint32_t j = i - nm;
      r->node_ids[j] = cph_be64_get(p + 1);
      cph_coord at = {l->node_depths[j], (int32_t)cph_be32_get(p + 9),
                      (int32_t)cph_be32_get(p + 13)};
      r->node_ttl[j] = (int64_t)cph_be64_get(p + 17);
      r->node_cadence[j] = (int64_t)cph_be64_get(p + 25);
      r->node_created[j] = cph_be64_get(p + 33);
      r->node_flags[j] = cph_be64_get(p + 41);
      r->node_hashes[j] = cph_be64_get(p + 49);
      p += 57;
      char buf[48];
      cph_coord_format(&at, buf);
      ok = (r->node_at[j] = strdup(buf)) != NULL && row_str(&p, end, &r->node_roles[j]) &&
           (r->node_previews[j] = row_rest(p, end)) != NULL;
      r->n_node_ids = r->n_node_at = r->n_node_roles = r->n_node_previews = r->n_node_hashes =
          r->n_node_ttl = r->n_node_cadence = r->n_node_created = r->n_node_flags = j + 1;
    } else {
      ok = false;
    }
    if (!ok)
      return cph_err_set(err, CPH_ECORRUPT,
                         "database \"turn_kept\": the row %016llx of turn %llu of '%s' is corrupt "
                         "(or out of memory)",
                         (unsigned long long)h, (unsigned long long)turn, session);
  }
  return CPH_OK;
}

static int rows_resolve(cph_txn *t, const char *session, uint64_t turn, cph_turnctx_rec *r,
                        cph_err *err) {
  rowlist l = {0};
  int rc = rows_read(t, session, turn, &l, err);
  if (rc == CPH_OK)
    rc = rows_materialize(t, session, turn, &l, r, err);
  rowlist_free(&l);
  return rc;
}

/* ---------------------------------------------------------------- keeping */

void turnlog_init(cph_turnlog *tl, cph_core_env *env) {
  *tl = (cph_turnlog){.env = env, .scratch = {.head = CPH_BUF_INIT}};
  turnwarms_init(&tl->warm, TURNLOG_WARM_BYTES);
}

void turnlog_clear(cph_turnlog *tl) { turnwarms_clear(&tl->warm); }

static void scratch_free(turnlog_scratch *sc);

void turnlog_free(cph_turnlog *tl) {
  turnwarms_free(&tl->warm);
  scratch_free(&tl->scratch);
}

/* A node that may have rendered a message: its coordinate and its place in render order. */
typedef struct cand {
  cph_coord at;
  size_t i;
} cand;

static int coord_cmp(const cph_coord *a, const cph_coord *b) {
  if (a->depth != b->depth)
    return a->depth < b->depth ? -1 : 1;
  if (a->position != b->position)
    return a->position < b->position ? -1 : 1;
  return (a->offset > b->offset) - (a->offset < b->offset);
}

/* By coordinate, then render order, so the first unused of equal candidates is the first in
 * render order. */
static int cand_cmp(const void *x, const void *y) {
  const cand *a = x, *b = y;
  int c = coord_cmp(&a->at, &b->at);
  return c ? c : (a->i > b->i) - (a->i < b->i);
}

/* One int32 as cph_coord_format writes it (pact.c): '-' for a negative, no leading zeros, no
 * "-0"; *s moves past it. */
static bool i32_parse(const char **s, int32_t *out) {
  const char *p = *s;
  bool neg = *p == '-';
  p += neg;
  if (*p < '0' || *p > '9' || (*p == '0' && (neg || (p[1] >= '0' && p[1] <= '9'))))
    return false;
  const char *d0 = p;
  int64_t v = 0;
  while (*p >= '0' && *p <= '9' && p - d0 < 11)
    v = v * 10 + (*p++ - '0');
  if (p - d0 > 10 || v > (int64_t)INT32_MAX + neg)
    return false;
  *out = (int32_t)(neg ? -v : v);
  *s = p;
  return true;
}

/* A coordinate from exactly the text cph_coord_format writes ("d-1, 0, 0"), false for any
 * other: two texts are equal iff they parse to the same coordinate. */
static bool coord_parse(const char *s, cph_coord *c) {
  if (*s++ != 'd' || !i32_parse(&s, &c->depth) || s[0] != ',' || s[1] != ' ')
    return false;
  s += 2;
  if (!i32_parse(&s, &c->position) || s[0] != ',' || s[1] != ' ')
    return false;
  s += 2;
  return i32_parse(&s, &c->offset) && *s == '\0';
}

/* Fills r's tree part from the tree the turn was rendered from and maps each message of ti to
 * the live node it renders. */
static int fill_nodes(cph_turnctx_rec *r, const context_tree *ct, const cph_turn_info *ti,
                      texts *tx) {
  const cph_pact_tree *tree = &ct->tree;
  const size_t *idx = ct->order;
  size_t n = tree->n, n1 = n ? n : 1;
  bool v2 = !tx->no_hash; /* version 3 keeps the nodes as rows, read from the tree itself */
  bool *used = calloc(n1, sizeof *used);
  cand *cands = malloc(n1 * sizeof *cands);
  r->msg_nodes = calloc(ti->n_messages ? ti->n_messages : 1, sizeof *r->msg_nodes);
  bool ok = used && cands && r->msg_nodes;
  if (v2) {
#define ALLOC(p) ((p) = calloc(n1, sizeof *(p)))
    ok = ok && ALLOC(tx->at) && ALLOC(r->node_ids) && ALLOC(r->node_at) && ALLOC(r->node_roles) &&
         ALLOC(r->node_preview_hashes) && ALLOC(tx->owned) && ALLOC(r->node_hashes) &&
         ALLOC(r->node_ttl) && ALLOC(r->node_cadence) && ALLOC(r->node_created) &&
         ALLOC(r->node_flags);
#undef ALLOC
  } else {
    ok = ok && (tx->pv_len = malloc(n1 * sizeof *tx->pv_len));
  }
  int rc = CPH_OK;
  if (!ok) {
    rc = CPH_ENOMEM;
    goto out;
  }
  /* Live nodes in render order, then the waiting ones. */
  size_t live = ct->n_live;
  for (size_t i = 0; i < n; i++) {
    const cph_pact_node *nd = &tree->nodes[idx[i]];
    if (!v2) { /* the row hashes the preview where it lies */
      tx->pv_len[tx->n_pv++] = preview_len(nd->content);
      continue;
    }
    cph_coord_format(&nd->at, tx->at[i]);
    r->node_ids[i] = nd->id;
    r->node_hashes[i] = text_hash(nd->content, strlen(nd->content));
    r->node_ttl[i] = nd->ttl;
    r->node_cadence[i] = nd->cadence;
    r->node_created[i] = nd->created_at_episode;
    r->node_flags[i] = node_flags(nd);
    r->node_at[i] = tx->at[i]; /* borrowed, as the role (rec_unborrow) */
    r->node_roles[i] = nd->role ? nd->role : (char *)"";
    r->n_node_ids = r->n_node_at = r->n_node_roles = r->n_node_preview_hashes = r->n_node_hashes =
        r->n_node_ttl = r->n_node_cadence = r->n_node_created = r->n_node_flags = (uint32_t)i + 1;
    char *pv = tx->owned[tx->n_owned] = preview(nd->content);
    if (pv)
      tx->n_owned++;
    if (!pv || texts_add(tx, pv, &r->node_preview_hashes[i]) != CPH_OK) {
      rc = CPH_ENOMEM;
      goto out;
    }
  }
  /* Each message that a live node rendered: same coordinate and content, first unused. On an
   * inbox turn the channel view stands for the message cores (core/context.h), so a core
   * never rendered one. */
  bool inbox = ti->kind == CPH_KIND_INBOX && ti->n_staged > 0;
  /* The nodes that may have rendered a message, sorted by coordinate, so each message finds
   * its candidates by binary search: O((messages + nodes) log nodes), not their product. A
   * message's coordinate is compared as the coordinate its text is (coord_parse). */
  size_t n_cand = 0;
  for (size_t i = 0; i < live; i++)
    if (!(inbox && tree->nodes[idx[i]].role))
      cands[n_cand++] = (cand){tree->nodes[idx[i]].at, i};
  qsort(cands, n_cand, sizeof *cands, cand_cmp);
  for (size_t m = 0; m < ti->n_messages; m++) {
    const cph_message *msg = &ti->messages[m];
    cph_coord at = {msg->depth, msg->position, msg->offset};
    if (!n_cand || (!msg->measured && !coord_parse(msg->coord, &at)))
      continue;
    size_t lo = 0, hi = n_cand;
    while (lo < hi) { /* the first candidate whose coordinate is not below msg's */
      size_t mid = lo + (hi - lo) / 2;
      if (coord_cmp(&cands[mid].at, &at) < 0)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (size_t c = lo; c < n_cand && coord_cmp(&cands[c].at, &at) == 0; c++) {
      size_t i = cands[c].i;
      const cph_pact_node *nd = &tree->nodes[idx[i]];
      if (used[i] || strcmp(nd->content, msg->content) != 0)
        continue;
      used[i] = true;
      r->msg_nodes[m] = nd->id;
      break;
    }
  }
  r->n_msg_nodes = (uint32_t)ti->n_messages;
out:
  free(used);
  free(cands);
  return rc;
}

/* r from ti and the tree: the strings are copies r owns (cph_record_free frees them). */
static int fill_rec(cph_turnctx_rec *r, uint64_t turn_id, const cph_turn_info *ti,
                    const context_tree *tree, texts *tx) {
  r->turn_id = turn_id;
  r->session = strdup(ti->session);
  r->kind = (uint8_t)ti->kind; /* cph_turn_kind_t and the stored cph_turn_kind agree */
  r->episode = ti->episode;
  r->created_ms = cph_wall_ms();
  r->omit = ti->omit;
  r->input = dup_opt(ti->input);
  if (!r->session || (ti->input && !r->input))
    return CPH_ENOMEM;
  const cph_context_tokens *tk = &ti->tokens;
  uint64_t tokens[N_TOKENS] = {tk->window,
                               tk->current_state,
                               tk->pending_obligations,
                               tk->conversation_history,
                               tk->recent_memory,
                               tk->available_tools,
                               tk->sections,
                               tk->messages,
                               tk->history_cut,
                               tk->messages_cut};
  if (!(r->tokens = malloc(sizeof tokens)))
    return CPH_ENOMEM;
  memcpy(r->tokens, tokens, sizeof tokens);
  r->n_tokens = N_TOKENS;

#define ALLOC(field, count) (r->field = calloc((count) ? (count) : 1, sizeof *r->field))
  if (!ALLOC(channels, ti->n_views) || !ALLOC(staged_events, ti->n_staged) ||
      !ALLOC(obligations, ti->n_obligations) || !ALLOC(obligation_texts, ti->n_obligations) ||
      !ALLOC(history, ti->n_history) || !ALLOC(memories, ti->n_memories) ||
      !ALLOC(tools, ti->n_tools) || !ALLOC(msg_roles, ti->n_messages) ||
      !ALLOC(msg_hashes, ti->n_messages) || !ALLOC(msg_coords, ti->n_messages))
    return CPH_ENOMEM;
#undef ALLOC
  for (size_t i = 0; i < ti->n_views; i++)
    if ((r->channels[r->n_channels++] = strdup(ti->views[i].channel)) == NULL)
      return CPH_ENOMEM;
  for (size_t i = 0; i < ti->n_staged; i++)
    r->staged_events[r->n_staged_events++] = ti->staged[i].event_id;
  for (size_t i = 0; i < ti->n_obligations; i++) {
    const cph_obligation *o = &ti->obligations[i];
    r->obligations[r->n_obligations++] = o->id;
    if ((r->obligation_texts[r->n_obligation_texts++] =
             fmt("%s: %s", o->sender ? o->sender : "", o->preview ? o->preview : "")) == NULL)
      return CPH_ENOMEM;
  }
  for (size_t i = 0; i < ti->n_history; i++)
    r->history[r->n_history++] = ti->history[i].event_id;
  for (size_t i = 0; i < ti->n_memories; i++)
    r->memories[r->n_memories++] = ti->memories[i].id;
  for (size_t i = 0; i < ti->n_tools; i++)
    if ((r->tools[r->n_tools++] = strdup(ti->tools[i].name)) == NULL)
      return CPH_ENOMEM;
  /* Roles and coordinates are borrowed from ti, which outlives the record (encoded and freed
   * at once); rec_unborrow gives them back before it is freed. The contents go by hash
   * (texts by hash, above). */
  for (size_t i = 0; i < ti->n_messages; i++) {
    const cph_message *m = &ti->messages[i];
    r->msg_roles[i] = m->role;
    r->msg_coords[i] = m->coord;
    r->n_msg_roles = r->n_msg_hashes = r->n_msg_coords = (uint32_t)i + 1;
    if (!tx->no_hash && texts_add(tx, m->content ? m->content : "", &r->msg_hashes[i]) != CPH_OK)
      return CPH_ENOMEM;
  }
  return fill_nodes(r, tree, ti, tx);
}

/* Undoes fill_rec's borrowing — the turn's message strings, the tree's roles and the
 * coordinates in tx — so freeing r leaves them be. */
static void rec_unborrow(cph_turnctx_rec *r) {
  for (uint32_t i = 0; r->msg_roles && i < r->n_msg_roles; i++)
    r->msg_roles[i] = r->msg_coords[i] = NULL;
  for (uint32_t i = 0; r->node_at && i < r->n_node_at; i++)
    r->node_at[i] = NULL;
  for (uint32_t i = 0; r->node_roles && i < r->n_node_roles; i++)
    r->node_roles[i] = NULL;
}

/* Deletes everything the session kept: records, refs entries, rows and texts. */
static int delete_kept(cph_txn *t, const char *session) {
  static const cph_db dbs[] = {CPH_DB_TURN_KEPT, CPH_DB_TURN_TEXT_REFS, CPH_DB_TURN_TEXTS};
  int rc = CPH_OK;
  for (size_t i = 0; rc == CPH_OK && i < sizeof dbs / sizeof dbs[0]; i++)
    rc = delete_prefixed(t, dbs[i], session);
  return rc;
}

typedef struct row_gone_ctx {
  kept_writes *kw;
  const char *session;
} row_gone_ctx;

/* turnwarm_trim_oldest's callback: deletes a row no remaining turn names. */
static int row_gone(void *ctx, uint64_t row) {
  row_gone_ctx *g = ctx;
  cph_key rk = row_key(g->session, row);
  kw_del(g->kw, &rk, true);
  return CPH_OK;
}

/* Whether keeping one more turn with w and trimming to keep turns would trim a turn without
 * rows (an older record version), whose texts are trimmed by reading the store (texts_trim). */
static bool trim_needs_store(const turnwarm *w, uint64_t keep) {
  for (size_t i = 0; i + keep < w->n_turns + 1; i++)
    if (!w->turns[i].rows)
      return true;
  return false;
}

/* Deletes the session's oldest kept contexts until at most keep (>= 1) remain, with their
 * refs entries and every row (w's dies lists) and text no remaining turn names: into kw, and
 * an older version's texts through t (NULL only when !trim_needs_store). */
static int trim(cph_txn *t, kept_writes *kw, turnwarm *w, const char *session, uint64_t keep) {
  row_gone_ctx g = {kw, session};
  int rc = CPH_OK;
  while (rc == CPH_OK && w->n_turns > keep) {
    const tw_turn *o = &w->turns[0];
    cph_key k = kept_key(session, o->id), rk = refs_key(session, o->id);
    kw_del(kw, &k, false);
    if (o->rows)
      kw_del(kw, &rk, false);
    else
      rc = t ? texts_trim(t, session, &o->id, 1) : CPH_ESTATE;
    if (rc == CPH_OK)
      rc = turnwarm_trim_oldest(w, row_gone, &g);
  }
  return rc;
}

/* Keeps ti's context as turn turn_id with w (the session's warm state, as the store holds it or
 * will once the writes before this one are made), trimming to keep turns: every write into kw,
 * but a version-2 record's texts (texts_keep, the test mode) and an older version's trim, which
 * go through t (NULL: there are none, turnlog_keep_begin checked). */
static int keep_turn(turnlog_scratch *sc, kept_writes *kw, cph_txn *t, turnwarm *w,
                     uint64_t turn_id, const cph_turn_info *ti, const context_tree *tree,
                     uint64_t keep) {
  cph_turnctx_rec r = {0};
  texts tx = {.no_hash = !write_v2};
  int rc = fill_rec(&r, turn_id, ti, tree, &tx);
  cph_turnctx_rec wr = {0}; /* what is written: r (version 2), or r without its messages and
                             * nodes, which go as rows (version 3) */
  if (rc == CPH_OK && write_v2) {
    rc = t ? texts_keep(t, ti->session, turn_id, &tx) : CPH_ESTATE;
    if (rc == CPH_OK)
      rc = turnwarm_advance(w, turn_id, false, NULL, 0);
    wr = r;
  } else if (rc == CPH_OK) {
    wr = r;
    wr.n_msg_roles = wr.n_msg_contents = wr.n_msg_coords = wr.n_msg_nodes = 0;
    wr.n_node_ids = wr.n_node_at = wr.n_node_roles = wr.n_node_previews = wr.n_node_hashes = 0;
    wr.n_node_ttl = wr.n_node_cadence = wr.n_node_created = wr.n_node_flags = 0;
    wr.n_msg_hashes = wr.n_node_preview_hashes = 0;
    wr.rows = true;
    wr.row_messages = (uint32_t)ti->n_messages;
    rc = rows_keep(sc, kw, w, ti->session, turn_id, &r, ti, tree, &tx);
  }
  if (rc == CPH_OK) {
    cph_key k = kept_key(ti->session, turn_id);
    kw_put_record(kw, &k, write_v2 ? &cph_turnctx_v2_desc : &cph_turnctx_desc, &wr);
  }
  rec_unborrow(&r); /* wr shares r's arrays */
  cph_record_free(&cph_turnctx_desc, &r);
  texts_free(&tx);
  if (rc == CPH_OK)
    rc = trim(t, kw, w, ti->session, keep);
  return rc;
}

/* Whether the store has room for a kept context: one never takes the room a full store keeps
 * for leases and completions (env_write_reserve). The turn is then not kept, and the older
 * ones stay; the map grows when ingest next needs room (engine.c, grow_map), and keeping
 * resumes. */
static bool room_to_keep(cph_txn *t, uint64_t turn_id, const char *session) {
  size_t live = 0, map = 0;
  if (cph_txn_space(t, &live, &map) == CPH_OK && live + env_write_reserve(map) > map) {
    cph_log(CPH_LOG_DEBUG, "turn %llu of '%s': its context is not kept: the store is nearly full",
            (unsigned long long)turn_id, session);
    return false;
  }
  return true;
}

static void not_kept(uint64_t turn_id, const char *session, const cph_txn *c, int rc) {
  cph_log(CPH_LOG_WARN, "turn %llu of '%s': its context is not kept: %s",
          (unsigned long long)turn_id, session,
          c && c->err.msg[0] ? c->err.msg : cph_strerror(rc));
}

/* The warm states' bound, after a keep (tests may set it). */
static void warm_release(cph_turnlog *tl) {
  tl->warm.max_bytes = test_warm_bytes >= 0 ? (size_t)test_warm_bytes : TURNLOG_WARM_BYTES;
  turnwarms_release(&tl->warm);
}

void turnlog_keep(cph_turnlog *tl, cph_txn *t, uint64_t turn_id, const cph_turn_info *ti,
                  const context_tree *tree) {
  if (ti->kind == CPH_KIND_JOB || !ti->session)
    return;
  uint64_t keep = (uint64_t)tl->env->policy->context.keep_turns;
  if (keep > 0 && !room_to_keep(t, turn_id, ti->session))
    return;
  cph_txn c;
  if (cph_txn_begin_child(t, &c) != CPH_OK)
    return;
  kept_writes kw = {CPH_BUF_INIT};
  int rc = CPH_OK;
  turnwarm *w = turnwarms_get(&tl->warm, ti->session);
  if (w && w->pins) /* jobs of the session not written yet keep nothing: this keep goes first */
    turnwarms_drop(&tl->warm, ti->session);
  if (keep == 0) { /* rows and texts are held only while a record names them */
    uint64_t newest = 0;
    turnwarms_drop(&tl->warm, ti->session);
    rc = newest_kept(&c, ti->session, &newest);
    if (rc == CPH_OK && newest)
      rc = delete_kept(&c, ti->session);
  } else if (!tree->ok) {
    /* the turn was rendered without its tree (it could not be read): nothing to keep it by */
    rc = cph_err_set(&c.err, CPH_ECORRUPT, "the session's context tree could not be read");
  } else if ((rc = warm_for(tl, &c, ti->session, &w)) == CPH_OK) {
    rc = keep_turn(&tl->scratch, &kw, &c, w, turn_id, ti, tree, keep);
  }
  if (rc == CPH_OK)
    rc = kw_apply(&kw, &c);
  cph_buf_free(&kw.b);
  if (rc == CPH_OK)
    rc = cph_txn_commit(&c);
  else
    cph_txn_abort(&c);
  if (rc) {
    turnwarms_drop(&tl->warm, ti->session); /* it may hold what was not kept */
    not_kept(turn_id, ti->session, &c, rc);
  }
  warm_release(tl);
}

/* ---------------------------------------------------------------- deferred keeping */

struct cph_keep_job {
  cph_turnlog *tl;
  cph_context *cx;         /* releases the tree */
  char *session;
  uint64_t turn_id, keep;
  const cph_turn_info *ti; /* the lease's, alive until the job ends */
  context_tree tree;       /* held (context_tree_hold) */
  turnwarm *w;             /* pinned */
  turnlog_scratch sc;
  kept_writes kw;
  int rc;        /* turnlog_keep_compute's */
  bool computed; /* turnlog_keep_compute ran */
};

cph_keep_job *turnlog_keep_begin(cph_turnlog *tl, cph_context *cx, cph_txn *t, uint64_t turn_id,
                                 const cph_turn_info *ti, context_tree *tree) {
  if (ti->kind == CPH_KIND_JOB || !ti->session)
    return NULL;
  uint64_t keep = (uint64_t)tl->env->policy->context.keep_turns;
  if (keep == 0 || write_v2 || !tree->ok) {
    turnlog_keep(tl, t, turn_id, ti, tree);
    return NULL;
  }
  turnwarm *w = turnwarms_get(&tl->warm, ti->session);
  if (w && w->pins) { /* a job of the session's last lease is in flight: see turnlog.h */
    turnlog_keep(tl, t, turn_id, ti, tree);
    return NULL;
  }
  int rc = warm_for(tl, t, ti->session, &w);
  if (rc) {
    turnwarms_drop(&tl->warm, ti->session);
    not_kept(turn_id, ti->session, t, rc);
    return NULL;
  }
  cph_keep_job *j = NULL;
  if (!trim_needs_store(w, keep))
    j = calloc(1, sizeof *j);
  if (j)
    j->session = strdup(ti->session);
  if (!j || !j->session) { /* inline: an older version's trim reads the store, or no memory */
    free(j);
    turnlog_keep(tl, t, turn_id, ti, tree);
    return NULL;
  }
  j->tl = tl;
  j->cx = cx;
  j->turn_id = turn_id;
  j->keep = keep;
  j->ti = ti;
  j->tree = *tree;
  memset(tree, 0, sizeof *tree); /* the job's now: the caller's release does nothing */
  context_tree_hold(cx, ti->session, &j->tree);
  j->w = w;
  turnwarms_pin(w);
  j->kw = (kept_writes){CPH_BUF_INIT};
  j->sc.head = (cph_buf)CPH_BUF_INIT;
  return j;
}

void turnlog_keep_compute(cph_keep_job *j) {
  j->computed = true;
  if (turnwarm_dead(j->w)) { /* the session's warm state was dropped since its pass */
    j->rc = CPH_ESTATE;
    return;
  }
  j->rc = keep_turn(&j->sc, &j->kw, NULL, j->w, j->turn_id, j->ti, &j->tree, j->keep);
}

static void scratch_free(turnlog_scratch *sc) {
  cph_buf_free(&sc->head);
  free(sc->rows);
  free(sc->dist);
  free(sc->chash);
  free(sc->depth);
  free(sc->code);
}

/* Ends j: written when write (its own write transaction), else not; its warm state dropped when
 * what the job advanced it to is not what the store holds (a job never computed advanced
 * nothing: its warm state still is the store's). */
static void keep_end(cph_keep_job *j, bool write) {
  cph_turnlog *tl = j->tl;
  bool dead = turnwarm_dead(j->w);
  int rc = !j->computed ? CPH_ESTATE : j->rc;
  cph_txn t = {0};
  if (write && rc == CPH_OK && !dead) {
    rc = cph_txn_begin(tl->env->store, true, &t);
    if (rc == CPH_OK && !room_to_keep(&t, j->turn_id, j->session))
      rc = CPH_EFULL; /* logged by room_to_keep */
    if (rc == CPH_OK)
      rc = kw_apply(&j->kw, &t);
    if (rc == CPH_OK) /* durable with the next flush, as the lease itself (DESIGN §4) */
      rc = cph_txn_commit_deferred(&t);
    else if (t.mdb)
      cph_txn_abort(&t);
  }
  if ((rc || !write) && j->computed && !dead && turnwarms_get(&tl->warm, j->session) == j->w)
    turnwarms_drop(&tl->warm, j->session); /* it holds this turn, which the store does not */
  if (write && (dead || (rc && rc != CPH_EFULL)))
    cph_log(dead ? CPH_LOG_DEBUG : CPH_LOG_WARN, "turn %llu of '%s': its context is not kept: %s",
            (unsigned long long)j->turn_id, j->session,
            dead ? "the session's kept contexts changed since its lease (deleted, moved, or "
                   "an earlier turn's could not be kept)"
                 : t.err.msg[0] ? t.err.msg : cph_strerror(rc));
  turnwarms_unpin(&tl->warm, j->w);
  context_tree_release(j->cx, j->session, &j->tree);
  warm_release(tl);
  scratch_free(&j->sc);
  cph_buf_free(&j->kw.b);
  free(j->session);
  free(j);
}

void turnlog_keep_write(cph_keep_job *j) { keep_end(j, true); }

void turnlog_keep_abandon(cph_keep_job *j) { keep_end(j, false); }

/* ---------------------------------------------------------------- schema 6 */

/* Moves every entry of db (schema 5: key session\0 be64 x) into "turn_kept" under
 * key(session, x), then empties db. *moved counts them. */
static int move_kept(cph_txn *t, cph_db db, cph_key (*key)(const char *, uint64_t),
                     size_t *moved, cph_err *err) {
  cph_cursor cur;
  cph_buf val = CPH_BUF_INIT;
  int rc = cph_cursor_open(t, db, &cur);
  cph_val k, v;
  for (rc = rc ? rc : cph_cursor_seek(&cur, NULL, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&cur, &k, &v)) {
    const char *session = k.data;
    size_t n = k.len >= 9 ? strnlen(session, k.len - 8) : k.len;
    if (n + 9 != k.len) {
      char what[160];
      cph_key_describe(k.data, k.len, what, sizeof what);
      rc = cph_err_set(err, CPH_ECORRUPT,
                       "database \"%s\": key %s is not a session id and a 64-bit number",
                       cph_db_name(db), what);
      break;
    }
    cph_key nk = key(session, cph_be64_get((const uint8_t *)k.data + n + 1));
    cph_buf_reset(&val); /* the value is copied: a put may move the page it lies on */
    cph_buf_append(&val, v.data, v.len);
    if ((rc = cph_buf_error(&val)) != CPH_OK ||
        (rc = cph_txn_put(t, CPH_DB_TURN_KEPT, &nk, val.data, val.len)) != CPH_OK)
      break;
    (*moved)++;
  }
  cph_cursor_close(&cur);
  cph_buf_free(&val);
  if (rc == CPH_ENOTFOUND)
    rc = cph_txn_empty(t, db);
  if (rc && !err->msg[0])
    cph_err_set(err, rc, "%s", t->err.msg[0] ? t->err.msg : cph_strerror(rc));
  return rc;
}

int turnlog_migrate(cph_txn *t, cph_err *err) {
  size_t records = 0, refs = 0, rows = 0;
  int rc = move_kept(t, CPH_DB_TURN_CONTEXTS, kept_key, &records, err);
  if (rc == CPH_OK)
    rc = move_kept(t, CPH_DB_TURN_ROW_REFS, refs_key, &refs, err);
  if (rc == CPH_OK)
    rc = move_kept(t, CPH_DB_TURN_ROWS, row_key, &rows, err);
  if (rc == CPH_OK && records)
    cph_info("store: moved %zu kept turn contexts (%zu with rows, %zu rows) into one database "
             "(storage schema 6)",
             records, refs, rows);
  return rc;
}

int turnlog_delete_session(cph_turnlog *tl, cph_txn *t, const char *session) {
  turnwarms_drop(&tl->warm, session);
  return delete_kept(t, session);
}

/* ---------------------------------------------------------------- reads */

void cph_kept_turns_free(cph_kept_turn *t, size_t n) {
  for (size_t i = 0; t && i < n; i++)
    free(t[i].input);
  free(t);
}

/* The records' parallel arrays must agree; a record whose do not is corrupt. */
static bool rec_consistent(const cph_turnctx_rec *r) {
  uint32_t m = r->n_msg_roles, nn = r->n_node_ids;
  return r->n_tokens == N_TOKENS && r->n_msg_contents == m && r->n_msg_coords == m &&
         r->n_msg_nodes == m && r->n_obligation_texts == r->n_obligations && r->n_node_at == nn &&
         r->n_node_roles == nn && r->n_node_previews == nn && r->n_node_hashes == nn &&
         r->n_node_ttl == nn && r->n_node_cadence == nn && r->n_node_created == nn &&
         r->n_node_flags == nn;
}

static void summary_from_rec(const cph_turnctx_rec *r, cph_kept_turn *o) {
  o->id = r->turn_id;
  o->kind = (cph_turn_kind_t)r->kind;
  o->episode = r->episode;
  o->created_ms = r->created_ms;
  o->omit = r->omit;
  o->n_messages = r->rows ? r->row_messages : r->n_msg_roles;
  if (r->n_tokens == N_TOKENS) {
    const uint64_t *v = r->tokens;
    o->tokens = (cph_context_tokens){(uint32_t)v[0], (uint32_t)v[1], (uint32_t)v[2], (uint32_t)v[3],
                                     (uint32_t)v[4], (uint32_t)v[5], (uint32_t)v[6], (uint32_t)v[7],
                                     (uint32_t)v[8], (uint32_t)v[9]};
  }
}

int turnlog_list(cph_store *store, const char *session, cph_kept_turn **out, size_t *n,
                 cph_err *err) {
  *out = NULL;
  *n = 0;
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  static const char *const names[] = {"input", "tokens", "msg_roles"};
  uint64_t mask = cph_record_field_mask(&cph_turnctx_desc, names, 3);
  cph_key start = kept_key(session, 0);
  size_t prefix = strlen(session) + 1, cap = 0;
  cph_cursor cur;
  if ((rc = cph_cursor_open(&t, CPH_DB_TURN_KEPT, &cur)) != CPH_OK) {
    cph_err_set(err, rc, "%s", t.err.msg);
    cph_txn_abort(&t);
    return rc;
  }
  cph_val k, v;
  for (rc = cph_cursor_seek(&cur, &start, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&cur, &k, &v)) {
    if (k.len < prefix + 9 || memcmp(k.data, start.data, prefix + 1) != 0)
      break;
    uint64_t turn;
    if (!is_kept_record(&k, start.data, prefix, &turn))
      continue; /* a refs entry */
    cph_turnctx_rec r = {0};
    cph_err derr;
    if (cph_record_decode_some(&cph_turnctx_desc, v.data, v.len, &r, mask, &derr)) {
      rc = cph_err_set(err, CPH_ECORRUPT, "kept context of '%s': %s", session, derr.msg);
      break;
    }
    if (*n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      cph_kept_turn *p = realloc(*out, ncap * sizeof *p);
      if (!p) {
        cph_record_free(&cph_turnctx_desc, &r);
        rc = cph_err_set(err, CPH_ENOMEM, "out of memory");
        break;
      }
      *out = p;
      cap = ncap;
    }
    cph_kept_turn *o = &(*out)[(*n)++];
    memset(o, 0, sizeof *o);
    summary_from_rec(&r, o);
    o->input = r.input;
    r.input = NULL;
    cph_record_free(&cph_turnctx_desc, &r);
  }
  cph_cursor_close(&cur);
  cph_txn_abort(&t);
  if (rc == CPH_ENOTFOUND)
    rc = CPH_OK;
  if (rc) {
    cph_kept_turns_free(*out, *n);
    *out = NULL;
    *n = 0;
  }
  return rc;
}

/* hashes[0..n) as texts from "turn_texts" into *out (n copies). */
static int texts_get(cph_txn *t, const char *session, uint64_t turn, const uint64_t *hashes,
                     uint32_t n, char ***out, uint32_t *n_out, cph_err *err) {
  char **v = calloc(n ? n : 1, sizeof *v);
  if (!v)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  *out = v;
  for (uint32_t i = 0; i < n; i++) {
    cph_key tk = text_key(session, hashes[i]);
    cph_val val;
    int rc = cph_txn_get(t, CPH_DB_TURN_TEXTS, &tk, &val);
    if (rc == CPH_ENOTFOUND)
      return cph_err_set(err, CPH_ECORRUPT,
                         "database \"turn_texts\": the text %016llx of turn %llu of '%s' is "
                         "missing",
                         (unsigned long long)hashes[i], (unsigned long long)turn, session);
    if (rc)
      return cph_err_set(err, rc, "%s", t->err.msg);
    if (!(v[i] = malloc(val.len + 1)))
      return cph_err_set(err, CPH_ENOMEM, "out of memory");
    memcpy(v[i], val.data, val.len);
    v[i][val.len] = '\0';
    *n_out = i + 1;
  }
  return CPH_OK;
}

/* A version-2 record's texts, looked up by hash into msg_contents and node_previews, so the
 * rest reads every record alike. */
static int texts_resolve(cph_txn *t, const char *session, uint64_t turn, cph_turnctx_rec *r,
                         cph_err *err) {
  int rc = CPH_OK;
  if (r->n_msg_hashes && !r->n_msg_contents) {
    free(r->msg_contents); /* the decoded empty array */
    r->msg_contents = NULL;
    rc = texts_get(t, session, turn, r->msg_hashes, r->n_msg_hashes, &r->msg_contents,
                   &r->n_msg_contents, err);
  }
  if (rc == CPH_OK && r->n_node_preview_hashes && !r->n_node_previews) {
    free(r->node_previews);
    r->node_previews = NULL;
    rc = texts_get(t, session, turn, r->node_preview_hashes, r->n_node_preview_hashes,
                   &r->node_previews, &r->n_node_previews, err);
  }
  return rc;
}

/* One kept record; CPH_ENOTFOUND with err saying which turn. */
static int load_rec(cph_txn *t, const char *session, uint64_t turn, const char *field,
                    cph_turnctx_rec *r, cph_err *err) {
  cph_key k = kept_key(session, turn);
  int rc = cph_txn_get_record(t, CPH_DB_TURN_KEPT, &k, &cph_turnctx_desc, r);
  if (rc == CPH_ENOTFOUND)
    return cph_err_set(err, rc, "%s: turn %llu of '%s' is not kept (:context :keep-turns)", field,
                       (unsigned long long)turn, session);
  if (rc)
    return cph_err_set(err, rc, "%s", t->err.msg);
  if (r->rows)
    rc = rows_resolve(t, session, turn, r, err); /* version 3 */
  else
    rc = texts_resolve(t, session, turn, r, err); /* version 2 (version 1 holds its texts) */
  if (rc != CPH_OK)
    return rc;
  if (!rec_consistent(r))
    return cph_err_set(err, CPH_ECORRUPT,
                       "corrupt record in database \"turn_kept\" at turn %llu of '%s': "
                       "its arrays disagree",
                       (unsigned long long)turn, session);
  return CPH_OK;
}

/* The event's sender, body and channel now (any may come back NULL: gone, or redacted). */
static void event_now(cph_txn *t, uint64_t id, char **sender, char **body, char **chan) {
  static const char *const names[] = {"sender", "body", "channel"};
  uint64_t mask = cph_record_field_mask(&cph_event_desc, names, 3);
  cph_event_rec ev = {0};
  cph_key k = cph_key_of_u64(id);
  if (cph_txn_get_record_some(t, CPH_DB_EVENTS, &k, &cph_event_desc, &ev, mask) == CPH_OK) {
    if (sender) {
      *sender = ev.sender;
      ev.sender = NULL;
    }
    if (body) {
      *body = ev.body;
      ev.body = NULL;
    }
    if (chan) {
      *chan = ev.channel;
      ev.channel = NULL;
    }
  }
  cph_record_free(&cph_event_desc, &ev);
}

static const char *memory_kind(uint8_t k) {
  return k == CPH_MEMORY_SUMMARY ? "summary" : k == CPH_MEMORY_AGGREGATE ? "aggregate" : "raw";
}

/* The memory record now; CPH_ENOTFOUND when it is gone. */
static int memory_now(cph_txn *t, uint64_t id, cph_memory_rec *m) {
  cph_key k = cph_key_of_u64(id);
  return cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, m);
}

void cph_turn_context_free(cph_turn_context *c) {
  free(c->turn.input);
  for (size_t i = 0; i < c->n_messages; i++) {
    free(c->messages[i].role);
    free(c->messages[i].content);
    free(c->messages[i].coord);
  }
  free(c->messages);
  free(c->message_nodes);
  cph_kept_item *lists[] = {c->history, c->memories, c->obligations};
  size_t counts[] = {c->n_history, c->n_memories, c->n_obligations};
  for (int l = 0; l < 3; l++) {
    for (size_t i = 0; lists[l] && i < counts[l]; i++) {
      free(lists[l][i].label);
      free(lists[l][i].text);
    }
    free(lists[l]);
  }
  for (size_t i = 0; i < c->n_nodes; i++) {
    free(c->nodes[i].role);
    free(c->nodes[i].content);
  }
  free(c->nodes);
  cph_strv_free(&c->channels);
  cph_strv_free(&c->tools);
  memset(c, 0, sizeof *c);
}

/* Hands r's string array over to v (r's is left empty). */
static void strv_take(cph_strv *v, char ***items, uint32_t *n) {
  v->items = *items;
  v->count = *n;
  *items = NULL;
  *n = 0;
}

static int context_from_rec(cph_txn *t, cph_turnctx_rec *r, cph_turn_context *o) {
  summary_from_rec(r, &o->turn);
  o->turn.input = r->input;
  r->input = NULL;
  size_t m = r->n_msg_roles;
  o->messages = calloc(m ? m : 1, sizeof *o->messages);
  o->message_nodes = calloc(m ? m : 1, sizeof *o->message_nodes);
  o->history = calloc(r->n_history ? r->n_history : 1, sizeof *o->history);
  o->memories = calloc(r->n_memories ? r->n_memories : 1, sizeof *o->memories);
  o->obligations = calloc(r->n_obligations ? r->n_obligations : 1, sizeof *o->obligations);
  o->nodes = calloc(r->n_node_ids ? r->n_node_ids : 1, sizeof *o->nodes);
  if (!o->messages || !o->message_nodes || !o->history || !o->memories || !o->obligations ||
      !o->nodes)
    return CPH_ENOMEM;
  for (size_t i = 0; i < m; i++) { /* handed over from r */
    o->messages[i] = (cph_message){
        .role = r->msg_roles[i], .content = r->msg_contents[i], .coord = r->msg_coords[i]};
    r->msg_roles[i] = r->msg_contents[i] = r->msg_coords[i] = NULL;
    o->message_nodes[i] = r->msg_nodes[i];
  }
  o->n_messages = m;
  for (size_t i = 0; i < r->n_history; i++) {
    cph_kept_item *it = &o->history[o->n_history++];
    it->id = r->history[i];
    event_now(t, it->id, &it->label, &it->text, NULL);
  }
  for (size_t i = 0; i < r->n_memories; i++) {
    cph_kept_item *it = &o->memories[o->n_memories++];
    it->id = r->memories[i];
    cph_memory_rec mr = {0};
    if (memory_now(t, it->id, &mr) == CPH_OK) {
      it->label = strdup(memory_kind(mr.kind));
      it->text = mr.text;
      mr.text = NULL;
    }
    cph_record_free(&cph_memory_desc, &mr);
  }
  for (size_t i = 0; i < r->n_obligations; i++) {
    cph_kept_item *it = &o->obligations[o->n_obligations++];
    it->id = r->obligations[i];
    it->text = r->obligation_texts[i];
    r->obligation_texts[i] = NULL;
  }
  for (size_t i = 0; i < r->n_node_ids; i++) {
    cph_kept_node *nd = &o->nodes[o->n_nodes++];
    nd->id = r->node_ids[i];
    snprintf(nd->at, sizeof nd->at, "%s", r->node_at[i]);
    nd->role = r->node_roles[i][0] ? strdup(r->node_roles[i]) : NULL;
    nd->content = r->node_previews[i];
    r->node_previews[i] = NULL;
    nd->ttl = r->node_ttl[i];
    nd->cadence = r->node_cadence[i];
    nd->created_at_episode = r->node_created[i];
    nd->waiting = r->node_flags[i] & NODE_WAITING;
    nd->stage = NODE_STAGE(r->node_flags[i]);
    nd->n_lifecycle = NODE_STAGES(r->node_flags[i]);
  }
  strv_take(&o->channels, &r->channels, &r->n_channels);
  strv_take(&o->tools, &r->tools, &r->n_tools);
  return CPH_OK;
}

int turnlog_get(cph_store *store, const char *session, uint64_t turn, cph_turn_context *out,
                cph_err *err) {
  memset(out, 0, sizeof *out);
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  cph_turnctx_rec r = {0};
  rc = load_rec(&t, session, turn, "turn", &r, err);
  if (rc == CPH_OK && (rc = context_from_rec(&t, &r, out)) != CPH_OK)
    cph_err_set(err, rc, "out of memory");
  cph_record_free(&cph_turnctx_desc, &r);
  cph_txn_abort(&t);
  if (rc)
    cph_turn_context_free(out);
  return rc;
}

/* ---------------------------------------------------------------- the diff */

typedef struct diff {
  cph_txn *t;
  const cph_turnctx_rec *a, *b; /* from, to */
  bool backwards;               /* from is the later turn */
  cph_context_diff *out;
  size_t cap;
  int rc;
} diff;

/* Appends a change; the strings are copied, detail is handed over. */
static cph_context_change *add(diff *d, const char *part, const char *change, const char *reason,
                               char *detail, uint64_t id) {
  if (d->rc) {
    free(detail);
    return NULL;
  }
  if (d->out->n == d->cap) {
    size_t ncap = d->cap ? d->cap * 2 : 32;
    cph_context_change *p = realloc(d->out->changes, ncap * sizeof *p);
    if (!p) {
      free(detail);
      d->rc = CPH_ENOMEM;
      return NULL;
    }
    d->out->changes = p;
    d->cap = ncap;
  }
  cph_context_change *c = &d->out->changes[d->out->n++];
  *c = (cph_context_change){part, change, reason, detail, id, NULL, NULL, NULL, NULL};
  return c;
}

static void set_strs(diff *d, cph_context_change *c, const char *role, const char *content,
                     const char *at, const char *from_at) {
  if (!c)
    return;
  c->role = role && *role ? strdup(role) : NULL;
  c->content = dup_opt(content);
  c->at = dup_opt(at);
  c->from_at = dup_opt(from_at);
  if ((role && *role && !c->role) || (content && !c->content) || (at && !c->at) ||
      (from_at && !c->from_at))
    d->rc = CPH_ENOMEM;
}

/* Index of node id in r, or -1. */
static long node_index(const cph_turnctx_rec *r, uint64_t id) {
  for (uint32_t i = 0; i < r->n_node_ids; i++)
    if (r->node_ids[i] == id)
      return (long)i;
  return -1;
}

static bool node_live(const cph_turnctx_rec *r, long i) {
  return i >= 0 && !(r->node_flags[i] & NODE_WAITING);
}

/* Why node i of a is not rendered in b; *detail gets a sentence (may stay NULL). */
static const char *node_left_reason(const diff *d, uint32_t i, char **detail) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  long j = node_index(b, a->node_ids[i]);
  int64_t ttl = a->node_ttl[i], cadence = a->node_cadence[i];
  uint64_t created = a->node_created[i], flags = a->node_flags[i];
  bool expired = ttl >= 1 && b->episode >= created + (uint64_t)ttl;
  if (j >= 0) { /* still in the tree, not rendered: waiting for its cadence */
    *detail =
        fmt("ttl %lld from episode %llu expired at episode %llu; it waits to be re-created "
            "every %lld episodes",
            (long long)ttl, (unsigned long long)created,
            (unsigned long long)(created + (uint64_t)(ttl > 0 ? ttl : 0)), (long long)cadence);
    return "cadence";
  }
  if (d->backwards && created >= b->episode) {
    *detail =
        fmt("created at episode %llu, after turn %llu (episode %llu)", (unsigned long long)created,
            (unsigned long long)b->turn_id, (unsigned long long)b->episode);
    return "not_yet_created";
  }
  if (d->backwards)
    return "unknown";
  if (expired && NODE_STAGES(flags) && NODE_STAGE(flags) + 1 >= NODE_STAGES(flags)) {
    *detail = fmt("its last lifecycle stage (ttl %lld from episode %llu) ended at episode %llu",
                  (long long)ttl, (unsigned long long)created,
                  (unsigned long long)(created + (uint64_t)ttl));
    return "lifecycle";
  }
  if (expired) {
    *detail = fmt("ttl %lld from episode %llu: expired at episode %llu%s", (long long)ttl,
                  (unsigned long long)created, (unsigned long long)(created + (uint64_t)ttl),
                  cadence ? " (its cadence re-creates it as a new node)" : "");
    return "ttl_expired";
  }
  if (a->node_roles[i][0]) {
    *detail = strdup("an old message core pruned from the tree (the history bound)");
    return "history_bound";
  }
  *detail = strdup("no TTL, cadence or lifecycle removes it by then: deleted through the API");
  return "deleted";
}

/* Version 1 hashed node contents with FNV-1a, version 2 with text_hash: between two records
 * of different versions (the turns around an upgrade) the previews stand in for the hashes. */
static bool hashes_v2(const cph_turnctx_rec *r) {
  return r->n_node_preview_hashes > 0 || r->n_msg_hashes > 0;
}

static bool same_content(const cph_turnctx_rec *a, uint32_t i, const cph_turnctx_rec *b,
                         uint32_t j) {
  if (hashes_v2(a) == hashes_v2(b))
    return a->node_hashes[i] == b->node_hashes[j];
  return strcmp(a->node_previews[i], b->node_previews[j]) == 0;
}

/* Why node j of b is rendered in b and was not in a. */
static const char *node_entered_reason(const diff *d, uint32_t j, char **detail) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  if (b->node_cadence[j] > 0) { /* a re-creation: same place and content, a new id */
    for (uint32_t i = 0; i < a->n_node_ids; i++) {
      if (a->node_ids[i] != b->node_ids[j] && same_content(a, i, b, j) &&
          strcmp(a->node_at[i], b->node_at[j]) == 0) {
        *detail = fmt("re-created at episode %llu by its cadence (every %lld episodes) from node "
                      "%llu",
                      (unsigned long long)b->node_created[j], (long long)b->node_cadence[j],
                      (unsigned long long)a->node_ids[i]);
        return "cadence";
      }
    }
  }
  if (b->node_roles[j][0]) {
    *detail = fmt("a message core: the %s of a completed turn",
                  strcmp(b->node_roles[j], "assistant") == 0 ? "reply" : "input");
    return "new";
  }
  *detail = fmt("created at episode %llu", (unsigned long long)b->node_created[j]);
  return "inserted";
}

static void diff_nodes(diff *d) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  for (uint32_t i = 0; i < a->n_node_ids && !d->rc; i++) {
    if (a->node_flags[i] & NODE_WAITING)
      continue;
    long j = node_index(b, a->node_ids[i]);
    if (node_live(b, j)) {
      bool moved = strcmp(a->node_at[i], b->node_at[j]) != 0;
      bool content = !same_content(a, i, b, (uint32_t)j);
      if (a->node_roles[i][0] || (!moved && !content))
        continue; /* cores move every turn: not listed */
      char *detail = NULL;
      const char *reason = "content";
      if (moved) {
        reason = "moved";
        detail = NODE_STAGE(a->node_flags[i]) != NODE_STAGE(b->node_flags[j])
                     ? fmt("lifecycle stage %u -> %u", NODE_STAGE(a->node_flags[i]),
                           NODE_STAGE(b->node_flags[j]))
                     : strdup("the ODI shift: permanent and sticky nodes follow the messages");
      }
      cph_context_change *c = add(d, "node", "changed", reason, detail, a->node_ids[i]);
      set_strs(d, c, b->node_roles[j], b->node_previews[j], b->node_at[j],
               moved ? a->node_at[i] : NULL);
      continue;
    }
    char *detail = NULL;
    const char *reason = node_left_reason(d, i, &detail);
    cph_context_change *c = add(d, "node", "left", reason, detail, a->node_ids[i]);
    set_strs(d, c, a->node_roles[i], a->node_previews[i], a->node_at[i], NULL);
  }
  for (uint32_t j = 0; j < b->n_node_ids && !d->rc; j++) {
    if ((b->node_flags[j] & NODE_WAITING) || node_live(a, node_index(a, b->node_ids[j])))
      continue;
    char *detail = NULL;
    const char *reason = node_entered_reason(d, j, &detail);
    cph_context_change *c = add(d, "node", "entered", reason, detail, b->node_ids[j]);
    set_strs(d, c, b->node_roles[j], b->node_previews[j], b->node_at[j], NULL);
  }
}

static bool omitted(const diff *d, unsigned part) {
  return (d->a->omit & part) || (d->b->omit & part);
}

static bool same_message(const cph_turnctx_rec *a, uint32_t i, const cph_turnctx_rec *b,
                         uint32_t j) {
  return strcmp(a->msg_roles[i], b->msg_roles[j]) == 0 &&
         strcmp(a->msg_contents[i], b->msg_contents[j]) == 0;
}

static bool channels_overlap(const cph_turnctx_rec *a, const cph_turnctx_rec *b) {
  for (uint32_t i = 0; i < a->n_channels; i++)
    if (strs_has(b->channels, b->n_channels, a->channels[i]))
      return true;
  return false;
}

/* Why message i of a is not in b. */
static const char *message_left_reason(const diff *d, uint32_t i, char **detail) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  uint64_t node = a->msg_nodes[i];
  if (node) {
    long ai = node_index(a, node), bj = node_index(b, node);
    if (node_live(b, bj)) {
      *detail = strdup(b->kind == CPH_TURN_INBOX
                           ? "its node is still there: on an inbox turn the channel view "
                             "replaces the tree's message cores"
                           : "its node is still there, but not rendered");
      return "turn_kind";
    }
    if (ai >= 0)
      return node_left_reason(d, (uint32_t)ai, detail);
  }
  long depth = coord_depth(a->msg_coords[i]);
  if (depth >= 1 && b->tokens[9] > 0) {
    *detail = fmt("turn %llu cut %llu history messages, oldest first, to fit its window",
                  (unsigned long long)b->turn_id, (unsigned long long)b->tokens[9]);
    return "window_budget";
  }
  if (a->kind != b->kind) {
    *detail = fmt("turn %llu is a turn of another kind: %s", (unsigned long long)b->turn_id,
                  cph_turn_kind_name((cph_turn_kind_t)b->kind));
    return "turn_kind";
  }
  if (a->n_channels && !channels_overlap(a, b)) {
    *detail = strdup("turn's messages came from other channels");
    return "not_in_scope";
  }
  return "unknown";
}

static void diff_messages(diff *d) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  if (omitted(d, CPH_PART_MESSAGES))
    return;
  uint32_t na = a->n_msg_roles, nb = b->n_msg_roles;
  long *match = malloc((na ? na : 1) * sizeof *match); /* a's message -> b's, -1 none */
  bool *taken = calloc(nb ? nb : 1, sizeof *taken);
  if (!match || !taken) {
    d->rc = CPH_ENOMEM;
    goto out;
  }
  /* Same message at the same place first, then the same message anywhere. */
  for (uint32_t i = 0; i < na; i++) {
    match[i] = -1;
    for (uint32_t j = 0; j < nb; j++)
      if (!taken[j] && same_message(a, i, b, j) &&
          strcmp(a->msg_coords[i], b->msg_coords[j]) == 0) {
        match[i] = j;
        taken[j] = true;
        break;
      }
  }
  for (uint32_t i = 0; i < na; i++) {
    for (uint32_t j = 0; match[i] < 0 && j < nb; j++)
      if (!taken[j] && same_message(a, i, b, j)) {
        match[i] = j;
        taken[j] = true;
      }
  }
  for (uint32_t i = 0; i < na && !d->rc; i++) {
    long j = match[i];
    if (j >= 0) {
      if (strcmp(a->msg_coords[i], b->msg_coords[j]) == 0)
        continue;
      cph_context_change *c = add(d, "message", "changed", "moved", NULL, b->msg_nodes[j]);
      set_strs(d, c, b->msg_roles[j], b->msg_contents[j], b->msg_coords[j], a->msg_coords[i]);
      continue;
    }
    char *detail = NULL;
    const char *reason = message_left_reason(d, i, &detail);
    cph_context_change *c = add(d, "message", "left", reason, detail, a->msg_nodes[i]);
    set_strs(d, c, a->msg_roles[i], a->msg_contents[i], a->msg_coords[i], NULL);
  }
  for (uint32_t j = 0; j < nb && !d->rc; j++) {
    if (taken[j])
      continue;
    char *detail = NULL;
    const char *reason;
    long bj = b->msg_nodes[j] ? node_index(b, b->msg_nodes[j]) : -1;
    if (bj >= 0 && !node_live(a, node_index(a, b->msg_nodes[j])))
      reason = node_entered_reason(d, (uint32_t)bj, &detail);
    else if (strcmp(b->msg_coords[j], "d0, 0, 0") == 0)
      reason = "staged", detail = strdup("the turn's current message");
    else
      reason = "new";
    cph_context_change *c = add(d, "message", "entered", reason, detail, b->msg_nodes[j]);
    set_strs(d, c, b->msg_roles[j], b->msg_contents[j], b->msg_coords[j], NULL);
  }
out:
  free(match);
  free(taken);
}

static uint64_t min_id(const uint64_t *ids, size_t n) {
  uint64_t m = UINT64_MAX;
  for (size_t i = 0; i < n; i++)
    if (ids[i] < m)
      m = ids[i];
  return m;
}

static void diff_history(diff *d) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  if (omitted(d, CPH_PART_HISTORY))
    return;
  for (uint32_t i = 0; i < a->n_history && !d->rc; i++) {
    uint64_t id = a->history[i];
    if (ids_has(b->history, b->n_history, id))
      continue;
    char *sender = NULL, *body = NULL, *chan = NULL, *detail = NULL;
    event_now(d->t, id, &sender, &body, &chan);
    const char *reason = "unknown";
    if (b->kind != CPH_TURN_INBOX) {
      reason = "turn_kind";
      detail = fmt("turn %llu is a %s: it has no conversation_history",
                   (unsigned long long)b->turn_id, cph_turn_kind_name((cph_turn_kind_t)b->kind));
    } else if (b->tokens[8] > 0 && id < min_id(b->history, b->n_history)) {
      reason = "window_budget";
      detail = fmt("turn %llu cut %llu older entries to fit its history budget",
                   (unsigned long long)b->turn_id, (unsigned long long)b->tokens[8]);
    } else if (chan && !strs_has(b->channels, b->n_channels, chan)) {
      reason = "not_in_scope";
      detail = fmt("history of channel %s, which turn %llu does not show", chan,
                   (unsigned long long)b->turn_id);
    } else if (!chan) {
      reason = "deleted";
      detail = strdup("the event is no longer stored (retention)");
    }
    cph_context_change *c = add(d, "conversation_history", "left", reason, detail, id);
    set_strs(d, c, sender, body, chan, NULL);
    free(sender);
    free(body);
    free(chan);
  }
  for (uint32_t j = 0; j < b->n_history && !d->rc; j++) {
    uint64_t id = b->history[j];
    if (ids_has(a->history, a->n_history, id))
      continue;
    char *sender = NULL, *body = NULL, *chan = NULL;
    event_now(d->t, id, &sender, &body, &chan);
    const char *reason = ids_has(a->staged_events, a->n_staged_events, id) ? "staged" : "new";
    char *detail = strcmp(reason, "staged") == 0 ? fmt("a staged message of turn %llu, now history",
                                                       (unsigned long long)a->turn_id)
                                                 : NULL;
    cph_context_change *c = add(d, "conversation_history", "entered", reason, detail, id);
    set_strs(d, c, sender, body, chan, NULL);
    free(sender);
    free(body);
    free(chan);
  }
}

static void diff_memories(diff *d) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  if (omitted(d, CPH_PART_MEMORY))
    return;
  uint64_t newest_b = 0;
  for (uint32_t j = 0; j < b->n_memories; j++)
    if (b->memories[j] > newest_b)
      newest_b = b->memories[j];
  for (uint32_t i = 0; i < a->n_memories && !d->rc; i++) {
    uint64_t id = a->memories[i];
    if (ids_has(b->memories, b->n_memories, id))
      continue;
    cph_memory_rec m = {0};
    int rc = memory_now(d->t, id, &m);
    const char *reason = "unknown";
    char *detail = NULL;
    if (rc == CPH_ENOTFOUND) {
      reason = "deleted";
    } else if (rc) {
      d->rc = rc;
    } else if (m.deleted && m.replaced_by) {
      reason = "compaction";
      detail = fmt("compacted into summary %llu", (unsigned long long)m.replaced_by);
    } else if (m.deleted) {
      reason = "deleted";
    } else if (m.source_event_id &&
               (ids_has(b->history, b->n_history, m.source_event_id) ||
                ids_has(b->staged_events, b->n_staged_events, m.source_event_id))) {
      reason = "shown_as_history";
      detail = fmt("minted from event %llu, which turn %llu shows itself",
                   (unsigned long long)m.source_event_id, (unsigned long long)b->turn_id);
    } else if (m.session && m.session[0] == '#' && b->kind == CPH_TURN_INBOX &&
               !strs_has(b->channels, b->n_channels, m.session + 1)) {
      reason = "not_in_scope";
      detail = fmt("a memory of %s, a channel turn %llu does not show", m.session,
                   (unsigned long long)b->turn_id);
    } else if (newest_b > id) {
      reason = "window_budget";
      detail = strdup("newer memories filled the memory budget");
    }
    cph_context_change *c = add(d, "recent_memory", "left", reason, detail, id);
    set_strs(d, c, m.session ? memory_kind(m.kind) : NULL, m.text, m.session, NULL);
    cph_record_free(&cph_memory_desc, &m);
  }
  for (uint32_t j = 0; j < b->n_memories && !d->rc; j++) {
    uint64_t id = b->memories[j];
    if (ids_has(a->memories, a->n_memories, id))
      continue;
    cph_memory_rec m = {0};
    int rc = memory_now(d->t, id, &m);
    const char *reason = rc == CPH_OK && m.created_ms > a->created_ms ? "new" : "unknown";
    cph_context_change *c = add(d, "recent_memory", "entered", reason, NULL, id);
    set_strs(d, c, rc == CPH_OK ? memory_kind(m.kind) : NULL, m.text, m.session, NULL);
    cph_record_free(&cph_memory_desc, &m);
  }
}

static void diff_obligations(diff *d) {
  const cph_turnctx_rec *a = d->a, *b = d->b;
  if (omitted(d, CPH_PART_OBLIGATIONS))
    return;
  cph_turn_rec tr = {0};
  cph_key k = cph_key_of_u64(a->turn_id);
  bool completed =
      cph_txn_get_record_some(d->t, CPH_DB_TURNS, &k, &cph_turn_desc, &tr, 0) == CPH_OK &&
      tr.state == CPH_TURN_COMPLETED;
  cph_record_free(&cph_turn_desc, &tr);
  for (uint32_t i = 0; i < a->n_obligations && !d->rc; i++) {
    uint64_t id = a->obligations[i];
    if (ids_has(b->obligations, b->n_obligations, id))
      continue;
    const char *reason = completed && !d->backwards ? "consumed" : "unknown";
    char *detail = completed && !d->backwards
                       ? fmt("turn %llu completed and answered it", (unsigned long long)a->turn_id)
                       : NULL;
    cph_context_change *c = add(d, "pending_obligations", "left", reason, detail, id);
    set_strs(d, c, NULL, a->obligation_texts[i], NULL, NULL);
  }
  for (uint32_t j = 0; j < b->n_obligations && !d->rc; j++) {
    if (ids_has(a->obligations, a->n_obligations, b->obligations[j]))
      continue;
    cph_context_change *c =
        add(d, "pending_obligations", "entered", "staged", NULL, b->obligations[j]);
    set_strs(d, c, NULL, b->obligation_texts[j], NULL, NULL);
  }
}

void cph_context_diff_free(cph_context_diff *d) {
  free(d->from.input);
  free(d->to.input);
  for (size_t i = 0; i < d->n; i++) {
    cph_context_change *c = &d->changes[i];
    free(c->detail);
    free(c->role);
    free(c->content);
    free(c->at);
    free(c->from_at);
  }
  free(d->changes);
  memset(d, 0, sizeof *d);
}

int turnlog_diff(cph_store *store, const char *session, uint64_t from, uint64_t to,
                 cph_context_diff *out, cph_err *err) {
  memset(out, 0, sizeof *out);
  cph_txn t;
  int rc = cph_txn_begin(store, false, &t);
  if (rc)
    return cph_err_set(err, rc, "%s", t.err.msg);
  cph_turnctx_rec a = {0}, b = {0};
  rc = load_rec(&t, session, from, "from", &a, err);
  if (rc == CPH_OK)
    rc = load_rec(&t, session, to, "to", &b, err);
  if (rc == CPH_OK) {
    summary_from_rec(&a, &out->from);
    summary_from_rec(&b, &out->to);
    out->from.input = a.input;
    out->to.input = b.input;
    a.input = b.input = NULL;
    diff d = {&t, &a, &b, from > to, out, 0, CPH_OK};
    diff_nodes(&d);
    diff_messages(&d);
    diff_history(&d);
    diff_memories(&d);
    diff_obligations(&d);
    if ((rc = d.rc) != CPH_OK)
      cph_err_set(err, rc, "comparing turns %llu and %llu of '%s': %s", (unsigned long long)from,
                  (unsigned long long)to, session, cph_strerror(rc));
  }
  cph_record_free(&cph_turnctx_desc, &a);
  cph_record_free(&cph_turnctx_desc, &b);
  cph_txn_abort(&t);
  if (rc)
    cph_context_diff_free(out);
  return rc;
}

/* ---------------------------------------------------------------- carried (handover) */

int turnlog_newest(cph_txn *t, const char *session, size_t max,
                   int (*fn)(void *ctx, cph_turnctx_rec *r), void *ctx) {
  /* the newest max turn ids first, then each record read (load_rec) and handed over */
  uint64_t ids[TURNLOG_CARRY_MAX];
  size_t n = 0;
  int rc = newest_kepts(t, session, max < TURNLOG_CARRY_MAX ? max : TURNLOG_CARRY_MAX, ids, &n);
  for (size_t i = 0; rc == CPH_OK && i < n; i++) {
    cph_turnctx_rec r = {0};
    cph_err err = {0};
    rc = load_rec(t, session, ids[i], "kept turn", &r, &err);
    if (rc == CPH_OK) {
      /* self-contained: the texts inline, no hashes, no rows */
      r.n_msg_hashes = r.n_node_preview_hashes = 0;
      r.rows = false;
      r.row_messages = 0;
      /* the sections' items are this node's ids (events, memories, inbox messages), whose
       * texts the explorer reads from the store: elsewhere they would name other items, so
       * those parts go as omitted (the diff says it cannot compare them) */
      for (uint32_t j = 0; j < r.n_obligation_texts; j++)
        free(r.obligation_texts[j]);
      r.n_obligation_texts = r.n_obligations = r.n_history = r.n_memories = 0;
      r.n_staged_events = 0;
      r.omit |= CPH_PART_OBLIGATIONS | CPH_PART_HISTORY | CPH_PART_MEMORY | CPH_PART_STAGED;
      rc = fn(ctx, &r);
    } else if (rc != CPH_ENOMEM) {
      cph_log(CPH_LOG_WARN, "the kept turn %llu of '%s' is not carried: %s",
              (unsigned long long)ids[i], session, err.msg);
      rc = CPH_OK; /* an unreadable kept context is not carried, the state still goes */
    }
    cph_record_free(&cph_turnctx_desc, &r);
  }
  return rc;
}

const char *turnlog_carried_problem(const cph_turnctx_rec *r, const char *session) {
  if (!r->session || strcmp(r->session, session) != 0)
    return "another session's";
  if (r->rows || r->n_msg_hashes || r->n_node_preview_hashes)
    return "not self-contained (rows or texts by hash)";
  if (!rec_consistent(r))
    return "its arrays disagree";
  return NULL;
}

int turnlog_import(cph_turnlog *tl, cph_txn *t, uint64_t turn, cph_turnctx_rec *r) {
  uint64_t keep = (uint64_t)tl->env->policy->context.keep_turns;
  if (keep == 0)
    return CPH_OK; /* the new owner keeps none */
  turnwarms_drop(&tl->warm, r->session); /* rebuilt from the store below, and dropped again */
  cph_key k = kept_key(r->session, turn);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_TURN_KEPT, &k, &v);
  if (rc != CPH_ENOTFOUND)
    return rc; /* CPH_OK: kept here already */
  uint64_t was = r->turn_id;
  r->turn_id = turn;
  rc = cph_txn_put_record(t, CPH_DB_TURN_KEPT, &k, &cph_turnctx_desc, r);
  r->turn_id = was;
  turnwarm *w = NULL;
  kept_writes kw = {CPH_BUF_INIT};
  if (rc == CPH_OK)
    rc = warm_for(tl, t, r->session, &w);
  if (rc == CPH_OK)
    rc = trim(t, &kw, w, r->session, keep);
  if (rc == CPH_OK)
    rc = kw_apply(&kw, t);
  cph_buf_free(&kw.b);
  turnwarms_drop(&tl->warm, r->session);
  return rc;
}
