"""Curriculum studies (design §9.7; README, "Does the curriculum earn its keep?"): what a study's
runs measured, side by side.

A study trains one model under several curriculum settings (arms), each with several seeds, all
at one token budget (andrea.config.study_run_config makes each run's config; the workflow's
study_train rule trains it). This module reads every run's validation records and writes:

- `table.md` and `summary.json`: per arm, validation bits per byte at the end of the budget, over
  all sources two ways (below) and per source, as mean ± spread over the seeds, the lowest value on
  the way, the rows drawn from each source (and how many epochs of it that is), and the tokens each
  arm needs to reach the target;
- `curves.png`: validation bits per byte against training tokens, one band per arm (the mean over
  seeds ± their spread), with the target; `sources.png`: the same per source; `mix.png`: the
  share of training tokens each arm drew from each source;
- `report.html`: all of it on one page (the plots embedded), for the Snakemake report.

Over all sources, two ways (bits per byte, held-out documents: design §6.5):
- **mean over sources**: each source with a validation figure counts once, however large. The
  study's target and tokens-to-target are on this figure (a small source counts as much as a
  large one, so a mix cannot win by neglecting one);
- **token-weighted**: each source weighted by its tokens in the training corpus (its shard), i.e.
  bits per byte of the corpus as a whole: Σ_k W_k·nats_k / (ln 2 · Σ_k W_k·bytes_k), with nats_k and
  bytes_k per token on source k's validation windows. A small source counts for almost nothing.
Sources without a validation figure (too little held-out text for a window) are in neither.

Spread: the sample standard deviation over the seeds (0 with one seed). The target: the best static
baseline's final mean-over-sources bits per byte (mean over its seeds); tokens-to-target: the
first point where a run's curve reaches it, interpolated linearly between validations (Online Data
Mixing's measure: the baseline's result with fewer tokens); "not reached" when it never does.
The saving: 1 − (mean over seeds of the tokens to target) / budget, with the worst seed's beside it.
The goal (issue 41): every seed, at least 3, reaches the target; the saving (mean over the seeds)
is ≥ 20 %; and no source's final figure is worse than the best baseline's by more than that
baseline's seed spread.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy as np

from andrea.config import STATIC_MODES, study_arm_mode, study_baselines, study_max_steps, study_tokens_per_step
from andrea.io import read_run_log, write_json_atomic, write_text_atomic

GOAL_SAVING = 0.20  # issue 41: the target with at least 20 % fewer tokens than the budget, mean over the seeds
GOAL_SEEDS = 3  # issue 41: the mean of at least 3 seeds


# ---------------------------------------------------------------------------- reading the runs
def read_run(ckpt_dir: str | Path, corpus_tokens: dict[str, int]) -> dict:
    """One finished run (its workflow output `ckpt/`, whose run.json names the run directory): its
    validation curve with both overall figures at every point, and the tokens it drew per source."""
    ckpt_dir = Path(ckpt_dir)
    try:
        run = json.loads((ckpt_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{ckpt_dir / 'run.json'}: cannot read the run's record ({e}); train it again") from None
    missing = [k for k in ("run_dir", "tokens_seen", "step") if k not in run] if isinstance(run, dict) else ["run_dir"]
    if missing:
        raise ValueError(f"{ckpt_dir / 'run.json'}: no {', '.join(map(repr, missing))} in the run's record; train it again")
    run_dir = Path(run["run_dir"])
    train, evals = read_run_log(run_dir / "loss.jsonl")
    if not evals:
        raise ValueError(f"{run_dir / 'loss.jsonl'}: no validation record; a study needs train.eval_every > 0")
    per_step = run["tokens_seen"] / max(1, run["step"])
    curve = []
    for e in evals:
        src = {k: v for k, v in e["sources"].items() if v.get("bpb") is not None}
        curve.append({"step": e["step"], "tokens": e["step"] * per_step, "validation_overall": e.get("bpb"),
                      "mean": float(np.mean([v["bpb"] for v in src.values()])) if src else None,
                      "weighted": weighted_bpb(src, corpus_tokens),
                      "sources": {k: v["bpb"] for k, v in src.items()}})
    drawn: dict[str, float] = {}
    for r in train:
        for k, share in (r.get("mix") or {}).items():
            drawn[k] = drawn.get(k, 0.0) + share * per_step
    return {"run_dir": str(run_dir), "step": run["step"], "tokens": run["tokens_seen"], "curve": curve, "drawn": drawn}


def weighted_bpb(sources: dict[str, dict], corpus_tokens: dict[str, int]) -> float | None:
    """Bits per byte over the sources weighted by their corpus tokens W_k: Σ W_k·nats_k over
    Σ W_k·nats_k / bpb_k (= ln 2 · bytes per token), nats_k per token on k's validation windows."""
    num = den = 0.0
    for k, v in sources.items():
        w = corpus_tokens.get(k, 0)
        if w > 0 and v.get("bpb") and v.get("loss") is not None:
            num += w * v["loss"]
            den += w * v["loss"] / v["bpb"]
    return num / den if den > 0 else None


