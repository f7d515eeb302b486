"""bench/forward_timeline.py's summary of the forward's clock timeline (step_timeline.cuh), on a
synthetic buffer whose phases, period, lag, per-warp finish times and streamer times are known."""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import forward_timeline as T  # noqa: E402

EVENTS = ["step start", "tile landed", "turn taken", "issued", "scores ready", "max updated", "softmax done",
          "packed"]
OFFSETS = [0, 10, 30, 100, 200, 350, 900, 1000]  # each event's cycle within a step (warp 0)
PERIOD, LAG = 2000, 500
STREAMER_EVENTS = ["stage free", "tile handed on"]
LAYOUT = T.Layout(2, 10, 40, EVENTS, 8, STREAMER_EVENTS)
# streamer k: use s's stage comes free FREE_AT + 100 k cycles into warpgroup 0's step s - AHEAD_STEPS
# and is handed on HAND_ON cycles later
FREE_AT, HAND_ON, AHEAD_STEPS = 1200, 50, 3
EARLY = 3000  # an item transition starts this much before its step's time


def buffer(start=1000, missing=(), partial=(), transitions=()):
    """Steps s of every CTA at start + s * PERIOD (+ LAG for warpgroup 1); warp w's softmax ends
    10 (w % 4) cycles later than warp 0's. `missing` steps are not recorded at all, `partial` ones
    lack one warp's last event, `transitions` are item transitions: their start alone, EARLY
    cycles before the step's time (so PERIOD + EARLY long)."""
    L = LAYOUT
    events = len(L.events)
    out = [0] * L.size()
    for c in range(L.ctas):
        for w in range(L.rows):
            for s in range(L.steps):
                if s in missing:
                    continue
                slot = lambda e: ((c * L.rows + w) * L.steps + s) * events + e  # noqa: E731
                if w >= L.consumer_warps:  # a streamer
                    free = start + (s - AHEAD_STEPS) * PERIOD + FREE_AT + 100 * (w - L.consumer_warps)
                    out[slot(0)], out[slot(1)] = free % (1 << 32), (free + HAND_ON) % (1 << 32)
                    continue
                if s in transitions:
                    out[slot(0)] = (start + s * PERIOD + LAG * (w // 4) - EARLY) % (1 << 32)
                    continue
                for e in range(events):
                    if s in partial and w == 3 and e == events - 1:
                        continue
                    t = start + s * PERIOD + LAG * (w // 4) + OFFSETS[e] + (10 * (w % 4) if e == 6 else 0)
                    out[slot(e)] = t % (1 << 32)
    return out


def test_phases_period_lag_and_warp_finish():
    s = T.summarize(buffer(), LAYOUT, skip=4)
    assert s["steps"] == 2 * (40 - 4)
    for wg in s["warpgroups"]:
        assert wg["period"] == PERIOD
        assert wg["rest"] == PERIOD - OFFSETS[-1]
        # medians over the four warps: warp w's softmax phase is 10 w longer and its last one as much shorter
        phases = dict(wg["phases"])
        assert phases["tile landed"] == 10 and phases["issued"] == 70 and phases["scores ready"] == 100
        assert phases["max updated"] == 150
        assert phases["softmax done"] == 550 + 15 and phases["packed"] == 100 - 15
    assert s["lag"] == LAG
    assert s["warp_finish"] == [700 + 10 * (w % 4) for w in range(8)]
    for k, st in enumerate(s["streamers"]):
        assert st["stage free into step"] == [FREE_AT + 100 * k, FREE_AT - LAG + 100 * k]
        assert st["hand on"] == HAND_ON
        assert st["ahead of the consumers"] == AHEAD_STEPS * PERIOD + OFFSETS[1] - FREE_AT - 100 * k - HAND_ON


def test_clock_wrap_and_unrecorded_steps():
    # the clock wraps inside the run; step 10 is not recorded and step 20 lacks one stamp: neither
    # counts, and their neighbours give no period across them
    # (+ 7: no stamp lands on 0, which would read as unrecorded)
    s = T.summarize(buffer(start=(1 << 32) - 30 * PERIOD + 7, missing={10}, partial={20}), LAYOUT, skip=4)
    assert s["steps"] == 2 * (40 - 4 - 2)
    assert all(wg["period"] == PERIOD for wg in s["warpgroups"])
    assert s["lag"] == LAG and s["warp_finish"][4:] == [700, 710, 720, 730]
    assert all(wg["transitions"] == 0 for wg in s["warpgroups"])


def test_item_transitions():
    # steps 12 and 30 are item transitions (start stamps alone): they count as transitions of
    # PERIOD + EARLY cycles, not as steps, and leave the steps' phases and period alone
    s = T.summarize(buffer(transitions={12, 30}), LAYOUT, skip=4)
    assert s["steps"] == 2 * (40 - 4 - 2)
    for wg in s["warpgroups"]:
        assert wg["transitions"] == 2 * 2 and wg["transition"] == PERIOD + EARLY
        assert wg["period"] == PERIOD and wg["rest"] == PERIOD - OFFSETS[-1]
    assert s["lag"] == LAG


def test_layout_must_fit():
    with pytest.raises(ValueError):
        T.Layout(2, 10, 40, EVENTS, 6, STREAMER_EVENTS)  # not whole warpgroups
    with pytest.raises(ValueError):
        T.Layout(2, 10, 40, EVENTS[:1], 8, STREAMER_EVENTS)  # streamer events wider than a step


def test_markdown_tables():
    s = T.summarize(buffer(), LAYOUT, skip=4)
    lines = T.markdown([("synthetic", s)])
    header, rule, wg0, wg1 = lines[:4]
    # run, wg, steps, period, item transition, 7 phases, rest, lag
    assert header.count("|") == rule.count("|") == wg0.count("|") == 15
    assert wg0.split("|")[4].strip() == str(PERIOD) and wg1.split("|")[-2].strip() == str(LAG)
    assert wg0.split("|")[5].strip() == "nan"  # no transitions in this buffer
    with_transitions = T.markdown([("t", T.summarize(buffer(transitions={12}), LAYOUT, skip=4))])
    assert with_transitions[2].split("|")[5].strip() == str(PERIOD + EARLY)
    warp_rows = [line for line in lines if line.startswith("| synthetic |") and line.count("|") == 10]
    assert warp_rows[0].split("|")[2:-1] == [f" {700 + 10 * (w % 4)} " for w in range(8)]
    streamer_rows = [line for line in lines if line.startswith("| synthetic |") and line.count("|") == 7]
    assert [r.split("|")[2:5] for r in streamer_rows] == [[" 0 ", " 1200 ", " 700 "], [" 1 ", " 1300 ", " 800 "]]


def test_the_normal_library_records_no_timeline():
    # The C API library CTest hands the suite ($FLAMIA_CAPI_LIB, built with the CUDA toolkit) is a
    # normal build: the timeline is a diagnostic build option (FLAMIA_FORWARD_TIMELINE), never on by
    # default, so its entry points must be absent.
    import ctypes
    import os
    path = os.environ.get("FLAMIA_CAPI_LIB")
    if not path:
        pytest.skip("no C API library in this build (CUDA toolkit absent)")
    lib = ctypes.CDLL(path)
    assert hasattr(lib, "flamia_forward")
    assert not hasattr(lib, "flamia_debug_forward_timeline_shape")
