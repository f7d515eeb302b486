#!/usr/bin/env bash
# Installs what flamia needs (pinned), builds it, and runs the main job: the isolation probe
# (on the CPU emulation; the GPU kernels are compiled for sm_90a when nvcc is present).
# FLAMIA_CUDA=OFF builds for the CPU only (no CUDA kernels, no C API shared library), even where
# nvcc is installed; ON requires nvcc; AUTO (the default) uses it when found.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
# GoogleTest is pinned to the version Debian 12 ships.
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev=1.12.1-0.2 googletest=1.12.1-0.2)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

PYTHON=${PYTHON:-$(command -v python3)}
echo "setup: installing pinned test dependencies into $PYTHON"
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements-test.txt

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PYTHON" \
  -DFLAMIA_CUDA="${FLAMIA_CUDA:-AUTO}"
cmake --build build -j"$(nproc)"

echo "setup: running the main job (flamia probe)"
./build/flamia probe
