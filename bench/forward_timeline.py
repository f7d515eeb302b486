#!/usr/bin/env python3
"""Where a step of the forward's tile loop spends its cycles: the clock timeline that a library
built with FLAMIA_FORWARD_TIMELINE records (src/cuda/sm90/step_timeline.cuh). Lane 0 of each
consumer warp of the first CTAs stamps the SM clock at eight events of every loop step; this runs
one inference forward per workload, reads the stamps back and prints, per consumer warpgroup, the
median cycles of each phase (named by the event that ends it), the step period, the length of an
item transition (the step that ends one item and starts the next: its last P.V and O store, the
next one's first S and masked softmax), how far the second warpgroup runs behind the first, and
how long each warp takes from its warpgroup's scores to the end of its softmax (a warpgroup's
next products wait for its slowest warp); and per tile streamer, where in the consumers' steps its
stage comes free (it wakes), how long it takes to hand the tile on, and how long before the
consumers wait for it.

The stamps cost the kernel ~4-5%, so read phases against each other, not as absolute times; time
kernels with bench/kernel_breakdown.py on a normal build.

Usage (repo root, GPU machine): bash scripts/timeline_gpu.sh [--workloads 4x16384,16x4096]
  [--turns auto|0|1] [--json out.json]
(it builds the library into build-timeline/ and runs this with FLAMIA_CAPI_LIB pointing at it).
"""
import argparse
import bisect
import ctypes
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads as W  # noqa: E402

SKIP_STEPS = 20  # the first ring uses of each CTA: its start-up, not the steady state
WRAP = 1 << 32   # %clock is 32 bits wide
WARPS_PER_GROUP = 4  # a consumer warpgroup's warps


def _delta(later, earlier):
    return (later - earlier) % WRAP


def _median(values):
    return statistics.median(values) if values else float("nan")


class Layout:
    """The buffer's layout (step_timeline.cuh): [ctas][rows][steps][len(events)], rows 0 ..
    consumer_warps - 1 the consumer warps' (their events), the rest the tile streamers' (the first
    len(streamer_events) slots of each step)."""

    def __init__(self, ctas, rows, steps, events, consumer_warps, streamer_events):
        if consumer_warps % WARPS_PER_GROUP or consumer_warps > rows or len(streamer_events) > len(events):
            raise ValueError(f"{rows} rows of {len(events)} events do not fit {consumer_warps} consumer warps "
                             f"(whole warpgroups) and {len(streamer_events)} streamer events")
        self.ctas, self.rows, self.steps, self.consumer_warps = ctas, rows, steps, consumer_warps
        self.events, self.streamer_events = list(events), list(streamer_events)

    def size(self):
        return self.ctas * self.rows * self.steps * len(self.events)


