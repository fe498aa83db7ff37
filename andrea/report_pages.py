"""Pages of the Snakemake report (`snakemake --report report.html`) for the stages that write JSON.

The report shows images and HTML in place but offers a JSON file only as a download, so the shape
filter's report.json and the tokenizer's saturation.json are rendered here as small self-contained
HTML pages: the numbers a reader looks for as tables, the whole JSON below them.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from andrea.io import read_jsonl, write_text_atomic

STYLE = ("body{font-family:system-ui,sans-serif;max-width:980px;margin:1.5em auto;color:#222}"
         "table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:right}"
         "th:first-child,td:first-child{text-align:left;max-width:40em}pre{white-space:pre-wrap;background:#f6f6f6;padding:.6em}")
# What each column of the pages' tables means, shown under the table
CAPTIONS = {
    "read": "documents read from the source",
    "kept": "documents kept",
    "dropped_shape": "documents dropped: a user or assistant turn scored as system-prompt shaped",
    "dropped_empty": "documents dropped: no user and assistant turn left once system turns were removed",
    "system_turns_removed": "system turns removed from the documents",
    "kept %": "kept / read",
    "n": "labelled turns scored",
    "precision": "of the turns the scorer flags, the share that are system-prompt shaped (tp / (tp + fp))",
    "recall": "of the system-prompt shaped turns, the share the scorer flags (tp / (tp + fn))",
    "tp": "shaped turns flagged", "fp": "other turns flagged", "fn": "shaped turns missed", "tn": "other turns passed",
    "bytes": "UTF-8 bytes of the text",
    "tokens": "tokens the text encodes to",
    "bytes_per_token": "bytes / tokens: higher is a more compact encoding",
    "segment_coverage": "share of the bytes inside segments (multi-byte tokens)",
    "byte_fallback_share": "share of the bytes left to single-byte tokens (1 − segment_coverage)",
    "weight": "the source's curriculum weight (sources.<name>.weight)",
    "available_chars": "characters of the source's documents",
    "sampled_chars": "characters of them in the tokenizer's sample",
    "share": "the source's part of the sample's characters",
}
EXAMPLES_SHOWN = 20  # removed turns quoted on the filter page; the stage keeps more in its jsonl
EXAMPLE_CHARS = 400


def _read_json(path: str | Path, required: tuple[str, ...]) -> dict:
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    missing = [k for k in required if k not in doc]
    if missing:
        raise ValueError(f"{path}: missing key(s) {', '.join(missing)}; was it written by this version of andrea?")
    return doc


def _table(rows: dict[str, dict], index_name: str) -> str:
    """The rows as a table, with the caption of each of its columns below it."""
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = index_name
    notes = "".join(f"<li><b>{html.escape(str(c))}</b>: {html.escape(CAPTIONS[c])}</li>" for c in df.columns if c in CAPTIONS)
    return df.reset_index().to_html(border=0, index=False, na_rep="—") + (f"<ul class='captions'>{notes}</ul>" if notes else "")


def _fields(pairs: dict) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in pairs.items())
    return f"<table>{cells}</table>"


def _page(title: str, body: list[str], doc: dict, source: Path) -> str:
    e = html.escape
    raw = f"<details><summary>{e(source.name)} in full</summary><pre>{e(json.dumps(doc, indent=2))}</pre></details>"
    return "\n".join([f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
                      f"<style>{STYLE}</style></head><body><h1>{e(title)}</h1>", *body, raw, "</body></html>"])


def filter_shape_page(report_json: str | Path, removed_jsonl: str | Path, out_html: str | Path) -> None:
    """The shape filter's counts per source, the scorer's precision and recall on the labelled set,
    and the first removed turns with their scores."""
    report_json = Path(report_json)
    rep = _read_json(report_json, ("threshold", "totals", "per_source"))
    per_source = {**rep["per_source"], "all sources": rep["totals"]}
    for counts in per_source.values():
        counts["kept %"] = round(100 * counts["kept"] / counts["read"], 1) if counts["read"] else None
    body = [f"<p>System turns are removed from every conversation (<i>system_turns_removed</i>); a "
            "conversation left without a user and an assistant turn is dropped (<i>dropped_empty</i>); one "
            f"with a user or assistant turn whose system-prompt-shape score reaches {rep['threshold']} is "
            "dropped (<i>dropped_shape</i>).</p>",
            "<h2>Documents per source</h2>", _table(per_source, "source")]
    scores = {k: rep[k] for k in ("labelled_set", "labelled_set_cross_validated") if isinstance(rep.get(k), dict)}
    if scores:
        cols = ("n", "precision", "recall", "tp", "fp", "fn", "tn")
        body += ["<h2>The scorer on the labelled set</h2>",
                 _table({s.get("measure", name): {c: s.get(c) for c in cols} for name, s in scores.items()}, "measure")]
    removed = read_jsonl(removed_jsonl)
    body += [f"<h2>Removed turns ({min(len(removed), EXAMPLES_SHOWN)} of the {len(removed)} examples kept)</h2>"]
    for ex in removed[:EXAMPLES_SHOWN]:
        text = ex.get("text", "")
        text = text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + " …"
        body += [f"<p><b>{html.escape(str(ex.get('source')))}</b> {html.escape(str(ex.get('doc_id')))}, "
                 f"turn {ex.get('turn')} ({html.escape(str(ex.get('role')))}), score {ex.get('score')}</p>"
                 f"<pre>{html.escape(text)}</pre>"]
    write_text_atomic(out_html, _page(f"Shape filter: {rep['totals']['kept']} of {rep['totals']['read']} documents kept",
                                      body, rep, report_json))


def saturation_page(saturation_json: str | Path, out_html: str | Path) -> None:
    """Whether the sample held enough candidate segments for N, how well the segments cover the
    sample and the held-out documents, and what each source contributed to the sample."""
    saturation_json = Path(saturation_json)
    sat = _read_json(saturation_json, ("n_requested", "n_candidates", "n_kept", "saturated", "sample", "per_source"))
    verdict = ("SATURATED: the sample holds fewer candidate segments than N; the unused IDs are wasted"
               if sat["saturated"] else "not saturated: more candidates than N")
    fields = {"segments requested (N)": sat["n_requested"], "candidates found": sat["n_candidates"],
              "segments kept": sat["n_kept"], "candidates per requested segment": sat.get("candidate_ratio"),
              "unused IDs": sat.get("unused_ids"), "saturation": verdict}
    fields |= {k.replace("_", " "): sat[k] for k in ("chunk_types", "word_types", "words_cut") if k in sat}
    coverage = {"sample": sat["sample"]}
    if sat.get("heldout"):
        coverage["held-out documents"] = sat["heldout"]
    body = [_fields(fields),
            "<h2>Segments on the text (bytes per token; share of bytes inside segments; share left to byte tokens)</h2>",
            _table(coverage, "text"),
            "<h2>The sample per source (curriculum weight, characters available and sampled)</h2>",
            _table(sat["per_source"], "source")]
    write_text_atomic(out_html, _page(f"Tokenizer: N={sat['n_requested']}, {sat['sample']['bytes_per_token']} bytes per token",
                                      body, sat, saturation_json))
