"""Rule train_focus: centroid-only training of one (model, variant), mirrored to W&B."""

from focus.experiments import start_job, train_focus
from focus.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_focus(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    focus=snakemake.params.focus,
    train=snakemake.params.train,
    tokens=snakemake.input.tokens,
    seq_len=snakemake.params.seq_len,
    calibration_rows=snakemake.params.calibration_rows,
    eval_rows=snakemake.params.eval_rows,
    adapter_dir=snakemake.output.adapter,
    metrics=snakemake.output.metrics,
    summary=snakemake.output.summary,
    processes=snakemake.resources.gpu,  # > 1: that many processes, one per GPU
)
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, dict(snakemake.wildcards), summary,
                 snakemake.output.metrics)
