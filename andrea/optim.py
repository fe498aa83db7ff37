"""Optimizer settings, learning-rate schedule and the training step (design §3.3).

One step: n micro-batches (forward + backward, gradients adding up), scale by 1/n, global L2
clipping at max_norm *before* AdamW touches m, v or the weights, AdamW with decoupled weight decay,
zero the gradients; the norm, the clipping and the skip decision are taken on the engine's device,
so a step can be launched before the previous one's results reach the host (launch_step). A
non-finite gradient norm (which a non-finite loss implies) skips the update and is counted; after
`max_nonfinite` in a row the step raises NonFiniteHalt, and the caller writes a checkpoint and
stops. In fp16 the loss is scaled (the gradients come out multiplied by the engine's loss_scale,
divided out in AdamW); an overflow skips the update and halves the scale without counting as a
non-finite step, and the scale doubles again after a run of clean steps (dynamic loss scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from andrea.engine.backend import CTRL_APPLIED, CTRL_NORM, CTRL_T
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
    min_lr at t = max_steps along a half cosine, flat after (design §3.3)."""
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
    batches already prepared by engine.prepare (the trainer prepares them in the background).
    launch_step, then its result at once."""
    return launch_step(engine, micro_batches, step, oc, nonfinite).result()


def launch_step(engine, micro_batches, step: int, oc: OptimConfig, nonfinite: NonFiniteCounter | None = None) -> "PendingStep":
    """Queue one optimizer step on the engine's device without waiting for it: the passes, the
    gradient norm, the decisions (clipping, skipping a non-finite step: Backend.step_control) and
    AdamW, then copies of the decisions and the row losses back to the host. The host may draw,
    prepare and launch the next step before calling result() on this one (the trainer does, except
    in fp16, whose loss scale the host changes between steps), so the GPU never waits on it."""
    nonfinite = nonfinite if nonfinite is not None else NonFiniteCounter()
    n = len(micro_batches)
    rows = []
    for i, mb in enumerate(micro_batches):
        args = mb if isinstance(mb, tuple) else (mb,)
        # the first pass clears the gradients (in its graph: a step leaves its gradients, for tools
        # to read); with several ranks the last micro-batch's backward pass averages them over the
        # ranks; the row losses stay on the device until result()
        rows.append(engine.forward_backward(*args, reduce=i == n - 1, on_host=False, zero_grads=i == 0))
    if n > 1:
        engine.scale_grads(1.0 / n)
    scale = engine.loss_scale  # 1 except in fp16, where the gradients come out multiplied by it
    lr = lr_at(step, oc)
    engine.update(lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.grad_clip)
    return PendingStep(engine, step, oc, nonfinite, lr, scale, engine.readback([engine.ctrl, *rows]))


def reads_ahead(engine) -> bool:
    """Whether a loop over steps may launch a step before reading the one before: not in fp16 (the
    host sets the loss scale from each step's result before the next), nor with several ranks
    (reading a step gathers the ranks' row losses through a collective that waits for the device)."""
    return engine.precision != "fp16" and engine.comm.size == 1


class StepsInFlight:
    """A loop's launched steps, read as the trainer reads them: push(a launched step) returns the
    result of the one before it (or of itself where reads_ahead says no), drain() the last one."""

    def __init__(self, engine):
        self.ahead = reads_ahead(engine)
        self.pending = None

    def push(self, launched: "PendingStep") -> StepResult | None:
        previous, self.pending = self.pending, launched
        done = previous.result() if previous is not None else None
        return self.drain() if not self.ahead else done

    def drain(self) -> StepResult | None:
        pending, self.pending = self.pending, None
        return pending.result() if pending is not None else None


class PendingStep:
    """A launched step; result() waits for its copies to reach the host (not for later steps) and
    does its host-side bookkeeping: once, in launch order."""

    def __init__(self, engine, step, oc, nonfinite, lr, scale, readback):
        self.engine, self.step, self.oc, self.nonfinite = engine, step, oc, nonfinite
        self.lr, self.scale, self.readback = lr, scale, readback
        self._result = None
        self.halt = None  # NonFiniteHalt's message, where this step made max_nonfinite in a row

    def result(self, raise_halt: bool = True) -> StepResult:
        """The step's results; NonFiniteHalt where it made max_nonfinite non-finite steps in a row
        (with raise_halt False the caller raises it from self.halt, after recording the step)."""
        if self._result is None:
            self._result = self._finish()
        if raise_halt and self.halt is not None:
            raise NonFiniteHalt(self.halt)
        return self._result

    def _finish(self) -> StepResult:
        engine, step, oc, nonfinite, lr, scale = self.engine, self.step, self.oc, self.nonfinite, self.lr, self.scale
        ctrl, *rows = self.readback.get()
        self.readback = None
        norm, applied = float(ctrl[CTRL_NORM]), bool(ctrl[CTRL_APPLIED])
        engine.adam_t = int(ctrl[CTRL_T])  # the device's count of applied updates, as of this step
        # with several ranks (data parallelism): every rank's row losses, so that all see one loss
        # (the norm and the decisions are the same on every rank: the gradients were averaged)
        rows = engine.gather_rows(np.concatenate(rows))
        loss = float(np.mean(rows))
        if engine.precision == "fp16" and not applied and math.isfinite(loss) and scale > 1.0:
            # fp16 overflow in the scaled backward pass: the update was skipped; halve the scale
            # (dynamic loss scaling); not a divergence, so it does not count towards the halt
            engine.set_loss_scale(scale / 2)
            return StepResult(step, loss, rows, norm, lr, False, True)
        if not applied:
            # a non-finite loss makes the gradients non-finite too (the classifier's gradient is
            # softmax − one-hot of the same logits), so a non-finite norm is the one test
            nonfinite.consecutive += 1
            nonfinite.total += 1
            nonfinite.steps.append(step)
            if nonfinite.consecutive >= oc.max_nonfinite:
                self.halt = (f"step {step}: {nonfinite.consecutive} consecutive steps with a non-finite loss or gradient "
                             f"norm (loss {loss}, norm {norm}); halting. Lower the learning rate or check the data.")
            return StepResult(step, loss, rows, norm, lr, False, True)
        nonfinite.consecutive = 0
        if engine.precision == "fp16":
            engine.loss_scale_grow()
        return StepResult(step, loss, rows, norm, lr, norm > oc.grad_clip, False)
