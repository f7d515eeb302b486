#!/usr/bin/env python3
"""Benchmark of flamia against the attention kernels a user would pick instead: the forward
(--pass forward, default) or the whole training call (--pass train: forward + backward).

DESIGN.md section 5: the nine packed causal workloads of bench/workloads.py (T = 65,536 packed
tokens, Hq = 16, Hkv = 16 or 4 for the GQA row, D = 128, causal, random normal BF16 inputs), each
implementation timed as the median of --rounds rounds after --warmup rounds, in one process
(--schedule sequential, the default: each implementation's rounds back to back, then the next one's;
--schedule interleaved: a workload's implementations are set up together and each round times one
turn of each (its --calls-per-round calls), in an order rotated by one per round, so that all of
them sample the same stretch of the GPU's clock, which drops by up to ~10% partway through a run of
heavy calls; with every implementation's graph held at once, a capture may run out of memory and
that one is timed eager, as the table says):

  flamia          flamia.attention, MXFP8 (quantization of q, k, v (and dO) included)
  flamia-prefix   the same with isolation="prefix" (strict prefix isolation)
  flamia-graph    the flamia call captured once in a CUDA graph and replayed (without --graph)
  cudnn-sdpa      cuDNN BF16 SDPA through torch, batched [B, H, L, D] (equal lengths only)
  fa2-varlen      FA2 varlen through torch.nn.attention.varlen.varlen_attn
  flex            FlexAttention (torch.compile) with a document-causal block mask (built once)
  jax-cudnn-bf16  cuDNN BF16 through JAX, packed rows (segment offsets) in one call
  jax-cudnn-fp8   cuDNN FP8 through JAX, per-tensor scales, batched (equal lengths only); its
                  inputs are E4M3 already (their quantization is not timed)

Each round times --calls-per-round calls (default 4) dispatched back to back, per call: torch
implementations with CUDA events on the current stream around them, JAX ones with the wall clock up
to the last one's block_until_ready. So every implementation is timed the same way, by its GPU time
under back-to-back dispatch, as in a training loop (timed one at a time, a JAX call's number holds
the host's wake-up after its block_until_ready). With --graph (DESIGN.md
section 5: "inside a CUDA graph where possible") every torch implementation's call (its whole
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
flamia's (cosine), so a baseline computing a different mask shows up.

Usage (repo root, GPU machine, after `pip install --no-build-isolation --no-deps .`, or with
PYTHONPATH=python FLAMIA_CAPI_LIB=build-gpu/libflamia_capi.so):
  python3 bench/bench_attention.py [--pass train] [--graph] [--workloads 16x4096,longtail]
                                   [--rounds 20] [--warmup 3] [--schedule interleaved]
                                   [--calls-per-round 4] [--impls flamia,fa2-varlen]
                                   [--json out.json] [--markdown out.md]
"""

import argparse
import datetime
import inspect
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
import traceback

# Before anything imports JAX: let it allocate on demand next to torch's caching allocator.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import gpu_monitor  # noqa: E402
import workloads as W  # noqa: E402

IMPLS = {
    "flamia": "flamia MXFP8 (incl. quantization)",
    "flamia-prefix": "flamia MXFP8, isolation=prefix",
    "flamia-graph": "flamia MXFP8, CUDA graph replay",
    "cudnn-sdpa": "cuDNN BF16 SDPA (torch, batched; equal lengths)",
    "fa2-varlen": "FA2 varlen (torch.nn.attention.varlen)",
    "flex": "FlexAttention + document mask (torch.compile)",
    "jax-cudnn-bf16": "cuDNN BF16 (JAX, packed segment offsets)",
    "jax-cudnn-fp8": "cuDNN FP8 (JAX, per-tensor scales; equal lengths)",
}
FLAMIA_IMPLS = ("flamia", "flamia-prefix", "flamia-graph")
BF16_BASELINES = ("cudnn-sdpa", "fa2-varlen", "flex", "jax-cudnn-bf16")
FP8_BASELINE = "jax-cudnn-fp8"
COSINE_WARN = 0.99  # an output this far from flamia's computes something else


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Unsupported(Exception):
    """The implementation cannot run this workload (reason in the message)."""


def short(exc, limit=300):
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# flamia import: the installed package, else the source tree (python/) with a built library.

