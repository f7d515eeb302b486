"""The PyTorch op flamia.attention (torch.ops.flamia.attention_forward) on an sm_90 GPU.

Needs torch, a CUDA device of compute capability 9.0 and the installed package
(python3 -m pip install ., README's "Usage"), or PYTHONPATH=python with FLAMIA_CAPI_LIB pointing
at a built libflamia_capi.so. Without torch the whole module is skipped (importorskip), and without
a Hopper GPU every test skips with the reason, so the CPU CTest run (pytest tests/python) is
unaffected.

The numerics are checked against an FP64 PyTorch reference of causal attention on packed
documents: cosine of O >= 0.998 and of dQ, dK, dV >= 0.997 (docs/DESIGN.md §4), and a small LSE
difference.
"""

import pytest
from torch_sm90 import require_torch_sm90

torch = require_torch_sm90()

import flamia  # noqa: E402  (after the skips: a GPU machine must have the package)
from flamia import FlamiaError  # noqa: E402
from flamia import reference as flamia_reference  # noqa: E402

LENS = [1, 31, 33, 127, 129, 1000]  # unaligned documents, one longer than a tile row
DEVICE = "cuda"
MIN_COSINE_O = 0.998
MAX_LSE_ABS = 0.2  # natural-log units: the logits carry ~2^-5 relative quantization error
MAX_LSE_MEAN_ABS = 0.02


def cu_seqlens_of(lens):
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


def make_inputs(lens, hq, hkv, d, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    t = sum(lens)
    q = torch.randn(t, hq, d, generator=g, device=DEVICE).to(torch.bfloat16)
    k = torch.randn(t, hkv, d, generator=g, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(t, hkv, d, generator=g, device=DEVICE).to(torch.bfloat16)
    return q, k, v, cu_seqlens_of(lens)


def reference(q, k, v, lens, causal=True, scale=None):
    """FP64 attention of each document alone: o [T, Hq, D] and lse [Hq, T]."""
    return flamia_reference.attention(q, k, v, lens, causal=causal, softmax_scale=scale)


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a @ b) / (a.norm() * b.norm()))


def run(q, k, v, cu, lens, **kwargs):
    return flamia.attention(q, k, v, cu, max(lens), return_lse=True, **kwargs)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(16, 16), (16, 4), (16, 1)], ids=["mha", "gqa16-4", "mqa"])
def test_matches_fp64_reference(hq, hkv, d):
    q, k, v, cu = make_inputs(LENS, hq, hkv, d)
    o, lse = run(q, k, v, cu, LENS)
    assert o.shape == q.shape and o.dtype == torch.bfloat16 and o.device == q.device
    assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
    ref_o, ref_lse = reference(q, k, v, LENS)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    cos = cosine(o, ref_o)
    assert cos >= MIN_COSINE_O, f"cosine(o) {cos:.5f} < {MIN_COSINE_O}"
    diff = (lse.double() - ref_lse).abs()
    assert diff.max().item() <= MAX_LSE_ABS, f"max |lse diff| {diff.max().item():.4f}"
    assert diff.mean().item() <= MAX_LSE_MEAN_ABS, f"mean |lse diff| {diff.mean().item():.4f}"


def test_explicit_softmax_scale_and_floor_rule():
    q, k, v, cu = make_inputs(LENS, 8, 2, 128, seed=1)
    o, lse = run(q, k, v, cu, LENS, softmax_scale=0.05, scale_rule="floor")
    ref_o, ref_lse = reference(q, k, v, LENS, scale=0.05)
    assert cosine(o, ref_o) >= MIN_COSINE_O
    assert (lse.double() - ref_lse).abs().max().item() <= MAX_LSE_ABS


def test_prefix_isolation_and_token_scales_run():
    q, k, v, cu = make_inputs(LENS, 16, 4, 128, seed=2)
    ref_o, _ = reference(q, k, v, LENS)
    for kwargs in ({"isolation": "prefix"}, {"scale_geometry": "token"}):
        o, lse = run(q, k, v, cu, LENS, **kwargs)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all(), kwargs
        assert cosine(o, ref_o) >= MIN_COSINE_O, kwargs


