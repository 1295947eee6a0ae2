"""Rule bench_decode: decoding step and generate() speed, tables and figure."""

from focus.pipeline.benchmark import run_decode_benchmark
from focus.pipeline.start import start_job

start_job(snakemake.log[0], snakemake.threads, stamp=snakemake.output, rule=snakemake.rule)
inputs = dict(snakemake.input.items())
run_decode_benchmark(
    settings={**snakemake.params.decode, **({"adapter": inputs["adapter"]} if "adapter" in inputs else {})},
    model_source=snakemake.params.model_source,
    step_csv=snakemake.output.steps,
    generate_csv=snakemake.output.generate,
    figure=snakemake.output.figure,
)
