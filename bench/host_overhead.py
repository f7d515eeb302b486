#!/usr/bin/env python3
"""Host time of a flamia call against its GPU time, per workload, forward and training call, for
each of two paths: "attention" (flamia.attention: plain eager calls run the custom ops'
implementations directly) and "custom-op" (the custom ops and their autograd registration, what
torch.compile traces):

  host          perf_counter over --calls back-to-back calls with no synchronize, per call: the
                Python, custom-op, autograd and C API time the host spends issuing one call;
  event-timed   the median of --calls calls timed like bench_attention.py (start event, call, end
                event, synchronize): includes the host time and launch latency before the first
                kernel starts;
  back-to-back  CUDA events around --calls calls issued back to back, per call: the GPU's time
                once the host runs ahead;
  lead, gaps    from a torch.profiler trace of --calls synchronized calls, medians per call: from
                the call's start on the host to its first kernel on the GPU (what an event-timed
                call waits for the host), and the GPU's idle time between the call's first and last
                kernel (kernels that wait for their launch).

Then, with --top, a cProfile of --calls calls (the --top entries by self time), to see where the
host time goes.

Usage (repo root, GPU machine, flamia importable):
  python3 bench/host_overhead.py [--workloads tiny-unaligned,4x16384] [--paths attention,custom-op]
                                 [--calls 20] [--top 14]
"""
import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

PATHS = ("attention", "custom-op")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="tiny-unaligned,4x16384", help="comma-separated names")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    p.add_argument("--calls", type=int, default=20, help="calls per measurement (default 20)")
    p.add_argument("--top", type=int, default=14, help="cProfile entries shown (default 14; 0: none)")
    args = p.parse_args(argv)
    args.names = args.workloads.split(",")
    args.path_names = args.paths.split(",")
    if any(path not in PATHS for path in args.path_names):
        p.error(f"unknown path(s) in {args.paths!r}; known: {', '.join(PATHS)}")
    unknown = [n for n in args.names if n not in W.WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; known: {', '.join(W.WORKLOADS)}")
    if args.calls < 1 or args.top < 0:
        p.error("--calls must be >= 1 and --top >= 0")
    return args


def probe(torch, flamia, name, train, path, args):
    lens = W.WORKLOADS[name]["lens"]
    q, k, v, dout, cu = W.training_inputs(torch, name, requires_grad=train)

    scale = 1.0 / W.HEAD_DIM ** 0.5
    op_args = (cu, max(lens), True, scale, "document", "block32", "ceil")

    def call():
        if path == "attention":
            o = flamia.attention(q, k, v, cu, max(lens), softmax_scale=scale)
        elif train:
            o = flamia.ops.attention_forward_train(q, k, v, *op_args)[0]
        else:
            o = flamia.ops.attention_forward(q, k, v, *op_args)[0]
        if train:
            torch.autograd.grad(o, (q, k, v), dout)

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    n = args.calls
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    timed = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        timed.append(start.elapsed_time(end))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    end.synchronize()
    lead, gaps = timeline(torch, call, n)
    print(f"{name} {'train' if train else 'forward'} ({path}): host {host:.3f} ms/call (no sync), event-timed "
          f"median {statistics.median(timed):.3f}, back-to-back {start.elapsed_time(end) / n:.3f} ms/call; "
          f"lead {lead:.3f} ms, gaps {gaps:.3f} ms", flush=True)
    if args.top:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(n):
            call()
        profile.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


def timeline(torch, call, calls):
    """(lead, gaps) in ms, medians over `calls` synchronized calls of a torch.profiler trace: from
    the call's start on the host to its first GPU activity, and the GPU's idle time between its
    first and last activity (kernels and memsets, in the host's time base)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            with record_function(f"host_overhead_call_{i}"):
                call()
            torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    starts, gpu = [], []
    for e in prof.events():
        if e.name.startswith("host_overhead_call_"):
            if e.device_type != cuda:
                starts.append(e.time_range.start)
        elif e.device_type == cuda:
            gpu.append((e.time_range.start, e.time_range.end))
    starts.sort()
    gpu.sort()
    leads, gaps = [], []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else float("inf")
        mine = [(a, b) for a, b in gpu if t0 <= a < t1]
        if not mine:
            continue
        leads.append(mine[0][0] - t0)
        idle, reach = 0.0, mine[0][1]
        for a, b in mine[1:]:
            idle += max(0.0, a - reach)
            reach = max(reach, b)
        gaps.append(idle)
    if not leads:
        return float("nan"), float("nan")
    return statistics.median(leads) / 1e3, statistics.median(gaps) / 1e3  # us -> ms


def main(argv=None):
    args = parse_args(argv)
    import torch
    import flamia
    if not torch.cuda.is_available():
        sys.exit("host_overhead: needs a CUDA GPU")
    for name in args.names:
        for train in (False, True):
            for path in args.path_names:
                probe(torch, flamia, name, train, path, args)


if __name__ == "__main__":
    main()