def test_prefix_isolation_output_ignores_the_future():
    # Strict mode: o and lse at positions <= i do not change when everything after i changes.
    lens = [300]
    q, k, v, cu = make_inputs(lens, 4, 4, 128, seed=3)
    i = 100
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[i + 1:] = torch.randn_like(t[i + 1:], dtype=torch.float32).to(torch.bfloat16) * 8
    o1, lse1 = run(q, k, v, cu, lens, isolation="prefix")
    o2, lse2 = run(q2, k2, v2, cu, lens, isolation="prefix")
    assert torch.equal(o1[: i + 1], o2[: i + 1])
    assert torch.equal(lse1[:, : i + 1], lse2[:, : i + 1])


def test_strided_inputs_match_contiguous():
    # q, k, v as views into one packed qkv buffer (token stride 3 * H * D): read in place.
    lens = LENS
    t, h, d = sum(lens), 8, 128
    g = torch.Generator(device=DEVICE).manual_seed(4)
    qkv = torch.randn(t, 3 * h, d, generator=g, device=DEVICE).to(torch.bfloat16)
    q, k, v = qkv[:, :h], qkv[:, h:2 * h], qkv[:, 2 * h:]
    cu = cu_seqlens_of(lens)
    o_strided, lse_strided = run(q, k, v, cu, lens)
    o_contig, lse_contig = run(q.contiguous(), k.contiguous(), v.contiguous(), cu, lens)
    assert torch.equal(o_strided, o_contig)
    assert torch.equal(lse_strided, lse_contig)


def test_documents_are_isolated():
    # Changing another document leaves this one's outputs bitwise unchanged.
    q, k, v, cu = make_inputs(LENS, 16, 4, 64, seed=5)
    o1, lse1 = run(q, k, v, cu, LENS)
    first_end = LENS[0] + LENS[1] + LENS[2]
    k2 = k.clone()
    k2[first_end:] = 0
    o2, lse2 = run(q, k2, v, cu, LENS)
    assert torch.equal(o1[:first_end], o2[:first_end])
    assert torch.equal(lse1[:, :first_end], lse2[:, :first_end])


# ---- bad input: clear errors naming the argument ----

def test_wrong_dtype_names_the_argument():
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    with pytest.raises(TypeError, match=r"\bq\b.*bfloat16"):
        flamia.attention(q.half(), k, v, cu, max(LENS))
    with pytest.raises(TypeError, match=r"\bv\b.*bfloat16"):
        flamia.attention(q, k, v.float(), cu, max(LENS))


def test_cpu_tensor_names_the_argument():
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    with pytest.raises(ValueError, match=r"\bk\b.*CUDA"):
        flamia.attention(q, k.cpu(), v, cu, max(LENS))
    with pytest.raises(ValueError, match=r"cu_seqlens.*CUDA"):
        flamia.attention(q, k, v, cu.cpu(), max(LENS))


def test_non_int32_cu_seqlens_names_the_argument():
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    with pytest.raises(TypeError, match=r"cu_seqlens.*int32"):
        flamia.attention(q, k, v, cu.long(), max(LENS))


def test_bad_option_strings_name_the_argument():
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    with pytest.raises(ValueError, match=r"isolation.*'strict'"):
        flamia.attention(q, k, v, cu, max(LENS), isolation="strict")
    with pytest.raises(ValueError, match=r"scale_geometry"):
        flamia.attention(q, k, v, cu, max(LENS), scale_geometry="block16")
    with pytest.raises(ValueError, match=r"scale_rule"):
        flamia.attention(q, k, v, cu, max(LENS), scale_rule="nearest")


def test_shape_errors_name_the_argument():
    q, k, v, cu = make_inputs(LENS, 6, 4, 64)
    with pytest.raises(ValueError, match=r"multiple of k heads"):
        flamia.attention(q, k, v, cu, max(LENS))
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    with pytest.raises(ValueError, match=r"\bq\b.*3 dimensions"):
        flamia.attention(q.flatten(1), k, v, cu, max(LENS))


def test_c_api_errors_arrive_as_flamia_error():
    # Head dim 96 is valid but not built: the C API's NOT_SUPPORTED with its message.
    q, k, v, cu = make_inputs(LENS, 4, 4, 96)
    with pytest.raises(FlamiaError, match=r"head_dim") as info:
        flamia.attention(q, k, v, cu, max(LENS))
    assert info.value.status_name == "FLAMIA_ERROR_NOT_SUPPORTED"
    # max_seqlen beyond T: INVALID_ARGUMENT naming docs.max_seqlen.
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    with pytest.raises(FlamiaError, match=r"max_seqlen") as info:
        flamia.attention(q, k, v, cu, sum(LENS) + 1)
    assert info.value.status_name == "FLAMIA_ERROR_INVALID_ARGUMENT"
    # prefix isolation needs the causal mask.
    with pytest.raises(FlamiaError, match=r"causal"):
        flamia.attention(q, k, v, cu, max(LENS), causal=False, isolation="prefix")


