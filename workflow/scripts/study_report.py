"""Snakemake job for rule study_report: a thin call into andrea.study.write_study."""

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

if __name__ == "__main__":
    import logging

    from andrea.io import setup_logging
    from andrea.study import write_study

    setup_logging(snakemake.log[0])
    name = snakemake.wildcards.study
    st = snakemake.config["studies"][name]
    ckpts = dict(zip([(arm, seed) for arm in st["arms"] for seed in st["seeds"]], snakemake.input.ckpts))
    out = {k: snakemake.output[k] for k in ("report", "curves", "sources", "mix", "table", "summary")}
    summary = write_study(snakemake.config, name, ckpts, snakemake.input.shards, out)
    logging.getLogger("andrea.study").info("study %s: %s", name, out["table"])
