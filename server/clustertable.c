/* Cluster mode: the session table (see clustertable.h). */
#include "clustertable.h"

#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "common/hmap.h"

typedef struct chan_rec {
  char *name;
  const char **ids; /* borrowed from cph_ctable_session.id */
  size_t n, cap;
} chan_rec;

struct cph_ctable {
  uint32_t shards;
  cph_hmap sessions; /* id -> cph_ctable_session */
  cph_hmap channels; /* name -> chan_rec: its subscribers */
  cph_hmap members;  /* name -> chan_rec: its members that are not subscribers */
  cph_ctable_session **by_shard;
};

cph_ctable *cph_ctable_new(uint32_t shards) {
  cph_ctable *t = calloc(1, sizeof *t);
  if (!t || !(t->by_shard = calloc(shards ? shards : 1, sizeof *t->by_shard))) {
    free(t);
    return NULL;
  }
  t->shards = shards;
  return t;
}

static void session_free(cph_ctable_session *r) {
  json_decref(r->def);
  for (size_t i = 0; i < r->n_subs; i++)
    free(r->subs[i]);
  free(r->subs);
  for (size_t i = 0; i < r->n_members; i++)
    free(r->members[i]);
  free(r->members);
  free(r->id);
  free(r);
}

/* Frees a channel index (channels or members) and its records. */
static void chans_free(cph_hmap *map) {
  for (size_t i = 0; i < map->cap; i++)
    if (map->slots[i].key) {
      chan_rec *c = map->slots[i].value;
      free(c->name);
      free(c->ids);
      free(c);
    }
  cph_hmap_free(map);
}

void cph_ctable_free(cph_ctable *t) {
  if (!t)
    return;
  for (size_t i = 0; i < t->sessions.cap; i++)
    if (t->sessions.slots[i].key)
      session_free(t->sessions.slots[i].value);
  cph_hmap_free(&t->sessions);
  chans_free(&t->channels);
  chans_free(&t->members);
  free(t->by_shard);
  free(t);
}

static void chan_unlink(cph_hmap *map, const char *channel, const char *id) {
  chan_rec *c = cph_hmap_get(map, channel);
  if (!c)
    return;
  for (size_t i = 0; i < c->n; i++)
    if (c->ids[i] == id) {
      c->ids[i] = c->ids[--c->n];
      break;
    }
  if (c->n == 0) {
    cph_hmap_del(map, c->name);
    free(c->name);
    free(c->ids);
    free(c);
  }
}

/* Links id into channel's list in map; false on out of memory. */
static bool chan_link(cph_hmap *map, const char *channel, const char *id) {
  chan_rec *c = cph_hmap_get(map, channel);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c || !(c->name = strdup(channel)) || cph_hmap_put(map, c->name, c) != CPH_OK) {
      if (c)
        free(c->name);
      free(c);
      return false;
    }
  }
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 4;
    const char **ids = realloc(c->ids, cap * sizeof *ids);
    if (!ids) {
      if (c->n == 0) {
        cph_hmap_del(map, c->name);
        free(c->name);
        free(c);
      }
      return false;
    }
    c->ids = ids;
    c->cap = cap;
  }
  c->ids[c->n++] = id;
  return true;
}

/* Unlinks r from everything; linked: how many of its channels were linked (its subscriptions,
 * then its memberships). */
static void unlink_session(cph_ctable *t, cph_ctable_session *r, size_t linked) {
  cph_hmap_del(&t->sessions, r->id);
  if (r->shard_prev)
    r->shard_prev->shard_next = r->shard_next;
  else if (t->by_shard[r->shard] == r)
    t->by_shard[r->shard] = r->shard_next;
  if (r->shard_next)
    r->shard_next->shard_prev = r->shard_prev;
  for (size_t i = 0; i < linked && i < r->n_subs; i++)
    chan_unlink(&t->channels, r->subs[i], r->id);
  for (size_t i = r->n_subs; i < linked; i++)
    chan_unlink(&t->members, r->members[i - r->n_subs], r->id);
}

