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
 *     whole bucket;
 *   - subjects ceph.s.done.<shard>, in the same stream: the done marks of a shard's sessions
 *     (what turns consumed, clusterflow.h 6.). Outside the shard's consumer filter
 *     (ceph.s.<shard>.>), so the owner is not delivered its own marks; only replays read them;
 *   - key-value bucket CEPH_SHARDS: one key per shard (its number) -> its watermark, a stream
 *     sequence in decimal (clusterflow.h 7.), put by the shard's owner; history 1.
 *   - key-value bucket CEPH_STATE: one key per session, "<shard>.<session id in hex>" -> the
 *     session's state after its latest completion (clusterflow.h 11.), put by the shard's owner
 *     with the key's revision expected; history 1, so the bucket is a compacted changelog. The
 *     value begins with the writer's epoch (be64, the sequence of its epoch on
 *     ceph.s.done.<shard>); the rest is the engine's state, packed (server/statezip.h) or raw
 *     (from an earlier build, or when packing made it no smaller). The replay thread unpacks it.
 *
 * Taking a shard over. A shard this node serves is not bound at once: first a replay thread
 * takes the shard's fences (clusterflow.h 10.: a write to its watermark's key and an epoch on
 * ceph.s.done.<shard>, each expecting what it just read there), then reads its past — the watermark
 * in CEPH_SHARDS (1 if none), the stream's last sequence L at that moment, every
 * ceph.s.<shard>.in/fwd message from the watermark to L and every done mark of the shard from the
 * watermark on (ordered consumers: ephemeral, no acks), then the newest value of every key of the
 * shard in CEPH_STATE — and hands it to the loop (hooks.replayed).
 * The loop rebuilds the shard's sessions from it and calls cph_clog_rebuilt; only then does the
 * next sync bind the shard's consumer, so no message of the consumer is applied before the rebuild.
 * A replay starts only once the bucket watch has delivered every session record there was (the loop
 * then knows the sessions to adopt). A failed read is tried again a second later; a shard no longer
 * served drops its replay.
 *
 * Threads. libnats runs its own (connection, delivery pool, timers). cph_clog_start adds the
 * log thread, which connects (retrying), creates the stream, the buckets and the shard
 * consumers, and every 100 ms queues replays of, or binds to, the consumers of the shards this
 * node serves (cph_cluster_route) and unbinds from those it no longer serves; it also reads
 * the bucket's watcher. And two replay threads, the pos thread (min_pos waits) and the trim
 * thread (purges, "Trimming" below). Nothing of
 * that runs on the event loop. The loop
 * talks to the log only through cph_clog_publish (which never waits: libnats's asynchronous
 * publish) and receives everything — publish acknowledgements, messages of served shards, bucket
 * entries, replays — as items on one queue, drained by an event on the loop (a pipe wakes it),
 * so every hook below runs on the loop thread.
 *
 * Waiting for a position (min_pos, clusterflow.h 9.). A message's forwards are acknowledged by
 * the log before the message itself is acknowledged to its shard's consumer. So the pos thread,
 * for a position P: reads the message at P (js_GetMsg) for its shard X (a done mark or a
 * bucket entry has none); waits until consumer s<X>'s ack floor reaches P; reads the stream's
 * last sequence L (every forward of P is at or below it); then waits until each target shard
 * is served here, rebuilt, bound, and its consumer's ack floor reaches the newest sequence of
 * the shard's subjects read after L (at or above every message of the shard up to L; its ack
 * floor is the sequence of one of its own messages, so it reaches L itself only when L is one).
 * Not "nothing pending or unacknowledged": that comes from the consumer's leader, whose copy
 * of a replicated stream may lag the acknowledged messages. A message is acknowledged only after the engine committed it,
 * and only by the node serving its shard; what an earlier owner acknowledged, the rebuild
 * applied before the binding. Cost: one request to JetStream per step, every POS_POLL_MS while
 * it waits; for "every shard served here" (a lease) one consumer info per served shard.
 *
 * Trimming (clusterflow.h 12.). The loop asks (cph_clog_trim) to purge a shard's messages below
 * a watermark the log holds; the trim thread takes the newest request of each shard and, while
 * this node serves the shard, purges ceph.s.<shard>.in/fwd below the lower of that watermark and
 * consumer s<shard>'s ack floor + 1 — never a message the consumer may still deliver, so a
 * purged message's forwards were all acknowledged (which min_pos counts on: a position purged
 * reads as "deleted", whose forwards are at or below L) — and ceph.s.done.<shard> below the
 * lower of the watermark and the sequence of this node's own last write there (the subject's last
 * message is the fence: 10.). Each is one STREAM.PURGE request (filter and seq), a Raft proposal
 * on the stream. Two nats-server bugs decide how: before 2.9.15 a purge whose subject lies within
 * a consumer's filter drops that consumer's pending acknowledgements (its unacknowledged messages
 * would never come again), so in/fwd are purged as ceph.*.<shard>.>, which matches the same
 * messages and no consumer's filter; and before 2.9.18 a filtered purge replayed from the Raft log
 * when a server restarts compacts that server's whole stream up to the stream's last sequence at
 * the time of the purge (nats-server dee5324) — so with :replicas > 1 the thread reads the version
 * of the server it is connected to (its INFO line) and refuses to trim below 2.9.18 (logged; the
 * stream grows as before). With :replicas 1 there is no Raft group under the stream and a purge is
 * applied at once.
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
#define CPH_CLOG_MARKS "CEPH_SHARDS"
#define CPH_CLOG_STATES "CEPH_STATE"

