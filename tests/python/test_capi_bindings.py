"""The ctypes layer (python/flamia/_capi.py) against the real libflamia_capi.so, without torch or a
GPU: the workspace size queries take no device, so their signatures and the documents argument can
be checked on the CPU machine. CTest sets FLAMIA_CAPI_LIB when the library is built (it needs the
CUDA toolkit, not a GPU); elsewhere the module is skipped with the reason.
"""

import ctypes
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
from capi_library import BUILT, REASON  # noqa: E402

if not BUILT:
    pytest.skip(REASON, allow_module_level=True)
sys.path.insert(0, str(REPO / "python"))

from flamia import _capi  # noqa: E402

T, HQ, HKV, D = 1000, 8, 2, 128
STEP = 32  # core/operand_layout.h kKeyStep: one step of slack per document in the transposed layout


def shapes():
    q = _capi.tensor(0, T, HQ, D, HQ * D, D)
    kv = _capi.tensor(0, T, HKV, D, HKV * D, D)
    return q, kv, kv


def docs(num_docs):
    return _capi.Documents(None, None, num_docs, 1)  # only num_docs is read


@pytest.mark.parametrize("query", [_capi.forward_workspace_size, _capi.backward_workspace_size])
def test_size_queries_take_the_document_count(query):
    one = query(*shapes(), docs(1))
    many = query(*shapes(), docs(101))
    assert one > 0 and one % 256 == 0
    # The transposed code layouts hold one 32-token step of slack per document: V's in the forward
    # (Hkv heads), Q's, K's and dO's in the backward (2 Hq + Hkv heads); 256-byte regions round up.
    heads = HKV if query is _capi.forward_workspace_size else 2 * HQ + HKV
    grown = many - one
    assert heads * D * STEP * 100 <= grown <= heads * D * STEP * 100 + 256 * 8


@pytest.mark.parametrize("query", [_capi.forward_workspace_size, _capi.backward_workspace_size])
def test_size_queries_reject_an_empty_document_list(query):
    with pytest.raises(_capi.FlamiaError) as info:
        query(*shapes(), docs(0))
    assert info.value.status == _capi.ERROR_INVALID_ARGUMENT
    assert "docs.num_docs" in info.value.message


def test_size_query_names_a_bad_shape():
    q, k, v = shapes()
    bad = _capi.tensor(0, T, 3, D, 3 * D, D)  # 8 query heads over 3 K/V heads
    with pytest.raises(_capi.FlamiaError) as info:
        _capi.forward_workspace_size(q, bad, bad, docs(1))
    assert "k.heads" in info.value.message


