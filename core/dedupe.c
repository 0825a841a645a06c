/* Exact and near content dedupe and duplicate families (DESIGN §5); contract in dedupe.h.
 *
 * Stored (CPH_DB_DEDUPE), values encoded by hand, big-endian, led by a version byte:
 *   0xFF be64(last_ms) sha256(channel, sender, normalised body)
 *                                -> v1, family, original event id, first_ms, last_ms,
 *                                   simhash (41 B): an exact entry, time-ordered
 *   ""\0 sha256(normalised body) -> v1, family (9 B): the family index, content -> family
 *
 * Exact entries are keyed by the time of their last occurrence, so an ingest pass writes them
 * at the B-tree's end (a few pages) rather than on a random page each, and pruning deletes
 * from the front. A repeat writes a new copy under its new time and leaves the older copy,
 * which is stale from then on, for the pruning to delete: the newest copy of a hash is the
 * entry. Which copy that is lives in memory (the filter below), rebuilt at open by reading the
 * copies oldest first; so an event whose hash is new reads nothing from LMDB.
 *
 * Migration: up to schema version 2 without this layout, exact entries were keyed
 * channel\0 sha256(...). dedupe_open moves such entries into the time-ordered layout (same
 * value) in one write transaction, once; a store written before keeps working, no schema
 * bump. A channel name is never empty, so the family index (a key starting \0) never
 * collided with them; the time-ordered keys start with 0xFF, which no UTF-8 channel name
 * does.
 *
 * A value that does not decode is logged with its key and treated as absent (it is an
 * index: the next write replaces it). */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hmap.h"
#include "common/log.h"
#include "dedupe.h"
#include "simidx.h"
#include "store/store.h"

#define ENTRY_VERSION 1
#define ENTRY_LEN 41
#define INDEX_LEN 9
#define XKEY_TAG 0xFF /* first byte of a time-ordered exact entry's key */
#define XKEY_LEN 41   /* XKEY_TAG, be64 last_ms, sha256 */
#define XS_MIN_CAP 1024 /* the filter's smallest table */
#define XS_NONE SIZE_MAX
#define RING_MIN 4 /* rings start small: most channels see few distinct messages */
#define INDEX_MIN_LEN 64 /* below this many entries a linear scan is as fast as the index */
/* Expired exact entries looked at per check: this, plus twice the entries added since the
 * last check, so pruning keeps up with any ingest rate (amortised O(1) per event). */
#define PRUNE_BASE 512
#define SWEEP_PERIOD_MS 10000 /* how often idle rings are freed */
#define PRUNE_PERIOD_MS 1000  /* how often expired exact entries are pruned */

typedef struct ring_entry {
  uint64_t family; /* 0 = none yet */
  uint64_t event_id;
  int64_t first_ms;
  int64_t last_ms; /* the window slides from here */
  uint64_t idsig;  /* dedupe_idsig() of its text: near duplicates must agree on it */
  uint64_t sender; /* fnv1a64 of its sender: sender-only bulk folds within one sender */
} ring_entry;

/* Recent simhashes of one channel: a circular buffer that grows from RING_MIN to
 * DEDUPE_RING_MAX; when full the oldest entry is overwritten. The hashes sit in their own
 * array so a scan reads 8 bytes per entry and touches an entry's rest only when it is near
 * enough to matter. From INDEX_MIN_LEN entries on, a banded index (simidx.h) over the ring's
 * slots narrows the lookup to the entries that share a band with the query. */
typedef struct dd_channel {
  char *name;
  uint64_t *hashes;
  ring_entry *ring;
  uint32_t cap, len; /* occupied slots: 0..len-1 (all of them once full) */
  uint32_t next;     /* where the next push goes: the oldest entry once full */
  int64_t last_ms;
  simidx idx; /* bands == 0: none (built by dedupe_classify, for :near-distance + 1 bands) */
} dd_channel;

typedef struct top_entry {
  uint64_t family;
  uint64_t count;
} top_entry;

/* One slot of the exact-entry filter: a hash's first 8 bytes (never 0: 0 marks an empty
 * slot) and the time of its newest stored copy — together they name that copy's key, where
 * the entry itself is read (only for a slot whose tag matches: a repeat, or one tag collision
 * in 2^64). */
typedef struct xslot {
  uint64_t tag;
  int64_t last_ms;
} xslot;

/* A slot as it was before a request changed it (dedupe_rollback puts it back). */
typedef struct xundo {
  size_t pos;
  xslot before;
} xundo;

typedef struct cph_dedupe {
  cph_hmap channels; /* name -> dd_channel */
  /* The exact entries of the window: open addressing, linear probing, a power-of-two table at
   * most 3/4 full; deletes (pruning only) shift the probe chain back, so there are no
   * tombstones. A request never grows the table (dedupe_savepoint reserves its room) and
   * never deletes, so its undo log of slot positions stays valid. */
  xslot *xs;
  size_t xs_cap, xs_len;
  xundo *undo;
  size_t n_undo, cap_undo;
  EVP_MD_CTX *md;
  EVP_MD *sha256; /* fetched once: EVP_sha256() in a digest init fetches it on every call */
  int64_t next_prune_ms; /* dedupe_tick prunes at most once a second */
  uint64_t exact_hits, near_hits, families;
  /* The top families by count, largest first. Exact, not an estimate: counts only grow and
   * every increment passes through top_note, so a family outside the list can never exceed
   * its smallest member. */
  top_entry top[DEDUPE_TOP_MAX];
  size_t n_top;
  uint64_t added_since_prune;
  int64_t next_sweep_ms;
  /* dedupe_savepoint(): the counters and the top list as they were. */
  struct {
    uint64_t exact_hits, near_hits, families, added_since_prune;
    top_entry top[DEDUPE_TOP_MAX];
    size_t n_top;
  } saved;
} cph_dedupe;

/* ---------------------------------------------------------------- pure helpers */

static bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

char *dedupe_normalise(const char *body, size_t *len) {
  size_t n = strlen(body);
  char *out = malloc(n + 1);
  if (!out)
    return NULL;
  size_t o = 0;
  bool space = false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)body[i];
    if (is_space(c)) {
      space = o > 0; /* leading whitespace is dropped, trailing never flushed */
      continue;
    }
    if (space)
      out[o++] = ' ';
    space = false;
    out[o++] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
  }
  out[o] = '\0';
  *len = o;
  return out;
}

static uint64_t fnv1a64(const char *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint8_t)p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* splitmix64's finaliser: FNV's low bits are weak, and simhash needs every bit independent. */
static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* SPREAD[x]: byte j is bit j of x. Adding SPREAD[one byte of a hash] to a word of 8 byte-wide
 * counters counts that byte's 8 bits at once. */
