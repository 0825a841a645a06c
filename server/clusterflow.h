/* Cluster mode (DESIGN §14, "Accepting"): how events flow through the replicated log
 * (clusterlog.h) between the nodes. Runs only with :cluster and :nats; loop thread only.
 *
 * 1. Accept, on any node. POST /v1/events checks each event as the engine would (body,
 *    sender, a channel or a session, lengths, and that a named session exists — from the
 *    session table below) and appends each valid one to ceph.s.<shard>.in, where the shard is
 *    its session's when it names one (an event with a session is routed to that session
 *    only, DESIGN §4, so it is applied where the session lives) and its channel's otherwise.
 *    Message id: its `key` when it has one, else one minted here (<node>.<boot>.<n>); the
 *    payload carries that id as the event's `key`, and ts_ms is fixed here. The answer is
 *    sent once the log acknowledged every event of the request (JetStream acknowledges after
 *    a quorum of :replicas stored it): per event {"id": null, "status": "accepted", "sessions":
 *    [], "pos": <stream sequence>}, or "duplicate" with the original's pos when the log had
 *    the message id already, or "rejected" with reason and field (nothing logged). id and
 *    sessions are null/empty: they are known only when the owner applies it. A publish is
 *    retried (same message id: stored once) until 10 s have passed; then the whole request
 *    answers 503 `unavailable` — never a 200 for an event the log did not take.
 *
 * 2. Apply, on the owner of the shard. The owner's consumer (clusterlog.h) hands it the
 *    shard's messages in order; they are applied in batches as one engine ingest operation
 *    each (the normal local path: history, families, memories), with only_session set: the
 *    event reaches its named session, if it names one, and nobody else here. A message is
 *    acknowledged to the log only after the engine committed. The engine's idempotency key
 *    (the message id) makes a second delivery to the same node a `duplicate`.
 *
 * 3. Forward. After applying an `in` event the owner publishes a copy to
 *    ceph.s.<shard of S>.fwd for every other session S it is routed to — the channel's
 *    subscribers when it names no session, and the mentioned sessions, as the session table
 *    below knows them — wherever S lives, this node included. Message id
 *    `<event message id>/<S>`, so the log stores each forward once within its deduplication
 *    window; the copy names S as its session (and mentions S when S was mentioned) and
 *    carries the engine key "f:" + SHA-256 of that id, so S's owner applies it to S alone,
 *    once. Every delivery to a session but the named one thus goes through the log, which is
 *    what keeps it single when the `in` event is applied again: redelivered to the same node
 *    (a `duplicate`, its forwards deduplicated) or to the shard's next owner after a death
 *    (applied there again, its forwards deduplicated). The `in` message is acknowledged only
 *    when every forward was acknowledged by the log; if one fails it is not, and comes again.
 *    S's owner stores the forwarded event in its own copy of the channel's history, which S's
 *    context shows. Cost: a session on the channel owner's own node also gets its copy through
 *    the log (one more append and delivery, a few ms on loopback); and as forwards name their
 *    session, near-duplicate folding (DESIGN §5, bulk channels) does not fold them in inboxes.
 *
 * 4. Who subscribes where: the session table. The owner of a session publishes the session's
 *    record to the key-value bucket CEPH_SESSIONS whenever it is created, changed or deleted
 *    ({"subscribe": [channel], "def": {"class", "subscribe", "member", "tools",
 *    "autonomy_interval_s", "report_interval_s", "context_window_tokens", "system", "tenant",
 *    "while_running", "paused"}}; deleted: the key is deleted). Every node watches the bucket
 *    and keeps the whole table in memory (clustertable.h: session -> channels and definition,
 *    channel -> sessions, shard -> sessions): the
 *    channel's owner reads a channel's subscribers from it, and any node checks a named
 *    session from it. A change is visible to the other nodes once their watch delivered it
 *    (milliseconds); an event applied before that does not reach a new subscriber, as an
 *    event posted before a subscribe would not. The session answer does not wait for the
 *    record (it is retried for 30 s and logged if the log never takes it); a sweep over the
 *    node's sessions (a page a second) publishes the record of any session on a served shard
 *    that the table lacks — sessions created before the log was configured included.
 *
 * 5. Adopting a shard. When a node starts applying a shard (its first message after binding
 *    to the shard's consumer: it took the shard over, or bound again), it first creates from
 *    the table's definitions the sessions of that shard its engine lacks, queued before that
 *    message, so from then on events and forwards reach them here. Their state on the previous
 * owner (inbox not yet consumed, histories, credits, context, turns) does not move: that is lost
 *    with a dead node until snapshots and rebuild exist.
 *
 * Not here (later slices): snapshots and rebuild of a moved shard's state, fencing of a
 * deposed owner's writes, min_pos. */
#ifndef CEPHALON_SERVER_CLUSTERFLOW_H
#define CEPHALON_SERVER_CLUSTERFLOW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"
#include "common/buf.h"
#include "request.h"

typedef struct cph_cflow cph_cflow;

/* Starts the flow and its log (s->cluster must be running). CPH_EINVAL, CPH_ENOMEM, CPH_EIO;
 * err says why. */
int cph_cflow_start(cph_srv *s, cph_cflow **out, cph_err *err);
/* Shutdown, first step: answers every request still waiting for the log 503, stops taking
 * messages and closes the log (what was not acknowledged comes again to the next owner).
 * Engine operations of the flow still queued may finish afterwards; they release what they
 * hold. Idempotent. */
void cph_cflow_quiesce(cph_cflow *f);
/* Frees f (after the engine's last pass). NULL is fine. */
void cph_cflow_free(cph_cflow *f);

/* POST /v1/events in cluster mode (see 1. above): answers r, at once or after the log. */
void cph_cflow_ingest(cph_req *r, cph_event_in *events, size_t n);
/* A session was created or changed (now: the session as stored) or deleted (now NULL) on this
 * node: publishes its record (see 4. above). */
void cph_cflow_session_changed(cph_cflow *f, const char *session, const cph_session_info *now);
/* The cephalon_cluster_log_* families of GET /metrics, appended to out. CPH_OK or CPH_ENOMEM. */
int cph_cflow_metrics(cph_cflow *f, cph_buf *out);
/* {"state", ..., "sessions_known", "applied", "forwarded"} for GET /v1/cluster. */
json_t *cph_cflow_json(cph_cflow *f);

#endif
