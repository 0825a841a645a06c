/* Dedupe's exact entries (DESIGN §5): their keys and values in LMDB and the in-memory
 * filter over the window. Contract in dedupe.h; the module's state in dedupe_internal.h.
 *
 * Stored (CPH_DB_DEDUPE), values encoded by hand, big-endian, led by a version byte:
 *   0xFE be64(row)               -> v2, be64(newest last_ms), then per entry (72 B):
 *                                   sha256(channel, sender, normalised body), family,
 *                                   original event id, first_ms, last_ms, simhash:
 *                                   a row of exact entries (schema 5)
 *   0xFF be64(last_ms) sha256(channel, sender, normalised body)
 *                                -> v1, family, original event id, first_ms, last_ms,
 *                                   simhash (41 B): an exact entry, time-ordered (schema 4)
 *   ""\0 sha256(normalised body) -> v1, family (9 B): the family index, content -> family
 *
 * An ingest request's exact entries are one row (rows numbered by the "dedupe_row" counter,
 * so each is put at the B-tree's end: one put per request, not one per event), and pruning
 * deletes rows from the front once their newest entry has expired. A repeat writes a new copy
 * into its request's row and leaves the older copy, which is stale from then on, for the
 * pruning to delete: the newest copy of a hash is the entry. Which copy that is lives in
 * memory (the filter below: the row and the entry's index in it), rebuilt at open by reading
 * the copies oldest first; so an event whose hash is new reads nothing from LMDB.
 *
 * Schema 4 wrote one time-ordered entry per copy (0xFF keys). A schema-4 store's entries are
 * read as they are — the filter names such a copy by its last_ms — and pruned from the front
 * like rows; they are all older than any row. Up to schema version 2 exact entries were keyed
 * channel\0 sha256(...): dedupe_open moves such entries into the time-ordered layout (same
 * value) in one write transaction, once. A channel name is never empty, so the family index
 * (a key starting \0) never collided with them; the rows' and the time-ordered keys start
 * with 0xFE and 0xFF, which no UTF-8 channel name does.
 *
 * A value that does not decode is logged with its key and treated as absent (it is an
 * index: the next write replaces it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/hugepage.h"
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

/* ---------------------------------------------------------------- rows */

cph_key dd_row_key(uint64_t row) {
  cph_key k;
  k.data[0] = ROW_TAG;
  cph_be64_put(k.data + 1, row);
  k.len = ROW_KEY_LEN;
  k.overflow = false;
  return k;
}

bool dd_row_decode(const cph_key *k, const cph_val *v, int64_t *newest_ms, size_t *n) {
  const uint8_t *p = v->data;
  if (k->len != ROW_KEY_LEN || v->len < ROW_HEAD + ROW_ENTRY ||
      (v->len - ROW_HEAD) % ROW_ENTRY || p[0] != ROW_VERSION) {
    char desc[160];
    cph_key_describe(k->data, k->len, desc, sizeof desc);
    cph_error("corrupt record in database \"dedupe\" at key %s: %zu bytes, not a v%d row of "
              "entries; ignored (pruning deletes it)",
              desc, v->len, ROW_VERSION);
    return false;
  }
  *newest_ms = (int64_t)cph_be64_get(p + 1);
  *n = (v->len - ROW_HEAD) / ROW_ENTRY;
  return true;
}

static void row_entry_encode(const dd_pending *e, uint8_t *out) {
  memcpy(out, e->sha, 32);
  cph_be64_put(out + 32, e->family);
  cph_be64_put(out + 40, e->event_id);
  cph_be64_put(out + 48, (uint64_t)e->first_ms);
  cph_be64_put(out + 56, (uint64_t)e->last_ms);
  cph_be64_put(out + 64, e->simhash);
}

static void row_entry_decode(const uint8_t *p, dd_entry *e) {
  e->family = cph_be64_get(p + 32);
  e->event_id = cph_be64_get(p + 40);
  e->first_ms = (int64_t)cph_be64_get(p + 48);
  e->last_ms = (int64_t)cph_be64_get(p + 56);
  e->simhash = cph_be64_get(p + 64);
}

