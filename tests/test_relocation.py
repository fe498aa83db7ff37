"""A checkout moved or copied elsewhere keeps its results: the workflow's inputs inside the
checkout are recorded relative to it, so Snakemake finds nothing to re-run."""

import shutil
import subprocess
import sys

from conftest import REPO


def snakemake_in(checkout, *args):
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=checkout,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_moved_checkout_has_nothing_to_rerun(tmp_path):
    first = tmp_path / "first"
    first.mkdir()
    shutil.copy(REPO / "Snakefile", first)
    for d in ("workflow", "andrea", "config"):
        shutil.copytree(REPO / d, first / d, ignore=shutil.ignore_patterns("__pycache__", "*.so"))

    # pull_hermes3 is the stage whose input lies in the checkout (the embedded corpus)
    ran = snakemake_in(first, "pull_hermes3")
    assert "rule pull_hermes3:" in ran
    moved = tmp_path / "moved"
    first.rename(moved)
    plan = snakemake_in(moved, "-n", "pull_hermes3")
    assert "Nothing to be done" in plan, plan
    copied = tmp_path / "copied"
    shutil.copytree(moved, copied, symlinks=True)  # copy2 keeps the modification times
    plan = snakemake_in(copied, "-n", "pull_hermes3")
    assert "Nothing to be done" in plan, plan
