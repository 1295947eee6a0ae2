"""Rule tables: perplexity and training tables (CSV + Markdown)."""

from focus.pipeline.start import start_job
from focus.report.tables import write_tables

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
write_tables(
    perplexity_records=snakemake.input.perplexity,
    training_summaries=snakemake.input.training,
    perplexity_csv=snakemake.output.perplexity,
    training_csv=snakemake.output.training,
)
