/* Cluster mode (DESIGN §14, "Accepting"): how events flow through the replicated log
 * (clusterlog.h) between the nodes. Runs only with :cluster and :nats; loop thread only.
 *
 * 1. Accept, on any node. POST /v1/events checks each event as the engine would (body,
 *    sender, a channel or a session, lengths, and that a named session exists — from the
 *    session table below) and appends each valid one to ceph.s.<shard>.in, where the shard is
 *    its session's when it names one (an event with a session is routed to that session
 *    only, DESIGN §4, so it is applied where the session lives) and its channel's otherwise.
 *    Message id: its `key` when it has one, else one minted here (<node>.<boot>.<n>); the
 *    payload carries that id as the event's `key`, and ts_ms is fixed here. The events
 *    without a key of one request that go to one shard are one message instead, {"id":
 *    <node>.<boot>.b<n>, "batch": [event, ...]} (at most 1,000 events or 256 KiB; one alone
 *    goes as a single event): JetStream's cost is per message. Each keeps its own id inside,
 *    which is all the rest goes by (engine keys, done marks, the rebuild), and answers the
 *    message's position. A keyed event goes alone, so the log answers duplicate for it alone.
 *    Both forms are read everywhere (a log written before batches holds single events only).
 *    The answer is
 *    sent once the log acknowledged every event of the request (JetStream acknowledges after
 *    a quorum of :replicas stored it): per event {"id": null, "status": "accepted", "sessions":
 *    [], "pos": <stream sequence>}, or "duplicate" with the original's pos when the log had
 *    the message id already, or "rejected" with reason and field (nothing logged; also an
 *    event whose message would be larger than the log takes, cph_clog_max_payload, less room
 *    for its forwards). id and sessions are null/empty: they are known only when the owner
 *    applies it. A publish is
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
 *    window (a batch message's copies to S go together, in order, as one message {"batch":
 *    [copy, ...]} under `<batch message id>/<S>`: each (event, S) pair is in that id only);
 *    the copy names S as its session (and mentions S when S was mentioned) and
 *    carries the engine key "f:" + the event's time in hex + SHA-256 of that id (the time
 *    first: the node's keys grow in time order), so S's owner applies it to S alone,
 *    once. Every delivery to a session but the named one thus goes through the log, which is
 *    what keeps it single when the `in` event is applied again: redelivered to the same node
 *    (a `duplicate`, its forwards deduplicated) or to the shard's next owner after a death
 *    (applied there again, its forwards deduplicated). The `in` message is acknowledged only
 *    when every forward was acknowledged by the log; if one fails it is not, and comes again.
 *    S's owner stores the forwarded event in its own copy of the channel's history, which S's
 *    context shows. Two copies of one message on one node (the `in` event applied where a
 *    subscriber lives, or forwards to two sessions on one node) are one message there: the
 *    later copy finds the first among the channel's newest 256 history entries (same channel,
 *    sender, accepted time and body; core/ingest.c copy_held) or, further back, by the raw
 *    memory the first minted under the message's origin (16.; copy_by_origin), and adds no
 *    history entry, no dedupe family and no memory — it is not a repeat of itself. A repeat's
 *    copies (no history entry, no raw memory) are one repeat: the first marks the message's
 *    time and identity in the dedupe database, and a later copy that finds the mark folds
 *    into its session's entry without counting in the family again (dedupe_copy_seen). A
 *    repeat folds into the session's entry of its own copy of the message (which holds that
 *    copy's event, not the original's: core/ingest.c copy_fold_target), as on one node.
 *    Cost: a session on the channel owner's own node also gets its copy through the log
 *    (one more append and delivery, a few ms on loopback); and as forwards name their
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
 *    event posted before a subscribe would not. The answer of a session create, change or
 *    delete waits until the log took the record (cph_cflow_session_written: 503 after 10 s, so
 *    a session answered 200 is known to the node that serves it next, after a kill -9 too);
 *    a record the sweep publishes is retried for 30 s and logged if the log never takes it.
 *    The sweep goes over the node's sessions (a page a second) and publishes the record of any
 *    session on a served shard that the table lacks — sessions created before the log was
 *    configured included.
 *
 * 5. Adopting a shard. When a node starts serving a shard (it took it over, came back, or
 *    restarted), the log reads the shard's past and hands it here before the shard's consumer
 *    is bound (clusterlog.h, "Taking a shard over"). First the sessions of that shard that the
 *    table defines and the engine lacks are created from their definitions (queued before
 *    anything of the rebuild, 8.), so events and forwards reach them here. Then each takes the
 *    state its previous owner left in the log (11.): context tree, episode, credits, recent
 *    replies (its replies stream's, with their origins, too). Their unconsumed input is
 *    rebuilt from the log (6.-8.).
 *
 * 6. Done marks: what turns consumed, in the log. Every log message reaches at most one
 *    session (2., 3.: an in event its named session, a forward its session), so an engine key
 *    names one delivery. With the log on, the engine lists the keys of the events a completion
 *    consumes — every event of every entry it carried, those folded into an entry included
 *    (DESIGN §5; the engine's fold members) — and of the live inbox a session delete drops
 *    (cph_engine_report_consumed). After the local commit this node appends them to
 *    ceph.s.done.<shard of the session> as {"session", "keys": [...]} (marks of about 64 KiB,
 *    each under a message id of its own), and the completion's 200 waits until the log
 *    acknowledged every part — so a 200 completion means its mark is durable — and until then
 *    the node still served the shard. Otherwise (10 s, as ingest; or the shard moved) it answers
 *    503 `unavailable`; the local commit stands (a retry answers from the stored turn and logs
 *    the mark again), only a later rebuild elsewhere may deliver that input again. A repeated
 *    completion (`already`) logs its mark again. A delete's mark is not waited for, nor the
 *    mark of an event its session refused (while_running :reject: it did not reach it, so a
 *    rebuild must not deliver it). Interrupted and superseded turns consume nothing (their
 *    input is staged again); :merge's taken entries are consumed by the completion that
 *    carries them; a parked turn's input is not consumed, and its park mark says so (below).
 *    Park marks: a turn parked here after :leases :max-attempts failed attempts (core/turns.c)
 *    consumes nothing, but an operator parked it on purpose, so the node that takes its
 *    session over must not hand its input to a turn either. So the node appends to the same
 *    subject {"session", "park": [keys], "turn": "<node>/<turn id>", "attempts", "error"} —
 *    keys as a completion's would be: every event of every entry the turn carried, folded
 *    ones included — and a requeue of a parked turn here appends {"session", "unpark":
 *    [keys of what it brought back], "turn", ...}. They go as done marks go (parts of about
 *    64 KiB sharing "turn", message ids of the done marks' form, the shard's queue: in order
 *    with the shard's other marks, one at a time, fenced: 10.). A fail that parks its turn,
 *    and a requeue, answer once the log took every part; otherwise (10 s, the shard moved,
 *    the node stopping) 503 `unavailable`, the park or requeue standing here. Waited for
 *    because a park answered 200 must be parked, and a requeue answered 200 staged, on
 *    whichever node serves the session next — without the mark that node does the opposite
 *    of what the operator saw — and it costs only those rare requests a round trip. A turn a
 *    lease expiry parks has no request: its mark is logged right after the pass that parked
 *    it committed (cph_engine_take_parks, cph_cflow_passed) and nobody waits. A park mark the
 *    log did not take (either kind of park; counted in log.parks.failures) is sent again —
 *    the same marks under new message ids, through the shard's queue — 1 s later, then twice
 *    the previous wait up to 30 s, on the watermark tick, until the log takes it: a node that
 *    takes the session over would otherwise deliver that input again. Before each attempt it
 *    is given up (log.parks.given_up) when the turn is no longer parked here (requeued: its
 *    unpark mark follows, and a park landing after it would park the input again; its
 *    session deleted: the delete's mark names its keys) or this node no longer serves the
 *    shard (the next owner rebuilt from what the log held; the fence would refuse it). A park
 *    mark stored but answered late and sent again is harmless: a rebuild parks a key once. An
 *    unpark mark the log did not take (the requeue answered 503, saying so) is sent again the
 *    same way, while every key it names is still in its session's live inbox here (pending,
 *    staged or carried by a running turn) — once one is consumed (its done mark settles it) or
 *    parked again by a later turn (whose park mark must stay the last word on it), or the
 *    session is gone, it is given up: the next owner then holds the input parked, the safe
 *    side, until a requeue there. Resends go oldest first, so a turn's park mark goes before
 *    its unpark mark. A stop sends what waits at once and waits
 *    for it (cph_cflow_stop_begin); what is left at the stop's deadline is lost (logged).
 *    Parked keys stay in the pending set (7.). A rebuild reads the marks in log order (8.):
 *    a done mark consumes a key for good, a park mark parks it and a later unpark mark
 *    brings it back.
 *
 * 7. The watermark of a shard, so a rebuild reads a bounded past. Per served shard the node
 *    tracks the log positions of the events it applied that reached their session and are not
 *    consumed (an ordered set keyed by engine key: added when the batch committed, before the
 *    message is acknowledged; removed by the completion or delete that consumed them), and of
 *    the messages delivered to it and not acknowledged (in flight, or released and due again).
 *    The watermark is the lowest of those and the newest position seen + 1: every message of
 *    the shard below it reached no session, or reached one that consumed it. Parked input is
 *    not consumed (6.): its events stay in the set while their turn is parked, so a parked
 *    turn holds its shard's watermark — and the shard's log (12.) — where it is until a
 *    requeue and a completion (or its session's delete) consume them; a rebuild then finds
 *    them with their park mark. About once a
 *    second, when it changed, the owner puts it into the key-value bucket CEPH_SHARDS (key: the
 *    shard); only while it serves the shard, and only once it rebuilt it (a node that lost the
 *    shard stops before the next owner can read the bucket). Lower than the truth is always
 *    safe (a longer replay); it never passes an unconsumed event: one applied after a put is
 *    above the newest position seen then, or was held then. The log below it is purged (12.).
 *
 * 8. Rebuilding a shard, before its consumer is bound. From the replay (the watermark W, or 1;
 *    the stream's last sequence L when the replay began; the shard's in/fwd messages in
 *    [W, L]; its done marks from W on): every in message naming a session and every forward
 *    whose key no done mark names is applied again, in log order, to its named session alone
 *    (only_session, as in 2.), in batches of one engine operation at a time, right after the
 *    adoption — so the entries land in the inbox in the order, and with the folding, the first
 *    application gave them as far as the engine's rules go (a repeat folds into its original's
 *    entry when that is still queued; timestamps of arrival are the rebuild's). Nothing is
 *    forwarded: a message whose forwards may be missing was not acknowledged, so the shard's
 *    consumer delivers it again once bound and 3. forwards it then (the engine's key makes
 *    that delivery a duplicate for its named session); an acknowledged one had its forwards
 *    acknowledged first. In messages without a session (a channel's) reached no session and
 *    are not applied; messages naming a session the table does not know are skipped. Parked
 *    input (6.): the messages whose key a park mark names, and no later unpark or done mark,
 *    go first, before all others — the events of one parked turn (its marks' "turn", its
 *    session) in log order as one engine operation, which then, in the same pass, parks the
 *    live entries they stand for as one turn (CPH_OP_INGEST's park_session, core/turns.c
 *    turns_park_keys): a turn record in state parked with the mark's attempts and error and
 *    the input a lease would have shown, listed by GET /v1/turns?state=parked, its entries
 *    out of the live inbox until POST /v1/turns/{id}/requeue there (which logs the unpark
 *    mark). So no lease can take them in between, and no later event of the rebuild folds
 *    into them (their entries come first, and are parked by then); the cost is that they
 *    enter the channel's history here before events that preceded them in the log. What
 *    reached its session joins the shard's pending set (7.), parked input too (also when the
 *    engine holds it parked already: this node parked it before a restart, park_held); a
 *    message the engine already had (this node applied it before a restart, or before the
 *    shard went away and came back) joins it only if its event is still in the session's
 *    live inbox (cph_engine_inbox_keys) or parked as its mark says — one that is not was
 *    consumed here and is not delivered again. Then each
 *    session of the shard keeps, of its live entries, only those of the events just found
 *    unconsumed (CPH_OP_INBOX_RETAIN): a node that comes back holds stale copies of its old
 *    sessions, whose entries another node's turns may have consumed meanwhile (a done mark, or
 *    below the watermark) — those go; and a session handed back while another node served it
 *    (routes_turns.c: a fail marked away, never picked meanwhile) may be picked again. The
 *    same operation settles the session's turns parked here before by what the marks say of
 *    their keys (core/turns.c turns_retain_parked; the retain gets the keys parked and the
 *    keys an unpark mark brought back): a turn whose keys are parked stays parked; one
 *    requeued on another node and not consumed yet is requeued here; one none of whose keys
 *    is unconsumed any more (consumed elsewhere, done marks or below W) leaves the parked
 *    list, its entries consumed; one with no mark either way (parked before park marks were
 *    logged, or its mark was lost) stays parked and its keys stay pending. So a node that
 *    comes back neither lists a stale parked turn nor lets a requeue of it bring back input
 *    consumed elsewhere. In cluster mode GET /v1/turns?state=parked lists only the parked
 *    turns of the sessions served here, and a requeue of a turn parked here for a session
 *    another node serves answers 409 naming that node (routes_turns.c): the input is parked
 *    there, under that node's turn id. Then the shard is live, the log binds its consumer, and messages above L come through 2. A
 *    message is acknowledged only while its shard is served here, so one applied after the
 *    shard moved comes to the next owner too. Cost: a replay reads the shard's messages
 *    between W and L and all its marks since W; with turns consuming input, W stays close to
 *    L. Events are applied REBUILD_BATCH (8,192) to an engine operation, each an LMDB commit.
 *    Measured on the 2-core VM (bench/cluster-takeover.sh): a shard with 10k sessions and 1M
 *    unconsumed events (1,000 batch messages) read in 1-2 s and applied again in 43-52 s.
 *
 * 9. Reads see writes (min_pos, DESIGN §14). A client that got `pos` P from 1. may pass it to
 *    a session's GET routes (?min_pos=P) and to the lease ("min_pos": P) on any node; the
 *    request waits, off the loop, until this node applied every message at or below P routed
 *    to that session's shard (the lease: to any shard served here), then runs as without it.
 *    P's message is applied by the owner of its shard X, which forwards copies (3.) with later
 *    positions to the subscribers' shards. As P is acknowledged only after its forwards were
 *    (3.), once consumer s<X>'s ack floor reached P every forward of P is at or below the
 *    stream's last sequence L read after that; and once the consumer of the session's shard
 *    — bound here, after its rebuild (8.) — has acknowledged everything up to L (its ack floor
 *    reached the newest of its messages stored then), this node committed them all: it
 *    acknowledges only after the engine committed, only while serving the shard, and what a
 *    previous owner acknowledged the rebuild applied. The log's pos thread does those steps
 *    (clusterlog.h, "Waiting for a position"); the route then runs again behind the shard's
 *    gate (421 if the shard moved meanwhile). Bound: CPH_MIN_POS_WAIT_MS (5 s), then 504
 *    `timeout` on field min_pos; the lease's own wait_ms begins after. Only requests that carry
 *    min_pos pay (a few JetStream requests, ~10 ms on loopback); without the log it is checked
 *    (400 unless a non-negative integer) and ignored: one node applies before it answers.
 *
 * 10. Fencing a deposed owner (DESIGN §14 "State"). A node stops serving a shard before its lease
 *    can expire (cluster.h), but a write it decided before that (a done mark, a watermark put)
 *    could still reach the log after the next owner read the shard's past. So the writes only an
 *    owner makes carry a fencing token JetStream checks: the expected last sequence of their
 *    subject (nats-server 2.9 checks it on the subject published to only). Taking a shard, before
 *    its replay, the node writes the shard's watermark key in CEPH_SHARDS again with its value,
 *    expecting the revision it just read (or creates it as 1, expecting none), and appends
 *    {"epoch": node} to ceph.s.done.<shard> expecting that subject's last sequence; a write in
 *    between (the previous owner's) makes either fail, and both are read and tried again. It then
 *    reads the done marks after its epoch, so the rebuild sees every mark that landed before it.
 *    From then on its watermark puts expect the revision of its last put and its done marks the
 *    sequence of its last mark (or of its epoch): done marks of a shard go one at a time, in order
 *    (a completion's 200 waits for the marks queued before its own; ~1 ms each on loopback). Once
 *    another node took the shard, its epoch moved both subjects on, so this node's next write is
 *    refused (JetStream "wrong last sequence"): the shard is fenced here — no more marks or
 *    watermarks of it until this node takes it again — and a completion waiting for the refused
 *    mark answers 503 `unavailable` (its input may be delivered again by the new owner, whose
 *    rebuild did not see the mark). A message id seen before is a duplicate before any expectation
 *    is checked, so a resend of a mark that was stored is not refused; a mark refused all the same
 *    (an earlier one of this node was stored but never acknowledged, so this node expects too
 *    little) is told apart by reading the subject's last message: this node's own mark or epoch —
 *    it continues after it — or another node's epoch or mark — deposed. A refused watermark put
 *    cannot be told apart (its value names no node): the node puts no more watermarks of the shard
 *    until it takes it again, which only makes a later rebuild read further back. Not fenced:
 *    forwards (3.) — many shards' owners write to a shard's fwd subject; a deposed owner's forward
 *    carries the same message id as the one the next owner makes when it applies that
 *    unacknowledged message again, so the log keeps one (only a session the deposed owner's table
 *    still routed to and the new one's no longer does could get a stray copy); session records
 *    (4.) — last writer wins, as before.
 *
 * 11. A session's state, in a compacted changelog (DESIGN §14 "State"). What a user would see
 *    lost after a takeover besides the input: the session's conversation and what its turns
 *    left. With the log on, every completion (a repeated one too) hands here, with its done
 *    mark's keys, the session's state after it (cph_op u.turn.state, core/handover.c says what it
 *    holds: the context tree's records — the input and reply cores of every turn within the
 *    history bound, the nodes workers inserted —, the episode, the credits, its newest 64
 *    replies of the replies stream with their origins (core/replystream.h; 256 KiB at most),
 *    the newest entries of each of its channels' history that a turn of it could read
 *    (512 at most, back to where its own entries hold its window's worth of text) — the users' and other agents'
 *    messages with its replies, but what its inbox still holds; 256 KiB at most —, the newest
 *    memories of the scopes its turns read — its own and its channels', 160 raw and 64 others
 *    over them all —, its newest ended turn records and its newest 16 seals, those with their
 *    origins), and so does every seal and every edit of its context tree (a node inserted,
 *    updated or deleted: u.context.state, cph_cflow_context_changed, no marks — their 200 waits
 *    for the state alone, so a seal or an edit answered 200 moves with its session).
 *    The node puts it into the
 *    key-value bucket CEPH_STATE under "<shard>.<session id in hex>", prefixed with its epoch
 *    (be64: the sequence of its epoch on ceph.s.done.<shard>, 10.), expecting the key's
 *    revision it last read or wrote (none: a create). What follows the epoch is the state
 *    packed with deflate (server/statezip.h: "CPHZ", be32 its raw length, a zlib stream; a fifth
 *    to a sixth of the raw bytes for the bench's states, which repeat the conversation in the tree,
 *    the channels' history and the kept contexts), or the raw state ("CPHS") when packing makes
 *    it no smaller — and as every earlier build wrote it, so a rolling upgrade's old values
 *    still load. The packing runs on the packer's thread, beside the loop, in the order the
 *    states were queued; the shard's queue waits at a state until it is packed (other shards'
 *    marks do not wait for it). A reader takes a raw value as it is; the replay thread unpacks
 *    a packed one (bounded by CPH_SESSION_STATE_MAX_BYTES whatever its header says): one that
 *    is cut, damaged, inflates to other than its stated length or states more than the bound
 *    is logged, naming its key, and not imported — the session keeps what it has, as with a
 *    state its engine refuses. The put goes through the shard's queue
 *    of done marks, before the completion's marks: the marks are sent once the log holds the
 *    state (not at all when it failed), and the completion's 200 waits for all of them; a
 *    failure answers 503 as a failed mark does (the local commit stands; a retry, `already`,
 *    puts state and marks again). So a 200 means the log holds the reply: a rebuild that sees
 *    the mark sees the state it follows. A node taking a shard reads, after its fences (10.),
 *    the newest value of every key of the shard (an ordered consumer, last per subject) and,
 *    right after the adoption (5.) and before the replayed events (8.), imports each into its
 *    session (CPH_OP_SESSION_STATE: the tree replaced, episode and credits set, each stream
 *    reply whose origin this node's replies stream lacks added to that stream, each channel
 *    entry its channel's history here lacks appended to it in their order — the same event by
 *    its channel, sender, time fixed at 1. and body, as its key differs per forward — and its
 *    cursor there moved past what its turns saw) — so the session's next lease
 *    shows what it showed on the previous owner (the questions its replies answered, as seen
 *    history), its tree every answered turn once, and a
 *    connector reading this node's GET /v1/replies gets the replies the previous owner wrote
 *    (a 200 completion's reply is in its state: so a kill -9 before any connector read it from
 *    the dead node loses it not). Replies are offered again, not moved: a node cannot know
 *    what a connector read, so every stream reply of the state that the new owner lacks is
 *    offered there, read before elsewhere or not — at least once: the state's newest 64, and
 *    the older ones as items (13.) — and a connector drops a reply it delivered already (by
 *    its origin: cli/cmd_replies.c). Per node a
 *    reply is added once (the origin index), so a shard moving back or twice adds nothing it
 *    held. Fencing: a deposed owner's state put in flight may land after the next
 *    owner read the key; the next owner's own put then expects an older revision and is
 *    refused; it reads the key (the pos thread): a value of an older epoch is the deposed
 *    owner's (its completion answered 503: its mark came after the epoch) and is written over,
 *    a newer epoch's means another node took the shard since: fenced, as in 10. A deposed
 *    owner writes at most one such put per shard (one write of a shard is in flight at a time;
 *    the next, a mark, is refused). A session delete deletes its key (unfenced, as its record).
 *    Why a key per session and not per-shard snapshots in the object store plus a changelog:
 *    a completion changes one session, so its put is that session's state and nothing else
 *    (a few hundred bytes to tens of KiB raw, a sixth to a third of that packed), the bucket
 *    keeps only the newest value of each key
 *    (history 1: compacted by JetStream, nothing to trim or snapshot), a takeover reads exactly
 *    the shard's live keys, and JetStream's revision check fences each key. The cost: one more
 *    publish per completion in the shard's serial queue (the 200 waits for state then marks:
 *    two round trips instead of one) and the state's bytes; bounded by the tree's history
 *    bound (128 message cores) and 256 KiB each of stream replies, channel history and
 *    memories, under NATS's 1 MiB message limit (CPH_HANDOVER_MAX_BYTES: the stream replies go
 *    first, the other parts are left out when they would not fit; docs/cluster-scaling.md has
 *    figures). The kept turn contexts (the explorer's) moved in the state until they moved as
 *    items (13.): the part stays in the format, empty (core/handover.c, STATE_KEPT). Not
 *    moved: channel cursors as such (the new
 *    owner's move past the moved entries its turns saw), maintenance jobs (each node's own work
 *    on what it holds: the new owner embeds and compacts what it imported), memories beyond
 *    their bound (160 + 64; turn records, seals and replies beyond theirs move as items, 13.),
 *    a stream reply's source inbox ids, and a channel's
 *    entries older than a turn of the session could show (or beyond the 256 KiB).
 *
 * 12. Trimming the log, so it does not grow without bound. Below a shard's watermark W (7.) a
 *    rebuild reads nothing (8.: events from W, done marks from W — a mark follows the event it
 *    names). So once the log holds a W this node put (the put was fenced, 10.: no other node had
 *    taken the shard), the owner has the log purge, on its trim thread (clusterlog.h,
 *    "Trimming"), the shard's in and fwd messages below min(W, its consumer's ack floor + 1) and
 *    its done marks below min(W, the sequence of this node's last mark or epoch there). The ack
 *    floor: the consumer must never be left to deliver a purged message — after a rebuild W may
 *    pass a channel's message the previous owner applied and did not acknowledge (it reached no
 *    session here), whose forwards only its delivery makes (8.). The last done message stays: it
 *    is the fence the next write there expects. A purge late from a deposed owner is still
 *    safe: its W was true when it was put and stays true, and the next owner starts its replay
 *    at the W it reads from the key, which is that one or a later put. Forwards to other shards
 *    are theirs to purge (their own watermarks). Session records, watermarks and states live in
 *    their key-value buckets, which keep only each key's newest value. At most once every
 *    :cluster :log-trim-seconds (default 10; 0: never) per shard, and only when W moved: two
 *    JetStream requests and a consumer info per shard then, off the loop. The stream then holds
 *    about what turns have not consumed yet plus :log-trim-seconds of traffic; a session whose
 *    inbox nobody works holds its shard's W, and so the log of that shard, where it is. Not with
 *    a NATS server that purges unsafely (clusterlog.h, "Trimming"): then nothing is purged and
 *    GET /v1/cluster log.trim says why. A repeat of a purged message within the deduplication
 *    window is still answered duplicate (JetStream keeps the ids in memory, not the messages);
 *    after a NATS server restart only the ids of messages still stored are known, and a repeat
 *    of a purged one is logged again and applied once (the engine's key), as after the window.
 *
 * 13. Items: a session's records beyond its state's bounds. A state carries a session's newest
 *    64 ended turn records, 64 stream replies and 16 seals (11.); the older ones would stay on
 *    a dead node's disk.
 *    So each record is also put under a key of its own in CEPH_STATE,
 *    "<shard>.<session in hex>.<kind><origin in hex>" (kind 't' a turn record, 's' a seal, 'r' a reply; the
 *    origin is the record's identity cluster-wide), its value the writer's epoch and the record
 *    as a state encodes it (core/handover.h, "Items"): a completion gives the turn record it
 *    ended and those of the session's turns that failed since its previous completion
 *    (cph_op u.turn.items) and the reply it wrote to the replies stream (kind 'r', named by its
 *    origin: the new owner adds it to its stream unless it holds the origin), a failure its
 *    turn's record (which no state carries until the next completion), a requeue its turn's
 *    record again (it says "requeued" now, where its put said "parked"), a turn that ended with
 *    no request — its lease expired (parked or not), or a while_running :restart superseded it
 *    — its record and kept context, taken after the pass that ended it
 *    (cph_engine_take_ended_items, cph_cflow_passed; past 32 MiB of such items waiting, as
 *    after a mass expiry, kept contexts are left out and logged), a seal the seal
 *    (u.context.items). They are put right after the
 *    completion or seal committed, beside its state and marks and not waited for: a record is
 *    in every state put until 64 newer ones (16 seals) followed it, so its item only has to
 *    land before that — a completion's 200 costs nothing more. One that does not land in 10 s
 *    is logged and counted (GET /v1/cluster log.items.failures) and sent again as a reply's
 *    copy is (14.: the same subject, message id and data, 1 s later, then doubling to 30 s
 *    apart, until the log takes it; log.items.retries, .pending, .dropped; within the same
 *    64 MiB bound) — but only while three things hold, checked before every attempt: it is
 *    the newest put of its key made here (a newer one — a kept context's slot, a memory put
 *    again tombstoned — supersedes it: an older value never lands over a newer one), its
 *    session was not deleted here (the delete's second round of delete markers, below, could
 *    come before the resend), and this node serves its shard under the epoch it was made in
 *    (10.). An item is the owner's write: once the shard moved, the next owner took the
 *    session's records from its state and may put the same keys itself (a kept context's
 *    slot), so the item is given up, logged and counted as dropped — its record moves only if
 *    the state carried it (its newest 64 turn records, 16 seals, 160 raw memories). A resend of
 *    a put the bucket stored without answering writes the same value under the same key again
 *    (within the bucket's deduplication window, not even that). A node taking a shard
 *    over reads the items with the states (one consumer, last value per key) and hands each
 *    session's to the engine with its state (CPH_OP_SESSION_STATE), which stores those whose
 *    origin it lacks, oldest first, before the state's own — so every record's id there
 *    follows the order the records were made in, as GET /v1/turns?session= lists them — and
 *    counts and logs one it refuses (malformed, another session's, another store schema).
 *    Items of a session with no state key (its state put failed) go alone. A record whose item
 *    never landed (logged) still moves while the state carries it, but is stored after the
 *    items newer than it: the listing's order there then differs for it (nothing is lost). Not fenced: a
 *    record a deposed owner made did happen there (its completion may have answered 503 and
 *    been done again elsewhere: both records then move, each under its origin). A session
 *    delete deletes its items' keys: the trim thread lists them (stream info filtered by the
 *    session's prefix) and puts a delete marker on each, right after the delete and again
 *    CPH_CLOG_FORGET_DELAY_MS later, once the item puts still in flight have ended; retried
 *    until it succeeds. A takeover skips deleted items. Not a
 *    filtered stream purge, which nats-server before 2.9.18 makes unsafe with replicas (12.).
 *    Memories a worker gives: a completion also gives, as items of kind 'm', the memories it
 *    minted (the session's own scope): the state carries the newest 160 raw memories over the
 *    session's own and its channels' scopes, so with busy channels a worker's older memories
 *    fell out of it. A memory record has no origin: the item's name carries it
 *    ("<node>/<id there>/<hash>", core/memory.h), and the importer indexes it
 *    (memory_origins, both ways), so each is stored once. A gc_commit of a session's own
 *    memories (a maintenance completion's u.turn.job_items, put by server/maint_workers.c)
 *    puts its summary and its sources again, tombstoned, under the keys they had: a node that
 *    takes the session over then stores the summary and not the sources, and one that holds
 *    copies of them tombstones those (core/gc.h, gc_tombstone).
 *    Kept turn contexts (the explorer's, core/turnlog.h): a completion gives its turn's as an
 *    item of kind 'k' named by a slot, not by an origin — "r" and its turn's ordinal among
 *    the session's ended turns (core/turnrecs.h) modulo :context :keep-turns, for every turn
 *    however it ended — completed, interrupted, failed, parked, expired, superseded
 *    (handover_kept_item) — a ring, so a
 *    session holds at most keep-turns of them in the bucket (and the "c<n>", "f" and "i"
 *    slots of builds before the ring until it is deleted), each put over the one keep-turns
 *    turns older (no delete needed); the value is the state's form (the
 *    turn record's origin, then the record, self-contained), stored on the new owner under the
 *    id its turn record got in the same import (ranked after the turn records). An item of
 *    ITEM_PACK_MIN bytes or more (a kept context, a seal) is packed on the state packer as a
 *    state is (statezip.h), and unpacked by the replay thread.
 *    Cost: a publish per completion, per reply, per memory it mints, per seal and two per
 *    turn that ended otherwise (its record, its kept context) (the turn record:
 *    ~0.5-1 KB; a memory ~100 bytes plus its text; a seal: the rendered tree, up to ~66 KB),
 *    not on the completion's path; the bucket holds every record of every live session
 *    (history 1), and a takeover reads all of its shard's — a session's whole turn history,
 *    where the state alone carried its newest. Its channels' memories, summaries beyond the
 *    state's 64, kept turn contexts and channel history stay bounded by the state (11.).
 *
 * 14. Replies in the other nodes' copies of a channel. Each node keeps its own copy of a
 *    channel's history (3.: the events forwarded to its sessions), and a completion writes its
 *    reply into the copy of the node it ran on (DESIGN §4: a reply joins its channel's history
 *    as a message from the session) — so agents in one channel on different nodes would not
 *    see each other's replies. After a completion that wrote a reply into a channel, the node
 *    sends a copy of it — the event as the history holds it: channel, the session as sender,
 *    kind "reply", body, the time it was written, with "history": true — to one shard of each
 *    other node that serves subscribers of the channel (the first such shard by number; a shard
 *    with no owner known gets its own), on ceph.s.<shard>.fwd, message id
 *    "h.<node>.<boot>.<n>/<shard>", one engine key "h.<node>.<boot>.<n>" for all of them. Its
 *    owner applies it with the shard's messages, in log order (cph_event_in.history_only): the
 *    event stored and appended to its copy of the channel, unless the key was seen or the
 *    channel's newest 256 entries hold the same event (channel, sender, time, body: a moved
 *    session's state brings its channels' entries too, 11.) — no session, dedupe, family or
 *    memory, not counted as an event. The node's sessions in the channel then see it in their
 *    context as they see a reply written on their own node. A copy reaches no session: it is
 *    never pending and falls below the watermark at once (7.); a rebuild applies the copies
 *    above the watermark again (8.), harmlessly. Not waited for: the completion's 200 does not
 *    wait for the copies (the reply itself is in its session's state). Sent again: a copy the
 *    log does not take within 10 s is logged and counted (GET /v1/cluster
 *    log.history_copies.failures) and published again — the same subject, message id and data
 *    — 1 s later, then after twice the previous wait up to 30 s, one publish each time (up to
 *    3 s for the log's answer), until the log takes it (log.history_copies.retries and
 *    .pending, and in GET /metrics; clusterflow.c RESEND_* says why those figures, and the
 *    test hook CPH_TEST_FAIL_HIST_COPIES fails attempts for test_cluster_copyretry). It stays
 *    valid whoever owns its shard meanwhile: it is addressed to the shard's fwd subject, which
 *    the shard's owner of the moment applies (this node too, if the shard came here: it finds
 *    its own reply among the channel's newest 256 entries and holds the copy). Sending it
 *    again is safe: an attempt the log stored without answering makes a resend within the
 *    stream's deduplication window (:cluster :log-dedupe-seconds, by default :dedupe
 *    :key-window-seconds, a day) a duplicate there; after the window the log stores it again,
 *    and the receiving node holds it by its engine key (remembered :dedupe
 *    :key-window-seconds) or, after that too, by the same event among the channel's newest 256
 *    entries — stored twice only when both windows passed and 256 newer entries came in
 *    between. What waits is bounded: copies and items (13.) together, 64 MiB at most (struct,
 *    subject, id and data); one that would pass the bound is dropped — logged as an error and
 *    counted (log.history_copies.dropped), what waits already keeping its place (the oldest
 *    are the longest unseen) — as is one the node has no memory for, and those still waiting
 *    at the deadline of the node's stop (logged with their count: a stop sends what waits
 *    at once, cph_cflow_stop_begin, and waits for it). Only then do that node's sessions not see
 *    the reply in that channel. A copy taken late lands at the end of that node's copy of the
 *    channel (below). Not copied: a repeated completion's reply (copied the first time),
 *    replies into a direct channel (no subscribers; they move with their session's state), and
 *    to the channel's own shard.
 *    Limits: a copy applied on a node that dies before its sessions' next completion put their
 *    state moves with them only while it is above the shard's watermark (it reached no session,
 *    so the watermark passes it at once); and a copy arriving after other events lands after
 *    them in that node's copy (the channel's history only grows at its end), where on one node
 *    it would have come first. Cost: one log message per other node serving subscribers, per
 *    reply, and on the receiving node a look through the channel's newest entries — in its
 *    warm tail (core/chantail.h), so ~8 µs a copy stored and ~1-2 µs one held, against ~80
 *    and ~60 when each look decoded the entries from the store (`cephalon-bench
 *    history-copies`, bench/PROFILE.md "History copies").
 *
 * 15. Events in the other nodes' copies of their channel. An event with a session and a
 *    channel is applied on its session's node only (1., 2.), where it joins the channel's
 *    history, which on one node every subscriber's context shows (DESIGN §4: the session gets
 *    the entry; the channel keeps the message); and a channel's events reach its subscribers'
 *    nodes as forwards (3.), but not a node where only members of the channel live (a member
 *    reads its history, DESIGN §2, and is forwarded an event only when mentioned). So when the
 *    owner applies an `in` event that names a session, or any `in` event of a channel with
 *    members, and it was stored in the history (queued, or stored for nobody: a channel's event
 *    on its owner, or one refused by a busy session; a redelivery's `duplicate` too, not an
 *    aggregated repeat), it copies it as
 *    14. copies a reply — the event as the history holds it, no session, "history": true — to
 *    the shards copy_shards picks for its channel (one per other node serving subscribers or
 *    members; replies' copies, 14., go to members' nodes too),
 *    but not to a node that gets a forward of it (a mentioned session lives there: the forward
 *    is its entry there, and a copy applied before the forward would make a second one, as a
 *    copy is not seen by exact deduplication), on their fwd subjects, beside its forwards
 *    (3.): under the engine key "h:" + the event's time in hex + SHA-256 of
 *    "<event id>/#" (the same however often and wherever it is applied, so a node stores it
 *    once) and the message id "<event id>/#<shard>", a batch's copies to one shard together as
 *    {"batch": [...]} under "<batch id>/#<shard>" ('#' is in no session id: no forward has
 *    these ids). Unlike 14. they are waited for: the `in` message is acknowledged once the log
 *    took them, as its forwards, so one not taken in time makes the message come again, and
 *    its copies are sent again under the same ids. The receiving node applies them as 14.
 *    says. A rebuild (8.) copies nothing, as it forwards nothing: an acknowledged message had
 *    its copies taken. Limits as 14.'s: a copy lands at the end of each node's copy of the
 *    channel (a turn shows it at its time: core/context.c entries_sort); a node serving no
 *    subscriber of the channel when the event was applied does not get one (a session that
 *    subscribes or moves there later sees what its state brings, 11.).
 *    Cost: one log message per other node serving subscribers per `in` message holding such
 *    events, and the `in` message's acknowledgement waits for it.
 *
 * 16. A channel's memories, whole. Each node keeps its own copy of a channel (3.), and a
 *    session's state carries only the newest raw memories of its scopes (11.: its channel
 *    history's worth and 32 more). So a channel's older memories stayed on the node that made
 *    them: after its death a session's memory search on its new owner did not find them. Now
 *    the node that applies an `in` message (2.) gives the engine its events with memory_item
 *    set; each raw memory one mints in its channel comes back as a part (the event's identity
 *    cluster-wide as its origin — "e:", its time and the SHA-256 of the scope, the event's
 *    sender, its time and its body, which its forwards share (its key they do not); the time
 *    leads, so the origin index grows at its end: core/memory.h —, then the memory's
 *    record: core/handover.h), and the parts of one message and
 *    channel go as one item into CEPH_STATE under the channel's key, "<shard of the channel>.
 *    <'#' and the channel in hex>.c<SHA-256 of the message id>" (more items, "…n<k>", when
 *    they would pass 512 KiB): the same message applied again, by this node or the shard's
 *    next owner, puts the same key, and its memories the same origins. Put as 13.'s items are
 *    (not waited for; sent again while this node serves the message's shard). A forward (3.),
 *    a history copy (14., 15.) or a rebuild's replay (8.) gives none: the `in` message's
 *    applier gave them. The raw memories of a message's events to a session alone (their
 *    direct channels, "#direct:<session>") go likewise, but as one item per shard of their
 *    sessions, not per session — an item per session and message made the takeover bench's
 *    fill of 1M such events 224 s against 27-32 s —, under "<shard>.<'#' CPH_DIRECT_MEMORIES
 *    in hex>.d<the time of the message's first such event, 16 hex digits><SHA-256 of the
 *    message id>[n<k in 6 digits>]": a shard's direct items sort by the time they were
 *    made, and come with the shard's keys. Every log event is applied with memory_origin
 *    (cph_event_in): wherever it is applied — the `in` event, a
 *    forward, a rebuild's delivery — its raw memory is minted under that origin, or, when
 *    the node has the memory of that origin already (taken from the items, or minted by
 *    another delivery), that one is linked to the event and none is minted. A node taking a
 *    shard over reads, before it imports the shard's
 *    states, the items of the channels of the shard's sessions (their subscriptions and the
 *    channels they are members of; cph_clog_read_items, on a replay thread, a read per channel)
 *    and of the shard's own channels (they come with the shard's keys), and stores,
 *    channel by channel and oldest first (CPH_OP_CHANNEL_MEMORIES, 1,024 memories a pass: the
 *    states wait for the imports' last step), each memory it lacks: not one whose origin it
 *    has (taken before, or minted from the event), nor — for copies minted before memories
 *    had origins — one it holds a copy of (a memory of the scope with the same text, each
 *    copy standing for one, live or replaced by its gc: a tombstone's text is in the summary
 *    that replaced it; a moved state's memories are held the same way). A rebuild's delivery
 *    of the event after the import finds the memory by its origin. The shard's direct items
 *    go the same way, DIRECT_IMPORT_ITEMS (16) items an operation in the order they were
 *    made, each memory into its own direct channel's scope — held by its origin alone (direct
 *    memories had none before these items), and not stored for a session the node does not
 *    have (deleted since: the items outlive it). The items of a message whose every event to
 *    a session alone the rebuild delivers again (none consumed) are not imported: the
 *    delivery mints those memories, after the states, as they are the newest
 *    (log.channel_memories.direct_items_redelivered).
 *    Before the states, so a channel's older memories get lower ids here than the state's
 *    newer ones and a turn lists the same newest memories it listed on the old owner (a turn
 *    lists a scope's memories by id); the state's memories then find themselves held, and each
 *    raw one is linked to its moved event (memory_link_source), as a minted one is, so a turn
 *    that shows the event does not list it twice. A read that fails is tried twice more, then
 *    the rebuild goes on without it (logged: the sessions have what their states carried).
 *    test_cluster_chanmem: 1,200 notes in a channel and 750 to its session alone, the node
 *    with the channel and its session killed, the survivor finds the oldest note of each and
 *    lists the memory section the dead node listed. Not moved this way: aggregates (a family's
 *    memory changes as repeats come) and summaries of a channel's memories (a node compacts its
 *    own copy: the new owner's gc compacts what it took; a node with no copy of the channel
 *    takes live the raw memories the old owner's gc had replaced), which the states carry as
 *    before (their newest 64); nor a channel's history entries older than a turn shows (11.).
 *    Cost: one item per `in` message and channel, and one per message and shard for its events
 *    to a session alone (the bucket keeps every raw memory of every channel, its text and ~200
 *    bytes; a channel's memories compacted away stay there), and at a takeover a read and an
 *    import of every memory of the sessions' channels and direct channels before the shard is
 *    served. */
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
/* A stop began (SIGTERM): the copies of replies, items and park marks that wait to be sent
 * again (6., 13., 14.) go now, and then every STOP_RESEND_MS (200 ms) rather than after their
 * back-off; while any of those, or one in flight that no request waits for, is not taken,
 * cph_srv.log_unsettled holds the stop open (until its deadline, then cph_cflow_quiesce
 * drops what is left, logged and counted). NULL is fine; once. */
