"""The `flamia` command line: JSON schemas, the probe's verdicts, and clear errors for bad input.

The binary comes from FLAMIA_CLI (set by CTest) or build/flamia relative to the repo root.
"""
import json
import os
import pathlib
import re
import resource
import subprocess
import time

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
    keys = {"route", "hadamard", "isolation", "geometry", "rule", "backward", "tensor", "cosine", "rel_l2", "max_abs",
            "row_residual_max", "u_zero_fraction"}
    assert all(keys <= set(r) for r in rows)
    assert {r["tensor"] for r in rows} == {"o", "lse", "dq", "dk", "dv"}
    assert {(r["isolation"], r["geometry"], r["rule"]) for r in rows} >= {
        ("document", "block32", "ceil"), ("document", "token", "ceil"), ("document", "block32", "floor"),
        ("prefix", "block32", "ceil"), ("prefix", "token", "ceil")}
    assert {(r["route"], r["hadamard"]) for r in rows} == {
        ("mxfp8", False), ("mxfp8", True), ("nvfp4_mixed", False), ("nvfp4_mixed", True)}
    # Causal document isolation with per-row U scales on the MXFP8 route reports both dQ reductions;
    # prefix isolation, 32x32 U squares and the mixed route only the deterministic one.
    reductions = {}
    for r in rows:
        key = (r["route"], r["hadamard"], r["isolation"], r["geometry"], r["rule"], r["u_scale"])
        reductions.setdefault(key, set()).add(r["backward"])
    for (route, _, isolation, _, _, u_scale), seen in reductions.items():
        both = route == "mxfp8" and isolation == "document" and u_scale == "rowcol"
        assert seen == ({"deterministic", "fp16_partials"} if both else {"deterministic"}), (route, isolation, seen)


def test_numerics_compare_routes_reports_both_routes_with_and_without_hadamard():
    out = run("numerics", "--json", "--compare-routes", "--len", "256", "--docs", "2", "--heads", "2", "--dim", "64",
              "--quiet")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["rows"]
    assert len(rows) == 30  # mxfp8 (two dQ reductions) and nvfp4_mixed, each without and with Hadamard
    assert {(r["isolation"], r["geometry"], r["rule"], r["u_scale"]) for r in rows} == {
        ("document", "block32", "ceil", "rowcol")}
    det = {(r["route"], r["hadamard"], r["tensor"]): r for r in rows if r["backward"] == "deterministic"}
    for hadamard in (False, True):
        for tensor in ("o", "dq", "dk", "dv"):
            m8, m4 = det[("mxfp8", hadamard, tensor)], det[("nvfp4_mixed", hadamard, tensor)]
            assert 0.98 < m4["cosine"] < m8["cosine"], (hadamard, tensor)
    assert doc["meets_bars"] is True  # judged on the default route alone


def test_probe_covers_the_mixed_route():
    out = run("probe", "--json", "--dim", "64", "--route", "nvfp4_mixed", "--quiet")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    cases = {(c["mode"], c["control"], c["tensor"]): c for c in doc["cases"]}
    assert doc["pass"] is True and len(cases) == 12
    assert cases[("document", "suffix", "o")]["bitwise_equal"] is False
    # The NVFP4 score operands are per token: the LSE (a function of S alone) never moves.
    assert all(cases[(mode, control, "lse")]["bitwise_equal"] for mode in ("document", "prefix")
               for control in ("suffix", "other_document"))


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
    (["probe", "--position", "2147483647"], "--position must lie in [0, len(B) - 2]"),
    (["numerics", "--lengths", "2147483647,1"], "too many tokens"),
    (["numerics", "--docs", "1000000", "--len", "1000000"], "too many tokens"),
    (["probe", "--lengths", "5,6"], "three documents"),
    (["probe", "--geometry", "tile"], "--geometry"),
    (["probe", "--route", "nvfp4"], "--route must be mxfp8 or nvfp4_mixed"),
    (["probe", "--route", "nvfp4_mixed", "--dim", "24"], "multiple of 16"),
    (["numerics", "--compare-routes", "--default-only"], "exclude each other"),
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
    header = (REPO / "include" / "flamia" / "flamia.h").read_text()
    abi = header.split("#define FLAMIA_ABI_VERSION ", 1)[1].split()[0]
    assert out.returncode == 0 and out.stdout.strip() == f"flamia {version} (C API ABI {abi})"


def run_quick(*args):
    """A run that must end (refused, or finished) within 5 s."""
    return subprocess.run([cli_path(), *args], capture_output=True, text=True, timeout=5)


