"""Each implementation's setup on one workload (bench/bench_attention.py's --impls), the workload's
shared inputs (Case), and the imports they need (flamia, JAX, FlashAttention-3). A torch setup
returns (fn, to_packed), a JAX one (jitted fn, args, to_packed, note); to_packed(out) turns the
implementation's output into a [T, Hq, D] torch tensor. Nothing here imports torch or JAX at import
time: they are passed in or imported by the setups."""

import inspect
import math
import os
import pathlib
import sys

import workloads as W

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]

IMPLS = {
    "flamia": "flamia MXFP8 (incl. quantization)",
    "flamia-prefix": "flamia MXFP8, isolation=prefix",
    "flamia-deterministic": "flamia MXFP8, deterministic=True (dQ pass of its own)",
    "flamia-graph": "flamia MXFP8, CUDA graph replay",
    "jax-fa3": "FlashAttention-3 varlen (JAX, flash-attn3-jax)",
    "cudnn-sdpa": "cuDNN BF16 SDPA (torch, batched; equal lengths)",
    "fa2-varlen": "FA2 varlen (torch.nn.attention.varlen)",
    "flex": "FlexAttention + document mask (torch.compile)",
    "jax-cudnn-bf16": "cuDNN BF16 (JAX, packed segment offsets)",
    "jax-cudnn-fp8": "cuDNN FP8 (JAX, per-tensor scales; equal lengths)",
}
FLAMIA_IMPLS = ("flamia", "flamia-prefix", "flamia-deterministic", "flamia-graph")
BF16_BASELINES = ("jax-fa3", "cudnn-sdpa", "fa2-varlen", "flex", "jax-cudnn-bf16")
FA3_BASELINE = "jax-fa3"  # the BF16 baseline to beat
FP8_BASELINE = "jax-cudnn-fp8"
# The offline GPU machine's packages that are not installed there: scripts/gpu_check.sh installs the
# wheels scripts/prepare_gpu_carry.sh puts in .carry/wheels/ (bench/requirements-gpu-bench.txt) here.
CARRIED_SITE = REPO / ".carry" / "site"
COSINE_MIN = 0.99  # an output further than this from the reference's computes something else
REFERENCE_IMPL = "flamia"  # whose output the others' are checked against


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
        self.reference_impl = None


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


def setup_flamia_deterministic(torch, flamia, case):
    return setup_flamia(torch, flamia, case, deterministic=True)


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
    if case.train:
        # With every backward scale 1 (fp8_params), its dQ has cosine 0.25-0.31 to every other
        # implementation's: its backward's scales would need choosing per tensor.
        raise Unsupported("training call: its FP8 backward's scales are not set up (dQ computes something else)")
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


def import_fa3():
    """flash_attn3_jax (the flash-attn3-jax wheel: FlashAttention-3's Hopper kernels behind JAX's FFI),
    from the environment or .carry/site, or Unsupported."""
    if CARRIED_SITE.is_dir() and str(CARRIED_SITE) not in sys.path:
        sys.path.append(str(CARRIED_SITE))  # after the environment's own packages
    try:
        import flash_attn3_jax
    except Exception as exc:
        raise Unsupported(f"flash_attn3_jax is not importable ({short(exc)}); scripts/prepare_gpu_carry.sh "
                          "and scripts/gpu_check.sh --bench install it into .carry/site")
    return flash_attn3_jax


def setup_jax_fa3(torch, flamia, case):
    """FlashAttention-3's varlen call: the packed [T, H, D] rows with cu_seqlens, as flamia takes them
    (GQA natively); its backward is the wheel's custom VJP (jax_training_call)."""
    jax, jnp, _ = import_jax()
    fa3 = import_fa3()
    q = torch_to_jax(torch, jax, jnp, case.q)  # [T, Hq, D]
    k = torch_to_jax(torch, jax, jnp, case.k)  # [T, Hkv, D]
    v = torch_to_jax(torch, jax, jnp, case.v)
    cu = jnp.asarray(W.cu_seqlens(case.lens), dtype=jnp.int32)

    def f(q, k, v, cu):
        return fa3.flash_mha_varlen(q, k, v, cu, cu, max_seqlen_q=case.max_len, max_seqlen_k=case.max_len,
                                    softmax_scale=case.scale, is_causal=True)

    jf = jax.jit(f)
    jax.block_until_ready(jf(q, k, v, cu))
    return jf, (q, k, v, cu), lambda out: jax_to_torch(torch, jax, out), ""


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


TORCH_SETUPS = {
    "flamia": setup_flamia,
    "flamia-prefix": setup_flamia_prefix,
    "flamia-deterministic": setup_flamia_deterministic,
    "flamia-graph": setup_flamia_graph,
    "cudnn-sdpa": setup_cudnn_sdpa,
    "fa2-varlen": setup_fa2_varlen,
    "flex": setup_flex,
}
JAX_SETUPS = {
    "jax-fa3": setup_jax_fa3,
    "jax-cudnn-bf16": setup_jax_cudnn_bf16,
    "jax-cudnn-fp8": setup_jax_cudnn_fp8,
}


