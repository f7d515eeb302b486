"""PyTorch binding of flamia: the custom ops ``flamia::attention_forward`` and
``flamia::attention_backward``, and the training pair ``flamia::attention_forward_train`` (which
also returns q, k and v's codes) and ``flamia::attention_backward_saved`` (which reads them instead
of quantizing q, k and v again), each with a fake implementation for torch.compile; the autograd
registrations that tie each pair together; and the public ``attention``, which on plain eager calls
runs the custom ops' implementations directly (the dispatcher costs host time in front of the first
kernel) and otherwise (torch.compile, fake or subclass tensors, torch function or dispatch modes)
the custom ops.

The ops call the C API (``flamia_forward``, ``flamia_backward``) through ctypes on torch's current
CUDA stream. They allocate their outputs and workspaces with torch (so CUDA graph capture uses the
graph's memory pool), never synchronize the host and never read device memory from the host.

Malformed cu_seqlens are found on the device by each call (python/flamia/_status.py): the call's
outputs are NaN, and the record in the device's status word (pinned host memory, one per device,
which the kernels write through its mapping) is raised as a FlamiaError by the next op that
starts after it reached the host, or by ``check_errors()``. ``validate="sync"`` checks on the host
before launching instead.
"""

import functools
import threading

import torch

from . import _capi
from . import _status
from ._capi import FlamiaError
from ._checks import check_devices
from ._options import AttentionOptions

__all__ = ["attention", "attention_forward", "attention_backward", "attention_forward_train",
           "attention_backward_saved", "check_errors", "FlamiaError"]

_status_lock = threading.Lock()
_status_words = {}  # device index -> _status.StatusWord


def _device_index(device):
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"flamia.check_errors: device must be a CUDA device, got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


def _status_word(device):
    """The status word of a CUDA device: 16 bytes of pinned host memory (the device writes them
    through the mapping that pinned memory has under unified addressing), made on first use. Calls
    on every stream of the device share it; the first violation recorded stays until reported."""
    index = _device_index(device)
    word = _status_words.get(index)
    if word is None:
        with _status_lock:
            word = _status_words.get(index)
            if word is None:
                buffer = torch.zeros(4, dtype=torch.int32, pin_memory=True)
                word = _status.StatusWord(buffer.data_ptr(), buffer, f"cuda:{index}")
                _status_words[index] = word
    return word


def _raise_pending(word, device):
    """Raise the FlamiaError of a record that reached the host (after waiting for the device, so the
    record is whole); nothing, without a CUDA call, when there is none. While a CUDA graph is
    captured the device cannot be waited for: the record then stays for the next call or
    check_errors()."""
    if word.pending() and not torch.cuda.is_current_stream_capturing():
        torch.cuda.synchronize(device)
        raise word.error()


def check_errors(device=None):
    """Raise FlamiaError for malformed cu_seqlens that an earlier flamia call found on the device
    (the error names the first bad entry and its values; the call's outputs are NaN). Waits for the
    device first (torch.cuda.synchronize), so every call launched before this one has been checked.
    device: a CUDA device (index, string or torch.device); None: every device flamia has run on.
    Reporting clears the record: the next violation is recorded afresh."""
    indices = sorted(_status_words) if device is None else [_device_index(device)]
    for index in indices:
        word = _status_words.get(index)
        if word is None:
            continue
        torch.cuda.synchronize(index)
        error = word.error()
        if error is not None:
            raise error


def _check_tensor(t, name, dtype, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flamia.attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"flamia.attention: {name} must have dtype {dtype}, got {t.dtype}")
    if t.device.type != "cuda":
        raise ValueError(f"flamia.attention: {name} must be a CUDA tensor, got a tensor on {t.device}")
    if t.dim() != ndim:
        shape = {3: "[T, H, D]", 2: "[Hq, T]", 1: "[num_docs + 1]"}[ndim]
        raise ValueError(f"flamia.attention: {name} must have {ndim} dimensions {shape}, got shape {tuple(t.shape)}")


def _check_inputs(q, k, v, cu_seqlens):
    """The checks of q, k, v and cu_seqlens that need no data pointer (they also run while
    torch.compile traces). The options are checked by AttentionOptions."""
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


