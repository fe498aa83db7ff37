"""Generation speed on one GPU: ANDREA's cached decoding against the best plain PyTorch loop.

    python3 bench/generate_bench.py [--models ANDREA-12M ANDREA-120M] [--new 200] [--rows 1 16] [--out r.json]

For each model (random weights; the speed does not depend on them): a prompt of --prompt tokens,
then --new tokens decoded greedily (or sampled: --temperature 0.8, with top-k 40 and top-p 0.95,
the audit's settings), median of --rounds after a warm-up. Ours: `generate_rows`
(andrea/sampling.py) as the audit and the trainer's samples run it: the token chosen on the device
and fed to the next step, the host reading the picks a chunk behind; "bf16 graph" replays the
captured one-token step (the default on a GPU), "bf16 eager" launches its kernels one by one, "fp32
eager" is the generation path before the 16-bit decode kernels. --host-picks: the logits of each
step to the host and the token chosen there (top-k off, sample_next: the path before the device
sampler). PyTorch (bench/torch_generate.py, when it is there): a static KV cache in bf16, eager and
torch.compile(mode="reduce-overhead"), the token chosen on the device (argmax, or topk + softmax
+ multinomial run eagerly, as Hugging Face's generate does; when sampling, also the same pick by
the Gumbel-max trick compiled into a CUDA graph of its own). Tokens/s counts new tokens of all rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_bench import MODELS  # noqa: E402

from andrea.model import init_weights  # noqa: E402


def ours(cfg, w, precision: str, graphs: bool, rows: int, prompt, new: int, rounds: int, temperature: float = 0.0,
         top_k: int | None = 40) -> dict:
    import cupy as cp

    from andrea.sampling import InferenceModel, generate_rows

    m = InferenceModel(cfg, w, backend="cupy", precision=precision, graphs=graphs)

    def run():
        rngs = [np.random.default_rng(k) for k in range(rows)]
        t0 = time.perf_counter()
        out = generate_rows(m, prompt, new, rngs, temperature=temperature, top_k=top_k, top_p=0.95, stop_at_bos=False)
        cp.cuda.Device().synchronize()
        assert all(len(r) == new for r in out)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    run()
    warm = time.perf_counter() - t0
    times = sorted(run() for _ in range(rounds))
    med = times[len(times) // 2]
    return {"tokens_per_s": new * rows / med, "ms_per_token": med / new * 1e3, "rounds_s": times, "warmup_s": warm}


def profile(cfg, w, new: int) -> dict:
    """Where a token's time goes (one row, bf16): the captured step replayed back to back with one
    sync at the end (the GPU's own time per token), replayed and waited for one at a time, and the
    whole InferenceModel.forward (token upload, replay, logits to the host)."""
    import cupy as cp

    from andrea.sampling import InferenceModel

    m = InferenceModel(cfg, w, backend="cupy")
    out = {}
    for label in ("forward", "replay, sync each", "replay back to back"):
        m.reset()
        m.forward(np.arange(8))
        m.forward([1])  # captured here
        st, n = m._now, min(new, cfg.context - 10)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            if label == "forward":
                m.forward([1])
            else:
                st.step()
                if label == "replay, sync each":
                    cp.cuda.get_current_stream().synchronize()
        cp.cuda.Device().synchronize()
        out[label] = (time.perf_counter() - t0) / n * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-12M", "ANDREA-120M"])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=200)
    ap.add_argument("--rows", nargs="+", type=int, default=[1])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); else top-k 40, top-p 0.95")
    ap.add_argument("--host-picks", action="store_true", help="also ours with each token chosen on the host (top-k off)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--profile", action="store_true", help="only split one token's time (ours, one row)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.host_picks and args.temperature <= 0:
        ap.error("--host-picks needs --temperature above 0 (greedy picks are made on the device whatever top-k is)")
    if args.profile:
        for name in args.models:
            cfg = MODELS[name]
            print(name, "ms per token:", {k: round(v, 3) for k, v in profile(cfg, init_weights(cfg, seed=0), args.new).items()})
        return
    results = []
    for name in args.models:
        cfg = MODELS[name]
        w = init_weights(cfg, seed=0)
        prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, args.prompt).tolist()
        for rows in args.rows:
            variants = [("ours bf16 graph", "bf16", True, 40), ("ours bf16 eager", "bf16", False, 40)]
            if rows == 1:
                variants.append(("ours fp32 eager", "fp32", False, 40))
            if args.host_picks:
                variants.append(("ours bf16 graph, host picks", "bf16", True, None))
            for label, precision, graphs, top_k in variants:
                r = ours(cfg, w, precision, graphs, rows, prompt, args.new, args.rounds, args.temperature, top_k)
                results.append({"model": name, "rows": rows, "variant": label, **r})
                print(json.dumps(results[-1]), flush=True)
            if args.no_torch:
                continue
            try:
                import torch
                from torch_generate import generate_tokens_per_s
            except ImportError as e:
                print(f"PyTorch baseline skipped: {e}", flush=True)
                continue
            runs = [(False, False, "torch bf16 eager"), (True, False, "torch bf16 compile")]
            if args.temperature > 0:
                runs.append((True, True, "torch bf16 compile, sampler compiled"))
            for compiled, compiled_pick, label in runs:
                try:
                    r = generate_tokens_per_s(cfg, w, "cuda", torch.bfloat16, compiled, prompt_len=args.prompt,
                                              new_tokens=args.new, batch=rows, rounds=args.rounds,
                                              temperature=args.temperature, compiled_pick=compiled_pick)
                except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
                    print(f"{label} failed: {type(e).__name__}: {e}", flush=True)
                    continue
                results.append({**r, "model": name, "rows": rows, "variant": label})
                print(json.dumps(results[-1]), flush=True)
    print("\n| model | rows | variant | tokens/s | ms/token | warm-up s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['rows']} | {r['variant']} | {r['tokens_per_s']:,.0f} | {r['ms_per_token']:.3f} | "
              f"{r.get('warmup_s', float('nan')):.2f} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
