"""Cross-checks the C++ codecs (formats/minifloat.h, formats/scales.h) against ml_dtypes
(and FP16 rounding against numpy's float16, which converts float64 directly, in one rounding).

The C++ side is reached through the ctypes shim tests/python/codec_shim.cpp, found through
the FLAMIA_CODEC_SHIM environment variable (ctest sets it) or build/tests/ under the repo root.

Two ml_dtypes behaviours shape the inputs:
* ml_dtypes converts float64 to these types through float32, so a float64 input rounds
  twice (1.0625 + 2**-40 becomes the float32 tie 1.0625 and then 1.0, where a direct
  conversion gives 1.125). Every input here is therefore float32-representable; then the
  float32 step is exact and both sides see one rounding.
* ml_dtypes does not saturate: E4M3/E5M2 overflow becomes NaN/Inf, while our encoder
  saturates finite values to the largest finite code. Finite inputs are clamped to +-max
  before ml_dtypes sees them, which gives exactly the saturating result.
"""

import ctypes
import os
import pathlib

import ml_dtypes
import numpy as np
import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_SHIM = REPO_ROOT / "build" / "tests" / "libflamia_codec_shim.so"

# name: (shim format number, ml_dtypes type, largest finite value, bits per code)
FORMATS = {
    "e4m3": (0, ml_dtypes.float8_e4m3fn, 448.0, 8),
    "e5m2": (1, ml_dtypes.float8_e5m2, 57344.0, 8),
    "e2m1": (2, ml_dtypes.float4_e2m1fn, 6.0, 4),
}

_u8p = ctypes.POINTER(ctypes.c_uint8)
_f64p = ctypes.POINTER(ctypes.c_double)


def _shim_path():
    env = os.environ.get("FLAMIA_CODEC_SHIM")
    if env:
        if not pathlib.Path(env).is_file():
            pytest.fail(f"FLAMIA_CODEC_SHIM={env} does not exist; build the flamia_codec_shim target")
        return env
    if DEFAULT_SHIM.is_file():
        return str(DEFAULT_SHIM)
    pytest.fail(
        f"codec shim not found: FLAMIA_CODEC_SHIM is unset and {DEFAULT_SHIM} does not exist; "
        "build it with `cmake --build build --target flamia_codec_shim` or set FLAMIA_CODEC_SHIM"
    )


@pytest.fixture(scope="module")
def shim():
    lib = ctypes.CDLL(_shim_path())
    lib.flamia_shim_encode.argtypes = [ctypes.c_int, _f64p, _u8p, ctypes.c_int64]
    lib.flamia_shim_decode.argtypes = [ctypes.c_int, _u8p, _f64p, ctypes.c_int64]
    lib.flamia_shim_round_bf16.argtypes = [_f64p, _f64p, ctypes.c_int64]
    lib.flamia_shim_round_fp16.argtypes = [_f64p, _f64p, ctypes.c_int64]
    lib.flamia_shim_scale_for_amax.argtypes = [_f64p, ctypes.c_int, _u8p, ctypes.c_int64]
    lib.flamia_shim_decode_ue8m0.argtypes = [_u8p, _f64p, ctypes.c_int64]
    return lib


def _f64(a):
    return np.ascontiguousarray(a, dtype=np.float64)


def encode(shim, fmt, x):
    x = _f64(x)
    out = np.empty(x.shape, dtype=np.uint8)
    assert shim.flamia_shim_encode(FORMATS[fmt][0], x.ctypes.data_as(_f64p), out.ctypes.data_as(_u8p), x.size) == 0
    return out


def decode(shim, fmt, codes):
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    out = np.empty(codes.shape, dtype=np.float64)
    assert shim.flamia_shim_decode(FORMATS[fmt][0], codes.ctypes.data_as(_u8p), out.ctypes.data_as(_f64p), codes.size) == 0
    return out


def round_bf16(shim, x):
    x = _f64(x)
    out = np.empty_like(x)
    shim.flamia_shim_round_bf16(x.ctypes.data_as(_f64p), out.ctypes.data_as(_f64p), x.size)
    return out


def round_fp16(shim, x):
    x = _f64(x)
    out = np.empty_like(x)
    shim.flamia_shim_round_fp16(x.ctypes.data_as(_f64p), out.ctypes.data_as(_f64p), x.size)
    return out


def scale_for_amax(shim, amax, rule):
    amax = _f64(amax)
    out = np.empty(amax.shape, dtype=np.uint8)
    assert shim.flamia_shim_scale_for_amax(amax.ctypes.data_as(_f64p), rule, out.ctypes.data_as(_u8p), amax.size) == 0
    return out


