"""Checkpoints (design §3.5), binary, little-endian, exact:

    [int32 step][int32 n_params][n_params × float32 weights][n_params × float32 m][n_params × float32 v]

Weights are in the parameter order of andrea/model.py. Written to a temporary file, fsynced and
renamed, so a crash never leaves a truncated file under a real name. Reading checks the header
against the file size and the expected parameter count, and says what is wrong.

A training run's checkpoints (RunCheckpoints): written by a background thread with the run state
beside each, pruned, and the newest intact one found again for a resume (a damaged newest one is
reported and skipped).
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from andrea.io import atomic_path, sha256_file, write_json_atomic

log = logging.getLogger("andrea.checkpoint")

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


# ----------------------------------------------------------------------------- a run's checkpoints
def newest_state(run_dir: str | Path) -> dict | None:
    """The state of a run directory's newest checkpoint as RunCheckpoints.newest_intact picks it
    (newest step_*.bin first, its state file beside it, or state.json where that names it; one
    without a readable state is passed over), read before anything is built: what the run was
    trained on (its backend and precision), which a resume keeps. None: no checkpoint (a leftover
    state.json alone is not one). The checkpoint's bytes are not read here (to_resume checks them
    when the run resumes, and the trainer warns if the one it resumes from differs)."""
    run_dir = Path(run_dir)
    try:
        root = json.loads((run_dir / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        root = None
    for path in sorted((run_dir / "checkpoints").glob("step_*.bin"), reverse=True):
        try:
            return json.loads(path.with_suffix(".json").read_text())
        except OSError:
            if root is not None and root.get("checkpoint") == path.name:
                return root  # written before checkpoints had their own state files
        except json.JSONDecodeError:
            pass  # damaged: to_resume reports it and takes an older one, as here
    return None


def checkpoint_sha256(step: int, arrays) -> str:
    """SHA-256 of a checkpoint file's bytes, from the arrays it is written from."""
    h = hashlib.sha256(np.array([(step, arrays[0].size)], dtype=HEADER).tobytes())
    for a in arrays:
        h.update(memoryview(np.ascontiguousarray(a, dtype="<f4")).cast("B"))
    return h.hexdigest()


