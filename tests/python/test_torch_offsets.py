"""Malformed cu_seqlens through flamia.attention on an sm_90 GPU (include/flamia/flamia.h, "Offsets
found malformed on the device"; python/flamia/_status.py).

Every call checks its offsets on the device without waiting: the outputs (o, lse, and the gradients
of the backward) are NaN, and a FlamiaError naming the first bad entry and its values is raised by
the next flamia call that starts after the record reached the host, or by flamia.check_errors().
validate="sync" (or FLAMIA_VALIDATE=sync) raises at once instead. Also under CUDA graph replay,
where a graph captured with good offsets is replayed after the offsets tensor is overwritten.

Needs torch and a CUDA device of compute capability 9.0, like tests/python/test_torch_op.py; skipped
otherwise (the host side runs on the CPU in tests/python/test_offsets_status.py).
"""

import pytest
from torch_sm90 import require_torch_sm90

torch = require_torch_sm90()

import flamia  # noqa: E402
from flamia import FlamiaError  # noqa: E402
from flamia import _capi  # noqa: E402

DEVICE = "cuda"
LENS = [100, 200]  # T = 300
T = sum(LENS)
INT32_MAX = 2**31 - 1

# (name, offsets, the record (error, index, value, bound)): issue #46's cases, 2^31 - 1 entries and a
# negative middle entry.
MALFORMED = [
    ("non-monotone", [0, 200, 100], (_capi.OFFSETS_DECREASING, 2, 100, 200)),
    ("past-the-end", [0, 100, 400], (_capi.OFFSETS_OUT_OF_RANGE, 2, 400, 300)),
    ("not-starting-at-0", [5, 100, 300], (_capi.OFFSETS_FIRST_NOT_ZERO, 0, 5, 0)),
    ("ending-before-T", [0, 100, 250], (_capi.OFFSETS_LAST_NOT_TOTAL, 2, 250, 300)),
    ("int32-max-middle", [0, INT32_MAX, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, INT32_MAX, 300)),
    ("int32-max-last", [0, 100, INT32_MAX], (_capi.OFFSETS_OUT_OF_RANGE, 2, INT32_MAX, 300)),
    ("negative-middle", [0, -5, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, -5, 300)),
]
IDS = [name for name, _, _ in MALFORMED]