# ---------------------------------------------------------------------------- figures
def mean_spread(values: list[float]) -> dict:
    """{"mean", "spread" (sample standard deviation; 0 for one value), "n", "values"}."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "spread": None, "n": 0, "values": []}
    return {"mean": float(np.mean(v)), "spread": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "n": len(v), "values": v}


def tokens_to_target(curve: list[dict], target: float, key: str = "mean") -> float | None:
    """Training tokens at which a run's validation curve first reaches `target` (at or below it),
    interpolated linearly between the two validations around the crossing; None if never."""
    prev = None
    for point in curve:
        y = point[key]
        if y is None:
            continue
        if y <= target:
            if prev is None:
                return point["tokens"]
            t0, y0 = prev
            return t0 + (y0 - target) / (y0 - y) * (point["tokens"] - t0)
        prev = (point["tokens"], y)
    return None


def summarise(config: dict, name: str, runs: dict[tuple[str, int], dict], corpus_tokens: dict[str, int]) -> dict:
    """The study's figures from its runs ({(arm, seed): read_run(...)}): per arm the final
    validation figures (mean ± spread over seeds), their lowest point, the mix, tokens to the
    target, and whether the arm meets issue 41's goal against the best baseline."""
    st = config["studies"][name]
    seeds = list(st["seeds"])
    arms = list(st["arms"])
    budget = study_max_steps(config, name) * study_tokens_per_step(config, name)
    for (arm, seed), r in runs.items():
        if r["curve"][-1]["mean"] is None:
            raise ValueError(f"study {name}: arm {arm} seed {seed} ({r['run_dir']}) has no source with a validation figure "
                             f"at its last validation (too little held-out text for a window of eval_tokens): "
                             f"lower curriculum.heldout_every or train.eval_tokens")
    sources = sorted({k for r in runs.values() for k in r["curve"][-1]["sources"]})
    out_arms: dict[str, dict] = {}
    for arm in arms:
        rs = [runs[(arm, s)] for s in seeds]
        drawn = {k: mean_spread([r["drawn"].get(k, 0.0) for r in rs]) for k in corpus_tokens}
        out_arms[arm] = {
            "mode": study_arm_mode(config, name, arm),
            "description": st["arms"][arm].get("description", ""),
            "final": {"mean": mean_spread([r["curve"][-1]["mean"] for r in rs]),
                      "weighted": mean_spread([r["curve"][-1]["weighted"] for r in rs]),
                      "validation_overall": mean_spread([r["curve"][-1]["validation_overall"] for r in rs])},
            "lowest": {"mean": mean_spread([min(p["mean"] for p in r["curve"] if p["mean"] is not None) for r in rs]),
                       "weighted": mean_spread([min(p["weighted"] for p in r["curve"] if p["weighted"] is not None) for r in rs])},
            "sources": {k: mean_spread([r["curve"][-1]["sources"].get(k) for r in rs]) for k in sources},
            "drawn_tokens": drawn,
            "epochs": {k: (drawn[k]["mean"] / corpus_tokens[k] if corpus_tokens.get(k) and drawn[k]["mean"] is not None else None)
                       for k in corpus_tokens},
            "tokens": mean_spread([r["tokens"] for r in rs]),
        }
    baselines = study_baselines(config, name)
    best = min(baselines, key=lambda a: out_arms[a]["final"]["mean"]["mean"]) if baselines else None
    target = out_arms[best]["final"]["mean"]["mean"] if best else None
    for arm, a in out_arms.items():
        if target is None:
            a["to_target"] = None
            continue
        per_seed = [tokens_to_target(runs[(arm, s)]["curve"], target) for s in seeds]
        reached = [t for t in per_seed if t is not None]
        tt = mean_spread(reached)
        tt.update(reached=len(reached), of=len(seeds), per_seed=per_seed)
        # issue 41's measure is the mean over seeds; the worst seed's saving stands beside it, so
        # that a mean carried by one lucky seed shows
        tt["saving"] = 1.0 - tt["mean"] / budget if reached else None
        tt["min_saving"] = 1.0 - max(reached) / budget if reached else None
        worse = [k for k in sources if a["sources"][k]["mean"] is not None and out_arms[best]["sources"][k]["mean"] is not None
                 and a["sources"][k]["mean"] - out_arms[best]["sources"][k]["mean"] > (out_arms[best]["sources"][k]["spread"] or 0.0)]
        tt["worse_sources"] = worse
        tt["meets_goal"] = bool(len(reached) == len(seeds) and len(seeds) >= GOAL_SEEDS and tt["saving"] is not None
                                and tt["saving"] >= GOAL_SAVING and not worse)
        a["to_target"] = tt
    return {"study": name, "description": st.get("description", ""), "model": st["model"], "seeds": seeds,
            "budget_tokens": budget, "max_steps": study_max_steps(config, name), "sources": sources,
            "corpus_tokens": corpus_tokens, "baselines": baselines, "best_baseline": best, "target": target,
            "goal_saving": GOAL_SAVING, "arms": out_arms,
            "curves": {f"{arm}/seed{s}": runs[(arm, s)]["curve"] for arm in arms for s in seeds}}


