#!/usr/bin/env bash
# bench/cluster-cycle.sh — the three-node turn cycle of bench/cluster.sh alone (no one-node
# runs, no ingest, no takeover), then what each node put into the session-state bucket
# (GET /v1/cluster log.states, when the build has it). For comparing two builds quickly:
#   bench/cluster-cycle.sh BIN_DIR [SECONDS] [BASE_PORT]    (default 5, 7850)
# CYCLE_ARGS adds options to the cycle (e.g. CYCLE_ARGS="--memories 2"); the items each node
# put (log.items) are printed beside the states.
set -uo pipefail
bin=${1:?usage: cluster-cycle.sh BIN_DIR [SECONDS] [BASE_PORT]}
secs=${2:-5}
base=${3:-7850}
here=$(cd "$(dirname "$0")/.." && pwd)
log=$(mktemp /tmp/cephalon-cluster-cycle.XXXXXX)
. "$here/bench/cluster-lib.sh"
bench_cluster_start "$bin" "$base" "$log"
pid=$cluster_pid
num() { bench_cluster_num "$@"; }
bench_cluster_wait_ready "$base" "$log" cluster-cycle
sleep 1
# shellcheck disable=SC2086 # CYCLE_ARGS is a list of options
"$bin/cephalon-bench" cycle --seconds "$secs" --nodes "$base,$((base + 1)),$((base + 2))" \
  ${CYCLE_ARGS:-} 2>&1 | tail -1
for i in 0 1 2; do
  v=$(curl -sf "http://127.0.0.1:$((base + i))/v1/cluster" 2>/dev/null)
  echo "node $i states: $(echo "$v" | grep -o '"states": *{[^}]*}' || echo none)"
  echo "node $i items: $(echo "$v" | grep -o '"items": *{[^}]*}' || echo none)"
done
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -f "$log"
