"""Data parallelism over NCCL on two GPUs (run on a machine with two:
`python3 -m pytest tests/test_data_parallel_gpu.py`): 2 GPUs × B rows train what 1 GPU × 2B rows
trains, with the gradients averaged inside the backward pass (eager in fp32, inside the replayed
CUDA graph in bf16; sent in float32 or bfloat16), and a signal stops both ranks at one checkpoint. Skipped, saying so, with
fewer than two GPUs."""

import json
import signal

import numpy as np
import pytest

from andrea.checkpoint import read_checkpoint
from test_trainer import interrupt, loss_lines, records, shards, train, write_config  # noqa: F401  (shards: fixture)

try:
    import cupy as cp

    GPUS = cp.cuda.runtime.getDeviceCount()
except Exception:  # no CuPy, or CUDA without a device
    GPUS = 0

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason=f"data parallelism over NCCL needs 2 GPUs; this machine has {GPUS}")]

SHORT = {"max_steps": 40, "checkpoint_every": 20, "eval_every": 20, "sample_every": 20, "backend": "cupy"}
# fp32: the same sums in another order; bf16: 16-bit activations of other GEMM shapes on top (and,
# averaged in bfloat16, gradients rounded to 8 significant bits: AdamW's update barely moves)
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}


@pytest.mark.parametrize("precision,reduce_dtype", [("fp32", "float32"), ("bf16", "float32"), ("bf16", "bfloat16")])
def test_two_gpus_of_b_rows_train_what_one_gpu_of_2b_rows_trains(shards, tmp_path, precision, reduce_dtype):  # noqa: F811
    one = train(write_config(tmp_path / "one.yaml", batch_size=8, precision=precision, **SHORT), shards, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = train(write_config(tmp_path / "two.yaml", batch_size=4, precision=precision, reduce_dtype=reduce_dtype, **SHORT),
                shards, tmp_path / "two", "--ranks", "2")
    assert two.returncode == 0, two.stderr[-3000:]
    assert f"2 ranks × 4 rows × 1 micro-batches (gradients averaged in {reduce_dtype}) = 256 tokens/step" in two.stderr
    a, b = records(tmp_path / "one"), records(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    tol = TOLERANCE[precision]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=tol), (ra["step"], ra["loss"], rb["loss"])
        if precision == "fp32":  # the same rows: the same mix and bandit
            assert ra.get("mix") == rb.get("mix") and ra.get("weights") == rb.get("weights"), ra["step"]
    wa = read_checkpoint(tmp_path / "one" / "final.bin").weights
    wb = read_checkpoint(tmp_path / "two" / "final.bin").weights
    assert np.abs(wa - wb).max() < tol * np.abs(wa).max()


def test_a_signal_stops_both_gpus_at_one_checkpoint_and_the_run_resumes_on_one(shards, tmp_path):  # noqa: F811
    cfg = write_config(tmp_path / "c.yaml", batch_size=4, max_steps=400, checkpoint_every=40, eval_every=40,
                       sample_every=80, backend="cupy", precision="bf16")
    run = tmp_path / "run"
    rc, err = interrupt(cfg, shards, run, 60, signal.SIGTERM, "--ranks", "2")
    assert rc == 5, err[-3000:]  # stopped at a checkpoint (andrea.launch.Exit.STOPPED); the ranks exit 0
    stopped = json.loads((run / "state.json").read_text())["step"]
    assert 60 <= stopped < 400 and "stopped by a signal" in err
    p = train(cfg, shards, run)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed micro at step {stopped}" in p.stderr
    assert [r["step"] for r in loss_lines(run)] == list(range(400))
