"""Malformed cu_seqlens found on the device, reported on the host: the part that needs no torch.

Every flamia call checks its cu_seqlens on the device, in its first kernel, without waiting for it
(include/flamia/flamia.h, "Offsets found malformed on the device"): a violation makes every output
of the call NaN and is recorded in a status word, a ``flamia_offsets_status`` of 16 bytes. The
PyTorch ops keep one status word per device in pinned host memory, which the device writes through
its mapping, so the host reads it with a plain load: each op looks at it before it launches
anything (``StatusWord.pending``, no CUDA call) and raises the recorded error, so a violation is
reported by the first flamia call that starts after it reached the host (at the latest, the first
call after any synchronization), or by ``flamia.check_errors()``. A word keeps its first record
until it is reported; reporting clears it.

``validate="sync"`` (or ``FLAMIA_VALIDATE=sync``) checks before launching instead: it copies
cu_seqlens to the host (a synchronization) and raises at once, with the same message.
"""

import ctypes
import os

from . import _capi
from ._capi import FlamiaError

ENV_VALIDATE = "FLAMIA_VALIDATE"
VALIDATE_MODES = ("async", "sync")


def check_validate_argument(validate):
    """Raise ValueError unless validate is None or one of VALIDATE_MODES."""
    if validate is not None and (not isinstance(validate, str) or validate not in VALIDATE_MODES):
        raise ValueError(f"flamia.attention: validate must be None, 'async' or 'sync', got {validate!r}")


def validate_mode(validate, environ=None):
    """The mode of a call: validate itself, or for None the environment's FLAMIA_VALIDATE ('async'
    when unset or empty). ValueError names a bad argument or environment value."""
    check_validate_argument(validate)
    if validate is not None:
        return validate
    value = (os.environ if environ is None else environ).get(ENV_VALIDATE, "").strip().lower()
    if not value:
        return "async"
    if value not in VALIDATE_MODES:
        raise ValueError(f"flamia: the environment variable {ENV_VALIDATE} must be 'async' or 'sync', got {value!r}")
    return value


def offsets_error(record, where, found_on_device=True):
    """The FlamiaError (ERROR_INVALID_ARGUMENT) of a record (an OffsetsStatus that holds one): its
    message names the first bad entry and its values; ``error.offsets`` is (error, index, value,
    bound), the record's fields."""
    detail = _capi.offsets_status_message(record) or "(no record)"
    if found_on_device:
        message = (f"malformed cu_seqlens in an earlier flamia call on {where}, found on the device after it "
                   f"was launched (that call's outputs are NaN): {detail}")
    else:
        message = detail
    error = FlamiaError(_capi.ERROR_INVALID_ARGUMENT, message)
    error.offsets = record.as_tuple()
    return error


def check_offsets_on_host(cu_seqlens_host, total_tokens, max_seqlen):
    """validate="sync": the host check of a host copy of cu_seqlens (a sequence of ints), with the
    device's rule and message, and max_seqlen >= the longest document; raises FlamiaError (its
    ``offsets`` the device's record, zeros for the max_seqlen bound, which the device leaves alone)."""
    _capi.validate_cu_seqlens(cu_seqlens_host, total_tokens, max_seqlen)


class StatusWord:
    """One flamia_offsets_status at `address` in memory the host can read directly (pinned host
    memory the device writes through its mapping). `owner` keeps that memory alive; `where` names
    the device in messages (e.g. "cuda:0")."""

    def __init__(self, address, owner=None, where="the device"):
        if address % 16 != 0:
            raise ValueError(f"flamia: a status word must be 16-byte aligned, got address {address:#x}")
        self.address = int(address)
        self.owner = owner
        self.where = where
        self.record = _capi.OffsetsStatus.from_address(self.address)

    def pending(self):
        """Whether a record has reached the host (a plain load; no CUDA call)."""
        return self.record.error != _capi.OFFSETS_OK

    def take(self):
        """A copy of the record, and the word cleared for the next one. Call it once the device's
        work is done (a record may still be arriving while a kernel that writes it runs)."""
        copy = _capi.OffsetsStatus(*self.record.as_tuple())
        ctypes.memset(self.address, 0, ctypes.sizeof(_capi.OffsetsStatus))
        return copy

    def error(self):
        """The FlamiaError of the record (taken, so the word is clear), or None when it holds none."""
        if not self.pending():
            return None
        return offsets_error(self.take(), self.where)
