rule audit:
    """Samples, built-in judges (and an external judge when configured), loss and bits per byte on
    held-out documents (on the GPU when there is one), and a report. Its parameters are the audit
    section only: changing the prompt set re-runs the audit, not the training."""
    input:
        ckpt=f"{RESULTS}/{{model}}/ckpt",
        shards=f"{RESULTS}/{{model}}/shards.json",
    output:
        report(
            directory(f"{RESULTS}/{{model}}/audit"),
            patterns=["{page,report}.html", "plots/{page}.png"],
            caption="../report/audit.rst",
            category="Audit",
            subcategory="{model}",
            labels={"page": "{page}"},
        ),
    log:
        f"{RESULTS}/logs/audit/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/audit/{{model}}.tsv"
    conda:
        "../envs/andrea.yaml"
    resources:
        gpu=train_resources,
        slurm_partition=train_partition,
        runtime=120,
        mem_mb=8000,
    params:
        audit=config["audit"],
        heldout_every=lambda wildcards: train_settings(config, wildcards.model)[
            "curriculum"
        ]["heldout_every"],
        megachat=config["megachat"],
    script:
        "../scripts/audit.py"
