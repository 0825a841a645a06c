/* Cluster mode, first slice: membership and shard ownership in etcd (see cluster.h). */
#include "cluster.h"

#include "common/buf.h"
#include "common/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/http_client.h"
#include "common/log.h"

/* Ownership is read again when etcd's watch says a node or shard key changed, and at least
 * this often (a net for a watch that broke, or a change the watch missed while it reconnected). */
#define RECONCILE_EVERY_NS 1000000000LL
#define TURN_SLOTS 65536
#define NODE_PREFIX "/cephalon/nodes/"
#define SHARD_PREFIX "/cephalon/shards/"
#define SLOT_PREFIX "/cephalon/slots/" /* :cluster :concurrency: /cephalon/slots/<k> -> node */
#define DEMAND_PREFIX "/cephalon/demand/"
#define BUDGET_EVERY_NS 1000000000LL /* the budgets are rebalanced every second (§14) */
#define NO_OWNER UINT32_MAX

typedef struct node {
  char *name;
  char *url;
} node;

struct cph_cluster {
  /* Configuration (copied at start, never changed). */
  char *self;
  char *advertise;
  char **etcd;
  size_t n_etcd;
  uint32_t shards;
  int64_t ttl_s;
  int64_t concurrency; /* :cluster :concurrency; 0: each node its :scheduler :concurrency */

  pthread_t thread;
  bool started;
  pthread_t watch_thread;
  bool watch_started;
  bool poked; /* under mu: the watch saw a node or shard key change */

  /* Shared with the loop, under mu. owner[] indexes nodes[]; NO_OWNER for unclaimed. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  node *nodes;
  size_t n_nodes;
  uint32_t *owner;
  int64_t serve_until_ns; /* monotonic; 0 = not joined */
  bool joined;

  /* Budgets (DESIGN §14): the loop's demand (runnable sessions per lane), published every
   * second; this node's share of each lane's budget, worked out from every node's. */
  uint64_t demand[CPH_LANE_COUNT];
  double share[CPH_LANE_COUNT];
  bool have_share;
  /* :cluster :concurrency (slots_round): the loop's busy count (running + runnable turns),
   * published with the demand; this node's target worked out from every node's; the limit
   * offered to the loop (never more than the slots held in etcd); what the loop last applied
   * and how many turns it was running then. */
  uint64_t busy;
  uint32_t slots;
  uint32_t offer;
  uint32_t applied, running_after;

  /* Takeovers: when each shard was first seen without an owner (0 = it has one), how many
   * shards this node claimed, and how long the last one it claimed had been without. */
  int64_t *unowned_since_ns;
  uint64_t claimed_total;
  double last_takeover_s;

  /* The etcd thread's own. */
  uint32_t *held; /* the slot keys this node holds, under held_lease */
  size_t n_held;
  int64_t held_lease;
  int64_t next_budget_ns;
  size_t etcd_at; /* the endpoint in use; moves on a transport error */
  int64_t lease;  /* 0 = none */
  int64_t next_keepalive_ns;

  /* The loop's own: turn id -> shard, direct-mapped. */
  uint64_t turn_id[TURN_SLOTS];
  uint32_t turn_shard[TURN_SLOTS];
};

/* ================================================================ hashing and the map */

uint32_t cph_cluster_shard_of(const char *id, uint32_t shards) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(id, strlen(id), md, &len, EVP_sha256(), NULL);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = (v << 8) | md[i];
  return shards ? (uint32_t)(v % shards) : 0;
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
  return h;
}

void cph_cluster_assign(const char *const *nodes, size_t n, uint32_t shards, uint32_t *owner) {
  if (n == 0) {
    for (uint32_t s = 0; s < shards; s++)
      owner[s] = NO_OWNER;
    return;
  }
  uint32_t *room = calloc(n, sizeof *room);
  uint64_t *nh = calloc(n, sizeof *nh);
  if (!room || !nh) { /* fall back to round robin: still even and deterministic */
    for (uint32_t s = 0; s < shards; s++)
      owner[s] = (uint32_t)(s % n);
    free(room);
    free(nh);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    room[i] = (uint32_t)(shards / n + (i < shards % n ? 1 : 0));
    nh[i] = name_hash(nodes[i]);
  }
  for (uint32_t s = 0; s < shards; s++) {
    size_t best = n;
    uint64_t best_score = 0;
    for (size_t i = 0; i < n; i++) {
      if (!room[i])
        continue;
      uint64_t score = mix64(nh[i] ^ mix64(s + 1));
      if (best == n || score > best_score) {
        best = i;
        best_score = score;
      }
    }
    owner[s] = (uint32_t)best; /* total room == shards, so some node has room */
    room[best]--;
  }
  free(room);
  free(nh);
}

/* ================================================================ etcd over JSON */

static char *b64(const char *s) {
  size_t n = strlen(s);
  char *out = malloc(4 * ((n + 2) / 3) + 1);
  if (out)
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
  return out;
}

/* Decodes base64 text into a NUL-terminated string; NULL when malformed. */
static char *unb64(const char *s) {
  size_t n = strlen(s);
  if (n % 4)
    return NULL;
  unsigned char *out = malloc(n / 4 * 3 + 1);
  if (!out)
    return NULL;
  int len = n ? EVP_DecodeBlock(out, (const unsigned char *)s, (int)n) : 0;
  if (len < 0) {
    free(out);
    return NULL;
  }
  for (size_t i = n; i > 0 && s[i - 1] == '='; i--)
    len--;
  out[len] = '\0';
  return (char *)out;
}

