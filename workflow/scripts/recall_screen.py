"""Rule recall_screen: the routers of the profile's `recall_screen` section, screened by the attention they keep."""

import os

from focus.pipeline.screens import recall_screen
from focus.pipeline.stamp import PROFILE_FILE
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
recall_screen(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    routers=snakemake.params.routers,
    tokens=dict(zip(snakemake.params.domains, snakemake.input.tokens)),
    train_tokens=snakemake.input.train_tokens,
    **snakemake.params.settings,
    stem=snakemake.output.csv.removesuffix(".csv"),
    figure=snakemake.output.figure,  # (figures/, beside the profile's other figures)
    command=f"snakemake {snakemake.output.csv} --configfile {os.environ.get(PROFILE_FILE, '<profile>')}",
)
