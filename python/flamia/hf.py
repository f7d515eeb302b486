"""Hugging Face ``transformers`` integration: flamia as an attention implementation.

    import flamia.hf
    flamia.hf.register()                          # "flamia" (document isolation, the defaults)
    flamia.hf.register("flamia_prefix", isolation="prefix")
    model = LlamaForCausalLM(LlamaConfig(..., attn_implementation="flamia"))
    out = model(input_ids, position_ids=position_ids, labels=labels, use_cache=False)

Training on packed documents works as with transformers' flash-attention path: the document
boundaries come from ``cu_seq_lens_q`` / ``max_length_q`` when the caller passes them (one packed
row, batch size 1), else from ``position_ids`` (a document starts wherever the position restarts
at 0, and at every row start), else every row is one document. Attention is causal inside each
document and never crosses a boundary. Put -100 in ``labels`` at each document start so the loss
does not predict across documents either.

The attention function takes the model's [batch, heads, seq, dim] tensors (K/V with their own,
unrepeated heads: GQA and MQA go to the kernel as they are), packs them into [T, H, D], and returns
[batch, seq, heads, dim]. Inputs that are not BF16 (an FP32 model without autocast) are cast to
BF16 for the kernel and the output is cast back. Not supported, with a clear error: padding masks,
attention dropout, a KV cache (generation; flamia is a training kernel), a sliding window that
binds (``sliding_window`` shorter than the rows) and logit soft-capping (``softcap``).

``register_packed_attention(name, fn)`` is the general mechanism: any ``fn(q, k, v, cu_seqlens,
max_seqlen, softmax_scale) -> o`` over packed [T, H, D] tensors becomes a transformers attention
implementation with the same boundary handling (the leak experiment registers its BF16 reference
and its deliberately leaky control this way).
"""

import torch

from . import _checks, ops

__all__ = ["register", "register_packed_attention", "packed_boundaries"]


def packed_boundaries(batch, length, device, kwargs):
    """(cu_seqlens int32 [num_docs + 1], max_seqlen) of the batch's rows flattened into one packed
    sequence of batch * length tokens, from the attention kwargs transformers forwards."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        if batch != 1:
            raise ValueError(f"flamia: cu_seq_lens_q describes one packed row, but the batch holds {batch} rows")
        if kwargs.get("cu_seq_lens_k") is not None and kwargs["cu_seq_lens_k"] is not cu and not torch.equal(
                kwargs["cu_seq_lens_k"], cu):
            raise ValueError("flamia: self-attention needs cu_seq_lens_k == cu_seq_lens_q")
        max_len = kwargs.get("max_length_q")
        max_len = length if max_len is None else int(max_len)  # a bound: the longest document
        return cu.to(device=device, dtype=torch.int32), max(1, min(max_len, length))
    positions = kwargs.get("position_ids")
    if positions is None:
        starts = torch.arange(0, batch * length, length, device=device)
    else:
        starts_mask = (positions.expand(batch, length) == 0).clone()
        starts_mask[:, 0] = True  # a row never continues the previous row's document
        starts = starts_mask.reshape(-1).nonzero().flatten()
    total = torch.tensor([batch * length], device=device, dtype=starts.dtype)
    # max_seqlen is a bound the results do not depend on: the row length bounds every document, no host sync.
    return torch.cat([starts, total]).to(torch.int32), length


def _attention_function(packed_fn, name):
    def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if attention_mask is not None:
            raise ValueError(f"{name}: attention_mask is not supported (document boundaries come from position_ids "
                             "or cu_seq_lens_q; pad by packing instead)")
        if dropout:
            raise ValueError(f"{name}: attention dropout is not supported (got dropout={dropout})")
        batch, q_heads, length, dim = query.shape
        _checks.check_hf_attention_kwargs(name, key.shape[2], kwargs)
        if key.shape[2] != length:
            raise ValueError(f"{name}: queries and keys must have the same length (self-attention without a KV "
                             f"cache; pass use_cache=False), got {length} and {key.shape[2]}")
        dtype = query.dtype

        def packed(x):
            return x.transpose(1, 2).reshape(batch * length, x.shape[1], dim).to(torch.bfloat16)

        cu, max_len = packed_boundaries(batch, length, query.device, kwargs)
        o = packed_fn(packed(query), packed(key), packed(value), cu, max_len, scaling)
        return o.view(batch, length, q_heads, dim).to(dtype), None

    attention_forward.__name__ = f"{name}_attention_forward"
    return attention_forward


def register_packed_attention(name, packed_fn):
    """Registers packed_fn(q, k, v, cu_seqlens, max_seqlen, softmax_scale) -> o ([T, H, D] BF16
    tensors, K/V heads unrepeated) as transformers attention implementation `name`. Call it before
    building a model with attn_implementation=name."""
    from transformers import AttentionInterface, AttentionMaskInterface

    if "flash" in name or "/" in name or ":" in name:
        raise ValueError(f"attention implementation name {name!r}: transformers treats names containing 'flash', "
                         "'/' or ':' specially; pick another")
    AttentionInterface.register(name, _attention_function(packed_fn, name))
    # transformers' flash-attention mask function: None for unpadded input (boundaries then come
    # from position_ids), the 2-D padding mask otherwise, which the function above refuses. An
    # unregistered name would get None always and silently drop a padding mask.
    from transformers.masking_utils import flash_attention_mask
    AttentionMaskInterface.register(name, flash_attention_mask)


def register(name="flamia", causal=True, isolation="document", scale_geometry="block32", scale_rule="ceil"):
    """Registers flamia.attention with these options as transformers attention implementation `name`."""
    def packed_fn(q, k, v, cu, max_len, softmax_scale):
        return ops.attention(q, k, v, cu, max_len, causal=causal, softmax_scale=softmax_scale, isolation=isolation,
                             scale_geometry=scale_geometry, scale_rule=scale_rule)

    register_packed_attention(name, packed_fn)
