rule train:
    """Train a model. The run directory (checkpoints, state, logs) is not an output, so it
    survives Snakemake's removal of incomplete outputs and a re-run resumes from it."""
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
        slurm_partition=train_partition,
        runtime=4320,
        mem_mb=config["cluster"]["train_mem_mb"],
    params:
        runs=lambda wildcards: f"{RESULTS}/{wildcards.model}/runs",
        force=config.get("force_train", False),
    script:
        "../scripts/train.py"
