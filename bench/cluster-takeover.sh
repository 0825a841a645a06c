#!/usr/bin/env bash
# bench/cluster-takeover.sh — the takeover of one big shard, measured (issue #20: "takeover time
# for a shard with 10k sessions and 1M events"), on this machine:
#   1. scripts/cluster.sh: etcd, three NATS JetStream servers (3 replicas), three cephalond;
#   2. cephalon-bench cluster-fill: N sessions on one shard of node c, and M events naming them,
#      posted over HTTP through every node (1,000 a request; each logged, then applied by c),
#      none consumed; it returns once c applied them all;
#   3. node c is killed -9. Timed from the kill: `owned_s` until a and b own every shard (c's
#      etcd lease expired: the TTL is 5 s), `takeover_s` until both serve every shard rebuilt
#      from the log and bound to its consumer. The rebuild of the big shard — read its watermark,
#      fences, messages, done marks and session states from JetStream, create the sessions from
#      the session table, apply every unconsumed event again to its session — is what lies
#      between: rebuild_s = takeover_s - owned_s, and events_per_s = rebuilt events / rebuild_s.
# Every process runs on the same cores: the figures say what this machine does, not three.
#   bench/cluster-takeover.sh [BIN_DIR]    (default build-bench/bin)
#   TAKEOVER_SESSIONS (10000), TAKEOVER_EVENTS (1000000), TAKEOVER_PORT (7900: ports ..+32)
set -uo pipefail
bin=${1:-build-bench/bin}
sessions=${TAKEOVER_SESSIONS:-10000}
events=${TAKEOVER_EVENTS:-1000000}
base=${TAKEOVER_PORT:-7900}
here=$(cd "$(dirname "$0")/.." && pwd)
log=$(mktemp /tmp/cephalon-bench-takeover.XXXXXX)
# The nodes of bench/cluster.sh (bench/cluster-lib.sh); their queues are deep enough for the
# events each session gets (nothing consumes them).
. "$here/bench/cluster-lib.sh"
bench_cluster_start "$bin" "$base" "$log"
pid=$cluster_pid
stop() { bench_cluster_stop "$log"; }
num() { bench_cluster_num "$@"; }
view() { curl -sf "http://127.0.0.1:$((base + $1))/v1/cluster" 2>/dev/null; }
bench_cluster_wait_ready "$base" "$log" cluster-takeover
fill=$("$bin/cephalon-bench" cluster-fill --nodes "$base,$((base + 1)),$((base + 2))" \
  --victim $((base + 2)) --sessions "$sessions" --events "$events" | tail -1)
if ! echo "$fill" | grep -q '^cluster-fill '; then
  echo "cluster-takeover: cluster-fill failed: $fill" >&2
  stop
  exit 1
fi
echo "$fill"
sleep 2 # c puts its watermarks once a second
dir=$(sed -n 's/.*(logs: \(.*\))$/\1/p' "$log" | head -1)
cpid=$(pgrep -f "$dir/c\.edn" | head -1)
ev0=0
for i in 0 1; do v=$(num "$(view $i)" events_total); ev0=$((ev0 + ${v:-0})); done
t0=$(date +%s.%N)
kill -9 "$cpid"
owned_s="" took=""
for _ in $(seq 6000); do # at most 300 s
  ok=0 owned=0
  for i in 0 1; do
    v=$(view $i) || continue
    o=$(num "$v" shards_owned)
    owned=$((owned + ${o:-0}))
    [ "$o" = "$(num "$v" shards_bound)" ] && [ "$(num "$v" shards_unowned)" = 0 ] &&
      [ "$(num "$v" in_progress)" = 0 ] && ok=$((ok + 1))
  done
  now=$(date +%s.%N)
  [ -z "$owned_s" ] && [ "$owned" = 256 ] && owned_s=$(echo "$now - $t0" | bc)
  if [ "$ok" = 2 ] && [ "$owned" = 256 ]; then
    took=$(echo "$now - $t0" | bc)
    break
  fi
  sleep 0.05
done
ev1=0 read_s=0
for i in 0 1; do
  v=$(view $i)
  e=$(num "$v" events_total)
  ev1=$((ev1 + ${e:-0}))
  # the slowest rebuild's read: the big shard's, on whichever node took it
  r=$(echo "$v" | grep -o '"last_read_seconds": *[0-9.e+-]*' | grep -o '[0-9.e+-]*$')
  [ -n "$r" ] && read_s=$(awk -v a="$read_s" -v b="$r" 'BEGIN { print (b > a ? b : a) }')
done
stop
if [ -z "$took" ]; then
  echo "cluster takeover_s=n/a (the survivors did not serve every shard within 300 s)"
  exit 1
fi
awk -v t="$took" -v o="$owned_s" -v e="$((ev1 - ev0))" -v s="$sessions" -v r="$read_s" 'BEGIN {
  rb = t - o
  printf "cluster takeover_s=%.2f owned_s=%.2f rebuild_s=%.2f read_s=%.2f rebuilt_events=%d", t, o, rb, r, e
  printf " sessions=%d rebuild_events_per_s=%.0f\n", s, (rb > 0 ? e / rb : 0) }'
