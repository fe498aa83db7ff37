"""filter_shape: drop system-prompt-shaped records and strip system turns (design §7).

- System turns are removed from every conversation (they are never rendered into training text).
- A conversation any of whose user or assistant turns has system-prompt shape is dropped.
- Plain-text documents are kept as they are, unless `apply_to_text_documents` asks to score them
  paragraph by paragraph too.
The stage reports counts per source and keeps examples of what it removed. A required source all of
whose documents it removes stops it (an optional one is a warning): nothing of it would reach training.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

from andrea.io import AtomicParquetWriter, Manifest, progress, write_json_atomic, write_jsonl_atomic
from andrea.megachat import MEGACHAT_SCHEMA, iter_megachat
from andrea.parallel import ordered_map
from andrea.shape import cross_validated_quality, evaluate, has_system_prompt_shape, shape_score

log = logging.getLogger("andrea.filter")


def _flagged_turn(turns: list[dict], threshold: float):
    for i, t in enumerate(turns):
        # has_system_prompt_shape() is the cheap test; the explained score only for what it flags
        if t["role"] in ("user", "assistant") and has_system_prompt_shape(t["text"], threshold):
            s = shape_score(t["text"])
            return {"turn": i, "role": t["role"], "text": t["text"][:600], "score": s.score, "features": s.features}
    return None


def _flagged_paragraph(text: str, threshold: float):
    for i, para in enumerate(p for p in text.split("\n\n") if p.strip()):
        if has_system_prompt_shape(para, threshold):
            s = shape_score(para)
            return {"paragraph": i, "text": para[:600], "score": s.score, "features": s.features}
    return None


def judge(row: dict, fcfg: dict) -> tuple[str, dict, dict | None]:
    """Decide one megachat row: ("keep", row without system turns, None), ("empty", row, None)
    or ("shape", row, what was flagged)."""
    if row["turns"] is not None:
        turns = [t for t in row["turns"] if t["role"] != "system"]
        row = {**row, "turns": turns, "_system_removed": len(row["turns"]) - len(turns)}
        if not any(t["role"] == "user" for t in turns) or not any(t["role"] == "assistant" for t in turns):
            return "empty", row, None
        hit = _flagged_turn(turns, fcfg["threshold"])
    else:
        row = {**row, "_system_removed": 0}
        hit = _flagged_paragraph(row["text"], fcfg["threshold"]) if fcfg["apply_to_text_documents"] else None
    return ("shape", row, hit) if hit else ("keep", row, None)


def _judge_batch(args):
    rows, fcfg = args
    return [judge(r, fcfg) for r in rows]


def _batches(rows, size):
    batch = []
    for r in rows:
        batch.append(r)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class SourceFilteredAway(ValueError):
    """A required source all of whose documents the filter removed."""


def _prep_sources(megachat_path: Path) -> dict | None:
    """The enabled sources (with their settings) of the prep_megachat run that wrote this corpus,
    from its manifest beside it; None for a corpus without one (a file given by hand)."""
    try:
        m = json.loads((megachat_path.parent / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("stage") != "prep_megachat":
        return None
    return (m.get("params") or {}).get("sources")


def _removal(row: dict, verdict: str, hit: dict | None) -> str:
    """What removed one document, in a few words with its id (for a source's first)."""
    if verdict == "empty":
        return f"{row['doc_id']}, has no user or no assistant turn once its system turns are removed"
    part = f"its {hit['role']} turn {hit['turn']}" if "turn" in hit else f"its paragraph {hit['paragraph']}"
    return f"{row['doc_id']}, was dropped for {part} scoring {hit['score']:.2f}: {hit['text'][:160]!r}"


def _vanished(per_source: dict, first_removed: dict, sources: dict | None, threshold: float) -> None:
    """A source that reached the filter with documents and left it with none is no bandit arm:
    the trainer would leave it out and train without it, silently. prep_megachat stops for a
    required source that yields nothing; so does this stage when the filter removes all of one,
    since nothing of it reaches training (unlike duplicates, which live on under another source),
    in strict mode as in any other: that is no malformed record but a source lost whole. An
    optional source, or any source of a corpus whose prep manifest is not beside it (a file given
    by hand: which sources it must hold is unknown), is a warning."""
    for src, c in per_source.items():
        if c["read"] == 0 or c["kept"]:
            continue
        message = (
            f"filter_shape removed every document of source {src}: {c['read']} read, {c['dropped_shape']} with "
            f"system-prompt shape (score >= filter_shape.threshold {threshold}), {c['dropped_empty']} with no user or "
            f"no assistant turn once system turns are removed; the first removed, {first_removed[src]}. "
            f"Nothing of it would reach training. If its "
            f"data is what it should be, raise filter_shape.threshold; if not, point the source at other data, or "
            f"leave it out with `enabled: false` (or `optional: true` to go on without it)."
        )
        if sources is not None and src in sources and not sources[src].get("optional", False):
            raise SourceFilteredAway(message)
        log.warning("filter_shape: %s", message)


def filter_shape(
    megachat_path: str | Path, out_dir: str | Path, fcfg: dict, version: str, workers: int = 1
) -> dict:
    """Run the stage: <out_dir>/megachat.parquet (kept records), report.json,
    removed_examples.jsonl, manifest.json. Returns the report. Scoring runs in `workers`
    processes; the output is identical whatever their number."""
    out_dir = Path(out_dir)
    threshold = fcfg["threshold"]
    manifest = Manifest("filter_shape", version, {"filter_shape": fcfg})
    manifest.add_input(megachat_path)
    per_source: dict[str, dict] = defaultdict(
        lambda: {"read": 0, "kept": 0, "dropped_shape": 0, "dropped_empty": 0, "system_turns_removed": 0}
    )
    examples: dict[str, list] = defaultdict(list)
    first_removed: dict[str, str] = {}  # source -> what removed its first removed document
    jobs = ((batch, fcfg) for batch in _batches(iter_megachat(megachat_path), 2048))
    decisions = ordered_map(_judge_batch, jobs, workers)
    n = 0
    with AtomicParquetWriter(out_dir / "megachat.parquet", MEGACHAT_SCHEMA) as writer:
        for batch in progress(decisions, desc="filter_shape", unit=" batches"):
            for verdict, row, hit in batch:
                c = per_source[row["source"]]
                c["read"] += 1
                c["system_turns_removed"] += row.pop("_system_removed")
                if verdict != "keep" and row["source"] not in first_removed:
                    first_removed[row["source"]] = _removal(row, verdict, hit)
                if verdict == "empty":
                    c["dropped_empty"] += 1
                elif verdict == "shape":
                    c["dropped_shape"] += 1
                    if len(examples[row["source"]]) < fcfg["examples_per_source"]:
                        examples[row["source"]].append({"source": row["source"], "doc_id": row["doc_id"], **hit})
                else:
                    writer.write(row)
                    c["kept"] += 1
            n += len(batch)
            if n % 102_400 < len(batch):
                log.info("filter_shape: %d documents judged", n)
        # before the corpus is committed: a stopped stage leaves no megachat.parquet behind
        _vanished(per_source, first_removed, _prep_sources(Path(megachat_path)), threshold)

    quality = evaluate(threshold)
    held_out = cross_validated_quality()
    report = {
        "threshold": threshold,
        "totals": {k: sum(v[k] for v in per_source.values()) for k in ("read", "kept", "dropped_shape", "dropped_empty", "system_turns_removed")},
        "per_source": dict(per_source),
        # In-sample: the shipped weights were fitted on this set, at this stage's threshold.
        "labelled_set": {
            "measure": "in-sample (the shipped weights were fitted on this set; flatters the scorer)",
            **{k: v for k, v in quality.items() if k != "misclassified"},
        },
        # Held out: weights and threshold refitted on the training folds, scored on the held-out
        # fold (at the fitted threshold, which shape scores put at 0.5).
        "labelled_set_cross_validated": {
            "measure": f"held-out: {held_out['method']}; weights and threshold fitted on the training folds only",
            **{k: v for k, v in held_out.items() if k not in ("misclassified", "method")},
        },
    }
    write_json_atomic(out_dir / "report.json", report)
    write_jsonl_atomic(out_dir / "removed_examples.jsonl", [e for ex in examples.values() for e in ex])
    manifest.add_output(out_dir / "megachat.parquet", rows=report["totals"]["kept"])
    manifest.data["counts"] = report["totals"] | {"per_source": dict(per_source)}
    manifest.write(out_dir / "manifest.json")
    for src, v in per_source.items():
        log.info(
            "filter_shape: %-18s read %7d kept %7d dropped(shape) %6d dropped(empty) %5d system turns removed %6d",
            src, v["read"], v["kept"], v["dropped_shape"], v["dropped_empty"], v["system_turns_removed"],
        )
    log.info(
        "filter_shape: labelled set precision %.3f recall %.3f held out (cross-validated), %.3f / %.3f in-sample at threshold %.2f",
        held_out["precision"], held_out["recall"], quality["precision"], quality["recall"], threshold,
    )
    return report
