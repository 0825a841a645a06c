#!/usr/bin/env bash
# The layering check's own test (ctest: test_layering_selftest): it must pass on the tree as it
# is and fail, naming the rule, on each kind of break it exists to catch. Each case copies the
# sources to a temp dir, breaks one thing and runs scripts/check-layering.sh on the copy.
#
#   tests/layering/selftest.sh SRC_DIR
set -euo pipefail
src=$(cd "${1:?usage: $0 SRC_DIR}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cph-layering.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0

fresh() {
  rm -rf "$work/tree"
  mkdir -p "$work/tree"
  (cd "$src" && tar cf - --exclude='./build*' --exclude='*/node_modules' --exclude=./.git \
    common store policy lanes providers core include server cli bench worker tests scripts) |
    (cd "$work/tree" && tar xf -)
}

# expect_fail NAME PATTERN: the check on the (broken) copy exits 1 and says PATTERN.
expect_fail() {
  local out rc=0
  out=$(bash "$work/tree/scripts/check-layering.sh" "$work/tree" 2>&1) || rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q -- "$2" <<<"$out"; then
    echo "FAIL $1: expected exit 1 and \"$2\"; got exit $rc:"
    echo "$out" | head -5
    failures=$((failures + 1))
  else
    echo "ok   $1"
  fi
}

fresh
if out=$(bash "$work/tree/scripts/check-layering.sh" "$work/tree" 2>&1); then
  echo "ok   the tree as it is passes"
else
  echo "FAIL the tree as it is: $out"
  failures=$((failures + 1))
fi

# Rule b: a core file reaching into another module's private state.
fresh
echo '#include "dedupe_internal.h"' >>"$work/tree/core/top.c"
expect_fail "another module's private header" "private to the files of its module"

# Rule c: a circle between core files (sessions is below turns; make it call up).
fresh
echo '#include "turns.h"' >>"$work/tree/core/sessions.c"
expect_fail "a circle in core" "a circle in core: core/turns.c -> core/sessions.c -> core/turns.c"

# Rule a: a module above reaching below the public API.
fresh
echo '#include "core/sessions.h"' >>"$work/tree/server/server.c"
expect_fail "server including a core header" "rule a: module order"

# Rule a: a lower module including one above it.
fresh
echo '#include "core/env.h"' >>"$work/tree/store/store.h"
expect_fail "store including core" "which is above it"

# The allowlist only shrinks: an exception nobody needs fails.
fresh
sed -i 's|^\[exceptions\]$|[exceptions]\ncli/main.c -> core/env.h  # not needed|' "$work/tree/scripts/layering-allow.txt"
expect_fail "an unneeded exception" "is no longer needed"

[ "$failures" -eq 0 ] || { echo "layering selftest: $failures case(s) failed"; exit 1; }
echo "layering selftest: all cases behave"
