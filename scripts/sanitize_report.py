#!/usr/bin/env python3
"""Reads the output of one compute-sanitizer run (memcheck, racecheck or synccheck; the tool's
lines start with "========= ", the program's own output may be interleaved) and fails on anything
that is not explained.

  sanitize_report.py --tool racecheck --suppressions scripts/sanitizer_suppressions.txt LOG
                     [--program-output OUT] [--gtest] [--expect-suppressed KERNEL]

LOG is the tool's output (compute-sanitizer --log-file, or its output and the program's in one
file); --program-output the program's own output, kept apart so that the two never interleave
mid-line.

- memcheck, synccheck: the run must end with "ERROR SUMMARY: 0 errors" and print no error record.
- racecheck: every hazard record ("Error: Race reported between Write access at <kernel>+0x..
  / and Read access at <kernel>+0x.. [N hazards]") must match a suppression: the same tool, a
  kernel-name substring found on every side of the record, and the record's access pair (first
  access / each later access, e.g. Write/Read). The summary's count of displayed hazards must agree
  with the records read (a format this parser does not understand fails instead of passing).
- any other error or warning line of the tool, a missing summary (a crash, a timeout), or the tool's
  "Target application returned an error" fails.
- --gtest: the program is a GoogleTest binary: at least one test ran, none failed, none skipped.
- --expect-suppressed KERNEL: at least one suppressed record names KERNEL (the minimal
  reproduction shows the suppressed hazard class on a correct program).

The suppressions file: one per line, `tool kernel-substring first/then reason...`; the reason is
required; '#' starts a comment. Exit status 0 when everything is explained, 1 otherwise, 2 on bad
arguments or a malformed suppressions file.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys

PREFIX = "========="
TOOLS = ("memcheck", "racecheck", "synccheck")
ACCESS = ("Read", "Write")

RACE_START = re.compile(r"^(Error|Warning): Race reported between (\w+) access at (.*)$")
RACE_AND = re.compile(r"^and (\w+) access at (.*)$")
HAZARD_COUNT = re.compile(r"\s*\[(\d+) hazards?\]\s*$")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
# Lines of the tool that are neither records nor summaries and say nothing is wrong.
BENIGN = re.compile(r"^(COMPUTE-SANITIZER|$)")


@dataclasses.dataclass
class Suppression:
    line: int
    tool: str
    kernel: str
    first: str
    then: str
    reason: str
    used: int = 0

    def matches(self, tool: str, record: "RaceRecord") -> bool:
        return (self.tool == tool and self.first == record.first_access
                and all(kind == self.then for kind, _, _ in record.others)
                and all(self.kernel in loc for loc in record.locations()))


@dataclasses.dataclass
class RaceRecord:
    severity: str  # Error or Warning
    first_access: str
    first_at: str
    others: list  # (access, location, hazards)

    def locations(self):
        return [self.first_at] + [loc for _, loc, _ in self.others]

    def kernel(self) -> str:
        return short_kernel(self.first_at)

    def describe(self) -> str:
        lines = [f"{self.severity}: Race reported between {self.first_access} access at {self.first_at}"]
        lines += [f"    and {kind} access at {loc} [{n} hazards]" for kind, loc, n in self.others]
        return "\n".join(lines)


def short_kernel(location: str) -> str:
    """The kernel's bare name in a location such as 'void ns::<unnamed>::k<(int)128>(Args)+0x2f70'."""
    name = location.replace("<unnamed>", "(anonymous)").replace("(anonymous namespace)", "(anonymous)")
    name = name.replace("(anonymous)", "anonymous")
    name = re.split(r"[<(]", name, maxsplit=1)[0].split()
    return name[-1].split("::")[-1] if name else location


def offset(location: str) -> str:
    """The instruction offset ('+0x2f70') a location ends with, or the whole location."""
    m = re.search(r"\+0x[0-9a-fA-F]+", location)
    return m.group(0) if m else location


def load_suppressions(path: pathlib.Path) -> list[Suppression]:
    out = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        fields = text.split(None, 3)
        if len(fields) < 4:
            raise ValueError(f"{path}:{number}: want 'tool kernel first/then reason', got {raw!r}")
        tool, kernel, pair, reason = fields
        first, _, then = pair.partition("/")
        if tool not in TOOLS or first not in ACCESS or then not in ACCESS:
            raise ValueError(f"{path}:{number}: unknown tool or access pair in {raw!r}")
        out.append(Suppression(number, tool, kernel, first, then, reason.strip()))
    return out


@dataclasses.dataclass
class Parsed:
    races: list
    unknown: list  # tool lines that report something this parser does not explain
    race_summary: tuple | None = None  # (displayed, errors, warnings)
    error_summary: int | None = None
    app_error: bool = False
    gtest_ran: int | None = None
    gtest_failed: list = dataclasses.field(default_factory=list)
    gtest_skipped: list = dataclasses.field(default_factory=list)


