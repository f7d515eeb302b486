"""Timing one implementation on one workload: its rounds (CUDA events for torch, the wall clock to
block_until_ready for JAX), the CUDA-graph capture under --graph, the cosine check of its output
against the reference's, and a workload's schedules (sequential, interleaved)."""

import argparse
import statistics
import time
import traceback

import gpu_monitor
from attention.impls import (COSINE_MIN, FLAMIA_IMPLS, JAX_SETUPS, REFERENCE_IMPL, TORCH_SETUPS, Case,
                             Unsupported,
                             captured, jax_training_call, log, short, training_call)
from attention.isolate import Progress
import workloads as W

NO_PROGRESS = Progress(None)

def torch_once(torch, fn, calls):
    """once(during=None) -> (ms, out): `calls` fn() calls dispatched back to back, timed with CUDA
    events on the current stream around them, per call; during(), if given, runs once they are all
    dispatched, while the GPU runs them (the meter's clock read: outside the GPU's critical path)."""
    def once(during=None):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            out = fn()
        end.record()
        if during is not None:
            during()
        end.synchronize()
        return start.elapsed_time(end) / calls, out
    return once


# One call per round (--calls-per-round 1) puts the host's wake-up after block_until_ready in a JAX
# call's number (JAX's cuDNN BF16 forward on 8192+224x256 measured 0.97 ms a call that way, 0.74 back
# to back); a graph replay measured the same either way (flamia's tiny-unaligned forward 0.771 ms one
# a round, 0.772 four). Every implementation is timed alike.
CALLS_PER_ROUND = 4


def jax_once(jax, fn, args, calls):
    """once(during=None) -> (ms, out): `calls` jitted calls dispatched back to back, the wall clock up
    to the last one's block_until_ready, per call (JAX runs them in order on one stream); during(),
    if given, runs once they are all dispatched, while the GPU runs them."""
    def once(during=None):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        if during is not None:
            during()
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) * 1e3 / calls, out
    return once


def peak_memory_mib(torch, fn):
    """The torch allocator's peak during one fn() call above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


# A workload of none of the nine shapes (equal lengths, so every torch implementation runs it).
PRIMER_LENS = [W.TOTAL // 32] * 32


def prime_captures(torch, flamia, args, impls, progress=NO_PROGRESS):
    """--graph: one untimed capture of each torch implementation on PRIMER_LENS first. On the H200
    (torch 2.11) cuDNN SDPA's first training-call capture in a process fails, and so does every later
    capture of that shape, while other shapes then capture; the primer takes that failure."""
    case = Case(torch, "primer", {"lens": PRIMER_LENS}, args.seed, train=args.pass_ == "train")
    quiet = argparse.Namespace(**{**vars(args), "rounds": 1, "warmup": 0, "no_check": True, "energy_seconds": 0.0})
    for impl in impls:
        if impl in TORCH_SETUPS:
            progress.start(impl, "capture primer")
            r = run_impl(torch, flamia, case, impl, quiet)
            log(f"bench: primer {impl}: {'captured' if r.get('graph') else r.get('note') or r['status']}")
    progress.idle()
    del case
    torch.cuda.empty_cache()


def cosine(torch, a, b):
    a, b = a.float().flatten(), b.float().flatten()
    return float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-30))


class Prepared:
    """One implementation set up and warmed up on one workload: step() times one more round, and
    `meter` (gpu_monitor.Meter) reads the GPU's clock and energy over it."""

    def __init__(self, impl, once, to_packed, result, meter=None, calls=1):
        self.impl, self.once, self.to_packed, self.result = impl, once, to_packed, result
        self.meter = meter if meter is not None else gpu_monitor.GpuMonitor(None).meter()
        self.calls = calls
        self.times, self.out = [], None

    def step(self):
        ms, self.out = self.once(self.meter.read_clock)
        self.times.append(ms)

    def measure_energy(self, seconds):
        """Rounds back to back for at least `seconds` (untimed), read by the meter's energy counter."""
        if seconds <= 0:
            return
        with self.meter.energy_window() as w:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                self.once()
                w.calls += self.calls


def failed(impl, exc, args):
    """The result of an implementation that raised: unsupported, or an error if it is flamia's."""
    if isinstance(exc, Unsupported):
        return {"status": f"unsupported: {exc}"}
    if args.verbose:
        traceback.print_exc()
    return {"status": f"{'error' if impl in FLAMIA_IMPLS else 'unsupported'}: {short(exc)}"}


