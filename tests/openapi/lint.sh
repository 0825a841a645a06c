#!/bin/sh
# test_openapi_lint: `redocly lint` (installed into DEST by tests/support/npm-install.sh) on DOC with
# tests/openapi/redocly.yaml (recommended-strict: any problem is an error). Exits non-zero,
# with the linter's report, on any problem. No network: telemetry and update checks are off.
set -eu
src=$(cd "$(dirname "$0")" && pwd)
dest=${1:?usage: lint.sh DEST DOC}
doc=${2:?usage: lint.sh DEST DOC}
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true NO_COLOR=1
exec "$dest/node_modules/.bin/redocly" lint --config "$src/redocly.yaml" "$doc"
