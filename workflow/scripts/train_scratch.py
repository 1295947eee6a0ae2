"""Rule train_scratch: one (method, seed) trained from random initialisation, mirrored to W&B."""

from focus.experiments import start_job
from focus.scratch import train_from_scratch
from focus.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_from_scratch(
    method=snakemake.wildcards.scratch_method,
    seed=int(snakemake.wildcards.seed),
    model=snakemake.params.model,
    focus=snakemake.params.focus,
    train=snakemake.params.train,
    tokens=snakemake.input.tokens,
    tokenizer=snakemake.params.tokenizer,
    domain=snakemake.params.domain,
    seq_len=snakemake.params.seq_len,
    calibration_rows=snakemake.params.calibration_rows,
    train_rows=snakemake.params.train_rows,
    eval_rows=snakemake.params.eval_rows,
    metrics=snakemake.output.metrics,
    summary=snakemake.output.summary,
)
labels = {"stage": "scratch", "method": snakemake.wildcards.scratch_method, "seed": snakemake.wildcards.seed}
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, labels, summary,
                 snakemake.output.metrics)
