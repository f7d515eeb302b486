"""The GPU's SM clock (and, when asked, energy) over a benchmark's timed rounds, read through NVML.

Why: on the H200 the clock an implementation runs at decides several of the benchmark's ratios.
Back to back, a heavy call's power brings the SM clock down partway through its rounds, and
implementations that draw different power end up at different clocks (the forward at 1x65536:
flamia at 1875 MHz, cuDNN FP8 at 1770, cuDNN BF16 SDPA at 1665). So the bench records,
for every implementation and workload, the clock its rounds ran at and how often the driver had
the power cap holding it down.

NVML comes with the driver (libnvidia-ml.so.1); it is loaded with ctypes, so the bench needs no
Python package for it, and where it is missing (a machine with no driver) the bench runs without
these readings and says so. Nothing here changes a setting of the GPU: it only reads.

  monitor = GpuMonitor(Nvml.open(torch))      # or GpuMonitor(None): readings off
  meter = monitor.meter()                     # one per implementation and workload
  meter.read_clock()                          # once a round, its calls dispatched and running
  with meter.energy_window() as w:            # optional: calls back to back for >= 1 s
      ...; w.calls += 4
  meter.summary()  # {"sm_mhz", "power_capped", ["joules_per_call", "power_w"], ...} or None

The clock is read once a round, by the timing thread itself, after the round's calls are
dispatched and before it waits for them: the GPU is running them then, and the read (~5 us) is
off the GPU's critical path, as the calls are already queued. A sampling thread instead made
JAX's host-timed calls 3-6% slower through the GIL; reads after a round instead see the clock
rise again as soon as the GPU idles. Energy comes from the GPU's energy counter, which the H200's
driver advances about every 100 ms (11 steps in a second of matrix products), so a round of a few milliseconds cannot be measured by it; energy_window()
runs calls back to back long enough for the counter's step to be a small error (one step in ten
over a second).
"""
import contextlib
import ctypes
import statistics
import time

# nvmlClocksEventReasons bits (nvml.h) under which the driver holds the SM clock below its boost
# clock for power: the software power cap, and the hardware power brake.
SW_POWER_CAP = 0x4
HW_POWER_BRAKE = 0x80
THERMAL = 0x20 | 0x40  # software and hardware thermal slowdown
NVML_CLOCK_SM = 1


class NvmlError(RuntimeError):
    pass


class Nvml:
    """The few NVML reads the monitor needs, for one device."""

    def __init__(self, lib, handle):
        self._lib, self._handle = lib, handle
        # Newer drivers name it "clocks event reasons"; older ones "throttle reasons" (same bits).
        self._reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            lib.nvmlDeviceGetCurrentClocksThrottleReasons

    @classmethod
    def open(cls, torch=None, library="libnvidia-ml.so.1"):
        """The NVML device of torch's current CUDA device (found by PCI bus id, else by index 0), or
        raises NvmlError/OSError when NVML cannot be loaded or does not know the device."""
        lib = ctypes.CDLL(library)
        lib.nvmlErrorString.restype = ctypes.c_char_p
        check(lib, lib.nvmlInit_v2())
        handle = ctypes.c_void_p()
        bus_id = pci_bus_id(torch) if torch is not None else None
        if bus_id is not None:
            check(lib, lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(handle)))
        else:
            check(lib, lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), ctypes.byref(handle)))
        return cls(lib, handle)

    def sm_clock_mhz(self):
        mhz = ctypes.c_uint()
        check(self._lib, self._lib.nvmlDeviceGetClockInfo(self._handle, NVML_CLOCK_SM, ctypes.byref(mhz)))
        return mhz.value

    def energy_mj(self):
        mj = ctypes.c_ulonglong()
        check(self._lib, self._lib.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(mj)))
        return mj.value

    def event_reasons(self):
        bits = ctypes.c_ulonglong()
        check(self._lib, self._reasons(self._handle, ctypes.byref(bits)))
        return bits.value


def check(lib, status):
    if status != 0:
        raise NvmlError(f"NVML error {status}: {lib.nvmlErrorString(status).decode(errors='replace')}")


def pci_bus_id(torch):
    """NVML's bus id string of torch's current device, or None where torch does not say."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    fields = [getattr(props, f, None) for f in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if any(f is None for f in fields):
        return None
    return "{:08x}:{:02x}:{:02x}.0".format(*fields)


class GpuMonitor:
    """Readings of one GPU for the meters it hands out: `reader` is an Nvml (or any object with its
    three reads), or None for readings off."""

    def __init__(self, reader):
        self.reader = reader

    @property
    def available(self):
        return self.reader is not None

    def meter(self):
        return Meter(self.reader)


class EnergyWindow:
    calls = 0  # the caller counts the calls it ran inside the window


class Meter:
    """One implementation's readings on one workload."""

    def __init__(self, reader):
        self.reader = reader
        self.clocks = []     # (SM MHz, reason bits), one read per timed round
        self.energy_mj = 0   # the counter's advance over the energy windows
        self.seconds = 0.0   # their wall time
        self.energy_calls = 0
        self.errors = 0      # failed reads (a lost reading, never a lost round)

    def read_clock(self):
        """The SM clock and its reasons now (once a round, while the GPU runs its calls)."""
        if self.reader is None:
            return
        try:
            self.clocks.append((self.reader.sm_clock_mhz(), self.reader.event_reasons()))
        except Exception:
            self.errors += 1

    @contextlib.contextmanager
    def energy_window(self):
        """Around calls run back to back (the GPU idle at both ends; the caller adds to .calls): the
        energy counter's advance over them."""
        w = EnergyWindow()
        try:
            e0, t0 = (self.reader.energy_mj(), time.perf_counter()) if self.reader is not None else (None, None)
        except Exception:
            self.errors += 1
            e0 = None
        yield w
        if e0 is None:
            return
        try:
            e1, t1 = self.reader.energy_mj(), time.perf_counter()
        except Exception:
            self.errors += 1
            return
        self.energy_mj += e1 - e0
        self.seconds += t1 - t0
        self.energy_calls += w.calls

    def summary(self):
        """The readings as a dict (None with none): the median SM clock of the reads (MHz) and its
        range, the share of reads with the clock held down for power (software cap or power brake)
        or for heat, their count; with an energy window, the energy per call (J),
        the mean power (W) and the window's seconds."""
        if not self.clocks:
            return None
        mhz = [c for c, _ in self.clocks]
        out = {
            "sm_mhz": statistics.median(mhz),
            "sm_mhz_min": min(mhz),
            "sm_mhz_max": max(mhz),
            "power_capped": sum(1 for _, r in self.clocks if r & (SW_POWER_CAP | HW_POWER_BRAKE)) / len(self.clocks),
            "thermal": sum(1 for _, r in self.clocks if r & THERMAL) / len(self.clocks),
            "clock_reads": len(self.clocks),
        }
        if self.energy_calls and self.seconds > 0:
            out.update(joules_per_call=self.energy_mj / 1e3 / self.energy_calls,
                       power_w=self.energy_mj / 1e3 / self.seconds, energy_seconds=self.seconds)
        return out


def open_monitor(torch, log=print, library="libnvidia-ml.so.1"):
    """A GpuMonitor of torch's current device, or one with readings off (and a logged reason)."""
    try:
        return GpuMonitor(Nvml.open(torch, library))
    except Exception as exc:  # no driver library, an old driver, or a device NVML cannot see
        log(f"bench: no NVML readings (clock, energy): {exc}")
        return GpuMonitor(None)
