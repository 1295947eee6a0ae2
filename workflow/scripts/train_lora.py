"""Rule train_lora: one (rank, lr) cell of the LoRA baseline grid, mirrored to W&B."""

from focus.pipeline.jobs import TrainingJob
from focus.pipeline.stages import train_lora
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
train_lora(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    rank=snakemake.params.cell["rank"],
    alpha=snakemake.params.cell["alpha"],
    target_modules=snakemake.params.target_modules,
    dropout=snakemake.params.dropout,
    job=TrainingJob.from_rule(snakemake),
    adapter_dir=snakemake.output.adapter,
    retrieval_window=snakemake.params.retrieval_window,
)
