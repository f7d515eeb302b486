"""The host side of malformed cu_seqlens, without torch or a GPU (python/flamia/_status.py): the
validate mode and its environment variable, the status word that the device writes and the ops read
before they launch (here a ctypes buffer stands in for the pinned memory), the FlamiaError it
becomes, the synchronous host check, and the public names. The records and messages come from the
real libflamia_capi.so (CTest sets FLAMIA_CAPI_LIB when it is built); the tests that need it skip
without it. tests/python/test_torch_op.py runs the same paths on the GPU."""

import ast
import ctypes
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from capi_library import needs_library  # noqa: E402
from flamia import _capi, _status  # noqa: E402



def test_validate_mode_defaults_to_async_and_reads_the_environment():
    assert _status.validate_mode(None, {}) == "async"
    assert _status.validate_mode(None, {"FLAMIA_VALIDATE": ""}) == "async"
    assert _status.validate_mode(None, {"FLAMIA_VALIDATE": "sync"}) == "sync"
    assert _status.validate_mode(None, {"FLAMIA_VALIDATE": " SYNC "}) == "sync"
    assert _status.validate_mode(None, {"FLAMIA_VALIDATE": "async"}) == "async"
    # An explicit argument wins over the environment.
    assert _status.validate_mode("async", {"FLAMIA_VALIDATE": "sync"}) == "async"
    assert _status.validate_mode("sync", {}) == "sync"


def test_validate_mode_names_bad_values():
    with pytest.raises(ValueError, match="FLAMIA_VALIDATE must be 'async' or 'sync', got 'later'"):
        _status.validate_mode(None, {"FLAMIA_VALIDATE": "later"})
    for bad in ("SYNC", "eager", 1, True):
        with pytest.raises(ValueError, match="validate must be None, 'async' or 'sync'"):
            _status.validate_mode(bad, {})


class PinnedStandIn:
    """16 bytes, 16-byte aligned, that the test writes as the device would."""

    def __init__(self):
        self.raw = ctypes.create_string_buffer(64)
        self.address = (ctypes.addressof(self.raw) + 15) // 16 * 16

    def device_writes(self, error, index, value, bound):
        ctypes.memmove(self.address, ctypes.byref(_capi.OffsetsStatus(error, index, value, bound)), 16)


def test_status_word_must_be_aligned():
    memory = PinnedStandIn()
    with pytest.raises(ValueError, match="16-byte aligned"):
        _status.StatusWord(memory.address + 4, memory)


@needs_library
def test_status_word_becomes_a_flamia_error_once():
    memory = PinnedStandIn()
    word = _status.StatusWord(memory.address, memory, "cuda:3")
    assert not word.pending() and word.error() is None
    memory.device_writes(_capi.OFFSETS_DECREASING, 2, 100, 200)
    assert word.pending()
    error = word.error()
    assert isinstance(error, _capi.FlamiaError) and error.status == _capi.ERROR_INVALID_ARGUMENT
    assert error.offsets == (_capi.OFFSETS_DECREASING, 2, 100, 200)
    assert "cuda:3" in error.message and "outputs are NaN" in error.message
    assert error.message.endswith("cu_seqlens must be non-decreasing, but cu_seqlens[2] = 100 < cu_seqlens[1] = 200")
    # Reported once: the word is clear for the next violation.
    assert not word.pending() and word.error() is None
    assert bytes((ctypes.c_char * 16).from_address(memory.address)) == bytes(16)
    memory.device_writes(_capi.OFFSETS_LAST_NOT_TOTAL, 2, 250, 300)
    assert word.error().offsets == (_capi.OFFSETS_LAST_NOT_TOTAL, 2, 250, 300)


@needs_library
@pytest.mark.parametrize("offsets,record", [
    ([0, 200, 100], (_capi.OFFSETS_DECREASING, 2, 100, 200)),
    ([0, 100, 400], (_capi.OFFSETS_OUT_OF_RANGE, 2, 400, 300)),
    ([5, 100, 300], (_capi.OFFSETS_FIRST_NOT_ZERO, 0, 5, 0)),
    ([0, 100, 250], (_capi.OFFSETS_LAST_NOT_TOTAL, 2, 250, 300)),
    ([0, 2**31 - 1, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, 2**31 - 1, 300)),
    ([0, -5, 300], (_capi.OFFSETS_OUT_OF_RANGE, 1, -5, 300)),
])
def test_sync_check_raises_the_devices_record_and_message(offsets, record):
    with pytest.raises(_capi.FlamiaError) as info:
        _status.check_offsets_on_host(offsets, 300, 300)
    assert info.value.offsets == record
    # The asynchronous report of the same record ends with the same text.
    memory = PinnedStandIn()
    memory.device_writes(*record)
    assert _status.StatusWord(memory.address, memory).error().message.endswith(info.value.message)


@needs_library
def test_sync_check_refuses_a_max_seqlen_below_the_longest_document_without_a_record():
    _status.check_offsets_on_host([0, 100, 300], 300, 200)
    with pytest.raises(_capi.FlamiaError) as info:
        _status.check_offsets_on_host([0, 100, 300], 300, 199)
    assert "max_seqlen (199)" in info.value.message
    assert info.value.offsets == (0, 0, 0, 0)


def test_flamia_error_has_no_offsets_by_default():
    assert _capi.FlamiaError(_capi.ERROR_INVALID_ARGUMENT, "x").offsets is None


def test_public_names_and_signatures():
    """flamia exports check_errors next to attention; attention takes validate=None; the ops module
    (which needs torch to import) is read as source."""
    import flamia
    assert "check_errors" in flamia.__all__ and callable(flamia.check_errors)
    ops = ast.parse((REPO / "python" / "flamia" / "ops.py").read_text())
    functions = {node.name: node for node in ops.body if isinstance(node, ast.FunctionDef)}
    attention = functions["attention"].args
    names = [a.arg for a in attention.args]
    assert names[-1] == "validate" and isinstance(attention.defaults[-1], ast.Constant)
    assert attention.defaults[-1].value is None
    check_errors = functions["check_errors"].args
    assert [a.arg for a in check_errors.args] == ["device"] and check_errors.defaults[0].value is None
    exported = next(node for node in ops.body if isinstance(node, ast.Assign)
                    and getattr(node.targets[0], "id", None) == "__all__")
    assert "check_errors" in ast.literal_eval(exported.value)
