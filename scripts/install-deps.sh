#!/usr/bin/env bash
# Installs the Debian packages Cephalon builds and tests with — only the ones missing.
# Idempotent: a second run installs nothing and exits 0. Needs root (or sudo) only when
# something is actually missing. Extra package names given as arguments are installed too
# (e.g. `install-deps.sh valgrind` for make test-valgrind).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libevent-dev liblmdb-dev libmsgpack-dev libjansson-dev libssl-dev libcmocka-dev
  libcurl4-openssl-dev # outgoing HTTP: the providers, cephalonctl and cephalon-worker
  nodejs # tests only: the worker's tests install an MCP server from npm (tests/mcp)
  clang libclang-rt-14-dev
  prometheus # promtool checks the /metrics scrape; the server scrapes cephalond in a test
  curl jq # the README's walkthroughs use both; tests/readme runs them
  chromium # tests only: the web console's browser test (tests/ui) drives it headless
  etcd-server # cluster mode (DESIGN §14): test_cluster and make cluster start their own etcd
  nats-server libnats-dev # cluster mode's replicated log (NATS JetStream) and its C client
  zlib1g-dev # cluster mode: the session states put into the log are deflated (server/statezip.c)
)
# npm: Debian's package, unless a Node.js build that bundles its own npm is there already (a
# nodejs package from another archive conflicts with Debian's npm).
if ! command -v npm >/dev/null 2>&1; then
  packages+=(npm)
fi
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "install-deps: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  fi
fi

# No service starts: Debian's postinst scripts start their daemons (prometheus) through
# invoke-rc.d / deb-systemd-invoke, and while installing /usr/sbin/policy-rc.d answers 101
# ("action forbidden"). The tests start their own servers on free loopback ports. An existing
# policy-rc.d is put back exactly as it was afterwards.
policy=/usr/sbin/policy-rc.d
backup=""
if [ -e "$policy" ]; then
  backup=$($sudo mktemp /tmp/policy-rc.d.XXXXXX)
  $sudo cp -p "$policy" "$backup"
fi
restore_policy() {
  if [ -n "$backup" ]; then
    $sudo cp -p "$backup" "$policy"
    $sudo rm -f "$backup"
  else
    $sudo rm -f "$policy"
  fi
}
trap restore_policy EXIT
printf '#!/bin/sh\n# install-deps.sh: no service starts while Cephalon installs its packages\nexit 101\n' |
  $sudo tee "$policy" >/dev/null
$sudo chmod 755 "$policy"

export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Packages that bring a daemon, and its unit and pid file: only those installed by this run are
# stopped and disabled below (a service the machine already had is left alone).
service_of() {
  case "$1" in
  prometheus) echo "prometheus.service /run/prometheus.pid" ;;
  redis-server) echo "redis-server.service /run/redis/redis-server.pid" ;;
  beanstalkd) echo "beanstalkd.service /run/beanstalkd.pid" ;;
  nats-server) echo "nats-server.service /run/nats-server.pid" ;;
  esac
}
for p in "${missing[@]}"; do
  svc=$(service_of "$p")
  [ -n "$svc" ] || continue
  unit=${svc% *}
  pidfile=${svc#* }
  # Belt and braces: where a service manager ignored policy-rc.d, stop what the install
  # started (by the pid file the package uses, never by process name).
  if [ -s "$pidfile" ]; then
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && $sudo kill -0 "$pid" 2>/dev/null; then
      echo "install-deps: stopping the $p service the install started (pid $pid)" >&2
      $sudo kill "$pid" || true
    fi
  fi
  # Where systemd runs, the package also enabled its unit for the next boot: undo that.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now "$unit" >/dev/null 2>&1 || true
  fi
done
