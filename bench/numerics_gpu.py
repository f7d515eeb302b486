#!/usr/bin/env python3
"""The docs/DESIGN.md §4 accuracy table for the GPU kernels: flamia's forward and backward
against the exact FP64 attention (flamia.reference), for each numerics configuration the kernels
build (the Hopper U layout, rowcol; `flamia numerics` on the CPU gives the emulated route the
same way, with its internal statistics: saturation counts, U zero fraction, row residual, which
the kernels do not export).

Default: 4 documents x 4096 tokens, causal, Hq = Hkv = 16, D = 128, normal inputs (the backward
issue's acceptance configuration). Prints a markdown table; --json writes the numbers.

  python3 bench/numerics_gpu.py [--docs 4] [--len 4096] [--heads 16] [--kv-heads 16] [--dim 128]
                                [--seed 0] [--json out.json] [--markdown out.md]
"""

import argparse
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent

CONFIGS = [  # (name, flamia.attention keyword arguments)
    ("document/block32/ceil", {}),
    ("document/token/ceil", {"scale_geometry": "token"}),
    ("document/block32/floor", {"scale_rule": "floor"}),
    ("prefix/block32/ceil", {"isolation": "prefix"}),
    ("prefix/token/ceil", {"isolation": "prefix", "scale_geometry": "token"}),
]
BARS = {"o": 0.998, "dq": 0.997, "dk": 0.997, "dv": 0.997}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--len", type=int, default=4096, dest="length")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128, choices=(64, 128))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--markdown", metavar="PATH")
    args = p.parse_args(argv)
    if args.docs < 1 or args.length < 1 or args.heads < 1 or args.kv_heads < 1 or args.heads % args.kv_heads:
        p.error("--docs and --len must be >= 1 and --heads a positive multiple of --kv-heads")

    import torch
    try:
        import flamia
    except ImportError:
        sys.path.insert(0, str(HERE.parent / "python"))
        import flamia
    from flamia import reference

    lens = [args.length] * args.docs
    t = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(args.seed)

    def normal(h):
        return torch.randn(t, h, args.dim, generator=g, device="cuda").to(torch.bfloat16)

    q, k, v, dout = normal(args.heads), normal(args.kv_heads), normal(args.kv_heads), normal(args.heads)
    cu = torch.tensor([i * args.length for i in range(args.docs + 1)], dtype=torch.int32, device="cuda")
    print(f"numerics_gpu: FP64 reference, {args.docs} x {args.length}, Hq {args.heads}, Hkv {args.kv_heads}, "
          f"D {args.dim}", file=sys.stderr, flush=True)
    exact_o, _ = reference.attention(q, k, v, lens)
    exact = dict(zip(("dq", "dk", "dv"), reference.gradients(q, k, v, dout, lens)))
    exact["o"] = exact_o

    def metrics(a, b):
        a, b = a.double().flatten(), b.double().flatten()
        return {"cosine": float(a @ b / (a.norm() * b.norm())), "rel_l2": float((a - b).norm() / b.norm()),
                "max_abs": float((a - b).abs().max())}

    rows = []
    for name, kwargs in CONFIGS:
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        o = flamia.attention(*leaves, cu, args.length, **kwargs)
        grads = torch.autograd.grad(o, leaves, dout)
        got = {"o": o, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
        row = {"config": name, **{n: metrics(got[n], exact[n]) for n in ("o", "dq", "dk", "dv")}}
        row["meets_bars"] = all(row[n]["cosine"] >= bar for n, bar in BARS.items())
        rows.append(row)
        print(f"numerics_gpu: {name}: " + ", ".join(f"{n} {row[n]['cosine']:.5f}" for n in BARS), file=sys.stderr)

    lines = [
        f"GPU kernels vs FP64: {args.docs} x {args.length} tokens, causal, Hq {args.heads}, Hkv {args.kv_heads}, "
        f"D {args.dim}, seed {args.seed}, {torch.cuda.get_device_name()}. Bars: cosine O >= 0.998, dQ/dK/dV >= 0.997.",
        "",
        "| config | cos O | rel L2 O | cos dQ | rel L2 dQ | cos dK | rel L2 dK | cos dV | rel L2 dV | bars |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["config"]]
        for n in ("o", "dq", "dk", "dv"):
            cells += [f"{r[n]['cosine']:.5f}", f"{r[n]['rel_l2']:.4f}"]
        cells.append("met" if r["meets_bars"] else "MISSED")
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    print(table)
    meta = {"docs": args.docs, "len": args.length, "heads": args.heads, "kv_heads": args.kv_heads, "dim": args.dim,
            "seed": args.seed, "gpu": torch.cuda.get_device_name()}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)
    return 0 if all(r["meets_bars"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sys.exit(main())
