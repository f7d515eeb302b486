#!/usr/bin/env bash
# The one command for a GPU (sm_90) machine: build with CUDA, run the GPU C++ tests, install the
# Python package offline, run the PyTorch op and transformers tests, and (with --bench) the GPU
# numerics table and the forward and training-call benchmarks; with --sanitize, compute-sanitizer's
# memcheck, racecheck and synccheck over a small subset of the GPU tests.
#
#   scripts/gpu_check.sh [--bench] [--sanitize] [--no-tests] [--no-install] [--bench-args "--rounds 10 --workloads 16x4096"]
#
# The tests take ~5 minutes on an H200 (build; `ctest -L gpu -j8`, ~90 s, most of it the CPU
# emulation the GPU results are compared with; pip install; pytest) and the benchmarks ~8 (each
# round times 4 calls): where a job is limited to 10 minutes, run the tests in one job and
# `--bench --no-tests` (build, install, benchmarks only) in the next. --no-install uses the
# flamia package already installed (for example while another job on the machine imports it).
# `--sanitize --no-tests` (a job of its own) builds and runs only the sanitizers, without the Python
# package: scripts/gpu_sanitize.sh says what runs and how a report is judged.
#
# Every step runs even when an earlier one failed (except where it needs the earlier one's
# output); the exit status is nonzero when any step failed. Benchmark results go to $OUT when it
# is set, else bench-results/. Environment: PYTHON (default python3), JOBS (default 16),
# CTEST_JOBS (default 8), BUILD_DIR (default build-gpu). Sanitizer logs go to $OUT/sanitize when OUT
# is set, else $BUILD_DIR/sanitize.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-16}
CTEST_JOBS=${CTEST_JOBS:-8}  # GPU tests side by side on one GPU: ~90 s on an H200 (serially ~12 min)
BUILD_DIR=${BUILD_DIR:-build-gpu}
RUN_BENCH=0
RUN_TESTS=1
RUN_INSTALL=1
RUN_SANITIZE=0
BENCH_ARGS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bench) RUN_BENCH=1 ;;
    --no-tests) RUN_TESTS=0 ;;
    --no-install) RUN_INSTALL=0 ;;
    --sanitize) RUN_SANITIZE=1 ;;
    --bench-args) shift; BENCH_ARGS=${1:-} ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

declare -a STEP_NAMES=()
declare -a STEP_CODES=()
declare -a STEP_SECONDS=()

# run_step NAME COMMAND...: runs the command, records its exit code and duration.
run_step() {
  local name=$1
  shift
  echo
  echo "==== gpu_check: $name"
  echo "---- $*"
  local start=$SECONDS
  "$@"
  local code=$?
  STEP_NAMES+=("$name")
  STEP_CODES+=("$code")
  STEP_SECONDS+=("$((SECONDS - start))")
  if [ "$code" -ne 0 ]; then
    echo "==== gpu_check: $name FAILED (exit $code)"
  fi
  return "$code"
}

skip_step() {
  STEP_NAMES+=("$1")
  STEP_CODES+=("skipped")
  STEP_SECONDS+=("0")
  echo
  echo "==== gpu_check: $1 skipped: $2"
}

echo "gpu_check: $(date -Iseconds) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
command -v nvcc >/dev/null && nvcc --version | tail -1
"$PYTHON" -c 'import sys; print("python", sys.version.split()[0])'

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)

# The GPU machine is offline and may lack GoogleTest: build it from a carried copy of Debian's
# sources when one is there (scripts/prepare_gpu_carry.sh puts it in .carry/).
GTEST_ARGS=()
[ -d .carry/googletest ] && GTEST_ARGS=(-DFLAMIA_GTEST_SOURCE_DIR="$PWD/.carry/googletest")

configure_ok=0
run_step "configure" cmake -S . -B "$BUILD_DIR" ${GENERATOR[@]+"${GENERATOR[@]}"} -DCMAKE_BUILD_TYPE=Release -DFLAMIA_CUDA=ON \
  -DPython3_EXECUTABLE="$(command -v "$PYTHON")" ${GTEST_ARGS[@]+"${GTEST_ARGS[@]}"} && configure_ok=1

build_ok=0
if [ "$configure_ok" -eq 1 ]; then
  run_step "build" cmake --build "$BUILD_DIR" -j"$JOBS" && build_ok=1
else
  skip_step "build" "configure failed"
fi

if [ "$RUN_TESTS" -eq 0 ]; then
  echo "gpu_check: --no-tests: skipping ctest -L gpu and pytest"
elif [ "$build_ok" -eq 1 ]; then
  run_step "ctest -L gpu" ctest --test-dir "$BUILD_DIR" -L gpu -j"$CTEST_JOBS" --output-on-failure
else
  skip_step "ctest -L gpu" "build failed"
fi

# The package builds its own copy of the library (scikit-build-core, Release, no tests, no CLI).
install_ok=0
if [ "$RUN_TESTS" -eq 0 ] && [ "$RUN_BENCH" -eq 0 ]; then
  echo "gpu_check: neither tests nor benchmarks: no Python package needed"
