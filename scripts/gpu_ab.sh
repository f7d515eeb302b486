#!/usr/bin/env bash
# A kernel change measured side by side with the build it changes, in one job on one GPU: the
# library of a base commit and the working tree's, their outputs compared, their kernels timed in
# interleaved processes, and (with --fa3) each one's backward against FlashAttention-3's.
#
#   scripts/gpu_ab.sh prepare [REF]    where git is (default REF: HEAD): REF's sources into
#                                      .carry/ab-base/ (--fa3's wheels: scripts/prepare_gpu_carry.sh)
#   scripts/gpu_ab.sh run [--workloads 4x16384,16x4096] [--rounds 10] [--outputs] [--fa3]
#                         [--fa3-workloads 4x16384]           on the GPU machine, from the repo root
#
# An offline GPU machine needs, beside the working tree, the ignored .carry/ab-base and for --fa3
# the two wheels of bench/requirements-gpu-bench.txt (.carry/wheels/flash_attn3_jax-*.whl and
# .carry/wheels/einops-*.whl; `prepare` names them).
# run builds both libraries (flamia_capi only, side by side, JOBS/2 jobs each) into build-ab/base
# and build-ab/variant, then:
#  - with --outputs, bench/compare_libraries.py --fp16-partials: the variant's training calls
#    bitwise against the base's, both backwards (a lever meant to be bitwise must pass it before its
#    time means anything; the partials' dq by cosine);
#  - bench/kernel_breakdown.py --pass train, in the order base, variant, variant, base (each a
#    process of its own, so that the clock's drift over the job falls on both alike);
#  - with --fa3, bench/bench_attention.py --pass train and --pass forward --graph with flamia and
#    jax-fa3 for each library, then bench/backward_ratio.py: both backwards against FA3's, and the
#    `backward / FA3 at W: r` line docs/RESULTS.md quotes (the variant's).
# Results go to $OUT/ab (else ab-results/): breakdown-<n>-<library>.md, the benches' JSON, the
# ratio table backward.md, build logs. Environment: PYTHON (default python3), JOBS (default 16),
# AB_BASE (default .carry/ab-base).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-16}
BASE_SRC=${AB_BASE:-.carry/ab-base}  # where prepare puts the base sources and run reads them

usage() { sed -n '2,26p' "$0"; }

prepare() {
  local ref=${1:-HEAD}
  git rev-parse --verify -q "$ref^{commit}" >/dev/null || { echo "gpu_ab: no commit $ref" >&2; exit 2; }
  rm -rf "$BASE_SRC" && mkdir -p "$BASE_SRC"
  git archive --format=tar "$ref" | tar -xf - -C "$BASE_SRC"
  git rev-parse "$ref" > "$BASE_SRC/.ab-commit"
  echo "gpu_ab: $ref ($(cut -c1-12 "$BASE_SRC/.ab-commit")) in $BASE_SRC ($(du -sh "$BASE_SRC" | cut -f1))"
  if ! ls .carry/wheels/flash_attn3_jax-*.whl .carry/wheels/einops-*.whl >/dev/null 2>&1; then
    echo "gpu_ab: no FA3 wheels in .carry/wheels: run scripts/prepare_gpu_carry.sh for --fa3"
  fi
  echo "gpu_ab: carry $BASE_SRC$(for w in .carry/wheels/flash_attn3_jax-*.whl .carry/wheels/einops-*.whl; do
    [ -f "$w" ] && printf ' %s' "$w"; done)"
}

build_library() {  # SRC BUILD LOG JOBS
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  { cmake -S "$1" -B "$2" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFLAMIA_CUDA=ON -DFLAMIA_BUILD_TESTS=OFF \
      -DFLAMIA_BUILD_CLI=OFF -DPython3_EXECUTABLE="$(command -v "$PYTHON")" &&
    cmake --build "$2" -j"$4" --target flamia_capi; } > "$3" 2>&1
}

