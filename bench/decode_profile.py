"""Where one decoded token's GPU time goes, kernel by kernel (torch.profiler, as bench/kernel_profile.py):
our captured one-token step (andrea/sampling.py's InferenceModel, as the audit runs it) and PyTorch's
static-cache step under torch.compile(mode="reduce-overhead") (bench/torch_generate.py), each replayed
--tokens times back to back after a prompt of --prompt tokens.

    python3 bench/decode_profile.py [--models ANDREA-120M] [--rows 1 16] [--runners ours torch]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_bench import MODELS  # noqa: E402
from kernel_profile import profile_kernels  # noqa: E402

from andrea.model import init_weights  # noqa: E402


def ours(name: str, cfg, rows: int, prompt: int, tokens: int, top: int) -> None:
    import cupy as cp

    from andrea.sampling import InferenceModel

    m = InferenceModel(cfg, init_weights(cfg, seed=0), backend="cupy")
    m.reset(rows)
    m.forward(np.zeros((rows, prompt), dtype=np.int64))
    m.forward(np.ones((rows, 1), dtype=np.int64))  # captured here
    st = m._now
    for _ in range(3):
        st.step()
    cp.cuda.Device().synchronize()

    def run():
        for _ in range(tokens):
            st.step()  # the position advances on the device; the host's copy is not read here
        cp.cuda.Device().synchronize()

    profile_kernels(run, tokens, f"ours {name} rows={rows}", "token", top)


def torch_compiled(name: str, cfg, rows: int, prompt: int, tokens: int, top: int) -> None:
    import torch
    from torch_generate import TorchDecoder

    dec = TorchDecoder(cfg, init_weights(cfg, seed=0), batch=rows, device="cuda", dtype=torch.bfloat16,
                       compile=True)
    ids = dec.prefill(torch.zeros((rows, prompt), dtype=torch.long, device="cuda")).argmax(-1)
    for _ in range(5):  # compiled and recorded here
        ids = dec.step(ids).argmax(-1)
    torch.cuda.synchronize()

    def run():
        nonlocal ids
        for _ in range(tokens):
            ids = dec.step(ids).argmax(-1)

    profile_kernels(run, tokens, f"torch compiled {name} rows={rows}", "token", top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-120M"], choices=list(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--runners", nargs="+", default=["ours", "torch"], choices=["ours", "torch"])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    for name in args.models:
        for rows in args.rows:
            for runner in args.runners:
                (ours if runner == "ours" else torch_compiled)(name, MODELS[name], rows, args.prompt, args.tokens, args.top)


if __name__ == "__main__":
    main()
