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
