#!/usr/bin/env bash
# Nsight Compute profile of flamia's kernels on one training call (quantization, forward, backward
# prep, dK dV, dQ) on a benchmark workload, for a GPU machine with ncu and the installed package:
#
#   bash scripts/profile_gpu.sh [--sass] [WORKLOAD] [OUT_DIR]   (defaults: 16x4096, $OUT or profile-results)
#
# --sass also collects per-instruction stall samples (SourceCounters; the profile takes longer) and
# writes, per attention kernel, <OUT_DIR>/sass-<kernel>.csv and its summary sass-<kernel>.txt
# (scripts/sass_hotspots.py: stall reasons, opcode mix, the instructions with the most samples).
#
# Writes <OUT_DIR>/profile.ncu-rep (open with ncu-ui or `ncu --import`) and prints, per kernel, the
# duration, SM and memory throughput, achieved occupancy and registers, then L2 throughput, tensor
# pipe activity and the largest stall reasons (the report holds the rest).
# Only the second training call is profiled (cudaProfilerStart/Stop around it: the first warms up),
# every flamia kernel of it once, with clocks left as they run.
# One of three profiling entry points; docs/KERNELS.md "Tools" says which answers what.
set -euo pipefail
cd "$(dirname "$0")/.."
SASS=0
if [ "${1:-}" = --sass ]; then SASS=1; shift; fi
WORKLOAD=${1:-16x4096}
OUT_DIR=${2:-${OUT:-profile-results}}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
command -v ncu >/dev/null || { echo "profile_gpu: ncu not found" >&2; exit 2; }

DRIVER=$(mktemp --suffix=.py)
trap 'rm -f "$DRIVER"' EXIT
cat > "$DRIVER" <<PY
import sys
sys.path.insert(0, "bench")
import torch, flamia, workloads as W
lens = W.WORKLOADS["$WORKLOAD"]["lens"]
q, k, v, dout, cu = W.training_inputs(torch, "$WORKLOAD")
for call in range(2):  # the second call is the one profiled
    if call == 1:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    o = flamia.attention(q, k, v, cu, max(lens))
    torch.autograd.grad(o, (q, k, v), dout)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
PY

ncu --profile-from-start off --kernel-name regex:'quantize|prefix_max|forward_kernel|backward_' \
  --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section ComputeWorkloadAnalysis $([ "$SASS" = 1 ] && echo --section SourceCounters) \
  -f -o "$OUT_DIR/profile" "$PYTHON" "$DRIVER" > "$OUT_DIR/ncu.log" 2>&1 || { tail -20 "$OUT_DIR/ncu.log"; exit 1; }
ncu --import "$OUT_DIR/profile.ncu-rep" --page details --csv > "$OUT_DIR/profile.csv"
"$PYTHON" - "$OUT_DIR/profile.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
by_kernel = collections.OrderedDict()
for r in rows:
    by_kernel.setdefault((r["ID"], r["Kernel Name"][:60]), {})[r["Metric Name"]] = (r["Metric Value"], r["Metric Unit"])
for (kid, name), m in by_kernel.items():
    print(f"{kid:>3} {name}")
    for key in ("Duration", "Compute (SM) Throughput", "Memory Throughput", "Achieved Occupancy", "Registers Per Thread"):
        if key in m:
            print(f"      {key:28s} {m[key][0]} {m[key][1]}")
PY
# From the raw metrics: L2 throughput (an L2-bound attention kernel shows here), pipe
# utilization, and the stall reasons per issued instruction (cycles), largest first.
ncu --import "$OUT_DIR/profile.ncu-rep" --page raw --csv > "$OUT_DIR/profile-raw.csv"
"$PYTHON" - "$OUT_DIR/profile-raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
header, data = rows[0], rows[2:]
def value(row, name):
    try:
        return float(row[header.index(name)].replace(",", ""))
    except (ValueError, IndexError):
        return None
prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
for row in data:
    print(row[header.index("Kernel Name")][:60])
    for label, name in (("L2 throughput %", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
                        ("tensor pipe active %", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
                        ("cycles per issued instruction", "smsp__average_warp_latency_per_inst_issued.ratio")):
        v = value(row, name)
        if v is not None:
            print(f"      {label:30s} {v:.2f}")
    stalls = [(h[len(prefix):-len(suffix)], value(row, h)) for h in header
              if h.startswith(prefix) and h.endswith(suffix) and "not_issued" not in h]
    # "selected" is the issuing cycle itself (always 1), not a stall.
    stalls = sorted(((r, v) for r, v in stalls if v is not None and v >= 0.1 and r != "selected"), key=lambda x: -x[1])
    print("      stalls per issued instruction: " + ", ".join(f"{r} {v:.2f}" for r, v in stalls[:6]))
PY
if [ "$SASS" = 1 ]; then
  for kernel in forward_kernel backward_dkdv backward_dq; do
    ncu --import "$OUT_DIR/profile.ncu-rep" --kernel-name "regex:$kernel" --page source --csv --print-source sass \
      > "$OUT_DIR/sass-$kernel.csv"
    "$PYTHON" scripts/sass_hotspots.py "$OUT_DIR/sass-$kernel.csv" > "$OUT_DIR/sass-$kernel.txt"
    echo "== $kernel (per-instruction stall samples: $OUT_DIR/sass-$kernel.txt)"
    head -8 "$OUT_DIR/sass-$kernel.txt"
  done
fi
echo "profile_gpu: wrote $OUT_DIR/profile.ncu-rep, $OUT_DIR/profile.csv, $OUT_DIR/profile-raw.csv"
