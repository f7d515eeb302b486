#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck and synccheck over a small, fast subset of the GPU tests
# (an sm_90 machine; `scripts/gpu_check.sh --sanitize` builds and calls this, one step per run):
#
#   scripts/gpu_sanitize.sh [--build-dir build-gpu] [--logs DIR] [--only RUN] [--list]
#
# The subset (tests/gpu/test_sanitizer_patterns_gpu.cu, one quantization test and a few of
# tests/gpu/test_offsets_validation_gpu.cu): small training calls, forward and backward, over every
# kernel instance (document and prefix isolation, GQA and MQA, short and long documents, per-token
# scales, non-causal), the backward's FP16 dQ partials (one document of 8,192 tokens: D = 128,
# causal, saved codes, not deterministic), malformed cu_seqlens (clamped by the kernels, and found
# by the calls' device check), and the minimal reproduction of racecheck's mbarrier false positive.
# Each run's tool output goes to DIR/RUN.log, the tests' own to DIR/RUN.out, and
# scripts/sanitize_report.py judges them: it fails on any report not
# explained by a named entry of scripts/sanitizer_suppressions.txt, on a failed, skipped or missing
# test, and on a run that did not finish. Every run is limited to SANITIZE_TIMEOUT seconds (default
# 180); each is meant to take well under two minutes on an H200.
# Environment: PYTHON (default python3), COMPUTE_SANITIZER (default: found next to nvcc).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PYTHON=${PYTHON:-python3}
BUILD_DIR=build-gpu
LOGS=""
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) shift; BUILD_DIR=${1:?} ;;
    --logs) shift; LOGS=${1:?} ;;
    --only) shift; ONLY=${1:?} ;;
    --list) LIST=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "gpu_sanitize: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
LOGS=${LOGS:-$BUILD_DIR/sanitize}

WORKLOADS='*SanitizerWorkload.*'  # the parameterized ones are Small/SanitizerWorkload.*
PARTIALS='SanitizerWorkload.DqPartials*'
# Malformed cu_seqlens: the kernels' clamping on their own, and whole calls that find them on the
# device (the record, the NaN written over every output, no work for the attention kernels).
MALFORMED='Gpu.MalformedCuSeqlensStayInBounds:Offsets/OffsetsValidation.*/NonMonotone_*:Offsets/OffsetsValidation.*/Int32MaxInTheMiddle_*:OffsetsValidationMore.WithoutAStatusWordTheOutputsAreNaNAllTheSame'
# name | tool | gtest filter | extra sanitizer options | extra report options
RUNS=(
  "memcheck|memcheck|SanitizerPattern.*:$WORKLOADS:$MALFORMED||"
  "synccheck|synccheck|SanitizerPattern.*:$WORKLOADS:$MALFORMED||"
  "racecheck-reproduction|racecheck|SanitizerPattern.*||--expect-suppressed mbarrier_stage_kernel"
  "racecheck|racecheck|$WORKLOADS:$MALFORMED-$PARTIALS||"
  # The FP16-partials path is the dK dV kernel's; the other kernels of the call run in the workloads.
  "racecheck-dq-partials|racecheck|$PARTIALS|--kernel-name kns=backward_dkdv|"
)

if [ "${LIST:-0}" -eq 1 ]; then
  for run in "${RUNS[@]}"; do echo "${run%%|*}"; done
  exit 0
fi

SANITIZER=${COMPUTE_SANITIZER:-}
if [ -z "$SANITIZER" ]; then
  for candidate in "$(command -v compute-sanitizer 2>/dev/null)" \
                   "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer" \
                   /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then SANITIZER=$candidate; break; fi
  done
fi
if [ -z "$SANITIZER" ]; then
  echo "gpu_sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
  exit 1
fi
TESTS=$BUILD_DIR/tests/gpu/flamia_gpu_tests
if [ ! -x "$TESTS" ]; then
  echo "gpu_sanitize: $TESTS not built (scripts/gpu_check.sh builds it)" >&2
  exit 1
fi
mkdir -p "$LOGS"
echo "gpu_sanitize: $("$SANITIZER" --version | grep -i version | head -1)"

status=0
ran=0
for run in "${RUNS[@]}"; do
  IFS='|' read -r name tool filter sanitizer_opts report_opts <<<"$run"
  [ -n "$ONLY" ] && [ "$ONLY" != "$name" ] && continue
  ran=1
  log=$LOGS/$name.log
  out=$LOGS/$name.out
  rm -f "$log" "$out"
  echo "---- $name: $tool over $filter ${sanitizer_opts}"
  start=$SECONDS
  # shellcheck disable=SC2086  # the options are lists of words on purpose
  timeout "${SANITIZE_TIMEOUT:-180}" "$SANITIZER" --tool "$tool" --error-exitcode 9 --print-limit 10000 \
    --log-file "$log" $sanitizer_opts "$TESTS" --gtest_filter="$filter" --gtest_color=no >"$out" 2>&1
  code=$?
  echo "     exit $code after $((SECONDS - start)) s; logs: $log, $out"
  [ -f "$log" ] || : >"$log"  # no log at all: the report fails on the missing summary
  # shellcheck disable=SC2086
  if ! "$PYTHON" scripts/sanitize_report.py "$log" --program-output "$out" --tool "$tool" \
      --suppressions scripts/sanitizer_suppressions.txt --gtest $report_opts; then
    status=1
  fi
  # 9: the tool's own errors (which the report judged above); anything else: a crash or a timeout.
  if [ "$code" -ne 0 ] && [ "$code" -ne 9 ]; then
    echo "FAIL: $name: exit $code ($([ "$code" -eq 124 ] && echo "past ${SANITIZE_TIMEOUT:-180} s" || echo "the program failed"))"
    tail -20 "$out"
    status=1
  fi
done
if [ "$ran" -eq 0 ]; then
  echo "gpu_sanitize: no run named $ONLY (--list names them)" >&2
  exit 2
fi
exit "$status"
