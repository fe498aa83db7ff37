"""Snakemake job for rule train: a thin call into andrea.launch.train (the exit statuses are
andrea.launch.Exit's, as `andrea train`'s)."""

import os
import sys

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    # BLAS threads = the cores Snakemake gave this job (before NumPy loads BLAS)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(snakemake.threads)

    import logging

    from andrea.io import setup_logging
    from andrea.launch import train

    setup_logging(snakemake.log[0])
    # a run that does not finish writes no output: the job fails, and the workflow run again resumes
    # from the run directory's checkpoint (data parallelism, train.<model>.ranks > 1: the ranks run
    # `andrea train`, rank 0 writes)
    status, _, message = train(snakemake.config, snakemake.wildcards.model, snakemake.input.shards,
                               snakemake.params.run_dir, out=snakemake.output[0],
                               force=snakemake.config.get("force_train", False), again="run the workflow again")
    if message:
        logging.getLogger("andrea.train").error(message)
    sys.exit(int(status))