#define SPREAD_(x)                                                                              \
  ((uint64_t)((x) & 1) | (uint64_t)(((x) >> 1) & 1) << 8 | (uint64_t)(((x) >> 2) & 1) << 16 |  \
   (uint64_t)(((x) >> 3) & 1) << 24 | (uint64_t)(((x) >> 4) & 1) << 32 |                       \
   (uint64_t)(((x) >> 5) & 1) << 40 | (uint64_t)(((x) >> 6) & 1) << 48 |                       \
   (uint64_t)(((x) >> 7) & 1) << 56)
#define SPREAD4_(n) SPREAD_(n), SPREAD_(n + 1), SPREAD_(n + 2), SPREAD_(n + 3)
#define SPREAD16_(n) SPREAD4_(n), SPREAD4_(n + 4), SPREAD4_(n + 8), SPREAD4_(n + 12)
#define SPREAD64_(n) SPREAD16_(n), SPREAD16_(n + 16), SPREAD16_(n + 32), SPREAD16_(n + 48)
static const uint64_t SPREAD[256] = {SPREAD64_(0), SPREAD64_(64), SPREAD64_(128),
                                     SPREAD64_(192)};

/* The votes of Charikar's simhash, kept as counts of 1 bits per hash bit: +1/-1 per shingle
 * on bit b is positive exactly when ones[b] * 2 > shingles. Byte-wide counters in `lanes`
 * (bit 8i+j of the hashes in byte j of lanes[i]) take up to 255 shingles before they are
 * flushed into `ones`: 8 additions per shingle, not 64. */
typedef struct sim_votes {
  uint64_t lanes[8];
  uint32_t ones[64];
  uint32_t in_lanes, shingles;
} sim_votes;

static void votes_flush(sim_votes *sv) {
  for (int i = 0; i < 8; i++) {
    for (int j = 0; j < 8; j++)
      sv->ones[8 * i + j] += (uint32_t)(sv->lanes[i] >> (8 * j)) & 0xFF;
    sv->lanes[i] = 0;
  }
  sv->in_lanes = 0;
}

static void simhash_add(sim_votes *sv, const char *p, size_t n) {
  uint64_t h = mix64(fnv1a64(p, n));
  for (int i = 0; i < 8; i++)
    sv->lanes[i] += SPREAD[(h >> (8 * i)) & 0xFF];
  sv->shingles++;
  if (++sv->in_lanes == 255)
    votes_flush(sv);
}

/* Charikar's simhash: each shingle votes +1/-1 on every bit by its hash; a bit is set when
 * the votes are positive. Words in a normalised text are separated by exactly one space. */
uint64_t dedupe_simhash(const char *s, size_t len, int k) {
  if (!len)
    return 0;
  if (k < 1)
    k = 1;
  if (k > 64)
    k = 64;
  sim_votes v;
  memset(&v, 0, sizeof v);
  size_t starts[64]; /* the last k word starts, circular */
  size_t nw = 0;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    while (i < len && s[i] != ' ')
      i++;
    starts[nw % (size_t)k] = start;
    nw++;
    if (nw >= (size_t)k) {
      size_t from = starts[(nw - (size_t)k) % (size_t)k];
      simhash_add(&v, s + from, i - from);
    }
    i++; /* the space */
  }
  if (nw < (size_t)k)
    simhash_add(&v, s, len); /* fewer words than a shingle: the whole text is one */
  votes_flush(&v);
  uint64_t h = 0;
  for (int b = 0; b < 64; b++)
    if ((uint64_t)v.ones[b] * 2 > v.shingles)
      h |= 1ull << b;
  return h;
}

/* SWAR popcount: without -mpopcnt the builtin is a libgcc call, and the ring scan does up to
 * DEDUPE_RING_MAX of these per event. */
int dedupe_hamming(uint64_t a, uint64_t b) {
  uint64_t x = a ^ b;
  x -= (x >> 1) & 0x5555555555555555ull;
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return (int)((x * 0x0101010101010101ull) >> 56);
}

static bool is_alnum(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}

/* A word is identifier-like when, trimmed of leading and trailing punctuation, it holds a
 * digit or one of _ . / : @ # - between its characters ("build-41", "db_main", "10.0.0.5",
 * "host:beta", "#4411"). Its signature hashes those words in order, so two texts that differ
 * in a number or an identifier never share one. */
uint64_t dedupe_idsig(const char *norm, size_t len) {
  uint64_t h = 0xcbf29ce484222325ull;
  bool any = false;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    while (i < len && norm[i] != ' ')
      i++;
    size_t a = start, b = i;
    i++;
    while (a < b && !is_alnum((unsigned char)norm[a]) && norm[a] != '#')
      a++;
    while (b > a && !is_alnum((unsigned char)norm[b - 1]))
      b--;
    bool ident = false;
    for (size_t j = a; j < b && !ident; j++) {
      unsigned char c = (unsigned char)norm[j];
      ident = (c >= '0' && c <= '9') ||
              ((c == '_' || c == '.' || c == '/' || c == ':' || c == '@' || c == '#' ||
                c == '-') &&
               j + 1 < b);
    }
    if (!ident)
      continue;
    any = true;
    for (size_t j = a; j < b; j++) {
      h ^= (uint8_t)norm[j];
      h *= 0x100000001b3ull;
    }
    h ^= 0xff; /* word separator */
    h *= 0x100000001b3ull;
  }
  return any ? h : 0;
}

/* ---------------------------------------------------------------- keys and values */

static void key_bytes(cph_key *k, const uint8_t *p, size_t n) {
  if (k->len + n > CPH_KEY_MAX) {
    k->overflow = true;
    return;
  }
  memcpy(k->data + k->len, p, n);
  k->len += n;
}

/* A time-ordered exact entry's key. */
static cph_key xkey(int64_t last_ms, const uint8_t sha[32]) {
  cph_key k;
  k.data[0] = XKEY_TAG;
  cph_be64_put(k.data + 1, (uint64_t)last_ms);
  memcpy(k.data + 9, sha, 32);
  k.len = XKEY_LEN;
  k.overflow = false;
  return k;
}

static cph_key index_key(const uint8_t content_sha[32]) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "");
  key_bytes(&k, content_sha, 32);
  return k;
}

static cph_key family_key(uint64_t family) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, family);
  return k;
}

typedef struct dd_entry {
  uint64_t family;
  uint64_t event_id;
  int64_t first_ms;
  int64_t last_ms;
  uint64_t simhash;
} dd_entry;

static void entry_encode(const dd_entry *d, uint8_t out[ENTRY_LEN]) {
  out[0] = ENTRY_VERSION;
  cph_be64_put(out + 1, d->family);
  cph_be64_put(out + 9, d->event_id);
  cph_be64_put(out + 17, (uint64_t)d->first_ms);
  cph_be64_put(out + 25, (uint64_t)d->last_ms);
  cph_be64_put(out + 33, d->simhash);
}

