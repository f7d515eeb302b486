"""The options record (python/flamia/_options.py) without torch or a GPU: its defaults, its checks,
the custom ops' flat arguments, and its conversion to struct flamia_options (against
flamia_default_options of the built libflamia_capi.so where CTest sets FLAMIA_CAPI_LIB)."""

import ast
import ctypes
import dataclasses
import math
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from capi_library import needs_library  # noqa: E402
from flamia import _capi  # noqa: E402
from flamia._options import AttentionOptions, P_BOOST_LOG2_DEFAULT  # noqa: E402



def test_defaults_are_flamia_attention_defaults():
    options = AttentionOptions()
    assert options == AttentionOptions(causal=True, softmax_scale=None, isolation="document",
                                       scale_geometry="block32", scale_rule="ceil", deterministic=False,
                                       p_boost_log2=8)
    assert P_BOOST_LOG2_DEFAULT == 8


def test_public_attention_keeps_its_signature_defaults():
    # flamia.attention's keyword defaults are the record's (parsed from ops.py: no torch needed).
    tree = ast.parse((REPO / "python" / "flamia" / "ops.py").read_text())
    attention = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attention")
    args = attention.args
    defaults = dict(zip([a.arg for a in args.args][-len(args.defaults):], (ast.literal_eval(d) for d in args.defaults)))
    record = AttentionOptions()
    for name in ("causal", "softmax_scale", "isolation", "scale_geometry", "scale_rule"):
        assert defaults[name] == getattr(record, name), name
    assert defaults["deterministic"] is None  # follows torch.are_deterministic_algorithms_enabled()


def test_record_is_immutable_and_hashable():
    options = AttentionOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.causal = False
    assert hash(options) == hash(AttentionOptions())  # a key of the size queries' cache
    assert options.replace(isolation="prefix").isolation == "prefix" and options.isolation == "document"


def test_flags_are_stored_as_bools_and_the_scale_as_its_float32_value():
    options = AttentionOptions(causal=0, deterministic=1, softmax_scale=0.1)
    assert options.causal is False and options.deterministic is True
    assert options.softmax_scale == ctypes.c_float(0.1).value
    assert AttentionOptions(softmax_scale=2).softmax_scale == 2.0


@pytest.mark.parametrize("field, value", [("isolation", "strict"), ("scale_geometry", "block16"),
                                          ("scale_rule", "nearest"), ("isolation", None), ("scale_rule", 0)])
def test_bad_choices_name_the_field_and_the_value(field, value):
    with pytest.raises(ValueError, match=rf"flamia.attention: {field} must be one of \[.*\], got {value!r}"):
        AttentionOptions(**{field: value})


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, 1e-50])
def test_bad_softmax_scales_are_refused(value):
    with pytest.raises(ValueError, match="softmax_scale"):
        AttentionOptions(softmax_scale=value)
    with pytest.raises(TypeError, match="softmax_scale must be a number or None"):
        AttentionOptions(softmax_scale="0.1")


@pytest.mark.parametrize("value, error", [(-1, ValueError), (9, ValueError), (2**32 + 8, ValueError),
                                          (8.0, TypeError), (True, TypeError)])
def test_bad_p_boost_log2_is_refused(value, error):
    with pytest.raises(error, match="p_boost_log2"):
        AttentionOptions(p_boost_log2=value)


def test_resolved_makes_the_default_scale_explicit():
    assert AttentionOptions().resolved(64).softmax_scale == 0.125
    assert AttentionOptions().resolved(128).softmax_scale == 1 / math.sqrt(128)  # to_c() rounds it to float32
    explicit = AttentionOptions(softmax_scale=0.5)
    assert explicit.resolved(128) is explicit


def test_op_arguments_round_trip():
    options = AttentionOptions(causal=False, softmax_scale=0.25, isolation="prefix", scale_geometry="token",
                               scale_rule="floor", deterministic=True)
    flat = options.op_arguments()
    assert flat == (False, 0.25, "prefix", "token", "floor")
    assert all(type(x) in (bool, float, str) for x in flat)  # what torch.library schemas take
    assert options.op_arguments(with_deterministic=True) == flat + (True,)
    assert AttentionOptions.from_op_arguments(*flat, True) == options
    assert AttentionOptions.from_op_arguments(*flat) == options.replace(deterministic=False)


def test_op_arguments_refuse_what_the_schemas_cannot_carry():
    with pytest.raises(ValueError, match="explicit softmax_scale"):
        AttentionOptions().op_arguments()
    with pytest.raises(ValueError, match="default p_boost_log2"):
        AttentionOptions(softmax_scale=0.125, p_boost_log2=4).op_arguments()


@needs_library
def test_record_defaults_match_flamia_default_options():
    c_default = _capi.default_options()
    converted = AttentionOptions().to_c()
    for name, _ in _capi.Options._fields_:
        assert getattr(converted, name) == getattr(c_default, name), name


@needs_library
def test_to_c_sets_every_field():
    options = AttentionOptions(causal=False, softmax_scale=0.1, isolation="prefix", scale_geometry="token",
                               scale_rule="floor", deterministic=True, p_boost_log2=3)
    c = options.to_c()
    assert isinstance(c, _capi.Options)
    assert c.causal == 0 and c.deterministic == 1 and c.p_boost_log2 == 3
    assert c.softmax_scale == ctypes.c_float(0.1).value
    assert (c.isolation, c.scale_geometry, c.scale_rule) == (_capi.ISOLATION["prefix"], _capi.SCALE_GEOMETRY["token"],
                                                             _capi.SCALE_RULE["floor"])
    assert AttentionOptions().resolved(64).to_c().softmax_scale == 0.125  # explicit, never the C default +0
    resolved = AttentionOptions().resolved(128).to_c().softmax_scale
    assert resolved == _capi.explicit_softmax_scale(1 / math.sqrt(128))  # what the custom ops' impls pass


@needs_library
@pytest.mark.parametrize("fields", [{}, {"isolation": "prefix"}, {"p_boost_log2": 0}, {"deterministic": True}])
def test_the_c_api_accepts_the_converted_options(fields):
    # A size query validates the options as every call does (no device needed).
    q = _capi.tensor(0, 256, 4, 128, 4 * 128, 128)
    kv = _capi.tensor(0, 256, 2, 128, 2 * 128, 128)
    docs = _capi.Documents(None, None, 1, 1)
    assert _capi.forward_workspace_size(q, kv, kv, docs, AttentionOptions(**fields).to_c()) > 0


@needs_library
def test_the_c_api_refuses_what_the_record_does_not_check():
    # Combinations are the C API's to judge (prefix isolation needs a causal mask).
    q = _capi.tensor(0, 256, 4, 128, 4 * 128, 128)
    kv = _capi.tensor(0, 256, 2, 128, 2 * 128, 128)
    docs = _capi.Documents(None, None, 1, 1)
    with pytest.raises(_capi.FlamiaError):
        _capi.forward_workspace_size(q, kv, kv, docs, AttentionOptions(causal=False, isolation="prefix").to_c())