void cph_cflow_stop_begin(cph_cflow *f);
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
 * node: publishes its record (see 4. above), not waited for (the record sweep's). */
void cph_cflow_session_changed(cph_cflow *f, const char *session, const cph_session_info *now);
/* The same for request r, which waits: answered with `answer` (taken) once the log took the
 * record, 503 `unavailable` when it does not within DONE_DEADLINE_MS (10 s) or the node stops
 * first — so a session created, changed or deleted with a 200 is seen so by the node that
 * serves it next, after a kill -9 too. Called from r's on_done; sets r->held when r waits. */
void cph_cflow_session_written(cph_cflow *f, cph_req *r, const char *session,
                               const cph_session_info *now, json_t *answer);
/* A completion committed on this node consumed the events named by keys (their engine keys,
 * cph_op u.turn.consumed) of session and left it in `state` (u.turn.state; NULL: none): answers
 * r with `answer` (taken) once the log holds the state and the done mark, or 503 (see 6. and
 * 11. above). Called from r's on_done; sets r->held when r waits. */
void cph_cflow_completed(cph_cflow *f, cph_req *r, const char *session, const cph_strv *keys,
                         const uint8_t *state, size_t state_len, json_t *answer);
/* A change of session's context made on this node — a seal, a node inserted or updated, a
 * node deleted — left the session in `state` (u.context.state; NULL: not read, logged):
 * answers r with `answer` (taken) once the log holds the state, as a completion's does (11.
 * above; no done mark: an edit or a seal consumes nothing), or 503 when it does not within
 * the deadline, the shard is not served here or the node is stopping (the change stands here,
 * and the session's next completion carries it). `made` says what was done ("seal 4 was
 * made"), `lacks` what the next owner would lack ("the seal (a retry makes another seal)"),
 * for that 503; each under 64 bytes. Called from r's on_done; sets r->held when r waits. */
void cph_cflow_context_changed(cph_cflow *f, cph_req *r, const char *session, const char *made,
                               const char *lacks, const uint8_t *state, size_t state_len,
                               json_t *answer);
/* A completion or seal committed on this node gave items (13. above): puts each under its key,
 * not waited for (one the log does not take in time is logged, counted and sent again). Nothing
 * while the session's shard is not live here. */
void cph_cflow_items(cph_cflow *f, const char *session, const cph_state_items *items);
/* A completion committed on this node wrote session's reply `body` into channel's history here
 * at ts_ms (cph_op u.turn.reply_written_channel): copies it into the other nodes' copies of that
 * channel (14. above), not waited for (one the log does not take in time is logged, counted and
 * sent again until it does). */
void cph_cflow_replied(cph_cflow *f, const char *session, const char *channel, const char *body,
                       int64_t ts_ms);
/* A session deleted on this node dropped the events named by keys: logs their done mark
 * (nobody waits for it). */
void cph_cflow_deleted(cph_cflow *f, const char *session, const cph_strv *keys);
/* A turn of this node was parked (parked; a fail's u.turn.park) or requeued (!parked; a
 * requeue's u.turn.park): logs its park or unpark mark (6. above) and answers r with `answer`
 * (taken) once the log took it, or 503 `unavailable` when it does not within DONE_DEADLINE_MS,
 * the shard moved or the node is stopping (the park or requeue stands here). r NULL (answer
 * NULL): nobody waits, a failure is logged and counted. A note with no session or no keys: r
 * is answered at once. Called from r's on_done; sets r->held when r waits. */
void cph_cflow_parked(cph_cflow *f, cph_req *r, bool parked, const cph_park_note *note,
                      json_t *answer);
/* After each engine pass (main.c): the park marks of the turns lease expiries parked
 * (cph_engine_take_parks), and the items of the turns that ended with no request
 * (cph_engine_take_ended_items, 13.), not waited for. NULL is fine. */
void cph_cflow_passed(cph_cflow *f);
/* min_pos (see 9. above): r waits, off the loop, until log position pos is applied here for
 * shard (-1: every shard this node serves), then resume(r) runs the route (it answers, or sets
 * r->async, as a handler does, and the request ends the same way); or r is answered 504
 * `timeout` after CPH_MIN_POS_WAIT_MS, 503 `unavailable` when the log is not reachable. Sets
 * r->async when r waits. */
#define CPH_MIN_POS_WAIT_MS 5000
void cph_cflow_wait_pos(cph_cflow *f, cph_req *r, uint64_t pos, int64_t shard,
                        void (*resume)(cph_req *r));
/* The cephalon_cluster_log_* families of GET /metrics, appended to out. CPH_OK or CPH_ENOMEM. */
int cph_cflow_metrics(cph_cflow *f, cph_buf *out);
/* {"state", ..., "sessions_known", "applied", "forwarded", "min_pos": {...}, "rebuild": {...}}
 * for GET /v1/cluster. */
json_t *cph_cflow_json(cph_cflow *f);

#endif