@pytest.mark.parametrize("args", [
    ["numerics", "--dim", "102400"],  # a multiple of 128: every configuration's rules hold
    ["numerics", "--len", "100000"],
    ["numerics", "--docs", "1", "--len", "2000000000"],
    ["probe", "--dim", "100000"],
])
def test_runs_over_the_memory_or_time_limit_are_refused_before_allocating(args):
    out = run_quick(*args)
    assert out.returncode == 2, out.stderr
    assert "this run needs about" in out.stderr and "--force" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["numerics", "--lengths", "0,0", "--check"], "no tokens"),
    (["numerics", "--len", "2000000000"], "too many tokens: the 2 documents hold 4000000000 tokens, more than 2147483647"),
    (["numerics", "--seed", "-1"], "--seed expects an integer from 0 to 18446744073709551615, got '-1'"),
    (["numerics", "--len", "99999999999"], "--len expects an integer from 1 to 2147483647, got '99999999999'"),
    (["numerics", "--len", "0"], "--len expects an integer from 1 to 2147483647"),
])
def test_sizes_and_ranges_are_checked_first_and_named(args, message):
    out = run_quick(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "non-decreasing" not in out.stderr and "bars met" not in out.stdout


def test_help_shows_one_default_per_option_in_one_aligned_column():
    out = run("numerics", "--help")
    lines = [line for line in out.stdout.splitlines() if line.startswith("  -")]
    kv = next(line for line in lines if line.startswith("  --kv-heads"))
    assert kv.count("(default:") == 1 and kv.endswith("(default: --heads)")
    columns = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in lines}
    assert len(columns) == 1, lines  # every option's text starts in the same column, -h included


def test_numerics_table_rows_are_padded_and_progress_reports_percent_and_time_left():
    out = run("numerics", "--default-only", "--len", "64", "--docs", "2", "--heads", "1", "--dim", "64")
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if line.startswith("|")]
    # header, separator, 5 tensors for each dQ reduction (deterministic, fp16_partials)
    assert len(table) == 12 and len({len(line) for line in table}) == 1, table
    assert "estimated:" in out.stderr
    assert "% of the estimated work done, about" in out.stderr and "left" in out.stderr


def refused(*args):
    """A run that must be refused (exit 2) in under a second of wall time, before any allocation."""
    start = time.monotonic()
    out = subprocess.run([cli_path(), *args], capture_output=True, text=True, timeout=5)
    elapsed = time.monotonic() - start
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert elapsed < 1.0, f"refused after {elapsed:.2f} s"
    assert out.stdout == ""
    return out.stderr


@pytest.mark.parametrize("args, message", [
    # docs x len is refused from its 64-bit product, without listing a billion lengths first.
    (["numerics", "--docs", "1000000000"],
     "too many tokens: the 1000000000 documents hold 1024000000000 tokens, more than 2147483647"),
    (["numerics", "--docs", "2147483647", "--len", "2147483647"], "hold 4611686014132420609 tokens"),
    (["numerics", "--docs", "2147483647", "--len", "1"], "this run needs about"),
    (["numerics", "--docs", "1000000000", "--len", "1"], "this run needs about"),
    (["probe", "--lengths", "2147483647,1,1"], "too many tokens"),
])
def test_huge_document_counts_are_refused_from_the_arguments_alone(args, message):
    assert message in refused(*args)


def test_estimates_far_over_the_limits_print_in_units_a_reader_takes_in():
    message = refused("numerics", "--docs", "2147483647", "--len", "1")
    assert re.search(r"about \d+\.\d TB of memory", message), message
    assert re.search(r"about \d+ days on \d+ cores", message), message


