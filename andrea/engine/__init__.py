"""The training engine: buffers, kernel pairs and optimizer steps (andrea.engine.engine) over a
backend (andrea.engine.numpy_backend; the CuPy backend implements the same functions)."""

from andrea.engine.engine import (
    Engine,
    MemoryPlan,
    PreparedBatch,
    gpu_status,
    load_backend,
    materialise,
    resolve_backend,
)

__all__ = ["Engine", "MemoryPlan", "PreparedBatch", "gpu_status", "load_backend", "materialise", "resolve_backend"]
