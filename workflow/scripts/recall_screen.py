"""Rule recall_screen: the cells of the profile's `recall_screen` section (rule recall_screen_cell) as its tables and
figures."""

import os

from focus.pipeline.screens import gather_recall_screen
from focus.pipeline.stamp import PROFILE_FILE
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
gather_recall_screen(
    snakemake.input.cells,
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    **snakemake.params.settings,
    stem=snakemake.output.csv.removesuffix(".csv"),
    figure=snakemake.output.figure,  # (figures/, beside the profile's other figures)
    command=f"snakemake {snakemake.output.csv} --configfile {os.environ.get(PROFILE_FILE, '<profile>')}",
)