static bool entry_decode(const cph_val *v, dd_entry *d) {
  const uint8_t *p = v->data;
  if (v->len != ENTRY_LEN || p[0] != ENTRY_VERSION)
    return false;
  d->family = cph_be64_get(p + 1);
  d->event_id = cph_be64_get(p + 9);
  d->first_ms = (int64_t)cph_be64_get(p + 17);
  d->last_ms = (int64_t)cph_be64_get(p + 25);
  d->simhash = cph_be64_get(p + 33);
  return true;
}

static void log_bad_value(const cph_key *k, size_t len) {
  char desc[160];
  cph_key_describe(k->data, k->len, desc, sizeof desc);
  cph_error("corrupt record in database \"dedupe\" at key %s: %zu bytes, not a v%d entry; "
            "ignored (it is rewritten on the next write)",
            desc, len, ENTRY_VERSION);
}

/* CPH_OK with *d, or CPH_ENOTFOUND (also for a value that does not decode). */
static int entry_get(cph_txn *t, const cph_key *k, dd_entry *d) {
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_DEDUPE, k, &v);
  if (rc)
    return rc;
  if (!entry_decode(&v, d)) {
    log_bad_value(k, v.len);
    return CPH_ENOTFOUND;
  }
  return CPH_OK;
}

static int entry_put(cph_txn *t, const cph_key *k, const dd_entry *d) {
  uint8_t v[ENTRY_LEN];
  entry_encode(d, v);
  return cph_txn_put(t, CPH_DB_DEDUPE, k, v, sizeof v);
}

static void sha256_of(cph_dedupe *d, const char *const *parts, const size_t *lens, int n,
                      uint8_t out[32]) {
  unsigned int len = 0;
  if (d->md && EVP_DigestInit_ex(d->md, d->sha256 ? d->sha256 : EVP_sha256(), NULL) == 1) {
    for (int i = 0; i < n; i++)
      EVP_DigestUpdate(d->md, parts[i], lens[i]);
    if (EVP_DigestFinal_ex(d->md, out, &len) == 1 && len == 32)
      return;
  }
  memset(out, 0, 32); /* libcrypto failed: content dedupe degrades to nothing matching */
}

/* SHA-256 of channel \0 sender \0 normalised body. */
static void exact_sha(cph_dedupe *d, const char *chan, const char *sender, const char *norm,
                      size_t norm_len, uint8_t out[32]) {
  const char *parts[3] = {chan, sender, norm};
  size_t lens[3] = {strlen(chan) + 1, strlen(sender) + 1, norm_len};
  sha256_of(d, parts, lens, 3, out);
}

static void content_sha(cph_dedupe *d, const char *norm, size_t norm_len, uint8_t out[32]) {
  const char *parts[1] = {norm};
  size_t lens[1] = {norm_len};
  sha256_of(d, parts, lens, 1, out);
}

/* A copy of s cut to DEDUPE_SAMPLE_MAX bytes on a UTF-8 character boundary. */
static char *sample_dup(const char *s, size_t max) {
  size_t n = strlen(s);
  if (n > max) {
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
      n--;
  }
  char *out = malloc(n + 1);
  if (out) {
    memcpy(out, s, n);
    out[n] = '\0';
  }
  return out;
}

/* ---------------------------------------------------------------- the exact-entry filter */

static uint64_t xs_tag(const uint8_t sha[32]) {
  uint64_t tag = cph_be64_get(sha);
  return tag ? tag : 1;
}

/* Rehashes into cap slots (a power of two, room for every slot). CPH_ENOMEM leaves the table
 * as it was. O(old cap + cap). */
static int xs_resize(cph_dedupe *d, size_t cap) {
  xslot *xs = calloc(cap, sizeof *xs);
  if (!xs)
    return CPH_ENOMEM;
  size_t mask = cap - 1;
  for (size_t i = 0; i < d->xs_cap; i++) {
    if (!d->xs[i].tag)
      continue;
    size_t j = (size_t)d->xs[i].tag & mask; /* a hash's bytes are uniform: no mixing needed */
    while (xs[j].tag)
      j = (j + 1) & mask;
    xs[j] = d->xs[i];
  }
  free(d->xs);
  d->xs = xs;
  d->xs_cap = cap;
  return CPH_OK;
}

/* Room for n more slots without passing 3/4 full. */
static int xs_reserve(cph_dedupe *d, size_t n) {
  size_t want = d->xs_len + n;
  if (d->xs_cap && want <= d->xs_cap / 4 * 3)
    return CPH_OK;
  size_t cap = d->xs_cap ? d->xs_cap : XS_MIN_CAP;
  while (want > cap / 4 * 3)
    cap *= 2;
  return xs_resize(d, cap);
}

/* The slot of sha's newest stored copy, with that entry read through t; XS_NONE when sha has
 * none. A hash never seen reads nothing from the store. */
static size_t xs_find(const cph_dedupe *d, cph_txn *t, const uint8_t sha[32], dd_entry *en) {
  if (!d->xs_cap)
    return XS_NONE;
  uint64_t tag = xs_tag(sha);
  size_t mask = d->xs_cap - 1;
  for (size_t i = (size_t)tag & mask; d->xs[i].tag; i = (i + 1) & mask) {
    if (d->xs[i].tag != tag)
      continue;
    cph_key k = xkey(d->xs[i].last_ms, sha);
    if (entry_get(t, &k, en) == CPH_OK)
      return i; /* else another hash with the same first 8 bytes, or an undecodable value */
  }
  return XS_NONE;
}

/* sha's newest copy is now the one at last_ms: its slot pos (xs_find's answer) follows, or a
 * new slot is taken. Logged for dedupe_rollback. Within a request the room was reserved by
 * dedupe_savepoint; without it (out of memory) the hash is left out — its repeats go
 * unnoticed, nothing worse. */
static void xs_set(cph_dedupe *d, size_t pos, const uint8_t sha[32], int64_t last_ms) {
  uint64_t tag = xs_tag(sha);
  if (pos == XS_NONE || pos >= d->xs_cap || d->xs[pos].tag != tag) {
    /* growing moves slots: only while no position is logged */
    if (d->xs_len + 1 > d->xs_cap / 4 * 3 && (d->n_undo || xs_reserve(d, 1)))
      return;
    size_t mask = d->xs_cap - 1;
    for (pos = (size_t)tag & mask; d->xs[pos].tag; pos = (pos + 1) & mask)
      ;
  }
  if (d->n_undo == d->cap_undo) {
    size_t cap = d->cap_undo ? d->cap_undo * 2 : 64;
    xundo *u = realloc(d->undo, cap * sizeof *u);
    if (!u)
      return;
    d->undo = u;
    d->cap_undo = cap;
  }
  d->undo[d->n_undo++] = (xundo){pos, d->xs[pos]};
  if (!d->xs[pos].tag)
    d->xs_len++;
  d->xs[pos] = (xslot){tag, last_ms};
}

