#!/usr/bin/env bash
# Runs the CPU test suite (GoogleTest + the Python oracle and CLI tests) through CTest, then prints
# pytest's own summary line (e.g. "91 passed, 3 skipped"), which CTest counts as one test.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
ctest --test-dir build --output-on-failure -j"$(nproc)" -L cpu "$@" || status=$?
log=build/Testing/Temporary/LastTest.log
if [ -f "$log" ]; then
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|errors|skipped)\b.* in [0-9.]+s' "$log" || true)
  [ -n "$summary" ] && echo "pytest (python_tests): $summary"
fi
exit "$status"
