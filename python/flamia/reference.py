"""Exact attention over packed documents in PyTorch (FP64 by default): the yardstick the GPU tests,
the numerics table and the leak experiment measure flamia against.

Each document attends only to itself (causally when causal=True); query head h reads K/V head
h // (Hq // Hkv). Differentiable, so torch.autograd gives the exact gradients too. Memory grows
with the square of the longest document (one [Hq, n, n] score matrix per document at a time).
"""

import operator

import torch

from ._checks import check_document_lengths

__all__ = ["attention", "gradients", "document_lengths"]


def document_lengths(cu_seqlens):
    """Python list of document lengths from a cu_seqlens tensor or list (one host read)."""
    offsets = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    return [b - a for a, b in zip(offsets[:-1], offsets[1:])]


def attention(q, k, v, lens, causal=True, softmax_scale=None, dtype=torch.float64):
    """o [T, Hq, D] and the natural-log lse [Hq, T] (in `dtype`) of packed q [T, Hq, D], k and v
    [T, Hkv, D] with documents of the given lengths `lens` (a list or tensor of ints adding up to T;
    not cu_seqlens: document_lengths(cu_seqlens) gives them). Raises ValueError for lengths that do
    not fit q, naming a cu_seqlens passed in their place."""
    t, hq, d = q.shape
    # operator.index refuses float lengths rather than truncating them.
    lens = [operator.index(n) for n in (lens.tolist() if isinstance(lens, torch.Tensor) else lens)]
    check_document_lengths("reference.attention", lens, t)
    group = hq // k.shape[1]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    outs, lses = [], []
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        qd = q[sl].to(dtype)
        kd = k[sl].to(dtype).repeat_interleave(group, dim=1)
        vd = v[sl].to(dtype).repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", qd, kd) * scale
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lses.append(torch.logsumexp(s, dim=-1))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vd))
        start += n
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def gradients(q, k, v, dout, lens, causal=True, softmax_scale=None, dtype=torch.float64):
    """Exact (dq, dk, dv) of sum(o * dout), in `dtype`."""
    leaves = [x.detach().to(dtype).requires_grad_(True) for x in (q, k, v)]
    o, _ = attention(*leaves, lens, causal=causal, softmax_scale=softmax_scale, dtype=dtype)
    return torch.autograd.grad(o, leaves, dout.to(dtype))