def import_flamia():
    try:
        import flamia
    except ImportError:
        sys.path.insert(0, str(REPO / "python"))
        import flamia
    from flamia import _capi

    if not os.environ.get(_capi.ENV_LIBRARY) and not _capi.library_path().is_file():
        for build in ("build-gpu", "build-py", "build"):
            candidate = REPO / build / _capi.LIBRARY_NAME
            if candidate.is_file():
                os.environ[_capi.ENV_LIBRARY] = str(candidate)
                log(f"bench: using {candidate} ({_capi.ENV_LIBRARY} was not set)")
                break
    return flamia


# ---------------------------------------------------------------------------------------------
# Timing.

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
# call's number (session 34: JAX's cuDNN BF16 forward on 8192+224x256 measured 0.97 ms a call that way,
# 0.74 back to back); a graph replay measured the same either way (session 35: flamia's tiny-unaligned
# forward 0.771 ms one a round, 0.772 four). Every implementation is timed alike.
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


# ---------------------------------------------------------------------------------------------
# One workload's shared state.

class Case:
    def __init__(self, torch, name, workload, seed, train=False):
        self.name = name
        self.lens = list(workload["lens"])
        self.hq, self.hkv, self.d = W.Q_HEADS, W.kv_heads(workload), W.HEAD_DIM
        self.t = W.TOTAL
        self.max_len = max(self.lens)
        self.pairs = W.pairs(self.lens)
        self.train = train
        self.flops = W.forward_flops(self.lens, self.hq, self.d) * (TRAIN_FLOP_FACTOR if train else 1.0)
        self.scale = 1.0 / math.sqrt(self.d)
        # With train, views taken by the setups below carry gradients back to these leaves.
        self.q, self.k, self.v, self.dout, self.cu = W.workload_inputs(torch, workload, requires_grad=train,
                                                                       seed=seed)
        self.equal = W.equal_lengths(self.lens)
        self.reference_o = None  # flamia's output (o, or dq when training), for the cosine checks


TRAIN_FLOP_FACTOR = 3.5  # forward + backward, the backward counted as 2.5 forwards


def training_call(torch, case, fn, to_packed):
    """A training call from a forward: (dq, dk, dv) of to_packed(fn()) for the fixed dO."""
    def train():
        return torch.autograd.grad(to_packed(fn()), (case.q, case.k, case.v), case.dout)
    return train, lambda grads: grads[0]


# ---------------------------------------------------------------------------------------------
# Implementations: each returns (fn, to_packed) for torch, or raises Unsupported.
# to_packed(out) turns the implementation's output into a [T, Hq, D] torch tensor.

def setup_flamia(torch, flamia, case, **kwargs):
    def fn():
        return flamia.attention(case.q, case.k, case.v, case.cu, case.max_len, causal=True,
                                softmax_scale=case.scale, **kwargs)
    return fn, lambda out: out


def setup_flamia_prefix(torch, flamia, case):
    return setup_flamia(torch, flamia, case, isolation="prefix")