def _shape_descriptors(tokens, q_heads, kv_heads, dim):
    """q, k, v descriptors that carry shapes only (no data: for the size queries and the
    backward from saved codes, which read nothing else of q, k and v)."""
    q = _capi.tensor(0, tokens, q_heads, dim, q_heads * dim, dim)
    kv = _capi.tensor(0, tokens, kv_heads, dim, kv_heads * dim, dim)
    return q, kv, kv


_SIZE_QUERIES = {
    "forward": _capi.forward_workspace_size,
    "backward": _capi.backward_workspace_size,
    "saved_codes": _capi.saved_codes_size,
    "forward_train": _capi.forward_train_workspace_size,
    "backward_saved": _capi.backward_saved_workspace_size,
}


@functools.lru_cache(maxsize=256)
def _buffer_bytes(kind, tokens, q_heads, kv_heads, dim, num_docs, options):
    """options: the call's AttentionOptions (hashable). The size queries read only the shapes, the
    document count (no pointer, no stride) and the options (prefix isolation with block32 geometry
    encodes K and V twice)."""
    docs = _capi.Documents(None, None, num_docs, 1)
    return _SIZE_QUERIES[kind](*_shape_descriptors(tokens, q_heads, kv_heads, dim), docs, options.to_c())


def _c_documents(cu_seqlens, max_seqlen, status):
    """The device copy only: no host copy, so no device-to-host transfer (the C call checks every
    property of cu_seqlens that it can without reading device memory, the device the rest, into the
    status word `status`). max_seqlen is clamped into int32, so an out-of-range value reaches the C
    check instead of wrapping."""
    max_seqlen = max(min(int(max_seqlen), 2**31 - 1), -(2**31))
    return _capi.Documents(cu_seqlens.data_ptr(), None, cu_seqlens.shape[0] - 1, max_seqlen, status.address)


def _run_forward(q, k, v, cu_seqlens, max_seqlen, options, workspace_kind, launch):
    """What both forward ops share: checks, kernel layouts, o and lse, the C options and documents,
    the workspace; launch(q, k, v, docs, c_options, o, lse, workspace, nbytes, stream) calls the C
    API. options: the call's AttentionOptions. Returns (o, lse)."""
    _check_inputs(q, k, v, cu_seqlens)
    status = _status_word(q.device)
    _raise_pending(status, q.device)
    tokens, q_heads, dim = q.shape
    q, k, v = _kernel_layout(q), _kernel_layout(k), _kernel_layout(v)
    if cu_seqlens.stride(0) != 1:
        cu_seqlens = cu_seqlens.contiguous()

    o = torch.empty((tokens, q_heads, dim), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((q_heads, tokens), dtype=torch.float32, device=q.device)
    docs = _c_documents(cu_seqlens, max_seqlen, status)
    with torch.cuda.device(q.device):
        nbytes = _buffer_bytes(workspace_kind, tokens, q_heads, k.shape[1], dim, docs.num_docs, options)
        # The caching allocator returns 512-byte aligned blocks (the C API needs 256).
        workspace = torch.empty((nbytes,), dtype=torch.uint8, device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        launch(q, k, v, docs, options.to_c(), o, lse, workspace, nbytes, stream)
    return o, lse


def _forward(q, k, v, cu_seqlens, max_seqlen, options):
    """MXFP8 attention forward over packed documents: (o [T, Hq, D] bf16, lse [Hq, T] fp32)."""
    def launch(q, k, v, docs, c_options, o, lse, workspace, nbytes, stream):
        _capi.forward(_descriptor(q), _descriptor(k), _descriptor(v), docs, c_options, _descriptor(o),
                      lse.data_ptr(), workspace.data_ptr(), nbytes, stream)

    return _run_forward(q, k, v, cu_seqlens, max_seqlen, options, "forward", launch)


def _forward_impl(
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
    options = AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule)
    return _forward(q, k, v, cu_seqlens, max_seqlen, options)


attention_forward = torch.library.custom_op("flamia::attention_forward", _forward_impl, mutates_args=())


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, isolation, scale_geometry,
                            scale_rule):
    _check_inputs(q, k, v, cu_seqlens)
    AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule)  # checks
    tokens, q_heads, dim = q.shape
    o = q.new_empty((tokens, q_heads, dim), dtype=torch.bfloat16)
    lse = q.new_empty((q_heads, tokens), dtype=torch.float32)
    return o, lse


