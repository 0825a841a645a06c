/* Near content dedupe, duplicate families and the per-event protocol (DESIGN §5); contract in
 * dedupe.h. The exact entries and their store are dedupe_exact.c; the text functions
 * (normalising, simhash) dedupe_text.c; the state all three share dedupe_internal.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "dedupe_internal.h"

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
  if (d->last_ring && strcmp(d->last_ring->name, chan) == 0)
    return d->last_ring;
  dd_channel *dc = cph_hmap_get(&d->channels, chan);
  if (dc)
    d->last_ring = dc;
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

/* ---------------------------------------------------------------- the text half */

static int hasher_init(cph_event_hasher *h) {
  if (!(h->md = EVP_MD_CTX_new()))
    return CPH_ENOMEM;
  h->sha256 = EVP_MD_fetch(NULL, "SHA256", NULL); /* NULL: sha256_of falls back */
  return CPH_OK;
}

static void hasher_fini(cph_event_hasher *h) {
  EVP_MD_CTX_free(h->md);
  EVP_MD_free(h->sha256);
}

cph_event_hasher *dedupe_hasher_new(void) {
  cph_event_hasher *h = calloc(1, sizeof *h);
  if (h && hasher_init(h) != CPH_OK) {
    free(h);
    h = NULL;
  }
  return h;
}

void dedupe_hasher_free(cph_event_hasher *h) {
  if (h) {
    hasher_fini(h);
    free(h);
  }
}

void dedupe_prefetch(const cph_dedupe *d, const uint8_t sha256[32]) { dd_xs_prefetch(d, sha256); }

/* The near-duplicate hashes of a normalised text, for sender. */
static void text_hashes(const char *norm, size_t norm_len, const char *sender, int shingle_words,
                        uint64_t *simhash, uint64_t *idsig, uint64_t *sender_hash) {
  *simhash = dedupe_simhash(norm, norm_len, shingle_words);
  *idsig = dedupe_idsig(norm, norm_len);
  *sender_hash = dd_fnv1a64(sender, strlen(sender)) | 1; /* never 0: 0 means any sender */
}

int dedupe_prepare(cph_event_hasher *h, const char *chan, const char *sender, const char *body,
                   int32_t shingle_words, int64_t min_length, cph_event_prep *out) {
  memset(out, 0, sizeof *out);
  size_t norm_len;
  char *norm = dedupe_normalise(body, &norm_len);
  if (!norm)
    return CPH_ENOMEM;
  dd_exact_sha(h, chan, sender, norm, norm_len, out->sha256);
  out->norm_len = norm_len;
  out->shingle_words = shingle_words;
  if ((int64_t)norm_len >= min_length) {
    text_hashes(norm, norm_len, sender, (int)shingle_words, &out->simhash, &out->idsig,
                &out->sender_hash);
    out->hashed = true;
  }
  free(norm);
  out->ready = true;
  return CPH_OK;
}

/* ---------------------------------------------------------------- per event, in the pass */

