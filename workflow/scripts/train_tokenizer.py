"""Snakemake job for rule train_tokenizer: a thin call into andrea.tokenizer."""

from pathlib import Path

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.io import setup_logging
from andrea.tokenizer import train_tokenizer

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    train_tokenizer(
        snakemake.input.megachat,
        Path(snakemake.output.manifest).parent,
        int(snakemake.wildcards.n),
        snakemake.params.config,  # the config of the data profile this version is of
        snakemake.params.version,
    )