# ---------------------------------------------------------------------------- writing
def _ms(x: dict, digits: int = 4) -> str:
    if not x or x.get("mean") is None:
        return "—"
    return f"{x['mean']:.{digits}f} ± {x['spread']:.{digits}f}"


def _tok(n: float) -> str:
    """A token count as people read it: 49.2M, 812.5K, 512."""
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else f"{n:.0f}"


def tables(summary: dict) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The study's tables as (header, rows) by title; the Markdown and the HTML page both draw them."""
    arms, src = summary["arms"], summary["sources"]
    out = {}
    head = ["arm", "mode", "mean over sources", "token-weighted", "lowest mean over sources", "tokens to target",
            "fewer tokens than the budget (mean over seeds)", "worst seed", "reached", "sources worse than the baseline", "goal"]
    rows = []
    for arm, a in arms.items():
        tt = a["to_target"]
        rows.append([arm + (" (best baseline)" if arm == summary["best_baseline"] else ""), a["mode"], _ms(a["final"]["mean"]),
                     _ms(a["final"]["weighted"]), _ms(a["lowest"]["mean"]),
                     (f"{_tok(tt['mean'])} ± {_tok(tt['spread'])}" if tt["reached"] else "not reached") if tt else "—",
                     f"{100 * tt['saving']:.1f} %" if tt and tt.get("saving") is not None else "—",
                     f"{100 * tt['min_saving']:.1f} %" if tt and tt.get("min_saving") is not None else "—",
                     f"{tt['reached']}/{tt['of']}" if tt else "—",
                     (", ".join(tt["worse_sources"]) or "none") if tt else "—",
                     ("MET" if tt["meets_goal"] else "not met") if tt else "—"])
    out["Validation bits per byte at the end of the budget (mean ± spread over seeds)"] = (head, rows)
    out["Per source, at the end (bits per byte, mean ± spread)"] = (
        ["arm", *src], [[arm, *(_ms(a["sources"][k]) for k in src)] for arm, a in arms.items()])
    corpus = summary["corpus_tokens"]
    names = list(corpus)
    out["Tokens drawn per source (mean over seeds) and the epochs of the source they make"] = (
        ["arm", *names], [["the corpus", *(_tok(corpus[k]) for k in names)]]
        + [[arm, *(f"{_tok(a['drawn_tokens'][k]['mean'])} ({a['epochs'][k]:.1f} ep)"
                   if a["epochs"].get(k) is not None else "—" for k in names)] for arm, a in arms.items()])
    return out


def _markdown(summary: dict) -> str:
    lines = [f"# Study {summary['study']}: {summary['model']}", ""]
    if summary["description"]:
        lines += [summary["description"], ""]
    lines += [_intro(summary), ""]
    for title, (head, rows) in tables(summary).items():
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    lines += [_verdict(summary), ""]
    return "\n".join(lines)


def _intro(summary: dict) -> str:
    target = (f"The target is the best static baseline's ({summary['best_baseline']}) final mean over sources, "
              f"{summary['target']:.4f} bits/byte; tokens to target: where each run's curve first reaches it."
              if summary["target"] is not None else
              "No arm of a static mode (proportional, uniform, fixed): no target, no tokens-to-target figure.")
    return (f"{len(summary['arms'])} arms × {len(summary['seeds'])} seeds (seeds {', '.join(map(str, summary['seeds']))}), "
            f"{summary['budget_tokens']:,} training tokens each ({summary['max_steps']:,} steps). Validation bits per byte "
            f"on held-out documents: 'mean over sources' counts each of {len(summary['sources'])} sources once "
            f"({', '.join(summary['sources'])}); 'token-weighted' weighs them by their tokens in the corpus. {target} "
            f"Spread: standard deviation over seeds.")