/* The key just past every key with this prefix (etcd's range_end for a prefix). */
static char *prefix_end(const char *prefix) {
  char *e = strdup(prefix);
  if (e)
    e[strlen(e) - 1]++;
  return e;
}

/* POSTs body to path on the current etcd endpoint; the answer as JSON, or NULL (logged at
 * debug; a transport error moves to the next endpoint). */
static json_t *etcd_call(cph_cluster *c, const char *path, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (!text)
    return NULL;
  const char *base = c->etcd[c->etcd_at % c->n_etcd];
  cph_httpc_url url;
  const char *why = NULL;
  json_t *out = NULL;
  if (cph_httpc_url_parse(base, &url, &why) != 0) {
    cph_httpc_url_free(&url);
    free(text);
    return NULL;
  }
  int timeout = (int)(c->ttl_s * 1000 / 4);
  if (timeout > 1000)
    timeout = 1000;
  cph_httpc_request req = {.method = "POST",
                           .path = path,
                           .body = text,
                           .body_len = strlen(text),
                           .timeout_ms = timeout,
                           .user_agent = "cephalond-cluster"};
  cph_httpc_response resp = {0};
  char err[256] = "";
  int rc = cph_httpc_do(&url, &req, &resp, err, sizeof err);
  if (rc != CPH_HTTPC_OK) {
    cph_debug("cluster: etcd %s%s: %s", base, path, err);
    c->etcd_at++;
  } else if (resp.status != 200) {
    cph_debug("cluster: etcd %s%s: HTTP %d %.200s", base, path, resp.status,
              resp.body ? resp.body : "");
  } else {
    out = json_loadb(resp.body, resp.body_len, 0, NULL);
  }
  cph_httpc_response_free(&resp);
  cph_httpc_url_free(&url);
  free(text);
  return out;
}

/* etcd's int64 fields come as JSON strings; absent means 0 (proto3). */
static int64_t i64_of(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (json_is_string(v))
    return strtoll(json_string_value(v), NULL, 10);
  if (json_is_integer(v))
    return json_integer_value(v);
  return 0;
}

static json_t *lease_id_json(int64_t id) {
  char buf[32];
  snprintf(buf, sizeof buf, "%" PRId64, id);
  return json_string(buf);
}

static void forget_owners_locked(cph_cluster *c) {
  for (uint32_t s = 0; s < c->shards; s++)
    c->owner[s] = NO_OWNER;
}

/* Grants a lease and registers the node under it. Sets c->lease and the deadline. */
static bool etcd_join(cph_cluster *c) {
  int64_t sent = cph_mono_ns();
  json_t *r = etcd_call(c, "/v3/lease/grant", json_pack("{sI}", "TTL", (json_int_t)c->ttl_s));
  int64_t id = r ? i64_of(r, "ID") : 0, ttl = r ? i64_of(r, "TTL") : 0;
  json_decref(r);
  if (!id || ttl <= 0)
    return false;
  char key[512];
  snprintf(key, sizeof key, NODE_PREFIX "%s", c->self);
  char *k = b64(key), *v = b64(c->advertise);
  json_t *put =
      k && v ? json_pack("{ssssso}", "key", k, "value", v, "lease", lease_id_json(id)) : NULL;
  free(k);
  free(v);
  r = put ? etcd_call(c, "/v3/kv/put", put) : NULL;
  bool ok = r != NULL;
  json_decref(r);
  if (!ok)
    return false;
  c->lease = id;
  c->next_keepalive_ns = sent + ttl * 1000000000 / 4;
  pthread_mutex_lock(&c->mu);
  forget_owners_locked(c); /* a view from an older lease says nothing now */
  c->serve_until_ns = sent + ttl * 1000000000 - ttl * 1000000000 / 5;
  c->joined = true;
  pthread_mutex_unlock(&c->mu);
  cph_info("cluster: node %s joined (lease %" PRId64 ", ttl %" PRId64 " s)", c->self, id, ttl);
  return true;
}

static void keepalive(cph_cluster *c) {
  int64_t sent = cph_mono_ns();
  json_t *r = etcd_call(c, "/v3/lease/keepalive", json_pack("{so}", "ID", lease_id_json(c->lease)));
  if (!r)
    return; /* etcd unreachable: try again next poll; the deadline keeps running */
  json_t *res = json_object_get(r, "result");
  int64_t ttl = res ? i64_of(res, "TTL") : 0;
  json_decref(r);
  if (ttl <= 0) { /* the lease is gone in etcd: this node owns nothing any more */
    cph_warn("cluster: lease %" PRId64 " expired; rejoining", c->lease);
    c->lease = 0;
    pthread_mutex_lock(&c->mu);
    forget_owners_locked(c);
    c->serve_until_ns = 0;
    c->joined = false;
    pthread_mutex_unlock(&c->mu);
    return;
  }
  c->next_keepalive_ns = sent + ttl * 1000000000 / 4;
  pthread_mutex_lock(&c->mu);
  c->serve_until_ns = sent + ttl * 1000000000 - ttl * 1000000000 / 5;
  pthread_mutex_unlock(&c->mu);
}

