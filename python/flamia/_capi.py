"""ctypes bindings to libflamia_capi.so, the C API of include/flamia/flamia.h.

Nothing here imports torch: the structures mirror the C structs field by field (same order, same
C types, so ctypes lays them out exactly as the C compiler does), and every pointer is passed as
a raw address (an int), which is what torch's ``data_ptr()`` returns.

The library is found at ``$FLAMIA_CAPI_LIB`` (a path to the .so) when it is set, else next to this
module (where ``pip install .`` puts it; an editable install's copy is found through sys.path). It is loaded on first use, so importing the package
works on machines without the library (for example to trace with fake tensors).
"""

import ctypes
import math
import os
import pathlib
import sys
import threading

__all__ = [
    "FlamiaError",
    "Tensor",
    "Documents",
    "Options",
    "Error",
    "OffsetsStatus",
    "library",
    "library_path",
    "library_version",
    "ABI_VERSION",
    "default_options",
    "explicit_softmax_scale",
    "status_name",
    "tensor",
    "forward_workspace_size",
    "forward",
    "backward_workspace_size",
    "backward",
    "check",
    "offsets_status_message",
    "validate_cu_seqlens",
    "check_offsets_status",
    "SUCCESS",
    "ERROR_INVALID_ARGUMENT",
    "ERROR_NOT_SUPPORTED",
    "ERROR_WORKSPACE",
    "ERROR_CUDA",
    "DTYPE_BF16",
    "DTYPE_FP16",
    "DTYPE_FP32",
    "ISOLATION",
    "SCALE_GEOMETRY",
    "SCALE_RULE",
    "P_BOOST_LOG2_DEFAULT",
    "P_BOOST_LOG2_MAX",
    "OFFSETS_ERRORS",
]

LIBRARY_NAME = "libflamia_capi.so"
ENV_LIBRARY = "FLAMIA_CAPI_LIB"
# FLAMIA_ABI_VERSION of the header these bindings mirror (include/flamia/flamia.h): a library built
# from another is refused when it loads, rather than handed structs it would misread.
ABI_VERSION = 3

# enum flamia_status
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NOT_SUPPORTED = 2
ERROR_WORKSPACE = 3
ERROR_CUDA = 4
_STATUS_NAMES = {
    SUCCESS: "FLAMIA_SUCCESS",
    ERROR_INVALID_ARGUMENT: "FLAMIA_ERROR_INVALID_ARGUMENT",
    ERROR_NOT_SUPPORTED: "FLAMIA_ERROR_NOT_SUPPORTED",
    ERROR_WORKSPACE: "FLAMIA_ERROR_WORKSPACE",
    ERROR_CUDA: "FLAMIA_ERROR_CUDA",
}

# enum flamia_dtype
DTYPE_BF16 = 0
DTYPE_FP16 = 1
DTYPE_FP32 = 2

# enum flamia_offsets_error: what the device (or the host check) found wrong with cu_seqlens.
OFFSETS_OK = 0
OFFSETS_FIRST_NOT_ZERO = 1
OFFSETS_OUT_OF_RANGE = 2
OFFSETS_DECREASING = 3
OFFSETS_LAST_NOT_TOTAL = 4
OFFSETS_ERRORS = {
    OFFSETS_OK: "FLAMIA_OFFSETS_OK",
    OFFSETS_FIRST_NOT_ZERO: "FLAMIA_OFFSETS_FIRST_NOT_ZERO",
    OFFSETS_OUT_OF_RANGE: "FLAMIA_OFFSETS_OUT_OF_RANGE",
    OFFSETS_DECREASING: "FLAMIA_OFFSETS_DECREASING",
    OFFSETS_LAST_NOT_TOTAL: "FLAMIA_OFFSETS_LAST_NOT_TOTAL",
}

# The Python spellings of the option enums (flamia_isolation, flamia_scale_geometry,
# flamia_scale_rule) and their C values.
ISOLATION = {"document": 0, "prefix": 1}
SCALE_GEOMETRY = {"block32": 0, "token": 1}
SCALE_RULE = {"ceil": 0, "floor": 1}

# FLAMIA_P_BOOST_LOG2_DEFAULT and FLAMIA_P_BOOST_LOG2_MAX: flamia_options.p_boost_log2's default and
# largest value (tests/python/test_capi_header_agreement.py reads them from the header).
P_BOOST_LOG2_DEFAULT = 8
P_BOOST_LOG2_MAX = 8

