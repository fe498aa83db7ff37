"""The audit stage (design §10): samples from a trained checkpoint for a fixed prompt set, judged.

Output directory (results/<model>/audit/):
    samples.jsonl      every sample: domain, prompt, text, built-in scores, external verdict
    scores.parquet     the same scores as a table
    heldout.json       loss (nats/token), bits per byte and perplexity on held-out documents, per
                       source and overall (every source that has held-out documents)
    report.md          summary, plots, best and worst samples
    report.html        the same, self-contained (plots embedded)
    plots/*.png
"""

from __future__ import annotations

import base64
import html
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from andrea.io import atomic_dir, read_jsonl
from andrea.evaluation import heldout_report
from andrea.judges import ExternalJudge, builtin_scores
from andrea.runlog import RunLog
from andrea.sampling import chat_prompt, generate_rows, load_model
from andrea.shards import Shard
from andrea.tokenizer import BOS

log = logging.getLogger("andrea.audit")


def plots(run_dir: Path | None, df: pd.DataFrame, out: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    made = {}
    # the run's log read once into at most 2,000 buckets (a 200,000-step log does not become
    # 200,000 dicts and plotted points): the loss as the band from the smallest to the largest in
    # each bucket, so spikes stay, EMA and SMMA at each bucket's last step
    rl = RunLog(run_dir / "loss.jsonl") if run_dir else None
    if rl:
        rl.poll()
    loss = rl.series() if rl else {"step": []}
    evals = [r for r in rl.evals if r.get("bpb") is not None] if rl else []
    if len(loss["step"]):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        steps = loss["step"]
        if loss["bucket_steps"] > 1:
            ax.fill_between(steps, loss["loss_min"], loss["loss_max"], color="#ccc", lw=0,
                            label=f"loss (range in {loss['bucket_steps']} steps)")
        else:
            ax.plot(steps, loss["loss"], color="#bbb", lw=0.8, label="loss")
        ax.plot(steps, loss["ema"], color="#1f77b4", lw=1.6, label="EMA")
        ax.plot(steps, loss["smma"], color="#d62728", lw=1.6, label="SMMA")
        ax.set_xlabel("step"), ax.set_ylabel("cross-entropy"), ax.legend(), ax.set_title("Training loss")
        fig.tight_layout()
        fig.savefig(out / "loss.png", dpi=110)
        plt.close(fig)
        made["Training loss"] = out / "loss.png"
    if evals:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        steps = [r["step"] for r in evals]
        for src in sorted({s for r in evals for s in r["sources"]}):
            ys = [r["sources"].get(src, {}).get("bpb") for r in evals]
            ax.plot(steps, [np.nan if y is None else y for y in ys], lw=1.0, label=src)
        ax.plot(steps, [r["bpb"] for r in evals], color="black", lw=2.2, label="all sources")
        ax.set_xlabel("step"), ax.set_ylabel("bits per byte"), ax.set_title("Validation (held-out documents)")
        ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(out / "validation.png", dpi=110)
        plt.close(fig)
        made["Validation bits per byte"] = out / "validation.png"
    samples = read_jsonl(run_dir / "samples.jsonl") if run_dir else []
    if samples:
        fig, ax = plt.subplots(figsize=(7, 3.0))
        ax.plot([s["step"] for s in samples], [s["coherence"] for s in samples], "o-", color="#2ca02c")
        ax.axhline(30, color="#b00", ls="--", lw=1, label="halt threshold")
        ax.set_ylim(0, 100), ax.set_xlabel("step"), ax.set_ylabel("coherence"), ax.legend()
        ax.set_title("Coherence of training samples")
        fig.tight_layout()
        fig.savefig(out / "coherence_training.png", dpi=110)
        plt.close(fig)
        made["Coherence over training"] = out / "coherence_training.png"
    cols = ["coherence"] + (["judge_score"] if df["judge_score"].notna().any() else [])
    fig, axes = plt.subplots(1, len(cols), figsize=(7 * len(cols) / 1.4, 3.4), squeeze=False)
    for ax, col in zip(axes[0], cols):
        domains = sorted(df["domain"].unique())
        data = [df.loc[df["domain"] == d, col].dropna().to_numpy() for d in domains]
        ax.boxplot(data, tick_labels=domains)
        for i, vals in enumerate(data, 1):
            ax.scatter(np.full(len(vals), i) + np.linspace(-0.08, 0.08, len(vals)) if len(vals) else [], vals, s=12, color="#1f77b4", zorder=3)
        ax.set_title(f"{col.replace('_', ' ')} by domain"), ax.tick_params(axis="x", rotation=30)
        ax.set_ylim(0, 100 if col == "coherence" else 10)
    fig.tight_layout()
    fig.savefig(out / "scores_by_domain.png", dpi=110)
    plt.close(fig)
    made["Scores by domain"] = out / "scores_by_domain.png"
    return made


def run_audit(ckpt_dir: str | Path, shards_json: str | Path, acfg: dict, heldout_every: int, out_dir: str | Path,
              mcfg: dict | None = None) -> dict:
    ckpt_dir, out = Path(ckpt_dir), Path(out_dir)
    lm = load_model(ckpt_dir, backend=acfg.get("backend", "auto"))  # samples on the GPU when there is one
    judge = ExternalJudge.from_config(acfg["judge"])
    try:
        with atomic_dir(out) as tmp:  # the audit directory appears complete, or not at all
            return _audit(lm, judge, shards_json, acfg, heldout_every, tmp, mcfg)
    finally:
        if judge is not None:
            judge.close()


def _audit(lm, judge, shards_json, acfg: dict, heldout_every: int, tmp: Path, mcfg: dict | None) -> dict:
    if judge is None:
        log.info("external judge not configured (%s / %s unset): built-in judges only",
                 acfg["judge"]["base_url_env"], acfg["judge"]["model_env"])

    rows = []
    for pi, p in enumerate(acfg["prompts"]):
        prompt_text = chat_prompt(p["prompt"], mcfg)
        ids = [BOS, *lm.tokenizer.encode(prompt_text).tolist()]
        # the prompt's samples decode together, one row each, sample k from its own generator
        rngs = [np.random.default_rng([acfg["seed"], pi, k]) for k in range(acfg["samples_per_prompt"])]
        samples = generate_rows(lm.model, ids, acfg["max_new_tokens"], rngs, acfg["temperature"], acfg["top_k"], acfg["top_p"])
        for k, out_ids in enumerate(samples):
            text = lm.tokenizer.decode(out_ids, errors="replace")
            row = {"domain": p["domain"], "prompt": p["prompt"], "sample": k, "text": text, "n_tokens": len(out_ids),
                   **builtin_scores(text)}
            if judge is not None:
                v = judge.judge(p["prompt"], text)
                row.update({"judge_score": v.score, "judge_reason": v.reason, "judge_error": v.error, "judge_attempts": v.attempts})
            else:
                row.update({"judge_score": None, "judge_reason": None, "judge_error": "not configured", "judge_attempts": 0})
            rows.append(row)
            log.info("%s #%d: coherence %.1f%s: %r", p["domain"], k, row["coherence"],
                     f", judge {row['judge_score']}" if row["judge_score"] is not None else "", text[:80])

    meta = json.loads((Path(shards_json)).read_text())
    shards = {s: Shard(meta["shard_dir"], s, tokenizer_hash=meta["tokenizer_hash"]) for s, c in meta["sources"].items() if c["n_docs"]}
    seq_len = lm.meta.get("train", {}).get("seq_len") or lm.cfg.context
    ppl = heldout_report(lm.cfg, lm.weights, lm.tokenizer.token_bytes, shards, heldout_every, seq_len, acfg["heldout_tokens"],
                         backend=acfg.get("backend", "auto"), trained_precision=lm.meta.get("precision"))
    log.info("held-out: %s nats/token, %s bits/byte, perplexity %s over %d sources (%s)", ppl["overall"]["loss"],
             ppl["overall"]["bpb"], ppl["overall"]["perplexity"], len(ppl["per_source"]), ppl["backend"])

    df = pd.DataFrame(rows)
    with open(tmp / "samples.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    df.to_parquet(tmp / "scores.parquet", index=False)
    (tmp / "heldout.json").write_text(json.dumps(ppl, indent=2))
    run_dir = Path(lm.meta["run_dir"]) if lm.meta.get("run_dir") and Path(lm.meta["run_dir"]).exists() else None
    figs = plots(run_dir, df, tmp / "plots")
    summary = {
        "model": lm.meta["model"],
        "step": lm.step,
        "samples": len(rows),
        "heldout_loss": ppl["overall"]["loss"],
        "heldout_bits_per_byte": ppl["overall"]["bpb"],
        "perplexity": ppl["overall"]["perplexity"],
        "mean_coherence": round(float(df["coherence"].mean()), 2),
        "external_judge": ("not run: no endpoint configured (set "
                           f"{acfg['judge']['base_url_env']} and {acfg['judge']['model_env']})") if judge is None else
                          f"{judge.model} at {judge.url}: {int(df['judge_score'].notna().sum())} scored, "
                          f"{int(df['judge_score'].isna().sum())} unscored",
        "mean_judge_score": None if judge is None or df["judge_score"].isna().all() else round(float(df["judge_score"].mean()), 2),
    }
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2))
    write_reports(tmp, summary, df, ppl, figs)
    return summary


