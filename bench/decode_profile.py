"""Where one decoded token's GPU time goes, kernel by kernel (torch.profiler, as bench/kernel_profile.py):
our captured one-token step as generate_rows runs it (andrea/sampling.py: the step samples its
next token on the device and feeds it back) and PyTorch's static-cache step under
torch.compile(mode="reduce-overhead") (bench/torch_generate.py) followed by its token pick on the
device, each run --tokens times back to back after a prompt of --prompt tokens. --temperature 0:
greedy; else top-k 40, top-p 0.95 (the audit's settings; default 0.8).

    python3 bench/decode_profile.py [--models ANDREA-120M] [--rows 1 16] [--runners ours torch] [--temperature 0.8]
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


def ours(name: str, cfg, rows: int, prompt: int, tokens: int, top: int, temperature: float) -> None:
    import cupy as cp

    from andrea.sampling import InferenceModel

    m = InferenceModel(cfg, init_weights(cfg, seed=0), backend="cupy")
    m.sample(np.zeros(prompt, dtype=np.int64), 4, list(range(rows)), temperature, 40, 0.95, stop_at_bos=False)  # captured here
    step = m._sampling_step((float(temperature), 40, 0.95))
    for _ in range(3):
        step()
    cp.cuda.Device().synchronize()

    def run():
        for _ in range(tokens):
            step()  # the position advances and the token is fed back on the device
        cp.cuda.Device().synchronize()

    profile_kernels(run, tokens, f"ours {name} rows={rows} temperature={temperature}", "token", top)


def torch_compiled(name: str, cfg, rows: int, prompt: int, tokens: int, top: int, temperature: float) -> None:
    import torch
    from torch_generate import TorchDecoder, pick

    dec = TorchDecoder(cfg, init_weights(cfg, seed=0), batch=rows, device="cuda", dtype=torch.bfloat16,
                       compile=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = pick(dec.prefill(torch.zeros((rows, prompt), dtype=torch.long, device="cuda")), temperature, 40, 0.95, gen)
    for _ in range(5):  # compiled and recorded here
        ids = pick(dec.step(ids), temperature, 40, 0.95, gen)
    torch.cuda.synchronize()

    def run():
        nonlocal ids
        for _ in range(tokens):
            ids = pick(dec.step(ids), temperature, 40, 0.95, gen)

    profile_kernels(run, tokens, f"torch compiled {name} rows={rows} temperature={temperature}", "token", top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-120M"], choices=list(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--runners", nargs="+", default=["ours", "torch"], choices=["ours", "torch"])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()
    for name in args.models:
        for rows in args.rows:
            for runner in args.runners:
                (ours if runner == "ours" else torch_compiled)(name, MODELS[name], rows, args.prompt, args.tokens, args.top,
                                                             args.temperature)


if __name__ == "__main__":
    main()
