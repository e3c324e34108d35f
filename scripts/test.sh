#!/usr/bin/env bash
# Sets up (Debian packages, the virtualenv with torch and the test oracles, the build of Loom, its
# tests and benchmarks) and runs every Loom test: formatting, unit tests and the end-to-end tests of
# the loom binary, through CTest. Prints each phase's time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/setup.sh --tests --oracles
t1=$(date +%s)
bash scripts/check-format.sh
t2=$(date +%s)
status=0
ctest --test-dir build --output-on-failure || status=$?
t3=$(date +%s)
echo "loom tests: setup and build $((t1 - t0)) s, format $((t2 - t1)) s, ctest $((t3 - t2)) s, total $((t3 - t0)) s"
exit "$status"
