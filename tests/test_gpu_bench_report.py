"""bench/gpu_bench.py's figures that BENCHMARKS.md quotes: each row's ratios are to the faster
PyTorch runner (the strongest alternative), and energy per step is summed over all of a runner's
rounds and withheld where they are too short for NVML's energy counter. Pure functions: no GPU."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
_spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "bench" / "gpu_bench.py")
gb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gb)
from gpu_power import Reading  # noqa: E402 (bench/, put on the path above)


def test_ratios_are_to_the_faster_pytorch_runner():
    row = {"model": "ANDREA-120M", "B": 8, "torch": {"tok_s": 450_000.0}, "torch_graphs": {"tok_s": 570_000.0},
           "ours_bf16": {"tok_s": 615_000.0}}
    best = gb.best_torch(row)
    assert best["runner"] == "torch_graphs" and best["tok_s"] == 570_000.0
    assert "runner" not in row["torch_graphs"]  # the row itself (written as JSON) is left as it was
    assert gb.best_torch({"model": "ANDREA-12M", "B": 8, "ours_bf16": {"tok_s": 1.0}}) is None  # --no-torch


def test_energy_is_summed_over_the_rounds_and_withheld_when_they_are_short():
    steps, tokens = 20, 32 * 1024
    # three rounds at different power: the figure is the total energy over the total steps, not a round's
    rounds = [Reading(joules=700.0, seconds=1.0, sm_mhz=1700.0, capped=1.0),
              Reading(joules=600.0, seconds=1.0, sm_mhz=1800.0, capped=0.5),
              Reading(joules=650.0, seconds=1.0, sm_mhz=1750.0, capped=0.0)]
    e = gb.energy_of(rounds, steps, tokens)
    assert e["j_per_step"] == pytest.approx(1950.0 / 60)
    assert e["tok_per_j"] == pytest.approx(tokens * 60 / 1950.0)
    assert e["watts"] == pytest.approx(650.0)
    assert e["sm_mhz"] == pytest.approx(1750.0) and e["capped"] == pytest.approx(0.5)
    short = [Reading(joules=80.0, seconds=0.1)] * 5  # 0.5 s in all: below ENERGY_MIN_SECONDS
    assert gb.energy_of(short, steps, tokens) == {}


class FakeNvml:
    """NVML's calls that gpu_power makes, answering from attributes (ctypes out-arguments filled
    through byref's _obj, as the C library fills them)."""

    def __init__(self, energy_mj=1_000_000, clock=1700, reasons=0x4, old_driver=False):
        self.energy_mj, self.clock, self.mask, self.clock_fails = energy_mj, clock, reasons, False
        if old_driver:  # drivers before 535 name the reasons call after throttling
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons
        else:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

    @staticmethod
    def _out(ref, value) -> int:
        ref._obj.value = value
        return 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, ref):
        return self._out(ref, self.energy_mj)

    def nvmlDeviceGetClockInfo(self, handle, kind, ref):
        return 999 if self.clock_fails else self._out(ref, self.clock)  # 999: NVML_ERROR_UNKNOWN

    def _reasons(self, handle, ref):
        return self._out(ref, self.mask)


@pytest.mark.parametrize("old_driver", [False, True])
def test_power_meter_reads_energy_clock_and_the_cap_over_a_stretch(old_driver):
    import time

    from gpu_power import PowerMeter

    lib = FakeNvml(old_driver=old_driver)
    meter = PowerMeter(lib, handle=None)
    with meter.measure(period=0.002) as r:
        time.sleep(0.05)
        lib.energy_mj += 35_000  # 35 J used meanwhile
    assert r.joules == pytest.approx(35.0) and r.seconds >= 0.05
    assert r.watts == pytest.approx(35.0 / r.seconds)
    assert r.sm_mhz == pytest.approx(1700.0) and r.capped == pytest.approx(1.0)  # 0x4: the software power cap

    lib.mask, lib.clock = 0x1, 1980  # idle only: not held down
    with meter.measure(period=0.002) as r:
        time.sleep(0.02)
    assert r.capped == 0.0 and r.sm_mhz == pytest.approx(1980.0)


def test_power_meter_survives_failed_reads():
    """A read that fails while sampling (NVML returning an error) leaves a gap, not a dead thread or
    a failed measurement; a failed read outside the sampler raises with NVML's status."""
    import time

    from gpu_power import PowerMeter

    lib = FakeNvml()
    meter = PowerMeter(lib, handle=None)
    lib.clock_fails = True
    with meter.measure(period=0.002) as r:
        time.sleep(0.02)
        lib.energy_mj += 7_000
    assert r.joules == pytest.approx(7.0) and r.sm_mhz == 0.0 and r.capped == 0.0
    with pytest.raises(RuntimeError, match="nvmlDeviceGetClockInfo returned 999"):
        meter.sm_mhz()