/* Every key under prefix as (key without the prefix, value) pairs; NULL on failure. */
static json_t *range_prefix(cph_cluster *c, const char *prefix) {
  char *end = prefix_end(prefix);
  char *k = b64(prefix), *e = end ? b64(end) : NULL;
  free(end);
  json_t *req = k && e ? json_pack("{ssss}", "key", k, "range_end", e) : NULL;
  free(k);
  free(e);
  json_t *r = req ? etcd_call(c, "/v3/kv/range", req) : NULL;
  if (!r)
    return NULL;
  json_t *out = json_object();
  json_t *kvs = json_object_get(r, "kvs");
  size_t i;
  json_t *kv;
  json_array_foreach(kvs, i, kv) {
    const char *ks = json_string_value(json_object_get(kv, "key"));
    const char *vs = json_string_value(json_object_get(kv, "value"));
    char *key = unb64(ks ? ks : ""), *val = unb64(vs ? vs : "");
    if (key && val && strncmp(key, prefix, strlen(prefix)) == 0)
      json_object_set_new(out, key + strlen(prefix), json_string(val));
    free(key);
    free(val);
  }
  json_decref(r);
  return out;
}

/* A txn on key: claim (create if absent, under the lease) or release (delete while the value
 * is this node). True when it succeeded. */
static bool key_txn(cph_cluster *c, const char *key, bool claim) {
  char *k = b64(key), *v = b64(c->self);
  json_t *req = NULL;
  if (k && v && claim)
    req = json_pack("{s[{ssssssss}]s[{s{ssssso}}]}", "compare", "target", "CREATE", "key", k,
                    "create_revision", "0", "result", "EQUAL", "success", "request_put", "key", k,
                    "value", v, "lease", lease_id_json(c->lease));
  else if (k && v)
    req = json_pack("{s[{ssssssss}]s[{s{ss}}]}", "compare", "target", "VALUE", "key", k, "value", v,
                    "result", "EQUAL", "success", "request_delete_range", "key", k);
  free(k);
  free(v);
  json_t *r = req ? etcd_call(c, "/v3/kv/txn", req) : NULL;
  bool ok = r && json_is_true(json_object_get(r, "succeeded"));
  json_decref(r);
  return ok;
}

/* A txn on /cephalon/shards/<s> (key_txn). */
static bool shard_txn(cph_cluster *c, uint32_t s, bool claim) {
  char key[64];
  snprintf(key, sizeof key, SHARD_PREFIX "%" PRIu32, s);
  return key_txn(c, key, claim);
}

static void free_nodes(node *nodes, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(nodes[i].name);
    free(nodes[i].url);
  }
  free(nodes);
}

static int cmp_node(const void *a, const void *b) {
  return strcmp(((const node *)a)->name, ((const node *)b)->name);
}

/* One poll: read nodes and owners, claim and release, publish the view. */
static void reconcile(cph_cluster *c) {
  json_t *jn = range_prefix(c, NODE_PREFIX);
  json_t *js = jn ? range_prefix(c, SHARD_PREFIX) : NULL;
  if (!jn || !js) {
    json_decref(jn);
    return;
  }
  size_t n = json_object_size(jn);
  node *nodes = calloc(n ? n : 1, sizeof *nodes);
  const char **names = calloc(n ? n : 1, sizeof *names);
  uint32_t *want = calloc(c->shards, sizeof *want);
  uint32_t *have = calloc(c->shards, sizeof *have);
  if (!nodes || !names || !want || !have)
    goto out;
  size_t i = 0;
  const char *name;
  json_t *url;
  json_object_foreach(jn, name, url) {
    nodes[i].name = strdup(name);
    nodes[i].url = strdup(json_string_value(url));
    i++;
  }
  qsort(nodes, n, sizeof *nodes, cmp_node);
  size_t self = n;
  for (i = 0; i < n; i++) {
    names[i] = nodes[i].name;
    if (strcmp(nodes[i].name, c->self) == 0)
      self = i;
  }
  cph_cluster_assign(names, n, c->shards, want);
  for (uint32_t s = 0; s < c->shards; s++)
    have[s] = NO_OWNER;
  const char *skey;
  json_t *sval;
  json_object_foreach(js, skey, sval) {
    char *end = NULL;
    unsigned long s = strtoul(skey, &end, 10);
    if (!end || *end || s >= c->shards)
      continue;
    for (i = 0; i < n; i++)
      if (strcmp(nodes[i].name, json_string_value(sval)) == 0)
        have[s] = (uint32_t)i;
  }
  /* A node missing from its own view (its key lost with an old lease) claims nothing. */
  int64_t now = cph_mono_ns();
  uint64_t claimed = 0;
  double takeover_s = -1;
  for (uint32_t s = 0; s < c->shards; s++)
    if (have[s] == NO_OWNER && !c->unowned_since_ns[s])
      c->unowned_since_ns[s] = now;
  if (self < n && c->lease) {
    /* Stop serving what this node gives up before its key is deleted: from then on another node
     * may claim the shard and fence it (clusterlog.c, take_fences), and what this node still
     * writes to it is checked against serving it. */
    pthread_mutex_lock(&c->mu);
    for (uint32_t s = 0; s < c->shards; s++)
      if (have[s] == self && want[s] != self)
        c->owner[s] = NO_OWNER;
    pthread_mutex_unlock(&c->mu);
    for (uint32_t s = 0; s < c->shards; s++) {
      if (want[s] == self && have[s] == NO_OWNER && shard_txn(c, s, true)) {
        have[s] = (uint32_t)self;
        claimed++;
        takeover_s = (double)(cph_mono_ns() - c->unowned_since_ns[s]) / 1e9;
      } else if (have[s] == self && want[s] != self && shard_txn(c, s, false)) {
        have[s] = NO_OWNER;
      }
    }
  }
  for (uint32_t s = 0; s < c->shards; s++)
    if (have[s] != NO_OWNER)
      c->unowned_since_ns[s] = 0;
  pthread_mutex_lock(&c->mu);
  c->claimed_total += claimed;
  if (takeover_s >= 0)
    c->last_takeover_s = takeover_s;
  free_nodes(c->nodes, c->n_nodes);
  c->nodes = nodes;
  c->n_nodes = n;
  memcpy(c->owner, have, c->shards * sizeof *have);
  pthread_mutex_unlock(&c->mu);
  nodes = NULL;
out:
  free_nodes(nodes, nodes ? n : 0);
  free(names);
  free(want);
  free(have);
  json_decref(jn);
  json_decref(js);
}

