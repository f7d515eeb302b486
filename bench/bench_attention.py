#!/usr/bin/env python3
"""Benchmark of flamia against the attention kernels a user would pick instead: the forward
(--pass forward, default) or the whole training call (--pass train: forward + backward).

docs/DESIGN.md §5: the nine packed causal workloads of bench/workloads.py (T = 65,536 packed
tokens, Hq = 16, Hkv = 16 or 4 for the GQA row, D = 128, causal, random normal BF16 inputs), each
implementation timed as the median of --rounds rounds after --warmup rounds, each workload in a
child process of its own (bench/attention/isolate.py: an implementation that crashes its process is
reported as 'crashed (signal N)' and the run goes on; --no-isolate runs all in one) (--schedule sequential, the default: each implementation's rounds back to back, then the next one's;
--schedule interleaved: a workload's implementations are set up together and each round times one
turn of each (its --calls-per-round calls), in an order rotated by one per round, so that all of
them sample the same stretch of the GPU's clock, which drops by up to ~10% partway through a run of
heavy calls; with every implementation's graph held at once, a capture may run out of memory and
that one is timed eager, as the table says):

  flamia          flamia.attention, MXFP8 (quantization of q, k, v (and dO) included)
  flamia-prefix   the same with isolation="prefix" (strict prefix isolation)
  flamia-deterministic  the same with deterministic=True (dQ in a pass of its own, bitwise repeatable;
                  the default reduces dQ from FP16 partials where they apply, docs/KERNELS.md)
  flamia-graph    the flamia call captured once in a CUDA graph and replayed (without --graph)
  jax-fa3         FlashAttention-3 varlen through JAX (the flash-attn3-jax wheel; on an offline GPU
                  machine from .carry/, see scripts/prepare_gpu_carry.sh), packed rows with cu_seqlens:
                  the BF16 baseline to beat
  cudnn-sdpa      cuDNN BF16 SDPA through torch, batched [B, H, L, D] (equal lengths only)
  fa2-varlen      FA2 varlen through torch.nn.attention.varlen.varlen_attn
  flex            FlexAttention (torch.compile) with a document-causal block mask (built once)
  jax-cudnn-bf16  cuDNN BF16 through JAX, packed rows (segment offsets) in one call
  jax-cudnn-fp8   cuDNN FP8 through JAX, per-tensor scales, batched (equal lengths only); its
                  inputs are E4M3 already (their quantization is not timed); forward only

Each round times --calls-per-round calls (default 4) dispatched back to back, per call: torch
implementations with CUDA events on the current stream around them, JAX ones with the wall clock up
to the last one's block_until_ready. So every implementation is timed the same way, by its GPU time
under back-to-back dispatch, as in a training loop (timed one at a time, a JAX call's number holds
the host's wake-up after its block_until_ready). With --graph (docs/DESIGN.md §5, "What is
timed") every torch implementation's call (its whole
training call with --pass train) is captured once in a CUDA graph and the replays are timed, so no
implementation's host time (Python, dispatcher, launches) is in its numbers; one that cannot be
captured is timed eager and says so in a note. JAX's calls are jitted either way. TFLOP/s count
visible pairs only: 4 * D * pairs * Hq / time for the forward, 3.5 times that for a training call
(the backward counted as 2.5 forwards). A training call is torch.autograd.grad of the output (in the
packed [T, Hq, D] layout) for a fixed random dO, or jax.vjp, so every implementation returns dq, dk,
dv. Peak memory is the torch allocator's peak during one call above what was allocated before it
(torch implementations only). Once a round, while the round's calls run, the bench reads the GPU's
SM clock and power-cap state through NVML (bench/gpu_monitor.py; read only, off with
--no-gpu-readings) and reports them in a table of their own, since the clock a call runs at decides
several ratios (under the power cap, implementations keep different clocks); with --energy-seconds S
it also runs each implementation's calls back to back for S seconds after its rounds and reports
their energy per call. --json and --markdown are rewritten after every workload (marked partial
until the run ends), so a run that dies keeps what it finished. Every baseline runs in its own
try/except: one that cannot run records
'unsupported: <reason>' and the run goes on. Each output (forward: o; train: dq) is compared with
flamia's (cosine), so a baseline computing a different mask shows up: one below 0.99 is reported as
'wrong outputs (cos ...)', without a time, and takes no part in the ratios (the columns flamia / FA3,
flamia / best BF16, flamia / cuDNN FP8).

Usage (repo root, GPU machine, with the package installed as README's "Usage" says, or with
PYTHONPATH=python FLAMIA_CAPI_LIB=build-gpu/libflamia_capi.so):
  python3 bench/bench_attention.py [--pass train] [--graph] [--workloads 16x4096,longtail]
                                   [--rounds 20] [--warmup 3] [--schedule interleaved]
                                   [--calls-per-round 4] [--impls flamia,fa2-varlen]
                                   [--json out.json] [--markdown out.md] [--no-isolate]
"""

