"""The trainer's data path on the CPU (issue: train for real, benchmark a): drawing a 32-row batch
from sources totalling 1M documents and cutting its windows from memory-mapped token shards.

Builds synthetic shards in a temporary directory (one source of 1,000,000 short documents and 12
sources of 20,000), then times, per batch of 32 rows × 1,025 tokens:
  - the bandit's draw alone (source choice + next document of each source's epoch order),
  - draw + gather (what the prefetch thread does before engine.prepare),
  - the draw as it was before (a permutation of the whole source built for every row), for scale.
Prints a Markdown table (median, 99th percentile, max in ms) and writes JSON with --out.

    python3 bench/sampler_cpu.py [--batches 2000] [--out sampler.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from andrea.batches import BatchStream  # noqa: E402
from andrea.config_schema import load_schema  # noqa: E402
from andrea.curriculum import Bandit  # noqa: E402
from andrea.shards import SHARD_FORMAT, Shard, shard_paths  # noqa: E402
from andrea.io import sha256_file, write_json_atomic  # noqa: E402

# the schema's curriculum defaults (every setting a mode reads), as the bandit without a warm-up
CC = {**{k: v["default"] for k, v in load_schema()["properties"]["curriculum"]["properties"].items() if "default" in v},
      "mode": "bandit", "warmup_steps": 0, "warmup_sources": []}


def synthetic_shard(d: Path, name: str, n_docs: int, rng) -> Shard:
    lengths = rng.integers(20, 400, n_docs).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<u8")
    tokens = rng.integers(0, 4353, int(offsets[-1]), dtype=np.uint16)
    tokens[offsets[:-1].astype(np.int64)] = 256  # each document led by BOS
    p = shard_paths(d, name)
    tokens.astype("<u2").tofile(p["tokens"])
    offsets.tofile(p["offsets"])
    write_json_atomic(p["manifest"], {"format": SHARD_FORMAT, "source": name, "tokenizer_hash": "synthetic", "vocab_size": 4353,
                                      "n_docs": n_docs, "n_tokens": int(offsets[-1]),
                                      "tokens_sha256": sha256_file(p["tokens"]), "offsets_sha256": sha256_file(p["offsets"])})
    return Shard(d, name, verify_hash=False)


def stats(ts: list[float]) -> dict:
    a = np.array(ts) * 1e3
    return {"median_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        shards = {"big": synthetic_shard(Path(tmp), "big", 1_000_000, rng)}
        for i in range(12):
            shards[f"s{i}"] = synthetic_shard(Path(tmp), f"s{i}", 20_000, rng)
        total = sum(s.n_docs for s in shards.values())
        bandit = Bandit({k: {"n_docs": v.n_docs} for k, v in shards.items()}, CC, seed=0)
        bandit.replan(0)
        bandit.weights = {k: (0.5 if k == "big" else 0.5 / 12) for k in shards}  # the big source in every batch
        stream = BatchStream(bandit, shards, np.random.default_rng(1), args.rows, 1, args.seq, prefetch=False)
        draw, full = [], []
        for i in range(args.batches):
            t0 = time.perf_counter()
            rows = bandit.draw(args.rows, stream.rng)
            draw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            stream.make(i)
            full.append(time.perf_counter() - t0)
        # before: a permutation of the whole source for every row drawn from it
        old = []
        for _ in range(20):
            t0 = time.perf_counter()
            for src, _ in rows:
                np.random.default_rng([0, 0, 1, len(src)]).permutation(shards[src].n_docs)
            old.append(time.perf_counter() - t0)
    res = {"documents": total, "rows": args.rows, "seq_len": args.seq, "batches": args.batches,
           "draw": stats(draw), "draw_and_gather": stats(full), "draw_before": stats(old)}
    print(f"{total:,} documents in 13 sources; {args.batches} batches of {args.rows} rows × {args.seq + 1} tokens\n")
    print("| what | median ms | p99 ms | max ms |\n|---|---|---|---|")
    for k in ("draw", "draw_and_gather", "draw_before"):
        r = res[k]
        print(f"| {k.replace('_', ' ')} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} | {r['max_ms']:.3f} |")
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
