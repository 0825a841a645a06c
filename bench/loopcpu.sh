#!/usr/bin/env bash
# bench/loopcpu.sh — one cephalon-bench run with the daemon's CPU split by thread: prints the
# rate, the whole daemon's CPU µs and the event loop's (its main thread, from
# /proc/PID/task/PID/stat) per unit, measured over 3 s in the middle of a 5 s run.
#
#   bench/loopcpu.sh BIN_DIR cycle [none|always] [BENCH OPTIONS]   per turn completed
#   bench/loopcpu.sh BIN_DIR ingest [BENCH OPTIONS]                 per event ingested
#
# BENCH OPTIONS go to cephalon-bench as they are (e.g. --keep-turns 0, --window 256).
#
# BIN_DIR holds cephalon-bench and cephalond (a build's bin/). Alternate two builds round by
# round to compare them (bench/PROFILE.md, "The second core").
set -euo pipefail
bin=${1:?usage: bench/loopcpu.sh BIN_DIR cycle [none|always] | ingest}
mode=${2:?usage: bench/loopcpu.sh BIN_DIR cycle [none|always] | ingest}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
case $mode in
cycle)
  metric=cephalon_turns_completed_total rate=cycles_per_s
  CPH_BIN_DIR=$bin "$bin/cephalon-bench" cycle --seconds 5 --sync "${3:-none}" "${@:4}" >"$out" 2>&1 &
  ;;
ingest)
  metric=cephalon_events_total rate=events_per_s
  CPH_BIN_DIR=$bin "$bin/cephalon-bench" ingest --seconds 5 "${@:3}" >"$out" 2>&1 &
  ;;
*)
  echo "bench/loopcpu.sh: mode must be cycle or ingest" >&2
  exit 2
  ;;
esac
bench=$!
until pid=$(pgrep -P "$bench" cephalond); do sleep 0.05; done
port=
until [ -n "$port" ]; do
  port=$(ss -ltnpH | grep "pid=$pid," | awk '{print $4}' | sed 's/.*://' | head -1) || true
  sleep 0.05
done
# snap: process ticks, loop-thread ticks, units done so far
snap() {
  echo "$(awk '{print $14 + $15}' "/proc/$pid/stat") $(awk '{print $14 + $15}' "/proc/$pid/task/$pid/stat")" \
    "$(curl -s "127.0.0.1:$port/metrics" | awk -v m="$metric" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s}')"
}
sleep 1.5
read -r c0 l0 n0 < <(snap)
sleep 3
read -r c1 l1 n1 < <(snap)
wait "$bench"
tick_us=$((1000000 / $(getconf CLK_TCK)))
echo "$(grep -o "$rate=[0-9]*" "$out" | tail -1)" \
  "cpu_us=$(awk -v a="$c0" -v b="$c1" -v n="$((n1 - n0))" -v t="$tick_us" 'BEGIN {printf "%.2f", (b - a) * t / n}')" \
  "loop_us=$(awk -v a="$l0" -v b="$l1" -v n="$((n1 - n0))" -v t="$tick_us" 'BEGIN {printf "%.2f", (b - a) * t / n}')" \
  "load=$(cut -d' ' -f1 /proc/loadavg)"
