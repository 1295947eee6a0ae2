"""Rule snapshot: the profile's tables and figures, with their provenance, copied into benchmarks/results/<profile>/."""

from focus.pipeline.snapshot import snapshot_results
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads)
snapshot_results(snakemake.params.results, snakemake.input, snakemake.params.folder, snakemake.output[0])
