#!/usr/bin/env bash
# Runs the CPU test suite (GoogleTest + the Python oracle and CLI tests) through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j"$(nproc)" -L cpu "$@"