void cph_ctable_remove(cph_ctable *t, const char *id) {
  cph_ctable_session *r = cph_hmap_get(&t->sessions, id);
  if (!r)
    return;
  unlink_session(t, r, r->n_subs + r->n_members);
  session_free(r);
}

bool cph_ctable_put(cph_ctable *t, const char *id, const char *const *subs, size_t n, json_t *def) {
  cph_ctable_remove(t, id);
  cph_ctable_session *r = calloc(1, sizeof *r);
  if (!r || !(r->id = strdup(id)) || (n && !(r->subs = calloc(n, sizeof *r->subs)))) {
    if (r)
      free(r->id);
    free(r);
    return false;
  }
  r->shard = cph_cluster_shard_of(id, t->shards);
  r->def = json_incref(def);
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < r->n_subs; j++)
      seen |= strcmp(r->subs[j], subs[i]) == 0;
    if (seen)
      continue;
    if (!(r->subs[r->n_subs] = strdup(subs[i]))) {
      session_free(r);
      return false;
    }
    r->n_subs++;
  }
  json_t *member = json_object_get(def, "member");
  size_t n_member = json_array_size(member);
  if (n_member && !(r->members = calloc(n_member, sizeof *r->members))) {
    session_free(r);
    return false;
  }
  for (size_t i = 0; i < n_member; i++) {
    const char *name = json_string_value(json_array_get(member, i));
    bool seen = !name;
    for (size_t j = 0; !seen && j < r->n_subs; j++)
      seen = strcmp(r->subs[j], name) == 0;
    for (size_t j = 0; !seen && j < r->n_members; j++)
      seen = strcmp(r->members[j], name) == 0;
    if (seen)
      continue;
    if (!(r->members[r->n_members] = strdup(name))) {
      session_free(r);
      return false;
    }
    r->n_members++;
  }
  if (cph_hmap_put(&t->sessions, r->id, r) != CPH_OK) {
    session_free(r);
    return false;
  }
  r->shard_next = t->by_shard[r->shard];
  if (r->shard_next)
    r->shard_next->shard_prev = r;
  t->by_shard[r->shard] = r;
  for (size_t i = 0; i < r->n_subs + r->n_members; i++) {
    bool sub = i < r->n_subs;
    if (!chan_link(sub ? &t->channels : &t->members, sub ? r->subs[i] : r->members[i - r->n_subs],
                   r->id)) {
      unlink_session(t, r, i);
      session_free(r);
      return false;
    }
  }
  return true;
}

bool cph_ctable_record(cph_ctable *t, const char *id, const char *value, size_t vlen) {
  if (!value) {
    cph_ctable_remove(t, id);
    return true;
  }
  json_t *doc = json_loadb(value, vlen, 0, NULL);
  json_t *subs = json_object_get(doc, "subscribe");
  size_t n = json_array_size(subs);
  const char **names = calloc(n ? n : 1, sizeof *names);
  size_t k = 0;
  for (size_t i = 0; names && i < n; i++)
    if (json_is_string(json_array_get(subs, i)))
      names[k++] = json_string_value(json_array_get(subs, i));
  bool ok = doc && names && cph_ctable_put(t, id, names, k, json_object_get(doc, "def"));
  if (!ok)
    cph_ctable_remove(t, id);
  free(names);
  json_decref(doc);
  return ok;
}

const cph_ctable_session *cph_ctable_get(const cph_ctable *t, const char *id) {
  return cph_hmap_get(&t->sessions, id);
}

size_t cph_ctable_count(const cph_ctable *t) { return t->sessions.len; }

size_t cph_ctable_subscribers(const cph_ctable *t, const char *channel, const char *const **ids) {
  chan_rec *c = cph_hmap_get(&t->channels, channel);
  *ids = c ? c->ids : NULL;
  return c ? c->n : 0;
}

const cph_ctable_session *cph_ctable_shard_first(const cph_ctable *t, uint32_t shard) {
  return shard < t->shards ? t->by_shard[shard] : NULL;
}

size_t cph_ctable_members(const cph_ctable *t, const char *channel, const char *const **ids) {
  chan_rec *c = cph_hmap_get(&t->members, channel);
  *ids = c ? c->ids : NULL;
  return c ? c->n : 0;
}
