"""Rule train_scratch: one (method, seed) trained from random initialisation, mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob
from focus.pipeline.scratch import train_from_scratch
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
train_from_scratch(
    method=snakemake.wildcards.scratch_method,
    seed=int(snakemake.wildcards.seed),
    model=snakemake.params.model,
    focus=snakemake.params.focus,
    job=TrainingJob.from_rule(
        snakemake,
        labels={"stage": "scratch", "method": snakemake.wildcards.scratch_method, "seed": snakemake.wildcards.seed},
    ),
    tokenizer=snakemake.params.tokenizer,
    domain=snakemake.params.domain,
)
