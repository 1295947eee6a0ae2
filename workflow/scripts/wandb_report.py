"""Rule wandb_report: every table, figure and page in one W&B run; writes where the run is and what it holds."""

from focus.pipeline.start import start_job
from focus.pipeline.tracking import log_report_run

start_job(snakemake.log[0], snakemake.threads)
log_report_run(
    record=snakemake.output[0],
    settings=snakemake.params.wandb,
    group=snakemake.params.group,
    tables=snakemake.input.tables,
    figures=snakemake.input.figures,
    pages=snakemake.input.pages,
    trained=snakemake.input.trained,
)
