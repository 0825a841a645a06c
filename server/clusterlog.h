/* Cluster mode (DESIGN §14): the replicated log on NATS JetStream — the transport only.
 * What flows through it, and what the loop does with it, is clusterflow.h's.
 *
 * Layout in JetStream (created by whichever node gets there first; the same config from every
 * node, so creating is idempotent):
 *   - stream CEPH, subjects ceph.s.<shard>.in (events of a shard: of their session when they
 *     name one, else of their channel) and ceph.s.<shard>.fwd (an event forwarded to the
 *     shard of a session it reaches); :cluster :replicas replicas (quorum-acknowledged), file
 *     storage, deduplication window = :dedupe :key-window-seconds (the idempotency window),
 *     so a message id seen within it is stored once;
 *   - one durable push consumer per shard, "s<shard>", filtered to ceph.s.<shard>.> and
 *     delivered to _ceph.dlv.<shard>, explicit acks, AckWait 5 s. The consumer belongs to
 *     the shard, not to a node: whichever node owns the shard binds to it and continues where
 *     the previous owner's acks left off. Why per shard and not one per node: the durable
 *     position then moves with ownership (a node that takes a shard over needs no cursor of
 *     its own), and nats-server 2.9 filters a consumer by one subject only. The cost is one
 *     consumer (a Raft group at R3) per shard: 256 by default, fine; see
 *     docs/cluster-scaling.md for 4096;
 *   - key-value bucket CEPH_SESSIONS: one key per session (its id in hex) -> its record, put
 *     by the session's owner (clusterflow.h says what the record is). Every node watches the
 *     whole bucket.
 *
 * Threads. libnats runs its own (connection, delivery pool, timers). cph_clog_start adds one,
 * the log thread, which connects (retrying), creates the stream, the bucket and the shard
 * consumers, and every 100 ms binds to the consumers of the shards this node serves
 * (cph_cluster_route) and unbinds from those it no longer serves; it also reads the bucket's
 * watcher. Nothing of that runs on the event loop. The loop talks to the log only through
 * cph_clog_publish (which never waits: libnats's asynchronous publish) and receives
 * everything — publish acknowledgements, messages of served shards, bucket entries — as
 * items on one queue, drained by an event on the loop (a pipe wakes it), so every hook
 * below runs on the loop thread.
 *
 * Ordering: a shard's messages arrive in stream order. A message not acknowledged within
 * AckWait (the owner died, lost the shard, or released it) is delivered again, later and
 * possibly after newer ones: applying must be idempotent (clusterflow.h: engine idempotency
 * keys). */
#ifndef CEPHALON_SERVER_CLUSTERLOG_H
#define CEPHALON_SERVER_CLUSTERLOG_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"
#include "cephalon/policy.h"

struct cph_cluster;
typedef struct cph_clog cph_clog;

#define CPH_CLOG_STREAM "CEPH"
#define CPH_CLOG_BUCKET "CEPH_SESSIONS"

/* A message of a served shard, handed to the loop. Release it with cph_clog_ack (applied:
 * never deliver it again) or cph_clog_release (not applied: JetStream delivers it again after
 * AckWait, to whoever then owns the shard). */
typedef struct cph_clog_msg {
  uint32_t shard;
  bool fwd;            /* ceph.s.<shard>.fwd, else .in */
  uint64_t seq;        /* its stream sequence: the log position */
  uint64_t deliveries; /* 1 the first time */
  uint64_t bind_gen;   /* the binding that delivered it: a new one each time this node (re)binds
                          to the shard's consumer (cluster-wide unique per node) */
  const char *data;    /* the payload (JSON), not NUL-terminated */
  size_t len;
  void *nats; /* the natsMsg */
} cph_clog_msg;

typedef struct cph_clog_hooks {
  void *ctx;
  /* A publish's outcome: rc CPH_OK with its stream sequence (dup: the message id had been
   * stored before, seq is the original's), or an error (why says what NATS answered; the
   * publish may or may not have been stored — publishing again with the same id is safe). */
  void (*published)(void *ctx, uint64_t ref, int rc, uint64_t seq, bool dup, const char *why);
  /* A message of a shard this node served when it was delivered. The hook owns m. */
  void (*message)(void *ctx, cph_clog_msg *m);
  /* A session record put (value, vlen) or deleted (value NULL) in the bucket; key is the
   * session id (decoded). */
  void (*session)(void *ctx, const char *session, const char *value, size_t vlen);
} cph_clog_hooks;

/* Copies what it needs of cfg and starts the log thread; returns at once (the log connects in
 * the background: until then publishes fail with CPH_EBUSY). dedupe_window_s is the stream's
 * deduplication window. cluster must outlive the log. CPH_EINVAL (no :nats URL), CPH_ENOMEM,
 * CPH_EIO. */
int cph_clog_start(const cph_policy_cluster *cfg, int64_t dedupe_window_s,
                   struct cph_cluster *cluster, struct event_base *base,
                   const cph_clog_hooks *hooks, cph_clog **out, cph_err *err);
/* Stops taking deliveries (unbinds every consumer; queued messages are released, so they
 * come again to the next owner) and stops calling hooks. Publishes still outstanding get no
 * hook call: the caller answers for them. Idempotent. */
void cph_clog_quiesce(cph_clog *l);
/* Closes the connection, joins the log thread and frees l. NULL is fine. */
void cph_clog_stop(cph_clog *l);

/* Publishes data to subject with the message id msgid (Nats-Msg-Id); the outcome comes to
 * hooks.published with ref, at the latest after max_wait_ms (capped at 3 s; then as an error).
 * Never waits. CPH_EBUSY when not connected yet or too much is in
 * flight (then no hook call comes), CPH_ENOMEM. kv_delete: a key-value delete marker. */
int cph_clog_publish(cph_clog *l, const char *subject, const char *msgid, const void *data,
                     size_t len, bool kv_delete, int64_t max_wait_ms, uint64_t ref);
/* The subjects: ceph.s.<shard>.in|fwd, and the bucket key subject of a session. */
void cph_clog_subject(char *buf, size_t size, uint32_t shard, bool fwd);
int cph_clog_session_subject(char *buf, size_t size, const char *session);

/* Releases libnats's process-wide state (its threads): once, after every cph_clog_stop and after
 * the last message was acknowledged or released. */
void cph_clog_close_library(void);

void cph_clog_ack(cph_clog *l, cph_clog_msg *m);
void cph_clog_release(cph_clog *l, cph_clog_msg *m);

typedef struct cph_clog_stats {
  bool ready;     /* connected, stream and bucket in place */
  uint32_t bound; /* shards whose consumer this node is bound to */
  uint64_t published, delivered;
  int64_t in_flight;
} cph_clog_stats;
void cph_clog_get_stats(cph_clog *l, cph_clog_stats *out);

/* True once connected with the stream in place. */
bool cph_clog_ready(cph_clog *l);
/* {"state", "stream", "replicas", "shards_bound", "published", "delivered"} for
 * GET /v1/cluster. New reference. */
json_t *cph_clog_json(cph_clog *l);

#endif
