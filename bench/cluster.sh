#!/usr/bin/env bash
# bench/cluster.sh — durable ingest and the turn cycle on one node and on a three-node cluster
# (DESIGN §14, issue #20's "1 node vs 3 nodes"), on this machine, one after the other:
#   1. cephalon-bench ingest and cycle (each starts its own cephalond: one node, no cluster);
#   2. scripts/cluster.sh (etcd, three NATS JetStream servers, three cephalond with :cluster on
#      loopback ports), then cephalon-bench cycle --nodes (each client's session created on its
#      owner, the client posting, leasing and completing there: every event goes through the
#      log, to its channel's shard and forwarded to its session's) and ingest --nodes (clients
#      spread over the three nodes; every event applied by its channel's owner).
# Prints the summary lines and the ratios. All processes run on the same cores, so the figures
# say what the log and the extra processes cost here, not what three machines give.
#   bench/cluster.sh [BIN_DIR] [SECONDS]      (default build-bench/bin, 5)
set -uo pipefail
bin=${1:-build-bench/bin}
secs=${2:-5}
base=7850
here=$(cd "$(dirname "$0")/.." && pwd)
one=$(CPH_BIN_DIR=$bin "$bin/cephalon-bench" ingest --seconds "$secs" 2>&1 | tail -1)
echo "one node:    $one"
one_c=$(CPH_BIN_DIR=$bin "$bin/cephalon-bench" cycle --seconds "$secs" 2>&1 | tail -1)
echo "one node:    $one_c"
log=$(mktemp /tmp/cephalon-bench-cluster.XXXXXX)
# The nodes run with the budgets and backpressure of the one-node runs (bench/proc.c,
# cph_bench_policy): lanes that never bind, concurrency 64 per node.
CLUSTER_POLICY_EXTRA='
 :scheduler {:concurrency 64
             :lanes {:interactive {:turns 100000000 :tool-calls 100000000}
                     :operational {:turns 100000000 :tool-calls 100000000}}}
 :backpressure {:defaults {:max-step 0}}' \
  "$here/scripts/cluster.sh" "$bin" "$base" >"$log" 2>&1 &
pid=$!
ready=0
num() { echo "$1" | grep -o "\"$2\": *[0-9]*" | head -1 | grep -o '[0-9]*$'; }
for _ in $(seq 240); do # every node serving its shards, its log ready and bound to each of them
  ok=0
  for i in 0 1 2; do
    v=$(curl -sf "http://127.0.0.1:$((base + i))/v1/cluster" 2>/dev/null) || continue
    owned=$(num "$v" shards_owned)
    bound=$(num "$v" shards_bound)
    if echo "$v" | grep -q '"state": *"serving"' && echo "$v" | grep -q '"shards_unowned": *0' &&
      echo "$v" | grep -q '"state": *"ready"' && [ -n "$owned" ] && [ "$owned" = "$bound" ]; then
      ok=$((ok + 1))
    fi
  done
  [ "$ok" = 3 ] && { ready=1; break; }
  sleep 0.25
done
if [ "$ready" != 1 ]; then
  echo "cluster: not ready in 60 s; its output:" >&2
  cat "$log" >&2
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"
  exit 1
fi
sleep 1 # the budget shares: every node has read the others' demand once
nodes="$base,$((base + 1)),$((base + 2))"
# the cycle first: ingest leaves the nodes applying its backlog for a while
three_c=$("$bin/cephalon-bench" cycle --seconds "$secs" --nodes "$nodes" 2>&1 | tail -1)
echo "three nodes: $three_c"
three=$("$bin/cephalon-bench" ingest --seconds "$secs" --nodes "$nodes" 2>&1 | tail -1)
echo "three nodes: $three"
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -f "$log"
c1=$(echo "$one_c" | sed -n 's/.*cycles_per_s=\([0-9]*\).*/\1/p')
c3=$(echo "$three_c" | sed -n 's/.*cycles_per_s=\([0-9]*\).*/\1/p')
cycle_ok=0
if [ -n "$c1" ] && [ -n "$c3" ] && [ "$c1" -gt 0 ]; then
  awk -v a="$c3" -v b="$c1" 'BEGIN { printf "cluster cycle_ratio=%.3f (three nodes / one node)\n", a / b }'
  cycle_ok=1
else
  echo "cluster cycle_ratio=n/a"
fi
e1=$(echo "$one" | sed -n 's/.*events_per_s=\([0-9]*\).*/\1/p')
e3=$(echo "$three" | sed -n 's/.*events_per_s=\([0-9]*\).*/\1/p')
if [ -n "$e1" ] && [ -n "$e3" ] && [ "$e1" -gt 0 ]; then
  awk -v a="$e3" -v b="$e1" 'BEGIN { printf "cluster ingest_ratio=%.3f (three nodes / one node)\n", a / b }'
else
  echo "cluster ingest_ratio=n/a" && exit 1
fi
[ "$cycle_ok" = 1 ] || exit 1
