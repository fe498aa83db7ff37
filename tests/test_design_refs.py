"""The design document's section references: every "design §N" cited in the repository (code,
schema, config, README, tests, benchmarks) names a section that docs/design.md has, and no citation
of the former spec, a file outside the repository, remains."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"

# Where citations live; generated or recorded output (results/, virtual environments) is skipped.
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".smk", ".txt", ".cu", ".cuh", ".sh", ".rst", ".toml", ".cfg", ".html", ".js"}
SKIP_DIRS = {".git", ".venv", "venv", "results", "data", "node_modules", "__pycache__", ".snakemake", ".pytest_cache"}

HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", re.M)
SECTION = r"§\s?\d+(?:\.\d+)*"
# "design §5.4", "docs/design.md §3.5", and the sections listed after one: "design §3.3, §6", "… §6 and §10"
CITATION = re.compile(rf"(?:\bdesign|docs/design\.md) ({SECTION}(?:(?:,\s*|\s+and\s+){SECTION})*)")
NUMBER = re.compile(r"§\s?(\d+(?:\.\d+)*)")
# built here so that this file does not cite what it looks for
STALE = ("SPEC" + " §", "shared/" + "SPEC.md")


def sections() -> set[str]:
    return set(HEADING.findall(DESIGN.read_text(encoding="utf-8")))


def repository_files():
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
        for name in files:
            path = Path(root) / name
            if path.suffix in SUFFIXES or name == "Snakefile":
                yield path


def citations() -> list[tuple[str, int, str]]:
    """(file, line, section) of every citation of the design document outside it."""
    out = []
    for path in repository_files():
        if path == DESIGN:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if "§" not in text:
            continue
        rel = str(path.relative_to(REPO))
        for lineno, line in enumerate(text.splitlines(), 1):
            for m in CITATION.finditer(line):
                out += [(rel, lineno, n) for n in NUMBER.findall(m.group(1))]
    return out


def test_design_sections_are_numbered_once_under_their_parents():
    numbers = HEADING.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(numbers) > 30, "docs/design.md: no numbered sections found (headings like '## 5. The data bandit')"
    duplicates = sorted({n for n in numbers if numbers.count(n) > 1})
    assert not duplicates, f"docs/design.md: section numbers used twice: {duplicates}"
    orphans = [n for n in numbers if "." in n and n.rsplit(".", 1)[0] not in numbers]
    assert not orphans, f"docs/design.md: subsections without their parent section: {orphans}"


def test_every_cited_section_exists():
    have = sections()
    found = citations()
    # the scan sees the citations the code is known to make (a scanner that finds nothing passes vacuously)
    assert ("andrea/checkpoint.py", 1, "3.5") in found
    assert len(found) >= 30, f"only {len(found)} citations found: is the scan looking in the right places?"
    missing = [f"{f}:{line}: design §{n}" for f, line, n in found if n not in have]
    assert not missing, "citations of sections docs/design.md does not have:\n" + "\n".join(missing)


def test_design_cross_references_exist():
    have = sections()
    text = DESIGN.read_text(encoding="utf-8")
    missing = [f"docs/design.md:{i}: §{n}" for i, line in enumerate(text.splitlines(), 1)
               for n in NUMBER.findall(line) if n not in have]
    assert not missing, "references inside the design to sections it does not have:\n" + "\n".join(missing)


def test_no_citation_of_the_former_spec():
    stale = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if any(s in line for s in STALE):
                stale.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:100]}")
    assert not stale, "cite docs/design.md (design §N) instead of the spec outside the repository:\n" + "\n".join(stale)
