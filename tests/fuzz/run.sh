#!/usr/bin/env bash
# Runs every libFuzzer target built in BUILD/fuzz/ on its corpus for SECONDS each, JOBS at a
# time (each fuzzer is one process, so one core each).
#
#   tests/fuzz/run.sh BUILD SECONDS JOBS smoke|keep
#
# smoke  each fuzzer starts from a fresh copy of its seed corpus (tests/fuzz/corpus/NAME) in a
#        temp dir that is removed afterwards: what `make test` runs.
# keep   the work corpus is BUILD/fuzz-work/NAME: the seeds are copied in, and what the fuzzer
#        finds stays there for the next run (`make fuzz`). The repo's corpus is never written;
#        merge an input into it by hand, deliberately (see tests/fuzz/README.md).
#
# A crash, leak, UB report, out-of-memory or an input slower than 10 s fails the run: the
# input is saved as BUILD/fuzz-artifacts/NAME/crash-* (or leak-*, timeout-*, oom-*), the
# report is BUILD/fuzz-logs/NAME.log, and the script exits 1 after the others finish.
set -uo pipefail

if [ $# -ne 4 ] || { [ "$4" != smoke ] && [ "$4" != keep ]; }; then
  echo "usage: $0 BUILD SECONDS JOBS smoke|keep" >&2
  exit 2
fi
build=$1 seconds=$2 jobs=$3 mode=$4
src=$(cd "$(dirname "$0")" && pwd)
bin="$build/fuzz"
fuzzers=(fuzz_edn fuzz_policy fuzz_records fuzz_selector fuzz_api_json fuzz_msgpack_body fuzz_state)

mkdir -p "$build/fuzz-logs" "$build/fuzz-artifacts" "$build/fuzz-tmp"
build=$(cd "$build" && pwd)
scratch=""
if [ "$mode" = smoke ]; then
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/cph-fuzz-smoke.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
fi

# One fuzzer; its exit status is libFuzzer's (0 = no finding).
run_one() {
  local name=$1 work extra=()
  # Request bodies may be 16 KiB and strings 6000 bytes (fuzz_api_json.c): let inputs grow so.
  [ "$name" = fuzz_api_json ] && extra=(-max_len=20000)
  [ -f "$src/$name.dict" ] && extra+=(-dict="$src/$name.dict")
  if [ "$mode" = smoke ]; then work="$scratch/$name"; else work="$build/fuzz-work/$name"; fi
  mkdir -p "$work" "$build/fuzz-artifacts/$name"
  cp -p "$src/corpus/$name/"* "$work/"
  # fuzz_api_json and fuzz_state keep their LMDB directories under TMPDIR: inside the build dir, so a crash
  # that skips the cleanup leaves nothing in /tmp.
  TMPDIR="$build/fuzz-tmp" \
    "$bin/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    "${extra[@]}" -artifact_prefix="$build/fuzz-artifacts/$name/" "$work" \
    >"$build/fuzz-logs/$name.log" 2>&1
}

declare -A pid_of=()
failed=()
status=0
start=$SECONDS
for name in "${fuzzers[@]}"; do
  if [ ! -x "$bin/$name" ]; then
    echo "fuzz: $bin/$name is missing (build with: make build-fuzz)" >&2
    exit 1
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_one "$name" &
  pid_of[$name]=$!
done

for name in "${fuzzers[@]}"; do
  if wait "${pid_of[$name]}"; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz-logs/$name.log")
    cov=$(grep -o 'cov: [0-9]*' "$build/fuzz-logs/$name.log" | tail -n 1)
    echo "fuzz: $name ok: ${runs:-?} runs in ${seconds}s, ${cov:-cov: ?}"
  else
    status=1
    failed+=("$name")
    echo "fuzz: $name FAILED; report: $build/fuzz-logs/$name.log" >&2
    grep -E 'ERROR: |SUMMARY: |^fuzz_|Test unit written to' "$build/fuzz-logs/$name.log" |
      head -n 12 >&2
  fi
done
summary="fuzz: ${#fuzzers[@]} fuzzers, ${seconds}s each, $((SECONDS - start))s in all"
echo "$summary${failed:+; failed: ${failed[*]}}"
exit $status