/* A CEPH_STATE value's first 8 bytes: the writer's epoch, big-endian (see the layout above). */
#define CPH_CLOG_EPOCH_BYTES 8
static inline void cph_clog_epoch_put(uint8_t *p, uint64_t epoch) {
  for (int i = 7; i >= 0; i--, epoch >>= 8)
    p[i] = (uint8_t)epoch;
}
static inline uint64_t cph_clog_epoch_get(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

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
  void *nats;    /* the natsMsg */
  void *decoded; /* the decode hook's result (NULL: none); the message hook may take it */
} cph_clog_msg;

typedef enum cph_clog_kind {
  CPH_CLOG_IN,  /* ceph.s.<shard>.in */
  CPH_CLOG_FWD, /* ceph.s.<shard>.fwd */
  CPH_CLOG_DONE /* ceph.s.done.<shard> */
} cph_clog_kind;

typedef struct cph_clog_entry {
  uint64_t seq;
  cph_clog_kind kind;
  char *data; /* the payload, NUL-terminated (len bytes before the NUL) */
  size_t len;
  void *decoded; /* in and fwd: the decode hook's result (NULL: none), freed with the replay */
} cph_clog_entry;

/* The newest value of one session's key in CEPH_STATE. */
typedef struct cph_clog_state {
  char *session; /* decoded from the key */
  uint64_t rev;  /* its revision (stream sequence): what the next put expects */
  /* The epoch, then the raw state: a packed one (statezip.h) is unpacked by the replay thread.
   * NULL: deleted, or a packed value that does not unpack (logged: nothing is imported). */
  uint8_t *data;
  size_t len;
  size_t stored_len; /* the value's bytes as the log held them */
} cph_clog_state;

/* An item of a session in CEPH_STATE (clusterflow.h 13.): key "<shard>.<session in hex>.<name>". */
typedef struct cph_clog_item {
  char *session, *name; /* decoded from the key */
  uint8_t *data;        /* the value as put (the writer's epoch, then the item) */
  size_t len;
} cph_clog_item;

/* A shard's past, read for its rebuild ("Taking a shard over" above). */
typedef struct cph_clog_replay {
  uint32_t shard;
  uint64_t gen;      /* pass it back to cph_clog_rebuilt */
  uint64_t from, to; /* the watermark read (1: none), the stream's last sequence at the start */
  /* entries[0..n_events): the shard's in and fwd messages with from <= seq <= to, in stream
   * order; entries[n_events..n_entries): its done marks with seq >= from. */
  cph_clog_entry *entries;
  size_t n_events, n_entries;
  int64_t read_ns; /* how long reading took, with decoding the messages (the decode hook) */
  /* The fences taken (clusterflow.h 10.): the revision of the shard's watermark key and the
   * sequence of the epoch on ceph.s.done.<shard> — what this node's next writes there expect. */
  uint64_t mark_rev, done_last;
  /* The newest value of each key of the shard in CEPH_STATE, read after the fences: the
   * sessions' states, and their items (deleted ones left out). */
  cph_clog_state *states;
  size_t n_states;
  cph_clog_item *items;
  size_t n_items;
  void (*discard)(void *decoded); /* the hook that frees the entries' decoded results */
} cph_clog_replay;
void cph_clog_replay_free(cph_clog_replay *rp); /* NULL is fine */

