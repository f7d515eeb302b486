"""Python-side argument checks that need neither torch nor a GPU: the explicit softmax scale (the C
API reads +0 as "default", so Python never passes 0 for an explicit value), num_docs and
max_seqlen fitting the C int32 fields, and the backward ops' device checks (the helper on fake
tensors, and its calls in ops.py)."""

import ast
import ctypes
import math
import pathlib
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from flamia import _capi  # noqa: E402
from flamia._checks import check_devices  # noqa: E402


@pytest.mark.parametrize("value", [0, 0.0, -0.0, -1.0, -1e-50, math.nan, math.inf, -math.inf])
def test_explicit_softmax_scale_refuses_non_positive_and_non_finite_values(value):
    with pytest.raises(ValueError, match="softmax_scale must be a finite number > 0"):
        _capi.explicit_softmax_scale(value)


@pytest.mark.parametrize("value, shown", [(1e-50, "0.0"), (1e-46, "0.0"), (1e39, "inf")])
def test_explicit_softmax_scale_refuses_values_that_float32_rounds_to_zero_or_infinity(value, shown):
    assert ctypes.c_float(value).value in (0.0, math.inf)  # what the C field would have received
    with pytest.raises(ValueError, match=f"is {shown} in float32"):
        _capi.explicit_softmax_scale(value)


@pytest.mark.parametrize("value", [True, "0.1", None, [0.1]])
def test_explicit_softmax_scale_refuses_non_numbers(value):
    with pytest.raises(TypeError, match="softmax_scale must be a number or None"):
        _capi.explicit_softmax_scale(value)


def test_explicit_softmax_scale_returns_the_float32_value():
    assert _capi.explicit_softmax_scale(0.125) == 0.125
    assert _capi.explicit_softmax_scale(2) == 2.0
    assert _capi.explicit_softmax_scale(0.1) == ctypes.c_float(0.1).value
    tiny = _capi.explicit_softmax_scale(1e-45)  # the smallest float32 subnormal: positive, kept
    assert tiny > 0


@pytest.mark.parametrize("field", ["num_docs", "max_seqlen"])
@pytest.mark.parametrize("value", [2**31, 2**32 + 1, -(2**31) - 1])
def test_documents_refuse_counts_that_do_not_fit_int32(field, value):
    assert ctypes.c_int32(value).value != value  # ctypes alone would wrap it silently
    kwargs = {"num_docs": 1, "max_seqlen": 1, field: value}
    with pytest.raises(ValueError, match=f"{field} \\({value}\\) does not fit the C API's int32"):
        _capi.Documents(None, None, kwargs["num_docs"], kwargs["max_seqlen"])


def test_documents_keep_int32_counts_and_refuse_non_integers():
    docs = _capi.Documents(None, None, 2**31 - 1, 7)
    assert docs.num_docs == 2**31 - 1 and docs.max_seqlen == 7
    with pytest.raises(TypeError, match="num_docs must be an int"):
        _capi.Documents(None, None, 1.5, 1)


def fake(device):
    return types.SimpleNamespace(device=device)


def test_check_devices_names_the_tensor_on_another_device():
    dout = fake("cuda:0")
    check_devices("attention_backward", "dout", dout, o=fake("cuda:0"), lse=fake("cuda:0"))
    with pytest.raises(ValueError, match=r"attention_backward: lse is on cuda:1 but dout is on cuda:0"):
        check_devices("attention_backward", "dout", dout, o=fake("cuda:0"), lse=fake("cuda:1"))
    with pytest.raises(ValueError, match=r"attention_backward_saved: saved_codes is on cpu but dout is on cuda:0"):
        check_devices("attention_backward_saved", "dout", dout, saved_codes=fake("cpu"))


def test_check_devices_on_torch_devices():
    torch = pytest.importorskip("torch")
    q = torch.empty(1, device="meta")
    check_devices("attention_backward", "q", q, dout=torch.empty(2, device="meta"))
    with pytest.raises(ValueError, match="dout is on cpu but q is on meta"):
        check_devices("attention_backward", "q", q, dout=torch.empty(1))


def checked_names(function_name):
    """The tensors each check_devices call in ops.py's function_name compares, with its reference."""
    tree = ast.parse((REPO / "python" / "flamia" / "ops.py").read_text())
    function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function_name)
    names = set()
    for call in ast.walk(function):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "check_devices":
            names.add(call.args[1].value)
            names.update(k.arg for k in call.keywords)
    return names


def test_backward_ops_check_every_tensor_against_q_or_dout():
    # _run_backward (both backward ops) checks o, lse and cu_seqlens against dout; the backward
    # checks dout against q; the backward from saved codes checks the codes against dout (in the
    # functions that the custom ops and the eager path both run).
    assert checked_names("_run_backward") >= {"dout", "o", "lse", "cu_seqlens"}
    assert checked_names("_backward") >= {"q", "dout"}
    assert checked_names("_backward_saved") >= {"dout", "saved_codes"}