# A C enum is an int on every ABI flamia supports (validate.cpp static_asserts the same).
_c_enum = ctypes.c_int


class FlamiaError(RuntimeError):
    """A C API call failed: ``status`` is the flamia_status value, ``message`` the C message
    (it names the bad argument), ``status_name`` e.g. ``"FLAMIA_ERROR_INVALID_ARGUMENT"``. For
    malformed cu_seqlens, ``offsets`` is the record (error, index, value, bound) of
    flamia_offsets_status; None otherwise."""

    offsets = None

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = _STATUS_NAMES.get(self.status, f"FLAMIA_UNKNOWN_STATUS({self.status})")
        self.message = str(message)
        super().__init__(f"{self.status_name}: {self.message}")

    def __reduce__(self):  # picklable (e.g. across multiprocessing)
        return (type(self), (self.status, self.message))


class Tensor(ctypes.Structure):
    """struct flamia_tensor: a packed [tokens, heads, dim] device tensor, strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", _c_enum),  # flamia_dtype
        ("tokens", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("stride_token", ctypes.c_int64),
        ("stride_head", ctypes.c_int64),
    ]


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _int32(value, name):
    """value as an int for a C int32_t field; ctypes would wrap an out-of-range value silently."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = value.__index__()  # numpy and torch integers
        except (AttributeError, TypeError):
            raise TypeError(f"flamia: {name} must be an int, got {type(value).__name__}") from None
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"flamia: {name} ({value}) does not fit the C API's int32 (at most {INT32_MAX})")
    return value


class OffsetsStatus(ctypes.Structure):
    """struct flamia_offsets_status: the status word in which the device records the first bad
    entry of a malformed cu_seqlens (error 0: nothing recorded). 16 bytes; the memory the device
    writes must be 16-byte aligned."""

    _fields_ = [
        ("error", ctypes.c_int32),  # flamia_offsets_error
        ("index", ctypes.c_int32),  # the first bad entry
        ("value", ctypes.c_int32),  # cu_seqlens[index]
        ("bound", ctypes.c_int32),  # cu_seqlens[index - 1] (decreasing) or T (out of range, last entry)
    ]

    def as_tuple(self):
        return (self.error, self.index, self.value, self.bound)


class Documents(ctypes.Structure):
    """struct flamia_documents: device cu_seqlens (+ optional host copy), num_docs, max_seqlen and
    the status word the device records malformed offsets in (an address, or None). num_docs and
    max_seqlen must fit int32 (ValueError otherwise; the C API checks the rest)."""

    _fields_ = [
        ("cu_seqlens", ctypes.c_void_p),  # const int32_t*, device
        ("cu_seqlens_host", ctypes.c_void_p),  # const int32_t*, host, may be NULL
        ("num_docs", ctypes.c_int32),
        ("max_seqlen", ctypes.c_int32),
        ("status", ctypes.c_void_p),  # flamia_offsets_status*, device-writable, may be NULL
    ]

    def __init__(self, cu_seqlens=None, cu_seqlens_host=None, num_docs=0, max_seqlen=0, status=None):
        super().__init__(cu_seqlens, cu_seqlens_host, _int32(num_docs, "num_docs"), _int32(max_seqlen, "max_seqlen"),
                         status)


class Options(ctypes.Structure):
    """struct flamia_options."""

    _fields_ = [
        ("causal", ctypes.c_int),
        ("softmax_scale", ctypes.c_float),  # +0 = 1/sqrt(D); set explicit values via explicit_softmax_scale
        ("isolation", _c_enum),  # flamia_isolation
        ("scale_geometry", _c_enum),  # flamia_scale_geometry
        ("scale_rule", _c_enum),  # flamia_scale_rule
        ("p_boost_log2", ctypes.c_int),
        ("deterministic", ctypes.c_int),  # 0: FP16 dQ partials where they apply; 1: always deterministic
    ]


class Error(ctypes.Structure):
    """struct flamia_error: a caller-owned message buffer."""

    _fields_ = [("message", ctypes.c_char * 512)]


