"""Snakemake job for rule audit: a thin call into andrea.audit."""

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.audit import run_audit
from andrea.io import setup_logging

# Worker processes (spawned) import this file again; only the main process runs the stage.
if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    run_audit(
        snakemake.input.ckpt,
        snakemake.input.shards,
        snakemake.params.audit,
        snakemake.params.heldout_every,
        snakemake.output[0],
        snakemake.params.megachat,
    )
