# Curriculum studies (config `studies:`, design §9.7): every arm × seed of a study is a training run
# of its own (study_train), at the study's token budget; study_report reads them all and writes
# the table, plots and tokens-to-target figure into results/studies/<name>/.
#
#   snakemake --cores 16 --resources gpu_share=4 study_<name>   (or results/studies/<name>/report.html)
#
# gpu_share: each run takes one; --resources gpu_share=N lets N small runs share one GPU (none given:
# as many as --cores and the runs' threads allow).
rule study_train:
    """One arm × seed of a study: `andrea train` of the run's config. Its run directory, named by
    its train version beside the output, is not an output: a stopped run resumes from it.
    """
    input:
        shards=lambda wildcards: f"{RESULTS}/{STUDIES[wildcards.study]['model']}/shards.json",
    output:
        directory(f"{RESULTS}/studies/{{study}}/runs/{{arm}}/seed{{seed}}/ckpt"),
    log:
        f"{RESULTS}/logs/study_train/{{study}}/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/study_train/{{study}}/{{arm}}/seed{{seed}}.tsv"
    wildcard_constraints:
        study=study_pattern(STUDIES),
        arm=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
        seed=r"\d+",
    conda:
        "../envs/andrea.yaml"
    threads: config["cluster"]["job_threads"]
    resources:
        gpu=study_gpu,
        gpu_share=1,
        slurm_partition=lambda wildcards: partition(
            "gpu" if study_gpu(wildcards) else "cpu"
        ),
        runtime=4320,
        mem_mb=config["cluster"]["train_mem_mb"],
    params:
        version=study_train_version,
        run_dir=lambda wildcards: f"{RESULTS}/studies/{wildcards.study}/runs/{wildcards.arm}/seed{wildcards.seed}/{study_train_version(wildcards)}",
    script:
        "../scripts/study_train.py"


rule study_report:
    """The study's figures from all its runs (andrea.study): table, plots, tokens to target."""
    input:
        ckpts=study_ckpts,
        shards=lambda wildcards: f"{RESULTS}/{STUDIES[wildcards.study]['model']}/shards.json",
    output:
        report=report(
            f"{RESULTS}/studies/{{study}}/report.html",
            caption="../report/study.rst",
            category="Studies",
            subcategory="{study}",
            labels={"page": "report"},
        ),
        curves=report(
            f"{RESULTS}/studies/{{study}}/curves.png",
            caption="../report/study_curves.rst",
            category="Studies",
            subcategory="{study}",
            labels={"page": "curves"},
        ),
        sources=report(
            f"{RESULTS}/studies/{{study}}/sources.png",
            caption="../report/study_sources.rst",
            category="Studies",
            subcategory="{study}",
            labels={"page": "sources"},
        ),
        mix=report(
            f"{RESULTS}/studies/{{study}}/mix.png",
            caption="../report/study_mix.rst",
            category="Studies",
            subcategory="{study}",
            labels={"page": "mix"},
        ),
        table=f"{RESULTS}/studies/{{study}}/table.md",
        summary=f"{RESULTS}/studies/{{study}}/summary.json",
    log:
        f"{RESULTS}/logs/study_report/{{study}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/study_report/{{study}}.tsv"
    wildcard_constraints:
        study=study_pattern(STUDIES),
    localrule: True
    conda:
        "../envs/andrea.yaml"
    params:
        study=lambda wildcards: STUDIES[wildcards.study],
        max_steps=lambda wildcards: study_max_steps(config, wildcards.study),
    script:
        "../scripts/study_report.py"


# `snakemake study_<name>`: a study by its name (characters other than letters, digits and _ become _)
for _s in STUDIES:

    rule:
        name:
            study_rule_name(_s)
        input:
            f"{RESULTS}/studies/{_s}/report.html",
        localrule: True
