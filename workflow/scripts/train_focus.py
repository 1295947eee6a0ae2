"""Rule train_focus: centroid-only training of one (model, variant), mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob, start_job
from focus.pipeline.stages import train_focus
from focus.report.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_focus(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    focus=snakemake.params.focus,
    job=TrainingJob.from_rule(snakemake),
    adapter_dir=snakemake.output.adapter,
    processes=snakemake.resources.gpu,  # > 1: that many processes, one per GPU
)
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, dict(snakemake.wildcards), summary,
                 snakemake.output.metrics)