/* This node's share of a lane's budget: a quarter of the budget is split evenly between the
 * live nodes (so a node whose work just arrived can start at once), the rest in proportion
 * to their demand; all of it evenly while no node has any. Every node computes its own from
 * the same keys, so the shares sum to 1 — up to a view that lags by a poll. */
static double share_of(uint64_t mine, uint64_t total, size_t n_nodes) {
  if (n_nodes == 0)
    return 0;
  if (total == 0)
    return 1.0 / (double)n_nodes;
  return 0.25 / (double)n_nodes + 0.75 * (double)mine / (double)total;
}

/* This node's slots (node `self` of n) of the cluster's `total` turns at once: in proportion
 * to each live node's busy count (running + runnable turns), the remainder by largest
 * fraction, a tie to the node first by name; evenly (the first nodes by name taking the
 * remainder) while no node is busy. Every node works its own out from the same keys and the
 * same sorted node list, so the slots sum to total — up to a view that lags by a read. */
static uint32_t slots_of(const uint64_t *busy, size_t n, size_t self, uint64_t total) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += busy[i];
  if (sum == 0)
    return (uint32_t)(total / n + (self < total % n));
  uint64_t given = 0;
  for (size_t i = 0; i < n; i++)
    given += (uint64_t)((unsigned __int128)total * busy[i] / sum);
  uint64_t mine = (uint64_t)((unsigned __int128)total * busy[self] / sum);
  uint64_t my_frac = (uint64_t)((unsigned __int128)total * busy[self] % sum), ahead = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t frac = (uint64_t)((unsigned __int128)total * busy[i] % sum);
    ahead += frac > my_frac || (frac == my_frac && i < self);
  }
  return (uint32_t)(mine + (ahead < total - given));
}

/* A node's demand key: its runnable sessions per lane, then its busy count ("r0 r1 r2 busy").
 * A key of three numbers (a node before :cluster :concurrency) is busy as their sum. */
static bool demand_parse(const char *d, unsigned long long x[CPH_LANE_COUNT],
                         unsigned long long *busy) {
  int got = d ? sscanf(d, "%llu %llu %llu %llu", &x[0], &x[1], &x[2], busy) : 0;
  if (got == CPH_LANE_COUNT)
    *busy = x[0] + x[1] + x[2];
  if (got >= CPH_LANE_COUNT)
    return true;
  memset(x, 0, CPH_LANE_COUNT * sizeof *x);
  *busy = 0;
  return false;
}

/* :cluster :concurrency, once a second after the demand round: this node moves the slots it
 * holds towards `target`. A slot is a key /cephalon/slots/<k> (k < :concurrency) created
 * under the node's lease with a create-if-absent txn, so at most :concurrency exist and the
 * nodes' limits, each at most the slots it holds, sum to at most the cluster's. The limit is
 * offered to the loop only up to the slots held; a slot is released only once the loop has
 * applied a limit at or below what stays and runs no more turns than that — so no node ever
 * runs on a slot another node took. A dead node's slots go with its lease. */
static void slots_round(cph_cluster *c, uint32_t target) {
  if (c->held_lease != c->lease) { /* keys of an older lease died, or will, with it */
    c->n_held = 0;
    c->held_lease = c->lease;
  }
  if (!c->held && !(c->held = calloc((size_t)c->concurrency, sizeof *c->held)))
    return;
  pthread_mutex_lock(&c->mu);
  uint32_t keep = c->applied > c->running_after ? c->applied : c->running_after;
  pthread_mutex_unlock(&c->mu);
  if (keep < target)
    keep = target;
  char key[64];
  while (c->n_held > keep) {
    snprintf(key, sizeof key, SLOT_PREFIX "%" PRIu32, c->held[c->n_held - 1]);
    if (!key_txn(c, key, false))
      break; /* etcd unreachable (or the key gone with the lease): keep it counted */
    c->n_held--;
  }
  if (c->lease && c->n_held < target) {
    json_t *taken = range_prefix(c, SLOT_PREFIX);
    for (uint32_t k = 0; taken && k < (uint32_t)c->concurrency && c->n_held < target; k++) {
      char name[16];
      snprintf(name, sizeof name, "%" PRIu32, k);
      if (json_object_get(taken, name))
        continue;
      snprintf(key, sizeof key, SLOT_PREFIX "%" PRIu32, k);
      if (key_txn(c, key, true))
        c->held[c->n_held++] = k;
    }
    json_decref(taken);
  }
  pthread_mutex_lock(&c->mu);
  c->offer = target < c->n_held ? target : (uint32_t)c->n_held;
  pthread_mutex_unlock(&c->mu);
}

