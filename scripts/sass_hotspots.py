#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS instruction, from an Nsight Compute source-page export:

  ncu --import REPORT.ncu-rep --kernel-name regex:NAME --page source --csv --print-source sass > k.csv
  python3 scripts/sass_hotspots.py k.csv [--top 40]

(scripts/profile_gpu.sh --sass does both for every attention kernel.) The report must hold the
SourceCounters section. Prints the stall reasons summed over the kernel, the opcode mix (share of
executed warp instructions and of stall samples), the samples by how often an instruction ran
(instructions of one loop body share a count, so code that runs once per work item and code that
runs once per tile fall into different groups; wait loops spin a varying number of times), and the
instructions with the most samples, each with its three largest stall reasons.
"""
import argparse
import collections
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):  # predicate
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    p.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    p.add_argument("--groups", type=int, default=8, help="execution-count groups to list (default 8)")
    args = p.parse_args(argv)
    rows = list(csv.reader(open(args.csv, newline="")))
    header_at = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if header_at is None:
        sys.exit(f"sass_hotspots: no SASS source table in {args.csv} (was SourceCounters collected?)")
    header = rows[header_at]
    col = {name: i for i, name in enumerate(header)}
    data = [r for r in rows[header_at + 1:] if len(r) == len(header) and r[col["Address"]] != "Address"]
    stall_cols = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    samples_col, executed_col = "Warp Stall Sampling (All Samples)", "Instructions Executed"
    for needed in (samples_col, executed_col, "Source"):
        if needed not in col:
            sys.exit(f"sass_hotspots: column '{needed}' missing from {args.csv}")

    per_reason = collections.Counter()
    for r in data:
        for s in stall_cols:
            per_reason[s] += number(r[col[s]])
    total = sum(per_reason.values()) or 1.0
    print(f"stall samples: {total:.0f}")
    for reason, v in per_reason.most_common(12):
        print(f"  {reason[len('stall_'):]:20s} {100 * v / total:5.1f}%")

    executed, sampled = collections.Counter(), collections.Counter()
    for r in data:
        op = opcode(r[col["Source"]])
        executed[op] += number(r[col[executed_col]])
        sampled[op] += number(r[col[samples_col]])
    all_executed = sum(executed.values()) or 1.0
    all_sampled = sum(sampled.values()) or 1.0
    print(f"executed warp instructions: {all_executed:.0f}")
    for op, v in executed.most_common(25):
        print(f"  {op:10s} {100 * v / all_executed:5.1f}% executed  {100 * sampled[op] / all_sampled:5.1f}% of samples")

    by_runs = collections.defaultdict(lambda: [0.0, 0])  # runs (3 significant digits) -> [samples, instructions]
    for r in data:
        runs = float(f"{number(r[col[executed_col]]):.3g}")
        by_runs[runs][0] += number(r[col[samples_col]])
        by_runs[runs][1] += 1
    print(f"--- stall samples by runs per instruction (the {args.groups} largest groups)")
    for runs, (samples, count) in sorted(by_runs.items(), key=lambda kv: -kv[1][0])[:args.groups]:
        print(f"  {runs:>12.3g} runs  {count:5d} instructions  {100 * samples / all_sampled:5.1f}% of samples")

    print(f"--- top {args.top} instructions by stall samples")
    for r in sorted(data, key=lambda r: -number(r[col[samples_col]]))[:args.top]:
        reasons = sorted(((number(r[col[s]]), s[len("stall_"):]) for s in stall_cols), reverse=True)[:3]
        print(f"{r[col['Address']]:>8} {100 * number(r[col[samples_col]]) / all_sampled:5.2f}%  "
              f"{r[col['Source']][:60]:60s} " + " ".join(f"{name}:{int(v)}" for v, name in reasons))


if __name__ == "__main__":
    main()
