#!/usr/bin/env bash
# The same GPU benchmark on the commit before a change and on this tree, in one device call,
# taking turns (before, after, before, after), then one table of medians and ratios.
#
#   git archive -o .device/before.tar COMMIT                      (here: the tree before the change)
#   bash bench/before_after.sh .device/before.tar [gpu_bench.py arguments]      (on the GPU machine)
#
# Each side runs bench/gpu_bench.py of its own tree without PyTorch (the PyTorch reference is a
# separate run of this tree's gpu_bench.py); JSON per run and the table go to $OUT. Both sides get
# --steps 20 unless the arguments say otherwise (the default round length changed from 10 steps
# to 20 on 2026-12-01, so two trees' defaults may differ).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-results/device-out}")
mkdir -p "$OUT"
BEFORE=$(mktemp -d)
tar xf "$1" -C "$BEFORE"
shift
for round in 1 2; do
  for side in before after; do
    dir=$([ "$side" = before ] && echo "$BEFORE" || pwd)
    (cd "$dir" && python3 bench/gpu_bench.py --steps 20 "$@" --no-torch --out "$OUT/bench-$side-$round.json") > "$OUT/bench-$side-$round.log" 2>&1 \
      || { tail -30 "$OUT/bench-$side-$round.log"; exit 1; }
    echo "$side round $round done"
  done
done
python3 - "$OUT" <<'PY' | tee "$OUT/before_after.md"
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {side: [json.loads(p.read_text()) for p in sorted(out.glob(f"bench-{side}-*.json"))] for side in ("before", "after")}
print("| model | B | precision | before tok/s (runs) | after tok/s (runs) | after / before |")
print("|---|---|---|---|---|---|")
for i, row in enumerate(runs["after"][0]):
    for key in [k for k in row if k.startswith("ours_")]:
        tok = {side: [rs[i][key]["tok_s"] for rs in runs[side] if key in rs[i]] for side in runs}
        if not tok["before"]:
            continue
        b, a = statistics.median(tok["before"]), statistics.median(tok["after"])
        fmt = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)  # noqa: E731
        print(f"| {row['model']} | {row['B']} | {key[5:]} | {b:,.0f} ({fmt(tok['before'])}) | {a:,.0f} ({fmt(tok['after'])}) | {a / b:.3f} |")
PY
