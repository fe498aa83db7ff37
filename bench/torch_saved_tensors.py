"""What PyTorch keeps for the backward pass (bench/torch_reference.py's model under bf16 autocast),
eager and through torch.compile: every tensor autograd saves, through saved_tensors_hooks, summed by
shape and type. Set beside bench/memory_breakdown.py's list of our buffers, it shows which
activations the two engines keep. Runs on the CPU (autocast bf16) or a GPU.

    python3 bench/torch_saved_tensors.py --layers 2 --batch 2 --seq 256
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from torch_reference import torch_model  # noqa: E402

from andrea.model import ModelConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=4353)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_head=args.heads, n_layer=args.layers, context=args.seq)
    B, T, d = args.batch, args.seq, args.d_model
    print(f"{device}, torch {torch.__version__}: d={d}, layers={args.layers}, B={B}, T={T}; bytes per token in units of d")
    for compiled in (False, True):
        torch.manual_seed(0)
        model = torch_model(cfg).to(device)
        run = torch.compile(model) if compiled else model
        x = torch.randint(0, cfg.vocab_size, (B, T + 1), device=device)
        saved = collections.Counter()

        def pack(t):
            saved[(tuple(t.shape), str(t.dtype).removeprefix("torch."))] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast(device, dtype=torch.bfloat16):
            loss = run(x[:, :-1], x[:, 1:])
        loss.backward()
        print(f"\n## {'torch.compile' if compiled else 'eager'}: {sum(saved.values()) / 2**20:.2f} MiB saved\n")
        print("| shape | type | MiB | bytes per token / d |\n|---|---|---|---|")
        for (shape, dt), n in sorted(saved.items(), key=lambda kv: -kv[1]):
            if n >= B * T * 4:  # activations and weight copies, not per-channel vectors
                print(f"| {shape} | {dt} | {n / 2**20:.3f} | {n / (B * T) / d:.1f} |")


if __name__ == "__main__":
    main()
