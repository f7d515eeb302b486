"""scripts/sanitize_report.py (scripts/gpu_check.sh --sanitize) on compute-sanitizer output in the
form an H200 run prints: racecheck's hazard records against the suppressions file, memcheck's and
synccheck's summaries, and the GoogleTest lines around them."""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import sanitize_report  # noqa: E402

DKDV = ("void flamia::cuda::sm90::<unnamed>::backward_dkdv_kernel<(int)128, (bool)0, (bool)0, (bool)0, (bool)1>"
        "(flamia::cuda::sm90::<unnamed>::DkdvArgs)")
PATTERN = "flamia::gpu_test::<unnamed>::pattern::mbarrier_stage_kernel(float *, int *)"

GTEST_OK = """\
[==========] Running 1 test from 1 test suite.
[ RUN      ] SanitizerWorkload.DqPartialsOneDocumentOf8192Tokens
[       OK ] SanitizerWorkload.DqPartialsOneDocumentOf8192Tokens (5321 ms)
[==========] 1 test from 1 test suite ran. (5321 ms total)
[  PASSED  ] 1 test.
"""


def racecheck_log(records, displayed=None, gtest=GTEST_OK):
    lines = ["========= COMPUTE-SANITIZER"]
    pairs = 0
    for severity, (first, first_at), others in records:
        lines.append(f"========= {severity}: Race reported between {first} access at {first_at}")
        for kind, at, n in others:
            lines.append(f"=========     and {kind} access at {at} [{n} hazards]")
            pairs += 1
        lines.append("========= ")
    shown = pairs if displayed is None else displayed
    errors = sum(len(o) for s, _, o in records if s == "Error")
    lines.append(f"========= RACECHECK SUMMARY: {shown} hazards displayed ({errors} errors, {shown - errors} warnings)")
    return gtest + "\n".join(lines) + "\n"


def suppressions(tmp_path, text=None):
    path = tmp_path / "suppressions.txt"
    path.write_text(text if text is not None else (REPO / "scripts" / "sanitizer_suppressions.txt").read_text())
    return sanitize_report.load_suppressions(path)


def dkdv_record(first="Write", then="Read", severity="Error"):
    return (severity, (first, DKDV + "+0xd500"), [(then, DKDV + "+0x2f70", 126016), (then, DKDV + "+0x3020", 126032)])


def test_the_measured_dkdv_records_are_explained(tmp_path):
    # The H200's FP16-partials dK dV instance: producer STS of stage constants against consumer LDS.
    ok, report = sanitize_report.check(racecheck_log([dkdv_record()] * 4), "racecheck", suppressions(tmp_path),
                                       gtest=True)
    assert ok, report
    assert report[0].startswith("suppressed: backward_dkdv_kernel Write/Read (2 pairs, 252048 hazards) by line")
    assert report[-1] == "racecheck: everything explained (4 suppressed records)"


def test_the_reverse_order_through_the_empty_barrier_is_explained(tmp_path):
    ok, report = sanitize_report.check(racecheck_log([dkdv_record("Read", "Write")]), "racecheck",
                                       suppressions(tmp_path))
    assert ok, report


@pytest.mark.parametrize("record", [
    dkdv_record("Write", "Write"),  # not a listed pair
    ("Error", ("Write", "void flamia::quantize_kernel<(int)64>(Args)+0x10"),
     [("Read", "void flamia::quantize_kernel<(int)64>(Args)+0x20", 3)]),  # not a listed kernel
    ("Error", ("Write", DKDV + "+0xd500"),
     [("Read", DKDV + "+0x2f70", 5), ("Write", DKDV + "+0x3000", 2)]),  # one side of another kind
    ("Warning", ("Write", "void other_kernel(int)+0x10"), [("Read", "void other_kernel(int)+0x20", 1)]),
])
def test_anything_unlisted_fails(tmp_path, record):
    ok, report = sanitize_report.check(racecheck_log([dkdv_record(), record]), "racecheck", suppressions(tmp_path))
    assert not ok
    assert any(line.startswith("FAIL: hazard not explained by a suppression") for line in report)


def test_a_kernel_substring_must_be_on_every_side(tmp_path):
    mixed = ("Error", ("Write", DKDV + "+0xd500"), [("Read", "void flamia::other_kernel(int)+0x20", 1)])
    ok, _ = sanitize_report.check(racecheck_log([mixed]), "racecheck", suppressions(tmp_path))
    assert not ok


def test_a_summary_that_disagrees_with_the_records_read_fails(tmp_path):
    ok, report = sanitize_report.check(racecheck_log([dkdv_record()], displayed=7), "racecheck", suppressions(tmp_path))
    assert not ok
    assert any("output not understood" in line for line in report)


def test_a_run_without_its_summary_fails(tmp_path):
    text = racecheck_log([dkdv_record()]).replace("RACECHECK SUMMARY", "RACECHECK SUMMA")
    ok, _ = sanitize_report.check(text, "racecheck", suppressions(tmp_path))
    assert not ok


