"""The GPU's energy, power and clocks while a bench runs, read from NVML (libnvidia-ml, which ships
with the driver) through ctypes.

Why: on the H200 the model's training steps at ANDREA-120M B=32 run the GPU at its 700 W power cap,
and the SM clock falls from 1980 to 1650-1850 MHz (records/2026-12-01/power/). A step then
takes about its energy divided by the cap. The time of a kernel measured alone, with the clock at its
maximum, no longer says how long it takes in training. Joules per step does.

    meter = PowerMeter.open()         # None where NVML is missing
    with meter.measure() as m:
        run()                         # m.joules, m.seconds, m.watts, m.sm_mhz, m.capped
"""

from __future__ import annotations

import ctypes
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

_NVML_CLOCK_SM = 1
_SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
_HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # HW slowdown, thermal and power-brake slowdown


@dataclass
class Reading:
    """One measured stretch: energy (J), wall seconds, and from samples every `period` s the mean SM
    clock (MHz) and `capped`, the share of samples with the power cap or a hardware slowdown
    (thermal, power brake) holding the clock down."""

    joules: float = 0.0
    seconds: float = 0.0
    sm_mhz: float = 0.0
    capped: float = 0.0

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds else 0.0


class PowerMeter:
    """NVML's counters of the GPU that CuPy's current device is (found by its PCI bus ID, so
    CUDA_VISIBLE_DEVICES does not confuse the two numberings)."""

    def __init__(self, lib, handle):
        self.lib, self.handle = lib, handle

    @classmethod
    def open(cls) -> PowerMeter | None:
        """A meter, or None where NVML, or its energy, clock or clock-reason counter, is not available
        (a reason is not needed: the bench then prints no energy columns)."""
        try:
            import cupy as cp

            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
            handle = ctypes.c_void_p()
            bus = cp.cuda.Device().pci_bus_id.encode()
            if lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(handle)) != 0:
                return None
            meter = cls(lib, handle)
            meter.energy_mj(), meter.sm_mhz(), meter.reasons()  # all three answer, or no meter
            return meter
        except (ImportError, OSError, AttributeError, RuntimeError):
            return None

    def _get(self, fn: str, ctype, *args):
        out = ctype()
        status = getattr(self.lib, fn)(self.handle, *args, ctypes.byref(out))
        if status != 0:
            raise RuntimeError(f"NVML {fn} returned {status}")
        return out.value

    def energy_mj(self) -> int:
        """Energy used since the driver loaded, in mJ."""
        return self._get("nvmlDeviceGetTotalEnergyConsumption", ctypes.c_ulonglong)

    def sm_mhz(self) -> int:
        return self._get("nvmlDeviceGetClockInfo", ctypes.c_uint, ctypes.c_int(_NVML_CLOCK_SM))

    def reasons(self) -> int:
        """The active clock-event (throttle) reasons, a bit mask."""
        try:
            return self._get("nvmlDeviceGetCurrentClocksEventReasons", ctypes.c_ulonglong)
        except AttributeError:  # drivers before 535 name it after throttling
            return self._get("nvmlDeviceGetCurrentClocksThrottleReasons", ctypes.c_ulonglong)

    def _clock_or_zero(self) -> float:
        try:
            return float(self.sm_mhz())
        except RuntimeError:
            return 0.0

    @contextmanager
    def measure(self, period: float = 0.01):
        """Energy and wall time of the `with` body (the caller synchronises the GPU before leaving
        it), sampling the clock and the cap in a thread meanwhile."""
        reading, stop, clocks, caps = Reading(), threading.Event(), [], []

        def sample():
            while not stop.wait(period):
                try:
                    clock, reasons = self.sm_mhz(), self.reasons()
                except RuntimeError:  # a failed read (the GPU lost, a driver reset) leaves a gap
                    continue
                clocks.append(clock)
                caps.append(bool(reasons & (_SW_POWER_CAP | _HW_SLOWDOWN)))

        thread = threading.Thread(target=sample, daemon=True)
        e0, t0 = self.energy_mj(), time.perf_counter()
        thread.start()
        try:
            yield reading
        finally:
            stop.set()
            thread.join()
            reading.seconds = time.perf_counter() - t0
            reading.joules = (self.energy_mj() - e0) / 1e3
            reading.sm_mhz = sum(clocks) / len(clocks) if clocks else self._clock_or_zero()
            reading.capped = sum(caps) / len(caps) if caps else 0.0
