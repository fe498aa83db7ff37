"""The curriculum's modes driven by synthetic losses on a real corpus's shard sizes, on the CPU in
seconds (issue 41: why does the bandit keep drawing a small source?). No model is trained: each
row's loss comes from a toy model of learning, the same for every source in its own epochs, so
what differs between sources is only what the curriculum sees of them: their documents, tokens,
floors and caps, and (with --dispersion unigram) how much their rows' losses vary.

Per source k, with e_k its token-epochs drawn so far (tokens drawn / its tokens) and M the tokens
drawn from all sources (transfer between them):

    training row loss   1 + 2·exp(−e_k/2) + 1.5·exp(−M/20M) + N(0, σ_k²)      keeps falling: memorised
    held-out bits/byte  (1 + 2·exp(−min(e_k, 3)/2) + 0.15·max(0, e_k − 3) + 1.5·exp(−M/20M)) / 2
                                                  stops improving after 3 epochs, then gets worse

σ_k is 0.3 nats for every source (--dispersion equal) or each source's row-to-row spread of the
loss under its own unigram distribution, measured on its shard (--dispersion unigram: a proxy of
how heterogeneous its rows are). Each mode runs with the config's floors, caps and curriculum
settings, B rows of T tokens a step, a validation every --eval-every steps (heldout_progress
reads it), for each seed; the table gives, per mode and source, the share of tokens drawn and the
token-epochs at the end, the epochs the bandit's penalty counts (row starts / documents), and how
often each source was in the bandit's focus. (The toy held-out curve feeds heldout_progress only:
its numbers say nothing about a real model, so they are not reported.)

    python3 bench/curriculum_sim.py --shards results/ANDREA-12M/shards.json \
        --configfile config/config.yaml data/real/real-corpus.yaml --steps 6000 20000 --warmup 3000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from andrea.config import deep_merge, read_config_file, train_settings, validate_config  # noqa: E402
from andrea.curriculum import make_curriculum  # noqa: E402
from andrea.evaluation import heldout_coverage  # noqa: E402
from andrea.io import write_text_atomic  # noqa: E402
from andrea.shards import Shard  # noqa: E402

# the arms of the issue: the modes, the bandit with flat weights (the "flat" arm), and the
# bandit with every floor at 0 (each names its mode: the config's default is proportional)
ARMS = {"bandit": {"mode": "bandit"}, "flat": {"mode": "bandit", "background_weight": 1.0, "coverage_bonus": 0.0},
        "bandit-no-floors": {"mode": "bandit", "floors": None},
        "proportional": {"mode": "proportional"}, "uniform": {"mode": "uniform"}, "fixed": {"mode": "fixed"},
        "exp3_loss": {"mode": "exp3_loss"}, "heldout_progress": {"mode": "heldout_progress"}}


def unigram_spread(shard: Shard, T: int, rows: int, rng) -> float:
    """Row-to-row standard deviation of a row's mean −log p(token) under the source's own unigram
    distribution, over `rows` random rows of T tokens (a proxy of how much its rows differ)."""
    tok = np.asarray(shard.tokens)
    counts = np.bincount(tok, minlength=int(tok.max()) + 1).astype(np.float64)
    nll = -np.log(np.maximum(counts, 1) / counts.sum())
    starts = rng.integers(0, shard.n_docs, rows)
    vals = [nll[shard.window(int(d), T)[0][1:]].mean() for d in starts]
    return float(np.std(vals))


def toy_heldout(e: float, m: float) -> float:
    return (1 + 2 * math.exp(-min(e, 3) / 2) + 0.15 * max(0.0, e - 3) + 1.5 * math.exp(-m / 20e6)) / 2


def simulate(arms: dict, cc: dict, tokens: dict, sigma: dict, steps: int, rows: int, T: int, eval_every: int, seed: int,
             validated: list[str]):
    c = make_curriculum(arms, cc, seed=seed, eval_every=eval_every)
    rng = np.random.default_rng([seed, 41])
    drawn = dict.fromkeys(arms, 0.0)
    focus = dict.fromkeys(arms, 0)  # phases (after the warm-up) each source was in the focus
    total = 0.0
    snapshots = {}
    for step in range(steps):
        if c.maybe_replan(step) and step >= cc["warmup_steps"]:
            for k in c.focus:
                focus[k] += 1
            focus["__phases__"] = focus.get("__phases__", 0) + 1
        for src, doc in c.draw(rows, rng):
            e = drawn[src] / tokens[src]
            loss = 1 + 2 * math.exp(-e / 2) + 1.5 * math.exp(-total / 20e6) + rng.normal(0, sigma[src])
            c.observe(src, doc, loss)
            drawn[src] += T
            total += T
        if (step + 1) % eval_every == 0:
            c.observe_validation(step + 1, {k: {"bpb": toy_heldout(drawn[k] / tokens[k], total)} for k in validated})
        snapshots[step + 1] = dict(drawn)
    phases = focus.pop("__phases__", 0)
    return c, snapshots, {k: v / max(1, phases) for k, v in focus.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", required=True, help="a model's shards.json (the sources' documents and tokens)")
    ap.add_argument("--configfile", nargs="+", required=True, help="config files, merged in order (floors, caps, curriculum)")
    ap.add_argument("--model", default="ANDREA-12M")
    ap.add_argument("--steps", type=int, nargs="+", default=[6000, 20000], help="report at these steps (the run goes to the last)")
    ap.add_argument("--rows", type=int, default=8, help="rows a step (batch_size)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3000, help="curriculum warm-up steps (the issue's runs: 3000)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--dispersion", choices=["equal", "unigram"], default="equal")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()

    raw = {}
    for f in args.configfile:
        raw = deep_merge(raw, read_config_file(f))
    config = validate_config(raw, source=" + ".join(args.configfile))
    meta = json.loads(Path(args.shards).read_text())
    shards = {k: Shard(meta["shard_dir"], k, verify_hash=False) for k, v in meta["sources"].items() if v["n_docs"] > 0}
    tokens = {k: float(s.n_tokens) for k, s in shards.items()}
    spec = {k: {"n_docs": s.n_docs, "n_tokens": s.n_tokens, "floor": config["sources"][k]["floor"],
                "cap": config["sources"][k]["cap"], "weight": config["sources"][k]["weight"]} for k, s in shards.items()}
    base = {**train_settings(config, args.model)["curriculum"], "warmup_steps": args.warmup}
    # the sources training's validation scores (the others have too little held-out text for a window)
    validated = [k for k, v in heldout_coverage(shards, base["heldout_every"], args.seq).items() if v["validation"]]
    rng = np.random.default_rng(0)
    sigma = ({k: unigram_spread(s, args.seq, 400, rng) for k, s in shards.items()} if args.dispersion == "unigram"
             else dict.fromkeys(shards, 0.3))
    names = list(shards)
    print(f"sources: " + ", ".join(f"{k} {s.n_docs:,} docs {s.n_tokens / 1e6:.2f}M tokens "
                                   f"({s.n_tokens / s.n_docs:.0f}/doc) floor {spec[k]['floor']} σ {sigma[k]:.3f}"
                                   + ("" if k in validated else " (no validation window)")
                                   for k, s in shards.items()))
    out = {"sources": {k: {**spec[k], "sigma": sigma[k]} for k in names}, "args": vars(args), "arms": {}}
    for arm in args.arms:
        cc = {**base, **{k: v for k, v in ARMS[arm].items() if k != "floors"}}
        arm_spec = ({k: {**v, "floor": 0.0} for k, v in spec.items()} if "floors" in ARMS[arm] else spec)
        per = {n: [] for n in args.steps}
        pen, foc = [], []
        for seed in args.seeds:
            c, snaps, f = simulate(arm_spec, cc, tokens, sigma, max(args.steps), args.rows, args.seq, args.eval_every, seed,
                                    validated)
            for n in args.steps:
                per[n].append(snaps[n])
            pen.append({k: c.arms[k].lifetime_pulls / max(1, c.arms[k].n_train) for k in names})
            foc.append(f)
        out["arms"][arm] = {}
        for n in args.steps:
            mean = {k: float(np.mean([d[k] for d in per[n]])) for k in names}
            tot = sum(mean.values())
            out["arms"][arm][n] = {"share": {k: mean[k] / tot for k in names}, "epochs": {k: mean[k] / tokens[k] for k in names}}
        out["arms"][arm]["penalty_epochs_at_end"] = {k: float(np.mean([p[k] for p in pen])) for k in names}
        out["arms"][arm]["focus_share_after_warmup"] = {k: float(np.mean([f[k] for f in foc])) for k in names}
    for n in args.steps:
        print(f"\n### step {n:,} ({n * args.rows * args.seq / 1e6:.0f}M tokens): share of tokens drawn % (token-epochs)")
        print("| arm | " + " | ".join(names) + " |")
        print("|---|" + "---|" * len(names))
        for arm in args.arms:
            r = out["arms"][arm][n]
            print(f"| {arm} | " + " | ".join(f"{100 * r['share'][k]:.1f} ({r['epochs'][k]:.1f})" for k in names) + " |")
    print("\nepochs the bandit's penalty counts at the end (row starts / training documents) against token-epochs:")
    for arm in args.arms:
        end = out["arms"][arm][max(args.steps)]["epochs"]
        pe = out["arms"][arm]["penalty_epochs_at_end"]
        print(f"  {arm}: " + ", ".join(f"{k} {pe[k]:.1f} vs {end[k]:.1f}" for k in names))
    print("\nshare of the phases after the warm-up in which a source was in the focus (bandit modes):")
    for arm in args.arms:
        fs = out["arms"][arm]["focus_share_after_warmup"]
        if any(fs.values()):
            print(f"  {arm}: " + ", ".join(f"{k} {100 * fs[k]:.0f} %" for k in names))
    if args.out:
        write_text_atomic(Path(args.out), json.dumps(out, indent=1))  # never a half-written table under its name


if __name__ == "__main__":
    main()
