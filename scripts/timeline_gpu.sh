#!/usr/bin/env bash
# The forward tile loop's clock timeline on a GPU (sm_90a) machine: builds the C API library with
# the diagnostic FLAMIA_FORWARD_TIMELINE (src/cuda/sm90/step_timeline.cuh) into its own build
# directory, so the normal build is left alone, and runs bench/forward_timeline.py with it (no
# install: the Python package is taken from python/). Arguments go to forward_timeline.py:
#
#   bash scripts/timeline_gpu.sh [--workloads 4x16384,16x4096] [--turns auto|0|1] [--json out.json]
#
# ~40 s to build on an H200 machine, a few seconds per workload. Environment: PYTHON (default
# python3), JOBS (default 16), BUILD_DIR (default build-timeline).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-16}
BUILD_DIR=${BUILD_DIR:-build-timeline}
LOG="$BUILD_DIR/timeline_gpu.log"
mkdir -p "$BUILD_DIR"
echo "timeline_gpu: building $BUILD_DIR (log: $LOG) ..." >&2
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLAMIA_CUDA=ON -DFLAMIA_FORWARD_TIMELINE=ON \
  -DFLAMIA_BUILD_TESTS=OFF -DFLAMIA_BUILD_CLI=OFF > "$LOG" 2>&1 \
  && cmake --build "$BUILD_DIR" -j "$JOBS" --target flamia_capi >> "$LOG" 2>&1 \
  || { tail -20 "$LOG"; echo "timeline_gpu: build failed (log: $LOG)" >&2; exit 1; }
LIB="$(cd "$BUILD_DIR" && pwd)/libflamia_capi.so"  # BUILD_DIR may be relative or absolute
FLAMIA_CAPI_LIB="$LIB" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" bench/forward_timeline.py "$@"