/* Once a second: publishes this node's demand under its lease and works out its shares from
 * every live node's (a node that published none counts as none). */
static void rebalance(cph_cluster *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t mine[CPH_LANE_COUNT];
  memcpy(mine, c->demand, sizeof mine);
  uint64_t my_busy = c->busy;
  pthread_mutex_unlock(&c->mu);
  char key[512], val[128];
  snprintf(key, sizeof key, DEMAND_PREFIX "%s", c->self);
  snprintf(val, sizeof val, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, mine[0], mine[1],
           mine[2], my_busy);
  char *k = b64(key), *v = b64(val);
  json_t *put =
      k && v ? json_pack("{ssssso}", "key", k, "value", v, "lease", lease_id_json(c->lease)) : NULL;
  free(k);
  free(v);
  json_decref(put ? etcd_call(c, "/v3/kv/put", put) : NULL);
  json_t *all = range_prefix(c, DEMAND_PREFIX);
  if (!all)
    return;
  pthread_mutex_lock(&c->mu);
  uint64_t total[CPH_LANE_COUNT] = {0};
  uint64_t *busy = calloc(c->n_nodes ? c->n_nodes : 1, sizeof *busy);
  size_t self = SIZE_MAX;
  for (size_t i = 0; i < c->n_nodes; i++) {
    if (strcmp(c->nodes[i].name, c->self) == 0)
      self = i;
    const char *d = json_string_value(json_object_get(all, c->nodes[i].name));
    unsigned long long x[CPH_LANE_COUNT], b;
    if (demand_parse(d, x, &b))
      for (int l = 0; l < CPH_LANE_COUNT; l++)
        total[l] += x[l];
    if (busy)
      busy[i] = b;
  }
  const char *own = json_string_value(json_object_get(all, c->self));
  unsigned long long x[CPH_LANE_COUNT], own_busy;
  demand_parse(own, x, &own_busy);
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    c->share[l] = self != SIZE_MAX ? share_of(x[l], total[l], c->n_nodes) : 0;
  if (busy && self != SIZE_MAX) /* out of memory: the slots stay as they were */
    c->slots = slots_of(busy, c->n_nodes, self, (uint64_t)c->concurrency);
  else if (self == SIZE_MAX)
    c->slots = 0;
  free(busy);
  c->have_share = true;
  uint32_t target = c->slots;
  pthread_mutex_unlock(&c->mu);
  json_decref(all);
  if (c->concurrency)
    slots_round(c, target);
}

/* ---- the watch: etcd's /v3/watch over the JSON gateway, a stream of JSON messages ----
 * Every change under /cephalon/nodes/ or /cephalon/shards/ pokes the cluster thread, which
 * reads ownership again at once: a join, a leave or a death is followed within etcd's
 * notification time instead of a poll's. (Demand keys change every second; they do not poke.)
 * The stream is reopened every WATCH_SECONDS, and after an error half a second later, on the
 * next endpoint. */
#define WATCH_SECONDS 30
#define WATCH_BUF_MAX (1u << 20)

typedef struct watch_stream {
  cph_cluster *c;
  cph_buf buf; /* what arrived and is not a whole message yet */
} watch_stream;

static bool stopping(cph_cluster *c) {
  pthread_mutex_lock(&c->mu);
  bool stop = c->stop;
  pthread_mutex_unlock(&c->mu);
  return stop;
}

static int watch_cancel(void *arg) { return stopping(arg); }

/* Whether a watch message names a node or shard key. */
static bool names_ownership(json_t *msg) {
  size_t i;
  json_t *ev;
  json_array_foreach(json_object_get(json_object_get(msg, "result"), "events"), i, ev) {
    char *key = unb64(json_string_value(json_object_get(json_object_get(ev, "kv"), "key")));
    bool hit = key && (strncmp(key, NODE_PREFIX, strlen(NODE_PREFIX)) == 0 ||
                       strncmp(key, SHARD_PREFIX, strlen(SHARD_PREFIX)) == 0);
    free(key);
    if (hit)
      return true;
  }
  return false;
}

static int on_watch_data(void *arg, const char *data, size_t len) {
  watch_stream *w = arg;
  cph_buf_append(&w->buf, data, len);
  size_t at = 0;
  for (;;) { /* every whole message in the buffer */
    json_error_t e;
    json_t *msg = json_loadb(w->buf.data + at, w->buf.len - at, JSON_DISABLE_EOF_CHECK, &e);
    if (!msg)
      break; /* not whole yet */
    at += (size_t)e.position;
    if (names_ownership(msg)) {
      pthread_mutex_lock(&w->c->mu);
      w->c->poked = true;
      pthread_cond_signal(&w->c->cv);
      pthread_mutex_unlock(&w->c->mu);
    }
    json_decref(msg);
  }
  if (at) {
    memmove(w->buf.data, w->buf.data + at, w->buf.len - at);
    w->buf.len -= at;
  }
  if (w->buf.len > WATCH_BUF_MAX) /* never whole: drop it (the poll covers what it missed) */
    w->buf.len = 0;
  return stopping(w->c) || cph_buf_error(&w->buf);
}