run() {
  local workloads=4x16384,16x4096 rounds=10 outputs=0 fa3=0 fa3_workloads=4x16384
  while [ $# -gt 0 ]; do
    case "$1" in
      --workloads) shift; workloads=${1:?} ;;
      --rounds) shift; rounds=${1:?} ;;
      --outputs) outputs=1 ;;
      --fa3) fa3=1 ;;
      --fa3-workloads) shift; fa3_workloads=${1:?} ;;
      *) echo "gpu_ab: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
  done
  [ -f "$BASE_SRC/CMakeLists.txt" ] || { echo "gpu_ab: no $BASE_SRC (run 'scripts/gpu_ab.sh prepare REF' where git is, and copy it here)" >&2; exit 2; }
  local results=${OUT:-ab-results}/ab
  mkdir -p "$results"
  echo "gpu_ab: base $(cat "$BASE_SRC/.ab-commit" 2>/dev/null || echo '(commit unknown)') vs the working tree"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

  local start=$SECONDS half=$(( JOBS / 2 > 0 ? JOBS / 2 : 1 ))
  build_library "$BASE_SRC" build-ab/base "$results/build-base.log" "$half" &
  local base_pid=$!
  build_library . build-ab/variant "$results/build-variant.log" "$half"
  local variant_rc=$?
  wait "$base_pid"
  local base_rc=$?
  echo "gpu_ab: built in $((SECONDS - start)) s (base exit $base_rc, variant exit $variant_rc)"
  if [ "$base_rc" -ne 0 ] || [ "$variant_rc" -ne 0 ]; then
    tail -20 "$results"/build-*.log
    exit 1
  fi
  declare -A lib=([base]=build-ab/base/libflamia_capi.so [variant]=build-ab/variant/libflamia_capi.so)
  if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_ab: both libraries built; no CUDA device (or no torch) here, so nothing is measured" >&2
    exit 3
  fi
  local status=0
  # One library's process: its library by FLAMIA_CAPI_LIB, the checkout's Python package.
  with() { local which=$1; shift; FLAMIA_CAPI_LIB=${lib[$which]} PYTHONPATH=python "$PYTHON" "$@"; }

  if [ "$outputs" -eq 1 ]; then
    with base bench/compare_libraries.py save "$results/base-outputs.pt" --workloads "$workloads" --fp16-partials ||
      status=1
    if with variant bench/compare_libraries.py compare "$results/base-outputs.pt" --workloads "$workloads" \
      --fp16-partials; then
      echo "gpu_ab: outputs bitwise the base's"
    else
      echo "gpu_ab: outputs differ from the base's (above)"
    fi
    rm -f "$results/base-outputs.pt"
  fi

  local n=0
  for which in base variant variant base; do
    n=$((n + 1))
    echo "gpu_ab: kernel breakdown $n ($which)"
    with "$which" bench/kernel_breakdown.py --pass train --workloads "$workloads" --rounds "$rounds" \
      > "$results/breakdown-$n-$which.md" || status=1
    grep -E '^\|' "$results/breakdown-$n-$which.md"
  done

  if [ "$fa3" -eq 1 ]; then
    if ls .carry/wheels/*.whl >/dev/null 2>&1; then
      "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --no-index --upgrade --target .carry/site \
        .carry/wheels/flash_attn3_jax-*.whl .carry/wheels/einops-*.whl || status=1
    fi
    local ratio_args=()
    for which in variant base; do
      for pass in train forward; do
        echo "gpu_ab: $which --pass $pass with FA3"
        with "$which" bench/bench_attention.py --pass "$pass" --graph --impls flamia,jax-fa3 \
          --workloads "$fa3_workloads" --rounds "$rounds" --json "$results/bench-$which-$pass.json" \
          > "$results/bench-$which-$pass.log" 2>&1 || { status=1; tail -5 "$results/bench-$which-$pass.log"; }
      done
      ratio_args+=(--library "$which" "$results/bench-$which-train.json" "$results/bench-$which-forward.json")
    done
    "$PYTHON" bench/backward_ratio.py "${ratio_args[@]}" --markdown "$results/backward.md" || status=1
  fi
  echo "gpu_ab: done in $((SECONDS - start)) s; results in $results"
  exit "$status"
}

case "${1:-}" in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