# The layout the C compiler gives these structs on x86-64 / aarch64 Linux (LP64).
assert ctypes.sizeof(Tensor) == 56 and Tensor.tokens.offset == 16 and Tensor.stride_head.offset == 48
assert ctypes.sizeof(Documents) == 32 and Documents.num_docs.offset == 16 and Documents.status.offset == 24
assert ctypes.sizeof(OffsetsStatus) == 16 and OffsetsStatus.bound.offset == 12
assert ctypes.sizeof(Options) == 28 and Options.p_boost_log2.offset == 20 and Options.deterministic.offset == 24
assert ctypes.sizeof(Error) == 512

_lock = threading.Lock()
_lib = None


def _candidates():
    """Where the library may be, in order: next to this module (a regular install), then every
    directory of the package's __path__ and every sys.path entry's flamia/ (an editable install
    keeps the Python sources in the repository and the library in site-packages)."""
    here = pathlib.Path(__file__).resolve().parent
    seen, out = set(), []
    package = sys.modules.get(__package__ or "flamia")
    dirs = [here] + [pathlib.Path(p) for p in getattr(package, "__path__", [])]
    dirs += [pathlib.Path(p) / "flamia" for p in sys.path if p]
    for d in dirs:
        path = d / LIBRARY_NAME
        if str(path) not in seen:
            seen.add(str(path))
            out.append(path)
    return out


def library_path():
    """The library to load: $FLAMIA_CAPI_LIB when set, else the first candidate that exists
    (else the path next to this module, for the error message)."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        return pathlib.Path(env)
    candidates = _candidates()
    for path in candidates:
        if path.is_file():
            return path
    return candidates[0]


def _check_abi(lib, path):
    """Refuse a library whose binary interface is not the one these bindings mirror."""
    try:
        abi = lib.flamia_abi_version
    except AttributeError:
        raise RuntimeError(
            f"flamia: the C API library at {path} has no flamia_abi_version: it was built before the ABI "
            f"check (these bindings need ABI {ABI_VERSION}); rebuild it (cmake target flamia_capi) or "
            f"reinstall the package") from None
    abi.argtypes, abi.restype = [], ctypes.c_int
    found = abi()
    if found != ABI_VERSION:
        raise RuntimeError(
            f"flamia: the C API library at {path} has ABI {found}, these bindings need ABI {ABI_VERSION} "
            f"(its structs or signatures differ); rebuild it from this source tree (cmake target "
            f"flamia_capi) or reinstall the package")


def _declare(lib):
    ptr = ctypes.POINTER
    lib.flamia_default_options.argtypes = [ptr(Options)]
    lib.flamia_default_options.restype = None
    lib.flamia_status_name.argtypes = [_c_enum]
    lib.flamia_status_name.restype = ctypes.c_char_p
    lib.flamia_version.argtypes, lib.flamia_version.restype = [], ctypes.c_char_p
    lib.flamia_forward_workspace_size.argtypes = [
        ptr(Tensor), ptr(Tensor), ptr(Tensor), ptr(Documents), ptr(Options), ptr(ctypes.c_size_t), ptr(Error)]
    lib.flamia_forward_workspace_size.restype = _c_enum
    lib.flamia_forward.argtypes = [
        ptr(Tensor), ptr(Tensor), ptr(Tensor),  # q, k, v
        ptr(Documents), ptr(Options),  # docs, options
        ptr(Tensor), ctypes.c_void_p,  # o, lse (float*)
        ctypes.c_void_p, ctypes.c_size_t,  # workspace, workspace_bytes
        ctypes.c_void_p,  # stream (cudaStream_t)
        ptr(Error),
    ]
    lib.flamia_forward.restype = _c_enum
    lib.flamia_backward_workspace_size.argtypes = [
        ptr(Tensor), ptr(Tensor), ptr(Tensor), ptr(Documents), ptr(Options), ptr(ctypes.c_size_t), ptr(Error)]
    lib.flamia_backward_workspace_size.restype = _c_enum
    lib.flamia_backward.argtypes = [
        ptr(Tensor), ptr(Tensor), ptr(Tensor),  # q, k, v
        ptr(Tensor), ctypes.c_void_p, ptr(Tensor),  # o, lse (const float*), dout
        ptr(Documents), ptr(Options),  # docs, options
        ptr(Tensor), ptr(Tensor), ptr(Tensor),  # dq, dk, dv
        ctypes.c_void_p, ctypes.c_size_t,  # workspace, workspace_bytes
        ctypes.c_void_p,  # stream (cudaStream_t)
        ptr(Error),
    ]
    lib.flamia_backward.restype = _c_enum
    for query in ("flamia_saved_codes_size", "flamia_forward_train_workspace_size",
                  "flamia_backward_saved_workspace_size"):
        getattr(lib, query).argtypes = [
            ptr(Tensor), ptr(Tensor), ptr(Tensor), ptr(Documents), ptr(Options), ptr(ctypes.c_size_t), ptr(Error)]
        getattr(lib, query).restype = _c_enum
    lib.flamia_forward_train.argtypes = [
        ptr(Tensor), ptr(Tensor), ptr(Tensor),  # q, k, v
        ptr(Documents), ptr(Options),  # docs, options
        ptr(Tensor), ctypes.c_void_p,  # o, lse (float*)
        ctypes.c_void_p, ctypes.c_size_t,  # saved_codes, saved_codes_bytes
        ctypes.c_void_p, ctypes.c_size_t,  # workspace, workspace_bytes
        ctypes.c_void_p,  # stream (cudaStream_t)
        ptr(Error),
    ]
    lib.flamia_forward_train.restype = _c_enum
    lib.flamia_backward_saved.argtypes = [
        ptr(Tensor), ptr(Tensor), ptr(Tensor),  # q, k, v (shapes only)
        ptr(Tensor), ctypes.c_void_p, ptr(Tensor),  # o, lse (const float*), dout
        ptr(Documents), ptr(Options),  # docs, options
        ctypes.c_void_p, ctypes.c_size_t,  # saved_codes, saved_codes_bytes
        ptr(Tensor), ptr(Tensor), ptr(Tensor),  # dq, dk, dv
        ctypes.c_void_p, ctypes.c_size_t,  # workspace, workspace_bytes
        ctypes.c_void_p,  # stream (cudaStream_t)
        ptr(Error),
    ]
    lib.flamia_backward_saved.restype = _c_enum
    lib.flamia_offsets_status_message.argtypes = [ptr(OffsetsStatus), ptr(Error)]
    lib.flamia_offsets_status_message.restype = _c_enum
    lib.flamia_validate_cu_seqlens.argtypes = [
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_int32,  # cu_seqlens_host, num_docs, T, max_seqlen
        ptr(OffsetsStatus), ptr(Error),
    ]
    lib.flamia_validate_cu_seqlens.restype = _c_enum
    lib.flamia_check_offsets_status.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ptr(Error)]
    lib.flamia_check_offsets_status.restype = _c_enum
    return lib


def library():
    """The loaded library (ctypes.CDLL), loading it on first use."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not path.is_file():
                where = path if os.environ.get(ENV_LIBRARY) else ", ".join(map(str, _candidates()))
                raise FileNotFoundError(
                    f"flamia: the C API library {LIBRARY_NAME} was not found (looked at {where}); install "
                    f"the package on a CUDA machine (python3 -m pip install .; README) or set {ENV_LIBRARY} to a "
                    f"built {LIBRARY_NAME} (cmake target flamia_capi)")
            lib = ctypes.CDLL(str(path))
            _check_abi(lib, path)
            _lib = _declare(lib)
    return _lib