class RunCheckpoints:
    """A run directory's checkpoints (andrea/trainer.py lists the files): written by a background
    thread, found again for a resume.

    checkpoints/step_NNNNNN.bin with its state beside it (step_NNNNNN.json, with the file's
    SHA-256), then state.json, then the old ones pruned (the newest `keep` stay). A checkpoint
    without its state file is incomplete and never resumed from. best.bin holds weights alone
    (m and v zero). Only the writer (rank 0 of several) writes; the others' calls do nothing.

    The arrays given to write are host arrays or snapshots that `materialise` brings to the host
    (Engine.snapshot: on the GPU a device-side copy, transferred in the writer's thread while
    training goes on)."""

    def __init__(self, run_dir: str | Path, n_params: int, keep: int, writer: bool = True,
                 materialise: Callable = np.asarray):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / "checkpoints"
        self.n_params, self.keep, self.writer = n_params, keep, writer
        self.materialise = materialise
        self.queued: Path | None = None  # the newest checkpoint this process queued
        self._pool: ThreadPoolExecutor | None = None
        self._writes: list[Future] = []

    def path(self, step: int) -> Path:
        return self.dir / f"step_{step:06d}.bin"

    # ------------------------------------------------------------------ writing
    def open(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="andrea-checkpoint")

    def close(self) -> None:
        """Every queued write finished (a failed one raised here), the thread ended."""
        if self._pool is None:
            return
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            self._pool = None

    def save(self, step: int, state: dict, host_copy: Callable[[], tuple], reason: str, wait: bool = False) -> Path:
        """Queue step `step`'s checkpoint: `host_copy()` (weights, m, v) is taken once the previous
        checkpoint is on disk, the files are written in the background (one checkpoint in flight
        at a time); with `wait`, until they are written."""
        path = self.path(step)
        if not self.writer:
            return path
        self.queued = path
        # the previous checkpoint must be on disk before this one is queued (it was queued
        # checkpoint_every steps ago, so this rarely waits): a crash then loses less than
        # 2 x checkpoint_every steps, and at most checkpoint_every once a write has finished
        self.wait()
        self._submit(self.write, path, step, host_copy(), state, reason)
        if wait:
            self.wait()
        return path

    def save_best(self, step: int, weights) -> None:
        """best.bin: these weights (a host copy or snapshot taken now), written in the background."""
        if self.writer:
            self._submit(self._write_best, step, weights)

    def wait(self) -> None:
        """Until every queued write is on disk; a failed write (a full disk, say) is raised here."""
        while self._writes:
            self._writes.pop(0).result()

    def _submit(self, fn, *args) -> None:
        """Queue a write on the checkpoint thread; at most two in flight (each holds a host copy)."""
        while len(self._writes) >= 2:
            self._writes.pop(0).result()  # re-raises a failed write (a full disk, say)
        self._writes.append(self._pool.submit(fn, *args))

    def write(self, path: Path, step: int, arrays, state: dict, reason: str) -> None:
        """The checkpoint, its state file and state.json, then the old ones pruned (the writer
        thread's work; bench/trainer_vs_engine.py times it)."""
        arrays = [self.materialise(a) for a in arrays]
        write_checkpoint(path, step, *arrays)
        state["sha256"] = checkpoint_sha256(step, arrays)
        write_json_atomic(path.with_suffix(".json"), state)
        write_json_atomic(self.run_dir / "state.json", state)
        kept = sorted(self.dir.glob("step_*.bin"))
        for old in kept[: -self.keep]:
            old.unlink(missing_ok=True)
            old.with_suffix(".json").unlink(missing_ok=True)
        log.info("checkpoint %s (%s)", path, reason)

    def _write_best(self, step: int, weights) -> None:
        weights = self.materialise(weights)
        zeros = np.zeros_like(weights)
        write_checkpoint(self.run_dir / "best.bin", step, weights, zeros, zeros)

    # ------------------------------------------------------------------ resuming
    def newest_intact(self) -> tuple[dict | None, Checkpoint | None, list[str]]:
        """The newest checkpoint that passes its checks, with its state; the problems found with
        newer ones. A checkpoint passes when its state file is there, the file's size and header
        match the model, the step matches the state and its SHA-256 matches the one recorded."""
        problems = []
        root_state = self.run_dir / "state.json"
        root = json.loads(root_state.read_text()) if root_state.exists() else None
        for path in sorted(self.dir.glob("step_*.bin"), reverse=True):
            st_path = path.with_suffix(".json")
            try:
                st = json.loads(st_path.read_text()) if st_path.exists() else None
            except json.JSONDecodeError as e:
                problems.append(f"{st_path}: not valid JSON ({e})")
                continue
            if st is None and root is not None and root.get("checkpoint") == path.name:
                st = root  # written before checkpoints had their own state files
            if st is None:
                problems.append(f"{path}: no state file beside it (the run stopped while writing it)")
                continue
            try:
                ck = read_checkpoint(path, expected_n_params=self.n_params)
            except CheckpointError as e:
                problems.append(str(e))
                continue
            if ck.step != st["step"]:
                problems.append(f"{path}: holds step {ck.step}, its state says {st['step']}")
                continue
            if st.get("sha256") and sha256_file(path) != st["sha256"]:
                problems.append(f"{path}: SHA-256 differs from the one recorded when it was written (damaged)")
                continue
            return st, ck, problems
        return None, None, problems

    def to_resume(self, model: str, tokenizer_hash: str) -> tuple[dict | None, Checkpoint | None]:
        """The state and checkpoint a run of `model` continues from, or (None, None): a new run.
        Damaged newer checkpoints are reported and skipped; with none intact, the run directory
        is refused. Records without any checkpoint (a run stopped before its first) are removed
        by the writer, so the new run's records start at step 0."""
        st, ck, problems = self.newest_intact()
        for p in problems:
            log.warning("cannot resume from it: %s", p)
        if st is None:
            if problems:
                raise RuntimeError(f"{self.run_dir}: no intact checkpoint to resume from:\n  " + "\n  ".join(problems)
                                   + "\nMove the run directory away to start over.")
            if self.writer and (self.run_dir / "loss.jsonl").exists():
                log.warning("%s: records but no checkpoint: starting from step 0", self.run_dir)
                for name in ("loss.jsonl", "samples.jsonl"):
                    (self.run_dir / name).unlink(missing_ok=True)
            return None, None
        if problems:
            log.warning("resuming from the newest intact checkpoint, %s (step %d)", st["checkpoint"], st["step"])
        if st["model"] != model or st["n_params"] != self.n_params:
            raise RuntimeError(
                f"{self.run_dir}: a run of {st['model']} with {st['n_params']:,} parameters, but {model} "
                f"now has {self.n_params:,}; use another run directory to start over"
            )
        if st["tokenizer_hash"] != tokenizer_hash:
            raise RuntimeError(f"{self.run_dir}: trained with another tokenizer; start a new run directory")
        return st, ck
