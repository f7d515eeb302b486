#!/usr/bin/env bash
# Copies what an offline GPU machine lacks into .carry/ (git-ignored), to be copied there with the
# working tree: GoogleTest's sources from Debian's googletest package, and in .carry/wheels/ the
# wheels of bench/requirements-gpu-bench.txt (FlashAttention-3 for JAX) and of requirements-build.txt
# (the Python package's build backend, CMake and Ninja). Then run scripts/gpu_check.sh there (with
# --bench it installs the benchmark's wheels into .carry/site); an environment without the build
# backend gets it with `python3 -m pip install --no-index --find-links .carry/wheels -r requirements-build.txt`.
#
# Environment: GPU_PYTHON_VERSION (default 3.12, the GPU machine's Python), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
GPU_PYTHON_VERSION=${GPU_PYTHON_VERSION:-3.12}
[ -d /usr/src/googletest ] || { apt-get update -qq && apt-get install -y -qq googletest=1.12.1-0.2; }
rm -rf .carry/googletest && mkdir -p .carry && cp -r /usr/src/googletest .carry/googletest
# The wheels for the GPU machine's Python and platform, not this one's (flash-attn3-jax ships
# compiled kernels per CPython version).
rm -rf .carry/wheels && mkdir -p .carry/wheels
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$GPU_PYTHON_VERSION" --platform manylinux_2_28_x86_64 --implementation cp \
  -d .carry/wheels -r bench/requirements-gpu-bench.txt
# CMake's and Ninja's wheels are tagged manylinux2014 (manylinux_2_17), which a manylinux_2_28
# platform alone does not select.
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$GPU_PYTHON_VERSION" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
  --implementation cp -d .carry/wheels -r requirements-build.txt
ls .carry/wheels
echo "prepared .carry/ ($(du -sh .carry | cut -f1))"
