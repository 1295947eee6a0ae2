"""Rule ruler: RULER (lm-eval) of one (model, method) at each prompt length."""

from focus.pipeline.jobs import start_job
from focus.pipeline.stages import evaluate_ruler

start_job(snakemake.log[0], snakemake.threads)
evaluate_ruler(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    method=snakemake.wildcards.method,
    output=snakemake.output.record,
    samples=snakemake.output.samples,
    trained=snakemake.input.get("trained"),
    labels={"model": snakemake.wildcards.model},
    **snakemake.params.ruler,
)
