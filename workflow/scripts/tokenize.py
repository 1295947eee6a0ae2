"""Rule tokenize: one corpus, tokenised for one model."""

from focus.pipeline.stages import prepare_tokens
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
prepare_tokens(
    source=snakemake.params.source,
    domain=snakemake.wildcards.domain,
    splits=snakemake.params.splits,
    output=snakemake.output[0],
    mirror=snakemake.params.mirror,
)