def decode_ue8m0(shim, codes):
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    out = np.empty(codes.shape, dtype=np.float64)
    shim.flamia_shim_decode_ue8m0(codes.ctypes.data_as(_u8p), out.ctypes.data_as(_f64p), codes.size)
    return out


def same_bits(a, b):
    """Equal as doubles including the sign of zero, with every NaN equal to every NaN."""
    a, b = _f64(a), _f64(b)
    nan = np.isnan(a) & np.isnan(b)
    return nan | (a.view(np.uint64) == b.view(np.uint64))


def all_codes(fmt):
    return np.arange(1 << FORMATS[fmt][3], dtype=np.uint8)


def ml_decode(fmt, codes):
    return codes.view(FORMATS[fmt][1]).astype(np.float64)


def random_float32(rng, n):
    """Random float32 bit patterns: every exponent, subnormals, Inf and (quiet) NaN."""
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    nan = (bits & 0x7F800000 == 0x7F800000) & (bits & 0x007FFFFF != 0)
    bits[nan] = 0x7FC00000  # signalling NaNs would warn when numpy widens them
    return bits.view(np.float32)


def encode_inputs(shim, fmt, seed=0):
    """Dense float32-representable inputs: codes, midpoints, their float32 neighbours, random."""
    _, _, fmax, _ = FORMATS[fmt]
    values = decode(shim, fmt, all_codes(fmt))
    mags = np.unique(values[np.isfinite(values) & (values >= 0)])  # sorted, +0 first
    # Midpoints of adjacent magnitudes, plus the one above max, where the next binade would start.
    above_max = fmax + (mags[-1] - mags[-2])
    mids = np.concatenate([(mags[:-1] + mags[1:]) / 2, [(fmax + above_max) / 2, above_max]])
    anchors = np.concatenate([mags, mids]).astype(np.float32)
    near = np.concatenate([np.nextafter(anchors, np.float32(np.inf)), np.nextafter(anchors, np.float32(0))])
    rng = np.random.default_rng(seed)
    lo, hi = np.log2(mags[1]) - 6, np.log2(fmax) + 6  # across and beyond the range
    log_uniform = np.exp2(rng.uniform(lo, hi, 4000)).astype(np.float32)
    raw = random_float32(rng, 2000)
    special = np.array([0.0, np.inf, np.nan, 1e30, np.finfo(np.float32).max, np.finfo(np.float32).smallest_subnormal],
                       dtype=np.float32)
    pos = np.concatenate([anchors, near, log_uniform, special])
    x = np.concatenate([pos, -pos, raw]).astype(np.float64)
    finite = np.isfinite(x)
    assert np.array_equal(x[finite].astype(np.float32).astype(np.float64), x[finite])
    return x


def ml_encode_saturating(fmt, x):
    _, dtype, fmax, _ = FORMATS[fmt]
    clamped = np.where(np.isfinite(x), np.clip(x, -fmax, fmax), x)
    return clamped.astype(np.float32).astype(dtype).view(np.uint8)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_decode_of_every_code_matches_ml_dtypes(shim, fmt):
    codes = all_codes(fmt)
    assert same_bits(decode(shim, fmt, codes), ml_decode(fmt, codes)).all()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_finite_code_value_encodes_back_to_its_code(shim, fmt):
    codes = all_codes(fmt)
    values = decode(shim, fmt, codes)
    finite = np.isfinite(values)
    assert np.array_equal(encode(shim, fmt, values[finite]), codes[finite])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_encode_matches_saturating_ml_dtypes_on_dense_inputs(shim, fmt):
    x = encode_inputs(shim, fmt)
    ours = encode(shim, fmt, x)
    ref = ml_encode_saturating(fmt, x)
    nan = np.isnan(x)
    bad = np.flatnonzero((ours != ref) & ~nan)
    assert bad.size == 0, f"first mismatches: x={x[bad[:5]]} ours={ours[bad[:5]]} ml_dtypes={ref[bad[:5]]}"
    # The NaN code's sign bit is not specified; both must decode as NaN.
    assert np.isnan(decode(shim, fmt, ours[nan])).all()
    assert np.isnan(ml_decode(fmt, ref[nan])).all()


