# Pages of the Snakemake report (snakemake --report report.html) for the stages whose results are
# JSON, which the report would offer only as a download. Each page is versioned like its stage.


localrules:
    render_filter_report,
    render_saturation,


rule render_filter_report:
    """The shape filter's report.json and removed examples as a page of the report."""
    input:
        report=f"{RESULTS}/data/filter_shape/{{version}}/report.json",
        removed=f"{RESULTS}/data/filter_shape/{{version}}/removed_examples.jsonl",
    output:
        report(
            f"{RESULTS}/report/filter_shape/{{version}}.html",
            caption="../report/filter_shape.rst",
            category="Data",
            labels={"page": "shape filter {version}"},
        ),
    log:
        f"{RESULTS}/logs/render_filter_report/{{version}}.log",
    wildcard_constraints:
        version=versions("filter_shape"),
    conda:
        "../envs/andrea.yaml"
    script:
        "../scripts/report_page.py"


rule render_saturation:
    """The tokenizer's saturation.json (N segments) as a page of the report."""
    input:
        saturation=f"{TOKENIZER_DIR}/saturation.json",
    output:
        report(
            f"{RESULTS}/report/train_tokenizer/N{{n}}-{{version}}.html",
            caption="../report/saturation.rst",
            category="Data",
            labels={"page": "tokenizer N{n}-{version}"},
        ),
    log:
        f"{RESULTS}/logs/render_saturation/N{{n}}-{{version}}.log",
    wildcard_constraints:
        n=r"\d+",
        version=versions("train_tokenizer"),
    conda:
        "../envs/andrea.yaml"
    script:
        "../scripts/report_page.py"
