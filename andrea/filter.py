"""filter_shape: drop system-prompt-shaped records and strip system turns (SPEC §7).

- System turns are removed from every conversation (they are never rendered into training text).
- A conversation any of whose user or assistant turns has system-prompt shape is dropped.
- Plain-text documents are kept as they are, unless `apply_to_text_documents` asks to score them
  paragraph by paragraph too.
The stage reports counts per source and keeps examples of what it removed.
"""

from __future__ import annotations

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
    jobs = ((batch, fcfg) for batch in _batches(iter_megachat(megachat_path), 2048))
    decisions = ordered_map(_judge_batch, jobs, workers)
    n = 0
    with AtomicParquetWriter(out_dir / "megachat.parquet", MEGACHAT_SCHEMA) as writer:
        for batch in progress(decisions, desc="filter_shape", unit=" batches"):
            for verdict, row, hit in batch:
                c = per_source[row["source"]]
                c["read"] += 1
                c["system_turns_removed"] += row.pop("_system_removed")
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
