# Pages of the Snakemake report (snakemake --report report.html) for the stages whose results are
# JSON, which the report would offer only as a download. Each page is versioned like its stage.


localrules:
    render_filter_report,
    render_saturation,


rule render_filter_report:
    """The shape filter's report.json and removed examples as a page of the report."""
    input:
        report=rules.filter_shape.output.report,
        removed=rules.filter_shape.output.removed,
    output:
        report(
            f"{RESULTS}/report/filter_shape/{VERSIONS['filter_shape']}.html",
            caption="../report/filter_shape.rst",
            category="Data",
            labels={"page": f"shape filter {VERSIONS['filter_shape']}"},
        ),
    log:
        f"{RESULTS}/logs/render_filter_report/{VERSIONS['filter_shape']}.log",
    conda:
        "../envs/andrea.yaml"
    script:
        "../scripts/report_page.py"


rule render_saturation:
    """The tokenizer's saturation.json (N segments) as a page of the report."""
    input:
        saturation=rules.train_tokenizer.output.saturation,
    output:
        report(
            f"{RESULTS}/report/train_tokenizer/N{{n}}-{VERSIONS['train_tokenizer']}.html",
            caption="../report/saturation.rst",
            category="Data",
            labels={"page": f"tokenizer N{{n}}-{VERSIONS['train_tokenizer']}"},
        ),
    log:
        f"{RESULTS}/logs/render_saturation/N{{n}}-{VERSIONS['train_tokenizer']}.log",
    wildcard_constraints:
        n=r"\d+",
    conda:
        "../envs/andrea.yaml"
    script:
        "../scripts/report_page.py"
