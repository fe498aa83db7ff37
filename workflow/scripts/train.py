"""Snakemake job for rule train: a thin call into andrea.trainer."""

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
    from andrea.launch import train_as_ranks
    from andrea.optim import NonFiniteHalt
    from andrea.trainer import CoherenceHalt, Trainer, TrainingRefused

    setup_logging(snakemake.log[0])
    log = logging.getLogger("andrea.train")
    model, shards = snakemake.wildcards.model, snakemake.input.shards
    force = snakemake.config.get("force_train", False)
    # data parallelism (train.<model>.ranks > 1): the ranks run `andrea train`, rank 0 writes
    launched = train_as_ranks(snakemake.config, model, shards, snakemake.params.run_dir, out=snakemake.output[0], force=force)
    if launched is not None:
        status, result = launched
        if status:
            log.error("the ranks failed (exit status %d): see %s/train.log", status, snakemake.params.run_dir)
            sys.exit(status)
        if not (result and result["finished"]):
            log.error("stopped at step %s, checkpoint written in %s; run the workflow again to resume",
                      result and result["step"], snakemake.params.run_dir)
            sys.exit(1)
        sys.exit(0)
    trainer = Trainer(snakemake.config, model, shards, snakemake.params.run_dir, force=force)
    try:
        result = trainer.run(out_dir=snakemake.output[0])
    except TrainingRefused as e:  # expected refusals: one paragraph, no traceback
        log.error("refusing to train: %s", e)
        sys.exit(2)
    except (CoherenceHalt, NonFiniteHalt) as e:
        log.error("halted: %s", e)
        sys.exit(3)
    if not result["finished"]:
        # stopped by a signal (a scheduler's SIGTERM, Ctrl-C): no output, so the workflow runs
        # the rule again, and the trainer resumes from the checkpoint it just wrote
        log.error("stopped at step %d, checkpoint written in %s; run the workflow again to resume",
                  result["step"], snakemake.params.run_dir)
        sys.exit(1)
