"""Rule bench_attention: attention and prefill speed, tables and figure."""

from focus.pipeline.benchmark import run_benchmark
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
run_benchmark(
    settings=snakemake.params.bench,
    model_source=snakemake.params.model_source,
    attention_csv=snakemake.output.attention,
    prefill_csv=snakemake.output.prefill,
    figure=snakemake.output.figure,
)