@pytest.mark.parametrize("dim, left_out", [
    (96, ["mxfp8+hadamard", "nvfp4_mixed+hadamard"]),
    (100, ["mxfp8+hadamard", "nvfp4_mixed", "nvfp4_mixed+hadamard"]),
])
def test_numerics_leaves_out_the_configurations_a_head_dim_does_not_fit_and_says_so_first(dim, left_out):
    out = run("numerics", "--dim", str(dim), "--docs", "1", "--len", "8", "--heads", "1", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    named = [entry.split(" ")[0] for entry in result["left_out"]]
    assert named == left_out, result["left_out"]
    assert all(f"got {dim})" in entry for entry in result["left_out"])
    run_routes = {(r["route"] + ("+hadamard" if r["hadamard"] else "")) for r in result["rows"]}
    assert not run_routes & set(left_out) and "mxfp8" in run_routes
    # Named before the estimate, so before any work.
    assert out.stderr.index("left out: ") < out.stderr.index("estimated:")


def test_numerics_window_and_softcap_meet_the_bars_and_are_named_in_the_table():
    out = run("numerics", "--window", "40,0", "--softcap", "5", "--default-only", "--docs", "2", "--len", "160",
              "--heads", "2", "--dim", "64", "--check", "--quiet")
    assert out.returncode == 0, out.stdout
    assert "causal, window (40, 0), softcap 5," in out.stdout
    assert "accuracy bars (default route, cosine: O >= 0.998, dQ/dK/dV >= 0.997): met" in out.stdout


def test_numerics_runs_a_value_head_dim_of_its_own():
    out = run("numerics", "--dim", "96", "--dv", "64", "--default-only", "--docs", "2", "--len", "128", "--heads", "2",
              "--check", "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "heads 2/2, D = 96, Dv = 64, normal inputs, seed 0" in out.stdout
    assert "--dv expects an integer from 1" in refused("numerics", "--dv", "0")


def test_numerics_runs_peaked_inputs_and_names_them():
    # Sink inputs keep the default route within the bars here; outlier channels do not (a decision
    # that moves the numerics is judged on these too, so each kind must run and be named).
    out = run("numerics", "--inputs", "sink", "--default-only", "--docs", "1", "--len", "256", "--heads", "2",
              "--dim", "64", "--json", "--quiet")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["inputs"] == "sink" and doc["rows"]
    table = run("numerics", "--inputs", "outliers", "--default-only", "--docs", "1", "--len", "256", "--heads", "2",
                "--dim", "64", "--quiet")
    assert table.returncode == 0, table.stderr
    assert "heads 2/2, D = 64, outliers inputs, seed 0" in table.stdout
    assert "--inputs must be normal, sharp, outliers or sink, got 'peaky'" in refused("numerics", "--inputs", "peaky")


def test_numerics_runs_documents_with_their_own_key_lengths():
    # Fewer keys than queries in the first document (its first 100 queries see none: LSE -inf on
    # both sides, left out of the LSE comparison) and more in the second; prefix isolation, which
    # needs equal documents, is left out.
    out = run("numerics", "--lengths", "300,100", "--key-lengths", "200,180", "--dim", "64", "--heads", "2",
              "--check", "--json", "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out.stdout)["rows"]
    assert rows and all(r["isolation"] == "document" for r in rows)
    assert all(r["cosine"] is not None and r["cosine"] > 0.99 for r in rows if r["tensor"] == "lse")
    table = run("numerics", "--lengths", "300,100", "--key-lengths", "200,180", "--dim", "64", "--heads", "2",
                "--default-only", "--quiet")
    assert "documents [300,100], keys [200,180], causal" in table.stdout
    assert "--key-lengths lists 3 documents but there are 2" in refused("numerics", "--key-lengths", "1,2,3")
    assert "expects a comma-separated list of integers from 0" in refused("numerics", "--key-lengths", "5,-1")
    assert "the key documents hold no keys" in refused("numerics", "--key-lengths", "0,0")


def test_probe_passes_under_a_sliding_window_and_softcap():
    out = run("probe", "--dim", "64", "--window", "96", "--softcap", "5", "--quiet")
    assert out.returncode == 0, out.stdout + out.stderr
    assert ", window 96, softcap 5" in out.stdout and "PASS" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["probe", "--window", "-3"], "--window expects an integer from -1"),
    (["probe", "--softcap", "inf"], "--softcap expects a finite number >= 0, got 'inf'"),
    (["numerics", "--window", "5"], "--window expects LEFT,RIGHT (two integers, each >= -1)"),
    (["numerics", "--window", "1,2,3"], "--window expects LEFT,RIGHT"),
    (["numerics", "--window", "-2,0"], "--window expects a comma-separated list of integers from -1"),
    (["numerics", "--softcap", "-1"], "--softcap expects a finite number >= 0, got '-1'"),
    (["numerics", "--softcap", "nan"], "--softcap expects a finite number >= 0, got 'nan'"),
    (["numerics", "--softcap", "3x"], "--softcap expects a finite number >= 0, got '3x'"),
])
def test_bad_windows_and_softcaps_are_refused_at_once(args, message):
    assert message in refused(*args)


def test_numerics_default_only_runs_the_default_route_alone_on_any_head_dim():
    out = run("numerics", "--default-only", "--dim", "100", "--docs", "1", "--len", "40", "--heads", "1", "--json",
              "--quiet")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["rows"]) == 10


def test_the_hadamard_help_gives_the_block_sizes_the_rotation_uses():
    line = next(line for line in run("probe", "--help").stdout.splitlines() if line.startswith("  --hadamard"))
    assert "blocks of 128 features, or of 64 when --dim is not a multiple of 128; --dim a multiple of 64" in line