static void *watch_thread(void *arg) {
  cph_cluster *c = arg;
  /* One range from the first node key to past the last shard key: "/cephalon/demand/" sorts
   * before it, so etcd sends no demand changes (one a second per node) to this watch. */
  char *key = b64(NODE_PREFIX), *end_s = prefix_end(SHARD_PREFIX);
  char *end = end_s ? b64(end_s) : NULL;
  free(end_s);
  json_t *req =
      key && end ? json_pack("{s{ssss}}", "create_request", "key", key, "range_end", end) : NULL;
  char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  free(key);
  free(end);
  size_t at = 0; /* the endpoint in use; moves on after an error */
  while (body && !stopping(c)) {
    bool reopen = false;
    cph_httpc_url url;
    const char *why = NULL;
    if (cph_httpc_url_parse(c->etcd[at % c->n_etcd], &url, &why) == 0) {
      watch_stream w = {c, CPH_BUF_INIT};
      cph_httpc_request r = {.method = "POST",
                             .path = "/v3/watch",
                             .body = body,
                             .body_len = strlen(body),
                             .timeout_ms = WATCH_SECONDS * 1000,
                             .user_agent = "cephalond-cluster",
                             .cancel = watch_cancel,
                             .cancel_arg = c,
                             .on_data = on_watch_data,
                             .on_data_arg = &w};
      cph_httpc_response resp = {0};
      char err[256];
      int rc = cph_httpc_do(&url, &r, &resp, err, sizeof err);
      cph_httpc_response_free(&resp);
      cph_buf_free(&w.buf);
      reopen = rc == CPH_HTTPC_ETIMEOUT; /* a stream ended on time: reopen it at once */
    }
    cph_httpc_url_free(&url);
    if (reopen)
      continue;
    at++;
    for (int slept = 0; slept < 500 && !stopping(c); slept += 100) {
      struct timespec ts = {0, 100000000L};
      nanosleep(&ts, NULL);
    }
  }
  free(body);
  return NULL;
}

/* When the cluster thread must act next: a keepalive, a budget round, or the poll's net. */
static int64_t next_wake_ns(const cph_cluster *c, int64_t last_reconcile_ns) {
  int64_t t = last_reconcile_ns + RECONCILE_EVERY_NS;
  if (c->lease && c->next_keepalive_ns < t)
    t = c->next_keepalive_ns;
  if (c->lease && c->next_budget_ns < t)
    t = c->next_budget_ns;
  if (!c->lease) /* not joined: try again soon */
    t = cph_mono_ns() + 250000000LL;
  return t;
}

static void *cluster_thread(void *arg) {
  cph_cluster *c = arg;
  int64_t last_reconcile_ns = 0;
  bool poked = true;
  for (;;) {
    if (stopping(c))
      break;
    if (!c->lease)
      etcd_join(c);
    else if (cph_mono_ns() >= c->next_keepalive_ns)
      keepalive(c);
    if (c->lease && (poked || cph_mono_ns() >= last_reconcile_ns + RECONCILE_EVERY_NS)) {
      last_reconcile_ns = cph_mono_ns();
      reconcile(c);
    }
    if (c->lease && cph_mono_ns() >= c->next_budget_ns) {
      rebalance(c);
      c->next_budget_ns = cph_mono_ns() + BUDGET_EVERY_NS;
    }
    /* Sleep until then, or until the watch pokes. CLOCK_MONOTONIC: see cph_cluster_start. */
    int64_t wake = next_wake_ns(c, last_reconcile_ns);
    struct timespec until = {(time_t)(wake / 1000000000LL), (long)(wake % 1000000000LL)};
    pthread_mutex_lock(&c->mu);
    while (!c->stop && !c->poked && pthread_cond_timedwait(&c->cv, &c->mu, &until) != ETIMEDOUT) {
    }
    poked = c->poked;
    c->poked = false;
    pthread_mutex_unlock(&c->mu);
  }
  if (c->lease) { /* leaving: the shards move now instead of after the TTL */
    json_decref(etcd_call(c, "/v3/lease/revoke", json_pack("{so}", "ID", lease_id_json(c->lease))));
    c->lease = 0;
  }
  return NULL;
}

/* ================================================================ the loop's side */