def library_version():
    """The loaded library's version string (flamia_version)."""
    return library().flamia_version().decode()


def check(status, error):
    """Raise FlamiaError(status, message) unless status is FLAMIA_SUCCESS."""
    status = int(status)
    if status != SUCCESS:
        message = error.message.decode("utf-8", errors="replace") if error is not None else ""
        raise FlamiaError(status, message or "(no message)")


def status_name(status):
    return library().flamia_status_name(int(status)).decode()


def default_options():
    options = Options()
    library().flamia_default_options(ctypes.byref(options))
    return options


def explicit_softmax_scale(value):
    """An explicit softmax scale as the float the C API receives. The C API reads +0 as "the
    default, 1/sqrt(D)", so an explicit value must be a finite number > 0 that stays finite and
    > 0 in float32 (1e-50 rounds to 0 there): ValueError otherwise (TypeError for a non-number).
    Python callers ask for the default with None, never with 0."""
    if isinstance(value, bool):
        raise TypeError("flamia: softmax_scale must be a number or None (the default 1/sqrt(D)), got bool")
    if not isinstance(value, (int, float)):
        try:
            value = value.__float__()  # numpy scalars, 0-d tensors
        except (AttributeError, TypeError, ValueError, RuntimeError):
            raise TypeError(f"flamia: softmax_scale must be a number or None (the default 1/sqrt(D)), "
                            f"got {type(value).__name__}") from None
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"flamia: softmax_scale must be a finite number > 0 (None for the default 1/sqrt(D)), "
                         f"got {value!r}")
    as_float32 = ctypes.c_float(value).value
    if not (as_float32 > 0 and math.isfinite(as_float32)):
        raise ValueError(f"flamia: softmax_scale {value!r} is {as_float32!r} in float32, the C API's type; "
                         f"pass a value in [{FLOAT32_MIN_SUBNORMAL!r}, {FLOAT32_MAX!r}] (None for the default)")
    return as_float32