# ---- torch integration: compile, autograd, CUDA graphs ----

def test_opcheck_schema_and_fake():
    q, k, v, cu = make_inputs(LENS, 8, 2, 64)
    args = (q, k, v, cu, max(LENS), True, 0.125, "document", "block32", "ceil")
    torch.library.opcheck(torch.ops.flamia.attention_forward.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_matches_eager():
    q, k, v, cu = make_inputs(LENS, 16, 4, 128, seed=6)
    eager_o, eager_lse = run(q, k, v, cu, LENS)

    def f(q, k, v, cu):
        o, lse = flamia.attention(q, k, v, cu, max(LENS), return_lse=True)
        return o.float() * 2.0, lse  # something around the op for the graph to hold

    compiled = torch.compile(f, fullgraph=True)
    o2, lse2 = compiled(q, k, v, cu)
    assert torch.equal(o2, eager_o.float() * 2.0)
    assert torch.equal(lse2, eager_lse)
    plain = torch.compile(flamia.attention, fullgraph=True)
    assert torch.equal(plain(q, k, v, cu, max(LENS)), eager_o)


MIN_COSINE_GRAD = 0.997  # docs/DESIGN.md §4 bar for dQ, dK, dV


def reference_grads(q, k, v, dout, lens, causal=True, scale=None):
    """Gradients of sum(o * dout) through the FP64 reference: (dq, dk, dv) in float64."""
    return flamia_reference.gradients(q, k, v, dout, lens, causal=causal, softmax_scale=scale)


def flamia_grads(q, k, v, dout, cu, lens, **kwargs):
    """(o, dq, dk, dv) through flamia.attention and autograd."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = flamia.attention(q, k, v, cu, max(lens), **kwargs)
    o.backward(dout)
    return o.detach(), q.grad, k.grad, v.grad


def make_dout(like, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(like.shape, generator=g, device=DEVICE).to(torch.bfloat16)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("hq,hkv", [(16, 16), (16, 4), (16, 1)], ids=["mha", "gqa16-4", "mqa"])
def test_gradients_match_fp64_reference(hq, hkv, d):
    q, k, v, cu = make_inputs(LENS, hq, hkv, d, seed=10)
    dout = make_dout(q, 11)
    _, dq, dk, dv = flamia_grads(q, k, v, dout, cu, LENS)
    ref = reference_grads(q, k, v, dout, LENS)
    for name, got, want, like in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, (q, k, v)):
        assert got.shape == like.shape and got.dtype == torch.bfloat16, name
        assert torch.isfinite(got).all(), name
        cos = cosine(got, want)
        assert cos >= MIN_COSINE_GRAD, f"cosine({name}) {cos:.5f} < {MIN_COSINE_GRAD}"


@pytest.mark.parametrize("isolation", ["document", "prefix"])
def test_gradients_meet_the_bars_at_4x4096(isolation):
    # The backward issue's acceptance configuration: 4 x 4096 causal, Hq = 16, D = 128, normal inputs.
    lens = [4096] * 4
    q, k, v, cu = make_inputs(lens, 16, 16, 128, seed=20)
    dout = make_dout(q, 21)
    o, dq, dk, dv = flamia_grads(q, k, v, dout, cu, lens, isolation=isolation)
    ref_o, _ = reference(q, k, v, lens)
    assert cosine(o, ref_o) >= MIN_COSINE_O
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), reference_grads(q, k, v, dout, lens)):
        cos = cosine(got, want)
        assert cos >= MIN_COSINE_GRAD, f"{isolation}: cosine({name}) {cos:.5f} < {MIN_COSINE_GRAD}"


def test_gradients_non_causal_scale_and_floor_rule():
    q, k, v, cu = make_inputs(LENS, 8, 2, 64, seed=12)
    dout = make_dout(q, 13)
    _, dq, dk, dv = flamia_grads(q, k, v, dout, cu, LENS, causal=False, softmax_scale=0.1, scale_rule="floor")
    ref = reference_grads(q, k, v, dout, LENS, causal=False, scale=0.1)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), ref):
        assert cosine(got, want) >= MIN_COSINE_GRAD, name


def test_backward_is_deterministic_and_takes_any_grad_layout():
    q, k, v, cu = make_inputs(LENS, 8, 2, 128, seed=14)
    dout = make_dout(q, 15)
    first = flamia_grads(q, k, v, dout, cu, LENS)
    second = flamia_grads(q, k, v, dout, cu, LENS)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # sum() hands the backward an expanded (stride-0) gradient: it is copied into a kernel layout.
    q1, k1, v1 = (t.detach().requires_grad_(True) for t in (q, k, v))
    flamia.attention(q1, k1, v1, cu, max(LENS)).sum().backward()
    ones = flamia_grads(q, k, v, torch.ones_like(dout), cu, LENS)
    assert torch.equal(q1.grad, ones[1]) and torch.equal(k1.grad, ones[2]) and torch.equal(v1.grad, ones[3])


def test_deterministic_follows_torch_and_fp16_partials_match_it():
    # A document long enough for the FP16 dQ partials (documents of >= 8192 tokens on average).
    lens = [16500, 100]
    q, k, v, cu = make_inputs(lens, 2, 1, 128, seed=21)
    dout = make_dout(q, 22)
    exact = flamia_grads(q, k, v, dout, cu, lens, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(exact, flamia_grads(q, k, v, dout, cu, lens, deterministic=True)))
    fast = flamia_grads(q, k, v, dout, cu, lens, deterministic=False)
    assert torch.equal(fast[2], exact[2]) and torch.equal(fast[3], exact[3])  # dk, dv: one owner each
    assert not torch.equal(fast[1], exact[1]), "the FP16 partials did not run"
    assert cosine(fast[1], exact[1]) >= 0.9999
    # deterministic=None follows torch's global flag
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert torch.equal(flamia_grads(q, k, v, dout, cu, lens)[1], exact[1])
    finally:
        torch.use_deterministic_algorithms(was)
    assert cosine(flamia_grads(q, k, v, dout, cu, lens)[1], exact[1]) >= 0.9999


def test_prefix_isolation_dq_ignores_the_future():
    # Strict mode: dq at positions <= i does not change when q, k, v and dout after i change.
    # The future is scaled by 2^12 so that the 32-token scale group holding i (document mode) jumps
    # far enough to push its earlier values into E4M3's subnormal range: a power-of-two scale
    # change alone keeps normal codes exact, and the test would be blind.
    lens = [300]
    q, k, v, cu = make_inputs(lens, 4, 2, 128, seed=16)
    dout = make_dout(q, 17)
    i = 100
    q2, k2, v2, dout2 = q.clone(), k.clone(), v.clone(), dout.clone()
    for t in (q2, k2, v2, dout2):
        t[i + 1:] = torch.randn_like(t[i + 1:], dtype=torch.float32).to(torch.bfloat16) * 4096
    for isolation, expect_equal in (("prefix", True), ("document", False)):
        a = flamia_grads(q, k, v, dout, cu, lens, isolation=isolation)[1]
        b = flamia_grads(q2, k2, v2, dout2, cu, lens, isolation=isolation)[1]
        assert torch.equal(a[:i + 1], b[:i + 1]) == expect_equal, isolation


def test_backward_under_torch_compile_matches_eager():
    q, k, v, cu = make_inputs(LENS, 8, 2, 64, seed=18)

    def loss(q, k, v):
        return flamia.attention(q, k, v, cu, max(LENS)).float().square().sum()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        q1, k1, v1 = (t.detach().requires_grad_(True) for t in (q, k, v))
        fn(q1, k1, v1).backward()
        grads.append((q1.grad, k1.grad, v1.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_saved_codes_give_bitwise_the_same_gradients():
    # save_codes (the default when a gradient is taken) keeps q, k and v's codes for the backward
    # instead of quantizing them again; the gradients are the same bits, eager and compiled.
    q, k, v, cu = make_inputs(LENS, 8, 2, 128, seed=19)
    dout = make_dout(q, 20)
    saved = {}
    for isolation in ("document", "prefix"):
        saved[isolation] = flamia_grads(q, k, v, dout, cu, LENS, isolation=isolation)
        again = flamia_grads(q, k, v, dout, cu, LENS, isolation=isolation, save_codes=False)
        for a, b in zip(saved[isolation], again):
            assert torch.equal(a, b), isolation
    args = (q, k, v, cu, max(LENS), True, 0.125, "document", "block32", "ceil")
    torch.library.opcheck(torch.ops.flamia.attention_forward_train.default, args,
                          test_utils=("test_schema", "test_faketensor"))

    def loss(q, k, v):
        return (flamia.attention(q, k, v, cu, max(LENS)).float() * dout.float()).sum()

    q1, k1, v1 = (t.detach().requires_grad_(True) for t in (q, k, v))
    torch.compile(loss, fullgraph=True)(q1, k1, v1).backward()
    eager = saved["document"]
    assert torch.equal(q1.grad, eager[1]) and torch.equal(k1.grad, eager[2]) and torch.equal(v1.grad, eager[3])


def test_eager_path_matches_the_custom_ops_bitwise():
    # Plain eager calls run the custom ops' implementations without the dispatcher (less host time
    # per call); the custom ops themselves (what torch.compile traces) give the same bits.
    from flamia import ops
    q, k, v, cu = make_inputs(LENS, 8, 2, 128, seed=21)
    dout = make_dout(q, 22)
    args = (q, k, v, cu, max(LENS), True, 0.125, "document", "block32", "ceil")
    assert ops._plain_eager(q, k, v, cu)
    with torch.no_grad():
        o_eager = flamia.attention(*args[:5], softmax_scale=0.125)
    assert torch.equal(o_eager, ops.attention_forward(*args)[0])

    o_eager, dq, dk, dv = flamia_grads(q, k, v, dout, cu, LENS, softmax_scale=0.125)
    q1, k1, v1 = (t.detach().requires_grad_(True) for t in (q, k, v))
    o_op = ops.attention_forward_train(q1, k1, v1, *args[3:])[0]
    o_op.backward(dout)
    assert torch.equal(o_eager, o_op.detach())
    assert torch.equal(dq, q1.grad) and torch.equal(dk, k1.grad) and torch.equal(dv, v1.grad)


def test_traced_or_intercepted_calls_take_the_custom_ops():
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from flamia import ops

    class Logging(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v, cu = make_inputs(LENS, 4, 4, 64, seed=23)
    with Logging() as mode:
        assert not ops._plain_eager(q, k, v, cu)
        o = flamia.attention(q, k, v, cu, max(LENS))
    assert any("flamia.attention_forward" in name for name in mode.ops), mode.ops
    assert torch.equal(o, flamia.attention(q, k, v, cu, max(LENS)))
    with FakeTensorMode() as fake:
        fq, fk, fv, fcu = (fake.from_tensor(t) for t in (q, k, v, cu))
        assert not ops._plain_eager(fq, fk, fv, fcu)
        assert flamia.attention(fq, fk, fv, fcu, max(LENS)).shape == q.shape


def test_a_torch_without_the_mode_probes_takes_the_custom_ops(monkeypatch):
    # _plain_eager leans on two private torch functions; where a torch lacks them, every call must
    # take the custom ops (the same bits), not raise.
    from flamia import ops

    q, k, v, cu = make_inputs(LENS, 4, 4, 64, seed=29)
    dout = make_dout(q, seed=31)
    o_eager, *grads_eager = flamia_grads(q, k, v, dout, cu, LENS)
    monkeypatch.setattr(ops, "_MODE_PROBES", None)
    assert not ops._plain_eager(q, k, v, cu)
    o_ops, *grads_ops = flamia_grads(q, k, v, dout, cu, LENS)
    assert torch.equal(o_ops, o_eager)
    assert all(torch.equal(a, b) for a, b in zip(grads_ops, grads_eager))


def test_lse_carries_no_gradient():
    q, k, v, cu = make_inputs(LENS, 4, 4, 64)
    q.requires_grad_(True)
    o, lse = run(q, k, v, cu, LENS)
    assert o.requires_grad and not lse.requires_grad


def test_cuda_graph_capture_replays_identically():
    q, k, v, cu = make_inputs(LENS, 16, 4, 128, seed=7)
    expected = run(q, k, v, cu, LENS)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graphs asks
        for _ in range(2):
            run(q, k, v, cu, LENS)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o, static_lse = run(q, k, v, cu, LENS)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_o, expected[0])
    assert torch.equal(static_lse, expected[1])

    # New data in the captured input buffers: the replay computes on it.
    q2, k2, v2, _ = make_inputs(LENS, 16, 4, 128, seed=8)
    q.copy_(q2)
    k.copy_(k2)
    v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    expected2 = run(q2, k2, v2, cu, LENS)
    assert torch.equal(static_o, expected2[0])
    assert torch.equal(static_lse, expected2[1])
