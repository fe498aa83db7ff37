"""Snakemake job for rule geometry: a thin call into andrea.geometry."""

import os

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

if __name__ == "__main__":
    # NumPy's BLAS uses the threads Snakemake gave the job, not every core: set before numpy loads
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(snakemake.threads)

    from andrea.geometry import run_geometry
    from andrea.io import setup_logging

    setup_logging(snakemake.log[0])
    run_geometry(
        snakemake.input.ckpt,
        snakemake.input.shards,
        snakemake.params.geometry,
        snakemake.output[0],
        snakemake.params.prompts,
        snakemake.params.megachat,
    )
