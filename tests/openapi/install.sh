#!/bin/sh
# Installs the OpenAPI linter (tests/openapi/package.json: @redocly/cli, pinned by its
# package-lock.json) into DEST (the build dir's openapi/), once: `npm ci` only when
# DEST/node_modules is missing or the lock changed. Test-time only; cephalond never needs Node.
# @redocly/cli 2.x is one bundled package (no dependencies) and needs Node.js >= 20.19 (it
# prints a notice that its next releases need 22.12; the lint is unaffected).
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