def summarize(stamps, layout, skip=SKIP_STEPS):
    """stamps: the flat buffer (0: not recorded), layout its Layout. Returns a dict: per warpgroup
    the step period, the phases (name, median cycles) and the rest of the period; the second
    warpgroup's lag behind the first (its warp 0's "issued" after the first's, modulo the first's
    period); per warp the cycles from its warpgroup's first "scores ready" to its "softmax done";
    per streamer the median cycle of WG0's step and of WG1's step at which its stage comes free,
    the cycles until it hands the tile on, and the cycles from then until the consumers' warp 0
    sees the tile landed; per warpgroup the median cycles of an item transition (a step with its
    start stamp alone: from it to the next step's start) and how many there were. Consumer steps
    count where every event of the step was recorded in every consumer warp of the CTA (an item
    transition never is)."""
    ctas, rows, steps, warps = layout.ctas, layout.rows, layout.steps, layout.consumer_warps
    events, n_events = layout.events, len(layout.events)
    at = lambda c, w, s, e: stamps[((c * rows + w) * steps + s) * n_events + e]  # noqa: E731
    complete = lambda c, s: all(at(c, w, s, e) for w in range(warps) for e in range(n_events))  # noqa: E731
    scores, softmax_done = events.index("scores ready"), events.index("softmax done")
    issued, landed = events.index("issued"), events.index("tile landed")
    if rows > warps:
        stage_free = layout.streamer_events.index("stage free")
        handed_on = layout.streamer_events.index("tile handed on")
    groups = warps // WARPS_PER_GROUP
    period = [[] for _ in range(groups)]
    phases = [[[] for _ in range(n_events - 1)] for _ in range(groups)]
    rest = [[] for _ in range(groups)]
    transition = [[] for _ in range(groups)]
    finish = [[] for _ in range(warps)]
    lag = []
    streamers = rows - warps
    wake = [[[] for _ in range(groups)] for _ in range(streamers)]
    hand_on = [[] for _ in range(streamers)]
    slack = [[] for _ in range(streamers)]
    recorded = 0
    for c in range(ctas):
        ok = [complete(c, s) for s in range(steps)]
        for s in range(skip, steps - 1):
            for g in range(groups):
                w0 = WARPS_PER_GROUP * g
                alone = at(c, w0, s, 0) and not any(at(c, w0, s, e) for e in range(1, n_events))
                if alone and at(c, w0, s + 1, 0):
                    transition[g].append(_delta(at(c, w0, s + 1, 0), at(c, w0, s, 0)))
        for s in range(skip, steps):
            if not ok[s]:
                continue
            recorded += 1
            for g in range(groups):
                ws = range(WARPS_PER_GROUP * g, WARPS_PER_GROUP * (g + 1))
                for w in ws:
                    for e in range(n_events - 1):
                        phases[g][e].append(_delta(at(c, w, s, e + 1), at(c, w, s, e)))
                first_scores = min(at(c, w, s, scores) for w in ws)
                for w in ws:
                    finish[w].append(_delta(at(c, w, s, softmax_done), first_scores))
                if s + 1 < steps and ok[s + 1]:
                    w0 = WARPS_PER_GROUP * g
                    period[g].append(_delta(at(c, w0, s + 1, 0), at(c, w0, s, 0)))
                    rest[g].append(_delta(at(c, w0, s + 1, 0), at(c, w0, s, n_events - 1)))
            if groups > 1:
                lag.append(_delta(at(c, 4, s, issued), at(c, 0, s, issued)))
        # The streamers against the consumers' steps: times as signed offsets from a reference
        # (the clock wraps, a run lasts far less than 2^31 cycles).
        good = [s for s in range(skip, steps) if ok[s]]
        if not good or not streamers:
            continue
        ref = at(c, 0, good[0], 0)
        signed = lambda t: (t - ref + WRAP // 2) % WRAP - WRAP // 2  # noqa: E731
        starts = [sorted(signed(at(c, WARPS_PER_GROUP * g, s, 0)) for s in good) for g in range(groups)]
        typical = [_median(period[g]) for g in range(groups)]  # a longer gap holds unrecorded steps
        for k in range(streamers):
            r = warps + k
            for s in range(skip, steps):
                free, handed = at(c, r, s, stage_free), at(c, r, s, handed_on)
                if not (free and handed):
                    continue
                hand_on[k].append(_delta(handed, free))
                if ok[s]:
                    slack[k].append(_delta(at(c, 0, s, landed), handed))
                t = signed(free)
                for g in range(groups):
                    i = bisect.bisect_right(starts[g], t) - 1
                    if i >= 0 and i + 1 < len(starts[g]):
                        step_length = starts[g][i + 1] - starts[g][i]
                        if t - starts[g][i] < step_length and not step_length >= 2 * typical[g]:
                            wake[k][g].append(t - starts[g][i])
    out = {"steps": recorded, "warpgroups": []}
    for g in range(groups):
        p = _median(period[g])
        out["warpgroups"].append({
            "period": p,
            "phases": [(events[e + 1], _median(phases[g][e])) for e in range(n_events - 1)],
            "rest": _median(rest[g]),
            "transition": _median(transition[g]),
            "transitions": len(transition[g]),
        })
    p0 = out["warpgroups"][0]["period"]
    out["lag"] = _median([x % p0 for x in lag]) if lag and p0 == p0 and p0 > 0 else float("nan")
    out["warp_finish"] = [_median(f) for f in finish]
    out["streamers"] = [{"stage free into step": [_median(wake[k][g]) for g in range(groups)],
                         "hand on": _median(hand_on[k]), "ahead of the consumers": _median(slack[k])}
                        for k in range(streamers)]
    return out


def markdown(rows):
    """rows: (label, summary) pairs -> the phase table and the per-warp table, markdown lines."""
    if not rows:
        return []
    phase_names = [name for name, _ in rows[0][1]["warpgroups"][0]["phases"]]
    lines = ["| run | warpgroup | steps | period | item transition | " +
             " | ".join(f"until {n}" for n in phase_names) + " | rest | lag |",
             "|---" * (7 + len(phase_names)) + "|"]
    for label, s in rows:
        for g, wg in enumerate(s["warpgroups"]):
            cells = " | ".join(f"{v:.0f}" for _, v in wg["phases"])
            lag = f"{s['lag']:.0f}" if g == 1 else "-"
            lines.append(f"| {label} | {g} | {s['steps']} | {wg['period']:.0f} | {wg['transition']:.0f} | {cells} | "
                         f"{wg['rest']:.0f} | {lag} |")
    warps = len(rows[0][1]["warp_finish"])
    lines += ["", "Cycles from the warpgroup's scores to each warp's softmax done (warp w of warpgroup g runs "
              "on SM sub-partition w, beside producer warp w if w < 3):", "",
              "| run | " + " | ".join(f"wg{w // WARPS_PER_GROUP} w{w % WARPS_PER_GROUP}" for w in range(warps)) + " |",
              "|---" * (1 + warps) + "|"]
    for label, s in rows:
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in s["warp_finish"]) + " |")
    if rows[0][1]["streamers"]:
        lines += ["", "Tile streamers (streamer 0 on sub-partition 0, streamer 1 on 2): the cycle of each warpgroup's "
                  "step at which a stage comes free (the streamer wakes), the cycles to hand the tile on, and how "
                  "far ahead of the consumers' wait it lands:", "",
                  "| run | streamer | stage free, cycle of WG0's step | of WG1's step | hand on | ahead |",
                  "|---|---|---|---|---|---|"]
        for label, s in rows:
            for k, st in enumerate(s["streamers"]):
                into = st["stage free into step"] + [float("nan")] * (2 - len(st["stage free into step"]))
                lines.append(f"| {label} | {k} | {into[0]:.0f} | {into[1]:.0f} | {st['hand on']:.0f} | "
                             f"{st['ahead of the consumers']:.0f} |")
    return lines


