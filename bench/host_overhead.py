#!/usr/bin/env python3
"""Host time of a flamia call against its GPU time, per workload, forward and training call:

  host          perf_counter over --calls back-to-back calls with no synchronize, per call: the
                Python, custom-op, autograd and C API time the host spends issuing one call;
  event-timed   the median of --calls calls timed like bench_attention.py (start event, call, end
                event, synchronize): includes the host time and launch latency before the first
                kernel starts;
  back-to-back  CUDA events around --calls calls issued back to back, per call: the GPU's time
                once the host runs ahead.

Then a cProfile of --calls calls (the --top entries by self time), to see where the host time goes.

Usage (repo root, GPU machine, flamia importable):
  python3 bench/host_overhead.py [--workloads tiny-unaligned,4x16384] [--calls 20] [--top 14]
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


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="tiny-unaligned,4x16384", help="comma-separated names")
    p.add_argument("--calls", type=int, default=20, help="calls per measurement (default 20)")
    p.add_argument("--top", type=int, default=14, help="cProfile entries shown (default 14; 0: none)")
    args = p.parse_args(argv)
    args.names = args.workloads.split(",")
    unknown = [n for n in args.names if n not in W.WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; known: {', '.join(W.WORKLOADS)}")
    if args.calls < 1 or args.top < 0:
        p.error("--calls must be >= 1 and --top >= 0")
    return args


def probe(torch, flamia, name, train, args):
    w = W.WORKLOADS[name]
    lens = w["lens"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(W.TOTAL, h, W.HEAD_DIM, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_(train)
               for h in (W.Q_HEADS, W.kv_heads(w), W.kv_heads(w)))
    dout = torch.randn_like(q)
    cu = torch.tensor(W.cu_seqlens(lens), dtype=torch.int32, device="cuda")

    def call():
        o = flamia.attention(q, k, v, cu, max(lens))
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
    print(f"{name} {'train' if train else 'forward'}: host {host:.3f} ms/call (no sync), event-timed median "
          f"{statistics.median(timed):.3f}, back-to-back {start.elapsed_time(end) / n:.3f} ms/call", flush=True)
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


def main(argv=None):
    args = parse_args(argv)
    import torch
    import flamia
    if not torch.cuda.is_available():
        sys.exit("host_overhead: needs a CUDA GPU")
    for name in args.names:
        probe(torch, flamia, name, False, args)
        probe(torch, flamia, name, True, args)


if __name__ == "__main__":
    main()
