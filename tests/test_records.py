"""records/, the benchmarks' raw outputs: every path BENCHMARKS.md and README.md cite there exists, none
cites the old place (bench/results/), and every record folder has a row in the index (records/README.md),
so a move or a new record cannot silently leave a citation or the index behind."""

import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "records"
CITING = ["BENCHMARKS.md", "README.md"]
# a path under records/ as the documents write it: up to a space, backquote, bracket or placeholder
CITED = re.compile(r"(?<![\w./-])records/[^\s`()\[\]<>|\"']*")
INDEX_ROW = re.compile(r"^\| `([^`]+)`")


def expand_braces(pattern: str) -> list[str]:
    """`parity-*.{md,png}` → `parity-*.md`, `parity-*.png` (shell brace expansion, which glob lacks)."""
    parts = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def cited_paths(text: str) -> list[str]:
    return [m.group(0).rstrip(".,;:") for m in CITED.finditer(text)]


def missing(cited: str) -> bool:
    """True when nothing in the repository matches the cited path (a glob must match at least one file)."""
    for pattern in expand_braces(cited):
        if any(ch in pattern for ch in "*?["):
            if not list(REPO.glob(pattern)):
                return True
        elif not (REPO / pattern).exists():
            return True
    return False


@pytest.mark.parametrize("doc", CITING)
def test_every_cited_record_exists(doc):
    text = (REPO / doc).read_text(encoding="utf-8")
    cited = cited_paths(text)
    assert cited or doc == "README.md", f"{doc} cites nothing under records/: has the folder been renamed?"
    gone = sorted({c for c in cited if missing(c)})
    assert not gone, f"{doc} cites records that do not exist: {gone}"


@pytest.mark.parametrize("doc", [*CITING, "bench"])
def test_nothing_cites_the_old_place(doc):
    """Raw results moved from bench/results/ to records/ (with git mv): a citation of the old place is stale."""
    files = sorted(f for f in (REPO / doc).glob("*.*") if f.is_file()) if doc == "bench" else [REPO / doc]
    stale = [f.relative_to(REPO).as_posix() for f in files if "bench/results/" in f.read_text(encoding="utf-8")]
    assert not stale, f"{stale} cite bench/results/; the raw results are under records/ now"


def test_the_path_pattern_reads_citations_as_written():
    text = ("Raw results: `records/2026-12-01/sync/`. Plots: `records/2026-11-30/parity-ANDREA-*.{md,png}`,\n"
            "(records/2026-12-01/power/). records/<date>/<topic>/ bench/records/x myrecords/y")
    assert cited_paths(text) == ["records/2026-12-01/sync/", "records/2026-11-30/parity-ANDREA-*.{md,png}",
                                 "records/2026-12-01/power/", "records/"]
    assert expand_braces("a-*.{md,png}") == ["a-*.md", "a-*.png"]
    assert missing("records/2026-11-30/parity-ANDREA-*.{md,txt}")  # one of the two matches nothing


def test_every_record_folder_has_an_index_row():
    rows = [m.group(1) for line in (RECORDS / "README.md").read_text(encoding="utf-8").splitlines()
            if (m := INDEX_ROW.match(line))]
    assert rows, "records/README.md has no index rows (| `<date>/<topic>/` | ...)"
    assert not [r for r in rows if not (RECORDS / r).is_dir()], "the index names folders that do not exist"
    on_disk = set()
    for date in (d for d in RECORDS.iterdir() if d.is_dir()):
        on_disk |= {f"{date.name}/{t.name}/" for t in date.iterdir() if t.is_dir()}
        if any(f.is_file() for f in date.iterdir()):  # files beside the topic folders: the date has a row
            on_disk.add(f"{date.name}/")
    unindexed = sorted(on_disk - set(rows))
    assert not unindexed, f"record folders without a row in records/README.md: {unindexed}"
