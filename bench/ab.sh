#!/usr/bin/env bash
# bench/ab.sh — before/after: runs the same cephalon-bench scenarios with two builds, alternated
# round by round so that a change in the machine's load falls on both, and prints each
# scenario's summary line under its build and round with the load average at the time.
#
#   bench/ab.sh BIN_DIR_A BIN_DIR_B [ROUNDS]     (each a build's bin/: cephalon-bench, cephalond)
#
# Example (the tables in the session notes): a worktree of the old commit built with
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build-bench \
#     --target cephalon-bench cephalond
# then  bench/ab.sh /path/old/build-bench/bin build-bench/bin 2
set -uo pipefail
a=${1:?usage: bench/ab.sh BIN_DIR_A BIN_DIR_B [ROUNDS]}
b=${2:?usage: bench/ab.sh BIN_DIR_A BIN_DIR_B [ROUNDS]}
rounds=${3:-2}
scenarios=(
  "sched --sessions 100000"
  "ingest --seconds 5"
  "cycle --seconds 5 --sync none"
  "cycle --seconds 5 --sync always"
)
for ((r = 1; r <= rounds; r++)); do
  for bin in "$a" "$b"; do
    for s in "${scenarios[@]}"; do
      # shellcheck disable=SC2086
      line=$(CPH_BIN_DIR=$bin "$bin/cephalon-bench" $s 2>&1 | tail -1)
      echo "$bin round $r load $(cut -d' ' -f1 /proc/loadavg): $line"
    done
  done
done
