"""Snakemake job for rule shards: record which shards a model trains on."""

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.io import setup_logging
from andrea.shards import write_model_shards

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    write_model_shards(snakemake.wildcards.model, snakemake.input[0], snakemake.output[0])
