"""The trainer end to end against the engine alone, on one GPU (issue: train for real, benchmark b).

Engine alone: andrea.optim.launch_step over batches made beforehand, each step's results read after
the next is launched (the gpu_bench.py loop).
Trainer: andrea.trainer.Trainer, the real run loop (the bandit drawing rows, windows cut from
memory-mapped shards, the next batch prepared in a background thread, observe, loss records,
tokens/s), on synthetic shards where one source holds 1,000,000 documents and is always in the
mix (floor 0.5) beside four sources of 20,000. Checkpoints, samples and validation are moved out
of the timed window, then measured separately in the same run and reported as a share of the
training time at the shipped defaults (checkpoint_every, sample_every, eval_every of config/config.yaml).

Both are timed per step as the user waits for it (wall clock between consecutive steps); the median
of the steps after warm-up counts, and the mean is printed beside it. Prints a Markdown table, writes
JSON with --out.

    python3 bench/trainer_vs_engine.py --out trainer_vs_engine.json
    python3 bench/trainer_vs_engine.py --models ANDREA-12M --batches 8 --steps 200
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from andrea.config import load_config, train_settings  # noqa: E402
from andrea.io import sha256_file, write_json_atomic  # noqa: E402
from andrea.model import ModelConfig  # noqa: E402
from andrea.runlog import read_records  # noqa: E402
from andrea.shards import SHARD_FORMAT, shard_paths  # noqa: E402
from andrea.tokenizer import SEGMENTS_FORMAT, tokenizer_hash  # noqa: E402

BIG_DOCS = 1_000_000
SMALL = {f"small-{i}": 20_000 for i in range(4)}
TOKEN_MAX = 4353  # token IDs valid for every model's vocabulary


def write_source(d: Path, name: str, n_docs: int, rng) -> tuple[Path, Path, int]:
    lengths = rng.integers(20, 200, n_docs).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<u8")
    tokens = rng.integers(0, TOKEN_MAX, int(offsets[-1]), dtype=np.uint16)
    tokens[offsets[:-1].astype(np.int64)] = 256
    p = shard_paths(d, name)
    tokens.astype("<u2").tofile(p["tokens"])
    offsets.tofile(p["offsets"])
    return p["tokens"], p["offsets"], int(offsets[-1])


def model_shards(root: Path, data: dict, model: str, vocab: int) -> Path:
    """shards.json for `model`: a segments file of the model's vocabulary size and the shared
    token files under manifests naming its tokenizer."""
    d = root / model
    d.mkdir(parents=True, exist_ok=True)
    segs = [f"seg{i:05d}" for i in range(vocab - 257)]
    th = tokenizer_hash(segs, vocab)
    write_json_atomic(d / "harris_segments.json", {"format": SEGMENTS_FORMAT, "vocab_size": vocab, "tokenizer_hash": th,
                                                   "segments": [{"text": s, "count": 1} for s in segs]})
    counts = {}
    for name, (tok, off, n_tok, n_docs, sha) in data.items():
        p = shard_paths(d, name)
        for src, dst in ((tok, p["tokens"]), (off, p["offsets"])):
            if not dst.exists():
                os.symlink(src, dst)
        write_json_atomic(p["manifest"], {"format": SHARD_FORMAT, "source": name, "tokenizer_hash": th, "vocab_size": vocab,
                                          "n_docs": n_docs, "n_tokens": n_tok, "tokens_sha256": sha[0], "offsets_sha256": sha[1]})
        counts[name] = {"n_docs": n_docs, "n_tokens": n_tok}
    out = d / "shards.json"
    write_json_atomic(out, {"model": model, "shard_dir": str(d), "tokenizer_hash": th, "segments": str(d / "harris_segments.json"),
                            "sources": counts})
    return out


def bench_config(base: dict, model: str, B: int, steps: int) -> dict:
    cfg = copy.deepcopy(base)
    cfg["sources"] = {"big": {"adapter": "plaintext", "location": "synthetic", "weight": 1.0, "floor": 0.5, "cap": 1.0, "enabled": True}}
    for name in SMALL:
        cfg["sources"][name] = {"adapter": "plaintext", "location": "synthetic", "weight": 1.0, "floor": 0.0, "cap": 1.0, "enabled": True}
    cfg["curriculum"]["warmup_sources"] = ["big", *SMALL]
    cfg["curriculum"]["mode"] = "bandit"  # what its BENCHMARKS figures measured: the mode with the most work per step
    far = 10**9  # periodic work outside the timed window (measured on its own below)
    cfg["train"][model] = {**cfg["train"].get(model, {}), "batch_size": B, "max_steps": steps, "warmup_steps": 10,
                           "checkpoint_every": far, "sample_every": far, "eval_every": far, "backend": "auto", "precision": "auto"}
    return cfg


def engine_alone(model: str, cfg: ModelConfig, B: int, T: int, steps: int, warm: int) -> list[float]:
    from dataclasses import asdict

    from andrea.engine import Engine, resolve_backend
    from andrea.engine.fp8_records import TrainShape
    from andrea.optim import OptimConfig, StepsInFlight, launch_step

    # what the trainer picks too (precision auto: fp8 where the fp8 record says so for this model and batch)
    backend, precision, _ = resolve_backend("auto", "auto", shape=TrainShape(model, asdict(cfg), B, T))
    e = Engine(cfg, batch_size=B, seq_len=T, backend=backend, precision=precision)
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(16):
        x = rng.integers(0, TOKEN_MAX, (B, T + 1))
        batches.append([(x[:, :-1], x[:, 1:])])
    oc = OptimConfig(lr=3e-4, warmup_steps=10, max_steps=steps + warm)
    times = []
    t_last = time.perf_counter()
    in_flight = StepsInFlight(e)  # each step read after the next is launched, as the trainer reads them
    for i in range(warm + steps):
        in_flight.push(launch_step(e, batches[i % len(batches)], i, oc))
        now = time.perf_counter()
        times.append(now - t_last)
        t_last = now
    in_flight.drain()
    del e
    return times[warm:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["ANDREA-12M", "ANDREA-120M"])
    ap.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    ap.add_argument("--steps", type=int, default=150, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=15, help="steps not timed (compilation, graph capture, first batches)")
    ap.add_argument("--workdir", type=Path, help="where the synthetic shards go (default: a temporary directory)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from andrea.evaluation import build_eval_set, evaluate
    from andrea.trainer import Trainer

    base = load_config(REPO / "config" / "config.yaml")
    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    root = Path(tmp.name) if tmp else args.workdir
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    data = {}
    for name, n in {"big": BIG_DOCS, **SMALL}.items():
        tok, off, n_tok = write_source(root, name, n, rng)
        data[name] = (tok, off, n_tok, n, (sha256_file(tok), sha256_file(off)))
    print(f"synthetic shards: {sum(v[3] for v in data.values()):,} documents, {sum(v[2] for v in data.values()):,} tokens "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    rows = []
    for model in args.models:
        mcfg = ModelConfig.from_config(base["models"][model])
        shards_json = model_shards(root, data, model, mcfg.vocab_size)
        for B in args.batches:
            T = mcfg.context
            tokens = B * T
            eng = engine_alone(model, mcfg, B, T, args.steps, args.warmup)
            gc.collect()
            cfg = bench_config(base, model, B, args.warmup + args.steps)
            run_dir = root / f"run-{model}-{B}"
            tr = Trainer(cfg, model, shards_json, run_dir)
            print(f"{model} B={B}: backend {tr.backend}/{tr.precision} ({tr.backend_reason})", flush=True)
            tr.run()
            recs = read_records(run_dir / "loss.jsonl")  # the mix as shares, whichever format wrote it
            trainer_tps = [r["tokens_per_s"] for r in recs if r.get("kind", "train") == "train"][args.warmup:]
            big_share = float(np.mean([r["mix"].get("big", 0.0) for r in recs if "mix" in r]))
            # the periodic work at the shipped defaults, measured on this engine
            defaults = train_settings(base, model)
            t = time.perf_counter()
            arrays = tr._host_copy()
            ckpt_sync = time.perf_counter() - t  # what the step loop waits for (the rest is written in the background)
            tr.checkpoints.write(tr.ckpt_dir / "step_999999.bin", tr.step, arrays, tr._state("step_999999.bin"), "benchmark")
            ckpt_total = time.perf_counter() - t
            es = build_eval_set(tr.shards, defaults["curriculum"]["heldout_every"], T, defaults["eval_tokens"], tr.tok.token_bytes)
            ev = evaluate(tr.engine, es)
            t = time.perf_counter()
            tr.sample()
            sample_s = time.perf_counter() - t
            step_s = tokens / float(np.median(trainer_tps))
            share = {
                "checkpoint": ckpt_sync / (defaults["checkpoint_every"] * step_s),
                "validation": ev["seconds"] / (defaults["eval_every"] * step_s),
                "sample": sample_s / (defaults["sample_every"] * step_s),
            }
            row = {
                "model": model, "B": B, "T": T,
                "engine_tok_s": tokens / float(np.median(eng)), "engine_mean_tok_s": tokens * len(eng) / float(np.sum(eng)),
                "trainer_tok_s": float(np.median(trainer_tps)),
                "trainer_mean_tok_s": tokens * len(trainer_tps) / float(np.sum([tokens / x for x in trainer_tps])),
                "big_source_share": big_share,
                "checkpoint_s": {"host_copy": ckpt_sync, "written": ckpt_total},
                "validation_s": ev["seconds"], "validation_tokens": ev["tokens"], "sample_s": sample_s,
                "defaults": {k: defaults[k] for k in ("checkpoint_every", "eval_every", "sample_every", "eval_tokens", "sample_tokens")},
                "periodic_share_at_defaults": share,
            }
            row["ratio"] = row["trainer_tok_s"] / row["engine_tok_s"]
            rows.append(row)
            print(f"{model} B={B}: engine {row['engine_tok_s']:,.0f} tok/s, trainer {row['trainer_tok_s']:,.0f} "
                  f"({row['ratio']:.1%}); mean {row['engine_mean_tok_s']:,.0f} / {row['trainer_mean_tok_s']:,.0f}; "
                  f"1M-doc source {big_share:.0%} of rows; periodic at defaults: "
                  + ", ".join(f"{k} {v:.1%}" for k, v in share.items()), flush=True)
            tr_backend = tr.backend
            if tr_backend == "cupy":
                tr.engine.be.release()  # its scratch, weight copy and cuBLAS workspace
            del tr
            gc.collect()
            if tr_backend == "cupy":
                import cupy as cp

                cp.get_default_memory_pool().free_all_blocks()
    print("\n| model | B | engine alone tok/s | trainer tok/s | trainer / engine | checkpoint | validation | sample |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["periodic_share_at_defaults"]
        print(f"| {r['model']} | {r['B']} | {r['engine_tok_s']:,.0f} | {r['trainer_tok_s']:,.0f} | {r['ratio']:.1%} | "
              f"{s['checkpoint']:.1%} | {s['validation']:.1%} | {s['sample']:.1%} |")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
