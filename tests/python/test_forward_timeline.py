"""bench/forward_timeline.py's summary of the forward's clock timeline (step_timeline.cuh), on a
synthetic buffer whose phases, period, lag and per-warp finish times are known."""
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
SHAPE = (2, 8, 40, len(EVENTS))


def buffer(start=1000, missing=(), partial=()):
    """Steps s of every CTA at start + s * PERIOD (+ LAG for warpgroup 1); warp w's softmax ends
    10 (w % 4) cycles later than warp 0's. `missing` steps are not recorded at all, `partial` ones
    lack one warp's last event."""
    ctas, warps, steps, events = SHAPE
    out = [0] * (ctas * warps * steps * events)
    for c in range(ctas):
        for w in range(warps):
            for s in range(steps):
                if s in missing:
                    continue
                for e in range(events):
                    if s in partial and w == 3 and e == events - 1:
                        continue
                    t = start + s * PERIOD + LAG * (w // 4) + OFFSETS[e] + (10 * (w % 4) if e == 6 else 0)
                    out[((c * warps + w) * steps + s) * events + e] = t % (1 << 32)
    return out


def test_phases_period_lag_and_warp_finish():
    s = T.summarize(buffer(), SHAPE, EVENTS, skip=4)
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


def test_clock_wrap_and_unrecorded_steps():
    # the clock wraps inside the run; step 10 is not recorded and step 20 lacks one stamp: neither
    # counts, and their neighbours give no period across them
    # (+ 7: no stamp lands on 0, which would read as unrecorded)
    s = T.summarize(buffer(start=(1 << 32) - 30 * PERIOD + 7, missing={10}, partial={20}), SHAPE, EVENTS, skip=4)
    assert s["steps"] == 2 * (40 - 4 - 2)
    assert all(wg["period"] == PERIOD for wg in s["warpgroups"])
    assert s["lag"] == LAG and s["warp_finish"][4:] == [700, 710, 720, 730]


def test_shape_must_fit_the_events():
    with pytest.raises(ValueError):
        T.summarize(buffer(), SHAPE, EVENTS[:-1])


def test_markdown_tables():
    s = T.summarize(buffer(), SHAPE, EVENTS, skip=4)
    lines = T.markdown([("synthetic", s)])
    header, rule, wg0, wg1 = lines[:4]
    assert header.count("|") == rule.count("|") == wg0.count("|") == 14  # run, wg, steps, period, 7 phases, rest, lag
    assert wg0.split("|")[4].strip() == str(PERIOD) and wg1.split("|")[-2].strip() == str(LAG)
    assert lines[-1].split("|")[2:-1] == [f" {700 + 10 * (w % 4)} " for w in range(8)]


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
