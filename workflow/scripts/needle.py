"""Rule needle: pass-key retrieval of one (model, method)."""

from focus.pipeline.stages import evaluate_needle
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
evaluate_needle(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    method=snakemake.wildcards.method,
    tokens=snakemake.input.tokens,
    output=snakemake.output[0],
    trained=snakemake.input.get("trained"),
    focus_changes=snakemake.params.focus_changes,
    labels={"model": snakemake.wildcards.model},
    **snakemake.params.needle,
)
