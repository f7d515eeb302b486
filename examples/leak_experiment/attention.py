"""The four attention implementations the leak experiment trains with, registered for transformers
under the names in configs.CONFIGS (through flamia.hf's packed-attention mechanism, so all of them see
the same document boundaries):

  bf16      exact attention in BF16: FA2 varlen (torch.nn.attention.varlen), causal per document;
            also the reference every checkpoint is evaluated under
  document  flamia MXFP8, isolation="document" (the default)
  prefix    flamia MXFP8, isolation="prefix" (strict prefix isolation)
  e2m1      K and V fake-quantized to 4-bit E2M1 codes with one scale per (token, head), amax / 6:
            the leaky control's quantization noise without its leak (a token's scale sees only that
            token), so the two differ only in whether a scale group crosses the causal frontier
  leaky     a deliberately leaky positive control: the same 4-bit E2M1 fake quantization with one
            scale per 32-token block of the packed row (and head), the block's amax / 6 (not a power
            of two), so a block's scale, and with it every reconstruction error in the block,
            depends on the block's later tokens: across the causal frontier and across documents.
            The gradient reaches the scale (the rounding residual is a constant times the scale), so
            training can find and use the channel. Attention itself is exact (bf16 above).
  leaky_tile a second, blunt positive control: exact BF16 attention whose causal mask works at
            the granularity of 32-token tiles of each document (a query sees the later tokens of
            its own tile: the classic FlashAttention bug of skipping the element mask on the
            diagonal tile). Here the future is read directly, so training is sure to use it: the
            control that shows the evaluation detects a leak the model has learned to use.
"""

import inspect

import torch
import torch.nn.functional as F

import flamia.hf
from configs import CONFIGS

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
LEAK_BLOCK = 32


def _varlen_kwargs():
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        return varlen_attn, {"window_size": (-1, 0)}  # its spelling of causal
    for name in ("is_causal", "causal"):
        if name in params:
            return varlen_attn, {name: True}
    raise RuntimeError(f"varlen_attn{inspect.signature(varlen_attn)} has no causal option")


def exact_bf16(q, k, v, cu, max_len, scale):
    varlen_attn, kwargs = _varlen_kwargs()
    if k.shape[1] != q.shape[1]:  # GQA: give every query head its K/V head
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def e2m1_round(y):
    """Nearest E2M1 value of y (ties away from zero; |y| > 6 saturates)."""
    grid = torch.tensor(E2M1_GRID, device=y.device, dtype=y.dtype)
    mids = (grid[1:] + grid[:-1]) / 2
    return torch.sign(y) * grid[torch.bucketize(y.abs(), mids, right=True)]


def e2m1_fake_quant(x, block):
    """x [T, H, D] -> E2M1 fake-quantized with one scale per (block of tokens of the packed row,
    head), scale = amax / 6; block = 1 is one scale per token (causal-safe). Forward: the quantized
    values. Backward: identity through the rounding, and the rounding residual's derivative through
    the scale (so the amax, often a later token, gets a gradient)."""
    t, h, d = x.shape
    pad = (-t) % block
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(-1, block, h, d)
    scale = xf.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / E2M1_GRID[-1]
    y = xf / scale
    out = xf + (e2m1_round(y.detach()) - y.detach()) * scale
    return out.view(-1, h, d)[:t].to(x.dtype)


def tile_masked_bf16(row_tokens, tile=LEAK_BLOCK):
    """Exact attention (SDPA, BF16) over packed rows of row_tokens tokens whose mask lets query i see
    key j of its document when j's tile (position in the document // tile) is not after i's."""
    def attention(q, k, v, cu, max_len, scale):
        t, h, d = q.shape
        if t % row_tokens or not bool(torch.isin(torch.arange(0, t + 1, row_tokens, device=cu.device, dtype=cu.dtype), cu).all()):
            raise ValueError(f"leaky_tile: expects rows of {row_tokens} tokens, each starting a document")
        rows = t // row_tokens
        if k.shape[1] != h:  # GQA: give every query head its K/V head
            k, v = k.repeat_interleave(h // k.shape[1], dim=1), v.repeat_interleave(h // k.shape[1], dim=1)
        token = torch.arange(t, device=q.device, dtype=cu.dtype)
        doc = torch.searchsorted(cu, token, right=True) - 1
        tile_of = ((token - cu[doc]) // tile).view(rows, row_tokens)
        doc = doc.view(rows, row_tokens)
        visible = (doc[:, :, None] == doc[:, None, :]) & (tile_of[:, None, :] <= tile_of[:, :, None])

        def rows_first(x):
            return x.view(rows, row_tokens, h, d).transpose(1, 2)

        out = F.scaled_dot_product_attention(rows_first(q), rows_first(k), rows_first(v), attn_mask=visible[:, None],
                                             scale=scale)
        return out.transpose(1, 2).reshape(t, h, d)
    return attention


def register_all(leak_block=LEAK_BLOCK, row_tokens=2048):
    """Registers the implementations of configs.CONFIGS with transformers; returns {config: name}.
    leak_block is the leaky controls' scale group / tile (tokens): longer blocks reach further
    ahead; row_tokens is the packed row length (the tile-mask control works row by row)."""
    def fake_quant_kv(block):
        def attention(q, k, v, cu, max_len, scale):
            return exact_bf16(q, e2m1_fake_quant(k, block), e2m1_fake_quant(v, block), cu, max_len, scale)
        return attention

    flamia.hf.register_packed_attention(CONFIGS["bf16"], exact_bf16)
    flamia.hf.register(CONFIGS["document"], isolation="document")
    flamia.hf.register(CONFIGS["prefix"], isolation="prefix")
    flamia.hf.register_packed_attention(CONFIGS["e2m1"], fake_quant_kv(1))
    flamia.hf.register_packed_attention(CONFIGS["leaky"], fake_quant_kv(leak_block))
    flamia.hf.register_packed_attention(CONFIGS["leaky_tile"], tile_masked_bf16(row_tokens, leak_block))
    return dict(CONFIGS)
