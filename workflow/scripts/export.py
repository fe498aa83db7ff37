"""Snakemake job for rule export: a thin call into andrea.export."""

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from pathlib import Path

from andrea.export import export_hf
from andrea.io import setup_logging

setup_logging(snakemake.log[0])
audit = snakemake.input.get("audit")  # the audit directory, when it has been run
export_hf(
    snakemake.input.ckpt,
    snakemake.output[0],
    "final",
    shards=snakemake.input.shards,
    audit_summary=Path(str(audit)) / "summary.json" if audit else None,
    sampling=snakemake.params.sampling,
    mcfg=snakemake.params.megachat,
)
