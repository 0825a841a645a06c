#!/bin/sh
# Installs what the console's browser test drives Chromium with (tests/ui/package.json:
# playwright-core, pinned by its package-lock.json) into DEST (the build dir's ui-test/), once:
# `npm ci` only when DEST/node_modules is missing or the lock changed. Test-time only;
# cephalond and its console never need Node. The browser is Debian's chromium
# (scripts/install-deps.sh); playwright-core downloads none (--ignore-scripts).
set -eu
src=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: install.sh DEST}
mkdir -p "$dest"
if [ -d "$dest/node_modules" ] && cmp -s "$src/package-lock.json" "$dest/package-lock.json"; then
  exit 0
fi
cp "$src/package.json" "$src/package-lock.json" "$dest/"
cd "$dest"
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
