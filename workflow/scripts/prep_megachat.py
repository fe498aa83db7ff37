"""Snakemake job for rule prep_megachat: a thin call into andrea.megachat."""

from pathlib import Path

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.io import setup_logging
from andrea.megachat import prep_megachat

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    prep_megachat(
        snakemake.params.config,  # the config of the data profile this version is of
        Path(snakemake.output.manifest).parent,
        snakemake.params.version,
        pull_dir=Path(snakemake.input.parts[0]).parent,
        hub_dir=snakemake.params.hub_dir,
        workers=snakemake.threads,
    )
