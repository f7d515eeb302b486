"""bench/gpu_monitor.py: what a meter makes of the GPU's readings (a fake NVML reader here; the
real one needs a driver), and how the bench reports them."""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import bench_attention  # noqa: E402
import gpu_monitor  # noqa: E402


class FakeReader:
    """An NVML stand-in: the clock and reasons it is told, an energy counter that advances by
    `step_mj` at every read."""

    def __init__(self, mhz=1980, reasons=0, step_mj=0):
        self.mhz, self.reasons, self.step_mj, self.counter = mhz, reasons, step_mj, 1_000_000
        self.reads = 0

    def sm_clock_mhz(self):
        self.reads += 1
        return self.mhz

    def event_reasons(self):
        return self.reasons

    def energy_mj(self):
        self.counter += self.step_mj
        return self.counter


def test_a_meter_keeps_each_rounds_clock_read():
    reader = FakeReader(mhz=1980)
    m = gpu_monitor.GpuMonitor(reader).meter()
    m.read_clock()
    reader.mhz, reader.reasons = 1755, gpu_monitor.SW_POWER_CAP
    m.read_clock()
    m.read_clock()
    s = m.summary()
    assert s["sm_mhz"] == 1755 and s["sm_mhz_min"] == 1755 and s["sm_mhz_max"] == 1980
    assert s["power_capped"] == pytest.approx(2 / 3) and s["thermal"] == 0.0 and s["clock_reads"] == 3
    assert "joules_per_call" not in s  # no energy window


def test_energy_is_the_counters_advance_over_the_calls_of_its_window():
    reader = FakeReader(step_mj=3000)  # 3 J between the window's two reads
    m = gpu_monitor.GpuMonitor(reader).meter()
    m.read_clock()
    with m.energy_window() as w:
        w.calls += 4
        w.calls += 4
    s = m.summary()
    assert s["joules_per_call"] == pytest.approx(3.0 / 8) and s["power_w"] > 0 and s["energy_seconds"] > 0


def test_without_nvml_the_bench_runs_with_readings_off():
    logged = []
    mon = gpu_monitor.open_monitor(None, logged.append, library="libno-such-nvml.so.1")
    assert not mon.available and "no NVML readings" in logged[0]
    m = mon.meter()
    m.read_clock()
    with m.energy_window() as w:
        w.calls += 4
    assert m.summary() is None

    class Broken(FakeReader):  # a failing read loses the reading, not the round
        def sm_clock_mhz(self):
            raise RuntimeError("gone")

        def energy_mj(self):
            raise RuntimeError("gone")

    m = gpu_monitor.GpuMonitor(Broken()).meter()
    ran = []
    m.read_clock()
    with m.energy_window():
        ran.append(2)
    assert ran == [2] and m.summary() is None and m.errors == 2


def test_a_round_reads_the_clock_while_its_calls_run_and_energy_runs_calls_back_to_back():
    reader = FakeReader(step_mj=500)
    meter = gpu_monitor.GpuMonitor(reader).meter()
    events = []

    def once(during=None):
        events.append("dispatch")
        if during is not None:
            during()
            events.append(f"read {reader.reads}")
        events.append("sync")
        return 2.0, "out"

    p = bench_attention.Prepared("flamia", once, lambda o: o, {"status": "ok"}, meter, calls=4)
    p.step()
    p.step()
    assert p.times == [2.0, 2.0] and events == ["dispatch", "read 1", "sync", "dispatch", "read 2", "sync"]
    p.measure_energy(0.0)  # off
    assert meter.energy_calls == 0 and len(events) == 6
    p.measure_energy(0.01)
    assert meter.energy_calls == 4 * (len(events) - 6) // 2 > 0 and meter.energy_mj == 500
    assert reader.reads == 2  # the energy rounds are not clock reads


def test_torch_rounds_read_after_dispatching_before_waiting():
    log = []

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, other):
            return 8.0

    class FakeTorch:
        class cuda:
            pass

    FakeTorch.cuda.Event = Event
    once = bench_attention.torch_once(FakeTorch, lambda: log.append("call"), 2)
    assert once(lambda: log.append("read"))[0] == 4.0
    assert log == ["record", "call", "call", "record", "read", "sync"]


def ok(ms, tflops, joules=None, mhz=1800):
    r = {"status": "ok", "ms": ms, "tflops": tflops, "gpu": {"sm_mhz": mhz, "power_capped": 0.25}}
    if joules is not None:
        r["gpu"]["joules_per_call"] = joules
    return r


META = {"pass": "train", "gpu": "H200", "torch": "t", "jax": "j", "cudnn_torch": 1, "date": "d", "rounds": 5,
        "warmup": 2, "schedule": "sequential"}


def gpu_line(table):
    return next(l for l in table.splitlines() if l.startswith("| 16x4096") and "MHz" in l)


def test_the_report_gives_the_clock_and_with_energy_the_energy_ratio():
    r = {"workload": "16x4096", "docs": 16,
         "impls": {"flamia": ok(2.0, 600.0, joules=1.5, mhz=1755), "cudnn-sdpa": ok(2.4, 500.0, joules=2.4, mhz=1830)}}
    bench_attention.summarize(r)
    assert r["energy_ratio_vs_best_bf16"] == pytest.approx(1.6)
    table = bench_attention.markdown({**META, "energy_seconds": 2.0}, [r], ["flamia", "cudnn-sdpa"])
    line = gpu_line(table)
    assert "| 1755 MHz, 25% capped, 1.50 J | 1830 MHz, 25% capped, 2.40 J | 1.60 (cudnn-sdpa) |" in line
    # Clock only (no --energy-seconds): no energy column.
    r = {"workload": "16x4096", "docs": 16, "impls": {"flamia": ok(2.0, 600.0), "cudnn-sdpa": ok(2.4, 500.0)}}
    bench_attention.summarize(r)
    assert r["energy_ratio_vs_best_bf16"] is None
    table = bench_attention.markdown(META, [r], ["flamia", "cudnn-sdpa"])
    assert gpu_line(table).endswith("| 1800 MHz, 25% capped | 1800 MHz, 25% capped |") and "energy" not in table
    # Without readings there is no such table.
    bare = {"workload": "16x4096", "docs": 16, "impls": {"flamia": {"status": "ok", "ms": 2.0, "tflops": 600.0}}}
    bench_attention.summarize(bare)
    assert "GPU clock" not in bench_attention.markdown(META, [bare], ["flamia"])


def test_readings_are_on_by_default_energy_off_and_bad_values_refused():
    args = bench_attention.parse_args([])
    assert not args.no_gpu_readings and args.energy_seconds == 0.0
    args = bench_attention.parse_args(["--no-gpu-readings", "--energy-seconds", "2"])
    assert args.no_gpu_readings and args.energy_seconds == 2.0 and not args.gpu_monitor.available
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--energy-seconds", "-1"])
