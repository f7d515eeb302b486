"""flamia: MXFP8 microscaled, causally safe FlashAttention for Hopper over packed documents.

``flamia.attention(q, k, v, cu_seqlens, max_seqlen, ...)`` is the PyTorch entry point (the custom
op ``torch.ops.flamia.attention_forward``); ``flamia._capi`` is the ctypes layer over the C API
(include/flamia/flamia.h), usable without PyTorch.
"""

from ._capi import FlamiaError

__version__ = "0.1.0"
__all__ = ["attention", "check_errors", "FlamiaError", "__version__"]

try:
    import torch as _torch  # noqa: F401
except ImportError:  # the ctypes layer works without PyTorch; the op does not
    _torch = None

if _torch is not None:
    from .ops import attention, check_errors  # registers torch.ops.flamia.attention_forward
else:

    def attention(*args, **kwargs):
        raise ImportError("flamia.attention needs PyTorch (import torch failed)")

    def check_errors(device=None):
        raise ImportError("flamia.check_errors needs PyTorch (import torch failed)")
