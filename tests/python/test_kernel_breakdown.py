"""bench/kernel_breakdown.py's timeline arithmetic (--timeline), on synthetic profiler records: no
GPU or torch needed."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import kernel_breakdown as K  # noqa: E402


def calls(starts_and_ends, names, count, period=1000.0, jitter=0.0):
    """`count` identical calls `period` apart; the c-th call's last activity starts c * jitter late."""
    events = []
    for c in range(count):
        for i, ((s, e), n) in enumerate(zip(starts_and_ends, names)):
            late = c * jitter if i == len(names) - 1 else 0.0
            events.append((c * period + s + late, c * period + e, n))
    return events


NAMES = ["void flamia::cuda::(anonymous namespace)::quantize_mxfp8_kernel<true, 2, false>(int)",
         "Memset (Unknown)",
         "void flamia::cuda::sm90::(anonymous namespace)::forward_kernel<128, true, false>(flamia::X)"]


def test_each_activity_gets_its_median_start_duration_and_gap():
    events = calls([(0, 100), (101, 102), (104, 900)], NAMES, 3, jitter=2.0)  # gaps 2, 4, 6 before the forward
    rows = K.timeline_rows(events, 3)
    assert [r[0] for r in rows] == NAMES
    assert rows[0][1:] == (0, 100, 0)
    assert rows[1][1:] == (101, 1, 1)
    assert rows[2][1] == 106 and rows[2][3] == 4  # the medians of 104/106/108 and 2/4/6
    assert rows[2][2] == 794


def test_calls_that_differ_or_do_not_divide_evenly_are_refused():
    events = calls([(0, 100), (101, 102), (104, 900)], NAMES, 2)
    with pytest.raises(ValueError, match="not 4 calls"):
        K.timeline_rows(events, 4)
    other = [(s + 1000, e + 1000, n) for s, e, n in calls([(0, 100), (101, 102), (104, 900)],
                                                          [NAMES[1], NAMES[0], NAMES[2]], 1)]
    with pytest.raises(ValueError, match="differs between calls"):
        K.timeline_rows(events[:3] + other, 2)
    with pytest.raises(ValueError):
        K.timeline_rows([], 1)


def test_the_table_names_kernels_by_family_and_instance():
    assert K.short_name(NAMES[0]) == "quantize_mxfp8_kernel<true, 2, false>"
    assert K.short_name(NAMES[1]) == "Memset"
    assert K.short_name("flamia::cuda::prefix_max_scales_kernel(unsigned char const*, int)") == "prefix_max_scales_kernel"
    table = K.timeline_table("16x4096", K.timeline_rows(calls([(0, 100), (101, 102), (104, 900)], NAMES, 1), 1), 901.0)
    assert "16x4096: 901.0 us per replayed call" in table
    assert "| quantize: quantize_mxfp8_kernel<true, 2, false> | 0.0 | 100.0 | 0.0 |" in table
    assert "| forward: forward_kernel<128, true, false> | 104.0 | 796.0 | 2.0 |" in table
    assert table.splitlines()[-1] == "| all (busy 897.0) | | 900.0 | 3.0 |"
    jitter = K.timeline_table("w", [("forward_kernel<1>(x)", 5.0, 1.0, -0.02)], 6.0)
    assert "| forward: forward_kernel<1> | 5.0 | 1.0 | 0.0 |" in jitter  # not "-0.0"


def test_profiled_runs_the_call_rounds_times_and_times_it_per_call():
    import contextlib
    import types

    class Event:
        def __init__(self, **kwargs):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 8.0  # ms between the two events

    calls = []
    torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None),
        profiler=types.SimpleNamespace(ProfilerActivity=types.SimpleNamespace(CUDA=1),
                                       profile=lambda activities: contextlib.nullcontext("profiler")))
    prof, ms_per_call = K.profiled(torch, lambda: calls.append(1), 4)
    assert prof == "profiler" and len(calls) == 4 and ms_per_call == 2.0
