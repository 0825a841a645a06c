/* Cluster mode, first slice (DESIGN §14): this node's membership and shard ownership in etcd.
 *
 * cph_cluster_start() runs a thread of its own that talks to etcd's v3 JSON gateway through
 * common/http_client (libcurl), so the event loop never waits on etcd. The thread:
 *   - grants a lease of :lease-ttl-seconds and keeps it alive (every TTL/4);
 *   - registers /cephalon/nodes/<node> -> :advertise under the lease;
 *   - reads the live nodes and computes the shard map, a deterministic function of the sorted
 *     node list (cph_cluster_assign: every node computes the same map);
 *   - claims the shards the map gives it (/cephalon/shards/<n> -> node, a txn that creates the
 *     key only if absent, under its lease) and releases those it no longer should own (a txn
 *     that deletes the key only while its value is this node);
 *   - re-reads nodes and shards when its etcd watch (a second thread, a streamed /v3/watch on
 *     /cephalon/) sees a node or shard key change, and every second at least;
 *   - every second publishes its demand and works out its share of the lanes' budgets.
 *
 * Serving rule (the fence of this slice): the node serves shard s only while (a) the last read
 * of etcd showed /cephalon/shards/s held by this node and (b) the monotonic clock is before
 * its local deadline, set at each successful keepalive to (the time the keepalive was SENT +
 * the TTL etcd granted - a margin of TTL/5). The lease cannot expire in etcd before that
 * deadline, so no other node can hold s while this one serves it. A node that cannot renew
 * (etcd gone, process stopped) passes its deadline and answers for no shard. A shard the map
 * moves away stops being served before its key is deleted (a release), so no other node can
 * hold s while this one serves it that way either.
 *
 * Thread-safety: cph_cluster_route, cph_cluster_json and cph_cluster_serving read a snapshot
 * under a mutex and may be called from the loop at any time. */
#ifndef CEPHALON_SERVER_CLUSTER_H
#define CEPHALON_SERVER_CLUSTER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"
#include "common/buf.h"
#include "cephalon/lane.h"
#include "cephalon/policy.h"

typedef struct cph_cluster cph_cluster;

/* Copies cfg and starts the etcd thread. It does not wait for etcd: until the node has joined
 * it serves no shard. CPH_EINVAL (no :etcd URL, a bad URL), CPH_ENOMEM or CPH_EIO (thread). */
int cph_cluster_start(const cph_policy_cluster *cfg, cph_cluster **out, cph_err *err);
/* Stops the thread, revokes the lease (so the node's shards move at once) and frees c.
 * NULL is fine. */
void cph_cluster_stop(cph_cluster *c);

/* The shard of a session or channel id: the first 8 bytes of SHA-256(id), big-endian, mod
 * shards (DESIGN §14). */
uint32_t cph_cluster_shard_of(const char *id, uint32_t shards);
uint32_t cph_cluster_shards(const cph_cluster *c);

/* The shard map for n sorted, distinct node names: owner[s] in [0, n) for each of the shards.
 * Even: every node gets shards/n or shards/n + 1 (the first shards % n nodes in sorted order
 * get one more). Each shard goes to the node that ranks it highest (rendezvous hashing) among
 * those with room left, so a node joining or leaving moves few shards. Deterministic. */
void cph_cluster_assign(const char *const *nodes, size_t n, uint32_t shards, uint32_t *owner);

typedef enum cph_cluster_verdict {
  CPH_CLUSTER_SERVED = 0, /* this node serves the shard now */
  CPH_CLUSTER_ELSEWHERE,  /* another node owns it: owner_node / owner_url say which */
  CPH_CLUSTER_UNKNOWN     /* no live owner known (unclaimed, or this node is past its
                             deadline and its view is stale) */
} cph_cluster_verdict;

/* Whether this node serves the shard; for ELSEWHERE the owner's name and URL are copied
 * (truncated to the sizes). */
cph_cluster_verdict cph_cluster_route(cph_cluster *c, uint32_t shard, char *owner_node,
                                      size_t node_size, char *owner_url, size_t url_size);
/* True while this node is inside its deadline (it may serve the shards it holds). */
bool cph_cluster_serving(cph_cluster *c);

/* GET /v1/cluster: {"node", "advertise", "state", "shards", "lease_ttl_seconds",
 * "serving_for_ms", "nodes": [{"node", "url", "shards"}], "owners": [{"node", "ranges"}]}
 * where ranges is a text "0-84,170" over the shards that node holds. New reference. */
json_t *cph_cluster_json(cph_cluster *c);

/* The node's ownership as Prometheus families (cephalon_cluster_serving, _shards_owned,
 * _lease_remaining_seconds, _shards_claimed_total, _last_takeover_seconds), appended to out.
 * CPH_OK or CPH_ENOMEM. */
int cph_cluster_metrics(cph_cluster *c, cph_buf *out);

/* Budgets (DESIGN §14): the loop hands over its demand (runnable sessions per lane, and its
 * busy count: running + runnable turns) and reads back this node's share of each lane's
 * budget, which the etcd thread works out every second from every live node's demand. false
 * (and shares of 0) until the first round, and while the node is not serving. Any thread. */
void cph_cluster_note_demand(cph_cluster *c, const uint64_t runnable[CPH_LANE_COUNT],
                             uint64_t busy);
bool cph_cluster_budget_share(cph_cluster *c, double share[CPH_LANE_COUNT]);
/* :cluster :concurrency: false when it is not set (each node runs on its :scheduler
 * :concurrency); else true with *limit = the turns this node may run at once: the slots it
 * holds in etcd, towards a target by busy counts worked out with the budgets (cluster.c,
 * slots_round) — 0 until it holds some and while not serving. `running` is the turns the
 * loop runs now; the loop must apply *limit before it starts another turn (a slot is
 * released only once the loop applied a limit without it). Loop thread. */
bool cph_cluster_concurrency_share(cph_cluster *c, uint32_t running, uint32_t *limit);

/* Turns leased through this node, remembered by id so heartbeat, complete and fail of a turn
 * whose shard moved answer 421: a direct-mapped table of the last 65,536 turn ids (an older
 * turn falls out and is passed to the engine as before). Loop thread only. */
void cph_cluster_note_turn(cph_cluster *c, uint64_t turn_id, uint32_t shard);
bool cph_cluster_turn_shard(const cph_cluster *c, uint64_t turn_id, uint32_t *shard);

#endif
