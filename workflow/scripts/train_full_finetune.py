"""Rule train_full_finetune: the full-attention baseline (every weight trained), mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob
from focus.pipeline.stages import train_full_finetune
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
train_full_finetune(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    job=TrainingJob.from_rule(snakemake, labels={**snakemake.wildcards, "variant": "full_finetune"}),
    model_dir=snakemake.output.model,
    retrieval_window=snakemake.params.retrieval_window,
    processes=snakemake.resources.gpu,  # > 1: that many processes, one per GPU (0 or 1: this one)
)
