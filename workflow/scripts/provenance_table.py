"""Rule provenance: where each of the profile's tables, figures and pages came from, one row each."""

from focus.pipeline.stamp import write_provenance_table
from focus.pipeline.start import start_job

start_job(snakemake.log[0], 1, stamp=snakemake.output, rule=snakemake.rule)
write_provenance_table(snakemake.input, snakemake.params.results, snakemake.output.csv)
