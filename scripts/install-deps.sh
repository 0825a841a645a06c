#!/usr/bin/env bash
# Installs the Debian packages Cephalon builds and tests with — only the ones missing.
# Idempotent: a second run installs nothing and exits 0. Needs root (or sudo) only when
# something is actually missing. Extra package names given as arguments are installed too
# (e.g. `install-deps.sh valgrind` for make test-valgrind).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libevent-dev liblmdb-dev libmsgpack-dev libjansson-dev libssl-dev libcmocka-dev
)
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
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
