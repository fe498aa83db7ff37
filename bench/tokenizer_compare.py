"""Harris tokenizer vs a Hugging Face `tokenizers` byte-level BPE, side by side on the same text.

Both are trained on the same curriculum-weighted sample with the same vocabulary size
(256 bytes + N + 1), then compared on:
  (a) bytes per token on held-out documents,
  (b) single-thread encode throughput (MB/s) on the same documents,
  (c) wall time to encode the whole filtered corpus with all cores.

The corpus is the data pipeline's output on the embedded corpus plus the whole standard-library
docstring source (several MB of real English), built in a scratch directory.

    python bench/tokenizer_compare.py                    # N = 4096 (ANDREA-12M)
    python bench/tokenizer_compare.py --n 8192
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build_corpus(work: Path):
    from andrea.config import load_config
    from andrea.filter import filter_shape
    from andrea.hermes3 import pull_hermes3
    from andrea.megachat import prep_megachat

    cfg = load_config(REPO / "config" / "config.yaml", overrides={"results_dir": str(work)})
    cfg["sources"]["repo-docstrings"]["max_docs"] = None
    cfg["sources"]["repo-commits"]["location"] = str(REPO)
    pull_hermes3(cfg["hermes3"], work / "pull", "bench")
    prep_megachat(cfg, work / "prep", "bench", pull_dir=work / "pull")
    filter_shape(work / "prep" / "megachat.parquet", work / "filter", cfg["filter_shape"], "bench", workers=os.cpu_count() or 1)
    return cfg, work / "filter" / "megachat.parquet"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="segments N (vocabulary 256 + N + 1)")
    args = ap.parse_args()

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from andrea.io import setup_logging
    from andrea.megachat import iter_megachat, render_document
    from andrea.shards import encode_shards
    from andrea.tokenizer import HarrisTokenizer, curriculum_sample, train_tokenizer
    from andrea.versions import enabled_sources

    setup_logging()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg, megachat = build_corpus(work)
        corpus = [render_document(r["turns"], r["text"], cfg["megachat"]) for r in iter_megachat(megachat)]
        corpus_mb = sum(len(t.encode("utf-8")) for t in corpus) / 1e6
        tcfg = cfg["tokenizer"]
        weights = {k: v["weight"] for k, v in cfg["sources"].items() if v["enabled"]}
        sample = curriculum_sample(megachat, weights, tcfg["sample_chars"], tcfg["heldout_fraction"], cfg["megachat"])
        heldout = sample.heldout
        heldout_mb = sum(len(t.encode("utf-8")) for t in heldout) / 1e6
        print(f"corpus {len(corpus)} documents, {corpus_mb:.1f} MB; sample {len(sample.texts)} documents; "
              f"held-out {len(heldout)} documents, {heldout_mb:.2f} MB", flush=True)

        # --- train both on the same sample
        t0 = time.time()
        train_tokenizer(megachat, work / "harris", args.n, cfg, "bench")
        harris_train = time.time() - t0
        harris = HarrisTokenizer.load(work / "harris" / "harris_segments.json")

        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=256 + args.n + 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        t0 = time.time()
        bpe.train_from_iterator(sample.texts, trainer)
        bpe_train = time.time() - t0

        # --- (a) bytes per token on held-out text
        h_tokens = sum(len(harris.encode(t)) for t in heldout)
        b_tokens = sum(len(e.ids) for e in bpe.encode_batch(heldout))
        held_bytes = heldout_mb * 1e6

        # --- (b) single-thread throughput on the same documents (the whole corpus, one by one)
        def best_of(fn, repeat=3):
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            return best

        h_single = best_of(lambda: [harris.encode(t) for t in corpus])
        b_single = best_of(lambda: [bpe.encode(t) for t in corpus])

        # --- (c) whole corpus with all cores: shards for ours, encode_batch (Rayon) for BPE
        t0 = time.time()
        encode_shards(megachat, work / "harris" / "harris_segments.json", work / "shards", enabled_sources(cfg), cfg["megachat"], "bench", workers=cores)
        h_all = time.time() - t0
        t0 = time.time()
        bpe.encode_batch(corpus)
        b_all = time.time() - t0

    rows = [
        ("vocabulary", f"{256 + args.n + 1}", f"{bpe.get_vocab_size()}"),
        ("training time on the sample (s)", f"{harris_train:.1f}", f"{bpe_train:.1f}"),
        ("(a) held-out bytes per token", f"{held_bytes / h_tokens:.3f}", f"{held_bytes / b_tokens:.3f}"),
        ("(b) single-thread encode (MB/s)", f"{corpus_mb / h_single:.2f}", f"{corpus_mb / b_single:.2f}"),
        (f"(c) whole corpus, {cores} cores (s)", f"{h_all:.2f} (shards written)", f"{b_all:.2f} (ids in memory)"),
    ]
    print()
    print(f"| N = {args.n} | Harris (ours) | HF byte-level BPE |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    print()
    print(f"single-thread speed ratio ours/BPE: {b_single / h_single:.2f}x; "
          f"held-out tokens ours/BPE: {h_tokens / b_tokens:.3f}")
    print(f"machine: {platform.machine()}, {cores} cores, Python {platform.python_version()}; "
          f"tokenizers {__import__('tokenizers').__version__}")


if __name__ == "__main__":
    main()
