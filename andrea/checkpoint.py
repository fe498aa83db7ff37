"""Checkpoints (design §3.5), binary, little-endian, exact:

    [int32 step][int32 n_params][n_params × float32 weights][n_params × float32 m][n_params × float32 v]

Weights are in the parameter order of andrea/model.py. Written to a temporary file, fsynced and
renamed, so a crash never leaves a truncated file under a real name. Reading checks the header
against the file size and the expected parameter count, and says what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from andrea.io import atomic_path

HEADER = np.dtype([("step", "<i4"), ("n_params", "<i4")])
HEADER_BYTES = 8


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and the problem."""


@dataclass
class Checkpoint:
    step: int
    weights: np.ndarray  # float32 [n_params]
    m: np.ndarray | None = None
    v: np.ndarray | None = None


def write_checkpoint(path: str | Path, step: int, weights, m, v) -> None:
    n = int(weights.size)
    if not (m.size == v.size == n):
        raise ValueError(f"weights, m and v differ in size ({n}, {m.size}, {v.size})")
    if not 0 <= step < 2**31 or n >= 2**31:
        raise ValueError("step and n_params must fit int32")
    header = np.array([(step, n)], dtype=HEADER)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(header.tobytes())
            for a in (weights, m, v):
                # the array's own buffer, not a bytes copy: copying hundreds of MB would hold the
                # GIL for a good part of a second, and the trainer writes from a background thread
                fh.write(memoryview(np.ascontiguousarray(np.asarray(a), dtype="<f4")).cast("B"))


def _header(path: Path, expected_n_params: int | None) -> tuple[int, int, int]:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    if size < HEADER_BYTES:
        raise CheckpointError(f"{path}: {size} bytes, shorter than the 8-byte header (truncated)")
    with open(path, "rb") as fh:
        h = np.frombuffer(fh.read(HEADER_BYTES), dtype=HEADER)[0]
    step, n = int(h["step"]), int(h["n_params"])
    if n <= 0 or step < 0:
        raise CheckpointError(f"{path}: header says step {step}, n_params {n}: not an ANDREA checkpoint")
    want = HEADER_BYTES + 3 * 4 * n
    if size < want:
        raise CheckpointError(f"{path}: {size} bytes, but its header (n_params {n:,}) needs {want:,}: truncated")
    if size > want:
        raise CheckpointError(f"{path}: {size} bytes, but its header (n_params {n:,}) needs {want:,}: trailing data")
    if expected_n_params is not None and n != expected_n_params:
        raise CheckpointError(
            f"{path}: holds {n:,} parameters but this model has {expected_n_params:,}: "
            "a checkpoint of another model configuration"
        )
    return step, n, size


def read_checkpoint(path: str | Path, expected_n_params: int | None = None) -> Checkpoint:
    """Step, weights, m and v, validated."""
    path = Path(path)
    step, n, _ = _header(path, expected_n_params)
    data = np.fromfile(path, dtype="<f4", offset=HEADER_BYTES, count=3 * n)
    return Checkpoint(step, data[:n].copy(), data[n : 2 * n].copy(), data[2 * n :].copy())


def read_weights(path: str | Path, expected_n_params: int | None = None) -> Checkpoint:
    """For inference: the step and the first n_params floats after the header, nothing else."""
    path = Path(path)
    step, n, _ = _header(path, expected_n_params)
    return Checkpoint(step, np.fromfile(path, dtype="<f4", offset=HEADER_BYTES, count=n))


def checkpoint_info(path: str | Path) -> dict:
    step, n, size = _header(Path(path), None)
    return {"path": str(path), "step": step, "n_params": n, "bytes": size}
