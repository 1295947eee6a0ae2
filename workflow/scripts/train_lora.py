"""Rule train_lora: one (rank, lr) cell of the LoRA baseline grid, mirrored to W&B."""

from focus.experiments import start_job, train_lora
from focus.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_lora(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    rank=snakemake.params.cell["rank"],
    alpha=snakemake.params.cell["alpha"],
    target_modules=snakemake.params.target_modules,
    dropout=snakemake.params.dropout,
    train=snakemake.params.train,
    tokens=snakemake.input.tokens,
    seq_len=snakemake.params.seq_len,
    calibration_rows=snakemake.params.calibration_rows,
    eval_rows=snakemake.params.eval_rows,
    adapter_dir=snakemake.output.adapter,
    metrics=snakemake.output.metrics,
    summary=snakemake.output.summary,
)
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, dict(snakemake.wildcards), summary,
                 snakemake.output.metrics)