typedef struct cph_clog_hooks {
  void *ctx;
  /* A publish's outcome: rc CPH_OK with its stream sequence (dup: the message id had been
   * stored before, seq is the original's), CPH_ECONFLICT when its expectation failed (not
   * stored: another node wrote there), or another error (why says what NATS answered; the
   * publish may or may not have been stored — publishing again with the same id is safe). */
  void (*published)(void *ctx, uint64_t ref, int rc, uint64_t seq, bool dup, const char *why);
  /* A message of a shard this node served when it was delivered. The hook owns m. */
  void (*message)(void *ctx, cph_clog_msg *m);
  /* Optional: the payload decoded on the thread that received the message (never the loop),
   * before `message` sees it: the result is m->decoded. Reads only what never changes after
   * start. discard frees a result nobody took (m acknowledged or released with it set). */
  void *(*decode)(void *ctx, const char *data, size_t len);
  void (*discard)(void *decoded);
  /* A session record put (value, vlen) or deleted (value NULL) in the bucket; key is the
   * session id (decoded). */
  void (*session)(void *ctx, const char *session, const char *value, size_t vlen);
  /* The past of a shard this node is taking (see above). The hook owns rp; it calls
   * cph_clog_rebuilt (or cph_clog_rebuild_failed) with rp->gen when it is done with it. */
  void (*replayed)(void *ctx, cph_clog_replay *rp);
  /* A min_pos wait's outcome (cph_clog_wait_pos): rc CPH_OK (reached), CPH_ETIMEDOUT (why says
   * which step it was in); or a fence check's (cph_clog_check_fence): CPH_OK with seq,
   * CPH_ECONFLICT, CPH_ETIMEDOUT. */
  void (*pos)(void *ctx, uint64_t ref, int rc, uint64_t seq, const char *why);
  /* A cph_clog_read_items answer: rp holds the items read (rp->items; no shard, states or
   * entries), or is NULL when a read failed (why says what). The hook owns rp. */
  void (*items)(void *ctx, uint64_t ref, cph_clog_replay *rp, const char *why);
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

/* The largest data a publish takes: the connected NATS server's max_payload (which counts the
 * headers too) less CPH_CLOG_HEADER_ROOM for the headers; 0 until connected. NATS's default
 * max_payload is 1 MiB; the node warns at connection when it is below
 * CPH_CLOG_PAYLOAD_WANTED. */
#define CPH_CLOG_HEADER_ROOM 1024
#define CPH_CLOG_PAYLOAD_WANTED (1024 * 1024)
int64_t cph_clog_max_payload(cph_clog *l);

/* Publishes data to subject with the message id msgid (Nats-Msg-Id); the outcome comes to
 * hooks.published with ref, at the latest after max_wait_ms (capped at 3 s; then as an error).
 * Never waits. CPH_EBUSY when not connected yet or too much is in
 * flight (then no hook call comes), CPH_ENOMEM, CPH_ELIMIT when data is larger than
 * cph_clog_max_payload (the log will never take it: no hook call comes). kv_delete: a key-value delete marker. expect:
 * unless CPH_CLOG_NO_EXPECT, the log stores the message only if subject's last sequence is
 * expect (0: none), else the outcome is CPH_ECONFLICT (a fence: clusterflow.h 10.). */
#define CPH_CLOG_NO_EXPECT UINT64_MAX
int cph_clog_publish(cph_clog *l, const char *subject, const char *msgid, const void *data,
                     size_t len, bool kv_delete, int64_t max_wait_ms, uint64_t ref,
                     uint64_t expect);
/* The subjects: ceph.s.<shard>.in|fwd, ceph.s.done.<shard>, the bucket key subject of a
 * session and that of a shard's watermark. */
void cph_clog_subject(char *buf, size_t size, uint32_t shard, bool fwd);
void cph_clog_done_subject(char *buf, size_t size, uint32_t shard);
int cph_clog_session_subject(char *buf, size_t size, const char *session);
int cph_clog_state_subject(char *buf, size_t size, uint32_t shard, const char *session);
void cph_clog_mark_subject(char *buf, size_t size, uint32_t shard);

/* Waits, on the pos thread, until log position pos is applied here for shard (a shard this
 * node serves; -1: every shard it serves, or with `only` — a bitmap of :shards bits, bit s in
 * byte s / 8 — those of them whose bit is set) — "Waiting for a position" above; the outcome
 * comes to hooks.pos with ref, at the latest after wait_ms. Never waits itself. CPH_EBUSY when
 * the log is not ready (then no hook call comes), CPH_ENOMEM. */
int cph_clog_wait_pos(cph_clog *l, uint64_t pos, int64_t shard, const uint8_t *only,
                      int64_t wait_ms, uint64_t ref);

/* After a done mark of shard was refused (wrong last sequence): reads, on the pos thread, the
 * last message of ceph.s.done.<shard> — CPH_OK with its sequence when this node wrote it (a
 * mark whose message id begins with mark_prefix, or this node's epoch: an earlier write of its
 * own was stored without an acknowledgement, and nobody wrote since), CPH_ECONFLICT when
 * another node did (it took the shard over), CPH_ETIMEDOUT when it could not be read within
 * wait_ms. The outcome comes to hooks.pos with ref. CPH_EBUSY (not ready: no call), CPH_ENOMEM. */
int cph_clog_check_fence(cph_clog *l, uint32_t shard, const char *mark_prefix, int64_t wait_ms,
                         uint64_t ref);

/* After a put to a CEPH_STATE key (subject) was refused (wrong last sequence): reads, on the pos
 * thread, the key's newest value — CPH_OK with its revision when it is deleted, or was written
 * in an epoch not after `epoch` (a deposed owner's late put: the caller may write over it),
 * CPH_ECONFLICT when a later epoch wrote it (another node took the shard over), CPH_ETIMEDOUT
 * when it could not be read within wait_ms. The outcome comes to hooks.pos with ref.
 * CPH_EBUSY (not ready: no call), CPH_ENOMEM. */
int cph_clog_check_state(cph_clog *l, const char *subject, uint64_t epoch, int64_t wait_ms,
                         uint64_t ref);

/* Reads, on a replay thread (in turn with the shards' replays), the newest value of every item
 * key of each owner in CEPH_STATE — "#<channel>": a channel's memories items (clusterflow.h
 * 16.), under the channel's shard — and hands them to hooks.items with ref. Never waits.
 * CPH_EBUSY when the log is not ready (then no hook call comes), CPH_ENOMEM. */
int cph_clog_read_items(cph_clog *l, const char *const *owners, size_t n, uint64_t ref);

/* The loop rebuilt shard from replay gen: the next sync binds its consumer. Or it could not:
 * the shard's past is read again a second later. A gen that is no longer the shard's current
 * one (it was lost and taken again meanwhile) is ignored. Any thread. */
void cph_clog_rebuilt(cph_clog *l, uint32_t shard, uint64_t gen);
void cph_clog_rebuild_failed(cph_clog *l, uint32_t shard, uint64_t gen);

/* Deletes, on the trim thread, every item key of session in CEPH_STATE ("<shard>.<session in
 * hex>.*", clusterflow.h 13.): a delete marker each, as a session's state key gets when it is
 * deleted — at once, and again CPH_CLOG_FORGET_DELAY_MS from now (the item puts still in
 * flight have ended by then). Each round is tried again every few seconds until it succeeds or
 * the node stops. Never waits. CPH_ENOMEM, CPH_EINVAL (an id too long for a key). Not a stream purge:
 * nats-server before 2.9.18 makes a filtered purge unsafe with :replicas > 1 ("Trimming"). */
#define CPH_CLOG_FORGET_DELAY_MS 15000
int cph_clog_forget_items(cph_clog *l, uint32_t shard, const char *session);
/* The subject of session's item `name` in CEPH_STATE. */
int cph_clog_item_subject(char *buf, size_t size, uint32_t shard, const char *session,
                          const char *name);

/* Releases libnats's process-wide state (its threads): once, after every cph_clog_stop and after
 * the last message was acknowledged or released. */
void cph_clog_close_library(void);

/* Asks the trim thread to purge shard's in/fwd messages below `below` (bounded further by its
 * consumer's ack floor) and its done marks below the lower of `below` and `done_below` ("Trimming"
 * above). `below` must be a watermark of the shard that the log holds (CEPH_SHARDS took it from
 * this node), `done_below` the sequence of this node's last write on ceph.s.done.<shard>. Never
 * waits; replaces a request of the shard not taken yet. CPH_EBUSY when the log is not ready or
 * trimming was refused (no purge comes), CPH_EINVAL. */
int cph_clog_trim(cph_clog *l, uint32_t shard, uint64_t below, uint64_t done_below);

void cph_clog_ack(cph_clog *l, cph_clog_msg *m);
void cph_clog_release(cph_clog *l, cph_clog_msg *m);

typedef struct cph_clog_stats {
  bool ready;     /* connected, stream and bucket in place */
  uint32_t bound; /* shards whose consumer this node is bound to */
  uint64_t published, delivered;
  int64_t in_flight;
  uint32_t rebuilding; /* served shards whose past is being read or rebuilt from */
  uint64_t lag;        /* messages of the shards bound here not applied yet (cph_clog_json) */
  int trim_allowed;    /* 1: purges run, -1: refused (the NATS server), 0: not known yet */
  uint64_t trims, trim_purged, trim_failures; /* purge rounds, messages purged, failed rounds */
  uint64_t items_forgotten, forget_failures;  /* cph_clog_forget_items: keys deleted, failures */
} cph_clog_stats;
void cph_clog_get_stats(cph_clog *l, cph_clog_stats *out);

/* True once connected with the stream in place. */
bool cph_clog_ready(cph_clog *l);
/* {"state", "stream", "replicas", "shards_bound", "published", "delivered", "in_flight",
 * "lag", "last_error", "trim": {"state", "purges", "purged_messages", "failures",
 * "refused_why"}} for GET /v1/cluster. lag: messages of the shards bound here that this
 * node has not applied — the consumers' backlogs (as of binding, then of each delivery) and
 * those delivered and not yet acknowledged; a message released after a failure counts again
 * once it is delivered again. New reference. */
json_t *cph_clog_json(cph_clog *l);

#endif
