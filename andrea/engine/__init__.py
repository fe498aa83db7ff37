"""The training engine (andrea.engine.engine) over a backend object: the interface is
andrea.engine.backend, implemented by andrea.engine.numpy_backend (the reference) and
andrea.engine.cupy (NVIDIA GPUs)."""

from andrea.engine.engine import (
    Engine,
    MemoryPlan,
    PreparedBatch,
    gpu_status,
    load_backend,
    make_backend,
    materialise,
    resolve_backend,
)

__all__ = ["Engine", "MemoryPlan", "PreparedBatch", "gpu_status", "load_backend", "make_backend", "materialise", "resolve_backend"]
