"""Snakemake job for rule encode: a thin call into andrea.shards."""

from pathlib import Path

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.io import setup_logging
from andrea.shards import encode_shards

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    encode_shards(
        snakemake.input.megachat,
        snakemake.input.segments,
        Path(snakemake.output.manifest).parent,
        snakemake.params.sources,
        snakemake.params.megachat,
        snakemake.params.version,
        workers=snakemake.threads,
    )
