"""Rule recall_screen_cell: one corpus and length of the profile's `recall_screen` section, every router on it."""

from focus.pipeline.screens import recall_screen_cell
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
recall_screen_cell(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    routers=snakemake.params.routers,
    corpus=snakemake.wildcards.domain,
    tokens=snakemake.input.tokens,
    train_tokens=snakemake.input.train_tokens,
    length=int(snakemake.wildcards.length),
    **snakemake.params.settings,
    out=snakemake.output[0],
)
