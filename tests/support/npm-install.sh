#!/bin/sh
# Installs the pinned npm packages a test needs — SRC/package.json, pinned by
# SRC/package-lock.json — into DEST (a folder of the build dir), once: `npm ci` only when
# DEST/node_modules is missing or the lock changed. Test-time only: cephalond never needs
# Node. Install scripts are not run (--ignore-scripts: nothing is downloaded besides the
# packages; the browser test uses Debian's chromium).
#
#   tests/support/npm-install.sh SRC DEST
#
# Used by the ctest fixtures mcp_install (tests/mcp: the MCP filesystem server),
# openapi_install (tests/openapi: @redocly/cli, one bundled package needing Node >= 20.19) and
# ui_install (tests/ui: playwright-core).
set -eu
src=$(cd "${1:?usage: npm-install.sh SRC DEST}" && pwd)
dest=${2:?usage: npm-install.sh SRC DEST}
mkdir -p "$dest"
if [ -d "$dest/node_modules" ] && cmp -s "$src/package-lock.json" "$dest/package-lock.json"; then
  exit 0
fi
cp "$src/package.json" "$src/package-lock.json" "$dest/"
cd "$dest"
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
