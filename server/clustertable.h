/* Cluster mode (DESIGN §14): the session table — which sessions exist in the cluster, on which
 * shard, subscribed to which channels, and their definitions. Fed from the key-value bucket
 * CEPH_SESSIONS (clusterlog.h) and by this node's own session changes; read by clusterflow.c
 * to check a named session, to find a channel's subscribers on other shards, and to adopt a
 * taken-over shard's sessions (clusterflow.h, 4. and 5.), and which nodes read a channel's
 * history — its subscribers' and its members' (clusterflow.h 14., 15.). The whole table is in
 * memory on every
 * node (docs/cluster-scaling.md has the cost). Loop thread only; O(1) expected per lookup,
 * O(channels of the session) per put or remove. */
#ifndef CEPHALON_SERVER_CLUSTERTABLE_H
#define CEPHALON_SERVER_CLUSTERTABLE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cph_ctable cph_ctable;

/* One session as the table knows it. Valid until the table changes. */
typedef struct cph_ctable_session {
  char *id;
  uint32_t shard; /* of id, computed once */
  json_t *def;    /* as its owner last put it ({"class", ...}; clusterflow.h, 4.), or NULL */
  char **subs;    /* its channels, each once */
  size_t n_subs;
  char **members; /* the channels it is a member of (def's "member"), not in subs, each once */
  size_t n_members;
  struct cph_ctable_session *shard_prev, *shard_next; /* the sessions of its shard */
} cph_ctable_session;

/* NULL on out of memory. */
cph_ctable *cph_ctable_new(uint32_t shards);
void cph_ctable_free(cph_ctable *t);

/* Sets a session (replacing what was known): its channels and its definition (NULL for none;
 * the table takes a reference). False on out of memory: the session is then unknown, which the
 * next put of its record mends. */
bool cph_ctable_put(cph_ctable *t, const char *id, const char *const *subs, size_t n, json_t *def);
void cph_ctable_remove(cph_ctable *t, const char *id);
/* A record of the bucket: {"subscribe": [...], "def": {...}} (value NULL: deleted). False when
 * it is malformed or memory ran out (then the session is unknown). */
bool cph_ctable_record(cph_ctable *t, const char *id, const char *value, size_t vlen);

const cph_ctable_session *cph_ctable_get(const cph_ctable *t, const char *id);
size_t cph_ctable_count(const cph_ctable *t);
/* The ids of the sessions subscribed to channel (each once), into the table; 0 when none. */
size_t cph_ctable_subscribers(const cph_ctable *t, const char *channel, const char *const **ids);
/* The ids of the sessions that are members of channel (DESIGN §2: they read its history, and
 * are triggered only when mentioned) and not subscribed to it, each once; 0 when none. */
size_t cph_ctable_members(const cph_ctable *t, const char *channel, const char *const **ids);
/* The first session of shard (then ->shard_next), or NULL. */
const cph_ctable_session *cph_ctable_shard_first(const cph_ctable *t, uint32_t shard);

#endif
