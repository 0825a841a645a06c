/* Dedupe's exact entries (DESIGN §5): their keys and values in LMDB and the in-memory
 * filter over the window. Contract in dedupe.h; the module's state in dedupe_internal.h.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "dedupe_internal.h"

/* ---------------------------------------------------------------- keys and values */

void dd_key_bytes(cph_key *k, const uint8_t *p, size_t n) {
  if (k->len + n > CPH_KEY_MAX) {
    k->overflow = true;
    return;
  }
  memcpy(k->data + k->len, p, n);
  k->len += n;
}

/* A time-ordered exact entry's key. */
cph_key dd_xkey(int64_t last_ms, const uint8_t sha[32]) {
  cph_key k;
  k.data[0] = XKEY_TAG;
  cph_be64_put(k.data + 1, (uint64_t)last_ms);
  memcpy(k.data + 9, sha, 32);
  k.len = XKEY_LEN;
  k.overflow = false;
  return k;
}

cph_key dd_index_key(const uint8_t content_sha[32]) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "");
  dd_key_bytes(&k, content_sha, 32);
  return k;
}

cph_key dd_family_key(uint64_t family) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, family);
  return k;
}

static void entry_encode(const dd_entry *d, uint8_t out[ENTRY_LEN]) {
  out[0] = ENTRY_VERSION;
  cph_be64_put(out + 1, d->family);
  cph_be64_put(out + 9, d->event_id);
  cph_be64_put(out + 17, (uint64_t)d->first_ms);
  cph_be64_put(out + 25, (uint64_t)d->last_ms);
  cph_be64_put(out + 33, d->simhash);
}

