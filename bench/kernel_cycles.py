#!/usr/bin/env python3
"""SM cycles per call of each implementation's kernels, side by side at one locked clock: Nsight
Compute (`ncu --clock-control base`, each kernel alone) on the benchmark's calls, so that two
implementations compare by their kernels' cycles, without the clock each keeps under the power cap
(which moves the protocol's time ratios, docs/RESULTS.md "Clock at the power cap"). One of three
profiling entry points; docs/KERNELS.md "Tools" says which answers what.

  python3 bench/kernel_cycles.py run [--workloads 4x16384,tiny-unaligned] [--impls flamia,jax-cudnn-fp8]
                                     [--out DIR] [--sections] [--stalls]
      one ncu process per (workload, implementation) over bench/bench_attention.py's forward (one
      warm-up and one timed call, no accuracy check), its CSV kept in DIR (default $OUT, else bench-results/kernel-cycles); then the table below.
      With --sections, also each implementation's attention kernel (its second launch) under
      Nsight Compute's SECTIONS (below), and a table of their main metrics.
      With --stalls, also each attention kernel's raw metrics of STALL_ROWS (below): stall
      reasons per issued instruction, pipe use, instructions per sub-partition.
  python3 bench/kernel_cycles.py parse CSV [CSV ...]
      the table of CSVs that `run` wrote (or any ncu --csv log with sm__cycles_elapsed.max of one
      implementation's calls).
  python3 bench/kernel_cycles.py parse-sections CSV [CSV ...]
      the sections table of `ncu --csv --page details` logs: one column per profiled kernel.
  python3 bench/kernel_cycles.py parse-stalls CSV [CSV ...]
      the stalls table of `ncu --csv --page raw` logs (any that hold STALL_ROWS' metrics).

Table: per CSV, the call's kernels grouped into families (flamia: quantize, V fold reference, work
order, forward kernel; cuDNN: its attention kernel and its setup kernel; XLA: JAX's own small
kernels), in thousands of SM cycles per call, and their sum. A call is counted by its attention
kernel's launches; the benchmark's set-up kernels (torch's random inputs and copies, the BF16 to
FP8 conversion of cuDNN FP8's inputs, which the protocol leaves outside the timed call) are left out.
Caveat: at the base clock a memory- or latency-bound kernel takes fewer cycles than at the clock it
runs at in the protocol, so the short rows' cycle ratios are not their time ratios.
"""
import argparse
import csv
import io
import os
import pathlib
import subprocess
import sys

CYCLES = "sm__cycles_elapsed.max"
REPO = pathlib.Path(__file__).resolve().parents[1]

# (substring of the kernel name, family); the first match wins. None: set-up, not part of a call.
FAMILIES = (
    ("at::", None),            # torch: random inputs, copies, norms of the benchmark's set-up
    ("dot_kernel", None),      # cuBLAS, torch's set-up
    ("reduce_1Block", None),
    ("convert", None),         # JAX's BF16 -> FP8 conversion of cuDNN FP8's inputs (outside the timed call)
    ("quantize_mxfp8", "quantize"),
    ("prefix_max_scales", "V fold reference"),
    ("build_work_order", "work order"),
    ("forward_kernel", "forward kernel"),
    ("sdpa", "cuDNN attention"),
    ("qkv_tma_setup", "cuDNN setup"),
)
ATTENTION = ("forward kernel", "cuDNN attention")  # one launch per call


def family(name):
    for key, fam in FAMILIES:
        if key in name:
            return fam
    return "XLA" if "::" not in name and not name.startswith("void") else "other"


def csv_lines(text):
    """An ncu --csv log without its '==PROF==' lines, as a file for the csv module."""
    return io.StringIO("".join(line for line in text.splitlines(True) if not line.startswith("==")))


def launches(text):
    """[(kernel name, SM cycles)] in launch order from an ncu --csv log."""
    rows = csv.DictReader(csv_lines(text))
    out = {}
    for r in rows:
        if r.get("Metric Name") == CYCLES:
            out[int(r["ID"])] = (r["Kernel Name"], float(r["Metric Value"].replace(",", "")))
    return [out[i] for i in sorted(out)]


def per_call(kernels):
    """({family: cycles per call}, calls): each family's cycles summed over the calls' launches and
    divided by the calls (the attention kernel's launches); set-up kernels left out."""
    sums, calls = {}, 0
    for name, cycles in kernels:
        fam = family(name)
        if fam is None:
            continue
        calls += fam in ATTENTION
        sums[fam] = sums.get(fam, 0.0) + cycles
    if calls == 0:
        raise ValueError("no attention kernel (flamia's forward_kernel or cuDNN's sdpa) in the log")
    return {fam: total / calls for fam, total in sums.items()}, calls


