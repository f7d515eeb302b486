"""The four attention implementations the leak experiment trains with, registered for transformers
under the names in CONFIGS (through flamia.hf's packed-attention mechanism, so all four see the same
document boundaries):

  bf16      exact attention in BF16: FA2 varlen (torch.nn.attention.varlen), causal per document;
            also the reference every checkpoint is evaluated under
  document  flamia MXFP8, isolation="document" (the default)
  prefix    flamia MXFP8, isolation="prefix" (strict prefix isolation)
  leaky     a deliberately leaky positive control: K and V fake-quantized to 4-bit E2M1 codes with
            one scale per 32-token block of the packed row, the block's amax / 6 (not a power of
            two), so a block's scale, and with it every reconstruction error in the block, depends
            on the block's later tokens: across the causal frontier and across documents. The
            gradient reaches the scale (the rounding residual is a constant times the scale), so
            training can find and use the channel. Attention itself is exact (bf16 above).
"""

import inspect

import torch

import flamia.hf

CONFIGS = {
    "bf16": "leak_bf16",
    "document": "leak_flamia_document",
    "prefix": "leak_flamia_prefix",
    "leaky": "leak_leaky_e2m1",
}
REFERENCE = "bf16"

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


def leaky_fake_quant(x, block=LEAK_BLOCK):
    """x [T, H, D] -> E2M1 fake-quantized with one scale per (block of tokens of the packed row,
    head), scale = amax / 6. Forward: the quantized values. Backward: identity through the rounding,
    and the rounding residual's derivative through the scale (so the amax, often a later token, gets
    a gradient)."""
    t, h, d = x.shape
    pad = (-t) % block
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(-1, block, h, d)
    scale = xf.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / E2M1_GRID[-1]
    y = xf / scale
    out = xf + (e2m1_round(y.detach()) - y.detach()) * scale
    return out.view(-1, h, d)[:t].to(x.dtype)


def register_all(leak_block=LEAK_BLOCK):
    """Registers the four implementations with transformers; returns {config: name}. leak_block is
    the leaky control's scale group (tokens of the packed row): longer blocks reach further ahead."""
    def leaky(q, k, v, cu, max_len, scale):
        return exact_bf16(q, leaky_fake_quant(k, leak_block), leaky_fake_quant(v, leak_block), cu, max_len, scale)

    flamia.hf.register_packed_attention(CONFIGS["bf16"], exact_bf16)
    flamia.hf.register(CONFIGS["document"], isolation="document")
    flamia.hf.register(CONFIGS["prefix"], isolation="prefix")
    flamia.hf.register_packed_attention(CONFIGS["leaky"], leaky)
    return dict(CONFIGS)
