"""Rule peers_table: the trained routers against the training-free peers (CSV + Markdown, trade-off figure)."""

from focus.pipeline.start import start_job
from focus.report.peers import write_peers

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
write_peers(
    records=[*snakemake.input.perplexity, *snakemake.input.long_context],
    routers=snakemake.params.routers,
    csv=snakemake.output.csv,
    figure=snakemake.output.get("figure"),
    domain=snakemake.params.domain,
    other=snakemake.params.other,
)