def captured(torch, call, warmup=2):
    """call() captured once in a CUDA graph (after `warmup` calls on the stream it is captured on, as
    torch's capture wants: lazy initialization, compilation, per-stream library handles and the
    allocator's warm-up happen outside the graph); the returned fn() replays it and returns the
    captured call's (static) output. fn holds call, and with it every tensor its closure holds: the
    graph's kernels read them at fixed addresses (FlexAttention's block mask and document ids, for
    one), so they must live as long as the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            call()
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static_out = call()
    torch.cuda.current_stream().wait_stream(side)

    def fn():
        graph.replay()
        return static_out

    fn.graph = graph  # keep the graph alive with the closure
    fn.call = call  # and what it reads: freed, torch.cuda.empty_cache() would unmap it under the graph
    return fn


def setup_flamia_graph(torch, flamia, case):
    forward, _ = setup_flamia(torch, flamia, case)
    call, to_packed = training_call(torch, case, forward, lambda o: o) if case.train else (forward, lambda o: o)
    fn = captured(torch, call)
    fn.captured = True  # already a training call when case.train
    return fn, to_packed


def setup_cudnn_sdpa(torch, flamia, case):
    if not case.equal:
        raise Unsupported("documents of unequal length: a batched [B, H, L, D] call cannot express them")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, length = len(case.lens), case.lens[0]
    q = case.q.view(b, length, case.hq, case.d).transpose(1, 2)
    k = case.k.view(b, length, case.hkv, case.d).transpose(1, 2)
    v = case.v.view(b, length, case.hkv, case.d).transpose(1, 2)
    kwargs = {"is_causal": True, "scale": case.scale}

    def make(q, k, v, extra):
        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, **kwargs, **extra)
        return fn

    fn = make(q, k, v, {})
    if case.hkv != case.hq:
        try:
            fn = make(q, k, v, {"enable_gqa": True})
            out = fn()
            if case.train:
                out.backward(torch.ones_like(out))
        except Exception as exc:  # cuDNN through torch may not take enable_gqa: repeat K and V
            log(f"bench:   cudnn-sdpa: enable_gqa failed ({short(exc)}); repeating K/V heads inside the call")
            fn = make_repeated(make, q, k, v, case.hq // case.hkv)
    return fn, lambda out: out.transpose(1, 2).reshape(case.t, case.hq, case.d)


def make_repeated(make, q, k, v, group):
    def fn():
        return make(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), {})()
    return fn


def setup_fa2_varlen(torch, flamia, case):
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise Unsupported(f"torch.nn.attention.varlen is not available ({short(exc)})")
    params = inspect.signature(varlen_attn).parameters
    kwargs = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)  # (-1, 0) is its spelling of causal
    elif "is_causal" in params:
        kwargs["is_causal"] = True
    elif "causal" in params:
        kwargs["causal"] = True
    else:
        raise Unsupported(f"varlen_attn{inspect.signature(varlen_attn)} has no causal option")
    if "scale" in params:
        kwargs["scale"] = case.scale

    def fn():
        return varlen_attn(case.q, case.k, case.v, case.cu, case.cu, case.max_len, case.max_len, **kwargs)

    return fn, lambda out: out[0] if isinstance(out, tuple) else out


_flex_compiled = None


def setup_flex(torch, flamia, case):
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _flex_compiled is None:
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    lens = torch.tensor(case.lens, device="cuda")
    doc = torch.repeat_interleave(torch.arange(len(case.lens), device="cuda", dtype=torch.int32), lens)

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    mask_kwargs = {"device": "cuda"}
    if "_compile" in inspect.signature(create_block_mask).parameters:
        mask_kwargs["_compile"] = True
    block_mask = create_block_mask(document_causal, 1, None, case.t, case.t, **mask_kwargs)  # outside timing

    q = case.q.unsqueeze(0).transpose(1, 2)  # [1, H, T, D]
    k = case.k.unsqueeze(0).transpose(1, 2)
    v = case.v.unsqueeze(0).transpose(1, 2)
    kwargs = {"block_mask": block_mask, "scale": case.scale}
    if case.hkv != case.hq:
        kwargs["enable_gqa"] = True

    def fn():
        return _flex_compiled(q, k, v, **kwargs)

    return fn, lambda out: out[0].transpose(0, 1)


# ---- JAX ----

_jax_modules = None


def import_jax():
    """(jax, jnp, fused_attention_stablehlo), or Unsupported."""
    global _jax_modules
    if _jax_modules is None:
        try:
            import jax
            import jax.numpy as jnp
            from jax._src.cudnn import fused_attention_stablehlo as fas
        except Exception as exc:
            raise Unsupported(f"JAX with cuDNN attention is not importable ({short(exc)})")
        try:
            gpus = jax.devices("gpu")
        except Exception as exc:
            raise Unsupported(f"JAX has no GPU backend ({short(exc)})")
        if not gpus:
            raise Unsupported("JAX sees no GPU")
        _jax_modules = (jax, jnp, fas)
    return _jax_modules


def torch_to_jax(torch, jax, jnp, t):
    """A BF16 torch CUDA tensor as a JAX array on the GPU (zero-copy through DLPack when possible)."""
    torch.cuda.synchronize()
    t = t.detach()  # the training benchmark's inputs require grad
    try:
        return jax.dlpack.from_dlpack(t.contiguous())
    except Exception:
        return jax.device_put(jnp.asarray(t.float().cpu().numpy()).astype(jnp.bfloat16), jax.devices("gpu")[0])


def jax_to_torch(torch, jax, x):
    jax.block_until_ready(x)
    try:
        return torch.from_dlpack(x)
    except Exception:
        import numpy as np
        return torch.from_numpy(np.asarray(x.astype("float32"))).cuda()


def setup_jax_cudnn_bf16(torch, flamia, case):
    jax, jnp, fas = import_jax()
    q = torch_to_jax(torch, jax, jnp, case.q)[None]  # [1, T, H, D]: BTNH
    k = torch_to_jax(torch, jax, jnp, case.k)[None]
    v = torch_to_jax(torch, jax, jnp, case.v)[None]
    note = ""
    if len(case.lens) == 1:
        def f(q, k, v):
            return fas.dot_product_attention(q, k, v, scale=case.scale, mask_type=fas.MaskType.CAUSAL,
                                             qkv_layout="BTNH")
        jf, args = jax.jit(f), (q, k, v)
        jax.block_until_ready(jf(*args))
        note = "one document: plain causal"
    else:
        params = inspect.signature(fas.dot_product_attention).parameters
        if "q_offsets" not in params:
            raise Unsupported(f"fused_attention_stablehlo.dot_product_attention has no q_offsets "
                              f"(signature {inspect.signature(fas.dot_product_attention)})")
        # One packed row with N segments: offsets [1, N + 1] (the cu_seqlens), lengths [1, N].
        offsets = jnp.asarray([W.cu_seqlens(case.lens)], dtype=jnp.int32)
        seqlens = jnp.asarray([case.lens], dtype=jnp.int32)
        jf = None
        errors = []
        for mask_name in ("PADDING_CAUSAL", "CAUSAL"):
            mask_type = getattr(fas.MaskType, mask_name)

            def f(q, k, v, seqlens, offsets, mask_type=mask_type):
                return fas.dot_product_attention(q, k, v, q_seqlen=seqlens, kv_seqlen=seqlens, q_offsets=offsets,
                                                 kv_offsets=offsets, scale=case.scale, mask_type=mask_type,
                                                 qkv_layout="BTNH")
            try:
                candidate = jax.jit(f)
                jax.block_until_ready(candidate(q, k, v, seqlens, offsets))
            except Exception as exc:
                errors.append(f"{mask_name}: {short(exc, 200)}")
                continue
            jf, note = candidate, f"packed segment offsets, mask {mask_name}"
            break
        if jf is None:
            raise Unsupported("; ".join(errors))
        args = (q, k, v, seqlens, offsets)
    return jf, args, lambda out: jax_to_torch(torch, jax, out)[0], note


def setup_jax_cudnn_fp8(torch, flamia, case):
    if not case.equal:
        raise Unsupported("documents of unequal length: the FP8 path takes no q_seqlen/kv_seqlen/offsets")
    jax, jnp, fas = import_jax()
    params = inspect.signature(fas.dot_product_attention).parameters
    if "use_fp8" not in params or "fp8_params" not in params:
        raise Unsupported(f"no use_fp8/fp8_params in dot_product_attention{inspect.signature(fas.dot_product_attention)}")
    b, length = len(case.lens), case.lens[0]

    def fp8(t, heads):
        # Random normal values lie well inside E4M3's range: scale 1, descale 1 (per tensor).
        x = torch_to_jax(torch, jax, jnp, t).reshape(b, length, heads, case.d)
        return x.astype(jnp.float8_e4m3fn)

    q, k, v = fp8(case.q, case.hq), fp8(case.k, case.hkv), fp8(case.v, case.hkv)
    keys = getattr(fas, "fp8_params_keys", None) or list(getattr(fas.FP8Params, "__annotations__", {}))
    if not keys:
        raise Unsupported("cannot find the FP8 parameter names (fp8_params_keys / FP8Params)")
    fp8_params = {name: jnp.ones((1, 1, 1, 1), dtype=jnp.float32) for name in keys}
    # P in [0, 1] is stored as E4M3 scaled by scale_s (unscaled, most of a long row's probabilities
    # would flush to zero); the output is descaled by descale_s. Powers of two, exact.
    if "scale_s" in fp8_params and "descale_s" in fp8_params:
        fp8_params["scale_s"] = jnp.full((1, 1, 1, 1), 256.0, dtype=jnp.float32)
        fp8_params["descale_s"] = jnp.full((1, 1, 1, 1), 1.0 / 256.0, dtype=jnp.float32)

    def f(q, k, v, fp8_params):
        out = fas.dot_product_attention(q, k, v, fp8_params=fp8_params, scale=case.scale,
                                        mask_type=fas.MaskType.CAUSAL, qkv_layout="BTNH", use_fp8=True)
        return out[0] if isinstance(out, (tuple, list)) else out

    jf = jax.jit(f)
    jax.block_until_ready(jf(q, k, v, fp8_params))

    def to_packed(out):
        return jax_to_torch(torch, jax, out.astype(jnp.bfloat16)).reshape(case.t, case.hq, case.d)

    return jf, (q, k, v, fp8_params), to_packed, "inputs pre-quantized to E4M3 (not timed); scale_s 256"


def jax_training_call(torch, case, jf, args):
    """A training call from a jitted JAX forward jf(q, k, v, *rest): jax.vjp for the fixed dO,
    returning (dq, dk, dv); to_packed gives dq as [T, Hq, D]."""
    jax, jnp, _ = import_jax()
    out = jax.block_until_ready(jf(*args))
    dout = torch_to_jax(torch, jax, jnp, case.dout).reshape(out.shape).astype(out.dtype)
    rest = tuple(args[3:])

    def train(q, k, v, dout, *rest):
        _, vjp = jax.vjp(lambda q, k, v: jf(q, k, v, *rest), q, k, v)
        return vjp(dout)

    jt = jax.jit(train)
    targs = (*args[:3], dout, *rest)
    jax.block_until_ready(jt(*targs))

    def to_packed(grads):
        return jax_to_torch(torch, jax, grads[0].astype(jnp.bfloat16)).reshape(case.t, case.hq, case.d)

    return jt, targs, to_packed


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


TORCH_SETUPS = {
    "flamia": setup_flamia,
    "flamia-prefix": setup_flamia_prefix,
    "flamia-graph": setup_flamia_graph,
    "cudnn-sdpa": setup_cudnn_sdpa,
    "fa2-varlen": setup_fa2_varlen,
    "flex": setup_flex,
}
JAX_SETUPS = {
    "jax-cudnn-bf16": setup_jax_cudnn_bf16,
    "jax-cudnn-fp8": setup_jax_cudnn_fp8,
}


# A workload of none of the nine shapes (equal lengths, so every torch implementation runs it).
PRIMER_LENS = [W.TOTAL // 32] * 32


def prime_captures(torch, flamia, args, impls):
    """--graph: one untimed capture of each torch implementation on PRIMER_LENS first. On the H200
    (torch 2.11) cuDNN SDPA's first training-call capture in a process fails, and so does every later
    capture of that shape, while other shapes then capture; the primer takes that failure."""
    case = Case(torch, "primer", {"lens": PRIMER_LENS}, args.seed, train=args.pass_ == "train")
    quiet = argparse.Namespace(**{**vars(args), "rounds": 1, "warmup": 0, "no_check": True, "energy_seconds": 0.0})
    for impl in impls:
        if impl in TORCH_SETUPS:
            r = run_impl(torch, flamia, case, impl, quiet)
            log(f"bench: primer {impl}: {'captured' if r.get('graph') else r.get('note') or r['status']}")
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
    """The result of a prepared implementation's timed calls: median, TFLOP/s, the cosine check of its
    last output against flamia's (flamia's own output becomes the reference)."""
    result = prepared.result
    ms = statistics.median(prepared.times)
    result.update(ms=ms, tflops=case.flops / (ms * 1e-3) / 1e12, times_ms=[round(t, 4) for t in prepared.times])
    gpu = prepared.meter.summary()
    if gpu is not None:
        result["gpu"] = gpu
    if not args.no_check:
        try:
            packed = prepared.to_packed(prepared.out)
            if prepared.impl == "flamia":
                case.reference_o = packed.clone()
            elif case.reference_o is not None:
                result["cos_vs_flamia"] = cosine(torch, packed, case.reference_o)
                if result["cos_vs_flamia"] < COSINE_WARN:
                    result["warning"] = f"output differs from flamia's (cosine {result['cos_vs_flamia']:.4f})"
        except Exception as exc:
            result["check_error"] = short(exc)
    prepared.out = None
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


def run_interleaved(torch, flamia, case, order, args):
    """Every implementation of `order` on one workload, set up together and timed in turns: round r
    times one turn of each (its once(): --calls-per-round calls), starting at the r-th, so all of
    them sample the same stretch of the GPU's clock (it drops by up to ~10% partway through a run of
    back-to-back heavy calls) and none always follows the same neighbour. {impl: result dict}."""
    results, prepared = {}, {}
    for impl in order:
        t0 = time.perf_counter()
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
            try:
                prepared[impl].step()
            except Exception as exc:  # (a CUDA error is sticky: the first one logged names the culprit)
                results[impl] = failed(impl, exc, args)
                log(f"bench:   {impl:15s} failed in round {r}: {results[impl]['status']}")
                del prepared[impl]
    for impl in order:  # flamia first: its output is the others' reference
        if impl in prepared:
            try:
                prepared[impl].measure_energy(args.energy_seconds)
            except Exception as exc:
                results[impl] = failed(impl, exc, args)
                del prepared[impl]
                continue
            results[impl] = finish(torch, case, prepared.pop(impl), args)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {impl: results[impl] for impl in order}


# ---------------------------------------------------------------------------------------------
# Report.

def summarize(row):
    impls = row["impls"]

    def tflops(name):
        r = impls.get(name, {})
        return r.get("tflops") if r.get("status") == "ok" else None

    flamia_tf = tflops("flamia")
    best_name, best_tf = None, None
    for name in BF16_BASELINES:
        tf = tflops(name)
        if impls.get(name, {}).get("warning"):
            continue  # its output is not this attention: no fair comparison
        if tf is not None and (best_tf is None or tf > best_tf):
            best_name, best_tf = name, tf
    row["best_bf16"] = best_name
    row["ratio_vs_best_bf16"] = flamia_tf / best_tf if flamia_tf and best_tf else None
    fp8_tf = tflops(FP8_BASELINE) if not impls.get(FP8_BASELINE, {}).get("warning") else None
    row["ratio_vs_cudnn_fp8"] = flamia_tf / fp8_tf if flamia_tf and fp8_tf else None
    prefix_tf = tflops("flamia-prefix")
    row["prefix_time_ratio"] = flamia_tf / prefix_tf if flamia_tf and prefix_tf else None  # prefix ms / default ms

    def joules(name):
        r = impls.get(name, {})
        return r.get("gpu", {}).get("joules_per_call") if r.get("status") == "ok" else None

    flamia_j, best_j = joules("flamia"), joules(best_name) if best_name else None
    # The best BF16 baseline's energy per call over flamia's (> 1: flamia takes less).
    row["energy_ratio_vs_best_bf16"] = best_j / flamia_j if flamia_j and best_j else None


def markdown(meta, rows, impls):
    train = meta["pass"] == "train"
    flops = ("3.5 * 4 * D * pairs * Hq: forward + backward, the backward counted as 2.5 forwards" if train
             else "4 * D * pairs * Hq")
    # How a round was timed: since session 35 every implementation's round is calls_per_round calls
    # back to back; session 34's runs did that for JAX alone (jax_calls), the runs before not at all.
    calls = meta.get("calls_per_round")
    if calls is not None:
        timing = (f"; each round times {calls} calls dispatched back to back, per call" if calls > 1
                  else "; each round times one call")
        jax_timing = "jitted"
        eager = "host time included" if calls == 1 else "host time counts where it exceeds the GPU's"
        warmup_unit = "calls" if calls == 1 else "rounds"  # a warm-up round is a timed round's calls
    else:
        timing, eager, warmup_unit = "", "host time included", "calls"
        jax_calls = meta.get("jax_calls", 1)
        jax_timing = "jitted, " + (f"timed {jax_calls} back to back, per call" if jax_calls > 1
                                   else "each timed to its own block_until_ready")
    lines = [
        f"# flamia {'training-call (forward + backward)' if train else 'forward'} benchmark",
        "",
        f"{meta['gpu']}; torch {meta['torch']}; jax {meta.get('jax', 'n/a')}; cuDNN (torch) {meta['cudnn_torch']}; "
        f"{meta['date']}",
        "",
        f"T = {W.TOTAL} packed tokens, Hq = {W.Q_HEADS}, D = {W.HEAD_DIM}, causal, BF16 in/out; median of "
        f"{meta['rounds']} rounds after {meta['warmup']} warm-up {warmup_unit}"
        + (", the implementations timed in turns (round r: one turn of each, starting at the r-th)"
           if meta.get("schedule") == "interleaved" else ", each implementation's rounds back to back")
        + timing
        + ". Cells: ms / TFLOP/s "
        f"(visible pairs: {flops}). "
        + ("Every torch implementation is timed replaying its call from a CUDA graph (no host time; JAX's "
           f"calls are {jax_timing}). " if meta.get("graph") else f"Eager calls ({eager}). ")
        + "Ratios are flamia's TFLOP/s over the best BF16 baseline's and over cuDNN FP8's; 'prefix / default' is "
        "the time of isolation=prefix over the default's.",
        "",
    ]
    header = ["workload", "docs"] + list(impls) + ["flamia / best BF16", "flamia / cuDNN FP8", "prefix / default"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * len(header)) + "|")
    notes = []
    for row in rows:
        cells = [row["workload"], str(row["docs"])]
        for impl in impls:
            r = row["impls"].get(impl)
            if r is None:
                cells.append("-")
            elif r["status"] == "ok":
                cell = f"{r['ms']:.3f} / {r['tflops']:.0f}"
                if r.get("graph") is False:  # --graph, but its capture failed
                    cell += " (eager)"
                if "graph" in r and r.get("note"):
                    notes.append(f"{row['workload']} / {impl}: {r['note']}")
                if r.get("warning"):
                    cell += " (!)"
                    notes.append(f"{row['workload']} / {impl}: {r['warning']}")
                cells.append(cell)
            else:
                cells.append("n/a")
                notes.append(f"{row['workload']} / {impl}: {r['status']}")
        best = row.get("ratio_vs_best_bf16")
        cells.append(f"{best:.2f} ({row['best_bf16']})" if best else "-")
        fp8 = row.get("ratio_vs_cudnn_fp8")
        cells.append(f"{fp8:.2f}" if fp8 else "-")
        prefix = row.get("prefix_time_ratio")
        cells.append(f"{prefix:.2f}" if prefix else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    memory_impls = [i for i in impls if i in TORCH_SETUPS]
    if memory_impls:
        lines.append("Peak GPU memory of one eager call (MiB above what was allocated before it; torch allocator, "
                     "so JAX is not measured):")
        lines.append("")
        lines.append("| workload | " + " | ".join(memory_impls) + " |")
        lines.append("|" + "|".join(["---"] * (len(memory_impls) + 1)) + "|")
        for row in rows:
            cells = [row["workload"]]
            for impl in memory_impls:
                r = row["impls"].get(impl, {})
                cells.append(f"{r['peak_mib']:.0f}" if r.get("status") == "ok" and "peak_mib" in r else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.extend(gpu_readings_table(meta, rows, impls))
    lines.append("Implementations: " + "; ".join(f"`{k}` = {IMPLS[k]}" for k in impls) + ".")
    if notes:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"- {n}" for n in notes)
    return "\n".join(lines) + "\n"


def gpu_readings_table(meta, rows, impls):
    """The markdown lines of the GPU's clock and energy over each implementation's timed rounds
    (gpu_monitor.py); none when no implementation has readings."""
    if not any(r.get("gpu") for row in rows for r in row["impls"].values()):
        return []
    energy = bool(meta.get("energy_seconds"))
    lines = [
        "GPU clock during each implementation's timed rounds (NVML, read only, once a round while the GPU "
        "runs its calls): the median SM clock (MHz), and the share of reads with the driver holding the clock "
        "down for power (software cap or power brake)"
        + (f"; then energy per call (J) over {meta['energy_seconds']:g} s or more of its calls back to back "
           "(untimed), from the GPU's energy counter, which advances every ~100 ms; 'energy, best BF16 / "
           "flamia' > 1: flamia takes less energy per call. Those seconds of load change the clock of the "
           "implementations timed after them: time the protocol in a run without --energy-seconds"
           if energy else "") + ".",
        "",
    ]
    header = ["workload"] + list(impls) + (["energy, best BF16 / flamia"] if energy else [])
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * len(header)) + "|")
    for row in rows:
        cells = [row["workload"]]
        for impl in impls:
            g = row["impls"].get(impl, {}).get("gpu")
            cell = f"{g['sm_mhz']:.0f} MHz" if g else "-"
            if g and g.get("power_capped") is not None:  # (tables rebuilt from a log have the clock alone)
                cell += f", {100 * g['power_capped']:.0f}% capped"
            if g and "joules_per_call" in g:
                cell += f", {g['joules_per_call']:.2f} J"
            cells.append(cell)
        if energy:
            ratio = row.get("energy_ratio_vs_best_bf16")
            cells.append(f"{ratio:.2f} ({row['best_bf16']})" if ratio else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


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
                   help="time every torch implementation replaying its call from a CUDA graph (DESIGN.md section 5)")
    p.add_argument("--no-check", action="store_true", help="skip the cosine check against flamia's output")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing implementations")
    p.add_argument("--no-gpu-readings", action="store_true",
                   help="do not read the GPU's SM clock during the rounds (NVML; on by default)")
    p.add_argument("--energy-seconds", type=float, default=0.0,
                   help="after its timed rounds, run each implementation's calls back to back (untimed) for at "
                        "least this long and report their energy per call from the GPU's energy counter "
                        "(default 0: off; the counter advances every ~100 ms, so 1 s or more)")
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


def main(argv=None):
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        log("bench: no CUDA device")
        return 2
    flamia = import_flamia()
    meta = environment(torch)
    if not args.no_gpu_readings:
        args.gpu_monitor = gpu_monitor.open_monitor(torch, log)
    meta["gpu_readings"] = args.gpu_monitor.available
    meta["energy_seconds"] = args.energy_seconds if args.gpu_monitor.available else 0.0
    meta.update(rounds=args.rounds, warmup=args.warmup, schedule=args.schedule,
                calls_per_round=args.calls_per_round,
                **{"pass": args.pass_}, graph=args.graph, seed=args.seed, tokens=W.TOTAL, q_heads=W.Q_HEADS,
                head_dim=W.HEAD_DIM, implementations={k: IMPLS[k] for k in args.impl_names})
    log(f"bench: {meta['gpu']} (sm_{meta['capability']}), torch {meta['torch']}, jax {meta['jax']}")

    # flamia first (its output is the reference of the cosine checks), then the others.
    order = [i for i in IMPLS if i in args.impl_names]
    if not args.no_check and "flamia" not in order:
        order.insert(0, "flamia")  # computed for the check, reported only if asked for
    if args.graph:
        prime_captures(torch, flamia, args, order)
    rows = []
    for name in args.workload_names:
        workload = W.WORKLOADS[name]
        case = Case(torch, name, workload, args.seed, train=args.pass_ == "train")
        log(f"bench: {name}: {len(case.lens)} docs, max {case.max_len}, Hkv {case.hkv}, "
            f"pairs {case.pairs:,}, {case.flops / 1e12:.2f} TFLOP")
        row = {"workload": name, "docs": len(case.lens), "max_len": case.max_len, "pairs": case.pairs,
               "q_heads": case.hq, "kv_heads": case.hkv, "head_dim": case.d, "flops": case.flops, "impls": {}}
        if args.schedule == "interleaved":
            results = run_interleaved(torch, flamia, case, order, args)
        else:
            results = {}
            for impl in order:
                t0 = time.perf_counter()
                results[impl] = run_impl(torch, flamia, case, impl, args)
                log(f"bench:   {impl:15s} done ({time.perf_counter() - t0:.1f} s)")
        for impl, r in results.items():
            if impl in args.impl_names:
                row["impls"][impl] = r
            if r["status"] == "ok":
                extra = f", cos vs flamia {r['cos_vs_flamia']:.4f}" if "cos_vs_flamia" in r else ""
                if r.get("gpu"):
                    extra += f", {r['gpu']['sm_mhz']:.0f} MHz"
                    if "joules_per_call" in r["gpu"]:
                        extra += f", {r['gpu']['joules_per_call']:.2f} J/call"
                log(f"bench:   {impl:15s} {r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s{extra}")
            else:
                log(f"bench:   {impl:15s} {r['status']}")
        summarize(row)
        rows.append(row)
        if len(rows) < len(args.workload_names):
            write_outputs(args, meta, rows, complete=False)
        del case
        torch.cuda.empty_cache()

    table = write_outputs(args, meta, rows, complete=True)
    print(table)
    return 0


def write_outputs(args, meta, rows, complete):
    """Writes --json and --markdown with the rows so far and returns the table. main calls it after
    every workload (complete=False), so a run that dies partway (session 38: a training-call run's
    process crashed in its fifth workload) keeps the workloads it finished, and the files say they
    are partial; then once more at the end."""
    meta = {**meta, "complete": complete}
    impls = [i for i in IMPLS if i in args.impl_names]
    table = markdown(meta, rows, impls)
    if not complete:
        table += (f"\nPartial: {len(rows)} of {len(args.workload_names)} workloads; the run has not finished "
                  "(or did not).\n")
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.markdown).write_text(table)
    if complete:
        for path in (args.json, args.markdown):
            if path:
                log(f"bench: wrote {path}")
    return table


if __name__ == "__main__":
    sys.exit(main())
