"""Training batches: rows chosen by the curriculum, cut from the token shards, and made ready for
the engine one step ahead, in a background thread, while the current step runs.

A batch is `rows = batch_size × grad_accum` windows of T + 1 tokens (inputs [:T], targets [1:]),
each starting at a document's BOS (andrea/shards.py). Which documents is decided by the curriculum
(andrea/curriculum.py, any mode) from the trainer's random generator and each source's document cursor;
that pair is the *draw state*.

Exact resume: the batch for step s may be drawn before step s − 1 has finished, so the draw state
a checkpoint at step s must save is the one from *before* that draw. Every batch carries it
(`Batch.draw_state`), and `BatchStream.state_for(step)` hands it over. Batches are only drawn
ahead within a curriculum phase: at a phase boundary the weights depend on the losses of the step
before, so that batch is drawn after them.

Data parallelism (decision): every rank draws the whole global batch, `ranks × rows`, from the
same generator, and gathers and prepares only its own contiguous share (rank r: rows r·n to
(r + 1)·n). The draw costs well under a millisecond; in exchange every rank holds the same draw
state and, after the row losses are gathered, the same bandit, without reducing its statistics;
and 2 ranks × B rows are exactly the rows of 1 rank × 2B.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Batch:
    step: int
    rows: list[tuple[str, int]]  # (source, document index) of each row of the global batch (all ranks)
    tokens: np.ndarray  # uint16 [rows, T + 1]: this rank's rows
    micro: list = field(default_factory=list)  # per micro-batch: what engine.prepare made of it
    draw_state: dict = field(default_factory=dict)  # the draw state before this batch was drawn


class BatchStream:
    """Draws, gathers and prepares batches; one ahead in a background thread when `prefetch`."""

    def __init__(self, bandit, shards: dict, rng: np.random.Generator, batch_size: int, grad_accum: int, seq_len: int,
                 prepare=None, prefetch: bool = True, rank: int = 0, ranks: int = 1):
        self.bandit, self.shards, self.rng = bandit, shards, rng
        self.rank, self.ranks = rank, ranks
        self.B, self.accum, self.T = batch_size, grad_accum, seq_len
        self.prepare = prepare  # engine.prepare, or None for plain (inputs, targets) arrays
        self.heldout_every = bandit.c.heldout_every  # rows step over held-out documents
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="andrea-data") if prefetch else None
        self.pending: tuple[int, Future] | None = None
        self.current: tuple[int, dict] | None = None  # the step and draw state of the batch get() last gave

    # ------------------------------------------------------------------ draw state
    def draw_state(self) -> dict:
        return {"rng": copy.deepcopy(self.rng.bit_generator.state), "cursors": self.bandit.cursors()}

    def restore(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        for name, (cursor, epoch) in state["cursors"].items():
            if name in self.bandit.arms:
                self.bandit.arms[name].cursor, self.bandit.arms[name].epoch = cursor, epoch

    def state_for(self, step: int) -> dict:
        """The draw state a checkpoint at `step` must save: from before the batch of `step` was
        drawn, whether it is still to come, being drawn ahead, or already handed out (a halt
        checkpoints the step that failed)."""
        if self.pending is not None:
            batch = self.pending[1].result()  # also: nothing is drawing while the state is read
            if self.pending[0] == step:
                return batch.draw_state
        if self.current is not None and self.current[0] == step:
            return self.current[1]
        return self.draw_state()

    # ------------------------------------------------------------------ batches
    def make(self, step: int) -> Batch:
        state = self.draw_state()
        n = self.B * self.accum
        rows = self.bandit.draw(n * self.ranks, self.rng)
        mine = rows[self.rank * n:(self.rank + 1) * n]
        x = np.empty((n, self.T + 1), dtype=np.uint16)
        for i, (src, doc) in enumerate(mine):
            x[i] = self.shards[src].window(doc, self.T, self.heldout_every)[0]
        micro = []
        for i in range(0, n, self.B):
            inputs, targets = x[i : i + self.B, :-1], x[i : i + self.B, 1:]
            micro.append(self.prepare(inputs, targets) if self.prepare else (inputs.astype(np.int64), targets.astype(np.int64)))
        return Batch(step, rows, x, micro, state)

    def prefetch(self, step: int) -> None:
        """Start drawing the batch of `step` in the background (call only when the bandit's
        weights for `step` are settled)."""
        if self.pool is not None and self.pending is None:
            self.pending = (step, self.pool.submit(self.make, step))

    def get(self, step: int) -> Batch:
        """The batch of `step`: the prefetched one, or drawn now."""
        if self.pending is not None:
            pstep, fut = self.pending
            self.pending = None
            batch = fut.result()  # re-raises what went wrong in the thread (e.g. a damaged shard)
            if pstep != step:
                self.restore(batch.draw_state)  # drawn for another step: undo it
                batch = self.make(step)
        else:
            batch = self.make(step)
        self.current = (step, batch.draw_state)
        return batch

    def close(self) -> None:
        """Drop a batch drawn ahead (restoring the draw state) and stop the thread."""
        try:
            if self.pending is not None:
                fut, self.pending = self.pending[1], None
                self.restore(fut.result().draw_state)
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)
                self.pool = None
