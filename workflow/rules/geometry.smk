rule geometry:
    """The geometry of a trained model (design §10.6): its embedding space, attention maps, loss
    surface and the curriculum's walk on the simplex of sources, as plots, one page and their numbers.
    Its parameters are the geometry section (the model's effective settings) and the prompts of
    its attention maps: changing them re-runs the geometry only, never training."""
    input:
        ckpt=f"{RESULTS}/{{model}}/ckpt",
        shards=f"{RESULTS}/{{model}}/shards.json",
    output:
        report(
            directory(f"{RESULTS}/{{model}}/geometry"),
            patterns=["{page,geometry}.html", "plots/{page}.png"],
            caption="../report/geometry.rst",
            category="Geometry",
            subcategory="{model}",
            labels={"page": "{page}"},
        ),
    log:
        f"{RESULTS}/logs/geometry/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/geometry/{{model}}.tsv"
    conda:
        "../envs/andrea.yaml"
    threads: config["cluster"]["job_threads"]
    resources:
        gpu=train_resources,
        slurm_partition=train_partition,
        runtime=60,
        # float32 vectors of all the weights on the host: the final and initial weights, two
        # directions and a checkpoint, ~10 GB at 480M with the GPU; NumPy holds the engine's four
        # (weights, gradients, moments) and the surface's sums too, ~20 GB at 480M (days of CPU)
        mem_mb=16000,
    params:
        geometry=lambda wildcards: geometry_settings(config, wildcards.model),
        prompts=lambda wildcards: geometry_prompts(
            config, geometry_settings(config, wildcards.model)
        ),
        megachat=config["megachat"],
    script:
        "../scripts/geometry.py"