import argparse
import datetime
import os
import pathlib
import platform
import sys

# Before anything imports JAX: let it allocate on demand next to torch's caching allocator.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_monitor  # noqa: E402
import workloads as W  # noqa: E402
from attention.impls import (IMPLS, TRAIN_FLOP_FACTOR, captured, import_flamia, log,  # noqa: E402,F401
                             short)
from attention.report import markdown, summarize, write_outputs  # noqa: E402,F401
from attention.isolate import Progress, child_launcher, run_isolated  # noqa: E402
from attention.timing import (CALLS_PER_ROUND, Prepared, run_interleaved, run_workload,  # noqa: E402,F401
                              torch_once)


def environment(torch):
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_torch": torch.version.cuda,
        "cudnn_torch": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
    }
    try:
        import jax
        meta["jax"] = jax.__version__
    except Exception as exc:
        meta["jax"] = f"unavailable ({short(exc, 100)})"
    return meta


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Workloads: " + ", ".join(W.WORKLOADS) + "\nImplementations: " +
                                ", ".join(IMPLS))
    p.add_argument("--pass", dest="pass_", choices=("forward", "train"), default="forward",
                   help="forward only, or the whole training call (forward + backward); default forward")
    p.add_argument("--workloads", default="all",
                   help="comma-separated workload names (default: all nine)")
    p.add_argument("--impls", default="all", help="comma-separated implementations (default: all)")
    p.add_argument("--rounds", type=int, default=20, help="timed rounds per implementation (median; default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    p.add_argument("--schedule", choices=("sequential", "interleaved"), default="sequential",
                   help="sequential (default): each implementation's rounds back to back; interleaved: all "
                        "implementations of a workload set up together and timed in turns, one turn each per "
                        "round")
    p.add_argument("--calls-per-round", type=int, default=CALLS_PER_ROUND,
                   help="calls dispatched back to back per timed round, the time per call (default "
                        f"{CALLS_PER_ROUND}; 1: one call a round, the host's launch or wake-up included)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the table as markdown")
    p.add_argument("--graph", action="store_true",
                   help="time every torch implementation replaying its call from a CUDA graph (docs/DESIGN.md §5)")
    p.add_argument("--no-check", action="store_true", help="skip the cosine check against flamia's output (and the refusal of outputs that fail it)")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing implementations")
    p.add_argument("--no-gpu-readings", action="store_true",
                   help="do not read the GPU's SM clock during the rounds (NVML; on by default)")
    p.add_argument("--energy-seconds", type=float, default=0.0,
                   help="after its timed rounds, run each implementation's calls back to back (untimed) for at "
                        "least this long and report their energy per call from the GPU's energy counter "
                        "(default 0: off; the counter advances every ~100 ms, so 1 s or more)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run every workload in this process (by default each runs in a child process of its "
                        "own, so that an implementation that crashes it is reported and the run goes on)")
    # A child process: one workload's implementations, its state kept in a JSON file for the parent.
    p.add_argument("--child-workload", help=argparse.SUPPRESS)
    p.add_argument("--child-impls", help=argparse.SUPPRESS)
    p.add_argument("--child-progress", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.gpu_monitor = gpu_monitor.GpuMonitor(None)  # readings off until main opens the device's
    if args.rounds < 1 or args.warmup < 0 or args.calls_per_round < 1 or args.energy_seconds < 0:
        p.error("--rounds and --calls-per-round must be >= 1, --warmup and --energy-seconds >= 0")

    def pick(text, known, what):
        if text == "all":
            return list(known)
        chosen = [s.strip() for s in text.split(",") if s.strip()]
        unknown = [s for s in chosen if s not in known]
        if unknown:
            p.error(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
        return chosen

    args.workload_names = pick(args.workloads, W.WORKLOADS, "workloads")
    args.impl_names = pick(args.impls, IMPLS, "implementations")
    if args.graph and args.impls == "all":
        args.impl_names.remove("flamia-graph")  # under --graph that is flamia itself
    return args


def log_result(impl, r):
    if r["status"] == "ok":
        extra = f", cos vs flamia {r['cos_vs_flamia']:.4f}" if "cos_vs_flamia" in r else ""
        if r.get("gpu"):
            extra += f", {r['gpu']['sm_mhz']:.0f} MHz"
            if "joules_per_call" in r["gpu"]:
                extra += f", {r['gpu']['joules_per_call']:.2f} J/call"
        log(f"bench:   {impl:15s} {r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s{extra}")
    else:
        log(f"bench:   {impl:15s} {r['status']}")


def open_device(args):
    """(torch, flamia, environment) of this process's GPU, the GPU readings opened; None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    flamia = import_flamia()
    meta = environment(torch)
    if not args.no_gpu_readings:
        args.gpu_monitor = gpu_monitor.open_monitor(torch, log)
    meta["gpu_readings"] = args.gpu_monitor.available
    meta["energy_seconds"] = args.energy_seconds if args.gpu_monitor.available else 0.0
    return torch, flamia, meta


def child_main(args):
    """--child-workload: one workload's --child-impls, the state kept in --child-progress for the parent."""
    progress = Progress(args.child_progress)
    device = open_device(args)
    if device is None:
        progress.fatal("no CUDA device")
        return 2
    torch, flamia, meta = device
    progress.set_meta(meta)
    impls = [i for i in args.child_impls.split(",") if i]
    run_workload(torch, flamia, args, args.child_workload, impls, progress)
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child_workload:
        return child_main(args)
    # flamia first (its output is the reference of the cosine checks), then the others.
    order = [i for i in IMPLS if i in args.impl_names]
    meta = {}
    if args.no_isolate:
        device = open_device(args)
        if device is None:
            log("bench: no CUDA device")
            return 2
        torch, flamia, meta = device
    rows = []
    for name in args.workload_names:
        if args.no_isolate:
            row = run_workload(torch, flamia, args, name, order)
        else:
            log(f"bench: {name}: in a process of its own")
            launch = child_launcher(pathlib.Path(__file__).resolve(), argv, name)
            results, child_meta, fatal = run_isolated(order, launch, log)
            if fatal:
                log(f"bench: {fatal}")
                return 2
            meta = meta or child_meta or {}
            row = workload_row(name, results, args.pass_ == "train")
        for impl, r in row["impls"].items():
            log_result(impl, r)
        summarize(row)
        rows.append(row)
        if len(rows) == 1:
            meta = run_meta(args, meta)
            log(f"bench: {meta.get('gpu')} (sm_{meta.get('capability')}), torch {meta.get('torch')}, "
                f"jax {meta.get('jax')}")
        if len(rows) < len(args.workload_names):
            write_outputs(args, meta, rows, complete=False)

    table = write_outputs(args, run_meta(args, meta), rows, complete=True)
    print(table)
    return 0


def workload_row(name, results, train):
    """A row of the report for results that came back from a child (the workload's shape from
    workloads.py: the parent has no inputs of its own)."""
    workload = W.WORKLOADS[name]
    lens = workload["lens"]
    flops = W.forward_flops(lens) * (TRAIN_FLOP_FACTOR if train else 1.0)
    return {"workload": name, "docs": len(lens), "max_len": max(lens), "pairs": W.pairs(lens),
            "q_heads": W.Q_HEADS, "kv_heads": W.kv_heads(workload), "head_dim": W.HEAD_DIM, "flops": flops,
            "impls": dict(results)}


def run_meta(args, meta):
    """The report's header: the environment a child (or this process) found and the run's settings."""
    meta = {**DEFAULT_META, **(meta or {})}
    meta.update(rounds=args.rounds, warmup=args.warmup, schedule=args.schedule,
                calls_per_round=args.calls_per_round, isolated=not args.no_isolate,
                **{"pass": args.pass_}, graph=args.graph, seed=args.seed, tokens=W.TOTAL, q_heads=W.Q_HEADS,
                head_dim=W.HEAD_DIM, implementations={k: IMPLS[k] for k in args.impl_names})
    return meta


# What the header says when no child reported its environment (every child crashed at its start).
DEFAULT_META = {"gpu": "unknown GPU", "torch": "n/a", "jax": "n/a", "cudnn_torch": "n/a", "date": "n/a",
                "gpu_readings": False, "energy_seconds": 0.0}

if __name__ == "__main__":
    sys.exit(main())
