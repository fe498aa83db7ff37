rule fetch_data:
    """Download every hub dataset of a data profile into fetch_dir, once (andrea.fetch): the data
    stages then read the copies with no network. Where the hub cannot be reached, it fails within
    about hermes3.hub_timeout_s, before any long stage, naming the datasets missing, the fetch
    command to run where there is network, and how to train on the embedded corpus instead.
    """
    output:
        f"{FETCH_DIR}/profiles/{{profile}}.json",
    log:
        f"{RESULTS}/logs/fetch_data/{{profile}}.log",
    wildcard_constraints:
        profile="|".join(HUB_PROFILES) or "(?!)",
    localrule: True
    conda:
        "../envs/andrea.yaml"
    params:
        datasets=lambda wildcards: [vars(w) for w in wanted(PCONFIG[wildcards.profile])],
    script:
        "../scripts/fetch_data.py"


# The first three stages, once per data profile: `snakemake filter_shape` runs the default
# profile's (data_profile, else embedded), `snakemake filter_shape_real` the real one's.
for _p in PROFILES:

    rule:
        name:
            stage_rule("pull_hermes3", _p)
        input:
            hermes3_input(_p),
        output:
            parts=expand(
                "{dir}/{part}.parquet",
                dir=stage_path("pull_hermes3", _p),
                part=HERMES3_PARTS,
            ),
            manifest=f"{stage_path('pull_hermes3', _p)}/manifest.json",
        log:
            log_path("pull_hermes3", _p),
        benchmark:
            benchmark_path("pull_hermes3", _p)
        conda:
            "../envs/andrea.yaml"
        threads: config["cluster"]["job_threads"]
        resources:
            slurm_partition=partition("cpu"),
            runtime=120,
            mem_mb=4000,
        params:
            hermes3=PCONFIG[_p]["hermes3"],
            strict=config["strict"],
            # the fetch folder: from the profile's fetch marker (<fetch_dir>/profiles/<profile>.json)
            hub_dir=lambda wildcards, input: hub_dir(input),
            version=PVERSIONS[_p]["pull_hermes3"],
        script:
            "../scripts/pull_hermes3.py"

    rule:
        name:
            stage_rule("prep_megachat", _p)
        input:
            parts=expand(
                "{dir}/{part}.parquet",
                dir=stage_path("pull_hermes3", _p),
                part=HERMES3_PARTS,
            ),
            fetched=fetched(_p),
        output:
            megachat=f"{stage_path('prep_megachat', _p)}/megachat.parquet",
            preview=f"{stage_path('prep_megachat', _p)}/preview.txt",
            manifest=f"{stage_path('prep_megachat', _p)}/manifest.json",
        log:
            log_path("prep_megachat", _p),
        benchmark:
            benchmark_path("prep_megachat", _p)
        conda:
            "../envs/andrea.yaml"
        threads: config["cluster"]["job_threads"]
        resources:
            slurm_partition=partition("cpu"),
            runtime=120,
            mem_mb=8000,
        params:
            config=stage_config("prep_megachat", _p),
            hub_dir=lambda wildcards, input: hub_dir(input),
            version=PVERSIONS[_p]["prep_megachat"],
        script:
            "../scripts/prep_megachat.py"

    rule:
        name:
            stage_rule("filter_shape", _p)
        input:
            megachat=f"{stage_path('prep_megachat', _p)}/megachat.parquet",
        output:
            megachat=f"{stage_path('filter_shape', _p)}/megachat.parquet",
            report=f"{stage_path('filter_shape', _p)}/report.json",
            removed=f"{stage_path('filter_shape', _p)}/removed_examples.jsonl",
            manifest=f"{stage_path('filter_shape', _p)}/manifest.json",
        log:
            log_path("filter_shape", _p),
        benchmark:
            benchmark_path("filter_shape", _p)
        conda:
            "../envs/andrea.yaml"
        threads: config["cluster"]["job_threads"]
        resources:
            slurm_partition=partition("cpu"),
            runtime=120,
            mem_mb=8000,
        params:
            filter_shape=config["filter_shape"],
            version=PVERSIONS[_p]["filter_shape"],
        script:
            "../scripts/filter_shape.py"
