#!/usr/bin/env bash
# bench/cluster-cycle.sh — the three-node turn cycle of bench/cluster.sh alone (no one-node
# runs, no ingest, no takeover), then what each node put into the session-state bucket
# (GET /v1/cluster log.states, when the build has it). For comparing two builds quickly:
#   bench/cluster-cycle.sh BIN_DIR [SECONDS] [BASE_PORT]    (default 5, 7850)
set -uo pipefail
bin=${1:?usage: cluster-cycle.sh BIN_DIR [SECONDS] [BASE_PORT]}
secs=${2:-5}
base=${3:-7850}
here=$(cd "$(dirname "$0")/.." && pwd)
log=$(mktemp /tmp/cephalon-cluster-cycle.XXXXXX)
# The policy of bench/cluster.sh's nodes: lanes that never bind, concurrency 64 per node.
CLUSTER_KEEP_GOING=1 CLUSTER_POLICY_EXTRA='
 :scheduler {:concurrency 64
             :lanes {:interactive {:turns 100000000 :tool-calls 100000000}
                     :operational {:turns 100000000 :tool-calls 100000000}}}
 :backpressure {:defaults {:max-step 0}}' \
  "$here/scripts/cluster.sh" "$bin" "$base" >"$log" 2>&1 &
pid=$!
num() { echo "$1" | grep -o "\"$2\": *[0-9]*" | head -1 | grep -o '[0-9]*$'; }
ready=0
for _ in $(seq 240); do # every node serving its shards, its log ready and bound to each
  ok=0
  for i in 0 1 2; do
    v=$(curl -sf "http://127.0.0.1:$((base + i))/v1/cluster" 2>/dev/null) || continue
    owned=$(num "$v" shards_owned)
    bound=$(num "$v" shards_bound)
    if echo "$v" | grep -q '"shards_unowned": *0' && echo "$v" | grep -q '"state": *"ready"' &&
      [ -n "$owned" ] && [ "$owned" = "$bound" ]; then
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
sleep 1
"$bin/cephalon-bench" cycle --seconds "$secs" --nodes "$base,$((base + 1)),$((base + 2))" 2>&1 |
  tail -1
for i in 0 1 2; do
  v=$(curl -sf "http://127.0.0.1:$((base + i))/v1/cluster" 2>/dev/null)
  echo "node $i states: $(echo "$v" | grep -o '"states": *{[^}]*}' || echo none)"
done
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -f "$log"
