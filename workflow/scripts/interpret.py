"""Rule interpret: group balance and contents of one trained (model, variant) on held-out text."""

from focus.pipeline.interpret import interpret_adapter
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
interpret_adapter(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    adapter=snakemake.input.adapter,
    tokens=snakemake.input.tokens,
    seq_len=snakemake.params.seq_len,
    settings=snakemake.params.settings,
    summary=snakemake.output.summary,
    layers_csv=snakemake.output.layers,
    shares_csv=snakemake.output.shares,
    categories_csv=snakemake.output.categories,
    top_tokens_csv=snakemake.output.top_tokens,
    categories_figure=snakemake.output.categories_figure,
    overview_figure=snakemake.output.overview_figure,
    balance_figure=snakemake.output.balance_figure,
    alignment_figure=snakemake.output.alignment_figure,
    examples_html=snakemake.output.examples,
    labels=dict(snakemake.wildcards),
    focus_changes=snakemake.params.focus_changes,
)
