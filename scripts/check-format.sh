#!/usr/bin/env bash
# Fails when a C++ file differs from the repository's .clang-format style.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cpp' '*.h')
clang-format --dry-run --Werror $files
echo "format: $(echo "$files" | wc -w) files clean"
