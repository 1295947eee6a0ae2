"""Rule train_scratch: one (method, seed) trained from random initialisation, mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob, start_job
from focus.pipeline.scratch import train_from_scratch
from focus.report.tracking import log_training_run

start_job(snakemake.log[0], snakemake.threads)
summary = train_from_scratch(
    method=snakemake.wildcards.scratch_method,
    seed=int(snakemake.wildcards.seed),
    model=snakemake.params.model,
    focus=snakemake.params.focus,
    job=TrainingJob.from_rule(snakemake),
    tokenizer=snakemake.params.tokenizer,
    domain=snakemake.params.domain,
)
labels = {"stage": "scratch", "method": snakemake.wildcards.scratch_method, "seed": snakemake.wildcards.seed}
log_training_run(snakemake.output.wandb, snakemake.params.wandb, snakemake.params.group, labels, summary,
                 snakemake.output.metrics)
