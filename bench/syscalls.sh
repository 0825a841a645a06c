#!/usr/bin/env bash
# bench/syscalls.sh — the event loop's system calls per completed turn in a cephalon-bench cycle:
# `perf stat` of the daemon's main thread over 3 s in the middle of a 9 s run, divided by the
# turns completed in the same 3 s (cephalon_turns_completed_total from /metrics).
#
#   bench/syscalls.sh BIN_DIR [none|always] [BENCH OPTIONS]
#
# BIN_DIR holds cephalon-bench and cephalond (a build's bin/); needs perf with the syscalls
# tracepoints (root). Alternate two builds run by run to compare them (bench/PROFILE.md,
# "Answers written when they are ready").
set -euo pipefail
bin=${1:?usage: bench/syscalls.sh BIN_DIR [none|always] [BENCH OPTIONS]}
sync=${2:-none}
out=$(mktemp) counts=$(mktemp)
trap 'rm -f "$out" "$counts"' EXIT
CPH_BIN_DIR=$bin "$bin/cephalon-bench" cycle --seconds 9 --sync "$sync" "${@:3}" >"$out" 2>&1 &
bench=$!
until pid=$(pgrep -P "$bench" cephalond); do sleep 0.05; done
sleep 3
port=$(ss -ltnpH | grep "pid=$pid," | awk '{print $4}' | sed 's/.*://' | head -1)
turns() {
  curl -s "127.0.0.1:$port/metrics" | awk '/^cephalon_turns_completed_total/ {s += $2} END {print s}'
}
t0=$(turns)
perf stat -x, -o "$counts" -t "$pid" -e 'syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_writev,syscalls:sys_enter_readv,syscalls:sys_enter_ioctl,syscalls:sys_enter_pwrite64' -- sleep 3
t1=$(turns)
wait "$bench"
awk -F, -v n=$((t1 - t0)) '/syscalls/ { sub("syscalls:sys_enter_", "", $3); printf "%s=%.2f ", $3, $1 / n }
  END { printf "turns=%d\n", n }' "$counts"
tail -1 "$out"
