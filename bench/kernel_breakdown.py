#!/usr/bin/env python3
"""Where a flamia call spends its GPU time: per-kernel durations of one forward (--pass forward)
or training call (--pass train) on the benchmark workloads, from the PyTorch profiler (CUPTI
kernel records), summed per kernel family over --rounds calls after --warmup calls and divided by
--rounds. One of three profiling entry points; docs/KERNELS.md "Tools" says which answers what.

Output: one markdown row per workload, ms per call for each kernel family (quantization of each
tensor, the V fold reference, the work order, forward, backward prep, dK dV, dQ, and 'other':
every non-flamia kernel the op launches, e.g. allocator fills or dtype casts), the kernels' sum and
the wall time per call (CUDA events around the same calls, so wall - sum is launch gaps and host
time).

--timeline: instead, the call is captured in a CUDA graph and replayed --rounds times under the
profiler; one table per workload lists every GPU activity of a call in launch order (each
quantize launch apart) with the medians over the replays of its start, its duration and its gap
after the previous activity's end, in microseconds, and the replay's time per call from CUDA
events. Under replay there is no host time between kernels, so the gaps are the GPU's own.

Usage (repo root, GPU machine, flamia installed):
  python3 bench/kernel_breakdown.py [--pass train] [--workloads 16x4096,longtail] [--rounds 10]
                                   [--isolation prefix] [--timeline]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402
from bench_attention import captured  # noqa: E402

# Kernel family of a CUDA kernel name; the first match wins (names are the kernels' C++ names).
FAMILIES = (
    ("quantize", "quantize"),
    ("prefix_max", "v fold ref"),
    ("build_work_order", "work order"),
    ("forward_kernel", "forward"),
    ("backward_prep", "bwd prep"),
    ("backward_dkdv", "dK dV"),
    ("backward_dq", "dQ"),
)


def family(name):
    for needle, label in FAMILIES:
        if needle in name:
            return label
    return "other"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pass", dest="pass_", choices=("forward", "train"), default="forward")
    p.add_argument("--workloads", default="all", help="comma-separated names (default: all nine)")
    p.add_argument("--rounds", type=int, default=10, help="profiled calls per workload (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="unprofiled calls first (default 3)")
    p.add_argument("--isolation", choices=("document", "prefix"), default="document",
                   help="flamia.attention's isolation mode (default: document)")
    p.add_argument("--timeline", action="store_true",
                   help="each GPU activity of a graph-replayed call, in launch order (see above)")
    args = p.parse_args(argv)
    names = list(W.WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
    unknown = [n for n in names if n not in W.WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; known: {', '.join(W.WORKLOADS)}")
    if args.rounds < 1 or args.warmup < 0:
        p.error("--rounds must be >= 1 and --warmup >= 0")
    args.names = names
    return args


def workload_call(torch, flamia, name, args):
    """The workload's call (forward, or forward and gradients) on fresh inputs."""
    lens = W.WORKLOADS[name]["lens"]
    train = args.pass_ == "train"
    q, k, v, dout, cu = W.training_inputs(torch, name, requires_grad=train)

    def call():
        o = flamia.attention(q, k, v, cu, max(lens), isolation=args.isolation)
        if train:
            return torch.autograd.grad(o, (q, k, v), dout)
        return o

    return call