def offsets(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def make_inputs(hq=4, hkv=2, d=128, seed=0, requires_grad=False):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(T, hq, d, generator=g, device=DEVICE).to(torch.bfloat16)
    k = torch.randn(T, hkv, d, generator=g, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(T, hkv, d, generator=g, device=DEVICE).to(torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v


def expect_offsets_error(info, record):
    error = info.value
    assert error.status == _capi.ERROR_INVALID_ARGUMENT
    assert error.offsets == record
    _, index, value, bound = record
    assert f"cu_seqlens[{index}]" in error.message and str(value) in error.message, error.message
    if record[0] != _capi.OFFSETS_FIRST_NOT_ZERO:
        assert str(bound) in error.message, error.message


@pytest.fixture(autouse=True)
def no_record_left_over():
    """Each test starts and ends with no pending record (a test that leaves one fails here)."""
    try:
        flamia.check_errors()
    except FlamiaError:
        pass
    yield
    flamia.check_errors()


@pytest.mark.parametrize("isolation", ["document", "prefix"])
@pytest.mark.parametrize("name,bad,record", MALFORMED, ids=IDS)
def test_forward_poisons_its_outputs_and_check_errors_names_the_entry(name, bad, record, isolation):
    q, k, v = make_inputs()
    o, lse = flamia.attention(q, k, v, offsets(bad), 200, isolation=isolation, return_lse=True)
    with pytest.raises(FlamiaError) as info:
        flamia.check_errors()
    expect_offsets_error(info, record)
    assert "outputs are NaN" in info.value.message
    assert torch.isnan(o).all() and torch.isnan(lse).all()
    flamia.check_errors()  # reported once


@pytest.mark.parametrize("save_codes", [True, False], ids=["saved-codes", "requantize"])
@pytest.mark.parametrize("isolation", ["document", "prefix"])
@pytest.mark.parametrize("name,bad,record", MALFORMED, ids=IDS)
def test_backward_poisons_every_gradient(name, bad, record, isolation, save_codes):
    q, k, v = make_inputs(requires_grad=True)
    o = flamia.attention(q, k, v, offsets(bad), 200, isolation=isolation, save_codes=save_codes,
                         deterministic=True)
    with pytest.raises(FlamiaError) as info:  # the forward's record
        flamia.check_errors()
    expect_offsets_error(info, record)
    o.backward(torch.randn_like(o))
    with pytest.raises(FlamiaError) as info:  # the backward's own
        flamia.check_errors()
    expect_offsets_error(info, record)
    for name_, grad in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert grad is not None and torch.isnan(grad).all(), name_


def test_fp16_partials_backward_is_poisoned_too():
    # Saved codes, document isolation, causal, D = 128, documents of 8,192 tokens on average and not
    # deterministic: dq comes from FP16 partials, initialized by the prep pass.
    lens = [4096, 12288]
    g = torch.Generator(device=DEVICE).manual_seed(3)
    q, k, v = (torch.randn(sum(lens), h, 128, generator=g, device=DEVICE).to(torch.bfloat16).requires_grad_()
               for h in (8, 1, 1))
    record = (_capi.OFFSETS_LAST_NOT_TOTAL, 2, 16000, 16384)
    o = flamia.attention(q, k, v, offsets([0, 4096, 16000]), 12288, deterministic=False)
    with pytest.raises(FlamiaError) as info:  # the forward's record (else the backward might raise it)
        flamia.check_errors()
    expect_offsets_error(info, record)
    o.backward(torch.randn_like(o))
    with pytest.raises(FlamiaError) as info:
        flamia.check_errors()
    expect_offsets_error(info, record)
    for grad in (q.grad, k.grad, v.grad):
        assert torch.isnan(grad).all()


def test_the_next_call_raises_once_the_record_reached_the_host():
    q, k, v = make_inputs()
    good = offsets([0, 100, 300])
    flamia.attention(q, k, v, offsets([0, 200, 100]), 200)
    torch.cuda.synchronize()  # a synchronization the caller has anyway (e.g. loss.item())
    with pytest.raises(FlamiaError) as info:
        flamia.attention(q, k, v, good, 200)
    expect_offsets_error(info, (_capi.OFFSETS_DECREASING, 2, 100, 200))
    assert "an earlier flamia call on cuda:" in info.value.message
    o = flamia.attention(q, k, v, good, 200)  # reported once: the next call runs
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("name,bad,record", MALFORMED, ids=IDS)
def test_sync_mode_raises_before_launching(name, bad, record):
    q, k, v = make_inputs()
    with pytest.raises(FlamiaError) as info:
        flamia.attention(q, k, v, offsets(bad), 200, validate="sync")
    expect_offsets_error(info, record)
    assert "earlier" not in info.value.message  # this call's own offsets, found on the host
    torch.cuda.synchronize()
    flamia.check_errors()  # nothing was launched, so nothing was recorded


def test_sync_mode_from_the_environment_and_its_max_seqlen_bound(monkeypatch):
    q, k, v = make_inputs()
    monkeypatch.setenv("FLAMIA_VALIDATE", "sync")
    with pytest.raises(FlamiaError) as info:
        flamia.attention(q, k, v, offsets([0, 100, 250]), 200)
    expect_offsets_error(info, (_capi.OFFSETS_LAST_NOT_TOTAL, 2, 250, 300))
    with pytest.raises(FlamiaError, match=r"max_seqlen \(150\) is smaller than the longest document \(200"):
        flamia.attention(q, k, v, offsets([0, 100, 300]), 150)
    flamia.attention(q, k, v, offsets([0, 100, 300]), 150, validate="async")  # the argument wins
    monkeypatch.setenv("FLAMIA_VALIDATE", "bogus")
    with pytest.raises(ValueError, match="FLAMIA_VALIDATE"):
        flamia.attention(q, k, v, offsets([0, 100, 300]), 200)
    with pytest.raises(ValueError, match="validate must be"):
        flamia.attention(q, k, v, offsets([0, 100, 300]), 200, validate="later")


def test_a_small_max_seqlen_gives_bitwise_the_same_results():
    # 5000 tokens: the true bound picks the chunked launch of the fold reference's scan, 1 the other.
    lens = [5000, 300, 0, 17]
    cu = offsets([0, 5000, 5300, 5300, 5317])
    g = torch.Generator(device=DEVICE).manual_seed(5)
    base = [torch.randn(5317, h, 128, generator=g, device=DEVICE).to(torch.bfloat16) for h in (4, 2, 2)]
    grad = torch.randn(5317, 4, 128, generator=g, device=DEVICE).to(torch.bfloat16)
    results = []
    for max_seqlen in (max(lens), 1):
        q, k, v = (t.clone().requires_grad_() for t in base)
        o, lse = flamia.attention(q, k, v, cu, max_seqlen, return_lse=True, deterministic=True)
        o.backward(grad)
        results.append((o.detach(), lse, q.grad, k.grad, v.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_valid_calls_leave_no_record():
    q, k, v = make_inputs(requires_grad=True)
    o = flamia.attention(q, k, v, offsets([0, 0, 100, 100, 300, 300]), 200)
    o.backward(torch.randn_like(o))
    flamia.check_errors()
    flamia.check_errors(0)
    flamia.check_errors("cuda")
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all()
    with pytest.raises(ValueError, match="CUDA device"):
        flamia.check_errors("cpu")


def test_sync_mode_refuses_graph_capture():
    q, k, v = make_inputs()
    cu = offsets([0, 100, 300])
    flamia.attention(q, k, v, cu, 200)  # warm-up: the status word exists before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="validate='sync'"):
        with torch.cuda.graph(graph):
            flamia.attention(q, k, v, cu, 200, validate="sync")


@pytest.mark.parametrize("isolation", ["document", "prefix"])
def test_graph_replay_checks_the_offsets_it_finds(isolation):
    q, k, v = make_inputs(seed=7)
    cu = offsets([0, 100, 300])
    expected = flamia.attention(q, k, v, cu, 200, isolation=isolation, return_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graphs asks
        for _ in range(2):
            flamia.attention(q, k, v, cu, 200, isolation=isolation, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o, static_lse = flamia.attention(q, k, v, cu, 200, isolation=isolation, return_lse=True)
    graph.replay()
    torch.cuda.synchronize()
    flamia.check_errors()
    assert torch.equal(static_o, expected[0]) and torch.equal(static_lse, expected[1])

    for _, bad, record in MALFORMED:
        cu.copy_(offsets(bad))  # the captured offsets tensor, overwritten
        graph.replay()
        with pytest.raises(FlamiaError) as info:
            flamia.check_errors()
        expect_offsets_error(info, record)
        assert torch.isnan(static_o).all() and torch.isnan(static_lse).all()

    # The next eager call reports a replay's record too (once it reached the host).
    cu.copy_(offsets([0, 200, 100]))
    graph.replay()
    torch.cuda.synchronize()
    with pytest.raises(FlamiaError) as info:
        flamia.attention(q, k, v, offsets([0, 100, 300]), 200)
    expect_offsets_error(info, MALFORMED[0][2])

    cu.copy_(offsets([0, 100, 300]))
    graph.replay()
    torch.cuda.synchronize()
    flamia.check_errors()
    assert torch.equal(static_o, expected[0]) and torch.equal(static_lse, expected[1])


@pytest.mark.parametrize("isolation", ["document", "prefix"])
def test_graph_replayed_training_call_poisons_every_gradient(isolation):
    q, k, v = make_inputs(seed=9, requires_grad=True)
    cu = offsets([0, 100, 300])
    grad = torch.randn(T, 4, 128, device=DEVICE).to(torch.bfloat16)

    def step():
        o = flamia.attention(q, k, v, cu, 200, isolation=isolation, deterministic=True)
        o.backward(grad)
        return o

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            q.grad = k.grad = v.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    q.grad = k.grad = v.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = step()
    graph.replay()
    torch.cuda.synchronize()
    flamia.check_errors()
    good = [t.clone() for t in (static_o, q.grad, k.grad, v.grad)]
    assert all(torch.isfinite(t).all() for t in good)

    for _, bad, record in MALFORMED:
        cu.copy_(offsets(bad))
        graph.replay()
        with pytest.raises(FlamiaError) as info:
            flamia.check_errors()
        expect_offsets_error(info, record)
        for t in (static_o, q.grad, k.grad, v.grad):
            assert torch.isnan(t).all()

    cu.copy_(offsets([0, 100, 300]))
    graph.replay()
    torch.cuda.synchronize()
    flamia.check_errors()
    for got, want in zip((static_o, q.grad, k.grad, v.grad), good):
        assert torch.equal(got, want)