def table(results):
    """results: [(label, {family: cycles per call}, calls)] -> markdown rows in thousands of cycles."""
    order = [f for _, f in FAMILIES if f] + ["XLA", "other"]
    seen = [f for f in order if any(f in fams for _, fams, _ in results)]
    lines = ["| call | calls | " + " | ".join(seen) + " | sum |", "|---|---|" + "---|" * (len(seen) + 1)]
    for label, fams, calls in results:
        cells = [f"{fams[f] / 1e3:,.1f}" if f in fams else "-" for f in seen]
        lines.append(f"| {label} | {calls} | " + " | ".join(cells) + f" | {sum(fams.values()) / 1e3:,.1f} |")
    return "\n".join(lines)


def parse(paths):
    results, skipped = [], []
    for path in paths:
        try:
            fams, calls = per_call(launches(pathlib.Path(path).read_text()))
        except ValueError as e:  # e.g. an implementation that does not support the workload
            skipped.append(f"- {pathlib.Path(path).stem}: {e}")
            continue
        results.append((pathlib.Path(path).stem, fams, calls))
    return "\n".join([table(results)] + skipped) if results else "\n".join(skipped)


# The sections `run --sections` collects, and the metrics of them its table shows (ncu's names).
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "InstructionStats", "LaunchStats", "Occupancy",
            "WarpStateStats", "MemoryWorkloadAnalysis")
SECTION_ROWS = (
    ("elapsed SM cycles", "Elapsed Cycles"),
    ("warp instructions executed", "Executed Instructions"),
    ("IPC (active)", "Executed Ipc Active"),
    ("issue slots busy, %", "Issue Slots Busy"),
    ("warp cycles per issued instruction", "Warp Cycles Per Issued Instruction"),
    ("achieved active warps per SM", "Achieved Active Warps Per SM"),
    ("registers per thread", "Registers Per Thread"),
    ("dynamic shared memory per block, bytes", "Dynamic Shared Memory Per Block"),
    ("L2 hit rate, %", "L2 Hit Rate"),
    ("DRAM throughput, %", "DRAM Throughput"),
)


def section_metrics(text):
    """[(kernel name, {metric name: value text})] per profiled kernel of an ncu --page details log."""
    rows = csv.DictReader(csv_lines(text))
    kernels = {}
    for r in rows:
        if r.get("Metric Name"):
            kernels.setdefault(int(r["ID"]), (r["Kernel Name"], {}))[1][r["Metric Name"]] = r["Metric Value"]
    return [kernels[i] for i in sorted(kernels)]


def sections_table(paths):
    return kernels_table(paths, section_metrics, SECTION_ROWS)


# What `run --stalls` collects of each attention kernel (`ncu --page raw`, its metric names): where
# its warps wait, per issued instruction (Nsight Compute's warp-state stall reasons, in warps per
# issue: they sum to the warp cycles per issued instruction), how busy its pipes are, and how evenly
# its instructions spread over the four sub-partitions of an SM.
STALL_REASONS = ("wait", "long_scoreboard", "barrier", "not_selected", "dispatch_stall", "short_scoreboard",
                 "math_pipe_throttle", "mio_throttle", "misc", "no_instruction", "branch_resolving", "gmma",
                 "selected")
