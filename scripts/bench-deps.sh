#!/usr/bin/env bash
# Installs what `make bench` needs besides the build: the anchors it is measured against
# (beanstalkd, redis-server), gnuplot for the plots and bc for bench/cluster.sh's sums — only
# the packages that are missing, through install-deps.sh (idempotent; no service left running:
# the bench starts its own servers on free loopback ports with temp dirs and stops them).
set -euo pipefail
exec "$(dirname "$0")/install-deps.sh" beanstalkd redis-server gnuplot-nox bc