def _library():
    from flamia import _capi  # importable: main() has imported flamia
    lib = _capi.library()  # the one the package's calls go to
    if not hasattr(lib, "flamia_debug_forward_timeline_shape"):
        sys.exit(f"forward_timeline: {_capi.library_path()} was built without the timeline "
                 "(cmake -DFLAMIA_FORWARD_TIMELINE=ON; scripts/timeline_gpu.sh does it)")
    shape = (ctypes.c_int * 6)()
    lib.flamia_debug_forward_timeline_shape(shape)
    lib.flamia_debug_forward_timeline_event.restype = ctypes.c_char_p
    lib.flamia_debug_forward_timeline_event.argtypes = [ctypes.c_int, ctypes.c_int]
    name = lambda e, streamer: lib.flamia_debug_forward_timeline_event(e, streamer).decode()  # noqa: E731
    layout = Layout(shape[0], shape[1], shape[2], [name(e, 0) for e in range(shape[3])], shape[4],
                    [name(e, 1) for e in range(shape[5])])
    return lib, layout


def record(torch, flamia, lib, layout, name, warmup=3):
    """One inference forward of workload `name` recorded: the flat stamp buffer."""
    q, k, v, _, cu = W.training_inputs(torch, name, requires_grad=False)
    lens = W.WORKLOADS[name]["lens"]
    for _ in range(warmup):
        flamia.attention(q, k, v, cu, max(lens))
    torch.cuda.synchronize()
    if lib.flamia_debug_forward_timeline_clear() != 0:
        raise RuntimeError("flamia_debug_forward_timeline_clear failed")
    flamia.attention(q, k, v, cu, max(lens))
    torch.cuda.synchronize()
    buf = (ctypes.c_uint32 * layout.size())()
    if lib.flamia_debug_forward_timeline_read(buf, ctypes.c_size_t(ctypes.sizeof(buf))) != 0:
        raise RuntimeError("flamia_debug_forward_timeline_read failed")
    return list(buf)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="4x16384,16x4096", help="comma-separated names (default: %(default)s)")
    p.add_argument("--turns", choices=("auto", "0", "1"), default="auto",
                   help="consumer turns: the launcher's choice (auto) or forced off/on (FLAMIA_TIMELINE_TURNS)")
    p.add_argument("--json", help="also write the summaries here")
    args = p.parse_args(argv)
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in W.WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; known: {', '.join(W.WORKLOADS)}")
    if args.turns != "auto":
        os.environ["FLAMIA_TIMELINE_TURNS"] = args.turns
    import torch
    import flamia
    lib, layout = _library()
    rows = []
    for name in names:
        print(f"forward_timeline: {name} ...", file=sys.stderr)
        label = name if args.turns == "auto" else f"{name}, turns {args.turns}"
        rows.append((label, summarize(record(torch, flamia, lib, layout, name), layout)))
    print("\n".join(markdown(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"run": label, **s} for label, s in rows], f, indent=1)


if __name__ == "__main__":
    main()
