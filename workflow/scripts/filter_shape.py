"""Snakemake job for rule filter_shape: a thin call into andrea.filter."""

from pathlib import Path

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.filter import filter_shape
from andrea.io import setup_logging

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    filter_shape(
        snakemake.input.megachat,
        Path(snakemake.output.manifest).parent,
        snakemake.params.filter_shape,
        snakemake.params.version,
        workers=snakemake.threads,
    )
