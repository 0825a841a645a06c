#!/usr/bin/env bash
# `make cluster`: etcd, three NATS JetStream servers and three cephalond with :cluster on
# loopback ports, for trying cluster mode (DESIGN §14: see README "Running a cluster" for what
# is built). Prints the URLs; Ctrl-C stops everything. State lives in a fresh temp dir, removed
# at the end.
#   scripts/cluster.sh BIN_DIR [BASE_PORT]   (daemons on BASE_PORT..+2, etcd on BASE_PORT+10/11,
#                                             NATS clients on BASE_PORT+20..22, routes +30..32)
# CLUSTER_POLICY_EXTRA, when set, is added to every node's policy map as it is (EDN members
# other than :server and :cluster, e.g. the budgets bench/cluster.sh runs with).
# CLUSTER_KEEP_GOING, when set, keeps the rest running when a process exits (else all stop).
set -euo pipefail
bin=${1:?usage: cluster.sh BIN_DIR [BASE_PORT]}
base=${2:-7700}
command -v etcd >/dev/null || { echo "cluster: etcd is missing: apt-get install etcd-server (scripts/install-deps.sh)" >&2; exit 1; }
command -v nats-server >/dev/null || { echo "cluster: nats-server is missing: apt-get install nats-server (scripts/install-deps.sh)" >&2; exit 1; }
# A port something already listens on (another cluster left running, say) would leave a
# process of this one unstarted while the old one answered in its place: refuse instead.
for p in $base $((base + 1)) $((base + 2)) $((base + 10)) $((base + 11)) $((base + 20)) \
  $((base + 21)) $((base + 22)) $((base + 30)) $((base + 31)) $((base + 32)); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "cluster: 127.0.0.1:$p is in use (another cluster on base port $base still running?)" >&2
    exit 1
  fi
done
dir=$(mktemp -d /tmp/cephalon-cluster.XXXXXX)
pids=()
stop() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
  echo "cluster: stopped"
}
trap stop INT TERM EXIT
ec=$((base + 10)); ep=$((base + 11))
etcd --name c --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$ec" \
  --advertise-client-urls "http://127.0.0.1:$ec" --listen-peer-urls "http://127.0.0.1:$ep" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ep" --initial-cluster "c=http://127.0.0.1:$ep" \
  >"$dir/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$ec/health" >/dev/null && break; sleep 0.1; done
# Three NATS servers with JetStream, routed into one cluster (the log: 3 replicas, quorum 2).
nats_urls=""
for i in 0 1 2; do
  routes=""
  for j in 0 1 2; do
    [ "$j" = "$i" ] || routes="$routes${routes:+,}nats://127.0.0.1:$((base + 30 + j))"
  done
  nats-server -a 127.0.0.1 -p $((base + 20 + i)) -n "nats$i" -js -sd "$dir/nats$i" \
    --cluster_name cephalon --cluster "nats://127.0.0.1:$((base + 30 + i))" --routes "$routes" \
    >"$dir/nats$i.log" 2>&1 &
  pids+=($!)
  nats_urls="$nats_urls \"nats://127.0.0.1:$((base + 20 + i))\""
done
for i in 0 1 2; do
  n=$(printf "\\x$(printf %x $((97 + i)))")
  port=$((base + i))
  cat >"$dir/$n.edn" <<EON
{:server {:listen "127.0.0.1:$port" :data-dir "$dir/data-$n"}
 :cluster {:node "$n" :advertise "http://127.0.0.1:$port" :etcd ["http://127.0.0.1:$ec"]
           :nats [${nats_urls# }] :replicas 3}
 ${CLUSTER_POLICY_EXTRA:-}}
EON
  "$bin/cephalond" --policy "$dir/$n.edn" >"$dir/$n.log" 2>&1 &
  pids+=($!)
done
sleep 2
echo "etcd      http://127.0.0.1:$ec"
echo "nats      nats://127.0.0.1:$((base + 20)) .. $((base + 22))   (JetStream, 3 replicas)"
for i in 0 1 2; do echo "node $(printf "\\x$(printf %x $((97 + i)))")    http://127.0.0.1:$((base + i))   (logs: $dir)"; done
echo "try: curl -s http://127.0.0.1:$base/v1/cluster | jq .   — Ctrl-C stops all"
if [ -n "${CLUSTER_KEEP_GOING:-}" ]; then # a node killed on purpose (bench/cluster.sh's takeover)
  wait || true
else
  wait -n "${pids[@]}" || true
  echo "cluster: a process exited; stopping the rest" >&2
fi
