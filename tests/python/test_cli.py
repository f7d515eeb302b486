"""The `flamia` command line: JSON schemas, the probe's verdicts, and clear errors for bad input.

The binary comes from FLAMIA_CLI (set by CTest) or build/flamia relative to the repo root.
"""
import json
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def cli_path():
    path = os.environ.get("FLAMIA_CLI") or str(REPO / "build" / "flamia")
    if not os.path.exists(path):
        pytest.fail(f"flamia CLI not found at {path}; build it (cmake --build build) or set FLAMIA_CLI")
    return path


def run(*args):
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, timeout=300)


def test_probe_json_shows_the_leak_in_document_mode_and_none_in_prefix_mode():
    out = run("probe", "--json", "--dim", "64")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cases = {(c["mode"], c["control"], c["tensor"]): c for c in doc["cases"]}
    assert len(cases) == 12
    for mode in ("document", "prefix"):
        for tensor in ("o", "lse", "dq"):
            other = cases[(mode, "other_document", tensor)]
            assert other["bitwise_equal"] is True and other["max_abs_change"] == 0
            assert set(other) >= {"mode", "control", "tensor", "max_abs_change", "bitwise_equal"}
    for tensor in ("o", "lse", "dq"):
        assert cases[("prefix", "suffix", tensor)]["bitwise_equal"] is True
    for tensor in ("o", "dq"):
        leak = cases[("document", "suffix", tensor)]
        assert leak["bitwise_equal"] is False and leak["max_abs_change"] > 0
    assert doc["pass"] is True


def test_probe_with_token_geometry_reports_a_blind_probe():
    # Per-token scales have no straddling group, so the positive control cannot fire: exit 1.
    out = run("probe", "--geometry", "token", "--dim", "64", "--quiet")
    assert out.returncode == 1
    assert "blind" in out.stdout


def test_numerics_json_has_one_row_per_config_and_tensor():
    out = run("numerics", "--json", "--len", "160", "--docs", "2", "--heads", "2", "--dim", "64", "--quiet")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    keys = {"route", "isolation", "geometry", "rule", "backward", "tensor", "cosine", "rel_l2", "max_abs",
            "row_residual_max", "u_zero_fraction"}
    assert all(keys <= set(r) for r in rows)
    assert {r["tensor"] for r in rows} == {"o", "lse", "dq", "dk", "dv"}
    assert {(r["isolation"], r["geometry"], r["rule"]) for r in rows} >= {
        ("document", "block32", "ceil"), ("document", "token", "ceil"), ("document", "block32", "floor"),
        ("prefix", "block32", "ceil"), ("prefix", "token", "ceil")}
    # Causal document isolation with per-row U scales reports both dQ reductions; prefix isolation
    # and 32x32 U squares only the deterministic one.
    reductions = {}
    for r in rows:
        reductions.setdefault((r["isolation"], r["geometry"], r["rule"], r["u_scale"]), set()).add(r["backward"])
    for (isolation, _, _, u_scale), seen in reductions.items():
        both = isolation == "document" and u_scale == "rowcol"
        assert seen == ({"deterministic", "fp16_partials"} if both else {"deterministic"}), (isolation, u_scale, seen)


def test_numerics_non_causal_reports_only_the_deterministic_backward():
    out = run("numerics", "--json", "--non-causal", "--default-only", "--len", "96", "--docs", "2", "--heads", "2",
              "--dim", "64", "--quiet")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert len(rows) == 5 and {r["backward"] for r in rows} == {"deterministic"}
    for r in rows:
        assert 0.99 < r["cosine"] <= 1.0, r


@pytest.mark.parametrize("args, message", [
    (["numerics", "--dim", "abc"], "expects an integer"),
    (["numerics", "--bogus"], "unknown option --bogus"),
    (["numerics", "--heads", "3", "--kv-heads", "2"], "multiple of --kv-heads"),
    (["probe", "--position", "419"], "--position"),
    (["probe", "--lengths", "5,6"], "three documents"),
    (["probe", "--geometry", "tile"], "--geometry"),
    (["frobnicate"], "unknown command"),
])
def test_bad_arguments_fail_with_a_message_naming_the_problem(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr


def test_help_lists_the_options():
    out = run("probe", "--help")
    assert out.returncode == 0 and "--position" in out.stdout and "--json" in out.stdout
    out = run("--help")
    assert out.returncode == 0 and "numerics" in out.stdout


def test_numerics_default_only_reports_just_the_default_route():
    out = run("numerics", "--json", "--default-only", "--len", "96", "--docs", "2", "--heads", "2", "--dim", "64",
              "--quiet")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert len(rows) == 10  # o, lse, dq, dk, dv for each dQ reduction
    assert {(r["isolation"], r["geometry"], r["rule"], r["u_scale"]) for r in rows} == {
        ("document", "block32", "ceil", "rowcol")}
    assert [r["backward"] for r in rows] == ["deterministic"] * 5 + ["fp16_partials"] * 5
    by = {(r["backward"], r["tensor"]): r for r in rows}
    for tensor in ("o", "lse", "dk", "dv"):  # one forward; the reductions differ in dQ alone
        assert by[("deterministic", tensor)]["cosine"] == by[("fp16_partials", tensor)]["cosine"]
    assert by[("deterministic", "dq")]["cosine"] != by[("fp16_partials", "dq")]["cosine"]


def test_version_names_the_release_and_the_c_abi():
    out = run("--version")
    package = (REPO / "python" / "flamia" / "__init__.py").read_text()
    version = package.split('__version__ = "', 1)[1].split('"')[0]  # CMake reads the version there
    assert out.returncode == 0 and out.stdout.strip() == f"flamia {version} (C API ABI 1)"