/* Writes entries[0..n) as row `row` (after every row: appended), encoded in buf (room for
 * ROW_HEAD + n * ROW_ENTRY bytes). */
static int row_write(cph_txn *t, uint64_t row, const dd_pending *entries, size_t n,
                     uint8_t *buf) {
  int64_t newest = 0;
  for (size_t i = 0; i < n; i++) {
    row_entry_encode(&entries[i], buf + ROW_HEAD + i * ROW_ENTRY);
    if (entries[i].last_ms > newest)
      newest = entries[i].last_ms;
  }
  buf[0] = ROW_VERSION;
  cph_be64_put(buf + 1, (uint64_t)newest);
  cph_key k = dd_row_key(row);
  return cph_txn_append(t, CPH_DB_DEDUPE, &k, buf, ROW_HEAD + n * ROW_ENTRY);
}

/* ---------------------------------------------------------------- a request's held entries */

/* Room for one more held entry, and for the row's encoding. */
static int pend_room(cph_dedupe *d) {
  if (d->n_pend < d->cap_pend)
    return CPH_OK;
  size_t cap = d->cap_pend ? d->cap_pend * 2 : 256;
  uint8_t *b = realloc(d->rowbuf, ROW_HEAD + cap * ROW_ENTRY);
  if (!b)
    return CPH_ENOMEM;
  d->rowbuf = b;
  dd_pending *p = realloc(d->pend, cap * sizeof *p);
  if (!p)
    return CPH_ENOMEM; /* the larger rowbuf is kept: room for more than cap_pend */
  d->pend = p;
  d->cap_pend = cap;
  return CPH_OK;
}

void dd_entries_batch(cph_dedupe *d, size_t n) {
  (void)n; /* the array grows as needed and stays between requests */
  d->n_pend = 0;
  d->row = 0;
  d->batching = true;
}

void dd_entries_forget(cph_dedupe *d) {
  d->n_pend = 0;
  d->row = 0;
  d->batching = false;
}

/* Writes the held row, if any; holding goes on (a new row from the next entry). */
static int held_write(cph_dedupe *d, cph_txn *t) {
  if (d->n_pend)
    row_write(t, d->row, d->pend, d->n_pend, d->rowbuf);
  d->n_pend = 0;
  d->row = 0;
  return t->ret;
}

int dd_entries_flush(cph_dedupe *d, cph_txn *t) {
  if (!d->batching)
    return t->ret;
  held_write(d, t);
  d->batching = false;
  return t->ret;
}

int dd_entry_write(cph_dedupe *d, cph_txn *t, const uint8_t sha[32], const dd_entry *e,
                   uint64_t *loc) {
  dd_pending one = {e->last_ms, {0}, e->family, e->event_id, e->first_ms, e->simhash};
  memcpy(one.sha, sha, 32);
  if (d->batching && d->n_pend == ROW_MAX)
    held_write(d, t);
  if (d->batching && pend_room(d) != CPH_OK)
    held_write(d, t); /* out of memory: what is held goes now, the rest one row each */
  bool hold = d->batching && d->n_pend < d->cap_pend;
  uint64_t row = hold ? d->row : 0;
  if (!row && cph_txn_next_id(t, "dedupe_row", &row) != CPH_OK)
    return t->ret;
  if (!hold) {
    uint8_t buf[ROW_HEAD + ROW_ENTRY];
    *loc = LOC_OF(row, 0);
    return row_write(t, row, &one, 1, buf);
  }
  d->row = row;
  *loc = LOC_OF(row, d->n_pend);
  d->pend[d->n_pend++] = one;
  return t->ret;
}

/* CPH_OK with the copy of sha at loc in *en, held or stored; or CPH_ENOTFOUND (also when the
 * copy there is another hash's, or does not decode). */
