#!/usr/bin/env bash
# bench/cluster.sh — durable ingest on one node and on a three-node cluster (DESIGN §14, issue
# #20's "1 node vs 3 nodes"), on this machine, one after the other:
#   1. cephalon-bench ingest (it starts its own cephalond: one node, no cluster);
#   2. scripts/cluster.sh (etcd, three NATS JetStream servers, three cephalond with :cluster on
#      loopback ports), then cephalon-bench ingest --nodes with the clients spread over the
#      three nodes: every event goes through the log and is applied by its channel's owner.
# Prints both summary lines and their ratio. All processes run on the same cores, so the
# figure says what the log and the extra processes cost here, not what three machines give.
#   bench/cluster.sh [BIN_DIR] [SECONDS]      (default build-bench/bin, 5)
set -uo pipefail
bin=${1:-build-bench/bin}
secs=${2:-5}
base=7850
here=$(cd "$(dirname "$0")/.." && pwd)
one=$(CPH_BIN_DIR=$bin "$bin/cephalon-bench" ingest --seconds "$secs" 2>&1 | tail -1)
echo "one node:    $one"
log=$(mktemp /tmp/cephalon-bench-cluster.XXXXXX)
"$here/scripts/cluster.sh" "$bin" "$base" >"$log" 2>&1 &
pid=$!
ready=0
for _ in $(seq 200); do # every node serving its shards, its log ready and bound
  ok=0
  for i in 0 1 2; do
    v=$(curl -sf "http://127.0.0.1:$((base + i))/v1/cluster" 2>/dev/null) || continue
    if echo "$v" | grep -q '"state": *"serving"' && echo "$v" | grep -q '"shards_unowned": *0' &&
      echo "$v" | grep -q '"state": *"ready"'; then
      ok=$((ok + 1))
    fi
  done
  [ "$ok" = 3 ] && { ready=1; break; }
  sleep 0.25
done
if [ "$ready" != 1 ]; then
  echo "cluster: not ready in 50 s; its output:" >&2
  cat "$log" >&2
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"
  exit 1
fi
sleep 3 # the shards' consumers bound (up to ~7 s for 256 shards at start)
three=$("$bin/cephalon-bench" ingest --seconds "$secs" --nodes "$base,$((base + 1)),$((base + 2))" 2>&1 | tail -1)
echo "three nodes: $three"
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -f "$log"
e1=$(echo "$one" | sed -n 's/.*events_per_s=\([0-9]*\).*/\1/p')
e3=$(echo "$three" | sed -n 's/.*events_per_s=\([0-9]*\).*/\1/p')
if [ -n "$e1" ] && [ -n "$e3" ] && [ "$e1" -gt 0 ]; then
  awk -v a="$e3" -v b="$e1" 'BEGIN { printf "cluster ingest_ratio=%.3f (three nodes / one node)\n", a / b }'
else
  echo "cluster ingest_ratio=n/a" && exit 1
fi
