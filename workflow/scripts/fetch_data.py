"""Snakemake job for rule fetch_data: a thin call into andrea.fetch."""

import logging
import sys
from pathlib import Path

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.fetch import FetchError, fetch_profile
from andrea.io import setup_logging

if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    try:
        # the output is <fetch_dir>/profiles/<profile>.json
        fetch_profile(snakemake.config, snakemake.wildcards.profile, dest=Path(snakemake.output[0]).parents[1])
    except FetchError as e:  # expected: one paragraph saying what to do, no traceback
        logging.getLogger("andrea.fetch").error("%s", e)
        sys.exit(2)