FLOAT32_MIN_SUBNORMAL = ctypes.c_float(1.401298464324817e-45).value
FLOAT32_MAX = ctypes.c_float(3.4028234663852886e38).value


def tensor(data_ptr, tokens, heads, dim, stride_token, stride_head, dtype=DTYPE_BF16):
    """A flamia_tensor from a raw device address and extents/strides in elements."""
    return Tensor(ctypes.c_void_p(int(data_ptr)), int(dtype), int(tokens), int(heads), int(dim),
                  int(stride_token), int(stride_head))


def _workspace_size(query, q, k, v, docs, options=None):
    """A size query: every one takes (q, k, v, docs, options, &bytes, &error); options None are the
    defaults."""
    if options is None:
        options = default_options()
    nbytes = ctypes.c_size_t(0)
    error = Error()
    status = query(ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(docs), ctypes.byref(options),
                   ctypes.byref(nbytes), ctypes.byref(error))
    check(status, error)
    return int(nbytes.value)


def forward_workspace_size(q, k, v, docs, options=None):
    """Bytes of workspace flamia_forward needs for these shapes (flamia_tensor descriptors) and
    docs.num_docs (a Documents; nothing else of it is read) under options (an Options; None: the
    defaults)."""
    return _workspace_size(library().flamia_forward_workspace_size, q, k, v, docs, options)


def forward(q, k, v, docs, options, o, lse_ptr, workspace_ptr, workspace_bytes, stream):
    """flamia_forward on raw descriptors and addresses; raises FlamiaError on failure."""
    error = Error()
    status = library().flamia_forward(
        ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(docs), ctypes.byref(options),
        ctypes.byref(o), ctypes.c_void_p(int(lse_ptr)), ctypes.c_void_p(int(workspace_ptr)),
        ctypes.c_size_t(int(workspace_bytes)), ctypes.c_void_p(int(stream)), ctypes.byref(error))
    check(status, error)


def backward_workspace_size(q, k, v, docs, options=None):
    """Bytes of workspace flamia_backward needs for these shapes (flamia_tensor descriptors) and
    docs.num_docs (a Documents; nothing else of it is read) under options (an Options; None: the
    defaults)."""
    return _workspace_size(library().flamia_backward_workspace_size, q, k, v, docs, options)


def backward(q, k, v, o, lse_ptr, dout, docs, options, dq, dk, dv, workspace_ptr, workspace_bytes, stream):
    """flamia_backward on raw descriptors and addresses; raises FlamiaError on failure."""
    error = Error()
    status = library().flamia_backward(
        ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(o), ctypes.c_void_p(int(lse_ptr)),
        ctypes.byref(dout), ctypes.byref(docs), ctypes.byref(options), ctypes.byref(dq), ctypes.byref(dk),
        ctypes.byref(dv), ctypes.c_void_p(int(workspace_ptr)), ctypes.c_size_t(int(workspace_bytes)),
        ctypes.c_void_p(int(stream)), ctypes.byref(error))
    check(status, error)


def saved_codes_size(q, k, v, docs, options=None):
    """Bytes of the saved codes buffer of flamia_forward_train / flamia_backward_saved."""
    return _workspace_size(library().flamia_saved_codes_size, q, k, v, docs, options)


def forward_train_workspace_size(q, k, v, docs, options=None):
    """Bytes of workspace flamia_forward_train needs besides the saved codes."""
    return _workspace_size(library().flamia_forward_train_workspace_size, q, k, v, docs, options)


def backward_saved_workspace_size(q, k, v, docs, options=None):
    """Bytes of workspace flamia_backward_saved needs."""
    return _workspace_size(library().flamia_backward_saved_workspace_size, q, k, v, docs, options)