def test_e2m1_encode_matches_ml_dtypes_on_dense_inputs(shim):
    x = encode_inputs(shim, "e2m1")
    x = x[~np.isnan(x)]  # E2M1 has no NaN; see the test below
    ours = encode(shim, "e2m1", x)
    ref = ml_encode_saturating("e2m1", x)
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, f"first mismatches: x={x[bad[:5]]} ours={ours[bad[:5]]} ml_dtypes={ref[bad[:5]]}"


def test_e2m1_nan_saturates_to_signed_max_instead_of_ml_dtypes_negative_zero(shim):
    # ml_dtypes turns NaN into code 0x8 (-0); ours saturates and relies on the block scale's NaN.
    codes = encode(shim, "e2m1", [np.nan, -np.nan])
    assert codes.tolist() == [0x7, 0xF]


def test_bf16_rounding_matches_ml_dtypes(shim):
    bf16_bits = np.arange(1 << 16, dtype=np.uint32)
    not_nan = (bf16_bits & 0x7F80 != 0x7F80) | (bf16_bits & 0x7F == 0)  # NaNs come from random_float32
    values = (bf16_bits[not_nan] << 16).view(np.float32)  # every non-NaN bf16 value
    finite = np.unique(values[np.isfinite(values) & (values >= 0)].astype(np.float64))
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # 9 significant bits: float32-exact
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))])
    rng = np.random.default_rng(1)
    raw = random_float32(rng, 100_000)
    x = np.concatenate([values, mids, -mids, near, -near, raw]).astype(np.float64)
    ref = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    ours = round_bf16(shim, x)
    ok = same_bits(ours, ref)
    bad = np.flatnonzero(~ok)
    assert ok.all(), f"first mismatches: x={x[bad[:5]]} ours={ours[bad[:5]]} ml_dtypes={ref[bad[:5]]}"


def test_fp16_rounding_matches_numpy_float16(shim):
    # numpy converts float64 to float16 directly (round to nearest even, subnormals, overflow to
    # Inf), so float64 inputs that are not float32-exact test the one rounding too.
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)  # every fp16 value
    finite = np.unique(values[np.isfinite(values) & (values >= 0)])
    mids = (finite[:-1] + finite[1:]) / 2  # 12 significant bits: float64-exact
    near = np.concatenate([np.nextafter(mids, np.inf), np.nextafter(mids, 0)])
    past_max = np.array([65504.0, 65519.99, 65520.0, 65536.0, 1e300, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26])
    rng = np.random.default_rng(3)
    raw = random_float32(rng, 100_000).astype(np.float64)
    wide = rng.standard_normal(100_000) * np.exp2(rng.uniform(-30, 20, 100_000))  # float64, not float32-exact
    x = np.concatenate([values, mids, -mids, near, -near, past_max, -past_max, raw, wide])
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float64)
    ours = round_fp16(shim, x)
    ok = same_bits(ours, ref)
    bad = np.flatnonzero(~ok)
    assert ok.all(), f"first mismatches: x={x[bad[:5]]} ours={ours[bad[:5]]} numpy={ref[bad[:5]]}"


def test_ue8m0_decode_of_all_256_codes_matches_ml_dtypes_e8m0(shim):
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    assert same_bits(decode_ue8m0(shim, codes), ref).all()


def test_scale_rules_give_powers_of_two_that_ml_dtypes_e8m0_encodes_to_the_same_code(shim):
    rng = np.random.default_rng(2)
    amax = np.exp2(rng.uniform(-100, 100, 5000))
    amax = np.concatenate([amax, [448.0, 480.0, 0.875, 1.0]])
    for rule in (0, 1):
        codes = scale_for_amax(shim, amax, rule)
        scale = decode_ue8m0(shim, codes)
        # A power of two is exact in e8m0, so ml_dtypes must map it back to our code.
        assert np.array_equal(scale.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8), codes)
        scaled = amax / scale
        if rule == 0:  # ceil: no clip, and one exponent less would clip
            assert (scaled <= 448).all() and (scaled * 2 > 448).all()
        else:  # floor: e = floor(log2 amax) - 8, so amax / 2^e is in [256, 512)
            assert ((scaled >= 256) & (scaled < 512)).all()


def test_scale_for_zero_is_the_smallest_exponent_and_for_nan_or_inf_is_the_nan_code(shim):
    for rule in (0, 1):
        codes = scale_for_amax(shim, [0.0, np.nan, np.inf], rule)
        assert codes.tolist() == [0x00, 0xFF, 0xFF]
        assert np.isnan(codes[1:].view(ml_dtypes.float8_e8m0fnu).astype(np.float64)).all()
