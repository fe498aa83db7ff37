"""Snakemake job for rule geometry: a thin call into andrea.geometry."""

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.geometry import run_geometry
from andrea.io import setup_logging

if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    run_geometry(
        snakemake.input.ckpt,
        snakemake.input.shards,
        snakemake.params.geometry,
        snakemake.output[0],
        snakemake.params.prompts,
        snakemake.params.megachat,
    )