def parse(text: str, program_text: str | None = None) -> Parsed:
    """text: the tool's lines ("========= ..."), the program's lines around them unless
    program_text holds those (then every line of text is the tool's, prefixed or not)."""
    p = Parsed(races=[], unknown=[])
    record = None
    if program_text is not None:
        text = "\n".join(line if line.startswith(PREFIX) else PREFIX + " " + line for line in text.splitlines())
        text = program_text + "\n" + text
    for raw in text.splitlines():
        if not raw.startswith(PREFIX):
            record = None
            ran = re.match(r"^\[==========\] (\d+) tests? from .* ran\.", raw)
            if ran:
                p.gtest_ran = int(ran.group(1))
            failed = re.match(r"^\[  FAILED  \] (\S+\.\S+)", raw)
            if failed and failed.group(1) not in p.gtest_failed:
                p.gtest_failed.append(failed.group(1))
            skipped = re.match(r"^\[  SKIPPED \] (\S+\.\S+)", raw)
            if skipped and skipped.group(1) not in p.gtest_skipped:
                p.gtest_skipped.append(skipped.group(1))
            continue
        line = raw[len(PREFIX):].strip()
        start = RACE_START.match(line)
        more = RACE_AND.match(line)
        if start:
            first_at = start.group(3)
            n = HAZARD_COUNT.search(first_at)
            first_at = HAZARD_COUNT.sub("", first_at)
            record = RaceRecord(start.group(1), start.group(2), first_at, [])
            if n:  # a one-line record: "... at X [n hazards]" (no later access listed)
                record.others.append((start.group(2), first_at, int(n.group(1))))
            p.races.append(record)
            continue
        if more and record is not None:
            n = HAZARD_COUNT.search(more.group(2))
            record.others.append((more.group(1), HAZARD_COUNT.sub("", more.group(2)), int(n.group(1)) if n else 0))
            continue
        record = None
        summary = RACE_SUMMARY.search(line)
        if summary:
            p.race_summary = tuple(int(x) for x in summary.groups())
            continue
        summary = ERROR_SUMMARY.search(line)
        if summary:
            p.error_summary = int(summary.group(1))
            continue
        if "Target application returned an error" in line:
            p.app_error = True
            continue
        if BENIGN.match(line) or raw.startswith(PREFIX + "    "):
            continue  # the banner, blank separators, a record's indented detail (backtraces)
        p.unknown.append(line)
    return p


def check(text: str, tool: str, suppressions: list[Suppression], gtest: bool = False,
          expect_suppressed: list[str] | None = None, program_text: str | None = None) -> tuple[bool, list[str]]:
    """(passed, report lines)."""
    p = parse(text, program_text)
    ok = True
    out = []

    def fail(message):
        nonlocal ok
        ok = False
        out.append("FAIL: " + message)

    if p.app_error:
        fail("compute-sanitizer: the target application returned an error")
    if gtest:
        if p.gtest_ran is None or p.gtest_ran == 0:
            fail("GoogleTest: no test ran (a filter that matches nothing, or the program stopped early)")
        for name in p.gtest_failed:
            fail(f"GoogleTest: {name} failed")
        for name in p.gtest_skipped:
            fail(f"GoogleTest: {name} was skipped (no sm_90 device?): nothing was checked")
    for line in p.unknown:
        fail(f"{tool} reported: {line}")

    if tool == "racecheck":
        if p.race_summary is None:
            fail("no RACECHECK SUMMARY line: the run did not finish")
        suppressed = []
        for record in p.races:
            match = next((s for s in suppressions if s.matches(tool, record)), None)
            if match is None:
                fail("hazard not explained by a suppression:\n" + record.describe())
            else:
                match.used += 1
                suppressed.append((record, match))
        if p.race_summary is not None:
            displayed, errors, warnings = p.race_summary
            pairs = sum(len(r.others) for r in p.races)
            if displayed not in (len(p.races), pairs) or errors + warnings != displayed:
                fail(f"RACECHECK SUMMARY displays {displayed} hazards ({errors} errors, {warnings} warnings), "
                     f"but {len(p.races)} records of {pairs} access pairs were read: output not understood")
        for record, s in suppressed:
            hazards = sum(n for _, _, n in record.others)
            sides = ", ".join(f"{kind} {offset(loc)} [{n}]" for kind, loc, n in record.others)
            out.append(f"suppressed: {record.kernel()} {record.first_access}/"
                       f"{'/'.join(sorted({k for k, _, _ in record.others}))} ({len(record.others)} pairs, "
                       f"{hazards} hazards) by line {s.line}: {s.reason}\n"
                       f"    {record.first_access} {offset(record.first_at)} and {sides}")
        for want in expect_suppressed or []:
            if not any(want in r.first_at for r, _ in suppressed):
                fail(f"racecheck reported no suppressed hazard in {want}: the minimal reproduction no longer "
                     "shows the suppressed class (update docs/KERNELS.md, 'Sanitizers')")
    else:
        for record in p.races:
            fail(f"{tool} printed a race record:\n" + record.describe())
        if p.error_summary is None:
            fail("no ERROR SUMMARY line: the run did not finish")
        elif p.error_summary != 0:
            fail(f"ERROR SUMMARY: {p.error_summary} errors")
    if ok:
        out.append(f"{tool}: everything explained ({len(p.races)} suppressed records)")
    return ok, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=pathlib.Path)
    ap.add_argument("--tool", required=True, choices=TOOLS)
    ap.add_argument("--suppressions", type=pathlib.Path)
    ap.add_argument("--program-output", type=pathlib.Path)
    ap.add_argument("--gtest", action="store_true")
    ap.add_argument("--expect-suppressed", action="append", default=[])
    args = ap.parse_args(argv)
    try:
        suppressions = load_suppressions(args.suppressions) if args.suppressions else []
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    program = args.program_output.read_text(errors="replace") if args.program_output else None
    ok, lines = check(args.log.read_text(errors="replace"), args.tool, suppressions, args.gtest,
                      args.expect_suppressed, program)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
