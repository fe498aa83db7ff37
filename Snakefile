# ANDREA: grow small GPT language models from open chat data, with a learned data curriculum.
#
#   snakemake --cores 2                 the whole pipeline for ANDREA-tiny: data → … → audit, geometry
#   snakemake --cores 1 results/ANDREA-120M/ckpt   train a model on its data profile (real: fetched first)
#   snakemake --cores 1 results/ANDREA-120M/ckpt --config data_profile=embedded   ... on the demo corpus
#   snakemake --cores 2 results/ANDREA-12M/shards.json   tokenizer and shards for one model
#   snakemake --cores 1 filter_shape    one stage and whatever it needs
#   snakemake --cores 1 --forcerun prep_megachat filter_shape
#   snakemake --report report.html      after a run: the audit, its plots and the data pages in one page
#   snakemake --cores 16 --resources gpu_share=4 study_NAME   a curriculum study (config studies:)
#
# Each stage writes into a directory named by a hash of its parameters and of the versions
# upstream of it (andrea/versions.py): a changed parameter re-runs exactly that stage and the
# stages after it, and earlier versions stay on disk.
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

# The workflow imports the package from this checkout, installed or not; so do the jobs
# (workflow/scripts/_checkout.py), also inside --use-conda environments.
sys.path.insert(0, str(Path(workflow.basedir).resolve()))

from andrea.config import workflow_config
from andrea.versions import record_versions, where_results


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# Validated (values typed on the command line, such as --config force_train=true, coerced to the
# schema's types first), defaults filled and every local input path checked, before any job: a bad
# config ends here in the lines `andrea config validate` prints (ANDREA_DEBUG=1: with the schema).
# The error names the files the config came from: config/config.yaml and any --configfile overlays
_config_files = list(
    dict.fromkeys(["config/config.yaml", *map(str, workflow.configfiles)])
)
config.update(
    workflow_config(
        config,
        source=" with ".join(_config_files)
        + (" and --config" if workflow.config_settings.config else ""),
    )
)


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/tokens.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/audit.smk"
include: "workflow/rules/geometry.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/study.smk"


QUICKSTART = model_profile(
    config, "ANDREA-tiny"
)  # the data profile the quickstart trains on


rule all:
    default_target: True
    input:
        f"{RESULTS}/ANDREA-tiny/audit",
        f"{RESULTS}/ANDREA-tiny/geometry",
        f"{RESULTS}/report/filter_shape/{PVERSIONS[QUICKSTART]['filter_shape']}.html",
        f"{RESULTS}/report/train_tokenizer/N{model_n_segments('ANDREA-tiny')}-{PVERSIONS[QUICKSTART]['train_tokenizer']}.html",


onstart:
    # each version's parameters, for naming what changed when a later config makes a new one
    record_versions(config, PROFILES)


onsuccess:
    # where this run's results are: the targets' model folders, reports and the logs
    _targets = [
        str(f) for job in workflow.dag.targetjobs for f in [*job.input, *job.output]
    ]
    for _line in where_results(config, _targets):
        print(_line)
