#!/usr/bin/env bash
# Runs README.md's walkthroughs against a fresh cephalond and checks the outputs the README
# shows, so a README that drifts from the daemon fails `make test` (issue 14).
#
# usage: run_walkthroughs.sh BIN_DIR [README]
#
# A runnable block is a ```sh block whose first line is `# walkthrough: NAME`. The blocks run in
# README order in one bash process (shell variables carry from block to block), in a temporary
# directory, against one daemon started fresh with the example policy — what a reader following
# the README after `make run` does. Only the address changes: `localhost:7070` and
# `127.0.0.1:7070` become the test's port (in commands and in shown outputs), `build/bin/` the
# BIN_DIR given, and CEPHALON_URL points cephalonctl at the daemon.
#
# Inside a block a run of command lines is one step; the `# ` comment lines right under it (no
# blank line between) are what it must print, `...` standing for any text. A one-line answer
# (every JSON body) may be wrapped over several comment lines: they are joined, each
# continuation's leading blanks dropped. A comment after a blank line (or before any command) is
# prose. Every step must exit 0, and a step that shows no output must print no API error.
set -u
export LC_ALL=C

die() {
  echo "run_walkthroughs: $*" >&2
  exit 1
}

[ $# -ge 1 ] || die "usage: run_walkthroughs.sh BIN_DIR [README]"
bin=$(cd "$1" && pwd) || die "no bin dir $1"
src=$(cd "$(dirname "$0")/../.." && pwd)
readme=${2:-$src/README.md}
[ -x "$bin/cephalond" ] || die "$bin/cephalond is missing: build first"
[ -r "$readme" ] || die "cannot read $readme"

# The tools the walkthroughs use. Missing is a failure, never a skip.
for pair in curl:curl jq:jq promtool:prometheus timeout:coreutils; do
  tool=${pair%%:*}
  command -v "$tool" >/dev/null 2>&1 ||
    die "$tool is missing (Debian package ${pair#*:}): run scripts/install-deps.sh"
done

STEP_TIMEOUT_S=25 # all the walkthroughs together; ctest's own timeout is longer

tmp=$(mktemp -d "${TMPDIR:-/tmp}/cph-readme.XXXXXX") || die "mktemp failed"
daemon=""
walker="" # `timeout` running the steps: a signal to it reaches its whole process group
cleanup() {
  local pid
  for pid in $walker $daemon; do
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# ---------------------------------------------------------------- parse the README

steps=0
declare -a st_block st_line st_cmd st_exp st_exp_line
nblocks=0
mode=out # out | opened (after ```sh) | run (a walkthrough) | other (any other fenced block)
prev=blank # in a walkthrough: blank | prose | cmd | out
block=""
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  case $mode in
  out)
    if [ "$line" = '```sh' ]; then mode=opened; elif [[ $line == '```'* ]]; then mode=other; fi
    ;;
  opened)
    if [[ $line =~ ^#\ walkthrough:\ *([^ ]+) ]]; then
      mode=run
      block=${BASH_REMATCH[1]}
      prev=blank
      nblocks=$((nblocks + 1))
    elif [[ $line == '```'* ]]; then
      mode=out
    else
      mode=other
    fi
    ;;
  other)
    [[ $line == '```'* ]] && mode=out
    ;;
  run)
    if [[ $line == '```'* ]]; then
      mode=out
    elif [[ $line =~ ^[[:space:]]*$ ]]; then
      prev=blank
    elif [[ $line =~ ^[[:space:]]*#\ ?(.*)$ ]]; then
      if [ "$prev" = cmd ] || [ "$prev" = out ]; then
        i=$((steps - 1))
        if [ "$prev" = cmd ]; then
          st_exp[i]=${BASH_REMATCH[1]}
          st_exp_line[i]=$lineno
        else
          st_exp[i]+=$'\n'${BASH_REMATCH[1]}
        fi
        prev=out
      else
        prev=prose
      fi
    elif [ "$prev" = cmd ]; then
      st_cmd[steps - 1]+=$'\n'$line
    else
      st_block[steps]=$block
      st_line[steps]=$lineno
      st_cmd[steps]=$line
      st_exp[steps]=""
      st_exp_line[steps]=""
      steps=$((steps + 1))
      prev=cmd
    fi
    ;;
  esac
done <"$readme"
[ "$mode" = out ] || die "$readme ends inside a fenced block"
[ "$nblocks" -gt 0 ] || die "no '# walkthrough: NAME' block in $readme"

# ---------------------------------------------------------------- start the daemon

mkdir -p "$tmp/cwd" "$tmp/out"
(cd "$tmp" && exec "$bin/cephalond" --policy "$src/cephalon.policy.edn.example" \
  --data "$tmp/data" --listen 127.0.0.1:0 2>"$tmp/daemon.log") &
daemon=$!
port=""
for _ in $(seq 200); do
  port=$(sed -n 's/.*msg="cephalond ready" listen=[^ ]*:\([0-9][0-9]*\).*/\1/p' "$tmp/daemon.log")
  [ -n "$port" ] && break
  kill -0 "$daemon" 2>/dev/null || die "cephalond exited before ready: $(cat "$tmp/daemon.log")"
  sleep 0.05
done
[ -n "$port" ] || die "cephalond not ready after 10 s: $(cat "$tmp/daemon.log")"
addr=127.0.0.1:$port

localize() { # the README's address -> the test's
  local s=${1//localhost:7070/$addr}
  printf '%s' "${s//127.0.0.1:7070/$addr}"
}

# ---------------------------------------------------------------- run every step

# One script, each step's output and exit status to its own files: a step that hangs is the
# one without a status file.
{
  for ((i = 0; i < steps; i++)); do
    cmd=$(localize "${st_cmd[i]}")
    printf '{\n%s\n} >"%s/out/%d" 2>&1\necho $? >"%s/out/%d.rc"\n' \
      "${cmd//build\/bin\//$bin/}" "$tmp" "$i" "$tmp" "$i"
  done
} >"$tmp/walkthroughs.sh"
started=$(date +%s)
# In the background, so that a signal to this script is handled at once (by `wait`).
(cd "$tmp/cwd" && CEPHALON_URL=http://$addr exec timeout -k 2 "$STEP_TIMEOUT_S" \
  bash --noprofile --norc "$tmp/walkthroughs.sh") </dev/null &
walker=$!
wait "$walker"
walker=""
elapsed=$(($(date +%s) - started))

# ---------------------------------------------------------------- compare

# matches TEXT PATTERN: PATTERN with each `...` standing for any text (leftmost matching of each
# literal piece is complete for such patterns). On a miss, sets `missing` to the first piece not
# found.
missing=""
matches() {
  local text=$1 pat=$2 seg
  if [[ $pat != *...* ]]; then
    missing=$pat
    [[ $text == "$pat" ]]
    return
  fi
  seg=${pat%%...*}
  pat=${pat#*...}
  missing=$seg
  [[ $text == "$seg"* ]] || return 1
  text=${text:${#seg}}
  while [[ $pat == *...* ]]; do
    seg=${pat%%...*}
    pat=${pat#*...}
    [ -z "$seg" ] && continue
    missing=$seg
    [[ $text == *"$seg"* ]] || return 1
    text=${text#*"$seg"}
  done
  missing=$pat
  [ "${#text}" -ge "${#pat}" ] && [[ $text == *"$pat" ]]
}

clip() { # at most 1,500 characters of $1
  if [ "${#1}" -gt 1500 ]; then printf '%s ...(%d more)' "${1:0:1500}" $((${#1} - 1500)); else printf '%s' "$1"; fi
}

failures=0
ran=0
where=$(basename "$readme")
for ((i = 0; i < steps; i++)); do
  at="$where:${st_line[i]} (walkthrough ${st_block[i]})"
  if [ ! -f "$tmp/out/$i.rc" ]; then
    echo "FAIL $at: did not finish within ${STEP_TIMEOUT_S} s (all walkthroughs together):" >&2
    echo "  ${st_cmd[i]//$'\n'/$'\n'  }" >&2
    failures=$((failures + 1))
    break
  fi
  ran=$((ran + 1))
  rc=$(cat "$tmp/out/$i.rc")
  # trailing blanks of each line and trailing newlines never count
  actual=$(sed 's/[[:space:]]*$//' "$tmp/out/$i")
  problem=""
  if [ "$rc" != 0 ]; then
    problem="exited $rc"
  elif [ -z "${st_exp[i]}" ]; then
    [[ $actual == *'"error":{'* ]] && problem="answered an error (and the README shows no output)"
  else
    expected=$(localize "${st_exp[i]}")
    if [[ $actual != *$'\n'* ]]; then # a one-line answer, wrapped in the README
      joined=""
      first=1
      while IFS= read -r l; do
        if [ $first = 1 ]; then joined=$l; first=0; else joined+=${l#"${l%%[![:space:]]*}"}; fi
      done <<<"$expected"
      expected=$joined
    fi
    expected=$(printf '%s\n' "$expected" | sed 's/[[:space:]]*$//')
    if ! matches "$actual" "$expected"; then
      problem="output differs from $where:${st_exp_line[i]}: no match for \"$(clip "$missing")\""
    fi
  fi
  if [ -n "$problem" ]; then
    failures=$((failures + 1))
    {
      echo "FAIL $at: $problem"
      echo "  command:"
      echo "    ${st_cmd[i]//$'\n'/$'\n'    }"
      if [ -n "${st_exp[i]}" ]; then
        echo "  README shows:"
        echo "    ${st_exp[i]//$'\n'/$'\n'    }"
      fi
      echo "  daemon answered:"
      a=$(clip "$actual")
      echo "    ${a//$'\n'/$'\n'    }"
    } >&2
  fi
done

if [ "$failures" -gt 0 ]; then
  echo "run_walkthroughs: $failures failed of $steps steps in $nblocks walkthroughs (README drifted from the daemon?)" >&2
  echo "--- cephalond log (last 20 lines)" >&2
  tail -n 20 "$tmp/daemon.log" >&2
  exit 1
fi
echo "run_walkthroughs: $steps steps in $nblocks walkthroughs of $where match the daemon (${elapsed} s)"
