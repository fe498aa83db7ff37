"""Snakemake job for rules render_filter_report and render_saturation: a thin call into
andrea.report_pages."""

import _checkout  # noqa: F401  (puts this checkout's andrea package on sys.path)

from andrea.io import setup_logging
from andrea.report_pages import filter_shape_page, saturation_page

if __name__ == "__main__":
    setup_logging(snakemake.log[0])
    if snakemake.rule == "render_filter_report":
        filter_shape_page(snakemake.input.report, snakemake.input.removed, snakemake.output[0])
    else:
        saturation_page(snakemake.input.saturation, snakemake.output[0])