def write_reports(d: Path, summary: dict, df: pd.DataFrame, ppl: dict, figs: dict[str, Path]) -> None:
    key = "judge_score" if df["judge_score"].notna().any() else "coherence"
    ranked = df.sort_values(key, ascending=False)
    best, worst = ranked.head(3), ranked.tail(3).iloc[::-1]
    cols = ["coherence", "english_rate", "coh_gate", "coh_bigram", "coh_trigram", "coh_chars", "distinct_2", "repetition"]
    by_domain = df.groupby("domain")[[c for c in cols if c in df.columns]].mean().round(3)

    md = [f"# Audit of {summary['model']} at step {summary['step']}", ""]
    md += ["| | |", "|---|---|"] + [f"| {k.replace('_', ' ')} | {v} |" for k, v in summary.items() if k not in ("model", "step")]
    md += ["", "## Per domain (means of the built-in judges)", "", by_domain.to_markdown() if _has_tabulate() else by_domain.to_string(), ""]
    md += ["## Held-out documents (never trained on)", "", "| source | nats/token | bits/byte | perplexity | tokens |", "|---|---|---|---|---|"]
    md += [f"| {s} | {v['loss']} | {v['bpb']} | {v['perplexity']} | {v['tokens']} |" for s, v in ppl["per_source"].items()]
    md += [f"| **all** | {ppl['overall']['loss']} | {ppl['overall']['bpb']} | {ppl['overall']['perplexity']} | {ppl['overall']['tokens']} |", ""]
    md += [f"- {s}: no held-out score ({why})" for s, why in ppl["without_heldout"].items()] + [""]
    for title, path in figs.items():
        md += [f"## {title}", "", f"![{title}](plots/{path.name})", ""]
    for title, part in (("Best samples", best), ("Worst samples", worst)):
        md += [f"## {title} (by {key.replace('_', ' ')})", ""]
        for _, r in part.iterrows():
            md += [f"**{r['domain']}** — {r['prompt']} — coherence {r['coherence']}"
                   + (f", judge {r['judge_score']}: {r['judge_reason']}" if pd.notna(r["judge_score"]) else ""), "", "```", r["text"], "```", ""]
    (d / "report.md").write_text("\n".join(md), encoding="utf-8")

    e = html.escape
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Audit of {e(summary['model'])}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left}"
             "pre{white-space:pre-wrap;background:#f6f6f6;padding:.6em}img{max-width:100%}</style></head><body>",
             f"<h1>Audit of {e(summary['model'])} at step {summary['step']}</h1><table>"]
    parts += [f"<tr><th>{e(k.replace('_', ' '))}</th><td>{e(str(v))}</td></tr>" for k, v in summary.items() if k not in ("model", "step")]
    parts += ["</table><h2>Per domain (means of the built-in judges)</h2>", by_domain.to_html(),
              "<h2>Held-out documents (never trained on)</h2><table><tr><th>source</th><th>nats/token</th><th>bits/byte</th>"
              "<th>perplexity</th><th>tokens</th></tr>"]
    rows_ = list(ppl["per_source"].items()) + [("all", ppl["overall"])]
    parts += [f"<tr><td>{e(s)}</td><td>{v['loss']}</td><td>{v['bpb']}</td><td>{v['perplexity']}</td><td>{v['tokens']}</td></tr>" for s, v in rows_]
    parts += ["</table><ul>"] + [f"<li>{e(s)}: no held-out score ({e(why)})</li>" for s, why in ppl["without_heldout"].items()] + ["</ul>"]
    for title, path in figs.items():
        b64 = base64.b64encode(path.read_bytes()).decode("ascii")
        parts += [f"<h2>{e(title)}</h2><img class='plot' alt='{e(title)}' src='data:image/png;base64,{b64}'>"]
    for title, part in (("Best samples", best), ("Worst samples", worst)):
        parts += [f"<h2>{title} (by {e(key.replace('_', ' '))})</h2>"]
        for _, r in part.iterrows():
            verdict = f", judge {r['judge_score']}: {e(str(r['judge_reason']))}" if pd.notna(r["judge_score"]) else ""
            parts += [f"<p><b>{e(r['domain'])}</b> — {e(r['prompt'])} — coherence {r['coherence']}{verdict}</p><pre>{e(r['text'])}</pre>"]
    parts += ["</body></html>"]
    (d / "report.html").write_text("\n".join(parts), encoding="utf-8")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401

        return True
    except ImportError:
        return False
