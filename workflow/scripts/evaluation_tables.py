"""Rule evaluation_tables: benchmark, TruthfulQA, prompt-length, LoRA, long-context and RULER tables and figures."""

from focus.pipeline.start import start_job
from focus.report.evaluation import write_evaluation_tables

start_job(snakemake.log[0], 1, stamp=snakemake.output, rule=snakemake.rule)
write_evaluation_tables(
    benchmark_records=snakemake.input.benchmarks,
    samples={path.split("/")[-2]: path for path in snakemake.input.samples},
    sources=snakemake.params.sources,
    focus=snakemake.params.focus,
    lora_summaries=snakemake.input.lora,
    perplexity_records=snakemake.input.perplexity,
    long_context_records=snakemake.input.long_context,
    needle_records=snakemake.input.needle,
    ruler_records=snakemake.input.ruler,
    outputs={name: path for name, path in snakemake.output.items() if not name.endswith(("_md", "_svg"))},
)
