#!/usr/bin/env python3
"""Instruction counts of address ranges of a SASS listing, by opcode: how many instructions one
thread issues along a path through a kernel's loop (the per-phase counts in docs/KERNELS.md).

  cuobjdump -sass build/CMakeFiles/flamia_cuda.dir/src/cuda/sm90/backward_dkdv.cu.o > dkdv.sass
  python3 scripts/sass_ranges.py dkdv.sass --function 'ILi128ELb0ELb0ELb0ELb1E' 2480-2a10 5170-6070 ...

Each range is START-END in hex (START included, END not), as the listing's /*addr*/ columns give
them; read the loop's branches to choose the ranges of one path (for the dK dV step: the loop's
backward branch, the uniform branch to the masked path, the grouped/per-token branch, the masked or
interior U~ codes). --function keeps the listing of the first function whose name contains the
text. Prints one line per range and the total, with the most frequent opcodes (their first
mnemonic part: FMUL, QGMMA, ...; predicates dropped).
"""
import argparse
import collections
import re
import sys


def instructions(lines, function=None):
    """[(address, text)] of the listing, or of the first function whose name contains `function`."""
    out, inside = [], function is None
    for line in lines:
        if "Function :" in line:
            if inside and out:
                break
            inside = function is None or function in line
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if inside and m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(text):
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0].split(".")[0]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("listing", help="cuobjdump -sass output")
    p.add_argument("ranges", nargs="+", help="START-END in hex")
    p.add_argument("--function", help="a substring of the function's (mangled) name")
    p.add_argument("--top", type=int, default=14, help="opcodes listed per range (default 14)")
    args = p.parse_args(argv)
    ins = instructions(open(args.listing).read().splitlines(), args.function)
    if not ins:
        sys.exit(f"sass_ranges: no instructions{' in a function matching ' + args.function if args.function else ''}")
    total, every = 0, collections.Counter()
    for rg in args.ranges:
        try:
            start, end = (int(x, 16) for x in rg.split("-"))
        except ValueError:
            sys.exit(f"sass_ranges: a range is START-END in hex, got {rg!r}")
        counts = collections.Counter(opcode(t) for a, t in ins if start <= a < end)
        n = sum(counts.values())
        total += n
        every += counts
        print(f"{rg}: {n}  " + ", ".join(f"{k} {v}" for k, v in counts.most_common(args.top)))
    print(f"total {total}: " + ", ".join(f"{k} {v}" for k, v in every.most_common(40)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
