rule pull_hermes3:
    input:
        hermes3_input,
    output:
        parts=expand("{dir}/{part}.parquet", dir=PULL_DIR, part=HERMES3_PARTS),
        manifest=f"{PULL_DIR}/manifest.json",
    log:
        log_path("pull_hermes3"),
    benchmark:
        benchmark_path("pull_hermes3")
    conda:
        "../envs/andrea.yaml"
    resources:
        slurm_partition=partition("cpu"),
        runtime=120,
        mem_mb=4000,
    params:
        hermes3=config["hermes3"],
        strict=config["strict"],
        version=VERSIONS["pull_hermes3"],
    script:
        "../scripts/pull_hermes3.py"


rule prep_megachat:
    input:
        parts=rules.pull_hermes3.output.parts,
    output:
        megachat=f"{PREP_DIR}/megachat.parquet",
        preview=f"{PREP_DIR}/preview.txt",
        manifest=f"{PREP_DIR}/manifest.json",
    log:
        log_path("prep_megachat"),
    benchmark:
        benchmark_path("prep_megachat")
    conda:
        "../envs/andrea.yaml"
    resources:
        slurm_partition=partition("cpu"),
        runtime=120,
        mem_mb=8000,
    params:
        version=VERSIONS["prep_megachat"],
    script:
        "../scripts/prep_megachat.py"


rule filter_shape:
    input:
        megachat=rules.prep_megachat.output.megachat,
    output:
        megachat=f"{FILTER_DIR}/megachat.parquet",
        report=f"{FILTER_DIR}/report.json",
        removed=f"{FILTER_DIR}/removed_examples.jsonl",
        manifest=f"{FILTER_DIR}/manifest.json",
    log:
        log_path("filter_shape"),
    benchmark:
        benchmark_path("filter_shape")
    conda:
        "../envs/andrea.yaml"
    threads: config["cluster"]["job_threads"]
    resources:
        slurm_partition=partition("cpu"),
        runtime=120,
        mem_mb=8000,
    params:
        filter_shape=config["filter_shape"],
        version=VERSIONS["filter_shape"],
    script:
        "../scripts/filter_shape.py"