def forward_train(q, k, v, docs, options, o, lse_ptr, saved_ptr, saved_bytes, workspace_ptr, workspace_bytes, stream):
    """flamia_forward_train on raw descriptors and addresses; raises FlamiaError on failure."""
    error = Error()
    status = library().flamia_forward_train(
        ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(docs), ctypes.byref(options),
        ctypes.byref(o), ctypes.c_void_p(int(lse_ptr)), ctypes.c_void_p(int(saved_ptr)),
        ctypes.c_size_t(int(saved_bytes)), ctypes.c_void_p(int(workspace_ptr)), ctypes.c_size_t(int(workspace_bytes)),
        ctypes.c_void_p(int(stream)), ctypes.byref(error))
    check(status, error)


def backward_saved(q, k, v, o, lse_ptr, dout, docs, options, saved_ptr, saved_bytes, dq, dk, dv, workspace_ptr,
                   workspace_bytes, stream):
    """flamia_backward_saved on raw descriptors and addresses (q, k, v: shapes only); raises
    FlamiaError on failure."""
    error = Error()
    status = library().flamia_backward_saved(
        ctypes.byref(q), ctypes.byref(k), ctypes.byref(v), ctypes.byref(o), ctypes.c_void_p(int(lse_ptr)),
        ctypes.byref(dout), ctypes.byref(docs), ctypes.byref(options), ctypes.c_void_p(int(saved_ptr)),
        ctypes.c_size_t(int(saved_bytes)), ctypes.byref(dq), ctypes.byref(dk), ctypes.byref(dv),
        ctypes.c_void_p(int(workspace_ptr)), ctypes.c_size_t(int(workspace_bytes)), ctypes.c_void_p(int(stream)),
        ctypes.byref(error))
    check(status, error)


def offsets_status_message(record):
    """What a status word's record (an OffsetsStatus) says: None when it holds no record, else the
    message naming the first bad entry of cu_seqlens and its values (the host check's message for
    the same offsets). No CUDA call."""
    error = Error()
    status = library().flamia_offsets_status_message(ctypes.byref(record), ctypes.byref(error))
    if status == SUCCESS:
        return None
    return error.message.decode("utf-8", errors="replace")


def validate_cu_seqlens(cu_seqlens_host, total_tokens, max_seqlen=0):
    """The host check of cu_seqlens (a sequence of ints, num_docs + 1 of them) for total_tokens packed
    tokens, with the device check's rule, and (max_seqlen > 0) max_seqlen >= the longest document.
    Returns the record the device would write (an OffsetsStatus, zeros when valid); raises
    FlamiaError (ERROR_INVALID_ARGUMENT) naming the first bad entry and its values, with that record
    in ``error.offsets`` (zeros for a max_seqlen below the longest document). No CUDA call."""
    values = [int(x) for x in cu_seqlens_host]
    if len(values) < 2:
        raise FlamiaError(ERROR_INVALID_ARGUMENT,
                          f"cu_seqlens must hold at least 2 entries (one document), got {len(values)}")
    for i, x in enumerate(values):
        if not INT32_MIN <= x <= INT32_MAX:
            raise FlamiaError(ERROR_INVALID_ARGUMENT, f"cu_seqlens[{i}] = {x} does not fit int32")
    array = (ctypes.c_int32 * len(values))(*values)
    record, error = OffsetsStatus(), Error()
    status = library().flamia_validate_cu_seqlens(
        ctypes.cast(array, ctypes.c_void_p), _int32(len(values) - 1, "num_docs"), ctypes.c_int64(int(total_tokens)),
        _int32(max_seqlen, "max_seqlen"), ctypes.byref(record), ctypes.byref(error))
    try:
        check(status, error)
    except FlamiaError as e:
        e.offsets = record.as_tuple()
        raise
    return record


def check_offsets_status(status_ptr, clear=False, stream=0):
    """flamia_check_offsets_status: reads the status word at status_ptr (device memory or mapped
    pinned host memory) after the work queued on stream, waiting for it (a synchronization), and
    raises FlamiaError with the record's message when it holds one (clearing it when clear)."""
    error = Error()
    status = library().flamia_check_offsets_status(ctypes.c_void_p(int(status_ptr) if status_ptr else None),
                                                   1 if clear else 0, ctypes.c_void_p(int(stream)),
                                                   ctypes.byref(error))
    check(status, error)
