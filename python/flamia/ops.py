"""PyTorch binding of the flamia forward: the custom op ``flamia::attention_forward`` (with a fake
implementation for torch.compile and an autograd registration) and the public ``attention``.

The op calls the C API (``flamia_forward``) through ctypes on torch's current CUDA stream. It
allocates its outputs and the workspace with torch (so CUDA graph capture uses the graph's memory
pool), never synchronizes the host and never reads device memory from the host.
"""

import functools
import math

import torch

from . import _capi
from ._capi import FlamiaError

__all__ = ["attention", "attention_forward", "FlamiaError"]

_BACKWARD_MESSAGE = (
    "flamia: the MXFP8 backward is not implemented yet (only the forward has landed); "
    "use flamia.attention under torch.no_grad() or on inputs that do not require grad")


def _check_tensor(t, name, dtype, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flamia.attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"flamia.attention: {name} must have dtype {dtype}, got {t.dtype}")
    if t.device.type != "cuda":
        raise ValueError(f"flamia.attention: {name} must be a CUDA tensor, got a tensor on {t.device}")
    if t.dim() != ndim:
        shape = "[T, H, D]" if ndim == 3 else "[num_docs + 1]"
        raise ValueError(f"flamia.attention: {name} must have {ndim} dimensions {shape}, got shape {tuple(t.shape)}")


def _check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"flamia.attention: {name} must be one of {sorted(choices)}, got {value!r}")


def _check_inputs(q, k, v, cu_seqlens, isolation, scale_geometry, scale_rule):
    """The checks that need no data pointer (they also run while torch.compile traces)."""
    _check_tensor(q, "q", torch.bfloat16, 3)
    _check_tensor(k, "k", torch.bfloat16, 3)
    _check_tensor(v, "v", torch.bfloat16, 3)
    _check_tensor(cu_seqlens, "cu_seqlens", torch.int32, 1)
    for name, t in (("k", k), ("v", v), ("cu_seqlens", cu_seqlens)):
        if t.device != q.device:
            raise ValueError(f"flamia.attention: {name} is on {t.device} but q is on {q.device}")
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"flamia.attention: cu_seqlens must hold num_docs + 1 >= 2 offsets, got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"flamia.attention: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"flamia.attention: k {tuple(k.shape)} must match q {tuple(q.shape)} in tokens (dim 0) "
                         f"and head_dim (dim 2)")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"flamia.attention: q heads ({q.shape[1]}) must be a multiple of k heads ({k.shape[1]})")
    _check_choice(isolation, "isolation", _capi.ISOLATION)
    _check_choice(scale_geometry, "scale_geometry", _capi.SCALE_GEOMETRY)
    _check_choice(scale_rule, "scale_rule", _capi.SCALE_RULE)


def _layout_ok(t):
    """Whether the kernels can read t in place: feature axis contiguous, 16-byte aligned rows."""
    tokens, heads, dim = t.shape
    if t.stride(2) != 1 and dim > 1:
        return False
    st, sh = _strides(t)
    return (t.data_ptr() % 16 == 0 and st % 8 == 0 and sh % 8 == 0 and st >= dim and sh >= dim)


def _strides(t):
    """(stride_token, stride_head) in elements, with a valid value for an axis of extent 1
    (whose stride torch leaves arbitrary and the kernels never use)."""
    tokens, heads, dim = t.shape
    st, sh = t.stride(0), t.stride(1)
    if heads == 1:
        sh = dim
    if tokens == 1:
        st = heads * sh
    return st, sh


def _descriptor(t):
    tokens, heads, dim = t.shape
    st, sh = _strides(t)
    return _capi.tensor(t.data_ptr(), tokens, heads, dim, st, sh)


def _kernel_layout(t):
    """t itself when the kernels can read it in place, else a fresh contiguous copy."""
    if _layout_ok(t):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


@functools.lru_cache(maxsize=256)
def _workspace_bytes(tokens, q_heads, kv_heads, dim):
    # The size query reads only the shapes (no data pointer, no stride).
    q = _capi.tensor(0, tokens, q_heads, dim, q_heads * dim, dim)
    kv = _capi.tensor(0, tokens, kv_heads, dim, kv_heads * dim, dim)
    return _capi.forward_workspace_size(q, kv, kv)


