"""Snakemake job for rule train: a thin call into andrea.trainer."""

import os
import sys

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    # BLAS threads = the cores Snakemake gave this job (before NumPy loads BLAS)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(snakemake.threads)

    from andrea.io import setup_logging
    from andrea.trainer import Trainer

    setup_logging(snakemake.log[0])
    model, shards = snakemake.wildcards.model, snakemake.input.shards
    trainer = Trainer(snakemake.config, model, shards, snakemake.params.run_dir, force=snakemake.params.force)
    result = trainer.run(out_dir=snakemake.output[0])
    if not result["finished"]:
        # stopped by a signal: checkpoint written; no output, so the workflow re-runs (and resumes)
        sys.exit(1)
