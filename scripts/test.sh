#!/usr/bin/env bash
# Sets up (Debian packages, build) and runs every Loom test: formatting, unit tests and the
# end-to-end tests of the loom binary, through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/check-format.sh
ctest --test-dir build --output-on-failure
