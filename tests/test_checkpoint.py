import json
import subprocess
import sys

import numpy as np
import pytest

from andrea.checkpoint import CheckpointError, checkpoint_info, read_checkpoint, read_weights, write_checkpoint
from andrea.engine import Engine
from andrea.model import ModelConfig
from andrea.optim import OptimConfig, train_step
from conftest import REPO

CFG = ModelConfig(vocab_size=40, d_model=8, n_head=2, n_layer=1, context=8)


@pytest.fixture
def trained():
    e = Engine(CFG, batch_size=2, seq_len=8, seed=1)
    x = np.random.default_rng(0).integers(0, 40, (2, 9))
    for step in range(3):
        train_step(e, [(x[:, :-1], x[:, 1:])], step, OptimConfig(lr=1e-2, warmup_steps=1))
    return e


def test_round_trip_is_bit_exact_and_layout_is_the_spec(trained, tmp_path):
    p = tmp_path / "step_000003.bin"
    write_checkpoint(p, 3, trained.w, trained.m, trained.v)
    raw = p.read_bytes()
    n = trained.n_params
    assert len(raw) == 8 + 12 * n
    assert np.frombuffer(raw[:8], "<i4").tolist() == [3, n]
    assert raw[8 : 8 + 4 * n] == trained.w.astype("<f4").tobytes()
    assert raw[8 + 8 * n :] == trained.v.astype("<f4").tobytes()
    ck = read_checkpoint(p, expected_n_params=n)
    assert ck.step == 3
    assert ck.weights.tobytes() == trained.w.tobytes() and ck.m.tobytes() == trained.m.tobytes() and ck.v.tobytes() == trained.v.tobytes()
    w = read_weights(p, n)
    assert w.weights.tobytes() == trained.w.tobytes() and w.m is None
    # a fresh engine continues from it exactly like the original
    e2 = Engine(CFG, batch_size=2, seq_len=8, seed=99)
    e2.load_state(ck.weights, ck.m, ck.v, adam_t=trained.adam_t)
    x = np.random.default_rng(5).integers(0, 40, (2, 9))
    oc = OptimConfig(lr=1e-2, warmup_steps=1)
    train_step(trained, [(x[:, :-1], x[:, 1:])], 3, oc)
    train_step(e2, [(x[:, :-1], x[:, 1:])], 3, oc)
    assert trained.w.tobytes() == e2.w.tobytes()


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-4], "truncated"),
    (lambda b: b + b"\0" * 4, "trailing data"),
    (lambda b: b[:5], "shorter than the 8-byte header"),
    (lambda b: np.array([1, -5], "<i4").tobytes() + b[8:], "not an ANDREA checkpoint"),
    (lambda b: b"", "shorter than the 8-byte header"),
])
def test_corrupt_checkpoints_are_refused(trained, tmp_path, damage, message):
    p = tmp_path / "c.bin"
    write_checkpoint(p, 3, trained.w, trained.m, trained.v)
    p.write_bytes(damage(p.read_bytes()))
    with pytest.raises(CheckpointError, match=message):
        read_checkpoint(p)


def test_checkpoint_of_another_model_is_refused(trained, tmp_path):
    p = tmp_path / "c.bin"
    write_checkpoint(p, 3, trained.w, trained.m, trained.v)
    with pytest.raises(CheckpointError, match="another model configuration"):
        read_checkpoint(p, expected_n_params=trained.n_params + 1)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        read_checkpoint(tmp_path / "missing.bin")


def test_a_failed_write_keeps_the_old_file(trained, tmp_path):
    p = tmp_path / "c.bin"
    write_checkpoint(p, 3, trained.w, trained.m, trained.v)
    before = p.read_bytes()
    with pytest.raises(ValueError):
        write_checkpoint(p, 4, trained.w, trained.m[:-1], trained.v)
    assert p.read_bytes() == before and [f.name for f in tmp_path.iterdir()] == ["c.bin"]


def test_ckpt_info_command(trained, tmp_path):
    p = tmp_path / "c.bin"
    write_checkpoint(p, 7, trained.w, trained.m, trained.v)
    out = subprocess.run([sys.executable, "-m", "andrea.cli", "ckpt", "info", str(p)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0
    assert json.loads(out.stdout) == checkpoint_info(p) == {"path": str(p), "step": 7, "n_params": trained.n_params, "bytes": 8 + 12 * trained.n_params}
    p.write_bytes(p.read_bytes()[:-1])
    bad = subprocess.run([sys.executable, "-m", "andrea.cli", "ckpt", "info", str(p)], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 1 and "truncated" in bad.stderr


def test_newest_state_is_the_one_a_resume_would_take_without_reading_the_checkpoints(tmp_path):
    """What the trainer reads before anything is built (the precision a resume keeps): the newest
    checkpoint's state, passing over one whose state is damaged or missing, as RunCheckpoints does; a
    leftover state.json without any checkpoint is no run to resume."""
    from andrea.checkpoint import newest_state

    ck = tmp_path / "checkpoints"
    ck.mkdir()
    assert newest_state(tmp_path) is None
    (tmp_path / "state.json").write_text(json.dumps({"precision": "fp8", "checkpoint": "step_00000100.bin"}))
    assert newest_state(tmp_path) is None  # no checkpoint file: a fresh run
    (ck / "step_00000100.bin").write_bytes(b"")
    assert newest_state(tmp_path)["precision"] == "fp8"  # (the state.json of before per-checkpoint states)
    (ck / "step_00000200.bin").write_bytes(b"")
    (ck / "step_00000200.json").write_text(json.dumps({"precision": "bf16"}))
    assert newest_state(tmp_path)["precision"] == "bf16"
    (ck / "step_00000300.bin").write_bytes(b"")
    (ck / "step_00000300.json").write_text('{"precision": "f')  # cut off while written
    assert newest_state(tmp_path)["precision"] == "bf16"
    (ck / "step_00000400.json").write_text(json.dumps({"precision": "fp16"}))  # a state without its checkpoint
    assert newest_state(tmp_path)["precision"] == "bf16"
