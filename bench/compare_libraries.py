#!/usr/bin/env python3
"""Whether two builds of the library compute the same bits: whole training calls (o, lse, dq, dk, dv)
on benchmark workloads, saved by one build and compared bitwise by another (a differing output is
reported with its cosine and largest difference to the saved one), on the deterministic backward.
A kernel change that only reorders work (scheduling, barriers, loads) must pass this before it is
timed. With --fp16-partials each workload's default backward is compared too (document isolation;
FP16 dQ partials where they apply, the deterministic passes again elsewhere): o, lse, dk and dv
bitwise, dq, whose bits depend on the order of the partials' adds, by its cosine to the saved dq
(at least --dq-cosine).

The library is the one at $FLAMIA_CAPI_LIB (python/flamia/_capi.py), so each build runs in its own
process:

  FLAMIA_CAPI_LIB=main.so    python3 bench/compare_libraries.py save /tmp/ref.pt
  FLAMIA_CAPI_LIB=variant.so python3 bench/compare_libraries.py compare /tmp/ref.pt   # exit 1 if any differs

Options: --workloads (comma-separated, default tiny-unaligned,16x4096,4x16384-gqa16/4,1x65536),
--isolation (document, prefix or both; default both), --fp16-partials, --dq-cosine, --seed. Run
from the repository root on a GPU machine with PYTHONPATH=python (or flamia installed).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

OUTPUTS = ("o", "lse", "dq", "dk", "dv")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("save", "compare"))
    p.add_argument("path", help="the saved outputs (torch.save file)")
    p.add_argument("--workloads", default="tiny-unaligned,16x4096,4x16384-gqa16/4,1x65536")
    p.add_argument("--isolation", choices=("document", "prefix", "both"), default="both")
    p.add_argument("--fp16-partials", action="store_true",
                   help="also compare the default backward's calls (FP16 dQ partials where they apply)")
    p.add_argument("--dq-cosine", type=float, default=0.99999,
                   help="the least cosine of an FP16-partials dq to the saved one (default 0.99999)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.names = args.workloads.split(",")
    unknown = [n for n in args.names if n not in W.WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; known: {', '.join(W.WORKLOADS)}")
    args.modes = ("document", "prefix") if args.isolation == "both" else (args.isolation,)
    return args


def measure(a, b):
    """The cosine and largest |a - b| of two outputs of one shape (numpy arrays) over the elements
    finite in both, and how many elements are finite in one only or differ in NaN-ness."""
    import numpy as np
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    both = np.isfinite(a) & np.isfinite(b)
    mismatched = int(np.count_nonzero(~both & ~((np.isnan(a) & np.isnan(b)) | (a == b))))
    x, y = a[both], b[both]
    norms = np.linalg.norm(x) * np.linalg.norm(y)
    cosine = float(x @ y / norms) if norms > 0 else float("nan")
    return cosine, float(np.max(np.abs(x - y))) if x.size else 0.0, mismatched


def difference(a, b):
    """How far two outputs of one shape are apart (numpy arrays), as text (measure's numbers)."""
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    cosine, max_abs, mismatched = measure(a, b)
    text = f"cosine {cosine:.7f}, max |diff| {max_abs:.4g}"
    return text + (f", {mismatched} non-finite mismatches" if mismatched else "")


def training_call(torch, flamia, name, isolation, seed, deterministic=True):
    lens = W.WORKLOADS[name]["lens"]
    q, k, v, dout, cu = W.training_inputs(torch, name, seed=seed)
    # By default the deterministic backward: the FP16 dQ partials' reduction order, and so dQ's bits,
    # vary.
    o, lse = flamia.attention(q, k, v, cu, max(lens), isolation=isolation, return_lse=True,
                              deterministic=deterministic)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), dout)
    return [t.detach().cpu() for t in (o, lse, dq, dk, dv)]


def main(argv=None):
    args = parse_args(argv)
    import torch
    import flamia
    if not torch.cuda.is_available():
        sys.exit("compare_libraries: needs a CUDA GPU")
    library = os.environ.get("FLAMIA_CAPI_LIB", "(the installed package's)")
    results = {}
    for isolation in args.modes:
        for name in args.names:
            print(f"compare_libraries: {name}, {isolation} ...", file=sys.stderr, flush=True)
            results[f"{isolation}/{name}"] = training_call(torch, flamia, name, isolation, args.seed)
    if args.fp16_partials:
        for name in args.names:
            print(f"compare_libraries: {name}, document, FP16 partials ...", file=sys.stderr, flush=True)
            results[f"document/{name}/fp16_partials"] = training_call(torch, flamia, name, "document", args.seed,
                                                                      deterministic=False)
    if args.mode == "save":
        torch.save(results, args.path)
        print(f"saved {len(results)} training calls of {library} to {args.path}")
        return 0
    saved = torch.load(args.path)
    differing = 0
    for key, tensors in results.items():
        if key not in saved:
            print(f"{key}: not in {args.path}")
            differing += 1
            continue
        # FP16-partials calls: dq by its cosine (the order of the partials' adds varies), the rest
        # bitwise.
        partials = key.endswith("/fp16_partials")
        unequal = [(n, a, b) for n, a, b in zip(OUTPUTS, tensors, saved[key])
                   if not torch.equal(a, b) and not (partials and n == "dq")]
        line = "bitwise equal" if not unequal else "DIFFERS in " + "; ".join(
            f"{n} ({difference(a.float().numpy(), b.float().numpy())})" for n, a, b in unequal)
        differs = bool(unequal)
        if partials:
            dq, saved_dq = (t[OUTPUTS.index("dq")].float().numpy() for t in (tensors, saved[key]))
            dq_ok = dq.shape == saved_dq.shape
            if dq_ok:
                cosine, _, mismatched = measure(dq, saved_dq)
                dq_ok = cosine >= args.dq_cosine and not mismatched
            line = f"o, lse, dk, dv {line}; dq {difference(dq, saved_dq)}"
            if not dq_ok:
                line += f" (not within --dq-cosine {args.dq_cosine})"
            differs = differs or not dq_ok
        print(f"{key}: {line}")
        differing += differs
    print(f"{library}: {len(results) - differing} of {len(results)} training calls equal "
          "(bitwise; FP16-partials dq by cosine)")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