bool dd_entry_decode(const cph_val *v, dd_entry *d) {
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

void dd_log_bad_value(const cph_key *k, size_t len) {
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
  if (!dd_entry_decode(&v, d)) {
    dd_log_bad_value(k, v.len);
    return CPH_ENOTFOUND;
  }
  return CPH_OK;
}

int dd_entry_put(cph_txn *t, const cph_key *k, const dd_entry *d) {
  uint8_t v[ENTRY_LEN];
  entry_encode(d, v);
  return cph_txn_put(t, CPH_DB_DEDUPE, k, v, sizeof v);
}

static void sha256_of(cph_event_hasher *h, const char *const *parts, const size_t *lens, int n,
                      uint8_t out[32]) {
  unsigned int len = 0;
  if (h->md && EVP_DigestInit_ex(h->md, h->sha256 ? h->sha256 : EVP_sha256(), NULL) == 1) {
    for (int i = 0; i < n; i++)
      EVP_DigestUpdate(h->md, parts[i], lens[i]);
    if (EVP_DigestFinal_ex(h->md, out, &len) == 1 && len == 32)
      return;
  }
  memset(out, 0, 32); /* libcrypto failed: content dedupe degrades to nothing matching */
}

/* SHA-256 of channel \0 sender \0 normalised body. */
void dd_exact_sha(cph_event_hasher *h, const char *chan, const char *sender, const char *norm,
                  size_t norm_len, uint8_t out[32]) {
  const char *parts[3] = {chan, sender, norm};
  size_t lens[3] = {strlen(chan) + 1, strlen(sender) + 1, norm_len};
  sha256_of(h, parts, lens, 3, out);
}

void dd_content_sha(cph_event_hasher *h, const char *norm, size_t norm_len, uint8_t out[32]) {
  const char *parts[1] = {norm};
  size_t lens[1] = {norm_len};
  sha256_of(h, parts, lens, 1, out);
}

/* A copy of s cut to DEDUPE_SAMPLE_MAX bytes on a UTF-8 character boundary. */
char *dd_sample_dup(const char *s, size_t max) {
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

/* ---------------------------------------------------------------- a request's held entries */

static size_t pend_hash(int64_t last_ms, const uint8_t sha[32]) {
  return (size_t)(cph_be64_get(sha) ^ (uint64_t)last_ms * 0x9E3779B97F4A7C15ull);
}

/* The slot of pend_at that holds (last_ms, sha)'s entry, or the empty one where it would. */
static size_t pend_slot(const cph_dedupe *d, int64_t last_ms, const uint8_t sha[32]) {
  size_t mask = d->cap_pend_at - 1;
  for (size_t i = pend_hash(last_ms, sha) & mask;; i = (i + 1) & mask) {
    uint32_t at = d->pend_at[i];
    if (!at)
      return i;
    const dd_pending *p = &d->pend[at - 1];
    if (p->last_ms == last_ms && memcmp(p->sha, sha, 32) == 0)
      return i;
  }
}

/* Room for one more held entry, pend_at staying at most half full. */
static int pend_room(cph_dedupe *d) {
  if (d->n_pend == d->cap_pend) {
    size_t cap = d->cap_pend ? d->cap_pend * 2 : 256;
    dd_pending *p = realloc(d->pend, cap * sizeof *p);
    if (!p)
      return CPH_ENOMEM;
    d->pend = p;
    d->cap_pend = cap;
  }
  if ((d->n_pend + 1) * 2 <= d->cap_pend_at)
    return CPH_OK;
  size_t cap = d->cap_pend_at ? d->cap_pend_at * 2 : 512;
  uint32_t *at = calloc(cap, sizeof *at);
  if (!at)
    return CPH_ENOMEM;
  free(d->pend_at);
  d->pend_at = at;
  d->cap_pend_at = cap;
  for (size_t i = 0; i < d->n_pend; i++)
    at[pend_slot(d, d->pend[i].last_ms, d->pend[i].sha)] = (uint32_t)i + 1;
  return CPH_OK;
}

static void pend_clear(cph_dedupe *d) {
  d->n_pend = 0;
  if (d->cap_pend_at)
    memset(d->pend_at, 0, d->cap_pend_at * sizeof *d->pend_at);
}

void dd_entries_batch(cph_dedupe *d, size_t n) {
  (void)n; /* the arrays grow as needed and stay between requests */
  pend_clear(d);
  d->batching = true;
}

void dd_entries_forget(cph_dedupe *d) {
  pend_clear(d);
  d->batching = false;
}

static int pend_cmp(const void *a, const void *b) {
  const dd_pending *x = a, *y = b;
  if (x->last_ms != y->last_ms) /* as the key's be64 compares */
    return (uint64_t)x->last_ms < (uint64_t)y->last_ms ? -1 : 1;
  return memcmp(x->sha, y->sha, 32);
}

int dd_entries_flush(cph_dedupe *d, cph_txn *t) {
  if (!d->batching)
    return t->ret;
  d->batching = false;
  if (d->n_pend) /* qsort's array may not be NULL, even empty */
    qsort(d->pend, d->n_pend, sizeof *d->pend, pend_cmp); /* one per key: a total order */
  for (size_t i = 0; i < d->n_pend && !t->ret; i++) {
    const dd_pending *p = &d->pend[i];
    dd_entry e = {p->family, p->event_id, p->first_ms, p->last_ms, p->simhash};
    uint8_t v[ENTRY_LEN];
    entry_encode(&e, v);
    cph_key k = dd_xkey(p->last_ms, p->sha);
    cph_txn_append(t, CPH_DB_DEDUPE, &k, v, sizeof v); /* a key not past the last: a put */
  }
  pend_clear(d);
  return t->ret;
}

int dd_entry_write(cph_dedupe *d, cph_txn *t, int64_t last_ms, const uint8_t sha[32],
                   const dd_entry *e) {
  if (d->batching) {
    if (pend_room(d) == CPH_OK) {
      size_t i = pend_slot(d, last_ms, sha);
      if (!d->pend_at[i]) {
        dd_pending *p = &d->pend[d->n_pend];
        p->last_ms = last_ms;
        memcpy(p->sha, sha, 32);
        d->pend_at[i] = (uint32_t)++d->n_pend;
      }
      dd_pending *p = &d->pend[d->pend_at[i] - 1];
      p->family = e->family;
      p->event_id = e->event_id;
      p->first_ms = e->first_ms;
      p->simhash = e->simhash;
      return t->ret;
    }
    /* out of memory: what is held goes to the store now, and the rest of the request at once */
    if (dd_entries_flush(d, t))
      return t->ret;
  }
  cph_key k = dd_xkey(last_ms, sha);
  return dd_entry_put(t, &k, e);
}

/* CPH_OK with (last_ms, sha)'s entry in *en, held or stored; or CPH_ENOTFOUND. */
static int entry_read(const cph_dedupe *d, cph_txn *t, int64_t last_ms, const uint8_t sha[32],
                      dd_entry *en) {
  if (d->batching && d->n_pend) {
    uint32_t at = d->pend_at[pend_slot(d, last_ms, sha)];
    if (at) {
      const dd_pending *p = &d->pend[at - 1];
      *en = (dd_entry){p->family, p->event_id, p->first_ms, p->last_ms, p->simhash};
      return CPH_OK;
    }
  }
  cph_key k = dd_xkey(last_ms, sha);
  return entry_get(t, &k, en);
}

/* ---------------------------------------------------------------- the exact-entry filter */

uint64_t dd_xs_tag(const uint8_t sha[32]) {
  uint64_t tag = cph_be64_get(sha);
  return tag ? tag : 1;
}

/* Rehashes into cap slots (a power of two, room for every slot). CPH_ENOMEM leaves the table
 * as it was. O(old cap + cap). */
int dd_xs_resize(cph_dedupe *d, size_t cap) {
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
int dd_xs_reserve(cph_dedupe *d, size_t n) {
  size_t want = d->xs_len + n;
  if (d->xs_cap && want <= d->xs_cap / 4 * 3)
    return CPH_OK;
  size_t cap = d->xs_cap ? d->xs_cap : XS_MIN_CAP;
  while (want > cap / 4 * 3)
    cap *= 2;
  return dd_xs_resize(d, cap);
}

void dd_xs_prefetch(const cph_dedupe *d, const uint8_t sha[32]) {
  if (!d->xs_cap)
    return;
  size_t mask = d->xs_cap - 1, i = (size_t)dd_xs_tag(sha) & mask;
  __builtin_prefetch(&d->xs[i]);
  __builtin_prefetch(&d->xs[(i + 4) & mask]); /* a probe often runs on (3/4 full at most) */
}

/* The slot of sha's newest stored copy, with that entry read through t; XS_NONE when sha has
 * none. A hash never seen reads nothing from the store. */
size_t dd_xs_find(const cph_dedupe *d, cph_txn *t, const uint8_t sha[32], dd_entry *en) {
  if (!d->xs_cap)
    return XS_NONE;
  uint64_t tag = dd_xs_tag(sha);
  size_t mask = d->xs_cap - 1;
  for (size_t i = (size_t)tag & mask; d->xs[i].tag; i = (i + 1) & mask) {
    if (d->xs[i].tag != tag)
      continue;
    if (entry_read(d, t, d->xs[i].last_ms, sha, en) == CPH_OK)
      return i; /* else another hash with the same first 8 bytes, or an undecodable value */
  }
  return XS_NONE;
}

/* sha's newest copy is now the one at last_ms: its slot pos (xs_find's answer) follows, or a
 * new slot is taken. Logged for dedupe_rollback. Within a request the room was reserved by
 * dedupe_savepoint; without it (out of memory) the hash is left out — its repeats go
 * unnoticed, nothing worse. */
void dd_xs_set(cph_dedupe *d, size_t pos, const uint8_t sha[32], int64_t last_ms) {
  uint64_t tag = dd_xs_tag(sha);
  if (pos == XS_NONE || pos >= d->xs_cap || d->xs[pos].tag != tag) {
    /* growing moves slots: only while no position is logged */
    if (d->xs_len + 1 > d->xs_cap / 4 * 3 && (d->n_undo || dd_xs_reserve(d, 1)))
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
void dd_xs_forget(cph_dedupe *d, uint64_t tag, int64_t last_ms) {
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
int dd_xs_load(cph_dedupe *d, cph_txn *t) {
  size_t n = 0;
  if (cph_txn_count(t, CPH_DB_DEDUPE, &n) != CPH_OK)
    n = 0;
  if (dd_xs_reserve(d, n))
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
    uint64_t tag = dd_xs_tag(sha);
    if (d->xs_len + 1 > d->xs_cap / 4 * 3 && dd_xs_reserve(d, 1)) {
      rc = CPH_ENOMEM;
      break;
    }
    size_t mask = d->xs_cap - 1, i = (size_t)tag & mask;
    for (; d->xs[i].tag; i = (i + 1) & mask) {
      cph_val old;
      cph_key ok = dd_xkey(d->xs[i].last_ms, sha);
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
