"""CUDA graphs: a pass of the engine recorded once and replayed with one launch."""

from __future__ import annotations

import cupy as cp


class CapturedPass:
    """A function of the engine's fixed buffers (forward + backward of one micro-batch) recorded
    once as a CUDA graph and replayed with one launch: no Python and no per-kernel launch cost in
    the hot loop. Everything it runs must be allocation-free and host-sync-free once warm (the 16-bit
    fast path is); the first call runs it eagerly to warm up (kernels compiled, scratch allocated),
    then captures it on a side stream. Replays go to the current stream (after the token upload,
    or with the upload and the logits' download inside the pass: andrea/sampling.py's step).

    `backend` is the CupyBackend whose kernels fn runs: its weight copy is refreshed before each
    replay (weights loaded since the last optimizer step), and the device buffers the graph reads
    and writes are held as long as the graph lives (past the backend's release())."""

    def __init__(self, backend, fn):
        self.backend = backend
        self.fn = fn
        self.graph = None
        self.keep = ()

    def __call__(self) -> None:
        self.backend.weights.refresh()
        if self.graph is None:
            self.fn()  # warm-up, eager
            cp.cuda.get_current_stream().synchronize()
            self.graph = self._capture()
            return
        self.graph.launch(cp.cuda.get_current_stream())

    def _capture(self):
        pool = cp.get_default_memory_pool()
        used = pool.used_bytes()
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                self.fn()
            finally:
                graph = stream.end_capture()  # also after a failure: never leave the stream capturing
        if pool.used_bytes() > used:  # (another thread may free memory meanwhile: a writer's snapshot)
            raise RuntimeError("the captured pass allocated GPU memory; it cannot be replayed safely")
        self.keep = self.backend.graph_buffers()
        return graph
