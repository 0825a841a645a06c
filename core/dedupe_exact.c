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
void dd_exact_sha(cph_dedupe *d, const char *chan, const char *sender, const char *norm,
                  size_t norm_len, uint8_t out[32]) {
  const char *parts[3] = {chan, sender, norm};
  size_t lens[3] = {strlen(chan) + 1, strlen(sender) + 1, norm_len};
  sha256_of(d, parts, lens, 3, out);
}

void dd_content_sha(cph_dedupe *d, const char *norm, size_t norm_len, uint8_t out[32]) {
  const char *parts[1] = {norm};
  size_t lens[1] = {norm_len};
  sha256_of(d, parts, lens, 1, out);
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
    cph_key k = dd_xkey(d->xs[i].last_ms, sha);
    if (entry_get(t, &k, en) == CPH_OK)
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
