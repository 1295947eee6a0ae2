"""Rule ruler: RULER (lm-eval) of one (model, method) at each prompt length."""

from focus.pipeline.stages import evaluate_ruler
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
evaluate_ruler(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    method=snakemake.wildcards.method,
    output=snakemake.output.record,
    samples=snakemake.output.samples,
    trained=snakemake.input.get("trained"),
    focus_changes=snakemake.params.focus_changes,
    labels={"model": snakemake.wildcards.model},
    **snakemake.params.ruler,
)
