"""The nine packed causal workloads of the forward/backward benchmarks (docs/DESIGN.md §5).

Each workload is one packed row of 65,536 tokens (16 query heads, head dim 128 unless stated), a
list of document lengths: uniform 16x4096 ... 1x65536, GQA 16/4, the skewed 8192+224x256, a
long-tail mixture and ~280 tiny unaligned documents (the shape families of the FLAMIA paper's
Table 1). The lengths are generated exactly as the project's reference list does (same seeds,
same random calls), so results line up with it; the project never reads that list at run time.

Run it to print every workload: python3 bench/workloads.py
"""
import random

TOTAL = 65536
Q_HEADS = 16
HEAD_DIM = 128


def _longtail(seed):
    # Log-normal lengths (median ~665 tokens, heavy tail), at least 16, cut to fill TOTAL.
    rng = random.Random(seed)
    out, left = [], TOTAL
    while left > 0:
        n = int(min(left, max(16, rng.lognormvariate(6.5, 1.4))))
        out.append(n)
        left -= n
    return out


def _tiny(seed):
    # Uniform lengths in [17, 500]: almost none a multiple of 32 or of a tile.
    rng = random.Random(seed)
    out, left = [], TOTAL
    while left > 0:
        n = min(left, rng.randint(17, 500))
        out.append(n)
        left -= n
    return out


# name -> dict(lens=[...], optional hkv=KV heads; default hkv = Q_HEADS)
WORKLOADS = {
    "16x4096": dict(lens=[4096] * 16),
    "8x8192": dict(lens=[8192] * 8),
    "4x16384": dict(lens=[16384] * 4),
    "4x16384-gqa16/4": dict(lens=[16384] * 4, hkv=4),
    "2x32768": dict(lens=[32768] * 2),
    "1x65536": dict(lens=[65536]),
    "8192+224x256": dict(lens=[8192] + [256] * 224),
    "longtail": dict(lens=_longtail(7)),
    "tiny-unaligned": dict(lens=_tiny(11)),
}


def pairs(lens):
    """Visible (query, key) pairs of causal attention over these documents."""
    return sum(n * (n + 1) // 2 for n in lens)


def kv_heads(workload):
    return workload.get("hkv", Q_HEADS)


def equal_lengths(lens):
    """True when every document has the same length (a batched [B, H, L, D] layout fits)."""
    return len(set(lens)) == 1


def cu_seqlens(lens):
    """Document offsets [0, l0, l0 + l1, ..., TOTAL] as a list of ints."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def training_inputs(torch, name, requires_grad=True, seed=0):
    """q, k, v [T, H, D] and dO [T, Hq, D] of workload `name` (BF16, standard normal, on the GPU,
    drawn in this order from one generator seeded with `seed`) and its cu_seqlens (int32): the
    inputs of the benchmark, the per-kernel breakdown, the host-time probe, the Nsight Compute
    profile and the build comparison. torch is passed in, so that this module imports without it."""
    return workload_inputs(torch, WORKLOADS[name], requires_grad, seed)


def workload_inputs(torch, w, requires_grad=True, seed=0):
    """training_inputs of a workload given as its dict (lens, and hkv where not Q_HEADS): also
    shapes that are none of the nine (the benchmark's capture primer)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(TOTAL, h, HEAD_DIM, generator=g, device="cuda", dtype=torch.bfloat16)
               .requires_grad_(requires_grad) for h in (Q_HEADS, kv_heads(w), kv_heads(w)))
    dout = torch.randn(TOTAL, Q_HEADS, HEAD_DIM, generator=g, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor(cu_seqlens(w["lens"]), dtype=torch.int32, device="cuda")
    return q, k, v, dout, cu


def forward_flops(lens, q_heads=Q_HEADS, head_dim=HEAD_DIM):
    """FLOPs of the causal forward, visible pairs only: 4 * D * pairs * Hq (two GEMMs)."""
    return 4 * head_dim * pairs(lens) * q_heads


if __name__ == "__main__":
    for k, w in WORKLOADS.items():
        assert sum(w["lens"]) == TOTAL, k
        assert all(n >= 1 for n in w["lens"]), k
        assert cu_seqlens(w["lens"])[-1] == TOTAL, k
        print(f"{k:18s} docs={len(w['lens']):5d} max={max(w['lens']):6d} pairs={pairs(w['lens']):,}")