def _run_backward(dout, o, lse, cu_seqlens, max_seqlen, kv_heads, options, workspace_kind, launch):
    """What both backward ops share: checks, kernel layouts, dq, dk and dv, the C options and
    documents, the workspace; launch(o, lse, dout, docs, c_options, dq, dk, dv, workspace, nbytes,
    stream) calls the C API. options: the call's AttentionOptions (its deterministic picks the dQ
    reduction). Returns (dq, dk, dv)."""
    _check_tensor(dout, "dout", torch.bfloat16, 3)
    _check_tensor(o, "o", torch.bfloat16, 3)
    _check_tensor(lse, "lse", torch.float32, 2)
    check_devices("attention_backward", "dout", dout, o=o, lse=lse, cu_seqlens=cu_seqlens)
    status = _status_word(dout.device)
    _raise_pending(status, dout.device)
    tokens, q_heads, dim = dout.shape
    o, dout = _kernel_layout(o), _kernel_layout(dout)
    if lse.shape != (q_heads, tokens):
        raise ValueError(f"flamia.attention_backward: lse must have shape {(q_heads, tokens)}, got {tuple(lse.shape)}")
    if not lse.is_contiguous():
        lse = lse.contiguous()
    if cu_seqlens.stride(0) != 1:
        cu_seqlens = cu_seqlens.contiguous()

    dq = torch.empty((tokens, q_heads, dim), dtype=torch.bfloat16, device=dout.device)
    dk = torch.empty((tokens, kv_heads, dim), dtype=torch.bfloat16, device=dout.device)
    dv = torch.empty((tokens, kv_heads, dim), dtype=torch.bfloat16, device=dout.device)
    docs = _c_documents(cu_seqlens, max_seqlen, status)
    with torch.cuda.device(dout.device):
        nbytes = _buffer_bytes(workspace_kind, tokens, q_heads, kv_heads, dim, docs.num_docs, options)
        workspace = torch.empty((nbytes,), dtype=torch.uint8, device=dout.device)
        stream = torch.cuda.current_stream(dout.device).cuda_stream
        launch(o, lse, dout, docs, options.to_c(), dq, dk, dv, workspace, nbytes, stream)
    return dq, dk, dv


def _backward(dout, q, k, v, o, lse, cu_seqlens, max_seqlen, options):
    """MXFP8 attention backward: (dq [T, Hq, D], dk [T, Hkv, D], dv [T, Hkv, D]) bf16 for the incoming
    gradient dout of o, given the forward's inputs and outputs (o, lse). Deterministic (flamia_backward
    always is)."""
    _check_inputs(q, k, v, cu_seqlens)
    _check_tensor(dout, "dout", torch.bfloat16, 3)
    check_devices("attention_backward", "q", q, dout=dout)  # _run_backward: o, lse, cu_seqlens on dout's
    if dout.shape != q.shape:
        raise ValueError(f"flamia.attention_backward: dout must have q's shape {tuple(q.shape)}, got {tuple(dout.shape)}")
    q, k, v = _kernel_layout(q), _kernel_layout(k), _kernel_layout(v)

    def launch(o, lse, dout, docs, c_options, dq, dk, dv, workspace, nbytes, stream):
        _capi.backward(_descriptor(q), _descriptor(k), _descriptor(v), _descriptor(o), lse.data_ptr(),
                       _descriptor(dout), docs, c_options, _descriptor(dq), _descriptor(dk), _descriptor(dv),
                       workspace.data_ptr(), nbytes, stream)

    return _run_backward(dout, o, lse, cu_seqlens, max_seqlen, k.shape[1], options, "backward", launch)


def _backward_impl(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    softmax_scale: float,
    isolation: str,
    scale_geometry: str,
    scale_rule: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP8 attention backward: (dq [T, Hq, D], dk [T, Hkv, D], dv [T, Hkv, D]) bf16 for the incoming
    gradient dout of o, given the forward's inputs and outputs (o, lse). Deterministic."""
    options = AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule,
                                                 deterministic=True)
    return _backward(dout, q, k, v, o, lse, cu_seqlens, max_seqlen, options)


