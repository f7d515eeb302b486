#!/usr/bin/env bash
# Runs the CPU test suite (GoogleTest + the Python oracle and CLI tests) through CTest, then prints
# pytest's own summary line ("N passed, M skipped in S s"), which CTest counts as one test.
# FLAMIA_INSTALL_TEST=1 adds the Python package's install into fresh venvs (needs PyPI; CI sets it).
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
