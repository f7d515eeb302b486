"""The leak experiment's 4-bit controls (examples/leak_experiment/attention.py): the per-token `e2m1`
quantization must be causal-safe, the 32-token-block `leaky` one must not be, and the leak must be
trainable (the block's amax gets a gradient). Runs on the CPU; skips without torch or transformers
(attention.py imports flamia.hf, which imports transformers)."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
pytest.importorskip("transformers", reason="needs transformers")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "leak_experiment"))

import attention  # noqa: E402

T, H, D = 70, 2, 16  # 70 tokens: two full 32-token blocks and a partial one


def inputs(seed=0):
    return torch.randn(T, H, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def test_values_lie_on_the_e2m1_grid_times_the_group_scale():
    x = inputs()
    for block in (1, 32):
        y = attention.e2m1_fake_quant(x, block)
        for start in range(0, T, block):
            group = slice(start, start + block)
            for h in range(H):
                scale = x[group, h].abs().amax() / 6
                codes = (y[group, h] / scale).abs()
                grid = torch.tensor(attention.E2M1_GRID)
                assert torch.allclose(codes[..., None].sub(grid).abs().amin(-1), torch.zeros(()), atol=1e-5)


def test_per_token_scales_are_causal_and_block_scales_leak():
    x = inputs()
    future = x.clone()
    future[40] *= 8  # a later token of the second block, made its amax
    per_token_before, per_token_after = attention.e2m1_fake_quant(x, 1), attention.e2m1_fake_quant(future, 1)
    assert torch.equal(per_token_before[:40], per_token_after[:40])
    block_before, block_after = attention.e2m1_fake_quant(x, 32), attention.e2m1_fake_quant(future, 32)
    assert torch.equal(block_before[:32], block_after[:32])  # the first block does not see token 40
    assert not torch.equal(block_before[32:40], block_after[32:40])  # the second block's earlier tokens do


def test_the_block_amax_gets_a_gradient_from_earlier_tokens():
    x = inputs()
    x[50, 0, 3] = 10.0  # the second block's amax in head 0, after the tokens whose loss we take
    x.requires_grad_()
    y = attention.e2m1_fake_quant(x, 32)
    amax_index = (50 - 32) * D + 3
    weight = torch.zeros_like(y)
    weight[32:40] = torch.randn(8, H, D, generator=torch.Generator().manual_seed(1))  # earlier tokens only
    (y * weight).sum().backward()
    grad = x.grad[32:64, 0].flatten()
    assert grad[amax_index] != 0  # the leak is trainable: the later amax token hears the earlier tokens' loss


def test_the_tile_mask_control_sees_its_own_tile_and_nothing_else():
    row, tile, heads, kv_heads, d = 16, 4, 4, 2, 8
    cu = torch.tensor([0, 6, 16, 19, 32], dtype=torch.int32)  # two rows of 16 tokens, four documents
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(32, n, d, generator=g) for n in (heads, kv_heads, kv_heads))
    out = attention.tile_masked_bf16(row, tile)(q, k, v, cu, row, 0.5)
    kf, vf = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    for i in range(32):
        doc = int(torch.searchsorted(cu, torch.tensor(i, dtype=torch.int32), right=True)) - 1
        start = int(cu[doc])
        end = min(int(cu[doc + 1]), start + ((i - start) // tile + 1) * tile)  # the end of i's tile, in its document
        p = torch.softmax(torch.einsum("hd,jhd->hj", q[i], kf[start:end]) * 0.5, dim=-1)
        assert torch.allclose(out[i], torch.einsum("hj,jhd->hd", p, vf[start:end]), atol=1e-5), i
