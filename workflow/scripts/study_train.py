"""Snakemake job for rule study_train: one arm × seed of a study, a thin call into andrea.launch.train
with the run's config (andrea.config.study_run_config); exit statuses as `andrea train`'s."""

import os
import sys

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(snakemake.threads)

    import logging

    from andrea.config import study_run_config
    from andrea.io import setup_logging
    from andrea.launch import train

    setup_logging(snakemake.log[0])
    w = snakemake.wildcards
    config = study_run_config(snakemake.config, w.study, w.arm, int(w.seed))
    model = snakemake.config["studies"][w.study]["model"]
    status, _, message = train(config, model, snakemake.input.shards, snakemake.params.run_dir, out=snakemake.output[0],
                               force=snakemake.config.get("force_train", False), again="run the workflow again")
    if message:
        logging.getLogger("andrea.train").error(message)
    sys.exit(int(status))
