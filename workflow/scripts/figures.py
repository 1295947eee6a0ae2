"""Rule figures: loss curves and perplexity bars (PNG + SVG)."""

from focus.pipeline.start import start_job
from focus.report.figures import plot_figures

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
plot_figures(
    metrics_files=snakemake.input.metrics,
    perplexity_csv=snakemake.input.perplexity,
    loss_curves=snakemake.output.loss_curves,
    perplexity=snakemake.output.perplexity,
)
