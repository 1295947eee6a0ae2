"""Rule train_full_finetune: the full-attention baseline (every weight trained), mirrored to W&B."""

from focus.experiments import start_job, train_full_finetune
from focus.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_full_finetune(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    train=snakemake.params.train,
    tokens=snakemake.input.tokens,
    seq_len=snakemake.params.seq_len,
    calibration_rows=snakemake.params.calibration_rows,
    eval_rows=snakemake.params.eval_rows,
    model_dir=snakemake.output.model,
    metrics=snakemake.output.metrics,
    summary=snakemake.output.summary,
    processes=snakemake.resources.gpu,  # > 1: that many processes, one per GPU
)
labels = {**snakemake.wildcards, "variant": "full_finetune"}
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, labels, summary,
                 snakemake.output.metrics)
