"""Rule long_context_perplexity: one (model, method, corpus, context length)."""

from focus.pipeline.stages import evaluate_perplexity
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
evaluate_perplexity(
    source=snakemake.params.source,
    dtype=snakemake.params.dtype,
    method=snakemake.wildcards.method,
    tokens=snakemake.input.tokens,
    output=snakemake.output[0],
    context_length=int(snakemake.wildcards.context),
    max_tokens=snakemake.params.max_tokens,
    batch_size=snakemake.params.batch_size,
    trained=snakemake.input.get("trained"),
    focus_changes=snakemake.params.focus_changes,
    split=snakemake.params.get("split", "test"),  # (long_context_perplexity_validation's)
    labels={"model": snakemake.wildcards.model, "domain": snakemake.wildcards.domain},
)
