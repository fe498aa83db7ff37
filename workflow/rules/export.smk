rule export:
    """A trained model as a Hugging Face directory that transformers loads as GPT-2 with no
    custom code: weights (safetensors), config, generation settings (the audit's sampling), the
    tokenizer (the same IDs as ours) and a model card. The final weights, which the audit scores.
    The audit is an input when it has been run: its summary goes into the model card, and a new
    audit updates the export. Without one the export does not wait for an audit.
    """
    input:
        ckpt=f"{RESULTS}/{{model}}/ckpt",
        shards=f"{RESULTS}/{{model}}/shards.json",
        audit=lambda wildcards: [
            d for d in [f"{RESULTS}/{wildcards.model}/audit"] if os.path.isdir(d)
        ],
    output:
        directory(f"{RESULTS}/{{model}}/hf"),
    log:
        f"{RESULTS}/logs/export/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/export/{{model}}.tsv"
    conda:
        "../envs/andrea.yaml"
    params:
        sampling={
            k: config["audit"][k]
            for k in ("temperature", "top_k", "top_p", "max_new_tokens")
        },
        megachat=config["megachat"],
    script:
        "../scripts/export.py"
