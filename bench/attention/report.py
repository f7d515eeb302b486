"""The benchmark's report: each row's ratios (summarize), the markdown table (markdown) and the
--json / --markdown files (write_outputs). Only the standard library: it runs without torch."""

import json
import pathlib

from attention.impls import BF16_BASELINES, COSINE_MIN, FA3_BASELINE, FP8_BASELINE, IMPLS, TORCH_SETUPS, log
import workloads as W


# Statuses shown in the table's cell itself (no time): outputs that failed the cosine check, and
# implementations whose process died.
REFUSED = ("wrong outputs", "crashed")


def summarize(row):
    impls = row["impls"]

    def tflops(name):
        r = impls.get(name, {})
        return r.get("tflops") if r.get("status") == "ok" else None

    flamia_tf = tflops("flamia")
    best_name, best_tf = None, None
    for name in BF16_BASELINES:
        tf = tflops(name)
        if impls.get(name, {}).get("warning"):
            continue  # (JSON from before outputs were refused) its output is not this attention
        if tf is not None and (best_tf is None or tf > best_tf):
            best_name, best_tf = name, tf
    row["best_bf16"] = best_name
    row["ratio_vs_best_bf16"] = flamia_tf / best_tf if flamia_tf and best_tf else None
    fa3_tf = tflops(FA3_BASELINE)
    row["ratio_vs_fa3"] = flamia_tf / fa3_tf if flamia_tf and fa3_tf else None
    fp8_tf = tflops(FP8_BASELINE) if not impls.get(FP8_BASELINE, {}).get("warning") else None
    row["ratio_vs_cudnn_fp8"] = flamia_tf / fp8_tf if flamia_tf and fp8_tf else None
    prefix_tf = tflops("flamia-prefix")
    row["prefix_time_ratio"] = flamia_tf / prefix_tf if flamia_tf and prefix_tf else None  # prefix ms / default ms
    det_tf = tflops("flamia-deterministic")  # deterministic ms / default ms
    row["deterministic_time_ratio"] = flamia_tf / det_tf if flamia_tf and det_tf else None

    def joules(name):
        r = impls.get(name, {})
        return r.get("gpu", {}).get("joules_per_call") if r.get("status") == "ok" else None

    flamia_j, best_j = joules("flamia"), joules(best_name) if best_name else None
    # The best BF16 baseline's energy per call over flamia's (> 1: flamia takes less).
    row["energy_ratio_vs_best_bf16"] = best_j / flamia_j if flamia_j and best_j else None


