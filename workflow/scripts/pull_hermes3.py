"""Snakemake job for rule pull_hermes3: a thin call into andrea.hermes3."""

from pathlib import Path

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.hermes3 import pull_hermes3
from andrea.io import setup_logging

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    pull_hermes3(
        snakemake.params.hermes3,
        Path(snakemake.output.manifest).parent,
        snakemake.params.version,
        strict=snakemake.params.strict,
        hub_dir=snakemake.params.hub_dir,
        workers=snakemake.threads,
    )
