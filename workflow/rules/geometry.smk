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
    resources:
        gpu=train_resources,
        slurm_partition=train_partition,
        runtime=60,
        # the initial weights in float64, two directions and a checkpoint on the host: ~10 GB at 480M
        mem_mb=16000,
    params:
        geometry=lambda wildcards: geometry_settings(config, wildcards.model),
        prompts=lambda wildcards: geometry_prompts(
            config, geometry_settings(config, wildcards.model)
        ),
        megachat=config["megachat"],
    script:
        "../scripts/geometry.py"
