"""Rule scratch_summary: full attention against Focus trained from scratch (table, figure, summary JSON)."""

from focus.pipeline.start import start_job
from focus.report.scratch import summarize_scratch

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
summarize_scratch(
    summaries=snakemake.input.summaries,
    table_csv=snakemake.output.table,
    figure=snakemake.output.figure,
    summary_json=snakemake.output.summary,
)
