"""Rule study: the design study's table and figure."""

from focus.pipeline.start import start_job
from focus.report.study import write_study

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
write_study(
    model=snakemake.params.model,
    variants=snakemake.params.variants,
    domain=snakemake.params.domain,
    summaries=snakemake.input.summaries,
    metrics=snakemake.input.metrics,
    validation=snakemake.input.validation,
    test=snakemake.input.test,
    long_context=snakemake.input.long_context,
    needle=snakemake.input.needle,
    interpret=snakemake.input.interpret,
    table=snakemake.output.table,
    figure=snakemake.output.figure,
    tradeoff=snakemake.output.get("tradeoff"),
    other_domain=snakemake.params.other_domain,
)
