"""Rule benchmarks: lm-eval on one (model, method)."""

from focus.pipeline.stages import evaluate_benchmarks
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
evaluate_benchmarks(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    method=snakemake.wildcards.method,
    tasks=snakemake.params.tasks,
    chat_tasks=snakemake.params.chat_tasks,
    output=snakemake.output.record,
    samples=snakemake.output.samples,
    limit=snakemake.params.limit,
    batch_size=snakemake.params.batch_size,
    trained=snakemake.input.get("trained"),
    focus_changes=snakemake.params.focus_changes,
    mirror=snakemake.params.mirror,
    labels={"model": snakemake.wildcards.model},
)