attention_backward = torch.library.custom_op("flamia::attention_backward", _backward_impl, mutates_args=())


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, o, lse, cu_seqlens, max_seqlen, causal, softmax_scale, isolation,
                             scale_geometry, scale_rule):
    _check_inputs(q, k, v, cu_seqlens)
    AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule)  # checks
    return (q.new_empty(q.shape, dtype=torch.bfloat16), k.new_empty(k.shape, dtype=torch.bfloat16),
            v.new_empty(v.shape, dtype=torch.bfloat16))


def _saved_codes_bytes(q, k, num_docs, options):
    """The saved codes buffer's size (flamia_saved_codes_size) for q [T, Hq, D], k [T, Hkv, D] and
    the call's AttentionOptions."""
    tokens, q_heads, dim = q.shape
    return _buffer_bytes("saved_codes", int(tokens), int(q_heads), int(k.shape[1]), int(dim), int(num_docs),
                         options)


def _forward_train(q, k, v, cu_seqlens, max_seqlen, options):
    """attention_forward that also returns q, k and v's MXFP8 codes (a uint8 buffer, flamia_forward_train's
    saved codes) for the backward from saved codes: (o, lse, saved_codes)."""
    saved = []

    def launch(q, k, v, docs, c_options, o, lse, workspace, nbytes, stream):
        saved_bytes = _saved_codes_bytes(q, k, docs.num_docs, options)
        saved.append(torch.empty((saved_bytes,), dtype=torch.uint8, device=q.device))
        _capi.forward_train(_descriptor(q), _descriptor(k), _descriptor(v), docs, c_options, _descriptor(o),
                            lse.data_ptr(), saved[0].data_ptr(), saved_bytes, workspace.data_ptr(), nbytes, stream)

    o, lse = _run_forward(q, k, v, cu_seqlens, max_seqlen, options, "forward_train", launch)
    return o, lse, saved[0]