def profiled(torch, call, rounds):
    """call() `rounds` times back to back under the profiler (CUDA activities) and between two CUDA
    events: (the profiler, ms per call by the events)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(rounds):
            call()
        stop.record()
        torch.cuda.synchronize()
    return prof, start.elapsed_time(stop) / rounds


def one_workload(torch, flamia, name, args):
    call = workload_call(torch, flamia, name, args)
    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    prof, ms_per_call = profiled(torch, call, args.rounds)
    per_family = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            label = family(e.name)
            per_family[label] = per_family.get(label, 0.0) + e.device_time_total / 1e3 / args.rounds
    return per_family, ms_per_call


def timeline_rows(events, calls):
    """events: (start, end, name) of `calls` identical calls back to back, sorted by start. Returns
    one (name, start, duration, gap) per activity of a call, each the median over the calls: start
    from the call's first activity, gap from the previous activity's end (0 for the first)."""
    if calls < 1 or not events or len(events) % calls:
        raise ValueError(f"{len(events)} activities are not {calls} calls of the same length")
    n = len(events) // calls
    rows = []
    for i in range(n):
        same = [events[c * n + i] for c in range(calls)]
        if len({name for _, _, name in same}) != 1:
            raise ValueError(f"activity {i} differs between calls: {sorted({name for _, _, name in same})}")
        first = [events[c * n][0] for c in range(calls)]
        previous_end = [events[c * n + i - 1][1] if i else events[c * n][0] for c in range(calls)]
        rows.append((same[0][2], statistics.median(s - f for (s, _, _), f in zip(same, first)),
                     statistics.median(e - s for s, e, _ in same),
                     statistics.median(s - p for (s, _, _), p in zip(same, previous_end))))
    return rows


def short_name(kernel):
    """A kernel's C++ name without namespaces, return type or parameters; template arguments kept
    (they tell the instances apart): 'void ns::(anonymous namespace)::k<true, 2>(int)' -> 'k<true, 2>'."""
    signature = kernel.replace("(anonymous namespace)::", "").split("(")[0].strip()
    qualified, bracket, template = signature.partition("<")
    unqualified = qualified.split()[-1].rsplit("::", 1)[-1] if qualified.strip() else qualified
    return unqualified + bracket + template


def timeline_table(name, rows, replay_us):
    def us(x):
        return f"{round(x, 1) or 0.0:.1f}"  # no "-0.0" for a timestamp jitter of a few ns

    lines = [f"{name}: {replay_us:.1f} us per replayed call; activities in launch order (us, medians)", "",
             "| activity | start | duration | gap |", "|---|---|---|---|"]
    for activity, start, duration, gap in rows:
        lines.append(f"| {family(activity)}: {short_name(activity)} | {us(start)} | {us(duration)} | {us(gap)} |")
    busy = sum(r[2] for r in rows)
    lines.append(f"| all (busy {us(busy)}) | | {us(rows[-1][1] + rows[-1][2])} | {us(sum(r[3] for r in rows))} |")
    return "\n".join(lines)


def one_timeline(torch, flamia, name, args):
    replay = captured(torch, workload_call(torch, flamia, name, args), warmup=max(args.warmup, 1))
    replay()
    torch.cuda.synchronize()
    prof, ms_per_call = profiled(torch, replay, args.rounds)
    events = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CUDA)
    return timeline_table(name, timeline_rows(events, args.rounds), ms_per_call * 1e3)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import flamia
    if not torch.cuda.is_available():
        sys.exit("kernel_breakdown: needs a CUDA GPU")
    if args.timeline:
        print(f"{args.pass_} call, isolation={args.isolation}, {args.rounds} graph replays "
              f"({torch.cuda.get_device_name()})\n")
        for name in args.names:
            print(f"breakdown: {name} ...", file=sys.stderr, flush=True)
            print(one_timeline(torch, flamia, name, args) + "\n")
        return
    columns = [label for _, label in FAMILIES] + ["other"]
    rows = []
    for name in args.names:
        print(f"breakdown: {name} ...", file=sys.stderr, flush=True)
        per_family, wall = one_workload(torch, flamia, name, args)
        rows.append((name, per_family, wall))
    used = [c for c in columns if any(c in r[1] for r in rows)]
    print(f"ms per {args.pass_} call, isolation={args.isolation} ({args.rounds} calls after {args.warmup} warm-up, "
          f"{torch.cuda.get_device_name()})\n")
    print("| workload | " + " | ".join(used) + " | kernels | wall |")
    print("|---" * (len(used) + 3) + "|")
    for name, per_family, wall in rows:
        cells = [f"{per_family.get(c, 0.0):.3f}" for c in used]
        print(f"| {name} | " + " | ".join(cells) + f" | {sum(per_family.values()):.3f} | {wall:.3f} |")


if __name__ == "__main__":
    main()