int cph_cluster_start(const cph_policy_cluster *cfg, cph_cluster **out, cph_err *err) {
  *out = NULL;
  if (cfg->etcd_count == 0) {
    cph_err_set(err, CPH_EINVAL, ":cluster :etcd lists no URL");
    return CPH_EINVAL;
  }
  for (size_t i = 0; i < cfg->etcd_count; i++) {
    cph_httpc_url u;
    const char *why = NULL;
    int bad = cph_httpc_url_parse(cfg->etcd[i], &u, &why);
    cph_httpc_url_free(&u);
    if (bad) {
      cph_err_set(err, CPH_EINVAL, ":cluster :etcd \"%s\": %s", cfg->etcd[i], why);
      return CPH_EINVAL;
    }
  }
  cph_cluster *c = calloc(1, sizeof *c);
  if (!c)
    goto nomem;
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  c->self = strdup(cfg->node);
  c->advertise = strdup(cfg->advertise);
  c->shards = (uint32_t)cfg->shards;
  c->concurrency = cfg->concurrency;
  c->ttl_s = cfg->lease_ttl_seconds;
  c->owner = malloc(c->shards * sizeof *c->owner);
  c->unowned_since_ns = calloc(c->shards, sizeof *c->unowned_since_ns);
  c->etcd = calloc(cfg->etcd_count, sizeof *c->etcd);
  if (!c->self || !c->advertise || !c->owner || !c->unowned_since_ns || !c->etcd)
    goto nomem;
  for (size_t i = 0; i < cfg->etcd_count; i++, c->n_etcd++)
    if (!(c->etcd[i] = strdup(cfg->etcd[i])))
      goto nomem;
  for (uint32_t s = 0; s < c->shards; s++)
    c->owner[s] = NO_OWNER;
  if (pthread_create(&c->thread, NULL, cluster_thread, c) != 0) {
    cph_cluster_stop(c);
    cph_err_set(err, CPH_EIO, "cannot start the cluster thread");
    return CPH_EIO;
  }
  c->started = true;
  /* Without the watch ownership is still read every second: a failure here is logged. */
  if (pthread_create(&c->watch_thread, NULL, watch_thread, c) == 0)
    c->watch_started = true;
  else
    cph_warn("cluster: no etcd watch thread; ownership is read every second");
  *out = c;
  return CPH_OK;
nomem:
  cph_cluster_stop(c);
  cph_err_set(err, CPH_ENOMEM, "out of memory starting cluster mode");
  return CPH_ENOMEM;
}