elif [ "$RUN_INSTALL" -eq 1 ]; then
  # Without pip's build isolation the build backend must be in the environment: where it is not,
  # the pinned one (requirements-build.txt) from the wheels scripts/prepare_gpu_carry.sh carried.
  build_requirements_ok=1
  if ! "$PYTHON" -c 'import scikit_build_core' 2>/dev/null; then
    run_step "build requirements" "$PYTHON" -m pip install -q --disable-pip-version-check --no-index \
      --find-links .carry/wheels -r requirements-build.txt || build_requirements_ok=0
  fi
  if [ "$build_requirements_ok" -eq 1 ]; then
    run_step "pip install" "$PYTHON" -m pip install --no-build-isolation --no-deps -q . && install_ok=1
  else
    skip_step "pip install" "no build backend (scikit-build-core; scripts/prepare_gpu_carry.sh carries it)"
  fi
elif "$PYTHON" -c 'import flamia' 2>/dev/null; then
  echo "gpu_check: --no-install: using the installed flamia package"
  install_ok=1
else
  skip_step "pip install" "--no-install, and no flamia package is installed"
fi

if [ "$RUN_TESTS" -eq 0 ]; then
  :
elif [ "$install_ok" -eq 1 ]; then
  # From the repo root, `import flamia` finds the installed package (python/ is not on the path).
  run_step "pytest (torch op, transformers)" "$PYTHON" -m pytest -q -rs tests/python/test_torch_op.py tests/python/test_torch_offsets.py \
    tests/python/test_hf_integration.py tests/python/test_leak_attention.py
else
  skip_step "pytest (torch op, transformers)" "pip install failed"
fi

if [ "$RUN_SANITIZE" -eq 1 ]; then
  if [ "$build_ok" -eq 1 ]; then
    # One step per tool and subset (scripts/gpu_sanitize.sh --list names them).
    while IFS= read -r run; do
      run_step "sanitize $run" env PYTHON="$PYTHON" bash scripts/gpu_sanitize.sh --build-dir "$BUILD_DIR" \
        --logs "${OUT:-$BUILD_DIR}/sanitize" --only "$run"
    done < <(bash scripts/gpu_sanitize.sh --list)
  else
    skip_step "sanitize" "build failed"
  fi
fi

if [ "$RUN_BENCH" -eq 1 ]; then
  BENCH_DIR=${OUT:-bench-results}
  mkdir -p "$BENCH_DIR"
  if [ "$install_ok" -eq 1 ]; then
    run_step "numerics_gpu" "$PYTHON" bench/numerics_gpu.py --json "$BENCH_DIR/numerics_gpu.json" \
      --markdown "$BENCH_DIR/numerics_gpu.md"
  else
    skip_step "numerics_gpu" "pip install failed"
  fi
  # FlashAttention-3 for JAX (jax-fa3): the GPU machine is offline, so from the wheels
  # scripts/prepare_gpu_carry.sh put in .carry/wheels/, pinned in bench/requirements-gpu-bench.txt,
  # into .carry/site, where the bench looks for them. Without them jax-fa3 reports 'unsupported'.
  if ls .carry/wheels/*.whl >/dev/null 2>&1; then
    run_step "bench wheels" "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --no-index \
      --upgrade --target .carry/site --find-links .carry/wheels -r bench/requirements-gpu-bench.txt
  else
    echo "gpu_check: no .carry/wheels/ (scripts/prepare_gpu_carry.sh, where there is a network): jax-fa3 only if installed"
  fi
  for pass in forward train; do
    if [ "$install_ok" -eq 1 ]; then
      # shellcheck disable=SC2086  # BENCH_ARGS is a list of words on purpose
      # --graph: the protocol of docs/DESIGN.md §5 (every torch implementation replayed from a CUDA graph)
      run_step "bench $pass" "$PYTHON" bench/bench_attention.py --pass "$pass" --graph \
        --json "$BENCH_DIR/bench_$pass.json" --markdown "$BENCH_DIR/bench_$pass.md" $BENCH_ARGS
    else
      skip_step "bench $pass" "pip install failed"
    fi
  done
fi

echo
echo "==== gpu_check summary"
failed=0
for i in "${!STEP_NAMES[@]}"; do
  code=${STEP_CODES[$i]}
  if [ "$code" = "skipped" ]; then
    verdict="SKIPPED"
    failed=1
  elif [ "$code" -eq 0 ]; then
    verdict="ok"
  else
    verdict="FAILED (exit $code)"
    failed=1
  fi
  printf '  %-34s %-18s %5ss\n' "${STEP_NAMES[$i]}" "$verdict" "${STEP_SECONDS[$i]}"
done
if [ "$RUN_BENCH" -eq 1 ]; then
  echo "  benchmark results: ${BENCH_DIR}/bench_{forward,train}.{json,md}, ${BENCH_DIR}/numerics_gpu.{json,md}"
fi
if [ "$failed" -ne 0 ]; then
  echo "gpu_check: FAILED"
  exit 1
fi
echo "gpu_check: all steps passed"
exit 0