def prepare(torch, flamia, case, impl, args):
    """Set up, (with --graph) capture and warm up one implementation: a Prepared, or the result dict
    of one that cannot run (never raises)."""
    result = {"status": "ok"}
    try:
        if impl in TORCH_SETUPS:
            fn, to_packed = TORCH_SETUPS[impl](torch, flamia, case)
            if case.train and not getattr(fn, "captured", False):
                fn, to_packed = training_call(torch, case, fn, to_packed)
            for t in (case.q, case.k, case.v):
                t.grad = None  # a setup's trial backward may have left some
            result["peak_mib"] = peak_memory_mib(torch, fn)  # eager (a graph's memory is taken at capture)
            if args.graph and not getattr(fn, "captured", False):
                # Two attempts, the second after more warm-up calls. (cuDNN SDPA's first training-call
                # capture in a process fails in both: prime_captures takes that one.)
                failure = None  # the last attempt's error
                for attempt in (1, 2):
                    try:
                        fn = captured(torch, fn, warmup=2 if attempt == 1 else 10)
                        result["graph"] = True
                        if attempt == 2:
                            result["note"] = f"captured at the second attempt (the first: {failure})"
                        break
                    except Exception as exc:  # timed eager instead, and said so
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()  # what the failed capture left in the allocator
                        failure = short(exc, 160)
                        log(f"bench:   {impl}: CUDA graph capture failed ({failure})")
                if not result.get("graph"):
                    result["note"] = f"timed eager: CUDA graph capture failed twice ({failure})"
                    result["graph"] = False
            once = torch_once(torch, fn, args.calls_per_round)
        else:
            torch.cuda.synchronize()
            jf, jargs, to_packed, note = JAX_SETUPS[impl](torch, flamia, case)
            if note:
                result["note"] = note
            if case.train:
                jf, jargs, to_packed = jax_training_call(torch, case, jf, jargs)
            import jax
            jax.block_until_ready(jf(*jargs))  # compiles
            once = jax_once(jax, jf, jargs, args.calls_per_round)
        for _ in range(args.warmup):
            once()
        torch.cuda.synchronize()
        return Prepared(impl, once, to_packed, result, args.gpu_monitor.meter(), args.calls_per_round)
    except Exception as exc:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return failed(impl, exc, args)


def finish(torch, case, prepared, args):
    """The result of a prepared implementation's timed calls: median, TFLOP/s, and the cosine check of
    its last output against the reference's (check_output)."""
    result = prepared.result
    ms = statistics.median(prepared.times)
    result.update(ms=ms, tflops=case.flops / (ms * 1e-3) / 1e12, times_ms=[round(t, 4) for t in prepared.times])
    gpu = prepared.meter.summary()
    if gpu is not None:
        result["gpu"] = gpu
    if not args.no_check:
        try:
            packed = prepared.to_packed(prepared.out)
        except Exception as exc:
            packed = exc
        check_output(torch, case, prepared.impl, packed, result)
    prepared.out = None
    return result


def check_output(torch, case, impl, packed, result):
    """The cosine check of one implementation's output (o, or dq when training; an exception when it
    could not be read back) against the reference: flamia's, or while flamia has none, the first
    output that was read back. An output that fails it, or that cannot be checked, is refused: its
    status says so and its time moves to refused_ms / refused_tflops, out of the table and the ratios."""
    if isinstance(packed, Exception):
        return refuse(result, f"wrong outputs (unreadable: {short(packed, 120)})")
    if case.reference_o is None or (impl == REFERENCE_IMPL and case.reference_impl != REFERENCE_IMPL):
        case.reference_o, case.reference_impl = packed.clone(), impl
        if impl != REFERENCE_IMPL:
            result["reference"] = True  # the others' reference (flamia's output is missing)
        return result
    cos = cosine(torch, packed, case.reference_o)
    result["cos"], result["cos_reference"] = cos, case.reference_impl
    if case.reference_impl == REFERENCE_IMPL:
        result["cos_vs_flamia"] = cos
    if not cos >= COSINE_MIN:  # (NaN fails too)
        refuse(result, f"wrong outputs (cos {cos:.4f})")
        result["note"] = f"its output's cosine to {case.reference_impl}'s is {cos:.4f} (below {COSINE_MIN})"
    return result


def refuse(result, status):
    """Marks an implementation's result as not reportable: no time in the table or the ratios."""
    result["status"] = status
    for key in ("ms", "tflops"):
        if key in result:
            result[f"refused_{key}"] = result.pop(key)
    return result


