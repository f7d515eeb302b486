"""bench/backward_ratio.py: the backward (training call minus forward) against FA3's from two
bench_attention --json runs, per library; no GPU needed."""
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import backward_ratio  # noqa: E402

from bench_rows import META, ok  # noqa: E402


def write_run(path, run_pass, rows):
    path.write_text(json.dumps({"meta": {**META, "pass": run_pass},
                                "results": [{"workload": w, "docs": 4, "impls": impls} for w, impls in rows]}))
    return str(path)


def test_backward_is_train_minus_forward_and_fa3_over_flamia(tmp_path, capsys):
    train = write_run(tmp_path / "t.json", "train", [("4x16384", {"flamia": ok(22.0, 1), "jax-fa3": ok(25.0, 1)})])
    forward = write_run(tmp_path / "f.json", "forward", [("4x16384", {"flamia": ok(6.0, 1), "jax-fa3": ok(7.0, 1)})])
    assert backward_ratio.main(["--library", "main", train, forward, "--markdown", str(tmp_path / "out.md")]) == 0
    out = capsys.readouterr().out
    assert "| main | 4x16384 | 22.000 / 6.000 | 25.000 / 7.000 | 16.000 | 18.000 | 1.12 |" in out
    assert out.endswith("backward / FA3 at 4x16384: 1.12\n")  # 18 / 16 = 1.125, as RESULTS quotes it
    assert (tmp_path / "out.md").read_text() == out


def test_the_headline_is_the_first_library_and_every_library_gets_rows(tmp_path, capsys):
    rows = [("4x16384", {"flamia": ok(20.0, 1), "jax-fa3": ok(26.0, 1)})]
    base_t, base_f = write_run(tmp_path / "bt.json", "train", rows), write_run(tmp_path / "bf.json", "forward", [
        ("4x16384", {"flamia": ok(5.0, 1), "jax-fa3": ok(6.0, 1)})])
    var_t = write_run(tmp_path / "vt.json", "train", [("4x16384", {"flamia": ok(17.0, 1), "jax-fa3": ok(26.0, 1)})])
    assert backward_ratio.main(["--library", "variant", var_t, base_f, "--library", "main", base_t, base_f]) == 0
    out = capsys.readouterr().out
    assert "| variant | 4x16384 |" in out and "| main | 4x16384 |" in out
    assert out.endswith("backward / FA3 at 4x16384: 1.67\n")  # (26 - 6) / (17 - 5), the first library's


def test_no_ratio_from_a_baseline_that_failed_its_check(tmp_path, capsys):
    train = write_run(tmp_path / "t.json", "train", [
        ("4x16384", {"flamia": ok(22.0, 1), "jax-fa3": {"status": "wrong outputs (cos 0.31)"}})])
    forward = write_run(tmp_path / "f.json", "forward", [("4x16384", {"flamia": ok(6.0, 1), "jax-fa3": ok(7.0, 1)})])
    assert backward_ratio.main(["--library", "main", train, forward]) == 0
    out = capsys.readouterr().out
    assert "n/a (jax-fa3 train: wrong outputs (cos 0.31))" in out
    assert "backward / FA3 at" not in out


def test_refuses_swapped_passes_and_runs_without_common_workloads(tmp_path, capsys):
    train = write_run(tmp_path / "t.json", "train", [("4x16384", {"flamia": ok(22.0, 1)})])
    forward = write_run(tmp_path / "f.json", "forward", [("16x4096", {"flamia": ok(6.0, 1)})])
    assert backward_ratio.main(["--library", "main", forward, train]) == 2
    assert "a --pass forward run where --pass train was expected" in capsys.readouterr().err
    assert backward_ratio.main(["--library", "main", train, forward]) == 2
    assert "no workload was timed in both passes" in capsys.readouterr().err
