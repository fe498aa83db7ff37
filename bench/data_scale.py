"""Scale benchmark for the data stages (issue: Foundation, item 9).

Synthesises a Hermes-3-sized ShareGPT JSONL file locally (~600K conversations, with system
prompts, system-prompt-shaped user turns, duplicates and malformed lines in realistic
proportions), then runs pull_hermes3 (from the local file), prep_megachat and filter_shape on it,
each as its own process, and reports wall time and peak resident memory per stage.

    python bench/data_scale.py                      # 600K conversations under /tmp/andrea-scale
    python bench/data_scale.py --n 50000 --keep     # smaller, keep the files
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from andrea.shape import has_system_prompt_shape, labelled_set  # noqa: E402


def sentence_pool() -> list[str]:
    """Real sentences from the embedded corpus, to build conversations from."""
    text = []
    corpus = REPO / "andrea" / "corpus"
    for p in sorted(corpus.rglob("*")):
        if p.suffix in (".txt", ".md"):
            text.append(p.read_text())
        elif p.suffix == ".jsonl":
            for line in p.read_text().splitlines():
                row = json.loads(line)
                for t in row.get("conversations") or row.get("messages") or []:
                    text.append(t.get("value") or t.get("content") or "")
    sents = re.split(r"(?<=[.!?])\s+", " ".join(text))
    # Only ordinary sentences: system-prompt-shaped text is injected on purpose, in known amounts.
    return [s.strip() for s in sents if 20 <= len(s.strip()) <= 400 and not has_system_prompt_shape(s)]


def synthesise(path: Path, n: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    sents = sentence_pool()
    shaped = [it.text for it in labelled_set() if it.label]
    cats = ["general"] * 70 + ["creative_writing"] * 15 + ["roleplay"] * 15
    stats = {"conversations": n, "malformed": 0, "duplicates": 0, "system_prompts": 0, "shaped_user_turns": 0}
    prev = None
    t0 = time.time()
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            r = rng.random()
            if r < 0.005:
                fh.write('{"conversations": [{"from": "human", "value": "truncated\n')
                stats["malformed"] += 1
                continue
            if r < 0.015 and prev is not None:
                fh.write(prev)
                stats["duplicates"] += 1
                continue
            conv = []
            if rng.random() < 0.15:
                conv.append({"from": "system", "value": rng.choice(shaped)})
                stats["system_prompts"] += 1
            for k in range(rng.choice((1, 1, 1, 2, 2, 3))):
                if k == 0 and rng.random() < 0.02:
                    user = rng.choice(shaped)
                    stats["shaped_user_turns"] += 1
                else:
                    user = " ".join(rng.sample(sents, rng.randint(1, 3)))
                answer = " ".join(rng.sample(sents, rng.randint(2, 9))) + f" ({i}.{k})"
                conv += [{"from": "human", "value": user}, {"from": "gpt", "value": answer, "weight": 1.0}]
            prev = json.dumps({"id": f"syn-{i}", "category": rng.choice(cats), "conversations": conv}) + "\n"
            fh.write(prev)
    stats["bytes"] = path.stat().st_size
    stats["seconds"] = round(time.time() - t0, 1)
    return stats


CHILD = (
    "import resource, sys; from andrea.cli import main; rc = main(sys.argv[1:]); "
    "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)


def run_stage(args: list[str]) -> dict:
    """Run one `andrea` stage in a fresh process; its wall time and peak RSS (the larger of the
    stage process and any worker it started)."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=REPO, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"stage {args[0]} failed:\n{proc.stderr[-3000:]}")
    rss = [line.split()[1:] for line in proc.stderr.splitlines() if line.startswith("MAXRSS_KB")][-1]
    return {"stdout": proc.stdout.strip().splitlines()[-1], "wall_s": round(wall, 1), "peak_rss_mb": round(max(map(int, rss)) / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600_000, help="conversations to synthesise (default %(default)s)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/andrea-scale"))
    ap.add_argument("--keep", action="store_true", help="keep the synthetic input and results")
    args = ap.parse_args()

    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    src = work / "hermes3-synthetic.jsonl"
    print(f"synthesising {args.n} conversations into {src} ...", flush=True)
    syn = synthesise(src, args.n)
    print(f"  {syn['bytes'] / 1e6:.0f} MB in {syn['seconds']} s: {syn}", flush=True)

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(work / "results")
    cfg["hermes3"]["location"] = str(src)
    cfg["sources"]["repo-commits"]["location"] = str(REPO)
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))

    rows = []
    for stage in ("pull-hermes3", "prep-megachat", "filter-shape"):
        r = run_stage([stage, "--config", str(cfg_path)])
        rows.append({"stage": stage, "wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"], "out": r["stdout"]})
        print(f"  {stage:14s} {r['wall_s']:7.1f} s   peak RSS {r['peak_rss_mb']:6d} MB", flush=True)

    out_dirs = {r["stage"]: Path(r["out"]) for r in rows}
    pull = json.loads((out_dirs["pull-hermes3"] / "manifest.json").read_text())["counts"]
    prep = json.loads((out_dirs["prep-megachat"] / "manifest.json").read_text())["counts"]
    filt = json.loads((out_dirs["filter-shape"] / "report.json").read_text())["totals"]
    total = sum(r["wall_s"] for r in rows)
    print()
    print("| stage | wall time (s) | peak RSS (MB) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['stage']} | {r['wall_s']} | {r['peak_rss_mb']} |")
    print(f"| **total** | **{total:.1f}** | **{max(r['peak_rss_mb'] for r in rows)}** |")
    print()
    print(f"input: {syn['conversations']} conversations, {syn['bytes'] / 1e6:.0f} MB JSONL; "
          f"pull kept {pull['kept']}, skipped {pull['skipped_total']} {pull['skipped']}; "
          f"prep documents {prep['documents']}; filter kept {filt['kept']}, dropped by shape {filt['dropped_shape']}, "
          f"system turns removed {filt['system_turns_removed']}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