static int entry_read(const cph_dedupe *d, cph_txn *t, uint64_t loc, const uint8_t sha[32],
                      dd_entry *en) {
  if (!(loc & LOC_ROW)) { /* a schema-4 entry: its key */
    cph_key k = dd_xkey((int64_t)loc, sha);
    return entry_get(t, &k, en);
  }
  uint64_t row = (loc & ~LOC_ROW) >> 16;
  size_t i = loc & 0xFFFF;
  if (d->batching && row == d->row) {
    if (i >= d->n_pend || memcmp(d->pend[i].sha, sha, 32))
      return CPH_ENOTFOUND;
    const dd_pending *p = &d->pend[i];
    *en = (dd_entry){p->family, p->event_id, p->first_ms, p->last_ms, p->simhash};
    return CPH_OK;
  }
  cph_key k = dd_row_key(row);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_DEDUPE, &k, &v);
  if (rc)
    return rc;
  int64_t newest;
  size_t n;
  if (!dd_row_decode(&k, &v, &newest, &n) || i >= n || memcmp(dd_row_sha(&v, i), sha, 32))
    return CPH_ENOTFOUND;
  row_entry_decode(dd_row_sha(&v, i), en);
  return CPH_OK;
}

/* ---------------------------------------------------------------- the exact-entry filter */

uint64_t dd_xs_tag(const uint8_t sha[32]) {
  uint64_t tag = cph_be64_get(sha);
  return tag ? tag : 1;
}

/* A zeroed table of cap slots. A large one is mapped on its own and asked for in huge pages:
 * its slots are hit at random, and with 4 KiB pages nearly every insert of a filter's load (a
 * restart with 10M stored events fills one of 256 MiB) missed the TLB as well as the cache.
 * Fresh anonymous pages are zero: nothing to clear. */
static xslot *xs_alloc(size_t cap) {
  size_t bytes = cap * sizeof(xslot);
  if (bytes < CPH_HUGE_PAGE)
    return calloc(cap, sizeof(xslot));
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  cph_huge_advise(p, bytes);
  return p;
}

void dd_xs_free(xslot *xs, size_t cap) {
  if (!xs)
    return;
  if (cap * sizeof(xslot) < CPH_HUGE_PAGE)
    free(xs);
  else
    munmap(xs, cap * sizeof(xslot));
}

/* Rehashes into cap slots (a power of two, room for every slot). CPH_ENOMEM leaves the table
 * as it was. O(old cap + cap). */
int dd_xs_resize(cph_dedupe *d, size_t cap) {
  xslot *xs = xs_alloc(cap);
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
  dd_xs_free(d->xs, d->xs_cap);
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
    if (entry_read(d, t, d->xs[i].loc, sha, en) == CPH_OK)
      return i; /* else another hash with the same first 8 bytes, or an undecodable value */
  }
  return XS_NONE;
}

/* sha's newest copy is now the one at last_ms: its slot pos (xs_find's answer) follows, or a
 * new slot is taken. Logged for dedupe_rollback. Within a request the room was reserved by
 * dedupe_savepoint; without it (out of memory) the hash is left out — its repeats go
 * unnoticed, nothing worse. */
void dd_xs_set(cph_dedupe *d, size_t pos, const uint8_t sha[32], uint64_t loc) {
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
  d->xs[pos] = (xslot){tag, loc};
}

/* Pruning deleted the copy (tag, last_ms): its slot goes if it names that copy (a newer copy
 * keeps it). Backward-shift deletion: the entries after it in the probe chain that may move
 * up, do. */
