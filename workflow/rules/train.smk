rule train:
    """Train a model. The rule's version (andrea.versions.train_version) covers everything the
    result depends on, so a changed setting re-runs it: the trainer then continues the run its key
    names (max_steps raised, floors or caps changed) or starts a new run directory (anything else).
    The run directory is not an output, so it survives Snakemake's removal of incomplete outputs
    and a re-run resumes from it. Its train.log keeps every attempt's log."""
    input:
        shards=f"{RESULTS}/{{model}}/shards.json",
    output:
        directory(f"{RESULTS}/{{model}}/ckpt"),
    log:
        f"{RESULTS}/logs/train/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}.tsv"
    conda:
        "../envs/andrea.yaml"
    threads: config["cluster"]["job_threads"]
    resources:
        gpu=train_resources,
        tasks=train_ranks,
        tasks_per_gpu=1,
        slurm_partition=train_partition,
        runtime=4320,
        mem_mb=config["cluster"]["train_mem_mb"],
    params:
        version=lambda wildcards: train_version(config, wildcards.model),
        run_dir=lambda wildcards: f"{RESULTS}/{wildcards.model}/runs/{train_run_key(config, wildcards.model)}",
    script:
        "../scripts/train.py"
