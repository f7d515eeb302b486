#!/usr/bin/env python3
"""The backward's time against FlashAttention-3's: the training call minus the forward, per
workload, from two runs of bench/bench_attention.py (--pass train and --pass forward, each with
--json) that timed flamia and jax-fa3 in one process each. One --library per flamia build, so that
builds measured on the same machine in the same job sit side by side:

  python3 bench/backward_ratio.py --library main train.json forward.json \\
                                  --library variant train2.json forward2.json [--markdown out.md]

Prints one markdown row per (library, workload) and, for the first library, the line
`backward / FA3 at <workload>: <ratio>` (FA3's backward ms over flamia's: > 1 means flamia's is
faster), the form docs/RESULTS.md quotes. A ratio is formed only where both passes of both
implementations report status ok (bench_attention refuses a baseline whose outputs disagree with
flamia's); the others show what they reported instead. Only the standard library.
"""
import argparse
import json
import pathlib
import sys

FLAMIA = "flamia"
FA3 = "jax-fa3"  # bench/attention/impls.py's FA3_BASELINE


def load_run(path, expected_pass):
    """{workload: {impl: result}} of a bench_attention --json file, checked to be of expected_pass."""
    data = json.loads(pathlib.Path(path).read_text())
    run_pass = data.get("meta", {}).get("pass")
    if run_pass != expected_pass:
        raise ValueError(f"{path}: a --pass {run_pass} run where --pass {expected_pass} was expected")
    return {row["workload"]: row["impls"] for row in data["results"]}


def milliseconds(results, impl):
    """(ms, None) where the implementation ran and passed its checks, else (None, its status)."""
    r = results.get(impl)
    if r is None:
        return None, "not run"
    if r.get("status") != "ok":
        return None, r.get("status", "no status")
    return r["ms"], None


def backward_rows(library, train, forward):
    """One dict per workload timed in both passes: the four times, both backwards and FA3 / flamia."""
    rows = []
    for workload in train:
        if workload not in forward:
            continue
        row = {"library": library, "workload": workload, "problems": []}
        for impl in (FLAMIA, FA3):
            t, t_why = milliseconds(train[workload], impl)
            f, f_why = milliseconds(forward[workload], impl)
            row[impl] = {"train": t, "forward": f, "backward": t - f if t is not None and f is not None else None}
            for why, which in ((t_why, "train"), (f_why, "forward")):
                if why:
                    row["problems"].append(f"{impl} {which}: {why}")
        flamia_bwd, fa3_bwd = row[FLAMIA]["backward"], row[FA3]["backward"]
        row["ratio"] = fa3_bwd / flamia_bwd if flamia_bwd and fa3_bwd and flamia_bwd > 0 and fa3_bwd > 0 else None
        rows.append(row)
    return rows


def markdown(rows):
    def ms(x):
        return f"{x:.3f}" if x is not None else "n/a"

    lines = ["| library | workload | flamia train / forward ms | FA3 train / forward ms | flamia backward ms | "
             "FA3 backward ms | FA3 / flamia |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        fl, fa = r[FLAMIA], r[FA3]
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "n/a (" + "; ".join(r["problems"]) + ")"
        lines.append(f"| {r['library']} | {r['workload']} | {ms(fl['train'])} / {ms(fl['forward'])} | "
                     f"{ms(fa['train'])} / {ms(fa['forward'])} | {ms(fl['backward'])} | {ms(fa['backward'])} | "
                     f"{ratio} |")
    return "\n".join(lines) + "\n"


def headline(rows):
    """The `backward / FA3 at W: r` lines of the first library's rows that have a ratio."""
    if not rows:
        return ""
    first = rows[0]["library"]
    return "".join(f"backward / FA3 at {r['workload']}: {r['ratio']:.2f}\n"
                   for r in rows if r["library"] == first and r["ratio"] is not None)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", nargs=3, action="append", required=True, metavar=("NAME", "TRAIN_JSON", "FORWARD_JSON"),
                   help="a flamia build's name and its two bench_attention --json files (repeatable)")
    p.add_argument("--markdown", metavar="PATH", help="also write the table and the headline lines here")
    args = p.parse_args(argv)
    rows = []
    try:
        for name, train_path, forward_path in args.library:
            rows += backward_rows(name, load_run(train_path, "train"), load_run(forward_path, "forward"))
    except (OSError, ValueError, KeyError) as e:
        print(f"backward_ratio: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("backward_ratio: no workload was timed in both passes", file=sys.stderr)
        return 2
    text = markdown(rows) + "\n" + headline(rows)
    print(text, end="")
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
