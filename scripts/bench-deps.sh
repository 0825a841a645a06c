#!/usr/bin/env bash
# Installs what `make bench` needs besides the build: the anchors it is measured against
# (beanstalkd, redis-server) and gnuplot for the plots — only the packages that are missing.
# Idempotent: a second run installs nothing and exits 0.
#
# Contract: leaves no service running. Debian's postinst scripts start their daemons through
# invoke-rc.d; while installing, /usr/sbin/policy-rc.d answers 101 ("action forbidden") so
# none starts. An existing policy-rc.d is put back exactly as it was afterwards. The bench
# starts its own servers on free loopback ports with temp dirs and stops them.
set -euo pipefail

packages=(beanstalkd redis-server gnuplot-nox)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "bench-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "bench-deps: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  fi
fi

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
printf '#!/bin/sh\n# bench-deps.sh: no service starts while the bench installs its anchors\nexit 101\n' |
  $sudo tee "$policy" >/dev/null
$sudo chmod 755 "$policy"

export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Belt and braces: where a service manager ignored policy-rc.d, stop what the install started
# (by the pid files the packages use, never by process name).
for pidfile in /run/redis/redis-server.pid /run/beanstalkd.pid; do
  if [ -s "$pidfile" ]; then
    pid=$(cat "$pidfile")
    if [ -n "$pid" ] && $sudo kill -0 "$pid" 2>/dev/null; then
      echo "bench-deps: stopping the service the install started (pid $pid)" >&2
      $sudo kill "$pid" || true
    fi
  fi
done
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  $sudo systemctl disable --now redis-server.service beanstalkd.service >/dev/null 2>&1 || true
fi