/* Pruning deleted the copy (tag, last_ms): its slot goes if it names that copy (a newer copy
 * keeps it). Backward-shift deletion: the entries after it in the probe chain that may move
 * up, do. */
static void xs_forget(cph_dedupe *d, uint64_t tag, int64_t last_ms) {
  if (!d->xs_cap)
    return;
  size_t mask = d->xs_cap - 1, i = (size_t)tag & mask;
  for (; d->xs[i].tag; i = (i + 1) & mask)
    if (d->xs[i].tag == tag && d->xs[i].last_ms == last_ms)
      break;
  if (!d->xs[i].tag)
    return;
  for (size_t j = (i + 1) & mask; d->xs[j].tag; j = (j + 1) & mask) {
    size_t home = (size_t)d->xs[j].tag & mask;
    bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      d->xs[i] = d->xs[j];
      i = j;
    }
  }
  d->xs[i].tag = 0;
  d->xs_len--;
}

/* Builds the filter from the stored time-ordered entries, read through t: oldest first, so
 * a hash's newer copy takes over its older copy's slot. Telling a newer copy from another
 * hash with the same tag reads the store, only when tags match (a repeat). O(entries). */
static int xs_load(cph_dedupe *d, cph_txn *t) {
  size_t n = 0;
  if (cph_txn_count(t, CPH_DB_DEDUPE, &n) != CPH_OK)
    n = 0;
  if (xs_reserve(d, n))
    return CPH_ENOMEM;
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_DEDUPE, &c);
  if (rc)
    return rc;
  cph_key from = {.data = {XKEY_TAG}, .len = 1};
  cph_val k, v;
  for (rc = cph_cursor_seek(&c, &from, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    const uint8_t *kp = k.data;
    if (k.len != XKEY_LEN)
      continue; /* not an entry: pruning deletes it */
    const uint8_t *sha = kp + 9;
    int64_t last_ms = (int64_t)cph_be64_get(kp + 1);
    uint64_t tag = xs_tag(sha);
    if (d->xs_len + 1 > d->xs_cap / 4 * 3 && xs_reserve(d, 1)) {
      rc = CPH_ENOMEM;
      break;
    }
    size_t mask = d->xs_cap - 1, i = (size_t)tag & mask;
    for (; d->xs[i].tag; i = (i + 1) & mask) {
      cph_val old;
      cph_key ok = xkey(d->xs[i].last_ms, sha);
      if (d->xs[i].tag == tag && cph_txn_get(t, CPH_DB_DEDUPE, &ok, &old) == CPH_OK)
        break; /* an older copy of the same hash */
    }
    if (!d->xs[i].tag)
      d->xs_len++;
    d->xs[i] = (xslot){tag, last_ms};
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}

/* ---------------------------------------------------------------- rings and the top list */

static void ring_push(dd_channel *dc, uint64_t hash, const ring_entry *r) {
  if (dc->len == dc->cap && dc->cap < DEDUPE_RING_MAX) {
    uint32_t cap = dc->cap ? dc->cap * 2 : RING_MIN;
    if (cap > DEDUPE_RING_MAX)
      cap = DEDUPE_RING_MAX;
    ring_entry *grown = malloc(cap * sizeof *grown);
    uint64_t *hashes = malloc(cap * sizeof *hashes);
    if (grown && hashes) {
      for (uint32_t i = 0; i < dc->len; i++) { /* oldest first: a full ring's oldest is at next */
        grown[i] = dc->ring[(dc->next + i) % dc->cap];
        hashes[i] = dc->hashes[(dc->next + i) % dc->cap];
      }
      free(dc->ring);
      free(dc->hashes);
      dc->ring = grown;
      dc->hashes = hashes;
      dc->cap = cap;
      dc->next = dc->len;
      simidx_free(&dc->idx); /* slots moved: the next lookup rebuilds it */
    } else {
      free(grown);
      free(hashes);
    }
  }
  if (!dc->cap)
    return; /* out of memory before the first entry: near dedupe misses this one */
  if (dc->idx.bands && dc->len == dc->cap)
    simidx_remove(&dc->idx, dc->next, dc->hashes[dc->next]);
  if (dc->idx.bands)
    simidx_insert(&dc->idx, dc->next, hash);
  dc->hashes[dc->next] = hash;
  dc->ring[dc->next] = *r;
  dc->next = (dc->next + 1) % dc->cap;
  if (dc->len < dc->cap)
    dc->len++;
}

static dd_channel *ring_of(cph_dedupe *d, const char *chan, bool create) {
  dd_channel *dc = cph_hmap_get(&d->channels, chan);
  if (dc || !create)
    return dc;
  dc = calloc(1, sizeof *dc);
  if (!dc || !(dc->name = strdup(chan)) || cph_hmap_put(&d->channels, dc->name, dc)) {
    if (dc)
      free(dc->name);
    free(dc);
    return NULL;
  }
  return dc;
}

static void ring_free(dd_channel *dc) {
  simidx_free(&dc->idx);
  free(dc->hashes);
  free(dc->ring);
  free(dc->name);
  free(dc);
}

static bool top_before(const top_entry *a, const top_entry *b) {
  return a->count > b->count || (a->count == b->count && a->family < b->family);
}

static void top_note(cph_dedupe *d, uint64_t family, uint64_t count) {
  top_entry ne = {family, count};
  size_t i = 0;
  while (i < d->n_top && d->top[i].family != family)
    i++;
  if (i == d->n_top) {
    if (d->n_top < DEDUPE_TOP_MAX)
      d->n_top++;
    else if (top_before(&ne, &d->top[d->n_top - 1]))
      i = d->n_top - 1; /* evicts the smallest */
    else
      return;
  }
  d->top[i] = ne;
  for (; i > 0 && top_before(&d->top[i], &d->top[i - 1]); i--) {
    top_entry tmp = d->top[i];
    d->top[i] = d->top[i - 1];
    d->top[i - 1] = tmp;
  }
}

/* ---------------------------------------------------------------- per event */

void dedupe_verdict_free(dedupe_verdict *v) {
  free(v->norm);
  free(v->sample);
  v->norm = v->sample = NULL;
}

/* (Re)builds the ring's banded index for `distance`; on failure (a distance too wide for
 * bands, out of memory) the ring has none and lookups scan it. O(len * bands). */
static void ring_index(dd_channel *dc, int distance) {
  simidx_free(&dc->idx);
  if (simidx_init(&dc->idx, dc->cap, distance) != CPH_OK)
    return;
  for (uint32_t i = 0; i < dc->len; i++)
    simidx_insert(&dc->idx, i, dc->hashes[i]);
}

typedef struct near_best {
  int limit; /* :near-distance */
  int best;  /* the best distance so far, limit + 1 while none */
  int32_t best_i;
  uint64_t idsig;  /* the query's: an entry must carry the same */
  uint64_t sender; /* 0: any sender; else an entry must be from this sender */
} near_best;

/* Slot i against the best so far. The order — nearer, then more recent, then the later slot —
 * is total, so the indexed lookup (slots in any order, some twice) and the scan pick the same
 * entry. */
static inline void near_consider(const dd_channel *dc, uint32_t i, uint64_t hash, int64_t now_ms,
                                 int64_t window_ms, near_best *nb) {
  int dist = dedupe_hamming(dc->hashes[i], hash);
  if (dist > nb->limit || dist > nb->best)
    return;
  const ring_entry *r = &dc->ring[i];
  if (now_ms - r->last_ms > window_ms || r->idsig != nb->idsig ||
      (nb->sender && r->sender != nb->sender))
    return;
  if (nb->best_i >= 0 && dist == nb->best) {
    const ring_entry *b = &dc->ring[nb->best_i];
    if (r->last_ms < b->last_ms || (r->last_ms == b->last_ms && (int32_t)i <= nb->best_i))
      return;
  }
  nb->best = dist;
  nb->best_i = (int32_t)i;
}

int dedupe_classify(cph_dedupe *d, const cph_policy_dedupe *p, cph_txn *t, const char *chan,
                    const char *sender, const char *body, int64_t now_ms, uint32_t window_mult,
                    dedupe_near near, dedupe_verdict *v) {
  memset(v, 0, sizeof *v);
  v->ring_index = -1;
  v->norm = dedupe_normalise(body, &v->norm_len);
  if (!v->norm)
    return CPH_ENOMEM;
  exact_sha(d, chan, sender, v->norm, v->norm_len, v->sha256);
  if (p->window_seconds <= 0 || (int64_t)v->norm_len < p->min_length)
    return CPH_OK;
  v->eligible = true;
  v->simhash = dedupe_simhash(v->norm, v->norm_len, (int)p->shingle_words);
  v->idsig = dedupe_idsig(v->norm, v->norm_len);
  v->sender_hash = fnv1a64(sender, strlen(sender)) | 1; /* never 0: 0 means any sender */
  int64_t window_ms = p->window_seconds * 1000 * (int64_t)(window_mult ? window_mult : 1);

  dd_entry en;
  v->xslot = xs_find(d, t, v->sha256, &en);
  if (v->xslot != XS_NONE && now_ms - en.last_ms <= window_ms) {
    v->kind = DEDUPE_EXACT;
    v->original_event = en.event_id;
    v->original_first_ms = en.first_ms;
    v->family = en.family;
  }

  /* The nearest live simhash of the channel within :near-distance (ties: the most recent).
   * Without near folding only an exact repeat looks, for its identical simhash (to refresh
   * its ring entry); anything else has nothing to find. */
  dd_channel *dc = ring_of(d, chan, false);
  if (!dc || (near == DEDUPE_NEAR_OFF && v->kind != DEDUPE_EXACT))
    return CPH_OK;
  near_best nb = {(int)p->near_distance, (int)p->near_distance + 1, -1, v->idsig,
                  near == DEDUPE_NEAR_SENDER ? v->sender_hash : 0};
  int want_bands = (int)p->near_distance + 1;
  int walk_bands = want_bands;
  if (near == DEDUPE_NEAR_OFF) {
    nb.limit = 0;
    walk_bands = 1; /* identical hashes share every band: one band finds them all */
  } else if (dc->len >= INDEX_MIN_LEN && dc->idx.bands != want_bands) {
    ring_index(dc, (int)p->near_distance); /* built for near lookups only: pushes to a ring
                                              without one cost no index upkeep */
  }
  if (dc->idx.bands && dc->idx.bands == want_bands) {
    for (int b = 0; b < walk_bands; b++)
      for (uint32_t i = simidx_first(&dc->idx, b, v->simhash); i != SIMIDX_NIL;
           i = simidx_next(&dc->idx, b, i))
        near_consider(dc, i, v->simhash, now_ms, window_ms, &nb);
  } else {
    for (uint32_t i = 0; i < dc->len; i++)
      near_consider(dc, i, v->simhash, now_ms, window_ms, &nb);
  }
  int best = nb.best;
  int32_t best_i = nb.best_i;
  if (v->kind == DEDUPE_EXACT) {
    if (best_i >= 0 && best == 0) {
      v->ring_index = best_i; /* refreshed on commit */
      if (!v->family)
        v->family = dc->ring[best_i].family;
    }
  } else if (best_i >= 0 && near != DEDUPE_NEAR_OFF) {
    const ring_entry *r = &dc->ring[best_i];
    v->kind = DEDUPE_NEAR;
    v->original_event = r->event_id;
    v->original_first_ms = r->first_ms;
    v->family = r->family;
    v->distance = best;
    v->ring_index = best_i;
  }
  return CPH_OK;
}

/* Adds channel to a family record's channels if it is not there. */
static int family_add_channel(cph_aggregate_rec *a, const char *chan) {
  for (uint32_t i = 0; i < a->n_channels; i++)
    if (strcmp(a->channels[i], chan) == 0)
      return CPH_OK;
  char **ch = realloc(a->channels, (a->n_channels + 1) * sizeof *ch);
  if (!ch)
    return CPH_ENOMEM;
  a->channels = ch;
  if (!(ch[a->n_channels] = strdup(chan)))
    return CPH_ENOMEM;
  a->n_channels++;
  return CPH_OK;
}

/* Adds `add` occurrences seen in channel at now_ms to the stored family; CPH_ENOTFOUND when
 * there is no such family. */
static int family_bump(cph_txn *t, uint64_t family, uint64_t add, const char *chan, int64_t now_ms,
                       uint64_t *count_out) {
  cph_key fk = family_key(family);
  cph_aggregate_rec a = {0};
  int rc = cph_txn_get_record(t, CPH_DB_AGGREGATES, &fk, &cph_aggregate_desc, &a);
  if (rc)
    return rc;
  a.dup_count += add;
  if (now_ms > a.last_ms)
    a.last_ms = now_ms;
  rc = family_add_channel(&a, chan);
  if (rc == CPH_OK)
    rc = cph_txn_put_record(t, CPH_DB_AGGREGATES, &fk, &cph_aggregate_desc, &a);
  *count_out = a.dup_count;
  cph_record_free(&cph_aggregate_desc, &a);
  return rc;
}

/* The duplicate in v has no (live) family: found one for the original's content (another
 * channel, an earlier window) or create it. Either way the original is now a member. */
static int family_start(cph_dedupe *d, cph_txn *t, const char *chan, const char *body,
                        int64_t now_ms, dedupe_verdict *v) {
  cph_event_rec orig = {0};
  cph_key ek = family_key(v->original_event); /* same layout: one u64 */
  bool have_orig = cph_txn_get_record(t, CPH_DB_EVENTS, &ek, &cph_event_desc, &orig) == CPH_OK;
  if (t->ret)
    return t->ret; /* a corrupt original: the store's error stands */
  const char *sample = have_orig && orig.body ? orig.body : body;
  uint8_t csha[32];
  size_t nlen = 0;
  char *norm = dedupe_normalise(sample, &nlen);
  if (!norm) {
    cph_record_free(&cph_event_desc, &orig);
    return CPH_ENOMEM;
  }
  content_sha(d, norm, nlen, csha);
  free(norm);

  int rc = CPH_OK;
  cph_key ik = index_key(csha);
  cph_val iv;
  uint64_t family = 0;
  if (cph_txn_get(t, CPH_DB_DEDUPE, &ik, &iv) == CPH_OK) {
    const uint8_t *p = iv.data;
    if (iv.len == INDEX_LEN && p[0] == ENTRY_VERSION)
      family = cph_be64_get(p + 1);
    else
      log_bad_value(&ik, iv.len);
  }
  if (family) {
    rc = family_bump(t, family, 2, chan, now_ms, &v->dup_count);
    if (rc == CPH_ENOTFOUND && !t->ret)
      family = 0; /* the index outlived its family: start afresh */
    else if (rc)
      goto done;
  }
  if (!family) {
    rc = cph_txn_next_id(t, "family", &family);
    if (rc)
      goto done;
    char *chans[1] = {(char *)chan};
    cph_aggregate_rec a = {0};
    a.family = family;
    a.dup_count = 2; /* the original and this duplicate */
    a.sample = sample_dup(sample, DEDUPE_SAMPLE_MAX);
    a.channels = chans;
    a.n_channels = 1;
    a.first_ms = v->original_first_ms ? v->original_first_ms : now_ms;
    a.last_ms = now_ms;
    a.simhash = have_orig && orig.simhash ? orig.simhash : v->simhash;
    memcpy(a.body_sha256, have_orig ? orig.body_sha256 : v->sha256, 32);
    if (!a.sample) {
      rc = CPH_ENOMEM;
      goto done;
    }
    cph_key fk = family_key(family);
    rc = cph_txn_put_record(t, CPH_DB_AGGREGATES, &fk, &cph_aggregate_desc, &a);
    uint8_t val[INDEX_LEN];
    val[0] = ENTRY_VERSION;
    cph_be64_put(val + 1, family);
    if (rc == CPH_OK)
      rc = cph_txn_put(t, CPH_DB_DEDUPE, &ik, val, sizeof val);
    v->family_created = true;
    v->dup_count = 2;
    v->sample = a.sample; /* handed to the caller (aggregate memory, notices) */
  }
  v->family = family;
  /* The original's own exact entry joins too, so its sender's next repeat lands here (in
   * place: its newest copy). An exact repeat's original has the repeat's hash: the copy
   * dedupe_write adds next carries the family and supersedes it. */
  if (rc == CPH_OK && have_orig && memcmp(orig.body_sha256, v->sha256, 32) != 0) {
    dd_entry en;
    if (xs_find(d, t, orig.body_sha256, &en) != XS_NONE && en.event_id == v->original_event &&
        !en.family) {
      en.family = family;
      cph_key ok = xkey(en.last_ms, orig.body_sha256);
      rc = entry_put(t, &ok, &en);
    }
  }
done:
  cph_record_free(&cph_event_desc, &orig);
  return rc ? rc : t->ret;
}

int dedupe_write(cph_dedupe *d, cph_txn *t, const char *chan, const char *body,
                 uint64_t event_id, int64_t now_ms, dedupe_verdict *v) {
  if (!v->eligible)
    return CPH_OK;
  dd_entry en = {0, event_id, now_ms, now_ms, v->simhash};
  if (v->kind != DEDUPE_NONE) {
    int rc = CPH_ENOTFOUND;
    if (v->family) {
      rc = family_bump(t, v->family, 1, chan, now_ms, &v->dup_count);
      if (rc && (rc != CPH_ENOTFOUND || t->ret))
        return rc;
    }
    if (rc == CPH_ENOTFOUND) {
      /* no family yet — or one that vanished (pruned, or left in memory by a failed pass) */
      v->family = 0;
      rc = family_start(d, t, chan, body, now_ms, v);
      if (rc)
        return rc;
    }
    en.family = v->family;
    if (v->kind == DEDUPE_EXACT) {
      en.event_id = v->original_event; /* the entry keeps its original; the window slides */
      en.first_ms = v->original_first_ms;
    }
  }
  cph_key k = xkey(now_ms, v->sha256); /* at the end: the older copy, if any, goes stale */
  return entry_put(t, &k, &en);
}

void dedupe_commit(cph_dedupe *d, const char *chan, uint64_t event_id, int64_t now_ms,
                   const dedupe_verdict *v) {
  if (!v->eligible || !d)
    return;
  if (v->kind == DEDUPE_EXACT)
    d->exact_hits++;
  else if (v->kind == DEDUPE_NEAR)
    d->near_hits++;
  d->added_since_prune++; /* every eligible event writes a copy, to be pruned one day */
  xs_set(d, v->xslot, v->sha256, now_ms);
  if (v->family_created)
    d->families++;
  if (v->kind != DEDUPE_NONE && v->family)
    top_note(d, v->family, v->dup_count);

  dd_channel *dc = ring_of(d, chan, true);
  if (!dc)
    return;
  dc->last_ms = now_ms;
  bool push = true;
  if (v->ring_index >= 0 && (uint32_t)v->ring_index < dc->len) {
    ring_entry *r = &dc->ring[v->ring_index];
    r->last_ms = now_ms;
    if (v->family)
      r->family = v->family;
    /* an identical simhash is refreshed, a new variant of a family is remembered too (so a
     * message that drifts a word at a time stays in its family) */
    push = v->kind == DEDUPE_NEAR && v->distance > 0;
  }
  if (push) {
    ring_entry r = {v->family, event_id, now_ms, now_ms, v->idsig, v->sender_hash};
    if (v->kind == DEDUPE_EXACT) {
      r.event_id = v->original_event;
      r.first_ms = v->original_first_ms;
    }
    ring_push(dc, v->simhash, &r);
  }
}

void dedupe_savepoint(cph_dedupe *d, size_t n_events) {
  if (!d)
    return;
  d->n_undo = 0;
  if (xs_reserve(d, n_events) == CPH_OK && d->cap_undo < n_events) {
    xundo *u = realloc(d->undo, n_events * sizeof *u);
    if (u) {
      d->undo = u;
      d->cap_undo = n_events;
    }
  }
  d->saved.exact_hits = d->exact_hits;
  d->saved.near_hits = d->near_hits;
  d->saved.families = d->families;
  d->saved.added_since_prune = d->added_since_prune;
  memcpy(d->saved.top, d->top, d->n_top * sizeof *d->top);
  d->saved.n_top = d->n_top;
}

static void rings_free_all(cph_dedupe *d) {
  for (size_t i = 0; i < d->channels.cap; i++)
    if (d->channels.slots[i].key)
      ring_free(d->channels.slots[i].value);
  cph_hmap_free(&d->channels);
}

void dedupe_rollback(cph_dedupe *d) {
  if (!d)
    return;
  d->exact_hits = d->saved.exact_hits;
  d->near_hits = d->saved.near_hits;
  d->families = d->saved.families;
  d->added_since_prune = d->saved.added_since_prune;
  memcpy(d->top, d->saved.top, d->saved.n_top * sizeof *d->top);
  d->n_top = d->saved.n_top;
  for (size_t i = d->n_undo; i-- > 0;) { /* newest first: the table as it was, exactly */
    const xundo *u = &d->undo[i];
    if (d->xs[u->pos].tag && !u->before.tag)
      d->xs_len--;
    d->xs[u->pos] = u->before;
  }
  d->n_undo = 0;
  rings_free_all(d);
}

/* ---------------------------------------------------------------- lifecycle */

/* True when the store holds exact entries of the old layout (channel\0 sha256): keys from
 * 0x01 up to the time-ordered ones. O(log n). */
static bool has_old_entries(cph_txn *t) {
  cph_cursor c;
  if (cph_cursor_open(t, CPH_DB_DEDUPE, &c) != CPH_OK)
    return false;
  cph_key from = {.data = {0x01}, .len = 1};
  cph_val k, v;
  bool old = cph_cursor_seek(&c, &from, &k, &v) == CPH_OK &&
             ((const uint8_t *)k.data)[0] != XKEY_TAG;
  cph_cursor_close(&c);
  return old;
}

/* Moves every old-layout exact entry to its time-ordered key (same value), in w; *moved
 * counts them. One seek per entry: a one-off, bounded by the window the old pruning kept. */
static int migrate_old_entries(cph_txn *w, size_t *moved) {
  *moved = 0;
  for (;;) {
    cph_cursor c;
    int rc = cph_cursor_open(w, CPH_DB_DEDUPE, &c);
    if (rc)
      return rc;
    cph_key from = {.data = {0x01}, .len = 1};
    cph_val k, v;
    rc = cph_cursor_seek(&c, &from, &k, &v);
    if (rc == CPH_OK && ((const uint8_t *)k.data)[0] == XKEY_TAG)
      rc = CPH_ENOTFOUND;
    cph_key old;
    dd_entry en;
    bool ok = false;
    if (rc == CPH_OK) {
      cph_key_reset(&old);
      key_bytes(&old, k.data, k.len);
      ok = k.len >= 34 && entry_decode(&v, &en);
      if (!ok)
        log_bad_value(&old, v.len);
    }
    cph_cursor_close(&c);
    if (rc == CPH_ENOTFOUND)
      return CPH_OK;
    if (rc)
      return rc;
    rc = cph_txn_del(w, CPH_DB_DEDUPE, &old);
    if (rc == CPH_OK && ok) {
      cph_key nk = xkey(en.last_ms, old.data + old.len - 32);
      rc = entry_put(w, &nk, &en);
      (*moved)++;
    }
    if (rc)
      return rc;
  }
}

int dedupe_open(cph_txn *t, cph_dedupe **out, cph_err *err) {
  *out = NULL;
  cph_dedupe *d = calloc(1, sizeof *d);
  if (!d || !(d->md = EVP_MD_CTX_new())) {
    free(d);
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening dedupe");
  }
  d->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL); /* NULL: sha256_of falls back */

  /* A store from before the time-ordered layout: its entries move, once, in a write txn of
   * our own (the store opens with MDB_NOTLS, so the caller's read txn may stay open); the
   * state is then read through that txn, which sees the move. */
  cph_txn w;
  bool migrating = has_old_entries(t);
  size_t moved = 0;
  int rc = CPH_OK;
  if (migrating) {
    rc = cph_txn_begin(t->store, true, &w);
    if (rc == CPH_OK)
      rc = migrate_old_entries(&w, &moved);
    if (rc) {
      cph_err_set(err, rc, "moving exact-dedupe entries to the time-ordered layout: %s",
                  w.err.msg);
      cph_txn_abort(&w);
      dedupe_close(d);
      return rc;
    }
    t = &w;
  }

  /* Family count and the top list: one pass over the families at open. */
  cph_cursor c;
  rc = cph_cursor_open(t, CPH_DB_AGGREGATES, &c);
  if (rc == CPH_OK) {
    cph_val k, v;
    for (rc = cph_cursor_seek(&c, NULL, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
      cph_aggregate_rec a = {0};
      cph_err derr;
      if (cph_record_decode(&cph_aggregate_desc, v.data, v.len, &a, &derr) != CPH_OK) {
        char desc[64];
        cph_key_describe(k.data, k.len, desc, sizeof desc);
        cph_error("corrupt record in database \"aggregates\" at key %s: %s; left out of the "
                  "top families",
                  desc, derr.msg);
        continue;
      }
      d->families++;
      top_note(d, a.family, a.dup_count);
      cph_record_free(&cph_aggregate_desc, &a);
    }
    cph_cursor_close(&c);
  }
  if (rc != CPH_OK && rc != CPH_ENOTFOUND) {
    cph_err_set(err, rc, "loading families: %s", t->err.msg);
    goto fail;
  }
  rc = xs_load(d, t);
  if (rc) {
    cph_err_set(err, rc, "loading exact-dedupe entries: %s",
                rc == CPH_ENOMEM ? "out of memory" : t->err.msg);
    goto fail;
  }
  if (migrating) {
    rc = cph_txn_commit(&w);
    if (rc) {
      cph_err_set(err, rc, "moving exact-dedupe entries to the time-ordered layout: %s",
                  w.err.msg);
      dedupe_close(d);
      return rc;
    }
    cph_info("dedupe: moved %zu exact-dedupe entries to the time-ordered layout", moved);
  }
  *out = d;
  return CPH_OK;
fail:
  if (migrating)
    cph_txn_abort(&w);
  dedupe_close(d);
  return rc;
}

void dedupe_close(cph_dedupe *d) {
  if (!d)
    return;
  rings_free_all(d);
  EVP_MD_CTX_free(d->md);
  EVP_MD_free(d->sha256);
  free(d->xs);
  free(d->undo);
  free(d);
}

/* Deletes expired exact entries (and stale copies) from the front of the time-ordered range,
 * at most the budget per call, and forgets their filter slots. */
static void prune(cph_dedupe *d, const cph_policy_dedupe *p, cph_txn *parent, int64_t now_ms,
                  uint32_t widest) {
  /* keep entries for the widest window a channel may use (backpressure step 3) */
  int64_t keep_ms = p->window_seconds * 1000 * (int64_t)widest;
  uint64_t budget = PRUNE_BASE + 2 * d->added_since_prune;
  d->added_since_prune = 0;
  cph_txn t;
  if (cph_txn_begin_child(parent, &t) != CPH_OK)
    return;
  cph_cursor c;
  if (cph_cursor_open(&t, CPH_DB_DEDUPE, &c) != CPH_OK) {
    cph_txn_abort(&t);
    return;
  }
  cph_key from = {.data = {XKEY_TAG}, .len = 1};
  cph_val k, v;
  int rc = cph_cursor_seek(&c, &from, &k, &v);
  for (uint64_t seen = 0; rc == CPH_OK && seen < budget; seen++) {
    const uint8_t *kp = k.data;
    if (k.len == XKEY_LEN) {
      int64_t last_ms = (int64_t)cph_be64_get(kp + 1);
      if (now_ms - last_ms <= keep_ms)
        break; /* the rest is newer */
      /* If the commit below fails, the slot is gone while its expired entry stays: a miss
       * either way. */
      xs_forget(d, xs_tag(kp + 9), last_ms);
    } /* else not an entry of ours: deleted too */
    if (cph_cursor_del(&c) != CPH_OK)
      break;
    /* after a delete LMDB's cursor already stands on the next entry; MDB_NEXT returns it */
    rc = cph_cursor_next(&c, &k, &v);
  }
  cph_cursor_close(&c);
  if (cph_txn_commit(&t) != CPH_OK)
    cph_warn("dedupe prune: %s", t.err.msg);
}

void dedupe_tick(cph_dedupe *d, const cph_policy_dedupe *p, cph_txn *parent, int64_t now_ms,
                 const dedupe_widening *widen) {
  if (!d || now_ms < d->next_prune_ms)
    return;
  d->next_prune_ms = now_ms + PRUNE_PERIOD_MS;
  prune(d, p, parent, now_ms, widen->factor);
  if (now_ms < d->next_sweep_ms)
    return;
  d->next_sweep_ms = now_ms + SWEEP_PERIOD_MS;
  /* After a burst the filter may hold far fewer entries than its table: give memory back. */
  if (d->xs_cap > XS_MIN_CAP && d->xs_len < d->xs_cap / 8) {
    size_t cap = XS_MIN_CAP;
    while (d->xs_len > cap / 8 * 3)
      cap *= 2;
    xs_resize(d, cap); /* out of memory: keeps the larger table */
  }
  int64_t window_ms = p->window_seconds * 1000;
  /* Free rings whose newest entry left the channel's window (x4 at backpressure step 3);
   * collected first because deleting from the map while walking its slots could skip
   * entries. */
  size_t n = 0;
  dd_channel **idle = malloc((d->channels.len ? d->channels.len : 1) * sizeof *idle);
  if (!idle)
    return;
  for (size_t i = 0; i < d->channels.cap; i++) {
    dd_channel *dc = d->channels.slots[i].value;
    if (!d->channels.slots[i].key)
      continue;
    int64_t keep_ms = window_ms * (widen->widened(widen->ctx, dc->name) ? widen->factor : 1);
    if (now_ms - dc->last_ms > keep_ms)
      idle[n++] = dc;
  }
  for (size_t i = 0; i < n; i++) {
    cph_hmap_del(&d->channels, idle[i]->name);
    ring_free(idle[i]);
  }
  free(idle);
}

/* ---------------------------------------------------------------- reads */

void dedupe_stats_get(const cph_dedupe *d, dedupe_stats *out) {
  memset(out, 0, sizeof *out);
  if (!d)
    return;
  out->exact_hits_total = d->exact_hits;
  out->near_hits_total = d->near_hits;
  out->aggregate_count = d->families;
}

size_t dedupe_top(const cph_dedupe *d, uint64_t *families, uint64_t *dup_counts, size_t max) {
  size_t n = 0;
  for (; d && n < d->n_top && n < max; n++) {
    families[n] = d->top[n].family;
    dup_counts[n] = d->top[n].count;
  }
  return n;
}

void cph_aggregate_info_free(cph_aggregate_info *a) {
  if (!a)
    return;
  free(a->sample);
  for (size_t i = 0; i < a->channels.count; i++)
    free(a->channels.items[i]);
  free(a->channels.items);
  memset(a, 0, sizeof *a);
}

int dedupe_aggregates(const cph_dedupe *d, cph_txn *t, size_t top, cph_aggregate_info **out,
                      size_t *n, cph_err *err) {
  *out = NULL;
  *n = 0;
  if (!top)
    top = 10;
  if (top > DEDUPE_TOP_MAX)
    top = DEDUPE_TOP_MAX;
  if (!d || !d->n_top)
    return CPH_OK;
  cph_aggregate_info *list = calloc(top < d->n_top ? top : d->n_top, sizeof *list);
  if (!list)
    return cph_err_set(err, CPH_ENOMEM, "out of memory");
  int rc = CPH_OK;
  for (size_t i = 0; i < d->n_top && *n < top; i++) {
    cph_key fk = family_key(d->top[i].family);
    cph_aggregate_rec a = {0};
    rc = cph_txn_get_record(t, CPH_DB_AGGREGATES, &fk, &cph_aggregate_desc, &a);
    if (rc == CPH_ENOTFOUND)
      continue; /* removed since (a top entry outlives its family until the next open) */
    if (rc) {
      cph_err_set(err, rc, "%s", t->err.msg);
      break;
    }
    cph_aggregate_info *ai = &list[(*n)++];
    ai->family = a.family;
    ai->dup_count = a.dup_count;
    ai->sample = a.sample; /* ownership moves from the record */
    ai->channels.items = a.channels;
    ai->channels.count = a.n_channels;
    ai->first_ms = a.first_ms;
    ai->last_ms = a.last_ms;
    ai->simhash = a.simhash;
    a.sample = NULL;
    a.channels = NULL;
    a.n_channels = 0;
    cph_record_free(&cph_aggregate_desc, &a);
  }
  if (rc && rc != CPH_ENOTFOUND) {
    for (size_t i = 0; i < *n; i++)
      cph_aggregate_info_free(&list[i]);
    free(list);
    *n = 0;
    return rc;
  }
  *out = list;
  return CPH_OK;
}
