"""bench/compare_libraries.py's arguments (its training calls need torch and a GPU: run on the GPU
machine, as docs/RESULTS.md's steps tables say)."""
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