def _verdict(summary: dict) -> str:
    """One paragraph: which arm, if any, meets issue 41's goal (every seed, at least 3, reaches the
    target; their mean tokens are ≥ 20 % fewer than the budget; no source worse than the baseline
    beyond its seed spread), and how each learning arm does, its worst seed beside the mean."""
    if summary["target"] is None:
        return "Verdict: no baseline, so no verdict."
    learning = {a: v for a, v in summary["arms"].items() if v["mode"] not in STATIC_MODES}
    met = [a for a, v in learning.items() if v["to_target"]["meets_goal"]]
    parts = []
    for arm, v in learning.items():
        tt = v["to_target"]
        if tt["reached"]:
            parts.append(f"{arm} reaches it in {_tok(tt['mean'])} ± {_tok(tt['spread'])} tokens "
                         f"({100 * tt['saving']:.1f} % fewer than the budget, mean over seeds; worst seed "
                         f"{100 * tt['min_saving']:.1f} %; {tt['reached']}/{tt['of']} seeds)")
        else:
            parts.append(f"{arm} does not reach it")
    head = (f"Verdict: {', '.join(met)} meet{'s' if len(met) == 1 else ''} the goal" if met else
            f"Verdict: no curriculum reaches the best baseline's ({summary['best_baseline']}) final mean over sources "
            f"on every one of ≥ {GOAL_SEEDS} seeds with ≥ {100 * summary['goal_saving']:.0f} % fewer tokens (mean over "
            f"the seeds) without a source worse beyond the baseline's seed spread")
    return head + (": " + "; ".join(parts) + "." if parts else ".")


