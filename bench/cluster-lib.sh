# bench/cluster-lib.sh — what the cluster benches share (sourced by cluster.sh, cluster-cycle.sh
# and cluster-takeover.sh): starting scripts/cluster.sh with the bench's policy and waiting until
# the three nodes serve.

# The nodes run with the budgets and backpressure of the one-node runs (bench/proc.c,
# cph_bench_policy): lanes that never bind, concurrency 64 per node, no backpressure step.
bench_cluster_start() { # BIN BASE_PORT LOG: scripts/cluster.sh in the background; sets cluster_pid
  CLUSTER_KEEP_GOING=1 CLUSTER_POLICY_EXTRA='
 :scheduler {:concurrency 64
             :lanes {:interactive {:turns 100000000 :tool-calls 100000000}
                     :operational {:turns 100000000 :tool-calls 100000000}}}
 :backpressure {:defaults {:max-step 0}}' \
    "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/cluster.sh" "$1" "$2" >"$3" 2>&1 &
  cluster_pid=$!
  # Stopped however the bench ends — its output cut short by a closed pipe too — so no cluster
  # is left for the next run to measure in place of its own.
  trap "bench_cluster_stop '$3'" EXIT
  trap "exit 1" INT TERM PIPE
}

bench_cluster_stop() { # LOG: stops what bench_cluster_start started, removes its log
  kill "$cluster_pid" 2>/dev/null
  wait "$cluster_pid" 2>/dev/null
  rm -f "$1"
}

# The number after "FIELD": in a JSON text (the first one), or nothing.
bench_cluster_num() { echo "$1" | grep -o "\"$2\": *[0-9.]*" | head -1 | grep -o '[0-9.]*$'; }

# BASE_PORT LOG WHO: waits up to 60 s until each of the three nodes serves, owns its shards with
# none unowned in its view, has its log ready and is bound to each shard it owns; else prints
# the cluster's output, stops it and exits 1 (WHO names the bench in the message).
bench_cluster_wait_ready() {
  local base=$1 log=$2 who=$3 ok v owned i
  for _ in $(seq 240); do
    if ! kill -0 "$cluster_pid" 2>/dev/null; then # it did not start (a port in use, say)
      echo "$who: the cluster did not start; its output:" >&2
      cat "$log" >&2
      exit 1
    fi
    ok=0
    for i in 0 1 2; do
      v=$(curl -sf "http://127.0.0.1:$((base + i))/v1/cluster" 2>/dev/null) || continue
      owned=$(bench_cluster_num "$v" shards_owned)
      if echo "$v" | grep -q '"state": *"serving"' && echo "$v" | grep -q '"shards_unowned": *0' &&
        echo "$v" | grep -q '"state": *"ready"' && [ -n "$owned" ] &&
        [ "$owned" = "$(bench_cluster_num "$v" shards_bound)" ]; then
        ok=$((ok + 1))
      fi
    done
    [ "$ok" = 3 ] && return 0
    sleep 0.25
  done
  echo "$who: the cluster was not ready in 60 s; its output:" >&2
  cat "$log" >&2
  bench_cluster_stop "$log"
  exit 1
}
