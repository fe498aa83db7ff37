rule audit:
    """Samples, built-in judges (and an external judge when configured), perplexity on held-out
    documents, and a report. Its parameters are the audit section only: changing the prompt
    set re-runs the audit, not the training."""
    input:
        ckpt=f"{RESULTS}/{{model}}/ckpt",
        shards=f"{RESULTS}/{{model}}/shards.json",
    output:
        directory(f"{RESULTS}/{{model}}/audit"),
    log:
        f"{RESULTS}/logs/audit/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/audit/{{model}}.tsv"
    conda:
        "../envs/andrea.yaml"
    resources:
        slurm_partition=train_partition,
        runtime=120,
        mem_mb=8000,
    params:
        audit=config["audit"],
        heldout_every=config["curriculum"]["heldout_every"],
        megachat=config["megachat"],
    script:
        "../scripts/audit.py"