def run_impl(torch, flamia, case, impl, args):
    """One implementation on one workload, its rounds back to back: a result dict (never raises)."""
    prepared = prepare(torch, flamia, case, impl, args)
    if isinstance(prepared, dict):
        return prepared
    try:
        for _ in range(args.rounds):
            prepared.step()
        prepared.measure_energy(args.energy_seconds)
        return finish(torch, case, prepared, args)
    except Exception as exc:
        return failed(impl, exc, args)
    finally:
        del prepared
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_interleaved(torch, flamia, case, order, args, progress=NO_PROGRESS):
    """Every implementation of `order` on one workload, set up together and timed in turns: round r
    times one turn of each (its once(): --calls-per-round calls), starting at the r-th, so all of
    them sample the same stretch of the GPU's clock (it drops by up to ~10% partway through a run of
    back-to-back heavy calls) and none always follows the same neighbour. {impl: result dict}."""
    results, prepared = {}, {}
    for impl in order:
        t0 = time.perf_counter()
        progress.start(impl, "setup")
        p = prepare(torch, flamia, case, impl, args)
        if isinstance(p, dict):
            results[impl] = p
        else:
            prepared[impl] = p
            log(f"bench:   {impl:15s} ready ({time.perf_counter() - t0:.1f} s)")
    for r in range(args.rounds):
        active = list(prepared)
        k = r % len(active) if active else 0
        for impl in active[k:] + active[:k]:
            progress.start(impl)
            try:
                prepared[impl].step()
            except Exception as exc:  # (a CUDA error is sticky: the first one logged names the culprit)
                results[impl] = failed(impl, exc, args)
                log(f"bench:   {impl:15s} failed in round {r}: {results[impl]['status']}")
                del prepared[impl]
    for impl in order:  # flamia first: its output is the others' reference
        if impl in prepared:
            progress.start(impl, "energy and output check")
            try:
                prepared[impl].measure_energy(args.energy_seconds)
            except Exception as exc:
                results[impl] = failed(impl, exc, args)
                del prepared[impl]
                continue
            results[impl] = finish(torch, case, prepared.pop(impl), args)
    for impl in order:
        progress.finish(impl, results[impl])
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {impl: results[impl] for impl in order}




def run_sequential(order, run_one, progress=NO_PROGRESS):
    """--schedule sequential: run_one(impl) (a result dict) for each implementation in turn, each
    marked running in `progress` while it runs. {impl: result}."""
    results = {}
    for impl in order:
        progress.start(impl)
        t0 = time.perf_counter()
        results[impl] = run_one(impl)
        progress.finish(impl, results[impl])
        log(f"bench:   {impl:15s} done ({time.perf_counter() - t0:.1f} s)")
    return results


def run_workload(torch, flamia, args, name, impls, progress=NO_PROGRESS):
    """One workload's row: `impls` (flamia first when there) set up on its inputs and timed by
    args.schedule. With the cosine check on and flamia not among them, flamia's output is computed
    first (one untimed round) as the reference. The row dict, its "impls" those of `impls`."""
    workload = W.WORKLOADS[name]
    train = args.pass_ == "train"
    if args.graph:
        prime_captures(torch, flamia, args, impls, progress)
    case = Case(torch, name, workload, args.seed, train=train)
    log(f"bench: {name}: {len(case.lens)} docs, max {case.max_len}, Hkv {case.hkv}, "
        f"pairs {case.pairs:,}, {case.flops / 1e12:.2f} TFLOP")
    row = {"workload": name, "docs": len(case.lens), "max_len": case.max_len, "pairs": case.pairs,
           "q_heads": case.hq, "kv_heads": case.hkv, "head_dim": case.d, "flops": case.flops, "impls": {}}
    if not args.no_check and REFERENCE_IMPL not in impls:
        quiet = argparse.Namespace(**{**vars(args), "rounds": 1, "warmup": 0, "energy_seconds": 0.0})
        progress.start(REFERENCE_IMPL, "reference output")
        reference = run_impl(torch, flamia, case, REFERENCE_IMPL, quiet)
        progress.idle()
        log(f"bench:   {REFERENCE_IMPL} (reference output only): {reference['status']}")
    if args.schedule == "interleaved":
        results = run_interleaved(torch, flamia, case, list(impls), args, progress)
    else:
        results = run_sequential(impls, lambda impl: run_impl(torch, flamia, case, impl, args), progress)
    row["impls"] = {impl: results[impl] for impl in impls}
    case = None  # the inputs, before the next workload's
    torch.cuda.empty_cache()
    return row
