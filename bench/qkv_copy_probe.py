"""The q/k/v weight copy of the 16-bit input gradient (andrea/engine/cupy/backend.py attn_qkv_bwd: [W_Q
W_K W_V] side by side, [d, 3d], made from the three [d, d] weights before one product of depth 3d), two
ways: CuPy's copy of a transposed view (what the backend does; `cupy_copy__bfloat16_bfloat16` in the
step's profile, 37 µs a call at ANDREA-480M, 16 a step: about 0.77 TB/s), and three cudaMemcpy2DAsync
calls (a row pitch of 3d on the destination's side), also inside a captured graph as the step runs
them. Both must give the same bytes.

    python3 bench/qkv_copy_probe.py [--d 768 1536] [--reps 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_timing import mean_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", nargs="+", type=int, default=[768, 1536], help="d_model (ANDREA-120M: 768, 480M: 1536)")
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    import cupy as cp

    for d in args.d:
        three = cp.asarray(np.random.default_rng(0).integers(0, 1 << 16, (3, d, d), dtype=np.uint16))  # bf16 bits
        view, item = cp.empty((d, 3 * d), cp.uint16), three.itemsize

        def cupy_copy(out):
            out.reshape(d, 3, d)[...] = three.transpose(1, 0, 2)

        def memcpy2d(out):
            stream = cp.cuda.get_current_stream().ptr
            for i in range(3):
                cp.cuda.runtime.memcpy2DAsync(out.data.ptr + i * d * item, 3 * d * item, three[i].data.ptr, d * item,
                                              d * item, d, cp.cuda.runtime.memcpyDeviceToDevice, stream)

        want = cp.concatenate(list(three), axis=1)
        moved = 2 * three.nbytes  # read and written
        for name, fn in (("cupy transposed copy", cupy_copy), ("3 x cudaMemcpy2DAsync", memcpy2d)):
            out = cp.zeros_like(view)
            fn(out)
            same = bool((out == want).all())
            ms = mean_ms(lambda: fn(out), args.reps)
            stream = cp.cuda.Stream(non_blocking=True)  # the same inside a captured graph
            with stream:
                stream.begin_capture()
                for _ in range(10):
                    fn(out)
                graph = stream.end_capture()
                graph_ms = mean_ms(lambda: graph.launch(stream), max(1, args.reps // 10)) / 10
            print(f"d={d} {name}: {ms * 1e3:.1f} us eager, {graph_ms * 1e3:.1f} us in a graph "
                  f"({moved / graph_ms / 1e9:.2f} TB/s); same bytes: {same}")


if __name__ == "__main__":
    main()
