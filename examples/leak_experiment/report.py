#!/usr/bin/env python3
"""Leak experiment report: reads the runs train.py wrote (<runs>/<config>_s<seed>/metrics.jsonl) and
writes the table (final validation loss through the run's own attention and through exact BF16
attention, the gap, their spread over seeds, and training throughput) as markdown, plus the loss
curves as PNG.

  python3 examples/leak_experiment/report.py --runs runs --markdown docs/leak_experiment.md \\
      --plot docs/leak_experiment.png
"""

import argparse
import collections
import json
import pathlib
import re
import statistics
import sys

from configs import CONFIGS

ORDER = tuple(CONFIGS)


def load(runs):
    """{config: {seed: [entries]}} of every run folder named <config>_s<seed>."""
    out = collections.defaultdict(dict)
    for folder in sorted(pathlib.Path(runs).iterdir()):
        m = re.fullmatch(r"(\w+?)_s(\d+)", folder.name)
        if not m or not (folder / "metrics.jsonl").exists():
            continue
        entries = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
        out[m.group(1)][int(m.group(2))] = entries
    return out


def summarize(entries):
    evals = [e for e in entries if "val_own" in e]
    speeds = [e["tokens_per_s"] for e in entries if "tokens_per_s" in e]
    if not evals:
        return None
    last = evals[-1]
    # the median of the logged throughputs after the first (which includes compilation and warm-up)
    return {"step": last["step"], "own": last["val_own"], "ref": last["val_ref"], "gap": last["gap"],
            "tokens_per_s": statistics.median(speeds[1:] or speeds) if speeds else None}


def spread(values):
    """mean and half the range (min..max) over seeds."""
    return statistics.mean(values), (max(values) - min(values)) / 2 if len(values) > 1 else float("nan")


def ordered(runs):
    """The configurations present, in configs.py's order, then any others."""
    return [c for c in ORDER if c in runs] + [c for c in runs if c not in ORDER]


def markdown(runs):
    lines = ["| config | seeds | step | val loss, own kernel | val loss, exact BF16 attention | gap (exact - own) | "
             "tokens/s |", "|---|---|---|---|---|---|---|"]
    for config in ordered(runs):
        rows = [r for r in (summarize(e) for e in runs[config].values()) if r]
        if not rows:
            continue
        cells = [config, str(len(rows)), str(min(r["step"] for r in rows))]
        for key in ("own", "ref", "gap"):
            mean, half = spread([r[key] for r in rows])
            cells.append(f"{mean:.4f} ± {half:.4f}" if half == half else f"{mean:.4f}")
        speeds = [r["tokens_per_s"] for r in rows if r["tokens_per_s"]]
        cells.append(f"{statistics.mean(speeds) / 1e3:.1f}k" if speeds else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("± is half the range over seeds (min to max). The gap is the exact-attention loss minus the "
                 "own-kernel loss of the same checkpoint: a model that learned to read the future through its "
                 "kernel does worse when the kernel stops leaking.")
    return "\n".join(lines) + "\n"


def plot(runs, path):
    """Three panels: training loss, validation loss (own kernel solid, exact attention dashed) and the
    gap per evaluation; one color per configuration, one line per seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    palette = ("black", "tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:gray")
    colors = dict(zip(ordered(runs), palette))
    for config in ordered(runs):
        c = colors[config]
        for n, (seed, entries) in enumerate(sorted(runs[config].items())):
            label = config if n == 0 else None  # one legend entry per configuration
            train = [(e["step"], e["train_loss"]) for e in entries if "train_loss" in e]
            evals = [(e["step"], e["val_own"], e["val_ref"], e["gap"]) for e in entries if "val_own" in e]
            if train:
                axes[0].plot(*zip(*train), color=c, alpha=0.7, lw=1, label=label)
            if evals:
                s, own, ref, gap = zip(*evals)
                axes[1].plot(s, own, color=c, marker="o", ms=3, label=label)
                axes[1].plot(s, ref, color=c, marker="x", ms=4, linestyle="--")
                axes[2].plot(s, gap, color=c, marker="o", ms=3, label=label)
    axes[0].set(title="training loss", xlabel="step", ylabel="loss (nats/byte)", yscale="log")
    axes[1].set(title="validation loss: own kernel (solid), exact attention (dashed)", xlabel="step",
                ylabel="loss (nats/byte)", yscale="log")
    axes[2].set(title="gap = exact - own (a learned leak makes it positive)", xlabel="step", ylabel="nats/byte")
    axes[2].set_yscale("symlog", linthresh=1e-2)
    axes[2].axhline(0, color="gray", lw=0.8)
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, type=pathlib.Path)
    p.add_argument("--markdown", type=pathlib.Path)
    p.add_argument("--plot", type=pathlib.Path)
    args = p.parse_args(argv)
    runs = load(args.runs)
    if not runs:
        print(f"report: no runs with metrics.jsonl under {args.runs}", file=sys.stderr)
        return 2
    table = markdown(runs)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.plot:
        plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