def test_zero_kv_heads_is_refused_alike_by_both_commands():
    message = "option --kv-heads expects an integer from 1 to 2147483647, got '0'"
    for command in ("numerics", "probe"):
        assert message in refused(command, "--kv-heads", "0")
        kv = next(line for line in run(command, "--help").stdout.splitlines() if line.startswith("  --kv-heads"))
        assert "a divisor of --heads, >= 1" in kv
    assert "(default: --heads)" in next(line for line in run("numerics", "--help").stdout.splitlines()
                                        if line.startswith("  --kv-heads"))


@pytest.mark.parametrize("command", ["numerics", "probe"])
def test_help_lists_the_exit_statuses(command):
    out = run(command, "--help")
    assert out.returncode == 0
    statuses = out.stdout.split("exit status:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in statuses] == ["0", "1", "2", "3"]
    assert "refused before running" in statuses[2] and "out of memory, or an internal error" in statuses[3]


def test_readme_lists_the_exit_statuses():
    usage = (REPO / "README.md").read_text().split("## Usage", 1)[1].split("\n## ", 1)[0]
    statuses = " ".join(usage.split("Exit statuses of `probe` and `numerics`:", 1)[1].split("\n\n", 1)[0].split())
    for status in ("0 = ", "1 = ", "2 = refused before running", "3 = the run could not finish"):
        assert status in statuses, statuses


def limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_running_out_of_memory_exits_3_not_1():
    # --force past the estimate; with 1 GiB of address space the 10 GB inputs cannot be allocated.
    out = subprocess.run([cli_path(), "numerics", "--force", "--quiet", "--default-only", "--docs", "1", "--len", "64",
                          "--heads", "1", "--dim", "20000000"], capture_output=True, text=True, timeout=30,
                         preexec_fn=limit_address_space)
    assert out.returncode == 3, out.stderr
    assert "flamia numerics: error: out of memory (std::bad_alloc); the run did not finish" in out.stderr


STEP = re.compile(r"^\[ *([0-9.]+)s\] (.*) \(([0-9]+)% of the estimated work done, about .* left.*\)$")


def test_progress_shares_rise_with_the_work_and_stay_below_100_until_the_end():
    # Every step is in the estimate (inputs, FP64 forward and backward, each configuration's
    # forward and each of its backwards), so the share rises at every step and keeps up with time.
    out = run("numerics", "--len", "512", "--docs", "2", "--heads", "2", "--dim", "64")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    steps = [(float(m[1]), m[2], int(m[3])) for m in map(STEP.match, lines) if m]
    total = float(re.match(r"^\[ *([0-9.]+)s\] done$", lines[-1])[1])
    names = [name for _, name, _ in steps]
    assert names[:3] == ["generating inputs", "fp64 reference forward", "fp64 reference backward"]
    assert "mxfp8 document/block32/ceil/u=rowcol backward fp16_partials" in names
    shares = [share for _, _, share in steps]
    assert all(a < b for a, b in zip(shares, shares[1:])), shares
    assert shares[-1] < 100 and shares[-1] >= 80, shares
    for elapsed, name, share in steps:  # never far ahead of the time spent (0.1 s log resolution)
        assert share <= 100 * (elapsed + 0.1) / total + 35, (name, share, elapsed, total)


@pytest.mark.parametrize("args, message", [
    (["numerics", "--lengths", "5,-1"],
     "option --lengths expects a comma-separated list of integers from 0 to 2147483647, got item '-1'"),
    (["probe", "--lengths", "5,0,6"],
     "option --lengths expects a comma-separated list of integers from 1 to 2147483647, got item '0'"),
    (["numerics", "--lengths", ""], "option --lengths expects a comma-separated list of integers from 0 to"),
])
def test_lengths_errors_name_the_accepted_range(args, message):
    assert message in refused(*args)


@pytest.mark.parametrize("args, shown", [
    (["numerics", "--dim", "9" * 120_000], "got '" + "9" * 64 + "…' (out of range)"),
    (["numerics", "--lengths", "1," + "a" * 120_000], "got item '" + "a" * 64 + "…'"),
    (["numerics", "--" + "x" * 120_000], "unknown option --" + "x" * 62 + "… (see flamia numerics --help)"),
    (["probe", "--route", "é" * 60_000], "got '" + "é" * 32 + "…'"),  # cut between characters
])
def test_huge_arguments_are_echoed_shortened(args, shown):
    message = refused(*args)
    assert shown in message and len(message) < 400, message[:400]


def test_help_and_version_are_commands_too():
    assert run("help").stdout == run("--help").stdout and run("help").returncode == 0
    assert "commands:" in run("help").stdout
    version = run("version")
    assert version.returncode == 0 and version.stdout == run("--version").stdout and version.stdout.startswith("flamia ")
    assert run("help", "probe").stdout == run("probe", "--help").stdout
    out = run("help", "frobnicate")
    assert out.returncode == 2 and "unknown command 'frobnicate'" in out.stderr