def test_the_reproduction_must_show_the_suppressed_class(tmp_path):
    record = ("Error", ("Write", PATTERN + "+0x3f0"), [("Read", PATTERN + "+0x4a0", 96)])
    ok, report = sanitize_report.check(racecheck_log([record]), "racecheck", suppressions(tmp_path),
                                       expect_suppressed=["mbarrier_stage_kernel"])
    assert ok, report
    ok, report = sanitize_report.check(racecheck_log([]), "racecheck", suppressions(tmp_path),
                                       expect_suppressed=["mbarrier_stage_kernel"])
    assert not ok
    assert any("no longer" in line for line in report)


def test_memcheck_and_synccheck_need_zero_errors():
    clean = GTEST_OK + "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
    for tool in ("memcheck", "synccheck"):
        ok, report = sanitize_report.check(clean, tool, [], gtest=True)
        assert ok, report
    bad = GTEST_OK + """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at flamia::cuda::quantize_kernel(Args)+0x1a0
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f0000000400 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""
    ok, report = sanitize_report.check(bad, "memcheck", [], gtest=True)
    assert not ok
    assert "FAIL: memcheck reported: Invalid __global__ read of size 4 bytes" in report
    assert "FAIL: ERROR SUMMARY: 1 errors" in report
    ok, _ = sanitize_report.check(GTEST_OK + "========= COMPUTE-SANITIZER\n", "synccheck", [])
    assert not ok  # no summary: the run did not finish


def test_googletest_failures_skips_and_empty_runs_fail():
    tail = "========= ERROR SUMMARY: 0 errors\n"
    failed = GTEST_OK.replace("[  PASSED  ] 1 test.", "[  PASSED  ] 0 tests.\n[  FAILED  ] 1 test, listed below:\n"
                              "[  FAILED  ] SanitizerWorkload.DqPartialsOneDocumentOf8192Tokens\n")
    ok, report = sanitize_report.check(failed + tail, "memcheck", [], gtest=True)
    assert not ok and "FAIL: GoogleTest: SanitizerWorkload.DqPartialsOneDocumentOf8192Tokens failed" in report
    skipped = GTEST_OK.replace("[  PASSED  ] 1 test.", "[  PASSED  ] 0 tests.\n[  SKIPPED ] 1 test, listed below:\n"
                               "[  SKIPPED ] SanitizerWorkload.DqPartialsOneDocumentOf8192Tokens\n")
    ok, _ = sanitize_report.check(skipped + tail, "memcheck", [], gtest=True)
    assert not ok
    none = "[==========] 0 tests from 0 test suites ran. (0 ms total)\n[  PASSED  ] 0 tests.\n"
    ok, _ = sanitize_report.check(none + tail, "memcheck", [], gtest=True)
    assert not ok
    ok, _ = sanitize_report.check(GTEST_OK + "========= Target application returned an error\n" + tail, "memcheck", [])
    assert not ok


def test_the_suppressions_file_needs_a_reason_and_known_fields(tmp_path):
    for text in ("racecheck forward_kernel Write/Read\n", "racecheck forward_kernel Write-Read why\n",
                 "initcheck forward_kernel Write/Read why\n"):
        with pytest.raises(ValueError):
            suppressions(tmp_path, text)
    (s,) = suppressions(tmp_path, "# comment\n\nracecheck forward_kernel Read/Write the empty barrier  # note\n")
    assert (s.tool, s.kernel, s.first, s.then, s.reason, s.line) == (
        "racecheck", "forward_kernel", "Read", "Write", "the empty barrier", 3)


def test_the_command_line(tmp_path, capsys):
    log = tmp_path / "racecheck.log"
    log.write_text(racecheck_log([dkdv_record()]))
    supp = str(REPO / "scripts" / "sanitizer_suppressions.txt")
    assert sanitize_report.main([str(log), "--tool", "racecheck", "--suppressions", supp, "--gtest"]) == 0
    log.write_text(racecheck_log([dkdv_record("Write", "Write")]))
    assert sanitize_report.main([str(log), "--tool", "racecheck", "--suppressions", supp]) == 1
    assert "hazard not explained" in capsys.readouterr().out


def test_the_tools_log_file_apart_from_the_programs_output(tmp_path):
    # compute-sanitizer --log-file holds the tool's lines (prefixed or not); the tests' output is its own file.
    log = racecheck_log([dkdv_record()], gtest="")
    for text in (log, "\n".join(line.removeprefix("=========").removeprefix(" ") for line in log.splitlines())):
        ok, report = sanitize_report.check(text, "racecheck", suppressions(tmp_path), gtest=True, program_text=GTEST_OK)
        assert ok, report
    ok, report = sanitize_report.check(log, "racecheck", suppressions(tmp_path), gtest=True, program_text="")
    assert not ok and any("no test ran" in line for line in report)
    (tmp_path / "r.log").write_text(log)
    (tmp_path / "r.out").write_text(GTEST_OK)
    assert sanitize_report.main([str(tmp_path / "r.log"), "--program-output", str(tmp_path / "r.out"), "--tool",
                                 "racecheck", "--suppressions", str(REPO / "scripts" / "sanitizer_suppressions.txt"),
                                 "--gtest"]) == 0