def _forward_train_impl(
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
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_forward that also returns q, k and v's MXFP8 codes (a uint8 buffer, flamia_forward_train's
    saved codes) for attention_backward_saved: (o, lse, saved_codes). deterministic is the backward's
    (attention_backward_saved), carried through the autograd context."""
    options = AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule,
                                                 deterministic)
    return _forward_train(q, k, v, cu_seqlens, max_seqlen, options)


attention_forward_train = torch.library.custom_op("flamia::attention_forward_train", _forward_train_impl,
                                                  mutates_args=())


@attention_forward_train.register_fake
def _attention_forward_train_fake(q, k, v, cu_seqlens, max_seqlen, causal, softmax_scale, isolation, scale_geometry,
                                  scale_rule, deterministic=False):
    _check_inputs(q, k, v, cu_seqlens)
    options = AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule,
                                                 deterministic)
    tokens, q_heads, dim = q.shape
    saved_bytes = _saved_codes_bytes(q, k, cu_seqlens.shape[0] - 1, options)
    return (q.new_empty((tokens, q_heads, dim), dtype=torch.bfloat16),
            q.new_empty((q_heads, tokens), dtype=torch.float32), q.new_empty((saved_bytes,), dtype=torch.uint8))


def _backward_saved(dout, saved_codes, o, lse, cu_seqlens, max_seqlen, kv_heads, options):
    """The backward from _forward_train's saved codes (q, k and v are not needed). options.deterministic:
    bitwise attention_backward's (dq, dk, dv); else dq may come from FP16 partials (where they apply:
    document isolation, causal, D = 128, long documents), which sum in whatever order they arrive:
    the same accuracy, not bitwise repeatable."""
    _check_tensor(saved_codes, "saved_codes", torch.uint8, 1)
    _check_tensor(cu_seqlens, "cu_seqlens", torch.int32, 1)
    _check_tensor(dout, "dout", torch.bfloat16, 3)
    check_devices("attention_backward_saved", "dout", dout, saved_codes=saved_codes)  # _run_backward: the rest

    def launch(o, lse, dout, docs, c_options, dq, dk, dv, workspace, nbytes, stream):
        q, k, v = _shape_descriptors(*dout.shape[:2], kv_heads, dout.shape[2])  # shapes only
        _capi.backward_saved(q, k, v, _descriptor(o), lse.data_ptr(), _descriptor(dout), docs, c_options,
                             saved_codes.data_ptr(), saved_codes.numel(), _descriptor(dq), _descriptor(dk),
                             _descriptor(dv), workspace.data_ptr(), nbytes, stream)

    return _run_backward(dout, o, lse, cu_seqlens, max_seqlen, kv_heads, options, "backward_saved", launch)


def _backward_saved_impl(
    dout: torch.Tensor,
    saved_codes: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    kv_heads: int,
    causal: bool,
    softmax_scale: float,
    isolation: str,
    scale_geometry: str,
    scale_rule: str,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """attention_backward from attention_forward_train's saved codes (q, k and v are not needed).
    deterministic: bitwise attention_backward's (dq, dk, dv); else dq may come from FP16 partials
    (where they apply: document isolation, causal, D = 128, long documents), which sum in whatever
    order they arrive: the same accuracy, not bitwise repeatable."""
    options = AttentionOptions.from_op_arguments(causal, softmax_scale, isolation, scale_geometry, scale_rule,
                                                 deterministic)
    return _backward_saved(dout, saved_codes, o, lse, cu_seqlens, max_seqlen, kv_heads, options)


attention_backward_saved = torch.library.custom_op("flamia::attention_backward_saved", _backward_saved_impl,
                                                   mutates_args=())


@attention_backward_saved.register_fake
def _attention_backward_saved_fake(dout, saved_codes, o, lse, cu_seqlens, max_seqlen, kv_heads, causal,
                                   softmax_scale, isolation, scale_geometry, scale_rule, deterministic=False):
    tokens, q_heads, dim = dout.shape
    return (dout.new_empty((tokens, q_heads, dim)), dout.new_empty((tokens, kv_heads, dim)),
            dout.new_empty((tokens, kv_heads, dim)))


def _defined_gradient(grad, output):
    """grad, or zeros where autograd passes None (set_materialize_grads(False): o unused by the loss)."""
    return torch.zeros_like(output) if grad is None else grad


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen = inputs[:5]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens)
    ctx.max_seqlen = max_seqlen
    ctx.options = AttentionOptions.from_op_arguments(*inputs[5:])
    ctx.mark_non_differentiable(lse)  # only o carries a gradient (attention() returns lse detached)
    ctx.set_materialize_grads(False)  # no zero-filled gradient of lse


def _autograd_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, cu_seqlens = ctx.saved_tensors
    grad_o = _defined_gradient(grad_o, o)
    dq, dk, dv = attention_backward(grad_o, q, k, v, o, lse, cu_seqlens, ctx.max_seqlen, *ctx.options.op_arguments())
    return dq, dk, dv, None, None, None, None, None, None, None


attention_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _save_train_context(ctx, num_inputs, kv_heads, cu_seqlens, max_seqlen, options, output):
    """The training pair's autograd context, for the custom op's registration and the eager
    Function alike: the codes, o, lse and cu_seqlens, and the options record."""
    o, lse, saved = output
    ctx.save_for_backward(saved, o, lse, cu_seqlens)  # not q, k, v: the codes replace them
    ctx.max_seqlen, ctx.kv_heads, ctx.options = max_seqlen, kv_heads, options
    ctx.inputs = num_inputs  # the backward returns one gradient (or None) per input
    ctx.mark_non_differentiable(lse, saved)
    # Without this, autograd fills a zero "gradient" of the saved codes (as large as q, k and v
    # together) before every backward: 0.24 ms of a 4x16384 training call on the H200.
    ctx.set_materialize_grads(False)


def _setup_context_train(ctx, inputs, output):
    q, k, v, cu_seqlens, max_seqlen = inputs[:5]
    options = AttentionOptions.from_op_arguments(*inputs[5:])  # deterministic (inputs[10]) may be absent
    _save_train_context(ctx, len(inputs), k.shape[1], cu_seqlens, max_seqlen, options, output)


def _backward_saved_op(dout, saved_codes, o, lse, cu_seqlens, max_seqlen, kv_heads, options):
    """attention_backward_saved (the custom op, traceable) with the record flattened into its schema."""
    return attention_backward_saved(dout, saved_codes, o, lse, cu_seqlens, max_seqlen, kv_heads,
                                    *options.op_arguments(with_deterministic=True))


def _backward_train_through(backward_saved):
    """The training pair's backward, running backward_saved: the custom op (traceable) or the
    record-taking implementation (the eager path below)."""
    def backward(ctx, grad_o, grad_lse, grad_saved):
        saved, o, lse, cu_seqlens = ctx.saved_tensors
        grad_o = _defined_gradient(grad_o, o)
        dq, dk, dv = backward_saved(grad_o, saved, o, lse, cu_seqlens, ctx.max_seqlen, ctx.kv_heads, ctx.options)
        return (dq, dk, dv) + (None,) * (ctx.inputs - 3)
    return backward


attention_forward_train.register_autograd(_backward_train_through(_backward_saved_op),
                                          setup_context=_setup_context_train)


class _EagerTrainingCall(torch.autograd.Function):
    """The training pair without the custom-op dispatcher: the same implementations, context and
    backward as attention_forward_train's autograd registration, for plain eager calls (the
    dispatcher and the custom op's autograd wrapper cost host time in front of the first kernel,
    which a short call's GPU waits for). Inputs: (q, k, v, cu_seqlens, max_seqlen, options), the
    options an AttentionOptions record."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, options):
        output = _forward_train(q, k, v, cu_seqlens, max_seqlen, options)
        _save_train_context(ctx, 6, k.shape[1], cu_seqlens, max_seqlen, options, output)
        return output

    backward = staticmethod(_backward_train_through(_backward_saved))