def plots(summary: dict, out_dir: Path) -> dict[str, Path]:
    """curves.png (both overall figures against tokens, a band per arm), sources.png (per source),
    mix.png (the share of tokens each arm drew from each source)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    arms = list(summary["arms"])

    def band(ax, arm, i, key, source=None) -> tuple[float, float]:
        """An arm's line and band; returns (its lowest point, where its line stands at 15 % of the
        budget) for the frame."""
        curves = [summary["curves"][f"{arm}/seed{s}"] for s in summary["seeds"]]
        n = min(len(c) for c in curves)
        x = np.array([p["tokens"] for p in curves[0][:n]])
        y = np.array([[(p["sources"].get(source) if source else p[key]) for p in c[:n]] for c in curves], dtype=float)
        m = np.nanmean(y, axis=0)
        s = np.nanstd(y, axis=0, ddof=1) if len(curves) > 1 else np.zeros_like(m)
        ax.plot(x / 1e6, m, color=colours(i % 10), lw=1.5, label=arm)
        if len(curves) > 1:
            ax.fill_between(x / 1e6, m - s, m + s, color=colours(i % 10), alpha=0.2, lw=0)
        early = m[min(int(np.searchsorted(x, 0.15 * x[-1])), n - 1)]
        return float(np.nanmin(m - s)), float(early)

    def frame(ax, spans):
        """From the lowest band to where the lines stood at 15 % of the budget: the first
        validations (random weights, ~4 bits/byte) stay above it; the end, where arms differ, fills it."""
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        if np.isfinite(lo) and np.isfinite(hi) and hi > lo:
            ax.set_ylim(lo - 0.03 * (hi - lo), hi)

    made = {}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, key, title in ((axes[0], "mean", "mean over sources"), (axes[1], "weighted", "token-weighted")):
        frame(ax, [band(ax, arm, i, key) for i, arm in enumerate(arms)])
        if key == "mean" and summary["target"] is not None:
            ax.axhline(summary["target"], color="k", ls="--", lw=0.8, label=f"target ({summary['best_baseline']})")
        ax.set_xlabel("training tokens (millions)"), ax.set_ylabel("validation bits per byte"), ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Study {summary['study']} ({summary['model']}): mean ± spread over {len(summary['seeds'])} seeds")
    fig.tight_layout()
    made["curves"] = out_dir / "curves.png"
    fig.savefig(made["curves"], dpi=110)
    plt.close(fig)

    src = summary["sources"]
    cols = min(3, max(1, len(src)))
    rows = -(-len(src) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows), squeeze=False)
    for j, k in enumerate(src):
        ax = axes[j // cols][j % cols]
        frame(ax, [band(ax, arm, i, None, source=k) for i, arm in enumerate(arms)])
        ax.set_title(k, fontsize=10), ax.set_xlabel("tokens (M)"), ax.grid(alpha=0.3)
    for j in range(len(src), rows * cols):
        axes[j // cols][j % cols].axis("off")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Validation bits per byte per source")
    fig.tight_layout()
    made["sources"] = out_dir / "sources.png"
    fig.savefig(made["sources"], dpi=100)
    plt.close(fig)

    names = list(summary["corpus_tokens"])
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(arms) + 3), 4))
    bottom = np.zeros(len(arms))
    for i, k in enumerate(names):
        drawn = np.array([summary["arms"][a]["drawn_tokens"][k]["mean"] or 0.0 for a in arms])
        total = np.array([sum(summary["arms"][a]["drawn_tokens"][n]["mean"] or 0.0 for n in names) for a in arms])
        share = drawn / np.maximum(total, 1e-9)
        ax.bar(arms, share, bottom=bottom, color=plt.get_cmap("tab20")(i % 20), label=k)
        bottom += share
    ax.set_ylabel("share of training tokens"), ax.set_title("What each arm drew (mean over seeds)")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    made["mix"] = out_dir / "mix.png"
    fig.savefig(made["mix"], dpi=100)
    plt.close(fig)
    return made


def _html(summary: dict, figs: dict[str, Path]) -> str:
    e = html.escape
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:1.5em auto;color:#222}"
             "table{border-collapse:collapse;margin-bottom:1em;font-size:.9em}td,th{border:1px solid #ddd;padding:.3em .6em}"
             "td{text-align:right}td:first-child,th{text-align:left}img{max-width:100%}")
    body = [f"<h1>Study {e(summary['study'])}: {e(summary['model'])}</h1>"]
    if summary["description"]:
        body.append(f"<p>{e(summary['description'])}</p>")
    body.append(f"<p>{e(_intro(summary))}</p><p><b>{e(_verdict(summary))}</b></p>")
    captions = {"curves": "Validation bits per byte against training tokens: a line per arm (mean over seeds), its band ± the "
                          "spread over seeds; the dashed line is the target.",
                "sources": "The same per source.", "mix": "The share of training tokens each arm drew from each source."}
    for key, path in figs.items():
        b64 = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        body.append(f"<h2>{e(key)}</h2><p>{e(captions[key])}</p><img alt='{e(key)}' src='data:image/png;base64,{b64}'>")
    for title, (head, rows) in tables(summary).items():
        cells = "".join(f"<tr>{''.join(f'<td>{e(c)}</td>' for c in r)}</tr>" for r in rows)
        body.append(f"<h2>{e(title)}</h2><table><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr>{cells}</table>")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Study {e(summary['study'])}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def write_study(config: dict, name: str, ckpts: dict[tuple[str, int], str | Path], shards_json: str | Path,
                out: dict[str, str | Path]) -> dict:
    """Read every run of study `name` (`ckpts`: (arm, seed) → its ckpt directory), then write
    `out`'s files: "summary" (JSON), "table" (Markdown), "curves", "sources", "mix" (PNG), "report"
    (HTML). Returns the summary."""
    try:
        meta = json.loads(Path(shards_json).read_text(encoding="utf-8"))
        corpus = {k: int(v["n_tokens"]) for k, v in meta["sources"].items() if v["n_tokens"] > 0}
    except (OSError, ValueError) as e:
        raise ValueError(f"{shards_json}: cannot read the shards' record ({e}); build the shards again") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{shards_json}: no {e} in the shards' record (sources.<name>.n_tokens); build the shards again") from None
    runs = {key: read_run(path, corpus) for key, path in ckpts.items()}
    summary = summarise(config, name, runs, corpus)
    out = {k: Path(v) for k, v in out.items()}
    tmp = out["summary"].parent / f".plots-{name}"
    tmp.mkdir(parents=True, exist_ok=True)
    made = plots(summary, tmp)
    for key, path in made.items():  # renamed into place: never a half-written plot under its name
        path.replace(out[key])
    tmp.rmdir()
    figs = {k: out[k] for k in made}
    write_text_atomic(out["table"], _markdown(summary))
    write_text_atomic(out["report"], _html(summary, figs))
    write_json_atomic(out["summary"], summary)
    return summary
