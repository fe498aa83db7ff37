rule train_tokenizer:
    input:
        megachat=rules.filter_shape.output.megachat,
    output:
        segments=f"{TOKENIZER_DIR}/harris_segments.json",
        saturation=f"{TOKENIZER_DIR}/saturation.json",
        manifest=f"{TOKENIZER_DIR}/manifest.json",
    log:
        f"{RESULTS}/logs/train_tokenizer/N{{n}}-{VERSIONS['train_tokenizer']}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_tokenizer/N{{n}}-{VERSIONS['train_tokenizer']}.tsv"
    wildcard_constraints:
        n=r"\d+",
    conda:
        "../envs/andrea.yaml"
    resources:
        slurm_partition=partition("cpu"),
        runtime=120,
        mem_mb=16000,
    params:
        version=VERSIONS["train_tokenizer"],
    script:
        "../scripts/train_tokenizer.py"


rule encode:
    input:
        megachat=rules.filter_shape.output.megachat,
        segments=rules.train_tokenizer.output.segments,
    output:
        tokens=expand(
            "{dir}/{source}.tokens.bin",
            dir=ENCODE_DIR,
            source=SOURCES,
            allow_missing=True,
        ),
        offsets=expand(
            "{dir}/{source}.offsets.bin",
            dir=ENCODE_DIR,
            source=SOURCES,
            allow_missing=True,
        ),
        shards=expand(
            "{dir}/{source}.shard.json",
            dir=ENCODE_DIR,
            source=SOURCES,
            allow_missing=True,
        ),
        manifest=f"{ENCODE_DIR}/manifest.json",
    log:
        f"{RESULTS}/logs/encode/N{{n}}-{VERSIONS['encode']}.log",
    benchmark:
        f"{RESULTS}/benchmarks/encode/N{{n}}-{VERSIONS['encode']}.tsv"
    wildcard_constraints:
        n=r"\d+",
    conda:
        "../envs/andrea.yaml"
    threads: config["cluster"]["job_threads"]
    resources:
        slurm_partition=partition("cpu"),
        runtime=240,
        mem_mb=8000,
    params:
        sources=SOURCES,
        megachat=config["megachat"],
        version=VERSIONS["encode"],
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