int dedupe_classify(cph_dedupe *d, const cph_policy_dedupe *p, cph_txn *t, const char *chan,
                    const char *sender, const char *body, int64_t now_ms, uint32_t window_mult,
                    dedupe_near near, const cph_event_prep *pre, dedupe_verdict *v) {
  memset(v, 0, sizeof *v);
  v->ring_index = -1;
  if (pre && !pre->ready)
    pre = NULL;
  if (pre) {
    memcpy(v->sha256, pre->sha256, sizeof v->sha256);
    v->norm_len = pre->norm_len;
  } else {
    v->norm = dedupe_normalise(body, &v->norm_len);
    if (!v->norm)
      return CPH_ENOMEM;
    dd_exact_sha(&d->hash, chan, sender, v->norm, v->norm_len, v->sha256);
  }
  if (p->window_seconds <= 0 || (int64_t)v->norm_len < p->min_length)
    return CPH_OK;
  v->eligible = true;
  dd_xs_prefetch(d, v->sha256); /* the filter's probe below: loaded while the text is hashed */
  if (pre && pre->hashed && pre->shingle_words == p->shingle_words) {
    v->simhash = pre->simhash;
    v->idsig = pre->idsig;
    v->sender_hash = pre->sender_hash;
  } else { /* not prepared, or under other settings (a reload came between) */
    if (!v->norm && !(v->norm = dedupe_normalise(body, &v->norm_len)))
      return CPH_ENOMEM;
    text_hashes(v->norm, v->norm_len, sender, (int)p->shingle_words, &v->simhash, &v->idsig,
                &v->sender_hash);
  }
  int64_t window_ms = p->window_seconds * 1000 * (int64_t)(window_mult ? window_mult : 1);

  dd_entry en;
  v->xslot = dd_xs_find(d, t, v->sha256, &en);
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
  cph_key fk = dd_family_key(family);
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
  cph_key ek = dd_family_key(v->original_event); /* same layout: one u64 */
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
  dd_content_sha(&d->hash, norm, nlen, csha);
  free(norm);

  int rc = CPH_OK;
  cph_key ik = dd_index_key(csha);
  cph_val iv;
  uint64_t family = 0;
  if (cph_txn_get(t, CPH_DB_DEDUPE, &ik, &iv) == CPH_OK) {
    const uint8_t *p = iv.data;
    if (iv.len == INDEX_LEN && p[0] == ENTRY_VERSION)
      family = cph_be64_get(p + 1);
    else
      dd_log_bad_value(&ik, iv.len);
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
    a.sample = dd_sample_dup(sample, DEDUPE_SAMPLE_MAX);
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
    cph_key fk = dd_family_key(family);
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
  /* The original's own exact entry joins too, so its sender's next repeat lands here (a newer
   * copy of it, in this request's row). An exact repeat's original has the repeat's hash: the
   * copy dedupe_write adds next carries the family and supersedes it. */
  if (rc == CPH_OK && have_orig && memcmp(orig.body_sha256, v->sha256, 32) != 0) {
    dd_entry en;
    size_t pos = dd_xs_find(d, t, orig.body_sha256, &en);
    uint64_t loc;
    if (pos != XS_NONE && en.event_id == v->original_event && !en.family) {
      en.family = family; /* a newer copy, its last_ms kept: the window does not slide */
      rc = dd_entry_write(d, t, orig.body_sha256, &en, &loc);
      if (rc == CPH_OK)
        dd_xs_set(d, pos, orig.body_sha256, loc); /* in place: pos holds its tag */
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
  /* in the request's row: the older copy, if any, goes stale */
  return dd_entry_write(d, t, v->sha256, &en, &v->xloc);
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
  dd_xs_set(d, v->xslot, v->sha256, v->xloc);
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
  dd_entries_batch(d, n_events);
  d->n_undo = 0;
  if (dd_xs_reserve(d, n_events) == CPH_OK && d->cap_undo < n_events) {
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
  d->last_ring = NULL;
  for (size_t i = 0; i < d->channels.cap; i++)
    if (d->channels.slots[i].key)
      ring_free(d->channels.slots[i].value);
  cph_hmap_free(&d->channels);
}

int dedupe_copy_seen(cph_dedupe *d, cph_txn *t, int64_t ts_ms, const uint8_t *id, size_t id_len,
                     bool *seen) {
  *seen = false;
  cph_key k;
  k.data[0] = COPY_TAG;
  cph_be64_put(k.data + 1, (uint64_t)ts_ms);
  memset(k.data + 9, 0, COPY_ID_LEN);
  memcpy(k.data + 9, id, id_len < COPY_ID_LEN ? id_len : COPY_ID_LEN);
  k.len = COPY_KEY_LEN;
  k.overflow = false;
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_DEDUPE, &k, &v);
  if (rc == CPH_OK) {
    *seen = true;
    return CPH_OK;
  }
  if (rc != CPH_ENOTFOUND)
    return rc;
  if (d)
    d->added_since_prune++; /* pruned with the exact entries */
  return cph_txn_put(t, CPH_DB_DEDUPE, &k, "", 0);
}

int dedupe_flush(cph_dedupe *d, cph_txn *t) { return d ? dd_entries_flush(d, t) : t->ret; }

void dedupe_rollback(cph_dedupe *d) {
  if (!d)
    return;
  dd_entries_forget(d);
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
 * 0x01 up to the copy marks, rows and time-ordered ones (a channel name is UTF-8: it starts
 * below 0xF5). O(log n). */
static bool has_old_entries(cph_txn *t) {
  cph_cursor c;
  if (cph_cursor_open(t, CPH_DB_DEDUPE, &c) != CPH_OK)
    return false;
  cph_key from = {.data = {0x01}, .len = 1};
  cph_val k, v;
  bool old = cph_cursor_seek(&c, &from, &k, &v) == CPH_OK &&
             ((const uint8_t *)k.data)[0] < COPY_TAG;
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
    if (rc == CPH_OK && ((const uint8_t *)k.data)[0] >= COPY_TAG)
      rc = CPH_ENOTFOUND;
    cph_key old;
    dd_entry en;
    bool ok = false;
    if (rc == CPH_OK) {
      cph_key_reset(&old);
      dd_key_bytes(&old, k.data, k.len);
      ok = k.len >= 34 && dd_entry_decode(&v, &en);
      if (!ok)
        dd_log_bad_value(&old, v.len);
    }
    cph_cursor_close(&c);
    if (rc == CPH_ENOTFOUND)
      return CPH_OK;
    if (rc)
      return rc;
    rc = cph_txn_del(w, CPH_DB_DEDUPE, &old);
    if (rc == CPH_OK && ok) {
      cph_key nk = dd_xkey(en.last_ms, old.data + old.len - 32);
      rc = dd_entry_put(w, &nk, &en);
      (*moved)++;
    }
    if (rc)
      return rc;
  }
}

int dedupe_open(cph_txn *t, cph_dedupe **out, cph_err *err) {
  *out = NULL;
  cph_dedupe *d = calloc(1, sizeof *d);
  if (!d || hasher_init(&d->hash) != CPH_OK) {
    free(d);
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening dedupe");
  }

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
  rc = dd_xs_load(d, t);
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
  hasher_fini(&d->hash);
  dd_xs_free(d->xs, d->xs_cap);
  free(d->undo);
  free(d->pend);
  free(d->rowbuf);
  free(d);
}

/* Deletes expired exact entries (and stale copies) from the front of the stored ones — schema
 * 4's time-ordered entries, then the rows (a row when its newest entry has expired), then the
 * copy marks whose message's time left the window — at most the budget of entries per call,
 * and forgets their filter slots. */
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
  uint64_t seen = 0;
  int rc = cph_cursor_seek(&c, &from, &k, &v);
  for (; rc == CPH_OK && seen < budget; seen++) {
    const uint8_t *kp = k.data;
    if (k.len == XKEY_LEN) {
      int64_t last_ms = (int64_t)cph_be64_get(kp + 1);
      if (now_ms - last_ms <= keep_ms)
        break; /* the rest is newer */
      /* If the commit below fails, the slot is gone while its expired entry stays: a miss
       * either way. */
      dd_xs_forget(d, dd_xs_tag(kp + 9), (uint64_t)last_ms);
    } /* else not an entry of ours: deleted too */
    if (cph_cursor_del(&c) != CPH_OK)
      break;
    /* after a delete LMDB's cursor already stands on the next entry; MDB_NEXT returns it */
    rc = cph_cursor_next(&c, &k, &v);
  }
  from.data[0] = ROW_TAG;
  rc = seen < budget ? cph_cursor_seek(&c, &from, &k, &v) : CPH_ENOTFOUND;
  while (rc == CPH_OK && seen < budget && ((const uint8_t *)k.data)[0] == ROW_TAG) {
    cph_key rk;
    cph_key_reset(&rk);
    dd_key_bytes(&rk, k.data, k.len);
    int64_t newest;
    size_t n;
    if (dd_row_decode(&rk, &v, &newest, &n)) {
      if (now_ms - newest <= keep_ms)
        break; /* rows are written in time order: the rest is newer */
      uint64_t row = cph_be64_get((const uint8_t *)k.data + 1);
      for (size_t i = 0; i < n; i++)
        dd_xs_forget(d, dd_xs_tag(dd_row_sha(&v, i)), LOC_OF(row, i));
      seen += n;
    } else {
      seen++; /* not a row: deleted too */
    }
    if (cph_cursor_del(&c) != CPH_OK)
      break;
    rc = cph_cursor_next(&c, &k, &v);
  }
  /* the copy marks, in the order of their messages' times */
  from.data[0] = COPY_TAG;
  rc = seen < budget ? cph_cursor_seek(&c, &from, &k, &v) : CPH_ENOTFOUND;
  for (; rc == CPH_OK && seen < budget && ((const uint8_t *)k.data)[0] == COPY_TAG; seen++) {
    if (k.len == COPY_KEY_LEN &&
        now_ms - (int64_t)cph_be64_get((const uint8_t *)k.data + 1) <= keep_ms)
      break; /* the rest is newer */
    if (cph_cursor_del(&c) != CPH_OK)
      break;
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
    dd_xs_resize(d, cap); /* out of memory: keeps the larger table */
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
  if (n)
    d->last_ring = NULL;
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
    cph_key fk = dd_family_key(d->top[i].family);
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
