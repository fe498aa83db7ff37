"""The audit stage (design §10): samples from a trained checkpoint for a fixed prompt set, judged.

Output directory (results/<model>/audit/):
    samples.jsonl      every sample: domain, prompt, text, built-in scores, external verdict
    scores.parquet     the same scores as a table
    heldout.json       loss (nats/token), bits per byte and perplexity on held-out documents, per
                       source and overall (every source that has held-out documents), and every
                       source's held-out coverage (which have a figure, which not and why)
    contamination.json each prompt checked against the training documents (andrea/contamination.py)
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

from andrea.contamination import NGRAM, check_prompts, shard_documents
from andrea.io import atomic_dir, check_replaceable, progress, read_jsonl
from andrea.evaluation import heldout_documents, heldout_report
from andrea.judges import ExternalJudge, builtin_scores
from andrea.runlog import RunLog
from andrea.sampling import chat_prompt, generate_rows, load_model
from andrea.shards import Shard
from andrea.tokenizer import BOS

log = logging.getLogger("andrea.audit")

NO_JUDGE = "not scored: no external judge configured"

# What each column of the report means (report.md, report.html; workflow/report/audit.rst says it too)
COLUMN_CAPTIONS = {
    "coherence": "built-in coherence score, 0–100: coh_gate × distinct-3 × (coh_bigram + coh_trigram + coh_chars + 20)",
    "english_rate": "share of the sample's letters that stand in real (English) words, 0–1",
    "coh_gate": "real-word gate of the coherence score, 0–1: 0 at an english_rate of 0.4 or less, 1 from 0.8 on",
    "coh_bigram": "bigram points of the coherence score, 0–35: 35 × distinct-2",
    "coh_trigram": "trigram points of the coherence score, 0–35: 35 × distinct-3",
    "coh_chars": "character-variety points of the coherence score, 0–10: distinct characters / 25 (at most 1) × 10",
    "distinct_2": "distinct word pairs / all word pairs of the sample, 0–1 (1: no pair repeats)",
    "repetition": "share of the sample's word 4-grams that occurred earlier in it, 0–1 (0: nothing repeats)",
    "judge_score": "the external judge's score, 0–10 (with its reason)",
    "in training data": f"whether the prompt occurs in the training documents: verbatim, whole (lower-cased, without "
                        f"punctuation) or by a run of {NGRAM} of its words; where it does, the first such document",
}
HELDOUT_CAPTIONS = {
    "nats/token": "mean cross-entropy of the next token, in nats",
    "bits/byte": "the same in bits per UTF-8 byte of text: comparable across tokenizers",
    "perplexity": "e^(nats/token)",
    "tokens": "held-out target tokens scored",
    "share": "the source's part of the tokens of the overall figure",
    "method": "windows: fixed windows of the training sequence length, as training's validation; whole: held-out text "
              "shorter than one window, scored whole",
}
SUMMARY_CAPTIONS = {
    "samples": "samples generated (prompts × samples_per_prompt)",
    "contaminated_prompts": "prompts found in the training documents: their samples may be recalled, not answered",
    "heldout_loss": "nats per token on held-out documents, all sources with a figure, weighted by tokens",
    "heldout_bits_per_byte": "the same in bits per byte",
    "heldout_bits_per_byte_mean_of_sources": "bits per byte averaged over the sources with a figure, each counted once",
    "perplexity": "e^(held-out loss)",
    "heldout_sources": "which sources the held-out figures cover",
    "mean_coherence": "mean built-in coherence (0–100) of all samples",
    "mean_coherence_uncontaminated": "the same over the samples of prompts not found in the training documents",
    "external_judge": "the external judge (an OpenAI-compatible endpoint) and how many samples it scored",
    "mean_judge_score": "mean external judge score (0–10)",
}


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
    check_replaceable(out, "summary.json")  # before loading the model: a wrong --out is refused, not deleted
    lm = load_model(ckpt_dir, backend=acfg.get("backend", "auto"))  # samples on the GPU when there is one
    judge = ExternalJudge.from_config(acfg["judge"])
    try:
        with atomic_dir(out, "summary.json") as tmp:  # the audit directory appears complete, or not at all
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
    for src, why in ppl["without_heldout"].items():
        log.info("held-out: no figure for %s: %s", src, why)

    contamination = _contamination(acfg["prompts"], shards, lm.tokenizer, heldout_every)
    by_prompt = {c["prompt"]: c for c in contamination["prompts"]}
    for row in rows:
        c = by_prompt[row["prompt"]]
        row["contaminated"], row["contamination"] = c["contaminated"], c["described"]

    df = pd.DataFrame(rows)
    with open(tmp / "samples.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    df.to_parquet(tmp / "scores.parquet", index=False)
    (tmp / "heldout.json").write_text(json.dumps(ppl, indent=2))
    (tmp / "contamination.json").write_text(json.dumps(contamination, indent=2, ensure_ascii=False))
    run_dir = Path(lm.meta["run_dir"]) if lm.meta.get("run_dir") and Path(lm.meta["run_dir"]).exists() else None
    figs = plots(run_dir, df, tmp / "plots")
    clean = df[~df["contaminated"]]
    bad = [c for c in contamination["prompts"] if c["contaminated"]]
    summary = {
        "model": lm.meta["model"],
        "step": lm.step,
        "samples": len(rows),
        "contaminated_prompts": (f"{len(bad)} of {len(by_prompt)}: " + "; ".join(f"{c['prompt']!r} ({c['source']} document {c['doc']})"
                                                                        for c in bad)) if bad else
                                f"none: no prompt ({len(by_prompt)} checked) is in the {contamination['documents']:,} training documents",
        "heldout_loss": ppl["overall"]["loss"],
        "heldout_bits_per_byte": ppl["overall"]["bpb"],
        "heldout_bits_per_byte_mean_of_sources": ppl["overall"]["bpb_mean_of_sources"],
        "perplexity": ppl["overall"]["perplexity"],
        "heldout_sources": _heldout_sources(ppl),
        "mean_coherence": round(float(df["coherence"].mean()), 2),
        "mean_coherence_uncontaminated": round(float(clean["coherence"].mean()), 2) if len(clean) else
                                         "no sample: every prompt is in the training documents",
        "external_judge": ("not run: no endpoint configured (set "
                           f"{acfg['judge']['base_url_env']} and {acfg['judge']['model_env']})") if judge is None else
                          f"{judge.model} at {judge.url}: {int(df['judge_score'].notna().sum())} scored, "
                          f"{int(df['judge_score'].isna().sum())} unscored",
        "mean_judge_score": NO_JUDGE if judge is None else "not scored: the judge scored no sample"
                            if df["judge_score"].isna().all() else round(float(df["judge_score"].mean()), 2),
    }
    (tmp / "summary.json").write_text(json.dumps(summary, indent=2))
    write_reports(tmp, summary, df, ppl, figs, contamination)
    return summary


def _contamination(prompts: list[dict], shards: dict, tokenizer, heldout_every: int) -> dict:
    """Every prompt checked against every training document of the shards (the held-out ones left
    out), streamed: andrea/contamination.py."""
    table = [tokenizer.decode_bytes([i]) for i in range(tokenizer.vocab_size)]
    n = sum(sh.n_docs - len(heldout_documents(sh.n_docs, heldout_every)) for sh in shards.values())
    counted = {"documents": 0}

    def documents():
        for doc in progress(shard_documents(shards, table, heldout_every), desc="contamination", unit=" docs", total=n):
            counted["documents"] += 1
            yield doc

    checks = check_prompts([p["prompt"] for p in prompts], documents())
    out = []
    for p, c in zip(prompts, checks):
        out.append({"domain": p["domain"], **c.as_dict(), "described": c.describe()})
        if c.contaminated:
            log.warning("contamination: prompt %r is in the training documents (%s), %d of them, first %s document %d: %s",
                        c.prompt, c.kind, c.documents, c.source, c.doc, c.excerpt)
    log.info("contamination: %d of %d prompts found in %d training documents", sum(c.contaminated for c in checks),
             len(checks), counted["documents"])
    return {"ngram_words": NGRAM, "documents": counted["documents"], "heldout_every": heldout_every,
            "sources": sorted(shards), "prompts": out}


def _heldout_sources(ppl: dict) -> str:
    """Which sources the held-out figures cover, for the summary."""
    per, cov = ppl["per_source"], ppl["coverage"]
    text = f"{len(per)} of {len(cov)} sources have a held-out figure"
    if per:
        text += " (" + ", ".join(f"{s}: {v['tokens']:,} tokens" for s, v in per.items()) + ")"
    if ppl.get("largest_source") and len(per) > 1 and per[ppl["largest_source"]]["share"] >= 0.5:
        text += f"; {ppl['largest_source']} is {100 * per[ppl['largest_source']]['share']:.0f}% of the overall figure's tokens"
    groups: dict[str, list[str]] = {}  # why -> sources
    every = ppl["heldout_every"]
    for s, why in ppl["without_heldout"].items():
        if every <= 0:
            why = "no document is held out: curriculum.heldout_every is 0"
        elif cov[s]["heldout_documents"] == 0:
            why = f"fewer than {every} documents, so none is held out (curriculum.heldout_every)"
        groups.setdefault(why, []).append(s)
    for why, sources in groups.items():
        text += f"; none for {', '.join(sources)}: {why}"
    return text


def _coverage_rows(ppl: dict) -> list[list[str]]:
    """Every source: its documents, held-out documents and tokens, and who scores them (or why not)."""
    rows = []
    for s, c in ppl["coverage"].items():
        v = ppl["per_source"].get(s)
        audit = f"{v['tokens']:,} tokens ({v['method']})" if v else "none"
        rows.append([s, f"{c['documents']:,}", f"{c['heldout_documents']:,}", f"{c['heldout_tokens']:,}",
                     "yes" if c["validation"] else "no", audit, ppl["without_heldout"].get(s) or c["why"] or ""])
    return rows


COVERAGE_COLUMNS = ["source", "documents", "held-out documents", "held-out tokens", "training's validation", "audit figure",
                    "note"]


def _heldout_note(ppl: dict) -> list[str]:
    per = ppl["per_source"]
    every = ppl["heldout_every"]
    rule = (f"Document i of a source is held out (never trained on) when i % {every} == {every - 1} "
            "(curriculum.heldout_every): a source of fewer documents has none, and no figure." if every > 0 else
            "No document is held out (curriculum.heldout_every is 0): every document is trained on.")
    notes = [f"{rule} {len(per)} of {len(ppl['coverage'])} sources have a figure here."]
    big = ppl.get("largest_source")
    if big and len(per) > 1:
        notes.append(f"The overall figure is weighted by tokens: {big} is {100 * per[big]['share']:.0f}% of them. "
                     f"Averaged over the sources, each counted once: {ppl['overall']['bpb_mean_of_sources']} bits/byte.")
    return notes


def write_reports(d: Path, summary: dict, df: pd.DataFrame, ppl: dict, figs: dict[str, Path],
                  contamination: dict | None = None) -> None:
    key = "judge_score" if df["judge_score"].notna().any() else "coherence"
    ranked = df.sort_values(key, ascending=False)
    best, worst = ranked.head(3), ranked.tail(3).iloc[::-1]
    cols = [c for c in ["coherence", "english_rate", "coh_gate", "coh_bigram", "coh_trigram", "coh_chars", "distinct_2",
                        "repetition"] if c in df.columns]
    by_domain = df.groupby("domain")[cols].mean().round(3)
    prompts = contamination["prompts"] if contamination else []
    mean_by_prompt = df.groupby("prompt")["coherence"].mean().round(2)
    flag = {p["prompt"]: p for p in prompts}
    ho_cols = ["nats/token", "bits/byte", "perplexity", "tokens", "share", "method"]
    ho_rows = [[s, v["loss"], v["bpb"], v["perplexity"], f"{v['tokens']:,}", f"{100 * v['share']:.1f}%", v["method"]]
               for s, v in ppl["per_source"].items()]
    ho_rows.append(["**all**", ppl["overall"]["loss"], ppl["overall"]["bpb"], ppl["overall"]["perplexity"],
                    f"{ppl['overall']['tokens']:,}", "100%", ""])
    judged = df["judge_score"].notna().any()
    sample_cols = ["domain", "prompt", "#", "coherence"] + (["judge_score"] if judged else []) + ["in training data", "text"]

    def sample_row(r) -> list:
        text = " ".join(str(r["text"]).split())
        return ([r["domain"], r["prompt"], r["sample"], r["coherence"]] + ([r["judge_score"]] if judged else [])
                + ["YES" if r.get("contaminated") else "no", text[:100] + ("…" if len(text) > 100 else "")])

    def verdict(r) -> str:
        return (f", judge {r['judge_score']}: {r['judge_reason']}" if pd.notna(r["judge_score"]) else "") + (
            f" — {r['contamination']}" if r.get("contaminated") else "")

    # ------------------------------------------------------------------ Markdown
    def md_table(header: list, rows: list[list]) -> list[str]:
        esc = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(esc(v) for v in r) + " |" for r in rows]

    md = [f"# Audit of {summary['model']} at step {summary['step']}", ""]
    md += md_table(["", "value", "what it is"], [[k.replace("_", " "), v, SUMMARY_CAPTIONS.get(k, "")]
                                                  for k, v in summary.items() if k not in ("model", "step")]) + [""]
    if contamination:
        md += ["## Prompts and the training data", "",
               f"Each prompt was checked against the {contamination['documents']:,} training documents (every document "
               f"of the shards but the held-out ones): verbatim, whole (lower-cased, without punctuation) and by runs of "
               f"{contamination['ngram_words']} words. A prompt found there is answered from memory: its samples flatter "
               "the model.", ""]
        md += md_table(["domain", "prompt", "in training data", "mean coherence"],
                       [[p["domain"], p["prompt"], p["described"] + (f": “{p['excerpt']}”" if p["excerpt"] else ""),
                         mean_by_prompt.get(p["prompt"])] for p in prompts]) + [""]
    md += ["## Per domain (means of the built-in judges)", "", by_domain.to_markdown() if _has_tabulate() else by_domain.to_string(), ""]
    md += [f"- **{c}**: {COLUMN_CAPTIONS[c]}" for c in cols] + [""]
    md += ["## Held-out documents (never trained on)", "", *_heldout_note(ppl), ""]
    md += md_table(["source", *ho_cols], ho_rows) + [""]
    md += [f"- **{c}**: {HELDOUT_CAPTIONS[c]}" for c in ho_cols] + [""]
    md += ["### Every source's held-out text", ""] + md_table(COVERAGE_COLUMNS, _coverage_rows(ppl)) + [""]
    for title, path in figs.items():
        md += [f"## {title}", "", f"![{title}](plots/{path.name})", ""]
    for title, part in (("Best samples", best), ("Worst samples", worst)):
        md += [f"## {title} (by {key.replace('_', ' ')})", ""]
        for _, r in part.iterrows():
            md += [f"**{r['domain']}** — {r['prompt']} — coherence {r['coherence']}{verdict(r)}", "", "```", r["text"], "```", ""]
    md += ["## All samples", ""] + md_table(sample_cols, [sample_row(r) for _, r in df.iterrows()]) + [""]
    md += [f"- **{c}**: {COLUMN_CAPTIONS[c]}" for c in sample_cols if c in COLUMN_CAPTIONS] + [""]
    (d / "report.md").write_text("\n".join(md), encoding="utf-8")

    # ------------------------------------------------------------------ HTML
    e = html.escape

    def html_table(header: list, rows: list[list]) -> str:
        head = "".join(f"<th>{e(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{e(str(v)).replace('**', '')}</td>" for v in r) + "</tr>" for r in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    def captions(names) -> str:
        return "<ul class='captions'>" + "".join(f"<li><b>{e(c)}</b>: {e(t)}</li>" for c, t in names) + "</ul>"

    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Audit of {e(summary['model'])}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left}"
             ".captions{font-size:.9em;color:#444}"
             "pre{white-space:pre-wrap;background:#f6f6f6;padding:.6em}img{max-width:100%}</style></head><body>",
             f"<h1>Audit of {e(summary['model'])} at step {summary['step']}</h1>"]
    parts += [html_table(["", "value", "what it is"], [[k.replace("_", " "), v, SUMMARY_CAPTIONS.get(k, "")]
                                                       for k, v in summary.items() if k not in ("model", "step")])]
    if contamination:
        parts += ["<h2>Prompts and the training data</h2>",
                  f"<p>Each prompt was checked against the {contamination['documents']:,} training documents (every "
                  f"document of the shards but the held-out ones): verbatim, whole (lower-cased, without punctuation) "
                  f"and by runs of {contamination['ngram_words']} words. A prompt found there is answered from memory: "
                  "its samples flatter the model.</p>",
                  html_table(["domain", "prompt", "in training data", "mean coherence"],
                             [[p["domain"], p["prompt"], p["described"] + (f": “{p['excerpt']}”" if p["excerpt"] else ""),
                               mean_by_prompt.get(p["prompt"])] for p in prompts])]
    parts += ["<h2>Per domain (means of the built-in judges)</h2>", by_domain.to_html(),
              captions((c, COLUMN_CAPTIONS[c]) for c in cols),
              "<h2>Held-out documents (never trained on)</h2>", *[f"<p>{e(n)}</p>" for n in _heldout_note(ppl)],
              html_table(["source", *ho_cols], [[str(v).replace("**", "") for v in r] for r in ho_rows]),
              captions((c, HELDOUT_CAPTIONS[c]) for c in ho_cols),
              "<h3>Every source's held-out text</h3>", html_table(COVERAGE_COLUMNS, _coverage_rows(ppl))]
    for title, path in figs.items():
        b64 = base64.b64encode(path.read_bytes()).decode("ascii")
        parts += [f"<h2>{e(title)}</h2><img class='plot' alt='{e(title)}' src='data:image/png;base64,{b64}'>"]
    for title, part in (("Best samples", best), ("Worst samples", worst)):
        parts += [f"<h2>{title} (by {e(key.replace('_', ' '))})</h2>"]
        for _, r in part.iterrows():
            parts += [f"<p><b>{e(r['domain'])}</b> — {e(r['prompt'])} — coherence {r['coherence']}{e(verdict(r))}</p><pre>{e(r['text'])}</pre>"]
    parts += ["<h2>All samples</h2>", html_table(sample_cols, [sample_row(r) for _, r in df.iterrows()]),
              captions((c, COLUMN_CAPTIONS[c]) for c in sample_cols if c in COLUMN_CAPTIONS)]
    parts += ["</body></html>"]
    (d / "report.html").write_text("\n".join(parts), encoding="utf-8")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401

        return True
    except ImportError:
        return False
