"""Optimizer settings, learning-rate schedule and the training step (SPEC §3.3).

One step: n micro-batches (forward + backward, gradients adding up), scale by 1/n, global L2
clipping at max_norm *before* AdamW touches m, v or the weights, AdamW with decoupled weight decay,
zero the gradients. A non-finite loss or gradient norm skips the update and is counted; after
`max_nonfinite` in a row the step raises NonFiniteHalt, and the caller writes a checkpoint and
stops. In fp16 the loss is scaled (the gradients come out multiplied by the engine's loss_scale,
divided out in AdamW); an overflow skips the update and halves the scale without counting as a
non-finite step, and the scale doubles again after a run of clean steps (dynamic loss scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from andrea.settings import TrainSettings, builtin_train_defaults


_DEFAULTS = builtin_train_defaults()  # the schema's: this module keeps no table of its own


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer's view of a model's TrainSettings (OptimConfig.of). Built directly (tests,
    benchmarks), a field left out takes the schema's default."""

    lr: float = _DEFAULTS["lr"]  # peak
    min_lr_ratio: float = _DEFAULTS["min_lr_ratio"]  # cosine ends at min_lr = ratio · peak (decision)
    warmup_steps: int = _DEFAULTS["warmup_steps"]
    max_steps: int = _DEFAULTS["max_steps"]
    beta1: float = _DEFAULTS["beta1"]
    beta2: float = _DEFAULTS["beta2"]
    eps: float = 1e-8  # AdamW's guard against dividing by ~0; not a setting
    weight_decay: float = _DEFAULTS["weight_decay"]
    grad_clip: float = _DEFAULTS["grad_clip"]
    max_nonfinite: int = _DEFAULTS["max_nonfinite"]  # K: consecutive non-finite steps before halting

    @classmethod
    def of(cls, s: TrainSettings) -> OptimConfig:
        return cls(**{f.name: getattr(s, f.name) for f in fields(cls) if f.name != "eps"})


def lr_at(step: int, oc: OptimConfig) -> float:
    """lr(t) = lr_cos(t) · min(1, (t+1)/warmup), lr_cos falling from the peak at t = 0 to
    min_lr at t = max_steps along a half cosine, flat after (SPEC §3.3)."""
    min_lr = oc.lr * oc.min_lr_ratio
    progress = min(step, oc.max_steps) / max(1, oc.max_steps)
    lr_cos = min_lr + 0.5 * (oc.lr - min_lr) * (1 + math.cos(math.pi * progress))
    return lr_cos * min(1.0, (step + 1) / max(1, oc.warmup_steps))


class NonFiniteHalt(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient norm."""


@dataclass
class StepResult:
    step: int
    loss: float  # mean over the micro-batches
    row_losses: np.ndarray  # one per batch row, micro-batches concatenated
    grad_norm: float  # before clipping
    lr: float
    clipped: bool
    skipped: bool


@dataclass
class NonFiniteCounter:
    consecutive: int = 0
    total: int = 0
    steps: list = field(default_factory=list)


def train_step(engine, micro_batches, step: int, oc: OptimConfig, nonfinite: NonFiniteCounter | None = None) -> StepResult:
    """One optimizer step over `micro_batches`: a list of (inputs, targets) arrays [B, T], or of
    batches already prepared by engine.prepare (the trainer prepares them in the background)."""
    nonfinite = nonfinite if nonfinite is not None else NonFiniteCounter()
    n = len(micro_batches)
    engine.zero_grads()  # once per step, here: a step leaves its gradients (clearing is a pass over 4 bytes a parameter)
    rows = []
    for i, mb in enumerate(micro_batches):
        args = mb if isinstance(mb, tuple) else (mb,)
        # with several ranks the last micro-batch's backward pass averages the gradients over them;
        # the row losses stay on the device, so that the passes and the norm's kernels queue up
        # behind each other and the step waits for the device once, at the norm
        rows.append(engine.forward_backward(*args, reduce=i == n - 1, on_host=False))
    if n > 1:
        engine.scale_grads(1.0 / n)
    scale = engine.loss_scale  # 1 except in fp16, where the gradients come out multiplied by it
    norm = engine.grad_norm() / scale
    # with several ranks (data parallelism): every rank's row losses, so that all see one loss and,
    # with the averaged gradients, one norm, and take the same decisions below
    rows = engine.gather_rows(np.concatenate([np.asarray(engine.host(r)) for r in rows]))
    loss = float(np.mean(rows))
    lr = lr_at(step, oc)
    fp16 = engine.precision == "fp16"
    if fp16 and math.isfinite(loss) and not math.isfinite(norm) and scale > 1.0:
        # fp16 overflow in the scaled backward pass: skip this update and halve the scale (dynamic
        # loss scaling); not a divergence, so it does not count towards the non-finite halt
        engine.zero_grads()
        engine.set_loss_scale(scale / 2)
        return StepResult(step, loss, rows, norm, lr, False, True)
    if not (math.isfinite(loss) and math.isfinite(norm)):
        engine.zero_grads()
        nonfinite.consecutive += 1
        nonfinite.total += 1
        nonfinite.steps.append(step)
        if nonfinite.consecutive >= oc.max_nonfinite:
            raise NonFiniteHalt(
                f"step {step}: {nonfinite.consecutive} consecutive steps with a non-finite loss or gradient "
                f"norm (loss {loss}, norm {norm}); halting. Lower the learning rate or check the data."
            )
        return StepResult(step, loss, rows, norm, lr, False, True)
    nonfinite.consecutive = 0
    clipped = norm > oc.grad_clip
    engine.adamw(lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, gscale=(oc.grad_clip / norm if clipped else 1.0) / scale)
    if fp16:
        engine.loss_scale_grow()
    return StepResult(step, loss, rows, norm, lr, clipped, False)