def _mode_probes():
    """torch's (private) tests for an active torch function mode and dispatch mode, or None where
    this torch lacks either: then every call takes the custom ops, which are always right."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        return torch._C._is_torch_function_mode_enabled, _get_current_dispatch_mode
    except (ImportError, AttributeError):
        return None


_MODE_PROBES = _mode_probes()


def _plain_eager(*tensors):
    """Whether nothing traces or intercepts this call (no torch.compile, no fake or subclass
    tensors, no torch function or dispatch mode), so the custom ops' implementations may be called
    directly; otherwise the custom ops run, whose fake implementations and schemas tracing needs."""
    if _MODE_PROBES is None or torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in tensors):
        return False
    function_mode_enabled, current_dispatch_mode = _MODE_PROBES
    return not function_mode_enabled() and current_dispatch_mode() is None


def _check_offsets_now(cu_seqlens, total_tokens, max_seqlen, validate):
    """validate="sync": cu_seqlens copied to the host (a synchronization) and checked there, with
    the device's rule and message, before anything is launched. Not possible while a CUDA graph is
    captured or torch.compile traces: then an explicit validate="sync" is a ValueError, and the
    environment's FLAMIA_VALIDATE=sync leaves the call to the device's check."""
    if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        if validate == "sync":
            raise ValueError("flamia.attention: validate='sync' copies cu_seqlens to the host, which a CUDA graph "
                             "capture or torch.compile cannot do; use the default validate='async' there (the "
                             "device checks every call, replays included)")
        return
    _status.check_offsets_on_host(cu_seqlens.tolist(), total_tokens, int(max_seqlen))


def attention(q, k, v, cu_seqlens, max_seqlen, causal=True, softmax_scale=None, isolation="document",
              scale_geometry="block32", scale_rule="ceil", return_lse=False, save_codes=True, deterministic=None,
              validate=None):
    """MXFP8, causally safe attention over packed variable-length documents.

    Args:
        q: BF16 CUDA tensor [T, Hq, D] (D in {64, 128}); any strides with the last dim contiguous
            (rows that are not 16-byte aligned are copied first).
        k, v: BF16 CUDA tensors [T, Hkv, D], Hq a multiple of Hkv (MHA, GQA, MQA).
        cu_seqlens: int32 CUDA tensor [num_docs + 1], document boundaries (0 ... T, non-decreasing).
            Checked on the device by every call, without waiting for it: malformed offsets make
            every output NaN (o, lse, and the gradients of the backward) and raise FlamiaError
            naming the first bad entry and its values from the next flamia call that starts after
            the device found them, or from flamia.check_errors().
        max_seqlen: Python int, a bound on the document lengths in [1, T]. The results do not depend
            on it (it picks a launch shape); validate="sync" also checks that it is at least the
            longest document.
        causal: causal mask inside each document (default True).
        softmax_scale: None (default) for 1/sqrt(D), else a finite number > 0 that stays > 0 in
            float32 (0, negative values and e.g. 1e-50 raise ValueError).
        isolation: "document" (default) or "prefix" (strict prefix isolation: q and dO get
            per-token scales; with block32 geometry k and v are encoded twice, per token at the
            frontier and block32 where the key is two or more 128-token tiles before the query,
            docs/NUMERICS.md; with token geometry per token everywhere).
        scale_geometry: "block32" (default; document-local 32-token groups) or "token".
        scale_rule: "ceil" (default; never clips) or "floor" (OCP MX).
        return_lse: also return lse [Hq, T] FP32 (natural log).
        deterministic: the backward's reduction of dq. True: bitwise repeatable (a dQ pass of its
            own, each row summed in a fixed order). False: dq from FP16 partials of the dK dV pass
            where they apply (document isolation, causal, D = 128, documents of 8,192 tokens or
            more on average, save_codes), as accurate but summed in whatever order they arrive,
            and faster than the deterministic pass (docs/RESULTS.md, "Training call":
            deterministic / default). Default None follows
            torch.are_deterministic_algorithms_enabled(). Prefix isolation is always deterministic.
        save_codes: when a gradient will be taken, keep q, k and v's MXFP8 codes (about 2 bytes per
            element of q, k and v, 2 more per element of k and v in prefix isolation with block32
            geometry) for the backward instead of q, k and v themselves, so the
            backward does not quantize them again (default True; same gradients bitwise).
        validate: "async" (the device's check above), "sync" (cu_seqlens copied to the host and
            checked before anything is launched: FlamiaError at once, with the same message; a
            synchronization, for debugging; not under CUDA graph capture or torch.compile), or None
            (default): the environment variable FLAMIA_VALIDATE ("async" when unset; its "sync"
            applies to eager calls only).

    Returns:
        o [T, Hq, D] BF16, or (o, lse) when return_lse (lse carries no gradient).

    Differentiable in q, k and v: the backward is the MXFP8 backward of docs/DESIGN.md (dk and dv
    always deterministic; dq as ``deterministic`` says; in prefix isolation dq of a row depends on
    nothing after it).

    Raises:
        TypeError / ValueError naming the argument for bad Python-side input, FlamiaError (with the
        C API's status and message) for anything the C API rejects, and for malformed cu_seqlens
        (as described above; ``error.offsets`` holds the record).
    """
    if isinstance(max_seqlen, torch.Tensor):
        raise TypeError("flamia.attention: max_seqlen must be a Python int (the longest document), not a tensor")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, torch.SymInt)):
        raise TypeError(f"flamia.attention: max_seqlen must be an int, got {type(max_seqlen).__name__}")
    _check_inputs(q, k, v, cu_seqlens)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    options = AttentionOptions(causal=causal, softmax_scale=softmax_scale, isolation=isolation,
                               scale_geometry=scale_geometry, scale_rule=scale_rule,
                               deterministic=deterministic).resolved(q.shape[-1])
    _status.check_validate_argument(validate)
    if validate == "sync" or (validate is None and not torch.compiler.is_compiling()
                              and _status.validate_mode(None) == "sync"):
        _check_offsets_now(cu_seqlens, q.shape[0], max_seqlen, validate)
    inputs = (q, k, v, cu_seqlens, max_seqlen)
    eager = _plain_eager(q, k, v, cu_seqlens)
    differentiable = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if differentiable and save_codes:
        if eager:
            o, lse, _ = _EagerTrainingCall.apply(*inputs, options)
        else:
            o, lse, _ = attention_forward_train(*inputs, *options.op_arguments(with_deterministic=True))
    elif eager and not differentiable:
        o, lse = _forward(*inputs, options)
    else:
        o, lse = attention_forward(*inputs, *options.op_arguments())
    if return_lse:
        return o, lse.detach()  # the backward differentiates o only
    return o