void cph_cluster_stop(cph_cluster *c) {
  if (!c)
    return;
  if (c->started) {
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    if (c->watch_started)
      pthread_join(c->watch_thread, NULL);
  }
  free_nodes(c->nodes, c->n_nodes);
  for (size_t i = 0; i < c->n_etcd; i++)
    free(c->etcd[i]);
  free(c->etcd);
  free(c->owner);
  free(c->unowned_since_ns);
  free(c->held);
  free(c->self);
  free(c->advertise);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

uint32_t cph_cluster_shards(const cph_cluster *c) { return c->shards; }

/* Caller holds mu. */
static bool live_locked(const cph_cluster *c) {
  return c->joined && cph_mono_ns() < c->serve_until_ns;
}

bool cph_cluster_serving(cph_cluster *c) {
  pthread_mutex_lock(&c->mu);
  bool live = live_locked(c);
  pthread_mutex_unlock(&c->mu);
  return live;
}

cph_cluster_verdict cph_cluster_route(cph_cluster *c, uint32_t shard, char *owner_node,
                                      size_t node_size, char *owner_url, size_t url_size) {
  cph_cluster_verdict v = CPH_CLUSTER_UNKNOWN;
  pthread_mutex_lock(&c->mu);
  uint32_t o = shard < c->shards ? c->owner[shard] : NO_OWNER;
  if (o != NO_OWNER && o < c->n_nodes) {
    if (strcmp(c->nodes[o].name, c->self) == 0) {
      v = live_locked(c) ? CPH_CLUSTER_SERVED : CPH_CLUSTER_UNKNOWN;
    } else if (live_locked(c)) { /* a stale view names no owner */
      v = CPH_CLUSTER_ELSEWHERE;
      snprintf(owner_node, node_size, "%s", c->nodes[o].name);
      snprintf(owner_url, url_size, "%s", c->nodes[o].url);
    }
  }
  pthread_mutex_unlock(&c->mu);
  return v;
}

/* "0-3,7,9-10" for the shards owned by node index i. */
static json_t *ranges_of(const cph_cluster *c, uint32_t i, uint32_t *count) {
  size_t cap = 64, len = 0;
  char *buf = malloc(cap);
  if (!buf)
    return NULL;
  buf[0] = '\0';
  *count = 0;
  for (uint32_t s = 0; s < c->shards;) {
    if (c->owner[s] != i) {
      s++;
      continue;
    }
    uint32_t e = s;
    while (e + 1 < c->shards && c->owner[e + 1] == i)
      e++;
    *count += e - s + 1;
    char part[32];
    int n = e == s ? snprintf(part, sizeof part, "%s%" PRIu32, len ? "," : "", s)
                   : snprintf(part, sizeof part, "%s%" PRIu32 "-%" PRIu32, len ? "," : "", s, e);
    if (len + (size_t)n + 1 > cap) {
      cap = (len + (size_t)n + 1) * 2;
      char *nb = realloc(buf, cap);
      if (!nb) {
        free(buf);
        return NULL;
      }
      buf = nb;
    }
    memcpy(buf + len, part, (size_t)n + 1);
    len += (size_t)n;
    s = e + 1;
  }
  json_t *out = json_string(buf);
  free(buf);
  return out;
}

json_t *cph_cluster_json(cph_cluster *c) {
  pthread_mutex_lock(&c->mu);
  bool live = live_locked(c);
  int64_t left_ms = live ? (c->serve_until_ns - cph_mono_ns()) / 1000000 : 0;
  json_t *nodes = json_array(), *owners = json_array();
  uint32_t mine = 0, unowned = 0;
  for (uint32_t s = 0; s < c->shards; s++)
    if (c->owner[s] == NO_OWNER || c->owner[s] >= c->n_nodes)
      unowned++;
  for (uint32_t i = 0; i < c->n_nodes; i++) {
    uint32_t count = 0;
    json_t *ranges = ranges_of(c, i, &count);
    json_array_append_new(nodes, json_pack("{sssssI}", "node", c->nodes[i].name, "url",
                                           c->nodes[i].url, "shards", (json_int_t)count));
    if (strcmp(c->nodes[i].name, c->self) == 0)
      mine = count;
    json_array_append_new(owners, json_pack("{ssso}", "node", c->nodes[i].name, "ranges",
                                            ranges ? ranges : json_string("")));
  }
  json_t *out =
      json_pack("{sssssssIsIsIsIsIsoso}", "node", c->self, "advertise", c->advertise, "state",
                live ? "serving" : (c->joined ? "expired" : "joining"), "shards",
                (json_int_t)c->shards, "lease_ttl_seconds", (json_int_t)c->ttl_s, "serving_for_ms",
                (json_int_t)left_ms, "shards_owned", (json_int_t)(live ? mine : 0),
                "shards_unowned", (json_int_t)unowned, "nodes", nodes, "owners", owners);
  json_t *share = json_object();
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    json_object_set_new(share, cph_lane_name((cph_lane)l),
                        json_real(c->have_share && live ? c->share[l] : 0));
  json_object_set_new(out, "budget_share", share);
  json_object_set_new(out, "concurrency",
                      c->concurrency ? json_pack("{sIsI}", "cluster", (json_int_t)c->concurrency,
                                                 "node", (json_int_t)(live ? c->offer : 0))
                                     : json_null());
  pthread_mutex_unlock(&c->mu);
  return out;
}

int cph_cluster_metrics(cph_cluster *c, cph_buf *out) {
  pthread_mutex_lock(&c->mu);
  bool live = live_locked(c);
  uint64_t owned = 0;
  for (uint32_t s = 0; live && s < c->shards; s++)
    owned += c->owner[s] < c->n_nodes && strcmp(c->nodes[c->owner[s]].name, c->self) == 0;
  double left_s = live ? (double)(c->serve_until_ns - cph_mono_ns()) / 1e9 : 0;
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"cephalon_cluster_serving", "gauge",
       "1 while this node is inside its etcd lease's deadline and may serve its shards."},
      {"cephalon_cluster_shards_owned", "gauge", "Shards this node owns and serves."},
      {"cephalon_cluster_lease_remaining_seconds", "gauge",
       "Time left before this node stops serving unless a keepalive succeeds."},
      {"cephalon_cluster_shards_claimed_total", "counter",
       "Shards this node claimed (joins, rebalancing, takeovers after a death)."},
      {"cephalon_cluster_last_takeover_seconds", "gauge",
       "How long the last shard this node claimed had been without an owner."},
  };
  const double v[] = {live, (double)owned, left_s, (double)c->claimed_total, c->last_takeover_s};
  pthread_mutex_unlock(&c->mu);
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
    cph_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %.6g\n", fam[i].name, fam[i].help,
                   fam[i].name, fam[i].type, fam[i].name, v[i]);
  return cph_buf_error(out);
}

void cph_cluster_note_demand(cph_cluster *c, const uint64_t runnable[CPH_LANE_COUNT],
                             uint64_t busy) {
  pthread_mutex_lock(&c->mu);
  memcpy(c->demand, runnable, sizeof c->demand);
  c->busy = busy;
  pthread_mutex_unlock(&c->mu);
}

bool cph_cluster_concurrency_share(cph_cluster *c, uint32_t running, uint32_t *limit) {
  if (c->concurrency == 0) /* set at start, never changed */
    return false;
  pthread_mutex_lock(&c->mu);
  *limit = live_locked(c) ? c->offer : 0;
  c->applied = *limit; /* the caller applies it before it starts another turn */
  c->running_after = running;
  pthread_mutex_unlock(&c->mu);
  return true;
}

bool cph_cluster_budget_share(cph_cluster *c, double share[CPH_LANE_COUNT]) {
  pthread_mutex_lock(&c->mu);
  bool have = c->have_share && live_locked(c);
  for (int l = 0; l < CPH_LANE_COUNT; l++)
    share[l] = have ? c->share[l] : 0; /* a node that is not serving starts nothing */
  pthread_mutex_unlock(&c->mu);
  return have;
}

void cph_cluster_note_turn(cph_cluster *c, uint64_t turn_id, uint32_t shard) {
  c->turn_id[turn_id % TURN_SLOTS] = turn_id;
  c->turn_shard[turn_id % TURN_SLOTS] = shard;
}

bool cph_cluster_turn_shard(const cph_cluster *c, uint64_t turn_id, uint32_t *shard) {
  if (turn_id == 0 || c->turn_id[turn_id % TURN_SLOTS] != turn_id)
    return false;
  *shard = c->turn_shard[turn_id % TURN_SLOTS];
  return true;
}
