"""bench/compare_libraries.py's arguments (its training calls need torch and a GPU, so they run on a
GPU machine, not here)."""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import compare_libraries  # noqa: E402


def test_defaults_cover_both_isolations_on_four_workloads():
    args = compare_libraries.parse_args(["save", "ref.pt"])
    assert args.modes == ("document", "prefix")
    assert args.names == ["tiny-unaligned", "16x4096", "4x16384-gqa16/4", "1x65536"]


def test_one_isolation_and_chosen_workloads():
    args = compare_libraries.parse_args(["compare", "ref.pt", "--isolation", "prefix", "--workloads", "longtail"])
    assert (args.mode, args.modes, args.names) == ("compare", ("prefix",), ["longtail"])


def test_an_unknown_workload_is_refused_with_its_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare_libraries.parse_args(["save", "ref.pt", "--workloads", "16x4096,32x2048"])
    assert exit_info.value.code == 2
    assert "32x2048" in capsys.readouterr().err


def test_a_difference_is_reported_as_its_cosine_and_largest_gap():
    np = pytest.importorskip("numpy")
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert compare_libraries.difference(a, a.copy()) == "cosine 1.0000000, max |diff| 0"
    b = a.copy()
    b[1, 1] = 5.0
    assert compare_libraries.difference(a, b) == "cosine 0.9939991, max |diff| 1"  # 34 / sqrt(30 * 39)


def test_non_finite_elements_are_counted_where_they_disagree():
    np = pytest.importorskip("numpy")
    a = np.array([1.0, np.nan, np.inf, 2.0])
    b = np.array([1.0, np.nan, 3.0, np.nan])
    assert compare_libraries.difference(a, b) == "cosine 1.0000000, max |diff| 0, 2 non-finite mismatches"
    assert compare_libraries.difference(a, a[:2]) == "shapes (4,) and (2,)"


def test_fp16_partials_comparison_is_opt_in_with_a_cosine_bar():
    assert not compare_libraries.parse_args(["save", "ref.pt"]).fp16_partials
    args = compare_libraries.parse_args(["compare", "ref.pt", "--fp16-partials", "--dq-cosine", "0.9999"])
    assert args.fp16_partials and args.dq_cosine == 0.9999