@torch.library.custom_op("flamia::attention_forward", mutates_args=())
def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    softmax_scale: float,
    isolation: str,
    scale_geometry: str,
    scale_rule: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8 attention forward over packed documents: (o [T, Hq, D] bf16, lse [Hq, T] fp32)."""
    _check_inputs(q, k, v, cu_seqlens, isolation, scale_geometry, scale_rule)
    tokens, q_heads, dim = q.shape
    kv_heads = k.shape[1]
    q, k, v = _kernel_layout(q), _kernel_layout(k), _kernel_layout(v)
    if cu_seqlens.stride(0) != 1:
        cu_seqlens = cu_seqlens.contiguous()

    o = torch.empty((tokens, q_heads, dim), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((q_heads, tokens), dtype=torch.float32, device=q.device)

    options = _capi.default_options()
    options.causal = 1 if causal else 0
    options.softmax_scale = float(softmax_scale)
    options.isolation = _capi.ISOLATION[isolation]
    options.scale_geometry = _capi.SCALE_GEOMETRY[scale_geometry]
    options.scale_rule = _capi.SCALE_RULE[scale_rule]

    # The device copy only: no host copy, so no device-to-host transfer (the C call checks every
    # property of cu_seqlens that it can without reading device memory).
    # (Clamped into int32, so an out-of-range max_seqlen reaches the C check instead of wrapping.)
    max_seqlen = max(min(int(max_seqlen), 2**31 - 1), -(2**31))
    docs = _capi.Documents(cu_seqlens.data_ptr(), None, cu_seqlens.shape[0] - 1, max_seqlen)

    with torch.cuda.device(q.device):
        nbytes = _workspace_bytes(tokens, q_heads, kv_heads, dim)
        # The caching allocator returns 512-byte aligned blocks (the C API needs 256).
        workspace = torch.empty((nbytes,), dtype=torch.uint8, device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _capi.forward(_descriptor(q), _descriptor(k), _descriptor(v), docs, options, _descriptor(o),
                      lse.data_ptr(), workspace.data_ptr(), nbytes, stream)
    return o, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, isolation, scale_geometry,
                            scale_rule):
    _check_inputs(q, k, v, cu_seqlens, isolation, scale_geometry, scale_rule)
    tokens, q_heads, dim = q.shape
    o = q.new_empty((tokens, q_heads, dim), dtype=torch.bfloat16)
    lse = q.new_empty((q_heads, tokens), dtype=torch.float32)
    return o, lse


def _setup_context(ctx, inputs, output):
    pass  # nothing to save until the backward exists


def _backward(ctx, grad_o, grad_lse):
    raise NotImplementedError(_BACKWARD_MESSAGE)


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, cu_seqlens, max_seqlen, causal=True, softmax_scale=None, isolation="document",
              scale_geometry="block32", scale_rule="ceil", return_lse=False):
    """MXFP8, causally safe attention over packed variable-length documents.

    Args:
        q: BF16 CUDA tensor [T, Hq, D] (D in {64, 128}); any strides with the last dim contiguous
            (rows that are not 16-byte aligned are copied first).
        k, v: BF16 CUDA tensors [T, Hkv, D], Hq a multiple of Hkv (MHA, GQA, MQA).
        cu_seqlens: int32 CUDA tensor [num_docs + 1], document boundaries (0 ... T).
        max_seqlen: Python int >= the longest document.
        causal: causal mask inside each document (default True).
        softmax_scale: default 1/sqrt(D).
        isolation: "document" (default) or "prefix" (strict prefix isolation).
        scale_geometry: "block32" (default; document-local 32-token groups) or "token".
        scale_rule: "ceil" (default; never clips) or "floor" (OCP MX).
        return_lse: also return lse [Hq, T] FP32 (natural log).

    Returns:
        o [T, Hq, D] BF16, or (o, lse) when return_lse.

    Raises:
        TypeError / ValueError naming the argument for bad Python-side input, FlamiaError (with the
        C API's status and message) for anything the C API rejects.
    """
    if isinstance(max_seqlen, torch.Tensor):
        raise TypeError("flamia.attention: max_seqlen must be a Python int (the longest document), not a tensor")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, torch.SymInt)):
        raise TypeError(f"flamia.attention: max_seqlen must be an int, got {type(max_seqlen).__name__}")
    _check_inputs(q, k, v, cu_seqlens, isolation, scale_geometry, scale_rule)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    o, lse = attention_forward(q, k, v, cu_seqlens, max_seqlen, bool(causal), float(softmax_scale), isolation,
                               scale_geometry, scale_rule)
    if return_lse:
        return o, lse
    return o
