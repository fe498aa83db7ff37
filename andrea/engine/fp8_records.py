"""When `precision: auto` trains in fp8: the measurements it goes by, and the rule (issue 44).

fp8 is not free. It pays in speed only where the matrix products dominate the step, and it may cost
quality, so `precision: auto` takes it for a training run only where both were measured:

  1. the GPU has fp8 tensor cores (compute capability 8.9 or higher: Ada, Hopper and later) and the
     run's shape suits fp8 products (B·T and the model's widths multiples of 16);
  2. the record holds speed rows of this GPU kind (the device's name as CuPy reports it, e.g.
     "NVIDIA H200") and this model (its name and its architecture), and at the nearest of them
     fp8 ran at least MIN_SPEEDUP times bf16's tokens/s. The nearest: the rows whose tokens per
     micro-batch (B·T) is closest to the run's by ratio (|log(B·T / run's B·T)|); where two rows
     tie (B=16 between 8 and 32), fp8 must be faster at both;
  3. the record holds a passed quality gate of this model (its architecture too): bench/fp8_gate.py
     trained it in bf16 and fp8 from the same weights on the same batches of the real corpus for at
     least GATE_STEPS steps, and fp8's validation bits/byte ended within GATE_LIMIT of bf16's.

Anything else trains in bf16, and the reason says which condition failed. Only the trainer asks
(andrea/engine/engine.py resolve_backend with its shape); generation, validation and the audit
resolve their precision as before, without the record. A run resumed keeps the precision its
checkpoints were trained in, whatever the record says now (the trainer reads it from the newest
checkpoint's state).

The record, andrea/engine/fp8_records.json (ANDREA_FP8_RECORDS names another), is JSON:

    {"speed": [{"gpu": "NVIDIA H200", "compute_capability": "90", "model": "ANDREA-120M",
                "model_config": {...ModelConfig's fields...}, "batch_size": 32, "seq_len": 1024,
                "bf16_tok_s": 667521, "fp8_tok_s": 769654, "date": "2026-12-03",
                "command": "python3 bench/gpu_bench.py ...", "source" or "commit": where it comes from}, ...],
     "gate": {"ANDREA-120M": {"model_config": {...}, "steps": 6000, "bf16_bpb": ..., "fp8_bpb": ...,
                              "relative_difference": (fp8 - bf16) / bf16, "limit": 0.01, "passed": true,
                              "date": ..., "command": ..., "gpu": ..., ...}, ...}}

Tools write it: `bench/gpu_bench.py --record PATH` replaces the rows of each (gpu, model, B, T) it
measured in bf16 and fp8, `bench/fp8_gate.py --record PATH` its model's gate entry (update_record:
read, change, written atomically). Speeds depend on the code: measure again, with --record, after
changing the kernels. Why MIN_SPEEDUP is 2 %: the rounds of our runners in the benchmark records
(records/*/*/*.json, 273 runner measurements of 3 or more rounds) spread by 1.1 % (max − min over min)
at the median; below 2 % "faster" is within what a re-run moves, and fp8 costs quality.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

RECORD_PATH = Path(__file__).with_name("fp8_records.json")
RECORD_ENV = "ANDREA_FP8_RECORDS"  # another record file (a fresh measurement tried before committing it)
FP8_MIN_COMPUTE_CAPABILITY = 89  # Ada (8.9); Hopper is 9.0
GATE_STEPS = 6000  # the gate: 6,000 steps on the real corpus
GATE_LIMIT = 0.01  # fp8's validation bits/byte within 1 % of bf16's
MIN_SPEEDUP = 1.02  # fp8 tokens/s over bf16's at the nearest measured shape (module docstring: why 2 %)
FP8_MULTIPLE = 16  # cuBLASLt's fp8 products: every dimension a multiple of 16 (andrea/engine/cupy/fp8.py check_shapes)

SPEED_KEYS = ("gpu", "model", "model_config", "batch_size", "seq_len", "bf16_tok_s", "fp8_tok_s")  # what the rule reads
GATE_KEYS = ("model_config", "steps", "relative_difference")


@dataclass(frozen=True)
class TrainShape:
    """What the rule needs of a training run: the model's name and architecture (ModelConfig's
    fields as a dict), and the micro-batch: rows and tokens per row."""

    model: str
    config: dict
    batch_size: int
    seq_len: int

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


def record_path() -> Path:
    return Path(os.environ[RECORD_ENV]) if os.environ.get(RECORD_ENV) else RECORD_PATH


def empty_record() -> dict:
    return {"speed": [], "gate": {}}


def load_record(path: str | os.PathLike | None = None) -> dict:
    """The record at `path` (default: record_path()); a missing file is an empty record (nothing
    measured), a malformed one an error that names the file."""
    path = Path(path) if path is not None else record_path()
    if not path.exists():
        return empty_record()
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the fp8 record is not valid JSON ({e})") from None
    if not isinstance(record, dict) or not isinstance(record.get("speed", []), list) or \
            not isinstance(record.get("gate", {}), dict):
        raise ValueError(f"{path}: the fp8 record must be an object with a list `speed` and an object `gate`")
    record.setdefault("speed", [])
    record.setdefault("gate", {})
    for i, r in enumerate(record["speed"]):
        missing = [k for k in SPEED_KEYS if k not in r]
        if missing:
            raise ValueError(f"{path}: speed row {i} lacks {', '.join(missing)}")
    for model, g in record["gate"].items():
        missing = [k for k in GATE_KEYS if k not in g]
        if missing:
            raise ValueError(f"{path}: the gate entry of {model} lacks {', '.join(missing)}")
    return record


def fp8_capable(compute_capability: str) -> bool:
    """Whether a GPU of this compute capability ("90", "89", "100": CuPy's form) has fp8 tensor cores."""
    return int(compute_capability) >= FP8_MIN_COMPUTE_CAPABILITY


def describe_capability(compute_capability: str) -> str:
    return f"{compute_capability[:-1]}.{compute_capability[-1]}"


def shape_problem(shape: TrainShape) -> str | None:
    """Why fp8 products cannot run at this shape (None: they can)."""
    c = shape.config
    d_mlp = c.get("mlp_ratio", 4) * c["d_model"]
    bad = {name: n for name, n in (("B·T", shape.tokens), ("d_model", c["d_model"]), ("the MLP width", d_mlp))
           if n % FP8_MULTIPLE}
    if bad:
        return ("fp8 needs " + ", ".join(f"{k} ({v})" for k, v in bad.items())
                + (f" to be a multiple of {FP8_MULTIPLE}" if len(bad) == 1 else f" to be multiples of {FP8_MULTIPLE}"))
    return None


def nearest_rows(rows: list[dict], tokens: int) -> list[dict]:
    """The rows whose tokens per micro-batch (batch_size × seq_len) is nearest `tokens` by ratio;
    several where they tie."""
    if not rows:
        return []

    def distance(r):
        return abs(math.log(r["batch_size"] * r["seq_len"] / tokens))

    best = min(distance(r) for r in rows)
    return [r for r in rows if math.isclose(distance(r), best, rel_tol=1e-9, abs_tol=1e-12)]


def _at(r: dict) -> str:
    return f"B={r['batch_size']}×{r['seq_len']}"


def auto_precision(record: dict, gpu: str, compute_capability: str, shape: TrainShape) -> tuple[str, str]:
    """`precision: auto` on a GPU for a training run: ("fp8" or "bf16", the reason in words)."""
    if not fp8_capable(compute_capability):
        return "bf16", (f"auto: bf16 ({gpu}, compute capability {describe_capability(compute_capability)}, has no fp8 "
                        f"tensor cores)")
    problem = shape_problem(shape)
    if problem:
        return "bf16", f"auto: bf16 ({problem})"
    model = shape.model
    mine = [r for r in record["speed"] if r.get("gpu") == gpu and r.get("model") == model]
    if not mine:
        return "bf16", f"auto: bf16 (no fp8 speed measured for {model} on {gpu})"
    same = [r for r in mine if r.get("model_config") == shape.config]
    if not same:
        return "bf16", f"auto: bf16 (the fp8 speeds recorded for {model} on {gpu} are of another architecture)"
    near = nearest_rows(same, shape.tokens)
    ratios = [(r["fp8_tok_s"] / r["bf16_tok_s"], r) for r in near]
    slow = [(x, r) for x, r in ratios if x < MIN_SPEEDUP]
    if slow:
        x, r = min(slow, key=lambda t: t[0])
        return "bf16", (f"auto: bf16 (fp8 {x:.2f}× bf16 at {_at(r)} on {gpu}, {r.get('date', 'undated')}; "
                        f"fp8 needs ≥ {MIN_SPEEDUP:.2f}×)")
    speed = "; ".join(f"{x:.2f}× bf16 at {_at(r)} on {gpu}, {r.get('date', 'undated')}" for x, r in ratios)
    gate = record["gate"].get(model)
    if gate is None:
        return "bf16", f"auto: bf16 (fp8 {speed}, but no fp8 gate run for {model})"
    if gate.get("model_config") != shape.config:
        return "bf16", f"auto: bf16 (fp8 {speed}, but the fp8 gate run for {model} was of another architecture)"
    steps, diff = gate["steps"], gate["relative_difference"]
    result = f"{diff * 100:+.2f} % bits/byte after {steps:,} steps, {gate.get('date', 'undated')}"
    if steps < GATE_STEPS:
        return "bf16", f"auto: bf16 (fp8 {speed}, but the fp8 gate run for {model} is too short: {result}; needs {GATE_STEPS:,} steps)"
    if not abs(diff) <= GATE_LIMIT:  # a NaN fails too
        return "bf16", f"auto: bf16 (fp8 {speed}, but the fp8 gate failed for {model}: {result}; limit ±{GATE_LIMIT * 100:g} %)"
    return "fp8", f"auto: fp8 ({speed}; gate passed: {result})"


# ----------------------------------------------------------------------------- writing the record
def with_speed_rows(record: dict, rows: list[dict]) -> dict:
    """The record with `rows` in place of the rows of the same (gpu, model, batch_size, seq_len)."""
    key = lambda r: (r["gpu"], r["model"], r["batch_size"], r["seq_len"])  # noqa: E731
    new = {key(r) for r in rows}
    return {**record, "speed": [r for r in record["speed"] if key(r) not in new] + list(rows)}


def with_gate(record: dict, model: str, entry: dict) -> dict:
    """The record with `entry` as `model`'s gate verdict (replacing the one before)."""
    return {**record, "gate": {**record["gate"], model: entry}}


def update_record(path: str | os.PathLike, change: Callable[[dict], dict]) -> dict:
    """Read the record at `path` (a missing file: empty), apply `change`, write it atomically
    (andrea/io.py: a crash never leaves half a record). Returns what was written."""
    from andrea.io import write_json_atomic  # here only: importing the engine loads no pyarrow

    record = change(load_record(path))
    write_json_atomic(path, record)
    return record