def test_training_pair_sizes():
    # The saved codes hold q, k and v in both layouts and their scales; the training pair's
    # workspaces drop exactly the q, k, v regions of the others (up to 256-byte rounding).
    d = docs(5)
    saved = _capi.saved_codes_size(*shapes(), d)
    fwd, fwd_train = _capi.forward_workspace_size(*shapes(), d), _capi.forward_train_workspace_size(*shapes(), d)
    bwd, bwd_saved = _capi.backward_workspace_size(*shapes(), d), _capi.backward_saved_workspace_size(*shapes(), d)
    slots = STEP * ((T + STEP - 1) // STEP + 5)
    codes = T * D * (HQ + 2 * HKV) + (HQ + 2 * HKV) * D * slots + T * (HQ + 2 * HKV)
    row_max_prob = T * HQ * 4  # FP32 [Hq, T]: the forward's 1 / l_i, for the FP16 dQ partials
    assert codes + row_max_prob <= saved <= codes + row_max_prob + 256 * 10
    # V's running scale max, the forward kernel's work counter (one 256-byte region), the work
    # order (an 8-byte entry per 128-token tile slot, a 4-byte counter per cost 0 .. ceil(T / 128))
    # and the checked copy of cu_seqlens (num_docs + 1 int32) alone
    tiles = -(-T // 128)
    work_order = (-(-(tiles + 5) * 8 // 256) * 256 + -(-(tiles + 1) * 4 // 256) * 256 +
                  -(-(5 + 1) * 4 // 256) * 256)
    assert fwd_train == -(-T * HKV // 256) * 256 + 256 + work_order
    assert fwd_train < fwd and bwd_saved < bwd
    base = bwd - bwd_saved + HKV * D * slots + row_max_prob
    assert base <= saved <= base + 256 * 10
    with pytest.raises(_capi.FlamiaError) as info:
        _capi.saved_codes_size(*shapes(), docs(0))
    assert "docs.num_docs" in info.value.message


def test_prefix_isolation_sizes_hold_the_interior_codes():
    # Prefix isolation with block32 geometry encodes K and V a second time (block32, for interior
    # pairs): both layouts of each in the saved codes, with their scales; token geometry does not.
    d = docs(5)
    prefix = _capi.default_options()
    prefix.isolation = _capi.ISOLATION["prefix"]
    prefix_token = _capi.default_options()
    prefix_token.isolation = _capi.ISOLATION["prefix"]
    prefix_token.scale_geometry = _capi.SCALE_GEOMETRY["token"]
    slots = STEP * ((T + STEP - 1) // STEP + 5)
    interior = 2 * (T * HKV * D + HKV * D * slots + T * HKV)
    base = _capi.saved_codes_size(*shapes(), d)
    assert _capi.saved_codes_size(*shapes(), d, prefix_token) == base
    assert interior <= _capi.saved_codes_size(*shapes(), d, prefix) - base <= interior + 256 * 6
    assert _capi.forward_workspace_size(*shapes(), d, prefix) > _capi.forward_workspace_size(*shapes(), d)
    bwd_saved = _capi.backward_saved_workspace_size
    assert bwd_saved(*shapes(), d, prefix) == bwd_saved(*shapes(), d)  # the codes are saved, not here


def test_the_library_has_the_bindings_abi_and_the_packages_version():
    import flamia
    assert _capi.library().flamia_abi_version() == _capi.ABI_VERSION
    assert _capi.library_version() == flamia.__version__


# ---- malformed cu_seqlens: the host check and the status word's message (no GPU needed) ----

# (offsets for T = 300, expected (error, index, value, bound)) for every rule, the first bad entry
# winning and an entry out of range named before the decrease that follows it.
MALFORMED = [
    ([0, 200, 100], (_capi.OFFSETS_DECREASING, 2, 100, 200)),
    ([0, 100, 400], (_capi.OFFSETS_OUT_OF_RANGE, 2, 400, 300)),
    ([5, 100, 300], (_capi.OFFSETS_FIRST_NOT_ZERO, 0, 5, 0)),
    ([0, 100, 250], (_capi.OFFSETS_LAST_NOT_TOTAL, 2, 250, 300)),
    ([0, 2**31 - 1, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, 2**31 - 1, 300)),
    ([0, 100, 2**31 - 1], (_capi.OFFSETS_OUT_OF_RANGE, 2, 2**31 - 1, 300)),
    ([0, -5, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, -5, 300)),
    ([0, 100, -7, 300], (_capi.OFFSETS_OUT_OF_RANGE, 2, -7, 300)),
    ([0, 400, 100, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, 400, 300)),
    ([0, 50, 40, 300, 10], (_capi.OFFSETS_DECREASING, 2, 40, 50)),
]


@pytest.mark.parametrize("offsets,record", MALFORMED, ids=[str(o) for o, _ in MALFORMED])
def test_host_check_names_the_first_bad_entry_and_its_values(offsets, record):
    with pytest.raises(_capi.FlamiaError) as info:
        _capi.validate_cu_seqlens(offsets, 300)
    error = info.value
    assert error.status == _capi.ERROR_INVALID_ARGUMENT
    _, index, value, bound = record
    assert f"cu_seqlens[{index}]" in error.message and str(value) in error.message, error.message
    if record[0] != _capi.OFFSETS_FIRST_NOT_ZERO:
        assert str(bound) in error.message, error.message
    # The record the device writes for the same offsets, and its message: the same text.
    got = _capi.OffsetsStatus()
    status = _capi.library().flamia_validate_cu_seqlens(
        ctypes.cast((ctypes.c_int32 * len(offsets))(*offsets), ctypes.c_void_p), len(offsets) - 1, 300, 0,
        ctypes.byref(got), ctypes.byref(_capi.Error()))
    assert status == _capi.ERROR_INVALID_ARGUMENT
    assert got.as_tuple() == record
    assert _capi.offsets_status_message(_capi.OffsetsStatus(*record)) == error.message


def test_host_check_passes_valid_offsets_and_checks_the_max_seqlen_bound():
    assert _capi.validate_cu_seqlens([0, 100, 100, 300], 300).as_tuple() == (0, 0, 0, 0)
    assert _capi.validate_cu_seqlens([0, 300], 300, max_seqlen=300).as_tuple() == (0, 0, 0, 0)
    with pytest.raises(_capi.FlamiaError) as info:
        _capi.validate_cu_seqlens([0, 100, 300], 300, max_seqlen=150)  # the longest document has 200 tokens
    assert "max_seqlen (150)" in info.value.message and "longest document (200" in info.value.message
    for bad_total in (0, -1, 2**31):
        with pytest.raises(_capi.FlamiaError) as info:
            _capi.validate_cu_seqlens([0, 1], bad_total)
        assert "total_tokens" in info.value.message
    with pytest.raises(_capi.FlamiaError) as info:
        _capi.validate_cu_seqlens([0], 1)
    assert "at least 2 entries" in info.value.message
    with pytest.raises(_capi.FlamiaError) as info:
        _capi.validate_cu_seqlens([0, 2**31], 1)
    assert "cu_seqlens[1] = 2147483648 does not fit int32" in info.value.message


def test_status_word_message_of_an_empty_and_an_unknown_record():
    assert _capi.offsets_status_message(_capi.OffsetsStatus()) is None
    message = _capi.offsets_status_message(_capi.OffsetsStatus(99, 3, 7, 8))
    assert "unknown offsets error 99" in message and "entry 3" in message
    error = _capi.Error()
    assert _capi.library().flamia_offsets_status_message(None, ctypes.byref(error)) == _capi.ERROR_INVALID_ARGUMENT
    assert b"record is NULL" in error.message


def test_status_query_checks_its_arguments_before_any_cuda_call():
    for pointer, needle in ((0, "status is NULL"), (0x1008, "16-byte aligned")):
        with pytest.raises(_capi.FlamiaError) as info:
            _capi.check_offsets_status(pointer)
        assert info.value.status == _capi.ERROR_INVALID_ARGUMENT and needle in info.value.message
    error = _capi.Error()
    status = _capi.library().flamia_check_offsets_status(ctypes.c_void_p(0x1000), 2, None, ctypes.byref(error))
    assert status == _capi.ERROR_INVALID_ARGUMENT and b"clear must be 0 or 1" in error.message


def test_documents_carry_the_status_word():
    d = _capi.Documents(0x1000, None, 3, 9, 0x2000)
    assert d.status == 0x2000 and d.num_docs == 3
    assert _capi.Documents(0x1000, None, 3, 9).status is None