STALL_ROWS = tuple((f"stall {reason.replace('_', ' ')}, warps per issue",
                    f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio") for reason in STALL_REASONS) + (
    ("warp cycles per issued instruction", "smsp__average_warp_latency_per_inst_issued.ratio"),
    ("issue active per cycle, per sub-partition", "smsp__issue_active.avg.per_cycle_active"),
    ("tensor pipe busy, % of active cycles", "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
    ("MUFU (XU) pipe busy, %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
    ("FMA pipe busy, %", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("ALU pipe busy, %", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
    ("instructions per sub-partition, min", "smsp__inst_executed.min"),
    ("instructions per sub-partition, mean", "smsp__inst_executed.avg"),
    ("instructions per sub-partition, max", "smsp__inst_executed.max"),
    ("active threads per warp instruction", "smsp__thread_inst_executed_per_inst_executed.ratio"),
)


def raw_metrics(text):
    """[(kernel name, {metric name: value text})] per profiled kernel of an ncu --csv --page raw log
    (a header row of metric names, a row of units, then a row per kernel)."""
    rows = list(csv.reader(csv_lines(text)))
    if not rows:
        return []
    header = rows[0]
    name = header.index("Kernel Name")
    return [(r[name], dict(zip(header, r))) for r in rows[2:] if len(r) == len(header)]


def metrics_table(columns, rows):
    """columns: [(label, {metric: value})]; rows: [(row label, metric)] -> markdown, '-' where absent
    or empty."""
    lines = ["| | " + " | ".join(c for c, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for label, metric in rows:
        lines.append(f"| {label} | " + " | ".join(m.get(metric) or "-" for _, m in columns) + " |")
    return "\n".join(lines)


def kernel_label(path, name):
    short = "flamia forward kernel" if "forward_kernel" in name else name.split("(")[0][:40]
    return f"{pathlib.Path(path).stem}: {short}"


def stalls_table(paths):
    return kernels_table(paths, raw_metrics, STALL_ROWS)


def kernels_table(paths, read, rows):
    """metrics_table with a column per kernel of each log, read(text) -> [(kernel name, metrics)]."""
    return metrics_table([(kernel_label(path, name), metrics) for path in paths
                          for name, metrics in read(pathlib.Path(path).read_text())], rows)


def ncu(path, extra, workload, impl):
    print(f"kernel_cycles: {workload} / {impl} under ncu ...", file=sys.stderr, flush=True)
    cmd = (["ncu", "--target-processes", "all", "--clock-control", "base", *extra, "--csv", "--log-file", str(path),
            sys.executable, str(REPO / "bench" / "bench_attention.py"), "--pass", "forward", "--impls", impl,
            "--workloads", workload, "--rounds", "1", "--warmup", "1", "--calls-per-round", "1",
            "--no-gpu-readings", "--no-check"])
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"kernel_cycles: ncu failed for {workload} / {impl}:\n{done.stderr[-2000:]}")


# Each implementation's attention kernel, its second launch (the first is the warm-up's).
ATTENTION_KERNEL = ("--kernel-name-base", "demangled", "--kernel-name", "regex:forward_kernel|sdpa",
                    "--launch-skip", "1", "--launch-count", "1")


def run(args):
    out = pathlib.Path(args.out).resolve()  # ncu runs in the repository root
    out.mkdir(parents=True, exist_ok=True)
    paths, section_paths, stall_paths = [], [], []
    for workload in args.workloads.split(","):
        for impl in args.impls.split(","):
            stem = f"{workload}__{impl}".replace("/", "-")
            paths.append(out / f"{stem}.csv")
            ncu(paths[-1], ["--metrics", f"gpu__time_duration.sum,{CYCLES}"], workload, impl)
            if args.sections:
                section_paths.append(out / f"{stem}.sections.csv")
                sections = [a for name in SECTIONS for a in ("--section", name)]
                ncu(section_paths[-1], [*ATTENTION_KERNEL, *sections, "--page", "details"], workload, impl)
            if args.stalls:
                stall_paths.append(out / f"{stem}.stalls.csv")
                ncu(stall_paths[-1], [*ATTENTION_KERNEL, "--metrics", ",".join(m for _, m in STALL_ROWS),
                                      "--page", "raw"], workload, impl)
    text = parse(paths)
    if section_paths:
        text += "\n\n" + sections_table(section_paths)
    if stall_paths:
        text += "\n\n" + stalls_table(stall_paths)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="profile the benchmark's calls under ncu, then print the table")
    r.add_argument("--workloads", default="4x16384,tiny-unaligned,8192+224x256")
    r.add_argument("--impls", default="flamia,jax-cudnn-fp8,jax-cudnn-bf16")
    r.add_argument("--out", default=os.environ.get("OUT", "bench-results/kernel-cycles"),
                   help="where the ncu CSV logs go (default: $OUT, else bench-results/kernel-cycles)")
    r.add_argument("--sections", action="store_true", help="also the attention kernels' Nsight Compute sections")
    r.add_argument("--stalls", action="store_true",
                   help="also the attention kernels' stall reasons, pipes and sub-partition balance (raw metrics)")
    q = sub.add_parser("parse", help="the table of existing ncu CSV logs")
    q.add_argument("csv", nargs="+")
    t = sub.add_parser("parse-sections", help="the sections table of existing ncu --page details CSV logs")
    t.add_argument("csv", nargs="+")
    u = sub.add_parser("parse-stalls", help="the stalls table of existing ncu --page raw CSV logs")
    u.add_argument("csv", nargs="+")
    args = p.parse_args(argv)
    if args.mode == "run":
        print(run(args))
    elif args.mode == "parse":
        print(parse(args.csv))
    elif args.mode == "parse-sections":
        print(sections_table(args.csv))
    else:
        print(stalls_table(args.csv))


if __name__ == "__main__":
    main()
