rule train_tokenizer:
    input:
        megachat=lambda wildcards: f"{stage_path('filter_shape', profile_of('train_tokenizer', wildcards))}/megachat.parquet",
    output:
        segments=f"{TOKENIZER_DIR}/harris_segments.json",
        saturation=f"{TOKENIZER_DIR}/saturation.json",
        manifest=f"{TOKENIZER_DIR}/manifest.json",
    log:
        f"{RESULTS}/logs/train_tokenizer/N{{n}}-{{version}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_tokenizer/N{{n}}-{{version}}.tsv"
    wildcard_constraints:
        n=r"\d+",
        version=versions("train_tokenizer"),
    conda:
        "../envs/andrea.yaml"
    resources:
        slurm_partition=partition("cpu"),
        runtime=120,
        mem_mb=16000,
    params:
        config=lambda wildcards: stage_config(
            "train_tokenizer", profile_of("train_tokenizer", wildcards)
        ),
        version=lambda wildcards: wildcards.version,
    script:
        "../scripts/train_tokenizer.py"


rule encode:
    input:
        megachat=lambda wildcards: f"{stage_path('filter_shape', profile_of('encode', wildcards))}/megachat.parquet",
        segments=lambda wildcards: f"{stage_path('train_tokenizer', profile_of('encode', wildcards), wildcards.n)}/harris_segments.json",
    output:
        # the shards (<source>.tokens.bin, .offsets.bin, .shard.json of every source the profile
        # reads: their number differs by profile) are written atomically, listed in the manifest
        manifest=f"{ENCODE_DIR}/manifest.json",
    log:
        f"{RESULTS}/logs/encode/N{{n}}-{{version}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/encode/N{{n}}-{{version}}.tsv"
    wildcard_constraints:
        n=r"\d+",
        version=versions("encode"),
    conda:
        "../envs/andrea.yaml"
    threads: config["cluster"]["job_threads"]
    resources:
        slurm_partition=partition("cpu"),
        runtime=240,
        mem_mb=8000,
    params:
        sources=lambda wildcards: enabled_sources(
            PCONFIG[profile_of("encode", wildcards)]
        ),
        megachat=config["megachat"],
        version=lambda wildcards: wildcards.version,
    script:
        "../scripts/encode.py"


rule shards:
    """Per-model target: the token shards for the model's vocabulary size."""
    input:
        model_encode_manifest,
    output:
        f"{RESULTS}/{{model}}/shards.json",
    log:
        f"{RESULTS}/logs/shards/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/shards/{{model}}.tsv"
    conda:
        "../envs/andrea.yaml"
    resources:
        slurm_partition=partition("cpu"),
        runtime=10,
        mem_mb=1000,
    script:
        "../scripts/shards.py"