void dd_xs_forget(cph_dedupe *d, uint64_t tag, uint64_t loc) {
  if (!d->xs_cap)
    return;
  size_t mask = d->xs_cap - 1, i = (size_t)tag & mask;
  for (; d->xs[i].tag; i = (i + 1) & mask)
    if (d->xs[i].tag == tag && d->xs[i].loc == loc)
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

/* How many entries ahead of the one it inserts the filter's load fetches a slot: at 10M stored
 * events (a 256 MiB filter) its load took 1.1-1.2 s with, 1.9-2.0 s without. */
#define LOAD_AHEAD 16

/* sha's copy at loc is now the newest: it takes over the slot of an older copy of the same
 * hash, else a new one. */
static int load_copy(cph_dedupe *d, cph_txn *t, const uint8_t *sha, uint64_t loc) {
  uint64_t tag = dd_xs_tag(sha);
  if (d->xs_len + 1 > d->xs_cap / 4 * 3 && dd_xs_reserve(d, 1))
    return CPH_ENOMEM;
  size_t mask = d->xs_cap - 1, i = (size_t)tag & mask;
  for (; d->xs[i].tag; i = (i + 1) & mask) {
    dd_entry old;
    if (d->xs[i].tag == tag && entry_read(d, t, d->xs[i].loc, sha, &old) == CPH_OK)
      break; /* an older copy of the same hash */
  }
  if (!d->xs[i].tag)
    d->xs_len++;
  d->xs[i] = (xslot){tag, loc};
  return CPH_OK;
}

/* At most how many copies the stored entries hold: the time-ordered ones (one a key) and the
 * rows' (their lengths say; the load decodes them, and skips one that does not decode), read
 * through c without touching a row's pages. So the filter is sized once before it is filled:
 * sized by the database's keys (one a row), it grew on the way, and rehashing its slots took
 * a fifth of a restart with a million stored events. */
static size_t count_copies(cph_cursor *c) {
  size_t n = 0;
  cph_key from = {.data = {XKEY_TAG}, .len = 1};
  cph_val k, v;
  int rc;
  for (rc = cph_cursor_seek(c, &from, &k, &v); rc == CPH_OK; rc = cph_cursor_next(c, &k, &v))
    n += k.len == XKEY_LEN;
  from.data[0] = ROW_TAG;
  for (rc = cph_cursor_seek(c, &from, &k, &v);
       rc == CPH_OK && ((const uint8_t *)k.data)[0] == ROW_TAG; rc = cph_cursor_next(c, &k, &v))
    n += v.len > ROW_HEAD ? (v.len - ROW_HEAD) / ROW_ENTRY : 0;
  return n;
}

/* Builds the filter from the stored entries, read through t: schema 4's time-ordered ones
 * (all older than any row), then the rows in row order. */
int dd_xs_load(cph_dedupe *d, cph_txn *t) {
  cph_cursor c;
  int rc = cph_cursor_open(t, CPH_DB_DEDUPE, &c);
  if (rc)
    return rc;
  if (dd_xs_reserve(d, count_copies(&c))) {
    cph_cursor_close(&c);
    return CPH_ENOMEM;
  }
  cph_key from = {.data = {XKEY_TAG}, .len = 1};
  cph_val k, v;
  for (rc = cph_cursor_seek(&c, &from, &k, &v); rc == CPH_OK; rc = cph_cursor_next(&c, &k, &v)) {
    const uint8_t *kp = k.data;
    if (k.len != XKEY_LEN)
      continue; /* not an entry: pruning deletes it */
    if ((rc = load_copy(d, t, kp + 9, cph_be64_get(kp + 1))) != CPH_OK)
      break;
  }
  from.data[0] = ROW_TAG;
  if (rc == CPH_ENOTFOUND)
    rc = cph_cursor_seek(&c, &from, &k, &v);
  for (; rc == CPH_OK && ((const uint8_t *)k.data)[0] == ROW_TAG;
       rc = cph_cursor_next(&c, &k, &v)) {
    cph_key rk;
    cph_key_reset(&rk);
    dd_key_bytes(&rk, k.data, k.len);
    int64_t newest;
    size_t entries;
    if (!dd_row_decode(&rk, &v, &newest, &entries))
      continue;
    uint64_t row = cph_be64_get((const uint8_t *)k.data + 1);
    /* load_copy reads other rows: the value is the map's, which reads do not move */
    for (size_t i = 0; i < entries && rc == CPH_OK; i++) {
      /* a large filter is past the caches: ask for the slot of an entry a few ahead */
      if (i + LOAD_AHEAD < entries)
        dd_xs_prefetch(d, dd_row_sha(&v, i + LOAD_AHEAD));
      rc = load_copy(d, t, dd_row_sha(&v, i), LOC_OF(row, i));
    }
  }
  cph_cursor_close(&c);
  return rc == CPH_ENOTFOUND ? CPH_OK : rc;
}
