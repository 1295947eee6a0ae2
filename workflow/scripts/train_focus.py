"""Rule train_focus: centroid-only training of one (model, variant), mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob
from focus.pipeline.stages import train_focus
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
train_focus(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    focus=snakemake.params.focus,
    job=TrainingJob.from_rule(snakemake),
    adapter_dir=snakemake.output.adapter,
    processes=snakemake.resources.gpu,  # > 1: that many processes, one per GPU (0 or 1: this one)
)
