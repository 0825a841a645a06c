#!/usr/bin/env bash
# bench/cluster.sh — durable ingest and the turn cycle on one node and on a three-node cluster
# (DESIGN §14, issue #20's "1 node vs 3 nodes"), on this machine, one after the other:
#   1. cephalon-bench ingest and cycle (each starts its own cephalond: one node, no cluster);
#   2. scripts/cluster.sh (etcd, three NATS JetStream servers, three cephalond with :cluster on
#      loopback ports), then cephalon-bench cycle --nodes (each client's session created on its
#      owner, the client posting, leasing and completing there: every event goes through the
#      log, to its channel's shard and forwarded to its session's) and ingest --nodes (clients
#      spread over the three nodes; every event applied by its channel's owner).
# Then the takeover: node c killed -9, timed until a and b serve every shard, rebuilt and bound.
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
. "$here/bench/cluster-lib.sh"
bench_cluster_start "$bin" "$base" "$log"
pid=$cluster_pid
num() { bench_cluster_num "$@"; }
bench_cluster_wait_ready "$base" "$log" cluster
sleep 1 # the budget shares: every node has read the others' demand once
nodes="$base,$((base + 1)),$((base + 2))"
# Where the time goes: the CPU of the cluster's processes (scripts/cluster.sh's children) and
# of the bench, in cores, over the middle of a run (from a fifth of it to four fifths).
tick=$(getconf CLK_TCK)
cpu_snap() { # pid comm ticks, for each process
  local p bench_pids
  bench_pids=$(pgrep -f "cephalon-bench (cycle|ingest) --seconds $secs --nodes")
  for p in $(pgrep -P "$pid") $bench_pids; do
    echo "$p $(cat "/proc/$p/comm" 2>/dev/null) $(awk '{print $14 + $15}' "/proc/$p/stat" \
      2>/dev/null)"
  done
}
# Runs cephalon-bench WHAT --nodes, printing its summary line and then the CPU split line.
three_run() {
  local out a b w
  out=$(mktemp)
  w=$(echo "$secs * 3 / 5" | bc -l) # the window measured
  "$bin/cephalon-bench" "$1" --seconds "$secs" --nodes "$nodes" >"$out" 2>&1 &
  local bp=$!
  sleep "$(echo "$secs / 5" | bc -l)"
  a=$(cpu_snap)
  sleep "$w"
  b=$(cpu_snap)
  wait "$bp"
  echo "three nodes: $(tail -1 "$out")"
  rm -f "$out"
  join <(echo "$a" | sort) <(echo "$b" | sort) | awk -v t="$tick" -v w="$w" -v what="$1" '
    { c[$2] += ($5 - $3) / t / w }
    END { printf "three nodes: %s cpu_cores cephalond=%.2f nats_server=%.2f etcd=%.2f bench=%.2f\n",
          what, c["cephalond"], c["nats-server"], c["etcd"], c["cephalon-bench"] }'
}
# the cycle first: ingest leaves the nodes applying its backlog for a while
three_c_out=$(three_run cycle)
echo "$three_c_out"
three_c=$(echo "$three_c_out" | head -1 | sed 's/^three nodes: //')
three_out=$(three_run ingest)
echo "$three_out"
three=$(echo "$three_out" | head -1 | sed 's/^three nodes: //')
# Takeover (issue #20's figure): the ingest left its events unconsumed (no worker ran). Once the
# nodes applied the backlog, node c is killed -9; a and b take its shards over when its etcd
# lease expires, rebuild each from the log (replaying what c's sessions had not consumed) and
# bind it. Measured: from the kill until both serve every shard, rebuilt and bound. (A shard
# with 10k sessions and 1M events: bench/cluster-takeover.sh.)
view() { curl -sf "http://127.0.0.1:$((base + $1))/v1/cluster" 2>/dev/null; }
applied_sum() { local t=0 v; for i in 0 1 2; do v=$(num "$(view $i)" applied); t=$((t + ${v:-0})); done; echo $t; }
last=-1
for _ in $(seq 120); do # until the applied count stands still for a second (at most 60 s)
  now=$(applied_sum)
  [ "$now" = "$last" ] && break
  last=$now
  sleep 0.5
done
ev0=0
for i in 0 1; do v=$(num "$(view $i)" events_total); ev0=$((ev0 + ${v:-0})); done
cpid=$(pgrep -f "cephalon-cluster\..*/c\.edn" | head -1)
t0=$(date +%s.%N)
kill -9 "$cpid" 2>/dev/null
took=""
for _ in $(seq 1200); do # at most 60 s
  ok=0
  for i in 0 1; do
    v=$(view $i) || continue
    [ "$(num "$v" shards_owned)" = "$(num "$v" shards_bound)" ] &&
      [ "$(num "$v" shards_unowned)" = 0 ] && [ "$(num "$v" in_progress)" = 0 ] && ok=$((ok + 1))
    [ $i = 0 ] && owned0=$(num "$v" shards_owned)
    [ $i = 1 ] && owned1=$(num "$v" shards_owned)
  done
  if [ "$ok" = 2 ] && [ $((owned0 + owned1)) = 256 ]; then
    took=$(echo "$(date +%s.%N) - $t0" | bc)
    break
  fi
  sleep 0.05
done
ev1=0
for i in 0 1; do v=$(num "$(view $i)" events_total); ev1=$((ev1 + ${v:-0})); done
ttl=5 # scripts/cluster.sh's nodes: :lease-ttl-seconds, the default
if [ -n "$took" ]; then
  awk -v t="$took" -v e="$((ev1 - ev0))" -v ttl="$ttl" 'BEGIN {
    r = t > ttl ? e / (t - ttl) : 0
    printf "cluster takeover_s=%.2f rebuilt_events=%d lease_ttl_s=%d rebuild_events_per_s=%.0f\n", t, e, ttl, r }'
else
  echo "cluster takeover_s=n/a (the survivors did not serve every shard within 60 s)"
fi
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
