/* Exact and near content dedupe and duplicate families (DESIGN §5); contract in dedupe.h.
 *
 * Stored (CPH_DB_DEDUPE), values encoded by hand, big-endian, led by a version byte:
 *   channel\0 sha256(channel, sender, normalised body)  -> v1, family, original event id,
 *                                                           first_ms, last_ms, simhash (41 B)
 *   ""\0 sha256(normalised body)                        -> v1, family (9 B): the family
 *                                                           index, content -> family
 * A channel name is never empty, so the two key kinds cannot collide. A value that does not
 * decode is logged with its key and treated as absent (it is an index: the next write
 * replaces it). */
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

typedef struct cph_dedupe {
  cph_hmap channels; /* name -> dd_channel */
  EVP_MD_CTX *md;
  int64_t next_prune_ms; /* dedupe_tick prunes at most once a second */
  uint64_t exact_hits, near_hits, families;
  /* The top families by count, largest first. Exact, not an estimate: counts only grow and
   * every increment passes through top_note, so a family outside the list can never exceed
   * its smallest member. */
  top_entry top[DEDUPE_TOP_MAX];
  size_t n_top;
  uint8_t prune_key[CPH_KEY_MAX]; /* where the prune scan resumes; len 0 = from the start */
  size_t prune_key_len;
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

static void simhash_add(int32_t v[64], const char *p, size_t n) {
  uint64_t h = mix64(fnv1a64(p, n));
  for (int b = 0; b < 64; b++)
    v[b] += (h >> b) & 1 ? 1 : -1;
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
  int32_t v[64] = {0};
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
      simhash_add(v, s + from, i - from);
    }
    i++; /* the space */
  }
  if (nw < (size_t)k)
    simhash_add(v, s, len); /* fewer words than a shingle: the whole text is one */
  uint64_t h = 0;
  for (int b = 0; b < 64; b++)
    if (v[b] > 0)
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

static cph_key entry_key(const char *chan, const uint8_t sha[32]) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, chan);
  key_bytes(&k, sha, 32);
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
  if (d->md && EVP_DigestInit_ex(d->md, EVP_sha256(), NULL) == 1) {
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

  cph_key k = entry_key(chan, v->sha256);
  dd_entry en;
  if (entry_get(t, &k, &en) == CPH_OK && now_ms - en.last_ms <= window_ms) {
    v->kind = DEDUPE_EXACT;
    v->original_event = en.event_id;
    v->original_first_ms = en.first_ms;
    v->family = en.family;
  }

  /* The nearest live simhash of the channel within :near-distance (ties: the most recent). */
  dd_channel *dc = ring_of(d, chan, false);
  near_best nb = {(int)p->near_distance, (int)p->near_distance + 1, -1, v->idsig,
                  near == DEDUPE_NEAR_SENDER ? v->sender_hash : 0};
  if (near == DEDUPE_NEAR_OFF)
    nb.limit = 0; /* only the identical simhash, to refresh an exact repeat's ring entry */
  int want_bands = (int)p->near_distance + 1; /* built for the near lookups, whatever `near` */
  if (dc && dc->len >= INDEX_MIN_LEN && dc->idx.bands != want_bands)
    ring_index(dc, (int)p->near_distance);
  /* An index for a wider distance finds every nearer entry too (identical hashes share every
   * band), so one built for :near-distance serves the exact-only lookup as well. */
  if (dc && dc->idx.bands && dc->idx.bands == want_bands) {
    for (int b = 0; b < dc->idx.bands; b++)
      for (uint32_t i = simidx_first(&dc->idx, b, v->simhash); i != SIMIDX_NIL;
           i = simidx_next(&dc->idx, b, i))
        near_consider(dc, i, v->simhash, now_ms, window_ms, &nb);
  } else {
    for (uint32_t i = 0; dc && i < dc->len; i++)
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
  /* The original's own exact entry joins too, so its sender's next repeat lands here. */
  if (rc == CPH_OK && have_orig) {
    cph_key ok = entry_key(chan, orig.body_sha256);
    dd_entry en;
    if (entry_get(t, &ok, &en) == CPH_OK && en.event_id == v->original_event && !en.family) {
      en.family = family;
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
  cph_key k = entry_key(chan, v->sha256);
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
  else
    d->added_since_prune++;
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

void dedupe_savepoint(cph_dedupe *d) {
  if (!d)
    return;
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
  rings_free_all(d);
}

/* ---------------------------------------------------------------- lifecycle */

int dedupe_open(cph_txn *t, cph_dedupe **out, cph_err *err) {
  *out = NULL;
  cph_dedupe *d = calloc(1, sizeof *d);
  if (!d || !(d->md = EVP_MD_CTX_new())) {
    free(d);
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening dedupe");
  }

  /* Family count and the top list: one pass over the families at open. */
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_AGGREGATES, &c);
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
    dedupe_close(d);
    return rc;
  }
  *out = d;
  return CPH_OK;
}

void dedupe_close(cph_dedupe *d) {
  if (!d)
    return;
  rings_free_all(d);
  EVP_MD_CTX_free(d->md);
  free(d);
}

/* Deletes expired exact entries, resuming where the last scan stopped. */
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
  cph_key from;
  cph_key_reset(&from);
  key_bytes(&from, d->prune_key, d->prune_key_len);
  cph_val k, v;
  int rc = cph_cursor_seek(&c, d->prune_key_len ? &from : NULL, &k, &v);
  uint64_t seen = 0;
  for (; rc == CPH_OK && seen < budget; seen++) {
    memcpy(d->prune_key, k.data, k.len < CPH_KEY_MAX ? k.len : CPH_KEY_MAX);
    d->prune_key_len = k.len < CPH_KEY_MAX ? k.len : CPH_KEY_MAX;
    dd_entry en;
    bool is_index = k.len > 0 && ((const uint8_t *)k.data)[0] == '\0';
    if (!is_index && (!entry_decode(&v, &en) || now_ms - en.last_ms > keep_ms)) {
      if (cph_cursor_del(&c) != CPH_OK)
        break;
      /* after a delete LMDB's cursor already stands on the next entry; MDB_NEXT returns it */
    }
    rc = cph_cursor_next(&c, &k, &v);
  }
  if (rc == CPH_ENOTFOUND)
    d->prune_key_len = 0; /* reached the end: start over next time */
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
