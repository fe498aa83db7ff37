"""Imported first by every job script: makes the `andrea` package of this checkout importable,
whether or not it is installed in the job's environment (Snakemake puts this folder on sys.path)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
