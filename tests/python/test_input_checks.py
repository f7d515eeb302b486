"""Python-side argument checks that need neither torch nor a GPU: the explicit softmax scale (the C
API reads +0 as "default", so Python never passes 0 for an explicit value), num_docs and
max_seqlen fitting the C int32 fields, the backward ops' device checks (the helper on fake
tensors, and its calls in ops.py), the FP64 reference's document lengths (cu_seqlens passed in
their place are named), and the transformers options the kernels do not serve (refused, not dropped)."""

import ast
import ctypes
import math
import pathlib
import re
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from flamia import _capi  # noqa: E402
from flamia._checks import check_devices, check_document_lengths, check_hf_attention_kwargs  # noqa: E402


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


def test_document_lengths_that_fit_q_pass():
    check_document_lengths("reference.attention", [3, 0, 4], 7)
    check_document_lengths("reference.attention", [0, 7], 7)  # as lengths or as cu_seqlens: one document of 7


@pytest.mark.parametrize("offsets", [[0, 3, 7], [0, 0, 5, 5, 7], list(range(0, 41, 4))])
def test_cu_seqlens_passed_as_lengths_are_named(offsets):
    with pytest.raises(ValueError, match=r"reference.attention: lens = \[0, .*\] looks like cu_seqlens .* ends at "
                                         rf"the {offsets[-1]} tokens of q\); pass the document lengths instead"):
        check_document_lengths("reference.attention", offsets, offsets[-1])


def test_long_cu_seqlens_are_shown_shortened():
    offsets = list(range(0, 10001, 10))
    with pytest.raises(ValueError, match=r"lens = \[0, 10, 20, 30, 40, 50, 60, 70, \.\.\. \(993 more\)\] looks like"):
        check_document_lengths("reference.attention", offsets, 10000)


@pytest.mark.parametrize("lens, message", [
    ([3, 5], "document lengths sum to 8, but q holds 7 tokens"),
    ([0, 3, 5], "document lengths sum to 8, but q holds 7 tokens"),  # starts at 0 but ends past T: not offsets
    ([9, -2], r"document lengths must be >= 0, got lens\[1\] = -2"),
])
def test_lengths_that_do_not_fit_q_are_refused(lens, message):
    with pytest.raises(ValueError, match=message):
        check_document_lengths("reference.attention", lens, 7)


def test_the_reference_checks_its_lengths_before_reading_q():
    # reference.attention (and gradients through it) needs torch; without torch its first
    # statements are checked here: the lengths check runs before the loop over documents.
    tree = ast.parse((REPO / "python" / "flamia" / "reference.py").read_text())
    function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "attention")
    calls = [i for i, stmt in enumerate(function.body) for c in ast.walk(stmt)
             if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "check_document_lengths"]
    loop = next(i for i, stmt in enumerate(function.body) if isinstance(stmt, ast.For))
    assert calls and calls[0] < loop


def test_the_reference_names_cu_seqlens_passed_as_lengths():
    torch = pytest.importorskip("torch")
    from flamia import reference
    q = k = v = torch.randn(7, 2, 8)
    with pytest.raises(ValueError, match="looks like cu_seqlens"):
        reference.attention(q, k, v, torch.tensor([0, 3, 7], dtype=torch.int32))
    o, lse = reference.attention(q, k, v, reference.document_lengths(torch.tensor([0, 3, 7])))
    assert o.shape == (7, 2, 8) and lse.shape == (2, 7)
    with pytest.raises(TypeError):
        reference.attention(q, k, v, [3.5, 3.5])


@pytest.mark.parametrize("kwargs, message", [
    ({"sliding_window": 4096}, "sliding-window attention is not served (sliding_window=4096 on rows of 8192 tokens)"),
    ({"sliding_window": 0}, "sliding_window=0"),
    ({"softcap": 50.0}, "logit soft-capping is not served (softcap=50.0)"),
    ({"sliding_window": None, "softcap": 30}, "softcap=30"),
])
def test_hf_attention_refuses_windows_that_bind_and_softcap(kwargs, message):
    with pytest.raises(ValueError, match="^flamia: .*" + re.escape(message)):
        check_hf_attention_kwargs("flamia", 8192, kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"sliding_window": None, "softcap": None}, {"sliding_window": 8192},
                                    {"sliding_window": 10000, "softcap": 0.0}, {"position_ids": None}])
def test_hf_attention_accepts_windows_that_do_not_bind_and_no_softcap(kwargs):
    check_hf_attention_kwargs("flamia", 8192, kwargs)  # a window at least as long as the rows changes nothing


def test_hf_attention_checks_its_kwargs_before_packing():
    source = (REPO / "python" / "flamia" / "hf.py").read_text()
    body = source[source.index("def attention_forward"):source.index("cu, max_len = packed_boundaries")]
    assert "_checks.check_hf_attention_kwargs(name, key.shape[2], kwargs)" in body
