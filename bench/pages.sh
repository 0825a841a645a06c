#!/usr/bin/env bash
# bench/pages.sh — what the store writes per turn cycle: one `cephalon-bench cycle` run against
# BIN_DIR's cephalond with bench/pageshim.c preloaded, then the 4 KiB pages written per cycle
# (pwrite64 and writev to the data file: every page a commit writes) and the puts, deletes and
# value bytes per database per cycle. Whole runs, setup included (a few hundred puts).
#
#   bench/pages.sh BIN_DIR [cephalon-bench cycle options, e.g. --clients 1 --sync always]
#
# Alternate two builds run by run to compare them (bench/PROFILE.md, "Pages a cycle writes").
set -euo pipefail
bin=${1:?usage: bench/pages.sh BIN_DIR [cycle options]}
shift
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -shared -fPIC -o "$work/pageshim.so" "$here/pageshim.c" -ldl -llmdb
printf '#!/bin/sh\nCPH_PAGESHIM_OUT=%s/counts LD_PRELOAD=%s/pageshim.so exec %s/cephalond "$@"\n' \
  "$work" "$work" "$(cd "$bin" && pwd)" >"$work/cephalond"
chmod +x "$work/cephalond"
CPH_BIN_DIR=$work "$bin/cephalon-bench" cycle --seconds 5 "$@" >"$work/bench.txt" 2>&1
grep -o 'cycles_per_s=[0-9]*\|passes_per_cycle=[0-9.]*\|fsyncs_per_cycle=[0-9.]*' "$work/bench.txt" |
  tr '\n' ' '
turns=$(grep -o 'lease answers *[0-9]*' "$work/bench.txt" | grep -o '[0-9]*$')
awk -v t="$turns" '
  $1 == "store_bytes" { printf "pages_per_cycle=%.1f commits_per_cycle=%.2f\n", $2 / 4096 / t, $8 / t }
  $1 == "db" { printf "  %-16s puts %6.2f  dels %6.2f  bytes %8.0f\n", $2, $4 / t, $6 / t, $8 / t }
' "$work/counts"