def markdown(meta, rows, impls):
    train = meta["pass"] == "train"
    flops = ("3.5 * 4 * D * pairs * Hq: forward + backward, the backward counted as 2.5 forwards" if train
             else "4 * D * pairs * Hq")
    # How a round was timed: a run that records calls_per_round timed every implementation's round as
    # that many calls back to back; an older one recorded jax_calls (JAX alone back to back) or neither.
    calls = meta.get("calls_per_round")
    if calls is not None:
        timing = (f"; each round times {calls} calls dispatched back to back, per call" if calls > 1
                  else "; each round times one call")
        jax_timing = "jitted"
        eager = "host time included" if calls == 1 else "host time counts where it exceeds the GPU's"
        warmup_unit = "calls" if calls == 1 else "rounds"  # a warm-up round is a timed round's calls
    else:
        timing, eager, warmup_unit = "", "host time included", "calls"
        jax_calls = meta.get("jax_calls", 1)
        jax_timing = "jitted, " + (f"timed {jax_calls} back to back, per call" if jax_calls > 1
                                   else "each timed to its own block_until_ready")
    lines = [
        f"# flamia {'training-call (forward + backward)' if train else 'forward'} benchmark",
        "",
        f"{meta['gpu']}; torch {meta['torch']}; jax {meta.get('jax', 'n/a')}; cuDNN (torch) {meta['cudnn_torch']}; "
        f"{meta['date']}",
        "",
        f"T = {W.TOTAL} packed tokens, Hq = {W.Q_HEADS}, D = {W.HEAD_DIM}, causal, BF16 in/out; median of "
        f"{meta['rounds']} rounds after {meta['warmup']} warm-up {warmup_unit}"
        + (", the implementations timed in turns (round r: one turn of each, starting at the r-th)"
           if meta.get("schedule") == "interleaved" else ", each implementation's rounds back to back")
        + timing
        + ". Cells: ms / TFLOP/s "
        f"(visible pairs: {flops}). "
        + ("Every torch implementation is timed replaying its call from a CUDA graph (no host time; JAX's "
           f"calls are {jax_timing}). " if meta.get("graph") else f"Eager calls ({eager}). ")
        + "Ratios are flamia's TFLOP/s over FlashAttention-3's (`jax-fa3`, the BF16 baseline to beat), over the "
        "best BF16 baseline's and over cuDNN FP8's; 'prefix / default' is the time of isolation=prefix over the "
        f"default's. Every output is checked against flamia's (cosine >= {COSINE_MIN}): a cell 'wrong outputs' "
        "failed that check and its time is not reported; 'crashed' is an implementation whose process died "
        "(each workload runs in a process of its own, so the others still ran).",
        "",
    ]
    header = ["workload", "docs"] + list(impls) + ["flamia / FA3", "flamia / best BF16", "flamia / cuDNN FP8",
                                                   "prefix / default"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * len(header)) + "|")
    notes = []
    for row in rows:
        cells = [row["workload"], str(row["docs"])]
        for impl in impls:
            r = row["impls"].get(impl)
            if r is None:
                cells.append("-")
            elif r["status"] == "ok":
                cell = f"{r['ms']:.3f} / {r['tflops']:.0f}"
                if r.get("graph") is False:  # --graph, but its capture failed
                    cell += " (eager)"
                if "graph" in r and r.get("note"):
                    notes.append(f"{row['workload']} / {impl}: {r['note']}")
                if r.get("warning"):
                    cell += " (!)"
                    notes.append(f"{row['workload']} / {impl}: {r['warning']}")
                cells.append(cell)
            elif r["status"].startswith(REFUSED):  # the status is the cell: no time
                cells.append(r["status"])
                if r.get("note"):
                    notes.append(f"{row['workload']} / {impl}: {r['note']}")
            else:
                cells.append("n/a")
                notes.append(f"{row['workload']} / {impl}: {r['status']}")
        fa3 = row.get("ratio_vs_fa3")
        cells.append(f"{fa3:.2f}" if fa3 else "-")
        best = row.get("ratio_vs_best_bf16")
        cells.append(f"{best:.2f} ({row['best_bf16']})" if best else "-")
        fp8 = row.get("ratio_vs_cudnn_fp8")
        cells.append(f"{fp8:.2f}" if fp8 else "-")
        prefix = row.get("prefix_time_ratio")
        cells.append(f"{prefix:.2f}" if prefix else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    memory_impls = [i for i in impls if i in TORCH_SETUPS]
    if memory_impls:
        lines.append("Peak GPU memory of one eager call (MiB above what was allocated before it; torch allocator, "
                     "so JAX is not measured):")
        lines.append("")
        lines.append("| workload | " + " | ".join(memory_impls) + " |")
        lines.append("|" + "|".join(["---"] * (len(memory_impls) + 1)) + "|")
        for row in rows:
            cells = [row["workload"]]
            for impl in memory_impls:
                r = row["impls"].get(impl, {})
                cells.append(f"{r['peak_mib']:.0f}" if r.get("status") == "ok" and "peak_mib" in r else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.extend(gpu_readings_table(meta, rows, impls))
    lines.append("Implementations: " + "; ".join(f"`{k}` = {IMPLS[k]}" for k in impls) + ".")
    if notes:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"- {n}" for n in notes)
    return "\n".join(lines) + "\n"


def gpu_readings_table(meta, rows, impls):
    """The markdown lines of the GPU's clock and energy over each implementation's timed rounds
    (gpu_monitor.py); none when no implementation has readings."""
    if not any(r.get("gpu") for row in rows for r in row["impls"].values()):
        return []
    energy = bool(meta.get("energy_seconds"))
    lines = [
        "GPU clock during each implementation's timed rounds (NVML, read only, once a round while the GPU "
        "runs its calls): the median SM clock (MHz), and the share of reads with the driver holding the clock "
        "down for power (software cap or power brake)"
        + (f"; then energy per call (J) over {meta['energy_seconds']:g} s or more of its calls back to back "
           "(untimed), from the GPU's energy counter, which advances every ~100 ms; 'energy, best BF16 / "
           "flamia' > 1: flamia takes less energy per call. Those seconds of load change the clock of the "
           "implementations timed after them: time the protocol in a run without --energy-seconds"
           if energy else "") + ".",
        "",
    ]
    header = ["workload"] + list(impls) + (["energy, best BF16 / flamia"] if energy else [])
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * len(header)) + "|")
    for row in rows:
        cells = [row["workload"]]
        for impl in impls:
            g = row["impls"].get(impl, {}).get("gpu")
            cell = f"{g['sm_mhz']:.0f} MHz" if g else "-"
            if g and g.get("power_capped") is not None:  # (tables rebuilt from a log have the clock alone)
                cell += f", {100 * g['power_capped']:.0f}% capped"
            if g and "joules_per_call" in g:
                cell += f", {g['joules_per_call']:.2f} J"
            cells.append(cell)
        if energy:
            ratio = row.get("energy_ratio_vs_best_bf16")
            cells.append(f"{ratio:.2f} ({row['best_bf16']})" if ratio else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def write_outputs(args, meta, rows, complete):
    """Writes --json and --markdown with the rows so far and returns the table. main calls it after
    every workload (complete=False), so a run that dies partway (a training-call run's process has
    crashed in its fifth workload) keeps the workloads it finished, and the files say they are
    partial; then once more at the end."""
    meta = {**meta, "complete": complete}
    impls = [i for i in IMPLS if i in args.impl_names]
    table = markdown(meta, rows, impls)
    if not complete:
        table += (f"\nPartial: {len(rows)} of {len(args.workload_names)} workloads; the run has not finished "
                  "(or did not).\n")
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "results": rows}, indent=2) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.markdown).write_text(table)
    if complete:
        for path in (args.json, args.markdown):
            if path:
                log(f"bench: wrote {path}")
    return table


