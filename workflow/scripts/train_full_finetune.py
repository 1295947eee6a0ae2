"""Rule train_full_finetune: the full-attention baseline (every weight trained), mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob, start_job
from focus.pipeline.stages import train_full_finetune
from focus.report.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_full_finetune(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    job=TrainingJob.from_rule(snakemake),
    model_dir=snakemake.output.model,
    processes=snakemake.resources.gpu,  # > 1: that many processes, one per GPU
)
labels = {**snakemake.wildcards, "variant": "full_finetune"}
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, labels, summary,
                 snakemake.output.metrics)
